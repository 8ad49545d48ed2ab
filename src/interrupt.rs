//! Ctrl-C during runs that keep their finished work (`sweep`, `demo`).
//!
//! The binary installs one process-wide handler ([`install`]). While a resumable run is in
//! progress (a [`Resumable`] guard is alive), the first Ctrl-C asks it to stop once the cell in
//! flight is committed ([`stop_requested`]; the run then returns [`Interrupted`]), and a second
//! one exits at once. Either way the process exits 130 and says where the finished cells are and
//! that rerunning the same command resumes. Outside such a run Ctrl-C ends the process at once,
//! as without a handler. A library user that never calls [`install`] sees no change: the stop
//! flag is never set.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// The exit status of a process stopped by Ctrl-C (128 + SIGINT), as shells report it.
pub const EXIT_INTERRUPTED: u8 = 130;

static STOP: AtomicBool = AtomicBool::new(false);
static PRESSES: AtomicUsize = AtomicUsize::new(0);
/// Where the run in progress keeps its finished cells (None: no resumable run).
static ACTIVE: Mutex<Option<PathBuf>> = Mutex::new(None);

/// A resumable run stopped by Ctrl-C after committing `finished` of its `total` cells.
#[derive(Debug, thiserror::Error)]
#[error(
    "interrupted by Ctrl-C: {finished} of {total} cells are finished and kept in {}; rerun the same command to resume",
    dir.display()
)]
pub struct Interrupted {
    pub dir: PathBuf,
    pub finished: usize,
    pub total: usize,
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
    let dir = ACTIVE.lock().map(|d| d.clone()).unwrap_or(None);
    let Some(dir) = dir else {
        std::process::exit(i32::from(EXIT_INTERRUPTED));
    };
    if PRESSES.fetch_add(1, Ordering::AcqRel) == 0 {
        STOP.store(true, Ordering::Release);
        eprintln!(
            "\nCtrl-C: stopping once the cell in flight is finished; press Ctrl-C again to stop now (finished cells are kept either way)"
        );
    } else {
        eprintln!(
            "\nstopped by Ctrl-C: finished cells are kept in {}; rerun the same command to resume",
            dir.display()
        );
        std::process::exit(i32::from(EXIT_INTERRUPTED));
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
        if let Ok(mut active) = ACTIVE.lock() {
            *active = Some(dir.to_path_buf());
        }
        Resumable(())
    }
}

impl Drop for Resumable {
    fn drop(&mut self) {
        if let Ok(mut active) = ACTIVE.lock() {
            *active = None;
        }
    }
}
