//! mHC, manifold-constrained hyper-connections (docs/spec/model.md 4.3 and 4.4): the weights of one site
//! and the scalars of a config. The per-token coefficient math (pre, post, Sinkhorn comb) is
//! `numerics::mhc`, which the backends evaluate.

use crate::backend::{Backend, HcParams, HcWeights};
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::ModelConfig;

/// The weights of one mHC site (`layers.L.hc_attn_*`, `layers.L.hc_ffn_*` or `hc_head_*`).
pub struct HcSite<M> {
    pub mix: M,
    pub base: Vec<f32>,
    pub scale: Vec<f32>,
}

impl<M> HcSite<M> {
    /// Loads `{prefix}_fn`, `{prefix}_base`, `{prefix}_scale`. `head` selects the head shapes
    /// (`[n, n·D]`, `[n]`, `[1]`) instead of the layer ones (`[(2+n)·n, n·D]`, `[(2+n)·n]`, `[3]`).
    pub fn load<B: Backend<Matrix = M>>(
        backend: &B,
        ckpt: &Checkpoint,
        cfg: &ModelConfig,
        prefix: &str,
        head: bool,
    ) -> Result<Self, CheckpointError> {
        let n = cfg.hc_mult;
        let (rows, scales) = if head { (n, 1) } else { ((2 + n) * n, 3) };
        let width = n * cfg.hidden_size;
        let mix = ckpt.f32_tensor(&format!("{prefix}_fn"), &[rows, width])?;
        Ok(HcSite {
            mix: backend.upload_matrix(mix, rows, width),
            base: ckpt.f32_tensor(&format!("{prefix}_base"), &[rows])?,
            scale: ckpt.f32_tensor(&format!("{prefix}_scale"), &[scales])?,
        })
    }

    /// The borrowed view the backend ops take.
    pub fn weights(&self) -> HcWeights<'_, M> {
        HcWeights {
            mix: &self.mix,
            base: &self.base,
            scale: &self.scale,
        }
    }
}

/// The mHC scalars of a config.
pub fn hc_params(cfg: &ModelConfig) -> HcParams {
    HcParams {
        streams: cfg.hc_mult,
        sinkhorn_iters: cfg.hc_sinkhorn_iters,
        norm_eps: cfg.rms_norm_eps as f32,
        hc_eps: cfg.hc_eps as f32,
    }
}
