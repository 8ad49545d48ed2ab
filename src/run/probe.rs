//! `probe`'s plan and task: one prompt (a scenario at a length and depth, or a user's
//! conversation), one forward per (driving index profile, top-k) on the chosen backend, and
//! the runs' records; or, with a serving engine and no local forward, the engine's capture
//! alone. The CLI fills a [`ProbePlan`] from its flags, calls [`run`] and prints the
//! [`ProbeOutcome`]; [`LocalProbe::finish`] / [`EngineOnlyProbe::finish`] then record into
//! `--out` (after the tables, so a failing write never hides them) and say whether Ctrl-C cut
//! the runs short.
//!
//! `probe --out DIR` writes a report directory that `needlescope report` reads (run.json,
//! cells.csv, layers.csv, attention.csv, summary.json, PNGs, report.html) through the sweep's
//! store ([`RunDir`]). Several probes may share a directory, each adding its cells (one per
//! driving profile and top-k), as long as everything else that shapes the records is the same:
//! model (config and weights), scenario, `--kv`, `--seed`, `--generate`, `--compare`,
//! `--needles`, `--ask` and `--probe` ([`ProbePlan::recorded_args`], run.json's `sweep_args`
//! with `"command": "probe"`, so a sweep's directory is refused too), checked before the model
//! runs. A cell already recorded is not written again. The directory is locked
//! ([`crate::report::DirLock`]) from before the model runs until the report is rendered.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use super::engine_only::{engine_only_cell, EngineOnlyCell, HeldPrompt};
use super::interrupt::Interrupted;
use super::prompt::PromptSource;
use super::sglang::EnginePlan;
use super::target::{model_marks, ModelMarks, ModelTask, Target};
use crate::backend::Backend;
use crate::config::ModelConfig;
use crate::devices::placement::Workload;
use crate::model::forward::{Model, ModelOptions};
use crate::numerics::profiles::{IndexProfile, KvMode};
use crate::probe::capture::{CaptureExpect, EngineCapture};
use crate::probe::chat::ChatFormat;
use crate::probe::session::{run_probe, ProbeInputs, ProbeOptions, ProbeProgress, StopCheck};
use crate::probe::{NeedlePrompt, Scenario};
use crate::record::engine::EngineLayerRecord;
use crate::record::verdict::EngineVerdict;
use crate::record::{config_hash, BackendRecord, CellRecord, ProbeRun, RunInfo};
use crate::report::RunDir;
use crate::tokenizer::V4Tokenizer;

/// Everything a probe needs, checked flags only: what [`run`] executes.
pub struct ProbePlan<'a> {
    /// The model directory (`--model`, resolved).
    pub model: &'a Path,
    pub prompt: PromptSource<'a>,
    /// Driving profiles, one run each.
    pub indexes: Vec<IndexProfile>,
    /// `--compare` as given (exact is added by [`crate::probe::session::with_exact`] where it
    /// tells causes apart).
    pub compare: Vec<IndexProfile>,
    /// Top-k values, one run each; empty: the config's `index_topk`.
    pub topks: Vec<usize>,
    pub kv: KvMode,
    pub generate: usize,
    /// Prefill chunk (0: auto).
    pub chunk: usize,
    pub device: super::device::DeviceChoice,
    /// `--probe question`: every question token is probed too.
    pub probe_question: bool,
    /// `--out DIR`.
    pub out: Option<&'a Path>,
    /// `--engine URL` / `--engine-capture FILE`.
    pub engine: Option<EnginePlan>,
    /// DeepSeek-V4.1's `--candidate-blocks` what-if (the config's `candidate_topk_blocks` when
    /// `None`); refused on DeepSeek-V4.
    pub candidate_blocks: Option<usize>,
}

impl ProbePlan<'_> {
    /// The arguments that must agree between probes sharing a directory (run.json's
    /// `sweep_args`).
    pub fn recorded_args(&self) -> serde_json::Value {
        let mut compare: Vec<&str> = self.compare.iter().map(|p| p.name()).collect();
        compare.sort_unstable();
        let needles = self.prompt.needle_count();
        let mut shared = serde_json::json!({
            "command": "probe",
            "kv": self.kv.name(),
            "seed": self.prompt.seed(),
            "generate": self.generate,
            "compare": compare,
            "needles": needles.count,
            "ask": needles.ask.name(),
            "probe": if self.probe_question { "question" } else { "answer" },
        });
        // Only with an engine, so that directories of earlier probes still match.
        if self.engine.is_some() {
            shared["engine"] = serde_json::json!("sglang");
        }
        // Likewise only where given (DeepSeek-V4.1).
        if let Some(blocks) = self.candidate_blocks {
            shared["candidate_blocks"] = serde_json::json!(blocks);
        }
        shared
    }

    /// A conversation whose generated answer is to be judged needs `--answer`.
    pub fn check_answer_judged(&self) -> anyhow::Result<()> {
        if matches!(self.prompt, PromptSource::Conversation { answer: None, .. })
            && self.generate > 0
        {
            anyhow::bail!(
                "--prompt: expected --answer TEXT (what a correct reply contains) to judge the \
                 generated answer, or --generate 0 to judge by the indexer alone"
            );
        }
        Ok(())
    }

    /// Whether the engine runs alone: `--no-local`, or a model directory without weights.
    pub fn engine_only(&self) -> bool {
        self.engine
            .as_ref()
            .is_some_and(|e| e.no_local || !super::target::has_weights(self.model))
    }
}

/// What a probe computed: local runs (with the engine held against them when one was given),
/// or the engine alone.
pub enum ProbeOutcome {
    Local(Box<LocalProbe>),
    EngineOnly(Box<EngineOnlyProbe>),
}

/// The serving engine held against a local run.
pub struct EngineHeld {
    pub capture: Arc<EngineCapture>,
    pub verdict: EngineVerdict,
    /// The engine's own answer judged under the scenario (`None`: not judged or not ended).
    pub answer_correct: Option<bool>,
}

/// A probe with a local forward.
pub struct LocalProbe {
    /// The model's table of layer roles (which layers index, which reuse a selection).
    pub roles: crate::config::LayerRoles,
    pub scenario: Scenario,
    pub prompt: NeedlePrompt,
    pub opts: ProbeOptions,
    /// One per finished (driving profile, top-k), each checked against its own selection.
    pub runs: Vec<ProbeRun>,
    pub backend: BackendRecord,
    pub marks: ModelMarks,
    /// Whether the runs' verdicts are their generated answers ([`ModelMarks::judges_answers`]).
    pub judge_answers: bool,
    /// With `--engine`: the engine against the first run.
    pub engine: Option<EngineHeld>,
    pub(super) store: Option<RunDir>,
    pub(super) target_tokens: usize,
    pub(super) out_dir: Option<std::path::PathBuf>,
}

/// A probe of the serving engine alone.
pub struct EngineOnlyProbe {
    pub cfg: ModelConfig,
    pub scenario: Scenario,
    pub prompt: NeedlePrompt,
    pub marks: ModelMarks,
    pub capture: EngineCapture,
    /// Membership records at the probed positions, the verdict and the engine_cells.csv row.
    pub cell: EngineOnlyCell,
    pub verdict: EngineVerdict,
    store: Option<crate::report::store::EngineOnlyDir>,
}

impl ProbeOutcome {
    pub fn answer_position(&self) -> usize {
        match self {
            ProbeOutcome::Local(p) => p.prompt.tokens.len() - 1,
            ProbeOutcome::EngineOnly(p) => p.prompt.tokens.len() - 1,
        }
    }
}

/// The probe's body on a loaded model of any backend.
struct ProbeTask<'a> {
    tok: &'a V4Tokenizer,
    scenario: &'a Scenario,
    prompt: &'a NeedlePrompt,
    opts: &'a ProbeOptions,
    progress: &'a mut dyn ProbeProgress,
}

impl ModelTask for ProbeTask<'_> {
    type Output = Vec<ProbeRun>;
    fn run<B: Backend>(self, model: &mut Model<B>) -> anyhow::Result<Vec<ProbeRun>> {
        let inputs = ProbeInputs {
            tok: self.tok,
            scenario: self.scenario,
            prompt: self.prompt,
            opts: self.opts,
            cell_suffix: "",
        };
        // A probe's unit is its run, which can take hours: Ctrl-C drops the run in flight at
        // the next chunk (the finished runs are kept).
        let stop = StopCheck {
            requested: &super::interrupt::stop_requested,
            within_runs: true,
        };
        run_probe(model, &inputs, self.progress, stop)
    }
}

/// Runs the probe of `plan` on a DeepSeek-V4 checkpoint (`super::probe_v41` runs V4.1's): the
/// engine alone, or the local runs (with the engine held against them). Nothing is recorded
/// yet: the caller prints, then calls `finish`.
pub fn run(plan: &ProbePlan) -> anyhow::Result<ProbeOutcome> {
    if plan.engine_only() {
        return run_engine_only(plan).map(|p| ProbeOutcome::EngineOnly(Box::new(p)));
    }
    plan.check_answer_judged()?;
    if let Some((flag, p)) = [("--index", &plan.indexes), ("--compare", &plan.compare)]
        .into_iter()
        .find_map(|(flag, ps)| ps.iter().find(|p| p.v41_only()).map(|p| (flag, p)))
    {
        anyhow::bail!(
            "{flag} {p}: a DeepSeek-V4.1 index profile; {} is a DeepSeek-V4 model (its profiles: \
             exact, fp8, bf16, bf16-qk, sglang-fp4, official-fp4, vllm-fp8, fp8-no-hadamard-k)",
            plan.model.display()
        );
    }
    if let Some(blocks) = plan.candidate_blocks {
        anyhow::bail!(
            "--candidate-blocks {blocks}: a DeepSeek-V4.1 what-if (its candidate stage); {} is \
             not a DeepSeek-V4.1 model",
            plan.model.display()
        );
    }
    let ckpt = super::target::open_model(plan.model)?;
    let cfg = ckpt.config().clone();
    cfg.require_csa_layer(&plan.model.join("config.json"))?;
    super::checks::refuse_topk_past_rows("--topk", &plan.topks, &cfg)?;
    if let PromptSource::Scenario { length, .. } = plan.prompt {
        let positions = super::checks::positions_taken(length, plan.generate);
        if positions > cfg.max_position_embeddings {
            anyhow::bail!(
                "--length {length} with --generate {}: expected at most the model's \
                 max_position_embeddings ({}) positions, found {positions}",
                plan.generate,
                cfg.max_position_embeddings
            );
        }
    }
    // The tokenizer (cheap, checked against the config) and a conversation's prompt (its
    // length sizes the work), then the backend: a device that cannot be used, or a model that
    // does not fit, fails before a scenario's prompt is built (exactly `--length` tokens).
    let tok = super::target::load_tokenizer(plan.model, &cfg)?;
    let built = match plan.prompt {
        PromptSource::Conversation { .. } => Some(plan.prompt.build(
            &tok,
            ChatFormat::V4,
            cfg.max_position_embeddings,
            plan.generate,
        )?),
        PromptSource::Scenario { .. } => None,
    };
    let length = match (&built, plan.prompt) {
        (Some((_, p)), _) => p.tokens.len(),
        (None, PromptSource::Scenario { length, .. }) => length,
        (None, PromptSource::Conversation { .. }) => unreachable!("built above"),
    };
    let work = Workload {
        context: length + plan.generate,
        chunk: plan.chunk,
        topk: plan
            .topks
            .iter()
            .copied()
            .max()
            .or(plan.engine.as_ref().and_then(|e| e.topk))
            .unwrap_or(cfg.index_topk),
    };
    let target = Target::prepare(&plan.device, &ckpt, &work)?;
    let backend = target.record();
    let (scenario, prompt) = match built {
        Some(built) => built,
        None => plan.prompt.build(
            &tok,
            ChatFormat::V4,
            cfg.max_position_embeddings,
            plan.generate,
        )?,
    };
    let marks = model_marks(plan.model);
    let judge_answers = marks.judges_answers(plan.generate);
    if let Some(note) = scenario
        .thinking_note(plan.generate)
        .filter(|_| judge_answers)
    {
        eprintln!("note: {note}");
    }
    // The serving engine's capture first: its K is the runs' top-k, its tokens their answer.
    let capture = match &plan.engine {
        Some(engine) => Some(Arc::new(engine.source.capture(
            &prompt.tokens,
            plan.generate,
            &capture_expect(plan, &cfg, &tok, &prompt),
        )?)),
        None => None,
    };
    let topks = match &capture {
        Some(c) => vec![c.topk],
        None if plan.topks.is_empty() => vec![cfg.index_topk],
        None => plan.topks.clone(),
    };
    let compare = match &capture {
        Some(_) => crate::probe::engine::scored_with_engine(&plan.indexes, &plan.compare),
        None => crate::probe::session::with_exact(&plan.indexes, &plan.compare),
    };
    let opts = ProbeOptions {
        indexes: plan.indexes.clone(),
        compare: crate::probe::session::comparison_profiles(&plan.indexes, &compare),
        topks,
        kv: plan.kv,
        generate: plan.generate,
        chunk: target.chunk(),
        probe_question: plan.probe_question,
        engine: capture.clone(),
    };
    // The records directory is checked before the model runs.
    let store = match plan.out {
        Some(dir) => Some(open_store(
            dir,
            plan,
            (&ckpt, config_hash(&cfg)),
            &scenario,
            backend.clone(),
        )?),
        None => None,
    };
    // Ctrl-C stops at the next chunk, dropping the run in flight; the finished runs are
    // printed and recorded.
    let _stoppable = super::interrupt::Resumable::probe(plan.out);
    let mut progress = super::progress::ProbeBar::new();
    let task = ProbeTask {
        tok: &tok,
        scenario: &scenario,
        prompt: &prompt,
        opts: &opts,
        progress: &mut progress,
    };
    let runs = target.run(&ckpt, ModelOptions::default(), task)?;
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
    let engine = match (&capture, runs.first()) {
        (Some(c), Some(run)) => Some(engine_held(c, run, &scenario, &prompt, &cfg, marks)),
        _ => None,
    };
    let target_tokens = match plan.prompt {
        PromptSource::Scenario { length, .. } => length,
        PromptSource::Conversation { .. } => prompt.tokens.len(),
    };
    Ok(ProbeOutcome::Local(Box::new(LocalProbe {
        roles: cfg.layer_roles(),
        scenario,
        prompt,
        opts,
        runs,
        backend,
        marks,
        judge_answers,
        engine,
        store,
        target_tokens,
        out_dir: plan.out.map(Path::to_path_buf),
    })))
}

impl LocalProbe {
    /// Records the finished runs into `--out` (notes and what was written go to `log`), then
    /// says whether Ctrl-C stopped the probe before every run was done.
    pub fn finish(self, log: &mut dyn Write) -> anyhow::Result<()> {
        if let Some(store) = self.store.filter(|_| !self.runs.is_empty()) {
            record(
                store,
                &self.prompt,
                self.target_tokens,
                &self.runs,
                self.judge_answers,
                log,
            )?;
        }
        let planned = self.opts.indexes.len() * self.opts.topks.len();
        if self.runs.len() < planned {
            return Err(Interrupted {
                unit: "runs",
                next: match (&self.out_dir, self.runs.is_empty()) {
                    (Some(_), _) => "rerunning the same command runs every cell again and \
                                     records the ones missing there"
                        .into(),
                    (None, false) => {
                        "their tables are above (probe --out DIR would keep them)".into()
                    }
                    (None, true) => "nothing to print; rerun the command to probe again".into(),
                },
                dir: self.out_dir,
                finished: self.runs.len(),
                total: planned,
            }
            .into());
        }
        Ok(())
    }
}

/// What the capture expects of the engine's response for this prompt.
fn capture_expect(
    plan: &ProbePlan,
    cfg: &ModelConfig,
    tok: &V4Tokenizer,
    prompt: &NeedlePrompt,
) -> CaptureExpect {
    let engine = plan.engine.as_ref().expect("an engine plan");
    CaptureExpect {
        source: engine.source.name(),
        prompt_tokens: prompt.tokens.len(),
        csa_layers: cfg.layers_of_kind(crate::config::LayerKind::Csa),
        config_topk: cfg.index_topk,
        engine_topk: engine.topk,
        prompt_positions: match plan.probe_question {
            true => crate::probe::session::question_positions(tok, prompt),
            false => Vec::new(),
        },
    }
}

/// The engine's verdict and answer judgement against one local run.
fn engine_held(
    capture: &Arc<EngineCapture>,
    run: &ProbeRun,
    scenario: &Scenario,
    prompt: &NeedlePrompt,
    cfg: &ModelConfig,
    marks: ModelMarks,
) -> EngineHeld {
    let order = crate::probe::engine::profile_order();
    let last = prompt.tokens.len() - 1;
    let driving = (!run.index.is_empty()).then_some(run.index.as_str());
    EngineHeld {
        capture: capture.clone(),
        verdict: EngineVerdict::of(&run.engine_records, &run.layers, last, &order, driving),
        answer_correct: crate::probe::engine::engine_answer_correct(
            capture,
            scenario,
            &prompt.answer_values,
            cfg.eos_token_id,
            marks.judges_answers(capture.output_ids.len()),
        ),
    }
}

/// Engine-only mode (`--no-local`, or a model directory without weights): the prompt is built
/// with the model's tokenizer and config, the engine's selections and answer are read, and the
/// needle's membership is reported per CSA layer; nothing runs locally.
fn run_engine_only(plan: &ProbePlan) -> anyhow::Result<EngineOnlyProbe> {
    let engine = plan.engine.as_ref().expect("an engine plan");
    let config_path = plan.model.join("config.json");
    let cfg = ModelConfig::load(&config_path)?;
    cfg.require_csa_layer(&config_path)?;
    let tok = super::target::load_tokenizer(plan.model, &cfg)?;
    let (scenario, prompt) = plan.prompt.build(
        &tok,
        ChatFormat::V4,
        cfg.max_position_embeddings,
        plan.generate,
    )?;
    let started = Instant::now();
    let capture = engine.source.capture(
        &prompt.tokens,
        plan.generate,
        &capture_expect(plan, &cfg, &tok, &prompt),
    )?;
    let marks = model_marks(plan.model);
    // `--out`: an engine-only report directory (report::store::engine_only), opened once the
    // engine answered (a refused capture records nothing).
    let store = match plan.out {
        Some(dir) => {
            let mut recorded = plan.recorded_args();
            recorded["local"] = serde_json::json!(false);
            let info = RunInfo::new(
                plan.model.display().to_string(),
                config_hash(&cfg),
                scenario.name.clone(),
                marks.synthetic,
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
    let cell_id = crate::record::engine::engine_cell_id(
        prompt.tokens.len(),
        prompt.depth_pct,
        capture.topk,
        None,
    );
    let target_tokens = match plan.prompt {
        PromptSource::Scenario { length, .. } => length,
        PromptSource::Conversation { .. } => prompt.tokens.len(),
    };
    let held = HeldPrompt {
        prompt: &prompt,
        scenario: &scenario,
        eos: cfg.eos_token_id,
        marks,
    };
    let cell = engine_only_cell(&held, &capture, cell_id, target_tokens, started);
    let verdict = EngineVerdict::of(&cell.engine_records, &[], last, &[], None);
    Ok(EngineOnlyProbe {
        cfg,
        scenario,
        prompt,
        marks,
        capture,
        cell,
        verdict,
        store,
    })
}

impl EngineOnlyProbe {
    /// The membership records (engine.csv rows).
    pub fn engine_records(&self) -> &[EngineLayerRecord] {
        &self.cell.engine_records
    }

    /// Records the cell into `--out` (an engine-only report directory) and writes its
    /// report.html; notes go to `log`.
    pub fn finish(mut self, log: &mut dyn Write) -> anyhow::Result<()> {
        let Some(store) = self.store.as_mut() else {
            return Ok(());
        };
        let cell = &self.cell.cell;
        if store.is_finished(&cell.cell_id) {
            writeln!(
                log,
                "{}: cell {} already recorded there, not written again",
                store.path().display(),
                cell.cell_id
            )?;
        } else {
            store.append(cell, &self.cell.engine_records)?;
        }
        let records = crate::report::store::EngineOnlyRecords::read(store.path())?;
        crate::report::html::write_engine_only_html(&records, store.path())?;
        writeln!(
            log,
            "recorded in {}: engine_cells.csv, engine.csv (engine only), report.html",
            store.path().display()
        )?;
        Ok(())
    }
}

/// Opens (or joins) `dir` for this probe before anything runs: refused when it holds another
/// command's report or one made with other shared arguments (see the module doc).
pub(super) fn open_store<C: crate::checkpoint::CheckpointConfig>(
    dir: &Path,
    plan: &ProbePlan,
    (ckpt, config_hash): (&crate::checkpoint::Checkpoint<C>, String),
    scenario: &Scenario,
    backend: BackendRecord,
) -> anyhow::Result<RunDir> {
    let info = RunInfo::new(
        plan.model.display().to_string(),
        config_hash,
        scenario.name.clone(),
        model_marks(plan.model).synthetic,
        plan.recorded_args(),
    )
    .with_fingerprints(ckpt.fingerprint(), scenario.fingerprint()?)
    .with_backend(backend);
    let (store, _) = RunDir::create_or_resume(dir, info)
        .map_err(|e| anyhow::anyhow!("--out {}: {e}", dir.display()))?;
    Ok(store)
}

/// Appends the cells of `runs` not yet in `store`, then rewrites summary.json, the PNGs and
/// report.html; says on `log` which cells were already there and what was written where.
fn record(
    mut store: RunDir,
    prompt: &NeedlePrompt,
    target_tokens: usize,
    runs: &[ProbeRun],
    judge_answers: bool,
    log: &mut dyn Write,
) -> anyhow::Result<()> {
    for note in store.notes() {
        writeln!(log, "note: {}: {note}", store.path().display())?;
    }
    for run in runs {
        if store.is_finished(&run.cell_id) {
            writeln!(
                log,
                "{}: cell {} already recorded there, not written again",
                store.path().display(),
                run.cell_id
            )?;
            continue;
        }
        let cell = CellRecord::of_run(run, &prompt.place(target_tokens), judge_answers);
        store.append_cell_with_engine(&cell, &run.layers, &run.attention, &run.engine_records)?;
    }
    // The directory stays locked until the PNGs are rendered.
    let lock = store.lock().clone();
    drop(store);
    let done = crate::report::rerender_locked(&lock, false)?;
    writeln!(log, "{}", done.files_line(lock.dir()))?;
    Ok(())
}
