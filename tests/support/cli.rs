//! Shared helpers of the `cli_*` integration tests: run the real binary, write synthetic
//! checkpoints with it, and edit safetensors files to make them corrupt in one precise way.

use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// What one run of the binary produced.
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Everything the run printed, for failure messages.
    pub fn dump(&self) -> String {
        format!(
            "exit {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.code, self.stdout, self.stderr
        )
    }

    /// Asserts exit 0.
    pub fn ok(self) -> Self {
        assert_eq!(self.code, Some(0), "expected success\n{}", self.dump());
        self
    }

    /// Asserts a non-zero exit without a panic, returns self.
    pub fn fails(self) -> Self {
        assert!(
            self.code.is_some() && self.code != Some(0),
            "expected failure\n{}",
            self.dump()
        );
        self.no_panic()
    }

    pub fn no_panic(self) -> Self {
        assert!(
            !self.stderr.contains("panicked") && !self.stdout.contains("panicked"),
            "the binary panicked\n{}",
            self.dump()
        );
        self
    }

    /// Asserts stderr contains every needle.
    pub fn stderr_has(self, needles: &[&str]) -> Self {
        for n in needles {
            assert!(
                self.stderr.contains(n),
                "stderr lacks {n:?}\n{}",
                self.dump()
            );
        }
        self
    }

    /// Asserts stdout contains every needle.
    pub fn stdout_has(self, needles: &[&str]) -> Self {
        for n in needles {
            assert!(
                self.stdout.contains(n),
                "stdout lacks {n:?}\n{}",
                self.dump()
            );
        }
        self
    }
}

pub fn bin() -> Command {
    Command::new(crate::needlescope_bin())
}

/// Runs the binary with `args`.
pub fn run<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Run {
    run_in(bin(), args)
}

/// Runs `cmd` (the binary, with whatever environment the caller set) with `args`.
pub fn run_in<S: AsRef<std::ffi::OsStr>>(mut cmd: Command, args: &[S]) -> Run {
    let out: Output = cmd
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("the needlescope binary runs");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `synth --preset tiny --format official --out DIR` plus `extra` flags.
pub fn synth_tiny(dir: &Path, extra: &[&str]) -> Run {
    synth_tiny_as(dir, "official", extra)
}

/// `synth --preset tiny --format FORMAT --out DIR` plus `extra` flags.
pub fn synth_tiny_as(dir: &Path, format: &str, extra: &[&str]) -> Run {
    let mut args: Vec<String> = ["synth", "--preset", "tiny", "--format", format, "--out"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(dir.display().to_string());
    args.extend(extra.iter().map(|s| s.to_string()));
    run(&args).ok()
}

/// `synth --preset v41-tiny --format bf16 --out DIR` (DeepSeek-V4.1 at toy size).
pub fn synth_v41_tiny(dir: &Path) -> Run {
    run(&[
        "synth".as_ref(),
        "--preset".as_ref(),
        "v41-tiny".as_ref(),
        "--format".as_ref(),
        "bf16".as_ref(),
        "--out".as_ref(),
        dir.as_os_str(),
    ])
    .ok()
}

/// `synth --preset planted --format bf16 --out DIR` (real vocabulary).
pub fn synth_planted(dir: &Path) -> Run {
    run(&[
        "synth".as_ref(),
        "--preset".as_ref(),
        "planted".as_ref(),
        "--format".as_ref(),
        "bf16".as_ref(),
        "--out".as_ref(),
        dir.as_os_str(),
    ])
    .ok()
}

/// `trace --device cpu --model DIR --tokens FILE --out FILE`.
pub fn trace_cpu(model: &Path, tokens: &Path, out: &Path) -> Run {
    run(&[
        "trace".as_ref(),
        "--device".as_ref(),
        "cpu".as_ref(),
        "--model".as_ref(),
        model.as_os_str(),
        "--tokens".as_ref(),
        tokens.as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
    ])
}

/// `inspect --model DIR`.
pub fn inspect_model(dir: &Path) -> Run {
    run(&[
        "inspect".to_string(),
        "--model".into(),
        dir.display().to_string(),
    ])
}

/// Writes the Flash config to `dir/flash.json`.
pub fn flash_config(dir: &Path) -> PathBuf {
    let path = dir.join("flash.json");
    std::fs::write(
        &path,
        needlescope::config::ModelConfig::flash().to_json_string(),
    )
    .unwrap();
    path
}

// ---------------------------------------------------------------------------------------------
// safetensors surgery
// ---------------------------------------------------------------------------------------------

/// A safetensors file split into its JSON header and its data section.
pub struct Raw {
    pub header: Map<String, Value>,
    pub data: Vec<u8>,
}

pub fn read_raw(path: &Path) -> Raw {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    Raw {
        header,
        data: bytes[8 + n..].to_vec(),
    }
}

/// Writes a header (as given, offsets untouched) and data section.
pub fn write_raw(path: &Path, raw: &Raw) {
    let mut json = serde_json::to_vec(&raw.header).unwrap();
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&json);
    out.extend_from_slice(&raw.data);
    std::fs::write(path, out).unwrap();
}

/// Edits the header of `path` in place (data section unchanged): a lying header.
pub fn edit_header(path: &Path, edit: impl FnOnce(&mut Map<String, Value>)) {
    let mut raw = read_raw(path);
    edit(&mut raw.header);
    write_raw(path, &raw);
}

/// One tensor of a consistent rebuild.
pub struct Entry {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

/// Rebuilds `path` consistently (offsets recomputed) after `edit` changed its tensor list.
pub fn rebuild(path: &Path, edit: impl FnOnce(&mut Vec<Entry>)) {
    let raw = read_raw(path);
    let mut entries: Vec<(usize, Entry)> = raw
        .header
        .iter()
        .filter(|(k, _)| k.as_str() != "__metadata__")
        .map(|(k, v)| {
            let off = v["data_offsets"].as_array().unwrap();
            let (a, b) = (
                off[0].as_u64().unwrap() as usize,
                off[1].as_u64().unwrap() as usize,
            );
            (
                a,
                Entry {
                    name: k.clone(),
                    dtype: v["dtype"].as_str().unwrap().to_string(),
                    shape: v["shape"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_u64().unwrap() as usize)
                        .collect(),
                    bytes: raw.data[a..b].to_vec(),
                },
            )
        })
        .collect();
    entries.sort_by_key(|(a, _)| *a);
    let mut list: Vec<Entry> = entries.into_iter().map(|(_, e)| e).collect();
    edit(&mut list);
    let mut header = Map::new();
    if let Some(m) = raw.header.get("__metadata__") {
        header.insert("__metadata__".into(), m.clone());
    }
    let mut data = Vec::new();
    for e in &list {
        let start = data.len();
        data.extend_from_slice(&e.bytes);
        header.insert(
            e.name.clone(),
            serde_json::json!({"dtype": e.dtype, "shape": e.shape, "data_offsets": [start, data.len()]}),
        );
    }
    write_raw(path, &Raw { header, data });
}

/// Tensor `name` of a safetensors file as `(shape, values)`, F32 as it is and I32, I64 and U8
/// converted to f32 (exact for the ids and flags the tests read). Panics naming a missing
/// tensor or another dtype.
pub fn tensor_f32(st: &safetensors::SafeTensors, name: &str) -> (Vec<usize>, Vec<f32>) {
    let v = st
        .tensor(name)
        .unwrap_or_else(|_| panic!("no tensor {name}"));
    let d = v.data();
    let vals = match v.dtype() {
        safetensors::Dtype::F32 => d
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        safetensors::Dtype::I32 => d
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f32)
            .collect(),
        safetensors::Dtype::I64 => d
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f32)
            .collect(),
        safetensors::Dtype::U8 => d.iter().map(|&b| b as f32).collect(),
        other => panic!("{name}: unexpected dtype {other:?}"),
    };
    (v.shape().to_vec(), vals)
}
