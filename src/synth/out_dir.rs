//! The directories synth writes into: the mark that makes a directory synth's own (and the
//! model synthetic in every report), and the rule that a directory holding a checkpoint synth
//! did not write is refused untouched, so a wrong `--out` can never delete a user's weights.

use super::planted;
use crate::checkpoint::reader::{INDEX_FILE, SINGLE_FILE};
use crate::checkpoint::CheckpointError;
use serde_json::json;
use std::path::Path;

/// The file `synth` writes first into every directory it fills: it marks the checkpoint as
/// synthetic (reports say so; see `sweep::model_marks`) and the directory as synth's own, so a
/// later synth run may replace its files ([`claim_out_dir`]).
pub const SYNTH_MARK_FILE: &str = "synth.json";

/// Makes `dir` ready for a synth run of `preset`: creates it; refuses it when it holds
/// checkpoint files (`config.json`, `*.safetensors`, the shard index) that synth did not write
/// (no [`SYNTH_MARK_FILE`], no `planted.json`), so a wrong `--out` can never delete a user's
/// downloaded weights; writes the mark (before any weight, so a run cut short still leaves a
/// directory synth may rewrite); removes what an earlier synth run left (`remove_stale`).
pub fn claim_out_dir(dir: &Path, preset: &str) -> Result<(), CheckpointError> {
    if dir.exists() && !dir.is_dir() {
        return Err(CheckpointError::SynthOption {
            field: "out",
            expected: "a directory (new, empty, or one synth wrote)".into(),
            found: format!("{}, which is a file", dir.display()),
        });
    }
    std::fs::create_dir_all(dir).map_err(|e| CheckpointError::io(dir, e))?;
    let ours = dir.join(SYNTH_MARK_FILE).is_file() || dir.join(planted::INFO_FILE).is_file();
    if !ours {
        let mut found = Vec::new();
        let rd = std::fs::read_dir(dir).map_err(|e| CheckpointError::io(dir, e))?;
        for entry in rd {
            let name = entry.map_err(|e| CheckpointError::io(dir, e))?.file_name();
            let name = name.to_string_lossy().into_owned();
            if name == "config.json" || name == INDEX_FILE || name.ends_with(".safetensors") {
                found.push(name);
            }
        }
        if !found.is_empty() {
            found.sort();
            let more = found.len().saturating_sub(3);
            found.truncate(3);
            return Err(CheckpointError::ForeignOutDir {
                dir: dir.to_path_buf(),
                files: if more > 0 {
                    format!("{} and {more} more", found.join(", "))
                } else {
                    found.join(", ")
                },
            });
        }
    }
    write_synth_mark(dir, preset)?;
    remove_stale(dir)
}

/// Writes [`SYNTH_MARK_FILE`] into `dir` for `preset`. [`claim_out_dir`] does it for every
/// synth run; the demo also does it for its own model cache (a directory name only needlescope
/// uses), so a cache an older version left half written, without the mark, is rebuilt.
pub fn write_synth_mark(dir: &Path, preset: &str) -> Result<(), CheckpointError> {
    let mark = json!({
        "synthetic": true,
        "written_by": format!("needlescope {} synth", env!("CARGO_PKG_VERSION")),
        "preset": preset,
    });
    let text = serde_json::to_string_pretty(&mark).expect("json") + "\n";
    let path = dir.join(SYNTH_MARK_FILE);
    std::fs::write(&path, text).map_err(|e| CheckpointError::io(&path, e))
}

/// Removes files an earlier synth run may have left: shards, the index, `config.json` (written
/// last, so a run that fails or is stopped leaves a directory that does not open as a model),
/// `planted.json` (a planted model's description, which would otherwise mark the new model as
/// planted) and a `tokenizer.json` that is byte for byte the built-in one synth copies (a
/// user's own tokenizer stays).
fn remove_stale(dir: &Path) -> Result<(), CheckpointError> {
    let rd = std::fs::read_dir(dir).map_err(|e| CheckpointError::io(dir, e))?;
    for entry in rd {
        let path = entry.map_err(|e| CheckpointError::io(dir, e))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let ours = match name {
            // The old model's config: written last by every run, so until the new run
            // finishes the directory has none and does not open as a model (the old config
            // beside new, half-written weights would).
            planted::INFO_FILE | "config.json" => true,
            "tokenizer.json" => {
                std::fs::read(&path).is_ok_and(|b| b == crate::tokenizer::builtin_json_bytes())
            }
            _ => false,
        };
        if ours && path.is_file() {
            std::fs::remove_file(&path).map_err(|e| CheckpointError::io(&path, e))?;
            continue;
        }
        let shard_like = name.len() == "model-00001-of-00001.safetensors".len()
            && name.starts_with("model-")
            && name.ends_with(".safetensors")
            && name[6..11].bytes().all(|b| b.is_ascii_digit())
            && &name[11..15] == "-of-"
            && name[15..20].bytes().all(|b| b.is_ascii_digit());
        if path.is_file() && (shard_like || name == SINGLE_FILE || name == INDEX_FILE) {
            std::fs::remove_file(&path).map_err(|e| CheckpointError::io(&path, e))?;
        }
    }
    Ok(())
}
