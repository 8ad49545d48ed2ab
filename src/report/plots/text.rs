//! Measured text for the plots: every string that could outgrow its place (a model directory
//! name, a cell id, a list of profiles, a legend label) is measured in the embedded font and
//! wrapped or shortened before it is drawn, so nothing is cut at the canvas edge.
//!
//! Shortening keeps both ends of a string and puts `…` in the middle: the start of a path and
//! its last characters (a quantisation suffix, a sample number) tell runs apart, the middle
//! rarely does.

use plotters::style::{FontDesc, IntoFont};

use super::FONT;

/// Width in pixels of `text` at `px` in the embedded font (registered on first use).
pub fn text_width(text: &str, px: u32) -> u32 {
    let font: FontDesc = (FONT, px).into_font();
    match super::ensure_font().ok().and(font.box_size(text).ok()) {
        Some((w, _)) => w,
        // Without the font nothing is drawn either; a generous estimate keeps layouts sane.
        None => (text.chars().count() as u32 * px * 3).div_ceil(5),
    }
}

/// `text` unchanged when it is at most `max_w` pixels wide at `px`, else its first and last
/// characters around `…`, as many as fit.
pub fn ellipsize_middle(text: &str, px: u32, max_w: u32) -> String {
    if text_width(text, px) <= max_w {
        return text.to_string();
    }
    let chars: Vec<char> = text.chars().collect();
    let cut = |keep: usize| -> String {
        let head = keep.div_ceil(2);
        let tail = keep - head;
        let mut s: String = chars[..head].iter().collect();
        s.push('…');
        s.extend(&chars[chars.len() - tail..]);
        s
    };
    // The largest number of kept characters that fits (0 keeps only the ellipsis).
    let (mut lo, mut hi) = (0usize, chars.len().saturating_sub(1));
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if text_width(&cut(mid), px) <= max_w {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    cut(lo)
}

/// The separator between the parts of a subtitle.
pub const SEP: &str = " · ";

/// `parts` joined by [`SEP`] into at most `max_lines` lines, each at most `max_w` pixels wide
/// at `px`: as many parts per line as fit (a part never split across lines), a part too wide
/// for a line of its own shortened in the middle, and when the parts need more lines the last
/// line shortened in the middle.
pub fn fit_lines(parts: &[String], px: u32, max_w: u32, max_lines: usize) -> Vec<String> {
    let parts: Vec<String> = parts
        .iter()
        .map(|p| ellipsize_middle(p, px, max_w))
        .collect();
    let mut lines: Vec<String> = Vec::new();
    let mut rest = parts.as_slice();
    while !rest.is_empty() {
        if lines.len() + 1 == max_lines.max(1) {
            lines.push(ellipsize_middle(&rest.join(SEP), px, max_w));
            break;
        }
        let mut n = 1;
        while n < rest.len() && text_width(&rest[..=n].join(SEP), px) <= max_w {
            n += 1;
        }
        lines.push(rest[..n].join(SEP));
        rest = &rest[n..];
    }
    lines
}

/// `text` at the largest size from `px` down to `min_px` at which it fits `max_w`, shortened
/// in the middle at `min_px` when even that is too wide.
pub fn fit_size(text: &str, px: u32, min_px: u32, max_w: u32) -> (String, u32) {
    for size in (min_px..=px).rev() {
        if text_width(text, size) <= max_w {
            return (text.to_string(), size);
        }
    }
    (ellipsize_middle(text, min_px, max_w), min_px)
}

/// `text` broken at spaces into lines of at most `max_w` pixels at `px`, as many as it needs; a
/// word wider than a line of its own is shortened in the middle.
pub fn wrap_words(text: &str, px: u32, max_w: u32) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        let longer = if line.is_empty() {
            word.to_string()
        } else {
            format!("{line} {word}")
        };
        if line.is_empty() || text_width(&longer, px) <= max_w {
            line = longer;
        } else {
            lines.push(ellipsize_middle(&line, px, max_w));
            line = word.to_string();
        }
    }
    if !line.is_empty() {
        lines.push(ellipsize_middle(&line, px, max_w));
    }
    lines
}
