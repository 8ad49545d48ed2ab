//! The GPU backend's lightning indexer on the host emulator against the CPU reference: prepared
//! keys and queries bit for bit in every index profile (random rows plus rows built to hit
//! rounding ties, saturation, amax floors, subnormals and zeros), scores within a normalised
//! error (raw, unprepared inputs on either side scored in f32), batched scores with ragged
//! visibility equal to the per-query path (from a key cache longer than the visible rows), and
//! top-k identical to `CpuBackend::topk` (ties, NaN, infinities, short rows, 32K rows).

use needlescope::backend::gpu::indexer::index_scores_batch_tiled;
use needlescope::backend::gpu::{EmuBackend, EmuExecutor, GemmType};
use needlescope::backend::{Backend, CpuBackend, HostOps, IndexScoreBatch};
use needlescope::numerics::hadamard_inplace;
use needlescope::numerics::score_batch::TileShape;
use needlescope::numerics::{IndexProfile, PreparedQuery};

fn gpu() -> EmuBackend {
    EmuBackend::single(EmuExecutor::default(), GemmType::Bf16)
}

use needlescope::numerics::rng::Rng;

fn p2(e: i32) -> f32 {
    2f32.powi(e)
}

/// Asserts bit equality (NaN equals NaN), naming the first differing element.
fn assert_bits_eq(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let same = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
        assert!(
            same,
            "{what}: element {i}: gpu {g:e} ({:#010x}) vs cpu {w:e} ({:#010x})",
            g.to_bits(),
            w.to_bits()
        );
    }
}

/// `t` padded with zeros to `dim`.
fn padded(t: &[f32], dim: usize) -> Vec<f32> {
    let mut v = t.to_vec();
    v.resize(dim, 0.0);
    v
}

/// e4m3 ties at scale 2^-6 (amax 7 = 448·2^-6): 1.0625 -> 1, 1.1875 -> 1.25, 15.5 -> 16,
/// 432 -> 448, subnormal ties 3·2^-10 and 5·2^-10, and bf16 ties 1 + 2^-8, 1 + 3·2^-8.
fn fp8_tie_row(dim: usize) -> Vec<f32> {
    let t = [
        448.0,
        1.0625,
        -1.1875,
        15.5,
        -432.0,
        3.0 * p2(-10),
        -5.0 * p2(-10),
        1.0 + p2(-8),
        1.0 + 3.0 * p2(-8),
    ];
    padded(&t.map(|x| x * p2(-6)), dim)
}

/// e2m1 ties in two blocks of 32 (block 0 at scale 1, block 1 at scale 1/2).
fn fp4_tie_row(dim: usize) -> Vec<f32> {
    let mut v = vec![0.0f32; dim];
    let b0 = [6.0, 0.25, 0.75, -1.25, 1.75, 2.5, -3.5, 5.0];
    v[..b0.len()].copy_from_slice(&b0);
    if dim >= 64 {
        let b1 = [3.0, 0.375, -1.25, 0.875, 1.75];
        v[32..32 + b1.len()].copy_from_slice(&b1);
    }
    v
}

/// An amax whose fp32 scale `a/448` has a reciprocal that takes `a` above 448 (the clamp).
fn saturating_amax() -> f32 {
    let mut a = 1.0f32;
    for _ in 0..100_000 {
        if a * (1.0 / (a / 448.0)) > 448.0 {
            return a;
        }
        a = f32::from_bits(a.to_bits() + 1);
    }
    panic!("no saturating amax found");
}

/// Random rows of many magnitudes plus the special rows; `dim` 64 also gets the tie rows
/// pre-rotated (H/8 is exact there), so rotating profiles see the ties after their rotation.
fn rows(dim: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    let mut v = Vec::new();
    for r in 0..24 {
        v.extend(rng.values(dim, p2(r % 16 - 8)));
    }
    v.extend(vec![0.0; dim]);
    v.extend(rng.values(dim, 1e-6));
    v.extend(rng.values(dim, 1e-39));
    v.extend(rng.values(dim, 3e4));
    let mut sat = rng.values(dim, 0.5);
    sat[3] = saturating_amax();
    v.extend(sat);
    v.extend(fp8_tie_row(dim));
    v.extend(fp4_tie_row(dim));
    // A scale that is no power of two (amax 1344: s = 3, fp32(1/3) inexact): `x * fp32(1/s)`
    // (REF's order) and `x / s` encode this x to neighbouring e4m3 codes.
    let mut third = rng.values(dim, 0.5);
    third[1] = 1344.0;
    third[2] = f32::from_bits(0x3d63_ffff); // 0.05566406
    v.extend(third);
    if dim == 64 {
        for t in [fp8_tie_row(dim), fp4_tie_row(dim)] {
            let mut r = t.clone();
            hadamard_inplace(&mut r).unwrap();
            let mut back = r.clone();
            hadamard_inplace(&mut back).unwrap();
            assert_bits_eq(
                &back,
                &t,
                "construction: the pre-rotated tie row rotates back exactly",
            );
            v.extend(r);
        }
    }
    v
}

#[test]
fn prepared_keys_and_queries_are_bit_identical_to_cpu_in_every_profile() {
    let (cpu, gpu) = (CpuBackend::new(), gpu());
    // Up to 128 values a row is prepared in a local array on the device, longer rows in place
    // (256 here): both paths.
    for (dim, seed) in [(64usize, 3u64), (128, 4), (32, 5), (256, 6)] {
        let raw = rows(dim, seed);
        let n = raw.len() / dim;
        let mut rng = Rng::new(seed + 100);
        let mut w_raw = rng.values(n, 4.0);
        w_raw[0] = 1.0 + p2(-8); // a bf16 tie
        w_raw[1] = -(1.0 + 3.0 * p2(-8));
        for p in IndexProfile::EVERY {
            let (mut kc, mut sc) = (vec![0.0; raw.len()], vec![0.0; n]);
            let (mut kg, mut sg) = (vec![0.0; raw.len()], vec![0.0; n]);
            cpu.index_prepare_keys(p, &raw, dim, &mut kc, &mut sc);
            gpu.index_prepare_keys_host(p, &raw, dim, &mut kg, &mut sg);
            assert!(gpu.take_error().is_none(), "{p}: device error");
            assert_bits_eq(&kg, &kc, &format!("{p} dim {dim}: prepared keys"));
            assert_bits_eq(&sg, &sc, &format!("{p} dim {dim}: key scales"));
            if p != IndexProfile::Exact {
                assert_ne!(kc, raw, "{p}: the profile must round something");
            }
            // Every row as one query head.
            let qc = cpu.index_prepare_query(p, &raw, &w_raw, n, dim);
            let qg = gpu.index_prepare_query(p, &raw, &w_raw, n, dim);
            assert!(gpu.take_error().is_none(), "{p}: device error");
            assert_bits_eq(
                &qg.values,
                &qc.values,
                &format!("{p} dim {dim}: query values"),
            );
            assert_bits_eq(
                &qg.weights,
                &qc.weights,
                &format!("{p} dim {dim}: head weights"),
            );
            assert_eq!((qg.heads, qg.dim), (n, dim));
        }
    }
}

#[test]
fn tie_rows_really_hit_ties() {
    // The e4m3 ties land on the even neighbour (vllm-fp8 does not rotate; its scale is 2^-6).
    let cpu = CpuBackend::new();
    let raw = fp8_tie_row(32);
    let (mut k, mut s) = (vec![0.0; 32], vec![0.0; 1]);
    cpu.index_prepare_keys(IndexProfile::VllmFp8, &raw, 32, &mut k, &mut s);
    assert_eq!(s[0], p2(-6));
    assert_eq!(
        &k[..7],
        &[448.0, 1.0, -1.25, 16.0, -448.0, 2.0 * p2(-9), -2.0 * p2(-9)]
    );
    // The pre-rotated fp4 row: SGLang's ties go to the smaller magnitude, REF's to even.
    let mut r = fp4_tie_row(64);
    hadamard_inplace(&mut r).unwrap();
    let (mut a, mut b, mut s) = (vec![0.0; 64], vec![0.0; 64], vec![0.0; 1]);
    cpu.index_prepare_keys(IndexProfile::SglangFp4, &r, 64, &mut a, &mut s);
    cpu.index_prepare_keys(IndexProfile::OfficialFp4, &r, 64, &mut b, &mut s);
    assert_eq!(&a[..8], &[6.0, 0.0, 0.5, -1.0, 1.5, 2.0, -3.0, 4.0]);
    assert_eq!(&b[..8], &[6.0, 0.0, 1.0, -1.0, 2.0, 2.0, -4.0, 4.0]);
}

/// max |a - b| / max |b| over finite values; infinities must match exactly.
fn norm_err(a: &[f32], b: &[f32]) -> f32 {
    let scale = b
        .iter()
        .filter(|x| x.is_finite())
        .fold(0f32, |m, x| m.max(x.abs()))
        .max(1e-30);
    let mut worst = 0f32;
    for (x, y) in a.iter().zip(b) {
        if y.is_finite() {
            // A NaN score where the CPU has a number is no match (`max` would skip it).
            let gap = if x.is_nan() {
                f32::INFINITY
            } else {
                (x - y).abs()
            };
            worst = worst.max(gap);
        } else {
            assert_eq!(x.to_bits(), y.to_bits(), "non-finite scores differ");
        }
    }
    worst / scale
}

/// Tolerance of scores: f32 noise of the dots' summation order; `official-fp4` rounds each dot
/// to bf16, so a last-bit difference in a dot can move one head term by a bf16 ulp.
fn tolerance(p: IndexProfile) -> f32 {
    if p == IndexProfile::OfficialFp4 {
        1.0 / 128.0
    } else {
        2e-6
    }
}

struct Prepared {
    queries: Vec<PreparedQuery>,
    keys: Vec<f32>,
    scales: Vec<f32>,
}

fn prepared(
    p: IndexProfile,
    heads: usize,
    dim: usize,
    tokens: usize,
    n: usize,
    seed: u64,
) -> Prepared {
    let cpu = CpuBackend::new();
    let mut rng = Rng::new(seed);
    let mut raw = Vec::new();
    for r in 0..n {
        raw.extend(rng.values(dim, 0.25 + (r % 7) as f32 * 0.5));
    }
    let (mut keys, mut scales) = (vec![0.0; n * dim], vec![0.0; n]);
    cpu.index_prepare_keys(p, &raw, dim, &mut keys, &mut scales);
    let queries = (0..tokens)
        .map(|_| {
            cpu.index_prepare_query(
                p,
                &rng.values(heads * dim, 2.0),
                &rng.values(heads, 3.0),
                heads,
                dim,
            )
        })
        .collect();
    Prepared {
        queries,
        keys,
        scales,
    }
}

#[test]
fn scores_match_cpu_in_every_profile() {
    let (cpu, gpu) = (CpuBackend::new(), gpu());
    for (heads, dim, n) in [(64usize, 128usize, 300usize), (4, 64, 129)] {
        for p in IndexProfile::EVERY {
            let c = prepared(p, heads, dim, 2, n, 12);
            let mut worst = 0f32;
            for q in &c.queries {
                let (mut want, mut got) = (vec![0.0; n], vec![0.0; n]);
                cpu.index_scores(p, q, &c.keys, &c.scales, dim, &mut want);
                gpu.index_scores(p, q, &c.keys, &c.scales, dim, &mut got);
                assert!(gpu.take_error().is_none());
                assert!(
                    want.iter().filter(|s| **s > 0.0).count() > n / 4,
                    "{p}: scores too sparse to test"
                );
                worst = worst.max(norm_err(&got, &want));
                if p == IndexProfile::OfficialFp4 {
                    // fp4 x fp4 products and their sums are exact in f32 here, so every dot is
                    // exact in any summation order and the bf16 roundings must agree bit for bit.
                    assert_bits_eq(&got, &want, "official-fp4 scores");
                }
            }
            eprintln!("scores {p} {heads}x{dim}: normalised error {worst:e}");
            assert!(
                worst <= tolerance(p),
                "{p} {heads}x{dim}: normalised error {worst:e}"
            );
        }
    }
}

#[test]
fn unprepared_inputs_are_scored_in_f32_not_rounded_to_bf16() {
    // A caller may score raw f32 values under a rounding profile: the GEMM must not round them.
    let (cpu, gpu) = (CpuBackend::new(), gpu());
    let (heads, dim, n) = (8, 64, 50);
    let mut rng = Rng::new(21);
    let q = PreparedQuery {
        values: rng.values(heads * dim, 1.0),
        weights: rng.values(heads, 1.0),
        heads,
        dim,
    };
    let keys = rng.values(n * dim, 1.0);
    let scales = vec![1.0; n];
    let (mut want, mut got) = (vec![0.0; n], vec![0.0; n]);
    cpu.index_scores(IndexProfile::SglangFp8, &q, &keys, &scales, dim, &mut want);
    gpu.index_scores(IndexProfile::SglangFp8, &q, &keys, &scales, dim, &mut got);
    let e = norm_err(&got, &want);
    assert!(e <= 2e-6, "normalised error {e:e}");
    // Batched, from device activations: raw keys with prepared (bf16-exact) queries, and
    // prepared keys with raw queries. Either raw side alone must keep the GEMM in f32.
    let p = IndexProfile::SglangFp8;
    let c = prepared(p, heads, dim, 3, n, 22);
    assert!(c.keys.iter().all(|v| v.to_bits() & 0xFFFF == 0));
    let flat_q: Vec<f32> = c.queries.iter().flat_map(|q| q.values.clone()).collect();
    let flat_w: Vec<f32> = c.queries.iter().flat_map(|q| q.weights.clone()).collect();
    let raw_q = rng.values(flat_q.len(), 1.0);
    let visible = [n, 7, n - 1];
    for (what, qv, k) in [("raw keys", &flat_q, &keys), ("raw q", &raw_q, &c.keys)] {
        let (mut want, mut got) = (vec![0.0; 3 * n], vec![0.0; 3 * n]);
        let batch = IndexScoreBatch {
            profile: p,
            queries: &qv[..],
            weights: &flat_w[..],
            first: 0,
            heads,
            dim,
            keys: &k[..],
            key_scales: &c.scales[..],
            visible: &visible,
        };
        cpu.index_scores_batch_host(&batch, &mut want);
        gpu.index_scores_batch_host(&batch, &mut got);
        assert!(gpu.take_error().is_none());
        let e = norm_err(&got, &want);
        assert!(e <= 2e-6, "{what}: normalised error {e:e}");
    }
}

#[test]
fn batched_scores_with_ragged_visibility_equal_the_per_query_path() {
    let (cpu, gpu) = (CpuBackend::new(), gpu());
    let (heads, dim, n) = (8usize, 64usize, 100usize);
    let visible = [0usize, 1, 5, 37, 100, 100, 64];
    let stride = 110;
    let tokens = visible.len();
    for p in IndexProfile::EVERY {
        let c = prepared(p, heads, dim, tokens, n, 31);
        let flat_q: Vec<f32> = c.queries.iter().flat_map(|q| q.values.clone()).collect();
        let flat_w: Vec<f32> = c.queries.iter().flat_map(|q| q.weights.clone()).collect();
        let mut want = vec![0.0; tokens * stride];
        let batch = IndexScoreBatch {
            profile: p,
            queries: &flat_q[..],
            weights: &flat_w[..],
            first: 0,
            heads,
            dim,
            keys: &c.keys[..],
            key_scales: &c.scales[..],
            visible: &visible,
        };
        cpu.index_scores_batch_host(&batch, &mut want);
        // The default tile, and tiles that split both tokens and rows unevenly.
        for tile in [
            None,
            Some(TileShape {
                tokens: 3,
                rows: 16,
            }),
            Some(TileShape { tokens: 1, rows: 7 }),
        ] {
            let mut got = vec![f32::NAN; tokens * stride];
            match tile {
                None => gpu.index_scores_batch_host(&batch, &mut got),
                Some(t) => {
                    // A key cache longer than any query sees (NaN rows past the visible ones
                    // must not be read).
                    let (q, w) = (gpu.act_of(&flat_q), gpu.act_of(&flat_w));
                    let (mut k, mut s) = (gpu.act_of(&c.keys), gpu.act_of(&c.scales));
                    gpu.act_append(&mut k, &gpu.act_of(&vec![f32::NAN; 3 * dim]));
                    gpu.act_append(&mut s, &gpu.act_of(&[f32::NAN; 3]));
                    let mut out = gpu.act_zeros(got.len());
                    let on_gpu = batch.with_tensors(&q, &w, &k, &s);
                    index_scores_batch_tiled(&gpu, &on_gpu, &mut out, t).unwrap();
                    gpu.act_to(&out, &mut got);
                    // A block that starts at query 2 (the engine scores long chunks in blocks
                    // of queries): its rows equal those queries' rows of the whole batch, so
                    // its queries and head weights are read from query 2 on.
                    let mut part = gpu.act_zeros((tokens - 2) * stride);
                    let from_query_2 = IndexScoreBatch {
                        first: 2,
                        visible: &visible[2..],
                        ..on_gpu
                    };
                    index_scores_batch_tiled(&gpu, &from_query_2, &mut part, t).unwrap();
                    let mut from_2 = vec![f32::NAN; (tokens - 2) * stride];
                    gpu.act_to(&part, &mut from_2);
                    assert_bits_eq(
                        &from_2,
                        &got[2 * stride..],
                        &format!("{p} {t:?}: block from query 2"),
                    );
                }
            }
            assert!(gpu.take_error().is_none());
            for (t, q) in c.queries.iter().enumerate() {
                let v = visible[t];
                let row = &got[t * stride..(t + 1) * stride];
                let mut single = vec![0.0; v];
                gpu.index_scores(p, q, &c.keys[..v * dim], &c.scales[..v], dim, &mut single);
                // The emulator's GEMM sums each dot in one order whatever the tile: bit equal.
                assert_bits_eq(
                    &row[..v],
                    &single,
                    &format!("{p} {tile:?}: token {t} batched vs single"),
                );
                assert!(
                    row[v..].iter().all(|s| *s == f32::NEG_INFINITY),
                    "{p}: token {t} padding"
                );
            }
            let e = norm_err(&got, &want);
            assert!(
                e <= tolerance(p),
                "{p} {tile:?}: batched vs cpu normalised error {e:e}"
            );
        }
    }
}

fn check_topk(scores: &[f32], k: usize, what: &str) {
    let (cpu, gpu) = (CpuBackend::new(), gpu());
    let mut want = vec![7i32; k];
    let mut got = vec![7i32; k];
    cpu.topk(scores, &mut want);
    gpu.topk(scores, &mut got);
    assert!(gpu.take_error().is_none(), "{what}: device error");
    if let Some(i) = (0..k).find(|&i| got[i] != want[i]) {
        panic!(
            "{what} (n {}, k {k}): first difference at {i}: gpu {} vs cpu {}",
            scores.len(),
            got[i],
            want[i]
        );
    }
}

/// Scores drawn from a small set with NaN, infinities and signed zeros: ties everywhere.
fn tricky_scores(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| match rng.next_u64() % 12 {
            0 => f32::NAN,
            1 => f32::NEG_INFINITY,
            2 => 0.0,
            3 => -0.0,
            4 => f32::INFINITY,
            5 => 1.5,
            6 => -f32::MIN_POSITIVE / 4.0,
            _ => (rng.next_u64() % 1000) as f32 / 37.0 - 13.0,
        })
        .collect()
}

#[test]
fn topk_matches_cpu_with_ties_nan_infinities_and_short_rows() {
    for n in [0usize, 1, 2, 5, 63, 64, 255, 256, 257, 1000, 5000] {
        let s = tricky_scores(n, n as u64 + 1);
        for k in [0usize, 1, 2, 7, 31, 100, 513, 6000] {
            check_topk(&s, k, "tricky");
        }
    }
    check_topk(&[f32::NAN, f32::NEG_INFINITY, 0.5], 3, "nan below -inf");
    check_topk(&[1.0, 3.0, 3.0, 2.0, 3.0], 8, "ties and padding");
}

#[test]
fn topk_of_32k_rows_matches_cpu() {
    let n = 32768;
    let mut rng = Rng::new(77);
    let smooth: Vec<f32> = (0..n).map(|_| rng.signed() * 10.0).collect();
    let tricky = tricky_scores(n, 78);
    let equal = vec![0.25f32; n];
    let mut nan = vec![f32::NAN; n];
    nan[n - 1] = f32::NEG_INFINITY;
    let rising: Vec<f32> = (0..n).map(|i| i as f32).collect();
    for (what, s) in [
        ("smooth", &smooth),
        ("tricky", &tricky),
        ("all equal", &equal),
        ("all nan", &nan),
        ("rising", &rising),
    ] {
        for k in [1usize, 512, 1024] {
            check_topk(s, k, what);
        }
    }
}
