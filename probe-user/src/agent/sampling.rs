//! Byte-weighted Poisson sampling of allocation stacks.
//!
//! Resolving a stack (unwinding, symbolizing) is the expensive part of tracing an allocation,
//! so the agent resolves only a sample: an allocation of `s` bytes is kept with probability
//! `p(s) = 1 - exp(-s / R)` (`R` = `--sample-bytes`, the mean number of bytes between two
//! samples of a Poisson process over allocated bytes), and always when `s >= R`. A kept
//! allocation stands for `1 / p(s)` allocations in the profiles, so small allocations are
//! represented in proportion and every large block is there as itself. Counters (bytes and
//! blocks per owner) never depend on sampling: they come from every event.

#[derive(Clone, Copy, Debug)]
pub struct Sampler {
    mean_bytes: u64,
    state: u64,
}

impl Sampler {
    pub fn new(mean_bytes: u64) -> Self {
        Sampler {
            mean_bytes,
            // Any odd non-zero seed; sampling needs no unpredictability.
            state: 0x9e37_79b9_7f4a_7c15,
        }
    }

    /// The probability that an allocation of `size` bytes is kept.
    pub fn probability(&self, size: u64) -> f64 {
        if self.mean_bytes == 0 || size >= self.mean_bytes {
            1.0
        } else {
            1.0 - (-(size as f64) / self.mean_bytes as f64).exp()
        }
    }

    /// How many allocations a kept one of `size` bytes stands for.
    pub fn weight(&self, size: u64) -> f64 {
        let p = self.probability(size);
        if p > 0.0 { 1.0 / p } else { 0.0 }
    }

    /// Draws whether to keep an allocation of `size` bytes.
    pub fn keep(&mut self, size: u64) -> bool {
        let p = self.probability(size);
        if p >= 1.0 {
            return true;
        }
        // xorshift64*: uniform in [0, 1).
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        let r = self.state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11;
        (r as f64 / (1u64 << 53) as f64) < p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_blocks_are_always_kept_and_zero_keeps_everything() {
        let mut s = Sampler::new(1 << 20);
        assert!((0..1000).all(|_| s.keep(1 << 20)));
        assert!((0..1000).all(|_| s.keep(64 << 20)));
        let mut all = Sampler::new(0);
        assert!((0..1000).all(|_| all.keep(1)));
        assert_eq!(all.weight(1), 1.0);
    }

    #[test]
    fn small_blocks_are_represented_in_proportion() {
        // 200,000 allocations of 4 KiB with R = 512 KiB: p = 1 - e^(-1/128) ~ 0.0078.
        let mut s = Sampler::new(512 * 1024);
        let n = 200_000u64;
        let kept = (0..n).filter(|_| s.keep(4096)).count() as f64;
        let estimated_bytes = kept * s.weight(4096) * 4096.0;
        let true_bytes = (n * 4096) as f64;
        // The estimate's standard deviation is ~2.5% here; 10% is 4 sigma.
        assert!(
            (estimated_bytes - true_bytes).abs() < 0.1 * true_bytes,
            "kept {kept}: estimated {estimated_bytes} vs {true_bytes}"
        );
    }
}
