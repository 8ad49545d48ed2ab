//! Per-layer state for a context and the per-device workspace (see the module doc of `plan`).
//! Every byte figure saturates at `u64::MAX` ([`sat_sum`], [`sat_product`]) instead of wrapping.

use super::*;
use serde::Serialize;

use crate::config::{LayerKind, ModelConfig};

/// Per-layer state bytes on the device for a context (see the module docs for the layouts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LayerState {
    pub window: u64,
    pub compressed_kv: u64,
    pub index_keys: u64,
    pub compressor_carry: u64,
}

impl LayerState {
    pub fn total(&self) -> u64 {
        sat_sum([
            self.window,
            self.compressed_kv,
            self.index_keys,
            self.compressor_carry,
        ])
    }
}

/// The product of `factors`, `u64::MAX` if it overflows: byte figures saturate instead of
/// wrapping to a small, plausible number (a saturated figure never fits a device).
pub fn sat_product<const N: usize>(factors: [u64; N]) -> u64 {
    factors.into_iter().fold(1u64, u64::saturating_mul)
}

/// The sum of `terms`, saturating at `u64::MAX` (see [`sat_product`]).
pub fn sat_sum(terms: impl IntoIterator<Item = u64>) -> u64 {
    terms.into_iter().fold(0u64, u64::saturating_add)
}

/// Growth slack of the device caches: they double their allocation when full.
pub const CACHE_GROWTH_SLACK: u64 = 2;

/// State of main layer `layer` after `context` tokens run in prefill chunks of `chunk`.
pub fn layer_state(cfg: &ModelConfig, layer: usize, context: usize, chunk: usize) -> LayerState {
    let (c, hd) = (context as u64, cfg.head_dim as u64);
    let chunk = chunk.min(context).max(1) as u64;
    // f32 rows, allocations up to CACHE_GROWTH_SLACK x the rows held.
    let cache = |rows: u64, width: u64| sat_product([CACHE_GROWTH_SLACK, rows, width, 4]);
    let window = cache((cfg.sliding_window as u64).saturating_add(chunk), hd);
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
                compressed_kv: cache(rows, hd),
                // Raw (what the observer reads) and prepared keys, one multiplier per row.
                index_keys: sat_sum([cache(rows, ihd).saturating_mul(2), cache(rows, 1)]),
                compressor_carry: sat_product([8 * 2 * 2 * 4, hd.saturating_add(ihd)]),
            }
        }
        LayerKind::Hca => LayerState {
            window,
            compressed_kv: cache(c / 128, hd),
            index_keys: 0,
            compressor_carry: sat_product([128 * 2 * 4, hd]),
        },
    }
}

/// The largest single device cache allocation of any layer at `context`: while a cache grows
/// (old and doubled allocation) or drops its front (old and new allocation), two of its
/// allocations coexist for a moment, so every device keeps this much headroom on top of the
/// caches counted in [`layer_state`].
pub fn largest_cache_bytes(cfg: &ModelConfig, context: usize, chunk: usize) -> u64 {
    (0..cfg.num_hidden_layers)
        .map(|l| {
            let s = layer_state(cfg, l, context, chunk);
            s.window.max(s.compressed_kv).max(s.index_keys)
        })
        .max()
        .unwrap_or(0)
}

/// Query tokens the indexer scores at once (`model::indexer::TOKENS_PER_BLOCK`).
const INDEX_SCORE_TOKENS: u64 = crate::model::indexer::TOKENS_PER_BLOCK as u64;

/// Workspace of one device for a prefill chunk of `chunk` tokens at context `context`; `last`
/// adds the probed positions' logits.
pub fn workspace_bytes(cfg: &ModelConfig, context: usize, chunk: usize, last: bool) -> u64 {
    let t = chunk.min(context).max(1) as u64;
    let c = context as u64;
    let u = |v: usize| v as u64;
    // A top-k past the rows the context can have selects them all: it costs no more.
    let topk = u(cfg.index_topk).min(c / 4);
    let per_token = sat_sum([
        sat_product([3, u(cfg.hc_mult), u(cfg.hidden_size)]),
        sat_product([2, u(cfg.num_attention_heads), u(cfg.head_dim)]),
        sat_product([
            u(cfg.num_attention_heads),
            sat_sum([u(cfg.sliding_window), topk, c / 128]),
        ]),
        // Routed experts, all k slots of the chunk at once (GPU `moe_experts`): gate, up and
        // SwiGLU rows [k, inter], gathered inputs and outputs [k, hidden]; twice that for the
        // batched products' padding (at most as many padding rows as real ones).
        sat_product([
            2,
            u(cfg.num_experts_per_tok),
            sat_sum([
                sat_product([3, u(cfg.moe_intermediate_size)]),
                sat_product([2, u(cfg.hidden_size)]),
            ]),
        ]),
        // The CSA compressor's kv and gate projections [T, 2 * head_dim] each, and their copy
        // appended to its buffer of held tokens (pooled there, on the device).
        sat_product([4, 2, u(cfg.head_dim)]),
    ]);
    let logits = if last {
        sat_product([PROBED_LOGIT_ROWS, u(cfg.vocab_size), 4])
    } else {
        0
    };
    // The indexer scores one block of query tokens at a time against every compressed row
    // (`model::indexer`, 256 tokens a block): [block, context / 4] f32.
    let index_scores = sat_product([4, t.min(INDEX_SCORE_TOKENS), c / 4]);
    sat_sum([
        FIXED_WORKSPACE,
        sat_product([4, t, per_token]),
        index_scores,
        logits,
        largest_cache_bytes(cfg, context, chunk),
    ])
}

// ---------------------------------------------------------------------------------------------
// Devices
// ---------------------------------------------------------------------------------------------
