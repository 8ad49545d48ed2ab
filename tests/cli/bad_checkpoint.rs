//! Corrupt checkpoints through the binary: `inspect --model` on each kind of damage exits
//! non-zero without panicking, with a message naming the file and the tensor (or config field)
//! and saying what was expected and what was found. Each case starts from a fresh
//! `synth --preset tiny --format official` checkpoint.

use cli_support::{edit_header, inspect_model, rebuild, synth_tiny, Run};
use needlescope_testkit::cli as cli_support;
use serde_json::json;
use std::path::{Path, PathBuf};

/// A fresh tiny checkpoint in a temp dir (kept alive by the returned guard).
fn tiny(extra: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny");
    synth_tiny(&dir, extra);
    (tmp, dir)
}

fn broken(dir: &Path) -> Run {
    let r = inspect_model(dir).fails();
    assert_eq!(r.code, Some(1), "{}", r.dump());
    r
}

#[test]
fn missing_shard_names_the_index_the_shard_and_a_tensor() {
    let (_t, dir) = tiny(&["--shards", "3"]);
    let shard = dir.join("model-00002-of-00003.safetensors");
    std::fs::remove_file(&shard).unwrap();
    broken(&dir).stderr_has(&[
        "model.safetensors.index.json",
        "model-00002-of-00003.safetensors",
        "tensor layers.",
        "found no such file",
    ]);
}

#[test]
fn index_naming_an_absent_file_is_reported() {
    let (_t, dir) = tiny(&["--shards", "2"]);
    let index = dir.join("model.safetensors.index.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&index).unwrap()).unwrap();
    v["weight_map"]["layers.1.attn.wkv.weight"] = json!("model-00009-of-00009.safetensors");
    std::fs::write(&index, serde_json::to_vec(&v).unwrap()).unwrap();
    broken(&dir).stderr_has(&[
        "model.safetensors.index.json",
        "model-00009-of-00009.safetensors",
        "layers.1.attn.wkv.weight",
        "expected",
        "found",
    ]);
}

/// A tensor a shard holds but index.json does not list (a stale index) is read, as serving
/// engines read every tensor of the shard files, and said: `inspect` lists it, runs print a
/// note.
#[test]
fn a_tensor_missing_from_the_index_is_read_and_noted() {
    let (t, dir) = tiny(&["--shards", "2"]);
    let index = dir.join("model.safetensors.index.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&index).unwrap()).unwrap();
    let removed = v["weight_map"]
        .as_object_mut()
        .unwrap()
        .remove("layers.1.attn.wkv.weight");
    assert!(removed.is_some());
    std::fs::write(&index, serde_json::to_vec(&v).unwrap()).unwrap();
    let note = "1 tensor(s) in the shards are not listed in";
    inspect_model(&dir).ok().stdout_has(&[
        "inventory   OK",
        note,
        "(first: layers.1.attn.wkv.weight)",
    ]);
    let tokens = t.path().join("tokens.txt");
    std::fs::write(&tokens, "1 2 3 4 5 6 7 8 9 10 11 12").unwrap();
    let out = t.path().join("trace.safetensors");
    cli_support::run(&[
        "trace".as_ref(),
        "--model".as_ref(),
        dir.as_os_str(),
        "--tokens".as_ref(),
        tokens.as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
    ])
    .ok()
    .stderr_has(&[note, "model.safetensors.index.json's weight_map"]);
}

/// An index entry that points outside the checkpoint directory (a path, `..`, an absolute
/// file) is refused, naming the entry: the reader never opens files elsewhere.
#[test]
fn index_entries_outside_the_directory_are_refused() {
    for shard in [
        "../model-00001-of-00002.safetensors",
        "/etc/passwd",
        "sub/model-00001-of-00002.safetensors",
    ] {
        let (_t, dir) = tiny(&["--shards", "2"]);
        let index = dir.join("model.safetensors.index.json");
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&index).unwrap()).unwrap();
        v["weight_map"]["layers.1.attn.wkv.weight"] = json!(shard);
        std::fs::write(&index, serde_json::to_vec(&v).unwrap()).unwrap();
        broken(&dir).stderr_has(&[
            "model.safetensors.index.json",
            "layers.1.attn.wkv.weight",
            shard,
            "no directory part",
        ]);
    }
}

#[test]
fn truncated_shard_names_the_file_and_a_tensor() {
    let (_t, dir) = tiny(&[]);
    let file = dir.join("model.safetensors");
    let len = std::fs::metadata(&file).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.set_len(len - 100).unwrap();
    broken(&dir).stderr_has(&[
        "model.safetensors",
        "tensor ",
        "expected",
        "found",
        "truncated",
    ]);
}

#[test]
fn file_cut_inside_its_header_is_reported() {
    let (_t, dir) = tiny(&[]);
    let file = dir.join("model.safetensors");
    let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.set_len(100).unwrap();
    broken(&dir).stderr_has(&[
        "model.safetensors",
        "header length field says",
        "only 92 bytes follow",
        "truncated",
    ]);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(3)
        .unwrap();
    broken(&dir).stderr_has(&["model.safetensors", "3 bytes", "expected at least 8"]);
}

#[test]
fn lying_header_offsets_name_the_tensor_and_both_sizes() {
    let (_t, dir) = tiny(&[]);
    let file = dir.join("model.safetensors");
    edit_header(&file, |h| {
        let off = h["layers.0.attn_norm.weight"]["data_offsets"]
            .as_array()
            .unwrap()
            .clone();
        let (a, b) = (off[0].as_u64().unwrap(), off[1].as_u64().unwrap());
        h["layers.0.attn_norm.weight"]["data_offsets"] = json!([a, b - 2]);
    });
    broken(&dir).stderr_has(&[
        "model.safetensors",
        "layers.0.attn_norm.weight",
        "expected 128 bytes",
        "hold 126",
    ]);
}

#[test]
fn lying_header_shape_is_caught_against_the_offsets() {
    let (_t, dir) = tiny(&[]);
    let file = dir.join("model.safetensors");
    edit_header(&file, |h| {
        h["layers.0.ffn_norm.weight"]["shape"] = json!([65])
    });
    broken(&dir).stderr_has(&[
        "model.safetensors",
        "layers.0.ffn_norm.weight",
        "[65]",
        "expected 130 bytes",
        "hold 128",
    ]);
}

#[test]
fn wrong_dtype_is_a_mismatch_naming_file_tensor_expected_and_found() {
    let (_t, dir) = tiny(&[]);
    let file = dir.join("model.safetensors");
    rebuild(&file, |list| {
        let e = list
            .iter_mut()
            .find(|e| e.name == "layers.0.attn_norm.weight")
            .unwrap();
        e.dtype = "F32".into();
        e.shape = vec![32];
    });
    let r = broken(&dir).stderr_has(&[
        "layers.0.attn_norm.weight",
        "model.safetensors",
        "expected BF16 [64], found F32 [32]",
        "1 mismatched",
    ]);
    assert!(r.stdout.contains("MISMATCH"), "{}", r.dump());
}

#[test]
fn wrong_shape_is_a_mismatch_naming_file_tensor_expected_and_found() {
    let (_t, dir) = tiny(&[]);
    let file = dir.join("model.safetensors");
    rebuild(&file, |list| {
        let e = list
            .iter_mut()
            .find(|e| e.name == "layers.2.ffn_norm.weight")
            .unwrap();
        e.shape = vec![8, 8];
    });
    broken(&dir).stderr_has(&[
        "layers.2.ffn_norm.weight",
        "model.safetensors",
        "expected BF16 [64], found BF16 [8, 8]",
    ]);
}

#[test]
fn missing_scale_is_named_with_its_expected_dtype_and_shape() {
    let (_t, dir) = tiny(&[]);
    let file = dir.join("model.safetensors");
    rebuild(&file, |list| {
        list.retain(|e| e.name != "layers.0.attn.wq_a.scale")
    });
    let r = broken(&dir).stderr_has(&[
        dir.to_str().unwrap(),
        "1 missing",
        "layers.0.attn.wq_a.scale: expected F8_E8M0",
        "found no such tensor",
    ]);
    assert!(
        r.stdout.contains("missing    layers.0.attn.wq_a.scale"),
        "{}",
        r.dump()
    );
}

#[test]
fn extra_tensor_is_named_with_its_file() {
    let (_t, dir) = tiny(&[]);
    let file = dir.join("model.safetensors");
    rebuild(&file, |list| {
        list.push(cli_support::Entry {
            name: "layers.0.attn.surprise".into(),
            dtype: "F32".into(),
            shape: vec![2],
            bytes: vec![0; 8],
        })
    });
    broken(&dir).stderr_has(&[
        "1 extra",
        "layers.0.attn.surprise in",
        "model.safetensors",
        "found F32 [2]",
    ]);
}

#[test]
fn unknown_dtype_names_file_tensor_and_the_dtype() {
    let (_t, dir) = tiny(&[]);
    let file = dir.join("model.safetensors");
    edit_header(&file, |h| {
        h["layers.1.attn.wkv.scale"]["dtype"] = json!("F9")
    });
    broken(&dir).stderr_has(&[
        "model.safetensors",
        "layers.1.attn.wkv.scale",
        "\"F9\"",
        "expected",
    ]);
}

#[test]
fn header_that_is_not_json_is_reported() {
    let (_t, dir) = tiny(&[]);
    let file = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[8] = b'#';
    std::fs::write(&file, bytes).unwrap();
    broken(&dir).stderr_has(&["model.safetensors", "JSON"]);
}

#[test]
fn invalid_config_value_names_the_field_found_and_expected() {
    let (_t, dir) = tiny(&[]);
    let cfg = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
    v["compress_ratios"][1] = json!(16);
    std::fs::write(&cfg, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    broken(&dir).stderr_has(&[
        "config.json",
        "compress_ratios[1]",
        "16",
        "one of 0, 4, 128",
    ]);
}

#[test]
fn special_token_id_outside_the_vocabulary_is_named() {
    let (_t, dir) = tiny(&[]);
    let cfg = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
    v["eos_token_id"] = json!(999_999);
    std::fs::write(&cfg, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    broken(&dir).stderr_has(&["config.json", "eos_token_id", "999999", "vocab_size (4096)"]);
}

#[test]
fn missing_config_is_named() {
    let (_t, dir) = tiny(&[]);
    std::fs::remove_file(dir.join("config.json")).unwrap();
    broken(&dir).stderr_has(&["config.json"]);
}

/// A model directory that does not exist: `inspect` says so; `sweep` (which reads the config
/// first) names the config.json the directory would hold, and says the cause once.
#[test]
fn missing_model_directory_is_named_with_the_cause_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("nonexistent");
    broken(&dir).stderr_has(&["nonexistent", "does not exist"]);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_needlescope"))
        .args(["sweep", "--model"])
        .arg(&dir)
        .arg("--out")
        .arg(tmp.path().join("out"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("nonexistent/config.json"), "{stderr}");
    assert_eq!(
        stderr.matches("No such file or directory").count(),
        1,
        "{stderr}"
    );
}

#[test]
fn model_path_that_is_a_file_is_explained() {
    let (_t, dir) = tiny(&[]);
    broken(&dir.join("model.safetensors")).stderr_has(&["model.safetensors", "directory"]);
    // Every command that opens a model says the same (it said "Not a directory (os error 20)"
    // about a config.json under the file).
    let file = dir.join("model.safetensors");
    let tokens = dir.join("ids.txt");
    std::fs::write(&tokens, "5 6 7").unwrap();
    let (f, t) = (file.to_str().unwrap(), tokens.to_str().unwrap());
    for args in [
        vec![
            "trace",
            "--model",
            f,
            "--tokens",
            t,
            "--out",
            "/tmp/needlescope-never-written.st",
        ],
        vec!["probe", "--model", f, "--length", "300"],
        vec!["bench", "--model", f, "--lengths", "300"],
    ] {
        let r = cli_support::run(&args).fails();
        assert_eq!(r.code, Some(1), "{}", r.dump());
        r.stderr_has(&["model.safetensors: is a file, expected a directory"]);
    }
}

/// A model without a CSA layer has no indexer to probe: `probe` and `sweep` refuse it up front,
/// naming compress_ratios (every verdict would otherwise be a vacuous "trivially kept").
#[test]
fn probe_and_sweep_refuse_a_model_without_a_csa_layer() {
    // synth says so up front (it still writes: bench and inspect take such a model).
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny");
    // The planted preset says so too.
    for (preset, out) in [
        ("planted", tmp.path().join("planted")),
        ("tiny", dir.clone()),
    ] {
        let synth = std::process::Command::new(env!("CARGO_BIN_EXE_needlescope"))
            .args(["synth", "--preset", preset, "--layers", "1", "--out"])
            .arg(&out)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&synth.stderr);
        assert!(synth.status.success(), "{said}");
        assert!(
            said.contains("note: --layers 1 keeps [swa]: no CSA layer, so probe and sweep will refuse this model (trace, bench and inspect take it")
                && said.contains("--layers 2 or more keeps one"),
            "{preset}: {said}"
        );
    }
    for args in [
        vec!["probe", "--length", "300"],
        vec!["sweep", "--lengths", "300", "--out"],
    ] {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_needlescope"));
        cmd.args(&args[..1])
            .arg("--model")
            .arg(&dir)
            .args(&args[1..]);
        if args[0] == "sweep" {
            cmd.arg(tmp.path().join("sweep"));
        }
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains("compress_ratios") && stderr.contains("no CSA layer"),
            "{args:?}: {stderr}"
        );
    }
    assert!(!tmp.path().join("sweep").exists(), "nothing written");
}

/// A bf16 planted checkpoint whose tensor `name` is all NaN.
fn planted_with_nan(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("planted");
    cli_support::synth_planted(&dir);
    rebuild(&dir.join("model.safetensors"), |entries| {
        let e = entries.iter_mut().find(|e| e.name == name).unwrap();
        assert_eq!(e.dtype, "BF16");
        for pair in e.bytes.chunks_mut(2) {
            pair.copy_from_slice(&0x7FC0u16.to_le_bytes()); // bf16 NaN
        }
    });
    (tmp, dir)
}

/// NaN in the output head leaves the indexer intact but the logits NaN: probe still ranks the
/// needle without generating, and refuses to pick (and judge) answer tokens from NaN logits
/// instead of taking token 0 and calling the answer wrong.
#[test]
fn nan_logits_fail_the_answer_instead_of_judging_it_wrong() {
    let (_tmp, dir) = planted_with_nan("head.weight");
    let d = dir.to_str().unwrap();
    let probe = |generate: &str| {
        cli_support::run(&[
            "probe",
            "--model",
            d,
            "--device",
            "cpu",
            "--length",
            "512",
            "--topk",
            "64",
            "--generate",
            generate,
        ])
    };
    probe("0").ok().stdout_has(&["conclusion"]);
    let r = probe("2").fails().stderr_has(&[
        "cannot judge the answer",
        "position 511",
        "NaN or infinite",
    ]);
    assert_eq!(r.code, Some(1), "{}", r.dump());
}

/// NaN weights (an intact file, a damaged value) make every indexer score NaN: probe fails
/// naming the layer, position and profile instead of printing ranks and a verdict.
#[test]
fn nan_weights_fail_the_probe_instead_of_giving_a_verdict() {
    let (_tmp, dir) = planted_with_nan("layers.1.attn.indexer.compressor.wkv.weight");
    let r = cli_support::run(&[
        "probe",
        "--model",
        dir.to_str().unwrap(),
        "--device",
        "cpu",
        "--length",
        "1k",
        "--compare",
        "bf16",
    ])
    .fails()
    .stderr_has(&["layer 1", "indexer scores", "NaN", "not finite"]);
    assert_eq!(r.code, Some(1), "{}", r.dump());
    assert!(!r.stdout.contains("conclusion"), "{}", r.dump());
}

/// A hash-routing table naming an expert that does not exist: the error gives the value and
/// where it is (it said only "found one outside").
#[test]
fn tid2eid_out_of_range_names_the_value_and_its_place() {
    let (tmp, dir) = tiny(&[]);
    let name = "layers.1.ffn.gate.tid2eid";
    rebuild(&dir.join("model.safetensors"), |entries| {
        let e = entries.iter_mut().find(|e| e.name == name).unwrap();
        assert_eq!(e.dtype, "I64");
        let slots = e.shape[1];
        let at = 7 * slots + slots - 1;
        e.bytes[at * 8..at * 8 + 8].copy_from_slice(&999i64.to_le_bytes());
    });
    let tokens = tmp.path().join("ids.txt");
    std::fs::write(&tokens, "5 6 7 8").unwrap();
    let r = cli_support::trace_cpu(&dir, &tokens, &tmp.path().join("t.st")).fails();
    assert_eq!(r.code, Some(1), "{}", r.dump());
    let slots = 2; // tiny's num_experts_per_tok
    r.stderr_has(&[name, &format!("found 999 at [token 7, slot {}]", slots - 1)]);
}

/// A single-file checkpoint with other weight files beside it and no index: which one is the
/// model is ambiguous, so it is refused naming the extra files (the extras were ignored).
#[test]
fn extra_safetensors_beside_a_single_file_checkpoint_are_refused() {
    let (_t, dir) = tiny(&[]);
    std::fs::copy(
        dir.join("model.safetensors"),
        dir.join("old-copy.safetensors"),
    )
    .unwrap();
    broken(&dir).stderr_has(&[
        "model.safetensors",
        "old-copy.safetensors",
        "no model.safetensors.index.json",
    ]);
}

/// Weights the config has no place for (a layer past `num_hidden_layers`, an indexer on a layer
/// the config calls sliding-window) mean config.json does not describe the checkpoint: every
/// command that runs the model refuses before loading, naming config.json, the tensor, its
/// file and the field, instead of silently running a shorter or different model. A tensor of
/// a kind the forward never reads is ignored with one note.
#[test]
fn weights_the_config_does_not_describe_are_refused_by_every_run() {
    let (tmp, dir) = tiny(&[]);
    let tokens = tmp.path().join("tokens.txt");
    std::fs::write(&tokens, "1 2 3 4 5 6 7 8 9 10").unwrap();
    let runs = |dir: &Path| -> Vec<Run> {
        let d = dir.to_str().unwrap();
        let out = tmp.path().join("t.safetensors");
        let sweep = tmp.path().join("sweep");
        [
            vec!["trace", "--device", "cpu", "--model", d, "--tokens"]
                .into_iter()
                .map(String::from)
                .chain([tokens.display().to_string(), "--out".into()])
                .chain([out.display().to_string()])
                .collect::<Vec<_>>(),
            ["bench", "--device", "cpu", "--model", d, "--lengths", "64"]
                .map(String::from)
                .to_vec(),
            ["sweep", "--device", "cpu", "--model", d, "--lengths", "300"]
                .map(String::from)
                .into_iter()
                .chain(["--out".into(), sweep.display().to_string()])
                .collect(),
        ]
        .iter()
        .map(|a| cli_support::run(a))
        .collect()
    };
    let edit_config = |edit: &dyn Fn(&mut serde_json::Value)| {
        let path = dir.join("config.json");
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        edit(&mut v);
        std::fs::write(&path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    };
    let original = std::fs::read(dir.join("config.json")).unwrap();

    // One layer fewer in the config than in the weights.
    edit_config(&|v| {
        let n = v["num_hidden_layers"].as_u64().unwrap() - 1;
        v["num_hidden_layers"] = json!(n);
    });
    let last = serde_json::from_slice::<serde_json::Value>(&original).unwrap()["num_hidden_layers"]
        .as_u64()
        .unwrap()
        - 1;
    for r in runs(&dir) {
        assert_eq!(r.code, Some(1), "{}", r.dump());
        r.stderr_has(&[
            "config.json: does not describe the checkpoint",
            &format!("model.safetensors holds layers.{last}."),
            &format!("num_hidden_layers is {last}"),
            "more such tensors",
            "inspect --model",
        ]);
    }
    assert!(!tmp.path().join("sweep").exists(), "nothing written");

    // A CSA layer (with its indexer and compressor) called sliding-window by the config.
    std::fs::write(dir.join("config.json"), &original).unwrap();
    let csa = serde_json::from_slice::<serde_json::Value>(&original).unwrap()["compress_ratios"]
        .as_array()
        .unwrap()
        .iter()
        .position(|r| r == 4)
        .expect("tiny has a CSA layer");
    edit_config(&|v| v["compress_ratios"][csa] = json!(0));
    for r in runs(&dir) {
        assert_eq!(r.code, Some(1), "{}", r.dump());
        r.stderr_has(&[
            &format!("holds layers.{csa}.attn."),
            &format!("compress_ratios[{csa}] is 0 (a SWA layer)"),
        ]);
    }

    // A tensor of a kind nothing reads: ignored, with one note.
    std::fs::write(dir.join("config.json"), &original).unwrap();
    rebuild(&dir.join("model.safetensors"), |list| {
        list.push(cli_support::Entry {
            name: "layers.0.attn.surprise".into(),
            dtype: "F32".into(),
            shape: vec![2],
            bytes: vec![0; 8],
        })
    });
    let r = runs(&dir).remove(0).ok();
    r.stderr_has(&[
        "note: 1 tensor(s) of kinds the forward never reads are ignored (first: \
                    layers.0.attn.surprise)",
    ]);
}

/// A NaN scale code (E8M0 0xFF, e4m3 0x7F / 0xFF, a non-finite NVFP4 global scale) would make
/// its block of weights NaN; the run refuses it at load, naming the file, tensor, position and
/// code, instead of failing later on NaN scores.
#[test]
fn nan_scale_codes_are_refused_naming_the_tensor_and_position() {
    let tmp = tempfile::tempdir().unwrap();
    let tokens = tmp.path().join("tokens.txt");
    std::fs::write(&tokens, "1 2 3 4 5 6 7 8 9 10").unwrap();
    let trace = |dir: &Path| cli_support::trace_cpu(dir, &tokens, &tmp.path().join("t.st"));
    /// (format, tensor, byte offset, bytes written, expected words)
    type Case<'a> = (&'a str, &'a str, usize, &'a [u8], &'a [&'a str]);
    let cases: [Case; 4] = [
        (
            "official",
            "layers.1.attn.wq_b.scale",
            1,
            &[0xFF],
            &["F8_E8M0", "[1, 0]", "0xFF"],
        ),
        (
            "official",
            "layers.2.ffn.experts.3.w2.scale",
            5,
            &[0xFF],
            &["F8_E8M0", "[5, 0]", "0xFF"],
        ),
        (
            "nvfp4",
            "layers.1.ffn.experts.0.w1.weight_scale",
            6,
            &[0x7F],
            &["F8_E4M3", "[1, 2]", "0x7F"],
        ),
        (
            "nvfp4",
            "layers.3.ffn.experts.1.w3.weight_scale_2",
            0,
            &[0x00, 0x00, 0xC0, 0x7F],
            &["F32", "NaN"],
        ),
    ];
    for (format, tensor, at, code, words) in cases {
        let dir = tmp.path().join(format!("m-{tensor}"));
        cli_support::synth_tiny_as(&dir, format, &[]);
        trace(&dir).ok();
        rebuild(&dir.join("model.safetensors"), |entries| {
            let e = entries.iter_mut().find(|e| e.name == tensor).unwrap();
            e.bytes[at..at + code.len()].copy_from_slice(code);
        });
        let r = trace(&dir).fails();
        assert_eq!(r.code, Some(1), "{}", r.dump());
        r.stderr_has(&["model.safetensors", tensor, "expected a finite scale"])
            .stderr_has(words);
    }
}
