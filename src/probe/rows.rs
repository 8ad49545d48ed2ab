//! Row mapping: which compressed rows hold which tokens and which rows a query can see.
//! Exactly docs/architecture.md section 4 (normative) and docs/spec/attention.md 5.4 / 6.5 / 10:
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

/// CSA compression ratio (overlapping windows of 8 tokens, stride 4).
pub const CSA_RATIO: usize = 4;
/// HCA compression ratio (non-overlapping windows of 128 tokens).
pub const HCA_RATIO: usize = 128;

/// Which compressed series a row belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowKind {
    /// Ratio 4, overlapping (`[4w-4, 4w+3]`).
    Csa,
    /// Ratio 128, non-overlapping (`[128w, 128w+127]`).
    Hca,
}

impl RowKind {
    pub fn ratio(self) -> usize {
        match self {
            RowKind::Csa => CSA_RATIO,
            RowKind::Hca => HCA_RATIO,
        }
    }

    /// From a layer's compression ratio (4 or 128); `None` for 0 (SWA) or anything else.
    pub fn from_ratio(ratio: usize) -> Option<Self> {
        match ratio {
            CSA_RATIO => Some(RowKind::Csa),
            HCA_RATIO => Some(RowKind::Hca),
            _ => None,
        }
    }

    /// Tokens pooled by row `w`, inclusive `(first, last)`.
    pub fn row_tokens(self, w: usize) -> (usize, usize) {
        match self {
            RowKind::Csa => ((4 * w).saturating_sub(4), 4 * w + 3),
            RowKind::Hca => (128 * w, 128 * w + 127),
        }
    }

    /// Number of rows visible to query `t`: `floor((t+1)/ratio)` (rows `0..n_t`).
    pub fn visible_rows(self, t: usize) -> usize {
        (t + 1) / self.ratio()
    }

    /// The first query position that sees row `w` (the token that completes it).
    pub fn visible_from(self, w: usize) -> usize {
        self.ratio() * w + self.ratio() - 1
    }

    /// Whether row `w` pools at least one token of `span`.
    pub fn row_touches(self, w: usize, span: (usize, usize)) -> bool {
        let (first, last) = self.row_tokens(w);
        span.0 < span.1 && first < span.1 && last >= span.0
    }

    /// All rows (visible or not) that pool a token of `span`.
    pub fn span_rows(self, span: (usize, usize)) -> Range<usize> {
        let (a, b) = span;
        if b <= a {
            return 0..0;
        }
        match self {
            RowKind::Csa => a / CSA_RATIO..(b - 1) / CSA_RATIO + 2,
            RowKind::Hca => a / HCA_RATIO..(b - 1) / HCA_RATIO + 1,
        }
    }

    /// Rows pooling a token of `span` that query `t` can see.
    pub fn visible_span_rows(self, span: (usize, usize), t: usize) -> Range<usize> {
        let all = self.span_rows(span);
        let n_t = self.visible_rows(t);
        all.start.min(n_t)..all.end.min(n_t)
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
