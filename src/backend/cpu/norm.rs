//! RMS norm and RoPE on the CPU reference backend (`Backend::rms_norm`, `Backend::rope`).
//!
//! RMS norm accumulates the mean square in f64 in [`RMS_LANES`] interleaved lanes (one
//! rounding to f32 at the end), the order the GPU's `el_rms_lanes` also sums in; RoPE
//! evaluates cos / sin per position in f64 (see `numerics::rope`). Shapes: `x` is `[n, dim]` for
//! the norm, `[P, vectors, vec_len]` for RoPE with the rotated dims at the end of each vector.

use crate::numerics::rope::{rotate_pairs, RopeTable};
use rayon::prelude::*;

/// Interleaved partial sums of [`rms_scale`]: lane `l` adds the squares of elements `l`,
/// `l + RMS_LANES`, ... (so a GPU sums each vector with `RMS_LANES` threads reading adjacent
/// elements, and gets these bits).
pub const RMS_LANES: usize = 32;

/// `1 / sqrt(mean(v²) + eps)` rounded to f32: squares summed in f64 in [`RMS_LANES`]
/// interleaved lanes (each in element order), the lanes then added in order from 0.0.
pub fn rms_scale(v: &[f32], eps: f32) -> f32 {
    let mut lanes = [0.0f64; RMS_LANES];
    for block in v.chunks(RMS_LANES) {
        for (lane, &a) in lanes.iter_mut().zip(block) {
            *lane += (a as f64) * (a as f64);
        }
    }
    let sum = lanes.iter().fold(0.0f64, |s, &l| s + l);
    let mean_sq = sum / v.len() as f64;
    (1.0 / (mean_sq + eps as f64).sqrt()) as f32
}

/// In-place RMS norm of every `dim`-long vector of `x`.
pub fn rms_norm(x: &mut [f32], dim: usize, weight: Option<&[f32]>, eps: f32) {
    assert_eq!(x.len() % dim, 0, "rms_norm: length not a multiple of dim");
    if let Some(w) = weight {
        assert_eq!(w.len(), dim, "rms_norm: weight length");
    }
    let norm_one = |v: &mut [f32]| {
        let r = rms_scale(v, eps);
        match weight {
            Some(w) => v.iter_mut().zip(w).for_each(|(a, &wi)| *a = *a * r * wi),
            None => v.iter_mut().for_each(|a| *a *= r),
        }
    };
    if x.len() >= 1 << 14 {
        x.par_chunks_mut(dim).for_each(norm_one);
    } else {
        x.chunks_mut(dim).for_each(norm_one);
    }
}

/// In-place RoPE, see [`crate::backend::Backend::rope`].
pub fn rope(table: &RopeTable, x: &mut [f32], vec_len: usize, positions: &[usize], inverse: bool) {
    if positions.is_empty() {
        return;
    }
    let per_pos = x.len() / positions.len();
    assert_eq!(
        per_pos * positions.len(),
        x.len(),
        "rope: x not [P, vecs, len]"
    );
    assert_eq!(
        per_pos % vec_len,
        0,
        "rope: row not a whole number of vectors"
    );
    let d_r = table.rope_dim();
    assert!(d_r <= vec_len, "rope: rope dims exceed the vector");
    x.par_chunks_mut(per_pos)
        .zip(positions.par_iter())
        .for_each(|(row, &pos)| {
            let (mut cos, mut sin) = (vec![0.0f32; d_r / 2], vec![0.0f32; d_r / 2]);
            table.cos_sin(pos, &mut cos, &mut sin);
            for v in row.chunks_exact_mut(vec_len) {
                rotate_pairs(&mut v[vec_len - d_r..], &cos, &sin, inverse);
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_scale_sums_in_lanes_to_the_plain_formula() {
        // Lengths around and across the lane count; values of mixed magnitude.
        for n in [1usize, 5, 31, 32, 33, 100, 16384] {
            let v: Vec<f32> = (0..n)
                .map(|i| ((i * 7919 % 1009) as f32 - 504.0) * if i % 3 == 0 { 1e3 } else { 1e-2 })
                .collect();
            let plain = v.iter().map(|&a| (a as f64) * (a as f64)).sum::<f64>() / n as f64;
            let want = (1.0 / (plain + 1e-6).sqrt()) as f32;
            let got = rms_scale(&v, 1e-6);
            assert!(
                (got - want).abs() <= want * 1e-7,
                "{n} values: {got} vs {want}"
            );
        }
        // Lanes: element 32 joins lane 0 after element 0, then lanes add in order.
        let mut v = vec![0.0f32; 33];
        v[0] = 3.0;
        v[32] = 4.0;
        assert_eq!(rms_scale(&v, 0.0), (1.0 / (25.0f64 / 33.0).sqrt()) as f32);
        // eps inside the root: 1/sqrt(0 + 1e-6) = 1000 and 1/sqrt(1e-6 + 1e-6) = 707.1...
        // (eps outside, 1/(sqrt(ms) + eps), would give 1e6 and 999).
        assert!((rms_scale(&[0.0; 32], 1e-6) - 1000.0).abs() < 1e-3);
        let small = rms_scale(&[1e-3; 32], 1e-6);
        assert!((small - (0.5e6f64).sqrt() as f32).abs() < 1e-3, "{small}");
    }

    #[test]
    fn rms_norm_weighted_and_unweighted() {
        let mut x = vec![3.0f32, 4.0, 0.0, 0.0];
        rms_norm(&mut x, 2, None, 1e-20);
        let r = (12.5f32).sqrt();
        assert!((x[0] - 3.0 / r).abs() < 1e-6 && (x[1] - 4.0 / r).abs() < 1e-6);
        assert_eq!(&x[2..], &[0.0, 0.0]);
        let mut y = vec![3.0f32, 4.0];
        rms_norm(&mut y, 2, Some(&[2.0, 0.5]), 0.0);
        assert!((y[0] - 6.0 / r).abs() < 1e-6 && (y[1] - 2.0 / r).abs() < 1e-6);
    }

    #[test]
    fn rope_touches_only_the_trailing_dims_of_each_vector() {
        let table = RopeTable::plain(4, 10000.0);
        // 2 positions x 2 vectors of length 6.
        let orig: Vec<f32> = (0..24).map(|i| i as f32 + 1.0).collect();
        let mut x = orig.clone();
        rope(&table, &mut x, 6, &[0, 5], false);
        assert_eq!(&x[..12], &orig[..12], "position 0 is the identity");
        for v in 2..4 {
            let base = v * 6;
            assert_eq!(
                &x[base..base + 2],
                &orig[base..base + 2],
                "nope dims untouched"
            );
            assert_ne!(&x[base + 2..base + 4], &orig[base + 2..base + 4]);
        }
        // Pair 0 at position 5 uses angle 5·1.
        let (c, s) = (5f64.cos() as f32, 5f64.sin() as f32);
        let (a, b) = (orig[14], orig[15]);
        assert!((x[14] - (a * c - b * s)).abs() < 1e-5 && (x[15] - (a * s + b * c)).abs() < 1e-5);
        rope(&table, &mut x, 6, &[0, 5], true);
        for (p, q) in x.iter().zip(&orig) {
            assert!((p - q).abs() < 1e-4);
        }
    }
}
