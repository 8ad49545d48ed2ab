//! The reporting layer (design.md section 6): results are records first, written and flushed as
//! cells finish; tables and plots are rendered from the records, so `needlescope report DIR`
//! redoes them without the model (style.md rule 11).
//!
//! - [`records`]: [`CellRecord`] (cells.csv), the probe's [`LayerRecord`] / [`AttentionRecord`]
//!   (layers.csv / attention.csv), [`RunInfo`] (run.json) and the normative column lists.
//! - [`store`]: [`RunDir`], the resumable report directory (commit protocol: layer and attention
//!   rows first, the cells.csv row last), and [`RunRecords`] to read one back.
//! - [`summary`]: per (length, profile, top-k) recall, median / worst rank, CSA layers lost; the
//!   terminal table and summary.json.
//! - [`plots`]: the PNGs ([`render_all`]) through the embedded DejaVu Sans font.
//!
//! Errors are [`ReportError`]s naming the file, with expected vs found where it applies.

mod csvio;
pub mod error;
mod plot_heatmap;
mod plot_layers;
mod plot_ranks;
pub mod plots;
pub mod records;
pub mod store;
pub mod summary;

pub use error::{FieldDifference, ReportError, Result};
pub use plots::{render_all, render_records};
pub use records::{
    config_hash, format_tokens, rfc3339_utc, AttentionRecord, CellRecord, Judge, LayerRecord,
    RunInfo, ATTENTION_COLUMNS, CELLS_COLUMNS, LAYERS_COLUMNS,
};
pub use store::{RunDir, RunRecords};
pub use summary::{render_table, stdout_wants_colour, summarize, GroupSummary, SummaryJson};

/// What `needlescope report DIR` does, without the model: reads the records, rewrites
/// summary.json, renders every PNG, and returns the terminal table (with ANSI colour when
/// `colour`) and the files written (summary.json first).
pub fn rerender(dir: &std::path::Path, colour: bool) -> Result<(String, Vec<std::path::PathBuf>)> {
    let records = RunRecords::read(dir)?;
    let mut written = vec![records.write_summary()?];
    written.extend(render_records(&records, dir)?);
    Ok((render_table(&summarize(&records.cells), colour), written))
}
