//! The compressor of a KV source (docs/spec/v41.md 5.4): the attention input of the chunk in,
//! new compressed latents (before RoPE) out.
//!
//! Ratio 2: `a = compressor.wkv · x`, `s = compressor.wgate · x` `[T, c]`; per channel over each
//! disjoint pair (2j, 2j+1) `c_j = Σ softmax(s)_k · a_k` (the backend's `compressor_pool`
//! with no position bias and no overlap); `latent_j = norm(c_j)`. A pair whose second token
//! has not come yet waits in [`SourceState::pending`]. Ratio 1: `latent_t = norm(wkv · x_t)`,
//! no gate. Row j stands for the group's first position `j · ratio`.

use super::state::SourceState;
use crate::backend::{Backend, PoolLayout};
use crate::checkpoint::Checkpoint;
use crate::config::V41Config;
use crate::model::{load_matrix, ModelError};

/// Latents the chunk completed.
pub struct Emitted<A> {
    /// `[count, c]`, before RoPE (`None` when `count` is 0).
    pub latents: Option<A>,
    /// Index of the first new row.
    pub first_row: usize,
    pub count: usize,
}

/// One KV source's compressor weights.
pub struct Compressor<M> {
    ratio: usize,
    wkv: M,
    wgate: Option<M>,
    norm: Vec<f32>,
    dim: usize,
    eps: f32,
}

impl<M> Compressor<M> {
    /// Loads `layers.{layer}.attn.compressor.*` (`wgate` at ratio 2 only).
    pub fn load<B: Backend<Matrix = M>>(
        backend: &B,
        ckpt: &Checkpoint<V41Config>,
        layer: usize,
        ratio: usize,
    ) -> Result<Self, ModelError> {
        let t = &ckpt.config().text;
        let (d, c) = (t.hidden_size, t.head_dim);
        let p = format!("layers.{layer}.attn.compressor");
        Ok(Compressor {
            ratio,
            wkv: load_matrix(backend, ckpt, &format!("{p}.wkv"), c, d)?,
            wgate: if ratio > 1 {
                Some(load_matrix(backend, ckpt, &format!("{p}.wgate"), c, d)?)
            } else {
                None
            },
            norm: ckpt.f32_tensor(&format!("{p}.norm.weight"), &[c])?,
            dim: c,
            eps: t.rms_norm_eps as f32,
        })
    }

    pub fn ratio(&self) -> usize {
        self.ratio
    }

    /// Feeds the chunk `x [T, D]`, returning the latents it completes.
    pub fn feed<B: Backend<Matrix = M>>(
        &self,
        backend: &B,
        x: &B::Act,
        state: &mut SourceState<B::Act>,
    ) -> Emitted<B::Act> {
        let c = self.dim;
        let tokens = backend.act_len(x) / backend.matrix_shape(&self.wkv).1;
        let first_row = state.rows();
        let mut a = backend.act_uninit(tokens * c);
        backend.matmul(x, &self.wkv, &mut a);
        let Some(wgate) = &self.wgate else {
            backend.rms_norm(&mut a, c, Some(&self.norm), self.eps);
            return Emitted {
                latents: (tokens > 0).then_some(a),
                first_row,
                count: tokens,
            };
        };
        let mut s = backend.act_uninit(tokens * c);
        backend.matmul(x, wgate, &mut s);
        // The buffer: the waiting token (if any), then the chunk.
        let (values, logits, buffered) = match state.pending.take() {
            Some((pa, ps)) => {
                let mut va = pa;
                va.extend_from_slice(&backend.act_host(&a));
                let mut vs = ps;
                vs.extend_from_slice(&backend.act_host(&s));
                (backend.act_from(va), backend.act_from(vs), tokens + 1)
            }
            None => (a, s, tokens),
        };
        let r = self.ratio;
        let count = buffered / r;
        if buffered % r != 0 {
            let at = count * r * c;
            let mut pa = vec![0.0f32; c];
            let mut ps = vec![0.0f32; c];
            backend.act_read(&values, at, &mut pa);
            backend.act_read(&logits, at, &mut ps);
            state.pending = Some((pa, ps));
        }
        if count == 0 {
            return Emitted {
                latents: None,
                first_row,
                count,
            };
        }
        let layout = PoolLayout {
            ratio: r,
            c,
            overlap: false,
            first_window: 0,
            first_has_previous: false,
        };
        let mut out = backend.act_uninit(count * c);
        backend.compressor_pool(&values, &logits, &vec![0.0; r * c], layout, &mut out);
        backend.rms_norm(&mut out, c, Some(&self.norm), self.eps);
        Emitted {
            latents: Some(out),
            first_row,
            count,
        }
    }
}
