//! The crate's one pseudo-random generator: portable, identical bits on every platform and in
//! every build, no dependency whose algorithm could change under us. Everything that draws uses
//! it: the probe's needle values, haystack sentences and distractor keys, the synthetic
//! checkpoints' weights, the parity checks' random inputs, and the tests.
//!
//! - [`Rng`] is splitmix64 (Steele, Lea, Flood 2014): one u64 of state, full period 2^64; [`mix64`]
//!   is its finaliser. Streams are separated by tag ([`Rng::stream`]): the probe's value,
//!   haystack and filler each draw from their own stream, so changing one generator never shifts
//!   another one's output.
//! - Bulk tensor values draw from [`Xoshiro256ss`] (Blackman, Vigna 2018), seeded by four
//!   splitmix64 outputs: every tensor gets its own seed from the global seed and its *name*
//!   ([`tensor_seed`]), and every chunk of [`CHUNK`] elements its own generator
//!   ([`Xoshiro256ss::stream`]). A tensor's values therefore do not depend on tensor order,
//!   sharding, or thread count, and any slice of a tensor can be regenerated on its own.
//! - Floating point: only +, -, *, / and sqrt in f64 (all correctly rounded by IEEE 754), then
//!   one cast to f32. No `ln`/`cos` (libm results differ across platforms), so the "normal"
//!   variate is Irwin-Hall: the sum of four 16-bit uniforms from one 64-bit draw, centred and
//!   scaled to unit variance (support ±2·√3, a good enough bell for weights).

/// Elements per independently seeded tensor-value generator.
pub const CHUNK: usize = 4096;

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The splitmix64 finaliser: a bijective 64-bit mix.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a over bytes (names and tags to seeds).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xCBF2_9CE4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// splitmix64: a counter plus [`mix64`].
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
        let h = fnv1a64(tag.as_bytes());
        let mut r = Rng::new(seed ^ h.rotate_left(17));
        let s = r.next_u64();
        Rng::new(s)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        mix64(self.state)
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
        unit_f64(self.next_u64()) <= p
    }

    /// Uniform f64 in [0, 1) (53 random bits).
    pub fn uniform(&mut self) -> f64 {
        unit_f64(self.next_u64())
    }

    /// Uniform f32 in [0, 1) (24 random bits).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in ±[1e-3, 1]: test inputs away from 0.
    pub fn value(&mut self) -> f32 {
        let m = 1e-3 + self.unit() * (1.0 - 1e-3);
        if self.next_u64() & 1 == 0 {
            m
        } else {
            -m
        }
    }

    /// Uniform in [-1, 1).
    pub fn signed(&mut self) -> f32 {
        self.unit() * 2.0 - 1.0
    }

    /// `n` values of [`Rng::signed`].
    pub fn signed_n(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.signed()).collect()
    }

    /// `n` values of [`Rng::value`] times `scale`.
    pub fn values(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.value() * scale).collect()
    }
}

/// The seed of tensor `name` under global `seed`.
pub fn tensor_seed(seed: u64, name: &str) -> u64 {
    mix64(seed ^ mix64(fnv1a64(name.as_bytes()).wrapping_add(GOLDEN)))
}

/// xoshiro256**.
#[derive(Clone, Debug)]
pub struct Xoshiro256ss {
    s: [u64; 4],
}

impl Xoshiro256ss {
    /// State from four splitmix64 outputs (never all zero in practice; guarded anyway).
    pub fn from_seed(seed: u64) -> Self {
        let mut sm = Rng::new(seed);
        let mut s = [sm.next_u64(), sm.next_u64(), sm.next_u64(), sm.next_u64()];
        if s == [0; 4] {
            s[0] = GOLDEN;
        }
        Xoshiro256ss { s }
    }

    /// The generator of chunk `chunk` of the tensor seeded `tensor_seed`.
    pub fn stream(tensor_seed: u64, chunk: u64) -> Self {
        Self::from_seed(mix64(
            tensor_seed ^ mix64(chunk.wrapping_add(1).wrapping_mul(GOLDEN)),
        ))
    }

    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn uniform(&mut self) -> f64 {
        unit_f64(self.next_u64())
    }

    /// Approximately standard normal (Irwin-Hall of 4), exactly reproducible.
    pub fn normal(&mut self) -> f64 {
        irwin_hall4(self.next_u64())
    }

    /// Uniform integer in [0, n) (Lemire's multiply-shift; bias below 2^-32 for n < 2^32).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() >> 32) * n) >> 32
    }
}

/// The top 53 bits of `u` as a uniform in [0, 1).
pub fn unit_f64(u: u64) -> f64 {
    (u >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Four 16-bit uniforms of `u`, centred and scaled to mean 0 and variance 1.
pub fn irwin_hall4(u: u64) -> f64 {
    let s = (u & 0xFFFF) + ((u >> 16) & 0xFFFF) + ((u >> 32) & 0xFFFF) + (u >> 48);
    // Each lane is (v + 0.5) / 65536, uniform on (0, 1): sum has mean 2 and variance 1/3.
    const SQRT_3: f64 = 1.732_050_807_568_877_2;
    // Multiplying by the exact power of two 2^-16 is bit-identical to dividing by 65536.
    ((s as f64 + 2.0) * (1.0 / 65536.0) - 2.0) * SQRT_3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xoshiro_matches_reference_first_outputs() {
        // Reference: xoshiro256** with state {1, 2, 3, 4} (Vigna's C code).
        let mut g = Xoshiro256ss { s: [1, 2, 3, 4] };
        let got: Vec<u64> = (0..3).map(|_| g.next_u64()).collect();
        assert_eq!(got, vec![11520, 0, 1509978240]);
    }

    #[test]
    fn splitmix_matches_reference_first_output() {
        // Reference value of splitmix64 seeded with 0 (first output).
        assert_eq!(Rng::new(0).next_u64(), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn irwin_hall_has_unit_variance_and_zero_mean() {
        let mut g = Xoshiro256ss::from_seed(7);
        let n = 200_000;
        let xs: Vec<f64> = (0..n).map(|_| g.normal()).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "variance {var}");
        assert!(xs.iter().all(|x| x.abs() <= 2.0 * 3f64.sqrt()));
    }

    #[test]
    fn streams_differ_by_chunk_and_by_name() {
        let a = Xoshiro256ss::stream(tensor_seed(0, "a"), 0).next_u64();
        let b = Xoshiro256ss::stream(tensor_seed(0, "a"), 1).next_u64();
        let c = Xoshiro256ss::stream(tensor_seed(0, "b"), 0).next_u64();
        let d = Xoshiro256ss::stream(tensor_seed(1, "a"), 0).next_u64();
        assert!(a != b && a != c && a != d && b != c);
        assert_eq!(a, Xoshiro256ss::stream(tensor_seed(0, "a"), 0).next_u64());
    }

    #[test]
    fn below_stays_in_range() {
        let mut g = Xoshiro256ss::from_seed(3);
        assert!((0..10_000).all(|_| g.below(6) < 6));
    }

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

    #[test]
    fn test_values_stay_away_from_zero() {
        let mut r = Rng::new(1);
        assert!(r
            .values(1000, 1.0)
            .iter()
            .all(|v| v.abs() >= 1e-3 && v.abs() <= 1.0));
    }
}
