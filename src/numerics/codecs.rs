//! Scalar codecs for the small number formats of DeepSeek-V4 checkpoints and caches.
//!
//! Owns the decode tables shared by CPU and GPU code and the matching encoders:
//! - e4m3fn (`torch.float8_e4m3fn`): 1 sign, 4 exponent bits (bias 7), 3 mantissa bits, no
//!   infinities, max 448, subnormal step 2^-9; codes 0x7F and 0xFF are NaN.
//! - e8m0 (`torch.float8_e8m0fnu`): a bare exponent, `2^(b - 127)`; 255 is NaN and 0 is 2^-127
//!   (an f32 subnormal, still exact).
//! - e2m1 (fp4): bit 3 sign, bits 2-1 exponent, bit 0 mantissa; grid ±{0,0.5,1,1.5,2,3,4,6}.
//! - bf16: round to nearest even through `half`.
//!
//! Rounding choices: every encoder rounds to nearest with ties to even (the CUDA `cvt.rn`
//! behaviour) and saturates instead of overflowing (no code means infinity in these formats).
//! Negative values that round to zero keep their sign (e4m3 0x80, e2m1 0x8), as a hardware cast
//! does. [`f32_to_e2m1_sglang`] is the one deliberate exception: SGLang's fp4 kernels compare with
//! strict `>` against the midpoints, so ties go to the smaller magnitude.
//! NaN inputs: e4m3 -> 0x7F; e2m1 -> +6 (0x7, e2m1 has no NaN and `satfinite` maps NaN to the
//! largest finite value); e8m0 -> 255.

/// Decodes one e4m3fn code with integer-built powers of two, so it is exact and usable in const.
const fn e4m3_decode(b: u8) -> f32 {
    let exp = ((b >> 3) & 0x0F) as i32;
    let man = (b & 0x07) as u32;
    if exp == 0x0F && man == 0x07 {
        return f32::NAN;
    }
    let mag = if exp == 0 {
        // Subnormal: m · 2^-9.
        man as f32 * pow2_f32(-9)
    } else {
        // Normal: (8 + m) · 2^(e - 7 - 3).
        (8 + man) as f32 * pow2_f32(exp - 10)
    };
    if b & 0x80 != 0 {
        -mag
    } else {
        mag
    }
}

/// 2^e as an f32 for e in the normal range [-126, 127] (built from the exponent bits).
pub(crate) const fn pow2_f32(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

const fn build_e4m3_table() -> [f32; 256] {
    let mut t = [0.0f32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = e4m3_decode(i as u8);
        i += 1;
    }
    t
}

/// e4m3fn code -> value, all 256 codes (0x7F and 0xFF are NaN).
pub static E4M3_TO_F32: [f32; 256] = build_e4m3_table();

/// Largest finite e4m3fn magnitude.
pub const E4M3_MAX: f32 = 448.0;

/// e2m1 code -> value, all 16 codes (low 3 bits magnitude, bit 3 sign).
pub static E2M1_TO_F32: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Largest e2m1 magnitude.
pub const E2M1_MAX: f32 = 6.0;

/// Decodes one e4m3fn code.
#[inline]
pub fn e4m3_to_f32(b: u8) -> f32 {
    E4M3_TO_F32[b as usize]
}

/// Encodes to e4m3fn: nearest, ties to even, saturating at ±448, NaN -> 0x7F, sign of zero kept.
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7F;
    }
    let sign: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    if a >= E4M3_MAX {
        return sign | 0x7E;
    }
    // Below the smallest normal 2^-6 the grid is uniform with step 2^-9: code = round(a · 2^9).
    // q = 8 there lands exactly on code 0x08 = 2^-6, so no special case is needed.
    if a < pow2_f32(-6) {
        let q = (a * pow2_f32(9)).round_ties_even() as u8;
        return sign | q;
    }
    // Normal: a = 2^e · (q / 8) with q in [8, 16); both scalings are exact (powers of two).
    let mut e = ((a.to_bits() >> 23) & 0xFF) as i32 - 127;
    let mut q = (a * pow2_f32(3 - e)).round_ties_even() as u32;
    if q == 16 {
        q = 8;
        e += 1;
    }
    let code = (((e + 7) as u32) << 3) | (q - 8);
    // a < 448 here, so at e = 8 q rounds to at most 14 and the code stays <= 0x7E; the min only
    // guards the NaN code.
    sign | code.min(0x7E) as u8
}

/// Decodes one e8m0 scale: `2^(b - 127)`; 255 is NaN, 0 is the subnormal 2^-127.
#[inline]
pub fn e8m0_to_f32(b: u8) -> f32 {
    match b {
        255 => f32::NAN,
        0 => f32::from_bits(1 << 22),
        _ => f32::from_bits((b as u32) << 23),
    }
}

/// Encodes a power-of-two scale as e8m0. Exact for 2^-127 ..= 2^127. Other positive values are
/// rounded *up* to the next power of two (the ue8m0 convention: a scale may only grow) and
/// clamped to that range; zero, negative, infinite and NaN inputs give 255 (NaN).
pub fn f32_pow2_to_e8m0(s: f32) -> u8 {
    if s.is_nan() || s <= 0.0 || s.is_infinite() {
        return 255;
    }
    let bits = s.to_bits();
    let field = ((bits >> 23) & 0xFF) as i32;
    let man = bits & 0x7F_FFFF;
    let e = if field == 0 {
        // f32 subnormal: s = man · 2^-149, log2 ceil from the highest set bit.
        let hi = 31 - man.leading_zeros() as i32;
        let up = if man & (man - 1) != 0 { 1 } else { 0 };
        hi - 149 + up
    } else {
        field - 127 + if man != 0 { 1 } else { 0 }
    };
    (e.clamp(-127, 127) + 127) as u8
}

/// Encodes to e2m1 with round to nearest, ties to the even mantissa bit
/// (0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4), saturating at ±6.
pub fn f32_to_e2m1_rne(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7;
    }
    let sign: u8 = if x.is_sign_negative() { 0x8 } else { 0 };
    let a = x.abs();
    // Ties at 0.25, 1.25, 2.5, 5 fall to the lower (even) code, at 0.75, 1.75, 3.5 to the upper.
    let code = if a <= 0.25 {
        0
    } else if a < 0.75 {
        1
    } else if a <= 1.25 {
        2
    } else if a < 1.75 {
        3
    } else if a <= 2.5 {
        4
    } else if a < 3.5 {
        5
    } else if a <= 5.0 {
        6
    } else {
        7
    };
    sign | code
}

/// Encodes to e2m1 the way SGLang's fp4 kernels do: code = number of midpoints
/// {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5} strictly below |x|, so ties go to the smaller
/// magnitude; saturates at ±6.
pub fn f32_to_e2m1_sglang(x: f32) -> u8 {
    const MIDPOINTS: [f32; 7] = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0];
    if x.is_nan() {
        return 0x7;
    }
    let sign: u8 = if x.is_sign_negative() { 0x8 } else { 0 };
    let a = x.abs();
    let code = MIDPOINTS.iter().filter(|&&m| a > m).count() as u8;
    sign | code
}

/// Decodes one e2m1 code (the high nibble is ignored).
#[inline]
pub fn e2m1_to_f32(code: u8) -> f32 {
    E2M1_TO_F32[(code & 0x0F) as usize]
}

/// Rounds an f32 to the nearest bf16 (ties to even) and back.
#[inline]
pub fn bf16_round(x: f32) -> f32 {
    half::bf16::from_f32(x).to_f32()
}

/// [`bf16_round`] on every element.
pub fn bf16_round_slice(xs: &mut [f32]) {
    for x in xs {
        *x = bf16_round(*x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Independent e4m3fn decoder written from the format definition in f64.
    fn e4m3_reference(b: u8) -> f64 {
        let s = if b & 0x80 != 0 { -1.0 } else { 1.0 };
        let e = ((b >> 3) & 0xF) as i32;
        let m = (b & 7) as f64;
        if e == 15 && m == 7.0 {
            return f64::NAN;
        }
        if e == 0 {
            s * (m / 8.0) * 2f64.powi(-6)
        } else {
            s * (1.0 + m / 8.0) * 2f64.powi(e - 7)
        }
    }

    #[test]
    fn e4m3_table_matches_format_definition_for_all_256_codes() {
        for b in 0..=255u8 {
            let want = e4m3_reference(b);
            let got = E4M3_TO_F32[b as usize];
            if want.is_nan() {
                assert!(got.is_nan(), "code {b:#04x}: expected NaN, got {got}");
            } else {
                assert_eq!(got as f64, want, "code {b:#04x}");
                assert_eq!(got.is_sign_negative(), b & 0x80 != 0, "sign of {b:#04x}");
            }
        }
    }

    #[test]
    fn e4m3_spot_values() {
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert_eq!(e4m3_to_f32(0x80).to_bits(), (-0.0f32).to_bits());
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x07), 7.0 * 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0xB8), -1.0);
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert_eq!(e4m3_to_f32(0xFE), -448.0);
        assert!(e4m3_to_f32(0x7F).is_nan());
        assert!(e4m3_to_f32(0xFF).is_nan());
        assert_eq!(
            E4M3_TO_F32.iter().filter(|v| v.is_nan()).count(),
            2,
            "exactly two NaN codes"
        );
    }

    #[test]
    fn e4m3_encode_round_trips_every_non_nan_code() {
        for b in 0..=255u8 {
            if b & 0x7F == 0x7F {
                continue;
            }
            let v = e4m3_to_f32(b);
            assert_eq!(f32_to_e4m3(v), b, "code {b:#04x} value {v}");
        }
    }

    #[test]
    fn e4m3_encode_rounds_ties_to_even() {
        // Step at 1.0 is 0.125: 1.0625 is halfway 1.0 (even) / 1.125; 1.1875 halfway 1.125 / 1.25.
        assert_eq!(e4m3_to_f32(f32_to_e4m3(1.0625)), 1.0);
        assert_eq!(e4m3_to_f32(f32_to_e4m3(1.1875)), 1.25);
        assert_eq!(e4m3_to_f32(f32_to_e4m3(-1.0625)), -1.0);
        // Just off the tie rounds to nearest.
        assert_eq!(e4m3_to_f32(f32_to_e4m3(1.07)), 1.125);
        // Tie across an exponent boundary: 15.5 between 15 and 16 -> 16 (even mantissa 0).
        assert_eq!(e4m3_to_f32(f32_to_e4m3(15.5)), 16.0);
        // 432 is halfway between 416 (m=5) and 448 (m=6) -> 448.
        assert_eq!(e4m3_to_f32(f32_to_e4m3(432.0)), 448.0);
    }

    #[test]
    fn e4m3_encode_saturates_at_448() {
        assert_eq!(f32_to_e4m3(448.0), 0x7E);
        assert_eq!(f32_to_e4m3(460.0), 0x7E);
        assert_eq!(f32_to_e4m3(500.0), 0x7E);
        assert_eq!(f32_to_e4m3(1e9), 0x7E);
        assert_eq!(f32_to_e4m3(f32::INFINITY), 0x7E);
        assert_eq!(f32_to_e4m3(-1e9), 0xFE);
        assert_eq!(f32_to_e4m3(f32::NAN), 0x7F);
    }

    #[test]
    fn e4m3_encode_subnormals_and_signed_zero() {
        let p = |e: i32| 2f32.powi(e);
        assert_eq!(
            f32_to_e4m3(p(-10)),
            0x00,
            "2^-10 is a tie between 0 and 2^-9: even is 0"
        );
        assert_eq!(
            f32_to_e4m3(3.0 * p(-10)),
            0x02,
            "3*2^-10 ties to 2*2^-9 = 2^-8"
        );
        assert_eq!(e4m3_to_f32(f32_to_e4m3(3.0 * p(-10))), p(-8));
        assert_eq!(f32_to_e4m3(5.0 * p(-10)), 0x02, "5*2^-10 ties to 2 (even)");
        assert_eq!(f32_to_e4m3(p(-9)), 0x01);
        assert_eq!(
            f32_to_e4m3(15.0 * p(-10)),
            0x08,
            "7.5*2^-9 rounds up into the normals"
        );
        assert_eq!(f32_to_e4m3(1e-30), 0x00);
        assert_eq!(f32_to_e4m3(0.0), 0x00);
        assert_eq!(f32_to_e4m3(-0.0), 0x80);
        assert_eq!(
            f32_to_e4m3(-1e-30),
            0x80,
            "negative underflow keeps its sign"
        );
    }

    /// Every decision boundary of both encoders: the midpoint of each pair of adjacent codes
    /// (exact in f32) goes to the even code (e4m3, e2m1 RNE) or the smaller one (SGLang's e2m1),
    /// one f32 ulp either side goes to the nearer code, with either sign (so -0 and negative
    /// underflow keep their sign), and everything from the largest code up saturates.
    #[test]
    fn encoders_decide_every_midpoint_and_its_neighbours() {
        fn check(
            codes: &[u8],
            decode: impl Fn(u8) -> f32,
            encode: impl Fn(f32) -> u8,
            sign: u8,
            tie: impl Fn(u8, u8) -> u8,
        ) {
            let down = |x: f32| f32::from_bits(x.to_bits() - 1);
            let up = |x: f32| f32::from_bits(x.to_bits() + 1);
            for pair in codes.windows(2) {
                let (lo, hi) = (pair[0], pair[1]);
                let mid = (decode(lo) + decode(hi)) / 2.0;
                assert_eq!(
                    (mid - decode(lo)),
                    (decode(hi) - mid),
                    "{lo:#x}: exact midpoint"
                );
                for (x, want) in [(mid, tie(lo, hi)), (down(mid), lo), (up(mid), hi)] {
                    assert_eq!(encode(x), want, "{x:e} between {lo:#x} and {hi:#x}");
                    assert_eq!(encode(-x), want | sign, "{:e}", -x);
                }
                assert_eq!(encode(decode(hi)), hi);
                assert_eq!(encode(-decode(hi)), hi | sign);
            }
            let top = *codes.last().unwrap();
            for x in [up(decode(top)), 2.0 * decode(top), f32::MAX, f32::INFINITY] {
                assert_eq!(encode(x), top, "{x:e} saturates");
                assert_eq!(encode(-x), top | sign, "{:e} saturates", -x);
            }
            assert_eq!(encode(-0.0), sign);
            assert_eq!(encode(-f32::from_bits(1)), sign, "negative underflow");
        }
        let even = |lo: u8, hi: u8| if lo & 1 == 0 { lo } else { hi };
        let e4m3: Vec<u8> = (0..=0x7E).collect();
        check(&e4m3, e4m3_to_f32, f32_to_e4m3, 0x80, even);
        let e2m1: Vec<u8> = (0..8).collect();
        check(&e2m1, e2m1_to_f32, f32_to_e2m1_rne, 0x8, even);
        check(&e2m1, e2m1_to_f32, f32_to_e2m1_sglang, 0x8, |lo, _| lo);
    }

    #[test]
    fn e8m0_decodes_every_code() {
        for b in 0..=254u8 {
            let want = 2f64.powi(b as i32 - 127);
            assert_eq!(e8m0_to_f32(b) as f64, want, "code {b}");
        }
        assert!(e8m0_to_f32(255).is_nan());
        assert_eq!(e8m0_to_f32(0), 2f32.powi(-127));
        assert_eq!(e8m0_to_f32(127), 1.0);
    }

    #[test]
    fn e8m0_encodes_powers_of_two_exactly_and_rounds_others_up() {
        for b in 0..=254u8 {
            assert_eq!(f32_pow2_to_e8m0(e8m0_to_f32(b)), b, "code {b}");
        }
        assert_eq!(f32_pow2_to_e8m0(3.0), 129, "3 rounds up to 4");
        assert_eq!(f32_pow2_to_e8m0(2f32.powi(-140)), 0, "clamped to 2^-127");
        assert_eq!(f32_pow2_to_e8m0(0.0), 255);
        assert_eq!(f32_pow2_to_e8m0(-1.0), 255);
        assert_eq!(f32_pow2_to_e8m0(f32::NAN), 255);
    }

    #[test]
    fn e2m1_table_matches_bit_layout() {
        for code in 0..16u8 {
            let s = if code & 8 != 0 { -1.0 } else { 1.0 };
            let e = ((code >> 1) & 3) as i32;
            let m = (code & 1) as f32;
            let want = if e == 0 {
                s * m * 0.5
            } else {
                s * (1.0 + m / 2.0) * 2f32.powi(e - 1)
            };
            assert_eq!(E2M1_TO_F32[code as usize], want, "code {code}");
            assert_eq!(e2m1_to_f32(code).is_sign_negative(), code & 8 != 0);
        }
    }

    #[test]
    fn e2m1_rne_and_sglang_differ_exactly_on_odd_ties() {
        // (input, RNE value, SGLang value)
        let cases = [
            (0.25, 0.0, 0.0),
            (0.75, 1.0, 0.5),
            (1.25, 1.0, 1.0),
            (1.75, 2.0, 1.5),
            (2.5, 2.0, 2.0),
            (3.5, 4.0, 3.0),
            (5.0, 4.0, 4.0),
        ];
        for (x, rne, sgl) in cases {
            assert_eq!(e2m1_to_f32(f32_to_e2m1_rne(x)), rne, "rne({x})");
            assert_eq!(e2m1_to_f32(f32_to_e2m1_sglang(x)), sgl, "sglang({x})");
            assert_eq!(e2m1_to_f32(f32_to_e2m1_rne(-x)), -rne, "rne(-{x})");
            assert_eq!(e2m1_to_f32(f32_to_e2m1_sglang(-x)), -sgl, "sglang(-{x})");
        }
    }

    #[test]
    fn e2m1_encoders_round_trip_grid_and_saturate_at_6() {
        for code in 0..16u8 {
            let v = e2m1_to_f32(code);
            assert_eq!(f32_to_e2m1_rne(v), code, "rne code {code}");
            assert_eq!(f32_to_e2m1_sglang(v), code, "sglang code {code}");
        }
        for x in [6.0f32, 7.0, 100.0, f32::INFINITY] {
            assert_eq!(f32_to_e2m1_rne(x), 0x7);
            assert_eq!(f32_to_e2m1_sglang(x), 0x7);
            assert_eq!(f32_to_e2m1_rne(-x), 0xF);
        }
        assert_eq!(e2m1_to_f32(f32_to_e2m1_rne(0.3)), 0.5);
        assert_eq!(e2m1_to_f32(f32_to_e2m1_rne(2.6)), 3.0);
    }

    #[test]
    fn bf16_round_is_nearest_even() {
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: even is 1.
        assert_eq!(bf16_round(1.0 + 2f32.powi(-8)), 1.0);
        // 1 + 3·2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: even is 1 + 2^-6.
        assert_eq!(bf16_round(1.0 + 3.0 * 2f32.powi(-8)), 1.0 + 2f32.powi(-6));
        let mut xs = [1.0 + 2f32.powi(-9), -3.0];
        bf16_round_slice(&mut xs);
        assert_eq!(xs, [1.0, -3.0]);
    }
}
