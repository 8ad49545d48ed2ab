//! `synth --preset v41-tiny` through the binary: it writes the tiny DeepSeek-V4.1 in both
//! formats and says what it wrote, and `inspect` finds every tensor where its config puts it;
//! what it cannot honour (`--layers`, `--experts`, `--fp8-compressors`, `--margin`) and what synth refuses for every preset (an
//! `--out` it did not write, a file as `--out`) are refused by name before anything is written.

use cli_support::run;
use needlescope_testkit::cli as cli_support;
use std::path::Path;

fn s(p: &Path) -> String {
    p.display().to_string()
}

fn synth_v41(out: &Path, extra: &[&str]) -> cli_support::Run {
    let mut args = vec![
        "synth".to_string(),
        "--preset".into(),
        "v41-tiny".into(),
        "--out".into(),
        s(out),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    run(&args)
}

#[test]
fn synth_v41_tiny_writes_both_formats_and_rewrites_its_own_output() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("v41");
    synth_v41(&dir, &[]).ok().stdout_has(&[
        "v41-tiny preset, official format, seed 0",
        "tensors",
        "1 safetensors (model.safetensors) + config.json",
        "schedule  12 layers: 2 SWA, 4 CSA2, 6 CSA1; KV sources 2, 5, 6, index sources 2, 5, 6, \
         8, 10, candidate source 6; Engram on 1, 5; 1 draft block",
    ]);
    let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
    assert!(config.contains("\"quantization_config\""), "{config}");
    // Its own output is replaced, here by the bf16 format in two shards.
    synth_v41(&dir, &["--format", "bf16", "--shards", "2", "--seed", "3"])
        .ok()
        .stdout_has(&["bf16 format, seed 3", "2 safetensors", "index.json"]);
    let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
    assert!(!config.contains("quantization_config"), "{config}");
    assert!(
        !dir.join("model.safetensors").exists(),
        "the old single file stays"
    );
}

#[test]
fn synth_v41_tiny_refuses_the_v4_only_flags_before_writing() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("never");
    for (flags, needle) in [
        (
            &["--layers", "4"][..],
            "--layers applies to --preset tiny and flash",
        ),
        (
            &["--experts", "2"][..],
            "--experts applies to --preset tiny and flash",
        ),
        (&["--fp8-compressors"][..], "--fp8-compressors applies"),
        (
            &["--margin", "2"][..],
            "--margin applies to --preset planted only",
        ),
        (&["--shards", "0"][..], "--shards"),
    ] {
        synth_v41(&out, flags).fails().stderr_has(&[needle]);
    }
    assert!(!out.exists(), "a refused synth created {}", out.display());
    run(&["synth", "--preset", "v41", "--out", &s(&out)])
        .fails()
        .stderr_has(&["v41-tiny"]);
}

#[test]
fn synth_v41_tiny_refuses_an_out_it_did_not_write() {
    let tmp = tempfile::tempdir().unwrap();
    // A downloaded checkpoint: refused untouched.
    let theirs = tmp.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::write(theirs.join("config.json"), "{}").unwrap();
    synth_v41(&theirs, &[])
        .fails()
        .stderr_has(&["holds a checkpoint that synth did not write", "config.json"]);
    assert_eq!(
        std::fs::read_to_string(theirs.join("config.json")).unwrap(),
        "{}"
    );
    assert!(!theirs.join("synth.json").exists());
    // A report directory: not empty, not synth's.
    let report = tmp.path().join("report");
    std::fs::create_dir(&report).unwrap();
    std::fs::write(report.join("index.html"), "<p>").unwrap();
    synth_v41(&report, &["--format", "bf16"])
        .fails()
        .stderr_has(&["not empty and not synth's output", "index.html"]);
    assert_eq!(std::fs::read_dir(&report).unwrap().count(), 1);
    // A file.
    let file = tmp.path().join("ids.txt");
    std::fs::write(&file, "1 2 3").unwrap();
    synth_v41(&file, &[])
        .fails()
        .stderr_has(&["ids.txt", "expected a directory", "is a file"]);
}

/// `inspect --model` on the tiny V4.1 in every format: the inventory its config implies, clean
/// (also with `--verify`), the V4.1 facts, and a memory plan with the Engram tables on the host.
#[test]
fn inspect_on_v41_tiny_is_clean_in_every_format() {
    let tmp = tempfile::tempdir().unwrap();
    for format in ["bf16", "official", "nvfp4"] {
        let dir = tmp.path().join(format);
        synth_v41(&dir, &["--format", format]).ok();
        let d = s(&dir);
        run(&["inspect", "--model", &d, "--verify"])
            .ok()
            .stdout_has(&[
                &format!("format      {format}"),
                "inventory   OK",
                "verify      OK",
                "schedule    12 layers: 2 SWA, 4 CSA2, 6 CSA1",
                "candidates  layer 6 keeps its top 128 blocks of 8 rows (1,024 rows)",
                "engram      layer 1 4,062 rows, layer 5 4,152 rows x 64 wide",
                "CSA1      1  L6    own   consumer 8, 10",
            ]);
        // A token reads 2 tables x 4 rows of 64 values: bf16 128 B a row, e4m3 + 2 scales 66 B.
        let per_token = if format == "bf16" { "1,024" } else { "528" };
        let plan = [
            "inspect",
            "--model",
            &d,
            "--devices",
            "1x2G",
            "--context",
            "16k",
        ];
        run(&plan).ok().stdout_has(&[
            "fits",
            "host (mapped): Engram tables",
            &format!("read by row ({per_token} B a token)"),
        ]);
    }
    // A tensor of the wrong shape is named, with the shard, expected and found.
    let dir = tmp.path().join("official");
    let shard = dir.join("model.safetensors");
    cli_support::rebuild(&shard, |entries| {
        let e = entries
            .iter_mut()
            .find(|e| e.name == "layers.6.attn.indexer.wk.weight")
            .unwrap();
        e.shape = vec![e.shape[1], e.shape[0]];
    });
    run(&["inspect", "--model", &s(&dir)])
        .fails()
        .stdout_has(&["inventory   MISMATCH", "layers.6.attn.indexer.wk.weight"])
        .stderr_has(&["expected BF16 [32, 64], found BF16 [64, 32]"]);
}
