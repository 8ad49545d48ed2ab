//! `needlescope report DIR`: re-renders terminal tables, CSV summaries and PNG plots from the
//! records of a sweep, without running the model (design.md 6).

use clap::Args;
use std::io::Write;
use std::path::PathBuf;

#[derive(Args, Debug, Clone)]
pub struct ReportArgs {
    /// Report directory written by `sweep`, `demo` or `probe --out` (holds run.json and cells.csv)
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
}

pub fn run(args: &ReportArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let colour = crate::report::stdout_wants_colour();
    let cells = crate::report::RunRecords::read(&args.dir)?.cells.len();
    if cells == 0 {
        writeln!(
            out,
            "{}: no finished cell recorded yet (a run that stopped before its first cell ended); \
             the table and plots below are empty",
            args.dir.display()
        )?;
    }
    let (table, files) = crate::report::rerender(&args.dir, colour)?;
    write!(out, "{table}")?;
    writeln!(out)?;
    for f in &files {
        writeln!(out, "wrote {}", f.display())?;
    }
    Ok(())
}
