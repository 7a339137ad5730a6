//! Byte-weighted Poisson sampling of allocation stacks, decided in BPF (the node agent).
//!
//! Points fall on the sequence of allocated bytes as a Poisson process of mean spacing `R`
//! (`--sample-bytes`); an allocation that holds a point gets its stack sample. Each CPU keeps
//! the bytes left to its next point (drawn from the exponential distribution of mean `R`)
//! and takes every allocation's size off it: an allocation of `s` bytes is then sampled with
//! probability `1 - exp(-s / R)` whatever came before it (the exponential has no memory), so
//! user space weighs a sampled one by the inverse of that and the estimate stays unbiased.
//! Allocations of `R` bytes or more are always sampled and leave the countdown alone, so the
//! smaller ones still see the same process.
//!
//! The arithmetic here is shared by the BPF program and by the user-space tests: no floats,
//! bounded loops.

/// `SAMPLE_SIZES[probe]`: the probe is not an allocation (never a stack while sampling).
pub const SIZE_NONE: u32 = 0;
/// Every call of the probe gets its stack (an allocation whose size BPF cannot see).
pub const SIZE_ALWAYS: u32 = 1;
/// The size is argument `n` (`SIZE_ARG | n`), read as signed: zero or negative (a free
/// reported by the same function) is not an allocation.
pub const SIZE_ARG: u32 = 0x2000;
/// The size is the signed 64-bit word at byte `off` of the copied data (`SIZE_DATA_I64 | off`);
/// zero or negative (a free reported by the same function) is not an allocation.
pub const SIZE_DATA_I64: u32 = 0x1000;
/// Low bits of a `SIZE_ARG` / `SIZE_DATA_I64` entry: the argument index or the offset.
pub const SIZE_WHERE_MASK: u32 = 0xfff;

/// `SAMPLING[..]` indices: whether sampling is on (0: every call gets its stack, as for a
/// single run) and the mean bytes between samples (0 while on: every allocation, no other call).
pub const SAMPLING_ON: u32 = 0;
pub const SAMPLING_MEAN: u32 = 1;
pub const SAMPLING_LEN: u32 = 2;

/// Means above this are clamped (keeps the fixed-point products below in 64 bits).
pub const MAX_MEAN_BYTES: u64 = 1 << 40;

/// `ln 2` in 16.16 fixed point.
const LN2_Q16: u64 = 45426;

/// `log2(x)` in 16.16 fixed point for `1 <= x <= 2^32` (0 for 0): the integer part from the
/// highest set bit, 16 fraction bits by repeated squaring of the mantissa. Without branches
/// in the loops: each data-dependent branch would double the paths the BPF verifier walks.
#[inline(always)]
pub fn log2_q16(x: u64) -> u64 {
    if x == 0 || x > 1 << 32 {
        return 0;
    }
    let mut high = 0u64;
    let mut v = x;
    // Binary search for the highest set bit (x <= 2^32).
    for shift in [32u64, 16, 8, 4, 2, 1] {
        let t = v >> shift;
        // 1 when t != 0.
        let found = (t | t.wrapping_neg()) >> 63;
        v >>= shift * found;
        high += shift * found;
    }
    // The mantissa in [1, 2) as Q31 (x << 31 fits: x <= 2^32): y < 2^32, y * y < 2^64.
    let mut y = (x << 31) >> high;
    let mut frac = 0u64;
    for bit in 0..16u64 {
        y = (y * y) >> 31;
        // y < 2^34 here; 1 when the square reached 2.
        let carry = y >> 32;
        y >>= carry;
        frac |= carry << (15 - bit);
    }
    (high << 16) | frac
}

/// A draw from the exponential distribution of mean `mean` bytes, from 32 uniform random
/// bits: `-ln(U) * mean` with `U = (random + 1) / 2^32` in (0, 1]. At least 1.
#[inline(always)]
pub fn exponential_bytes(random: u32, mean: u64) -> u64 {
    let mean = if mean > MAX_MEAN_BYTES {
        MAX_MEAN_BYTES
    } else {
        mean
    };
    // -log2(U) = 32 - log2(random + 1), in Q16 (at most 32 << 16).
    let neg_log2 = (32u64 << 16) - log2_q16(random as u64 + 1);
    // mean * -log2(U) * ln 2; mean < 2^41 and neg_log2 <= 2^21 keep both products in range.
    let bytes = (((mean * neg_log2) >> 16) * LN2_Q16) >> 16;
    if bytes == 0 { 1 } else { bytes }
}

/// One allocation of `size` bytes against a CPU's countdown (`*left`: bytes to the next
/// point, 0 before the first draw). Returns whether it is sampled. `random` is asked for 32
/// uniform bits only when a new distance is drawn.
#[inline(always)]
pub fn take_sample(left: &mut u64, size: u64, mean: u64, random: impl FnOnce() -> u32) -> bool {
    if size == 0 {
        return false;
    }
    if mean == 0 || size >= mean {
        return true;
    }
    if *left == 0 {
        // This CPU's first allocation: the process starts here.
        *left = exponential_bytes(random(), mean);
        if *left > size {
            *left -= size;
            return false;
        }
        *left = 0;
    } else if *left > size {
        *left -= size;
        return false;
    }
    // A point falls inside this allocation. Where the next one falls past its end does not
    // depend on where this one was (no memory), so the distance is drawn afresh.
    *left = 0;
    true
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

    /// xorshift64*, fixed seed: the tests are deterministic.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u32 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
        }
    }

    #[test]
    fn log2_matches_the_float_log_to_16_bits() {
        for x in [
            1u64,
            2,
            3,
            5,
            1000,
            65535,
            1 << 20,
            123_456_789,
            u32::MAX as u64,
            1 << 32,
        ] {
            let got = log2_q16(x) as f64 / 65536.0;
            let want = (x as f64).log2();
            assert!(
                (got - want).abs() < 2.0 / 65536.0,
                "log2({x}) = {got}, want {want}"
            );
        }
    }

    #[test]
    fn draws_follow_the_exponential_distribution() {
        let mean = 512 * 1024u64;
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let n = 200_000;
        let draws: Vec<u64> = (0..n)
            .map(|_| exponential_bytes(rng.next(), mean))
            .collect();
        let avg = draws.iter().sum::<u64>() as f64 / n as f64;
        // The sample mean's standard deviation is mean / sqrt(n) ~ 0.22%.
        assert!((avg / mean as f64 - 1.0).abs() < 0.01, "mean {avg}");
        // P(X > t) = exp(-t / mean) at a few quantiles (binomial sd < 0.0012 here).
        for t in [0.1f64, 0.5, 1.0, 2.0, 4.0] {
            let above = draws
                .iter()
                .filter(|d| **d as f64 > t * mean as f64)
                .count();
            let p = above as f64 / n as f64;
            assert!((p - (-t).exp()).abs() < 0.006, "P(X > {t} R) = {p}");
        }
        // Extremes: the largest draw (random = 0) is 32 ln 2 R, the smallest about R / 2^32.
        let largest = exponential_bytes(0, mean) as f64 / mean as f64;
        assert!(
            (largest - 32.0 * core::f64::consts::LN_2).abs() < 1e-3,
            "{largest}"
        );
        assert_eq!(exponential_bytes(u32::MAX, mean), 1);
    }

    #[test]
    fn each_size_is_sampled_with_probability_one_minus_exp() {
        let mean = 64 * 1024u64;
        let mut rng = Rng(7);
        let mut left = 0;
        // Interleaved sizes on one countdown: each size's rate must be its own p(s).
        let sizes = [512u64, 4096, 16 * 1024, 48 * 1024, 64 * 1024, 1 << 20];
        let mut kept = [0u64; 6];
        let rounds = 100_000u64;
        for _ in 0..rounds {
            for (i, s) in sizes.iter().enumerate() {
                kept[i] += take_sample(&mut left, *s, mean, || rng.next()) as u64;
            }
        }
        for (i, s) in sizes.iter().enumerate() {
            let p = if *s >= mean {
                1.0
            } else {
                1.0 - (-(*s as f64) / mean as f64).exp()
            };
            let got = kept[i] as f64 / rounds as f64;
            let sd = (p * (1.0 - p) / rounds as f64).sqrt();
            assert!(
                (got - p).abs() <= 5.0 * sd + 1e-9,
                "size {s}: sampled {got}, want {p} (sd {sd})"
            );
        }
    }

    #[test]
    fn the_weighted_estimate_is_unbiased() {
        // Mixed sizes, weights 1 / p(s): the estimated bytes match the true bytes within a
        // bound derived from the variance of the Horvitz-Thompson estimate.
        let mean = 256 * 1024u64;
        let mut rng = Rng(42);
        let mut sizes_rng = Rng(1234);
        let mut left = 0;
        let (mut truth, mut estimate, mut variance) = (0f64, 0f64, 0f64);
        for _ in 0..300_000 {
            let s = 256 + (sizes_rng.next() as u64 % (200 * 1024));
            let p = 1.0 - (-(s as f64) / mean as f64).exp();
            truth += s as f64;
            variance += (s as f64).powi(2) * (1.0 - p) / p;
            if take_sample(&mut left, s, mean, || rng.next()) {
                estimate += s as f64 / p;
            }
        }
        let sd = variance.sqrt();
        assert!(
            (estimate - truth).abs() < 4.0 * sd,
            "estimate {estimate} vs {truth} (sd {sd})"
        );
    }

    #[test]
    fn zero_mean_samples_every_allocation_and_no_size_none() {
        let mut left = 0;
        assert!(take_sample(&mut left, 1, 0, || unreachable!()));
        assert!(!take_sample(&mut left, 0, 1024, || unreachable!()));
        assert!(take_sample(&mut left, 1024, 1024, || unreachable!()));
        assert_eq!(left, 0);
    }
}
