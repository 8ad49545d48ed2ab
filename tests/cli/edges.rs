//! Edge cases of `synth`, `trace` and the GPU backend's environment switches through the
//! binary: a bad switch value is an error naming the variable (never a silent default), Ctrl-C
//! while a trace is written leaves no half-written file, and a synth that fails part way leaves
//! a directory that does not open as a model.

use needlescope_testkit::cli as cli_support;

use cli_support::{bin, run, synth_tiny, Run};
use std::path::Path;
use std::process::Stdio;

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// Runs the binary with `args` and the environment variables `env`.
fn run_env(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = bin();
    cmd.args(args).stdin(Stdio::null());
    for var in [
        "NEEDLESCOPE_MOE",
        "NEEDLESCOPE_ATTENTION",
        "NEEDLESCOPE_PROFILE",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[test]
fn gpu_switch_with_a_bad_value_is_refused_naming_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny");
    synth_tiny(&model, &[]);
    let model = s(&model);
    let bench = |device: &str, env: &[(&str, &str)]| {
        run_env(
            &[
                "bench",
                "--model",
                &model,
                "--lengths",
                "16",
                "--device",
                device,
            ],
            env,
        )
    };
    for (var, bad, expected) in [
        ("NEEDLESCOPE_MOE", "batch", "\"batched\""),
        ("NEEDLESCOPE_ATTENTION", "GEMM", "\"gemm\""),
        ("NEEDLESCOPE_PROFILE", "maybe", "expected 1"),
    ] {
        bench("emu:1", &[(var, bad)])
            .fails()
            .stderr_has(&[var, expected, &format!("{bad:?}")]);
    }
    // The profile switch is read on the CPU too (bench notes that it does nothing there).
    bench("cpu", &[("NEEDLESCOPE_PROFILE", "maybe")])
        .fails()
        .stderr_has(&["NEEDLESCOPE_PROFILE"]);
    // `false` turns the (slowing) op profile off, not on; `1` and the opt-in values still work.
    let off = bench("emu:1", &[("NEEDLESCOPE_PROFILE", "false")]).ok();
    assert!(!off.stdout.contains("alloc (zeroed)"), "{}", off.dump());
    let on = bench(
        "emu:1",
        &[
            ("NEEDLESCOPE_PROFILE", "1"),
            ("NEEDLESCOPE_MOE", "batched"),
            ("NEEDLESCOPE_ATTENTION", "gemm"),
        ],
    )
    .ok();
    assert!(on.stdout.contains("alloc (zeroed)"), "{}", on.dump());
}

#[test]
fn ctrl_c_while_a_trace_is_written_leaves_no_partial_file() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny");
    synth_tiny(&model, &[]);
    // 6,000 positions of 4,096 logits: a file of about 100 MB, written for a while.
    let ids: Vec<String> = (0..6000)
        .map(|i| ((i * 37) % 4000 + 3).to_string())
        .collect();
    let tokens = dir.path().join("ids.txt");
    std::fs::write(&tokens, ids.join(" ")).unwrap();
    let out = dir.path().join("trace.safetensors");
    let partial = dir.path().join("trace.safetensors.partial");
    let child = bin()
        .args(["trace", "--device", "cpu", "--positions", "all"])
        .args(["--logits", "all", "--model"])
        .arg(&model)
        .arg("--tokens")
        .arg(&tokens)
        .arg("--out")
        .arg(&out)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The cleanup cannot be caught when the write beats the poll: then nothing is checked.
    let started = std::time::Instant::now();
    while !partial.exists() && started.elapsed().as_secs() < 120 {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let sent = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let done = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    if done.status.code() == Some(130) {
        assert!(
            !partial.exists(),
            "Ctrl-C left the half-written {} behind\n{stderr}",
            partial.display()
        );
        // A Ctrl-C just after the rename exits 130 with the finished file in place (the
        // rename is atomic: what is there is whole); only a half-written file is a failure.
    } else {
        assert_eq!(done.status.code(), Some(0), "{stderr}");
        assert!(out.exists() && !partial.exists());
    }
}

#[test]
fn synth_that_fails_part_way_leaves_no_config_json() {
    let dir = tempfile::tempdir().unwrap();
    // A re-synth into its own directory that fails on the weights file: the old model's
    // config.json must not stay beside what the new run left.
    let model = dir.path().join("m");
    synth_tiny(&model, &[]);
    std::fs::remove_file(model.join("model.safetensors")).unwrap();
    std::fs::create_dir(model.join("model.safetensors")).unwrap();
    run(&["synth", "--out", &s(&model)])
        .fails()
        .stderr_has(&["model.safetensors"]);
    assert!(
        !model.join("config.json").exists(),
        "the failed synth left the old config.json"
    );
    run(&["inspect", "--model", &s(&model)])
        .fails()
        .stderr_has(&["config.json"]);

    // A planted synth that cannot write its tokenizer: no config.json, so the directory is not
    // taken for a finished model without tokenizer.json and planted.json.
    let planted = dir.path().join("p");
    std::fs::create_dir_all(planted.join("tokenizer.json")).unwrap();
    run(&[
        "synth",
        "--preset",
        "planted",
        "--format",
        "bf16",
        "--out",
        &s(&planted),
    ])
    .fails()
    .stderr_has(&["tokenizer.json"]);
    assert!(
        !planted.join("config.json").exists(),
        "the failed planted synth left a config.json"
    );
}

#[test]
fn synth_into_a_file_names_it_and_expects_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ids.txt");
    std::fs::write(&file, "1 2 3").unwrap();
    run(&["synth", "--out", &s(&file)]).fails().stderr_has(&[
        "ids.txt",
        "expected a directory",
        "is a file",
    ]);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "1 2 3");
}
