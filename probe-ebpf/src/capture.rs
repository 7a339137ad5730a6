//! What a call copies out of the target: a string or struct argument, the struct it points
//! to (`INDIRECT`), and arrays of structs walked under `bpf_loop` and sent as CHUNK events
//! (the batch APIs). Sizes and offsets come from the probe's `ProbeSpec`.

use core::ffi::c_void;

use aya_ebpf::helpers::{bpf_probe_read_user_str_bytes, generated::bpf_loop};
use probe_common::{
    DATA_LEN, MAX_CHUNKS, NO_ARRAY2, ProbeSpec, RawEvent, counter, event_flags, kind, spec_flags,
};

use crate::{
    emit::emit,
    maps::{COUNTERS, SCRATCH},
};

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
pub(crate) fn copy_indirect(ev: &mut RawEvent, spec: &ProbeSpec) {
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
pub(crate) fn emit_batch(ev: &RawEvent, spec: &ProbeSpec) {
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
pub(crate) fn copy_user_str(ev: &mut RawEvent, src: *const u8) {
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
pub(crate) fn copy_user_bytes(ev: &mut RawEvent, src: *const u8, len: u32) {
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
