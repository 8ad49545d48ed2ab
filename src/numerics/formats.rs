//! Weight formats over raw row-major bytes, both directions: the checkpoint reader dequantises
//! with these, the synthetic-checkpoint writer quantises with them.
//!
//! | format | weight bytes | scale | value |
//! |---|---|---|---|
//! | FP8 block | e4m3 `[rows, cols]` | e8m0 `[ceil(rows/B), ceil(cols/B)]`, B = 128 | `e4m3(w) · 2^(S[r/B, c/B] - 127)` |
//! | FP4 group | packed `[rows, cols/2]` | e8m0 `[rows, ceil(cols/G)]`, G = 32 | `e2m1(nib) · 2^(S[r, c/G] - 127)` |
//! | NVFP4 | packed `[rows, cols/2]` | e4m3 `[rows, ceil(cols/16)]` + f32 `scale_2` | `e2m1(nib) · e4m3(S[r, c/16]) · scale_2` |
//!
//! Packing: byte `j` of a row holds element `2j` in the low nibble and `2j + 1` in the high one.
//! Partial blocks and groups (shapes that are not multiples of B or G) are allowed everywhere.
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

/// Dequantises an FP8 block-scaled weight: `W[r,c] = e4m3(w[r,c]) · 2^(S[r/block, c/block] - 127)`.
pub fn dequant_fp8_block(
    w: &[u8],
    scale: &[u8],
    rows: usize,
    cols: usize,
    block: usize,
) -> Result<Vec<f32>, FormatError> {
    check_block("fp8 block", block)?;
    check_len("fp8 block weight", rows * cols, w.len())?;
    let sc = cols.div_ceil(block);
    check_len("fp8 block scale", rows.div_ceil(block) * sc, scale.len())?;
    let mut out = vec![0.0f32; rows * cols];
    fill_rows(&mut out, cols, |r, row| {
        let srow = &scale[(r / block) * sc..(r / block + 1) * sc];
        let wrow = &w[r * cols..(r + 1) * cols];
        for (c, (o, &b)) in row.iter_mut().zip(wrow).enumerate() {
            *o = e4m3_to_f32(b) * e8m0_to_f32(srow[c / block]);
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
        for (c, o) in row.iter_mut().enumerate() {
            *o = e2m1_to_f32(packed_fp4_code(prow, c)) * e8m0_to_f32(srow[c / group]);
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
    Ok(bytes
        .chunks_exact(2)
        .map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16))
        .collect())
}

/// f32 little-endian bytes -> f32 values.
pub fn f32_bytes_to_f32(bytes: &[u8]) -> Result<Vec<f32>, FormatError> {
    check_width("f32 tensor", bytes.len(), 4)?;
    Ok(bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
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
#[path = "formats_tests.rs"]
mod tests;
