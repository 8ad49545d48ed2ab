//! The serving engine's selections against the reference's: the engine's set at one (position,
//! layer), a profile's top-K on needlescope's hidden states, their overlap, and the engine-only
//! records (no local model: membership alone).
//!
//! Sets, not lists: the engine's row order carries no meaning (SGLang's radix top-k writes its
//! rows in any order) and its padding (-1) is dropped. A profile's top-K breaks ties to the
//! lower row, as the reference engine's top-k does; overlap is |E ∩ R| / |E|, in [0, 1], and
//! absent for an empty E.

use super::capture::EngineCapture;
use super::rows::RowKind;
use crate::numerics::profiles::IndexProfile;
use crate::record::engine::EngineLayerRecord;
use crate::record::phase_label;

/// The profiles scored besides the driving ones when an engine is held against a run: every
/// profile, so that the closest can be found (`compare` first, in its order, then the rest of
/// `IndexProfile::ALL`; the driving `indexes` are scored anyway).
pub fn scored_with_engine(indexes: &[IndexProfile], compare: &[IndexProfile]) -> Vec<IndexProfile> {
    let mut all: Vec<IndexProfile> = compare.to_vec();
    for p in IndexProfile::ALL {
        if !all.contains(&p) && !indexes.contains(&p) {
            all.push(p);
        }
    }
    all
}

/// The profile order of ties and tables (`IndexProfile::ALL`).
pub fn profile_order() -> Vec<&'static str> {
    IndexProfile::ALL.iter().map(|p| p.name()).collect()
}

/// The engine's rows at one (position, layer), padding dropped, ascending.
pub fn engine_set(row: &[i32]) -> Vec<usize> {
    let mut set: Vec<usize> = row
        .iter()
        .filter(|&&v| v >= 0)
        .map(|&v| v as usize)
        .collect();
    set.sort_unstable();
    set.dedup();
    set
}

/// The `k` best rows of `scores` (descending score, ties to the lower row), ascending by row.
pub fn top_rows(scores: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    let better = |a: &usize, b: &usize| scores[*b].total_cmp(&scores[*a]).then_with(|| a.cmp(b));
    if k < idx.len() {
        idx.select_nth_unstable_by(k, better);
        idx.truncate(k);
    }
    idx.sort_unstable();
    idx
}

/// |E ∩ R| / |E| of two ascending row sets; `None` when E is empty.
pub fn overlap(engine: &[usize], reference: &[usize]) -> Option<f32> {
    if engine.is_empty() {
        return None;
    }
    let (mut i, mut j, mut both) = (0, 0, 0usize);
    while i < engine.len() && j < reference.len() {
        match engine[i].cmp(&reference[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                both += 1;
                i += 1;
                j += 1;
            }
        }
    }
    Some(both as f32 / engine.len() as f32)
}

/// The engine's answer verdict under `scenario`: `None` when answers are not judged or the
/// answer did not end (neither a stop finish nor EOS last).
pub fn engine_answer_correct(
    capture: &EngineCapture,
    scenario: &super::Scenario,
    answer_values: &[String],
    eos: u32,
    judge_answers: bool,
) -> Option<bool> {
    if !judge_answers {
        return None;
    }
    let ended = capture.ended() || capture.output_ids.last() == Some(&eos);
    scenario.judge_generated(&capture.text, answer_values, ended)
}

/// Engine-only records: at each of `positions` and every captured layer, whether the engine's
/// set holds a row of each needle (profile empty, no overlap).
pub fn membership_records(
    capture: &EngineCapture,
    cell_id: &str,
    needles: &[(usize, usize)],
    positions: &[usize],
) -> Vec<EngineLayerRecord> {
    let mut out = Vec::new();
    for &pos in positions {
        for &layer in &capture.csa_layers {
            let Some(row) = capture.selection(pos, layer) else {
                continue;
            };
            let set = engine_set(row);
            let visible = RowKind::Csa.visible_rows(pos);
            for (needle, &span) in needles.iter().enumerate() {
                let rows = RowKind::Csa.span_rows(span);
                out.push(EngineLayerRecord {
                    cell_id: cell_id.to_string(),
                    layer,
                    query_pos: pos,
                    phase: phase_label(pos, capture.prompt_tokens),
                    needle,
                    engine_topk: capture.topk,
                    visible_rows: visible,
                    selected_rows: set.len(),
                    needle_selected: set.iter().any(|w| rows.contains(w) && *w < visible),
                    profile: String::new(),
                    overlap: None,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_rows_break_ties_to_the_lower_row_and_overlap_counts_the_engine_set() {
        let scores = [0.5, 0.9, 0.5, 0.1, 0.9, 0.5];
        assert_eq!(top_rows(&scores, 2), vec![1, 4]);
        assert_eq!(top_rows(&scores, 3), vec![0, 1, 4]);
        assert_eq!(top_rows(&scores, 10), vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(engine_set(&[4, -1, 1, -1]), vec![1, 4]);
        assert_eq!(overlap(&[1, 4], &[0, 1, 4]), Some(1.0));
        assert_eq!(overlap(&[0, 2, 3, 5], &[0, 1, 4, 5]), Some(0.5));
        assert_eq!(overlap(&[], &[0]), None);
    }
}
