//! The sweep's checks before anything runs (a part of `sweep.rs`, kept apart so that file stays
//! readable): list flags without repeats, lengths within the model's positions, and every
//! prompt of the grid built once, so that no cell can fail midway.

use super::SweepPlan;
use crate::config::ModelConfig;
use crate::probe::{build_prompt, NeedlePrompt, Scenario, V4Tokenizer};
use crate::report::records::cell_id_base;
use std::collections::HashSet;

/// Refuses, before anything runs or is written, a plan that would fail or repeat cells midway:
/// a value given twice in a list flag, a length (plus `--generate`) past the model's
/// positions, or any prompt of the grid that cannot be built (all are built here).
pub fn check_plan(
    plan: &SweepPlan,
    tok: &V4Tokenizer,
    scenario: &Scenario,
    cfg: &ModelConfig,
    finished: &HashSet<String>,
) -> anyhow::Result<()> {
    use crate::cli::values::refuse_duplicates;
    refuse_duplicates("--lengths", &plan.lengths, |&l| l)?;
    refuse_duplicates("--depths", &plan.depths, |&d| d)?;
    refuse_duplicates("--index", &plan.indexes, |p| p.name())?;
    refuse_duplicates("--compare", &plan.compare, |p| p.name())?;
    refuse_duplicates("--topk", &plan.topks, |&k| k)?;
    crate::cli::values::refuse_topk_past_rows("--topk", &plan.topks, cfg)?;
    let max = cfg.max_position_embeddings;
    for &length in &plan.lengths {
        let taken = crate::cli::values::positions_taken(length, plan.generate);
        if taken > max {
            anyhow::bail!(
                "--lengths {length} with --generate {}: expected at most the model's \
                 max_position_embeddings ({max}) positions, found {taken}",
                plan.generate
            );
        }
    }
    check_prompts(plan, tok, scenario, max, finished)
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
    max_positions: usize,
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
    bar.set_style(crate::progress::style(crate::progress::SWEEP_PROMPTS));
    let failures: Vec<Option<anyhow::Error>> = prompts
        .par_iter()
        .map(|&(length, depth, sample)| {
            let seed = plan.seed.wrapping_add(sample as u64);
            let built = sweep_prompt(tok, scenario, length, depth, seed, max_positions);
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

/// [`build_prompt`] for a sweep cell: a length error names `--lengths`.
pub(super) fn sweep_prompt(
    tok: &V4Tokenizer,
    scenario: &Scenario,
    length: usize,
    depth: f64,
    seed: u64,
    max_positions: usize,
) -> anyhow::Result<NeedlePrompt> {
    build_prompt(tok, scenario, length, depth, seed, max_positions).map_err(|e| {
        let msg = e.to_string();
        match msg.strip_prefix("--length ") {
            Some(rest) => anyhow::anyhow!("--lengths {rest}"),
            None => e.into(),
        }
    })
}
