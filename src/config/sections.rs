//! The nested sections of `config.json`: `rope_scaling` ([`RopeScaling`], YaRN; `type` and
//! `rope_type` reconciled) and `quantization_config` ([`QuantizationConfig`]: block-FP8 of
//! the official release, ModelOpt's NVFP4 experts). Read as written; checks that need the
//! whole config live in `config_validate.rs`.

use crate::numerics::rope::Yarn;
use serde::{Deserialize, Serialize};

/// YaRN parameters (`rope_scaling`). The kind is read from `type` or `rope_type` (configs
/// written by transformers 4.x carry both; they must then agree), `"yarn"` when neither.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RopeScalingKeys")]
pub struct RopeScaling {
    #[serde(rename = "type")]
    pub kind: String,
    pub factor: f64,
    pub original_max_position_embeddings: u64,
    #[serde(default = "default_beta_fast")]
    pub beta_fast: f64,
    #[serde(default = "default_beta_slow")]
    pub beta_slow: f64,
}

impl RopeScaling {
    /// The parameters the RoPE table is built from.
    pub fn yarn(&self) -> Yarn {
        Yarn {
            factor: self.factor,
            original_max_position_embeddings: self.original_max_position_embeddings,
            beta_fast: self.beta_fast,
            beta_slow: self.beta_slow,
        }
    }
}

/// `rope_scaling` as written, before `type` and `rope_type` are reconciled.
#[derive(Deserialize)]
struct RopeScalingKeys {
    #[serde(rename = "type")]
    kind: Option<String>,
    rope_type: Option<String>,
    factor: f64,
    original_max_position_embeddings: u64,
    #[serde(default = "default_beta_fast")]
    beta_fast: f64,
    #[serde(default = "default_beta_slow")]
    beta_slow: f64,
}

impl TryFrom<RopeScalingKeys> for RopeScaling {
    type Error = String;

    fn try_from(keys: RopeScalingKeys) -> Result<Self, String> {
        let kind = match (keys.kind, keys.rope_type) {
            (Some(a), Some(b)) if a != b => {
                return Err(format!(
                    "rope_scaling: `type` is {a:?} but `rope_type` is {b:?}; expected the same kind"
                ))
            }
            (Some(kind), _) | (None, Some(kind)) => kind,
            (None, None) => "yarn".into(),
        };
        Ok(RopeScaling {
            kind,
            factor: keys.factor,
            original_max_position_embeddings: keys.original_max_position_embeddings,
            beta_fast: keys.beta_fast,
            beta_slow: keys.beta_slow,
        })
    }
}
fn default_beta_fast() -> f64 {
    32.0
}
fn default_beta_slow() -> f64 {
    1.0
}

/// `quantization_config` of the official FP8 release (absent for bf16 checkpoints).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QuantizationConfig {
    #[serde(default)]
    pub activation_scheme: Option<String>,
    #[serde(default)]
    pub fmt: Option<String>,
    #[serde(default)]
    pub quant_method: Option<String>,
    #[serde(default)]
    pub scale_fmt: Option<String>,
    #[serde(default)]
    pub weight_block_size: Option<Vec<usize>>,
    /// `"NVFP4"` in NVIDIA's ModelOpt re-quantisation (nvidia/DeepSeek-V4-Flash-NVFP4): the
    /// routed experts are NVFP4 while `quant_method` stays `"fp8"` for everything else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_quant_algo: Option<String>,
    /// Where Hugging Face's loader copies the top-level `expert_dtype` (and where NVIDIA's
    /// V4.1 NVFP4 export keeps it): read as `expert_dtype` when the top level has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_dtype: Option<String>,
}

impl QuantizationConfig {
    /// The official release's block-FP8 settings (docs/spec/model.md 1.1).
    pub fn official() -> Self {
        QuantizationConfig {
            activation_scheme: Some("dynamic".into()),
            fmt: Some("e4m3".into()),
            quant_method: Some("fp8".into()),
            scale_fmt: Some("ue8m0".into()),
            weight_block_size: Some(vec![128, 128]),
            moe_quant_algo: None,
            expert_dtype: None,
        }
    }

    /// The official settings plus ModelOpt's `moe_quant_algo: "NVFP4"`, as NVIDIA's export
    /// writes them for the NVFP4 re-quantisation.
    pub fn nvfp4_experts() -> Self {
        QuantizationConfig {
            moe_quant_algo: Some("NVFP4".into()),
            ..Self::official()
        }
    }

    /// Whether the config says the routed experts are NVFP4: `moe_quant_algo: "NVFP4"` (what
    /// ModelOpt's DeepSeek-V4 export writes beside `quant_method: "fp8"`) or `quant_method:
    /// "modelopt"` (ModelOpt's generic Hugging Face export).
    pub fn states_nvfp4_experts(&self) -> bool {
        self.moe_quant_algo
            .as_deref()
            .is_some_and(|a| a.eq_ignore_ascii_case("nvfp4"))
            || self.quant_method.as_deref() == Some("modelopt")
    }
}
