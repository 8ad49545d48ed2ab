//! The helpers needlescope's integration-test binaries share (one per area: tests/<area>/main.rs).
//! A crate of its own, so that every binary links the same helpers without `#[path]`:
//! [`cli`] runs the real binary and edits safetensors files, [`engine`] builds synthetic models,
//! token ids and a recording observer, [`emu`] compares emulator outputs, [`planted`] shares one
//! planted checkpoint per test binary, [`report`] writes records of a synthetic sweep, [`sglang`] is a stand-in SGLang server.

pub mod cli;
pub mod emu;
pub mod engine;
pub mod planted;
pub mod report;
pub mod sglang;

use std::path::PathBuf;

/// The `needlescope` binary of the build under test. Cargo builds it for integration tests into
/// the target directory, beside the test binary's `deps/` folder (`CARGO_BIN_EXE_needlescope`
/// is only set for the package's own test targets, not for this crate).
pub fn needlescope_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut dir = exe.parent().expect("a folder").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let bin = dir.join(format!("needlescope{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "{} not found: build it with the tests (`cargo test` does)",
        bin.display()
    );
    bin
}
