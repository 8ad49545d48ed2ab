//! The constants of DeepSeek-V4.1's Engram n-gram hash, derived from the config alone
//! (docs/spec/v41.md 5.2): per Engram layer, one odd multiplier per look-back position and, per
//! n-gram size and head, the prime its hash is reduced by and the table offset of its rows.
//!
//! - **Primes** ([`engram_primes`]): one walk over every Engram layer in order; for each n-gram
//!   size `2..=engram_max_ngram_size` the search restarts just above `engram_vocab_size - 1`
//!   and takes the next `engram_n_heads` primes not taken before (by any layer or size). A
//!   layer's table holds the sum of its primes: the released config's 384,006,168 and
//!   384,016,682 rows are exactly its `engram_num_embeddings`.
//! - **Offsets**: the running sum of the layer's primes in (size, head) order, so row
//!   `(h mod p) + offset` of head `j` for size `s` stays inside the layer's table.
//! - **Multipliers** ([`engram_multipliers`]): `numpy.random.default_rng(10007 · layer)`
//!   draws `engram_max_ngram_size` integers in `[0, B)`, `B = ⌊(2^63 − 1) / classes⌋ // 2`
//!   (`classes` = `engram_compressed_vocab_size`), each mapped to `2m + 1` (odd; a token class
//!   times it fits an i64), reproduced by [`crate::numerics::numpy_rng`].
//!
//! Shapes: `primes[size - 2][head]`, `offsets` alike, `multipliers[k]` for look-back `k` (0 =
//! the current token). The hash that uses them (token classes, XOR of products) is the
//! forward's (issue 41).

use super::v41::V41Config;
use crate::numerics::numpy_rng::NumpyGenerator;

/// The seed of layer `l`'s multipliers is `ENGRAM_SEED_STEP · l`.
pub const ENGRAM_SEED_STEP: u64 = 10_007;

/// The hash constants of one Engram layer (module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngramHash {
    pub layer: usize,
    /// One odd multiplier per look-back position `0..max_ngram`.
    pub multipliers: Vec<u64>,
    /// `primes[size - 2][head]`.
    pub primes: Vec<Vec<u64>>,
    /// `offsets[size - 2][head]`: where that head's rows start in the layer's table.
    pub offsets: Vec<Vec<u64>>,
    /// Rows of the layer's table (the sum of its primes).
    pub rows: u64,
}

/// The primes of each Engram layer (`[layer][size - 2][head]`) for `layers` layers, n-grams up
/// to `max_ngram`, `heads` heads and the search start `vocab` (module doc).
pub fn engram_primes(
    layers: usize,
    max_ngram: usize,
    heads: usize,
    vocab: u64,
) -> Vec<Vec<Vec<u64>>> {
    let is_prime = |n: u64| {
        n >= 2
            && (n < 4
                || (!n.is_multiple_of(2)
                    && (3..)
                        .step_by(2)
                        .take_while(|d| d * d <= n)
                        .all(|d| !n.is_multiple_of(d))))
    };
    let mut used = std::collections::BTreeSet::new();
    (0..layers)
        .map(|_| {
            (2..=max_ngram)
                .map(|_| {
                    let mut p = vocab.saturating_sub(1);
                    (0..heads)
                        .map(|_| {
                            p += 1;
                            while !is_prime(p) || used.contains(&p) {
                                p += 1;
                            }
                            used.insert(p);
                            p
                        })
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// The multipliers of Engram layer `layer` (module doc): `max_ngram` odd values.
pub fn engram_multipliers(layer: usize, max_ngram: usize, classes: usize) -> Vec<u64> {
    let bound = (i64::MAX / classes.max(1) as i64) / 2;
    let mut g = NumpyGenerator::new(ENGRAM_SEED_STEP * layer as u64);
    (0..max_ngram)
        .map(|_| {
            let m = g
                .integers(0, bound)
                .expect("validated: classes < 2^21 leaves a range wider than 2^32");
            2 * m as u64 + 1
        })
        .collect()
}

impl V41Config {
    /// The hash constants of every Engram layer, in `engram_layer_ids` order. Walks the primes
    /// from `engram_vocab_size`: milliseconds for the release, longer for huge synthetic values.
    pub fn engram_hashes(&self) -> Vec<EngramHash> {
        let t = &self.text;
        let primes = engram_primes(
            t.engram_layer_ids.len(),
            t.engram_max_ngram_size,
            t.engram_n_heads,
            t.engram_vocab_size,
        );
        t.engram_layer_ids
            .iter()
            .zip(primes)
            .map(|(&layer, primes)| {
                let mut at = 0u64;
                let offsets = primes
                    .iter()
                    .map(|size| {
                        size.iter()
                            .map(|p| {
                                let o = at;
                                at += p;
                                o
                            })
                            .collect()
                    })
                    .collect();
                EngramHash {
                    layer,
                    multipliers: engram_multipliers(
                        layer,
                        t.engram_max_ngram_size,
                        t.engram_compressed_vocab_size,
                    ),
                    primes,
                    offsets,
                    rows: at,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn released() -> V41Config {
        let text = include_str!("../../tests/fixtures/deepseek_v41_flash_config.json");
        V41Config::from_json_str(text, Path::new("config.json")).unwrap()
    }

    /// The released constants (docs/spec/v41.md 5.2: multipliers extracted from the release,
    /// first and last primes, table sizes = `engram_num_embeddings`).
    #[test]
    fn the_released_constants() {
        let cfg = released();
        let h = cfg.engram_hashes();
        assert_eq!(h.len(), 2);
        assert_eq!(
            h[0].multipliers,
            [
                76_632_096_046_245,
                4_839_876_093_313,
                35_959_672_319_349,
                73_987_337_458_391
            ]
        );
        assert_eq!(
            h[1].multipliers,
            [
                67_716_810_739_261,
                51_510_806_800_915,
                30_921_347_202_721,
                82_619_226_485_591
            ]
        );
        let rows: Vec<u64> = h.iter().map(|e| e.rows).collect();
        assert_eq!(rows, cfg.text.engram_num_embeddings);
        assert_eq!((h[0].layer, h[1].layer), (1, 14));
        assert_eq!(h[0].primes[0][0], 16_000_057);
        assert_eq!(*h[1].primes[2].last().unwrap(), 16_000_889);
        // Layer 1 takes the first 24 primes above 15,999,999, layer 14 the next 24.
        assert_eq!(h[0].primes[2][7], 16_000_463);
        assert_eq!(h[1].primes[0][0], 16_000_477);
        // Offsets: running sums in (size, head) order.
        assert_eq!(h[0].offsets[0][0], 0);
        assert_eq!(h[0].offsets[0][1], 16_000_057);
        let last = h[0].offsets[2][7] + h[0].primes[2][7];
        assert_eq!(last, 384_006_168);
        // Every multiplier odd and small enough that a class id times it fits an i64.
        for e in &h {
            for &m in &e.multipliers {
                assert_eq!(m % 2, 1);
                assert!(u128::from(m) * 99_092 < 1u128 << 63);
            }
        }
    }

    #[test]
    fn primes_are_distinct_across_layers_and_sizes() {
        let p = engram_primes(3, 4, 8, 1000);
        let mut all: Vec<u64> = p.iter().flatten().flatten().copied().collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!((n, all.len()), (72, 72));
        assert!(all.iter().all(|&q| q >= 1000));
        // Each size restarts at the bottom: the first size's primes are the smallest.
        assert_eq!(p[0][0][0], 1009);
        // The second size starts after the first's 8 (1009, 1013, 1019, 1021, 1031, 1033, 1039,
        // 1049): at 1051.
        assert_eq!(p[0][1][0], 1051);
    }
}
