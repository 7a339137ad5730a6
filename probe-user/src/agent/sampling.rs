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
//! Which probes carry a size, and the BPF side's setting: `Bpf::stacks_for_allocations`.

use probe_common::sampling::MAX_MEAN_BYTES;

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
