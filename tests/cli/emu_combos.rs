//! The GPU backend through the binary on host-emulated devices (`--device emu...`) against
//! `--device cpu`, in combinations `tests/cli/device.rs` leaves out: `trace
//! --dump-indexer-inputs` (raw q, keys, head weights, scores, top-k, logits) under several
//! profiles, KV modes, chunks (1, shorter than the compress ratio, past the window) and top-k
//! past the visible rows, on one device and split over three; `probe` ranks, selections and
//! figures under several driving and --compare profiles, both KV modes, decode steps and
//! `--probe question`, on bf16 and official planted models, with and without the opt-in GEMM
//! attention and batched experts (`NEEDLESCOPE_ATTENTION=gemm NEEDLESCOPE_MOE=batched`).

use needlescope_testkit::cli as cli_support;

use cli_support::{bin, run, synth_tiny};
use needlescope::checkpoint::Checkpoint;
use needlescope::devices::placement::{place, DeviceMemory, Workload};
use needlescope::devices::plan::Footprint;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;

struct Models {
    _dir: tempfile::TempDir,
    tiny: PathBuf,
    planted: PathBuf,
    planted_official: PathBuf,
    ids: PathBuf,
}

fn models() -> &'static Models {
    static M: OnceLock<Models> = OnceLock::new();
    M.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let tiny = dir.path().join("tiny");
        synth_tiny(&tiny, &[]);
        let planted = dir.path().join("planted");
        cli_support::synth_planted(&planted);
        let planted_official = dir.path().join("planted-official");
        run(&[
            "synth",
            "--preset",
            "planted",
            "--format",
            "official",
            "--out",
            &s(&planted_official),
        ])
        .ok();
        // 170 ids, none zero: 42 CSA rows, one HCA row, past the window of 128.
        let ids = dir.path().join("ids.txt");
        let text: Vec<String> = (0..170)
            .map(|i| ((i * 37) % 4000 + 3).to_string())
            .collect();
        std::fs::write(&ids, text.join(" ")).unwrap();
        Models {
            _dir: dir,
            tiny,
            planted,
            planted_official,
            ids,
        }
    })
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// Runs the binary with `args` and extra environment `env`, asserting success.
fn ok(args: &[String], env: &[(&str, &str)]) -> String {
    let mut c = bin();
    c.args(args).stdin(Stdio::null());
    // The opt-in paths only where asked for.
    c.env_remove("NEEDLESCOPE_ATTENTION")
        .env_remove("NEEDLESCOPE_MOE");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{args:?} failed:\n{so}\n{se}");
    so
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn i32s(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// `trace --positions all --logits all --dump-indexer-inputs` of the ids on tiny into `out`.
fn trace(out: &Path, device: &str, extra: &[&str], env: &[(&str, &str)]) -> String {
    let m = models();
    let mut args: Vec<String> = [
        "trace",
        "--model",
        &s(&m.tiny),
        "--tokens",
        &s(&m.ids),
        "--positions",
        "all",
        "--logits",
        "all",
        "--dump-indexer-inputs",
        "--device",
        device,
        "--out",
        &s(out),
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    args.extend(extra.iter().map(|a| a.to_string()));
    ok(&args, env)
}

/// Largest |emu - cpu| over the tensor's largest finite |cpu| (infinite when the non-finite
/// entries differ).
fn tensor_error(a: &[f32], b: &[f32]) -> f64 {
    let scale = b
        .iter()
        .filter(|x| x.is_finite())
        .fold(0f64, |m, x| m.max(x.abs() as f64));
    let mut worst = 0f64;
    for (x, y) in a.iter().zip(b) {
        if x == y || (x.is_nan() && y.is_nan()) {
            continue;
        }
        if !x.is_finite() || !y.is_finite() {
            return f64::INFINITY;
        }
        worst = worst.max((*x as f64 - *y as f64).abs());
    }
    worst / scale.max(1e-30)
}

/// Compares two trace files: same tensors, shapes, dtypes and metadata (backend aside),
/// integer tensors (tokens, positions) equal, and, with the thresholds of
/// `run::parity::ForwardTolerance::F32` (normalised by each tensor's largest
/// finite magnitude; non-finite entries equal):
/// - `exact` index and KV (`rounding` false): every f32 tensor (raw q, keys, head weights,
///   scores, logits) within 1e-4, and no top-k row selected by one side only unless its CPU
///   score ties the CPU's k-th score within 1e-4;
/// - a rounding index profile or fp8 KV (`rounding` true; a trace replays nothing, so a
///   legitimate one-ulp rounding flip upstream moves what follows, tests/backend/emu_parity.rs):
///   the first CSA layer's raw inputs still within 1e-4 under exact KV, every other f32 tensor
///   within a few code steps (5e-2; logits 1e-2), at most 3% of selected rows differing beyond
///   near-ties.
fn compare_traces(emu: &Path, cpu: &Path, what: &str, rounding: bool, fp8_kv: bool) {
    let (eb, cb) = (std::fs::read(emu).unwrap(), std::fs::read(cpu).unwrap());
    let (e, c) = (
        SafeTensors::deserialize(&eb).unwrap(),
        SafeTensors::deserialize(&cb).unwrap(),
    );
    let mut names = c.names();
    names.sort();
    let mut en = e.names();
    en.sort();
    assert_eq!(names, en, "{what}: tensor names");
    let mut seen_inputs = false;
    let mut report = Vec::new();
    for name in names {
        let (te, tc) = (e.tensor(name).unwrap(), c.tensor(name).unwrap());
        assert_eq!(te.shape(), tc.shape(), "{what}: {name} shape");
        assert_eq!(te.dtype(), tc.dtype(), "{what}: {name} dtype");
        if name.ends_with(".topk") {
            let (ge, gc) = (i32s(te.data()), i32s(tc.data()));
            let k = *tc.shape().last().unwrap();
            let scores_name = name.replace(".topk", ".scores");
            let sc = f32s(c.tensor(&scores_name).unwrap().data());
            let n_rows = sc.len() / tc.shape()[0];
            let scale = sc
                .iter()
                .filter(|x| x.is_finite())
                .fold(0f32, |m, x| m.max(x.abs()));
            let (mut bad, mut total) = (0usize, 0usize);
            let mut first = None;
            for (q, (re, rc)) in ge.chunks(k).zip(gc.chunks(k)).enumerate() {
                total += rc.iter().filter(|&&r| r >= 0).count().max(1);
                if re == rc {
                    continue;
                }
                let row = &sc[q * n_rows..(q + 1) * n_rows];
                let kth = rc.iter().rev().find(|&&r| r >= 0).map(|&r| row[r as usize]);
                let a: std::collections::BTreeSet<_> = re.iter().filter(|&&r| r >= 0).collect();
                let b: std::collections::BTreeSet<_> = rc.iter().filter(|&&r| r >= 0).collect();
                for &&r in a.symmetric_difference(&b) {
                    let tie = kth.is_some_and(|k| (row[r as usize] - k).abs() <= 1e-4 * scale);
                    if !tie {
                        bad += 1;
                        first.get_or_insert(format!("query {q}: emu {re:?} cpu {rc:?}"));
                    }
                }
            }
            let frac = bad as f64 / total.max(1) as f64;
            let limit = if rounding { 0.03 } else { 0.0 };
            report.push(format!(
                "{name}: {bad}/{total} rows differ beyond near-ties"
            ));
            assert!(
                frac <= limit,
                "{what}: {name}: {bad} of {total} selected rows differ beyond near-ties \
                 (first: {})",
                first.unwrap_or_default()
            );
        } else if tc.dtype() == Dtype::F32 {
            let input =
                name.ends_with(".q") || name.ends_with(".keys") || name.ends_with(".weights");
            seen_inputs |= input;
            let err = tensor_error(&f32s(te.data()), &f32s(tc.data()));
            let first_csa = name.starts_with("layers.1.");
            let limit = if !rounding || (input && first_csa && !fp8_kv) {
                1e-4
            } else if name == "logits" {
                1e-2
            } else {
                5e-2
            };
            report.push(format!("{name}: error {err:.3e} (limit {limit:.0e})"));
            assert!(
                err <= limit,
                "{what}: {name}: error {err:e} over {limit:e}\n{}",
                report.join("\n")
            );
        } else {
            assert_eq!(te.data(), tc.data(), "{what}: {name}");
        }
    }
    eprintln!("{what}:\n  {}", report.join("\n  "));
    assert!(seen_inputs, "{what}: no indexer inputs dumped");
    let meta = |b: &[u8]| {
        let (_, m) = SafeTensors::read_metadata(b).unwrap();
        let mut m = m.metadata().clone().unwrap_or_default();
        m.remove("backend");
        m
    };
    assert_eq!(meta(&eb), meta(&cb), "{what}: metadata");
}

/// Emulated capacities (whole MB) that split tiny's four layers over three devices for the
/// traces here (chunk 3, top-k 64, 170 tokens): the smallest devices first.
fn three_way() -> String {
    let ckpt = Checkpoint::open(&models().tiny).unwrap();
    let fp = Footprint::of_checkpoint(&ckpt);
    let work = Workload {
        context: 170,
        chunk: 3,
        topk: 64,
    };
    let dev = |kb: &[u64]| -> Vec<DeviceMemory> {
        kb.iter()
            .enumerate()
            .map(|(i, mb)| DeviceMemory {
                name: format!("emu:{i}"),
                free: mb * 1_000,
            })
            .collect()
    };
    // Every device is charged a workspace (about 1 GiB, dominating on tiny): scan capacities
    // just above it, where each device holds one or two layers.
    let mut cfg = ckpt.config().clone();
    cfg.index_topk = work.topk;
    let ws =
        needlescope::devices::plan::workspace_bytes(&cfg, work.context, work.chunk, false) / 1000;
    // The last device also holds the logits of PROBED_LOGIT_ROWS positions.
    let logits = needlescope::devices::plan::PROBED_LOGIT_ROWS * cfg.vocab_size as u64 * 4 / 1000;
    for c in (0..40).map(|i| ws + logits + i * 200) {
        for a in (0..40).map(|i| ws + i * 50) {
            for b in (0..40).map(|i| ws + i * 50) {
                let caps = [a, b, c];
                if let Ok(p) = place(ckpt.config(), &fp, &dev(&caps), &work) {
                    let distinct: std::collections::BTreeSet<_> = p.layer_device.iter().collect();
                    if distinct.len() == 3 {
                        let mb = |kb: u64| format!("1x{:.3}MB", kb as f64 / 1000.0);
                        return format!("emu:{},{},{}", mb(a), mb(b), mb(c));
                    }
                }
            }
        }
    }
    panic!("no capacities split tiny over three devices");
}

/// Trace flags, the device, and environment variables of one trace comparison.
type TraceCase<'a> = (&'a [&'a str], &'a str, &'a [(&'a str, &'a str)]);

#[test]
fn trace_with_indexer_inputs_on_the_emulator_equals_the_cpu() {
    let tmp = tempfile::tempdir().unwrap();
    let (e, c) = (tmp.path().join("emu.st"), tmp.path().join("cpu.st"));
    let split = three_way();
    let fast = [
        ("NEEDLESCOPE_ATTENTION", "gemm"),
        ("NEEDLESCOPE_MOE", "batched"),
    ];
    // No fp8 KV in these traces: a one-ulp difference in summation order flips one e4m3
    // rounding of a window KV element of the HCA layer (layer 2, position 3, one code step of
    // 0.25), which all later positions attend to; without the replay of run::parity (a trace
    // replays nothing) the logits then move by 0.2 through rerouted experts (1.3e-2 with the
    // selection and route replays, 7e-7 with the KV rows replayed too). It first showed with
    // the emulator's GEMM attention; since the CPU's f32 products run on the gemm crate's
    // AVX-512 kernels (another summation order than its AVX2 ones) the default kernels flip
    // the same element, on both fp8-KV cases these traces had (logits error 0.211, every
    // other tensor within its limit). fp8 KV is compared with the replays, op by op and end to
    // end, by the engine-level checks (tests/backend/emu_combos.rs, emu_parity.rs).
    let cases: [TraceCase; 6] = [
        (
            &["--index", "exact", "--kv", "exact", "--chunk", "1"],
            "emu",
            &[],
        ),
        (
            &[
                "--index",
                "official-fp4",
                "--kv",
                "exact",
                "--chunk",
                "3",
                "--topk",
                "64",
            ],
            "emu",
            &[],
        ),
        (
            &[
                "--index", "vllm-fp8", "--kv", "exact", "--chunk", "129", "--topk", "4",
            ],
            "emu:2",
            &fast,
        ),
        (
            &[
                "--index", "bf16-qk", "--kv", "exact", "--chunk", "3", "--topk", "64",
            ],
            &split,
            &[],
        ),
        (
            &[
                "--index", "fp8", "--kv", "exact", "--chunk", "3", "--topk", "64",
            ],
            &split,
            &fast,
        ),
        (
            &[
                "--index",
                "sglang-fp4",
                "--kv",
                "exact",
                "--chunk",
                "7",
                "--gpu-gemm",
                "f32",
            ],
            "emu",
            &fast,
        ),
    ];
    for (extra, device, env) in cases {
        let what = format!("{device} {extra:?} {env:?}");
        let placed = trace(&e, device, extra, env);
        eprintln!("{what}: {placed}");
        if device == split {
            assert!(
                placed.contains("emu:1 layer") && placed.contains("emu:2 layer"),
                "{what}: not split over three devices: {placed}"
            );
        }
        trace(&c, "cpu", extra, &[]);
        let profile = extra[1];
        let fp8_kv = extra[3] == "fp8";
        compare_traces(&e, &c, &what, profile != "exact" || fp8_kv, fp8_kv);
    }
}

/// Walks two probe JSON objects: same keys, arrays and non-float values; floats within 1e-3
/// relative (the tolerance of tests/cli/device.rs's trace comparison); `backend` skipped.
fn compare_json(e: &Value, c: &Value, path: &str, diffs: &mut Vec<String>) {
    match (e, c) {
        (Value::Object(a), Value::Object(b)) => {
            let (ka, kb): (Vec<_>, Vec<_>) = (a.keys().collect(), b.keys().collect());
            if ka != kb {
                diffs.push(format!("{path}: keys {ka:?} vs {kb:?}"));
                return;
            }
            for (k, v) in a {
                if path.is_empty() && k == "backend" {
                    continue;
                }
                compare_json(v, &b[k], &format!("{path}.{k}"), diffs);
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            if a.len() != b.len() {
                diffs.push(format!("{path}: {} vs {} entries", a.len(), b.len()));
                return;
            }
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                compare_json(x, y, &format!("{path}[{i}]"), diffs);
            }
        }
        (Value::Number(a), Value::Number(b)) if a.is_f64() || b.is_f64() => {
            let (x, y) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            if (x - y).abs() > 1e-3 * y.abs().max(1.0) {
                diffs.push(format!("{path}: emu {x} vs cpu {y}"));
            }
        }
        _ => {
            if e != c {
                diffs.push(format!("{path}: emu {e} vs cpu {c}"));
            }
        }
    }
}

/// `probe --json` on the planted models (bf16 and official FP8 + FP4) on the emulator and on
/// the CPU: every run's ranks, selections, verdicts and answers equal, figures within 1e-3.
#[test]
fn probe_on_the_emulator_equals_the_cpu_in_every_combination() {
    let m = models();
    let fast = [
        ("NEEDLESCOPE_ATTENTION", "gemm"),
        ("NEEDLESCOPE_MOE", "batched"),
    ];
    let grids: [&[&str]; 3] = [
        &[
            "--length",
            "300",
            "--chunk",
            "1",
            "--kv",
            "exact",
            "--topk",
            "16",
            "--generate",
            "2",
        ],
        &[
            "--length",
            "200",
            "--chunk",
            "3",
            "--kv",
            "fp8",
            "--topk",
            "1024",
            "--generate",
            "4",
            "--probe",
            "question",
        ],
        &[
            "--length",
            "140",
            "--chunk",
            "130",
            "--kv",
            "fp8",
            "--topk",
            "8",
            "--generate",
            "6",
        ],
    ];
    let mut n = 0;
    for model in [&m.planted, &m.planted_official] {
        for (g, grid) in grids.iter().enumerate() {
            let mut args: Vec<String> = ["probe", "--model", &s(model), "--json"]
                .iter()
                .map(|a| a.to_string())
                .collect();
            args.extend(grid.iter().map(|a| a.to_string()));
            args.extend(
                [
                    "--index",
                    "exact,fp8,official-fp4",
                    "--compare",
                    "bf16,sglang-fp4,vllm-fp8,bf16-qk,fp8-no-hadamard-k",
                ]
                .iter()
                .map(|a| a.to_string()),
            );
            let with = |dev: &str| {
                let mut a = args.clone();
                a.extend(["--device".to_string(), dev.to_string()]);
                a
            };
            let cpu: Value = serde_json::from_str(&ok(&with("cpu"), &[])).unwrap();
            let env: &[(&str, &str)] = if g % 2 == 0 { &fast } else { &[] };
            let dev = if g == 1 { "emu:2" } else { "emu" };
            let emu: Value = serde_json::from_str(&ok(&with(dev), env)).unwrap();
            assert_eq!(emu["backend"]["kind"], "cuda-emu");
            let runs = cpu["runs"].as_array().unwrap();
            assert_eq!(runs.len(), 3);
            assert!(runs
                .iter()
                .all(|r| !r["layers"].as_array().unwrap().is_empty()));
            let mut diffs = Vec::new();
            compare_json(&emu, &cpu, "", &mut diffs);
            assert!(
                diffs.is_empty(),
                "{} {grid:?} {env:?}: {} differences:\n{}",
                s(model),
                diffs.len(),
                diffs[..diffs.len().min(30)].join("\n")
            );
            n += 1;
        }
    }
    assert_eq!(n, 6);
}
