//! `inspect --model DIR --verify` through the binary: a clean synthetic checkpoint reads clean
//! (exit 0, one summary line); NaN, infinite and all-zero tensors (bf16, an fp8 NaN code) are
//! each named with shard, dtype and counts, exit 1 (an all-zero bias is only noted); `--json`
//! carries the same; `--verify` needs `--model`.

use cli_support::{rebuild, run, synth_tiny, Run};
use needlescope_testkit::cli as cli_support;
use std::path::Path;

fn verify(dir: &Path, extra: &[&str]) -> Run {
    let mut args = vec![
        "inspect".to_string(),
        "--model".into(),
        dir.display().to_string(),
        "--verify".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    run(&args)
}

#[test]
fn a_clean_checkpoint_verifies_with_a_summary_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny");
    synth_tiny(&dir, &["--shards", "2"]);
    let r = verify(&dir, &[]).ok().stdout_has(&["inventory   OK"]);
    let line = r
        .stdout
        .lines()
        .find(|l| l.starts_with("verify "))
        .unwrap_or_else(|| panic!("no verify line\n{}", r.dump()));
    assert!(
        line.contains("verified ") && line.ends_with("no NaN/Inf/all-zero"),
        "{line}"
    );
    let ckpt = needlescope::checkpoint::Checkpoint::open(&dir).unwrap();
    assert!(
        line.contains(&format!(
            "verified {} tensors, {}",
            needlescope::units::group_digits(ckpt.len() as u64),
            needlescope::units::human_bytes(ckpt.payload_bytes())
        )),
        "{line}"
    );
    // Without --verify nothing is read, and nothing is said about values.
    let plain = cli_support::inspect_model(&dir).ok();
    assert!(!plain.stdout.contains("verif"), "{}", plain.dump());
}

#[test]
fn nan_inf_and_all_zero_tensors_are_named_and_fail_the_verify() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny");
    synth_tiny(&dir, &[]);
    let (nan_t, inf_t, zero_t, fp8_t) = (
        "layers.1.attn.indexer.compressor.wkv.weight",
        "layers.0.attn_norm.weight",
        "layers.3.attn_norm.weight",
        "layers.1.attn.wq_b.weight",
    );
    // Clean before the damage (the inventory check alone cannot see any of it after).
    verify(&dir, &[]).ok();
    rebuild(&dir.join("model.safetensors"), |entries| {
        for e in entries.iter_mut() {
            match e.name.as_str() {
                n if n == nan_t => {
                    assert_eq!(e.dtype, "BF16");
                    for pair in e.bytes.chunks_mut(2).take(5) {
                        pair.copy_from_slice(&0x7FC0u16.to_le_bytes());
                    }
                }
                n if n == inf_t => {
                    assert_eq!(e.dtype, "BF16");
                    e.bytes[0..2].copy_from_slice(&0x7F80u16.to_le_bytes());
                    e.bytes[4..6].copy_from_slice(&0xFF80u16.to_le_bytes());
                }
                n if n == zero_t || n == "layers.1.attn.indexer.compressor.ape" => e.bytes.fill(0),
                n if n == fp8_t => {
                    assert_eq!(e.dtype, "F8_E4M3");
                    e.bytes[7] = 0x7F;
                }
                _ => {}
            }
        }
    });
    cli_support::inspect_model(&dir)
        .ok()
        .stdout_has(&["inventory   OK"]);
    let r = verify(&dir, &[]).fails();
    assert_eq!(r.code, Some(1), "{}", r.dump());
    let r = r.stdout_has(&["verify      FOUND 4 of "]);
    let line = |name: &str| -> String {
        r.stdout
            .lines()
            .find(|l| l.contains(&format!(" {name} in ")))
            .unwrap_or_else(|| panic!("{name} not reported\n{}", r.dump()))
            .to_string()
    };
    let shard = dir.join("model.safetensors").display().to_string();
    for (name, words) in [
        (
            nan_t,
            &["NaN/Inf", "BF16", "5 NaN, 0 infinite", "first at [0, 0]"][..],
        ),
        (
            inf_t,
            &["NaN/Inf", "BF16", "0 NaN, 2 infinite", "first at [0]"][..],
        ),
        (zero_t, &["all-zero", "BF16", "every value is zero"][..]),
        (
            fp8_t,
            &["NaN/Inf", "F8_E4M3", "1 NaN, 0 infinite", "first at [0, 7]"][..],
        ),
    ] {
        let l = line(name);
        assert!(l.contains(&shard), "{l}");
        for w in words {
            assert!(l.contains(w), "{w:?} not in: {l}");
        }
    }
    // A zero bias is a valid value: noted, not counted.
    let r = r.stdout_has(&[
        "note      1 additive bias tensor(s)",
        "first: layers.1.attn.indexer.compressor.ape",
    ]);
    r.stderr_has(&["4 of", "hold NaN or infinite values, or only zeros", nan_t]);

    // --json: the same findings, and the exit status.
    let j = verify(&dir, &["--json"]).fails();
    assert_eq!(j.code, Some(1), "{}", j.dump());
    let v: serde_json::Value = serde_json::from_str(&j.stdout).unwrap();
    let findings = v["verify"]["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 4);
    let nan = findings.iter().find(|f| f["tensor"] == nan_t).unwrap();
    assert_eq!(nan["dtype"], "BF16");
    assert_eq!(nan["nan"], 5);
    assert_eq!(nan["inf"], 0);
    assert_eq!(nan["all_zero"], false);
    assert_eq!(nan["file"], shard.as_str());
    let zero = findings.iter().find(|f| f["tensor"] == zero_t).unwrap();
    assert_eq!(zero["all_zero"], true);
    assert!(v["verify"]["tensors"].as_u64().unwrap() > 4);
}

#[test]
fn verify_json_of_a_clean_checkpoint_and_without_a_model() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny");
    synth_tiny(&dir, &[]);
    let j = verify(&dir, &["--json"]).ok();
    let v: serde_json::Value = serde_json::from_str(&j.stdout).unwrap();
    assert_eq!(v["verify"]["findings"], serde_json::json!([]));
    let plain = run(&["inspect", "--model", dir.to_str().unwrap(), "--json"]).ok();
    let v: serde_json::Value = serde_json::from_str(&plain.stdout).unwrap();
    assert!(v["verify"].is_null());
    let cfg = cli_support::flash_config(tmp.path());
    let r = run(&["inspect", "--config", cfg.to_str().unwrap(), "--verify"]).fails();
    assert_eq!(r.code, Some(2), "{}", r.dump());
    r.stderr_has(&["--verify", "--model"]);
}
