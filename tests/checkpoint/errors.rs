//! Bad checkpoints fail with an error that names the file, the tensor or field, and what was
//! expected versus found. Each case corrupts a tiny synthetic checkpoint in a temp directory.

use needlescope::checkpoint::writer::write_safetensors;
use needlescope::checkpoint::{audit, Checkpoint, CheckpointError, Dtype, WeightFormat};
use needlescope::synth::{synth, Preset, SynthOptions};
use std::path::Path;

fn tiny(dir: &Path, format: WeightFormat, shards: usize) {
    let mut o = SynthOptions::new(Preset::Tiny, format, dir);
    o.shards = shards;
    synth(&o, None).unwrap();
}

fn open_err(dir: &Path) -> (CheckpointError, String) {
    match Checkpoint::open(dir) {
        Ok(_) => panic!("{} opened although it is corrupt", dir.display()),
        Err(e) => {
            let msg = e.to_string();
            (e, msg)
        }
    }
}

fn assert_mentions(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "message lacks {p:?}: {msg}");
    }
}

/// Rewrites the single-file checkpoint in `dir`, passing every tensor through `edit`
/// (return `None` to drop it).
fn rewrite(
    dir: &Path,
    edit: impl Fn(&str, Dtype, &[usize], &[u8]) -> Option<(Dtype, Vec<usize>, Vec<u8>)>,
) {
    let owned: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = {
        let ckpt = Checkpoint::open(dir).unwrap();
        ckpt.names()
            .filter_map(|n| {
                let t = ckpt.info(n).unwrap();
                let bytes = ckpt.raw_bytes(n).unwrap();
                edit(n, t.dtype, &t.shape, bytes).map(|(d, s, b)| (n.to_string(), d, s, b))
            })
            .collect()
    };
    let refs: Vec<(&str, Dtype, &[usize], &[u8])> = owned
        .iter()
        .map(|(n, d, s, b)| (n.as_str(), *d, s.as_slice(), b.as_slice()))
        .collect();
    write_safetensors(&dir.join("model.safetensors"), &refs).unwrap();
}

fn edit_index(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("model.safetensors.index.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, v.to_string()).unwrap();
}

#[test]
fn missing_shard_file_names_index_shard_and_a_tensor() {
    let d = tempfile::tempdir().unwrap();
    tiny(d.path(), WeightFormat::Official, 3);
    std::fs::remove_file(d.path().join("model-00002-of-00003.safetensors")).unwrap();
    let (e, msg) = open_err(d.path());
    assert!(matches!(e, CheckpointError::MissingShard { .. }), "{e:?}");
    assert_mentions(
        &msg,
        &[
            "model.safetensors.index.json",
            "model-00002-of-00003.safetensors",
            "tensor layers.",
            "expected",
            "found no such file",
        ],
    );
}

#[test]
fn an_empty_weight_map_is_refused_at_open() {
    let d = tempfile::tempdir().unwrap();
    tiny(d.path(), WeightFormat::Bf16, 2);
    edit_index(d.path(), |v| v["weight_map"] = serde_json::json!({}));
    let (e, msg) = open_err(d.path());
    assert!(matches!(e, CheckpointError::IndexFormat { .. }), "{e:?}");
    assert_mentions(&msg, &["index.json", "empty \"weight_map\""]);
}

#[test]
fn index_naming_an_absent_file_is_reported_with_the_tensor() {
    let d = tempfile::tempdir().unwrap();
    tiny(d.path(), WeightFormat::Bf16, 2);
    edit_index(d.path(), |v| {
        v["weight_map"]["norm.weight"] = "model-00009-of-00002.safetensors".into();
    });
    let (e, msg) = open_err(d.path());
    assert!(matches!(e, CheckpointError::MissingShard { .. }), "{e:?}");
    assert_mentions(
        &msg,
        &[
            "model-00009-of-00002.safetensors",
            "tensor norm.weight",
            "index.json",
        ],
    );
}

#[test]
fn index_mapping_a_tensor_to_the_wrong_shard_is_reported() {
    let d = tempfile::tempdir().unwrap();
    tiny(d.path(), WeightFormat::Bf16, 2);
    edit_index(d.path(), |v| {
        v["weight_map"]["embed.weight"] = "model-00002-of-00002.safetensors".into();
    });
    let (e, msg) = open_err(d.path());
    assert!(matches!(e, CheckpointError::NotInShard { .. }), "{e:?}");
    assert_mentions(
        &msg,
        &[
            "tensor embed.weight",
            "model-00002-of-00002.safetensors",
            "expected in that shard",
        ],
    );
}

#[test]
fn truncated_shard_names_a_tensor_past_the_end() {
    let d = tempfile::tempdir().unwrap();
    tiny(d.path(), WeightFormat::Official, 1);
    let p = d.path().join("model.safetensors");
    let len = std::fs::metadata(&p).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(len - 1000).unwrap();
    let (e, msg) = open_err(d.path());
    let CheckpointError::OffsetsOutOfRange {
        end,
        data_len,
        ref tensor,
        ..
    } = e
    else {
        panic!("{e:?}")
    };
    assert!(end > data_len, "{msg}");
    assert_mentions(
        &msg,
        &[
            "model.safetensors",
            &format!("tensor {tensor}"),
            "expected inside the data section",
            "found outside",
        ],
    );
}

#[test]
fn header_length_that_lies_is_reported_with_both_lengths() {
    let d = tempfile::tempdir().unwrap();
    tiny(d.path(), WeightFormat::Bf16, 1);
    let p = d.path().join("model.safetensors");
    let mut bytes = std::fs::read(&p).unwrap();
    let claimed = bytes.len() as u64 * 2;
    bytes[..8].copy_from_slice(&claimed.to_le_bytes());
    std::fs::write(&p, &bytes).unwrap();
    let (e, msg) = open_err(d.path());
    assert!(matches!(e, CheckpointError::HeaderLength { .. }), "{e:?}");
    assert_mentions(
        &msg,
        &[
            "model.safetensors",
            &claimed.to_string(),
            &(bytes.len() - 8).to_string(),
        ],
    );
}

#[test]
fn file_shorter_than_the_length_prefix_is_reported() {
    let d = tempfile::tempdir().unwrap();
    tiny(d.path(), WeightFormat::Bf16, 1);
    std::fs::write(d.path().join("model.safetensors"), [1u8, 2, 3]).unwrap();
    let (_, msg) = open_err(d.path());
    assert_mentions(
        &msg,
        &["model.safetensors", "3 bytes", "expected at least 8"],
    );
}

#[test]
fn header_that_is_not_json_is_reported() {
    let d = tempfile::tempdir().unwrap();
    tiny(d.path(), WeightFormat::Bf16, 1);
    let p = d.path().join("model.safetensors");
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[8] = b'x';
    std::fs::write(&p, &bytes).unwrap();
    let (e, msg) = open_err(d.path());
    assert!(matches!(e, CheckpointError::HeaderJson { .. }), "{e:?}");
    assert_mentions(&msg, &["model.safetensors", "not valid JSON"]);
}

/// Replaces the first occurrence of `from` in the header of `p` by `to` (same length) and
/// returns the name of the tensor entry it was in.
fn patch_header(p: &Path, from: &str, to: &str) -> String {
    assert_eq!(from.len(), to.len());
    let mut bytes = std::fs::read(p).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + n]).unwrap().to_string();
    let at = header.find(from).expect("pattern in header");
    let name_end = header[..at].rfind("\":{").unwrap();
    let name_start = header[..name_end].rfind('"').unwrap() + 1;
    let name = header[name_start..name_end].to_string();
    bytes[8 + at..8 + at + from.len()].copy_from_slice(to.as_bytes());
    std::fs::write(p, &bytes).unwrap();
    name
}

#[test]
fn unknown_dtype_string_names_tensor_and_string() {
    let d = tempfile::tempdir().unwrap();
    tiny(d.path(), WeightFormat::Official, 1);
    let tensor = patch_header(
        &d.path().join("model.safetensors"),
        "\"F8_E8M0\"",
        "\"F8_E9M0\"",
    );
    let (e, msg) = open_err(d.path());
    assert!(matches!(e, CheckpointError::UnknownDtype { .. }), "{e:?}");
    assert_mentions(
        &msg,
        &[
            "model.safetensors",
            &format!("tensor {tensor}"),
            "\"F8_E9M0\"",
            "expected",
        ],
    );
}

#[test]
fn offsets_not_matching_dtype_times_shape_are_reported() {
    let d = tempfile::tempdir().unwrap();
    tiny(d.path(), WeightFormat::Bf16, 1);
    // Tiny's attn_sink is F32 [4] = 16 bytes; claim 5 elements.
    let tensor = patch_header(
        &d.path().join("model.safetensors"),
        "\"shape\":[4]",
        "\"shape\":[5]",
    );
    let (e, msg) = open_err(d.path());
    assert!(matches!(e, CheckpointError::OffsetsSize { .. }), "{e:?}");
    assert_mentions(
        &msg,
        &[
            &format!("tensor {tensor}"),
            "[5]",
            "expected",
            "bytes",
            "hold",
        ],
    );
}

#[test]
fn linear_stored_in_a_dtype_the_config_does_not_imply_is_rejected() {
    for (format, implied) in [
        (WeightFormat::Bf16, "BF16"),
        (WeightFormat::Official, "F8_E4M3"),
    ] {
        let d = tempfile::tempdir().unwrap();
        tiny(d.path(), format, 1);
        let wq_a = Checkpoint::open(d.path())
            .unwrap()
            .linear_f32("layers.1.attn.wq_a", 32, 64)
            .unwrap();
        rewrite(d.path(), |n, dt, s, b| {
            if n == "layers.1.attn.wq_a.weight" {
                let f32s = wq_a.iter().flat_map(|v| v.to_le_bytes()).collect();
                Some((Dtype::F32, s.to_vec(), f32s))
            } else if n == "layers.1.attn.wq_a.scale" {
                None
            } else {
                Some((dt, s.to_vec(), b.to_vec()))
            }
        });
        let ckpt = Checkpoint::open(d.path()).unwrap();
        let msg = ckpt
            .linear("layers.1.attn.wq_a", 32, 64)
            .unwrap_err()
            .to_string();
        assert_mentions(
            &msg,
            &[
                "model.safetensors",
                "tensor layers.1.attn.wq_a.weight",
                &format!("expected dtype {implied}"),
                "found F32",
            ],
        );
    }
}

#[test]
fn linear_with_a_shape_the_config_does_not_imply_is_rejected() {
    let d = tempfile::tempdir().unwrap();
    tiny(d.path(), WeightFormat::Bf16, 1);
    // Store wq_a transposed-shaped: [64, 32] instead of [q_lora_rank, hidden] = [32, 64].
    rewrite(d.path(), |n, dt, s, b| {
        let s = if n == "layers.1.attn.wq_a.weight" {
            vec![64, 32]
        } else {
            s.to_vec()
        };
        Some((dt, s, b.to_vec()))
    });
    let ckpt = Checkpoint::open(d.path()).unwrap();
    let msg = ckpt
        .linear("layers.1.attn.wq_a", 32, 64)
        .unwrap_err()
        .to_string();
    assert_mentions(
        &msg,
        &[
            "model.safetensors",
            "tensor layers.1.attn.wq_a.weight",
            "expected shape [32, 64]",
            "found [64, 32]",
        ],
    );
    let diff = audit(&ckpt);
    assert_eq!(diff.mismatched.len(), 1, "{}", diff.summary(5));
    assert!(diff
        .summary(5)
        .contains("expected BF16 [32, 64], found BF16 [64, 32]"));
    let msg = ckpt
        .f32_tensor("layers.1.attn.q_norm.weight", &[64])
        .unwrap_err()
        .to_string();
    assert_mentions(
        &msg,
        &[
            "tensor layers.1.attn.q_norm.weight",
            "expected shape [64]",
            "found [32]",
        ],
    );
}

#[test]
fn missing_scale_tensor_is_named() {
    let d = tempfile::tempdir().unwrap();
    tiny(d.path(), WeightFormat::Official, 1);
    rewrite(d.path(), |n, dt, s, b| {
        (n != "layers.3.attn.wq_a.scale").then(|| (dt, s.to_vec(), b.to_vec()))
    });
    let ckpt = Checkpoint::open(d.path()).unwrap();
    let msg = ckpt
        .linear("layers.3.attn.wq_a", 32, 64)
        .unwrap_err()
        .to_string();
    assert_mentions(
        &msg,
        &[
            "model.safetensors",
            "layers.3.attn.wq_a.scale missing",
            "F8_E8M0 [1, 1]",
            "found none",
        ],
    );
    let diff = audit(&ckpt);
    assert_eq!(diff.missing.len(), 1);
    assert_eq!(diff.missing[0].name, "layers.3.attn.wq_a.scale");
}

#[test]
fn missing_tensor_and_empty_directory_are_named() {
    let d = tempfile::tempdir().unwrap();
    tiny(d.path(), WeightFormat::Bf16, 1);
    let ckpt = Checkpoint::open(d.path()).unwrap();
    let msg = ckpt
        .f32_tensor("layers.9.attn_norm.weight", &[64])
        .unwrap_err()
        .to_string();
    assert_mentions(
        &msg,
        &[
            "tensor layers.9.attn_norm.weight",
            "expected",
            "found no tensor",
        ],
    );
    drop(ckpt);
    std::fs::remove_file(d.path().join("model.safetensors")).unwrap();
    let (e, msg) = open_err(d.path());
    assert!(matches!(e, CheckpointError::NoWeights { .. }), "{e:?}");
    assert_mentions(&msg, &["no weights found", "model.safetensors"]);
}

#[test]
fn tensor_in_two_shards_without_an_index_is_reported() {
    let d = tempfile::tempdir().unwrap();
    tiny(d.path(), WeightFormat::Bf16, 2);
    std::fs::remove_file(d.path().join("model.safetensors.index.json")).unwrap();
    std::fs::copy(
        d.path().join("model-00001-of-00002.safetensors"),
        d.path().join("extra.safetensors"),
    )
    .unwrap();
    let (e, msg) = open_err(d.path());
    assert!(
        matches!(e, CheckpointError::DuplicateTensor { .. }),
        "{e:?}"
    );
    assert_mentions(
        &msg,
        &["extra.safetensors", "model-00001-of-00002.safetensors"],
    );
}

#[test]
fn missing_config_is_reported_with_its_path() {
    let d = tempfile::tempdir().unwrap();
    tiny(d.path(), WeightFormat::Bf16, 1);
    std::fs::remove_file(d.path().join("config.json")).unwrap();
    let (_, msg) = open_err(d.path());
    assert_mentions(&msg, &["config.json"]);
}
