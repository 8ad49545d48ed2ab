//! The report directory on disk (docs/outputs.md): [`RunDir`] writes it cell by cell and
//! resumes it; [`RunRecords`] (`read.rs`) reads it back for `needlescope report`.
//!
//! Files: `run.json` ([`RunInfo`]), `cells.csv`, `layers.csv`, `attention.csv` (headers written
//! once, rows appended), `summary.json` (rewritten after every cell).
//!
//! Commit protocol: "a kill at any moment loses at most the cell in flight".
//! 1. [`RunDir::append_cell`] writes the cell's layers.csv rows, flushes and `sync_data`s, then
//!    its attention.csv rows (flush, sync), and LAST its one cells.csv row (flush, sync). A
//!    cells.csv row is the commit marker: a cell is finished iff its row is complete.
//! 2. summary.json is then replaced atomically (temporary file + rename); it is derived data
//!    and is rebuilt on resume anyway.
//! 3. On resume, each CSV is cut back to its last complete record (a torn tail from a kill is
//!    truncated). Then layers.csv and attention.csv rows whose cell_id is not in cells.csv (the
//!    cell in flight) are dropped by REWRITING the file: the header and the kept rows' original
//!    bytes go to a temporary file that is synced and renamed over the old one. Rewriting (not
//!    truncating to a byte offset) keeps cells.csv to its normative columns and removes orphans
//!    wherever they sit; a kill during the rewrite leaves the old file, which the next resume
//!    cleans again. Files are rewritten only when they hold an orphan.
//!
//! 4. Damage a kill cannot cause (files edited, truncated or deleted by hand) is found on
//!    resume by `completeness`: a finished cell whose layers.csv or attention.csv rows are not
//!    its full grid loses its cells.csv row too and is computed again; rows of cells that
//!    cells.csv does not list are dropped as in 3. [`RunDir::notes`] says what was changed.
//!
//! run.json is written atomically when the directory is created; a resume checks it against
//! the new run ([`RunInfo::resume_with`]) and refuses on any difference that would change
//! finished cells, unless cells.csv lists no finished cell (a run stopped before its first):
//! then nothing is lost, and the new run's run.json replaces it, with a note. A sweep whose
//! grid grows (more lengths, depths, profiles, top-k values or samples) keeps its finished
//! cells, and run.json is rewritten with the union of both grids, with a note.
//!
//! Every writer holds the directory's [`DirLock`] (`DIR/.lock`) from
//! [`RunDir::create_or_resume`] until the [`RunDir`] is dropped; a second writer is refused
//! before it reads or writes anything. [`RunRecords::read`] takes no lock.
//!
//! Records read back (on resume and by [`RunRecords::read`]) are checked beyond parsing
//! (`validate`): a duplicated or inconsistent cell_id, an impossible value or a cell
//! outside run.json's grid is an error naming file, line and field, never skipped. So is any
//! complete line that does not parse; only a torn last line (a kill) is dropped, and
//! [`RunRecords::notes`] says so. CRLF files (a CSV re-saved on Windows) read like LF ones.

mod agreement;
pub mod completeness;
mod csvio;
pub mod engine_only;
mod read;
mod resume;
mod row_checks;
mod validate;

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::error::{ReportError, Result};
use super::lock::DirLock;
use super::summary::SummaryJson;
use crate::record::engine::{EngineLayerRecord, ENGINE_COLUMNS};
use crate::record::verdict::exact_keeps_by_cell;
use crate::record::{
    AttentionRecord, CellRecord, LayerRecord, RunInfo, ATTENTION_COLUMNS, CELLS_COLUMNS,
    LAYERS_COLUMNS,
};
use completeness::{incomplete_cells, orphan_cells, IncompleteCell};
use csvio::{
    atomic_write, count_lines, csv_err, flush_sync, open_append, read_json, read_tolerant,
    truncate, write_json, ParsedCsv,
};
pub use engine_only::{EngineOnlyDir, EngineOnlyRecords, ENGINE_CELLS_CSV};
pub use read::RunRecords;
pub use resume::Resume;
use row_checks::refuse_inconsistent;
use validate::CellCheck;

pub const RUN_JSON: &str = "run.json";
pub const CELLS_CSV: &str = "cells.csv";
pub const LAYERS_CSV: &str = "layers.csv";
pub const ATTENTION_CSV: &str = "attention.csv";
pub const SUMMARY_JSON: &str = "summary.json";
/// The serving engine's records (`probe --engine ... --out`); only in directories that have
/// them.
pub const ENGINE_CSV: &str = "engine.csv";

/// A report directory open for appending finished cells.
pub struct RunDir {
    dir: PathBuf,
    info: RunInfo,
    cells: Vec<CellRecord>,
    finished: HashSet<String>,
    cells_w: csv::Writer<File>,
    layers_w: csv::Writer<File>,
    attention_w: csv::Writer<File>,
    /// engine.csv, opened when the directory has one or a cell brings engine records.
    engine_w: Option<csv::Writer<File>>,
    /// Checks each appended cell as a reader will.
    check: CellCheck,
    /// The cells.csv line the next appended row starts on.
    next_line: u64,
    /// Held until the store is dropped.
    lock: DirLock,
    /// See [`RunDir::notes`].
    notes: Vec<String>,
    /// This process's command line, added to run.json's `command_lines` with its first cell
    /// (`None` once added).
    invocation: Option<Vec<String>>,
}

impl RunDir {
    /// Creates `dir` for `info`, or resumes it when it already holds a run.json that records the
    /// same run. Returns the store and the cells already finished (in file order); the caller
    /// skips those. Refuses ([`ReportError::ResumeMismatch`], naming every differing field) when
    /// run.json records other arguments, model hash or scenario, and
    /// ([`ReportError::Locked`]) while another process writes there (see [`DirLock`]); the
    /// lock is held until the store is dropped.
    pub fn create_or_resume(dir: &Path, info: RunInfo) -> Result<(RunDir, Vec<CellRecord>)> {
        make_out_dir(dir)?;
        RunDir::create_or_resume_locked(DirLock::acquire(dir)?, info)
    }

    /// [`Self::create_or_resume`] in the directory of a lock the caller already holds (a clone
    /// of it stays with the store).
    pub fn create_or_resume_locked(
        lock: DirLock,
        info: RunInfo,
    ) -> Result<(RunDir, Vec<CellRecord>)> {
        let dir = lock.dir().to_path_buf();
        let dir = dir.as_path();
        let run_json = dir.join(RUN_JSON);
        let mut notes = Vec::new();
        let invocation = info.command_line.clone();
        let info = if run_json.exists() {
            let on_disk: RunInfo = read_json(&run_json)?;
            // An engine-only directory has no reference records: never replaced by a run
            // that would have them (its engine.csv would be emptied).
            if crate::record::engine::is_engine_only(&on_disk.sweep_args)
                || dir.join(ENGINE_CELLS_CSV).exists()
            {
                return Err(ReportError::NotARunDir {
                    path: dir.to_path_buf(),
                    found: "an engine-only report (engine_cells.csv): a run with a local model \
                            needs another --out"
                        .into(),
                });
            }
            let differences = match on_disk.resume_with(&info) {
                Resume::Same => Vec::new(),
                // Nothing finished: the new run's run.json replaces it (below).
                Resume::Grown { .. } if no_finished_cell(dir)? => on_disk.resume_differences(&info),
                Resume::Grown { info, grown } => {
                    if !grown.is_empty() {
                        write_json(&run_json, &info)?;
                        notes.push(format!(
                            "the grid grows ({}): its finished cells are kept, only the new \
                             ones are computed",
                            grown.join("; ")
                        ));
                    }
                    return RunDir::open_records(lock, *info, notes, invocation);
                }
                Resume::Refused(differences) => differences,
            };
            if differences.is_empty() {
                on_disk
            } else if no_finished_cell(dir)? {
                // A run stopped before its first cell pins nothing: there is nothing to keep.
                write_json(&run_json, &info)?;
                let fields: Vec<&str> = differences.iter().map(|d| d.field.as_str()).collect();
                notes.push(format!(
                    "its run.json recorded a run with other settings ({}) that finished no \
                     cell; replaced by this run's",
                    fields.join(", ")
                ));
                info
            } else {
                return Err(ReportError::ResumeMismatch {
                    path: run_json,
                    action: match crate::record::writer(&info.sweep_args) {
                        "probe" => "add cells to",
                        _ => "resume",
                    },
                    differences,
                });
            }
        } else {
            for name in [
                CELLS_CSV,
                LAYERS_CSV,
                ATTENTION_CSV,
                ENGINE_CSV,
                ENGINE_CELLS_CSV,
            ] {
                let p = dir.join(name);
                if p.metadata().is_ok_and(|m| m.len() > 0) {
                    return Err(ReportError::NotARunDir {
                        path: dir.to_path_buf(),
                        found: format!("{name} without run.json; refusing to append to it"),
                    });
                }
            }
            write_json(&run_json, &info)?;
            info
        };
        RunDir::open_records(lock, info, notes, invocation)
    }

    /// Reads, repairs and opens for appending the records of the directory of `lock`, whose
    /// run.json records `info` (checked or written by the caller); `notes` so far;
    /// `invocation`, this process's command line (recorded with its first cell).
    fn open_records(
        lock: DirLock,
        info: RunInfo,
        mut notes: Vec<String>,
        invocation: Vec<String>,
    ) -> Result<(RunDir, Vec<CellRecord>)> {
        let dir = lock.dir().to_path_buf();
        let dir = dir.as_path();
        let cells_path = dir.join(CELLS_CSV);
        let cells_csv: ParsedCsv<CellRecord> = read_tolerant(&cells_path, &CELLS_COLUMNS)?;
        let mut check = CellCheck::new(dir, &info)?;
        for row in &cells_csv.records {
            check.check(&row.value, row.line)?;
        }
        let layers_path = dir.join(LAYERS_CSV);
        let layers: ParsedCsv<LayerRecord> = read_tolerant(&layers_path, &LAYERS_COLUMNS)?;
        let att_path = dir.join(ATTENTION_CSV);
        let attention: ParsedCsv<AttentionRecord> = read_tolerant(&att_path, &ATTENTION_COLUMNS)?;
        // A cells.csv of an older version gains today's columns before anything is appended.
        let cells_csv = if cells_csv.older {
            let mut all: Vec<CellRecord> =
                cells_csv.records.iter().map(|r| r.value.clone()).collect();
            let rows: Vec<LayerRecord> = layers.records.iter().map(|r| r.value.clone()).collect();
            derive_exact_keeps(&mut all, &rows);
            rewrite_cells(&cells_path, &all)?;
            notes.push(format!(
                "{CELLS_CSV} was written by an older needlescope: rewritten with the columns \
                 recalled, exact_keeps and sample, derived from its rows and layers.csv"
            ));
            read_tolerant(&cells_path, &CELLS_COLUMNS)?
        } else {
            cells_csv
        };

        // Finished cells whose other rows are not all there (files damaged by hand) go back to
        // the run, which computes them again; rows of unlisted cells are dropped.
        let all: Vec<CellRecord> = cells_csv.records.iter().map(|r| r.value.clone()).collect();
        let damaged = incomplete_cells(
            &all,
            layers.records.iter().map(|r| &r.value),
            attention.records.iter().map(|r| &r.value),
        );
        let listed: HashSet<String> = all.iter().map(|c| c.cell_id.clone()).collect();
        let orphans = orphan_cells(
            layers
                .records
                .iter()
                .map(|r| r.value.cell_id.as_str())
                .chain(attention.records.iter().map(|r| r.value.cell_id.as_str())),
            &listed,
        );
        notes.extend(resume_notes(&damaged, &orphans));
        let redo: HashSet<&str> = damaged.iter().map(|d| d.cell_id.as_str()).collect();
        let cells: Vec<CellRecord> = all
            .into_iter()
            .filter(|c| !redo.contains(c.cell_id.as_str()))
            .collect();
        let finished: HashSet<String> = cells.iter().map(|c| c.cell_id.clone()).collect();
        repair(&cells_path, &cells_csv, &CELLS_COLUMNS, |c| {
            finished.contains(&c.cell_id)
        })?;
        repair(&layers_path, &layers, &LAYERS_COLUMNS, |r| {
            finished.contains(&r.cell_id)
        })?;
        repair(&att_path, &attention, &ATTENTION_COLUMNS, |r| {
            finished.contains(&r.cell_id)
        })?;
        let engine_path = dir.join(ENGINE_CSV);
        let engine_w = if engine_path.exists() {
            let engine: ParsedCsv<EngineLayerRecord> =
                read_tolerant(&engine_path, &ENGINE_COLUMNS)?;
            repair(&engine_path, &engine, &ENGINE_COLUMNS, |r| {
                finished.contains(&r.cell_id)
            })?;
            Some(open_append(&engine_path)?)
        } else {
            None
        };
        let next_line = if redo.is_empty() {
            if cells_csv.has_header {
                cells_csv.next_line
            } else {
                2
            }
        } else {
            // Rows were taken out: check the kept ones afresh (a redone cell is not a
            // duplicate) and count lines in the rewritten file.
            check = CellCheck::new(dir, &info)?;
            let kept: ParsedCsv<CellRecord> = read_tolerant(&cells_path, &CELLS_COLUMNS)?;
            for row in &kept.records {
                check.check(&row.value, row.line)?;
            }
            kept.next_line
        };

        let run = RunDir {
            cells_w: open_append(&cells_path)?,
            layers_w: open_append(&layers_path)?,
            attention_w: open_append(&att_path)?,
            engine_w,
            dir: dir.to_path_buf(),
            info,
            cells: cells.clone(),
            finished,
            check,
            next_line,
            lock,
            notes,
            invocation: Some(invocation),
        };
        run.write_summary()?;
        Ok((run, cells))
    }

    /// What a resume changed, one line each: finished cells given back to the run because
    /// their rows were damaged, rows of unlisted cells dropped. Empty for a fresh directory or
    /// a clean resume.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Records one finished cell: its layers.csv rows, then attention.csv rows, then (the commit
    /// marker) its cells.csv row, each file flushed and synced; then summary.json. Every layer
    /// and attention record must carry `cell.cell_id`, and the cell must not be finished yet.
    /// The columns derived from the others (`recalled`, `exact_keeps`, `sample`) are set
    /// here ([`CellRecord::derive_columns`]).
    pub fn append_cell(
        &mut self,
        cell: &CellRecord,
        layers: &[LayerRecord],
        attention: &[AttentionRecord],
    ) -> Result<()> {
        self.append_cell_with_engine(cell, layers, attention, &[])
    }

    /// Adds this process's command line to run.json's `command_lines` before its first cell
    /// is written, so the directory says every invocation that wrote cells.
    fn record_invocation(&mut self) -> Result<()> {
        let Some(line) = self.invocation.take() else {
            return Ok(());
        };
        let lines = self.info.with_invocation(&line);
        if lines != self.info.command_lines {
            self.info.command_lines = lines;
            write_json(&self.dir.join(RUN_JSON), &self.info)?;
        }
        Ok(())
    }

    /// [`Self::append_cell`] with the serving engine's records of the cell, written to
    /// engine.csv (created with its header on first use) after attention.csv and before the
    /// cells.csv row that commits the cell.
    pub fn append_cell_with_engine(
        &mut self,
        cell: &CellRecord,
        layers: &[LayerRecord],
        attention: &[AttentionRecord],
        engine: &[EngineLayerRecord],
    ) -> Result<()> {
        // The derived columns follow from the cell and its rows: set here, whatever was given.
        let mut cell = cell.clone();
        cell.derive_columns(layers);
        let cell = &cell;
        let cells_path = self.dir.join(CELLS_CSV);
        if self.finished.contains(&cell.cell_id) {
            return Err(ReportError::Mismatch {
                path: cells_path,
                what: format!("cell_id {}", cell.cell_id),
                expected: "a cell not yet finished".into(),
                found: "a cell already in cells.csv".into(),
            });
        }
        self.record_invocation()?;
        let layers_path = self.dir.join(LAYERS_CSV);
        let att_path = self.dir.join(ATTENTION_CSV);
        same_cell(
            &layers_path,
            &cell.cell_id,
            layers.iter().map(|r| r.cell_id.as_str()),
        )?;
        same_cell(
            &att_path,
            &cell.cell_id,
            attention.iter().map(|r| r.cell_id.as_str()),
        )?;
        let engine_path = self.dir.join(ENGINE_CSV);
        same_cell(
            &engine_path,
            &cell.cell_id,
            engine.iter().map(|r| r.cell_id.as_str()),
        )?;
        refuse_inconsistent(&engine_path, engine)?;
        // What a reader would refuse is refused before anything is written (the rows first:
        // the cell check remembers the cell's id once it passes).
        refuse_inconsistent(&layers_path, layers)?;
        refuse_inconsistent(&att_path, attention)?;
        self.check.check(cell, self.next_line)?;
        self.next_line += 1 + count_lines(cell.answer_text.as_bytes());

        append(&mut self.layers_w, &layers_path, layers)?;
        append(&mut self.attention_w, &att_path, attention)?;
        if !engine.is_empty() {
            if self.engine_w.is_none() {
                let mut header = ENGINE_COLUMNS.join(",");
                header.push('\n');
                atomic_write(&engine_path, header.as_bytes())?;
                self.engine_w = Some(open_append(&engine_path)?);
            }
            if let Some(w) = self.engine_w.as_mut() {
                append(w, &engine_path, engine)?;
            }
        }
        append(&mut self.cells_w, &cells_path, std::slice::from_ref(cell))?;
        self.finished.insert(cell.cell_id.clone());
        self.cells.push(cell.clone());
        self.write_summary()
    }

    /// Whether `cell_id` is finished (its cells.csv row is on disk).
    pub fn is_finished(&self, cell_id: &str) -> bool {
        self.finished.contains(cell_id)
    }

    /// Every finished cell, in file order.
    pub fn cells(&self) -> &[CellRecord] {
        &self.cells
    }

    /// The run as recorded in run.json (on resume: the original start time and command line).
    pub fn info(&self) -> &RunInfo {
        &self.info
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The directory's lock (clone it to keep the directory after the store is dropped).
    pub fn lock(&self) -> &DirLock {
        &self.lock
    }

    fn write_summary(&self) -> Result<()> {
        write_json(
            &self.dir.join(SUMMARY_JSON),
            &SummaryJson::new(&self.info, &self.cells, &exact_keeps_by_cell(&self.cells)),
        )
    }
}

/// Replaces `path` (atomically) with today's cells.csv header and `cells`.
fn rewrite_cells(path: &Path, cells: &[CellRecord]) -> Result<()> {
    let mut w = csv::WriterBuilder::new()
        .has_headers(false)
        .terminator(csv::Terminator::Any(b'\n'))
        .from_writer(Vec::new());
    for cell in cells {
        w.serialize(cell).map_err(csv_err(path))?;
    }
    let rows = w
        .into_inner()
        .map_err(|e| ReportError::io(path)(e.into_error()))?;
    let mut bytes = format!("{}\n", CELLS_COLUMNS.join(",")).into_bytes();
    bytes.extend_from_slice(&rows);
    atomic_write(path, &bytes)
}

/// Sets each cell's `exact_keeps` from its `layers` rows (those of other cells are skipped):
/// for cells read from a cells.csv written before the column.
pub(crate) fn derive_exact_keeps(cells: &mut [CellRecord], layers: &[LayerRecord]) {
    let mut by_cell: std::collections::HashMap<&str, Vec<&LayerRecord>> = Default::default();
    for r in layers {
        by_cell.entry(r.cell_id.as_str()).or_default().push(r);
    }
    for cell in cells {
        let rows = by_cell
            .get(cell.cell_id.as_str())
            .cloned()
            .unwrap_or_default();
        cell.exact_keeps = crate::record::verdict::exact_keeps(rows, cell.answer_position());
    }
}

/// Creates the report directory `dir` (and its parents), refusing a file there.
fn make_out_dir(dir: &Path) -> Result<()> {
    if dir.exists() && !dir.is_dir() {
        return Err(ReportError::Mismatch {
            path: dir.to_path_buf(),
            what: "report directory (--out)".into(),
            expected: "a directory (or a path to create one at)".into(),
            found: "a file".into(),
        });
    }
    std::fs::create_dir_all(dir).map_err(ReportError::io(dir))
}

/// Every record handed in with a cell must carry its cell_id.
fn same_cell<'a>(path: &Path, cell_id: &str, mut ids: impl Iterator<Item = &'a str>) -> Result<()> {
    match ids.find(|id| *id != cell_id) {
        Some(other) => Err(ReportError::Mismatch {
            path: path.to_path_buf(),
            what: "cell_id of a record appended with a cell".into(),
            expected: cell_id.to_string(),
            found: other.to_string(),
        }),
        None => Ok(()),
    }
}

/// Serialises `rows`, flushes and syncs.
fn append<T: Serialize>(w: &mut csv::Writer<File>, path: &Path, rows: &[T]) -> Result<()> {
    for r in rows {
        w.serialize(r).map_err(csv_err(path))?;
    }
    flush_sync(w, path)
}

/// Brings a CSV back to "header + complete rows that `keep` accepts": writes the header into an
/// empty or headerless file, truncates a torn tail, rewrites the file without rejected rows.
fn repair<T>(
    path: &Path,
    csv: &ParsedCsv<T>,
    columns: &[&str],
    keep: impl Fn(&T) -> bool,
) -> Result<()> {
    if !csv.has_header {
        // Missing, empty, or killed while writing the header: nothing else can be in it.
        let mut line = columns.join(",");
        line.push('\n');
        return atomic_write(path, line.as_bytes());
    }
    if csv.records.iter().all(|r| keep(&r.value)) {
        if csv.torn() {
            truncate(path, csv.good_len)?;
        }
        return Ok(());
    }
    let bytes = std::fs::read(path).map_err(ReportError::io(path))?;
    let mut out = bytes[..csv.header_end as usize].to_vec();
    for r in &csv.records {
        if keep(&r.value) {
            out.extend_from_slice(&bytes[r.bytes.start as usize..r.bytes.end as usize]);
        }
    }
    atomic_write(path, &out)
}

/// The ids of the cells `dir`'s cells.csv lists as finished, read without the lock and
/// without checks (an unreadable or damaged file gives none): a hint for work that may be
/// skipped before the run opens the directory, which reads it properly.
pub fn finished_cell_ids(dir: &Path) -> HashSet<String> {
    read_tolerant::<CellRecord>(&dir.join(CELLS_CSV), &CELLS_COLUMNS)
        .map(|cells| cells.records.into_iter().map(|r| r.value.cell_id).collect())
        .unwrap_or_default()
}

/// Whether `dir`'s cells.csv lists no finished cell (absent, empty, a header, a torn line).
fn no_finished_cell(dir: &Path) -> Result<bool> {
    let cells: ParsedCsv<CellRecord> = read_tolerant(&dir.join(CELLS_CSV), &CELLS_COLUMNS)?;
    Ok(cells.records.is_empty())
}

/// The notes of a resume that gives `damaged` cells back to the run and drops the rows of
/// `orphans` (cells that cells.csv does not list).
fn resume_notes(damaged: &[IncompleteCell], orphans: &[String]) -> Vec<String> {
    let mut notes: Vec<String> = damaged
        .iter()
        .map(|d| {
            format!(
                "cell {}: {}, {}; it is computed again",
                d.cell_id, d.file, d.why
            )
        })
        .collect();
    match orphans {
        [] => {}
        [one] => notes.push(format!(
            "dropped the rows of cell {one}, which a stopped run had in flight; it is computed again"
        )),
        many => notes.push(format!(
            "dropped the rows of {} cells that cells.csv does not list ({}); they are computed again",
            many.len(),
            list_some(many)
        )),
    }
    notes
}

/// Up to three ids, then how many more.
pub(crate) fn list_some(ids: &[String]) -> String {
    let mut s = ids.iter().take(3).cloned().collect::<Vec<_>>().join(", ");
    if ids.len() > 3 {
        s.push_str(&format!(" and {} more", ids.len() - 3));
    }
    s
}

/// [`ReportError::NotARunDir`] for `dir`, listing a few of the names it holds.
pub(crate) fn not_a_run_dir(dir: &Path) -> ReportError {
    let found = match std::fs::read_dir(dir) {
        Ok(entries) => {
            let mut names: Vec<String> = entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names.truncate(8);
            format!("[{}]", names.join(", "))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "no such directory".to_string(),
        Err(e) => e.to_string(),
    };
    ReportError::NotARunDir {
        path: dir.to_path_buf(),
        found,
    }
}
