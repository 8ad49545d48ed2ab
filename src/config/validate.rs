//! `ModelConfig::validate` (a part of `config.rs`, kept apart so that file stays readable): every
//! structural assumption the engine makes about a config, checked once at load, each failure
//! naming the field, the value found and what was expected. Size bounds and identity fields are
//! checked first by [`limits::check`](super::limits::check).

use super::{limits, ConfigError, LayerKind, ModelConfig};
use std::path::Path;

impl ModelConfig {
    /// Checks every structural assumption the engine makes.
    pub fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let bad = |field: &str, found: String, expected: &str| ConfigError::Invalid {
            path: path.to_path_buf(),
            field: field.to_string(),
            found,
            expected: expected.to_string(),
        };
        limits::check(self, path)?;
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("head_dim", self.head_dim),
            ("q_lora_rank", self.q_lora_rank),
            ("o_groups", self.o_groups),
            ("o_lora_rank", self.o_lora_rank),
            ("index_n_heads", self.index_n_heads),
            ("index_head_dim", self.index_head_dim),
            ("index_topk", self.index_topk),
            ("n_routed_experts", self.n_routed_experts),
            ("num_experts_per_tok", self.num_experts_per_tok),
            ("moe_intermediate_size", self.moe_intermediate_size),
            ("hc_mult", self.hc_mult),
            ("hc_sinkhorn_iters", self.hc_sinkhorn_iters),
            ("sliding_window", self.sliding_window),
        ];
        for (field, v) in positive {
            if v == 0 {
                return Err(bad(field, "0".into(), "a positive integer"));
            }
        }
        for (field, id) in [
            ("bos_token_id", self.bos_token_id),
            ("eos_token_id", self.eos_token_id),
        ] {
            if id as usize >= self.vocab_size {
                return Err(bad(
                    field,
                    id.to_string(),
                    &format!("a token id below vocab_size ({})", self.vocab_size),
                ));
            }
        }
        if self.num_key_value_heads != 1 {
            return Err(bad(
                "num_key_value_heads",
                self.num_key_value_heads.to_string(),
                "1 (DeepSeek-V4 shares one KV head)",
            ));
        }
        if self.qk_rope_head_dim == 0
            || !self.qk_rope_head_dim.is_multiple_of(2)
            || self.qk_rope_head_dim > self.head_dim
        {
            return Err(bad(
                "qk_rope_head_dim",
                self.qk_rope_head_dim.to_string(),
                &format!("an even number in 2..={} (head_dim)", self.head_dim),
            ));
        }
        if self.qk_rope_head_dim >= self.index_head_dim {
            return Err(bad(
                "index_head_dim",
                self.index_head_dim.to_string(),
                &format!(
                    "larger than qk_rope_head_dim = {} (the indexer ropes its last qk_rope_head_dim dims)",
                    self.qk_rope_head_dim
                ),
            ));
        }
        if !self.index_head_dim.is_power_of_two() {
            return Err(bad(
                "index_head_dim",
                self.index_head_dim.to_string(),
                "a power of two (the Hadamard rotation spans the index head)",
            ));
        }
        if !self.num_attention_heads.is_multiple_of(self.o_groups) {
            return Err(bad(
                "o_groups",
                self.o_groups.to_string(),
                &format!(
                    "a divisor of num_attention_heads = {}",
                    self.num_attention_heads
                ),
            ));
        }
        if self.num_experts_per_tok > self.n_routed_experts {
            return Err(bad(
                "num_experts_per_tok",
                self.num_experts_per_tok.to_string(),
                &format!("at most n_routed_experts = {}", self.n_routed_experts),
            ));
        }
        if self.n_shared_experts > 1 {
            return Err(bad(
                "n_shared_experts",
                self.n_shared_experts.to_string(),
                "0 or 1",
            ));
        }
        if self.num_hash_layers > self.num_hidden_layers {
            return Err(bad(
                "num_hash_layers",
                self.num_hash_layers.to_string(),
                &format!("at most num_hidden_layers = {}", self.num_hidden_layers),
            ));
        }
        if self.hc_mult != 4 {
            return Err(bad(
                "hc_mult",
                self.hc_mult.to_string(),
                "4 (mHC with 4 residual streams; (2+n)*n = 24 coefficients)",
            ));
        }
        if self.scoring_func != "sqrtsoftplus" {
            return Err(bad(
                "scoring_func",
                format!("{:?}", self.scoring_func),
                "\"sqrtsoftplus\"",
            ));
        }
        if self.hidden_act != "silu" {
            return Err(bad(
                "hidden_act",
                format!("{:?}", self.hidden_act),
                "\"silu\"",
            ));
        }
        if self.tie_word_embeddings {
            return Err(bad(
                "tie_word_embeddings",
                "true".into(),
                "false (V4 has separate embed and head)",
            ));
        }
        // One entry per main layer, then (optionally) entries for the MTP / draft stages: 44
        // for Flash (one MTP layer), 46 for Flash-0731 (three DSpark stages). Only the first
        // num_hidden_layers entries schedule the model (as in transformers).
        if self.compress_ratios.len() < self.num_hidden_layers {
            return Err(bad(
                "compress_ratios",
                format!("a list of {} entries", self.compress_ratios.len()),
                &format!(
                    "at least {} entries (one per layer, num_hidden_layers {}; {} with the \
                     num_nextn_predict_layers {})",
                    self.num_hidden_layers,
                    self.num_hidden_layers,
                    self.num_hidden_layers + self.num_nextn_predict_layers,
                    self.num_nextn_predict_layers
                ),
            ));
        }
        for (i, &r) in self.compress_ratios.iter().enumerate() {
            if LayerKind::from_ratio(r).is_none() {
                return Err(bad(
                    &format!("compress_ratios[{i}]"),
                    r.to_string(),
                    "one of 0, 4, 128",
                ));
            }
        }
        if let Some(ed) = &self.expert_dtype {
            if ed != "fp4" && ed != "fp8" && ed != "bf16" {
                return Err(bad(
                    "expert_dtype",
                    format!("{ed:?}"),
                    "\"fp4\", \"fp8\" or \"bf16\"",
                ));
            }
        }
        if let Some(q) = &self.quantization_config {
            if let Some(b) = &q.weight_block_size {
                if b.len() != 2 || b[0] == 0 || b[1] == 0 {
                    return Err(bad(
                        "quantization_config.weight_block_size",
                        format!("{b:?}"),
                        "two positive integers, e.g. [128, 128]",
                    ));
                }
            }
        }
        if let Some(rs) = &self.rope_scaling {
            if rs.kind != "yarn" {
                return Err(bad(
                    "rope_scaling.type",
                    format!("{:?}", rs.kind),
                    "\"yarn\"",
                ));
            }
            // factor and original_max_position_embeddings: checked in `limits`.
        }
        for (field, v) in [
            ("rope_theta", self.rope_theta),
            ("compress_rope_theta", self.compress_rope_theta),
            ("rms_norm_eps", self.rms_norm_eps),
            ("routed_scaling_factor", self.routed_scaling_factor),
            ("swiglu_limit", self.swiglu_limit),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(bad(field, v.to_string(), "a finite positive number"));
            }
        }
        if !(self.hc_eps.is_finite() && self.hc_eps >= 0.0) {
            return Err(bad(
                "hc_eps",
                self.hc_eps.to_string(),
                "a finite number >= 0",
            ));
        }
        Ok(())
    }
}
