//! Op-by-op parity: every [`Backend`] op of a backend under test against [`CpuBackend`] on the
//! same fresh pseudo-random inputs (never zeros), at dimensions given by [`OpDims`] (small ones
//! for the emulator, DeepSeek-V4-Flash ones on a GPU).
//!
//! Thresholds: exact (0) where the op reproduces the reference's rounding (gathers of decoded
//! weights, fp8 KV simulation, prepared index keys / queries, top-k on given scores); 1e-5 for
//! f32 arithmetic whose summation order may differ; `gemm_tolerance` (the caller's, by GEMM
//! precision) for ops built on weight products.

use super::{normalised_error, Check};
use crate::backend::{
    AttentionBatch, AttentionProbs, Backend, CpuBackend, FfnWeights, HcParams, HcWeights, HostOps,
    IndexScoreBatch, PoolLayout, RawIndexQueries, Routes,
};
use crate::numerics::profiles::IndexProfile;
use crate::numerics::rng::Rng;
use crate::numerics::rope::RopeTable;

/// Shapes of the op checks.
#[derive(Clone, Debug)]
pub struct OpDims {
    pub tokens: usize,
    pub hidden: usize,
    pub streams: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub rope_dim: usize,
    pub index_heads: usize,
    pub index_dim: usize,
    /// Compressed rows the index scores cover.
    pub rows: usize,
    pub topk: usize,
    pub experts: usize,
    pub per_token: usize,
    pub inter: usize,
    /// Attended entries per query (window + compressed).
    pub entries: usize,
}

impl OpDims {
    /// Small shapes (odd sizes on purpose) for the host emulator; the mHC mixes' inner
    /// dimension (streams x hidden = 2,080) is long enough for split-K products.
    pub fn small() -> Self {
        OpDims {
            tokens: 13,
            hidden: 520,
            streams: 4,
            heads: 4,
            head_dim: 40,
            rope_dim: 8,
            index_heads: 4,
            index_dim: 64,
            rows: 150,
            topk: 16,
            experts: 5,
            per_token: 2,
            inter: 48,
            entries: 37,
        }
    }

    /// DeepSeek-V4-Flash's dimensions (16 experts, a 256-token batch) for a GPU.
    pub fn flash() -> Self {
        OpDims {
            tokens: 256,
            hidden: 4096,
            streams: 4,
            heads: 64,
            head_dim: 512,
            rope_dim: 64,
            index_heads: 64,
            index_dim: 128,
            rows: 8192,
            topk: 512,
            experts: 16,
            per_token: 6,
            inter: 2048,
            entries: 640,
        }
    }
}

fn check(what: String, got: &[f32], want: &[f32], threshold: f64) -> Check {
    Check {
        what,
        error: normalised_error(got, want),
        threshold,
    }
}

fn exact_i32(what: String, got: &[i32], want: &[i32]) -> Check {
    let diff =
        got.iter().zip(want).filter(|(a, b)| a != b).count() + got.len().abs_diff(want.len());
    Check {
        what,
        error: diff as f64,
        threshold: 0.0,
    }
}

/// Runs every op on `b` and on the CPU reference; see the module doc for thresholds.
pub fn check_ops<B: Backend>(b: &B, dims: &OpDims, seed: u64, gemm_tolerance: f64) -> Vec<Check> {
    let cpu = CpuBackend::new();
    let mut r = Rng::new(seed);
    let mut out = Vec::new();
    let d = dims.hidden;
    let t = dims.tokens;

    // Weight products and gathers.
    let (rows, cols) = (3 * d / 2 + 5, d);
    let w = r.values(rows * cols, 0.05);
    let (wb, wc) = (
        b.upload_matrix(w.clone(), rows, cols),
        cpu.upload_matrix(w, rows, cols),
    );
    let x = r.values(t * cols, 1.0);
    let (mut got, mut want) = (vec![0f32; t * rows], vec![0f32; t * rows]);
    b.matmul_host(&x, &wb, &mut got);
    cpu.matmul_host(&x, &wc, &mut want);
    out.push(check(
        format!("matmul [{t}x{cols}]·[{rows}x{cols}]ᵀ"),
        &got,
        &want,
        gemm_tolerance,
    ));
    let ids: Vec<usize> = (0..7).map(|_| r.below(rows)).collect();
    let (mut got, mut want) = (vec![0f32; 7 * cols], vec![0f32; 7 * cols]);
    b.gather_rows_host(&wb, &ids, &mut got);
    cpu.gather_rows_host(&wc, &ids, &mut want);
    out.push(check("gather_rows".into(), &got, &want, 0.0));
    let groups = 4;
    let (go, gi) = (dims.inter / 2, d / 2);
    let wg = r.values(groups * go * gi, 0.05);
    let (wgb, wgc) = (
        b.upload_matrix(wg.clone(), groups * go, gi),
        cpu.upload_matrix(wg, groups * go, gi),
    );
    let xg = r.values(t * groups * gi, 1.0);
    let (mut got, mut want) = (vec![0f32; t * groups * go], vec![0f32; t * groups * go]);
    b.matmul_grouped_host(&xg, groups, &wgb, &mut got);
    cpu.matmul_grouped_host(&xg, groups, &wgc, &mut want);
    out.push(check(
        format!("matmul_grouped G={groups}"),
        &got,
        &want,
        gemm_tolerance,
    ));

    // Norms, RoPE, SwiGLU, KV fp8.
    let x = r.values(t * d, 3.0);
    let nw = r.values(d, 1.5);
    for weight in [None, Some(nw.as_slice())] {
        let (mut got, mut want) = (x.clone(), x.clone());
        b.rms_norm_host(&mut got, d, weight, 1e-6);
        cpu.rms_norm_host(&mut want, d, weight, 1e-6);
        out.push(check(
            format!("rms_norm weighted={}", weight.is_some()),
            &got,
            &want,
            1e-6,
        ));
    }
    let table = RopeTable::plain(dims.rope_dim, 10000.0);
    let positions: Vec<usize> = (0..t).map(|i| i * 977 + r.below(100_000)).collect();
    let x = r.values(t * 3 * dims.head_dim, 1.0);
    for inverse in [false, true] {
        let (mut got, mut want) = (x.clone(), x.clone());
        b.rope_host(&table, &mut got, dims.head_dim, &positions, inverse);
        cpu.rope_host(&table, &mut want, dims.head_dim, &positions, inverse);
        out.push(check(format!("rope inverse={inverse}"), &got, &want, 1e-6));
    }
    let up = r.values(t * dims.inter, 12.0);
    let gate = r.values(t * dims.inter, 12.0);
    let (mut got, mut want) = (gate.clone(), gate);
    b.swiglu_host(&mut got, &up, 10.0);
    cpu.swiglu_host(&mut want, &up, 10.0);
    out.push(check("swiglu limit 10".into(), &got, &want, 1e-6));
    let (addend, base) = (r.values(t * d, 1.0), r.values(t * d, 1.0));
    let (mut got, mut want) = (base.clone(), base);
    b.add_assign_host(&mut got, &addend);
    cpu.add_assign_host(&mut want, &addend);
    out.push(check("add_assign".into(), &got, &want, 0.0));
    let row_len = dims.head_dim;
    let nope = row_len - dims.rope_dim;
    let mut kv: Vec<f32> = r.values(t * row_len, 1.0);
    for (i, v) in kv.iter_mut().enumerate() {
        *v *= [1e-4f32, 1.0, 300.0, 2e3][i % 4];
    }
    let (mut got, mut want) = (kv.clone(), kv);
    b.kv_fp8_sim_host(&mut got, row_len, nope);
    cpu.kv_fp8_sim_host(&mut want, row_len, nope);
    out.push(check("kv_fp8_sim".into(), &got, &want, 0.0));

    // mHC.
    let n = dims.streams;
    let params = HcParams {
        streams: n,
        sinkhorn_iters: 20,
        norm_eps: 1e-6,
        hc_eps: 1e-6,
    };
    let streams = r.values(t * n * d, 1.0);
    let mix = r.values((2 + n) * n * n * d, 0.02);
    let base = r.values((2 + n) * n, 0.5);
    let scale = r.values(3, 1.0);
    let (mb, mc) = (
        b.upload_matrix(mix.clone(), (2 + n) * n, n * d),
        cpu.upload_matrix(mix, (2 + n) * n, n * d),
    );
    let (sb, sc) = (
        HcWeights {
            mix: &mb,
            base: &base,
            scale: &scale,
        },
        HcWeights {
            mix: &mc,
            base: &base,
            scale: &scale,
        },
    );
    let mut g = (vec![0f32; t * d], vec![0f32; t * n], vec![0f32; t * n * n]);
    let mut w = g.clone();
    b.hc_pre_host(&streams, &sb, &params, &mut g.0, &mut g.1, &mut g.2);
    cpu.hc_pre_host(&streams, &sc, &params, &mut w.0, &mut w.1, &mut w.2);
    out.push(check("hc_pre input".into(), &g.0, &w.0, 1e-4));
    out.push(check("hc_pre post".into(), &g.1, &w.1, 1e-4));
    out.push(check("hc_pre comb".into(), &g.2, &w.2, 1e-4));
    let y = r.values(t * d, 1.0);
    let (mut got, mut want) = (streams.clone(), streams.clone());
    b.hc_post_host(&mut got, &y, &w.1, &w.2, n);
    cpu.hc_post_host(&mut want, &y, &w.1, &w.2, n);
    out.push(check("hc_post".into(), &got, &want, 1e-6));
    let hmix = r.values(n * n * d, 0.02);
    let (hb, hc) = (
        b.upload_matrix(hmix.clone(), n, n * d),
        cpu.upload_matrix(hmix, n, n * d),
    );
    let (hbase, hscale) = (r.values(n, 0.5), r.values(1, 1.0));
    let (mut got, mut want) = (vec![0f32; t * d], vec![0f32; t * d]);
    b.hc_head_host(
        &streams,
        &HcWeights {
            mix: &hb,
            base: &hbase,
            scale: &hscale,
        },
        &params,
        &mut got,
    );
    cpu.hc_head_host(
        &streams,
        &HcWeights {
            mix: &hc,
            base: &hbase,
            scale: &hscale,
        },
        &params,
        &mut want,
    );
    out.push(check("hc_head".into(), &got, &want, 1e-4));

    // Compressor pooling from buffered token projections: the overlapping ratio-4 layout
    // (row 0 with and without its previous window) and a ratio-16 one without overlap, each
    // row's window away from the buffer's start.
    let c = dims.index_dim;
    let layouts = [
        (4, true, 0, false),
        (4, true, 4, true),
        (16, false, 16, false),
    ];
    for (ratio, overlap, first_window, first_has_previous) in layouts {
        let layout = PoolLayout {
            ratio,
            c,
            overlap,
            first_window,
            first_has_previous,
        };
        let width = layout.width();
        let rows = (t / ratio).max(2);
        let tokens = layout.tokens_needed(rows) + 3;
        let values = r.values(tokens * width, 1.0);
        let logits = r.values(tokens * width, 4.0);
        let ape = r.values(ratio * width, 2.0);
        let (mut got, mut want) = (vec![0f32; rows * c], vec![0f32; rows * c]);
        b.compressor_pool_host(&values, &logits, &ape, layout, &mut got);
        cpu.compressor_pool_host(&values, &logits, &ape, layout, &mut want);
        let name = format!("compressor_pool ratio {ratio} window at {first_window}");
        out.push(check(name, &got, &want, 1e-6));
    }

    out.extend(index_checks(b, &cpu, dims, &mut r));
    out.extend(attention_checks(b, &cpu, dims, &mut r));
    out.extend(expert_checks(b, &cpu, dims, &mut r, gemm_tolerance));
    out
}

fn index_checks<B: Backend>(b: &B, cpu: &CpuBackend, dims: &OpDims, r: &mut Rng) -> Vec<Check> {
    let mut out = Vec::new();
    let (h, dim, rows) = (dims.index_heads, dims.index_dim, dims.rows);
    let qn = dims.tokens.min(16);
    let raw_keys = r.values(rows * dim, 2.0);
    let raw_q = r.values(qn * h * dim, 2.0);
    let raw_w = r.values(qn * h, 1.0);
    for profile in IndexProfile::ALL {
        let name = profile.name();
        let (mut kb, mut kc) = (vec![0f32; rows * dim], vec![0f32; rows * dim]);
        let (mut sb, mut sc) = (vec![0f32; rows], vec![0f32; rows]);
        b.index_prepare_keys_host(profile, &raw_keys, dim, &mut kb, &mut sb);
        cpu.index_prepare_keys_host(profile, &raw_keys, dim, &mut kc, &mut sc);
        out.push(check(format!("index keys {name}"), &kb, &kc, 0.0));
        out.push(check(format!("index key scales {name}"), &sb, &sc, 0.0));
        let mut qv = Vec::new();
        let mut qw = Vec::new();
        for i in 0..qn {
            let q = &raw_q[i * h * dim..(i + 1) * h * dim];
            let wr = &raw_w[i * h..(i + 1) * h];
            let pb = b.index_prepare_query(profile, q, wr, h, dim);
            let pc = cpu.index_prepare_query(profile, q, wr, h, dim);
            if i == 0 {
                out.push(check(
                    format!("index query {name}"),
                    &pb.values,
                    &pc.values,
                    0.0,
                ));
                out.push(check(
                    format!("index weights {name}"),
                    &pb.weights,
                    &pc.weights,
                    0.0,
                ));
                let (mut gb, mut gc) = (vec![0f32; rows], vec![0f32; rows]);
                b.index_scores(profile, &pc, &kc, &sc, dim, &mut gb);
                cpu.index_scores(profile, &pc, &kc, &sc, dim, &mut gc);
                out.push(check(format!("index scores {name}"), &gb, &gc, 1e-5));
            }
            qv.extend_from_slice(&pc.values);
            qw.extend_from_slice(&pc.weights);
        }
        let visible: Vec<usize> = (0..qn).map(|i| rows - i * rows / (2 * qn)).collect();
        let (mut gb, mut gc) = (vec![0f32; qn * rows], vec![0f32; qn * rows]);
        let batch = IndexScoreBatch {
            profile,
            queries: &qv[..],
            weights: &qw[..],
            first: 0,
            heads: h,
            dim,
            keys: &kc[..],
            key_scales: &sc[..],
            visible: &visible,
        };
        b.index_scores_batch_host(&batch, &mut gb);
        cpu.index_scores_batch_host(&batch, &mut gc);
        out.push(check(format!("index scores batch {name}"), &gb, &gc, 1e-5));
        // All queries at once, as the model prepares them: exactly the one-by-one results.
        let (mut vb, mut wb) = (vec![0f32; qn * h * dim], vec![0f32; qn * h]);
        let raw = RawIndexQueries {
            profile,
            queries: &raw_q[..],
            weights: &raw_w[..],
            heads: h,
            dim,
        };
        b.index_prepare_queries_host(&raw, &mut vb, &mut wb);
        out.push(check(format!("index queries batch {name}"), &vb, &qv, 0.0));
        out.push(check(format!("index weights batch {name}"), &wb, &qw, 0.0));
        // The batch's top-k on the reference's scores (each query sees its own rows).
        let k = dims.topk;
        let (mut tb, mut tc) = (vec![0i32; qn * k], vec![0i32; qn * k]);
        b.topk_batch_host(&gc, rows, &visible, &mut tb);
        cpu.topk_batch_host(&gc, rows, &visible, &mut tc);
        out.push(exact_i32(format!("topk batch {name}"), &tb, &tc));
    }
    // Top-k on given scores, with ties, NaN and -inf, and fewer rows than k.
    let mut scores: Vec<f32> = (0..rows).map(|_| (r.value() * 8.0).round() / 8.0).collect();
    scores[rows / 3] = f32::NAN;
    scores[rows / 2] = f32::NEG_INFINITY;
    for (len, k) in [(rows, dims.topk), (rows, 1), (dims.topk / 2, dims.topk)] {
        let (mut gb, mut gc) = (vec![0i32; k], vec![0i32; k]);
        b.topk(&scores[..len], &mut gb);
        cpu.topk(&scores[..len], &mut gc);
        out.push(exact_i32(format!("topk rows={len} k={k}"), &gb, &gc));
    }
    out
}

fn attention_checks<B: Backend>(b: &B, cpu: &CpuBackend, dims: &OpDims, r: &mut Rng) -> Vec<Check> {
    let (h, hd, t) = (dims.heads, dims.head_dim, dims.tokens.min(32));
    let pool = dims.entries + t;
    let kv = r.values(pool * hd, 1.0);
    let queries = r.values(t * h * hd, 3.0);
    let sinks = r.values(h, 2.0);
    // Rows 0..pool/2 are the window's, the rest compressed rows: entries index both.
    let (window, compressed) = kv.split_at(pool / 2 * hd);
    let entries: Vec<Vec<u32>> = (0..t)
        .map(|i| {
            let n = dims.entries - (i * 7) % (dims.entries / 2);
            (0..n).map(|e| ((e + i) % pool) as u32).collect()
        })
        .collect();
    let want_probs: Vec<bool> = (0..t).map(|i| i % 3 == 1).collect();
    let batch = AttentionBatch {
        heads: h,
        head_dim: hd,
        scale: (hd as f32).powf(-0.5),
        sinks: &sinks,
        queries: queries.as_slice(),
        kv: [window, compressed],
        entries: &entries,
        want_probs: &want_probs,
    };
    let (mut gb, mut gc) = (vec![0f32; t * h * hd], vec![0f32; t * h * hd]);
    let mut pb: Vec<Option<AttentionProbs>> = vec![None; t];
    let mut pc: Vec<Option<AttentionProbs>> = vec![None; t];
    b.sparse_attention_host(&batch, &mut gb, &mut pb);
    cpu.sparse_attention_host(&batch, &mut gc, &mut pc);
    let flat = |p: &[Option<AttentionProbs>]| -> (Vec<f32>, Vec<f32>, usize) {
        let mut probs = Vec::new();
        let mut sink = Vec::new();
        let mut some = 0;
        for x in p.iter().flatten() {
            probs.extend_from_slice(&x.probs);
            sink.extend_from_slice(&x.sink);
            some += 1;
        }
        (probs, sink, some)
    };
    let (fb, fc) = (flat(&pb), flat(&pc));
    let mut out = vec![
        check("sparse_attention out".into(), &gb, &gc, 1e-5),
        check("sparse_attention probs".into(), &fb.0, &fc.0, 1e-5),
        check("sparse_attention sink share".into(), &fb.1, &fc.1, 1e-5),
    ];
    out.push(Check {
        what: "sparse_attention probs only where wanted".into(),
        error: fb.2.abs_diff(fc.2) as f64
            + pb.iter()
                .zip(&want_probs)
                .filter(|(p, w)| p.is_some() != **w)
                .count() as f64,
        threshold: 0.0,
    });
    out
}

fn ffn_weights<B: Backend>(b: &B, w: &[Vec<f32>; 3], d: usize, i: usize) -> FfnWeights<B::Matrix> {
    FfnWeights {
        w1: b.upload_matrix(w[0].clone(), i, d),
        w2: b.upload_matrix(w[1].clone(), d, i),
        w3: b.upload_matrix(w[2].clone(), i, d),
    }
}

fn expert_checks<B: Backend>(
    b: &B,
    cpu: &CpuBackend,
    dims: &OpDims,
    r: &mut Rng,
    tol: f64,
) -> Vec<Check> {
    let (d, i, e, k, t) = (
        dims.hidden,
        dims.inter,
        dims.experts,
        dims.per_token,
        dims.tokens,
    );
    let mut out = Vec::new();
    let u = r.values(t * d, 1.0);
    let gate = r.values(e * d, 0.05);
    let (gb, gc) = (
        b.upload_matrix(gate.clone(), e, d),
        cpu.upload_matrix(gate, e, d),
    );
    let (mut sb, mut sc) = (vec![0f32; t * e], vec![0f32; t * e]);
    b.router_scores_host(&u, &gb, &mut sb);
    cpu.router_scores_host(&u, &gc, &mut sc);
    out.push(check("router_scores".into(), &sb, &sc, 1e-5));
    let raw: Vec<[Vec<f32>; 3]> = (0..e)
        .map(|_| {
            [
                r.values(i * d, 0.05),
                r.values(d * i, 0.05),
                r.values(i * d, 0.05),
            ]
        })
        .collect();
    let eb: Vec<_> = raw.iter().map(|w| ffn_weights(b, w, d, i)).collect();
    let ec: Vec<_> = raw.iter().map(|w| ffn_weights(cpu, w, d, i)).collect();
    // Distinct experts per token; expert e-1 gets no token.
    let experts: Vec<usize> = (0..t)
        .flat_map(|tok| (0..k).map(move |s| (tok * 3 + s * 2) % (e - 1).max(1)))
        .collect();
    let weights = r.values(t * k, 1.0);
    let routes = Routes {
        per_token: k,
        experts: &experts,
        weights: &weights,
    };
    let (mut gb, mut gc) = (vec![0f32; t * d], vec![0f32; t * d]);
    b.moe_experts_host(&u, &routes, &eb, 10.0, &mut gb);
    cpu.moe_experts_host(&u, &routes, &ec, 10.0, &mut gc);
    out.push(check(format!("moe_experts E={e} k={k}"), &gb, &gc, tol));
    let (mut gb, mut gc) = (vec![0f32; t * d], vec![0f32; t * d]);
    b.ffn_host(&u, &eb[0], 10.0, &mut gb);
    cpu.ffn_host(&u, &ec[0], 10.0, &mut gc);
    out.push(check("ffn (shared expert)".into(), &gb, &gc, tol));
    out
}
