//! Row mapping: which compressed rows hold which tokens and which rows a query can see, named
//! for the probe. The formulas are `config::layers::RowMapping` (a function of ratio and
//! overlap, beside the layer-role table that says which mapping a layer has); this file names
//! V4's two series ([`RowKind`]) and the CSA / HCA needle rows the probe asks for. Exactly
//! docs/architecture.md section 4 (normative) and docs/spec/attention.md 5.4 / 6.5 / 10:
//!
//! - CSA row `w` (ratio 4, overlapping) pools tokens `[4w-4, 4w+3]` (clipped at 0); it exists
//!   once token `4w+3` is processed and is visible to query `t` iff `w < n_t = floor((t+1)/4)`.
//! - HCA row `w` (ratio 128) pools `[128w, 128w+127]`; visible iff `w < floor((t+1)/128)`.
//! - Needle rows of a span `[a, b)`: CSA rows `w` in `[floor(a/4), floor((b-1)/4) + 1]`
//!   (inclusive), restricted to visible rows; HCA rows `[floor(a/128), floor((b-1)/128)]`.
//!
//! Spans are half-open token ranges `(a, b)`; rows are returned as half-open `Range<usize>`,
//! empty for an empty span. Worked example (docs/spec/attention.md 10): needle `[1000, 1012)` -> CSA rows
//! 250..=253, row 250 visible from t = 1003, row 253 from t = 1015; HCA row 7 from t = 1023.

use std::ops::Range;

use crate::config::{LayerKind, RowMapping};

/// CSA compression ratio (overlapping windows of 8 tokens, stride 4).
pub const CSA_RATIO: usize = RowMapping::CSA.ratio;
/// HCA compression ratio (non-overlapping windows of 128 tokens).
pub const HCA_RATIO: usize = RowMapping::HCA.ratio;

/// Which compressed series a row belongs to: a name for the two [`RowMapping`]s of V4, whose
/// formulas live in `config::layers` (the table of layer roles supplies a layer's mapping).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowKind {
    /// Ratio 4, overlapping (`[4w-4, 4w+3]`).
    Csa,
    /// Ratio 128, non-overlapping (`[128w, 128w+127]`).
    Hca,
}

impl RowKind {
    /// The token-to-row mapping of this series.
    pub fn mapping(self) -> RowMapping {
        match self {
            RowKind::Csa => RowMapping::CSA,
            RowKind::Hca => RowMapping::HCA,
        }
    }

    pub fn ratio(self) -> usize {
        self.mapping().ratio
    }

    /// From a layer's compression ratio (4 or 128); `None` for 0 (SWA) or anything else.
    pub fn from_ratio(ratio: usize) -> Option<Self> {
        match LayerKind::from_ratio(ratio)? {
            LayerKind::Csa => Some(RowKind::Csa),
            LayerKind::Hca => Some(RowKind::Hca),
            // `from_ratio` reads V4 ratios only: never a V4.1 kind.
            LayerKind::Swa | LayerKind::Csa2 | LayerKind::Csa1 => None,
        }
    }

    /// Tokens pooled by row `w`, inclusive `(first, last)`.
    pub fn row_tokens(self, w: usize) -> (usize, usize) {
        self.mapping().row_tokens(w)
    }

    /// Number of rows visible to query `t`: `floor((t+1)/ratio)` (rows `0..n_t`).
    pub fn visible_rows(self, t: usize) -> usize {
        self.mapping().visible_rows(t)
    }

    /// The first query position that sees row `w` (the token that completes it).
    pub fn visible_from(self, w: usize) -> usize {
        self.mapping().first_visible(w)
    }

    /// Whether row `w` pools at least one token of `span`.
    pub fn row_touches(self, w: usize, span: (usize, usize)) -> bool {
        self.mapping().row_touches(w, span)
    }

    /// All rows (visible or not) that pool a token of `span`.
    pub fn span_rows(self, span: (usize, usize)) -> Range<usize> {
        self.mapping().span_rows(span)
    }

    /// Rows pooling a token of `span` that query `t` can see.
    pub fn visible_span_rows(self, span: (usize, usize), t: usize) -> Range<usize> {
        self.mapping().rows_covering(span, t)
    }
}

/// `n_t = floor((t+1)/4)`: CSA rows visible to query `t`.
pub fn csa_visible_rows(t: usize) -> usize {
    RowKind::Csa.visible_rows(t)
}

/// CSA needle rows of `span` visible to query `t` (docs/architecture.md section 4).
pub fn csa_needle_rows(span: (usize, usize), t: usize) -> Range<usize> {
    RowKind::Csa.visible_span_rows(span, t)
}

/// HCA rows of `span` visible to query `t`.
pub fn hca_needle_rows(span: (usize, usize), t: usize) -> Range<usize> {
    RowKind::Hca.visible_span_rows(span, t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_rows_are_exactly_the_rows_that_touch_the_span() {
        for a in 0..40 {
            for b in a..a + 20 {
                for kind in [RowKind::Csa, RowKind::Hca] {
                    let r = kind.span_rows((a, b));
                    for w in 0..60 {
                        assert_eq!(
                            r.contains(&w),
                            kind.row_touches(w, (a, b)),
                            "{kind:?} span [{a},{b}) row {w}"
                        );
                    }
                }
            }
        }
    }
}
