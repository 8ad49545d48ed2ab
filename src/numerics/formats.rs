//! Weight formats over raw row-major bytes, both directions: the checkpoint reader dequantises
//! with these, the synthetic-checkpoint writer quantises with them.
//!
//! | format | weight bytes | scale | value |
//! |---|---|---|---|
//! | FP8 block | e4m3 `[rows, cols]` | e8m0 `[ceil(rows/Bo), ceil(cols/Bi)]` | `e4m3(w) · 2^(S[r/Bo, c/Bi] - 127)` |
//! | FP4 group | packed `[rows, cols/2]` | e8m0 `[rows, ceil(cols/G)]`, G = 32 | `e2m1(nib) · 2^(S[r, c/G] - 127)` |
//! | NVFP4 | packed `[rows, cols/2]` | e4m3 `[rows, ceil(cols/16)]` + f32 `scale_2` | `e2m1(nib) · e4m3(S[r, c/16]) · scale_2` |
//!
//! The FP8 block `Bo x Bi` always comes from the caller (the config's
//! `quantization_config.weight_block_size`: 128x128 in DeepSeek-V4, 32x32 in V4.1); nothing here
//! assumes a size. Packing: byte `j` of a row holds element `2j` in the low nibble and `2j + 1`
//! in the high one. Partial blocks and groups (shapes that are not multiples of the block or G)
//! are allowed everywhere.
//!
//! Encoder choices (only the synthetic writer uses them, so they need to be sensible and
//! deterministic, not bit-compatible with any particular tool):
//! - FP8 block / FP4 group: the smallest power-of-two scale `s` with `amax / s <= 448` (resp. 6),
//!   found exactly in f64; codes are RNE of `x / s` (exact division by a power of two). An
//!   all-zero block gets e8m0 code 127 (scale 1.0). Scales are clamped to 2^-127 ..= 2^127.
//! - NVFP4 (ModelOpt's recipe): `scale_2 = amax_global / (6 · 448)` (f32 division; 1.0 for an
//!   all-zero tensor), group scale `e4m3(amax_group / (6 · scale_2))` with a zero group scale
//!   replaced by 1.0 before the cast, codes RNE of `x / (e4m3(scale) · scale_2)`; a group whose
//!   scale still decodes to 0 gets zero codes.
//!
//! Little-endian byte helpers for bf16, f32, i32 and i64 tensors are at the end.

use super::codecs::{
    e2m1_to_f32, e4m3_to_f32, e8m0_to_f32, f32_to_e2m1_rne, f32_to_e4m3, E2M1_MAX, E4M3_MAX,
};
use super::FormatError;
use rayon::prelude::*;

/// Group size of NVFP4 weight scales.
pub const NVFP4_GROUP: usize = 16;

/// Work (elements) below which dequantisation stays on one thread.
const PAR_MIN_ELEMS: usize = 1 << 16;

fn check_len(what: &'static str, expected: usize, found: usize) -> Result<(), FormatError> {
    if expected == found {
        Ok(())
    } else {
        Err(FormatError::Length {
            what,
            expected,
            found,
        })
    }
}

fn check_block(what: &'static str, block: usize) -> Result<(), FormatError> {
    if block == 0 {
        Err(FormatError::ZeroBlock { what })
    } else {
        Ok(())
    }
}

/// Fills `out` (row-major, `cols` wide) row by row, in parallel for large tensors.
fn fill_rows(out: &mut [f32], cols: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    if cols == 0 {
        return;
    }
    if out.len() >= PAR_MIN_ELEMS {
        out.par_chunks_mut(cols)
            .enumerate()
            .for_each(|(r, row)| f(r, row));
    } else {
        out.chunks_mut(cols)
            .enumerate()
            .for_each(|(r, row)| f(r, row));
    }
}

/// Smallest `e` in [-127, 127] with `amax <= limit · 2^e`, computed exactly in f64.
/// Zero (or NaN) amax gives 0, i.e. scale 1.0.
fn smallest_pow2_exponent(amax: f32, limit: f32) -> i32 {
    if amax.is_nan() || amax <= 0.0 {
        return 0;
    }
    if amax.is_infinite() {
        return 127;
    }
    let (a, l) = (amax as f64, limit as f64);
    let mut e = ((a / l).log2().ceil() as i32).clamp(-200, 200);
    while a > l * 2f64.powi(e) {
        e += 1;
    }
    while a <= l * 2f64.powi(e - 1) {
        e -= 1;
    }
    e.clamp(-127, 127)
}

/// `x / 2^e` as f32 (exact in f64, one rounding at most, only below f32's normal range).
fn div_pow2(x: f32, e: i32) -> f32 {
    (x as f64 * 2f64.powi(-e)) as f32
}

fn amax(xs: impl Iterator<Item = f32>) -> f32 {
    xs.fold(0.0f32, |m, v| m.max(v.abs()))
}

// ---------------------------------------------------------------------------------------------
// FP8 block (e4m3 weights, e8m0 block scales)

/// Dequantises an FP8 block-scaled weight with square `block x block` tiles:
/// `W[r,c] = e4m3(w[r,c]) · 2^(S[r/block, c/block] - 127)` ([`dequant_fp8_block_rect`]).
pub fn dequant_fp8_block(
    w: &[u8],
    scale: &[u8],
    rows: usize,
    cols: usize,
    block: usize,
) -> Result<Vec<f32>, FormatError> {
    dequant_fp8_block_rect(w, scale, rows, cols, (block, block))
}

/// Dequantises an FP8 block-scaled weight with `(bo, bi)` tiles (`bo` rows by `bi` columns):
/// `W[r,c] = e4m3(w[r,c]) · 2^(S[r/bo, c/bi] - 127)`, scales `[ceil(rows/bo), ceil(cols/bi)]`.
pub fn dequant_fp8_block_rect(
    w: &[u8],
    scale: &[u8],
    rows: usize,
    cols: usize,
    (bo, bi): (usize, usize),
) -> Result<Vec<f32>, FormatError> {
    check_block("fp8 block rows", bo)?;
    check_block("fp8 block columns", bi)?;
    check_len("fp8 block weight", rows * cols, w.len())?;
    let sc = cols.div_ceil(bi);
    check_len("fp8 block scale", rows.div_ceil(bo) * sc, scale.len())?;
    let mut out = vec![0.0f32; rows * cols];
    fill_rows(&mut out, cols, |r, row| {
        let srow = &scale[(r / bo) * sc..(r / bo + 1) * sc];
        let wrow = &w[r * cols..(r + 1) * cols];
        // One scale per block of `bi` columns, decoded once.
        for ((o, wb), &s) in row.chunks_mut(bi).zip(wrow.chunks(bi)).zip(srow) {
            let s = e8m0_to_f32(s);
            for (o, &b) in o.iter_mut().zip(wb) {
                *o = e4m3_to_f32(b) * s;
            }
        }
    });
    Ok(out)
}

/// Quantises to FP8 block format: returns (e4m3 codes `[rows, cols]`, e8m0 scales
/// `[ceil(rows/block), ceil(cols/block)]`). See the module doc for the scale choice.
pub fn quant_fp8_block(
    x: &[f32],
    rows: usize,
    cols: usize,
    block: usize,
) -> Result<(Vec<u8>, Vec<u8>), FormatError> {
    check_block("fp8 block", block)?;
    check_len("fp8 block input", rows * cols, x.len())?;
    let (br, bc) = (rows.div_ceil(block), cols.div_ceil(block));
    let mut codes = vec![0u8; rows * cols];
    let mut scales = vec![0u8; br * bc];
    for bi in 0..br {
        let r_range = bi * block..((bi + 1) * block).min(rows);
        for bj in 0..bc {
            let c_range = bj * block..((bj + 1) * block).min(cols);
            let block_vals = r_range
                .clone()
                .flat_map(|r| x[r * cols + c_range.start..r * cols + c_range.end].iter());
            let e = smallest_pow2_exponent(amax(block_vals.copied()), E4M3_MAX);
            scales[bi * bc + bj] = (e + 127) as u8;
            for r in r_range.clone() {
                for c in c_range.clone() {
                    codes[r * cols + c] = f32_to_e4m3(div_pow2(x[r * cols + c], e));
                }
            }
        }
    }
    Ok((codes, scales))
}

// ---------------------------------------------------------------------------------------------
// FP4 group (packed e2m1, e8m0 scales per `group` columns): the official routed experts

/// The e2m1 code of element `c` of a packed row (low nibble = even element).
#[inline]
pub fn packed_fp4_code(row: &[u8], c: usize) -> u8 {
    let b = row[c / 2];
    if c.is_multiple_of(2) {
        b & 0x0F
    } else {
        b >> 4
    }
}

fn check_fp4_shape(
    what: &'static str,
    packed: &[u8],
    rows: usize,
    cols: usize,
) -> Result<(), FormatError> {
    if !cols.is_multiple_of(2) {
        return Err(FormatError::OddColumns { cols });
    }
    check_len(what, rows * cols / 2, packed.len())
}

/// Dequantises an FP4 group-scaled weight: `W[r,c] = e2m1(nib) · 2^(S[r, c/group] - 127)`.
pub fn dequant_fp4_group(
    packed: &[u8],
    scale: &[u8],
    rows: usize,
    cols: usize,
    group: usize,
) -> Result<Vec<f32>, FormatError> {
    check_block("fp4 group", group)?;
    check_fp4_shape("fp4 packed weight (bytes)", packed, rows, cols)?;
    let sc = cols.div_ceil(group);
    check_len("fp4 group scale", rows * sc, scale.len())?;
    let mut out = vec![0.0f32; rows * cols];
    fill_rows(&mut out, cols, |r, row| {
        let prow = &packed[r * cols / 2..(r + 1) * cols / 2];
        let srow = &scale[r * sc..(r + 1) * sc];
        if group.is_multiple_of(2) {
            // Whole bytes per group: two codes per byte, one scale per group decoded once.
            for ((o, pb), &s) in row.chunks_mut(group).zip(prow.chunks(group / 2)).zip(srow) {
                let s = e8m0_to_f32(s);
                for (o2, &b) in o.chunks_mut(2).zip(pb) {
                    o2[0] = e2m1_to_f32(b & 0x0F) * s;
                    if let Some(hi) = o2.get_mut(1) {
                        *hi = e2m1_to_f32(b >> 4) * s;
                    }
                }
            }
        } else {
            for (c, o) in row.iter_mut().enumerate() {
                *o = e2m1_to_f32(packed_fp4_code(prow, c)) * e8m0_to_f32(srow[c / group]);
            }
        }
    });
    Ok(out)
}

/// Packs e2m1 codes (`[rows, cols]`, one per byte, low nibble used) two per byte.
fn pack_codes(codes: &[u8]) -> Vec<u8> {
    codes
        .chunks_exact(2)
        .map(|p| (p[0] & 0x0F) | ((p[1] & 0x0F) << 4))
        .collect()
}

/// Quantises to FP4 group format: returns (packed codes `[rows, cols/2]`, e8m0 scales
/// `[rows, ceil(cols/group)]`).
pub fn quant_fp4_group(
    x: &[f32],
    rows: usize,
    cols: usize,
    group: usize,
) -> Result<(Vec<u8>, Vec<u8>), FormatError> {
    check_block("fp4 group", group)?;
    if !cols.is_multiple_of(2) {
        return Err(FormatError::OddColumns { cols });
    }
    check_len("fp4 group input", rows * cols, x.len())?;
    let sc = cols.div_ceil(group);
    let mut codes = vec![0u8; rows * cols];
    let mut scales = vec![0u8; rows * sc];
    for r in 0..rows {
        for g in 0..sc {
            let range = r * cols + g * group..r * cols + ((g + 1) * group).min(cols);
            let e = smallest_pow2_exponent(amax(x[range.clone()].iter().copied()), E2M1_MAX);
            scales[r * sc + g] = (e + 127) as u8;
            for i in range {
                codes[i] = f32_to_e2m1_rne(div_pow2(x[i], e));
            }
        }
    }
    Ok((pack_codes(&codes), scales))
}

// ---------------------------------------------------------------------------------------------
// NVFP4 (NVIDIA ModelOpt): packed e2m1, e4m3 scales per 16 columns, one f32 global scale

/// Dequantises NVFP4: `W[r,c] = e2m1(nib) · e4m3(scale[r, c/16]) · scale_2`.
pub fn dequant_nvfp4(
    packed: &[u8],
    scale: &[u8],
    scale_2: f32,
    rows: usize,
    cols: usize,
) -> Result<Vec<f32>, FormatError> {
    check_fp4_shape("nvfp4 packed weight (bytes)", packed, rows, cols)?;
    let sc = cols.div_ceil(NVFP4_GROUP);
    check_len("nvfp4 weight_scale", rows * sc, scale.len())?;
    let mut out = vec![0.0f32; rows * cols];
    fill_rows(&mut out, cols, |r, row| {
        let prow = &packed[r * cols / 2..(r + 1) * cols / 2];
        let srow = &scale[r * sc..(r + 1) * sc];
        for (c, o) in row.iter_mut().enumerate() {
            let s = e4m3_to_f32(srow[c / NVFP4_GROUP]) * scale_2;
            *o = e2m1_to_f32(packed_fp4_code(prow, c)) * s;
        }
    });
    Ok(out)
}

/// Quantises to NVFP4: returns (packed codes `[rows, cols/2]`, e4m3 group scales
/// `[rows, ceil(cols/16)]`, `scale_2`). See the module doc for the recipe.
pub fn quant_nvfp4(
    x: &[f32],
    rows: usize,
    cols: usize,
) -> Result<(Vec<u8>, Vec<u8>, f32), FormatError> {
    if !cols.is_multiple_of(2) {
        return Err(FormatError::OddColumns { cols });
    }
    check_len("nvfp4 input", rows * cols, x.len())?;
    let global = amax(x.iter().copied());
    let scale_2 = if global > 0.0 && global.is_finite() {
        global / (E2M1_MAX * E4M3_MAX)
    } else {
        1.0
    };
    let sc = cols.div_ceil(NVFP4_GROUP);
    let mut codes = vec![0u8; rows * cols];
    let mut scales = vec![0u8; rows * sc];
    for r in 0..rows {
        for g in 0..sc {
            let range = r * cols + g * NVFP4_GROUP..r * cols + ((g + 1) * NVFP4_GROUP).min(cols);
            let mut s = amax(x[range.clone()].iter().copied()) / (E2M1_MAX * scale_2);
            if s == 0.0 {
                s = 1.0;
            }
            let s_code = f32_to_e4m3(s);
            scales[r * sc + g] = s_code;
            let denom = e4m3_to_f32(s_code) * scale_2;
            for i in range {
                codes[i] = if denom > 0.0 {
                    f32_to_e2m1_rne(x[i] / denom)
                } else {
                    0
                };
            }
        }
    }
    Ok((pack_codes(&codes), scales, scale_2))
}

// ---------------------------------------------------------------------------------------------
// Little-endian element helpers

fn check_width(what: &'static str, len: usize, width: usize) -> Result<(), FormatError> {
    if len.is_multiple_of(width) {
        Ok(())
    } else {
        Err(FormatError::ByteLength { what, len, width })
    }
}

/// bf16 little-endian bytes -> f32 values (exact).
pub fn bf16_bytes_to_f32(bytes: &[u8]) -> Result<Vec<f32>, FormatError> {
    check_width("bf16 tensor", bytes.len(), 2)?;
    // Fixed-size pairs (not `chunks_exact`) so the conversion vectorises: this decodes every
    // band of a streamed bf16 weight (the LM head) on every product.
    let (pairs, _) = bytes.as_chunks::<2>();
    Ok(pairs
        .iter()
        .map(|&b| f32::from_bits((u16::from_le_bytes(b) as u32) << 16))
        .collect())
}

/// f32 little-endian bytes -> f32 values.
pub fn f32_bytes_to_f32(bytes: &[u8]) -> Result<Vec<f32>, FormatError> {
    check_width("f32 tensor", bytes.len(), 4)?;
    let (words, _) = bytes.as_chunks::<4>();
    Ok(words.iter().map(|&b| f32::from_le_bytes(b)).collect())
}

/// i32 little-endian bytes -> values.
pub fn i32_bytes_to_i32(bytes: &[u8]) -> Result<Vec<i32>, FormatError> {
    check_width("i32 tensor", bytes.len(), 4)?;
    Ok(bytes
        .chunks_exact(4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

/// i64 little-endian bytes -> values.
pub fn i64_bytes_to_i64(bytes: &[u8]) -> Result<Vec<i64>, FormatError> {
    check_width("i64 tensor", bytes.len(), 8)?;
    Ok(bytes
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().expect("chunk of 8")))
        .collect())
}

/// f32 values -> bf16 little-endian bytes (round to nearest even).
pub fn f32_to_bf16_bytes(xs: &[f32]) -> Vec<u8> {
    xs.iter()
        .flat_map(|&x| half::bf16::from_f32(x).to_bits().to_le_bytes())
        .collect()
}

/// f32 values -> f32 little-endian bytes.
pub fn f32_to_f32_bytes(xs: &[f32]) -> Vec<u8> {
    xs.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// i32 values -> little-endian bytes.
pub fn i32_to_bytes(xs: &[i32]) -> Vec<u8> {
    xs.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// i64 values -> little-endian bytes.
pub fn i64_to_bytes(xs: &[i64]) -> Vec<u8> {
    xs.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    //! Tests of `formats.rs` (kept in their own file so both stay short): hand-checked decodes,
    //! exact round trips on odd shapes, and size errors instead of panics.

    use super::*;
    use crate::numerics::codecs::{e8m0_to_f32, E2M1_TO_F32, E4M3_TO_F32};

    use crate::numerics::rng::Rng;

    /// A random non-NaN e4m3 code.
    fn e4m3_code(rng: &mut Rng) -> u8 {
        loop {
            let b = rng.below(256) as u8;
            if b & 0x7F != 0x7F {
                return b;
            }
        }
    }

    fn assert_same_bits(got: &[f32], want: &[f32], what: &str) {
        assert_eq!(got.len(), want.len(), "{what}: length");
        if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
            panic!(
                "{what}: first difference at {i}: got {} want {}",
                got[i], want[i]
            );
        }
    }

    #[test]
    fn fp8_block_dequant_small_shape_by_hand() {
        // 3x5 with block 128: a single scale 2^(125-127) = 0.25.
        let w = [
            0x38u8, 0xB8, 0x7E, 0x01, 0x00, 0x40, 0x30, 0x80, 0x08, 0x3C, 0x44, 0x48, 0xC0, 0x39,
            0x3A,
        ];
        let got = dequant_fp8_block(&w, &[125], 3, 5, 128).unwrap();
        let want: Vec<f32> = w.iter().map(|&b| E4M3_TO_F32[b as usize] * 0.25).collect();
        assert_same_bits(&got, &want, "3x5");
        assert_eq!(got[0], 0.25);
        assert_eq!(got[1], -0.25);
        assert_eq!(got[2], 112.0);
        assert_eq!(got[3], 2f32.powi(-11));
    }

    #[test]
    fn fp8_block_dequant_uses_the_partial_block_scale_on_odd_shapes() {
        let (rows, cols) = (130, 200);
        let w = vec![0x38u8; rows * cols]; // every element 1.0
        let scale = [127u8, 128, 129, 130]; // 2x2 grid: 1, 2, 4, 8
        let got = dequant_fp8_block(&w, &scale, rows, cols, 128).unwrap();
        assert_eq!(got[0], 1.0);
        assert_eq!(got[127], 1.0);
        assert_eq!(got[128], 2.0);
        assert_eq!(got[199], 2.0);
        assert_eq!(got[128 * cols], 4.0);
        assert_eq!(got[129 * cols + 127], 4.0);
        assert_eq!(got[129 * cols + 199], 8.0);
    }

    #[test]
    fn fp8_block_round_trip_is_exact_on_representable_input() {
        for &(rows, cols) in &[(130usize, 200usize), (3, 5), (128, 128), (257, 1)] {
            let mut rng = Rng::new(0x9E37_79B9 ^ (rows * 1000 + cols) as u64);
            let (br, bc) = (rows.div_ceil(128), cols.div_ceil(128));
            let scale: Vec<u8> = (0..br * bc).map(|_| 110 + rng.below(30) as u8).collect();
            let mut w: Vec<u8> = (0..rows * cols).map(|_| e4m3_code(&mut rng)).collect();
            // Plant ±448 in every block so the quantiser must pick exactly the same scale.
            for bi in 0..br {
                for bj in 0..bc {
                    w[bi * 128 * cols + bj * 128] = if rng.below(2) == 0 { 0x7E } else { 0xFE };
                }
            }
            let x = dequant_fp8_block(&w, &scale, rows, cols, 128).unwrap();
            let (w2, scale2) = quant_fp8_block(&x, rows, cols, 128).unwrap();
            assert_eq!(scale2, scale, "{rows}x{cols} scales");
            if let Some(i) = (0..w.len()).find(|&i| w[i] != w2[i]) {
                panic!(
                    "{rows}x{cols}: code {i}: got {:#04x} want {:#04x}",
                    w2[i], w[i]
                );
            }
        }
    }

    #[test]
    fn fp8_block_quant_picks_smallest_pow2_scale_and_zero_block_gets_one() {
        // amax 449 > 448 -> scale 2; amax exactly 448 -> scale 1; all zero -> code 127 (1.0).
        let x = [449.0f32, 1.0, 448.0, -3.0, 0.0, 0.0];
        let (_, s) = quant_fp8_block(&x[0..2], 1, 2, 128).unwrap();
        assert_eq!(e8m0_to_f32(s[0]), 2.0);
        let (_, s) = quant_fp8_block(&x[2..4], 1, 2, 128).unwrap();
        assert_eq!(e8m0_to_f32(s[0]), 1.0);
        let (w, s) = quant_fp8_block(&x[4..6], 1, 2, 128).unwrap();
        assert_eq!((w, s), (vec![0, 0], vec![127]));
        // Small values: amax 0.001 -> 2^-18 (0.001/2^-18 = 262 <= 448, /2^-19 = 524 > 448).
        let (_, s) = quant_fp8_block(&[0.001], 1, 1, 128).unwrap();
        assert_eq!(e8m0_to_f32(s[0]), 2f32.powi(-18));
    }

    #[test]
    fn fp8_block_rejects_bad_sizes_without_panicking() {
        assert!(matches!(
            dequant_fp8_block(&[0; 14], &[127], 3, 5, 128),
            Err(FormatError::Length {
                expected: 15,
                found: 14,
                ..
            })
        ));
        assert!(matches!(
            dequant_fp8_block(&[0; 15], &[127, 127], 3, 5, 128),
            Err(FormatError::Length {
                expected: 1,
                found: 2,
                ..
            })
        ));
        assert!(matches!(
            dequant_fp8_block(&[0; 15], &[127], 3, 5, 0),
            Err(FormatError::ZeroBlock { .. })
        ));
        assert!(quant_fp8_block(&[0.0; 3], 2, 2, 128).is_err());
        assert!(matches!(
            dequant_fp8_block_rect(&[0; 15], &[127], 3, 5, (4, 0)),
            Err(FormatError::ZeroBlock { .. })
        ));
    }

    #[test]
    fn fp8_rect_blocks_index_rows_and_columns_by_their_own_edge() {
        // [5, 7] in 2x3 tiles: a [3, 3] grid, last tile row and column partial. Every code is
        // 0x38 (1.0), so each element is its tile's scale: 2^(tile index).
        let (rows, cols) = (5usize, 7usize);
        let scale: Vec<u8> = (0..9).map(|t| 127 + t as u8).collect();
        let got = dequant_fp8_block_rect(&[0x38; 35], &scale, rows, cols, (2, 3)).unwrap();
        for r in 0..rows {
            for c in 0..cols {
                let tile = (r / 2) * 3 + c / 3;
                assert_eq!(got[r * cols + c], 2f32.powi(tile as i32), "({r}, {c})");
            }
        }
        // The square entry point is the rectangular one with equal edges.
        let sq = dequant_fp8_block(&[0x38; 35], &scale[..4], rows, cols, 4).unwrap();
        let rect = dequant_fp8_block_rect(&[0x38; 35], &scale[..4], rows, cols, (4, 4)).unwrap();
        assert_eq!(sq, rect);
    }

    #[test]
    fn fp4_nibble_order_is_low_then_high() {
        // Byte 0x21: element 0 = code 1 (0.5), element 1 = code 2 (1.0); byte 0xF7: 6, -6.
        let got = dequant_fp4_group(&[0x21, 0xF7], &[128], 1, 4, 32).unwrap();
        assert_eq!(got, vec![1.0, 2.0, 12.0, -12.0]);
        let (packed, scale) = quant_fp4_group(&[1.0, 2.0, 12.0, -12.0], 1, 4, 32).unwrap();
        assert_eq!((packed, scale), (vec![0x21, 0xF7], vec![128]));
    }

    #[test]
    fn fp4_group_round_trip_is_exact_on_odd_shapes() {
        for &(rows, cols) in &[(5usize, 64usize), (3, 70), (1, 2)] {
            let mut rng = Rng::new(0xDEAD_BEEF ^ (rows * 100 + cols) as u64);
            let sc = cols.div_ceil(32);
            let scale: Vec<u8> = (0..rows * sc).map(|_| 115 + rng.below(20) as u8).collect();
            let mut codes: Vec<u8> = (0..rows * cols).map(|_| rng.below(16) as u8).collect();
            for r in 0..rows {
                for g in 0..sc {
                    codes[r * cols + g * 32] = 0x7 | (rng.below(2) as u8) << 3; // ±6
                }
            }
            let packed: Vec<u8> = codes.chunks(2).map(|p| p[0] | p[1] << 4).collect();
            let x = dequant_fp4_group(&packed, &scale, rows, cols, 32).unwrap();
            for (i, &c) in codes.iter().enumerate() {
                let want =
                    E2M1_TO_F32[c as usize] * e8m0_to_f32(scale[(i / cols) * sc + (i % cols) / 32]);
                assert_eq!(x[i].to_bits(), want.to_bits(), "{rows}x{cols} element {i}");
            }
            let (packed2, scale2) = quant_fp4_group(&x, rows, cols, 32).unwrap();
            assert_eq!(scale2, scale, "{rows}x{cols} scales");
            assert_eq!(packed2, packed, "{rows}x{cols} packed codes");
        }
    }

    #[test]
    fn fp4_group_rejects_odd_columns_and_bad_lengths() {
        assert_eq!(
            dequant_fp4_group(&[0; 3], &[127], 2, 3, 32),
            Err(FormatError::OddColumns { cols: 3 })
        );
        assert!(matches!(
            dequant_fp4_group(&[0; 3], &[127; 2], 2, 4, 32),
            Err(FormatError::Length {
                expected: 4,
                found: 3,
                ..
            })
        ));
        assert!(quant_fp4_group(&[0.0; 6], 2, 3, 32).is_err());
        assert!(dequant_nvfp4(&[0; 2], &[0; 1], 1.0, 1, 4).is_ok());
        assert!(matches!(
            dequant_nvfp4(&[0; 2], &[0; 2], 1.0, 1, 4),
            Err(FormatError::Length {
                expected: 1,
                found: 2,
                ..
            })
        ));
    }

    #[test]
    fn nvfp4_dequant_matches_formula_by_hand() {
        // One row of 32: group 0 scale e4m3 0x38 (1.0), group 1 scale 0x40 (2.0); scale_2 = 0.5.
        let mut packed = vec![0u8; 16];
        packed[0] = 0x72; // elements 0, 1 = codes 2 (1.0), 7 (6.0)
        packed[8] = 0x0D; // elements 16, 17 = codes 13 (-3.0), 0
        let got = dequant_nvfp4(&packed, &[0x38, 0x40], 0.5, 1, 32).unwrap();
        assert_eq!(got[0], 0.5);
        assert_eq!(got[1], 3.0);
        assert_eq!(got[16], -3.0);
        assert_eq!(got.iter().filter(|v| **v != 0.0).count(), 3);
    }

    #[test]
    fn nvfp4_round_trip_is_exact_when_scales_are_consistent() {
        // scale_2 = 2^-10 and the global amax 6·448·2^-10 make every quantiser step exact.
        let (rows, cols) = (3usize, 48usize);
        let mut rng = Rng::new(42);
        let sc = cols / 16;
        let mut scale: Vec<u8> = (0..rows * sc)
            .map(|_| 0x20 + rng.below(0x50) as u8)
            .collect();
        scale[4] = 0x7E; // the group holding the global max
        let mut codes: Vec<u8> = (0..rows * cols).map(|_| rng.below(16) as u8).collect();
        for g in 0..rows * sc {
            codes[g * 16 + 3] = 0x7 | (rng.below(2) as u8) << 3; // ±6 in every group
        }
        let packed: Vec<u8> = codes.chunks(2).map(|p| p[0] | p[1] << 4).collect();
        let x = dequant_nvfp4(&packed, &scale, 2f32.powi(-10), rows, cols).unwrap();
        let (packed2, scale2, s2) = quant_nvfp4(&x, rows, cols).unwrap();
        assert_eq!(s2, 2f32.powi(-10));
        assert_eq!(scale2, scale);
        assert_eq!(packed2, packed);
    }

    #[test]
    fn nvfp4_quant_of_zero_tensor_is_defined() {
        let (packed, scale, s2) = quant_nvfp4(&[0.0; 32], 1, 32).unwrap();
        assert_eq!(s2, 1.0);
        assert!(packed.iter().all(|&b| b == 0));
        assert_eq!(scale, vec![0x38, 0x38], "zero group scale replaced by 1.0");
    }

    #[test]
    fn byte_helpers_round_trip_little_endian() {
        let xs = [1.0f32, -2.5, 3.0e-3, f32::MAX];
        assert_eq!(f32_bytes_to_f32(&f32_to_f32_bytes(&xs)).unwrap(), xs);
        assert_eq!(f32_to_f32_bytes(&[1.0])[..], [0x00, 0x00, 0x80, 0x3F]);
        let b = f32_to_bf16_bytes(&[1.0, -2.0, 1.0 + 2f32.powi(-8)]);
        assert_eq!(b, vec![0x80, 0x3F, 0x00, 0xC0, 0x80, 0x3F]);
        assert_eq!(bf16_bytes_to_f32(&b).unwrap(), vec![1.0, -2.0, 1.0]);
        let is = [0i64, -1, i64::MAX, 1 << 40];
        assert_eq!(i64_bytes_to_i64(&i64_to_bytes(&is)).unwrap(), is);
        let js = [7i32, -9];
        assert_eq!(i32_bytes_to_i32(&i32_to_bytes(&js)).unwrap(), js);
        assert!(matches!(
            bf16_bytes_to_f32(&[0; 3]),
            Err(FormatError::ByteLength { width: 2, .. })
        ));
        assert!(f32_bytes_to_f32(&[0; 6]).is_err());
        assert!(i64_bytes_to_i64(&[0; 12]).is_err());
    }
}
