#!/usr/bin/env bash
# CPU speed figures, in one run, on an otherwise idle machine (transformers slows several-fold
# when another process shares the cores, which flatters any ratio taken under load):
#   1. test dimensions: needlescope prefill tokens/s and peak RSS at 2K, 8K and 32K tokens on
#      `tiny`, and transformers float32 on the same checkpoint at 2K (ratio; target >= 5x);
#   2. real dimensions: `synth --preset flash --layers 4 --experts 8` (official FP8 + FP4),
#      1,000 tokens, logits at every position: the whole needlescope process (load, prefill,
#      logits: `trace --positions all`) against transformers' float32 forward alone (ratio;
#      target >= 1.5x), and needlescope's prefill at 1 and 2 threads;
#   3. the f32 GEMM rates: needlescope's kernel (`bench`'s reference line) and torch's matmul
#      (oneDNN / MKL) at the same shape, the attainable f32 rate of these cores; and the bf16
#      product of `--cpu-gemm bf16` (AMX where present), with that mode's prefill in section 2.
# Usage: scripts/bench-cpu.sh [PYTHON]   (PYTHON: a venv with torch + transformers>=5.24 +
#        accelerate, default /opt/refvenv/bin/python; the transformers lines are skipped if it
#        is missing). Repeats: REPEATS=3 (best of, for every timed figure).
set -euo pipefail
PY=${1:-/opt/refvenv/bin/python}
REPEATS=${REPEATS:-3}
cd "$(dirname "$0")/.."
cargo build --release --quiet
BIN=$PWD/target/release/needlescope
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
HAVE_HF=0
if [ -x "$PY" ] && "$PY" -c 'import transformers, torch, accelerate' 2>/dev/null; then HAVE_HF=1; fi
best() { sort -g | head -1; }

echo "== 1. test dimensions: needlescope, tiny (bf16), index exact, kv exact"
$BIN synth --preset tiny --format bf16 --out "$WORK/tiny" >/dev/null
# Each length in its own process so peak RSS belongs to that length.
for n in 2k 8k 32k; do
  $BIN bench --model "$WORK/tiny" --lengths $n --device cpu | grep -E '^ +[0-9]+ ' | head -1 | tee -a "$WORK/ns.txt"
done
if [ $HAVE_HF = 1 ]; then
  echo "== transformers float32, tiny, 2K (best of $REPEATS)"
  for _ in $(seq "$REPEATS"); do
    "$PY" tests/reference/bench_transformers.py --model "$WORK/tiny" --tokens 2048 2>/dev/null | tail -1 | awk '{print $3}'
  done | best > "$WORK/hf_tiny.txt"
  HF_S=$(cat "$WORK/hf_tiny.txt")
  NS_S=$(head -1 "$WORK/ns.txt" | awk '{print $2}')
  echo "transformers 2048 tokens: $HF_S s forward; needlescope $NS_S s prefill"
  awk -v a="$HF_S" -v b="$NS_S" 'BEGIN { printf "speed ratio needlescope / transformers at 2K on tiny: %.1fx (target 5x)\n", a / b }'
fi

echo "== 2. real dimensions: flash --layers 4 --experts 8 (official FP8 + FP4), 1000 tokens"
$BIN synth --preset flash --layers 4 --experts 8 --format official --out "$WORK/flash4" >/dev/null
# The token ids of `needlescope bench` and bench_transformers.py (LCG, ids in [3, vocab)).
python3 - "$WORK/ids.txt" <<'EOF'
import sys
s, out = 0x9E3779B97F4A7C15, []
for _ in range(1000):
    s = (s * 6364136223846793005 + 1442695040888963407) % (1 << 64)
    out.append(3 + (s >> 33) % (129280 - 3))
open(sys.argv[1], "w").write(" ".join(map(str, out)))
EOF
for _ in $(seq "$REPEATS"); do
  /usr/bin/time -f '%e %M' -o "$WORK/t.txt" $BIN trace --model "$WORK/flash4" --tokens "$WORK/ids.txt" \
    --positions all --logits top:1 --device cpu --out "$WORK/trace.safetensors" >/dev/null
  cat "$WORK/t.txt"
done | sort -g | head -1 > "$WORK/ns_flash.txt"
NS_S=$(awk '{print $1}' "$WORK/ns_flash.txt")
echo "needlescope whole process (trace --positions all --logits top:1): $NS_S s, peak RSS $(awk '{printf "%.0f", $2/1024}' "$WORK/ns_flash.txt") MiB (best of $REPEATS)"
for t in 1 2; do
  $BIN --threads $t bench --model "$WORK/flash4" --lengths 1000 --device cpu | grep -E '^ +1000 ' | head -1 \
    | awk -v t=$t '{printf "needlescope prefill at %d thread(s): %s s, %s tokens/s (weights %s)\n", t, $2, $3, $6}'
done
# The fast mode (not the reference numerics): bf16 operands, f32 accumulation, AMX where present.
$BIN bench --model "$WORK/flash4" --lengths 1000 --device cpu --cpu-gemm bf16 | grep -E '^ +1000 ' | head -1 \
  | awk '{printf "needlescope prefill with --cpu-gemm bf16 (2 threads): %s s, %s tokens/s\n", $2, $3}'
if [ $HAVE_HF = 1 ]; then
  for _ in $(seq "$REPEATS"); do
    "$PY" tests/reference/bench_transformers.py --model "$WORK/flash4" --tokens 1000 2>/dev/null | tail -1 | awk '{print $3}'
  done | best > "$WORK/hf_flash.txt"
  HF_S=$(cat "$WORK/hf_flash.txt")
  echo "transformers float32 forward alone: $HF_S s (best of $REPEATS)"
  awk -v a="$HF_S" -v b="$NS_S" 'BEGIN { printf "speed ratio needlescope (whole process) / transformers (forward) at Flash dimensions: %.2fx (target 1.5x)\n", a / b }'
fi

echo "== 3. GEMM rates (f32, and bf16 for --cpu-gemm bf16)"
$BIN bench --model "$WORK/tiny" --lengths 64 --device cpu | grep '^reference' || true
$BIN bench --model "$WORK/tiny" --lengths 64 --device cpu --cpu-gemm bf16 | grep '^reference' || true
if [ $HAVE_HF = 1 ]; then
  "$PY" - <<'EOF'
import time, torch
torch.set_num_threads(2)
m, n, k = 512, 4096, 2048
a, b = torch.randn(m, k), torch.randn(n, k)
a @ b.T
best = min((lambda t: (a @ b.T, time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(5))
print(f"torch f32 matmul {m}x{n}x{k}, 2 threads: {2 * m * n * k / best / 1e12:.3f} TFLOP/s")
EOF
fi
