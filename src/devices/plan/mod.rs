//! Footprint and memory plan: what a checkpoint weighs, per component and per number format, and
//! how its layers would be laid out over a set of GPUs for a given context length.
//!
//! Inputs are plain tensor descriptions ([`TensorSpec`]: name, safetensors dtype, element count,
//! bytes), so the same code serves `inspect --config` (the expected inventory) and
//! `inspect --model` (the tensors actually on disk).
//!
//! Counting rules (docs/spec/model.md section 8):
//! - bytes are payload bytes of the stored tensors, scales included;
//! - parameters are logical weights: packed FP4 (`I8`, `U8`) counts two per byte; scale tensors
//!   (`*.scale`, `*.weight_scale`, `*.weight_scale_2`, `*.input_scale`), hash-router tables
//!   (`ffn.gate.tid2eid`) and router selection biases (`ffn.gate.bias`) count zero.
//!
//! Memory plan ([`plan`]): contiguous layer ranges per device, in device order. The embedding
//! goes with the first device; the head, final norm and `hc_head_*` with the last; MTP tensors are
//! excluded (needlescope never runs the MTP layer). Each device holds, for its layers:
//! - **weights** in their stored formats (the layer's tensor bytes);
//! - **state** for the planned context `C` and prefill chunk `T` (see [`layer_state`]), as the
//!   engine's GPU backend keeps it: f32 rows in device caches that double their allocation
//!   when full, so each cache is counted at [`CACHE_GROWTH_SLACK`] (2) x its rows:
//!   - window rows, every layer: `(sliding_window + T) x head_dim` (V4 has one KV head; the
//!     chunk's own rows join the window while the layer runs);
//!   - compressed KV rows, CSA and HCA layers: `floor(C / ratio) x head_dim`, 2048 B per row on
//!     Flash (`--kv fp8` rounds the values in place, it does not shrink the rows);
//!   - index keys, CSA layers: `floor(C / 4) x (2 * index_head_dim + 1)`: the raw keys (read
//!     to the host only when an observer asks), the keys prepared under the run's profile and
//!     their score multipliers;
//!   - compressor carry (the unfinished pooling group, kv and gate projections in f32):
//!     `c * ratio` tokens of `2 * c * head_dim` values, c = 2 on CSA (overlapping), 1 on HCA, plus
//!     the CSA indexer's own compressor (`8` tokens of `2 * 2 * index_head_dim`), kept on the
//!     device with the other caches;
//! - **workspace** ([`workspace_bytes`]): a fixed 1 GiB (CUDA context, cuBLAS workspace, kernel
//!   modules, allocator granularity) plus the most bytes one prefill chunk of `T` tokens holds at
//!   once ([`activation_peak_bytes`]): the largest of the phases of a layer whose buffers are
//!   never live together on the GPU backend (mHC mixing; attention's indexer, sparse attention
//!   and output projections; MoE), each phase the sum of what it holds (the residual streams
//!   and block input in all of them; queries, the `[T, heads, entries]` probabilities and the
//!   gathered rows in the sparse attention; the routed experts' rows of all k slots, times 3/2
//!   for the batched layout's padding, in MoE; ...), plus the largest buffer of capped size (a
//!   product's decoded weight band, a GEMM-attention tile, an indexer score tile; one at a
//!   time), the sum plus an eighth for the buffer pool's size classes. (Summing the phases
//!   instead charged a workspace of 4.44 GiB where this charges 2.91 GiB: Flash, 128k, chunk
//!   2048, first of two devices.) The
//!   phases and their bounds are checked against the peaks measured on the host emulator
//!   (`tests/backend/emu_memory.rs`). The last device adds the logits of up to
//!   [`PROBED_LOGIT_ROWS`] probed positions (`4 B x vocab` each). Every device adds the largest
//!   single cache allocation ([`largest_cache_bytes`]): the moment a cache grows or drops its
//!   front, two of its allocations coexist.
//!
//! Every byte figure is computed with saturating arithmetic ([`sat_sum`], [`sat_product`]): a
//! figure too large for `u64` shows as `u64::MAX` and never fits, instead of wrapping to a small
//! number that would (`ModelConfig::validate` bounds the size fields so real inputs stay far
//! below that).
//!
//! Placement: devices are filled in order towards a share of the total proportional to their
//! capacity (a layer goes to the device whose cumulative target its midpoint falls under). If
//! that balanced split leaves a device over capacity, the layers are packed first-fit in order;
//! if that also fails the plan is refused, reporting each device's shortfall (from the balanced
//! split) and the overall shortfall. These two splits use every device given; [`search`]
//! (`search.rs`) is exact: it finds a layout over an order-preserving subset of the devices
//! whenever one fits, and [`crate::devices::placement`] falls back on it ([`plan_assigned`] is its plan).
//!
//! Either family: every function takes its model through [`AsPlanModel`] (a V4 `ModelConfig`, a
//! `V41Config`, a `ModelDescription`), which gives the [`PlanModel`] the rules read: the
//! layer-role table, the dimensions, and what only V4.1 has. The V4 figures are the ones above,
//! unchanged; the V4.1 fields of [`MemoryPlan`] and [`Footprint`] are left out of their JSON.
//!
//! DeepSeek-V4.1 (docs/spec/v41.md sections 3, 5 and 7; entry point
//! [`crate::devices::placement::plan_over`]):
//! - **where the weights go**: the backbone as above (embed first, head and final norm last;
//!   no `hc_head`); each Engram layer's projections (`engram.wkv`, `q_weight`, `k_weight`)
//!   with the layer; the Engram tables (`layers.{L}.engram.embed.weight` and `.scale`,
//!   [`Slot::Host`]) on no device: they stay on the host, memory-mapped and read by row (a
//!   token reads `(engram_max_ngram_size - 1) x engram_n_heads` = 24 rows of `head_dim` e4m3
//!   values + `head_dim / 32` e8m0 scales = 264 B from each table), counted in
//!   [`MemoryPlan::host_bytes`] and [`MemoryPlan::host_read_bytes_per_token`]; the DSpark draft
//!   blocks (`mtp.*`) and the vision tower, aligner and image delimiters ([`Slot::Vision`]) are
//!   not placed (a text needle never runs them), their bytes in
//!   [`MemoryPlan::excluded_mtp_bytes`] and [`MemoryPlan::excluded_vision_bytes`];
//! - **state**, same conventions (f32 rows, [`CACHE_GROWTH_SLACK`]): the window on every layer;
//!   compressed KV `floor(C / ratio) x head_dim` and index keys
//!   `floor(C / ratio) x (2 * index_head_dim + 1)` on the KV sources only (the release's 2, 8,
//!   14 at ratio 2 and 20 at ratio 1; the index keys are the source's, derived from its
//!   compressed latent); the carry of a ratio-2 source's unfinished pair (kv and gate
//!   projections, `2 x 2 x head_dim` f32), nothing at ratio 1 (no pooling) and nothing for the
//!   index keys (no compressor of their own); reuse and reindex layers hold their window only
//!   (they read their source's rows and keys);
//! - **workspace**, V4's phases with V4.1's dimensions, plus: the Engram injection as a phase
//!   of its own (before the attention of an Engram layer: the gathered rows dequantised and as
//!   the projection's input, `2 x 24 x 256`, `wkv`'s output `(hc_mult + 1) x D`, the gates, the
//!   raw rows staged from the host `24 x 264` B and their ids); in the indexer phase of the
//!   candidate source, the block scores of the whole chunk, `T x ceil(rows / block_size)` f32
//!   (the bound on the transient per-token block scores), and its top-block candidates; in
//!   every phase, the kept-block table (`min(candidate_topk_blocks, blocks)` ids a token),
//!   which goes with the chunk from the candidate source to its consumers;
//! - [`MemoryPlan::placement_notes`] says what is where in words (the host tables and the
//!   device each Engram layer reads them to, the KV sources and their devices, the candidate
//!   stage).

use serde::Serialize;

use crate::config::Family;
#[cfg(test)]
use crate::config::ModelConfig;

/// Fixed per-device allowance: CUDA context, cuBLAS workspace, kernels, allocator slack.
pub const FIXED_WORKSPACE: u64 = 1 << 30;
/// Default prefill chunk (tokens) when none is given.
pub const DEFAULT_CHUNK: usize = 2048;
/// Positions whose logits the last device keeps (probed prompt positions plus generated ones),
/// and so the rows of one LM-head product when more are asked for (`trace --positions all`
/// computes a chunk's logits this many rows at a time: 0.5 GiB at Flash's 129,280 words). A
/// streamed head decodes its whole weight once per group and larger products run closer to the
/// cores' peak, so fewer, larger groups are faster: the 1,000-token Flash-dimension trace of
/// `scripts/bench-cpu.sh` took 25.0 s with 256-row groups, 21.5 s with 1,024-row ones).
pub const PROBED_LOGIT_ROWS: u64 = 1024;

mod devices;
mod footprint;
mod host_plan;
mod model;
mod search;
mod state;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_v41;

#[cfg(test)]
mod ledger_tests;

pub use devices::*;
pub use footprint::*;
pub use host_plan::*;
pub use model::*;
pub use search::*;
pub use state::*;

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
    /// Offered but left without work by the placement (everything else zero, nothing charged).
    pub idle: bool,
}

impl DevicePlan {
    /// The row of an offered device that the placement leaves idle.
    pub fn idle(device: usize, capacity: u64) -> Self {
        DevicePlan {
            device,
            layers: None,
            holds_embed: false,
            holds_head: false,
            weights: 0,
            state: 0,
            workspace: 0,
            total: 0,
            capacity,
            free: free_bytes(capacity, 0),
            shortfall: 0,
            idle: true,
        }
    }
}

/// The layout of a model over devices for one context length.
#[derive(Clone, Debug, Serialize)]
pub struct MemoryPlan {
    pub devices_spec: String,
    pub context: usize,
    pub chunk: usize,
    pub fits: bool,
    /// `balanced`, `packed in order`, `searched` ([`plan_assigned`]) or `refused`.
    pub strategy: &'static str,
    pub devices: Vec<DevicePlan>,
    pub weights: u64,
    pub state: u64,
    pub workspace: u64,
    pub total: u64,
    pub capacity: u64,
    /// Sum of the per-device shortfalls of the reported layout (0 when it fits).
    pub shortfall: u64,
    /// MTP bytes left out of the plan (V4.1: its DSpark draft blocks `mtp.*`).
    pub excluded_mtp_bytes: u64,
    /// V4.1: bytes of the vision tower, aligner and image delimiters, left out of the plan (a
    /// text needle never runs them). Absent from the JSON when 0 (V4).
    #[serde(skip_serializing_if = "footprint::is_zero")]
    pub excluded_vision_bytes: u64,
    /// V4.1: weight bytes that stay on the host, memory-mapped and read by row (the Engram
    /// tables and their scales), on no device. Absent from the JSON when 0 (V4).
    #[serde(skip_serializing_if = "footprint::is_zero")]
    pub host_bytes: u64,
    /// V4.1: bytes each token reads from the host-resident tables (every Engram layer's rows).
    /// Absent from the JSON when 0 (V4).
    #[serde(skip_serializing_if = "footprint::is_zero")]
    pub host_read_bytes_per_token: u64,
    /// V4.1: what is where, in words (host tables, which layers hold compressed state and on
    /// which device, the candidate stage, what is not placed). Absent from the JSON when empty
    /// (V4).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub placement_notes: Vec<String>,
    pub assumptions: Vec<String>,
}

/// Lays `footprint` out over `devices` for `context` tokens, prefilling in chunks of `chunk`;
/// `cfg` is a model of either family ([`AsPlanModel`]: a V4 `ModelConfig`, a `V41Config`).
pub fn plan(
    cfg: &(impl AsPlanModel + ?Sized),
    footprint: &Footprint,
    devices: &DeviceSet,
    context: usize,
    chunk: usize,
) -> MemoryPlan {
    let m = cfg.plan_model();
    let m = m.as_ref();
    let n_dev = devices.capacities.len().max(1);
    let caps = capacities(devices);
    let items = layer_loads(m, footprint, context, chunk);
    let fixed: Vec<u64> = (0..n_dev)
        .map(|d| fixed_bytes(m, footprint, context, chunk, d == 0, d == n_dev - 1))
        .collect();
    let balanced = place_balanced(&items, &fixed, &caps);
    let fits = |a: &[usize]| {
        loads(&items, &fixed, a, n_dev)
            .iter()
            .zip(&caps)
            .all(|(l, c)| l <= c)
    };
    let (assign, strategy) = if fits(&balanced) {
        (balanced, "balanced")
    } else {
        let packed = place_first_fit(&items, &fixed, &caps);
        if fits(&packed) {
            (packed, "packed in order")
        } else {
            (balanced, "refused")
        }
    };
    rows(m, footprint, devices, context, chunk, &assign, strategy)
}

/// The plan of a layout found by [`search`] over `devices` (the devices it uses, in order):
/// layer `l` on device `assign[l]`, strategy `searched` (`refused` if it does not fit).
pub fn plan_assigned(
    cfg: &(impl AsPlanModel + ?Sized),
    footprint: &Footprint,
    devices: &DeviceSet,
    context: usize,
    chunk: usize,
    assign: &[usize],
) -> MemoryPlan {
    let m = cfg.plan_model();
    rows(
        m.as_ref(),
        footprint,
        devices,
        context,
        chunk,
        assign,
        "searched",
    )
}

/// Each layer's load on its device: weights as stored plus its state for the run.
fn layer_loads(m: &PlanModel, footprint: &Footprint, context: usize, chunk: usize) -> Vec<u64> {
    (0..footprint.layer_bytes.len())
        .map(|l| {
            let state = m.layer_state(l, context, chunk).total();
            footprint.layer_bytes[l].saturating_add(state)
        })
        .collect()
}

/// What a device is charged besides its layers: its workspace, plus the embedding when it is
/// the first device and the head (and the logits, in the workspace) when it is the last.
fn fixed_bytes(
    m: &PlanModel,
    footprint: &Footprint,
    context: usize,
    chunk: usize,
    first: bool,
    last: bool,
) -> u64 {
    sat_sum([
        m.workspace_bytes(context, chunk, last),
        if first { footprint.first_bytes } else { 0 },
        if last { footprint.last_bytes } else { 0 },
    ])
}

/// One capacity per planned device (a set of none plans over one device of 0 bytes).
fn capacities(devices: &DeviceSet) -> Vec<u64> {
    let n_dev = devices.capacities.len().max(1);
    (0..n_dev)
        .map(|d| devices.capacities.get(d).copied().unwrap_or(0))
        .collect()
}

/// The plan's rows and totals with layer `l` on device `assign[l]`, under `strategy` when every
/// device fits and as `refused` otherwise.
fn rows(
    m: &PlanModel,
    footprint: &Footprint,
    devices: &DeviceSet,
    context: usize,
    chunk: usize,
    assign: &[usize],
    strategy: &'static str,
) -> MemoryPlan {
    let caps = capacities(devices);
    let n_dev = caps.len();
    let layers = footprint.layer_bytes.len();
    let states: Vec<u64> = (0..layers)
        .map(|l| m.layer_state(l, context, chunk).total())
        .collect();
    let mut out = Vec::with_capacity(n_dev);
    for (d, &cap) in caps.iter().enumerate() {
        let mine: Vec<usize> = (0..layers).filter(|&l| assign[l] == d).collect();
        let weights = sat_sum(mine.iter().map(|&l| footprint.layer_bytes[l]).chain([
            if d == 0 { footprint.first_bytes } else { 0 },
            if d == n_dev - 1 {
                footprint.last_bytes
            } else {
                0
            },
        ]));
        let state = sat_sum(mine.iter().map(|&l| states[l]));
        let workspace = m.workspace_bytes(context, chunk, d == n_dev - 1);
        let total = sat_sum([weights, state, workspace]);
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
            free: free_bytes(cap, total),
            shortfall: total.saturating_sub(cap),
            idle: false,
        });
    }
    let ok = out.iter().all(|d| d.shortfall == 0);
    let sum = |f: fn(&DevicePlan) -> u64| sat_sum(out.iter().map(f));
    let mut p = MemoryPlan {
        devices_spec: devices.spec.clone(),
        context,
        chunk: chunk.min(context).max(1),
        fits: ok,
        strategy: if ok { strategy } else { "refused" },
        weights: sum(|d| d.weights),
        state: sum(|d| d.state),
        workspace: sum(|d| d.workspace),
        total: sum(|d| d.total),
        capacity: sum(|d| d.capacity),
        shortfall: if ok { 0 } else { sum(|d| d.shortfall) },
        excluded_mtp_bytes: footprint.mtp.bytes,
        excluded_vision_bytes: footprint.vision.bytes,
        host_bytes: footprint.host_bytes,
        host_read_bytes_per_token: if footprint.host_bytes > 0 {
            m.engram_read_bytes_per_token()
        } else {
            0
        },
        placement_notes: Vec::new(),
        assumptions: assumptions(m, context, chunk),
        devices: out,
    };
    p.placement_notes = placement_notes(m, &p);
    p
}

/// `capacity - total` as a signed figure, clamped to the `i64` range.
pub fn free_bytes(capacity: u64, total: u64) -> i64 {
    let free = i128::from(capacity) - i128::from(total);
    free.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

/// Per-device load (fixed + assigned items) of an assignment.
fn loads(items: &[u64], fixed: &[u64], assign: &[usize], n_dev: usize) -> Vec<u64> {
    let mut l = fixed.to_vec();
    l.resize(n_dev, 0);
    for (i, &d) in assign.iter().enumerate() {
        l[d] = l[d].saturating_add(items[i]);
    }
    l
}

/// Contiguous split towards capacity-proportional cumulative targets.
fn place_balanced(items: &[u64], fixed: &[u64], caps: &[u64]) -> Vec<usize> {
    let n_dev = caps.len();
    let cap_total: f64 = caps.iter().map(|&c| c as f64).sum::<f64>().max(1.0);
    let need_total: f64 = sat_sum(items.iter().chain(fixed).copied()) as f64;
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
        while d + 1 < n_dev && load.saturating_add(it) > caps[d] {
            d += 1;
            load = fixed[d];
        }
        assign.push(d);
        load = load.saturating_add(it);
    }
    assign
}

/// The plan's assumptions in words, for the report.
fn assumptions(cfg: &(impl AsPlanModel + ?Sized), context: usize, chunk: usize) -> Vec<String> {
    let m = cfg.plan_model();
    match m.family {
        Family::V4 => assumptions_v4(&m, context, chunk),
        Family::V41 => assumptions_v41(&m, context, chunk),
    }
}

fn assumptions_v4(cfg: &PlanModel, context: usize, chunk: usize) -> Vec<String> {
    let t = chunk.min(context).max(1);
    vec![
        format!(
            "weights in their stored formats; embed on the first device that runs layers, head + final norm + hc_head on the last; MTP not placed (never run)"
        ),
        format!(
            "caches are f32 rows in allocations that double when full: counted at {CACHE_GROWTH_SLACK}x the rows they hold"
        ),
        format!(
            "window per layer: {} + {t} (one chunk) rows x {} dims",
            cfg.sliding_window, cfg.head_dim
        ),
        format!(
            "compressed KV on CSA / HCA layers: context/4 or context/128 rows x {} dims",
            cfg.head_dim
        ),
        format!(
            "index keys on CSA layers: context/4 rows x {} dims twice (raw, for the observer and --compare; prepared under the driving profile) + one scale per row",
            cfg.index_head_dim
        ),
        "compressor carry: the unfinished pooling group's kv and gate projections".into(),
        format!(
            "workspace per device: 1 GiB fixed + the f32 activations of a {t}-token prefill chunk in its largest phase (mHC mixing; indexer; sparse attention over window + top-k or HCA rows; output projections; routed experts), phases that are never live together, + the largest capped scratch buffer (decoded weight band, attention or score tile) + 1/8 for pool size classes + the largest single cache allocation (a growing cache briefly holds its old and new allocation); last device + logits of {PROBED_LOGIT_ROWS} probed positions"
        ),
    ]
}

fn assumptions_v41(m: &PlanModel, context: usize, chunk: usize) -> Vec<String> {
    let t = chunk.min(context).max(1);
    let sources: Vec<_> = m.roles.iter().filter(|r| r.owns_kv()).collect();
    let mut ratios: Vec<usize> = sources.iter().map(|r| r.ratio).collect();
    ratios.sort_unstable_by(|a, b| b.cmp(a));
    ratios.dedup();
    let per_ratio = ratios
        .iter()
        .map(|r| format!("context/{r}"))
        .collect::<Vec<_>>()
        .join(" or ");
    let engram = match m.engram.first() {
        Some(e) => format!(
            "Engram injection: {} gathered rows x {} per token, dequantised and as the projection's input, its output {} wide, the raw rows staged from the host; ",
            e.rows_per_token, e.head_dim, e.out_width
        ),
        None => String::new(),
    };
    let (candidate, kept) = match &m.candidate {
        Some(c) => (
            format!(
                ", at the candidate source (layer {}) the block scores of the whole chunk ({t} x rows/{} f32) and its top-{} candidates",
                c.source, c.block_size, c.topk_blocks
            ),
            format!(
                " + the kept-block table ({} block ids a token) that goes with the chunk from layer {} to its consumers",
                c.topk_blocks, c.source
            ),
        ),
        None => (String::new(), String::new()),
    };
    vec![
        "weights in their stored formats; embed on the first device that runs layers, head + final norm on the last; Engram projections (wkv, q_weight, k_weight) with their layer; Engram tables (embed.weight, embed.scale) on the host, memory-mapped and read by row, on no device; draft blocks (mtp.*), vision tower, aligner and image delimiters not placed (never run for a text needle)".into(),
        format!(
            "caches are f32 rows in allocations that double when full: counted at {CACHE_GROWTH_SLACK}x the rows they hold"
        ),
        format!(
            "window on every layer: {} + {t} (one chunk) rows x {} dims",
            m.sliding_window, m.head_dim
        ),
        format!(
            "compressed KV on the KV sources only ({}): {per_ratio} rows x {} dims by their ratio; reuse and reindex layers read their source's rows and hold none",
            list(sources.iter().map(|r| r.layer)),
            m.head_dim
        ),
        format!(
            "index keys on the KV sources only: context/ratio rows x {} dims twice (raw, for the observer and --compare; prepared under the driving profile) + one scale per row; reindex layers score their KV source's keys",
            m.index_head_dim
        ),
        format!(
            "compressor carry: a ratio-2 source's unfinished pair (kv and gate projections, 2 x 2 x {} f32); a ratio-1 source pools nothing and carries nothing; index keys come from the compressor's latent and carry nothing of their own",
            m.head_dim
        ),
        format!(
            "workspace per device: 1 GiB fixed + the f32 activations of a {t}-token prefill chunk in its largest phase (mHC mixing; {engram}indexer{candidate}; sparse attention over window + top-k; output projections; routed experts), phases that are never live together{kept}, + the largest capped scratch buffer (decoded weight band, attention or score tile) + 1/8 for pool size classes + the largest single cache allocation (a growing cache briefly holds its old and new allocation); last device + logits of {PROBED_LOGIT_ROWS} probed positions"
        ),
    ]
}

/// `2, 8, 14`.
fn list(items: impl IntoIterator<Item = usize>) -> String {
    items
        .into_iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// What is where in plan `p` of model `cfg`, in words (DeepSeek-V4.1; none on V4, whose table
/// says it all): the host-resident Engram tables and the device each Engram layer reads them
/// to, the layers that hold compressed state and their devices, the candidate stage (what is
/// not placed is in the plan's `excluded_*` figures). Device numbers are `p`'s ([`crate::devices::placement::plan_over`] calls this
/// again once it has renumbered them to the offered devices).
pub fn placement_notes(cfg: &(impl AsPlanModel + ?Sized), p: &MemoryPlan) -> Vec<String> {
    use crate::units::{group_digits, human_bytes};
    let m = cfg.plan_model();
    if m.family == Family::V4 {
        return Vec::new();
    }
    let device_of = |l: usize| {
        p.devices
            .iter()
            .find(|d| matches!(d.layers, Some([a, b]) if a <= l && l <= b))
            .map(|d| format!("device {}", d.device))
            .unwrap_or_else(|| "no device".into())
    };
    let g = |v: u64| group_digits(v);
    let mut notes = Vec::new();
    if !m.engram.is_empty() {
        let tables = m
            .engram
            .iter()
            .map(|e| format!("layer {} {} rows", e.layer, g(e.rows)))
            .collect::<Vec<_>>()
            .join(", ");
        let e0 = &m.engram[0];
        let to = m
            .engram
            .iter()
            .map(|e| format!("layer {} on {}", e.layer, device_of(e.layer)))
            .collect::<Vec<_>>()
            .join(", ");
        notes.push(format!(
            "Engram: the tables stay on the host, memory-mapped and read by row, on no device ({tables}; {} B a row of {} values{}; {} in all); a token reads {} rows of each ({} B), {} B in all, copied with its chunk to its layer's device ({to}), where the Engram projections (wkv, q_weight, k_weight) sit with the layer",
            e0.row_bytes,
            e0.head_dim,
            if e0.row_bytes == 2 * e0.head_dim as u64 {
                " in bf16".to_string()
            } else {
                format!(
                    " in e4m3 + {} e8m0 scales",
                    e0.head_dim.div_ceil(crate::checkpoint::inventory::ENGRAM_GROUP)
                )
            },
            human_bytes(p.host_bytes),
            e0.rows_per_token,
            g(e0.read_bytes_per_token()),
            g(m.engram_read_bytes_per_token()),
        ));
    }
    let c = p.context as u64;
    let sources: Vec<_> = m.roles.iter().filter(|r| r.owns_kv()).collect();
    let held = sources
        .iter()
        .map(|r| {
            let ratio = r.rows().map(|x| x.ratio).unwrap_or(1).max(1);
            format!(
                "layer {} ({}): {} rows (ratio {ratio})",
                r.layer,
                device_of(r.layer),
                g(c / ratio as u64)
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let readers: Vec<usize> = m
        .roles
        .iter()
        .filter(|r| !r.owns_kv() && r.kv_source.is_some())
        .map(|r| r.layer)
        .collect();
    let reindex: Vec<usize> = m
        .roles
        .iter()
        .filter(|r| r.has_indexer() && !r.owns_kv())
        .map(|r| r.layer)
        .collect();
    notes.push(format!(
        "compressed KV and index keys on the KV sources only: {held}; the other {} layers hold their window only ({} of them read a KV source's rows{})",
        m.layers() - sources.len(),
        readers.len(),
        if reindex.is_empty() {
            String::new()
        } else {
            format!("; reindex layers {} score their source's keys", list(reindex))
        }
    ));
    if let Some(cand) = &m.candidate {
        let rows = m
            .roles
            .iter()
            .find(|r| r.layer == cand.source)
            .and_then(|r| r.rows())
            .map(|x| c / x.ratio.max(1) as u64)
            .unwrap_or(0);
        let blocks = rows.div_ceil(cand.block_size.max(1) as u64);
        let consumers = cand
            .consumers
            .iter()
            .map(|&l| format!("{l} ({})", device_of(l)))
            .collect::<Vec<_>>()
            .join(", ");
        notes.push(format!(
            "candidate stage: layer {} ({}) keeps its top {} blocks of {} rows per query ({} blocks at this context{}); the kept blocks go with the chunk to layers {consumers}",
            cand.source,
            device_of(cand.source),
            g(cand.topk_blocks as u64),
            cand.block_size,
            g(blocks),
            if blocks <= cand.topk_blocks as u64 {
                ": every block is kept"
            } else {
                ""
            },
        ));
    }
    notes
}
