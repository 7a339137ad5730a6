//! Byte-weighted Poisson sampling of allocation stacks.
//!
//! Copying, unwinding and symbolizing a stack is the expensive part of tracing an
//! allocation, so the agent gets stacks for a sample only, decided in BPF before anything is
//! copied (`probe-ebpf/src/sampling.rs`, arithmetic in `probe_common::sampling`): points fall
//! on the allocated bytes as a Poisson process of mean spacing `R` (`--sample-bytes`), so an
//! allocation of `s` bytes gets its stack with probability `p(s) = 1 - exp(-s / R)`, and always
//! when `s >= R`. A sampled allocation stands for `1 / p(s)` allocations in the profiles:
//! small allocations are represented in proportion and every large block is there as itself.
//! Counters (bytes and blocks per owner) never depend on sampling: they come from every event.
//!
//! Pool regions registered through the mstx memory API come as one batch per call whose sizes
//! BPF does not add up: with `R > 0` they carry no stack (their bytes are in the counters).

use anyhow::{Context, Result, anyhow};
use aya::maps::{Array, MapData};
use probe_common::sampling::{
    MAX_MEAN_BYTES, SAMPLING_MEAN, SAMPLING_ON, SIZE_ALWAYS, SIZE_ARG, SIZE_DATA_I64, SIZE_NONE,
};

use crate::trace::{bpf::Bpf, probes::ProbeId};

/// Where each allocating probe's size is, for the BPF side. Every other probe gets no stack.
fn size_sources(mean_bytes: u64) -> [(ProbeId, u32); 13] {
    [
        // halMemAlloc(void **pp, u64 size, u64 flag), halMemCreate(handle **h, size_t size, ...)
        (ProbeId::HalMemAlloc, SIZE_ARG | 1),
        (ProbeId::HalMemCreate, SIZE_ARG | 1),
        // CUDA: cudaMalloc*(void **p, size_t size, ...), cudaHostAlloc(void **p, size_t, flags),
        // cuMemCreate(handle *h, size_t size, ...).
        (ProbeId::CudaMalloc, SIZE_ARG | 1),
        (ProbeId::CudaMallocAsync, SIZE_ARG | 1),
        (ProbeId::CudaMallocManaged, SIZE_ARG | 1),
        (ProbeId::CudaMallocHost, SIZE_ARG | 1),
        (ProbeId::CudaHostAlloc, SIZE_ARG | 1),
        (ProbeId::CuMemCreate, SIZE_ARG | 1),
        // MindSpore: AbstractDynamicMemPool::AllocTensorMem(this, size_t size, ...).
        (ProbeId::MsAllocTensorMem, SIZE_ARG | 1),
        // c10::reportMemoryUsageToProfiler(void *ptr, int64_t alloc_size, ...): negative on free.
        (ProbeId::C10ReportMemoryUsage, SIZE_ARG | 1),
        // MemoryUsage.alloc_size (i64 at byte 16; negative when the report is a free).
        (ProbeId::PtaUsageOriginal, SIZE_DATA_I64 | 16),
        (ProbeId::PtaUsageWithComponent, SIZE_DATA_I64 | 16),
        (
            ProbeId::MstxMemRegionsRegister,
            if mean_bytes == 0 {
                SIZE_ALWAYS
            } else {
                SIZE_NONE
            },
        ),
    ]
}

/// Turns sampling on in BPF (before any probe is attached): stacks for allocations only,
/// a byte-weighted sample of mean spacing `mean_bytes` (0: every allocation).
pub fn configure_bpf(bpf: &mut Bpf, mean_bytes: u64) -> Result<()> {
    let mut sizes: Array<&mut MapData, u32> = Array::try_from(
        bpf.map_mut("SAMPLE_SIZES")
            .ok_or_else(|| anyhow!("BPF map SAMPLE_SIZES missing"))?,
    )?;
    for (id, source) in size_sources(mean_bytes) {
        sizes
            .set(id as u32, source, 0)
            .with_context(|| format!("cannot store the size source of {id:?}"))?;
    }
    let mut sampling: Array<&mut MapData, u64> = Array::try_from(
        bpf.map_mut("SAMPLING")
            .ok_or_else(|| anyhow!("BPF map SAMPLING missing"))?,
    )?;
    sampling.set(SAMPLING_MEAN, mean_bytes.min(MAX_MEAN_BYTES), 0)?;
    sampling
        .set(SAMPLING_ON, 1, 0)
        .context("cannot turn stack sampling on")
}

/// The weights of sampled allocations.
#[derive(Clone, Copy, Debug)]
pub struct Sampler {
    mean_bytes: u64,
}

impl Sampler {
    pub fn new(mean_bytes: u64) -> Self {
        Sampler {
            // As the BPF side clamps it.
            mean_bytes: mean_bytes.min(MAX_MEAN_BYTES),
        }
    }

    /// The probability that an allocation of `size` bytes is sampled.
    pub fn probability(&self, size: u64) -> f64 {
        if self.mean_bytes == 0 || size >= self.mean_bytes {
            1.0
        } else {
            1.0 - (-(size as f64) / self.mean_bytes as f64).exp()
        }
    }

    /// How many allocations a sampled one of `size` bytes stands for.
    pub fn weight(&self, size: u64) -> f64 {
        let p = self.probability(size);
        if p > 0.0 { 1.0 / p } else { 0.0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use probe_common::sampling::take_sample;

    #[test]
    fn large_blocks_weigh_one_and_zero_keeps_everything() {
        let s = Sampler::new(1 << 20);
        assert_eq!(s.weight(1 << 20), 1.0);
        assert_eq!(s.weight(64 << 20), 1.0);
        assert_eq!(Sampler::new(0).weight(1), 1.0);
        // p(R / 2) = 1 - e^-0.5.
        assert!((s.probability(1 << 19) - 0.393_469_340_287).abs() < 1e-9);
    }

    #[test]
    fn weights_match_the_bpf_side_sampling() {
        // The BPF countdown (shared code) with a fixed random sequence; the weights given
        // here to what it keeps estimate the true bytes within 4 standard deviations of the
        // Horvitz-Thompson estimate (its variance is sum s^2 (1 - p) / p).
        let s = Sampler::new(512 * 1024);
        // xorshift64*, fixed seed.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let next = |state: &mut u64| {
            *state ^= *state >> 12;
            *state ^= *state << 25;
            *state ^= *state >> 27;
            (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
        };
        let mut left = 0;
        let (mut truth, mut estimate, mut variance) = (0.0, 0.0, 0.0);
        for i in 0..200_000u64 {
            let size = [4096, 65536, 300_000, 2 << 20][(i % 4) as usize];
            truth += size as f64;
            let p = s.probability(size);
            variance += (size as f64).powi(2) * (1.0 - p) / p;
            if take_sample(&mut left, size, 512 * 1024, || next(&mut state)) {
                estimate += s.weight(size) * size as f64;
            }
        }
        let sd: f64 = variance.sqrt();
        assert!(
            (estimate - truth).abs() < 4.0 * sd,
            "estimate {estimate} vs {truth} (sd {sd})"
        );
    }
}
