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

fn case(p: IndexProfile, heads: usize, dim: usize, first_pos: usize, tokens: usize, seed: u64) -> Case {
    let mut rng = Rng(seed);
    let visible: Vec<usize> = (first_pos..first_pos + tokens).map(|t| (t + 1) / 4).collect();
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
        p,
        &c.flat_q,
        &c.flat_w,
        heads,
        dim,
        &c.keys,
        &c.scales,
        &c.visible,
        &mut out,
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
                for r in 0..stride {
                    if r >= c.visible[t] {
                        assert_eq!(row[r], f32::NEG_INFINITY, "{p} {heads}x{dim}: t {t} r {r}");
                        continue;
                    }
                    let want = score(p, q, &c.keys[r * dim..(r + 1) * dim], c.scales[r]);
                    let diff = (row[r] - want).abs();
                    total += 1;
                    if diff <= 1e-5 * want.abs().max(1.0) {
                        continue;
                    }
                    assert_eq!(
                        p,
                        IndexProfile::OfficialFp4,
                        "{heads}x{dim} t {t} r {r}: batched {} vs scalar {want}",
                        row[r]
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
            assert!(worst_ulps <= 1.0, "{p} {heads}x{dim}: {worst_ulps} bf16 ulps");
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
