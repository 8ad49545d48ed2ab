//! DeepSeek-V4.1's two-level selection (docs/spec/v41.md 5.6), on one query's score row.
//!
//! The candidate source, per query t with `n_t` visible rows (scores `[n_t]`): blocks of
//! `block` consecutive rows; a block's score is the max of its visible rows' scores; the
//! block holding the newest visible row (`(n_t - 1) / block`) is pinned (kept whatever its
//! score; nothing is pinned while `n_t` is 0); the other places go to the best block scores,
//! ties to the lower block, and a block whose score is -inf (or NaN) is never kept.
//! [`Candidates`] holds the result. A consumer scores as usual, then sets every row outside
//! the kept blocks to -inf ([`Candidates::mask`]) and takes its top-k among the rows left
//! ([`drop_unscored`] after the backend's top-k): rows scored -inf are never selected (SGLang's serving path drops them
//! too; the reference's top-k could pick one only when fewer than k rows are kept, which a
//! valid config rules out beyond the newest block).

/// The blocks one query keeps at the candidate source.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidates {
    /// Rows per block.
    pub block: usize,
    /// Visible rows of the query.
    pub visible: usize,
    /// `[ceil(visible / block)]`: each block's max score (the real max, also for the pinned
    /// block).
    pub block_scores: Vec<f32>,
    /// Per block: kept.
    pub kept: Vec<bool>,
    /// The pinned newest block, `None` while nothing is visible.
    pub pinned: Option<usize>,
}

impl Candidates {
    /// The candidate stage of one query (module doc): `scores[..visible]` are its rows' scores,
    /// `budget` the blocks kept (`candidate_topk_blocks`).
    pub fn select(scores: &[f32], visible: usize, block: usize, budget: usize) -> Self {
        let blocks = visible.div_ceil(block);
        let block_scores: Vec<f32> = (0..blocks)
            .map(|b| {
                scores[b * block..((b + 1) * block).min(visible)]
                    .iter()
                    .fold(f32::NEG_INFINITY, |m, &s| if s > m { s } else { m })
            })
            .collect();
        let pinned = visible.checked_sub(1).map(|v| v / block);
        let mut kept = vec![false; blocks];
        let mut left = budget;
        if let Some(p) = pinned.filter(|_| budget > 0) {
            kept[p] = true;
            left -= 1;
        }
        // The best `left` other blocks: a partial selection (blocks run to 16,384 a query at
        // 128k tokens), descending score, ties to the lower block; NaN ranks last.
        let mut order: Vec<usize> = (0..blocks).filter(|&b| Some(b) != pinned).collect();
        let better = |&a: &usize, &b: &usize| {
            block_scores[b]
                .partial_cmp(&block_scores[a])
                .unwrap_or_else(|| block_scores[a].is_nan().cmp(&block_scores[b].is_nan()))
                .then(a.cmp(&b))
        };
        if left < order.len() {
            if left > 0 {
                order.select_nth_unstable_by(left - 1, better);
            }
            order.truncate(left);
        }
        for b in order {
            kept[b] = block_scores[b] > f32::NEG_INFINITY;
        }
        Candidates {
            block,
            visible,
            block_scores,
            kept,
            pinned,
        }
    }

    /// Whether row `r` lies in a kept block.
    pub fn keeps_row(&self, r: usize) -> bool {
        self.kept.get(r / self.block).copied().unwrap_or(false)
    }

    /// Sets the scores of rows outside the kept blocks to -inf (a consumer's row of
    /// `scores[..visible]`).
    pub fn mask(&self, scores: &mut [f32]) {
        for (r, s) in scores.iter_mut().enumerate() {
            if !self.keeps_row(r) {
                *s = f32::NEG_INFINITY;
            }
        }
    }
}

/// Replaces by `-1` every selected row whose score is -inf or NaN (they sort last in a
/// top-k, so only the tail of `selected` changes): what was masked out stays out.
pub fn drop_unscored(selected: &mut [i32], scores: &[f32]) {
    for r in selected.iter_mut() {
        if *r >= 0 && (scores[*r as usize].is_nan() || scores[*r as usize] == f32::NEG_INFINITY) {
            *r = -1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEG: f32 = f32::NEG_INFINITY;

    #[test]
    fn fewer_blocks_than_the_budget_keeps_every_visible_block() {
        let scores = [0.1, 0.5, 0.2, 0.9, 0.3];
        let c = Candidates::select(&scores, 5, 2, 8);
        assert_eq!(c.block_scores, vec![0.5, 0.9, 0.3]);
        assert_eq!(c.kept, vec![true, true, true]);
        assert_eq!(c.pinned, Some(2));
    }

    #[test]
    fn the_newest_block_is_pinned_however_low_it_scores() {
        // 3 blocks of 2 (visible 5: the last block half filled), budget 2: the pinned block
        // 2 (score 0.0) and the best other block (1, 0.9) stay; block 0 (0.5) goes.
        let scores = [0.1, 0.5, 0.2, 0.9, 0.0];
        let c = Candidates::select(&scores, 5, 2, 2);
        assert_eq!(c.kept, vec![false, true, true]);
        let mut masked = scores.to_vec();
        c.mask(&mut masked);
        assert_eq!(masked, vec![NEG, NEG, 0.2, 0.9, 0.0]);
    }

    #[test]
    fn ties_at_the_cut_off_go_to_the_lower_block() {
        let scores = [0.7, 0.1, 0.7, 0.2, 0.7, 0.0, 0.1, 0.1];
        // Blocks 0, 1, 2 tie at 0.7; block 3 is pinned; budget 3 keeps 3, 0 and 1.
        let c = Candidates::select(&scores, 8, 2, 3);
        assert_eq!(c.kept, vec![true, true, false, true]);
    }

    #[test]
    fn the_partial_selection_keeps_what_a_full_sort_keeps() {
        // 200 blocks of 1 row with many ties and a NaN: the kept set is the pinned block plus
        // the first budget - 1 others of a stable descending sort (NaN last).
        let mut scores: Vec<f32> = (0..200).map(|i| ((i * 37) % 23) as f32 * 0.5).collect();
        scores[17] = f32::NAN;
        scores[40] = f32::NEG_INFINITY;
        for budget in [0, 1, 2, 50, 199, 200, 300] {
            let c = Candidates::select(&scores, 200, 1, budget);
            let mut order: Vec<usize> = (0..199).collect();
            order.sort_by(|&a, &b| {
                let key = |x: usize| {
                    if scores[x].is_nan() {
                        f32::MIN
                    } else {
                        scores[x]
                    }
                };
                key(b).partial_cmp(&key(a)).unwrap().then(a.cmp(&b))
            });
            let mut want = vec![false; 200];
            if budget > 0 {
                want[199] = true;
                for &b in order.iter().take(budget - 1) {
                    want[b] = scores[b] > f32::NEG_INFINITY;
                }
            }
            assert_eq!(c.kept, want, "budget {budget}");
        }
    }

    #[test]
    fn nothing_visible_pins_nothing_and_minus_inf_blocks_are_dropped() {
        let c = Candidates::select(&[], 0, 8, 4);
        assert_eq!((c.pinned, c.kept.len()), (None, 0));
        let c = Candidates::select(&[NEG, NEG, 0.5, NEG], 4, 2, 4);
        assert_eq!(c.kept, vec![false, true]);
    }

    #[test]
    fn masked_rows_leave_the_selection() {
        let mut sel = [2, 0, 3, 1, -1];
        drop_unscored(&mut sel, &[0.5, NEG, 0.9, f32::NAN]);
        assert_eq!(sel, [2, 0, -1, -1, -1]);
    }
}
