//! The prefill benchmark: load a model, time one prefill of given tokens (logits of the last
//! position only, no observer), and break the time down by layer type (SWA, CSA, HCA) with the
//! arithmetic each layer did, so that a run on a few layers projects to the whole model.
//!
//! FLOP model (per prefill of `L` tokens, counted, not measured): every linear of a layer costs
//! `2·rows·cols` per token (routed experts: `num_experts_per_tok` of them; the router and the
//! shared expert on every token); attention `4·heads·head_dim` per attended entry (QK and PV),
//! with `min(p+1, window)` window entries plus, at position `p`, `min(topk, (p+1)/4)` CSA rows
//! or `(p+1)/128` HCA rows; the CSA indexer `2·index_heads·index_head_dim` per visible row.
//! Elementwise work (norms, mHC, pooling) is left out: it is small next to these.

use super::forward::{LogitsRequest, Model, ModelOptions};
use super::observer::NoObserver;
use super::ModelError;
use crate::backend::{Backend, WeightResidency};
use crate::checkpoint::Checkpoint;
use crate::config::{LayerKind, ModelConfig};
use std::time::Instant;

/// Timing of one prefill.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchFigures {
    pub tokens: usize,
    /// Wall seconds of the prefill (loading excluded).
    pub seconds: f64,
    pub tokens_per_s: f64,
    /// Wall seconds spent loading (and, for `Decoded`, decoding) the weights.
    pub load_seconds: f64,
    /// The weight residency in force (`Auto` resolved).
    pub weights: WeightResidency,
}

/// Loads `ckpt` with `opts` and linears resident per `weights` on the CPU backend and times
/// the prefill of `tokens`.
pub fn bench_prefill(
    ckpt: &Checkpoint,
    opts: ModelOptions,
    weights: WeightResidency,
    tokens: &[u32],
) -> Result<BenchFigures, ModelError> {
    let t_load = Instant::now();
    let model = Model::load_weights(ckpt, opts, weights)?;
    let load_seconds = t_load.elapsed().as_secs_f64();
    let profile = time_prefill(&model, tokens)?;
    Ok(BenchFigures {
        tokens: tokens.len(),
        seconds: profile.seconds,
        tokens_per_s: tokens.len() as f64 / profile.seconds.max(1e-12),
        load_seconds,
        weights: model.backend().weights(),
    })
}

/// Where the time of one prefill went.
#[derive(Clone, Debug, PartialEq)]
pub struct PrefillProfile {
    pub tokens: usize,
    pub seconds: f64,
    /// `[embed, layer 0, .., layer n-1, head]` wall seconds.
    pub site_seconds: Vec<f64>,
    /// Bytes the backend copied (host -> device, device -> host) during the prefill
    /// ([`Backend::transfer_bytes`]; zero on the CPU).
    pub transfer_bytes: (u64, u64),
    /// The backend's notes on weight copies it keeps, after the prefill
    /// ([`Backend::resident_notes`]).
    pub resident_notes: Vec<String>,
    /// Device memory held by the backend's buffers after the prefill, with the peaks during
    /// this prefill alone ([`Backend::device_memory`]; empty on the CPU).
    pub device_memory: Vec<crate::backend::DeviceMemoryUse>,
}

impl PrefillProfile {
    /// Mean bytes copied each way per token per decoder layer (`None` without layers or
    /// tokens).
    pub fn transfer_per_token_layer(&self) -> Option<(f64, f64)> {
        let layers = self.site_seconds.len().checked_sub(2)?;
        let n = (self.tokens * layers) as f64;
        (n > 0.0).then(|| {
            (
                self.transfer_bytes.0 as f64 / n,
                self.transfer_bytes.1 as f64 / n,
            )
        })
    }
}

/// Times one prefill of `tokens` on a loaded model of any backend (a fresh sequence).
pub fn time_prefill<B: Backend>(
    model: &Model<B>,
    tokens: &[u32],
) -> Result<PrefillProfile, ModelError> {
    let mut state = model.new_sequence();
    model.take_site_seconds();
    let (up0, down0) = model.backend().transfer_bytes();
    // The device memory peaks reported below are this prefill's own.
    model.backend().reset_memory_peaks();
    let t0 = Instant::now();
    model.forward(&mut state, tokens, &mut NoObserver, LogitsRequest::Last)?;
    let seconds = t0.elapsed().as_secs_f64();
    let (up1, down1) = model.backend().transfer_bytes();
    Ok(PrefillProfile {
        tokens: tokens.len(),
        seconds,
        site_seconds: model.take_site_seconds(),
        transfer_bytes: (up1 - up0, down1 - down0),
        resident_notes: model.backend().resident_notes(),
        device_memory: model.backend().device_memory(),
    })
}

/// Parameters `rows·cols` of every linear of layer `layer` as stored in `ckpt`, split into
/// (computed for every token, one routed expert).
fn layer_linear_params(ckpt: &Checkpoint, layer: usize) -> (f64, f64) {
    let prefix = format!("layers.{layer}.");
    let (mut dense, mut expert) = (0f64, 0f64);
    for name in ckpt.names() {
        let Some(module) = name
            .strip_prefix(&prefix)
            .and_then(|m| m.strip_suffix(".weight"))
        else {
            continue;
        };
        let Some(info) = ckpt.info(name) else {
            continue;
        };
        if info.shape.len() != 2 {
            continue;
        }
        let (rows, stored_cols) = (info.shape[0], info.shape[1]);
        // Packed FP4 holds two values per byte: the logical width is the one that loads.
        let full = format!("{prefix}{module}");
        let cols = [stored_cols, stored_cols * 2]
            .into_iter()
            .find(|&c| ckpt.shared_linear(&full, rows, c).is_ok())
            .unwrap_or(stored_cols);
        let p = (rows * cols) as f64;
        if let Some(rest) = module.strip_prefix("ffn.experts.") {
            if rest.starts_with("0.") {
                expert += p;
            }
        } else {
            dense += p;
        }
    }
    (dense, expert)
}

/// The counted FLOPs of one layer for a prefill of `tokens` tokens from position 0 (module doc).
pub fn layer_flops(ckpt: &Checkpoint, layer: usize, tokens: usize, topk: usize) -> f64 {
    let cfg = ckpt.config();
    let (dense, expert) = layer_linear_params(ckpt, layer);
    let linear = 2.0 * (dense + cfg.num_experts_per_tok as f64 * expert) * tokens as f64;
    let role = *cfg.layer_roles().get(layer);
    let per_entry = 4.0 * (cfg.num_attention_heads * cfg.head_dim) as f64;
    let per_row = 2.0 * (cfg.index_n_heads * cfg.index_head_dim) as f64;
    let mut attention = 0f64;
    for p in 0..tokens {
        let mut entries = (p + 1).min(cfg.sliding_window) as f64;
        if let Some(mapping) = role.rows() {
            let rows = mapping.visible_rows(p);
            // A selection attends to its top-k of the visible rows, otherwise all of them.
            entries += if role.uses_selection() {
                rows.min(topk)
            } else {
                rows
            } as f64;
            if role.has_indexer() {
                attention += per_row * rows as f64;
            }
        }
        attention += per_entry * entries;
    }
    linear + attention
}

/// Time and arithmetic of one layer type in a measured prefill.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerTypeFigures {
    pub kind: LayerKind,
    /// Layers of this type that were measured.
    pub layers: usize,
    /// Mean wall seconds per layer of this type.
    pub seconds_per_layer: f64,
    /// Mean counted FLOPs per layer of this type.
    pub flops_per_layer: f64,
}

impl LayerTypeFigures {
    /// Achieved TFLOP/s (counted FLOPs over wall time).
    pub fn tflops(&self) -> f64 {
        self.flops_per_layer / self.seconds_per_layer.max(1e-12) / 1e12
    }
}

/// Groups a measured prefill by layer type.
pub fn by_layer_type(
    ckpt: &Checkpoint,
    profile: &PrefillProfile,
    topk: usize,
) -> Vec<LayerTypeFigures> {
    let cfg = ckpt.config();
    let mut out: Vec<LayerTypeFigures> = Vec::new();
    for layer in 0..cfg.num_hidden_layers {
        let kind = cfg.layer_kind(layer);
        let secs = profile.site_seconds.get(layer + 1).copied().unwrap_or(0.0);
        let flops = layer_flops(ckpt, layer, profile.tokens, topk);
        match out.iter_mut().find(|f| f.kind == kind) {
            Some(f) => {
                let n = f.layers as f64;
                f.seconds_per_layer = (f.seconds_per_layer * n + secs) / (n + 1.0);
                f.flops_per_layer = (f.flops_per_layer * n + flops) / (n + 1.0);
                f.layers += 1;
            }
            None => out.push(LayerTypeFigures {
                kind,
                layers: 1,
                seconds_per_layer: secs,
                flops_per_layer: flops,
            }),
        }
    }
    out
}

/// Projected prefill tokens/s of the full `target` model (its layer schedule; MTP excluded)
/// from measured per-type layer times plus the measured embedding and head. None when a layer
/// type of the target was not measured.
pub fn projected_tokens_per_s(
    target: &ModelConfig,
    types: &[LayerTypeFigures],
    profile: &PrefillProfile,
) -> Option<f64> {
    let mut seconds = profile.site_seconds.first().copied().unwrap_or(0.0)
        + profile.site_seconds.last().copied().unwrap_or(0.0);
    for layer in 0..target.num_hidden_layers {
        let kind = target.layer_kind(layer);
        seconds += types.iter().find(|f| f.kind == kind)?.seconds_per_layer;
    }
    Some(profile.tokens as f64 / seconds.max(1e-12))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn projection_sums_the_target_schedule() {
        let target = ModelConfig::flash();
        let types = [LayerKind::Swa, LayerKind::Csa, LayerKind::Hca].map(|kind| LayerTypeFigures {
            kind,
            layers: 1,
            seconds_per_layer: match kind {
                LayerKind::Swa => 1.0,
                LayerKind::Csa => 2.0,
                LayerKind::Hca => 3.0,
                LayerKind::Csa2 | LayerKind::Csa1 => unreachable!("a V4 schedule"),
            },
            flops_per_layer: 1e12,
        });
        let profile = PrefillProfile {
            tokens: 1000,
            seconds: 0.0,
            site_seconds: vec![0.5, 0.0, 0.5],
            transfer_bytes: (0, 0),
            resident_notes: Vec::new(),
            device_memory: Vec::new(),
        };
        let counts = |k: LayerKind| {
            (0..target.num_hidden_layers)
                .filter(|&l| target.layer_kind(l) == k)
                .count() as f64
        };
        let want = 1.0
            + counts(LayerKind::Swa)
            + 2.0 * counts(LayerKind::Csa)
            + 3.0 * counts(LayerKind::Hca);
        let got = projected_tokens_per_s(&target, &types, &profile).unwrap();
        assert!((got - 1000.0 / want).abs() < 1e-9, "{got}");
        assert_eq!(types[1].tflops(), 0.5);
        assert!(projected_tokens_per_s(&target, &types[..2], &profile).is_none());
    }
}
