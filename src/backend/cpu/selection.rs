//! Lightning-indexer scoring and top-k selection of the CPU backend.
//!
//! Scoring delegates every rounding to `crate::numerics`: keys are prepared once, when their
//! row is emitted, with `profiles::prepare_key_row` (the caller stores them); scores come from
//! `score_batch::score_batch`, which runs the dot products of a tile of queries × rows as one
//! GEMM and applies the profile's head combination (the arithmetic of `profiles::score`) to it,
//! never materialising a `[tokens, rows, heads]` tensor.
//!
//! Top-k order: descending score, ties to the LOWER row (DS4's rule; torch's CUDA tie order is
//! unspecified), NaN below every number (including -inf), `-1` padding when fewer than k rows
//! exist. `-0.0` and `+0.0` tie. Selection is one pass over the scores with a threshold and a
//! candidate buffer of at most `2k` entries (O(rows + k log k)), then a sort of the k winners.

use crate::numerics::profiles::{self, IndexProfile, PreparedQuery};
use crate::numerics::score_batch::{self, IndexScoreBatch};
use rayon::prelude::*;

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
        .with_min_len(64)
        .for_each(|((out, row), s)| *s = profiles::prepare_key_row(profile, row, out));
}

/// One query against every row of `keys`: the batched scorer with a single token.
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
    assert_eq!(query.dim, dim, "index scores: query and key dims differ");
    let batch = IndexScoreBatch {
        profile,
        queries: &query.values[..],
        weights: &query.weights[..],
        first: 0,
        heads: query.heads,
        dim,
        keys,
        key_scales,
        visible: &[out.len()],
    };
    score_batch::score_batch(&batch, out);
}

/// See [`crate::backend::Backend::index_scores_batch`]: `batch` on host slices that end at
/// the block ([`IndexScoreBatch::block`]).
pub fn index_scores_batch(batch: &IndexScoreBatch<'_>, out: &mut [f32]) {
    score_batch::score_batch(batch, out);
}

/// A score as a totally ordered key: NaN lowest (0), then -inf .. +inf by value, with -0.0
/// and +0.0 equal.
#[inline]
fn order_key(s: f32) -> u32 {
    if s.is_nan() {
        return 0;
    }
    let b = if s == 0.0 { 0 } else { s.to_bits() };
    // Monotone map of the non-NaN floats onto u32 (-inf -> 0x007F_FFFF > 0): negative values
    // flip every bit, the others only the sign. Branch-free (score signs are random).
    b ^ (((b as i32 >> 31) as u32) | 0x8000_0000)
}

/// Ranking key of row `r`: larger is better; equal scores order the lower row first.
#[inline]
fn rank_key(s: f32, r: usize) -> u64 {
    ((order_key(s) as u64) << 32) | (!(r as u32)) as u64
}

/// Scores tested at once against the running threshold in [`topk`].
const SCAN_BLOCK: usize = 16;

/// [`topk`] of T score rows in parallel: row t is `scores[t·stride..t·stride + visible[t]]`,
/// its `k = out.len() / T` results go to `out[t·k..(t+1)·k]`.
pub fn topk_batch(scores: &[f32], stride: usize, visible: &[usize], out: &mut [i32]) {
    let tokens = visible.len();
    if tokens == 0 {
        return;
    }
    let k = out.len() / tokens;
    if k == 0 {
        return;
    }
    out.par_chunks_mut(k)
        .zip(visible.par_iter())
        .enumerate()
        .for_each(|(t, (sel, &n))| topk(&scores[t * stride..t * stride + n], sel));
}

pub fn topk(scores: &[f32], out: &mut [i32]) {
    let k = out.len();
    let n = scores.len();
    assert!(n <= u32::MAX as usize, "topk: more than 2^32 rows");
    let take = k.min(n);
    let mut cand: Vec<u64> = Vec::new();
    if take == n {
        cand.extend(scores.iter().enumerate().map(|(r, &s)| rank_key(s, r)));
    } else if take > 0 {
        // Keep every key above the current k-th best; compact to the best k when the buffer
        // fills. Keys are unique (row in the low bits), so `>` suffices. Blocks whose scores
        // are all below the k-th best score are skipped with one vectorised test.
        let cap = (2 * take).max(64);
        cand.reserve(cap);
        let mut threshold: Option<(u64, f32)> = None;
        for (b, block) in scores.chunks(SCAN_BLOCK).enumerate() {
            if let Some((_, thr)) = threshold {
                // `s < thr` is false for NaN (and for a NaN or -inf thr): those take the slow
                // path, which decides with the exact key.
                if block.iter().fold(true, |all, &s| all & (s < thr)) {
                    continue;
                }
            }
            for (i, &s) in block.iter().enumerate() {
                let key = rank_key(s, b * SCAN_BLOCK + i);
                if threshold.is_some_and(|(t, _)| key <= t) {
                    continue;
                }
                cand.push(key);
                if cand.len() == cap {
                    cand.select_nth_unstable_by(take - 1, |a, b| b.cmp(a));
                    cand.truncate(take);
                    // The k-th best; everything before it in `cand` is better.
                    let t = cand[take - 1];
                    threshold = Some((t, scores[!(t as u32) as usize]));
                }
            }
        }
        if cand.len() > take {
            cand.select_nth_unstable_by(take - 1, |a, b| b.cmp(a));
            cand.truncate(take);
        }
    }
    cand.sort_unstable_by(|a, b| b.cmp(a));
    for (i, o) in out.iter_mut().enumerate() {
        *o = cand.get(i).map_or(-1, |&c| !(c as u32) as i32);
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

    /// The reference order: descending by score (NaN lowest, below -inf), then by row.
    fn reference_topk(scores: &[f32], k: usize) -> Vec<i32> {
        let key = |s: f32| if s.is_nan() { f32::NEG_INFINITY } else { s };
        let mut idx: Vec<usize> = (0..scores.len()).collect();
        idx.sort_by(|&a, &b| {
            key(scores[b])
                .partial_cmp(&key(scores[a]))
                .unwrap()
                .then(scores[a].is_nan().cmp(&scores[b].is_nan()))
                .then(a.cmp(&b))
        });
        (0..k)
            .map(|i| idx.get(i).map_or(-1, |&r| r as i32))
            .collect()
    }

    #[test]
    fn threshold_selection_matches_a_full_sort_with_ties_nan_and_signed_zeros() {
        let mut x = 12345u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for n in [0usize, 1, 5, 63, 64, 65, 200, 1000, 5000] {
            let scores: Vec<f32> = (0..n)
                .map(|_| match next() % 10 {
                    0 => f32::NAN,
                    1 => f32::NEG_INFINITY,
                    2 => 0.0,
                    3 => -0.0,
                    4 => f32::INFINITY,
                    5 => 1.5,
                    _ => (next() % 1000) as f32 / 37.0 - 13.0,
                })
                .collect();
            for k in [0usize, 1, 2, 7, 31, 32, 33, 100, 6000] {
                let mut out = vec![0i32; k];
                topk(&scores, &mut out);
                assert_eq!(out, reference_topk(&scores, k), "n {n} k {k}");
            }
        }
        // Ascending scores: every row beats the threshold, the buffer compacts repeatedly.
        let rising: Vec<f32> = (0..3000).map(|i| i as f32).collect();
        let mut out = vec![0i32; 10];
        topk(&rising, &mut out);
        assert_eq!(out, reference_topk(&rising, 10));
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
