//! What one row of cells.csv, layers.csv or attention.csv must satisfy on its own, checked as
//! each row is read ([`super::csvio::read_tolerant`]), so a row edited or damaged by hand is an
//! error naming the file, the line and the fields, never a table or plot that quietly shows a
//! rank the probe cannot have produced.
//!
//! Only relations the writer guarantees are checked (docs/architecture.md section 4 and docs/outputs.md): a needle rank lies
//! among the visible rows, with its ties; the rank, score and margin are all present or all
//! absent with the needle rows; the margin is the needle score minus the k-th score, bit for bit
//! (both are written in shortest round-trip form, NaN included); a selected needle has a rank
//! and a score that is a number; a cell's selected layers are among its non-trivial ones;
//! attention masses are shares in [0, 1] (NaN allowed: broken numerics are reported, not
//! hidden). Relations across rows (every layer of a finished cell present) are
//! [`super::completeness`]'s.

use std::path::Path;

use crate::record::{AttentionRecord, CellRecord, LayerRecord};
use crate::report::error::{ReportError, Result};

/// A row that contradicts itself: the field found wrong, what it should be, and its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Inconsistency {
    pub field: &'static str,
    pub expected: String,
    pub found: String,
}

pub trait RowCheck {
    fn inconsistency(&self) -> Option<Inconsistency> {
        None
    }

    /// The header an older version wrote, whose rows are still read (the columns it lacks
    /// are derived by [`Self::complete_older`]); `None`: only today's header.
    fn older_columns() -> Option<&'static [&'static str]> {
        None
    }

    /// Fills, in a row read under [`Self::older_columns`], the fields it derives from the
    /// rest of the row.
    fn complete_older(&mut self) {}
}

fn wrong(field: &'static str, expected: String, found: impl ToString) -> Option<Inconsistency> {
    Some(Inconsistency {
        field,
        expected,
        found: found.to_string(),
    })
}

/// cells.csv rows are checked with the run's plan by [`super::validate::CellCheck`]. A
/// cells.csv written before `recalled`, `exact_keeps` and `sample` is read with the first and
/// last derived from the row; `exact_keeps` needs the cell's layers.csv rows, and is set by
/// the readers ([`super::RunRecords::read`], a resume) that have them.
impl RowCheck for CellRecord {
    fn older_columns() -> Option<&'static [&'static str]> {
        Some(crate::record::CELLS_COLUMNS_BEFORE_DERIVED)
    }

    fn complete_older(&mut self) {
        self.recalled = self.verdict();
        self.sample = CellRecord::sample_of_id(&self.cell_id);
    }
}

/// A layers.csv written before DeepSeek-V4.1's stage columns is read with them empty.
impl RowCheck for LayerRecord {
    fn older_columns() -> Option<&'static [&'static str]> {
        Some(crate::record::LAYERS_COLUMNS_BEFORE_STAGE)
    }

    fn inconsistency(&self) -> Option<Inconsistency> {
        let r = self;
        if r.needle_rows > r.visible_rows {
            let expected = format!("at most visible_rows ({})", r.visible_rows);
            return wrong("needle_rows", expected, r.needle_rows);
        }
        let needle_visible = r.needle_rows > 0;
        for (field, present, value) in [
            ("needle_rank", r.needle_rank.is_some(), shown(r.needle_rank)),
            (
                "needle_score",
                r.needle_score.is_some(),
                shown(r.needle_score),
            ),
        ] {
            if present != needle_visible {
                let expected = format!(
                    "{} with needle_rows {} (present exactly when a needle row is visible)",
                    if needle_visible { "a value" } else { "empty" },
                    r.needle_rows
                );
                return wrong(field, expected, value);
            }
        }
        if let Some(rank) = r.needle_rank {
            if rank == 0 || rank + r.rank_ties > r.visible_rows {
                let expected = format!(
                    "a rank from 1 that with its rank_ties ({}) fits in visible_rows ({})",
                    r.rank_ties, r.visible_rows
                );
                return wrong("needle_rank", expected, rank);
            }
        }
        let margin = r.needle_score.zip(r.kth_score).map(|(s, k)| s - k);
        let same_margin = match (margin, r.margin) {
            (Some(a), Some(b)) => a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
            (a, b) => a.is_none() && b.is_none(),
        };
        if !same_margin {
            let expected = format!(
                "needle_score ({}) - kth_score ({}) = {}",
                shown(r.needle_score),
                shown(r.kth_score),
                shown(margin)
            );
            return wrong("margin", expected, shown(r.margin));
        }
        if r.selected && r.needle_score.is_none_or(|s| s.is_nan()) {
            let expected = format!(
                "false with needle_score {} (a selected needle has a score that is a number)",
                shown(r.needle_score)
            );
            return wrong("selected", expected, true);
        }
        None
    }
}

impl RowCheck for AttentionRecord {
    fn inconsistency(&self) -> Option<Inconsistency> {
        let a = self;
        // V4's three kinds and DeepSeek-V4.1's ratio-2 and ratio-1 layers.
        if !["swa", "csa", "hca", "csa2", "csa1"].contains(&a.layer_type.as_str()) {
            return wrong(
                "layer_type",
                "swa, csa or hca (csa2 or csa1 on DeepSeek-V4.1)".into(),
                &a.layer_type,
            );
        }
        for (field, mass) in [
            ("needle_mass_mean", a.needle_mass_mean),
            ("needle_mass_max_head", a.needle_mass_max_head),
            ("sink_mass_mean", a.sink_mass_mean),
        ] {
            // A share of softmax mass; sums may round a little past 1.
            if !mass.is_nan() && !(0.0..=1.0 + 1e-4).contains(&mass) {
                return wrong(field, "a share between 0 and 1".into(), mass);
            }
        }
        if a.needle_mass_mean > a.needle_mass_max_head * (1.0 + 1e-5) + 1e-7 {
            let expected = format!(
                "at most needle_mass_max_head ({}): a mean over heads cannot pass their maximum",
                a.needle_mass_max_head
            );
            return wrong("needle_mass_mean", expected, a.needle_mass_mean);
        }
        None
    }
}

impl RowCheck for crate::record::engine::EngineLayerRecord {
    fn inconsistency(&self) -> Option<Inconsistency> {
        let r = self;
        let visible = (r.query_pos + 1) / 4;
        if r.visible_rows != visible {
            return wrong(
                "visible_rows",
                format!("floor((query_pos+1)/4) = {visible}"),
                r.visible_rows,
            );
        }
        let most = r.engine_topk.min(r.visible_rows);
        if r.selected_rows > most {
            return wrong(
                "selected_rows",
                format!("at most min(engine_topk, visible_rows) = {most}"),
                r.selected_rows,
            );
        }
        if let Some(o) = r.overlap {
            if !(0.0..=1.0).contains(&o) {
                return wrong("overlap", "a share between 0 and 1".into(), o);
            }
        }
        // An overlap exactly when a profile is named and the engine selected a row (|E| > 0).
        let expected_overlap = !r.profile.is_empty() && r.selected_rows > 0;
        if expected_overlap != r.overlap.is_some() {
            return wrong(
                "overlap",
                if expected_overlap {
                    "a share (a profile is named and the engine selected rows)".into()
                } else {
                    "nothing (no profile, or no row selected by the engine)".into()
                },
                r.overlap.map_or("nothing".to_string(), |o| o.to_string()),
            );
        }
        None
    }
}

/// Refuses rows that a reader would refuse as inconsistent ([`RowCheck`]), naming the file,
/// the cell, the layer and the field.
pub(crate) fn refuse_inconsistent<T: RowCheck + RowPlace>(path: &Path, rows: &[T]) -> Result<()> {
    match rows
        .iter()
        .find_map(|r| r.inconsistency().map(|bad| (r, bad)))
    {
        None => Ok(()),
        Some((row, bad)) => Err(ReportError::Mismatch {
            path: path.to_path_buf(),
            what: format!("{} of the row of {}", bad.field, row.place()),
            expected: bad.expected,
            found: bad.found,
        }),
    }
}

/// Where a row belongs, for errors: cell, layer and query position.
pub(crate) trait RowPlace {
    fn place(&self) -> String;
}

impl RowPlace for LayerRecord {
    fn place(&self) -> String {
        let r = self;
        let needle = match r.needle {
            0 => String::new(),
            n => format!(", needle {n}"),
        };
        format!(
            "cell {} at layer {}, query position {}{needle} ({})",
            r.cell_id, r.layer, r.query_pos, r.profile
        )
    }
}

impl RowPlace for crate::record::engine::EngineLayerRecord {
    fn place(&self) -> String {
        let r = self;
        format!(
            "cell {} at layer {}, query position {}, needle {} ({})",
            r.cell_id,
            r.layer,
            r.query_pos,
            r.needle,
            if r.profile.is_empty() {
                "engine only"
            } else {
                &r.profile
            }
        )
    }
}

impl RowPlace for AttentionRecord {
    fn place(&self) -> String {
        let r = self;
        format!(
            "cell {} at layer {}, query position {}",
            r.cell_id, r.layer, r.query_pos
        )
    }
}

fn shown<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "(empty)".to_string(), |v| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::rank::{kth_scores, rank_needle, RecordMeta};

    fn meta() -> RecordMeta<'static> {
        RecordMeta {
            cell_id: "c",
            layer: 2,
            query_pos: 99,
            phase: "prompt",
            profile: "fp8",
            driving: true,
            needle: 0,
        }
    }

    /// Records as the probe makes them, over scores with ties, NaN and -inf, a needle that is
    /// not yet visible and top-k past the visible rows.
    fn probe_records() -> Vec<LayerRecord> {
        let score_sets: [&[f32]; 5] = [
            &[0.5, 2.0, 2.0, -1.0, 0.25, 2.0],
            &[f32::NAN, 1.0, f32::NAN, 3.0],
            &[f32::NEG_INFINITY, 0.0, -0.0, 7.5],
            &[1.0, 1.0, 1.0],
            &[],
        ];
        let mut out = Vec::new();
        for scores in score_sets {
            for needle in [0..2, 1..3, 2..4, 5..9] {
                let rank = rank_needle(scores, needle);
                for k in [1, 2, 3, 8] {
                    let kth = kth_scores(scores, &[k])[0];
                    out.push(LayerRecord::new(&meta(), &rank, kth, k));
                }
            }
        }
        out
    }

    #[test]
    fn every_record_the_probe_makes_is_consistent() {
        for r in probe_records() {
            assert_eq!(r.inconsistency(), None, "{r:?}");
        }
    }

    #[test]
    fn each_broken_relation_names_its_field() {
        let good = probe_records()
            .into_iter()
            .find(|r| r.needle_rank == Some(1) && r.kth_score.is_some() && r.selected)
            .unwrap();
        type Edit = fn(&mut LayerRecord);
        let cases: [(&str, Edit); 9] = [
            ("needle_rows", |r| r.needle_rows = r.visible_rows + 1),
            ("needle_rank", |r| r.needle_rank = None),
            ("needle_score", |r| r.needle_score = None),
            ("needle_rank", |r| r.needle_rank = Some(0)),
            ("needle_rank", |r| r.needle_rank = Some(r.visible_rows + 1)),
            ("needle_rank", |r| r.rank_ties = r.visible_rows),
            ("margin", |r| r.margin = r.margin.map(|m| m + 1.0)),
            ("margin", |r| r.margin = None),
            ("selected", |r| r.needle_score = Some(f32::NAN)),
        ];
        for (field, edit) in cases {
            let mut bad = good.clone();
            edit(&mut bad);
            let found = bad.inconsistency().map(|i| i.field);
            // A NaN score also changes the margin it implies; the margin is checked first.
            let allowed: &[&str] = if field == "selected" {
                &["margin", "selected"]
            } else {
                &[field]
            };
            assert!(
                found.is_some_and(|f| allowed.contains(&f)),
                "{field}: {found:?}"
            );
        }
        let mut nan_selected = good.clone();
        nan_selected.needle_score = Some(f32::NAN);
        nan_selected.margin = Some(f32::NAN);
        assert_eq!(nan_selected.inconsistency().unwrap().field, "selected");
    }

    #[test]
    fn attention_shares_lie_in_zero_one() {
        let good = AttentionRecord {
            cell_id: "c".into(),
            layer: 2,
            layer_type: "csa".into(),
            query_pos: 9,
            phase: "prompt".into(),
            needle_mass_mean: 0.25,
            needle_mass_max_head: 0.25,
            needle_in_window: false,
            sink_mass_mean: 1.0,
        };
        assert_eq!(good.inconsistency(), None);
        let mut broken_numerics = good.clone();
        broken_numerics.needle_mass_mean = f32::NAN;
        assert_eq!(broken_numerics.inconsistency(), None);
        type Edit = fn(&mut AttentionRecord);
        let cases: [(&str, Edit); 4] = [
            ("layer_type", |a| a.layer_type = "mla".into()),
            ("needle_mass_max_head", |a| a.needle_mass_max_head = 1.5),
            ("sink_mass_mean", |a| a.sink_mass_mean = -0.1),
            ("needle_mass_mean", |a| a.needle_mass_mean = 0.3),
        ];
        for (field, edit) in cases {
            let mut bad = good.clone();
            edit(&mut bad);
            assert_eq!(bad.inconsistency().map(|i| i.field), Some(field));
        }
    }
}
