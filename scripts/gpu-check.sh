#!/usr/bin/env bash
# One run on a GPU machine answers "does the CUDA backend work, and how fast":
#   1. finds the CUDA 13 libraries (driver, NVRTC, cuBLAS) and prints them;
#   2. builds (or uses prebuilt binaries from $NS_BIN_DIR: needlescope + gpu_cuda_parity-*);
#   3. `doctor`: driver, GPUs, NVRTC, and every kernel compiled for this GPU's architecture;
#   4. the GPU parity tests (tests/gpu_cuda_parity.rs): every op at Flash dims first (blocking
#      launches), then forwards on tiny, the opt-in GEMM attention path (ops and tiny), and
#      Flash 4 layers (SKIP_FLASH_PARITY=1 skips that one);
#   5. the prefill benchmark on `synth --preset flash --layers 4` (all 256 experts, official
#      FP8 + FP4) at the lengths in $LENGTHS (default 8k,32k,128k) with bf16 GEMMs (the speed
#      configuration; GEMM=f32 for the reference one), skipped with SKIP_BENCH=1;
# and ends with a short table. Each step has a time limit in seconds (OPS_TIMEOUT 120,
# TINY_TIMEOUT 120, FLASH_TIMEOUT 180, SYNTH_TIMEOUT 150, BENCH_TIMEOUT 240) so a run can be
# fitted to the device tool's 10 minutes (skip steps with SKIP_OPS_PARITY=1, SKIP_TINY_PARITY=1,
# SKIP_ATTN_GEMM_PARITY=1, SKIP_FLASH_PARITY=1, SKIP_BENCH=1);
# bench prints each length as it ends. NEEDLESCOPE_PROFILE=1 in the environment adds a per-kernel
# time table to each bench length; NEEDLESCOPE_POOL_MIB=0 turns the buffer pool off.
# Usage: scripts/gpu-check.sh [OUT_DIR]
# On a machine without cargo (the device tool's GPU machines), build here with
# scripts/gpu-bundle.sh and run with NS_BIN_DIR=gpu-bin, carrying gpu-bin.
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
       >"$OUT/parity-$name.txt" 2>&1; then
    note "parity   $name ok: $(grep -c '^ok ' "$OUT/parity-$name.txt") checks passed ($(elapsed))"
  else
    note "parity   $name FAILED: $(grep -c '^FAIL ' "$OUT/parity-$name.txt") failing checks ($(elapsed))"
    grep -E '^(FAIL|== )|panicked|error' "$OUT/parity-$name.txt" | head -30 | tee -a "$SUMMARY"
  fi
}
[ "${SKIP_OPS_PARITY:-0}" = 1 ] || parity ops cuda_ops_match_the_cpu_at_flash_dims "${OPS_TIMEOUT:-120}" CUDA_LAUNCH_BLOCKING=1
[ "${SKIP_TINY_PARITY:-0}" = 1 ] || parity tiny cuda_forward_matches_the_cpu_on_tiny "${TINY_TIMEOUT:-120}"
[ "${SKIP_ATTN_GEMM_PARITY:-0}" = 1 ] || parity attn-gemm cuda_attention_by_gemm_matches_the_cpu "${TINY_TIMEOUT:-120}"
[ "${SKIP_FLASH_PARITY:-0}" = 1 ] || parity flash cuda_forward_matches_the_cpu_on_flash_four_layers "${FLASH_TIMEOUT:-180}"

# 5. Benchmark at Flash dimensions.
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  W=${BENCH_MODEL:-/tmp/ns-flash4}
  if [ ! -e "$W/config.json" ]; then
    timeout "${SYNTH_TIMEOUT:-150}" "$BIN" synth --preset flash --layers 4 --format official --out "$W" \
      >"$OUT/synth.txt" 2>&1 || note "synth    FAILED or timed out (see $OUT/synth.txt)"
  fi
  note "model    $W ($(du -sh "$W" 2>/dev/null | cut -f1)) ($(elapsed))"
  if timeout "${BENCH_TIMEOUT:-240}" "$BIN" bench --model "$W" --device cuda --gpu-gemm "${GEMM:-bf16}" \
       --index fp8 --kv fp8 --lengths "$LENGTHS" >"$OUT/bench.txt" 2>&1; then
    note "bench    ok ($(elapsed))"
  else
    note "bench    FAILED ($(elapsed))"
  fi
  tee -a "$SUMMARY" <"$OUT/bench.txt"
fi
echo "== summary ($OUT/summary.txt)"
cat "$SUMMARY"
