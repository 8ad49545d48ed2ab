//! One decoder layer (docs/spec/model.md 4.3): `X ← HC_attn(X, Attention)`, then `X ← HC_ffn(X, MoE)`.
//!
//! Each site: `(h, post, comb) = hc_pre(X)`, `y = F(RMSNorm_w(h))`,
//! `X'_k = post_k·y + Σ_j comb[j][k]·X_j`. There is no other residual add.
//! Streams `[T, n, D]` are updated in place. Named intermediates (emitted only when the
//! observer wants them): `layers.L.attn.input` / `layers.L.ffn.input` `[T, D]` (the normed
//! block inputs), `layers.L.attn.output` / `layers.L.ffn.output` `[T, D]` (block outputs before
//! the post-mix) and `layers.L.hidden` `[T, n, D]` (the streams after the layer).

use super::attention::{Attention, AttentionRun};
use super::hyper::HcSite;
use super::moe::Moe;
use super::observer::Observer;
use super::state::LayerState;
use super::ModelError;
use crate::backend::{Backend, HcParams};
use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::numerics::profiles::{IndexProfile, KvMode};

/// Run-time switches shared by every layer of one forward call.
#[derive(Clone, Copy, Debug)]
pub struct LayerSwitches {
    pub profile: IndexProfile,
    pub kv: KvMode,
    pub topk: usize,
}

/// How one forward call runs every layer: the mHC parameters, the switches and who watches.
pub struct LayerRun<'a> {
    /// The model's mHC parameters (streams, Sinkhorn iterations, eps).
    pub hc: &'a HcParams,
    /// The run-time switches (index profile, KV mode, top-k).
    pub switches: LayerSwitches,
    /// Receives the named intermediates and the attention and indexer observations.
    pub observer: &'a mut dyn Observer,
}

/// One decoder layer's weights.
pub struct Layer<M> {
    index: usize,
    attn_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    hc_attn: HcSite<M>,
    hc_ffn: HcSite<M>,
    attention: Attention<M>,
    moe: Moe<M>,
    dim: usize,
    eps: f32,
}

impl<M> Layer<M> {
    /// Loads every tensor of `layers.{layer}.` (decoded to f32, uploaded to the backend).
    pub fn load<B: Backend<Matrix = M>>(
        backend: &B,
        ckpt: &Checkpoint,
        cfg: &ModelConfig,
        layer: usize,
    ) -> Result<Self, ModelError> {
        let p = format!("layers.{layer}");
        let d = cfg.hidden_size;
        Ok(Layer {
            index: layer,
            attn_norm: ckpt.f32_tensor(&format!("{p}.attn_norm.weight"), &[d])?,
            ffn_norm: ckpt.f32_tensor(&format!("{p}.ffn_norm.weight"), &[d])?,
            hc_attn: HcSite::load(backend, ckpt, cfg, &format!("{p}.hc_attn"), false)?,
            hc_ffn: HcSite::load(backend, ckpt, cfg, &format!("{p}.hc_ffn"), false)?,
            attention: Attention::load(backend, ckpt, cfg, layer)?,
            moe: Moe::load(backend, ckpt, cfg, layer)?,
            dim: d,
            eps: cfg.rms_norm_eps as f32,
        })
    }

    /// Runs the layer on the chunk's streams `[T, n, D]` (positions `first_pos..`, input ids
    /// `tokens`), updating `state` and the streams in place.
    pub fn forward<B: Backend<Matrix = M>>(
        &self,
        backend: &B,
        streams: &mut B::Act,
        tokens: &[u32],
        first_pos: usize,
        state: &mut LayerState<B::Act>,
        run: &mut LayerRun<'_>,
    ) {
        let (hc, switches) = (run.hc, run.switches);
        let observer = &mut *run.observer;
        let (l, d, n, t) = (self.index, self.dim, hc.streams, tokens.len());
        let mut h = backend.act_zeros(t * d);
        let mut post = backend.act_zeros(t * n);
        let mut comb = backend.act_zeros(t * n * n);

        backend.hc_pre(
            streams,
            &self.hc_attn.weights(),
            hc,
            &mut h,
            &mut post,
            &mut comb,
        );
        backend.rms_norm(&mut h, d, Some(&self.attn_norm), self.eps);
        let name = format!("layers.{l}.attn.input");
        emit_act(backend, observer, &name, first_pos, &[t, d], &h);
        let mut run = AttentionRun {
            layer: l,
            profile: switches.profile,
            kv: switches.kv,
            topk: switches.topk,
            observer: &mut *observer,
        };
        let y = self
            .attention
            .forward(backend, &h, first_pos, state, &mut run);
        let name = format!("layers.{l}.attn.output");
        emit_act(backend, observer, &name, first_pos, &[t, d], &y);
        backend.hc_post(streams, &y, &post, &comb, n);

        backend.hc_pre(
            streams,
            &self.hc_ffn.weights(),
            hc,
            &mut h,
            &mut post,
            &mut comb,
        );
        backend.rms_norm(&mut h, d, Some(&self.ffn_norm), self.eps);
        let name = format!("layers.{l}.ffn.input");
        emit_act(backend, observer, &name, first_pos, &[t, d], &h);
        let y = self
            .moe
            .forward(backend, &h, tokens, (l, first_pos), &mut *observer);
        let name = format!("layers.{l}.ffn.output");
        emit_act(backend, observer, &name, first_pos, &[t, d], &y);
        backend.hc_post(streams, &y, &post, &comb, n);

        let name = format!("layers.{l}.hidden");
        emit_act(backend, observer, &name, first_pos, &[t, n, d], streams);
    }
}

/// [`emit`] for an activation: read to the host only when the observer wants it.
pub fn emit_act<B: Backend>(
    backend: &B,
    observer: &mut dyn Observer,
    name: &str,
    first_pos: usize,
    shape: &[usize],
    data: &B::Act,
) {
    if observer.wants_intermediate(name) {
        observer.intermediate(name, first_pos, shape, &backend.act_host(data));
    }
}

/// Hands a named intermediate to the observer if it wants it.
pub fn emit(
    observer: &mut dyn Observer,
    name: &str,
    first_pos: usize,
    shape: &[usize],
    data: &[f32],
) {
    if observer.wants_intermediate(name) {
        observer.intermediate(name, first_pos, shape, data);
    }
}
