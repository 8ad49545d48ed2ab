//! The values of synthetic tensors, by [`Role`]: chosen so activations stay O(1) through every
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
//!
//! The seed of a linear is that of its `<module>.weight` name, so one seed gives the same
//! logical weights in every format; formats differ only in how they round them.

use super::inventory::{LogicalTensor, Role};
use super::prng::{irwin_hall4, tensor_seed, unit_f64, Xoshiro256ss, CHUNK};
use crate::config::ModelConfig;
use rayon::prelude::*;

/// A generated tensor, before any storage rounding.
#[derive(Clone, Debug, PartialEq)]
pub enum Values {
    F32(Vec<f32>),
    I64(Vec<i64>),
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

fn dist(cfg: &ModelConfig, lt: &LogicalTensor) -> Dist {
    let fan_in = lt.shape.get(1).copied().unwrap_or(1).max(1) as f64;
    match lt.role {
        Role::PlainLinear | Role::QuantLinear | Role::RoutedExpert { .. } => Dist::Normal {
            mean: 0.0,
            std: 1.0 / fan_in.sqrt(),
        },
        Role::Embed => Dist::Normal {
            mean: 0.0,
            std: 1.0,
        },
        Role::Norm => Dist::Normal {
            mean: 1.0,
            std: 0.02,
        },
        Role::AttnSink | Role::Ape => Dist::Normal {
            mean: 0.0,
            std: 0.1,
        },
        Role::HcFn => Dist::Normal {
            mean: 0.0,
            std: 0.25 / fan_in.sqrt(),
        },
        Role::HcBase => Dist::HcBase { hc: cfg.hc_mult },
        Role::HcScale => Dist::Uniform { lo: 0.1, hi: 1.0 },
        Role::GateBias => Dist::Normal {
            mean: 0.0,
            std: 0.05,
        },
        Role::Tid2eid => Dist::Normal {
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

/// Fills `out` with elements `[start, start + out.len())` of the f32 tensor `lt`.
/// `start` must be a multiple of [`CHUNK`] (streaming writers cut tensors at chunk bounds).
pub fn fill_f32(cfg: &ModelConfig, seed: u64, lt: &LogicalTensor, start: usize, out: &mut [f32]) {
    assert_eq!(start % CHUNK, 0, "fill_f32 start must be chunk-aligned");
    let ts = tensor_seed(seed, &seed_name(lt));
    let d = dist(cfg, lt);
    let first = start / CHUNK;
    let fill = |(c, chunk): (usize, &mut [f32])| {
        let mut g = Xoshiro256ss::stream(ts, (first + c) as u64);
        let base = (first + c) * CHUNK;
        for (j, o) in chunk.iter_mut().enumerate() {
            *o = sample(d, base + j, g.next_u64());
        }
    };
    if out.len() > 4 * CHUNK {
        out.par_chunks_mut(CHUNK).enumerate().for_each(fill);
    } else {
        out.chunks_mut(CHUNK).enumerate().for_each(fill);
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

/// The whole generated tensor.
pub fn generate(cfg: &ModelConfig, seed: u64, lt: &LogicalTensor) -> Values {
    if lt.role == Role::Tid2eid {
        return Values::I64(tid2eid(seed, lt, cfg.n_routed_experts));
    }
    let mut v = vec![0.0f32; lt.shape.iter().product()];
    fill_f32(cfg, seed, lt, 0, &mut v);
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
