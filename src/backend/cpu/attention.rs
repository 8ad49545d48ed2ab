//! Attention-side reductions of the CPU backend: sparse attention with sink (docs/spec/attention.md 4.5)
//! and compressor pooling (docs/spec/attention.md 5.1 / 5.2).
//!
//! Sparse attention, per query t and head h over its entries e_i (key = value):
//! `ℓ_i = (q·e_i)·scale`, `o = Σ_i exp(ℓ_i - m) e_i / (Σ_i exp(ℓ_i - m) + exp(σ_h - m))`.
//! The sink σ_h is unscaled and has no value. `m` is the max over the logits AND the sink —
//! mathematically the same softmax as REF (which leaves the sink out of the max), but it cannot
//! overflow when a sink logit dominates. f32 throughout; REF's bf16 rounding of P before P·V is
//! deliberately not reproduced (this is the un-quantised reference). Parallel over queries.
//!
//! Summation orders (the GPU kernels in kernels/attention.cu reproduce them bit for bit): each
//! logit is [`dot`]'s (eight interleaved partial sums, a fixed pairwise finish, then the tail),
//! the denominator sums the entries in order and then the sink, and `o` accumulates the entries
//! in order ([`axpy`]) before one multiplication by the inverse denominator. Every head of a
//! query attends the same rows, so the logits are computed 16 heads at a time with one head
//! per vector lane (the query transposed to `[d, heads]`): each lane performs exactly
//! [`dot`]'s operations for its head, a multiply and an add, never fused, so the bits are
//! those of one dot per head.
//!
//! Pooling: per row and channel a softmax over the slots' gate logits weights the slot values;
//! slots with logit -inf (CSA row 0's missing previous window) get weight exactly 0.

#[cfg(doc)]
use super::linalg::{axpy, dot};
use crate::backend::{AttentionBatch, AttentionProbs, PoolLayout};
use rayon::prelude::*;

/// Heads whose logits one pass over an entry computes (one per vector lane).
const HEAD_BLOCK: usize = 16;

/// Per-thread buffers of one query: its query by head block (`[heads / HEAD_BLOCK, d]` columns
/// of [`HEAD_BLOCK`] heads) and its weights `[entries, heads rounded up to HEAD_BLOCK]`.
#[derive(Default)]
struct Scratch {
    q_t: Vec<[f32; HEAD_BLOCK]>,
    weights: Vec<f32>,
}

/// `out[j] = scale · dot(q_j, e)` for the [`HEAD_BLOCK`] heads of `q_block` (`[d]` columns of
/// one value per head), each lane in [`dot`]'s order.
#[inline(always)]
fn block_logits(q_block: &[[f32; HEAD_BLOCK]], e: &[f32], scale: f32) -> [f32; HEAD_BLOCK] {
    let d = e.len();
    let chunks = d / 8;
    let mut acc = [[0.0f32; HEAD_BLOCK]; 8];
    for c in 0..chunks {
        for (l, a) in acc.iter_mut().enumerate() {
            let i = c * 8 + l;
            let (ev, q) = (e[i], &q_block[i]);
            for j in 0..HEAD_BLOCK {
                a[j] += q[j] * ev;
            }
        }
    }
    let mut tail = [0.0f32; HEAD_BLOCK];
    for i in chunks * 8..d {
        let (ev, q) = (e[i], &q_block[i]);
        for j in 0..HEAD_BLOCK {
            tail[j] += q[j] * ev;
        }
    }
    std::array::from_fn(|j| {
        let a = |l: usize| acc[l][j];
        (((a(0) + a(4)) + (a(1) + a(5))) + ((a(2) + a(6)) + (a(3) + a(7))) + tail[j]) * scale
    })
}

/// The two inner loops of [`attend_query`]: [`block_logits`] and [`mix`] on portable code
/// ([`Portable`], vectorised by the compiler as far as it goes) or AVX-512 ([`Avx512`]), with
/// the same operations in the same order per lane, so the same bits.
trait Kernels {
    fn block_logits(q_block: &[[f32; HEAD_BLOCK]], e: &[f32], scale: f32) -> [f32; HEAD_BLOCK];
    fn mix(w_t: &[f32], stride: usize, rows: &[&[f32]], d: usize, out: &mut [f32]);
}

/// [`Kernels`] in plain Rust.
struct Portable;

impl Kernels for Portable {
    #[inline(always)]
    fn block_logits(q_block: &[[f32; HEAD_BLOCK]], e: &[f32], scale: f32) -> [f32; HEAD_BLOCK] {
        block_logits(q_block, e, scale)
    }

    #[inline(always)]
    fn mix(w_t: &[f32], stride: usize, rows: &[&[f32]], d: usize, out: &mut [f32]) {
        mix(w_t, stride, rows, d, out)
    }
}

/// [`Kernels`] on AVX-512 registers: one head per lane in [`Kernels::block_logits`], 16
/// channels per lane in [`Kernels::mix`]; a multiply then an add, never fused.
#[cfg(target_arch = "x86_64")]
struct Avx512;

#[cfg(target_arch = "x86_64")]
impl Kernels for Avx512 {
    #[inline(always)]
    fn block_logits(q_block: &[[f32; HEAD_BLOCK]], e: &[f32], scale: f32) -> [f32; HEAD_BLOCK] {
        use std::arch::x86_64::*;
        assert_eq!(q_block.len(), e.len(), "attention: query and row widths");
        let d = e.len();
        let chunks = d / 8;
        // SAFETY: only called from `attend_query_avx512` (the CPU has AVX-512F); every load
        // reads q_block[i] (16 f32) and e[i] for i < d, inside both slices (asserted above).
        unsafe {
            let (q, ep) = (q_block.as_ptr() as *const f32, e.as_ptr());
            let mut acc = [_mm512_setzero_ps(); 8];
            for c in 0..chunks {
                for (l, a) in acc.iter_mut().enumerate() {
                    let i = c * 8 + l;
                    let p = _mm512_mul_ps(
                        _mm512_loadu_ps(q.add(i * HEAD_BLOCK)),
                        _mm512_set1_ps(*ep.add(i)),
                    );
                    *a = _mm512_add_ps(*a, p);
                }
            }
            let mut tail = _mm512_setzero_ps();
            for i in chunks * 8..d {
                let p = _mm512_mul_ps(
                    _mm512_loadu_ps(q.add(i * HEAD_BLOCK)),
                    _mm512_set1_ps(*ep.add(i)),
                );
                tail = _mm512_add_ps(tail, p);
            }
            let lo = _mm512_add_ps(_mm512_add_ps(acc[0], acc[4]), _mm512_add_ps(acc[1], acc[5]));
            let hi = _mm512_add_ps(_mm512_add_ps(acc[2], acc[6]), _mm512_add_ps(acc[3], acc[7]));
            let sum = _mm512_add_ps(_mm512_add_ps(lo, hi), tail);
            let mut out = [0.0f32; HEAD_BLOCK];
            _mm512_storeu_ps(out.as_mut_ptr(), _mm512_mul_ps(sum, _mm512_set1_ps(scale)));
            out
        }
    }

    #[inline(always)]
    fn mix(w_t: &[f32], stride: usize, rows: &[&[f32]], d: usize, out: &mut [f32]) {
        use std::arch::x86_64::*;
        let n = rows.len();
        let h = out.len() / d.max(1);
        assert!(w_t.len() >= n * stride && stride >= h.next_multiple_of(MIX_HEADS));
        assert!(rows.iter().all(|e| e.len() == d), "attention: row widths");
        let full = d - d % MIX_LANES;
        for h0 in (0..h).step_by(MIX_HEADS) {
            let heads = (h - h0).min(MIX_HEADS);
            for c0 in (0..full).step_by(MIX_LANES) {
                // SAFETY: AVX-512F as above; w_t[i·stride + h0 + k] with h0 + k < stride and
                // i < n is inside w_t, e[c0..c0 + 16] inside each row (c0 + 16 <= d), the
                // stores inside out's rows h0 + k < h.
                unsafe {
                    let mut acc = [_mm512_setzero_ps(); MIX_HEADS];
                    for (i, e) in rows.iter().enumerate() {
                        let ev = _mm512_loadu_ps(e.as_ptr().add(c0));
                        let w = w_t.as_ptr().add(i * stride + h0);
                        for (k, a) in acc.iter_mut().enumerate() {
                            *a = _mm512_add_ps(*a, _mm512_mul_ps(_mm512_set1_ps(*w.add(k)), ev));
                        }
                    }
                    for (k, a) in acc.iter().enumerate().take(heads) {
                        _mm512_storeu_ps(out.as_mut_ptr().add((h0 + k) * d + c0), *a);
                    }
                }
            }
        }
        if full < d {
            // The last channels (d not a multiple of 16): the portable loop on them alone.
            mix_channels(w_t, stride, rows, d, full, out);
        }
    }
}

/// Heads and channels of one [`mix`] block.
const MIX_HEADS: usize = 4;
const MIX_LANES: usize = 16;

/// `out[h] = Σ_i w_t[i, h] · rows[i]` (`w_t [n, stride]`, `out [H, d]`), each element summed over
/// the entries in order from 0, as [`axpy`] into a zeroed row would: [`MIX_HEADS`] heads x
/// [`MIX_LANES`] channels stay in registers over all the entries. `stride` is a multiple of
/// [`MIX_HEADS`] at least H.
#[inline(always)]
fn mix(w_t: &[f32], stride: usize, rows: &[&[f32]], d: usize, out: &mut [f32]) {
    mix_channels(w_t, stride, rows, d, 0, out)
}

/// [`mix`] for the channels from `first` on only.
#[inline(always)]
fn mix_channels(
    w_t: &[f32],
    stride: usize,
    rows: &[&[f32]],
    d: usize,
    first: usize,
    out: &mut [f32],
) {
    let h = out.len() / d.max(1);
    for h0 in (0..h).step_by(MIX_HEADS) {
        let heads = (h - h0).min(MIX_HEADS);
        for c0 in (first..d).step_by(MIX_LANES) {
            let lanes = (d - c0).min(MIX_LANES);
            let mut acc = [[0.0f32; MIX_LANES]; MIX_HEADS];
            for (i, e) in rows.iter().enumerate() {
                for (k, a) in acc.iter_mut().enumerate() {
                    let wk = w_t[i * stride + h0 + k];
                    for (aj, &ej) in a.iter_mut().zip(&e[c0..c0 + lanes]) {
                        *aj += wk * ej;
                    }
                }
            }
            for (k, a) in acc.iter().enumerate().take(heads) {
                out[(h0 + k) * d + c0..(h0 + k) * d + c0 + lanes].copy_from_slice(&a[..lanes]);
            }
        }
    }
}

/// One query: `q [H, d]`, its attended `rows`, writes `out [H, d]`; returns the probabilities
/// `[H, entries]` when `want_probs` (else empty) and each head's sink probability.
#[inline(always)]
fn attend_query<K: Kernels>(
    q: &[f32],
    rows: &[&[f32]],
    (scale, sinks): (f32, &[f32]),
    scratch: &mut Scratch,
    out: &mut [f32],
    want_probs: bool,
) -> (Vec<f32>, Vec<f32>) {
    let (h, n) = (sinks.len(), rows.len());
    let d = q.len() / h.max(1);
    let stride = h.next_multiple_of(HEAD_BLOCK);
    // The query by head block: block b's column c holds heads 16b.. at channel c.
    let q_t = &mut scratch.q_t;
    q_t.clear();
    q_t.resize(d * (stride / HEAD_BLOCK), [0.0; HEAD_BLOCK]);
    for (head, qh) in q.chunks_exact(d.max(1)).enumerate() {
        let block = &mut q_t[head / HEAD_BLOCK * d..][..d];
        for (col, &v) in block.iter_mut().zip(qh) {
            col[head % HEAD_BLOCK] = v;
        }
    }
    // Logits, then weights, entry-major: `w_t [n, stride]` (padding heads score 0, unused).
    let w_t = &mut scratch.weights;
    w_t.clear();
    w_t.resize(n * stride, 0.0);
    // Head block outermost: its query columns (d x 16 values) stay in L1 over all the entries.
    for (h0, q_block) in (0..h).step_by(HEAD_BLOCK).zip(q_t.chunks_exact(d.max(1))) {
        for (e, w) in rows.iter().zip(w_t.chunks_exact_mut(stride)) {
            w[h0..h0 + HEAD_BLOCK].copy_from_slice(&K::block_logits(q_block, e, scale));
        }
    }
    let mut sink_share = vec![0.0f32; h];
    let mut inv = vec![0.0f32; h];
    for head in 0..h {
        let sink = sinks[head];
        let max = (0..n).fold(sink, |m, i| m.max(w_t[i * stride + head]));
        let mut denom = 0.0f32;
        for i in 0..n {
            let l = &mut w_t[i * stride + head];
            *l = (*l - max).exp();
            denom += *l;
        }
        let sink_weight = (sink - max).exp();
        denom += sink_weight;
        inv[head] = 1.0 / denom;
        sink_share[head] = sink_weight * inv[head];
    }
    K::mix(w_t, stride, rows, d, out);
    for (o, &i) in out.chunks_exact_mut(d.max(1)).zip(&inv) {
        o.iter_mut().for_each(|v| *v *= i);
    }
    let probs = if want_probs {
        (0..h * n)
            .map(|k| w_t[(k % n.max(1)) * stride + k / n.max(1)] * inv[k / n.max(1)])
            .collect()
    } else {
        Vec::new()
    };
    (probs, sink_share)
}

/// [`attend_query`] compiled for AVX2 (its lanes become vectors; no fused multiply-add, so the
/// same bits).
///
/// # Safety
/// The CPU has AVX2 ([`simd`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn attend_query_avx2(
    q: &[f32],
    rows: &[&[f32]],
    params: (f32, &[f32]),
    scratch: &mut Scratch,
    out: &mut [f32],
    want_probs: bool,
) -> (Vec<f32>, Vec<f32>) {
    attend_query::<Portable>(q, rows, params, scratch, out, want_probs)
}

/// [`attend_query`] compiled for AVX-512 (as [`attend_query_avx2`], on 16-lane vectors).
///
/// # Safety
/// The CPU has AVX-512F ([`simd`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn attend_query_avx512(
    q: &[f32],
    rows: &[&[f32]],
    params: (f32, &[f32]),
    scratch: &mut Scratch,
    out: &mut [f32],
    want_probs: bool,
) -> (Vec<f32>, Vec<f32>) {
    attend_query::<Avx512>(q, rows, params, scratch, out, want_probs)
}

/// The widest vectors [`attend`] may use here.
#[derive(Clone, Copy)]
enum Simd {
    Avx512,
    Avx2,
    Baseline,
}

fn simd() -> Simd {
    static SIMD: std::sync::OnceLock<Simd> = std::sync::OnceLock::new();
    *SIMD.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Simd::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                return Simd::Avx2;
            }
        }
        Simd::Baseline
    })
}

/// [`attend_query`] on the widest vectors this CPU has (the same values).
fn attend(
    q: &[f32],
    rows: &[&[f32]],
    params: (f32, &[f32]),
    scratch: &mut Scratch,
    out: &mut [f32],
    want_probs: bool,
) -> (Vec<f32>, Vec<f32>) {
    #[cfg(target_arch = "x86_64")]
    match simd() {
        // SAFETY: `simd` checked the CPU's features.
        Simd::Avx512 => unsafe {
            return attend_query_avx512(q, rows, params, scratch, out, want_probs);
        },
        // SAFETY: as above.
        Simd::Avx2 => unsafe {
            return attend_query_avx2(q, rows, params, scratch, out, want_probs);
        },
        Simd::Baseline => {}
    }
    attend_query::<Portable>(q, rows, params, scratch, out, want_probs)
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
    let row = |i: u32| {
        let i = i as usize;
        if i < window_rows {
            &window[i * d..(i + 1) * d]
        } else {
            let r = i - window_rows;
            &compressed[r * d..(r + 1) * d]
        }
    };
    assert_eq!(
        batch.queries.len(),
        tokens * h * d,
        "attention: queries not [T, H, d]"
    );
    assert_eq!(out.len(), tokens * h * d, "attention: out not [T, H, d]");
    assert_eq!(probs.len(), tokens, "attention: one probs slot per query");
    assert_eq!(batch.sinks.len(), h, "attention: one sink per head");
    if h * d == 0 {
        probs.iter_mut().for_each(|p| *p = None);
        return;
    }
    // Per query: probabilities (when wanted) and the sink share of each head.
    let per_query: Vec<(Vec<f32>, Vec<f32>)> = out
        .par_chunks_mut(h * d)
        .enumerate()
        .map_init(Scratch::default, |scratch, (t, o)| {
            let rows: Vec<&[f32]> = batch.entries[t].iter().map(|&i| row(i)).collect();
            let q = &batch.queries[t * h * d..(t + 1) * h * d];
            let params = (batch.scale, batch.sinks);
            attend(q, &rows, params, scratch, o, batch.want_probs[t])
        })
        .collect();
    for ((t, slot), (p, sink)) in probs.iter_mut().enumerate().zip(per_query) {
        *slot = batch.want_probs[t].then_some(AttentionProbs { probs: p, sink });
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

    /// The per-query products against a direct per-head evaluation in f64: several heads, queries
    /// with different entry counts (window and compressed rows mixed, one with none), and
    /// probabilities asked for some queries only.
    #[test]
    fn per_query_products_match_each_head_evaluated_directly() {
        let (h, d) = (3, 5);
        let mut seed = 7u32;
        let mut next = move || {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
            ((seed >> 8) % 2001) as f32 / 1000.0 - 1.0
        };
        let window: Vec<f32> = (0..4 * d).map(|_| next()).collect();
        let compressed: Vec<f32> = (0..3 * d).map(|_| next()).collect();
        let entries = vec![vec![0u32, 5, 2], vec![], vec![3, 4, 6, 1, 0], vec![6]];
        let tokens = entries.len();
        let queries: Vec<f32> = (0..tokens * h * d).map(|_| next() * 3.0).collect();
        let sinks = [0.3f32, -1.0, 2.0];
        let want_probs = [true, true, false, true];
        let batch = AttentionBatch {
            heads: h,
            head_dim: d,
            scale: 0.45,
            sinks: &sinks,
            queries: &queries[..],
            kv: [&window[..], &compressed[..]],
            entries: &entries,
            want_probs: &want_probs,
        };
        let mut out = vec![f32::NAN; tokens * h * d];
        let mut probs = vec![None; tokens];
        sparse_attention(&batch, &mut out, &mut probs);
        let row = |i: u32| -> &[f32] {
            let i = i as usize;
            if i < 4 {
                &window[i * d..(i + 1) * d]
            } else {
                &compressed[(i - 4) * d..(i - 3) * d]
            }
        };
        for (t, ids) in entries.iter().enumerate() {
            assert_eq!(probs[t].is_some(), want_probs[t], "query {t}");
            for head in 0..h {
                let q = &queries[(t * h + head) * d..(t * h + head + 1) * d];
                let logits: Vec<f64> = ids
                    .iter()
                    .map(|&i| {
                        let e = row(i);
                        0.45 * (0..d).map(|c| q[c] as f64 * e[c] as f64).sum::<f64>()
                    })
                    .collect();
                let sink = sinks[head] as f64;
                let max = logits.iter().fold(sink, |m, &v| m.max(v));
                let w: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
                let den = w.iter().sum::<f64>() + (sink - max).exp();
                for c in 0..d {
                    let want: f64 = ids
                        .iter()
                        .zip(&w)
                        .map(|(&i, wi)| wi * row(i)[c] as f64)
                        .sum::<f64>()
                        / den;
                    let got = out[(t * h + head) * d + c] as f64;
                    assert!(
                        (got - want).abs() < 1e-5,
                        "query {t} head {head} channel {c}: {got} vs {want}"
                    );
                }
                if let Some(p) = &probs[t] {
                    assert_eq!(p.probs.len(), h * ids.len());
                    for (j, wj) in w.iter().enumerate() {
                        let got = p.probs[head * ids.len() + j] as f64;
                        assert!(
                            (got - wj / den).abs() < 1e-6,
                            "query {t} head {head} entry {j}"
                        );
                    }
                    let sink_share = (sink - max).exp() / den;
                    assert!(
                        (p.sink[head] as f64 - sink_share).abs() < 1e-6,
                        "query {t} head {head} sink"
                    );
                }
            }
        }
    }

    /// The vector kernels this CPU dispatches to give the bits of the portable ones, for head
    /// counts and widths that leave partial head blocks, mix blocks and dot chunks.
    #[test]
    fn dispatched_kernels_equal_the_portable_ones_bit_for_bit() {
        let mut seed = 99u32;
        let mut next = move || {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
            ((seed >> 8) % 20001) as f32 / 10000.0 - 1.0
        };
        for (h, d, n) in [
            (21, 44, 9),
            (20, 64, 33),
            (3, 16, 1),
            (17, 7, 4),
            (5, 40, 0),
        ] {
            let q: Vec<f32> = (0..h * d).map(|_| next() * 2.0).collect();
            let table: Vec<f32> = (0..n * d).map(|_| next()).collect();
            let rows: Vec<&[f32]> = table.chunks_exact(d).collect();
            let sinks: Vec<f32> = (0..h).map(|_| next()).collect();
            let params = (0.3f32, &sinks[..]);
            let mut want = vec![f32::NAN; h * d];
            let portable = attend_query::<Portable>(
                &q,
                &rows,
                params,
                &mut Scratch::default(),
                &mut want,
                true,
            );
            let mut got = vec![f32::NAN; h * d];
            let dispatched = attend(&q, &rows, params, &mut Scratch::default(), &mut got, true);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "out, h {h} d {d} n {n}");
            assert_eq!(
                bits(&dispatched.0),
                bits(&portable.0),
                "probs, h {h} d {d} n {n}"
            );
            assert_eq!(
                bits(&dispatched.1),
                bits(&portable.1),
                "sinks, h {h} d {d} n {n}"
            );
        }
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
