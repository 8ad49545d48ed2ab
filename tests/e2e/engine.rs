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
