//! The attention block of one layer (docs/spec/attention.md 4, 7): SWA, CSA or HCA.
//!
//! For the chunk's attention input `x [T, D]` (the attn_norm output) at positions `p0..p0+T`:
//! 1. query: `qr = q_norm(wq_a · x)` `[T, q_lora]`; `q = wq_b · qr` `[T, H, d]`; per-head RMS
//!    norm without weight; RoPE on the last `d_r` dims at t;
//! 2. window KV: `kv = kv_norm(wkv · x)` `[T, d]`, RoPE at t, optional `--kv fp8` rounding of the
//!    nope dims; key = value (MQA, one KV head);
//! 3. compressed entries: CSA / HCA rows from the main compressor (`--kv fp8` rounding too);
//!    CSA picks rows with the indexer, HCA attends every visible row;
//! 4. one softmax per head over window tokens `[max(0, t-W+1), t]` (chronological) then the
//!    compressed rows (CSA: indexer order; HCA: ascending), with the sink in the denominator
//!    only; logit scale `head_dim^-0.5`;
//! 5. inverse RoPE on the output's last `d_r` dims at the QUERY position t;
//! 6. grouped `wo_a` (`o_groups` groups of consecutive heads → `o_lora_rank` each), then `wo_b`
//!    → `[T, D]`.
//!
//! Within a chunk every query only sees window tokens `<= t` and rows visible at t, so a chunk
//! computes exactly what token-by-token decode would.

use super::compressor::Compressor;
use super::indexer::{Indexer, IndexerInput, IndexerRun};
use super::observer::{AttentionObservation, KvRows, Observer};
use super::state::LayerState;
use super::{load_matrix, ModelError};
use crate::backend::{AttentionBatch, AttentionProbs, Backend};
use crate::checkpoint::Checkpoint;
use crate::config::{LayerRole, ModelConfig};
use crate::numerics::profiles::{IndexProfile, KvMode};
use crate::numerics::rope::RopeTable;
use rayon::prelude::*;

/// Run-time switches of one attention call and the observer.
pub struct AttentionRun<'a> {
    pub layer: usize,
    pub profile: IndexProfile,
    pub kv: KvMode,
    pub topk: usize,
    pub observer: &'a mut dyn Observer,
}

/// One layer's attention weights.
pub struct Attention<M> {
    /// The layer's row in the layer-role table: whether it has a compressor and an indexer, and
    /// which compressed rows each query attends to.
    role: LayerRole,
    wq_a: M,
    q_norm: Vec<f32>,
    wq_b: M,
    wkv: M,
    kv_norm: Vec<f32>,
    wo_a: M,
    wo_b: M,
    sinks: Vec<f32>,
    compressor: Option<Compressor<M>>,
    indexer: Option<Indexer<M>>,
    rope: RopeTable,
    heads: usize,
    head_dim: usize,
    rope_dim: usize,
    groups: usize,
    window: usize,
    eps: f32,
}

impl<M> Attention<M> {
    /// Loads `layers.{layer}.attn.*`.
    pub fn load<B: Backend<Matrix = M>>(
        backend: &B,
        ckpt: &Checkpoint,
        cfg: &ModelConfig,
        layer: usize,
    ) -> Result<Self, ModelError> {
        let role = *cfg.layer_roles().get(layer);
        let p = format!("layers.{layer}.attn");
        let (d, h, ql) = (cfg.hidden_size, cfg.num_attention_heads, cfg.q_lora_rank);
        let hd = cfg.head_dim;
        let (g, ro) = (cfg.o_groups, cfg.o_lora_rank);
        let lin = |name: &str, out: usize, inp: usize| {
            load_matrix(backend, ckpt, &format!("{p}.{name}"), out, inp)
        };
        let compressor = if role.owns_kv() {
            Some(Compressor::load(
                backend,
                ckpt,
                cfg,
                &format!("{p}.compressor"),
                role.rows().expect("a layer that owns its KV has rows"),
                hd,
            )?)
        } else {
            None
        };
        let indexer = if role.has_indexer() {
            Some(Indexer::load(backend, ckpt, cfg, layer)?)
        } else {
            None
        };
        Ok(Attention {
            role,
            wq_a: lin("wq_a", ql, d)?,
            q_norm: ckpt.f32_tensor(&format!("{p}.q_norm.weight"), &[ql])?,
            wq_b: lin("wq_b", h * hd, ql)?,
            wkv: lin("wkv", hd, d)?,
            kv_norm: ckpt.f32_tensor(&format!("{p}.kv_norm.weight"), &[hd])?,
            wo_a: lin("wo_a", g * ro, h * hd / g)?,
            wo_b: lin("wo_b", d, g * ro)?,
            sinks: ckpt.f32_tensor(&format!("{p}.attn_sink"), &[h])?,
            compressor,
            indexer,
            rope: cfg.rope_table(role.kind),
            heads: h,
            head_dim: hd,
            rope_dim: cfg.qk_rope_head_dim,
            groups: g,
            window: cfg.sliding_window,
            eps: cfg.rms_norm_eps as f32,
        })
    }

    /// The attention output `[T, D]` for the chunk `x [T, D]` at positions `first_pos..`.
    pub fn forward<B: Backend<Matrix = M>>(
        &self,
        backend: &B,
        x: &B::Act,
        first_pos: usize,
        state: &mut LayerState<B::Act>,
        run: &mut AttentionRun<'_>,
    ) -> B::Act {
        let (h, hd) = (self.heads, self.head_dim);
        let ql = backend.matrix_shape(&self.wq_a).0;
        let tokens = backend.act_len(x) / backend.matrix_shape(&self.wq_a).1;
        let positions: Vec<usize> = (first_pos..first_pos + tokens).collect();

        let mut qr = backend.act_uninit(tokens * ql);
        backend.matmul(x, &self.wq_a, &mut qr);
        backend.rms_norm(&mut qr, ql, Some(&self.q_norm), self.eps);
        let mut q = backend.act_uninit(tokens * h * hd);
        backend.matmul(&qr, &self.wq_b, &mut q);
        backend.rms_norm(&mut q, hd, None, self.eps);
        backend.rope(&self.rope, &mut q, hd, &positions, false);

        let mut kv = backend.act_uninit(tokens * hd);
        backend.matmul(x, &self.wkv, &mut kv);
        backend.rms_norm(&mut kv, hd, Some(&self.kv_norm), self.eps);
        backend.rope(&self.rope, &mut kv, hd, &positions, false);
        self.round_kv_observed(backend, &mut kv, run, first_pos, KvRows::Window);
        debug_assert_eq!(state.window.end(), first_pos, "window cache out of step");
        state.window.append(backend, &kv);

        if let Some(comp) = &self.compressor {
            let cs = state
                .compressor
                .as_mut()
                .expect("compressed layer has compressor state");
            let emitted = comp.feed(backend, x, first_pos, cs, &self.rope, |rows| {
                self.round_kv_observed(backend, rows, run, first_pos, KvRows::Compressed)
            });
            if let Some(rows) = &emitted.rows {
                state.compressed.append(backend, rows);
            }
        }
        let selected = self.indexer.as_ref().map(|ix| {
            let store = state
                .indexer
                .as_mut()
                .expect("CSA layer has index key state");
            let mut ir = IndexerRun {
                layer: run.layer,
                profile: run.profile,
                topk: run.topk,
                observer: &mut *run.observer,
            };
            let input = IndexerInput {
                x,
                qr: &qr,
                first_pos,
            };
            ix.select(backend, input, store, &self.rope, &mut ir)
        });

        let mut o = self.attend(backend, &q, first_pos, state, selected.as_deref(), run);
        backend.rope(&self.rope, &mut o, hd, &positions, true);
        let (ro_total, _) = backend.matrix_shape(&self.wo_a);
        let mut z = backend.act_uninit(tokens * ro_total);
        backend.matmul_grouped(&o, self.groups, &self.wo_a, &mut z);
        let d = backend.matrix_shape(&self.wo_b).0;
        let mut out = backend.act_uninit(tokens * d);
        backend.matmul(&z, &self.wo_b, &mut out);

        state.window.forget_before(
            backend,
            (first_pos + tokens + 1).saturating_sub(self.window),
        );
        out
    }

    /// [`Self::round_kv`] under the run's KV mode; under `--kv fp8` an observer that wants them
    /// first gets the unrounded rows and may replace them ([`Observer::replace_kv_input`]:
    /// parity harnesses; replaced rows are uploaded again, recorded ones stay where they are).
    /// `first_pos` is the chunk's first position.
    fn round_kv_observed<B: Backend<Matrix = M>>(
        &self,
        backend: &B,
        rows: &mut B::Act,
        run: &mut AttentionRun<'_>,
        first_pos: usize,
        rows_kind: KvRows,
    ) {
        if run.kv == KvMode::Fp8 && backend.act_len(rows) > 0 && run.observer.wants_kv_inputs() {
            let mut host = backend.act_host(rows).into_owned();
            if run
                .observer
                .replace_kv_input(run.layer, first_pos, rows_kind, &mut host)
            {
                *rows = backend.act_from(host);
            }
        }
        self.round_kv(backend, rows, run.kv);
    }

    fn round_kv<B: Backend<Matrix = M>>(&self, backend: &B, rows: &mut B::Act, kv: KvMode) {
        if kv == KvMode::Fp8 && backend.act_len(rows) > 0 {
            backend.kv_fp8_sim(rows, self.head_dim, self.head_dim - self.rope_dim);
        }
    }

    /// Builds every query's entry list, runs the sparse attention and reports observed
    /// positions. Returns `o [T, H, d]` (before the inverse RoPE).
    fn attend<B: Backend<Matrix = M>>(
        &self,
        backend: &B,
        q: &B::Act,
        first_pos: usize,
        state: &LayerState<B::Act>,
        selected: Option<&[i32]>,
        run: &mut AttentionRun<'_>,
    ) -> B::Act {
        let hd = self.head_dim;
        let tokens = backend.act_len(q) / (self.heads * hd);
        let ratio = self.role.ratio;
        let k = run.topk;
        let window_rows = state.window.rows.rows() as u32;
        let window_first = state.window.first_pos;
        debug_assert!(
            window_first <= (first_pos + 1).saturating_sub(self.window)
                && first_pos + tokens <= state.window.end(),
            "window cache does not hold the chunk's windows"
        );
        // Per query (in parallel: on a GPU the device may be waiting for these lists): its
        // window positions, its compressed rows and the entries indexing both caches.
        let (role, span) = (self.role, self.window);
        let per_query: Vec<(Vec<usize>, Vec<usize>, Vec<u32>)> = (0..tokens)
            .into_par_iter()
            .map(|i| {
                let t = first_pos + i;
                let window: Vec<usize> = ((t + 1).saturating_sub(span)..=t).collect();
                let rows: Vec<usize> = match (role.rows(), selected) {
                    (None, _) => Vec::new(),
                    (Some(_), Some(sel)) if role.uses_selection() => sel[i * k..(i + 1) * k]
                        .iter()
                        .filter(|&&r| r >= 0)
                        .map(|&r| r as usize)
                        .collect(),
                    (Some(rows), _) => (0..rows.visible_rows(t)).collect(),
                };
                let mut entries = Vec::with_capacity(window.len() + rows.len());
                entries.extend(window.iter().map(|&p| (p - window_first) as u32));
                entries.extend(rows.iter().map(|&r| window_rows + r as u32));
                (window, rows, entries)
            })
            .collect();
        let (mut windows, mut rows_per_query, mut entries) = (
            Vec::with_capacity(tokens),
            Vec::with_capacity(tokens),
            Vec::with_capacity(tokens),
        );
        for (w, r, e) in per_query {
            windows.push(w);
            rows_per_query.push(r);
            entries.push(e);
        }
        let empty = backend.act_zeros(0);
        let window_kv = state.window.rows.data().unwrap_or(&empty);
        let compressed_kv = state.compressed.data().unwrap_or(&empty);
        let want: Vec<bool> = (0..tokens)
            .map(|i| run.observer.wants_attention(first_pos + i))
            .collect();
        let batch = AttentionBatch {
            heads: self.heads,
            head_dim: hd,
            scale: (1.0 / (hd as f64).sqrt()) as f32,
            sinks: &self.sinks,
            queries: q,
            kv: [window_kv, compressed_kv],
            entries: &entries,
            want_probs: &want,
        };
        let mut o = backend.act_uninit(backend.act_len(q));
        let mut probs: Vec<Option<AttentionProbs>> = vec![None; tokens];
        backend.sparse_attention(&batch, &mut o, &mut probs);
        for (i, p) in probs.iter().enumerate() {
            if let Some(p) = p {
                run.observer.attention(&AttentionObservation {
                    layer: run.layer,
                    kind: self.role.kind,
                    query_pos: first_pos + i,
                    heads: self.heads,
                    window_positions: &windows[i],
                    compressed_rows: &rows_per_query[i],
                    ratio,
                    probs: &p.probs,
                    sink_probs: &p.sink,
                });
            }
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::numerics::codecs::bf16_round;

    /// `--kv fp8` on main KV rows of the tiny model (64 dims = 48 nope + 16 rope): the nope dims
    /// get e4m3 with their block's power-of-two scale, the rope dims bf16 only (docs/spec/attention.md
    /// 3.5, 9.1). Rounding all 64 dims would share the nope block's scale and move the rope dims.
    #[test]
    fn kv_fp8_rounds_the_nope_dims_and_leaves_the_rope_dims_bf16() {
        let (_dir, ckpt) = crate::synth::tiny_for_tests();
        let cfg = ckpt.config().clone();
        let cpu = CpuBackend::new();
        let attn = Attention::load(&cpu, &ckpt, &cfg, 1).unwrap();
        let (hd, nope) = (cfg.head_dim, cfg.head_dim - cfg.qk_rope_head_dim);
        assert_eq!(
            (hd, nope),
            (64, 48),
            "the test's numbers assume the tiny dims"
        );

        let rows = vec![1.1f32; 2 * hd];
        let mut kept = cpu.act_from(rows.clone());
        attn.round_kv(&cpu, &mut kept, KvMode::Exact);
        assert_eq!(cpu.act_host(&kept).as_ref(), &rows[..]);

        let mut rounded = cpu.act_from(rows);
        attn.round_kv(&cpu, &mut rounded, KvMode::Fp8);
        let got = cpu.act_host(&rounded);
        // bf16(1.1) = 1.1015625; block amax -> scale 2^-8; 282 -> e4m3 288 (step 32), 1.125.
        let bf = bf16_round(1.1);
        for row in got.chunks(hd) {
            assert!(row[..nope].iter().all(|&v| v == 1.125), "nope: {row:?}");
            assert!(row[nope..].iter().all(|&v| v == bf), "rope: {row:?}");
        }
    }
}
