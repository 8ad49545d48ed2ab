#!/usr/bin/env bash
# CPU engine speed and memory figures (the CPU engine issue, item 9), in one run:
#   - needlescope prefill tokens/s and peak RSS at 2K, 8K and 32K tokens on `tiny`;
#   - at 2K on `synth --preset flash --layers 3 --experts 16 --format official`;
#   - transformers float32 on the same `tiny` checkpoint at 2K, and the speed ratio.
# Usage: scripts/bench-cpu.sh [PYTHON]   (PYTHON: a venv with torch + transformers>=5.24,
#        default /opt/refvenv/bin/python; the transformers line is skipped if it is missing)
set -euo pipefail
PY=${1:-/opt/refvenv/bin/python}
cd "$(dirname "$0")/.."
cargo build --release --quiet
BIN=target/release/needlescope
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
$BIN synth --preset tiny --format bf16 --out "$WORK/tiny" >/dev/null
echo "== needlescope, tiny (bf16), index exact, kv exact"
# Each length in its own process so peak RSS belongs to that length.
for n in 2k 8k 32k; do
  $BIN bench --model "$WORK/tiny" --lengths $n --device cpu | grep -E '^ +[0-9]+ ' | head -1 | tee -a "$WORK/ns.txt"
done
echo "== needlescope, flash --layers 3 --experts 16 (official FP8 + FP4), 2K"
$BIN synth --preset flash --layers 3 --experts 16 --format official --out "$WORK/flash3" >/dev/null
$BIN bench --model "$WORK/flash3" --lengths 2k --device cpu | sed -n '3,8p'
if [ -x "$PY" ] && "$PY" -c 'import transformers, torch' 2>/dev/null; then
  echo "== transformers float32, tiny, 2K"
  HF=$("$PY" tests/reference/bench_transformers.py --model "$WORK/tiny" --tokens 2048 2>/dev/null | tail -1)
  echo "$HF"
  NS_TPS=$(head -1 "$WORK/ns.txt" | awk '{print $3}')
  HF_TPS=$(echo "$HF" | awk '{print $4}')
  awk -v a="$NS_TPS" -v b="$HF_TPS" 'BEGIN { printf "speed ratio needlescope / transformers at 2K on tiny: %.1fx\n", a / b }'
else
  echo "(transformers not found at $PY: skipped the comparison; see tests/reference/README.md)"
fi
