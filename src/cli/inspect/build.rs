//! Builds the [`InspectReport`] from a checkpoint directory (its footprint on disk and the
//! inventory check against its config) or from a config alone (the footprint of the inventory
//! the config implies in the chosen weight format), plus the memory plan when `--devices` is
//! given.

use anyhow::{bail, Context};
use std::path::Path;

use super::report::{
    Dims, InspectReport, InventoryEntry, InventoryReport, LayerRoleRow, LayerRow, Source,
};
use super::InspectArgs;
use crate::backend::WeightResidency;
use crate::checkpoint::verify::VerifyReport;
use crate::checkpoint::{audit, Checkpoint, Dtype, InventoryDiff, WeightFormat};
use crate::config::{Family, LayerRoles, ModelConfig, RouterKind};
use crate::devices::placement::{plan_over, AUTO_CHUNK, CPU_AUTO_CHUNK};
use crate::devices::plan::{
    auto_residency, host_plan, AsPlanModel, Footprint, HostPlan, HostPlanInput, MemoryPlan,
    PlanDevices,
};

/// Entries of each inventory category listed in full.
const LIST_LIMIT: usize = 20;

/// Opens a DeepSeek-V4 checkpoint or config and computes the report.
pub fn build_v4(args: &InspectArgs) -> anyhow::Result<InspectReport> {
    let (source, cfg, footprint, inventory, verify) = if let Some(dir) = &args.model {
        from_checkpoint(dir, args.verify)?
    } else {
        let path = args
            .config
            .as_ref()
            .expect("clap requires --model or --config");
        let (source, cfg, footprint, inventory) = from_config(path, args.format)?;
        (source, cfg, footprint, inventory, None)
    };
    if args.devices.is_some() && args.context > cfg.max_position_embeddings {
        bail!(
            "--context {}: expected at most the model's max_position_embeddings ({})",
            args.context,
            cfg.max_position_embeddings
        );
    }
    let (plan, host_plan) = plans(args, &cfg, &footprint)?;
    Ok(InspectReport {
        source,
        family: Family::V4.name(),
        v41: None,
        config_hash: cfg.hash_hex(),
        dims: dims(&cfg),
        schedule_summary: cfg.schedule_summary(),
        schedule: (0..cfg.num_hidden_layers)
            .map(|l| LayerRow {
                layer: l,
                kind: cfg.layer_kind(l).name(),
                router: router_name(cfg.router_kind(l)),
            })
            .collect(),
        layers: role_rows(&cfg.layer_roles()),
        footprint,
        inventory,
        verify,
        plan,
        host_plan,
    })
}

/// The memory plan `--devices` asks for: over GPUs, or a CPU run on the host (`cpu`,
/// `cpu:SIZE`; `--weights` and `--threads` say how it runs, `--chunk auto` is the CPU's).
pub(super) fn plans(
    args: &InspectArgs,
    model: &(impl AsPlanModel + ?Sized),
    footprint: &Footprint,
) -> anyhow::Result<(Option<MemoryPlan>, Option<HostPlan>)> {
    let Some(devices) = &args.devices else {
        return Ok((None, None));
    };
    let Some((memory, memory_total)) = devices.host_memory().map_err(anyhow::Error::msg)? else {
        let PlanDevices::Gpus(set) = devices else {
            unreachable!("host_memory is None only for GPUs")
        };
        let plan = plan_over(model, footprint, set, args.context, args.chunk);
        return Ok((Some(plan), None));
    };
    let weights = match args.weights {
        WeightResidency::Auto => auto_residency(model, footprint, memory_total),
        w => w,
    };
    let run = HostPlanInput {
        context: args.context,
        chunk: match args.chunk {
            AUTO_CHUNK => CPU_AUTO_CHUNK,
            c => c,
        },
        weights,
        threads: rayon::current_num_threads(),
    };
    Ok((None, Some(host_plan(model, footprint, run, &memory))))
}

/// The layer-role table as `inspect` prints it.
pub(super) fn role_rows(roles: &LayerRoles) -> Vec<LayerRoleRow> {
    roles
        .iter()
        .map(|r| LayerRoleRow {
            layer: r.layer,
            kind: r.kind.name(),
            ratio: r.ratio,
            kv_source: r.kv_source,
            index_source: r.index_source,
            candidate_stage: r.candidate_stage.name(),
        })
        .collect()
}

type Loaded = (Source, ModelConfig, Footprint, Option<InventoryReport>);

/// [`Loaded`] and, with `verify`, what reading every value found.
type Checked = (
    Source,
    ModelConfig,
    Footprint,
    Option<InventoryReport>,
    Option<VerifyReport>,
);

fn from_checkpoint(dir: &Path, verify: bool) -> anyhow::Result<Checked> {
    check_model_dir(dir)?;
    let ckpt = Checkpoint::open(dir)
        .with_context(|| format!("cannot open checkpoint {}", dir.display()))?;
    let cfg = ckpt.config().clone();
    let mut read = read_checkpoint(&ckpt, verify, format_note)?;
    let draft_unchecked = leave_out_draft_stages(&cfg, &mut read.diff);
    let stages = draft_stages(&cfg);
    let inventory = InventoryReport {
        draft_stages: stages,
        draft_differences: draft_unchecked,
        ..inventory_report(&ckpt, &read.diff, ckpt.format())
    };
    Ok((
        read.source,
        cfg,
        read.footprint,
        Some(inventory),
        read.verify,
    ))
}

/// Refuses a `--model` that is missing or not a directory.
pub(super) fn check_model_dir(dir: &Path) -> anyhow::Result<()> {
    if !dir.exists() {
        bail!("model directory {} does not exist", dir.display());
    }
    if !dir.is_dir() {
        bail!(
            "--model expects a directory (config.json + safetensors), {} is a file",
            dir.display()
        );
    }
    Ok(())
}

/// What `inspect --model` reads off an opened checkpoint of either family.
pub(super) struct ReadCheckpoint {
    pub source: Source,
    pub footprint: Footprint,
    /// Against the inventory its config implies in its own format.
    pub diff: InventoryDiff,
    pub verify: Option<VerifyReport>,
}

/// The source, footprint, inventory diff and (with `verify`) the values of `ckpt`; `note`
/// describes its format.
pub(super) fn read_checkpoint<C: crate::checkpoint::CheckpointConfig>(
    ckpt: &Checkpoint<C>,
    verify: bool,
    note: fn(WeightFormat) -> &'static str,
) -> anyhow::Result<ReadCheckpoint> {
    let format = ckpt.format();
    let source = Source {
        kind: "checkpoint",
        path: ckpt.dir().to_path_buf(),
        format: format.name().to_string(),
        format_note: note(format),
        shards: Some(ckpt.shard_paths().len()),
    };
    let verify = if verify {
        Some(verify_values(ckpt)?)
    } else {
        None
    };
    Ok(ReadCheckpoint {
        source,
        footprint: Footprint::of_checkpoint(ckpt),
        diff: audit(ckpt),
        verify,
    })
}

/// `--verify`: every stored value read, with a bar over the bytes on stderr (hidden when it is
/// not a terminal).
fn verify_values<C: crate::checkpoint::CheckpointConfig>(
    ckpt: &Checkpoint<C>,
) -> anyhow::Result<VerifyReport> {
    let bar =
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    bar.set_style(crate::run::progress::style(
        crate::run::progress::VERIFY_BYTES,
    ));
    let report = crate::checkpoint::verify::verify(ckpt, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    report.with_context(|| {
        format!(
            "--verify: cannot read the values of {}",
            ckpt.dir().display()
        )
    })
}

/// Draft stages a config declares beyond its MTP layers (0 for the base release): Flash-0731
/// lists 46 `compress_ratios` for its 43 layers, its three DSpark stages replacing the one MTP
/// layer (docs/spec/model.md 1.2).
fn draft_stages(cfg: &crate::config::ModelConfig) -> usize {
    let stages = cfg
        .compress_ratios
        .len()
        .saturating_sub(cfg.num_hidden_layers);
    if stages > cfg.num_nextn_predict_layers {
        stages
    } else {
        0
    }
}

/// With draft stages ([`draft_stages`]), the `mtp.*` namespace holds them, whose tensors the
/// inventory does not describe (the spec gives no names) and which no run uses: their
/// differences are taken out of `diff` (as the run path ignores `mtp.*` extras) and counted.
fn leave_out_draft_stages(cfg: &crate::config::ModelConfig, diff: &mut InventoryDiff) -> usize {
    if draft_stages(cfg) == 0 {
        return 0;
    }
    let before = diff.missing.len() + diff.extra.len() + diff.mismatched.len();
    let mtp = |name: &str| name.starts_with("mtp.");
    diff.missing.retain(|t| !mtp(&t.name));
    diff.extra.retain(|t| !mtp(&t.name));
    diff.mismatched.retain(|m| !mtp(&m.expected.name));
    before - (diff.missing.len() + diff.extra.len() + diff.mismatched.len())
}

/// The weight format a config implies when `--format` is not given: NVIDIA's NVFP4
/// re-quantisation when it says so (`moe_quant_algo: "NVFP4"` beside `quant_method: "fp8"`, or
/// `quant_method: "modelopt"`), the official release for `quant_method: "fp8"`, else bf16.
fn format_of_config(cfg: &ModelConfig) -> WeightFormat {
    match cfg.quantization_config.as_ref() {
        Some(q) if q.states_nvfp4_experts() => WeightFormat::Nvfp4,
        Some(q) if q.quant_method.as_deref() == Some("fp8") => WeightFormat::Official,
        _ => WeightFormat::Bf16,
    }
}

fn from_config(path: &Path, format: Option<WeightFormat>) -> anyhow::Result<Loaded> {
    let cfg = ModelConfig::load(path)?;
    let format = format.unwrap_or_else(|| format_of_config(&cfg));
    let footprint = Footprint::of_inventory(&cfg, format);
    let source = Source {
        kind: "config",
        path: path.to_path_buf(),
        format: format.name().to_string(),
        format_note: format_note(format),
        shards: None,
    };
    Ok((source, cfg, footprint, None))
}

pub(super) fn inventory_report<C: crate::checkpoint::CheckpointConfig>(
    ckpt: &Checkpoint<C>,
    diff: &InventoryDiff,
    format: WeightFormat,
) -> InventoryReport {
    let ds = |d: Dtype, shape: &[usize]| format!("{d} {shape:?}");
    let file = |name: &str| ckpt.info(name).map(|t| t.file.clone());
    InventoryReport {
        clean: diff.is_clean(),
        expected_format: format.name().to_string(),
        missing_count: diff.missing.len(),
        extra_count: diff.extra.len(),
        mismatched_count: diff.mismatched.len(),
        unindexed: ckpt.unindexed().iter().take(LIST_LIMIT).cloned().collect(),
        unindexed_count: ckpt.unindexed().len(),
        draft_stages: 0,
        draft_differences: 0,
        fp8_compressor_linears: ckpt
            .inventory_options()
            .fp8_compressor_linears
            .modules()
            .into_iter()
            .map(String::from)
            .collect(),
        missing: diff
            .missing
            .iter()
            .take(LIST_LIMIT)
            .map(|e| InventoryEntry {
                name: e.name.clone(),
                file: None,
                expected: Some(ds(e.dtype, &e.shape)),
                found: None,
            })
            .collect(),
        extra: diff
            .extra
            .iter()
            .take(LIST_LIMIT)
            .map(|e| InventoryEntry {
                name: e.name.clone(),
                file: file(&e.name),
                expected: None,
                found: Some(ds(e.dtype, &e.shape)),
            })
            .collect(),
        mismatched: diff
            .mismatched
            .iter()
            .take(LIST_LIMIT)
            .map(|m| InventoryEntry {
                name: m.expected.name.clone(),
                file: file(&m.expected.name),
                expected: Some(ds(m.expected.dtype, &m.expected.shape)),
                found: Some(ds(m.found_dtype, &m.found_shape)),
            })
            .collect(),
    }
}

pub(super) fn format_note(f: WeightFormat) -> &'static str {
    match f {
        WeightFormat::Bf16 => "every linear bf16, no scale tensors",
        WeightFormat::Official => {
            "official release: fp8 e4m3 128x128-block linears with e8m0 scales, routed experts fp4 e2m1 (I8, two per byte) with e8m0 1x32 scales"
        }
        WeightFormat::Nvfp4 => {
            "NVIDIA NVFP4 re-quantisation: routed experts fp4 e2m1 (U8) with e4m3 1x16 weight_scale and f32 weight_scale_2; the rest as official"
        }
    }
}

pub(super) fn router_name(r: RouterKind) -> &'static str {
    match r {
        RouterKind::Hash => "hash",
        RouterKind::Score => "score",
    }
}

fn dims(c: &ModelConfig) -> Dims {
    Dims {
        hidden_size: c.hidden_size,
        vocab_size: c.vocab_size,
        layers: c.num_hidden_layers,
        attention_heads: c.num_attention_heads,
        head_dim: c.head_dim,
        rope_dim: c.qk_rope_head_dim,
        q_lora_rank: c.q_lora_rank,
        o_lora_rank: c.o_lora_rank,
        o_groups: c.o_groups,
        index_heads: c.index_n_heads,
        index_head_dim: c.index_head_dim,
        index_topk: c.index_topk,
        routed_experts: c.n_routed_experts,
        experts_per_token: c.num_experts_per_tok,
        shared_experts: c.n_shared_experts,
        moe_intermediate: c.moe_intermediate_size,
        sliding_window: c.sliding_window,
        hc_mult: c.hc_mult,
        hash_layers: c.num_hash_layers,
        mtp_layers: c.num_nextn_predict_layers,
    }
}
