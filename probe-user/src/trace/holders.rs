//! Holds that several tracers share. The node agent and a launch session on the same node
//! both stop a process at the open of a library they have not probed yet (SIGSTOP), and each
//! continues it once its own probes are in place; one SIGCONT continues it for both, so the
//! quicker tracer used to let it run before the other's probes were placed (the other lost
//! its first allocations). Now each stop at an open is recorded in `HOLDERS`, one BPF map for
//! every tracer on the node, pinned in bpffs ([`PIN`]): key (thread, tracer), value process.
//!
//! - A tracer's id is the kernel's id of its `TRACER` map: it exists exactly as long as that
//!   tracer's BPF programs (which hold the map), in every PID namespace, and is never 0.
//! - Releasing ([`Registry::take`]) removes our entry and says whether another *live* tracer
//!   still holds the thread; only the last one continues the process. Removal and check
//!   happen under an exclusive `flock` of [`PIN_DIR`], so two tracers releasing at once cannot
//!   both see the other still holding (and leave the process stopped).
//! - Bounded: the lock is waited for at most [`LOCK_WAIT`] (a tracer frozen while holding it
//!   must not stop anyone's release); without it the process is continued. An entry whose
//!   tracer is gone (its map id no longer exists) counts for nothing and is removed. A frozen
//!   or dead tracer's own entries are released by its watchdog (`watchdog.rs`), which uses the
//!   same code on raw descriptors.
//! - Without bpffs (it cannot be mounted) the map is the tracer's own, unpinned: holds work
//!   as before, alone.

use std::{
    ffi::CString,
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use probe_common::{holder_key, holder_of};

/// Where bpffs is mounted, and where the registry lives in it.
pub const BPFFS: &str = "/sys/fs/bpf";
pub const PIN_DIR: &str = "/sys/fs/bpf/memscope-bpf";
/// Versioned: a later layout gets its own map instead of misreading this one.
pub const PIN: &str = "/sys/fs/bpf/memscope-bpf/holders_v1";
/// The tracers' own processes (`TRACERS`), never held by another tracer.
pub const TRACERS_PIN: &str = "/sys/fs/bpf/memscope-bpf/tracers_v1";
/// `HOLDERS`' and `TRACERS`' sizes (probe-ebpf `discovery`).
const MAX_HOLDERS: u32 = 16384;
const MAX_TRACERS: u32 = 1024;
/// The longest a release waits for another tracer's registry lock.
pub const LOCK_WAIT: Duration = Duration::from_millis(200);

/// The registry pinned at [`PIN`] and [`TRACERS_PIN`], created (and bpffs mounted) if
/// needed: the paths for the loader, or why holds stay this tracer's own.
pub fn prepare_pins() -> Result<(PathBuf, PathBuf), String> {
    if !is_bpffs(BPFFS) {
        let (src, target, fstype) = (c"bpf", c"/sys/fs/bpf", c"bpf");
        // SAFETY: constant NUL-terminated strings; no data argument.
        let rc = unsafe {
            libc::mount(
                src.as_ptr(),
                target.as_ptr(),
                fstype.as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if rc != 0 || !is_bpffs(BPFFS) {
            return Err(format!(
                "bpffs is not mounted at {BPFFS} and mounting it failed: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    std::fs::create_dir_all(PIN_DIR).map_err(|e| format!("cannot create {PIN_DIR}: {e}"))?;
    pin_map(PIN, b"HOLDERS", 8, MAX_HOLDERS)?;
    pin_map(TRACERS_PIN, b"TRACERS", 4, MAX_TRACERS)?;
    Ok((PIN.into(), TRACERS_PIN.into()))
}

/// A hash map (`key_size` bytes to u32) pinned at `pin`, unless one is there already.
fn pin_map(pin: &str, name: &[u8], key_size: u32, max_entries: u32) -> Result<(), String> {
    if Path::new(pin).exists() {
        return Ok(());
    }
    let map = create_map(name, key_size, max_entries)
        .map_err(|e| format!("cannot create the map for {pin}: {e}"))?;
    let path = CString::new(pin).expect("no NUL");
    #[repr(C)]
    struct ObjPinAttr {
        pathname: u64,
        bpf_fd: u32,
        file_flags: u32,
    }
    let attr = ObjPinAttr {
        pathname: path.as_ptr() as u64,
        bpf_fd: map.as_raw_fd() as u32,
        file_flags: 0,
    };
    // Another tracer starting at the same moment may have pinned its own first: use that.
    if bpf(BPF_OBJ_PIN, &attr) != 0 && !Path::new(pin).exists() {
        return Err(format!(
            "cannot pin a map at {pin}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

fn is_bpffs(path: &str) -> bool {
    const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
    let c = CString::new(path).expect("no NUL");
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and out-pointer.
    unsafe { libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == BPF_FS_MAGIC }
}

/// A hash map as `HOLDERS` and `TRACERS` are declared (a `key_size` key, u32 value).
fn create_map(name: &[u8], key_size: u32, max_entries: u32) -> std::io::Result<OwnedFd> {
    #[repr(C)]
    struct MapCreateAttr {
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        map_flags: u32,
        inner_map_fd: u32,
        numa_node: u32,
        map_name: [u8; 16],
    }
    let mut map_name = [0u8; 16];
    map_name[..name.len()].copy_from_slice(name);
    let attr = MapCreateAttr {
        map_type: 1, // BPF_MAP_TYPE_HASH
        key_size,
        value_size: 4,
        max_entries,
        map_flags: 0,
        inner_map_fd: 0,
        numa_node: 0,
        map_name,
    };
    let fd = bpf(BPF_MAP_CREATE, &attr);
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The registry as this tracer holds it: the maps (kept open) and the lock.
pub struct Holders {
    _map: aya::maps::MapData,
    _tracer: aya::maps::Array<aya::maps::MapData, u32>,
    /// `TRACERS`, where we are while we live.
    tracers: aya::maps::HashMap<aya::maps::MapData, u32, u32>,
    _lock: Option<OwnedFd>,
    pub registry: Registry,
}

impl Holders {
    /// Takes `HOLDERS` and `TRACER` from the loaded object and writes our id, before anything
    /// can be held (the agent's `VENDOR_NAMES` and launch mode's traced set are still empty).
    /// `pinned`: `HOLDERS` is the one at [`PIN`].
    pub fn take(ebpf: &mut aya::Ebpf, pinned: bool) -> anyhow::Result<Holders> {
        use aya::maps::{IterableMap, Map};
        use std::os::fd::AsFd;
        let Some(Map::HashMap(map)) = ebpf.take_map("HOLDERS") else {
            anyhow::bail!("BPF map HOLDERS missing from the object");
        };
        let info = map.info()?;
        if (info.key_size(), info.value_size()) != (8, 4) {
            anyhow::bail!(
                "{PIN} is not the holders map this version uses (key {} and value {} bytes): \
                 remove it when no memscope-bpf runs",
                info.key_size(),
                info.value_size()
            );
        }
        let mut tracer: aya::maps::Array<_, u32> = aya::maps::Array::try_from(
            ebpf.take_map("TRACER")
                .ok_or_else(|| anyhow::anyhow!("BPF map TRACER missing from the object"))?,
        )?;
        let id = tracer.map().info()?.id();
        tracer.set(0, id, 0)?;
        let mut tracers: aya::maps::HashMap<_, u32, u32> = aya::maps::HashMap::try_from(
            ebpf.take_map("TRACERS")
                .ok_or_else(|| anyhow::anyhow!("BPF map TRACERS missing from the object"))?,
        )?;
        // Tracers gone (killed, their pid free for anyone) are no longer exempt.
        let gone: Vec<u32> = tracers
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, t)| !map_exists(*t))
            .map(|(pid, _)| pid)
            .collect();
        for pid in gone {
            let _ = tracers.remove(&pid);
        }
        tracers.insert(std::process::id(), id, 0)?;
        let lock = if pinned { open_lock() } else { None };
        let registry = Registry {
            map: map.fd().as_fd().as_raw_fd(),
            tracer: id,
            lock: lock.as_ref().map_or(-1, |l| l.as_raw_fd()),
        };
        Ok(Holders {
            _map: map,
            _tracer: tracer,
            tracers,
            _lock: lock,
            registry,
        })
    }
}

impl Holders {
    /// Takes this tracer's process out of `TRACERS` (it is leaving). Only in the tracer
    /// itself: a forked child holding our maps is not us.
    pub fn leave(&mut self) {
        let me = std::process::id();
        if self.tracers.get(&me, 0).ok() == Some(self.registry.tracer) {
            let _ = self.tracers.remove(&me);
        }
    }
}

impl Drop for Holders {
    fn drop(&mut self) {
        self.leave();
    }
}

/// What [`Registry::take`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taken {
    /// We held the thread and were the last: continue `pid`.
    Last(u32),
    /// We held it; another live tracer still does, and continues it when its probes are in.
    OthersHold,
    /// We hold it no more (our watchdog released it, or it was never recorded).
    NotHeld,
}

/// The shared registry, on raw descriptors (the watchdog uses it after fork).
#[derive(Clone, Copy, Debug)]
pub struct Registry {
    /// `HOLDERS`.
    pub map: RawFd,
    /// This tracer's id.
    pub tracer: u32,
    /// An open [`PIN_DIR`] to `flock`, or -1 (an unpinned map: no other tracer sees it).
    pub lock: RawFd,
}

impl Registry {
    /// Ends our hold of thread `tid` (see [`Taken`]).
    pub fn take(&self, tid: u32) -> Taken {
        let locked = self.lock_bounded();
        let taken = self.take_locked(tid, locked);
        self.unlock(locked);
        taken
    }

    fn take_locked(&self, tid: u32, locked: bool) -> Taken {
        let key = holder_key(tid, self.tracer);
        let Some(pid) = lookup(self.map, key) else {
            return Taken::NotHeld;
        };
        if delete(self.map, key).is_err() {
            return Taken::NotHeld;
        }
        // Without the lock another tracer may be deciding the same: continuing is the safe
        // side (it may cost that tracer first calls; never a stopped process).
        if locked && self.others_hold(|t, _| t == tid) {
            Taken::OthersHold
        } else {
            Taken::Last(pid)
        }
    }

    /// Ends each hold of ours whose thread `ready` accepts, continuing each process that no
    /// other live tracer holds.
    pub fn release_own(&self, ready: impl Fn(u32) -> bool) {
        for (tid, _) in self.own() {
            if !ready(tid) {
                continue;
            }
            if let Taken::Last(pid) = self.take(tid) {
                // SAFETY: plain kill(2); harmless for a process that is not stopped or gone.
                unsafe { libc::kill(pid as i32, libc::SIGCONT) };
            }
        }
    }

    /// Whether a live tracer other than us holds a thread of process `pid`.
    pub fn held_by_others(&self, pid: u32) -> bool {
        self.others_hold(|_, p| p == pid)
    }

    /// The threads we hold, with their process.
    pub fn own(&self) -> Vec<(u32, u32)> {
        keys(self.map)
            .into_iter()
            .filter_map(|k| {
                let (tid, tracer) = holder_of(k);
                (tracer == self.tracer).then(|| Some((tid, lookup(self.map, k)?)))?
            })
            .collect()
    }

    /// Whether an entry of another live tracer matches (thread, process); entries of
    /// tracers gone are removed on the way.
    fn others_hold(&self, matches: impl Fn(u32, u32) -> bool) -> bool {
        let mut found = false;
        for k in keys(self.map) {
            let (tid, tracer) = holder_of(k);
            if tracer == self.tracer {
                continue;
            }
            let Some(pid) = lookup(self.map, k) else {
                continue;
            };
            if !map_exists(tracer) {
                let _ = delete(self.map, k);
            } else if matches(tid, pid) {
                found = true;
            }
        }
        found
    }

    fn lock_bounded(&self) -> bool {
        if self.lock < 0 {
            return true;
        }
        let end = Instant::now() + LOCK_WAIT;
        loop {
            // SAFETY: flock on our own descriptor.
            if unsafe { libc::flock(self.lock, libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return true;
            }
            if Instant::now() >= end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn unlock(&self, locked: bool) {
        if locked && self.lock >= 0 {
            // SAFETY: flock on our own descriptor.
            unsafe { libc::flock(self.lock, libc::LOCK_UN) };
        }
    }
}

/// Opens [`PIN_DIR`] for the registry's lock: each opener gets its own lock (flock locks
/// belong to the open file, so the watchdog opens its own).
pub fn open_lock() -> Option<OwnedFd> {
    let c = CString::new(PIN_DIR).expect("no NUL");
    // SAFETY: a valid path; the result is checked.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    // SAFETY: a new descriptor we own.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_MAP_GET_FD_BY_ID: libc::c_long = 14;

fn bpf<T>(cmd: libc::c_long, attr: &T) -> libc::c_long {
    // SAFETY: `attr` is a valid, initialized bpf_attr prefix of its own size for `cmd`.
    unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *const T,
            std::mem::size_of::<T>(),
        )
    }
}

#[repr(C)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

fn lookup(map: RawFd, key: u64) -> Option<u32> {
    let mut value = 0u32;
    let attr = ElemAttr {
        map_fd: map as u32,
        _pad: 0,
        key: &key as *const u64 as u64,
        value: &mut value as *mut u32 as u64,
        flags: 0,
    };
    (bpf(BPF_MAP_LOOKUP_ELEM, &attr) == 0).then_some(value)
}

fn delete(map: RawFd, key: u64) -> Result<(), ()> {
    let attr = ElemAttr {
        map_fd: map as u32,
        _pad: 0,
        key: &key as *const u64 as u64,
        value: 0,
        flags: 0,
    };
    if bpf(BPF_MAP_DELETE_ELEM, &attr) == 0 {
        Ok(())
    } else {
        Err(())
    }
}

fn keys(map: RawFd) -> Vec<u64> {
    let mut out = Vec::new();
    let mut key = 0u64;
    let mut next = 0u64;
    let mut first = true;
    while out.len() < MAX_HOLDERS as usize {
        let attr = ElemAttr {
            map_fd: map as u32,
            _pad: 0,
            key: if first { 0 } else { &key as *const u64 as u64 },
            value: &mut next as *mut u64 as u64,
            flags: 0,
        };
        if bpf(BPF_MAP_GET_NEXT_KEY, &attr) != 0 {
            break;
        }
        out.push(next);
        key = next;
        first = false;
    }
    out
}

/// Whether the BPF map with kernel id `id` still exists (a tracer's id: it lives).
pub fn map_exists(id: u32) -> bool {
    if id == 0 {
        return false;
    }
    #[repr(C)]
    struct GetByIdAttr {
        id: u32,
        next_id: u32,
        open_flags: u32,
    }
    let fd = bpf(
        BPF_MAP_GET_FD_BY_ID,
        &GetByIdAttr {
            id,
            next_id: 0,
            open_flags: 0,
        },
    );
    if fd >= 0 {
        // SAFETY: the descriptor just returned.
        unsafe { libc::close(fd as i32) };
        return true;
    }
    // Only "no such map" means gone; anything else (EPERM) is taken as alive.
    std::io::Error::last_os_error().raw_os_error() != Some(libc::ENOENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_key_names_its_thread_and_tracer() {
        let k = holder_key(4_000_000, 77);
        assert_eq!(holder_of(k), (4_000_000, 77));
        assert_ne!(k, holder_key(77, 4_000_000));
    }

    /// The kernel's id of the map behind `fd`.
    fn map_id(fd: &OwnedFd) -> u32 {
        #[repr(C)]
        struct InfoAttr {
            bpf_fd: u32,
            info_len: u32,
            info: u64,
        }
        let mut info = [0u32; 32];
        let attr = InfoAttr {
            bpf_fd: fd.as_raw_fd() as u32,
            info_len: std::mem::size_of_val(&info) as u32,
            info: info.as_mut_ptr() as u64,
        };
        assert_eq!(bpf(15, &attr), 0, "BPF_OBJ_GET_INFO_BY_FD"); // (type, id, ...)
        info[1]
    }

    fn insert(map: RawFd, key: u64, pid: u32) {
        let attr = ElemAttr {
            map_fd: map as u32,
            _pad: 0,
            key: &key as *const u64 as u64,
            value: &pid as *const u32 as u64,
            flags: 0,
        };
        assert_eq!(bpf(2, &attr), 0, "BPF_MAP_UPDATE_ELEM");
    }

    /// Real BPF maps (root): two live tracers holding one thread, and one gone.
    #[test]
    fn the_last_live_holder_continues_and_a_dead_one_counts_for_nothing() {
        // SAFETY: no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!(
                "SKIPPED the_last_live_holder_continues_and_a_dead_one_counts_for_nothing: needs root"
            );
            return;
        }
        let map = || create_map(b"TEST", 8, 64).unwrap();
        let holders = map();
        let (a_map, b_map) = (map(), map());
        let dead_id = map_id(&map()); // dropped: that tracer is gone
        let registry = |tracer| Registry {
            map: holders.as_raw_fd(),
            tracer,
            lock: -1,
        };
        let (a, b) = (registry(map_id(&a_map)), registry(map_id(&b_map)));
        assert!(map_exists(a.tracer) && !map_exists(dead_id));
        let (tid, pid) = (4242, 4240);
        for r in [&a, &b] {
            insert(holders.as_raw_fd(), holder_key(tid, r.tracer), pid);
        }
        insert(holders.as_raw_fd(), holder_key(tid + 1, dead_id), pid);
        assert!(a.held_by_others(pid) && b.held_by_others(pid));
        assert_eq!(a.own(), vec![(tid, pid)]);
        // A is ready first: B still holds it. B, the last, continues it.
        assert_eq!(a.take(tid), Taken::OthersHold);
        assert_eq!(a.take(tid), Taken::NotHeld);
        assert!(
            !b.held_by_others(pid),
            "only A's and a dead tracer's entries were left"
        );
        assert_eq!(b.take(tid), Taken::Last(pid));
        // The dead tracer's entry was removed on the way.
        assert!(keys(holders.as_raw_fd()).is_empty());
    }
}
