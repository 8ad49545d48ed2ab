//! Engram's inputs (docs/spec/v41.md 5.2): token ids → token classes → the table rows each
//! position looks up. No weights here.
//!
//! Position t looks back `k = 0..max_ngram - 1` tokens; a slot before the sequence start is
//! the pad class (the class of `engram_pad_token_id`; once blocked, every longer look-back is
//! pad). With per-layer odd multipliers `m_k`, `P_k = class_k · m_k` (fits i64 by the
//! multipliers' bound), `h_2 = P_0 ⊕ P_1`, `h_{s+1} = h_s ⊕ P_s`; for n-gram size s and head j
//! the row is `h_s mod p_{s,j} + offset_{s,j}` (`config::engram`). Columns come size-major
//! (size 2 heads 0..H, size 3 heads 0..H, ...), the order the gathered rows are concatenated
//! in before `engram.wkv`. Image-span ("dead") tokens are not supported: text prompts only.

use crate::config::engram::EngramHash;
use crate::model::ModelError;
use crate::tokenizer::V4Tokenizer;

/// The class of every token id, from the tokenizer ([`V4Tokenizer::engram_classes`]).
#[derive(Clone, Debug)]
pub struct TokenClasses {
    classes: Vec<u32>,
    pad: u32,
}

impl TokenClasses {
    /// Derives the classes of `tokenizer` and checks them against the config: the class count
    /// must be `engram_compressed_vocab_size` (every multiplier depends on it) and the pad id
    /// a token of the vocabulary.
    pub fn derive(
        tokenizer: &V4Tokenizer,
        expected_count: usize,
        pad_token: u32,
    ) -> Result<Self, ModelError> {
        let bad = |found: String, expected: String| ModelError::BadOption {
            option: "tokenizer",
            found,
            expected,
        };
        let (classes, count) = tokenizer.engram_classes().map_err(|e| {
            bad(
                format!("{}: {e}", tokenizer.source_name()),
                "a tokenizer whose ids can be decoded".into(),
            )
        })?;
        if count != expected_count {
            return Err(bad(
                format!(
                    "{} with {count} Engram token classes",
                    tokenizer.source_name()
                ),
                format!(
                    "engram_compressed_vocab_size {expected_count} classes (the model's own \
                     tokenizer.json)"
                ),
            ));
        }
        let Some(&pad) = classes.get(pad_token as usize) else {
            return Err(bad(
                format!("engram_pad_token_id {pad_token}"),
                format!("a token id below {}", classes.len()),
            ));
        };
        Ok(TokenClasses { classes, pad })
    }

    /// Classes of `tokens` (ids already validated against the vocabulary).
    pub fn of(&self, tokens: &[u32]) -> Vec<u32> {
        tokens.iter().map(|&t| self.classes[t as usize]).collect()
    }

    /// The pad class.
    pub fn pad(&self) -> u32 {
        self.pad
    }
}

/// Table rows `[T, (max_ngram - 1) · heads]` of one Engram layer for the chunk whose classes
/// are `chunk`, after the classes `history` of the tokens just before it (oldest first; fewer
/// than `max_ngram - 1` only at the sequence start).
pub fn engram_rows(hash: &EngramHash, history: &[u32], chunk: &[u32], pad: u32) -> Vec<usize> {
    let max_ngram = hash.multipliers.len();
    let heads = hash.primes.first().map_or(0, Vec::len);
    let cols = (max_ngram - 1) * heads;
    let mut out = Vec::with_capacity(chunk.len() * cols);
    for t in 0..chunk.len() {
        // The class k tokens back, or None before the sequence start.
        let back = |k: usize| -> Option<u32> {
            if k <= t {
                Some(chunk[t - k])
            } else {
                let h = k - t;
                history.len().checked_sub(h).map(|i| history[i])
            }
        };
        let mut rolling = 0u64;
        let mut blocked = false;
        for (k, &m) in hash.multipliers.iter().enumerate() {
            blocked |= back(k).is_none();
            let class = if blocked { pad } else { back(k).unwrap_or(pad) };
            // class < 2^17 and m below i64::MAX / classes: the product fits.
            let p = class as u64 * m;
            rolling = if k == 0 { p } else { rolling ^ p };
            if k >= 1 {
                for (&prime, &offset) in hash.primes[k - 1].iter().zip(&hash.offsets[k - 1]) {
                    out.push((rolling % prime + offset) as usize);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash() -> EngramHash {
        EngramHash {
            layer: 1,
            multipliers: vec![3, 5, 7],
            primes: vec![vec![5, 7], vec![3, 11]],
            offsets: vec![vec![0, 5], vec![12, 15]],
            rows: 26,
        }
    }

    #[test]
    fn rows_by_hand_with_pad_before_the_start() {
        // Classes [4, 7], pad 2, multipliers [3, 5, 7].
        // t = 0 looks back [4, pad, pad]: P = [12, 10, 14]; h2 = 6, h3 = 8.
        // t = 1 looks back [7, 4, pad]: P = [21, 20, 14]; h2 = 1, h3 = 15.
        // Rows (mod prime + offset): h2 -> [mod 5, mod 7 + 5], h3 -> [mod 3 + 12, mod 11 + 15].
        let r = engram_rows(&hash(), &[], &[4, 7], 2);
        assert_eq!(r, vec![1, 11, 14, 23, 1, 6, 12, 19]);
    }

    #[test]
    fn history_continues_a_sequence_across_chunks() {
        let h = hash();
        let whole = engram_rows(&h, &[], &[4, 6, 9, 1, 5], 2);
        let first = engram_rows(&h, &[], &[4, 6, 9], 2);
        let second = engram_rows(&h, &[6, 9], &[1, 5], 2);
        assert_eq!([first, second].concat(), whole);
    }
}
