//! `needlescope bench`: the table of prefill times and, per length, the per-layer-type breakdown
//! (ms per layer, counted TFLOP/s against the reference GEMM measured in the same run), on the
//! CPU and on the GPU backend's host emulator. The Flash projection appears only for a model of
//! Flash's dimensions, which CI cannot afford (`scripts/gpu-check.sh` runs it on a GPU).

mod cli_support;

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
