//! The lightning indexer of a DeepSeek-V4.1 index source (docs/spec/v41.md 5.5-5.6).
//!
//! - Keys belong to KV sources ([`Indexer::publish_keys`]): `k_j = k_norm(wk · latent_j)`
//!   `[rows, d_i]` from the compressor's un-roped latents, RoPE at the group's first position
//!   `j · ratio`, kept raw and prepared under the index profile.
//! - Queries, every index source: `indexer.wq_b · qr_t` `[H_i, d_i]` (qr = the attention's
//!   q_norm output), RoPE at t; head weights `weights_proj · x_t` (the profile applies the
//!   scale `(H_i · d_i)^-0.5`). No Hadamard rotation anywhere.
//! - Scores against the KV source's keys: `Σ_h w_h ReLU(q_h · k_j)` for the `n_t =
//!   floor((t+1)/ratio)` visible rows, in blocks of [`INDEX_SCORE_TOKENS`] queries.
//! - Selection per query: the top `k` rows (`index_topk` or the `--topk` what-if), ties to the
//!   lower row, `-1` padding; on the candidate source also its [`Candidates`], on a consumer
//!   the top-k inside the source's kept blocks (and, for the observer, without them).
//!
//! Output: the selected rows `[T, k]` in descending score order.

use super::selection::{drop_unscored, Candidates};
use super::state::SourceState;
use crate::backend::{Backend, IndexScoreBatch, RawIndexQueries, INDEX_SCORE_TOKENS};
use crate::checkpoint::Checkpoint;
use crate::config::{CandidateStage, LayerRole, V41Config};
use crate::model::layer::{emit, emit_act};
use crate::model::observer::{IndexStage, IndexerObservation, Observer};
use crate::model::{load_matrix, ModelError};
use crate::numerics::profiles::{IndexProfile, KvMode};
use crate::numerics::rope::RopeTable;

/// The key weights of an index source that is also a KV source.
struct KeyWeights<M> {
    wk: M,
    k_norm: Vec<f32>,
}

/// One index source's weights.
pub struct Indexer<M> {
    role: LayerRole,
    wq_b: M,
    weights_proj: M,
    keys: Option<KeyWeights<M>>,
    heads: usize,
    dim: usize,
    eps: f32,
}

/// What one chunk's selection needs besides the indexer's own weights.
pub struct SelectRun<'a> {
    pub profile: IndexProfile,
    /// KV rounding of the window and compressed rows.
    pub kv: KvMode,
    /// Rows selected per query.
    pub topk: usize,
    /// Blocks the candidate source keeps per query.
    pub candidate_blocks: usize,
    /// Rows per candidate block.
    pub block_rows: usize,
    /// Set by the candidate source for the chunk's queries, read by its consumers.
    pub candidates: &'a mut Option<Vec<Candidates>>,
    pub observer: &'a mut dyn Observer,
}

impl<M> Indexer<M> {
    /// Loads `layers.{role.layer}.attn.indexer.*` (`wk` and `k_norm` on KV sources only).
    pub fn load<B: Backend<Matrix = M>>(
        backend: &B,
        ckpt: &Checkpoint<V41Config>,
        role: LayerRole,
    ) -> Result<Self, ModelError> {
        let t = &ckpt.config().text;
        let (heads, dim) = (t.index_n_heads, t.index_head_dim);
        let p = format!("layers.{}.attn.indexer", role.layer);
        let keys = if role.owns_kv() {
            Some(KeyWeights {
                wk: load_matrix(backend, ckpt, &format!("{p}.wk"), dim, t.head_dim)?,
                k_norm: ckpt.f32_tensor(&format!("{p}.k_norm.weight"), &[dim])?,
            })
        } else {
            None
        };
        Ok(Indexer {
            role,
            wq_b: load_matrix(
                backend,
                ckpt,
                &format!("{p}.wq_b"),
                heads * dim,
                t.q_lora_rank,
            )?,
            weights_proj: load_matrix(
                backend,
                ckpt,
                &format!("{p}.weights_proj"),
                heads,
                t.hidden_size,
            )?,
            keys,
            heads,
            dim,
            eps: t.rms_norm_eps as f32,
        })
    }

    /// Index keys of the new latents `[count, c]` (rows `first_row..`), appended to the
    /// source's key caches raw and prepared under `profile`. Only a KV source publishes.
    pub fn publish_keys<B: Backend<Matrix = M>>(
        &self,
        backend: &B,
        latents: &B::Act,
        first_row: usize,
        rope: &RopeTable,
        source: &mut SourceState<B::Act>,
        profile: IndexProfile,
    ) {
        let Some(kw) = &self.keys else { return };
        let rows = backend.act_len(latents) / backend.matrix_shape(&kw.wk).1;
        let mut k = backend.act_uninit(rows * self.dim);
        backend.matmul(latents, &kw.wk, &mut k);
        backend.rms_norm(&mut k, self.dim, Some(&kw.k_norm), self.eps);
        let positions: Vec<usize> = (first_row..first_row + rows)
            .map(|j| j * self.role.ratio)
            .collect();
        backend.rope(rope, &mut k, self.dim, &positions, false);
        let mut prepared = backend.act_uninit(rows * self.dim);
        let mut scales = backend.act_uninit(rows);
        backend.index_prepare_keys(profile, &k, self.dim, &mut prepared, &mut scales);
        source.keys_raw.append(backend, &k);
        source.keys.append(backend, &prepared);
        source.key_scales.append(backend, &scales);
    }

    /// Scores and selects for the chunk: `x [T, D]` (attention input) and `qr [T, q_lora]` at
    /// positions `first_pos..`, against the keys of `source` (the layer's KV source, keys up to
    /// the chunk's end). Returns `[T, k]`.
    pub fn select<B: Backend<Matrix = M>>(
        &self,
        backend: &B,
        (x, qr, first_pos): (&B::Act, &B::Act, usize),
        source: &SourceState<B::Act>,
        rope: &RopeTable,
        run: &mut SelectRun<'_>,
    ) -> Vec<i32> {
        let (heads, dim, k, l) = (self.heads, self.dim, run.topk, self.role.layer);
        let tokens = backend.act_len(qr) / backend.matrix_shape(&self.wq_b).1;
        let mut q = backend.act_uninit(tokens * heads * dim);
        backend.matmul(qr, &self.wq_b, &mut q);
        let positions: Vec<usize> = (first_pos..first_pos + tokens).collect();
        backend.rope(rope, &mut q, dim, &positions, false);
        let mut w = backend.act_uninit(tokens * heads);
        backend.matmul(x, &self.weights_proj, &mut w);
        emit_act(
            backend,
            run.observer,
            &format!("layers.{l}.indexer.q"),
            first_pos,
            &[tokens, heads, dim],
            &q,
        );
        emit_act(
            backend,
            run.observer,
            &format!("layers.{l}.indexer.weights"),
            first_pos,
            &[tokens, heads],
            &w,
        );
        let mut q_prep = backend.act_uninit(tokens * heads * dim);
        let mut w_prep = backend.act_uninit(tokens * heads);
        let raw = RawIndexQueries {
            profile: run.profile,
            queries: &q,
            weights: &w,
            heads,
            dim,
        };
        backend.index_prepare_queries(&raw, &mut q_prep, &mut w_prep);

        let stage = self.role.candidate_stage;
        let obs = &mut *run.observer;
        let names = IndexerNames::new(l);
        let want_scores = obs.wants_intermediate(&names.scores);
        let want_free = matches!(stage, CandidateStage::Consumer { .. })
            && (obs.wants_intermediate(&names.scores_free)
                || obs.wants_intermediate(&names.topk_free));
        let want_blocks = stage == CandidateStage::Source
            && (obs.wants_intermediate(&names.block_scores)
                || obs.wants_intermediate(&names.kept_blocks));
        let mut kept_scores: Vec<Vec<f32>> = Vec::new();
        let mut kept_free: Vec<Vec<f32>> = Vec::new();
        let mut free_topk: Vec<i32> = Vec::new();
        let mut new_candidates: Vec<Candidates> = Vec::new();
        let mut selected = vec![-1i32; tokens * k];
        let empty = backend.act_zeros(0);
        let ratio = self.role.ratio;
        // The raw key rows reach the host once per chunk, and only for a probed position.
        let mut keys_raw: Option<Vec<f32>> = None;
        for b0 in (0..tokens).step_by(INDEX_SCORE_TOKENS) {
            let b1 = (b0 + INDEX_SCORE_TOKENS).min(tokens);
            let visible: Vec<usize> = (b0..b1).map(|i| (first_pos + i + 1) / ratio).collect();
            let stride = visible.iter().copied().max().unwrap_or(0);
            let mut scores = backend.act_uninit((b1 - b0) * stride);
            let batch = IndexScoreBatch {
                profile: run.profile,
                queries: &q_prep,
                weights: &w_prep,
                first: b0,
                heads,
                dim,
                keys: source.keys.data().unwrap_or(&empty),
                key_scales: source.key_scales.data().unwrap_or(&empty),
                visible: &visible,
            };
            backend.index_scores_batch(&batch, &mut scores);
            let host = backend.act_into_host(scores);
            for (i, &n) in visible.iter().enumerate() {
                let t = b0 + i;
                let mut row = host[i * stride..i * stride + n].to_vec();
                let probed = obs.wants_position(first_pos + t).then(|| row.clone());
                let out = &mut selected[t * k..(t + 1) * k];
                let consumed = match stage {
                    CandidateStage::Consumer { .. } => Some(
                        run.candidates
                            .as_ref()
                            .and_then(|c| c.get(t))
                            .expect("the candidate source runs before its consumers"),
                    ),
                    _ => None,
                };
                match (stage, consumed) {
                    (CandidateStage::Source, _) => {
                        new_candidates.push(Candidates::select(
                            &row,
                            n,
                            run.block_rows,
                            run.candidate_blocks,
                        ));
                    }
                    (CandidateStage::Consumer { .. }, Some(c)) => {
                        if want_free {
                            let mut free = vec![-1i32; k];
                            backend.topk(&row, &mut free);
                            drop_unscored(&mut free, &row);
                            free_topk.extend(free);
                            kept_free.push(row.clone());
                        }
                        c.mask(&mut row);
                    }
                    _ => {}
                }
                backend.topk(&row, out);
                drop_unscored(out, &row);
                if let Some(scores) = probed {
                    let index_stage = match (stage, consumed) {
                        (CandidateStage::Source, _) => IndexStage::CandidateSource {
                            candidates: new_candidates.last().expect("pushed above"),
                            block_rows: run.block_rows,
                            budget: run.candidate_blocks,
                        },
                        (CandidateStage::Consumer { source }, Some(c)) => IndexStage::Consumer {
                            source,
                            candidates: c,
                        },
                        _ => IndexStage::Plain,
                    };
                    let mut q_raw = vec![0.0f32; heads * dim];
                    backend.act_read(&q, t * heads * dim, &mut q_raw);
                    let mut weights_raw = vec![0.0f32; heads];
                    backend.act_read(&w, t * heads, &mut weights_raw);
                    let keys = keys_raw.get_or_insert_with(|| {
                        source
                            .keys_raw
                            .data()
                            .map_or_else(Vec::new, |a| backend.act_host(a).into_owned())
                    });
                    obs.indexer(&IndexerObservation {
                        layer: l,
                        query_pos: first_pos + t,
                        heads,
                        head_dim: dim,
                        q_raw: &q_raw,
                        weights_raw: &weights_raw,
                        keys_raw: &keys[..n * dim],
                        visible_rows: n,
                        scores: &scores,
                        selected: out,
                        rows: self
                            .role
                            .rows()
                            .expect("an index source reads compressed rows"),
                        stage: index_stage,
                    });
                }
                if want_scores {
                    kept_scores.push(row);
                }
            }
        }
        if stage == CandidateStage::Source {
            if want_blocks {
                emit_candidates(obs, &names, first_pos, &new_candidates, source.rows());
            }
            *run.candidates = Some(new_candidates);
        }
        let rows = source.rows();
        emit_rows(obs, &names.scores, first_pos, &kept_scores, rows);
        emit_rows(obs, &names.scores_free, first_pos, &kept_free, rows);
        let as_f32 = |v: &[i32]| v.iter().map(|&r| r as f32).collect::<Vec<f32>>();
        emit(
            obs,
            &names.topk,
            first_pos,
            &[tokens, k],
            &as_f32(&selected),
        );
        if want_free {
            emit(
                obs,
                &names.topk_free,
                first_pos,
                &[tokens, k],
                &as_f32(&free_topk),
            );
        }
        selected
    }
}

/// The names of one index source's intermediates.
struct IndexerNames {
    scores: String,
    topk: String,
    scores_free: String,
    topk_free: String,
    block_scores: String,
    kept_blocks: String,
}

impl IndexerNames {
    fn new(l: usize) -> Self {
        IndexerNames {
            scores: format!("layers.{l}.indexer.scores"),
            topk: format!("layers.{l}.indexer.topk"),
            scores_free: format!("layers.{l}.indexer.scores_unconstrained"),
            topk_free: format!("layers.{l}.indexer.topk_unconstrained"),
            block_scores: format!("layers.{l}.candidates.block_scores"),
            kept_blocks: format!("layers.{l}.candidates.kept_blocks"),
        }
    }
}

/// Per-query score rows (each as long as that query's visible rows) as one `[T, rows]`
/// intermediate, -inf past each row's end; nothing when `per_query` is empty.
fn emit_rows(
    obs: &mut dyn Observer,
    name: &str,
    first_pos: usize,
    per_query: &[Vec<f32>],
    rows: usize,
) {
    if per_query.is_empty() || !obs.wants_intermediate(name) {
        return;
    }
    let mut dense = vec![f32::NEG_INFINITY; per_query.len() * rows];
    for (i, r) in per_query.iter().enumerate() {
        dense[i * rows..i * rows + r.len()].copy_from_slice(r);
    }
    obs.intermediate(name, first_pos, &[per_query.len(), rows], &dense);
}

/// The candidate source's block scores and kept blocks `[T, ceil(rows / block)]`.
fn emit_candidates(
    obs: &mut dyn Observer,
    names: &IndexerNames,
    first_pos: usize,
    per_query: &[Candidates],
    rows: usize,
) {
    let Some(block) = per_query.first().map(|c| c.block) else {
        return;
    };
    let blocks = rows.div_ceil(block);
    let t = per_query.len();
    let mut scores = vec![f32::NEG_INFINITY; t * blocks];
    let mut kept = vec![0.0f32; t * blocks];
    for (i, c) in per_query.iter().enumerate() {
        scores[i * blocks..i * blocks + c.block_scores.len()].copy_from_slice(&c.block_scores);
        for (b, &kb) in c.kept.iter().enumerate() {
            kept[i * blocks + b] = if kb { 1.0 } else { 0.0 };
        }
    }
    emit(obs, &names.block_scores, first_pos, &[t, blocks], &scores);
    emit(obs, &names.kept_blocks, first_pos, &[t, blocks], &kept);
}
