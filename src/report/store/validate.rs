//! Checks of cells.csv records beyond parsing: a row can be well formed and still wrong (edited
//! by hand, copied from another run, written twice by two sweeps). [`CellCheck`] refuses, naming
//! the file, line and field ([`ReportError::Invalid`]):
//!
//! - a cell_id seen before (the store keeps one row per cell);
//! - impossible values: `topk` 0, `depth_pct` not finite or outside 0..=100,
//!   `min_needle_rank` 0 (ranks count from 1), `csa_layers_selected` above
//!   `csa_layers_nontrivial`, a needle or answer span that is reversed or ends past
//!   `prompt_tokens`;
//! - derived columns that do not follow from the row: `recalled` other than the verdict
//!   ([`CellRecord::verdict`]), `exact_keeps` above the layers lost, `sample` other than the
//!   cell_id's `-s{sample}` (`exact_keeps` against layers.csv is `agreement`'s);
//! - for a sweep or demo run (run.json's `sweep_args` is a sweep plan): a `target_tokens`,
//!   `depth_pct`, `index`, `topk` or `kv` outside the plan, a `prompt_tokens` other than
//!   `target_tokens` (sweep prompts are built to the exact length), and a cell_id other than
//!   `L{prompt_tokens}-d{depth_pct}-{index}-k{topk}-s{sample}` with sample below `samples`
//!   (the form `crate::run::sweep` writes and looks up on resume);
//! - for a `probe --out` run (`sweep_args.command` is `probe`): a `kv` other than run.json's
//!   and a cell_id other than `L{prompt_tokens}-d{depth_pct}-{index}-k{topk}`
//!   (`crate::probe::session::cell_id`).
//!
//! A run.json whose `sweep_args` is neither (written by hand or by another version) gets the
//! first two groups only. layers.csv and attention.csv rows are checked one by one by
//! [`super::row_checks`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::record::{CellRecord, IndexProfile, KvMode, RunInfo};
use crate::report::error::{ReportError, Result};

/// The result-determining part of a sweep's `sweep_args` (`crate::run::sweep::SweepPlan`).
#[derive(Debug, Deserialize)]
struct SweepGrid {
    lengths: Vec<usize>,
    depths: Vec<f64>,
    indexes: Vec<IndexProfile>,
    topks: Vec<usize>,
    kv: KvMode,
    samples: usize,
}

/// What kind of run wrote a directory, as far as its cell ids and grid go.
#[derive(Debug)]
enum RunKind {
    Sweep(SweepGrid),
    Probe { kv: Option<String> },
    Other,
}

impl RunKind {
    fn of(info: &RunInfo, run_json: &Path) -> Result<RunKind> {
        let args = &info.sweep_args;
        match crate::record::writer(args) {
            "probe" => {
                let kv = args.get("kv").and_then(|k| k.as_str()).map(str::to_string);
                return Ok(RunKind::Probe { kv });
            }
            "sweep" => {}
            _ => return Ok(RunKind::Other),
        }
        serde_json::from_value(args.clone())
            .map(RunKind::Sweep)
            .map_err(|e| ReportError::Json {
                path: run_json.to_path_buf(),
                message: format!("sweep_args is not a sweep plan: {e}"),
            })
    }
}

/// Checks cells.csv records one by one (in file order) against each other and the run.
#[derive(Debug)]
pub(crate) struct CellCheck {
    path: PathBuf,
    kind: RunKind,
    /// cell_id -> line of its row.
    seen: HashMap<String, u64>,
}

impl CellCheck {
    /// A check for the cells.csv of the directory holding `run_json` (which records `info`).
    pub fn new(dir: &Path, info: &RunInfo) -> Result<CellCheck> {
        Ok(CellCheck {
            path: dir.join(super::CELLS_CSV),
            kind: RunKind::of(info, &dir.join(super::RUN_JSON))?,
            seen: HashMap::new(),
        })
    }

    /// Checks `cell`, the record at `line`, and remembers its id.
    pub fn check(&mut self, cell: &CellRecord, line: u64) -> Result<()> {
        let bad = |field: &str, expected: String, found: String| {
            Err(ReportError::Invalid {
                path: self.path.clone(),
                line,
                field: field.to_string(),
                expected,
                found,
            })
        };
        if let Some(first) = self.seen.get(&cell.cell_id) {
            return bad(
                "cell_id",
                "one row per cell".into(),
                format!("{} again (first at line {first})", cell.cell_id),
            );
        }
        if cell.topk == 0 {
            return bad("topk", "at least 1".into(), "0".into());
        }
        if !(cell.depth_pct.is_finite() && (0.0..=100.0).contains(&cell.depth_pct)) {
            return bad(
                "depth_pct",
                "a percentage in 0..=100".into(),
                cell.depth_pct.to_string(),
            );
        }
        if cell.min_needle_rank == Some(0) {
            return bad(
                "min_needle_rank",
                "a rank of at least 1 (ranks count from 1) or empty".into(),
                "0".into(),
            );
        }
        if cell.csa_layers_selected > cell.csa_layers_nontrivial {
            return bad(
                "csa_layers_selected",
                format!(
                    "at most csa_layers_nontrivial ({})",
                    cell.csa_layers_nontrivial
                ),
                cell.csa_layers_selected.to_string(),
            );
        }
        for (name, start, end) in [
            ("needle", cell.needle_start, cell.needle_end),
            ("answer", cell.answer_start, cell.answer_end),
        ] {
            if start > end || end > cell.prompt_tokens {
                return bad(
                    &format!("{name}_end"),
                    format!(
                        "a span {name}_start..{name}_end within the prompt's {} tokens",
                        cell.prompt_tokens
                    ),
                    format!("{start}..{end}"),
                );
            }
        }
        let base =
            crate::record::cell_id_base(cell.prompt_tokens, cell.depth_pct, cell.index, cell.topk);
        let from = "(from prompt_tokens, depth_pct, index and topk)";
        match &self.kind {
            RunKind::Other => {}
            RunKind::Probe { kv } => {
                if let Some(kv) = kv.as_deref().filter(|kv| *kv != cell.kv.name()) {
                    return bad(
                        "kv",
                        format!("{kv} (run.json sweep_args.kv)"),
                        cell.kv.name().into(),
                    );
                }
                if cell.cell_id != base {
                    return bad("cell_id", format!("{base} {from}"), cell.cell_id.clone());
                }
            }
            RunKind::Sweep(grid) => {
                let outside =
                    |name: &str, list: String| format!("one of run.json sweep_args.{name} {list}");
                if !grid.lengths.contains(&cell.target_tokens) {
                    let list = format!("{:?}", grid.lengths);
                    return bad(
                        "target_tokens",
                        outside("lengths", list),
                        cell.target_tokens.to_string(),
                    );
                }
                if cell.prompt_tokens != cell.target_tokens {
                    return bad(
                        "prompt_tokens",
                        format!("target_tokens ({})", cell.target_tokens),
                        cell.prompt_tokens.to_string(),
                    );
                }
                if !grid.depths.contains(&cell.depth_pct) {
                    let list = format!("{:?}", grid.depths);
                    return bad(
                        "depth_pct",
                        outside("depths", list),
                        cell.depth_pct.to_string(),
                    );
                }
                if !grid.indexes.contains(&cell.index) {
                    let names: Vec<&str> = grid.indexes.iter().map(|p| p.name()).collect();
                    return bad(
                        "index",
                        outside("indexes", format!("{names:?}")),
                        cell.index.name().into(),
                    );
                }
                if !grid.topks.contains(&cell.topk) {
                    let list = format!("{:?}", grid.topks);
                    return bad("topk", outside("topks", list), cell.topk.to_string());
                }
                if grid.kv != cell.kv {
                    return bad(
                        "kv",
                        format!("{} (run.json sweep_args.kv)", grid.kv.name()),
                        cell.kv.name().into(),
                    );
                }
                // The sample the id names, when it names a possible one.
                let sample = cell
                    .cell_id
                    .rsplit_once("-s")
                    .and_then(|(_, n)| n.parse::<usize>().ok())
                    .filter(|&n| n < grid.samples);
                let expected = match sample {
                    Some(n) => format!("{base}-s{n}"),
                    None if grid.samples <= 1 => format!("{base}-s0"),
                    None => format!("{base}-s<0..{}>", grid.samples - 1),
                };
                if cell.cell_id != expected {
                    return bad(
                        "cell_id",
                        format!("{expected} {from}"),
                        cell.cell_id.clone(),
                    );
                }
            }
        }
        if cell.recalled != cell.verdict() {
            let shown = |v: Option<bool>| v.map_or("empty".to_string(), |b| b.to_string());
            return bad(
                "recalled",
                format!(
                    "{} (answer_correct {}, else the indexer: {} of {} non-trivial CSA layers \
                     selected; empty without evidence)",
                    shown(cell.verdict()),
                    shown(cell.answer_correct),
                    cell.csa_layers_selected,
                    cell.csa_layers_nontrivial
                ),
                shown(cell.recalled),
            );
        }
        if let Some(keeps) = cell.exact_keeps.filter(|&k| k > cell.layers_lost()) {
            return bad(
                "exact_keeps",
                format!(
                    "at most the layers lost, csa_layers_nontrivial - csa_layers_selected ({})",
                    cell.layers_lost()
                ),
                keeps.to_string(),
            );
        }
        if cell.sample != CellRecord::sample_of_id(&cell.cell_id) {
            let shown = |v: Option<usize>| v.map_or("empty".to_string(), |n| n.to_string());
            return bad(
                "sample",
                format!(
                    "{} (the -s<sample> of cell_id {})",
                    shown(CellRecord::sample_of_id(&cell.cell_id)),
                    cell.cell_id
                ),
                shown(cell.sample),
            );
        }
        self.seen.insert(cell.cell_id.clone(), line);
        Ok(())
    }
}
