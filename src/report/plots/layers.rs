//! `layers_<cell_id>.png`: the needle rank on every CSA layer for one cell, at the answer
//! position (the last prompt token, phase "prompt"; if the cell has no row there, the last
//! probed prompt position it has). One series per scored profile (the driving one first and
//! drawn on top), rank 1 at the BOTTOM of a log axis; with several needles a point is the worst
//! of their ranks (as `min_needle_rank`). Dashed horizontal line: this cell's own top-k, its
//! only cut-off (the run's other top-k values belong to other cells and are not drawn; the rank
//! axis still spans them, so a run's layer plots share one scale); dotted: the number of
//! visible rows n_t (no rank can exceed it; a top-k at or above it makes the layer trivial).
//! DeepSeek-V4.1: the x axis holds its index sources (ticked `6 cand`, `8 reidx`), and a diamond
//! at the candidate source shows the candidate stage, the needle's best block ranked among
//! blocks under the driving profile ([`CandidateMark`]: filled kept, hollow dropped).
//!
//! Nothing hides: every profile has its colour of every plot ([`profile_colour`]) and a marker
//! shape of its own, and sits in a lane of its own a few pixels beside the layer ([`lanes`]), so
//! profiles with equal ranks stay side by side instead of on top of one another; profiles equal
//! on every layer are named in the legend ("exact = bf16-qk") and all but the first of them
//! drawn dashed. A layer where a profile has no rank (no needle row visible) gets a hollow marker
//! above n_t and breaks its line. The x axis is ticked at CSA layers only, every tick labelled,
//! thinned so that no two labels touch ([`spaced_ticks`]). The legend sits in a column right of
//! the plot, never over the data, and always fits it (`legend::legend_layout`). What is drawn is
//! decided before any pixel ([`layer_plot`]), so tests check the layout of the PNG. Cells
//! without layers.csv rows get no plot.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use plotters::prelude::*;

use super::legend::{
    draw_mark, draw_rows, drawn_text, legend_layout, note_rows, row_text, LegendLayout, LegendRow,
    Mark, Stroke, MARKS,
};
use super::{
    canvas, header_height, header_lines, plot_err, profile_colour, rank_axis, rank_axis_top,
    rank_label, spaced_ticks, subtitle, text_width, TickedAxis, AXIS_PX, FONT, LABEL_PX, LEGEND_W,
    SIZE, TICK_GAP,
};
use crate::record::{CellRecord, IndexProfile, LayerRecord};
use crate::report::error::Result;
use crate::report::store::RunRecords;
use crate::units::format_tokens;

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

/// Chart margins and label areas: the data area spans x from `MARGIN + Y_LABELS_W` to
/// `SIZE.0 - LEGEND_W - MARGIN_RIGHT - 1` on the canvas (checked when drawing).
const MARGIN: u32 = 14;
const MARGIN_RIGHT: u32 = 10;
const X_LABELS_H: u32 = 64;
const Y_LABELS_W: u32 = 96;
/// Profiles' lanes: at most this far apart (pixels), and all of them within this share of the
/// narrowest gap between two CSA layers.
const LANE_MAX_PX: f64 = 8.0;
const LANE_SHARE: f64 = 0.7;

/// One scored profile's series on a layer plot.
pub struct ProfileSeries {
    pub profile: String,
    pub driving: bool,
    /// Rank on each of [`LayerPlot::layers`] (the worst over the needles); None where no needle
    /// row was visible.
    pub ranks: Vec<Option<usize>>,
    /// How far right of its layer the series' points sit, in pixels (negative: left).
    pub offset_px: f64,
    pub mark: Mark,
    /// Solid, or dashed for a profile equal on every layer to one drawn before it.
    pub(crate) stroke: Stroke,
}

/// DeepSeek-V4.1's candidate stage on a layer plot: the needle's best block at the candidate
/// source, ranked among blocks (not rows) by the driving profile, drawn as a diamond on the
/// rank axis at that layer (filled: kept for the reindex layers; hollow: dropped) and named in
/// the legend. With several needles, the worst of their best blocks.
#[derive(Clone, Debug, PartialEq)]
pub struct CandidateMark {
    /// The candidate source.
    pub layer: usize,
    /// `block_rank` (None: no needle block visible).
    pub block_rank: Option<usize>,
    /// `block_kept` of that needle.
    pub kept: bool,
}

/// A labelled tick of the layer axis.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerTick {
    pub layer: usize,
    pub label: String,
    /// Centre of the tick and its label on the canvas, and the label's width, in pixels.
    pub x_px: f64,
    pub width_px: u32,
}

/// What a layer plot draws, decided before any pixel.
pub struct LayerPlot {
    pub title: String,
    pub subtitle: Vec<String>,
    /// The probed position drawn.
    pub query_pos: usize,
    /// The CSA layers with rows (DeepSeek-V4.1: the index sources), ascending.
    pub layers: Vec<usize>,
    /// DeepSeek-V4.1: each layer's stage (`None` on V4), ticked as `6 cand` (the candidate
    /// source) and `8 reidx` (ranked inside its kept blocks).
    pub stages: Vec<Option<crate::record::stage::LayerStage>>,
    /// DeepSeek-V4.1: the candidate stage under the driving profile (`None` on V4 or without
    /// a candidate-source row).
    pub candidate: Option<CandidateMark>,
    /// One per scored profile, the driving one first.
    pub series: Vec<ProfileSeries>,
    /// Profiles with equal ranks on every layer: groups of two or more, in series order.
    pub identical: Vec<Vec<String>>,
    /// Needles ranked in the cell.
    pub needles: usize,
    /// The x axis's ticks, each labelled (a subset of `layers`).
    pub ticks: Vec<LayerTick>,
    /// The data area's left and right edge on the canvas, in pixels.
    pub data_x: (f64, f64),
    /// The legend column's height, and where its rows go.
    pub legend_height: u32,
    pub legend_layout: LegendLayout,
    rows: Vec<LegendRow>,
    top: f64,
    visible: usize,
}

impl LayerPlot {
    /// The legend's rows in full, top-down.
    pub fn legend(&self) -> Vec<String> {
        self.rows.iter().map(|r| row_text(r).to_string()).collect()
    }

    /// The legend's rows as drawn (shortened in the middle where wider than the column).
    pub fn legend_drawn(&self) -> Vec<String> {
        self.rows.iter().map(drawn_text).collect()
    }

    /// Canvas x of `layer` (a CSA layer or any position between), as plotters maps it.
    pub fn x_px(&self, layer: f64) -> f64 {
        let (lo, hi) = self.x_range();
        let share = (layer - lo) / (hi - lo);
        self.data_x.0 + (share * (self.data_x.1 - self.data_x.0) + 1e-3).floor()
    }

    /// The x axis: the first and last CSA layer with half the narrowest gap between two CSA
    /// layers (at least half a layer) beyond each, so the lanes of the outer layers fit.
    fn x_range(&self) -> (f64, f64) {
        let lo = *self.layers.first().expect("a plot has layers") as f64;
        let hi = *self.layers.last().expect("a plot has layers") as f64;
        let narrowest = self.layers.windows(2).map(|w| w[1] - w[0]).min();
        let pad = narrowest.map_or(0.5, |gap| gap as f64 / 2.0).max(0.5);
        (lo - pad, hi + pad)
    }

    /// Where the hollow markers of a layer without a rank go: above n_t and every rank.
    fn no_rank_y(&self) -> f64 {
        self.top / 1.6
    }
}

/// The layer plot of `cell` in `records` (None when the cell has no layers.csv rows of phase
/// "prompt").
pub fn layer_plot(records: &RunRecords, cell: &CellRecord) -> Option<LayerPlot> {
    plan(records, &LayerPlotIndex::new(records), cell)
}

fn plan(records: &RunRecords, index: &LayerPlotIndex, cell: &CellRecord) -> Option<LayerPlot> {
    let rows = index.rows(&cell.cell_id);
    let answer_pos = cell.answer_position();
    let pos = if rows.iter().any(|r| r.query_pos == answer_pos) {
        answer_pos
    } else {
        rows.iter().map(|r| r.query_pos).max()?
    };
    let rows: Vec<&LayerRecord> = rows
        .iter()
        .copied()
        .filter(|r| r.query_pos == pos)
        .collect();

    // Profiles: driving first, then in the order of docs/architecture.md section 5.
    let mut profiles: Vec<(bool, String)> = rows
        .iter()
        .map(|r| (r.driving, r.profile.clone()))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let order = |name: &str| IndexProfile::EVERY.iter().position(|p| p.name() == name);
    profiles
        .sort_by_key(|(driving, name)| (!driving, order(name).unwrap_or(usize::MAX), name.clone()));
    profiles.dedup_by(|a, b| a.1 == b.1);

    let layers: Vec<usize> = rows
        .iter()
        .map(|r| r.layer)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let needles = rows.iter().map(|r| r.needle).collect::<BTreeSet<_>>().len();
    let rank_at = |layer: usize, name: &str| {
        rows.iter()
            .filter(|r| r.layer == layer && r.profile == name)
            .filter_map(|r| r.needle_rank)
            .max()
    };
    let mut series: Vec<ProfileSeries> = profiles
        .iter()
        .enumerate()
        .map(|(i, (driving, name))| ProfileSeries {
            profile: name.clone(),
            driving: *driving,
            ranks: layers.iter().map(|&l| rank_at(l, name)).collect(),
            offset_px: 0.0,
            mark: MARKS[order(name).unwrap_or(i) % MARKS.len()],
            stroke: Stroke::Solid,
        })
        .collect();
    let identical = identical_groups(&series);
    for group in &identical {
        for name in &group[1..] {
            if let Some(s) = series.iter_mut().find(|s| &s.profile == name) {
                s.stroke = Stroke::Dashed;
            }
        }
    }

    let topks = &index.topks;
    let visible = rows.iter().map(|r| r.visible_rows).max().unwrap_or(0);
    let max_rank = rows.iter().filter_map(|r| r.needle_rank).max().unwrap_or(1);
    let top = rank_axis_top((max_rank.max(visible).max(*topks.last().unwrap_or(&1))) as f64);

    let stages: Vec<Option<crate::record::stage::LayerStage>> = layers
        .iter()
        .map(|&l| rows.iter().find(|r| r.layer == l).and_then(|r| r.stage))
        .collect();
    let word = match stages.iter().any(Option::is_some) {
        true => "index",
        false => "CSA",
    };
    let candidate = candidate_mark(&rows);
    let title = format!(
        "Needle rank per {word} layer: {} tokens, depth {}%",
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
    let (_, header) = header_lines(&title, records.info.synthetic, &sub);
    let legend_height = SIZE.1 - header_height(header.len());
    let data_x = (
        f64::from(MARGIN + Y_LABELS_W),
        f64::from(SIZE.0 - LEGEND_W - MARGIN_RIGHT - 1),
    );
    let mut plot = LayerPlot {
        title,
        subtitle: sub,
        query_pos: pos,
        layers,
        stages,
        candidate,
        series,
        identical,
        needles,
        ticks: Vec::new(),
        data_x,
        legend_height,
        legend_layout: legend_layout(0, legend_height),
        rows: Vec::new(),
        top,
        visible,
    };
    plot.ticks = layer_ticks(&plot);
    let centres: Vec<f64> = plot.layers.iter().map(|&l| plot.x_px(l as f64)).collect();
    for (s, offset) in plot
        .series
        .iter_mut()
        .zip(lanes(&centres, profiles.len(), data_x))
    {
        s.offset_px = offset;
    }
    plot.rows = legend_rows(&plot, cell);
    plot.legend_layout = legend_layout(plot.rows.len(), legend_height);
    Some(plot)
}

/// The driving profile's candidate stage among `rows` (one position's): the candidate source's
/// needle with the worst best block (no block visible counting as worst).
fn candidate_mark(rows: &[&LayerRecord]) -> Option<CandidateMark> {
    use crate::record::stage::LayerStage;
    rows.iter()
        .filter(|r| r.driving && r.stage == Some(LayerStage::CandidateSource))
        .max_by_key(|r| r.block_rank.map_or(usize::MAX, |b| b))
        .map(|r| CandidateMark {
            layer: r.layer,
            block_rank: r.block_rank,
            kept: r.block_kept == Some(true),
        })
}

/// Groups of profiles whose ranks are equal on every layer (no rank counting as a value), two
/// or more to a group, in series order.
fn identical_groups(series: &[ProfileSeries]) -> Vec<Vec<String>> {
    let mut groups: Vec<(&[Option<usize>], Vec<String>)> = Vec::new();
    for s in series {
        match groups
            .iter_mut()
            .find(|(ranks, _)| *ranks == s.ranks.as_slice())
        {
            Some((_, names)) => names.push(s.profile.clone()),
            None => groups.push((&s.ranks, vec![s.profile.clone()])),
        }
    }
    groups
        .into_iter()
        .map(|(_, names)| names)
        .filter(|names| names.len() > 1)
        .collect()
}

/// The sideways offsets (pixels) of `n` series' lanes around layers at canvas x `centres` in a
/// data area spanning `data_x`: evenly spaced and centred on the layer, at most
/// [`LANE_MAX_PX`] apart, all within [`LANE_SHARE`] of the narrowest gap between two layers
/// (and of the room at the ends of the axis).
fn lanes(centres: &[f64], n: usize, data_x: (f64, f64)) -> Vec<f64> {
    if n < 2 {
        return vec![0.0; n];
    }
    let ends = match centres {
        [first, .., last] | [first @ last] => 2.0 * (first - data_x.0).min(data_x.1 - last),
        [] => data_x.1 - data_x.0,
    };
    let narrowest = centres.windows(2).map(|w| w[1] - w[0]).fold(ends, f64::min);
    let step = (LANE_SHARE * narrowest / (n - 1) as f64).min(LANE_MAX_PX);
    (0..n)
        .map(|i| (i as f64 - (n - 1) as f64 / 2.0) * step)
        .collect()
}

/// The labelled ticks of the layer axis: CSA layers only, all of them when their labels leave
/// [`TICK_GAP`] between neighbours, else evenly thinned ([`spaced_ticks`]).
fn layer_ticks(plot: &LayerPlot) -> Vec<LayerTick> {
    let all: Vec<LayerTick> = plot
        .layers
        .iter()
        .zip(&plot.stages)
        .map(|(&layer, stage)| {
            use crate::record::stage::LayerStage;
            let label = match stage {
                Some(LayerStage::CandidateSource) => format!("{layer} cand"),
                Some(LayerStage::Reindex) => format!("{layer} reidx"),
                _ => layer.to_string(),
            };
            LayerTick {
                layer,
                x_px: plot.x_px(layer as f64),
                width_px: text_width(&label, LABEL_PX),
                label,
            }
        })
        .collect();
    let centres: Vec<f64> = all.iter().map(|t| t.x_px).collect();
    let widths: Vec<u32> = all.iter().map(|t| t.width_px).collect();
    spaced_ticks(&centres, &widths, TICK_GAP)
        .into_iter()
        .map(|i| all[i].clone())
        .collect()
}

/// Cut-off lines' colours: the cell's top-k, n_t.
const OWN_TOPK: RGBColor = RGBColor(40, 40, 40);
const VISIBLE: RGBColor = RGBColor(110, 110, 110);
/// The candidate stage's diamond.
const CANDIDATE: RGBColor = RGBColor(140, 70, 20);

/// The legend column, top-down: the cut-off lines, the driving profile, the profiles scored
/// alongside, then notes on what is drawn together, side by side, without a rank.
fn legend_rows(plot: &LayerPlot, cell: &CellRecord) -> Vec<LegendRow> {
    let key = LegendRow::key;
    let label = format!("top-k {} (this cell)", cell.topk);
    let mut rows = vec![key(OWN_TOPK, 2, Stroke::Dashed, Mark::None, true, label)];
    if plot.visible > 0 {
        let label = format!("visible rows n_t = {}", plot.visible);
        rows.push(key(VISIBLE, 2, Stroke::Dotted, Mark::None, true, label));
    }
    let profile_key = |s: &ProfileSeries| {
        let width = if s.driving { 3 } else { 2 };
        let colour = profile_colour(&s.profile);
        key(colour, width, s.stroke, s.mark, true, s.profile.clone())
    };
    let (driving, others): (Vec<&ProfileSeries>, Vec<&ProfileSeries>) =
        plot.series.iter().partition(|s| s.driving);
    if !driving.is_empty() {
        rows.push(LegendRow::Heading("driving profile".into()));
        rows.extend(driving.into_iter().map(profile_key));
    }
    if !others.is_empty() {
        rows.push(LegendRow::Heading("scored alongside".into()));
        rows.extend(others.into_iter().map(profile_key));
    }
    if let Some(c) = &plot.candidate {
        let verdict = match (c.block_rank, c.kept) {
            (None, _) => "no needle block visible".to_string(),
            (Some(b), true) => format!("block rank {b}, kept"),
            (Some(b), false) => format!("block rank {b}, dropped"),
        };
        rows.push(LegendRow::Heading(format!(
            "candidate stage, layer {}",
            c.layer
        )));
        rows.push(key(
            CANDIDATE,
            2,
            Stroke::Solid,
            Mark::Diamond,
            c.kept,
            verdict,
        ));
        rows.extend(note_rows(
            "diamond: the needle's best block ranked among blocks (not rows); hollow: dropped, \
             so no reindex layer can select it",
        ));
    }
    if !plot.identical.is_empty() {
        rows.push(LegendRow::Note("identical on every layer (dashed):".into()));
        for group in &plot.identical {
            rows.extend(note_rows(&group.join(" = ")));
        }
    }
    if plot.series.len() > 1 {
        rows.extend(note_rows(
            "profiles sit side by side at each layer so that equal ranks stay visible",
        ));
    }
    if plot.needles > 1 {
        rows.extend(note_rows(&format!(
            "a point: the worst rank of the {} needles",
            plot.needles
        )));
    }
    if plot.series.iter().any(|s| s.ranks.contains(&None)) {
        rows.extend(note_rows(
            "hollow marker above n_t: no needle row visible there (no rank)",
        ));
    }
    if plot.visible > 0 && plot.visible <= cell.topk {
        rows.extend(note_rows(
            "n_t <= k: every visible row is selected (trivial cell)",
        ));
    }
    rows
}

/// Draws the plot for `cell` into `path`; `None` when the cell has no layers.csv rows.
pub(crate) fn render(
    records: &RunRecords,
    index: &LayerPlotIndex,
    cell: &CellRecord,
    path: &Path,
) -> Result<Option<PathBuf>> {
    let Some(plot) = plan(records, index, cell) else {
        return Ok(None);
    };
    let (root, body) = canvas(path, &records.info, &plot.title, &plot.subtitle)?;
    let err = plot_err(path);
    let (plot_area, legend_area) = body.split_horizontally(SIZE.0 - LEGEND_W);
    let (lo, hi) = plot.x_range();
    let ticks: Vec<f64> = plot.ticks.iter().map(|t| t.layer as f64).collect();
    let every_layer: Vec<f64> = plot.layers.iter().map(|&l| l as f64).collect();
    let mut chart = ChartBuilder::on(&plot_area)
        .margin(MARGIN)
        .margin_right(MARGIN_RIGHT)
        .x_label_area_size(X_LABELS_H)
        .y_label_area_size(Y_LABELS_W)
        .build_cartesian_2d(
            TickedAxis {
                range: lo..hi,
                labelled: ticks,
                mesh: every_layer,
            },
            rank_axis(plot.top),
        )
        .map_err(&err)?;
    let drawn = chart.plotting_area().get_pixel_range().0;
    debug_assert_eq!(
        (f64::from(drawn.start), f64::from(drawn.end)),
        plot.data_x,
        "the layout's data area is not the chart's"
    );
    let tick_label = |v: &f64| {
        plot.ticks
            .iter()
            .find(|t| (t.layer as f64 - v).abs() < 1e-6)
            .map_or_else(String::new, |t| t.label.clone())
    };
    chart
        .configure_mesh()
        .x_label_formatter(&tick_label)
        .y_label_formatter(&rank_label)
        .x_desc(match plot.stages.iter().any(Option::is_some) {
            false => format!(
                "model layer, CSA layers only (query position {}, the last prompt token)",
                plot.query_pos
            ),
            true => format!(
                "index sources (cand: candidate source, reidx: inside its blocks), query {}",
                plot.query_pos
            ),
        })
        .y_desc("needle rank (log scale, 1 = best, at bottom)")
        .label_style((FONT, LABEL_PX))
        .axis_desc_style((FONT, AXIS_PX))
        .light_line_style(RGBColor(238, 238, 238))
        .bold_line_style(RGBColor(215, 215, 215))
        .draw()
        .map_err(&err)?;

    // Cut-off lines.
    let mut hline = |y: f64, colour: RGBColor, stroke: Stroke| -> Result<()> {
        let (dash, gap) = stroke.pattern().unwrap_or((10, 6));
        chart
            .draw_series(DashedLineSeries::new(
                [lo, hi].map(|x| (x, y)),
                dash,
                gap,
                colour.stroke_width(2),
            ))
            .map_err(&err)?;
        Ok(())
    };
    hline(cell.topk as f64, OWN_TOPK, Stroke::Dashed)?;
    if plot.visible > 0 {
        hline(plot.visible as f64, VISIBLE, Stroke::Dotted)?;
    }

    // The series, the driving one last (on top); a line breaks where a layer has no rank.
    let px_per_layer = (plot.data_x.1 - plot.data_x.0) / (hi - lo);
    for s in plot.series.iter().rev() {
        let colour = profile_colour(&s.profile);
        let width = if s.driving { 3 } else { 2 };
        let x = |l: usize| l as f64 + s.offset_px / px_per_layer;
        let runs = s
            .ranks
            .split(Option::is_none)
            .zip(runs_start(&s.ranks))
            .filter(|(run, _)| !run.is_empty());
        for (run, first) in runs {
            let points: Vec<(f64, f64)> = run
                .iter()
                .enumerate()
                .map(|(i, r)| (x(plot.layers[first + i]), r.unwrap_or(1) as f64))
                .collect();
            let style = colour.stroke_width(width);
            match s.stroke.pattern() {
                Some((dash, gap)) => chart
                    .draw_series(DashedLineSeries::new(points, dash, gap, style))
                    .map(|_| ()),
                None => chart
                    .draw_series(LineSeries::new(points, style))
                    .map(|_| ()),
            }
            .map_err(&err)?;
        }
        let r = if s.driving { 5 } else { 4 };
        for (i, rank) in s.ranks.iter().enumerate() {
            let (y, filled) = match rank {
                Some(rank) => (*rank as f64, true),
                None => (plot.no_rank_y(), false),
            };
            let c = chart.backend_coord(&(x(plot.layers[i]), y));
            draw_mark(&root, c, s.mark, colour, filled, r, path)?;
        }
    }
    if let Some(c) = &plot.candidate {
        let y = c.block_rank.map_or(plot.no_rank_y(), |b| b as f64);
        let at = chart.backend_coord(&(c.layer as f64, y));
        draw_mark(&root, at, Mark::Diamond, CANDIDATE, c.kept, 8, path)?;
    }
    draw_rows(&legend_area, &plot.rows, path)?;
    root.present().map_err(&err)?;
    Ok(Some(path.to_path_buf()))
}

/// The index in `ranks` where each of `ranks.split(Option::is_none)`'s runs starts.
fn runs_start(ranks: &[Option<usize>]) -> impl Iterator<Item = usize> + '_ {
    std::iter::once(0).chain(
        ranks
            .iter()
            .enumerate()
            .filter(|(_, r)| r.is_none())
            .map(|(i, _)| i + 1),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::rank::{NeedleRank, RecordMeta};
    use crate::record::RunInfo;

    fn layer(cell_id: &str, layer: usize, phase: &str) -> LayerRecord {
        ranked(cell_id, layer, phase, "fp8", 0, Some(3))
    }

    /// A row of `profile` (fp8 drives) for `needle` at `layer`; no rank: no needle row visible.
    fn ranked(
        cell_id: &str,
        layer: usize,
        phase: &str,
        profile: &str,
        needle: usize,
        rank: Option<usize>,
    ) -> LayerRecord {
        let meta = RecordMeta {
            cell_id,
            layer,
            query_pos: 99,
            phase,
            profile,
            driving: profile == "fp8",
            needle,
        };
        let r = NeedleRank {
            visible_rows: 20,
            needle_rows: usize::from(rank.is_some()),
            best_row: rank.map(|_| 0),
            needle_rank: rank,
            rank_ties: 0,
            needle_ties: 0,
            needle_score: rank.map(|_| 1.0),
        };
        LayerRecord::new(&meta, &r, Some(0.5), 4)
    }

    fn records_of(cells: Vec<CellRecord>, layers: Vec<LayerRecord>) -> RunRecords {
        RunRecords {
            dir: PathBuf::from("r"),
            info: RunInfo::new("m", "sha256:00", "passkey", true, serde_json::json!({})),
            cells,
            layers,
            attention: Vec::new(),
            engine: Vec::new(),
            notes: Vec::new(),
        }
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

    /// Two needles: a point is the worst of their ranks (before, the first needle's row alone
    /// was drawn), and the legend says so.
    #[test]
    fn with_several_needles_a_point_is_their_worst_rank() {
        let c = cell("a", 4);
        let rows = vec![
            ranked("a", 1, "prompt", "fp8", 0, Some(3)),
            ranked("a", 1, "prompt", "fp8", 1, Some(9)),
            ranked("a", 3, "prompt", "fp8", 0, Some(12)),
            ranked("a", 3, "prompt", "fp8", 1, None),
        ];
        let records = records_of(vec![c.clone()], rows);
        let plot = layer_plot(&records, &c).unwrap();
        assert_eq!(plot.series[0].ranks, [Some(9), Some(12)]);
        assert_eq!(plot.needles, 2);
        let legend = plot.legend().join(" ");
        assert!(
            legend.contains("the worst rank of the 2 needles"),
            "{legend}"
        );
    }

    /// DeepSeek-V4.1: the candidate stage is drawn at the candidate source from the driving
    /// profile's block rank (the worse needle's), kept or dropped as the records say, the
    /// ticks name the stages, and V4 records get no candidate mark.
    #[test]
    fn a_v41_plot_shows_the_candidate_stage_of_the_driving_profile() {
        use crate::record::stage::LayerStage;
        let c = cell("a", 4);
        let mut rows = Vec::new();
        for (layer, stage) in [
            (2, LayerStage::Index),
            (6, LayerStage::CandidateSource),
            (8, LayerStage::Reindex),
        ] {
            for (profile, needle, block) in [
                ("fp8", 0, Some(3)),
                ("fp8", 1, Some(26)),
                ("exact", 0, Some(1)),
            ] {
                let mut r = ranked("a", layer, "prompt", profile, needle, Some(5));
                r.stage = Some(stage);
                if stage == LayerStage::CandidateSource {
                    r.block_rank = block;
                    r.block_kept = block.map(|b| b <= 10);
                }
                rows.push(r);
            }
        }
        let records = records_of(vec![c.clone()], rows.clone());
        let plot = layer_plot(&records, &c).unwrap();
        assert_eq!(
            plot.candidate,
            Some(CandidateMark {
                layer: 6,
                block_rank: Some(26),
                kept: false
            })
        );
        let labels: Vec<&str> = plot.ticks.iter().map(|t| t.label.as_str()).collect();
        assert_eq!(labels, ["2", "6 cand", "8 reidx"]);
        let legend = plot.legend();
        assert!(
            legend.iter().any(|r| r == "candidate stage, layer 6"),
            "{legend:?}"
        );
        assert!(
            legend.iter().any(|r| r == "block rank 26, dropped"),
            "{legend:?}"
        );
        assert!(plot.title.starts_with("Needle rank per index layer"));
        super::super::ensure_font().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("layers_a.png");
        let index = LayerPlotIndex::new(&records);
        assert!(render(&records, &index, &c, &path).unwrap().is_some());

        // Only the kept needle: kept; V4 rows: no mark.
        let kept: Vec<LayerRecord> = rows.iter().filter(|r| r.needle == 0).cloned().collect();
        let plot = layer_plot(&records_of(vec![c.clone()], kept), &c).unwrap();
        assert_eq!(plot.candidate.as_ref().map(|m| m.kept), Some(true));
        assert!(plot.legend().iter().any(|r| r == "block rank 3, kept"));
        let v4: Vec<LayerRecord> = rows
            .into_iter()
            .map(|mut r| {
                r.stage = None;
                r.block_rank = None;
                r.block_kept = None;
                r
            })
            .collect();
        let plot = layer_plot(&records_of(vec![c.clone()], v4), &c).unwrap();
        assert_eq!(plot.candidate, None);
        assert!(plot.title.starts_with("Needle rank per CSA layer"));
    }

    /// A layer where a profile has no rank (no needle row visible) is drawn (a hollow marker
    /// above n_t, the line broken there) and the legend says what it means; profiles equal on
    /// every layer are named, profiles equal on some layers are not, and every profile has its
    /// own lane and marker.
    #[test]
    fn a_layer_without_a_rank_and_identical_profiles_are_shown_and_named() {
        let c = cell("a", 4);
        let mut rows = Vec::new();
        for (l, fp8, bf16) in [
            (1, Some(3), Some(5)),
            (3, None, None),
            (5, Some(8), Some(8)),
        ] {
            rows.push(ranked("a", l, "prompt", "fp8", 0, fp8));
            rows.push(ranked("a", l, "prompt", "exact", 0, bf16));
            rows.push(ranked("a", l, "prompt", "bf16-qk", 0, bf16));
            rows.push(ranked("a", l, "prompt", "bf16", 0, fp8));
        }
        let records = records_of(vec![c.clone()], rows);
        let plot = layer_plot(&records, &c).unwrap();
        let names: Vec<&str> = plot.series.iter().map(|s| s.profile.as_str()).collect();
        assert_eq!(names, ["fp8", "exact", "bf16", "bf16-qk"]);
        assert_eq!(plot.series[0].ranks, [Some(3), None, Some(8)]);
        assert_eq!(
            plot.identical,
            [vec!["fp8", "bf16"], vec!["exact", "bf16-qk"]]
        );
        let legend = plot.legend();
        for want in [
            "identical on every layer (dashed):",
            "fp8 = bf16",
            "exact = bf16-qk",
        ] {
            assert!(legend.iter().any(|r| r == want), "{want} not in {legend:?}");
        }
        assert!(
            legend.join(" ").contains("no needle row visible"),
            "{legend:?}"
        );
        let mut offsets: Vec<f64> = plot.series.iter().map(|s| s.offset_px).collect();
        offsets.dedup();
        assert_eq!(offsets.len(), 4, "{offsets:?}");
        let mut marks: Vec<Mark> = plot.series.iter().map(|s| s.mark).collect();
        marks.dedup();
        assert_eq!(marks.len(), 4);
        super::super::ensure_font().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("layers_a.png");
        let index = LayerPlotIndex::new(&records);
        assert!(render(&records, &index, &c, &path).unwrap().is_some());
        assert!(path.is_file());
    }

    /// A top-128 cell's plot draws its own cut-off only: the run's top-64 line belongs to
    /// other cells (before, it was drawn too and read as a second threshold of this cell).
    #[test]
    fn a_cell_draws_only_its_own_top_k() {
        let (c64, c128) = (cell("a", 64), cell("b", 128));
        let rows = vec![
            ranked("a", 1, "prompt", "fp8", 0, Some(70)),
            ranked("b", 1, "prompt", "fp8", 0, Some(70)),
        ];
        let records = records_of(vec![c64, c128.clone()], rows);
        let plot = layer_plot(&records, &c128).unwrap();
        let legend = legend_rows(&plot, &c128)
            .iter()
            .map(|r| row_text(r).to_string())
            .collect::<Vec<_>>();
        assert!(
            legend.iter().any(|r| r == "top-k 128 (this cell)"),
            "{legend:?}"
        );
        assert!(!legend.iter().any(|r| r.contains("top-k 64")), "{legend:?}");
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
