//! The lightning indexer of CSA layers (docs/spec/attention.md 6): picks which compressed rows each query
//! attends.
//!
//! - Keys: the indexer's own ratio-4 overlapping compressor (width `index_head_dim`) → norm →
//!   RoPE at 4w ("raw" keys, kept for the observer), then prepared ONCE, when the row is
//!   emitted, under the driving index profile (Hadamard / rounding live in
//!   `numerics::profiles`).
//! - Query of token t: `indexer.wq_b · qr_t` (qr = the q_norm output of the attention), viewed
//!   as `[index_n_heads, index_head_dim]`, RoPE on the last rope dims at position t; no
//!   per-head norm. Head weights: `weights_proj · x_t` (raw, before the indexer scale, 2^-6.5
//!   on Flash, which the profile applies).
//! - Score of row w: the profile's `Σ_h w_h · ReLU(q_h · k_w)`, for the visible rows
//!   `w < n_t = floor((t+1)/4)` only, in blocks of 256 query tokens × their visible rows
//!   ([`Backend::index_scores_batch`]: tiled GEMMs, never a `[tokens, rows, heads]` tensor).
//!   Scores are kept past selection only for the positions the observer watches.
//! - Selection: top-min(k, n_t) by score, ties to the lower row, `-1` padding to k
//!   (k = `index_topk` or the `--topk` override). For `n_t <= k` every visible row is selected.
//!
//! Output: `[T, k]` selected rows per query, in descending score order.

use super::compressor::Compressor;
use super::observer::{IndexerObservation, Observer};
use super::state::IndexKeyStore;
use super::{load_matrix, ModelError};
use crate::backend::{Backend, IndexScoreBatch, RawIndexQueries, INDEX_SCORE_TOKENS};
use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::config::RowMapping;
use crate::numerics::profiles::IndexProfile;
use crate::numerics::rope::RopeTable;

/// How one call scores and selects, and who watches.
pub struct IndexerRun<'a> {
    pub layer: usize,
    pub profile: IndexProfile,
    pub topk: usize,
    pub observer: &'a mut dyn Observer,
}

/// The chunk the indexer reads (from the attention).
pub struct IndexerInput<'a, A> {
    /// `[T, D]`: the attention input.
    pub x: &'a A,
    /// `[T, q_lora]`: the attention's q_norm output.
    pub qr: &'a A,
    /// Position of the chunk's first token.
    pub first_pos: usize,
}

/// What the selection of one chunk computed, for the observer.
struct ChunkSelection<'a, A> {
    /// `[T, heads, dim]`: the raw index queries (after RoPE, before the profile).
    q: &'a A,
    /// `[T, heads]`: the raw head weights.
    w: &'a A,
    /// Position of the chunk's first token.
    first_pos: usize,
    /// Per token: its scores `[visible rows]` wherever the observer wants them.
    kept: &'a [Option<Vec<f32>>],
    /// `[T, k]`: the selected rows.
    selected: &'a [i32],
}

/// One CSA layer's indexer weights.
pub struct Indexer<M> {
    wq_b: M,
    weights_proj: M,
    compressor: Compressor<M>,
    heads: usize,
    dim: usize,
}

impl<M> Indexer<M> {
    /// Loads `layers.{layer}.attn.indexer.*`.
    pub fn load<B: Backend<Matrix = M>>(
        backend: &B,
        ckpt: &Checkpoint,
        cfg: &ModelConfig,
        layer: usize,
    ) -> Result<Self, ModelError> {
        let p = format!("layers.{layer}.attn.indexer");
        let (heads, dim) = (cfg.index_n_heads, cfg.index_head_dim);
        Ok(Indexer {
            wq_b: load_matrix(
                backend,
                ckpt,
                &format!("{p}.wq_b"),
                heads * dim,
                cfg.q_lora_rank,
            )?,
            weights_proj: load_matrix(
                backend,
                ckpt,
                &format!("{p}.weights_proj"),
                heads,
                cfg.hidden_size,
            )?,
            compressor: Compressor::load(
                backend,
                ckpt,
                cfg,
                &format!("{p}.compressor"),
                RowMapping::CSA,
                dim,
            )?,
            heads,
            dim,
        })
    }

    /// Runs the indexer for the chunk `input` (attention input and q_norm output at positions
    /// `first_pos..`). Returns the selected rows `[T, k]`.
    pub fn select<B: Backend<Matrix = M>>(
        &self,
        backend: &B,
        input: IndexerInput<'_, B::Act>,
        store: &mut IndexKeyStore<B::Act>,
        rope: &RopeTable,
        run: &mut IndexerRun<'_>,
    ) -> Vec<i32> {
        let IndexerInput { x, qr, first_pos } = input;
        let (heads, dim, k) = (self.heads, self.dim, run.topk);
        let tokens = backend.act_len(qr) / backend.matrix_shape(&self.wq_b).1;
        self.emit_keys(backend, x, first_pos, store, rope, run.profile);

        let mut q = backend.act_uninit(tokens * heads * dim);
        backend.matmul(qr, &self.wq_b, &mut q);
        let positions: Vec<usize> = (first_pos..first_pos + tokens).collect();
        backend.rope(rope, &mut q, dim, &positions, false);
        let mut w = backend.act_uninit(tokens * heads);
        backend.matmul(x, &self.weights_proj, &mut w);

        let profile = run.profile;
        let hd = heads * dim;
        // Prepared queries of the chunk, token after token ([T, heads, dim] and [T, heads]).
        let mut q_prep = backend.act_uninit(tokens * hd);
        let mut w_prep = backend.act_uninit(tokens * heads);
        let raw = RawIndexQueries {
            profile,
            queries: &q,
            weights: &w,
            heads,
            dim,
        };
        backend.index_prepare_queries(&raw, &mut q_prep, &mut w_prep);

        // Scores are kept only where the observer looks at them.
        let obs = &*run.observer;
        let keep_all = obs.wants_intermediate(&format!("layers.{}.indexer.scores", run.layer));
        let keep: Vec<bool> = (0..tokens)
            .map(|i| keep_all || obs.wants_position(first_pos + i))
            .collect();
        let mut kept: Vec<Option<Vec<f32>>> = vec![None; tokens];
        let mut selected = vec![-1i32; tokens * k];
        let empty = backend.act_zeros(0);
        let keys = store.prepared.data().unwrap_or(&empty);
        let key_scales = store.scales.data().unwrap_or(&empty);
        for b0 in (0..tokens).step_by(INDEX_SCORE_TOKENS) {
            let b1 = (b0 + INDEX_SCORE_TOKENS).min(tokens);
            let visible: Vec<usize> = (b0..b1)
                .map(|i| self.compressor.rows().visible_rows(first_pos + i))
                .collect();
            let stride = visible.iter().copied().max().unwrap_or(0);
            // [block tokens, stride]: every element is written by the scorer.
            let mut scores = backend.act_uninit((b1 - b0) * stride);
            let batch = IndexScoreBatch {
                profile,
                queries: &q_prep,
                weights: &w_prep,
                first: b0,
                heads,
                dim,
                keys,
                key_scales,
                visible: &visible,
            };
            backend.index_scores_batch(&batch, &mut scores);
            if k > 0 {
                backend.topk_batch(&scores, stride, &visible, &mut selected[b0 * k..b1 * k]);
            }
            for (i, &n) in visible.iter().enumerate() {
                if keep[b0 + i] {
                    let mut row = vec![0.0f32; n];
                    backend.act_read(&scores, i * stride, &mut row);
                    kept[b0 + i] = Some(row);
                }
            }
        }

        let chunk = ChunkSelection {
            q: &q,
            w: &w,
            first_pos,
            kept: &kept,
            selected: &selected,
        };
        self.observe(backend, &chunk, store, run);
        run.observer
            .replace_selection(run.layer, first_pos, k, &mut selected);
        selected
    }

    /// Feeds the indexer compressor and stores the new key rows, raw and prepared.
    fn emit_keys<B: Backend<Matrix = M>>(
        &self,
        backend: &B,
        x: &B::Act,
        first_pos: usize,
        store: &mut IndexKeyStore<B::Act>,
        rope: &RopeTable,
        profile: IndexProfile,
    ) {
        let emitted =
            self.compressor
                .feed(backend, x, first_pos, &mut store.compressor, rope, |_| {});
        let Some(raw) = emitted.rows else {
            return;
        };
        let rows = emitted.count;
        debug_assert_eq!(emitted.first_row, store.rows());
        debug_assert_eq!(store.dim, self.dim);
        let mut prepared = backend.act_zeros(rows * self.dim);
        let mut scales = backend.act_zeros(rows);
        backend.index_prepare_keys(profile, &raw, self.dim, &mut prepared, &mut scales);
        store.raw.append(backend, &raw);
        store.prepared.append(backend, &prepared);
        store.scales.append(backend, &scales);
    }

    /// Observer calls: per probed position, and the chunk-wide intermediates when wanted.
    /// `chunk.kept[i]` holds token i's scores wherever the observer wants them.
    fn observe<B: Backend<Matrix = M>>(
        &self,
        backend: &B,
        chunk: &ChunkSelection<'_, B::Act>,
        store: &IndexKeyStore<B::Act>,
        run: &mut IndexerRun<'_>,
    ) {
        let ChunkSelection {
            q,
            w,
            first_pos,
            kept,
            selected,
        } = *chunk;
        let (heads, dim, layer, k) = (self.heads, self.dim, run.layer, run.topk);
        let obs = &mut *run.observer;
        // The raw key rows reach the host once per chunk, and only for a probed position.
        let mut keys_raw: Option<Vec<f32>> = None;
        for (i, scores) in kept.iter().enumerate() {
            let pos = first_pos + i;
            let Some(scores) = scores else { continue };
            if !obs.wants_position(pos) {
                continue;
            }
            let n_t = scores.len();
            let mut q_raw = vec![0.0f32; heads * dim];
            backend.act_read(q, i * heads * dim, &mut q_raw);
            let mut weights_raw = vec![0.0f32; heads];
            backend.act_read(w, i * heads, &mut weights_raw);
            obs.indexer(&IndexerObservation {
                layer,
                query_pos: pos,
                heads,
                head_dim: dim,
                q_raw: &q_raw,
                weights_raw: &weights_raw,
                keys_raw: &keys_raw.get_or_insert_with(|| {
                    store
                        .raw
                        .data()
                        .map_or_else(Vec::new, |a| backend.act_host(a).into_owned())
                })[..n_t * dim],
                visible_rows: n_t,
                scores,
                selected: &selected[i * k..(i + 1) * k],
                rows: crate::config::RowMapping::CSA,
                stage: super::observer::IndexStage::Plain,
            });
        }
        let tokens = kept.len();
        let name = format!("layers.{layer}.indexer.scores");
        if obs.wants_intermediate(&name) {
            let rows = store.rows();
            let mut dense = vec![f32::NEG_INFINITY; tokens * rows];
            for (i, scores) in kept.iter().enumerate() {
                let scores = scores.as_deref().unwrap_or(&[]);
                dense[i * rows..i * rows + scores.len()].copy_from_slice(scores);
            }
            obs.intermediate(&name, first_pos, &[tokens, rows], &dense);
        }
        let name = format!("layers.{layer}.indexer.topk");
        if obs.wants_intermediate(&name) {
            let flat: Vec<f32> = selected.iter().map(|&r| r as f32).collect();
            obs.intermediate(&name, first_pos, &[tokens, k], &flat);
        }
        let name = format!("layers.{layer}.indexer.q");
        if obs.wants_intermediate(&name) {
            obs.intermediate(
                &name,
                first_pos,
                &[tokens, heads, dim],
                &backend.act_host(q),
            );
        }
        let name = format!("layers.{layer}.indexer.weights");
        if obs.wants_intermediate(&name) {
            obs.intermediate(&name, first_pos, &[tokens, heads], &backend.act_host(w));
        }
    }
}
