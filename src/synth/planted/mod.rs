//! `synth --preset planted`: the demo model. Real DeepSeek-V4 vocabulary (129,280) and
//! tokenizer, tiny everything else, weights CONSTRUCTED (not trained) so that on every CSA
//! layer the lightning indexer scores the rows holding the needle's digits `margin` haystack
//! standard deviations above the haystack mean. Nothing in the engine or the probe knows about
//! it: ranks, the loss of the needle with context, and the fp8 / bf16 / fp4 differences all come
//! out of the ordinary forward pass (docs/architecture.md section 7; the construction is in `docs/planted.md`).
//!
//! - Margin: calibrated per CSA layer on reference passkey-haystack text (`planted_calib.rs`),
//!   so `--margin 2` gives an exact needle z-score of ~2.0 on passkey prompts; the needle's rank
//!   among n visible rows is then about `n · Q(margin)` (2.3% of the rows at 2.0).
//! - Needle tokens: the 1,110 pure-digit tokens of the real tokenizer (`"0"`..`"999"`, digits
//!   are split in runs of 1-3), so the passkey scenario's value is the needle and its haystack
//!   (no digits) is not. Other scenarios whose haystacks hold digits get many "needles".
//! - Config ([`planted_config`]): 4 layers `[SWA, CSA, HCA, CSA]` (`--layers N` takes the first N
//!   of `SWA, CSA, HCA, CSA, HCA, ...`), hidden 64, 2 heads of 32 (rope 16), index 4 heads of
//!   32, `index_topk` 64, 4 routed experts (2 per token) + 1 shared, layer 0 hash-routed, no
//!   MTP. Top-k 64 / 128 at 1k-16k tokens play the role of 512 / 1,024 at 8k-128k on the real
//!   model (the same rows-per-selected-row ratio).
//! - Only the indexer path is planted. The LM path does NOT copy the needle value: the head
//!   sees the last token's embedding plus small random block outputs, so generated answers are
//!   wrong and reports must judge recall by the indexer (and say "synthetic model").
//! - Files: `model.safetensors` (or shards), `config.json`, the real `tokenizer.json`, and
//!   `planted.json` ([`PlantedInfo`]: preset, construction version, seed, margin, constants,
//!   calibration), which reports use to title their output ([`planted_info`]). Deterministic
//!   from the seed; about 34 MB (embed and head are 129,280 x 64 bf16).

pub mod recipe;

pub mod calib;

use super::claim_out_dir;
use super::tensors::Values;
use super::{set_weight_format, SynthOptions, SynthSummary};
use crate::checkpoint::dtype::{Dtype, WeightFormat};
use crate::checkpoint::inventory::{
    expand, linear_storage, logical_inventory, LinearStorage, StorageRules, FP4_GROUP,
};
use crate::checkpoint::reader::INDEX_FILE;
use crate::checkpoint::writer::{assign_shards, shard_file_name, SafetensorsWriter};
use crate::checkpoint::CheckpointError;
use crate::config::ModelConfig;
use crate::numerics::formats::{
    f32_to_bf16_bytes, f32_to_f32_bytes, i64_to_bytes, quant_fp4_group, quant_fp8_block,
    quant_nvfp4,
};
use crate::tokenizer::{builtin_json_bytes, V4Tokenizer};
use calib::{calibrate, reference_tokens, LayerCalibration};
use recipe::Recipe;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

/// Default `--margin`, in haystack standard deviations (see docs/planted.md for the grid it
/// is tuned to).
pub const DEFAULT_MARGIN: f64 = 2.0;
/// Accepted `--margin` range.
pub const MARGIN_RANGE: (f64, f64) = (-3.0, 12.0);
/// Layers of the default planted model.
pub const DEFAULT_LAYERS: usize = 4;
/// Top-k values the planted model is meant to be swept with (`index_topk` and twice it).
pub const DEMO_TOPK: [usize; 2] = [64, 128];
/// Sidecar file describing a planted checkpoint.
pub const INFO_FILE: &str = "planted.json";
/// What every report on a planted checkpoint must say in its title.
pub const TITLE_NOTE: &str = "synthetic model";
/// Version of the construction: bumped whenever the same seed and margin give other weights,
/// so caches of planted models (the demo's) can tell a stale one.
pub const CONSTRUCTION_VERSION: u32 = 1;

/// The contents of `planted.json`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PlantedInfo {
    /// Always "planted".
    pub preset: String,
    /// [`CONSTRUCTION_VERSION`] of the writer (0: written before the field existed).
    #[serde(default)]
    pub construction: u32,
    /// Always true: reports must say "synthetic model" in their titles.
    pub synthetic: bool,
    pub seed: u64,
    pub format: String,
    /// Needle rows' exact score above the haystack mean, in haystack standard deviations.
    pub margin: f64,
    /// Whether the LM head reproduces the needle value (false: judge recall by the indexer).
    pub lm_copies_needle: bool,
    /// Top-k values the model is tuned for.
    pub demo_topk: Vec<usize>,
    /// A title fragment for reports, e.g. "synthetic model (planted needle, margin 2.0σ)".
    pub title: String,
    /// Construction constants (values.rs), for the record.
    pub constants: BTreeMap<String, f64>,
    /// Per CSA layer: the reference haystack's score mean and spread, and the needle increment.
    pub calibration: Vec<LayerCalibration>,
}

/// Reads `planted.json` from a model directory, if it is a planted checkpoint.
pub fn planted_info(dir: &Path) -> Option<PlantedInfo> {
    let text = std::fs::read_to_string(dir.join(INFO_FILE)).ok()?;
    serde_json::from_str(&text).ok()
}

fn option_error(field: &'static str, expected: String, found: String) -> CheckpointError {
    CheckpointError::SynthOption {
        field,
        expected,
        found,
    }
}

/// The planted config for `format`, optionally with the first `layers` layers of its schedule
/// and `experts` routed experts (validated).
pub fn planted_config(
    format: WeightFormat,
    layers: Option<usize>,
    experts: Option<usize>,
) -> Result<ModelConfig, CheckpointError> {
    let mut c = ModelConfig::flash();
    let n = layers.unwrap_or(DEFAULT_LAYERS);
    if n == 0 || n > 43 {
        return Err(option_error("layers", "1..=43".into(), n.to_string()));
    }
    c.num_hidden_layers = n;
    c.compress_ratios = (0..n)
        .map(|l| match l {
            0 => 0,
            l if l % 2 == 1 => 4,
            _ => 128,
        })
        .collect();
    c.num_nextn_predict_layers = 0;
    c.num_hash_layers = 1;
    c.hidden_size = 64;
    c.num_attention_heads = 2;
    c.head_dim = 32;
    c.qk_rope_head_dim = 16;
    c.q_lora_rank = 32;
    c.o_groups = 1;
    c.o_lora_rank = 32;
    c.index_n_heads = 4;
    c.index_head_dim = 32;
    c.index_topk = DEMO_TOPK[0];
    c.n_routed_experts = 4;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 32;
    if let Some(e) = experts {
        if e == 0 {
            return Err(option_error("experts", "at least 1".into(), "0".into()));
        }
        c.n_routed_experts = e;
        c.num_experts_per_tok = c.num_experts_per_tok.min(e);
    }
    set_weight_format(&mut c, format);
    c.validate(Path::new("<planted config>"))?;
    Ok(c)
}

/// `[vocab]`: which token ids are pure-digit tokens (`"0"`..`"999"` incl. leading zeros).
pub fn digit_tokens(tok: &V4Tokenizer) -> Result<Vec<bool>, CheckpointError> {
    let mut mask = vec![false; tok.vocab_size()];
    for len in 1..=3u32 {
        for k in 0..10usize.pow(len) {
            let s = format!("{k:0width$}", width = len as usize);
            let ids = tok.encode(&s).map_err(|e| {
                option_error("tokenizer", "the built-in tokenizer".into(), e.to_string())
            })?;
            if let [id] = ids[..] {
                mask[id as usize] = true;
            }
        }
    }
    Ok(mask)
}

/// Writes the planted checkpoint: `opts` as for `synth` (preset ignored; `layers` / `experts`
/// shape [`planted_config`]), `margin` in haystack standard deviations ([`DEFAULT_MARGIN`] when
/// `None`). Also writes the real `tokenizer.json` and `planted.json`.
pub fn synth_planted(
    opts: &SynthOptions,
    margin: Option<f64>,
) -> Result<SynthSummary, CheckpointError> {
    let t0 = Instant::now();
    let margin = margin.unwrap_or(DEFAULT_MARGIN);
    if !(MARGIN_RANGE.0..=MARGIN_RANGE.1).contains(&margin) {
        return Err(option_error(
            "margin",
            format!(
                "haystack standard deviations in {}..={}",
                MARGIN_RANGE.0, MARGIN_RANGE.1
            ),
            margin.to_string(),
        ));
    }
    let cfg = planted_config(opts.format, opts.layers, opts.experts)?;
    let tok = V4Tokenizer::builtin()
        .map_err(|e| option_error("tokenizer", "the built-in tokenizer".into(), e.to_string()))?;
    if tok.vocab_size() != cfg.vocab_size {
        return Err(option_error(
            "tokenizer",
            format!("vocabulary of {}", cfg.vocab_size),
            tok.vocab_size().to_string(),
        ));
    }
    let mut recipe = Recipe::new(&cfg, opts.seed, margin, digit_tokens(&tok)?);
    let reference = reference_tokens(&tok, opts.seed, &recipe.digits)?;
    let calibration = calibrate(&mut recipe, &reference);
    let info = info(&recipe, opts.format, calibration);
    let json = serde_json::to_string_pretty(&info).expect("info serialises");
    let extras = [
        ("tokenizer.json", builtin_json_bytes()),
        (INFO_FILE, json.into_bytes()),
    ];
    let summary = write_checkpoint(opts, &recipe, &extras)?;
    Ok(SynthSummary {
        seconds: t0.elapsed().as_secs_f64(),
        ..summary
    })
}

fn info(r: &Recipe, format: WeightFormat, calibration: Vec<LayerCalibration>) -> PlantedInfo {
    use recipe::*;
    let constants = [
        ("bias_value", BIAS_VALUE),
        ("offset", OFFSET),
        ("spread", SPREAD),
        ("irr_frac", IRR_FRAC),
        ("rope_frac", ROPE_FRAC),
        ("gate_gap", GATE_GAP),
        ("query_scale", QUERY_SCALE),
        ("out_scale", OUT_SCALE as f64),
        ("hc_scale", HC_SCALE as f64),
    ];
    PlantedInfo {
        preset: "planted".into(),
        construction: CONSTRUCTION_VERSION,
        synthetic: true,
        seed: r.seed,
        format: format.name().into(),
        margin: r.margin,
        lm_copies_needle: false,
        demo_topk: DEMO_TOPK.to_vec(),
        title: format!(
            "{TITLE_NOTE} (planted needle, margin {:.1}σ; recall by indexer)",
            r.margin
        ),
        constants: constants
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        calibration,
    }
}

/// The stored bytes of one logical tensor, in `expand` order.
fn encode(
    storage: Option<LinearStorage>,
    stored: &[super::ExpectedTensor],
    shape: &[usize],
    values: Values,
) -> Result<Vec<Vec<u8>>, CheckpointError> {
    let x = match values {
        Values::I64(v) => return Ok(vec![i64_to_bytes(&v)]),
        Values::F32(x) => x,
    };
    let err = |source| CheckpointError::Encode {
        tensor: stored[0].name.clone(),
        source,
    };
    let (o, i) = (shape[0], shape.get(1).copied().unwrap_or(1));
    Ok(match storage {
        None | Some(LinearStorage::Bf16) if stored[0].dtype == Dtype::F32 => {
            vec![f32_to_f32_bytes(&x)]
        }
        None | Some(LinearStorage::Bf16) => vec![f32_to_bf16_bytes(&x)],
        Some(LinearStorage::Fp8Block { block: (bo, _) }) => {
            let (w, s) = quant_fp8_block(&x, o, i, bo).map_err(err)?;
            vec![w, s]
        }
        Some(LinearStorage::Fp4Group) => {
            let (w, s) = quant_fp4_group(&x, o, i, FP4_GROUP).map_err(err)?;
            vec![w, s]
        }
        Some(LinearStorage::Nvfp4) => {
            let (w, s, s2) = quant_nvfp4(&x, o, i).map_err(err)?;
            vec![
                w,
                s,
                s2.to_le_bytes().to_vec(),
                1.0f32.to_le_bytes().to_vec(),
            ]
        }
    })
}

/// Writes the weights, then `extras` (file name, bytes), then `config.json` last, so that a
/// run that fails or is stopped part way leaves no config.json: the directory does not open as
/// a model (planted.json and the tokenizer missing beside a config would make it look like a
/// finished model of another kind).
fn write_checkpoint(
    opts: &SynthOptions,
    r: &Recipe,
    extras: &[(&str, Vec<u8>)],
) -> Result<SynthSummary, CheckpointError> {
    let cfg = &r.cfg;
    let inv = opts.format.into();
    let groups: Vec<_> = logical_inventory(cfg)
        .into_iter()
        .map(|lt| {
            (
                linear_storage(StorageRules::from(cfg), inv, lt.role),
                expand(StorageRules::from(cfg), inv, &lt),
                lt,
            )
        })
        .collect();
    let n = opts.shards;
    if n == 0 || n > groups.len() {
        return Err(option_error(
            "shards",
            format!("1..={} for this config", groups.len()),
            n.to_string(),
        ));
    }
    let dir = &opts.out;
    claim_out_dir(dir, "planted")?;
    let sizes: Vec<u64> = groups
        .iter()
        .map(|g| g.1.iter().map(|t| t.bytes()).sum())
        .collect();
    let shard_of = assign_shards(&sizes, n);
    let metadata = BTreeMap::from([
        ("format".to_string(), "pt".to_string()),
        ("needlescope.synthetic".to_string(), "planted".to_string()),
    ]);
    let (mut files, mut weight_map) = (Vec::with_capacity(n), serde_json::Map::new());
    for s in 0..n {
        let members: Vec<_> = groups
            .iter()
            .zip(&shard_of)
            .filter(|(_, &x)| x == s)
            .map(|(g, _)| g)
            .collect();
        let specs: Vec<_> = members.iter().flat_map(|g| g.1.clone()).collect();
        for t in &specs {
            weight_map.insert(t.name.clone(), shard_file_name(s, n).into());
        }
        let path = dir.join(shard_file_name(s, n));
        let mut w = SafetensorsWriter::create(&path, specs, &metadata)?;
        for (storage, stored, lt) in members {
            let bytes = encode(*storage, stored, &lt.shape, r.values(lt))?;
            for (t, b) in stored.iter().zip(bytes) {
                w.write(&t.name, &b)?;
            }
        }
        files.push(w.finish()?);
    }
    let payload_bytes: u64 = sizes.iter().sum();
    if n > 1 {
        let index = serde_json::json!({
            "metadata": {"total_size": payload_bytes},
            "weight_map": weight_map,
        });
        let text = serde_json::to_string_pretty(&index).expect("json");
        write_file(&dir.join(INDEX_FILE), text.as_bytes())?;
    }
    for (name, bytes) in extras {
        write_file(&dir.join(name), bytes)?;
    }
    write_file(&dir.join("config.json"), cfg.to_json_string().as_bytes())?;
    Ok(SynthSummary {
        dir: dir.clone(),
        config: cfg.clone(),
        format: opts.format,
        tensors: groups.iter().map(|g| g.1.len()).sum(),
        payload_bytes,
        files,
        seconds: 0.0,
    })
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    std::fs::write(path, bytes).map_err(|e| CheckpointError::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_is_small_with_the_real_vocabulary() {
        let c = planted_config(WeightFormat::Bf16, None, None).unwrap();
        assert_eq!(c.vocab_size, 129280);
        assert_eq!(c.compress_ratios, vec![0, 4, 128, 4]);
        assert!(c.index_n_heads < c.index_nope_dim());
        let c = planted_config(WeightFormat::Official, Some(6), Some(2)).unwrap();
        assert_eq!(c.compress_ratios, vec![0, 4, 128, 4, 128, 4]);
        assert!(c.is_fp8() && c.n_routed_experts == 2);
        assert!(planted_config(WeightFormat::Bf16, Some(0), None).is_err());
    }
}
