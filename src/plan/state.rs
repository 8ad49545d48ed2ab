//! Per-layer state for a context and the per-device workspace (see the module doc of `plan`).

use super::*;
use serde::Serialize;

use crate::config::{LayerKind, ModelConfig};

/// Per-layer state bytes for a context (see the module docs for the layouts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LayerState {
    pub window: u64,
    pub compressed_kv: u64,
    pub index_keys: u64,
    pub compressor_carry: u64,
}

impl LayerState {
    pub fn total(&self) -> u64 {
        self.window + self.compressed_kv + self.index_keys + self.compressor_carry
    }
}

/// State of main layer `layer` after `context` tokens.
pub fn layer_state(cfg: &ModelConfig, layer: usize, context: usize) -> LayerState {
    let (c, hd) = (context as u64, cfg.head_dim as u64);
    let window = cfg.sliding_window as u64 * hd * 2;
    match cfg.layer_kind(layer) {
        LayerKind::Swa => LayerState {
            window,
            ..Default::default()
        },
        LayerKind::Csa => {
            let rows = c / 4;
            let ihd = cfg.index_head_dim as u64;
            LayerState {
                window,
                compressed_kv: rows * hd * 2,
                index_keys: rows * ihd * 4,
                compressor_carry: (8 * 2 * 2 * hd + 8 * 2 * 2 * ihd) * 4,
            }
        }
        LayerKind::Hca => LayerState {
            window,
            compressed_kv: (c / 128) * hd * 2,
            index_keys: 0,
            compressor_carry: 128 * 2 * hd * 4,
        },
    }
}

/// Workspace of one device for a prefill chunk of `chunk` tokens at context `context`; `last`
/// adds the probed positions' logits.
pub fn workspace_bytes(cfg: &ModelConfig, context: usize, chunk: usize, last: bool) -> u64 {
    let t = chunk.min(context).max(1) as u64;
    let c = context as u64;
    let per_token = 3 * cfg.hc_mult as u64 * cfg.hidden_size as u64
        + 2 * cfg.num_attention_heads as u64 * cfg.head_dim as u64
        + cfg.num_attention_heads as u64
            * (cfg.sliding_window as u64 + cfg.index_topk as u64 + c / 128)
        + c / 4
        + 3 * cfg.num_experts_per_tok as u64 * cfg.moe_intermediate_size as u64;
    let logits = if last {
        PROBED_LOGIT_ROWS * cfg.vocab_size as u64 * 4
    } else {
        0
    };
    FIXED_WORKSPACE + 4 * t * per_token + logits
}

// ---------------------------------------------------------------------------------------------
// Devices
// ---------------------------------------------------------------------------------------------
