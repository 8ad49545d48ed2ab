//! Footprint and memory plan: what a checkpoint weighs, per component and per number format, and
//! how its layers would be laid out over a set of GPUs for a given context length.
//!
//! Inputs are plain tensor descriptions ([`TensorSpec`]: name, safetensors dtype, element count,
//! bytes), so the same code serves `inspect --config` (the expected inventory) and
//! `inspect --model` (the tensors actually on disk).
//!
//! Counting rules (spec/model.md section 8):
//! - bytes are payload bytes of the stored tensors, scales included;
//! - parameters are logical weights: packed FP4 (`I8`, `U8`) counts two per byte; scale tensors
//!   (`*.scale`, `*.weight_scale`, `*.weight_scale_2`, `*.input_scale`), hash-router tables
//!   (`ffn.gate.tid2eid`) and router selection biases (`ffn.gate.bias`) count zero.
//!
//! Memory plan ([`plan`]): contiguous layer ranges per device, in device order. The embedding
//! goes with the first device; the head, final norm and `hc_head_*` with the last; MTP tensors are
//! excluded (needlescope never runs the MTP layer). Each device holds, for its layers:
//! - **weights** in their stored formats (the layer's tensor bytes);
//! - **state** for the planned context `C` (see [`layer_state`]):
//!   - sliding-window ring, every layer: `sliding_window x head_dim` bf16 (V4 has one KV head);
//!   - compressed KV rows, CSA and HCA layers: `floor(C / ratio) x head_dim` bf16, 1024 B per row
//!     on Flash. We plan for bf16 rows, the larger of the two layouts the engine may keep (an
//!     fp8 `--kv fp8` cache row is 584 B: 448 e4m3 + 64 bf16 RoPE dims + 8 B of scales);
//!   - index keys, CSA layers: `floor(C / 4) x index_head_dim` f32, the raw keys every index
//!     profile is derived from at scoring time (and that the observer reads);
//!   - compressor carry (the unfinished pooling group, kv and gate projections in f32):
//!     `c * ratio` tokens of `2 * c * head_dim` values, c = 2 on CSA (overlapping), 1 on HCA, plus
//!     the CSA indexer's own compressor (`8` tokens of `2 * 2 * index_head_dim`);
//! - **workspace** ([`workspace_bytes`]): a fixed 1 GiB (CUDA context, cuBLAS workspace, kernel
//!   modules, allocator slack) plus the f32 activations of one prefill chunk of `T` tokens,
//!   `4 B x T x (3 * hc_mult * hidden + 2 * heads * head_dim + heads * (window + index_topk +
//!   C / 128) + C / 4 + 3 * experts_per_tok * moe_intermediate)`: residual streams in, out and
//!   mixed; queries and attention output; one query's attention probabilities over window,
//!   selected CSA rows and all HCA rows; one query's indexer scores after the head reduction;
//!   the routed experts' SwiGLU intermediates. The last device adds the logits of up to
//!   [`PROBED_LOGIT_ROWS`] probed positions (`4 B x vocab` each).
//!
//! Placement: devices are filled in order towards a share of the total proportional to their
//! capacity (a layer goes to the device whose cumulative target its midpoint falls under). If
//! that balanced split leaves a device over capacity, the layers are packed first-fit in order;
//! if that also fails the plan is refused, reporting each device's shortfall (from the balanced
//! split) and the overall shortfall.

use serde::Serialize;
use std::collections::BTreeMap;

use crate::config::{LayerKind, ModelConfig};

/// Fixed per-device allowance: CUDA context, cuBLAS workspace, kernels, allocator slack.
pub const FIXED_WORKSPACE: u64 = 1 << 30;
/// Default prefill chunk (tokens) when none is given.
pub const DEFAULT_CHUNK: usize = 2048;
/// Positions whose logits the last device keeps (probed prompt positions plus generated ones).
pub const PROBED_LOGIT_ROWS: u64 = 256;

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

/// What a tensor belongs to, in the order of spec/model.md section 8.
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
        _ => {}
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
        "ffn.gate.bias" => Component::RouterBiases,
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
    /// Not placed (MTP is never run).
    Excluded,
}

/// The plan slot of a tensor of a model with `layers` main layers.
pub fn slot(name: &str, layers: usize) -> Slot {
    if name.starts_with("mtp.") {
        return Slot::Excluded;
    }
    if name == "head.weight" || name == "norm.weight" || name.starts_with("hc_head_") {
        return Slot::Last;
    }
    match split_layer(name) {
        Some((l, _)) if l < layers => Slot::Layer(l),
        _ => Slot::First,
    }
}

/// Logical parameters of a tensor (see the module docs for the rules).
pub fn logical_params(name: &str, dtype: &str, numel: u64) -> u64 {
    let is_scale = [".scale", ".weight_scale", ".weight_scale_2", ".input_scale"]
        .iter()
        .any(|s| name.ends_with(s));
    if is_scale || name.ends_with("ffn.gate.tid2eid") || name.ends_with("ffn.gate.bias") {
        return 0;
    }
    match dtype {
        "I8" | "U8" | "F4" => numel * 2,
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
    fn add(&mut self, params: u64, bytes: u64) {
        self.tensors += 1;
        self.params += params;
        self.bytes += bytes;
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
    /// Main model (everything except MTP).
    pub main: Tally,
    pub mtp: Tally,
    pub total: Tally,
    /// Weight bytes per main layer.
    pub layer_bytes: Vec<u64>,
    /// Weight bytes that go with the first device (embed and unrecognised names).
    pub first_bytes: u64,
    /// Weight bytes that go with the last device (head, final norm, hc_head).
    pub last_bytes: u64,
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
        let mut layer_bytes = vec![0u64; layers];
        let (mut first_bytes, mut last_bytes) = (0u64, 0u64);
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
                s => {
                    main.add(params, t.bytes);
                    match s {
                        Slot::First => first_bytes += t.bytes,
                        Slot::Layer(l) => layer_bytes[l] += t.bytes,
                        Slot::Last => last_bytes += t.bytes,
                        Slot::Excluded => unreachable!(),
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
            total,
            layer_bytes,
            first_bytes,
            last_bytes,
        }
    }

    /// Tallies the tensors of an opened checkpoint as stored (a packed FP4 byte is one
    /// element; bytes are element count x dtype size).
    pub fn of_checkpoint(ckpt: &crate::checkpoint::Checkpoint) -> Self {
        let infos: Vec<_> = ckpt.names().filter_map(|n| ckpt.info(n)).collect();
        Footprint::from_tensors(
            ckpt.config().num_hidden_layers,
            infos.iter().map(|t| {
                let numel = t.shape.iter().product::<usize>() as u64;
                TensorSpec {
                    name: &t.name,
                    dtype: t.dtype.as_str(),
                    numel,
                    bytes: numel * t.dtype.size() as u64,
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

/// Per-layer state bytes for a context (see the module docs for the layouts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LayerState {
    pub window: u64,
    pub compressed_kv: u64,
    pub index_keys: u64,
    pub compressor_carry: u64,
}

impl LayerState {
    pub fn total(&self) -> u64 {
        self.window + self.compressed_kv + self.index_keys + self.compressor_carry
    }
}

/// State of main layer `layer` after `context` tokens.
pub fn layer_state(cfg: &ModelConfig, layer: usize, context: usize) -> LayerState {
    let (c, hd) = (context as u64, cfg.head_dim as u64);
    let window = cfg.sliding_window as u64 * hd * 2;
    match cfg.layer_kind(layer) {
        LayerKind::Swa => LayerState {
            window,
            ..Default::default()
        },
        LayerKind::Csa => {
            let rows = c / 4;
            let ihd = cfg.index_head_dim as u64;
            LayerState {
                window,
                compressed_kv: rows * hd * 2,
                index_keys: rows * ihd * 4,
                compressor_carry: (8 * 2 * 2 * hd + 8 * 2 * 2 * ihd) * 4,
            }
        }
        LayerKind::Hca => LayerState {
            window,
            compressed_kv: (c / 128) * hd * 2,
            index_keys: 0,
            compressor_carry: 128 * 2 * hd * 4,
        },
    }
}

/// Workspace of one device for a prefill chunk of `chunk` tokens at context `context`; `last`
/// adds the probed positions' logits.
pub fn workspace_bytes(cfg: &ModelConfig, context: usize, chunk: usize, last: bool) -> u64 {
    let t = chunk.min(context).max(1) as u64;
    let c = context as u64;
    let per_token = 3 * cfg.hc_mult as u64 * cfg.hidden_size as u64
        + 2 * cfg.num_attention_heads as u64 * cfg.head_dim as u64
        + cfg.num_attention_heads as u64
            * (cfg.sliding_window as u64 + cfg.index_topk as u64 + c / 128)
        + c / 4
        + 3 * cfg.num_experts_per_tok as u64 * cfg.moe_intermediate_size as u64;
    let logits = if last {
        PROBED_LOGIT_ROWS * cfg.vocab_size as u64 * 4
    } else {
        0
    };
    FIXED_WORKSPACE + 4 * t * per_token + logits
}

// ---------------------------------------------------------------------------------------------
// Devices
// ---------------------------------------------------------------------------------------------

/// `--devices`: groups `COUNTxSIZE` separated by commas (`8x96G`, `2x80GiB,1x40G`); a bare
/// `SIZE` means one device. `G`/`GiB` = 2^30 bytes (what GPU vendors' "80GB" cards hold),
/// `GB` = 10^9; likewise `M`/`MiB`/`MB` and `T`/`TiB`/`TB`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSet {
    pub capacities: Vec<u64>,
    pub spec: String,
}

pub const DEVICE_FORM: &str = "expected COUNTxSIZE such as 8x96G or 2x80GiB (G = GiB = 2^30 bytes, GB = 10^9; groups may be joined with commas: 2x80G,1x40G)";

impl std::str::FromStr for DeviceSet {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mut capacities = Vec::new();
        for group in s.split(',') {
            let g = group.trim();
            let (count, size) = match g.split_once(['x', 'X']) {
                Some((n, size)) => {
                    let n: usize = n
                        .trim()
                        .parse()
                        .map_err(|_| format!("{DEVICE_FORM}; {n:?} is not a device count"))?;
                    (n, size)
                }
                None => (1, g),
            };
            if count == 0 || count > 4096 {
                return Err(format!("{DEVICE_FORM}; the device count must be 1..=4096"));
            }
            let bytes = parse_bytes(size)?;
            capacities.extend(std::iter::repeat_n(bytes, count));
        }
        if capacities.len() > 4096 {
            return Err(format!("{DEVICE_FORM}; at most 4096 devices"));
        }
        Ok(DeviceSet {
            capacities,
            spec: s.trim().to_string(),
        })
    }
}

/// `96G`, `80GiB`, `94GB`, `1.5T`, `512M` -> bytes.
fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err(format!("{DEVICE_FORM}; the size after the `x` is missing"));
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("{DEVICE_FORM}; {t:?} has no unit"))?;
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{DEVICE_FORM}; {t:?} is not a memory size"))?;
    let mult: f64 = match unit.trim() {
        "M" | "MiB" | "m" => (1u64 << 20) as f64,
        "G" | "GiB" | "g" => (1u64 << 30) as f64,
        "T" | "TiB" | "t" => (1u64 << 40) as f64,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        u => return Err(format!("{DEVICE_FORM}; unknown unit {u:?}")),
    };
    let bytes = v * mult;
    if !(1.0..1e18).contains(&bytes) {
        return Err(format!("{DEVICE_FORM}; {t:?} is not a usable memory size"));
    }
    Ok(bytes as u64)
}

// ---------------------------------------------------------------------------------------------
// Placement
// ---------------------------------------------------------------------------------------------

/// One device of a plan.
#[derive(Clone, Debug, Serialize)]
pub struct DevicePlan {
    pub device: usize,
    /// First and last main layer held (inclusive), if any.
    pub layers: Option<[usize; 2]>,
    pub holds_embed: bool,
    pub holds_head: bool,
    pub weights: u64,
    pub state: u64,
    pub workspace: u64,
    pub total: u64,
    pub capacity: u64,
    /// capacity - total (negative when over).
    pub free: i64,
    /// max(0, total - capacity).
    pub shortfall: u64,
}

/// The layout of a model over devices for one context length.
#[derive(Clone, Debug, Serialize)]
pub struct MemoryPlan {
    pub devices_spec: String,
    pub context: usize,
    pub chunk: usize,
    pub fits: bool,
    /// `balanced`, `packed in order` or `refused`.
    pub strategy: &'static str,
    pub devices: Vec<DevicePlan>,
    pub weights: u64,
    pub state: u64,
    pub workspace: u64,
    pub total: u64,
    pub capacity: u64,
    /// Sum of the per-device shortfalls of the reported layout (0 when it fits).
    pub shortfall: u64,
    /// MTP bytes left out of the plan.
    pub excluded_mtp_bytes: u64,
    pub assumptions: Vec<String>,
}

/// Lays `footprint` out over `devices` for `context` tokens, prefilling in chunks of `chunk`.
pub fn plan(
    cfg: &ModelConfig,
    footprint: &Footprint,
    devices: &DeviceSet,
    context: usize,
    chunk: usize,
) -> MemoryPlan {
    let n_dev = devices.capacities.len().max(1);
    let caps: Vec<u64> = (0..n_dev)
        .map(|d| devices.capacities.get(d).copied().unwrap_or(0))
        .collect();
    let layers = footprint.layer_bytes.len();
    let states: Vec<u64> = (0..layers)
        .map(|l| layer_state(cfg, l, context).total())
        .collect();
    let items: Vec<u64> = (0..layers)
        .map(|l| footprint.layer_bytes[l] + states[l])
        .collect();
    let fixed: Vec<u64> = (0..n_dev)
        .map(|d| {
            workspace_bytes(cfg, context, chunk, d == n_dev - 1)
                + if d == 0 { footprint.first_bytes } else { 0 }
                + if d == n_dev - 1 {
                    footprint.last_bytes
                } else {
                    0
                }
        })
        .collect();

    let balanced = place_balanced(&items, &fixed, &caps);
    let fits = |a: &[usize]| {
        loads(&items, &fixed, a, n_dev)
            .iter()
            .zip(&caps)
            .all(|(l, c)| l <= c)
    };
    let (assign, strategy, ok) = if fits(&balanced) {
        (balanced, "balanced", true)
    } else {
        let packed = place_first_fit(&items, &fixed, &caps);
        if fits(&packed) {
            (packed, "packed in order", true)
        } else {
            (balanced, "refused", false)
        }
    };

    let mut out = Vec::with_capacity(n_dev);
    for (d, &cap) in caps.iter().enumerate() {
        let mine: Vec<usize> = (0..layers).filter(|&l| assign[l] == d).collect();
        let weights = mine.iter().map(|&l| footprint.layer_bytes[l]).sum::<u64>()
            + if d == 0 { footprint.first_bytes } else { 0 }
            + if d == n_dev - 1 {
                footprint.last_bytes
            } else {
                0
            };
        let state: u64 = mine.iter().map(|&l| states[l]).sum();
        let workspace = workspace_bytes(cfg, context, chunk, d == n_dev - 1);
        let total = weights + state + workspace;
        out.push(DevicePlan {
            device: d,
            layers: mine.first().map(|&f| [f, *mine.last().unwrap()]),
            holds_embed: d == 0,
            holds_head: d == n_dev - 1,
            weights,
            state,
            workspace,
            total,
            capacity: cap,
            free: cap as i64 - total as i64,
            shortfall: total.saturating_sub(cap),
        });
    }
    let sum = |f: fn(&DevicePlan) -> u64| out.iter().map(f).sum::<u64>();
    MemoryPlan {
        devices_spec: devices.spec.clone(),
        context,
        chunk: chunk.min(context).max(1),
        fits: ok,
        strategy,
        weights: sum(|d| d.weights),
        state: sum(|d| d.state),
        workspace: sum(|d| d.workspace),
        total: sum(|d| d.total),
        capacity: sum(|d| d.capacity),
        shortfall: if ok { 0 } else { sum(|d| d.shortfall) },
        excluded_mtp_bytes: footprint.mtp.bytes,
        assumptions: assumptions(cfg, context, chunk),
        devices: out,
    }
}

/// Per-device load (fixed + assigned items) of an assignment.
fn loads(items: &[u64], fixed: &[u64], assign: &[usize], n_dev: usize) -> Vec<u64> {
    let mut l = fixed.to_vec();
    l.resize(n_dev, 0);
    for (i, &d) in assign.iter().enumerate() {
        l[d] += items[i];
    }
    l
}

/// Contiguous split towards capacity-proportional cumulative targets.
fn place_balanced(items: &[u64], fixed: &[u64], caps: &[u64]) -> Vec<usize> {
    let n_dev = caps.len();
    let cap_total: f64 = caps.iter().map(|&c| c as f64).sum::<f64>().max(1.0);
    let need_total: f64 = (items.iter().sum::<u64>() + fixed.iter().sum::<u64>()) as f64;
    let mut target = Vec::with_capacity(n_dev);
    let mut acc = 0.0;
    for &c in caps {
        acc += c as f64;
        target.push(need_total * acc / cap_total);
    }
    let mut assign = Vec::with_capacity(items.len());
    let mut d = 0;
    // cumulative load of devices 0..=d, counting each device's fixed part when it is opened.
    let mut cum = fixed[0] as f64;
    for &it in items {
        while d + 1 < n_dev && cum + it as f64 / 2.0 > target[d] {
            d += 1;
            cum += fixed[d] as f64;
        }
        assign.push(d);
        cum += it as f64;
    }
    assign
}

/// Contiguous first-fit: each device takes layers until the next one would overflow it.
fn place_first_fit(items: &[u64], fixed: &[u64], caps: &[u64]) -> Vec<usize> {
    let n_dev = caps.len();
    let mut assign = Vec::with_capacity(items.len());
    let mut d = 0;
    let mut load = fixed[0];
    for &it in items {
        while d + 1 < n_dev && load + it > caps[d] {
            d += 1;
            load = fixed[d];
        }
        assign.push(d);
        load += it;
    }
    assign
}

/// The plan's assumptions in words, for the report.
fn assumptions(cfg: &ModelConfig, context: usize, chunk: usize) -> Vec<String> {
    let t = chunk.min(context).max(1);
    vec![
        format!(
            "weights in their stored formats; embed on the first device, head + final norm + hc_head on the last; MTP not placed (never run)"
        ),
        format!(
            "window ring per layer: {} tokens x {} dims bf16",
            cfg.sliding_window, cfg.head_dim
        ),
        format!(
            "compressed KV rows: context/ratio rows x {} dims bf16 ({} B/row; fp8 rows would be 584 B)",
            cfg.head_dim,
            cfg.head_dim * 2
        ),
        format!(
            "index keys on CSA layers: context/4 rows x {} dims f32 (raw keys; profiles applied at scoring)",
            cfg.index_head_dim
        ),
        "compressor carry: the unfinished pooling group's kv and gate projections in f32".into(),
        format!(
            "workspace per device: 1 GiB fixed + f32 activations of a {t}-token prefill chunk (residual streams, q and output, one query's attention probabilities and indexer scores, expert intermediates); last device + logits of {PROBED_LOGIT_ROWS} probed positions"
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_components_and_slots() {
        assert_eq!(
            classify("layers.4.attn.indexer.wq_b.scale"),
            Component::Indexers
        );
        assert_eq!(
            classify("layers.4.attn.compressor.ape"),
            Component::Compressors
        );
        assert_eq!(
            classify("layers.4.attn.wq_a.weight"),
            Component::AttentionCore
        );
        assert_eq!(
            classify("layers.4.attn.attn_sink"),
            Component::AttentionCore
        );
        assert_eq!(
            classify("layers.0.ffn.experts.7.w2.scale"),
            Component::RoutedExperts
        );
        assert_eq!(
            classify("layers.0.ffn.gate.tid2eid"),
            Component::RouterHashTables
        );
        assert_eq!(classify("layers.9.hc_ffn_base"), Component::Mhc);
        assert_eq!(classify("layers.9.ffn_norm.weight"), Component::Norms);
        assert_eq!(classify("hc_head_fn"), Component::HcHead);
        assert_eq!(classify("mtp.0.e_proj.weight"), Component::Mtp);
        assert_eq!(classify("model.layers.0.x"), Component::Other);
        assert_eq!(slot("head.weight", 43), Slot::Last);
        assert_eq!(slot("embed.weight", 43), Slot::First);
        assert_eq!(slot("layers.42.attn_norm.weight", 43), Slot::Layer(42));
        assert_eq!(slot("layers.43.attn_norm.weight", 43), Slot::First);
        assert_eq!(slot("mtp.0.norm.weight", 43), Slot::Excluded);
    }

    #[test]
    fn scales_tables_and_biases_are_not_parameters() {
        assert_eq!(
            logical_params("layers.3.ffn.experts.0.w1.weight", "I8", 10),
            20
        );
        assert_eq!(
            logical_params("layers.3.ffn.experts.0.w1.scale", "F8_E8M0", 10),
            0
        );
        assert_eq!(
            logical_params("layers.3.ffn.experts.0.w1.weight_scale_2", "F32", 1),
            0
        );
        assert_eq!(logical_params("layers.3.ffn.gate.bias", "F32", 256), 0);
        assert_eq!(logical_params("layers.0.ffn.gate.tid2eid", "I64", 60), 0);
        assert_eq!(logical_params("hc_head_scale", "F32", 1), 1);
        assert_eq!(logical_params("layers.3.hc_attn_scale", "F32", 3), 3);
    }

    #[test]
    fn device_specs_parse_counts_and_units() {
        let d: DeviceSet = "8x96G".parse().unwrap();
        assert_eq!(d.capacities, vec![96 << 30; 8]);
        let d: DeviceSet = "2x80GiB,1x40GB".parse().unwrap();
        assert_eq!(d.capacities, vec![80 << 30, 80 << 30, 40_000_000_000]);
        let d: DeviceSet = "141G".parse().unwrap();
        assert_eq!(d.capacities.len(), 1);
        for bad in ["8x", "x96G", "0x96G", "8x96", "8x96Q", "eightx96G", ""] {
            let e = bad.parse::<DeviceSet>().unwrap_err();
            assert!(e.contains("8x96G"), "{bad}: {e}");
        }
    }

    fn fake_footprint(layers: usize, per_layer: u64, first: u64, last: u64) -> Footprint {
        let mut f = Footprint::from_tensors(layers, std::iter::empty());
        f.layer_bytes = vec![per_layer; layers];
        f.first_bytes = first;
        f.last_bytes = last;
        f
    }

    #[test]
    fn balanced_plan_uses_contiguous_ranges_in_order() {
        let cfg = ModelConfig::flash();
        let fp = fake_footprint(43, 3 << 30, 1 << 30, 1 << 30);
        let devs: DeviceSet = "4x80G".parse().unwrap();
        let p = plan(&cfg, &fp, &devs, 4096, 2048);
        assert!(p.fits, "{p:#?}");
        assert_eq!(p.strategy, "balanced");
        let mut next = 0;
        for d in &p.devices {
            let [a, b] = d.layers.unwrap();
            assert_eq!(a, next);
            next = b + 1;
            assert!(d.total <= d.capacity);
        }
        assert_eq!(next, 43);
        let counts: Vec<usize> = p
            .devices
            .iter()
            .map(|d| d.layers.unwrap()[1] + 1 - d.layers.unwrap()[0])
            .collect();
        assert!(counts.iter().all(|&c| (10..=12).contains(&c)), "{counts:?}");
    }

    #[test]
    fn uneven_devices_get_proportional_shares() {
        let cfg = ModelConfig::flash();
        let fp = fake_footprint(10, 10 << 30, 0, 0);
        // 100 GiB of layers over 60 + 60 GiB: balanced gives 5 + 5 layers = 50 GiB each (fits).
        let devs: DeviceSet = "2x60G".parse().unwrap();
        let p = plan(&cfg, &fp, &devs, 4096, 2048);
        assert!(p.fits);
        // 1x200G + 1x15G: proportional targets put ~1 layer on the small device; fits either way.
        let devs: DeviceSet = "1x15G,1x200G".parse().unwrap();
        let p = plan(&cfg, &fp, &devs, 4096, 2048);
        assert!(p.fits, "{p:#?}");
        assert!(p.devices[0].total <= p.devices[0].capacity);
    }

    #[test]
    fn first_fit_packs_in_order_and_overflows_onto_the_last_device() {
        assert_eq!(
            place_first_fit(&[4, 4, 4, 4], &[1, 1], &[10, 10]),
            vec![0, 0, 1, 1]
        );
        assert_eq!(
            place_first_fit(&[8, 8, 8], &[0, 0], &[10, 10]),
            vec![0, 1, 1]
        );
        assert_eq!(
            place_balanced(&[4, 4, 4, 4], &[0, 0], &[10, 30]),
            vec![0, 1, 1, 1]
        );
    }

    #[test]
    fn refusal_reports_the_shortfall() {
        let cfg = ModelConfig::flash();
        let fp = fake_footprint(10, 10 << 30, 0, 0);
        let devs: DeviceSet = "1x50G".parse().unwrap();
        let p = plan(&cfg, &fp, &devs, 4096, 2048);
        assert!(!p.fits);
        assert_eq!(p.strategy, "refused");
        assert_eq!(p.devices[0].shortfall, p.devices[0].total - (50 << 30));
        assert_eq!(p.shortfall, p.devices[0].shortfall);
        assert!(p.devices[0].free < 0);
    }

    #[test]
    fn state_follows_the_layer_kind() {
        let cfg = ModelConfig::flash();
        let swa = layer_state(&cfg, 0, 131072);
        let csa = layer_state(&cfg, 2, 131072);
        let hca = layer_state(&cfg, 3, 131072);
        assert_eq!(swa.window, 128 * 512 * 2);
        assert_eq!(swa.compressed_kv + swa.index_keys, 0);
        assert_eq!(csa.compressed_kv, 32768 * 1024);
        assert_eq!(csa.index_keys, 32768 * 128 * 4);
        assert_eq!(hca.compressed_kv, 1024 * 1024);
        assert_eq!(hca.index_keys, 0);
    }

    fn flash_footprint() -> Footprint {
        let cfg = ModelConfig::flash();
        let inv =
            crate::checkpoint::expected_inventory(&cfg, crate::checkpoint::WeightFormat::Official);
        Footprint::from_tensors(
            cfg.num_hidden_layers,
            inv.iter().map(|t| TensorSpec {
                name: &t.name,
                dtype: t.dtype.as_str(),
                numel: t.shape.iter().product::<usize>() as u64,
                bytes: t.bytes(),
            }),
        )
    }

    #[test]
    fn flash_official_footprint_matches_the_published_totals() {
        let f = flash_footprint();
        assert_eq!(f.total.bytes, 159_609_485_896);
        assert_eq!(f.total.tensors, 69_187);
        assert_eq!(f.main.bytes, 156_015_698_140);
        assert_eq!(f.main.params, 284_332_230_231);
        assert_eq!(f.mtp.bytes, 3_593_787_756);
        assert_eq!(f.mtp.params, 6_610_048_635);
        // spec/model.md section 8, one row per component: (params, bytes, tensors).
        let rows = [
            (
                Component::RoutedExperts,
                277_025_390_592,
                147_169_738_752,
                66_048,
            ),
            (Component::AttentionCore, 4_599_123_136, 4_599_478_144, 559),
            (Component::SharedExperts, 1_082_130_432, 1_082_196_480, 258),
            (Component::Embed, 529_530_880, 1_059_061_760, 1),
            (Component::Head, 529_530_880, 1_059_061_760, 1),
            (Component::Compressors, 261_464_576, 525_722_624, 164),
            (Component::Indexers, 225_730_176, 275_353_344, 147),
            (Component::RouterGates, 45_088_768, 90_177_536, 43),
            (Component::Mhc, 33_818_898, 135_275_592, 258),
            (Component::RouterHashTables, 0, 18_616_320, 3),
            (Component::Norms, 356_352, 712_704, 87),
            (Component::HcHead, 65_541, 262_164, 3),
            (Component::RouterBiases, 0, 40_960, 40),
        ];
        for (c, params, bytes, tensors) in rows {
            let t = f.component(c);
            assert_eq!(
                (t.params, t.bytes, t.tensors),
                (params, bytes, tensors),
                "{c:?}"
            );
        }
        assert_eq!(f.component(Component::Other), Tally::default());
        let placed: u64 = f.layer_bytes.iter().sum::<u64>() + f.first_bytes + f.last_bytes;
        assert_eq!(placed, f.main.bytes);
    }

    #[test]
    fn flash_fits_8x96g_at_128k_and_not_1x96g() {
        let cfg = ModelConfig::flash();
        let f = flash_footprint();
        let p = plan(&cfg, &f, &"8x96G".parse().unwrap(), 131072, DEFAULT_CHUNK);
        assert!(p.fits, "{p:#?}");
        assert_eq!(p.devices[0].layers.unwrap()[0], 0);
        assert_eq!(p.devices[7].layers.unwrap()[1], 42);
        assert_eq!(p.weights, f.main.bytes);
        let p = plan(&cfg, &f, &"1x96G".parse().unwrap(), 131072, DEFAULT_CHUNK);
        assert!(!p.fits);
        assert!(
            (50_000_000_000..70_000_000_000).contains(&p.shortfall),
            "shortfall {} is not roughly 60 GB",
            p.shortfall
        );
    }
}
