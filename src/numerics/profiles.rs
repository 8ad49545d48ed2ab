//! Index-key profiles (`--index`, docs/architecture.md section 5) and the main-KV mode (`--kv`): how the lightning
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
//! | `v41-fp4` (DeepSeek-V4.1) | `fp4r(bf(q))` | `bf(bf(w) · S)` | `fp4r(bf(k))`, 1 | REF bf16, below |
//!
//! f32 scores: `s_k · Σ_h w'_h · ReLU(dot_h)`, each dot in f32 with 8 interleaved partial sums
//! combined in a fixed order (deterministic, vectorisable), heads summed in order. REF bf16
//! scores (`official-fp4`): `dot_h = bf(f32 dot)`, `p_h = bf(ReLU(dot_h) · w'_h)`, summed over
//! heads in f32, result `bf(sum)` (also `v41-fp4`: DeepSeek-V4.1's reference computes its index
//! scores in bf16 the same way, docs/spec/v41.md 5.8). ReLU passes NaN through so broken inputs
//! stay visible.
//! Rotating both sides leaves `exact` scores unchanged up to rounding (H/sqrt(n) is orthonormal);
//! `fp8-no-hadamard-k` is a different bilinear form, not just noise.

use super::codecs::{bf16_round, bf16_round_slice};
use super::hadamard::hadamard_inplace;
use super::quant::{
    fp4_pack_sglang_v41, fp4_sim_pow2_rne, fp4_sim_sglang, fp8_row_scale_fp32_inplace,
    fp8_row_scale_pow2_inplace,
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
        // SGLang's V4.1 query: the release's quantiser (DeepGEMM re-quantises it with the
        // same scale, docs/spec/v41.md 5.8).
        V41Fp4 | SglangV41Fp4 => {
            bf16_round_slice(v);
            fp4_sim_pow2_rne(v, INDEX_FP4_BLOCK);
            1.0
        }
    }
}

/// Effective head weight from the raw `weights_proj` output and the folded query scale.
fn head_weight(profile: IndexProfile, w_raw: f32, s: f32, s_q: f32) -> f32 {
    use IndexProfile::*;
    match profile {
        Exact => w_raw * s,
        Bf16Qk | SglangFp4 => bf16_round(w_raw) * s,
        OfficialFp4 | V41Fp4 | SglangV41Fp4 => bf16_round(bf16_round(w_raw) * s),
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
        V41Fp4 => {
            bf16_round_slice(out);
            fp4_sim_pow2_rne(out, INDEX_FP4_BLOCK);
            1.0
        }
        // The release's quantiser, then SGLang's pack into its FP4 pool.
        SglangV41Fp4 => {
            bf16_round_slice(out);
            fp4_sim_pow2_rne(out, INDEX_FP4_BLOCK);
            fp4_pack_sglang_v41(out, INDEX_FP4_BLOCK);
            1.0
        }
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
    if profile.bf16_scores() {
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
mod tests {
    //! Tests of `profiles.rs`: hand-checked scores per profile, Hadamard invariance of
    //! `exact`, batch/streaming agreement, and every profile staying near the exact scores.

    use super::*;
    use crate::numerics::hadamard::hadamard_rows;

    const HEADS: usize = 2;
    const DIM: usize = 4;

    /// Head 0 = [1, 1, 1, 1] (Hadamard: [2, 0, 0, 0]); head 1 its negative (ReLU kills it).
    const Q: [f32; 8] = [1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0];
    const W: [f32; 2] = [1.0, 3.0];
    /// Hadamard: [1, 0, 0, 0]; exact q0 · k = 2.
    const K: [f32; 4] = [0.5; 4];

    fn s() -> f32 {
        weight_scale(HEADS, DIM)
    }

    fn score_one(p: IndexProfile, q: &[f32], w: &[f32], k: &[f32]) -> f32 {
        let pq = prepare_query(p, q, w, HEADS, DIM);
        let mut kv = vec![0.0; k.len()];
        let ks = prepare_key_row(p, k, &mut kv);
        score(p, &pq, &kv, ks)
    }

    use crate::numerics::rng::Rng;

    #[test]
    fn weight_scale_is_two_to_minus_6_5_for_the_real_indexer() {
        assert_eq!(weight_scale(64, 128), 0.011048543456039806f64 as f32);
        assert_eq!(
            weight_scale(64, 128),
            crate::numerics::hadamard::hadamard_scale(128) / 8.0
        );
    }

    #[test]
    fn exact_score_by_hand() {
        // w'_0 = S, q0·k = 2, head 1 negative -> 0.
        assert_eq!(score_one(IndexProfile::Exact, &Q, &W, &K), 2.0 * s());
        let pq = prepare_query(IndexProfile::Exact, &Q, &W, HEADS, DIM);
        assert_eq!(pq.weights, vec![s(), 3.0 * s()]);
        assert_eq!(pq.values, Q.to_vec());
    }

    #[test]
    fn bf16_qk_rounds_q_k_and_w_to_bf16_by_hand() {
        let e9 = 2f32.powi(-9);
        let q = [1.0 + e9, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0];
        let w = [1.0 + e9, 3.0];
        let k = [0.5, 0.5, 0.5, 0.5 + 2f32.powi(-10)];
        // All small offsets are below half a bf16 ulp: the bf16 score is the clean 2·S.
        assert_eq!(score_one(IndexProfile::Bf16Qk, &q, &w, &k), 2.0 * s());
        assert_ne!(score_one(IndexProfile::Exact, &q, &w, &k), 2.0 * s());
    }

    #[test]
    fn fp8_score_by_hand_with_exact_e4m3_values() {
        // Hq0 = [2,0,0,0]: s_q = fp32(2/448), q8 = [448,0,0,0]; Hk = [1,0,0,0]: s_k = fp32(1/448),
        // k8 = [448,0,0,0]; dot = 448² = 200704.
        let pq = prepare_query(IndexProfile::SglangFp8, &Q, &W, HEADS, DIM);
        assert_eq!(&pq.values[..4], &[448.0, 0.0, 0.0, 0.0]);
        let s_q = 2.0f32 / 448.0;
        assert_eq!(pq.weights[0], (1.0 * s()) * s_q);
        let got = score_one(IndexProfile::SglangFp8, &Q, &W, &K);
        let want = (1.0f32 / 448.0) * (((1.0 * s()) * s_q) * 200704.0);
        assert_eq!(got, want);
        assert!(
            (got - 2.0 * s()).abs() <= 1e-6 * s(),
            "{got} vs exact {}",
            2.0 * s()
        );
    }

    #[test]
    fn bf16_keys_score_by_hand() {
        // Query as fp8; key Hk = [1,0,0,0] in bf16, no key scale: dot = 448.
        let got = score_one(IndexProfile::SglangBf16Keys, &Q, &W, &K);
        assert_eq!(got, ((1.0 * s()) * (2.0f32 / 448.0)) * 448.0);
    }

    #[test]
    fn fp8_no_hadamard_k_is_a_different_bilinear_form() {
        // Key unrotated: k8 = [448; 4] with s_k = fp32(0.5/448); (Hq)·k = 1, not q·k = 2.
        let got = score_one(IndexProfile::Fp8NoHadamardK, &Q, &W, &K);
        let want = (0.5f32 / 448.0) * (((1.0 * s()) * (2.0f32 / 448.0)) * 200704.0);
        assert_eq!(got, want);
        assert!((got - s()).abs() <= 1e-6 * s());
    }

    #[test]
    fn vllm_fp8_power_of_two_scales_give_exact_score_by_hand() {
        // No Hadamard: q8 = [256; 4] with s_q = 2^-8, k8 = [256; 4] with s_k = 2^-9, dot = 4·2^16.
        let pq = prepare_query(IndexProfile::VllmFp8, &Q, &W, HEADS, DIM);
        assert_eq!(&pq.values[..4], &[256.0; 4]);
        assert_eq!(pq.weights[0], s() * 2f32.powi(-8));
        assert_eq!(score_one(IndexProfile::VllmFp8, &Q, &W, &K), 2.0 * s());
    }

    #[test]
    fn vllm_fp8_keys_are_rounded_to_bf16_before_their_amax_and_e4m3_cast() {
        // vLLM's key kernel quantises bf16(k). amax 1 gives s_k = 2^-8; 17.03/256 scales to 17.03,
        // which e4m3 (step 2 in [16, 32)) rounds to 18, but bf16(17.03/256) scales to exactly 17,
        // an e4m3 tie that goes to the even 16.
        let k = [1.0f32, 17.03 / 256.0];
        let mut out = [0.0f32; 2];
        let s_k = prepare_key_row(IndexProfile::VllmFp8, &k, &mut out);
        assert_eq!(s_k, 2f32.powi(-8));
        assert_eq!(out, [256.0, 16.0]);
    }

    /// Head 0 = H[2,2,0,0]; key = H[1, 0.4375, 0, 0]: after rotation the key's second element
    /// scales to 1.75, an e2m1 tie (RNE -> 2, SGLang -> 1.5). Exact q·k = 2.875.
    const Q4: [f32; 8] = [2.0, 0.0, 2.0, 0.0, -2.0, 0.0, -2.0, 0.0];
    const K4: [f32; 4] = [0.71875, 0.28125, 0.71875, 0.28125];

    #[test]
    fn fp4_profiles_by_hand_differ_on_the_tie() {
        assert!((score_one(IndexProfile::Exact, &Q4, &W, &K4) - 2.875 * s()).abs() < 1e-6);
        // SGLang: q' = [2,2,0,0], k' = [1, 0.375, 0, 0] (s = 0.25, 1.75 -> 1.5): dot 2.75.
        assert_eq!(score_one(IndexProfile::SglangFp4, &Q4, &W, &K4), 2.75 * s());
        // REF: k' = [1, 0.5, 0, 0], dot 3 (bf16 exact); w' = bf16(S) = 0.353515625;
        // p = bf16(3 · 0.353515625 = 1.060546875) = 1.0625; final bf16 sum 1.0625.
        assert_eq!(bf16_round(s()), 181.0 / 512.0); // 0.353515625
        assert_eq!(score_one(IndexProfile::OfficialFp4, &Q4, &W, &K4), 1.0625);
    }

    /// REF's bf16 score arithmetic step by step (docs/spec/attention.md 6.4), on a hand-made prepared query
    /// whose one-hot heads make each dot a key value: every one of the three bf16 roundings changes
    /// the result, so dropping any of them fails here.
    #[test]
    fn official_fp4_scores_round_dot_product_and_sum_to_bf16() {
        let pq = PreparedQuery {
            values: vec![1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0],
            weights: vec![2.5, 0.75],
            heads: HEADS,
            dim: DIM,
        };
        let key = [1.01f32, 1.03, 0.0, 0.0];
        // bf(1.01) = 1.0078125; · 2.5 = 2.51953125 -> bf 2.515625 (step 2^-6 in [2, 4)).
        // bf(1.03) = 1.03125; · 0.75 = 0.7734375 (bf16 exact).
        // f32 sum 3.2890625 is a bf16 tie (210.5 steps) -> even: 3.28125.
        assert_eq!(score(IndexProfile::OfficialFp4, &pq, &key, 1.0), 3.28125);
        // Without the dot rounding: 2.525 -> 2.53125, 0.7725 -> 0.7734375, sum -> 3.3125.
        // Without the product rounding: 3.29296875 -> 3.296875. Without the final rounding:
        // 3.2890625. The f32 profiles: 2.5 · 1.01 + 0.75 · 1.03 = 3.2975.
        let f32_score = score(IndexProfile::Exact, &pq, &key, 1.0);
        assert!((f32_score - 3.2975).abs() < 1e-6, "{f32_score}");
        // The key multiplier applies after the final rounding.
        assert_eq!(score(IndexProfile::OfficialFp4, &pq, &key, 0.5), 1.640625);
    }

    /// REF's head weight is `bf(bf(w) · S)`: with `w = 1` it is bf16(S), not S.
    #[test]
    fn v41_fp4_is_the_official_recipe_without_the_rotation() {
        // DeepSeek-V4.1 rotates nothing: q' = fp4r(bf(q)), k' = fp4r(bf(k)), w' = bf(bf(w) S),
        // scores with REF's bf16 arithmetic.
        let q: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 29) as f32 - 14.0) * 0.173)
            .collect();
        let k: Vec<f32> = (0..32)
            .map(|i| ((i * 11 % 17) as f32 - 8.0) * 0.291)
            .collect();
        let w = [0.7f32, -1.3];
        let pq = prepare_query(IndexProfile::V41Fp4, &q, &w, 2, 32);
        let mut want_q = q.clone();
        for head in want_q.chunks_mut(32) {
            bf16_round_slice(head);
            fp4_sim_pow2_rne(head, 32);
        }
        assert_eq!(pq.values, want_q);
        let s = weight_scale(2, 32);
        assert_eq!(
            pq.weights,
            vec![
                bf16_round(bf16_round(0.7) * s),
                bf16_round(bf16_round(-1.3) * s)
            ]
        );
        let mut pk = vec![0.0; 32];
        assert_eq!(prepare_key_row(IndexProfile::V41Fp4, &k, &mut pk), 1.0);
        let mut want_k = k.clone();
        bf16_round_slice(&mut want_k);
        fp4_sim_pow2_rne(&mut want_k, 32);
        assert_eq!(pk, want_k);
        let by_hand: f32 = pq
            .values
            .chunks(32)
            .zip(&pq.weights)
            .map(|(qh, &wh)| {
                let d: f32 = qh.iter().zip(&pk).map(|(a, b)| a * b).sum();
                bf16_round(relu(bf16_round(d)) * wh)
            })
            .sum();
        let got = score(IndexProfile::V41Fp4, &pq, &pk, 1.0);
        assert_eq!(got, bf16_round(by_hand));
        assert!(!IndexProfile::V41Fp4.rotates_query() && !IndexProfile::V41Fp4.rotates_key());
    }

    /// SGLang's V4.1 profile: the release's query and head weights, keys packed once more
    /// (equal to the release's on normal magnitudes, coarser in a tiny block), f32 scores.
    #[test]
    fn sglang_v41_fp4_is_the_release_with_the_key_pack_and_f32_scores() {
        let k: Vec<f32> = (0..64)
            .map(|i| {
                let v = ((i * 7 % 13) as f32 - 6.0) * 0.37;
                if i >= 32 {
                    v * 1e-5
                } else {
                    v
                }
            })
            .collect();
        let q: Vec<f32> = (0..64)
            .map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.21)
            .collect();
        let w = [0.9f32];
        let (ours, release) = (IndexProfile::SglangV41Fp4, IndexProfile::V41Fp4);
        let pq = prepare_query(ours, &q, &w, 1, 64);
        assert_eq!(pq, prepare_query(release, &q, &w, 1, 64));
        let (mut pk, mut rk) = (vec![0.0; 64], vec![0.0; 64]);
        assert_eq!(prepare_key_row(ours, &k, &mut pk), 1.0);
        prepare_key_row(release, &k, &mut rk);
        assert_eq!(
            pk[..32],
            rk[..32],
            "a normal block is unchanged by the pack"
        );
        let mut want = rk[32..].to_vec();
        fp4_pack_sglang_v41(&mut want, 32);
        assert_eq!(pk[32..], want[..]);
        assert_ne!(pk[32..], rk[32..], "the tiny block is coarser");
        let d: f32 = pq.values.iter().zip(&pk).map(|(a, b)| a * b).sum();
        assert_eq!(score(ours, &pq, &pk, 1.0), pq.weights[0] * relu(d));
        assert!(!ours.bf16_scores() && !ours.rotates_query() && !ours.rotates_key());
        assert!(ours.v41_only());
    }

    #[test]
    fn official_fp4_head_weight_is_rounded_to_bf16_after_the_scale() {
        let w = [1.0f32, 1.01];
        let pq = prepare_query(IndexProfile::OfficialFp4, &Q, &w, HEADS, DIM);
        assert_eq!(pq.weights[0], 181.0 / 512.0);
        assert_ne!(pq.weights[0], s());
        // bf(1.01) = 1.0078125; · S = 0.356315... = 182.43 steps of 2^-9 -> bf16 182 / 512.
        assert_eq!(pq.weights[1], 182.0 / 512.0);
        let sglang = prepare_query(IndexProfile::SglangFp4, &Q, &w, HEADS, DIM);
        assert_eq!(sglang.weights, vec![s(), 1.0078125 * s()]);
    }

    /// A 128-dim index row in the Hadamard basis `t` with t[0] = 4 (block 0) and t[32] = 0.7
    /// (block 1), so the rotated row the fp4 step sees is `t` up to rounding noise. With scales per
    /// 32 elements (docs/spec/attention.md 3.6) block 1 gets scale 2^-3 and 0.7 -> 5.6 -> e2m1 6 -> 0.75; a
    /// block of 64 or 128 would share block 0's scale 1 and give 0.5.
    #[test]
    fn fp4_profiles_scale_each_32_elements_of_a_128_dim_row_on_their_own() {
        const N: usize = 128;
        let sylvester = |i: usize, j: usize| {
            if (i & j).count_ones().is_multiple_of(2) {
                1.0
            } else {
                -1.0
            }
        };
        let row: Vec<f32> = (0..N)
            .map(|i| ((4.0 * sylvester(i, 0) + 0.7 * sylvester(i, 32)) / (N as f64).sqrt()) as f32)
            .collect();
        for p in [IndexProfile::OfficialFp4, IndexProfile::SglangFp4] {
            let mut key = vec![0.0; N];
            assert_eq!(prepare_key_row(p, &row, &mut key), 1.0);
            assert_eq!((key[0], key[32]), (4.0, 0.75), "{p} key");
            let query = prepare_query(p, &row, &[1.0], 1, N);
            assert_eq!(
                (query.values[0], query.values[32]),
                (4.0, 0.75),
                "{p} query"
            );
        }
    }

    #[test]
    fn exact_scores_are_invariant_under_hadamard_on_both_sides() {
        let (heads, dim, rows) = (4usize, 32usize, 10usize);
        let mut rng = Rng::new(7);
        let (q, w, k) = (
            rng.values(heads * dim, 1.0),
            rng.values(heads, 1.0),
            rng.values(rows * dim, 1.0),
        );
        let (mut qr, mut kr) = (q.clone(), k.clone());
        hadamard_rows(&mut qr, dim).unwrap();
        hadamard_rows(&mut kr, dim).unwrap();
        let p = IndexProfile::Exact;
        let (mut a, mut b) = (vec![0.0; rows], vec![0.0; rows]);
        score_rows(
            p,
            &prepare_query(p, &q, &w, heads, dim),
            &prepare_keys(p, &k, dim),
            &mut a,
        );
        score_rows(
            p,
            &prepare_query(p, &qr, &w, heads, dim),
            &prepare_keys(p, &kr, dim),
            &mut b,
        );
        let scale = a.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert!(scale > 0.0);
        for i in 0..rows {
            assert!(
                (a[i] - b[i]).abs() <= 1e-5 * scale,
                "row {i}: {} vs {}",
                a[i],
                b[i]
            );
        }
    }

    #[test]
    fn batch_and_streaming_preparation_agree_for_every_profile() {
        let (heads, dim, rows) = (4usize, 32usize, 300usize);
        let mut rng = Rng::new(11);
        let (q, w, k) = (
            rng.values(heads * dim, 1.0),
            rng.values(heads, 1.0),
            rng.values(rows * dim, 1.0),
        );
        for p in IndexProfile::ALL {
            let pq = prepare_query(p, &q, &w, heads, dim);
            let keys = prepare_keys(p, &k, dim);
            let mut out = vec![0.0; rows];
            score_rows(p, &pq, &keys, &mut out);
            let mut row = vec![0.0; dim];
            for r in 0..rows {
                let ks = prepare_key_row(p, &k[r * dim..(r + 1) * dim], &mut row);
                assert_eq!(keys.row(r), (&row[..], ks), "{p}: key row {r}");
                assert_eq!(
                    out[r].to_bits(),
                    score(p, &pq, &row, ks).to_bits(),
                    "{p}: row {r}"
                );
            }
        }
    }

    #[test]
    fn every_profile_stays_near_exact_scores() {
        let (heads, dim, rows) = (8usize, 128usize, 64usize);
        let mut rng = Rng::new(23);
        let (q, w, k) = (
            rng.values(heads * dim, 1.0),
            rng.values(heads, 1.0),
            rng.values(rows * dim, 1.0),
        );
        let run = |p: IndexProfile, q: &[f32], k: &[f32]| {
            let mut out = vec![0.0; rows];
            score_rows(
                p,
                &prepare_query(p, q, &w, heads, dim),
                &prepare_keys(p, k, dim),
                &mut out,
            );
            out
        };
        let exact = run(IndexProfile::Exact, &q, &k);
        let scale = exact.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        // The no-Hadamard-k bug is compared with its own bilinear form Σ w ReLU((Hq)·k).
        let mut qr = q.clone();
        hadamard_rows(&mut qr, dim).unwrap();
        let bug_form = run(IndexProfile::Exact, &qr, &k);
        for (p, tol) in [
            (IndexProfile::SglangFp8, 0.05),
            (IndexProfile::SglangBf16Keys, 0.05),
            (IndexProfile::Bf16Qk, 0.01),
            (IndexProfile::SglangFp4, 0.3),
            (IndexProfile::OfficialFp4, 0.3),
            (IndexProfile::VllmFp8, 0.08),
            (IndexProfile::Fp8NoHadamardK, 0.08),
        ] {
            let got = run(p, &q, &k);
            let want = if p == IndexProfile::Fp8NoHadamardK {
                &bug_form
            } else {
                &exact
            };
            let worst = (0..rows)
                .map(|i| (got[i] - want[i]).abs() / scale)
                .fold(0.0f32, f32::max);
            assert!(worst <= tol, "{p}: worst relative error {worst} > {tol}");
        }
    }

    /// The fp8 profiles (SGLang and vLLM) take the head weight as bf16 before the indexer scale and
    /// the folded query scale: w = 1.01 acts as bf16(1.01) = 1.0078125. (Query scale s_q: Hq0 =
    /// [2, 0, 0, 0] gives fp32(2/448) for SGLang; vLLM rotates nothing, q0 = [1; 4] gives 2^-8.)
    #[test]
    fn fp8_profiles_round_the_head_weight_to_bf16_before_the_scales() {
        use IndexProfile::*;
        let sglang_q = 2.0f32 / 448.0;
        for (p, s_q) in [
            (SglangFp8, sglang_q),
            (SglangBf16Keys, sglang_q),
            (Fp8NoHadamardK, sglang_q),
            (VllmFp8, 2f32.powi(-8)),
        ] {
            let pq = prepare_query(p, &Q, &[1.01, 3.0], HEADS, DIM);
            assert_eq!(pq.weights[0], (1.0078125 * s()) * s_q, "{p}");
            assert_ne!(pq.weights[0], (1.01 * s()) * s_q, "{p}: precondition");
        }
    }

    /// The profiles whose engines read bf16 inputs round the raw row first (REF's fp4 query and
    /// key, SGLang's fp4 query, vLLM's fp8 query and key, bf16-qk): an f32 row and its bf16
    /// rounding prepare identically. The rows are ones where that first rounding matters:
    /// skipping it moves some element across an e2m1 / e4m3 decision.
    #[test]
    fn bf16_first_profiles_round_the_raw_rows_before_anything_else() {
        use IndexProfile::*;
        let (heads, dim) = (8usize, 128usize);
        let mut rng = Rng::new(31);
        let (x, w) = (rng.values(heads * dim, 1.0), rng.values(heads, 1.0));
        let mut xb = x.clone();
        bf16_round_slice(&mut xb);
        assert_ne!(x, xb);
        for p in [OfficialFp4, SglangFp4, VllmFp8, Bf16Qk] {
            assert_eq!(
                prepare_query(p, &x, &w, heads, dim),
                prepare_query(p, &xb, &w, heads, dim),
                "{p} query"
            );
        }
        for p in [OfficialFp4, VllmFp8, Bf16Qk] {
            assert_eq!(
                prepare_keys(p, &x, dim),
                prepare_keys(p, &xb, dim),
                "{p} keys"
            );
        }
        // Preconditions: without the first rounding these rows come out differently.
        let mut fp4_unrounded = x.clone();
        hadamard_rows(&mut fp4_unrounded, dim).unwrap();
        bf16_round_slice(&mut fp4_unrounded);
        for row in fp4_unrounded.chunks_mut(dim) {
            fp4_sim_pow2_rne(row, INDEX_FP4_BLOCK);
        }
        assert_ne!(fp4_unrounded, prepare_keys(OfficialFp4, &x, dim).values);
        let fp8_unrounded: Vec<f32> = x
            .chunks(dim)
            .flat_map(|h| crate::numerics::quant::fp8_row_scale_pow2(h).0)
            .collect();
        assert_ne!(
            fp8_unrounded,
            prepare_query(VllmFp8, &x, &w, heads, dim).values
        );
    }
}
