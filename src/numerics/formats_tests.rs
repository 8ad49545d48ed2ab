//! Tests of `formats.rs` (kept in their own file so both stay short): hand-checked decodes,
//! exact round trips on odd shapes, and size errors instead of panics.

use super::*;
use crate::numerics::codecs::{e8m0_to_f32, E2M1_TO_F32, E4M3_TO_F32};

/// Tiny deterministic generator for test data (xorshift64*).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

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
        0x38u8, 0xB8, 0x7E, 0x01, 0x00, 0x40, 0x30, 0x80, 0x08, 0x3C, 0x44, 0x48, 0xC0, 0x39, 0x3A,
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
        let mut rng = Rng(0x9E37_79B9 ^ (rows * 1000 + cols) as u64);
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
        let mut rng = Rng(0xDEAD_BEEF ^ (rows * 100 + cols) as u64);
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
    let mut rng = Rng(42);
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
