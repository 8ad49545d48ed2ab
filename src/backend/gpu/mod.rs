//! The GPU backend: [`Backend`] on CUDA devices, its op logic written once over an
//! [`Executor`] (the device layer) so that the host emulator runs it too.
//!
//! - [`CudaBackend`] = `GpuBackend<CudaExecutor>`: one or more GPUs (driver API via cudarc,
//!   kernels from `kernels/*.cu` compiled by NVRTC for the device's architecture, cuBLAS GEMMs).
//! - [`EmuBackend`] = `GpuBackend<EmuExecutor>`: the same kernels compiled for the host by
//!   build.rs; CI runs every op and whole forwards through it against the CPU reference.
//!
//! Activations are resident: [`Backend::Act`] is a [`GpuAct`], one f32 buffer on one device, so a
//! layer's chain of ops (norms, projections, RoPE, mHC, attention, experts) reads and writes device
//! memory only. Ops run on the device of their weight, ops without a weight on the current
//! [`Site`]'s device; an input activation living on another device is moved there through the host,
//! an in-place one for good (see [`act`]), so with several devices the hidden state crosses once
//! per device boundary. The per-sequence caches (window KV rows, compressed rows, raw and
//! prepared index keys, the compressors' held token projections) are activations too, grown and
//! trimmed on the device ([`Backend::act_append`], [`Backend::act_drop_front`]); sparse attention
//! gathers its entries from them there, the compressors pool from them and the indexer scores
//! against them in place. Per layer the host still sends the small inputs the trait keeps as
//! slices (RMS-norm weights, RoPE cos / sin, attention entry indices, the compressors' slot
//! biases, routes) and receives what the model needs there: router scores, top-k selections,
//! and what an observer asks for (attention probabilities, raw index keys, tensors). Weights stay on their device in the stored
//! format ([`matrix::GpuMatrix`]); several devices are used by placing contiguous layer ranges on
//! each ([`GpuBackend::new`] takes the layer -> device map from `crate::devices::placement`).
//! [`Backend::transfer_bytes`] sums the executors' copy counters.
//!
//! Ops cannot return errors, so a failure (out of memory, a failed launch) is recorded, the op's
//! outputs are filled with NaN where possible (a device output is overwritten with NaNs, best
//! effort), and the engine turns the record into an error after the layer
//! ([`Backend::take_error`]). GEMM precision is chosen at construction: [`GemmType::Bf16`]
//! (bf16 operands, f32 accumulation: the serving engines' numerics and the fast path) or
//! [`GemmType::F32`] (f32 operands: matches the CPU reference up to summation order).

pub mod act;
pub mod attention;
pub mod cuda;
pub mod driver;
pub mod emu;
pub mod error;
pub mod executor;
pub mod experts;
mod experts_layout;
pub mod hyper;
pub mod indexer;
pub mod kernel_scan;
pub mod kernels;
pub mod matrix;
pub mod norm;
mod ops;
pub mod pool;
pub mod scores;
pub mod switches;
pub mod topk;

#[cfg(doc)]
use super::{Backend, Site};
pub use act::GpuAct;
pub use cuda::CudaExecutor;
pub use emu::EmuExecutor;
pub use executor::{Executor, GemmType, GpuError};
use matrix::DecodeBudget;
pub use matrix::GpuMatrix;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
pub use switches::GpuSwitches;

/// The backend on real GPUs.
pub type CudaBackend = GpuBackend<CudaExecutor>;
/// The backend on the host emulator.
pub type EmuBackend = GpuBackend<EmuExecutor>;

/// The GPU backend over one or more devices of executor type `E`.
pub struct GpuBackend<E: Executor> {
    devices: Vec<E>,
    /// Device index of each decoder layer; layers beyond its end use the last device.
    layer_device: Vec<usize>,
    /// Device of the current site.
    current: AtomicUsize,
    gemm: GemmType,
    error: Mutex<Option<String>>,
    /// Sparse attention as batched cuBLAS GEMMs over gathered entries instead of the
    /// one-thread-per-product kernels (`attention::sparse_attention`).
    attention_gemm: bool,
    /// Most bytes of gathered entries one tile of the GEMM attention holds.
    attention_tile_bytes: usize,
    /// Per device: the budget for decoded weight copies (`decoded`); None: no copies.
    decode_budgets: Vec<Option<Arc<DecodeBudget>>>,
    /// Routed experts as batched GEMMs over padded groups when their weights are resident
    /// (`experts::moe_experts`).
    moe_batched: bool,
    /// MoE calls that ran batched so far.
    moe_batched_calls: AtomicUsize,
}

impl<E: Executor> GpuBackend<E> {
    /// A backend over `devices` (at least one) placing decoder layer `i` on device
    /// `layer_device[i]` (empty: everything on the first device), with GEMMs in `gemm`.
    pub fn new(devices: Vec<E>, layer_device: Vec<usize>, gemm: GemmType) -> Self {
        assert!(!devices.is_empty(), "a GPU backend needs a device");
        let devices_len = devices.len();
        // Refused at the command line first when bad (run::target).
        let switches = GpuSwitches::or_default();
        assert!(
            layer_device.iter().all(|&d| d < devices.len()),
            "layer placed on a device that does not exist"
        );
        GpuBackend {
            devices,
            layer_device,
            current: AtomicUsize::new(0),
            gemm,
            error: Mutex::new(None),
            attention_gemm: switches.attention_gemm,
            attention_tile_bytes: matrix::WORKSPACE_BYTES,
            decode_budgets: vec![None; devices_len],
            moe_batched: switches.moe_batched,
            moe_batched_calls: AtomicUsize::new(0),
        }
    }

    /// The same backend running a MoE call's routed experts as batched GEMMs (per weight, one
    /// `cublasGemmBatchedEx` per size class of padded groups, `experts::BatchedLayout`) when
    /// all their weights are resident (`true`), or expert by expert (`false`, the default;
    /// `NEEDLESCOPE_MOE=batched` picks the batched GEMMs). Both give the same values up to the
    /// GEMMs' summation order.
    pub fn with_moe_batched(mut self, on: bool) -> Self {
        self.moe_batched = on;
        self
    }

    /// Whether routed experts run as batched GEMMs when their weights are resident.
    pub fn moe_batched(&self) -> bool {
        self.moe_batched
    }

    /// MoE calls that ran as batched GEMMs so far.
    pub fn moe_batched_calls(&self) -> usize {
        self.moe_batched_calls.load(Ordering::Relaxed)
    }

    fn count_moe_batched(&self) {
        self.moe_batched_calls.fetch_add(1, Ordering::Relaxed);
    }

    /// The same backend keeping decoded copies of the weights it loads from now on, up to
    /// `limits[i]` bytes on device `i` (0: none; see [`matrix`]'s decoded copies). Without this call no copies
    /// are made and every quantised product decodes band by band.
    pub fn with_decode_budgets(mut self, limits: &[usize]) -> Self {
        assert_eq!(
            limits.len(),
            self.devices.len(),
            "one decode budget per device"
        );
        self.decode_budgets = limits
            .iter()
            .map(|&l| (l > 0).then(|| DecodeBudget::new(l)))
            .collect();
        self
    }

    /// Per device with a budget: `(device name, bytes held by decoded copies, budget, copies)`.
    pub fn decode_cache_use(&self) -> Vec<(String, usize, usize, usize)> {
        self.devices
            .iter()
            .zip(&self.decode_budgets)
            .filter_map(|(e, b)| {
                b.as_ref()
                    .map(|b| (e.name(), b.used(), b.limit(), b.copies()))
            })
            .collect()
    }

    /// The same backend with sparse attention on batched GEMMs (`true`) or on the per-product
    /// kernels (`false`, the default; `NEEDLESCOPE_ATTENTION=gemm` picks the GEMMs). The GEMM
    /// path sums in cuBLAS's order (f32), so it matches the CPU to rounding, not bit for bit.
    pub fn with_attention_gemm(mut self, on: bool) -> Self {
        self.attention_gemm = on;
        self
    }

    /// Whether sparse attention runs as batched GEMMs.
    pub fn attention_gemm(&self) -> bool {
        self.attention_gemm
    }

    /// The same backend with GEMM-attention tiles of at most `bytes` of gathered entries
    /// (at least one query a tile; default [`matrix::WORKSPACE_BYTES`]). Results do not depend
    /// on it; tests use small tiles to cross tile edges.
    pub fn with_attention_tile_bytes(mut self, bytes: usize) -> Self {
        self.attention_tile_bytes = bytes;
        self
    }

    /// A single-device backend.
    pub fn single(device: E, gemm: GemmType) -> Self {
        Self::new(vec![device], Vec::new(), gemm)
    }

    pub fn devices(&self) -> &[E] {
        &self.devices
    }

    pub fn gemm_type(&self) -> GemmType {
        self.gemm
    }

    /// Index of the current site's device.
    pub fn current_index(&self) -> usize {
        self.current.load(Ordering::Relaxed)
    }

    /// The current site's device.
    pub fn dev(&self) -> &E {
        &self.devices[self.current_index()]
    }

    /// Records a failure (the first one is kept until [`Backend::take_error`]).
    pub fn fail(&self, what: &str, e: GpuError) {
        let mut slot = self.error.lock().unwrap();
        if slot.is_none() {
            *slot = Some(format!("{what} on {}: {e}", self.dev().name()));
        }
    }

    /// Settles an op's result: on failure records it and fills `outputs` with NaN.
    fn settle(&self, what: &str, r: Result<(), GpuError>, outputs: &mut [&mut [f32]]) {
        if let Err(e) = r {
            self.fail(what, e);
            for o in outputs.iter_mut() {
                o.fill(f32::NAN);
            }
        }
    }
}

/// The activation type of `GpuBackend<E>`.
pub type Act<E> = GpuAct<<E as Executor>::Buf>;
