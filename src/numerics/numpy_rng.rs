//! NumPy's default generator, bit for bit: `numpy.random.default_rng(seed)` (a `SeedSequence`
//! feeding `PCG64`) and `Generator.integers(low, high)` for 64-bit ranges. Not a PRNG for
//! needlescope's own draws (that is [`super::rng`]): the DeepSeek-V4.1 release derives
//! constants with it (the Engram hash multipliers, docs/spec/v41.md 5.2), and reproducing them
//! for any config needs the same stream.
//!
//! - `SeedSequence(seed)` (NumPy `bit_generator.pyx`): the seed as little-endian 32-bit words,
//!   hashed into a pool of 4 words (`hashmix` with `INIT_A`/`MULT_A`, `mix` with
//!   `MIX_MULT_L`/`MIX_MULT_R`), then `generate_state(4, uint64)`: 8 words hashed with
//!   `INIT_B`/`MULT_B`, paired low word first.
//! - `PCG64` (PCG XSL-RR 128/64): state and increment from those 4 words (`state = w0:w1`,
//!   `inc = w2:w3`, seeded as `pcg64_srandom_r`); each draw steps the LCG, then outputs.
//! - `integers(low, high)` with `high - low - 1 > 2^32 - 1`: Lemire's multiply-shift with
//!   rejection, one 64-bit draw per value (smaller ranges use buffered 32-bit draws in NumPy and
//!   are refused here rather than reproduced wrongly).
//!
//! Checked against NumPy 2.x: `default_rng(10007).integers(0, B, 4, int64)` and seed 140098
//! give the released multipliers (tests below and in `config::engram`).

const INIT_A: u32 = 0x43b0_d7e5;
const MULT_A: u32 = 0x931e_8875;
const INIT_B: u32 = 0x8b51_f9dd;
const MULT_B: u32 = 0x58f3_8ded;
const MIX_MULT_L: u32 = 0xca01_f9dd;
const MIX_MULT_R: u32 = 0x4973_f715;
const XSHIFT: u32 = 16;
const POOL: usize = 4;
/// PCG64's 128-bit LCG multiplier.
const PCG_MULT: u128 = 0x2360_ED05_1FC6_5DA4_4385_DF64_9FCC_F645;

/// `SeedSequence(seed).generate_state(4, uint64)`.
fn seed_sequence_state(seed: u64) -> [u64; 4] {
    let mut entropy = vec![seed as u32];
    if seed >> 32 != 0 {
        entropy.push((seed >> 32) as u32);
    }
    let hashmix = |value: u32, hc: &mut u32| {
        let mut v = value ^ *hc;
        *hc = hc.wrapping_mul(MULT_A);
        v = v.wrapping_mul(*hc);
        v ^ (v >> XSHIFT)
    };
    let mix = |x: u32, y: u32| {
        let r = MIX_MULT_L
            .wrapping_mul(x)
            .wrapping_sub(MIX_MULT_R.wrapping_mul(y));
        r ^ (r >> XSHIFT)
    };
    let mut hc = INIT_A;
    let mut pool = [0u32; POOL];
    for (i, p) in pool.iter_mut().enumerate() {
        *p = hashmix(entropy.get(i).copied().unwrap_or(0), &mut hc);
    }
    for src in 0..POOL {
        for dst in 0..POOL {
            if src != dst {
                let h = hashmix(pool[src], &mut hc);
                pool[dst] = mix(pool[dst], h);
            }
        }
    }
    // (Entropy beyond the pool: none for seeds below 2^128.)
    let mut hc = INIT_B;
    let mut words = [0u32; 8];
    for (i, w) in words.iter_mut().enumerate() {
        let mut d = pool[i % POOL] ^ hc;
        hc = hc.wrapping_mul(MULT_B);
        d = d.wrapping_mul(hc);
        *w = d ^ (d >> XSHIFT);
    }
    std::array::from_fn(|i| u64::from(words[2 * i]) | (u64::from(words[2 * i + 1]) << 32))
}

/// `numpy.random.default_rng(seed)` (module doc).
#[derive(Clone, Debug)]
pub struct NumpyGenerator {
    state: u128,
    inc: u128,
}

impl NumpyGenerator {
    pub fn new(seed: u64) -> Self {
        let w = seed_sequence_state(seed);
        let initstate = (u128::from(w[0]) << 64) | u128::from(w[1]);
        let initseq = (u128::from(w[2]) << 64) | u128::from(w[3]);
        let mut g = NumpyGenerator {
            state: 0,
            inc: (initseq << 1) | 1,
        };
        g.step();
        g.state = g.state.wrapping_add(initstate);
        g.step();
        g
    }

    fn step(&mut self) {
        self.state = self.state.wrapping_mul(PCG_MULT).wrapping_add(self.inc);
    }

    /// The next raw 64-bit output (`bit_generator.random_raw()`).
    pub fn next_u64(&mut self) -> u64 {
        self.step();
        let (hi, lo) = ((self.state >> 64) as u64, self.state as u64);
        (hi ^ lo).rotate_right((hi >> 58) as u32)
    }

    /// `integers(low, high)` (high excluded) for a range wider than 2^32; `None` for a
    /// narrower or empty one (module doc).
    pub fn integers(&mut self, low: i64, high: i64) -> Option<i64> {
        let span = high.checked_sub(low)?.checked_sub(1)? as u64;
        if span <= u64::from(u32::MAX) || high <= low {
            return None;
        }
        let excl = span.wrapping_add(1);
        let mut m = u128::from(self.next_u64()) * u128::from(excl);
        let mut leftover = m as u64;
        if leftover < excl {
            let threshold = (u64::MAX - span) % excl;
            while leftover < threshold {
                m = u128::from(self.next_u64()) * u128::from(excl);
                leftover = m as u64;
            }
        }
        Some(low + (m >> 64) as i64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `numpy.random.default_rng(s).integers(0, B, 4, numpy.int64)` for the seeds and bound of
    /// the released Engram layers (docs/spec/v41.md 5.2 quotes the doubled-plus-one values).
    #[test]
    fn matches_numpy_for_the_released_engram_seeds() {
        let b = (i64::MAX / 99_092) / 2;
        let draw = |seed| {
            let mut g = NumpyGenerator::new(seed);
            (0..4)
                .map(|_| 2 * g.integers(0, b).unwrap() + 1)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            draw(10_007),
            [
                76_632_096_046_245,
                4_839_876_093_313,
                35_959_672_319_349,
                73_987_337_458_391
            ]
        );
        assert_eq!(
            draw(140_098),
            [
                67_716_810_739_261,
                51_510_806_800_915,
                30_921_347_202_721,
                82_619_226_485_591
            ]
        );
    }

    #[test]
    fn narrow_or_empty_ranges_are_not_reproduced() {
        let mut g = NumpyGenerator::new(1);
        assert_eq!(g.integers(0, 1000), None);
        assert_eq!(g.integers(5, 5), None);
        assert!(g.integers(0, 1 << 40).is_some());
    }
}
