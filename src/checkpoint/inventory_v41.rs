//! The exact tensor list of a DeepSeek-V4.1 release, computed from its [`V41Config`] alone
//! (docs/spec/v41.md section 4.1); the V4 list is `inventory.rs`, whose two levels, roles and
//! storage rules this file reuses.
//!
//! What the config decides:
//! - every backbone layer `layers.{L}.` (L < `num_hidden_layers`): the 13 attention tensors,
//!   the two norms, the six mHC tensors, the router (`ffn.gate.weight`, `ffn.gate.bias` and,
//!   with a vision tower, the image-token selection bias `ffn.gate.bias_vl`), the shared
//!   experts and `n_routed_experts` routed experts;
//! - a compressor on KV sources only (`wkv`, `norm`, and `wgate` on ratio-2 sources: ratio-1
//!   rows are one projected token, nothing to gate; no `ape`, no doubled width: V4.1's
//!   compressor does not overlap windows);
//! - an indexer on index sources only (`wq_b`, `weights_proj`; the index keys' `wk` `[d_i, d]`
//!   and `k_norm` on KV sources only, since the keys live with the compressed cache);
//! - Engram on `engram_layer_ids`: the table `engram.embed` `[rows_L, engram_head_dim]` (FP8
//!   rows with one E8M0 scale per 32 columns in the official format, i.e. the FP8 block rule
//!   with a `1 x 32` block), the projection `engram.wkv` `[(hc+1)·D, (max_ngram-1)·heads·head_dim]`
//!   and the gate weights `q_weight` / `k_weight` `[hc, D]`;
//! - the draft blocks `mtp.{i}.` (one per `compress_ratios` entry after the main layers): a
//!   window-only layer with a `dspark_n_routed_experts` MoE; the first carries `main_norm` and
//!   `main_proj` `[D, targets·D]` (the concatenated target-layer states), the last its own
//!   `norm`, the rank-`dspark_markov_rank` Markov head and the confidence head;
//! - with a `vision_config`: the root image delimiters (`image_start`, `image_end`,
//!   `image_newline`), the vision tower `vision.*` and the aligner `aligner.*`, all BF16.
//!
//! No `hc_head_*` (V4.1 collapses the streams without it) and no hash-router `tid2eid`.
//! Order: `embed.weight`, layers in order, `head.weight`, `norm.weight`, the image delimiters,
//! the draft blocks, the vision tower and aligner. The released config gives exactly the
//! official index at revision dba1be0a: 96,085 tensors, 510,286,023,000 bytes (checked in
//! `tests/checkpoint/inventory_v41.rs`).

use super::inventory::{
    expand, CompressorLinear, ExpectedTensor, InventoryOptions, LogicalTensor, StorageRules,
    TensorRole,
};
use crate::config::{LayerRole, V41Config, V41Vision};

/// The logical tensor list of a release described by `cfg`.
pub fn logical_inventory_v41(cfg: &V41Config) -> Vec<LogicalTensor> {
    let t = &cfg.text;
    let d = t.hidden_size;
    let vision = cfg.vision.is_some();
    let mut out = Vec::new();
    let push = |out: &mut Vec<LogicalTensor>, name: String, role: TensorRole, shape: Vec<usize>| {
        out.push(LogicalTensor { name, role, shape })
    };
    push(
        &mut out,
        "embed.weight".into(),
        TensorRole::Embed,
        vec![t.vocab_size, d],
    );
    let roles = cfg.layer_roles();
    for role in roles.iter() {
        let p = format!("layers.{}.", role.layer);
        let moe = Moe {
            experts: t.n_routed_experts,
            vision,
        };
        block(cfg, &p, moe, &mut out);
        if let Some(k) = t.engram_layer_ids.iter().position(|&l| l == role.layer) {
            engram(cfg, &p, t.engram_num_embeddings[k], &mut out);
        }
        shared_kv(cfg, &p, role, &mut out);
    }
    push(
        &mut out,
        "head".into(),
        TensorRole::PlainLinear,
        vec![t.vocab_size, d],
    );
    push(&mut out, "norm.weight".into(), TensorRole::Norm, vec![d]);
    if vision {
        for n in ["image_start", "image_end", "image_newline"] {
            push(&mut out, n.into(), TensorRole::ImageDelimiter, vec![d]);
        }
    }
    let drafts = cfg.draft_blocks();
    for i in 0..drafts {
        let p = format!("mtp.{i}.");
        let moe = Moe {
            experts: t.dspark_n_routed_experts,
            vision,
        };
        block(cfg, &p, moe, &mut out);
        if i == 0 {
            let targets = t.dspark_target_layer_ids.len();
            push(
                &mut out,
                format!("{p}main_norm.weight"),
                TensorRole::Norm,
                vec![d],
            );
            push(
                &mut out,
                format!("{p}main_proj"),
                TensorRole::QuantLinear,
                vec![d, targets * d],
            );
        }
        if i + 1 == drafts {
            let r = t.dspark_markov_rank;
            push(
                &mut out,
                format!("{p}norm.weight"),
                TensorRole::Norm,
                vec![d],
            );
            for n in ["markov_head.embed", "markov_head.head"] {
                push(
                    &mut out,
                    format!("{p}{n}"),
                    TensorRole::PlainLinear,
                    vec![t.vocab_size, r],
                );
            }
            push(
                &mut out,
                format!("{p}confidence_head.proj"),
                TensorRole::PlainLinear,
                vec![1, d + r],
            );
        }
    }
    if let Some(v) = &cfg.vision {
        vision_tower(v, d, &mut out);
    }
    out
}

/// Every stored tensor of a release described by `cfg` in the format of `opts`, in the order
/// above:
/// `bf16` (every linear and table BF16, no scales), `official` (the release) or `nvfp4`
/// (NVIDIA's re-quantisation, docs/spec/v41.md 4.3: the backbone's routed experts NVFP4, U8 +
/// F8_E4M3 `weight_scale` per 16 + F32 `weight_scale_2` and `input_scale`, as V4's; draft-block
/// experts stay MXFP4; everything else as `official`).
/// `opts` may also carry what only a checkpoint settles, as for V4 (compressor / indexer
/// linears stored as FP8 blocks, NVFP4 draft-block experts).
pub fn expected_inventory_v41(
    cfg: &V41Config,
    opts: impl Into<InventoryOptions>,
) -> Vec<ExpectedTensor> {
    let rules = StorageRules::from(cfg);
    let opts = opts.into();
    logical_inventory_v41(cfg)
        .iter()
        .flat_map(|lt| expand(rules, opts, lt))
        .collect()
}

/// The routed-expert count of a block's MoE and whether its router has the image bias.
#[derive(Clone, Copy)]
struct Moe {
    experts: usize,
    vision: bool,
}

/// The tensors every block has (backbone layer or draft block) under prefix `p`: attention
/// without compressor or indexer, norms, mHC, router and experts.
fn block(cfg: &V41Config, p: &str, moe: Moe, out: &mut Vec<LogicalTensor>) {
    let t = &cfg.text;
    let (d, hc, h, hd) = (t.hidden_size, t.hc_mult, t.num_attention_heads, t.head_dim);
    let (ql, og, ol) = (t.q_lora_rank, t.o_groups, t.o_lora_rank);
    let inter = t.moe_intermediate_size;
    let mut add = |n: &str, role: TensorRole, shape: Vec<usize>| {
        out.push(LogicalTensor {
            name: format!("{p}{n}"),
            role,
            shape,
        })
    };
    let hc_rows = (2 + hc) * hc;
    add("attn.attn_sink", TensorRole::AttnSink, vec![h]);
    add("attn.wq_a", TensorRole::QuantLinear, vec![ql, d]);
    add("attn.q_norm.weight", TensorRole::Norm, vec![ql]);
    add("attn.wq_b", TensorRole::QuantLinear, vec![h * hd, ql]);
    add("attn.wkv", TensorRole::QuantLinear, vec![hd, d]);
    add("attn.kv_norm.weight", TensorRole::Norm, vec![hd]);
    add(
        "attn.wo_a",
        TensorRole::QuantLinear,
        vec![og * ol, h * hd / og],
    );
    add("attn.wo_b", TensorRole::QuantLinear, vec![d, og * ol]);
    add("attn_norm.weight", TensorRole::Norm, vec![d]);
    add("ffn_norm.weight", TensorRole::Norm, vec![d]);
    for n in ["hc_attn_fn", "hc_ffn_fn"] {
        add(n, TensorRole::HcFn, vec![hc_rows, hc * d]);
    }
    for n in ["hc_attn_base", "hc_ffn_base"] {
        add(n, TensorRole::HcBase, vec![hc_rows]);
    }
    for n in ["hc_attn_scale", "hc_ffn_scale"] {
        add(n, TensorRole::HcScale, vec![3]);
    }
    add("ffn.gate", TensorRole::PlainLinear, vec![moe.experts, d]);
    add("ffn.gate.bias", TensorRole::GateBias, vec![moe.experts]);
    if moe.vision {
        add("ffn.gate.bias_vl", TensorRole::GateBias, vec![moe.experts]);
    }
    let si = inter * t.n_shared_experts;
    if si > 0 {
        add(
            "ffn.shared_experts.w1",
            TensorRole::QuantLinear,
            vec![si, d],
        );
        add(
            "ffn.shared_experts.w3",
            TensorRole::QuantLinear,
            vec![si, d],
        );
        add(
            "ffn.shared_experts.w2",
            TensorRole::QuantLinear,
            vec![d, si],
        );
    }
    let expert = TensorRole::RoutedExpert {
        mtp: p.starts_with("mtp."),
    };
    for x in 0..moe.experts {
        add(&format!("ffn.experts.{x}.w1"), expert, vec![inter, d]);
        add(&format!("ffn.experts.{x}.w3"), expert, vec![inter, d]);
        add(&format!("ffn.experts.{x}.w2"), expert, vec![d, inter]);
    }
}

/// Engram on a layer under prefix `p` with a table of `rows` rows.
fn engram(cfg: &V41Config, p: &str, rows: u64, out: &mut Vec<LogicalTensor>) {
    let t = &cfg.text;
    let (d, hc) = (t.hidden_size, t.hc_mult);
    let width = t.engram_head_dim;
    // One row per n-gram size (2..=max) and head, concatenated.
    let gathered = (t.engram_max_ngram_size - 1) * t.engram_n_heads * width;
    let mut add = |n: &str, role: TensorRole, shape: Vec<usize>| {
        out.push(LogicalTensor {
            name: format!("{p}engram.{n}"),
            role,
            shape,
        })
    };
    // `rows` fits usize: validation bounds it (`V41_SIZE_LIMITS`: 2^33) on 64-bit targets.
    add("embed", TensorRole::EngramTable, vec![rows as usize, width]);
    // hc keys (one per residual copy) and one value.
    add("wkv", TensorRole::QuantLinear, vec![(hc + 1) * d, gathered]);
    add("q_weight", TensorRole::EngramGate, vec![hc, d]);
    add("k_weight", TensorRole::EngramGate, vec![hc, d]);
}

/// The compressor (KV sources) and indexer (index sources) of a layer under prefix `p`.
fn shared_kv(cfg: &V41Config, p: &str, role: &LayerRole, out: &mut Vec<LogicalTensor>) {
    let t = &cfg.text;
    let (d, hd, ql) = (t.hidden_size, t.head_dim, t.q_lora_rank);
    let (ih, ihd) = (t.index_n_heads, t.index_head_dim);
    let mut add = |n: &str, role: TensorRole, shape: Vec<usize>| {
        out.push(LogicalTensor {
            name: format!("{p}attn.{n}"),
            role,
            shape,
        })
    };
    if role.owns_kv() {
        add(
            "compressor.wkv",
            TensorRole::CompressorLinear(CompressorLinear::Wkv),
            vec![hd, d],
        );
        if role.ratio > 1 {
            add(
                "compressor.wgate",
                TensorRole::CompressorLinear(CompressorLinear::Wgate),
                vec![hd, d],
            );
        }
        add("compressor.norm.weight", TensorRole::Norm, vec![hd]);
    }
    if role.has_indexer() {
        add("indexer.wq_b", TensorRole::QuantLinear, vec![ih * ihd, ql]);
        add(
            "indexer.weights_proj",
            TensorRole::CompressorLinear(CompressorLinear::IndexerWeightsProj),
            vec![ih, d],
        );
        if role.owns_kv() {
            add("indexer.wk", TensorRole::PlainLinear, vec![ihd, hd]);
            add("indexer.k_norm.weight", TensorRole::Norm, vec![ihd]);
        }
    }
}

/// The vision tower and the aligner into the text width `d`.
fn vision_tower(v: &V41Vision, d: usize, out: &mut Vec<LogicalTensor>) {
    let w = v.hidden_size;
    // RGB patches of patch_size x patch_size.
    let patch = 3 * v.patch_size * v.patch_size;
    biased_linear(out, "vision.patch_embed.proj".into(), [w, patch]);
    for b in 0..v.num_hidden_layers {
        let p = format!("vision.blocks.{b}.");
        biased_linear(out, format!("{p}attn.wqkv"), [3 * w, w]);
        biased_linear(out, format!("{p}attn.wo"), [w, w]);
        let mut add = |n: &str, role: TensorRole, shape: Vec<usize>| {
            out.push(LogicalTensor {
                name: format!("{p}{n}"),
                role,
                shape,
            })
        };
        // Gate and up, fused.
        add(
            "mlp.w1",
            TensorRole::PlainLinear,
            vec![2 * v.intermediate_size, w],
        );
        add(
            "mlp.w2",
            TensorRole::PlainLinear,
            vec![w, v.intermediate_size],
        );
        add("norm1.weight", TensorRole::Norm, vec![w]);
        add("norm2.weight", TensorRole::Norm, vec![w]);
    }
    out.push(LogicalTensor {
        name: "vision.norm.weight".into(),
        role: TensorRole::Norm,
        shape: vec![w],
    });
    // Pixel-unshuffle of downsample x downsample patches before the aligner.
    let unshuffled = w * v.downsample_ratio * v.downsample_ratio;
    biased_linear(out, "aligner.w1".into(), [d, unshuffled]);
    biased_linear(out, "aligner.w2".into(), [d, d]);
}

/// A BF16 linear `name` `[out, in]` and its bias `name.bias` `[out]`.
fn biased_linear(out: &mut Vec<LogicalTensor>, name: String, [o, i]: [usize; 2]) {
    let bias = format!("{name}.bias");
    out.push(LogicalTensor {
        name,
        role: TensorRole::PlainLinear,
        shape: vec![o, i],
    });
    out.push(LogicalTensor {
        name: bias,
        role: TensorRole::Bias,
        shape: vec![o],
    });
}
