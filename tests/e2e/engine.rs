//! `probe --engine URL` / `--engine-capture FILE` against a stand-in SGLang server on 127.0.0.1
//! (needlescope-testkit's `sglang`: the CPU engine driving a chosen profile, rows shuffled and
//! padded as SGLang sends them): membership follows the driving profile's rank, the closest
//! profile is the one driven, malformed payloads and failing servers are refused by name,
//! a saved body gives the records of the live run, and engine-only mode reads config and
//! tokenizer alone.

use std::path::Path;
use std::time::Duration;

use needlescope::numerics::profiles::{IndexProfile, KvMode};
use needlescope_testkit::planted::{bin, ok, planted};
use needlescope_testkit::sglang::{start, Fault};
use serde_json::Value;

const LIFETIME: Duration = Duration::from_secs(300);

fn probe(args: &[&str]) -> std::process::Output {
    bin()
        .arg("probe")
        .arg("--model")
        .arg(planted())
        .args(["--scenario", "passkey", "--length", "2k", "--depth", "40"])
        .args(["--kv", "exact", "--generate", "3"])
        .args(args)
        .output()
        .unwrap()
}

fn probe_json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    serde_json::from_str(&ok(probe(&all), "probe --engine")).expect("one JSON object")
}

/// The reference's layer record of `profile` at (layer, position, needle 0).
fn reference<'a>(run: &'a Value, layer: &Value, pos: &Value, profile: &str) -> &'a Value {
    run["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| {
            &r["layer"] == layer
                && &r["query_pos"] == pos
                && r["profile"] == profile
                && r["needle"] == 0
        })
        .unwrap_or_else(|| panic!("no {profile} record at layer {layer}, position {pos}"))
}

#[test]
fn membership_follows_the_driving_rank_and_the_closest_profile_is_the_one_driven() {
    for driven in [
        IndexProfile::Exact,
        IndexProfile::SglangFp8,
        IndexProfile::Fp8NoHadamardK,
    ] {
        let server = start(planted(), driven, KvMode::Exact, Fault::None, 2, LIFETIME);
        // The reference driven as the engine: the same hidden states, so membership is the
        // rank at every probed layer and position.
        let same = probe_json(&["--engine", &server.url, "--index", driven.name()]);
        let engine = &same["engine"];
        let run = &same["runs"][0];
        assert_eq!(engine["topk"], 64, "K read from the payload");
        assert_eq!(run["topk"], 64, "the engine's K is the reference's top-k");
        let layers = engine["layers"].as_array().unwrap();
        // 2 CSA layers x (answer position + 2 decode positions).
        assert_eq!(layers.len(), 6, "{engine}");
        for l in layers {
            let r = reference(run, &l["layer"], &l["query_pos"], driven.name());
            let rank = r["needle_rank"].as_u64().unwrap();
            assert_eq!(
                l["needle_selected"].as_bool().unwrap(),
                rank <= 64,
                "driven by {driven}: engine membership vs reference rank {rank}: {l}"
            );
            assert_eq!(l["overlap"][driven.name()], 1.0, "{l}");
            assert_eq!(l["selected_rows"], 64);
        }
        assert_eq!(
            engine["closest_profile"]["profile"],
            driven.name(),
            "{engine}"
        );
        // The decode positions saw the engine's tokens.
        let generated: Vec<u64> = serde_json::from_value(run["generated_ids"].clone())
            .unwrap_or_else(|_| serde_json::from_value(engine["output_ids"].clone()).unwrap());
        assert_eq!(engine["output_ids"].as_array().unwrap().len(), 3);
        let _ = generated;

        // Driven otherwise (bf16 keys): the closest profile is still the engine's.
        let other = probe_json(&["--engine", &server.url, "--index", "bf16"]);
        let e = &other["engine"];
        assert_eq!(e["closest_profile"]["profile"], driven.name(), "{e}");
        assert_eq!(e["reference_driving"], "bf16");
        let line = e["conclusion"].as_str().unwrap();
        assert!(line.contains(driven.name()), "{line}");
        assert_eq!(server.served.load(std::sync::atomic::Ordering::SeqCst), 2);
    }
}

/// Stderr of a probe that must fail with exit 1, having printed nothing on stdout.
fn refused(args: &[&str]) -> String {
    let out = probe(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        out.stdout.is_empty(),
        "nothing printed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    stderr
}

#[test]
fn malformed_payloads_and_failing_servers_are_refused_by_name() {
    let cases: [(Fault, &[&str]); 5] = [
        (
            Fault::WrongLength,
            &["indexer_topk", "int32 values", "ratio-4 layers"],
        ),
        (
            Fault::OutOfRange,
            &["query position 2047", "value 512", "below 512"],
        ),
        (Fault::Repeat, &["query position 2047", "selected twice"]),
        (
            Fault::NoField,
            &["no meta_info.indexer_topk", "--enable-return-indexer-topk"],
        ),
        (
            Fault::Http500,
            &["HTTP status 500", "stand-in: internal error"],
        ),
    ];
    for (fault, words) in cases {
        let server = start(
            planted(),
            IndexProfile::SglangFp8,
            KvMode::Exact,
            fault,
            1,
            LIFETIME,
        );
        let out_dir = tempfile::tempdir().unwrap();
        let report = out_dir.path().join("r");
        let stderr = refused(&["--engine", &server.url, "--out", report.to_str().unwrap()]);
        for w in words {
            assert!(stderr.contains(w), "{fault:?}: expected {w:?} in: {stderr}");
        }
        let recorded = report.join("cells.csv");
        let cells = std::fs::read_to_string(&recorded).unwrap_or_default();
        assert!(
            cells.lines().count() <= 1,
            "{fault:?}: nothing recorded: {cells}"
        );
    }
    // Slower than the timeout.
    let server = start(
        planted(),
        IndexProfile::SglangFp8,
        KvMode::Exact,
        Fault::Slow(Duration::from_secs(4)),
        1,
        Duration::from_secs(30),
    );
    let stderr = refused(&["--engine", &server.url, "--engine-timeout", "1"]);
    assert!(stderr.contains("--engine-timeout 1"), "{stderr}");
    // Nothing listening.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let stderr = refused(&["--engine", &format!("http://{closed}")]);
    assert!(stderr.contains("connection refused"), "{stderr}");
    // Values past their bounds are refused by the argument parser (exit 2).
    for (flag, value) in [
        ("--engine-timeout", "18446744073709551615"),
        ("--engine-topk", "100000000"),
    ] {
        let out = probe(&["--engine", "http://127.0.0.1:9", flag, value]);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("expected at most"));
    }
    // Flags that need an engine, and flags that contradict one.
    assert!(refused(&["--no-local"]).contains("--engine URL or --engine-capture FILE"));
    let stderr = refused(&["--engine", "http://127.0.0.1:9", "--topk", "64"]);
    assert!(stderr.contains("--topk"), "{stderr}");
}

#[test]
fn a_saved_capture_gives_the_records_of_the_live_run_and_engine_only_reads_no_weights() {
    let server = start(
        planted(),
        IndexProfile::Exact,
        KvMode::Exact,
        Fault::None,
        3,
        LIFETIME,
    );
    let live = probe_json(&["--engine", &server.url]);

    // The body as curl saves it: post the request the probe sends.
    let tokens: Vec<u32> = serde_json::from_value(live["prompt"]["tokens"].clone()).unwrap();
    let body = needlescope::run::sglang::generate_request(&tokens, 3);
    let saved = post(&server.url, &body);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("capture.json");
    std::fs::write(&file, &saved).unwrap();
    let replay = probe_json(&["--engine-capture", file.to_str().unwrap()]);
    let strip = |v: &Value| {
        let mut v = v.clone();
        v["engine"]["source"] = Value::Null;
        for run in v["runs"].as_array_mut().unwrap() {
            run["layers"].as_array().unwrap();
        }
        (v["engine"].clone(), v["runs"][0]["layers"].clone())
    };
    assert_eq!(
        strip(&live),
        strip(&replay),
        "a saved body gives the live run's records"
    );
    // A saved body with more generated tokens than --generate plans for is refused.
    let out = bin()
        .arg("probe")
        .arg("--model")
        .arg(planted())
        .args([
            "--scenario",
            "passkey",
            "--length",
            "2k",
            "--depth",
            "40",
            "--kv",
            "exact",
        ])
        .args([
            "--generate",
            "1",
            "--engine-capture",
            file.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("generated 3 tokens") && stderr.contains("--generate 3"),
        "{stderr}"
    );
    // --probe question: the question's rows are read from the payload and compared too.
    let question = probe_json(&[
        "--engine-capture",
        file.to_str().unwrap(),
        "--probe",
        "question",
    ]);
    let positions: std::collections::BTreeSet<u64> = question["engine"]["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["query_pos"].as_u64().unwrap())
        .collect();
    assert!(
        positions.iter().filter(|&&p| p < 2047).count() >= 5,
        "{positions:?}"
    );
    for l in question["engine"]["layers"].as_array().unwrap() {
        let r = reference(&question["runs"][0], &l["layer"], &l["query_pos"], "exact");
        assert_eq!(
            l["needle_selected"].as_bool().unwrap(),
            r["needle_rank"].as_u64().unwrap() <= 64 || r["trivial"] == true,
            "engine driven by exact, reference driven by fp8 at the question: {l}"
        );
    }

    // Engine-only: a model directory with config.json and the tokenizer, no weights.
    let bare = dir.path().join("bare");
    std::fs::create_dir(&bare).unwrap();
    for name in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        let from = planted().join(name);
        if from.exists() {
            std::fs::copy(&from, bare.join(name)).unwrap();
        }
    }
    let only = engine_only(&bare, &["--engine", &server.url]);
    let replayed = engine_only(&bare, &["--engine-capture", file.to_str().unwrap()]);
    assert_eq!(only["engine"]["layers"], replayed["engine"]["layers"]);
    let live_layers = live["engine"]["layers"].as_array().unwrap();
    let only_layers = only["engine"]["layers"].as_array().unwrap();
    assert_eq!(only_layers.len(), live_layers.len());
    for (a, b) in only_layers.iter().zip(live_layers) {
        assert_eq!(a["needle_selected"], b["needle_selected"], "{a} vs {b}");
        assert_eq!(a["selected_rows"], b["selected_rows"]);
        assert!(
            a["overlap"].as_object().unwrap().is_empty(),
            "no reference: {a}"
        );
    }
    assert_eq!(only["runs"].as_array().unwrap().len(), 0);
    // Recorded: an engine-only report directory that `report` reads.
    let recorded = dir.path().join("engine-only");
    engine_only(
        &bare,
        &[
            "--engine-capture",
            file.to_str().unwrap(),
            "--out",
            recorded.to_str().unwrap(),
        ],
    );
    let cells = std::fs::read_to_string(recorded.join("engine_cells.csv")).unwrap();
    assert_eq!(cells.lines().count(), 2, "{cells}");
    assert!(
        cells
            .lines()
            .nth(1)
            .unwrap()
            .starts_with("L2048-d40-engine-k64,2048,2048,"),
        "{cells}"
    );
    let report = ok(
        bin().arg("report").arg(&recorded).output().unwrap(),
        "report",
    );
    assert!(report.contains("engine only"), "{report}");
    // --no-local on a model with weights: the same.
    let no_local = serde_json::from_str::<Value>(&ok(
        probe(&[
            "--engine-capture",
            file.to_str().unwrap(),
            "--no-local",
            "--json",
        ]),
        "--no-local",
    ))
    .unwrap();
    assert_eq!(no_local["engine"]["layers"], only["engine"]["layers"]);
}

fn engine_only(model: &Path, args: &[&str]) -> Value {
    let out = bin()
        .arg("probe")
        .arg("--model")
        .arg(model)
        .args([
            "--scenario",
            "passkey",
            "--length",
            "2k",
            "--depth",
            "40",
            "--generate",
            "3",
        ])
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    serde_json::from_str(&ok(out, "engine-only probe")).unwrap()
}

/// One HTTP POST over a plain socket (the saved body, as `curl -o` would keep it).
fn post(url: &str, body: &Value) -> Vec<u8> {
    use std::io::{Read, Write};
    let addr = url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let payload = body.to_string();
    write!(
        s,
        "POST /generate HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{payload}",
        payload.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&raw[..split]).to_lowercase();
    let body = raw[split + 4..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        dechunk(&body)
    } else {
        body
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = b.windows(2).position(|w| w == b"\r\n").unwrap();
        let size =
            usize::from_str_radix(std::str::from_utf8(&b[..eol]).unwrap().trim(), 16).unwrap();
        b = &b[eol + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}

#[test]
fn probe_out_and_sweep_record_the_engine_and_report_re_renders_it() {
    let server = start(
        planted(),
        IndexProfile::SglangFp8,
        KvMode::Exact,
        Fault::None,
        3,
        LIFETIME,
    );
    let dir = tempfile::tempdir().unwrap();
    // probe --out: engine.csv beside the reference's records.
    let probed = dir.path().join("probe");
    ok(
        probe(&["--engine", &server.url, "--out", probed.to_str().unwrap()]),
        "probe --engine --out",
    );
    let engine_csv = std::fs::read_to_string(probed.join("engine.csv")).unwrap();
    let header = engine_csv.lines().next().unwrap();
    assert_eq!(
        header,
        "cell_id,layer,query_pos,phase,needle,engine_topk,visible_rows,selected_rows,needle_selected,profile,overlap"
    );
    // 2 CSA layers x 3 probed positions x 8 profiles.
    assert_eq!(engine_csv.lines().count(), 1 + 2 * 3 * 8, "{engine_csv}");
    let report = ok(bin().arg("report").arg(&probed).output().unwrap(), "report");
    assert!(report.contains("serving engine (engine.csv)"), "{report}");
    assert!(
        probed.join("heatmap_engine_64.png").is_file(),
        "the engine's heatmap beside the reference's"
    );
    // report.html has the engine's section: its conclusion and its heatmap.
    let page = std::fs::read_to_string(probed.join("report.html")).unwrap();
    assert!(page.contains("<section id=\"engine\">"), "engine section");
    assert!(
        page.contains("heatmap_engine_64.png"),
        "engine heatmap on the page"
    );
    assert!(
        report.contains("closest") || report.contains("agree"),
        "{report}"
    );

    // sweep --engine: one request per prompt, engine.csv rows for every cell, resumable.
    let swept = dir.path().join("sweep");
    let sweep = |extra: &[&str]| {
        bin()
            .arg("sweep")
            .arg("--model")
            .arg(planted())
            .args([
                "--scenario",
                "passkey",
                "--lengths",
                "1k,2k",
                "--depths",
                "50",
            ])
            .args([
                "--kv",
                "exact",
                "--generate",
                "2",
                "--engine",
                &server.url,
                "--out",
            ])
            .arg(&swept)
            .args(extra)
            .output()
            .unwrap()
    };
    let text = ok(sweep(&[]), "sweep --engine");
    assert!(text.contains("engine lost 0/"), "{text}");
    let rows = std::fs::read_to_string(swept.join("engine.csv")).unwrap();
    for cell in ["L1024-d50-fp8-k64-s0", "L2048-d50-fp8-k64-s0"] {
        assert!(rows.lines().any(|l| l.starts_with(cell)), "{cell}: {rows}");
    }
    let run_json: Value =
        serde_json::from_str(&std::fs::read_to_string(swept.join("run.json")).unwrap()).unwrap();
    let args = &run_json["sweep_args"];
    assert_eq!(args["engine"], "sglang", "{run_json}");
    assert!(
        !args.to_string().contains(&server.url),
        "the address is not a result: {args}"
    );
    // Rerun: every cell finished, no request sent.
    let again = ok(sweep(&[]), "sweep --engine resumed");
    assert!(again.contains("0 cells run, 2 already finished"), "{again}");
    assert_eq!(server.served.load(std::sync::atomic::Ordering::SeqCst), 3);
    // --topk contradicts the engine's K.
    let out = sweep(&["--topk", "128"]);
    assert_eq!(out.status.code(), Some(1));
}

/// A DeepSeek-V4-Pro schedule (61 layers, 30 ratio-4 layers, index_topk 1024) in engine-only
/// mode: config.json alone (the built-in tokenizer), a capture of that shape read and checked.
#[test]
fn engine_only_reads_a_pro_shaped_capture() {
    use base64::Engine as _;
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("pro");
    std::fs::create_dir(&model).unwrap();
    let mut cfg: Value =
        serde_json::from_str(&needlescope::config::ModelConfig::flash().to_json_string()).unwrap();
    let mut ratios = vec![128, 128];
    for layer in 2..61 {
        ratios.push(if layer % 2 == 0 { 4 } else { 128 });
    }
    ratios.push(0);
    assert_eq!(ratios.iter().filter(|&&r| r == 4).count(), 30);
    cfg["num_hidden_layers"] = 61.into();
    cfg["compress_ratios"] = serde_json::json!(ratios);
    cfg["index_topk"] = 1024.into();
    std::fs::write(model.join("config.json"), cfg.to_string()).unwrap();

    let prompt = ok(
        bin()
            .arg("prompt")
            .arg("--model")
            .arg(&model)
            .args(["--scenario", "passkey", "--length", "300", "--json"])
            .output()
            .unwrap(),
        "prompt",
    );
    let p: Value = serde_json::from_str(&prompt).unwrap();
    let n = match &p["tokens"] {
        Value::Array(ids) => ids.len(),
        other => other.as_u64().unwrap() as usize,
    };
    let needle: Vec<usize> = serde_json::from_value(p["needles"][0]["span"].clone()).unwrap();
    // One generated token: rows 0..n-1, each layer selecting every visible row but the
    // needle's on layer 2 (slot 0), in reverse order, padded to 1024.
    let (k, layers) = (1024usize, 30usize);
    let needle_rows = needle[0] / 4..(needle[1] - 1) / 4 + 2;
    let mut bytes = Vec::with_capacity(n * layers * k * 4);
    for t in 0..n {
        let visible = (t + 1) / 4;
        for slot in 0..layers {
            let mut row: Vec<i32> = (0..visible)
                .rev()
                .filter(|w| !(slot == 0 && t == n - 1 && needle_rows.contains(w)))
                .map(|w| w as i32)
                .collect();
            row.resize(k, -1);
            bytes.extend(row.iter().flat_map(|v| v.to_le_bytes()));
        }
    }
    let body = serde_json::json!({
        "text": "1234567",
        "output_ids": [16],
        "meta_info": {
            "id": "pro",
            "finish_reason": {"type": "length", "length": 1},
            "prompt_tokens": n,
            "completion_tokens": 1,
            "cached_tokens": 0,
            "indexer_topk": base64::engine::general_purpose::STANDARD.encode(&bytes),
        },
    });
    let file = dir.path().join("pro.json");
    std::fs::write(&file, body.to_string()).unwrap();
    let out = bin()
        .arg("probe")
        .arg("--model")
        .arg(&model)
        .args([
            "--scenario",
            "passkey",
            "--length",
            "300",
            "--generate",
            "1",
        ])
        .args(["--engine-capture", file.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_str(&ok(out, "engine-only Pro")).unwrap();
    let e = &v["engine"];
    assert_eq!(e["topk"], 1024);
    let layers_out = e["layers"].as_array().unwrap();
    assert_eq!(
        layers_out.len(),
        30,
        "one entry per ratio-4 layer at the answer position"
    );
    assert_eq!(layers_out[0]["layer"], 2);
    assert_eq!(layers_out[29]["layer"], 60);
    assert_eq!(layers_out[0]["needle_selected"], false);
    assert!(layers_out[1..].iter().all(|l| l["needle_selected"] == true));
    // Every layer is trivial (75 visible rows <= K 1024): warnings name the short rows.
    assert!(e["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .any(|w| w.as_str().unwrap().contains("layer 2")));
}

/// `sweep --engine` with no local model: engine_cells.csv and engine.csv per prompt, resumable
/// (a rerun sends nothing), re-rendered by `report`; `--no-local` on a model with weights too.
#[test]
fn an_engine_only_sweep_records_membership_and_resumes() {
    let server = start(
        planted(),
        IndexProfile::SglangFp8,
        KvMode::Exact,
        Fault::None,
        5,
        LIFETIME,
    );
    let dir = tempfile::tempdir().unwrap();
    let bare = dir.path().join("bare");
    std::fs::create_dir(&bare).unwrap();
    std::fs::copy(planted().join("config.json"), bare.join("config.json")).unwrap();
    let swept = dir.path().join("sweep");
    let sweep = |model: &Path, out: &Path, extra: &[&str]| {
        let lengths = if extra.contains(&"--no-local") {
            "2k"
        } else {
            "1k,2k"
        };
        bin()
            .arg("sweep")
            .arg("--model")
            .arg(model)
            .args([
                "--scenario",
                "passkey",
                "--lengths",
                lengths,
                "--depths",
                "50",
            ])
            .args(["--generate", "2", "--engine", &server.url, "--out"])
            .arg(out)
            .args(extra)
            .output()
            .unwrap()
    };
    let text = ok(sweep(&bare, &swept, &[]), "engine-only sweep");
    assert!(text.contains("2 cells run, 0 already finished"), "{text}");
    assert!(text.contains("engine only (no local forward)"), "{text}");
    assert!(!swept.join("cells.csv").exists(), "no reference records");
    let cells = std::fs::read_to_string(swept.join("engine_cells.csv")).unwrap();
    let ids: Vec<&str> = cells
        .lines()
        .skip(1)
        .map(|l| l.split(',').next().unwrap())
        .collect();
    assert_eq!(
        ids,
        ["L1024-d50-engine-k64-s0", "L2048-d50-engine-k64-s0"],
        "{cells}"
    );
    let rows = std::fs::read_to_string(swept.join("engine.csv")).unwrap();
    // 2 CSA layers x (answer + 1 decode position) per cell, profile and overlap empty.
    for id in &ids {
        let mine: Vec<&str> = rows.lines().filter(|l| l.starts_with(id)).collect();
        assert_eq!(mine.len(), 4, "{id}: {rows}");
        assert!(mine.iter().all(|l| l.ends_with(",,")), "{rows}");
    }
    // Resumed: nothing sent, nothing added.
    let again = ok(sweep(&bare, &swept, &[]), "engine-only sweep resumed");
    assert!(again.contains("0 cells run, 2 already finished"), "{again}");
    assert_eq!(server.served.load(std::sync::atomic::Ordering::SeqCst), 2);
    let report = ok(bin().arg("report").arg(&swept).output().unwrap(), "report");
    assert!(report.contains("engine only"), "{report}");
    assert!(
        report.contains("2/2 layers") || report.contains("/2 layers"),
        "{report}"
    );
    // More samples grow the grid: only the new prompts are sent.
    let grown = ok(
        sweep(&bare, &swept, &["--samples", "2"]),
        "engine-only grid grown",
    );
    assert!(
        grown.contains("the grid grows (samples 1 -> 2)")
            && grown.contains("2 cells run, 2 already finished"),
        "{grown}"
    );
    assert_eq!(server.served.load(std::sync::atomic::Ordering::SeqCst), 4);
    // Another seed would change the finished cells: refused by name, nothing sent.
    let other = sweep(&bare, &swept, &["--samples", "2", "--seed", "5"]);
    assert_eq!(other.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&other.stderr).contains("sweep_args.seed"));
    assert_eq!(server.served.load(std::sync::atomic::Ordering::SeqCst), 4);
    // A run with a local model never takes over (and empties) an engine-only directory.
    let before = std::fs::read_to_string(swept.join("engine.csv")).unwrap();
    let out = bin()
        .arg("sweep")
        .arg("--model")
        .arg(planted())
        .args([
            "--scenario",
            "passkey",
            "--lengths",
            "1k",
            "--depths",
            "50",
            "--out",
        ])
        .arg(&swept)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("engine-only report"));
    assert_eq!(
        std::fs::read_to_string(swept.join("engine.csv")).unwrap(),
        before
    );
    // --no-local on the planted model: the same membership.
    let no_local = dir.path().join("no-local");
    ok(sweep(planted(), &no_local, &["--no-local"]), "--no-local");
    let a: Vec<String> = rows
        .lines()
        .filter(|l| l.starts_with("L2048"))
        .map(String::from)
        .collect();
    let b: Vec<String> = std::fs::read_to_string(no_local.join("engine.csv"))
        .unwrap()
        .lines()
        .skip(1)
        .map(String::from)
        .collect();
    assert_eq!(a, b);
}
