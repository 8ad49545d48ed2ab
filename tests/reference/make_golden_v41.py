#!/usr/bin/env python3
"""Golden-reference generator for needlescope's DeepSeek-V4.1 forward (docs/spec/v41.md 5).

Runs SGLang's pure-torch DeepSeek-V4.1 reference modules (`test/manual/deepseek_v41/`, which
SGLang tests against DeepSeek's official `inference/` code) in float32 on CPU over a fixed token
sequence and writes a small safetensors fixture the Rust tests compare against (index profile
`exact`, no KV rounding). CI never runs this script; see README.md next to it.

    python tests/reference/make_golden_v41.py --model DIR --sglang SGLANG_DIR \
        --out tests/fixtures/v41_tiny_golden.safetensors [--tokens 320 --seed 11 --blocks 16]

DIR is `needlescope synth --preset v41-tiny --format bf16` output (BF16/F32 tensors, no
`quantization_config`). SGLANG_DIR is a copy of SGLang's repository (or of just the files below)
at commit 0e43c22447dcb0c53eee3832c8acba26e491bc94:
  test/manual/deepseek_v41/dsv41_*.py
  python/sglang/srt/layers/attention/dsv4/torch_quant.py
  python/sglang/srt/layers/attention/dsv4/indexer.py  (only `select_candidate_blocks` is used)
Nothing of SGLang is vendored here; the script imports their files as they are and changes
nothing in them. What it changes around them:

* sglang itself is not installed: `sglang.srt.layers.quantization.fp8` is stood in by a module
  holding only `DSV4_DEQUANT_FP4_TABLE` (the e2m1 values, as in SGLang), and
  `sglang.srt.layers.attention.dsv4.indexer` by a module holding only `select_candidate_blocks`,
  compiled from that function's own source in indexer.py (the rest of that file needs GPU
  libraries).
* Precision (the exact-mode golden, issue 41): every `Linear` is built with an f32 weight and no
  scale (so `naive_linear` is a plain F.linear: no FP8 activation quantisation), the window-KV
  `fake_quant_fp8` and the compressed-KV / index `fake_quant_fp4` are replaced by the identity in
  the modules that call them, the Engram table lookup returns the f32 rows (not bf16), and the
  whole model (its caches included) is cast to float32. The FP4/FP8 quantisers are checked on
  their own inputs elsewhere; with them on, a 1e-6 change moves many top-k sets.
* Candidate budget: `--blocks` overrides `candidate_topk_blocks` (the tiny's 128 blocks x 8
  would need a 1,024+ token prompt to drop any block); the Rust test runs with the same
  what-if (`candidate_blocks`).
* Tie order: the reference's torch.topk order is unspecified, and exact ties are common on a
  tiny model (a row whose every index head's ReLU is 0 scores exactly 0). Inside the indexers
  the script replaces torch.topk by a stable descending sort (ties to the lower row or block,
  needlescope's rule), so that both forwards take the same rows. The fixture keeps the selected
  row sets (sorted ascending) and the full score rows, so a Rust test can still skip queries
  whose k-th and (k+1)-th scores are near-tied but not equal.
* Engram token classes come from the bundled DeepSeek tokenizer (--tokenizer, default the
  repository's assets/deepseek-v4-tokenizer.json.gz), through the reference's own
  `build_compressed_token_map` (it must give engram_compressed_vocab_size = 99,092 classes).

Fixture (T = --tokens, P = sampled positions, k = index_topk):
  tokens                               i64 [T]   BOS (0) then 3 + splitmix64_i(seed) mod (V - 3)
  positions                            i64 [P]   every 8th position and the last
  layers.L.hidden                      f32 [P, 4, D]  streams after layer L (all 12 layers)
  for each index source N:
  layers.N.indexer.scores              f32 [T, R_N] the scores the layer ranks (-inf: not visible
                                                     or, on consumers, outside the kept blocks)
  layers.N.indexer.selected            i32 [T, k]   the reference's picks, ascending, -1 padding
  for the candidate source S:
  layers.S.candidates.kept             u8  [T, ceil(R_S / 8)]  1 = block kept
  layers.8.indexer.scores_unconstrained f32 [T, R]  layer 8's scores from a run without the
                                                     candidate stage (inputs to layer 8 equal)
  logit_positions                      i64 [2]
  logits                               f32 [2, V]
Metadata: torch / numpy / tokenizers versions, SGLang commit, sha256 of config.json and the
safetensors file, seed, T, blocks.
"""

import argparse
import ast
import gzip
import hashlib
import importlib.util
import json
import os
import sys
import types

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

SGLANG_COMMIT = "0e43c22447dcb0c53eee3832c8acba26e491bc94"
MASK64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def tokens_for(seed, t, vocab):
    return [0] + [3 + splitmix64(seed + i) % (vocab - 3) for i in range(1, t)]


def stub(name, **attrs):
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


def install_sglang(root):
    for name in ["sglang", "sglang.srt", "sglang.srt.layers", "sglang.srt.layers.attention",
                 "sglang.srt.layers.attention.dsv4", "sglang.srt.layers.quantization"]:
        stub(name)
    table = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                          -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
    stub("sglang.srt.layers.quantization.fp8", DSV4_DEQUANT_FP4_TABLE=table)
    dsv4 = os.path.join(root, "python/sglang/srt/layers/attention/dsv4")
    spec = importlib.util.spec_from_file_location(
        "sglang.srt.layers.attention.dsv4.torch_quant", os.path.join(dsv4, "torch_quant.py"))
    tq = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = tq
    spec.loader.exec_module(tq)
    src = open(os.path.join(dsv4, "indexer.py")).read()
    fn = next(n for n in ast.parse(src).body
              if isinstance(n, ast.FunctionDef) and n.name == "select_candidate_blocks")
    code = compile(ast.Module(body=[fn], type_ignores=[]), "indexer.py", "exec")
    ns = {"torch": torch, "F": F}
    exec(code, ns)
    stub("sglang.srt.layers.attention.dsv4.indexer",
         select_candidate_blocks=ns["select_candidate_blocks"])
    sys.path.insert(0, os.path.join(root, "test/manual/deepseek_v41"))


def exact_mode():
    """Every Linear f32 without scale, fake quantisation off, Engram rows in f32."""
    import dsv41_attention
    import dsv41_engram
    import dsv41_indexer
    import dsv41_linear

    def linear_init(self, in_features, out_features, dtype):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features))
        self.register_parameter("scale", None)

    dsv41_linear.Linear.__init__ = linear_init
    ident = lambda x, *a, **k: x  # noqa: E731
    dsv41_attention.fake_quant_fp8 = ident
    dsv41_attention.fake_quant_fp4 = ident
    dsv41_indexer.fake_quant_fp4 = ident

    def embed_init(self, num_embeddings, dim):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(num_embeddings, dim))

    dsv41_engram.EngramEmbedding.__init__ = embed_init
    dsv41_engram.EngramEmbedding.forward = lambda self, idx: F.embedding(idx, self.weight)


class TokenizerShim:
    """What the reference's build_compressed_token_map reads of a HF tokenizer."""

    def __init__(self, tok):
        self.backend_tokenizer = tok

    def __len__(self):
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)


def args_from(cfg, blocks, max_seq):
    from dsv41_args import DeepseekV41Args
    t = cfg["text_config"]
    rs = t["rope_scaling"]
    n = t["num_hidden_layers"]
    return DeepseekV41Args(
        max_batch_size=1, max_seq_len=max_seq, vocab_size=t["vocab_size"], dim=t["hidden_size"],
        moe_inter_dim=t["moe_intermediate_size"], n_layers=n, n_heads=t["num_attention_heads"],
        n_routed_experts=t["n_routed_experts"], n_shared_experts=t["n_shared_experts"],
        n_activated_experts=t["num_experts_per_tok"], score_func=t["scoring_func"],
        route_scale=t["routed_scaling_factor"], swiglu_limit=t["swiglu_limit"],
        q_lora_rank=t["q_lora_rank"], head_dim=t["head_dim"], rope_head_dim=t["qk_rope_head_dim"],
        norm_eps=t["rms_norm_eps"], o_groups=t["o_groups"], o_lora_rank=t["o_lora_rank"],
        window_size=t["sliding_window"], compress_ratios=tuple(t["compress_ratios"]),
        kv_source_layers=tuple(t["kv_source_layer_ids"]),
        index_source_layers=tuple(t["index_source_layer_ids"]),
        compress_rope_theta=t["compress_rope_theta"],
        original_seq_len=rs["original_max_position_embeddings"], rope_theta=t["rope_theta"],
        rope_factor=rs["factor"], beta_fast=rs["beta_fast"], beta_slow=rs["beta_slow"],
        index_n_heads=t["index_n_heads"], index_head_dim=t["index_head_dim"],
        index_topk=t["index_topk"], candidate_source_layer=t["candidate_source_layer_id"],
        candidate_topk_blocks=blocks, candidate_block_size=t["candidate_block_size"],
        hc_mult=t["hc_mult"], hc_sinkhorn_iters=t["hc_sinkhorn_iters"], hc_eps=t["hc_eps"],
        engram_layer_ids=tuple(t["engram_layer_ids"]),
        engram_num_embeddings=tuple(t["engram_num_embeddings"]),
        engram_max_ngram_size=t["engram_max_ngram_size"], engram_vocab_size=t["engram_vocab_size"],
        engram_n_heads=t["engram_n_heads"], engram_head_dim=t["engram_head_dim"],
        engram_pad_id=t["engram_pad_token_id"],
        engram_compressed_vocab_size=t["engram_compressed_vocab_size"],
        vision_enabled=False,
    )


def build(cfg, weights, blocks, max_seq, tokenizer):
    from dsv41_transformer import Transformer
    model = Transformer(args_from(cfg, blocks, max_seq), tokenizer).float()
    params = dict(model.named_parameters())
    n = cfg["text_config"]["num_hidden_layers"]
    used = set()
    for name, value in weights.items():
        if name.startswith(("mtp.", "vision.", "aligner.", "image_")) or name.endswith("bias_vl"):
            continue
        if name.startswith("layers.") and int(name.split(".")[1]) >= n:
            continue
        if name not in params:
            sys.exit(f"checkpoint tensor {name} has no reference parameter")
        if tuple(params[name].shape) != tuple(value.shape):
            sys.exit(f"{name}: reference {tuple(params[name].shape)}, checkpoint {tuple(value.shape)}")
        params[name].data = value.float().clone()
        used.add(name)
    missing = sorted(set(params) - used)
    if missing:
        sys.exit(f"reference parameters the checkpoint lacks: {missing[:10]}")
    return model


class Capture:
    """Scores the index layers rank (the tensor their topk runs on), their picks, and the
    candidate source's kept blocks, through hooks around the reference's own calls."""

    def __init__(self, model, args):
        self.scores, self.selected, self.kept, self.hidden = {}, {}, {}, {}
        self.current = None
        import dsv41_indexer
        real_topk = torch.Tensor.topk
        cap = self

        def topk(t, k, dim=-1, largest=True, sorted=True):
            if cap.current is None or t.dim() != 3:
                return real_topk(t, k, dim=dim, largest=largest, sorted=sorted)
            # Inside an indexer: the candidate blocks' or the rows' top-k. Ties go to the lower
            # index (a stable descending sort), the rule needlescope documents; torch.topk
            # leaves them unspecified, and an exact tie (rows whose every head's ReLU is 0
            # score exactly 0) would otherwise send the two forwards apart for good.
            cap.scores[cap.current] = t.detach().clone()
            values, indices = torch.sort(t, dim=dim, descending=largest, stable=True)
            return types.SimpleNamespace(values=values[..., :k], indices=indices[..., :k])

        torch.Tensor.topk = topk
        real_select = dsv41_indexer.select_candidate_blocks

        def select(logits, lens, topk_blocks, block_size):
            mask = real_select(logits, lens, topk_blocks, block_size)
            cap.kept[cap.current] = mask[..., ::block_size].clone()
            return mask

        dsv41_indexer.select_candidate_blocks = select
        for i, layer in enumerate(model.layers):
            if layer.attn.indexer is not None:
                ix = layer.attn.indexer
                ix.register_forward_pre_hook(lambda m, a, i=i: setattr(cap, "current", i))

                def post(m, a, out, i=i):
                    cap.selected[i] = out.detach().clone()
                    cap.current = None
                ix.register_forward_hook(post)
            layer.register_forward_hook(
                lambda m, a, out, i=i: cap.hidden.__setitem__(i, out[0].detach().clone()))


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--sglang", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=320)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--blocks", type=int, default=16)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--tokenizer",
                    default=os.path.join(here, "../../assets/deepseek-v4-tokenizer.json.gz"))
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    install_sglang(a.sglang)
    exact_mode()
    from tokenizers import Tokenizer
    import tokenizers
    raw = open(a.tokenizer, "rb").read()
    if a.tokenizer.endswith(".gz"):
        raw = gzip.decompress(raw)
    tokenizer = TokenizerShim(Tokenizer.from_str(raw.decode()))
    cfg_path = os.path.join(a.model, "config.json")
    cfg = json.load(open(cfg_path))
    if "quantization_config" in cfg:
        sys.exit("expected a bf16 checkpoint (no quantization_config)")
    st = os.path.join(a.model, "model.safetensors")
    weights = load_file(st)
    t = cfg["text_config"]
    T, V = a.tokens, t["vocab_size"]
    ids = tokens_for(a.seed, T, V)
    x = torch.tensor([ids])

    model = build(cfg, weights, a.blocks, T, tokenizer)
    cap = Capture(model, None)
    with torch.no_grad():
        logits = model(x, 0, full_logits=True)[0]
    src = t["candidate_source_layer_id"]
    consumers = [l for l in t["index_source_layer_ids"] if l > src]

    # Layer 8's scores without the candidate stage: the same model with no candidate source.
    free = build(cfg, weights, a.blocks, T, tokenizer)
    for layer in free.layers:
        if layer.attn.indexer is not None:
            layer.attn.indexer.is_candidate_source = False
            layer.attn.indexer.uses_candidates = False
    cap_free = Capture(free, None)
    with torch.no_grad():
        free(x, 0, full_logits=True)

    positions = sorted(set(range(0, T, 8)) | {T - 1})
    pos = torch.tensor(positions)
    out = {
        "tokens": torch.tensor(ids, dtype=torch.int64),
        "positions": pos.to(torch.int64),
        "logit_positions": torch.tensor([T // 2, T - 1], dtype=torch.int64),
    }
    out["logits"] = logits[[T // 2, T - 1]].float().contiguous()
    for l, h in cap.hidden.items():
        out[f"layers.{l}.hidden"] = h[0][pos].float().contiguous()
    for l, s in cap.scores.items():
        out[f"layers.{l}.indexer.scores"] = s[0].float().contiguous()
        out[f"layers.{l}.indexer.selected"] = cap.selected[l][0].to(torch.int32).contiguous()
    # The reference adds the window's offset (T) to its picks; store plain row indices.
    for l in cap.scores:
        sel = out[f"layers.{l}.indexer.selected"]
        out[f"layers.{l}.indexer.selected"] = torch.where(sel >= 0, sel - T, sel).contiguous()
    out[f"layers.{src}.candidates.kept"] = cap.kept[src][0].to(torch.uint8).contiguous()
    first = consumers[0]
    out[f"layers.{first}.indexer.scores_unconstrained"] = \
        cap_free.scores[first][0].float().contiguous()
    meta = {
        "torch": torch.__version__, "numpy": np.__version__, "tokenizers": tokenizers.__version__,
        "sglang_commit": SGLANG_COMMIT, "config_sha256": sha256(cfg_path),
        "safetensors_sha256": sha256(st), "seed": str(a.seed), "tokens": str(T),
        "candidate_blocks": str(a.blocks), "first_consumer": str(first),
    }
    save_file(out, a.out, metadata=meta)
    kept = cap.kept[src][0]
    print(f"wrote {a.out}: {len(out)} tensors; kept blocks per query at T-1: "
          f"{int(kept[-1].sum())} of {kept.shape[1]}")


if __name__ == "__main__":
    main()
