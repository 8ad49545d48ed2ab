//! `probe` checks a model directory's tokenizer and config against each other before building a
//! prompt: a tokenizer that is not DeepSeek-V4's (too few tokens, a special token missing), a
//! config whose `bos_token_id` is not the tokenizer's BOS, or a directory where tokenizer.json
//! should be is refused up front, naming the file, the token and the ids (never a late "try
//! another --seed", never a silent run with a moved needle).

use needlescope::tokenizer::{builtin_json_bytes, BOS};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_needlescope"))
}

/// One planted checkpoint shared by the tests of this file.
fn planted() -> &'static Path {
    static DIR: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("planted");
        let out = bin()
            .args(["synth", "--preset", "planted", "--format", "bf16", "--out"])
            .arg(&model)
            .output()
            .unwrap();
        assert!(out.status.success(), "synth planted: {out:?}");
        (dir, model)
    })
    .1
}

/// A model directory beside `tmp` sharing the planted weights (linked), with its own
/// config.json and tokenizer.json (`None`: no tokenizer.json, the built-in one is used).
fn model_dir(tmp: &Path, config: &serde_json::Value, tokenizer: Option<&[u8]>) -> PathBuf {
    let dir = tmp.join("model");
    std::fs::create_dir(&dir).unwrap();
    for f in ["model.safetensors", "planted.json"] {
        std::os::unix::fs::symlink(planted().join(f), dir.join(f)).unwrap();
    }
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    if let Some(t) = tokenizer {
        std::fs::write(dir.join("tokenizer.json"), t).unwrap();
    }
    dir
}

fn planted_config() -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(planted().join("config.json")).unwrap()).unwrap()
}

fn probe(model: &Path) -> Output {
    bin()
        .arg("probe")
        .arg("--model")
        .arg(model)
        .args(["--length", "1k", "--kv", "exact", "--device", "cpu"])
        .output()
        .unwrap()
}

/// Asserts a clean refusal (non-zero, no panic) whose stderr has every needle.
fn refused(out: Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected a refusal\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    for n in needles {
        assert!(stderr.contains(n), "stderr lacks {n:?}\n{stderr}");
    }
}

#[test]
fn the_planted_model_with_its_own_files_still_probes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = model_dir(tmp.path(), &planted_config(), Some(&builtin_json_bytes()));
    let out = probe(&dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_41_token_tokenizer_is_refused_up_front_naming_file_and_token() {
    let mut vocab = serde_json::Map::new();
    vocab.insert("[UNK]".into(), 0.into());
    for i in 1..41 {
        vocab.insert(format!("w{i}"), i.into());
    }
    let word_level = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    });
    let tmp = tempfile::tempdir().unwrap();
    let dir = model_dir(
        tmp.path(),
        &planted_config(),
        Some(word_level.to_string().as_bytes()),
    );
    let path = dir.join("tokenizer.json").display().to_string();
    let out = probe(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    refused(
        out,
        &[
            &path,
            "not a DeepSeek-V4 tokenizer",
            "BOS",
            "expected the single token id 0",
        ],
    );
    assert!(!stderr.contains("--seed"), "{stderr}");
}

#[test]
fn a_tokenizer_without_the_bos_added_token_is_refused() {
    let mut v: serde_json::Value = serde_json::from_slice(&builtin_json_bytes()).unwrap();
    v["added_tokens"]
        .as_array_mut()
        .unwrap()
        .retain(|t| t["content"] != BOS);
    let tmp = tempfile::tempdir().unwrap();
    let dir = model_dir(
        tmp.path(),
        &planted_config(),
        Some(&serde_json::to_vec(&v).unwrap()),
    );
    let path = dir.join("tokenizer.json").display().to_string();
    refused(
        probe(&dir),
        &[
            &path,
            &format!("BOS {BOS:?} encodes as"),
            "expected the single token id 0",
        ],
    );
}

#[test]
fn a_config_bos_token_id_other_than_the_tokenizers_is_refused_naming_both_files() {
    let mut cfg = planted_config();
    cfg["bos_token_id"] = serde_json::json!(5);
    let tmp = tempfile::tempdir().unwrap();
    // With the model's own tokenizer.json and with the built-in one.
    for own in [true, false] {
        let sub = tmp.path().join(own.to_string());
        std::fs::create_dir(&sub).unwrap();
        let bytes = builtin_json_bytes();
        let dir = model_dir(&sub, &cfg, own.then_some(&bytes[..]));
        let config = dir.join("config.json").display().to_string();
        let tokenizer = if own {
            dir.join("tokenizer.json").display().to_string()
        } else {
            "tokenizer builtin".to_string()
        };
        refused(
            probe(&dir),
            &[&config, &tokenizer, "is id 0", "`bos_token_id` is 5"],
        );
    }
}

#[test]
fn a_directory_named_tokenizer_json_or_config_json_is_reported_as_a_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = model_dir(tmp.path(), &planted_config(), None);
    let tok = dir.join("tokenizer.json");
    std::fs::create_dir(&tok).unwrap();
    refused(
        probe(&dir),
        &[&format!(
            "{} is a directory, expected a file",
            tok.display()
        )],
    );
    std::fs::remove_dir(&tok).unwrap();
    let cfg = dir.join("config.json");
    std::fs::remove_file(&cfg).unwrap();
    std::fs::create_dir(&cfg).unwrap();
    let out = probe(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    refused(
        out,
        &[&format!(
            "{} is a directory, expected a file",
            cfg.display()
        )],
    );
    assert!(!stderr.contains("config.json/config.json"), "{stderr}");
}
