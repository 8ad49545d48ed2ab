//! `probe` on a DeepSeek-V4.1 checkpoint: the same runs, records and report as on V4
//! (`super::probe`), through V4.1's forward (`model::v41`) on the CPU reference.
//!
//! What differs from V4: the prompt is framed by V4.1's chat encoder (`ChatFormat::V41`); the
//! profiles are those without a Hadamard rotation and `--kv` is `exact` or `release`
//! (defaults: the release's `v41-fp4` and `release`, chosen by the CLI); the index layers are
//! V4.1's index sources, whose records carry the stage columns (`record::stage`): rank among
//! pair rows on the ratio-2 sources, block rank and own rank on the candidate source, rank
//! inside the candidate mask and without it on each reindex layer, and the stage verdict;
//! `--candidate-blocks` sets the candidate budget for every run. Refused by name: a serving
//! engine (`--engine`: V4.1's two-level selection has no capture format needlescope reads
//! yet) and a GPU (`--device cuda`: V4.1's CUDA backend is a later issue).

use std::path::Path;

use super::probe::{LocalProbe, ProbePlan};
use super::prompt::PromptSource;
use super::target::model_marks;
use crate::checkpoint::Checkpoint;
use crate::model::v41::{ModelV41, V41Options};
use crate::probe::chat::ChatFormat;
use crate::probe::session::{run_probe, ProbeInputs, ProbeOptions, StopCheck};
use crate::record::BackendRecord;

/// Runs the probe of `plan` on the DeepSeek-V4.1 checkpoint it names. Nothing is recorded
/// yet: the caller prints, then calls [`LocalProbe::finish`].
pub fn run_v41(plan: &ProbePlan) -> anyhow::Result<LocalProbe> {
    plan.check_answer_judged()?;
    if plan.engine.is_some() {
        anyhow::bail!(
            "--engine: needlescope does not read a serving engine's DeepSeek-V4.1 selections yet \
             (its two-level selection has no capture format here); probe {} without --engine",
            plan.model.display()
        );
    }
    super::checks::refuse_v41_device(&plan.device)?;
    super::checks::refuse_non_v41_numerics(&plan.indexes, &plan.compare, plan.kv)?;
    let ckpt = Checkpoint::open_v41(plan.model)?;
    let cfg = ckpt.config().clone();
    let t = &cfg.text;
    let tok = super::trace_v41::load_tokenizer_v41(plan.model, &cfg)?;
    if let Some(&k) = plan.topks.iter().find(|&&k| k > t.max_position_embeddings) {
        anyhow::bail!(
            "--topk {k}: expected at most the model's max_position_embeddings ({})",
            t.max_position_embeddings
        );
    }
    let (scenario, prompt) = plan.prompt.build(
        &tok,
        ChatFormat::V41,
        t.max_position_embeddings,
        plan.generate,
    )?;
    let positions = prompt.tokens.len() + plan.generate;
    if positions > t.max_position_embeddings {
        anyhow::bail!(
            "{} prompt tokens with --generate {}: expected at most the model's \
             max_position_embeddings ({}) positions, found {positions}",
            prompt.tokens.len(),
            plan.generate,
            t.max_position_embeddings
        );
    }
    let marks = model_marks(plan.model);
    let judge_answers = marks.judges_answers(plan.generate);
    if let Some(note) = scenario
        .thinking_note(plan.generate)
        .filter(|_| judge_answers)
    {
        eprintln!("note: {note}");
    }
    let topks = match plan.topks.is_empty() {
        true => vec![t.index_topk],
        false => plan.topks.clone(),
    };
    let compare = crate::probe::session::with_exact(&plan.indexes, &plan.compare);
    let chunk = match plan.chunk {
        0 => crate::devices::placement::CPU_AUTO_CHUNK,
        c => c,
    };
    let opts = ProbeOptions {
        indexes: plan.indexes.clone(),
        compare: crate::probe::session::comparison_profiles(&plan.indexes, &compare),
        topks,
        kv: plan.kv,
        generate: plan.generate,
        chunk,
        probe_question: plan.probe_question,
        engine: None,
    };
    let backend = BackendRecord::cpu();
    let hash = format!("sha256:{}", cfg.hash_hex());
    let store = match plan.out {
        Some(dir) => Some(super::probe::open_store(
            dir,
            plan,
            (&ckpt, hash),
            &scenario,
            backend.clone(),
        )?),
        None => None,
    };
    super::checks::refuse_host_shortfall(
        ckpt.config(),
        &crate::devices::plan::Footprint::of_checkpoint(&ckpt),
        positions,
        chunk,
        crate::backend::WeightResidency::Decoded,
    )?;
    let mut model = ModelV41::load(
        &ckpt,
        &tok,
        V41Options {
            index: opts.indexes[0],
            kv: plan.kv,
            topk: Some(opts.topks[0]),
            candidate_blocks: plan.candidate_blocks,
            chunk,
        },
    )?;
    let _stoppable = super::interrupt::Resumable::probe(plan.out);
    let mut progress = super::progress::ProbeBar::new();
    let inputs = ProbeInputs {
        tok: &tok,
        scenario: &scenario,
        prompt: &prompt,
        opts: &opts,
        cell_suffix: "",
    };
    let stop = StopCheck {
        requested: &super::interrupt::stop_requested,
        within_runs: true,
    };
    let runs = run_probe(&mut model, &inputs, &mut progress, stop)?;
    progress.finish();
    for run in &runs {
        run.check_selection()
            .map_err(|why| anyhow::anyhow!("{why}; no run was printed or recorded"))?;
    }
    let target_tokens = match plan.prompt {
        PromptSource::Scenario { length, .. } => length,
        PromptSource::Conversation { .. } => prompt.tokens.len(),
    };
    Ok(LocalProbe {
        roles: cfg.layer_roles(),
        scenario,
        prompt,
        opts,
        runs,
        backend,
        marks,
        judge_answers,
        engine: None,
        store,
        target_tokens,
        out_dir: plan.out.map(Path::to_path_buf),
    })
}
