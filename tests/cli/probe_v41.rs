//! `probe` and `sweep` on a DeepSeek-V4.1 checkpoint through the binary (run::probe_v41,
//! run::sweep): every index
//! source's records carry their stage, and the ranks they report are recomputed here from an
//! independent `trace` of the same prompt (the scores each layer ranks, the unconstrained
//! scores and the candidate blocks); `--out` writes a report directory whose layers.csv has the
//! stage columns and `report` renders it; what V4.1 cannot do yet (`--engine`, `--device
//! cuda`) or ever (rotating profiles) is refused by name, and V4 refuses `--candidate-blocks`.

use cli_support::{run, synth_v41_tiny, tensor_f32 as tensor};
use needlescope_testkit::cli as cli_support;
use safetensors::SafeTensors;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn s(p: &Path) -> String {
    p.display().to_string()
}

fn v41(tmp: &Path) -> PathBuf {
    let model = tmp.join("v41");
    synth_v41_tiny(&model);
    model
}

/// `probe --json` of the v41-tiny at 600 tokens, the needle at `depth`, with a candidate
/// budget of `blocks`.
fn probe_json(model: &Path, (depth, blocks): (u32, usize), extra: &[&str]) -> Value {
    let mut args = vec![
        "probe".to_string(),
        "--model".into(),
        s(model),
        "--length".into(),
        "600".into(),
        "--depth".into(),
        depth.to_string(),
        "--chunk".into(),
        "128".into(),
        "--candidate-blocks".into(),
        blocks.to_string(),
        "--json".into(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    let out = run(&args).ok();
    serde_json::from_str(&out.stdout).unwrap()
}

/// 1 + rows scoring strictly above the best of `rows` (clipped to the scores), and that best
/// score; `None` without a needle row.
fn rank(scores: &[f32], rows: std::ops::Range<usize>) -> Option<(usize, f32)> {
    let rows = rows.start.min(scores.len())..rows.end.min(scores.len());
    let best = rows
        .map(|r| scores[r])
        .fold(None, |b: Option<f32>, s| Some(b.map_or(s, |b| b.max(s))))?;
    Some((1 + scores.iter().filter(|&&x| x > best).count(), best))
}

/// Probes the needle at `depth` with top-`k` (exact math, budget 10) and checks every driving
/// record against a trace of the same prompt; returns the run and the reindex verdicts.
fn check_against_trace(model: &Path, tmp: &Path, depth: u32, k: usize) -> (Value, Vec<String>) {
    let json = probe_json(
        model,
        (depth, 10),
        &[
            "--index",
            "exact",
            "--kv",
            "exact",
            "--topk",
            &k.to_string(),
        ],
    );
    let prompt = &json["prompt"];
    let tokens: Vec<u64> = prompt["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    assert_eq!(tokens.len(), 600);
    let (a, b) = (
        prompt["needle"][0].as_u64().unwrap() as usize,
        prompt["needle"][1].as_u64().unwrap() as usize,
    );
    let run0 = &json["runs"][0];
    assert_eq!(run0["index"], "exact");
    assert_eq!(run0["kv"], "exact");
    let layers = run0["layers"].as_array().unwrap();
    // The same prompt through trace, same chunk and budget.
    let ids = tmp.join("ids.txt");
    let list: Vec<String> = tokens.iter().map(|t| t.to_string()).collect();
    std::fs::write(&ids, list.join(" ")).unwrap();
    let out = tmp.join("t.safetensors");
    run(&[
        "trace",
        "--model",
        &s(model),
        "--tokens",
        &s(&ids),
        "--positions",
        "last",
        "--chunk",
        "128",
        "--candidate-blocks",
        "10",
        "--topk",
        &k.to_string(),
        "--out",
        &s(&out),
    ])
    .ok();
    let bytes = std::fs::read(&out).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (t, block) = (599usize, 8usize);
    let driving = |layer: usize| -> &Value {
        layers
            .iter()
            .find(|r| r["layer"] == layer && r["driving"] == true)
            .unwrap_or_else(|| panic!("no driving record of layer {layer}"))
    };
    let stages: Vec<(usize, &str)> = layers
        .iter()
        .filter(|r| r["driving"] == true)
        .map(|r| {
            (
                r["layer"].as_u64().unwrap() as usize,
                r["stage"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        stages,
        vec![
            (2, "index"),
            (5, "index"),
            (6, "candidate_source"),
            (8, "reindex"),
            (10, "reindex")
        ]
    );
    let mut verdicts = Vec::new();
    for (layer, stage) in stages {
        let rec = driving(layer);
        let (_, scores) = tensor(&st, &format!("layers.{layer}.indexer.scores"));
        let rows = scores.len();
        let ratio = (t + 1) / rows;
        assert_eq!(rec["visible_rows"], rows, "layer {layer}");
        let needle = a / ratio..(b - 1) / ratio + 1;
        let (r, _) = rank(&scores, needle.clone()).unwrap();
        assert_eq!(
            rec["needle_rank"], r,
            "layer {layer}: rank in the scores it ranks"
        );
        assert_eq!(rec["selected"], r <= k, "layer {layer}");
        match stage {
            "candidate_source" => {
                let (_, block_scores) =
                    tensor(&st, &format!("layers.{layer}.candidates.block_scores"));
                let (_, kept) = tensor(&st, &format!("layers.{layer}.candidates.kept_blocks"));
                let pinned = (rows - 1) / block;
                let key = |x: usize| {
                    if x == pinned {
                        f32::INFINITY
                    } else {
                        block_scores[x]
                    }
                };
                let order = |x: usize| {
                    1 + (0..block_scores.len())
                        .filter(|&o| key(o) > key(x) || (o < x && key(o) == key(x)))
                        .count()
                };
                let blocks = needle.start / block..(needle.end - 1) / block + 1;
                let best = blocks.clone().min_by_key(|&x| (order(x), x)).unwrap();
                assert_eq!(rec["block_rank"], order(best), "layer {layer}");
                assert_eq!(rec["block_kept"], kept[best] == 1.0, "layer {layer}");
                assert_eq!(rec["block_kept"], order(best) <= 10);
            }
            "reindex" => {
                let (_, free) =
                    tensor(&st, &format!("layers.{layer}.indexer.scores_unconstrained"));
                let (u, _) = rank(&free, needle.clone()).unwrap();
                assert_eq!(rec["unconstrained_rank"], u, "layer {layer}");
                let in_kept = needle.clone().any(|w| scores[w] > f32::NEG_INFINITY);
                assert_eq!(rec["block_kept"], in_kept, "layer {layer}");
                let verdict = match (in_kept, r <= k) {
                    (false, _) => "candidate_miss",
                    (true, false) => "topk_miss",
                    (true, true) => "kept",
                };
                assert_eq!(rec["stage_verdict"], verdict, "layer {layer}");
                verdicts.push(verdict.to_string());
            }
            _ => assert!(rec["block_rank"].is_null() && rec["stage_verdict"].is_null()),
        }
    }
    (json, verdicts)
}

#[test]
fn probe_v41_ranks_every_stage_as_the_trace_of_the_same_prompt_does() {
    let tmp = tempfile::tempdir().unwrap();
    let model = v41(tmp.path());
    // Budget 10 blocks of 8 rows against 600 rows: at depth 40 the candidate source drops the
    // needle; at depth 10 it keeps it, and top-8 then loses it inside the blocks while top-12
    // keeps it (each a forward of its own: the selections shape the later hidden states).
    let (dropped, verdicts) = check_against_trace(&model, tmp.path(), 40, 64);
    assert_eq!(verdicts, ["candidate_miss", "candidate_miss"]);
    let (_, verdicts) = check_against_trace(&model, tmp.path(), 10, 8);
    assert_eq!(verdicts, ["topk_miss", "topk_miss"]);
    let (_, verdicts) = check_against_trace(&model, tmp.path(), 10, 12);
    assert_eq!(verdicts, ["kept", "kept"]);
    let diagnosis = dropped["diagnosis"].as_str().unwrap();
    assert!(
        diagnosis.contains("stages: the candidate source (layer 6) drops the needle's blocks")
            && diagnosis.contains("index layers"),
        "{diagnosis}"
    );
    let lost = dropped["runs"][0]["lost_layers"].as_array().unwrap();
    assert!(
        lost.iter().any(|l| l["cause"] == "candidate_stage"),
        "{lost:?}"
    );
}

#[test]
fn probe_v41_compares_profiles_through_their_own_candidate_stage_and_records_a_report() {
    let tmp = tempfile::tempdir().unwrap();
    let model = v41(tmp.path());
    let dir = tmp.path().join("report");
    let json = probe_json(
        &model,
        (20, 16),
        &[
            "--compare",
            "bf16-qk,sglang-v41-fp4",
            "--topk",
            "64,128",
            "--out",
            &s(&dir),
        ],
    );
    // Defaults on V4.1: the release's profile and KV rounding; exact scored beside it.
    let run0 = &json["runs"][0];
    assert_eq!(run0["index"], "v41-fp4");
    assert_eq!(run0["kv"], "release");
    assert_eq!(json["runs"].as_array().unwrap().len(), 2);
    let layers = run0["layers"].as_array().unwrap();
    for profile in ["v41-fp4", "exact", "bf16-qk", "sglang-v41-fp4"] {
        let n = layers
            .iter()
            .filter(|r| r["profile"] == profile && r["stage"] == "reindex")
            .count();
        assert_eq!(n, 2, "{profile}: one record per reindex layer");
    }
    // layers.csv has the stage columns, filled on V4.1's rows.
    let csv = std::fs::read_to_string(dir.join("layers.csv")).unwrap();
    let header = csv.lines().next().unwrap();
    assert!(
        header.ends_with("trivial,stage,block_rank,block_kept,unconstrained_rank,stage_verdict"),
        "{header}"
    );
    assert!(csv.contains(",candidate_source,"), "{csv}");
    assert!(csv.contains(",reindex,"));
    let cells = std::fs::read_to_string(dir.join("cells.csv")).unwrap();
    assert_eq!(cells.lines().count(), 3, "{cells}");
    // The directory renders again from its records.
    run(&["report", &s(&dir)]).ok();
    assert!(dir.join("report.html").exists());
    // A second probe with another budget is refused: it shapes the records.
    run(&[
        "probe",
        "--model",
        &s(&model),
        "--length",
        "600",
        "--depth",
        "20",
        "--chunk",
        "128",
        "--candidate-blocks",
        "24",
        "--out",
        &s(&dir),
    ])
    .fails()
    .stderr_has(&["candidate_blocks"]);
}

#[test]
fn probe_v41_refuses_what_it_cannot_run_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let model = v41(tmp.path());
    let base = ["probe", "--model", &s(&model), "--length", "300"];
    let with = |extra: &[&str]| {
        let mut a: Vec<String> = base.iter().map(|x| x.to_string()).collect();
        a.extend(extra.iter().map(|x| x.to_string()));
        run(&a)
    };
    with(&["--index", "fp8"])
        .fails()
        .stderr_has(&["--index fp8", "DeepSeek-V4.1 rotates neither"]);
    with(&["--compare", "sglang-fp4"])
        .fails()
        .stderr_has(&["--compare sglang-fp4"]);
    with(&["--kv", "fp8"])
        .fails()
        .stderr_has(&["--kv fp8", "exact or release"]);
    with(&["--device", "cuda"])
        .fails()
        .stderr_has(&["--device cuda", "CPU reference only"]);
    let capture = tmp.path().join("capture.json");
    std::fs::write(&capture, "{}").unwrap();
    with(&["--engine-capture", &s(&capture)])
        .fails()
        .stderr_has(&["--engine", "DeepSeek-V4.1"]);
    with(&["--candidate-blocks", "4"])
        .fails()
        .stderr_has(&["candidate-blocks", "at least 8 blocks"]);
    // DeepSeek-V4 has no candidate stage.
    let tiny = tmp.path().join("tiny");
    cli_support::synth_tiny(&tiny, &[]).ok();
    run(&[
        "probe",
        "--model",
        &s(&tiny),
        "--length",
        "300",
        "--candidate-blocks",
        "16",
    ])
    .fails()
    .stderr_has(&["--candidate-blocks 16", "not a DeepSeek-V4.1 model"]);
    // Nor DeepSeek-V4.1's index profiles.
    run(&[
        "probe",
        "--model",
        &s(&tiny),
        "--length",
        "300",
        "--index",
        "sglang-v41-fp4",
    ])
    .fails()
    .stderr_has(&["sglang-v41-fp4"]);
}

#[test]
fn sweep_v41_records_a_resumable_grid_with_the_stage_columns() {
    let tmp = tempfile::tempdir().unwrap();
    let model = v41(tmp.path());
    let dir = tmp.path().join("grid");
    let sweep = |blocks: &str| {
        run(&[
            "sweep",
            "--model",
            &s(&model),
            "--lengths",
            "300,600",
            "--depths",
            "10,60",
            "--candidate-blocks",
            blocks,
            "--chunk",
            "128",
            "--out",
            &s(&dir),
        ])
    };
    let first = sweep("10").ok().stdout_has(&[
        "4 cells run, 0 already finished",
        "v41-fp4",
        "worst index rank",
        "index lost (worst cell)",
        "non-trivial index layers (n_t > k)",
    ]);
    // The text names V4.1's index layers, never V4's CSA layers.
    assert!(!first.stdout.contains("CSA"), "{}", first.stdout);
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(html.contains("<th>index lost</th>"), "{html}");
    assert!(!html.contains("CSA"), "{html}");
    let cells = std::fs::read_to_string(dir.join("cells.csv")).unwrap();
    assert_eq!(cells.lines().count(), 5, "{cells}");
    assert!(cells.contains(",v41-fp4,release,64,"), "{cells}");
    let layers = std::fs::read_to_string(dir.join("layers.csv")).unwrap();
    for stage in [",index,", ",candidate_source,", ",reindex,"] {
        assert!(layers.contains(stage), "{stage}");
    }
    let info: Value =
        serde_json::from_slice(&std::fs::read(dir.join("run.json")).unwrap()).unwrap();
    assert_eq!(info["sweep_args"]["candidate_blocks"], 10);
    assert!(dir.join("heatmap_v41-fp4_64.png").exists());
    // Resumed: nothing to run; another budget shapes other records and is refused.
    sweep("10")
        .ok()
        .stdout_has(&["0 cells run, 4 already finished"]);
    sweep("16").fails().stderr_has(&["candidate_blocks"]);
    // DeepSeek-V4 has no candidate stage.
    let tiny = tmp.path().join("tiny");
    cli_support::synth_tiny(&tiny, &[]).ok();
    run(&[
        "sweep",
        "--model",
        &s(&tiny),
        "--lengths",
        "300",
        "--candidate-blocks",
        "16",
        "--out",
        &s(&tmp.path().join("v4grid")),
    ])
    .fails()
    .stderr_has(&["--candidate-blocks 16", "not a DeepSeek-V4.1 model"]);
}
