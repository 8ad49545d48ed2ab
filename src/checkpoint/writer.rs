//! A streaming safetensors writer: the header is computed from the tensor list up front, then
//! each tensor's bytes are appended in list order, in as many pieces as the caller likes, so a
//! multi-GB shard never has to exist in memory.
//!
//! Header: the JSON object (plus `__metadata__` when given) padded with spaces to a multiple of
//! 8 bytes, as the reference implementation does; data offsets follow list order with no gaps.

use super::dtype::Dtype;
use super::inventory::ExpectedTensor;
use super::reader::SINGLE_FILE;
use super::CheckpointError;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Writes one safetensors file tensor by tensor.
pub struct SafetensorsWriter {
    path: PathBuf,
    out: BufWriter<File>,
    tensors: Vec<ExpectedTensor>,
    /// Index of the tensor being written and bytes of it written so far.
    cur: usize,
    cur_written: u64,
}

/// The header bytes (length prefix excluded) for `tensors` in order.
pub fn header_bytes(tensors: &[ExpectedTensor], metadata: &BTreeMap<String, String>) -> Vec<u8> {
    let mut map = Map::new();
    if !metadata.is_empty() {
        map.insert("__metadata__".into(), json!(metadata));
    }
    let mut off = 0u64;
    for t in tensors {
        let end = off + t.bytes();
        map.insert(
            t.name.clone(),
            json!({"dtype": t.dtype.as_str(), "shape": t.shape, "data_offsets": [off, end]}),
        );
        off = end;
    }
    let mut bytes = serde_json::to_vec(&Value::Object(map)).expect("header serialises");
    while !bytes.len().is_multiple_of(8) {
        bytes.push(b' ');
    }
    bytes
}

impl SafetensorsWriter {
    /// Creates `path` and writes the header for `tensors`.
    pub fn create(
        path: &Path,
        tensors: Vec<ExpectedTensor>,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Self, CheckpointError> {
        let file = File::create(path).map_err(|e| CheckpointError::io(path, e))?;
        let mut out = BufWriter::with_capacity(1 << 22, file);
        let header = header_bytes(&tensors, metadata);
        out.write_all(&(header.len() as u64).to_le_bytes())
            .and_then(|_| out.write_all(&header))
            .map_err(|e| CheckpointError::io(path, e))?;
        let mut w = SafetensorsWriter {
            path: path.to_path_buf(),
            out,
            tensors,
            cur: 0,
            cur_written: 0,
        };
        w.skip_empty();
        Ok(w)
    }

    fn skip_empty(&mut self) {
        while self.cur < self.tensors.len() && self.cur_written == self.tensors[self.cur].bytes() {
            self.cur += 1;
            self.cur_written = 0;
        }
    }

    fn misuse(&self, what: String) -> CheckpointError {
        CheckpointError::io(
            &self.path,
            std::io::Error::new(std::io::ErrorKind::InvalidInput, what),
        )
    }

    /// The tensor whose bytes are expected next, if any.
    pub fn current(&self) -> Option<&ExpectedTensor> {
        self.tensors.get(self.cur)
    }

    /// Appends bytes of the current tensor `name`; a piece may not run past its end. Writing
    /// nothing to a tensor of zero bytes is accepted whenever it comes (those need no data, so
    /// the writer moves past them on its own).
    pub fn write(&mut self, name: &str, bytes: &[u8]) -> Result<(), CheckpointError> {
        if bytes.is_empty()
            && self
                .tensors
                .iter()
                .any(|t| t.name == name && t.bytes() == 0)
        {
            return Ok(());
        }
        let Some(t) = self.tensors.get(self.cur) else {
            return Err(self.misuse(format!(
                "tensor {name}: expected no more data, all tensors written"
            )));
        };
        if t.name != name {
            return Err(self.misuse(format!(
                "expected bytes of tensor {}, found bytes of {name}",
                t.name
            )));
        }
        let left = t.bytes() - self.cur_written;
        if bytes.len() as u64 > left {
            return Err(self.misuse(format!(
                "tensor {name}: expected at most {left} more bytes, found {}",
                bytes.len()
            )));
        }
        self.out
            .write_all(bytes)
            .map_err(|e| CheckpointError::io(&self.path, e))?;
        self.cur_written += bytes.len() as u64;
        self.skip_empty();
        Ok(())
    }

    /// Checks every tensor was written in full and flushes.
    pub fn finish(mut self) -> Result<PathBuf, CheckpointError> {
        if let Some(t) = self.tensors.get(self.cur) {
            return Err(self.misuse(format!(
                "tensor {}: expected {} bytes, found {}",
                t.name,
                t.bytes(),
                self.cur_written
            )));
        }
        self.out
            .flush()
            .map_err(|e| CheckpointError::io(&self.path, e))?;
        Ok(self.path)
    }
}

/// Writes a whole safetensors file from in-memory tensors (tests, small outputs).
pub fn write_safetensors(
    path: &Path,
    tensors: &[(&str, Dtype, &[usize], &[u8])],
) -> Result<(), CheckpointError> {
    let specs = tensors
        .iter()
        .map(|(n, d, s, _)| ExpectedTensor {
            name: n.to_string(),
            dtype: *d,
            shape: s.to_vec(),
        })
        .collect();
    let mut w = SafetensorsWriter::create(path, specs, &BTreeMap::new())?;
    for (n, _, _, b) in tensors {
        w.write(n, b)?;
    }
    w.finish().map(|_| ())
}

/// Shard index of every item of `sizes` bytes: contiguous, balanced by bytes, every one of the
/// `n` shards non-empty (needs `n <= sizes.len()`).
pub fn assign_shards(sizes: &[u64], n: usize) -> Vec<usize> {
    let total: u128 = sizes.iter().map(|&b| b as u128).sum::<u128>().max(1);
    let count = sizes.len();
    let (mut cum, mut prev) = (0u128, 0usize);
    let mut out = Vec::with_capacity(count);
    for (gi, &b) in sizes.iter().enumerate() {
        let b = b as u128;
        let want = ((cum + b / 2) * n as u128 / total) as usize;
        let lo = prev.max(n.saturating_sub(count - gi));
        let hi = if gi == 0 { 0 } else { (prev + 1).min(n - 1) };
        let s = want.clamp(lo, hi.max(lo));
        out.push(s);
        prev = s;
        cum += b;
    }
    out
}

/// The file name of shard `s` (0-based) of `n`: `model.safetensors` when `n == 1`.
pub fn shard_file_name(s: usize, n: usize) -> String {
    if n == 1 {
        SINGLE_FILE.to_string()
    } else {
        format!("model-{:05}-of-{:05}.safetensors", s + 1, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::header::parse_header;

    #[test]
    fn written_file_parses_back_with_padded_header() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.safetensors");
        let a = [1u8, 2, 3, 4, 5, 6];
        let b = 7.5f32.to_le_bytes();
        write_safetensors(
            &p,
            &[("a", Dtype::BF16, &[3], &a), ("b", Dtype::F32, &[], &b)],
        )
        .unwrap();
        let bytes = std::fs::read(&p).unwrap();
        let h = parse_header(&p, &bytes).unwrap();
        assert_eq!(h.data_start % 8, 0);
        assert_eq!(&bytes[h.entries[0].data_offsets.clone()], &a);
        assert_eq!(&bytes[h.entries[1].data_offsets.clone()], &b);
    }

    #[test]
    fn short_or_misordered_writes_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.safetensors");
        let spec = vec![ExpectedTensor {
            name: "a".into(),
            dtype: Dtype::F32,
            shape: vec![2],
        }];
        let mut w = SafetensorsWriter::create(&p, spec.clone(), &BTreeMap::new()).unwrap();
        assert!(w.write("b", &[0; 4]).is_err());
        w.write("a", &[0; 4]).unwrap();
        let msg = w.finish().unwrap_err().to_string();
        assert!(msg.contains("expected 8 bytes, found 4"), "{msg}");
    }

    #[test]
    fn shards_are_contiguous_balanced_and_never_empty() {
        let sizes = [100u64, 1, 1, 50, 3, 3, 3, 3, 200, 1];
        for n in [1, 2, 3, 7, sizes.len()] {
            let s = assign_shards(&sizes, n);
            assert_eq!(s[0], 0);
            assert_eq!(*s.last().unwrap(), n - 1, "n = {n}");
            assert!(
                s.windows(2).all(|w| w[1] == w[0] || w[1] == w[0] + 1),
                "n = {n}: {s:?}"
            );
        }
        assert_eq!(assign_shards(&[10, 10, 10, 10], 2), vec![0, 0, 1, 1]);
    }
}
