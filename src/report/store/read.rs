//! [`RunRecords`]: a report directory read back without modifying it (for `needlescope
//! report` and the plots), with the checks of `validate`, `row_checks`, `completeness` and
//! `agreement`;
//! the writer and the commit protocol are `store`'s.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

use super::agreement::first_disagreement;
use super::completeness::{incomplete_cells, orphan_cells};
use super::csvio::{read_json, read_tolerant, write_json, ParsedCsv};
use super::row_checks::RowCheck;
use super::validate::CellCheck;
use super::{
    list_some, not_a_run_dir, ATTENTION_CSV, CELLS_CSV, LAYERS_CSV, RUN_JSON, SUMMARY_JSON,
};
use crate::record::verdict::exact_keeps_by_cell;
use crate::record::{
    AttentionRecord, CellRecord, LayerRecord, RunInfo, ATTENTION_COLUMNS, CELLS_COLUMNS,
    LAYERS_COLUMNS,
};
use crate::report::error::{ReportError, Result};
use crate::report::summary::SummaryJson;

/// Everything a report directory holds, read without modifying it (for `needlescope report`).
#[derive(Clone, Debug)]
pub struct RunRecords {
    pub dir: PathBuf,
    pub info: RunInfo,
    /// Finished cells (complete cells.csv rows), in file order.
    pub cells: Vec<CellRecord>,
    /// layers.csv rows of finished cells (orphans of a cell in flight are skipped).
    pub layers: Vec<LayerRecord>,
    /// attention.csv rows of finished cells.
    pub attention: Vec<AttentionRecord>,
    /// engine.csv rows of finished cells (empty without engine.csv).
    pub engine: Vec<crate::record::engine::EngineLayerRecord>,
    /// What was read but left out, for the user: a torn last line per file (a run killed
    /// while writing it), e.g. `cells.csv, line 5: incomplete last line ...`.
    pub notes: Vec<String>,
}

impl RunRecords {
    /// Reads `dir`; torn tails and the rows of one unfinished cell (a stopped run's cell in
    /// flight) are ignored and noted in [`Self::notes`], files are not touched. A missing
    /// run.json, a line that does not parse, a cell that fails the checks of `validate`, a
    /// finished cell whose layers.csv or attention.csv rows are not all there and rows of
    /// several unlisted cells (`completeness`) are errors.
    pub fn read(dir: &Path) -> Result<RunRecords> {
        let run_json = dir.join(RUN_JSON);
        if !run_json.exists() {
            return Err(not_a_run_dir(dir));
        }
        let info: RunInfo = read_json(&run_json)?;
        let mut notes = Vec::new();
        let cells_csv: ParsedCsv<CellRecord> = read_tolerant(&dir.join(CELLS_CSV), &CELLS_COLUMNS)?;
        note_torn(&mut notes, CELLS_CSV, &cells_csv);
        let mut check = CellCheck::new(dir, &info)?;
        for row in &cells_csv.records {
            check.check(&row.value, row.line)?;
        }
        let older = cells_csv.older;
        let mut cells: Vec<CellRecord> = cells_csv.records.into_iter().map(|r| r.value).collect();
        let finished: HashSet<String> = cells.iter().map(|c| c.cell_id.clone()).collect();
        let mut layers: Vec<LayerRecord> = rows(dir, LAYERS_CSV, &LAYERS_COLUMNS, &mut notes)?;
        let mut attention: Vec<AttentionRecord> =
            rows(dir, ATTENTION_CSV, &ATTENTION_COLUMNS, &mut notes)?;
        let orphans = orphan_cells(
            layers
                .iter()
                .map(|r| r.cell_id.as_str())
                .chain(attention.iter().map(|r| r.cell_id.as_str())),
            &finished,
        );
        match orphans.as_slice() {
            [] => {}
            [one] => notes.push(format!(
                "rows of cell {one}, which cells.csv does not list (a run stopped while \
                 computing it); ignored, and redone when the run is resumed"
            )),
            many => {
                return Err(ReportError::Damaged {
                    path: dir.join(CELLS_CSV),
                    problem: format!(
                        "layers.csv or attention.csv holds rows of {} cells that cells.csv \
                         does not list ({}); a stopped run leaves at most one",
                        many.len(),
                        list_some(many)
                    ),
                })
            }
        }
        layers.retain(|r| finished.contains(&r.cell_id));
        attention.retain(|r| finished.contains(&r.cell_id));
        let mut engine: Vec<crate::record::engine::EngineLayerRecord> =
            if dir.join(super::ENGINE_CSV).exists() {
                rows(
                    dir,
                    super::ENGINE_CSV,
                    &crate::record::engine::ENGINE_COLUMNS,
                    &mut notes,
                )?
            } else {
                Vec::new()
            };
        engine.retain(|r| finished.contains(&r.cell_id));
        if let Some(d) = incomplete_cells(&cells, &layers, &attention).first() {
            return Err(ReportError::Damaged {
                path: dir.join(d.file),
                problem: format!("finished cell {}: {}", d.cell_id, d.why),
            });
        }
        if older {
            // Written before the column: derived here, from the rows it is checked against.
            super::derive_exact_keeps(&mut cells, &layers);
            notes.push(format!(
                "{CELLS_CSV} was written by an older needlescope (no recalled, exact_keeps, \
                 sample columns): read with them derived; a resumed run rewrites it with them"
            ));
        }
        if let Some(d) = first_disagreement(&cells, &layers) {
            return Err(ReportError::Mismatch {
                path: dir.join(d.file),
                what: format!(
                    "{} of {} (cells.csv and layers.csv disagree)",
                    d.field, d.place
                ),
                expected: d.expected,
                found: d.found,
            });
        }
        Ok(RunRecords {
            dir: dir.to_path_buf(),
            info,
            cells,
            layers,
            attention,
            engine,
            notes,
        })
    }

    /// Rewrites `<dir>/summary.json` from these records (atomically); returns its path.
    pub fn write_summary(&self) -> Result<PathBuf> {
        let path = self.dir.join(SUMMARY_JSON);
        let exact_keeps_by = exact_keeps_by_cell(&self.cells);
        write_json(
            &path,
            &SummaryJson::new(&self.info, &self.cells, &exact_keeps_by),
        )?;
        Ok(path)
    }
}

fn rows<T: DeserializeOwned + RowCheck>(
    dir: &Path,
    name: &str,
    columns: &[&str],
    notes: &mut Vec<String>,
) -> Result<Vec<T>> {
    let csv: ParsedCsv<T> = read_tolerant(&dir.join(name), columns)?;
    note_torn(notes, name, &csv);
    Ok(csv.records.into_iter().map(|r| r.value).collect())
}

pub(crate) fn note_torn<T>(notes: &mut Vec<String>, name: &str, csv: &ParsedCsv<T>) {
    if let Some(line) = csv.torn_line {
        notes.push(format!(
            "{name}, line {line}: incomplete last line (a run stopped while writing it); \
             ignored, and redone when the run is resumed"
        ));
    }
}
