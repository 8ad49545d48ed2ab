//! `synth`: deterministic synthetic checkpoints in the official tensor names and formats
//! (docs/architecture.md section 7), so the real loader is what tests and demos exercise.
//!
//! Config: `ModelConfig::tiny()` or `flash()`, then `--layers N` (the first N entries of the
//! preset's schedule, MTP entries kept, `num_hash_layers` capped at N) and `--experts E`
//! (`n_routed_experts = E`, `num_experts_per_tok = min(preset's k, E)`, i.e. min(6, E) on
//! Flash). Official and NVFP4 outputs carry the official `quantization_config` and
//! `expert_dtype: "fp4"`; bf16 outputs carry neither. `planted` has its own config and
//! constructed weights ([`planted`]): [`synth_config`] and [`synth`] hand it over to
//! [`planted::planted_config`] and [`planted::synth_planted`] (at the default margin).
//! `v41-tiny` is DeepSeek-V4.1 ([`v41`]): [`v41::synth_v41`] writes it through the same tensor
//! generator and shard writer (`write_groups`); the DeepSeek-V4 entry points refuse it.
//!
//! Tensors: exactly `expected_inventory(cfg, format)` (with `fp8_compressors`, the compressor
//! and indexer linears as FP8 blocks + E8M0 scales), values from `values.rs`, stored bytes
//! produced by the `numerics::formats` encoders, so the reader decodes each quantised weight to
//! `dequant(quant(generated))` and each plain one to the generated value rounded to its dtype.
//! NVFP4 `input_scale` is written as 1.0 (it is ignored by every reader here).
//!
//! Files: one `model.safetensors`, or `shards` files `model-0000K-of-0000N.safetensors` plus
//! `model.safetensors.index.json`; shards are cut at logical-tensor bounds (a weight and its
//! scales share a shard) balancing payload bytes; then, if given, `tokenizer.json`, and
//! `config.json` last (a run cut short leaves no config, so the directory does not open as a
//! model). Stale files of ours from an earlier run in the same directory are removed
//! first. Writing streams: big plain tensors are generated and written in 1M-element pieces,
//! quantised ones a window of ~32M elements at a time (encoded in parallel, written in order),
//! so memory stays well under 1 GB even for `--preset flash` with all 256 experts.

pub mod planted;
pub mod tensors;
pub mod v41;

use crate::checkpoint::dtype::{Dtype, WeightFormat};
use crate::checkpoint::inventory::{
    expand, linear_storage, logical_inventory, CompressorKinds, ExpectedTensor, InventoryOptions,
    LinearStorage, LogicalTensor, StorageRules, FP4_GROUP,
};
use crate::checkpoint::reader::{INDEX_FILE, SINGLE_FILE};
use crate::checkpoint::writer::{assign_shards, shard_file_name, SafetensorsWriter};
use crate::checkpoint::CheckpointError;
use crate::config::{ModelConfig, QuantizationConfig};
use crate::numerics::formats::{
    f32_to_bf16_bytes, f32_to_f32_bytes, i64_to_bytes, quant_fp4_group, quant_fp8_block,
    quant_nvfp4,
};
use crate::numerics::rng::CHUNK;
use rayon::prelude::*;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Instant;
use tensors::{fill_f32, generate, GenParams, Values};

/// Which synthetic model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    Tiny,
    Flash,
    /// The demo model with a planted needle ([`planted`]).
    Planted,
    /// DeepSeek-V4.1 at toy size, every layer role of the release ([`v41`]); written by
    /// [`v41::synth_v41`], not [`synth`].
    V41Tiny,
}

impl Preset {
    /// The preset's name as `--preset` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Tiny => "tiny",
            Preset::Flash => "flash",
            Preset::Planted => "planted",
            Preset::V41Tiny => "v41-tiny",
        }
    }
}

impl FromStr for Preset {
    type Err = CheckpointError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "tiny" => Ok(Preset::Tiny),
            "flash" => Ok(Preset::Flash),
            "planted" => Ok(Preset::Planted),
            "v41-tiny" => Ok(Preset::V41Tiny),
            _ => Err(CheckpointError::SynthOption {
                field: "preset",
                expected: "one of tiny, planted, flash, v41-tiny".into(),
                found: format!("{s:?}"),
            }),
        }
    }
}

/// Everything `synth` needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SynthOptions {
    pub preset: Preset,
    pub format: WeightFormat,
    pub seed: u64,
    pub shards: usize,
    pub layers: Option<usize>,
    pub experts: Option<usize>,
    /// Store every compressor / indexer linear (`wkv`, `wgate`, `weights_proj`) as FP8 blocks
    /// + E8M0 scales instead of BF16, as a Flash-Base checkpoint is reported to.
    pub fp8_compressors: bool,
    pub out: PathBuf,
}

impl SynthOptions {
    /// Seed 0, one file, the preset's full layer and expert counts.
    pub fn new(preset: Preset, format: WeightFormat, out: impl Into<PathBuf>) -> Self {
        SynthOptions {
            preset,
            format,
            seed: 0,
            shards: 1,
            layers: None,
            experts: None,
            fp8_compressors: false,
            out: out.into(),
        }
    }
}

/// What `synth` wrote; `C` is the config of the family ([`ModelConfig`] for DeepSeek-V4,
/// [`crate::config::V41Config`] for [`v41::synth_v41`]).
#[derive(Clone, Debug)]
pub struct SynthSummary<C = ModelConfig> {
    pub dir: PathBuf,
    pub config: C,
    pub format: WeightFormat,
    pub tensors: usize,
    pub payload_bytes: u64,
    /// The safetensors files, in shard order.
    pub files: Vec<PathBuf>,
    pub seconds: f64,
}

impl<C> SynthSummary<C> {
    /// Payload throughput in MB/s (10^6 bytes).
    pub fn mb_per_s(&self) -> f64 {
        self.payload_bytes as f64 / 1e6 / self.seconds.max(1e-9)
    }
}

/// The config `synth` writes for `opts` (validated); for `planted`,
/// [`planted::planted_config`].
pub fn synth_config(opts: &SynthOptions) -> Result<ModelConfig, CheckpointError> {
    let mut cfg = match opts.preset {
        Preset::Tiny => ModelConfig::tiny(),
        Preset::Flash => ModelConfig::flash(),
        Preset::Planted => return planted::planted_config(opts.format, opts.layers, opts.experts),
        Preset::V41Tiny => return Err(v41::not_a_v4_preset()),
    };
    if let Some(n) = opts.layers {
        if n == 0 || n > cfg.num_hidden_layers {
            return Err(CheckpointError::SynthOption {
                field: "layers",
                expected: format!("1..={} for this preset", cfg.num_hidden_layers),
                found: n.to_string(),
            });
        }
        let mtp = cfg.compress_ratios[cfg.num_hidden_layers..].to_vec();
        cfg.compress_ratios.truncate(n);
        cfg.compress_ratios.extend(mtp);
        cfg.num_hidden_layers = n;
        cfg.num_hash_layers = cfg.num_hash_layers.min(n);
    }
    if let Some(e) = opts.experts {
        if e == 0 {
            return Err(CheckpointError::SynthOption {
                field: "experts",
                expected: "at least 1".into(),
                found: "0".into(),
            });
        }
        cfg.n_routed_experts = e;
        cfg.num_experts_per_tok = cfg.num_experts_per_tok.min(e);
    }
    set_weight_format(&mut cfg, opts.format);
    cfg.validate(Path::new("<synth config>"))?;
    Ok(cfg)
}

/// Sets the config keys a checkpoint of `format` carries: none for bf16; the official
/// `quantization_config` (fp8 e4m3, ue8m0, 128x128 blocks) and `expert_dtype: "fp4"` for the
/// official format; NVFP4 adds ModelOpt's `moe_quant_algo: "NVFP4"` to those, as NVIDIA's
/// export does.
pub fn set_weight_format(cfg: &mut ModelConfig, format: WeightFormat) {
    let (quantization, expert_dtype) = match format {
        WeightFormat::Bf16 => (None, None),
        WeightFormat::Official => (Some(QuantizationConfig::official()), Some("fp4")),
        WeightFormat::Nvfp4 => (Some(QuantizationConfig::nvfp4_experts()), Some("fp4")),
    };
    cfg.quantization_config = quantization;
    cfg.expert_dtype = expert_dtype.map(String::from);
}

/// One logical tensor and the stored tensors it becomes.
struct Group {
    lt: LogicalTensor,
    storage: Option<LinearStorage>,
    stored: Vec<ExpectedTensor>,
}

impl Group {
    fn bytes(&self) -> u64 {
        self.stored.iter().map(|t| t.bytes()).sum()
    }
    fn numel(&self) -> usize {
        self.lt.shape.iter().product()
    }
    /// Plain BF16/F32 tensors big enough to be written piece by piece.
    fn streamed(&self) -> bool {
        self.stored.len() == 1
            && matches!(self.stored[0].dtype, Dtype::BF16 | Dtype::F32)
            && self.numel() > STREAM_PIECE
    }
}

const STREAM_PIECE: usize = 256 * CHUNK;
const WINDOW_ELEMS: usize = 1 << 25;

/// The stored bytes of one group, in `stored` order.
fn encode(p: GenParams, seed: u64, g: &Group) -> Result<Vec<Vec<u8>>, CheckpointError> {
    let values = generate(p, seed, &g.lt);
    let x = match values {
        Values::I64(v) => return Ok(vec![i64_to_bytes(&v)]),
        Values::F32(x) => x,
    };
    let err = |source| CheckpointError::Encode {
        tensor: g.stored[0].name.clone(),
        source,
    };
    let (o, i) = (
        g.lt.shape.first().copied().unwrap_or(1),
        g.lt.shape.get(1).copied().unwrap_or(1),
    );
    Ok(match g.storage {
        None | Some(LinearStorage::Bf16) if g.stored[0].dtype == Dtype::F32 => {
            vec![f32_to_f32_bytes(&x)]
        }
        None | Some(LinearStorage::Bf16) => vec![f32_to_bf16_bytes(&x)],
        // One scale per `bi` columns of each row (DeepSeek-V4.1's Engram table): the square
        // encoder on one row at a time, whose block then covers that row only.
        Some(LinearStorage::Fp8Block { block: (1, bi) }) if bi > 1 => {
            let (mut w, mut s) = (Vec::with_capacity(o * i), Vec::new());
            for row in x.chunks(i.max(1)) {
                let (rw, rs) = quant_fp8_block(row, 1, i, bi).map_err(err)?;
                w.extend(rw);
                s.extend(rs);
            }
            vec![w, s]
        }
        Some(LinearStorage::Fp8Block { block: (bo, bi) }) => {
            if bo != bi {
                return Err(CheckpointError::NotImplemented {
                    what: format!("synth of non-square FP8 blocks {bo}x{bi}"),
                });
            }
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

/// Writes a big plain tensor in pieces.
fn write_streamed(
    p: GenParams,
    seed: u64,
    g: &Group,
    w: &mut SafetensorsWriter,
) -> Result<(), CheckpointError> {
    let t = &g.stored[0];
    let n = g.numel();
    let mut buf = vec![0.0f32; STREAM_PIECE];
    let mut start = 0;
    while start < n {
        let len = STREAM_PIECE.min(n - start);
        fill_f32(p, seed, &g.lt, start, &mut buf[..len]);
        let bytes = if t.dtype == Dtype::F32 {
            f32_to_f32_bytes(&buf[..len])
        } else {
            f32_to_bf16_bytes(&buf[..len])
        };
        w.write(&t.name, &bytes)?;
        start += len;
    }
    Ok(())
}

/// Writes the synthetic checkpoint described by `opts` (and `tokenizer.json` if given).
/// `planted` is [`planted::synth_planted`] at its default margin: it always writes the
/// built-in tokenizer, so it takes no `tokenizer_json`, and its compressors hold exact BF16
/// values, so it takes no `fp8_compressors`.
pub fn synth(
    opts: &SynthOptions,
    tokenizer_json: Option<&[u8]>,
) -> Result<SynthSummary, CheckpointError> {
    synth_with_progress(opts, tokenizer_json, &mut |_, _| {})
}

/// [`synth`], calling `written(bytes, total)` as the tensors' payload is written (after each
/// tensor or window of small ones; `total` is the whole payload), for a progress bar: a full
/// Flash checkpoint is 160 GB. A `planted` model (a few MB) reports no progress.
pub fn synth_with_progress(
    opts: &SynthOptions,
    tokenizer_json: Option<&[u8]>,
    written: &mut dyn FnMut(u64, u64),
) -> Result<SynthSummary, CheckpointError> {
    if opts.preset == Preset::V41Tiny {
        return Err(v41::not_a_v4_preset());
    }
    if opts.preset == Preset::Planted {
        let refuse = |field, expected: &str, found: &str| CheckpointError::SynthOption {
            field,
            expected: expected.into(),
            found: found.into(),
        };
        if tokenizer_json.is_some() {
            return Err(refuse(
                "tokenizer",
                "none for planted (it writes the built-in tokenizer)",
                "a tokenizer.json",
            ));
        }
        if opts.fp8_compressors {
            return Err(refuse(
                "fp8_compressors",
                "false for planted (its compressors hold exact BF16 values)",
                "true",
            ));
        }
        return planted::synth_planted(opts, None);
    }
    let cfg = synth_config(opts)?;
    write_synth(cfg, opts, tokenizer_json, written)
}

/// [`synth`] of an architecture of the caller's instead of `opts.preset`'s (tests size models
/// freely with it, e.g. Flash's proportions at small dimensions): `cfg` as given except for the
/// weight-format keys of `opts.format` ([`set_weight_format`]); `opts.layers` and
/// `opts.experts` are ignored. The config must validate.
pub fn synth_with_config(
    mut cfg: ModelConfig,
    opts: &SynthOptions,
) -> Result<SynthSummary, CheckpointError> {
    set_weight_format(&mut cfg, opts.format);
    cfg.validate(Path::new("<synth config>"))?;
    write_synth(cfg, opts, None, &mut |_, _| {})
}

/// Writes the checkpoint of `cfg` (validated) as `opts` says.
fn write_synth(
    cfg: ModelConfig,
    opts: &SynthOptions,
    tokenizer_json: Option<&[u8]>,
    written: &mut dyn FnMut(u64, u64),
) -> Result<SynthSummary, CheckpointError> {
    let t0 = Instant::now();
    let inv_opts = InventoryOptions {
        fp8_compressor_linears: if opts.fp8_compressors {
            CompressorKinds::ALL
        } else {
            CompressorKinds::NONE
        },
        ..opts.format.into()
    };
    let groups = groups(logical_inventory(&cfg), StorageRules::from(&cfg), inv_opts);
    let w = write_groups(
        &groups,
        GenParams::from(&cfg),
        opts,
        tokenizer_json,
        &cfg.to_json_string(),
        written,
    )?;
    Ok(SynthSummary {
        dir: opts.out.clone(),
        format: opts.format,
        tensors: w.tensors,
        payload_bytes: w.payload_bytes,
        files: w.files,
        seconds: t0.elapsed().as_secs_f64(),
        config: cfg,
    })
}

/// The logical tensors of a family's inventory with their storage under `rules` and `opts`.
fn groups(logical: Vec<LogicalTensor>, rules: StorageRules, opts: InventoryOptions) -> Vec<Group> {
    logical
        .into_iter()
        .map(|lt| Group {
            storage: linear_storage(rules, opts, lt.role),
            stored: expand(rules, opts, &lt),
            lt,
        })
        .collect()
}

/// What [`write_groups`] wrote.
struct Written {
    tensors: usize,
    payload_bytes: u64,
    files: Vec<PathBuf>,
}

/// Writes `groups` (values from `params` and `opts.seed`) into `opts.out` in `opts.shards`
/// files, then the shard index, `tokenizer_json` if given and `config_text` as `config.json`,
/// last (module doc). Shared by every family.
fn write_groups(
    groups: &[Group],
    params: GenParams,
    opts: &SynthOptions,
    tokenizer_json: Option<&[u8]>,
    config_text: &str,
    written: &mut dyn FnMut(u64, u64),
) -> Result<Written, CheckpointError> {
    if opts.shards == 0 || opts.shards > groups.len() {
        return Err(CheckpointError::SynthOption {
            field: "shards",
            expected: format!("1..={} for this config", groups.len()),
            found: opts.shards.to_string(),
        });
    }
    let dir = &opts.out;
    claim_out_dir(dir, opts.preset.name())?;
    let n = opts.shards;
    let sizes: Vec<u64> = groups.iter().map(|g| g.bytes()).collect();
    let (total, mut done) = (sizes.iter().sum::<u64>(), 0u64);
    let shard_of = assign_shards(&sizes, n);
    let file_name = |s: usize| shard_file_name(s, n);
    let metadata = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    let mut files = Vec::with_capacity(n);
    let mut weight_map = serde_json::Map::new();
    let mut gi = 0;
    for s in 0..n {
        let end = shard_of.iter().rposition(|&x| x == s).map_or(gi, |e| e + 1);
        let members = &groups[gi..end];
        let specs: Vec<ExpectedTensor> = members.iter().flat_map(|g| g.stored.clone()).collect();
        for t in &specs {
            weight_map.insert(t.name.clone(), file_name(s).into());
        }
        let path = dir.join(file_name(s));
        let mut w = SafetensorsWriter::create(&path, specs, &metadata)?;
        let mut k = 0;
        while k < members.len() {
            if members[k].streamed() {
                write_streamed(params, opts.seed, &members[k], &mut w)?;
                done += members[k].bytes();
                written(done, total);
                k += 1;
                continue;
            }
            let mut j = k;
            let mut elems = 0;
            while j < members.len() && !members[j].streamed() && (j == k || elems < WINDOW_ELEMS) {
                elems += members[j].numel();
                j += 1;
            }
            let encoded: Vec<_> = members[k..j]
                .par_iter()
                .map(|g| encode(params, opts.seed, g))
                .collect();
            for (g, bytes) in members[k..j].iter().zip(encoded) {
                for (t, b) in g.stored.iter().zip(bytes?) {
                    w.write(&t.name, &b)?;
                }
                done += g.bytes();
            }
            written(done, total);
            k = j;
        }
        files.push(w.finish()?);
        gi = end;
    }
    let payload_bytes: u64 = groups.iter().map(|g| g.bytes()).sum();
    if n > 1 {
        let index = serde_json::json!({
            "metadata": {"total_size": payload_bytes},
            "weight_map": weight_map,
        });
        write_file(
            &dir.join(INDEX_FILE),
            serde_json::to_string_pretty(&index)
                .expect("json")
                .as_bytes(),
        )?;
    }
    if let Some(tok) = tokenizer_json {
        write_file(&dir.join("tokenizer.json"), tok)?;
    }
    // Last: a directory without config.json is visibly unfinished (a failed or stopped run).
    write_file(&dir.join("config.json"), config_text.as_bytes())?;
    Ok(Written {
        tensors: groups.iter().map(|g| g.stored.len()).sum(),
        payload_bytes,
        files,
    })
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    std::fs::write(path, bytes).map_err(|e| CheckpointError::io(path, e))
}

/// Test helper: the tiny bf16 checkpoint in a fresh temporary directory, opened (keep the
/// directory alive as long as the checkpoint).
#[cfg(test)]
pub(crate) fn tiny_for_tests() -> (tempfile::TempDir, crate::checkpoint::Checkpoint) {
    let dir = tempfile::tempdir().expect("tempdir");
    synth(
        &SynthOptions::new(Preset::Tiny, WeightFormat::Bf16, dir.path()),
        None,
    )
    .expect("synth writes the tiny checkpoint");
    let ckpt = crate::checkpoint::Checkpoint::open(dir.path()).expect("the tiny checkpoint opens");
    (dir, ckpt)
}

// ---------------------------------------------------------------------------------------------
// The directories synth writes into: the mark that makes a directory synth's own (and the
// model synthetic in every report), and the rule that a directory holding a checkpoint synth
// did not write is refused untouched, so a wrong `--out` can never delete a user's weights.

/// The file `synth` writes first into every directory it fills: it marks the checkpoint as
/// synthetic (reports say so; see `run::target::model_marks`) and the directory as synth's own, so a
/// later synth run may replace its files ([`claim_out_dir`]).
pub const SYNTH_MARK_FILE: &str = "synth.json";

/// Makes `dir` ready for a synth run of `preset`: creates it; refuses it when it is not empty
/// and synth did not write it (no [`SYNTH_MARK_FILE`], no `planted.json`), naming checkpoint
/// files (`config.json`, `*.safetensors`, the shard index) first, so a wrong `--out` can never
/// delete a user's downloaded weights or write into their report directory; writes the mark (before any weight, so a run cut short still leaves a
/// directory synth may rewrite); removes what an earlier synth run left (`remove_stale`).
pub fn claim_out_dir(dir: &Path, preset: &str) -> Result<(), CheckpointError> {
    if dir.exists() && !dir.is_dir() {
        return Err(CheckpointError::SynthOption {
            field: "out",
            expected: "a directory (new, empty, or one synth wrote)".into(),
            found: format!("{}, which is a file", dir.display()),
        });
    }
    std::fs::create_dir_all(dir).map_err(|e| CheckpointError::io(dir, e))?;
    let ours = dir.join(SYNTH_MARK_FILE).is_file() || dir.join(planted::INFO_FILE).is_file();
    if !ours {
        let mut checkpoint = Vec::new();
        let mut other = Vec::new();
        let rd = std::fs::read_dir(dir).map_err(|e| CheckpointError::io(dir, e))?;
        for entry in rd {
            let name = entry.map_err(|e| CheckpointError::io(dir, e))?.file_name();
            let name = name.to_string_lossy().into_owned();
            if name == "config.json" || name == INDEX_FILE || name.ends_with(".safetensors") {
                checkpoint.push(name);
            } else {
                other.push(name);
            }
        }
        let listed = |mut found: Vec<String>| {
            found.sort();
            let more = found.len().saturating_sub(3);
            found.truncate(3);
            if more > 0 {
                format!("{} and {more} more", found.join(", "))
            } else {
                found.join(", ")
            }
        };
        if !checkpoint.is_empty() {
            return Err(CheckpointError::ForeignOutDir {
                dir: dir.to_path_buf(),
                files: listed(checkpoint),
            });
        }
        // Any other file (a report directory, say) is the user's too: never written into.
        if !other.is_empty() {
            return Err(CheckpointError::NotEmptyOutDir {
                dir: dir.to_path_buf(),
                files: listed(other),
            });
        }
    }
    write_synth_mark(dir, preset)?;
    remove_stale(dir)
}

/// Writes [`SYNTH_MARK_FILE`] into `dir` for `preset`. [`claim_out_dir`] does it for every
/// synth run; the demo also does it for its own model cache (a directory name only needlescope
/// uses), so a cache an older version left half written, without the mark, is rebuilt.
pub fn write_synth_mark(dir: &Path, preset: &str) -> Result<(), CheckpointError> {
    let mark = json!({
        "synthetic": true,
        "written_by": format!("needlescope {} synth", env!("CARGO_PKG_VERSION")),
        "preset": preset,
    });
    let text = serde_json::to_string_pretty(&mark).expect("json") + "\n";
    let path = dir.join(SYNTH_MARK_FILE);
    std::fs::write(&path, text).map_err(|e| CheckpointError::io(&path, e))
}

/// Removes files an earlier synth run may have left: shards, the index, `config.json` (written
/// last, so a run that fails or is stopped leaves a directory that does not open as a model),
/// `planted.json` (a planted model's description, which would otherwise mark the new model as
/// planted) and a `tokenizer.json` that is byte for byte the built-in one synth copies (a
/// user's own tokenizer stays).
fn remove_stale(dir: &Path) -> Result<(), CheckpointError> {
    let rd = std::fs::read_dir(dir).map_err(|e| CheckpointError::io(dir, e))?;
    for entry in rd {
        let path = entry.map_err(|e| CheckpointError::io(dir, e))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let ours = match name {
            // The old model's config: written last by every run, so until the new run
            // finishes the directory has none and does not open as a model (the old config
            // beside new, half-written weights would).
            planted::INFO_FILE | "config.json" => true,
            "tokenizer.json" => {
                std::fs::read(&path).is_ok_and(|b| b == crate::tokenizer::builtin_json_bytes())
            }
            _ => false,
        };
        if ours && path.is_file() {
            std::fs::remove_file(&path).map_err(|e| CheckpointError::io(&path, e))?;
            continue;
        }
        let shard_like = name.len() == "model-00001-of-00001.safetensors".len()
            && name.starts_with("model-")
            && name.ends_with(".safetensors")
            && name[6..11].bytes().all(|b| b.is_ascii_digit())
            && &name[11..15] == "-of-"
            && name[15..20].bytes().all(|b| b.is_ascii_digit());
        if path.is_file() && (shard_like || name == SINGLE_FILE || name == INDEX_FILE) {
            std::fs::remove_file(&path).map_err(|e| CheckpointError::io(&path, e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_and_experts_options_shape_the_config() {
        let mut o = SynthOptions::new(Preset::Flash, WeightFormat::Official, "x");
        o.layers = Some(4);
        o.experts = Some(16);
        let c = synth_config(&o).unwrap();
        assert_eq!(c.num_hidden_layers, 4);
        assert_eq!(c.compress_ratios, vec![0, 0, 4, 128, 0]);
        assert_eq!(c.num_hash_layers, 3);
        assert_eq!((c.n_routed_experts, c.num_experts_per_tok), (16, 6));
        assert!(c.is_fp8() && c.experts_fp4());
        o.format = WeightFormat::Bf16;
        o.experts = Some(4);
        let c = synth_config(&o).unwrap();
        assert!(!c.is_fp8() && c.expert_dtype.is_none());
        assert_eq!(c.num_experts_per_tok, 4);
    }

    #[test]
    fn zero_layers_is_a_clear_error() {
        let mut o = SynthOptions::new(Preset::Tiny, WeightFormat::Bf16, "x");
        o.layers = Some(0);
        let msg = synth_config(&o).unwrap_err().to_string();
        assert!(
            msg.contains("layers") && msg.contains("1..=4") && msg.contains("found 0"),
            "{msg}"
        );
    }

    /// `--preset planted` is the planted model's own config, `--layers` and `--experts`
    /// shaping it as they shape tiny's and flash's, never tiny's or flash's config.
    #[test]
    fn planted_config_is_the_planted_models() {
        let mut o = SynthOptions::new(Preset::Planted, WeightFormat::Official, "x");
        let c = synth_config(&o).unwrap();
        assert_eq!(
            c,
            planted::planted_config(WeightFormat::Official, None, None).unwrap()
        );
        assert_eq!(c.compress_ratios, vec![0, 4, 128, 4]);
        assert_eq!(c.hidden_size, 64);
        assert!(c.is_fp8() && c.experts_fp4());
        o.layers = Some(6);
        o.experts = Some(2);
        let c = synth_config(&o).unwrap();
        assert_eq!(c.compress_ratios, vec![0, 4, 128, 4, 128, 4]);
        assert_eq!(c.n_routed_experts, 2);
        o.layers = Some(0);
        let msg = synth_config(&o).unwrap_err().to_string();
        assert!(msg.contains("layers") && msg.contains("found 0"), "{msg}");
    }

    /// The options the planted model cannot honour are refused before anything is written.
    #[test]
    fn planted_refuses_a_tokenizer_and_fp8_compressors() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("m");
        let mut o = SynthOptions::new(Preset::Planted, WeightFormat::Bf16, &out);
        let msg = synth(&o, Some(b"{}")).unwrap_err().to_string();
        assert!(
            msg.contains("tokenizer") && msg.contains("planted"),
            "{msg}"
        );
        o.fp8_compressors = true;
        let msg = synth(&o, None).unwrap_err().to_string();
        assert!(
            msg.contains("fp8_compressors") && msg.contains("planted"),
            "{msg}"
        );
        assert!(!out.exists());
    }
}
