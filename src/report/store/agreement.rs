//! Relations across cells.csv and layers.csv that the writer guarantees, checked when a report
//! directory is read ([`super::RunRecords::read`]), so a hand edit (or damage) on either side
//! is an error naming the file, the cell and the field, never a table, summary or plot that
//! shows a rank or a verdict the records contradict:
//! - each layers.csv row against its cell's top-k: `selected` exactly when the needle rank is
//!   at most k and its score is a number, `trivial` exactly when `visible_rows <= k`;
//! - each cells.csv row against its driving rows at the answer position (the last prompt
//!   token): `min_needle_rank` is their worst rank, `csa_layers_nontrivial` counts the
//!   non-trivial ones and `csa_layers_selected` those of them that selected the needle;
//!   `exact_keeps` counts the lost layers its `exact` rows select (empty without them).
//!
//! Relations within one row are `row_checks`'s, every row being there is `completeness`'s.

use std::collections::HashMap;

use super::{CELLS_CSV, LAYERS_CSV};
use crate::record::{CellRecord, LayerRecord};

/// A field that disagrees with the other file.
#[derive(Clone, Debug, PartialEq)]
pub struct Disagreement {
    /// The file holding the field found wrong (cells.csv or layers.csv).
    pub file: &'static str,
    /// The row, e.g. `cell L512-d50-fp8-k64-s0` or `cell ..., layer 2, query position 511 (fp8)`.
    pub place: String,
    pub field: &'static str,
    pub expected: String,
    pub found: String,
}

/// The first disagreement between `cells` and their `layers` (rows of other cells are
/// ignored), layers.csv rows first, in file order.
pub fn first_disagreement(cells: &[CellRecord], layers: &[LayerRecord]) -> Option<Disagreement> {
    let by_id: HashMap<&str, &CellRecord> = cells.iter().map(|c| (c.cell_id.as_str(), c)).collect();
    for r in layers {
        let Some(cell) = by_id.get(r.cell_id.as_str()) else {
            continue;
        };
        let k = cell.topk;
        let place = || {
            format!(
                "cell {}, layer {}, query position {} ({})",
                r.cell_id, r.layer, r.query_pos, r.profile
            )
        };
        let selected = r.needle_rank.is_some_and(|rank| rank <= k)
            && r.needle_score.is_some_and(|s| !s.is_nan());
        if r.selected != selected {
            return Some(Disagreement {
                file: LAYERS_CSV,
                place: place(),
                field: "selected",
                expected: format!(
                    "{selected} at the cell's top-{k} (needle_rank {})",
                    r.needle_rank.map_or("(empty)".into(), |v| v.to_string())
                ),
                found: r.selected.to_string(),
            });
        }
        let trivial = r.visible_rows <= k;
        if r.trivial != trivial {
            return Some(Disagreement {
                file: LAYERS_CSV,
                place: place(),
                field: "trivial",
                expected: format!(
                    "{trivial} at the cell's top-{k} (visible_rows {})",
                    r.visible_rows
                ),
                found: r.trivial.to_string(),
            });
        }
    }
    // Each cell's driving rows, gathered in one pass (a report may hold millions of rows).
    let mut driving: HashMap<&str, Vec<&LayerRecord>> = HashMap::new();
    // And every row at the cell's answer position, for `exact_keeps`.
    let mut answer_rows: HashMap<&str, Vec<&LayerRecord>> = HashMap::new();
    for r in layers {
        let Some(cell) = by_id.get(r.cell_id.as_str()) else {
            continue;
        };
        if r.query_pos == cell.answer_position() {
            answer_rows.entry(r.cell_id.as_str()).or_default().push(r);
        }
        if r.driving {
            driving.entry(r.cell_id.as_str()).or_default().push(r);
        }
    }
    for cell in cells {
        let answer = cell.answer_position();
        let rows: Vec<&LayerRecord> = driving
            .get(cell.cell_id.as_str())
            .into_iter()
            .flatten()
            .copied()
            .filter(|r| r.query_pos == answer)
            .collect();
        let worst = rows.iter().filter_map(|r| r.needle_rank).max();
        // Per layer over the needles: selected only when every needle is.
        let (selected, nontrivial) = crate::record::layers_selected(rows.iter().copied());
        let show = |v: Option<usize>| v.map_or("(empty)".to_string(), |v| v.to_string());
        let keeps = crate::record::verdict::exact_keeps(
            answer_rows
                .get(cell.cell_id.as_str())
                .into_iter()
                .flatten()
                .copied(),
            answer,
        );
        let checks = [
            (
                "min_needle_rank",
                show(worst),
                show(cell.min_needle_rank),
                "the worst needle_rank of its driving layers.csv rows at the answer position",
            ),
            (
                "csa_layers_nontrivial",
                nontrivial.to_string(),
                cell.csa_layers_nontrivial.to_string(),
                "the CSA layers of its non-trivial driving layers.csv rows at the answer position",
            ),
            (
                "csa_layers_selected",
                selected.to_string(),
                cell.csa_layers_selected.to_string(),
                "those of them that selected the needle (every needle, when there are several)",
            ),
            (
                "exact_keeps",
                show(keeps),
                show(cell.exact_keeps),
                "the lost layers its exact layers.csv rows select at the answer position; \
                 empty when exact was not scored",
            ),
        ];
        for (field, expected, found, what) in checks {
            if expected != found {
                return Some(Disagreement {
                    file: CELLS_CSV,
                    place: format!("cell {}", cell.cell_id),
                    field,
                    expected: format!("{expected} ({what})"),
                    found,
                });
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::rank::{NeedleRank, RecordMeta};
    use crate::record::LayerRecord;

    /// A cell of top-k 4 over a 100-token prompt with two driving rows at the answer position
    /// (ranks 3 and 9 of 20 visible rows) and one comparison row (rank 2).
    fn records() -> (Vec<CellRecord>, Vec<LayerRecord>) {
        let cell: CellRecord = serde_json::from_value(serde_json::json!({
            "cell_id": "c", "target_tokens": 100, "prompt_tokens": 100, "depth_pct": 50.0,
            "needle_start": 40, "needle_end": 50, "answer_start": 90, "answer_end": 91,
            "index": "fp8", "kv": "exact", "topk": 4, "answer_text": "", "answer_correct": null,
            "min_needle_rank": 9, "csa_layers_selected": 1, "csa_layers_nontrivial": 2,
            "wall_seconds": 1.0, "exact_keeps": 0
        }))
        .unwrap();
        let row = |layer, profile, driving, rank| {
            let meta = RecordMeta {
                cell_id: "c",
                layer,
                query_pos: 99,
                phase: "prompt",
                profile,
                driving,
                needle: 0,
            };
            let r = NeedleRank {
                visible_rows: 20,
                needle_rows: 1,
                best_row: Some(0),
                needle_rank: Some(rank),
                rank_ties: 0,
                needle_ties: 0,
                needle_score: Some(1.0),
            };
            LayerRecord::new(&meta, &r, Some(0.5), 4)
        };
        let layers = vec![
            row(1, "fp8", true, 3),
            row(3, "fp8", true, 9),
            row(1, "exact", false, 2),
        ];
        (vec![cell], layers)
    }

    #[test]
    fn the_records_the_probe_writes_agree() {
        let (cells, layers) = records();
        assert_eq!(first_disagreement(&cells, &layers), None);
    }

    #[test]
    fn an_edit_on_either_side_names_the_file_and_field() {
        let (cells, layers) = records();
        let found = |cells: &[CellRecord], layers: &[LayerRecord]| {
            let d = first_disagreement(cells, layers).expect("a disagreement");
            (d.file, d.field)
        };
        let mut c = cells.clone();
        c[0].min_needle_rank = Some(3);
        assert_eq!(found(&c, &layers), (CELLS_CSV, "min_needle_rank"));
        let mut c = cells.clone();
        c[0].csa_layers_selected = 2;
        assert_eq!(found(&c, &layers), (CELLS_CSV, "csa_layers_selected"));
        let mut c = cells.clone();
        c[0].csa_layers_nontrivial = 1;
        assert_eq!(found(&c, &layers), (CELLS_CSV, "csa_layers_nontrivial"));
        // exact_keeps: layer 3 is lost and exact has no row there, so it keeps none; without
        // exact rows at all the column is empty.
        let mut c = cells.clone();
        c[0].exact_keeps = Some(1);
        assert_eq!(found(&c, &layers), (CELLS_CSV, "exact_keeps"));
        assert_eq!(found(&cells, &layers[..2]), (CELLS_CSV, "exact_keeps"));
        let mut c = cells.clone();
        c[0].exact_keeps = None;
        assert_eq!(first_disagreement(&c, &layers[..2]), None);
        // A rank past the cell's top-k marked selected, and the reverse.
        let mut l = layers.clone();
        l[1].selected = true;
        assert_eq!(found(&cells, &l), (LAYERS_CSV, "selected"));
        let mut l = layers.clone();
        l[2].selected = false;
        assert_eq!(found(&cells, &l), (LAYERS_CSV, "selected"));
        let mut l = layers.clone();
        l[0].trivial = true;
        assert_eq!(found(&cells, &l), (LAYERS_CSV, "trivial"));
        // A driving rank edited (consistent with its row) moves the cell's worst rank.
        let mut l = layers.clone();
        l[1].needle_rank = Some(12);
        assert_eq!(found(&cells, &l), (CELLS_CSV, "min_needle_rank"));
        // Rows of a cell cells.csv does not list are not this check's business.
        let mut l = layers.clone();
        l[0].cell_id = "other".into();
        l[0].selected = !l[0].selected;
        let mut c = cells.clone();
        c[0].min_needle_rank = Some(9);
        c[0].csa_layers_nontrivial = 1;
        c[0].csa_layers_selected = 0;
        assert_eq!(first_disagreement(&c, &l), None);
    }

    /// `trivial` is `visible_rows <= k`: a layer with exactly k visible rows is trivial (every
    /// visible row is selected), one with k + 1 is not.
    #[test]
    fn a_layer_with_exactly_k_visible_rows_is_trivial() {
        let (cells, layers) = records();
        let mut l = layers.clone();
        l[2].visible_rows = 4; // the cell's top-k
        l[2].trivial = true;
        assert_eq!(first_disagreement(&cells, &l), None);
        l[2].trivial = false;
        let d = first_disagreement(&cells, &l).expect("a disagreement");
        assert_eq!((d.file, d.field), (LAYERS_CSV, "trivial"));
        l[2].visible_rows = 5;
        assert_eq!(first_disagreement(&cells, &l), None);
    }
}
