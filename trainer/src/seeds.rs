//! Seeds and random streams derived from a run's seed: SplitMix64, whose output function spreads
//! neighbouring inputs (steps, samples, cameras) over the whole 64-bit range.

/// SplitMix64's increment, the golden ratio in 64 bits.
pub(crate) const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function.
pub(crate) fn mix64(z: u64) -> u64 {
    let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A SplitMix64 stream keyed by a sequence of words: the same words give the same draws, on
/// every machine and in every process.
#[derive(Debug, Clone)]
pub(crate) struct Stream(u64);

impl Stream {
    /// The stream of `words`, in order.
    pub(crate) fn new(words: &[u64]) -> Self {
        Stream(words.iter().fold(0x6c61_6b65_u64, |z, &w| mix64(z.wrapping_add(GOLDEN) ^ w)))
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN);
        mix64(self.0)
    }

    /// A number uniform in [0, 1), on 53 bits.
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A number uniform in [lo, hi).
    pub(crate) fn uniform(&mut self, (lo, hi): (f64, f64)) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// An index uniform in [0, n), for `n` > 0.
    pub(crate) fn below(&mut self, n: usize) -> usize {
        ((self.unit() * n as f64) as usize).min(n - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_keyed_by_their_words_in_order() {
        let draws = |words: &[u64]| {
            let mut s = Stream::new(words);
            (0..4).map(|_| s.next_u64()).collect::<Vec<_>>()
        };
        assert_eq!(draws(&[1, 2, 3]), draws(&[1, 2, 3]));
        assert_ne!(draws(&[1, 2, 3]), draws(&[1, 3, 2]));
        assert_ne!(draws(&[1, 2, 3]), draws(&[1, 2, 4]));
        assert_ne!(draws(&[0]), draws(&[0, 0]));
    }

    #[test]
    fn units_cover_the_interval_evenly() {
        let mut s = Stream::new(&[7]);
        let mut bins = [0u32; 10];
        for _ in 0..100_000 {
            let u = s.unit();
            assert!((0.0..1.0).contains(&u), "{u}");
            bins[(u * 10.0) as usize] += 1;
        }
        // 10 000 expected per bin; a fair stream stays within 5 standard deviations (~475).
        assert!(bins.iter().all(|&b| b.abs_diff(10_000) < 475), "{bins:?}");
    }
}
