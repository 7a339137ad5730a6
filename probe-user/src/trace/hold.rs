//! The node agent's hold: a process that opens a vendor library the agent has not probed
//! for it yet is stopped at that open (probe-ebpf `discovery`, `hold_vendor_opens`) and
//! continued once the file's probes are in place, so its first allocation is seen.
//!
//! - Which files: those named like a library the agent probes ([`vendor_names`]: the
//!   Ascend libraries, mstx, torch_npu, and the `--lib` files), by their name up to `.so`
//!   (`libascend_hal.so.1` too). Not the op libraries (`libopapi*.so`): the agent writes no
//!   OP_LAUNCH rows, so it probes nothing there. Any other open is reported as before and
//!   never stops anyone.
//! - Held once per path and cgroup (`CLEARED`): the same path in another container may be
//!   another file. A file already probed (by device and inode, the planner's identity)
//!   needs no new probes, so such a hold lasts one wakeup of the agent.
//! - Shared: each hold is recorded in `HOLDERS` (`holders.rs`), with the holds of every other
//!   tracer on the node (a launch session, another agent): the process is continued by the
//!   last of them whose probes are in place, so each sees its first allocation.
//! - Bounded: the watchdog (`watchdog.rs`) is given the registry: if the agent freezes or
//!   dies, it releases the agent's holds (continuing the processes no other live tracer
//!   holds); the agent then finds its entry gone and does not signal the process again.

use crate::trace::{
    holders::{Registry, Taken},
    probes::KNOWN_LIBRARIES,
    torch_npu,
};
use anyhow::Result;
use aya::maps::{HashMap, MapData};

pub struct Holds {
    names: HashMap<MapData, u64, u8>,
    cleared: HashMap<MapData, u64, u8>,
}

/// The file names (up to `.so`) of the libraries the agent probes, with those of `explicit`.
pub fn vendor_names(explicit: &[std::path::PathBuf]) -> Vec<String> {
    let mut names: Vec<String> = KNOWN_LIBRARIES
        .iter()
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
    /// Takes the hold maps from the loaded object; nothing holds until [`hold_at`](Self::hold_at).
    pub fn new(bpf: &mut crate::trace::bpf::Bpf) -> Result<Holds> {
        Ok(Holds {
            names: HashMap::try_from(bpf.take_map("VENDOR_NAMES")?)?,
            cleared: HashMap::try_from(bpf.take_map("CLEARED")?)?,
        })
    }

    /// Names the files that hold, once the agent drains its records: a process held while
    /// the agent still starts (reading large libraries, every process's mappings: seconds)
    /// would wait for all of it.
    pub fn hold_at(&mut self, names: &[String]) -> Result<()> {
        for name in names {
            self.names
                .insert(probe_common::vendor_name_hash(name.as_bytes()), 1, 0)?;
        }
        Ok(())
    }

    /// The open of `path_hash` by thread `tid` in `cgroup` has its probes: clears the path
    /// for that cgroup and ends our hold of the thread. The caller sends SIGCONT only for
    /// [`Taken::Last`]; [`Taken::NotHeld`]: the watchdog released it already.
    pub fn release(&mut self, registry: &Registry, tid: u32, path_hash: u64, cgroup: u64) -> Taken {
        let _ = self
            .cleared
            .insert(probe_common::hold_key(path_hash, cgroup), 1, 0);
        registry.take(tid)
    }

    /// Every path holds again at its next open in each cgroup: a probed file was written in
    /// place and lost its probes, and it may be at any of the paths cleared.
    pub fn forget_cleared(&mut self) {
        let keys: Vec<u64> = self.cleared.keys().filter_map(Result::ok).collect();
        for key in keys {
            let _ = self.cleared.remove(&key);
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
        // The agent probes no operator library, so an open of one stops nobody.
        for op in crate::trace::aclnn::OP_LIBRARIES {
            assert!(!names.iter().any(|n| n == op), "{op} is held");
        }
    }
}
