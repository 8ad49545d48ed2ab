//! `ModelConfig`: the DeepSeek-V4 architecture as read from a checkpoint's `config.json`,
//! validated once at load (docs/spec/model.md section 1).
//!
//! Accepts the HF-style config shipped with DeepSeek-V4-Flash (44-entry `compress_ratios` whose
//! trailing entries belong to the MTP layer(s); 46 in the 0731 release, whose three DSpark
//! stages replace the MTP layer), top-level `expert_dtype` (or, failing that, the copy Hugging
//! Face keeps in `quantization_config.expert_dtype`), `quantization_config`,
//! `rope_scaling`, `compress_rope_theta`) and V4-Pro. Unknown keys are ignored (the 0731 release
//! adds `dspark_*` keys). Every check names the field, the value found and what was expected.
//! `model_type` must be `"deepseek_v4"` (or absent), `quantization_config.quant_method` absent,
//! `"fp8"` or `"modelopt"`, and every size field lies under a generous sanity bound (at least 16x
//! the largest released value, [`limits::SIZE_LIMITS`]) so that no memory figure computed from the
//! config can overflow; those checks live in [`limits`]. This file holds, in this order, the
//! config itself and its derived facts, the nested `rope_scaling` and `quantization_config`
//! sections, the structural checks ([`ModelConfig::validate`]) and the built-in Flash and tiny
//! configs. Derived facts that the rest of the code needs (layer kinds, router kinds, RoPE dims) live here
//! so there is one source of truth for the layer schedule; what each layer does with it (its
//! compressed KV, its indexer, its row mapping) is the layer-role table of [`layers`]
//! ([`ModelConfig::layer_roles`]).

use crate::numerics::rope::{RopeTable, Yarn};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub use layers::{CandidateStage, LayerKind, LayerRole, LayerRoles, RowMapping};
pub use v41::{V41Config, V41Vision};

/// Errors from reading or validating `config.json`.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config {path} is a directory, expected a file (the model's config.json)")]
    NotAFile { path: PathBuf },
    #[error("config {path} is not valid JSON for a DeepSeek config: {}{source}", field_of(.field))]
    Parse {
        path: PathBuf,
        /// The field being read (`index_topk`, `quantization_config.fmt`), empty at the top
        /// level (a JSON syntax error).
        field: String,
        source: serde_json::Error,
    },
    #[error("config {path}: field `{field}` is {found}, expected {expected}")]
    Invalid {
        path: PathBuf,
        field: String,
        found: String,
        expected: String,
    },
    /// A config of a family the caller does not take: [`ModelConfig::load`] (the loader of
    /// every command that runs a model) refuses a DeepSeek-V4.1 config by name, the V4.1
    /// checkpoint reader a DeepSeek-V4 one; [`load_any`] reads both.
    #[error("config {path}: {}", .family.refusal())]
    Unsupported { path: PathBuf, family: Family },
}

/// A model family needlescope reads: the family of a config comes from its `model_type` (or,
/// without one, from the key set only V4.1 has), never from a layer count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// DeepSeek-V4 (Flash, Pro, Flash-0731): [`ModelConfig`].
    V4,
    /// DeepSeek-V4.1-Flash: [`V41Config`].
    V41,
}

impl Family {
    /// Why a loader that does not take this family refuses it.
    fn refusal(self) -> String {
        match self {
            Family::V41 => format!(
                "{} (model_type {}) is not supported by this command yet: it runs DeepSeek-V4 \
                 (model_type {}) only; `needlescope inspect` reads DeepSeek-V4.1 configs and \
                 checkpoints",
                self.name(),
                self.model_type(),
                Family::V4.model_type()
            ),
            Family::V4 => format!(
                "{} (model_type {}) found where a DeepSeek-V4.1 config (model_type {}) was \
                 expected",
                self.name(),
                self.model_type(),
                Family::V41.model_type()
            ),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Family::V4 => "DeepSeek-V4",
            Family::V41 => "DeepSeek-V4.1",
        }
    }
    pub fn model_type(self) -> &'static str {
        match self {
            Family::V4 => limits::MODEL_TYPE,
            Family::V41 => v41::MODEL_TYPE,
        }
    }
    /// The family of config text: V4.1 when [`v41::is_v41`] says so, else V4 (whose loader
    /// then names what is wrong, malformed JSON included).
    pub fn of_json_str(text: &str) -> Family {
        match serde_json::from_str::<serde_json::Value>(text) {
            Ok(json) if v41::is_v41(&json) => Family::V41,
            _ => Family::V4,
        }
    }
}

/// One validated model description per family ([`load_any`]).
#[derive(Clone, Debug, PartialEq)]
pub enum ModelDescription {
    V4(ModelConfig),
    V41(V41Config),
}

impl ModelDescription {
    pub fn family(&self) -> Family {
        match self {
            ModelDescription::V4(_) => Family::V4,
            ModelDescription::V41(_) => Family::V41,
        }
    }
    /// The layer-role table of the main layers, whichever the family.
    pub fn layer_roles(&self) -> LayerRoles {
        match self {
            ModelDescription::V4(c) => c.layer_roles(),
            ModelDescription::V41(c) => c.layer_roles(),
        }
    }
    /// Parses and validates config text of any family; `path` is only used in messages.
    pub fn from_json_str(text: &str, path: &Path) -> Result<Self, ConfigError> {
        match Family::of_json_str(text) {
            Family::V41 => V41Config::from_json_str(text, path).map(ModelDescription::V41),
            Family::V4 => ModelConfig::from_json_str(text, path).map(ModelDescription::V4),
        }
    }
}

/// Reads `config.json` of any family (a file or a model directory, as [`ModelConfig::load`])
/// and validates it as its family's description.
pub fn load_any(path: &Path) -> Result<ModelDescription, ConfigError> {
    let (text, path) = read_config(path)?;
    ModelDescription::from_json_str(&text, &path)
}

/// The config file a path names (the file itself, or a model directory's `config.json`) and its
/// text.
fn read_config(path: &Path) -> Result<(String, PathBuf), ConfigError> {
    // A model directory (or a missing path that is not a .json file: its error then names
    // the config.json the user's directory lacks). A directory that is itself named
    // config.json is the file the user meant, not a model directory: it is reported as a
    // directory, not as a missing `config.json/config.json`.
    let is_json = path.extension().is_some_and(|e| e == "json");
    let named_config = path.file_name().is_some_and(|n| n == "config.json");
    let path = if path.is_dir() {
        let inner = path.join("config.json");
        if named_config && !inner.exists() {
            path.to_path_buf()
        } else {
            inner
        }
    } else if !path.exists() && !is_json {
        // Missing: name the config.json it lacks. Something that exists but is not a
        // directory (a file, `/dev/null`, a FIFO) is read as the config itself.
        path.join("config.json")
    } else {
        path.to_path_buf()
    };
    if path.is_dir() {
        return Err(ConfigError::NotAFile { path });
    }
    let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Io {
        path: path.clone(),
        source,
    })?;
    Ok((text, path))
}

/// How the MoE of one layer picks its experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RouterKind {
    /// Fixed experts per input token id (`ffn.gate.tid2eid`).
    Hash,
    /// Top-k of sqrtsoftplus scores plus a selection-only bias (`ffn.gate.bias`).
    Score,
}

/// The validated model configuration. Field names follow config.json.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    #[serde(default)]
    pub architectures: Vec<String>,
    #[serde(default = "default_model_type")]
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default = "one")]
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub q_lora_rank: usize,
    pub o_groups: usize,
    pub o_lora_rank: usize,
    pub index_n_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
    pub n_routed_experts: usize,
    pub num_experts_per_tok: usize,
    #[serde(default = "one")]
    pub n_shared_experts: usize,
    pub moe_intermediate_size: usize,
    pub num_hash_layers: usize,
    #[serde(default)]
    pub num_nextn_predict_layers: usize,
    pub hc_mult: usize,
    pub hc_sinkhorn_iters: usize,
    pub hc_eps: f64,
    pub rms_norm_eps: f64,
    pub sliding_window: usize,
    pub rope_theta: f64,
    pub compress_rope_theta: f64,
    pub rope_scaling: Option<RopeScaling>,
    pub routed_scaling_factor: f64,
    pub scoring_func: String,
    pub swiglu_limit: f64,
    #[serde(default = "yes")]
    pub norm_topk_prob: bool,
    #[serde(default)]
    pub topk_method: Option<String>,
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub bos_token_id: u32,
    #[serde(default = "one_u32")]
    pub eos_token_id: u32,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub expert_dtype: Option<String>,
    #[serde(default)]
    pub quantization_config: Option<QuantizationConfig>,
    pub compress_ratios: Vec<usize>,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default)]
    pub torch_dtype: Option<String>,
}

fn default_model_type() -> String {
    "deepseek_v4".into()
}
fn default_act() -> String {
    "silu".into()
}
fn default_max_pos() -> usize {
    1 << 20
}
fn one() -> usize {
    1
}
fn one_u32() -> u32 {
    1
}
fn yes() -> bool {
    true
}

/// A config.json re-saved by transformers 5.x keeps the layer schedule in `layer_types` and
/// the RoPE settings in `rope_parameters` (`main` / `compress`), not in the release's
/// `compress_ratios` / `rope_scaling`. Reading it as a release config would lose the CSA/HCA
/// layers' YaRN silently, so it is refused, naming what to use instead.
fn refuse_resaved_by_transformers(text: &str, path: &Path) -> Result<(), ConfigError> {
    let Ok(serde_json::Value::Object(map)) = serde_json::from_str::<serde_json::Value>(text) else {
        return Ok(()); // the typed parse reports malformed JSON
    };
    let found: Vec<&str> = ["layer_types", "rope_parameters"]
        .into_iter()
        .filter(|k| map.contains_key(*k))
        .collect();
    let lacking: Vec<&str> = ["compress_ratios", "rope_scaling"]
        .into_iter()
        .filter(|k| !map.contains_key(*k))
        .collect();
    if found.is_empty() || lacking.is_empty() {
        return Ok(());
    }
    Err(ConfigError::Invalid {
        path: path.to_path_buf(),
        field: lacking.join(", "),
        found: format!(
            "absent, with transformers' {} instead (a config re-saved by transformers)",
            found.join(" and ")
        ),
        expected: "the release's own config.json (with compress_ratios and rope_scaling)".into(),
    })
}

/// "field `x`: " for a parse error inside field `x`, nothing at the top level.
fn field_of(field: &str) -> String {
    if field.is_empty() {
        String::new()
    } else {
        format!("field `{field}`: ")
    }
}

impl ModelConfig {
    /// Reads `config.json` from a file or from a model directory, then validates it. A
    /// DeepSeek-V4.1 config is refused by name ([`ConfigError::Unsupported`]): this is the
    /// loader of every command that runs V4 only ([`load_any`] reads both).
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let (text, path) = read_config(path)?;
        Self::from_json_str(&text, &path)
    }

    /// Parses and validates config text; `path` is only used in error messages. Refuses a
    /// DeepSeek-V4.1 config by name.
    pub fn from_json_str(text: &str, path: &Path) -> Result<Self, ConfigError> {
        if Family::of_json_str(text) == Family::V41 {
            return Err(ConfigError::Unsupported {
                path: path.to_path_buf(),
                family: Family::V41,
            });
        }
        refuse_resaved_by_transformers(text, path)?;
        let mut json = serde_json::Deserializer::from_str(text);
        let mut cfg: ModelConfig = serde_path_to_error::deserialize(&mut json).map_err(|e| {
            let field = e.path().to_string();
            ConfigError::Parse {
                path: path.to_path_buf(),
                field: if field == "." { String::new() } else { field },
                source: e.into_inner(),
            }
        })?;
        // Nothing but whitespace after the object (as serde_json::from_str requires).
        json.end().map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            field: String::new(),
            source,
        })?;
        cfg.adopt_nested_expert_dtype(path)?;
        cfg.validate(path)?;
        Ok(cfg)
    }

    /// Takes `quantization_config.expert_dtype` as `expert_dtype` when the top level has none;
    /// refuses the two when they disagree.
    fn adopt_nested_expert_dtype(&mut self, path: &Path) -> Result<(), ConfigError> {
        let Some(nested) = self
            .quantization_config
            .as_ref()
            .and_then(|q| q.expert_dtype.clone())
        else {
            return Ok(());
        };
        match &self.expert_dtype {
            None => self.expert_dtype = Some(nested),
            Some(top) if *top != nested => {
                return Err(ConfigError::Invalid {
                    path: path.to_path_buf(),
                    field: "quantization_config.expert_dtype".into(),
                    found: format!("{nested:?} while the top-level expert_dtype is {top:?}"),
                    expected: "the same value as the top-level expert_dtype".into(),
                })
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// Serialises back to pretty JSON (what `synth` writes).
    pub fn to_json_string(&self) -> String {
        serde_json::to_string_pretty(self).expect("config serialises")
    }

    /// Attention type of main layer `layer` (0-based), from its ratio: the input of
    /// [`Self::layer_roles`], which is what to ask about a layer's compressor, indexer and rows.
    pub fn layer_kind(&self, layer: usize) -> LayerKind {
        LayerKind::from_ratio(self.compress_ratios[layer]).expect("validated")
    }

    /// The layer-role table of the main layers ([`layers`]): built from the validated ratios on
    /// each call (one entry per layer), never stored, so the config's JSON stays what
    /// config.json holds.
    pub fn layer_roles(&self) -> LayerRoles {
        LayerRoles::v4((0..self.num_hidden_layers).map(|l| self.layer_kind(l)))
    }

    /// The role of MTP layer `i` (its index counts on from the main layers, as its entry in
    /// `compress_ratios` does).
    pub fn mtp_layer_role(&self, i: usize) -> LayerRole {
        LayerRole::v4(self.num_hidden_layers + i, self.mtp_layer_kind(i))
    }

    /// The main layers with a lightning indexer (the CSA layers on V4), ascending.
    pub fn csa_layers(&self) -> Vec<usize> {
        self.layer_roles().indexed_layers()
    }

    /// Refuses a model without a CSA layer for the needle diagnostics (`probe`, `sweep`): there is
    /// no indexer whose selection could lose the needle, so every verdict would be vacuous.
    pub fn require_csa_layer(&self, path: &Path) -> Result<(), ConfigError> {
        if self.layer_roles().indexed_layers().is_empty() {
            return Err(ConfigError::Invalid {
                path: path.to_path_buf(),
                field: "compress_ratios".into(),
                found: format!(
                    "{:?} for its {} layers, with no 4 (no CSA layer, so no indexer to probe)",
                    &self.compress_ratios[..self.num_hidden_layers],
                    self.num_hidden_layers
                ),
                expected: "at least one CSA layer (ratio 4)".into(),
            });
        }
        Ok(())
    }

    /// Attention type of MTP layer `i`, if the config lists it (sliding otherwise).
    pub fn mtp_layer_kind(&self, i: usize) -> LayerKind {
        self.compress_ratios
            .get(self.num_hidden_layers + i)
            .and_then(|&r| LayerKind::from_ratio(r))
            .unwrap_or(LayerKind::Swa)
    }

    pub fn router_kind(&self, layer: usize) -> RouterKind {
        if layer < self.num_hash_layers {
            RouterKind::Hash
        } else {
            RouterKind::Score
        }
    }

    /// Main layers of a given kind, ascending.
    pub fn layers_of_kind(&self, kind: LayerKind) -> Vec<usize> {
        self.layer_roles().layers_of_kind(kind)
    }

    /// Non-RoPE dims at the front of each main head (448 on Flash).
    pub fn nope_head_dim(&self) -> usize {
        self.head_dim - self.qk_rope_head_dim
    }

    /// Non-RoPE dims at the front of each index head (64 on Flash).
    pub fn index_nope_dim(&self) -> usize {
        self.index_head_dim - self.qk_rope_head_dim
    }

    /// Heads per output group of the grouped `wo_a` projection.
    pub fn heads_per_group(&self) -> usize {
        self.num_attention_heads / self.o_groups
    }

    /// Whether routed experts are stored as FP4 in the official format.
    pub fn experts_fp4(&self) -> bool {
        self.expert_dtype.as_deref() == Some("fp4")
    }

    /// Whether non-expert linears are FP8 block-quantised.
    pub fn is_fp8(&self) -> bool {
        self.quantization_config
            .as_ref()
            .and_then(|q| q.quant_method.as_deref())
            == Some("fp8")
    }

    /// FP8 weight block size (128x128 on the official release).
    pub fn weight_block(&self) -> (usize, usize) {
        self.quantization_config
            .as_ref()
            .and_then(|q| q.weight_block_size.clone())
            .map(|b| (b[0], b[1]))
            .unwrap_or((128, 128))
    }

    /// A short human summary ("43 layers: 2 SWA, 21 CSA, 20 HCA; 3 hash + 40 score routers").
    pub fn schedule_summary(&self) -> String {
        let roles = self.layer_roles();
        let swa = roles.layers_of_kind(LayerKind::Swa).len();
        let csa = roles.layers_of_kind(LayerKind::Csa).len();
        let hca = roles.layers_of_kind(LayerKind::Hca).len();
        format!(
            "{} layers: {} SWA, {} CSA, {} HCA; {} hash + {} score routers; {} MTP",
            self.num_hidden_layers,
            swa,
            csa,
            hca,
            self.num_hash_layers,
            self.num_hidden_layers - self.num_hash_layers,
            self.num_nextn_predict_layers
        )
    }

    /// SHA-256 of the canonical JSON of this config, to tie results to a model. A nested
    /// `quantization_config.expert_dtype` is left out (it is hashed as the top-level field it
    /// becomes at load). ModelOpt's `moe_quant_algo` is left out: it only names the experts' storage (the weights' own hash
    /// covers that), and configs hashed before the key was read keep their hash, so report
    /// directories made with NVIDIA's NVFP4 checkpoint still resume.
    pub fn hash_hex(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut hashed = self.clone();
        if let Some(q) = hashed.quantization_config.as_mut() {
            q.moe_quant_algo = None;
            // Adopted as the top-level `expert_dtype`, which the hash covers.
            q.expert_dtype = None;
        }
        let digest = Sha256::digest(serde_json::to_vec(&hashed).expect("config serialises"));
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Test-only and synth helper: a config JSON value that callers may mutate to produce
/// invalid inputs.
pub fn flash_config_json() -> serde_json::Value {
    serde_json::to_value(ModelConfig::flash()).expect("config serialises")
}

impl ModelConfig {
    /// The RoPE table a layer of `kind` uses (docs/spec/attention.md 3.3): plain `rope_theta` on SWA
    /// layers; `compress_rope_theta` on CSA and HCA layers, with YaRN when `rope_scaling` is set.
    /// Every rope of a layer uses it (q, window kv, compressed rows, index q and keys).
    pub fn rope_table(&self, kind: LayerKind) -> RopeTable {
        let d_r = self.qk_rope_head_dim;
        match (kind, &self.rope_scaling) {
            (LayerKind::Swa, _) => RopeTable::plain(d_r, self.rope_theta),
            (_, Some(scaling)) => RopeTable::yarn(d_r, self.compress_rope_theta, &scaling.yarn()),
            (_, None) => RopeTable::plain(d_r, self.compress_rope_theta),
        }
    }
}

pub mod engram;
pub mod layers;
pub mod limits;
pub mod v41;

#[cfg(test)]
mod tests;

// ---------------------------------------------------------------------------------------------
// The nested sections of `config.json`: `rope_scaling` ([`RopeScaling`], YaRN; `type` and
// `rope_type` reconciled) and `quantization_config` ([`QuantizationConfig`]: block-FP8 of
// the official release, ModelOpt's NVFP4 experts). Read as written; checks that need the
// whole config live in `ModelConfig::validate` below.

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

// ---------------------------------------------------------------------------------------------
// `ModelConfig::validate`: every
// structural assumption the engine makes about a config, checked once at load, each failure
// naming the field, the value found and what was expected. Size bounds and identity fields are
// checked first by [`limits::check`](super::limits::check).

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

// ---------------------------------------------------------------------------------------------
// The built-in configs: [`ModelConfig::flash`], DeepSeek-V4-Flash
// exactly as released, and [`ModelConfig::tiny`], the toy-size architecture the tests and
// `synth --preset tiny` use.

impl ModelConfig {
    /// The DeepSeek-V4-Flash config (docs/spec/model.md 1.1), exactly as released.
    pub fn flash() -> Self {
        let mut ratios = vec![0, 0];
        for _ in 0..20 {
            ratios.extend([4, 128]);
        }
        ratios.extend([4, 0]);
        ModelConfig {
            architectures: vec!["DeepseekV4ForCausalLM".into()],
            model_type: "deepseek_v4".into(),
            vocab_size: 129280,
            hidden_size: 4096,
            num_hidden_layers: 43,
            num_attention_heads: 64,
            num_key_value_heads: 1,
            head_dim: 512,
            qk_rope_head_dim: 64,
            q_lora_rank: 1024,
            o_groups: 8,
            o_lora_rank: 1024,
            index_n_heads: 64,
            index_head_dim: 128,
            index_topk: 512,
            n_routed_experts: 256,
            num_experts_per_tok: 6,
            n_shared_experts: 1,
            moe_intermediate_size: 2048,
            num_hash_layers: 3,
            num_nextn_predict_layers: 1,
            hc_mult: 4,
            hc_sinkhorn_iters: 20,
            hc_eps: 1e-6,
            rms_norm_eps: 1e-6,
            sliding_window: 128,
            rope_theta: 10000.0,
            compress_rope_theta: 160000.0,
            rope_scaling: Some(RopeScaling {
                kind: "yarn".into(),
                factor: 16.0,
                original_max_position_embeddings: 65536,
                beta_fast: 32.0,
                beta_slow: 1.0,
            }),
            routed_scaling_factor: 1.5,
            scoring_func: "sqrtsoftplus".into(),
            swiglu_limit: 10.0,
            norm_topk_prob: true,
            topk_method: Some("noaux_tc".into()),
            max_position_embeddings: 1048576,
            bos_token_id: 0,
            eos_token_id: 1,
            tie_word_embeddings: false,
            expert_dtype: Some("fp4".into()),
            quantization_config: Some(QuantizationConfig::official()),
            compress_ratios: ratios,
            hidden_act: "silu".into(),
            torch_dtype: Some("bfloat16".into()),
        }
    }

    /// The `tiny` synthetic architecture: every component at toy size (see docs/architecture.md section 7).
    /// Layers: 0 SWA (hash router), 1 CSA (hash router), 2 HCA, 3 CSA (score routers) + 1 MTP.
    /// Vocabulary 4096 (documented smaller than V4's 129,280 to keep the checkpoint at a few MB);
    /// 16 index heads so exact top-k ties are rare; top-k 8 so selection matters early.
    pub fn tiny() -> Self {
        let mut c = Self::flash();
        c.vocab_size = 4096;
        c.hidden_size = 64;
        c.num_hidden_layers = 4;
        c.compress_ratios = vec![0, 4, 128, 4, 0];
        c.num_nextn_predict_layers = 1;
        c.num_attention_heads = 4;
        c.head_dim = 64;
        c.qk_rope_head_dim = 16;
        c.q_lora_rank = 32;
        c.o_groups = 2;
        c.o_lora_rank = 32;
        c.index_n_heads = 16;
        c.index_head_dim = 32;
        c.index_topk = 8;
        c.n_routed_experts = 8;
        c.num_experts_per_tok = 2;
        c.moe_intermediate_size = 32;
        c.num_hash_layers = 2;
        c.expert_dtype = None;
        c.quantization_config = None;
        c
    }
}

#[cfg(test)]
mod tests_v41;
