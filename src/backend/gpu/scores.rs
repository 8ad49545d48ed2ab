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
//! [`index_scores_batch`] reads everything in place from device activations: its block of
//! queries and head weights (a byte offset at query `first`, no copy), and the leading
//! `max(visible)` rows of the prepared keys and their scales (the key cache may be longer); it
//! writes a device activation. Only the visibility `[T]` is uploaded. The bf16 test is a device
//! reduction over the keys the block reads and its queries (`bf16_exact_on`: `el_any_bits`
//! rounds, one 4-byte download). [`index_scores`] (one host query against host keys, host
//! output) uploads its inputs and runs the same code.

use super::executor::{buf, download, grid_for, upload, Arg, Executor, Gemm, GemmType, GpuError};
use super::matrix::{to_gemm_type, to_gemm_type_at};
use super::{Act, GpuBackend};
use crate::numerics::profiles::{IndexProfile, PreparedQuery};
use crate::numerics::score_batch::{IndexScoreBatch, TileShape};

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
    let (keys_b, scales_b) = (g.up(keys)?, g.up(key_scales)?);
    let out_b = g.zeros(out.len())?;
    let block = Block {
        values: &values,
        weights: &weights,
        first: 0,
        heads: query.heads,
        dim,
        keys: (&keys_b, keys.len()),
        key_scales: (&scales_b, key_scales.len()),
        visible: &[out.len()],
    };
    let tile = default_tile(query.heads);
    scores_on(g.dev(), profile, &block, &out_b, out.len(), tile)?;
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

/// The scores of a block of prepared queries on the device into `out [T, stride]` (see
/// [`crate::backend::Backend::index_scores_batch`]), in [`default_tile`]s.
pub fn index_scores_batch<E: Executor>(
    g: &GpuBackend<E>,
    batch: &IndexScoreBatch<'_, Act<E>>,
    out: &mut Act<E>,
) -> Result<(), GpuError> {
    let tile = default_tile(batch.heads);
    index_scores_batch_tiled(g, batch, out, tile)
}

/// Reduces "some of the `n` values from byte `at` of `x` has a bit of 0xFFFF set" (not exactly
/// a bf16) to one u32 flag written at byte `out.1` of `out.0`: rounds of `el_any_bits`, each
/// thread ORing at most 256 values (0 values give 0).
fn any_bits_into<E: Executor>(
    e: &E,
    (x, at): (&E::Buf, usize),
    n: usize,
    out: (&E::Buf, usize),
) -> Result<(), GpuError> {
    let (mut src, mut at, mut n) = (None::<E::Buf>, at, n);
    loop {
        let parts = n.div_ceil(256).max(1);
        let next = if parts == 1 {
            None
        } else {
            Some(e.alloc(parts * 4)?)
        };
        let input = Arg::Buf(src.as_ref().unwrap_or(x), at);
        let output = next
            .as_ref()
            .map_or(Arg::Buf(out.0, out.1), |b| Arg::Buf(b, 0));
        // The flags are 0 / 1, so later rounds keep the mask.
        let args = [
            input,
            Arg::I64(n as i64),
            Arg::U32(0xFFFF),
            Arg::I64(parts as i64),
            output,
        ];
        e.launch("el_any_bits", grid_for(parts), &args)?;
        match next {
            None => return Ok(()),
            Some(b) => (src, at, n) = (Some(b), 0, parts),
        }
    }
}

/// Whether every value of every part (`(buffer, byte offset, values)`) is exactly a bf16 (its
/// low 16 bits are zero): one flag per part ([`any_bits_into`]), a round over the flags, one
/// 4-byte download.
fn bf16_exact_on<E: Executor>(e: &E, parts: &[(&E::Buf, usize, usize)]) -> Result<bool, GpuError> {
    let flags = e.alloc(parts.len().max(1) * 4)?;
    for (i, &(x, at, n)) in parts.iter().enumerate() {
        any_bits_into(e, (x, at), n, (&flags, i * 4))?;
    }
    let any = if parts.len() > 1 {
        let one = e.alloc(4)?;
        any_bits_into(e, (&flags, 0), parts.len(), (&one, 0))?;
        one
    } else {
        flags
    };
    let mut flag = [0u32];
    download(e, &any, &mut flag)?;
    Ok(flag[0] == 0)
}

/// [`index_scores_batch`] with an explicit tile (tests use small ones to cross tile edges;
/// results do not depend on it beyond the GEMM's summation order).
pub fn index_scores_batch_tiled<E: Executor>(
    g: &GpuBackend<E>,
    batch: &IndexScoreBatch<'_, Act<E>>,
    out: &mut Act<E>,
    tile: TileShape,
) -> Result<(), GpuError> {
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
    let (keys_b, scales_b) = (g.on(keys, dev)?, g.on(key_scales, dev)?);
    let block = Block {
        values: &*values,
        weights: &*weights,
        first,
        heads,
        dim,
        keys: (&*keys_b, keys.len()),
        key_scales: (&*scales_b, key_scales.len()),
        visible,
    };
    scores_on(e, profile, &block, g.output(out, dev)?, stride, tile)
}

/// A block of T prepared queries on the device (from query `first` of `values [.., heads,
/// dim]` / `weights [.., heads]`) and the device key rows they see: `(buffer, values)` of the
/// prepared keys `[>= rows, dim]` and their scales `[>= rows]`.
struct Block<'a, B> {
    values: &'a B,
    weights: &'a B,
    first: usize,
    heads: usize,
    dim: usize,
    keys: (&'a B, usize),
    key_scales: (&'a B, usize),
    visible: &'a [usize],
}

/// The scores of a block into `out_b [T, stride]` on device `e`, tiled.
fn scores_on<E: Executor>(
    e: &E,
    profile: IndexProfile,
    b: &Block<'_, E::Buf>,
    out_b: &E::Buf,
    stride: usize,
    tile: TileShape,
) -> Result<(), GpuError> {
    let (heads, dim, visible, tokens) = (b.heads, b.dim, b.visible, b.visible.len());
    let ((keys, keys_len), (scales, scales_len)) = (b.keys, b.key_scales);
    let max_visible = visible.iter().copied().max().unwrap_or(0);
    assert!(
        max_visible <= stride && max_visible <= scales_len && max_visible * dim <= keys_len,
        "index scores: {max_visible} visible rows, but stride {stride}, {scales_len} scales and \
         {keys_len} key values of dim {dim}"
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
    let (q_at, q_n, k_n) = (
        b.first * heads * dim * 4,
        tokens * heads * dim,
        max_visible * dim,
    );
    let ty = if bf16_exact_on(e, &[(keys, 0, k_n), (b.values, q_at, q_n)])? {
        GemmType::Bf16
    } else {
        GemmType::F32
    };
    let (mut q_scratch, mut k_scratch) = (None, None);
    let (q_b, q_base) = to_gemm_type_at(e, b.values, q_at, q_n, ty, &mut q_scratch)?;
    let k_b = to_gemm_type(e, keys, k_n, ty, &mut k_scratch)?;
    let w_arg = Arg::Buf(b.weights, b.first * heads * 4);
    let tile_tokens = tile.tokens.clamp(1, tokens);
    let tile_rows = tile.rows.clamp(1, max_visible);
    let mut d = e.alloc((tile_tokens * heads * tile_rows * 4).max(1))?;
    let es = ty.bytes();
    let official = profile.bf16_scores() as i32;
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
                    ..Gemm::dense(0, 0, 0, ty)
                };
                e.gemm(&gemm, q_b, k_b, &mut d)?;
            }
            e.launch(
                "idx_combine",
                grid_for(ntok * n),
                &[
                    buf(&d),
                    w_arg,
                    buf(scales),
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
