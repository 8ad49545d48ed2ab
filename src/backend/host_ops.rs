//! [`HostOps`]: every [`Backend`] op on host slices, for tests and the parity checks.
//!
//! The model keeps activations as [`Backend::Act`] (device memory on a GPU) and moves values to
//! the host only where it needs them. Tests and `backend::parity` compare one op at a time on
//! host data, so this adapter uploads the inputs (`act_from`), runs the op and reads the outputs
//! back (`act_read`): the op itself is the backend's, unchanged. Each method is the op's name
//! with `_host` and the op's argument list with host slices in place of activations.

use super::{
    AttentionBatch, AttentionProbs, Backend, FfnWeights, HcParams, HcWeights, IndexScoreBatch,
    PoolLayout, RawIndexQueries, Routes,
};
use crate::numerics::profiles::IndexProfile;
use crate::numerics::rope::RopeTable;

/// Host-slice forms of the activation ops of any [`Backend`] (blanket implementation).
pub trait HostOps: Backend {
    /// Uploads a host slice as an activation.
    fn act_of(&self, x: &[f32]) -> Self::Act {
        self.act_from(x.to_vec())
    }

    /// Reads a whole activation into `out` (same length).
    fn act_to(&self, a: &Self::Act, out: &mut [f32]) {
        self.act_read(a, 0, out)
    }

    fn gather_rows_host(&self, table: &Self::Matrix, rows: &[usize], out: &mut [f32]) {
        let mut o = self.act_zeros(out.len());
        self.gather_rows(table, rows, &mut o);
        self.act_to(&o, out);
    }

    fn matmul_host(&self, x: &[f32], w: &Self::Matrix, y: &mut [f32]) {
        let mut o = self.act_zeros(y.len());
        self.matmul(&self.act_of(x), w, &mut o);
        self.act_to(&o, y);
    }

    fn matmul_grouped_host(&self, x: &[f32], groups: usize, w: &Self::Matrix, y: &mut [f32]) {
        let mut o = self.act_zeros(y.len());
        self.matmul_grouped(&self.act_of(x), groups, w, &mut o);
        self.act_to(&o, y);
    }

    fn add_assign_host(&self, x: &mut [f32], y: &[f32]) {
        let mut a = self.act_of(x);
        self.add_assign(&mut a, &self.act_of(y));
        self.act_to(&a, x);
    }

    fn rms_norm_host(&self, x: &mut [f32], dim: usize, weight: Option<&[f32]>, eps: f32) {
        let mut a = self.act_of(x);
        self.rms_norm(&mut a, dim, weight, eps);
        self.act_to(&a, x);
    }

    fn rope_host(
        &self,
        table: &RopeTable,
        x: &mut [f32],
        vec_len: usize,
        positions: &[usize],
        inverse: bool,
    ) {
        let mut a = self.act_of(x);
        self.rope(table, &mut a, vec_len, positions, inverse);
        self.act_to(&a, x);
    }

    fn hc_pre_host(
        &self,
        streams: &[f32],
        site: &HcWeights<'_, Self::Matrix>,
        params: &HcParams,
        input: &mut [f32],
        post: &mut [f32],
        comb: &mut [f32],
    ) {
        let (mut i, mut p, mut c) = (
            self.act_zeros(input.len()),
            self.act_zeros(post.len()),
            self.act_zeros(comb.len()),
        );
        self.hc_pre(&self.act_of(streams), site, params, &mut i, &mut p, &mut c);
        self.act_to(&i, input);
        self.act_to(&p, post);
        self.act_to(&c, comb);
    }

    fn hc_post_host(&self, streams: &mut [f32], y: &[f32], post: &[f32], comb: &[f32], n: usize) {
        let mut s = self.act_of(streams);
        let (y, post, comb) = (self.act_of(y), self.act_of(post), self.act_of(comb));
        self.hc_post(&mut s, &y, &post, &comb, n);
        self.act_to(&s, streams);
    }

    fn hc_head_host(
        &self,
        streams: &[f32],
        site: &HcWeights<'_, Self::Matrix>,
        params: &HcParams,
        out: &mut [f32],
    ) {
        let mut o = self.act_zeros(out.len());
        self.hc_head(&self.act_of(streams), site, params, &mut o);
        self.act_to(&o, out);
    }

    fn compressor_pool_host(
        &self,
        values: &[f32],
        logits: &[f32],
        ape: &[f32],
        layout: PoolLayout,
        out: &mut [f32],
    ) {
        let mut o = self.act_zeros(out.len());
        let (v, l) = (self.act_of(values), self.act_of(logits));
        self.compressor_pool(&v, &l, ape, layout, &mut o);
        self.act_to(&o, out);
    }

    fn kv_fp8_sim_host(&self, rows: &mut [f32], row_len: usize, nope_dims: usize) {
        let mut a = self.act_of(rows);
        self.kv_fp8_sim(&mut a, row_len, nope_dims);
        self.act_to(&a, rows);
    }

    fn index_prepare_keys_host(
        &self,
        profile: IndexProfile,
        raw: &[f32],
        dim: usize,
        prepared: &mut [f32],
        scales: &mut [f32],
    ) {
        let (mut p, mut s) = (self.act_zeros(prepared.len()), self.act_zeros(scales.len()));
        self.index_prepare_keys(profile, &self.act_of(raw), dim, &mut p, &mut s);
        self.act_to(&p, prepared);
        self.act_to(&s, scales);
    }

    fn index_prepare_queries_host(
        &self,
        raw: &RawIndexQueries<'_>,
        values: &mut [f32],
        weights: &mut [f32],
    ) {
        let (mut v, mut w) = (self.act_zeros(values.len()), self.act_zeros(weights.len()));
        let (q, wr) = (self.act_of(raw.queries), self.act_of(raw.weights));
        self.index_prepare_queries(&raw.with_tensors(&q, &wr), &mut v, &mut w);
        self.act_to(&v, values);
        self.act_to(&w, weights);
    }

    fn index_scores_batch_host(&self, batch: &IndexScoreBatch<'_>, out: &mut [f32]) {
        let mut o = self.act_zeros(out.len());
        let (q, w) = (self.act_of(batch.queries), self.act_of(batch.weights));
        let (k, ks) = (self.act_of(batch.keys), self.act_of(batch.key_scales));
        self.index_scores_batch(&batch.with_tensors(&q, &w, &k, &ks), &mut o);
        self.act_to(&o, out);
    }

    fn topk_batch_host(&self, scores: &[f32], stride: usize, visible: &[usize], out: &mut [i32]) {
        self.topk_batch(&self.act_of(scores), stride, visible, out);
    }

    fn sparse_attention_host(
        &self,
        batch: &AttentionBatch<'_>,
        out: &mut [f32],
        probs: &mut [Option<AttentionProbs>],
    ) {
        let q = self.act_of(batch.queries);
        let (w, c) = (self.act_of(batch.kv[0]), self.act_of(batch.kv[1]));
        let mut o = self.act_zeros(out.len());
        self.sparse_attention(&batch.with_tensors(&q, [&w, &c]), &mut o, probs);
        self.act_to(&o, out);
    }

    fn router_scores_host(&self, u: &[f32], gate: &Self::Matrix, out: &mut [f32]) {
        self.router_scores(&self.act_of(u), gate, out);
    }

    fn moe_experts_host(
        &self,
        u: &[f32],
        routes: &Routes<'_>,
        experts: &[FfnWeights<Self::Matrix>],
        swiglu_limit: f32,
        out: &mut [f32],
    ) {
        let mut o = self.act_zeros(out.len());
        self.moe_experts(&self.act_of(u), routes, experts, swiglu_limit, &mut o);
        self.act_to(&o, out);
    }

    fn ffn_host(
        &self,
        u: &[f32],
        ffn: &FfnWeights<Self::Matrix>,
        swiglu_limit: f32,
        out: &mut [f32],
    ) {
        let mut o = self.act_zeros(out.len());
        self.ffn(&self.act_of(u), ffn, swiglu_limit, &mut o);
        self.act_to(&o, out);
    }

    fn swiglu_host(&self, gate: &mut [f32], up: &[f32], limit: f32) {
        let mut g = self.act_of(gate);
        self.swiglu(&mut g, &self.act_of(up), limit);
        self.act_to(&g, gate);
    }
}

impl<B: Backend + ?Sized> HostOps for B {}
