//! Placement: which device runs which decoder layers, decided before any weight is loaded.
//!
//! The numbers are the memory plan's ([`crate::plan`]): weights per layer as stored, per-layer
//! state for the run's context, and per-device workspace (the largest top-k of the run replaces
//! the config's `index_topk` in it). [`place`] lays the layers out in contiguous ranges, in
//! device order, balanced by bytes in proportion to each device's FREE memory (what
//! [`plan::plan`] does for `inspect --devices`, so `inspect` predicts what a run does); the
//! embedding goes with the first device and the head with the last. When the plan leaves a
//! device without a layer (more devices than layers, or one too small to take a layer's share)
//! that device is left idle and the plan is redone over the others, because the GPU backend
//! runs the embedding with the first layer and the head with the last. When these splits find
//! no layout that fits, the exact search ([`plan::search`]: every contiguous layout over every
//! order-preserving subset of the devices, the others idle) decides: its layout when one fits
//! (strategy `searched`), otherwise [`PlacementError::DoesNotFit`], which lists every device's
//! need against its free memory and the shortfall, so the refusal comes before loading instead
//! of an out-of-memory error midway. So offering one more device never turns a layout that
//! fits into a refusal.
//!
//! The sequence state (window and compressed KV rows, prepared index keys) lives on the device in
//! caches that double when full; the plan counts them as the GPU backend allocates them (f32,
//! twice the rows held), so a run that was placed cannot run out of memory for its caches.

use crate::config::ModelConfig;
use crate::plan::{self, DeviceSet, Footprint, MemoryPlan};
use crate::units::{bytes_and_count, group_digits, human_bytes};

/// `--chunk auto` ([`Workload::chunk`]): the prefill chunk is chosen with the backend.
pub const AUTO_CHUNK: usize = 0;
/// On GPUs `auto` takes the largest of these that the placement fits: a bigger chunk amortises
/// the per-chunk launches, host round trips and small-M expert GEMMs (on an H200 at 8K, chunk
/// 8,192 ran the 4-layer Flash prefill 18% faster than 2,048). Results do not depend on it.
pub const GPU_AUTO_CHUNKS: [usize; 3] = [8192, 4096, 2048];
/// On the CPU `auto` is this chunk.
pub const CPU_AUTO_CHUNK: usize = 2048;

/// [`place`], with `work.chunk` == [`AUTO_CHUNK`] resolved to the largest of
/// [`GPU_AUTO_CHUNKS`] that fits (the refusal, when none does, is the smallest one's).
pub fn place_auto(
    cfg: &ModelConfig,
    footprint: &Footprint,
    devices: &[DeviceMemory],
    work: &Workload,
) -> Result<Placement, PlacementError> {
    if work.chunk != AUTO_CHUNK {
        return place(cfg, footprint, devices, work);
    }
    let mut last = None;
    for chunk in GPU_AUTO_CHUNKS {
        match place(cfg, footprint, devices, &Workload { chunk, ..*work }) {
            Ok(p) => return Ok(p),
            Err(e) => last = Some(e),
        }
    }
    Err(last.expect("at least one candidate chunk"))
}

/// One device offered to the placement: its name (`cuda:0`) and its free memory in bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceMemory {
    pub name: String,
    pub free: u64,
}

/// What a run needs device memory for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Workload {
    /// Tokens the longest sequence of the run reaches (prompt plus generated tokens).
    pub context: usize,
    /// Prefill chunk in tokens ([`AUTO_CHUNK`]: chosen with the backend, see [`place_auto`]).
    pub chunk: usize,
    /// The largest indexer top-k of the run.
    pub topk: usize,
}

/// A layout that fits.
#[derive(Clone, Debug)]
pub struct Placement {
    /// The offered devices that run something, in order (indices into the offered list).
    pub used: Vec<usize>,
    /// Names of the used devices.
    pub names: Vec<String>,
    /// Decoder layer -> position in `used` (ascending: contiguous ranges).
    pub layer_device: Vec<usize>,
    /// The memory plan over the used devices (capacities = free memory).
    pub plan: MemoryPlan,
    /// Offered devices left without work.
    pub idle: Vec<String>,
}

impl Placement {
    /// One entry per used device: `cuda:0 layers 0-21 +embed`.
    pub fn ranges(&self) -> Vec<String> {
        self.names
            .iter()
            .zip(&self.plan.devices)
            .map(|(n, d)| format!("{n} {}", held(d)))
            .collect()
    }

    /// One entry per used device: `cuda:0 layers 0-21 +embed (needs 40.10 GiB of 79.20 GiB
    /// free)`.
    pub fn describe(&self) -> Vec<String> {
        self.names
            .iter()
            .zip(&self.plan.devices)
            .map(|(n, d)| {
                format!(
                    "{n} {} (needs {} of {} free)",
                    held(d),
                    human_bytes(d.total),
                    human_bytes(d.capacity)
                )
            })
            .collect()
    }
}

/// What a device holds: `layers 0-21 +embed`.
fn held(d: &plan::DevicePlan) -> String {
    let mut s = match d.layers {
        Some([a, b]) if a == b => format!("layer {a}"),
        Some([a, b]) => format!("layers {a}-{b}"),
        None => "no layer".into(),
    };
    if d.holds_embed {
        s.push_str(" +embed");
    }
    if d.holds_head {
        s.push_str(" +head");
    }
    s
}

/// Why no layout was made.
#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    #[error("no device was offered to place the model on")]
    NoDevices,
    /// The layers do not fit: every device's need against its free memory.
    #[error("{}", refusal(.names, .plan, .work, .idle))]
    DoesNotFit {
        names: Vec<String>,
        plan: Box<MemoryPlan>,
        work: Workload,
        idle: Vec<String>,
    },
}

fn refusal(names: &[String], p: &MemoryPlan, work: &Workload, idle: &[String]) -> String {
    let mut s = format!(
        "the model does not fit on {} at a context of {} tokens (prefill chunk {}, top-k {}): \
         short by {}; no weight was loaded",
        names.join(", "),
        group_digits(work.context as u64),
        p.chunk,
        work.topk,
        bytes_and_count(p.shortfall)
    );
    for (n, d) in names.iter().zip(&p.devices) {
        let verdict = if d.shortfall > 0 {
            format!("short by {}", bytes_and_count(d.shortfall))
        } else {
            format!("fits ({} spare)", human_bytes(d.capacity - d.total))
        };
        s.push_str(&format!(
            "\n  {n}: {} needs {} (weights {}, state {}, workspace {}), {} free: {verdict}",
            held(d),
            human_bytes(d.total),
            human_bytes(d.weights),
            human_bytes(d.state),
            human_bytes(d.workspace),
            human_bytes(d.capacity)
        ));
    }
    s.push_str(&format!(
        "\n  in total: needs {}, {} free",
        human_bytes(p.total),
        human_bytes(p.capacity)
    ));
    if p.total <= p.capacity {
        s.push_str(" (enough in total, but not in contiguous layer ranges)");
    }
    if !idle.is_empty() {
        s.push_str(&format!(
            "\n  left idle (no layer in the chosen layout): {}",
            idle.join(", ")
        ));
    }
    s.push_str(
        "\n  use more or larger GPUs, a shorter context or a smaller --chunk, or --device cpu",
    );
    s
}

/// The memory plan a run would use over the devices of `devices` (what `inspect --devices`
/// shows; `chunk` may be [`AUTO_CHUNK`]): [`place`] with the config's top-k, renumbered to the offered devices, with a row
/// for each device it leaves idle (charged nothing) and capacities over every offered device.
/// Refused plans are returned too (`fits` false), over the devices that would have been used.
pub fn plan_over(
    cfg: &ModelConfig,
    footprint: &Footprint,
    devices: &DeviceSet,
    context: usize,
    chunk: usize,
) -> MemoryPlan {
    // `auto`, as a GPU run resolves it (`place_auto`): the largest chunk that fits, else the
    // smallest one's refusal.
    if chunk == AUTO_CHUNK {
        let mut last = None;
        for candidate in GPU_AUTO_CHUNKS {
            let p = plan_over(cfg, footprint, devices, context, candidate);
            if p.fits {
                return p;
            }
            last = Some(p);
        }
        return last.expect("at least one candidate chunk");
    }
    let offered: Vec<DeviceMemory> = devices
        .capacities
        .iter()
        .enumerate()
        .map(|(i, &free)| DeviceMemory {
            name: i.to_string(),
            free,
        })
        .collect();
    let work = Workload {
        context,
        chunk,
        topk: cfg.index_topk,
    };
    let (used, mut p) = match place(cfg, footprint, &offered, &work) {
        Ok(placed) => (placed.used, placed.plan),
        Err(PlacementError::DoesNotFit { names, plan, .. }) => {
            (names.iter().filter_map(|n| n.parse().ok()).collect(), *plan)
        }
        // No device offered: the plan over none (the DeviceSet parser refuses this anyway).
        Err(PlacementError::NoDevices) => {
            return plan::plan(cfg, footprint, devices, context, chunk)
        }
    };
    let mut rows: Vec<plan::DevicePlan> = (0..offered.len())
        .map(|i| plan::DevicePlan::idle(i, offered[i].free))
        .collect();
    for (row, &i) in p.devices.drain(..).zip(&used) {
        rows[i] = plan::DevicePlan { device: i, ..row };
    }
    p.devices = rows;
    p.devices_spec = devices.spec.clone();
    p.capacity = crate::plan::sat_sum(devices.capacities.iter().copied());
    p
}

/// Lays the model out over `devices` for `work` (see the module docs). `footprint` gives the
/// weight bytes per layer (e.g. [`Footprint::of_checkpoint`]).
pub fn place(
    cfg: &ModelConfig,
    footprint: &Footprint,
    devices: &[DeviceMemory],
    work: &Workload,
) -> Result<Placement, PlacementError> {
    if devices.is_empty() {
        return Err(PlacementError::NoDevices);
    }
    let mut cfg = cfg.clone();
    cfg.index_topk = work.topk.max(1);
    let layers = footprint.layer_bytes.len();
    // Without layers the embedding and the head share the first device.
    let mut used: Vec<usize> = if layers == 0 {
        vec![0]
    } else {
        (0..devices.len()).collect()
    };
    // A device whose free memory cannot even hold the per-device workspace never takes a
    // layer: leave it idle (unless that leaves none, so the refusal lists every device).
    let floor = plan::workspace_bytes(&cfg, work.context, work.chunk, false);
    let roomy: Vec<usize> = used
        .iter()
        .copied()
        .filter(|&i| devices[i].free > floor)
        .collect();
    if !roomy.is_empty() {
        used = roomy;
    }
    let mut first_refusal = None;
    loop {
        let (set, names) = subset(devices, &used);
        let p = plan::plan(&cfg, footprint, &set, work.context, work.chunk);
        let empty: Vec<usize> = (0..used.len())
            .filter(|&d| layers > 0 && p.devices[d].layers.is_none())
            .collect();
        // A plan that does not fit while a device holds no layer may fail only for what that
        // device is charged besides layers (the embedding on the first device, the head on the
        // last, a workspace): plan again without it before refusing (a first or last GPU with
        // a little more room than one workspace must not sink a layout that fits without it).
        // If that fails too, the exact search decides; its refusal is the first plan's, over
        // every device offered.
        if !p.fits {
            let refusal = PlacementError::DoesNotFit {
                names,
                plan: Box::new(p),
                work: *work,
                idle: idle_of(devices, &used),
            };
            let refusal = first_refusal.take().unwrap_or(refusal);
            if empty.is_empty() || empty.len() == used.len() {
                return searched(&cfg, footprint, devices, work).ok_or(refusal);
            }
            first_refusal = Some(refusal);
        } else if empty.is_empty() {
            let mut layer_device = vec![0; layers];
            for (d, dp) in p.devices.iter().enumerate() {
                if let Some([a, b]) = dp.layers {
                    layer_device[a..=b].fill(d);
                }
            }
            return Ok(Placement {
                idle: idle_of(devices, &used),
                used,
                names,
                layer_device,
                plan: p,
            });
        }
        // Plan again without the devices that got no layer: strictly fewer devices each round
        // (at least one is kept), so this ends.
        used = used
            .iter()
            .enumerate()
            .filter(|(d, _)| !empty.contains(d))
            .map(|(_, &i)| i)
            .collect();
    }
}

/// The layout of the exact search over every offered device ([`plan::search`]), if one fits.
/// `cfg` carries the run's top-k.
fn searched(
    cfg: &ModelConfig,
    footprint: &Footprint,
    devices: &[DeviceMemory],
    work: &Workload,
) -> Option<Placement> {
    let free: Vec<u64> = devices.iter().map(|d| d.free).collect();
    let layout = plan::search(cfg, footprint, &free, work.context, work.chunk)?;
    let (set, names) = subset(devices, &layout.used);
    let p = plan::plan_assigned(
        cfg,
        footprint,
        &set,
        work.context,
        work.chunk,
        &layout.assign,
    );
    p.fits.then(|| Placement {
        idle: idle_of(devices, &layout.used),
        used: layout.used,
        names,
        layer_device: layout.assign,
        plan: p,
    })
}

/// The device set of the offered devices `used` (free memory as capacity), and their names.
fn subset(devices: &[DeviceMemory], used: &[usize]) -> (DeviceSet, Vec<String>) {
    let names: Vec<String> = used.iter().map(|&i| devices[i].name.clone()).collect();
    let set = DeviceSet {
        capacities: used.iter().map(|&i| devices[i].free).collect(),
        spec: names.join(","),
    };
    (set, names)
}

/// The names of the offered devices not in `used`.
fn idle_of(devices: &[DeviceMemory], used: &[usize]) -> Vec<String> {
    (0..devices.len())
        .filter(|i| !used.contains(i))
        .map(|i| devices[i].name.clone())
        .collect()
}

#[cfg(test)]
#[path = "placement_tests.rs"]
mod tests;
