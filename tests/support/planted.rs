//! Shared helpers of the end-to-end tests on the planted synthetic model: the binary, a
//! success check that shows stderr, and one planted checkpoint per test binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

pub fn bin() -> Command {
    Command::new(crate::needlescope_bin())
}

/// Stdout of a run that must succeed without a panic.
pub fn ok(out: Output, what: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what} failed: {stderr}");
    assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// One planted checkpoint (bf16) shared by the tests of a test binary.
pub fn planted() -> &'static Path {
    static DIR: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("planted");
        ok(
            bin()
                .args(["synth", "--preset", "planted", "--format", "bf16", "--out"])
                .arg(&model)
                .output()
                .unwrap(),
            "synth planted",
        );
        (dir, model)
    })
    .1
}
