#!/usr/bin/env python3
"""Time HF transformers' deepseek_v4 prefill in float32 on CPU, for the speed comparison of
`scripts/bench-cpu.sh` (the CPU engine issue asks for needlescope's 2K `tiny` prefill to be at
least 5x faster than transformers float32 on the same checkpoint, measured in one run).

Same deterministic token ids as `needlescope bench` (LCG, ids in [3, vocab)). One warm-up
forward on 64 tokens, then the timed forward over all tokens (no cache, logits computed by HF
for every position, as its forward does). Prints one line: `transformers <tokens> <seconds> <tokens/s>`.

Install: see tests/reference/README.md (venv with torch, transformers>=5.24).
"""
import argparse
import time

import torch
from transformers import DeepseekV4ForCausalLM


def ids(n, vocab):
    s = 0x9E3779B97F4A7C15
    out = []
    for _ in range(n):
        s = (s * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append(3 + (s >> 33) % (vocab - 3))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = DeepseekV4ForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    model.eval()
    vocab = model.config.vocab_size
    with torch.no_grad():
        model(torch.tensor([ids(64, vocab)]), use_cache=False)
        x = torch.tensor([ids(a.tokens, vocab)])
        t0 = time.perf_counter()
        model(x, use_cache=False)
        dt = time.perf_counter() - t0
    print(f"transformers {a.tokens} {dt:.3f} {a.tokens / dt:.1f}")


if __name__ == "__main__":
    main()
