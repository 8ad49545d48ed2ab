//! `--cpu-gemm bf16` through the binary: the CPU backend's linear products with bf16 operands
//! (backend::cpu::bf16_gemm), recorded as such, keeping the planted needle's selections of the
//! f32 reference without equalling its scores, and named in `bench`'s reference line; ignored,
//! with a note, on a GPU backend; refused for DeepSeek-V4.1.

use needlescope_testkit::cli as cli_support;

use cli_support::*;
use serde_json::Value;
use std::path::Path;

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// `probe --json` of the planted model at 4k tokens, the needle at half depth, fp8 keys,
/// top-64, with `--cpu-gemm gemm`.
fn probe(model: &Path, gemm: &str) -> Value {
    let r = run(&[
        "probe",
        "--model",
        &s(model),
        "--length",
        "4k",
        "--depth",
        "50",
        "--index",
        "fp8",
        "--topk",
        "64",
        "--device",
        "cpu",
        "--cpu-gemm",
        gemm,
        "--json",
    ])
    .ok();
    serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}\n{}", r.dump()))
}

#[test]
fn bf16_products_keep_the_planted_needle_s_selections_and_say_so() {
    // Compared where the reference is stable: the planted model's needle (tiny random models
    // flip MoE routes under any rounding). Measured over the demo's whole grid: every verdict
    // and 598 of 600 layer selections equal, ranks within 9 (docs/commands.md).
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("planted");
    synth_planted(&model);
    let (f, b) = (probe(&model, "f32"), probe(&model, "bf16"));
    assert_eq!(f["backend"]["kind"], "cpu");
    assert!(f["backend"].get("gemm").is_none(), "{}", f["backend"]);
    assert_eq!(b["backend"]["gemm"], "bf16");
    let rows = |v: &Value| v["runs"][0]["layers"].as_array().unwrap().clone();
    let (fr, br) = (rows(&f), rows(&b));
    assert_eq!(fr.len(), br.len());
    assert!(!fr.is_empty());
    let mut moved = false;
    for (x, y) in fr.iter().zip(&br) {
        assert_eq!((&x["layer"], &x["needle"]), (&y["layer"], &y["needle"]));
        assert_eq!(x["selected"], y["selected"], "f32 {x}\nbf16 {y}");
        let (rx, ry) = (
            x["needle_rank"].as_i64().unwrap(),
            y["needle_rank"].as_i64().unwrap(),
        );
        assert!((rx - ry).abs() <= 3, "rank {rx} (f32) vs {ry} (bf16)");
        moved |= x["needle_score"] != y["needle_score"];
    }
    assert!(moved, "bf16 products gave the f32 scores bit for bit");
    assert_eq!(f["runs"][0]["lost_layers"], b["runs"][0]["lost_layers"]);
}

#[test]
fn bench_names_the_bf16_kernels_and_a_gpu_ignores_the_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny");
    synth_tiny(&model, &[]);
    let r = run(&[
        "bench",
        "--model",
        &s(&model),
        "--lengths",
        "64",
        "--device",
        "cpu",
        "--cpu-gemm",
        "bf16",
    ])
    .ok()
    .stdout_has(&[
        "backend cpu (GEMM bf16)",
        "reference: bf16 GEMM 512x4096x2048 (",
    ]);
    assert!(
        r.stdout.contains("(amx-bf16 kernels")
            || r.stdout.contains("(avx512-bf16 kernels")
            || r.stdout.contains("(portable kernels"),
        "{}",
        r.dump()
    );
    run(&[
        "bench",
        "--model",
        &s(&model),
        "--lengths",
        "64",
        "--device",
        "emu",
        "--cpu-gemm",
        "bf16",
    ])
    .ok()
    .stderr_has(&["--cpu-gemm bf16 is ignored on a GPU backend"]);
    run(&["bench", "--model", &s(&model), "--cpu-gemm", "fp8"])
        .fails()
        .stderr_has(&["--cpu-gemm"]);
}

#[test]
fn deepseek_v41_refuses_bf16_products() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("v41");
    synth_v41_tiny(&model);
    run(&[
        "probe",
        "--model",
        &s(&model),
        "--length",
        "300",
        "--cpu-gemm",
        "bf16",
    ])
    .fails()
    .stderr_has(&["--cpu-gemm bf16", "DeepSeek-V4.1", "f32 only"]);
}
