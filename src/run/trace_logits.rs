//! Which logits a trace keeps per recorded position (`trace --logits none|top:N|all`), and the
//! top-N selection itself.
//!
//! A full row of logits is `4 * vocab` bytes (0.5 MiB on Flash's 129,280 words), so
//! `--positions all` over a few thousand tokens wrote gigabytes of them. [`LogitsMode::Top`]
//! keeps, per position, the N largest logits (f32) and their token ids, sorted by descending
//! value with ties toward the lower token id; [`LogitsMode::None`] keeps none (and the engine
//! computes none); [`LogitsMode::All`] keeps every row whole, as traces always did.
//! [`LogitsMode::default_for`] is `all` for at most [`ALL_UP_TO_POSITIONS`] recorded positions,
//! else `top:`[`DEFAULT_TOP`].
//!
//! Ordering of [`top_logits`]: descending value, where a NaN counts as larger than every
//! number (a broken row shows its NaN at the top instead of hiding it) and `-0.0` equals
//! `0.0`; equal values go to the lower token id. That is the order a stable descending sort of
//! the full row by value gives.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

/// Up to this many recorded positions, a trace keeps every logit by default.
pub const ALL_UP_TO_POSITIONS: usize = 16;
/// The N of the default `top:N` for more positions.
pub const DEFAULT_TOP: usize = 20;

/// Which logits a trace keeps per recorded position.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogitsMode {
    /// No logits (no tensor in the file, none computed).
    None,
    /// The N largest per position, with their token ids.
    Top(usize),
    /// The whole row per position (what a trace kept before `--logits` existed).
    #[default]
    All,
}

impl LogitsMode {
    /// The default for `positions` recorded positions over a vocabulary of `vocab` words:
    /// [`LogitsMode::All`] up to [`ALL_UP_TO_POSITIONS`], else `top:`[`DEFAULT_TOP`] (at
    /// most the vocabulary).
    pub fn default_for(positions: usize, vocab: usize) -> LogitsMode {
        if positions <= ALL_UP_TO_POSITIONS {
            LogitsMode::All
        } else {
            LogitsMode::Top(DEFAULT_TOP.min(vocab.max(1)))
        }
    }

    /// The spelling `--logits` takes and the trace's metadata records: `none`, `top:N`, `all`.
    pub fn name(self) -> String {
        match self {
            LogitsMode::None => "none".to_string(),
            LogitsMode::Top(n) => format!("top:{n}"),
            LogitsMode::All => "all".to_string(),
        }
    }

    /// Logits kept per position over a vocabulary of `vocab` words.
    pub fn per_position(self, vocab: usize) -> usize {
        match self {
            LogitsMode::None => 0,
            LogitsMode::Top(n) => n,
            LogitsMode::All => vocab,
        }
    }

    /// Refuses a `top:N` with N past the model's vocabulary (there are not N logits to keep).
    pub fn check_vocab(self, vocab: usize) -> Result<LogitsMode, LogitsError> {
        match self {
            LogitsMode::Top(n) if n > vocab => Err(LogitsError::PastVocab { n, vocab }),
            mode => Ok(mode),
        }
    }
}

impl fmt::Display for LogitsMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// A `--logits` value that cannot be honoured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogitsError {
    /// Not one of the accepted spellings.
    #[error(
        "expected none, all or top:N (N logits kept per position, a whole number from 1 to the \
         vocabulary size, e.g. top:20), found {found:?}{why}"
    )]
    Syntax { found: String, why: &'static str },
    /// `top:N` with N past the vocabulary.
    #[error(
        "--logits top:{n}: expected N at most the model's vocab_size {vocab} (top:{vocab} keeps \
         every logit, sorted; --logits all keeps them in token order)"
    )]
    PastVocab { n: usize, vocab: usize },
}

impl FromStr for LogitsMode {
    type Err = LogitsError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let bad = |why| LogitsError::Syntax {
            found: s.to_string(),
            why,
        };
        match t.to_ascii_lowercase().as_str() {
            "none" => return Ok(LogitsMode::None),
            "all" => return Ok(LogitsMode::All),
            _ => {}
        }
        let Some(n) = t
            .get(..4)
            .filter(|p| p.eq_ignore_ascii_case("top:"))
            .map(|_| t[4..].trim())
        else {
            return Err(bad(""));
        };
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad(" (N is not a whole number)"));
        }
        match n.parse::<usize>() {
            Ok(0) => Err(bad(
                " (N must be at least 1: --logits none keeps no logits)",
            )),
            Ok(n) => Ok(LogitsMode::Top(n)),
            Err(_) => Err(bad(" (N is too large)")),
        }
    }
}

/// The N largest logits of one position and their token ids, in the order of the module docs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TopLogits {
    pub values: Vec<f32>,
    pub ids: Vec<u32>,
}

/// The top N of the recorded positions' rows of logits, kept as a trace's observer receives
/// them (`intermediate("logits")`, a group of rows at a time), so no whole row outlives its
/// group ([`TopRows::for_mode`] makes one under [`LogitsMode::Top`] only).
#[derive(Debug, Default)]
pub struct TopRows {
    n: usize,
    /// One per recorded position, ascending.
    pub rows: Vec<TopLogits>,
}

impl TopRows {
    /// A keeper for `mode`, if it keeps a top N.
    pub fn for_mode(mode: LogitsMode) -> Option<TopRows> {
        match mode {
            LogitsMode::Top(n) => Some(TopRows {
                n,
                rows: Vec::new(),
            }),
            _ => None,
        }
    }

    /// Keeps the top N of each row of `data` (`shape[0]` rows for positions `first_pos..`)
    /// whose position `recorded` holds.
    pub fn keep(
        &mut self,
        recorded: &std::collections::BTreeSet<usize>,
        first_pos: usize,
        shape: &[usize],
        data: &[f32],
    ) {
        let per = data.len() / shape[0].max(1);
        for (i, row) in data.chunks_exact(per.max(1)).enumerate() {
            if recorded.contains(&(first_pos + i)) {
                self.rows.push(top_logits(row, self.n));
            }
        }
    }
}

/// Descending value (NaN largest, `-0.0 == 0.0`), then ascending token id.
fn order(logits: &[f32], a: u32, b: u32) -> Ordering {
    let (x, y) = (logits[a as usize], logits[b as usize]);
    match (x.is_nan(), y.is_nan()) {
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        _ => y.partial_cmp(&x).unwrap_or(Ordering::Equal),
    }
    .then(a.cmp(&b))
}

/// The `n` largest of `logits` (all of them when `n` is past its length) with their token ids,
/// sorted by descending value, equal values toward the lower id (module docs). Linear in the
/// row's length plus `n log n`.
pub fn top_logits(logits: &[f32], n: usize) -> TopLogits {
    let n = n.min(logits.len());
    let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
    if n == 0 {
        return TopLogits::default();
    }
    if n < ids.len() {
        ids.select_nth_unstable_by(n - 1, |&a, &b| order(logits, a, b));
        ids.truncate(n);
    }
    ids.sort_unstable_by(|&a, &b| order(logits, a, b));
    TopLogits {
        values: ids.iter().map(|&i| logits[i as usize]).collect(),
        ids,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print_as_the_flag_spells_them() {
        for (text, mode) in [
            ("none", LogitsMode::None),
            ("all", LogitsMode::All),
            ("ALL", LogitsMode::All),
            ("top:20", LogitsMode::Top(20)),
            (" top:1 ", LogitsMode::Top(1)),
            ("TOP:7", LogitsMode::Top(7)),
        ] {
            assert_eq!(text.parse::<LogitsMode>(), Ok(mode), "{text}");
        }
        assert_eq!(LogitsMode::Top(20).to_string(), "top:20");
        assert_eq!(LogitsMode::None.to_string(), "none");
        assert_eq!(LogitsMode::All.to_string(), "all");
    }

    #[test]
    fn bad_modes_say_what_is_accepted() {
        for (text, why) in [
            ("foo", ""),
            ("top:0", "at least 1"),
            ("top:x", "not a whole number"),
            ("top:", "not a whole number"),
            ("top:-3", "not a whole number"),
            ("top:2.5", "not a whole number"),
            ("top", ""),
            ("top:99999999999999999999999", "too large"),
        ] {
            let e = text.parse::<LogitsMode>().unwrap_err().to_string();
            assert!(
                e.contains("expected none, all or top:N") && e.contains(why),
                "{text}: {e}"
            );
        }
    }

    #[test]
    fn top_past_the_vocabulary_is_refused_naming_it() {
        assert_eq!(LogitsMode::Top(10).check_vocab(10), Ok(LogitsMode::Top(10)));
        assert_eq!(LogitsMode::All.check_vocab(10), Ok(LogitsMode::All));
        let e = LogitsMode::Top(11).check_vocab(10).unwrap_err().to_string();
        assert!(
            e.contains("--logits top:11") && e.contains("vocab_size 10"),
            "{e}"
        );
    }

    #[test]
    fn default_is_all_up_to_sixteen_positions_else_top_twenty() {
        assert_eq!(LogitsMode::default_for(1, 4096), LogitsMode::All);
        assert_eq!(LogitsMode::default_for(16, 4096), LogitsMode::All);
        assert_eq!(LogitsMode::default_for(17, 4096), LogitsMode::Top(20));
        assert_eq!(LogitsMode::default_for(17, 8), LogitsMode::Top(8));
    }

    #[test]
    fn top_logits_sort_descending_with_ties_to_the_lower_id() {
        let row = [1.0, 3.0, -2.0, 3.0, 0.5, 2.0, -0.0, 0.0];
        let top = top_logits(&row, 4);
        assert_eq!(top.values, [3.0, 3.0, 2.0, 1.0]);
        assert_eq!(top.ids, [1, 3, 5, 0]);
        // -0.0 and 0.0 are equal: the lower id first.
        let all = top_logits(&row, 100);
        assert_eq!(all.ids, [1, 3, 5, 0, 4, 6, 7, 2]);
        assert!(top_logits(&row, 0).ids.is_empty());
    }

    #[test]
    fn top_logits_equal_a_stable_sort_of_the_whole_row() {
        let mut x = 12345u32;
        let row: Vec<f32> = (0..1000)
            .map(|_| {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                // Few distinct values: many ties.
                ((x >> 16) % 37) as f32 - 18.0
            })
            .collect();
        let mut ids: Vec<u32> = (0..row.len() as u32).collect();
        ids.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]));
        for n in [1, 5, 37, 999, 1000] {
            let top = top_logits(&row, n);
            assert_eq!(top.ids, ids[..n], "n {n}");
        }
    }

    #[test]
    fn a_nan_logit_tops_the_row() {
        let top = top_logits(&[1.0, f32::NAN, f32::INFINITY], 2);
        assert!(top.values[0].is_nan() && top.values[1] == f32::INFINITY);
        assert_eq!(top.ids, [1, 2]);
    }

    /// A keeper exists under `top:N` only, keeps the recorded positions' rows of each group
    /// (and no other), in order, each its top N.
    #[test]
    fn top_rows_keep_the_recorded_rows_of_each_group() {
        assert!(TopRows::for_mode(LogitsMode::All).is_none());
        assert!(TopRows::for_mode(LogitsMode::None).is_none());
        let mut keep = TopRows::for_mode(LogitsMode::Top(2)).unwrap();
        let recorded: std::collections::BTreeSet<usize> = [10, 12, 13].into();
        // Positions 10..13 (3 rows of 3), then 13 alone.
        keep.keep(
            &recorded,
            10,
            &[3, 3],
            &[1.0, 3.0, 2.0, 9.0, 9.0, 9.0, 0.0, -1.0, 5.0],
        );
        keep.keep(&recorded, 13, &[1, 3], &[7.0, 8.0, 6.0]);
        let got: Vec<(Vec<f32>, Vec<u32>)> = keep
            .rows
            .iter()
            .map(|t| (t.values.clone(), t.ids.clone()))
            .collect();
        assert_eq!(
            got,
            [
                (vec![3.0, 2.0], vec![1, 2]),
                (vec![5.0, 0.0], vec![2, 0]),
                (vec![8.0, 7.0], vec![1, 0]),
            ]
        );
    }
}
