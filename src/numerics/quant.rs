//! Activation quantisation "simulations": round f32 values to what an engine's e4m3 / e2m1
//! quantiser would reconstruct, in place. Results are values (code · scale), never codes.
//!
//! | function | block | amax floor | scale | codes | output |
//! |---|---|---|---|---|---|
//! | [`fp8_sim_pow2`] (REF `act_quant`, §3.5) | given (64 for KV) | 1e-4 | `pow2ceil(amax · fp32(1/448))` | e4m3 RNE of `clamp(x/s, ±448)` | `bf16(q · s)` |
//! | [`fp4_sim_pow2_rne`] (REF `fp4_act_quant`, §3.6) | given (32) | 6·2^-126 | `pow2ceil(amax · fp32(1/6))` | e2m1 RNE of `clamp(x/s, ±6)` | `bf16(q · s)` |
//! | [`fp4_sim_e4m3_scale`] (V4.1 compressed KV) | given (16) | 6·2^-9 | `e4m3(amax / 6)` | e2m1 RNE of `clamp(x/s, ±6)` | `q · s` |
//! | [`fp4_sim_sglang`] (SGLang fp4 indexer) | given (32) | 1e-4 | `pow2ceil(fp32(amax / 6))` | e2m1, ties to smaller | `q · s` |
//! | [`fp8_row_scale_fp32`] (SGLang index q/k) | whole slice | 1e-4 | `fp32(amax / 448)` | e4m3 RNE of `clamp(x · fp32(1/s), ±448)` | `(q, s)` |
//! | [`fp8_row_scale_pow2`] (vLLM index q/k) | whole slice | 1e-4 | `pow2ceil(fp32(amax / 448))` | e4m3 RNE of `clamp(x/s, ±448)` | `(q, s)` |
//!
//! `pow2ceil(t)` is REF's bit trick: `2^(exponent(t) - 127 + (mantissa(t) != 0))`, i.e. the exact
//! `2^ceil(log2 t)` of the f32 value t (t is a normal number for every floor above). The
//! reciprocal-multiply vs division distinction is kept literally even though, for the pow2
//! scales, it cannot change the result: fp32(1/448) and fp32(1/6) are within half an ulp of the
//! true reciprocals, so `amax · fp32(1/448)` never rounds past a power of two that `amax / 448`
//! stays at or below (a test checks this for every f32 in a binade). For SGLang's non-pow2 fp8
//! scale the division is visible in the last bit of the scale.
//! Division by a power-of-two scale is exact, and every pow2 output is exactly representable in
//! bf16 (e4m3 and e2m1 have at most 3 mantissa bits), so the final bf16 rounding is a no-op
//! kept for fidelity. A partial last block is allowed everywhere.

use super::codecs::{
    bf16_round, bf16_round_slice, e2m1_to_f32, e4m3_to_f32, f32_to_e2m1_rne, f32_to_e2m1_sglang,
    f32_to_e4m3, E2M1_MAX, E4M3_MAX,
};

/// fp32(1/448), the rounded reciprocal REF multiplies by.
pub const RECIP_448: f32 = 1.0 / 448.0;
/// fp32(1/6), the rounded reciprocal REF's fp4 quantiser multiplies by.
pub const RECIP_6: f32 = 1.0 / 6.0;
/// amax floor of every fp8 quantiser (and of SGLang's fp4 one).
pub const FP8_AMAX_FLOOR: f32 = 1e-4;
/// amax floor of REF's fp4 quantiser: 6 · 2^-126.
pub const FP4_AMAX_FLOOR: f32 = 6.0 * f32::MIN_POSITIVE;
/// KV fp8 simulation block (elements per ue8m0 scale on the nope dims).
pub const KV_FP8_BLOCK: usize = 64;

/// `2^ceil(log2 t)` from the f32 bits of a positive t (REF's `fast_round_scale`).
pub fn pow2_ceil_bits(t: f32) -> f32 {
    let bits = t.to_bits();
    let e = ((bits >> 23) & 0xFF) as i32 - 127 + i32::from(bits & 0x7F_FFFF != 0);
    // Exact for e in [-149, 127]; powi on 2.0 in f64 is exact.
    2f64.powi(e.min(127)) as f32
}

fn amax(xs: &[f32]) -> f32 {
    xs.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// REF `act_quant` simulation (attention spec §3.5), in place, per block of `block` elements.
pub fn fp8_sim_pow2(x: &mut [f32], block: usize) {
    for chunk in x.chunks_mut(block.max(1)) {
        let s = pow2_ceil_bits(amax(chunk).max(FP8_AMAX_FLOOR) * RECIP_448);
        for v in chunk.iter_mut() {
            let q = e4m3_to_f32(f32_to_e4m3((*v / s).clamp(-E4M3_MAX, E4M3_MAX)));
            *v = bf16_round(q * s);
        }
    }
}

/// `--kv fp8` on one main KV row: the whole row is rounded to bf16 first (REF's RoPE output and
/// the rope dims stored by every engine are bf16), then the first `nope_dims` (clamped to the
/// row) get [`fp8_sim_pow2`] in blocks of 64.
pub fn kv_fp8_sim(row: &mut [f32], nope_dims: usize) {
    bf16_round_slice(row);
    let n = nope_dims.min(row.len());
    fp8_sim_pow2(&mut row[..n], KV_FP8_BLOCK);
}

/// REF `fp4_act_quant` simulation (attention spec §3.6), in place, per block of `block`.
pub fn fp4_sim_pow2_rne(x: &mut [f32], block: usize) {
    for chunk in x.chunks_mut(block.max(1)) {
        let s = pow2_ceil_bits(amax(chunk).max(FP4_AMAX_FLOOR) * RECIP_6);
        for v in chunk.iter_mut() {
            let q = e2m1_to_f32(f32_to_e2m1_rne((*v / s).clamp(-E2M1_MAX, E2M1_MAX)));
            *v = bf16_round(q * s);
        }
    }
}

/// amax floor of DeepSeek-V4.1's compressed-KV fp4 quantiser: 6 · 2^-9 (its E4M3 scale's floor
/// is 2^-9).
pub const FP4_E4M3_AMAX_FLOOR: f32 = 6.0 / 512.0;
/// DeepSeek-V4.1's compressed-KV block (elements per E4M3 scale).
pub const V41_COMPRESSED_BLOCK: usize = 16;
/// DeepSeek-V4.1's window-KV block (elements per power-of-two scale, over all dims).
pub const V41_WINDOW_BLOCK: usize = 32;

/// DeepSeek-V4.1's compressed-KV quantiser (the reference's `fp4_act_quant(latent, 16,
/// scale_dtype=e4m3)`, docs/spec/v41.md 5.8), in place, per block of `block`: the scale is
/// `e4m3(max(amax, 6·2^-9) / 6)` (not a power of two, so `x / s` is a true division), codes
/// e2m1 with ties to even.
pub fn fp4_sim_e4m3_scale(x: &mut [f32], block: usize) {
    for chunk in x.chunks_mut(block.max(1)) {
        let t = (amax(chunk).max(FP4_E4M3_AMAX_FLOOR) / E2M1_MAX).min(E4M3_MAX);
        let s = e4m3_to_f32(f32_to_e4m3(t));
        for v in chunk.iter_mut() {
            *v = e2m1_to_f32(f32_to_e2m1_rne((*v / s).clamp(-E2M1_MAX, E2M1_MAX))) * s;
        }
    }
}

/// DeepSeek-V4.1's `--kv release` on one window KV row (after RoPE): the row rounded to bf16
/// (the reference's activations are bf16), then [`fp8_sim_pow2`] in blocks of 32 over all its
/// dims (V4 rounded only the 448 nope dims, in blocks of 64).
pub fn kv_v41_window(row: &mut [f32]) {
    bf16_round_slice(row);
    fp8_sim_pow2(row, V41_WINDOW_BLOCK);
}

/// DeepSeek-V4.1's `--kv release` on one compressed KV row (after RoPE): bf16, then
/// [`fp4_sim_e4m3_scale`] in blocks of 16.
pub fn kv_v41_compressed(row: &mut [f32]) {
    bf16_round_slice(row);
    fp4_sim_e4m3_scale(row, V41_COMPRESSED_BLOCK);
}

/// SGLang's fp4 indexer quantiser (query and key kernels), in place, per block of `block`:
/// amax floored at 1e-4, scale from a division, codes with ties to the smaller magnitude.
pub fn fp4_sim_sglang(x: &mut [f32], block: usize) {
    for chunk in x.chunks_mut(block.max(1)) {
        let s = pow2_ceil_bits(amax(chunk).max(FP8_AMAX_FLOOR) / E2M1_MAX);
        for v in chunk.iter_mut() {
            *v = e2m1_to_f32(f32_to_e2m1_sglang(*v / s)) * s;
        }
    }
}

/// SGLang's pack of DeepSeek-V4.1 index keys into its FP4 pool (`fp4_indexer.py`, 64 bytes of
/// e2m1 plus four UE8M0 scales per 128-wide row), in place, per block of `block`: the scale is
/// the power of two at or above `max(amax / 6, 1e-4)` (the floor on `amax / 6`, not on amax as
/// in [`fp4_sim_sglang`]), codes e2m1 with ties to the smaller magnitude. Applied after the
/// release's quantiser ([`fp4_sim_pow2_rne`]) it changes only blocks whose amax is below
/// `6e-4`, where the floor makes the scale coarser.
pub fn fp4_pack_sglang_v41(x: &mut [f32], block: usize) {
    for chunk in x.chunks_mut(block.max(1)) {
        let s = pow2_ceil_bits((amax(chunk) / E2M1_MAX).max(FP8_AMAX_FLOOR));
        for v in chunk.iter_mut() {
            *v = e2m1_to_f32(f32_to_e2m1_sglang(*v / s)) * s;
        }
    }
}

/// SGLang's per-row (per-head) fp8 quantiser into `out`: returns the fp32 scale
/// `fp32(max(amax, 1e-4) / 448)`; `out` holds the e4m3 values `e4m3(clamp(x · fp32(1/scale)))`
/// (in units of the scale).
///
/// # Panics
/// If `out` and `x` differ in length.
pub fn fp8_row_scale_fp32_into(x: &[f32], out: &mut [f32]) -> f32 {
    out.copy_from_slice(x);
    fp8_row_scale_fp32_inplace(out)
}

/// [`fp8_row_scale_fp32_into`] overwriting its input with the e4m3 values.
pub fn fp8_row_scale_fp32_inplace(x: &mut [f32]) -> f32 {
    let scale = amax(x).max(FP8_AMAX_FLOOR) / E4M3_MAX;
    let inv = 1.0 / scale;
    for v in x.iter_mut() {
        *v = e4m3_to_f32(f32_to_e4m3((*v * inv).clamp(-E4M3_MAX, E4M3_MAX)));
    }
    scale
}

/// [`fp8_row_scale_fp32_into`] returning `(e4m3 values, scale)`.
pub fn fp8_row_scale_fp32(x: &[f32]) -> (Vec<f32>, f32) {
    let mut out = vec![0.0; x.len()];
    let s = fp8_row_scale_fp32_into(x, &mut out);
    (out, s)
}

/// vLLM's per-row (per-head) fp8 quantiser into `out` with a power-of-two scale
/// `2^ceil(log2(fp32(max(amax, 1e-4) / 448)))` (exact ceiling of the f32 quotient); returns the
/// scale, `out` holds `e4m3(clamp(x / scale))`.
pub fn fp8_row_scale_pow2_into(x: &[f32], out: &mut [f32]) -> f32 {
    out.copy_from_slice(x);
    fp8_row_scale_pow2_inplace(out)
}

/// [`fp8_row_scale_pow2_into`] overwriting its input with the e4m3 values.
pub fn fp8_row_scale_pow2_inplace(x: &mut [f32]) -> f32 {
    let scale = pow2_ceil_bits(amax(x).max(FP8_AMAX_FLOOR) / E4M3_MAX);
    for v in x.iter_mut() {
        *v = e4m3_to_f32(f32_to_e4m3((*v / scale).clamp(-E4M3_MAX, E4M3_MAX)));
    }
    scale
}

/// [`fp8_row_scale_pow2_into`] returning `(e4m3 values, scale)`.
pub fn fp8_row_scale_pow2(x: &[f32]) -> (Vec<f32>, f32) {
    let mut out = vec![0.0; x.len()];
    let s = fp8_row_scale_pow2_into(x, &mut out);
    (out, s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p2(e: i32) -> f32 {
        2f32.powi(e)
    }

    /// SGLang's V4.1 key pack (`fp4_indexer.py`): a block of normal magnitude already on the
    /// release's grid is unchanged; a tiny block gets the 1e-4 scale floor (here 2^-13 where the
    /// release's quantiser used 2^-15) and ties round to the smaller magnitude (0.75 -> 0.5,
    /// where ties-to-even would give 1.0).
    #[test]
    fn sglang_v41_pack_floors_the_scale_and_ties_down() {
        let mut normal = [3.0f32, -1.5, 0.5, 0.0];
        let before = normal;
        fp4_pack_sglang_v41(&mut normal, 4);
        assert_eq!(normal, before, "amax 3: scale 0.5, every value on the grid");
        let s = p2(-13); // pow2_ceil(max(amax/6, 1e-4)) = pow2_ceil(1e-4) = 2^-13
        let mut tiny = [0.75 * s, 2.5 * s, -1.25 * s, 0.2 * s];
        fp4_pack_sglang_v41(&mut tiny, 4);
        assert_eq!(tiny, [0.5 * s, 2.0 * s, -s, 0.0]);
        // The release's quantiser keeps a finer scale there (floor 6 * 2^-126 on amax).
        let mut release = [3.0 * p2(-15), p2(-15)];
        fp4_sim_pow2_rne(&mut release, 2);
        assert_eq!(release, [3.0 * p2(-15), p2(-15)]);
        fp4_pack_sglang_v41(&mut release, 2);
        assert_eq!(
            release,
            [0.5 * s, 0.0],
            "coarser after the pack: 0.75 -> 0.5 (ties down), 0.25 -> 0"
        );
    }

    #[test]
    fn pow2_ceil_bits_is_exact_ceiling() {
        assert_eq!(pow2_ceil_bits(1.0), 1.0);
        assert_eq!(pow2_ceil_bits(1.0000001), 2.0);
        assert_eq!(pow2_ceil_bits(0.75), 1.0);
        assert_eq!(pow2_ceil_bits(p2(-126)), p2(-126));
        assert_eq!(pow2_ceil_bits(3.0 * p2(-20)), p2(-18));
    }

    #[test]
    fn fp8_sim_pow2_hand_computed_block() {
        // amax 2 -> t = 2·fp32(1/448) in (2^-8, 2^-7) -> s = 2^-7.
        // 1.0/s = 128 exact; -0.3/s = -38.4 -> -40; 0.01/s = 1.28 -> 1.25.
        let mut x = [1.0f32, -0.3, 2.0, 0.01];
        fp8_sim_pow2(&mut x, 64);
        assert_eq!(x, [1.0, -40.0 * p2(-7), 2.0, 1.25 * p2(-7)]);
    }

    #[test]
    fn fp8_sim_pow2_scale_at_exact_power_of_two_uses_reciprocal_multiply() {
        // fp32(1/448) is above 1/448 by 0.37 ulp, yet 448 · fp32(1/448) rounds to exactly 1.0,
        // so s = 1. One ulp above 448 the product is 1 + 2^-23 and the scale doubles.
        assert!(RECIP_448 as f64 > 1.0 / 448.0);
        let t = 448.0f32 * RECIP_448;
        assert_eq!(t, 1.0);
        assert_eq!(pow2_ceil_bits(t), 1.0);
        // The scale shows in the subnormal range: 3·2^-9 is an e4m3 subnormal at s = 1; at s = 2
        // it is 1.5 steps of 2^-8 and ties to 2 steps (even).
        let mut x = [448.0f32, 3.0 * p2(-9)];
        fp8_sim_pow2(&mut x, 64);
        assert_eq!(x, [448.0, 3.0 * p2(-9)], "s = 1");
        let up = f32::from_bits(448.0f32.to_bits() + 1);
        assert_eq!(up * RECIP_448, 1.0 + f32::EPSILON);
        assert_eq!(pow2_ceil_bits(up * RECIP_448), 2.0);
        let mut y = [up, 3.0 * p2(-9)];
        fp8_sim_pow2(&mut y, 64);
        assert_eq!(y, [448.0, p2(-7)], "s = 2");
    }

    #[test]
    fn reciprocal_multiply_and_division_give_same_pow2_scale_over_a_binade() {
        // Every f32 amax in [256, 1024) (two binades around 448): same ue8m0 scale either way.
        let (lo, hi) = (256.0f32.to_bits(), 1024.0f32.to_bits());
        for b in (lo..hi).step_by(7) {
            let a = f32::from_bits(b);
            assert_eq!(
                pow2_ceil_bits(a * RECIP_448),
                pow2_ceil_bits(a / 448.0),
                "amax {a}"
            );
            assert_eq!(
                pow2_ceil_bits(a * RECIP_6),
                pow2_ceil_bits(a / 6.0),
                "fp4 {a}"
            );
        }
    }

    #[test]
    fn fp8_sim_pow2_blocks_are_independent_and_partial_block_allowed() {
        let mut x = [96.0f32, 3.3, 0.001, 0.0011, 0.00013];
        fp8_sim_pow2(&mut x, 2);
        // Block 1: amax 96 -> s = 2^-2: 96·4 = 384 exact; 3.3·4 = 13.2 -> 13 -> 3.25.
        assert_eq!(&x[..2], &[96.0, 3.25]);
        // Block 2: amax 0.0011 -> s = 2^-18; 0.001·2^18 = 262.1 -> 256; 0.0011·2^18 = 288.4 -> 288.
        assert_eq!(&x[2..4], &[256.0 * p2(-18), 288.0 * p2(-18)]);
        // Block 3 (partial): amax floor 1e-4 does not bite (1.3e-4 > 1e-4): s = 2^-21,
        // 0.00013·2^21 = 272.6 -> 288 (step 32 in [256, 448)).
        assert_eq!(x[4], 288.0 * p2(-21));
    }

    #[test]
    fn kv_fp8_sim_rounds_row_to_bf16_and_only_nope_dims_to_e4m3() {
        let mut row = [1.0f32, 1.1, 0.3, 0.0, 1.0 + p2(-9), 1.1];
        kv_fp8_sim(&mut row, 4);
        // bf16 first: 1.1 -> 1.1015625, 0.3 -> 0.30078125. Nope block: amax 1.1015625 -> s = 2^-8:
        // 282 -> 288 (step 32), 77 -> 80 (step 8 in [64, 128)).
        assert_eq!(&row[..4], &[1.0, 288.0 * p2(-8), 80.0 * p2(-8), 0.0]);
        // Rope dims: bf16 only.
        assert_eq!(row[4], 1.0);
        assert_eq!(row[5], bf16_round(1.1));
    }

    /// A Flash KV row (512 = 448 nope + 64 rope): every 64-dim nope block has its own scale, so a
    /// small value next to a huge block keeps its precision; the rope dims get bf16 only.
    #[test]
    fn kv_fp8_sim_scales_each_64_block_of_a_flash_row_on_its_own() {
        let mut row = vec![0.0123f32; 512];
        row[0] = 1.0; // block 0: amax 1 -> s = 2^-8
        for v in &mut row[64..128] {
            *v = 1000.0; // block 1: amax 1000 -> s = 4
        }
        row[384] = 1.0; // block 6 (the last nope block): amax 1
        let alone = {
            let mut first = row[..64].to_vec();
            kv_fp8_sim(&mut first, 64);
            first
        };
        kv_fp8_sim(&mut row, 448);
        // bf16(0.0123) / 2^-8 = 3.148... -> e4m3 3.25 (step 0.25 in [2, 4)). With one scale of 4
        // for 128 dims it would be the subnormal 2^-8 · 4 = 0.015625.
        let small = 3.25 * p2(-8);
        assert_eq!(row[1], small);
        assert_eq!(&row[..64], &alone[..], "block 0 depends on block 1");
        // Block 1 at s = 4: 1000 / 4 = 250 -> e4m3 256 (step 16 in [128, 256)).
        assert_eq!(row[64], 1024.0);
        assert_eq!(row[385], small, "the last nope block");
        // Rope dims 448..512: bf16 rounding only.
        assert!(row[448..].iter().all(|&v| v == bf16_round(0.0123)));
    }

    #[test]
    fn fp4_sim_pow2_rne_hand_computed_block() {
        // amax 3 -> 3·fp32(1/6) = 0.5 exactly -> s = 0.5; x/s = 1.8, -6, 0.4, 2.6 -> 2, -6, 0.5, 3.
        let mut x = [0.9f32, -3.0, 0.2, 1.3];
        fp4_sim_pow2_rne(&mut x, 32);
        assert_eq!(x, [1.0, -3.0, 0.25, 1.5]);
    }

    #[test]
    fn fp4_sims_differ_on_ties_and_floors() {
        let ties = [6.0f32, 0.75, 1.75, 3.5, 2.5, 5.0, 1.25, 0.25];
        let mut rne = ties;
        fp4_sim_pow2_rne(&mut rne, 32);
        assert_eq!(rne, [6.0, 1.0, 2.0, 4.0, 2.0, 4.0, 1.0, 0.0]);
        let mut sgl = ties;
        fp4_sim_sglang(&mut sgl, 32);
        assert_eq!(sgl, [6.0, 0.5, 1.5, 3.0, 2.0, 4.0, 1.0, 0.0]);
        // Tiny block: REF's floor 6·2^-126 keeps it (s = 2^-22, 1e-6/s = 4.19 -> 4); SGLang's
        // 1e-4 floor gives s = 2^-15 and 1e-6/s = 0.033 -> 0.
        let mut tiny = [1e-6f32];
        fp4_sim_pow2_rne(&mut tiny, 32);
        assert_eq!(tiny, [4.0 * p2(-22)]);
        let mut tiny = [1e-6f32];
        fp4_sim_sglang(&mut tiny, 32);
        assert_eq!(tiny, [0.0]);
        // All-zero blocks stay zero under both.
        let mut z = [0.0f32; 4];
        fp4_sim_pow2_rne(&mut z, 2);
        fp4_sim_sglang(&mut z, 2);
        assert_eq!(z, [0.0; 4]);
    }

    #[test]
    fn fp8_row_scale_fp32_divides_for_the_scale() {
        let (q, s) = fp8_row_scale_fp32(&[1.0, -0.5, 0.25, 0.0]);
        assert_eq!(s, 1.0f32 / 448.0);
        assert_eq!(q, vec![448.0, -224.0, 112.0, 0.0]);
        // amax 1.861: the division and the reciprocal multiply differ in the last bit; the
        // scale must be the division.
        let a = 1.861f32;
        assert_ne!(a / 448.0, a * RECIP_448, "precondition: a last-bit case");
        let (q, s) = fp8_row_scale_fp32(&[a, -0.9]);
        assert_eq!(s, a / 448.0);
        assert_eq!(q[0], 448.0);
        // -0.9 · fp32(1/s) = -216.66.. -> -224 (step 16 in [128, 256)).
        assert_eq!(q[1], -224.0);
        // All-zero row: amax floor 1e-4.
        let (q, s) = fp8_row_scale_fp32(&[0.0, 0.0]);
        assert_eq!((q, s), (vec![0.0, 0.0], 1e-4f32 / 448.0));
    }

    /// SGLang multiplies by the f32 reciprocal of its scale, and the product and the quotient
    /// can differ in the last bit, which decides an e4m3 tie: with amax 1.861, x = 0.7643392
    /// gives x · fp32(1/s) = 184 exactly (the midpoint of 176 and 192, ties to the even 192)
    /// but x / s = 183.99998 (-> 176).
    #[test]
    fn fp8_row_scale_fp32_quantises_with_the_reciprocal_of_the_scale() {
        let (a, x) = (1.861f32, 0.764_339_2_f32);
        let s = a / 448.0;
        assert_eq!(x * (1.0 / s), 184.0, "precondition: the product is the tie");
        assert!(x / s < 184.0, "precondition: the quotient is below it");
        let (q, scale) = fp8_row_scale_fp32(&[a, x]);
        assert_eq!(scale, s);
        assert_eq!(q, vec![448.0, 192.0]);
    }

    #[test]
    fn fp8_row_scale_pow2_rounds_scale_up_to_power_of_two() {
        // amax 1 -> fp32(1/448) in (2^-9, 2^-8) -> s = 2^-8: values ·256.
        let (q, s) = fp8_row_scale_pow2(&[1.0, -0.5, 0.3]);
        assert_eq!(s, p2(-8));
        // 0.3·256 = 76.8 -> 80 (step 8 in [64, 128)).
        assert_eq!(q, vec![256.0, -128.0, 80.0]);
        // amax exactly 448·2^-3 = 56: quotient exactly 2^-3, scale 2^-3, 56 -> 448.
        let (q, s) = fp8_row_scale_pow2(&[56.0]);
        assert_eq!((q, s), (vec![448.0], 0.125));
    }
}
