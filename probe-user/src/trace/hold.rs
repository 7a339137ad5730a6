//! The node agent's hold: a process that opens a vendor library the agent has not probed
//! for it yet is stopped at that open (probe-ebpf `discovery`, `hold_vendor_opens`) and
//! continued once the file's probes are in place, so its first allocation is seen.
//!
//! - Which files: those named like a library the agent probes ([`vendor_names`]: the
//!   Ascend libraries, mstx, the op libraries, torch_npu, and the `--lib` files), by their
//!   name up to `.so` (`libascend_hal.so.1` too). Any other open is reported as before and
//!   never stops anyone.
//! - Held once per path and cgroup (`CLEARED`): the same path in another container may be
//!   another file. A file already probed (by device and inode, the planner's identity)
//!   needs no new probes, so such a hold lasts one wakeup of the agent.
//! - Bounded: each hold is recorded in `HELD` (thread -> process), which the watchdog
//!   (`watchdog.rs`) is given: if the agent freezes or dies, it continues the held
//!   processes and takes them out of `HELD`; the agent then finds the entry gone and does
//!   not signal the process again.

use anyhow::Result;
use aya::maps::{HashMap, MapData};
use std::os::fd::BorrowedFd;

use crate::trace::{aclnn, probes::KNOWN_LIBRARIES, torch_npu};

/// How a hold ended, seen by the agent when it has handled the open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    /// The agent continued it (it was still in `HELD`).
    ByAgent,
    /// The watchdog had continued it already (the agent was frozen).
    ByWatchdog,
}

pub struct Holds {
    names: HashMap<MapData, u64, u8>,
    cleared: HashMap<MapData, u64, u8>,
    held: HashMap<MapData, u32, u32>,
}

/// The file names (up to `.so`) of the libraries the agent probes, with those of `explicit`.
pub fn vendor_names(explicit: &[std::path::PathBuf]) -> Vec<String> {
    let mut names: Vec<String> = KNOWN_LIBRARIES
        .iter()
        .chain(&aclnn::OP_LIBRARIES)
        .chain(&[torch_npu::LIBRARY])
        .map(|n| n.to_string())
        .collect();
    names.extend(
        explicit
            .iter()
            .filter_map(|p| Some(p.file_name()?.to_string_lossy().into_owned())),
    );
    names
}

impl Holds {
    /// Takes the hold maps from the loaded object and names the files that hold.
    pub fn new(bpf: &mut crate::trace::bpf::Bpf, names: &[String]) -> Result<Holds> {
        let mut names_map: HashMap<MapData, u64, u8> =
            HashMap::try_from(bpf.take_map("VENDOR_NAMES")?)?;
        for name in names {
            names_map.insert(probe_common::vendor_name_hash(name.as_bytes()), 1, 0)?;
        }
        Ok(Holds {
            names: names_map,
            cleared: HashMap::try_from(bpf.take_map("CLEARED")?)?,
            held: HashMap::try_from(bpf.take_map("HELD")?)?,
        })
    }

    /// The `HELD` map, for the watchdog.
    pub fn held_map_fd(&self) -> BorrowedFd<'_> {
        use aya::maps::IterableMap;
        use std::os::fd::AsFd;
        self.held.map().fd().as_fd()
    }

    /// The open of `path_hash` by thread `tid` in `cgroup` has its probes: clears the path
    /// for that cgroup and takes the thread out of `HELD`. The caller sends SIGCONT only
    /// for [`Released::ByAgent`].
    pub fn release(&mut self, tid: u32, path_hash: u64, cgroup: u64) -> Released {
        let _ = self
            .cleared
            .insert(probe_common::hold_key(path_hash, cgroup), 1, 0);
        if self.held.remove(&tid).is_ok() {
            Released::ByAgent
        } else {
            Released::ByWatchdog
        }
    }

    /// Continues every process still held (the agent is leaving; the final drain released
    /// all it could).
    pub fn release_all(&mut self) {
        let held: Vec<(u32, u32)> = self.held.iter().filter_map(Result::ok).collect();
        for (tid, pid) in held {
            if self.held.remove(&tid).is_ok() {
                // SAFETY: plain kill(2); harmless for a process that is not stopped or gone.
                unsafe { libc::kill(pid as i32, libc::SIGCONT) };
            }
        }
    }

    /// Whether `name` (a file name) holds at its open: for tests and the debug log.
    pub fn holds_name(&self, name: &str) -> bool {
        self.names
            .get(&probe_common::vendor_name_hash(name.as_bytes()), 0)
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn versioned_names_hash_as_their_library() {
        use probe_common::vendor_name_hash as h;
        assert_eq!(h(b"libascend_hal.so"), h(b"libascend_hal.so.1"));
        assert_eq!(h(b"libtorch_npu.so"), h(b"libtorch_npu.so.2.5"));
        assert_ne!(h(b"libascend_hal.so"), h(b"libascend.so"));
        let names = super::vendor_names(&["/x/libvendor.so".into()]);
        assert!(names.iter().any(|n| n == "libascend_hal.so"));
        assert!(names.iter().any(|n| n == "libtorch_npu.so"));
        assert!(names.iter().any(|n| n == "libvendor.so"));
    }
}
