//! End to end through the binary on the planted synthetic model (real vocabulary and
//! tokenizer): `probe` (JSON shape, ranks consistent with selection and with `trace` scores on
//! the same prompt; `--out` report directories), `sweep` (resume after a kill gives the same records as an uninterrupted
//! run; refusal to resume with other arguments or other weights) and `demo` on a reduced grid.

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

use needlescope_testkit::planted as planted_support;
use planted_support::{bin, ok, planted};

fn probe_json(extra: &[&str]) -> Value {
    let mut json = vec!["--json"];
    json.extend_from_slice(extra);
    serde_json::from_str(&probe_text(&json)).expect("probe --json prints one JSON object")
}

/// The stdout of a passkey probe on the planted model with exact KV and `extra`.
fn probe_text(extra: &[&str]) -> String {
    let out = bin()
        .arg("probe")
        .arg("--model")
        .arg(planted())
        .args(["--scenario", "passkey", "--kv", "exact"])
        .args(extra)
        .output()
        .unwrap();
    ok(out, "probe")
}

#[test]
fn probe_json_has_design_fields_and_ranks_agree_with_selection() {
    let v = probe_json(&[
        "--length",
        "2k",
        "--depth",
        "40",
        "--index",
        "fp8,bf16",
        "--topk",
        "64,128",
        "--compare",
        "exact",
        "--generate",
        "2",
    ]);
    let prompt = &v["prompt"];
    assert_eq!(prompt["length"], 2048);
    assert_eq!(prompt["tokens"].as_array().unwrap().len(), 2048);
    let needle: Vec<u64> = serde_json::from_value(prompt["needle"].clone()).unwrap();
    let answer: Vec<u64> = serde_json::from_value(prompt["answer_span"].clone()).unwrap();
    assert!(
        prompt.get("answer").is_none(),
        "the span is named answer_span"
    );
    assert!(
        needle[0] <= answer[0] && answer[1] <= needle[1],
        "answer inside needle"
    );
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4, "one run per (index, top-k)");
    let fields = [
        "cell_id",
        "layer",
        "query_pos",
        "phase",
        "profile",
        "driving",
        "needle",
        "visible_rows",
        "needle_rows",
        "needle_rank",
        "rank_ties",
        "needle_score",
        "kth_score",
        "margin",
        "selected",
        "trivial",
        "stage",
        "block_rank",
        "block_kept",
        "unconstrained_rank",
        "stage_verdict",
    ];
    for run in runs {
        assert!(
            run["answer_correct"].is_null(),
            "planted model: judged by the indexer"
        );
        let topk = run["topk"].as_u64().unwrap();
        let layers = run["layers"].as_array().unwrap();
        // Two CSA layers x (driving + the other --index profile + exact) at the last prompt
        // token.
        let at_answer: Vec<&Value> = layers.iter().filter(|r| r["query_pos"] == 2047).collect();
        assert_eq!(at_answer.len(), 6, "{run}");
        for r in layers {
            let obj = r.as_object().unwrap();
            let keys: Vec<&str> = obj.keys().map(|k| k.as_str()).collect();
            for f in fields {
                assert!(keys.contains(&f), "layer record lacks {f}: {r}");
            }
            assert_eq!(
                obj.len(),
                fields.len(),
                "exactly the layers.csv fields: {r}"
            );
            if let Some(rank) = r["needle_rank"].as_u64() {
                let ties = r["rank_ties"].as_u64().unwrap();
                let selected = r["selected"].as_bool().unwrap();
                assert_eq!(selected, rank <= topk, "selected iff rank <= k: {r}");
                if ties == 0 {
                    let margin = r["margin"].as_f64().unwrap();
                    assert_eq!(
                        margin >= 0.0,
                        selected,
                        "margin sign matches selection: {r}"
                    );
                }
            }
            assert_eq!(
                r["visible_rows"],
                (r["query_pos"].as_u64().unwrap() + 1) / 4
            );
        }
        // The attention.csv records too: every layer at each probed position, the masses
        // shares of the softmax.
        let attention = run["attention"].as_array().unwrap();
        let layers_at_answer = attention.iter().filter(|a| a["query_pos"] == 2047).count();
        assert_eq!(layers_at_answer, 4, "every layer of planted at 2047: {run}");
        for a in attention {
            assert_eq!(a.as_object().unwrap().len(), 9, "attention.csv fields: {a}");
            assert_eq!(a["cell_id"], run["cell_id"]);
            let mass = a["needle_mass_mean"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&mass), "{a}");
        }
        // Why: one lost_layers entry per driving record at the answer position that is
        // non-trivial and unselected, its cause read from the exact record of the same layer.
        let lost = run["lost_layers"].as_array().unwrap();
        let driving_lost: Vec<&&Value> = at_answer
            .iter()
            .filter(|r| r["driving"] == true && r["trivial"] == false && r["selected"] == false)
            .collect();
        assert_eq!(lost.len(), driving_lost.len(), "{run}");
        for (l, d) in lost.iter().zip(&driving_lost) {
            assert_eq!(l["layer"], d["layer"]);
            assert_eq!(l["rank"], d["needle_rank"]);
            let exact = at_answer
                .iter()
                .find(|r| r["layer"] == d["layer"] && r["profile"] == "exact")
                .unwrap();
            assert_eq!(l["exact_rank"], exact["needle_rank"]);
            let cause = if exact["selected"] == true {
                "rounding"
            } else {
                "exact_loses"
            };
            assert_eq!(l["cause"], cause, "{l}");
        }
        // Nothing lost: no why, unless a selected needle ties rows across the cut-off.
        if lost.is_empty() {
            assert!(
                run["why"].is_null() || run["why"].as_str().unwrap().contains("tie order"),
                "{run}"
            );
        } else {
            assert!(run["why"].is_string(), "{run}");
        }
    }
}

/// At 16k on planted, fp8 keys at top-64 lose the needle on both CSA layers, for two different
/// reasons that `--compare exact` tells apart: on layer 3 the exact math keeps it (rounding);
/// on layer 1 the exact math loses it too (top-k too small). JSON and text say the same.
#[test]
fn probe_why_tells_rounding_from_a_small_topk() {
    let args = [
        "--length",
        "16k",
        "--depth",
        "50",
        "--index",
        "fp8",
        "--topk",
        "64",
        "--compare",
        "exact,bf16",
        "--generate",
        "0",
    ];
    let v = probe_json(&args);
    let run = &v["runs"][0];
    let last = v["prompt"]["length"].as_u64().unwrap() - 1;
    let lost = run["lost_layers"].as_array().unwrap();
    let causes: Vec<(u64, &str)> = lost
        .iter()
        .map(|l| (l["layer"].as_u64().unwrap(), l["cause"].as_str().unwrap()))
        .collect();
    assert_eq!(causes, [(1, "exact_loses"), (3, "rounding")], "{run}");
    for l in lost {
        let record = |profile: &str| {
            run["layers"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| {
                    r["query_pos"] == last && r["layer"] == l["layer"] && r["profile"] == profile
                })
                .unwrap()
                .clone()
        };
        assert_eq!(l["rank"], record("fp8")["needle_rank"]);
        assert_eq!(l["exact_rank"], record("exact")["needle_rank"]);
        let kept: Vec<&str> = l["kept_by"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["profile"].as_str().unwrap())
            .collect();
        for profile in ["exact", "bf16"] {
            assert_eq!(
                kept.contains(&profile),
                record(profile)["selected"] == true,
                "{profile}: {l}"
            );
        }
    }
    let why = run["why"].as_str().unwrap();
    assert!(
        why.starts_with("fp8 rounding lost layer 3 (exact keeps it"),
        "{why}"
    );
    assert_eq!(
        v["conclusion"],
        "needle lost on 2/2 CSA layers under fp8 at top-64 (exact keeps 1)"
    );
    assert!(why.contains("the exact math loses layer 1 too"), "{why}");

    let text = probe_text(&args);
    assert!(text.contains(&format!("\nwhy: {why}\n")), "{text}");

    // The sweep's line for the same cell says how many lost layers the exact math keeps.
    let dir = tempfile::tempdir().unwrap();
    let out = bin()
        .arg("sweep")
        .arg("--model")
        .arg(planted())
        .args([
            "--scenario",
            "passkey",
            "--kv",
            "exact",
            "--lengths",
            "16k",
            "--depths",
            "50",
        ])
        .args([
            "--index",
            "fp8",
            "--topk",
            "64",
            "--compare",
            "exact",
            "--generate",
            "0",
        ])
        .arg("--out")
        .arg(dir.path().join("sweep"))
        .output()
        .unwrap();
    let text = ok(out, "sweep");
    assert!(text.contains("lost 2/2 layers"), "{text}");
    assert!(text.contains("exact keeps 1\n"), "{text}");
    // cells.csv says the same without the layers: not recalled, exact keeps 1, sample 0.
    let cells = std::fs::read_to_string(dir.path().join("sweep/cells.csv")).unwrap();
    let mut rdr = csv::Reader::from_reader(cells.as_bytes());
    let head = rdr.headers().unwrap().clone();
    let row = rdr.records().next().unwrap().unwrap();
    let get = |name: &str| {
        row.get(head.iter().position(|h| h == name).unwrap())
            .unwrap()
    };
    assert_eq!(
        (get("recalled"), get("exact_keeps"), get("sample")),
        ("false", "1", "0"),
        "{cells}"
    );
}

/// The probe's text explains itself: a one-sentence diagnosis first (which profile and
/// top-k lose the needle where, and whether the exact math keeps it), the tables, then a
/// legend of their columns; `exact` is scored when a rounding profile drives without it.
#[test]
fn probe_text_starts_with_a_diagnosis_and_scores_exact_without_being_asked() {
    let args = [
        "--length",
        "16k",
        "--depth",
        "50",
        "--index",
        "fp8,bf16",
        "--topk",
        "64,128",
        "--generate",
        "0",
    ];
    let v = probe_json(&args);
    let diagnosis = v["diagnosis"].as_str().unwrap();
    assert!(
        diagnosis.starts_with(
            "fp8 at top-64 loses the needle on layers 1, 3 (2 of 2 non-trivial CSA layers): \
             the exact math keeps layer 3 (fp8 rounding) and loses layer 1 too (top-64 is too \
             small there); fp8 at top-128 loses"
        ),
        "{diagnosis}"
    );
    assert!(
        diagnosis.contains(
            "bf16 at top-64 loses the needle on layer 1 (1 of 2 non-trivial CSA layers): the \
             exact math loses layer 1 too (top-64 is too small there)"
        ) && diagnosis.ends_with("bf16 at top-128 keeps the needle on both non-trivial CSA layers"),
        "{diagnosis}"
    );
    // exact was not asked for and is scored: every run has its rows and a cause per layer.
    for run in v["runs"].as_array().unwrap() {
        let profiles: std::collections::BTreeSet<&str> = run["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["profile"].as_str().unwrap())
            .collect();
        assert_eq!(
            profiles,
            ["bf16", "exact", "fp8"].into(),
            "{}",
            run["cell_id"]
        );
        for lost in run["lost_layers"].as_array().unwrap() {
            let cause = lost["cause"].as_str().unwrap();
            assert!(cause == "rounding" || cause == "exact_loses", "{lost}");
        }
    }
    let text = probe_text(&args);
    let lines: Vec<&str> = text.lines().collect();
    // After the synthetic-model line, before the prompt and the tables.
    assert_eq!(lines[1], format!("diagnosis: {diagnosis}"), "{text}");
    assert!(lines[2].starts_with("scenario passkey"), "{text}");
    assert!(text.contains("rank[exact]"), "{text}");
    let legend = text
        .find("\nlegend: visible: compressed rows")
        .expect("a legend");
    let last_table = text.rfind("\n== index").unwrap();
    let attention = text.find("\nattention on the needle").unwrap();
    assert!(last_table < legend && legend < attention, "{text}");
    for term in [
        "needle: ",
        "rank[p]: ",
        "margin: ",
        "selected: ",
        "trivial: ",
    ] {
        assert!(text[legend..attention].contains(term), "{term}: {text}");
    }
    // Driving exact, or exact compared: not scored twice.
    let v = probe_json(&[
        "--length",
        "2k",
        "--index",
        "exact",
        "--topk",
        "64",
        "--generate",
        "0",
    ]);
    let profiles: std::collections::BTreeSet<&str> = v["runs"][0]["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["profile"].as_str().unwrap())
        .collect();
    assert_eq!(profiles, ["exact"].into());
}

#[test]
fn probe_ranks_match_trace_scores_on_the_same_prompt() {
    let v = probe_json(&[
        "--length",
        "1k",
        "--depth",
        "60",
        "--index",
        "exact",
        "--topk",
        "64",
        "--generate",
        "0",
    ]);
    let tokens: Vec<u64> = serde_json::from_value(v["prompt"]["tokens"].clone()).unwrap();
    let needle: Vec<usize> = serde_json::from_value(v["prompt"]["needle"].clone()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ids = dir.path().join("ids.txt");
    std::fs::write(
        &ids,
        tokens
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(" "),
    )
    .unwrap();
    let trace = dir.path().join("trace.safetensors");
    ok(
        bin()
            .arg("trace")
            .arg("--model")
            .arg(planted())
            .arg("--tokens")
            .arg(&ids)
            .args([
                "--positions",
                "last",
                "--index",
                "exact",
                "--topk",
                "64",
                "--out",
            ])
            .arg(&trace)
            .output()
            .unwrap(),
        "trace",
    );
    let bytes = std::fs::read(&trace).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let last = tokens.len() - 1;
    let visible = (last + 1) / 4;
    let (a, b) = (needle[0], needle[1]);
    let needle_rows: Vec<usize> = (a / 4..=(b - 1) / 4 + 1).filter(|&w| w < visible).collect();
    let records = v["runs"][0]["layers"].as_array().unwrap();
    let mut compared = 0;
    for r in records
        .iter()
        .filter(|r| r["query_pos"] == last as u64 && r["driving"] == true)
    {
        let layer = r["layer"].as_u64().unwrap();
        let scores: Vec<f32> = st
            .tensor(&format!("layers.{layer}.indexer.scores"))
            .unwrap()
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let best = needle_rows
            .iter()
            .map(|&w| scores[w])
            .fold(f32::NEG_INFINITY, f32::max);
        let rank = 1 + scores[..visible].iter().filter(|&&s| s > best).count();
        assert_eq!(
            r["needle_rank"].as_u64().unwrap() as usize,
            rank,
            "layer {layer}: probe vs trace"
        );
        assert_eq!(
            r["needle_rows"].as_u64().unwrap() as usize,
            needle_rows.len()
        );
        compared += 1;
    }
    assert_eq!(compared, 2, "both CSA layers compared");
}

fn probe_out(out: &Path, extra: &[&str]) -> Output {
    bin()
        .arg("probe")
        .arg("--model")
        .arg(planted())
        .args([
            "--length",
            "512",
            "--kv",
            "exact",
            "--generate",
            "0",
            "--topk",
            "64",
        ])
        .arg("--out")
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

/// `probe --out` writes a report directory (run.json, summary.json: `report` reads it); probes
/// with the same shared arguments add their cells, an identical one adds nothing, and one with
/// another seed, or into a sweep's directory, is refused before it runs.
#[test]
fn probe_out_is_a_report_directory_shared_only_by_like_probes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("probes");
    let first = probe_out(&out, &["--depth", "25"]);
    // The probe says where its report went (on stderr: stdout may be --json).
    let said = String::from_utf8_lossy(&first.stderr).to_string();
    assert!(
        said.contains(&format!(
            "wrote in {}: summary.json, report.html, rank_vs_length.png",
            out.display()
        )),
        "{said}"
    );
    ok(first, "first probe");
    for f in [
        "run.json",
        "cells.csv",
        "layers.csv",
        "summary.json",
        "report.html",
    ] {
        assert!(out.join(f).exists(), "{f} missing");
    }
    ok(probe_out(&out, &["--depth", "75"]), "second depth");
    let again = probe_out(&out, &["--depth", "75"]);
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already recorded"),
        "{again:?}"
    );
    ok(again, "the same probe again");
    let cells = std::fs::read_to_string(out.join("cells.csv")).unwrap();
    assert_eq!(cells.lines().count(), 3, "header + two cells: {cells}");
    ok(bin().arg("report").arg(&out).output().unwrap(), "report");

    let refused = probe_out(&out, &["--depth", "25", "--seed", "3"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(stderr.contains("sweep_args.seed"), "{stderr}");
    // Probes do not resume: they add cells to a directory of the same settings (issue 30).
    assert!(stderr.contains("refusing to add cells to"), "{stderr}");
    assert!(!stderr.contains("resume"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(out.join("cells.csv")).unwrap(),
        cells
    );

    let sweep_dir = dir.path().join("sweep");
    ok(sweep(&sweep_dir, "64").output().unwrap(), "sweep");
    let refused = probe_out(&sweep_dir, &[]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    // One reason, the writing command, not every argument the two plans do not share.
    assert!(
        stderr.contains(
            "it differs in command: expected \"sweep\" (run.json), found \"probe\" (this run);"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("sweep_args"), "{stderr}");
}

/// `probe --json` records are the report directory's rows: with `--out` in the same run,
/// every layers.csv and attention.csv field reads back equal to its JSON value, scores and
/// masses included (an f32 printed as the CSV prints it, not widened to 17 f64 digits).
#[test]
fn probe_json_records_equal_the_csv_rows_written_with_them() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("probes");
    let stdout = ok(
        probe_out(&out, &["--depth", "40", "--compare", "exact", "--json"]),
        "probe --json --out",
    );
    let v: Value = serde_json::from_str(&stdout).expect("one JSON object");
    let run = &v["runs"][0];
    for (file, key) in [("layers.csv", "layers"), ("attention.csv", "attention")] {
        let mut reader = csv::Reader::from_path(out.join(file)).unwrap();
        let header = reader.headers().unwrap().clone();
        let records = run[key].as_array().unwrap();
        let rows: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
        assert_eq!(rows.len(), records.len(), "{file}: one row per JSON record");
        for (row, rec) in rows.iter().zip(records) {
            for (name, text) in header.iter().zip(row.iter()) {
                let json = &rec[name];
                let same = match json {
                    Value::Null => text.is_empty(),
                    Value::String(s) => s == text,
                    Value::Bool(b) => b.to_string() == text,
                    // The CSV's text, read as a JSON number, is the JSON's number exactly.
                    Value::Number(_) => {
                        serde_json::from_str::<Value>(text).ok().as_ref() == Some(json)
                    }
                    _ => false,
                };
                assert!(same, "{file} {name}: CSV {text:?}, JSON {json}");
            }
        }
    }
}

/// A grid that would fail or repeat cells midway is refused before anything runs or is
/// written: a length too short for the scenario or past the model's positions (after finished
/// cells, before), a profile named twice through an alias, a top-k given twice; likewise a
/// probe's repeated `--compare`.
#[test]
fn sweep_and_probe_refuse_bad_grids_up_front() {
    let dir = tempfile::tempdir().unwrap();
    for (i, (flags, expected)) in [
        (
            &["--lengths", "512,10", "--depths", "50"][..],
            "--lengths 10: ",
        ),
        (
            &["--lengths", "512,2m", "--depths", "50"][..],
            "--lengths 2097152",
        ),
        (
            &["--index", "fp8,sglang-fp8", "--depths", "50"][..],
            "--index: expected each value once",
        ),
        (
            &["--topk", "8,8", "--depths", "50"][..],
            "--topk: expected each value once, found 8 twice",
        ),
        (
            &["--depths", "50,50"][..],
            "--depths: expected each value once",
        ),
        (
            &["--topk", "64,100000000", "--depths", "50"][..],
            "--topk 100000000: expected at most 262144",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let out = dir.path().join(format!("grid{i}"));
        let run = bin()
            .arg("sweep")
            .arg("--model")
            .arg(planted())
            .args(["--kv", "exact", "--generate", "0", "--out"])
            .arg(&out)
            .args(flags)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(!run.status.success(), "{flags:?}: {stderr}");
        assert!(stderr.contains(expected), "{flags:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(!out.join("run.json").exists(), "{flags:?}: nothing written");
    }
    let run = bin()
        .arg("probe")
        .arg("--model")
        .arg(planted())
        .args(["--length", "512", "--compare", "exact,exact"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert!(
        stderr.contains("--compare: expected each value once, found exact twice"),
        "{stderr}"
    );
    // A --compare profile that is also an --index one adds nothing: said, not refused (a
    // report directory started so must still resume).
    let run = bin()
        .arg("probe")
        .arg("--model")
        .arg(planted())
        .args([
            "--length",
            "512",
            "--index",
            "fp8",
            "--compare",
            "sglang-fp8,exact",
        ])
        .args(["--generate", "0", "--kv", "exact"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "note: --compare fp8: also among the --index profiles, each of which every run \
             scores already; nothing is added"
        ),
        "{stderr}"
    );
    // A top-k past every row the model can have: refused, not an allocation abort.
    let run = bin()
        .arg("probe")
        .arg("--model")
        .arg(planted())
        .args(["--length", "512", "--topk", "1000000000000"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--topk 1000000000000: expected at most 262144"),
        "{stderr}"
    );
}

/// `--haystack-file` feeds scenarios of haystack kind `file` (the built-in `essay`) in probe and
/// sweep; without it they say which flag to pass; a sweep resumed with another file's text is
/// refused (the scenario fingerprint covers the file's content).
#[test]
fn essay_scenario_runs_with_a_haystack_file() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("essay.txt");
    let sentences: Vec<String> = (0..400)
        .map(|i| format!("Paragraph {i} considers how rivers shape the valleys they cross."))
        .collect();
    std::fs::write(&text, sentences.join(" ")).unwrap();
    let probe = |extra: &[&str]| {
        bin()
            .arg("probe")
            .arg("--model")
            .arg(planted())
            .args(["--scenario", "essay", "--length", "512", "--kv", "exact"])
            .args(["--generate", "0", "--topk", "64"])
            .args(extra)
            .output()
            .unwrap()
    };
    let missing = probe(&[]);
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success());
    assert!(stderr.contains("--haystack-file"), "{stderr}");
    let clean = probe(&["--haystack-file", text.to_str().unwrap()]);
    assert!(
        !String::from_utf8_lossy(&clean.stderr).contains("note: --haystack-file"),
        "{clean:?}"
    );
    ok(clean, "essay probe");
    // Numbers shaped like the pass key (7 digits; not 6, not 8, not inside a longer run) are
    // named: the model could answer with one.
    let numbered = dir.path().join("numbered.txt");
    let mut with_numbers = sentences.clone();
    with_numbers[3] = "Call 5551234 or 555123 or 55512345 or 1234567.".into();
    with_numbers[9] = "The code was 7654321.".into();
    std::fs::write(&numbered, with_numbers.join(" ")).unwrap();
    let warned = probe(&["--haystack-file", numbered.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&warned.stderr).to_string();
    assert!(
        stderr.contains(
            "holds 3 7-digit numbers (5551234, 1234567, 7654321), shaped like the needle's answer"
        ),
        "{stderr}"
    );
    ok(warned, "essay probe with numbers in the text");

    let out = dir.path().join("essay-sweep");
    let sweep = |file: &Path| {
        bin()
            .arg("sweep")
            .arg("--model")
            .arg(planted())
            .args(["--scenario", "essay", "--lengths", "512", "--depths", "50"])
            .args(["--kv", "exact", "--generate", "0", "--topk", "64"])
            .arg("--haystack-file")
            .arg(file)
            .arg("--out")
            .arg(&out)
            .output()
            .unwrap()
    };
    ok(sweep(&text), "essay sweep");
    // The same bytes by another path (a copy elsewhere) resume: the file counts by content.
    let copy_dir = dir.path().join("elsewhere");
    std::fs::create_dir(&copy_dir).unwrap();
    let copy = copy_dir.join("essay-copy.txt");
    std::fs::copy(&text, &copy).unwrap();
    let resumed = ok(sweep(&copy), "essay sweep resumed with a copy of the file");
    assert!(
        resumed.contains("1 of 1 cells already finished"),
        "{resumed}"
    );
    let other = dir.path().join("other.txt");
    std::fs::write(&other, sentences.join(" ").replace("rivers", "glaciers")).unwrap();
    let refused = sweep(&other);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(stderr.contains("scenario_fingerprint"), "{stderr}");
}

/// Every prompt of a sweep's grid is built before the first cell runs: a prompt that cannot be
/// built (here the second sample's, whose every value the haystack file holds) is refused up
/// front, naming its cell, with nothing written, rather than stopping the sweep at that cell
/// on every resume.
#[test]
fn a_sweep_refuses_an_unbuildable_prompt_of_any_cell_before_running() {
    let dir = tempfile::tempdir().unwrap();
    let essay = needlescope::probe::scenario::Scenario::load("essay").unwrap();
    let trapped: Vec<String> = (0..8).map(|d| essay.generate_value_draw(6, d).0).collect();
    let text: Vec<String> = (0..240)
        .map(|i| format!("Ledger {i} lists code {} in blue ink.", trapped[i % 8]))
        .collect();
    let file = dir.path().join("trap.txt");
    std::fs::write(&file, text.join(" ")).unwrap();
    let out = dir.path().join("sweep");
    let run = bin()
        .arg("sweep")
        .arg("--model")
        .arg(planted())
        .args([
            "--scenario",
            "essay",
            "--lengths",
            "512",
            "--depths",
            "0,50",
        ])
        .args([
            "--samples",
            "2",
            "--seed",
            "5",
            "--kv",
            "exact",
            "--generate",
            "0",
        ])
        .args(["--topk", "64", "--haystack-file"])
        .arg(&file)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the prompt of length 512 at depth 0%, sample 1 (seed 6)")
            && stderr.contains("each of the 8 values drawn for this seed"),
        "{stderr}"
    );
    assert!(
        !out.join("cells.csv").exists(),
        "a cell ran before the refusal"
    );
}

/// The text report shows every probed position, not only the answer position: question tokens
/// (`--probe question`) and decode steps, consecutive ones with the same figures on one line.
#[test]
fn probe_text_lists_question_and_decode_positions() {
    let run = |extra: &[&str]| {
        ok(
            bin()
                .arg("probe")
                .arg("--model")
                .arg(planted())
                .args(["--length", "512", "--kv", "exact", "--topk", "64"])
                .args(extra)
                .output()
                .unwrap(),
            "probe",
        )
    };
    let plain = run(&["--generate", "0"]);
    assert!(!plain.contains("other probed positions"), "{plain}");
    let text = run(&["--generate", "2", "--probe", "question"]);
    let table: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("other probed positions"))
        .skip(2)
        .take_while(|l| !l.trim().is_empty())
        .collect();
    let phases: Vec<&str> = table
        .iter()
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    assert!(
        phases.contains(&"prompt") && phases.contains(&"1"),
        "{text}"
    );
    assert!(
        table.iter().all(|l| l.split_whitespace().count() == 4),
        "{text}"
    );
    // Consecutive positions with the same figures share a line: the lines' query spans cover
    // exactly the probed positions the header counts, in order, decode phases in step.
    let text = run(&["--generate", "8"]);
    let header = text
        .lines()
        .find(|l| l.starts_with("other probed positions"))
        .unwrap();
    let count: usize = header["other probed positions (".len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let span = |s: &str| -> (usize, usize) {
        match s.split_once('-') {
            Some((a, b)) => (a.parse().unwrap(), b.parse().unwrap()),
            None => (s.parse().unwrap(), s.parse().unwrap()),
        }
    };
    let lines: Vec<Vec<&str>> = text
        .lines()
        .skip_while(|l| !l.starts_with("other probed positions"))
        .skip(2)
        .take_while(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect();
    let mut covered = 0;
    let mut next = 512;
    for l in &lines {
        let (a, b) = span(l[0]);
        let (p, q) = span(l[1]);
        assert_eq!((a, b - a), (next, q - p), "{text}");
        assert_eq!(
            p,
            a - 511,
            "decode step = position - last prompt position: {text}"
        );
        covered += b - a + 1;
        next = b + 1;
    }
    assert_eq!((covered, count), (7, 7), "{text}");
    assert!(
        lines.len() < count,
        "identical decode rows share a line: {text}"
    );
}

fn sweep(out: &Path, topk: &str) -> Command {
    sweep_on(planted(), out, topk)
}

fn sweep_on(model: &Path, out: &Path, topk: &str) -> Command {
    let mut c = bin();
    c.arg("sweep")
        .arg("--model")
        .arg(model)
        .args([
            "--lengths",
            "512,1k",
            "--depths",
            "25,75",
            "--index",
            "fp8,bf16",
            "--topk",
            topk,
        ])
        .args(["--kv", "exact", "--generate", "0", "--out"])
        .arg(out);
    c
}

/// cells.csv without the wall-clock column, layers.csv and attention.csv as they are.
fn records(dir: &Path) -> (Vec<String>, String, String) {
    let cells = std::fs::read_to_string(dir.join("cells.csv")).unwrap();
    let mut rdr = csv::Reader::from_reader(cells.as_bytes());
    let headers = rdr.headers().unwrap().clone();
    let wall = headers.iter().position(|h| h == "wall_seconds").unwrap();
    let mut rows: Vec<String> = rdr
        .records()
        .map(|r| {
            let r = r.unwrap();
            r.iter()
                .enumerate()
                .filter(|(i, _)| *i != wall)
                .map(|(_, f)| f)
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect();
    rows.sort();
    let read_sorted = |name: &str| {
        let text = std::fs::read_to_string(dir.join(name)).unwrap();
        let mut lines: Vec<&str> = text.lines().collect();
        lines.sort();
        lines.join("\n")
    };
    (
        rows,
        read_sorted("layers.csv"),
        read_sorted("attention.csv"),
    )
}

#[test]
fn sweep_resumed_after_a_kill_equals_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let whole = dir.path().join("whole");
    ok(sweep(&whole, "64").output().unwrap(), "uninterrupted sweep");

    // Kill the second run once at least one cell (and maybe part of another) is on disk.
    let killed = dir.path().join("killed");
    let mut child = sweep(&killed, "64")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    loop {
        let lines =
            std::fs::read_to_string(killed.join("cells.csv")).map_or(0, |t| t.lines().count());
        if lines >= 3 || started.elapsed().as_secs() > 120 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    let out = ok(sweep(&killed, "64").output().unwrap(), "resumed sweep");
    assert!(out.contains("already finished"), "{out}");

    let (a_cells, a_layers, a_attn) = records(&whole);
    let (b_cells, b_layers, b_attn) = records(&killed);
    assert_eq!(a_cells.len(), 2 * 2 * 2, "every cell once");
    assert_eq!(a_cells, b_cells, "cells.csv (wall time aside)");
    assert_eq!(a_layers, b_layers, "layers.csv");
    assert_eq!(a_attn, b_attn, "attention.csv");
    for png in [
        "heatmap_fp8_64.png",
        "heatmap_bf16_64.png",
        "rank_vs_length.png",
        "report.html",
    ] {
        assert!(killed.join(png).exists(), "{png}");
    }

    // Same directory, arguments that would change finished cells: refused, naming each.
    let refused = sweep(&killed, "64")
        .args(["--seed", "7", "--compare", "exact"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        stderr.contains("sweep_args.seed") && stderr.contains("sweep_args.compare"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");

    // Same arguments and config, other weights (another seed): refused too, and nothing added.
    let other = dir.path().join("planted-seed-1");
    ok(
        bin()
            .args([
                "synth", "--preset", "planted", "--format", "bf16", "--seed", "1",
            ])
            .arg("--out")
            .arg(&other)
            .output()
            .unwrap(),
        "synth planted seed 1",
    );
    assert_eq!(
        std::fs::read(other.join("config.json")).unwrap(),
        std::fs::read(planted().join("config.json")).unwrap(),
        "the seed changes the weights only"
    );
    let refused = sweep_on(&other, &killed, "64").output().unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(stderr.contains("model_fingerprint"), "{stderr}");
    assert_eq!(records(&killed), (b_cells, b_layers, b_attn));
}

/// A sweep rerun on its directory with another top-k (or length, depth, profile, sample count)
/// grows the grid: the finished cells stay byte for byte, only the new ones run, and the
/// directory then holds what one sweep of the grown grid writes; run.json records the union.
#[test]
fn a_sweep_grid_grows_computing_only_the_new_cells() {
    let dir = tempfile::tempdir().unwrap();
    let grown = dir.path().join("grown");
    ok(sweep(&grown, "64").output().unwrap(), "sweep at top-64");
    let before = std::fs::read_to_string(grown.join("cells.csv")).unwrap();
    let out = ok(sweep(&grown, "128,64").output().unwrap(), "the grid grown");
    assert!(
        out.contains("the grid grows (topks + 128)")
            && out.contains("resuming")
            && out.contains("8 of 16 cells already finished")
            && out.contains("8 cells run, 8 already finished"),
        "{out}"
    );
    let after = std::fs::read_to_string(grown.join("cells.csv")).unwrap();
    assert!(
        after.starts_with(&before),
        "finished rows kept as they were"
    );
    let run: Value =
        serde_json::from_str(&std::fs::read_to_string(grown.join("run.json")).unwrap()).unwrap();
    assert_eq!(run["sweep_args"]["topks"], serde_json::json!([64, 128]));
    let whole = dir.path().join("whole");
    ok(
        sweep(&whole, "64,128").output().unwrap(),
        "the whole grid at once",
    );
    assert_eq!(records(&grown), records(&whole));
    assert!(grown.join("heatmap_fp8_128.png").exists());
    // Both invocations that wrote cells are recorded, in order, and the page shows them.
    let lines = run["command_lines"]
        .as_array()
        .expect("command_lines")
        .clone();
    assert_eq!(lines.len(), 2, "{lines:?}");
    let topk_of = |line: &Value| {
        let args: Vec<&str> = line
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let i = args.iter().position(|a| *a == "--topk").unwrap();
        args[i + 1].to_string()
    };
    assert_eq!(
        (topk_of(&lines[0]), topk_of(&lines[1])),
        ("64".into(), "128,64".into())
    );
    assert_eq!(run["command_line"], lines[0]);
    let html = std::fs::read_to_string(grown.join("report.html")).unwrap();
    assert!(
        html.contains("command 1") && html.contains("command 2"),
        "both commands shown"
    );
    assert!(html.contains("--topk 128,64"), "the second command line");
    // A grid inside the recorded one runs nothing, changes nothing and is not recorded.
    let out = ok(sweep(&grown, "128").output().unwrap(), "a sub-grid");
    assert!(out.contains("0 cells run, 8 already finished"), "{out}");
    assert_eq!(
        std::fs::read_to_string(grown.join("cells.csv")).unwrap(),
        after
    );
    let run: Value =
        serde_json::from_str(&std::fs::read_to_string(grown.join("run.json")).unwrap()).unwrap();
    assert_eq!(run["command_lines"].as_array().unwrap().len(), 2);
}

/// A sweep driven by rounding profiles scores `exact` by itself, as a probe does (no extra
/// forward): without `--compare`, every cell's `exact_keeps` is filled and the summary's
/// `exact keeps` column has figures, not `-`; run.json keeps `--compare` as given.
#[test]
fn a_sweep_scores_exact_without_being_asked() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("s");
    let text = ok(
        sweep(&out, "64").output().unwrap(),
        "sweep without --compare",
    );
    let cells = std::fs::read_to_string(out.join("cells.csv")).unwrap();
    let mut rows = cells.lines();
    let header: Vec<&str> = rows.next().unwrap().split(',').collect();
    let keeps = header.iter().position(|h| *h == "exact_keeps").unwrap();
    let mut n = 0;
    for row in rows {
        let fields: Vec<&str> = row.split(',').collect();
        let last = fields.len() - (header.len() - keeps);
        assert!(!fields[last].is_empty(), "exact_keeps empty in {row}");
        n += 1;
    }
    assert_eq!(n, 8);
    let layers = std::fs::read_to_string(out.join("layers.csv")).unwrap();
    assert!(
        layers.lines().any(|l| l.contains(",exact,")),
        "exact rows scored"
    );
    let run: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("run.json")).unwrap()).unwrap();
    // `--compare` as given (none: absent), so directories written before still resume.
    let compare = &run["sweep_args"]["compare"];
    assert!(
        compare.is_null() || compare == &serde_json::json!([]),
        "{compare}"
    );
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let groups = summary["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 4, "2 lengths x 2 profiles at top-64");
    for g in groups {
        assert!(
            g["layers_lost_to_rounding"].is_u64(),
            "every group has the exact keeps figure: {g}\n{text}"
        );
    }
}

/// Two demos started together on an empty model cache: one writes the planted model while
/// the other waits for it and finds it cached; neither reads a half-written checkpoint.
#[test]
fn two_demos_on_an_empty_cache_share_one_model() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let spawn = |name: &str| {
        bin()
            .arg("demo")
            .arg("--out")
            .arg(dir.path().join(name))
            .arg("--cache")
            .arg(&cache)
            .args(["--lengths", "512", "--depths", "50", "--index", "fp8"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn("a"), spawn("b"));
    let outs = [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()];
    let texts: Vec<String> = outs
        .into_iter()
        .map(|o| ok(o, "one of two concurrent demos"))
        .collect();
    let wrote = texts
        .iter()
        .filter(|t| t.contains("writing the planted model"))
        .count();
    assert_eq!(wrote, 1, "{texts:?}");
    assert!(texts.iter().any(|t| t.contains("(cached)")), "{texts:?}");
}

#[test]
fn demo_runs_end_to_end_on_a_reduced_grid() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("demo");
    let cache = dir.path().join("cache");
    // The demo on a reduced grid (one depth, fp8) into `out`, the model cached in `cache`.
    let demo = |out: &Path, lengths: &str| {
        bin()
            .arg("demo")
            .arg("--out")
            .arg(out)
            .arg("--cache")
            .arg(&cache)
            .args(["--lengths", lengths, "--depths", "50", "--index", "fp8"])
            .output()
            .unwrap()
    };
    let text = ok(demo(&out, "512,1k"), "demo");
    // One line says what was written: 2 heatmaps (top-k 64 and 128), one layer plot per cell.
    assert!(
        text.contains(&format!(
            "wrote in {}: summary.json, report.html, rank_vs_length.png, 2 heatmaps \
             (heatmap_*.png), 4 layer \
             plots (layers_*.png)",
            out.display()
        )),
        "{text}"
    );
    for f in [
        "run.json",
        "cells.csv",
        "layers.csv",
        "attention.csv",
        "summary.json",
        "heatmap_fp8_128.png",
    ] {
        assert!(out.join(f).exists(), "{f} missing");
    }
    let run: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("run.json")).unwrap()).unwrap();
    assert_eq!(run["synthetic"], true);
    // The demo scores exact alongside, so every group says how many lost layers the exact math
    // keeps (lost to rounding), and the table has the column.
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    for g in summary["groups"].as_array().unwrap() {
        let rounding = g["layers_lost_to_rounding"].as_u64().expect("exact scored");
        assert!(rounding <= g["layers_lost_total"].as_u64().unwrap(), "{g}");
    }
    assert!(text.contains("exact keeps"), "{text}");
    // The second run reuses the cached model and runs the sweep afresh over the old report.
    let again = ok(demo(&out, "512,1k"), "demo again");
    assert!(again.contains("(cached)"), "{again}");
    assert!(!again.contains("already finished"), "{again}");
    assert!(again.contains("4 cells in"), "{again}");
    assert_eq!(
        std::fs::read_to_string(out.join("cells.csv"))
            .unwrap()
            .lines()
            .count(),
        5,
        "header + 4 cells (2 lengths x 2 top-k), no duplicates"
    );

    // A damaged cached model is written again, not reported as a broken checkpoint.
    let cached_model = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.join("model.safetensors").exists())
        .expect("the demo caches its model");
    let weights = cached_model.join("model.safetensors");
    let len = std::fs::metadata(&weights).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&weights)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let healed = ok(demo(&out, "512"), "demo over a damaged cache");
    assert!(healed.contains("damaged"), "{healed}");
    assert_eq!(std::fs::metadata(&weights).unwrap().len(), len);
    // So is a cache an older version left cut short, without synth's marks (the directory's
    // name is needlescope's own).
    for mark in ["planted.json", "synth.json"] {
        std::fs::remove_file(cached_model.join(mark)).unwrap();
    }
    let rebuilt = ok(demo(&out, "512"), "demo over an unmarked cache");
    assert!(rebuilt.contains("writing the planted model"), "{rebuilt}");
    assert!(cached_model.join("planted.json").is_file());

    // Another command's report is never replaced by the demo.
    let sweep_dir = dir.path().join("a-sweep");
    std::fs::create_dir(&sweep_dir).unwrap();
    let mut info: Value = run.clone();
    info["command_line"] = serde_json::json!(["needlescope", "sweep", "--model", "m"]);
    std::fs::write(sweep_dir.join("run.json"), info.to_string()).unwrap();
    std::fs::write(sweep_dir.join("cells.csv"), "kept\n").unwrap();
    let refused = demo(&sweep_dir, "512");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(stderr.contains("needlescope sweep --model m"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(sweep_dir.join("cells.csv")).unwrap(),
        "kept\n"
    );
    assert!(
        !sweep_dir.join(".lock").exists(),
        "a refusal leaves the directory as it was"
    );
    // Nor are records whose run.json is gone (sweep and probe refuse to append to them).
    std::fs::remove_file(sweep_dir.join("run.json")).unwrap();
    let refused = demo(&sweep_dir, "512");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("holds cells.csv without run.json"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(sweep_dir.join("cells.csv")).unwrap(),
        "kept\n"
    );
}

/// A sweep of `lengths` (one depth, one profile) into `out`, its output piped.
fn spawn_sweep(out: &Path, lengths: &str) -> std::process::Child {
    bin()
        .arg("sweep")
        .arg("--model")
        .arg(planted())
        .args(["--lengths", lengths, "--depths", "50", "--index", "fp8"])
        .args(["--topk", "64", "--kv", "exact", "--generate", "0", "--out"])
        .arg(out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

fn finished_cells(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("cells.csv")).map_or(0, |t| t.lines().count().max(1) - 1)
}

/// Sends SIGINT (a Ctrl-C) to `child`.
fn ctrl_c(child: &std::process::Child) {
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
}

/// Waits until the sweep into `dir` has started (run.json written), then sends `presses`
/// SIGINTs 300 ms apart, the first 300 ms after the start, while the first cell (8k or 16k
/// tokens, about a second or more here) is still running; returns the exit code and stderr.
fn ctrl_c_during_first_cell(
    child: std::process::Child,
    dir: &Path,
    presses: usize,
) -> (Option<i32>, String) {
    let started = std::time::Instant::now();
    while !dir.join("run.json").exists() && started.elapsed().as_secs() < 120 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    for _ in 0..presses {
        std::thread::sleep(std::time::Duration::from_millis(300));
        ctrl_c(&child);
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Ctrl-C during a probe with `--out`: the probe stops at the next prefill chunk, dropping the
/// run in flight (its unit is the run, which can take hours); the runs finished before it are
/// printed and recorded, the next never starts (exit 130, in probe wording); the same command
/// then records the rest.
#[test]
fn ctrl_c_stops_a_probe_at_the_next_chunk_and_keeps_the_finished_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("probe");
    let probe = || {
        let mut cmd = bin();
        cmd.arg("probe")
            .arg("--model")
            .arg(planted())
            .args(["--length", "16k", "--index", "fp8", "--topk", "64,128"])
            .args([
                "--kv",
                "exact",
                "--generate",
                "0",
                "--chunk",
                "512",
                "--out",
            ])
            .arg(&out);
        cmd
    };
    let child = probe()
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while !out.join("run.json").exists() && started.elapsed().as_secs() < 120 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    ctrl_c(&child);
    let run = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert_eq!(run.status.code(), Some(130), "{stderr}");
    assert!(
        stderr
            .contains("Ctrl-C: stopping the probe at the next chunk (the run in flight is dropped"),
        "{stderr}"
    );
    assert!(!stderr.contains("cell in flight"), "{stderr}");
    // The press lands in the first run (a 16k prefill in 32 chunks) or, on a fast machine, the
    // second: that run is dropped, never finished.
    let finished = finished_cells(&out);
    assert!(finished < 2, "the run in flight was finished: {stderr}");
    assert!(
        stderr.contains(&format!(
            "interrupted by Ctrl-C: {finished} of 2 runs are finished"
        )),
        "{stderr}"
    );
    assert_eq!(stdout.contains("top-64"), finished == 1, "{stdout}");
    assert!(!stdout.contains("top-128"), "{stdout}");
    let rest = probe().output().unwrap();
    let stderr = String::from_utf8_lossy(&rest.stderr);
    assert!(rest.status.success(), "{stderr}");
    assert_eq!(
        stderr.contains("already recorded there"),
        finished == 1,
        "{stderr}"
    );
    assert_eq!(finished_cells(&out), 2);
}

#[test]
fn ctrl_c_stops_a_sweep_between_cells_and_the_rerun_resumes() {
    let dir = tempfile::tempdir().unwrap();

    // One press: the cell in flight (8k) is finished and committed, the next never starts.
    let once = dir.path().join("once");
    let (code, stderr) = ctrl_c_during_first_cell(spawn_sweep(&once, "8k,512"), &once, 1);
    assert_eq!(code, Some(130), "{stderr}");
    assert!(stderr.contains("press Ctrl-C again"), "{stderr}");
    assert!(
        stderr.contains("1 of 2 cells are finished and kept in")
            && stderr.contains(&format!(
                "their plots and report.html are in {0}; to resume, rerun the same command \
                 with --out {0}",
                once.display()
            )),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(finished_cells(&once), 1);
    // The finished cell's report is there before the rerun.
    for file in ["report.html", "heatmap_fp8_64.png", "rank_vs_length.png"] {
        assert!(once.join(file).exists(), "{file}");
    }
    let html = std::fs::read_to_string(once.join("report.html")).unwrap();
    assert_eq!(html.matches("<tr class=\"cell\" ").count(), 1, "one cell");
    let out = spawn_sweep(&once, "8k,512").wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(finished_cells(&once), 2);

    // Two presses: stops at once; the cell in flight (16k) is lost, nothing else is written.
    let twice = dir.path().join("twice");
    let (code, stderr) = ctrl_c_during_first_cell(spawn_sweep(&twice, "16k,512"), &twice, 2);
    assert_eq!(code, Some(130), "{stderr}");
    assert!(
        stderr.contains("stopped by Ctrl-C: finished cells are kept in")
            && stderr.contains(&format!(
                "to resume, rerun the same command with --out {}",
                twice.display()
            )),
        "{stderr}"
    );
    assert_eq!(finished_cells(&twice), 0);
    let out = spawn_sweep(&twice, "16k,512").wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(finished_cells(&twice), 2);
}

/// Ctrl-C after the last cell, while the summary and plots are written, exits at once and
/// says that every cell is finished and `needlescope report` renders them (before, the process
/// ended silently with a partial set of plots). The press must land while plots are written:
/// the test waits for the first PNG and tries a few times, a run that finished first exiting 0.
#[test]
fn ctrl_c_while_plots_are_written_points_at_report() {
    let dir = tempfile::tempdir().unwrap();
    for attempt in 0..6 {
        let out = dir.path().join(format!("r{attempt}"));
        let child = bin()
            .arg("sweep")
            .arg("--model")
            .arg(planted())
            .args(["--lengths", "512", "--depths", "5,20,35,50,65,80,95"])
            .args(["--index", "fp8,bf16", "--topk", "64,128", "--kv", "exact"])
            .args(["--generate", "0", "--out"])
            .arg(&out)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let started = std::time::Instant::now();
        let png = || {
            std::fs::read_dir(&out).is_ok_and(|d| {
                d.flatten()
                    .any(|e| e.file_name().to_string_lossy().ends_with(".png"))
            })
        };
        while !png() && started.elapsed().as_secs() < 120 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        ctrl_c(&child);
        let run = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
        if run.status.code() == Some(0) {
            continue; // the plots were done before the press arrived
        }
        assert_eq!(run.status.code(), Some(130), "{stderr}");
        assert!(
            stderr.contains("while writing the report: every cell is finished in")
                && stderr.contains(&format!("`needlescope report {}`", out.display())),
            "{stderr}"
        );
        assert_eq!(finished_cells(&out), 28);
        let again = bin().arg("report").arg(&out).output().unwrap();
        assert!(again.status.success());
        return;
    }
    panic!("no Ctrl-C landed while the plots were written in 6 attempts");
}

/// Paths that are not UTF-8 (legal on Linux) work: run.json records the command line lossily
/// instead of panicking.
#[test]
fn a_report_directory_that_is_not_utf8_works() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join(std::ffi::OsStr::from_bytes(b"out\xff"));
    let run = spawn_sweep(&out, "512").wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert_eq!(finished_cells(&out), 1);
    let info: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("run.json")).unwrap()).unwrap();
    assert!(
        info["command_line"].to_string().contains("out\u{fffd}"),
        "{info}"
    );
}

/// `--generate 0` generates no answer, so there is nothing to judge: even on a model that is
/// judged by its answers (no planted.json, as for a real checkpoint) the verdict is indexer
/// recall, never "WRONG" for the empty text. With tokens generated the answer is judged.
#[test]
fn generate_zero_is_judged_by_recall_not_by_an_empty_answer() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("answers");
    std::fs::create_dir(&model).unwrap();
    for entry in std::fs::read_dir(planted()).unwrap() {
        let path = entry.unwrap().path();
        // Without synth's marks (planted.json, synth.json): a model that answers.
        if !["planted.json", "synth.json"].contains(&path.file_name().unwrap().to_str().unwrap()) {
            std::fs::copy(&path, model.join(path.file_name().unwrap())).unwrap();
        }
    }
    let probe = |generate: &str| -> Value {
        let out = bin()
            .arg("probe")
            .arg("--model")
            .arg(&model)
            .args(["--length", "512", "--kv", "exact", "--topk", "64", "--json"])
            .args(["--generate", generate])
            .output()
            .unwrap();
        serde_json::from_str(&ok(out, "probe")).unwrap()
    };
    let none = probe("0");
    // Without planted.json and synth.json the model is not marked synthetic.
    assert_eq!(none["synthetic"], false);
    for run in none["runs"].as_array().unwrap() {
        assert!(run["answer_correct"].is_null(), "{run}");
    }
    let conclusion = none["conclusion"].as_str().unwrap();
    assert!(!conclusion.contains("answer"), "{conclusion}");
    // Two generated tokens: judged by the answer, or, when the limit cut the answer off
    // before the value (no end-of-sentence token), no verdict, said in the conclusion.
    let judged = probe("2");
    let conclusion = judged["conclusion"].as_str().unwrap();
    for run in judged["runs"].as_array().unwrap() {
        assert!(
            run["answer_correct"].is_boolean()
                || conclusion
                    .contains("no verdict: the generation stopped before its answer ended"),
            "{run} {conclusion}"
        );
    }

    let out = tmp.path().join("sweep");
    let mut cmd = sweep_on(&model, &out, "64");
    ok(cmd.output().unwrap(), "sweep --generate 0");
    let cells = std::fs::read_to_string(out.join("cells.csv")).unwrap();
    let mut rdr = csv::Reader::from_reader(cells.as_bytes());
    let col = rdr
        .headers()
        .unwrap()
        .iter()
        .position(|h| h == "answer_correct")
        .unwrap();
    for r in rdr.records() {
        assert_eq!(&r.unwrap()[col], "", "no answer to judge: {cells}");
    }
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    fn judged_by(v: &Value, found: &mut Vec<String>) {
        match v {
            Value::Object(m) => m.iter().for_each(|(k, v)| {
                if k == "judged_by" {
                    found.push(v.as_str().unwrap_or_default().to_string());
                }
                judged_by(v, found)
            }),
            Value::Array(a) => a.iter().for_each(|v| judged_by(v, found)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    judged_by(&summary, &mut found);
    assert!(
        !found.is_empty() && found.iter().all(|j| j == "indexer"),
        "{found:?}: {summary}"
    );

    // A thinking scenario whose generation ends before </think> has no answer to judge: no
    // verdict (not WRONG), said up front and in the run's line; the JSON's answer_correct is
    // null.
    let thinking = tmp.path().join("thinking.toml");
    let passkey = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/passkey.toml"),
    )
    .unwrap();
    std::fs::write(
        &thinking,
        passkey.replace("thinking = false", "thinking = true"),
    )
    .unwrap();
    let run = |json: bool| {
        let mut cmd = bin();
        cmd.arg("probe")
            .arg("--model")
            .arg(&model)
            .arg("--scenario")
            .arg(&thinking)
            .args([
                "--length",
                "512",
                "--kv",
                "exact",
                "--topk",
                "64",
                "--generate",
                "2",
            ]);
        if json {
            cmd.arg("--json");
        }
        cmd.output().unwrap()
    };
    let text = run(false);
    let stderr = String::from_utf8_lossy(&text.stderr).into_owned();
    let stdout = ok(text, "thinking probe");
    assert!(
        stderr.contains("thinks first: its answer follows </think>"),
        "{stderr}"
    );
    assert!(
        stdout.contains(
            "no verdict (--generate stopped it before its answer ended: raise --generate)"
        ) && stdout.contains("no verdict: the generation stopped before its answer ended")
            && !stdout.contains("WRONG"),
        "{stdout}"
    );
    let json: Value = serde_json::from_str(&ok(run(true), "thinking probe --json")).unwrap();
    for r in json["runs"].as_array().unwrap() {
        assert!(r["answer_correct"].is_null(), "{r}");
    }
}

/// What `sweep --model planted --index fp8 --topk 64 --kv exact` plus `grid` printed, run into
/// a fresh directory.
fn small_sweep(grid: &[&str]) -> String {
    small_sweep_kept(grid).0
}

/// [`small_sweep`] keeping the run directory (`DIR/s`) for the caller to read.
fn small_sweep_kept(grid: &[&str]) -> (String, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    let out = bin()
        .arg("sweep")
        .arg("--model")
        .arg(planted())
        .args(grid)
        .args(["--index", "fp8", "--topk", "64", "--kv", "exact", "--out"])
        .arg(tmp.path().join("s"))
        .output()
        .unwrap();
    (ok(out, "sweep"), tmp)
}

/// Long haystack units (tool definitions) at a short length leave the needle off the requested
/// depth; the sweep's cell line says where it landed (at its end, keeping the columns).
#[test]
fn sweep_lines_say_where_a_needle_off_its_depth_landed() {
    let text = small_sweep(&[
        "--scenario",
        "code-cwd",
        "--lengths",
        "700",
        "--depths",
        "10",
    ]);
    let line = text.lines().find(|l| l.contains(" tokens  depth")).unwrap();
    assert!(line.contains("depth  10%  fp8"), "{line}");
    assert!(line.ends_with(" s  (needle at 0.0%)"), "{line}");
}

/// The probe's header line says the same: where the needle landed and what was asked (37
/// tokens leave the passkey prompt one haystack token, so depth 0 lands at 100%).
#[test]
fn probe_text_says_when_the_needle_is_off_the_asked_depth() {
    let run = |length: &str, depth: &str| {
        let out = bin()
            .arg("probe")
            .arg("--model")
            .arg(planted())
            .args(["--length", length, "--depth", depth])
            .args(["--topk", "64", "--kv", "exact", "--generate", "0"])
            .output()
            .unwrap();
        ok(out, "probe")
    };
    let off = run("37", "0");
    assert!(
        off.contains("needle at depth 100.0% (tokens 3..23, asked 0%: the nearest place the haystack offers)"),
        "{off}"
    );
    let on = run("512", "50");
    let header = on.lines().find(|l| l.contains("needle at depth")).unwrap();
    assert!(!header.contains("asked"), "{header}");
}

/// A cell whose every CSA layer keeps all its rows (n_t <= k) is no evidence either way: its
/// line says "trivial", as the summary and the heatmap do, never "recalled".
#[test]
fn sweep_lines_call_cells_without_evidence_trivial() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("s");
    // 512 tokens: at most 128 visible rows <= 200; 1k: 256 > 200.
    let text = ok(sweep(&out, "200").output().unwrap(), "sweep");
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" tokens  depth"))
        .collect();
    assert_eq!(lines.len(), 8, "{text}");
    for line in &lines {
        let short = line.trim_start().starts_with("512 tokens");
        assert_eq!(line.contains("trivial (n_t <= k)"), short, "{line}");
        if short {
            assert!(
                !line.contains("recalled") && !line.contains("LOST"),
                "{line}"
            );
        }
    }
}

/// With several samples per grid point, each cell line names its sample.
#[test]
fn sweep_lines_name_the_sample() {
    let (text, dir) = small_sweep_kept(&["--lengths", "512", "--depths", "50", "--samples", "2"]);
    // Each sample is its own cell: its own id in cells.csv (a resume tells them apart by it).
    let records = needlescope::report::RunRecords::read(&dir.path().join("s")).unwrap();
    let ids: Vec<&str> = records.cells.iter().map(|c| c.cell_id.as_str()).collect();
    assert_eq!(ids, ["L512-d50-fp8-k64-s0", "L512-d50-fp8-k64-s1"]);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" tokens  depth"))
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].contains("depth  50%  sample 0  fp8"), "{text}");
    assert!(lines[1].contains("depth  50%  sample 1  fp8"), "{text}");
}

/// The text report gives the real reason there is no verdict: nothing generated, or a planted
/// model whose LM path does not answer.
#[test]
fn probe_text_says_why_there_is_no_verdict() {
    let probe = |generate: &str| {
        let out = bin()
            .arg("probe")
            .arg("--model")
            .arg(planted())
            .args(["--length", "512", "--kv", "exact", "--topk", "64"])
            .args(["--index", "fp8", "--generate", generate])
            .output()
            .unwrap();
        ok(out, "probe")
    };
    let none = probe("0");
    assert!(
        none.contains("no verdict (--generate 0: nothing generated)"),
        "{none}"
    );
    // The planted model is labelled synthetic in the text report, as in every other report.
    assert!(
        none.starts_with("synthetic model (written by `synth`)"),
        "{none}"
    );
    let synthetic = probe("2");
    assert!(
        synthetic.contains("no verdict (synthetic model: its LM path does not answer)"),
        "{synthetic}"
    );
}

/// Probe and sweep score the same comparisons: every run scores its driving profile, the
/// command's other `--index` profiles and its `--compare` ones, on the same hidden states.
/// A sweep's run.json records `--compare` only when given (older directories still resume); a
/// resume with another `--compare` is refused.
#[test]
fn probe_and_sweep_score_the_other_index_profiles_and_compare() {
    let profiles_of = |layers: &[Value]| -> Vec<String> {
        let mut p: Vec<String> = layers
            .iter()
            .map(|l| l["profile"].as_str().unwrap().to_string())
            .collect();
        p.sort();
        p.dedup();
        p
    };
    let v = probe_json(&[
        "--length",
        "512",
        "--topk",
        "64",
        "--generate",
        "0",
        "--index",
        "fp8,bf16",
        "--compare",
        "exact",
    ]);
    assert_eq!(v["synthetic"], true);
    for run in v["runs"].as_array().unwrap() {
        let layers = run["layers"].as_array().unwrap();
        assert_eq!(profiles_of(layers), ["bf16", "exact", "fp8"], "{run}");
        for l in layers {
            assert_eq!(l["driving"] == true, l["profile"] == run["index"], "{l}");
        }
    }

    let tmp = tempfile::tempdir().unwrap();
    let sweep_into = |dir: &Path, extra: &[&str]| {
        bin()
            .arg("sweep")
            .arg("--model")
            .arg(planted())
            .args(["--lengths", "512", "--depths", "50", "--index", "fp8"])
            .args(["--topk", "64", "--kv", "exact", "--generate", "0", "--out"])
            .arg(dir)
            .args(extra)
            .output()
            .unwrap()
    };
    let dir = tmp.path().join("s");
    let sweep = |extra: &[&str]| sweep_into(&dir, extra);
    let text = ok(sweep(&[]), "sweep without --compare");
    assert!(
        text.contains("synthetic model (written by `synth`)"),
        "{text}"
    );
    let run_json = std::fs::read_to_string(dir.join("run.json")).unwrap();
    assert!(!run_json.contains("\"compare\""), "{run_json}");
    let text = ok(sweep(&[]), "resume");
    assert!(text.contains("0 cells run, 1 already finished"), "{text}");
    let refused = sweep(&["--compare", "exact,bf16"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(stderr.contains("compare"), "{stderr}");

    let dir = tmp.path().join("c");
    ok(
        sweep_into(&dir, &["--compare", "exact,bf16"]),
        "sweep --compare",
    );
    let layers = std::fs::read_to_string(dir.join("layers.csv")).unwrap();
    let mut rdr = csv::Reader::from_reader(layers.as_bytes());
    let col = rdr
        .headers()
        .unwrap()
        .iter()
        .position(|h| h == "profile")
        .unwrap();
    let mut seen: Vec<String> = rdr.records().map(|r| r.unwrap()[col].to_string()).collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen, ["bf16", "exact", "fp8"]);
}

/// On a synthetic model probe generates nothing unless asked (its LM path does not answer:
/// the indexer judges); `--generate N` still generates.
#[test]
fn probe_on_a_synthetic_model_generates_only_when_asked() {
    let run = |extra: &[&str]| {
        let v = probe_json(&[&["--length", "1k", "--depth", "50", "--topk", "64"], extra].concat());
        v["runs"][0]["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["query_pos"].as_u64().unwrap())
            .collect::<std::collections::BTreeSet<_>>()
    };
    assert_eq!(
        run(&[]).into_iter().collect::<Vec<_>>(),
        vec![1023],
        "only the answer position"
    );
    assert_eq!(
        run(&["--generate", "3"]).len(),
        3,
        "the answer position and 2 decode steps"
    );
}
