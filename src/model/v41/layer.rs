//! One DeepSeek-V4.1 decoder layer with its lagged mHC (docs/spec/v41.md 5.1).
//!
//! With `p` the previous FFN site's pre weights (one-hot on stream 0 before layer 0):
//! Engram first on its layers; `(a_pre, a_post, a_comb) = coefficients(X, hc_attn)`;
//! `X ← a_post ⊗ Attn(attn_norm(Σ_j p_j X_j)) + a_combᵀ X`;
//! `(f_pre, f_post, f_comb) = coefficients(X, hc_ffn)`;
//! `X ← f_post ⊗ MoE(ffn_norm(Σ_j a_pre_j X_j)) + f_combᵀ X`; `f_pre` goes on to the next
//! layer (and, after the last, collapses the streams for the head).
//! Streams `[T, n, D]` are updated in place.

use super::attention::{Attention, LatestSelection};
use super::engram::Engram;
use super::indexer::SelectRun;
use super::state::V41State;
use crate::backend::{Backend, HcParams};
use crate::checkpoint::Checkpoint;
use crate::config::{RouterKind, V41Config};
use crate::model::hyper::HcSite;
use crate::model::layer::{emit, emit_act};
use crate::model::moe::{Moe, MoeSpec};
use crate::model::ModelError;

/// One layer's weights.
pub struct Layer<M> {
    index: usize,
    attn_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    hc_attn: HcSite<M>,
    hc_ffn: HcSite<M>,
    attention: Attention<M>,
    moe: Moe<M>,
    pub(crate) engram: Option<Engram<M>>,
    dim: usize,
    eps: f32,
}

/// Loads one mHC site `{prefix}_{fn,base,scale}` of a layer.
fn hc_site<B: Backend>(
    backend: &B,
    ckpt: &Checkpoint<V41Config>,
    prefix: &str,
) -> Result<HcSite<B::Matrix>, ModelError> {
    let t = &ckpt.config().text;
    let (n, width) = (t.hc_mult, t.hc_mult * t.hidden_size);
    let rows = (2 + n) * n;
    let mix = ckpt.f32_tensor(&format!("{prefix}_fn"), &[rows, width])?;
    Ok(HcSite {
        mix: backend.upload_matrix(mix, rows, width),
        base: ckpt.f32_tensor(&format!("{prefix}_base"), &[rows])?,
        scale: ckpt.f32_tensor(&format!("{prefix}_scale"), &[3])?,
    })
}

impl<M> Layer<M> {
    /// Loads every tensor of `layers.{layer}.` (its Engram block from `engram`).
    pub fn load<B: Backend<Matrix = M>>(
        backend: &B,
        ckpt: &Checkpoint<V41Config>,
        layer: usize,
        engram: Option<Engram<M>>,
    ) -> Result<Self, ModelError> {
        let t = &ckpt.config().text;
        let p = format!("layers.{layer}");
        let d = t.hidden_size;
        let spec = MoeSpec {
            hidden: d,
            intermediate: t.moe_intermediate_size,
            experts: t.n_routed_experts,
            top_k: t.num_experts_per_tok,
            shared_experts: t.n_shared_experts,
            scaling: t.routed_scaling_factor as f32,
            swiglu_limit: t.swiglu_limit as f32,
            router: RouterKind::Score,
            vocab: t.vocab_size,
        };
        Ok(Layer {
            index: layer,
            attn_norm: ckpt.f32_tensor(&format!("{p}.attn_norm.weight"), &[d])?,
            ffn_norm: ckpt.f32_tensor(&format!("{p}.ffn_norm.weight"), &[d])?,
            hc_attn: hc_site(backend, ckpt, &format!("{p}.hc_attn"))?,
            hc_ffn: hc_site(backend, ckpt, &format!("{p}.hc_ffn"))?,
            attention: Attention::load(backend, ckpt, layer)?,
            moe: Moe::load_spec(backend, ckpt, &spec, layer)?,
            engram,
            dim: d,
            eps: t.rms_norm_eps as f32,
        })
    }

    /// Runs the layer on the chunk's `streams [T, n, D]` (token ids `tokens` at positions
    /// `first_pos..`, Engram rows `engram_rows` on an Engram layer); `pre [T, n]` is the
    /// previous FFN site's pre weights in, this layer's out.
    #[allow(clippy::too_many_arguments)]
    pub fn forward<B: Backend<Matrix = M>>(
        &self,
        backend: &B,
        streams: &mut B::Act,
        pre: &mut B::Act,
        (tokens, first_pos, engram_rows): (&[u32], usize, &[usize]),
        hc: &HcParams,
        state: &mut V41State<B::Act>,
        latest: &mut LatestSelection,
        run: &mut SelectRun<'_>,
    ) {
        let (l, d, n, t) = (self.index, self.dim, hc.streams, tokens.len());
        if let Some(engram) = &self.engram {
            let gates = engram.forward(backend, streams, engram_rows);
            emit(
                run.observer,
                &format!("layers.{l}.engram.gates"),
                first_pos,
                &[t, n],
                &gates,
            );
        }
        let (mut a_pre, mut post, mut comb) = (
            backend.act_zeros(t * n),
            backend.act_zeros(t * n),
            backend.act_zeros(t * n * n),
        );
        backend.hc_coefficients(
            streams,
            &self.hc_attn.weights(),
            hc,
            &mut a_pre,
            &mut post,
            &mut comb,
        );
        let mut h = backend.act_zeros(t * d);
        backend.hc_collapse(streams, pre, n, &mut h);
        backend.rms_norm(&mut h, d, Some(&self.attn_norm), self.eps);
        emit_act(
            backend,
            run.observer,
            &format!("layers.{l}.attn.input"),
            first_pos,
            &[t, d],
            &h,
        );
        let y = self
            .attention
            .forward(backend, &h, first_pos, state, latest, run);
        backend.hc_post(streams, &y, &post, &comb, n);

        backend.hc_coefficients(
            streams,
            &self.hc_ffn.weights(),
            hc,
            pre,
            &mut post,
            &mut comb,
        );
        backend.hc_collapse(streams, &a_pre, n, &mut h);
        backend.rms_norm(&mut h, d, Some(&self.ffn_norm), self.eps);
        emit_act(
            backend,
            run.observer,
            &format!("layers.{l}.ffn.input"),
            first_pos,
            &[t, d],
            &h,
        );
        let y = self
            .moe
            .forward(backend, &h, tokens, (l, first_pos), &mut *run.observer);
        backend.hc_post(streams, &y, &post, &comb, n);
        emit_act(
            backend,
            run.observer,
            &format!("layers.{l}.hidden"),
            first_pos,
            &[t, n, d],
            streams,
        );
    }
}
