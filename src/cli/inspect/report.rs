//! The record `inspect` computes and `--json` prints: where the numbers come from, the model
//! dimensions, the layer schedule, the layer-role table, the footprint, the inventory check, the values read by
//! `--verify` and the memory plan.
//! Plain data; [`super::build()`] fills it and [`super::text`] renders it.

use serde::Serialize;
use std::path::PathBuf;

use crate::checkpoint::verify::VerifyReport;
use crate::devices::plan::{Footprint, HostPlan, MemoryPlan};

/// Where the numbers come from.
#[derive(Clone, Debug, Serialize)]
pub struct Source {
    /// `checkpoint` or `config`.
    pub kind: &'static str,
    pub path: PathBuf,
    pub format: String,
    pub format_note: &'static str,
    /// Shard files (checkpoint only).
    pub shards: Option<usize>,
}

/// The model dimensions worth seeing at a glance.
#[derive(Clone, Debug, Serialize)]
pub struct Dims {
    pub hidden_size: usize,
    pub vocab_size: usize,
    pub layers: usize,
    pub attention_heads: usize,
    pub head_dim: usize,
    pub rope_dim: usize,
    pub q_lora_rank: usize,
    pub o_lora_rank: usize,
    pub o_groups: usize,
    pub index_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
    pub routed_experts: usize,
    pub experts_per_token: usize,
    pub shared_experts: usize,
    pub moe_intermediate: usize,
    pub sliding_window: usize,
    pub hc_mult: usize,
    pub hash_layers: usize,
    pub mtp_layers: usize,
}

/// One layer of the schedule.
#[derive(Clone, Debug, Serialize)]
pub struct LayerRow {
    pub layer: usize,
    pub kind: &'static str,
    pub router: &'static str,
}

/// One entry of the layer-role table (`config::layers::LayerRole`): `kind` `swa` / `csa` /
/// `hca`, the compress `ratio`, the layers whose compressed KV (`kv_source`) and indexer
/// selection (`index_source`) it uses (`null`: none; its own index on V4), and its
/// `candidate_stage` (`null` on every V4 layer).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LayerRoleRow {
    pub layer: usize,
    pub kind: &'static str,
    pub ratio: usize,
    pub kv_source: Option<usize>,
    pub index_source: Option<usize>,
    pub candidate_stage: Option<&'static str>,
}

/// One tensor that differs from the expected inventory.
#[derive(Clone, Debug, Serialize)]
pub struct InventoryEntry {
    pub name: String,
    /// The shard holding it (absent for missing tensors).
    pub file: Option<PathBuf>,
    /// `DTYPE [shape]` the config implies (absent for extra tensors).
    pub expected: Option<String>,
    /// `DTYPE [shape]` on disk (absent for missing tensors).
    pub found: Option<String>,
}

impl std::fmt::Display for InventoryEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.name)?;
        if let Some(file) = &self.file {
            write!(f, " in {}", file.display())?;
        }
        match (&self.expected, &self.found) {
            (Some(e), Some(x)) => write!(f, ": expected {e}, found {x}"),
            (Some(e), None) => write!(f, ": expected {e}, found no such tensor in any shard"),
            (None, Some(x)) => write!(f, ": found {x}, expected no such tensor"),
            (None, None) => Ok(()),
        }
    }
}

/// The inventory comparison (checkpoint only).
#[derive(Clone, Debug, Serialize)]
pub struct InventoryReport {
    pub clean: bool,
    pub expected_format: String,
    pub missing_count: usize,
    pub extra_count: usize,
    pub mismatched_count: usize,
    /// The first entries of each category.
    pub missing: Vec<InventoryEntry>,
    pub extra: Vec<InventoryEntry>,
    pub mismatched: Vec<InventoryEntry>,
    /// Compressor / indexer linears (module names after `layers.L.`) this checkpoint stores as
    /// FP8 blocks instead of the release's BF16; each is expected so in every layer.
    pub fp8_compressor_linears: Vec<String>,
    /// Tensors in a shard that index.json's weight_map does not list (first few, and how many).
    pub unindexed: Vec<String>,
    pub unindexed_count: usize,
    /// Draft stages the config declares beyond its MTP layers (Flash-0731's three DSpark
    /// stages; 0 for the base release) and how many inventory differences under `mtp.*` were
    /// therefore not counted (their tensors are not in the inventory; no run uses them).
    pub draft_stages: usize,
    pub draft_differences: usize,
}

/// What only a DeepSeek-V4.1 description has (docs/spec/v41.md 2-3).
#[derive(Clone, Debug, Serialize)]
pub struct V41Facts {
    /// Layers owning a compressor, a compressed cache and index keys.
    pub kv_sources: Vec<usize>,
    /// Layers running an indexer.
    pub index_sources: Vec<usize>,
    /// The layer whose top blocks bound the later index layers' selection (`null`: none).
    pub candidate_source: Option<usize>,
    pub candidate_topk_blocks: usize,
    pub candidate_block_size: usize,
    pub engram_layers: Vec<usize>,
    /// Rows of each Engram layer's table.
    pub engram_rows: Vec<u64>,
    /// Columns of a table row.
    pub engram_width: usize,
    pub engram_heads: usize,
    pub engram_max_ngram: usize,
    pub draft_blocks: usize,
    /// Routed experts of a draft block's MoE.
    pub draft_experts: usize,
    /// Vision tower blocks (`null`: no `vision_config`).
    pub vision_blocks: Option<usize>,
}

/// Everything `inspect` reports (the `--json` object).
#[derive(Clone, Debug, Serialize)]
pub struct InspectReport {
    pub source: Source,
    /// `DeepSeek-V4` or `DeepSeek-V4.1` (from `model_type`).
    pub family: &'static str,
    /// DeepSeek-V4.1 only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub v41: Option<V41Facts>,
    pub config_hash: String,
    pub dims: Dims,
    pub schedule_summary: String,
    pub schedule: Vec<LayerRow>,
    /// The layer-role table, one entry per main layer.
    pub layers: Vec<LayerRoleRow>,
    pub footprint: Footprint,
    pub inventory: Option<InventoryReport>,
    /// With `--verify`: the tensors read and those holding NaN, infinite or only zero values.
    pub verify: Option<VerifyReport>,
    /// `--devices COUNTxSIZE`: the GPU memory plan.
    pub plan: Option<MemoryPlan>,
    /// `--devices cpu`: the CPU host's memory plan (absent from the JSON otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_plan: Option<HostPlan>,
}
