//! The CPU host's memory plan: what a run of the CPU reference backend holds in the host's
//! memory at a context, against what the host has (`inspect --devices cpu`, and every CPU run
//! before it loads a weight).
//!
//! In: a model of either family ([`AsPlanModel`]), its [`Footprint`], [`HostPlanInput`] (the
//! context, the prefill chunk, the weight residency after `auto` is resolved, the worker
//! threads) and the host's memory. Out: a [`HostPlan`], its figures in bytes:
//! - **mapped weights**: the stored tensors the run reads through the checkpoint's memory map
//!   while it runs, which must stay in the page cache for it to run at speed (every prefill
//!   chunk touches every routed expert): the whole main model when weights are `streamed`
//!   (decoded band by band on use), only DeepSeek-V4.1's Engram tables (read by row) when they
//!   are `decoded` (the map is read once at load and its pages may be dropped after);
//! - **decoded copies**: the linears decoded to f32 at load, 4 B per logical parameter
//!   (packed FP4 counts two per byte, scales none; `mtp.*`, V4.1's vision tower and its Engram
//!   tables excluded); none when `streamed`. DeepSeek-V4.1 always decodes (its CPU model has no
//!   streamed residency);
//! - **state**: the per-layer caches at the context, the GPU plan's rule
//!   ([`PlanModel::layer_state`]: f32 rows counted at twice the rows they hold, since a growing
//!   `Vec` doubles), and the largest cache allocation once more (a growing cache holds its old
//!   and its new allocation for a moment);
//! - **workspace**: the most one prefill chunk holds at once
//!   ([`PlanModel::activation_peak_bytes`], the phases of a layer whose buffers are never live
//!   together), the logits of a whole chunk (`trace --logits` asks for every position of a
//!   chunk at once; at least [`PROBED_LOGIT_ROWS`] rows), per worker thread a decoded band of
//!   the widest linear twice over plus the GEMM's packing buffers ([`THREAD_SCRATCH_BYTES`]:
//!   experts run side by side, each decoding its own bands), and [`PROCESS_BYTES`] for the
//!   process itself (code, the tokenizer's tables, thread stacks, the allocator's reserve).
//!
//! The plan fits when the total is at most the capacity: what the process may take now
//! (`crate::devices::host::host_memory_available`: the host's `MemAvailable`, what the kernel
//! says can be had without swapping, page cache included; lower under a cgroup limit;
//! `NEEDLESCOPE_HOST_MEMORY` when set) or a size given (`--devices cpu:512G`, to plan for
//! another host). Figures saturate at `u64::MAX`
//! ([`sat_sum`], [`sat_product`]). The workspace rule is checked against the peak resident set
//! the CPU backend reaches (`tests/cli/host_plan.rs`; the note of issue 42 for Flash
//! dimensions).

use serde::Serialize;

use super::{sat_product, sat_sum, AsPlanModel, Footprint, PlanModel, PROBED_LOGIT_ROWS};
use crate::backend::WeightResidency;
use crate::config::Family;

/// The process's own memory besides weights, state and workspace: the binary, the tokenizer's
/// tables, thread stacks and the allocator's retained heap (`backend::cpu::tune_allocator`
/// keeps up to 1 GiB of freed heap before trimming; a quarter of that is charged here, the
/// rest reused by the workspace).
pub const PROCESS_BYTES: u64 = 512 << 20;

/// Per worker thread, besides two decoded bands: the `gemm` crate's packed operand blocks.
pub const THREAD_SCRATCH_BYTES: u64 = 8 << 20;

/// What the run is, for [`host_plan`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostPlanInput {
    pub context: usize,
    /// The prefill chunk (`auto` already resolved).
    pub chunk: usize,
    /// `Decoded` or `Streamed` (`Auto` already resolved, see [`auto_residency`]).
    pub weights: WeightResidency,
    /// Worker threads of the run (rayon's pool).
    pub threads: usize,
}

/// The host's memory a plan is held against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostMemory {
    pub capacity: u64,
    /// Where the capacity comes from: `MemAvailable`, `cgroup memory limit`,
    /// `NEEDLESCOPE_HOST_MEMORY` (read now) or `given`.
    pub source: &'static str,
    /// What the user wrote (`cpu`, `cpu:512G`).
    pub spec: String,
}

/// A CPU run's memory against the host's (module doc).
#[derive(Clone, Debug, Serialize)]
pub struct HostPlan {
    pub devices_spec: String,
    pub context: usize,
    pub chunk: usize,
    /// `decoded` or `streamed`.
    pub weights: &'static str,
    pub threads: usize,
    pub mapped_weights: u64,
    pub decoded_weights: u64,
    pub state: u64,
    pub workspace: u64,
    pub total: u64,
    pub capacity: u64,
    /// [`HostMemory::source`].
    pub capacity_source: &'static str,
    pub fits: bool,
    /// max(0, total - capacity).
    pub shortfall: u64,
    /// Stored bytes never read (MTP; V4.1's vision tower).
    pub excluded_bytes: u64,
    pub assumptions: Vec<String>,
}

impl HostPlan {
    /// The refusal of a plan that does not fit: what the run needs, in parts, against what the
    /// host has, and the shortfall.
    pub fn refusal(&self) -> String {
        use crate::units::{bytes_and_count, group_digits, human_bytes};
        format!(
            "host memory plan refused: a CPU run at context {} (chunk {}, weights {}, {} threads) \
             needs {} (mapped weights {}, decoded copies {}, state {}, workspace {}) and the host \
             ({}) has {} ({}): short by {}",
            group_digits(self.context as u64),
            self.chunk,
            self.weights,
            self.threads,
            human_bytes(self.total),
            human_bytes(self.mapped_weights),
            human_bytes(self.decoded_weights),
            human_bytes(self.state),
            human_bytes(self.workspace),
            self.devices_spec,
            human_bytes(self.capacity),
            self.capacity_source,
            bytes_and_count(self.shortfall)
        )
    }
}

/// The residency `auto` picks on a host of `memory_total` bytes: `Decoded` when the decoded
/// weights ([`decoded_weight_bytes`]) take at most a quarter of it, else `Streamed`; the one
/// rule of `inspect --devices cpu` and of every CPU run (`model::forward::auto_residency`).
/// DeepSeek-V4.1 always decodes.
pub fn auto_residency(
    cfg: &(impl AsPlanModel + ?Sized),
    footprint: &Footprint,
    memory_total: u64,
) -> WeightResidency {
    let m = cfg.plan_model();
    if m.family == Family::V41 || decoded_weight_bytes(footprint) <= memory_total / 4 {
        WeightResidency::Decoded
    } else {
        WeightResidency::Streamed
    }
}

/// f32 bytes of the main model's decoded tensors: 4 B per logical parameter (packed FP4 two
/// per byte, scales none; MTP, V4.1's vision tower and host-resident tables excluded).
pub fn decoded_weight_bytes(footprint: &Footprint) -> u64 {
    sat_product([
        4,
        footprint.main.params.saturating_sub(footprint.host_params),
    ])
}

/// The plan of a CPU run of `cfg` with `footprint` on a host with `memory` (module doc).
pub fn host_plan(
    cfg: &(impl AsPlanModel + ?Sized),
    footprint: &Footprint,
    run: HostPlanInput,
    memory: &HostMemory,
) -> HostPlan {
    let m = cfg.plan_model();
    let m = m.as_ref();
    let context = run.context.max(1);
    let chunk = run.chunk.min(context).max(1);
    // DeepSeek-V4.1's CPU model decodes every linear at load.
    let weights = if m.family == Family::V41 {
        WeightResidency::Decoded
    } else {
        run.weights
    };
    let streamed = weights == WeightResidency::Streamed;
    let (mapped_weights, decoded_weights) = if streamed {
        (footprint.main.bytes, 0)
    } else {
        (footprint.host_bytes, decoded_weight_bytes(footprint))
    };
    let state = sat_sum(
        (0..m.layers())
            .map(|l| m.layer_state(l, context, chunk).total())
            .chain([m.largest_cache_bytes(context, chunk)]),
    );
    let threads = run.threads.max(1) as u64;
    let logit_rows = (chunk as u64).max(PROBED_LOGIT_ROWS);
    let workspace = sat_sum([
        m.activation_peak_bytes(context, chunk),
        sat_product([logit_rows, m.vocab_size as u64, 4]),
        sat_product([
            threads,
            sat_sum([sat_product([2, cpu_band_bytes(m)]), THREAD_SCRATCH_BYTES]),
        ]),
        PROCESS_BYTES,
    ]);
    let total = sat_sum([mapped_weights, decoded_weights, state, workspace]);
    let shortfall = total.saturating_sub(memory.capacity);
    HostPlan {
        devices_spec: memory.spec.clone(),
        context,
        chunk,
        weights: weights.name(),
        threads: threads as usize,
        mapped_weights,
        decoded_weights,
        state,
        workspace,
        total,
        capacity: memory.capacity,
        capacity_source: memory.source,
        fits: shortfall == 0,
        shortfall,
        excluded_bytes: sat_sum([footprint.mtp.bytes, footprint.vision.bytes]),
        assumptions: assumptions(m, weights, chunk, threads),
    }
}

/// The f32 bytes of one product band of the widest linear: `BAND_ROWS` weight rows of the most
/// columns any linear has (a decoded matrix lends its rows, a streamed one decodes them).
fn cpu_band_bytes(m: &PlanModel) -> u64 {
    let u = |v: usize| v as u64;
    let widest = [
        u(m.hidden_size),
        u(m.moe_intermediate_size),
        u(m.q_lora_rank),
        sat_product([u(m.o_groups), u(m.o_lora_rank)]),
        sat_product([u(m.num_attention_heads), u(m.head_dim)]) / u(m.o_groups).max(1),
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    sat_product([4, crate::backend::cpu::linalg::BAND_ROWS as u64, widest])
}

fn assumptions(m: &PlanModel, weights: WeightResidency, chunk: usize, threads: u64) -> Vec<String> {
    let mut out = vec![
        match weights {
            WeightResidency::Streamed => "weights streamed: the main model's stored bytes stay mapped and in the page cache (every chunk reads every expert); none decoded".to_string(),
            _ => "weights decoded to f32 at load (4 B per parameter); the map is read once and its pages may be dropped after".to_string(),
        },
        "state: the per-layer caches at the context, f32 rows counted at twice the rows they hold (a growing allocation doubles), plus the largest cache once more".to_string(),
        format!(
            "workspace: one prefill chunk of {chunk} tokens (the largest phase of a layer), the logits of a whole chunk, {threads} worker threads x (2 decoded bands of {} rows + {} MiB of GEMM packing), {} MiB for the process",
            crate::backend::cpu::linalg::BAND_ROWS,
            THREAD_SCRATCH_BYTES >> 20,
            PROCESS_BYTES >> 20
        ),
        "capacity: what this process may take now (MemAvailable, page cache included; less under a cgroup limit; NEEDLESCOPE_HOST_MEMORY when set), or the size given as cpu:SIZE".to_string(),
    ];
    if m.family == Family::V41 {
        out.push("DeepSeek-V4.1: always decoded on the CPU; its Engram tables stay mapped and are read by row; MTP and the vision tower never run".to_string());
    } else {
        out.push("MTP never runs: its tensors are neither mapped in nor decoded".to_string());
    }
    out
}
