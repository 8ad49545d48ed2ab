//! `needlescope probe`: one prompt (scenario, length, depth), one forward pass per (driving
//! index profile, top-k); reports the needle's rank on every CSA layer under the driving profile
//! and each `--compare` profile, and whether the generated answer is right (docs/architecture.md section 3, docs/outputs.md).

use super::device::DeviceArgs;
use super::flags::{parse_depth, parse_positive, parse_token_count};
use crate::backend::Backend;
use crate::checkpoint::Checkpoint;
use crate::devices::placement::Workload;
use crate::model::forward::{Engine, EngineOptions};
use crate::numerics::profiles::{IndexProfile, KvMode};
use crate::probe::session::{conclusion, run_probe, ProbeOptions, ProbeProgress};
use crate::probe::{NeedlePrompt, Scenario};
use crate::record::{config_hash, BackendRecord, LayerRecord, ProbeRun, RunInfo};
use crate::report::RunDir;
use crate::run::target::{EngineTask, Target};
use crate::tokenizer::V4Tokenizer;
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

    /// Driving index profiles, comma list (one run each): exact, fp8, bf16, bf16-qk, sglang-fp4, official-fp4, vllm-fp8, fp8-no-hadamard-k
    #[arg(
        long,
        value_name = "PROFILES",
        value_delimiter = ',',
        default_value = "fp8"
    )]
    pub index: Vec<IndexProfile>,

    /// Extra profiles scored on the same hidden states (free counterfactuals), comma list; the
    /// other --index profiles are scored too, and exact whenever a rounding profile drives
    #[arg(long, value_name = "PROFILES", value_delimiter = ',')]
    pub compare: Vec<IndexProfile>,

    /// Top-k values, comma list, one run each [default: the config's index_topk]
    #[arg(long, allow_negative_numbers = true, value_name = "K", value_delimiter = ',', value_parser = parse_positive)]
    pub topk: Vec<usize>,

    /// Main KV rounding: exact (f32) or fp8 (e4m3 blocks of 64 on the non-RoPE dims)
    #[arg(long, value_name = "MODE", default_value = "fp8")]
    pub kv: KvMode,

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

/// The probe's body on a loaded engine of any backend.
struct ProbeTask<'a> {
    tok: &'a V4Tokenizer,
    scenario: &'a Scenario,
    prompt: &'a NeedlePrompt,
    opts: &'a ProbeOptions,
    progress: &'a mut dyn ProbeProgress,
}

impl EngineTask for ProbeTask<'_> {
    type Output = Vec<ProbeRun>;
    fn run<B: Backend>(self, engine: &mut Engine<B>) -> anyhow::Result<Vec<ProbeRun>> {
        run_probe(
            engine,
            self.tok,
            self.scenario,
            self.prompt,
            self.opts,
            "",
            self.progress,
            &crate::run::interrupt::stop_requested,
        )
    }
}

pub fn run(args: &ProbeArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    use crate::run::checks::refuse_duplicates;
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
        if args.engine.server.no_local || !super::engine::has_weights(&args.model) {
            return run_engine_only(args, out);
        }
    }
    if args.conversation.prompt.is_some() && args.conversation.answer.is_none() && args.generate > 0
    {
        anyhow::bail!(
            "--prompt: expected --answer TEXT (what a correct reply contains) to judge the \
             generated answer, or --generate 0 to judge by the indexer alone"
        );
    }
    let ckpt = crate::run::target::open_model(&args.model)?;
    let cfg = ckpt.config().clone();
    cfg.require_csa_layer(&args.model.join("config.json"))?;
    crate::run::checks::refuse_topk_past_rows("--topk", &args.topk, &cfg)?;
    let positions = crate::run::checks::positions_taken(args.length, args.generate);
    if args.conversation.prompt.is_none() && positions > cfg.max_position_embeddings {
        anyhow::bail!(
            "--length {} with --generate {}: expected at most the model's \
             max_position_embeddings ({}) positions, found {positions}",
            args.length,
            args.generate,
            cfg.max_position_embeddings
        );
    }
    // The tokenizer (cheap, checked against the config) and a conversation's prompt (its
    // length sizes the work), then the backend: a device that cannot be used, or a model that
    // does not fit, fails before a scenario's prompt is built (exactly `--length` tokens).
    let tok = crate::run::target::load_tokenizer(&args.model, &cfg)?;
    let source = prompt_source(args);
    let built = match &args.conversation.prompt {
        Some(_) => Some(source.build(&tok, cfg.max_position_embeddings, args.generate)?),
        None => None,
    };
    let length = built.as_ref().map_or(args.length, |(_, p)| p.tokens.len());
    let work = Workload {
        context: length + args.generate,
        chunk: args.chunk,
        topk: args
            .topk
            .iter()
            .copied()
            .max()
            .or(args.engine.engine_topk())
            .unwrap_or(cfg.index_topk),
    };
    let target = Target::prepare(&args.device.choice(), &ckpt, &work)?;
    let backend = target.record();
    let (scenario, prompt) = match built {
        Some(built) => built,
        None => source.build(&tok, cfg.max_position_embeddings, args.generate)?,
    };
    let marks = crate::run::sweep::model_marks(&args.model);
    let judge_answers = marks.judges_answers(args.generate);
    if let Some(note) = scenario
        .thinking_note(args.generate)
        .filter(|_| judge_answers)
    {
        eprintln!("note: {note}");
    }
    let needle_texts: Vec<String> = prompt.needles.iter().map(|n| n.text.clone()).collect();
    // The serving engine's capture first: its K is the runs' top-k, its tokens their answer.
    let capture = match args.engine.is_set() {
        true => Some(std::sync::Arc::new(args.engine.capture(
            &prompt.tokens,
            args.generate,
            &capture_expect(args, &cfg, &tok, &prompt),
        )?)),
        false => None,
    };
    let topks = match &capture {
        Some(c) => vec![c.topk],
        None if args.topk.is_empty() => vec![cfg.index_topk],
        None => args.topk.clone(),
    };
    let compare = match &capture {
        Some(_) => crate::probe::served::scored_with_engine(&args.index, &args.compare),
        None => with_exact(&args.index, &args.compare),
    };
    let opts = ProbeOptions {
        indexes: args.index.clone(),
        compare: crate::probe::session::comparison_profiles(&args.index, &compare),
        topks,
        kv: args.kv,
        generate: args.generate,
        chunk: target.chunk(),
        probe_question: args.probe == ProbeSet::Question,
        served: capture.clone(),
    };
    // The records directory is checked before the model runs.
    let store = match &args.out {
        Some(dir) => Some(open(dir, args, &ckpt, &scenario, backend.clone())?),
        None => None,
    };
    // Ctrl-C stops after the run in flight; the finished runs are printed and recorded.
    let _stoppable = crate::run::interrupt::Resumable::recorded_in(args.out.as_deref());
    let mut progress = BarProgress::new();
    let task = ProbeTask {
        tok: &tok,
        scenario: &scenario,
        prompt: &prompt,
        opts: &opts,
        progress: &mut progress,
    };
    let runs = target.run(&ckpt, EngineOptions::default(), task)?;
    progress.finish();
    // Checked before anything is printed or recorded: ranks that do not follow from what the
    // engine selected must reach neither the terminal nor a report.
    for run in &runs {
        run.check_selection().map_err(|why| {
            let not = if store.is_some() {
                "no run was printed or recorded"
            } else {
                "no run was printed"
            };
            anyhow::anyhow!("{why}; {not}")
        })?;
    }
    let last = prompt.tokens.len() - 1;
    if args.json {
        let obj = serde_json::json!({
            "model": args.model.display().to_string(),
            "synthetic": marks.synthetic,
            "backend": backend,
            "scenario": scenario.name,
            "prompt": prompt_json(&prompt),
            "runs": runs.iter().map(|r| Ok(serde_json::json!({
                "cell_id": r.cell_id,
                "index": r.index,
                "kv": r.kv,
                "topk": r.topk,
                "answer_text": r.answer_text,
                "answer_correct": judge_answers.then_some(r.answer_correct).flatten(),
                "layers": f32_as_in_csv(serde_json::to_value(&r.layers)?),
                "attention": f32_as_in_csv(serde_json::to_value(&r.attention)?),
                "lost_layers": crate::record::why::lost_layers(r, last),
                "why": crate::record::why::why(r, last),
            }))).collect::<serde_json::Result<Vec<_>>>()?,
            "diagnosis": crate::probe::session::diagnosis(&runs, last),
            "conclusion": conclusion(&runs, last, judge_answers, &needle_texts),
        });
        let mut obj = obj;
        if let (Some(c), Some(run)) = (&capture, runs.first()) {
            let e = EngineView::of(c, run, &scenario, &prompt, &cfg, marks);
            obj["engine"] = super::engine::engine_json(
                c,
                &run.served,
                &e.verdict,
                e.answer_correct,
                Some(&run.index),
                prompt.needles.len(),
            );
        }
        writeln!(out, "{}", serde_json::to_string_pretty(&obj)?)?;
    } else {
        print_tables(out, &cfg, &scenario, &prompt, &runs, &opts, &backend, marks)?;
        if let (Some(c), Some(run)) = (&capture, runs.first()) {
            let e = EngineView::of(c, run, &scenario, &prompt, &cfg, marks);
            super::engine::print_engine(
                out,
                c,
                &run.served,
                &run.layers,
                &e.verdict,
                e.answer_correct,
                Some(&run.index),
                prompt.needles.len(),
            )?;
        }
    }
    if let Some(store) = store {
        let stderr = &mut std::io::stderr();
        record(store, &prompt, length, &runs, judge_answers, stderr)?;
    }
    let planned = opts.indexes.len() * opts.topks.len();
    if runs.len() < planned {
        return Err(crate::run::interrupt::Interrupted {
            dir: args.out.clone(),
            finished: runs.len(),
            total: planned,
            next: match &args.out {
                Some(_) => "rerunning the same command runs every cell again and records \
                            the ones missing there"
                    .into(),
                None => "their tables are above (probe --out DIR would keep them)".into(),
            },
        }
        .into());
    }
    Ok(())
}

/// `--compare` with `exact` added when a rounding profile drives and it is not scored: it
/// costs no forward, and only it tells a layer lost to rounding from one the top-k is too small
/// for ([`crate::record::why`]).
pub fn with_exact(indexes: &[IndexProfile], compare: &[IndexProfile]) -> Vec<IndexProfile> {
    let exact = IndexProfile::Exact;
    let mut out = compare.to_vec();
    if indexes.iter().any(|&p| p != exact) && !compare.contains(&exact) && !indexes.contains(&exact)
    {
        out.push(exact);
    }
    out
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
        "answer": [prompt.answer.0, prompt.answer.1],
        "needle_text": prompt.needle_text,
        "answer_value": prompt.answer_value,
    })
}

/// What the capture expects of the engine's response for this prompt.
fn capture_expect(
    args: &ProbeArgs,
    cfg: &crate::config::ModelConfig,
    tok: &V4Tokenizer,
    prompt: &NeedlePrompt,
) -> crate::probe::capture::CaptureExpect {
    crate::probe::capture::CaptureExpect {
        source: args.engine.source(),
        prompt_tokens: prompt.tokens.len(),
        csa_layers: cfg.layers_of_kind(crate::config::LayerKind::Csa),
        config_topk: cfg.index_topk,
        engine_topk: args.engine.engine_topk(),
        prompt_positions: match args.probe {
            ProbeSet::Question => crate::probe::session::question_positions(tok, prompt),
            ProbeSet::Answer => Vec::new(),
        },
    }
}

/// The engine's verdict and answer judgement of one run.
struct EngineView {
    verdict: crate::record::served::ServedVerdict,
    answer_correct: Option<bool>,
}

impl EngineView {
    fn of(
        capture: &crate::probe::capture::EngineCapture,
        run: &ProbeRun,
        scenario: &Scenario,
        prompt: &NeedlePrompt,
        cfg: &crate::config::ModelConfig,
        marks: crate::run::sweep::ModelMarks,
    ) -> EngineView {
        let order = crate::probe::served::profile_order();
        let last = prompt.tokens.len() - 1;
        let driving = (!run.index.is_empty()).then_some(run.index.as_str());
        EngineView {
            verdict: crate::record::served::ServedVerdict::of(
                &run.served,
                &run.layers,
                last,
                &order,
                driving,
            ),
            answer_correct: crate::probe::served::engine_answer_correct(
                capture,
                scenario,
                &prompt.answer_values,
                cfg.eos_token_id,
                marks.judges_answers(capture.output_ids.len()),
            ),
        }
    }
}

/// Engine-only mode (`--no-local`, or a model directory without weights): the prompt is built
/// with the model's tokenizer and config, the engine's selections and answer are read, and the
/// needle's membership is reported per CSA layer; nothing runs locally.
fn run_engine_only(args: &ProbeArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let config_path = args.model.join("config.json");
    let cfg = crate::config::ModelConfig::load(&config_path)?;
    cfg.require_csa_layer(&config_path)?;
    let tok = crate::run::target::load_tokenizer(&args.model, &cfg)?;
    let (scenario, prompt) =
        prompt_source(args).build(&tok, cfg.max_position_embeddings, args.generate)?;
    let started = std::time::Instant::now();
    let capture = args.engine.capture(
        &prompt.tokens,
        args.generate,
        &capture_expect(args, &cfg, &tok, &prompt),
    )?;
    // `--out`: an engine-only report directory (report::store::engine_only), opened once the
    // engine answered (a refused capture records nothing).
    let mut store = match &args.out {
        Some(dir) => {
            let mut recorded = shared_args(args);
            recorded["local"] = serde_json::json!(false);
            let info = RunInfo::new(
                args.model.display().to_string(),
                config_hash(&cfg),
                scenario.name.clone(),
                crate::run::sweep::model_marks(&args.model).synthetic,
                recorded,
            )
            .with_fingerprints(String::new(), scenario.fingerprint()?);
            Some(
                crate::report::store::EngineOnlyDir::create_or_resume(dir, info)
                    .map_err(|e| anyhow::anyhow!("--out {}: {e}", dir.display()))?,
            )
        }
        None => None,
    };
    let last = prompt.tokens.len() - 1;
    let mut positions = vec![last];
    positions.extend(
        capture
            .selections
            .keys()
            .copied()
            .filter(|&p| p != last && p + 1 < capture.prompt_tokens + capture.output_ids.len()),
    );
    positions.sort_unstable();
    positions.dedup();
    let cell = crate::record::served::engine_cell_id(
        prompt.tokens.len(),
        prompt.depth_pct,
        capture.topk,
        None,
    );
    let spans: Vec<(usize, usize)> = prompt.needles.iter().map(|n| n.span).collect();
    let served = crate::probe::served::membership_records(&capture, &cell, &spans, &positions);
    let marks = crate::run::sweep::model_marks(&args.model);
    let verdict = crate::record::served::ServedVerdict::of(&served, &[], last, &[], None);
    let answer_correct = crate::probe::served::engine_answer_correct(
        &capture,
        &scenario,
        &prompt.answer_values,
        cfg.eos_token_id,
        marks.judges_answers(capture.output_ids.len()),
    );
    if args.json {
        let obj = serde_json::json!({
            "model": args.model.display().to_string(),
            "synthetic": marks.synthetic,
            "scenario": scenario.name,
            "local": false,
            "prompt": prompt_json(&prompt),
            "runs": [],
            "engine": super::engine::engine_json(
                &capture,
                &served,
                &verdict,
                answer_correct,
                None,
                prompt.needles.len(),
            ),
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&obj)?)?;
    } else {
        writeln!(
            out,
            "{} | {} tokens | {} | answer {:?} | engine only (no local forward)",
            scenario.name,
            prompt.tokens.len(),
            crate::units::count_of(prompt.needles.len(), "needle"),
            prompt.answer_value
        )?;
        super::engine::print_engine(
            out,
            &capture,
            &served,
            &[],
            &verdict,
            answer_correct,
            None,
            prompt.needles.len(),
        )?;
    }
    if let Some(store) = store.as_mut() {
        let target_tokens = match args.conversation.prompt {
            Some(_) => prompt.tokens.len(),
            None => args.length,
        };
        let record = crate::probe::served::engine_cell(
            cell.clone(),
            target_tokens,
            &prompt,
            &capture,
            &served,
            answer_correct,
            started.elapsed().as_secs_f64(),
        );
        if store.is_finished(&cell) {
            eprintln!(
                "{}: cell {cell} already recorded there, not written again",
                store.path().display()
            );
        } else {
            store.append(&record, &served)?;
        }
        let records = crate::report::store::EngineOnlyRecords::read(store.path())?;
        crate::report::html::write_engine_only_html(&records, store.path())?;
        eprintln!(
            "recorded in {}: engine_cells.csv, engine.csv (engine only), report.html",
            store.path().display()
        );
    }
    Ok(())
}

/// Prefill / generation progress on stderr (hidden when stderr is not a terminal).
struct BarProgress {
    bar: Option<indicatif::ProgressBar>,
}

impl BarProgress {
    fn new() -> Self {
        BarProgress { bar: None }
    }
    fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

impl ProbeProgress for BarProgress {
    fn run_started(&mut self, index: IndexProfile, topk: usize, prompt_tokens: usize) {
        self.finish();
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(prompt_tokens as u64),
            indicatif::ProgressDrawTarget::stderr(),
        );
        bar.set_style(crate::run::progress::style(
            crate::run::progress::PROBE_PREFILL,
        ));
        bar.set_message(format!("prefill {index} top-{topk}"));
        self.bar = Some(bar);
    }
    fn prefill(&mut self, done: usize, _total: usize) {
        if let Some(b) = &self.bar {
            b.set_position(done as u64);
        }
    }
    fn generated(&mut self, count: usize) {
        if let Some(b) = &self.bar {
            b.set_message(format!("generated {count} tokens"));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// `probe --out DIR`: the probe's records in a report directory that `needlescope report` reads
// (run.json, cells.csv, layers.csv, attention.csv, summary.json, PNGs), through the sweep's
// store ([`RunDir`]).
//
// Several probes may share a directory, each adding its cells (one per driving profile and
// top-k, named by length, depth, profile and top-k), as long as everything else that shapes
// the records is the same: model (config and weights), scenario, `--kv`, `--seed`,
// `--generate`, `--compare` and `--probe`. Those are run.json's `sweep_args` (with
// `"command": "probe"`, so a sweep's directory is refused too), checked before the model
// runs. A cell already recorded is not written again.
//
// The directory is locked ([`crate::report::DirLock`]) from [`open`], before the model runs,
// until [`record`] has rendered the report: a probe is refused while another probe or a sweep
// writes there.

/// The prompt flags of a probe.
fn prompt_source(args: &ProbeArgs) -> super::prompt::PromptSource<'_> {
    match &args.conversation.prompt {
        Some(path) => super::prompt::PromptSource::Conversation {
            path,
            needles: &args.conversation.needle,
            answer: args.conversation.answer.as_deref(),
        },
        None => super::prompt::PromptSource::Scenario {
            name: &args.scenario,
            haystack_file: args.haystack_file.as_deref(),
            length: args.length,
            depth: args.depth,
            seed: args.seed,
            needles: args.needles.count(),
        },
    }
}

/// The arguments that must agree between probes sharing a directory.
fn shared_args(args: &ProbeArgs) -> serde_json::Value {
    let mut compare: Vec<&str> = args.compare.iter().map(|p| p.name()).collect();
    compare.sort_unstable();
    let mut shared = serde_json::json!({
        "command": "probe",
        "kv": args.kv.name(),
        "seed": args.seed,
        "generate": args.generate,
        "compare": compare,
        "needles": args.needles.count,
        "ask": args.needles.ask.name(),
        "probe": match args.probe {
            ProbeSet::Answer => "answer",
            ProbeSet::Question => "question",
        },
    });
    // Only with an engine, so that directories of earlier probes still match.
    if args.engine.is_set() {
        shared["engine"] = serde_json::json!("sglang");
    }
    shared
}

/// Opens (or joins) `dir` for this probe before anything runs: refused when it holds another
/// command's report or one made with other shared arguments (see the module doc).
pub fn open(
    dir: &Path,
    args: &ProbeArgs,
    ckpt: &Checkpoint,
    scenario: &Scenario,
    backend: BackendRecord,
) -> anyhow::Result<RunDir> {
    let marks = crate::run::sweep::model_marks(&args.model);
    let info = RunInfo::new(
        args.model.display().to_string(),
        config_hash(ckpt.config()),
        scenario.name.clone(),
        marks.synthetic,
        shared_args(args),
    )
    .with_fingerprints(ckpt.fingerprint(), scenario.fingerprint()?)
    .with_backend(backend);
    let (store, _) = RunDir::create_or_resume(dir, info)
        .map_err(|e| anyhow::anyhow!("--out {}: {e}", dir.display()))?;
    Ok(store)
}

/// Appends the cells of `runs` not yet in `store`, then rewrites summary.json and the PNGs;
/// says on `out` which cells were already there and what was written where.
pub fn record(
    mut store: RunDir,
    prompt: &NeedlePrompt,
    target_tokens: usize,
    runs: &[ProbeRun],
    judge_answers: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    for note in store.notes() {
        writeln!(out, "note: {}: {note}", store.path().display())?;
    }
    for run in runs {
        if store.is_finished(&run.cell_id) {
            writeln!(
                out,
                "{}: cell {} already recorded there, not written again",
                store.path().display(),
                run.cell_id
            )?;
            continue;
        }
        let cell = crate::run::sweep::cell_record(prompt, target_tokens, run, judge_answers);
        store.append_cell_with_engine(&cell, &run.layers, &run.attention, &run.served)?;
    }
    // The directory stays locked until the PNGs are rendered.
    let lock = store.lock().clone();
    drop(store);
    let done = crate::report::rerender_locked(&lock, false)?;
    writeln!(out, "{}", done.files_line(lock.dir()))?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// `needlescope probe`'s text output: the per-layer table of the needle's rank, score and margin
// under the driving profile and each `--compare` profile, the answer line, and the other
// probed positions (question tokens, generated tokens) grouped into ranges.

/// What the columns of a probe's per-layer tables mean (docs/architecture.md section 4), printed
/// under them as the sweep's summary prints [`crate::report::summary::SUMMARY_LEGEND`].
pub const PROBE_LEGEND: &str = "\nlegend: visible: compressed rows the query can see, n_t = \
     floor((query + 1) / 4) (one row per 4 tokens); needle: those holding a needle token.\n\
     rank[p]: the needle's best row under profile p, 1 + rows scoring strictly higher (-: no \
     needle row visible); the first is the driving profile, the one the run selected with.\n\
     margin: needle score minus the k-th best score under the driving profile (>= 0: inside \
     the top-k); selected: rank <= k.\n\
     trivial: n_t <= k, every visible row is kept, so the layer cannot lose the needle and \
     does not count.\n";

fn fmt_opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or("-".to_string(), |x| x.to_string())
}

#[allow(clippy::too_many_arguments)]
pub(super) fn print_tables(
    out: &mut dyn Write,
    cfg: &crate::config::ModelConfig,
    scenario: &Scenario,
    prompt: &NeedlePrompt,
    runs: &[ProbeRun],
    opts: &ProbeOptions,
    backend: &BackendRecord,
    marks: crate::run::sweep::ModelMarks,
) -> anyhow::Result<()> {
    let judge_answers = marks.judges_answers(opts.generate);
    let last = prompt.tokens.len() - 1;
    if marks.synthetic {
        write!(out, "{}", crate::report::SYNTHETIC_LINE)?;
    }
    writeln!(
        out,
        "diagnosis: {}",
        crate::probe::session::diagnosis(runs, last)
    )?;
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
        "CSA layers: {:?}; ranks at the answer position (query {last}); rank 1 = best",
        cfg.layers_of_kind(crate::config::LayerKind::Csa)
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
        writeln!(out, " {:>10} {:>9} {:>7}", "margin", "selected", "trivial")?;
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
            writeln!(
                out,
                " {:>10} {:>9} {:>7}",
                driving.margin.map_or("-".into(), |m| format!("{m:+.4}")),
                if driving.selected { "yes" } else { "NO" },
                if driving.trivial { "yes" } else { "no" }
            )?;
        }
        if let Some(why) = crate::record::why::why(run, last) {
            writeln!(out, "why: {why}")?;
        }
        print_other_positions(out, run, last)?;
    }
    if !runs.is_empty() {
        write!(out, "{PROBE_LEGEND}")?;
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
        conclusion(runs, last, judge_answers, &needle_texts)
    )?;
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
        "other probed positions ({} under {}): worst needle rank over the CSA layers",
        positions.len(),
        run.index
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
