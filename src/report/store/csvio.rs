//! CSV and JSON file mechanics of the store: a reader that tolerates a torn last record, an
//! append-mode writer, and atomic whole-file writes.
//!
//! Line ends. The store writes `\n`; a file re-saved by a Windows editor or Excel ends its
//! lines in `\r\n` (the last one perhaps in a bare `\r`, or in nothing) and may start with a
//! UTF-8 byte order mark. All of these read exactly like the store's own files: a record's byte
//! range covers its whole terminator, and line numbers in errors count physical lines (`\n`,
//! `\r\n` or a bare `\r`, including those inside a quoted `answer_text`).
//!
//! Torn tails. Records are written with a `\n` terminator and flushed; a kill mid-write can
//! leave a partial last record. A record is TORN when it does not end in a line terminator, or
//! when it ends inside an open quote (an odd number of `"` bytes: a kill inside a quoted
//! `answer_text` holding a newline). A torn record is accepted only as the LAST one in the
//! file (that is what a kill produces) and is reported in [`ParsedCsv::torn_line`]; anywhere
//! else, and a complete (terminated) record that does not parse anywhere including last, is an
//! error with its line number: content that was written whole but is not understood is never
//! skipped. A torn header must be a prefix of the expected header (a kill while writing it);
//! anything else is a header error.

use serde::de::DeserializeOwned;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::ops::Range;
use std::path::Path;

use super::row_checks::RowCheck;
use crate::report::error::{ReportError, Result};

/// One complete record of a CSV file.
pub(crate) struct Row<T> {
    pub value: T,
    /// Its bytes, terminator included.
    pub bytes: Range<u64>,
    /// Its first physical line (the header is line 1).
    pub line: u64,
}

/// A CSV file as read back: its complete records with their byte ranges.
pub(crate) struct ParsedCsv<T> {
    /// Whether a complete header line is present (it then equals the expected columns).
    pub has_header: bool,
    /// Header bytes (including the terminator) when present.
    pub header_end: u64,
    pub records: Vec<Row<T>>,
    /// Length of the complete prefix (header + complete records).
    pub good_len: u64,
    pub file_len: u64,
    /// The line where a torn last record (or torn header) starts, when there is one.
    pub torn_line: Option<u64>,
    /// The line a record appended after the complete prefix will start on.
    pub next_line: u64,
    /// The header is an older version's ([`RowCheck::older_columns`]): the rows were read
    /// with it and completed ([`RowCheck::complete_older`]); appending needs a rewrite first.
    pub older: bool,
}

impl<T> ParsedCsv<T> {
    /// A torn tail is present (bytes after the last complete record).
    pub fn torn(&self) -> bool {
        self.good_len < self.file_len
    }
}

/// Physical line ends in `bytes[range]`: `\n`, `\r\n` (one) and a bare `\r`.
fn line_ends(bytes: &[u8], range: Range<usize>) -> u64 {
    let mut n = 0;
    for i in range {
        let b = bytes[i];
        if b == b'\n' || (b == b'\r' && bytes.get(i + 1) != Some(&b'\n')) {
            n += 1;
        }
    }
    n
}

/// Whether a record's bytes end inside a quoted field, read as the csv crate reads them: a
/// quote opens a quoted field only at the start of a field (elsewhere it is a plain
/// character), and inside one a doubled quote is a literal quote.
fn ends_inside_quotes(record: &[u8]) -> bool {
    let (mut quoted, mut field_start) = (false, true);
    let mut i = 0;
    while i < record.len() {
        let b = record[i];
        if quoted {
            if b == b'"' {
                if record.get(i + 1) == Some(&b'"') {
                    i += 1;
                } else {
                    quoted = false;
                }
            }
        } else if b == b'"' && field_start {
            quoted = true;
        }
        field_start = !quoted && matches!(b, b',' | b'\n' | b'\r');
        i += 1;
    }
    quoted
}

/// Physical lines in `bytes` (as error line numbers count them).
pub(crate) fn count_lines(bytes: &[u8]) -> u64 {
    line_ends(bytes, 0..bytes.len())
}

/// Reads `path`, checking the header against `columns` (exact names and order), or against
/// the columns an older version wrote ([`RowCheck::older_columns`]; [`ParsedCsv::older`]).
pub(crate) fn read_tolerant<T: DeserializeOwned + RowCheck>(
    path: &Path,
    columns: &[&str],
) -> Result<ParsedCsv<T>> {
    let mut columns = columns;
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(ReportError::io(path)(e)),
    };
    let len = bytes.len() as u64;
    let mut out = ParsedCsv {
        has_header: false,
        header_end: 0,
        records: Vec::new(),
        good_len: 0,
        file_len: len,
        torn_line: None,
        next_line: 1,
        older: false,
    };
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(bytes.as_slice());
    let mut header = csv::ByteRecord::from(columns.to_vec());
    let mut rec = csv::ByteRecord::new();
    let mut start = 0u64;
    // Line ends before byte `counted` (counted incrementally: files can be large).
    let (mut lines, mut counted) = (0u64, 0usize);
    loop {
        let read = reader.read_byte_record(&mut rec);
        let mut end = reader.position().byte();
        // The reader stops after the `\r` of a `\r\n`: the record owns its `\n` too.
        if end > 0 && bytes[end as usize - 1] == b'\r' && bytes.get(end as usize) == Some(&b'\n') {
            end += 1;
        }
        let own = &bytes[start as usize..end as usize];
        // Blank lines before a record are skipped by the reader and counted here.
        let lead = own
            .iter()
            .take_while(|&&b| b == b'\r' || b == b'\n')
            .count();
        lines += line_ends(&bytes, counted..start as usize + lead);
        counted = start as usize + lead;
        let line = 1 + lines;
        let last = end >= len;
        let open_quote = ends_inside_quotes(own);
        let terminated = !open_quote && matches!(own.last(), Some(b'\n' | b'\r'));
        // A "torn last record" that runs to a file ending with a line end over lines shaped
        // like whole records is no torn write (cells are appended whole, so a stopped run
        // tears at most the tail of one record): a quote opened at a field's start never
        // closes and swallows the records after it.
        let unclosed_quote = last
            && open_quote
            && matches!(bytes.last(), Some(b'\n' | b'\r'))
            && own
                .split(|&b| b == b'\n' || b == b'\r')
                .skip(1)
                .any(|l| l.iter().filter(|&&b| b == b',').count() + 1 == columns.len());
        let fail = |message: String| -> Result<ParsedCsv<T>> {
            Err(ReportError::Csv {
                path: path.to_path_buf(),
                line,
                message,
            })
        };
        if unclosed_quote {
            return fail(format!(
                "a quoted field opens on this line and never closes (its quote would hold \
                 the {} lines to the end of the file); expected a closing quote (a quote inside \
                 a field is written twice, \"\")",
                line_ends(own, 0..own.len())
            ));
        }
        match read {
            Ok(false) => break,
            Ok(true) => {}
            Err(_) if last && !terminated => {
                out.torn_line = Some(line);
                break;
            }
            Err(e) => return fail(e.to_string()),
        }
        if !out.has_header {
            let expected = format!("{}\n", columns.join(","));
            let text = String::from_utf8_lossy(own);
            let text = text.trim_start_matches('\u{feff}');
            if !terminated && last && expected.starts_with(text) {
                // Torn header: a kill while writing it; the file holds nothing else.
                out.torn_line = Some(line);
                break;
            }
            if rec != header || !terminated {
                let older = T::older_columns()
                    .filter(|o| terminated && rec.iter().eq(o.iter().map(|c| c.as_bytes())));
                let Some(older) = older else {
                    return Err(ReportError::Header {
                        path: path.to_path_buf(),
                        expected: columns.join(","),
                        found: text.trim_end().to_string(),
                    });
                };
                columns = older;
                header = csv::ByteRecord::from(older.to_vec());
                out.older = true;
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
                .map_err(|e| field_error(&e, &rec, columns))
        };
        match (parsed, terminated) {
            (Ok(mut value), true) => {
                if out.older {
                    value.complete_older();
                }
                if let Some(bad) = value.inconsistency() {
                    return Err(ReportError::Invalid {
                        path: path.to_path_buf(),
                        line,
                        field: bad.field.to_string(),
                        expected: bad.expected,
                        found: bad.found,
                    });
                }
                out.records.push(Row {
                    value,
                    bytes: start..end,
                    line,
                });
                out.good_len = end;
                start = end;
            }
            (_, false) if last => {
                out.torn_line = Some(line);
                break;
            }
            (Err(m), _) => return fail(m),
            (Ok(_), false) => return fail("record without a line terminator".into()),
        }
    }
    out.next_line = 1 + line_ends(&bytes, 0..out.good_len as usize);
    Ok(out)
}

/// A record's deserialisation error naming the column by name and 1-based number, and the
/// value found (the csv crate says `record 4 (line: 5, byte: 1241): field 13: ...`, counting
/// fields from 0 and naming none).
fn field_error(e: &csv::Error, rec: &csv::ByteRecord, columns: &[&str]) -> String {
    match e.kind() {
        csv::ErrorKind::Deserialize { err, .. } => match err.field() {
            Some(i) => {
                let i = i as usize;
                let found = rec.get(i).map(String::from_utf8_lossy).unwrap_or_default();
                format!(
                    "{} (column {}): cannot read {found:?}: {}",
                    columns.get(i).copied().unwrap_or("?"),
                    i + 1,
                    err.kind()
                )
            }
            None => err.kind().to_string(),
        },
        _ => e.to_string(),
    }
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

/// Maps a csv serialisation error onto the file it was meant for: a write that failed (a full
/// disk) is an I/O error on the file, anything else a record that could not be written.
pub(crate) fn csv_err(path: &Path) -> impl Fn(csv::Error) -> ReportError + '_ {
    move |e| {
        let source = if e.is_io_error() {
            match e.into_kind() {
                csv::ErrorKind::Io(io) => io,
                _ => unreachable!("is_io_error"),
            }
        } else {
            std::io::Error::other(format!("writing a record: {e}"))
        };
        ReportError::Io {
            path: path.to_path_buf(),
            source,
        }
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
    let written = (|| {
        let mut f = File::create(&tmp).map_err(ReportError::io(&tmp))?;
        f.write_all(bytes).map_err(ReportError::io(&tmp))?;
        f.sync_all().map_err(ReportError::io(&tmp))?;
        fs::rename(&tmp, path).map_err(ReportError::io(path))
    })();
    if written.is_err() {
        // No half-written `.tmp` left behind beside the records.
        let _ = fs::remove_file(&tmp);
    }
    written?;
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
    // A byte-order mark (an editor's) is no JSON; the CSVs accept it too.
    let bytes = bytes.strip_prefix("\u{feff}".as_bytes()).unwrap_or(&bytes);
    serde_json::from_slice(bytes).map_err(|e| ReportError::Json {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A record write that fails for lack of space reads as the file's I/O error (before, it
    /// was "layers.csv, line 0: ...", a line that does not exist).
    #[test]
    fn a_failed_record_write_is_an_io_error_on_the_file() {
        let path = Path::new("/dev/full");
        let Ok(file) = OpenOptions::new().write(true).open(path) else {
            return; // no /dev/full on this system
        };
        let mut w = csv::WriterBuilder::new()
            .buffer_capacity(1)
            .from_writer(file);
        let e = w
            .serialize(("a", 1))
            .and_then(|_| w.flush().map_err(csv::Error::from))
            .map_err(csv_err(path))
            .unwrap_err();
        assert!(matches!(e, ReportError::Io { .. }), "{e:?}");
        let text = e.to_string();
        assert!(
            text.starts_with("/dev/full: ") && !text.contains("line 0"),
            "{text}"
        );
    }
}
