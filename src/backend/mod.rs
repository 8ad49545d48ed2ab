//! The compute backend: the operations of the DeepSeek-V4 forward pass, at the level of this
//! model (not a generic tensor library).
//!
//! [`Backend`] is what the model code in `crate::model` calls for every piece of arithmetic. The
//! CPU implementation ([`cpu::CpuBackend`]) is the numerical reference: f32 everywhere, rayon
//! across rows / heads / experts, the `gemm` crate for matrix products. A CUDA backend implements
//! the same trait and is compared to the CPU one op by op (design.md section 8), so every method
//! is one well-defined piece of math with plain shapes:
//!
//! - Linear weights reach the backend in their stored format ([`Backend::upload_linear`] takes
//!   a [`SharedLinear`]: the checkpoint's bytes plus scale kind, sharing its memory map); the
//!   backend decides their resident form ([`Backend::Matrix`]) under a [`WeightResidency`]:
//!   decoded to f32 once at load, or kept as stored and decoded on use (a model larger than
//!   RAM streams from the page cache; a device backend keeps the stored format on the device
//!   and dequantises in its kernels). Small f32 tensors (mHC mixes) come decoded through
//!   [`Backend::upload_matrix`]. Every op sees the same f32 values either way.
//! - Activations are host `f32` slices, row-major, shapes given in each method's docs
//!   (`T` = tokens of the chunk, `D` = hidden size, `n` = hc_mult streams, `H` = heads).
//!   Keeping activations on the host is the simple, op-comparable choice for this revision; a
//!   device backend that keeps activations resident would add buffer types here, the op
//!   signatures stay the same.
//!
//! Rounding steps that belong to a numerics *profile* (index keys / queries) or to `--kv fp8`
//! are delegated to `crate::numerics`; no method here rounds on its own.

pub mod cpu;
pub mod gpu;
pub mod parity;

pub use cpu::CpuBackend;

use crate::checkpoint::linear::SharedLinear;
use crate::checkpoint::CheckpointError;
use crate::model::rope::RopeTable;
use crate::numerics::profiles::{IndexProfile, PreparedQuery};

/// Where linear weights live between uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WeightResidency {
    /// Decoded to f32 once, at load (fastest; needs ~4 bytes per parameter of RAM).
    Decoded,
    /// Kept in the stored format (the checkpoint's memory map) and decoded per use, a band of
    /// rows at a time: memory stays near the stored size, paged in and out by the OS.
    Streamed,
    /// `Decoded` when the decoded model fits comfortably in memory, else `Streamed` (resolved
    /// by the engine at load, see `model::forward`).
    #[default]
    Auto,
}

impl WeightResidency {
    pub fn name(self) -> &'static str {
        match self {
            WeightResidency::Decoded => "decoded",
            WeightResidency::Streamed => "streamed",
            WeightResidency::Auto => "auto",
        }
    }
}

impl std::fmt::Display for WeightResidency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for WeightResidency {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "decoded" => Ok(WeightResidency::Decoded),
            "streamed" => Ok(WeightResidency::Streamed),
            "auto" => Ok(WeightResidency::Auto),
            other => Err(format!(
                "unknown weight residency {other:?}, expected decoded, streamed or auto"
            )),
        }
    }
}

/// A part of the model, for [`Backend::enter_site`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Site {
    /// The token embedding (placed with the first layer).
    Embed,
    /// Decoder layer `i`.
    Layer(usize),
    /// The final mHC head, norm and LM head (placed with the last layer).
    Head,
}

/// Scalars of the mHC sites (model.md 4.3): stream count, Sinkhorn iterations and epsilons.
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

/// The weights of one mHC site as the backend needs them.
pub struct HcWeights<'a, M> {
    /// `[(2+n)·n, n·D]` for a layer site, `[n, n·D]` for the head.
    pub mix: &'a M,
    /// `[(2+n)·n]` (layer site) or `[n]` (head).
    pub base: &'a [f32],
    /// `[3]` (layer site) or `[1]` (head).
    pub scale: &'a [f32],
}

/// One SwiGLU feed-forward network (a routed expert or the shared expert).
pub struct FfnWeights<M> {
    /// Gate projection `[I, D]`.
    pub w1: M,
    /// Down projection `[D, I]`.
    pub w2: M,
    /// Up projection `[I, D]`.
    pub w3: M,
}

/// Expert choice of every token of a chunk: `experts[t*k + s]` with weight `weights[t*k + s]`.
pub struct Routes<'a> {
    /// Experts per token (`num_experts_per_tok`).
    pub per_token: usize,
    pub experts: &'a [usize],
    pub weights: &'a [f32],
}

/// The queries of a chunk and, per query, the key/value vectors it attends (MQA: key = value).
pub struct AttentionBatch<'a> {
    pub heads: usize,
    pub head_dim: usize,
    /// Logit scale (head_dim^-0.5).
    pub scale: f32,
    /// `[H]` sink logits: in the softmax denominator only, unscaled, no value vector.
    pub sinks: &'a [f32],
    /// `[T, H, head_dim]`.
    pub queries: &'a [f32],
    /// Per query: the attended vectors (`head_dim` each), window tokens first, then
    /// compressed rows, in the order the probabilities are reported.
    pub entries: &'a [Vec<&'a [f32]>],
    /// Per query: whether to return the probabilities (for the observer).
    pub want_probs: &'a [bool],
}

/// Softmax probabilities of one query, returned when asked for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AttentionProbs {
    /// `[H, entries]`, head-major.
    pub probs: Vec<f32>,
    /// `[H]`: the sink's share of each head's denominator.
    pub sink: Vec<f32>,
}

/// The operations of the DeepSeek-V4 forward pass. Shapes are in each method's docs; slices
/// whose lengths disagree with them are a caller bug (methods may panic).
pub trait Backend: Send + Sync {
    /// A weight matrix `[out, in]` in the backend's resident form (decoded or stored).
    type Matrix: Send + Sync;

    /// Short name for reports (`cpu`, `cuda`).
    fn name(&self) -> &'static str;

    /// The first device failure since the last call, if any. Ops cannot return errors (their
    /// signatures are the math), so a backend that can fail (out of memory, a failed launch)
    /// records its first failure, fills the outputs of failed ops with NaN, and the engine asks
    /// here after loading and after every layer, turning it into an error. The CPU never fails.
    fn take_error(&self) -> Option<String> {
        None
    }

    /// A reference matrix-product speed measured now, for benchmarks: (what was measured,
    /// TFLOP/s). The CPU times an f32 GEMM through its matmul; a GPU a bf16 cuBLAS GEMM with
    /// resident operands (the peak its layers can be compared against). None if unknown.
    fn reference_gemm_tflops(&self) -> Option<(String, f64)> {
        None
    }

    /// Tells a multi-device backend which part of the model the following uploads and ops
    /// belong to, so they run on that part's device. Single-device backends ignore it.
    fn enter_site(&self, _site: Site) {}

    /// Takes ownership of a decoded f32 weight `[rows, cols]` row-major.
    fn upload_matrix(&self, data: Vec<f32>, rows: usize, cols: usize) -> Self::Matrix;

    /// Takes a linear weight `[out, in]` in its stored format and makes it resident under the
    /// backend's [`WeightResidency`]. Errors are decode errors of the stored data, reported
    /// here (at load) so that later uses cannot fail.
    fn upload_linear(&self, w: SharedLinear) -> Result<Self::Matrix, CheckpointError>;

    /// `(rows, cols)` of a matrix.
    fn matrix_shape(&self, m: &Self::Matrix) -> (usize, usize);

    /// Copies row `rows[i]` of `table` `[V, D]` to `out[i]` (`[rows.len(), D]`). Rows are
    /// validated by the caller.
    fn gather_rows(&self, table: &Self::Matrix, rows: &[usize], out: &mut [f32]);

    /// `y[T, out] = x[T, in] · Wᵀ` in f32.
    fn matmul(&self, x: &[f32], w: &Self::Matrix, y: &mut [f32]);

    /// Grouped projection (`wo_a`): `x` is `[T, G·in]`, `w` is `[G·out, in]`; group g of every
    /// row is multiplied by rows `g·out..(g+1)·out` of `w`, giving `y[T, G·out]` (group-major).
    fn matmul_grouped(&self, x: &[f32], groups: usize, w: &Self::Matrix, y: &mut [f32]);

    /// In-place RMS norm over consecutive vectors of length `dim`:
    /// `x ← x / sqrt(mean(x²) + eps) (⊙ weight)`.
    fn rms_norm(&self, x: &mut [f32], dim: usize, weight: Option<&[f32]>, eps: f32);

    /// In-place RoPE on interleaved pairs of the LAST `table.rope_dim()` dims of every vector of
    /// length `vec_len`. `x` is `[positions.len(), vecs, vec_len]`; every vector of row i is
    /// rotated by the angles of `positions[i]`. `inverse` rotates by the negated angle.
    fn rope(
        &self,
        table: &RopeTable,
        x: &mut [f32],
        vec_len: usize,
        positions: &[usize],
        inverse: bool,
    );

    /// mHC pre-mix of a layer site: from `streams [T, n, D]` computes the block input
    /// `input [T, D]` = Σ_j pre_j·X_j and the post / comb coefficients (`post [T, n]`,
    /// `comb [T, n, n]`, comb[j][k] multiplies stream j into stream k) with Sinkhorn.
    fn hc_pre(
        &self,
        streams: &[f32],
        site: &HcWeights<'_, Self::Matrix>,
        params: &HcParams,
        input: &mut [f32],
        post: &mut [f32],
        comb: &mut [f32],
    );

    /// mHC post-mix in place: `X'_k = post_k·y + Σ_j comb[j][k]·X_j` for `streams [T, n, D]`,
    /// block output `y [T, D]`.
    fn hc_post(&self, streams: &mut [f32], y: &[f32], post: &[f32], comb: &[f32], n: usize);

    /// Final HC head: `out [T, D]` = Σ_j (σ(m_j·scale + base_j) + hc_eps)·X_j, no Sinkhorn.
    fn hc_head(
        &self,
        streams: &[f32],
        site: &HcWeights<'_, Self::Matrix>,
        params: &HcParams,
        out: &mut [f32],
    );

    /// Compressor pooling: per output row and channel, a softmax over `slots` gate logits
    /// weighting the slot values. `values`, `logits` are `[rows, slots, width]`, `out` is
    /// `[rows, width]`. A logit of -inf gives its slot weight 0.
    fn compressor_pool(
        &self,
        values: &[f32],
        logits: &[f32],
        slots: usize,
        width: usize,
        out: &mut [f32],
    );

    /// `--kv fp8`: e4m3 simulation (blocks of 64, power-of-two scales) of the first `nope_dims`
    /// dims of every row of length `row_len`, in place.
    fn kv_fp8_sim(&self, rows: &mut [f32], row_len: usize, nope_dims: usize);

    /// Prepares raw index key rows `[rows, dim]` for scoring under `profile`, writing the
    /// prepared rows and one scale per row.
    fn index_prepare_keys(
        &self,
        profile: IndexProfile,
        raw: &[f32],
        dim: usize,
        prepared: &mut [f32],
        scales: &mut [f32],
    );

    /// Prepares one token's index query `[heads, dim]` (after RoPE) and raw head weights
    /// `[heads]` (before the 2^-6.5 scale) under `profile`.
    fn index_prepare_query(
        &self,
        profile: IndexProfile,
        q_raw: &[f32],
        weights_raw: &[f32],
        heads: usize,
        dim: usize,
    ) -> PreparedQuery;

    /// Prepares the index queries of T tokens at once: `q_raw [T, heads, dim]`, `weights_raw
    /// [T, heads]` into `values [T, heads, dim]` and `weights [T, heads]`, exactly what
    /// [`Backend::index_prepare_query`] gives token by token (the default does that, in
    /// parallel). A device backend prepares the whole chunk in one go.
    #[allow(clippy::too_many_arguments)]
    fn index_prepare_queries(
        &self,
        profile: IndexProfile,
        q_raw: &[f32],
        weights_raw: &[f32],
        heads: usize,
        dim: usize,
        values: &mut [f32],
        weights: &mut [f32],
    ) {
        use rayon::prelude::*;
        let hd = heads * dim;
        values
            .par_chunks_mut(hd.max(1))
            .zip(weights.par_chunks_mut(heads.max(1)))
            .enumerate()
            .for_each(|(i, (qo, wo))| {
                let q = self.index_prepare_query(
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

    /// Top-k of T score rows at once: row t is `scores[t·stride..t·stride + visible[t]]`, its
    /// `k = out.len() / T` results go to `out[t·k..(t+1)·k]`, exactly what [`Backend::topk`]
    /// gives row by row (the default does that, in parallel).
    fn topk_batch(&self, scores: &[f32], stride: usize, visible: &[usize], out: &mut [i32]) {
        use rayon::prelude::*;
        let tokens = visible.len();
        if tokens == 0 {
            return;
        }
        let k = out.len() / tokens;
        if k == 0 {
            return;
        }
        out.par_chunks_mut(k)
            .zip(visible.par_iter())
            .enumerate()
            .for_each(|(t, (sel, &n))| self.topk(&scores[t * stride..t * stride + n], sel));
    }

    /// Index scores of one query against prepared key rows `[rows, dim]`: `out[rows]`.
    fn index_scores(
        &self,
        profile: IndexProfile,
        query: &PreparedQuery,
        keys: &[f32],
        key_scales: &[f32],
        dim: usize,
        out: &mut [f32],
    );

    /// Index scores of a block of T prepared queries, each against the rows it sees:
    /// `queries [T, heads, dim]` and `weights [T, heads]` are the `values` / `weights` of T
    /// [`PreparedQuery`]s one after the other, `keys [rows, dim]` / `key_scales [rows]` the
    /// prepared key rows, `visible[t]` (<= rows) how many leading rows query t sees. `out` is
    /// `[T, stride]`: `out[t·stride + r]` is the score of row r for `r < visible[t]`, `-inf`
    /// for the rest. Per query the same values as [`Backend::index_scores`] up to the f32
    /// summation order of each dot product. The default calls `index_scores` per query.
    #[allow(clippy::too_many_arguments)]
    fn index_scores_batch(
        &self,
        profile: IndexProfile,
        queries: &[f32],
        weights: &[f32],
        heads: usize,
        dim: usize,
        keys: &[f32],
        key_scales: &[f32],
        visible: &[usize],
        out: &mut [f32],
    ) {
        let tokens = visible.len();
        if tokens == 0 {
            return;
        }
        let stride = out.len() / tokens;
        for (t, row) in out.chunks_mut(stride.max(1)).enumerate() {
            let query = PreparedQuery {
                values: queries[t * heads * dim..(t + 1) * heads * dim].to_vec(),
                weights: weights[t * heads..(t + 1) * heads].to_vec(),
                heads,
                dim,
            };
            let n = visible[t];
            let (seen, unseen) = row.split_at_mut(n);
            self.index_scores(
                profile,
                &query,
                &keys[..n * dim],
                &key_scales[..n],
                dim,
                seen,
            );
            unseen.fill(f32::NEG_INFINITY);
        }
    }

    /// Top-k of `scores`: `out[k]` holds row indices by descending score, ties to the lower
    /// row, `-1` where fewer than k rows exist. NaN ranks below every number.
    fn topk(&self, scores: &[f32], out: &mut [i32]);

    /// Sparse attention with sink (attention.md 4.5) for every query of the batch:
    /// `out [T, H, head_dim]`; `probs[t]` is filled when `want_probs[t]`.
    fn sparse_attention(
        &self,
        batch: &AttentionBatch<'_>,
        out: &mut [f32],
        probs: &mut [Option<AttentionProbs>],
    );

    /// Router scores `[T, E]` = sqrtsoftplus(u · gateᵀ) (softplus linear above 20).
    fn router_scores(&self, u: &[f32], gate: &Self::Matrix, out: &mut [f32]);

    /// Routed experts: `out [T, D]` = Σ_s weight_s · FFN_{expert_s}(u_t) with tokens grouped by
    /// expert; per-token sums run over the route slots in order (deterministic).
    fn moe_experts(
        &self,
        u: &[f32],
        routes: &Routes<'_>,
        experts: &[FfnWeights<Self::Matrix>],
        swiglu_limit: f32,
        out: &mut [f32],
    );

    /// One dense SwiGLU FFN (the shared expert): `out [T, D]` = FFN(u).
    fn ffn(&self, u: &[f32], ffn: &FfnWeights<Self::Matrix>, swiglu_limit: f32, out: &mut [f32]);

    /// Clamped SwiGLU in place: `gate ← silu(min(gate, l)) · clamp(up, -l, l)`.
    fn swiglu(&self, gate: &mut [f32], up: &[f32], limit: f32);
}
