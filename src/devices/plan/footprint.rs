//! Tensors, components and counting rules of the footprint (see the module doc of `plan`).

use serde::Serialize;
use std::collections::BTreeMap;

// ---------------------------------------------------------------------------------------------
// Tensors, components and counting rules
// ---------------------------------------------------------------------------------------------

/// One stored tensor as the footprint sees it.
#[derive(Clone, Debug)]
pub struct TensorSpec<'a> {
    pub name: &'a str,
    /// safetensors dtype name (`BF16`, `F32`, `F8_E4M3`, `F8_E8M0`, `I8`, `U8`, `I64`, ...).
    pub dtype: &'a str,
    /// Elements as stored (a packed FP4 byte is one element).
    pub numel: u64,
    /// Payload bytes.
    pub bytes: u64,
}

/// What a tensor belongs to, in the order of docs/spec/model.md section 8.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Component {
    RoutedExperts,
    AttentionCore,
    SharedExperts,
    Embed,
    Head,
    Compressors,
    Indexers,
    RouterGates,
    Mhc,
    RouterHashTables,
    Norms,
    HcHead,
    RouterBiases,
    Mtp,
    /// DeepSeek-V4.1 Engram: tables, their scales, projections and gate weights.
    Engram,
    /// DeepSeek-V4.1 vision tower (`vision.*`) and aligner (`aligner.*`).
    Vision,
    /// DeepSeek-V4.1 learned image delimiters (`image_start`, `image_end`, `image_newline`).
    ImageDelimiters,
    Other,
}

impl Component {
    /// Human label for tables.
    pub fn label(self) -> &'static str {
        match self {
            Component::RoutedExperts => "routed experts",
            Component::AttentionCore => "attention core",
            Component::SharedExperts => "shared experts",
            Component::Embed => "embed",
            Component::Head => "head",
            Component::Compressors => "KV compressors",
            Component::Indexers => "indexers",
            Component::RouterGates => "routers: gate weights",
            Component::Mhc => "mHC (hc_attn, hc_ffn)",
            Component::RouterHashTables => "routers: tid2eid (hash)",
            Component::Norms => "norms (attn, ffn, final)",
            Component::HcHead => "hc_head",
            Component::RouterBiases => "routers: biases",
            Component::Mtp => "MTP (not run)",
            Component::Engram => "Engram (tables, projections)",
            Component::Vision => "vision tower + aligner",
            Component::ImageDelimiters => "image delimiters",
            Component::Other => "other (unrecognised names)",
        }
    }
}

/// The component of a tensor, from its official name.
pub fn classify(name: &str) -> Component {
    if name.starts_with("mtp.") {
        return Component::Mtp;
    }
    match name {
        "embed.weight" => return Component::Embed,
        "head.weight" => return Component::Head,
        "norm.weight" => return Component::Norms,
        "image_start" | "image_end" | "image_newline" => return Component::ImageDelimiters,
        _ => {}
    }
    if name.starts_with("vision.") || name.starts_with("aligner.") {
        return Component::Vision;
    }
    if name.starts_with("hc_head_") {
        return Component::HcHead;
    }
    let Some((_, rest)) = split_layer(name) else {
        return Component::Other;
    };
    match rest {
        "attn_norm.weight" | "ffn_norm.weight" => Component::Norms,
        "ffn.gate.weight" => Component::RouterGates,
        "ffn.gate.tid2eid" => Component::RouterHashTables,
        "ffn.gate.bias" | "ffn.gate.bias_vl" => Component::RouterBiases,
        r if r.starts_with("engram.") => Component::Engram,
        r if r.starts_with("hc_attn_") || r.starts_with("hc_ffn_") => Component::Mhc,
        r if r.starts_with("attn.indexer.") => Component::Indexers,
        r if r.starts_with("attn.compressor.") => Component::Compressors,
        r if r.starts_with("attn.") => Component::AttentionCore,
        r if r.starts_with("ffn.experts.") => Component::RoutedExperts,
        r if r.starts_with("ffn.shared_experts.") => Component::SharedExperts,
        _ => Component::Other,
    }
}

/// `layers.{L}.rest` -> `(L, rest)`.
fn split_layer(name: &str) -> Option<(usize, &str)> {
    let rest = name.strip_prefix("layers.")?;
    let (idx, rest) = rest.split_once('.')?;
    Some((idx.parse().ok()?, rest))
}

/// Where a tensor lives in the memory plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// With the first device: the embedding and anything unrecognised.
    First,
    /// Main layer `L`.
    Layer(usize),
    /// With the last device: head, final norm, hc_head.
    Last,
    /// Not placed (MTP is never run; DeepSeek-V4.1's DSpark draft blocks are `mtp.*` too).
    Excluded,
    /// Not placed: DeepSeek-V4.1's vision tower (`vision.*`), aligner (`aligner.*`) and image
    /// delimiters (`image_start`, `image_end`, `image_newline`), never run for a text needle.
    Vision,
    /// On the host, memory-mapped and read by row, on no device: DeepSeek-V4.1's Engram tables
    /// (`layers.{L}.engram.embed.weight` and `.scale`; the layer's Engram projections go with
    /// the layer).
    Host,
}

/// Names of DeepSeek-V4.1's learned image delimiters (docs/spec/v41.md 4.1).
const IMAGE_DELIMITERS: [&str; 3] = ["image_start", "image_end", "image_newline"];

/// The plan slot of a tensor of a model with `layers` main layers.
pub fn slot(name: &str, layers: usize) -> Slot {
    if name.starts_with("mtp.") {
        return Slot::Excluded;
    }
    let root = name.split('.').next().unwrap_or(name);
    if name.starts_with("vision.")
        || name.starts_with("aligner.")
        || IMAGE_DELIMITERS.contains(&root)
    {
        return Slot::Vision;
    }
    if name == "head.weight" || name == "norm.weight" || name.starts_with("hc_head_") {
        return Slot::Last;
    }
    match split_layer(name) {
        Some((_, "engram.embed.weight" | "engram.embed.scale")) => Slot::Host,
        Some((l, _)) if l < layers => Slot::Layer(l),
        _ => Slot::First,
    }
}

/// Logical parameters of a tensor (see the module docs for the rules).
pub fn logical_params(name: &str, dtype: &str, numel: u64) -> u64 {
    let is_scale = [".scale", ".weight_scale", ".weight_scale_2", ".input_scale"]
        .iter()
        .any(|s| name.ends_with(s));
    if is_scale
        || name.ends_with("ffn.gate.tid2eid")
        || name.ends_with("ffn.gate.bias")
        || name.ends_with("ffn.gate.bias_vl")
    {
        return 0;
    }
    match dtype {
        "I8" | "U8" | "F4" => numel.saturating_mul(2),
        _ => numel,
    }
}

/// What a safetensors dtype holds in V4 checkpoints.
pub fn dtype_note(dtype: &str) -> &'static str {
    match dtype {
        "BF16" => "bf16",
        "F16" => "fp16",
        "F32" => "f32",
        "F8_E4M3" => "fp8 e4m3 (weights; NVFP4 group scales)",
        "F8_E8M0" => "e8m0 power-of-two scales",
        "I8" => "fp4 e2m1, two per byte (MXFP4 experts)",
        "U8" => "fp4 e2m1, two per byte (NVFP4 experts)",
        "I64" => "int64 (hash-router tables)",
        "I32" => "int32",
        _ => "",
    }
}

/// Tensor, parameter and byte counts of a group of tensors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Tally {
    pub tensors: u64,
    pub params: u64,
    pub bytes: u64,
}

impl Tally {
    /// Whether it counts nothing.
    pub fn is_zero(&self) -> bool {
        *self == Tally::default()
    }

    /// Saturating: a tally never wraps to a small, plausible figure.
    fn add(&mut self, params: u64, bytes: u64) {
        self.tensors = self.tensors.saturating_add(1);
        self.params = self.params.saturating_add(params);
        self.bytes = self.bytes.saturating_add(bytes);
    }
}

/// One row of the per-component table.
#[derive(Clone, Debug, Serialize)]
pub struct ComponentRow {
    pub component: Component,
    pub label: &'static str,
    #[serde(flatten)]
    pub tally: Tally,
}

/// One row of the per-format table.
#[derive(Clone, Debug, Serialize)]
pub struct FormatRow {
    pub dtype: String,
    pub note: &'static str,
    #[serde(flatten)]
    pub tally: Tally,
}

/// Counts of a checkpoint (or of the one a config implies), and the byte totals per plan slot.
#[derive(Clone, Debug, Serialize)]
pub struct Footprint {
    pub components: Vec<ComponentRow>,
    pub formats: Vec<FormatRow>,
    /// Main model: everything that is not left out of the plan (not MTP, not V4.1's vision
    /// tower), the host-resident tables included.
    pub main: Tally,
    pub mtp: Tally,
    /// DeepSeek-V4.1's vision tower, aligner and image delimiters ([`Slot::Vision`]); absent
    /// from the JSON when empty (V4).
    #[serde(skip_serializing_if = "Tally::is_zero")]
    pub vision: Tally,
    pub total: Tally,
    /// Weight bytes per main layer.
    pub layer_bytes: Vec<u64>,
    /// Weight bytes that go with the first device (embed and unrecognised names).
    pub first_bytes: u64,
    /// Weight bytes that go with the last device (head, final norm, hc_head).
    pub last_bytes: u64,
    /// Weight bytes that stay on the host, memory-mapped ([`Slot::Host`]: V4.1's Engram tables
    /// and their scales); part of `main`, on no device. Absent from the JSON when 0 (V4).
    #[serde(skip_serializing_if = "is_zero")]
    pub host_bytes: u64,
    /// Logical parameters of those host-resident tables (absent from the JSON when 0: V4).
    #[serde(skip_serializing_if = "is_zero")]
    pub host_params: u64,
}

/// Serde's test for the figures a V4 plan or footprint leaves out of its JSON.
pub(super) fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl Footprint {
    /// Tallies `tensors` of a model with `layers` main layers.
    pub fn from_tensors<'a>(
        layers: usize,
        tensors: impl IntoIterator<Item = TensorSpec<'a>>,
    ) -> Self {
        let mut comps: BTreeMap<Component, Tally> = BTreeMap::new();
        let mut formats: BTreeMap<String, Tally> = BTreeMap::new();
        let (mut main, mut mtp, mut total) = (Tally::default(), Tally::default(), Tally::default());
        let mut vision = Tally::default();
        let mut layer_bytes = vec![0u64; layers];
        let (mut first_bytes, mut last_bytes, mut host_bytes) = (0u64, 0u64, 0u64);
        let mut host_params = 0u64;
        for t in tensors {
            let params = logical_params(t.name, t.dtype, t.numel);
            comps
                .entry(classify(t.name))
                .or_default()
                .add(params, t.bytes);
            formats
                .entry(t.dtype.to_string())
                .or_default()
                .add(params, t.bytes);
            total.add(params, t.bytes);
            match slot(t.name, layers) {
                Slot::Excluded => mtp.add(params, t.bytes),
                Slot::Vision => vision.add(params, t.bytes),
                s => {
                    main.add(params, t.bytes);
                    match s {
                        Slot::First => first_bytes = first_bytes.saturating_add(t.bytes),
                        Slot::Layer(l) => layer_bytes[l] = layer_bytes[l].saturating_add(t.bytes),
                        Slot::Last => last_bytes = last_bytes.saturating_add(t.bytes),
                        Slot::Host => {
                            host_bytes = host_bytes.saturating_add(t.bytes);
                            host_params = host_params.saturating_add(params);
                        }
                        Slot::Excluded | Slot::Vision => unreachable!(),
                    }
                }
            }
        }
        let mut formats: Vec<FormatRow> = formats
            .into_iter()
            .map(|(dtype, tally)| FormatRow {
                note: dtype_note(&dtype),
                dtype,
                tally,
            })
            .collect();
        formats.sort_by(|a, b| {
            b.tally
                .bytes
                .cmp(&a.tally.bytes)
                .then(a.dtype.cmp(&b.dtype))
        });
        Footprint {
            components: comps
                .into_iter()
                .map(|(component, tally)| ComponentRow {
                    component,
                    label: component.label(),
                    tally,
                })
                .collect(),
            formats,
            main,
            mtp,
            vision,
            total,
            layer_bytes,
            first_bytes,
            last_bytes,
            host_bytes,
            host_params,
        }
    }

    /// Tallies the tensors `cfg` (of either family) implies in `format` (its expected
    /// inventory), as `inspect --config` sizes a model without its weights.
    pub fn of_inventory<C: crate::checkpoint::reader::CheckpointConfig>(
        cfg: &C,
        format: crate::checkpoint::WeightFormat,
    ) -> Self {
        let expected = cfg.expected_inventory(format.into());
        Footprint::from_tensors(
            cfg.main_layers(),
            expected.iter().map(|t| TensorSpec {
                name: &t.name,
                dtype: t.dtype.as_str(),
                numel: t.shape.iter().product::<usize>() as u64,
                bytes: t.bytes(),
            }),
        )
    }

    /// Tallies the tensors of an opened checkpoint as stored (a packed FP4 byte is one
    /// element; bytes are element count x dtype size, saturating at `u64::MAX`).
    pub fn of_checkpoint<C: crate::checkpoint::reader::CheckpointConfig>(
        ckpt: &crate::checkpoint::Checkpoint<C>,
    ) -> Self {
        let infos: Vec<_> = ckpt.names().filter_map(|n| ckpt.info(n)).collect();
        Footprint::from_tensors(
            ckpt.config().main_layers(),
            infos.iter().map(|t| {
                let numel = t
                    .shape
                    .iter()
                    .try_fold(1u64, |n, &d| n.checked_mul(d as u64))
                    .unwrap_or(u64::MAX);
                TensorSpec {
                    name: &t.name,
                    dtype: t.dtype.as_str(),
                    numel,
                    bytes: numel.saturating_mul(t.dtype.size() as u64),
                }
            }),
        )
    }

    /// Tally of one component (zero if absent).
    pub fn component(&self, c: Component) -> Tally {
        self.components
            .iter()
            .find(|r| r.component == c)
            .map(|r| r.tally)
            .unwrap_or_default()
    }
}

// ---------------------------------------------------------------------------------------------
// Per-layer state and workspace
// ---------------------------------------------------------------------------------------------
