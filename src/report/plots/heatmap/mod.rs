//! `heatmap_<index>_<topk>.png`: one per (driving index profile, top-k) of the run (with a
//! `_<kv>` suffix only when a run mixes kv modes). x = context length (categorical, "2k"),
//! y = needle depth in % (0 = start of the haystack, at the top). A grid tile gathers the
//! samples of that (length, depth) ([`tiles`] decides what it shows):
//! - colour: green = every sample recalled, red = none, amber = some; "recalled" is the answer
//!   verdict where a cell has one (`answer_correct`), else indexer recall, and a tile whose
//!   samples are all indexer-judged with every CSA layer trivial (n_t <= k) is grey (no
//!   evidence). The title says how the run was judged: generated answer, lightning indexer, or
//!   "answer where present, else indexer" when both occur; the legend lists every fill drawn.
//! - a tile the sweep's plan has but no finished sample is hatched light grey ("not run"), the
//!   subtitle says "n of m cells" when the plan has more, and a tile with fewer samples than
//!   planned adds "[finished/planned]" to its number.
//! - number: the worst (largest) `min_needle_rank` over the samples, "-" when none; with several
//!   samples and a split verdict, "(recalled/samples)" follows, and the legend explains it with
//!   the first such tile ("146 (2/3): worst rank 146; 2 of the tile's 3 samples recalled").
//! - a position of the grid without a cell and outside the plan (probes sharing a directory) is
//!   dotted ("no cell"), never blank.
//!
//! Many depths or lengths: when a row (column) is too short (narrow) for its text, the numbers
//! and the white tile borders are left out (the colours alone fill the grid) and the axis
//! labels are thinned to at most about 20 evenly spaced ones, first and last kept
//! ([`thin_ticks`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{
    canvas, flow, plot_err, subtitle, text_width, thin_ticks, wrap_words, AXIS_PX, FONT, LABEL_PX,
};
use crate::record::{CellRecord, IndexProfile, KvMode};
use crate::report::error::Result;
use crate::report::store::RunRecords;
use crate::units::{format_tokens, percent_label};

mod tiles;

use tiles::{Fill, Grid, Judging, HATCH, NOT_RUN, NO_CELL};

/// Legend band: swatch size, line pitches, text size.
const SWATCH: i32 = 18;
const ENTRY_PITCH: i32 = 26;
const NOTE_PITCH: i32 = 22;
const LEGEND_TEXT_PX: u32 = 16;
/// Chart margins and label areas (the plot's size is estimated from them before drawing).
const MARGIN: u32 = 12;
const MARGIN_RIGHT: u32 = 40;
const X_LABELS_H: u32 = 64;
/// Width of the depth labels' column: at least, at most, and beyond the widest label (the
/// rotated axis description and the tick).
const Y_LABELS_W: (u32, u32) = (100, 260);
const Y_LABELS_EXTRA: u32 = 48;
/// Smallest in-tile number; a tile that cannot hold it gets none.
const MIN_TILE_PX: u32 = 12;
/// Tiles smaller than this (either side) get no white border, up to twice it a 1 px one.
const MIN_BORDERED_PX: u32 = 10;
/// Most labels on a thinned axis.
const MAX_TICKS: usize = 20;

/// Writes one heatmap per (index, kv, top-k) present in the cells.
pub(crate) fn render(records: &RunRecords, out_dir: &Path) -> Result<Vec<PathBuf>> {
    let keys: BTreeSet<(usize, &str, usize)> = records
        .cells
        .iter()
        .map(|c| (order(c.index), c.kv.name(), c.topk))
        .collect();
    let kvs: BTreeSet<&str> = keys.iter().map(|k| k.1).collect();
    let mut out = Vec::new();
    for (p, kv, topk) in keys {
        let index = IndexProfile::EVERY[p];
        let cells: Vec<&CellRecord> = records
            .cells
            .iter()
            .filter(|c| c.index == index && c.kv.name() == kv && c.topk == topk)
            .collect();
        let suffix = if kvs.len() > 1 {
            format!("_{kv}")
        } else {
            String::new()
        };
        let path = out_dir.join(format!("heatmap_{index}_{topk}{suffix}.png"));
        let what = format!("index {index}");
        super::atomically(&path, |tmp| {
            draw(records, &cells, &what, cells[0].kv, topk, tmp)
        })?;
        out.push(path);
    }
    out.extend(render_engine(records, out_dir)?);
    Ok(out)
}

/// `heatmap_engine_<topk>.png`: the serving engine's own recall beside the reference's, one
/// per engine K, from engine.csv: a tile is recalled when the engine's selection held every
/// needle on every non-trivial CSA layer at the answer position (its answer is judged in the
/// reference's heatmap: with an engine the reference runs the engine's tokens). Tiles carry
/// no rank (an engine sends sets, not scores). The cells of the first driving profile stand
/// for their prompts (every driving profile holds the same engine selection).
fn render_engine(records: &RunRecords, out_dir: &Path) -> Result<Vec<PathBuf>> {
    use std::collections::{BTreeMap, HashMap};
    if records.engine.is_empty() {
        return Ok(Vec::new());
    }
    // Per cell: (engine K, layer -> every needle selected) at the answer position, non-trivial
    // layers only.
    let mut per_cell: HashMap<&str, (usize, BTreeMap<usize, bool>)> = HashMap::new();
    let answer: HashMap<&str, usize> = records
        .cells
        .iter()
        .map(|c| (c.cell_id.as_str(), c.answer_position()))
        .collect();
    for r in &records.engine {
        if answer.get(r.cell_id.as_str()) != Some(&r.query_pos) {
            continue;
        }
        let entry = per_cell
            .entry(r.cell_id.as_str())
            .or_insert((r.engine_topk, BTreeMap::new()));
        if r.visible_rows > r.engine_topk {
            *entry.1.entry(r.layer).or_insert(true) &= r.needle_selected;
        }
    }
    let first_index = records
        .cells
        .iter()
        .filter(|c| per_cell.contains_key(c.cell_id.as_str()))
        .map(|c| order(c.index))
        .min();
    let mut by_k: BTreeMap<usize, Vec<CellRecord>> = BTreeMap::new();
    for c in &records.cells {
        let Some((k, layers)) = per_cell.get(c.cell_id.as_str()) else {
            continue;
        };
        if Some(order(c.index)) != first_index {
            continue;
        }
        let mut engine_cell = c.clone();
        engine_cell.topk = *k;
        engine_cell.answer_correct = None;
        engine_cell.min_needle_rank = None;
        engine_cell.csa_layers_nontrivial = layers.len();
        engine_cell.csa_layers_selected = layers.values().filter(|&&all| all).count();
        by_k.entry(*k).or_default().push(engine_cell);
    }
    let mut out = Vec::new();
    for (k, cells) in by_k {
        let refs: Vec<&CellRecord> = cells.iter().collect();
        let path = out_dir.join(format!("heatmap_engine_{k}.png"));
        super::atomically(&path, |tmp| {
            draw(
                records,
                &refs,
                "serving engine's own selection (engine.csv)",
                refs[0].kv,
                k,
                tmp,
            )
        })?;
        out.push(path);
    }
    Ok(out)
}

fn order(p: IndexProfile) -> usize {
    IndexProfile::EVERY
        .iter()
        .position(|q| *q == p)
        .unwrap_or(0)
}

/// A category axis: category i spans `[i, i+1]` of an f64 axis over `[0, n]`, and the tick
/// labels sit at the centres of the categories in `ticks`. (plotters' segmented integer axes
/// collapse when an axis has a single category: its one-value range maps every value to the
/// same pixel.)
struct Categories {
    n: usize,
    ticks: Vec<usize>,
}

impl Ranged for Categories {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let share = value / self.n.max(1) as f64;
        limit.0 + (share * (limit.1 - limit.0) as f64).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, _hint: Hint) -> Vec<f64> {
        self.ticks.iter().map(|&i| i as f64 + 0.5).collect()
    }

    fn range(&self) -> std::ops::Range<f64> {
        0.0..self.n as f64
    }
}

/// The categories of an axis of `n` to label, `extent` pixels long, each label needing
/// `label` pixels along it: all when each category has room, else [`thin_ticks`] with room
/// for every label twice over (so that the shorter last gap still holds one).
fn axis_ticks(n: usize, extent: u32, label: u32) -> Vec<usize> {
    if n == 0 || extent / n as u32 >= label {
        return (0..n).collect();
    }
    let max = 1 + extent as usize / (2 * label as usize).max(1);
    thin_ticks(n, max.min(MAX_TICKS))
}

fn draw(
    records: &RunRecords,
    cells: &[&CellRecord],
    what: &str,
    kv: KvMode,
    topk: usize,
    path: &Path,
) -> Result<()> {
    let grid = Grid::new(
        &records.info,
        cells,
        crate::record::verdict::LayerWord::of(&records.layers),
    );
    let (lengths, depths) = (&grid.lengths, &grid.depths);
    let (nx, ny) = (lengths.len(), depths.len());
    let mut parts = vec![
        what.to_string(),
        format!("top-k {topk}"),
        format!("kv {kv}"),
    ];
    parts.extend(grid.completeness());
    let sub = subtitle(&records.info, &parts);
    let (root, body) = canvas(path, &records.info, grid.judging.title(), &sub)?;
    let err = plot_err(path);
    let (body_w, body_h) = body.dim_in_pixel();

    let band = LegendBand::new(&grid, body_w - 40);
    let (plot_area, legend) = body.split_vertically(body_h - band.height());

    // Labels: all when every row (column) holds one, else thinned; the depth labels' column
    // is as wide as the widest shown (a probe's depth may have many decimals).
    let (pw, ph) = plot_area.dim_in_pixel();
    let plot_h = ph.saturating_sub(2 * MARGIN + X_LABELS_H);
    let y_shown = axis_ticks(ny, plot_h, LABEL_PX + 3);
    let y_labels_w = y_shown
        .iter()
        .map(|&j| text_width(&percent_label(depths[j]), LABEL_PX) + Y_LABELS_EXTRA)
        .fold(Y_LABELS_W.0, u32::max)
        .min(Y_LABELS_W.1);
    let plot_w = pw.saturating_sub(MARGIN + MARGIN_RIGHT + y_labels_w);
    let x_label_w = lengths
        .iter()
        .map(|&l| text_width(&format_tokens(l), LABEL_PX))
        .max()
        .unwrap_or(0);
    let x_ticks = axis_ticks(nx, plot_w, x_label_w + 10);
    let y_ticks: Vec<usize> = y_shown.into_iter().map(|j| ny - 1 - j).collect();

    // Column i spans [i, i+1]; row r (from the bottom) spans [r, r+1] and shows depth ny-1-r,
    // so 0 % is at the top.
    let mut chart = ChartBuilder::on(&plot_area)
        .margin(MARGIN)
        .margin_right(MARGIN_RIGHT)
        .x_label_area_size(X_LABELS_H)
        .y_label_area_size(y_labels_w)
        .build_cartesian_2d(
            Categories {
                n: nx,
                ticks: x_ticks,
            },
            Categories {
                n: ny,
                ticks: y_ticks,
            },
        )
        .map_err(&err)?;
    let category = |v: f64, n: usize| {
        let i = v.floor();
        (i >= 0.0 && (i as usize) < n).then_some(i as usize)
    };
    let x_fmt = |v: &f64| category(*v, nx).map_or(String::new(), |i| format_tokens(lengths[i]));
    let y_fmt =
        |v: &f64| category(*v, ny).map_or(String::new(), |r| percent_label(depths[ny - 1 - r]));
    chart
        .configure_mesh()
        .disable_mesh()
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .x_desc("context length (tokens)")
        .y_desc("needle depth (% of haystack, 0 = start)")
        .label_style((FONT, LABEL_PX))
        .axis_desc_style((FONT, AXIS_PX))
        .draw()
        .map_err(&err)?;

    // Numbers and borders only where the tiles have room for them.
    let (cw, ch) = chart.plotting_area().dim_in_pixel();
    let (col_w, row_h) = (cw / nx.max(1) as u32, ch / ny.max(1) as u32);
    let border = match col_w.min(row_h) {
        s if s >= 2 * MIN_BORDERED_PX => 2,
        s if s >= MIN_BORDERED_PX => 1,
        _ => 0,
    };
    let widest = |px: u32| {
        grid.tiles
            .values()
            .map(|t| text_width(&t.text, px))
            .max()
            .unwrap_or(0)
    };
    let largest = (row_h as f64 * 0.55).min(20.0);
    let text_px = (MIN_TILE_PX..=largest.max(0.0) as u32)
        .rev()
        .find(|&px| widest(px) + 6 <= col_w);
    let centred = Pos::new(HPos::Center, VPos::Center);
    for i in 0..nx {
        for j in 0..ny {
            let Some(t) = grid.tiles.get(&(i, j)) else {
                continue;
            };
            let (x, y) = (i as f64, (ny - 1 - j) as f64);
            let corners = [(x, y), (x + 1.0, y + 1.0)];
            match t.fill {
                Fill::Colour(c) => {
                    chart
                        .draw_series(std::iter::once(Rectangle::new(corners, c.filled())))
                        .map_err(&err)?;
                }
                Fill::NotRun | Fill::NoCell => {
                    let (x0, y0) = chart.backend_coord(&(x, y + 1.0));
                    let (x1, y1) = chart.backend_coord(&(x + 1.0, y));
                    pattern(&root, t.fill, (x0, y0), (x1 - 1, y1 - 1), path)?;
                }
            }
            if border > 0 {
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        corners,
                        WHITE.stroke_width(border),
                    )))
                    .map_err(&err)?;
            }
            if let Some(px) = text_px.filter(|_| !t.text.is_empty()) {
                chart
                    .draw_series(std::iter::once(Text::new(
                        t.text.clone(),
                        (x + 0.5, y + 0.5),
                        (FONT, px).into_font().color(&BLACK).pos(centred),
                    )))
                    .map_err(&err)?;
            }
        }
    }

    band.draw(&legend, &grid, text_px.is_some(), path)?;
    root.present().map_err(&err)?;
    Ok(())
}

/// The legend band under the grid: the swatches of [`Grid::legend`] flowing over as many
/// lines as they need, then the notes ([`LegendBand::notes`]) wrapped to the band's width.
struct LegendBand {
    entries: Vec<(Fill, &'static str)>,
    /// (line, x) of each entry.
    placed: Vec<(usize, u32)>,
    lines: i32,
    /// Note lines (the most of the two variants, with and without numbers in the tiles).
    notes: i32,
    width: u32,
}

impl LegendBand {
    fn new(grid: &Grid, width: u32) -> LegendBand {
        let entries = grid.legend();
        let widths: Vec<u32> = entries
            .iter()
            .map(|(_, label)| SWATCH as u32 + 6 + text_width(label, LEGEND_TEXT_PX))
            .collect();
        let placed = flow(&widths, 26, width);
        let lines = placed.last().map_or(0, |p| p.0 as i32 + 1);
        let notes = [true, false]
            .map(|numbers| Self::note_lines(grid, numbers, width).len())
            .into_iter()
            .max()
            .unwrap_or(0);
        LegendBand {
            entries,
            placed,
            lines,
            notes: notes as i32,
            width,
        }
    }

    fn height(&self) -> u32 {
        (10 + ENTRY_PITCH * self.lines + NOTE_PITCH * self.notes + 6) as u32
    }

    /// What the numbers are (or that the tiles are too small for them), what a tile's
    /// `(recalled/samples)` means, shown on the first tile that has it, what `[n/m]` means when
    /// a tile is partial, and what "recalled" means when judging is mixed.
    fn notes(grid: &Grid, numbers: bool) -> Vec<String> {
        let layer = grid.word.noun();
        let mut out = vec![if numbers {
            format!(
                "number in a tile: min_needle_rank (needle rank on the worst {layer} at the \
                 answer position), worst over samples"
            )
        } else {
            "no numbers: the tiles are too small (min_needle_rank is in cells.csv and summary.json)"
                .to_string()
        }];
        if let Some(t) = grid.first_split() {
            let (recalled, n) = t.split.unwrap_or_default();
            let worst = t.worst.map_or_else(|| "-".to_string(), |w| w.to_string());
            let judged = match grid.judging {
                Judging::Answer => "answered correctly".to_string(),
                Judging::Indexer => format!("kept the needle on every non-trivial {layer}"),
                Judging::Mixed => "recalled".to_string(),
            };
            let trivial = if grid.judging == Judging::Answer {
                String::new()
            } else {
                format!(" (samples with every {layer} trivial not counted)")
            };
            out.push(if numbers {
                format!(
                    "{}: worst rank {worst} over the tile's samples; {recalled} of its {n} \
                     samples {judged}{trivial}",
                    t.text
                )
            } else {
                format!("amber: some of a tile's samples {judged}, not all{trivial}")
            });
        }
        if grid.any_partial() {
            out.push(if numbers {
                "[n/m]: n of the m samples planned for the tile finished (the sweep stopped early)"
            } else {
                "some tiles have fewer finished samples than planned (the sweep stopped early)"
            }
            .to_string());
        }
        if grid.judging == Judging::Mixed {
            out.push(format!(
                "recalled: the generated answer is right where a cell has one, else the \
                     needle is selected on every non-trivial {layer}"
            ));
        }
        out
    }

    /// [`LegendBand::notes`] wrapped at spaces to `width` pixels, line by line.
    fn note_lines(grid: &Grid, numbers: bool, width: u32) -> Vec<String> {
        Self::notes(grid, numbers)
            .iter()
            .flat_map(|note| wrap_words(note, LEGEND_TEXT_PX, width))
            .collect()
    }

    fn draw<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
        grid: &Grid,
        numbers: bool,
        path: &Path,
    ) -> Result<()> {
        let err = plot_err(path);
        let style = (FONT, LEGEND_TEXT_PX).into_font().color(&BLACK);
        for ((fill, label), (line, dx)) in self.entries.iter().zip(&self.placed) {
            let (x, y) = (20 + *dx as i32, 10 + ENTRY_PITCH * *line as i32);
            let corner = (x + SWATCH - 1, y + SWATCH - 1);
            match fill {
                Fill::Colour(c) => area
                    .draw(&Rectangle::new([(x, y), corner], c.filled()))
                    .map_err(&err)?,
                Fill::NotRun | Fill::NoCell => {
                    pattern(area, *fill, (x, y), corner, path)?;
                    // A near-white swatch needs an edge to be seen.
                    let edge = Rectangle::new([(x, y), corner], HATCH.stroke_width(1));
                    area.draw(&edge).map_err(&err)?;
                }
            }
            let text = Text::new(label.to_string(), (x + SWATCH + 6, y + 1), style.clone());
            area.draw(&text).map_err(&err)?;
        }
        for (k, line) in Self::note_lines(grid, numbers, self.width)
            .into_iter()
            .enumerate()
        {
            let y = 10 + ENTRY_PITCH * self.lines + 2 + NOTE_PITCH * k as i32;
            area.draw(&Text::new(line, (20, y), style.clone()))
                .map_err(&err)?;
        }
        Ok(())
    }
}

/// Fills the pixel rectangle `(x0, y0)..=(x1, y1)` of `area` with the pattern of a tile
/// without samples: not run (hatched) or no cell (dotted); anything else is left alone.
fn pattern<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    fill: Fill,
    from: (i32, i32),
    to: (i32, i32),
    path: &Path,
) -> Result<()> {
    match fill {
        Fill::NotRun => hatch(area, from, to, path),
        Fill::NoCell => dots(area, from, to, path),
        Fill::Colour(_) => Ok(()),
    }
}

/// Fills the pixel rectangle `(x0, y0)..=(x1, y1)` of `area` with the no-cell pattern: a
/// near-white background under 2 px dots 6 px apart (in phase across neighbouring tiles).
fn dots<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    (x0, y0): (i32, i32),
    (x1, y1): (i32, i32),
    path: &Path,
) -> Result<()> {
    let err = plot_err(path);
    if x1 < x0 || y1 < y0 {
        return Ok(());
    }
    area.draw(&Rectangle::new([(x0, y0), (x1, y1)], NO_CELL.filled()))
        .map_err(&err)?;
    let first = |v: i32| v.div_euclid(6) * 6 + 2;
    for y in (first(y0)..y1).step_by(6).filter(|&y| y >= y0) {
        for x in (first(x0)..x1).step_by(6).filter(|&x| x >= x0) {
            area.draw(&Rectangle::new([(x, y), (x + 1, y + 1)], HATCH.filled()))
                .map_err(&err)?;
        }
    }
    Ok(())
}

/// Fills the pixel rectangle `(x0, y0)..=(x1, y1)` of `area` with the not-run pattern: a
/// light background under diagonal lines 8 px apart (in phase across neighbouring tiles).
fn hatch<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    (x0, y0): (i32, i32),
    (x1, y1): (i32, i32),
    path: &Path,
) -> Result<()> {
    let err = plot_err(path);
    if x1 < x0 || y1 < y0 {
        return Ok(());
    }
    area.draw(&Rectangle::new([(x0, y0), (x1, y1)], NOT_RUN.filled()))
        .map_err(&err)?;
    // Lines x + y = c for c a multiple of 8, clipped to the rectangle.
    let first = (x0 + y0).div_euclid(8) * 8;
    for c in (first..=x1 + y1).step_by(8) {
        let (xa, xb) = (x0.max(c - y1), x1.min(c - y0));
        if xa <= xb {
            let line = PathElement::new(vec![(xa, c - xa), (xb, c - xb)], HATCH.stroke_width(1));
            area.draw(&line).map_err(&err)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three samples at one position, ranks 146, 20 and 30, the 146 one answered wrong.
    fn split_tile_cells() -> Vec<CellRecord> {
        [(146, false), (20, true), (30, true)]
            .into_iter()
            .enumerate()
            .map(|(s, (rank, correct))| {
                serde_json::from_value(serde_json::json!({
                    "cell_id": format!("L4096-d50-fp8-k64-s{s}"), "target_tokens": 4096,
                    "prompt_tokens": 4096, "depth_pct": 50.0, "needle_start": 40,
                    "needle_end": 50, "answer_start": 4000, "answer_end": 4005,
                    "index": "fp8", "kv": "exact", "topk": 64, "answer_text": "",
                    "answer_correct": correct, "min_needle_rank": rank,
                    "csa_layers_selected": 1, "csa_layers_nontrivial": 2, "wall_seconds": 1.0
                }))
                .unwrap()
            })
            .collect()
    }

    /// A tile's "(2/3)" is explained under the grid with that tile's own numbers (before, the
    /// legend did not say what the parenthesised count was); with indexer judging the note
    /// says what recalled means and that trivial samples are not counted.
    #[test]
    fn the_legend_explains_a_split_tile_with_its_own_numbers() {
        let cells = split_tile_cells();
        let refs: Vec<&CellRecord> = cells.iter().collect();
        let info =
            crate::record::RunInfo::new("m", "sha256:0", "passkey", false, serde_json::json!({}));
        let grid = Grid::new(&info, &refs, crate::record::verdict::LayerWord::Csa);
        assert_eq!(grid.tiles[&(0, 0)].text, "146 (2/3)");
        let notes = LegendBand::notes(&grid, true);
        let want = "146 (2/3): worst rank 146 over the tile's samples; 2 of its 3 samples \
                    answered correctly";
        assert!(notes.iter().any(|n| n == want), "{notes:?}");
        let mut indexer = cells.clone();
        for c in &mut indexer {
            c.csa_layers_selected = if c.min_needle_rank == Some(146) { 1 } else { 2 };
            c.answer_correct = None;
        }
        let refs: Vec<&CellRecord> = indexer.iter().collect();
        let grid = Grid::new(&info, &refs, crate::record::verdict::LayerWord::Csa);
        let notes = LegendBand::notes(&grid, true).join(" ");
        assert!(
            notes.contains("2 of its 3 samples kept the needle on every non-trivial CSA layer"),
            "{notes}"
        );
        assert!(notes.contains("trivial not counted"), "{notes}");
        // Each note line fits the band.
        for line in LegendBand::note_lines(&grid, true, 960) {
            assert!(text_width(&line, LEGEND_TEXT_PX) <= 960, "{line}");
        }
    }

    /// Every category keeps its label while it has room; a thinned axis keeps the first and
    /// the last, at most 20, never two closer than one label.
    #[test]
    fn axis_labels_are_thinned_only_when_the_categories_are_too_small() {
        assert_eq!(axis_ticks(11, 450, 20), (0..11).collect::<Vec<_>>());
        for n in [23usize, 101, 1000] {
            let ticks = axis_ticks(n, 450, 20);
            assert!(ticks.len() <= MAX_TICKS, "{n}: {ticks:?}");
            assert_eq!((ticks[0], *ticks.last().unwrap()), (0, n - 1), "{n}");
            let px = |i: usize| i as f64 * 450.0 / n as f64;
            for w in ticks.windows(2) {
                assert!(px(w[1]) - px(w[0]) >= 19.0, "{n}: {ticks:?}");
            }
        }
    }
}
