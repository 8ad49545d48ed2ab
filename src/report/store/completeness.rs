//! Whether every finished cell's layers.csv and attention.csv rows are all there.
//!
//! A cells.csv row commits a cell only after its other rows are synced (`store`), so a kill
//! never leaves a finished cell with missing rows; a file edited, truncated or deleted by hand
//! does. The probe writes a full grid per cell, which is what is checked:
//! - layers.csv: one row per (CSA layer, probed query position, needle, profile), the layers being
//!   every CSA layer that appears in the run's rows (all cells share the model), the positions,
//!   needles and profiles the cell's own;
//! - attention.csv: one row per (layer, query position), over every layer that appears in the
//!   run's attention rows (the probe records every layer at every probed position; a cell
//!   without attention rows lost them, e.g. to a deleted attention.csv);
//! - rows of cells that cells.csv does not list (orphans): at most one such cell, the one a
//!   stopped run had in flight; several mean cells.csv lost rows.
//!
//! `report` refuses a directory that fails these checks (naming the file, the cell and the
//! first missing or doubled row); a resumed run gives the damaged cells back to the run
//! instead, with a note, so they are computed again.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use super::{ATTENTION_CSV, LAYERS_CSV};
use crate::record::{AttentionRecord, CellRecord, LayerRecord};

/// A finished cell whose rows in one file are not its full grid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IncompleteCell {
    pub cell_id: String,
    /// `layers.csv` or `attention.csv`.
    pub file: &'static str,
    /// What is wrong, e.g. `3 of its 4 rows; missing layer 2 at query position 1023 (bf16)`.
    pub why: String,
}

/// One grid key: (layer, query position, needle, profile; needle 0 and "" for attention rows).
type Key<'a> = (usize, usize, usize, &'a str);

/// The first finished cells (in cells.csv order) whose layers.csv or attention.csv rows are
/// not complete; empty when all are.
pub fn incomplete_cells<'a>(
    cells: &[CellRecord],
    layers: impl IntoIterator<Item = &'a LayerRecord>,
    attention: impl IntoIterator<Item = &'a AttentionRecord>,
) -> Vec<IncompleteCell> {
    let layer_keys = layers.into_iter().map(|r| {
        (
            r.cell_id.as_str(),
            (r.layer, r.query_pos, r.needle, r.profile.as_str()),
        )
    });
    let attention_keys = attention
        .into_iter()
        .map(|r| (r.cell_id.as_str(), (r.layer, r.query_pos, 0, "")));
    let mut out = Vec::new();
    for (file, keys) in [
        (LAYERS_CSV, grids(layer_keys)),
        (ATTENTION_CSV, grids(attention_keys)),
    ] {
        let run_layers: BTreeSet<usize> =
            keys.values().flat_map(|g| g.keys().map(|k| k.0)).collect();
        for cell in cells {
            let why = match keys.get(cell.cell_id.as_str()) {
                None => Some("no rows".to_string()),
                Some(grid) => grid_gap(grid, &run_layers),
            };
            if let Some(why) = why {
                out.push(IncompleteCell {
                    cell_id: cell.cell_id.clone(),
                    file,
                    why,
                });
            }
        }
    }
    out
}

/// Cell -> key -> how many rows carry it.
fn grids<'a>(
    rows: impl Iterator<Item = (&'a str, Key<'a>)>,
) -> BTreeMap<&'a str, BTreeMap<Key<'a>, usize>> {
    let mut by_cell: BTreeMap<&str, BTreeMap<Key, usize>> = BTreeMap::new();
    for (cell, key) in rows {
        *by_cell.entry(cell).or_default().entry(key).or_default() += 1;
    }
    by_cell
}

/// What keeps `grid` from being every layer of `run_layers` at each of its positions and
/// profiles exactly once, or None.
fn grid_gap(grid: &BTreeMap<Key, usize>, run_layers: &BTreeSet<usize>) -> Option<String> {
    let describe = |&(layer, pos, needle, profile): &Key| {
        let profile = if profile.is_empty() {
            String::new()
        } else {
            format!(" ({profile})")
        };
        let needle = if needle > 0 {
            format!(" for needle {needle}")
        } else {
            String::new()
        };
        format!("layer {layer} at query position {pos}{needle}{profile}")
    };
    if let Some((key, n)) = grid.iter().find(|(_, &n)| n > 1) {
        return Some(format!("{n} rows for {}", describe(key)));
    }
    let positions: BTreeSet<usize> = grid.keys().map(|k| k.1).collect();
    let needles: BTreeSet<usize> = grid.keys().map(|k| k.2).collect();
    let profiles: BTreeSet<&str> = grid.keys().map(|k| k.3).collect();
    let expected = run_layers.len() * positions.len() * needles.len() * profiles.len();
    if grid.len() == expected {
        return None;
    }
    let missing = positions
        .iter()
        .flat_map(|&p| profiles.iter().map(move |&f| (p, f)))
        .flat_map(|(p, f)| needles.iter().map(move |&n| (p, n, f)))
        .flat_map(|(p, n, f)| run_layers.iter().map(move |&l| (l, p, n, f)))
        .find(|k| !grid.contains_key(k))?;
    Some(format!(
        "{} of its {expected} rows; missing {}",
        grid.len(),
        describe(&missing)
    ))
}

/// The cell ids of `rows` that are not among `finished`, in first-seen order.
pub fn orphan_cells<'a>(
    rows: impl Iterator<Item = &'a str>,
    finished: &HashSet<String>,
) -> Vec<String> {
    let mut seen = HashSet::new();
    rows.filter(|id| !finished.contains(*id) && seen.insert(*id))
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(cell: &str, layer: usize, pos: usize, profile: &str) -> LayerRecord {
        LayerRecord {
            cell_id: cell.into(),
            layer,
            query_pos: pos,
            phase: "prompt".into(),
            profile: profile.into(),
            driving: profile == "fp8",
            needle: 0,
            visible_rows: 10,
            needle_rows: 2,
            needle_rank: Some(1),
            rank_ties: 1,
            needle_ties: 0,
            needle_score: Some(1.0),
            kth_score: Some(0.5),
            margin: Some(0.5),
            selected: true,
            trivial: false,
            ..Default::default()
        }
    }

    fn attention(cell: &str, layer: usize, pos: usize) -> AttentionRecord {
        AttentionRecord {
            cell_id: cell.into(),
            layer,
            layer_type: "csa".into(),
            query_pos: pos,
            phase: "prompt".into(),
            needle_mass_mean: 0.1,
            needle_mass_max_head: 0.2,
            needle_in_window: false,
            sink_mass_mean: 0.01,
        }
    }

    fn cell(id: &str) -> CellRecord {
        let mut c: CellRecord = serde_json::from_value(serde_json::json!({
            "cell_id": id, "target_tokens": 512, "prompt_tokens": 512, "depth_pct": 50.0,
            "needle_start": 100, "needle_end": 120, "answer_start": 500, "answer_end": 501,
            "index": "fp8", "kv": "exact", "topk": 32, "answer_text": "", "answer_correct": null,
            "min_needle_rank": 1, "csa_layers_selected": 2, "csa_layers_nontrivial": 2,
            "wall_seconds": 1.0
        }))
        .unwrap();
        c.cell_id = id.into();
        c
    }

    /// Two cells, CSA layers 1 and 3, two positions, profiles fp8 and bf16: 8 rows each.
    fn full_grid() -> (Vec<CellRecord>, Vec<LayerRecord>, Vec<AttentionRecord>) {
        let (mut layers, mut att) = (Vec::new(), Vec::new());
        for c in ["a", "b"] {
            for pos in [510, 511] {
                for l in [1, 3] {
                    for p in ["fp8", "bf16"] {
                        layers.push(layer(c, l, pos, p));
                    }
                }
                for l in 0..4 {
                    att.push(attention(c, l, pos));
                }
            }
        }
        (vec![cell("a"), cell("b")], layers, att)
    }

    #[test]
    fn a_full_grid_is_complete() {
        let (cells, layers, att) = full_grid();
        assert_eq!(incomplete_cells(&cells, &layers, &att), vec![]);
        // A cell without attention rows or without layer rows lost them.
        let att_b: Vec<AttentionRecord> =
            att.iter().filter(|r| r.cell_id == "b").cloned().collect();
        assert_eq!(
            incomplete_cells(&cells, &layers, &att_b),
            vec![IncompleteCell {
                cell_id: "a".into(),
                file: ATTENTION_CSV,
                why: "no rows".into()
            }]
        );
        let layers_b: Vec<LayerRecord> = layers
            .iter()
            .filter(|r| r.cell_id == "b")
            .cloned()
            .collect();
        let found = incomplete_cells(&cells, &layers_b, &att);
        assert_eq!(
            found,
            vec![IncompleteCell {
                cell_id: "a".into(),
                file: LAYERS_CSV,
                why: "no rows".into()
            }]
        );
    }

    #[test]
    fn a_missing_or_doubled_row_names_the_cell_and_the_row() {
        let (cells, mut layers, mut att) = full_grid();
        let gone = layers
            .iter()
            .position(|r| {
                r.cell_id == "b" && r.layer == 3 && r.query_pos == 511 && r.profile == "bf16"
            })
            .unwrap();
        layers.remove(gone);
        let found = incomplete_cells(&cells, &layers, &att);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            (found[0].cell_id.as_str(), found[0].file),
            ("b", LAYERS_CSV)
        );
        assert_eq!(
            found[0].why,
            "7 of its 8 rows; missing layer 3 at query position 511 (bf16)"
        );

        // Layer 3 gone from every row of cell a: the run's other cell still has it.
        let (cells, layers, _) = full_grid();
        let no_layer_3: Vec<LayerRecord> = layers
            .into_iter()
            .filter(|r| !(r.cell_id == "a" && r.layer == 3))
            .collect();
        let found = incomplete_cells(&cells, &no_layer_3, &att);
        assert_eq!(
            found[0].why,
            "4 of its 8 rows; missing layer 3 at query position 510 (bf16)"
        );

        let (cells, layers, _) = full_grid();
        att.push(attention("a", 2, 510));
        let found = incomplete_cells(&cells, &layers, &att);
        assert_eq!(
            found,
            vec![IncompleteCell {
                cell_id: "a".into(),
                file: ATTENTION_CSV,
                why: "2 rows for layer 2 at query position 510".into()
            }]
        );
    }

    #[test]
    fn orphans_are_listed_once_in_order() {
        let finished: HashSet<String> = ["a".to_string()].into();
        let ids = ["a", "c", "b", "c", "a"];
        assert_eq!(orphan_cells(ids.into_iter(), &finished), vec!["c", "b"]);
    }
}
