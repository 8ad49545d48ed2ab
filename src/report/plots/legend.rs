//! Legends and point markers shared by the plots.
//!
//! Line plots (layers_*.png, rank_vs_length.png) put their legend in a column right of the data
//! (`draw_rows`): headings, keys (a line sample with a marker, and a label) and grey notes,
//! top-down. [`legend_layout`] spaces the rows so that they always fit the column: the pitch
//! shrinks from 28 to 20 px, and rows that still do not fit are replaced by one "… and N more"
//! line. Labels are shortened in the middle to the column's width (`drawn_text` says what a
//! row shows); a note too long for one row is wrapped onto several (`note_rows`). The
//! heatmap's legend is a band under the grid whose swatches flow onto as many lines as they
//! need ([`flow`]).

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::text::{ellipsize_middle, wrap_words};
use super::{plot_err, FONT, LEGEND_W};
use crate::report::error::Result;

/// How a legend key's line is drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Stroke {
    /// No line: the key shows its marker only.
    None,
    Solid,
    Dashed,
    Dotted,
}

impl Stroke {
    /// (dash, gap) lengths in pixels of a dashed or dotted line on the data; None when solid
    /// or not drawn.
    pub(crate) fn pattern(self) -> Option<(u32, u32)> {
        match self {
            Stroke::Dashed => Some((10, 6)),
            Stroke::Dotted => Some((2, 5)),
            Stroke::None | Stroke::Solid => None,
        }
    }
}

/// A point marker (on the data and on legend keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    None,
    Circle,
    Triangle,
    Square,
    Diamond,
    TriangleDown,
    Cross,
    TriangleRight,
    Plus,
}

/// Markers told apart by shape, in the order series get them (as many as there are index
/// profiles, so each profile of a layer plot has its own).
pub const MARKS: [Mark; 8] = [
    Mark::Circle,
    Mark::Triangle,
    Mark::Square,
    Mark::Diamond,
    Mark::TriangleDown,
    Mark::Cross,
    Mark::TriangleRight,
    Mark::Plus,
];

/// One legend key: a line sample (with marker) and its label.
pub(crate) struct Key {
    pub colour: RGBColor,
    pub width: u32,
    pub stroke: Stroke,
    pub mark: Mark,
    /// Filled marker, or its outline only.
    pub filled: bool,
    pub label: String,
}

/// One line of a legend column.
pub(crate) enum LegendRow {
    /// What a group of keys varies (black text).
    Heading(String),
    Key(Key),
    /// Grey text.
    Note(String),
}

impl LegendRow {
    /// A [`LegendRow::Key`].
    pub(crate) fn key(
        colour: RGBColor,
        width: u32,
        stroke: Stroke,
        mark: Mark,
        filled: bool,
        label: String,
    ) -> LegendRow {
        LegendRow::Key(Key {
            colour,
            width,
            stroke,
            mark,
            filled,
            label,
        })
    }
}

/// Where the rows of a legend column go: row i is centred at `top + i * pitch`; the first
/// `shown` rows are drawn, and when `more` the next line says how many were left out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LegendLayout {
    pub top: i32,
    pub pitch: i32,
    pub shown: usize,
    pub more: bool,
}

/// Text size of legend rows.
pub const LEGEND_PX: u32 = 16;
/// Largest and smallest row pitch.
const PITCH: (i32, i32) = (28, 20);
/// Room a row needs below its centre (half a line of text and a margin).
const BELOW: i32 = 12;

/// The layout of `rows` legend rows in a column `height` pixels tall: every drawn row (and
/// the "… and N more" line) ends inside the column.
pub fn legend_layout(rows: usize, height: u32) -> LegendLayout {
    let top = 24;
    let room = height as i32 - BELOW - top;
    let fits = |pitch: i32| if room < 0 { 0 } else { room / pitch + 1 } as usize;
    let pitch = if rows > 1 {
        (room / (rows as i32 - 1)).clamp(PITCH.1, PITCH.0)
    } else {
        PITCH.0
    };
    let capacity = fits(pitch);
    if rows <= capacity {
        LegendLayout {
            top,
            pitch,
            shown: rows,
            more: false,
        }
    } else {
        LegendLayout {
            top,
            pitch,
            shown: capacity.saturating_sub(1),
            more: capacity > 0,
        }
    }
}

/// Draws `mark` centred at `c` (pixels of `area`), `r` pixels from centre to edge.
pub(crate) fn draw_mark<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    (x, y): (i32, i32),
    mark: Mark,
    colour: RGBColor,
    filled: bool,
    r: i32,
    path: &Path,
) -> Result<()> {
    let err = plot_err(path);
    let style = if filled {
        colour.filled()
    } else {
        colour.stroke_width(2)
    };
    // A hollow marker is white inside, so the line it sits on does not run through it.
    let polygon = |points: Vec<(i32, i32)>| -> Result<()> {
        if filled {
            area.draw(&Polygon::new(points, style)).map_err(&err)
        } else {
            area.draw(&Polygon::new(points.clone(), WHITE.filled()))
                .map_err(&err)?;
            let mut closed = points.clone();
            closed.push(points[0]);
            area.draw(&PathElement::new(closed, style)).map_err(&err)
        }
    };
    match mark {
        Mark::None => Ok(()),
        Mark::Circle => {
            if !filled {
                area.draw(&Circle::new((x, y), r, WHITE.filled()))
                    .map_err(&err)?;
            }
            area.draw(&Circle::new((x, y), r, style)).map_err(&err)
        }
        Mark::Square => {
            let s = r - 1;
            polygon(vec![
                (x - s, y - s),
                (x + s, y - s),
                (x + s, y + s),
                (x - s, y + s),
            ])
        }
        Mark::Triangle => polygon(vec![(x, y - r - 1), (x + r, y + r - 1), (x - r, y + r - 1)]),
        Mark::TriangleDown => polygon(vec![(x, y + r + 1), (x + r, y - r + 1), (x - r, y - r + 1)]),
        Mark::Diamond => polygon(vec![
            (x, y - r - 1),
            (x + r + 1, y),
            (x, y + r + 1),
            (x - r - 1, y),
        ]),
        Mark::TriangleRight => {
            polygon(vec![(x + r + 1, y), (x - r + 1, y - r), (x - r + 1, y + r)])
        }
        Mark::Cross | Mark::Plus => {
            let line = colour.stroke_width(if filled { 3 } else { 2 });
            let strokes = if mark == Mark::Cross {
                [
                    ((x - r, y - r), (x + r, y + r)),
                    ((x - r, y + r), (x + r, y - r)),
                ]
            } else {
                [
                    ((x - r - 1, y), (x + r + 1, y)),
                    ((x, y - r - 1), (x, y + r + 1)),
                ]
            };
            for (a, b) in strokes {
                area.draw(&PathElement::new(vec![a, b], line))
                    .map_err(&err)?;
            }
            Ok(())
        }
    }
}

/// Widest text of a heading or note, and of a key's label (right of its line sample).
const TEXT_W: u32 = LEGEND_W - 12;
const KEY_LABEL_W: u32 = LEGEND_W - (KEY_LINE.1 as u32 + 10) - 6;
/// Where a key's line sample starts and ends.
const KEY_LINE: (i32, i32) = (6, 44);

/// The text of `row` in full (a key's label, a heading's or note's text).
pub(crate) fn row_text(row: &LegendRow) -> &str {
    match row {
        LegendRow::Heading(text) | LegendRow::Note(text) => text,
        LegendRow::Key(k) => &k.label,
    }
}

/// The text `row` shows: [`row_text`], shortened in the middle when it is wider than its place.
pub(crate) fn drawn_text(row: &LegendRow) -> String {
    let width = match row {
        LegendRow::Key(_) => KEY_LABEL_W,
        _ => TEXT_W,
    };
    ellipsize_middle(row_text(row), LEGEND_PX, width)
}

/// `text` as grey note rows, wrapped at spaces to the column's width.
pub(crate) fn note_rows(text: &str) -> impl Iterator<Item = LegendRow> {
    wrap_words(text, LEGEND_PX, TEXT_W)
        .into_iter()
        .map(LegendRow::Note)
}

/// Draws `rows` top-down into `area` (the legend column), placed by [`legend_layout`].
pub(crate) fn draw_rows<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    rows: &[LegendRow],
    path: &Path,
) -> Result<()> {
    let err = plot_err(path);
    let (_, height) = area.dim_in_pixel();
    let layout = legend_layout(rows.len(), height);
    let left = Pos::new(HPos::Left, VPos::Center);
    let black = (FONT, LEGEND_PX).into_font().color(&BLACK).pos(left);
    let grey = (FONT, LEGEND_PX)
        .into_font()
        .color(&RGBColor(90, 90, 90))
        .pos(left);
    let (x0, x1) = KEY_LINE;
    for (i, row) in rows.iter().take(layout.shown).enumerate() {
        let y = layout.top + layout.pitch * i as i32;
        let k = match row {
            LegendRow::Heading(_) => {
                area.draw(&Text::new(drawn_text(row), (x0, y), black.clone()))
                    .map_err(&err)?;
                continue;
            }
            LegendRow::Note(_) => {
                area.draw(&Text::new(drawn_text(row), (x0, y), grey.clone()))
                    .map_err(&err)?;
                continue;
            }
            LegendRow::Key(k) => k,
        };
        let line = k.colour.stroke_width(k.width);
        let dashes: Vec<(i32, i32)> = match k.stroke {
            Stroke::None => vec![],
            Stroke::Solid => vec![(x0, x1)],
            Stroke::Dashed => (x0..x1).step_by(13).map(|a| (a, (a + 8).min(x1))).collect(),
            Stroke::Dotted => (x0..x1).step_by(6).map(|a| (a, a + 2)).collect(),
        };
        for (a, b) in dashes {
            area.draw(&PathElement::new(vec![(a, y), (b, y)], line))
                .map_err(&err)?;
        }
        let c = ((x0 + x1) / 2, y);
        draw_mark(area, c, k.mark, k.colour, k.filled, 5, path)?;
        area.draw(&Text::new(drawn_text(row), (x1 + 10, y), black.clone()))
            .map_err(&err)?;
    }
    if layout.more {
        let y = layout.top + layout.pitch * layout.shown as i32;
        let text = format!("… and {} more", rows.len() - layout.shown);
        area.draw(&Text::new(text, (x0, y), grey.clone()))
            .map_err(&err)?;
    }
    Ok(())
}

/// Places items of `widths` pixels left to right, `gap` apart, starting a new line whenever
/// the next would end past `max_w`: (line, x) of each item. An item wider than `max_w` gets a
/// line of its own.
pub fn flow(widths: &[u32], gap: u32, max_w: u32) -> Vec<(usize, u32)> {
    let mut out = Vec::with_capacity(widths.len());
    let (mut line, mut x) = (0usize, 0u32);
    for &w in widths {
        if x > 0 && x + w > max_w {
            line += 1;
            x = 0;
        }
        out.push((line, x));
        x += w + gap;
    }
    out
}
