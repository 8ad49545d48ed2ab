#!/usr/bin/env python3
"""Golden-reference generator for needlescope (docs/architecture.md section 8, "Golden").

Runs HuggingFace transformers' pure-PyTorch `deepseek_v4` model in float32 on CPU over a fixed,
deterministic token sequence and writes a small safetensors fixture that the Rust tests compare
against (profile `exact`, `--kv exact`). CI never runs this script; see README.md next to it.

    python tests/reference/make_golden.py --model DIR --out tests/fixtures/tiny_golden.safetensors \
        [--tokens 300 --seed 7] [--self-check]

DIR is a checkpoint with the official DeepSeek-V4 tensor names (what `needlescope synth --preset
tiny --format bf16` writes): config.json + model.safetensors, BF16/F32/I64 tensors, no FP8/FP4 and
no `quantization_config`.

Fixture layout (all row indices 0-based; T = --tokens, R = floor(T/4), k = index_topk):
  tokens                      i64 [T]        BOS (0) then ids in [3, vocab) from splitmix64(seed)
  logit_positions             i64 [P]        positions whose logits are stored
  logits                      f32 [P, vocab]
  layers.L.hidden             f32 [T, hc_mult, hidden]   residual streams after decoder layer L
  for each CSA layer L (compress ratio 4):
  layers.L.indexer.scores     f32 [T, R]     indexer score of row w for query t; -inf where
                                             w >= floor((t+1)/4) (row not visible yet)
  layers.L.indexer.topk       i32 [T, k]     visible rows by descending score, ties to the lower
                                             row, -1 padding when fewer than k rows are visible
  layers.L.indexer.margin     f32 [T]        (k-th best) - ((k+1)-th best) visible score;
                                             +inf when fewer than k+1 rows are visible
Header metadata (strings): transformers / torch / numpy versions, sha256 of config.json and of
every *.safetensors file of the checkpoint, seed, T, topk, dtype, token rule, csa/hca layer lists.

------------------------------------------------------------------------------------------------
HF transformers (5.24) vs the official reference (docs/spec/attention.md, docs/spec/model.md), as it matters
here, and how this script deals with it:

* Precision. Loaded with dtype=float32, HF runs *every* op in fp32: no bf16 rounding of any
  intermediate (REF rounds q, kv, compressed rows, indexer weights, scores ... to bf16), no FP8
  activation quantisation of linears (docs/spec/model.md 2.3), no FP8 KV simulation (docs/spec/attention.md 3.5), no
  Hadamard and no FP4 simulation in the indexer (docs/spec/attention.md 3.6/3.7, 9.4). HF's own bf16
  deviations (compressor projections/weighted sum in bf16, cos/sin cast to bf16, bf16 router
  logits, bf16 hc_post; docs/spec/attention.md 3.4, 9.4, 11; docs/spec/model.md 9) do NOT apply in fp32 because all
  of them are "cast to the activation dtype". So the fixture is the un-quantised math = Rust's
  `exact` index profile with `--kv exact`, computed in f32 end to end.
* Indexer scores: HF computes sum_h (w_h * H_I^-0.5) * ReLU(q_h . k_w) * d_I^-0.5, i.e. the
  same 2^-6.5 product as REF (docs/spec/attention.md 6.3/6.4), in fp32. Scores are read from
  `...compressor.indexer.scorer` (output [B, S, R], before HF's causal -inf mask), the mask is
  re-applied here with the rule of docs/architecture.md section 4, w < floor((t+1)/4).
* Top-k: HF uses torch.topk on fp32 scores with k = min(index_topk, R) (R = rows of the whole
  prefill, like REF prefill, docs/spec/attention.md 6.5) and replaces picks >= floor((t+1)/4) by -1. Its
  tie order is unspecified, so this script writes its own top-k (stable sort: descending score,
  ties to the lower row, = docs/outputs.md `trace` convention) and the `margin` tensor so the Rust
  test can skip near-tied positions. HF's own indices are checked against ours (as sets, and as
  ordered lists where the top-k scores are well separated); the script aborts on a mismatch.
* Stateless forward (use_cache=False): one forward over all T ids gives per-position indexer
  outputs for every query position (HF's no-cache compressor emits every complete window of the
  prompt and masks per query; the trailing T mod 4 / T mod 128 tokens make no row, exactly as in
  REF prefill, docs/spec/attention.md 5.5). --self-check additionally runs the cached path one-shot and in
  chunks and asserts it reproduces the same logits / indices.
* Config: HF maps `compress_ratios` entries through {0: sliding, 4: CSA, 128: HCA} (any other
  value is a KeyError) and drops entries past num_hidden_layers (the MTP entry); the actual rates
  come from HF's `compress_rates` default {CSA: 4, HCA: 128}. `num_hash_layers` ->
  mlp_layer_types, `qk_rope_head_dim` -> partial_rotary_factor; the indexer uses the same rope
  width (qk_rope_head_dim, trailing dims, interleaved) as the main attention. `rope_scaling`
  {type: yarn, ...} becomes the `compress` rope (theta = compress_rope_theta, attention_factor
  forced to 1.0 = no mscale); sliding layers use plain theta = rope_theta. YaRN low/high are
  floor/ceil (truncate=True) like REF. `quantization_config` must be absent for a BF16 checkpoint.
* MTP: HF ignores `mtp.*` on load and never runs it: nothing MTP-related is in the fixture.
* MoE: HF always renormalises the selected router weights (+1e-20 in the denominator), applies
  them after down_proj; `norm_topk_prob`, `topk_method`, `n_shared_experts` (assumed 1) are not
  used. Experts are forced to the plain "eager" loop here.
* Masks: the script asserts that every attention layer received a tensor mask (HF only appends
  the compressor's causal/top-k block bias to a tensor mask; a None mask would silently let every
  query see every compressed row).
------------------------------------------------------------------------------------------------
"""

import argparse
import hashlib
import json
import os
import sys

import numpy as np
import torch

MASK64 = (1 << 64) - 1


def splitmix64_tokens(n, seed, vocab):
    """tokens[0] = 0 (BOS); tokens[i] = 3 + (splitmix64 output i) mod (vocab - 3) for i >= 1.

    splitmix64: state += 0x9E3779B97F4A7C15; z = state; z = (z ^ z>>30) * 0xBF58476D1CE4E5B9;
    z = (z ^ z>>27) * 0x94D049BB133111EB; out = z ^ z>>31 (all mod 2^64), state starts at seed.
    """
    state = seed & MASK64
    out = [0]
    for _ in range(n - 1):
        state = (state + 0x9E3779B97F4A7C15) & MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        z ^= z >> 31
        out.append(3 + z % (vocab - 3))
    return out


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def own_topk(masked, k):
    """masked: f32 [T, R] with -inf for invisible rows. Returns topk i32 [T, k], margin f32 [T]."""
    T, R = masked.shape
    topk = np.full((T, k), -1, dtype=np.int32)
    margin = np.full((T,), np.inf, dtype=np.float32)
    for t in range(T):
        n_t = min((t + 1) // 4, R)
        if n_t == 0:
            continue
        s = masked[t, :n_t]
        order = np.argsort(-s, kind="stable")  # descending, ties to the lower row
        m = min(k, n_t)
        topk[t, :m] = order[:m]
        if n_t > k:
            margin[t] = s[order[k - 1]] - s[order[k]]
    return topk, margin


def load_model(model_dir):
    from transformers import DeepseekV4ForCausalLM

    model, info = DeepseekV4ForCausalLM.from_pretrained(
        model_dir,
        dtype=torch.float32,
        attn_implementation="eager",
        experts_implementation="eager",
        output_loading_info=True,
    )
    bad = {k: v for k, v in info.items() if v}
    if bad:
        sys.exit(f"checkpoint did not load cleanly into HF deepseek_v4: {bad}")
    model.eval()
    return model


def run(model, ids, capture, **kw):
    """One forward; returns logits [S, V] and (if capture) per-layer hidden / indexer outputs."""
    cfg = model.config
    layers = model.model.layers
    hidden, scores, hf_topk, handles = {}, {}, {}, []
    mask_ok = []

    if capture:
        for L, layer in enumerate(layers):
            handles.append(layer.register_forward_hook(
                lambda mod, args, out, L=L: hidden.__setitem__(L, out.detach().clone())))

            def pre(mod, args, kwargs):
                mask_ok.append(isinstance(kwargs.get("attention_mask"), torch.Tensor))
            handles.append(layer.self_attn.register_forward_pre_hook(pre, with_kwargs=True))
            if cfg.layer_types[L] == "compressed_sparse_attention":
                idx = layer.self_attn.compressor.indexer
                handles.append(idx.scorer.register_forward_hook(
                    lambda mod, args, out, L=L: scores.__setitem__(L, out.detach().clone())))
                handles.append(idx.register_forward_hook(
                    lambda mod, args, out, L=L: hf_topk.__setitem__(L, out.detach().clone())))
    try:
        with torch.no_grad():
            out = model(input_ids=ids, **kw)
    finally:
        for h in handles:
            h.remove()
    if capture and not all(mask_ok):
        sys.exit("an attention layer got a non-tensor mask: HF would drop the compressor block bias")
    return out, hidden, scores, hf_topk


def check_hf_topk(L, hf, ours, masked, margin, k):
    """HF's (tie-order-unspecified) indices must match ours wherever the scores separate them."""
    T = masked.shape[0]
    hf = hf.numpy()
    kk = hf.shape[1]
    n_set = n_ord = 0
    for t in range(T):
        n_t = (t + 1) // 4
        m = min(k, n_t)
        a = hf[t]
        assert (a[m:] == -1).all() and (a[:m] >= 0).all(), (L, t, a)
        if not np.isfinite(margin[t]) or margin[t] > 1e-5 * max(1.0, abs(masked[t, ours[t, 0]])):
            if set(a[:m].tolist()) != set(ours[t, :m].tolist()):
                sys.exit(f"layer {L} t={t}: HF top-k {a[:m]} != ours {ours[t, :m]}")
            n_set += 1
            sel = masked[t, ours[t, :m]]
            if m < 2 or np.min(sel[:-1] - sel[1:]) > 1e-5 * max(1.0, abs(sel[0])):
                if not (a[:m] == ours[t, :m]).all():
                    sys.exit(f"layer {L} t={t}: HF top-k order {a[:m]} != ours {ours[t, :m]}")
                n_ord += 1
    assert kk == min(k, masked.shape[1])
    return n_set, n_ord


def self_check(model, ids, ref_logits, ref_topk, T):
    """HF's cached path (one shot, then chunked prefill) must reproduce the stateless forward."""
    from transformers import DynamicCache

    out, _, _, topk1 = run(model, ids, True, use_cache=True, cache=DynamicCache(config=model.config))
    d1 = (out.logits[0] - ref_logits).abs().max().item()
    print(f"self-check: cached one-shot vs stateless max |dlogit| = {d1:.3e}")
    cache = DynamicCache(config=model.config)
    parts, s = [], 0
    for c in (1, 6, 57, 100, T):  # odd chunk sizes straddle CSA and HCA window boundaries
        e = min(T, s + c)
        if e <= s:
            break
        o, _, _, _ = run(model, ids[:, s:e], False, use_cache=True, cache=cache,
                         position_ids=torch.arange(s, e).unsqueeze(0))
        parts.append(o.logits[0])
        s = e
    d2 = (torch.cat(parts) - ref_logits).abs().max().item()
    print(f"self-check: chunked prefill (1,6,57,100,rest) vs stateless max |dlogit| = {d2:.3e}")
    scale = ref_logits.abs().max().item()
    for L in ref_topk:
        same = (topk1[L][0].numpy() == ref_topk[L]).all()
        print(f"self-check: layer {L} cached one-shot HF top-k identical to stateless: {same}")
    if d1 > 1e-4 * scale or d2 > 1e-4 * scale:
        sys.exit("self-check failed: HF cached / chunked forward disagrees with the stateless one")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 = most reproducible)")
    ap.add_argument("--self-check", action="store_true",
                    help="also verify HF's cached one-shot and chunked prefill against the stateless run")
    args = ap.parse_args()

    import transformers

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg_path = os.path.join(args.model, "config.json")
    with open(cfg_path) as f:
        raw_cfg = json.load(f)
    if raw_cfg.get("quantization_config"):
        sys.exit("config.json has quantization_config: this script expects an un-quantised (bf16) checkpoint")

    model = load_model(args.model)
    cfg = model.config
    T, V, k = args.tokens, cfg.vocab_size, cfg.index_topk
    csa = [L for L, t in enumerate(cfg.layer_types) if t == "compressed_sparse_attention"]
    hca = [L for L, t in enumerate(cfg.layer_types) if t == "heavily_compressed_attention"]
    assert cfg.compress_rates["compressed_sparse_attention"] == 4
    assert cfg.compress_rates["heavily_compressed_attention"] == 128

    tokens = torch.tensor(splitmix64_tokens(T, args.seed, V), dtype=torch.int64)
    ids = tokens.unsqueeze(0)
    out, hidden, scores, hf_topk = run(model, ids, True, use_cache=False)
    logits = out.logits[0].float()

    R = T // 4
    tensors = {"tokens": tokens}
    for L in range(cfg.num_hidden_layers):
        h = hidden[L][0]
        assert tuple(h.shape) == (T, cfg.hc_mult, cfg.hidden_size), h.shape
        tensors[f"layers.{L}.hidden"] = h.float().contiguous()
    ours_topk = {}
    for L in csa:
        s = scores[L][0].float().numpy()
        assert s.shape == (T, R), s.shape
        t_idx = np.arange(T)[:, None]
        visible = np.arange(R)[None, :] < (t_idx + 1) // 4
        masked = np.where(visible, s, -np.inf).astype(np.float32)
        topk, margin = own_topk(masked, k)
        n_set, n_ord = check_hf_topk(L, hf_topk[L][0], topk, masked, margin, k)
        ours_topk[L] = topk
        vis = masked[np.isfinite(masked)]
        nontriv = np.isfinite(margin)
        print(f"layer {L} (CSA): scores min/mean/max {vis.min():.4g}/{vis.mean():.4g}/{vis.max():.4g}, "
              f"zero fraction {np.mean(vis == 0):.3f}; positions with n_t > k: {nontriv.sum()}, "
              f"margin min/median {margin[nontriv].min():.3g}/{np.median(margin[nontriv]):.3g}, "
              f"margin < 1e-4: {(margin[nontriv] < 1e-4).sum()}; HF top-k agrees (set) at {n_set}/{T}, "
              f"(order) at {n_ord}/{T}")
        tensors[f"layers.{L}.indexer.scores"] = torch.from_numpy(masked)
        tensors[f"layers.{L}.indexer.topk"] = torch.from_numpy(topk)
        tensors[f"layers.{L}.indexer.margin"] = torch.from_numpy(margin)

    pos = sorted({p for p in (0, 1, 2, 3, 4, 7, 63, 127, 128, 131, 255, 256, 259, T // 2, T - 2, T - 1)
                  if 0 <= p < T})
    tensors["logit_positions"] = torch.tensor(pos, dtype=torch.int64)
    tensors["logits"] = logits[pos].contiguous()

    if args.self_check:
        self_check(model, ids, logits, hf_topk_arrays(hf_topk, csa), T)

    ckpt_hashes = {f"sha256:{fn}": sha256_file(os.path.join(args.model, fn))
                   for fn in sorted(os.listdir(args.model)) if fn.endswith(".safetensors")}
    meta = {
        "generator": "tests/reference/make_golden.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "numpy_version": np.__version__,
        "config_sha256": sha256_file(cfg_path),
        **ckpt_hashes,
        "seed": str(args.seed),
        "T": str(T),
        "topk": str(k),
        "dtype": "float32",
        "profile": "exact",
        "kv": "exact",
        "csa_layers": ",".join(map(str, csa)),
        "hca_layers": ",".join(map(str, hca)),
        "token_rule": "tokens[0]=0; tokens[i]=3+splitmix64_i(seed) mod (vocab-3)",
        "topk_rule": "descending score, ties to lower row, -1 padding; visible iff w < (t+1)//4",
    }
    from safetensors.torch import save_file

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    save_file({n: t.contiguous() for n, t in tensors.items()}, args.out, metadata=meta)
    print(f"wrote {args.out}: {os.path.getsize(args.out)} bytes, {len(tensors)} tensors, T={T}, "
          f"logit positions {pos}")


def hf_topk_arrays(hf_topk, csa):
    """HF's own stateless top-k per CSA layer ([T, k] int arrays), the self-check reference."""
    return {L: hf_topk[L][0].numpy() for L in csa}


if __name__ == "__main__":
    main()
