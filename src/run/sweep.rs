//! `sweep`: the recall grid — context length x needle depth x index profile x top-k (x samples) —
//! written record by record into a resumable run directory (docs/outputs.md).
//!
//! Work order: for each (length, depth, sample) the prompt is built once; then every (driving
//! profile, top-k) combination is one real forward pass plus greedy generation, with every other
//! listed profile scored on the same hidden states (free counterfactuals, rows in layers.csv).
//! A cell = one (length, depth, profile, top-k, sample); cell ids are
//! `L{prompt tokens}-d{depth}-{profile}-k{topk}-s{sample}`.
//!
//! Lock: the output directory is locked (`crate::report::DirLock`) when run.json is written or
//! checked, before the model runs, until the sweep returns; a second sweep into the same
//! directory is refused ([`run_sweep_locked`] takes a lock the caller already holds).
//!
//! Resume: `RunDir::create_or_resume` refuses when the model or any result-determining argument
//! differs from run.json, returns the finished cells, and repairs a torn last line; finished
//! cells are skipped, so a killed sweep loses at most the cell in flight. A (length, depth,
//! sample) whose cells are all finished is not even tokenised again. A rerun with more
//! lengths, depths, profiles, top-k values or samples grows the grid (run.json records the
//! union; `report::store::resume`): only its missing cells run, each scoring every profile of
//! the grown grid. Ctrl-C stops between cells (`crate::run::interrupt`: the first press lets
//! the cell in flight finish, then the finished cells' summary, plots and report.html are
//! written before the process exits; a second press stops at once).
//!
//! Backend: `--device` is decided and the layers placed before run.json is written
//! (`crate::run::target::Target`, planned for the longest length plus the generated tokens and
//! the largest top-k); run.json records it, and a resume on another backend kind or GEMM
//! precision is refused (other devices are fine).
//!
//! Judging: a planted checkpoint whose `planted.json` says its LM path does not copy the needle,
//! and any run with `--generate 0` (no answer to judge), is judged by indexer recall
//! (`answer_correct` empty); everything else by the scenario's answer check
//! ([`super::target::ModelMarks::judges_answers`]).

use crate::backend::Backend;
use crate::devices::placement::Workload;
use crate::model::forward::{Model, ModelOptions};
use crate::numerics::profiles::{IndexProfile, KvMode};
use crate::probe::session::{run_probe, ProbeInputs, ProbeModel, ProbeOptions, StopCheck};
use crate::probe::{NeedlePrompt, Scenario};
use crate::record::verdict::CellVerdict;
use crate::record::ProbeRun;
use crate::record::{cell_id_base, config_hash, CellRecord, RunInfo};
use crate::report::{DirLock, RunDir};
use crate::run::device::DeviceChoice;
use crate::run::progress::SweepBars;
use crate::run::target::{ModelTask, Target};
use crate::tokenizer::V4Tokenizer;
use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Everything that determines a sweep's results.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SweepPlan {
    pub scenario: String,
    pub lengths: Vec<usize>,
    pub depths: Vec<f64>,
    pub indexes: Vec<IndexProfile>,
    /// `--compare`: extra profiles scored on the same hidden states (the other `indexes` are
    /// scored too). Left out of run.json when empty, as runs before the flag wrote it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub compare: Vec<IndexProfile>,
    pub topks: Vec<usize>,
    pub kv: KvMode,
    pub samples: usize,
    pub seed: u64,
    pub generate: usize,
    /// Not part of the results (left out of the resume check).
    #[serde(skip)]
    pub chunk: usize,
    /// `--haystack-file` (scenarios of haystack kind `file`); its content is in run.json's
    /// `scenario_fingerprint`, which the resume check compares, so the path itself is not.
    #[serde(skip)]
    pub haystack_file: Option<PathBuf>,
    /// `--engine URL`: a serving engine held against every cell (each prompt is sent to it
    /// once; its K is the sweep's top-k, its tokens every run's answer). run.json records its
    /// kind (`"engine": "sglang"`), not its address, and nothing without one.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "engine_kind"
    )]
    pub engine: Option<SweepEngine>,
    /// DeepSeek-V4.1's `--candidate-blocks` what-if; recorded only when given, refused on V4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate_blocks: Option<usize>,
}

/// What a sweep needs to know of its model, whichever family it is.
#[derive(Clone, Debug)]
pub struct GridModel {
    pub max_positions: usize,
    /// The config's `index_topk`.
    pub config_topk: usize,
    /// The layers that run their own indexer (a serving engine's capture is checked on them).
    pub indexed_layers: Vec<usize>,
    /// The chat format of the model's release.
    pub format: crate::probe::chat::ChatFormat,
}

impl GridModel {
    /// A DeepSeek-V4 model's.
    pub fn v4(cfg: &crate::config::ModelConfig) -> Self {
        GridModel {
            max_positions: cfg.max_position_embeddings,
            config_topk: cfg.index_topk,
            indexed_layers: cfg.layer_roles().indexed_layers(),
            format: crate::probe::chat::ChatFormat::V4,
        }
    }
}

/// The serving engine of a sweep.
#[derive(Clone, Debug)]
pub struct SweepEngine {
    pub url: String,
    pub timeout: std::time::Duration,
    /// `--engine-topk`.
    pub topk: Option<usize>,
}

fn engine_kind<S: serde::Serializer>(
    _engine: &Option<SweepEngine>,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.serialize_str("sglang")
}

/// Runs `commit` (the cell's append to the run directory) only when the run passed its internal
/// check ([`ProbeRun::check_selection`]): a cell whose ranks do not follow from the engine's
/// selection is never recorded, so a resumed sweep computes it again instead of reporting it.
fn commit_checked(
    run: &ProbeRun,
    commit: impl FnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    run.check_selection()
        .map_err(|why| anyhow::anyhow!("{why}; the cell was not recorded"))?;
    commit()
}

/// What a sweep did.
#[derive(Debug)]
pub struct SweepOutcome {
    pub dir: PathBuf,
    pub cells_run: usize,
    pub cells_skipped: usize,
    /// The directory's lock, still held: render the report with it
    /// ([`crate::report::rerender_locked`]) so no other writer slips in between.
    pub lock: DirLock,
    /// Until dropped (after the report is rendered), Ctrl-C says that every cell is finished
    /// and `needlescope report` renders them.
    pub rendering: crate::run::interrupt::Resumable,
}

mod check {
    //! The sweep's checks before anything runs (a part of `sweep.rs`, kept apart so that file stays
    //! readable): list flags without repeats, lengths within the model's positions, and every
    //! prompt of the grid built once, so that no cell can fail midway.

    use super::{GridModel, SweepPlan};
    use crate::probe::prompt::{build_prompt_for, NeedleCount, PromptSpec};
    use crate::probe::{NeedlePrompt, Scenario};
    use crate::record::cell_id_base;
    use crate::tokenizer::V4Tokenizer;
    use std::collections::HashSet;

    /// Refuses, before anything runs or is written, a plan that would fail or repeat cells midway:
    /// a value given twice in a list flag, a length (plus `--generate`) past the model's
    /// positions, or any prompt of the grid that cannot be built (all are built here). (A
    /// top-k past the model's rows is refused by the caller, per family.)
    pub fn check_plan(
        plan: &SweepPlan,
        tok: &V4Tokenizer,
        scenario: &Scenario,
        model: &GridModel,
        finished: &HashSet<String>,
    ) -> anyhow::Result<()> {
        use crate::run::checks::refuse_duplicates;
        refuse_duplicates("--lengths", &plan.lengths, |&l| l)?;
        refuse_duplicates("--depths", &plan.depths, |&d| d)?;
        refuse_duplicates("--index", &plan.indexes, |p| p.name())?;
        refuse_duplicates("--compare", &plan.compare, |p| p.name())?;
        refuse_duplicates("--topk", &plan.topks, |&k| k)?;
        let max = model.max_positions;
        for &length in &plan.lengths {
            let taken = crate::run::checks::positions_taken(length, plan.generate);
            if taken > max {
                anyhow::bail!(
                    "--lengths {length} with --generate {}: expected at most the model's \
                 max_position_embeddings ({max}) positions, found {taken}",
                    plan.generate
                );
            }
        }
        check_prompts(plan, tok, scenario, model, finished)
    }

    /// Builds every prompt of the grid that still has a cell to run (each length, depth and
    /// sample not all of whose cells are in `finished`; in parallel, with a progress bar, and
    /// dropped again: a cell rebuilds its own, the same), so that no prompt can fail once cells
    /// are running, where a resume would stop at the same cell again. The first failure in grid
    /// order is reported with its cell.
    fn check_prompts(
        plan: &SweepPlan,
        tok: &V4Tokenizer,
        scenario: &Scenario,
        model: &GridModel,
        finished: &HashSet<String>,
    ) -> anyhow::Result<()> {
        use rayon::prelude::*;
        let all_finished = |length: usize, depth: f64, sample: usize| {
            plan.indexes.iter().all(|&i| {
                plan.topks.iter().all(|&k| {
                    finished.contains(&format!("{}-s{sample}", cell_id_base(length, depth, i, k)))
                })
            })
        };
        let prompts: Vec<(usize, f64, usize)> = plan
            .lengths
            .iter()
            .flat_map(|&l| {
                plan.depths
                    .iter()
                    .flat_map(move |&d| (0..plan.samples).map(move |s| (l, d, s)))
            })
            .filter(|&(l, d, s)| !all_finished(l, d, s))
            .collect();
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(prompts.len() as u64),
            indicatif::ProgressDrawTarget::stderr(),
        );
        bar.set_style(crate::run::progress::style(
            crate::run::progress::SWEEP_PROMPTS,
        ));
        let failures: Vec<Option<anyhow::Error>> = prompts
            .par_iter()
            .map(|&(length, depth, sample)| {
                let seed = plan.seed.wrapping_add(sample as u64);
                let built = sweep_prompt(tok, scenario, model, (length, depth, seed));
                bar.inc(1);
                built.err().map(|e| {
                    let samples = if plan.samples > 1 {
                        format!(", sample {sample} (seed {seed})")
                    } else {
                        String::new()
                    };
                    e.context(format!(
                        "the prompt of length {length} at depth {depth}%{samples}"
                    ))
                })
            })
            .collect();
        bar.finish_and_clear();
        match failures.into_iter().flatten().next() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The prompt of a sweep cell in the model's chat format: a length error names
    /// `--lengths`.
    pub(super) fn sweep_prompt(
        tok: &V4Tokenizer,
        scenario: &Scenario,
        model: &GridModel,
        (length, depth, seed): (usize, f64, u64),
    ) -> anyhow::Result<NeedlePrompt> {
        let spec = PromptSpec {
            scenario,
            format: model.format,
            target_tokens: length,
            depth_pct: depth,
            seed,
            max_positions: model.max_positions,
            needles: NeedleCount::default(),
        };
        build_prompt_for(&spec, tok).map_err(|e| {
            let msg = e.to_string();
            match msg.strip_prefix("--length ") {
                Some(rest) => anyhow::anyhow!("--lengths {rest}"),
                None => e.into(),
            }
        })
    }
}
pub use check::check_plan;
use check::sweep_prompt;

/// The id of every cell of `plan`'s grid, in no particular order.
fn plan_cell_ids(plan: &SweepPlan) -> impl Iterator<Item = String> + '_ {
    plan.lengths.iter().flat_map(move |&length| {
        plan.depths.iter().flat_map(move |&depth| {
            plan.indexes.iter().flat_map(move |&index| {
                plan.topks.iter().flat_map(move |&topk| {
                    (0..plan.samples)
                        .map(move |s| format!("{}-s{s}", cell_id_base(length, depth, index, topk)))
                })
            })
        })
    })
}

/// Runs (or resumes) the sweep into `out_dir` on the backend `device` asks for (decided and
/// placed before run.json is written, which records it); prints a line per finished cell to
/// `out`.
pub fn run_sweep(
    model_dir: &Path,
    plan: &SweepPlan,
    out_dir: &Path,
    device: &DeviceChoice,
    out: &mut dyn Write,
) -> anyhow::Result<SweepOutcome> {
    sweep_into(model_dir, plan, out_dir, None, device, out)
}

/// [`run_sweep`] into the directory of `lock`, which the caller holds (and keeps holding after
/// the sweep, e.g. to render the report).
pub fn run_sweep_locked(
    model_dir: &Path,
    plan: &SweepPlan,
    lock: &DirLock,
    device: &DeviceChoice,
    out: &mut dyn Write,
) -> anyhow::Result<SweepOutcome> {
    sweep_into(model_dir, plan, lock.dir(), Some(lock), device, out)
}

/// A sweep's model, opened and checked, not loaded yet.
enum Opened {
    /// DeepSeek-V4 on the backend `--device` chose.
    V4 {
        ckpt: Box<crate::checkpoint::Checkpoint>,
        target: Box<Target>,
    },
    /// DeepSeek-V4.1 on the CPU reference.
    V41 {
        ckpt: Box<crate::checkpoint::Checkpoint<crate::config::V41Config>>,
        chunk: usize,
    },
}

/// Opens the model of a sweep, its tokenizer and what the grid needs of it; the device is
/// decided (and the layers placed) for a V4 model, a V4.1 model runs on the CPU reference.
fn open(
    model_dir: &Path,
    plan: &SweepPlan,
    device: &DeviceChoice,
) -> anyhow::Result<(Opened, V4Tokenizer, GridModel, String)> {
    let v41 = matches!(
        crate::config::load_any(model_dir),
        Ok(crate::config::ModelDescription::V41(_))
    );
    if v41 {
        if plan.engine.is_some() {
            anyhow::bail!(
                "--engine: needlescope does not read a serving engine's DeepSeek-V4.1 selections \
                 yet (its two-level selection has no capture format here)"
            );
        }
        super::checks::refuse_v41_device(device)?;
        super::checks::refuse_non_v41_numerics(&plan.indexes, &plan.compare, plan.kv)?;
        let ckpt = crate::checkpoint::Checkpoint::open_v41(model_dir)?;
        let cfg = ckpt.config().clone();
        let t = &cfg.text;
        if let Some(&k) = plan.topks.iter().find(|&&k| k > t.max_position_embeddings) {
            anyhow::bail!(
                "--topk {k}: expected at most the model's max_position_embeddings ({})",
                t.max_position_embeddings
            );
        }
        let tok = super::trace_v41::load_tokenizer_v41(model_dir, &cfg)?;
        let model = GridModel {
            max_positions: t.max_position_embeddings,
            config_topk: t.index_topk,
            indexed_layers: cfg.layer_roles().indexed_layers(),
            format: crate::probe::chat::ChatFormat::V41,
        };
        let chunk = match plan.chunk {
            0 => crate::devices::placement::CPU_AUTO_CHUNK,
            c => c,
        };
        let hash = format!("sha256:{}", cfg.hash_hex());
        let opened = Opened::V41 {
            ckpt: Box::new(ckpt),
            chunk,
        };
        return Ok((opened, tok, model, hash));
    }
    if let Some(blocks) = plan.candidate_blocks {
        anyhow::bail!(
            "--candidate-blocks {blocks}: a DeepSeek-V4.1 what-if (its candidate stage); {} is \
             not a DeepSeek-V4.1 model",
            model_dir.display()
        );
    }
    let ckpt = crate::run::target::open_model(model_dir)?;
    let cfg = ckpt.config().clone();
    cfg.require_csa_layer(&model_dir.join("config.json"))?;
    crate::run::checks::refuse_topk_past_rows("--topk", &plan.topks, &cfg)?;
    let work = Workload {
        context: plan.lengths.iter().copied().max().unwrap_or(0) + plan.generate,
        chunk: plan.chunk,
        topk: plan.topks.iter().copied().max().unwrap_or(cfg.index_topk),
    };
    let tok = crate::run::target::load_tokenizer(model_dir, &cfg)?;
    let model = GridModel::v4(&cfg);
    let target = Target::prepare(device, &ckpt, &work)?;
    let opened = Opened::V4 {
        ckpt: Box::new(ckpt),
        target: Box::new(target),
    };
    Ok((opened, tok, model, config_hash(&cfg)))
}

impl Opened {
    fn chunk(&self) -> usize {
        match self {
            Opened::V4 { target, .. } => target.chunk(),
            Opened::V41 { chunk, .. } => *chunk,
        }
    }

    fn backend(&self) -> crate::record::BackendRecord {
        match self {
            Opened::V4 { target, .. } => target.record(),
            Opened::V41 { .. } => crate::record::BackendRecord::cpu(),
        }
    }

    fn fingerprint(&self) -> String {
        match self {
            Opened::V4 { ckpt, .. } => ckpt.fingerprint(),
            Opened::V41 { ckpt, .. } => ckpt.fingerprint(),
        }
    }

    /// Loads the model and runs the grid on it.
    fn run(self, task: SweepTask<'_>) -> anyhow::Result<(usize, usize)> {
        match self {
            Opened::V4 { ckpt, target } => target.run(&ckpt, ModelOptions::default(), task),
            Opened::V41 { ckpt, chunk } => {
                let plan = task.plan;
                let mut model = crate::model::v41::ModelV41::load(
                    &ckpt,
                    task.tok,
                    crate::model::v41::V41Options {
                        index: plan.indexes[0],
                        kv: plan.kv,
                        topk: plan.topks.first().copied(),
                        candidate_blocks: plan.candidate_blocks,
                        chunk,
                    },
                )?;
                task.run_grid(&mut model)
            }
        }
    }
}

fn sweep_into(
    model_dir: &Path,
    plan: &SweepPlan,
    out_dir: &Path,
    lock: Option<&DirLock>,
    device: &DeviceChoice,
    out: &mut dyn Write,
) -> anyhow::Result<SweepOutcome> {
    let (opened, tok, model, hash) = open(model_dir, plan, device)?;
    let scenario = Scenario::load_with(&plan.scenario, plan.haystack_file.as_deref())?;
    // Prompts of cells already finished (a resume) need no check.
    let finished = crate::report::store::finished_cell_ids(out_dir);
    check_plan(plan, &tok, &scenario, &model, &finished)?;
    if let Some(note) = scenario.competing_answers_note() {
        writeln!(out, "note: {note}")?;
    }
    let marks = super::target::model_marks(model_dir);
    if let Some(note) = scenario
        .thinking_note(plan.generate)
        .filter(|_| marks.judges_answers(plan.generate))
    {
        writeln!(out, "note: {note}")?;
    }
    if let Some(note) = crate::run::checks::compare_of_index_note(&plan.indexes, &plan.compare) {
        writeln!(out, "note: {note}")?;
    }
    // `--chunk auto` resolved with the backend (the chunk is not part of the results).
    let plan = &SweepPlan {
        chunk: opened.chunk(),
        ..plan.clone()
    };
    let info = RunInfo::new(
        model_dir.display().to_string(),
        hash,
        scenario.name.clone(),
        marks.synthetic,
        serde_json::to_value(plan)?,
    )
    .with_fingerprints(opened.fingerprint(), scenario.fingerprint()?)
    .with_backend(opened.backend());
    let (run_dir, finished) = match lock {
        Some(lock) => RunDir::create_or_resume_locked(lock.clone(), info)?,
        None => RunDir::create_or_resume(out_dir, info)?,
    };
    // From here on finished cells are on disk: Ctrl-C stops after the cell in flight.
    let resumable = crate::run::interrupt::Resumable::new(out_dir);
    let per_prompt = plan.indexes.len() * plan.topks.len();
    let total = plan.lengths.len() * plan.depths.len() * plan.samples * per_prompt;
    // Cells of this grid already finished (a directory whose grid grew holds others too).
    let ids: HashSet<String> = plan_cell_ids(plan).collect();
    let finished: Vec<CellRecord> = finished
        .into_iter()
        .filter(|c| ids.contains(&c.cell_id))
        .collect();
    if !finished.is_empty() {
        writeln!(
            out,
            "resuming {}: {} of {total} cells already finished",
            out_dir.display(),
            finished.len()
        )?;
    }
    for note in run_dir.notes() {
        writeln!(out, "note: {}: {note}", out_dir.display())?;
    }
    let dir_lock = run_dir.lock().clone();
    // Every profile of the directory's grid is scored on each new cell (a grown grid's
    // earlier profiles too), so cells of one directory compare the same profiles.
    let grid_indexes: Vec<IndexProfile> = run_dir
        .info()
        .sweep_args
        .get("indexes")
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_else(|| plan.indexes.clone());
    let task = SweepTask {
        plan,
        grid_indexes,
        model: &model,
        tok: &tok,
        scenario: &scenario,
        judge_by_answer: marks.judges_answers(plan.generate),
        run_dir,
        bars: SweepBars::new(
            total as u64,
            finished.len() as u64,
            (plan.lengths.iter().sum::<usize>() * total / plan.lengths.len().max(1)) as u64,
            finished.iter().map(|c| c.target_tokens as u64).sum(),
        ),
        total,
        out,
    };
    let (cells_run, cells_skipped) = opened.run(task)?;
    resumable.rendering();
    Ok(SweepOutcome {
        dir: out_dir.to_path_buf(),
        cells_run,
        cells_skipped,
        lock: dir_lock,
        rendering: resumable,
    })
}

/// One prompt of the grid, shared by its (index, top-k) cells: the prompt, its grid length,
/// the cell id suffix (`-s{sample}`) and the serving engine's capture of it (`--engine`).
struct GridPrompt<'a> {
    prompt: &'a NeedlePrompt,
    length: usize,
    suffix: &'a str,
    capture: Option<std::sync::Arc<crate::probe::capture::EngineCapture>>,
}

/// The sweep's loop over prompts and cells on a loaded model of any backend; returns (cells
/// run, cells skipped).
struct SweepTask<'a> {
    plan: &'a SweepPlan,
    /// run.json's `indexes` (the plan's, or more when the grid grew): scored on every cell.
    grid_indexes: Vec<IndexProfile>,
    model: &'a GridModel,
    tok: &'a V4Tokenizer,
    scenario: &'a Scenario,
    judge_by_answer: bool,
    run_dir: RunDir,
    bars: SweepBars,
    total: usize,
    out: &'a mut dyn Write,
}

impl ModelTask for SweepTask<'_> {
    type Output = (usize, usize);

    fn run<B: Backend>(self, model: &mut Model<B>) -> anyhow::Result<(usize, usize)> {
        self.run_grid(model)
    }
}

impl SweepTask<'_> {
    /// The grid on a loaded model of either family and any backend.
    fn run_grid<M: ProbeModel>(mut self, model: &mut M) -> anyhow::Result<(usize, usize)> {
        // Drawn once the model is loaded (its own bar is gone then).
        self.bars.show();
        let plan = self.plan;
        let per_prompt = plan.indexes.len() * plan.topks.len();
        let (mut run_count, mut skipped) = (0, 0);
        for &length in &plan.lengths {
            for &depth in &plan.depths {
                for sample in 0..plan.samples {
                    let seed = plan.seed.wrapping_add(sample as u64);
                    let suffix = format!("-s{sample}");
                    // Which combinations of this prompt are still to do (ids need the prompt
                    // length, which is the target length by construction).
                    let todo: Vec<(IndexProfile, usize)> = plan
                        .indexes
                        .iter()
                        .flat_map(|&i| plan.topks.iter().map(move |&k| (i, k)))
                        .filter(|&(i, k)| {
                            !self.run_dir.is_finished(&format!(
                                "{}{suffix}",
                                cell_id_base(length, depth, i, k)
                            ))
                        })
                        .collect();
                    skipped += per_prompt - todo.len();
                    if todo.is_empty() {
                        continue;
                    }
                    let prompt =
                        sweep_prompt(self.tok, self.scenario, self.model, (length, depth, seed))?;
                    let grid_prompt = GridPrompt {
                        capture: self.engine_capture(&prompt)?,
                        prompt: &prompt,
                        length,
                        suffix: &suffix,
                    };
                    for (index, topk) in todo {
                        run_count += self.cell(model, &grid_prompt, index, topk)?;
                        self.stop_if_requested()?;
                    }
                }
            }
        }
        self.bars.prefill.finish_and_clear();
        self.bars.cells.finish_and_clear();
        Ok((run_count, skipped))
    }

    /// Ends the sweep with [`Interrupted`](crate::run::interrupt::Interrupted) when Ctrl-C asked
    /// for it and cells remain (checked after each committed cell, so the cell in flight at
    /// the press, its prompt building included, is finished first).
    fn stop_if_requested(&mut self) -> anyhow::Result<()> {
        if !crate::run::interrupt::stop_requested() || self.finished_in_plan() >= self.total {
            return Ok(());
        }
        self.bars.prefill.finish_and_clear();
        self.bars.cells.abandon();
        let dir = self.run_dir.path().to_path_buf();
        // The finished cells' summary, plots and report.html, under the run's own lock; a
        // failure there is said, and loses nothing (`report DIR` renders them later).
        crate::run::interrupt::rendering_after_stop();
        let rendered = match crate::report::rerender_locked(self.run_dir.lock(), false) {
            Ok(done) => {
                write!(self.out, "{}", done.table)?;
                true
            }
            Err(e) => {
                writeln!(self.out, "warning: the report of the finished cells: {e}")?;
                false
            }
        };
        Err(crate::run::interrupt::Interrupted {
            unit: "cells",
            next: crate::run::interrupt::after_stop(&dir, rendered),
            dir: Some(dir),
            finished: self.finished_in_plan(),
            total: self.total,
        }
        .into())
    }

    /// Finished cells of this run's grid (a grown directory also holds cells of others).
    fn finished_in_plan(&self) -> usize {
        plan_cell_ids(self.plan)
            .filter(|id| self.run_dir.is_finished(id))
            .count()
    }

    /// With `--engine`: the prompt sent to the serving engine once, its capture checked; its K
    /// must be the sweep's top-k.
    fn engine_capture(
        &mut self,
        prompt: &NeedlePrompt,
    ) -> anyhow::Result<Option<std::sync::Arc<crate::probe::capture::EngineCapture>>> {
        let Some(e) = &self.plan.engine else {
            return Ok(None);
        };
        let expect = crate::probe::capture::CaptureExpect {
            source: e.url.clone(),
            prompt_tokens: prompt.tokens.len(),
            csa_layers: self.model.indexed_layers.clone(),
            config_topk: self.model.config_topk,
            engine_topk: e.topk,
            prompt_positions: Vec::new(),
        };
        self.bars
            .prefill
            .set_message(format!("engine: {} tokens", prompt.tokens.len()));
        let capture = crate::run::sglang::capture_from_server(
            &e.url,
            &prompt.tokens,
            self.plan.generate,
            e.timeout,
            &expect,
        )?;
        let planned = self.plan.topks.first().copied().unwrap_or(0);
        if capture.topk != planned {
            anyhow::bail!(
                "--engine {}: the engine's K is {} (from its payload), the sweep's top-k {planned}: \
                 pass --engine-topk {}",
                e.url,
                capture.topk,
                capture.topk
            );
        }
        let out = &mut self.out;
        for w in &capture.warnings {
            self.bars.cells.suspend(|| writeln!(out, "warning: {w}"))?;
        }
        Ok(Some(std::sync::Arc::new(capture)))
    }

    /// Runs one (index, top-k) combination of a prompt and commits its cell; returns the
    /// number of cells written.
    fn cell<M: ProbeModel>(
        &mut self,
        model: &mut M,
        grid_prompt: &GridPrompt,
        index: IndexProfile,
        topk: usize,
    ) -> anyhow::Result<usize> {
        let GridPrompt {
            prompt,
            length,
            suffix,
            ref capture,
        } = *grid_prompt;
        let capture = capture.clone();
        let plan = self.plan;
        let grid = &self.grid_indexes;
        let compare = match &capture {
            Some(_) => crate::probe::engine::scored_with_engine(grid, &plan.compare),
            // `exact` is scored whenever a rounding profile drives, as in a probe: it costs no
            // forward and only it tells rounding from a too-small top-k. run.json keeps
            // `--compare` as given, so directories written before still resume and grow.
            None => crate::probe::session::with_exact(grid, &plan.compare),
        };
        let opts = ProbeOptions {
            indexes: vec![index],
            compare: crate::probe::session::comparison_profiles(grid, &compare),
            topks: vec![topk],
            kv: plan.kv,
            generate: plan.generate,
            chunk: plan.chunk,
            probe_question: false,
            engine: capture,
        };
        let inputs = ProbeInputs {
            tok: self.tok,
            scenario: self.scenario,
            prompt,
            opts: &opts,
            cell_suffix: suffix,
        };
        // A sweep finishes the cell in flight (`within_runs: false`): the cell is its unit.
        let stop = StopCheck {
            requested: &crate::run::interrupt::stop_requested,
            within_runs: false,
        };
        let runs = run_probe(model, &inputs, &mut self.bars, stop)?;
        let mut written = 0;
        for run in runs {
            let cell = CellRecord::of_run(&run, &prompt.place(length), self.judge_by_answer);
            commit_checked(&run, || {
                Ok(self.run_dir.append_cell_with_engine(
                    &cell,
                    &run.layers,
                    &run.attention,
                    &run.engine_records,
                )?)
            })?;
            written += 1;
            self.bars.cell_done(length);
            let verdict = CellVerdict::of(
                cell.answer_correct,
                cell.csa_layers_selected,
                cell.csa_layers_nontrivial,
            )
            .line("indexer", "k");
            // Coarse haystack units (tool definitions at short lengths) can leave the needle
            // a few points off the requested depth; the line ends saying where it is (at the
            // end, so the columns stay aligned).
            let landed = if (prompt.actual_depth_pct - cell.depth_pct).abs() > 1.0 {
                format!("  (needle at {:.1}%)", prompt.actual_depth_pct)
            } else {
                String::new()
            };
            // With several samples per grid point, the line says which prompt it was.
            let sample = if plan.samples > 1 {
                format!("  sample {}", suffix.trim_start_matches("-s"))
            } else {
                String::new()
            };
            // With exact scored, how many of the lost layers the exact math keeps (lost to
            // rounding; the summary's "exact keeps" column sums these).
            let rounding = match cell.exact_keeps {
                Some(n) if cell.layers_lost() > 0 => format!("  exact keeps {n}"),
                _ => String::new(),
            };
            // With an engine: how many non-trivial layers its own selection lost.
            let engine_part = if run.engine_records.is_empty() {
                String::new()
            } else {
                let v = crate::record::verdict::EngineVerdict::of(
                    &run.engine_records,
                    &run.layers,
                    cell.answer_position(),
                    &crate::probe::engine::profile_order(),
                    Some(&run.index),
                );
                let lost: std::collections::BTreeSet<usize> =
                    v.lost.iter().map(|l| l.layer).collect();
                let closest = v
                    .closest
                    .map_or(String::new(), |c| format!(", closest {}", c.profile));
                format!(
                    "  engine lost {}/{}{closest}",
                    lost.len(),
                    v.nontrivial_layers
                )
            };
            let word = crate::record::verdict::LayerWord::of(&run.layers);
            let line = format!(
                "{:>7} tokens  depth {:>4}{sample}  {:<12} top-{:<5} {:<20} worst {word} rank {:>6}  lost {}/{} layers  {:.1} s{rounding}{engine_part}{landed}",
                cell.prompt_tokens,
                crate::units::percent_label(cell.depth_pct),
                cell.index.name(),
                cell.topk,
                verdict,
                cell.min_needle_rank.map_or("-".into(), |r| r.to_string()),
                cell.layers_lost(),
                cell.csa_layers_nontrivial,
                cell.wall_seconds
            );
            let out = &mut self.out;
            self.bars.cells.suspend(|| writeln!(out, "{line}"))?;
        }
        Ok(written)
    }
}

#[cfg(test)]
mod tests {
    //! Unit tests of `sweep.rs`.

    use super::*;

    fn run(disagreements: usize) -> ProbeRun {
        ProbeRun {
            cell_id: "L1024-d50-fp8-k64".into(),
            index: "fp8".into(),
            kv: "exact".into(),
            topk: 64,
            answer_text: String::new(),
            answer_correct: None,
            generated_ids: vec![],
            layers: vec![],
            attention: vec![],
            engine_records: vec![],
            selection_disagreements: disagreements,
            selection_checks: 21,
            wall_seconds: 0.0,
        }
    }

    /// A run whose selection disagreed with its ranks is refused before its cell is appended.
    #[test]
    fn a_run_failing_its_internal_check_is_not_committed() {
        let mut committed = 0;
        let e = commit_checked(&run(2), || {
            committed += 1;
            Ok(())
        })
        .unwrap_err()
        .to_string();
        assert_eq!(committed, 0);
        assert!(e.contains("in run L1024-d50-fp8-k64"), "{e}");
        assert!(e.contains("at 2 of 21 (layer, position) checks"), "{e}");
        assert!(e.ends_with("the cell was not recorded"), "{e}");
        commit_checked(&run(0), || {
            committed += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(committed, 1);
    }
}
