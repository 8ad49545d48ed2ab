//! `needlescope probe`: its flags, their checks, and its output. One prompt (scenario, length,
//! depth, or a conversation), one forward pass per (driving index profile, top-k), run by
//! [`crate::run::probe`]; this file prints the needle's rank on every CSA layer under the
//! driving profile and each `--compare` profile, the diagnosis, why and conclusion
//! ([`crate::record::verdict`]), the attention table, and `--json` (docs/outputs.md).

use super::device::DeviceArgs;
use super::engine::EngineSection;
use super::flags::{parse_depth, parse_positive, parse_token_count};
use crate::numerics::profiles::{IndexProfile, KvMode};
use crate::probe::NeedlePrompt;
use crate::record::verdict;
use crate::record::{LayerRecord, ProbeRun};
use crate::run::probe::{EngineOnlyProbe, LocalProbe, ProbeOutcome, ProbePlan};
use crate::run::prompt::PromptSource;
use crate::units::f32_as_in_csv;
use clap::{Args, ValueEnum};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Which query positions are probed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ProbeSet {
    /// The last prompt token (it produces the first answer token) and every generated token but the last
    Answer,
    /// As `answer`, plus every token of the question
    Question,
}

#[derive(Args, Debug, Clone)]
pub struct ProbeArgs {
    /// Model directory: config.json, safetensors (sharded with index.json or single), tokenizer.json (the built-in V4 tokenizer if absent; the model must have its 129,280-token vocabulary); or a Hugging Face repo id (ORG/NAME) in the local cache (HF_HUB_CACHE, HF_HOME/hub or ~/.cache/huggingface/hub; never downloaded)
    #[arg(long, value_name = "DIR|ORG/NAME")]
    pub model: PathBuf,

    /// With --model ORG/NAME or a models--ORG--NAME directory of the Hugging Face cache: the ref
    /// (branch, tag) or commit whose snapshot to use [default: main]
    #[arg(long, value_name = "REV")]
    pub revision: Option<String>,

    /// Scenario: a built-in name (passkey, ...) or a scenario TOML file
    #[arg(long, value_name = "NAME|FILE", default_value = "passkey")]
    pub scenario: String,

    #[command(flatten)]
    pub conversation: super::prompt::ConversationArgs,

    /// Prompt length in tokens, e.g. 16000, 16k (= 16384) or 1m
    #[arg(long, allow_negative_numbers = true, value_name = "TOKENS", value_parser = parse_token_count, default_value = "16k")]
    pub length: usize,

    /// Needle depth in percent of the haystack: 0 = start, 100 = end
    #[arg(long, allow_negative_numbers = true, value_name = "PCT", value_parser = parse_depth, default_value = "50")]
    pub depth: f64,

    /// Driving index profiles, comma list (one run each): exact, fp8, bf16, bf16-qk, sglang-fp4, official-fp4, vllm-fp8, fp8-no-hadamard-k; on DeepSeek-V4.1 exact, bf16-qk, v41-fp4, sglang-v41-fp4, vllm-fp8 [default: fp8; v41-fp4 on DeepSeek-V4.1]
    #[arg(long, value_name = "PROFILES", value_delimiter = ',')]
    pub index: Vec<IndexProfile>,

    /// Extra profiles scored on the same hidden states (free counterfactuals), comma list; the
    /// other --index profiles are scored too, and exact whenever a rounding profile drives (it
    /// tells rounding from a too-small top-k: the `why:` lines)
    #[arg(long, value_name = "PROFILES", value_delimiter = ',')]
    pub compare: Vec<IndexProfile>,

    /// Top-k values, comma list, one run each [default: the config's index_topk]
    #[arg(long, allow_negative_numbers = true, value_name = "K", value_delimiter = ',', value_parser = parse_positive)]
    pub topk: Vec<usize>,

    /// Main KV rounding: exact (f32) or fp8 (e4m3 blocks of 64 on the non-RoPE dims); on DeepSeek-V4.1 exact or release (the release's window FP8 and compressed FP4) [default: fp8; release on DeepSeek-V4.1]
    #[arg(long, value_name = "MODE")]
    pub kv: Option<KvMode>,

    /// DeepSeek-V4.1 only: blocks the candidate stage keeps per query, for every run (a what-if: 2048 vs 4096) [default: the config's candidate_topk_blocks]
    #[arg(long, allow_negative_numbers = true, value_name = "BLOCKS", value_parser = parse_positive)]
    pub candidate_blocks: Option<usize>,

    #[arg(
        long = "generate",
        value_name = "N",
        value_parser = super::flags::parse_count,
        help = "Tokens to generate after the prompt (to check the answer; 0: judge by indexer recall only; a thinking-mode scenario needs enough to get past </think>) [default: 24; 0 on a synthetic model (written by synth), whose LM path does not answer]"
    )]
    pub generate_flag: Option<usize>,

    /// `--generate` resolved for the model ([`super::generate_default`]).
    #[arg(skip)]
    pub generate: usize,

    /// Prefill chunk in tokens, or auto: 2048 on the CPU, on GPUs the largest of 8192, 4096 and 2048 that fits (results equal up to f32 rounding: a chunk changes GEMM shapes and so summation order)
    #[arg(long, value_name = "TOKENS|auto", value_parser = super::flags::parse_chunk, default_value = "auto")]
    pub chunk: usize,

    #[command(flatten)]
    pub device: DeviceArgs,

    /// Probed positions
    #[arg(long, value_enum, default_value_t = ProbeSet::Answer)]
    pub probe: ProbeSet,

    /// Print one JSON object (prompt and runs) instead of tables
    #[arg(long)]
    pub json: bool,

    /// Also write the records into this report directory (run.json, cells.csv, layers.csv, attention.csv, summary.json, PNGs; `report DIR` re-renders them); probes with the same model, scenario, --kv, --seed, --generate, --compare and --probe may share one
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,

    /// Seed of the needle value and the haystack
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = super::flags::parse_seed)]
    pub seed: u64,

    /// Haystack text for scenarios whose haystack kind is `file` (the built-in `essay`, say)
    #[arg(long, value_name = "FILE")]
    pub haystack_file: Option<PathBuf>,

    #[command(flatten)]
    pub needles: super::prompt::NeedlesArgs,

    #[command(flatten)]
    pub engine: super::engine::EngineArgs,
}

/// Checks the flags, runs the probe ([`crate::run::probe`]) and prints its tables or JSON; then
/// the runs are recorded into `--out` and a stop by Ctrl-C is reported.
pub fn run(args: &ProbeArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    use crate::run::checks::refuse_duplicates;
    let (index, kv) = super::family_defaults(&args.model, &args.index, args.kv);
    let args = &ProbeArgs {
        index,
        kv: Some(kv),
        ..args.clone()
    };
    refuse_duplicates("--index", &args.index, |p| p.name())?;
    refuse_duplicates("--compare", &args.compare, |p| p.name())?;
    if let Some(note) = crate::run::checks::compare_of_index_note(&args.index, &args.compare) {
        eprintln!("note: {note}");
    }
    refuse_duplicates("--topk", &args.topk, |&k| k)?;
    refuse_duplicates("--needle", &args.conversation.needle, |n| n.clone())?;
    args.engine.check()?;
    if args.engine.is_set() {
        if args.index.len() > 1 {
            anyhow::bail!(
                "--index: expected one profile with --engine (it drives the reference; every \
                 profile is scored and held against the engine), found {}",
                args.index.len()
            );
        }
        if !args.topk.is_empty() {
            anyhow::bail!(
                "--topk: the engine's K is the top-k with --engine (read from its payload; \
                 --engine-topk names it when the payload reads two ways)"
            );
        }
    }
    let plan = ProbePlan {
        model: &args.model,
        prompt: prompt_source(args),
        indexes: args.index.clone(),
        compare: args.compare.clone(),
        topks: args.topk.clone(),
        kv,
        generate: args.generate,
        chunk: args.chunk,
        device: args.device.choice(),
        probe_question: args.probe == ProbeSet::Question,
        out: args.out.as_deref(),
        engine: args.engine.plan(),
        candidate_blocks: args.candidate_blocks,
    };
    let stderr = &mut std::io::stderr();
    let v41 = matches!(
        crate::config::load_any(&args.model),
        Ok(crate::config::ModelDescription::V41(_))
    );
    let outcome = match v41 {
        true => ProbeOutcome::Local(Box::new(crate::run::probe_v41::run_v41(&plan)?)),
        false => crate::run::probe::run(&plan)?,
    };
    match outcome {
        // Stopped by Ctrl-C before any run finished: nothing to print or record.
        ProbeOutcome::Local(probe) if probe.runs.is_empty() => probe.finish(stderr),
        ProbeOutcome::Local(probe) => {
            match args.json {
                true => print_json(out, &args.model, &probe)?,
                false => print_tables(out, &probe)?,
            }
            probe.finish(stderr)
        }
        ProbeOutcome::EngineOnly(probe) => {
            match args.json {
                true => print_engine_only_json(out, &args.model, &probe)?,
                false => print_engine_only(out, &probe)?,
            }
            probe.finish(stderr)
        }
    }
}

/// `probe --json` of a local probe (docs/outputs.md).
fn print_json(out: &mut dyn Write, model: &Path, probe: &LocalProbe) -> anyhow::Result<()> {
    let last = probe.prompt.tokens.len() - 1;
    let needle_texts: Vec<String> = probe
        .prompt
        .needles
        .iter()
        .map(|n| n.text.clone())
        .collect();
    let judge_answers = probe.judge_answers;
    let mut obj = serde_json::json!({
        "model": model.display().to_string(),
        "synthetic": probe.marks.synthetic,
        "backend": probe.backend,
        "scenario": probe.scenario.name,
        "prompt": prompt_json(&probe.prompt),
        "runs": probe.runs.iter().map(|r| Ok(serde_json::json!({
            "cell_id": r.cell_id,
            "index": r.index,
            "kv": r.kv,
            "topk": r.topk,
            "answer_text": r.answer_text,
            "answer_correct": judge_answers.then_some(r.answer_correct).flatten(),
            "layers": f32_as_in_csv(serde_json::to_value(&r.layers)?),
            "attention": f32_as_in_csv(serde_json::to_value(&r.attention)?),
            "lost_layers": verdict::lost_layers(r, last),
            "why": verdict::why(r, last),
        }))).collect::<serde_json::Result<Vec<_>>>()?,
        "diagnosis": verdict::diagnosis(&probe.runs, last),
        "conclusion": verdict::conclusion(&probe.runs, last, judge_answers, &needle_texts),
    });
    if let Some(section) = local_engine_section(probe) {
        obj["engine"] = super::engine::engine_json(&section);
    }
    writeln!(out, "{}", serde_json::to_string_pretty(&obj)?)?;
    Ok(())
}

/// `probe --json` of the engine alone.
fn print_engine_only_json(
    out: &mut dyn Write,
    model: &Path,
    probe: &EngineOnlyProbe,
) -> anyhow::Result<()> {
    let obj = serde_json::json!({
        "model": model.display().to_string(),
        "synthetic": probe.marks.synthetic,
        "scenario": probe.scenario.name,
        "local": false,
        "prompt": prompt_json(&probe.prompt),
        "runs": [],
        "engine": super::engine::engine_json(&engine_only_section(probe)),
    });
    writeln!(out, "{}", serde_json::to_string_pretty(&obj)?)?;
    Ok(())
}

/// The text of a probe of the engine alone.
fn print_engine_only(out: &mut dyn Write, probe: &EngineOnlyProbe) -> anyhow::Result<()> {
    writeln!(
        out,
        "{} | {} tokens | {} | answer {:?} | engine only (no local forward)",
        probe.scenario.name,
        probe.prompt.tokens.len(),
        crate::units::count_of(probe.prompt.needles.len(), "needle"),
        probe.prompt.answer_value
    )?;
    super::engine::print_engine(out, &engine_only_section(probe))
}

/// The engine section of a local probe with `--engine`: the engine against the first run.
fn local_engine_section(probe: &LocalProbe) -> Option<EngineSection<'_>> {
    let (e, run) = (probe.engine.as_ref()?, probe.runs.first()?);
    Some(EngineSection {
        capture: &e.capture,
        engine_records: &run.engine_records,
        reference: &run.layers,
        verdict: &e.verdict,
        answer_correct: e.answer_correct,
        driving: Some(&run.index),
        needles: probe.prompt.needles.len(),
    })
}

/// The engine section of a probe of the engine alone (no reference records).
fn engine_only_section(probe: &EngineOnlyProbe) -> EngineSection<'_> {
    EngineSection {
        capture: &probe.capture,
        engine_records: probe.engine_records(),
        reference: &[],
        verdict: &probe.verdict,
        answer_correct: probe.cell.cell.answer_correct,
        driving: None,
        needles: probe.prompt.needles.len(),
    }
}

/// `probe --json`'s `prompt` object.
fn prompt_json(prompt: &NeedlePrompt) -> serde_json::Value {
    serde_json::json!({
        "tokens": prompt.tokens,
        "length": prompt.tokens.len(),
        "depth_pct": prompt.depth_pct,
        "actual_depth_pct": prompt.actual_depth_pct,
        "needle": [prompt.needle.0, prompt.needle.1],
        "needles": super::prompt::needles_json(prompt),
        "answer_span": [prompt.answer.0, prompt.answer.1],
        "needle_text": prompt.needle_text,
        "answer_value": prompt.answer_value,
    })
}

/// The prompt flags of a probe.
fn prompt_source(args: &ProbeArgs) -> PromptSource<'_> {
    match &args.conversation.prompt {
        Some(path) => PromptSource::Conversation {
            path,
            needles: &args.conversation.needle,
            answer: args.conversation.answer.as_deref(),
        },
        None => PromptSource::Scenario {
            name: &args.scenario,
            haystack_file: args.haystack_file.as_deref(),
            length: args.length,
            depth: args.depth,
            seed: args.seed,
            needles: args.needles.count(),
        },
    }
}

// ---------------------------------------------------------------------------------------------
// `needlescope probe`'s text output: the per-layer table of the needle's rank, score and margin
// under the driving profile and each `--compare` profile, the answer line, and the other
// probed positions (question tokens, generated tokens) grouped into ranges.

/// What the columns of a probe's per-layer tables mean (docs/architecture.md section 4), printed
/// under them as the sweep's summary prints [`crate::report::summary::summary_legend`].
pub const PROBE_LEGEND: &str = "\nlegend: visible: compressed rows the query can see, n_t = \
     floor((query + 1) / 4) (one row per 4 tokens); needle: those holding a needle token.\n\
     rank[p]: the needle's best row under profile p, 1 + rows scoring strictly higher (-: no \
     needle row visible); the first is the driving profile, the one the run selected with.\n\
     margin: needle score minus the k-th best score under the driving profile (>= 0: inside \
     the top-k); selected: rank <= k.\n\
     trivial: n_t <= k, every visible row is kept, so the layer cannot lose the needle and \
     does not count.\n";

/// The legend of DeepSeek-V4.1's stage columns, printed after [`PROBE_LEGEND`] when a run has
/// them.
pub const STAGE_LEGEND: &str = "DeepSeek-V4.1: visible counts the index source's rows (one \
     per 2 tokens on ratio-2 layers, one per token on ratio 1); stage: index (ranks every \
     row), candidate_source (its own top-k among every row; block: the rank of the needle's \
     best block of candidate_block_size rows among the query's blocks, the newest pinned \
     first, and whether it was kept), reindex (ranks only rows in the kept blocks: rank is \
     inside them, a needle row outside ranks below every kept row; block: whether a needle \
     row is in a kept block; unmasked: its rank without the mask); verdict: candidate_miss \
     (the candidate stage dropped every needle block), topk_miss (kept but below the top-k), \
     kept.\n";

/// The header line naming the layers whose selections are ranked: V4's CSA layers, or
/// V4.1's index sources with their stage and the layers that reuse each one's selection.
fn index_layers_line(roles: &crate::config::LayerRoles) -> String {
    use crate::config::CandidateStage;
    let indexed = roles.indexed_layers();
    if roles.iter().all(|r| {
        r.candidate_stage == CandidateStage::None && r.kind != crate::config::LayerKind::Csa2
    }) {
        return format!("CSA layers: {indexed:?}");
    }
    let parts: Vec<String> = indexed
        .iter()
        .map(|&l| {
            let role = roles.get(l);
            let what = match role.candidate_stage {
                CandidateStage::Source => "candidate source".to_string(),
                CandidateStage::Consumer { source } => format!("reindex in {source}'s blocks"),
                CandidateStage::None => format!("ratio {}", role.ratio),
            };
            let reusers: Vec<usize> = roles
                .iter()
                .filter(|r| r.index_source == Some(l) && r.layer != l)
                .map(|r| r.layer)
                .collect();
            match reusers.as_slice() {
                [] => format!("{l} ({what})"),
                [one] => format!("{l} ({what}; reused by {one})"),
                [first, .., last] => format!("{l} ({what}; reused by {first}-{last})"),
            }
        })
        .collect();
    format!("index layers: {}", parts.join(", "))
}

fn fmt_opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or("-".to_string(), |x| x.to_string())
}

/// The text of a local probe: the diagnosis, the prompt line, one table per run with its
/// `why:`, the other probed positions, the legend, the attention table, the conclusion, and the
/// engine's section with `--engine`.
fn print_tables(out: &mut dyn Write, probe: &LocalProbe) -> anyhow::Result<()> {
    let LocalProbe {
        roles,
        scenario,
        prompt,
        opts,
        runs,
        backend,
        marks,
        judge_answers,
        ..
    } = probe;
    let judge_answers = *judge_answers;
    let last = prompt.tokens.len() - 1;
    if marks.synthetic {
        write!(out, "{}", crate::report::SYNTHETIC_LINE)?;
    }
    writeln!(out, "diagnosis: {}", verdict::diagnosis(runs, last))?;
    // Same rule as the sweep's lines: more than a point off the request is said.
    let asked = if (prompt.actual_depth_pct - prompt.depth_pct).abs() > 1.0 {
        format!(
            ", asked {}%: the nearest place the haystack offers",
            prompt.depth_pct
        )
    } else {
        String::new()
    };
    if prompt.needles.len() == 1 && prompt.needles[0].location == "haystack" {
        writeln!(
            out,
            "scenario {} | {} tokens | needle at depth {:.1}% (tokens {}..{}{asked}) | answer value {:?}",
            scenario.name,
            prompt.tokens.len(),
            prompt.actual_depth_pct,
            prompt.needle.0,
            prompt.needle.1,
            prompt.answer_value
        )?;
    } else {
        writeln!(
            out,
            "{} | {} tokens | {} | answer {:?}",
            scenario.name,
            prompt.tokens.len(),
            crate::units::count_of(prompt.needles.len(), "needle"),
            prompt.answer_value
        )?;
        for (i, n) in prompt.needles.iter().enumerate() {
            writeln!(
                out,
                "  needle {i}: tokens {}..{} in {}: {:?}",
                n.span.0, n.span.1, n.location, n.span_text
            )?;
        }
    }
    writeln!(
        out,
        "{}; ranks at the answer position (query {last}); rank 1 = best",
        index_layers_line(roles)
    )?;
    writeln!(out, "backend {backend}")?;
    for run in runs {
        writeln!(out)?;
        writeln!(
            out,
            "== index {} | kv {} | top-{} | answer {:?} -> {} ({:.1} s)",
            run.index,
            run.kv,
            run.topk,
            run.answer_text,
            match (judge_answers, run.answer_correct) {
                (false, _) if opts.generate == 0 => "no verdict (--generate 0: nothing generated)",
                (false, _) => "no verdict (synthetic model: its LM path does not answer)",
                (true, Some(true)) => "CORRECT",
                (true, Some(false)) => "WRONG",
                (true, None) =>
                    "no verdict (--generate stopped it before its answer ended: raise --generate)",
            },
            run.wall_seconds
        )?;
        let mut profiles = vec![run.index.clone()];
        profiles.extend(
            opts.compare
                .iter()
                .map(|p| p.name().to_string())
                .filter(|p| *p != run.index),
        );
        let several = prompt.needles.len() > 1;
        write!(out, "{:>5} {:>8} {:>7}", "layer", "visible", "needle")?;
        if several {
            write!(out, " {:>2}", "#")?;
        }
        for p in &profiles {
            write!(out, " {:>14}", format!("rank[{p}]"))?;
        }
        let staged = run.layers.iter().any(|r| r.stage.is_some());
        write!(out, " {:>10} {:>9} {:>7}", "margin", "selected", "trivial")?;
        if staged {
            write!(
                out,
                " {:>16} {:>12} {:>9} {:>14}",
                "stage", "block", "unmasked", "verdict"
            )?;
        }
        writeln!(out)?;
        let here: Vec<&LayerRecord> = run.layers.iter().filter(|r| r.query_pos == last).collect();
        for driving in here.iter().filter(|r| r.driving) {
            write!(
                out,
                "{:>5} {:>8} {:>7}",
                driving.layer, driving.visible_rows, driving.needle_rows
            )?;
            if several {
                write!(out, " {:>2}", driving.needle)?;
            }
            for p in &profiles {
                let rank = here
                    .iter()
                    .find(|r| {
                        r.layer == driving.layer && r.needle == driving.needle && &r.profile == p
                    })
                    .and_then(|r| r.needle_rank);
                write!(out, " {:>14}", fmt_opt(rank))?;
            }
            write!(
                out,
                " {:>10} {:>9} {:>7}",
                driving.margin.map_or("-".into(), |m| format!("{m:+.4}")),
                if driving.selected { "yes" } else { "NO" },
                if driving.trivial { "yes" } else { "no" }
            )?;
            if staged {
                let block = match (driving.block_rank, driving.block_kept) {
                    (Some(r), Some(k)) => format!("{r} {}", if k { "kept" } else { "DROPPED" }),
                    (None, Some(true)) => "in kept".into(),
                    (None, Some(false)) => "NOT KEPT".into(),
                    _ => "-".into(),
                };
                write!(
                    out,
                    " {:>16} {:>12} {:>9} {:>14}",
                    driving.stage.map_or("-", |s| s.name()),
                    block,
                    fmt_opt(driving.unconstrained_rank),
                    driving.stage_verdict.map_or("-", |v| v.name())
                )?;
            }
            writeln!(out)?;
        }
        if let Some(why) = verdict::why(run, last) {
            writeln!(out, "why: {why}")?;
        }
        print_other_positions(out, run, last)?;
    }
    if !runs.is_empty() {
        write!(out, "{PROBE_LEGEND}")?;
    }
    if runs
        .iter()
        .any(|r| r.layers.iter().any(|l| l.stage.is_some()))
    {
        write!(out, "{STAGE_LEGEND}")?;
    }
    if let Some(run) = runs.first() {
        writeln!(out)?;
        writeln!(
            out,
            "attention on the needle at the answer position (index {}, top-{}): share of the softmax on window tokens in the needle span plus compressed rows holding needle tokens",
            run.index, run.topk
        )?;
        writeln!(
            out,
            "{:>5} {:>5} {:>12} {:>12} {:>10} {:>10}",
            "layer", "type", "mass (mean)", "mass (max h)", "in window", "sink"
        )?;
        for a in run.attention.iter().filter(|a| a.query_pos == last) {
            writeln!(
                out,
                "{:>5} {:>5} {:>12.4} {:>12.4} {:>10} {:>10.4}",
                a.layer,
                a.layer_type,
                a.needle_mass_mean,
                a.needle_mass_max_head,
                if a.needle_in_window { "yes" } else { "no" },
                a.sink_mass_mean
            )?;
        }
    }
    writeln!(out)?;
    let needle_texts: Vec<String> = prompt.needles.iter().map(|n| n.text.clone()).collect();
    writeln!(
        out,
        "conclusion: {}",
        verdict::conclusion(runs, last, judge_answers, &needle_texts)
    )?;
    if let Some(section) = local_engine_section(probe) {
        super::engine::print_engine(out, &section)?;
    }
    Ok(())
}

/// The probed positions other than the answer position (question tokens with `--probe
/// question`, generated tokens) under the driving profile: the worst needle rank over the CSA
/// layers and how many non-trivial layers selected the needle. Consecutive positions of the
/// same phase kind (prompt or decode) with the same figures share one line (`8192-8214`,
/// phases `1-23`), so a long generation does not print a screen of identical rows (every
/// record is in `--json` and `--out`).
fn print_other_positions(out: &mut dyn Write, run: &ProbeRun, last: usize) -> anyhow::Result<()> {
    let mut positions: Vec<(usize, &str)> = run
        .layers
        .iter()
        .filter(|r| r.driving && r.query_pos != last)
        .map(|r| (r.query_pos, r.phase.as_str()))
        .collect();
    positions.sort_unstable();
    positions.dedup();
    if positions.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "other probed positions ({} under {}): worst needle rank over the {}s",
        positions.len(),
        run.index,
        crate::record::verdict::layer_word(run)
    )?;
    writeln!(
        out,
        "{:>13} {:>7} {:>10} {:>22}",
        "query", "phase", "worst rank", "selected/non-trivial"
    )?;
    // (first position, last position, first phase, last phase, figures)
    type Group<'a> = (
        usize,
        usize,
        &'a str,
        &'a str,
        (Option<usize>, usize, usize),
    );
    let mut groups: Vec<Group> = Vec::new();
    for (pos, phase) in positions {
        let here: Vec<&LayerRecord> = run
            .layers
            .iter()
            .filter(|r| r.driving && r.query_pos == pos)
            .collect();
        let worst = here.iter().filter_map(|r| r.needle_rank).max();
        let (selected, nontrivial) = crate::record::layers_selected(here.iter().copied());
        let figures = (worst, selected, nontrivial);
        match groups.last_mut() {
            Some(g)
                if g.1 + 1 == pos && g.4 == figures && (g.3 == "prompt") == (phase == "prompt") =>
            {
                g.1 = pos;
                g.3 = phase;
            }
            _ => groups.push((pos, pos, phase, phase, figures)),
        }
    }
    for (first, last_pos, phase0, phase1, (worst, selected, nontrivial)) in groups {
        let span = |a: String, b: String| if a == b { a } else { format!("{a}-{b}") };
        writeln!(
            out,
            "{:>13} {:>7} {:>10} {:>22}",
            span(first.to_string(), last_pos.to_string()),
            span(phase0.to_string(), phase1.to_string()),
            fmt_opt(worst),
            format!("{selected}/{nontrivial}")
        )?;
    }
    Ok(())
}
