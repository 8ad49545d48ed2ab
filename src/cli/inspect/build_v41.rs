//! Builds the [`InspectReport`] of a DeepSeek-V4.1 checkpoint or config (docs/spec/v41.md):
//! the same record as for V4 (`build.rs`), filled from [`V41Config`] and its inventory
//! (`checkpoint::inventory_v41`), plus the V4.1 facts ([`V41Facts`]: KV, index and candidate
//! sources, Engram tables, draft blocks, vision tower).
//!
//! Weight formats: `official` (the release: FP8 e4m3 32x32 blocks, FP4 experts, FP8 Engram
//! rows), `bf16`, and `nvfp4` (NVIDIA's re-quantisation, docs/spec/v41.md 4.3; implied by
//! `quantization_config.moe_quant_algo` `NVFP4`, detected on a checkpoint by its
//! `weight_scale_2` tensors).

use anyhow::{bail, Context};
use std::path::Path;

use super::build::{check_model_dir, format_note, inventory_report, read_checkpoint, role_rows};
use super::report::{Dims, InspectReport, LayerRow, Source, V41Facts};
use super::InspectArgs;
use crate::checkpoint::verify::VerifyReport;
use crate::checkpoint::{Checkpoint, WeightFormat};
use crate::config::{Family, V41Config};
use crate::devices::plan::{Footprint, PlanModel};

/// The V4.1 report of `--model` or `--config`.
pub fn build_v41(args: &InspectArgs) -> anyhow::Result<InspectReport> {
    let (source, format, cfg, footprint, inventory, verify) = if let Some(dir) = &args.model {
        from_checkpoint(dir, args.verify)?
    } else {
        let path = args
            .config
            .as_ref()
            .expect("clap requires --model or --config");
        from_config(path, args.format)?
    };
    let t = &cfg.text;
    if args.devices.is_some() && args.context > t.max_position_embeddings {
        bail!(
            "--context {}: expected at most the model's max_position_embeddings ({})",
            args.context,
            t.max_position_embeddings
        );
    }
    // The Engram rows the host reads are as wide as the format stores them.
    let model = PlanModel::v41_stored(&cfg, format);
    let (plan, host_plan) = super::build::plans(args, &model, &footprint)?;
    let roles = cfg.layer_roles();
    Ok(InspectReport {
        source,
        family: Family::V41.name(),
        v41: Some(facts(&cfg)),
        config_hash: cfg.hash_hex(),
        dims: dims(&cfg),
        schedule_summary: cfg.schedule_summary(),
        schedule: (0..t.num_hidden_layers)
            .map(|l| LayerRow {
                layer: l,
                kind: cfg.layer_kind(l).name(),
                // Every V4.1 layer routes by score (no hash-routed layers).
                router: "score",
            })
            .collect(),
        layers: role_rows(&roles),
        footprint,
        inventory,
        verify,
        plan,
        host_plan,
    })
}

type Built = (
    Source,
    WeightFormat,
    V41Config,
    Footprint,
    Option<super::report::InventoryReport>,
    Option<VerifyReport>,
);

fn from_checkpoint(dir: &Path, verify: bool) -> anyhow::Result<Built> {
    check_model_dir(dir)?;
    let ckpt = Checkpoint::open_v41(dir)
        .with_context(|| format!("cannot open checkpoint {}", dir.display()))?;
    let read = read_checkpoint(&ckpt, verify, format_note_v41)?;
    let inventory = inventory_report(&ckpt, &read.diff, ckpt.format());
    let cfg = ckpt.config().clone();
    Ok((
        read.source,
        ckpt.format(),
        cfg,
        read.footprint,
        Some(inventory),
        read.verify,
    ))
}

fn from_config(path: &Path, format: Option<WeightFormat>) -> anyhow::Result<Built> {
    let cfg = crate::config::V41Config::load(path)?;
    let implied = match &cfg.weights {
        w if w.experts_nvfp4 => WeightFormat::Nvfp4,
        w if w.block.is_some() => WeightFormat::Official,
        _ => WeightFormat::Bf16,
    };
    let format = format.unwrap_or(implied);
    let footprint = Footprint::of_inventory(&cfg, format);
    let source = Source {
        kind: "config",
        path: path.to_path_buf(),
        format: format.name().to_string(),
        format_note: format_note_v41(format),
        shards: None,
    };
    Ok((source, format, cfg, footprint, None, None))
}

/// The format note, with V4.1's block and its Engram rows.
fn format_note_v41(f: WeightFormat) -> &'static str {
    match f {
        WeightFormat::Official => {
            "official release: fp8 e4m3 32x32-block linears with e8m0 scales, routed experts fp4 e2m1 (I8, two per byte) with e8m0 1x32 scales, Engram tables fp8 e4m3 rows with e8m0 1x32 scales"
        }
        WeightFormat::Nvfp4 => {
            "NVIDIA NVFP4 re-quantisation: backbone routed experts fp4 e2m1 (U8) with e4m3 1x16 weight_scale and f32 weight_scale_2; draft-block experts MXFP4 and the rest as official (32x32 fp8 blocks)"
        }
        other => format_note(other),
    }
}

fn dims(cfg: &V41Config) -> Dims {
    let t = &cfg.text;
    Dims {
        hidden_size: t.hidden_size,
        vocab_size: t.vocab_size,
        layers: t.num_hidden_layers,
        attention_heads: t.num_attention_heads,
        head_dim: t.head_dim,
        rope_dim: t.qk_rope_head_dim,
        q_lora_rank: t.q_lora_rank,
        o_lora_rank: t.o_lora_rank,
        o_groups: t.o_groups,
        index_heads: t.index_n_heads,
        index_head_dim: t.index_head_dim,
        index_topk: t.index_topk,
        routed_experts: t.n_routed_experts,
        experts_per_token: t.num_experts_per_tok,
        shared_experts: t.n_shared_experts,
        moe_intermediate: t.moe_intermediate_size,
        sliding_window: t.sliding_window,
        hc_mult: t.hc_mult,
        hash_layers: 0,
        mtp_layers: cfg.draft_blocks(),
    }
}

fn facts(cfg: &V41Config) -> V41Facts {
    let t = &cfg.text;
    V41Facts {
        kv_sources: t.kv_source_layer_ids.clone(),
        index_sources: t.index_source_layer_ids.clone(),
        candidate_source: cfg.candidate_source(),
        candidate_topk_blocks: t.candidate_topk_blocks,
        candidate_block_size: t.candidate_block_size,
        engram_layers: t.engram_layer_ids.clone(),
        engram_rows: t.engram_num_embeddings.clone(),
        engram_width: t.engram_head_dim,
        engram_heads: t.engram_n_heads,
        engram_max_ngram: t.engram_max_ngram_size,
        draft_blocks: cfg.draft_blocks(),
        draft_experts: t.dspark_n_routed_experts,
        vision_blocks: cfg.vision.as_ref().map(|v| v.num_hidden_layers),
    }
}
