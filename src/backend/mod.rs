//! The compute backend: the operations of the DeepSeek-V4 forward pass, at the level of this
//! model (not a generic tensor library).
//!
//! [`Backend`] is what the model code in `crate::model` calls for every piece of arithmetic. The
//! CPU implementation ([`cpu::CpuBackend`]) is the numerical reference: f32 everywhere, rayon
//! across rows / heads / experts, the `gemm` crate for matrix products. A CUDA backend implements
//! the same trait and is compared to the CPU one op by op (docs/architecture.md section 8), so every method
//! is one well-defined piece of math with plain shapes:
//!
//! - Linear weights reach the backend in their stored format ([`Backend::upload_linear`] takes
//!   a [`SharedLinear`]: the checkpoint's bytes plus scale kind, sharing its memory map); the
//!   backend decides their resident form ([`Backend::Matrix`]) under a [`WeightResidency`]:
//!   decoded to f32 once at load, or kept as stored and decoded on use (a model larger than
//!   RAM streams from the page cache; a device backend keeps the stored format on the device
//!   and dequantises in its kernels). Small f32 tensors (mHC mixes) come decoded through
//!   [`Backend::upload_matrix`]. Every op sees the same f32 values either way.
//! - Activations are [`Backend::Act`] tensors: `len` f32 values, row-major, shapes given in
//!   each method's docs (`T` = tokens of the chunk, `D` = hidden size, `n` = hc_mult streams,
//!   `H` = heads). They live where the backend computes: a `Vec<f32>` on the CPU, device
//!   memory on a GPU, so a layer's chain of ops never leaves the device. The per-sequence
//!   caches (window KV rows, compressed rows, prepared index keys) are activations too, grown
//!   with [`Backend::act_append`]. The model moves values to the host only where it needs them
//!   there (`act_*` methods): the router scores it routes with, the top-k rows, and what the
//!   observer asked for (the raw index keys only then). Small inputs that the model
//!   assembles on the host (routes, attention entry indices, position biases) stay host
//!   slices. [`HostOps`] runs any op on host slices
//!   (tests, parity).
//!
//! Rounding steps that belong to a numerics *profile* (index keys / queries) or to `--kv fp8`
//! are delegated to `crate::numerics`; no method here rounds on its own.

pub mod cpu;
pub mod gpu;
pub mod host_ops;
mod op_types;
pub mod parity;

pub use crate::numerics::mhc::HcParams;
pub use crate::numerics::score_batch::IndexScoreBatch;
pub use cpu::CpuBackend;
pub use host_ops::HostOps;
pub use op_types::{
    AttentionBatch, AttentionProbs, DeviceMemoryUse, FfnWeights, HcWeights, MemoryUse, OpTime,
    PoolLayout, RawIndexQueries, Routes, Site, WeightResidency,
};

use crate::checkpoint::linear::SharedLinear;
use crate::checkpoint::CheckpointError;
use crate::numerics::profiles::{IndexProfile, PreparedQuery};
use crate::numerics::rope::RopeTable;

/// Query tokens the model scores per index-score call: bounds the `[tokens, rows]` score block
/// a backend holds at once (the memory plan charges it).
pub const INDEX_SCORE_TOKENS: usize = 256;

/// The operations of the DeepSeek-V4 forward pass. Shapes are in each method's docs; arguments
/// whose lengths disagree with them are a caller bug (methods may panic).
pub trait Backend: Send + Sync {
    /// A weight matrix `[out, in]` in the backend's resident form (decoded or stored).
    type Matrix: Send + Sync;

    /// An activation tensor of f32 values where this backend computes (see the module docs).
    /// Created on the device of the current [`Site`]; a multi-device backend moves an input
    /// that lives on another device when an op needs it.
    type Act: Send + Sync;

    /// Short name for reports (`cpu`, `cuda`).
    fn name(&self) -> &'static str;

    /// The first device failure since the last call, if any. Ops cannot return errors (their
    /// signatures are the math), so a backend that can fail (out of memory, a failed launch)
    /// records its first failure, fills the outputs of failed ops with NaN where it can, and
    /// the engine asks here after loading and after every layer, turning it into an error. The
    /// CPU never fails.
    fn take_error(&self) -> Option<String> {
        None
    }

    /// A reference matrix-product speed measured now, for benchmarks: (what was measured,
    /// TFLOP/s). The CPU times an f32 GEMM through its matmul; a GPU a bf16 cuBLAS GEMM with
    /// resident operands (the peak its layers can be compared against). None if unknown.
    fn reference_gemm_tflops(&self) -> Option<(String, f64)> {
        None
    }

    /// Bytes copied host -> device and device -> host so far (activations, weights at load,
    /// everything), for benchmarks and transfer tests. The CPU copies nothing: `(0, 0)`.
    fn transfer_bytes(&self) -> (u64, u64) {
        (0, 0)
    }

    /// One line per device on weight copies the backend keeps beside the stored weights (the GPU
    /// backend's decoded copies: bytes held, budget, copies), for benchmarks. Empty on the CPU.
    fn resident_notes(&self) -> Vec<String> {
        Vec::new()
    }

    /// Per device, the memory its own buffers hold now and at most so far, for benchmarks
    /// (GPU backends whose executors count it: CUDA always, the emulator with memory
    /// tracking on). Empty on the CPU.
    fn device_memory(&self) -> Vec<DeviceMemoryUse> {
        Vec::new()
    }

    /// Restarts the peaks [`Backend::device_memory`] reports from now on every device, so that
    /// they cover what follows alone (one prefill). No-op on the CPU.
    fn reset_memory_peaks(&self) {}

    /// Wall time per device operation so far, when the backend profiles
    /// (`NEEDLESCOPE_PROFILE=1` on GPU backends: each operation synchronised and timed); empty
    /// otherwise and on the CPU.
    fn op_profile(&self) -> Vec<OpTime> {
        Vec::new()
    }

    /// Tells a multi-device backend which part of the model the following uploads and ops
    /// belong to, so they run on that part's device. Single-device backends ignore it.
    fn enter_site(&self, _site: Site) {}

    // ---- activations ----

    /// Takes host values as an activation (on the current site's device).
    fn act_from(&self, data: Vec<f32>) -> Self::Act;

    /// An activation of `len` zeros.
    fn act_zeros(&self, len: usize) -> Self::Act;

    /// An activation of `len` values for an output that the next operation writes completely
    /// (a product's or the attention's): the GPU backend skips the zero fill (its emulator
    /// fills NaN instead, so a test sees any element read before it is written); zeros here.
    fn act_uninit(&self, len: usize) -> Self::Act {
        self.act_zeros(len)
    }

    /// Number of f32 values of an activation.
    fn act_len(&self, a: &Self::Act) -> usize;

    /// Copies `out.len()` values starting at element `start` of `a` to the host. A range past
    /// the end of `a` is a caller bug (panics, as slice indexing does).
    fn act_read(&self, a: &Self::Act, start: usize, out: &mut [f32]);

    /// All values of an activation on the host (borrowed where they already are).
    fn act_host<'a>(&self, a: &'a Self::Act) -> std::borrow::Cow<'a, [f32]>;

    /// Consumes an activation into host values.
    fn act_into_host(&self, a: Self::Act) -> Vec<f32> {
        self.act_host(&a).into_owned()
    }

    /// Appends the values of `tail` to `a` (amortised growth: the caches grow by a chunk at a
    /// time).
    fn act_append(&self, a: &mut Self::Act, tail: &Self::Act);

    /// Drops the first `n` values of `a` (`n` <= its length).
    fn act_drop_front(&self, a: &mut Self::Act, n: usize);

    /// Moves an activation to the current site's device for good (the engine calls it for the
    /// hidden streams after [`Backend::enter_site`], so that a device boundary costs one move).
    /// Single-device backends do nothing.
    fn act_to_site(&self, _a: &mut Self::Act) {}

    // ---- weights ----

    /// Takes ownership of a decoded f32 weight `[rows, cols]` row-major.
    fn upload_matrix(&self, data: Vec<f32>, rows: usize, cols: usize) -> Self::Matrix;

    /// Takes a linear weight `[out, in]` in its stored format and makes it resident under the
    /// backend's [`WeightResidency`]. Errors are decode errors of the stored data, reported
    /// here (at load) so that later uses cannot fail.
    fn upload_linear(&self, w: SharedLinear) -> Result<Self::Matrix, CheckpointError>;

    /// `(rows, cols)` of a matrix.
    fn matrix_shape(&self, m: &Self::Matrix) -> (usize, usize);

    // ---- ops ----

    /// Copies row `rows[i]` of `table` `[V, D]` to `out[i]` (`[rows.len(), D]`). Rows are
    /// validated by the caller.
    fn gather_rows(&self, table: &Self::Matrix, rows: &[usize], out: &mut Self::Act);

    /// `y[T, out] = x[T, in] · Wᵀ` in f32.
    fn matmul(&self, x: &Self::Act, w: &Self::Matrix, y: &mut Self::Act);

    /// Grouped projection (`wo_a`): `x` is `[T, G·in]`, `w` is `[G·out, in]`; group g of every
    /// row is multiplied by rows `g·out..(g+1)·out` of `w`, giving `y[T, G·out]` (group-major).
    fn matmul_grouped(&self, x: &Self::Act, groups: usize, w: &Self::Matrix, y: &mut Self::Act);

    /// In-place `x ← x + y` (same length).
    fn add_assign(&self, x: &mut Self::Act, y: &Self::Act);

    /// In-place RMS norm over consecutive vectors of length `dim`:
    /// `x ← x / sqrt(mean(x²) + eps) (⊙ weight)`.
    fn rms_norm(&self, x: &mut Self::Act, dim: usize, weight: Option<&[f32]>, eps: f32);

    /// In-place RoPE on interleaved pairs of the LAST `table.rope_dim()` dims of every vector of
    /// length `vec_len`. `x` is `[positions.len(), vecs, vec_len]`; every vector of row i is
    /// rotated by the angles of `positions[i]`. `inverse` rotates by the negated angle.
    fn rope(
        &self,
        table: &RopeTable,
        x: &mut Self::Act,
        vec_len: usize,
        positions: &[usize],
        inverse: bool,
    );

    /// mHC pre-mix of a layer site: from `streams [T, n, D]` computes the block input
    /// `input [T, D]` = Σ_j pre_j·X_j and the post / comb coefficients (`post [T, n]`,
    /// `comb [T, n, n]`, `comb[j][k]` multiplies stream j into stream k) with Sinkhorn.
    fn hc_pre(
        &self,
        streams: &Self::Act,
        site: &HcWeights<'_, Self::Matrix>,
        params: &HcParams,
        input: &mut Self::Act,
        post: &mut Self::Act,
        comb: &mut Self::Act,
    );

    /// mHC post-mix in place: `X'_k = post_k·y + Σ_j comb[j][k]·X_j` for `streams [T, n, D]`,
    /// block output `y [T, D]`.
    fn hc_post(
        &self,
        streams: &mut Self::Act,
        y: &Self::Act,
        post: &Self::Act,
        comb: &Self::Act,
        n: usize,
    );

    /// Final HC head: `out [T, D]` = Σ_j (σ(m_j·scale + base_j) + hc_eps)·X_j, no Sinkhorn.
    fn hc_head(
        &self,
        streams: &Self::Act,
        site: &HcWeights<'_, Self::Matrix>,
        params: &HcParams,
        out: &mut Self::Act,
    );

    /// DeepSeek-V4.1's lagged mHC (docs/spec/v41.md 5.1): the coefficients of one layer site
    /// alone, `pre [T, n]`, `post [T, n]` and `comb [T, n, n]` from `streams [T, n, D]`, by the
    /// math of [`Backend::hc_pre`] (V4.1 collapses the streams with the *previous* site's
    /// `pre`, [`Backend::hc_collapse`]). The default forms the mixes with
    /// [`Backend::matmul`] and evaluates the per-token math of `numerics::mhc` on the host
    /// (the RMS scale accumulated in f64, as the CPU backend's `hc_pre`).
    fn hc_coefficients(
        &self,
        streams: &Self::Act,
        site: &HcWeights<'_, Self::Matrix>,
        params: &HcParams,
        pre: &mut Self::Act,
        post: &mut Self::Act,
        comb: &mut Self::Act,
    ) {
        let n = params.streams;
        let (rows, width) = self.matrix_shape(site.mix);
        let tokens = self.act_len(streams) / width;
        let mut mixes = self.act_uninit(tokens * rows);
        self.matmul(streams, site.mix, &mut mixes);
        let mut mixes = self.act_into_host(mixes);
        let x = self.act_host(streams);
        let (mut p, mut q, mut c) = (
            vec![0.0f32; tokens * n],
            vec![0.0f32; tokens * n],
            vec![0.0f32; tokens * n * n],
        );
        for t in 0..tokens {
            let m = &mut mixes[t * rows..(t + 1) * rows];
            let r = cpu::rms_scale(&x[t * width..(t + 1) * width], params.norm_eps);
            m.iter_mut().for_each(|v| *v *= r);
            crate::numerics::mhc::site_coefficients(
                m,
                site.base,
                site.scale,
                params,
                &mut p[t * n..(t + 1) * n],
                &mut q[t * n..(t + 1) * n],
                &mut c[t * n * n..(t + 1) * n * n],
            );
        }
        *pre = self.act_from(p);
        *post = self.act_from(q);
        *comb = self.act_from(c);
    }

    /// `out [T, D]` = Σ_j weights_j · X_j for `streams [T, n, D]` and `weights [T, n]` (the
    /// collapse of DeepSeek-V4.1's lagged mHC). The default sums on the host, streams in order.
    fn hc_collapse(&self, streams: &Self::Act, weights: &Self::Act, n: usize, out: &mut Self::Act) {
        let x = self.act_host(streams);
        let w = self.act_host(weights);
        let tokens = w.len() / n;
        let d = x.len() / (tokens * n).max(1);
        let mut o = vec![0.0f32; tokens * d];
        for t in 0..tokens {
            let dst = &mut o[t * d..(t + 1) * d];
            for j in 0..n {
                let wj = w[t * n + j];
                let src = &x[(t * n + j) * d..(t * n + j + 1) * d];
                dst.iter_mut().zip(src).for_each(|(a, &b)| *a += wj * b);
            }
        }
        *out = self.act_from(o);
    }

    /// DeepSeek-V4.1's Engram injection (docs/spec/v41.md 5.2, `numerics::engram`): for every
    /// token of `streams [T, n, D]`, its projected lookup `kv [T, (n + 1)·D]` and the product
    /// weight `qk [n, D]`, `X_c ← X_c + g_c · value`. Returns the gates `[T, n]` on the host.
    /// The default runs `numerics::engram::inject_token` on the host.
    fn engram_inject(
        &self,
        streams: &mut Self::Act,
        kv: &Self::Act,
        qk: &[f32],
        n: usize,
        eps: f32,
    ) -> Vec<f32> {
        let mut x = self.act_host(streams).into_owned();
        let kv = self.act_host(kv);
        let tokens = kv.len() / (qk.len() + qk.len() / n).max(1);
        let (row, kv_row) = (qk.len(), qk.len() + qk.len() / n);
        let mut gates = Vec::with_capacity(tokens * n);
        for t in 0..tokens {
            gates.extend(crate::numerics::engram::inject_token(
                &mut x[t * row..(t + 1) * row],
                &kv[t * kv_row..(t + 1) * kv_row],
                qk,
                n,
                eps,
            ));
        }
        *streams = self.act_from(x);
        gates
    }

    /// Compressor pooling (docs/spec/attention.md 5.1-5.2): `values` and raw gate `logits` are the
    /// projections `[n, κ·c]` of n consecutive tokens, `ape` `[ratio, κ·c]` the position
    /// biases; `out [rows, c]` gets rows of `layout` (see [`PoolLayout`] for which tokens and
    /// channels each row pools). Per row and channel: the slots' logits `g + ape[slot mod
    /// ratio]`, their max, then `Σ exp(ℓ - max)·v / Σ exp(ℓ - max)` summed in slot order; a
    /// missing previous window is a slot of logit -inf and value 0 (weight 0).
    fn compressor_pool(
        &self,
        values: &Self::Act,
        logits: &Self::Act,
        ape: &[f32],
        layout: PoolLayout,
        out: &mut Self::Act,
    );

    /// `--kv fp8`: e4m3 simulation (blocks of 64, power-of-two scales) of the first `nope_dims`
    /// dims of every row of length `row_len`, in place.
    fn kv_fp8_sim(&self, rows: &mut Self::Act, row_len: usize, nope_dims: usize);

    /// DeepSeek-V4.1's `--kv release` on rows of length `row_len`, in place: window rows
    /// (`compressed` false) by `numerics::quant::kv_v41_window`, compressed rows by
    /// `kv_v41_compressed`. The default rounds on the host.
    fn kv_release_sim(&self, rows: &mut Self::Act, row_len: usize, compressed: bool) {
        let mut host = self.act_host(rows).into_owned();
        for row in host.chunks_mut(row_len.max(1)) {
            if compressed {
                crate::numerics::quant::kv_v41_compressed(row);
            } else {
                crate::numerics::quant::kv_v41_window(row);
            }
        }
        *rows = self.act_from(host);
    }

    /// Prepares raw index key rows `[rows, dim]` for scoring under `profile`, writing the
    /// prepared rows `[rows, dim]` and one scale per row `[rows]`.
    fn index_prepare_keys(
        &self,
        profile: IndexProfile,
        raw: &Self::Act,
        dim: usize,
        prepared: &mut Self::Act,
        scales: &mut Self::Act,
    );

    /// Prepares one token's index query `[heads, dim]` (after RoPE) and raw head weights
    /// `[heads]` (before the indexer scale, 2^-6.5 on Flash) under `profile`, on the host.
    fn index_prepare_query(
        &self,
        profile: IndexProfile,
        q_raw: &[f32],
        weights_raw: &[f32],
        heads: usize,
        dim: usize,
    ) -> PreparedQuery;

    /// Prepares the index queries of T tokens at once: `raw` (queries `[T, heads, dim]`, head
    /// weights `[T, heads]`) into `values [T, heads, dim]` and `weights [T, heads]`, exactly
    /// what [`Backend::index_prepare_query`] gives token by token.
    fn index_prepare_queries(
        &self,
        raw: &RawIndexQueries<'_, Self::Act>,
        values: &mut Self::Act,
        weights: &mut Self::Act,
    );

    /// Index scores of one query against prepared key rows `[rows, dim]`: `out[rows]` (host).
    fn index_scores(
        &self,
        profile: IndexProfile,
        query: &PreparedQuery,
        keys: &[f32],
        key_scales: &[f32],
        dim: usize,
        out: &mut [f32],
    );

    /// Index scores of a block of T = `visible.len()` prepared queries, each against the rows
    /// it sees (the shapes are [`IndexScoreBatch`]'s): queries `first..first + T` against the
    /// leading `visible[t]` prepared key rows (only the leading `max(visible)` are read). `out`
    /// is `[T, stride]`: `out[t·stride + r]` is the score of row r for `r < visible[t]`, `-inf`
    /// for the rest. Per query the same values as [`Backend::index_scores`] up to the f32
    /// summation order of each dot product.
    fn index_scores_batch(&self, batch: &IndexScoreBatch<'_, Self::Act>, out: &mut Self::Act);

    /// Top-k of T score rows at once: row t is `scores[t·stride..t·stride + visible[t]]`, its
    /// `k = out.len() / T` results go to `out[t·k..(t+1)·k]` (host), exactly what
    /// [`Backend::topk`] gives row by row.
    fn topk_batch(&self, scores: &Self::Act, stride: usize, visible: &[usize], out: &mut [i32]);

    /// Top-k of `scores` (host): `out[k]` holds row indices by descending score, ties to the
    /// lower row, `-1` where fewer than k rows exist. NaN ranks below every number.
    fn topk(&self, scores: &[f32], out: &mut [i32]);

    /// Sparse attention with sink (docs/spec/attention.md 4.5) for every query of the batch:
    /// `out [T, H, head_dim]`; `probs[t]` is filled when `want_probs[t]`.
    fn sparse_attention(
        &self,
        batch: &AttentionBatch<'_, Self::Act>,
        out: &mut Self::Act,
        probs: &mut [Option<AttentionProbs>],
    );

    /// Router scores `[T, E]` = sqrtsoftplus(u · gateᵀ) (softplus linear above 20), on the
    /// host (the model routes with them).
    fn router_scores(&self, u: &Self::Act, gate: &Self::Matrix, out: &mut [f32]);

    /// Routed experts: `out [T, D]` = Σ_s weight_s · FFN_{expert_s}(u_t) with tokens grouped by
    /// expert; per-token sums run over the route slots in order (deterministic).
    fn moe_experts(
        &self,
        u: &Self::Act,
        routes: &Routes<'_>,
        experts: &[FfnWeights<Self::Matrix>],
        swiglu_limit: f32,
        out: &mut Self::Act,
    );

    /// One dense SwiGLU FFN (the shared expert): `out [T, D]` = FFN(u).
    fn ffn(
        &self,
        u: &Self::Act,
        ffn: &FfnWeights<Self::Matrix>,
        swiglu_limit: f32,
        out: &mut Self::Act,
    );

    /// Clamped SwiGLU in place: `gate ← silu(min(gate, l)) · clamp(up, -l, l)`.
    fn swiglu(&self, gate: &mut Self::Act, up: &Self::Act, limit: f32);
}
