//! synth -> Checkpoint round trips: every tensor of a tiny synthetic checkpoint has the dtype and
//! shape of the inventory and decodes, through the reader, to exactly what the generator made
//! after the format's own rounding (recomputed here with the numerics encoders, not with synth's
//! code path). Also: sharding changes nothing, the same seed gives the same bytes.

use crate::rounding::rounded;
use needlescope::checkpoint::inventory::{
    expected_inventory_with, linear_storage, logical_inventory, CompressorKinds, InventoryOptions,
    StorageRules, TensorRole,
};
use needlescope::checkpoint::{audit, compare, Checkpoint, WeightFormat};
use needlescope::numerics::codecs::bf16_round;
use needlescope::synth::tensors::{generate, Values};
use needlescope::synth::{synth, Preset, SynthOptions, SynthSummary};
use std::path::Path;

fn tiny(dir: &Path, format: WeightFormat, shards: usize, seed: u64) -> SynthSummary {
    tiny_with(dir, format, shards, seed, false)
}

fn tiny_with(
    dir: &Path,
    format: WeightFormat,
    shards: usize,
    seed: u64,
    fp8_compressors: bool,
) -> SynthSummary {
    let mut o = SynthOptions::new(Preset::Tiny, format, dir);
    o.shards = shards;
    o.seed = seed;
    o.fp8_compressors = fp8_compressors;
    synth(&o, None).unwrap()
}

fn assert_same_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!(
            "{what}: first difference at {i}: read {} expected {}",
            got[i], want[i]
        );
    }
}

fn check_every_tensor_decodes_to_the_generator(format: WeightFormat) {
    check_every_tensor_decodes_with(format, false)
}

fn check_every_tensor_decodes_with(format: WeightFormat, fp8_compressors: bool) {
    let dir = tempfile::tempdir().unwrap();
    let summary = tiny_with(dir.path(), format, 1, 42, fp8_compressors);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ckpt.format(), format);
    let cfg = ckpt.config().clone();
    assert_eq!(cfg, summary.config);
    let opts = InventoryOptions {
        fp8_compressor_linears: if fp8_compressors {
            CompressorKinds::ALL
        } else {
            CompressorKinds::NONE
        },
        ..format.into()
    };
    assert_eq!(ckpt.inventory_options(), opts);
    let diff = compare(&ckpt, &expected_inventory_with(&cfg, opts));
    assert!(diff.is_clean(), "{}", diff.summary(10));
    assert!(audit(&ckpt).is_clean());
    assert_eq!(ckpt.len(), summary.tensors);
    assert_eq!(ckpt.payload_bytes(), summary.payload_bytes);
    let mut kinds = std::collections::BTreeSet::new();
    for lt in logical_inventory(&cfg) {
        let values = generate(&cfg, 42, &lt);
        match (
            values,
            linear_storage(StorageRules::from(&cfg), opts, lt.role),
        ) {
            (Values::I64(want), _) => {
                assert_eq!(
                    ckpt.i64_tensor(&lt.name, &lt.shape).unwrap(),
                    want,
                    "{}",
                    lt.name
                )
            }
            (Values::F32(x), None) => {
                let got = ckpt.f32_tensor(&lt.name, &lt.shape).unwrap();
                let bf16 = matches!(lt.role, TensorRole::Embed | TensorRole::Norm);
                let want: Vec<f32> = if bf16 {
                    x.iter().map(|&v| bf16_round(v)).collect()
                } else {
                    x
                };
                assert_same_bits(&got, &want, &lt.name);
            }
            (Values::F32(x), Some(storage)) => {
                let (o, i) = (lt.shape[0], lt.shape[1]);
                let q = ckpt.linear(&lt.name, o, i).unwrap();
                kinds.insert(q.kind());
                assert_eq!((q.rows(), q.cols()), (o, i));
                let got = ckpt.linear_f32(&lt.name, o, i).unwrap();
                assert_same_bits(&got, &rounded(storage, &x, o, i), &lt.name);
            }
        }
    }
    let want: &[&str] = match format {
        WeightFormat::Bf16 if fp8_compressors => &["bf16", "fp8-block"],
        WeightFormat::Bf16 => &["bf16"],
        WeightFormat::Official => &["bf16", "fp4-group", "fp8-block"],
        WeightFormat::Nvfp4 => &["bf16", "fp4-group", "fp8-block", "nvfp4"],
    };
    assert_eq!(kinds.into_iter().collect::<Vec<_>>(), want);
}

#[test]
fn bf16_tiny_round_trips_every_tensor() {
    check_every_tensor_decodes_to_the_generator(WeightFormat::Bf16);
}

#[test]
fn official_tiny_round_trips_every_tensor() {
    check_every_tensor_decodes_to_the_generator(WeightFormat::Official);
}

#[test]
fn nvfp4_tiny_round_trips_every_tensor() {
    check_every_tensor_decodes_to_the_generator(WeightFormat::Nvfp4);
}

#[test]
fn fp8_compressor_tiny_round_trips_every_tensor() {
    for format in [
        WeightFormat::Bf16,
        WeightFormat::Official,
        WeightFormat::Nvfp4,
    ] {
        check_every_tensor_decodes_with(format, true);
    }
}

#[test]
fn quantised_weights_are_close_to_the_generator() {
    // A guard against a self-consistent but wrong encoder: decoded FP8 stays within e4m3's
    // relative step of the generated value (plus the block's subnormal floor).
    let dir = tempfile::tempdir().unwrap();
    tiny(dir.path(), WeightFormat::Official, 1, 1);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let cfg = ckpt.config().clone();
    let lt = logical_inventory(&cfg)
        .into_iter()
        .find(|t| t.name == "layers.1.attn.wq_b")
        .unwrap();
    let Values::F32(x) = generate(&cfg, 1, &lt) else {
        panic!()
    };
    let got = ckpt.linear_f32(&lt.name, lt.shape[0], lt.shape[1]).unwrap();
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (g, w) in got.iter().zip(&x) {
        assert!(
            (g - w).abs() <= w.abs() / 16.0 + amax / 448.0 / 8.0,
            "{g} vs {w}"
        );
    }
}

#[test]
fn sharded_checkpoint_reads_the_same_as_a_single_file() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let one = tiny(a.path(), WeightFormat::Official, 1, 3);
    let three = tiny(b.path(), WeightFormat::Official, 3, 3);
    assert_eq!(one.files.len(), 1);
    assert_eq!(three.files.len(), 3);
    assert!(b.path().join("model.safetensors.index.json").is_file());
    assert!(b.path().join("model-00002-of-00003.safetensors").is_file());
    let (ca, cb) = (
        Checkpoint::open(a.path()).unwrap(),
        Checkpoint::open(b.path()).unwrap(),
    );
    assert_eq!(cb.shard_paths().len(), 3);
    assert_eq!(
        ca.names().collect::<Vec<_>>(),
        cb.names().collect::<Vec<_>>()
    );
    for name in ca.names() {
        assert_eq!(
            ca.raw_bytes(name).unwrap(),
            cb.raw_bytes(name).unwrap(),
            "{name}"
        );
    }
    let (o, i) = (cb.config().q_lora_rank, cb.config().hidden_size);
    assert_eq!(
        ca.linear_f32("layers.2.attn.wq_a", o, i).unwrap(),
        cb.linear_f32("layers.2.attn.wq_a", o, i).unwrap()
    );
    // A weight and its scale always share a shard.
    let w = cb.info("layers.2.attn.wq_a.weight").unwrap();
    let s = cb.info("layers.2.attn.wq_a.scale").unwrap();
    assert_eq!(w.file, s.file);
    // Re-synth into the same directory as one file: the stale shards and index disappear.
    tiny(b.path(), WeightFormat::Official, 1, 3);
    assert!(!b.path().join("model.safetensors.index.json").exists());
    assert!(!b.path().join("model-00002-of-00003.safetensors").exists());
    assert_eq!(Checkpoint::open(b.path()).unwrap().shard_paths().len(), 1);
}

/// synth reports its progress in payload bytes: rising, ending at the whole payload.
#[test]
fn synth_reports_progress_up_to_its_payload() {
    let dir = tempfile::tempdir().unwrap();
    let mut calls = Vec::new();
    let mut o = SynthOptions::new(Preset::Tiny, WeightFormat::Official, dir.path());
    o.shards = 3; // tiny fits one window of tensors: a report per shard at least
    let s = needlescope::synth::synth_with_progress(&o, None, &mut |done, total| {
        calls.push((done, total))
    })
    .unwrap();
    assert!(calls.len() > 1, "{calls:?}");
    assert!(calls.windows(2).all(|w| w[0].0 <= w[1].0));
    assert!(calls.iter().all(|&(_, t)| t == s.payload_bytes));
    assert_eq!(calls.last().unwrap().0, s.payload_bytes);
}

/// A wrong `--out` never deletes weights synth did not write: a directory holding a checkpoint
/// without synth's mark is refused untouched, naming the files; synth's own output (marked
/// first, so even a run cut short) is replaced, and reports call it synthetic.
#[test]
fn synth_refuses_a_checkpoint_it_did_not_write() {
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().join("downloaded");
    std::fs::create_dir(&user).unwrap();
    for f in ["model-00001-of-00046.safetensors", "config.json"] {
        std::fs::write(user.join(f), b"theirs").unwrap();
    }
    let o = SynthOptions::new(Preset::Tiny, WeightFormat::Bf16, &user);
    let e = synth(&o, None).unwrap_err().to_string();
    assert!(
        e.contains("downloaded")
            && e.contains("config.json, model-00001-of-00046.safetensors")
            && e.contains("did not write"),
        "{e}"
    );
    assert_eq!(dir_files(&user).len(), 2, "nothing written or removed");
    assert_eq!(
        std::fs::read(user.join("config.json")).unwrap(),
        b"theirs".to_vec()
    );
    assert!(!needlescope::run::target::model_marks(&user).synthetic);

    // Any other non-empty directory synth did not write (a report directory, as once the
    // committed reports/demo) is refused untouched too.
    let report = dir.path().join("report");
    std::fs::create_dir(&report).unwrap();
    for f in ["cells.csv", "layers.csv", "run.json", "heatmap_fp8_64.png"] {
        std::fs::write(report.join(f), b"theirs").unwrap();
    }
    let e = synth(
        &SynthOptions::new(Preset::Tiny, WeightFormat::Bf16, &report),
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("not empty and not synth's output")
            && e.contains("cells.csv, heatmap_fp8_64.png, layers.csv and 1 more"),
        "{e}"
    );
    assert_eq!(dir_files(&report).len(), 4, "nothing written or removed");
    // An empty directory is fine.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    synth(
        &SynthOptions::new(Preset::Tiny, WeightFormat::Bf16, &empty),
        None,
    )
    .unwrap();

    // A run cut short after its mark: the next run may replace it.
    let ours = dir.path().join("ours");
    std::fs::create_dir(&ours).unwrap();
    std::fs::write(ours.join("synth.json"), b"{}").unwrap();
    std::fs::write(ours.join("model-00001-of-00002.safetensors"), b"partial").unwrap();
    synth(
        &SynthOptions::new(Preset::Tiny, WeightFormat::Bf16, &ours),
        None,
    )
    .unwrap();
    assert!(!ours.join("model-00001-of-00002.safetensors").exists());
    let marks = needlescope::run::target::model_marks(&ours);
    assert!(marks.synthetic && !marks.answers);
    let mark: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ours.join("synth.json")).unwrap()).unwrap();
    assert_eq!(mark["preset"], "tiny");
    assert_eq!(mark["synthetic"], true);
}

fn dir_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn same_seed_gives_byte_identical_files_and_another_seed_does_not() {
    let (a, b, c) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    tiny(a.path(), WeightFormat::Nvfp4, 2, 7);
    tiny(b.path(), WeightFormat::Nvfp4, 2, 7);
    tiny(c.path(), WeightFormat::Nvfp4, 2, 8);
    let (fa, fb, fc) = (
        dir_files(a.path()),
        dir_files(b.path()),
        dir_files(c.path()),
    );
    assert_eq!(fa.len(), 5, "2 shards, index, config, synth.json");
    for ((na, ba), (nb, bb)) in fa.iter().zip(&fb) {
        assert_eq!(na, nb);
        assert!(ba == bb, "{na} differs between two runs with seed 7");
    }
    for ((na, ba), (_, bc)) in fa.iter().zip(&fc) {
        if na.ends_with(".safetensors") {
            assert!(ba != bc, "{na} is the same under seeds 7 and 8");
        }
    }
}

#[test]
fn tiny_is_a_few_megabytes_and_copies_the_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = SynthOptions::new(Preset::Tiny, WeightFormat::Bf16, dir.path());
    o.seed = 1;
    let s = synth(&o, Some(b"{\"model\": {}}")).unwrap();
    assert!(
        (1_000_000..10_000_000).contains(&s.payload_bytes),
        "tiny bf16 is {} bytes",
        s.payload_bytes
    );
    assert_eq!(
        std::fs::read(dir.path().join("tokenizer.json")).unwrap(),
        b"{\"model\": {}}"
    );
    let cfg = needlescope::config::ModelConfig::load(dir.path()).unwrap();
    assert!(cfg.quantization_config.is_none() && cfg.expert_dtype.is_none());
}

#[test]
fn reduced_flash_config_is_written_with_quantization_config() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = SynthOptions::new(Preset::Flash, WeightFormat::Official, dir.path());
    o.layers = Some(1);
    o.experts = Some(2);
    // Only the config is checked here (the flash embed alone is 1 GB); synth_config is what
    // synth writes.
    let cfg = needlescope::synth::synth_config(&o).unwrap();
    assert_eq!(cfg.compress_ratios, vec![0, 0]);
    assert_eq!(cfg.num_hash_layers, 1);
    assert_eq!((cfg.n_routed_experts, cfg.num_experts_per_tok), (2, 2));
    assert!(cfg.is_fp8() && cfg.experts_fp4());
}
