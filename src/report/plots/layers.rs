//! `layers_<cell_id>.png`: the needle rank on every CSA layer for one cell, at the answer
//! position (the last prompt token, phase "prompt"; if the cell has no row there, the last
//! probed prompt position it has). One line per scored profile (the driving one first and
//! marked), rank 1 at the BOTTOM of a log axis. Dashed horizontal lines: every top-k of the run
//! (the cell's own k drawn darker); dotted: the number of visible rows n_t (no rank can exceed
//! it; a top-k at or above it makes the layer trivial). Profiles have their colours of every
//! plot ([`profile_colour`]). The legend sits in a column right of the plot, never over the
//! data, and always fits it (`legend::legend_layout`). Cells without layers.csv rows get no
//! plot.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use plotters::prelude::*;

use super::legend::{draw_rows, Key, Mark, Row, Stroke};
use super::{
    canvas, plot_err, profile_colour, rank_axis_top, rank_label, subtitle, AXIS_PX, FONT, LABEL_PX,
    LEGEND_W, SIZE,
};
use crate::record::{format_tokens, CellRecord, IndexProfile, LayerRecord};
use crate::report::error::Result;
use crate::report::store::RunRecords;

/// What every layer plot of a run draws from, indexed once: each cell's layers.csv rows of
/// phase "prompt" (in file order) and the run's top-k values. Built in one pass over the rows,
/// so rendering N cells' plots reads the rows once, not N times (a Flash sweep has thousands of
/// cells and millions of rows).
pub(crate) struct LayerPlotIndex<'a> {
    prompt_rows: HashMap<&'a str, Vec<&'a LayerRecord>>,
    topks: BTreeSet<usize>,
}

impl<'a> LayerPlotIndex<'a> {
    pub(crate) fn new(records: &'a RunRecords) -> Self {
        let mut prompt_rows: HashMap<&str, Vec<&LayerRecord>> = HashMap::new();
        for r in records.layers.iter().filter(|r| r.phase == "prompt") {
            prompt_rows.entry(r.cell_id.as_str()).or_default().push(r);
        }
        LayerPlotIndex {
            prompt_rows,
            topks: records.cells.iter().map(|c| c.topk).collect(),
        }
    }

    /// The prompt-phase rows of `cell_id`, in file order.
    pub(crate) fn rows(&self, cell_id: &str) -> &[&'a LayerRecord] {
        self.prompt_rows.get(cell_id).map_or(&[], Vec::as_slice)
    }
}

/// Draws the plot for `cell` into `path`; `None` when the cell has no layers.csv rows.
pub(crate) fn render(
    records: &RunRecords,
    index: &LayerPlotIndex,
    cell: &CellRecord,
    path: &Path,
) -> Result<Option<PathBuf>> {
    let rows: Vec<&LayerRecord> = index.rows(&cell.cell_id).to_vec();
    let answer_pos = cell.answer_position();
    let pos = if rows.iter().any(|r| r.query_pos == answer_pos) {
        answer_pos
    } else {
        match rows.iter().map(|r| r.query_pos).max() {
            Some(p) => p,
            None => return Ok(None),
        }
    };
    let rows: Vec<&LayerRecord> = rows.into_iter().filter(|r| r.query_pos == pos).collect();

    // Profiles: driving first, then in the order of docs/architecture.md section 5.
    let mut profiles: Vec<(bool, String)> = rows
        .iter()
        .map(|r| (r.driving, r.profile.clone()))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    profiles.sort_by_key(|(driving, name)| {
        let order = IndexProfile::ALL.iter().position(|p| p.name() == name);
        (!driving, order.unwrap_or(usize::MAX), name.clone())
    });
    profiles.dedup_by(|a, b| a.1 == b.1);

    let layers: BTreeSet<usize> = rows.iter().map(|r| r.layer).collect();
    let (lo, hi) = (
        *layers.first().expect("rows are not empty") as f64,
        *layers.last().expect("rows are not empty") as f64,
    );
    let topks = &index.topks;
    let visible = rows.iter().map(|r| r.visible_rows).max().unwrap_or(0);
    let max_rank = rows.iter().filter_map(|r| r.needle_rank).max().unwrap_or(1);
    let top = rank_axis_top((max_rank.max(visible).max(*topks.last().unwrap_or(&1))) as f64);

    let title = format!(
        "Needle rank per CSA layer: {} tokens, depth {}%",
        format_tokens(cell.target_tokens),
        cell.depth_pct
    );
    let sub = subtitle(
        &records.info,
        &[
            format!("index {} (driving)", cell.index),
            format!("top-k {}", cell.topk),
            format!("cell {}", cell.cell_id),
        ],
    );
    let (root, body) = canvas(path, &records.info, &title, &sub)?;
    let err = plot_err(path);
    let (plot_area, legend_area) = body.split_horizontally(SIZE.0 - LEGEND_W);
    let mut chart = ChartBuilder::on(&plot_area)
        .margin(14)
        .margin_right(10)
        .x_label_area_size(64)
        .y_label_area_size(96)
        .build_cartesian_2d((lo - 0.5)..(hi + 0.5), (0.7f64..top).log_scale())
        .map_err(&err)?;
    let span = (hi - lo) as usize + 1;
    chart
        .configure_mesh()
        .x_labels(span.min(12))
        // Ticks are labelled only where a CSA layer is (the others have no indexer).
        .x_label_formatter(&|v: &f64| {
            let layer = v.round();
            if (v - layer).abs() < 1e-6 && layer >= 0.0 && layers.contains(&(layer as usize)) {
                format!("{}", layer as i64)
            } else {
                String::new()
            }
        })
        .y_label_formatter(&rank_label)
        .x_desc(format!(
            "model layer, CSA layers only (query position {pos}, the last prompt token)"
        ))
        .y_desc("needle rank (log scale, 1 = best, at bottom)")
        .label_style((FONT, LABEL_PX))
        .axis_desc_style((FONT, AXIS_PX))
        .light_line_style(RGBColor(238, 238, 238))
        .bold_line_style(RGBColor(215, 215, 215))
        .draw()
        .map_err(&err)?;

    let mut keys = Vec::new();
    let x_range = [lo - 0.5, hi + 0.5];
    let mut hline = |y: f64, colour: RGBColor, stroke: Stroke, label: String| -> Result<()> {
        let (dash, gap) = if stroke == Stroke::Dotted {
            (2, 5)
        } else {
            (10, 6)
        };
        chart
            .draw_series(DashedLineSeries::new(
                x_range.iter().map(|&x| (x, y)),
                dash,
                gap,
                colour.stroke_width(2),
            ))
            .map_err(&err)?;
        keys.push(Row::Key(Key {
            colour,
            width: 2,
            stroke,
            mark: Mark::None,
            filled: true,
            label,
        }));
        Ok(())
    };
    for &k in topks {
        let own = k == cell.topk;
        let colour = if own {
            RGBColor(40, 40, 40)
        } else {
            RGBColor(150, 150, 150)
        };
        let label = format!("top-k {k}{}", if own { " (this cell)" } else { "" });
        hline(k as f64, colour, Stroke::Dashed, label)?;
    }
    if visible > 0 {
        let label = format!("visible rows n_t = {visible}");
        hline(
            visible as f64,
            RGBColor(110, 110, 110),
            Stroke::Dotted,
            label,
        )?;
    }

    for (driving, name) in &profiles {
        let colour = profile_colour(name);
        let mut points: Vec<(f64, f64)> = Vec::new();
        for &l in &layers {
            let rank = rows
                .iter()
                .find(|r| r.layer == l && &r.profile == name)
                .and_then(|r| r.needle_rank);
            if let Some(rank) = rank {
                points.push((l as f64, rank as f64));
            }
        }
        let width = if *driving { 3 } else { 2 };
        chart
            .draw_series(LineSeries::new(points.clone(), colour.stroke_width(width)))
            .map_err(&err)?;
        chart
            .draw_series(
                points
                    .iter()
                    .map(|&p| Circle::new(p, if *driving { 5 } else { 4 }, colour.filled())),
            )
            .map_err(&err)?;
        keys.push(Row::Key(Key {
            colour,
            width,
            stroke: Stroke::Solid,
            mark: Mark::Circle,
            filled: true,
            label: format!("{name}{}", if *driving { " (driving)" } else { "" }),
        }));
    }
    if visible > 0 && visible <= cell.topk {
        keys.push(Row::Note(String::new()));
        keys.push(Row::Note("n_t <= k: every visible row".into()));
        keys.push(Row::Note("is selected (trivial cell)".into()));
    }
    draw_rows(&legend_area, &keys, path)?;
    root.present().map_err(&err)?;
    Ok(Some(path.to_path_buf()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::rank::{NeedleRank, RecordMeta};
    use crate::record::RunInfo;

    fn layer(cell_id: &str, layer: usize, phase: &str) -> LayerRecord {
        let meta = RecordMeta {
            cell_id,
            layer,
            query_pos: 99,
            phase,
            profile: "fp8",
            driving: true,
            needle: 0,
        };
        let r = NeedleRank {
            visible_rows: 20,
            needle_rows: 1,
            best_row: Some(0),
            needle_rank: Some(3),
            rank_ties: 0,
            needle_ties: 0,
            needle_score: Some(1.0),
        };
        LayerRecord::new(&meta, &r, Some(0.5), 4)
    }

    fn cell(id: &str, topk: usize) -> CellRecord {
        let mut c: CellRecord = serde_json::from_value(serde_json::json!({
            "cell_id": id, "target_tokens": 100, "prompt_tokens": 100, "depth_pct": 50.0,
            "needle_start": 40, "needle_end": 50, "answer_start": 90, "answer_end": 91,
            "index": "fp8", "kv": "exact", "topk": topk, "answer_text": "",
            "answer_correct": null, "min_needle_rank": 3, "csa_layers_selected": 1,
            "csa_layers_nontrivial": 1, "wall_seconds": 1.0
        }))
        .unwrap();
        c.cell_id = id.into();
        c
    }

    /// The layer plots draw from one index of the rows built in one pass (before, every cell's
    /// plot scanned all of layers.csv: quadratic in a Flash sweep's thousands of cells).
    #[test]
    fn the_index_groups_each_cells_prompt_rows_in_file_order() {
        let records = RunRecords {
            dir: PathBuf::from("r"),
            info: RunInfo::new("m", "sha256:00", "passkey", true, serde_json::json!({})),
            cells: vec![cell("a", 4), cell("b", 8), cell("c", 4)],
            layers: vec![
                layer("a", 1, "prompt"),
                layer("b", 1, "prompt"),
                layer("a", 3, "prompt"),
                layer("a", 3, "1"),
                layer("b", 3, "prompt"),
            ],
            attention: Vec::new(),
            engine: Vec::new(),
            notes: Vec::new(),
        };
        let index = LayerPlotIndex::new(&records);
        let layers = |id: &str| -> Vec<(usize, String)> {
            index
                .rows(id)
                .iter()
                .map(|r| (r.layer, r.phase.clone()))
                .collect()
        };
        assert_eq!(layers("a"), [(1, "prompt".into()), (3, "prompt".into())]);
        assert_eq!(layers("b"), [(1, "prompt".into()), (3, "prompt".into())]);
        assert!(index.rows("c").is_empty());
        assert_eq!(index.topks, BTreeSet::from([4, 8]));
    }
}
