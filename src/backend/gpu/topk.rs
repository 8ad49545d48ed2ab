//! Exact top-k selection on the GPU backend, for one score row ([`topk`]) or T rows at once
//! ([`topk_batch`]), kernels `idx_topk_*` in `kernels/indexer.cu`.
//!
//! Identical to `CpuBackend::topk` per row: descending score, ties to the lower row, NaN below
//! every number (-inf included), `-0.0 == +0.0`, `-1` padding when a row has fewer than k
//! scores. Row t of a batch is `scores[t·stride..t·stride + visible[t]]` and its k results go to
//! `out[t·k..(t+1)·k]`; a single row is a batch of one.
//!
//! A radix select over order-preserving u32 keys of the scores (NaN lowest), 4 bits per pass
//! (eight passes), finds each row's k-th key K: per (row, lane) 16-bin histograms of the keys
//! matching the row's prefix so far (counted in registers; 256-bin histograms in global memory
//! took 136 us a launch at Flash's 8K on an H200; a row's lanes, a multiple of 32, take its
//! scores interleaved, so a warp loads adjacent scores), a 16-bin sum per row, one picking
//! thread per row. Then the rows above K and
//! the first needed rows equal to K (ties to the lower row) are collected per chunk in row
//! order, and each candidate is placed by counting the row's candidates that beat it. Every
//! kernel runs over all rows of a group at once, so a call is 27 launches per group (one group
//! unless the batch is large) on the scores where they lie (a device activation, read in place
//! from the group's first row; the per-row [`topk`] uploads its host row first) and one
//! download of the group's `[rows, k]` indices. Work: O(visible) per row in parallel chunks plus
//! O(k²) over k threads.
//!
//! Device memory per group is bounded: rows are processed in groups of at most
//! [`TOPK_GROUP_SCORES`] scores and [`TOPK_GROUP_CHUNKS`] (row, lane) histograms of 64 bytes.

use super::executor::{buf, download, grid_for, upload, Arg, Executor, GpuError};
use super::{Act, GpuBackend};

/// Bits per radix digit and bins per histogram (`IDX_DIGIT_BITS`, `IDX_BINS` in the kernels).
const DIGIT_BITS: usize = 4;
const BINS: usize = 1 << DIGIT_BITS;

/// Scores per top-k chunk (at least; longer rows get longer chunks, see [`TOPK_MAX_CHUNKS`]).
const TOPK_CHUNK: usize = 256;
/// Most chunks of one row (bounds the per-row histograms and the offset sums).
const TOPK_MAX_CHUNKS: usize = 1024;
/// Most scores (`rows x stride`) of one group of rows on the device (64 MiB of f32).
pub const TOPK_GROUP_SCORES: usize = 16 << 20;
/// Most (row, lane) histograms of one group (16 u32 each: 4 MiB); lanes are at least the
/// chunks, so this bounds the (row, chunk) counts too.
pub const TOPK_GROUP_CHUNKS: usize = 1 << 16;

/// `head` followed by `tail`, as one argument list.
fn chain<'a, B>(head: &[Arg<'a, B>], tail: &[Arg<'a, B>]) -> Vec<Arg<'a, B>> {
    head.iter().chain(tail).copied().collect()
}

/// Chunk length and chunk count for rows of at most `n` scores.
fn chunking(n: usize) -> (usize, usize) {
    let chunk = TOPK_CHUNK.max(n.div_ceil(TOPK_MAX_CHUNKS));
    (chunk, n.div_ceil(chunk).max(1))
}

/// Threads per row of the histogram passes: the chunk count rounded up to a whole warp, so a
/// warp's loads of one row are adjacent scores (`idx_topk_hist` interleaves its lanes).
fn histogram_lanes(chunks: usize) -> usize {
    chunks.next_multiple_of(32)
}

/// The top `out.len()` rows of one host score row.
pub fn topk<E: Executor>(
    g: &GpuBackend<E>,
    scores: &[f32],
    out: &mut [i32],
) -> Result<(), GpuError> {
    let n = scores.len();
    if out.is_empty() {
        return Ok(());
    }
    let s_b = g.up(scores)?;
    let rows = ScoreRows {
        dev: g.current_index(),
        scores: &s_b,
        len: n,
        stride: n,
        visible: &[n],
    };
    select(g, &rows, out, TOPK_GROUP_SCORES)
}

/// Top-k of T score rows (see the module docs); `k = out.len() / T`.
pub fn topk_batch<E: Executor>(
    g: &GpuBackend<E>,
    scores: &Act<E>,
    stride: usize,
    visible: &[usize],
    out: &mut [i32],
) -> Result<(), GpuError> {
    topk_batch_grouped(g, scores, stride, visible, out, TOPK_GROUP_SCORES)
}

/// [`topk_batch`] with at most `group_scores` scores per group of rows (at least one row per
/// group; tests use small groups to cross group edges; results do not depend on it).
pub fn topk_batch_grouped<E: Executor>(
    g: &GpuBackend<E>,
    scores: &Act<E>,
    stride: usize,
    visible: &[usize],
    out: &mut [i32],
    group_scores: usize,
) -> Result<(), GpuError> {
    if visible.is_empty() || out.is_empty() {
        return Ok(());
    }
    let dev = g.current_index();
    let s_b = g.on(scores, dev)?;
    let rows = ScoreRows {
        dev,
        scores: &*s_b,
        len: scores.len(),
        stride,
        visible,
    };
    select(g, &rows, out, group_scores)
}

/// T score rows on one device, as [`select`] reads them: row t is `visible[t]` scores from
/// `scores[t·stride]`.
struct ScoreRows<'a, B> {
    /// The device holding them.
    dev: usize,
    /// The scores, row t from value `t·stride` (the last row may be shorter than `stride`).
    scores: &'a B,
    /// Score values in `scores`.
    len: usize,
    /// Values from one row's start to the next's.
    stride: usize,
    /// `[T]`: visible scores per row.
    visible: &'a [usize],
}

/// Top-k of the score rows in groups of at most `group_scores` scores; `out` is `[T, k]`.
fn select<E: Executor>(
    g: &GpuBackend<E>,
    rows: &ScoreRows<'_, E::Buf>,
    out: &mut [i32],
    group_scores: usize,
) -> Result<(), GpuError> {
    let ScoreRows {
        dev,
        scores,
        len,
        stride,
        visible,
    } = *rows;
    let tokens = visible.len();
    if tokens == 0 {
        return Ok(());
    }
    assert_eq!(out.len() % tokens, 0, "topk batch: out not [T, k]");
    let k = out.len() / tokens;
    for (t, &v) in visible.iter().enumerate() {
        assert!(
            v <= stride && t * stride + v <= len,
            "topk batch: row {t} has {v} visible scores, stride {stride}, {len} scores"
        );
    }
    let max_visible = visible.iter().copied().max().unwrap_or(0);
    assert!(
        max_visible <= i32::MAX as usize,
        "topk: more than 2^31 rows"
    );
    assert!(k <= i32::MAX as usize, "topk: k beyond 2^31");
    if k == 0 {
        return Ok(());
    }
    let (_, chunks) = chunking(max_visible);
    let per_group = (group_scores / stride.max(1))
        .min(TOPK_GROUP_CHUNKS / histogram_lanes(chunks))
        .clamp(1, tokens);
    for r0 in (0..tokens).step_by(per_group) {
        let r1 = (r0 + per_group).min(tokens);
        let sel = &mut out[r0 * k..r1 * k];
        let vis = &visible[r0..r1];
        if vis.iter().all(|&v| v == 0) {
            sel.fill(-1);
            continue;
        }
        let rows = Arg::Buf(scores, r0 * stride * 4);
        select_group(g.dev_at(dev), rows, stride, vis, k, sel)?;
    }
    Ok(())
}

/// One group of rows on device `e`: `scores` points at its first row, `out` is its `[rows, k]`.
fn select_group<E: Executor>(
    e: &E,
    scores: Arg<'_, E::Buf>,
    stride: usize,
    visible: &[usize],
    k: usize,
    out: &mut [i32],
) -> Result<(), GpuError> {
    let rows = visible.len();
    let (chunk, chunks) = chunking(visible.iter().copied().max().unwrap_or(0));
    let vis: Vec<i32> = visible.iter().map(|&v| v as i32).collect();
    let vis_b = upload(e, &vis)?;
    // Per row: {bits of the k-th key so far, its rank among the keys sharing them}.
    let init: Vec<u32> = visible.iter().flat_map(|&v| [0, k.min(v) as u32]).collect();
    let state = upload(e, &init)?;
    let pairs = rows * chunks;
    let lanes = histogram_lanes(chunks);
    // Every histogram and total is written whole by its kernel.
    let hist = e.alloc_uninit(rows * lanes * BINS * 4)?;
    let total = e.alloc_uninit(rows * BINS * 4)?;
    // The arguments of the per-(row, chunk) kernels (count, collect), before their own.
    let head = [
        scores,
        Arg::I64(stride as i64),
        buf(&vis_b),
        Arg::I64(rows as i64),
        Arg::I64(chunk as i64),
        Arg::I64(chunks as i64),
        buf(&state),
    ];
    for shift in (0..32).step_by(DIGIT_BITS).rev() {
        let hist_args = [
            scores,
            Arg::I64(stride as i64),
            buf(&vis_b),
            Arg::I64(rows as i64),
            Arg::I64(lanes as i64),
            buf(&state),
            Arg::I32(shift),
            buf(&hist),
        ];
        e.launch("idx_topk_hist", grid_for(rows * lanes), &hist_args)?;
        e.launch(
            "idx_topk_total",
            grid_for(rows * BINS),
            &[
                buf(&hist),
                Arg::I64(rows as i64),
                Arg::I64(lanes as i64),
                buf(&total),
            ],
        )?;
        e.launch(
            "idx_topk_pick",
            grid_for(rows),
            &[
                buf(&total),
                buf(&state),
                Arg::I64(rows as i64),
                Arg::I32(shift),
            ],
        )?;
    }
    // Written whole too: the counts by idx_topk_count, the first min(k, visible) candidate slots
    // of each row by idx_topk_collect (the only ones idx_topk_rank reads), every output slot by
    // idx_topk_rank (a winner's place or the -1 padding).
    let counts = e.alloc_uninit(pairs * 2 * 4)?;
    e.launch(
        "idx_topk_count",
        grid_for(pairs),
        &chain(&head, &[buf(&counts)]),
    )?;
    let cand_key = e.alloc_uninit(rows * k * 4)?;
    let cand_row = e.alloc_uninit(rows * k * 4)?;
    let tail = [
        buf(&counts),
        Arg::I64(k as i64),
        buf(&cand_key),
        buf(&cand_row),
    ];
    e.launch("idx_topk_collect", grid_for(pairs), &chain(&head, &tail))?;
    let out_b = e.alloc_uninit(rows * k * 4)?;
    e.launch(
        "idx_topk_rank",
        grid_for(rows * k),
        &[
            buf(&cand_key),
            buf(&cand_row),
            buf(&vis_b),
            Arg::I64(rows as i64),
            Arg::I64(k as i64),
            buf(&out_b),
        ],
    )?;
    download(e, &out_b, out)
}
