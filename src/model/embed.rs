//! Token embedding and stream expansion (docs/spec/model.md 4.1).
//!
//! `e_t = embed.weight[token_t]` (no scaling); the residual state of a token starts as `hc_mult`
//! identical copies of `e_t`. Input: token ids `[T]` (validated against the vocabulary before
//! any state changes: an id `>= vocab_size` is an error, never a panic). Output: streams
//! `[T, n, D]`.

use super::{load_matrix, ModelError};
use crate::backend::Backend;
use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;

/// The embedding table `[V, D]`.
pub struct Embedding<M> {
    table: M,
    vocab: usize,
    dim: usize,
    streams: usize,
}

impl<M> Embedding<M> {
    /// Loads `embed.weight` (as a linear `[V, D]`, so a streamed backend decodes only the rows
    /// of the chunk's tokens).
    pub fn load<B: Backend<Matrix = M>>(
        backend: &B,
        ckpt: &Checkpoint,
        cfg: &ModelConfig,
    ) -> Result<Self, ModelError> {
        let (v, d) = (cfg.vocab_size, cfg.hidden_size);
        Ok(Embedding {
            table: load_matrix(backend, ckpt, "embed", v, d)?,
            vocab: v,
            dim: d,
            streams: cfg.hc_mult,
        })
    }

    /// Checks every id of `tokens` (at positions `first_pos..`) against the vocabulary.
    pub fn validate(&self, tokens: &[u32], first_pos: usize) -> Result<(), ModelError> {
        match tokens.iter().position(|&t| t as usize >= self.vocab) {
            None => Ok(()),
            Some(i) => Err(ModelError::TokenOutOfRange {
                token: tokens[i],
                position: first_pos + i,
                vocab: self.vocab,
            }),
        }
    }

    /// Embeddings `[T, D]` of validated `tokens`.
    pub fn lookup<B: Backend<Matrix = M>>(&self, backend: &B, tokens: &[u32]) -> B::Act {
        let rows: Vec<usize> = tokens.iter().map(|&t| t as usize).collect();
        let mut e = backend.act_zeros(rows.len() * self.dim);
        backend.gather_rows(&self.table, &rows, &mut e);
        e
    }

    /// Initial residual streams `[T, n, D]` of validated `tokens`, gathered where the backend
    /// computes: each token's row gathered `n` times (each stream a copy of the
    /// token's [`Embedding::lookup`] row, without a trip through the host).
    pub fn streams<B: Backend<Matrix = M>>(&self, backend: &B, tokens: &[u32]) -> B::Act {
        let rows: Vec<usize> = tokens
            .iter()
            .flat_map(|&t| std::iter::repeat_n(t as usize, self.streams))
            .collect();
        let mut s = backend.act_zeros(rows.len() * self.dim);
        backend.gather_rows(&self.table, &rows, &mut s);
        s
    }
}
