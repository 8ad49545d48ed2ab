//! The GPU backend's sparse attention and MoE ops on the host emulator against the CPU
//! reference: sparse attention with sink (ragged entries shared between queries, probabilities
//! for some queries only, large logits, dominant sinks), the entry deduplication by index and
//! the gather of each entry from its cache (window or compressed rows), router scores
//! (always an f32 GEMM), the shared-expert FFN and the routed experts (uneven routes, an unused
//! expert, a token routed twice to one expert) with f32 weights and with the stored formats of a
//! synthetic official checkpoint (FP4 experts, FP8 shared expert).
//!
//! Tolerances (max |gpu - cpu| / max |cpu|): attention outputs 1e-6, probabilities 1e-6
//! absolute (the kernels repeat the CPU's f32 operations; only expf ulps could differ);
//! router 1e-5 under both GEMM types; FFN / MoE 1e-5 under `GemmType::F32` (GEMM summation
//! order) and 3e-2 under `GemmType::Bf16` (bf16 operands), which must differ from the CPU.

use needlescope_testkit::engine as engine_support;

use emu_support::{gap, norm_err};
use engine_support::synth_model;
use needlescope::backend::gpu::attention::EntryTable;
use needlescope::backend::gpu::{EmuBackend, EmuExecutor, GemmType};
use needlescope::backend::{
    AttentionBatch, AttentionProbs, Backend, CpuBackend, FfnWeights, HostOps, Routes,
};
use needlescope::checkpoint::{Checkpoint, WeightFormat};
use needlescope::synth::Preset;
use needlescope_testkit::emu as emu_support;

fn random(n: usize, seed: u64) -> Vec<f32> {
    needlescope::numerics::rng::Rng::new(seed).signed_n(n)
}

fn scaled(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    random(n, seed).into_iter().map(|v| v * scale).collect()
}

/// Where `a` and `b` differ most, for failure messages.
fn worst(a: &[f32], b: &[f32]) -> String {
    let i = (0..a.len())
        .max_by(|&i, &j| (a[i] - b[i]).abs().total_cmp(&(a[j] - b[j]).abs()))
        .unwrap_or(0);
    format!("worst at [{i}]: gpu {} cpu {}", a[i], b[i])
}

fn gpu(ty: GemmType) -> EmuBackend {
    EmuBackend::single(EmuExecutor::default(), ty)
}

// ---------------------------------------------------------------- attention

/// Entries of query t (indices into `nw` window rows followed by `nc` compressed rows): a
/// sliding window of up to 4 rows ending at row t + 2, then a ragged pseudo-random set of
/// compressed rows (shared between queries); query 3 attends nothing.
fn entry_lists(nw: usize, nc: usize, tokens: usize) -> Vec<Vec<u32>> {
    (0..tokens)
        .map(|t| {
            if t == 3 {
                return Vec::new();
            }
            let end = (t + 3).min(nw);
            let window = (end.saturating_sub(4)..end).map(|r| r as u32);
            let compressed = (0..(t * 5 + 1) % 9).map(|j| (nw + (t * 7 + j * 3) % nc) as u32);
            window.chain(compressed).collect()
        })
        .collect()
}

fn check_attention(d: usize, kv_scale: f32, sinks: &[f32]) {
    let (h, tokens) = (sinks.len(), 7);
    let win = scaled(10 * d, 1 + d as u64, kv_scale);
    let comp = scaled(13 * d, 2 + d as u64, kv_scale);
    let queries = scaled(tokens * h * d, 3 + d as u64, kv_scale);
    let entries = entry_lists(10, 13, tokens);
    let want_probs = [true, false, true, true, false, false, true];
    let batch = AttentionBatch {
        heads: h,
        head_dim: d,
        scale: (d as f32).powf(-0.5),
        sinks,
        queries: queries.as_slice(),
        kv: [win.as_slice(), comp.as_slice()],
        entries: &entries,
        want_probs: &want_probs,
    };
    let cpu = CpuBackend::new();
    let mut want = vec![0f32; tokens * h * d];
    let mut want_p = vec![None; tokens];
    cpu.sparse_attention_host(&batch, &mut want, &mut want_p);
    let g = gpu(GemmType::F32);
    let mut got = vec![f32::NAN; tokens * h * d];
    // Stale records must be cleared where probabilities are not wanted.
    let mut got_p = vec![Some(AttentionProbs::default()); tokens];
    g.sparse_attention_host(&batch, &mut got, &mut got_p);
    assert!(g.take_error().is_none());
    let e = norm_err(&got, &want);
    let mut pe = 0f32;
    for t in 0..tokens {
        match (&got_p[t], &want_p[t]) {
            (None, None) => assert!(!want_probs[t]),
            (Some(a), Some(b)) => {
                assert_eq!(
                    a.probs.len(),
                    h * entries[t].len(),
                    "query {t}: probs shape"
                );
                assert_eq!(a.sink.len(), h, "query {t}: sink shape");
                let got_all = [&a.probs[..], &a.sink[..]].concat();
                let want_all = [&b.probs[..], &b.sink[..]].concat();
                // Absolute: probabilities are in [0, 1].
                let q = got_all
                    .iter()
                    .zip(&want_all)
                    .fold(0f32, |m, (&x, &y)| m.max(gap(x, y)));
                assert!(
                    q <= 1e-6,
                    "d={d} query {t}: probability error {q}, {} (probs then sinks)",
                    worst(&got_all, &want_all)
                );
                pe = pe.max(q);
            }
            (a, b) => panic!("query {t}: probs {a:?} where the CPU gives {b:?}"),
        }
    }
    eprintln!("attention d={d} kv_scale={kv_scale}: out error {e:e}, probs error {pe:e}");
    assert!(e <= 1e-6, "d={d}: output error {e}, {}", worst(&got, &want));
    // The inputs are not degenerate: outputs are non-zero; large logits give peaked softmaxes.
    assert!(want.iter().any(|v| v.abs() > 1e-3));
    let peak = want_p
        .iter()
        .flatten()
        .flat_map(|p| p.probs.iter().chain(&p.sink))
        .fold(0f32, |m, &v| m.max(v));
    assert!(kv_scale <= 1.0 || peak > 0.99, "peak probability {peak}");
}

#[test]
fn sparse_attention_matches_cpu() {
    // head_dim 64 (8-lane dot, no tail) and 44 (tail of 4); logits of O(1) and O(100); one
    // sink dominating, one very negative.
    check_attention(64, 1.0, &[0.5, -1.0, 2.0, 0.0]);
    check_attention(44, 1.0, &[0.1, 3.0, -2.0]);
    check_attention(64, 12.0, &[80.0, -200.0, 5.0, 0.0]);
}

#[test]
fn attention_entries_are_deduplicated_by_index() {
    let (nw, nc) = (10, 13);
    let entries = entry_lists(nw, nc, 7);
    let table = EntryTable::build(&entries, [nw, nc]).unwrap();
    let mut distinct: Vec<u32> = entries.iter().flatten().copied().collect();
    let total = distinct.len();
    distinct.sort();
    distinct.dedup();
    assert!(distinct.len() < total, "the test batch shares entries");
    // Each distinct row once, ascending: the window rows, then the compressed rows rebased.
    let window = distinct.iter().filter(|&&i| (i as usize) < nw).count();
    assert!(0 < window && window < distinct.len(), "both caches");
    let rebase = |i: u32| i as i32 - if (i as usize) < nw { 0 } else { nw as i32 };
    let ids: Vec<i32> = distinct.iter().map(|&i| rebase(i)).collect();
    assert_eq!((table.window, &table.ids), (window, &ids));
    assert_eq!(table.emax, entries.iter().map(Vec::len).max().unwrap());
    for (t, list) in entries.iter().enumerate() {
        assert_eq!(table.count[t] as usize, list.len());
        for e in 0..table.emax {
            let id = table.index[t * table.emax + e];
            match list.get(e) {
                Some(i) => assert_eq!(distinct[id as usize], *i, "query {t} entry {e}"),
                None => assert_eq!(id, -1),
            }
        }
    }
}

#[test]
fn attention_gathers_each_entry_from_its_cache() {
    // One entry per query and a sink far below every logit: the softmax weight is exactly 1, so
    // each output head is the attended row, bit for bit. Rows of both caches, shared between
    // queries, the first and last of each; the window cache was grown by an append (its buffer
    // is longer than its rows).
    let (d, h, nw, nc) = (12, 2, 5, 7);
    let all = random((nw + nc) * d, 8);
    let picks = [0u32, 4, 5, 11, 5, 4, 8, 0];
    let entries: Vec<Vec<u32>> = picks.iter().map(|&i| vec![i]).collect();
    let tokens = picks.len();
    let g = gpu(GemmType::F32);
    let mut kv0 = g.act_of(&all[..2 * d]);
    g.act_append(&mut kv0, &g.act_of(&all[2 * d..nw * d]));
    let kv1 = g.act_of(&all[nw * d..]);
    let queries = g.act_of(&random(tokens * h * d, 10));
    let want_probs = vec![true; tokens];
    let batch = AttentionBatch {
        heads: h,
        head_dim: d,
        scale: 1.0,
        sinks: &[-1e30; 2],
        queries: &queries,
        kv: [&kv0, &kv1],
        entries: &entries,
        want_probs: &want_probs,
    };
    let mut out = g.act_zeros(tokens * h * d);
    let mut probs = vec![None; tokens];
    g.sparse_attention(&batch, &mut out, &mut probs);
    assert!(g.take_error().is_none());
    let out = g.act_into_host(out);
    for (t, &i) in picks.iter().enumerate() {
        let row = &all[i as usize * d..(i as usize + 1) * d];
        for head in 0..h {
            let at = (t * h + head) * d;
            assert_eq!(&out[at..at + d], row, "query {t} (entry {i}) head {head}");
        }
        let p = probs[t].as_ref().expect("probabilities wanted");
        assert_eq!((&p.probs[..], &p.sink[..]), (&[1.0; 2][..], &[0.0; 2][..]));
    }
}

// ---------------------------------------------------------------- router, FFN, MoE

#[test]
fn router_scores_use_an_f32_gemm_under_both_gemm_types() {
    let (t, d, e) = (9, 72, 12);
    // |logits| up to ~60: both softplus branches (linear above 20, log1p(exp) below).
    let u = scaled(t * d, 11, 4.0);
    let gate = random(e * d, 12);
    let cpu = CpuBackend::new();
    let mut want = vec![0f32; t * e];
    cpu.router_scores_host(&u, &cpu.upload_matrix(gate.clone(), e, d), &mut want);
    let mut raw = vec![0f32; t * e];
    cpu.matmul_host(&u, &cpu.upload_matrix(gate.clone(), e, d), &mut raw);
    assert!(raw.iter().any(|&z| z > 20.0) && raw.iter().any(|&z| z < -5.0));
    for ty in [GemmType::F32, GemmType::Bf16] {
        let g = gpu(ty);
        let mut got = vec![0f32; t * e];
        g.router_scores_host(&u, &g.upload_matrix(gate.clone(), e, d), &mut got);
        assert!(g.take_error().is_none());
        let err = norm_err(&got, &want);
        eprintln!("router {ty:?}: error {err:e}");
        assert!(
            err <= 1e-5,
            "{ty:?}: router error {err}, {}",
            worst(&got, &want)
        );
    }
}

fn ffn_of<B: Backend>(b: &B, w: &[Vec<f32>; 3], d: usize, inter: usize) -> FfnWeights<B::Matrix> {
    FfnWeights {
        w1: b.upload_matrix(w[0].clone(), inter, d),
        w2: b.upload_matrix(w[1].clone(), d, inter),
        w3: b.upload_matrix(w[2].clone(), inter, d),
    }
}

fn tolerance(ty: GemmType) -> f32 {
    match ty {
        GemmType::F32 => 1e-5,
        GemmType::Bf16 => 3e-2,
    }
}

/// Checks one GPU result against the CPU's under `ty`'s tolerance; bf16 must differ.
fn check(what: &str, ty: GemmType, got: &[f32], want: &[f32]) {
    let err = norm_err(got, want);
    eprintln!("{what} {ty:?}: error {err:e}");
    assert!(
        err <= tolerance(ty),
        "{what} {ty:?}: error {err}, {}",
        worst(got, want)
    );
    assert!(
        ty == GemmType::F32 || err > 0.0,
        "{what}: bf16 GEMMs match f32 exactly?"
    );
}

/// Routes of `tokens` tokens over `n_experts`, k = 3: expert `n_experts - 2` never chosen,
/// token 1 picks expert 0 twice, weights positive and uneven.
/// Three slots for each of 7 tokens: expert 0 takes 15 of the 21 (padded to 16), experts 1-3
/// two each, so the batched path has two size classes (two batched GEMMs per weight).
fn skewed_routes(tokens: usize) -> Vec<usize> {
    assert_eq!(tokens, 7, "the counts below are for 7 tokens");
    let skewed: Vec<usize> = (0..tokens * 3)
        .map(|s| if s % 7 < 5 { 0 } else { 1 + s % 3 })
        .collect();
    assert_eq!(skewed.iter().filter(|&&x| x == 0).count(), 15);
    skewed
}

fn uneven_routes(tokens: usize, n_experts: usize) -> (Vec<usize>, Vec<f32>) {
    let k = 3;
    let skip = n_experts - 2;
    let mut experts = Vec::new();
    for t in 0..tokens {
        for s in 0..k {
            let mut x = (t * 2 + s * s + 1) % n_experts;
            if x == skip {
                x = 0;
            }
            experts.push(if t == 1 && s != 1 { 0 } else { x });
        }
    }
    assert!(!experts.contains(&skip) && experts[3] == 0 && experts[5] == 0);
    let weights = random(tokens * k, 77)
        .iter()
        .map(|v| 0.3 + v.abs())
        .collect();
    (experts, weights)
}

#[test]
fn ffn_and_routed_experts_match_cpu_with_f32_weights() {
    let (t, d, inter, n_experts, limit) = (7, 40, 24, 5, 2.5f32);
    let u = scaled(t * d, 21, 1.5);
    let weights: Vec<[Vec<f32>; 3]> = (0..n_experts as u64 + 1)
        .map(|i| {
            [
                random(inter * d, 100 + i),
                random(d * inter, 200 + i),
                random(inter * d, 300 + i),
            ]
        })
        .collect();
    let (experts, route_w) = uneven_routes(t, n_experts);
    let routes = Routes {
        per_token: 3,
        experts: &experts,
        weights: &route_w,
    };
    let cpu = CpuBackend::new();
    let cpu_experts: Vec<_> = weights[..n_experts]
        .iter()
        .map(|w| ffn_of(&cpu, w, d, inter))
        .collect();
    let cpu_shared = ffn_of(&cpu, &weights[n_experts], d, inter);
    let (mut want_moe, mut want_ffn) = (vec![0f32; t * d], vec![0f32; t * d]);
    cpu.moe_experts_host(&u, &routes, &cpu_experts, limit, &mut want_moe);
    cpu.ffn_host(&u, &cpu_shared, limit, &mut want_ffn);
    // The clamp is exercised: some gate pre-activations exceed the limit.
    let mut gate = vec![0f32; t * inter];
    cpu.matmul_host(&u, &cpu_shared.w1, &mut gate);
    assert!(gate.iter().any(|&v| v > limit) && gate.iter().any(|v| v.abs() < limit));
    for ty in [GemmType::F32, GemmType::Bf16] {
        let g = gpu(ty);
        let gpu_experts: Vec<_> = weights[..n_experts]
            .iter()
            .map(|w| ffn_of(&g, w, d, inter))
            .collect();
        let gpu_shared = ffn_of(&g, &weights[n_experts], d, inter);
        let (mut got_moe, mut got_ffn) = (vec![f32::NAN; t * d], vec![f32::NAN; t * d]);
        g.moe_experts_host(&u, &routes, &gpu_experts, limit, &mut got_moe);
        g.ffn_host(&u, &gpu_shared, limit, &mut got_ffn);
        assert!(g.take_error().is_none());
        check("moe f32 weights", ty, &got_moe, &want_moe);
        check("ffn f32 weights", ty, &got_ffn, &want_ffn);
    }
}

fn load_ffn<B: Backend>(
    b: &B,
    ckpt: &Checkpoint,
    prefix: &str,
    d: usize,
    inter: usize,
) -> FfnWeights<B::Matrix> {
    let lin = |name: &str, out: usize, input: usize| {
        let w = ckpt
            .shared_linear(&format!("{prefix}.{name}"), out, input)
            .unwrap();
        b.upload_linear(w).unwrap()
    };
    FfnWeights {
        w1: lin("w1", inter, d),
        w2: lin("w2", d, inter),
        w3: lin("w3", inter, d),
    }
}

#[test]
fn moe_ops_match_cpu_with_stored_checkpoint_formats() {
    let m = synth_model(Preset::Tiny, WeightFormat::Official, Some(1), Some(4));
    let cfg = m.ckpt.config();
    let (d, inter, n_experts) = (
        cfg.hidden_size,
        cfg.moe_intermediate_size,
        cfg.n_routed_experts,
    );
    let limit = cfg.swiglu_limit as f32;
    let p = "layers.0.ffn";
    let kind = |module: &str, out: usize, input: usize| {
        m.ckpt
            .shared_linear(module, out, input)
            .unwrap()
            .view()
            .kind()
    };
    assert_eq!(kind(&format!("{p}.experts.0.w1"), inter, d), "fp4-group");
    assert_eq!(
        kind(&format!("{p}.shared_experts.w2"), d, inter),
        "fp8-block"
    );
    let t = 6;
    let u = scaled(t * d, 31, 2.0);
    let (experts, route_w) = uneven_routes(t, n_experts);
    let routes = Routes {
        per_token: 3,
        experts: &experts,
        weights: &route_w,
    };
    let cpu = CpuBackend::new();
    let cpu_experts: Vec<_> = (0..n_experts)
        .map(|i| load_ffn(&cpu, &m.ckpt, &format!("{p}.experts.{i}"), d, inter))
        .collect();
    let cpu_shared = load_ffn(&cpu, &m.ckpt, &format!("{p}.shared_experts"), d, inter);
    let gate = m
        .ckpt
        .shared_linear(&format!("{p}.gate"), n_experts, d)
        .unwrap();
    let mut want = [
        vec![0f32; t * d],
        vec![0f32; t * d],
        vec![0f32; t * n_experts],
    ];
    cpu.moe_experts_host(&u, &routes, &cpu_experts, limit, &mut want[0]);
    cpu.ffn_host(&u, &cpu_shared, limit, &mut want[1]);
    cpu.router_scores_host(&u, &cpu.upload_linear(gate.clone()).unwrap(), &mut want[2]);
    for ty in [GemmType::F32, GemmType::Bf16] {
        let g = gpu(ty);
        let gpu_experts: Vec<_> = (0..n_experts)
            .map(|i| load_ffn(&g, &m.ckpt, &format!("{p}.experts.{i}"), d, inter))
            .collect();
        let gpu_shared = load_ffn(&g, &m.ckpt, &format!("{p}.shared_experts"), d, inter);
        let mut got = [
            vec![f32::NAN; t * d],
            vec![f32::NAN; t * d],
            vec![f32::NAN; t * n_experts],
        ];
        g.moe_experts_host(&u, &routes, &gpu_experts, limit, &mut got[0]);
        g.ffn_host(&u, &gpu_shared, limit, &mut got[1]);
        g.router_scores_host(&u, &g.upload_linear(gate.clone()).unwrap(), &mut got[2]);
        assert!(g.take_error().is_none());
        check("moe stored", ty, &got[0], &want[0]);
        check("ffn stored", ty, &got[1], &want[1]);
        let err = norm_err(&got[2], &want[2]);
        eprintln!("router stored {ty:?}: error {err:e}");
        assert!(
            err <= 1e-5,
            "router stored {ty:?}: error {err}, {}",
            worst(&got[2], &want[2])
        );
    }
}

#[test]
fn moe_failure_is_recorded_and_output_is_nan() {
    let g = EmuBackend::single(EmuExecutor::new(0, 64 << 10), GemmType::F32);
    let (d, inter) = (16, 8);
    let w = [
        random(inter * d, 1),
        random(d * inter, 2),
        random(inter * d, 3),
    ];
    let experts = vec![ffn_of(&g, &w, d, inter)];
    assert!(g.take_error().is_none());
    // 300 tokens of 16 values: the input and output activations (2 x 19.2 KB) fit in 64 KiB
    // next to the weights, the experts' intermediates (another ~58 KB) do not.
    let t = 300;
    let u = random(t * d, 4);
    let (ids, rw) = (vec![0usize; t], vec![1.0f32; t]);
    let routes = Routes {
        per_token: 1,
        experts: &ids,
        weights: &rw,
    };
    let mut out = vec![0f32; t * d];
    g.moe_experts_host(&u, &routes, &experts, 10.0, &mut out);
    assert!(out.iter().all(|v| v.is_nan()));
    let e = g.take_error().expect("error recorded");
    assert!(e.contains("moe_experts"), "{e}");
}

/// Routed experts as batched GEMMs over padded groups (`with_moe_batched`): the same values as
/// expert by expert, bit for bit on the emulator (every output element is the same dot
/// product), with an unused expert and a token choosing one expert twice; and routing so
/// skewed that padding would more than double the rows falls back to expert by expert.
#[test]
fn batched_routed_experts_match_expert_by_expert() {
    use needlescope::backend::gpu::experts::BatchedLayout;
    let (t, d, inter, n_experts, limit) = (7, 40, 24, 5, 2.5f32);
    let u = scaled(t * d, 31, 1.5);
    let weights: Vec<[Vec<f32>; 3]> = (0..n_experts as u64)
        .map(|i| {
            [
                random(inter * d, 400 + i),
                random(d * inter, 500 + i),
                random(inter * d, 600 + i),
            ]
        })
        .collect();
    let (uneven, route_w) = uneven_routes(t, n_experts);
    let skewed = skewed_routes(t);
    let layout = BatchedLayout::new(&[15, 2, 2, 2]);
    assert_eq!(layout.classes.len(), 2);
    assert_eq!((layout.rows, layout.starts.clone()), (22, vec![6, 0, 2, 4]));
    for (experts, expect_batched) in [(&uneven, true), (&skewed, true)] {
        let routes = Routes {
            per_token: 3,
            experts,
            weights: &route_w,
        };
        let one_by_one = gpu(GemmType::F32);
        let batched = gpu(GemmType::F32).with_moe_batched(true);
        let mut outs = Vec::new();
        for g in [&one_by_one, &batched] {
            let ws: Vec<_> = weights.iter().map(|w| ffn_of(g, w, d, inter)).collect();
            let mut out = vec![f32::NAN; t * d];
            g.moe_experts_host(&u, &routes, &ws, limit, &mut out);
            assert!(g.take_error().is_none());
            outs.push(out);
        }
        assert!(outs[0].iter().all(|v| v.is_finite()));
        let same = outs[0]
            .iter()
            .zip(&outs[1])
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "batched differs: {}", worst(&outs[1], &outs[0]));
        assert_eq!(one_by_one.moe_batched_calls(), 0);
        assert_eq!(batched.moe_batched_calls(), expect_batched as usize);
    }
}

/// The batched experts with bf16 GEMMs over decoded copies of a checkpoint's FP4 experts
/// (the serving configuration): bf16 operands are 2 bytes, so a size class's row offsets
/// must count in the operand type. Same bits as expert by expert, over two size classes.
#[test]
fn batched_bf16_experts_from_a_checkpoint_match_expert_by_expert() {
    let m = synth_model(Preset::Tiny, WeightFormat::Official, Some(1), Some(4));
    let cfg = m.ckpt.config();
    let (d, inter, limit) = (
        cfg.hidden_size,
        cfg.moe_intermediate_size,
        cfg.swiglu_limit as f32,
    );
    let p = "layers.0.ffn";
    let t = 7;
    let u = scaled(t * d, 31, 1.5);
    let skewed = skewed_routes(t);
    let route_w: Vec<f32> = random(t * 3, 77).iter().map(|v| 0.3 + v.abs()).collect();
    let routes = Routes {
        per_token: 3,
        experts: &skewed,
        weights: &route_w,
    };
    let mut outs = Vec::new();
    let mut calls = Vec::new();
    for batched in [false, true] {
        let g = gpu(GemmType::Bf16)
            .with_decode_budgets(&[64 << 20])
            .with_moe_batched(batched);
        let experts: Vec<_> = (0..4)
            .map(|i| load_ffn(&g, &m.ckpt, &format!("{p}.experts.{i}"), d, inter))
            .collect();
        let mut out = vec![f32::NAN; t * d];
        g.moe_experts_host(&u, &routes, &experts, limit, &mut out);
        assert!(g.take_error().is_none());
        outs.push(out);
        calls.push(g.moe_batched_calls());
    }
    assert_eq!(calls, [0, 1]);
    assert!(outs[0].iter().all(|v| v.is_finite()));
    let same = outs[0]
        .iter()
        .zip(&outs[1])
        .all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(same, "batched differs: {}", worst(&outs[1], &outs[0]));
}

#[test]
fn padded_groups_stay_under_one_and_a_half_times_the_rows_in_few_sizes() {
    use needlescope::backend::gpu::experts::{padded_group_rows, BatchedLayout, SizeClass};
    let series: Vec<usize> = (1..=26).map(padded_group_rows).collect();
    assert_eq!(
        series,
        [
            1, 2, 3, 4, 6, 6, 8, 8, 12, 12, 12, 12, 16, 16, 16, 16, 24, 24, 24, 24, 24, 24, 24, 24,
            32, 32
        ]
    );
    for n in 1..5000 {
        let p = padded_group_rows(n);
        assert!(p >= n && 2 * p < 3 * n + 2, "{n} rows padded to {p}");
    }
    // 2,048 tokens on 256 experts, 6 slots each, unevenly: every expert's rows, few sizes.
    let counts: Vec<usize> = (0..256).map(|x| 20 + (x * 37) % 60).collect();
    let l = BatchedLayout::new(&counts);
    let real: usize = counts.iter().sum();
    assert!(2 * l.rows < 3 * real, "{} padded rows for {real}", l.rows);
    assert!(l.classes.len() <= 5, "{:?}", l.classes.len());
    for (p, &n) in counts.iter().enumerate() {
        let class = l.classes.iter().find(|c| c.members.contains(&p)).unwrap();
        assert!(class.per >= n);
        let at = class.members.iter().position(|&q| q == p).unwrap();
        assert_eq!(l.starts[p], class.first + at * class.per, "expert {p}");
    }
    assert_eq!(
        BatchedLayout::new(&[3]).classes,
        vec![SizeClass {
            per: 3,
            first: 0,
            members: vec![0]
        }]
    );
}
