//! `probe --out DIR`: the probe's records in a report directory that `needlescope report` reads
//! (run.json, cells.csv, layers.csv, attention.csv, summary.json, PNGs), through the sweep's
//! store ([`RunDir`]).
//!
//! Several probes may share a directory, each adding its cells (one per driving profile and
//! top-k, named by length, depth, profile and top-k), as long as everything else that shapes
//! the records is the same: model (config and weights), scenario, `--kv`, `--seed`,
//! `--generate`, `--compare` and `--probe`. Those are run.json's `sweep_args` (with
//! `"command": "probe"`, so a sweep's directory is refused too), checked before the model
//! runs. A cell already recorded is not written again.
//!
//! The directory is locked ([`crate::report::DirLock`]) from [`open`], before the model runs,
//! until [`record`] has rendered the report: a probe is refused while another probe or a sweep
//! writes there.

use super::probe::{ProbeArgs, ProbeSet};
use crate::checkpoint::Checkpoint;
use crate::probe::{NeedlePrompt, Scenario};
use crate::record::ProbeRun;
use crate::record::{config_hash, BackendRecord, RunInfo};
use crate::report::RunDir;
use std::io::Write;
use std::path::Path;

/// The arguments that must agree between probes sharing a directory.
fn shared_args(args: &ProbeArgs) -> serde_json::Value {
    let mut compare: Vec<&str> = args.compare.iter().map(|p| p.name()).collect();
    compare.sort_unstable();
    serde_json::json!({
        "command": "probe",
        "kv": args.kv.name(),
        "seed": args.seed,
        "generate": args.generate,
        "compare": compare,
        "probe": match args.probe {
            ProbeSet::Answer => "answer",
            ProbeSet::Question => "question",
        },
    })
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
        store.append_cell(&cell, &run.layers, &run.attention)?;
    }
    // The directory stays locked until the PNGs are rendered.
    let lock = store.lock().clone();
    drop(store);
    let done = crate::report::rerender_locked(&lock, false)?;
    writeln!(out, "{}", done.files_line(lock.dir()))?;
    Ok(())
}
