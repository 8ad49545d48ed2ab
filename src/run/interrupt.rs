//! Ctrl-C during runs that keep their finished work (`sweep`, `demo`, `probe`).
//!
//! The binary installs one process-wide handler ([`install`]). While a resumable run is in
//! progress (a [`Resumable`] guard is alive), the first Ctrl-C asks it to stop once the cell in
//! flight is committed ([`stop_requested`]; the run then returns [`Interrupted`]), and a second
//! one exits at once. Either way the process exits 130 and says where the finished cells are and
//! how to go on: a sweep resumes when rerun with `--out` naming that directory (its default
//! `--out` has a timestamp, so the hint names it), the demo starts afresh ([`restart_hint`]).
//! A probe's unit is its (index, top-k) run, which can take hours: the first Ctrl-C stops it at
//! the next prefill chunk or generated token, dropping the run in flight, and the finished runs
//! are printed and recorded in its `--out` directory when it has one.
//! A sweep (or demo) stopped this way renders the plots and report.html of its finished cells
//! before it exits ([`after_stop`] says where they are, or, when that failed, that
//! `needlescope report DIR` writes them). While a report is rendered (after the last cell,
//! [`Resumable::rendering`], or after a stop, [`rendering_after_stop`]) Ctrl-C exits at once,
//! saying that the records are kept and `needlescope report` renders them. Outside
//! such a run Ctrl-C ends the process at once (saying so), as without a handler. Whenever
//! Ctrl-C ends the process it first removes the half-written files registered with
//! [`RemoveOnInterrupt`] (a trace's `.partial` file). A library user that never
//! calls [`install`] sees no change: the stop flag is never set.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// The exit status of a process stopped by Ctrl-C (128 + SIGINT), as shells report it.
pub const EXIT_INTERRUPTED: u8 = 130;

static STOP: AtomicBool = AtomicBool::new(false);
static PRESSES: AtomicUsize = AtomicUsize::new(0);
/// The run in progress (None: no resumable run).
static ACTIVE: Mutex<Option<Active>> = Mutex::new(None);
/// What to tell the user instead of "rerun to resume" (see [`restart_hint`]).
static RESTART_HINT: Mutex<Option<String>> = Mutex::new(None);

struct Active {
    /// Where the run keeps its finished cells (None: a probe without `--out`, which only
    /// prints them).
    dir: Option<PathBuf>,
    /// A probe (stops at the next chunk, in runs) rather than a sweep (after the cell in
    /// flight).
    probe: bool,
    /// All cells are finished and the report is being rendered.
    rendering: bool,
}

/// A resumable run stopped by Ctrl-C after committing `finished` of its `total` cells; `next`
/// says how to go on ([`next_step`]).
#[derive(Debug, thiserror::Error)]
#[error(
    "interrupted by Ctrl-C: {finished} of {total} {unit} are finished{}; {next}",
    dir.as_ref().map_or(String::new(), |d| format!(" and kept in {}", d.display()))
)]
pub struct Interrupted {
    /// What was counted: "cells" (a sweep), "runs" (a probe).
    pub unit: &'static str,
    /// None: nothing was recorded (a probe without `--out`).
    pub dir: Option<PathBuf>,
    pub finished: usize,
    pub total: usize,
    pub next: String,
}

/// How to go on after a run into `dir` was stopped: rerun with `--out dir` (a sweep's default
/// directory has a timestamp, so "the same command" alone would start a new one), unless a
/// [`restart_hint`] says otherwise.
pub fn next_step(dir: &Path) -> String {
    if let Some(hint) = RESTART_HINT.lock().ok().and_then(|h| h.clone()) {
        return hint;
    }
    format!(
        "to resume, rerun the same command with --out {}",
        dir.display()
    )
}

/// What a run stopped by Ctrl-C says after its finished cells: where their report is
/// (`rendered`: the plots and report.html were written) or how to write it, then
/// [`next_step`].
pub fn after_stop(dir: &Path, rendered: bool) -> String {
    let report = if rendered {
        format!("their plots and report.html are in {}", dir.display())
    } else {
        format!(
            "`needlescope report {}` writes their plots and report.html",
            dir.display()
        )
    };
    format!("{report}; {}", next_step(dir))
}

/// A run stopped by Ctrl-C renders the report of its finished cells: from now on Ctrl-C
/// exits at once, saying that `needlescope report` writes it (see [`Resumable::rendering`]).
pub fn rendering_after_stop() {
    mark_rendering();
}

/// Marks the run in progress as rendering its report (Ctrl-C then exits at once).
fn mark_rendering() {
    if let Ok(mut active) = ACTIVE.lock() {
        if let Some(a) = active.as_mut() {
            a.rendering = true;
        }
    }
}

/// Replaces the resume hint of the runs that follow (the demo, which starts afresh when rerun,
/// says so); `None` restores it.
pub fn restart_hint(hint: Option<String>) {
    if let Ok(mut h) = RESTART_HINT.lock() {
        *h = hint;
    }
}

/// Installs the Ctrl-C handler (once per process; later calls do nothing).
pub fn install() -> Result<(), ctrlc::Error> {
    static INSTALLED: AtomicBool = AtomicBool::new(false);
    if INSTALLED.swap(true, Ordering::AcqRel) {
        return Ok(());
    }
    ctrlc::set_handler(on_ctrl_c)
}

fn on_ctrl_c() {
    let active = ACTIVE
        .lock()
        .ok()
        .and_then(|a| a.as_ref().map(|a| (a.dir.clone(), a.rendering, a.probe)));
    let Some((dir, rendering, probe)) = active else {
        eprintln!("\nstopped by Ctrl-C");
        exit_interrupted();
    };
    match (&dir, rendering) {
        (Some(dir), true) if stop_requested() => {
            eprintln!(
                "\nstopped by Ctrl-C while writing the report of the finished cells in {0}; \
                 `needlescope report {0}` writes it; {1}",
                dir.display(),
                next_step(dir)
            );
            exit_interrupted();
        }
        (Some(dir), true) => {
            eprintln!(
                "\nstopped by Ctrl-C while writing the report: every cell is finished in {0}; \
                 `needlescope report {0}` writes the summary and plots",
                dir.display()
            );
            exit_interrupted();
        }
        (None, true) => exit_interrupted(),
        _ => {}
    }
    let first = PRESSES.fetch_add(1, Ordering::AcqRel) == 0;
    if first && probe {
        STOP.store(true, Ordering::Release);
        eprintln!(
            "\nCtrl-C: stopping the probe at the next chunk (the run in flight is dropped; the \
             finished runs are printed{}); press Ctrl-C again to stop now",
            match &dir {
                Some(d) => format!(" and recorded in {}", d.display()),
                None => String::new(),
            }
        );
    } else if first {
        STOP.store(true, Ordering::Release);
        eprintln!(
            "\nCtrl-C: stopping once the cell in flight is finished; press Ctrl-C again to stop now ({})",
            if dir.is_some() {
                "finished cells are kept either way"
            } else {
                "then nothing is printed"
            }
        );
    } else {
        match &dir {
            Some(dir) => eprintln!(
                "\nstopped by Ctrl-C: finished cells are kept in {}; {}",
                dir.display(),
                next_step(dir)
            ),
            None => eprintln!("\nstopped by Ctrl-C"),
        }
        exit_interrupted();
    }
}

/// Ends the process for Ctrl-C (exit [`EXIT_INTERRUPTED`]), first removing the half-written
/// files registered with [`RemoveOnInterrupt`].
fn exit_interrupted() -> ! {
    remove_registered();
    std::process::exit(i32::from(EXIT_INTERRUPTED))
}

/// Files being written that are useless unless finished (a trace's `.partial` file, possibly
/// gigabytes): removed when Ctrl-C ends the process.
static PARTIAL_FILES: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Removes every file registered with [`RemoveOnInterrupt`] (what the Ctrl-C handler does
/// before it exits); the registrations stay.
pub fn remove_registered() {
    if let Ok(files) = PARTIAL_FILES.lock() {
        for f in files.iter() {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// Registers a file that Ctrl-C should remove rather than leave half written, until dropped
/// (drop it once the file is complete or renamed away).
#[derive(Debug)]
pub struct RemoveOnInterrupt(PathBuf);

impl RemoveOnInterrupt {
    pub fn new(path: &Path) -> Self {
        if let Ok(mut files) = PARTIAL_FILES.lock() {
            files.push(path.to_path_buf());
        }
        RemoveOnInterrupt(path.to_path_buf())
    }
}

impl Drop for RemoveOnInterrupt {
    fn drop(&mut self) {
        if let Ok(mut files) = PARTIAL_FILES.lock() {
            if let Some(i) = files.iter().position(|f| *f == self.0) {
                files.swap_remove(i);
            }
        }
    }
}

/// Whether Ctrl-C asked the resumable run in progress to stop.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::Acquire)
}

/// Marks a resumable run writing into a directory as in progress, until dropped.
#[derive(Debug)]
pub struct Resumable(());

impl Resumable {
    pub fn new(dir: &Path) -> Self {
        Self::recorded_in(Some(dir))
    }

    /// [`Resumable::new`], or with `None` a run that keeps its finished cells only by printing
    /// them.
    pub fn recorded_in(dir: Option<&Path>) -> Self {
        Self::activate(dir, false)
    }

    /// A probe (recorded in `dir` with `--out`): the first Ctrl-C stops it at the next chunk.
    pub fn probe(dir: Option<&Path>) -> Self {
        Self::activate(dir, true)
    }

    fn activate(dir: Option<&Path>, probe: bool) -> Self {
        if let Ok(mut active) = ACTIVE.lock() {
            *active = Some(Active {
                dir: dir.map(Path::to_path_buf),
                rendering: false,
                probe,
            });
        }
        Resumable(())
    }

    /// Every cell is finished: from now on (the summary and plots) Ctrl-C exits at once,
    /// pointing at `needlescope report`.
    pub fn rendering(&self) {
        mark_rendering();
    }
}

impl Drop for Resumable {
    fn drop(&mut self) {
        if let Ok(mut active) = ACTIVE.lock() {
            *active = None;
        }
    }
}
