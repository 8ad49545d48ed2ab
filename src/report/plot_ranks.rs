//! `rank_vs_length.png`: the median (solid) and worst (dashed) `min_needle_rank` over depths and
//! samples against context length, one colour per (index profile, top-k) (and kv when a run
//! mixes kv modes; series of one profile with identical points are drawn once, labelled
//! `k=64,128`). Both axes are log scale: x in powers of two labelled "2k", "4k", ...; rank 1
//! at the bottom. The run's top-k values are grey dotted horizontal lines; the legend sits in a
//! column right of the plot. The numbers are those
//! of [`super::summary::summarize`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::error::Result;
use super::plots::{
    canvas, draw_keys, plot_err, rank_axis_top, rank_label, subtitle, Key, Mark, Stroke, AXIS_PX,
    FONT, LABEL_PX, LEGEND_W, PALETTE, SIZE,
};
use super::records::format_tokens;
use super::store::RunRecords;
use super::summary::{summarize, GroupSummary};

pub(crate) fn render(records: &RunRecords, path: &Path) -> Result<()> {
    let groups = summarize(&records.cells, &Default::default());
    let kvs: BTreeSet<&str> = groups.iter().map(|g| g.kv.name()).collect();
    // Series in summary order: (profile, kv, topk) as first met while lengths ascend.
    let mut series: BTreeMap<(String, usize), Vec<&GroupSummary>> = BTreeMap::new();
    let mut order: Vec<(String, usize)> = Vec::new();
    for g in &groups {
        let name = if kvs.len() > 1 {
            format!("{} kv {}", g.index, g.kv)
        } else {
            g.index.to_string()
        };
        let key = (name, g.topk);
        if !series.contains_key(&key) {
            order.push(key.clone());
        }
        series.entry(key).or_default().push(g);
    }
    order.sort_by_key(|(name, k)| {
        let first = &series[&(name.clone(), *k)][0];
        (
            super::records::IndexProfile::ALL
                .iter()
                .position(|p| *p == first.index),
            first.kv.name(),
            *k,
        )
    });

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

    let profiles: BTreeSet<String> = groups.iter().map(|g| g.index.to_string()).collect();
    let ks: Vec<String> = topks.iter().map(|k| k.to_string()).collect();
    let sub = subtitle(
        &records.info,
        &[
            format!(
                "index {}",
                profiles.into_iter().collect::<Vec<_>>().join(", ")
            ),
            format!("top-k {}", ks.join(", ")),
        ],
    );
    let (root, body) = canvas(
        path,
        &records.info,
        "Needle rank against context length",
        &sub,
    )?;
    let err = plot_err(path);
    let (plot_area, legend_area) = body.split_horizontally(SIZE.0 - LEGEND_W);
    let mut chart = ChartBuilder::on(&plot_area)
        .margin(14)
        .margin_right(10)
        .x_label_area_size(64)
        .y_label_area_size(96)
        .build_cartesian_2d((xlo - pad)..(xhi + pad), (0.7f64..top).log_scale())
        .map_err(&err)?;
    let span = (xhi - xlo + 2.0 * pad).ceil() as usize + 1;
    chart
        .configure_mesh()
        .x_labels(span.min(12))
        .x_label_formatter(&|v: &f64| {
            if (v - v.round()).abs() < 1e-6 && *v >= 0.0 {
                format_tokens(1usize << (v.round() as u32).min(40))
            } else {
                String::new()
            }
        })
        .y_label_formatter(&rank_label)
        .x_desc("context length (tokens, log scale)")
        .y_desc("needle rank on the worst CSA layer (log, 1 = best)")
        .label_style((FONT, LABEL_PX))
        .axis_desc_style((FONT, AXIS_PX))
        .light_line_style(RGBColor(238, 238, 238))
        .bold_line_style(RGBColor(215, 215, 215))
        .draw()
        .map_err(&err)?;

    let x_range = [xlo - pad, xhi + pad];
    let grey = RGBColor(130, 130, 130);
    for &k in &topks {
        chart
            .draw_series(DashedLineSeries::new(
                x_range.iter().map(|&v| (v, k as f64)),
                3,
                5,
                grey.stroke_width(2),
            ))
            .map_err(&err)?;
        chart
            .draw_series(std::iter::once(Text::new(
                format!("top-k {k}"),
                (xlo - pad, k as f64),
                (FONT, 16)
                    .into_font()
                    .color(&grey)
                    .pos(Pos::new(HPos::Left, VPos::Bottom)),
            )))
            .map_err(&err)?;
    }

    // Series of one profile whose points are all equal (top-k values that did not change the
    // hidden states, e.g. on a planted model) would hide one another: drawn once, labelled
    // with every such k.
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

    let mut keys = Vec::new();
    for (i, (key, same_ks)) in drawn.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let gs = &series[key];
        let median: Vec<(f64, f64)> = gs
            .iter()
            .filter_map(|g| g.median_rank.map(|m| (x(g.target_tokens), m.max(1.0))))
            .collect();
        let worst: Vec<(f64, f64)> = gs
            .iter()
            .filter_map(|g| g.worst_rank.map(|w| (x(g.target_tokens), w.max(1) as f64)))
            .collect();
        chart
            .draw_series(LineSeries::new(median.clone(), colour.stroke_width(3)))
            .map_err(&err)?;
        chart
            .draw_series(median.iter().map(|&p| Circle::new(p, 5, colour.filled())))
            .map_err(&err)?;
        chart
            .draw_series(DashedLineSeries::new(
                worst.clone(),
                9,
                6,
                colour.stroke_width(2),
            ))
            .map_err(&err)?;
        chart
            .draw_series(
                worst
                    .iter()
                    .map(|&p| TriangleMarker::new(p, 6, colour.filled())),
            )
            .map_err(&err)?;
        let ks: Vec<String> = same_ks.iter().map(|k| k.to_string()).collect();
        let label = format!("{} k={}", key.0, ks.join(","));
        keys.push(Key {
            colour,
            width: 3,
            stroke: Stroke::Solid,
            mark: Mark::Circle,
            label: format!("{label} median"),
        });
        keys.push(Key {
            colour,
            width: 2,
            stroke: Stroke::Dashed,
            mark: Mark::Triangle,
            label: format!("{label} worst"),
        });
    }
    keys.push(Key {
        colour: grey,
        width: 2,
        stroke: Stroke::Dotted,
        mark: Mark::None,
        label: "top-k of the run".into(),
    });
    draw_keys(&legend_area, &keys, &[], path)?;
    root.present().map_err(&err)?;
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::merge_identical;

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
