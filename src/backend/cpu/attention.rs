//! Attention-side reductions of the CPU backend: sparse attention with sink (docs/spec/attention.md 4.5)
//! and compressor pooling (docs/spec/attention.md 5.1 / 5.2).
//!
//! Sparse attention, per query t and head h over its entries e_i (key = value):
//! `ℓ_i = (q·e_i)·scale`, `o = Σ_i exp(ℓ_i - m) e_i / (Σ_i exp(ℓ_i - m) + exp(σ_h - m))`.
//! The sink σ_h is unscaled and has no value. `m` is the max over the logits AND the sink —
//! mathematically the same softmax as REF (which leaves the sink out of the max), but it cannot
//! overflow when a sink logit dominates. f32 throughout; REF's bf16 rounding of P before P·V is
//! deliberately not reproduced (this is the un-quantised reference). Parallel over (query, head).
//!
//! Pooling: per row and channel a softmax over the slots' gate logits weights the slot values;
//! slots with logit -inf (CSA row 0's missing previous window) get weight exactly 0.

use super::linalg::{axpy, dot};
use crate::backend::{AttentionBatch, AttentionProbs, PoolLayout};
use rayon::prelude::*;

/// One (query, head): writes `out [head_dim]`, and the probabilities when `probs` is given
/// (`[entries]`), returning the sink probability. Compiled for AVX2 where the CPU has it
/// ([`attend_one_head_avx2`]): no fused multiply-add, so the same bits either way.
#[inline(always)]
fn attend_one_head(
    q: &[f32],
    entries: &[&[f32]],
    scale: f32,
    sink: f32,
    out: &mut [f32],
    probs: Option<&mut [f32]>,
) -> f32 {
    let mut logits: Vec<f32> = entries.iter().map(|e| dot(q, e) * scale).collect();
    let max = logits.iter().fold(sink, |m, &v| m.max(v));
    let mut denom = 0.0f32;
    for l in logits.iter_mut() {
        *l = (*l - max).exp();
        denom += *l;
    }
    let sink_weight = (sink - max).exp();
    denom += sink_weight;
    out.fill(0.0);
    for (w, e) in logits.iter().zip(entries) {
        axpy(out, *w, e);
    }
    let inv = 1.0 / denom;
    out.iter_mut().for_each(|v| *v *= inv);
    if let Some(p) = probs {
        for (pi, w) in p.iter_mut().zip(&logits) {
            *pi = w * inv;
        }
    }
    sink_weight * inv
}

/// [`attend_one_head`] compiled for AVX2: its 8-lane dot product becomes one vector.
///
/// # Safety
/// The CPU has AVX2 ([`has_avx2`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn attend_one_head_avx2(
    q: &[f32],
    entries: &[&[f32]],
    (scale, sink): (f32, f32),
    out: &mut [f32],
    probs: Option<&mut [f32]>,
) -> f32 {
    attend_one_head(q, entries, scale, sink, out, probs)
}

fn has_avx2() -> bool {
    static AVX2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVX2.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        return std::arch::is_x86_feature_detected!("avx2");
        #[allow(unreachable_code)]
        false
    })
}

/// [`attend_one_head`] on the widest vectors this CPU has (the same values).
fn attend(
    q: &[f32],
    entries: &[&[f32]],
    (scale, sink): (f32, f32),
    out: &mut [f32],
    probs: Option<&mut [f32]>,
) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: checked just above.
        return unsafe { attend_one_head_avx2(q, entries, (scale, sink), out, probs) };
    }
    attend_one_head(q, entries, scale, sink, out, probs)
}

pub fn sparse_attention(
    batch: &AttentionBatch<'_>,
    out: &mut [f32],
    probs: &mut [Option<AttentionProbs>],
) {
    let (h, d) = (batch.heads, batch.head_dim);
    let tokens = batch.entries.len();
    let [window, compressed] = batch.kv;
    let window_rows = window.len() / d.max(1);
    // Each query's attended rows, resolved once for all its heads.
    let resolved: Vec<Vec<&[f32]>> = batch
        .entries
        .iter()
        .map(|ids| {
            ids.iter()
                .map(|&i| {
                    let i = i as usize;
                    if i < window_rows {
                        &window[i * d..(i + 1) * d]
                    } else {
                        let r = i - window_rows;
                        &compressed[r * d..(r + 1) * d]
                    }
                })
                .collect()
        })
        .collect();
    assert_eq!(
        batch.queries.len(),
        tokens * h * d,
        "attention: queries not [T, H, d]"
    );
    assert_eq!(out.len(), tokens * h * d, "attention: out not [T, H, d]");
    assert_eq!(probs.len(), tokens, "attention: one probs slot per query");
    assert_eq!(batch.sinks.len(), h, "attention: one sink per head");
    // Per (query, head) results: probabilities (when wanted) and sink share.
    let per_head: Vec<(Vec<f32>, f32)> = out
        .par_chunks_mut(d)
        .enumerate()
        .map(|(i, o)| {
            let (t, head) = (i / h, i % h);
            let entries = &resolved[t];
            let q = &batch.queries[i * d..(i + 1) * d];
            let mut p = if batch.want_probs[t] {
                vec![0.0f32; entries.len()]
            } else {
                Vec::new()
            };
            let probs_out = if batch.want_probs[t] {
                Some(p.as_mut_slice())
            } else {
                None
            };
            let sink = attend(q, entries, (batch.scale, batch.sinks[head]), o, probs_out);
            (p, sink)
        })
        .collect();
    for (t, slot) in probs.iter_mut().enumerate() {
        if !batch.want_probs[t] {
            *slot = None;
            continue;
        }
        let mut record = AttentionProbs {
            probs: Vec::with_capacity(h * batch.entries[t].len()),
            sink: Vec::with_capacity(h),
        };
        for (p, sink) in &per_head[t * h..(t + 1) * h] {
            record.probs.extend_from_slice(p);
            record.sink.push(*sink);
        }
        *slot = Some(record);
    }
}

/// [`crate::backend::Backend::compressor_pool`]: `values`, `logits` `[n, width]`, `ape`
/// `[ratio, width]`, `out [rows, c]`.
pub fn compressor_pool(
    values: &[f32],
    logits: &[f32],
    ape: &[f32],
    layout: PoolLayout,
    out: &mut [f32],
) {
    let (c, width, slots) = (layout.c, layout.width(), layout.slots());
    layout.check(values.len(), logits.len(), ape.len(), out.len());
    let m = layout.ratio;
    out.par_chunks_mut(c.max(1)).enumerate().for_each(|(i, o)| {
        for (k, oc) in o.iter_mut().enumerate() {
            // (logit, value) of slot s: the token's gate logit plus its window slot's bias.
            let slot = |s: usize| match layout.slot(i, s) {
                Some((j, off)) => (
                    logits[j * width + off + k] + ape[(s % m) * width + off + k],
                    values[j * width + off + k],
                ),
                None => (f32::NEG_INFINITY, 0.0),
            };
            let max = (0..slots).fold(f32::NEG_INFINITY, |mx, s| mx.max(slot(s).0));
            let (mut num, mut den) = (0.0f32, 0.0f32);
            for s in 0..slots {
                let (l, v) = slot(s);
                let w = (l - max).exp();
                den += w;
                num += w * v;
            }
            *oc = num / den;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sink_only_enters_the_denominator() {
        // Row 0 in the window, row 1 in the compressed rows.
        let (window, compressed) = ([1.0f32, 0.0], [0.0f32, 1.0]);
        let entries = vec![vec![0u32, 1]];
        // Logit scale 0.5 on q·k = 2: the window row's logit is 1. The sink is a logit already
        // and is not scaled.
        let q = [2.0f32, 0.0];
        let batch = AttentionBatch {
            heads: 1,
            head_dim: 2,
            scale: 0.5,
            sinks: &[0.5],
            queries: &q[..],
            kv: [&window[..], &compressed[..]],
            entries: &entries,
            want_probs: &[true],
        };
        let mut out = vec![0.0; 2];
        let mut probs = vec![None];
        sparse_attention(&batch, &mut out, &mut probs);
        let (a, b, s) = (1f32.exp(), 1.0f32, 0.5f32.exp());
        let den = a + b + s;
        assert!((out[0] - a / den).abs() < 1e-6 && (out[1] - b / den).abs() < 1e-6);
        let p = probs[0].as_ref().unwrap();
        let total: f32 = p.probs.iter().sum::<f32>() + p.sink[0];
        assert!((total - 1.0).abs() < 1e-6, "{p:?}");
        assert!((p.sink[0] - s / den).abs() < 1e-6);
    }

    #[test]
    fn pooling_ignores_the_missing_previous_window_and_adds_the_slot_bias() {
        // Overlap, ratio 2, c = 1 (width 2): row 0 has no previous window, so it pools its
        // current tokens 0 and 1 through channel 1 only: logits 0 + 1 and 1 + 0 (equal), values
        // 1 and 3.
        let layout = PoolLayout {
            ratio: 2,
            c: 1,
            overlap: true,
            first_window: 0,
            first_has_previous: false,
        };
        let values = [100.0, 1.0, 100.0, 3.0];
        let logits = [50.0, 0.0, 50.0, 1.0];
        let ape = [0.0, 1.0, 0.0, 0.0];
        let mut out = [0.0];
        compressor_pool(&values, &logits, &ape, layout, &mut out);
        assert_eq!(out[0], 2.0);
        // With a previous window (the same two tokens, channel 0) their large logits win.
        let layout = PoolLayout {
            first_window: 2,
            first_has_previous: true,
            ..layout
        };
        let values = [100.0, 1.0, 100.0, 3.0, 7.0, 1.0, 7.0, 3.0];
        let logits = [50.0, 0.0, 50.0, 1.0, 0.0, 0.0, 0.0, 1.0];
        compressor_pool(&values, &logits, &ape, layout, &mut out);
        assert_eq!(out[0], 100.0);
    }
}
