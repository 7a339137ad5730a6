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
//! only the uprobe trap, a task-storage miss and one hash lookup. A thread that already has a
//! pending-call stack remembers that its process is traced until user space removes any
//! process from `TRACED` (`TRACED_GEN`), so traced HAL calls skip the lookup.
#![no_std]
#![no_main]
#![allow(internal_features)]
#![feature(core_intrinsics)]

mod python;

use core::ffi::c_void;

use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel_str_bytes,
        bpf_probe_read_user, bpf_probe_read_user_str_bytes,
        generated::{
            bpf_get_attach_cookie, bpf_get_current_task_btf, bpf_get_smp_processor_id,
            bpf_get_stack, bpf_loop, bpf_send_signal_thread, bpf_task_storage_get,
        },
    },
    macros::{btf_map, map, raw_tracepoint, tracepoint, uprobe, uretprobe},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
    programs::{ProbeContext, RawTracePointContext, RetProbeContext, TracePointContext},
};
use probe_common::{
    BATCH_ARRAY_WORDS, BATCH_HEADER, BATCH_KIND, BATCH_WORDS, CLONE_THREAD, COOKIE_HI_SHIFT,
    COOKIE_PROBE_MASK, DATA_LEN, FNV_OFFSET, FNV_PRIME, MAX_ARGS, MAX_CHUNKS, MAX_PROBES,
    NO_ARRAY2, ProbeSpec, RAW_HEADER, RawEvent, SIGSTOP, STACK_COPY, STACK_COPY_SHED, STACK_HEADER,
    STACK_KIND, StackEvent, TracepointOffsets, counter, event_flags, kind, packed, spec_flags,
};

/// Events to user space. User space may resize it before load (`--buffer-size`).
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(16 << 20, 0);

/// tgid -> parent tgid (0 for a root given by user space). Only these processes are traced.
#[map]
static TRACED: HashMap<u32, u32> = HashMap::with_max_entries(32768, 0);

/// Bumped by user space whenever it removes a process from `TRACED`: a thread's pending stack
/// remembers the generation in which its process was found traced, which spares the hot path
/// the `TRACED` lookup until the next removal.
#[map]
static TRACED_GEN: Array<u32> = Array::with_max_entries(1, 0);

/// Calls between entry and return of probes that copy data, keyed by (tid << 32 | probe id).
#[map]
static PENDING: HashMap<u64, RawEvent> = HashMap::with_max_entries(16384, 0);

/// Calls of one thread in flight, innermost last (returns come back in LIFO order per thread).
const PENDING_DEPTH: usize = 8;

/// A call between entry and return for probes that capture no data (the HAL calls).
#[repr(C)]
#[derive(Clone, Copy)]
struct PendingSlot {
    ts_ns: u64,
    /// User stack pointer at entry: tells the call's own return from that of a deeper call
    /// whose return never came (longjmp), and a stale slot from a live ancestor.
    sp: u64,
    args: [u64; MAX_ARGS],
    /// The attach cookie's low 32 bits: the probe id in the low 16 (`COOKIE_PROBE_MASK`).
    probe: u32,
    /// The thread group at entry.
    pid: u32,
    tid: u32,
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

/// `BPF_MAP_TYPE_TASK_STORAGE` in the BTF map form (aya-ebpf 0.2.1 has no wrapper for it):
/// the kernel requires BTF for the key and value, `BPF_F_NO_PREALLOC` and `max_entries` 0.
#[repr(C)]
struct TaskStorage<T> {
    r#type: *const [i32; aya_ebpf::bindings::bpf_map_type::BPF_MAP_TYPE_TASK_STORAGE as usize],
    key: *const i32,
    value: *const T,
    max_entries: *const [i32; 0],
    map_flags: *const [i32; aya_ebpf::bindings::BPF_F_NO_PREALLOC as usize],
}

// SAFETY: placeholder pointers patched by the loader, never dereferenced.
unsafe impl<T> Sync for TaskStorage<T> {}

impl<T> TaskStorage<T> {
    const fn new() -> Self {
        TaskStorage {
            r#type: core::ptr::null(),
            key: core::ptr::null(),
            value: core::ptr::null(),
            max_entries: core::ptr::null(),
            map_flags: core::ptr::null(),
        }
    }

    /// The current task's value, created zeroed when `create` and missing.
    #[inline(always)]
    fn current(&self, create: bool) -> Option<&mut T> {
        let flags = if create {
            aya_ebpf::bindings::BPF_LOCAL_STORAGE_GET_F_CREATE as u64
        } else {
            0
        };
        let p = unsafe {
            bpf_task_storage_get(
                self as *const Self as *mut c_void,
                bpf_get_current_task_btf(),
                core::ptr::null_mut(),
                flags,
            )
        } as *mut T;
        if p.is_null() {
            None
        } else {
            Some(unsafe { &mut *p })
        }
    }
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

#[map]
static PROBE_SPECS: Array<ProbeSpec> = Array::with_max_entries(MAX_PROBES, 0);

/// A RawEvent is too large for the 512-byte BPF stack; build it here (slot 0: the event,
/// slot 1: chunks of a batch).
#[map]
static SCRATCH: PerCpuArray<RawEvent> = PerCpuArray::with_max_entries(2, 0);

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
    openat_ret: 16,
    stop_on_discovery: 0,
    capture_stacks: 0,
    python_stacks: 0,
};

#[map]
static STACK_SCRATCH: PerCpuArray<StackEvent> = PerCpuArray::with_max_entries(1, 0);

/// Opens of shared objects between syscall entry and exit, keyed by thread id.
#[map]
static OPENS: HashMap<u32, RawEvent> = HashMap::with_max_entries(4096, 0);

/// Hashes (`probe_common::path_hash`) of shared-object paths user space has already planned:
/// opening one of these never stops the process.
#[map]
static KNOWN_PATHS: HashMap<u64, u8> = HashMap::with_max_entries(65536, 0);

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

/// Emits a STACK sample for the current call (`--call-stack=c`): registers, the kernel's
/// frame-pointer walk, and as much of the user stack above sp as can be read, up to 8 KiB.
#[inline(always)]
fn emit_stack(ctx: *mut c_void, tgid: u32, tid: u32, ts_ns: u64) {
    python::emit_python_stack(tgid, tid);
    if offsets().capture_stacks == 0 {
        return;
    }
    let Some(st) = STACK_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    let st = unsafe { &mut *st };
    st.kind = STACK_KIND;
    st.flags = 0;
    st.pid = tgid;
    st.tid = tid;
    st.ts_ns = ts_ns;
    #[cfg(bpf_target_arch = "x86_64")]
    {
        let regs = unsafe { &*(ctx as *const aya_ebpf::bindings::pt_regs) };
        st.ip = regs.rip;
        st.sp = regs.rsp;
        st.fp = regs.rbp;
        st.lr = 0;
    }
    #[cfg(bpf_target_arch = "aarch64")]
    {
        // At a function's entry its return address is still in x30, not on the stack.
        let regs = unsafe { &*(ctx as *const aya_ebpf::bindings::user_pt_regs) };
        st.ip = regs.pc;
        st.sp = regs.sp;
        st.fp = regs.regs[29];
        st.lr = regs.regs[30];
    }
    let got = unsafe {
        bpf_get_stack(
            ctx,
            st.frames.as_mut_ptr() as *mut c_void,
            core::mem::size_of_val(&st.frames) as u32,
            aya_ebpf::bindings::BPF_F_USER_STACK as u64,
        )
    };
    st.nframes = if got > 0 { (got / 8) as u16 } else { 0 };
    if offsets().capture_stacks == 1 {
        st.stack_len = 0;
        output_stack(st, 0);
        return;
    }
    // A tracer that cannot drain 8 KiB copies as fast as a tight loop makes them would lose
    // whole events once the ring is full: past half full, the copy is left out (the frame-
    // pointer walk stays) so the calls themselves keep fitting.
    if EVENTS.query(BPF_RB_AVAIL_DATA) > EVENTS.query(BPF_RB_RING_SIZE) / 2 {
        st.flags = STACK_COPY_SHED;
        st.stack_len = 0;
        bump(counter::STACKS_SHED);
        output_stack(st, 0);
        return;
    }
    // A read that crosses the top of the stack fails whole: try smaller copies, 512 bytes
    // less each time, so a sample taken near the top still gets all but < 512 bytes of what
    // is there (halving lost up to half: a deep recursion's outer frames, now and then). Each
    // size is a constant on its path, which is what the verifier needs for the output length.
    let sp = st.sp;
    for size in [
        STACK_COPY,
        STACK_COPY - 512,
        STACK_COPY - 1024,
        STACK_COPY - 1536,
        STACK_COPY - 2048,
        STACK_COPY - 2560,
        STACK_COPY - 3072,
        STACK_COPY - 3584,
        STACK_COPY - 4096,
        STACK_COPY - 4608,
        STACK_COPY - 5120,
        STACK_COPY - 5632,
        STACK_COPY - 6144,
        STACK_COPY - 6656,
        STACK_COPY - 7168,
        STACK_COPY - 7680,
    ] {
        if copy_stack(st, sp, size) {
            st.stack_len = size as u32;
            output_stack(st, size);
            return;
        }
    }
    st.stack_len = 0;
    output_stack(st, 0);
}

#[inline(always)]
fn copy_stack(st: &mut StackEvent, sp: u64, size: usize) -> bool {
    unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(
            st.stack.as_mut_ptr() as *mut c_void,
            size as u32,
            sp as *const c_void,
        ) == 0
    }
}

#[inline(always)]
fn output_stack(st: &StackEvent, size: usize) {
    let bytes = unsafe {
        core::slice::from_raw_parts(st as *const StackEvent as *const u8, STACK_HEADER + size)
    };
    // The call event that follows decides whether to wake user space.
    if EVENTS.output::<[u8]>(bytes, BPF_RB_NO_WAKEUP).is_err() {
        bump(counter::RINGBUF_FULL);
    }
}
/// `bpf_ringbuf_output` flags and `bpf_ringbuf_query` selector (uapi/linux/bpf.h).
const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
const BPF_RB_AVAIL_DATA: u64 = 0;
const BPF_RB_RING_SIZE: u64 = 1;
/// Call events wake user space only once this much is waiting (about 700 records); below it
/// the session's 100 ms tick drains them. A wakeup per event (irq_work + a context switch
/// for every call) was most of our cost above the empty-program floor.
const WAKE_AFTER_BYTES: u64 = 256 << 10;

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

/// Wakeup flags for a batched record (a call or a batch chunk not stopping the process).
#[inline(always)]
fn batched_wake_flags() -> u64 {
    if EVENTS.query(BPF_RB_AVAIL_DATA) >= WAKE_AFTER_BYTES {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    }
}

#[inline(always)]
fn emit(ev: &RawEvent) {
    // Process-tree and library events, and anything that stopped the process, wake user
    // space at once (a library being opened must get its probes before the target calls
    // into it; a stopped process waits for us); calls and batch chunks are batched.
    let batched =
        (ev.kind == kind::CALL || ev.kind == kind::CHUNK) && ev.flags & event_flags::STOPPED == 0;
    // (Forced: with batched records still unread, the default would not wake it.)
    let flags = if batched {
        batched_wake_flags()
    } else {
        BPF_RB_FORCE_WAKEUP
    };
    // Only the header and the valid data go out (104 bytes for a HAL call instead of 360).
    // data_len is below DATA_LEN for every event (strings keep their NUL in the buffer, structs
    // and chunks stay under it), so the mask never cuts data.
    let len = RAW_HEADER + (ev.data_len as usize & (DATA_LEN - 1));
    let bytes = unsafe { core::slice::from_raw_parts(ev as *const RawEvent as *const u8, len) };
    if EVENTS.output::<[u8]>(bytes, flags).is_err() {
        bump(counter::RINGBUF_FULL);
    }
}

/// Emits `ev`, stopping the calling thread first when `stop`. The record is reserved before
/// the signal: a process stopped by an event that never reached user space would never be
/// resumed (seen with `--call-stack=c` on a tight loop, whose stack copies fill the ring).
/// Without room the event is lost (counted) and the process runs on.
#[inline(always)]
fn emit_stopping(ev: &mut RawEvent, stop: bool) {
    if !stop {
        emit(ev);
        return;
    }
    let Some(mut entry) = EVENTS.reserve::<RawEvent>(0) else {
        bump(counter::RINGBUF_FULL);
        return;
    };
    if stop_current_thread() {
        ev.flags |= event_flags::STOPPED;
    }
    entry.write(*ev);
    entry.submit(BPF_RB_FORCE_WAKEUP);
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
    let spec = *PROBE_SPECS.get(probe)?;
    const DATA: u32 = spec_flags::DATA_IS_STRING | spec_flags::DATA_IS_BYTES;
    if spec.flags & spec_flags::WANTS_RETURN != 0 && spec.flags & (DATA | spec_flags::NESTED) == 0 {
        // The slot keeps the cookie's low 32 bits: the id and what user space put above it.
        return push_call(ctx, st, generation, cookie as u32, &spec, tgid, tid);
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
                copy_indirect(ev, &spec);
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
        emit_stack(ctx.as_ptr(), tgid, tid, ev.ts_ns);
        emit_batch(ev, &spec);
    } else {
        if spec.flags & spec_flags::STOP_AT_ENTRY != 0 {
            emit_stopping(ev, offsets().stop_on_discovery != 0);
        } else {
            emit_stack(ctx.as_ptr(), tgid, tid, ev.ts_ns);
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

/// Reads a u64 out of the copied data at a user-space-chosen offset.
#[inline(always)]
fn data_u64(ev: &RawEvent, off: u32) -> u64 {
    let off = off as usize;
    if off > DATA_LEN - 8 {
        return 0;
    }
    match ev.data.get(off..off + 8) {
        Some(b) => u64::from_ne_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
        None => 0,
    }
}

/// Appends `indirect_len` bytes read through the pointer at `data[indirect_off]`.
#[inline(always)]
fn copy_indirect(ev: &mut RawEvent, spec: &ProbeSpec) {
    let src = data_u64(ev, spec.indirect_off);
    // The verifier bounds the destination offset and the length separately, so each gets
    // half of the buffer: the struct copied first and the one it points to.
    // Masks, not comparisons: LLVM would merge a comparison into a form the verifier cannot
    // use. User space keeps both values below DATA_LEN / 2 (checked in its tests).
    let at = ev.data_len as usize & (DATA_LEN / 2 - 1);
    let len = spec.indirect_len as usize & (DATA_LEN / 2 - 1);
    if src == 0 || len == 0 {
        return;
    }
    if spec.flags & spec_flags::INDIRECT_STR != 0 {
        // Returns the bytes copied including the NUL; a string cut at `len` ends with a NUL too.
        let rc = unsafe {
            aya_ebpf::helpers::generated::bpf_probe_read_user_str(
                ev.data.as_mut_ptr().add(at) as *mut c_void,
                len as u32,
                src as *const c_void,
            )
        };
        if rc > 0 {
            ev.data_len = (at + (rc as usize & (DATA_LEN / 2 - 1))) as u16;
            if rc as usize >= len {
                ev.flags |= event_flags::DATA_TRUNCATED;
            }
        } else {
            ev.flags |= event_flags::DATA_FAULT;
        }
        return;
    }
    let rc = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(
            ev.data.as_mut_ptr().add(at) as *mut c_void,
            len as u32,
            src as *const c_void,
        )
    };
    if rc == 0 {
        ev.data_len = (at + len) as u16;
    } else {
        ev.flags |= event_flags::DATA_FAULT;
    }
}

/// State of one batch walk, on the stack of the calling program (bpf_loop's context).
#[repr(C)]
struct BatchWalk {
    count: u64,
    array: u64,
    array2: u64,
    /// Elements emitted so far (written by the loop body, read after the loop).
    first: u64,
    per: u64,
    elem: u64,
    elem2: u64,
    base2: u64,
}

/// Emits the array described by the struct copied into `ev.data` as CHUNK events. The walk
/// runs under `bpf_loop`, so the verifier checks one chunk, not every iteration.
#[inline(always)]
fn emit_batch(ev: &RawEvent, spec: &ProbeSpec) {
    let mut walk = BatchWalk {
        count: data_u64(ev, spec.count_off),
        array: data_u64(ev, spec.array_off),
        array2: if spec.array2_off == NO_ARRAY2 {
            0
        } else {
            data_u64(ev, spec.array2_off)
        },
        first: 0,
        per: spec.per_chunk as u64,
        elem: spec.elem_size as u64,
        elem2: spec.elem2_size as u64,
        base2: spec.array2_base as u64,
    };
    if walk.array == 0 || walk.per == 0 || walk.elem == 0 || walk.count == 0 {
        return;
    }
    let Some(chunk) = SCRATCH.get_ptr_mut(1) else {
        return;
    };
    let chunk = unsafe { &mut *chunk };
    chunk.kind = kind::CHUNK;
    chunk.probe = ev.probe;
    chunk.pid = ev.pid;
    chunk.tid = ev.tid;
    chunk.cpu = ev.cpu;
    chunk.ts_ns = ev.ts_ns;
    chunk.ret_ts_ns = ev.ret_ts_ns;
    chunk.ret = ev.ret;
    chunk.deref = 0;
    chunk.args[0] = ev.args[0];
    chunk.args[1] = ev.args[1];
    chunk.args[2] = walk.count;
    unsafe {
        bpf_loop(
            MAX_CHUNKS,
            emit_chunk as *mut c_void,
            &mut walk as *mut BatchWalk as *mut c_void,
            0,
        )
    };
    if walk.first < walk.count
        && let Some(c) = COUNTERS.get_ptr_mut(counter::BATCH_DROPPED)
    {
        unsafe { *c += walk.count - walk.first };
    }
}

/// One iteration of `emit_batch`: reads up to `per` elements (and their parallel-array
/// entries) into the chunk scratch event and emits it. Returns 1 to stop the loop.
#[inline(never)]
extern "C" fn emit_chunk(index: u32, ctx: *mut c_void) -> i64 {
    let walk = unsafe { &mut *(ctx as *mut BatchWalk) };
    // The position comes from the loop index, not from state carried between iterations:
    // the verifier then proves one iteration instead of walking them all.
    let first = index as u64 * walk.per;
    if first >= walk.count {
        return 1;
    }
    let Some(chunk) = SCRATCH.get_ptr_mut(1) else {
        return 1;
    };
    let chunk = unsafe { &mut *chunk };
    let n = if walk.count - first < walk.per {
        walk.count - first
    } else {
        walk.per
    };
    chunk.flags = 0;
    chunk.args[3] = first;
    chunk.args[4] = n;
    // Masks, not comparisons (see copy_indirect): in bounds whatever user space configured.
    let len = (n * walk.elem) as usize & (DATA_LEN - 1);
    if len == 0 {
        return 1;
    }
    let rc = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(
            chunk.data.as_mut_ptr() as *mut c_void,
            len as u32,
            (walk.array + first * walk.elem) as *const c_void,
        )
    };
    if rc != 0 {
        chunk.flags |= event_flags::DATA_FAULT;
    }
    chunk.data_len = len as u16;
    if walk.array2 != 0 {
        // A multiple of DATA_LEN / 4 plus fewer than DATA_LEN / 4 bytes: in bounds.
        let base2 = walk.base2 as usize & (DATA_LEN - DATA_LEN / 4);
        let len2 = (n * walk.elem2) as usize & (DATA_LEN / 4 - 1);
        if len2 > 0 {
            let rc = unsafe {
                aya_ebpf::helpers::generated::bpf_probe_read_user(
                    chunk.data.as_mut_ptr().add(base2) as *mut c_void,
                    len2 as u32,
                    (walk.array2 + first * walk.elem2) as *const c_void,
                )
            };
            if rc != 0 {
                chunk.flags |= event_flags::DEREF_FAULT;
            }
            chunk.data_len = (base2 + len2) as u16;
        }
    }
    emit(chunk);
    walk.first = first + n;
    0
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
    let spec = *PROBE_SPECS.get(probe)?;
    const DATA: u32 = spec_flags::DATA_IS_STRING | spec_flags::DATA_IS_BYTES;
    if spec.flags & spec_flags::NESTED != 0 {
        let sp = stack_pointer(ctx.as_ptr()).wrapping_sub(RETURN_SP_DELTA);
        return finish_nested(ctx.as_ptr(), key, sp, ctx.ret::<u64>(), &spec, tgid, tid);
    }
    if spec.flags & DATA == 0 {
        // Attached to `hal_return` by user space; kept here for completeness.
        return finish_call(ctx, &pop_call(ctx)?);
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
        &spec,
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
        let _ = finish_call(&ctx, &call);
    }
    0
}

/// Takes this call's entry off the thread's pending stack (None: its entry was not stored).
#[inline(always)]
fn pop_call(ctx: &RetProbeContext) -> Option<PendingSlot> {
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
    let call = st.slots[(depth - 1) & (PENDING_DEPTH - 1)];
    if call.sp > sp {
        // A caller's entry, not ours: this call's entry was not stored (PENDING_FULL).
        st.depth = depth as u32;
        return None;
    }
    st.depth = depth as u32 - 1;
    Some(call)
}

/// Sends a call taken off the pending stack: into this CPU's batch, or (with stacks, or
/// while batching is off) straight into the ring buffer after its stack sample.
#[inline(always)]
fn finish_call(ctx: &RetProbeContext, call: &PendingSlot) -> Option<()> {
    let spec = *PROBE_SPECS.get(call.probe & COOKIE_PROBE_MASK as u32)?;
    // A call with a stack sample goes straight out after it (user space pairs them by order).
    if offsets().capture_stacks == 0
        && offsets().python_stacks == 0
        && BATCHING.get(0).is_some_and(|b| *b != 0)
    {
        return batch_call(ctx, call, &spec);
    }
    let (ts_ns, ret_ts_ns) = call_times(call, &spec);
    let (deref, flags) = read_deref(call, &spec);
    // The stack sample goes first: records reach user space in reservation order.
    emit_stack(ctx.as_ptr(), call.pid, call.tid, ts_ns);
    // Written straight into the ring buffer (no per-CPU scratch event, no copy).
    let wake = batched_wake_flags();
    let Some(mut entry) = EVENTS.reserve::<CallHeader>(0) else {
        bump(counter::RINGBUF_FULL);
        return None;
    };
    entry.write(call_header(ctx, call, ts_ns, ret_ts_ns, deref, flags));
    entry.submit(wake);
    Some(())
}

/// The entry and return timestamps of a call from the pending stack: one clock read when the
/// spec dates the call at one end only.
#[inline(always)]
fn call_times(call: &PendingSlot, spec: &ProbeSpec) -> (u64, u64) {
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
fn read_deref(call: &PendingSlot, spec: &ProbeSpec) -> (u64, u16) {
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

#[inline(always)]
fn call_header(
    ctx: &RetProbeContext,
    call: &PendingSlot,
    ts_ns: u64,
    ret_ts_ns: u64,
    deref: u64,
    flags: u16,
) -> CallHeader {
    CallHeader {
        kind: kind::CALL,
        flags,
        probe: call.probe as u16,
        data_len: 0,
        pid: call.pid,
        tid: call.tid,
        cpu: call.probe >> COOKIE_HI_SHIFT,
        _pad: 0,
        ts_ns,
        ret_ts_ns,
        args: call.args,
        ret: ctx.ret::<u64>(),
        deref,
    }
}

/// Finished calls without data of this CPU, waiting to go to user space together: one ring
/// buffer record per ~4 KiB of calls instead of one each (a reservation and a commit cost
/// ~70 ns a call here), and each call packed into 32-96 bytes (`probe_common::packed`).
/// Sent when full, and when user space runs `flush_calls` on this CPU.
#[repr(C)]
struct CallBatch {
    kind: u16,
    /// Calls in the batch (for the loss counter when the ring buffer is full).
    calls: u16,
    /// Words of `words` in use.
    count: u32,
    words: [u64; BATCH_ARRAY_WORDS],
    /// Set while a program on this CPU changes the batch. `flush_calls` runs in an interrupt
    /// (an IPI from `BPF_PROG_TEST_RUN`) that may land in the middle of such a program: it
    /// leaves a busy batch alone and user space asks again.
    busy: u32,
}

const _: () = assert!(core::mem::offset_of!(CallBatch, words) == BATCH_HEADER);
const _: () = assert!(BATCH_HEADER + BATCH_WORDS * 8 < 4096);
const _: () = assert!(BATCH_ARRAY_WORDS >= 512 + packed::MAX_WORDS);
// The event flags a packed call keeps fit in its 8 bits.
const _: () =
    assert!((event_flags::HAS_RET | event_flags::DEREF_FAULT) as u64 & !packed::FLAGS_MASK == 0);

#[map]
static CALL_BATCH: PerCpuArray<CallBatch> = PerCpuArray::with_max_entries(1, 0);

/// Non-zero once user space has checked that it can run `flush_calls` on every CPU: until
/// then (and on a kernel where it cannot) finished calls go to the ring buffer one by one.
#[map]
static BATCHING: Array<u32> = Array::with_max_entries(1, 0);

/// Stores one word of a packed call (volatile: see `batch_call`).
#[inline(always)]
fn put_word(b: &mut CallBatch, at: usize, v: u64) {
    if let Some(w) = b.words.get_mut(at) {
        unsafe { core::ptr::write_volatile(w, v) };
    }
}

/// Appends a finished call, packed, to this CPU's batch. Volatile accesses keep the stores in
/// program order (`busy` set before anything else, including the clock read that dates the
/// call, and cleared last), which is all the interrupting `flush_calls` needs on the same CPU.
#[inline(always)]
fn batch_call(ctx: &RetProbeContext, call: &PendingSlot, spec: &ProbeSpec) -> Option<()> {
    let b = unsafe { &mut *CALL_BATCH.get_ptr_mut(0)? };
    unsafe { core::ptr::write_volatile(&mut b.busy, 1) };
    let (ts_ns, ret_ts_ns) = call_times(call, spec);
    let (deref, flags) = read_deref(call, spec);
    let ret: u64 = ctx.ret::<u64>();
    let mut n = unsafe { core::ptr::read_volatile(&b.count) } as usize;
    if n > BATCH_WORDS - packed::MAX_WORDS {
        // Not reached (a batch that cannot take another call is sent at once), but it keeps
        // the stores below inside the array for the verifier.
        send_batch(b, n);
        n = 0;
        unsafe { core::ptr::write_volatile(&mut b.calls, 0) };
    }
    // The mask changes nothing (n < 512 here); it gives the verifier the bound.
    let start = n & 511;
    let mut desc = packed::descriptor(call.probe, flags, spec.kept_args);
    let mut at = start + 3;
    if ts_ns != ret_ts_ns {
        put_word(b, at, ret_ts_ns);
        at += 1;
        desc |= packed::RET_TS;
    }
    if spec.flags & spec_flags::DEREF_AT_RETURN != 0 {
        put_word(b, at, deref);
        at += 1;
        desc |= packed::DEREF;
    }
    if ret as i64 == ret as i32 as i64 {
        desc |= (ret as u32 as u64) << packed::RET_SHIFT;
    } else {
        put_word(b, at, ret);
        at += 1;
        desc |= packed::RET_WORD;
    }
    for i in 0..MAX_ARGS {
        if spec.kept_args & (1 << i) != 0 {
            put_word(b, at, call.args[i]);
            at += 1;
        }
    }
    put_word(b, start, call.pid as u64 | (call.tid as u64) << 32);
    put_word(b, start + 1, desc);
    put_word(b, start + 2, ts_ns);
    n = at;
    unsafe { core::ptr::write_volatile(&mut b.calls, b.calls.wrapping_add(1)) };
    if n > BATCH_WORDS - packed::MAX_WORDS {
        send_batch(b, n);
        n = 0;
    }
    unsafe {
        if n == 0 {
            core::ptr::write_volatile(&mut b.calls, 0);
        }
        core::ptr::write_volatile(&mut b.count, n as u32);
        core::ptr::write_volatile(&mut b.busy, 0);
    }
    Some(())
}

/// Sends the first `n` words of a batch as one record (the caller then empties it).
#[inline(always)]
fn send_batch(b: &mut CallBatch, n: usize) {
    let n = if n > BATCH_WORDS { BATCH_WORDS } else { n };
    b.kind = BATCH_KIND;
    unsafe { core::ptr::write_volatile(&mut b.count, n as u32) };
    let len = BATCH_HEADER + n * 8;
    let bytes = unsafe { core::slice::from_raw_parts(b as *const CallBatch as *const u8, len) };
    if EVENTS.output::<[u8]>(bytes, batched_wake_flags()).is_err()
        && let Some(c) = COUNTERS.get_ptr_mut(counter::RINGBUF_FULL)
    {
        unsafe { *c += b.calls as u64 };
    }
}

/// Sends this CPU's batch. Never attached: user space runs it on each CPU in turn with
/// `BPF_PROG_TEST_RUN` (`BPF_F_TEST_RUN_ON_CPU`) before it releases events older than that
/// moment. Returns 1 when the batch was busy (user space asks again), else 0.
#[raw_tracepoint]
pub fn flush_calls(_ctx: RawTracePointContext) -> i32 {
    let Some(b) = CALL_BATCH.get_ptr_mut(0) else {
        return 0;
    };
    let b = unsafe { &mut *b };
    if unsafe { core::ptr::read_volatile(&b.busy) } != 0 {
        return 1;
    }
    let n = unsafe { core::ptr::read_volatile(&b.count) } as usize;
    if n > 0 {
        send_batch(b, n);
        unsafe {
            core::ptr::write_volatile(&mut b.calls, 0);
            core::ptr::write_volatile(&mut b.count, 0);
        }
    }
    0
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
    let spec = *PROBE_SPECS.get(probe)?;
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
        &spec,
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
    let spec = *spec;
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
    emit_stack(ctx, tgid, tid, ev.ts_ns);
    if spec.flags & spec_flags::BATCH != 0 {
        emit_batch(ev, &spec);
    } else {
        emit(ev);
    }
    if let Some(key) = pending_key {
        let _ = PENDING.remove(&key);
    }
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

#[uprobe]
pub fn noop_return_site(_ctx: ProbeContext) -> u32 {
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
    emit_stopping(ev, offsets().stop_on_discovery != 0);
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
    let ev = scratch(kind::EXIT, tgid, tid)?;
    emit(ev);
    Some(())
}

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
        let stop =
            offsets().stop_on_discovery != 0 && unsafe { KNOWN_PATHS.get(&ev.args[1]) }.is_none();
        emit_stopping(ev, stop);
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

#[inline(always)]
fn stop_current_thread() -> bool {
    unsafe { bpf_send_signal_thread(SIGSTOP) == 0 }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
