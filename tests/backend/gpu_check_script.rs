//! `scripts/gpu-check.sh` is what a GPU session runs, once, with binaries built here: a bug in it
//! wastes the session. Without a GPU: every test it runs exists in tests/gpu/main.rs, and
//! the whole script runs end to end on stand-in binaries (the real `needlescope` on the emulator
//! with the script's own flags at small sizes, a libtest stand-in for the parity binary), so its
//! step order, fast-path decisions, summary and files are what the GPU run will produce.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `(step, test filter)` of every `parity NAME FILTER ...` line of the script.
fn parity_steps(script: &str) -> Vec<(String, String)> {
    script
        .lines()
        .filter_map(|l| {
            let at = l.find("parity ")?;
            let w: Vec<&str> = l[at..].split_whitespace().collect();
            (w.len() >= 3 && w[2].starts_with("cuda_")).then(|| (w[1].to_string(), w[2].into()))
        })
        .collect()
}

/// Names of the `#[test]` functions of a test file.
fn test_fns(src: &str) -> Vec<String> {
    let lines: Vec<&str> = src.lines().collect();
    lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.trim() == "#[test]")
        .filter_map(|(i, _)| {
            lines[i + 1..].iter().find_map(|l| {
                let rest = l.trim().strip_prefix("fn ")?;
                Some(rest[..rest.find('(')?].to_string())
            })
        })
        .collect()
}

#[test]
fn every_parity_step_names_a_test_that_exists() {
    let script = std::fs::read_to_string(root().join("scripts/gpu-check.sh")).unwrap();
    let tests = test_fns(&std::fs::read_to_string(root().join("tests/gpu/main.rs")).unwrap());
    let steps = parity_steps(&script);
    assert_eq!(steps.len(), 5, "{steps:?}");
    for (step, filter) in &steps {
        assert!(
            tests.contains(filter),
            "step {step} runs {filter}, which tests/gpu/main.rs lacks ({tests:?}): \
             the filter would run 0 tests"
        );
    }
    for t in &tests {
        assert!(
            steps.iter().any(|(_, f)| f == t),
            "{t} is never run by scripts/gpu-check.sh"
        );
    }
}

/// Stand-ins for the bundle (`NS_BIN_DIR`): `needlescope` runs the real binary on the emulator
/// with every flag the script passes (sizes shrunk), the parity binary passes the tests listed
/// in `names` and, like libtest, runs 0 tests for any other filter.
fn stand_in_bundle(dir: &Path, names: &[String]) {
    let bin = env!("CARGO_BIN_EXE_needlescope");
    let ns = format!(
        r#"#!/usr/bin/env bash
R={bin}
case $1 in
  doctor) [ "$2" = --compile-kernels ] && [ -n "$3" ] || exit 2; echo "kernels compiled for $3"; exit 0 ;;
  synth) shift; a=(); while [ $# -gt 0 ]; do
           case $1 in --preset) a+=(--preset tiny); shift ;; *) a+=("$1") ;; esac; shift; done
         exec "$R" synth "${{a[@]}}" ;;
  bench) shift; a=(); while [ $# -gt 0 ]; do
           case $1 in
             --device) a+=(--device emu); shift ;;
             --lengths) a+=(--lengths "$(echo "$2" | sed 's/128k/256/; s/32k/192/; s/8k/128/')"); shift ;;
             --chunk|--warmup) a+=("$1" 64); shift ;;
             *) a+=("$1") ;;
           esac; shift; done
         echo "env: attention=${{NEEDLESCOPE_ATTENTION:-}} moe=${{NEEDLESCOPE_MOE:-}} profile=${{NEEDLESCOPE_PROFILE:-}}"
         exec "$R" bench "${{a[@]}}" ;;
esac
exit 2
"#
    );
    let parity = format!(
        r#"#!/usr/bin/env bash
for a in "$@"; do case $a in cuda_*) f=$a ;; esac; done
echo
for n in {}; do
  if [ "$n" = "$f" ]; then
    echo "running 1 test"; echo "ok   $f stand-in check   error 0  threshold 1"
    [ "$f" = cuda_batched_experts_match_the_cpu ] && echo "cublasGemmBatchedEx calls: 3"
    echo "test $f ... ok"; exit 0
  fi
done
echo "running 0 tests"; echo; echo "test result: ok. 0 passed; 0 failed"
"#,
        names.join(" ")
    );
    std::fs::create_dir_all(dir).unwrap();
    for (name, text) in [("needlescope", ns), ("gpu-0123abcd", parity)] {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::write(dir.join("VERSION"), "stand-in\n").unwrap();
}

fn run_script(bundle: &Path, out: &Path, model: &Path, env: &[(&str, &str)]) -> String {
    let mut c = Command::new("bash");
    c.arg(root().join("scripts/gpu-check.sh"))
        .arg(out)
        .env("NS_BIN_DIR", bundle)
        .env("BENCH_MODEL", model)
        .env("DEADLINE", "200")
        // The stand-in model is tiny, whatever room the machine has.
        .env("BENCH_MODEL_GIB", "0");
    for (k, v) in env {
        c.env(k, v);
    }
    let t = std::time::Instant::now();
    let o = c.output().expect("bash runs");
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        t.elapsed().as_secs() < 150,
        "the script took {:?}",
        t.elapsed()
    );
    stdout
}

#[test]
fn gpu_check_runs_end_to_end_on_stand_in_binaries() {
    if Command::new("bash")
        .arg("-c")
        .arg("command -v timeout df awk")
        .output()
        .map_or(true, |o| !o.status.success())
    {
        eprintln!("skipped: bash, timeout, df or awk missing");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let all = test_fns(&std::fs::read_to_string(root().join("tests/gpu/main.rs")).unwrap());
    let bundle = tmp.path().join("bundle");
    stand_in_bundle(&bundle, &all);
    let out = tmp.path().join("out");
    let stdout = run_script(&bundle, &out, &tmp.path().join("models/flash4"), &[]);
    let summary = std::fs::read_to_string(out.join("summary.txt")).unwrap();
    assert!(stdout.contains(summary.lines().last().unwrap()), "{stdout}");
    for want in [
        "built from stand-in",
        "doctor   ok, kernels compiled for sm_90",
        "parity   attn-gemm ok",
        "parity   moe-batched ok",
        "cublasGemmBatchedEx calls: 3",
        "parity   ops ok",
        "parity   tiny ok",
        "parity   flash ok",
        "done ",
    ] {
        assert!(summary.contains(want), "no {want:?} in\n{summary}");
    }
    // Both fast paths passed: they are benched against the default path, then at the other
    // lengths; each bench's reference GEMM, rows, projection and per-type lines are summarised.
    for step in [
        "fast-8k",
        "default-8k",
        "fast-long",
        "fast-profile",
        "default-chunk2k",
        "default-profile",
        "no-copies",
    ] {
        assert!(
            summary.contains(&format!("bench    {step} ok")),
            "{step}:\n{summary}"
        );
        assert!(
            summary.contains(&format!("{step:<22} reference: bf16 GEMM")),
            "{step}:\n{summary}"
        );
    }
    assert!(!summary.contains("default-long"), "{summary}");
    let rows = summary
        .lines()
        .filter(|l| l.contains("tok/s (4 layers)  projected: "))
        .count();
    assert_eq!(rows, 10, "{summary}");
    for kind in ["SWA x1:", "CSA x2:", "HCA x1:"] {
        assert_eq!(summary.matches(kind).count(), 10, "{kind}\n{summary}");
    }
    // Each length's device memory against the plan.
    let memory: Vec<&str> = summary
        .lines()
        .filter(|l| l.contains("   memory emu:0: peak "))
        .collect();
    assert_eq!(memory.len(), 10, "{summary}");
    assert!(
        memory.iter().all(|l| l.ends_with("is within the plan")),
        "{summary}"
    );
    let bench = std::fs::read_to_string(out.join("bench.txt")).unwrap();
    let sections: Vec<&str> = bench.split("== ").skip(1).collect();
    for s in &sections {
        let fast = s.starts_with("fast-");
        assert_eq!(s.contains("attention=gemm moe=batched"), fast, "{s}");
        assert_eq!(s.contains("profile=1"), s.contains("-profile"), "{s}");
    }
    assert_eq!(sections.len(), 7);
    let mut files: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        ["bench.txt", "parity.txt", "setup.txt", "summary.txt"]
    );
    assert!(std::fs::read_to_string(out.join("setup.txt"))
        .unwrap()
        .contains("== synth"));

    // A parity binary that lacks the tests (a stale bundle) fails every step by name instead of
    // passing 0 tests; with no fast path passed, the default path takes the long lengths.
    let stale = tmp.path().join("stale");
    stand_in_bundle(&stale, &[]);
    let out = tmp.path().join("out-stale");
    run_script(&stale, &out, &tmp.path().join("models/flash4"), &[]);
    let summary = std::fs::read_to_string(out.join("summary.txt")).unwrap();
    for (step, filter) in
        parity_steps(&std::fs::read_to_string(root().join("scripts/gpu-check.sh")).unwrap())
    {
        assert!(
            summary.contains(&format!("parity   {step} FAILED: no test named {filter}")),
            "{step}:\n{summary}"
        );
    }
    assert!(summary.contains("bench    default-long ok"), "{summary}");
    assert!(!summary.contains("fast-"), "{summary}");
}

#[test]
fn a_failed_synth_skips_the_benchmarks_and_leaves_no_partial_model() {
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("bundle");
    stand_in_bundle(&bundle, &[]);
    // A synth that cannot write: its output folder's parent is a file.
    std::fs::write(tmp.path().join("blocker"), "").unwrap();
    let model = tmp.path().join("blocker/flash4");
    let out = tmp.path().join("out");
    run_script(&bundle, &out, &model, &[("SKIP_FLASH_PARITY", "1")]);
    let summary = std::fs::read_to_string(out.join("summary.txt")).unwrap();
    assert!(!summary.contains("bench  "), "{summary}");
    assert!(
        summary.contains("synth    ") && summary.contains("done "),
        "{summary}"
    );
    assert!(!out.join("synth.log").exists());
}
