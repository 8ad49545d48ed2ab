//! The KV compressor (docs/spec/attention.md 5): pools token projections into compressed rows, streaming.
//!
//! One compressor of ratio m and output width c (c = head_dim for the main KV, index_head_dim
//! for the indexer), overlap factor κ = 2 when m = 4 else 1:
//! - per token j: `a_j = wkv · x_j`, `g_j = wgate · x_j + ape[j mod m]`, both `[κ·c]`, f32;
//! - HCA (m = 128): row w pools tokens `[128w, 128w+127]`, softmax over the 128 tokens per
//!   channel;
//! - CSA (m = 4, overlap): row w pools 8 slots per channel: the previous window's tokens
//!   `4w-4..4w-1` through their FIRST half (`a[0..c]`, `g[0..c]`) and the current window's tokens
//!   `4w..4w+3` through their SECOND half (`a[c..2c]`, `g[c..2c]`); row 0 has no previous window
//!   (logit -inf, weight 0). So row w depends on tokens `[4w-4, 4w+3]`.
//! - post-processing: RMSNorm(`norm`) then RoPE on the last rope dims at position `m·w`. REF
//!   rounds the pooled row to bf16 first; this f32 reference does not. Callers apply the
//!   main-KV fp8 simulation or the index-key preparation afterwards.
//!
//! Row w is emitted when token `m·w + m - 1` arrives, with the same value whatever the chunking;
//! query t sees it iff `w < floor((t+1)/m)` ([`crate::config::RowMapping::visible_rows`]).
//!
//! Shapes: `feed` takes the chunk's attention input `x [T, D]` at positions `first_pos..` and
//! returns the rows it completed, `[rows, c]`, starting at row index `first_row`.

use super::state::CompressorState;
use super::{load_matrix, ModelError};
use crate::backend::{Backend, PoolLayout};
use crate::checkpoint::Checkpoint;
use crate::config::{ModelConfig, RowMapping};
use crate::numerics::rope::RopeTable;

/// Rows completed by one `feed`.
pub struct EmittedRows<A> {
    pub first_row: usize,
    /// Rows emitted.
    pub count: usize,
    /// `[count, c]` (None when no row was completed).
    pub rows: Option<A>,
}

/// One compressor's weights.
pub struct Compressor<M> {
    wkv: M,
    wgate: M,
    /// `[ratio, κ·c]`.
    ape: Vec<f32>,
    /// `[c]`.
    norm: Vec<f32>,
    /// Ratio and overlap (κ = 2 when overlapping), from the layer-role table.
    rows: RowMapping,
    c: usize,
    norm_eps: f32,
}

impl<M> Compressor<M> {
    /// Loads `{prefix}.{wkv,wgate,ape,norm}` for the row mapping `rows` (the layer role's) and
    /// output width `c`.
    pub fn load<B: Backend<Matrix = M>>(
        backend: &B,
        ckpt: &Checkpoint,
        cfg: &ModelConfig,
        prefix: &str,
        rows: RowMapping,
        c: usize,
    ) -> Result<Self, ModelError> {
        let ratio = rows.ratio;
        let width = if rows.overlap { 2 * c } else { c };
        let d = cfg.hidden_size;
        Ok(Compressor {
            wkv: load_matrix(backend, ckpt, &format!("{prefix}.wkv"), width, d)?,
            wgate: load_matrix(backend, ckpt, &format!("{prefix}.wgate"), width, d)?,
            ape: ckpt.f32_tensor(&format!("{prefix}.ape"), &[ratio, width])?,
            norm: ckpt.f32_tensor(&format!("{prefix}.norm.weight"), &[c])?,
            rows,
            c,
            norm_eps: cfg.rms_norm_eps as f32,
        })
    }

    pub fn ratio(&self) -> usize {
        self.rows.ratio
    }

    /// Which tokens each row pools and when a query sees it.
    pub fn rows(&self) -> RowMapping {
        self.rows
    }

    /// Output width c.
    pub fn width(&self) -> usize {
        self.c
    }

    fn overlap(&self) -> bool {
        self.rows.overlap
    }

    /// Feeds the chunk `x [T, D]` at positions `first_pos..`, updating `state`, and returns the
    /// post-processed rows (norm + RoPE at m·w) it completed, after `finish` (a last in-place
    /// step, e.g. `--kv fp8` rounding).
    ///
    /// The chunk's projections are appended to the state's buffered ones and pooled where they
    /// are (on a GPU nothing leaves the device); then the buffer drops the tokens no later row
    /// reads.
    pub fn feed<B: Backend<Matrix = M>>(
        &self,
        backend: &B,
        x: &B::Act,
        first_pos: usize,
        state: &mut CompressorState<B::Act>,
        rope: &RopeTable,
        finish: impl FnOnce(&mut B::Act),
    ) -> EmittedRows<B::Act> {
        let (m, c) = (self.rows.ratio, self.c);
        let width = state.width;
        let tokens = backend.act_len(x) / backend.matrix_shape(&self.wkv).1;
        debug_assert_eq!(state.ratio, m, "compressor state of another ratio");
        debug_assert_eq!(state.end(), first_pos, "compressor state out of step");
        let mut values = backend.act_uninit(tokens * width);
        let mut logits = backend.act_uninit(tokens * width);
        backend.matmul(x, &self.wkv, &mut values);
        backend.matmul(x, &self.wgate, &mut logits);
        state.values.append(backend, &values);
        state.logits.append(backend, &logits);
        // The chunk's own copies are not needed past here (device memory for the pooling).
        drop((values, logits));

        let (first_row, held_from) = (state.rows_emitted, state.first_pos());
        let count = (first_pos + tokens) / m - first_row;
        let rows = (count > 0).then(|| {
            let layout = PoolLayout {
                ratio: m,
                c,
                overlap: self.overlap(),
                first_window: m * first_row - held_from,
                first_has_previous: self.overlap() && first_row > 0,
            };
            let held = "rows are emitted from held tokens";
            let (v, g) = (
                state.values.data().expect(held),
                state.logits.data().expect(held),
            );
            let mut rows = backend.act_uninit(count * c);
            backend.compressor_pool(v, g, &self.ape, layout, &mut rows);
            backend.rms_norm(&mut rows, c, Some(&self.norm), self.norm_eps);
            let positions: Vec<usize> = (first_row..first_row + count).map(|w| m * w).collect();
            backend.rope(rope, &mut rows, c, &positions, false);
            finish(&mut rows);
            rows
        });
        // The held tokens now start at the new current window (with overlap, the last full
        // window before it): drop the ones before.
        state.rows_emitted += count;
        let drop = state.first_pos() - held_from;
        state.values.drop_front(backend, drop);
        state.logits.drop_front(backend, drop);
        EmittedRows {
            first_row,
            count,
            rows,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::{self, CpuBackend, CpuMatrix};

    const D: usize = 3;
    const C: usize = 4;

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 + seed * 104729) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    }

    fn compressor(ratio: usize) -> Compressor<CpuMatrix> {
        let rows = if ratio == 4 {
            RowMapping::CSA
        } else {
            RowMapping::HCA
        };
        let width = if rows.overlap { 2 * C } else { C };
        Compressor {
            wkv: CpuMatrix::new(values(width * D, 1), width, D),
            wgate: CpuMatrix::new(values(width * D, 2), width, D),
            ape: values(ratio * width, 3),
            norm: values(C, 4).iter().map(|v| 1.0 + 0.1 * v).collect(),
            rows,
            c: C,
            norm_eps: 1e-6,
        }
    }

    /// Row w computed straight from docs/spec/attention.md 5.1 / 5.2 and 5.3.
    fn reference_row(
        comp: &Compressor<CpuMatrix>,
        x: &[f32],
        w: usize,
        rope: &RopeTable,
    ) -> Vec<f32> {
        let (m, width) = (comp.rows.ratio, comp.wkv.rows());
        let proj = |mat: &CpuMatrix, j: usize, ch: usize| -> f32 {
            (0..D)
                .map(|i| mat.to_f32()[ch * D + i] * x[j * D + i])
                .sum()
        };
        let mut slots: Vec<(usize, usize)> = Vec::new(); // (token, channel offset)
        if m == 4 {
            if w > 0 {
                slots.extend((0..4).map(|r| (4 * w - 4 + r, 0)));
            }
            slots.extend((0..4).map(|r| (4 * w + r, C)));
        } else {
            slots.extend((0..m).map(|r| (m * w + r, 0)));
        }
        let mut row: Vec<f32> = (0..C)
            .map(|k| {
                let logit = |&(j, off): &(usize, usize)| {
                    proj(&comp.wgate, j, off + k) + comp.ape[(j % m) * width + off + k]
                };
                let max = slots.iter().map(logit).fold(f32::NEG_INFINITY, f32::max);
                let weights: Vec<f32> = slots.iter().map(|s| (logit(s) - max).exp()).collect();
                let total: f32 = weights.iter().sum();
                slots
                    .iter()
                    .zip(&weights)
                    .map(|(&(j, off), wt)| wt / total * proj(&comp.wkv, j, off + k))
                    .sum()
            })
            .collect();
        cpu::rms_norm(&mut row, C, Some(&comp.norm), 1e-6);
        cpu::rope(rope, &mut row, C, &[m * w], false);
        row
    }

    fn feed_in_chunks(
        comp: &Compressor<CpuMatrix>,
        x: &[f32],
        chunks: &[usize],
        rope: &RopeTable,
    ) -> (Vec<f32>, CompressorState<Vec<f32>>) {
        let mut state = CompressorState::new(comp.ratio(), C);
        let (mut pos, mut rows) = (0, Vec::new());
        for &n in chunks {
            let out = comp.feed(
                &CpuBackend::new(),
                &x[pos * D..(pos + n) * D].to_vec(),
                pos,
                &mut state,
                rope,
                |_| {},
            );
            assert_eq!(out.first_row, rows.len() / C);
            assert_eq!(out.count * C, out.rows.as_ref().map_or(0, Vec::len));
            rows.extend(out.rows.unwrap_or_default());
            pos += n;
        }
        (rows, state)
    }

    #[test]
    fn csa_rows_match_the_formula_whatever_the_chunking() {
        let (comp, rope) = (compressor(4), RopeTable::plain(2, 10000.0));
        let x = values(13 * D, 5);
        let want: Vec<f32> = (0..3)
            .flat_map(|w| reference_row(&comp, &x, w, &rope))
            .collect();
        for chunks in [vec![13], vec![1; 13], vec![5, 8], vec![3, 3, 3, 4]] {
            let (rows, state) = feed_in_chunks(&comp, &x, &chunks, &rope);
            assert_eq!(
                rows.len(),
                3 * C,
                "rows 0..2 emitted by tokens 3, 7, 11 ({chunks:?})"
            );
            for (g, w) in rows.iter().zip(&want) {
                assert!((g - w).abs() < 1e-5, "{chunks:?}: {g} vs {w}");
            }
            assert_eq!(state.filled(), 1, "token 12 stays buffered");
        }
    }

    #[test]
    fn hca_rows_pool_128_tokens_without_overlap() {
        let (comp, rope) = (compressor(128), RopeTable::plain(2, 160000.0));
        let x = values(300 * D, 6);
        let want: Vec<f32> = (0..2)
            .flat_map(|w| reference_row(&comp, &x, w, &rope))
            .collect();
        for chunks in [vec![300], vec![100, 28, 1, 171]] {
            let (rows, state) = feed_in_chunks(&comp, &x, &chunks, &rope);
            assert_eq!(rows.len(), 2 * C);
            for (g, w) in rows.iter().zip(&want) {
                assert!((g - w).abs() < 1e-5, "{chunks:?}: {g} vs {w}");
            }
            assert_eq!(state.filled(), 300 - 256);
        }
    }

    /// The compressor pools the tokens the layer-role table's row mapping says (its CSA and
    /// HCA forms; the mapping itself is tested in `config::layers`).
    #[test]
    fn csa_row_w_pools_tokens_4w_minus_4_to_4w_plus_3() {
        let (csa, hca) = (compressor(4).rows, compressor(128).rows);
        assert_eq!(csa.row_tokens(0), (0, 3));
        assert_eq!(csa.row_tokens(1), (0, 7));
        assert_eq!(csa.row_tokens(250), (996, 1003));
        assert_eq!(csa.row_tokens(253), (1008, 1015));
        assert_eq!(hca.row_tokens(7), (896, 1023));
    }

    #[test]
    fn rows_are_emitted_by_their_last_token_and_visible_from_it() {
        let (csa, hca) = (compressor(4).rows, compressor(128).rows);
        assert_eq!(csa.first_visible(250), 1003);
        assert_eq!(hca.first_visible(7), 1023);
        for w in [0usize, 1, 250, 253] {
            let t = csa.first_visible(w);
            assert!(csa.visible_rows(t) > w, "row {w} visible at its emission");
            assert!(csa.visible_rows(t - 1) <= w, "row {w} invisible before");
        }
        assert_eq!(hca.visible_rows(1022), 7);
        assert_eq!(hca.visible_rows(1023), 8);
        assert_eq!(csa.visible_rows(2), 0);
    }
}
