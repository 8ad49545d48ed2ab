//! `NeedleObserver`: the probe's [`Observer`], turning engine observations into records.
//!
//! At every CSA layer and probed position ([`IndexerObservation`]) it ranks the needle rows
//! (`rows.rs`, `rank.rs`) under
//! - the driving profile, using the engine's own scores (`obs.scores`), and
//! - each `--compare` profile, re-scoring the raw keys (`obs.keys_raw`) from the raw query and
//!   head weights with `numerics::profiles` - visible rows only, one key row at a time into a
//!   per-thread scratch buffer, never a per-position copy of the cache,
//!
//! giving one [`LayerRecord`] per (cell, profile). Cells are `(cell_id, top-k)` pairs: the FIRST
//! is the engine's own run (its k is the one `obs.selected` was made with, and it labels the
//! attention records); further cells are counterfactual k on the same hidden states.
//!
//! It also checks the engine: the needle is among `obs.selected` iff its driving rank <= the
//! engine's k (= `obs.selected.len()`), except when the needle's tie group straddles the k-th
//! place (tie order is engine-defined). Each check and disagreement is counted; shape
//! mismatches (e.g. `visible_rows != floor((t+1)/4)`) are recorded as [`ObservationError`]s
//! instead of panicking, since observer methods cannot return errors.
//!
//! Several needles (a user's `--needle`s, `--needles N`) are ranked one by one: each gets its
//! own record per (cell, profile), with its index in `needle`, and its own selection check.
//!
//! At every layer ([`AttentionObservation`]) it records the needle attention mass: per head,
//! the probability on window tokens inside a needle span plus compressed rows that pool a
//! needle token (any needle's: the mass on all of them together); mean over heads and the max head; whether any needle token is in the raw
//! window; and the mean sink share ([`AttentionRecord`], the attention.csv fields).

use std::collections::BTreeSet;

use rayon::prelude::*;

use super::rank::{kth_scores, rank_needle, NeedleRank, RecordMeta};
use crate::record::AttentionRecord;

use super::capture::EngineCapture;
use crate::model::observer::{AttentionObservation, IndexStage, IndexerObservation, Observer};
use crate::model::v41::selection::Candidates;
use crate::numerics::profiles::{prepare_key_row, prepare_query, score, IndexProfile};
use crate::record::engine::EngineLayerRecord;
use crate::record::stage::{needle_block_rank, LayerStage, StageVerdict};
use crate::record::{phase_label, LayerRecord};

/// A cell scored by the observer: its id and top-k.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CellTopk {
    pub cell_id: String,
    pub topk: usize,
}

/// What to observe.
#[derive(Clone, Debug, PartialEq)]
pub struct NeedleObserverConfig {
    /// The needles' token spans `[a, b)`, each ranked on its own (records carry the index);
    /// at least one.
    pub needles: Vec<(usize, usize)>,
    /// Answer token span `[a, b)` (kept for reports; ranks use the needle spans).
    pub answer: (usize, usize),
    /// Prompt length: positions below it are phase "prompt", position `prompt_len - 1 + s` is
    /// decode step `s`.
    pub prompt_len: usize,
    /// Probed positions inside the prompt (default: the last prompt token).
    pub prompt_positions: Vec<usize>,
    /// Also probe every decode position (`>= prompt_len`).
    pub probe_decode: bool,
    pub driving: IndexProfile,
    /// Comparison profiles (the driving profile is skipped if listed).
    pub compare: Vec<IndexProfile>,
    /// The engine's cell first, then counterfactual top-k cells.
    pub cells: Vec<CellTopk>,
    /// A serving engine's captured selections (`--engine`): at every probed position and CSA
    /// layer the engine's set is held against each scored profile's top-K
    /// ([`super::engine`]), giving `engine_records`.
    pub engine: Option<std::sync::Arc<EngineCapture>>,
}

/// An observation the probe could not use; names layer, position and field.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("layer {layer}, query position {query_pos}: {field}: expected {expected}, found {found}")]
pub struct ObservationError {
    pub layer: usize,
    pub query_pos: usize,
    pub field: &'static str,
    pub expected: String,
    pub found: String,
}

/// Where the engine's selection and the driving rank disagree (outside straddling ties).
#[derive(Clone, Debug, PartialEq)]
pub struct SelectionDisagreement {
    pub layer: usize,
    pub query_pos: usize,
    pub topk: usize,
    pub needle_rank: Option<usize>,
    pub rank_ties: usize,
    pub engine_selected_needle: bool,
}

/// Collects layer and attention records during a forward pass.
pub struct NeedleObserver {
    cfg: NeedleObserverConfig,
    prompt_positions: BTreeSet<usize>,
    pub layer_records: Vec<LayerRecord>,
    pub attention_records: Vec<AttentionRecord>,
    /// With a serving engine's capture: one record per (layer, position, needle, profile).
    pub engine_records: Vec<EngineLayerRecord>,
    /// Number of (layer, position) selection checks made.
    pub selection_checks: usize,
    pub disagreements: Vec<SelectionDisagreement>,
    pub errors: Vec<ObservationError>,
    /// DeepSeek-V4.1: the blocks the candidate source kept per (query position, profile), for
    /// its consumers later in the same forward.
    candidates: std::collections::HashMap<(usize, IndexProfile), Candidates>,
}

/// The stage statistics of one profile's ranking at a DeepSeek-V4.1 index layer (module doc).
enum StageRanks {
    /// A V4 layer (no stage columns).
    None,
    Index,
    /// The candidate source: per needle, its best block's rank and whether it was kept.
    CandidateSource(Vec<Option<(usize, bool)>>),
    /// A consumer: per needle, whether a needle row lies in a kept block and the rank without
    /// the mask; `ranks` (the records' ranks) are those inside the mask.
    Reindex(Vec<(bool, Option<usize>)>),
}

impl NeedleObserver {
    pub fn new(cfg: NeedleObserverConfig) -> Self {
        let prompt_positions = cfg.prompt_positions.iter().copied().collect();
        Self {
            cfg,
            prompt_positions,
            layer_records: Vec::new(),
            attention_records: Vec::new(),
            engine_records: Vec::new(),
            selection_checks: 0,
            disagreements: Vec::new(),
            errors: Vec::new(),
            candidates: Default::default(),
        }
    }

    pub fn config(&self) -> &NeedleObserverConfig {
        &self.cfg
    }

    /// "prompt" or the decode step number.
    pub fn phase(&self, pos: usize) -> String {
        phase_label(pos, self.cfg.prompt_len)
    }

    fn error(
        &mut self,
        layer: usize,
        pos: usize,
        field: &'static str,
        expected: String,
        found: String,
    ) {
        self.errors.push(ObservationError {
            layer,
            query_pos: pos,
            field,
            expected,
            found,
        });
    }

    /// One record per (cell, needle) from the needles' ranks under `profile` (`scores`: the
    /// scores the layer ranks, inside the candidate mask on a reindex layer).
    fn push_records(
        &mut self,
        obs: &IndexerObservation<'_>,
        profile: IndexProfile,
        ranks: &[NeedleRank],
        scores: &[f32],
        stage: &StageRanks,
    ) {
        let ks: Vec<usize> = self.cfg.cells.iter().map(|c| c.topk).collect();
        let kth = kth_scores(scores, &ks);
        let phase = self.phase(obs.query_pos);
        let rows = self.needle_rows(obs);
        for (cell, kth) in self.cfg.cells.iter().zip(kth) {
            for (needle, rank) in ranks.iter().enumerate() {
                let meta = RecordMeta {
                    cell_id: &cell.cell_id,
                    layer: obs.layer,
                    query_pos: obs.query_pos,
                    phase: &phase,
                    profile: profile.name(),
                    driving: profile == self.cfg.driving,
                    needle,
                };
                let mut record = LayerRecord::new(&meta, rank, kth, cell.topk);
                match stage {
                    StageRanks::None => {}
                    StageRanks::Index => record.stage = Some(LayerStage::Index),
                    StageRanks::CandidateSource(blocks) => {
                        record.stage = Some(LayerStage::CandidateSource);
                        record.block_rank = blocks[needle].map(|b| b.0);
                        record.block_kept = blocks[needle].map(|b| b.1);
                    }
                    StageRanks::Reindex(per_needle) => {
                        let (in_kept, free_rank) = per_needle[needle];
                        let visible = rows[needle].start.min(obs.visible_rows)
                            ..rows[needle].end.min(obs.visible_rows);
                        let masked_rank = rank
                            .needle_score
                            .filter(|&s| s > f32::NEG_INFINITY)
                            .and(rank.needle_rank);
                        record.stage = Some(LayerStage::Reindex);
                        record.block_kept = (!visible.is_empty()).then_some(in_kept);
                        record.unconstrained_rank = free_rank;
                        record.stage_verdict = Some(StageVerdict::at_consumer(
                            visible,
                            |_| in_kept,
                            masked_rank,
                            cell.topk,
                        ));
                    }
                }
                self.layer_records.push(record);
            }
        }
    }

    /// Ranks the needles under `profile` from its scores of every visible row, through the
    /// layer's stage: the candidate source's blocks (kept for its consumers at this position),
    /// a consumer's mask. Returns the ranks the records carry, the scores they come from and
    /// the stage statistics; `None` (an error recorded) when a consumer's candidates are
    /// missing.
    fn stage_ranks(
        &mut self,
        obs: &IndexerObservation<'_>,
        profile: IndexProfile,
        scores: Vec<f32>,
        rows: &[std::ops::Range<usize>],
    ) -> Option<(Vec<NeedleRank>, Vec<f32>, StageRanks)> {
        let rank_all = |s: &[f32]| -> Vec<NeedleRank> {
            rows.iter().map(|r| rank_needle(s, r.clone())).collect()
        };
        let driving = profile == self.cfg.driving;
        match obs.stage {
            IndexStage::Plain => {
                let stage = if obs.rows == crate::config::RowMapping::CSA {
                    StageRanks::None
                } else {
                    StageRanks::Index
                };
                Some((rank_all(&scores), scores, stage))
            }
            IndexStage::CandidateSource {
                candidates,
                block_rows,
                budget,
            } => {
                let c = match driving {
                    true => candidates.clone(),
                    false => Candidates::select(&scores, obs.visible_rows, block_rows, budget),
                };
                let blocks = rows
                    .iter()
                    .map(|r| {
                        let r = r.start.min(obs.visible_rows)..r.end.min(obs.visible_rows);
                        if r.is_empty() {
                            return None;
                        }
                        let span = r.start / c.block..(r.end - 1) / c.block + 1;
                        needle_block_rank(&c.block_scores, &c.kept, c.pinned, span)
                            .map(|b| (b.rank, b.kept))
                    })
                    .collect();
                self.candidates.insert((obs.query_pos, profile), c);
                Some((
                    rank_all(&scores),
                    scores,
                    StageRanks::CandidateSource(blocks),
                ))
            }
            IndexStage::Consumer { source, candidates } => {
                let kept = match driving {
                    true => Some(candidates.clone()),
                    false => self.candidates.get(&(obs.query_pos, profile)).cloned(),
                };
                let Some(kept) = kept else {
                    self.error(
                        obs.layer,
                        obs.query_pos,
                        "candidate blocks",
                        format!("those candidate source {source} kept under {profile}"),
                        "none (the source was not observed at this position)".into(),
                    );
                    return None;
                };
                let free = rank_all(&scores);
                let mut masked = scores;
                kept.mask(&mut masked);
                let per_needle = rows
                    .iter()
                    .zip(&free)
                    .map(|(r, f)| {
                        let r = r.start.min(obs.visible_rows)..r.end.min(obs.visible_rows);
                        (r.clone().any(|w| kept.keeps_row(w)), f.needle_rank)
                    })
                    .collect();
                Some((rank_all(&masked), masked, StageRanks::Reindex(per_needle)))
            }
        }
    }

    /// The serving engine's set at this observation's (position, layer), padding dropped; an
    /// error when the capture has no row there.
    fn served_set(&mut self, obs: &IndexerObservation<'_>) -> Option<Vec<usize>> {
        let capture = self.cfg.engine.clone()?;
        match capture.selection(obs.query_pos, obs.layer) {
            Some(row) => Some(super::engine::engine_set(row)),
            None => {
                self.error(
                    obs.layer,
                    obs.query_pos,
                    "the serving engine's selection",
                    format!(
                        "a row for this position (the engine sent rows 0..{})",
                        capture.rows
                    ),
                    "none".into(),
                );
                None
            }
        }
    }

    /// One engine record per needle: the engine's set against `profile`'s top-K.
    fn push_engine_record(
        &mut self,
        obs: &IndexerObservation<'_>,
        profile: IndexProfile,
        scores: &[f32],
        needle_rows: &[std::ops::Range<usize>],
        engine_set: &[usize],
    ) {
        let Some(capture) = &self.cfg.engine else {
            return;
        };
        let k = capture.topk;
        let overlap = super::engine::overlap(engine_set, &super::engine::top_rows(scores, k));
        let Some(cell) = self.cfg.cells.first() else {
            return;
        };
        for (needle, rows) in needle_rows.iter().enumerate() {
            self.engine_records.push(EngineLayerRecord {
                cell_id: cell.cell_id.clone(),
                layer: obs.layer,
                query_pos: obs.query_pos,
                phase: phase_label(obs.query_pos, self.cfg.prompt_len),
                needle,
                engine_topk: k,
                visible_rows: obs.visible_rows,
                selected_rows: engine_set.len(),
                needle_selected: engine_set.iter().any(|w| rows.contains(w)),
                profile: profile.name().to_string(),
                overlap,
            });
        }
    }

    /// Each needle's rows of the observed layer's compressed series.
    fn needle_rows(&self, obs: &IndexerObservation<'_>) -> Vec<std::ops::Range<usize>> {
        self.cfg
            .needles
            .iter()
            .map(|&span| obs.rows.span_rows(span))
            .collect()
    }

    /// Checks shapes; records an error and returns false when the observation is unusable.
    /// Non-finite index scores (NaN, ±inf) make every rank meaningless: an error naming the
    /// layer, position and profile instead of records (the probe then fails, never reporting
    /// a verdict from broken numbers).
    fn check_finite(
        &mut self,
        obs: &IndexerObservation<'_>,
        profile: IndexProfile,
        scores: &[f32],
    ) -> bool {
        let nan = scores.iter().filter(|s| s.is_nan()).count();
        let inf = scores.iter().filter(|s| s.is_infinite()).count();
        if nan + inf == 0 {
            return true;
        }
        self.error(
            obs.layer,
            obs.query_pos,
            "indexer scores",
            format!("finite numbers under {profile}"),
            format!(
                "{nan} NaN and {inf} infinite of {} (the model's weights or activations are not \
                 finite: a damaged or mis-converted checkpoint?)",
                scores.len()
            ),
        );
        false
    }

    fn check_indexer(&mut self, obs: &IndexerObservation<'_>) -> bool {
        let (l, t) = (obs.layer, obs.query_pos);
        let n_t = obs.rows.visible_rows(t);
        let checks: [(&'static str, usize, usize); 5] = [
            ("visible_rows (floor((t+1)/ratio))", n_t, obs.visible_rows),
            (
                "q_raw length (heads*head_dim)",
                obs.heads * obs.head_dim,
                obs.q_raw.len(),
            ),
            (
                "weights_raw length (heads)",
                obs.heads,
                obs.weights_raw.len(),
            ),
            (
                "keys_raw length (visible_rows*head_dim)",
                obs.visible_rows * obs.head_dim,
                obs.keys_raw.len(),
            ),
            (
                "scores length (visible_rows)",
                obs.visible_rows,
                obs.scores.len(),
            ),
        ];
        let mut ok = true;
        for (field, expected, found) in checks {
            if expected != found {
                self.error(l, t, field, expected.to_string(), found.to_string());
                ok = false;
            }
        }
        if let Some(&w) = obs.selected.iter().find(|&&w| w >= obs.visible_rows as i32) {
            self.error(
                l,
                t,
                "selected",
                format!("rows < {} or -1", obs.visible_rows),
                w.to_string(),
            );
        }
        ok
    }
}

/// Scores every visible key row under `profile`, streaming through a per-thread scratch row.
pub fn rescore(profile: IndexProfile, obs: &IndexerObservation<'_>) -> Vec<f32> {
    let dim = obs.head_dim;
    let q = prepare_query(profile, obs.q_raw, obs.weights_raw, obs.heads, dim);
    obs.keys_raw
        .par_chunks(dim.max(1))
        .with_min_len(256)
        .map_init(
            || vec![0.0f32; dim],
            |buf, row| {
                let s = prepare_key_row(profile, row, buf);
                score(profile, &q, buf, s)
            },
        )
        .collect()
}

impl Observer for NeedleObserver {
    fn wants_position(&self, pos: usize) -> bool {
        self.prompt_positions.contains(&pos)
            || (self.cfg.probe_decode && pos >= self.cfg.prompt_len)
    }

    fn indexer(&mut self, obs: &IndexerObservation<'_>) {
        if !self.wants_position(obs.query_pos) || !self.check_indexer(obs) {
            return;
        }
        let rows = self.needle_rows(obs);
        let driving = self.cfg.driving;
        if !self.check_finite(obs, driving, obs.scores) {
            return;
        }
        let Some((ranks, scores, stage)) =
            self.stage_ranks(obs, driving, obs.scores.to_vec(), &rows)
        else {
            return;
        };
        self.push_records(obs, driving, &ranks, &scores, &stage);
        let engine_set = self.served_set(obs);
        if let Some(set) = &engine_set {
            self.push_engine_record(obs, driving, &scores, &rows, set);
        }

        // The engine's selection against the driving rank, needle by needle.
        let engine_k = obs.selected.len();
        for (needle_rows, rank) in rows.iter().zip(&ranks) {
            let engine_has = obs.selected.iter().any(|&w| {
                w >= 0 && needle_rows.contains(&(w as usize)) && (w as usize) < obs.visible_rows
            });
            self.selection_checks += 1;
            if engine_has != rank.selected(engine_k) && !rank.ties_straddle(engine_k) {
                self.disagreements.push(SelectionDisagreement {
                    layer: obs.layer,
                    query_pos: obs.query_pos,
                    topk: engine_k,
                    needle_rank: rank.needle_rank,
                    rank_ties: rank.rank_ties,
                    engine_selected_needle: engine_has,
                });
            }
        }

        let mut done = vec![driving];
        for profile in self.cfg.compare.clone() {
            if done.contains(&profile) {
                continue;
            }
            done.push(profile);
            if let Err(e) = profile.check_dim(obs.head_dim) {
                self.error(
                    obs.layer,
                    obs.query_pos,
                    "head_dim",
                    format!("a dim usable by {profile}"),
                    e.to_string(),
                );
                continue;
            }
            let scores = rescore(profile, obs);
            if !self.check_finite(obs, profile, &scores) {
                continue;
            }
            let Some((ranks, scores, stage)) = self.stage_ranks(obs, profile, scores, &rows) else {
                continue;
            };
            self.push_records(obs, profile, &ranks, &scores, &stage);
            if let Some(set) = &engine_set {
                self.push_engine_record(obs, profile, &scores, &rows, set);
            }
        }
    }

    fn attention(&mut self, obs: &AttentionObservation<'_>) {
        if !self.wants_position(obs.query_pos) {
            return;
        }
        let (l, t) = (obs.layer, obs.query_pos);
        let per_head = obs.window_positions.len() + obs.compressed_rows.len();
        if obs.probs.len() != obs.heads * per_head {
            let expected = format!("heads*(window+compressed) = {}", obs.heads * per_head);
            self.error(l, t, "probs length", expected, obs.probs.len().to_string());
            return;
        }
        if obs.sink_probs.len() != obs.heads {
            self.error(
                l,
                t,
                "sink_probs length (heads)",
                obs.heads.to_string(),
                obs.sink_probs.len().to_string(),
            );
            return;
        }
        // Attention on any needle (the union of the spans).
        let needles = self.cfg.needles.clone();
        let in_needle = |p: usize| needles.iter().any(|&(a, b)| p >= a && p < b);
        // V4's ratios (4 overlapping, 128) and V4.1's (2, 1), from the layer's kind.
        let kind = obs.kind.rows().filter(|m| m.ratio == obs.ratio);
        if kind.is_none() && !obs.compressed_rows.is_empty() {
            self.error(
                l,
                t,
                "ratio",
                format!("the {} layer's ratio with compressed rows", obs.kind.name()),
                obs.ratio.to_string(),
            );
            return;
        }
        let mask: Vec<bool> =
            obs.window_positions
                .iter()
                .map(|&p| in_needle(p))
                .chain(obs.compressed_rows.iter().map(|&w| {
                    kind.is_some_and(|k| needles.iter().any(|&span| k.row_touches(w, span)))
                }))
                .collect();
        let masses: Vec<f32> = obs
            .probs
            .chunks(per_head.max(1))
            .take(obs.heads)
            .map(|p| {
                p.iter()
                    .zip(&mask)
                    .filter(|(_, &m)| m)
                    .fold(0.0f32, |a, (x, _)| a + *x)
            })
            .collect();
        let heads = obs.heads.max(1) as f32;
        let record = AttentionRecord {
            cell_id: self
                .cfg
                .cells
                .first()
                .map(|c| c.cell_id.clone())
                .unwrap_or_default(),
            layer: l,
            layer_type: obs.kind.name().to_string(),
            query_pos: t,
            phase: self.phase(t),
            // Sums from +0.0: an empty sum (an SWA layer has no compressed row) prints 0.0.
            needle_mass_mean: masses.iter().fold(0.0f32, |a, &m| a + m) / heads,
            // NaN-propagating: `f32::max` drops a NaN head and would show the others' max as
            // the max head (broken numerics are reported, not hidden).
            needle_mass_max_head: masses.iter().copied().fold(0.0f32, |a, m| {
                if a.is_nan() || m.is_nan() {
                    f32::NAN
                } else {
                    a.max(m)
                }
            }),
            needle_in_window: obs.window_positions.iter().any(|&p| in_needle(p)),
            sink_mass_mean: obs.sink_probs.iter().fold(0.0f32, |a, &m| a + m) / heads,
        };
        self.attention_records.push(record);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LayerKind;

    /// A head whose probabilities are NaN makes both the mean and the max head NaN: the max is
    /// not the other heads' max.
    #[test]
    fn a_nan_head_is_not_hidden_from_the_max_head() {
        let mut o = NeedleObserver::new(NeedleObserverConfig {
            needles: vec![(10, 14)],
            answer: (11, 14),
            prompt_len: 64,
            prompt_positions: vec![63],
            probe_decode: true,
            driving: IndexProfile::SglangFp8,
            compare: vec![],
            cells: vec![CellTopk {
                cell_id: "c".into(),
                topk: 4,
            }],
            engine: None,
        });
        for nan_head in [0, 1] {
            let mut probs = [0.3f32, 0.1, 0.3, 0.1];
            probs[2 * nan_head] = f32::NAN;
            o.attention(&AttentionObservation {
                layer: 0,
                kind: LayerKind::Swa,
                query_pos: 63,
                heads: 2,
                window_positions: &[12, 20],
                compressed_rows: &[],
                ratio: 0,
                probs: &probs,
                sink_probs: &[0.1, 0.1],
            });
            let r = o.attention_records.last().unwrap();
            assert!(r.needle_mass_mean.is_nan(), "head {nan_head}");
            assert!(
                r.needle_mass_max_head.is_nan(),
                "head {nan_head}: {}",
                r.needle_mass_max_head
            );
        }
    }
}
