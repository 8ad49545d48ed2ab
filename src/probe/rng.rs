//! A tiny portable PRNG (splitmix64) for everything the probe generates: needle values,
//! haystack sentences, distractor keys. Same seed, same output on every platform and in every
//! build; no dependency whose algorithm could change under us.
//!
//! Streams are separated by tag ([`Rng::stream`]): the value, the haystack and the filler each
//! draw from their own stream, so changing one generator never shifts another one's output.

/// splitmix64 (Steele, Lea, Flood 2014): one u64 of state, full period 2^64.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// An independent stream derived from `seed` and a tag (e.g. `"value"`, `"haystack"`).
    pub fn stream(seed: u64, tag: &str) -> Self {
        // FNV-1a of the tag, mixed with the seed through one splitmix64 step.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in tag.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        let mut r = Rng::new(seed ^ h.rotate_left(17));
        let s = r.next_u64();
        Rng::new(s)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`; returns 0 for `n == 0`). Lemire's multiply-shift; the tiny
    /// bias for huge `n` is irrelevant here.
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        if hi <= lo {
            return lo;
        }
        lo + self.below(hi - lo + 1)
    }

    /// One element of a non-empty slice (the first element's default for an empty one is the
    /// caller's problem: every list here is a non-empty static).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len()).min(items.len().saturating_sub(1))]
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_reference_sequence() {
        // Reference values of splitmix64 seeded with 0 (Vigna's C implementation).
        let mut r = Rng::new(0);
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next_u64(), 0x6e78_9e6a_a1b9_65f4);
    }

    #[test]
    fn streams_differ_by_tag() {
        let a = Rng::stream(7, "value").next_u64();
        let b = Rng::stream(7, "haystack").next_u64();
        assert_ne!(a, b);
        assert_eq!(a, Rng::stream(7, "value").next_u64());
    }
}
