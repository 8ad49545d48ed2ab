//! [`Checkpoint`]: a model directory opened for reading, shards memory-mapped, nothing read
//! eagerly beyond the JSON headers (the official release is 160 GB in 46 shards).
//!
//! Which files: `model.safetensors.index.json` if present (its `weight_map` names the shard of
//! every tensor; each named shard must exist and contain the tensors mapped to it), else
//! `model.safetensors`, else every `*.safetensors` in the directory (sorted). A tensor found in
//! two shards is an error. `config.json` is read and validated by the family's loader
//! ([`CheckpointConfig::load`]): [`Checkpoint::open`] reads a DeepSeek-V4 checkpoint (and
//! refuses a V4.1 one by name), [`Checkpoint::open_v41`] a DeepSeek-V4.1 one; everything else
//! here is the same for both families.
//!
//! The [`WeightFormat`] is detected from the tensors: any `*.weight_scale_2` means NVFP4; else
//! any F8_E4M3 or I8 tensor means the official FP8/FP4 format; else bf16.
//!
//! Typed readers copy out of the mmap: `f32_tensor` (BF16, F16, F32, F64 -> f32) and
//! `i64_tensor` (I64, I32 -> i64), each checking the caller's expected shape. `raw_bytes` is the
//! zero-copy view. Linears go through [`Checkpoint::linear`] (borrowing the mmap) or
//! [`Checkpoint::shared_linear`] (sharing it, for weights decoded on use; see `linear.rs`).

use super::dtype::{Dtype, WeightFormat};
use super::header::parse_header;
use super::inventory::{
    expected_inventory_with, CompressorKinds, CompressorLinear, ExpectedTensor, InventoryOptions,
    LogicalTensor,
};
use super::CheckpointError;
use crate::checkpoint::inventory_v41::{expected_inventory_v41, logical_inventory_v41};
use crate::config::{ConfigError, ModelConfig, V41Config};
use crate::numerics::formats::{
    bf16_bytes_to_f32, f32_bytes_to_f32, i32_bytes_to_i32, i64_bytes_to_i64,
};
use memmap2::Mmap;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// Where one tensor lives and what it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub file: PathBuf,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Absolute byte range in `file`.
    pub data_offsets: Range<usize>,
    pub(crate) shard: usize,
}

struct Shard {
    /// Shared so that weights handed out by [`Checkpoint::shared_linear`] keep the map alive
    /// after the `Checkpoint` is dropped (an engine decoding weights on use).
    mmap: Arc<Mmap>,
}

/// What a checkpoint needs from its family's model description: how to load it, the inventory
/// it implies and the block of its FP8 linears.
pub trait CheckpointConfig: Sized {
    /// Reads and validates `config.json`.
    fn load(path: &Path) -> Result<Self, ConfigError>;
    /// The format-free tensor list the config implies.
    fn logical_inventory(&self) -> Vec<LogicalTensor>;
    /// Every stored tensor the config implies under `opts`.
    fn expected_inventory(&self, opts: InventoryOptions) -> Vec<ExpectedTensor>;
    /// `quantization_config.weight_block_size`.
    fn weight_block(&self) -> (usize, usize);
    /// Main (backbone) layers.
    fn main_layers(&self) -> usize;
}

impl CheckpointConfig for ModelConfig {
    fn load(path: &Path) -> Result<Self, ConfigError> {
        ModelConfig::load(path)
    }
    fn logical_inventory(&self) -> Vec<LogicalTensor> {
        super::inventory::logical_inventory(self)
    }
    fn expected_inventory(&self, opts: InventoryOptions) -> Vec<ExpectedTensor> {
        expected_inventory_with(self, opts)
    }
    fn weight_block(&self) -> (usize, usize) {
        ModelConfig::weight_block(self)
    }
    fn main_layers(&self) -> usize {
        self.num_hidden_layers
    }
}

impl CheckpointConfig for V41Config {
    fn load(path: &Path) -> Result<Self, ConfigError> {
        V41Config::load(path)
    }
    fn logical_inventory(&self) -> Vec<LogicalTensor> {
        logical_inventory_v41(self)
    }
    fn expected_inventory(&self, opts: InventoryOptions) -> Vec<ExpectedTensor> {
        expected_inventory_v41(self, opts)
    }
    fn weight_block(&self) -> (usize, usize) {
        crate::checkpoint::inventory::StorageRules::from(self).block
    }
    fn main_layers(&self) -> usize {
        self.text.num_hidden_layers
    }
}

/// An opened checkpoint directory of a DeepSeek-V4 model (`C` = [`ModelConfig`]) or a
/// DeepSeek-V4.1 one (`C` = [`V41Config`]).
pub struct Checkpoint<C = ModelConfig> {
    dir: PathBuf,
    config: C,
    shard_paths: Vec<PathBuf>,
    shards: Vec<Shard>,
    tensors: BTreeMap<String, TensorInfo>,
    format: WeightFormat,
    expected: OnceLock<HashMap<String, ExpectedTensor>>,
    /// Tensors a shard holds that index.json's `weight_map` does not list (see
    /// [`Checkpoint::unindexed`]).
    unindexed: Vec<String>,
}

/// Windows of each shard read by [`Checkpoint::fingerprint`].
pub const FINGERPRINT_SAMPLES: usize = 17;

pub const INDEX_FILE: &str = "model.safetensors.index.json";
pub const SINGLE_FILE: &str = "model.safetensors";

impl Checkpoint {
    /// Opens a DeepSeek-V4 checkpoint `dir`: config, shard list, mmaps and headers (see the
    /// module doc). A DeepSeek-V4.1 config is refused by name ([`Checkpoint::open_v41`]).
    pub fn open(dir: &Path) -> Result<Checkpoint, CheckpointError> {
        Checkpoint::open_as(dir)
    }
}

impl Checkpoint<V41Config> {
    /// Opens a DeepSeek-V4.1 checkpoint `dir` (a DeepSeek-V4 config is refused by name).
    pub fn open_v41(dir: &Path) -> Result<Checkpoint<V41Config>, CheckpointError> {
        Checkpoint::open_as(dir)
    }
}

impl<C: CheckpointConfig> Checkpoint<C> {
    /// The inventory options that match what this checkpoint holds: its format, for NVFP4 whether the MTP
    /// experts were re-quantised too, and which compressor / indexer linear kinds are stored as
    /// FP8 (a kind counts as FP8 when any of its weights is F8_E4M3; every layer is then expected
    /// so, and a layer storing it otherwise shows as a mismatch).
    pub fn inventory_options(&self) -> InventoryOptions {
        let format = self.format();
        let mtp_experts_nvfp4 = format == WeightFormat::Nvfp4
            && self.names().any(|n| {
                n.starts_with("mtp.") && n.contains(".experts.") && n.ends_with(".weight_scale_2")
            });
        let mut fp8_compressor_linears = CompressorKinds::NONE;
        for name in self.names() {
            if let Some(kind) = CompressorLinear::of_weight(name) {
                if self.info(name).is_some_and(|t| t.dtype == Dtype::F8E4M3) {
                    fp8_compressor_linears.insert(kind);
                }
            }
        }
        InventoryOptions {
            format,
            mtp_experts_nvfp4,
            fp8_compressor_linears,
        }
    }

    /// Opens `dir` with `C`'s config loader.
    fn open_as(dir: &Path) -> Result<Checkpoint<C>, CheckpointError> {
        if dir.is_file() {
            return Err(CheckpointError::NotADirectory(dir.to_path_buf()));
        }
        let config = C::load(&dir.join("config.json"))?;
        let index_path = dir.join(INDEX_FILE);
        let (files, weight_map) = if index_path.is_file() {
            let wm = read_index(&index_path)?;
            let mut files: Vec<String> = wm.values().cloned().collect();
            files.sort();
            files.dedup();
            for f in &files {
                if !dir.join(f).is_file() {
                    let tensor = wm.iter().find(|(_, v)| *v == f).map(|(k, _)| k.clone());
                    return Err(CheckpointError::MissingShard {
                        index: index_path,
                        dir: dir.to_path_buf(),
                        shard: f.clone(),
                        tensor: tensor.unwrap_or_default(),
                    });
                }
            }
            (files.iter().map(|f| dir.join(f)).collect(), Some(wm))
        } else if dir.join(SINGLE_FILE).is_file() {
            // Other weight files beside it would be ignored silently: refuse the ambiguity.
            let others: Vec<String> = list_safetensors(dir)?
                .iter()
                .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .filter(|n| n != SINGLE_FILE)
                .collect();
            if !others.is_empty() {
                return Err(CheckpointError::AmbiguousWeights {
                    dir: dir.to_path_buf(),
                    others,
                });
            }
            (vec![dir.join(SINGLE_FILE)], None)
        } else {
            (list_safetensors(dir)?, None)
        };
        let mut ckpt = Checkpoint {
            dir: dir.to_path_buf(),
            config,
            shard_paths: Vec::new(),
            shards: Vec::new(),
            tensors: BTreeMap::new(),
            format: WeightFormat::Bf16,
            expected: OnceLock::new(),
            unindexed: Vec::new(),
        };
        for path in files {
            ckpt.add_shard(path)?;
        }
        if let Some(wm) = weight_map {
            ckpt.unindexed = ckpt
                .tensors
                .keys()
                .filter(|name| !wm.contains_key(*name))
                .cloned()
                .collect();
            for (tensor, shard) in wm {
                let shard_path = dir.join(&shard);
                if ckpt.tensors.get(&tensor).map(|t| &t.file) != Some(&shard_path) {
                    return Err(CheckpointError::NotInShard {
                        index: index_path,
                        shard: shard_path,
                        tensor,
                    });
                }
            }
        }
        ckpt.format = detect_format(&ckpt.tensors);
        Ok(ckpt)
    }

    fn add_shard(&mut self, path: PathBuf) -> Result<(), CheckpointError> {
        let file = File::open(&path).map_err(|e| CheckpointError::io(&path, e))?;
        let file_len = file
            .metadata()
            .map_err(|e| CheckpointError::io(&path, e))?
            .len();
        if file_len < 8 {
            return Err(CheckpointError::TooShort {
                file: path,
                file_len,
            });
        }
        // SAFETY: the map is read-only and lives as long as `self`. Like every mmap-based
        // loader we rely on nobody truncating or rewriting the checkpoint while it is open.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| CheckpointError::io(&path, e))?;
        let header = parse_header(&path, &mmap)?;
        let shard = self.shards.len();
        for e in header.entries {
            if let Some(prev) = self.tensors.get(&e.name) {
                return Err(CheckpointError::DuplicateTensor {
                    tensor: e.name,
                    first: prev.file.clone(),
                    second: path,
                });
            }
            let info = TensorInfo {
                name: e.name.clone(),
                file: path.clone(),
                dtype: e.dtype,
                shape: e.shape,
                data_offsets: e.data_offsets,
                shard,
            };
            self.tensors.insert(e.name, info);
        }
        self.shards.push(Shard {
            mmap: Arc::new(mmap),
        });
        self.shard_paths.push(path);
        Ok(())
    }

    pub fn config(&self) -> &C {
        &self.config
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The shard files, in the order they were opened.
    pub fn shard_paths(&self) -> &[PathBuf] {
        &self.shard_paths
    }

    /// Tensors present in a shard but not listed in index.json's `weight_map` (a stale or
    /// hand-edited index), in name order. They are read like listed ones, as serving engines
    /// do (they load every tensor of the shard files the index names); runs print a note and
    /// `inspect` lists them. Empty without an index file.
    pub fn unindexed(&self) -> &[String] {
        &self.unindexed
    }

    /// `sha256:<hex>` identifying the weights cheaply, without reading them all (a resumed
    /// sweep must run on the same model, not just one with the same config): per shard in
    /// order, its file name, length, safetensors header, and [`FINGERPRINT_SAMPLES`] windows of
    /// 4 KiB spread evenly over the file. Two checkpoints with different weights differ in
    /// practically every window; a copy or a move of the directory keeps the fingerprint.
    pub fn fingerprint(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        for (path, shard) in self.shard_paths.iter().zip(&self.shards) {
            let bytes: &[u8] = &shard.mmap;
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            h.update(name.unwrap_or_default().as_bytes());
            h.update((bytes.len() as u64).to_le_bytes());
            let header_len = bytes
                .get(..8)
                .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()) as usize);
            h.update(&bytes[..(8 + header_len).min(bytes.len())]);
            const WINDOW: usize = 4096;
            for i in 0..FINGERPRINT_SAMPLES {
                let start = bytes.len().saturating_sub(WINDOW) * i / (FINGERPRINT_SAMPLES - 1);
                h.update(&bytes[start..(start + WINDOW).min(bytes.len())]);
            }
        }
        let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        format!("sha256:{hex}")
    }

    /// Tensor names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(|s| s.as_str())
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Sum of all tensors' payload bytes.
    pub fn payload_bytes(&self) -> u64 {
        self.tensors
            .values()
            .map(|t| t.data_offsets.len() as u64)
            .sum()
    }

    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(name)
    }

    pub fn format(&self) -> WeightFormat {
        self.format
    }

    /// The tensor `name` or an error naming the directory and the tensor.
    pub fn require(&self, name: &str) -> Result<&TensorInfo, CheckpointError> {
        self.info(name)
            .ok_or_else(|| CheckpointError::MissingTensor {
                dir: self.dir.clone(),
                tensor: name.to_string(),
            })
    }

    /// The stored bytes of `name`, borrowed from the mmap.
    pub fn raw_bytes(&self, name: &str) -> Result<&[u8], CheckpointError> {
        Ok(self.bytes_of(self.require(name)?))
    }

    /// The memory map of the shard holding `info` (shared, see [`Checkpoint::shared_linear`]).
    pub(crate) fn shard_map(&self, info: &TensorInfo) -> &Arc<Mmap> {
        &self.shards[info.shard].mmap
    }

    pub(crate) fn bytes_of(&self, info: &TensorInfo) -> &[u8] {
        // Offsets were checked against this shard's length by `parse_header`.
        &self.shards[info.shard].mmap[info.data_offsets.clone()]
    }

    /// The expected tensor of this name under the checkpoint's config and format, if any.
    pub(crate) fn expected(&self, name: &str) -> Option<&ExpectedTensor> {
        self.expected
            .get_or_init(|| {
                self.config
                    .expected_inventory(self.inventory_options())
                    .into_iter()
                    .map(|t| (t.name.clone(), t))
                    .collect()
            })
            .get(name)
    }

    /// Checks that `info` has `expected` shape; `why` is appended to the expectation.
    pub(crate) fn check_shape(
        &self,
        info: &TensorInfo,
        expected: &[usize],
        why: &str,
    ) -> Result<(), CheckpointError> {
        if info.shape == expected {
            return Ok(());
        }
        Err(CheckpointError::WrongShape {
            file: info.file.clone(),
            tensor: info.name.clone(),
            expected: expected.to_vec(),
            found: info.shape.clone(),
            why: why.to_string(),
        })
    }

    /// A BF16, F16, F32 or F64 tensor as f32, after checking its shape.
    pub fn f32_tensor(
        &self,
        name: &str,
        expected_shape: &[usize],
    ) -> Result<Vec<f32>, CheckpointError> {
        let info = self.require(name)?;
        self.check_shape(info, expected_shape, "")?;
        let bytes = self.bytes_of(info);
        let decode = |r: Result<Vec<f32>, _>| {
            r.map_err(|source| CheckpointError::Decode {
                tensor: name.to_string(),
                source,
            })
        };
        match info.dtype {
            Dtype::BF16 => decode(bf16_bytes_to_f32(bytes)),
            Dtype::F32 => decode(f32_bytes_to_f32(bytes)),
            Dtype::F16 => Ok(bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect()),
            Dtype::F64 => Ok(bytes
                .chunks_exact(8)
                .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")) as f32)
                .collect()),
            found => Err(wrong_dtype(info, "BF16, F16, F32 or F64", found)),
        }
    }

    /// An I64 or I32 tensor as i64, after checking its shape.
    pub fn i64_tensor(
        &self,
        name: &str,
        expected_shape: &[usize],
    ) -> Result<Vec<i64>, CheckpointError> {
        let info = self.require(name)?;
        self.check_shape(info, expected_shape, "")?;
        let bytes = self.bytes_of(info);
        let r = match info.dtype {
            Dtype::I64 => i64_bytes_to_i64(bytes),
            Dtype::I32 => i32_bytes_to_i32(bytes).map(|v| v.into_iter().map(i64::from).collect()),
            found => return Err(wrong_dtype(info, "I64 or I32", found)),
        };
        r.map_err(|source| CheckpointError::Decode {
            tensor: name.to_string(),
            source,
        })
    }
}

pub(crate) fn wrong_dtype(info: &TensorInfo, expected: &str, found: Dtype) -> CheckpointError {
    CheckpointError::WrongDtype {
        file: info.file.clone(),
        tensor: info.name.clone(),
        expected: expected.to_string(),
        found,
    }
}

fn detect_format(tensors: &BTreeMap<String, TensorInfo>) -> WeightFormat {
    if tensors.keys().any(|n| n.ends_with(".weight_scale_2")) {
        WeightFormat::Nvfp4
    } else if tensors.values().any(|t| {
        // FP8 compressor / indexer linears are a per-kind storage choice, not the format.
        (t.dtype == Dtype::F8E4M3 && CompressorLinear::of_weight(&t.name).is_none())
            || t.dtype == Dtype::I8
    }) {
        WeightFormat::Official
    } else {
        WeightFormat::Bf16
    }
}

/// Reads `weight_map` (tensor -> shard file name) of an index file.
fn read_index(path: &Path) -> Result<BTreeMap<String, String>, CheckpointError> {
    let text = std::fs::read_to_string(path).map_err(|e| CheckpointError::io(path, e))?;
    let bad = |expected: &str, found: String| CheckpointError::IndexFormat {
        index: path.to_path_buf(),
        expected: expected.to_string(),
        found,
    };
    let v: Value = serde_json::from_str(&text).map_err(|e| {
        bad(
            "a JSON object with a \"weight_map\"",
            format!("invalid JSON ({e})"),
        )
    })?;
    let Some(Value::Object(wm)) = v.get("weight_map") else {
        return Err(bad(
            "a \"weight_map\" object mapping tensor names to shard files",
            match v.get("weight_map") {
                None => "no \"weight_map\" key".into(),
                Some(other) => format!("\"weight_map\": {other}"),
            },
        ));
    };
    if wm.is_empty() {
        return Err(bad(
            "a \"weight_map\" naming at least one tensor",
            "an empty \"weight_map\"".into(),
        ));
    }
    wm.iter()
        .map(|(k, v)| match v {
            // A shard is a plain file name beside the index: no directory part, so an index
            // can never make the reader open a file outside the checkpoint directory.
            Value::String(s) if !is_plain_file_name(s) => Err(bad(
                "shard file names beside the index (no directory part, no ..)",
                format!("{k}: {s:?}"),
            )),
            Value::String(s) => Ok((k.clone(), s.clone())),
            other => Err(bad(
                "shard file names as strings in \"weight_map\"",
                format!("{k}: {other}"),
            )),
        })
        .collect()
}

/// A file name with no directory part (`model-00001-of-00046.safetensors`).
fn is_plain_file_name(name: &str) -> bool {
    let path = Path::new(name);
    !name.is_empty()
        && path.file_name().is_some_and(|f| f == path.as_os_str())
        && name != "."
        && name != ".."
}

/// Every `*.safetensors` file in `dir`, sorted; an error if there is none.
fn list_safetensors(dir: &Path) -> Result<Vec<PathBuf>, CheckpointError> {
    let rd = std::fs::read_dir(dir).map_err(|e| CheckpointError::io(dir, e))?;
    let mut files = Vec::new();
    for entry in rd {
        let p = entry.map_err(|e| CheckpointError::io(dir, e))?.path();
        if p.is_file() && p.extension().is_some_and(|x| x == "safetensors") {
            files.push(p);
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(CheckpointError::NoWeights {
            dir: dir.to_path_buf(),
        });
    }
    Ok(files)
}
