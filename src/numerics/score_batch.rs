//! Batched index scoring: the scores of a block of query tokens against the key rows each can
//! see, with the dot products of all (token, head, row) triples done as GEMMs.
//!
//! The arithmetic is the one documented in [`super::profiles`]; only the dot products are
//! computed differently. Per tile of `g` tokens and `ROWS_PER_TILE` key rows,
//! `D[t·H + h, r] = q'[t, h, :] · k'[r, :]` is one `gemm` call (f32, FMA, the crate's own
//! summation order), then per (t, r) the profile's head combination runs on `D` in the scalar
//! order: heads summed in order in f32, `s_k · Σ_h w'_h · ReLU(D)`, or for `official-fp4`
//! `bf(Σ_h bf(ReLU(bf(D)) · w'_h)) · s_k`. So the batched scores equal
//! [`score`](super::profiles::score) up to the summation order of each dot product (f32 noise;
//! for `official-fp4` the fp4 × fp4 products of one 32-block are exact, so its dots, and with them
//! the bf16 roundings, usually agree bit for bit).
//!
//! Memory: one `[g·H, ROWS_PER_TILE]` tile per rayon worker (`g·H ≈ 256`, 512 KiB), never a
//! `[tokens, rows, heads]` tensor. Tiles (token group × row block) run in parallel with rayon.

use super::codecs::bf16_round;
use super::profiles::IndexProfile;
use gemm::Parallelism;
use rayon::prelude::*;

/// Key rows per tile (the GEMM's n).
pub const ROWS_PER_TILE: usize = 512;

/// Target GEMM rows (tokens × heads) per tile; a tile holds `max(1, this / heads)` tokens.
pub const QUERY_ROWS_PER_TILE: usize = 256;

/// Tokens per tile for `heads` index heads.
pub fn tokens_per_tile(heads: usize) -> usize {
    (QUERY_ROWS_PER_TILE / heads.max(1)).max(1)
}

/// ReLU that keeps NaN visible (as in `profiles`).
#[inline(always)]
fn relu(x: f32) -> f32 {
    if x < 0.0 {
        0.0
    } else {
        x
    }
}

/// `d[m, n] = a[m, k] · b[n, k]ᵀ` (all row-major, contiguous), single-threaded: the caller
/// parallelises across tiles.
fn gemm_nt(a: &[f32], b: &[f32], m: usize, n: usize, k: usize, d: &mut [f32]) {
    if m == 0 || n == 0 {
        return;
    }
    assert_eq!(a.len(), m * k, "score_batch: query tile shape");
    assert_eq!(b.len(), n * k, "score_batch: key tile shape");
    assert_eq!(d.len(), m * n, "score_batch: dot tile shape");
    if k == 0 {
        d.fill(0.0);
        return;
    }
    // SAFETY: the asserts bound every element: a is [m, k] (col stride 1, row stride k), b read
    // as bᵀ [k, n] (col stride k, row stride 1), d is [m, n] (col stride 1, row stride n).
    // `read_dst` is false, so d's previous contents are never read; d is &mut, so no aliasing.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            d.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            k as isize,
            1,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            Parallelism::None,
        );
    }
}

/// Rows combined per register block of [`combine_heads`].
const LANES: usize = 16;

/// Combines the dot products of one token into scores: `d` is `[heads, n]` (row stride
/// `d_rs`), `weights` `[heads]`, `scales` `[n]`, `out` `[n]`. The profile's arithmetic of
/// [`score`](super::profiles::score) (heads summed in order, from -0.0 as `Iterator::sum`),
/// vectorised across rows: blocks of `LANES` rows accumulate in registers over the heads.
pub fn combine_heads(
    profile: IndexProfile,
    d: &[f32],
    d_rs: usize,
    weights: &[f32],
    scales: &[f32],
    out: &mut [f32],
) {
    let n = out.len();
    assert_eq!(scales.len(), n, "combine_heads: one scale per row");
    assert!(
        weights.is_empty() || (d_rs >= n && d.len() >= (weights.len() - 1) * d_rs + n),
        "combine_heads: dot tile too short"
    );
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above). The AVX2 build of the same code keeps
        // every rounding: Rust never contracts a multiply and an add into an FMA.
        unsafe { combine_heads_avx2(profile, d, d_rs, weights, scales, out) };
        return;
    }
    combine_heads_body(profile, d, d_rs, weights, scales, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn combine_heads_avx2(
    profile: IndexProfile,
    d: &[f32],
    d_rs: usize,
    weights: &[f32],
    scales: &[f32],
    out: &mut [f32],
) {
    combine_heads_body(profile, d, d_rs, weights, scales, out)
}

#[inline(always)]
fn combine_heads_body(
    profile: IndexProfile,
    d: &[f32],
    d_rs: usize,
    weights: &[f32],
    scales: &[f32],
    out: &mut [f32],
) {
    if profile.bf16_scores() {
        combine_rows(
            d,
            d_rs,
            weights,
            scales,
            out,
            |x, w| bf16_round(relu(bf16_round(x)) * w),
            |sum, s| bf16_round(sum) * s,
        )
    } else {
        combine_rows(
            d,
            d_rs,
            weights,
            scales,
            out,
            |x, w| w * relu(x),
            |sum, s| s * sum,
        )
    }
}

/// `out[r] = finish(Σ_h term(d[h, r], w_h), scales[r])`, heads in order from -0.0.
#[inline(always)]
fn combine_rows(
    d: &[f32],
    d_rs: usize,
    weights: &[f32],
    scales: &[f32],
    out: &mut [f32],
    term: impl Fn(f32, f32) -> f32,
    finish: impl Fn(f32, f32) -> f32,
) {
    let n = out.len();
    let mut r0 = 0;
    while r0 + LANES <= n {
        let mut acc = [-0.0f32; LANES];
        for (h, &w) in weights.iter().enumerate() {
            let dh: &[f32; LANES] = d[h * d_rs + r0..h * d_rs + r0 + LANES].try_into().unwrap();
            for j in 0..LANES {
                acc[j] += term(dh[j], w);
            }
        }
        let o: &mut [f32; LANES] = (&mut out[r0..r0 + LANES]).try_into().unwrap();
        let sc: &[f32; LANES] = scales[r0..r0 + LANES].try_into().unwrap();
        for j in 0..LANES {
            o[j] = finish(acc[j], sc[j]);
        }
        r0 += LANES;
    }
    for r in r0..n {
        let mut acc = -0.0f32;
        for (h, &w) in weights.iter().enumerate() {
            acc += term(d[h * d_rs + r], w);
        }
        out[r] = finish(acc, scales[r]);
    }
}

/// One tile: a token group, a block of rows, and the group's output pieces.
struct Tile<'a> {
    /// First token of the group.
    t0: usize,
    /// First row of the block.
    r0: usize,
    /// Per token of the group, its outputs for rows `r0..r0 + piece.len()`.
    pieces: Vec<&'a mut [f32]>,
}

/// A block of T = `visible.len()` prepared index queries and the prepared key rows each one
/// sees: the input of [`score_batch`] on the host and of
/// [`Backend::index_scores_batch`](crate::backend::Backend::index_scores_batch) on a backend.
/// `X` holds the tensors: `[f32]` on the host, the backend's activation type for the op.
pub struct IndexScoreBatch<'a, X: ?Sized = [f32]> {
    /// The index profile whose head combination turns dot products into scores.
    pub profile: IndexProfile,
    /// Prepared queries `[>= first + T, heads, dim]`: the `values` of
    /// [`PreparedQuery`](super::profiles::PreparedQuery)s, token after token.
    pub queries: &'a X,
    /// Their head weights `[>= first + T, heads]` (the `weights` of the same queries).
    pub weights: &'a X,
    /// The block's first query: it scores queries `first..first + T`.
    pub first: usize,
    /// Index heads per query.
    pub heads: usize,
    /// Index head dim (of queries and keys).
    pub dim: usize,
    /// Prepared key rows `[>= rows, dim]`; only the leading `max(visible)` rows are read.
    pub keys: &'a X,
    /// The key rows' multipliers `[>= rows]`.
    pub key_scales: &'a X,
    /// `[T]`: how many leading key rows query t sees.
    pub visible: &'a [usize],
}

// Manual impls: a batch only borrows its tensors, so it is Copy whatever the tensor type.
impl<X: ?Sized> Clone for IndexScoreBatch<'_, X> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<X: ?Sized> Copy for IndexScoreBatch<'_, X> {}

impl<'a, X: ?Sized> IndexScoreBatch<'a, X> {
    /// The same batch over other tensors of the same shapes (e.g. activations of host slices).
    pub fn with_tensors<'b, Y: ?Sized>(
        &self,
        queries: &'b Y,
        weights: &'b Y,
        keys: &'b Y,
        key_scales: &'b Y,
    ) -> IndexScoreBatch<'b, Y>
    where
        'a: 'b,
    {
        IndexScoreBatch {
            profile: self.profile,
            queries,
            weights,
            first: self.first,
            heads: self.heads,
            dim: self.dim,
            keys,
            key_scales,
            visible: self.visible,
        }
    }
}

impl<'a, X: AsRef<[f32]> + ?Sized> IndexScoreBatch<'a, X> {
    /// The block alone on host slices: its own queries `[T, heads, dim]` and weights `[T,
    /// heads]` (so `first` is 0) and the leading `max(visible)` key rows and scales, what
    /// [`score_batch`] takes.
    ///
    /// # Panics
    /// If the tensors are shorter than the block reads.
    pub fn block(&self) -> IndexScoreBatch<'a, [f32]> {
        let (first, tokens, heads, dim) = (self.first, self.visible.len(), self.heads, self.dim);
        let rows = self.visible.iter().copied().max().unwrap_or(0);
        let (q, w) = (self.queries.as_ref(), self.weights.as_ref());
        let (k, s) = (self.keys.as_ref(), self.key_scales.as_ref());
        IndexScoreBatch {
            first: 0,
            ..self.with_tensors(
                &q[first * heads * dim..(first + tokens) * heads * dim],
                &w[first * heads..(first + tokens) * heads],
                &k[..rows * dim],
                &s[..rows],
            )
        }
    }
}

/// Scores a block of prepared queries against the key rows each one sees.
///
/// - `batch`: on the host the queries end at the block, `queries` `[first + T, heads, dim]`
///   and `weights` `[first + T, heads]` (see [`IndexScoreBatch::block`]); `keys` `[rows, dim]`
///   and `key_scales` `[rows]`, `visible[t]` at most `rows` and `stride`.
/// - `out` `[T, stride]`: `out[t·stride + r]` is the score of row r for `r < visible[t]`, and
///   `-inf` for the rows that token t does not see.
///
/// # Panics
/// If the shapes disagree.
pub fn score_batch(batch: &IndexScoreBatch<'_>, out: &mut [f32]) {
    let tile = TileShape {
        tokens: tokens_per_tile(batch.heads),
        rows: ROWS_PER_TILE,
    };
    score_batch_tiled(batch, out, tile)
}

/// Tile sizes of [`score_batch_tiled`].
#[derive(Clone, Copy, Debug)]
pub struct TileShape {
    /// Query tokens per tile (the GEMM's m is this times heads).
    pub tokens: usize,
    /// Key rows per tile (the GEMM's n).
    pub rows: usize,
}

/// [`score_batch`] with explicit tile sizes (for tuning and tests; results do not depend on
/// them beyond the dot products' f32 summation order inside `gemm`).
pub fn score_batch_tiled(batch: &IndexScoreBatch<'_>, out: &mut [f32], tile: TileShape) {
    let IndexScoreBatch {
        profile,
        queries,
        weights,
        first,
        heads,
        dim,
        keys,
        key_scales,
        visible,
    } = *batch;
    let tokens = visible.len();
    let hd = heads * dim;
    assert_eq!(
        queries.len(),
        (first + tokens) * hd,
        "score_batch: queries not [first + T, heads, dim]"
    );
    assert_eq!(
        weights.len(),
        (first + tokens) * heads,
        "score_batch: weights not [first + T, heads]"
    );
    // The block's own queries.
    let (queries, weights) = (&queries[first * hd..], &weights[first * heads..]);
    assert_eq!(
        keys.len(),
        key_scales.len() * dim,
        "score_batch: keys not [rows, dim]"
    );
    if tokens == 0 {
        assert!(out.is_empty(), "score_batch: out not [T, stride]");
        return;
    }
    assert_eq!(out.len() % tokens, 0, "score_batch: out not [T, stride]");
    let stride = out.len() / tokens;
    if stride == 0 {
        assert!(
            visible.iter().all(|&v| v == 0),
            "score_batch: visible rows exceed stride 0"
        );
        return;
    }
    let max_visible = visible.iter().copied().max().unwrap_or(0);
    assert!(
        max_visible <= stride && max_visible <= key_scales.len(),
        "score_batch: {max_visible} visible rows, but stride {stride} and {} keys",
        key_scales.len()
    );

    assert!(
        tile.tokens > 0 && tile.rows > 0,
        "score_batch: empty tile shape"
    );
    let (g, rows_per_tile) = (tile.tokens, tile.rows);
    // Tiles: token groups × row blocks up to the group's last visible row. Rows no token of the
    // group sees are set to -inf here, without a tile.
    let mut tiles = Vec::new();
    for (gi, group) in out.chunks_mut(g * stride).enumerate() {
        let t0 = gi * g;
        let n_tok = group.len() / stride;
        let group_visible = visible[t0..t0 + n_tok].iter().copied().max().unwrap_or(0);
        let mut blocks: Vec<Vec<&mut [f32]>> = Vec::new();
        for row in group.chunks_mut(stride) {
            let (seen, unseen) = row.split_at_mut(group_visible);
            unseen.fill(f32::NEG_INFINITY);
            for (b, piece) in seen.chunks_mut(rows_per_tile).enumerate() {
                if blocks.len() <= b {
                    blocks.push(Vec::with_capacity(n_tok));
                }
                blocks[b].push(piece);
            }
        }
        for (b, pieces) in blocks.into_iter().enumerate() {
            tiles.push(Tile {
                t0,
                r0: b * rows_per_tile,
                pieces,
            });
        }
    }

    tiles.into_par_iter().for_each_init(Vec::new, |d, tile| {
        let n_tok = tile.pieces.len();
        let n = tile.pieces[0].len();
        let (t0, r0) = (tile.t0, tile.r0);
        let m = n_tok * heads;
        d.resize(m * n, 0.0);
        gemm_nt(
            &queries[t0 * hd..(t0 + n_tok) * hd],
            &keys[r0 * dim..(r0 + n) * dim],
            m,
            n,
            dim,
            &mut d[..m * n],
        );
        let scales = &key_scales[r0..r0 + n];
        for (i, piece) in tile.pieces.into_iter().enumerate() {
            let t = t0 + i;
            combine_heads(
                profile,
                &d[i * heads * n..(i + 1) * heads * n],
                n,
                &weights[t * heads..(t + 1) * heads],
                scales,
                piece,
            );
            let seen = visible[t].saturating_sub(r0).min(n);
            piece[seen..].fill(f32::NEG_INFINITY);
        }
    });
}

#[cfg(test)]
mod tests {
    //! Tests of `score_batch.rs`: the batched scores against the scalar reference
    //! [`score`](crate::numerics::profiles::score) for every profile, masking, NaN, edge shapes.

    use super::*;
    use crate::numerics::profiles::{prepare_keys, prepare_query, score, PreparedQuery};

    use crate::numerics::rng::Rng;

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

    impl Case {
        /// The whole case as one block from query 0.
        fn batch(&self, profile: IndexProfile, heads: usize, dim: usize) -> IndexScoreBatch<'_> {
            IndexScoreBatch {
                profile,
                queries: &self.flat_q,
                weights: &self.flat_w,
                first: 0,
                heads,
                dim,
                keys: &self.keys,
                key_scales: &self.scales,
                visible: &self.visible,
            }
        }
    }

    fn case(
        p: IndexProfile,
        heads: usize,
        dim: usize,
        first_pos: usize,
        tokens: usize,
        seed: u64,
    ) -> Case {
        let mut rng = Rng::new(seed);
        let visible: Vec<usize> = (first_pos..first_pos + tokens)
            .map(|t| (t + 1) / 4)
            .collect();
        let rows = *visible.iter().max().unwrap();
        // Row magnitudes vary, so per-row scales (fp8) differ.
        let mut k_raw = Vec::with_capacity(rows * dim);
        for r in 0..rows {
            let mag = 0.25 + (r % 7) as f32 * 0.5;
            k_raw.extend(rng.values(dim, mag));
        }
        let keys = prepare_keys(p, &k_raw, dim);
        let mut queries = Vec::new();
        for _ in 0..tokens {
            let q = rng.values(heads * dim, 2.0);
            let w = rng.values(heads, 3.0);
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
        score_batch(&c.batch(p, heads, dim), &mut out);
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
        let empty: IndexScoreBatch<'_> = IndexScoreBatch {
            profile: p,
            queries: &[],
            weights: &[],
            first: 0,
            heads: 4,
            dim: 32,
            keys: &[],
            key_scales: &[],
            visible: &[],
        };
        score_batch(&empty, &mut out);
        // Tokens that see nothing.
        let c = case(p, 4, 32, 0, 3, 9);
        assert_eq!(c.visible, vec![0, 0, 0]);
        let mut out: Vec<f32> = Vec::new();
        score_batch(&c.batch(p, 4, 32), &mut out);
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
    fn a_block_from_a_later_query_scores_like_those_queries_of_the_whole_batch() {
        let (p, heads, dim) = (IndexProfile::SglangFp8, 4usize, 32usize);
        let c = case(p, heads, dim, 100, 6, 12);
        let stride = c.visible[5];
        let whole = batched(p, &c, heads, dim, stride);
        // Queries 2.. read from query 2 (on the host the queries end at the block).
        let from_2 = IndexScoreBatch {
            first: 2,
            visible: &c.visible[2..],
            ..c.batch(p, heads, dim)
        };
        let mut got = vec![0.0f32; 4 * stride];
        score_batch(&from_2, &mut got);
        for (i, (&a, &b)) in got.iter().zip(&whole[2 * stride..]).enumerate() {
            assert!(
                a == b || (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                "{i}: {a} vs {b}"
            );
        }
        // `block` cuts the same block out: its own queries from 0 and only the rows it reads.
        let block = from_2.block();
        assert_eq!(block.first, 0);
        assert_eq!(block.queries.len(), 4 * heads * dim);
        assert_eq!(block.weights.len(), 4 * heads);
        assert_eq!(block.keys.len(), stride * dim);
        assert_eq!(block.key_scales.len(), stride);
        let mut again = vec![0.0f32; 4 * stride];
        score_batch(&block, &mut again);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&again), bits(&got));
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
                    &c.batch(p, heads, dim),
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
                        &c.batch(p, heads, dim),
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
}
