//! `needlescope report DIR`: re-renders terminal tables, CSV summaries and PNG plots from the
//! records of a sweep, without running the model (design.md 6).
//!
//! It holds the directory's lock while it rewrites summary.json and the PNGs, so it is refused
//! while a sweep, demo or probe writes there. Records that are not understood (a line that does
//! not parse, a duplicated or inconsistent cell) are an error that leaves every file as it was;
//! a torn last line (a run stopped mid-write) is left out with a note on stderr.

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
    let lock = crate::report::lock_existing(&args.dir)?;
    let done = crate::report::rerender_locked(&lock, colour)?;
    drop(lock);
    for note in &done.notes {
        eprintln!("note: {}: {note}", args.dir.display());
    }
    if done.cells == 0 {
        writeln!(
            out,
            "{}: no finished cell recorded yet (a run that stopped before its first cell ended); \
             the table and plots below are empty",
            args.dir.display()
        )?;
    }
    if let Some(planned) = done.planned.filter(|&p| done.cells > 0 && done.cells < p) {
        writeln!(
            out,
            "{}: {} of {planned} cells finished (the run stopped early; the same sweep command \
             with --out {} resumes it)",
            args.dir.display(),
            done.cells,
            args.dir.display()
        )?;
    }
    write!(out, "{}", done.table)?;
    writeln!(out)?;
    writeln!(out, "{}", done.files_line(&args.dir))?;
    Ok(())
}
