//! Needle ranks among the visible CSA rows, exactly docs/architecture.md section 4:
//!
//! - rank of row `w` = 1 + number of visible rows with a STRICTLY higher score;
//! - needle rank = best (smallest) rank over the visible needle rows; its row is the lowest
//!   index among the needle rows with the best score;
//! - tie count = number of OTHER visible rows whose score equals the needle's best score
//!   exactly (other needle rows included);
//! - k-th score = the k-th highest visible score (`None` if fewer than k rows are visible);
//! - margin at k = best needle score - k-th score (positive = inside the top-k);
//! - selected at k = needle rank <= k and the needle score is a number; trivial = n_t <= k
//!   (shown, never evidence).
//!
//! NaN scores (broken numerics) rank below everything, `-inf` included, and tie with each other.
//! A needle whose best score is NaN still gets that rank (1 + the rows with a number) but is
//! never selected: an engine's top-k may keep any of the tied NaN rows, so nothing says it kept
//! the needle's. Inputs are `[visible_rows]` slices; nothing
//! here allocates more than one copy of the scores (for the k-th score selection).

use crate::record::LayerRecord;
use std::cmp::Ordering;
use std::ops::Range;

/// Descending "greater" with NaN lowest.
fn greater(x: f32, y: f32) -> bool {
    match (x.is_nan(), y.is_nan()) {
        (true, _) => false,
        (false, true) => true,
        _ => x > y,
    }
}

fn same(x: f32, y: f32) -> bool {
    (x.is_nan() && y.is_nan()) || x == y
}

/// Total order for sorting descending with NaN last.
fn desc(x: &f32, y: &f32) -> Ordering {
    if greater(*x, *y) {
        Ordering::Less
    } else if greater(*y, *x) {
        Ordering::Greater
    } else {
        Ordering::Equal
    }
}

/// The needle's standing among the visible rows under one profile.
#[derive(Clone, Debug, PartialEq)]
pub struct NeedleRank {
    /// Number of visible rows (n_t).
    pub visible_rows: usize,
    /// Number of visible needle rows.
    pub needle_rows: usize,
    /// Lowest-index needle row with the best score.
    pub best_row: Option<usize>,
    /// 1 + rows with a strictly higher score than the best needle row.
    pub needle_rank: Option<usize>,
    /// Other visible rows with exactly the best needle score.
    pub rank_ties: usize,
    /// Of `rank_ties`, how many are needle rows themselves.
    pub needle_ties: usize,
    /// Best needle-row score.
    pub needle_score: Option<f32>,
}

impl NeedleRank {
    /// Selected at k: needle rank <= k, with a needle score that is not NaN.
    pub fn selected(&self, k: usize) -> bool {
        self.needle_rank.is_some_and(|r| r <= k)
            && self
                .needle_score
                .is_some_and(|s| !s.is_nan() && s != f32::NEG_INFINITY)
    }

    /// Whether the needle's tie group straddles the k-th place, so that an engine may
    /// legitimately keep or drop every needle row of it depending on tie order: the group's
    /// other rows that are not needle rows could fill all `k - rank + 1` places left to it.
    /// (Tied needle rows do not count: if they outnumber the rest, some needle row is kept.)
    pub fn ties_straddle(&self, k: usize) -> bool {
        let others = self.rank_ties - self.needle_ties;
        self.needle_rank.is_some_and(|r| r <= k && r + others > k)
    }
}

/// Ranks the needle rows `rows` (clipped to the visible rows) among `scores` (`[visible]`).
pub fn rank_needle(scores: &[f32], rows: Range<usize>) -> NeedleRank {
    let visible = scores.len();
    let rows = rows.start.min(visible)..rows.end.min(visible);
    let mut best: Option<(usize, f32)> = None;
    for w in rows.clone() {
        let s = scores[w];
        if best.is_none_or(|(_, b)| greater(s, b)) {
            best = Some((w, s));
        }
    }
    let Some((best_row, best_score)) = best else {
        return NeedleRank {
            visible_rows: visible,
            needle_rows: 0,
            best_row: None,
            needle_rank: None,
            rank_ties: 0,
            needle_ties: 0,
            needle_score: None,
        };
    };
    let mut higher = 0usize;
    let mut ties = 0usize;
    let mut needle_ties = 0usize;
    for (w, &s) in scores.iter().enumerate() {
        if greater(s, best_score) {
            higher += 1;
        } else if w != best_row && same(s, best_score) {
            ties += 1;
            needle_ties += usize::from(rows.contains(&w));
        }
    }
    NeedleRank {
        visible_rows: visible,
        needle_rows: rows.len(),
        best_row: Some(best_row),
        needle_rank: Some(higher + 1),
        rank_ties: ties,
        needle_ties,
        needle_score: Some(best_score),
    }
}

/// The k-th highest score for each `k` in `ks` (`None` for k = 0 or k > scores.len()).
pub fn kth_scores(scores: &[f32], ks: &[usize]) -> Vec<Option<f32>> {
    let n = scores.len();
    if ks.iter().all(|&k| k == 0 || k > n) {
        return vec![None; ks.len()];
    }
    let mut buf = scores.to_vec();
    ks.iter()
        .map(|&k| {
            if k == 0 || k > n {
                return None;
            }
            let (_, kth, _) = buf.select_nth_unstable_by(k - 1, desc);
            Some(*kth)
        })
        .collect()
}

/// Margin at k: best needle score - k-th score.
pub fn margin(needle_score: Option<f32>, kth: Option<f32>) -> Option<f32> {
    Some(needle_score? - kth?)
}

/// Trivial at k: every visible row is selected (n_t <= k).
pub fn trivial(visible_rows: usize, k: usize) -> bool {
    visible_rows <= k
}

/// Where a record comes from (everything in a `LayerRecord` that is not a rank statistic).
#[derive(Clone, Debug, PartialEq)]
pub struct RecordMeta<'a> {
    pub cell_id: &'a str,
    pub layer: usize,
    pub query_pos: usize,
    pub phase: &'a str,
    pub profile: &'a str,
    pub driving: bool,
    /// Which of the run's needles the rank is of.
    pub needle: usize,
}

impl LayerRecord {
    /// The record for top-k `k` given the needle rank and the k-th score.
    pub fn new(meta: &RecordMeta<'_>, rank: &NeedleRank, kth: Option<f32>, k: usize) -> Self {
        LayerRecord {
            cell_id: meta.cell_id.to_string(),
            layer: meta.layer,
            query_pos: meta.query_pos,
            phase: meta.phase.to_string(),
            profile: meta.profile.to_string(),
            driving: meta.driving,
            needle: meta.needle,
            visible_rows: rank.visible_rows,
            needle_rows: rank.needle_rows,
            needle_rank: rank.needle_rank,
            rank_ties: rank.rank_ties,
            needle_ties: rank.needle_ties,
            needle_score: rank.needle_score,
            kth_score: kth,
            margin: margin(rank.needle_score, kth),
            selected: rank.selected(k),
            trivial: trivial(rank.visible_rows, k),
            stage: None,
            block_rank: None,
            block_kept: None,
            unconstrained_rank: None,
            stage_verdict: None,
        }
    }
}
