//! Per-CPU batches of finished calls without data, packed (`probe_common::packed`) and sent
//! as one ring-buffer record when full or when user space runs `flush_calls` on the CPU.

use aya_ebpf::{
    macros::{map, raw_tracepoint},
    maps::{Array, PerCpuArray},
    programs::{RawTracePointContext, RetProbeContext},
};
use probe_common::{
    BATCH_ARRAY_WORDS, BATCH_HEADER, BATCH_KIND, BATCH_WORDS, MAX_ARGS, ProbeSpec, counter,
    event_flags, packed, spec_flags,
};

use crate::{
    calls::{PendingSlot, call_times, read_deref},
    emit::batched_wake_flags,
    maps::{COUNTERS, EVENTS},
};

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
pub(crate) static BATCHING: Array<u32> = Array::with_max_entries(1, 0);

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
pub(crate) fn batch_call(
    ctx: &RetProbeContext,
    call: &PendingSlot,
    spec: &ProbeSpec,
) -> Option<()> {
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
    if EVENTS
        .output::<[u8]>(bytes, batched_wake_flags(len))
        .is_err()
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
