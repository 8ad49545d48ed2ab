#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh needs on a GPU machine without a Rust toolchain: the release
# binary and the GPU parity test binary, stripped, in gpu-bin/ (ignored by git). Then, on the
# GPU machine, with gpu-bin carried along: NS_BIN_DIR=gpu-bin scripts/gpu-check.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
PARITY=$(cargo test --release --no-run --test gpu 2>&1 | sed -n 's/.*(\(.*gpu-[0-9a-f]*\)).*/\1/p' | tail -1)
rm -rf gpu-bin && mkdir -p gpu-bin
cp "${CARGO_TARGET_DIR:-target}/release/needlescope" gpu-bin/
cp "$PARITY" gpu-bin/
strip gpu-bin/* 2>/dev/null || true
# The commit the binaries were built from (gpu-check.sh prints it: a stale bundle shows).
git describe --always --dirty >gpu-bin/VERSION 2>/dev/null || echo unknown >gpu-bin/VERSION
du -sh gpu-bin/*
