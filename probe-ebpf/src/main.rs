//! memscope-bpf's BPF programs: small and generic on purpose.
//!
//! * `call_entry` / `call_return` serve every probed function. The attach cookie is the probe
//!   id; `PROBE_SPECS[id]` says what to capture (a string or struct argument, an out-pointer
//!   read at return). User space owns the table of which symbol gets which id.
//! * Four tracepoints keep the set of traced processes (`TRACED`) equal to the process tree
//!   being watched and tell user space about exec and opened files, so libraries loaded later
//!   get probes too.
//!
//! Every event is filtered on `TRACED` first, so other processes calling the same library pay
//! only the uprobe trap and one hash lookup.
#![no_std]
#![no_main]

use core::ffi::c_void;

use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel_str_bytes,
        bpf_probe_read_user, bpf_probe_read_user_str_bytes,
        generated::{bpf_get_attach_cookie, bpf_get_smp_processor_id},
    },
    macros::{map, tracepoint, uprobe, uretprobe},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::{ProbeContext, RetProbeContext, TracePointContext},
};
use probe_common::{
    CLONE_THREAD, DATA_LEN, MAX_ARGS, MAX_PROBES, ProbeSpec, RawEvent, TracepointOffsets, counter,
    event_flags, kind, spec_flags,
};

/// Events to user space. User space may resize it before load (`--buffer-size`).
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(16 << 20, 0);

/// tgid -> parent tgid (0 for a root given by user space). Only these processes are traced.
#[map]
static TRACED: HashMap<u32, u32> = HashMap::with_max_entries(32768, 0);

/// Calls between entry and return, keyed by (tid << 32 | probe id).
#[map]
static PENDING: HashMap<u64, RawEvent> = HashMap::with_max_entries(16384, 0);

#[map]
static PROBE_SPECS: Array<ProbeSpec> = Array::with_max_entries(MAX_PROBES, 0);

/// A RawEvent is too large for the 512-byte BPF stack; build it here.
#[map]
static SCRATCH: PerCpuArray<RawEvent> = PerCpuArray::with_max_entries(1, 0);

#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

/// Filled in by user space from the tracefs format files before load.
#[unsafe(no_mangle)]
static TP_OFFSETS: TracepointOffsets = TracepointOffsets {
    newtask_pid: 8,
    newtask_clone_flags: 32,
    exec_filename_loc: 8,
    exit_group_dead: 32,
    openat_dfd: 16,
    openat_filename: 24,
};

#[inline(always)]
fn offsets() -> TracepointOffsets {
    // Volatile so the compiler does not fold the defaults in: user space rewrites them.
    unsafe { core::ptr::read_volatile(&TP_OFFSETS) }
}

#[inline(always)]
fn bump(index: u32) {
    if let Some(c) = COUNTERS.get_ptr_mut(index) {
        unsafe { *c += 1 };
    }
}

#[inline(always)]
fn current_ids() -> (u32, u32) {
    let pid_tgid = bpf_get_current_pid_tgid();
    ((pid_tgid >> 32) as u32, pid_tgid as u32)
}

#[inline(always)]
fn is_traced(tgid: u32) -> bool {
    unsafe { TRACED.get(&tgid).is_some() }
}

/// `bpf_ringbuf_output` flags and `bpf_ringbuf_query` selector (uapi/linux/bpf.h).
const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
const BPF_RB_AVAIL_DATA: u64 = 0;
/// Call events wake user space only once this much is waiting (about 700 records); below it
/// the session's 100 ms tick drains them. A wakeup per event (irq_work + a context switch
/// for every call) was most of our cost above the empty-program floor.
const WAKE_AFTER_BYTES: u64 = 256 << 10;

#[inline(always)]
fn emit(ev: &RawEvent) {
    // Process-tree and library events wake user space at once (a library being opened must
    // get its probes before the target calls into it); calls are batched.
    let flags = if ev.kind != kind::CALL || EVENTS.query(BPF_RB_AVAIL_DATA) >= WAKE_AFTER_BYTES {
        if ev.kind == kind::CALL {
            BPF_RB_FORCE_WAKEUP
        } else {
            0
        }
    } else {
        BPF_RB_NO_WAKEUP
    };
    if EVENTS.output::<RawEvent>(ev, flags).is_err() {
        bump(counter::RINGBUF_FULL);
    }
}

/// Takes the per-CPU scratch event and fills the header.
#[inline(always)]
fn scratch(kind_: u16, tgid: u32, tid: u32) -> Option<&'static mut RawEvent> {
    let ev = unsafe { &mut *SCRATCH.get_ptr_mut(0)? };
    ev.kind = kind_;
    ev.flags = 0;
    ev.probe = 0;
    ev.data_len = 0;
    ev.pid = tgid;
    ev.tid = tid;
    ev.cpu = unsafe { bpf_get_smp_processor_id() };
    ev.ts_ns = unsafe { bpf_ktime_get_ns() };
    ev.ret_ts_ns = 0;
    ev.args = [0; MAX_ARGS];
    ev.ret = 0;
    ev.deref = 0;
    Some(ev)
}

#[uprobe]
pub fn call_entry(ctx: ProbeContext) -> u32 {
    let _ = try_call_entry(&ctx);
    0
}

#[inline(always)]
fn try_call_entry(ctx: &ProbeContext) -> Option<()> {
    let (tgid, tid) = current_ids();
    if !is_traced(tgid) {
        return None;
    }
    let probe = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } as u32;
    let spec = *PROBE_SPECS.get(probe)?;
    let ev = scratch(kind::CALL, tgid, tid)?;
    ev.probe = probe as u16;
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
        }
    }

    if spec.flags & spec_flags::WANTS_RETURN != 0 {
        let key = ((tid as u64) << 32) | probe as u64;
        if PENDING.insert(&key, ev, 0).is_err() {
            bump(counter::PENDING_FULL);
        }
    } else {
        emit(ev);
    }
    Some(())
}

#[inline(always)]
fn copy_user_str(ev: &mut RawEvent, src: *const u8) {
    match unsafe { bpf_probe_read_user_str_bytes(src, &mut ev.data) } {
        Ok(s) => {
            let n = s.len();
            ev.data_len = n as u16;
            if n >= DATA_LEN - 1 {
                ev.flags |= event_flags::DATA_TRUNCATED;
            }
        }
        Err(_) => ev.flags |= event_flags::DATA_FAULT,
    }
}

#[inline(always)]
fn copy_user_bytes(ev: &mut RawEvent, src: *const u8, len: u32) {
    let n = if len as usize > DATA_LEN {
        DATA_LEN as u32
    } else {
        len
    };
    if n == 0 {
        return;
    }
    let rc = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(
            ev.data.as_mut_ptr() as *mut c_void,
            n,
            src as *const c_void,
        )
    };
    if rc == 0 {
        ev.data_len = n as u16;
    } else {
        ev.flags |= event_flags::DATA_FAULT;
    }
}

#[uretprobe]
pub fn call_return(ctx: RetProbeContext) -> u32 {
    let _ = try_call_return(&ctx);
    0
}

#[inline(always)]
fn try_call_return(ctx: &RetProbeContext) -> Option<()> {
    let (tgid, tid) = current_ids();
    if !is_traced(tgid) {
        return None;
    }
    let probe = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } as u32;
    let key = ((tid as u64) << 32) | probe as u64;
    let ev = match PENDING.get_ptr_mut(&key) {
        Some(p) => unsafe { &mut *p },
        None => {
            bump(counter::ORPHAN_RETURN);
            return None;
        }
    };
    let spec = *PROBE_SPECS.get(probe)?;
    ev.ret = ctx.ret::<u64>();
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
    emit(ev);
    let _ = PENDING.remove(&key);
    Some(())
}

/// Benchmark floor: the same attach points with programs that do nothing, so `cargo xtask
/// bench` can separate the kernel's uprobe cost from ours.
#[uprobe]
pub fn noop_entry(_ctx: ProbeContext) -> u32 {
    0
}

#[uretprobe]
pub fn noop_return(_ctx: RetProbeContext) -> u32 {
    0
}

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
    let ev = scratch(kind::FORK, tgid, tid)?;
    ev.args[0] = child as u64;
    ev.args[1] = clone_flags;
    emit(ev);
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
    emit(ev);
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
    let group_dead: u8 = unsafe { ctx.read_at(offsets().exit_group_dead as usize) }.ok()?;
    if group_dead == 0 {
        return None;
    }
    let _ = TRACED.remove(&tgid);
    let ev = scratch(kind::EXIT, tgid, tid)?;
    emit(ev);
    Some(())
}

/// Library discovery: user space checks each opened path for probed symbols.
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
    emit(ev);
    Some(())
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
