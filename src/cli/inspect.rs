//! `needlescope inspect`: what a checkpoint holds (`--model DIR`) or what a config implies
//! (`--config FILE`, no weights needed): model summary, layer schedule, parameters and bytes per
//! component and per number format, the inventory check against the config (with `--model`) and
//! the memory plan over `--devices` at `--context` (see `crate::plan`).
//!
//! Exit status: non-zero when the checkpoint does not match the inventory its config implies,
//! or when the memory plan does not fit; the full report is printed first either way.

use anyhow::{bail, Context};
use clap::Args;
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::values::parse_token_count;
use super::{group_digits, human_bytes};
use crate::checkpoint::{
    audit, expected_inventory, Checkpoint, Dtype, InventoryDiff, WeightFormat,
};
use crate::config::{LayerKind, ModelConfig, RouterKind};
use crate::plan::{self, DeviceSet, Footprint, MemoryPlan, TensorSpec};

/// Entries of each inventory category listed in full.
const LIST_LIMIT: usize = 20;

#[derive(Args, Debug, Clone)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["model", "config"])))]
pub struct InspectArgs {
    /// Checkpoint directory (config.json + safetensors); its tensors are checked against the config
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,

    /// A config.json alone: sizes come from the inventory it implies (no weights needed)
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// With --config: the weight format to assume [default: official if the config says fp8, else bf16]
    #[arg(long, value_name = "bf16|official|nvfp4", requires = "config")]
    pub format: Option<WeightFormat>,

    /// Plan memory over these devices: COUNTxSIZE, e.g. 8x96G or 2x80GiB (G = GiB = 2^30 B, GB = 10^9 B)
    #[arg(long, value_name = "COUNTxSIZE")]
    pub devices: Option<DeviceSet>,

    /// Context length the memory plan provisions state for (k = 1024, m = 1048576)
    #[arg(long, value_name = "TOKENS", value_parser = parse_token_count, default_value = "128k")]
    pub context: usize,

    /// Prefill chunk the memory plan provisions workspace for
    #[arg(long, value_name = "TOKENS", value_parser = parse_token_count, default_value = "2048")]
    pub chunk: usize,

    /// Print everything as one JSON object
    #[arg(long)]
    pub json: bool,
}

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
}

/// Everything `inspect` reports (the `--json` object).
#[derive(Clone, Debug, Serialize)]
pub struct InspectReport {
    pub source: Source,
    pub config_hash: String,
    pub dims: Dims,
    pub schedule_summary: String,
    pub schedule: Vec<LayerRow>,
    pub footprint: Footprint,
    pub inventory: Option<InventoryReport>,
    pub plan: Option<MemoryPlan>,
}

pub fn run(args: &InspectArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let report = build(args)?;
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        print_text(&report, out)?;
    }
    let mut problems = Vec::new();
    if let Some(inv) = report.inventory.as_ref().filter(|i| !i.clean) {
        let first: Vec<String> = inv
            .mismatched
            .iter()
            .chain(&inv.missing)
            .chain(&inv.extra)
            .take(3)
            .map(|e| e.to_string())
            .collect();
        problems.push(format!(
            "checkpoint {} does not match the {}-format inventory its config implies: {} missing, {} extra, {} mismatched; first: {}",
            report.source.path.display(),
            inv.expected_format,
            inv.missing_count,
            inv.extra_count,
            inv.mismatched_count,
            first.join("; ")
        ));
    }
    if let Some(p) = report.plan.as_ref().filter(|p| !p.fits) {
        problems.push(format!(
            "memory plan refused: {} cannot hold the model at context {}; short by {} ({} bytes)",
            p.devices_spec,
            p.context,
            human_bytes(p.shortfall),
            group_digits(p.shortfall)
        ));
    }
    if !problems.is_empty() {
        bail!(problems.join("; "));
    }
    Ok(())
}

/// Opens the checkpoint or config and computes the report.
pub fn build(args: &InspectArgs) -> anyhow::Result<InspectReport> {
    let (source, cfg, footprint, inventory) = if let Some(dir) = &args.model {
        from_checkpoint(dir)?
    } else {
        let path = args
            .config
            .as_ref()
            .expect("clap requires --model or --config");
        from_config(path, args.format)?
    };
    let plan = args
        .devices
        .as_ref()
        .map(|d| plan::plan(&cfg, &footprint, d, args.context, args.chunk));
    Ok(InspectReport {
        source,
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
        footprint,
        inventory,
        plan,
    })
}

type Loaded = (Source, ModelConfig, Footprint, Option<InventoryReport>);

fn from_checkpoint(dir: &Path) -> anyhow::Result<Loaded> {
    if !dir.exists() {
        bail!("model directory {} does not exist", dir.display());
    }
    if !dir.is_dir() {
        bail!(
            "--model expects a directory (config.json + safetensors), {} is a file",
            dir.display()
        );
    }
    let ckpt = Checkpoint::open(dir)
        .with_context(|| format!("cannot open checkpoint {}", dir.display()))?;
    let cfg = ckpt.config().clone();
    let format = ckpt.format();
    let footprint = Footprint::of_checkpoint(&ckpt);
    let diff = audit(&ckpt);
    let source = Source {
        kind: "checkpoint",
        path: dir.to_path_buf(),
        format: format.name().to_string(),
        format_note: format_note(format),
        shards: Some(ckpt.shard_paths().len()),
    };
    Ok((
        source,
        cfg,
        footprint,
        Some(inventory_report(&ckpt, &diff, format)),
    ))
}

fn from_config(path: &Path, format: Option<WeightFormat>) -> anyhow::Result<Loaded> {
    let cfg = ModelConfig::load(path)?;
    let format = format.unwrap_or(if cfg.is_fp8() {
        WeightFormat::Official
    } else {
        WeightFormat::Bf16
    });
    let expected = expected_inventory(&cfg, format);
    let footprint = Footprint::from_tensors(
        cfg.num_hidden_layers,
        expected.iter().map(|t| TensorSpec {
            name: &t.name,
            dtype: t.dtype.as_str(),
            numel: t.shape.iter().product::<usize>() as u64,
            bytes: t.bytes(),
        }),
    );
    let source = Source {
        kind: "config",
        path: path.to_path_buf(),
        format: format.name().to_string(),
        format_note: format_note(format),
        shards: None,
    };
    Ok((source, cfg, footprint, None))
}

fn inventory_report(
    ckpt: &Checkpoint,
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

fn format_note(f: WeightFormat) -> &'static str {
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

fn router_name(r: RouterKind) -> &'static str {
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

/// Sorted indices -> `0-1, 2, 3-41/2` (runs of three or more with a common step are ranges,
/// `/s` marks a step other than 1).
pub fn compact_ranges(v: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i + 1;
        if j < v.len() {
            let step = v[j] - v[i];
            while j + 1 < v.len() && v[j + 1] - v[j] == step {
                j += 1;
            }
            let run = j - i + 1;
            if step > 0 && (run >= 3 || (run == 2 && step == 1)) {
                parts.push(if step == 1 {
                    format!("{}-{}", v[i], v[j])
                } else {
                    format!("{}-{}/{}", v[i], v[j], step)
                });
                i = j + 1;
                continue;
            }
        }
        parts.push(v[i].to_string());
        i += 1;
    }
    parts.join(", ")
}

fn print_text(r: &InspectReport, out: &mut dyn Write) -> anyhow::Result<()> {
    let d = &r.dims;
    let s = &r.source;
    match s.shards {
        Some(n) => writeln!(
            out,
            "checkpoint  {} ({} shard file{})",
            s.path.display(),
            n,
            if n == 1 { "" } else { "s" }
        )?,
        None => writeln!(
            out,
            "config      {} (no weights; sizes from the implied inventory)",
            s.path.display()
        )?,
    }
    writeln!(out, "format      {}: {}", s.format, s.format_note)?;
    writeln!(out, "config hash {}", r.config_hash)?;
    writeln!(
        out,
        "dims        hidden {}, vocab {}, {} heads x {} (rope {}), q_lora {}, o_lora {} x {} groups",
        d.hidden_size, d.vocab_size, d.attention_heads, d.head_dim, d.rope_dim, d.q_lora_rank, d.o_lora_rank, d.o_groups
    )?;
    writeln!(
        out,
        "            indexer {} heads x {}, top-k {}; experts {} routed ({} active, {} wide) + {} shared",
        d.index_heads, d.index_head_dim, d.index_topk, d.routed_experts, d.experts_per_token, d.moe_intermediate, d.shared_experts
    )?;
    writeln!(
        out,
        "            window {}, mHC {} streams, {} MTP layer(s) (never run)",
        d.sliding_window, d.hc_mult, d.mtp_layers
    )?;

    // Schedule.
    writeln!(out)?;
    writeln!(out, "schedule    {}", r.schedule_summary)?;
    let map: String = r
        .schedule
        .iter()
        .map(|l| match l.kind {
            "swa" => 'S',
            "csa" => 'C',
            _ => 'H',
        })
        .collect();
    writeln!(
        out,
        "  map       {map}   (S = SWA, C = CSA, H = HCA, layer 0 first)"
    )?;
    for kind in [LayerKind::Swa, LayerKind::Csa, LayerKind::Hca] {
        let layers: Vec<usize> = r
            .schedule
            .iter()
            .filter(|l| l.kind == kind.name())
            .map(|l| l.layer)
            .collect();
        if !layers.is_empty() {
            writeln!(
                out,
                "  {:<9} {:>3} layers: {}",
                kind.name().to_uppercase(),
                layers.len(),
                compact_ranges(&layers)
            )?;
        }
    }
    for router in ["hash", "score"] {
        let layers: Vec<usize> = r
            .schedule
            .iter()
            .filter(|l| l.router == router)
            .map(|l| l.layer)
            .collect();
        if !layers.is_empty() {
            writeln!(
                out,
                "  {:<9} {:>3} layers: {}",
                format!("{router} moe"),
                layers.len(),
                compact_ranges(&layers)
            )?;
        }
    }

    // Components and formats.
    let f = &r.footprint;
    writeln!(out)?;
    writeln!(
        out,
        "{:<28} {:>9} {:>18} {:>18} {:>11}",
        "component", "tensors", "params", "bytes", ""
    )?;
    for row in &f.components {
        write_tally(out, row.label, &row.tally, "")?;
    }
    write_tally(out, "main model (without MTP)", &f.main, "")?;
    write_tally(out, "total", &f.total, "")?;
    writeln!(
        out,
        "  params: logical weights (packed fp4 counts 2 per byte); scales, tid2eid tables and router biases count 0"
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "{:<28} {:>9} {:>18} {:>18} {:>11}",
        "format (safetensors dtype)", "tensors", "params", "bytes", ""
    )?;
    for row in &f.formats {
        write_tally(out, &row.dtype, &row.tally, row.note)?;
    }

    // Inventory.
    if let Some(inv) = &r.inventory {
        writeln!(out)?;
        if inv.clean {
            writeln!(
                out,
                "inventory   OK: {} tensors, exactly the {}-format inventory the config implies",
                group_digits(f.total.tensors),
                inv.expected_format
            )?;
        } else {
            writeln!(
                out,
                "inventory   MISMATCH against the {}-format inventory the config implies: {} missing, {} extra, {} mismatched",
                inv.expected_format, inv.missing_count, inv.extra_count, inv.mismatched_count
            )?;
            for (label, list, count) in [
                ("missing", &inv.missing, inv.missing_count),
                ("extra", &inv.extra, inv.extra_count),
                ("mismatched", &inv.mismatched, inv.mismatched_count),
            ] {
                for e in list {
                    writeln!(out, "  {label:<10} {e}")?;
                }
                if count > list.len() {
                    writeln!(out, "  {label:<10} ... and {} more", count - list.len())?;
                }
            }
        }
    }

    // Memory plan.
    if let Some(p) = &r.plan {
        print_plan(p, out)?;
    }
    Ok(())
}

fn write_tally(
    out: &mut dyn Write,
    label: &str,
    t: &plan::Tally,
    note: &str,
) -> std::io::Result<()> {
    let line = format!(
        "{:<28} {:>9} {:>18} {:>18} {:>11}  {}",
        label,
        group_digits(t.tensors),
        if t.params == 0 {
            "-".to_string()
        } else {
            group_digits(t.params)
        },
        group_digits(t.bytes),
        human_bytes(t.bytes),
        note
    );
    writeln!(out, "{}", line.trim_end())
}

fn print_plan(p: &MemoryPlan, out: &mut dyn Write) -> anyhow::Result<()> {
    writeln!(out)?;
    writeln!(
        out,
        "memory plan {} at context {} tokens (prefill chunk {}): {}",
        p.devices_spec,
        group_digits(p.context as u64),
        p.chunk,
        if p.fits {
            format!("fits ({})", p.strategy)
        } else {
            "REFUSED, does not fit".to_string()
        }
    )?;
    writeln!(
        out,
        "{:>6}  {:<7} {:<10} {:>11} {:>11} {:>11} {:>11} {:>11} {:>12}",
        "device", "layers", "also", "weights", "state", "workspace", "total", "capacity", "free"
    )?;
    for d in &p.devices {
        let layers = match d.layers {
            Some([a, b]) if a == b => a.to_string(),
            Some([a, b]) => format!("{a}-{b}"),
            None => "-".into(),
        };
        let also = match (d.holds_embed, d.holds_head) {
            (true, true) => "embed+head",
            (true, false) => "embed",
            (false, true) => "head",
            (false, false) => "",
        };
        let free = if d.free >= 0 {
            human_bytes(d.free as u64)
        } else {
            format!("-{}", human_bytes(d.shortfall))
        };
        writeln!(
            out,
            "{:>6}  {:<7} {:<10} {:>11} {:>11} {:>11} {:>11} {:>11} {:>12}",
            d.device,
            layers,
            also,
            human_bytes(d.weights),
            human_bytes(d.state),
            human_bytes(d.workspace),
            human_bytes(d.total),
            human_bytes(d.capacity),
            free
        )?;
    }
    writeln!(
        out,
        "{:>6}  {:<7} {:<10} {:>11} {:>11} {:>11} {:>11} {:>11}",
        "all",
        "",
        "",
        human_bytes(p.weights),
        human_bytes(p.state),
        human_bytes(p.workspace),
        human_bytes(p.total),
        human_bytes(p.capacity)
    )?;
    if !p.fits {
        for d in p.devices.iter().filter(|d| d.shortfall > 0) {
            writeln!(
                out,
                "shortfall   device {}: needs {} ({} bytes) more than its {}",
                d.device,
                human_bytes(d.shortfall),
                group_digits(d.shortfall),
                human_bytes(d.capacity)
            )?;
        }
        if p.total > p.capacity {
            writeln!(
                out,
                "shortfall   in total: {} ({} bytes) more than all devices hold",
                human_bytes(p.total - p.capacity),
                group_digits(p.total - p.capacity)
            )?;
        }
    }
    writeln!(
        out,
        "  not placed: MTP ({}, never run)",
        human_bytes(p.excluded_mtp_bytes)
    )?;
    for a in &p.assumptions {
        writeln!(out, "  assumes: {a}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_compact_arithmetic_runs() {
        assert_eq!(compact_ranges(&[0, 1]), "0-1");
        assert_eq!(compact_ranges(&[2]), "2");
        let csa: Vec<usize> = std::iter::once(2).chain((4..=42).step_by(2)).collect();
        assert_eq!(compact_ranges(&csa), "2-42/2");
        assert_eq!(compact_ranges(&[3, 5, 7, 41]), "3-7/2, 41");
        assert_eq!(compact_ranges(&[1, 3]), "1, 3");
        assert_eq!(compact_ranges(&[]), "");
    }
}
