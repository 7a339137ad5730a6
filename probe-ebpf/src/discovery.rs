//! Library discovery: `enter_openat` / `exit_openat` report each shared object a traced
//! process opens, so libraries loaded later get probes too; in launch mode an object user
//! space has not planned (`KNOWN_PATHS`) stops the process until it has.

use aya_ebpf::{
    macros::{map, tracepoint},
    maps::HashMap,
    programs::TracePointContext,
};
use probe_common::{DATA_LEN, FNV_OFFSET, FNV_PRIME, RawEvent, kind};

use crate::{
    capture::copy_user_str,
    emit::{emit_stopping, emit_unhurried, scratch},
    maps::{current_ids, is_traced, offsets},
};

/// Opens of shared objects between syscall entry and exit, keyed by thread id.
#[map]
static OPENS: HashMap<u32, RawEvent> = HashMap::with_max_entries(4096, 0);

/// Hashes (`probe_common::path_hash`) of shared-object paths user space has already planned:
/// opening one of these never stops the process.
#[map]
static KNOWN_PATHS: HashMap<u64, u8> = HashMap::with_max_entries(65536, 0);

/// Library discovery, part 1: remember the path of a shared object being opened.
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
    let ev = scratch(kind::OPEN, tgid, tid)?;
    ev.args[0] = dfd as u64;
    copy_user_str(ev, filename as *const u8);
    let (hash, shared_object) = scan_path(&ev.data);
    if !shared_object {
        return None;
    }
    ev.args[1] = hash;
    let _ = OPENS.insert(&tid, ev, 0);
    Some(())
}

/// Library discovery, part 2: the open succeeded. User space checks the object for probed
/// symbols; in launch mode a shared object nobody planned for stops the process first, so it
/// cannot be mapped and called before it has probes. Failed opens (the loader trying each
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
        } else {
            emit_stopping(ev, launch && !planned);
        }
    }
    let _ = OPENS.remove(&tid);
    Some(())
}

/// FNV-1a of the path (as `probe_common::path_hash`) and whether its file name contains `.so`.
#[inline(always)]
fn scan_path(data: &[u8; DATA_LEN]) -> (u64, bool) {
    let mut h = FNV_OFFSET;
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
        } else if prev2 == b'.' && prev1 == b's' && b == b'o' {
            shared_object = true;
        }
        prev2 = prev1;
        prev1 = b;
    }
    (h, shared_object)
}
