//! The values of synthetic tensors, by [`TensorRole`]: chosen so activations stay O(1) through every
//! layer of a random model, and reproducible from `(seed, name)` alone (see `prng.rs`).
//!
//! | role | value (z ~ unit Irwin-Hall normal, u ~ uniform [0,1)) |
//! |---|---|
//! | linear weights (all formats), `head` | `z / sqrt(in)` (in = logical input dim) |
//! | `embed.weight` | `z` |
//! | `*norm.weight` | `1 + 0.02 z` |
//! | `attn_sink` | `0.1 z` |
//! | compressor `ape` | `0.1 z` |
//! | `hc_*_fn` | `0.25 z / sqrt(in)`: mixing logits move by ~0.25, coefficients stay near uniform |
//! | `hc_*_base` | `0.1 z`, plus 2 on the diagonal of the comb block (rows 2hc.., `comb[j][j]`) so the Sinkhorn matrix starts near identity |
//! | `hc_*_scale` | `0.1 + 0.9 u` |
//! | `ffn.gate.bias` | `0.05 z` |
//! | `ffn.gate.tid2eid` | per token, `experts_per_tok` distinct ids in `[0, experts)` |
//! | V4.1 Engram table `engram.embed` | `z`, like `embed.weight`: rows are looked up, not multiplied, and the projection after them (`engram.wkv`, `z / sqrt(in)`) keeps the output O(1) |
//! | V4.1 Engram `q_weight` / `k_weight` | `1 + 0.1 z` (their product is one gate weight per dimension) |
//! | V4.1 image delimiters | `z` |
//! | V4.1 vision and aligner biases | `0.02 z` |
//!
//! The config enters only through [`GenParams`] (the mHC stream count and the routed-expert
//! count), so one generator serves DeepSeek-V4 ([`ModelConfig`]) and DeepSeek-V4.1
//! ([`V41Config`]).
//!
//! The seed of a linear is that of its `<module>.weight` name, so one seed gives the same
//! logical weights in every format; formats differ only in how they round them.

use crate::checkpoint::inventory::{LogicalTensor, TensorRole};
use crate::config::{ModelConfig, V41Config};
use crate::numerics::rng::{irwin_hall4, tensor_seed, unit_f64, Xoshiro256ss, CHUNK};
use rayon::prelude::*;

/// A generated tensor, before any storage rounding.
#[derive(Clone, Debug, PartialEq)]
pub enum Values {
    F32(Vec<f32>),
    I64(Vec<i64>),
}

/// What the generator needs of a model's config: the mHC stream count (`hc_*_base` layout)
/// and the routed experts a hash router (`tid2eid`) draws from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GenParams {
    pub hc_mult: usize,
    pub n_routed_experts: usize,
}

impl From<&ModelConfig> for GenParams {
    fn from(cfg: &ModelConfig) -> Self {
        GenParams {
            hc_mult: cfg.hc_mult,
            n_routed_experts: cfg.n_routed_experts,
        }
    }
}

impl From<&V41Config> for GenParams {
    /// DeepSeek-V4.1 has no hash router; the backbone's expert count is given all the same.
    fn from(cfg: &V41Config) -> Self {
        GenParams {
            hc_mult: cfg.text.hc_mult,
            n_routed_experts: cfg.text.n_routed_experts,
        }
    }
}

/// The name whose seed drives `lt` (`<module>.weight` for linears).
pub fn seed_name(lt: &LogicalTensor) -> String {
    if lt.role.is_linear() {
        format!("{}.weight", lt.name)
    } else {
        lt.name.clone()
    }
}

/// Per-element recipe: value = offset(i) + scale * sample.
#[derive(Clone, Copy)]
enum Dist {
    Normal {
        mean: f64,
        std: f64,
    },
    Uniform {
        lo: f64,
        hi: f64,
    },
    /// mHC base: `0.1 z`, plus `diag` on comb-diagonal entries of an `hc` stream layout.
    HcBase {
        hc: usize,
    },
}

fn dist(p: GenParams, lt: &LogicalTensor) -> Dist {
    let fan_in = lt.shape.get(1).copied().unwrap_or(1).max(1) as f64;
    match lt.role {
        TensorRole::PlainLinear
        | TensorRole::CompressorLinear(_)
        | TensorRole::QuantLinear
        | TensorRole::RoutedExpert { .. } => Dist::Normal {
            mean: 0.0,
            std: 1.0 / fan_in.sqrt(),
        },
        // The Engram table is an embedding (rows looked up, then projected by `engram.wkv`):
        // unit scale, which FP8 e4m3 with one power-of-two scale per 32 columns represents to
        // e4m3's relative step.
        TensorRole::Embed | TensorRole::ImageDelimiter | TensorRole::EngramTable => Dist::Normal {
            mean: 0.0,
            std: 1.0,
        },
        // Multiplied together into one per-dimension gate weight.
        TensorRole::EngramGate => Dist::Normal {
            mean: 1.0,
            std: 0.1,
        },
        TensorRole::Bias => Dist::Normal {
            mean: 0.0,
            std: 0.02,
        },
        TensorRole::Norm => Dist::Normal {
            mean: 1.0,
            std: 0.02,
        },
        TensorRole::AttnSink | TensorRole::Ape => Dist::Normal {
            mean: 0.0,
            std: 0.1,
        },
        TensorRole::HcFn => Dist::Normal {
            mean: 0.0,
            std: 0.25 / fan_in.sqrt(),
        },
        TensorRole::HcBase => Dist::HcBase { hc: p.hc_mult },
        TensorRole::HcScale => Dist::Uniform { lo: 0.1, hi: 1.0 },
        TensorRole::GateBias => Dist::Normal {
            mean: 0.0,
            std: 0.05,
        },
        // Integer table, generated by `tid2eid`; zeros if someone asks for it as f32.
        TensorRole::Tid2eid => Dist::Normal {
            mean: 0.0,
            std: 0.0,
        },
    }
}

fn sample(d: Dist, i: usize, u: u64) -> f32 {
    let v = match d {
        Dist::Normal { mean, std } => mean + std * irwin_hall4(u),
        Dist::Uniform { lo, hi } => lo + (hi - lo) * unit_f64(u),
        Dist::HcBase { hc } => {
            let noise = 0.1 * irwin_hall4(u);
            // Layout: pre [0, hc), post [hc, 2hc), comb [2hc, 2hc + hc*hc) with comb[j][k] at
            // 2hc + j*hc + k. The head's base ([hc]) has no comb block.
            let diag = i >= 2 * hc && {
                let k = i - 2 * hc;
                k / hc == k % hc
            };
            if diag {
                noise + 2.0
            } else {
                noise
            }
        }
    };
    v as f32
}

/// Fills `out` with elements `[start, start + out.len())` of the f32 tensor `lt` (any
/// `start`; chunk-aligned starts avoid skipping draws).
pub fn fill_f32(
    cfg: impl Into<GenParams>,
    seed: u64,
    lt: &LogicalTensor,
    start: usize,
    out: &mut [f32],
) {
    let ts = tensor_seed(seed, &seed_name(lt));
    let d = dist(cfg.into(), lt);
    // A leading partial chunk: its generator, advanced past the elements before `start`.
    let skip = start % CHUNK;
    let head = if skip == 0 {
        0
    } else {
        (CHUNK - skip).min(out.len())
    };
    let (head_out, rest) = out.split_at_mut(head);
    if head > 0 {
        let mut g = Xoshiro256ss::stream(ts, (start / CHUNK) as u64);
        (0..skip).for_each(|_| {
            g.next_u64();
        });
        for (j, o) in head_out.iter_mut().enumerate() {
            *o = sample(d, start + j, g.next_u64());
        }
    }
    let first = (start + head) / CHUNK;
    let fill = |(c, chunk): (usize, &mut [f32])| {
        let mut g = Xoshiro256ss::stream(ts, (first + c) as u64);
        let base = (first + c) * CHUNK;
        for (j, o) in chunk.iter_mut().enumerate() {
            *o = sample(d, base + j, g.next_u64());
        }
    };
    if rest.len() > 4 * CHUNK {
        rest.par_chunks_mut(CHUNK).enumerate().for_each(fill);
    } else {
        rest.chunks_mut(CHUNK).enumerate().for_each(fill);
    }
}

/// The `tid2eid` table `[vocab, k]`: for every token, `k` distinct experts in `[0, experts)`.
pub fn tid2eid(seed: u64, lt: &LogicalTensor, experts: usize) -> Vec<i64> {
    let (rows, k) = (lt.shape[0], lt.shape[1]);
    let mut g = Xoshiro256ss::stream(tensor_seed(seed, &lt.name), 0);
    let mut out = Vec::with_capacity(rows * k);
    let k_eff = k.min(experts);
    for _ in 0..rows {
        let row_start = out.len();
        while out.len() < row_start + k_eff {
            let e = g.below(experts as u64) as i64;
            if !out[row_start..].contains(&e) {
                out.push(e);
            }
        }
        // Only reachable for configs with k > experts (rejected by config validation).
        out.resize(row_start + k, 0);
    }
    out
}

/// The whole generated tensor (`cfg`: a [`ModelConfig`], a [`V41Config`] or their
/// [`GenParams`]).
pub fn generate(cfg: impl Into<GenParams>, seed: u64, lt: &LogicalTensor) -> Values {
    let p = cfg.into();
    if lt.role == TensorRole::Tid2eid {
        return Values::I64(tid2eid(seed, lt, p.n_routed_experts));
    }
    let mut v = vec![0.0f32; lt.shape.iter().product()];
    fill_f32(p, seed, lt, 0, &mut v);
    Values::F32(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::inventory::logical_inventory;

    fn find(cfg: &ModelConfig, name: &str) -> LogicalTensor {
        logical_inventory(cfg)
            .into_iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("{name} not in inventory"))
    }

    #[test]
    fn chunked_fill_equals_whole_tensor() {
        let cfg = ModelConfig::tiny();
        let lt = find(&cfg, "embed.weight");
        let Values::F32(whole) = generate(&cfg, 5, &lt) else {
            panic!()
        };
        let mut part = vec![0.0; 3 * CHUNK];
        fill_f32(&cfg, 5, &lt, 2 * CHUNK, &mut part);
        assert_eq!(&whole[2 * CHUNK..5 * CHUNK], &part[..]);
        // Unaligned starts and a piece inside one chunk.
        let mut odd = vec![0.0; 2 * CHUNK + 7];
        fill_f32(&cfg, 5, &lt, CHUNK + 13, &mut odd);
        assert_eq!(&whole[CHUNK + 13..3 * CHUNK + 20], &odd[..]);
        let mut small = vec![0.0; 5];
        fill_f32(&cfg, 5, &lt, 3, &mut small);
        assert_eq!(&whole[3..8], &small[..]);
    }

    #[test]
    fn linear_weights_have_std_one_over_sqrt_fan_in() {
        let cfg = ModelConfig::tiny();
        let lt = find(&cfg, "layers.0.attn.wq_b");
        let Values::F32(v) = generate(&cfg, 1, &lt) else {
            panic!()
        };
        let var = v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>() / v.len() as f64;
        let want = 1.0 / lt.shape[1] as f64;
        assert!((var / want - 1.0).abs() < 0.1, "var {var} want {want}");
    }

    #[test]
    fn hc_base_puts_plus_two_on_the_comb_diagonal_only() {
        let cfg = ModelConfig::tiny();
        let Values::F32(v) = generate(&cfg, 1, &find(&cfg, "layers.0.hc_attn_base")) else {
            panic!()
        };
        let hc = cfg.hc_mult;
        for (i, x) in v.iter().enumerate() {
            let diag = i >= 2 * hc && (i - 2 * hc) / hc == (i - 2 * hc) % hc;
            assert_eq!(*x > 1.0, diag, "entry {i} = {x}");
        }
    }

    #[test]
    fn tid2eid_rows_are_distinct_experts_in_range() {
        let cfg = ModelConfig::tiny();
        let lt = find(&cfg, "layers.0.ffn.gate.tid2eid");
        let Values::I64(t) = generate(&cfg, 9, &lt) else {
            panic!()
        };
        let k = cfg.num_experts_per_tok;
        for row in t.chunks(k) {
            assert!(row
                .iter()
                .all(|&e| (0..cfg.n_routed_experts as i64).contains(&e)));
            for a in 0..k {
                assert!(!row[a + 1..].contains(&row[a]), "duplicate in {row:?}");
            }
        }
    }
}
