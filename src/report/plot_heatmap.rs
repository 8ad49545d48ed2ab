//! `heatmap_<index>_<topk>.png`: one per (driving index profile, top-k) of the run (with a
//! `_<kv>` suffix only when a run mixes kv modes). x = context length (categorical, "2k"),
//! y = needle depth in % (0 = start of the haystack, at the top). A grid cell gathers the
//! samples of that (length, depth):
//! - colour: green = every sample recalled, red = none, amber = some; when the run has no answer
//!   verdicts (`answer_correct` empty) "recalled" is indexer recall and a cell whose every CSA
//!   layer was trivial (n_t <= k) is grey (no evidence);
//! - number: the worst (largest) `min_needle_rank` over the samples, "-" when none; with several
//!   samples and a split verdict, "(recalled/samples)" follows.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::error::Result;
use super::plots::{canvas, plot_err, subtitle, AXIS_PX, FONT, LABEL_PX};
use super::records::{format_tokens, CellRecord, IndexProfile, KvMode};
use super::store::RunRecords;

const GREEN: RGBColor = RGBColor(122, 198, 126);
const RED: RGBColor = RGBColor(236, 112, 99);
const AMBER: RGBColor = RGBColor(247, 190, 85);
const GREY: RGBColor = RGBColor(205, 205, 205);
const LEGEND_PX: u32 = 64;

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
        let index = IndexProfile::ALL[p];
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
        super::plots::atomically(&path, |tmp| {
            draw(records, &cells, index, cells[0].kv, topk, tmp)
        })?;
        out.push(path);
    }
    Ok(out)
}

fn order(p: IndexProfile) -> usize {
    IndexProfile::ALL.iter().position(|q| *q == p).unwrap_or(0)
}

/// `50%`, `33.3%`, `50.04%`: every decimal the depth has (probes sharing an `--out` at
/// depths 50.04 and 50.000001 must not get two rows labelled alike).
pub(crate) fn depth_label(d: f64) -> String {
    if d.fract() == 0.0 {
        format!("{d:.0}%")
    } else {
        format!("{d}%")
    }
}

/// A category axis: category i spans `[i, i+1]` of an f64 axis over `[0, n]`, and the tick
/// labels sit at the centres. (plotters' segmented integer axes collapse when an axis has a
/// single category: its one-value range maps every value to the same pixel.)
struct Categories(usize);

impl Ranged for Categories {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let share = value / self.0.max(1) as f64;
        limit.0 + (share * (limit.1 - limit.0) as f64).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, _hint: Hint) -> Vec<f64> {
        (0..self.0).map(|i| i as f64 + 0.5).collect()
    }

    fn range(&self) -> std::ops::Range<f64> {
        0.0..self.0 as f64
    }
}

/// The verdict of one grid cell.
struct Tile {
    fill: RGBColor,
    text: String,
}

fn tile(samples: &[&CellRecord]) -> Tile {
    // Trivial indexer-judged samples are no evidence: counted neither way.
    let n = samples.iter().filter(|c| c.is_evidence()).count();
    let recalled = samples
        .iter()
        .filter(|c| c.is_evidence() && c.recalled())
        .count();
    let trivial = n == 0;
    let fill = if trivial {
        GREY
    } else if recalled == n {
        GREEN
    } else if recalled == 0 {
        RED
    } else {
        AMBER
    };
    let worst = samples.iter().filter_map(|c| c.min_needle_rank).max();
    let mut text = worst.map_or_else(|| "-".to_string(), |w| w.to_string());
    if n > 1 && recalled != 0 && recalled != n {
        text.push_str(&format!(" ({recalled}/{n})"));
    }
    Tile { fill, text }
}

fn draw(
    records: &RunRecords,
    cells: &[&CellRecord],
    index: IndexProfile,
    kv: KvMode,
    topk: usize,
    path: &Path,
) -> Result<()> {
    let lengths: Vec<usize> = cells
        .iter()
        .map(|c| c.target_tokens)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut depths: Vec<f64> = cells.iter().map(|c| c.depth_pct).collect();
    depths.sort_by(|a, b| a.total_cmp(b));
    depths.dedup();
    let (nx, ny) = (lengths.len(), depths.len());
    let by_answer = cells.iter().any(|c| c.answer_correct.is_some());

    let title = if by_answer {
        "Needle recall (generated answer) by context length and depth"
    } else {
        "Needle recall (lightning indexer) by context length and depth"
    };
    let sub = subtitle(
        &records.info,
        &[
            format!("index {index}"),
            format!("top-k {topk}"),
            format!("kv {kv}"),
        ],
    );
    let (root, body) = canvas(path, &records.info, title, &sub)?;
    let err = plot_err(path);
    let (_, body_h) = body.dim_in_pixel();
    let (plot_area, legend) = body.split_vertically(body_h - LEGEND_PX);

    // Column i spans [i, i+1]; row r (from the bottom) spans [r, r+1] and shows depth ny-1-r,
    // so 0 % is at the top.
    let mut chart = ChartBuilder::on(&plot_area)
        .margin(12)
        .margin_right(40)
        .x_label_area_size(64)
        .y_label_area_size(100)
        .build_cartesian_2d(Categories(nx), Categories(ny))
        .map_err(&err)?;
    let category = |v: f64, n: usize| {
        let i = v.floor();
        (i >= 0.0 && (i as usize) < n).then_some(i as usize)
    };
    let x_fmt = |v: &f64| category(*v, nx).map_or(String::new(), |i| format_tokens(lengths[i]));
    let y_fmt =
        |v: &f64| category(*v, ny).map_or(String::new(), |r| depth_label(depths[ny - 1 - r]));
    chart
        .configure_mesh()
        .disable_mesh()
        .x_labels(nx)
        .y_labels(ny)
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .x_desc("context length (tokens)")
        .y_desc("needle depth (% of haystack, 0 = start)")
        .label_style((FONT, LABEL_PX))
        .axis_desc_style((FONT, AXIS_PX))
        .draw()
        .map_err(&err)?;

    let (_, plot_h) = chart.plotting_area().dim_in_pixel();
    let text_px = ((plot_h as f64 / ny.max(1) as f64) * 0.55).clamp(13.0, 20.0);
    let centred = Pos::new(HPos::Center, VPos::Center);
    for (i, &len) in lengths.iter().enumerate() {
        for (j, &d) in depths.iter().enumerate() {
            let samples: Vec<&CellRecord> = cells
                .iter()
                .copied()
                .filter(|c| c.target_tokens == len && c.depth_pct == d)
                .collect();
            if samples.is_empty() {
                continue;
            }
            let (x, y) = (i as f64, (ny - 1 - j) as f64);
            let t = tile(&samples);
            let corners = [(x, y), (x + 1.0, y + 1.0)];
            chart
                .draw_series(std::iter::once(Rectangle::new(corners, t.fill.filled())))
                .map_err(&err)?;
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    corners,
                    WHITE.stroke_width(2),
                )))
                .map_err(&err)?;
            chart
                .draw_series(std::iter::once(Text::new(
                    t.text,
                    (x + 0.5, y + 0.5),
                    (FONT, text_px).into_font().color(&BLACK).pos(centred),
                )))
                .map_err(&err)?;
        }
    }

    let entries: Vec<(RGBColor, &str)> = if by_answer {
        vec![
            (GREEN, "answer correct"),
            (RED, "answer wrong"),
            (AMBER, "some samples wrong"),
        ]
    } else {
        vec![
            (GREEN, "selected on every non-trivial CSA layer"),
            (RED, "lost on a CSA layer"),
            (AMBER, "some samples lost"),
            (GREY, "trivial: n_t <= k everywhere"),
        ]
    };
    draw_legend(&legend, &entries, path)?;
    root.present().map_err(&err)?;
    Ok(())
}

/// One legend line: coloured squares with labels, then what the numbers are.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    entries: &[(RGBColor, &str)],
    path: &Path,
) -> Result<()> {
    let err = plot_err(path);
    let style = (FONT, 16).into_font().color(&BLACK);
    let mut x = 20i32;
    let y = 10i32;
    for (colour, label) in entries {
        area.draw(&Rectangle::new([(x, y), (x + 18, y + 18)], colour.filled()))
            .map_err(&err)?;
        area.draw(&Text::new(
            label.to_string(),
            (x + 24, y + 1),
            style.clone(),
        ))
        .map_err(&err)?;
        let (w, _) = area.estimate_text_size(label, &style).map_err(&err)?;
        x += 24 + w as i32 + 26;
    }
    area.draw(&Text::new(
        "number in a cell: min_needle_rank (needle rank on the worst CSA layer at the answer \
         position), worst over samples"
            .to_string(),
        (20, y + 28),
        style.clone(),
    ))
    .map_err(&err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(rank: Option<usize>, correct: bool) -> CellRecord {
        CellRecord {
            cell_id: "L4096-d50-fp8-k512-s0".into(),
            target_tokens: 4096,
            prompt_tokens: 4096,
            depth_pct: 50.0,
            needle_start: 100,
            needle_end: 130,
            answer_start: 120,
            answer_end: 125,
            index: IndexProfile::SglangFp8,
            kv: KvMode::Fp8,
            topk: 512,
            answer_text: String::new(),
            answer_correct: Some(correct),
            min_needle_rank: rank,
            csa_layers_selected: 2,
            csa_layers_nontrivial: 2,
            wall_seconds: 1.0,
        }
    }

    /// A tile names the worst rank over its samples, and the recalled fraction when the samples
    /// disagree.
    #[test]
    fn a_tile_shows_the_worst_rank_over_its_samples() {
        let (a, b, c) = (
            sample(Some(5), true),
            sample(Some(900), true),
            sample(None, true),
        );
        let t = tile(&[&a, &b, &c]);
        assert_eq!((t.text.as_str(), t.fill), ("900", GREEN));
        let lost = sample(Some(40), false);
        let t = tile(&[&a, &lost]);
        assert_eq!((t.text.as_str(), t.fill), ("40 (1/2)", AMBER));
        assert_eq!(tile(&[&c]).text, "-");
    }

    #[test]
    fn depth_labels_keep_every_decimal_of_the_depth() {
        assert_eq!(depth_label(50.0), "50%");
        assert_eq!(depth_label(33.3), "33.3%");
        assert_eq!(depth_label(12.5), "12.5%");
        assert_ne!(depth_label(50.04), depth_label(50.000001));
        assert_eq!(depth_label(50.04), "50.04%");
    }
}
