//! The planted checkpoint as files: deterministic from the seed, exactly the inventory its
//! config implies (bf16 and official formats), the real tokenizer and a `planted.json` that
//! titles reports "synthetic model", digit tokens carrying the needle feature, and the official
//! FP8 encoding keeping the construction (the needle is selected on every CSA layer at 2k).

use needlescope::checkpoint::{audit, Checkpoint, WeightFormat};
use needlescope::config::LayerKind;
use needlescope::model::{LogitsRequest, Model, ModelOptions};
use needlescope::numerics::profiles::IndexProfile;
use needlescope::probe::{build_prompt, CellTopk, NeedleObserver, NeedleObserverConfig, Scenario};
use needlescope::synth::planted::recipe::{BIAS, NEEDLE};
use needlescope::synth::planted::{
    digit_tokens, planted_info, synth_planted, DEFAULT_MARGIN, INFO_FILE, TITLE_NOTE,
};
use needlescope::synth::{Preset, SynthOptions};
use needlescope::tokenizer::{builtin_json_bytes, V4Tokenizer};
use std::path::Path;

fn synth(dir: &Path, format: WeightFormat, seed: u64, margin: Option<f64>) {
    let mut opts = SynthOptions::new(Preset::Planted, format, dir);
    opts.seed = seed;
    synth_planted(&opts, margin).unwrap();
}

#[test]
fn planted_synth_is_deterministic_and_complete() {
    let (a, b, c) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    synth(a.path(), WeightFormat::Bf16, 3, None);
    synth(b.path(), WeightFormat::Bf16, 3, None);
    synth(c.path(), WeightFormat::Bf16, 4, None);
    let read = |d: &Path, f: &str| std::fs::read(d.join(f)).unwrap();
    for f in ["model.safetensors", "config.json", INFO_FILE] {
        assert!(
            read(a.path(), f) == read(b.path(), f),
            "{f} differs for one seed"
        );
    }
    assert!(read(a.path(), "model.safetensors") != read(c.path(), "model.safetensors"));
    assert_eq!(read(a.path(), "tokenizer.json"), builtin_json_bytes());

    let ckpt = Checkpoint::open(a.path()).unwrap();
    let diff = audit(&ckpt);
    assert!(diff.is_clean(), "{}", diff.summary(10));
    let cfg = ckpt.config();
    assert_eq!(cfg.vocab_size, 129280);
    assert_eq!(cfg.layers_of_kind(LayerKind::Csa), vec![1, 3]);

    let info = planted_info(a.path()).unwrap();
    assert!(info.synthetic && !info.lm_copies_needle);
    assert!(info.title.contains(TITLE_NOTE), "{}", info.title);
    assert_eq!((info.seed, info.margin), (3, DEFAULT_MARGIN));
    assert_eq!(info.calibration.len(), 2, "one calibration per CSA layer");
}

#[test]
fn digit_tokens_carry_the_needle_feature_and_embeddings_have_unit_rms() {
    let dir = tempfile::tempdir().unwrap();
    synth(dir.path(), WeightFormat::Bf16, 0, None);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let d = ckpt.config().hidden_size;
    let embed = ckpt
        .f32_tensor("embed.weight", &[ckpt.config().vocab_size, d])
        .unwrap();
    let tok = V4Tokenizer::builtin().unwrap();
    let digits = digit_tokens(&tok).unwrap();
    assert_eq!(digits.iter().filter(|&&x| x).count(), 1110);
    let id = |s: &str| tok.encode(s).unwrap()[0] as usize;
    for (s, is_digit) in [("123", true), ("7", true), ("007", true), ("The", false)] {
        let row = &embed[id(s) * d..(id(s) + 1) * d];
        assert_eq!(
            row[NEEDLE] > 1.0,
            is_digit,
            "{s:?}: needle dim {}",
            row[NEEDLE]
        );
        assert_eq!(
            row[BIAS], embed[BIAS],
            "bias dim is the same for every token"
        );
        let rms = (row.iter().map(|x| x * x).sum::<f32>() / d as f32).sqrt();
        assert!((rms - 1.0).abs() < 0.01, "{s:?}: rms {rms}");
    }
}

#[test]
fn official_format_keeps_the_needle_selected_on_every_csa_layer() {
    let dir = tempfile::tempdir().unwrap();
    synth(dir.path(), WeightFormat::Official, 0, Some(4.0));
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ckpt.format(), WeightFormat::Official);
    assert!(audit(&ckpt).is_clean());
    let engine = Model::load(
        &ckpt,
        ModelOptions {
            index: IndexProfile::SglangBf16Keys,
            topk: Some(64),
            ..ModelOptions::default()
        },
    )
    .unwrap();
    let tok = V4Tokenizer::from_file(dir.path()).unwrap();
    let sc = Scenario::load("passkey").unwrap();
    let p = build_prompt(&tok, &sc, 2048, 40.0, 0, 1 << 20).unwrap();
    let mut obs = NeedleObserver::new(NeedleObserverConfig {
        needles: vec![p.needle],
        answer: p.answer,
        prompt_len: p.tokens.len(),
        prompt_positions: vec![p.tokens.len() - 1],
        probe_decode: false,
        driving: IndexProfile::SglangBf16Keys,
        compare: vec![IndexProfile::Exact],
        cells: vec![CellTopk {
            cell_id: "c".into(),
            topk: 64,
        }],
        engine: None,
    });
    let mut state = engine.new_sequence();
    let out = engine
        .forward(&mut state, &p.tokens, &mut obs, LogitsRequest::Last)
        .unwrap();
    assert_eq!(out.logits.len(), 1);
    assert!(obs.errors.is_empty() && obs.disagreements.is_empty());
    let records: Vec<_> = obs.layer_records.iter().filter(|r| r.driving).collect();
    assert_eq!(records.len(), 2, "one record per CSA layer");
    for r in records {
        assert!(!r.trivial && r.selected, "{r:?}");
        assert!(r.needle_rank.unwrap() <= 3, "margin 4: {r:?}");
    }
}

#[test]
fn margin_outside_its_range_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let opts = SynthOptions::new(Preset::Planted, WeightFormat::Bf16, dir.path());
    let msg = synth_planted(&opts, Some(50.0)).unwrap_err().to_string();
    assert!(msg.contains("margin") && msg.contains("50"), "{msg}");
    // On the command line the flag is checked as it is parsed: named, nothing written.
    for cmd in [&["demo"][..], &["synth", "--preset", "planted"]] {
        let out = dir.path().join("out");
        let run = std::process::Command::new(env!("CARGO_BIN_EXE_needlescope"))
            .args(cmd)
            .args(["--margin", "20", "--out"])
            .arg(&out)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains(
                "'--margin <SIGMAS>': expected haystack standard deviations from -3 to 12"
            ),
            "{stderr}"
        );
        assert!(!out.exists());
    }
}

/// The generic entry point builds the planted model, not a random one in its shape: `synth`
/// with `Preset::Planted` writes exactly what `synth_planted` writes at the default margin.
#[test]
fn synth_with_the_planted_preset_builds_the_planted_model() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let opts = SynthOptions::new(Preset::Planted, WeightFormat::Bf16, a.path());
    let s = needlescope::synth::synth(&opts, None).unwrap();
    assert_eq!(s.config.compress_ratios, vec![0, 4, 128, 4]);
    let info = planted_info(a.path()).expect("planted.json");
    assert_eq!((info.seed, info.margin), (0, DEFAULT_MARGIN));
    synth(b.path(), WeightFormat::Bf16, 0, None);
    let read = |d: &Path, f: &str| std::fs::read(d.join(f)).unwrap();
    for f in [
        "model.safetensors",
        "config.json",
        INFO_FILE,
        "tokenizer.json",
    ] {
        assert!(
            read(a.path(), f) == read(b.path(), f),
            "{f}: synth and synth_planted differ"
        );
    }
}

/// Another synth into a planted model's directory leaves no `planted.json` (which would mark
/// the new model as planted) and no copy of the built-in tokenizer; a user's own files stay.
#[test]
fn synth_over_a_planted_directory_removes_what_planted_wrote() {
    let dir = tempfile::tempdir().unwrap();
    synth(dir.path(), WeightFormat::Bf16, 0, None);
    assert!(planted_info(dir.path()).is_some());
    std::fs::write(dir.path().join("notes.txt"), "mine").unwrap();
    let opts = SynthOptions::new(Preset::Tiny, WeightFormat::Official, dir.path());
    needlescope::synth::synth(&opts, None).unwrap();
    assert!(!dir.path().join(INFO_FILE).exists());
    assert!(!dir.path().join("tokenizer.json").exists());
    assert!(planted_info(dir.path()).is_none());
    assert!(dir.path().join("notes.txt").exists());

    // A tokenizer.json that is not the built-in one is the user's: it stays.
    let mut own = builtin_json_bytes();
    own.extend_from_slice(b"\n");
    std::fs::write(dir.path().join("tokenizer.json"), &own).unwrap();
    needlescope::synth::synth(&opts, None).unwrap();
    assert_eq!(
        std::fs::read(dir.path().join("tokenizer.json")).unwrap(),
        own
    );
}
