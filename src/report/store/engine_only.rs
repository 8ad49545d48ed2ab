//! An engine-only report directory: `sweep --engine URL` with no local forward (`--no-local`, or a
//! model directory without weights). The serving engine did the forward, so there are no
//! reference records (cells.csv, layers.csv, attention.csv); the directory holds run.json
//! (`"local": false` among its arguments), `engine_cells.csv` (one [`EngineCellRecord`] per
//! prompt) and `engine.csv` (the engine's membership per CSA layer and probed position, profile
//! and overlap empty).
//!
//! It follows [`super::RunDir`]'s commit protocol: a cell's engine.csv rows are written and
//! synced first, its engine_cells.csv row last (the commit marker); on resume, torn tails are cut
//! and rows of an unfinished cell dropped, run.json is checked against the new run (refused on
//! any difference unless no cell finished), and finished cells are skipped. The directory is
//! locked ([`DirLock`]) while the store lives.

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};

use super::csvio::{open_append, read_json, read_tolerant, write_json, ParsedCsv};
use super::row_checks::RowCheck;
use super::{append, repair, same_cell, Resume, ENGINE_CSV, RUN_JSON};
use crate::record::engine::{
    is_engine_only, EngineCellRecord, EngineLayerRecord, ENGINE_CELLS_COLUMNS, ENGINE_COLUMNS,
};
use crate::record::RunInfo;
use crate::report::error::{ReportError, Result};
use crate::report::lock::DirLock;

/// engine_cells.csv.
pub const ENGINE_CELLS_CSV: &str = "engine_cells.csv";

/// engine_cells.csv rows are checked against their own bounds.
impl RowCheck for EngineCellRecord {}

/// An engine-only directory open for appending cells.
pub struct EngineOnlyDir {
    dir: PathBuf,
    lock: DirLock,
    finished: HashSet<String>,
    cells: Vec<EngineCellRecord>,
    cells_w: csv::Writer<File>,
    engine_w: csv::Writer<File>,
    notes: Vec<String>,
}

impl EngineOnlyDir {
    /// Creates `dir` for `info` (whose arguments say `"local": false`) or resumes it.
    pub fn create_or_resume(dir: &Path, info: RunInfo) -> Result<EngineOnlyDir> {
        super::make_out_dir(dir)?;
        let lock = DirLock::acquire(dir)?;
        let run_json = dir.join(RUN_JSON);
        let cells_path = dir.join(ENGINE_CELLS_CSV);
        let engine_path = dir.join(ENGINE_CSV);
        let mut notes = Vec::new();
        let cells_csv: ParsedCsv<EngineCellRecord> =
            read_tolerant(&cells_path, &ENGINE_CELLS_COLUMNS)?;
        if run_json.exists() {
            let on_disk: RunInfo = read_json(&run_json)?;
            let differences = match on_disk.resume_with(&info) {
                Resume::Same => Vec::new(),
                Resume::Grown { .. } if cells_csv.records.is_empty() => {
                    on_disk.resume_differences(&info)
                }
                Resume::Grown { info, grown } => {
                    if !grown.is_empty() {
                        write_json(&run_json, &info)?;
                        notes.push(format!(
                            "the grid grows ({}): its finished cells are kept, only the new \
                             ones are sent to the engine",
                            grown.join("; ")
                        ));
                    }
                    Vec::new()
                }
                Resume::Refused(differences) => differences,
            };
            if !differences.is_empty() {
                if cells_csv.records.is_empty() && is_engine_only(&on_disk.sweep_args) {
                    write_json(&run_json, &info)?;
                    notes.push(
                        "its run.json recorded an engine-only run with other settings that \
                         finished no cell; replaced by this run's"
                            .into(),
                    );
                } else {
                    return Err(ReportError::ResumeMismatch {
                        path: run_json,
                        action: "resume",
                        differences,
                    });
                }
            }
        } else {
            if let Some(name) = std::fs::read_dir(dir)
                .map_err(ReportError::io(dir))?
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .find(|n| n.ends_with(".csv"))
            {
                return Err(ReportError::NotARunDir {
                    path: dir.to_path_buf(),
                    found: format!("{name} without run.json; refusing to append to it"),
                });
            }
            write_json(&run_json, &info)?;
        }
        let finished: HashSet<String> = cells_csv
            .records
            .iter()
            .map(|r| r.value.cell_id.clone())
            .collect();
        let engine: ParsedCsv<EngineLayerRecord> = read_tolerant(&engine_path, &ENGINE_COLUMNS)?;
        repair(&cells_path, &cells_csv, &ENGINE_CELLS_COLUMNS, |_| true)?;
        repair(&engine_path, &engine, &ENGINE_COLUMNS, |r| {
            finished.contains(&r.cell_id)
        })?;
        let cells = cells_csv.records.into_iter().map(|r| r.value).collect();
        Ok(EngineOnlyDir {
            cells_w: open_append(&cells_path)?,
            engine_w: open_append(&engine_path)?,
            dir: dir.to_path_buf(),
            lock,
            finished,
            cells,
            notes,
        })
    }

    pub fn is_finished(&self, cell_id: &str) -> bool {
        self.finished.contains(cell_id)
    }

    pub fn cells(&self) -> &[EngineCellRecord] {
        &self.cells
    }

    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    pub fn lock(&self) -> &DirLock {
        &self.lock
    }

    /// Records one finished cell: its engine.csv rows, then its engine_cells.csv row.
    pub fn append(&mut self, cell: &EngineCellRecord, engine: &[EngineLayerRecord]) -> Result<()> {
        let cells_path = self.dir.join(ENGINE_CELLS_CSV);
        let engine_path = self.dir.join(ENGINE_CSV);
        if self.finished.contains(&cell.cell_id) {
            return Err(ReportError::Mismatch {
                path: cells_path,
                what: format!("cell_id {}", cell.cell_id),
                expected: "a cell not yet finished".into(),
                found: "a cell already in engine_cells.csv".into(),
            });
        }
        same_cell(
            &engine_path,
            &cell.cell_id,
            engine.iter().map(|r| r.cell_id.as_str()),
        )?;
        super::row_checks::refuse_inconsistent(&engine_path, engine)?;
        append(&mut self.engine_w, &engine_path, engine)?;
        append(&mut self.cells_w, &cells_path, std::slice::from_ref(cell))?;
        self.finished.insert(cell.cell_id.clone());
        self.cells.push(cell.clone());
        Ok(())
    }
}

/// An engine-only directory read back (no lock taken).
pub struct EngineOnlyRecords {
    pub info: RunInfo,
    pub cells: Vec<EngineCellRecord>,
    pub engine: Vec<EngineLayerRecord>,
    pub notes: Vec<String>,
}

impl EngineOnlyRecords {
    pub fn read(dir: &Path) -> Result<EngineOnlyRecords> {
        let run_json = dir.join(RUN_JSON);
        if !run_json.exists() {
            return Err(super::not_a_run_dir(dir));
        }
        let info: RunInfo = read_json(&run_json)?;
        let mut notes = Vec::new();
        let cells_csv: ParsedCsv<EngineCellRecord> =
            read_tolerant(&dir.join(ENGINE_CELLS_CSV), &ENGINE_CELLS_COLUMNS)?;
        super::read::note_torn(&mut notes, ENGINE_CELLS_CSV, &cells_csv);
        let cells: Vec<EngineCellRecord> = cells_csv.records.into_iter().map(|r| r.value).collect();
        let finished: HashSet<&str> = cells.iter().map(|c| c.cell_id.as_str()).collect();
        let engine_csv: ParsedCsv<EngineLayerRecord> =
            read_tolerant(&dir.join(ENGINE_CSV), &ENGINE_COLUMNS)?;
        super::read::note_torn(&mut notes, ENGINE_CSV, &engine_csv);
        let engine: Vec<EngineLayerRecord> = engine_csv
            .records
            .into_iter()
            .map(|r| r.value)
            .filter(|r| finished.contains(r.cell_id.as_str()))
            .collect();
        Ok(EngineOnlyRecords {
            info,
            cells,
            engine,
            notes,
        })
    }

    /// The terminal table: one line per cell (length, depth, the engine's layers, its answer).
    /// The table's column heads ([`Self::rows`]).
    pub const HEAD: [&'static str; 6] = [
        "tokens",
        "depth",
        "K",
        "needle selected on",
        "verdict",
        "answer",
    ];

    /// What the table says under itself.
    pub const LEGEND: &'static str = "needle selected on: non-trivial CSA layers (n_t > K) whose \
         engine selection held a row of every needle; verdict: the engine's answer where judged, \
         else its selection (recalled = every non-trivial layer)";

    /// One row per cell in [`Self::HEAD`]'s order, with whether the cell lost the needle.
    pub fn rows(&self) -> Vec<([String; 6], bool)> {
        self.cells
            .iter()
            .map(|c| {
                let verdict = crate::record::verdict::CellVerdict::of(
                    c.answer_correct,
                    c.csa_layers_selected,
                    c.csa_layers_nontrivial,
                )
                .word();
                (
                    [
                        c.prompt_tokens.to_string(),
                        format!("{}%", c.depth_pct),
                        c.engine_topk.to_string(),
                        format!(
                            "{}/{} layers",
                            c.csa_layers_selected, c.csa_layers_nontrivial
                        ),
                        verdict.to_string(),
                        format!("{:?}", c.answer_text),
                    ],
                    matches!(verdict, "WRONG" | "LOST"),
                )
            })
            .collect()
    }

    /// The terminal table.
    pub fn table(&self) -> String {
        let mut t = String::new();
        if self.info.synthetic {
            t.push_str(crate::report::SYNTHETIC_LINE);
        }
        t.push_str(&format!(
            "engine only (no local forward): the serving engine's own selection at the answer \
             position; {} cells\n",
            self.cells.len()
        ));
        let h = Self::HEAD;
        t.push_str(&format!(
            "{:>8} {:>7} {:>6} {:>18} {:>10}  {}\n",
            h[0], h[1], h[2], h[3], h[4], h[5]
        ));
        for (r, _) in self.rows() {
            t.push_str(&format!(
                "{:>8} {:>7} {:>6} {:>18} {:>10}  {}\n",
                r[0], r[1], r[2], r[3], r[4], r[5]
            ));
        }
        t.push_str(Self::LEGEND);
        t.push('\n');
        t
    }
}
