//! Sparse attention with sink on the GPU backend (attention.md 4.5; kernels in
//! `kernels/attention.cu`).
//!
//! The queries `[T, H, head_dim]` are a device activation (used in place on the current site's
//! device) and so is the output; the attended entries arrive as host slices pointing into a few
//! host KV buffers (window rows, compressed rows), many of them shared between queries.
//! [`EntryTable::build`] deduplicates them by pointer (the same slice start is the same vector)
//! into one table `[U, head_dim]` uploaded once per call, an i32 index table `[T, E]` (`E` = the
//! most entries of any query, `-1` padded) and the per-query counts `[T]`. Four launches then
//! compute, per query t and head h:
//!
//! - `attn_logits` (t, h, e): `ℓ = dot(q, v_e)·scale` with the CPU's 8-lane dot product;
//! - `attn_softmax` (t, h): `m = max(σ_h, ℓ…)`, `w_e = exp(ℓ_e - m)`, the denominator summed in
//!   entry order plus `exp(σ_h - m)` (the sink: denominator only), `inv = 1/denominator`;
//! - `attn_values` (t, h, c): `out = (Σ_e w_e·v_e[c])·inv`, entries in order;
//! - `attn_probs` (t, h, e): `p = w·inv` (only when some query wants its probabilities).
//!
//! Numerics are the CPU reference's (`cpu/attention.rs`) operation for operation in f32: the
//! only possible differences are `expf` ulps between libdevice and the host libm. The device
//! holds the probabilities of every query `[T, H, E]` (+ sink shares `[T, H]`) but only the
//! queries with `want_probs` are downloaded, compacted to the CPU's `[H, entries]` layout.

use super::executor::{buf, bytemuck_lite, grid_for, Arg, Executor};
use super::{Act, GpuBackend, GpuError};
use crate::backend::{AttentionBatch, AttentionProbs};
use std::collections::HashMap;

/// The deduplicated entries of a batch, as uploaded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EntryTable {
    /// Distinct vectors `[U, head_dim]`, in order of first use.
    pub rows: Vec<f32>,
    /// Distinct vector count `U`.
    pub unique: usize,
    /// Most entries of any query (`E`).
    pub emax: usize,
    /// `[T, E]`: row of `rows` for each entry, `-1` past a query's count.
    pub index: Vec<i32>,
    /// `[T]`: entries per query.
    pub count: Vec<i32>,
}

impl EntryTable {
    /// Deduplicates `entries` (vectors of `dim` values) by slice pointer.
    pub fn build(entries: &[Vec<&[f32]>], dim: usize) -> Result<Self, GpuError> {
        let tokens = entries.len();
        let emax = entries.iter().map(Vec::len).max().unwrap_or(0);
        let too_many = || GpuError::Other("attention: more entries than an i32 indexes".into());
        let mut seen: HashMap<usize, i32> = HashMap::new();
        let mut rows = Vec::new();
        let mut index = vec![-1i32; tokens * emax];
        let mut count = Vec::with_capacity(tokens);
        for (t, list) in entries.iter().enumerate() {
            count.push(i32::try_from(list.len()).map_err(|_| too_many())?);
            for (e, v) in list.iter().enumerate() {
                assert_eq!(
                    v.len(),
                    dim,
                    "attention: entry of query {t} not head_dim long"
                );
                let next = i32::try_from(seen.len()).map_err(|_| too_many())?;
                let id = *seen.entry(v.as_ptr() as usize).or_insert_with(|| {
                    rows.extend_from_slice(v);
                    next
                });
                index[t * emax + e] = id;
            }
        }
        Ok(EntryTable {
            rows,
            unique: seen.len(),
            emax,
            index,
            count,
        })
    }
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
    let table = EntryTable::build(batch.entries, d)?;
    let emax = table.emax;
    let dev = g.current_index();
    let e = g.dev_at(dev);
    let rows = g.up(&table.rows)?;
    let index = g.up_i32(&table.index)?;
    let count = g.up_i32(&table.count)?;
    let queries = g.on(batch.queries, dev)?;
    let sinks = g.up(batch.sinks)?;
    let weights = g.zeros((tokens * h * emax).max(1))?;
    let inv = g.zeros(tokens * h)?;
    let sink_p = g.zeros(tokens * h)?;
    let outb = g.output(out, dev)?;
    let (t64, h64, d64, e64) = (tokens as i64, h as i64, d as i64, emax as i64);
    let wide = tokens * h * emax;
    if wide > 0 {
        e.launch(
            "attn_logits",
            grid_for(wide),
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
    e.launch(
        "attn_values",
        grid_for(tokens * h * d),
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
