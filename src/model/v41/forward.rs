//! The DeepSeek-V4.1 model: loads a checkpoint, runs the forward pass over a sequence in
//! chunks (docs/spec/v41.md 5), reports to the observer.
//!
//! `forward` appends tokens at `state.len()..` in chunks of `opts.chunk`; one-shot prefill,
//! chunked prefill and decode are one code path (as V4's `model::forward`, equal up to f32
//! summation-order noise). Per chunk: embed → 4 copies → per layer (`super::layer`) → the last
//! FFN site's pre collapses the streams → `norm` → `head` (f32 logits) at the requested
//! positions. The chunk's selections travel between layers: the latest index source's top-k
//! for the layers that reuse it, the candidate source's kept blocks for its consumers.

use super::attention::LatestSelection;
use super::engram::Engram;
use super::indexer::SelectRun;
use super::layer::Layer;
use super::ngram::{engram_rows, TokenClasses};
use super::state::V41State;
use crate::backend::{Backend, CpuBackend, HcParams, WeightResidency};
use crate::checkpoint::Checkpoint;
use crate::config::V41Config;
use crate::model::forward::{ForwardOutput, LogitsRequest};
use crate::model::layer::emit_act;
use crate::model::observer::Observer;
use crate::model::{load_matrix, ModelError};
use crate::numerics::profiles::{IndexProfile, KvMode};
use crate::tokenizer::V4Tokenizer;

/// How the V4.1 model runs.
#[derive(Clone, Debug, PartialEq)]
pub struct V41Options {
    /// Index profile of every index source: `exact`, or one of the profiles without a
    /// Hadamard rotation (`bf16-qk`, `vllm-fp8`); V4.1 rotates nothing.
    pub index: IndexProfile,
    /// KV rounding: `exact` (none) or `release` (the release's window FP8 and compressed FP4).
    pub kv: KvMode,
    /// Top-k what-if (`index_topk` when `None`).
    pub topk: Option<usize>,
    /// Candidate-stage budget what-if (`candidate_topk_blocks` when `None`).
    pub candidate_blocks: Option<usize>,
    /// Tokens per chunk (>= 1).
    pub chunk: usize,
}

impl Default for V41Options {
    fn default() -> Self {
        V41Options {
            index: IndexProfile::Exact,
            kv: KvMode::Exact,
            topk: None,
            candidate_blocks: None,
            chunk: 256,
        }
    }
}

/// A loaded DeepSeek-V4.1 on a backend.
pub struct ModelV41<B: Backend = CpuBackend> {
    backend: B,
    cfg: V41Config,
    opts: V41Options,
    topk: usize,
    candidate_blocks: usize,
    hc: HcParams,
    classes: TokenClasses,
    embed: B::Matrix,
    layers: Vec<Layer<B::Matrix>>,
    norm: Vec<f32>,
    head: B::Matrix,
}

impl ModelV41<CpuBackend> {
    /// Loads every main layer (draft blocks and vision are not run) onto the CPU reference,
    /// linears decoded at load; `tokenizer` gives the Engram token classes.
    pub fn load(
        ckpt: &Checkpoint<V41Config>,
        tokenizer: &V4Tokenizer,
        opts: V41Options,
    ) -> Result<Self, ModelError> {
        Self::load_with(
            CpuBackend::with_weights(WeightResidency::Decoded),
            ckpt,
            tokenizer,
            opts,
        )
    }
}

impl<B: Backend> ModelV41<B> {
    /// Loads onto the given backend.
    pub fn load_with(
        backend: B,
        ckpt: &Checkpoint<V41Config>,
        tokenizer: &V4Tokenizer,
        opts: V41Options,
    ) -> Result<Self, ModelError> {
        let cfg = ckpt.config().clone();
        let t = &cfg.text;
        let (topk, candidate_blocks) = checked_options(&cfg, &opts)?;
        let classes = TokenClasses::derive(
            tokenizer,
            t.engram_compressed_vocab_size,
            t.engram_pad_token_id,
        )?;
        let mut hashes = cfg.engram_hashes().into_iter();
        let layers = (0..t.num_hidden_layers)
            .map(|l| {
                let engram = if t.engram_layer_ids.contains(&l) {
                    let hash = hashes.next().expect("one hash per Engram layer");
                    Some(Engram::load(&backend, ckpt, hash)?)
                } else {
                    None
                };
                Layer::load(&backend, ckpt, l, engram)
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let (v, d) = (t.vocab_size, t.hidden_size);
        Ok(ModelV41 {
            embed: load_matrix(&backend, ckpt, "embed", v, d)?,
            head: load_matrix(&backend, ckpt, "head", v, d)?,
            norm: ckpt.f32_tensor("norm.weight", &[d])?,
            hc: HcParams {
                streams: t.hc_mult,
                sinkhorn_iters: t.hc_sinkhorn_iters,
                norm_eps: t.rms_norm_eps as f32,
                hc_eps: t.hc_eps as f32,
            },
            layers,
            classes,
            topk,
            candidate_blocks,
            backend,
            cfg,
            opts,
        })
    }

    pub fn config(&self) -> &V41Config {
        &self.cfg
    }

    pub fn options(&self) -> &V41Options {
        &self.opts
    }

    /// Switches profile, KV rounding, top-k, candidate budget and chunk without reloading the
    /// weights; checked as at load. Sequences started under other options cannot continue
    /// (their cached rows were rounded the old way): start new ones.
    pub fn set_options(&mut self, opts: V41Options) -> Result<(), ModelError> {
        (self.topk, self.candidate_blocks) = checked_options(&self.cfg, &opts)?;
        self.opts = opts;
        Ok(())
    }

    /// The top-k in force.
    pub fn topk(&self) -> usize {
        self.topk
    }

    /// The candidate blocks kept per query in force.
    pub fn candidate_blocks(&self) -> usize {
        self.candidate_blocks
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// A fresh, empty sequence.
    pub fn new_sequence(&self) -> V41State<B::Act> {
        V41State::new(&self.cfg)
    }

    /// Appends `tokens` at positions `state.len()..`, returning the requested logits. Invalid
    /// token ids or logit positions are errors and leave `state` untouched.
    pub fn forward(
        &self,
        state: &mut V41State<B::Act>,
        tokens: &[u32],
        observer: &mut dyn Observer,
        logits: LogitsRequest,
    ) -> Result<ForwardOutput, ModelError> {
        let t = &self.cfg.text;
        let (first, end) = (state.len(), state.len() + tokens.len());
        if let Some((i, &bad)) = tokens
            .iter()
            .enumerate()
            .find(|(_, &x)| x as usize >= t.vocab_size)
        {
            return Err(ModelError::TokenOutOfRange {
                token: bad,
                position: first + i,
                vocab: t.vocab_size,
            });
        }
        if state.windows.len() != self.layers.len() {
            return Err(ModelError::BadOption {
                option: "state",
                found: format!("a sequence state for {} layers", state.windows.len()),
                expected: format!("one from this model ({} layers)", self.layers.len()),
            });
        }
        let rounding = (self.opts.index, self.opts.kv);
        if !state.is_empty() && state.rounding != Some(rounding) {
            return Err(ModelError::BadOption {
                option: "index / kv",
                found: format!("{} / {} for this model", rounding.0, rounding.1),
                expected: "the options the sequence was started with (start a new sequence)".into(),
            });
        }
        let requested = crate::model::forward::requested_positions(&logits, first, end)?;
        state.rounding = Some(rounding);
        let (d, n) = (t.hidden_size, self.hc.streams);
        let back = t.engram_max_ngram_size.saturating_sub(1);
        let hashes: Vec<_> = self
            .layers
            .iter()
            .map(|l| l.engram.as_ref().map(|e| &e.hash))
            .collect();
        let mut out = ForwardOutput::default();
        for (c, chunk) in tokens.chunks(self.opts.chunk).enumerate() {
            let p0 = first + c * self.opts.chunk;
            let tk = chunk.len();
            let ids: Vec<usize> = chunk.iter().map(|&x| x as usize).collect();
            let mut e = self.backend.act_uninit(tk * d);
            self.backend.gather_rows(&self.embed, &ids, &mut e);
            emit_act(&self.backend, observer, "embed", p0, &[tk, d], &e);
            let host = self.backend.act_into_host(e);
            let mut s = vec![0.0f32; tk * n * d];
            let mut p = vec![0.0f32; tk * n];
            for i in 0..tk {
                for j in 0..n {
                    s[(i * n + j) * d..(i * n + j + 1) * d]
                        .copy_from_slice(&host[i * d..(i + 1) * d]);
                }
                p[i * n] = 1.0;
            }
            let mut streams = self.backend.act_from(s);
            let mut pre = self.backend.act_from(p);
            let classes = self.classes.of(chunk);
            let mut latest: LatestSelection = None;
            let mut candidates = None;
            for (l, layer) in self.layers.iter().enumerate() {
                let rows = match hashes[l] {
                    Some(h) => engram_rows(h, &state.history, &classes, self.classes.pad()),
                    None => Vec::new(),
                };
                let mut run = SelectRun {
                    profile: self.opts.index,
                    kv: self.opts.kv,
                    topk: self.topk,
                    candidate_blocks: self.candidate_blocks,
                    block_rows: t.candidate_block_size,
                    candidates: &mut candidates,
                    observer: &mut *observer,
                };
                layer.forward(
                    &self.backend,
                    &mut streams,
                    &mut pre,
                    (chunk, p0, &rows),
                    &self.hc,
                    state,
                    &mut latest,
                    &mut run,
                );
            }
            state.history.extend_from_slice(&classes);
            let drop = state.history.len().saturating_sub(back);
            state.history.drain(..drop);
            state.len = p0 + tk;
            state.forget(&self.backend, t.sliding_window);
            self.chunk_logits(&streams, &pre, p0, tk, &requested, observer, &mut out);
        }
        if let Some(why) = self.backend.take_error() {
            return Err(ModelError::Backend {
                backend: self.backend.name().to_string(),
                why,
            });
        }
        Ok(out)
    }

    /// Logits of the chunk's requested (and, when the observer wants `logits`, probed)
    /// positions: `head · norm(Σ_j pre_j X_j)`.
    #[allow(clippy::too_many_arguments)]
    fn chunk_logits(
        &self,
        streams: &B::Act,
        pre: &B::Act,
        p0: usize,
        len: usize,
        requested: &[usize],
        observer: &mut dyn Observer,
        out: &mut ForwardOutput,
    ) {
        let observe = observer.wants_intermediate("logits");
        let positions: Vec<usize> = (p0..p0 + len)
            .filter(|p| {
                requested.binary_search(p).is_ok() || (observe && observer.wants_position(*p))
            })
            .collect();
        if positions.is_empty() {
            return;
        }
        let (d, n, v) = (
            self.cfg.text.hidden_size,
            self.hc.streams,
            self.cfg.text.vocab_size,
        );
        let mut h = self.backend.act_zeros(len * d);
        self.backend.hc_collapse(streams, pre, n, &mut h);
        self.backend.rms_norm(
            &mut h,
            d,
            Some(&self.norm),
            self.cfg.text.rms_norm_eps as f32,
        );
        for group in positions.chunks(crate::devices::plan::PROBED_LOGIT_ROWS as usize) {
            let mut rows = vec![0.0f32; group.len() * d];
            for (i, &p) in group.iter().enumerate() {
                self.backend
                    .act_read(&h, (p - p0) * d, &mut rows[i * d..(i + 1) * d]);
            }
            let rows = self.backend.act_from(rows);
            let mut logits = self.backend.act_uninit(group.len() * v);
            self.backend.matmul(&rows, &self.head, &mut logits);
            let logits = self.backend.act_into_host(logits);
            for (i, &p) in group.iter().enumerate() {
                let l = &logits[i * v..(i + 1) * v];
                if observe {
                    observer.intermediate("logits", p, &[1, v], l);
                }
                if requested.binary_search(&p).is_ok() {
                    out.logits.push((p, l.to_vec()));
                }
            }
        }
    }
}

/// Checks `opts` against `cfg`: the top-k and candidate budget in force.
fn checked_options(cfg: &V41Config, opts: &V41Options) -> Result<(usize, usize), ModelError> {
    let t = &cfg.text;
    let bad = |option: &'static str, found: String, expected: String| {
        Err(ModelError::BadOption {
            option,
            found,
            expected,
        })
    };
    if opts.chunk == 0 {
        return bad("chunk", "0".into(), "at least 1 token".into());
    }
    if !IndexProfile::V41.contains(&opts.index) {
        return bad(
            "index",
            opts.index.name().into(),
            "a profile without a Hadamard rotation (exact, bf16-qk, v41-fp4, sglang-v41-fp4, vllm-fp8): \
             DeepSeek-V4.1 rotates neither index queries nor keys"
                .into(),
        );
    }
    if !KvMode::V41.contains(&opts.kv) {
        return bad(
            "kv",
            opts.kv.name().into(),
            "exact or release (fp8 is DeepSeek-V4's rounding of 448 nope dims in blocks of 64)"
                .into(),
        );
    }
    if let Err(e) = opts.index.check_dim(t.index_head_dim) {
        return bad(
            "index",
            opts.index.name().into(),
            format!(
                "a profile valid at index_head_dim {}: {e}",
                t.index_head_dim
            ),
        );
    }
    let topk = opts.topk.unwrap_or(t.index_topk);
    if topk == 0 {
        return bad("topk", "0".into(), "at least 1 row".into());
    }
    if topk > t.max_position_embeddings {
        return bad(
            "topk",
            topk.to_string(),
            format!(
                "at most max_position_embeddings {} rows",
                t.max_position_embeddings
            ),
        );
    }
    let blocks = opts.candidate_blocks.unwrap_or(t.candidate_topk_blocks);
    if cfg.candidate_source().is_some() && blocks * t.candidate_block_size < topk {
        return bad(
            "candidate-blocks",
            blocks.to_string(),
            format!(
                "at least {} blocks of {} rows, so that the kept blocks hold the top-k {topk}",
                topk.div_ceil(t.candidate_block_size),
                t.candidate_block_size
            ),
        );
    }
    Ok((topk, blocks))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::NoObserver;
    use crate::numerics::quant::{kv_v41_compressed, kv_v41_window};
    use crate::synth::{Preset, SynthOptions};

    /// `--kv release` leaves every cached row on its format's grid (re-rounding changes
    /// nothing) and off the exact run's values; `--kv exact` rounds nothing.
    #[test]
    fn release_kv_rounds_window_and_compressed_rows() {
        let dir = tempfile::tempdir().unwrap();
        let opts = SynthOptions::new(
            Preset::V41Tiny,
            crate::checkpoint::WeightFormat::Bf16,
            dir.path(),
        );
        crate::synth::v41::synth_v41(&opts, None, &mut |_, _| {}).unwrap();
        let ckpt = Checkpoint::open_v41(dir.path()).unwrap();
        let tok = V4Tokenizer::builtin().unwrap();
        let tokens: Vec<u32> = (0..150u32).map(|i| 3 + i * 7919 % 129_000).collect();
        let run = |kv| {
            let o = V41Options {
                kv,
                index: IndexProfile::V41Fp4,
                ..V41Options::default()
            };
            let model = ModelV41::load(&ckpt, &tok, o).unwrap();
            let mut state = model.new_sequence();
            model
                .forward(&mut state, &tokens, &mut NoObserver, LogitsRequest::None)
                .unwrap();
            state
        };
        let (rounded, exact) = (run(KvMode::Release), run(KvMode::Exact));
        let hd = ckpt.config().text.head_dim;
        let rows = |s: &V41State, l: usize, compressed: bool| -> Vec<f32> {
            let cache = if compressed {
                &s.sources[&l].compressed
            } else {
                &s.windows[l].rows
            };
            cache.data().cloned().unwrap_or_default()
        };
        for (l, compressed) in [(0, false), (6, false), (2, true), (6, true)] {
            let r = rows(&rounded, l, compressed);
            let mut again = r.clone();
            for row in again.chunks_mut(hd) {
                if compressed {
                    kv_v41_compressed(row);
                } else {
                    kv_v41_window(row);
                }
            }
            assert_eq!(
                r, again,
                "layer {l} compressed {compressed}: rows on the grid"
            );
            assert_ne!(
                r,
                rows(&exact, l, compressed),
                "layer {l}: exact rows differ"
            );
            let e = rows(&exact, l, compressed);
            let mut e2 = e.clone();
            for row in e2.chunks_mut(hd) {
                kv_v41_window(row);
            }
            assert_ne!(e, e2, "layer {l}: the exact run rounds nothing");
        }
    }
}
