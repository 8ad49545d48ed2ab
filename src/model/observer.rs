//! The model's observation hook: what the forward pass hands to whoever wants to look inside.
//!
//! The model knows nothing about needles; the probe knows nothing about backends. This trait is
//! the only contact between them (docs/architecture.md section 3):
//! - at every CSA layer (DeepSeek-V4.1: every index source, with its row mapping and its part
//!   in the candidate stage, [`IndexStage`]) and every probed query position,
//!   [`IndexerObservation`]: the raw index
//!   query of that position (after RoPE, before any Hadamard or rounding), the raw head weights
//!   (the `weights_proj` output before the indexer scale, 2^-6.5 on Flash), a *view* of the
//!   raw index keys of all visible rows (after norm and RoPE, before any Hadamard or rounding;
//!   never a per-position copy of the cache), the driving profile's scores and the rows
//!   actually selected;
//! - at every layer (SWA, CSA, HCA) and probed position, [`AttentionObservation`]: the softmax
//!   probabilities of each head over the entries it attended (window tokens, compressed rows)
//!   and the sink's share of the denominator;
//! - named intermediates (`layers.L.hidden`, `logits`, ...) for traces and golden tests.
//!
//! Observation costs nothing when off: the model asks `wants_position` / `wants_intermediate`
//! before building anything.

use crate::config::{LayerKind, RowMapping};
use crate::model::v41::selection::Candidates;

/// One CSA layer's indexer state for one probed query position.
pub struct IndexerObservation<'a> {
    pub layer: usize,
    /// Absolute token position of the query (0-based, BOS included).
    pub query_pos: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// Raw index query, `[heads * head_dim]`, after RoPE, before Hadamard or rounding.
    pub q_raw: &'a [f32],
    /// Raw head weights, `[heads]`: `weights_proj(x)` before the indexer scale (2^-6.5 on
    /// Flash), un-rounded.
    pub weights_raw: &'a [f32],
    /// Raw index keys of the visible rows, `[visible_rows * head_dim]` (row w at `w*head_dim`).
    pub keys_raw: &'a [f32],
    /// n_t = floor((t+1)/4).
    pub visible_rows: usize,
    /// Scores of the visible rows under the driving profile, `[visible_rows]`.
    pub scores: &'a [f32],
    /// Rows the model selected, `[topk]`, descending score, ties to the lower row, -1 padding.
    pub selected: &'a [i32],
    /// Which tokens the rows pool ([`RowMapping::CSA`] on DeepSeek-V4; the KV source's ratio
    /// on DeepSeek-V4.1): `visible_rows` is `rows.visible_rows(query_pos)`.
    pub rows: RowMapping,
    /// The layer's part in a candidate stage (DeepSeek-V4.1; [`IndexStage::Plain`] on V4).
    pub stage: IndexStage<'a>,
}

/// An index layer's part in DeepSeek-V4.1's two-level selection, as one observation sees it.
/// `scores` are always the layer's own scores of every visible row (no candidate mask), so an
/// observer can rank both with and without the mask.
#[derive(Clone, Copy, Debug)]
pub enum IndexStage<'a> {
    /// Selects among every visible row (every V4 CSA layer; V4.1's ratio-2 index sources).
    Plain,
    /// The candidate source: `candidates` are the blocks it kept for this query under the
    /// driving profile (`block_rows` rows a block, `budget` blocks kept, the newest pinned).
    CandidateSource {
        candidates: &'a Candidates,
        block_rows: usize,
        budget: usize,
    },
    /// A consumer of candidate source `source`: `selected` is its top-k inside `candidates`
    /// (the source's kept blocks for this query, driving profile).
    Consumer {
        source: usize,
        candidates: &'a Candidates,
    },
}

/// One layer's attention for one probed query position.
pub struct AttentionObservation<'a> {
    pub layer: usize,
    pub kind: LayerKind,
    pub query_pos: usize,
    pub heads: usize,
    /// Token positions of the raw window entries, chronological.
    pub window_positions: &'a [usize],
    /// Compressed row indices attended (selected CSA rows or all visible HCA rows).
    pub compressed_rows: &'a [usize],
    /// Compression ratio of `compressed_rows` (4 or 128; 0 on SWA layers).
    pub ratio: usize,
    /// `[heads * (window_positions.len() + compressed_rows.len())]`, head-major: head h's
    /// probabilities over the window entries then the compressed entries. Each head's
    /// probabilities plus its sink share sum to 1.
    pub probs: &'a [f32],
    /// `[heads]`: the sink's share of each head's softmax denominator.
    pub sink_probs: &'a [f32],
}

/// Which main-attention KV rows a [`Observer::replace_kv_input`] call carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KvRows {
    /// The chunk's own window KV rows, one per token, `[tokens, head_dim]`.
    Window,
    /// The compressed rows the chunk completed (CSA / HCA layers), `[rows, head_dim]`.
    Compressed,
}

/// Receives observations during a forward pass. All methods have no-op defaults.
pub trait Observer {
    /// Whether query position `pos` is probed (indexer and attention observations).
    fn wants_position(&self, _pos: usize) -> bool {
        false
    }
    /// Whether the attention probabilities of query position `pos` are wanted (by default
    /// those of every probed position). An observer without [`Observer::attention`] says no:
    /// on a GPU the probabilities are a large download.
    fn wants_attention(&self, pos: usize) -> bool {
        self.wants_position(pos)
    }
    /// Whether a named intermediate is wanted (e.g. `layers.3.hidden`, `logits`).
    fn wants_intermediate(&self, _name: &str) -> bool {
        false
    }
    fn indexer(&mut self, _obs: &IndexerObservation<'_>) {}
    /// Parity hook, called once per chunk at every CSA layer after the indexer observations:
    /// `selected` is `[tokens, k]` for positions `first_pos..` (as observed), and whatever this
    /// leaves in it is what attention uses. A harness replays another model's selections here so
    /// that one legitimate rounding flip (a row crossing the cut-off) does not make two forwards
    /// diverge from that position on (run::parity). The default keeps the model's.
    fn replace_selection(
        &mut self,
        _layer: usize,
        _first_pos: usize,
        _k: usize,
        _selected: &mut [i32],
    ) {
    }
    /// Parity hook, called once per chunk at every MoE layer: `experts` is `[tokens, k]`, the
    /// routed experts of positions `first_pos..` (hash table or top-k of the router scores);
    /// whatever this leaves in it is what the layer runs, weighted by its own router scores. A
    /// harness replays another model's routes here, for the reason of `replace_selection`
    /// (a near-tie between two experts' scores). The default keeps the model's.
    fn replace_routes(
        &mut self,
        _layer: usize,
        _first_pos: usize,
        _k: usize,
        _experts: &mut [usize],
    ) {
    }
    /// Whether [`Observer::replace_kv_input`] is wanted. Its rows cross to the host and back
    /// (on a GPU a download and an upload per layer and chunk), so only parity harnesses ask.
    fn wants_kv_inputs(&self) -> bool {
        false
    }
    /// Parity hook under `--kv fp8`, called once per chunk at every layer for the window KV rows
    /// of positions `first_pos..`, and at compressed layers once more for the compressed rows
    /// the chunk completed, with the rows *before* their fp8 rounding: whatever this leaves in
    /// `rows` is what gets rounded and cached. A harness replays another model's unrounded
    /// rows here (after checking they are close), so that a one-ulp difference upstream cannot
    /// flip an e4m3 code, one step of up to 1/8 of an element, and make two forwards drift
    /// apart from there (run::parity). Only called when `wants_kv_inputs`.
    /// Returns whether it changed `rows`: only then are they uploaded again, so an model whose
    /// rows are only recorded keeps its own buffer (its production path).
    fn replace_kv_input(
        &mut self,
        _layer: usize,
        _first_pos: usize,
        _rows_kind: KvRows,
        _rows: &mut [f32],
    ) -> bool {
        false
    }
    fn attention(&mut self, _obs: &AttentionObservation<'_>) {}
    /// A named intermediate for consecutive positions `first_pos..first_pos + shape[0]`,
    /// row-major `data` of `shape`.
    fn intermediate(&mut self, _name: &str, _first_pos: usize, _shape: &[usize], _data: &[f32]) {}
}

/// An observer that wants nothing.
pub struct NoObserver;
impl Observer for NoObserver {}
