//! DeepSeek-V4.1's stage verdict (docs/spec/v41.md 5.6): where in the two-level selection a
//! needle was lost, from ranks alone.
//!
//! The candidate source (the release's layer 20) keeps, per query, its newest block of
//! `candidate_block_size` compressed rows plus the best `candidate_topk_blocks` others; its own
//! top-k is unrestricted. Each consumer (24, 28, 32, 36) ranks rows only inside those blocks.
//! So at a consumer a needle is:
//! - [`StageVerdict::NotVisible`]: none of its rows is visible to the query yet;
//! - [`StageVerdict::CandidateMiss`]: no needle row lies in a kept block: the candidate stage
//!   dropped it, whatever the consumer's top-k;
//! - [`StageVerdict::TopkMiss`]: a needle row survived the candidate stage but ranks below the
//!   consumer's top-k inside the kept blocks;
//! - [`StageVerdict::Kept`]: a needle row is among the consumer's top-k.
//!
//! Ranks follow docs/architecture.md section 4 (1 + rows scoring strictly higher; selected when
//! rank <= k). A block's rank at the candidate source counts the pinned block above every score
//! (it is kept first), so the needle's best block is kept when it is the pinned one or its rank
//! is within the budget.

use serde::{Deserialize, Serialize};
use std::ops::Range;

/// An index layer's part in DeepSeek-V4.1's selection (layers.csv `stage`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerStage {
    /// An index source that selects among every visible row (the release's ratio-2 layers
    /// 2, 8 and 14).
    Index,
    /// The candidate source (layer 20): its own top-k among every row, and the blocks it keeps
    /// for its consumers.
    CandidateSource,
    /// A consumer of the candidate source (24, 28, 32, 36): its top-k inside the kept blocks.
    Reindex,
}

impl LayerStage {
    /// The word tables and CSV use.
    pub fn name(self) -> &'static str {
        match self {
            LayerStage::Index => "index",
            LayerStage::CandidateSource => "candidate_source",
            LayerStage::Reindex => "reindex",
        }
    }
}

/// What happened to a needle at one candidate consumer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StageVerdict {
    NotVisible,
    CandidateMiss,
    TopkMiss,
    Kept,
}

impl StageVerdict {
    /// The verdict at a consumer: `needle_rows` the visible needle rows, `in_kept_block` whether
    /// a row lies in a block the candidate source kept, `masked_rank` the needle's best rank
    /// inside the kept blocks (`None` when no needle row is there), `k` the top-k.
    pub fn at_consumer(
        needle_rows: Range<usize>,
        in_kept_block: impl Fn(usize) -> bool,
        masked_rank: Option<usize>,
        k: usize,
    ) -> Self {
        if needle_rows.is_empty() {
            return StageVerdict::NotVisible;
        }
        if !needle_rows.clone().any(in_kept_block) {
            return StageVerdict::CandidateMiss;
        }
        match masked_rank {
            Some(r) if r <= k => StageVerdict::Kept,
            _ => StageVerdict::TopkMiss,
        }
    }

    /// The word tables and CSV use.
    pub fn name(self) -> &'static str {
        match self {
            StageVerdict::NotVisible => "not_visible",
            StageVerdict::CandidateMiss => "candidate_miss",
            StageVerdict::TopkMiss => "topk_miss",
            StageVerdict::Kept => "kept",
        }
    }
}

/// The needle's best block at the candidate source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct BlockRank {
    /// The needle block with the best rank (the lower block on a tie).
    pub block: usize,
    /// Its place in the candidate source's order (the pinned block first, ties to the lower
    /// block), from 1.
    pub rank: usize,
    /// Whether the candidate source kept it.
    pub kept: bool,
    /// Whether it is the pinned newest block.
    pub pinned: bool,
}

/// The rank of the best of `needle_blocks` among the query's blocks (`block_scores`, each its
/// best visible row's score; `pinned` the newest block) and whether it was kept (`kept`, per
/// block). `None` when no needle block is visible.
pub fn needle_block_rank(
    block_scores: &[f32],
    kept: &[bool],
    pinned: Option<usize>,
    needle_blocks: Range<usize>,
) -> Option<BlockRank> {
    let key = |b: usize| {
        if Some(b) == pinned {
            f32::INFINITY
        } else {
            block_scores[b]
        }
    };
    // The candidate source's own order: ties go to the lower block, so a block's rank says
    // whether it was kept (rank <= budget) even among the many exact ties of a small model.
    let rank_of = |b: usize| {
        1 + (0..block_scores.len())
            .filter(|&o| key(o) > key(b) || (o < b && key(o) == key(b)))
            .count()
    };
    (needle_blocks.start..needle_blocks.end.min(block_scores.len()))
        .map(|b| (rank_of(b), b))
        .min()
        .map(|(rank, block)| BlockRank {
            block,
            rank,
            kept: kept.get(block).copied().unwrap_or(false),
            pinned: Some(block) == pinned,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One constructed query per outcome: 6 rows in blocks of 2, the needle on rows 2-3
    /// (block 1), top-k 1.
    #[test]
    fn each_outcome_on_a_constructed_case() {
        let kept_blocks = |kept: [bool; 3]| move |r: usize| kept[r / 2];
        // Block 1 dropped by the candidate stage: a candidate-stage miss whatever the ranks.
        assert_eq!(
            StageVerdict::at_consumer(2..4, kept_blocks([true, false, true]), None, 1),
            StageVerdict::CandidateMiss
        );
        // Kept, but another row outranks the needle inside the kept blocks: a top-k miss.
        assert_eq!(
            StageVerdict::at_consumer(2..4, kept_blocks([true, true, true]), Some(2), 1),
            StageVerdict::TopkMiss
        );
        // Kept and first: kept.
        assert_eq!(
            StageVerdict::at_consumer(2..4, kept_blocks([false, true, true]), Some(1), 1),
            StageVerdict::Kept
        );
        // Nothing visible yet.
        assert_eq!(
            StageVerdict::at_consumer(2..2, kept_blocks([true, true, true]), None, 1),
            StageVerdict::NotVisible
        );
    }

    #[test]
    fn the_pinned_block_ranks_first_and_ties_take_the_lower_block() {
        let scores = [0.9, 0.5, 0.5, 0.1];
        let kept = [true, false, true, true];
        // Block 3 is pinned: above block 0's 0.9. Needle blocks 1-2 tie at 0.5: rank 3, block 1.
        let r = needle_block_rank(&scores, &kept, Some(3), 1..3).unwrap();
        assert_eq!(
            r,
            BlockRank {
                block: 1,
                rank: 3,
                kept: false,
                pinned: false
            }
        );
        // Block 2 ties block 1 and comes after it in the source's order.
        let r = needle_block_rank(&scores, &kept, Some(3), 2..3).unwrap();
        assert_eq!((r.block, r.rank), (2, 4));
        let r = needle_block_rank(&scores, &kept, Some(3), 3..4).unwrap();
        assert_eq!((r.rank, r.kept, r.pinned), (1, true, true));
        assert_eq!(needle_block_rank(&scores, &kept, Some(3), 4..6), None);
    }
}
