//! `needlescope trace`: its flags and its output. A token file (or a conversation) runs through
//! the model and the indexer scores, top-k selections and logits of the chosen positions go to
//! one safetensors file (docs/outputs.md), for comparison with other engines; the plan, the
//! checks of `--out` and of the room, and the run are [`crate::run::trace`]'s. `--logits` picks
//! which logits (whole rows, the top N with their token ids, or none; `run::trace_logits`). This
//! file turns the flags into a [`TracePlan`], says on stderr before the model runs how large the
//! file will be and what it holds, and prints the line of the outcome. `--device` picks the
//! backend (the header metadata records it as `backend`).

use clap::Args;
use std::io::Write;
use std::path::PathBuf;

use super::device::DeviceArgs;
use super::flags::{parse_positive, Positions};
use crate::numerics::profiles::{IndexProfile, KvMode};
use crate::run::trace::{self, LogitsMode, PreparedTrace, TraceInput, TracePlan};
use crate::run::trace_v41;

#[derive(Args, Debug, Clone)]
pub struct TraceArgs {
    /// Model directory: config.json, safetensors; or a Hugging Face repo id (ORG/NAME) in the local cache (HF_HUB_CACHE, HF_HOME/hub or ~/.cache/huggingface/hub; never downloaded)
    #[arg(long, value_name = "DIR|ORG/NAME")]
    pub model: PathBuf,

    /// With --model ORG/NAME or a models--ORG--NAME directory of the Hugging Face cache: the ref
    /// (branch, tag) or commit whose snapshot to use [default: main]
    #[arg(long, value_name = "REV")]
    pub revision: Option<String>,

    /// Token ids, whitespace- or comma-separated integers (what `needlescope prompt --ids-out` writes)
    #[arg(
        long,
        value_name = "FILE",
        required_unless_present = "prompt",
        conflicts_with = "prompt"
    )]
    pub tokens: Option<PathBuf>,

    /// A conversation instead of --tokens: an OpenAI-style chat request (*.json) or a messages array, or a UTF-8 text file (one user message), rendered as the model's release (DeepSeek-V4 or V4.1) renders it
    #[arg(long, value_name = "FILE")]
    pub prompt: Option<PathBuf>,

    /// Positions to record: all, last, or a comma list of 0-based positions
    #[arg(long, value_name = "all|last|LIST", default_value = "last")]
    pub positions: Positions,

    /// Driving index profile (decides the real selection)
    #[arg(long, value_name = "PROFILE", default_value = "exact")]
    pub index: IndexProfile,

    /// Main KV rounding: exact or fp8 (DeepSeek-V4); exact or release (DeepSeek-V4.1)
    #[arg(long, value_name = "MODE", default_value = "exact")]
    pub kv: KvMode,

    /// Top-k of the indexer [default: the config's index_topk]
    #[arg(long, allow_negative_numbers = true, value_name = "K", value_parser = parse_positive)]
    pub topk: Option<usize>,

    /// DeepSeek-V4.1 only: blocks the candidate stage keeps per query [default: the config's candidate_topk_blocks]
    #[arg(long, allow_negative_numbers = true, value_name = "BLOCKS", value_parser = parse_positive)]
    pub candidate_blocks: Option<usize>,

    /// Prefill chunk in tokens, or auto: 2048 on the CPU, on GPUs the largest of 8192, 4096 and 2048 that fits (results equal up to f32 rounding: a chunk changes GEMM shapes and so summation order)
    #[arg(long, value_name = "TOKENS|auto", value_parser = super::flags::parse_chunk, default_value = "auto")]
    pub chunk: usize,

    /// Output safetensors file
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,

    /// Also dump the raw indexer inputs per CSA layer (q, keys, head weights)
    #[arg(long)]
    pub dump_indexer_inputs: bool,

    /// Logits kept per recorded position: none; top:N, the N largest (descending, ties to the lower token id) with their token ids; all, the whole row [default: all for at most 16 positions, else top:20]
    #[arg(long, value_name = "none|top:N|all")]
    pub logits: Option<LogitsMode>,

    #[command(flatten)]
    pub device: DeviceArgs,
}

/// Says on stderr what the trace will write, before the model runs: the file's size and what
/// it holds (logits, indexer, the rest), so a `--positions all` of gigabytes is no surprise.
/// The header is estimated from the metadata known now ([`PreparedTrace::header_bytes`]).
fn announce_size(args: &TraceArgs, prepared: &PreparedTrace) {
    let layout = &prepared.layout;
    let sizes = layout.sizes();
    let header = prepared.header_bytes();
    let total = layout.file_bytes() + header;
    let human = crate::units::human_bytes;
    let logits = match layout.logits {
        LogitsMode::None => "none".to_string(),
        LogitsMode::Top(n) => format!(
            "{} (top:{n}: {} x {n} values and token ids)",
            human(sizes.logits),
            crate::units::group_digits(layout.positions as u64),
        ),
        LogitsMode::All => format!(
            "{} (all: {} x {})",
            human(sizes.logits),
            crate::units::group_digits(layout.positions as u64),
            crate::units::group_digits(layout.vocab as u64)
        ),
    };
    let inputs = if layout.dump.is_some() {
        format!(" (raw inputs {})", human(sizes.indexer_inputs))
    } else {
        String::new()
    };
    eprintln!(
        "trace: {} to write to {}: logits {logits}, indexer {}{inputs}, other {} (tokens, \
         positions, header)",
        human(total),
        args.out.display(),
        human(sizes.indexer + sizes.indexer_inputs),
        human(sizes.other + header),
    );
}

/// Turns the flags into a [`TracePlan`], prepares the trace ([`trace::prepare`]), announces its
/// size, runs it and prints what it wrote.
pub fn run(args: &TraceArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let input = match (&args.tokens, &args.prompt) {
        (Some(file), _) => TraceInput::Tokens(file),
        (None, Some(path)) => TraceInput::Prompt(path),
        (None, None) => anyhow::bail!("expected --tokens FILE or --prompt FILE"),
    };
    let plan = TracePlan {
        model: &args.model,
        input,
        positions: args.positions.clone(),
        index: args.index,
        kv: args.kv,
        topk: args.topk,
        chunk: args.chunk,
        out: &args.out,
        dump_indexer_inputs: args.dump_indexer_inputs,
        logits: args.logits,
        device: args.device.choice(),
    };
    let v41 = matches!(
        crate::config::load_any(&args.model),
        Ok(crate::config::ModelDescription::V41(_))
    );
    if v41 {
        let opts = trace_v41::V41TraceOptions {
            candidate_blocks: args.candidate_blocks,
        };
        let done = trace_v41::run_v41(&plan, opts, &mut |bytes| {
            eprintln!(
                "trace: {} of tensors to write to {}",
                crate::units::human_bytes(bytes),
                args.out.display()
            )
        })?;
        return print_outcome(args, &done, "index source", out);
    }
    if args.candidate_blocks.is_some() {
        anyhow::bail!(
            "--candidate-blocks is a DeepSeek-V4.1 what-if (its candidate stage); {} is not a \
             DeepSeek-V4.1 model",
            args.model.display()
        );
    }
    let prepared = trace::prepare(&plan)?;
    announce_size(args, &prepared);
    let done = prepared.run()?;
    print_outcome(args, &done, "CSA layer", out)
}

/// The line of the outcome.
fn print_outcome(
    args: &TraceArgs,
    done: &trace::TraceOutcome,
    layers: &str,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    writeln!(
        out,
        "traced {}, {}, {} (index {}, kv {}, top-k {}, logits {}) on {} in {:.2} s -> {} ({})",
        crate::units::count_of(done.tokens, "token"),
        crate::units::count_of(done.positions, "position"),
        crate::units::count_of(done.csa_layers, layers),
        args.index,
        args.kv,
        done.topk,
        done.logits,
        done.backend,
        done.seconds,
        args.out.display(),
        done.file_bytes
            .map_or_else(|| "size unknown".to_string(), crate::units::human_bytes)
    )?;
    Ok(())
}
