//! The portable PRNG behind synthetic checkpoints: identical bits on every platform.
//!
//! - [`SplitMix64`] seeds and mixes (Steele, Lea, Flood 2014); [`mix64`] is its finaliser.
//! - [`Xoshiro256ss`] (Blackman, Vigna 2018) draws the values.
//! - Streams: every tensor gets its own seed from the global seed and its *name*
//!   ([`tensor_seed`]), and every chunk of [`CHUNK`] elements its own generator
//!   ([`Xoshiro256ss::stream`]). A tensor's values therefore do not depend on tensor order,
//!   sharding, or thread count, and any slice of a tensor can be regenerated on its own.
//! - Floating point: only +, -, *, / and sqrt in f64 (all correctly rounded by IEEE 754), then
//!   one cast to f32. No `ln`/`cos` (libm results differ across platforms), so the "normal"
//!   variate is Irwin-Hall: the sum of four 16-bit uniforms from one 64-bit draw, centred and
//!   scaled to unit variance (support ±2·√3, a good enough bell for weights).

/// Elements per independently seeded generator.
pub const CHUNK: usize = 4096;

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The SplitMix64 finaliser: a bijective 64-bit mix.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// SplitMix64: a counter plus [`mix64`].
#[derive(Clone, Debug)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN);
        mix64(self.0)
    }
}

/// FNV-1a over bytes (names to seeds).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xCBF2_9CE4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3)
    })
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
    /// State from four SplitMix64 outputs (never all zero in practice; guarded anyway).
    pub fn from_seed(seed: u64) -> Self {
        let mut sm = SplitMix64(seed);
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
        assert_eq!(SplitMix64(0).next_u64(), 0xE220_A839_7B1D_CDAF);
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
}
