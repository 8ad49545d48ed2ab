//! `V41Config`: the DeepSeek-V4.1-Flash model description (`model_type` `deepseek_v41`,
//! docs/spec/v41.md sections 2 and 3), read from either of its two dialects and validated once
//! at load.
//!
//! - **Composite** (`config.json` of the release): `model_type` `deepseek_v41` at the top level
//!   (or `deepseek_v41_text` in `text_config`), the text fields in `text_config` (or, folded as
//!   SGLang folds them, at the top level), `vision_config`, `quantization_config` (block-FP8
//!   `[32, 32]`, `expert_dtype`) and `image_token_id` at the top level.
//! - **Reference** (`inference/config.json`, DeepSeek's `ModelArgs`): one flat object with
//!   the reference's names (`dim`, `n_layers`, `kv_source_layers`, `candidate_source_layer`,
//!   `engram_pad_id`, `rope_factor`, `vision_*`, `dtype`, ...; the mapping is [`FLAT_NAMES`]).
//!
//! Both are rewritten into the composite names and read into one [`V41Config`], so the two
//! files of the release give the same description (only [`V41Config::dialect`] differs). Every
//! refusal names the field as the file spells it (`text_config.kv_source_layer_ids` in the
//! composite file, `kv_source_layers` in the flat one), the value found and what was expected.
//! The layer roles ([`V41Config::layer_roles`]) fill the table of [`super::layers`].

use super::layers::{LayerKind, LayerRoles};
use super::limits::SIZE_LIMITS;
use super::{ConfigError, RopeScaling};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::path::Path;

/// The release's `model_type`.
pub const MODEL_TYPE: &str = "deepseek_v41";

/// Every `model_type` that names DeepSeek-V4.1 (the release's, its text and vision parts, and
/// the legacy spellings SGLang accepts, docs/spec/v41.md 2.4).
pub const MODEL_TYPES: [&str; 6] = [
    "deepseek_v41",
    "deepseek_v41_text",
    "deepseek_v41_vision",
    "deepseek_v4.1",
    "deepseek_v4.1_text",
    "deepseek_v4.1_vision",
];

/// Keys only a DeepSeek-V4.1 config has, in either dialect: a config without `model_type`
/// holding any of them is read as V4.1.
pub const V41_KEYS: [&str; 7] = [
    "kv_source_layer_ids",
    "kv_source_layers",
    "index_source_layer_ids",
    "index_source_layers",
    "candidate_source_layer_id",
    "candidate_source_layer",
    "engram_layer_ids",
];

/// Reference (flat) name -> composite name of the text fields whose names differ
/// (docs/spec/v41.md 2.1 and 2.2). The rope fields and `dtype` / `expert_dtype` / `vision_*`
/// are mapped separately (`from_flat`).
pub const FLAT_NAMES: [(&str, &str); 16] = [
    ("dim", "hidden_size"),
    ("n_layers", "num_hidden_layers"),
    ("n_heads", "num_attention_heads"),
    ("moe_inter_dim", "moe_intermediate_size"),
    ("rope_head_dim", "qk_rope_head_dim"),
    ("norm_eps", "rms_norm_eps"),
    ("n_activated_experts", "num_experts_per_tok"),
    ("score_func", "scoring_func"),
    ("route_scale", "routed_scaling_factor"),
    ("window_size", "sliding_window"),
    ("kv_source_layers", "kv_source_layer_ids"),
    ("index_source_layers", "index_source_layer_ids"),
    ("candidate_source_layer", "candidate_source_layer_id"),
    ("engram_pad_id", "engram_pad_token_id"),
    ("n_mtp_layers", "num_nextn_predict_layers"),
    ("dspark_n_activated_experts", "dspark_num_experts_per_tok"),
];

/// Reference name -> composite `rope_scaling` key.
const FLAT_ROPE: [(&str, &str); 4] = [
    ("rope_factor", "factor"),
    ("beta_fast", "beta_fast"),
    ("beta_slow", "beta_slow"),
    ("original_seq_len", "original_max_position_embeddings"),
];

/// Reference name -> composite `vision_config` key.
const FLAT_VISION: [(&str, &str); 10] = [
    ("vision_n_layers", "num_hidden_layers"),
    ("vision_dim", "hidden_size"),
    ("vision_n_heads", "num_attention_heads"),
    ("vision_inter_dim", "intermediate_size"),
    ("vision_patch_size", "patch_size"),
    ("vision_downsample_ratio", "downsample_ratio"),
    ("vision_rope_theta", "rope_theta"),
    ("vision_max_n_token", "max_image_tokens"),
    ("vision_min_pixels", "min_pixels"),
    ("vision_max_wh_ratio", "max_wh_ratio"),
];

/// The FP8 weight block of the release (`quantization_config.weight_block_size`), also what the
/// reference dialect's `dtype "fp8"` means (it names no block; docs/spec/v41.md headline 6).
pub const WEIGHT_BLOCK: (usize, usize) = (32, 32);

/// Upper bounds of the sizes only DeepSeek-V4.1 has (each at least 16x the released value;
/// the shared names are bounded by `SIZE_LIMITS`). Released values: hc_mult 4, Engram head
/// 256 wide, 8 heads, n-grams up to 4, engram_vocab_size 16,000,000, 99,092 token classes,
/// tables of 384,016,682 rows, 2,048 candidate blocks of 8, DSpark blocks of 5, Markov rank
/// 256, 128 draft experts (top-3).
pub const V41_SIZE_LIMITS: [(&str, u64); 13] = [
    ("hc_mult", 64),
    ("engram_head_dim", 1 << 13),
    ("engram_n_heads", 1024),
    ("engram_max_ngram_size", 64),
    ("engram_vocab_size", 1 << 34),
    ("engram_compressed_vocab_size", 1 << 21),
    ("engram_num_embeddings", 1 << 33),
    ("candidate_topk_blocks", 1 << 20),
    ("candidate_block_size", 1 << 12),
    ("dspark_block_size", 1024),
    ("dspark_markov_rank", 1 << 13),
    ("dspark_n_routed_experts", 8192),
    ("dspark_num_experts_per_tok", 8192),
];

/// Upper bounds of `vision_config` (released: 32 blocks of width 1,024, 16 heads, MLP 2,816,
/// patches of 14, 3x3 unshuffle, 1,024 image tokens).
pub const V41_VISION_LIMITS: [(&str, u64); 7] = [
    ("num_hidden_layers", 1024),
    ("hidden_size", 1 << 17),
    ("num_attention_heads", 2048),
    ("intermediate_size", 1 << 17),
    ("patch_size", 1024),
    ("downsample_ratio", 64),
    ("max_image_tokens", 1 << 20),
];

/// Which file a description was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// The release's `config.json`, text fields in `text_config`.
    Composite,
    /// A composite config with the text fields folded into the top level (as SGLang folds them).
    Folded,
    /// The reference `inference/config.json` (flat `ModelArgs` names).
    Reference,
}

/// The validated DeepSeek-V4.1 description (module doc).
#[derive(Clone, Debug, PartialEq)]
pub struct V41Config {
    pub dialect: Dialect,
    /// `image_token_id` (top level in both dialects).
    pub image_token_id: Option<u32>,
    pub text: V41Text,
    /// `vision_config` (`vision_*` in the reference dialect); `None` when absent.
    pub vision: Option<V41Vision>,
    pub weights: V41Weights,
}

/// The text model (`text_config`), composite names.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct V41Text {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub moe_intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default = "one")]
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub q_lora_rank: usize,
    pub o_lora_rank: usize,
    pub o_groups: usize,
    #[serde(default = "silu")]
    pub hidden_act: String,
    pub swiglu_limit: f64,
    pub rms_norm_eps: f64,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default = "max_pos")]
    pub max_position_embeddings: usize,
    pub rope_theta: f64,
    pub rope_scaling: Option<RopeScaling>,
    pub compress_rope_theta: f64,
    pub n_routed_experts: usize,
    #[serde(default = "one")]
    pub n_shared_experts: usize,
    pub num_experts_per_tok: usize,
    pub scoring_func: String,
    #[serde(default = "yes")]
    pub norm_topk_prob: bool,
    pub routed_scaling_factor: f64,
    pub sliding_window: usize,
    /// One entry per main layer, then one per draft block (0): which compressed cache a layer
    /// reads (0 none, 2 pairs, 1 per token).
    pub compress_ratios: Vec<usize>,
    pub kv_source_layer_ids: Vec<usize>,
    pub index_source_layer_ids: Vec<usize>,
    pub index_n_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
    /// Below 0: no candidate stage.
    pub candidate_source_layer_id: i64,
    pub candidate_topk_blocks: usize,
    pub candidate_block_size: usize,
    pub hc_mult: usize,
    pub hc_sinkhorn_iters: usize,
    pub hc_eps: f64,
    pub engram_layer_ids: Vec<usize>,
    pub engram_num_embeddings: Vec<u64>,
    pub engram_max_ngram_size: usize,
    pub engram_vocab_size: u64,
    pub engram_n_heads: usize,
    pub engram_head_dim: usize,
    pub engram_pad_token_id: u32,
    pub engram_compressed_vocab_size: usize,
    /// DSpark draft blocks.
    #[serde(default)]
    pub num_nextn_predict_layers: usize,
    #[serde(default)]
    pub dspark_block_size: usize,
    #[serde(default)]
    pub dspark_noise_token_id: Option<u32>,
    #[serde(default)]
    pub dspark_target_layer_ids: Vec<usize>,
    #[serde(default)]
    pub dspark_markov_rank: usize,
    #[serde(default)]
    pub dspark_n_routed_experts: usize,
    #[serde(default)]
    pub dspark_num_experts_per_tok: usize,
}

/// The vision tower (`vision_config`), composite names.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct V41Vision {
    pub num_hidden_layers: usize,
    pub hidden_size: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub patch_size: usize,
    pub downsample_ratio: usize,
    pub rope_theta: f64,
    #[serde(alias = "max_num_tokens")]
    pub max_image_tokens: usize,
    pub min_pixels: u64,
    #[serde(default)]
    pub max_wh_ratio: Option<f64>,
}

/// How the weights are stored: `quantization_config` (composite) or `dtype` / `expert_dtype`
/// (reference).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct V41Weights {
    /// `"fp8"` (block-FP8 linears) or `"bf16"` (no `quantization_config`, or `dtype "bf16"`).
    pub dtype: String,
    /// The FP8 block, `[32, 32]` released; `None` for bf16.
    pub block: Option<(usize, usize)>,
    /// `"fp4"` released.
    pub expert_dtype: Option<String>,
    /// `quantization_config.moe_quant_algo` is `"NVFP4"`: NVIDIA's re-quantisation, whose
    /// backbone routed experts are NVFP4 (docs/spec/v41.md 4.3).
    pub experts_nvfp4: bool,
}

fn one() -> usize {
    1
}
fn silu() -> String {
    "silu".into()
}
fn max_pos() -> usize {
    1 << 20
}
fn yes() -> bool {
    true
}

/// Whether a parsed config.json is DeepSeek-V4.1: by `model_type` (top level, or in
/// `text_config`) when there is one, else by its key set ([`V41_KEYS`]); never by a layer count.
pub fn is_v41(json: &Value) -> bool {
    let Value::Object(map) = json else {
        return false;
    };
    let type_of = |m: &Map<String, Value>| {
        m.get("model_type")
            .and_then(Value::as_str)
            .map(String::from)
    };
    let text_type = map
        .get("text_config")
        .and_then(Value::as_object)
        .and_then(type_of);
    match (type_of(map), text_type) {
        (Some(t), _) if MODEL_TYPES.contains(&t.as_str()) => true,
        (_, Some(t)) if MODEL_TYPES.contains(&t.as_str()) => true,
        (Some(_), _) => false,
        (None, _) => V41_KEYS.iter().any(|k| map.contains_key(*k)),
    }
}

impl V41Config {
    /// Parses and validates V4.1 config text of either dialect; `path` is only used in error
    /// messages.
    pub fn from_json_str(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let json: Value = serde_json::from_str(text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            field: String::new(),
            source,
        })?;
        Self::from_value(json, path)
    }

    /// Reads and validates a parsed V4.1 config (module doc).
    pub fn from_value(json: Value, path: &Path) -> Result<Self, ConfigError> {
        let Value::Object(top) = json else {
            return Err(invalid(
                path,
                "",
                "not a JSON object".into(),
                "a JSON object",
            ));
        };
        let flat = !top.contains_key("text_config")
            && ["dim", "n_layers"].iter().any(|k| top.contains_key(*k));
        let (dialect, text, vision, quant) = if flat {
            from_flat(&top)
        } else if let Some(Value::Object(text)) = top.get("text_config") {
            let vision = top.get("vision_config").cloned();
            let quant = top.get("quantization_config").cloned();
            (Dialect::Composite, text.clone(), vision, quant)
        } else {
            let vision = top.get("vision_config").cloned();
            let quant = top.get("quantization_config").cloned();
            (Dialect::Folded, top.clone(), vision, quant)
        };
        let names = Names(dialect);
        let text: V41Text = typed(Value::Object(text), path, |f| names.text(f))?;
        let vision: Option<V41Vision> = match vision {
            None | Some(Value::Null) => None,
            Some(v) => Some(typed(v, path, |f| names.vision(f))?),
        };
        let image_token_id = match top.get("image_token_id") {
            None | Some(Value::Null) => None,
            Some(v) => Some(typed(v.clone(), path, |_| "image_token_id".into())?),
        };
        let weights = weights(&top, quant.as_ref(), flat, path)?;
        let cfg = V41Config {
            dialect,
            image_token_id,
            text,
            vision,
            weights,
        };
        cfg.validate(path)?;
        Ok(cfg)
    }

    /// Reads `config.json` (of either dialect) from a file or from a model directory, then
    /// validates it; a DeepSeek-V4 config is refused by name.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let (text, path) = super::read_config(path)?;
        // Unparsable text: the parse error, by `from_json_str`.
        if let Ok(json) = serde_json::from_str::<Value>(&text) {
            if !is_v41(&json) {
                return Err(match json.get("model_type").and_then(Value::as_str) {
                    None | Some(super::limits::MODEL_TYPE) => ConfigError::Unsupported {
                        path,
                        family: super::Family::V4,
                    },
                    Some(other) => invalid(
                        &path,
                        "model_type",
                        format!("{other:?}"),
                        &format!("{MODEL_TYPE:?} (DeepSeek-V4.1)"),
                    ),
                });
            }
        }
        Self::from_json_str(&text, &path)
    }

    /// SHA-256 (hex) of the description, the same for both dialects of one config (the
    /// dialect is not hashed).
    pub fn hash_hex(&self) -> String {
        use sha2::{Digest, Sha256};
        let described = (&self.text, &self.vision, &self.weights, self.image_token_id);
        let digest = Sha256::digest(serde_json::to_vec(&described).expect("config serialises"));
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The field as this config's file spells it (`text_config.index_topk`, `index_topk`,
    /// `kv_source_layers`).
    pub fn field(&self, name: &str) -> String {
        Names(self.dialect).text(name)
    }

    /// The draft blocks listed after the main layers in `compress_ratios`.
    pub fn draft_blocks(&self) -> usize {
        self.text.compress_ratios.len() - self.text.num_hidden_layers
    }

    /// The candidate source, `None` when `candidate_source_layer_id` is below 0.
    pub fn candidate_source(&self) -> Option<usize> {
        usize::try_from(self.text.candidate_source_layer_id).ok()
    }

    /// Attention type of main layer `layer` (0-based).
    pub fn layer_kind(&self, layer: usize) -> LayerKind {
        LayerKind::from_v41_ratio(self.text.compress_ratios[layer]).expect("validated")
    }

    /// The layer-role table of the main layers (docs/spec/v41.md 3; [`LayerRoles::v41`]).
    pub fn layer_roles(&self) -> LayerRoles {
        let t = &self.text;
        LayerRoles::v41(
            &t.compress_ratios[..t.num_hidden_layers],
            &t.kv_source_layer_ids,
            &t.index_source_layer_ids,
            self.candidate_source(),
        )
    }

    /// A short human summary ("40 layers: 2 SWA, 18 CSA2, 20 CSA1; 4 KV sources, 8 index
    /// sources, candidate source 20; Engram on 1, 14; 3 draft blocks").
    pub fn schedule_summary(&self) -> String {
        let roles = self.layer_roles();
        let n = |k| roles.layers_of_kind(k).len();
        let list = |v: &[usize]| {
            v.iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "{} layers: {} SWA, {} CSA2, {} CSA1; KV sources {}, index sources {}, candidate \
             source {}; Engram on {}; {} draft block{}",
            self.text.num_hidden_layers,
            n(LayerKind::Swa),
            n(LayerKind::Csa2),
            n(LayerKind::Csa1),
            list(&self.text.kv_source_layer_ids),
            list(&self.text.index_source_layer_ids),
            self.candidate_source()
                .map_or("none".to_string(), |c| c.to_string()),
            list(&self.text.engram_layer_ids),
            self.draft_blocks(),
            if self.draft_blocks() == 1 { "" } else { "s" }
        )
    }
}

/// A refusal of `field` (already spelled as the file spells it).
fn invalid(path: &Path, field: &str, found: String, expected: &str) -> ConfigError {
    ConfigError::Invalid {
        path: path.to_path_buf(),
        field: field.to_string(),
        found,
        expected: expected.to_string(),
    }
}

/// Deserialises `value`, a parse error naming the field through `spell`.
fn typed<T: serde::de::DeserializeOwned>(
    value: Value,
    path: &Path,
    spell: impl Fn(&str) -> String,
) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let inner = e.path().to_string();
        // A missing field is reported at its object; name the field itself.
        let missing = e
            .inner()
            .to_string()
            .strip_prefix("missing field `")
            .and_then(|m| m.split('`').next().map(String::from));
        let field = match (inner.as_str(), missing) {
            (".", Some(m)) => spell(&m),
            (".", None) => spell(""),
            (_, Some(m)) => spell(&format!("{inner}.{m}")),
            (_, None) => spell(&inner),
        };
        ConfigError::Parse {
            path: path.to_path_buf(),
            field,
            source: e.into_inner(),
        }
    })
}

/// The reference dialect rewritten into composite names: the text fields, `vision_config` (when
/// any `vision_*` key is present) and no `quantization_config` (read from `dtype`).
fn from_flat(
    top: &Map<String, Value>,
) -> (Dialect, Map<String, Value>, Option<Value>, Option<Value>) {
    let mut text = Map::new();
    let mut rope = Map::new();
    let mut vision = Map::new();
    for (k, v) in top {
        if let Some((_, hf)) = FLAT_ROPE.iter().find(|(flat, _)| flat == k) {
            rope.insert((*hf).to_string(), v.clone());
        } else if let Some((_, hf)) = FLAT_VISION.iter().find(|(flat, _)| flat == k) {
            vision.insert((*hf).to_string(), v.clone());
        } else if let Some((_, hf)) = FLAT_NAMES.iter().find(|(flat, _)| flat == k) {
            text.insert((*hf).to_string(), v.clone());
        } else {
            text.insert(k.clone(), v.clone());
        }
    }
    if !rope.is_empty() {
        rope.insert("type".into(), Value::String("yarn".into()));
        text.insert("rope_scaling".into(), Value::Object(rope));
    } else {
        text.entry("rope_scaling").or_insert(Value::Null);
    }
    let vision = (!vision.is_empty()).then_some(Value::Object(vision));
    (Dialect::Reference, text, vision, None)
}

/// The weight storage of either dialect (module doc).
fn weights(
    top: &Map<String, Value>,
    quant: Option<&Value>,
    flat: bool,
    path: &Path,
) -> Result<V41Weights, ConfigError> {
    let str_at = |v: Option<&Value>, field: &str| -> Result<Option<String>, ConfigError> {
        match v {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(invalid(path, field, other.to_string(), "a string")),
        }
    };
    if flat {
        let dtype = str_at(top.get("dtype"), "dtype")?.unwrap_or_else(|| "bf16".into());
        let block = match dtype.as_str() {
            "fp8" => Some(WEIGHT_BLOCK),
            "bf16" => None,
            other => {
                return Err(invalid(
                    path,
                    "dtype",
                    format!("{other:?}"),
                    "\"fp8\" or \"bf16\"",
                ))
            }
        };
        let expert_dtype = str_at(top.get("expert_dtype"), "expert_dtype")?;
        check_expert_dtype(expert_dtype.as_deref(), "expert_dtype", path)?;
        return Ok(V41Weights {
            dtype,
            block,
            expert_dtype,
            experts_nvfp4: false,
        });
    }
    let top_expert = str_at(top.get("expert_dtype"), "expert_dtype")?;
    let Some(q) = quant.filter(|q| !q.is_null()) else {
        check_expert_dtype(top_expert.as_deref(), "expert_dtype", path)?;
        return Ok(V41Weights {
            dtype: "bf16".into(),
            block: None,
            expert_dtype: top_expert,
            experts_nvfp4: false,
        });
    };
    let Value::Object(q) = q else {
        return Err(invalid(
            path,
            "quantization_config",
            q.to_string(),
            "an object",
        ));
    };
    let method = str_at(q.get("quant_method"), "quantization_config.quant_method")?;
    if method.as_deref() != Some("fp8") {
        return Err(invalid(
            path,
            "quantization_config.quant_method",
            format!("{method:?}"),
            "\"fp8\" (the release's block-FP8 weights)",
        ));
    }
    let block = match q.get("weight_block_size") {
        None | Some(Value::Null) => WEIGHT_BLOCK,
        Some(v) => match serde_json::from_value::<Vec<usize>>(v.clone()) {
            Ok(b) if b.len() == 2 && b[0] > 0 && b[1] > 0 => (b[0], b[1]),
            _ => {
                return Err(invalid(
                    path,
                    "quantization_config.weight_block_size",
                    v.to_string(),
                    "two positive integers ([32, 32] released)",
                ))
            }
        },
    };
    let nested = str_at(q.get("expert_dtype"), "quantization_config.expert_dtype")?;
    let expert_dtype = match (top_expert, nested) {
        (Some(a), Some(b)) if a != b => {
            return Err(invalid(
                path,
                "quantization_config.expert_dtype",
                format!("{b:?} while the top-level expert_dtype is {a:?}"),
                "the same value as the top-level expert_dtype",
            ))
        }
        (a, b) => a.or(b),
    };
    check_expert_dtype(
        expert_dtype.as_deref(),
        "quantization_config.expert_dtype",
        path,
    )?;
    let moe_algo = str_at(
        q.get("moe_quant_algo"),
        "quantization_config.moe_quant_algo",
    )?;
    let experts_nvfp4 = match moe_algo.as_deref() {
        None => false,
        Some(a) if a.eq_ignore_ascii_case("nvfp4") => true,
        Some(other) => {
            return Err(invalid(
                path,
                "quantization_config.moe_quant_algo",
                format!("{other:?}"),
                "\"NVFP4\" (NVIDIA's re-quantisation) or no such key",
            ))
        }
    };
    Ok(V41Weights {
        dtype: "fp8".into(),
        block: Some(block),
        expert_dtype,
        experts_nvfp4,
    })
}

fn check_expert_dtype(v: Option<&str>, field: &str, path: &Path) -> Result<(), ConfigError> {
    match v {
        None | Some("fp4" | "fp8" | "bf16") => Ok(()),
        Some(other) => Err(invalid(
            path,
            field,
            format!("{other:?}"),
            "\"fp4\", \"fp8\" or \"bf16\"",
        )),
    }
}

/// How a dialect spells a field.
#[derive(Clone, Copy)]
struct Names(Dialect);

impl Names {
    /// A text field (`inner` as serde_path_to_error writes it: `index_topk`,
    /// `compress_ratios[3]`, `rope_scaling.factor`; empty for the object itself).
    fn text(self, inner: &str) -> String {
        match self.0 {
            Dialect::Composite if inner.is_empty() => "text_config".into(),
            Dialect::Composite => format!("text_config.{inner}"),
            Dialect::Folded => inner.into(),
            Dialect::Reference => {
                let (head, rest) = split_head(inner);
                if head == "rope_scaling" {
                    let key = rest.trim_start_matches('.');
                    if let Some((flat, _)) = FLAT_ROPE.iter().find(|(_, hf)| *hf == key) {
                        return (*flat).into();
                    }
                    return inner.into();
                }
                match FLAT_NAMES.iter().find(|(_, hf)| *hf == head) {
                    Some((flat, _)) => format!("{flat}{rest}"),
                    None => inner.into(),
                }
            }
        }
    }

    /// A vision field.
    fn vision(self, inner: &str) -> String {
        match self.0 {
            Dialect::Reference => match FLAT_VISION.iter().find(|(_, hf)| *hf == inner) {
                Some((flat, _)) => (*flat).into(),
                None => format!("vision_{inner}"),
            },
            _ if inner.is_empty() => "vision_config".into(),
            _ => format!("vision_config.{inner}"),
        }
    }
}

/// `compress_ratios[3]` -> (`compress_ratios`, `[3]`); `rope_scaling.factor` ->
/// (`rope_scaling`, `.factor`).
fn split_head(inner: &str) -> (&str, &str) {
    let at = inner.find(['[', '.']).unwrap_or(inner.len());
    inner.split_at(at)
}

// ---------------------------------------------------------------------------------------------
// `V41Config::validate`: every structural fact the layer roles and the later model rely on,
// each failure naming the field as the file spells it.

impl V41Config {
    /// Checks the description (docs/spec/v41.md 2.5).
    pub fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let t = &self.text;
        let bad = |field: &str, found: String, expected: &str| {
            invalid(path, &self.field(field), found, expected)
        };
        let n = t.num_hidden_layers;
        // Sanity bounds shared with V4 (the same names), then positivity.
        for l in &SIZE_LIMITS {
            let v = size_of(t, l.field);
            if v > l.max {
                return Err(bad(
                    l.field,
                    v.to_string(),
                    &format!("at most {} (a sanity bound)", l.max),
                ));
            }
        }
        self.validate_v41_bounds(path)?;
        for (field, v) in [
            ("vocab_size", t.vocab_size),
            ("hidden_size", t.hidden_size),
            ("num_hidden_layers", n),
            ("num_attention_heads", t.num_attention_heads),
            ("head_dim", t.head_dim),
            ("q_lora_rank", t.q_lora_rank),
            ("o_groups", t.o_groups),
            ("o_lora_rank", t.o_lora_rank),
            ("index_n_heads", t.index_n_heads),
            ("index_head_dim", t.index_head_dim),
            ("index_topk", t.index_topk),
            ("n_routed_experts", t.n_routed_experts),
            ("num_experts_per_tok", t.num_experts_per_tok),
            ("moe_intermediate_size", t.moe_intermediate_size),
            ("hc_mult", t.hc_mult),
            ("hc_sinkhorn_iters", t.hc_sinkhorn_iters),
            ("sliding_window", t.sliding_window),
            ("engram_max_ngram_size", t.engram_max_ngram_size),
            ("engram_n_heads", t.engram_n_heads),
            ("engram_head_dim", t.engram_head_dim),
            (
                "engram_compressed_vocab_size",
                t.engram_compressed_vocab_size,
            ),
        ] {
            if v == 0 {
                return Err(bad(field, "0".into(), "a positive integer"));
            }
        }
        if t.num_key_value_heads != 1 {
            return Err(bad(
                "num_key_value_heads",
                t.num_key_value_heads.to_string(),
                "1 (one shared latent is K and V)",
            ));
        }
        if t.qk_rope_head_dim == 0
            || !t.qk_rope_head_dim.is_multiple_of(2)
            || t.qk_rope_head_dim > t.head_dim
        {
            return Err(bad(
                "qk_rope_head_dim",
                t.qk_rope_head_dim.to_string(),
                &format!("an even number in 2..={} (head_dim)", t.head_dim),
            ));
        }
        if !t.num_attention_heads.is_multiple_of(t.o_groups) {
            return Err(bad(
                "o_groups",
                t.o_groups.to_string(),
                &format!(
                    "a divisor of num_attention_heads = {}",
                    t.num_attention_heads
                ),
            ));
        }
        if t.num_experts_per_tok > t.n_routed_experts {
            return Err(bad(
                "num_experts_per_tok",
                t.num_experts_per_tok.to_string(),
                &format!("at most n_routed_experts = {}", t.n_routed_experts),
            ));
        }
        for (field, id) in [
            ("engram_pad_token_id", Some(t.engram_pad_token_id)),
            ("dspark_noise_token_id", t.dspark_noise_token_id),
        ] {
            if let Some(id) = id.filter(|&id| id as usize >= t.vocab_size) {
                return Err(bad(
                    field,
                    id.to_string(),
                    &format!("a token id below vocab_size ({})", t.vocab_size),
                ));
            }
        }
        if let Some(id) = self
            .image_token_id
            .filter(|&id| id as usize >= t.vocab_size)
        {
            return Err(invalid(
                path,
                "image_token_id",
                id.to_string(),
                &format!("a token id below vocab_size ({})", t.vocab_size),
            ));
        }
        for (field, v) in [
            ("rope_theta", t.rope_theta),
            ("compress_rope_theta", t.compress_rope_theta),
            ("rms_norm_eps", t.rms_norm_eps),
            ("routed_scaling_factor", t.routed_scaling_factor),
            ("swiglu_limit", t.swiglu_limit),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(bad(field, v.to_string(), "a finite positive number"));
            }
        }
        self.validate_schedule(path)?;
        self.validate_engram_and_drafts(path)
    }

    /// `compress_ratios`, the KV, index and candidate sources, the candidate blocks.
    fn validate_schedule(&self, path: &Path) -> Result<(), ConfigError> {
        let t = &self.text;
        let bad = |field: &str, found: String, expected: &str| {
            invalid(path, &self.field(field), found, expected)
        };
        let n = t.num_hidden_layers;
        let with_drafts = n + t.num_nextn_predict_layers;
        let len = t.compress_ratios.len();
        if len != n && len != with_drafts {
            return Err(bad(
                "compress_ratios",
                format!("a list of {len} entries"),
                &format!(
                    "{n} entries (one per layer, num_hidden_layers) or {with_drafts} (plus one \
                     per draft block, num_nextn_predict_layers {})",
                    t.num_nextn_predict_layers
                ),
            ));
        }
        for (i, &r) in t.compress_ratios.iter().enumerate() {
            if i < n && LayerKind::from_v41_ratio(r).is_none() {
                return Err(bad(
                    &format!("compress_ratios[{i}]"),
                    r.to_string(),
                    "one of 0, 1, 2 (DeepSeek-V4.1: none, per token, pairs)",
                ));
            }
            if i >= n && r != 0 {
                return Err(bad(
                    &format!("compress_ratios[{i}]"),
                    r.to_string(),
                    "0 (a draft block attends to its window only)",
                ));
            }
        }
        let ratios = &t.compress_ratios[..n];
        for (field, sources) in [
            ("kv_source_layer_ids", &t.kv_source_layer_ids),
            ("index_source_layer_ids", &t.index_source_layer_ids),
        ] {
            check_layer_list(sources, n, &self.field(field), path)?;
            if let Some(&l) = sources.iter().find(|&&l| ratios[l] == 0) {
                return Err(bad(
                    field,
                    format!("{sources:?}, with layer {l} of compress ratio 0"),
                    "layers with a compress ratio of 1 or 2 (a source reads compressed KV)",
                ));
            }
        }
        let kv = &t.kv_source_layer_ids;
        let index = &t.index_source_layer_ids;
        if let Some(&l) = index.iter().find(|&&l| kv.first().is_none_or(|&k| k > l)) {
            return Err(bad(
                "index_source_layer_ids",
                format!(
                    "{index:?}, whose layer {l} has no KV source at or below it ({} {kv:?})",
                    self.field("kv_source_layer_ids")
                ),
                "every index source at or after the first KV source (its index keys are a KV \
                 source's)",
            ));
        }
        if let Some(&l) = kv.iter().find(|l| !index.contains(l)) {
            return Err(bad(
                "kv_source_layer_ids",
                format!(
                    "{kv:?}, whose layer {l} is not an index source ({} {index:?})",
                    self.field("index_source_layer_ids")
                ),
                "KV sources that are also index sources (a KV source owns the index keys)",
            ));
        }
        // Every compressed layer reads a KV source's cache of its own ratio.
        for (l, &r) in ratios.iter().enumerate().filter(|(_, &r)| r > 0) {
            match kv.iter().rev().find(|&&s| s <= l) {
                None => return Err(bad(
                    &format!("compress_ratios[{l}]"),
                    format!(
                        "{r} with no KV source at or below layer {l} ({} {kv:?})",
                        self.field("kv_source_layer_ids")
                    ),
                    "0 before the first KV source (a compressed layer reads a KV source's cache)",
                )),
                Some(&s) if ratios[s] != r => {
                    return Err(bad(
                        &format!("compress_ratios[{l}]"),
                        format!(
                            "{r} while its KV source, layer {s}, has ratio {}",
                            ratios[s]
                        ),
                        "the ratio of the KV source whose cache the layer reads",
                    ))
                }
                Some(_) => {}
            }
        }
        if let Some(c) = self.candidate_source() {
            if !index.contains(&c) {
                return Err(bad(
                    "candidate_source_layer_id",
                    format!("{c} (index sources {index:?})"),
                    "one of the index sources, or below 0 for no candidate stage",
                ));
            }
            let rows = t.candidate_topk_blocks.checked_mul(t.candidate_block_size);
            if rows.is_none_or(|rows| rows < t.index_topk) {
                return Err(bad(
                    "candidate_topk_blocks",
                    format!(
                        "{} blocks x {} rows ({} candidate_block_size) = {}",
                        t.candidate_topk_blocks,
                        t.candidate_block_size,
                        self.field("candidate_block_size"),
                        rows.map_or("overflow".to_string(), |r| r.to_string())
                    ),
                    &format!(
                        "at least index_topk = {} candidate rows (a consumer picks its top-k \
                         inside them)",
                        t.index_topk
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Engram tables against their layers, draft-block fields.
    /// The sanity bounds of the sizes only V4.1 has ([`V41_SIZE_LIMITS`], as V4's
    /// `SIZE_LIMITS`): figures built from them (inventory bytes, the memory plan) stay far below
    /// 2^64 instead of wrapping to plausible wrong values.
    fn validate_v41_bounds(&self, path: &Path) -> Result<(), ConfigError> {
        let t = &self.text;
        let u = |v: usize| v as u64;
        // (composite name, the field as this file spells it, value)
        let text = |name: &'static str, v: u64| (name, self.field(name), v);
        let mut sizes = vec![
            text("hc_mult", u(t.hc_mult)),
            text("engram_head_dim", u(t.engram_head_dim)),
            text("engram_n_heads", u(t.engram_n_heads)),
            text("engram_max_ngram_size", u(t.engram_max_ngram_size)),
            text("engram_vocab_size", t.engram_vocab_size),
            text(
                "engram_compressed_vocab_size",
                u(t.engram_compressed_vocab_size),
            ),
            text("candidate_topk_blocks", u(t.candidate_topk_blocks)),
            text("candidate_block_size", u(t.candidate_block_size)),
            text("dspark_block_size", u(t.dspark_block_size)),
            text("dspark_markov_rank", u(t.dspark_markov_rank)),
            text("dspark_n_routed_experts", u(t.dspark_n_routed_experts)),
            text(
                "dspark_num_experts_per_tok",
                u(t.dspark_num_experts_per_tok),
            ),
        ];
        for (i, &rows) in t.engram_num_embeddings.iter().enumerate() {
            let field = format!("{}[{i}]", self.field("engram_num_embeddings"));
            sizes.push(("engram_num_embeddings", field, rows));
        }
        let mut vision = Vec::new();
        if let Some(v) = &self.vision {
            let field = |name: &'static str, value: usize| {
                (name, Names(self.dialect).vision(name), u(value))
            };
            vision.extend([
                field("num_hidden_layers", v.num_hidden_layers),
                field("hidden_size", v.hidden_size),
                field("num_attention_heads", v.num_attention_heads),
                field("intermediate_size", v.intermediate_size),
                field("patch_size", v.patch_size),
                field("downsample_ratio", v.downsample_ratio),
                field("max_image_tokens", v.max_image_tokens),
            ]);
        }
        for (table, list) in [
            (&V41_SIZE_LIMITS[..], sizes),
            (&V41_VISION_LIMITS[..], vision),
        ] {
            for (name, field, v) in list {
                let max = table
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, m)| *m)
                    .expect("every bounded field has a limit");
                if v > max {
                    return Err(invalid(
                        path,
                        &field,
                        v.to_string(),
                        &format!("at most {max} (a sanity bound)"),
                    ));
                }
            }
        }
        Ok(())
    }

    fn validate_engram_and_drafts(&self, path: &Path) -> Result<(), ConfigError> {
        let t = &self.text;
        let n = t.num_hidden_layers;
        check_layer_list(
            &t.engram_layer_ids,
            n,
            &self.field("engram_layer_ids"),
            path,
        )?;
        if t.engram_num_embeddings.len() != t.engram_layer_ids.len() {
            return Err(invalid(
                path,
                &self.field("engram_num_embeddings"),
                format!("a list of {} entries", t.engram_num_embeddings.len()),
                &format!(
                    "{} entries, one table per Engram layer ({} {:?})",
                    t.engram_layer_ids.len(),
                    self.field("engram_layer_ids"),
                    t.engram_layer_ids
                ),
            ));
        }
        if let Some(i) = t.engram_num_embeddings.iter().position(|&rows| rows == 0) {
            return Err(invalid(
                path,
                &format!("{}[{i}]", self.field("engram_num_embeddings")),
                "0".into(),
                "a positive number of rows",
            ));
        }
        check_layer_list(
            &t.dspark_target_layer_ids,
            n,
            &self.field("dspark_target_layer_ids"),
            path,
        )?;
        Ok(())
    }
}

/// A list of layer ids: strictly ascending, each below `n` (`num_hidden_layers`).
fn check_layer_list(list: &[usize], n: usize, field: &str, path: &Path) -> Result<(), ConfigError> {
    if let Some(w) = list.windows(2).find(|w| w[0] >= w[1]) {
        return Err(invalid(
            path,
            field,
            format!("{list:?} ({} then {})", w[0], w[1]),
            "strictly ascending layer ids",
        ));
    }
    if let Some(&l) = list.iter().find(|&&l| l >= n) {
        return Err(invalid(
            path,
            field,
            format!("{list:?}, with layer {l}"),
            &format!("layer ids below num_hidden_layers = {n}"),
        ));
    }
    Ok(())
}

/// The value of a size field of [`SIZE_LIMITS`] (the same names as V4's).
fn size_of(t: &V41Text, field: &str) -> usize {
    match field {
        "vocab_size" => t.vocab_size,
        "hidden_size" => t.hidden_size,
        "num_hidden_layers" => t.num_hidden_layers,
        "num_attention_heads" => t.num_attention_heads,
        "head_dim" => t.head_dim,
        "qk_rope_head_dim" => t.qk_rope_head_dim,
        "q_lora_rank" => t.q_lora_rank,
        "o_groups" => t.o_groups,
        "o_lora_rank" => t.o_lora_rank,
        "index_n_heads" => t.index_n_heads,
        "index_head_dim" => t.index_head_dim,
        "index_topk" => t.index_topk,
        "n_routed_experts" => t.n_routed_experts,
        "num_experts_per_tok" => t.num_experts_per_tok,
        "moe_intermediate_size" => t.moe_intermediate_size,
        "num_nextn_predict_layers" => t.num_nextn_predict_layers,
        "hc_sinkhorn_iters" => t.hc_sinkhorn_iters,
        "sliding_window" => t.sliding_window,
        "max_position_embeddings" => t.max_position_embeddings,
        _ => 0,
    }
}
