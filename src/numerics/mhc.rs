//! mHC, manifold-constrained hyper-connections (docs/spec/model.md 4.3 and 4.4): the exact per-token
//! coefficient math (the weights of a site are `model::hyper`'s).
//!
//! A token's residual state is `n` streams `X_j ∈ R^D` (`n = hc_mult = 4`). Each decoder layer
//! has two sites ("attn", "ffn"); the final head has a simpler one. For a layer site with
//! mixes `m = (fn · x) / sqrt(mean(x²) + rms_norm_eps)` (x = the flattened streams, fn
//! `[(2+n)·n, n·D]`):
//! - `pre_j  = σ(m_j · scale_0 + base_j) + hc_eps` (not normalised),
//! - `post_j = 2 · σ(m_{n+j} · scale_1 + base_{n+j})`,
//! - `comb = Sinkhorn(A)`, `A[j][k] = m_{2n+n·j+k} · scale_2 + base_{2n+n·j+k}`:
//!   `C = softmax_k(A) + eps`, then a column normalisation `C[j][k] /= Σ_j' C[j'][k] + eps`,
//!   then `iters - 1` rounds of (row normalisation, column normalisation) — 20 row-type and 20
//!   column-type normalisations for `hc_sinkhorn_iters = 20`, ending on a column step.
//!
//! The block input is `Σ_j pre_j X_j`; after the block, `X'_k = post_k · y + Σ_j C[j][k] X_j`
//! (the sum runs over the FIRST index of C). The head uses `pre` only, from its own `[n, n·D]`
//! weights, with no post and no Sinkhorn.
//!
//! All of this is f32, as in REF (which computes the mHC coefficients in fp32). The functions
//! here are the definition the CPU backend evaluates per token; a device kernel must match
//! them.

/// Scalars of the mHC sites (docs/spec/model.md 4.3): stream count, Sinkhorn iterations and epsilons.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HcParams {
    /// Residual streams per token (`hc_mult`, 4).
    pub streams: usize,
    /// Total Sinkhorn normalisation rounds (`hc_sinkhorn_iters`, 20).
    pub sinkhorn_iters: usize,
    /// eps of the unweighted RMS scale over the flattened streams (`rms_norm_eps`).
    pub norm_eps: f32,
    /// eps added to pre / softmax / normalisation denominators (`hc_eps`).
    pub hc_eps: f32,
}

#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Layer-site coefficients of one token from its (already RMS-scaled) mixes `[(2+n)·n]`:
/// writes `pre [n]`, `post [n]` and `comb [n, n]` (comb[j·n + k]).
pub fn site_coefficients(
    mixes: &[f32],
    base: &[f32],
    scale: &[f32],
    params: &HcParams,
    pre: &mut [f32],
    post: &mut [f32],
    comb: &mut [f32],
) {
    let n = params.streams;
    debug_assert_eq!(mixes.len(), (2 + n) * n);
    for j in 0..n {
        pre[j] = sigmoid(mixes[j] * scale[0] + base[j]) + params.hc_eps;
        post[j] = 2.0 * sigmoid(mixes[n + j] * scale[1] + base[n + j]);
    }
    for i in 0..n * n {
        comb[i] = mixes[2 * n + i] * scale[2] + base[2 * n + i];
    }
    sinkhorn(comb, n, params.sinkhorn_iters, params.hc_eps);
}

/// Head coefficients of one token: `pre_j = σ(m_j · scale + base_j) + hc_eps`.
pub fn head_coefficients(mixes: &[f32], base: &[f32], scale: &[f32], hc_eps: f32, pre: &mut [f32]) {
    for (j, p) in pre.iter_mut().enumerate() {
        *p = sigmoid(mixes[j] * scale[0] + base[j]) + hc_eps;
    }
}

/// Sinkhorn on logits `a [n, n]` in place (docs/spec/model.md 4.3 step 3): row softmax + eps, column
/// normalisation, then `iters - 1` rounds of row then column normalisation.
pub fn sinkhorn(a: &mut [f32], n: usize, iters: usize, eps: f32) {
    for row in a.chunks_exact_mut(n) {
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let mut sum = 0.0f32;
        for v in row.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        for v in row.iter_mut() {
            *v = *v / sum + eps;
        }
    }
    normalise_columns(a, n, eps);
    for _ in 1..iters {
        for row in a.chunks_exact_mut(n) {
            let sum: f32 = row.iter().sum::<f32>() + eps;
            for v in row.iter_mut() {
                *v /= sum;
            }
        }
        normalise_columns(a, n, eps);
    }
}

fn normalise_columns(a: &mut [f32], n: usize, eps: f32) {
    for k in 0..n {
        let sum: f32 = (0..n).map(|j| a[j * n + k]).sum::<f32>() + eps;
        for j in 0..n {
            a[j * n + k] /= sum;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> HcParams {
        HcParams {
            streams: 4,
            sinkhorn_iters: 20,
            norm_eps: 1e-6,
            hc_eps: 1e-6,
        }
    }

    #[test]
    fn sinkhorn_result_is_nearly_doubly_stochastic() {
        let mut a: Vec<f32> = (0..16).map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.9).collect();
        sinkhorn(&mut a, 4, 20, 1e-6);
        for k in 0..4 {
            let col: f32 = (0..4).map(|j| a[j * 4 + k]).sum();
            assert!((col - 1.0).abs() < 1e-4, "column {k} sums to {col}");
        }
        for j in 0..4 {
            let row: f32 = a[j * 4..j * 4 + 4].iter().sum();
            assert!((row - 1.0).abs() < 1e-2, "row {j} sums to {row}");
        }
        assert!(a.iter().all(|&v| v > 0.0));
    }

    /// docs/spec/model.md 4.3 step 3 written out in f64: row softmax + eps, column normalisation, then
    /// `iters - 1` rounds of row and column normalisation, each sum plus eps.
    fn sinkhorn_f64(logits: &[f32], n: usize, iters: usize, eps: f64) -> Vec<f64> {
        let mut c: Vec<f64> = logits.iter().map(|&v| v as f64).collect();
        let normalise_rows = |c: &mut [f64], softmax: bool| {
            for j in 0..n {
                let row = &mut c[j * n..(j + 1) * n];
                if softmax {
                    let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    row.iter_mut().for_each(|v| *v = (*v - max).exp());
                    let sum: f64 = row.iter().sum();
                    row.iter_mut().for_each(|v| *v = *v / sum + eps);
                } else {
                    let sum = row.iter().sum::<f64>() + eps;
                    row.iter_mut().for_each(|v| *v /= sum);
                }
            }
        };
        let normalise_columns = |c: &mut [f64]| {
            for k in 0..n {
                let sum = (0..n).map(|j| c[j * n + k]).sum::<f64>() + eps;
                (0..n).for_each(|j| c[j * n + k] /= sum);
            }
        };
        normalise_rows(&mut c, true);
        normalise_columns(&mut c);
        for _ in 1..iters {
            normalise_rows(&mut c, false);
            normalise_columns(&mut c);
        }
        c
    }

    fn worst_difference(a: &[f32], b: &[f64]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(&x, &y)| (x as f64 - y).abs())
            .fold(0.0, f64::max)
    }

    /// The f32 Sinkhorn equals the f64 transcription of the spec to f32 noise (< 5e-7, measured
    /// up to 8e-8) for the real 20 iterations and eps 1e-6, and for a large eps that makes every
    /// "+ eps" matter; 19 or 21 iterations would be off by 8e-6 or more on these logits.
    #[test]
    fn sinkhorn_matches_an_f64_transcription_of_the_spec() {
        for spread in [1.0f32, 2.0, 8.0] {
            let logits: Vec<f32> = (0..16)
                .map(|i| ((i * 7 % 11) as f32 - 5.0) * spread)
                .collect();
            for eps in [1e-6f32, 1e-2] {
                let want = sinkhorn_f64(&logits, 4, 20, eps as f64);
                for iters in [19, 21] {
                    let other: Vec<f32> = sinkhorn_f64(&logits, 4, iters, eps as f64)
                        .iter()
                        .map(|&v| v as f32)
                        .collect();
                    let apart = worst_difference(&other, &want);
                    assert!(apart > 5e-6, "{iters} iterations are too close ({apart:e})");
                }
                for iters in [1, 2, 20] {
                    let mut got = logits.clone();
                    sinkhorn(&mut got, 4, iters, eps);
                    let want = sinkhorn_f64(&logits, 4, iters, eps as f64);
                    let err = worst_difference(&got, &want);
                    assert!(
                        err < 5e-7,
                        "spread {spread} eps {eps} iters {iters}: {err:e}"
                    );
                }
            }
        }
    }

    #[test]
    fn one_iteration_is_softmax_then_one_column_step() {
        let mut a = vec![0.0, 1.0, 2.0, 3.0];
        sinkhorn(&mut a, 2, 1, 0.0);
        // Row softmax: [1, e]/(1+e) and [1, e]/(1+e): identical rows, columns then sum to 1.
        assert!(
            (a[0] - 0.5).abs() < 1e-6 && (a[1] - 0.5).abs() < 1e-6,
            "{a:?}"
        );
    }

    /// The head's `pre` adds hc_eps after the sigmoid, as each layer site does (docs/spec/model.md 4.4).
    #[test]
    fn head_coefficients_add_hc_eps_after_the_sigmoid() {
        let (mixes, base, scale) = ([0.5f32, -1.0, 0.0, 2.0], [0.1f32, 0.2, -0.3, 0.0], [1.5]);
        let mut pre = [0.0f32; 4];
        head_coefficients(&mixes, &base, &scale, 0.25, &mut pre);
        for j in 0..4 {
            assert_eq!(pre[j], sigmoid(mixes[j] * 1.5 + base[j]) + 0.25, "pre[{j}]");
        }
    }

    #[test]
    fn coefficients_follow_the_formulas() {
        let p = params();
        let mixes: Vec<f32> = (0..24).map(|i| i as f32 * 0.1 - 1.0).collect();
        let base: Vec<f32> = (0..24).map(|i| (i % 3) as f32 * 0.2).collect();
        let scale = [0.5, 1.5, 2.0];
        let (mut pre, mut post, mut comb) = ([0.0; 4], [0.0; 4], [0.0; 16]);
        site_coefficients(&mixes, &base, &scale, &p, &mut pre, &mut post, &mut comb);
        assert!((pre[1] - (sigmoid(mixes[1] * 0.5 + base[1]) + 1e-6)).abs() < 1e-7);
        assert!((post[2] - 2.0 * sigmoid(mixes[6] * 1.5 + base[6])).abs() < 1e-7);
        let mut want: Vec<f32> = (0..16).map(|i| mixes[8 + i] * 2.0 + base[8 + i]).collect();
        sinkhorn(&mut want, 4, 20, 1e-6);
        assert_eq!(comb.to_vec(), want);
    }
}
