//! `needlescope bench`: the table of prefill times and, per length, the per-layer-type breakdown
//! (ms per layer, counted TFLOP/s against the reference GEMM measured in the same run), on the
//! CPU and on the GPU backend's host emulator. The Flash projection appears only for a model of
//! Flash's dimensions, which CI cannot afford (`scripts/gpu-check.sh` runs it on a GPU).

use needlescope_testkit::cli as cli_support;

use cli_support::*;

#[test]
fn bench_prints_per_layer_type_figures_on_cpu_and_emulated_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny");
    synth_tiny(&model, &["--layers", "4"]);
    let m = model.to_string_lossy().to_string();
    for device in [
        &["--device", "cpu"][..],
        &["--device", "emu", "--gpu-gemm", "bf16"],
    ] {
        let mut args = vec!["bench", "--model", &m, "--lengths", "300,600"];
        args.extend_from_slice(device);
        let r = run(&args).ok();
        let r = r.stdout_has(&[
            "reference: ",
            "TFLOP/s (measured in this run)",
            "SWA x1:",
            "CSA x2:",
            "HCA x1:",
            "ms/layer",
            "% of the reference",
        ]);
        let out = r.dump();
        // One row per length, each followed by its breakdown; no projection for a tiny model.
        for n in ["300", "600"] {
            assert!(
                out.lines().any(|l| l.split_whitespace().next() == Some(n)),
                "no row for {n} tokens:\n{out}"
            );
        }
        assert!(!out.contains("tok/s for the 43-layer"), "{out}");
        assert!(
            out.contains("none: not Flash-sized (hidden_size"),
            "the missing projection is explained:\n{out}"
        );
        // Profiling is off unless asked for.
        assert!(!out.contains("op profile"), "{out}");
        // The counted TFLOP/s are positive numbers.
        let tflops: Vec<f64> = out
            .lines()
            .filter(|l| l.contains("ms/layer"))
            .filter_map(|l| {
                l.split("ms/layer")
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .collect();
        assert_eq!(tflops.len(), 6, "{out}");
        assert!(tflops.iter().all(|&t| t > 0.0), "{out}");
    }
}

/// `NEEDLESCOPE_PROFILE=1`: after each length, the device operations by wall time (kernels by
/// name, GEMMs by shape, allocations, copies) and what they leave of the prefill.
#[test]
fn bench_prints_an_op_profile_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny");
    synth_tiny(&model, &["--layers", "4"]);
    let out = bin()
        .args(["bench", "--model"])
        .arg(&model)
        .args(["--lengths", "200,400", "--device", "emu"])
        .env("NEEDLESCOPE_PROFILE", "1")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    // One profile per length, each with kernels, GEMMs and the remainder line.
    assert_eq!(text.matches("op profile").count(), 2, "{text}");
    for section in text.split("op profile").skip(1) {
        // Allocations and copies are listed whatever their rank.
        for needle in [
            "attn_logits",
            "gemm f32 n",
            "alloc (zeroed)",
            "alloc (uninitialised)",
            "copy host->device",
            "copy device->host",
            "(not in a timed op",
        ] {
            assert!(section.contains(needle), "{needle}:\n{text}");
        }
    }
    // Shares are of the length's own prefill: the timed rows cannot exceed 100% in sum.
    let profile = text.split("op profile").nth(2).unwrap();
    let share: f64 = profile
        .lines()
        .filter_map(|l| {
            l.split('%')
                .next()?
                .split_whitespace()
                .last()?
                .parse::<f64>()
                .ok()
        })
        .sum();
    assert!(
        share > 50.0 && share < 100.5,
        "shares sum to {share}:\n{text}"
    );
}

/// On the CPU there are no device operations to time: the run says so instead of silently
/// printing no profile.
#[test]
fn bench_says_the_op_profile_is_for_gpu_backends() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny");
    synth_tiny(&model, &["--layers", "2"]);
    let out = bin()
        .args(["bench", "--model"])
        .arg(&model)
        .args(["--lengths", "64", "--device", "cpu"])
        .env("NEEDLESCOPE_PROFILE", "1")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("NEEDLESCOPE_PROFILE times the operations of a GPU backend"),
        "{text}"
    );
    assert!(!text.contains("op profile ("), "{text}");
}

/// `--warmup` runs an untimed prefill first; on the GPU backend the weights' decoded copies
/// (within the memory plan's headroom, capped by `NEEDLESCOPE_DECODE_CACHE_MIB`) are reported
/// after each length; a cap that is not a number is refused naming the variable.
#[test]
fn bench_warms_up_and_reports_decoded_weight_copies() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny");
    synth_tiny(&model, &["--layers", "2"]);
    let bench = |env: Option<&str>| {
        let mut cmd = bin();
        cmd.args(["bench", "--model"]).arg(&model).args([
            "--lengths",
            "200",
            "--warmup",
            "100",
            "--device",
            "emu",
        ]);
        if let Some(v) = env {
            cmd.env("NEEDLESCOPE_DECODE_CACHE_MIB", v);
        }
        cmd.output().unwrap()
    };
    let out = bench(None);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("warm-up: 100 tokens in "), "{text}");
    let kept = text
        .lines()
        .find(|l| l.contains("kept decoded:"))
        .unwrap_or_else(|| panic!("no decoded-copy line:\n{text}"));
    let copies: usize = kept
        .split(": ")
        .nth(2)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{kept}"));
    assert!(copies > 0, "{kept}");
    // Capped at zero: no copies, no line.
    let out = bench(Some("0"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && !text.contains("kept decoded:"),
        "{text}"
    );
    let out = bench(Some("plenty"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("NEEDLESCOPE_DECODE_CACHE_MIB") && err.contains("plenty"),
        "{err}"
    );
}

/// A length (or warm-up) past the model's positions, or a length given twice, is refused
/// before anything runs.
#[test]
fn bench_refuses_lengths_past_the_positions() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny");
    synth_tiny(&model, &[]);
    let m = model.to_string_lossy().to_string();
    let r = run(&[
        "bench",
        "--model",
        &m,
        "--device",
        "cpu",
        "--lengths",
        "300,2m",
    ])
    .fails();
    assert_eq!(r.code, Some(1), "{}", r.dump());
    let r = r.stderr_has(&["--lengths 2097152", "max_position_embeddings"]);
    assert!(!r.stdout.contains("prefill s"), "{}", r.dump());
    // The warm-up prefill too (it ran for minutes before), and a length given twice.
    for (flags, expected) in [
        (
            &["--lengths", "300", "--warmup", "2m"][..],
            "--warmup 2097152",
        ),
        (
            &["--lengths", "300,300"][..],
            "--lengths: expected each value once",
        ),
    ] {
        let args = [&["bench", "--model", &m, "--device", "cpu"][..], flags].concat();
        let r = run(&args).fails();
        assert_eq!(r.code, Some(1), "{}", r.dump());
        let r = r.stderr_has(&[expected]);
        assert!(!r.stdout.contains("prefill s"), "{}", r.dump());
    }
}

/// On a GPU backend each length ends with the device's buffer peak against the memory plan;
/// without decoded copies (`NEEDLESCOPE_DECODE_CACHE_MIB=0`) the comparison is exact. The CPU
/// has no such line.
#[test]
fn bench_holds_the_device_memory_peak_to_the_plan() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny");
    synth_tiny(&model, &["--layers", "4"]);
    let bench = |device: &str, copies: &str| {
        let out = bin()
            .args(["bench", "--model"])
            .arg(&model)
            .args(["--lengths", "200,400", "--device", device])
            .env("NEEDLESCOPE_DECODE_CACHE_MIB", copies)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for copies in ["0", "64"] {
        let text = bench("emu", copies);
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("device memory: emu:0: peak "))
            .collect();
        assert_eq!(lines.len(), 2, "one per length:\n{text}");
        for l in &lines {
            assert!(l.ends_with("is within the plan"), "{l}");
            // Activations were counted: a peak that never moved would read 0 B here.
            assert!(!l.contains("copies, 0 B, is"), "{l}");
            assert!(l.contains("plan: weights "), "{l}");
            assert_eq!(l.contains(" 0 B of decoded copies"), copies == "0", "{l}");
        }
    }
    assert!(!bench("cpu", "0").contains("device memory:"));
}

/// `--threads N` sizes the CPU thread pool before or after the subcommand (bench prints the
/// count and the GEMM kernels' instruction set); 0 is a usage error naming the flag.
#[test]
fn threads_sizes_the_pool_and_bench_names_the_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny");
    synth_tiny(&model, &["--layers", "2"]);
    let m = model.to_string_lossy().to_string();
    let base = ["bench", "--model", &m, "--lengths", "64", "--device", "cpu"];
    let mut before = vec!["--threads", "1"];
    before.extend_from_slice(&base);
    let one = run(&before)
        .ok()
        .stdout_has(&["1 rayon threads", "kernels, 1 threads"]);
    // Where the CPU has FMA vectors, the f32 reference says what fraction of the threads'
    // measured FMA peak it reached.
    if cfg!(target_arch = "x86_64") && std::is_x86_feature_detected!("fma") {
        one.stdout_has(&[
            "% of the threads' measured f32 FMA peak, ",
            " TFLOP/s on avx",
        ]);
    }
    let mut after = base.to_vec();
    after.extend_from_slice(&["--threads", "3"]);
    run(&after)
        .ok()
        .stdout_has(&["3 rayon threads", "kernels, 3 threads"]);
    run(&["doctor", "--threads", "2"])
        .ok()
        .stdout_has(&["2 threads (rayon)"]);
    let r = run(&["--threads", "0", "doctor"]).fails();
    assert_eq!(r.code, Some(2), "{}", r.dump());
    r.stderr_has(&["--threads"]);
}
