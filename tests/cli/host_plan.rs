//! The CPU host's memory plan (`devices::plan::host_plan`) through the binary: `inspect
//! --devices cpu[:SIZE]` on the Flash config (parts, residency, threads, refusal with the
//! shortfall), and every CPU run refused before it loads a weight when the host cannot hold it
//! (`NEEDLESCOPE_HOST_MEMORY` stands for a small host), V4 and V4.1 alike; and the plan against
//! the peak resident set a CPU run reaches.

use needlescope_testkit::cli as cli_support;

use cli_support::*;
use serde_json::Value;
use std::path::Path;

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// `inspect --config FLASH --devices DEVICES --json` plus `extra` (`--context 128k` unless
/// `extra` gives one): the run and its report.
fn flash_plan(cfg: &Path, devices: &str, extra: &[&str]) -> (Run, Value) {
    let mut args = vec![
        "inspect".to_string(),
        "--config".into(),
        s(cfg),
        "--devices".into(),
        devices.into(),
        "--json".into(),
    ];
    if !extra.contains(&"--context") {
        args.extend(["--context".to_string(), "128k".into()]);
    }
    args.extend(extra.iter().map(|a| a.to_string()));
    let r = run(&args);
    let v: Value = serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}\n{}", r.dump()));
    (r, v)
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

#[test]
fn flash_on_a_cpu_host_is_planned_part_by_part_and_refused_with_its_shortfall() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = flash_config(tmp.path());

    // 512 GiB: streamed (the decoded model would take over a quarter), fits.
    let (r, v) = flash_plan(&cfg, "cpu:512G", &["--threads", "2"]);
    let r = r.ok();
    let p = &v["host_plan"];
    assert!(v["plan"].is_null(), "no GPU plan for cpu: {}", r.dump());
    assert_eq!(p["weights"], "streamed");
    assert_eq!(p["capacity"], 512u64 << 30);
    assert_eq!(p["capacity_source"], "given");
    assert_eq!(p["fits"], true);
    assert_eq!(p["decoded_weights"], 0);
    // Every stored byte of the main model stays mapped; MTP is never read.
    assert_eq!(p["mapped_weights"], v["footprint"]["main"]["bytes"]);
    assert_eq!(p["excluded_bytes"], v["footprint"]["mtp"]["bytes"]);
    let total = u(&p["total"]);
    assert_eq!(
        total,
        u(&p["mapped_weights"]) + u(&p["state"]) + u(&p["workspace"])
    );
    // 21 CSA layers' compressed KV and index keys at 128k: several GiB, well under the weights.
    let state = u(&p["state"]);
    assert!((4u64 << 30..6u64 << 30).contains(&state), "state {state}");

    // Twice the context: the compressed caches double, the windows stay.
    let (_, v2) = flash_plan(&cfg, "cpu:512G", &["--threads", "2", "--context", "256k"]);
    let state2 = u(&v2["host_plan"]["state"]);
    let ratio = state2 as f64 / state as f64;
    assert!(
        (1.85..2.0).contains(&ratio),
        "state 128k {state}, 256k {state2}"
    );

    // Each thread adds two decoded bands of the widest linear (256 rows x wo_b's 8 x 1024
    // columns x 4 B) and 8 MiB of GEMM packing.
    let (_, v64) = flash_plan(&cfg, "cpu:512G", &["--threads", "64"]);
    assert_eq!(v64["host_plan"]["threads"], 64);
    assert_eq!(
        u(&v64["host_plan"]["workspace"]) - u(&p["workspace"]),
        62 * (2 * 256 * 8192 * 4 + (8 << 20))
    );

    // 64 GiB: refused, the report first, then the error naming parts and shortfall.
    let (r, v) = flash_plan(&cfg, "cpu:64G", &["--threads", "2"]);
    let r = r.fails().stderr_has(&[
        "host memory plan refused",
        "mapped weights",
        "short by",
        "cpu:64G",
    ]);
    let p = &v["host_plan"];
    assert_eq!(p["fits"], false, "{}", r.dump());
    assert_eq!(u(&p["shortfall"]), u(&p["total"]) - (64u64 << 30));

    // Decoded on purpose: 4 B per parameter of the main model, refused even at 512 GiB.
    let (r, v) = flash_plan(&cfg, "cpu:512G", &["--weights", "decoded"]);
    r.fails().stderr_has(&["weights decoded", "decoded copies"]);
    let p = &v["host_plan"];
    assert_eq!(p["mapped_weights"], 0);
    assert_eq!(
        u(&p["decoded_weights"]),
        4 * u(&v["footprint"]["main"]["params"])
    );

    // The text form, against a host of 64 GiB standing in for this one.
    let mut host = bin();
    host.env("NEEDLESCOPE_HOST_MEMORY", "64G");
    run_in(
        host,
        &[
            "inspect",
            "--config",
            &s(&cfg),
            "--devices",
            "cpu",
            "--context",
            "4k",
            "--weights",
            "streamed",
        ],
    )
    .fails()
    .stdout_has(&[
        "host memory plan cpu at context 4,096 tokens",
        "weights streamed",
        "mapped weights",
        "decoded copies",
        "state",
        "workspace",
        "64.00 GiB (NEEDLESCOPE_HOST_MEMORY)",
        "shortfall",
        "assumes: ",
    ]);
    // This host's own memory, for a model it holds.
    let model = tmp.path().join("tiny");
    synth_tiny(&model, &[]);
    let r = run(&[
        "inspect",
        "--model",
        &s(&model),
        "--devices",
        "cpu",
        "--context",
        "16k",
    ])
    .ok()
    .stdout_has(&["host memory plan cpu at context 16,384 tokens", "fits"]);
    assert!(
        r.stdout.contains("(MemAvailable)") || r.stdout.contains("(cgroup memory limit)"),
        "{}",
        r.dump()
    );
}

#[test]
fn bad_host_plan_flags_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = flash_config(tmp.path());
    let c = s(&cfg);
    run(&["inspect", "--config", &c, "--devices", "cpu:lots"])
        .fails()
        .stderr_has(&["--devices", "cpu:SIZE", "\"lots\""]);
    run(&["inspect", "--config", &c, "--weights", "decoded"])
        .fails()
        .stderr_has(&["--devices"]);
    run(&[
        "inspect",
        "--config",
        &c,
        "--devices",
        "cpu",
        "--weights",
        "fp8",
    ])
    .fails()
    .stderr_has(&["--weights", "decoded, streamed or auto"]);
    let mut cmd = bin();
    cmd.env("NEEDLESCOPE_HOST_MEMORY", "plenty");
    run_in(cmd, &["inspect", "--config", &c, "--devices", "cpu"])
        .fails()
        .stderr_has(&["NEEDLESCOPE_HOST_MEMORY", "\"plenty\""]);
}

#[test]
fn a_cpu_run_the_host_cannot_hold_is_refused_before_it_loads() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny");
    synth_tiny_as(&model, "bf16", &[]);
    let tokens = tmp.path().join("ids.txt");
    std::fs::write(&tokens, "5 6 7 8 9 10 11 12").unwrap();
    let out = tmp.path().join("trace.safetensors");
    let args = [
        "trace",
        "--device",
        "cpu",
        "--model",
        &s(&model),
        "--tokens",
        &s(&tokens),
        "--out",
        &s(&out),
    ];
    let mut small = bin();
    small.env("NEEDLESCOPE_HOST_MEMORY", "64M");
    run_in(small, &args).fails().stderr_has(&[
        "host memory plan refused",
        "context 8",
        "(NEEDLESCOPE_HOST_MEMORY)",
        "before loading anything",
    ]);
    assert!(!out.exists(), "a refused run wrote {}", out.display());
    let mut big = bin();
    big.env("NEEDLESCOPE_HOST_MEMORY", "64G");
    run_in(big, &args).ok();
    assert!(out.exists());

    // DeepSeek-V4.1 (always decoded on the CPU) too.
    let v41 = tmp.path().join("v41");
    synth_v41_tiny(&v41);
    let mut small = bin();
    small.env("NEEDLESCOPE_HOST_MEMORY", "64M");
    run_in(
        small,
        &["probe", "--model", &s(&v41), "--length", "300", "--json"],
    )
    .fails()
    .stderr_has(&["host memory plan refused", "weights decoded"]);
    let r = run(&[
        "inspect",
        "--model",
        &s(&v41),
        "--devices",
        "cpu:4G",
        "--context",
        "4k",
        "--weights",
        "streamed",
        "--json",
    ])
    .ok();
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    let p = &v["host_plan"];
    assert_eq!(p["weights"], "decoded", "V4.1's CPU model always decodes");
    // Its Engram tables stay mapped, read by row; the rest is decoded.
    assert_eq!(p["mapped_weights"], v["footprint"]["host_bytes"]);
    assert!(u(&p["mapped_weights"]) > 0);
}

#[test]
fn the_plan_covers_what_a_cpu_run_holds() {
    // The peak resident set of a CPU prefill (bench's VmHWM: every page the process touched,
    // the mapped checkpoint's included) stays under the plan of the same run.
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny");
    synth_tiny(&model, &[]);
    let m = s(&model);
    for weights in ["decoded", "streamed"] {
        let r = run(&[
            "bench",
            "--model",
            &m,
            "--lengths",
            "4096",
            "--weights",
            weights,
            "--device",
            "cpu",
        ])
        .ok();
        let row = r
            .stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some("4096"))
            .unwrap_or_else(|| panic!("no 4096 row\n{}", r.dump()));
        let rss_mib: f64 = row.split_whitespace().nth(4).unwrap().parse().unwrap();
        let r = run(&[
            "inspect",
            "--model",
            &m,
            "--devices",
            "cpu:1T",
            "--context",
            "4096",
            "--weights",
            weights,
            "--json",
        ])
        .ok();
        let v: Value = serde_json::from_str(&r.stdout).unwrap();
        // A decoded run also touched the mapped file once at load.
        let planned = u(&v["host_plan"]["total"]) + u(&v["footprint"]["main"]["bytes"]);
        let measured = (rss_mib * (1 << 20) as f64) as u64;
        assert!(
            measured <= planned,
            "{weights}: peak RSS {measured} B over the plan's {planned} B"
        );
    }
}
