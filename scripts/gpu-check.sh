#!/usr/bin/env bash
# One run on a GPU machine answers "does the CUDA backend work, and how fast":
#   1. finds the CUDA 13 libraries (driver, NVRTC, cuBLAS) and prints them;
#   2. builds (or uses prebuilt binaries from $NS_BIN_DIR: needlescope + gpu_cuda_parity-*);
#   3. `doctor`: driver, GPUs, NVRTC, and every kernel compiled for this GPU's architecture;
#   4. the GPU parity tests (tests/gpu_cuda_parity.rs): every op at Flash dims first (blocking
#      launches), then forwards on tiny, the opt-in GEMM attention path (ops and tiny), the
#      opt-in batched experts (tiny), and Flash 4 layers (SKIP_FLASH_PARITY=1 skips that one);
#   5. the prefill benchmark on `synth --preset flash --layers 4` (all 256 experts, official
#      FP8 + FP4, written in the background during the parity steps) with bf16 GEMMs (the speed
#      configuration; GEMM=f32 for the reference one): first the opt-in fast paths whose parity
#      passed, together at chunk 8k over $LENGTHS (default 8k,32k,128k), the default path at
#      chunk 8k and the fast paths profiled; then the default path at chunk 2k over $LENGTHS and
#      profiled, each fast path profiled, and without decoded weight copies; skipped with
#      SKIP_BENCH=1;
# and ends with a short table. Each step has a time limit in seconds (OPS_TIMEOUT 120,
# TINY_TIMEOUT 120, FLASH_TIMEOUT 180, SYNTH_TIMEOUT 300, BENCH_TIMEOUT 240, PROFILE_TIMEOUT 90)
# so a run can be fitted to the device tool's 10 minutes (skip steps with SKIP_OPS_PARITY=1,
# SKIP_TINY_PARITY=1, SKIP_ATTN_GEMM_PARITY=1, SKIP_MOE_BATCHED_PARITY=1, SKIP_FLASH_PARITY=1,
# SKIP_BENCH=1); bench prints each length as it ends. NEEDLESCOPE_PROFILE=1 in the environment
# adds a per-kernel time table to each bench length; NEEDLESCOPE_POOL_MIB=0 turns the buffer
# pool off. A whole run was about 6 minutes on an H200 (this version: 8 bench runs, the first three decide).
# Usage: scripts/gpu-check.sh [OUT_DIR]
# On a machine without cargo (the device tool's GPU machines), build here with
# scripts/gpu-bundle.sh and run with NS_BIN_DIR=gpu-bin, carrying gpu-bin; give OUT_DIR under
# the tool's $OUT (NS_BIN_DIR=gpu-bin scripts/gpu-check.sh $OUT/gc) so that whatever finished
# comes back even when the run is cut off at its time limit.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-gpu-check-out}}
mkdir -p "$OUT"
LENGTHS=${LENGTHS:-8k,32k,128k}
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
t0=$(date +%s)
elapsed() { echo $(( $(date +%s) - t0 ))s; }

# 1. Libraries: the toolkit, distribution packages, pip wheels (nvidia-*-cu13); f32 GEMMs stay
#    f32 (NVIDIA_TF32_OVERRIDE=0).
. scripts/cuda-env.sh
for lib in libcuda.so.1 libnvrtc.so.13 libcublas.so.13 libcublasLt.so.13; do
  found=$(for d in ${LD_LIBRARY_PATH//:/ }; do ls "$d/$lib" 2>/dev/null; done | head -1)
  [ -z "$found" ] && found=$(ldconfig -p 2>/dev/null | awk -v l="$lib" '$1 == l {print $NF; exit}')
  note "library  $lib: ${found:-NOT FOUND}"
done
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader 2>/dev/null | sed 's/^/gpu      /' | tee -a "$SUMMARY"

# 2. Binaries.
if [ -n "${NS_BIN_DIR:-}" ]; then
  BIN="$NS_BIN_DIR/needlescope"
  PARITY=$(ls "$NS_BIN_DIR"/gpu_cuda_parity-* 2>/dev/null | head -1)
else
  cargo build --release --quiet 2>&1 | tail -5
  BIN=target/release/needlescope
  PARITY=$(cargo test --release --no-run --test gpu_cuda_parity 2>&1 | sed -n 's/.*(\(.*gpu_cuda_parity-[0-9a-f]*\)).*/\1/p' | tail -1)
fi
note "binary   $BIN ($(elapsed))"

# The benchmark model (19 GB) is written in the background while the parity tests run, into a
# side folder renamed when complete.
W=${BENCH_MODEL:-/tmp/ns-flash4}
SYNTH_PID=
if [ "${SKIP_BENCH:-0}" != 1 ] && [ ! -e "$W/config.json" ]; then
  ( timeout "${SYNTH_TIMEOUT:-300}" "$BIN" synth --preset flash --layers 4 --format official \
      --out "$W.partial" >"$OUT/synth.txt" 2>&1 && rm -rf "$W" && mv "$W.partial" "$W" ) &
  SYNTH_PID=$!
fi

# 3. doctor (compiles every kernel for the GPU's own architecture).
ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d . | sed 's/^/sm_/')
if "$BIN" doctor --compile-kernels "${ARCH:-sm_90}" >"$OUT/doctor.txt" 2>&1; then
  note "doctor   ok, kernels compiled for ${ARCH:-sm_90} ($(elapsed))"
else
  note "doctor   FAILED (see $OUT/doctor.txt)"
fi
cat "$OUT/doctor.txt"

# 4. Parity: every op first (the quickest check of the plumbing; launches made blocking so a
#    faulting kernel is named at its launch), then whole forwards.
parity() { # NAME FILTER TIMEOUT [ENV...]
  local name=$1 filter=$2 limit=$3; shift 3
  if [ -z "$PARITY" ]; then note "parity   $name: no test binary"; return; fi
  if env "$@" timeout "$limit" "$PARITY" --ignored --exact "$filter" --nocapture --test-threads 1 \
       >"$OUT/parity-$name.txt" 2>&1 && grep -q '^ok ' "$OUT/parity-$name.txt"; then
    note "parity   $name ok: $(grep -c '^ok ' "$OUT/parity-$name.txt") checks passed ($(elapsed))"
  elif grep -q '^running 0 tests' "$OUT/parity-$name.txt"; then
    note "parity   $name FAILED: no test named $filter in $PARITY (a stale test binary?)"
  else
    note "parity   $name FAILED: $(grep -c '^FAIL ' "$OUT/parity-$name.txt") failing checks ($(elapsed))"
    grep -E '^(FAIL|== )|panicked|error' "$OUT/parity-$name.txt" | head -30 | tee -a "$SUMMARY"
  fi
}
[ "${SKIP_OPS_PARITY:-0}" = 1 ] || parity ops cuda_ops_match_the_cpu_at_flash_dims "${OPS_TIMEOUT:-120}" CUDA_LAUNCH_BLOCKING=1
[ "${SKIP_TINY_PARITY:-0}" = 1 ] || parity tiny cuda_forward_matches_the_cpu_on_tiny "${TINY_TIMEOUT:-120}"
[ "${SKIP_ATTN_GEMM_PARITY:-0}" = 1 ] || parity attn-gemm cuda_attention_by_gemm_matches_the_cpu "${TINY_TIMEOUT:-120}"
[ "${SKIP_MOE_BATCHED_PARITY:-0}" = 1 ] || parity moe-batched cuda_batched_experts_match_the_cpu "${TINY_TIMEOUT:-120}"
[ "${SKIP_FLASH_PARITY:-0}" = 1 ] || parity flash cuda_forward_matches_the_cpu_on_flash_four_layers "${FLASH_TIMEOUT:-180}"

# 5. Benchmark at Flash dimensions, each run after an untimed 2k warm-up (kernel compilation
#    and the decoded weight copies stay out of the figures). Most decision-relevant first, in
#    case a time limit cuts the end: the opt-in fast paths whose parity passed above
#    (NEEDLESCOPE_ATTENTION=gemm: attention as batched GEMMs; NEEDLESCOPE_MOE=batched: routed
#    experts as batched GEMMs) together at chunk 8k over $LENGTHS (the candidate defaults and
#    the issue's target), the default path at chunk 8k (what they gain), the fast paths
#    profiled at $PROFILE_LENGTH (where the time goes now); then the default path at chunk 2k
#    over $LENGTHS and profiled (comparable with docs/gpu-backend.md), each fast path profiled
#    alone, and the default path without decoded copies (NEEDLESCOPE_DECODE_CACHE_MIB=0).
bench() { # NAME TIMEOUT LENGTHS CHUNK [ENV...]
  local name=$1 limit=$2 lengths=$3 chunk=$4; shift 4
  if env "$@" timeout "$limit" "$BIN" bench --model "$W" --device cuda --gpu-gemm "${GEMM:-bf16}" \
       --index fp8 --kv fp8 --lengths "$lengths" --chunk "$chunk" --warmup 2k \
       >"$OUT/$name.txt" 2>&1; then
    note "$name ok ($(elapsed))"
  else
    note "$name FAILED ($(elapsed))"
  fi
  tee -a "$SUMMARY" <"$OUT/$name.txt"
}
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  [ -n "$SYNTH_PID" ] && { wait "$SYNTH_PID" || note "synth    FAILED or timed out (see $OUT/synth.txt)"; }
  note "model    $W ($(du -sh "$W" 2>/dev/null | cut -f1)) ($(elapsed))"
  P8=${PROFILE_LENGTH:-8k}
  FAST=()
  grep -q "parity   attn-gemm ok" "$SUMMARY" && FAST+=(NEEDLESCOPE_ATTENTION=gemm)
  grep -q "parity   moe-batched ok" "$SUMMARY" && FAST+=(NEEDLESCOPE_MOE=batched)
  if [ ${#FAST[@]} -gt 0 ]; then
    bench bench-fast-chunk8k "${BENCH_TIMEOUT:-240}" "$LENGTHS" 8k "${FAST[@]}"
  fi
  bench bench-chunk8k "${BENCH_TIMEOUT:-240}" "$P8,32k" 8k
  if [ ${#FAST[@]} -gt 0 ]; then
    bench bench-fast-profile "${PROFILE_TIMEOUT:-90}" "$P8" 8k "${FAST[@]}" NEEDLESCOPE_PROFILE=1
  fi
  bench bench "${BENCH_TIMEOUT:-240}" "$LENGTHS" 2k
  bench bench-profile "${BENCH_TIMEOUT:-240}" "$P8,32k" 2k NEEDLESCOPE_PROFILE=1
  if grep -q "parity   moe-batched ok" "$SUMMARY"; then
    bench bench-moe-batched "${PROFILE_TIMEOUT:-90}" "$P8" 2k NEEDLESCOPE_MOE=batched NEEDLESCOPE_PROFILE=1
  fi
  if grep -q "parity   attn-gemm ok" "$SUMMARY"; then
    bench bench-attn-gemm "${PROFILE_TIMEOUT:-90}" "$P8" 2k NEEDLESCOPE_ATTENTION=gemm NEEDLESCOPE_PROFILE=1
  fi
  bench bench-no-copies "${PROFILE_TIMEOUT:-90}" "$P8" 2k NEEDLESCOPE_DECODE_CACHE_MIB=0
fi
echo "== summary ($OUT/summary.txt)"
cat "$SUMMARY"
