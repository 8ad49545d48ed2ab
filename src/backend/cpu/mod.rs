//! The CPU backend: the numerical reference implementation of [`Backend`].
//!
//! f32 compute throughout, rayon across rows / heads / experts, the `gemm` crate for every
//! matrix product. The pieces live in sibling files by op family:
//! [`linalg`] (resident weights, banded GEMM, grouped GEMM, dot), [`hyper`] (mHC),
//! [`attention`] (sparse attention with sink, compressor pooling), [`selection`] (indexer
//! scoring through `numerics::profiles`, top-k) and [`experts`] (router, SwiGLU, MoE).
//! RMS norm and RoPE are here.
//!
//! RMS norm accumulates the mean square in f64 (one rounding to f32 at the end) so the result is
//! independent of summation order; RoPE evaluates cos / sin per position in f64 (see
//! `model::rope`).

pub mod attention;
pub mod experts;
pub mod hyper;
pub mod linalg;
pub mod selection;

pub use linalg::CpuMatrix;

use crate::backend::{
    AttentionBatch, AttentionProbs, Backend, FfnWeights, HcParams, HcWeights, PoolLayout, Routes,
    WeightResidency,
};
use crate::checkpoint::linear::SharedLinear;
use crate::checkpoint::CheckpointError;
use crate::model::rope::{rotate_pairs, RopeTable};
use crate::numerics::profiles::{self, IndexProfile, PreparedQuery};
use crate::numerics::quant;
use rayon::prelude::*;

/// The CPU reference backend. Uses rayon's global pool. `weights` says how linears are kept:
/// `Decoded` (f32 at load) or `Streamed` (stored format, decoded per use; see
/// [`linalg::CpuMatrix`]); `Auto` is resolved by the engine before it builds the backend and
/// means `Decoded` here.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend {
    weights: WeightResidency,
}

impl CpuBackend {
    /// A backend that decodes every weight at load.
    pub fn new() -> Self {
        Self::with_weights(WeightResidency::Decoded)
    }

    pub fn with_weights(weights: WeightResidency) -> Self {
        CpuBackend { weights }
    }

    /// The residency of linears uploaded to this backend (`Decoded` or `Streamed`).
    pub fn weights(&self) -> WeightResidency {
        match self.weights {
            WeightResidency::Streamed => WeightResidency::Streamed,
            WeightResidency::Decoded | WeightResidency::Auto => WeightResidency::Decoded,
        }
    }
}

/// In-place RMS norm of every `dim`-long vector of `x`.
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

/// In-place RoPE, see [`Backend::rope`].
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

impl Backend for CpuBackend {
    type Matrix = CpuMatrix;
    type Act = Vec<f32>;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn reference_gemm_tflops(&self) -> Option<(String, f64)> {
        let (m, n, k) = (512, 2048, 2048);
        let w = self.upload_matrix(vec![0.5f32; n * k], n, k);
        let x = vec![0.25f32; m * k];
        let mut y = vec![0f32; m * n];
        linalg::matmul(&x, &w, &mut y);
        let t0 = std::time::Instant::now();
        linalg::matmul(&x, &w, &mut y);
        let secs = t0.elapsed().as_secs_f64().max(1e-12);
        Some((
            format!("f32 GEMM {m}x{n}x{k} (gemm crate)"),
            2.0 * (m * n * k) as f64 / secs / 1e12,
        ))
    }

    fn act_from(&self, data: Vec<f32>) -> Vec<f32> {
        data
    }

    fn act_zeros(&self, len: usize) -> Vec<f32> {
        vec![0.0; len]
    }

    fn act_len(&self, a: &Vec<f32>) -> usize {
        a.len()
    }

    fn act_read(&self, a: &Vec<f32>, start: usize, out: &mut [f32]) {
        out.copy_from_slice(&a[start..start + out.len()]);
    }

    fn act_host<'a>(&self, a: &'a Vec<f32>) -> std::borrow::Cow<'a, [f32]> {
        std::borrow::Cow::Borrowed(a)
    }

    fn act_into_host(&self, a: Vec<f32>) -> Vec<f32> {
        a
    }

    fn act_append(&self, a: &mut Vec<f32>, tail: &Vec<f32>) {
        a.extend_from_slice(tail);
    }

    fn act_drop_front(&self, a: &mut Vec<f32>, n: usize) {
        a.drain(..n);
        // A cache that held a chunk for a moment (a compressor's held tokens) gives the memory
        // back, as the GPU backend's caches do.
        if 4 * a.len() <= a.capacity() && a.capacity() > 1024 {
            a.shrink_to((2 * a.len()).max(1024));
        }
    }

    fn upload_matrix(&self, data: Vec<f32>, rows: usize, cols: usize) -> CpuMatrix {
        CpuMatrix::new(data, rows, cols)
    }

    fn upload_linear(&self, w: SharedLinear) -> Result<CpuMatrix, CheckpointError> {
        match self.weights() {
            WeightResidency::Streamed => CpuMatrix::streamed(w),
            _ => {
                let (rows, cols) = (w.rows(), w.cols());
                Ok(CpuMatrix::new(w.decode_f32()?, rows, cols))
            }
        }
    }

    fn matrix_shape(&self, m: &CpuMatrix) -> (usize, usize) {
        (m.rows(), m.cols())
    }

    fn gather_rows(&self, table: &CpuMatrix, rows: &[usize], out: &mut Vec<f32>) {
        linalg::gather_rows(table, rows, out)
    }

    fn matmul(&self, x: &Vec<f32>, w: &CpuMatrix, y: &mut Vec<f32>) {
        linalg::matmul(x, w, y)
    }

    fn matmul_grouped(&self, x: &Vec<f32>, groups: usize, w: &CpuMatrix, y: &mut Vec<f32>) {
        linalg::matmul_grouped(x, groups, w, y)
    }

    fn add_assign(&self, x: &mut Vec<f32>, y: &Vec<f32>) {
        x.par_iter_mut()
            .zip(y.par_iter())
            .for_each(|(a, b)| *a += b);
    }

    fn rms_norm(&self, x: &mut Vec<f32>, dim: usize, weight: Option<&[f32]>, eps: f32) {
        rms_norm(x, dim, weight, eps)
    }

    fn rope(
        &self,
        table: &RopeTable,
        x: &mut Vec<f32>,
        vec_len: usize,
        positions: &[usize],
        inverse: bool,
    ) {
        rope(table, x, vec_len, positions, inverse)
    }

    fn hc_pre(
        &self,
        streams: &Vec<f32>,
        site: &HcWeights<'_, CpuMatrix>,
        params: &HcParams,
        input: &mut Vec<f32>,
        post: &mut Vec<f32>,
        comb: &mut Vec<f32>,
    ) {
        hyper::hc_pre(streams, site, params, input, post, comb)
    }

    fn hc_post(
        &self,
        streams: &mut Vec<f32>,
        y: &Vec<f32>,
        post: &Vec<f32>,
        comb: &Vec<f32>,
        n: usize,
    ) {
        hyper::hc_post(streams, y, post, comb, n)
    }

    fn hc_head(
        &self,
        streams: &Vec<f32>,
        site: &HcWeights<'_, CpuMatrix>,
        params: &HcParams,
        out: &mut Vec<f32>,
    ) {
        hyper::hc_head(streams, site, params, out)
    }

    fn compressor_pool(
        &self,
        values: &Vec<f32>,
        logits: &Vec<f32>,
        ape: &[f32],
        layout: PoolLayout,
        out: &mut Vec<f32>,
    ) {
        attention::compressor_pool(values, logits, ape, layout, out)
    }

    fn kv_fp8_sim(&self, rows: &mut Vec<f32>, row_len: usize, nope_dims: usize) {
        rows.par_chunks_mut(row_len)
            .for_each(|r| quant::kv_fp8_sim(r, nope_dims));
    }

    fn index_prepare_keys(
        &self,
        profile: IndexProfile,
        raw: &Vec<f32>,
        dim: usize,
        prepared: &mut Vec<f32>,
        scales: &mut Vec<f32>,
    ) {
        selection::index_prepare_keys(profile, raw, dim, prepared, scales)
    }

    fn index_prepare_query(
        &self,
        profile: IndexProfile,
        q_raw: &[f32],
        weights_raw: &[f32],
        heads: usize,
        dim: usize,
    ) -> PreparedQuery {
        profiles::prepare_query(profile, q_raw, weights_raw, heads, dim)
    }

    fn index_prepare_queries(
        &self,
        profile: IndexProfile,
        q_raw: &Vec<f32>,
        weights_raw: &Vec<f32>,
        heads: usize,
        dim: usize,
        values: &mut Vec<f32>,
        weights: &mut Vec<f32>,
    ) {
        let hd = heads * dim;
        values
            .par_chunks_mut(hd.max(1))
            .zip(weights.par_chunks_mut(heads.max(1)))
            .enumerate()
            .for_each(|(i, (qo, wo))| {
                let q = profiles::prepare_query(
                    profile,
                    &q_raw[i * hd..(i + 1) * hd],
                    &weights_raw[i * heads..(i + 1) * heads],
                    heads,
                    dim,
                );
                qo.copy_from_slice(&q.values);
                wo.copy_from_slice(&q.weights);
            });
    }

    fn index_scores(
        &self,
        profile: IndexProfile,
        query: &PreparedQuery,
        keys: &[f32],
        key_scales: &[f32],
        dim: usize,
        out: &mut [f32],
    ) {
        selection::index_scores(profile, query, keys, key_scales, dim, out)
    }

    fn index_scores_batch(
        &self,
        profile: IndexProfile,
        queries: &Vec<f32>,
        weights: &Vec<f32>,
        first: usize,
        heads: usize,
        dim: usize,
        keys: &Vec<f32>,
        key_scales: &Vec<f32>,
        visible: &[usize],
        out: &mut Vec<f32>,
    ) {
        let tokens = visible.len();
        let rows = visible.iter().copied().max().unwrap_or(0);
        selection::index_scores_batch(
            profile,
            &queries[first * heads * dim..(first + tokens) * heads * dim],
            &weights[first * heads..(first + tokens) * heads],
            heads,
            dim,
            &keys[..rows * dim],
            &key_scales[..rows],
            visible,
            out,
        )
    }

    fn topk_batch(&self, scores: &Vec<f32>, stride: usize, visible: &[usize], out: &mut [i32]) {
        selection::topk_batch(scores, stride, visible, out)
    }

    fn topk(&self, scores: &[f32], out: &mut [i32]) {
        selection::topk(scores, out)
    }

    fn sparse_attention(
        &self,
        batch: &AttentionBatch<'_, Vec<f32>>,
        out: &mut Vec<f32>,
        probs: &mut [Option<AttentionProbs>],
    ) {
        let kv = [batch.kv[0].as_slice(), batch.kv[1].as_slice()];
        attention::sparse_attention(
            &batch.with_tensors(batch.queries.as_slice(), kv),
            out,
            probs,
        )
    }

    fn router_scores(&self, u: &Vec<f32>, gate: &CpuMatrix, out: &mut [f32]) {
        experts::router_scores(u, gate, out)
    }

    fn moe_experts(
        &self,
        u: &Vec<f32>,
        routes: &Routes<'_>,
        experts: &[FfnWeights<CpuMatrix>],
        swiglu_limit: f32,
        out: &mut Vec<f32>,
    ) {
        experts::moe_experts(u, routes, experts, swiglu_limit, out)
    }

    fn ffn(
        &self,
        u: &Vec<f32>,
        ffn: &FfnWeights<CpuMatrix>,
        swiglu_limit: f32,
        out: &mut Vec<f32>,
    ) {
        experts::ffn(u, ffn, swiglu_limit, out)
    }

    fn swiglu(&self, gate: &mut Vec<f32>, up: &Vec<f32>, limit: f32) {
        experts::swiglu(gate, up, limit)
    }
}

#[cfg(test)]
mod tests {

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
    use super::*;

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
