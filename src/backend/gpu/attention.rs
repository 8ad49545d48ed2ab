//! Sparse attention with sink on the GPU backend (docs/spec/attention.md 4.5; kernels in
//! `kernels/attention.cu`, the row gather in `kernels/elementwise.cu`).
//!
//! Everything large is a device activation used in place on the current site's device: the
//! queries `[T, H, head_dim]`, the output, and the two KV caches `kv[0]` (window rows) and
//! `kv[1]` (compressed rows), `[rows, head_dim]` each. Per query the entries are indices into
//! `kv[0]` followed by `kv[1]`, many of them shared between queries. [`EntryTable::build`]
//! deduplicates them by index on the host: the distinct rows in ascending order (so the window
//! rows come first), an i32 index table `[T, E]` into them (`E` = the most entries of any query,
//! `-1` padded) and the per-query counts `[T]`. Only these index lists (and the sinks) are
//! uploaded; two `el_gather_rows` launches copy the distinct rows from `kv[0]` and `kv[1]` into
//! one packed table `[U, head_dim]`. Four launches then compute, per query t and head h:
//!
//! - `attn_logits` (t, h, e): `ℓ = dot(q, v_e)·scale` with the CPU's 8-lane dot product
//!   (`attn_logits4` when the heads divide by four: four heads a thread, the same bits);
//! - `attn_softmax` (t, h): `m = max(σ_h, ℓ…)`, `w_e = exp(ℓ_e - m)`, the denominator summed in
//!   entry order plus `exp(σ_h - m)` (the sink: denominator only), `inv = 1/denominator`;
//! - `attn_values` (t, h, c): `out = (Σ_e w_e·v_e[c])·inv`, entries in order (`attn_values4`
//!   when heads and `head_dim` divide by four: four heads and four columns a thread, the same
//!   bits);
//! - `attn_probs` (t, h, e): `p = w·inv` (only when some query wants its probabilities).
//!
//! Numerics are the CPU reference's (`cpu/attention.rs`) operation for operation in f32: the
//! only possible differences are `expf` ulps between libdevice and the host libm. The device
//! holds the probabilities of every query `[T, H, E]` (+ sink shares `[T, H]`) but only the
//! queries with `want_probs` are downloaded, compacted to the CPU's `[H, entries]` layout.

use super::executor::{buf, bytemuck_lite, grid_for, Arg, Executor, Gemm, GemmType};
use super::{Act, GpuBackend, GpuError};
use crate::backend::{AttentionBatch, AttentionProbs};
use rayon::prelude::*;

/// The deduplicated entries of a batch, as uploaded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EntryTable {
    /// The distinct attended rows `U`, ascending, as source rows: the first [`Self::window`]
    /// are rows of `kv[0]`, the rest rows of `kv[1]` (the entry index minus `rows(kv[0])`).
    /// Table row `j` is the row `ids[j]` names.
    pub ids: Vec<i32>,
    /// How many of `ids` are window rows (`kv[0]`).
    pub window: usize,
    /// Most entries of any query (`E`).
    pub emax: usize,
    /// `[T, E]`: table row of each entry, `-1` past a query's count.
    pub index: Vec<i32>,
    /// `[T]`: entries per query.
    pub count: Vec<i32>,
}

impl EntryTable {
    /// Deduplicates `entries` (indices into `rows[0]` window rows followed by `rows[1]`
    /// compressed rows). Panics on an index past both (a caller bug, as on the CPU).
    pub fn build(entries: &[Vec<u32>], rows: [usize; 2]) -> Result<Self, GpuError> {
        let total = rows[0] + rows[1];
        let too_many = || GpuError::Other("attention: more entries than an i32 indexes".into());
        i32::try_from(total).map_err(|_| too_many())?;
        let emax = entries.iter().map(Vec::len).max().unwrap_or(0);
        // Table row of every source row that some query attends (-1: none), in source order:
        // first marked USED, then numbered.
        const USED: i32 = i32::MAX;
        let mut slot = vec![-1i32; total];
        for (t, list) in entries.iter().enumerate() {
            for &i in list {
                assert!(
                    (i as usize) < total,
                    "attention: entry {i} of query {t} past the {} + {} kv rows",
                    rows[0],
                    rows[1]
                );
                slot[i as usize] = USED;
            }
        }
        let mut ids = Vec::new();
        for (i, s) in slot.iter_mut().enumerate() {
            if *s == USED {
                *s = ids.len() as i32;
                let source = if i < rows[0] { i } else { i - rows[0] };
                ids.push(source as i32);
            }
        }
        let window = slot[..rows[0]].iter().filter(|&&s| s >= 0).count();
        let count = entries
            .iter()
            .map(|list| i32::try_from(list.len()).map_err(|_| too_many()))
            .collect::<Result<Vec<i32>, _>>()?;
        // Queries in parallel (the device may be waiting for this table).
        let mut index = vec![-1i32; entries.len() * emax];
        if emax > 0 {
            index
                .par_chunks_mut(emax)
                .zip(entries.par_iter())
                .for_each(|(row, list)| {
                    for (r, &i) in row.iter_mut().zip(list) {
                        *r = slot[i as usize];
                    }
                });
        }
        Ok(EntryTable {
            ids,
            window,
            emax,
            index,
            count,
        })
    }

    /// Distinct attended rows (`U`).
    pub fn unique(&self) -> usize {
        self.ids.len()
    }
}

/// The packed table `[U, d]` of the distinct rows: `el_gather_rows` from `kv[0]` for the window
/// rows, then from `kv[1]` at row `window` (each cache placed on device `dev` only if used).
fn gather_table<E: Executor>(
    g: &GpuBackend<E>,
    dev: usize,
    kv: [&Act<E>; 2],
    table: &EntryTable,
    d: usize,
) -> Result<E::Buf, GpuError> {
    let e = g.dev_at(dev);
    // Both gathers together write all U rows.
    let rows = e.alloc_uninit((table.unique() * d * 4).max(1))?;
    let ids = g.up_i32(&table.ids)?;
    let parts = [(0, table.window), (table.window, table.unique())];
    for (cache, (from, to)) in kv.into_iter().zip(parts) {
        if to > from && d > 0 {
            let src = g.on(cache, dev)?;
            e.launch(
                "el_gather_rows",
                grid_for((to - from) * d),
                &[
                    buf(&*src),
                    Arg::Buf(&ids, from * 4),
                    Arg::I64((to - from) as i64),
                    Arg::I64(d as i64),
                    Arg::Buf(&rows, from * d * 4),
                ],
            )?;
        }
    }
    Ok(rows)
}

pub fn sparse_attention<E: Executor>(
    g: &GpuBackend<E>,
    batch: &AttentionBatch<'_, Act<E>>,
    out: &mut Act<E>,
    probs: &mut [Option<AttentionProbs>],
) -> Result<(), GpuError> {
    let (h, d) = (batch.heads, batch.head_dim);
    let tokens = batch.entries.len();
    assert_eq!(
        batch.queries.len(),
        tokens * h * d,
        "attention: queries not [T, H, d]"
    );
    assert_eq!(out.len(), tokens * h * d, "attention: out not [T, H, d]");
    assert_eq!(probs.len(), tokens, "attention: one probs slot per query");
    assert_eq!(batch.sinks.len(), h, "attention: one sink per head");
    assert_eq!(
        batch.want_probs.len(),
        tokens,
        "attention: one want_probs per query"
    );
    probs.iter_mut().for_each(|p| *p = None);
    if tokens == 0 || h == 0 {
        return Ok(());
    }
    let kv_rows = batch.kv.map(|a| a.len() / d.max(1));
    for (a, r) in batch.kv.iter().zip(kv_rows) {
        assert_eq!(a.len(), r * d, "attention: kv not [rows, head_dim]");
    }
    let table = EntryTable::build(batch.entries, kv_rows)?;
    let emax = table.emax;
    let dev = g.current_index();
    let e = g.dev_at(dev);
    let rows = gather_table(g, dev, batch.kv, &table, d)?;
    let index = g.up_i32(&table.index)?;
    let count = g.up_i32(&table.count)?;
    let queries = g.on(batch.queries, dev)?;
    let sinks = g.up(batch.sinks)?;
    // No fill: the logits pass writes every weight the later passes read (the kernels stop at
    // each query's count; the GEMM path writes whole rows, zero past the count), and the
    // softmax writes every (query, head)'s inv and sink share. At 128K tokens the weights
    // are [2,048, 64, 1,152] f32 per chunk, 600 MB.
    let mut weights = e.alloc_uninit((tokens * h * emax).max(1) * 4)?;
    let inv = e.alloc_uninit((tokens * h).max(1) * 4)?;
    let sink_p = e.alloc_uninit((tokens * h).max(1) * 4)?;
    let outb = g.output(out, dev)?;
    let (t64, h64, d64, e64) = (tokens as i64, h as i64, d as i64, emax as i64);
    let wide = tokens * h * emax;
    if g.attention_gemm() && d > 0 && emax > 0 {
        let bufs = Resident {
            rows: &rows,
            index: &index,
            count: &count,
            queries: &queries,
            sinks: &sinks,
            inv: &inv,
            sink_p: &sink_p,
        };
        attention_by_gemm(
            e,
            &bufs,
            &mut weights,
            outb,
            (tokens, h, d, emax),
            batch.scale,
            g.attention_tile_bytes,
        )?;
    } else {
        if wide > 0 {
            // Four heads a thread read each entry row once for all four (same bits).
            let (kernel, threads) = if h % 4 == 0 {
                ("attn_logits4", wide / 4)
            } else {
                ("attn_logits", wide)
            };
            e.launch(
                kernel,
                grid_for(threads),
                &[
                    buf(&*queries),
                    buf(&rows),
                    buf(&index),
                    buf(&count),
                    Arg::I64(t64),
                    Arg::I64(h64),
                    Arg::I64(d64),
                    Arg::I64(e64),
                    Arg::F32(batch.scale),
                    buf(&weights),
                ],
            )?;
        }
        e.launch(
            "attn_softmax",
            grid_for(tokens * h),
            &[
                buf(&sinks),
                buf(&count),
                Arg::I64(t64),
                Arg::I64(h64),
                Arg::I64(e64),
                buf(&weights),
                buf(&inv),
                buf(&sink_p),
            ],
        )?;
        // Four heads and four columns a thread read each entry's values once for all of them.
        let (kernel, threads) = if h % 4 == 0 && d % 4 == 0 {
            ("attn_values4", tokens * h * d / 16)
        } else {
            ("attn_values", tokens * h * d)
        };
        e.launch(
            kernel,
            grid_for(threads),
            &[
                buf(&rows),
                buf(&index),
                buf(&count),
                buf(&weights),
                buf(&inv),
                Arg::I64(t64),
                Arg::I64(h64),
                Arg::I64(d64),
                Arg::I64(e64),
                buf(outb),
            ],
        )?;
    }
    if !batch.want_probs.iter().any(|&w| w) {
        return Ok(());
    }
    if wide > 0 {
        e.launch(
            "attn_probs",
            grid_for(wide),
            &[
                buf(&count),
                buf(&inv),
                Arg::I64(t64),
                Arg::I64(h64),
                Arg::I64(e64),
                buf(&weights),
            ],
        )?;
    }
    let mut sink_all = vec![0f32; tokens * h];
    g.down(&sink_p, &mut sink_all)?;
    download_probs(e, &weights, &table, h, batch.want_probs, &sink_all, probs)
}

/// The batch's device inputs and per-(query, head) outputs (layouts in the module docs).
struct Resident<'a, B> {
    rows: &'a B,
    index: &'a B,
    count: &'a B,
    queries: &'a B,
    sinks: &'a B,
    inv: &'a B,
    sink_p: &'a B,
}

/// Sparse attention as batched GEMMs (`GpuBackend::with_attention_gemm`): every head of a query
/// attends to the same entries, so per query `logits [H, E] = q [H, d] · G [E, d]ᵀ` and
/// `out [H, d] = w [H, E] · G [E, d]` with `G` its entries gathered densely (`attn_gather`,
/// zeros past the count, so padding adds nothing), in tiles of queries whose `G` fits
/// `tile_bytes` (`GpuBackend::with_attention_tile_bytes`, default
/// [`super::matrix::WORKSPACE_BYTES`]). The softmax and sink are `attn_softmax`'s; the logits
/// are scaled and the values multiplied by 1 / denominator by `attn_scale_rows`. f32 operands
/// (cuBLAS's summation order, not the CPU's: equal to rounding).
fn attention_by_gemm<E: Executor>(
    e: &E,
    b: &Resident<'_, E::Buf>,
    weights: &mut E::Buf,
    out: &mut E::Buf,
    (tokens, h, d, emax): (usize, usize, usize, usize),
    scale: f32,
    tile_bytes: usize,
) -> Result<(), GpuError> {
    let tile = (tile_bytes / (emax * d * 4)).clamp(1, tokens);
    // attn_gather writes every element a tile's GEMMs read: no zero fill.
    let gathered = e.alloc_uninit(tile * emax * d * 4)?;
    let (h64, d64, e64) = (h as i64, d as i64, emax as i64);
    // One query's products: [H, d] x [E, d]^T (logits), then [H, E] x [E, d] (values).
    let product = |t0: usize, n: usize, values: bool| Gemm {
        m: h,
        n: if values { d } else { emax },
        k: if values { emax } else { d },
        ty: GemmType::F32,
        x_offset: t0 * h * if values { emax } else { d } * 4,
        ldx: if values { emax } else { d },
        w_offset: 0,
        ldw: d,
        y_offset: t0 * h * if values { d } else { emax } * 4,
        ldy: if values { d } else { emax },
        accumulate: false,
        batch: n,
        stride_x: h * if values { emax } else { d },
        stride_w: emax * d,
        stride_y: h * if values { d } else { emax },
        w_kn: values,
    };
    for t0 in (0..tokens).step_by(tile) {
        let n = tile.min(tokens - t0);
        let n64 = n as i64;
        e.launch(
            "attn_gather",
            grid_for(n * emax * d),
            &[
                buf(b.rows),
                Arg::Buf(b.index, t0 * emax * 4),
                Arg::Buf(b.count, t0 * 4),
                Arg::I64(n64),
                Arg::I64(e64),
                Arg::I64(d64),
                buf(&gathered),
            ],
        )?;
        e.gemm(&product(t0, n, false), b.queries, &gathered, weights)?;
        let w_tile = t0 * h * emax * 4;
        e.launch(
            "attn_scale_rows",
            grid_for(n * h * emax),
            &[
                Arg::Buf(&*weights, w_tile),
                Arg::Null,
                Arg::F32(scale),
                Arg::I64(n64 * h64),
                Arg::I64(e64),
            ],
        )?;
        e.launch(
            "attn_softmax",
            grid_for(n * h),
            &[
                buf(b.sinks),
                Arg::Buf(b.count, t0 * 4),
                Arg::I64(n64),
                Arg::I64(h64),
                Arg::I64(e64),
                Arg::Buf(&*weights, w_tile),
                Arg::Buf(b.inv, t0 * h * 4),
                Arg::Buf(b.sink_p, t0 * h * 4),
            ],
        )?;
        e.gemm(&product(t0, n, true), weights, &gathered, out)?;
        e.launch(
            "attn_scale_rows",
            grid_for(n * h * d),
            &[
                Arg::Buf(&*out, t0 * h * d * 4),
                Arg::Buf(b.inv, t0 * h * 4),
                Arg::F32(1.0),
                Arg::I64(n64 * h64),
                Arg::I64(d64),
            ],
        )?;
    }
    Ok(())
}

/// Downloads the probabilities of the queries that want them (runs of consecutive queries in
/// one read) and fills `probs[t]` in the CPU's `[H, entries]` layout.
fn download_probs<E: Executor>(
    e: &E,
    weights: &E::Buf,
    table: &EntryTable,
    h: usize,
    want: &[bool],
    sink_all: &[f32],
    probs: &mut [Option<AttentionProbs>],
) -> Result<(), GpuError> {
    let emax = table.emax;
    let per_query = h * emax;
    let mut t = 0;
    while t < want.len() {
        if !want[t] {
            t += 1;
            continue;
        }
        let end = (t..want.len()).find(|&u| !want[u]).unwrap_or(want.len());
        let mut raw = vec![0f32; (end - t) * per_query];
        if !raw.is_empty() {
            e.read(
                weights,
                t * per_query * 4,
                bytemuck_lite::bytes_of_mut(&mut raw),
            )?;
        }
        for u in t..end {
            let n = table.count[u] as usize;
            let base = (u - t) * per_query;
            let mut record = AttentionProbs {
                probs: Vec::with_capacity(h * n),
                sink: sink_all[u * h..(u + 1) * h].to_vec(),
            };
            for head in 0..h {
                let at = base + head * emax;
                record.probs.extend_from_slice(&raw[at..at + n]);
            }
            probs[u] = Some(record);
        }
        t = end;
    }
    Ok(())
}
