//! `needlescope sweep`: the grid lengths x depths x index profiles x top-k, one probe per cell,
//! records appended and flushed to `cells.csv` / `layers.csv` / `attention.csv` so an
//! interrupted sweep resumes by skipping finished cells (docs/outputs.md).

use clap::Args;
use std::io::Write;
use std::path::PathBuf;

use super::device::DeviceArgs;
use super::flags::{parse_positive, parse_token_count, DepthList};
use crate::numerics::profiles::{IndexProfile, KvMode};
use crate::run::sweep::{run_sweep, SweepPlan};

#[derive(Args, Debug, Clone)]
pub struct SweepArgs {
    /// Model directory: config.json, safetensors, tokenizer.json (the built-in V4 tokenizer if absent; the model must have its 129,280-token vocabulary); or a Hugging Face repo id (ORG/NAME) in the local cache (HF_HUB_CACHE, HF_HOME/hub or ~/.cache/huggingface/hub; never downloaded)
    #[arg(long, value_name = "DIR|ORG/NAME")]
    pub model: PathBuf,

    /// With --model ORG/NAME or a models--ORG--NAME directory of the Hugging Face cache: the ref
    /// (branch, tag) or commit whose snapshot to use [default: main]
    #[arg(long, value_name = "REV")]
    pub revision: Option<String>,

    /// Scenario: a built-in name (passkey, ...) or a scenario TOML file
    #[arg(long, value_name = "NAME|FILE", default_value = "passkey")]
    pub scenario: String,

    /// Prompt lengths in tokens, comma list (k = 1024, m = 1048576)
    #[arg(long, allow_negative_numbers = true, value_name = "TOKENS", value_delimiter = ',', value_parser = parse_token_count, default_value = "2k,4k,8k,16k,32k")]
    pub lengths: Vec<usize>,

    /// Needle depths in percent: a comma list (10,50,90) or start:stop:step (0:100:10)
    #[arg(
        long,
        allow_negative_numbers = true,
        value_name = "PCTS",
        default_value = "0:100:10"
    )]
    pub depths: DepthList,

    /// Driving index profiles, comma list: exact, fp8, bf16, bf16-qk, sglang-fp4, official-fp4, vllm-fp8, fp8-no-hadamard-k; on DeepSeek-V4.1 exact, bf16-qk, v41-fp4, sglang-v41-fp4, vllm-fp8 [default: fp8; v41-fp4 on DeepSeek-V4.1]
    #[arg(long, value_name = "PROFILES", value_delimiter = ',')]
    pub index: Vec<IndexProfile>,

    /// Extra profiles scored on the same hidden states (free counterfactuals), comma list; the
    /// other --index profiles are scored too, and exact whenever a rounding profile drives (it
    /// tells rounding from a too-small top-k: the summary's `exact keeps`)
    #[arg(long, value_name = "PROFILES", value_delimiter = ',')]
    pub compare: Vec<IndexProfile>,

    /// Top-k values, comma list [default: the config's index_topk]
    #[arg(long, allow_negative_numbers = true, value_name = "K", value_delimiter = ',', value_parser = parse_positive)]
    pub topk: Vec<usize>,

    /// Main KV rounding: exact or fp8; on DeepSeek-V4.1 exact or release [default: fp8; release on DeepSeek-V4.1]
    #[arg(long, value_name = "MODE")]
    pub kv: Option<KvMode>,

    /// DeepSeek-V4.1 only: blocks the candidate stage keeps per query, for every cell [default: the config's candidate_topk_blocks]
    #[arg(long, allow_negative_numbers = true, value_name = "BLOCKS", value_parser = parse_positive)]
    pub candidate_blocks: Option<usize>,

    /// Prompts per cell (different haystack seeds)
    #[arg(long, allow_negative_numbers = true, value_name = "N", value_parser = parse_positive, default_value = "1")]
    pub samples: usize,

    #[arg(
        long,
        value_name = "DIR",
        help = "Report directory (created; an existing one is resumed) [default: reports/<scenario>-<time>]"
    )]
    pub out: Option<PathBuf>,

    /// Prefill chunk in tokens, or auto: 2048 on the CPU, on GPUs the largest of 8192, 4096 and 2048 that fits (results equal up to f32 rounding: a chunk changes GEMM shapes and so summation order)
    #[arg(long, value_name = "TOKENS|auto", value_parser = super::flags::parse_chunk, default_value = "auto")]
    pub chunk: usize,

    #[command(flatten)]
    pub device: DeviceArgs,

    #[command(flatten)]
    pub engine: super::engine::EngineServerArgs,

    /// Seed of the needle values and haystacks (sample i uses seed + i)
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = super::flags::parse_seed)]
    pub seed: u64,

    #[arg(
        long = "generate",
        value_name = "N",
        value_parser = super::flags::parse_count,
        help = "Maximum generated tokens per cell (greedy, stops at EOS; 0: judge by indexer recall only; a thinking-mode scenario needs enough to get past </think>) [default: 24; 0 on a synthetic model (written by synth), whose LM path does not answer]"
    )]
    pub generate_flag: Option<usize>,

    /// `--generate` resolved for the model ([`super::generate_default`]).
    #[arg(skip)]
    pub generate: usize,

    /// Haystack text for scenarios whose haystack kind is `file` (the built-in `essay`, say)
    #[arg(long, value_name = "FILE")]
    pub haystack_file: Option<PathBuf>,
}

pub fn run(args: &SweepArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    args.engine.check()?;
    if args.engine.engine.is_some() && !args.topk.is_empty() {
        anyhow::bail!(
            "--topk: the engine's K is the top-k with --engine (--engine-topk names it when it \
             is not the config's index_topk)"
        );
    }
    let config_topk = match crate::config::load_any(&args.model)? {
        crate::config::ModelDescription::V4(cfg) => cfg.index_topk,
        crate::config::ModelDescription::V41(cfg) => cfg.text.index_topk,
    };
    let (index, kv) = super::family_defaults(&args.model, &args.index, args.kv);
    let plan = SweepPlan {
        scenario: args.scenario.clone(),
        lengths: args.lengths.clone(),
        depths: args.depths.0.clone(),
        indexes: index,
        compare: args.compare.clone(),
        topks: match (&args.engine.engine, args.topk.is_empty()) {
            // The engine's K is the top-k (checked against each capture).
            (Some(_), _) => vec![args.engine.engine_topk.unwrap_or(config_topk)],
            (None, true) => vec![config_topk],
            (None, false) => args.topk.clone(),
        },
        kv,
        samples: args.samples,
        seed: args.seed,
        generate: args.generate,
        chunk: args.chunk,
        haystack_file: args.haystack_file.clone(),
        engine: args
            .engine
            .engine
            .as_ref()
            .map(|url| crate::run::sweep::SweepEngine {
                url: url.clone(),
                timeout: std::time::Duration::from_secs(args.engine.engine_timeout as u64),
                topk: args.engine.engine_topk,
            }),
        candidate_blocks: args.candidate_blocks,
    };
    let dir = match &args.out {
        Some(d) => d.clone(),
        None => PathBuf::from("reports").join(format!(
            "{}-{}",
            args.scenario.replace(['/', '.'], "_"),
            crate::record::rfc3339_utc(std::time::SystemTime::now()).replace(':', "")
        )),
    };
    if args.engine.engine_only(&args.model) {
        let done = crate::run::engine_only::run_engine_only_sweep(&args.model, &plan, &dir, out)?;
        writeln!(
            out,
            "{} cells run, {} already finished; records in {} (engine only: engine_cells.csv, \
             engine.csv)",
            done.cells_run,
            done.cells_skipped,
            dir.display()
        )?;
        write!(out, "{}", done.table)?;
        return Ok(());
    }
    let outcome = run_sweep(&args.model, &plan, &dir, &args.device.choice(), out)?;
    writeln!(
        out,
        "{} cells run, {} already finished; records in {}",
        outcome.cells_run,
        outcome.cells_skipped,
        dir.display()
    )?;
    // Rendered under the sweep's own lock, so no other writer gets in between.
    let done = crate::report::rerender_locked(&outcome.lock, crate::report::stdout_wants_colour())?;
    // The lock goes; Ctrl-C keeps saying that every cell is finished until the process ends.
    let crate::run::sweep::SweepOutcome {
        lock, rendering, ..
    } = outcome;
    drop(lock);
    write!(out, "{}", done.table)?;
    writeln!(out, "{}", done.files_line(&dir))?;
    drop(rendering);
    Ok(())
}
