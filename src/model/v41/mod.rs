//! The DeepSeek-V4.1 forward pass on a [`Backend`](crate::backend::Backend) (docs/spec/v41.md
//! 5), one file per component in forward order: [`ngram`] (token classes → Engram rows) →
//! per layer { [`engram`] (gated lookup into the streams, Engram layers only) → lagged mHC
//! → [`attention`] (window KV of its own, compressed rows of its KV source from
//! [`compressor`], selection by its index source from [`indexer`] and, on the candidate
//! source and its consumers, [`selection`]'s two-level stage) → lagged mHC → MoE
//! (`model::moe`) } ([`layer`]) → collapse → head ([`forward`]). [`state`] holds the
//! per-sequence caches (window rows per layer; compressed rows and index keys per KV source).
//!
//! Numerics policy: V4's (`model::forward`): the un-quantised reference in f32 everywhere
//! (no bf16 activations, no FP8 activation quantisation before linears, probabilities not
//! rounded); weights decoded exactly. The selection math runs under the index profile in
//! force (`exact` is the unrounded math; V4.1's own rounding profiles come with its numerics).
//!
//! Intermediates the observer can ask for, per chunk (`[T, ..]` rows at positions
//! `first_pos..`): `embed` `[T, D]`; `layers.L.engram.gates` `[T, n]` (Engram layers);
//! `layers.L.attn.input` / `layers.L.ffn.input` `[T, D]`; `layers.L.hidden` `[T, n, D]`;
//! on index sources `layers.N.indexer.scores` `[T, rows]` (-inf where not visible and, on
//! candidate consumers, outside the kept blocks) and `layers.N.indexer.topk` `[T, k]` (f32,
//! -1 padding), `layers.N.indexer.q` `[T, H_i, d_i]` (after RoPE, before any rounding) and
//! `layers.N.indexer.weights` `[T, H_i]` (before the scale); on consumers also `layers.N.indexer.scores_unconstrained` /
//! `topk_unconstrained`; on the candidate source `layers.N.candidates.block_scores`
//! `[T, blocks]` (block max, -inf where nothing is visible) and
//! `layers.N.candidates.kept_blocks` `[T, blocks]` (1 = kept); `logits` `[1, V]`.

pub mod attention;
pub mod compressor;
pub mod engram;
pub mod forward;
pub mod indexer;
pub mod layer;
pub mod ngram;
pub mod selection;
pub mod state;

pub use forward::{ModelV41, V41Options};
pub use state::V41State;
