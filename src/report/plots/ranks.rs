//! `rank_vs_length.png`: the median (solid line, filled markers) and worst (dashed line,
//! hollow markers) `min_needle_rank` over depths and samples against context length, one series
//! per (index profile, top-k) (and kv when a run mixes kv modes). Colour tells the profile
//! ([`profile_colour`], as in every plot), the marker's shape the top-k (and kv); series of one
//! profile with identical points are drawn once with the first top-k's marker, and a legend
//! note names the top-k values they stand for. Every other series sits in a lane of its own a
//! few pixels beside and above its neighbour ([`lane_offsets`]), so series of one colour with
//! nearly the same ranks stay visible as two lines. Both axes are log scale: x ticked at the
//! measured lengths ("2k", "4k", ...; thinned so that no two labels touch, every tick
//! labelled); rank 1 at the bottom. The run's top-k values are grey dotted horizontal lines.
//! The legend sits in a column right of the plot: one key per profile, one per top-k marker,
//! the two line styles and what they are taken over ([`line_style_legend`]: a point is over
//! depths and samples, so a line does not follow one needle position; with one depth, that
//! depth); it always fits (`legend::legend_layout`). The numbers are those of
//! [`crate::report::summary::summarize`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::legend::{
    draw_mark, draw_rows, note_rows, row_text, Key, LegendRow, Mark, Stroke, MARKS,
};
use super::{
    canvas, plot_err, profile_colour, rank_axis, rank_axis_top, rank_label, spaced_ticks, subtitle,
    text_width, TickedAxis, AXIS_PX, FONT, LABEL_PX, LEGEND_W, SIZE, TICK_GAP,
};
use crate::record::IndexProfile;
use crate::report::error::Result;
use crate::report::store::RunRecords;
use crate::report::summary::{summarize, GroupSummary};
use crate::units::{format_tokens, percent_label};

/// Colour of the top-k lines and of the legend's style-only keys.
const GREY: RGBColor = RGBColor(130, 130, 130);
const DARK: RGBColor = RGBColor(70, 70, 70);
/// Chart margins and label areas: the data area spans x from `MARGIN + Y_LABELS_W` to
/// `SIZE.0 - LEGEND_W - MARGIN_RIGHT - 1` on the canvas.
const MARGIN: u32 = 14;
const MARGIN_RIGHT: u32 = 10;
const Y_LABELS_W: u32 = 96;

pub(crate) fn render(records: &RunRecords, path: &Path) -> Result<()> {
    let groups = summarize(&records.cells, &Default::default());
    let mixed_kv = groups
        .iter()
        .map(|g| g.kv.name())
        .collect::<BTreeSet<_>>()
        .len()
        > 1;
    let kv_part = |g: &GroupSummary| {
        if mixed_kv {
            format!(" kv {}", g.kv)
        } else {
            String::new()
        }
    };
    // Series (profile [kv], top-k) in profile order, then kv, then top-k.
    let mut series: BTreeMap<(String, usize), Vec<&GroupSummary>> = BTreeMap::new();
    for g in &groups {
        let name = format!("{}{}", g.index, kv_part(g));
        series.entry((name, g.topk)).or_default().push(g);
    }
    let rank_of = |key: &(String, usize)| {
        let g = series[key][0];
        let p = IndexProfile::EVERY.iter().position(|p| *p == g.index);
        (p, g.kv.name(), key.1)
    };
    let mut order: Vec<(String, usize)> = series.keys().cloned().collect();
    order.sort_by_key(|k| rank_of(k));
    // The marker of a series: its (kv, top-k) among the run's.
    let marker_keys: Vec<(String, usize)> = groups
        .iter()
        .map(|g| (kv_part(g), g.topk))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let mark_of = |g: &GroupSummary| {
        let i = marker_keys
            .iter()
            .position(|m| *m == (kv_part(g), g.topk))
            .unwrap_or(0);
        MARKS[i % MARKS.len()]
    };

    let lengths: BTreeSet<usize> = groups.iter().map(|g| g.target_tokens).collect();
    let x = |n: usize| (n.max(1) as f64).log2();
    let (xlo, xhi) = (
        x(*lengths.first().unwrap_or(&1)),
        x(*lengths.last().unwrap_or(&1)),
    );
    let pad = if xhi - xlo < 1.0 { 0.5 } else { 0.25 };
    let topks: BTreeSet<usize> = groups.iter().map(|g| g.topk).collect();
    let worst = groups
        .iter()
        .filter_map(|g| g.worst_rank)
        .max()
        .unwrap_or(1);
    let top = rank_axis_top(worst.max(*topks.last().unwrap_or(&1)) as f64);

    let mut profiles: Vec<IndexProfile> = groups.iter().map(|g| g.index).collect();
    profiles.sort_by_key(|p| IndexProfile::EVERY.iter().position(|q| q == p));
    profiles.dedup();
    let names: Vec<&str> = profiles.iter().map(|p| p.name()).collect();
    let ks: Vec<String> = topks.iter().map(|k| k.to_string()).collect();
    let mut parts = vec![
        format!("index {}", names.join(", ")),
        format!("top-k {}", ks.join(", ")),
    ];
    if let Some(planned) = records.info.cells_planned() {
        if records.cells.len() < planned {
            parts.push(format!("{} of {planned} cells", records.cells.len()));
        }
    }
    let sub = subtitle(&records.info, &parts);
    let (root, body) = canvas(
        path,
        &records.info,
        "Needle rank against context length",
        &sub,
    )?;
    let err = plot_err(path);
    let (plot_area, legend_area) = body.split_horizontally(SIZE.0 - LEGEND_W);
    // Ticks at the measured lengths, as many as have room for their labels.
    let lengths: Vec<usize> = lengths.into_iter().collect();
    let labels: Vec<String> = lengths.iter().map(|&n| format_tokens(n)).collect();
    let (x0, x1) = (
        f64::from(MARGIN + Y_LABELS_W),
        f64::from(SIZE.0 - LEGEND_W - MARGIN_RIGHT - 1),
    );
    let centres: Vec<f64> = lengths
        .iter()
        .map(|&n| x0 + (x(n) - (xlo - pad)) / (xhi - xlo + 2.0 * pad) * (x1 - x0))
        .collect();
    let widths: Vec<u32> = labels.iter().map(|l| text_width(l, LABEL_PX)).collect();
    let ticked = spaced_ticks(&centres, &widths, TICK_GAP);
    let x_axis = TickedAxis {
        range: (xlo - pad)..(xhi + pad),
        labelled: ticked.iter().map(|&i| x(lengths[i])).collect(),
        mesh: lengths.iter().map(|&n| x(n)).collect(),
    };
    let mut chart = ChartBuilder::on(&plot_area)
        .margin(MARGIN)
        .margin_right(MARGIN_RIGHT)
        .x_label_area_size(64)
        .y_label_area_size(Y_LABELS_W)
        .build_cartesian_2d(x_axis, rank_axis(top))
        .map_err(&err)?;
    let tick_label = |v: &f64| {
        ticked
            .iter()
            .find(|&&i| (x(lengths[i]) - v).abs() < 1e-9)
            .map_or_else(String::new, |&i| labels[i].clone())
    };
    chart
        .configure_mesh()
        .x_label_formatter(&tick_label)
        .y_label_formatter(&rank_label)
        .x_desc("context length (tokens, log scale)")
        .y_desc(format!(
            "needle rank on the worst {} (log, 1 = best)",
            crate::record::verdict::LayerWord::of(&records.layers).noun()
        ))
        .label_style((FONT, LABEL_PX))
        .axis_desc_style((FONT, AXIS_PX))
        .light_line_style(RGBColor(238, 238, 238))
        .bold_line_style(RGBColor(215, 215, 215))
        .draw()
        .map_err(&err)?;

    let x_range = [xlo - pad, xhi + pad];
    for &k in &topks {
        chart
            .draw_series(DashedLineSeries::new(
                x_range.iter().map(|&v| (v, k as f64)),
                3,
                5,
                GREY.stroke_width(2),
            ))
            .map_err(&err)?;
        chart
            .draw_series(std::iter::once(Text::new(
                format!("top-k {k}"),
                (xlo - pad, k as f64),
                (FONT, 16)
                    .into_font()
                    .color(&GREY)
                    .pos(Pos::new(HPos::Left, VPos::Bottom)),
            )))
            .map_err(&err)?;
    }

    // Series of one profile whose points are all equal (top-k values that did not change the
    // hidden states, e.g. on a planted model) would hide one another: drawn once, named in a
    // note with every such k.
    let points = |key: &(String, usize)| -> Vec<(usize, Option<u64>, Option<usize>)> {
        series[key]
            .iter()
            .map(|g| {
                (
                    g.target_tokens,
                    g.median_rank.map(f64::to_bits),
                    g.worst_rank,
                )
            })
            .collect()
    };
    let drawn = merge_identical(&order, points);

    // Every drawn series sits in a lane of its own, a few pixels beside and above the next
    // ([`lane_offsets`]): series of one profile (one colour) with nearly the same ranks stay two
    // visible lines with their own markers instead of one covering the other.
    let lanes = lane_offsets(drawn.len());
    let mut notes = Vec::new();
    for ((key, same_ks), &(dx, dy)) in drawn.iter().zip(&lanes) {
        let gs = &series[key];
        let (colour, mark) = (profile_colour(gs[0].index.name()), mark_of(gs[0]));
        let pixels = |points: Vec<(f64, f64)>| -> Vec<(i32, i32)> {
            points
                .iter()
                .map(|p| {
                    let (px, py) = chart.backend_coord(p);
                    (px + dx, py + dy)
                })
                .collect()
        };
        let median = pixels(
            gs.iter()
                .filter_map(|g| g.median_rank.map(|m| (x(g.target_tokens), m.max(1.0))))
                .collect(),
        );
        let worst = pixels(
            gs.iter()
                .filter_map(|g| g.worst_rank.map(|w| (x(g.target_tokens), w.max(1) as f64)))
                .collect(),
        );
        root.draw(&PathElement::new(median.clone(), colour.stroke_width(3)))
            .map_err(&err)?;
        root.draw(&plotters::element::DashedPathElement::new(
            worst.clone(),
            9,
            6,
            colour.stroke_width(2),
        ))
        .map_err(&err)?;
        for (points, filled) in [(&median, true), (&worst, false)] {
            for &c in points {
                draw_mark(&root, c, mark, colour, filled, 5, path)?;
            }
        }
        if same_ks.len() > 1 {
            let ks: Vec<String> = same_ks.iter().map(|k| k.to_string()).collect();
            notes.push(format!("{}: k={} same ranks", key.0, ks.join(",")));
        }
    }

    let key = LegendRow::key;
    let mut rows = vec![LegendRow::Heading("colour: index profile".into())];
    for p in &profiles {
        rows.push(key(
            profile_colour(p.name()),
            3,
            Stroke::Solid,
            Mark::None,
            true,
            p.name().to_string(),
        ));
    }
    rows.push(LegendRow::Heading("marker: top-k".into()));
    for (i, (kv, k)) in marker_keys.iter().enumerate() {
        let mark = MARKS[i % MARKS.len()];
        rows.push(key(DARK, 2, Stroke::None, mark, true, format!("k={k}{kv}")));
    }
    let depths: Vec<f64> = {
        let mut d: Vec<f64> = records.cells.iter().map(|c| c.depth_pct).collect();
        d.sort_by(f64::total_cmp);
        d.dedup();
        d
    };
    let mut per_point: BTreeMap<(usize, u64, String, &str, usize), usize> = BTreeMap::new();
    for c in &records.cells {
        let at = (
            c.target_tokens,
            c.depth_pct.to_bits(),
            c.index.to_string(),
            c.kv.name(),
            c.topk,
        );
        *per_point.entry(at).or_default() += 1;
    }
    let samples = per_point.values().copied().max().unwrap_or(1);
    rows.extend(line_style_rows(&depths, samples));
    if !notes.is_empty() {
        rows.push(LegendRow::Note("drawn once (identical):".into()));
        rows.extend(notes.into_iter().map(LegendRow::Note));
    }
    draw_rows(&legend_area, &rows, path)?;
    root.present().map_err(&err)?;
    Ok(())
}

/// The legend's line-style rows: the median and worst keys, and a note on what a point is
/// taken over. With several depths a point gathers them all (and the samples), so the note says
/// that a line joins lengths, not one needle position, and that its worst points may come from
/// different depths; with one depth it names it.
fn line_style_rows(depths: &[f64], samples: usize) -> Vec<LegendRow> {
    let key = |width, stroke, label: &str| {
        LegendRow::Key(Key {
            colour: DARK,
            width,
            stroke,
            mark: Mark::None,
            filled: true,
            label: label.to_string(),
        })
    };
    let mut rows = vec![
        LegendRow::Heading("line style".into()),
        key(3, Stroke::Solid, "median (filled markers)"),
        key(2, Stroke::Dashed, "worst (hollow markers)"),
        LegendRow::Key(Key {
            colour: GREY,
            width: 2,
            stroke: Stroke::Dotted,
            mark: Mark::None,
            filled: true,
            label: "top-k of the run".into(),
        }),
    ];
    let samples_part = if samples > 1 {
        format!(" and {samples} samples")
    } else {
        String::new()
    };
    let note = match depths {
        [] => String::new(),
        [depth] if samples > 1 => format!(
            "median and worst over {samples} samples per length, all at depth {}",
            percent_label(*depth)
        ),
        [depth] => format!(
            "one cell per length, at depth {} (median = worst)",
            percent_label(*depth)
        ),
        [first, .., last] => format!(
            "median and worst over {} depths ({} to {}){samples_part} per length: a line does \
             not follow one needle position, its worst points may come from different depths",
            depths.len(),
            percent_label(*first),
            percent_label(*last)
        ),
    };
    rows.extend(note_rows(&note));
    rows
}

/// The text of the line-style rows of rank_vs_length.png's legend for a run over `depths`
/// with at most `samples` cells per (length, depth, series), top-down.
pub fn line_style_legend(depths: &[f64], samples: usize) -> Vec<String> {
    line_style_rows(depths, samples)
        .iter()
        .map(|r| row_text(r).to_string())
        .collect()
}

/// `order`'s (profile, top-k) series with those of one profile and equal `points` merged into
/// the first, which lists every top-k merged into it (in order).
fn merge_identical<P: PartialEq>(
    order: &[(String, usize)],
    points: impl Fn(&(String, usize)) -> P,
) -> Vec<((String, usize), Vec<usize>)> {
    let mut drawn: Vec<((String, usize), Vec<usize>)> = Vec::new();
    for key in order {
        match drawn
            .iter_mut()
            .find(|(d, _)| d.0 == key.0 && points(d) == points(key))
        {
            Some((_, ks)) => ks.push(key.1),
            None => drawn.push((key.clone(), vec![key.1])),
        }
    }
    drawn
}

/// Horizontal step between the lanes of neighbouring series, in pixels (a marker is 10 wide).
const LANE_DX: i32 = 7;
/// Vertical step between lanes, in pixels: lines at equal ranks (3 px wide) stay apart.
const LANE_DY: i32 = 4;

/// The pixel offset of each of `n` drawn series, centred on the true point: series `i` is
/// `(i - (n-1)/2)` steps right and up. A few pixels on a log rank axis never move a point
/// across a rank a reader could tell apart.
fn lane_offsets(n: usize) -> Vec<(i32, i32)> {
    (0..n)
        .map(|i| {
            let step = 2 * i as i32 - (n as i32 - 1);
            (step * LANE_DX / 2, -step * LANE_DY / 2)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{lane_offsets, merge_identical, LANE_DX};

    /// Every drawn series has its own lane: no two share an x or a y offset, so two series of
    /// one colour with the same ranks are two lines and two rows of markers (before, fp8 at
    /// top-64 and top-128 drew one line over the other).
    #[test]
    fn every_series_has_a_lane_of_its_own() {
        for n in 1..=8 {
            let lanes = lane_offsets(n);
            assert_eq!(lanes.len(), n);
            let mut xs: Vec<i32> = lanes.iter().map(|l| l.0).collect();
            let mut ys: Vec<i32> = lanes.iter().map(|l| l.1).collect();
            xs.dedup();
            ys.dedup();
            assert_eq!((xs.len(), ys.len()), (n, n), "{lanes:?}");
            // Centred: the lanes straddle the true point.
            assert_eq!(lanes.iter().map(|l| l.0).sum::<i32>(), 0, "{lanes:?}");
            let width = lanes.iter().map(|l| l.0).max().unwrap() - lanes[0].0;
            assert!(width <= LANE_DX * 7, "{lanes:?}");
        }
        assert_eq!(lane_offsets(1), [(0, 0)]);
        let two = lane_offsets(2);
        assert!(
            two[1].0 - two[0].0 >= 6 && two[0].1 - two[1].1 >= 3,
            "{two:?}"
        );
    }

    #[test]
    fn series_of_one_profile_with_equal_points_are_drawn_once() {
        let order: Vec<(String, usize)> = [("fp8", 64), ("fp8", 128), ("bf16", 64), ("bf16", 128)]
            .iter()
            .map(|(p, k)| (p.to_string(), *k))
            .collect();
        // fp8 ranks do not depend on k; bf16's do; exact equality across profiles never merges.
        let points = |key: &(String, usize)| match (key.0.as_str(), key.1) {
            ("fp8", _) | ("bf16", 64) => vec![3, 9],
            _ => vec![3, 8],
        };
        let drawn = merge_identical(&order, points);
        let labels: Vec<(String, Vec<usize>)> =
            drawn.into_iter().map(|((p, _), ks)| (p, ks)).collect();
        assert_eq!(
            labels,
            vec![
                ("fp8".to_string(), vec![64, 128]),
                ("bf16".to_string(), vec![64]),
                ("bf16".to_string(), vec![128]),
            ]
        );
    }
}
