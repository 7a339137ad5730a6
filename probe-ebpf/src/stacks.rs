//! Native stack samples (`--call-stack=c`): registers, the kernel's frame-pointer walk and a
//! copy of the user stack, sent as a STACK record just before the call they belong to (and
//! the Python stack, `python`, before that).

use core::ffi::c_void;

use aya_ebpf::{
    helpers::generated::{bpf_get_stack, bpf_loop},
    macros::map,
    maps::Array,
};
use probe_common::{
    STACK_COPY, STACK_COPY_MAX, STACK_COPY_SHED, STACK_COPY_TAIL, STACK_HEADER, STACK_KIND,
    StackEvent, counter,
};

use crate::{
    emit::{BPF_RB_AVAIL_DATA, BPF_RB_NO_WAKEUP, BPF_RB_RING_SIZE},
    maps::{EVENTS, bump, offsets},
    python,
};

/// One sample per CPU, indexed by CPU (a per-CPU array's values stop at 32 KiB; user space
/// sizes this to the possible CPUs when stacks are on). Uprobe programs do not migrate.
#[map]
static STACK_SCRATCH: Array<StackEvent> = Array::with_max_entries(1, 0);

/// Emits a STACK sample for the current call (`--call-stack=c`): registers, the kernel's
/// frame-pointer walk, and as much of the user stack above sp as can be read, up to 8 KiB, or
/// past the outermost interpreter loop under a Python call.
#[inline(always)]
pub(crate) fn emit_stack(ctx: *mut c_void, tgid: u32, tid: u32, ts_ns: u64) {
    #[cfg(bpf_target_arch = "x86_64")]
    let sp = unsafe { (*(ctx as *const aya_ebpf::bindings::pt_regs)).rsp };
    #[cfg(bpf_target_arch = "aarch64")]
    let sp = unsafe { (*(ctx as *const aya_ebpf::bindings::user_pt_regs)).sp };
    let copies = offsets().capture_stacks == 2;
    python::emit_python_stack(tgid, tid, ts_ns, sp, copies);
    if offsets().capture_stacks == 0 {
        return;
    }
    let cpu = unsafe { aya_ebpf::helpers::generated::bpf_get_smp_processor_id() };
    let Some(st) = STACK_SCRATCH.get_ptr_mut(cpu) else {
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
    // Under a Python call the copy reaches past the outermost interpreter loop, so that the
    // mixed view can put every Python frame among the C frames however deep the C++ below
    // it; else 8 KiB. A read that crosses the top of the stack fails whole: smaller copies
    // are tried, 512 bytes less each time, so a sample taken near the top still gets all but
    // < 512 bytes of what is there (halving lost up to half: a deep recursion's outer frames,
    // now and then). The tries run in a `bpf_loop`: one callback for the verifier to check,
    // however many sizes.
    let loop_at = match python::PY_LOOP_AT.get_ptr(0) {
        Some(at) if copies => unsafe { *at },
        _ => 0,
    };
    let sp = st.sp;
    let want = if loop_at <= sp {
        STACK_COPY
    } else if loop_at - sp < (STACK_COPY_MAX - STACK_COPY_TAIL) as u64 {
        (loop_at - sp) as usize + STACK_COPY_TAIL
    } else {
        // Deeper than a copy can hold: as much as it can.
        STACK_COPY_MAX - 1
    };
    let mut tries = CopyTries {
        sp,
        want: (want & (STACK_COPY_MAX - 1)) as u64,
        got: 0,
        cpu,
    };
    unsafe {
        bpf_loop(
            (STACK_COPY_MAX / COPY_STEP) as u32,
            try_copy as *mut c_void,
            &mut tries as *mut CopyTries as *mut c_void,
            0,
        )
    };
    let got = tries.got as usize & (STACK_COPY_MAX - 1);
    st.stack_len = got as u32;
    output_stack_len(st, got);
}

/// Bytes less at each try of a stack copy.
const COPY_STEP: usize = 512;

#[repr(C)]
struct CopyTries {
    sp: u64,
    /// Bytes wanted, and bytes copied (0 until a try succeeds).
    want: u64,
    got: u64,
    cpu: u32,
}

/// Try `index`: copies `want - index * COPY_STEP` bytes from `sp`. Returns 1 to stop.
#[inline(never)]
extern "C" fn try_copy(index: u32, ctx: *mut c_void) -> i64 {
    let t = unsafe { &mut *(ctx as *mut CopyTries) };
    let less = index as u64 * COPY_STEP as u64;
    if less >= t.want {
        return 1;
    }
    let len = (t.want - less) as usize & (STACK_COPY_MAX - 1);
    let Some(st) = STACK_SCRATCH.get_ptr_mut(t.cpu) else {
        return 1;
    };
    let st = unsafe { &mut *st };
    let rc = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(
            st.stack.as_mut_ptr() as *mut c_void,
            len as u32,
            t.sp as *const c_void,
        )
    };
    if rc == 0 {
        t.got = len as u64;
        return 1;
    }
    0
}

#[inline(always)]
fn output_stack_len(st: &StackEvent, len: usize) {
    let len = STACK_HEADER + (len & (STACK_COPY_MAX - 1));
    let bytes = unsafe { core::slice::from_raw_parts(st as *const StackEvent as *const u8, len) };
    if EVENTS.output::<[u8]>(bytes, BPF_RB_NO_WAKEUP).is_err() {
        bump(counter::RINGBUF_FULL);
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
