//! The reporting layer (docs/outputs.md): results are records first, written and flushed as
//! cells finish; tables and plots are rendered from the records, so `needlescope report DIR`
//! redoes them without the model (docs/architecture.md section 10, item 11).
//!
//! The records themselves (cells.csv, layers.csv, attention.csv and run.json rows, and their
//! normative column lists) are `crate::record`'s.
//!
//! - [`store`]: [`RunDir`], the resumable report directory (commit protocol: layer and attention
//!   rows first, the cells.csv row last), and [`RunRecords`] to read one back; rows read back
//!   are checked there (`store::validate`: duplicated or inconsistent cell ids, impossible
//!   values, cells outside run.json's grid).
//! - [`lock`]: [`DirLock`], the directory lock every writer (sweep, demo, probe --out, report)
//!   holds while it writes.
//! - [`summary`]: per (length, profile, top-k) recall, median / worst rank, CSA (V4.1: index) layers lost; the
//!   terminal table and summary.json.
//! - [`plots`]: the PNGs ([`render_all`]: heatmaps, per-layer ranks, rank vs length) through the
//!   embedded DejaVu Sans font.
//! - [`html`]: `report.html`, the one self-contained page a person reads: settings, summary,
//!   plots, engine comparison and one section per cell.
//!
//! Errors are [`ReportError`]s naming the file, with expected vs found where it applies.

pub mod error;
pub mod html;
pub mod lock;
pub mod plots;

pub mod store;
pub mod summary;

pub use error::{FieldDifference, ReportError, Result};
pub use lock::DirLock;
pub use plots::{render_all, render_records};
pub use store::{RunDir, RunRecords};
pub use summary::{render_table, stdout_wants_colour, summarize, GroupSummary, SummaryJson};

/// What `needlescope report DIR` does, without the model: takes the directory's lock (refused
/// while a sweep writes there), reads the records, rewrites summary.json, renders every PNG,
/// writes report.html, and returns the terminal table (with ANSI colour when `colour`) and the
/// files written (summary.json, then report.html, then the PNGs).
pub fn rerender(dir: &std::path::Path, colour: bool) -> Result<(String, Vec<std::path::PathBuf>)> {
    let done = rerender_locked(&lock_existing(dir)?, colour)?;
    Ok((done.table, done.files))
}

/// The first line of the terminal table of a run on a synthetic model (run.json `synthetic`),
/// as every plot title says "(synthetic model)" (docs/architecture.md section 7).
pub const SYNTHETIC_LINE: &str =
    "synthetic model (written by `synth`): these results show the method, not DeepSeek-V4's weights\n";

/// What [`rerender_locked`] did.
#[derive(Clone, Debug)]
pub struct Rerendered {
    /// The terminal table.
    pub table: String,
    /// Files written: summary.json, report.html, then the PNGs.
    pub files: Vec<std::path::PathBuf>,
    /// Finished cells read.
    pub cells: usize,
    /// The cells of the sweep's grid ([`crate::record::RunInfo::cells_planned`]).
    pub planned: Option<usize>,
    /// [`RunRecords::notes`]: what was read but left out (a torn last line).
    pub notes: Vec<String>,
    /// The subcommand that wrote the records (run.json's `command_line`: `sweep`, `demo`).
    pub command: String,
}

/// [`rerender`] in the directory of a lock the caller holds.
pub fn rerender_locked(lock: &DirLock, colour: bool) -> Result<Rerendered> {
    if let Some(engine_only) = engine_only_table(lock.dir(), true)? {
        return Ok(engine_only);
    }
    let records = RunRecords::read(lock.dir())?;
    let mut files = vec![records.write_summary()?];
    let plots = render_records(&records, lock.dir())?;
    files.push(html::write_report_html(&records, lock.dir(), &plots)?);
    files.extend(plots);
    Ok(tabulate(records, files, colour))
}

/// The terminal table of `dir`'s records, writing nothing and taking no lock: for a
/// directory another run is writing (its finished cells so far; a torn last line or the rows
/// of the cell in flight are left out) or one that cannot be written.
pub fn table_only(dir: &std::path::Path, colour: bool) -> Result<Rerendered> {
    if let Some(engine_only) = engine_only_table(dir, false)? {
        return Ok(engine_only);
    }
    Ok(tabulate(RunRecords::read(dir)?, Vec::new(), colour))
}

fn tabulate(records: RunRecords, files: Vec<std::path::PathBuf>, colour: bool) -> Rerendered {
    let exact_keeps_by = crate::record::verdict::exact_keeps_by_cell(&records.cells);
    let word = crate::record::verdict::LayerWord::of(&records.layers);
    let mut table = render_table(&summarize(&records.cells, &exact_keeps_by), colour, word);
    if records.info.synthetic {
        table.insert_str(0, SYNTHETIC_LINE);
    }
    table.push_str(&engine_lines(&records));
    Rerendered {
        table,
        files,
        cells: records.cells.len(),
        planned: records.info.cells_planned(),
        command: records
            .info
            .command_line
            .get(1)
            .cloned()
            .unwrap_or_default(),
        notes: records.notes,
    }
}

/// An engine-only directory's table (`store::engine_only`; it has no reference records and
/// no plots), with its report.html written when `write`, or `None` for any other directory.
fn engine_only_table(dir: &std::path::Path, write: bool) -> Result<Option<Rerendered>> {
    let run_json = dir.join(store::RUN_JSON);
    let Ok(text) = std::fs::read_to_string(&run_json) else {
        return Ok(None);
    };
    let Ok(info) = serde_json::from_str::<crate::record::RunInfo>(&text) else {
        return Ok(None);
    };
    if !crate::record::engine::is_engine_only(&info.sweep_args) {
        return Ok(None);
    }
    let records = store::EngineOnlyRecords::read(dir)?;
    let planned = records.info.cells_planned();
    let files = match write {
        true => vec![html::write_engine_only_html(&records, dir)?],
        false => Vec::new(),
    };
    Ok(Some(Rerendered {
        table: records.table(),
        files,
        cells: records.cells.len(),
        planned,
        command: records
            .info
            .command_line
            .get(1)
            .cloned()
            .unwrap_or_default(),
        notes: records.notes,
    }))
}

/// The serving engine's conclusion at one cell's answer position (`record::engine`).
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConclusion {
    pub cell_id: String,
    /// The engine's top-k (engine.csv `engine_topk`).
    pub engine_topk: usize,
    pub conclusion: String,
}

/// The engine's conclusion for each cell with engine.csv rows, in cells.csv order.
pub fn engine_conclusions(records: &RunRecords) -> Vec<EngineConclusion> {
    let order: Vec<&str> = crate::record::IndexProfile::EVERY
        .iter()
        .map(|p| p.name())
        .collect();
    let mut out = Vec::new();
    for cell in &records.cells {
        let engine_records: Vec<crate::record::engine::EngineLayerRecord> = records
            .engine
            .iter()
            .filter(|r| r.cell_id == cell.cell_id)
            .cloned()
            .collect();
        let Some(first) = engine_records.first() else {
            continue;
        };
        let layers: Vec<crate::record::LayerRecord> = records
            .layers
            .iter()
            .filter(|r| r.cell_id == cell.cell_id)
            .cloned()
            .collect();
        let verdict = crate::record::verdict::EngineVerdict::of(
            &engine_records,
            &layers,
            cell.answer_position(),
            &order,
            Some(cell.index.name()),
        );
        out.push(EngineConclusion {
            cell_id: cell.cell_id.clone(),
            engine_topk: first.engine_topk,
            conclusion: verdict.conclusion(
                Some(cell.index.name()),
                1 + engine_records.iter().map(|r| r.needle).max().unwrap_or(0),
            ),
        });
    }
    out
}

/// The serving engine beside the reference, one line per cell with engine.csv rows: its
/// conclusion at the cell's answer position ([`engine_conclusions`]). Empty without engine.csv.
pub fn engine_lines(records: &RunRecords) -> String {
    let mut text = String::new();
    for c in engine_conclusions(records) {
        if text.is_empty() {
            text.push_str("\nserving engine (engine.csv) against the reference:\n");
        }
        text.push_str(&format!(
            "  {} (engine K {}): {}\n",
            c.cell_id, c.engine_topk, c.conclusion
        ));
    }
    text
}

/// The lock of `dir`, which must already be a report directory (holds run.json): `report` on
/// a wrong path is [`ReportError::NotARunDir`] and leaves no `.lock` behind.
pub fn lock_existing(dir: &std::path::Path) -> Result<DirLock> {
    if !dir.join(store::RUN_JSON).exists() {
        return Err(store::not_a_run_dir(dir));
    }
    DirLock::acquire(dir)
}

impl Rerendered {
    /// One line saying what was written where: summary.json and single plots by name, the
    /// heatmaps and per-cell layer plots as counts (a sweep writes one layer plot per cell,
    /// hundreds of them), e.g. `wrote in reports/run: summary.json, rank_vs_length.png, 4
    /// heatmaps (heatmap_*.png), 100 layer plots (layers_*.png)`.
    pub fn files_line(&self, dir: &std::path::Path) -> String {
        let names: Vec<String> = self
            .files
            .iter()
            .map(|f| {
                f.file_name()
                    .map_or_else(|| f.display().to_string(), |n| n.to_string_lossy().into())
            })
            .collect();
        let mut parts: Vec<String> = Vec::new();
        let mut grouped = |prefix: &str, what: &str| {
            let n = names.iter().filter(|n| n.starts_with(prefix)).count();
            match n {
                0 => {}
                1 => parts.extend(names.iter().filter(|n| n.starts_with(prefix)).cloned()),
                _ => parts.push(format!("{n} {what} ({prefix}*.png)")),
            }
        };
        let singles: Vec<String> = names
            .iter()
            .filter(|n| !n.starts_with("heatmap_") && !n.starts_with("layers_"))
            .cloned()
            .collect();
        grouped("heatmap_", "heatmaps");
        grouped("layers_", "layer plots");
        let all: Vec<String> = singles.into_iter().chain(parts).collect();
        format!("wrote in {}: {}", dir.display(), all.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::Rerendered;
    use std::path::{Path, PathBuf};

    #[test]
    fn files_line_names_single_files_and_counts_plot_families() {
        let dir = Path::new("reports/run");
        let mut files: Vec<PathBuf> = ["summary.json", "heatmap_fp8_64.png", "rank_vs_length.png"]
            .iter()
            .map(|f| dir.join(f))
            .collect();
        let done = |files: &[PathBuf]| Rerendered {
            table: String::new(),
            files: files.to_vec(),
            cells: 0,
            planned: None,
            notes: Vec::new(),
            command: "sweep".into(),
        };
        assert_eq!(
            done(&files).files_line(dir),
            "wrote in reports/run: summary.json, rank_vs_length.png, heatmap_fp8_64.png"
        );
        files.push(dir.join("heatmap_bf16_64.png"));
        files.extend((0..100).map(|i| dir.join(format!("layers_L1024-d{i}-fp8-k64-s0.png"))));
        assert_eq!(
            done(&files).files_line(dir),
            "wrote in reports/run: summary.json, rank_vs_length.png, 2 heatmaps (heatmap_*.png), \
             100 layer plots (layers_*.png)"
        );
    }
}
