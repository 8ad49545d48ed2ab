//! The exact tensor list of a DeepSeek-V4 release, computed from `config.json` alone
//! (docs/spec/model.md section 3). The diff of a checkpoint against it is in `audit.rs`.
//!
//! Two levels:
//! - [`logical_inventory`]: what the model holds, format-free. Linears appear once, by module
//!   name (`layers.3.attn.wq_a`), with their logical `[out, in]` shape and a [`TensorRole`] that says
//!   how each format stores them; every other tensor appears by its full name.
//! - [`expected_inventory`]: the logical list expanded into stored tensors for one
//!   [`WeightFormat`] (`.weight` plus `.scale` / `.weight_scale` / `.weight_scale_2` /
//!   `.input_scale` siblings, packed FP4 halving the last dimension).
//!
//! Order: `embed.weight`, layers 0..L in order, the root head tensors, then `mtp.{i}.` — the
//! order of the official shards, which `synth` follows. Within a layer: the common tensors in
//! the order of spec table 3.2, the router extra, then compressor and indexer extras.
//!
//! Storage rules (spec 2.4-2.5): `Bf16` stores every linear as BF16 [out, in] with no scales.
//! `Official`: FP8 set (`wq_a wq_b wkv wo_a wo_b`, `indexer.wq_b`, shared experts, MTP
//! `e_proj`/`h_proj`) as F8_E4M3 + E8M0 `.scale` [ceil(o/bo), ceil(i/bi)]; routed experts by
//! `expert_dtype` (fp4: I8 [o, i/2] + E8M0 `.scale` [o, ceil(i/32)]; fp8 or absent: like the FP8
//! set; bf16: BF16). `Nvfp4`: as `Official` except main-layer routed experts, which are U8
//! [o, i/2] + F8_E4M3 `weight_scale` [o, ceil(i/16)] + F32 `weight_scale_2` [] + F32
//! `input_scale` []; MTP experts stay MXFP4 unless the checkpoint shows otherwise.
//! Compressor / indexer linears (`wkv`, `wgate`, `weights_proj`) are BF16 in every format,
//! except that a kind a checkpoint stores as F8_E4M3 is expected as the FP8 set in every layer
//! (docs/spec/model.md section 9: trust the safetensors dtype; see `Checkpoint::inventory_options`).

use super::dtype::{Dtype, WeightFormat};
use crate::config::{LayerRole, ModelConfig, RouterKind, V41Config};

pub use super::compressor_kinds::{CompressorKinds, CompressorLinear};

/// Group size of the MXFP4-like official expert scales.
pub const FP4_GROUP: usize = 32;
/// Group size of NVFP4 expert scales.
pub const NVFP4_GROUP: usize = 16;

/// What a tensor is, which decides both its storage and its synthetic values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TensorRole {
    /// `embed.weight` `[vocab, hidden]`, BF16.
    Embed,
    /// A linear stored BF16 in every format (`head`, router `gate`).
    PlainLinear,
    /// A compressor or indexer linear (`wkv`, `wgate`, `weights_proj`): BF16 in the Flash
    /// release, FP8 blocks where a checkpoint stores them so (docs/spec/model.md section 9: "trust
    /// the safetensors dtype"; [`InventoryOptions::fp8_compressor_linears`]).
    CompressorLinear(CompressorLinear),
    /// A linear of the FP8 set.
    QuantLinear,
    /// A routed expert's `w1`/`w2`/`w3`; `mtp` marks the MTP namespace.
    RoutedExpert { mtp: bool },
    /// An RMSNorm weight, BF16.
    Norm,
    /// `attn.attn_sink` `[heads]`, F32.
    AttnSink,
    /// Compressor position bias `ape` `[ratio, width]`, F32.
    Ape,
    /// mHC `hc_*_fn` `[rows, hc * hidden]`, F32.
    HcFn,
    /// mHC `hc_*_base`, F32: `[(2+hc)*hc]` (pre, post, comb rows) or `[hc]` for the head.
    HcBase,
    /// mHC `hc_*_scale` `[3]` or `[1]`, F32.
    HcScale,
    /// Router selection bias `ffn.gate.bias` `[experts]`, F32.
    GateBias,
    /// Hash router table `ffn.gate.tid2eid` `[vocab, experts_per_tok]`, I64.
    Tid2eid,
    /// V4.1 Engram table `engram.embed` `[rows, width]`: FP8 rows with one E8M0 scale per 32
    /// columns in the official format (the FP8 block rule with a `1 x 32` block), BF16 in `bf16`.
    EngramTable,
    /// V4.1 Engram gate weights `engram.q_weight` / `engram.k_weight` `[hc, hidden]`, BF16.
    EngramGate,
    /// V4.1 learned image delimiter (`image_start`, `image_end`, `image_newline`) `[hidden]`, BF16.
    ImageDelimiter,
    /// The bias of a BF16 linear (V4.1 vision tower and aligner), BF16.
    Bias,
}

impl TensorRole {
    pub fn is_linear(self) -> bool {
        matches!(
            self,
            TensorRole::PlainLinear
                | TensorRole::CompressorLinear(_)
                | TensorRole::QuantLinear
                | TensorRole::RoutedExpert { .. }
                | TensorRole::EngramTable
        )
    }
}

/// What a family's config says about storage: the FP8 block of its quantised linears and how
/// the official format stores routed experts (`expert_dtype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StorageRules {
    /// `quantization_config.weight_block_size` (V4 `[128, 128]`, V4.1 `[32, 32]`).
    pub block: (usize, usize),
    /// Routed experts in the official format.
    pub official_expert: LinearStorage,
}

impl StorageRules {
    fn new(block: (usize, usize), expert_dtype: Option<&str>) -> Self {
        let official_expert = match expert_dtype {
            Some("fp4") => LinearStorage::Fp4Group,
            Some("bf16") => LinearStorage::Bf16,
            _ => LinearStorage::Fp8Block { block },
        };
        StorageRules {
            block,
            official_expert,
        }
    }
}

impl From<&ModelConfig> for StorageRules {
    fn from(cfg: &ModelConfig) -> Self {
        StorageRules::new(cfg.weight_block(), cfg.expert_dtype.as_deref())
    }
}

impl From<&V41Config> for StorageRules {
    /// A bf16 V4.1 config names no block (the release's is used, for the `official` format
    /// only) and no `expert_dtype` (experts are then expected as FP8 blocks in `official`,
    /// as for V4).
    fn from(cfg: &V41Config) -> Self {
        let w = &cfg.weights;
        StorageRules::new(
            w.block.unwrap_or(crate::config::v41::WEIGHT_BLOCK),
            w.expert_dtype.as_deref(),
        )
    }
}

/// One format-free tensor: a linear module (name without `.weight`) or a plain tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogicalTensor {
    pub name: String,
    pub role: TensorRole,
    /// Logical shape (`[out, in]` for linears, unpacked).
    pub shape: Vec<usize>,
}

/// How one linear is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinearStorage {
    Bf16,
    Fp8Block { block: (usize, usize) },
    Fp4Group,
    Nvfp4,
}

/// One stored tensor as a release should hold it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ExpectedTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
}

impl ExpectedTensor {
    pub(crate) fn new(name: String, dtype: Dtype, shape: Vec<usize>) -> Self {
        ExpectedTensor { name, dtype, shape }
    }
    /// Payload bytes, saturating at `u64::MAX` (never a wrapped, plausible figure).
    pub fn bytes(&self) -> u64 {
        self.shape
            .iter()
            .fold(self.dtype.size() as u64, |b, &d| b.saturating_mul(d as u64))
    }
}

/// Choices beyond the format that only a checkpoint can settle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InventoryOptions {
    pub format: WeightFormat,
    /// NVFP4 only: MTP routed experts are NVFP4 too (spec 2.5 says likely MXFP4; UNKNOWN).
    pub mtp_experts_nvfp4: bool,
    /// Compressor / indexer linears stored as FP8 blocks + E8M0 `.scale` instead of BF16
    /// (any format; the Flash release has none, a Flash-Base checkpoint is reported to).
    pub fp8_compressor_linears: CompressorKinds,
}

impl From<WeightFormat> for InventoryOptions {
    fn from(format: WeightFormat) -> Self {
        InventoryOptions {
            format,
            mtp_experts_nvfp4: false,
            fp8_compressor_linears: CompressorKinds::NONE,
        }
    }
}

/// The logical tensor list of a release described by `cfg`.
pub fn logical_inventory(cfg: &ModelConfig) -> Vec<LogicalTensor> {
    let mut out = Vec::new();
    let (d, hc) = (cfg.hidden_size, cfg.hc_mult);
    let push = |out: &mut Vec<LogicalTensor>, name: String, role: TensorRole, shape: Vec<usize>| {
        out.push(LogicalTensor { name, role, shape })
    };
    push(
        &mut out,
        "embed.weight".into(),
        TensorRole::Embed,
        vec![cfg.vocab_size, d],
    );
    for (l, attn) in cfg.layer_roles().iter().enumerate() {
        let p = format!("layers.{l}.");
        layer(cfg, &p, attn, cfg.router_kind(l), false, &mut out);
    }
    push(
        &mut out,
        "head".into(),
        TensorRole::PlainLinear,
        vec![cfg.vocab_size, d],
    );
    push(&mut out, "norm.weight".into(), TensorRole::Norm, vec![d]);
    hc_head(&mut out, "", hc, d);
    for i in 0..cfg.num_nextn_predict_layers {
        let p = format!("mtp.{i}.");
        layer(
            cfg,
            &p,
            &cfg.mtp_layer_role(i),
            RouterKind::Score,
            true,
            &mut out,
        );
        push(
            &mut out,
            format!("{p}e_proj"),
            TensorRole::QuantLinear,
            vec![d, d],
        );
        push(
            &mut out,
            format!("{p}h_proj"),
            TensorRole::QuantLinear,
            vec![d, d],
        );
        for n in ["enorm", "hnorm", "norm"] {
            push(
                &mut out,
                format!("{p}{n}.weight"),
                TensorRole::Norm,
                vec![d],
            );
        }
        hc_head(&mut out, &p, hc, d);
    }
    out
}

fn hc_head(out: &mut Vec<LogicalTensor>, p: &str, hc: usize, d: usize) {
    let t = |n: &str, role, shape| LogicalTensor {
        name: format!("{p}{n}"),
        role,
        shape,
    };
    out.push(t("hc_head_fn", TensorRole::HcFn, vec![hc, hc * d]));
    out.push(t("hc_head_base", TensorRole::HcBase, vec![hc]));
    out.push(t("hc_head_scale", TensorRole::HcScale, vec![1]));
}

/// One decoder layer (main or MTP) under prefix `p`; `attn` says whether its attention has a
/// compressor and an indexer.
fn layer(
    cfg: &ModelConfig,
    p: &str,
    attn: &LayerRole,
    router: RouterKind,
    mtp: bool,
    out: &mut Vec<LogicalTensor>,
) {
    let (d, hc, h, hd) = (
        cfg.hidden_size,
        cfg.hc_mult,
        cfg.num_attention_heads,
        cfg.head_dim,
    );
    let (ql, og, ol) = (cfg.q_lora_rank, cfg.o_groups, cfg.o_lora_rank);
    let (e, inter) = (cfg.n_routed_experts, cfg.moe_intermediate_size);
    let mut t = |n: String, role: TensorRole, shape: Vec<usize>| {
        out.push(LogicalTensor {
            name: format!("{p}{n}"),
            role,
            shape,
        })
    };
    let hc_rows = (2 + hc) * hc;
    t("attn_norm.weight".into(), TensorRole::Norm, vec![d]);
    t("ffn_norm.weight".into(), TensorRole::Norm, vec![d]);
    t("hc_attn_fn".into(), TensorRole::HcFn, vec![hc_rows, hc * d]);
    t("hc_ffn_fn".into(), TensorRole::HcFn, vec![hc_rows, hc * d]);
    t("hc_attn_base".into(), TensorRole::HcBase, vec![hc_rows]);
    t("hc_ffn_base".into(), TensorRole::HcBase, vec![hc_rows]);
    t("hc_attn_scale".into(), TensorRole::HcScale, vec![3]);
    t("hc_ffn_scale".into(), TensorRole::HcScale, vec![3]);
    t("attn.attn_sink".into(), TensorRole::AttnSink, vec![h]);
    t("attn.wq_a".into(), TensorRole::QuantLinear, vec![ql, d]);
    t("attn.q_norm.weight".into(), TensorRole::Norm, vec![ql]);
    t(
        "attn.wq_b".into(),
        TensorRole::QuantLinear,
        vec![h * hd, ql],
    );
    t("attn.wkv".into(), TensorRole::QuantLinear, vec![hd, d]);
    t("attn.kv_norm.weight".into(), TensorRole::Norm, vec![hd]);
    t(
        "attn.wo_a".into(),
        TensorRole::QuantLinear,
        vec![og * ol, h * hd / og],
    );
    t(
        "attn.wo_b".into(),
        TensorRole::QuantLinear,
        vec![d, og * ol],
    );
    t("ffn.gate".into(), TensorRole::PlainLinear, vec![e, d]);
    let expert = TensorRole::RoutedExpert { mtp };
    for x in 0..e {
        t(format!("ffn.experts.{x}.w1"), expert, vec![inter, d]);
        t(format!("ffn.experts.{x}.w3"), expert, vec![inter, d]);
        t(format!("ffn.experts.{x}.w2"), expert, vec![d, inter]);
    }
    if cfg.n_shared_experts > 0 {
        let si = inter * cfg.n_shared_experts;
        t(
            "ffn.shared_experts.w1".into(),
            TensorRole::QuantLinear,
            vec![si, d],
        );
        t(
            "ffn.shared_experts.w3".into(),
            TensorRole::QuantLinear,
            vec![si, d],
        );
        t(
            "ffn.shared_experts.w2".into(),
            TensorRole::QuantLinear,
            vec![d, si],
        );
    }
    match router {
        RouterKind::Hash => t(
            "ffn.gate.tid2eid".into(),
            TensorRole::Tid2eid,
            vec![cfg.vocab_size, cfg.num_experts_per_tok],
        ),
        RouterKind::Score => t("ffn.gate.bias".into(), TensorRole::GateBias, vec![e]),
    }
    if !attn.owns_kv() {
        return;
    }
    let rows = attn
        .rows()
        .expect("a layer with a compressor has compressed rows");
    let ratio = rows.ratio;
    // An overlapping compressor projects each token twice (its own window and the next).
    let c = if rows.overlap { 2 } else { 1 };
    t(
        "attn.compressor.ape".into(),
        TensorRole::Ape,
        vec![ratio, c * hd],
    );
    t(
        "attn.compressor.wkv".into(),
        TensorRole::CompressorLinear(CompressorLinear::Wkv),
        vec![c * hd, d],
    );
    t(
        "attn.compressor.wgate".into(),
        TensorRole::CompressorLinear(CompressorLinear::Wgate),
        vec![c * hd, d],
    );
    t(
        "attn.compressor.norm.weight".into(),
        TensorRole::Norm,
        vec![hd],
    );
    if attn.has_indexer() {
        let (ih, ihd) = (cfg.index_n_heads, cfg.index_head_dim);
        t(
            "attn.indexer.wq_b".into(),
            TensorRole::QuantLinear,
            vec![ih * ihd, ql],
        );
        t(
            "attn.indexer.weights_proj".into(),
            TensorRole::CompressorLinear(CompressorLinear::IndexerWeightsProj),
            vec![ih, d],
        );
        t(
            "attn.indexer.compressor.ape".into(),
            TensorRole::Ape,
            vec![ratio, 2 * ihd],
        );
        t(
            "attn.indexer.compressor.wkv".into(),
            TensorRole::CompressorLinear(CompressorLinear::IndexerWkv),
            vec![2 * ihd, d],
        );
        t(
            "attn.indexer.compressor.wgate".into(),
            TensorRole::CompressorLinear(CompressorLinear::IndexerWgate),
            vec![2 * ihd, d],
        );
        t(
            "attn.indexer.compressor.norm.weight".into(),
            TensorRole::Norm,
            vec![ihd],
        );
    }
}

/// Scale group of a V4.1 Engram table row (one E8M0 scale per 32 columns).
pub const ENGRAM_GROUP: usize = 32;

/// How a linear of `role` is stored under `opts` (non-linear roles: `None`).
pub fn linear_storage(
    rules: StorageRules,
    opts: InventoryOptions,
    role: TensorRole,
) -> Option<LinearStorage> {
    let fp8 = LinearStorage::Fp8Block { block: rules.block };
    Some(match (role, opts.format) {
        (TensorRole::PlainLinear, _) => LinearStorage::Bf16,
        (TensorRole::CompressorLinear(kind), _) if opts.fp8_compressor_linears.contains(kind) => {
            fp8
        }
        (TensorRole::CompressorLinear(_), _) => LinearStorage::Bf16,
        (r, WeightFormat::Bf16) if r.is_linear() => LinearStorage::Bf16,
        (TensorRole::QuantLinear, _) => fp8,
        (TensorRole::EngramTable, _) => LinearStorage::Fp8Block {
            block: (1, ENGRAM_GROUP),
        },
        (TensorRole::RoutedExpert { mtp }, WeightFormat::Nvfp4)
            if !mtp || opts.mtp_experts_nvfp4 =>
        {
            LinearStorage::Nvfp4
        }
        (TensorRole::RoutedExpert { .. }, _) => rules.official_expert,
        _ => return None,
    })
}

/// The stored tensors of one logical tensor under `opts`.
pub fn expand(
    rules: StorageRules,
    opts: InventoryOptions,
    lt: &LogicalTensor,
) -> Vec<ExpectedTensor> {
    let n = &lt.name;
    let plain = |dtype| vec![ExpectedTensor::new(n.clone(), dtype, lt.shape.clone())];
    let Some(storage) = linear_storage(rules, opts, lt.role) else {
        return match lt.role {
            TensorRole::Embed
            | TensorRole::Norm
            | TensorRole::EngramGate
            | TensorRole::ImageDelimiter
            | TensorRole::Bias => plain(Dtype::BF16),
            TensorRole::Tid2eid => plain(Dtype::I64),
            _ => plain(Dtype::F32),
        };
    };
    let (o, i) = (lt.shape[0], lt.shape[1]);
    let w = |dtype, shape| ExpectedTensor::new(format!("{n}.weight"), dtype, shape);
    let s = |suffix: &str, dtype, shape| ExpectedTensor::new(format!("{n}.{suffix}"), dtype, shape);
    match storage {
        LinearStorage::Bf16 => vec![w(Dtype::BF16, vec![o, i])],
        LinearStorage::Fp8Block { block: (bo, bi) } => vec![
            w(Dtype::F8E4M3, vec![o, i]),
            s("scale", Dtype::F8E8M0, vec![o.div_ceil(bo), i.div_ceil(bi)]),
        ],
        LinearStorage::Fp4Group => vec![
            w(Dtype::I8, vec![o, i / 2]),
            s("scale", Dtype::F8E8M0, vec![o, i.div_ceil(FP4_GROUP)]),
        ],
        LinearStorage::Nvfp4 => vec![
            w(Dtype::U8, vec![o, i / 2]),
            s(
                "weight_scale",
                Dtype::F8E4M3,
                vec![o, i.div_ceil(NVFP4_GROUP)],
            ),
            s("weight_scale_2", Dtype::F32, vec![]),
            s("input_scale", Dtype::F32, vec![]),
        ],
    }
}

/// Every stored tensor of a release described by `cfg` in `format`, in shard order.
pub fn expected_inventory(cfg: &ModelConfig, format: WeightFormat) -> Vec<ExpectedTensor> {
    expected_inventory_with(cfg, format.into())
}

/// [`expected_inventory`] with the options only a checkpoint can settle.
pub fn expected_inventory_with(cfg: &ModelConfig, opts: InventoryOptions) -> Vec<ExpectedTensor> {
    let rules = StorageRules::from(cfg);
    logical_inventory(cfg)
        .iter()
        .flat_map(|lt| expand(rules, opts, lt))
        .collect()
}
