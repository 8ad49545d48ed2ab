//! The Engram block of one layer (docs/spec/v41.md 5.2): table rows in, gated value into every
//! residual stream out.
//!
//! For the chunk's rows `[T, cols]` ([`super::ngram::engram_rows`]): gather the rows of
//! `engram.embed` (`[rows, width]`, read by row from the mapped checkpoint: FP8 with one E8M0
//! scale per 32 columns, or BF16 / F32) into `[T, cols·width]`; `kv = engram.wkv · that`
//! `[T, (n + 1)·D]`; then the gate of `numerics::engram` per token and stream, with
//! `q_weight ⊙ k_weight` `[n, D]`. Rows are used in f32, not rounded to bf16 (the f32
//! reference policy of `super`).

use crate::backend::Backend;
use crate::checkpoint::Checkpoint;
use crate::config::engram::EngramHash;
use crate::config::V41Config;
use crate::model::{load_matrix, ModelError};

/// One Engram layer's weights and hash constants.
pub struct Engram<M> {
    pub(crate) hash: EngramHash,
    table: M,
    wkv: M,
    /// `q_weight ⊙ k_weight` `[n, D]`.
    qk: Vec<f32>,
    cols: usize,
    width: usize,
    streams: usize,
    eps: f32,
}

impl<M> Engram<M> {
    /// Loads `layers.{hash.layer}.engram.*`.
    pub fn load<B: Backend<Matrix = M>>(
        backend: &B,
        ckpt: &Checkpoint<V41Config>,
        hash: EngramHash,
    ) -> Result<Self, ModelError> {
        let t = &ckpt.config().text;
        let (d, n, width) = (t.hidden_size, t.hc_mult, t.engram_head_dim);
        let cols = (t.engram_max_ngram_size - 1) * t.engram_n_heads;
        let p = format!("layers.{}.engram", hash.layer);
        let rows = usize::try_from(hash.rows).map_err(|_| ModelError::BadOption {
            option: "engram_num_embeddings",
            found: hash.rows.to_string(),
            expected: "a row count this machine can address".into(),
        })?;
        let table = backend.upload_linear(ckpt.engram_table_linear(hash.layer, rows, width)?)?;
        let wkv = load_matrix(
            backend,
            ckpt,
            &format!("{p}.wkv"),
            (n + 1) * d,
            cols * width,
        )?;
        let q = ckpt.f32_tensor(&format!("{p}.q_weight"), &[n, d])?;
        let k = ckpt.f32_tensor(&format!("{p}.k_weight"), &[n, d])?;
        Ok(Engram {
            hash,
            table,
            wkv,
            qk: q.iter().zip(&k).map(|(a, b)| a * b).collect(),
            cols,
            width,
            streams: n,
            eps: t.rms_norm_eps as f32,
        })
    }

    /// Adds the gated lookups of rows `[T, cols]` into `streams [T, n, D]`; returns the gates
    /// `[T, n]`.
    pub fn forward<B: Backend<Matrix = M>>(
        &self,
        backend: &B,
        streams: &mut B::Act,
        rows: &[usize],
    ) -> Vec<f32> {
        let tokens = rows.len() / self.cols.max(1);
        let mut gathered = backend.act_uninit(tokens * self.cols * self.width);
        backend.gather_rows(&self.table, rows, &mut gathered);
        let kv_width = backend.matrix_shape(&self.wkv).0;
        let mut kv = backend.act_uninit(tokens * kv_width);
        backend.matmul(&gathered, &self.wkv, &mut kv);
        backend.engram_inject(streams, &kv, &self.qk, self.streams, self.eps)
    }
}
