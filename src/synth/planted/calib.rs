//! Calibration of the planted needle increment on reference haystack text, so that `--margin`
//! is the needle's exact z-score on the passkey haystack rather than on i.i.d. random tokens.
//!
//! The passkey haystack is template prose with a small vocabulary: rows repeat common tokens,
//! and the frequency-weighted mean of a token projection is not zero, which moves the haystack
//! mean and spread of each layer by a few tenths of a standard deviation. So `synth` generates
//! [`REFERENCE_SENTENCES`] sentences with the probe's own noise generator (`noise_sentence`, a
//! fixed stream of the seed), tokenises them with the real tokenizer, and for every CSA layer
//! computes the haystack rows exactly as the indexer compressor does for non-digit tokens
//! (uniform pooling over tokens `[4w-4, 4w+3]`, RMS normalisation; RoPE and the block outputs
//! are left out: RoPE never touches the relevant channels and the blocks add ~0.3%). The exact
//! score of a row up to the query's common factor is `u(p) = Σ_h w_h ReLU(sqrt(d) p_h / ‖p‖)`;
//! with its mean μ and standard deviation σ over the rows, the needle's relevant-channel value x
//! solves `W sqrt(d) x / sqrt(c0 + H x²) = μ + margin σ` (`needle_x`).
//!
//! Input: the recipe (embedding, head weights, per-layer key projections), output: the recipe's
//! per-layer `deltas` and the (μ, σ) found, for `planted.json`.

use super::recipe::{dims, needle_x, Recipe, OFFSET};
use crate::checkpoint::CheckpointError;
use crate::numerics::rng::Rng;
use crate::probe::haystack::noise_sentence;
use crate::tokenizer::V4Tokenizer;

/// Sentences of reference haystack text (about 15 tokens each).
pub const REFERENCE_SENTENCES: usize = 3000;

/// Haystack statistics of one CSA layer on the reference text.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LayerCalibration {
    pub layer: usize,
    /// Mean and standard deviation of `u(p)` over the reference rows.
    pub mean: f64,
    pub std: f64,
    pub rows: usize,
    /// The needle increment chosen.
    pub delta: f64,
}

/// Token ids of the reference haystack text (seeded, no digits by construction of the
/// generator; any digit token is dropped anyway).
pub fn reference_tokens(
    tok: &V4Tokenizer,
    seed: u64,
    digits: &[bool],
) -> Result<Vec<u32>, CheckpointError> {
    let mut rng = Rng::stream(seed, "planted.calibration");
    let text: Vec<String> = (0..REFERENCE_SENTENCES)
        .map(|_| noise_sentence(&mut rng))
        .collect();
    let ids = tok
        .encode(&text.join(" "))
        .map_err(|e| CheckpointError::SynthOption {
            field: "tokenizer",
            expected: "the built-in tokenizer".into(),
            found: e.to_string(),
        })?;
    Ok(ids
        .into_iter()
        .filter(|&t| !digits.get(t as usize).copied().unwrap_or(false))
        .collect())
}

/// (mean, std, rows) of `u(p)` over the CSA rows of `tokens` at `layer`.
fn haystack_stats(r: &Recipe, layer: usize, tokens: &[u32]) -> (f64, f64, usize) {
    let (h, d, _, dd) = dims(&r.cfg);
    let half = r.index_half(layer);
    // Per-token channel values a_j = half · x_j.
    let a: Vec<f64> = tokens
        .iter()
        .flat_map(|&t| {
            let x = &r.embed[t as usize * dd..(t as usize + 1) * dd];
            half.chunks(dd)
                .map(|row| row.iter().zip(x).map(|(w, &v)| w * v as f64).sum::<f64>())
                .collect::<Vec<f64>>()
        })
        .collect();
    let rows = tokens.len() / 4;
    let mut u = Vec::with_capacity(rows);
    for w in 1..rows {
        let mut p = vec![0.0f64; d];
        for j in 4 * w - 4..4 * w + 4 {
            p.iter_mut()
                .zip(&a[j * d..(j + 1) * d])
                .for_each(|(s, v)| *s += v / 8.0);
        }
        let norm = p.iter().map(|v| v * v).sum::<f64>().sqrt();
        let score: f64 = (0..h)
            .map(|c| r.head_weights[c] * ((d as f64).sqrt() * p[c] / norm).max(0.0))
            .sum();
        u.push(score);
    }
    let n = u.len() as f64;
    let mean = u.iter().sum::<f64>() / n;
    let var = u.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    (mean, var.sqrt(), u.len())
}

/// Sets the recipe's needle increment of every CSA layer from the reference `tokens`.
pub fn calibrate(r: &mut Recipe, tokens: &[u32]) -> Vec<LayerCalibration> {
    let (h, d, _, _) = dims(&r.cfg);
    let sum_w: f64 = r.head_weights.iter().sum();
    let c0 = r.needle_c0();
    let mut out = Vec::new();
    for layer in r.cfg.layer_roles().indexed_layers() {
        let (mean, std, rows) = haystack_stats(r, layer, tokens);
        if rows < 16 || std.is_nan() || std <= 0.0 {
            continue;
        }
        let target = (mean + r.margin * std) / (sum_w * (d as f64).sqrt());
        let delta = needle_x(target, c0, h) - OFFSET;
        r.deltas[layer] = delta;
        out.push(LayerCalibration {
            layer,
            mean,
            std,
            rows,
            delta,
        });
    }
    out
}
