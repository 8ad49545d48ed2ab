//! Per-sequence state: everything a layer must remember between chunks / decode steps
//! (docs/spec/attention.md section 8). One [`SequenceState`] per sequence, created by
//! `Model::new_sequence` and reset (or dropped) between sequences — never shared.
//!
//! The caches of rows ([`RowCache`]) hold backend activations (`A` = the backend's
//! `Backend::Act`: host memory on the CPU, device memory on a GPU), so a GPU keeps them on the
//! device and never uploads them again; row counts are kept on the host.
//!
//! Per layer ([`LayerState`]):
//! - [`WindowCache`]: the main KV rows (after norm, RoPE and the optional `--kv fp8` rounding) of
//!   the last `sliding_window - 1` tokens before the next chunk, plus the chunk itself while it
//!   runs. Row p is token p's key = value.
//! - CSA / HCA: the main compressor's [`CompressorState`] and the emitted compressed rows
//!   (`[rows, head_dim]`, post-processed, `--kv fp8`-rounded when on).
//! - CSA: the indexer's own [`CompressorState`] and its emitted key rows, both raw (after norm
//!   and RoPE, before any Hadamard or rounding; what the observer sees) and prepared under the
//!   driving profile, with one score multiplier per row ([`IndexKeyStore`]).
//!
//! [`CompressorState`] holds the raw gate logits and values (activations, so on a GPU they never
//! leave the device) of the tokens of the current, incomplete window and — for the overlapping
//! ratio-4 compressor — the previous full window (both halves, as REF keeps them). A fresh
//! state has no previous window, which is the "-inf logits, zero values" initial state REF
//! needs but never resets.

use crate::backend::Backend;
use crate::config::{LayerRole, ModelConfig};
use crate::numerics::profiles::{IndexProfile, KvMode};

/// Rows of `dim` values in one backend activation, grown at the end and dropped at the front.
/// Empty until the first append (no backend is needed to create or reset it).
pub struct RowCache<A> {
    dim: usize,
    rows: usize,
    data: Option<A>,
}

impl<A> RowCache<A> {
    pub fn new(dim: usize) -> Self {
        RowCache {
            dim,
            rows: 0,
            data: None,
        }
    }

    /// Rows held.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The rows `[rows, dim]`, or None while empty.
    pub fn data(&self) -> Option<&A> {
        self.data.as_ref().filter(|_| self.rows > 0)
    }

    /// Appends the rows of `tail` (`[n, dim]`).
    pub fn append<B: Backend<Act = A>>(&mut self, backend: &B, tail: &A) {
        let n = backend.act_len(tail) / self.dim;
        if n == 0 {
            return;
        }
        let data = self.data.get_or_insert_with(|| backend.act_zeros(0));
        backend.act_append(data, tail);
        self.rows += n;
    }

    /// Drops the first `n` rows (at most all of them).
    pub fn drop_front<B: Backend<Act = A>>(&mut self, backend: &B, n: usize) {
        let n = n.min(self.rows);
        if n == 0 {
            return;
        }
        if let Some(data) = &mut self.data {
            backend.act_drop_front(data, n * self.dim);
        }
        self.rows -= n;
    }

    pub fn clear(&mut self) {
        self.rows = 0;
        self.data = None;
    }

    fn floats(&self) -> usize {
        self.rows * self.dim
    }
}

impl<A> std::fmt::Debug for RowCache<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RowCache {{ rows: {}, dim: {} }}", self.rows, self.dim)
    }
}

/// The state of one sequence across all main layers (`A`: the backend's activation type).
#[derive(Debug)]
pub struct SequenceState<A = Vec<f32>> {
    pub(crate) len: usize,
    pub(crate) layers: Vec<LayerState<A>>,
    /// The (index profile, kv mode) its cached rows were rounded under, once it has tokens.
    pub(crate) rounding: Option<(IndexProfile, KvMode)>,
}

impl<A> SequenceState<A> {
    /// An empty sequence for a model of `cfg`.
    pub fn new(cfg: &ModelConfig) -> Self {
        SequenceState {
            len: 0,
            layers: cfg
                .layer_roles()
                .iter()
                .map(|role| LayerState::new(cfg, role))
                .collect(),
            rounding: None,
        }
    }

    /// Tokens processed so far (= the position of the next token).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets everything (start of a new sequence).
    pub fn reset(&mut self) {
        self.len = 0;
        self.rounding = None;
        for layer in &mut self.layers {
            layer.reset();
        }
    }

    /// Bytes held by the caches (for memory reports).
    pub fn memory_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(LayerState::memory_bytes)
            .sum::<usize>()
    }
}

/// One layer's state.
#[derive(Debug)]
pub struct LayerState<A> {
    pub(crate) window: WindowCache<A>,
    pub(crate) compressor: Option<CompressorState<A>>,
    /// Emitted main compressed rows `[rows, head_dim]`.
    pub(crate) compressed: RowCache<A>,
    pub(crate) indexer: Option<IndexKeyStore<A>>,
}

impl<A> LayerState<A> {
    fn new(cfg: &ModelConfig, role: &LayerRole) -> Self {
        LayerState {
            window: WindowCache::new(cfg.head_dim),
            compressor: role
                .owns_kv()
                .then(|| CompressorState::new(role.ratio, cfg.head_dim)),
            compressed: RowCache::new(cfg.head_dim),
            indexer: role
                .has_indexer()
                .then(|| IndexKeyStore::new(cfg.index_head_dim)),
        }
    }

    fn reset(&mut self) {
        self.window.reset();
        if let Some(c) = &mut self.compressor {
            c.reset();
        }
        self.compressed.clear();
        if let Some(i) = &mut self.indexer {
            i.reset();
        }
    }

    fn memory_bytes(&self) -> usize {
        let floats = self.window.rows.floats()
            + self.compressor.as_ref().map_or(0, CompressorState::floats)
            + self.compressed.floats()
            + self.indexer.as_ref().map_or(0, IndexKeyStore::floats);
        floats * std::mem::size_of::<f32>()
    }
}

/// The raw window KV rows of consecutive positions `first_pos..end()`.
#[derive(Debug)]
pub struct WindowCache<A> {
    pub(crate) first_pos: usize,
    pub(crate) rows: RowCache<A>,
}

impl<A> WindowCache<A> {
    pub(crate) fn new(dim: usize) -> Self {
        WindowCache {
            first_pos: 0,
            rows: RowCache::new(dim),
        }
    }

    fn reset(&mut self) {
        self.first_pos = 0;
        self.rows.clear();
    }

    /// Positions held: `first_pos..end()`.
    pub fn end(&self) -> usize {
        self.first_pos + self.rows.rows()
    }

    /// Appends rows for positions `end()..`.
    pub fn append<B: Backend<Act = A>>(&mut self, backend: &B, rows: &A) {
        self.rows.append(backend, rows);
    }

    /// Index in `WindowCache::rows` of token `pos`'s row; `pos` must be held.
    pub fn index_of(&self, pos: usize) -> usize {
        debug_assert!(
            pos >= self.first_pos && pos < self.end(),
            "window row {pos} not held"
        );
        pos - self.first_pos
    }

    /// Drops rows of positions before `pos`.
    pub fn forget_before<B: Backend<Act = A>>(&mut self, backend: &B, pos: usize) {
        if pos <= self.first_pos {
            return;
        }
        let drop = (pos - self.first_pos).min(self.rows.rows());
        self.rows.drop_front(backend, drop);
        self.first_pos += drop;
    }
}

/// A compressor's buffered token projections between chunks. `width` is the per-token
/// projection width (κ·c).
///
/// `values` and `logits` (raw gate logits; the pooling adds the position biases) hold the
/// tokens at positions `first_pos()..end()`: the current, incomplete window and — for the
/// overlapping ratio-4 compressor, once a row was emitted — the last full window before it
/// (both halves, as REF keeps them).
#[derive(Debug)]
pub struct CompressorState<A> {
    pub(crate) ratio: usize,
    pub(crate) width: usize,
    pub(crate) values: RowCache<A>,
    pub(crate) logits: RowCache<A>,
    /// Rows emitted so far (= index of the next row).
    pub(crate) rows_emitted: usize,
}

impl<A> CompressorState<A> {
    /// State of a ratio-`ratio` compressor of output width `c` (κ = 2 when ratio is 4).
    pub fn new(ratio: usize, c: usize) -> Self {
        let width = if ratio == 4 { 2 * c } else { c };
        CompressorState {
            ratio,
            width,
            values: RowCache::new(width),
            logits: RowCache::new(width),
            rows_emitted: 0,
        }
    }

    fn reset(&mut self) {
        self.values.clear();
        self.logits.clear();
        self.rows_emitted = 0;
    }

    /// Position of the first held token: the current window's start, with overlap the previous
    /// window's once there is one.
    pub fn first_pos(&self) -> usize {
        let windows = if self.ratio == 4 {
            self.rows_emitted.saturating_sub(1)
        } else {
            self.rows_emitted
        };
        self.ratio * windows
    }

    /// Position of the next token (one past the last held).
    pub fn end(&self) -> usize {
        self.first_pos() + self.values.rows()
    }

    /// Tokens buffered in the current window.
    pub fn filled(&self) -> usize {
        self.end() - self.ratio * self.rows_emitted
    }

    fn floats(&self) -> usize {
        self.values.floats() + self.logits.floats()
    }
}

/// The indexer's compressor state and its emitted key rows.
#[derive(Debug)]
pub struct IndexKeyStore<A> {
    pub(crate) dim: usize,
    pub(crate) compressor: CompressorState<A>,
    /// `[rows, dim]` after norm and RoPE, before any Hadamard or rounding (what the observer
    /// sees; read to the host only when it asks).
    pub(crate) raw: RowCache<A>,
    /// `[rows, dim]` prepared under the driving profile.
    pub(crate) prepared: RowCache<A>,
    /// `[rows]` score multipliers of the prepared rows.
    pub(crate) scales: RowCache<A>,
}

impl<A> IndexKeyStore<A> {
    fn new(dim: usize) -> Self {
        IndexKeyStore {
            dim,
            compressor: CompressorState::new(4, dim),
            raw: RowCache::new(dim),
            prepared: RowCache::new(dim),
            scales: RowCache::new(1),
        }
    }

    fn reset(&mut self) {
        self.compressor.reset();
        self.raw.clear();
        self.prepared.clear();
        self.scales.clear();
    }

    /// Key rows emitted so far.
    pub fn rows(&self) -> usize {
        self.scales.rows()
    }

    fn floats(&self) -> usize {
        self.compressor.floats() + self.raw.floats() + self.prepared.floats() + self.scales.floats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_cache_forgets_old_positions() {
        let cpu = crate::backend::CpuBackend::new();
        let mut w = WindowCache::new(2);
        w.append(&cpu, &vec![0.0, 0.5, 1.0, 1.5, 2.0, 2.5]);
        assert_eq!(w.end(), 3);
        w.forget_before(&cpu, 2);
        assert_eq!((w.first_pos, w.end()), (2, 3));
        assert_eq!(w.index_of(2), 0);
        assert_eq!(w.rows.data().unwrap(), &vec![2.0, 2.5]);
        w.forget_before(&cpu, 1);
        assert_eq!(w.first_pos, 2);
        w.append(&cpu, &vec![3.0, 3.5]);
        assert_eq!((w.end(), w.index_of(3)), (4, 1));
        w.reset();
        assert_eq!((w.end(), w.rows.data()), (0, None));
    }

    #[test]
    fn tiny_state_has_compressors_where_the_schedule_says() {
        let cfg = ModelConfig::tiny();
        let s = SequenceState::<Vec<f32>>::new(&cfg);
        let has: Vec<(bool, bool)> = s
            .layers
            .iter()
            .map(|l| (l.compressor.is_some(), l.indexer.is_some()))
            .collect();
        assert_eq!(
            has,
            vec![(false, false), (true, true), (true, false), (true, true)]
        );
        assert_eq!(
            s.layers[1].compressor.as_ref().unwrap().width,
            2 * cfg.head_dim
        );
        assert_eq!(s.layers[2].compressor.as_ref().unwrap().width, cfg.head_dim);
    }
}
