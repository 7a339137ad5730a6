//! Sending records to user space through `EVENTS`: when a record wakes the reader (process
//! events and stops at once; calls, and opens of planned objects in launch mode, in batches of
//! ~256 KiB), stopping the calling thread before a record it must be held for, and filling the
//! per-CPU scratch event's header.

use core::ptr::write_volatile;

use aya_ebpf::helpers::{
    bpf_ktime_get_ns,
    generated::{bpf_get_smp_processor_id, bpf_send_signal_thread},
};
use probe_common::{DATA_LEN, RAW_HEADER, RawEvent, SIGSTOP, counter, event_flags, kind};

use crate::maps::{EVENTS, SCRATCH, bump};

/// `bpf_ringbuf_output` flags and `bpf_ringbuf_query` selector (uapi/linux/bpf.h).
pub(crate) const BPF_RB_NO_WAKEUP: u64 = 1;
pub(crate) const BPF_RB_FORCE_WAKEUP: u64 = 2;
pub(crate) const BPF_RB_AVAIL_DATA: u64 = 0;
pub(crate) const BPF_RB_RING_SIZE: u64 = 1;
/// Call events wake user space only once this much is waiting (about 700 records); below it
/// the session's ticks drain them. A wakeup per event (irq_work + a context switch for every
/// call) was most of our cost above the empty-program floor.
const WAKE_AFTER_BYTES: u64 = 256 << 10;

/// Wakeup flags for a batched record of `len` bytes (a call or a batch chunk not stopping the
/// process): forced for the record that takes the unread data across a multiple of
/// `WAKE_AFTER_BYTES`, so once per 256 KiB while user space is behind. (Forcing every record
/// above the mark made each one raise an irq_work, a self-interrupt that exits a virtual
/// machine, exactly while the reader was already busy.) A crossing missed by a race with
/// another CPU is caught by the next one or by the session's tick.
#[inline(always)]
pub(crate) fn batched_wake_flags(len: usize) -> u64 {
    // Each record takes an 8-byte header and is rounded up to 8 bytes in the ring.
    let taken = ((len as u64 + 7) & !7) + 8;
    let unread = EVENTS.query(BPF_RB_AVAIL_DATA);
    if (unread & (WAKE_AFTER_BYTES - 1)) + taken >= WAKE_AFTER_BYTES {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    }
}

#[inline(always)]
pub(crate) fn emit(ev: &RawEvent) {
    // Process-tree and library events, and anything that stopped the process, wake user
    // space at once (a library being opened must get its probes before the target calls
    // into it; a stopped process waits for us); calls and batch chunks are batched.
    let batched =
        (ev.kind == kind::CALL || ev.kind == kind::CHUNK) && ev.flags & event_flags::STOPPED == 0;
    // (Forced: with batched records still unread, the default would not wake it.)
    let flags = if batched {
        batched_wake_flags(output_len(ev))
    } else {
        BPF_RB_FORCE_WAKEUP
    };
    output(ev, flags);
}

/// Emits `ev` without waking user space until records pile up (as calls are batched): for
/// records user space needs in order but not at once.
#[inline(always)]
pub(crate) fn emit_unhurried(ev: &RawEvent) {
    output(ev, batched_wake_flags(output_len(ev)));
}

/// Only the header and the valid data go out (104 bytes for a HAL call instead of 360).
/// data_len is below DATA_LEN for every event (strings keep their NUL in the buffer, structs
/// and chunks stay under it), so the mask never cuts data.
#[inline(always)]
fn output_len(ev: &RawEvent) -> usize {
    RAW_HEADER + (ev.data_len as usize & (DATA_LEN - 1))
}

#[inline(always)]
fn output(ev: &RawEvent, flags: u64) {
    let len = output_len(ev);
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
pub(crate) fn emit_stopping(ev: &mut RawEvent, stop: bool) {
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
pub(crate) fn scratch(kind_: u16, tgid: u32, tid: u32) -> Option<&'static mut RawEvent> {
    let ev = unsafe { &mut *SCRATCH.get_ptr_mut(0)? };
    ev.kind = kind_;
    ev.flags = 0;
    ev.probe = 0;
    ev.data_len = 0;
    ev.pid = tgid;
    ev.tid = tid;
    ev.cpu = unsafe { bpf_get_smp_processor_id() };
    ev.ts_ns = unsafe { bpf_ktime_get_ns() };
    // One store each: zeroed together, the 72 bytes become one `memset` call, which on BPF
    // is a loop of byte stores (~360 instructions at every event).
    unsafe {
        write_volatile(&mut ev.ret_ts_ns, 0);
        for arg in ev.args.iter_mut() {
            write_volatile(arg, 0);
        }
        write_volatile(&mut ev.ret, 0);
        write_volatile(&mut ev.deref, 0);
    }
    Some(ev)
}

#[inline(always)]
pub(crate) fn stop_current_thread() -> bool {
    unsafe { bpf_send_signal_thread(SIGSTOP) == 0 }
}
