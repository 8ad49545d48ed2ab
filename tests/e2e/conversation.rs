//! A user's conversation through the binary (`--prompt`, `--needle`, `--answer`, `needlescope
//! prompt`) on the planted model: every needle ranked on every CSA layer, the ranks equal to
//! ranks recomputed from `trace --prompt` scores of the same tokens; `prompt --json` and
//! `--ids-out` agree with what the probe ran; needle spans at token edges; bad input is a named
//! error with exit 1 and nothing run.

use serde_json::Value;
use std::path::{Path, PathBuf};

use needlescope_testkit::planted as planted_support;
use planted_support::{bin, ok, planted};

/// A golden conversation of tests/reference/chat.
fn chat(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/reference/chat")
        .join(name)
}

const WORKDIR: &str = "working directory is /srv/agent/workdir-7f3a";
const RESULT: &str = "beta2";

fn prompt_json(prompt: &Path, needles: &[&str]) -> Value {
    let mut cmd = bin();
    cmd.arg("prompt").arg("--prompt").arg(prompt).arg("--json");
    for n in needles {
        cmd.args(["--needle", n]);
    }
    serde_json::from_str(&ok(cmd.output().unwrap(), "prompt")).unwrap()
}

fn scores_of(st: &safetensors::SafeTensors, layer: u64) -> Vec<f32> {
    st.tensor(&format!("layers.{layer}.indexer.scores"))
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn every_needle_is_ranked_on_every_csa_layer_as_trace_scores_rank_it() {
    let conv = chat("06-tool-calls-results-out-of-order.json");
    let out = bin()
        .arg("probe")
        .arg("--model")
        .arg(planted())
        .arg("--prompt")
        .arg(&conv)
        .args([
            "--needle",
            WORKDIR,
            "--needle",
            RESULT,
            "--answer",
            "workdir-7f3a",
        ])
        .args(["--index", "exact", "--kv", "exact", "--topk", "64"])
        .args(["--generate", "0", "--compare", "fp8", "--json"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_str(&ok(out, "probe --prompt")).unwrap();
    let needles = v["prompt"]["needles"].as_array().unwrap();
    assert_eq!(needles.len(), 2);
    assert_eq!(needles[0]["text"], WORKDIR);
    assert_eq!(needles[1]["text"], RESULT);
    assert_eq!(
        v["prompt"]["needle"], needles[0]["span"],
        "needle = needles[0]"
    );
    // `prompt --json` renders the same tokens and spans without a model.
    let p = prompt_json(&conv, &[WORKDIR, RESULT]);
    assert_eq!(p["tokens"], v["prompt"]["tokens"]);
    assert_eq!(p["needles"][0]["span"], needles[0]["span"]);
    assert_eq!(p["needles"][1]["span"], needles[1]["span"]);
    assert_eq!(needles[1]["location"], "messages[3..=6]", "{needles:?}");

    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.safetensors");
    ok(
        bin()
            .arg("trace")
            .arg("--model")
            .arg(planted())
            .arg("--prompt")
            .arg(&conv)
            .args(["--positions", "last", "--index", "exact", "--topk", "64"])
            .arg("--out")
            .arg(&trace)
            .output()
            .unwrap(),
        "trace --prompt",
    );
    let bytes = std::fs::read(&trace).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let traced: Vec<i64> = st
        .tensor("tokens")
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let tokens: Vec<i64> = serde_json::from_value(v["prompt"]["tokens"].clone()).unwrap();
    assert_eq!(traced, tokens, "trace --prompt runs the probe's tokens");
    let last = tokens.len() - 1;
    let visible = (last + 1) / 4;
    let records: Vec<&Value> = v["runs"][0]["layers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["query_pos"] == last as u64 && r["driving"] == true)
        .collect();
    let mut compared = std::collections::BTreeSet::new();
    for r in &records {
        let layer = r["layer"].as_u64().unwrap();
        let needle = r["needle"].as_u64().unwrap() as usize;
        let span: Vec<usize> = serde_json::from_value(needles[needle]["span"].clone()).unwrap();
        let (a, b) = (span[0], span[1]);
        let rows: Vec<usize> = (a / 4..=(b - 1) / 4 + 1).filter(|&w| w < visible).collect();
        let scores = scores_of(&st, layer);
        let best = rows
            .iter()
            .map(|&w| scores[w])
            .fold(f32::NEG_INFINITY, f32::max);
        let rank = 1 + scores[..visible].iter().filter(|&&s| s > best).count();
        assert_eq!(
            r["needle_rank"].as_u64().unwrap() as usize,
            rank,
            "layer {layer}, needle {needle}: probe vs trace"
        );
        compared.insert((layer, needle));
    }
    assert_eq!(compared.len(), 4, "2 CSA layers x 2 needles: {compared:?}");
    // Each needle also under the compared profile.
    let fp8 = v["runs"][0]["layers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["query_pos"] == last as u64 && r["profile"] == "fp8")
        .count();
    assert_eq!(fp8, 4);
    let conclusion = v["conclusion"].as_str().unwrap();
    assert!(
        conclusion.contains(&format!("needle 0 {WORKDIR:?}"))
            && conclusion.contains(&format!("needle 1 {RESULT:?}")),
        "{conclusion}"
    );
}

#[test]
fn prompt_ids_out_is_what_trace_tokens_reads_and_spans_keep_glued_edges() {
    let dir = tempfile::tempdir().unwrap();
    let ids = dir.path().join("ids.txt");
    let conv = chat("02-system-user-chat.json");
    let out = bin()
        .arg("prompt")
        .arg("--prompt")
        .arg(&conv)
        // Starts mid-word: "orking" begins inside the token " working", which the span
        // keeps and reports.
        .args(["--needle", "orking directory is /srv"])
        .arg("--ids-out")
        .arg(&ids)
        .output()
        .unwrap();
    let text = ok(out, "prompt --ids-out");
    assert!(
        text.contains("its first token also holds \" w\" outside the needle"),
        "{text}"
    );
    let p = prompt_json(&conv, &["orking directory is /srv"]);
    let written: Vec<u64> = std::fs::read_to_string(&ids)
        .unwrap()
        .split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect();
    let tokens: Vec<u64> = serde_json::from_value(p["tokens"].clone()).unwrap();
    assert_eq!(written, tokens);
    assert_eq!(p["needles"][0]["glued_before"], " w");
    let span: Vec<usize> = serde_json::from_value(p["needles"][0]["span"].clone()).unwrap();
    assert_eq!(
        p["needles"][0]["span_text"], " working directory is /srv",
        "{span:?}"
    );
    assert_eq!(
        p["text"].as_str().unwrap(),
        std::fs::read_to_string(chat("02-system-user-chat.rendered.txt")).unwrap()
    );
    // A text file is one user message in chat mode.
    let txt = dir.path().join("q.txt");
    std::fs::write(&txt, "The code is 42. What is the code?").unwrap();
    let p = prompt_json(&txt, &["The code is 42."]);
    assert_eq!(
        p["text"],
        "<｜begin▁of▁sentence｜><｜User｜>The code is 42. What is the code?<｜Assistant｜></think>"
    );
}

/// Runs `prompt` (or `probe` when `model` is given) and returns the error line; asserts exit 1.
fn refused(prompt: &Path, needles: &[&str], model: Option<&Path>) -> String {
    let mut cmd = bin();
    match model {
        Some(m) => cmd
            .arg("probe")
            .arg("--model")
            .arg(m)
            .args(["--generate", "0"]),
        None => cmd.arg("prompt"),
    };
    cmd.arg("--prompt").arg(prompt);
    for n in needles {
        cmd.args(["--needle", n]);
    }
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

#[test]
fn bad_conversations_are_named_errors_with_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let cases: Vec<(PathBuf, Vec<&str>, Vec<&str>)> = vec![
        (
            write("bad.json", b"{\"messages\": [\n  {\"role\": \"user\",, }]}"),
            vec!["x"],
            vec!["bad.json", "malformed JSON at line 2, column"],
        ),
        (
            write("role.json", br#"[{"role": "bot", "content": "x"}]"#),
            vec!["x"],
            vec!["messages[0].role", "unknown role \"bot\""],
        ),
        (
            write(
                "tool.json",
                br#"[{"role": "user", "content": "go"}, {"role": "assistant", "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "b", "content": "r"}]"#,
            ),
            vec!["go"],
            vec!["messages[2]", "call id \"b\"", "\"a\" (f)"],
        ),
        (
            write(
                "last.json",
                br#"[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]"#,
            ),
            vec!["q"],
            vec!["messages[1]", "nothing left for the model to answer"],
        ),
        (
            write(
                "tools.json",
                br#"{"messages": [{"role": "user", "content": "q"}], "tools": [{"type": "function"}]}"#,
            ),
            vec!["q"],
            vec!["tools[0]", "`function`"],
        ),
        (
            write(
                "developer.json",
                br#"[{"role": "developer", "content": ""}, {"role": "user", "content": "q"}]"#,
            ),
            vec!["q"],
            vec!["messages[0].content", "empty developer message"],
        ),
        (
            write("task.json", br#"[{"role": "user", "content": "q", "task": "query"}]"#),
            vec!["q"],
            vec!["messages[0].task", "task tokens"],
        ),
        (
            write("latin1.txt", b"caf\xe9 au lait"),
            vec!["caf"],
            vec!["latin1.txt", "not UTF-8", "0xe9 at byte offset 3"],
        ),
        (
            write("ok.txt", b"The code is 42. What is the code? The code!"),
            vec![""],
            vec!["--needle #1: empty"],
        ),
        (
            dir.path().join("ok.txt"),
            vec!["the CODE is 43"],
            vec!["does not occur", "ok.txt"],
        ),
        (
            dir.path().join("ok.txt"),
            vec!["the code is 42"],
            vec!["does not occur", "other letter case"],
        ),
        (
            dir.path().join("ok.txt"),
            vec!["The code"],
            vec!["occurs 2 times", "token", "[The code]"],
        ),
        (
            dir.path().join("ok.txt"),
            vec!["User"],
            vec!["special token", "<｜User｜>"],
        ),
    ];
    for (file, needles, wants) in &cases {
        let err = refused(file, needles, None);
        for want in wants {
            assert!(
                err.contains(want),
                "{}: {want:?} not in {err}",
                file.display()
            );
        }
    }
    // Longer than the model's context: the planted model with a 256-position config.
    let short = dir.path().join("short-model");
    std::fs::create_dir(&short).unwrap();
    for entry in std::fs::read_dir(planted()).unwrap() {
        let entry = entry.unwrap();
        let to = short.join(entry.file_name());
        if entry.file_name() == "config.json" {
            let cfg = std::fs::read_to_string(entry.path()).unwrap();
            let cfg = with_short_context(&cfg);
            std::fs::write(&to, cfg).unwrap();
        } else {
            std::os::unix::fs::symlink(entry.path(), &to).unwrap();
        }
    }
    let err = refused(
        &chat("06-tool-calls-results-out-of-order.json"),
        &["beta2"],
        Some(&short),
    );
    assert!(
        err.contains("664 tokens") && err.contains("max_position_embeddings (256)"),
        "{err}"
    );
    // --prompt without --answer while generating (asked for: a synthetic model generates
    // nothing by default).
    let out = bin()
        .arg("probe")
        .arg("--model")
        .arg(planted())
        .arg("--prompt")
        .arg(dir.path().join("ok.txt"))
        .args(["--needle", "The code is 42.", "--generate", "3"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--answer TEXT"), "{err}");
}

/// `config.json` with `max_position_embeddings` set to 256.
fn with_short_context(cfg: &str) -> String {
    let mut v: Value = serde_json::from_str(cfg).unwrap();
    v["max_position_embeddings"] = 256.into();
    serde_json::to_string_pretty(&v).unwrap()
}

/// `--needles N` in a built-in scenario: each needle ranked on every CSA layer, in the JSON
/// and in layers.csv of `--out`, and cells.csv's counts over all of them.
#[test]
fn several_scenario_needles_are_each_ranked_and_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("r");
    let out = bin()
        .arg("probe")
        .arg("--model")
        .arg(planted())
        .args([
            "--scenario",
            "kv-retrieval",
            "--length",
            "1k",
            "--depth",
            "20",
        ])
        .args([
            "--needles",
            "3",
            "--ask",
            "all",
            "--kv",
            "exact",
            "--topk",
            "64",
        ])
        .args(["--generate", "0", "--json", "--out"])
        .arg(&report)
        .output()
        .unwrap();
    let v: Value = serde_json::from_str(&ok(out, "probe --needles 3")).unwrap();
    assert_eq!(v["prompt"]["needles"].as_array().unwrap().len(), 3);
    let last = v["prompt"]["length"].as_u64().unwrap() - 1;
    let mut per_needle = [0; 3];
    for r in v["runs"][0]["layers"].as_array().unwrap() {
        if r["query_pos"] == last && r["driving"] == true {
            per_needle[r["needle"].as_u64().unwrap() as usize] += 1;
        }
    }
    assert_eq!(per_needle, [2, 2, 2], "each needle on both CSA layers");
    let layers = std::fs::read_to_string(report.join("layers.csv")).unwrap();
    let header: Vec<&str> = layers.lines().next().unwrap().split(',').collect();
    let col = header.iter().position(|h| *h == "needle").unwrap();
    let needles: std::collections::BTreeSet<&str> = layers
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(col).unwrap())
        .collect();
    assert_eq!(needles.into_iter().collect::<Vec<_>>(), ["0", "1", "2"]);
    // `report` reads the directory back (its completeness check knows the needle column).
    ok(bin().arg("report").arg(&report).output().unwrap(), "report");
}

/// `--needle` and `--answer` belong to `--prompt`: without it they are a usage error (exit 2,
/// naming both flags) in probe and prompt, never accepted and ignored while the scenario's own
/// needle is ranked.
#[test]
fn needle_and_answer_without_prompt_are_refused_by_name() {
    for (command, flags) in [
        ("probe", vec!["--needle", "foo", "--answer", "bar"]),
        ("probe", vec!["--answer", "bar"]),
        ("prompt", vec!["--needle", "foo"]),
        ("prompt", vec!["--answer", "bar"]),
    ] {
        let mut cmd = bin();
        cmd.arg(command);
        if command == "probe" {
            cmd.arg("--model").arg(planted());
            cmd.args(["--generate", "0"]);
        }
        let out = cmd.args(["--length", "2k"]).args(&flags).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{command} {flags:?}: {stderr}");
        assert!(
            stderr.contains(flags[0]) && stderr.contains("--prompt"),
            "{command} {flags:?}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "{command} {flags:?}: nothing ran");
    }
}
