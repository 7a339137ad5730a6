//! Stack sampling decided here, before any stack is copied (the node agent's cost budget).
//!
//! With sampling on (`SAMPLING[SAMPLING_ON]`, set by the agent), only allocations get stack
//! samples, and only a byte-weighted Poisson sample of them (`probe_common::sampling`): a
//! per-CPU countdown of bytes, drawn from the exponential distribution, takes each
//! allocation's size off at the call and asks for a stack when it runs out. The other calls
//! skip the 8 KiB stack copy and user space their decoding. With sampling off (a single run)
//! every call gets its stack as before.

use aya_ebpf::{
    helpers::generated::bpf_get_prandom_u32,
    macros::map,
    maps::{Array, PerCpuArray},
};
use probe_common::{
    DATA_LEN, MAX_ARGS, MAX_PROBES,
    sampling::{
        SAMPLING_LEN, SAMPLING_MEAN, SAMPLING_ON, SIZE_ALWAYS, SIZE_ARG, SIZE_DATA_I64, SIZE_NONE,
        SIZE_WHERE_MASK, take_sample,
    },
};

/// `[on, mean bytes]`, written by user space before the probes are attached.
#[map]
static SAMPLING: Array<u64> = Array::with_max_entries(SAMPLING_LEN, 0);

/// Per probe id: where the allocated size is (`probe_common::sampling::SIZE_*`).
#[map]
static SAMPLE_SIZES: Array<u32> = Array::with_max_entries(MAX_PROBES, 0);

/// Bytes left to this CPU's next sample point (0: not drawn yet).
#[map]
static SAMPLE_COUNTDOWN: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Whether this call of `probe` gets a stack sample. `data`: the bytes copied at entry, for
/// probes whose size is in a struct (None: nothing copied, such a size reads as 0).
#[inline(always)]
pub fn wants_stack(probe: u32, args: &[u64; MAX_ARGS], data: Option<&[u8; DATA_LEN]>) -> bool {
    if SAMPLING.get(SAMPLING_ON).is_none_or(|on| *on == 0) {
        return true;
    }
    let mean = SAMPLING.get(SAMPLING_MEAN).copied().unwrap_or(0);
    let source = SAMPLE_SIZES.get(probe).copied().unwrap_or(SIZE_NONE);
    let size = if source == SIZE_NONE {
        return false;
    } else if source == SIZE_ALWAYS {
        return true;
    } else if source & SIZE_DATA_I64 != 0 {
        let at = (source & SIZE_WHERE_MASK) as usize;
        if at > DATA_LEN - 8 {
            return false;
        }
        let signed = match data.and_then(|d| d.get(at..at + 8)) {
            Some(b) => i64::from_ne_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
            None => 0,
        };
        if signed <= 0 {
            return false;
        }
        signed as u64
    } else if source & SIZE_ARG != 0 {
        // Signed: c10's report passes a free as a negative size in the same argument.
        match args.get((source & SIZE_WHERE_MASK) as usize) {
            Some(a) if (*a as i64) > 0 => *a,
            _ => return false,
        }
    } else {
        return false;
    };
    let Some(left) = SAMPLE_COUNTDOWN.get_ptr_mut(0) else {
        return true;
    };
    take_sample(unsafe { &mut *left }, size, mean, || unsafe {
        bpf_get_prandom_u32()
    })
}
