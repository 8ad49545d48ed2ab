//! Index-key profiles (`--index`, design §5) and the main-KV mode (`--kv`): how the lightning
//! indexer's queries and keys are rounded before scoring, one variant per engine behaviour.
//!
//! Inputs are the engine's raw f32 values: query `q` `[heads, dim]` after RoPE (before any
//! Hadamard or rounding), head weights `w_raw` `[heads]` (the `weights_proj` output before the
//! scale), key rows `k` `[rows, dim]` after norm and RoPE. [`prepare_query`] and
//! [`prepare_key_row`] / [`prepare_keys`] apply a profile's rounding once; [`score`] /
//! [`score_rows`] then give `I = s_k · Σ_h w'_h · ReLU(q'_h · k')` per key row. [`score`] is the
//! reference for single rows; the engine scores whole blocks of queries × rows with
//! [`score_batch`](super::score_batch::score_batch), the same arithmetic with each dot product
//! from a GEMM (equal up to the f32 summation order of the dot).
//!
//! `S` is the indexer scale `dim^-0.5 · heads^-0.5` ([`weight_scale`]): exactly 2^-6.5 for the
//! real 64 heads x 128 dims; synthetic models with other sizes get their own value, as REF and
//! transformers derive it from the config. `H` is [`hadamard_inplace`] (f32), `bf` a bf16 round
//! trip, `fp8q` SGLang's fp32-scale e4m3 (`s = fp32(max(amax, 1e-4) / 448)`,
//! [`fp8_row_scale_fp32`](super::quant::fp8_row_scale_fp32)), `fp8p` the power-of-two variant
//! ([`fp8_row_scale_pow2`](super::quant::fp8_row_scale_pow2)), `fp4s` / `fp4r` the SGLang / REF
//! fp4 simulations per 32 elements.
//!
//! | profile | query values (per head) | weight `w'_h` | key values, key scale `s_k` | score arithmetic |
//! |---|---|---|---|---|
//! | `exact` | `q` | `w · S` | `k`, 1 | f32 |
//! | `fp8` | `fp8q(H q)` with scale `s_q` | `fp32(fp32(bf(w) · S) · s_q)` | `fp8q(H k)`, its scale | f32 |
//! | `bf16` | as `fp8` | as `fp8` | `bf(H k)`, 1 | f32 |
//! | `bf16-qk` | `bf(q)` | `bf(w) · S` | `bf(k)`, 1 | f32 |
//! | `sglang-fp4` | `fp4s(bf(H bf(q)))` | `bf(w) · S` | `fp4s(H k)`, 1 | f32 |
//! | `official-fp4` | `fp4r(bf(H bf(q)))` | `bf(bf(w) · S)` | `fp4r(bf(H bf(k)))`, 1 | REF bf16, below |
//! | `vllm-fp8` | `fp8p(bf(q))` with scale `s_q` | `fp32(fp32(bf(w) · S) · s_q)` | `fp8p(bf(k))`, its scale | f32 |
//! | `fp8-no-hadamard-k` | as `fp8` | as `fp8` | `fp8q(k)` (not rotated), its scale | f32 |
//!
//! f32 scores: `s_k · Σ_h w'_h · ReLU(dot_h)`, each dot in f32 with 8 interleaved partial sums
//! combined in a fixed order (deterministic, vectorisable), heads summed in order. REF bf16
//! scores (`official-fp4`): `dot_h = bf(f32 dot)`, `p_h = bf(ReLU(dot_h) · w'_h)`, summed over
//! heads in f32, result `bf(sum)`. ReLU passes NaN through so broken inputs stay visible.
//! Rotating both sides leaves `exact` scores unchanged up to rounding (H/sqrt(n) is orthonormal);
//! `fp8-no-hadamard-k` is a different bilinear form, not just noise.

use super::codecs::{bf16_round, bf16_round_slice};
use super::hadamard::hadamard_inplace;
use super::quant::{
    fp4_sim_pow2_rne, fp4_sim_sglang, fp8_row_scale_fp32_inplace, fp8_row_scale_pow2_inplace,
};
use rayon::prelude::*;

pub use super::modes::{IndexProfile, KvMode, ParseNameError};

/// FP4 simulation block of the indexer (elements per ue8m0 scale).
pub const INDEX_FP4_BLOCK: usize = 32;

/// The indexer scale `S = dim^-0.5 · heads^-0.5` in f32 (2^-6.5 for 64 heads of 128).
pub fn weight_scale(heads: usize, dim: usize) -> f32 {
    (1.0 / ((heads * dim) as f64).sqrt()) as f32
}

/// Index queries of one token under one profile.
#[derive(Clone, Debug, PartialEq)]
pub struct PreparedQuery {
    /// `[heads, dim]` rounded query values (e4m3 values in units of `s_q` for fp8 profiles).
    pub values: Vec<f32>,
    /// `[heads]` effective head weights including `S` and any folded query scale.
    pub weights: Vec<f32>,
    pub heads: usize,
    pub dim: usize,
}

/// Index keys under one profile.
#[derive(Clone, Debug, PartialEq)]
pub struct PreparedKeys {
    /// `[rows, dim]` rounded key values.
    pub values: Vec<f32>,
    /// `[rows]` per-row score multiplier (the fp8 key scale; 1.0 when there is none).
    pub row_scale: Vec<f32>,
    pub dim: usize,
}

impl PreparedKeys {
    pub fn rows(&self) -> usize {
        self.row_scale.len()
    }

    /// Key row `i` (values, scale).
    pub fn row(&self, i: usize) -> (&[f32], f32) {
        (
            &self.values[i * self.dim..(i + 1) * self.dim],
            self.row_scale[i],
        )
    }
}

fn rotate(x: &mut [f32]) {
    hadamard_inplace(x).expect("index head dim must be a power of two (IndexProfile::check_dim)");
}

/// Rounds one index query head in place; returns the query scale folded into the weight.
fn prepare_query_head(profile: IndexProfile, v: &mut [f32]) -> f32 {
    use IndexProfile::*;
    match profile {
        Exact => 1.0,
        SglangFp8 | SglangBf16Keys | Fp8NoHadamardK => {
            rotate(v);
            fp8_row_scale_fp32_inplace(v)
        }
        Bf16Qk => {
            bf16_round_slice(v);
            1.0
        }
        SglangFp4 | OfficialFp4 => {
            bf16_round_slice(v);
            rotate(v);
            bf16_round_slice(v);
            if profile == SglangFp4 {
                fp4_sim_sglang(v, INDEX_FP4_BLOCK);
            } else {
                fp4_sim_pow2_rne(v, INDEX_FP4_BLOCK);
            }
            1.0
        }
        VllmFp8 => {
            bf16_round_slice(v);
            fp8_row_scale_pow2_inplace(v)
        }
    }
}

/// Effective head weight from the raw `weights_proj` output and the folded query scale.
fn head_weight(profile: IndexProfile, w_raw: f32, s: f32, s_q: f32) -> f32 {
    use IndexProfile::*;
    match profile {
        Exact => w_raw * s,
        Bf16Qk | SglangFp4 => bf16_round(w_raw) * s,
        OfficialFp4 => bf16_round(bf16_round(w_raw) * s),
        SglangFp8 | SglangBf16Keys | Fp8NoHadamardK | VllmFp8 => (bf16_round(w_raw) * s) * s_q,
    }
}

/// Prepares the index query of one token: `q` `[heads, dim]`, `w_raw` `[heads]`.
///
/// # Panics
/// If the lengths do not match `heads` and `dim`, or a rotating profile gets a `dim` that is not
/// a power of two (check with [`IndexProfile::check_dim`] when the model is loaded).
pub fn prepare_query(
    profile: IndexProfile,
    q: &[f32],
    w_raw: &[f32],
    heads: usize,
    dim: usize,
) -> PreparedQuery {
    assert_eq!(
        q.len(),
        heads * dim,
        "index query: expected heads*dim values"
    );
    assert_eq!(
        w_raw.len(),
        heads,
        "index head weights: expected one per head"
    );
    let s = weight_scale(heads, dim);
    let mut values = q.to_vec();
    let weights = values
        .chunks_mut(dim.max(1))
        .zip(w_raw)
        .map(|(v, &w)| {
            let s_q = prepare_query_head(profile, v);
            head_weight(profile, w, s, s_q)
        })
        .collect();
    PreparedQuery {
        values,
        weights,
        heads,
        dim,
    }
}

/// Prepares one key row into `out` (same length) and returns its score multiplier, so the
/// engine can prepare each key once, when it is emitted.
///
/// # Panics
/// As [`prepare_query`].
pub fn prepare_key_row(profile: IndexProfile, row: &[f32], out: &mut [f32]) -> f32 {
    use IndexProfile::*;
    out.copy_from_slice(row);
    match profile {
        Exact => 1.0,
        SglangFp8 => {
            rotate(out);
            fp8_row_scale_fp32_inplace(out)
        }
        SglangBf16Keys => {
            rotate(out);
            bf16_round_slice(out);
            1.0
        }
        Bf16Qk => {
            bf16_round_slice(out);
            1.0
        }
        SglangFp4 => {
            rotate(out);
            fp4_sim_sglang(out, INDEX_FP4_BLOCK);
            1.0
        }
        OfficialFp4 => {
            bf16_round_slice(out);
            rotate(out);
            bf16_round_slice(out);
            fp4_sim_pow2_rne(out, INDEX_FP4_BLOCK);
            1.0
        }
        VllmFp8 => {
            // vLLM's key kernel rounds the (unrotated) roped row to bf16 before its amax and
            // e4m3 cast.
            bf16_round_slice(out);
            fp8_row_scale_pow2_inplace(out)
        }
        Fp8NoHadamardK => fp8_row_scale_fp32_inplace(out),
    }
}

/// Prepares all key rows of `k` `[rows, dim]`.
///
/// # Panics
/// If `k.len()` is not a multiple of `dim`, or as [`prepare_query`].
pub fn prepare_keys(profile: IndexProfile, k: &[f32], dim: usize) -> PreparedKeys {
    assert!(
        dim > 0 && k.len().is_multiple_of(dim),
        "index keys: length not a multiple of dim"
    );
    let mut values = vec![0.0f32; k.len()];
    let row_scale = values
        .par_chunks_mut(dim)
        .zip(k.par_chunks(dim))
        .with_min_len(256)
        .map(|(out, row)| prepare_key_row(profile, row, out))
        .collect();
    PreparedKeys {
        values,
        row_scale,
        dim,
    }
}

/// f32 dot product with 8 interleaved partial sums combined pairwise in a fixed order.
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    for (i, (x, y)) in ra.iter().zip(rb).enumerate() {
        acc[i] += x * y;
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

/// ReLU that keeps NaN visible.
#[inline]
fn relu(x: f32) -> f32 {
    if x < 0.0 {
        0.0
    } else {
        x
    }
}

/// Score of one prepared key row (`key` `[dim]` with its multiplier) for a prepared query.
///
/// # Panics
/// If `key` is not `q.dim` long.
pub fn score(profile: IndexProfile, q: &PreparedQuery, key: &[f32], key_scale: f32) -> f32 {
    assert_eq!(
        key.len(),
        q.dim,
        "score: key row length differs from the query dim"
    );
    let heads = q.values.chunks(q.dim.max(1)).zip(&q.weights);
    if profile == IndexProfile::OfficialFp4 {
        let sum: f32 = heads
            .map(|(qh, &w)| bf16_round(relu(bf16_round(dot(qh, key))) * w))
            .sum();
        bf16_round(sum) * key_scale
    } else {
        let sum: f32 = heads.map(|(qh, &w)| w * relu(dot(qh, key))).sum();
        key_scale * sum
    }
}

/// Scores every row of `keys` into `out` (`[rows]`), in parallel.
///
/// # Panics
/// If `out` is not one value per key row or the dims differ.
pub fn score_rows(profile: IndexProfile, q: &PreparedQuery, keys: &PreparedKeys, out: &mut [f32]) {
    assert_eq!(out.len(), keys.rows(), "score_rows: one output per key row");
    assert_eq!(q.dim, keys.dim, "score_rows: query and key dims differ");
    out.par_iter_mut()
        .enumerate()
        .with_min_len(64)
        .for_each(|(i, o)| {
            let (k, s) = keys.row(i);
            *o = score(profile, q, k, s);
        });
}

#[cfg(test)]
#[path = "profiles_tests.rs"]
mod tests;
