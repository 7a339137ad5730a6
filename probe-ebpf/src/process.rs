//! The process tree: `task_newtask`, `process_exec` and `process_exit` keep `TRACED` equal
//! to the tree being watched and tell user space of forks, execs and exits; in launch mode
//! a new child is held (`CHILD_STOPS`) and stopped by `child_start` on its way to user space
//! until its probes are attached. Each of these says what it saw in the tracer's
//! `--log-level=debug` (aya-log; the level is a load-time constant, so with logging off the
//! verifier drops those branches).

use aya_ebpf::{
    EbpfContext,
    helpers::bpf_probe_read_kernel_str_bytes,
    macros::{map, raw_tracepoint, tracepoint},
    maps::{Array, HashMap},
    programs::{RawTracePointContext, TracePointContext},
};
use aya_log_ebpf::debug;
use probe_common::{CLONE_THREAD, counter, event_flags, kind};

use crate::{
    emit::{emit, emit_stopping, scratch},
    maps::{TRACED, bump, current_ids, is_traced, offsets},
};

/// A traced process created a task. Threads share the tgid and need nothing; a new
/// process joins the traced set before it can run a single instruction.
#[tracepoint]
pub fn task_newtask(ctx: TracePointContext) -> u32 {
    let _ = try_task_newtask(&ctx);
    0
}

#[inline(always)]
fn try_task_newtask(ctx: &TracePointContext) -> Option<()> {
    let (tgid, tid) = current_ids();
    if !is_traced(tgid) {
        return None;
    }
    let off = offsets();
    let clone_flags: u64 = unsafe { ctx.read_at(off.newtask_clone_flags as usize) }.ok()?;
    if clone_flags & CLONE_THREAD != 0 {
        return None;
    }
    let child: i32 = unsafe { ctx.read_at(off.newtask_pid as usize) }.ok()?;
    if TRACED.insert(&(child as u32), &tgid, 0).is_err() {
        bump(counter::TRACED_FULL);
    }
    debug!(ctx, "traced process {} forked {}", tgid, child as u32);
    if hold_new_child(child as u32, tgid, clone_flags) {
        return None;
    }
    let ev = scratch(kind::FORK, tgid, tid)?;
    ev.args[0] = child as u64;
    ev.args[1] = clone_flags;
    emit(ev);
    Some(())
}

/// New processes of the traced tree to stop on their way to user space, child tgid ->
/// (parent tgid, clone flags): probes are scoped per process, so a child forked without exec
/// has none until user space attaches for it (launch mode; see `child_start`).
#[map]
static CHILD_STOPS: HashMap<u32, [u64; 2]> = HashMap::with_max_entries(1024, 0);

/// 1 once user space has attached `child_start`, which then sends the FORK event.
#[map]
static HOLD_CHILDREN: Array<u32> = Array::with_max_entries(1, 0);

/// How many children wait in `CHILD_STOPS`. `child_start` runs at every system call's exit
/// on the machine: while none waits it returns after one array read, no hash lookup (an
/// untraced process's system calls pay ~110 ns less).
#[map]
static CHILDREN_WAITING: Array<u64> = Array::with_max_entries(1, 0);

/// Adds `delta` (wrapping: `u64::MAX` takes one off) to `CHILDREN_WAITING`, atomically (a
/// plain `xadd`: the result is not used).
#[inline(always)]
fn add_children_waiting(delta: u64) {
    if let Some(p) = CHILDREN_WAITING.get_ptr_mut(0) {
        // The BPF target has no compare-and-swap, so `AtomicU64::fetch_add` is not offered;
        // the intrinsic lowers to the `xadd` every BPF CPU version has.
        unsafe {
            core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(
                p, delta,
            )
        };
    }
}

/// Leaves the FORK event of `child` to `child_start` (true) when children are held.
#[inline(always)]
fn hold_new_child(child: u32, parent: u32, clone_flags: u64) -> bool {
    if !HOLD_CHILDREN.get(0).is_some_and(|h| *h != 0) {
        return false;
    }
    // Counted before the child can run (task_newtask fires before it is woken).
    let held = CHILD_STOPS
        .insert(&child, &[parent as u64, clone_flags], 0)
        .is_ok();
    if held {
        add_children_waiting(1);
    }
    held
}

/// Every system call's exit (`raw_syscalls:sys_exit`), which a new process passes through
/// in its own context on its way from fork to its first instruction. A held child of the traced tree sends its FORK event and stops, so user space can
/// attach its probes before it runs an instruction; user space continues it.
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn child_start(_ctx: RawTracePointContext) -> i32 {
    let _ = try_child_start();
    0
}

#[inline(always)]
fn try_child_start() -> Option<()> {
    if CHILDREN_WAITING.get(0).is_none_or(|n| *n == 0) {
        return None;
    }
    let (tgid, tid) = current_ids();
    if tgid != tid {
        return None;
    }
    let held = *unsafe { CHILD_STOPS.get(&tgid) }?;
    if CHILD_STOPS.remove(&tgid).is_ok() {
        add_children_waiting(u64::MAX);
    }
    let ev = scratch(kind::FORK, held[0] as u32, tid)?;
    ev.args[0] = tgid as u64;
    ev.args[1] = held[1];
    emit_stopping(ev, true);
    Some(())
}

#[tracepoint]
pub fn process_exec(ctx: TracePointContext) -> u32 {
    let _ = try_process_exec(&ctx);
    0
}

#[inline(always)]
fn try_process_exec(ctx: &TracePointContext) -> Option<()> {
    let (tgid, tid) = current_ids();
    if !is_traced(tgid) {
        return None;
    }
    let loc: u32 = unsafe { ctx.read_at(offsets().exec_filename_loc as usize) }.ok()?;
    let ev = scratch(kind::EXEC, tgid, tid)?;
    let src = unsafe { (ctx.as_ptr() as *const u8).add((loc & 0xffff) as usize) };
    match unsafe { bpf_probe_read_kernel_str_bytes(src, &mut ev.data) } {
        Ok(s) => ev.data_len = s.len() as u16,
        Err(_) => ev.flags |= event_flags::DATA_FAULT,
    }
    // The new program has not run an instruction yet: hold it until its libraries have probes.
    let stop = offsets().stop_on_discovery != 0;
    debug!(ctx, "traced process {} exec, held: {}", tgid, stop as u8);
    emit_stopping(ev, stop);
    Some(())
}

/// The whole thread group is gone: drop it from the traced set and tell user space.
#[tracepoint]
pub fn process_exit(ctx: TracePointContext) -> u32 {
    let _ = try_process_exit(&ctx);
    0
}

#[inline(always)]
fn try_process_exit(ctx: &TracePointContext) -> Option<()> {
    let (tgid, tid) = current_ids();
    if !is_traced(tgid) {
        return None;
    }
    let group_dead_at = offsets().exit_group_dead;
    let group_dead: u8 = if group_dead_at == probe_common::NO_GROUP_DEAD {
        // No such field before Linux 6.16: the main thread's exit stands in for the group's.
        (tid == tgid) as u8
    } else {
        unsafe { ctx.read_at(group_dead_at as usize) }.ok()?
    };
    if group_dead == 0 {
        return None;
    }
    let _ = TRACED.remove(&tgid);
    debug!(ctx, "traced process {} exited", tgid);
    let ev = scratch(kind::EXIT, tgid, tid)?;
    emit(ev);
    Some(())
}
