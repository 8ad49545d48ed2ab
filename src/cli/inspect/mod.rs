//! `needlescope inspect`: what a checkpoint holds (`--model DIR`) or what a config implies
//! (`--config FILE`, no weights needed), for DeepSeek-V4 and DeepSeek-V4.1 (the family comes
//! from `model_type`): model summary, layer schedule and layer roles
//! (`config::layers`), parameters and bytes per
//! component and per number format, the inventory check against the config (with `--model`) and
//! the memory plan over `--devices` at `--context` (see `crate::devices::plan`); with
//! `--verify`, every stored value read (`crate::checkpoint::verify`): NaN, infinite and
//! all-zero tensors by name.
//!
//! Exit status: non-zero when the checkpoint does not match the inventory its config implies,
//! when `--verify` finds a tensor with NaN, infinite or only zero values, or when the memory
//! plan does not fit; the full report is printed first either way.
//!
//! Layout: this file holds the arguments and the entry point (print, then decide the exit
//! status); `report` the `--json` record types; `build` turns a checkpoint or a config into that
//! record (`build_v41` for DeepSeek-V4.1); `text` renders it as text, with the memory plan table in `plan_table`.

use anyhow::bail;
use clap::Args;
use std::io::Write;
use std::path::PathBuf;

use super::flags::parse_token_count;
use crate::backend::WeightResidency;
use crate::checkpoint::WeightFormat;
use crate::config::Family;
use crate::devices::plan::PlanDevices;
use crate::units::{group_digits, human_bytes};

mod build;
mod build_v41;
mod plan_table;
mod report;
#[cfg(test)]
mod tests;
mod text;

pub use report::{
    Dims, InspectReport, InventoryEntry, InventoryReport, LayerRoleRow, LayerRow, Source, V41Facts,
};
pub use text::compact_ranges;

#[derive(Args, Debug, Clone)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["model", "config"])))]
pub struct InspectArgs {
    /// Checkpoint directory (config.json + safetensors), or a Hugging Face repo id (ORG/NAME) in the local cache (never downloaded); its tensors are checked against the config
    #[arg(long, value_name = "DIR|ORG/NAME")]
    pub model: Option<PathBuf>,

    /// With --model ORG/NAME or a models--ORG--NAME directory of the Hugging Face cache: the ref
    /// (branch, tag) or commit whose snapshot to use [default: main]
    #[arg(long, value_name = "REV", requires = "model")]
    pub revision: Option<String>,

    /// A config.json alone: sizes come from the inventory it implies (no weights needed)
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// With --config: the weight format to assume [default: nvfp4 if the config says moe_quant_algo NVFP4 (NVIDIA's export) or quant_method modelopt, official if it says fp8, else bf16; the same for a DeepSeek-V4.1 config, whose quant_method is fp8 only]
    #[arg(long, value_name = "bf16|official|nvfp4", requires = "config")]
    pub format: Option<WeightFormat>,

    /// Plan memory over these devices: GPUs as COUNTxSIZE, e.g. 8x96G or 2x80GiB (G = GiB = 2^30 B, GB = 10^9 B); or cpu: a CPU run on this host against its available memory (cpu:SIZE: a host of that size, e.g. cpu:768G)
    #[arg(long, value_name = "COUNTxSIZE|cpu|cpu:SIZE")]
    pub devices: Option<PlanDevices>,

    /// With --devices: context length the memory plan provisions state for (k = 1024, m = 1048576), at most the config's max_position_embeddings
    #[arg(long, value_name = "TOKENS", value_parser = parse_token_count, default_value = "128k", requires = "devices")]
    pub context: usize,

    /// With --devices: prefill chunk the memory plan provisions workspace for, or auto: the largest of 8192, 4096 and 2048 that fits, as a GPU run chooses
    #[arg(long, value_name = "TOKENS|auto", value_parser = super::flags::parse_chunk, default_value = "auto", requires = "devices")]
    pub chunk: usize,

    /// With --devices cpu: the weights of the planned CPU run: decoded (f32 at load), streamed (stored format, decoded on use) or auto (decoded when the f32 model takes at most a quarter of the host's memory), as `bench --weights` and every CPU run decide
    #[arg(
        long,
        value_name = "MODE",
        default_value = "auto",
        requires = "devices"
    )]
    pub weights: WeightResidency,

    /// With --model: also read every stored value of every shard (a progress bar over the bytes) and name each tensor holding NaN or infinite values, or only zeros; non-zero exit on any
    #[arg(long, conflicts_with = "config")]
    pub verify: bool,

    /// Print everything as one JSON object
    #[arg(long)]
    pub json: bool,
}

/// Opens the checkpoint or config and computes the report, by the family its `model_type`
/// names.
pub fn build(args: &InspectArgs) -> anyhow::Result<InspectReport> {
    if let (Some(_), Some(format)) = (&args.model, args.format) {
        bail!(
            "--format {format}: applies to --config only; with --model the format is read from \
             the checkpoint's tensors"
        );
    }
    match family_of(args) {
        Family::V41 => build_v41::build_v41(args),
        Family::V4 => build::build_v4(args),
    }
}

/// The family of the config `inspect` reads: from `model_type` (or the key set), never from a
/// layer count. A file that cannot be read or parsed counts as V4, whose loader names the
/// problem.
fn family_of(args: &InspectArgs) -> Family {
    let path = match (&args.model, &args.config) {
        (Some(dir), _) => dir.join("config.json"),
        (None, Some(file)) if file.is_dir() => file.join("config.json"),
        (None, Some(file)) => file.clone(),
        (None, None) => return Family::V4,
    };
    std::fs::read_to_string(path)
        .map(|text| Family::of_json_str(&text))
        .unwrap_or(Family::V4)
}

pub fn run(args: &InspectArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let report = build(args)?;
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        text::print_text(&report, out)?;
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
    if let Some(v) = report.verify.as_ref().filter(|v| !v.clean()) {
        let first: Vec<String> = v.findings.iter().take(3).map(|f| f.to_string()).collect();
        problems.push(format!(
            "checkpoint {}: {} of {} tensors hold NaN or infinite values, or only zeros; first: {}",
            report.source.path.display(),
            v.findings.len(),
            group_digits(v.tensors as u64),
            first.join("; ")
        ));
    }
    if let Some(p) = report.plan.as_ref().filter(|p| !p.fits) {
        // The devices over capacity together lack `shortfall`; the model may also exceed all
        // devices together (by less: others have room the layers cannot move into).
        let overall = match p.total.checked_sub(p.capacity).filter(|&d| d > 0) {
            Some(d) if d == u64::MAX || p.shortfall == u64::MAX => String::new(),
            Some(d) => format!(", {} more than all devices hold together", human_bytes(d)),
            None => String::new(),
        };
        problems.push(format!(
            "memory plan refused: {} cannot hold the model at context {}; the devices over \
             capacity are short by {} in all{overall}",
            p.devices_spec,
            p.context,
            crate::units::bytes_and_count(p.shortfall)
        ));
    }
    if let Some(p) = report.host_plan.as_ref().filter(|p| !p.fits) {
        problems.push(p.refusal());
    }
    if !problems.is_empty() {
        bail!(problems.join("; "));
    }
    Ok(())
}
