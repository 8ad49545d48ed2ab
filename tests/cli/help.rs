//! The command-line surface: every subcommand and flag is listed, GPU features fail cleanly
//! without a GPU, bad flag values are usage errors naming the flag and the expected form.

use cli_support::run;
use needlescope_testkit::cli as cli_support;

const SUBCOMMANDS: [&str; 9] = [
    "demo", "inspect", "probe", "sweep", "report", "trace", "synth", "doctor", "bench",
];

#[test]
fn help_lists_every_subcommand() {
    let r = run(&["--help"]).ok();
    for s in SUBCOMMANDS {
        assert!(
            r.stdout.lines().any(|l| l.trim_start().starts_with(s)),
            "--help lacks {s}\n{}",
            r.dump()
        );
    }
}

#[test]
fn each_subcommand_help_lists_its_flags() {
    let table: [(&str, &[&str]); 9] = [
        ("demo", &["--out"]),
        (
            "inspect",
            &[
                "--model",
                "--config",
                "--format",
                "--devices",
                "--context",
                "--chunk",
                "--json",
            ],
        ),
        (
            "probe",
            &[
                "--model",
                "--scenario",
                "--length",
                "--depth",
                "--index",
                "--compare",
                "--topk",
                "--kv",
                "--generate",
                "--chunk",
                "--device",
                "--gpu-gemm",
                "--probe",
                "--json",
                "--out",
                "--seed",
                "--haystack-file",
            ],
        ),
        (
            "sweep",
            &[
                "--model",
                "--scenario",
                "--lengths",
                "--depths",
                "--index",
                "--topk",
                "--kv",
                "--samples",
                "--out",
                "--chunk",
                "--device",
                "--gpu-gemm",
                "--haystack-file",
            ],
        ),
        ("report", &["<DIR>"]),
        (
            "trace",
            &[
                "--model",
                "--tokens",
                "--positions",
                "--index",
                "--kv",
                "--topk",
                "--chunk",
                "--out",
                "--dump-indexer-inputs",
                "--device",
                "--gpu-gemm",
            ],
        ),
        (
            "synth",
            &[
                "--preset",
                "--format",
                "--out",
                "--seed",
                "--shards",
                "--layers",
                "--experts",
                "--margin",
            ],
        ),
        ("doctor", &["--compile-kernels"]),
        ("bench", &["--model", "--lengths", "--device", "--gpu-gemm"]),
    ];
    for (sub, flags) in table {
        let r = run(&[sub, "--help"]).ok();
        for f in flags {
            assert!(
                r.stdout.contains(f),
                "`{sub} --help` lacks {f}\n{}",
                r.dump()
            );
        }
    }
}

#[test]
fn gpu_features_fail_cleanly_without_a_gpu() {
    // `--device cuda` is implemented (tests/cli/device.rs covers it on a real checkpoint): on a
    // directory without a model it fails, exit 1, without a panic, whatever the machine has.
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path().display().to_string();
    for sub in ["probe", "sweep", "bench"] {
        let r = run(&[sub, "--model", &t, "--device", "cuda"]).fails();
        assert_eq!(r.code, Some(1), "{sub}\n{}", r.dump());
    }
    // Compiling kernels needs NVRTC, not a GPU; without the library the error says so.
    if !needlescope::backend::gpu::driver::nvrtc_present() {
        let r = run(&["doctor", "--compile-kernels", "sm_90,sm_120"])
            .fails()
            .stderr_has(&["NVRTC", "could not be loaded"]);
        assert_eq!(r.code, Some(1), "{}", r.dump());
    }
}

#[test]
fn model_commands_on_a_missing_directory_name_the_path() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("no-such-model").display().to_string();
    let cases: Vec<Vec<String>> = vec![
        vec!["probe".into(), "--model".into(), missing.clone()],
        vec!["sweep".into(), "--model".into(), missing.clone()],
        vec!["bench".into(), "--model".into(), missing.clone()],
        vec![
            "trace".into(),
            "--model".into(),
            missing.clone(),
            "--tokens".into(),
            "ids.txt".into(),
            "--out".into(),
            "t.safetensors".into(),
        ],
        vec!["report".into(), missing.clone()],
    ];
    for args in cases {
        let r = run(&args).fails().stderr_has(&["no-such-model"]);
        assert_eq!(r.code, Some(1), "{args:?}\n{}", r.dump());
        if args[0] == "report" {
            // Not the operating system's "No such file or directory (os error 2)".
            r.stderr_has(&["not a report directory", "found no such directory"]);
        }
    }
}

#[test]
fn bad_flag_values_name_the_flag_and_the_expected_form() {
    let cases: [(&[&str], &[&str]); 10] = [
        (
            &["probe", "--model", "m", "--length", "12q"],
            &["--length", "12q", "16k"],
        ),
        (
            &["probe", "--model", "m", "--index", "fp9"],
            &["--index", "fp9", "fp8", "bf16"],
        ),
        (
            &["probe", "--model", "m", "--depth", "140"],
            &["--depth", "between 0 and 100"],
        ),
        (
            &["probe", "--model", "m", "--topk", "512,0"],
            &["--topk", "positive"],
        ),
        (
            &["inspect", "--config", "c.json", "--devices", "8x"],
            &["--devices", "8x96G"],
        ),
        (
            &["sweep", "--model", "m", "--depths", "0:200:10"],
            &["--depths", "start:stop:step"],
        ),
        (
            &[
                "trace",
                "--model",
                "m",
                "--tokens",
                "t",
                "--out",
                "o",
                "--positions",
                "first",
            ],
            &["--positions", "all", "last"],
        ),
        (
            &["doctor", "--compile-kernels", "90"],
            &["--compile-kernels", "sm_90"],
        ),
        (
            &["doctor", "--compile-kernels", "sm_90,sm_9"],
            &["--compile-kernels", "sm_90", "\"sm_9\""],
        ),
        (
            &["synth", "--out", "o", "--seed", "-1"],
            &["--seed", "from 0 to 18446744073709551615"],
        ),
    ];
    for (args, needles) in cases {
        let r = run(args).fails().stderr_has(needles);
        assert_eq!(
            r.code,
            Some(2),
            "usage errors exit 2: {args:?}\n{}",
            r.dump()
        );
    }
}

#[test]
fn inspect_needs_exactly_one_source() {
    run(&["inspect"])
        .fails()
        .stderr_has(&["--model", "--config"]);
    run(&["inspect", "--model", "a", "--config", "b"]).fails();
}

#[test]
fn doctor_reports_the_environment_and_succeeds_without_a_gpu() {
    run(&["doctor"])
        .ok()
        .stdout_has(&["cpu", "cuda driver", "nvrtc", "cublas"]);
}

#[test]
fn version_is_printed() {
    run(&["--version"])
        .ok()
        .stdout_has(&[env!("CARGO_PKG_VERSION")]);
}

/// A value starting with `-` and a digit, written with a space (`--depth -1`, `--length -2k`,
/// `--depths -10:50:10`) or with `=`, is a bad value of that flag, named as such, not clap's
/// "unexpected argument '-2'"; a forgotten value (`--length --out x`) keeps clap's "a value is
/// required" (`negative_values_name_their_flag`, `a_forgotten_value_is_named`).
#[test]
fn negative_values_name_their_flag() {
    for (args, flag) in [
        (
            &["probe", "--model", "m", "--depth", "-1"][..],
            "'--depth <PCT>'",
        ),
        (
            &["probe", "--model", "m", "--topk", "-1"][..],
            "'--topk <K>'",
        ),
        (
            &["probe", "--model", "m", "--length", "-2048"][..],
            "'--length <TOKENS>'",
        ),
        (
            &["probe", "--model", "m", "--length=-2k"][..],
            "'--length <TOKENS>'",
        ),
        (
            &["probe", "--model", "m", "--length", "-2k"][..],
            "'--length <TOKENS>'",
        ),
        (
            &["probe", "--model", "m", "--chunk", "-2k"][..],
            "'--chunk <TOKENS|auto>'",
        ),
        (
            &["sweep", "--model", "m", "--depths", "-10:50:10"][..],
            "'--depths <PCTS>'",
        ),
        (
            &["bench", "--model", "m", "--lengths", "-1k,2k"][..],
            "'--lengths <TOKENS>'",
        ),
        (
            &["sweep", "--model", "m", "--depths", "-5"][..],
            "'--depths <PCTS>'",
        ),
        (
            &["sweep", "--model", "m", "--lengths=-2k,4k"][..],
            "'--lengths <TOKENS>'",
        ),
        (
            &["sweep", "--model", "m", "--samples", "-1"][..],
            "'--samples <N>'",
        ),
        (
            &[
                "trace", "--model", "m", "--tokens", "t", "--out", "o", "--topk", "-3",
            ][..],
            "'--topk <K>'",
        ),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_needlescope"))
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("invalid value") && stderr.contains(flag),
            "{args:?}: {stderr}"
        );
    }
}

/// The joining of `--flag -2k` leaves a flag given where a value belongs alone: clap's own
/// error still names the flag that lacks its value.
#[test]
fn a_forgotten_value_is_named() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_needlescope"))
        .args(["probe", "--model", "m", "--length", "--topk", "5"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("a value is required for '--length <TOKENS>'"),
        "{stderr}"
    );
}
