#!/usr/bin/env bash
# One run on a GPU machine answers "does the CUDA backend work, and how fast". In order of what
# decides the most, so that a run cut off at its limit still answers the main questions:
#   1. the CUDA 13 libraries (driver, NVRTC, cuBLAS), the GPU, the binaries' version; the
#      benchmark model (`synth --preset flash --layers 4`: all 256 experts, official FP8 + FP4,
#      19 GB) starts writing in the background (skipped, and said so, without 20 GiB free);
#   2. `doctor`: every kernel compiled for this GPU's architecture;
#   3. parity (tests/gpu/main.rs) of the opt-in fast paths (attention as batched GEMMs,
#      routed experts as batched GEMMs: each decides whether it becomes the default), then every
#      op at Flash dims (blocking launches, so a faulting kernel is named at its launch);
#   4. the prefill benchmark at 8k, chunk 8k, bf16 GEMMs: the fast paths that passed against the
#      default path (the comparison that decides the defaults, and the issue's target);
#   5. then, as time allows: 32k and 128k (fast paths, else the default path), forwards on
#      tiny, the fast paths profiled, the default path at chunk 2k (comparable with
#      docs/gpu-backend.md) and profiled, without decoded weight copies, and the forwards on
#      Flash 4 layers last.
# Every step gets min(its own limit, what is left before $DEADLINE seconds, default 540), and
# a step with under 30 s left is skipped, so the whole run ends inside the device tool's
# 10-minute call (a step that ignores its TERM is killed 10 s later). Own limits in seconds:
# DOCTOR_TIMEOUT 90, PARITY_TIMEOUT 120, FLASH_TIMEOUT 180, SYNTH_TIMEOUT 420 (in the
# background, until the benches wait for it), BENCH_TIMEOUT 240, PROFILE_TIMEOUT 90. Skip steps with
# SKIP_OPS_PARITY=1, SKIP_TINY_PARITY=1, SKIP_ATTN_GEMM_PARITY=1, SKIP_MOE_BATCHED_PARITY=1,
# SKIP_FLASH_PARITY=1, SKIP_BENCH=1; GEMM=f32 benches the reference precision.
#
# Files (the device tool returns at most 8 from its $OUT): summary.txt (short: one line per
# step, the failing checks, and the bench table), setup.txt (libraries, synth, doctor),
# parity.txt and bench.txt (every step's whole output, each after a `== name` line), current.txt
# (the step in flight, moved into parity.txt / bench.txt when it ends). Every summary line is
# printed as it is written (once: the tool's output tail keeps the last 12,000 characters).
# The benchmark model goes to $BENCH_MODEL, else ns-flash4 in the first of /tmp, the working
# tree and /dev/shm with room for it (20 GiB); the Flash parity test's own models (about 4 GiB)
# go to $TMPDIR (/tmp), and when that lacks the room at the end, the benchmark model this run
# wrote is removed first.
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
DEADLINE=${DEADLINE:-540}
SUMMARY="$OUT/summary.txt"
SETUP="$OUT/setup.txt"
CURRENT="$OUT/current.txt"
: >"$SUMMARY"; : >"$SETUP"; : >"$OUT/parity.txt"; : >"$OUT/bench.txt"
note() { echo "$*" | tee -a "$SUMMARY"; }
t0=$(date +%s)
elapsed() { echo $(( $(date +%s) - t0 ))s; }
# The time a step may take: its own limit, or what is left before the deadline; 0 = skip it.
budget() {
  local left=$(( DEADLINE - ($(date +%s) - t0) ))
  if [ "$left" -lt 30 ]; then echo 0; elif [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}
# Runs `timeout` with a kill 10 s after the TERM (a process stuck in a driver call).
limit() { if [ "$1" = 0 ]; then return 124; fi; timeout -k 10 "$@"; }
# GiB free in the file system holding $1 (0 when unknown).
free_gib() { df -Pk "$1" 2>/dev/null | awk 'NR == 2 {print int($4 / 1048576)}' | grep . || echo 0; }
# Appends the step in flight (current.txt) to FILE under a `== NAME` line.
keep() { { echo "== $2"; cat "$CURRENT"; echo; } >>"$1"; rm -f "$CURRENT"; }

# 1. Libraries: the toolkit, distribution packages, pip wheels (nvidia-*-cu13); f32 GEMMs stay
#    f32 (NVIDIA_TF32_OVERRIDE=0).
. scripts/cuda-env.sh
for lib in libcuda.so.1 libnvrtc.so.13 libcublas.so.13 libcublasLt.so.13; do
  found=$(for d in ${LD_LIBRARY_PATH//:/ }; do ls "$d/$lib" 2>/dev/null; done | head -1)
  [ -z "$found" ] && found=$(ldconfig -p 2>/dev/null | awk -v l="$lib" '$1 == l {print $NF; exit}')
  echo "library  $lib: ${found:-NOT FOUND}" >>"$SETUP"
  [ -z "$found" ] && note "library  $lib: NOT FOUND"
done
timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader 2>/dev/null | sed 's/^/gpu      /' | tee -a "$SUMMARY"

# 2. Binaries (and the commit they were built from).
if [ -n "${NS_BIN_DIR:-}" ]; then
  BIN="$NS_BIN_DIR/needlescope"
  PARITY=$(ls "$NS_BIN_DIR"/gpu-* 2>/dev/null | head -1)
  VERSION=$(cat "$NS_BIN_DIR/VERSION" 2>/dev/null || echo "unknown (no $NS_BIN_DIR/VERSION)")
else
  cargo build --release --quiet 2>&1 | tail -5
  BIN=target/release/needlescope
  PARITY=$(cargo test --release --no-run --test gpu 2>&1 | sed -n 's/.*(\(.*gpu-[0-9a-f]*\)).*/\1/p' | tail -1)
  VERSION=$(git describe --always --dirty 2>/dev/null || echo unknown)
fi
note "binary   $BIN, built from $VERSION ($(elapsed))"

# The benchmark model (4 layers and the MTP layer: 19 GB, 18.6 GiB) is written in the
# background while parity runs, into a side folder renamed when complete (removed if not).
MODEL_GIB=${BENCH_MODEL_GIB:-20}  # room the benchmark model needs (tests: 0)
if [ -n "${BENCH_MODEL:-}" ]; then
  W=$BENCH_MODEL
else
  W=/tmp/ns-flash4
  for d in /tmp "$PWD" /dev/shm; do
    if [ -e "$d/ns-flash4/config.json" ] || [ "$(free_gib "$d")" -ge "$MODEL_GIB" ]; then W=$d/ns-flash4; break; fi
  done
fi
SYNTH_PID=
if [ "${SKIP_BENCH:-0}" != 1 ] && [ ! -e "$W/config.json" ]; then
  mkdir -p "$(dirname "$W")"; free_gb=$(free_gib "$(dirname "$W")")
  if [ "$free_gb" -lt "$MODEL_GIB" ]; then
    note "synth    skipped: $free_gb GiB free for $W, the benchmark model needs about $MODEL_GIB"
    SKIP_BENCH=1
  else
    ( if limit "$(budget "${SYNTH_TIMEOUT:-420}")" "$BIN" synth --preset flash --layers 4 \
          --format official --out "$W.partial" >"$OUT/synth.log" 2>&1; then
        rm -rf "$W" && mv "$W.partial" "$W"
      else
        rc=$?; rm -rf "$W.partial"; exit "$rc"
      fi ) &
    SYNTH_PID=$!
  fi
fi

# 3. doctor (compiles every kernel for the GPU's own architecture, into the kernel cache the
#    tests and benches then read).
ARCH=$(timeout 20 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d . | sed 's/^/sm_/')
if limit "$(budget "${DOCTOR_TIMEOUT:-90}")" "$BIN" doctor --compile-kernels "${ARCH:-sm_90}" >"$CURRENT" 2>&1; then
  note "doctor   ok, kernels compiled for ${ARCH:-sm_90} ($(elapsed))"
else
  note "doctor   FAILED ($(elapsed)):"
  grep -E 'FAILED|error|not found' "$CURRENT" | head -10 | tee -a "$SUMMARY"
fi
keep "$SETUP" doctor

# 4. Parity.
parity() { # NAME FILTER LIMIT [ENV...]
  local name=$1 filter=$2 limit rc; limit=$(budget "$3"); shift 3
  if [ -z "$PARITY" ]; then note "parity   $name: no test binary"; return; fi
  if [ "$limit" = 0 ]; then note "parity   $name skipped: no time left"; return; fi
  env "$@" timeout -k 10 "$limit" "$PARITY" --ignored --exact "$filter" --nocapture --test-threads 1 \
    >"$CURRENT" 2>&1
  rc=$?
  if [ "$rc" = 0 ] && grep -q '^ok ' "$CURRENT"; then
    note "parity   $name ok: $(grep -c '^ok ' "$CURRENT") checks passed ($(elapsed))"
    grep -E '^cublasGemmBatchedEx calls' "$CURRENT" | sed 's/^/         /' | tee -a "$SUMMARY"
  elif grep -q '^running 0 tests' "$CURRENT"; then
    note "parity   $name FAILED: no test named $filter in $PARITY (a stale test binary?)"
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    note "parity   $name TIMED OUT after ${limit}s ($(grep -c '^ok ' "$CURRENT") checks passed, $(grep -c '^FAIL ' "$CURRENT") failed so far)"
  else
    note "parity   $name FAILED (exit $rc): $(grep -c '^FAIL ' "$CURRENT") failing checks ($(elapsed))"
    grep -E '^(FAIL|== )|panicked|^error' "$CURRENT" | head -30 | tee -a "$SUMMARY"
  fi
  keep "$OUT/parity.txt" "$name"
}
[ "${SKIP_ATTN_GEMM_PARITY:-0}" = 1 ] || parity attn-gemm cuda_attention_by_gemm_matches_the_cpu "${PARITY_TIMEOUT:-120}"
[ "${SKIP_MOE_BATCHED_PARITY:-0}" = 1 ] || parity moe-batched cuda_batched_experts_match_the_cpu "${PARITY_TIMEOUT:-120}"
[ "${SKIP_OPS_PARITY:-0}" = 1 ] || parity ops cuda_ops_match_the_cpu_at_flash_dims "${PARITY_TIMEOUT:-120}" CUDA_LAUNCH_BLOCKING=1

# 5. Benchmark at Flash dimensions, each run after an untimed 2k warm-up (kernel compilation and
#    the decoded weight copies stay out of the figures). The summary keeps, per run and length,
#    the tokens/s of the 4 layers and the projected 43-layer tokens/s; bench.txt keeps all.
bench() { # NAME LIMIT LENGTHS CHUNK [ENV...]
  local name=$1 limit lengths=$3 chunk=$4 rc; limit=$(budget "$2"); shift 4
  if [ "$limit" = 0 ]; then note "bench    $name skipped: no time left"; return; fi
  env "$@" timeout -k 10 "$limit" "$BIN" bench --model "$W" --device cuda --gpu-gemm "${GEMM:-bf16}" \
    --index fp8 --kv fp8 --lengths "$lengths" --chunk "$chunk" --warmup 2k >"$CURRENT" 2>&1
  rc=$?
  case $rc in
    0) note "bench    $name ok ($(elapsed))" ;;
    124|137) note "bench    $name TIMED OUT after ${limit}s ($(elapsed))" ;;
    *) note "bench    $name FAILED (exit $rc, $(elapsed))"; grep -E 'error|panicked' "$CURRENT" | head -5 | tee -a "$SUMMARY" ;;
  esac
  # The reference GEMM, then per length: the `  8192  3.27  2506.0  ...` row (tokens, prefill s,
  # tokens/s), its `projected:` line, the per-type lines (ms/layer, TFLOP/s, % of the
  # reference) that come between the two, and the `device memory:` line after them (the peak
  # of the buffers against the memory plan; exact in no-copies, without decoded copies).
  awk -v n="$name" '
    function flush() {if (pending) {print row; printf "%s", types}; pending = 0; types = ""}
    /^reference:/ {printf "         %-22s %s\n", n, $0; next}
    $1 ~ /^[0-9]+$/ && $3 ~ /^[0-9.]+$/ {flush(); row = sprintf("         %-22s %7s tokens  %9s tok/s (4 layers)", n, $1, $3); pending = 1; next}
    pending && /^ +(SWA|CSA|HCA) x[0-9]+:/ {sub(/^ +/, ""); types = types sprintf("         %-22s   %s\n", "", $0); next}
    /projected:/ && pending {sub(/^ *projected: */, ""); row = row "  projected: " $0; flush(); next}
    /^ *device memory:/ {sub(/^ *device memory: */, ""); printf "         %-22s   memory %s\n", "", $0; next}
    END {flush()}' "$CURRENT" | tee -a "$SUMMARY"
  keep "$OUT/bench.txt" "$name"
}
FAST=()
grep -q "parity   attn-gemm ok" "$SUMMARY" && FAST+=(NEEDLESCOPE_ATTENTION=gemm)
grep -q "parity   moe-batched ok" "$SUMMARY" && FAST+=(NEEDLESCOPE_MOE=batched)
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  if [ -n "$SYNTH_PID" ]; then
    wait "$SYNTH_PID"; rc=$?
    [ "$rc" = 0 ] || note "synth    FAILED (exit $rc; 124 or 137: timed out) ($(elapsed)), no benchmarks (synth.log in setup.txt)"
    { echo "== synth"; cat "$OUT/synth.log" 2>/dev/null; echo; } >>"$SETUP"; rm -f "$OUT/synth.log"
  fi
  [ -e "$W/config.json" ] || SKIP_BENCH=1
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  note "model    $W ($(du -sh "$W" 2>/dev/null | cut -f1)) ($(elapsed))"
  P8=${PROFILE_LENGTH:-8k}
  # The decision: the fast paths against the default path, both at 8k and chunk 8k.
  [ ${#FAST[@]} -gt 0 ] && bench fast-8k "${BENCH_TIMEOUT:-240}" "$P8" 8k "${FAST[@]}"
  bench default-8k "${BENCH_TIMEOUT:-240}" "$P8" 8k
  # Then, as time allows, the other lengths (32k, 128k) at chunk 8k: on the fast paths that
  # passed, else on the default path.
  REST=${LENGTHS#"$P8"}; REST=${REST#,}
  if [ ${#FAST[@]} -gt 0 ] && [ -n "$REST" ]; then
    bench fast-long "${BENCH_TIMEOUT:-240}" "$REST" 8k "${FAST[@]}"
  elif [ -n "$REST" ]; then
    bench default-long "${BENCH_TIMEOUT:-240}" "$REST" 8k
  fi
fi
[ "${SKIP_TINY_PARITY:-0}" = 1 ] || parity tiny cuda_forward_matches_the_cpu_on_tiny "${PARITY_TIMEOUT:-120}"
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  [ ${#FAST[@]} -gt 0 ] && bench fast-profile "${PROFILE_TIMEOUT:-90}" "$P8" 8k "${FAST[@]}" NEEDLESCOPE_PROFILE=1
  bench default-chunk2k "${BENCH_TIMEOUT:-240}" "$LENGTHS" 2k
  bench default-profile "${PROFILE_TIMEOUT:-90}" "$P8" 2k NEEDLESCOPE_PROFILE=1
  bench no-copies "${PROFILE_TIMEOUT:-90}" "$P8" 2k NEEDLESCOPE_DECODE_CACHE_MIB=0
fi
# The Flash parity test writes two checkpoints of at most 4 GiB, one after the other, in $TMPDIR:
# when that lacks the room, the benchmark model this run wrote (no longer needed) goes first.
if [ "${SKIP_FLASH_PARITY:-0}" != 1 ]; then
  TMP_DIR=${TMPDIR:-/tmp}
  if [ "$(free_gib "$TMP_DIR")" -lt 6 ] && [ -n "$SYNTH_PID" ]; then
    rm -rf "$W"; note "model    $W removed: the Flash parity test needs about 4 GiB in $TMP_DIR"
  fi
  if [ "$(free_gib "$TMP_DIR")" -lt 5 ]; then
    note "parity   flash skipped: $(free_gib "$TMP_DIR") GiB free in $TMP_DIR, it needs about 4"
  else
    parity flash cuda_forward_matches_the_cpu_on_flash_four_layers "${FLASH_TIMEOUT:-180}"
  fi
fi
note "done     ($(elapsed)); this summary is $OUT/summary.txt"
