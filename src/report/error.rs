//! [`ReportError`]: everything that can go wrong reading or writing a report directory. Every
//! variant names the file it is about; mismatches say what was expected and what was found.

use std::fmt;
use std::path::PathBuf;

/// One field in which a resumed run differs from the run recorded in run.json.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldDifference {
    /// Dotted name, e.g. `model_config_hash` or `sweep_args.lengths`.
    pub field: String,
    /// The value recorded in run.json (compact JSON).
    pub expected: String,
    /// The value of the run being started (compact JSON).
    pub found: String,
}

impl fmt::Display for FieldDifference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: expected {} (run.json), found {} (this run)",
            self.field, self.expected, self.found
        )
    }
}

fn join(diffs: &[FieldDifference]) -> String {
    let details: Vec<String> = diffs.iter().map(|d| d.to_string()).collect();
    format!("it differs in {}", details.join("; "))
}

/// Errors of the report layer (records, store, summary, plots).
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A CSV record that does not parse (not a torn last line, which is dropped silently).
    #[error("{}, line {line}: {message}", .path.display())]
    Csv {
        path: PathBuf,
        line: u64,
        message: String,
    },
    #[error("{}: header: expected `{expected}`, found `{found}`", .path.display())]
    Header {
        path: PathBuf,
        expected: String,
        found: String,
    },
    #[error("{}: {message}", .path.display())]
    Json { path: PathBuf, message: String },
    /// `create_or_resume` on a directory whose run.json records a different run.
    #[error(
        "refusing to {action} {}: {}; use a new output directory or repeat the original arguments",
        .path.display(), join(.differences)
    )]
    ResumeMismatch {
        path: PathBuf,
        /// `resume` (a sweep or demo: the finished cells would be kept) or `add cells to` (a
        /// probe: probes never resume, they add their cells to a directory of the same settings).
        action: &'static str,
        differences: Vec<FieldDifference>,
    },
    /// A record handed to the store (or found in a file) that contradicts another one.
    #[error("{}: {what}: expected {expected}, found {found}", .path.display())]
    Mismatch {
        path: PathBuf,
        what: String,
        expected: String,
        found: String,
    },
    #[error(
        "{}: not a report directory: expected run.json (written by `sweep`, `demo` or `probe --out`), found {found}",
        .path.display()
    )]
    NotARunDir { path: PathBuf, found: String },
    /// A cells.csv record that parses but cannot be right: a duplicated or inconsistent
    /// cell_id, an impossible value, or a cell outside the run's arguments in run.json.
    #[error("{}, line {line}, {field}: expected {expected}, found {found}", .path.display())]
    Invalid {
        path: PathBuf,
        line: u64,
        field: String,
        expected: String,
        found: String,
    },
    /// Records a kill cannot leave behind: a finished cell whose layers.csv or attention.csv
    /// rows are not all there, or rows of several cells that cells.csv does not list.
    #[error(
        "{}: {problem}; the files were edited or damaged (running the same command again computes those cells again)",
        .path.display()
    )]
    Damaged { path: PathBuf, problem: String },
    /// Another process holds the report directory's lock (it is writing there).
    #[error(
        "another needlescope is writing {} (lock {} held); wait for it to finish",
        .dir.display(), .lock.display()
    )]
    Locked { dir: PathBuf, lock: PathBuf },
    #[error("{}: drawing failed: {message}", .path.display())]
    Plot { path: PathBuf, message: String },
}

impl ReportError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> ReportError {
        let path = path.into();
        move |source| ReportError::Io { path, source }
    }
}

/// Results of the report layer.
pub type Result<T> = std::result::Result<T, ReportError>;
