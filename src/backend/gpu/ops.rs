//! [`Backend`] for [`GpuBackend`]: each op hands its device activations to the op family's
//! module (`matrix`, `norm`, `hyper`, `indexer`, `scores`, `topk`, `attention`, `experts`) on the
//! device of its weight or the current [`Site`]'s, and records a failure instead of returning
//! it (see the parent module's docs); host slices are uploaded, results the model needs on the
//! host downloaded.

use super::executor::{upload, Executor, GemmType};
use super::{attention, experts, hyper, indexer, matrix, norm, topk, Act, GpuBackend, GpuMatrix};
use crate::backend::{
    AttentionBatch, AttentionProbs, Backend, FfnWeights, HcParams, HcWeights, IndexScoreBatch,
    OpTime, PoolLayout, RawIndexQueries, Routes, Site,
};
use crate::checkpoint::linear::SharedLinear;
use crate::checkpoint::CheckpointError;
use crate::numerics::profiles::{IndexProfile, PreparedQuery};
use crate::numerics::rope::RopeTable;
use std::borrow::Cow;
use std::sync::atomic::Ordering;

impl<E: Executor> Backend for GpuBackend<E> {
    type Matrix = GpuMatrix<E::Buf>;
    type Act = Act<E>;

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

    fn transfer_bytes(&self) -> (u64, u64) {
        self.devices.iter().fold((0, 0), |(h, d), e| {
            let (h2d, d2h) = e.transfer_bytes();
            (h + h2d, d + d2h)
        })
    }

    fn resident_notes(&self) -> Vec<String> {
        use crate::units::human_bytes;
        self.decode_cache_use()
            .into_iter()
            .map(|(name, used, limit, copies)| {
                format!(
                    "{name}: {copies} decoded weight copies, {} of a {} budget",
                    human_bytes(used as u64),
                    human_bytes(limit as u64)
                )
            })
            .collect()
    }

    fn device_memory(&self) -> Vec<crate::backend::DeviceMemoryUse> {
        let copies = self.decode_cache_use();
        self.devices
            .iter()
            .filter_map(|e| {
                let memory = e.memory_use()?;
                let device = e.name();
                let decoded_copies = copies.iter().find(|c| c.0 == device).map_or(0, |c| c.1);
                Some(crate::backend::DeviceMemoryUse {
                    device,
                    memory,
                    decoded_copies,
                })
            })
            .collect()
    }

    fn reset_memory_peaks(&self) {
        for e in &self.devices {
            e.reset_memory_peaks();
        }
    }

    fn op_profile(&self) -> Vec<OpTime> {
        merge_profiles(self.devices.iter().map(|e| e.op_profile()))
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

    fn act_from(&self, data: Vec<f32>) -> Act<E> {
        self.act_upload(&data)
    }

    fn act_zeros(&self, len: usize) -> Act<E> {
        self.act_alloc(len)
    }

    fn act_uninit(&self, len: usize) -> Act<E> {
        self.act_alloc_uninit(len)
    }

    fn act_len(&self, a: &Act<E>) -> usize {
        a.len()
    }

    fn act_read(&self, a: &Act<E>, start: usize, out: &mut [f32]) {
        self.act_download(a, start, out)
    }

    fn act_append(&self, a: &mut Act<E>, tail: &Act<E>) {
        let r = self.append(a, tail);
        self.settle_acts("act_append", r, &mut [a]);
    }

    fn act_drop_front(&self, a: &mut Act<E>, n: usize) {
        let r = self.drop_front(a, n);
        self.settle_acts("act_drop_front", r, &mut [a]);
    }

    fn act_to_site(&self, a: &mut Act<E>) {
        let d = self.current_index();
        if let Err(e) = self.migrate(a, d) {
            self.fail("activation move", e);
        }
    }

    fn act_host<'a>(&self, a: &'a Act<E>) -> Cow<'a, [f32]> {
        let mut out = vec![0f32; a.len()];
        self.act_download(a, 0, &mut out);
        Cow::Owned(out)
    }

    fn upload_matrix(&self, data: Vec<f32>, rows: usize, cols: usize) -> Self::Matrix {
        let stored = upload(self.dev(), &data).map_err(|e| self.fail("upload", e));
        matrix::decoded(stored.ok(), rows, cols, self.current_index())
    }

    fn upload_linear(&self, w: SharedLinear) -> Result<Self::Matrix, CheckpointError> {
        // Validate the stored bytes the way the CPU's streamed residency does (the first scale
        // block decodes), so bad data fails at load on every backend.
        let probe = w.rows().min(w.row_alignment());
        w.decode_rows(0..probe)?;
        let device = self.current_index();
        let budget = self.decode_budgets[device].clone();
        let stored = matrix::upload_stored(self.dev(), device, &w);
        stored
            .map(|m| m.with_decode_budget(budget))
            .map_err(|e| CheckpointError::Device {
                tensor: w.module().to_string(),
                device: self.dev().name(),
                why: e.to_string(),
            })
    }

    fn matrix_shape(&self, m: &Self::Matrix) -> (usize, usize) {
        (m.rows, m.cols)
    }

    fn gather_rows(&self, table: &Self::Matrix, rows: &[usize], out: &mut Act<E>) {
        let r = matrix::gather_rows(self, table, rows, out);
        self.settle_acts("gather_rows", r, &mut [out]);
    }

    fn matmul(&self, x: &Act<E>, w: &Self::Matrix, y: &mut Act<E>) {
        let m = x.len() / w.cols.max(1);
        assert_eq!(x.len(), m * w.cols, "matmul: x not [T, in]");
        assert_eq!(y.len(), m * w.rows, "matmul: y not [T, out]");
        let r = (|| {
            let xb = self.on(x, w.device)?;
            let yb = self.output(y, w.device)?;
            matrix::matmul_into(self.dev_of(w), self.gemm, &xb, m, w, yb)
        })();
        self.settle_acts("matmul", r, &mut [y]);
    }

    fn matmul_grouped(&self, x: &Act<E>, groups: usize, w: &Self::Matrix, y: &mut Act<E>) {
        let m = x.len() / (groups * w.cols).max(1);
        assert_eq!(
            x.len(),
            m * groups * w.cols,
            "matmul_grouped: x not [T, G·in]"
        );
        assert_eq!(y.len(), m * w.rows, "matmul_grouped: y not [T, G·out]");
        let r = (|| {
            let xb = self.on(x, w.device)?;
            let yb = self.output(y, w.device)?;
            matrix::matmul_grouped_into(self.dev_of(w), self.gemm, &xb, m, groups, w, yb)
        })();
        self.settle_acts("matmul_grouped", r, &mut [y]);
    }

    fn add_assign(&self, x: &mut Act<E>, y: &Act<E>) {
        let r = norm::add_assign(self, x, y);
        self.settle_acts("add_assign", r, &mut [x]);
    }

    fn rms_norm(&self, x: &mut Act<E>, dim: usize, weight: Option<&[f32]>, eps: f32) {
        let r = norm::rms_norm(self, x, dim, weight, eps);
        self.settle_acts("rms_norm", r, &mut [x]);
    }

    fn rope(
        &self,
        table: &RopeTable,
        x: &mut Act<E>,
        vec_len: usize,
        positions: &[usize],
        inverse: bool,
    ) {
        let r = norm::rope(self, table, x, vec_len, positions, inverse);
        self.settle_acts("rope", r, &mut [x]);
    }

    fn hc_pre(
        &self,
        streams: &Act<E>,
        site: &HcWeights<'_, Self::Matrix>,
        params: &HcParams,
        input: &mut Act<E>,
        post: &mut Act<E>,
        comb: &mut Act<E>,
    ) {
        let r = hyper::hc_pre(self, streams, site, params, input, post, comb);
        self.settle_acts("hc_pre", r, &mut [input, post, comb]);
    }

    fn hc_post(&self, streams: &mut Act<E>, y: &Act<E>, post: &Act<E>, comb: &Act<E>, n: usize) {
        let r = hyper::hc_post(self, streams, y, post, comb, n);
        self.settle_acts("hc_post", r, &mut [streams]);
    }

    fn hc_head(
        &self,
        streams: &Act<E>,
        site: &HcWeights<'_, Self::Matrix>,
        params: &HcParams,
        out: &mut Act<E>,
    ) {
        let r = hyper::hc_head(self, streams, site, params, out);
        self.settle_acts("hc_head", r, &mut [out]);
    }

    fn compressor_pool(
        &self,
        values: &Act<E>,
        logits: &Act<E>,
        ape: &[f32],
        layout: PoolLayout,
        out: &mut Act<E>,
    ) {
        let r = norm::compressor_pool(self, values, logits, ape, layout, out);
        self.settle_acts("compressor_pool", r, &mut [out]);
    }

    fn kv_fp8_sim(&self, rows: &mut Act<E>, row_len: usize, nope_dims: usize) {
        let r = norm::kv_fp8_sim(self, rows, row_len, nope_dims);
        self.settle_acts("kv_fp8_sim", r, &mut [rows]);
    }

    fn index_prepare_keys(
        &self,
        profile: IndexProfile,
        raw: &Act<E>,
        dim: usize,
        prepared: &mut Act<E>,
        scales: &mut Act<E>,
    ) {
        let r = indexer::index_prepare_keys(self, profile, raw, dim, prepared, scales);
        self.settle_acts("index_prepare_keys", r, &mut [prepared, scales]);
    }

    fn index_prepare_query(
        &self,
        profile: IndexProfile,
        q_raw: &[f32],
        weights_raw: &[f32],
        heads: usize,
        dim: usize,
    ) -> PreparedQuery {
        indexer::index_prepare_query(self, profile, q_raw, weights_raw, heads, dim).unwrap_or_else(
            |e| {
                self.fail("index_prepare_query", e);
                indexer::nan_query(heads, dim)
            },
        )
    }

    fn index_prepare_queries(
        &self,
        raw: &RawIndexQueries<'_, Act<E>>,
        values: &mut Act<E>,
        weights: &mut Act<E>,
    ) {
        let r = indexer::index_prepare_queries(self, raw, values, weights);
        self.settle_acts("index_prepare_queries", r, &mut [values, weights]);
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

    fn index_scores_batch(&self, batch: &IndexScoreBatch<'_, Act<E>>, out: &mut Act<E>) {
        let r = indexer::index_scores_batch(self, batch, out);
        self.settle_acts("index_scores_batch", r, &mut [out]);
    }

    fn topk_batch(&self, scores: &Act<E>, stride: usize, visible: &[usize], out: &mut [i32]) {
        if let Err(e) = topk::topk_batch(self, scores, stride, visible, out) {
            self.fail("topk_batch", e);
            out.fill(-1);
        }
    }

    fn topk(&self, scores: &[f32], out: &mut [i32]) {
        if let Err(e) = topk::topk(self, scores, out) {
            self.fail("topk", e);
            out.fill(-1);
        }
    }

    fn sparse_attention(
        &self,
        batch: &AttentionBatch<'_, Act<E>>,
        out: &mut Act<E>,
        probs: &mut [Option<AttentionProbs>],
    ) {
        let r = attention::sparse_attention(self, batch, out, probs);
        self.settle_acts("sparse_attention", r, &mut [out]);
    }

    fn router_scores(&self, u: &Act<E>, gate: &Self::Matrix, out: &mut [f32]) {
        let r = experts::router_scores(self, u, gate, out);
        self.settle("router_scores", r, &mut [out]);
    }

    fn moe_experts(
        &self,
        u: &Act<E>,
        routes: &Routes<'_>,
        experts: &[FfnWeights<Self::Matrix>],
        swiglu_limit: f32,
        out: &mut Act<E>,
    ) {
        let r = experts::moe_experts(self, u, routes, experts, swiglu_limit, out);
        self.settle_acts("moe_experts", r, &mut [out]);
    }

    fn ffn(&self, u: &Act<E>, ffn: &FfnWeights<Self::Matrix>, swiglu_limit: f32, out: &mut Act<E>) {
        let r = experts::ffn(self, u, ffn, swiglu_limit, out);
        self.settle_acts("ffn", r, &mut [out]);
    }

    fn swiglu(&self, gate: &mut Act<E>, up: &Act<E>, limit: f32) {
        let r = norm::swiglu(self, gate, up, limit);
        self.settle_acts("swiglu", r, &mut [gate]);
    }
}

/// Sums the rows of several devices' profiles by operation, in name order.
fn merge_profiles(profiles: impl Iterator<Item = Vec<OpTime>>) -> Vec<OpTime> {
    let mut by_op: std::collections::BTreeMap<String, (u64, f64)> = Default::default();
    for row in profiles.flatten() {
        let e = by_op.entry(row.op).or_insert((0, 0.0));
        e.0 += row.calls;
        e.1 += row.seconds;
    }
    by_op
        .into_iter()
        .map(|(op, (calls, seconds))| OpTime { op, calls, seconds })
        .collect()
}
