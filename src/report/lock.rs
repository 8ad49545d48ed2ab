//! [`DirLock`]: the exclusive lock of a report directory, held by every process that writes
//! there (`sweep`, `demo`, `probe --out`, and `report`, which rewrites summary.json and the
//! PNGs) for as long as it writes, so two writers never interleave rows or files.
//!
//! The lock is an OS file lock ([`File::try_lock`], `flock` on Unix) on `DIR/.lock`: the OS
//! drops it when the holder exits or is killed, so a stale `.lock` file never blocks anyone
//! (the file itself stays; it holds nothing). A second writer is refused at once
//! ([`ReportError::Locked`]) rather than made to wait (after a grace of a quarter second for a
//! lock that a spawning child briefly shares). Reading a directory
//! ([`RunRecords::read`](super::RunRecords::read)) takes no lock.
//!
//! The lock is per open file, not per process: taking it twice in one process also fails, so a
//! caller that must hold it across several steps (the demo clears an old report, sweeps, then
//! renders) clones one [`DirLock`]; the file is unlocked when the last clone is dropped.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::{ReportError, Result};

/// The lock file's name inside a report directory.
pub const LOCK_FILE: &str = ".lock";

/// How long [`DirLock::acquire`] retries a held lock before refusing: a process that spawns a
/// child while it holds the lock (or just after releasing it) leaves the child a copy of the
/// lock file until the child's exec closes it, a few milliseconds. A real second writer holds
/// it for its whole run and is still refused.
const RELEASE_GRACE: std::time::Duration = std::time::Duration::from_millis(250);

/// A held lock on a report directory; released when the last clone is dropped.
#[derive(Clone, Debug)]
pub struct DirLock(Arc<Held>);

#[derive(Debug)]
struct Held {
    dir: PathBuf,
    /// Closing it releases the lock.
    _file: File,
}

impl DirLock {
    /// Takes the lock of the existing directory `dir`, creating `dir/.lock` when needed;
    /// [`ReportError::Locked`] when another writer holds it.
    pub fn acquire(dir: &Path) -> Result<DirLock> {
        let path = dir.join(LOCK_FILE);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(ReportError::io(&path))?;
        // A lock just released can still be held for a moment by a child being spawned (it
        // shares the open file until its exec closes it): retry briefly before refusing.
        let deadline = std::time::Instant::now() + RELEASE_GRACE;
        loop {
            match file.try_lock() {
                Ok(()) => {
                    return Ok(DirLock(Arc::new(Held {
                        dir: dir.to_path_buf(),
                        _file: file,
                    })))
                }
                Err(TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(TryLockError::WouldBlock) => {
                    return Err(ReportError::Locked {
                        dir: dir.to_path_buf(),
                        lock: path,
                    })
                }
                Err(TryLockError::Error(e)) => return Err(ReportError::io(path)(e)),
            }
        }
    }

    /// The locked directory.
    pub fn dir(&self) -> &Path {
        &self.0.dir
    }
}
