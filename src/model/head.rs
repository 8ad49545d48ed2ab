//! The output head (docs/spec/model.md 4.4): HC head mix, final RMSNorm, LM head.
//!
//! For the streams `[R, n, D]` of the positions whose logits are wanted:
//! `p_j = σ(m_j · hc_head_scale + hc_head_base_j) + hc_eps` (no Sinkhorn, no post),
//! `h = Σ_j p_j X_j`, `h = RMSNorm_{norm.weight}(h)`, `logits = h · head.weightᵀ` `[R, V]`,
//! all f32 (REF computes the LM head in fp32 too).

use super::hyper::HcSite;
use super::{load_matrix, ModelError};
use crate::backend::{Backend, HcParams};
use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;

/// The head weights.
pub struct Head<M> {
    hc: HcSite<M>,
    norm: Vec<f32>,
    lm_head: M,
    dim: usize,
    vocab: usize,
    eps: f32,
}

impl<M> Head<M> {
    /// Loads `hc_head_{fn,base,scale}`, `norm.weight` and `head.weight`.
    pub fn load<B: Backend<Matrix = M>>(
        backend: &B,
        ckpt: &Checkpoint,
        cfg: &ModelConfig,
    ) -> Result<Self, ModelError> {
        let (v, d) = (cfg.vocab_size, cfg.hidden_size);
        Ok(Head {
            hc: HcSite::load(backend, ckpt, cfg, "hc_head", true)?,
            norm: ckpt.f32_tensor("norm.weight", &[d])?,
            lm_head: load_matrix(backend, ckpt, "head", v, d)?,
            dim: d,
            vocab: v,
            eps: cfg.rms_norm_eps as f32,
        })
    }

    /// Logits `[R, V]` for the streams `[R, n, D]`.
    pub fn logits<B: Backend<Matrix = M>>(
        &self,
        backend: &B,
        streams: &B::Act,
        params: &HcParams,
    ) -> Vec<f32> {
        let rows = backend.act_len(streams) / (params.streams * self.dim);
        let mut h = backend.act_zeros(rows * self.dim);
        backend.hc_head(streams, &self.hc.weights(), params, &mut h);
        backend.rms_norm(&mut h, self.dim, Some(&self.norm), self.eps);
        let mut logits = backend.act_uninit(rows * self.vocab);
        backend.matmul(&h, &self.lm_head, &mut logits);
        backend.act_into_host(logits)
    }
}
