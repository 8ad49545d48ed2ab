//! Range and identity checks of `ModelConfig::validate`: the sanity bound of every size field and
//! the identity fields (`model_type`, `quant_method`), checked before the structural ones.
//!
//! Owns:
//! - the upper bound of every size field ([`SIZE_LIMITS`]). Memory figures (`inspect`'s
//!   footprint and plan, the engine's allocations) are products of these fields, so an absurd
//!   value (`vocab_size` 2^63) would overflow them into a plausible wrong figure instead of an
//!   error. Each bound is a generous ceiling, at least 16x the largest value of any released
//!   DeepSeek-V4 (Flash or Pro, docs/spec/model.md 1.1 and 1.2), so a scaled-up successor still
//!   loads while the products stay far below 2^64 (the largest tensor under these bounds is about
//!   2^50 bytes, a whole model about 2^61);
//! - the identity fields: `model_type` (absent or `"deepseek_v4"`) and
//!   `quantization_config.quant_method` (absent, `"fp8"` for the official release and for
//!   NVIDIA's NVFP4 re-quantisation, which adds `moe_quant_algo: "NVFP4"`, or `"modelopt"` for
//!   ModelOpt's generic export); anything else is another model or another weight format, which
//!   would be read with the wrong layout. A checkpoint's format is read from its tensors; the
//!   config's statement only matters to `inspect --config`;
//! - `max_position_embeddings` at least 1 (0 would make every command blame the user's
//!   `--length` / `--context` instead of the config). Synthetic configs may use small values,
//!   so there is no lower bound beyond that.

use super::{ConfigError, ModelConfig};
use std::path::Path;

/// One bounded size field: its name, its largest value in a released DeepSeek-V4 and the
/// largest value accepted.
pub struct SizeLimit {
    pub field: &'static str,
    pub largest_released: usize,
    pub max: usize,
}

const fn limit(field: &'static str, largest_released: usize, max: usize) -> SizeLimit {
    SizeLimit {
        field,
        largest_released,
        max,
    }
}

/// Upper bounds of the size fields (each at least 16x the largest released value).
pub const SIZE_LIMITS: [SizeLimit; 19] = [
    limit("vocab_size", 129_280, 1 << 21),
    limit("hidden_size", 7168, 1 << 17),
    limit("num_hidden_layers", 61, 1024),
    limit("num_attention_heads", 128, 2048),
    limit("head_dim", 512, 8192),
    limit("qk_rope_head_dim", 64, 8192),
    limit("q_lora_rank", 1536, 1 << 15),
    limit("o_groups", 16, 2048),
    limit("o_lora_rank", 1024, 1 << 15),
    limit("index_n_heads", 64, 2048),
    limit("index_head_dim", 128, 2048),
    limit("index_topk", 1024, 1 << 16),
    limit("n_routed_experts", 384, 8192),
    limit("num_experts_per_tok", 6, 8192),
    limit("moe_intermediate_size", 3072, 1 << 16),
    limit("num_nextn_predict_layers", 3, 64),
    limit("hc_sinkhorn_iters", 20, 1024),
    limit("sliding_window", 128, 1 << 16),
    limit("max_position_embeddings", 1 << 20, 1 << 25),
];

/// The largest block edge of `quantization_config.weight_block_size` (128 released).
pub const MAX_WEIGHT_BLOCK: usize = 1 << 16;

/// The accepted `quantization_config.quant_method` values.
pub const QUANT_METHODS: [&str; 2] = ["fp8", "modelopt"];

/// The only `model_type` accepted (also the value assumed when the key is absent).
pub const MODEL_TYPE: &str = "deepseek_v4";

fn value_of(cfg: &ModelConfig, field: &str) -> usize {
    match field {
        "vocab_size" => cfg.vocab_size,
        "hidden_size" => cfg.hidden_size,
        "num_hidden_layers" => cfg.num_hidden_layers,
        "num_attention_heads" => cfg.num_attention_heads,
        "head_dim" => cfg.head_dim,
        "qk_rope_head_dim" => cfg.qk_rope_head_dim,
        "q_lora_rank" => cfg.q_lora_rank,
        "o_groups" => cfg.o_groups,
        "o_lora_rank" => cfg.o_lora_rank,
        "index_n_heads" => cfg.index_n_heads,
        "index_head_dim" => cfg.index_head_dim,
        "index_topk" => cfg.index_topk,
        "n_routed_experts" => cfg.n_routed_experts,
        "num_experts_per_tok" => cfg.num_experts_per_tok,
        "moe_intermediate_size" => cfg.moe_intermediate_size,
        "num_nextn_predict_layers" => cfg.num_nextn_predict_layers,
        "hc_sinkhorn_iters" => cfg.hc_sinkhorn_iters,
        "sliding_window" => cfg.sliding_window,
        "max_position_embeddings" => cfg.max_position_embeddings,
        other => unreachable!("SIZE_LIMITS names a field value_of lacks: {other}"),
    }
}

/// The bound of a field of [`SIZE_LIMITS`].
fn max_of(field: &str) -> usize {
    SIZE_LIMITS
        .iter()
        .find(|l| l.field == field)
        .map_or(usize::MAX, |l| l.max)
}

/// Checks the identity fields, `max_position_embeddings` > 0 and every size bound (see the
/// module docs). Runs before the structural checks, which may multiply these fields.
pub(super) fn check(cfg: &ModelConfig, path: &Path) -> Result<(), ConfigError> {
    let bad = |field: &str, found: String, expected: String| ConfigError::Invalid {
        path: path.to_path_buf(),
        field: field.to_string(),
        found,
        expected,
    };
    if cfg.model_type != MODEL_TYPE {
        return Err(bad(
            "model_type",
            format!("{:?}", cfg.model_type),
            format!("{MODEL_TYPE:?} (needlescope reads DeepSeek-V4 checkpoints only)"),
        ));
    }
    if let Some(method) = cfg
        .quantization_config
        .as_ref()
        .and_then(|q| q.quant_method.as_deref())
    {
        if !QUANT_METHODS.contains(&method) {
            return Err(bad(
                "quantization_config.quant_method",
                format!("{method:?}"),
                "absent (bf16), \"fp8\" (the official FP4+FP8 release) or \"modelopt\" \
                 (NVIDIA's NVFP4 re-quantisation)"
                    .into(),
            ));
        }
    }
    if cfg.max_position_embeddings == 0 {
        return Err(bad(
            "max_position_embeddings",
            "0".into(),
            "a positive number of positions (1048576 on the released models)".into(),
        ));
    }
    for l in &SIZE_LIMITS {
        let v = value_of(cfg, l.field);
        if v > l.max {
            return Err(bad(
                l.field,
                v.to_string(),
                format!(
                    "at most {} (a sanity bound, 16x or more the largest released DeepSeek-V4 \
                     value, {})",
                    l.max, l.largest_released
                ),
            ));
        }
    }
    // One ratio per main layer plus the MTP / draft stages.
    let max_ratios = max_of("num_hidden_layers") + max_of("num_nextn_predict_layers");
    if cfg.compress_ratios.len() > max_ratios {
        return Err(bad(
            "compress_ratios",
            format!("a list of {} entries", cfg.compress_ratios.len()),
            format!("at most {max_ratios} entries (one per layer and MTP stage)"),
        ));
    }
    if let Some(b) = cfg
        .quantization_config
        .as_ref()
        .and_then(|q| q.weight_block_size.as_ref())
    {
        if b.iter().any(|&e| e > MAX_WEIGHT_BLOCK) {
            return Err(bad(
                "quantization_config.weight_block_size",
                format!("{b:?}"),
                format!("block edges of at most {MAX_WEIGHT_BLOCK} (128 released)"),
            ));
        }
    }
    if let Some(rs) = &cfg.rope_scaling {
        let orig = rs.original_max_position_embeddings;
        if orig == 0 || orig > max_of("max_position_embeddings") as u64 {
            return Err(bad(
                "rope_scaling.original_max_position_embeddings",
                orig.to_string(),
                format!("1..={} (65536 released)", max_of("max_position_embeddings")),
            ));
        }
        if !(rs.factor.is_finite() && rs.factor >= 1.0) {
            return Err(bad(
                "rope_scaling.factor",
                rs.factor.to_string(),
                "a finite number, at least 1".into(),
            ));
        }
    }
    Ok(())
}
