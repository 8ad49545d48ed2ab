//! `trace` on a DeepSeek-V4.1 checkpoint (docs/outputs.md, "trace"): token ids through the V4.1
//! forward (`model::v41`) on the CPU reference, recording for chosen query positions what every
//! index source and the candidate stage did, plus the logits.
//!
//! Output tensors (one safetensors file; P recorded positions, T tokens, k the top-k):
//! - `tokens` i64 `[T]`, `positions` i64 `[P]`;
//! - per index source N (rows `R_N = floor(T / ratio_N)` of its KV source):
//!   `layers.N.indexer.scores` f32 `[P, R_N]` (the scores the layer ranks: -inf where not
//!   visible and, on a candidate consumer, outside the kept blocks) and
//!   `layers.N.indexer.topk` i32 `[P, k]` (descending score, ties to the lower row, -1 padding);
//! - per candidate consumer also `layers.N.indexer.scores_unconstrained` f32 `[P, R_N]` and
//!   `layers.N.indexer.topk_unconstrained` i32 `[P, k]` (the same without the candidate mask);
//! - on the candidate source `layers.N.candidates.block_scores` f32 `[P, B]` (each block's max
//!   score, -inf where nothing of it is visible; `B = ceil(R_N / candidate_block_size)`) and
//!   `layers.N.candidates.kept_blocks` u8 `[P, B]` (1 = kept; the newest visible block always);
//! - the logits as `--logits` chose (as for V4);
//! - with `--dump-indexer-inputs`, per index source: `layers.N.indexer.q` f32 `[P, heads, dim]`
//!   (after RoPE, before any rounding), `layers.N.indexer.weights` f32 `[P, heads]` (before the
//!   scale) and `layers.N.indexer.keys` f32 `[R_N, dim]` (its KV source's keys after `k_norm`
//!   and RoPE, before any rounding).
//!
//! Header metadata as V4's (`profile`, `kv`, `topk`, `logits`, `model`, `model_config_sha256`,
//! `backend`, `index_weight_scale`, `needlescope_version`) plus `family` (`deepseek_v41`) and
//! `candidate_blocks`. V4.1 runs on the CPU reference only; `--prompt` renders with its own
//! chat encoder (`probe::chat`, `ChatFormat::V41`); `--index` takes the profiles without a Hadamard rotation (exact,
//! bf16-qk, v41-fp4, sglang-v41-fp4, vllm-fp8), `--kv` exact or release.

use super::trace::{
    check_inputs, check_out_path, check_room_for, f32_bytes, parse_token_file, prompt_tokens,
    write_atomically, LogitsMode, RoomNeeded, TopLogits, TopRows, TraceInput, TraceOutcome,
    TracePlan, TOP_IDS, TOP_VALUES,
};
use crate::backend::Backend;
use crate::checkpoint::dtype::Dtype;
use crate::checkpoint::inventory::ExpectedTensor;
use crate::checkpoint::writer::SafetensorsWriter;
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::{CandidateStage, LayerRole, V41Config};
use crate::model::forward::LogitsRequest;
use crate::model::v41::{ModelV41, V41Options};
use crate::model::Observer;
use crate::probe::chat::ChatFormat;
use crate::record::BackendRecord;
use std::collections::{BTreeMap, BTreeSet};

/// What else a V4.1 trace takes besides the common [`TracePlan`].
#[derive(Clone, Copy, Debug, Default)]
pub struct V41TraceOptions {
    /// `--candidate-blocks`: the candidate stage's budget what-if (`None`: the config's).
    pub candidate_blocks: Option<usize>,
}

/// One index source's part of the file.
#[derive(Clone, Debug)]
struct SourceLayout {
    role: LayerRole,
    rows: usize,
}

/// The tensors of a V4.1 trace file, from the config and the arguments alone.
#[derive(Clone, Debug)]
pub struct V41TraceLayout {
    tokens: usize,
    positions: usize,
    topk: usize,
    block: usize,
    sources: Vec<SourceLayout>,
    vocab: usize,
    dump: Option<(usize, usize)>,
    logits: LogitsMode,
}

impl V41TraceLayout {
    fn for_config(cfg: &V41Config, tokens: usize, positions: usize, topk: usize) -> Self {
        let t = &cfg.text;
        V41TraceLayout {
            tokens,
            positions,
            topk,
            block: t.candidate_block_size.max(1),
            sources: cfg
                .layer_roles()
                .iter()
                .filter(|r| r.has_indexer())
                .map(|r| SourceLayout {
                    role: *r,
                    rows: tokens / r.ratio.max(1),
                })
                .collect(),
            vocab: t.vocab_size,
            dump: None,
            logits: LogitsMode::None,
        }
    }

    /// The tensors in file order (module doc).
    pub fn tensors(&self) -> Vec<ExpectedTensor> {
        let (t, p, k) = (self.tokens, self.positions, self.topk);
        let spec =
            |name: String, dtype: Dtype, shape: Vec<usize>| ExpectedTensor { name, dtype, shape };
        let mut out = vec![
            spec("tokens".into(), Dtype::I64, vec![t]),
            spec("positions".into(), Dtype::I64, vec![p]),
        ];
        for s in &self.sources {
            let l = s.role.layer;
            let name = |what: &str| format!("layers.{l}.indexer.{what}");
            out.push(spec(name("scores"), Dtype::F32, vec![p, s.rows]));
            out.push(spec(name("topk"), Dtype::I32, vec![p, k]));
            match s.role.candidate_stage {
                CandidateStage::Consumer { .. } => {
                    out.push(spec(
                        name("scores_unconstrained"),
                        Dtype::F32,
                        vec![p, s.rows],
                    ));
                    out.push(spec(name("topk_unconstrained"), Dtype::I32, vec![p, k]));
                }
                CandidateStage::Source => {
                    let b = s.rows.div_ceil(self.block);
                    let c = |what: &str| format!("layers.{l}.candidates.{what}");
                    out.push(spec(c("block_scores"), Dtype::F32, vec![p, b]));
                    out.push(spec(c("kept_blocks"), Dtype::U8, vec![p, b]));
                }
                CandidateStage::None => {}
            }
            if let Some((heads, dim)) = self.dump {
                out.push(spec(name("q"), Dtype::F32, vec![p, heads, dim]));
                out.push(spec(name("weights"), Dtype::F32, vec![p, heads]));
                out.push(spec(name("keys"), Dtype::F32, vec![s.rows, dim]));
            }
        }
        match self.logits {
            LogitsMode::None => {}
            LogitsMode::Top(n) => {
                out.push(spec(TOP_VALUES.into(), Dtype::F32, vec![p, n]));
                out.push(spec(TOP_IDS.into(), Dtype::I64, vec![p, n]));
            }
            LogitsMode::All => out.push(spec("logits".into(), Dtype::F32, vec![p, self.vocab])),
        }
        out
    }

    /// Bytes of tensor data in the file.
    pub fn file_bytes(&self) -> u64 {
        self.tensors().iter().map(|t| t.bytes()).sum()
    }

    /// The records held in memory before writing: the file's rows (a little more than the
    /// file for `top:N` ids, held as u32 + f32).
    fn memory_bytes(&self) -> u64 {
        self.file_bytes()
    }
}

/// Records the wanted intermediates at the recorded positions; under `--logits top:N` (`top`)
/// reduces each recorded position's row of logits to its top N as the model hands it over.
struct V41TraceObserver<'a> {
    recorded: &'a BTreeSet<usize>,
    names: BTreeSet<String>,
    rows: BTreeMap<String, BTreeMap<usize, Vec<f32>>>,
    top: Option<TopRows>,
}

impl Observer for V41TraceObserver<'_> {
    fn wants_position(&self, pos: usize) -> bool {
        self.recorded.contains(&pos)
    }
    fn wants_attention(&self, _pos: usize) -> bool {
        false
    }
    fn wants_intermediate(&self, name: &str) -> bool {
        self.names.contains(name) || (name == "logits" && self.top.is_some())
    }
    fn intermediate(&mut self, name: &str, first_pos: usize, shape: &[usize], data: &[f32]) {
        if let (Some(top), "logits") = (self.top.as_mut(), name) {
            top.keep(self.recorded, first_pos, shape, data);
        }
        if !self.names.contains(name) {
            return;
        }
        let per = data.len() / shape[0].max(1);
        let map = self.rows.entry(name.to_string()).or_default();
        for i in 0..shape[0] {
            if self.recorded.contains(&(first_pos + i)) {
                map.insert(first_pos + i, data[i * per..(i + 1) * per].to_vec());
            }
        }
    }
}

/// Runs `trace` on the DeepSeek-V4.1 checkpoint `plan.model`: checks, the forward, the file.
/// `announce(file bytes)` is called once the file is laid out, before the model runs.
pub fn run_v41(
    plan: &TracePlan<'_>,
    v41: V41TraceOptions,
    announce: &mut dyn FnMut(u64),
) -> anyhow::Result<TraceOutcome> {
    check_out_path(plan)?;
    super::checks::refuse_v41_device(&plan.device)?;
    let ckpt = Checkpoint::open_v41(plan.model)?;
    let cfg = ckpt.config().clone();
    let t = &cfg.text;
    let tokenizer = load_tokenizer_v41(plan.model, &cfg)?;
    let tokens = match plan.input {
        TraceInput::Tokens(file) => parse_token_file(file, t.vocab_size)?,
        TraceInput::Prompt(path) => {
            prompt_tokens(path, ChatFormat::V41, &tokenizer, t.max_position_embeddings)?
        }
    };
    let positions = plan.positions.resolve(tokens.len());
    check_inputs(&tokens, &positions)?;
    let opts = V41Options {
        index: plan.index,
        kv: plan.kv,
        topk: plan.topk,
        candidate_blocks: v41.candidate_blocks,
        chunk: if plan.chunk == 0 { 256 } else { plan.chunk },
    };
    let logits = plan
        .logits
        .unwrap_or_else(|| LogitsMode::default_for(positions.len(), t.vocab_size))
        .check_vocab(t.vocab_size)?;
    let topk = plan.topk.unwrap_or(t.index_topk);
    let mut layout = V41TraceLayout::for_config(&cfg, tokens.len(), positions.len(), topk);
    layout.logits = match logits {
        LogitsMode::Top(n) => LogitsMode::Top(n.min(t.vocab_size)),
        mode => mode,
    };
    layout.dump = plan
        .dump_indexer_inputs
        .then_some((t.index_n_heads, t.index_head_dim));
    check_room_for(
        plan,
        &RoomNeeded {
            memory: layout.memory_bytes(),
            file: layout.file_bytes(),
            tokens: tokens.len(),
            positions: positions.len(),
            logits: layout.logits,
        },
    )?;
    announce(layout.file_bytes());
    let started = std::time::Instant::now();
    super::checks::refuse_host_shortfall(
        ckpt.config(),
        &crate::devices::plan::Footprint::of_checkpoint(&ckpt),
        tokens.len(),
        opts.chunk,
        crate::backend::WeightResidency::Decoded,
    )?;
    let model = ModelV41::load(&ckpt, &tokenizer, opts)?;
    let recorded: BTreeSet<usize> = positions.iter().copied().collect();
    let mut names = BTreeSet::new();
    for s in &layout.sources {
        let l = s.role.layer;
        for what in [
            "scores",
            "topk",
            "scores_unconstrained",
            "topk_unconstrained",
        ] {
            names.insert(format!("layers.{l}.indexer.{what}"));
        }
        for what in ["block_scores", "kept_blocks"] {
            names.insert(format!("layers.{l}.candidates.{what}"));
        }
        if layout.dump.is_some() {
            names.insert(format!("layers.{l}.indexer.q"));
            names.insert(format!("layers.{l}.indexer.weights"));
        }
    }
    let mut observer = V41TraceObserver {
        recorded: &recorded,
        names,
        rows: BTreeMap::new(),
        top: TopRows::for_mode(layout.logits),
    };
    let mut state = model.new_sequence();
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(tokens.len() as u64),
        indicatif::ProgressDrawTarget::stderr(),
    );
    bar.set_style(super::progress::style(super::progress::PROBE_PREFILL));
    bar.set_message("trace prefill");
    let mut kept_logits: Vec<Vec<f32>> = Vec::new();
    let mut done = 0;
    for piece in tokens.chunks(opts_chunk(&model)) {
        let end = done + piece.len();
        let here: Vec<usize> = positions
            .iter()
            .copied()
            .filter(|p| (done..end).contains(p))
            .collect();
        // `top:N` takes its rows through the observer (one group of whole rows at a time),
        // `all` keeps them whole.
        let request = match layout.logits {
            LogitsMode::All => LogitsRequest::Positions(here),
            _ => LogitsRequest::None,
        };
        let out = model.forward(&mut state, piece, &mut observer, request)?;
        kept_logits.extend(out.logits.into_iter().map(|(_, l)| l));
        done = end;
        bar.set_position(done as u64);
    }
    bar.finish_and_clear();
    let keys: BTreeMap<usize, Vec<f32>> = if layout.dump.is_some() {
        layout
            .sources
            .iter()
            .map(|s| {
                let src = s.role.kv_source.expect("an index source reads a KV source");
                let raw = state
                    .sources
                    .get(&src)
                    .and_then(|st| st.keys_raw.data())
                    .map_or_else(Vec::new, |a| model.backend().act_host(a).into_owned());
                (s.role.layer, raw)
            })
            .collect()
    } else {
        BTreeMap::new()
    };
    let mut metadata = BTreeMap::new();
    let mut meta = |k: &str, v: String| metadata.insert(k.to_string(), v);
    meta("family", "deepseek_v41".into());
    meta("profile", plan.index.name().into());
    meta("kv", plan.kv.name().into());
    meta("topk", model.topk().to_string());
    meta("candidate_blocks", model.candidate_blocks().to_string());
    meta("logits", layout.logits.name());
    meta("model", plan.model.display().to_string());
    meta("model_config_sha256", cfg.hash_hex());
    meta(
        "index_weight_scale",
        crate::numerics::profiles::weight_scale(t.index_n_heads, t.index_head_dim).to_string(),
    );
    let backend = BackendRecord::cpu();
    meta("backend", backend.to_string());
    meta("needlescope_version", env!("CARGO_PKG_VERSION").into());
    let written = Written {
        layout: &layout,
        tokens: &tokens,
        positions: &positions,
        rows: &observer.rows,
        keys: &keys,
        logits: &kept_logits,
        top: observer.top.as_ref().map_or(&[][..], |t| &t.rows),
    };
    write_atomically(plan.out, layout.tensors(), &metadata, |w| written.write(w))?;
    Ok(TraceOutcome {
        tokens: tokens.len(),
        positions: positions.len(),
        csa_layers: layout.sources.len(),
        topk: model.topk(),
        logits: layout.logits,
        backend,
        seconds: started.elapsed().as_secs_f64(),
        file_bytes: std::fs::metadata(plan.out).ok().map(|m| m.len()),
    })
}

fn opts_chunk<B: Backend>(model: &ModelV41<B>) -> usize {
    model.options().chunk.max(1)
}

/// The model directory's `tokenizer.json`, else DeepSeek-V4.1's as far as it is known (the
/// bundled V4 one with `<｜System｜>` at 128799, `V4Tokenizer::builtin_v41`, with a note), checked
/// for the special tokens and the vocabulary (the Engram classes come from it). A tokenizer
/// without `<｜System｜>` as one token is warned about: V4.1 prompts would carry it as text.
pub(crate) fn load_tokenizer_v41(
    model: &std::path::Path,
    cfg: &V41Config,
) -> anyhow::Result<crate::tokenizer::V4Tokenizer> {
    let file = model.join("tokenizer.json");
    let tok = if file.symlink_metadata().is_ok() {
        crate::tokenizer::V4Tokenizer::from_file(&file)?
    } else {
        eprintln!(
            "note: {} has no tokenizer.json: using the bundled DeepSeek-V4 tokenizer with \
             <｜System｜> at id 128799, as third-party tables give it (DeepSeek's V4.1 \
             tokenizer.json is not public; docs/spec/v41.md 6)",
            model.display()
        );
        crate::tokenizer::V4Tokenizer::builtin_v41()?
    };
    if !tok.has_v41_system_token() {
        eprintln!(
            "warning: tokenizer {}: <｜System｜> is not one token (id 128799): DeepSeek-V4.1 \
             prompts with a system message or in thinking mode will carry it as text",
            tok.source_name()
        );
    }
    tok.check_special_tokens()?;
    anyhow::ensure!(
        tok.vocab_size() <= cfg.text.vocab_size,
        "tokenizer {} has {} tokens but the model's vocab_size is {}",
        tok.source_name(),
        tok.vocab_size(),
        cfg.text.vocab_size
    );
    Ok(tok)
}

/// Everything the file holds, written one row at a time.
struct Written<'a> {
    layout: &'a V41TraceLayout,
    tokens: &'a [u32],
    positions: &'a [usize],
    rows: &'a BTreeMap<String, BTreeMap<usize, Vec<f32>>>,
    keys: &'a BTreeMap<usize, Vec<f32>>,
    logits: &'a [Vec<f32>],
    top: &'a [TopLogits],
}

impl Written<'_> {
    fn write(&self, w: &mut SafetensorsWriter) -> Result<(), CheckpointError> {
        let i64s = |v: &mut dyn Iterator<Item = i64>| -> Vec<u8> {
            v.flat_map(|x| x.to_le_bytes()).collect()
        };
        w.write(
            "tokens",
            &i64s(&mut self.tokens.iter().map(|&x| i64::from(x))),
        )?;
        w.write(
            "positions",
            &i64s(&mut self.positions.iter().map(|&x| x as i64)),
        )?;
        let (k, block) = (self.layout.topk, self.layout.block);
        for s in &self.layout.sources {
            let l = s.role.layer;
            let row = |name: &str, p: usize| self.rows.get(name).and_then(|m| m.get(&p));
            // Scores, padded with -inf to the file's width (rows not emitted yet).
            let scores = |w: &mut SafetensorsWriter, name: String, width: usize| {
                for &p in self.positions {
                    let mut out = vec![f32::NEG_INFINITY; width];
                    if let Some(r) = row(&name, p) {
                        let n = r.len().min(width);
                        out[..n].copy_from_slice(&r[..n]);
                    }
                    w.write(&name, &f32_bytes(&out))?;
                }
                Ok::<(), CheckpointError>(())
            };
            let picks = |w: &mut SafetensorsWriter, name: String| {
                for &p in self.positions {
                    let r = row(&name, p).map_or(&[][..], |r| &r[..]);
                    let bytes: Vec<u8> = (0..k)
                        .flat_map(|i| (r.get(i).copied().unwrap_or(-1.0) as i32).to_le_bytes())
                        .collect();
                    w.write(&name, &bytes)?;
                }
                Ok::<(), CheckpointError>(())
            };
            let name = |what: &str| format!("layers.{l}.indexer.{what}");
            scores(w, name("scores"), s.rows)?;
            picks(w, name("topk"))?;
            match s.role.candidate_stage {
                CandidateStage::Consumer { .. } => {
                    scores(w, name("scores_unconstrained"), s.rows)?;
                    picks(w, name("topk_unconstrained"))?;
                }
                CandidateStage::Source => {
                    let b = s.rows.div_ceil(block);
                    scores(w, format!("layers.{l}.candidates.block_scores"), b)?;
                    let kept = format!("layers.{l}.candidates.kept_blocks");
                    for &p in self.positions {
                        let r = row(&kept, p).map_or(&[][..], |r| &r[..]);
                        let bytes: Vec<u8> = (0..b)
                            .map(|i| u8::from(r.get(i).is_some_and(|&v| v > 0.5)))
                            .collect();
                        w.write(&kept, &bytes)?;
                    }
                }
                CandidateStage::None => {}
            }
            if let Some((heads, dim)) = self.layout.dump {
                for (what, width) in [("q", heads * dim), ("weights", heads)] {
                    let n = name(what);
                    for &p in self.positions {
                        let r = row(&n, p).cloned().unwrap_or_else(|| vec![0.0; width]);
                        w.write(&n, &f32_bytes(&r))?;
                    }
                }
                let mut keys = self.keys.get(&l).cloned().unwrap_or_default();
                keys.resize(s.rows * dim, 0.0);
                w.write(&name("keys"), &f32_bytes(&keys))?;
            }
        }
        for r in self.logits {
            w.write("logits", &f32_bytes(r))?;
        }
        for r in self.top {
            w.write(TOP_VALUES, &f32_bytes(&r.values))?;
        }
        for r in self.top {
            let ids: Vec<u8> = r
                .ids
                .iter()
                .flat_map(|&id| i64::from(id).to_le_bytes())
                .collect();
            w.write(TOP_IDS, &ids)?;
        }
        Ok(())
    }
}
