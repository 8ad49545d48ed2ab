//! `--device` and `--gpu-gemm` through the binary: usage errors for bad specs, a clear error for
//! `cuda` without a driver, the one-line `auto` fallback that computes what `cpu` computes, the
//! GPU backend end to end on host-emulated devices (`emu`, hidden: trace split over two devices,
//! probe, sweep), the placement refusal before loading, and the backend in run.json (resume on
//! another backend refused).
//!
//! Tests about the missing driver skip themselves on a machine where CUDA works.

use needlescope_testkit::cli as cli_support;

use cli_support::{run, synth_tiny, Run};
use needlescope::checkpoint::Checkpoint;
use needlescope::devices::placement::{place, DeviceMemory, Workload};
use needlescope::devices::plan::Footprint;
use safetensors::SafeTensors;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Whether the CUDA driver is present and sees a GPU (then the driver-less tests skip).
fn cuda_usable() -> bool {
    let r = needlescope::backend::gpu::driver::probe();
    r.driver_present && r.error.is_none() && !r.devices.is_empty()
}

struct Models {
    _dir: tempfile::TempDir,
    tiny: PathBuf,
    planted: PathBuf,
    /// 300 token ids for `trace` on tiny.
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
        let ids = dir.path().join("ids.txt");
        let text: Vec<String> = (0..300)
            .map(|i| ((i * 37) % 4000 + 3).to_string())
            .collect();
        std::fs::write(&ids, text.join(" ")).unwrap();
        Models {
            _dir: dir,
            tiny,
            planted,
            ids,
        }
    })
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// `trace` of the 300 ids on tiny, every position recorded with its whole row of logits, into
/// `out`, plus `extra` flags.
fn trace(out: &Path, extra: &[&str]) -> Run {
    let m = models();
    let mut args = vec![
        "trace".to_string(),
        "--model".into(),
        s(&m.tiny),
        "--tokens".into(),
        s(&m.ids),
        "--positions".into(),
        "all".into(),
        "--logits".into(),
        "all".into(),
        "--out".into(),
        s(out),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    run(&args)
}

/// `probe --json` on planted (512 tokens, top-64, 2 generated tokens), plus `extra` flags.
fn probe(extra: &[&str]) -> Run {
    let mut args = vec![
        "probe".to_string(),
        "--model".into(),
        s(&models().planted),
        "--length".into(),
        "512".into(),
        "--topk".into(),
        "64".into(),
        "--generate".into(),
        "2".into(),
        "--kv".into(),
        "exact".into(),
        "--json".into(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    run(&args)
}

fn tensors(path: &Path) -> Vec<(String, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut v: Vec<(String, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| (n, t.data().to_vec()))
        .collect();
    v.sort();
    v
}

/// The lines of a trace's stderr but the one that says the size of the file it will write
/// (`trace: 1.23 MiB to write to ...`, printed by every trace).
fn notes(stderr: &str) -> Vec<&str> {
    let lines: Vec<&str> = stderr.lines().collect();
    let size = lines
        .iter()
        .filter(|l| l.starts_with("trace: ") && l.contains(" to write to "))
        .count();
    assert_eq!(size, 1, "one size line\n{stderr}");
    lines
        .into_iter()
        .filter(|l| !(l.starts_with("trace: ") && l.contains(" to write to ")))
        .collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn bad_specs_are_usage_errors_naming_the_flag() {
    for sub in ["probe", "sweep", "trace", "bench"] {
        let mut base = vec![sub, "--model", "m"];
        if sub == "trace" {
            base.extend(["--tokens", "t", "--out", "o"]);
        }
        for spec in ["cuda:", "cuda:x", "gpu", "cuda:0,0"] {
            let mut args = base.clone();
            args.extend(["--device", spec]);
            let r = run(&args).fails().stderr_has(&[
                "--device",
                spec,
                "expected auto, cpu, cuda, or cuda:N",
            ]);
            assert_eq!(r.code, Some(2), "{args:?}\n{}", r.dump());
        }
        let mut args = base.clone();
        args.extend(["--gpu-gemm", "fp8"]);
        let r = run(&args)
            .fails()
            .stderr_has(&["--gpu-gemm", "fp8", "bf16", "f32"]);
        assert_eq!(r.code, Some(2), "{}", r.dump());
    }
}

#[test]
fn help_lists_the_device_values_but_not_the_emulator() {
    for sub in ["probe", "sweep", "trace", "bench"] {
        let r = run(&[sub, "--help"]).ok();
        let r = r.stdout_has(&["--device", "cuda:N,...", "--gpu-gemm"]);
        assert!(!r.stdout.contains("emu"), "{sub}: {}", r.stdout);
    }
}

#[test]
fn cuda_without_a_driver_fails_naming_the_driver() {
    if cuda_usable() {
        eprintln!("skipped: this machine has a working CUDA driver");
        return;
    }
    let m = models();
    let tmp = tempfile::tempdir().unwrap();
    let out = s(&tmp.path().join("o"));
    let cases: Vec<Vec<String>> = vec![
        vec!["probe".into(), "--model".into(), s(&m.planted)],
        vec![
            "sweep".into(),
            "--model".into(),
            s(&m.planted),
            "--out".into(),
            out.clone(),
        ],
        vec!["bench".into(), "--model".into(), s(&m.tiny)],
        vec![
            "trace".into(),
            "--model".into(),
            s(&m.tiny),
            "--tokens".into(),
            s(&m.ids),
            "--out".into(),
            out.clone(),
        ],
    ];
    for spec in ["cuda", "cuda:1"] {
        for case in &cases {
            let mut args = case.clone();
            args.extend(["--device".to_string(), spec.to_string()]);
            let r = run(&args).fails();
            assert_eq!(r.code, Some(1), "{args:?}\n{}", r.dump());
            let want = format!("--device {spec}: no CUDA driver found: libcuda");
            r.stderr_has(&[&want, "--device cpu"]);
        }
    }
    assert!(!tmp.path().join("o").exists(), "nothing written");
}

#[test]
fn auto_without_a_gpu_notes_it_once_and_computes_what_cpu_computes() {
    if cuda_usable() {
        eprintln!("skipped: this machine has a working CUDA driver");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (a, c) = (tmp.path().join("auto.st"), tmp.path().join("cpu.st"));
    let auto = trace(&a, &[]).ok();
    let lines: Vec<&str> = notes(&auto.stderr);
    assert_eq!(lines.len(), 1, "exactly one note\n{}", auto.dump());
    assert!(
        lines[0].starts_with("note: --device auto: ")
            && lines[0].contains("CUDA")
            && lines[0].ends_with("running on the CPU reference backend"),
        "{}",
        lines[0]
    );
    let cpu = trace(&c, &["--device", "cpu"]).ok();
    assert!(notes(&cpu.stderr).is_empty(), "{}", cpu.dump());
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&c).unwrap());

    let auto = probe(&[]).ok();
    assert_eq!(auto.stderr.lines().count(), 1, "{}", auto.dump());
    let cpu = probe(&["--device", "cpu"]).ok();
    assert_eq!(auto.stdout, cpu.stdout);
    let v: serde_json::Value = serde_json::from_str(&cpu.stdout).unwrap();
    assert_eq!(v["backend"]["kind"], "cpu");
}

#[test]
fn gpu_gemm_on_the_cpu_is_noted_once() {
    let tmp = tempfile::tempdir().unwrap();
    let r = trace(
        &tmp.path().join("t.st"),
        &["--device", "cpu", "--gpu-gemm", "f32"],
    )
    .ok();
    assert_eq!(
        notes(&r.stderr),
        ["note: --gpu-gemm f32 is ignored on the CPU reference backend (its products: --cpu-gemm)"]
    );
}

/// Emulated capacities (whole MB) for which placement splits tiny's layers over two devices
/// for the trace of [`trace`] (chunk 2048, the config's top-k), with the layer ranges.
fn split_capacities() -> (String, Vec<String>) {
    let ckpt = Checkpoint::open(&models().tiny).unwrap();
    let fp = Footprint::of_checkpoint(&ckpt);
    let work = Workload {
        context: 300,
        chunk: 2048,
        topk: ckpt.config().index_topk,
    };
    let big = 65_536u64;
    for small in (big - 4000..big).rev() {
        let devices: Vec<DeviceMemory> = [small, big]
            .iter()
            .enumerate()
            .map(|(i, mb)| DeviceMemory {
                name: format!("emu:{i}"),
                free: mb * 1_000_000,
            })
            .collect();
        if let Ok(p) = place(ckpt.config(), &fp, &devices, &work) {
            if p.used.len() == 2 {
                return (format!("emu:1x{small}MB,1x{big}MB"), p.ranges());
            }
        }
    }
    panic!("no capacities split tiny over two devices");
}

#[test]
fn emu_runs_trace_across_two_devices_like_the_cpu() {
    let tmp = tempfile::tempdir().unwrap();
    let (spec, ranges) = split_capacities();
    let (e, c) = (tmp.path().join("emu.st"), tmp.path().join("cpu.st"));
    let emu = trace(&e, &["--device", &spec, "--gpu-gemm", "f32"]).ok();
    let placed = format!("cuda-emu (GEMM f32): {}", ranges.join(", "));
    let emu = emu.stdout_has(&[&placed, "+embed", "+head"]);
    assert!(notes(&emu.stderr).is_empty(), "{}", emu.dump());
    trace(&c, &["--device", "cpu"]).ok();
    let (emu, cpu) = (tensors(&e), tensors(&c));
    assert_eq!(
        emu.iter().map(|t| &t.0).collect::<Vec<_>>(),
        cpu.iter().map(|t| &t.0).collect::<Vec<_>>()
    );
    let (mut same, mut total) = (0usize, 0usize);
    for ((name, a), (_, b)) in emu.iter().zip(&cpu) {
        if name.ends_with(".topk") {
            same += a.chunks(4).zip(b.chunks(4)).filter(|(x, y)| x == y).count();
            total += a.len() / 4;
        } else if name == "logits" || name.ends_with(".scores") {
            let (a, b) = (f32s(a), f32s(b));
            let scale = b
                .iter()
                .filter(|x| x.is_finite())
                .fold(0f32, |m, x| m.max(x.abs()));
            for (x, y) in a.iter().zip(&b) {
                assert!(
                    x == y || (x - y).abs() <= 1e-3 * scale,
                    "{name}: {x} vs {y} (scale {scale})"
                );
            }
        } else {
            assert_eq!(a, b, "{name}");
        }
    }
    assert!(
        same as f64 >= 0.98 * total as f64,
        "top-k agreement {same}/{total}"
    );
}

#[test]
fn emu_runs_probe_like_the_cpu() {
    let emu = probe(&["--device", "emu:2", "--gpu-gemm", "f32"]).ok();
    assert!(emu.stderr.is_empty(), "{}", emu.dump());
    let cpu = probe(&["--device", "cpu"]).ok();
    let (e, c): (serde_json::Value, serde_json::Value) = (
        serde_json::from_str(&emu.stdout).unwrap(),
        serde_json::from_str(&cpu.stdout).unwrap(),
    );
    assert_eq!(e["backend"]["kind"], "cuda-emu");
    assert_eq!(e["backend"]["gemm"], "f32");
    assert_eq!(e["prompt"], c["prompt"]);
    let (er, cr) = (&e["runs"][0], &c["runs"][0]);
    assert_eq!(er["answer_text"], cr["answer_text"]);
    let ranks = |v: &serde_json::Value| -> Vec<(u64, u64, serde_json::Value, bool)> {
        v["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["layer"].as_u64().unwrap(),
                    r["query_pos"].as_u64().unwrap(),
                    r["needle_rank"].clone(),
                    r["selected"].as_bool().unwrap(),
                )
            })
            .collect()
    };
    assert_eq!(ranks(er), ranks(cr));
}

#[test]
fn a_model_that_does_not_fit_is_refused_before_loading() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("t.st");
    let r = trace(&out, &["--device", "emu:2x1G"]).fails();
    assert_eq!(r.code, Some(1), "{}", r.dump());
    r.stderr_has(&[
        "the model does not fit on emu:0, emu:1 at a context of 300 tokens",
        "no weight was loaded",
        "\n  emu:0: layers 0-3 +embed needs ",
        "\n  emu:1: ",
        "1.00 GiB free: short by ",
        "in total: needs ",
        "--device cpu",
    ]);
    assert!(!out.exists());
}

#[test]
fn sweep_records_the_backend_and_refuses_to_resume_on_another() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let sweep = |device: &str| {
        run(&[
            "sweep",
            "--model",
            &s(&models().planted),
            "--lengths",
            "256",
            "--depths",
            "50",
            "--topk",
            "64",
            "--generate",
            "0",
            "--out",
            &s(&dir),
            "--device",
            device,
        ])
    };
    sweep("emu:1").ok();
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).unwrap()).unwrap();
    assert_eq!(info["backend"]["kind"], "cuda-emu");
    assert_eq!(info["backend"]["gemm"], "f32", "f32 GEMMs are the default");
    assert_eq!(
        info["backend"]["devices"][0],
        "emu:0 layers 0-3 +embed +head"
    );
    // Same backend numerics on other devices: resumes (nothing left to do).
    sweep("emu:2")
        .ok()
        .stdout_has(&["0 cells run, 1 already finished"]);
    let r = sweep("cpu").fails();
    assert_eq!(r.code, Some(1));
    r.stderr_has(&[
        "refusing to resume",
        "backend: expected \"cuda-emu gemm f32\" (run.json), found \"cpu\" (this run)",
    ]);
}
