//! Per-sequence state of the DeepSeek-V4.1 forward (docs/spec/v41.md 5.3-5.5): what a chunk
//! leaves for the next one.
//!
//! - Per layer: its window KV rows ([`WindowCache`], after norm and RoPE).
//! - Per KV source ([`SourceState`]): the compressed rows (`[rows, head_dim]`, RoPE'd at each
//!   group's first position: what attention reads), the index keys (`[rows, index_head_dim]`,
//!   raw after `k_norm` and RoPE, and prepared under the index profile with one multiplier
//!   per row), and, at ratio 2, the one token of an unfinished pair (its `wkv` and `wgate`
//!   projections, on the host: at most one row).
//! - The Engram token classes of the last `max_ngram - 1` tokens (`V41State::history`).

use std::collections::BTreeMap;

use crate::backend::Backend;
use crate::config::V41Config;
use crate::model::state::{RowCache, WindowCache};
use crate::numerics::profiles::{IndexProfile, KvMode};

/// What a KV source layer carries between chunks.
pub struct SourceState<A> {
    /// RoPE'd compressed rows, what attention reads.
    pub compressed: RowCache<A>,
    /// Index keys after `k_norm` and RoPE, before any rounding (the observer's view).
    pub keys_raw: RowCache<A>,
    /// Index keys prepared under the index profile.
    pub keys: RowCache<A>,
    /// One score multiplier per prepared key row.
    pub key_scales: RowCache<A>,
    /// Ratio 2: the `wkv` and `wgate` projections `[c]` of a token whose pair is unfinished.
    pub pending: Option<(Vec<f32>, Vec<f32>)>,
}

impl<A> SourceState<A> {
    fn new(head_dim: usize, index_dim: usize) -> Self {
        SourceState {
            compressed: RowCache::new(head_dim),
            keys_raw: RowCache::new(index_dim),
            keys: RowCache::new(index_dim),
            key_scales: RowCache::new(1),
            pending: None,
        }
    }

    /// Compressed rows emitted so far.
    pub fn rows(&self) -> usize {
        self.compressed.rows()
    }
}

/// The state of one sequence (module doc).
pub struct V41State<A = Vec<f32>> {
    pub(crate) len: usize,
    pub(crate) windows: Vec<WindowCache<A>>,
    pub(crate) sources: BTreeMap<usize, SourceState<A>>,
    /// Engram classes of the latest tokens, oldest first (at most `max_ngram - 1`).
    pub(crate) history: Vec<u32>,
    /// The index profile and KV rounding the sequence was started with.
    pub(crate) rounding: Option<(IndexProfile, KvMode)>,
}

impl<A> V41State<A> {
    /// A fresh, empty state for `cfg`.
    pub fn new(cfg: &V41Config) -> Self {
        let t = &cfg.text;
        let roles = cfg.layer_roles();
        V41State {
            len: 0,
            windows: (0..t.num_hidden_layers)
                .map(|_| WindowCache::new(t.head_dim))
                .collect(),
            sources: roles
                .iter()
                .filter(|r| r.owns_kv())
                .map(|r| (r.layer, SourceState::new(t.head_dim, t.index_head_dim)))
                .collect(),
            history: Vec::new(),
            rounding: None,
        }
    }

    /// Tokens seen so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops old window rows no later query needs.
    pub(crate) fn forget<B: Backend<Act = A>>(&mut self, backend: &B, window: usize) {
        let keep_from = (self.len + 1).saturating_sub(window);
        for w in &mut self.windows {
            w.forget_before(backend, keep_from);
        }
    }
}
