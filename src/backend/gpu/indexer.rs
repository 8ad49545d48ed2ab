//! The lightning indexer on the GPU backend: index-profile rounding of key rows and queries,
//! batched scores, and top-k selection (kernels in `kernels/indexer.cu`).
//!
//! Shapes (as in [`crate::backend::Backend`]): key rows `[rows, dim]` -> prepared `[rows, dim]`
//! and one scale per row, device activations in and out (the model appends them to its key
//! cache on the device); one token's query `[heads, dim]` and raw weights `[heads]` -> a
//! [`PreparedQuery`] (host), or T tokens' `[T, heads, dim]` / `[T, heads]` device activations at
//! once ([`index_prepare_queries`]: one launch over `T x heads` query heads, outputs on the
//! device); scores `[T, stride]` (a device activation) for the T prepared queries from query
//! `first` of the activations against the leading `visible[t]` rows of the prepared key
//! activations (`-inf` beyond).
//!
//! - **Preparation** runs one device thread per key row / query head, each a port of
//!   `numerics::profiles` (bf16 rounding, Hadamard, e4m3 / e2m1 simulations) through a *recipe*
//!   ([`key_recipe`], [`query_recipe`]): the same four steps with some switched off. Prepared
//!   values and scales equal the CPU's bit for bit (NaN payloads aside). Key rows are copied
//!   device to device into the prepared activation, then prepared there in place. Query heads
//!   are independent, so a chunk of T tokens is one launch over `T x heads` heads with the
//!   per-token head-weight scale `S(heads, dim)`.
//! - **Scores** are in [`super::scores`].
//! - **Top-k** (exact, one row or T rows at once) is in [`super::topk`].
//!
//! Host inputs (the single-query path's) are uploaded per call; device activations are used in
//! place.

use super::act::copy_values;
use super::executor::{buf, grid_for, Arg, Executor, GpuError};
use super::{Act, GpuBackend};
use crate::backend::RawIndexQueries;
use crate::numerics::hadamard::hadamard_scale;
use crate::numerics::profiles::{weight_scale, IndexProfile, PreparedQuery, INDEX_FP4_BLOCK};

/// Scores live in [`super::scores`], top-k in [`super::topk`]; re-exported here.
pub use super::scores::{
    default_tile, index_scores, index_scores_batch, index_scores_batch_tiled, QUERY_ROWS_PER_TILE,
    TILE_BYTES,
};
pub use super::topk::topk;

// Recipe bits (kernels/indexer.cu): bf16 round, Hadamard, bf16 round, then one quantiser.
const BF_PRE: i32 = 1;
const ROTATE: i32 = 2;
const BF_POST: i32 = 4;
const Q_FP8_FP32: i32 = 1 << 4;
const Q_FP8_POW2: i32 = 2 << 4;
const Q_FP4_SGLANG: i32 = 3 << 4;
const Q_FP4_RNE: i32 = 4 << 4;
/// The release's fp4, then SGLang's DeepSeek-V4.1 key pack (`quant::fp4_pack_sglang_v41`).
const Q_FP4_RNE_PACK_V41: i32 = 5 << 4;

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
        VllmFp8 => BF_PRE | Q_FP8_POW2,
        Fp8NoHadamardK => Q_FP8_FP32,
        V41Fp4 => BF_PRE | Q_FP4_RNE,
        SglangV41Fp4 => BF_PRE | Q_FP4_RNE_PACK_V41,
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
        V41Fp4 => (BF_PRE | Q_FP4_RNE, 2),
        SglangV41Fp4 => (BF_PRE | Q_FP4_RNE, 2),
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

/// Prepared key rows and their scales on the device: `raw [rows, dim]` (an activation, read in
/// place) is copied device to device into `prepared`, which `idx_prepare_keys` then rounds in
/// place while writing `scales [rows]`.
pub fn index_prepare_keys<E: Executor>(
    g: &GpuBackend<E>,
    profile: IndexProfile,
    raw: &Act<E>,
    dim: usize,
    prepared: &mut Act<E>,
    scales: &mut Act<E>,
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
    let dev = g.current_index();
    let e = g.dev_at(dev);
    let raw_b = g.on(raw, dev)?;
    let keys_b = g.output(prepared, dev)?;
    copy_values(e, (&raw_b, 0), (keys_b, 0), raw.len())?;
    let scales_b = g.output(scales, dev)?;
    e.launch(
        "idx_prepare_keys",
        grid_for(rows),
        &[
            buf(keys_b),
            buf(scales_b),
            Arg::I64(rows as i64),
            Arg::I64(dim as i64),
            Arg::I32(recipe),
            Arg::I64(INDEX_FP4_BLOCK as i64),
            Arg::F32(hadamard_scale(dim)),
        ],
    )
}

/// Launches `idx_prepare_query` over `n` query heads (`n / heads` tokens): `q_in [n, dim]` ->
/// `q_out`, `w_in [n]` -> `w_out`.
fn prepare_queries_on<E: Executor>(
    e: &E,
    profile: IndexProfile,
    (q_in, w_in): (&E::Buf, &E::Buf),
    (q_out, w_out): (&E::Buf, &E::Buf),
    n: usize,
    heads: usize,
    dim: usize,
) -> Result<(), GpuError> {
    let (recipe, rule) = query_recipe(profile);
    check_rotation(profile, recipe, dim)?;
    e.launch(
        "idx_prepare_query",
        grid_for(n),
        &[
            buf(q_in),
            buf(q_out),
            buf(w_in),
            buf(w_out),
            Arg::I64(n as i64),
            Arg::I64(dim as i64),
            Arg::I32(recipe),
            Arg::I32(rule),
            Arg::I64(INDEX_FP4_BLOCK as i64),
            Arg::F32(hadamard_scale(dim)),
            Arg::F32(weight_scale(heads, dim)),
        ],
    )
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
    if heads == 0 {
        return Ok(query);
    }
    // One token of the batched path (the same kernel, the same scale).
    let (q_in, w_in) = (g.up(q_raw)?, g.up(weights_raw)?);
    let (q_out, w_out) = (g.zeros(q_raw.len())?, g.zeros(heads)?);
    let e = g.dev();
    prepare_queries_on(
        e,
        profile,
        (&q_in, &w_in),
        (&q_out, &w_out),
        heads,
        heads,
        dim,
    )?;
    g.down(&q_out, &mut query.values)?;
    g.down(&w_out, &mut query.weights)?;
    Ok(query)
}

/// The query a failed [`index_prepare_query`] gives: NaN values and weights.
pub fn nan_query(heads: usize, dim: usize) -> PreparedQuery {
    PreparedQuery {
        values: vec![f32::NAN; heads * dim],
        weights: vec![f32::NAN; heads],
        heads,
        dim,
    }
}

/// The queries of T tokens: `raw` (queries `[T, heads, dim]`, head weights `[T, heads]`) into
/// `values` and `weights` of the same shapes, bit for bit what [`index_prepare_query`] gives
/// per token.
pub fn index_prepare_queries<E: Executor>(
    g: &GpuBackend<E>,
    raw: &RawIndexQueries<'_, Act<E>>,
    values: &mut Act<E>,
    weights: &mut Act<E>,
) -> Result<(), GpuError> {
    let RawIndexQueries {
        profile,
        queries: q_raw,
        weights: weights_raw,
        heads,
        dim,
    } = *raw;
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
    let dev = g.current_index();
    let (q_in, w_in) = (g.on(q_raw, dev)?, g.on(weights_raw, dev)?);
    let (q_out, w_out) = (g.output(values, dev)?, g.output(weights, dev)?);
    let (ins, outs) = ((&*q_in, &*w_in), (&*q_out, &*w_out));
    prepare_queries_on(g.dev_at(dev), profile, ins, outs, n, heads, dim)
}
