//! Lightning-indexer scoring and top-k selection of the CPU backend.
//!
//! Scoring delegates every rounding to `crate::numerics::profiles` (`prepare_key_row`,
//! `prepare_query`, `score`); this file only batches and parallelises it. Keys are prepared once
//! when their row is emitted (the caller stores them); scores are computed per query over the
//! visible rows, never as a `[tokens, rows, heads]` tensor.
//!
//! Top-k order: descending score, ties to the LOWER row (DS4's rule; torch's CUDA tie order is
//! unspecified), NaN below every number, `-1` padding when fewer than k rows exist.

use crate::numerics::profiles::{self, IndexProfile, PreparedQuery};
use rayon::prelude::*;
use std::cmp::Ordering;

/// Rows scored per rayon task.
const ROWS_PER_TASK: usize = 64;

pub fn index_prepare_keys(
    profile: IndexProfile,
    raw: &[f32],
    dim: usize,
    prepared: &mut [f32],
    scales: &mut [f32],
) {
    assert_eq!(
        prepared.len(),
        raw.len(),
        "index keys: prepared not [rows, dim]"
    );
    assert_eq!(
        scales.len() * dim,
        raw.len(),
        "index keys: one scale per row"
    );
    prepared
        .par_chunks_mut(dim)
        .zip(raw.par_chunks(dim))
        .zip(scales.par_iter_mut())
        .for_each(|((out, row), s)| *s = profiles::prepare_key_row(profile, row, out));
}

pub fn index_scores(
    profile: IndexProfile,
    query: &PreparedQuery,
    keys: &[f32],
    key_scales: &[f32],
    dim: usize,
    out: &mut [f32],
) {
    assert_eq!(
        keys.len(),
        out.len() * dim,
        "index scores: keys not [rows, dim]"
    );
    assert_eq!(
        key_scales.len(),
        out.len(),
        "index scores: one scale per row"
    );
    let score_chunk = |(c, o): (usize, &mut [f32])| {
        for (i, s) in o.iter_mut().enumerate() {
            let r = c * ROWS_PER_TASK + i;
            *s = profiles::score(profile, query, &keys[r * dim..(r + 1) * dim], key_scales[r]);
        }
    };
    if out.len() > ROWS_PER_TASK {
        out.par_chunks_mut(ROWS_PER_TASK)
            .enumerate()
            .for_each(score_chunk);
    } else {
        out.chunks_mut(ROWS_PER_TASK)
            .enumerate()
            .for_each(score_chunk);
    }
}

/// Descending by score (NaN lowest), then ascending by row.
fn rank_order(scores: &[f32], a: usize, b: usize) -> Ordering {
    let key = |i: usize| {
        let s = scores[i];
        if s.is_nan() {
            f32::NEG_INFINITY
        } else {
            s
        }
    };
    match key(b).partial_cmp(&key(a)).unwrap_or(Ordering::Equal) {
        Ordering::Equal => {
            // Real -inf ranks above NaN (both map to -inf above).
            match (scores[a].is_nan(), scores[b].is_nan()) {
                (false, true) => Ordering::Less,
                (true, false) => Ordering::Greater,
                _ => a.cmp(&b),
            }
        }
        other => other,
    }
}

pub fn topk(scores: &[f32], out: &mut [i32]) {
    let k = out.len();
    let n = scores.len();
    let mut idx: Vec<usize> = (0..n).collect();
    let take = k.min(n);
    if take > 0 && take < n {
        idx.select_nth_unstable_by(take - 1, |&a, &b| rank_order(scores, a, b));
        idx.truncate(take);
    }
    idx.sort_unstable_by(|&a, &b| rank_order(scores, a, b));
    for (i, o) in out.iter_mut().enumerate() {
        *o = idx.get(i).map_or(-1, |&r| r as i32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_go_to_the_lower_row_and_missing_rows_are_minus_one() {
        let scores = [1.0, 3.0, 3.0, 2.0, 3.0];
        let mut out = [0i32; 4];
        topk(&scores, &mut out);
        assert_eq!(out, [1, 2, 4, 3]);
        let mut out = [0i32; 8];
        topk(&scores, &mut out);
        assert_eq!(out, [1, 2, 4, 3, 0, -1, -1, -1]);
    }

    #[test]
    fn nan_ranks_below_minus_infinity() {
        let scores = [f32::NAN, f32::NEG_INFINITY, 0.5];
        let mut out = [0i32; 3];
        topk(&scores, &mut out);
        assert_eq!(out, [2, 1, 0]);
    }

    #[test]
    fn partial_selection_matches_full_sort() {
        let scores: Vec<f32> = (0..300).map(|i| ((i * 37 % 101) as f32).sin()).collect();
        let mut all = vec![0i32; 300];
        topk(&scores, &mut all);
        let mut top = vec![0i32; 17];
        topk(&scores, &mut top);
        assert_eq!(&all[..17], &top[..]);
    }
}
