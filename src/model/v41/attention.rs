//! The attention block of one DeepSeek-V4.1 layer (docs/spec/v41.md 5.3): window KV of its
//! own, compressed rows of its KV source picked by its index source.
//!
//! For the chunk's attention input `x [T, D]` at positions `p0..p0+T`:
//! 1. query: `qr = q_norm(wq_a · x)`; `q = wq_b · qr` `[T, H, d]` (no per-head norm); RoPE at t;
//! 2. window KV: `kv = kv_norm(wkv · x)`, RoPE at t (`--kv release`: e4m3 per 32 of all dims);
//!    key = value;
//! 3. a KV source feeds its compressor; the new latents give index keys (un-roped, through the
//!    indexer) and compressed rows (RoPE at the group's first position; `--kv release`: e2m1
//!    per 16 with E4M3 scales);
//! 4. an index source selects (`super::indexer`); any other layer with compressed KV reuses
//!    the selection of its index source, the latest one before it;
//! 5. one softmax per head over the window tokens `[max(0, t-W+1), t]` then the selected
//!    compressed rows, with the sink; scale `d^-0.5`; inverse RoPE at t; grouped `wo_a`,
//!    `wo_b` → `[T, D]`.
//!
//! RoPE: `rope_theta` without YaRN on window-only layers, `compress_rope_theta` with YaRN on
//! every layer with compressed KV, for all its rotations.

use super::compressor::Compressor;
use super::indexer::{Indexer, SelectRun};
use super::state::V41State;
use crate::backend::{AttentionBatch, AttentionProbs, Backend};
use crate::checkpoint::Checkpoint;
use crate::config::{LayerRole, V41Config};
use crate::model::observer::{AttentionObservation, Observer};
use crate::model::{load_matrix, ModelError};
use crate::numerics::profiles::KvMode;
use crate::numerics::rope::RopeTable;

/// The selection the latest index source made for the chunk's queries: `(layer, [T, k])`.
pub type LatestSelection = Option<(usize, Vec<i32>)>;

/// One layer's attention weights.
pub struct Attention<M> {
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
    groups: usize,
    window: usize,
    eps: f32,
}

impl<M> Attention<M> {
    /// Loads `layers.{layer}.attn.*`.
    pub fn load<B: Backend<Matrix = M>>(
        backend: &B,
        ckpt: &Checkpoint<V41Config>,
        layer: usize,
    ) -> Result<Self, ModelError> {
        let cfg = ckpt.config();
        let t = &cfg.text;
        let role = *cfg.layer_roles().get(layer);
        let p = format!("layers.{layer}.attn");
        let (d, h, hd, ql) = (
            t.hidden_size,
            t.num_attention_heads,
            t.head_dim,
            t.q_lora_rank,
        );
        let (g, ro) = (t.o_groups, t.o_lora_rank);
        let lin = |name: &str, out: usize, inp: usize| {
            load_matrix(backend, ckpt, &format!("{p}.{name}"), out, inp)
        };
        let rope = match (role.ratio, &t.rope_scaling) {
            (0, _) => RopeTable::plain(t.qk_rope_head_dim, t.rope_theta),
            (_, Some(s)) => RopeTable::yarn(t.qk_rope_head_dim, t.compress_rope_theta, &s.yarn()),
            (_, None) => RopeTable::plain(t.qk_rope_head_dim, t.compress_rope_theta),
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
            compressor: if role.owns_kv() {
                Some(Compressor::load(backend, ckpt, layer, role.ratio)?)
            } else {
                None
            },
            indexer: if role.has_indexer() {
                Some(Indexer::load(backend, ckpt, role)?)
            } else {
                None
            },
            rope,
            heads: h,
            head_dim: hd,
            groups: g,
            window: t.sliding_window,
            eps: t.rms_norm_eps as f32,
        })
    }

    /// The attention output `[T, D]` for the chunk `x [T, D]` at positions `first_pos..`;
    /// updates `latest` when this layer is an index source.
    pub fn forward<B: Backend<Matrix = M>>(
        &self,
        backend: &B,
        x: &B::Act,
        first_pos: usize,
        state: &mut V41State<B::Act>,
        latest: &mut LatestSelection,
        run: &mut SelectRun<'_>,
    ) -> B::Act {
        let (h, hd, l) = (self.heads, self.head_dim, self.role.layer);
        let ql = backend.matrix_shape(&self.wq_a).0;
        let tokens = backend.act_len(x) / backend.matrix_shape(&self.wq_a).1;
        let positions: Vec<usize> = (first_pos..first_pos + tokens).collect();

        let mut qr = backend.act_uninit(tokens * ql);
        backend.matmul(x, &self.wq_a, &mut qr);
        backend.rms_norm(&mut qr, ql, Some(&self.q_norm), self.eps);
        let mut q = backend.act_uninit(tokens * h * hd);
        backend.matmul(&qr, &self.wq_b, &mut q);
        backend.rope(&self.rope, &mut q, hd, &positions, false);

        let mut kv = backend.act_uninit(tokens * hd);
        backend.matmul(x, &self.wkv, &mut kv);
        backend.rms_norm(&mut kv, hd, Some(&self.kv_norm), self.eps);
        backend.rope(&self.rope, &mut kv, hd, &positions, false);
        if run.kv == KvMode::Release {
            backend.kv_release_sim(&mut kv, hd, false);
        }
        debug_assert_eq!(
            state.windows[l].end(),
            first_pos,
            "window cache out of step"
        );
        state.windows[l].append(backend, &kv);

        if let Some(comp) = &self.compressor {
            let source = state
                .sources
                .get_mut(&l)
                .expect("a KV source has its state");
            let emitted = comp.feed(backend, x, source);
            if let Some(latents) = emitted.latents {
                if let Some(ix) = &self.indexer {
                    ix.publish_keys(
                        backend,
                        &latents,
                        emitted.first_row,
                        &self.rope,
                        source,
                        run.profile,
                    );
                }
                let mut rows = latents;
                let group_pos: Vec<usize> = (emitted.first_row..emitted.first_row + emitted.count)
                    .map(|j| j * comp.ratio())
                    .collect();
                backend.rope(&self.rope, &mut rows, hd, &group_pos, false);
                if run.kv == KvMode::Release {
                    backend.kv_release_sim(&mut rows, hd, true);
                }
                source.compressed.append(backend, &rows);
            }
        }
        let selected: Option<&[i32]> = match (&self.indexer, self.role.kv_source) {
            (Some(ix), Some(src)) => {
                let source = state
                    .sources
                    .get(&src)
                    .expect("an index source reads a KV source");
                let sel = ix.select(backend, (x, &qr, first_pos), source, &self.rope, run);
                *latest = Some((l, sel));
                latest.as_ref().map(|(_, s)| &s[..])
            }
            (None, Some(_)) => {
                let (from, sel) = latest
                    .as_ref()
                    .expect("a layer with compressed KV follows its index source");
                debug_assert_eq!(Some(*from), self.role.index_source);
                Some(&sel[..])
            }
            _ => None,
        };
        let mut o = self.attend(
            backend,
            (&q, first_pos),
            state,
            (selected, run.topk),
            &mut *run.observer,
        );
        backend.rope(&self.rope, &mut o, hd, &positions, true);
        let (ro_total, _) = backend.matrix_shape(&self.wo_a);
        let mut z = backend.act_uninit(tokens * ro_total);
        backend.matmul_grouped(&o, self.groups, &self.wo_a, &mut z);
        let d = backend.matrix_shape(&self.wo_b).0;
        let mut out = backend.act_uninit(tokens * d);
        backend.matmul(&z, &self.wo_b, &mut out);
        out
    }

    /// Runs the sparse attention of every query: `o [T, H, d]` before the inverse RoPE; the
    /// probabilities of the positions the observer wants go to it.
    fn attend<B: Backend<Matrix = M>>(
        &self,
        backend: &B,
        (q, first_pos): (&B::Act, usize),
        state: &V41State<B::Act>,
        (selected, k): (Option<&[i32]>, usize),
        observer: &mut dyn Observer,
    ) -> B::Act {
        let tokens = backend.act_len(q) / (self.heads * self.head_dim);
        let window = &state.windows[self.role.layer];
        let window_rows = window.rows.rows() as u32;
        let per_query: Vec<(Vec<usize>, Vec<usize>)> = (0..tokens)
            .map(|i| {
                let t = first_pos + i;
                let positions: Vec<usize> = ((t + 1).saturating_sub(self.window)..=t).collect();
                let rows: Vec<usize> = selected.map_or_else(Vec::new, |sel| {
                    sel[i * k..(i + 1) * k]
                        .iter()
                        .filter(|&&r| r >= 0)
                        .map(|&r| r as usize)
                        .collect()
                });
                (positions, rows)
            })
            .collect();
        let entries: Vec<Vec<u32>> = per_query
            .iter()
            .map(|(positions, rows)| {
                positions
                    .iter()
                    .map(|&p| (p - window.first_pos) as u32)
                    .chain(rows.iter().map(|&r| window_rows + r as u32))
                    .collect()
            })
            .collect();
        let empty = backend.act_zeros(0);
        let compressed = self
            .role
            .kv_source
            .and_then(|s| state.sources.get(&s))
            .and_then(|s| s.compressed.data())
            .unwrap_or(&empty);
        let want: Vec<bool> = (0..tokens)
            .map(|i| observer.wants_attention(first_pos + i))
            .collect();
        let batch = AttentionBatch {
            heads: self.heads,
            head_dim: self.head_dim,
            scale: (1.0 / (self.head_dim as f64).sqrt()) as f32,
            sinks: &self.sinks,
            queries: q,
            kv: [window.rows.data().unwrap_or(&empty), compressed],
            entries: &entries,
            want_probs: &want,
        };
        let mut o = backend.act_uninit(backend.act_len(q));
        let mut probs: Vec<Option<AttentionProbs>> = vec![None; tokens];
        backend.sparse_attention(&batch, &mut o, &mut probs);
        for (i, p) in probs.iter().enumerate() {
            if let Some(p) = p {
                let (positions, rows) = &per_query[i];
                observer.attention(&AttentionObservation {
                    layer: self.role.layer,
                    kind: self.role.kind,
                    query_pos: first_pos + i,
                    heads: self.heads,
                    window_positions: positions,
                    compressed_rows: rows,
                    ratio: if selected.is_some() {
                        self.role.ratio
                    } else {
                        0
                    },
                    probs: &p.probs,
                    sink_probs: &p.sink,
                });
            }
        }
        o
    }
}
