//! `needlescope report DIR`: re-renders terminal tables, CSV summaries and PNG plots from the
//! records of a sweep, without running the model (design.md 6).

use clap::Args;
use std::io::Write;
use std::path::PathBuf;

use super::NotImplemented;

#[derive(Args, Debug, Clone)]
pub struct ReportArgs {
    /// Report directory written by `sweep` or `demo` (holds run.json and cells.csv)
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
}

pub fn run(_args: &ReportArgs, _out: &mut dyn Write) -> anyhow::Result<()> {
    Err(NotImplemented {
        command: "report",
        why: "the report renderer has not landed",
    }
    .into())
}
