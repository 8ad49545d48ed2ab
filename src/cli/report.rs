//! `needlescope report DIR`: re-renders terminal tables, CSV summaries and PNG plots from the
//! records of a sweep, without running the model (docs/outputs.md).
//!
//! It holds the directory's lock while it rewrites summary.json and the PNGs. While a sweep,
//! demo or probe writes there (or where the directory cannot be written) it prints the table
//! of the cells finished so far and writes nothing. Records that are not understood (a line that does
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
    use crate::report::ReportError;
    let colour = crate::report::stdout_wants_colour();
    let mut writing = false;
    let done = match crate::report::lock_existing(&args.dir) {
        Ok(lock) => crate::report::rerender_locked(&lock, colour)?,
        // Another run writes there (a long sweep): its finished cells so far, files untouched.
        Err(ReportError::Locked { .. }) => {
            eprintln!(
                "note: {}: another needlescope is writing there; the table below is of the \
                 cells finished so far, and summary.json and the plots are left to that run",
                args.dir.display()
            );
            writing = true;
            crate::report::table_only(&args.dir, colour)?
        }
        // A directory this user cannot write (a shared or read-only copy): the table only.
        Err(ReportError::Io { path, source })
            if matches!(
                source.kind(),
                std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem
            ) =>
        {
            eprintln!(
                "note: {}: cannot write there ({}: {source}); the table below is printed, \
                 summary.json and the plots are not rewritten",
                args.dir.display(),
                path.display()
            );
            crate::report::table_only(&args.dir, colour)?
        }
        Err(e) => return Err(e.into()),
    };
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
        let state = if writing {
            "the run is still going".to_string()
        } else if done.command == "demo" {
            "the demo stopped early; rerunning the demo starts it afresh".to_string()
        } else {
            format!(
                "the run stopped early; the same sweep command with --out {} resumes it",
                args.dir.display()
            )
        };
        writeln!(
            out,
            "{}: {} of {planned} cells finished ({state})",
            args.dir.display(),
            done.cells,
        )?;
    }
    write!(out, "{}", done.table)?;
    if !done.files.is_empty() {
        writeln!(out)?;
        writeln!(out, "{}", done.files_line(&args.dir))?;
    }
    Ok(())
}
