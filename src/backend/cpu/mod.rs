//! The CPU backend: the numerical reference implementation of [`Backend`].
//!
//! f32 compute throughout (the linear products optionally with bf16 operands, `--cpu-gemm`),
//! rayon across rows / heads / experts, the `gemm` crate for every f32 matrix product. The
//! pieces live in sibling files by op family: [`linalg`] (resident weights, banded GEMM,
//! grouped GEMM, dot), [`bf16_gemm`] (the products with bf16 operands of
//! `--cpu-gemm bf16`, on AMX tiles where present), [`hyper`] (mHC), [`attention`] (sparse
//! attention with sink, compressor pooling), [`selection`] (indexer scoring through
//! `numerics::profiles`, top-k) and [`experts`] (router, SwiGLU, MoE). [`norm`] holds RMS norm
//! (f64 lanes, one rounding) and RoPE (cos / sin in f64); [`peak`] measures the cores' f32 FMA
//! peak for `bench`.

pub mod attention;
pub mod bf16_gemm;
pub mod experts;
pub mod hyper;
pub mod linalg;
pub mod norm;
pub mod peak;
pub mod selection;

pub use linalg::CpuMatrix;
pub use norm::{rms_norm, rms_scale, rope, RMS_LANES};

use crate::backend::gpu::GemmType;
use crate::backend::{
    AttentionBatch, AttentionProbs, Backend, FfnWeights, HcParams, HcWeights, IndexScoreBatch,
    PoolLayout, RawIndexQueries, Routes, WeightResidency,
};
use crate::checkpoint::linear::SharedLinear;
use crate::checkpoint::CheckpointError;
use crate::numerics::profiles::{self, IndexProfile, PreparedQuery};
use crate::numerics::quant;
use crate::numerics::rope::RopeTable;
use rayon::prelude::*;

/// The CPU reference backend. Uses rayon's global pool. `weights` says how linears are kept:
/// `Decoded` (f32 at load) or `Streamed` (stored format, decoded per use; see
/// [`linalg::CpuMatrix`]); `Auto` is resolved by the engine before it builds the backend and
/// means `Decoded` here.
/// `gemm` is the operand type of the linear products: `F32` (the reference, the default) or
/// `Bf16` (`--cpu-gemm bf16`: [`bf16_gemm`], bf16 operands, f32 accumulation, as
/// `--gpu-gemm bf16`); the mHC mixes and the router stay f32 either way, as on the GPU.
#[derive(Clone, Copy, Debug)]
pub struct CpuBackend {
    weights: WeightResidency,
    gemm: GemmType,
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::with_weights(WeightResidency::Auto)
    }
}

impl CpuBackend {
    /// A backend that decodes every weight at load.
    pub fn new() -> Self {
        Self::with_weights(WeightResidency::Decoded)
    }

    pub fn with_weights(weights: WeightResidency) -> Self {
        CpuBackend {
            weights,
            gemm: GemmType::F32,
        }
    }

    /// This backend with linear products of operand type `gemm`.
    pub fn with_gemm(self, gemm: GemmType) -> Self {
        CpuBackend { gemm, ..self }
    }

    /// The residency of linears uploaded to this backend (`Decoded` or `Streamed`).
    pub fn weights(&self) -> WeightResidency {
        match self.weights {
            WeightResidency::Streamed => WeightResidency::Streamed,
            WeightResidency::Decoded | WeightResidency::Auto => WeightResidency::Decoded,
        }
    }
}

/// The widest f32 FMA kernels the `gemm` crate picks on this CPU at run time (its `x86-v4`
/// feature is on, so AVX-512 where present): `avx512f`, `avx2+fma` or `baseline`.
pub fn simd_level() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return "avx512f";
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return "avx2+fma";
        }
    }
    "baseline"
}

/// Tunes glibc's allocator for the CPU backend's temporaries (call once at start-up, before
/// the work): products decode and pack weights in bands of a few MiB and layers allocate
/// activations of tens of MiB, each freed soon after. Above glibc's default 128 KiB-and-up
/// mapping threshold every such buffer is a fresh mapping whose pages fault in one by one on
/// first touch (measured: page faults and their zeroing took about 8 % of a Flash prefill);
/// served from the heap, the same pages are reused. Buffers above 32 MiB (glibc's ceiling for
/// the threshold) are still mapped. No effect off glibc.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters (it takes the allocator's own locks).
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

impl Backend for CpuBackend {
    type Matrix = CpuMatrix;
    type Act = Vec<f32>;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn reference_gemm_tflops(&self) -> Option<(String, f64)> {
        // 512 tokens through a 2048 -> 4096 linear (a Flash expert's down projection), best of
        // three: the figure the per-layer rates are compared with.
        let (m, n, k) = (512, 4096, 2048);
        let w = self.upload_matrix(vec![0.5f32; n * k], n, k);
        let x = vec![0.25f32; m * k];
        let mut y = vec![0f32; m * n];
        bf16_gemm::matmul_as(self.gemm, &x, &w, &mut y);
        let secs = (0..3)
            .map(|_| {
                let t0 = std::time::Instant::now();
                bf16_gemm::matmul_as(self.gemm, &x, &w, &mut y);
                t0.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
            .max(1e-12);
        let tflops = 2.0 * (m * n * k) as f64 / secs / 1e12;
        // What fraction of these cores' f32 arithmetic the product reached (the f32 product
        // only: bf16 runs on other units).
        let peak_note = match (self.gemm, peak::fma_peak_tflops()) {
            (GemmType::F32, Some((peak, vectors))) => format!(
                "; {:.0}% of the threads' measured f32 FMA peak, {peak:.3} TFLOP/s on {vectors}",
                100.0 * tflops / peak
            ),
            _ => String::new(),
        };
        Some((
            format!(
                "{} GEMM {m}x{n}x{k} ({} kernels, {} threads{peak_note})",
                match self.gemm {
                    GemmType::F32 => "f32",
                    GemmType::Bf16 => "bf16",
                },
                match self.gemm {
                    GemmType::F32 => format!("gemm crate, {}", simd_level()),
                    GemmType::Bf16 => bf16_gemm::bf16_kernels().to_string(),
                },
                rayon::current_num_threads()
            ),
            tflops,
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
        bf16_gemm::matmul_as(self.gemm, x, w, y)
    }

    fn matmul_grouped(&self, x: &Vec<f32>, groups: usize, w: &CpuMatrix, y: &mut Vec<f32>) {
        bf16_gemm::matmul_grouped_as(self.gemm, x, groups, w, y)
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
        raw: &RawIndexQueries<'_, Vec<f32>>,
        values: &mut Vec<f32>,
        weights: &mut Vec<f32>,
    ) {
        let RawIndexQueries {
            profile,
            heads,
            dim,
            ..
        } = *raw;
        let (q_raw, weights_raw) = (raw.queries, raw.weights);
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

    fn index_scores_batch(&self, batch: &IndexScoreBatch<'_, Vec<f32>>, out: &mut Vec<f32>) {
        selection::index_scores_batch(&batch.block(), out)
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
        experts::moe_experts(self.gemm, u, routes, experts, swiglu_limit, out)
    }

    fn ffn(
        &self,
        u: &Vec<f32>,
        ffn: &FfnWeights<CpuMatrix>,
        swiglu_limit: f32,
        out: &mut Vec<f32>,
    ) {
        experts::ffn(self.gemm, u, ffn, swiglu_limit, out)
    }

    fn swiglu(&self, gate: &mut Vec<f32>, up: &Vec<f32>, limit: f32) {
        experts::swiglu(gate, up, limit)
    }
}
