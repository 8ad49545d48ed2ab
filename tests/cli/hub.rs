//! `--model ORG/NAME`: a checkpoint in a Hugging Face cache laid out as the hub writes it
//! (`models--ORG--NAME/{blobs,refs,snapshots}`, snapshot files as symbolic links into blobs),
//! found through `HF_HUB_CACHE` / `HF_HOME`, by every command that takes `--model`; nothing is
//! downloaded, and a miss lists every path tried.

use cli_support::{synth_tiny, Run};
use needlescope_testkit::cli as cli_support;
use std::path::{Path, PathBuf};

const COMMIT: &str = "4f2ab0c1d2e3f405162738495a6b7c8d9e0f1a2b";

/// A tiny checkpoint moved into a hub-style cache under `cache` as `org/tiny-v4`: every file a
/// blob named by a fake hash, the snapshot of `COMMIT` made of relative links, `refs/main`.
fn hub_cache(cache: &Path) -> PathBuf {
    let src = cache.join("written");
    synth_tiny(&src, &[]);
    let repo = cache.join("models--org--tiny-v4");
    let snap = repo.join("snapshots").join(COMMIT);
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::create_dir_all(&snap).unwrap();
    let mut entries: Vec<_> = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for (i, file) in entries.iter().enumerate() {
        let blob = format!("{i:040x}");
        std::fs::rename(file, repo.join("blobs").join(&blob)).unwrap();
        std::os::unix::fs::symlink(
            format!("../../blobs/{blob}"),
            snap.join(file.file_name().unwrap()),
        )
        .unwrap();
    }
    std::fs::remove_dir(&src).unwrap();
    std::fs::write(repo.join("refs").join("main"), COMMIT).unwrap();
    snap
}

/// The binary with only the given cache variables set (HOME pointed at `home`).
fn run_with(env: &[(&str, &Path)], home: &Path, args: &[&str]) -> Run {
    let mut cmd = cli_support::bin();
    for var in [
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_HOME",
        "XDG_CACHE_HOME",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("HOME", home);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cli_support::run_in(cmd, args)
}

#[test]
fn a_repo_id_in_the_cache_is_inspected_and_traced_through_its_snapshot() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("hub");
    hub_cache(&cache);
    let env = [("HF_HUB_CACHE", cache.as_path())];
    run_with(&env, tmp.path(), &["inspect", "--model", "org/tiny-v4"])
        .ok()
        .stdout_has(&["inventory   OK"]);
    // The repository directory itself, and a commit as the revision.
    let repo = cache.join("models--org--tiny-v4");
    let repo = repo.to_str().unwrap();
    run_with(&env, tmp.path(), &["inspect", "--model", repo])
        .ok()
        .stdout_has(&["inventory   OK"]);
    run_with(
        &env,
        tmp.path(),
        &["inspect", "--model", repo, "--revision", COMMIT],
    )
    .ok()
    .stdout_has(&["inventory   OK"]);
    // A model run reads the weights through the links.
    let tokens = tmp.path().join("ids.txt");
    std::fs::write(&tokens, "1 5 9 13 17 21 25 29 33 37 41 45").unwrap();
    let trace = tmp.path().join("t.safetensors");
    run_with(
        &env,
        tmp.path(),
        &[
            "trace",
            "--device",
            "cpu",
            "--model",
            "org/tiny-v4",
            "--tokens",
            tokens.to_str().unwrap(),
            "--out",
            trace.to_str().unwrap(),
        ],
    )
    .ok();
    assert!(trace.is_file());
}

#[test]
fn hf_home_and_the_default_cache_are_searched_as_huggingface_hub_does() {
    let tmp = tempfile::tempdir().unwrap();
    let home_cache = tmp.path().join("hfhome").join("hub");
    hub_cache(&home_cache);
    let hf_home = tmp.path().join("hfhome");
    run_with(
        &[("HF_HOME", hf_home.as_path())],
        tmp.path(),
        &["inspect", "--model", "org/tiny-v4"],
    )
    .ok();
    // No variable: ~/.cache/huggingface/hub.
    let home = tmp.path().join("home");
    hub_cache(&home.join(".cache").join("huggingface").join("hub"));
    run_with(&[], &home, &["inspect", "--model", "org/tiny-v4"]).ok();
}

#[test]
fn a_miss_lists_every_path_tried_and_runs_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("hub");
    hub_cache(&cache);
    let env = [("HF_HUB_CACHE", cache.as_path())];
    let r = run_with(&env, tmp.path(), &["inspect", "--model", "org/other"]).fails();
    assert!(
        r.stderr.contains("--model org/other")
            && r.stderr.contains("models--org--other (no such directory)"),
        "{}",
        r.dump()
    );
    let r = run_with(
        &env,
        tmp.path(),
        &["probe", "--model", "org/tiny-v4", "--revision", "v9"],
    )
    .fails();
    for part in [
        "refs/v9 (no such ref)",
        "snapshots/v9 (no such snapshot)",
        "refs: main",
        COMMIT,
    ] {
        assert!(r.stderr.contains(part), "{part}: {}", r.dump());
    }
    // --revision on a plain directory is refused by name.
    let plain = tmp.path().join("plain");
    synth_tiny(&plain, &[]);
    let r = run_with(
        &env,
        tmp.path(),
        &[
            "inspect",
            "--model",
            plain.to_str().unwrap(),
            "--revision",
            "main",
        ],
    )
    .fails();
    assert!(r.stderr.contains("--revision main"), "{}", r.dump());
}
