//! One safetensors shard's header, parsed by hand so every inconsistency gets a precise error.
//!
//! Layout: `u64` little-endian header length `N`, then `N` bytes of JSON (an object mapping
//! tensor names to `{"dtype", "shape", "data_offsets": [begin, end]}` plus an optional
//! `"__metadata__"` object of strings (or null), possibly padded with trailing spaces), then the data
//! section. `data_offsets` are relative to the start of the data section; [`HeaderEntry`]
//! stores them converted to absolute file offsets. Checks: the length field fits the file,
//! the header is a JSON object, each entry has exactly the three fields with the right
//! types, the dtype is known, `begin <= end <= data section length`, and `end - begin` equals
//! `numel(shape) * dtype size` (computed with overflow checks), no name appears twice, and the
//! tensors tile the data section exactly (no hole, no overlap, nothing after the last), as the
//! safetensors crate requires; an overlap would hand one tensor another's bytes.

use super::dtype::Dtype;
use super::CheckpointError;
use serde_json::Value;
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;

/// One tensor entry of a header, offsets absolute in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderEntry {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data_offsets: Range<usize>,
}

/// A parsed header: its entries in file order of appearance and the `__metadata__` strings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// Absolute offset of the data section (8 + header length).
    pub data_start: usize,
    pub entries: Vec<HeaderEntry>,
    pub metadata: BTreeMap<String, String>,
}

/// Parses the header of a whole safetensors file held in `bytes`; `file` names it in errors.
pub fn parse_header(file: &Path, bytes: &[u8]) -> Result<Header, CheckpointError> {
    let file_len = bytes.len() as u64;
    if bytes.len() < 8 {
        return Err(CheckpointError::TooShort {
            file: file.to_path_buf(),
            file_len,
        });
    }
    let header_len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    let available = file_len - 8;
    if header_len > available {
        return Err(CheckpointError::HeaderLength {
            file: file.to_path_buf(),
            header_len,
            available,
            file_len,
        });
    }
    let data_start = 8 + header_len as usize;
    let json: Value = serde_json::from_slice(&bytes[8..data_start]).map_err(|source| {
        CheckpointError::HeaderJson {
            file: file.to_path_buf(),
            source,
        }
    })?;
    let data_len = (bytes.len() - data_start) as u64;
    let Value::Object(map) = json else {
        return Err(entry_err(
            file,
            "(header)",
            "(root)",
            "a JSON object",
            kind(&json),
        ));
    };
    if let Some(name) = repeated_key(&bytes[8..data_start]) {
        return Err(CheckpointError::NameRepeatedInHeader {
            file: file.to_path_buf(),
            tensor: name,
        });
    }
    let mut header = Header {
        data_start,
        ..Header::default()
    };
    for (name, v) in map {
        if name == "__metadata__" {
            header.metadata = parse_metadata(file, &v)?;
            continue;
        }
        let (dtype, shape, start, end) = parse_entry(file, &name, &v)?;
        if start > end || end > data_len {
            return Err(CheckpointError::OffsetsOutOfRange {
                file: file.to_path_buf(),
                tensor: name,
                start,
                end,
                data_len,
            });
        }
        let expected = dtype.byte_len(&shape).map(|b| b as u64);
        if expected != Some(end - start) {
            return Err(CheckpointError::OffsetsSize {
                file: file.to_path_buf(),
                tensor: name,
                dtype,
                shape,
                start,
                end,
                expected: expected.unwrap_or(u64::MAX),
                found: end - start,
            });
        }
        header.entries.push(HeaderEntry {
            name,
            dtype,
            shape,
            data_offsets: data_start + start as usize..data_start + end as usize,
        });
    }
    header
        .entries
        .sort_by_key(|e| (e.data_offsets.start, e.data_offsets.end));
    check_tiling(file, &header, bytes.len())?;
    Ok(header)
}

/// The tensors, in offset order, must tile the data section exactly: each starts where the
/// previous ended (the first at 0) and the last ends at the end of the file, as the safetensors
/// crate requires (`Metadata::validate`). An overlap would hand one tensor another's bytes.
fn check_tiling(file: &Path, header: &Header, file_len: usize) -> Result<(), CheckpointError> {
    let relative = |offset: usize| (offset - header.data_start) as u64;
    let mut expected_start = header.data_start;
    let mut previous = "the start of the data section".to_string();
    for e in &header.entries {
        if e.data_offsets.start != expected_start {
            return Err(CheckpointError::OffsetsNotContiguous {
                file: file.to_path_buf(),
                tensor: e.name.clone(),
                start: relative(e.data_offsets.start),
                expected: relative(expected_start),
                previous,
            });
        }
        expected_start = e.data_offsets.end;
        previous = format!("tensor {}", e.name);
    }
    if expected_start != file_len {
        return Err(CheckpointError::TrailingData {
            file: file.to_path_buf(),
            end: relative(expected_start),
            data_len: relative(file_len),
            last: previous,
        });
    }
    Ok(())
}

/// The first key that appears twice at the top level of the header's JSON (a JSON object
/// parsed into a map keeps only the last of a repeated key, silently). `None` also when the
/// bytes are not an object; the caller has already parsed them and reports that itself.
fn repeated_key(json: &[u8]) -> Option<String> {
    struct FirstRepeat(Option<String>);
    impl<'de> serde::Deserialize<'de> for FirstRepeat {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Keys;
            impl<'de> serde::de::Visitor<'de> for Keys {
                type Value = FirstRepeat;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a JSON object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(
                    self,
                    mut map: A,
                ) -> Result<FirstRepeat, A::Error> {
                    let mut seen = std::collections::HashSet::new();
                    let mut repeat = None;
                    while let Some(key) = map.next_key::<String>()? {
                        map.next_value::<serde::de::IgnoredAny>()?;
                        if repeat.is_none() && !seen.insert(key.clone()) {
                            repeat = Some(key);
                        }
                    }
                    Ok(FirstRepeat(repeat))
                }
            }
            d.deserialize_map(Keys)
        }
    }
    serde_json::from_slice::<FirstRepeat>(json).ok()?.0
}

fn entry_err(
    file: &Path,
    tensor: &str,
    field: &'static str,
    expected: &str,
    found: String,
) -> CheckpointError {
    CheckpointError::HeaderEntry {
        file: file.to_path_buf(),
        tensor: tensor.to_string(),
        field,
        expected: expected.to_string(),
        found,
    }
}

/// A short description of a JSON value for messages (`a string "x"`, `an array of 3`, ...).
fn kind(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("the string {s:?}"),
        Value::Array(a) => format!("an array of {} items", a.len()),
        Value::Object(o) => format!("an object with {} keys", o.len()),
    }
}

fn parse_metadata(file: &Path, v: &Value) -> Result<BTreeMap<String, String>, CheckpointError> {
    if v.is_null() {
        // The safetensors crate writes and accepts `"__metadata__": null`.
        return Ok(BTreeMap::new());
    }
    let Value::Object(m) = v else {
        return Err(entry_err(
            file,
            "__metadata__",
            "__metadata__",
            "an object of strings",
            kind(v),
        ));
    };
    let mut out = BTreeMap::new();
    for (k, val) in m {
        match val {
            Value::String(s) => {
                out.insert(k.clone(), s.clone());
            }
            other => {
                return Err(entry_err(
                    file,
                    "__metadata__",
                    "__metadata__",
                    "string values",
                    format!("{k} = {}", kind(other)),
                ))
            }
        }
    }
    Ok(out)
}

fn parse_entry(
    file: &Path,
    name: &str,
    v: &Value,
) -> Result<(Dtype, Vec<usize>, u64, u64), CheckpointError> {
    let Value::Object(m) = v else {
        return Err(entry_err(
            file,
            name,
            "(entry)",
            "an object with dtype, shape, data_offsets",
            kind(v),
        ));
    };
    let dtype_str = match m.get("dtype") {
        Some(Value::String(s)) => s.as_str(),
        Some(other) => return Err(entry_err(file, name, "dtype", "a string", kind(other))),
        None => return Err(entry_err(file, name, "dtype", "present", "missing".into())),
    };
    let dtype = Dtype::parse(dtype_str).ok_or_else(|| CheckpointError::UnknownDtype {
        file: file.to_path_buf(),
        tensor: name.to_string(),
        found: dtype_str.to_string(),
    })?;
    let shape = uint_array(file, name, "shape", m.get("shape"), None)?;
    let shape = shape
        .into_iter()
        .map(|d| {
            usize::try_from(d).map_err(|_| {
                entry_err(
                    file,
                    name,
                    "shape",
                    "dimensions that fit in usize",
                    d.to_string(),
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let offs = uint_array(file, name, "data_offsets", m.get("data_offsets"), Some(2))?;
    Ok((dtype, shape, offs[0], offs[1]))
}

/// Reads an array of non-negative integers (of length `len` if given).
fn uint_array(
    file: &Path,
    name: &str,
    field: &'static str,
    v: Option<&Value>,
    len: Option<usize>,
) -> Result<Vec<u64>, CheckpointError> {
    let expected = match len {
        Some(n) => format!("an array of {n} non-negative integers"),
        None => "an array of non-negative integers".to_string(),
    };
    let Some(v) = v else {
        return Err(entry_err(file, name, field, "present", "missing".into()));
    };
    let Value::Array(a) = v else {
        return Err(entry_err(file, name, field, &expected, kind(v)));
    };
    if len.is_some_and(|n| n != a.len()) {
        return Err(entry_err(file, name, field, &expected, kind(v)));
    }
    a.iter()
        .map(|x| {
            x.as_u64().ok_or_else(|| {
                entry_err(file, name, field, &expected, format!("an item {}", kind(x)))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with_header(json: &str, data_len: usize) -> Vec<u8> {
        let mut b = (json.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(json.as_bytes());
        b.resize(b.len() + data_len, 0);
        b
    }

    #[test]
    fn offsets_become_absolute_and_metadata_is_kept() {
        let json = r#"{"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2],"data_offsets":[4,8]},"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}"#;
        let bytes = file_with_header(json, 8);
        let h = parse_header(Path::new("x.safetensors"), &bytes).unwrap();
        let start = 8 + json.len();
        assert_eq!(h.data_start, start);
        assert_eq!(h.entries[0].name, "a");
        assert_eq!(h.entries[0].data_offsets, start..start + 4);
        assert_eq!(h.entries[1].data_offsets, start + 4..start + 8);
        assert_eq!(h.metadata["format"], "pt");
    }

    #[test]
    fn size_not_matching_dtype_times_shape_is_rejected() {
        let json = r#"{"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,4]}}"#;
        let msg = parse_header(Path::new("s.safetensors"), &file_with_header(json, 4))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("s.safetensors") && msg.contains("tensor w"),
            "{msg}"
        );
        assert!(
            msg.contains("expected 6 bytes") && msg.contains("hold 4"),
            "{msg}"
        );
    }

    #[test]
    fn missing_and_mistyped_fields_name_the_field() {
        let json = r#"{"w":{"dtype":"BF16","data_offsets":[0,4]}}"#;
        let msg = parse_header(Path::new("s"), &file_with_header(json, 4))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("`shape`") && msg.contains("missing"), "{msg}");
        let json = r#"{"w":{"dtype":"BF16","shape":[2],"data_offsets":[0,-4]}}"#;
        let msg = parse_header(Path::new("s"), &file_with_header(json, 4))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("`data_offsets`") && msg.contains("-4"),
            "{msg}"
        );
    }

    #[test]
    fn hostile_shape_overflow_is_an_error_not_a_panic() {
        let json = r#"{"w":{"dtype":"I64","shape":[18446744073709551615,4],"data_offsets":[0,4]}}"#;
        let msg = parse_header(Path::new("s"), &file_with_header(json, 4))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("tensor w"), "{msg}");
    }
}
