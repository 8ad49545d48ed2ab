//! The lightning indexer on the GPU backend: index-profile rounding of key rows and queries,
//! batched scores, and top-k selection (kernels in `kernels/indexer.cu`).
//!
//! Shapes (as in [`crate::backend::Backend`]): key rows `[rows, dim]` -> prepared `[rows, dim]`
//! and one scale per row; one token's query `[heads, dim]` and raw weights `[heads]` -> a
//! [`PreparedQuery`], or T tokens' `[T, heads, dim]` / `[T, heads]` at once
//! ([`index_prepare_queries`]: one upload, one launch over `T x heads` query heads, one
//! download); scores `[T, stride]` for T prepared queries against the leading `visible[t]` key
//! rows (`-inf` beyond).
//!
//! - **Preparation** runs one device thread per key row / query head, each a port of
//!   `numerics::profiles` (bf16 rounding, Hadamard, e4m3 / e2m1 simulations) through a *recipe*
//!   ([`key_recipe`], [`query_recipe`]): the same four steps with some switched off. Prepared
//!   values and scales equal the CPU's bit for bit (NaN payloads aside). Query heads are
//!   independent, so a chunk of T tokens is one launch over `T x heads` heads with the per-token
//!   head-weight scale `S(heads, dim)`.
//! - **Scores**: the dots of a tile of `tokens x heads` query rows against a block of key rows
//!   are one GEMM into a workspace of at most [`TILE_BYTES`]; `idx_combine` then applies ReLU,
//!   head weights and row scales in the CPU's order (heads in order from -0.0; `official-fp4`
//!   with its bf16 roundings), so scores equal the CPU's up to the summation order of each dot.
//!   No `[T, rows, heads]` tensor exists. The GEMM is bf16 (f32 accumulation) when every query
//!   and key value is exactly a bf16, which holds for every profile but `exact` (e4m3 / e2m1
//!   codes times powers of two, or bf16-rounded values): the products are then exact in f32, so
//!   only the summation order (and on tensor cores their accumulation rounding) differs from
//!   the CPU. Otherwise (`exact`, or unprepared inputs) the GEMM is f32, whatever the backend's
//!   [`GemmType`] for weights.
//! - **Top-k** (exact, one row or T rows at once) is in [`super::topk`].
//!
//! Every op uploads its host inputs and downloads its outputs (the [`super`] contract); the
//! bf16-exactness test of the score inputs is one host pass over the values being uploaded.

use super::executor::{buf, grid_for, Arg, Executor, Gemm, GemmType, GpuError};
use super::matrix::to_gemm_type;
use super::GpuBackend;
use crate::numerics::hadamard::hadamard_scale;
use crate::numerics::profiles::{weight_scale, IndexProfile, PreparedQuery, INDEX_FP4_BLOCK};
use crate::numerics::score_batch::TileShape;

/// Top-k lives in [`super::topk`]; re-exported for the per-row op.
pub use super::topk::topk;

/// Most bytes of dot products (the GEMM output of one tile) that exist at once.
pub const TILE_BYTES: usize = 64 << 20;

/// Target GEMM rows (tokens x heads) per tile.
pub const QUERY_ROWS_PER_TILE: usize = 4096;

// Recipe bits (kernels/indexer.cu): bf16 round, Hadamard, bf16 round, then one quantiser.
const BF_PRE: i32 = 1;
const ROTATE: i32 = 2;
const BF_POST: i32 = 4;
const Q_FP8_FP32: i32 = 1 << 4;
const Q_FP8_POW2: i32 = 2 << 4;
const Q_FP4_SGLANG: i32 = 3 << 4;
const Q_FP4_RNE: i32 = 4 << 4;

/// The steps of `profiles::prepare_key_row` for `profile`.
pub fn key_recipe(profile: IndexProfile) -> i32 {
    use IndexProfile::*;
    match profile {
        Exact => 0,
        SglangFp8 => ROTATE | Q_FP8_FP32,
        SglangBf16Keys => ROTATE | BF_POST,
        Bf16Qk => BF_PRE,
        SglangFp4 => ROTATE | Q_FP4_SGLANG,
        OfficialFp4 => BF_PRE | ROTATE | BF_POST | Q_FP4_RNE,
        VllmFp8 => Q_FP8_POW2,
        Fp8NoHadamardK => Q_FP8_FP32,
    }
}

/// The steps of `profiles::prepare_query_head` and the head-weight rule of
/// `profiles::head_weight` (0 `w·S`, 1 `bf(w)·S`, 2 `bf(bf(w)·S)`, 3 `(bf(w)·S)·s_q`).
pub fn query_recipe(profile: IndexProfile) -> (i32, i32) {
    use IndexProfile::*;
    match profile {
        Exact => (0, 0),
        SglangFp8 | SglangBf16Keys | Fp8NoHadamardK => (ROTATE | Q_FP8_FP32, 3),
        Bf16Qk => (BF_PRE, 1),
        SglangFp4 => (BF_PRE | ROTATE | BF_POST | Q_FP4_SGLANG, 1),
        OfficialFp4 => (BF_PRE | ROTATE | BF_POST | Q_FP4_RNE, 2),
        VllmFp8 => (BF_PRE | Q_FP8_POW2, 3),
    }
}

/// Rotating recipes need a power-of-two dim (the CPU panics; here it is a recorded error).
fn check_rotation(profile: IndexProfile, recipe: i32, dim: usize) -> Result<(), GpuError> {
    if recipe & ROTATE != 0 && !dim.is_power_of_two() {
        return Err(GpuError::Other(format!(
            "index profile {profile}: the Hadamard rotation needs a power-of-two dim, got {dim}"
        )));
    }
    Ok(())
}

pub fn index_prepare_keys<E: Executor>(
    g: &GpuBackend<E>,
    profile: IndexProfile,
    raw: &[f32],
    dim: usize,
    prepared: &mut [f32],
    scales: &mut [f32],
) -> Result<(), GpuError> {
    assert_eq!(
        prepared.len(),
        raw.len(),
        "index keys: prepared not [rows, dim]"
    );
    assert_eq!(
        scales.len() * dim,
        raw.len(),
        "index keys: one scale per row"
    );
    let rows = scales.len();
    if rows == 0 {
        return Ok(());
    }
    let recipe = key_recipe(profile);
    check_rotation(profile, recipe, dim)?;
    let rows_b = g.up(raw)?;
    let scales_b = g.zeros(rows)?;
    g.dev().launch(
        "idx_prepare_keys",
        grid_for(rows),
        &[
            buf(&rows_b),
            buf(&scales_b),
            Arg::I64(rows as i64),
            Arg::I64(dim as i64),
            Arg::I32(recipe),
            Arg::I64(INDEX_FP4_BLOCK as i64),
            Arg::F32(hadamard_scale(dim)),
        ],
    )?;
    g.down(&rows_b, prepared)?;
    g.down(&scales_b, scales)
}

pub fn index_prepare_query<E: Executor>(
    g: &GpuBackend<E>,
    profile: IndexProfile,
    q_raw: &[f32],
    weights_raw: &[f32],
    heads: usize,
    dim: usize,
) -> Result<PreparedQuery, GpuError> {
    assert_eq!(
        q_raw.len(),
        heads * dim,
        "index query: expected heads*dim values"
    );
    assert_eq!(
        weights_raw.len(),
        heads,
        "index head weights: expected one per head"
    );
    let mut query = PreparedQuery {
        values: vec![0.0; heads * dim],
        weights: vec![0.0; heads],
        heads,
        dim,
    };
    // One token of the batched path (the same kernel, the same scale).
    index_prepare_queries(
        g,
        profile,
        q_raw,
        weights_raw,
        heads,
        dim,
        &mut query.values,
        &mut query.weights,
    )?;
    Ok(query)
}

/// The queries of T tokens: `q_raw [T, heads, dim]`, `weights_raw [T, heads]` into `values`
/// and `weights` of the same shapes, bit for bit what [`index_prepare_query`] gives per token.
#[allow(clippy::too_many_arguments)]
pub fn index_prepare_queries<E: Executor>(
    g: &GpuBackend<E>,
    profile: IndexProfile,
    q_raw: &[f32],
    weights_raw: &[f32],
    heads: usize,
    dim: usize,
    values: &mut [f32],
    weights: &mut [f32],
) -> Result<(), GpuError> {
    assert_eq!(
        values.len(),
        q_raw.len(),
        "index queries: values not [T, heads, dim]"
    );
    assert_eq!(
        weights.len(),
        weights_raw.len(),
        "index queries: weights not [T, heads]"
    );
    assert_eq!(
        q_raw.len(),
        weights_raw.len() * dim,
        "index queries: expected heads*dim values per head weight"
    );
    // All heads of all tokens; the weight scale is per token (its `heads`), not per launch.
    let n = weights_raw.len();
    if heads == 0 || n == 0 {
        return Ok(());
    }
    assert_eq!(n % heads, 0, "index queries: weights not [T, heads]");
    let (recipe, rule) = query_recipe(profile);
    check_rotation(profile, recipe, dim)?;
    let q_b = g.up(q_raw)?;
    let w_b = g.up(weights_raw)?;
    let w_out = g.zeros(n)?;
    g.dev().launch(
        "idx_prepare_query",
        grid_for(n),
        &[
            buf(&q_b),
            buf(&w_b),
            buf(&w_out),
            Arg::I64(n as i64),
            Arg::I64(dim as i64),
            Arg::I32(recipe),
            Arg::I32(rule),
            Arg::I64(INDEX_FP4_BLOCK as i64),
            Arg::F32(hadamard_scale(dim)),
            Arg::F32(weight_scale(heads, dim)),
        ],
    )?;
    g.down(&q_b, values)?;
    g.down(&w_out, weights)
}

pub fn index_scores<E: Executor>(
    g: &GpuBackend<E>,
    profile: IndexProfile,
    query: &PreparedQuery,
    keys: &[f32],
    key_scales: &[f32],
    dim: usize,
    out: &mut [f32],
) -> Result<(), GpuError> {
    assert_eq!(
        keys.len(),
        out.len() * dim,
        "index scores: keys not [rows, dim]"
    );
    assert_eq!(
        key_scales.len(),
        out.len(),
        "index scores: one scale per row"
    );
    assert_eq!(query.dim, dim, "index scores: query and key dims differ");
    index_scores_batch(
        g,
        profile,
        &query.values,
        &query.weights,
        query.heads,
        dim,
        keys,
        key_scales,
        &[out.len()],
        out,
    )
}

/// The tile of [`index_scores_batch`]: [`QUERY_ROWS_PER_TILE`] query rows (whole tokens) times
/// as many key rows as fit in [`TILE_BYTES`] of f32 dots.
pub fn default_tile(heads: usize) -> TileShape {
    let tokens = (QUERY_ROWS_PER_TILE / heads.max(1)).max(1);
    TileShape {
        tokens,
        rows: (TILE_BYTES / 4 / (tokens * heads.max(1))).max(1),
    }
}

#[allow(clippy::too_many_arguments)]
pub fn index_scores_batch<E: Executor>(
    g: &GpuBackend<E>,
    profile: IndexProfile,
    queries: &[f32],
    weights: &[f32],
    heads: usize,
    dim: usize,
    keys: &[f32],
    key_scales: &[f32],
    visible: &[usize],
    out: &mut [f32],
) -> Result<(), GpuError> {
    let tile = default_tile(heads);
    index_scores_batch_tiled(
        g, profile, queries, weights, heads, dim, keys, key_scales, visible, out, tile,
    )
}

/// Whether every value is exactly a bf16 (the low 16 bits are zero).
fn bf16_exact(x: &[f32]) -> bool {
    x.iter()
        .fold(true, |all, v| all & (v.to_bits() & 0xFFFF == 0))
}

/// [`index_scores_batch`] with an explicit tile (tests use small ones to cross tile edges;
/// results do not depend on it beyond the GEMM's summation order).
#[allow(clippy::too_many_arguments)]
pub fn index_scores_batch_tiled<E: Executor>(
    g: &GpuBackend<E>,
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
) -> Result<(), GpuError> {
    let tokens = visible.len();
    assert_eq!(
        queries.len(),
        tokens * heads * dim,
        "index scores: queries not [T, heads, dim]"
    );
    assert_eq!(
        weights.len(),
        tokens * heads,
        "index scores: weights not [T, heads]"
    );
    assert_eq!(
        keys.len(),
        key_scales.len() * dim,
        "index scores: keys not [rows, dim]"
    );
    if tokens == 0 || out.is_empty() {
        assert!(
            visible.iter().all(|&v| v == 0),
            "index scores: rows visible, no stride"
        );
        return Ok(());
    }
    assert_eq!(out.len() % tokens, 0, "index scores: out not [T, stride]");
    let stride = out.len() / tokens;
    let max_visible = visible.iter().copied().max().unwrap_or(0);
    assert!(
        max_visible <= stride && max_visible <= key_scales.len(),
        "index scores: {max_visible} visible rows, but stride {stride} and {} keys",
        key_scales.len()
    );
    assert!(
        max_visible <= i32::MAX as usize,
        "index scores: too many rows"
    );
    let e = g.dev();
    let vis: Vec<i32> = visible.iter().map(|&v| v as i32).collect();
    let vis_b = g.up_i32(&vis)?;
    let out_b = g.zeros(out.len())?;
    e.launch(
        "idx_mask",
        grid_for(out.len()),
        &[
            buf(&out_b),
            buf(&vis_b),
            Arg::I64(tokens as i64),
            Arg::I64(stride as i64),
        ],
    )?;
    if max_visible > 0 {
        let keys = &keys[..max_visible * dim];
        let ty = if bf16_exact(queries) && bf16_exact(keys) {
            GemmType::Bf16
        } else {
            GemmType::F32
        };
        let (q_f32, k_f32) = (g.up(queries)?, g.up(keys)?);
        let (mut q_scratch, mut k_scratch) = (None, None);
        let q_b = to_gemm_type(e, &q_f32, queries.len(), ty, &mut q_scratch)?;
        let k_b = to_gemm_type(e, &k_f32, keys.len(), ty, &mut k_scratch)?;
        let w_b = g.up(weights)?;
        let s_b = g.up(&key_scales[..max_visible])?;
        let tile_tokens = tile.tokens.clamp(1, tokens);
        let tile_rows = tile.rows.clamp(1, max_visible);
        let mut d = e.alloc((tile_tokens * heads * tile_rows * 4).max(1))?;
        let es = ty.bytes();
        let official = (profile == IndexProfile::OfficialFp4) as i32;
        for t0 in (0..tokens).step_by(tile_tokens) {
            let ntok = tile_tokens.min(tokens - t0);
            // Rows no token of the group sees stay as masked.
            let group_visible = visible[t0..t0 + ntok].iter().copied().max().unwrap_or(0);
            for r0 in (0..group_visible).step_by(tile_rows) {
                let n = tile_rows.min(group_visible - r0);
                if dim > 0 {
                    let gemm = Gemm {
                        m: ntok * heads,
                        n,
                        k: dim,
                        ty,
                        x_offset: t0 * heads * dim * es,
                        ldx: dim,
                        w_offset: r0 * dim * es,
                        ldw: dim,
                        y_offset: 0,
                        ldy: n,
                        accumulate: false,
                    };
                    e.gemm(&gemm, q_b, k_b, &mut d)?;
                }
                e.launch(
                    "idx_combine",
                    grid_for(ntok * n),
                    &[
                        buf(&d),
                        buf(&w_b),
                        buf(&s_b),
                        buf(&vis_b),
                        buf(&out_b),
                        Arg::I64(t0 as i64),
                        Arg::I64(ntok as i64),
                        Arg::I64(r0 as i64),
                        Arg::I64(n as i64),
                        Arg::I64(heads as i64),
                        Arg::I64(stride as i64),
                        Arg::I32(official),
                    ],
                )?;
            }
        }
    }
    g.down(&out_b, out)
}
