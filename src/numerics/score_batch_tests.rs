//! Tests of `score_batch.rs`: the batched scores against the scalar reference
//! [`score`](crate::numerics::profiles::score) for every profile, masking, NaN, edge shapes.

use super::*;
use crate::numerics::profiles::{prepare_keys, prepare_query, score, PreparedQuery};

struct Rng(u64);
impl Rng {
    fn uniform(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * scale).collect()
    }
}

/// One bf16 ulp at the magnitude of `x`.
fn bf16_ulp(x: f32) -> f32 {
    if x == 0.0 || !x.is_finite() {
        return f32::MIN_POSITIVE;
    }
    2f32.powi(x.abs().log2().floor() as i32 - 7)
}

/// Prepared inputs: `tokens` queries at positions `first_pos..` (visible rows
/// floor((pos+1)/4)), and the keys they need.
struct Case {
    queries: Vec<PreparedQuery>,
    flat_q: Vec<f32>,
    flat_w: Vec<f32>,
    keys: Vec<f32>,
    scales: Vec<f32>,
    visible: Vec<usize>,
}

fn case(
    p: IndexProfile,
    heads: usize,
    dim: usize,
    first_pos: usize,
    tokens: usize,
    seed: u64,
) -> Case {
    let mut rng = Rng(seed);
    let visible: Vec<usize> = (first_pos..first_pos + tokens)
        .map(|t| (t + 1) / 4)
        .collect();
    let rows = *visible.iter().max().unwrap();
    // Row magnitudes vary, so per-row scales (fp8) differ.
    let mut k_raw = Vec::with_capacity(rows * dim);
    for r in 0..rows {
        let mag = 0.25 + (r % 7) as f32 * 0.5;
        k_raw.extend(rng.vec(dim, mag));
    }
    let keys = prepare_keys(p, &k_raw, dim);
    let mut queries = Vec::new();
    for _ in 0..tokens {
        let q = rng.vec(heads * dim, 2.0);
        let w = rng.vec(heads, 3.0);
        queries.push(prepare_query(p, &q, &w, heads, dim));
    }
    let flat_q = queries.iter().flat_map(|q| q.values.clone()).collect();
    let flat_w = queries.iter().flat_map(|q| q.weights.clone()).collect();
    Case {
        queries,
        flat_q,
        flat_w,
        keys: keys.values,
        scales: keys.row_scale,
        visible,
    }
}

fn batched(p: IndexProfile, c: &Case, heads: usize, dim: usize, stride: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; c.visible.len() * stride];
    score_batch(
        p, &c.flat_q, &c.flat_w, heads, dim, &c.keys, &c.scales, &c.visible, &mut out,
    );
    out
}

#[test]
fn batched_scores_match_the_scalar_reference_for_every_profile() {
    // (heads, dim, first_pos, tokens): row counts cross tile edges without being multiples.
    let shapes = [
        (16usize, 32usize, 4300usize, 40usize),
        (64, 128, 4150, 6),
        (4, 64, 8, 300),
        (1, 32, 2043, 3),
    ];
    for (si, &(heads, dim, first_pos, tokens)) in shapes.iter().enumerate() {
        for p in IndexProfile::ALL {
            let c = case(p, heads, dim, first_pos, tokens, 17 + si as u64);
            let stride = c.visible.iter().max().unwrap() + 5;
            let got = batched(p, &c, heads, dim, stride);
            let (mut total, mut off, mut worst_ulps) = (0usize, 0usize, 0.0f32);
            for (t, q) in c.queries.iter().enumerate() {
                let row = &got[t * stride..(t + 1) * stride];
                for (r, &got) in row.iter().enumerate() {
                    if r >= c.visible[t] {
                        assert_eq!(got, f32::NEG_INFINITY, "{p} {heads}x{dim}: t {t} r {r}");
                        continue;
                    }
                    let want = score(p, q, &c.keys[r * dim..(r + 1) * dim], c.scales[r]);
                    let diff = (got - want).abs();
                    total += 1;
                    if diff <= 1e-5 * want.abs().max(1.0) {
                        continue;
                    }
                    assert_eq!(
                        p,
                        IndexProfile::OfficialFp4,
                        "{heads}x{dim} t {t} r {r}: batched {got} vs scalar {want}"
                    );
                    off += 1;
                    worst_ulps = worst_ulps.max(diff / bf16_ulp(want));
                }
            }
            assert!(total > 0);
            assert!(
                off * 100 <= total,
                "{p} {heads}x{dim}: {off} of {total} scores off"
            );
            assert!(
                worst_ulps <= 1.0,
                "{p} {heads}x{dim}: {worst_ulps} bf16 ulps"
            );
        }
    }
}

#[test]
fn official_fp4_dots_are_exact_so_batched_scores_are_bit_identical() {
    // fp4 × fp4 products of a 32-block are exact in f32: no summation-order noise at all.
    let p = IndexProfile::OfficialFp4;
    let c = case(p, 16, 32, 3000, 20, 5);
    let stride = c.visible[19];
    let got = batched(p, &c, 16, 32, stride);
    for (t, q) in c.queries.iter().enumerate() {
        for r in 0..c.visible[t] {
            let want = score(p, q, &c.keys[r * 32..(r + 1) * 32], c.scales[r]);
            assert_eq!(got[t * stride + r].to_bits(), want.to_bits(), "t {t} r {r}");
        }
    }
}

#[test]
fn nan_keys_stay_visible_and_invisible_rows_are_minus_infinity() {
    for p in [IndexProfile::Exact, IndexProfile::OfficialFp4] {
        let mut c = case(p, 4, 32, 40, 8, 3);
        c.keys[2 * 32 + 5] = f32::NAN;
        let stride = 20;
        let got = batched(p, &c, 4, 32, stride);
        for t in 0..8 {
            let row = &got[t * stride..(t + 1) * stride];
            assert!(row[2].is_nan(), "{p}: t {t}");
            assert!(row[..c.visible[t]]
                .iter()
                .enumerate()
                .all(|(r, v)| r == 2 || v.is_finite()));
            assert!(row[c.visible[t]..].iter().all(|&v| v == f32::NEG_INFINITY));
        }
    }
}

#[test]
fn empty_and_single_token_batches() {
    let p = IndexProfile::SglangFp8;
    let mut out: Vec<f32> = Vec::new();
    score_batch(p, &[], &[], 4, 32, &[], &[], &[], &mut out);
    // Tokens that see nothing.
    let c = case(p, 4, 32, 0, 3, 9);
    assert_eq!(c.visible, vec![0, 0, 0]);
    let mut out: Vec<f32> = Vec::new();
    score_batch(
        p, &c.flat_q, &c.flat_w, 4, 32, &c.keys, &c.scales, &c.visible, &mut out,
    );
    let got = batched(p, &c, 4, 32, 2);
    assert!(got.iter().all(|&v| v == f32::NEG_INFINITY));
    // One decode token over several row tiles.
    let c = case(p, 4, 32, 9000, 1, 10);
    let got = batched(p, &c, 4, 32, c.visible[0]);
    for (r, &g) in got.iter().enumerate() {
        let want = score(p, &c.queries[0], &c.keys[r * 32..(r + 1) * 32], c.scales[r]);
        assert!((g - want).abs() <= 1e-5 * want.abs().max(1.0), "r {r}");
    }
}

#[test]
fn tile_shapes_agree_within_summation_noise() {
    let (heads, dim) = (16usize, 32usize);
    for p in [IndexProfile::Exact, IndexProfile::OfficialFp4] {
        let c = case(p, heads, dim, 2500, 33, 31);
        let stride = c.visible[32];
        let run = |tokens: usize, rows: usize| {
            let mut out = vec![0.0f32; 33 * stride];
            score_batch_tiled(
                p,
                &c.flat_q,
                &c.flat_w,
                heads,
                dim,
                &c.keys,
                &c.scales,
                &c.visible,
                &mut out,
                TileShape { tokens, rows },
            );
            out
        };
        let base = run(16, 1024);
        for (tokens, rows) in [(1, 1), (3, 7), (33, 4096), (5, 100)] {
            let got = run(tokens, rows);
            for (i, (&a, &b)) in got.iter().zip(&base).enumerate() {
                assert!(
                    a == b || (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                    "{p} tile {tokens}x{rows}: {i}: {a} vs {b}"
                );
            }
        }
    }
}

/// Throughput of the batched scorer at the tiny model's and the real model's index shapes.
/// `cargo test --release --lib -- --ignored score_batch_throughput --nocapture`
#[test]
#[ignore]
fn score_batch_throughput() {
    for (heads, dim, rows) in [(16usize, 32usize, 8192usize), (64, 128, 4096)] {
        let p = IndexProfile::Exact;
        let tokens = 256;
        let first = 4 * rows - tokens;
        let c = case(p, heads, dim, first, tokens, 1);
        let stride = c.visible[tokens - 1];
        let macs: usize = c.visible.iter().map(|&n| n * heads * dim).sum();
        {
            use rayon::prelude::*;
            let mut out = vec![0.0f32; tokens * stride];
            let t0 = std::time::Instant::now();
            out.par_chunks_mut(stride)
                .zip(&c.queries)
                .for_each(|(o, q)| {
                    for (r, v) in o.iter_mut().enumerate() {
                        *v = score(p, q, &c.keys[r * dim..(r + 1) * dim], c.scales[r]);
                    }
                });
            let s = t0.elapsed().as_secs_f64();
            eprintln!(
                "{heads}x{dim}, scalar `score` per row: {:.1} ms, {:.1} GMAC/s",
                s * 1e3,
                macs as f64 / s / 1e9
            );
        }
        for (tt, rt) in [
            (tokens_per_tile(heads), ROWS_PER_TILE),
            (tokens_per_tile(heads), 512),
            (tokens_per_tile(heads), 2048),
            (tokens_per_tile(heads) * 2, 1024),
            ((tokens_per_tile(heads) / 2).max(1), 1024),
        ] {
            let mut out = vec![0.0f32; tokens * stride];
            let t0 = std::time::Instant::now();
            let reps = 5;
            for _ in 0..reps {
                score_batch_tiled(
                    p,
                    &c.flat_q,
                    &c.flat_w,
                    heads,
                    dim,
                    &c.keys,
                    &c.scales,
                    &c.visible,
                    &mut out,
                    TileShape {
                        tokens: tt,
                        rows: rt,
                    },
                );
            }
            let s = t0.elapsed().as_secs_f64() / reps as f64;
            eprintln!(
                "{heads}x{dim}, {tokens} tokens x {stride} rows, tile {tt} tok x {rt} rows: \
                 {:.1} ms, {:.1} GMAC/s",
                s * 1e3,
                macs as f64 / s / 1e9
            );
        }
    }
}
