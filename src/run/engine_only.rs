//! The engine-only sweep: `sweep --engine URL` with no local forward (`--no-local`, or a model
//! directory holding config.json and a tokenizer but no weights). Every prompt of the grid is
//! built with the model's tokenizer and config, sent to the serving engine once, and its capture
//! reduced to the needle's membership per CSA layer at the answer and decode positions
//! (`probe::engine::membership_records`) and the engine's answer: one engine_cells.csv row and
//! its engine.csv rows per prompt, in an engine-only report directory
//! (`report::store::engine_only`), resumable like any sweep. It runs at the engine's speed and
//! needs no local memory for weights: models that do not fit here (V4-Pro) are swept this way.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use crate::probe::capture::CaptureExpect;
use crate::probe::capture::EngineCapture;
use crate::probe::NeedlePrompt;
use crate::probe::Scenario;
use crate::record::engine::{engine_cell_id, EngineAnswer, EngineCellRecord, EngineLayerRecord};
use crate::record::verdict::CellVerdict;
use crate::record::{config_hash, RunInfo};
use crate::report::store::EngineOnlyDir;

use super::sweep::{check_plan, SweepPlan};
use super::target::{model_marks, ModelMarks};

/// A prompt about to be held against the engine alone, with what judging its answer needs.
pub struct HeldPrompt<'a> {
    pub prompt: &'a NeedlePrompt,
    pub scenario: &'a Scenario,
    /// The model's end-of-sequence id (an answer ending in it has ended).
    pub eos: u32,
    pub marks: ModelMarks,
}

/// One engine-only cell: the needle's membership in the engine's selections (engine.csv rows)
/// and its engine_cells.csv row.
pub struct EngineOnlyCell {
    pub engine_records: Vec<EngineLayerRecord>,
    pub cell: EngineCellRecord,
}

/// The one place an engine-only cell is assembled (`probe` and `sweep` without a local
/// forward): membership at the answer position, at every decode position fed back (not the
/// stop edge) and at any other probed position the capture holds (`--probe question`), and
/// the engine's answer judged under the prompt's scenario.
pub fn engine_only_cell(
    held: &HeldPrompt,
    capture: &EngineCapture,
    cell_id: String,
    target_tokens: usize,
    started: Instant,
) -> EngineOnlyCell {
    let answer = held.prompt.tokens.len() - 1;
    let last_fed = answer + capture.output_ids.len().saturating_sub(1);
    let mut positions = vec![answer];
    positions.extend(
        capture
            .selections
            .keys()
            .copied()
            .filter(|&p| p <= last_fed),
    );
    positions.sort_unstable();
    positions.dedup();
    let spans: Vec<(usize, usize)> = held.prompt.needles.iter().map(|n| n.span).collect();
    let engine_records =
        crate::probe::engine::membership_records(capture, &cell_id, &spans, &positions);
    let correct = crate::probe::engine::engine_answer_correct(
        capture,
        held.scenario,
        &held.prompt.answer_values,
        held.eos,
        held.marks.judges_answers(capture.output_ids.len()),
    );
    let answer = EngineAnswer {
        topk: capture.topk,
        text: capture.text.clone(),
        correct,
    };
    let cell = EngineCellRecord::of(
        cell_id,
        &held.prompt.place(target_tokens),
        answer,
        &engine_records,
        started.elapsed().as_secs_f64(),
    );
    EngineOnlyCell {
        engine_records,
        cell,
    }
}

/// What an engine-only sweep did: cells run, cells already finished.
pub struct EngineOnlyOutcome {
    pub cells_run: usize,
    pub cells_skipped: usize,
    pub table: String,
}

/// The arguments run.json records for an engine-only sweep (the resume check compares them).
fn recorded_args(plan: &SweepPlan) -> serde_json::Value {
    serde_json::json!({
        "command": "sweep",
        "local": false,
        "engine": "sglang",
        "scenario": plan.scenario,
        "lengths": plan.lengths,
        "depths": plan.depths,
        "topks": plan.topks,
        "samples": plan.samples,
        "seed": plan.seed,
        "generate": plan.generate,
    })
}

/// Runs (or resumes) the engine-only sweep of `plan` (which has an engine) into `out_dir`.
pub fn run_engine_only_sweep(
    model_dir: &Path,
    plan: &SweepPlan,
    out_dir: &Path,
    out: &mut dyn Write,
) -> anyhow::Result<EngineOnlyOutcome> {
    let Some(engine) = &plan.engine else {
        anyhow::bail!("an engine-only sweep needs --engine URL");
    };
    let config_path = model_dir.join("config.json");
    let cfg = crate::config::ModelConfig::load(&config_path)?;
    cfg.require_csa_layer(&config_path)?;
    let tok = super::target::load_tokenizer(model_dir, &cfg)?;
    let scenario = Scenario::load_with(&plan.scenario, plan.haystack_file.as_deref())?;
    let finished_hint = crate::report::store::finished_cell_ids(out_dir);
    crate::run::checks::refuse_topk_past_rows("--topk", &plan.topks, &cfg)?;
    check_plan(
        plan,
        &tok,
        &scenario,
        &crate::run::sweep::GridModel::v4(&cfg),
        &finished_hint,
    )?;
    let marks = model_marks(model_dir);
    let info = RunInfo::new(
        model_dir.display().to_string(),
        config_hash(&cfg),
        scenario.name.clone(),
        marks.synthetic,
        recorded_args(plan),
    )
    .with_fingerprints(String::new(), scenario.fingerprint()?);
    let mut store = EngineOnlyDir::create_or_resume(out_dir, info)
        .map_err(|e| anyhow::anyhow!("--out {}: {e}", out_dir.display()))?;
    for note in store.notes() {
        writeln!(out, "note: {}: {note}", out_dir.display())?;
    }
    let _resumable = super::interrupt::Resumable::new(out_dir);
    let topk = plan.topks.first().copied().unwrap_or(cfg.index_topk);
    let total = plan.lengths.len() * plan.depths.len() * plan.samples;
    // Cells of this grid already finished (a grown directory also holds cells of others).
    let already = plan
        .lengths
        .iter()
        .flat_map(|&l| plan.depths.iter().map(move |&d| (l, d)))
        .flat_map(|(l, d)| (0..plan.samples).map(move |s| engine_cell_id(l, d, topk, Some(s))))
        .filter(|id| store.is_finished(id))
        .count();
    if already > 0 {
        writeln!(
            out,
            "resuming {}: {already} of {total} cells already finished",
            out_dir.display()
        )?;
    }
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(total as u64),
        indicatif::ProgressDrawTarget::stderr(),
    );
    bar.set_style(super::progress::style(super::progress::SWEEP_CELLS));
    bar.set_position(already as u64);
    let csa_layers = cfg.layer_roles().indexed_layers();
    let (mut run, mut skipped) = (0, 0);
    for &length in &plan.lengths {
        for &depth in &plan.depths {
            for sample in 0..plan.samples {
                let id = engine_cell_id(length, depth, topk, Some(sample));
                if store.is_finished(&id) {
                    skipped += 1;
                    continue;
                }
                let seed = plan.seed.wrapping_add(sample as u64);
                let prompt = crate::probe::build_prompt(
                    &tok,
                    &scenario,
                    length,
                    depth,
                    seed,
                    cfg.max_position_embeddings,
                )?;
                bar.set_message(format!("engine: {length} tokens, depth {depth}%"));
                let started = Instant::now();
                let expect = CaptureExpect {
                    source: engine.url.clone(),
                    prompt_tokens: prompt.tokens.len(),
                    csa_layers: csa_layers.clone(),
                    config_topk: cfg.index_topk,
                    engine_topk: engine.topk,
                    prompt_positions: Vec::new(),
                };
                let capture = super::sglang::capture_from_server(
                    &engine.url,
                    &prompt.tokens,
                    plan.generate,
                    engine.timeout,
                    &expect,
                )?;
                if capture.topk != topk {
                    anyhow::bail!(
                        "--engine {}: the engine's K is {} (from its payload), the sweep's \
                         top-k {topk}: pass --engine-topk {}",
                        engine.url,
                        capture.topk,
                        capture.topk
                    );
                }
                for w in &capture.warnings {
                    bar.suspend(|| writeln!(out, "warning: {w}"))?;
                }
                let held = HeldPrompt {
                    prompt: &prompt,
                    scenario: &scenario,
                    eos: cfg.eos_token_id,
                    marks,
                };
                let EngineOnlyCell {
                    engine_records,
                    cell,
                } = engine_only_cell(&held, &capture, id, length, started);
                let (selected, nontrivial) = (cell.csa_layers_selected, cell.csa_layers_nontrivial);
                store.append(&cell, &engine_records)?;
                run += 1;
                bar.inc(1);
                let verdict =
                    CellVerdict::of(cell.answer_correct, selected, nontrivial).line("engine", "K");
                let line = format!(
                    "{:>7} tokens  depth {:>4}  engine K {:<5} {:<20} needle selected on {selected}/{nontrivial} layers  {:.1} s",
                    cell.prompt_tokens,
                    crate::units::percent_label(depth),
                    cell.engine_topk,
                    verdict,
                    cell.wall_seconds
                );
                bar.suspend(|| writeln!(out, "{line}"))?;
                if super::interrupt::stop_requested() && already + run < total {
                    bar.abandon();
                    // The finished cells' page, so the stop loses nothing to read.
                    super::interrupt::rendering_after_stop();
                    let page = crate::report::store::EngineOnlyRecords::read(out_dir)
                        .map_err(anyhow::Error::from)
                        .and_then(|r| {
                            Ok(crate::report::html::write_engine_only_html(&r, out_dir)?)
                        });
                    return Err(super::interrupt::Interrupted {
                        unit: "cells",
                        // An engine-only page has no plots.
                        next: format!(
                            "{}; {}",
                            match page {
                                Ok(_) => format!("their report.html is in {}", out_dir.display()),
                                Err(_) => format!(
                                    "`needlescope report {}` writes their report.html",
                                    out_dir.display()
                                ),
                            },
                            super::interrupt::next_step(out_dir)
                        ),
                        dir: Some(out_dir.to_path_buf()),
                        finished: already + run,
                        total,
                    }
                    .into());
                }
            }
        }
    }
    bar.finish_and_clear();
    // The page is written while the directory is still ours (the store holds its lock).
    let records = crate::report::store::EngineOnlyRecords::read(out_dir)?;
    crate::report::html::write_engine_only_html(&records, out_dir)?;
    drop(store);
    let table = records.table();
    Ok(EngineOnlyOutcome {
        cells_run: run,
        cells_skipped: skipped,
        table,
    })
}
