//! The GPU backend: [`Backend`] on CUDA devices, its op logic written once over an
//! [`Executor`] (the device layer) so that the host emulator runs it too.
//!
//! - [`CudaBackend`] = `GpuBackend<CudaExecutor>`: one or more GPUs (driver API via cudarc,
//!   kernels from `kernels/*.cu` compiled by NVRTC for the device's architecture, cuBLAS GEMMs).
//! - [`EmuBackend`] = `GpuBackend<EmuExecutor>`: the same kernels compiled for the host by
//!   build.rs; CI runs every op and whole forwards through it against the CPU reference.
//!
//! Activations arrive and leave as host f32 slices (the [`Backend`] contract); each op uploads
//! its inputs, runs its kernels and GEMMs on the device of the current [`Site`] and downloads its
//! outputs. Weights stay on their device in the stored format ([`matrix::GpuMatrix`]). Several
//! devices are used by placing contiguous layer ranges on each ([`GpuBackend::new`] takes the
//! layer -> device map from `crate::placement`); the hidden state moves between devices through
//! the host with the activations.
//!
//! Ops cannot return errors, so a failure (out of memory, a failed launch) is recorded, the op's
//! outputs are filled with NaN, and the engine turns the record into an error after the layer
//! ([`Backend::take_error`]). GEMM precision is chosen at construction: [`GemmType::Bf16`]
//! (bf16 operands, f32 accumulation: the serving engines' numerics and the fast path) or
//! [`GemmType::F32`] (f32 operands: matches the CPU reference up to summation order).

pub mod attention;
pub mod cuda;
pub mod emu;
pub mod executor;
pub mod experts;
pub mod hyper;
pub mod indexer;
pub mod kernel_scan;
pub mod kernels;
pub mod matrix;
pub mod norm;
pub mod topk;

pub use cuda::CudaExecutor;
pub use emu::EmuExecutor;
pub use executor::{Executor, GemmType, GpuError};
pub use matrix::GpuMatrix;

use super::{
    AttentionBatch, AttentionProbs, Backend, FfnWeights, HcParams, HcWeights, Routes, Site,
};
use crate::checkpoint::linear::SharedLinear;
use crate::checkpoint::CheckpointError;
use crate::model::rope::RopeTable;
use crate::numerics::profiles::{IndexProfile, PreparedQuery};
use executor::{download, upload};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

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
}

impl<E: Executor> GpuBackend<E> {
    /// A backend over `devices` (at least one) placing decoder layer `i` on device
    /// `layer_device[i]` (empty: everything on the first device), with GEMMs in `gemm`.
    pub fn new(devices: Vec<E>, layer_device: Vec<usize>, gemm: GemmType) -> Self {
        assert!(!devices.is_empty(), "a GPU backend needs a device");
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
        }
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

    /// Uploads f32 values to the current device.
    pub fn up(&self, x: &[f32]) -> Result<E::Buf, GpuError> {
        upload(self.dev(), x)
    }

    /// Uploads i32 values to the current device.
    pub fn up_i32(&self, x: &[i32]) -> Result<E::Buf, GpuError> {
        upload(self.dev(), x)
    }

    /// Downloads f32 values from the current device.
    pub fn down(&self, b: &E::Buf, out: &mut [f32]) -> Result<(), GpuError> {
        download(self.dev(), b, out)
    }

    /// An f32 buffer of `n` zeros on the current device.
    pub fn zeros(&self, n: usize) -> Result<E::Buf, GpuError> {
        self.dev().alloc(n * 4)
    }

    /// The device (executor) holding `m`.
    pub fn dev_of(&self, m: &GpuMatrix<E::Buf>) -> &E {
        &self.devices[m.device]
    }

    fn upload_stored(&self, w: &SharedLinear) -> Result<GpuMatrix<E::Buf>, GpuError> {
        let view = w.view();
        let e = self.dev();
        let (data, scale): (&[u8], Option<&[u8]>) = match view {
            crate::checkpoint::linear::QuantWeight::Bf16 { data, .. }
            | crate::checkpoint::linear::QuantWeight::F32 { data, .. } => (data, None),
            crate::checkpoint::linear::QuantWeight::Fp8Block { weight, scale, .. } => {
                (weight, Some(scale))
            }
            crate::checkpoint::linear::QuantWeight::Fp4Group { packed, scale, .. }
            | crate::checkpoint::linear::QuantWeight::Nvfp4 { packed, scale, .. } => {
                (packed, Some(scale))
            }
        };
        Ok(GpuMatrix {
            rows: w.rows(),
            cols: w.cols(),
            device: self.current_index(),
            form: view.form(),
            data: Some(upload(e, data)?),
            scale: scale.map(|s| upload(e, s)).transpose()?,
        })
    }
}

impl<E: Executor> Backend for GpuBackend<E> {
    type Matrix = GpuMatrix<E::Buf>;

    fn name(&self) -> &'static str {
        E::KIND
    }

    fn reference_gemm_tflops(&self) -> Option<(String, f64)> {
        // Flash-sized on a GPU; small on the emulator (a CPU loop).
        let s = if E::KIND == "cuda" { 8192 } else { 256 };
        let e = &self.devices[0];
        matrix::gemm_tflops(e, s, s, s, GemmType::Bf16, 10)
            .ok()
            .map(|t| (format!("bf16 GEMM {s}x{s}x{s} on {}", e.name()), t))
    }

    fn take_error(&self) -> Option<String> {
        self.error.lock().unwrap().take()
    }

    fn enter_site(&self, site: Site) {
        let last_layer = self.layer_device.last().copied().unwrap_or(0);
        let d = match site {
            Site::Embed => self.layer_device.first().copied().unwrap_or(0),
            Site::Layer(i) => self.layer_device.get(i).copied().unwrap_or(last_layer),
            Site::Head => last_layer,
        };
        self.current.store(d, Ordering::Relaxed);
    }

    fn upload_matrix(&self, data: Vec<f32>, rows: usize, cols: usize) -> Self::Matrix {
        let stored = upload(self.dev(), &data);
        if let Err(e) = &stored {
            self.fail("upload", GpuError::Other(e.to_string()));
        }
        GpuMatrix {
            rows,
            cols,
            device: self.current_index(),
            form: crate::checkpoint::linear::LinearForm::F32,
            data: stored.ok(),
            scale: None,
        }
    }

    fn upload_linear(&self, w: SharedLinear) -> Result<Self::Matrix, CheckpointError> {
        // Validate the stored bytes the way the CPU's streamed residency does (the first scale
        // block decodes), so bad data fails at load on every backend.
        let probe = w.rows().min(w.row_alignment());
        w.decode_rows(0..probe)?;
        self.upload_stored(&w).map_err(|e| CheckpointError::Device {
            tensor: w.module().to_string(),
            device: self.dev().name(),
            why: e.to_string(),
        })
    }

    fn matrix_shape(&self, m: &Self::Matrix) -> (usize, usize) {
        (m.rows, m.cols)
    }

    fn gather_rows(&self, table: &Self::Matrix, rows: &[usize], out: &mut [f32]) {
        let r = (|| {
            let e = self.dev_of(table);
            let ids: Vec<i32> = rows.iter().map(|&r| r as i32).collect();
            let ids = upload(e, &ids)?;
            let o = e.alloc(out.len() * 4)?;
            matrix::dequant_rows(e, table, Some(&ids), 0, rows.len(), &o, GemmType::F32)?;
            download(e, &o, out)
        })();
        self.settle("gather_rows", r, &mut [out]);
    }

    fn matmul(&self, x: &[f32], w: &Self::Matrix, y: &mut [f32]) {
        let r = (|| {
            let e = self.dev_of(w);
            let m = x.len() / w.cols.max(1);
            let xb = upload(e, x)?;
            let yb = matrix::matmul_device(e, self.gemm, &xb, m, w)?;
            download(e, &yb, y)
        })();
        self.settle("matmul", r, &mut [y]);
    }

    fn matmul_grouped(&self, x: &[f32], groups: usize, w: &Self::Matrix, y: &mut [f32]) {
        let r = (|| {
            let e = self.dev_of(w);
            let m = x.len() / (groups * w.cols).max(1);
            let xb = upload(e, x)?;
            let yb = matrix::matmul_grouped_device(e, self.gemm, &xb, m, groups, w)?;
            download(e, &yb, y)
        })();
        self.settle("matmul_grouped", r, &mut [y]);
    }

    fn rms_norm(&self, x: &mut [f32], dim: usize, weight: Option<&[f32]>, eps: f32) {
        if let Err(e) = norm::rms_norm(self, x, dim, weight, eps) {
            self.fail("rms_norm", e);
            x.fill(f32::NAN);
        }
    }

    fn rope(
        &self,
        table: &RopeTable,
        x: &mut [f32],
        vec_len: usize,
        positions: &[usize],
        inverse: bool,
    ) {
        if let Err(e) = norm::rope(self, table, x, vec_len, positions, inverse) {
            self.fail("rope", e);
            x.fill(f32::NAN);
        }
    }

    fn hc_pre(
        &self,
        streams: &[f32],
        site: &HcWeights<'_, Self::Matrix>,
        params: &HcParams,
        input: &mut [f32],
        post: &mut [f32],
        comb: &mut [f32],
    ) {
        let r = hyper::hc_pre(self, streams, site, params, input, post, comb);
        self.settle("hc_pre", r, &mut [input, post, comb]);
    }

    fn hc_post(&self, streams: &mut [f32], y: &[f32], post: &[f32], comb: &[f32], n: usize) {
        if let Err(e) = hyper::hc_post(self, streams, y, post, comb, n) {
            self.fail("hc_post", e);
            streams.fill(f32::NAN);
        }
    }

    fn hc_head(
        &self,
        streams: &[f32],
        site: &HcWeights<'_, Self::Matrix>,
        params: &HcParams,
        out: &mut [f32],
    ) {
        let r = hyper::hc_head(self, streams, site, params, out);
        self.settle("hc_head", r, &mut [out]);
    }

    fn compressor_pool(
        &self,
        values: &[f32],
        logits: &[f32],
        slots: usize,
        width: usize,
        out: &mut [f32],
    ) {
        let r = norm::compressor_pool(self, values, logits, slots, width, out);
        self.settle("compressor_pool", r, &mut [out]);
    }

    fn kv_fp8_sim(&self, rows: &mut [f32], row_len: usize, nope_dims: usize) {
        if let Err(e) = norm::kv_fp8_sim(self, rows, row_len, nope_dims) {
            self.fail("kv_fp8_sim", e);
            rows.fill(f32::NAN);
        }
    }

    fn index_prepare_keys(
        &self,
        profile: IndexProfile,
        raw: &[f32],
        dim: usize,
        prepared: &mut [f32],
        scales: &mut [f32],
    ) {
        let r = indexer::index_prepare_keys(self, profile, raw, dim, prepared, scales);
        self.settle("index_prepare_keys", r, &mut [prepared, scales]);
    }

    fn index_prepare_query(
        &self,
        profile: IndexProfile,
        q_raw: &[f32],
        weights_raw: &[f32],
        heads: usize,
        dim: usize,
    ) -> PreparedQuery {
        match indexer::index_prepare_query(self, profile, q_raw, weights_raw, heads, dim) {
            Ok(q) => q,
            Err(e) => {
                self.fail("index_prepare_query", e);
                PreparedQuery {
                    values: vec![f32::NAN; heads * dim],
                    weights: vec![f32::NAN; heads],
                    heads,
                    dim,
                }
            }
        }
    }

    fn index_prepare_queries(
        &self,
        profile: IndexProfile,
        q_raw: &[f32],
        weights_raw: &[f32],
        heads: usize,
        dim: usize,
        values: &mut [f32],
        weights: &mut [f32],
    ) {
        let r = indexer::index_prepare_queries(
            self,
            profile,
            q_raw,
            weights_raw,
            heads,
            dim,
            values,
            weights,
        );
        self.settle("index_prepare_queries", r, &mut [values, weights]);
    }

    fn index_scores(
        &self,
        profile: IndexProfile,
        query: &PreparedQuery,
        keys: &[f32],
        key_scales: &[f32],
        dim: usize,
        out: &mut [f32],
    ) {
        let r = indexer::index_scores(self, profile, query, keys, key_scales, dim, out);
        self.settle("index_scores", r, &mut [out]);
    }

    fn index_scores_batch(
        &self,
        profile: IndexProfile,
        queries: &[f32],
        weights: &[f32],
        heads: usize,
        dim: usize,
        keys: &[f32],
        key_scales: &[f32],
        visible: &[usize],
        out: &mut [f32],
    ) {
        let r = indexer::index_scores_batch(
            self, profile, queries, weights, heads, dim, keys, key_scales, visible, out,
        );
        self.settle("index_scores_batch", r, &mut [out]);
    }

    fn topk(&self, scores: &[f32], out: &mut [i32]) {
        if let Err(e) = indexer::topk(self, scores, out) {
            self.fail("topk", e);
            out.fill(-1);
        }
    }

    fn topk_batch(&self, scores: &[f32], stride: usize, visible: &[usize], out: &mut [i32]) {
        if let Err(e) = topk::topk_batch(self, scores, stride, visible, out) {
            self.fail("topk_batch", e);
            out.fill(-1);
        }
    }

    fn sparse_attention(
        &self,
        batch: &AttentionBatch<'_>,
        out: &mut [f32],
        probs: &mut [Option<AttentionProbs>],
    ) {
        let r = attention::sparse_attention(self, batch, out, probs);
        self.settle("sparse_attention", r, &mut [out]);
    }

    fn router_scores(&self, u: &[f32], gate: &Self::Matrix, out: &mut [f32]) {
        let r = experts::router_scores(self, u, gate, out);
        self.settle("router_scores", r, &mut [out]);
    }

    fn moe_experts(
        &self,
        u: &[f32],
        routes: &Routes<'_>,
        experts: &[FfnWeights<Self::Matrix>],
        swiglu_limit: f32,
        out: &mut [f32],
    ) {
        let r = experts::moe_experts(self, u, routes, experts, swiglu_limit, out);
        self.settle("moe_experts", r, &mut [out]);
    }

    fn ffn(&self, u: &[f32], ffn: &FfnWeights<Self::Matrix>, swiglu_limit: f32, out: &mut [f32]) {
        let r = experts::ffn(self, u, ffn, swiglu_limit, out);
        self.settle("ffn", r, &mut [out]);
    }

    fn swiglu(&self, gate: &mut [f32], up: &[f32], limit: f32) {
        if let Err(e) = norm::swiglu(self, gate, up, limit) {
            self.fail("swiglu", e);
            gate.fill(f32::NAN);
        }
    }
}
