//! The model: loads a checkpoint, runs the forward pass over a sequence in chunks, and reports
//! to the observer.
//!
//! One state machine serves every use (docs/spec/attention.md 8): `forward` appends `tokens` at positions
//! `state.len()..` in chunks of `opts.chunk` tokens; a one-shot prefill, a chunked prefill and
//! single-token decode steps are the same code path and compute the same math. They are not
//! bit-identical: the GEMM's blocking (and its m = 1 vector path) depends on how many tokens
//! share a call, which moves results by f32 summation-order noise (~1e-7 relative). Under the
//! `exact` switches that stays ~1e-6 on logits; under rounding switches the noise occasionally
//! crosses a rounding boundary (an fp4 / bf16 / e4m3 step), e.g. ~3% of `official-fp4` top-k
//! lists on tiny differ between chunk 1 and one-shot. For a fixed chunk size every result is
//! deterministic.
//!
//! Numerics policy — this is the un-quantised reference (it must match HF transformers run in
//! float32): f32 storage and arithmetic everywhere. We deliberately skip REF's bf16 residual
//! stream / bf16 activations, its FP8 activation quantisation in front of every FP8 linear and
//! its bf16 rounding of attention probabilities and compressor outputs; weights are decoded
//! exactly (FP8 / FP4 / NVFP4 → f32), at load or on use. The ONLY rounding steps are the selected
//! switches: the index profile (`opts.index`, applied to index queries and keys inside
//! `numerics::profiles`) and `--kv fp8` (`opts.kv`: `numerics::quant::kv_fp8_sim` on the main
//! KV of window tokens and compressed rows, nope dims).
//!
//! Observer calls per chunk: `indexer` at every CSA layer and `attention` at every layer for
//! positions the observer `wants_position`; intermediates when `wants_intermediate`:
//! `embed` `[T, D]`, the per-layer names of `layer.rs` (`layers.L.hidden` `[T, n, D]`, ...)
//! and `indexer.rs` (`layers.L.indexer.scores` `[T, rows]` with -inf where not visible — `rows`
//! = rows emitted by the end of the chunk, so consumers pad to a common width —,
//! `layers.L.indexer.topk` `[T, k]` as f32 with -1 padding, `layers.L.indexer.q`,
//! `layers.L.indexer.weights`), and `logits` `[1, V]` for every position whose logits are
//! computed (the request plus probed positions when `logits` is wanted).
//!
//! Memory ([`WeightResidency`]): `Decoded` decodes every linear to f32 at load (4 bytes per
//! parameter: tiny, planted, a few flash layers); `Streamed` keeps linears in their stored
//! format, sharing the checkpoint's memory map, and decodes the band of rows each product needs
//! right before it (routed experts only when a token of the chunk picks them), so resident
//! memory is the stored bytes the OS keeps cached plus activations; `Auto` (the default of
//! [`Model::load`]) decodes when the decoded model takes at most a quarter of physical memory
//! ([`auto_residency`]). Both give bit-identical results (same decode, same banded products).
//! The model holds shares of the memory maps, so it outlives the `Checkpoint` it was loaded
//! from.

use super::embed::Embedding;
use super::head::Head;
use super::hyper::hc_params;
use super::layer::{emit_act, Layer, LayerRun, LayerSwitches};
use super::observer::Observer;
use super::state::SequenceState;
use super::ModelError;
use crate::backend::{Backend, CpuBackend, HcParams, Site, WeightResidency};
use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::numerics::profiles::{IndexProfile, KvMode};

/// How the model runs.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelOptions {
    /// Driving index profile: decides the real CSA selection.
    pub index: IndexProfile,
    /// Main-KV rounding.
    pub kv: KvMode,
    /// Indexer top-k override (`index_topk` of the config when `None`).
    pub topk: Option<usize>,
    /// Tokens per chunk (any size >= 1).
    pub chunk: usize,
}

impl Default for ModelOptions {
    /// The reference setting: `exact` index, `exact` KV, the config's top-k, chunks of 256.
    fn default() -> Self {
        ModelOptions {
            index: IndexProfile::Exact,
            kv: KvMode::Exact,
            topk: None,
            chunk: 256,
        }
    }
}

/// Which positions' logits `forward` returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogitsRequest {
    None,
    /// The last token of this call.
    Last,
    /// Every token of this call.
    All,
    /// Absolute positions, each inside this call.
    Positions(Vec<usize>),
}

/// What `forward` returns.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ForwardOutput {
    /// `(position, logits [V])`, ascending positions.
    pub logits: Vec<(usize, Vec<f32>)>,
}

/// A loaded model on a backend.
pub struct Model<B: Backend = CpuBackend> {
    backend: B,
    cfg: ModelConfig,
    opts: ModelOptions,
    topk: usize,
    hc: HcParams,
    embed: Embedding<B::Matrix>,
    layers: Vec<Layer<B::Matrix>>,
    head: Head<B::Matrix>,
    /// Wall seconds spent per site since load or the last [`Model::take_site_seconds`]
    /// (benchmarks): index 0 the embedding, 1..=layers the decoder layers, last the head.
    site_seconds: std::sync::Mutex<Vec<f64>>,
}

impl Model<CpuBackend> {
    /// Loads every main layer (MTP is ignored) onto the CPU reference backend, linears
    /// resident per [`WeightResidency::Auto`].
    pub fn load(ckpt: &Checkpoint, opts: ModelOptions) -> Result<Self, ModelError> {
        Self::load_weights(ckpt, opts, WeightResidency::Auto)
    }

    /// [`Model::load`] with the given weight residency (`Auto` resolved by
    /// [`auto_residency`]); `self.backend().weights()` tells which one is in force.
    pub fn load_weights(
        ckpt: &Checkpoint,
        opts: ModelOptions,
        weights: WeightResidency,
    ) -> Result<Self, ModelError> {
        let weights = match weights {
            WeightResidency::Auto => auto_residency(ckpt),
            w => w,
        };
        Self::load_with(CpuBackend::with_weights(weights), ckpt, opts)
    }
}

/// The residency `auto` picks for `ckpt` on this host
/// ([`crate::devices::plan::auto_residency`] against `MemTotal`; 16 GiB assumed where
/// /proc/meminfo is unreadable).
pub fn auto_residency(ckpt: &Checkpoint) -> WeightResidency {
    let total = crate::devices::host::meminfo_bytes("MemTotal").unwrap_or(16 << 30);
    let footprint = crate::devices::plan::Footprint::of_checkpoint(ckpt);
    crate::devices::plan::auto_residency(ckpt.config(), &footprint, total)
}

impl<B: Backend> Model<B> {
    /// Loads onto the given backend.
    pub fn load_with(
        backend: B,
        ckpt: &Checkpoint,
        opts: ModelOptions,
    ) -> Result<Self, ModelError> {
        Self::load_reporting(backend, ckpt, opts, &mut |_, _| {})
    }

    /// [`Model::load_with`], calling `loaded(done, total)` each time one of the model's
    /// `total` parts (the embedding, each decoder layer, the head: layers + 2) is on the
    /// backend, in that order: a CLI's load progress (on a GPU every stored weight is read
    /// from disk and uploaded here, minutes for Flash).
    pub fn load_reporting(
        backend: B,
        ckpt: &Checkpoint,
        opts: ModelOptions,
        loaded: &mut dyn FnMut(usize, usize),
    ) -> Result<Self, ModelError> {
        let cfg = ckpt.config().clone();
        let topk = Self::checked_topk(&cfg, &opts)?;
        let parts = cfg.num_hidden_layers + 2;
        backend.enter_site(Site::Embed);
        let embed = Embedding::load(&backend, ckpt, &cfg)?;
        loaded(1, parts);
        let layers = (0..cfg.num_hidden_layers)
            .map(|l| {
                backend.enter_site(Site::Layer(l));
                let layer = Layer::load(&backend, ckpt, &cfg, l)?;
                loaded(l + 2, parts);
                Ok(layer)
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        backend.enter_site(Site::Head);
        let head = Head::load(&backend, ckpt, &cfg)?;
        loaded(parts, parts);
        backend_result(&backend)?;
        let sites = layers.len() + 2;
        Ok(Model {
            site_seconds: std::sync::Mutex::new(vec![0.0; sites]),
            hc: hc_params(&cfg),
            backend,
            cfg,
            opts,
            topk,
            embed,
            layers,
            head,
        })
    }

    /// Checks `opts` against `cfg`, returning the top-k in force.
    fn checked_topk(cfg: &ModelConfig, opts: &ModelOptions) -> Result<usize, ModelError> {
        if opts.chunk == 0 {
            return Err(ModelError::BadOption {
                option: "chunk",
                found: "0".into(),
                expected: "at least 1 token".into(),
            });
        }
        let topk = opts.topk.unwrap_or(cfg.index_topk);
        if topk == 0 {
            return Err(ModelError::BadOption {
                option: "topk",
                found: "0".into(),
                expected: "at least 1 row".into(),
            });
        }
        let rows = super::max_compressed_rows(cfg);
        if topk > rows {
            return Err(ModelError::BadOption {
                option: "topk",
                found: topk.to_string(),
                expected: format!(
                    "at most {rows}, the compressed rows of max_position_embeddings {}",
                    cfg.max_position_embeddings
                ),
            });
        }
        if opts.index.v41_only() {
            return Err(ModelError::BadOption {
                option: "index",
                found: opts.index.name().into(),
                expected: "a DeepSeek-V4 profile (this one models DeepSeek-V4.1's indexer)".into(),
            });
        }
        if opts.kv == KvMode::Release {
            return Err(ModelError::BadOption {
                option: "kv",
                found: opts.kv.name().into(),
                expected: "exact or fp8 (release is DeepSeek-V4.1's KV rounding)".into(),
            });
        }
        if let Err(e) = opts.index.check_dim(cfg.index_head_dim) {
            return Err(ModelError::BadOption {
                option: "index",
                found: opts.index.name().into(),
                expected: format!(
                    "a profile valid at index_head_dim {}: {e}",
                    cfg.index_head_dim
                ),
            });
        }
        Ok(topk)
    }

    /// Switches profile / kv mode / top-k / chunk without reloading weights. Sequences started
    /// under other options must not be continued under the new ones (their cached rows were
    /// rounded the old way); start new sequences.
    pub fn set_options(&mut self, opts: ModelOptions) -> Result<(), ModelError> {
        self.topk = Self::checked_topk(&self.cfg, &opts)?;
        self.opts = opts;
        Ok(())
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn options(&self) -> &ModelOptions {
        &self.opts
    }

    /// The indexer top-k in force.
    pub fn topk(&self) -> usize {
        self.topk
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Wall seconds spent per site since load or the previous call (then reset): `[embed,
    /// layer 0, .., layer n-1, head]`. Every backend op returns with its outputs on the host, so
    /// these are complete per-layer times on any backend.
    pub fn take_site_seconds(&self) -> Vec<f64> {
        let mut s = self.site_seconds.lock().unwrap();
        let out = s.clone();
        s.iter_mut().for_each(|x| *x = 0.0);
        out
    }

    fn add_site_seconds(&self, site: usize, since: std::time::Instant) {
        self.site_seconds.lock().unwrap()[site] += since.elapsed().as_secs_f64();
    }

    /// A fresh, empty sequence.
    pub fn new_sequence(&self) -> SequenceState<B::Act> {
        SequenceState::new(&self.cfg)
    }

    /// Appends `tokens` to the sequence at positions `state.len()..`, returning the requested
    /// logits. Invalid token ids or logit positions are errors and leave `state` untouched.
    pub fn forward(
        &self,
        state: &mut SequenceState<B::Act>,
        tokens: &[u32],
        observer: &mut dyn Observer,
        logits: LogitsRequest,
    ) -> Result<ForwardOutput, ModelError> {
        let first = state.len();
        let end = first + tokens.len();
        self.embed.validate(tokens, first)?;
        if state.layers.len() != self.layers.len() {
            return Err(ModelError::BadOption {
                option: "state",
                found: format!("a sequence state for {} layers", state.layers.len()),
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
        let requested = requested_positions(&logits, first, end)?;
        state.rounding = Some(rounding);
        let switches = LayerSwitches {
            profile: self.opts.index,
            kv: self.opts.kv,
            topk: self.topk,
        };
        let mut out = ForwardOutput::default();
        for (c, chunk) in tokens.chunks(self.opts.chunk).enumerate() {
            let p0 = first + c * self.opts.chunk;
            let d = self.cfg.hidden_size;
            let t_site = std::time::Instant::now();
            self.backend.enter_site(Site::Embed);
            if observer.wants_intermediate("embed") {
                let e = self.embed.lookup(&self.backend, chunk);
                emit_act(&self.backend, observer, "embed", p0, &[chunk.len(), d], &e);
            }
            let mut streams = self.embed.streams(&self.backend, chunk);
            backend_result(&self.backend)?;
            self.add_site_seconds(0, t_site);
            for (l, (layer, ls)) in self.layers.iter().zip(state.layers.iter_mut()).enumerate() {
                let t_site = std::time::Instant::now();
                self.backend.enter_site(Site::Layer(l));
                self.backend.act_to_site(&mut streams);
                let mut run = LayerRun {
                    hc: &self.hc,
                    switches,
                    observer: &mut *observer,
                };
                layer.forward(&self.backend, &mut streams, chunk, p0, ls, &mut run);
                backend_result(&self.backend)?;
                self.add_site_seconds(l + 1, t_site);
            }
            state.len = p0 + chunk.len();
            let t_site = std::time::Instant::now();
            self.backend.enter_site(Site::Head);
            self.chunk_logits(&streams, p0, chunk.len(), &requested, observer, &mut out);
            backend_result(&self.backend)?;
            self.add_site_seconds(self.layers.len() + 1, t_site);
        }
        Ok(out)
    }

    /// Computes the logits of the chunk's requested / probed positions.
    fn chunk_logits(
        &self,
        streams: &B::Act,
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
        let row = self.hc.streams * self.cfg.hidden_size;
        let v = self.cfg.vocab_size;
        // At most the memory plan's logit rows at once (`trace --positions all` asks for every
        // position of a chunk: 8,192 x 129,280 logits would be 3.9 GiB the plan never charged).
        // Each row's logits depend on that row alone.
        for group in positions.chunks(crate::devices::plan::PROBED_LOGIT_ROWS as usize) {
            let mut rows = vec![0.0f32; group.len() * row];
            for (i, &p) in group.iter().enumerate() {
                let dst = &mut rows[i * row..(i + 1) * row];
                self.backend.act_read(streams, (p - p0) * row, dst);
            }
            let rows = self.backend.act_from(rows);
            let logits = self.head.logits(&self.backend, &rows, &self.hc);
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

/// A device failure the backend recorded (see [`Backend::take_error`]) as an model error. After
/// one, the sequence state is unusable; start a new sequence.
fn backend_result<B: Backend>(backend: &B) -> Result<(), ModelError> {
    match backend.take_error() {
        Some(why) => Err(ModelError::Backend {
            backend: backend.name().to_string(),
            why,
        }),
        None => Ok(()),
    }
}

/// Sorted, deduplicated absolute positions of a request for a call covering `first..end`.
pub(crate) fn requested_positions(
    req: &LogitsRequest,
    first: usize,
    end: usize,
) -> Result<Vec<usize>, ModelError> {
    let mut p = match req {
        LogitsRequest::None => Vec::new(),
        LogitsRequest::Last => (first < end).then(|| end - 1).into_iter().collect(),
        LogitsRequest::All => (first..end).collect(),
        LogitsRequest::Positions(v) => v.clone(),
    };
    if let Some(&bad) = p.iter().find(|&&x| x < first || x >= end) {
        return Err(ModelError::LogitsPosition {
            position: bad,
            first,
            end,
        });
    }
    p.sort_unstable();
    p.dedup();
    Ok(p)
}
