//! PNG plots of a report directory (docs/outputs.md), drawn with plotters' bitmap backend.
//!
//! Text goes through ONE embedded font: DejaVu Sans (assets/fonts/DejaVuSans.ttf, Bitstream
//! Vera licence, see DejaVuSans-LICENSE.txt next to it), registered once as family
//! `sans-serif` ([`ensure_font`]); no system font is ever looked up, so the PNGs are the same
//! on every machine.
//!
//! - `heatmap_<index>_<topk>.png` (`heatmap`): context length x depth, colour =
//!   verdict, worst `min_needle_rank` over the samples written in each cell.
//! - `layers_<cell_id>.png` (`layers`): needle rank per CSA layer at the answer
//!   position, one line per scored profile, the run's top-k values as horizontal lines.
//! - `rank_vs_length.png` (`ranks`): median and worst `min_needle_rank` against
//!   context length per (profile, top-k).
//!
//! Every plot is 1000 x 700 px with a header (what is plotted; model, scenario, profile, top-k,
//! "synthetic model" when run.json says so) whose text is measured and wrapped or shortened to
//! the canvas ([`text`]), and text of at least 16 px. A profile has one colour in every plot
//! ([`profile_colour`]). This file owns the canvas, the header and what the plots share;
//! [`legend`] the legends and markers. Plots only read records ([`RunRecords`]); the
//! aggregates they show are those of [`super::summary`].

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::combinators::WithKeyPoints;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{register_font, FontStyle};
use rayon::prelude::*;

use super::error::{ReportError, Result};
use super::store::RunRecords;
use crate::record::{file_stem, IndexProfile, RunInfo};

pub(crate) mod heatmap;
mod layers;
pub mod legend;
mod ranks;
pub mod text;

pub use layers::{layer_plot, LayerPlot, LayerTick, ProfileSeries};
pub use legend::{flow, legend_layout, LegendLayout};
pub use ranks::line_style_legend;
pub use text::{ellipsize_middle, fit_lines, fit_size, text_width, wrap_words};

/// The embedded font.
const FONT_BYTES: &[u8] = include_bytes!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/assets/fonts/DejaVuSans.ttf"
));
/// The family every text style uses.
pub const FONT: &str = "sans-serif";
/// Size of every PNG.
pub const SIZE: (u32, u32) = (1000, 700);
/// Text sizes in pixels.
pub(crate) const TITLE_PX: u32 = 24;
pub(crate) const SUBTITLE_PX: u32 = 17;
pub const LABEL_PX: u32 = 17;
pub(crate) const AXIS_PX: u32 = 19;
/// Height of the header band.
pub(crate) const HEADER_PX: u32 = 72;

/// Registers the embedded DejaVu Sans as `sans-serif` (once per process).
pub fn ensure_font() -> Result<()> {
    static DONE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        register_font(FONT, FontStyle::Normal, FONT_BYTES)
            .map_err(|_| "the embedded font does not parse".to_string())
    })
    .clone()
    .map_err(|message| ReportError::Plot {
        path: PathBuf::from("assets/fonts/DejaVuSans.ttf"),
        message,
    })
}

/// Reads the records of `run_dir` and writes every PNG into it; returns their paths
/// (heatmaps, then per-cell layer plots, then rank_vs_length.png).
pub fn render_all(run_dir: &Path) -> Result<Vec<PathBuf>> {
    let records = RunRecords::read(run_dir)?;
    render_records(&records, run_dir)
}

/// Writes every PNG for `records` into `out_dir` (each through a temporary file renamed into
/// place: `atomically`), then removes plots of ours that these records no longer have (the
/// layer plot of a cell whose torn record was dropped, a heatmap of a grid value no cell has,
/// the temporary of a render cut short), so the directory shows exactly its records.
pub fn render_records(records: &RunRecords, out_dir: &Path) -> Result<Vec<PathBuf>> {
    ensure_font()?;
    let mut written = heatmap::render(records, out_dir)?;
    let index = layers::LayerPlotIndex::new(records);
    let layer_plots: Vec<Option<PathBuf>> = records
        .cells
        .par_iter()
        .map(|cell| {
            let path = out_dir.join(format!("layers_{}.png", file_stem(&cell.cell_id)));
            atomically(&path, |tmp| {
                layers::render(records, &index, cell, tmp).map(|p| p.map(|_| path.clone()))
            })
        })
        .collect::<Result<_>>()?;
    written.extend(layer_plots.into_iter().flatten());
    if !records.cells.is_empty() {
        let path = out_dir.join("rank_vs_length.png");
        atomically(&path, |tmp| ranks::render(records, tmp))?;
        written.push(path);
    }
    remove_stale_plots(out_dir, &written)?;
    Ok(written)
}

/// Draws a PNG through `draw` into a hidden temporary beside `path` (`.<name>.partial.png`: the
/// extension tells plotters the format), then renames it into place, so a render that fails (a
/// full disk) or is cut short never leaves a truncated PNG under the final name. Errors name
/// `path`.
pub(crate) fn atomically<T>(path: &Path, draw: impl FnOnce(&Path) -> Result<T>) -> Result<T> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}{PARTIAL}"));
    let on_path = |message: String| ReportError::Plot {
        path: path.to_path_buf(),
        message,
    };
    match draw(&tmp) {
        Ok(v) => {
            if tmp.exists() {
                std::fs::rename(&tmp, path).map_err(|e| {
                    // The temporary is of no use once it cannot take its place.
                    let _ = std::fs::remove_file(&tmp);
                    on_path(format!("renaming {}: {e}", tmp.display()))
                })?;
            }
            Ok(v)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(match e {
                ReportError::Plot { message, .. } => on_path(message),
                other => other,
            })
        }
    }
}

/// The suffix of [`atomically`]'s temporaries.
const PARTIAL: &str = ".partial.png";

/// Removes the PNGs of ours in `dir` (heatmap_*, layers_*, rank_vs_length.png and temporaries
/// of [`atomically`]) that are not among `written`.
fn remove_stale_plots(dir: &Path, written: &[PathBuf]) -> Result<()> {
    let keep: std::collections::HashSet<&std::ffi::OsStr> =
        written.iter().filter_map(|p| p.file_name()).collect();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let text = name.to_string_lossy();
        let ours = text.ends_with(".png")
            && (text.starts_with("heatmap_")
                || text.starts_with("layers_")
                || text == "rank_vs_length.png"
                || (text.starts_with('.') && text.ends_with(PARTIAL)));
        if ours && !keep.contains(name.as_os_str()) && entry.path().is_file() {
            std::fs::remove_file(entry.path()).map_err(|e| ReportError::Plot {
                path: entry.path(),
                message: format!("removing a plot these records no longer have: {e}"),
            })?;
        }
    }
    Ok(())
}

/// Maps any drawing error onto the PNG it was for.
pub(crate) fn plot_err<E: std::fmt::Display>(path: &Path) -> impl Fn(E) -> ReportError + '_ {
    move |e| ReportError::Plot {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// The subtitle parts shared by all plots: model, scenario, and what else the caller adds
/// ([`canvas`] joins them with ` · `, onto two lines when one is too narrow).
pub(crate) fn subtitle(info: &RunInfo, parts: &[String]) -> Vec<String> {
    let mut all = vec![
        format!("model {}", info.model_name()),
        format!("scenario {}", info.scenario),
    ];
    all.extend(parts.iter().cloned());
    all
}

/// Widest a header line may be: the canvas less a margin on each side.
pub const HEADER_TEXT_W: u32 = SIZE.0 - 2 * 12;
/// Pitch of the subtitle's lines.
const SUBTITLE_PITCH: u32 = 21;

/// Height of the header band when its subtitle takes `subtitle_lines` lines (one at least).
pub fn header_height(subtitle_lines: usize) -> u32 {
    HEADER_PX + SUBTITLE_PITCH * (subtitle_lines.max(1) as u32 - 1)
}

/// The header's lines as drawn: the title (shrunk from `TITLE_PX` down to 18 px, then
/// shortened, until it fits [`HEADER_TEXT_W`]) with its size, and the subtitle `parts` on at
/// most two lines of at most [`HEADER_TEXT_W`] ([`fit_lines`]).
pub fn header_lines(
    title: &str,
    synthetic: bool,
    parts: &[String],
) -> ((String, u32), Vec<String>) {
    let title = if synthetic {
        format!("{title} (synthetic model)")
    } else {
        title.to_string()
    };
    (
        fit_size(&title, TITLE_PX, 18, HEADER_TEXT_W),
        fit_lines(parts, SUBTITLE_PX, HEADER_TEXT_W, 2),
    )
}

/// Opens a bitmap of [`SIZE`], paints it white, draws the header ([`header_lines`]: the title
/// gets a "(synthetic model)" suffix when run.json says so; the header grows by a line when
/// the subtitle takes two) and returns the root and the area below.
pub(crate) fn canvas<'a>(
    path: &'a Path,
    info: &RunInfo,
    title: &str,
    subtitle: &[String],
) -> Result<(
    DrawingArea<BitMapBackend<'a>, Shift>,
    DrawingArea<BitMapBackend<'a>, Shift>,
)> {
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err(path))?;
    let ((title, title_px), lines) = header_lines(title, info.synthetic, subtitle);
    let (head, body) = root.split_vertically(header_height(lines.len()));
    let centre = Pos::new(HPos::Center, VPos::Top);
    let x = SIZE.0 as i32 / 2;
    head.draw(&Text::new(
        title,
        (x, 10 + (TITLE_PX - title_px) as i32 / 2),
        (FONT, title_px).into_font().color(&BLACK).pos(centre),
    ))
    .map_err(plot_err(path))?;
    for (i, line) in lines.into_iter().enumerate() {
        head.draw(&Text::new(
            line,
            (x, 14 + (TITLE_PX + SUBTITLE_PITCH * i as u32) as i32),
            (FONT, SUBTITLE_PX)
                .into_font()
                .color(&RGBColor(60, 60, 60))
                .pos(centre),
        ))
        .map_err(plot_err(path))?;
    }
    Ok((root, body))
}

/// Colours of the index profiles, in [`IndexProfile::EVERY`] order (the last shared with a name
/// outside it; colour-blind-friendly Tableau order without its grey: grey means a top-k cut-off line
/// or a trivial heatmap tile).
const PROFILE_COLOURS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(0, 92, 49),
];

/// The colour of index profile `name` in every plot (fp8 is orange in the layer plots and in
/// rank_vs_length.png alike); fixed by its position in [`IndexProfile::EVERY`], never grey.
pub fn profile_colour(name: &str) -> RGBColor {
    let i = IndexProfile::EVERY
        .iter()
        .position(|p| p.name() == name)
        .unwrap_or(PROFILE_COLOURS.len() - 1);
    PROFILE_COLOURS[i]
}

/// Rank-axis labels: integers (`1`, `10`, `1000`); [`rank_ticks`] puts ticks nowhere else, so
/// the empty string (for a fractional value) is never drawn beside a tick.
pub fn rank_label(v: &f64) -> String {
    if *v >= 1.0 && (v - v.round()).abs() < 1e-6 {
        format!("{}", v.round() as u64)
    } else {
        String::new()
    }
}

/// Upper end of a log rank axis holding `max`, with head room for labels.
pub(crate) fn rank_axis_top(max: f64) -> f64 {
    (max.max(2.0) * 2.5).max(10.0)
}

/// Lower end of every log rank axis (rank 1 sits a little above the bottom).
const RANK_AXIS_BOTTOM: f64 = 0.7;

/// The ticks of a log rank axis from `RANK_AXIS_BOTTOM` to `top`: (labelled, mesh only). The
/// labelled ones are the powers of ten up to `top`, with 2 and 5 times each when the axis spans
/// fewer than two decades (1, 2, 5, 10, 20); every one is an integer, so [`rank_label`] labels
/// it. The mesh lines (no tick, no label) are the integers 1-9 times each power of ten.
pub fn rank_ticks(top: f64) -> (Vec<f64>, Vec<f64>) {
    let decades: Vec<f64> = std::iter::successors(Some(1.0f64), |p| Some(p * 10.0))
        .take_while(|p| *p <= top)
        .collect();
    let multiples: &[f64] = if decades.len() < 3 {
        &[1.0, 2.0, 5.0]
    } else {
        &[1.0]
    };
    let within = |v: &f64| *v <= top;
    let labelled = decades
        .iter()
        .flat_map(|p| multiples.iter().map(move |m| m * p))
        .filter(within)
        .collect();
    let mesh = decades
        .iter()
        .flat_map(|p| (1..=9).map(move |m| f64::from(m) * p))
        .filter(within)
        .collect();
    (labelled, mesh)
}

/// A log rank axis from `RANK_AXIS_BOTTOM` to `top`, rank 1 at the bottom, ticked and
/// meshed by [`rank_ticks`] (plotters' own key points would put unlabelled ticks between).
pub(crate) fn rank_axis(top: f64) -> WithKeyPoints<LogCoord<f64>> {
    let (labelled, mesh) = rank_ticks(top);
    (RANK_AXIS_BOTTOM..top)
        .log_scale()
        .with_key_points(labelled)
        .with_light_points(mesh)
}

/// Least room between two neighbouring axis labels, in pixels ([`spaced_ticks`]).
pub const TICK_GAP: u32 = 8;

/// Width of the legend column to the right of line plots (never over the data).
pub(crate) const LEGEND_W: u32 = 270;

/// The categories of an axis of `n` to label when there is room for at most `max` labels:
/// all when `n <= max`, else the first, the last, and every `step`-th between, `step` the
/// smallest of 1, 2, 5, 10, 20, 50, ... that keeps them within `max`; a multiple closer to
/// the last than half a step is dropped, so no two labels crowd.
pub fn thin_ticks(n: usize, max: usize) -> Vec<usize> {
    if n <= max.max(2) {
        return (0..n).collect();
    }
    let need = (n - 1) as f64 / (max.max(2) - 1) as f64;
    let mut step = 1usize;
    'search: for scale in std::iter::successors(Some(1usize), |s| s.checked_mul(10)) {
        for m in [1, 2, 5] {
            step = m * scale;
            if step as f64 >= need {
                break 'search;
            }
        }
    }
    let mut ticks: Vec<usize> = (0..n - 1).step_by(step).collect();
    if let Some(&last) = ticks.last() {
        if last > 0 && 2 * (n - 1 - last) < step {
            ticks.pop();
        }
    }
    ticks.push(n - 1);
    ticks
}

/// A linear axis over `range` ticked (and labelled) at `labelled` only, with mesh lines at
/// `mesh`: plotters' own key points of an f64 axis fall on round numbers, not on the CSA layers
/// or lengths a plot measured, and any it does not label would be ticks without a label.
pub(crate) struct TickedAxis {
    pub range: std::ops::Range<f64>,
    pub labelled: Vec<f64>,
    pub mesh: Vec<f64>,
}

impl Ranged for TickedAxis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let span = self.range.end - self.range.start;
        let share = if span > 0.0 {
            (value - self.range.start) / span
        } else {
            0.5
        };
        limit.0 + (f64::from(limit.1 - limit.0) * share + 1e-3).floor() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            self.mesh.clone()
        } else {
            self.labelled.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.range.clone()
    }
}

/// The labels of an axis to draw so that none overlaps its neighbour: indices into `centres`
/// (ascending pixel positions along the axis) whose labels are `widths` pixels long. All of
/// them when every two neighbours leave `gap` pixels between their labels, else the most of
/// [`thin_ticks`]' evenly spaced choices that do (the first always kept), down to the first
/// alone.
pub fn spaced_ticks(centres: &[f64], widths: &[u32], gap: u32) -> Vec<usize> {
    let n = centres.len().min(widths.len());
    let apart = |a: usize, b: usize| {
        centres[b] - centres[a] >= f64::from(widths[a] + widths[b]) / 2.0 + f64::from(gap)
    };
    for max in (2..=n.max(2)).rev() {
        let ticks = thin_ticks(n, max);
        if ticks.windows(2).all(|w| apart(w[0], w[1])) {
            return ticks;
        }
    }
    (0..n.min(1)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A render whose rename fails (the final name is a directory) is an error naming the plot
    /// and leaves no temporary behind.
    #[test]
    fn a_failed_rename_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("heatmap_fp8_64.png");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("inside"), "x").unwrap();
        let err = atomically(&path, |tmp| {
            std::fs::write(tmp, b"png").unwrap();
            Ok(())
        })
        .unwrap_err();
        assert!(err.to_string().contains("heatmap_fp8_64.png"), "{err}");
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from("heatmap_fp8_64.png")]);
    }
}
