//! `needlescope report DIR`: re-renders terminal tables, CSV summaries and PNG plots from the
//! records of a sweep, without running the model (design.md 6).

use clap::Args;
use std::io::Write;
use std::path::PathBuf;

#[derive(Args, Debug, Clone)]
pub struct ReportArgs {
    /// Report directory written by `sweep` or `demo` (holds run.json and cells.csv)
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
}

pub fn run(args: &ReportArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let colour = crate::report::stdout_wants_colour();
    let (table, files) = crate::report::rerender(&args.dir, colour)?;
    write!(out, "{table}")?;
    writeln!(out)?;
    for f in &files {
        writeln!(out, "wrote {}", f.display())?;
    }
    Ok(())
}
