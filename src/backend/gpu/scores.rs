//! Lightning-indexer scores on the GPU backend (kernels `idx_mask`, `idx_combine` in
//! `kernels/indexer.cu`, `el_any_bits` in `kernels/elementwise.cu`): T prepared queries against
//! the leading `visible[t]` prepared key rows, `[T, stride]` with `-inf` beyond.
//!
//! The dots of a tile of `tokens x heads` query rows against a block of key rows are one GEMM
//! into a workspace of at most [`TILE_BYTES`]; `idx_combine` then applies ReLU, head weights and
//! row scales in the CPU's order (heads in order from -0.0; `official-fp4` with its bf16
//! roundings), so scores equal the CPU's up to the summation order of each dot. No
//! `[T, rows, heads]` tensor exists. The GEMM is bf16 (f32 accumulation) when every query and
//! key value is exactly a bf16, which holds for every profile but `exact` (e4m3 / e2m1 codes
//! times powers of two, or bf16-rounded values): the products are then exact in f32, so only
//! the summation order (and on tensor cores their accumulation rounding) differs from the CPU.
//! Otherwise (`exact`, or unprepared inputs) the GEMM is f32, whatever the backend's
//! [`super::GemmType`] for weights.
//!
//! [`index_scores_batch`] reads its block of queries and head weights in place from device
//! activations (a byte offset at query `first`, no copy) and writes a device activation; the key
//! rows, scales and visibility are host data uploaded per call. The bf16 test is a host pass
//! over the keys and, only when they are exact, a device reduction over the block's queries
//! ([`bf16_exact_on`]: one 4-byte download). [`index_scores`] (one host query, host output)
//! runs the same code after an upload.

use super::executor::{buf, download, grid_for, upload, Arg, Executor, Gemm, GemmType, GpuError};
use super::matrix::{to_gemm_type, to_gemm_type_at};
use super::{Act, GpuBackend};
use crate::numerics::profiles::{IndexProfile, PreparedQuery};
use crate::numerics::score_batch::TileShape;

/// Most bytes of dot products (the GEMM output of one tile) that exist at once.
pub const TILE_BYTES: usize = 64 << 20;

/// Target GEMM rows (tokens x heads) per tile.
pub const QUERY_ROWS_PER_TILE: usize = 4096;

/// Scores of one prepared query on the host (see [`crate::backend::Backend::index_scores`]).
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
    assert_eq!(query.values.len(), query.heads * dim, "index scores: query");
    assert_eq!(
        query.weights.len(),
        query.heads,
        "index scores: head weights"
    );
    if out.is_empty() {
        return Ok(());
    }
    let (values, weights) = (g.up(&query.values)?, g.up(&query.weights)?);
    let out_b = g.zeros(out.len())?;
    let block = Block {
        values: &values,
        weights: &weights,
        first: 0,
        heads: query.heads,
        dim,
        keys,
        key_scales,
        visible: &[out.len()],
    };
    let exact = || Ok(bf16_exact(&query.values));
    let tile = default_tile(query.heads);
    scores_on(g.dev(), profile, &block, exact, &out_b, out.len(), tile)?;
    g.down(&out_b, out)
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
    queries: &Act<E>,
    weights: &Act<E>,
    first: usize,
    heads: usize,
    dim: usize,
    keys: &[f32],
    key_scales: &[f32],
    visible: &[usize],
    out: &mut Act<E>,
) -> Result<(), GpuError> {
    let tile = default_tile(heads);
    index_scores_batch_tiled(
        g, profile, queries, weights, first, heads, dim, keys, key_scales, visible, out, tile,
    )
}

/// Whether every value is exactly a bf16 (the low 16 bits are zero).
fn bf16_exact(x: &[f32]) -> bool {
    x.iter()
        .fold(true, |all, v| all & (v.to_bits() & 0xFFFF == 0))
}

/// [`bf16_exact`] of the `n` values from byte `at` of a device buffer: rounds of `el_any_bits`
/// (each thread ORs at most 256 values) down to one flag, then a 4-byte download.
fn bf16_exact_on<E: Executor>(e: &E, x: &E::Buf, at: usize, n: usize) -> Result<bool, GpuError> {
    if n == 0 {
        return Ok(true);
    }
    let (mut src, mut at, mut n, mut mask) = (None::<E::Buf>, at, n, 0xFFFFu32);
    loop {
        let parts = n.div_ceil(256);
        let flags = e.alloc(parts * 4)?;
        let input = src.as_ref().map_or(Arg::Buf(x, at), |b| Arg::Buf(b, at));
        e.launch(
            "el_any_bits",
            grid_for(parts),
            &[
                input,
                Arg::I64(n as i64),
                Arg::U32(mask),
                Arg::I64(parts as i64),
                buf(&flags),
            ],
        )?;
        (src, at, n, mask) = (Some(flags), 0, parts, u32::MAX);
        if n == 1 {
            break;
        }
    }
    let mut any = [0u32];
    download(e, src.as_ref().expect("one round ran"), &mut any)?;
    Ok(any[0] == 0)
}

/// [`index_scores_batch`] with an explicit tile (tests use small ones to cross tile edges;
/// results do not depend on it beyond the GEMM's summation order).
#[allow(clippy::too_many_arguments)]
pub fn index_scores_batch_tiled<E: Executor>(
    g: &GpuBackend<E>,
    profile: IndexProfile,
    queries: &Act<E>,
    weights: &Act<E>,
    first: usize,
    heads: usize,
    dim: usize,
    keys: &[f32],
    key_scales: &[f32],
    visible: &[usize],
    out: &mut Act<E>,
    tile: TileShape,
) -> Result<(), GpuError> {
    let tokens = visible.len();
    assert!(
        queries.len() >= (first + tokens) * heads * dim,
        "index scores: queries not [first + T, heads, dim]"
    );
    assert!(
        weights.len() >= (first + tokens) * heads,
        "index scores: weights not [first + T, heads]"
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
    let dev = g.current_index();
    let e = g.dev_at(dev);
    let (values, weights) = (g.on(queries, dev)?, g.on(weights, dev)?);
    let block = Block {
        values: &*values,
        weights: &*weights,
        first,
        heads,
        dim,
        keys,
        key_scales,
        visible,
    };
    let n = tokens * heads * dim;
    let exact = || bf16_exact_on(e, &values, first * heads * dim * 4, n);
    scores_on(e, profile, &block, exact, g.output(out, dev)?, stride, tile)
}

/// A block of T prepared queries on the device (from query `first` of `values [.., heads,
/// dim]` / `weights [.., heads]`) and the host key rows they see.
struct Block<'a, B> {
    values: &'a B,
    weights: &'a B,
    first: usize,
    heads: usize,
    dim: usize,
    keys: &'a [f32],
    key_scales: &'a [f32],
    visible: &'a [usize],
}

/// The scores of a block into `out_b [T, stride]` on device `e`, tiled; `queries_exact` says
/// whether the block's query values are all bf16 (asked only when the keys are).
fn scores_on<E: Executor>(
    e: &E,
    profile: IndexProfile,
    b: &Block<'_, E::Buf>,
    queries_exact: impl FnOnce() -> Result<bool, GpuError>,
    out_b: &E::Buf,
    stride: usize,
    tile: TileShape,
) -> Result<(), GpuError> {
    let (heads, dim, visible, tokens) = (b.heads, b.dim, b.visible, b.visible.len());
    assert_eq!(
        b.keys.len(),
        b.key_scales.len() * dim,
        "index scores: keys not [rows, dim]"
    );
    let max_visible = visible.iter().copied().max().unwrap_or(0);
    assert!(
        max_visible <= stride && max_visible <= b.key_scales.len(),
        "index scores: {max_visible} visible rows, but stride {stride} and {} keys",
        b.key_scales.len()
    );
    assert!(
        max_visible <= i32::MAX as usize,
        "index scores: too many rows"
    );
    let vis: Vec<i32> = visible.iter().map(|&v| v as i32).collect();
    let vis_b = upload(e, &vis)?;
    e.launch(
        "idx_mask",
        grid_for(tokens * stride),
        &[
            buf(out_b),
            buf(&vis_b),
            Arg::I64(tokens as i64),
            Arg::I64(stride as i64),
        ],
    )?;
    if max_visible == 0 {
        return Ok(());
    }
    let keys = &b.keys[..max_visible * dim];
    let ty = if bf16_exact(keys) && queries_exact()? {
        GemmType::Bf16
    } else {
        GemmType::F32
    };
    let k_f32 = upload(e, keys)?;
    let (mut q_scratch, mut k_scratch) = (None, None);
    let q_at = b.first * heads * dim * 4;
    let (q_b, q_base) =
        to_gemm_type_at(e, b.values, q_at, tokens * heads * dim, ty, &mut q_scratch)?;
    let k_b = to_gemm_type(e, &k_f32, keys.len(), ty, &mut k_scratch)?;
    let w_arg = Arg::Buf(b.weights, b.first * heads * 4);
    let s_b = upload(e, &b.key_scales[..max_visible])?;
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
                    x_offset: q_base + t0 * heads * dim * es,
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
                    w_arg,
                    buf(&s_b),
                    buf(&vis_b),
                    buf(out_b),
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
    Ok(())
}
