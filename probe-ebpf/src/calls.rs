//! Probed calls: `call_entry` / `call_return` serve every probed function (the attach
//! cookie is the probe id, `PROBE_SPECS[id]` says what to capture), `hal_return` the calls
//! that capture no data, `call_return_site` the `NESTED` probes' return instructions. Owns
//! the calls between entry and return: the per-thread pending stack (task storage),
//! `PENDING` for calls that copy data and `PENDING_NESTED` for recursive ones.

use core::ffi::c_void;

use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_ktime_get_ns, bpf_probe_read_user, generated::bpf_get_attach_cookie},
    macros::{btf_map, map, uprobe, uretprobe},
    maps::{HashMap, LruHashMap},
    programs::{ProbeContext, RetProbeContext},
};
use probe_common::{
    CHAIN_SUM_ARG, COOKIE_HI_SHIFT, COOKIE_PROBE_MASK, MAX_ARGS, ProbeSpec, RAW_HEADER, RawEvent,
    counter, event_flags, kind, read_chain, spec_flags,
};

use crate::{
    batch::{BATCHING, batch_call},
    capture::{copy_indirect, copy_user_bytes, copy_user_str, emit_batch},
    emit::{batched_wake_flags, emit, emit_stopping, scratch},
    maps::{EVENTS, PROBE_SPECS, TRACED_GEN, TaskStorage, bump, current_ids, is_traced, offsets},
    sampling,
    stacks::emit_stack,
};

/// Calls between entry and return of probes that copy data, keyed by (tid << 32 | probe id).
#[map]
static PENDING: HashMap<u64, RawEvent> = HashMap::with_max_entries(16384, 0);

/// Calls of one thread in flight, innermost last (returns come back in LIFO order per thread).
const PENDING_DEPTH: usize = 8;

/// A call between entry and return for probes that capture no data (the HAL calls).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct PendingSlot {
    pub(crate) ts_ns: u64,
    /// User stack pointer at entry: tells the call's own return from that of a deeper call
    /// whose return never came (longjmp), and a stale slot from a live ancestor.
    pub(crate) sp: u64,
    pub(crate) args: [u64; MAX_ARGS],
    /// The attach cookie's low 32 bits: the probe id in the low 16 (`COOKIE_PROBE_MASK`).
    pub(crate) probe: u32,
    /// The thread group at entry.
    pub(crate) pid: u32,
    pub(crate) tid: u32,
}

/// Per-thread LIFO of pending calls, in task-local storage: no hash, no lock, no key; freed
/// with the thread.
#[repr(C)]
struct PendingStack {
    depth: u32,
    /// `TRACED_GEN + 1` when this thread's process was last found in `TRACED` (0: never).
    traced_gen: u32,
    slots: [PendingSlot; PENDING_DEPTH],
}

#[btf_map]
static PENDING_STACKS: TaskStorage<PendingStack> = TaskStorage::new();

/// Entries of `NESTED` probes: the stack pointer at entry tells recursive calls apart.
#[repr(C)]
#[derive(Clone, Copy)]
struct NestedKey {
    call: u64,
    sp: u64,
}

/// LRU: an entry whose return never comes (an exception out of the function, with return
/// probes on its return instructions) is eventually evicted.
#[map]
static PENDING_NESTED: LruHashMap<NestedKey, RawEvent> = LruHashMap::with_max_entries(4096, 0);

/// The header of a [`RawEvent`] (all a call without data sends), built in the ring buffer.
#[repr(C)]
struct CallHeader {
    kind: u16,
    flags: u16,
    probe: u16,
    data_len: u16,
    pid: u32,
    tid: u32,
    cpu: u32,
    _pad: u32,
    ts_ns: u64,
    ret_ts_ns: u64,
    args: [u64; MAX_ARGS],
    ret: u64,
    deref: u64,
}

const _: () = assert!(core::mem::size_of::<CallHeader>() == RAW_HEADER);
const _: () =
    assert!(core::mem::offset_of!(CallHeader, ts_ns) == core::mem::offset_of!(RawEvent, ts_ns));
const _: () =
    assert!(core::mem::offset_of!(CallHeader, deref) == core::mem::offset_of!(RawEvent, deref));

#[uprobe]
pub fn call_entry(ctx: ProbeContext) -> u32 {
    let _ = try_call_entry(&ctx);
    0
}

#[inline(always)]
fn try_call_entry(ctx: &ProbeContext) -> Option<()> {
    let (tgid, tid) = current_ids();
    // A thread with a pending stack that saw its process traced since the last removal from
    // TRACED is still traced; others look it up.
    let st = PENDING_STACKS.current(false);
    let generation = TRACED_GEN.get(0).copied().unwrap_or(0).wrapping_add(1);
    let cached = match &st {
        Some(st) => st.traced_gen == generation,
        None => false,
    };
    if !cached && !is_traced(tgid) {
        return None;
    }
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let probe = (cookie & COOKIE_PROBE_MASK) as u32;
    // References into the map, never copies: the BPF stack is 512 bytes for the whole chain
    // of calls (`trace::bpf::stack_budget`).
    let spec = PROBE_SPECS.get(probe)?;
    const DATA: u32 = spec_flags::DATA_IS_STRING | spec_flags::DATA_IS_BYTES;
    if spec.flags & spec_flags::WANTS_RETURN != 0 && spec.flags & (DATA | spec_flags::NESTED) == 0 {
        // The slot keeps the cookie's low 32 bits: the id and what user space put above it.
        return push_call(ctx, st, generation, cookie as u32, spec, tgid, tid);
    }
    let ev = scratch(kind::CALL, tgid, tid)?;
    ev.probe = probe as u16;
    ev.cpu = (cookie >> COOKIE_HI_SHIFT) as u32;
    ev.args[0] = ctx.arg::<u64>(0).unwrap_or(0);
    ev.args[1] = ctx.arg::<u64>(1).unwrap_or(0);
    ev.args[2] = ctx.arg::<u64>(2).unwrap_or(0);
    ev.args[3] = ctx.arg::<u64>(3).unwrap_or(0);
    ev.args[4] = ctx.arg::<u64>(4).unwrap_or(0);
    ev.args[5] = ctx.arg::<u64>(5).unwrap_or(0);

    if spec.flags & (spec_flags::DATA_IS_STRING | spec_flags::DATA_IS_BYTES) != 0 {
        let src = match ev.args.get(spec.data_arg as usize) {
            Some(a) => *a as *const u8,
            None => return None,
        };
        if spec.flags & spec_flags::DATA_IS_STRING != 0 {
            copy_user_str(ev, src);
        } else {
            copy_user_bytes(ev, src, spec.data_len);
            if spec.flags & spec_flags::INDIRECT != 0 {
                copy_indirect(ev, spec);
            }
            // A call no row needs: dropped before its stack is read or its event sent.
            if spec.flags & spec_flags::SKIP_BYTE != 0
                && ev.data[spec.skip_off as usize & (probe_common::DATA_LEN - 1)] as u32
                    == spec.skip_value
            {
                return None;
            }
        }
    }

    if spec.flags & spec_flags::WANTS_RETURN != 0 {
        let key = ((tid as u64) << 32) | probe as u64;
        let stored = if spec.flags & spec_flags::NESTED != 0 {
            let nested = NestedKey {
                call: key,
                sp: stack_pointer(ctx.as_ptr()),
            };
            PENDING_NESTED.insert(&nested, ev, 0)
        } else {
            PENDING.insert(&key, ev, 0)
        };
        if stored.is_err() {
            bump(counter::PENDING_FULL);
        }
    } else if spec.flags & spec_flags::BATCH != 0 {
        if sampling::wants_stack(probe, &ev.args, Some(&ev.data)) {
            emit_stack(ctx.as_ptr(), tgid, tid, ev.ts_ns);
        }
        emit_batch(ev, spec);
    } else {
        if spec.flags & spec_flags::STOP_AT_ENTRY != 0 {
            emit_stopping(ev, offsets().stop_on_discovery != 0);
        } else {
            if spec.flags & spec_flags::NO_STACK == 0
                && sampling::wants_stack(probe, &ev.args, Some(&ev.data))
            {
                if spec.flags & spec_flags::PYTHON_STACK_ONLY != 0 {
                    let sp = stack_pointer(ctx.as_ptr());
                    crate::python::emit_python_stack(tgid, tid, ev.ts_ns, sp, false);
                } else {
                    emit_stack(ctx.as_ptr(), tgid, tid, ev.ts_ns);
                }
            }
            emit(ev);
        }
    }
    Some(())
}

/// Pushes a call that captures no data (the HAL calls) on the thread's pending stack: only
/// its arguments wait for the return (`hal_return`).
#[inline(always)]
fn push_call(
    ctx: &ProbeContext,
    st: Option<&mut PendingStack>,
    generation: u32,
    cookie: u32,
    spec: &ProbeSpec,
    tgid: u32,
    tid: u32,
) -> Option<()> {
    // The common case (HAL calls): only the arguments wait for the return, on this
    // thread's pending stack.
    let st = match st {
        Some(st) => st,
        None => match PENDING_STACKS.current(true) {
            Some(st) => st,
            None => {
                bump(counter::PENDING_FULL);
                return None;
            }
        },
    };
    st.traced_gen = generation;
    let sp = stack_pointer(ctx.as_ptr());
    // Slots at or below our stack pointer belong to calls that can no longer return
    // (left by longjmp, or from before an exec): drop them.
    let mut depth = st.depth as usize;
    if sp != 0 {
        for _ in 0..PENDING_DEPTH {
            if depth == 0 || st.slots[(depth - 1) & (PENDING_DEPTH - 1)].sp > sp {
                break;
            }
            depth -= 1;
        }
    }
    if depth >= PENDING_DEPTH {
        st.depth = depth as u32;
        bump(counter::PENDING_FULL);
        return None;
    }
    let slot = &mut st.slots[depth & (PENDING_DEPTH - 1)];
    slot.ts_ns = if spec.flags & spec_flags::TIME_AT_RETURN != 0 {
        0
    } else {
        unsafe { bpf_ktime_get_ns() }
    };
    slot.sp = sp;
    slot.args = [
        ctx.arg::<u64>(0).unwrap_or(0),
        ctx.arg::<u64>(1).unwrap_or(0),
        ctx.arg::<u64>(2).unwrap_or(0),
        ctx.arg::<u64>(3).unwrap_or(0),
        ctx.arg::<u64>(4).unwrap_or(0),
        ctx.arg::<u64>(5).unwrap_or(0),
    ];
    slot.probe = cookie;
    slot.pid = tgid;
    slot.tid = tid;
    st.depth = depth as u32 + 1;
    Some(())
}

#[uretprobe]
pub fn call_return(ctx: RetProbeContext) -> u32 {
    let _ = try_call_return(&ctx);
    0
}

/// How far the stack pointer moved between a function's entry and its return probe: x86-64's
/// `ret` pops the return address; arm64 returns through the link register.
#[cfg(bpf_target_arch = "x86_64")]
const RETURN_SP_DELTA: u64 = 8;
#[cfg(not(bpf_target_arch = "x86_64"))]
const RETURN_SP_DELTA: u64 = 0;

#[inline(always)]
fn stack_pointer(ctx: *mut c_void) -> u64 {
    #[cfg(bpf_target_arch = "x86_64")]
    {
        let regs = unsafe { &*(ctx as *const aya_ebpf::bindings::pt_regs) };
        regs.rsp
    }
    #[cfg(bpf_target_arch = "aarch64")]
    {
        let regs = unsafe { &*(ctx as *const aya_ebpf::bindings::user_pt_regs) };
        regs.sp
    }
    #[cfg(not(any(bpf_target_arch = "x86_64", bpf_target_arch = "aarch64")))]
    {
        let _ = ctx;
        0
    }
}

#[inline(always)]
fn try_call_return(ctx: &RetProbeContext) -> Option<()> {
    // No traced-set lookup here: only traced processes store entries, and the entry's
    // process is checked against ours (a thread id can be reused by another process).
    let (tgid, tid) = current_ids();
    let probe = (unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } & COOKIE_PROBE_MASK) as u32;
    let key = ((tid as u64) << 32) | probe as u64;
    let spec = PROBE_SPECS.get(probe)?;
    const DATA: u32 = spec_flags::DATA_IS_STRING | spec_flags::DATA_IS_BYTES;
    if spec.flags & spec_flags::NESTED != 0 {
        let sp = stack_pointer(ctx.as_ptr()).wrapping_sub(RETURN_SP_DELTA);
        return finish_nested(ctx.as_ptr(), key, sp, ctx.ret::<u64>(), spec, tgid, tid);
    }
    if spec.flags & DATA == 0 {
        // Attached to `hal_return` by user space; kept here for completeness.
        return finish_call(ctx, pop_call(ctx)?);
    }
    let ev = unsafe { &mut *PENDING.get_ptr_mut(&key)? };
    if ev.pid != tgid {
        bump(counter::ORPHAN_RETURN);
        let _ = PENDING.remove(&key);
        return None;
    }
    finish_return(
        ctx.as_ptr(),
        ctx.ret::<u64>(),
        ev,
        spec,
        tgid,
        tid,
        Some(key),
    )
}

/// Return of a call that captures no data (the HAL calls; user space attaches this program
/// where the spec has `WANTS_RETURN` and neither data nor `NESTED`). Everything it needs is in
/// the thread's pending stack, so it asks the kernel for nothing else (no thread id, no
/// cookie): ~15 ns of helper calls saved on every traced call.
#[uretprobe]
pub fn hal_return(ctx: RetProbeContext) -> u32 {
    if let Some(call) = pop_call(&ctx) {
        let _ = finish_call(&ctx, call);
    }
    0
}

/// Takes this call's entry off the thread's pending stack (None: its entry was not stored).
/// The slot itself, not a copy: nothing pushes on this thread's stack before the call is sent.
#[inline(always)]
fn pop_call(ctx: &RetProbeContext) -> Option<&'static PendingSlot> {
    // Untraced threads never stored a call, so they have no pending stack, and a thread's
    // stack dies with it: an entry is never paired with another process's return.
    let st = PENDING_STACKS.current(false)?;
    let sp = stack_pointer(ctx.as_ptr());
    // Deeper calls whose returns never came (longjmp) sit above ours: drop them. At the
    // return, sp is the entry's (aarch64) or 8 above it (x86-64, the popped return address).
    let mut depth = st.depth as usize;
    if sp != 0 {
        for _ in 0..PENDING_DEPTH {
            if depth == 0 || st.slots[(depth - 1) & (PENDING_DEPTH - 1)].sp + 8 >= sp {
                break;
            }
            depth -= 1;
        }
    }
    if depth == 0 {
        st.depth = 0;
        return None;
    }
    if st.slots[(depth - 1) & (PENDING_DEPTH - 1)].sp > sp {
        // A caller's entry, not ours: this call's entry was not stored (PENDING_FULL).
        st.depth = depth as u32;
        return None;
    }
    st.depth = depth as u32 - 1;
    let st: &'static PendingStack = st;
    Some(&st.slots[(depth - 1) & (PENDING_DEPTH - 1)])
}

/// Sends a call taken off the pending stack: into this CPU's batch, or (a call with a stack
/// sample, or any call while batching is off) straight into the ring buffer after its sample.
/// User space pairs a sample with the call of its thread that has its `ts_ns`, so a batch
/// sent from another CPU in between takes nothing (the node agent batches its unsampled
/// calls; a single run with stacks samples every call, so it sends them all one by one).
#[inline(always)]
fn finish_call(ctx: &RetProbeContext, call: &PendingSlot) -> Option<()> {
    let probe = call.probe & COOKIE_PROBE_MASK as u32;
    let spec = PROBE_SPECS.get(probe)?;
    // A process without CPython keeps its calls batched when only Python stacks are on.
    let stacks = offsets().capture_stacks != 0 || crate::python::runs_python(call.pid);
    let sampled = stacks && sampling::wants_stack(probe, &call.args, None);
    if !sampled && BATCHING.get(0).is_some_and(|b| *b != 0) {
        return batch_call(ctx, call, spec);
    }
    let (ts_ns, ret_ts_ns) = call_times(call, spec);
    let (deref, flags) = read_deref(call, spec);
    // The stack sample goes first: records reach user space in reservation order.
    if sampled {
        emit_stack(ctx.as_ptr(), call.pid, call.tid, ts_ns);
    }
    // Written straight into the ring buffer, field by field (no per-CPU scratch event, and
    // no header built on the stack first: 104 bytes of the 512).
    let wake = batched_wake_flags(core::mem::size_of::<CallHeader>());
    let Some(mut entry) = EVENTS.reserve::<CallHeader>(0) else {
        bump(counter::RINGBUF_FULL);
        return None;
    };
    let h = entry.as_mut_ptr();
    unsafe {
        (*h).kind = kind::CALL;
        (*h).flags = flags;
        (*h).probe = call.probe as u16;
        (*h).data_len = 0;
        (*h).pid = call.pid;
        (*h).tid = call.tid;
        (*h).cpu = call.probe >> COOKIE_HI_SHIFT;
        (*h)._pad = 0;
        (*h).ts_ns = ts_ns;
        (*h).ret_ts_ns = ret_ts_ns;
        (*h).args = call.args;
        (*h).ret = ctx.ret::<u64>();
        (*h).deref = deref;
    }
    entry.submit(wake);
    Some(())
}

/// The entry and return timestamps of a call from the pending stack: one clock read when the
/// spec dates the call at one end only.
#[inline(always)]
pub(crate) fn call_times(call: &PendingSlot, spec: &ProbeSpec) -> (u64, u64) {
    if spec.flags & spec_flags::TIME_AT_ENTRY != 0 {
        return (call.ts_ns, call.ts_ns);
    }
    let now = unsafe { bpf_ktime_get_ns() };
    if spec.flags & spec_flags::TIME_AT_RETURN != 0 {
        (now, now)
    } else {
        (call.ts_ns, now)
    }
}

/// The out-parameter of a call from the pending stack and the event flags that go with it.
#[inline(always)]
pub(crate) fn read_deref(call: &PendingSlot, spec: &ProbeSpec) -> (u64, u16) {
    if spec.flags & spec_flags::DEREF_AT_RETURN == 0 {
        return (0, event_flags::HAS_RET);
    }
    let ptr = match call.args.get(spec.deref_arg as usize) {
        Some(a) => *a as *const u64,
        None => 0 as *const u64,
    };
    match unsafe { bpf_probe_read_user(ptr) } {
        Ok(v) => (v, event_flags::HAS_RET),
        Err(_) => (0, event_flags::HAS_RET | event_flags::DEREF_FAULT),
    }
}

/// The return probe of a `NESTED` probe put on one of the function's return instructions
/// (user space finds them; `placement::return_sites`): a plain uprobe, so no return address is
/// replaced by the kernel's trampoline, which a C++ exception cannot unwind through. The
/// stack pointer there is still the entry's.
#[uprobe]
pub fn call_return_site(ctx: ProbeContext) -> u32 {
    let _ = try_call_return_site(&ctx);
    0
}

#[inline(always)]
fn try_call_return_site(ctx: &ProbeContext) -> Option<()> {
    let (tgid, tid) = current_ids();
    let probe = (unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } & COOKIE_PROBE_MASK) as u32;
    let spec = PROBE_SPECS.get(probe)?;
    if spec.flags & spec_flags::NESTED == 0 {
        return None;
    }
    let key = ((tid as u64) << 32) | probe as u64;
    let sp = stack_pointer(ctx.as_ptr());
    finish_nested(
        ctx.as_ptr(),
        key,
        sp,
        return_value(ctx.as_ptr()),
        spec,
        tgid,
        tid,
    )
}

/// The return value register at a return instruction.
#[inline(always)]
fn return_value(ctx: *mut c_void) -> u64 {
    #[cfg(bpf_target_arch = "x86_64")]
    {
        let regs = unsafe { &*(ctx as *const aya_ebpf::bindings::pt_regs) };
        regs.rax
    }
    #[cfg(bpf_target_arch = "aarch64")]
    {
        let regs = unsafe { &*(ctx as *const aya_ebpf::bindings::user_pt_regs) };
        regs.regs[0]
    }
    #[cfg(not(any(bpf_target_arch = "x86_64", bpf_target_arch = "aarch64")))]
    {
        let _ = ctx;
        0
    }
}

/// Completes the `NESTED` call stored at (`key`, entry stack pointer `sp`).
#[inline(always)]
fn finish_nested(
    ctx: *mut c_void,
    key: u64,
    sp: u64,
    ret: u64,
    spec: &ProbeSpec,
    tgid: u32,
    tid: u32,
) -> Option<()> {
    let nested = NestedKey { call: key, sp };
    let ev = unsafe { &mut *PENDING_NESTED.get_ptr_mut(&nested)? };
    if ev.pid == tgid {
        finish_return(ctx, ret, ev, spec, tgid, tid, None);
    } else {
        bump(counter::ORPHAN_RETURN);
    }
    let _ = PENDING_NESTED.remove(&nested);
    Some(())
}

/// Completes a call at its return: return value, out-pointer, stack, emit. `pending_key`: the
/// PENDING entry to drop once emitted (the event lives in it).
#[inline(always)]
fn finish_return(
    ctx: *mut c_void,
    ret: u64,
    ev: &mut RawEvent,
    spec: &ProbeSpec,
    tgid: u32,
    tid: u32,
    pending_key: Option<u64>,
) -> Option<()> {
    ev.ret = ret;
    ev.ret_ts_ns = unsafe { bpf_ktime_get_ns() };
    ev.flags |= event_flags::HAS_RET;
    if spec.flags & spec_flags::DEREF_AT_RETURN != 0 {
        let ptr = match ev.args.get(spec.deref_arg as usize) {
            Some(a) => *a as *const u64,
            None => 0 as *const u64,
        };
        match unsafe { bpf_probe_read_user(ptr) } {
            Ok(v) => ev.deref = v,
            Err(_) => ev.flags |= event_flags::DEREF_FAULT,
        }
    }
    if spec.flags & spec_flags::READ_CHAIN != 0 && ev.cpu != 0 {
        let hi = ev.cpu;
        let obj = ev.args.get(spec.deref_arg as usize).copied().unwrap_or(0);
        let member = obj.wrapping_add(read_chain::member(hi)) as *const u64;
        let at =
            |p: u64, off: u64| unsafe { bpf_probe_read_user(p.wrapping_add(off) as *const u64) };
        let p = unsafe { bpf_probe_read_user(member) };
        match p.and_then(|p| at(p, read_chain::used(hi))) {
            Ok(v) => ev.deref = v,
            Err(_) => ev.flags |= event_flags::DEREF_FAULT,
        }
        if let Some((a, b)) = read_chain::sum(hi) {
            let sum = p.and_then(|p| Ok(at(p, a)?.wrapping_add(at(p, b)?)));
            ev.args[CHAIN_SUM_ARG] = sum.unwrap_or(u64::MAX);
        }
    }
    if sampling::wants_stack(ev.probe as u32, &ev.args, Some(&ev.data)) {
        emit_stack(ctx, tgid, tid, ev.ts_ns);
    }
    if spec.flags & spec_flags::BATCH != 0 {
        emit_batch(ev, spec);
    } else {
        emit(ev);
    }
    if let Some(key) = pending_key {
        let _ = PENDING.remove(&key);
    }
    Some(())
}
