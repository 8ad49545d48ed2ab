//! MoE ops of the CPU backend (docs/spec/model.md 5): router scores, clamped SwiGLU, the routed experts
//! grouped by expert, and the dense shared expert.
//!
//! - `sqrtsoftplus(z) = sqrt(softplus(z))` with PyTorch's softplus (β = 1, linear above 20).
//! - SwiGLU: `g ← min(g, limit)` (upper clamp only), `v ← clamp(v, -limit, limit)`,
//!   `a = silu(g)·v`.
//! - Routed experts: tokens are grouped by expert (one GEMM triple per expert, experts in
//!   parallel); the route weight multiplies `a` before `w2` (as REF); each (token, slot) result
//!   lands in its own buffer and a token's slots are summed in slot order, so the sum is
//!   deterministic whatever the thread schedule or chunking. Only experts that some token of
//!   the chunk picked are multiplied, so a streamed expert is decoded only when it is routed.

use super::bf16_gemm::matmul_as;
use super::linalg::{matmul, CpuMatrix};
use crate::backend::gpu::GemmType;
use crate::backend::{FfnWeights, Routes};
use rayon::prelude::*;

/// PyTorch `softplus` (β = 1, threshold 20).
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

pub fn router_scores(u: &[f32], gate: &CpuMatrix, out: &mut [f32]) {
    matmul(u, gate, out);
    out.par_iter_mut().for_each(|v| *v = softplus(*v).sqrt());
}

pub fn swiglu(gate: &mut [f32], up: &[f32], limit: f32) {
    assert_eq!(gate.len(), up.len(), "swiglu: gate and up differ in length");
    for (g, &v) in gate.iter_mut().zip(up) {
        let g1 = g.min(limit);
        let silu = g1 / (1.0 + (-g1).exp());
        *g = silu * v.clamp(-limit, limit);
    }
}

/// `out [rows, D]` = FFN(x [rows, D]); `row_weights`, when given, scales each row of the
/// activation before the down projection.
fn ffn_rows(
    gemm: GemmType,
    x: &[f32],
    w: &FfnWeights<CpuMatrix>,
    limit: f32,
    row_weights: Option<&[f32]>,
    out: &mut [f32],
) {
    let inter = w.w1.rows();
    let rows = x.len() / w.w1.cols();
    let mut g = vec![0.0f32; rows * inter];
    let mut v = vec![0.0f32; rows * inter];
    matmul_as(gemm, x, &w.w1, &mut g);
    matmul_as(gemm, x, &w.w3, &mut v);
    swiglu(&mut g, &v, limit);
    if let Some(rw) = row_weights {
        for (a, &s) in g.chunks_exact_mut(inter).zip(rw) {
            a.iter_mut().for_each(|x| *x *= s);
        }
    }
    matmul_as(gemm, &g, &w.w2, out);
}

/// The shared expert (or a dense FFN) on every row, products of operand type `gemm`.
pub fn ffn(gemm: GemmType, u: &[f32], w: &FfnWeights<CpuMatrix>, limit: f32, out: &mut [f32]) {
    ffn_rows(gemm, u, w, limit, None, out);
}

pub fn moe_experts(
    gemm: GemmType,
    u: &[f32],
    routes: &Routes<'_>,
    experts: &[FfnWeights<CpuMatrix>],
    limit: f32,
    out: &mut [f32],
) {
    let k = routes.per_token;
    let tokens = routes.experts.len() / k.max(1);
    let d = u.len().checked_div(tokens).unwrap_or(0);
    assert_eq!(out.len(), tokens * d, "moe: out not [T, D]");
    assert_eq!(
        routes.weights.len(),
        routes.experts.len(),
        "moe: one weight per route"
    );
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); experts.len()];
    for (slot, &e) in routes.experts.iter().enumerate() {
        members[e].push(slot);
    }
    let results: Vec<(usize, Vec<f32>)> = members
        .par_iter()
        .enumerate()
        .filter(|(_, slots)| !slots.is_empty())
        .map(|(e, slots)| {
            let mut x = vec![0.0f32; slots.len() * d];
            for (dst, &slot) in x.chunks_exact_mut(d).zip(slots) {
                let t = slot / k;
                dst.copy_from_slice(&u[t * d..(t + 1) * d]);
            }
            let weights: Vec<f32> = slots.iter().map(|&s| routes.weights[s]).collect();
            let mut y = vec![0.0f32; slots.len() * d];
            ffn_rows(gemm, &x, &experts[e], limit, Some(&weights), &mut y);
            (e, y)
        })
        .collect();
    let mut per_slot = vec![0.0f32; tokens * k * d];
    for (e, y) in &results {
        for (row, &slot) in y.chunks_exact(d).zip(&members[*e]) {
            per_slot[slot * d..(slot + 1) * d].copy_from_slice(row);
        }
    }
    out.par_chunks_mut(d).enumerate().for_each(|(t, o)| {
        o.fill(0.0);
        for s in 0..k {
            let row = &per_slot[(t * k + s) * d..(t * k + s + 1) * d];
            o.iter_mut().zip(row).for_each(|(a, b)| *a += b);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softplus_is_linear_above_20_and_smooth_below() {
        assert_eq!(softplus(25.0), 25.0);
        assert!((softplus(0.0) - std::f32::consts::LN_2).abs() < 1e-7);
        assert!(softplus(-30.0) > 0.0);
    }

    #[test]
    fn swiglu_clamps_gate_above_only_and_up_both_ways() {
        let mut g = [20.0, -20.0];
        swiglu(&mut g, &[-50.0, 50.0], 10.0);
        let silu10 = 10.0 / (1.0 + (-10.0f32).exp());
        assert!((g[0] - silu10 * -10.0).abs() < 1e-4, "{g:?}");
        let silu_m20 = -20.0 / (1.0 + 20.0f32.exp());
        assert!((g[1] - silu_m20 * 10.0).abs() < 1e-9, "{g:?}");
    }

    fn expert(scale: f32) -> FfnWeights<CpuMatrix> {
        // D = 2, I = 2: w1 = w3 = scale·I, w2 = I.
        let eye = |s: f32| CpuMatrix::new(vec![s, 0.0, 0.0, s], 2, 2);
        FfnWeights {
            w1: eye(scale),
            w2: eye(1.0),
            w3: eye(scale),
        }
    }

    #[test]
    fn routed_output_is_the_weighted_sum_of_expert_outputs() {
        let experts = vec![expert(1.0), expert(2.0), expert(3.0)];
        let u = [0.5f32, -1.0, 1.0, 2.0];
        let routes = Routes {
            per_token: 2,
            experts: &[0, 2, 1, 0],
            weights: &[0.25, 0.75, 1.0, 0.5],
        };
        let mut out = vec![0.0; 4];
        moe_experts(GemmType::F32, &u, &routes, &experts, 10.0, &mut out);
        for t in 0..2 {
            let x = &u[t * 2..t * 2 + 2];
            let mut want = [0.0f32; 2];
            for s in 0..2 {
                let e = routes.experts[t * 2 + s];
                let mut y = vec![0.0; 2];
                ffn(GemmType::F32, x, &experts[e], 10.0, &mut y);
                for c in 0..2 {
                    want[c] += routes.weights[t * 2 + s] * y[c];
                }
            }
            for c in 0..2 {
                assert!((out[t * 2 + c] - want[c]).abs() < 1e-5, "token {t}");
            }
        }
    }
}
