//! [`DirLock`]: the exclusive lock of a report directory, held by every process that writes
//! there (`sweep`, `demo`, `probe --out`, and `report`, which rewrites summary.json and the
//! PNGs) for as long as it writes, so two writers never interleave rows or files.
//!
//! The lock is an OS file lock ([`File::try_lock`], `flock` on Unix) on `DIR/.lock`: the OS
//! drops it when the holder exits or is killed, so a stale `.lock` file never blocks anyone
//! (the file itself stays; it holds nothing). A second writer is refused at once
//! ([`ReportError::Locked`]) rather than made to wait. Reading a directory
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
        match file.try_lock() {
            Ok(()) => Ok(DirLock(Arc::new(Held {
                dir: dir.to_path_buf(),
                _file: file,
            }))),
            Err(TryLockError::WouldBlock) => Err(ReportError::Locked {
                dir: dir.to_path_buf(),
                lock: path,
            }),
            Err(TryLockError::Error(e)) => Err(ReportError::io(path)(e)),
        }
    }

    /// The locked directory.
    pub fn dir(&self) -> &Path {
        &self.0.dir
    }
}
