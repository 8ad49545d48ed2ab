//! The values of the `planted` checkpoint: which tensors are constructed and how (the math is
//! in `docs/planted.md`; [`Recipe::new`] derives every constant from the config, the seed and
//! the margin, and `planted_calib.rs` then sets the per-layer needle increments `deltas`).
//!
//! Embedding `e_t` `[D]` (rms exactly 1, so `x = RMSNorm(e)` equals `e` at every layer while
//! the blocks add little): dim [`BIAS`] = β for every token; dim [`NEEDLE`] = `F = sqrt(D - β²)`
//! for the 1,110 pure-digit tokens and 0 otherwise; dims 2.. a random direction of norm
//! `sqrt(D - β²)` for every other token, 0 for digits.
//!
//! Index key of one CSA layer, before its RMSNorm, in "key units" (a haystack row's pooled
//! vector `p` has `E‖p‖² = d`, so the normalised key has unit rms per element):
//! - channels `0..H` ("relevant", head h reads channel h): `offset` from the bias dim, plus a
//!   random projection of the token's random dims whose pooled mean over a row's 8 tokens has
//!   std `spread`, plus `delta` on digit tokens (from the needle dim);
//! - channels `H..nope` ("irrelevant"): a constant bulk vector plus a random projection with
//!   pooled std `irr_sd` per channel; no query ever reads them;
//! - RoPE channels: a constant vector on the slowly rotating pairs only.
//!
//! The gate reads the needle dim with gap `GATE_GAP`, so a row holding any digit token pools
//! the digit tokens only. Index query of head h: `Qc · qr[0] · e_h` (a scaled basis vector,
//! exact under every query rounding), `qr[0]` coming from the bias dim through `wq_a` row 0;
//! head weights from the bias dim, positive. Everything else takes the standard random values
//! of `values.rs`, with block outputs (`wo_b`, expert `w2`) scaled by `OUT_SCALE` and mHC mixes
//! by `HC_SCALE`, so the residual stream stays close to the embedding.

use crate::checkpoint::inventory::{LogicalTensor, TensorRole};
use crate::config::{LayerKind, ModelConfig};
use crate::numerics::rng::{tensor_seed, Xoshiro256ss};
use crate::synth::tensors::{generate, Values};
use rayon::prelude::*;

/// Embedding dim holding the same value for every token.
pub const BIAS: usize = 0;
/// Embedding dim holding the needle feature (pure-digit tokens).
pub const NEEDLE: usize = 1;
/// First embedding dim of the per-token random part.
pub const RANDOM0: usize = 2;

/// β: the bias dim's value (its share of the embedding's squared norm is β²/D).
pub const BIAS_VALUE: f64 = 4.0;
/// Relevant channels' constant offset (keeps every ReLU in the indexer active).
pub const OFFSET: f64 = 0.15;
/// Pooled std of each relevant channel over haystack rows: the haystack score spread. Small
/// against the key's unit rms, so fp8 key rounding (after the Hadamard) is a noise of about the
/// same size, while bf16 rounding is ~16x smaller.
pub const SPREAD: f64 = 0.022;
/// Share of a key's squared norm in the per-row random irrelevant part (decorrelates the fp8
/// rounding errors of neighbouring rows).
pub const IRR_FRAC: f64 = 0.05;
/// Share of a key's squared norm in the constant RoPE part (its slow rotation makes the
/// needle's own rounding error change with its position).
pub const ROPE_FRAC: f64 = 0.36;
/// RoPE pairs used by the constant part: rotation per CSA row (4 tokens) in this band.
pub const ROPE_BAND: (f64, f64) = (5e-4, 0.01);
/// Gate logit gap of digit tokens over other tokens in the index compressor.
pub const GATE_GAP: f64 = 30.0;
/// Index query scale `Qc`.
pub const QUERY_SCALE: f64 = 8.0;
/// Scale of block outputs (`wo_b`, expert and shared `w2`) relative to the standard values.
pub const OUT_SCALE: f32 = 0.003;
/// Scale of mHC `fn` mixes relative to the standard values (mixing logits move by ~0.01).
pub const HC_SCALE: f32 = 0.04;
/// Tokens pooled by one CSA row (overlapping windows of 2 x 4).
const ROW_TOKENS: f64 = 8.0;

/// Everything needed to produce any tensor of the planted checkpoint.
pub struct Recipe {
    pub cfg: ModelConfig,
    pub seed: u64,
    pub margin: f64,
    /// `[vocab]`: token is a pure-digit token.
    pub digits: Vec<bool>,
    /// The embedding `[vocab, D]` (f32, before the bf16 storage rounding).
    pub embed: Vec<f32>,
    /// Needle increment on each relevant channel (key units), per layer (CSA layers only).
    pub deltas: Vec<f64>,
    /// Pooled std of each irrelevant random channel.
    pub irr_sd: f64,
    /// Norm² of the bulk part (`bulk_frac · d`).
    pub bulk_norm2: f64,
    /// Rope-dim indices (within the key) that carry the constant rope part.
    pub rope_dims: Vec<usize>,
    /// Head weights (raw `weights_proj` output).
    pub head_weights: Vec<f64>,
}

/// The construction's fixed shapes: (heads H, key dim d, nope dims, hidden D).
pub fn dims(cfg: &ModelConfig) -> (usize, usize, usize, usize) {
    (
        cfg.index_n_heads,
        cfg.index_head_dim,
        cfg.index_nope_dim(),
        cfg.hidden_size,
    )
}

impl Recipe {
    /// Derives the constants; `digits` marks the pure-digit token ids. The needle increments
    /// start at their i.i.d.-token value ([`needle_delta`]); `planted_calib` refines them.
    pub fn new(cfg: &ModelConfig, seed: u64, margin: f64, digits: Vec<bool>) -> Self {
        let (h, d, nope, _) = dims(cfg);
        let df = d as f64;
        let rel = h as f64 * (OFFSET * OFFSET + SPREAD * SPREAD);
        let irr_ch = (nope - h) as f64;
        let irr_sd = (IRR_FRAC * df / irr_ch).sqrt();
        let freqs = cfg.rope_table(LayerKind::Csa).frequencies().to_vec();
        let mut rope_dims: Vec<usize> = freqs
            .iter()
            .enumerate()
            .filter(|(_, f)| (ROPE_BAND.0..=ROPE_BAND.1).contains(&(4.0 * **f as f64)))
            .flat_map(|(i, _)| [nope + 2 * i, nope + 2 * i + 1])
            .collect();
        if rope_dims.is_empty() {
            // No pair rotates in the band for this rope size: use the slowest pair.
            let i = freqs.len().saturating_sub(1);
            rope_dims = vec![nope + 2 * i, nope + 2 * i + 1];
        }
        let bulk_norm2 = df - rel - IRR_FRAC * df - ROPE_FRAC * df;
        let head_weights: Vec<f64> = (0..h)
            .map(|i| match h {
                1 => 1.0,
                _ => 0.75 + 0.5 * i as f64 / (h - 1) as f64,
            })
            .collect();
        let delta = needle_delta(margin, &head_weights, bulk_norm2 + ROPE_FRAC * df, df);
        let mut r = Recipe {
            cfg: cfg.clone(),
            seed,
            margin,
            digits,
            embed: Vec::new(),
            deltas: vec![delta; cfg.num_hidden_layers],
            irr_sd,
            bulk_norm2,
            rope_dims,
            head_weights,
        };
        r.embed = r.make_embed();
        r
    }

    /// Squared norm of the needle key outside the relevant channels.
    pub fn needle_c0(&self) -> f64 {
        self.bulk_norm2 + ROPE_FRAC * self.cfg.index_head_dim as f64
    }

    fn normal(&self, name: &str, n: usize) -> Vec<f64> {
        let mut g = Xoshiro256ss::from_seed(tensor_seed(self.seed, name));
        (0..n).map(|_| g.normal()).collect()
    }

    fn normal_with_norm(&self, name: &str, n: usize, norm: f64) -> Vec<f64> {
        let v = self.normal(name, n);
        let s = norm / v.iter().map(|x| x * x).sum::<f64>().sqrt().max(1e-300);
        v.into_iter().map(|x| x * s).collect()
    }

    /// `F = sqrt(D - β²)`: the needle dim of digits and the norm of other tokens' random part.
    fn feature(&self) -> f64 {
        (self.cfg.hidden_size as f64 - BIAS_VALUE * BIAS_VALUE).sqrt()
    }

    /// The embedding `[vocab, D]`.
    fn make_embed(&self) -> Vec<f32> {
        let d = self.cfg.hidden_size;
        let f = self.feature();
        let ts = tensor_seed(self.seed, "planted.embed");
        let mut out = vec![0.0f32; self.cfg.vocab_size * d];
        out.par_chunks_mut(d).enumerate().for_each(|(t, row)| {
            row[BIAS] = BIAS_VALUE as f32;
            if self.digits.get(t).copied().unwrap_or(false) {
                row[NEEDLE] = f as f32;
                return;
            }
            let mut g = Xoshiro256ss::stream(ts, t as u64);
            let r: Vec<f64> = (RANDOM0..d).map(|_| g.normal()).collect();
            let s = f / r.iter().map(|x| x * x).sum::<f64>().sqrt();
            for (o, v) in row[RANDOM0..].iter_mut().zip(r) {
                *o = (v * s) as f32;
            }
        });
        out
    }

    /// A projection of the random embedding dims whose per-token output has std `tok_sd`.
    fn projection(&self, name: &str, tok_sd: f64) -> Vec<f64> {
        let d = self.cfg.hidden_size;
        let per_dim = (self.feature().powi(2) / (d - RANDOM0) as f64).sqrt();
        self.normal_with_norm(name, d - RANDOM0, tok_sd / per_dim)
    }

    /// One half of `layers.L.attn.indexer.compressor.wkv`, `[d, D]` in f64, without the needle
    /// column (what a non-digit token sees).
    pub fn index_half(&self, layer: usize) -> Vec<f64> {
        let (h, d, nope, dd) = dims(&self.cfg);
        let p = format!("planted.layers.{layer}.index_key");
        let bulk = self.normal_with_norm(&format!("{p}.bulk"), nope - h, self.bulk_norm2.sqrt());
        // Every pair in the band gets the same amplitude and a random phase, so the needle's
        // rounding error is a function of several incommensurate angles of its position.
        let pairs = self.rope_dims.len() / 2;
        let amp = (ROPE_FRAC * d as f64 / pairs as f64).sqrt();
        let rope_all: Vec<f64> = (0..pairs)
            .flat_map(|i| self.normal_with_norm(&format!("{p}.rope.{i}"), 2, amp))
            .collect();
        let tok = ROW_TOKENS.sqrt();
        let mut half = vec![0.0f64; d * dd];
        for c in 0..d {
            let row = &mut half[c * dd..(c + 1) * dd];
            if c < h {
                row[BIAS] = OFFSET / BIAS_VALUE;
                let u = self.projection(&format!("{p}.relevant.{c}"), SPREAD * tok);
                row[RANDOM0..].copy_from_slice(&u);
            } else if c < nope {
                row[BIAS] = bulk[c - h] / BIAS_VALUE;
                let u = self.projection(&format!("{p}.irrelevant.{c}"), self.irr_sd * tok);
                row[RANDOM0..].copy_from_slice(&u);
            } else if let Some(i) = self.rope_dims.iter().position(|&r| r == c) {
                row[BIAS] = rope_all[i] / BIAS_VALUE;
            }
        }
        half
    }

    /// `layers.L.attn.indexer.compressor.wkv` `[2d, D]`: both halves identical; digits add
    /// the layer's needle increment to the relevant channels through the needle dim.
    fn index_wkv(&self, layer: usize) -> Vec<f32> {
        let (h, _, _, dd) = dims(&self.cfg);
        let mut half = self.index_half(layer);
        for c in 0..h {
            half[c * dd + NEEDLE] = self.deltas[layer] / self.feature();
        }
        half.iter().chain(half.iter()).map(|&v| v as f32).collect()
    }

    /// `layers.L.attn.indexer.compressor.wgate` `[2d, D]`: the needle dim only.
    fn index_wgate(&self) -> Vec<f32> {
        let (_, d, _, dd) = dims(&self.cfg);
        let mut w = vec![0.0f32; 2 * d * dd];
        let g = (GATE_GAP / self.feature()) as f32;
        w.chunks_mut(dd).for_each(|row| row[NEEDLE] = g);
        w
    }

    /// `layers.L.attn.indexer.wq_b` `[H·d, q_lora]`: head h = `Qc · qr[0] · e_h`.
    fn index_wq_b(&self) -> Vec<f32> {
        let (h, d, _, _) = dims(&self.cfg);
        let ql = self.cfg.q_lora_rank;
        let mut w = vec![0.0f32; h * d * ql];
        for head in 0..h {
            w[(head * d + head) * ql] = QUERY_SCALE as f32;
        }
        w
    }

    /// `layers.L.attn.indexer.weights_proj` `[H, D]`: constant positive head weights.
    fn index_weights_proj(&self) -> Vec<f32> {
        let dd = self.cfg.hidden_size;
        let mut w = vec![0.0f32; self.head_weights.len() * dd];
        for (row, hw) in w.chunks_mut(dd).zip(&self.head_weights) {
            row[BIAS] = (hw / BIAS_VALUE) as f32;
        }
        w
    }

    /// The values of one logical tensor.
    pub fn values(&self, lt: &LogicalTensor) -> Values {
        if lt.name == "embed.weight" {
            return Values::F32(self.embed.clone());
        }
        let (layer, rest) = match split_layer(&lt.name) {
            Some(x) => x,
            None => return self.standard(lt),
        };
        let x = match rest {
            "attn.indexer.compressor.wkv" => self.index_wkv(layer),
            "attn.indexer.compressor.wgate" => self.index_wgate(),
            "attn.indexer.compressor.ape" => vec![0.0; lt.shape.iter().product()],
            "attn.indexer.compressor.norm.weight" | "attn_norm.weight" => {
                vec![1.0; lt.shape.iter().product()]
            }
            "attn.indexer.wq_b" => self.index_wq_b(),
            "attn.indexer.weights_proj" => self.index_weights_proj(),
            "attn.wq_a" => {
                let mut w = self.standard_f32(lt);
                let dd = self.cfg.hidden_size;
                w[..dd].fill(0.0);
                w[BIAS] = (1.0 / BIAS_VALUE) as f32;
                w
            }
            _ => return self.standard(lt),
        };
        Values::F32(x)
    }

    fn standard_f32(&self, lt: &LogicalTensor) -> Vec<f32> {
        match generate(&self.cfg, self.seed, lt) {
            Values::F32(v) => v,
            Values::I64(_) => unreachable!("only tid2eid is integer"),
        }
    }

    /// Standard random values, with block outputs and mHC mixes scaled down.
    fn standard(&self, lt: &LogicalTensor) -> Values {
        let v = generate(&self.cfg, self.seed, lt);
        let scale = if lt.role == TensorRole::HcFn {
            HC_SCALE
        } else if lt.name.ends_with(".wo_b") || lt.name.ends_with(".w2") {
            OUT_SCALE
        } else {
            return v;
        };
        match v {
            Values::F32(x) => Values::F32(x.into_iter().map(|a| a * scale).collect()),
            other => other,
        }
    }
}

/// `("layers.3.attn.wq_a")` → `(3, "attn.wq_a")`.
fn split_layer(name: &str) -> Option<(usize, &str)> {
    let rest = name.strip_prefix("layers.")?;
    let (l, rest) = rest.split_once('.')?;
    Some((l.parse().ok()?, rest))
}

/// The needle increment on each relevant channel for i.i.d. random haystack tokens: the needle
/// rows' exact score sits `margin` haystack standard deviations above the haystack mean
/// (docs/planted.md, "Margin"). `c0` is the needle key's squared norm outside the relevant
/// channels, `d` the key dim.
pub fn needle_delta(margin: f64, w: &[f64], c0: f64, d: f64) -> f64 {
    let sum_w: f64 = w.iter().sum();
    let norm_w = w.iter().map(|x| x * x).sum::<f64>().sqrt();
    // Haystack rows: ‖p‖² = d on average; score ∝ Σ_h w_h p_h / ‖p‖.
    let target = (OFFSET + margin * SPREAD * norm_w / sum_w) / d.sqrt();
    needle_x(target, c0, w.len()) - OFFSET
}

/// Solves `x / sqrt(c0 + h·x²) = target` for x > 0: the relevant-channel value of a needle key
/// whose normalised relevant channels equal `sqrt(d) · target`.
pub fn needle_x(target: f64, c0: f64, h: usize) -> f64 {
    target * c0.sqrt() / (1.0 - h as f64 * target * target).max(1e-12).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_margin_needle_scores_like_the_haystack_mean() {
        let w = [0.75, 1.0, 1.25];
        let d = 32.0;
        let c0 = d - 3.0 * (OFFSET * OFFSET + SPREAD * SPREAD) - 0.05 * d;
        let delta = needle_delta(0.0, &w, c0, d);
        // The needle key has no random part (a smaller norm), so it needs a small negative
        // increment to score like the haystack mean.
        assert!(delta.abs() < 0.02 * OFFSET + 0.01, "delta {delta}");
        assert!(needle_delta(2.0, &w, c0, d) > needle_delta(1.0, &w, c0, d));
    }

    #[test]
    fn layer_names_split() {
        assert_eq!(split_layer("layers.12.attn.wq_a"), Some((12, "attn.wq_a")));
        assert_eq!(split_layer("embed.weight"), None);
    }
}
