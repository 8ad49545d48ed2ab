//! mHC ops of the CPU backend: the batched pre-mix (one GEMM for the mixes of all tokens, then
//! per-token coefficients from `crate::numerics::mhc`), the post-mix and the head mix.
//!
//! Shapes: `streams [T, n, D]`, block input / output `[T, D]`, `post [T, n]`, `comb [T, n, n]`.
//! The RMS scale of the flattened streams is accumulated in f64 (then used as f32), so it does
//! not depend on summation order; everything else is f32.

use super::linalg::{matmul, CpuMatrix};
use crate::backend::{HcParams, HcWeights};
use crate::numerics::mhc::{head_coefficients, site_coefficients};
use rayon::prelude::*;

/// `mixes[T, rows] = (x · fnᵀ) / sqrt(mean(x²) + eps)` per token, x = the token's streams.
fn scaled_mixes(streams: &[f32], mix: &CpuMatrix, eps: f32) -> Vec<f32> {
    let width = mix.cols();
    let tokens = streams.len() / width;
    let mut mixes = vec![0.0f32; tokens * mix.rows()];
    matmul(streams, mix, &mut mixes);
    mixes
        .par_chunks_mut(mix.rows())
        .zip(streams.par_chunks(width))
        .for_each(|(m, x)| {
            let r = super::rms_scale(x, eps);
            m.iter_mut().for_each(|v| *v *= r);
        });
    mixes
}

/// `out[D] = Σ_j w_j · X_j` for one token's streams `x [n, D]`.
fn weighted_streams(x: &[f32], w: &[f32], out: &mut [f32]) {
    let d = out.len();
    out.fill(0.0);
    for (j, &wj) in w.iter().enumerate() {
        for (o, v) in out.iter_mut().zip(&x[j * d..(j + 1) * d]) {
            *o += wj * v;
        }
    }
}

pub fn hc_pre(
    streams: &[f32],
    site: &HcWeights<'_, CpuMatrix>,
    params: &HcParams,
    input: &mut [f32],
    post: &mut [f32],
    comb: &mut [f32],
) {
    let n = params.streams;
    let width = site.mix.cols();
    let d = width / n;
    let tokens = streams.len() / width;
    assert_eq!(site.mix.rows(), (2 + n) * n, "hc_pre: mix rows");
    assert_eq!(input.len(), tokens * d, "hc_pre: input is not [T, D]");
    assert_eq!(post.len(), tokens * n, "hc_pre: post is not [T, n]");
    assert_eq!(comb.len(), tokens * n * n, "hc_pre: comb is not [T, n, n]");
    let mixes = scaled_mixes(streams, site.mix, params.norm_eps);
    input
        .par_chunks_mut(d)
        .zip(post.par_chunks_mut(n))
        .zip(comb.par_chunks_mut(n * n))
        .zip(mixes.par_chunks((2 + n) * n))
        .zip(streams.par_chunks(width))
        .for_each(|((((inp, po), co), m), x)| {
            let mut pre = vec![0.0f32; n];
            site_coefficients(m, site.base, site.scale, params, &mut pre, po, co);
            weighted_streams(x, &pre, inp);
        });
}

pub fn hc_post(streams: &mut [f32], y: &[f32], post: &[f32], comb: &[f32], n: usize) {
    let tokens = post.len() / n;
    let d = y.len() / tokens.max(1);
    assert_eq!(
        streams.len(),
        tokens * n * d,
        "hc_post: streams is not [T, n, D]"
    );
    streams
        .par_chunks_mut(n * d)
        .zip(y.par_chunks(d))
        .zip(post.par_chunks(n))
        .zip(comb.par_chunks(n * n))
        .for_each(|(((x, yt), po), co)| {
            let old = x.to_vec();
            for k in 0..n {
                let out = &mut x[k * d..(k + 1) * d];
                for (o, &v) in out.iter_mut().zip(yt) {
                    *o = po[k] * v;
                }
                for j in 0..n {
                    let c = co[j * n + k];
                    for (o, &v) in out.iter_mut().zip(&old[j * d..(j + 1) * d]) {
                        *o += c * v;
                    }
                }
            }
        });
}

pub fn hc_head(
    streams: &[f32],
    site: &HcWeights<'_, CpuMatrix>,
    params: &HcParams,
    out: &mut [f32],
) {
    let n = params.streams;
    let width = site.mix.cols();
    let d = width / n;
    assert_eq!(site.mix.rows(), n, "hc_head: mix rows");
    assert_eq!(out.len(), streams.len() / n, "hc_head: out is not [T, D]");
    let mixes = scaled_mixes(streams, site.mix, params.norm_eps);
    out.par_chunks_mut(d)
        .zip(mixes.par_chunks(n))
        .zip(streams.par_chunks(width))
        .for_each(|((o, m), x)| {
            let mut pre = vec![0.0f32; n];
            head_coefficients(m, site.base, site.scale, params.hc_eps, &mut pre);
            weighted_streams(x, &pre, o);
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn post_mix_sums_over_the_first_comb_index() {
        // n = 2, D = 1: X = [1, 10], y = 0, comb = [[a, b], [c, d]] -> X'_k = Σ_j C[j][k] X_j.
        let mut x = vec![1.0, 10.0];
        hc_post(&mut x, &[0.0], &[0.5, 0.5], &[0.1, 0.2, 0.3, 0.4], 2);
        assert!((x[0] - (0.1 + 3.0)).abs() < 1e-6, "{x:?}");
        assert!((x[1] - (0.2 + 4.0)).abs() < 1e-6, "{x:?}");
        let mut x = vec![1.0, 10.0];
        hc_post(&mut x, &[2.0], &[0.5, 1.5], &[0.0; 4], 2);
        assert_eq!(x, vec![1.0, 3.0]);
    }

    #[test]
    fn zero_mix_gives_sigmoid_of_base() {
        let (n, d) = (4, 2);
        let mix = CpuMatrix::new(vec![0.0; n * n * d], n, n * d);
        let base = [0.0, 0.0, 0.0, 100.0];
        let site = HcWeights {
            mix: &mix,
            base: &base,
            scale: &[1.0],
        };
        let params = HcParams {
            streams: n,
            sinkhorn_iters: 20,
            norm_eps: 1e-6,
            hc_eps: 0.0,
        };
        let streams: Vec<f32> = (0..n * d).map(|i| i as f32).collect();
        let mut out = vec![0.0; d];
        hc_head(&streams, &site, &params, &mut out);
        // pre = [0.5, 0.5, 0.5, 1.0]: out = 0.5·(X0 + X1 + X2) + X3.
        assert!(
            (out[0] - (0.5 * (0.0 + 2.0 + 4.0) + 6.0)).abs() < 1e-5,
            "{out:?}"
        );
        assert!(
            (out[1] - (0.5 * (1.0 + 3.0 + 5.0) + 7.0)).abs() < 1e-5,
            "{out:?}"
        );
    }
}
