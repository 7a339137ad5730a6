//! Library discovery: `opened` (or `enter_openat` / `exit_openat` where the kernel has no
//! fexit programs) reports each shared object a traced process opens, so libraries loaded
//! later get probes too; in launch mode an object user space has not planned
//! (`KNOWN_PATHS`) stops the process until it has. The node agent
//! holds a process the same way at the open of a vendor library (`VENDOR_NAMES`) whose path
//! it has not cleared in the process's cgroup (`CLEARED`). Both record their stop at an open in
//! `HOLDERS`, which every tracer on the node shares (pinned in bpffs), so the last tracer
//! whose probes are in place is the one that continues the process (user space `holders.rs`).

use aya_ebpf::{
    helpers::{bpf_get_current_cgroup_id, bpf_probe_read_kernel},
    macros::{fexit, map, tracepoint},
    maps::{Array, HashMap, LruHashMap},
    programs::{FExitContext, TracePointContext},
};
use probe_common::{DATA_LEN, FNV_OFFSET, FNV_PRIME, RawEvent, counter, event_flags, kind};

use crate::{
    capture::copy_user_str,
    emit::{BPF_RB_FORCE_WAKEUP, emit, emit_unhurried, scratch, stop_current_thread},
    maps::{EVENTS, bump, current_ids, is_traced, offsets},
};

/// Linux `O_ACCMODE`: an open with any of these bits set may write.
const O_ACCMODE: u64 = 3;

/// `probe_common::vendor_name_hash` of the file names the agent probes (user space fills it).
#[map]
static VENDOR_NAMES: HashMap<u64, u8> = HashMap::with_max_entries(1024, 0);

/// `probe_common::hold_key`s (path and cgroup) whose file has its probes: no hold at their
/// open. LRU: a busy node's many cgroups never fill it, an evicted key costs one more hold.
#[map]
static CLEARED: LruHashMap<u64, u8> = LruHashMap::with_max_entries(65536, 0);

/// `probe_common::holder_key(thread, tracer)` -> process, for each thread a tracer stopped at
/// an open: one map for every tracer on the node (user space pins it in bpffs). A tracer's
/// user space (or its watchdog) removes its own entry when its probes are in place and
/// continues the process only when no other live tracer's entry for the thread is left.
#[map]
static HOLDERS: HashMap<u64, u32> = HashMap::with_max_entries(16384, 0);

/// Processes that are themselves tracers (tgid -> tracer id), shared and pinned as `HOLDERS`
/// is: another tracer reading a library to place its probes is never held (two agents would
/// stop each other, each waiting for the other's watchdog).
#[map]
static TRACERS: HashMap<u32, u32> = HashMap::with_max_entries(1024, 0);

/// This tracer's id in `HOLDERS` (the kernel's id of this map), written by user space.
#[map]
static TRACER: Array<u32> = Array::with_max_entries(1, 0);

/// Opens of shared objects between syscall entry and exit, keyed by thread id.
#[map]
static OPENS: HashMap<u32, RawEvent> = HashMap::with_max_entries(4096, 0);

/// Hashes (`probe_common::path_hash`) of shared-object paths user space has already planned:
/// opening one of these never stops the process.
#[map]
static KNOWN_PATHS: HashMap<u64, u8> = HashMap::with_max_entries(65536, 0);

/// Library discovery where the kernel has fexit programs: one program at the return of
/// `do_sys_openat2` (`open`, `openat` and `openat2` all end there), and only opens pay for it.
/// The syscall tracepoints below put every task of the machine on the system calls' slow path
/// while attached, traced or not (+0.06 µs per call on the x86 VM of docs/benchmark-notes.md,
/// session 16).
#[fexit(function = "do_sys_openat2")]
pub fn opened(ctx: FExitContext) -> i32 {
    let _ = try_opened(&ctx);
    0
}

#[inline(always)]
fn try_opened(ctx: &FExitContext) -> Option<()> {
    // `long` or `int` by kernel version; either way an fd or -errno fits 32 bits.
    let ret: u64 = ctx.arg(3);
    let (tgid, tid) = current_ids();
    if ret as i32 >= 0 && is_traced(tgid) {
        let dfd: u64 = ctx.arg(0);
        let filename: u64 = ctx.arg(1);
        // `struct open_how`, in the kernel's memory: `flags` first.
        let how: u64 = ctx.arg(2);
        let flags = unsafe { bpf_probe_read_kernel(how as *const u64) }.unwrap_or(0);
        let ev = shared_object_open(tgid, tid, dfd as i32 as i64, filename, flags)?;
        report_open(ev, tid);
    }
    Some(())
}

/// Library discovery, part 1, where the kernel has no fexit programs: remember the path of a
/// shared object being opened.
#[tracepoint]
pub fn enter_openat(ctx: TracePointContext) -> u32 {
    let _ = try_enter_openat(&ctx);
    0
}

#[inline(always)]
fn try_enter_openat(ctx: &TracePointContext) -> Option<()> {
    let (tgid, tid) = current_ids();
    if !is_traced(tgid) {
        return None;
    }
    let off = offsets();
    let dfd: i64 = unsafe { ctx.read_at(off.openat_dfd as usize) }.ok()?;
    let filename: u64 = unsafe { ctx.read_at(off.openat_filename as usize) }.ok()?;
    let flags: u64 = unsafe { ctx.read_at(off.openat_flags as usize) }.unwrap_or(0);
    let ev = shared_object_open(tgid, tid, dfd, filename, flags)?;
    let _ = OPENS.insert(&tid, ev, 0);
    Some(())
}

/// The OPEN record of a (traced) process opening a shared object (else None), in the scratch
/// event: directory fd, path and its hashes.
#[inline(always)]
fn shared_object_open(
    tgid: u32,
    tid: u32,
    dfd: i64,
    filename: u64,
    flags: u64,
) -> Option<&'static mut RawEvent> {
    let ev = scratch(kind::OPEN, tgid, tid)?;
    ev.args[0] = dfd as u64;
    copy_user_str(ev, filename as *const u8);
    let (hash, shared_object, name_hash) = scan_path(&ev.data);
    if !shared_object {
        return None;
    }
    ev.args[1] = hash;
    // A writer (a runtime unpacking an image) is never held: no name matches 0.
    ev.args[2] = if flags & O_ACCMODE == 0 { name_hash } else { 0 };
    Some(ev)
}

/// Library discovery, part 2: the open succeeded. Failed opens (the loader trying each
/// directory of its search path) are dropped here.
#[tracepoint]
pub fn exit_openat(ctx: TracePointContext) -> u32 {
    let _ = try_exit_openat(&ctx);
    0
}

#[inline(always)]
fn try_exit_openat(ctx: &TracePointContext) -> Option<()> {
    let (_, tid) = current_ids();
    let ev = unsafe { &mut *OPENS.get_ptr_mut(&tid)? };
    let ret: i64 = unsafe { ctx.read_at(offsets().openat_ret as usize) }.unwrap_or(-1);
    if ret >= 0 {
        report_open(ev, tid);
    }
    let _ = OPENS.remove(&tid);
    Some(())
}

/// Sends the record of a shared object opened. User space checks the object for probed
/// symbols; in launch mode a shared object nobody planned for stops the process first, so it
/// cannot be mapped and called before it has probes.
#[inline(always)]
fn report_open(ev: &mut RawEvent, tid: u32) {
    if offsets().hold_vendor_opens != 0 {
        // The agent: only a vendor library it has not cleared for this cgroup holds; any
        // other open is reported as before.
        let cgroup = unsafe { bpf_get_current_cgroup_id() };
        ev.args[3] = cgroup;
        let vendor = unsafe { VENDOR_NAMES.get(&ev.args[2]) }.is_some()
            && unsafe { TRACERS.get(&ev.pid) }.is_none();
        let key = probe_common::hold_key(ev.args[1], cgroup);
        if vendor && unsafe { CLEARED.get(&key) }.is_none() {
            emit_holding(ev, tid, true);
        } else {
            emit(ev);
        }
    } else {
        let launch = offsets().stop_on_discovery != 0;
        // Only launch mode reads it (the agent and `--pid` never stop at an open).
        let planned = launch && unsafe { KNOWN_PATHS.get(&ev.args[1]) }.is_some();
        if launch && planned && offsets().python_stacks == 0 {
            // Its probes are in place: user space only refreshes what it caches about the
            // process's mappings, and the record reaches it in order, before any later record
            // of the process. Waking it for each open cost the target ~15-45 us per dlopen on
            // two busy CPUs. (Python stacks are set up when the interpreter's library is
            // opened, and the agent and `--pid` plan another namespace's file at the same
            // path when it is opened: those still wake user space.)
            emit_unhurried(ev);
        } else if launch && !planned {
            // Stopped, whatever the registry: only this session continues it.
            emit_holding(ev, tid, false);
        } else {
            emit(ev);
        }
    }
}

/// Emits `ev` with the calling thread stopped and recorded in `HOLDERS` (before the signal:
/// another tracer releasing the thread meanwhile must see that we hold it too). As
/// `emit_stopping`, the record is reserved first. Without room in the ring the process runs
/// on unheld; without room in `HOLDERS` it is held only when `!registered_only` (launch mode,
/// whose user space continues it in any case; the agent's first calls may then be missed, as
/// before holds existed).
#[inline(always)]
fn emit_holding(ev: &mut RawEvent, tid: u32, registered_only: bool) {
    let Some(mut entry) = EVENTS.reserve::<RawEvent>(0) else {
        bump(counter::RINGBUF_FULL);
        return;
    };
    let tracer = TRACER.get(0).copied().unwrap_or(0);
    let key = probe_common::holder_key(tid, tracer);
    let registered = HOLDERS.insert(&key, &ev.pid, 0).is_ok();
    if registered || !registered_only {
        if stop_current_thread() {
            ev.flags |= event_flags::STOPPED;
        } else if registered {
            let _ = HOLDERS.remove(&key);
        }
    }
    entry.write(*ev);
    entry.submit(BPF_RB_FORCE_WAKEUP);
}

/// FNV-1a of the path (as `probe_common::path_hash`), whether its file name contains `.so`,
/// and the hash of that name up to its first `.so` (`probe_common::vendor_name_hash`).
#[inline(always)]
fn scan_path(data: &[u8; DATA_LEN]) -> (u64, bool, u64) {
    let mut h = FNV_OFFSET;
    let mut name = FNV_OFFSET;
    let mut shared_object = false;
    let mut prev2 = 0u8;
    let mut prev1 = 0u8;
    for i in 0..DATA_LEN {
        let b = data[i];
        if b == 0 {
            break;
        }
        h = (h ^ b as u64).wrapping_mul(FNV_PRIME);
        if b == b'/' {
            shared_object = false;
            name = FNV_OFFSET;
        } else {
            if !shared_object {
                name = (name ^ b as u64).wrapping_mul(FNV_PRIME);
            }
            if prev2 == b'.' && prev1 == b's' && b == b'o' {
                shared_object = true;
            }
        }
        prev2 = prev1;
        prev1 = b;
    }
    (h, shared_object, name)
}
