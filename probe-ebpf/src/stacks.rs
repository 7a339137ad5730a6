//! Native stack samples (`--call-stack=c`): registers, the kernel's frame-pointer walk and a
//! copy of the user stack, sent as a STACK record just before the call they belong to (and
//! the Python stack, `python`, before that).

use core::ffi::c_void;

use aya_ebpf::{helpers::generated::bpf_get_stack, macros::map, maps::PerCpuArray};
use probe_common::{STACK_COPY, STACK_COPY_SHED, STACK_HEADER, STACK_KIND, StackEvent, counter};

use crate::{
    emit::{BPF_RB_AVAIL_DATA, BPF_RB_NO_WAKEUP, BPF_RB_RING_SIZE},
    maps::{EVENTS, bump, offsets},
    python,
};

#[map]
static STACK_SCRATCH: PerCpuArray<StackEvent> = PerCpuArray::with_max_entries(1, 0);

/// Emits a STACK sample for the current call (`--call-stack=c`): registers, the kernel's
/// frame-pointer walk, and as much of the user stack above sp as can be read, up to 8 KiB.
#[inline(always)]
pub(crate) fn emit_stack(ctx: *mut c_void, tgid: u32, tid: u32, ts_ns: u64) {
    #[cfg(bpf_target_arch = "x86_64")]
    let sp = unsafe { (*(ctx as *const aya_ebpf::bindings::pt_regs)).rsp };
    #[cfg(bpf_target_arch = "aarch64")]
    let sp = unsafe { (*(ctx as *const aya_ebpf::bindings::user_pt_regs)).sp };
    python::emit_python_stack(tgid, tid, ts_ns, sp);
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
