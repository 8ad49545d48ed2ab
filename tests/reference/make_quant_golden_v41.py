#!/usr/bin/env python3
"""Golden values of DeepSeek-V4.1's fake quantisers on their own inputs (docs/spec/v41.md 5.8).

    python tests/reference/make_quant_golden_v41.py --sglang SGLANG_DIR \
        --out tests/fixtures/v41_quant_golden.safetensors

Imports SGLang's pure-torch quantisers (`python/sglang/srt/layers/attention/dsv4/torch_quant.py`
at sgl-project/sglang commit 0e43c22447dcb0c53eee3832c8acba26e491bc94, the module SGLang's V4.1
reference modules use; not vendored) and writes, for a fixed input `x` f32 [rows, 512] whose
32-blocks span many magnitudes (zeros, blocks below the amax floors, exact ties, values past
the formats' range):
  x                f32 [rows, 512]
  window_fp8       fake_quant_fp8(x): e4m3 per 32, power-of-two scales (window KV)
  index_fp4        fake_quant_fp4(x): e2m1 per 32, power-of-two scales (index q and k)
  compressed_fp4   e2m1 per 16 with an E4M3 scale e4m3(max(amax, 6 * 2^-9) / 6) (compressed KV;
                   torch_quant at that commit has no such function: the scale is torch's own
                   float8_e4m3fn cast, the codes torch_quant's round_fp4, as the reference's
                   fp4_act_quant(latent, 16, scale_dtype=e4m3) is described in
                   docs/spec/v41.md 5.8)
"""

import argparse
import importlib.util
import os
import sys
import types

import torch
from safetensors.torch import save_file


def load_torch_quant(root):
    for name in ["sglang", "sglang.srt", "sglang.srt.layers", "sglang.srt.layers.quantization"]:
        sys.modules[name] = types.ModuleType(name)
    fp8 = types.ModuleType("sglang.srt.layers.quantization.fp8")
    fp8.DSV4_DEQUANT_FP4_TABLE = torch.tensor(
        [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
    sys.modules[fp8.__name__] = fp8
    path = os.path.join(root, "python/sglang/srt/layers/attention/dsv4/torch_quant.py")
    spec = importlib.util.spec_from_file_location("torch_quant", path)
    tq = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tq)
    return tq


def inputs(rows=16, dim=512):
    g = torch.Generator().manual_seed(41)
    x = torch.randn(rows, dim, generator=g)
    # Per 16-block magnitudes from 2^-30 to 2^12, so every block lands in another binade.
    mags = 2.0 ** torch.randint(-30, 13, (rows, dim // 16), generator=g).float()
    x = x * mags.repeat_interleave(16, dim=1)
    x[0, :64] = 0.0                       # all-zero blocks: the floors decide the scale
    x[1, :32] = torch.linspace(-1e-5, 1e-5, 32)  # below the fp8 floor
    x[2, :32] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 4)  # e2m1 ties
    x[3, :32] = 448.0 * torch.linspace(-1.5, 1.5, 32)  # past e4m3's range
    return x.contiguous()


def compressed_fp4(tq, x, block=16):
    blocks = x.unflatten(-1, (-1, block))
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    scale = (amax.clamp_min(6 * 2.0 ** -9) / 6).to(torch.float8_e4m3fn).float()
    q = tq.round_fp4((blocks / scale).clamp(-6, 6))
    return (q * scale).flatten(-2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sglang", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    tq = load_torch_quant(a.sglang)
    x = inputs()
    out = {
        "x": x,
        "window_fp8": tq.fake_quant_fp8(x).contiguous(),
        "index_fp4": tq.fake_quant_fp4(x).contiguous(),
        "compressed_fp4": compressed_fp4(tq, x).contiguous(),
    }
    meta = {"torch": torch.__version__,
            "sglang_commit": "0e43c22447dcb0c53eee3832c8acba26e491bc94"}
    save_file(out, a.out, metadata=meta)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
