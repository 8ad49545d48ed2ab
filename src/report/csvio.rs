//! CSV and JSON file mechanics of the store: a reader that tolerates a torn last record, an
//! append-mode writer, and atomic whole-file writes.
//!
//! Torn tails. Records are written with a `\n` terminator and flushed; a kill mid-write can
//! leave a partial last record. A record counts as complete when its bytes end with `\n`, it
//! has the header's field count and it deserialises. An incomplete record is accepted only as
//! the LAST one in the file (that is what a kill produces); anywhere else it is corruption and an
//! error with its line number. This also covers a kill inside a quoted `answer_text` holding a
//! newline: the partial record then has too few fields.

use serde::de::DeserializeOwned;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::ops::Range;
use std::path::Path;

use super::error::{ReportError, Result};

/// A CSV file as read back: its complete records with their byte ranges.
pub(crate) struct ParsedCsv<T> {
    /// Whether a complete header line is present (it then equals the expected columns).
    pub has_header: bool,
    /// Header bytes (including the terminator) when present.
    pub header_end: u64,
    pub records: Vec<(T, Range<u64>)>,
    /// Length of the complete prefix (header + complete records).
    pub good_len: u64,
    pub file_len: u64,
}

impl<T> ParsedCsv<T> {
    /// A torn tail is present (bytes after the last complete record).
    pub fn torn(&self) -> bool {
        self.good_len < self.file_len
    }
}

/// Reads `path`, checking the header against `columns` (exact names and order).
pub(crate) fn read_tolerant<T: DeserializeOwned>(
    path: &Path,
    columns: &[&str],
) -> Result<ParsedCsv<T>> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(ParsedCsv {
                has_header: false,
                header_end: 0,
                records: Vec::new(),
                good_len: 0,
                file_len: 0,
            })
        }
        Err(e) => return Err(ReportError::io(path)(e)),
    };
    let len = bytes.len() as u64;
    let mut out = ParsedCsv {
        has_header: false,
        header_end: 0,
        records: Vec::new(),
        good_len: 0,
        file_len: len,
    };
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(bytes.as_slice());
    let header = csv::ByteRecord::from(columns.to_vec());
    let mut rec = csv::ByteRecord::new();
    let mut start = 0u64;
    loop {
        let line = reader.position().line();
        let read = reader.read_byte_record(&mut rec);
        let end = reader.position().byte();
        let last = end >= len;
        let terminated = end > 0 && end <= len && bytes[end as usize - 1] == b'\n';
        let fail = |message: String| -> Result<ParsedCsv<T>> {
            Err(ReportError::Csv {
                path: path.to_path_buf(),
                line,
                message,
            })
        };
        match read {
            Ok(false) => break,
            Ok(true) => {}
            Err(_) if last => break,
            Err(e) => return fail(e.to_string()),
        }
        if !out.has_header {
            if !terminated {
                break; // torn header: the file holds nothing usable
            }
            if rec != header {
                return Err(ReportError::Header {
                    path: path.to_path_buf(),
                    expected: columns.join(","),
                    found: String::from_utf8_lossy(&bytes[..end as usize])
                        .trim_end()
                        .to_string(),
                });
            }
            out.has_header = true;
            out.header_end = end;
            out.good_len = end;
            start = end;
            continue;
        }
        let parsed = if rec.len() != columns.len() {
            Err(format!(
                "expected {} fields, found {}",
                columns.len(),
                rec.len()
            ))
        } else {
            rec.deserialize::<T>(Some(&header))
                .map_err(|e| e.to_string())
        };
        match (parsed, terminated) {
            (Ok(r), true) => {
                out.records.push((r, start..end));
                out.good_len = end;
                start = end;
            }
            _ if last => break,
            (Err(m), _) => return fail(m),
            (Ok(_), false) => return fail("record without a line terminator".into()),
        }
    }
    Ok(out)
}

/// Opens `path` for appending (creating it).
pub(crate) fn open_append(path: &Path) -> Result<csv::Writer<File>> {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(ReportError::io(path))?;
    Ok(csv::WriterBuilder::new()
        .has_headers(false)
        .terminator(csv::Terminator::Any(b'\n'))
        .from_writer(file))
}

/// Flushes a CSV writer and syncs its file's data to disk.
pub(crate) fn flush_sync(w: &mut csv::Writer<File>, path: &Path) -> Result<()> {
    w.flush().map_err(ReportError::io(path))?;
    w.get_ref().sync_data().map_err(ReportError::io(path))
}

/// Maps a csv serialisation error onto the file it was meant for.
pub(crate) fn csv_err(path: &Path) -> impl Fn(csv::Error) -> ReportError + '_ {
    move |e| ReportError::Csv {
        path: path.to_path_buf(),
        line: 0,
        message: e.to_string(),
    }
}

/// Cuts `path` back to `len` bytes (dropping a torn tail) and syncs.
pub(crate) fn truncate(path: &Path, len: u64) -> Result<()> {
    let f = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(ReportError::io(path))?;
    f.set_len(len).map_err(ReportError::io(path))?;
    f.sync_all().map_err(ReportError::io(path))
}

/// Replaces `path` with `bytes` atomically: a sibling `.tmp` file, synced, then renamed over
/// it, then the directory synced (best effort), so a kill leaves the old or the new file whole.
pub(crate) fn atomic_write(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    {
        let mut f = File::create(&tmp).map_err(ReportError::io(&tmp))?;
        f.write_all(bytes).map_err(ReportError::io(&tmp))?;
        f.sync_all().map_err(ReportError::io(&tmp))?;
    }
    fs::rename(&tmp, path).map_err(ReportError::io(path))?;
    if let Some(dir) = path.parent() {
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// Reads and parses a JSON file.
pub(crate) fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let bytes = fs::read(path).map_err(ReportError::io(path))?;
    serde_json::from_slice(&bytes).map_err(|e| ReportError::Json {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Writes `value` as pretty JSON (with a final newline) atomically.
pub(crate) fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> Result<()> {
    let mut bytes = serde_json::to_vec_pretty(value).map_err(|e| ReportError::Json {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    bytes.push(b'\n');
    atomic_write(path, &bytes)
}
