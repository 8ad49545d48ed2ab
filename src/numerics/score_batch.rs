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
    if profile == IndexProfile::OfficialFp4 {
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

/// Scores a block of prepared queries against the key rows each one sees.
///
/// - `queries` `[T, heads, dim]` and `weights` `[T, heads]`: prepared queries (the `values` and
///   `weights` of [`PreparedQuery`](super::profiles::PreparedQuery), token after token).
/// - `keys` `[rows, dim]`, `key_scales` `[rows]`: prepared key rows with their multipliers.
/// - `visible[t]`: how many leading rows token t sees (at most `rows` and `stride`).
/// - `out` `[T, stride]`: `out[t·stride + r]` is the score of row r for `r < visible[t]`, and
///   `-inf` for the rows that token t does not see.
///
/// # Panics
/// If the shapes disagree.
#[allow(clippy::too_many_arguments)]
pub fn score_batch(
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
    let tile = TileShape {
        tokens: tokens_per_tile(heads),
        rows: ROWS_PER_TILE,
    };
    score_batch_tiled(
        profile, queries, weights, heads, dim, keys, key_scales, visible, out, tile,
    )
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
#[allow(clippy::too_many_arguments)]
pub fn score_batch_tiled(
    profile: IndexProfile,
    queries: &[f32],
    weights: &[f32],
    heads: usize,
    dim: usize,
    keys: &[f32],
    key_scales: &[f32],
    visible: &[usize],
    out: &mut [f32],
    tile: TileShape,
) {
    let tokens = visible.len();
    assert_eq!(
        queries.len(),
        tokens * heads * dim,
        "score_batch: queries not [T, heads, dim]"
    );
    assert_eq!(
        weights.len(),
        tokens * heads,
        "score_batch: weights not [T, heads]"
    );
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

    let hd = heads * dim;
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
#[path = "score_batch_tests.rs"]
mod tests;
