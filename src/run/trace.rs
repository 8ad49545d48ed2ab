//! `trace`: run token ids through the model and record, for chosen query positions, what the
//! indexer did on every CSA layer, plus the logits (docs/outputs.md, "trace").
//!
//! Output tensors (one safetensors file):
//! - `tokens` i64 `[T]`, `positions` i64 `[P]`;
//! - per CSA layer L: `layers.L.indexer.scores` f32 `[P, floor(T/4)]` (driving-profile scores,
//!   -inf where row w is not visible to the query, i.e. w >= floor((t+1)/4)) and
//!   `layers.L.indexer.topk` i32 `[P, k]` (the model's selection: descending score, ties to
//!   the lower row, -1 padding);
//! - the logits, as `--logits` chose ([`LogitsMode`], `run::trace_logits`): `all`: `logits` f32
//!   `[P, vocab]`; `top:N`: `logits.top.values` f32 `[P, N]` (descending, ties toward the lower
//!   token id) and `logits.top.ids` i64 `[P, N]` (their token ids); `none`: no logits tensor;
//! - with `dump_indexer_inputs`, per CSA layer: `layers.L.indexer.q` f32 `[P, heads, dim]`
//!   (after RoPE, before any Hadamard or rounding), `layers.L.indexer.keys` f32
//!   `[floor(T/4), dim]` (after norm and RoPE, before any Hadamard or rounding) and
//!   `layers.L.indexer.weights` f32 `[P, heads]` (weights_proj output before the indexer scale
//!   `index_head_dim^-0.5 · index_n_heads^-0.5`, 2^-6.5 on Flash), so anyone can recompute the
//!   scores under any profile.
//!
//! Header metadata: profile, kv, topk, logits (the mode), model (directory), model config
//! hash, backend, version, `index_weight_scale` (that scale, as the f32 the scores use).
//! The keys of all floor(T/4) rows are taken from the observation of the last token, which is
//! observed (but not recorded unless requested) whenever inputs are dumped.
//!
//! [`TraceLayout`] gives the file's tensors and sizes, and the memory the recorded trace takes,
//! from the config and the arguments alone, so `trace` can refuse a run that cannot fit before
//! the model runs, and [`TraceLayout::sizes`] splits the file's bytes into logits, indexer and
//! the rest for the line `trace` prints first; [`write_trace`] writes from that same layout,
//! one position's row at a time.
//!
//! The command's plan and task live here too: the CLI fills a [`TracePlan`] from its flags;
//! [`prepare`] checks `--out` (no directory, no input, nothing inside the model directory, a
//! folder that exists and takes writes), reads the tokens and lays the file out
//! ([`PreparedTrace`], whose size the CLI announces); [`PreparedTrace::run`] checks the room
//! (disk and memory), runs the trace on the chosen backend and writes the file, returning the
//! [`TraceOutcome`] the CLI prints.

use super::device::DeviceChoice;
use super::target::{ModelTask, Target};
use crate::backend::Backend;
use crate::checkpoint::dtype::Dtype;
use crate::checkpoint::inventory::ExpectedTensor;
use crate::checkpoint::writer::SafetensorsWriter;
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::devices::placement::Workload;
use crate::model::forward::{LogitsRequest, Model, ModelOptions};
use crate::model::{IndexerObservation, Observer};
use crate::numerics::profiles::{IndexProfile, KvMode};
use crate::probe::chat::{ChatFormat, ChatRequest};
use crate::record::BackendRecord;
pub use crate::run::trace_logits::{top_logits, LogitsMode, TopLogits, TopRows};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Per CSA layer, per recorded position: a pair of vectors.
pub type PerLayer<A, B> = BTreeMap<usize, Vec<(Vec<A>, Vec<B>)>>;

/// What one trace recorded, in memory (also what the file holds).
#[derive(Debug, Default)]
pub struct TraceResult {
    pub tokens: Vec<u32>,
    pub positions: Vec<usize>,
    pub topk: usize,
    /// CSA layer -> per recorded position: (scores of visible rows, selected rows).
    pub indexer: PerLayer<f32, i32>,
    /// CSA layer -> per recorded position: (raw q, raw weights).
    pub inputs: PerLayer<f32, f32>,
    /// CSA layer -> raw keys of every row visible to the last token `[rows * dim]`.
    pub keys: BTreeMap<usize, Vec<f32>>,
    pub index_heads: usize,
    pub index_dim: usize,
    /// Which logits were kept: `logits` holds the whole rows under [`LogitsMode::All`],
    /// `top_logits` the top N under [`LogitsMode::Top`]; the other is empty.
    pub logits_mode: LogitsMode,
    /// The model's vocabulary (the width of a whole row of logits).
    pub vocab: usize,
    pub logits: Vec<Vec<f32>>,
    pub top_logits: Vec<TopLogits>,
}

struct TraceObserver<'a> {
    recorded: &'a BTreeSet<usize>,
    last: usize,
    dump: bool,
    /// Under `--logits top:N`: each recorded position's row of logits reduced to its top N as
    /// the model hands it over (see [`run_trace`]).
    top: Option<TopRows>,
    result: &'a mut TraceResult,
}

impl Observer for TraceObserver<'_> {
    fn wants_position(&self, pos: usize) -> bool {
        self.recorded.contains(&pos) || (self.dump && pos == self.last)
    }
    /// A trace records indexer scores and logits, never attention probabilities.
    fn wants_attention(&self, _pos: usize) -> bool {
        false
    }
    fn wants_intermediate(&self, name: &str) -> bool {
        name == "logits" && self.top.is_some()
    }
    fn intermediate(&mut self, name: &str, first_pos: usize, shape: &[usize], data: &[f32]) {
        if let (Some(top), "logits") = (self.top.as_mut(), name) {
            top.keep(self.recorded, first_pos, shape, data);
        }
    }
    fn indexer(&mut self, obs: &IndexerObservation<'_>) {
        if self.dump && obs.query_pos == self.last {
            self.result.keys.insert(
                obs.layer,
                obs.keys_raw[..obs.visible_rows * obs.head_dim].to_vec(),
            );
            self.result.index_heads = obs.heads;
            self.result.index_dim = obs.head_dim;
        }
        if !self.recorded.contains(&obs.query_pos) {
            return;
        }
        self.result.indexer.entry(obs.layer).or_default().push((
            obs.scores[..obs.visible_rows].to_vec(),
            obs.selected.to_vec(),
        ));
        if self.dump {
            self.result
                .inputs
                .entry(obs.layer)
                .or_default()
                .push((obs.q_raw.to_vec(), obs.weights_raw.to_vec()));
        }
    }
}

/// Checks a trace's inputs before anything is loaded: tokens present, positions ascending,
/// each once, inside them.
pub fn check_inputs(tokens: &[u32], positions: &[usize]) -> anyhow::Result<()> {
    anyhow::ensure!(!tokens.is_empty(), "the token file holds no token ids");
    if let Some(w) = positions.windows(2).find(|w| w[0] >= w[1]) {
        if w[0] == w[1] {
            anyhow::bail!(
                "--positions: expected each value once, found {} twice",
                w[0]
            );
        }
        anyhow::bail!(
            "--positions: expected ascending positions, found {} before {}",
            w[0],
            w[1]
        );
    }
    if let Some(&bad) = positions.iter().find(|&&p| p >= tokens.len()) {
        anyhow::bail!(
            "--positions: position {bad} is outside the {} input tokens (expected 0..={})",
            tokens.len(),
            tokens.len() - 1
        );
    }
    Ok(())
}

/// Runs the trace on a loaded model of any backend. `positions` must be ascending, unique and
/// inside the token list ([`check_inputs`]); `logits` says which logits to keep (a `top:N` past
/// the vocabulary keeps them all, sorted). The forward goes one model chunk at a time (the
/// chunks the model would cut anyway, so the results are the same), calling
/// `prefilled(done, total)` after each, for a progress bar. Under `top:N` the model hands each
/// group of rows of logits to the observer, which keeps their top N, so memory holds no more
/// than one group of whole rows ([`crate::devices::plan::PROBED_LOGIT_ROWS`], where a chunk's
/// rows at once were 4.2 GB at Flash's vocabulary and chunk 8,192).
pub fn run_trace<B: Backend>(
    model: &Model<B>,
    tokens: &[u32],
    positions: &[usize],
    dump_indexer_inputs: bool,
    logits_mode: LogitsMode,
    prefilled: &mut dyn FnMut(usize, usize),
) -> anyhow::Result<TraceResult> {
    check_inputs(tokens, positions)?;
    let recorded: BTreeSet<usize> = positions.iter().copied().collect();
    let vocab = model.config().vocab_size;
    let logits_mode = match logits_mode {
        LogitsMode::Top(n) => LogitsMode::Top(n.min(vocab)),
        mode => mode,
    };
    let mut result = TraceResult {
        tokens: tokens.to_vec(),
        positions: positions.to_vec(),
        topk: model.topk(),
        logits_mode,
        vocab,
        ..TraceResult::default()
    };
    let mut state = model.new_sequence();
    let mut logits = Vec::new();
    let mut top = Vec::new();
    {
        let mut observer = TraceObserver {
            recorded: &recorded,
            last: tokens.len() - 1,
            dump: dump_indexer_inputs,
            top: TopRows::for_mode(logits_mode),
            result: &mut result,
        };
        let mut done = 0;
        for piece in tokens.chunks(model.options().chunk.max(1)) {
            let end = done + piece.len();
            let here = positions
                .iter()
                .copied()
                .filter(|p| (done..end).contains(p))
                .collect();
            // `top:N` takes its rows through the observer (above), `all` keeps them whole.
            let request = match logits_mode {
                LogitsMode::All => LogitsRequest::Positions(here),
                _ => LogitsRequest::None,
            };
            let out = model.forward(&mut state, piece, &mut observer, request)?;
            logits.extend(out.logits.into_iter().map(|(_, l)| l));
            done = end;
            prefilled(done, tokens.len());
        }
        if let Some(kept) = observer.top.take() {
            top = kept.rows;
        }
    }
    result.logits = logits;
    result.top_logits = top;
    Ok(result)
}

/// The sizes that fix a trace file's layout, known before the model runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceLayout {
    /// T, the input tokens.
    pub tokens: usize,
    /// P, the recorded positions.
    pub positions: usize,
    pub topk: usize,
    /// The CSA layers, ascending (one group of indexer tensors each).
    pub csa_layers: Vec<usize>,
    pub vocab: usize,
    /// `Some((index heads, index head dim))` with `--dump-indexer-inputs`.
    pub dump: Option<(usize, usize)>,
    /// Which logits the file holds.
    pub logits: LogitsMode,
}

/// A trace file's data bytes by what they hold ([`TraceLayout::sizes`]); the four add up to
/// [`TraceLayout::file_bytes`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceSizes {
    /// `logits`, or `logits.top.values` and `logits.top.ids`.
    pub logits: u64,
    /// Per CSA layer, the scores and the top-k.
    pub indexer: u64,
    /// Per CSA layer, the dumped raw q, keys and head weights (`--dump-indexer-inputs`).
    pub indexer_inputs: u64,
    /// `tokens` and `positions`.
    pub other: u64,
}

impl TraceLayout {
    /// The layout a model's config implies for `tokens` inputs and `positions` recorded, with
    /// the `logits` kept (a `top:N` past the vocabulary keeps them all, as [`run_trace`] does).
    pub fn for_config(
        cfg: &crate::config::ModelConfig,
        tokens: usize,
        positions: usize,
        topk: usize,
        dump: bool,
        logits: LogitsMode,
    ) -> Self {
        TraceLayout {
            tokens,
            positions,
            topk,
            csa_layers: cfg.layer_roles().indexed_layers(),
            vocab: cfg.vocab_size,
            dump: dump.then_some((cfg.index_n_heads, cfg.index_head_dim)),
            logits: match logits {
                LogitsMode::Top(n) => LogitsMode::Top(n.min(cfg.vocab_size)),
                mode => mode,
            },
        }
    }

    /// The tensors of the file, in file order (layout in the module docs).
    pub fn tensors(&self) -> Vec<ExpectedTensor> {
        self.grouped().into_iter().map(|(t, _)| t).collect()
    }

    /// The tensors in file order, each with the [`TraceSizes`] group it counts in.
    fn grouped(&self) -> Vec<(ExpectedTensor, Group)> {
        let (t, p, rows) = (self.tokens, self.positions, self.tokens / 4);
        let spec = |name: String, dtype: Dtype, shape: Vec<usize>, group: Group| {
            (ExpectedTensor { name, dtype, shape }, group)
        };
        let mut out = vec![
            spec("tokens".into(), Dtype::I64, vec![t], Group::Other),
            spec("positions".into(), Dtype::I64, vec![p], Group::Other),
        ];
        for layer in &self.csa_layers {
            let name = |what: &str| format!("layers.{layer}.indexer.{what}");
            out.push(spec(
                name("scores"),
                Dtype::F32,
                vec![p, rows],
                Group::Indexer,
            ));
            out.push(spec(
                name("topk"),
                Dtype::I32,
                vec![p, self.topk],
                Group::Indexer,
            ));
            if let Some((heads, dim)) = self.dump {
                let inputs = Group::IndexerInputs;
                out.push(spec(name("q"), Dtype::F32, vec![p, heads, dim], inputs));
                out.push(spec(name("weights"), Dtype::F32, vec![p, heads], inputs));
                out.push(spec(name("keys"), Dtype::F32, vec![rows, dim], inputs));
            }
        }
        match self.logits {
            LogitsMode::None => {}
            LogitsMode::Top(n) => {
                out.push(spec(
                    TOP_VALUES.into(),
                    Dtype::F32,
                    vec![p, n],
                    Group::Logits,
                ));
                out.push(spec(TOP_IDS.into(), Dtype::I64, vec![p, n], Group::Logits));
            }
            LogitsMode::All => out.push(spec(
                "logits".into(),
                Dtype::F32,
                vec![p, self.vocab],
                Group::Logits,
            )),
        }
        out
    }

    /// Bytes of tensor data in the file (the header adds a few KiB).
    pub fn file_bytes(&self) -> u64 {
        self.tensors().iter().map(|t| t.bytes()).sum()
    }

    /// The data bytes of the file split by what they hold.
    pub fn sizes(&self) -> TraceSizes {
        let mut s = TraceSizes::default();
        for (t, group) in self.grouped() {
            *match group {
                Group::Logits => &mut s.logits,
                Group::Indexer => &mut s.indexer,
                Group::IndexerInputs => &mut s.indexer_inputs,
                Group::Other => &mut s.other,
            } += t.bytes();
        }
        s
    }

    /// Bytes the recorded trace holds in memory before it is written, for these recorded
    /// `positions` (each keeps the scores of its visible rows only, floor((t + 1) / 4); a
    /// `top:N` row N f32 values and N u32 ids).
    pub fn memory_bytes(&self, positions: &[usize]) -> u64 {
        let rows = self.tokens as u64 / 4;
        let visible: u64 = positions.iter().map(|&t| (t as u64 + 1) / 4).sum();
        let p = positions.len() as u64;
        let per_layer = 4 * (visible + p * self.topk as u64)
            + self.dump.map_or(0, |(heads, dim)| {
                4 * (p * heads as u64 * (dim as u64 + 1) + rows * dim as u64)
            });
        let logits = match self.logits {
            LogitsMode::None => 0,
            LogitsMode::Top(n) => 8 * p * n as u64,
            LogitsMode::All => 4 * p * self.vocab as u64,
        };
        self.csa_layers.len() as u64 * per_layer + logits
    }
}

/// The tensor names of `--logits top:N`.
pub const TOP_VALUES: &str = "logits.top.values";
pub const TOP_IDS: &str = "logits.top.ids";

/// Which [`TraceSizes`] figure a tensor counts in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Group {
    Logits,
    Indexer,
    IndexerInputs,
    Other,
}

/// Writes a trace to `path` as safetensors (layout in the module docs), one position's row at
/// a time: besides the recorded trace, memory holds no more than a row.
pub fn write_trace(
    path: &Path,
    trace: &TraceResult,
    metadata: BTreeMap<String, String>,
) -> anyhow::Result<()> {
    let layout = TraceLayout {
        tokens: trace.tokens.len(),
        positions: trace.positions.len(),
        topk: trace.topk,
        csa_layers: trace.indexer.keys().copied().collect(),
        vocab: trace.vocab,
        dump: (!trace.inputs.is_empty()).then_some((trace.index_heads, trace.index_dim)),
        logits: trace.logits_mode,
    };
    let rows = layout.tokens / 4;
    let no_inputs = Vec::new();
    let write_all = |w: &mut SafetensorsWriter| -> Result<(), CheckpointError> {
        let tokens: Vec<u8> = trace
            .tokens
            .iter()
            .flat_map(|&x| i64::from(x).to_le_bytes())
            .collect();
        w.write("tokens", &tokens)?;
        let positions: Vec<u8> = trace
            .positions
            .iter()
            .flat_map(|&x| (x as i64).to_le_bytes())
            .collect();
        w.write("positions", &positions)?;
        for (layer, per_pos) in &trace.indexer {
            let name = |what: &str| format!("layers.{layer}.indexer.{what}");
            let scores = name("scores");
            for (visible, _) in per_pos {
                let mut row = vec![f32::NEG_INFINITY; rows];
                row[..visible.len()].copy_from_slice(visible);
                w.write(&scores, &f32_bytes(&row))?;
            }
            let topk = name("topk");
            for (_, selected) in per_pos {
                let row: Vec<u8> = selected.iter().flat_map(|x| x.to_le_bytes()).collect();
                w.write(&topk, &row)?;
            }
            if layout.dump.is_some() {
                let inputs = trace.inputs.get(layer).unwrap_or(&no_inputs);
                for (q, _) in inputs {
                    w.write(&name("q"), &f32_bytes(q))?;
                }
                for (_, weights) in inputs {
                    w.write(&name("weights"), &f32_bytes(weights))?;
                }
                let keys = trace.keys.get(layer).map_or(&[][..], |k| &k[..]);
                w.write(&name("keys"), &f32_bytes(keys))?;
            }
        }
        for row in &trace.logits {
            w.write("logits", &f32_bytes(row))?;
        }
        for row in &trace.top_logits {
            w.write(TOP_VALUES, &f32_bytes(&row.values))?;
        }
        for row in &trace.top_logits {
            let ids: Vec<u8> = row
                .ids
                .iter()
                .flat_map(|&id| i64::from(id).to_le_bytes())
                .collect();
            w.write(TOP_IDS, &ids)?;
        }
        Ok(())
    };

    write_atomically(path, layout.tensors(), &metadata, write_all)
}

/// Writes the safetensors file `path` of `tensors` through `write_all` beside it (`.partial`)
/// and renames it when complete: a failed or interrupted write leaves no file that looks like
/// a trace.
pub(crate) fn write_atomically(
    path: &Path,
    tensors: Vec<ExpectedTensor>,
    metadata: &BTreeMap<String, String>,
    write_all: impl FnOnce(&mut SafetensorsWriter) -> Result<(), CheckpointError>,
) -> anyhow::Result<()> {
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = std::path::PathBuf::from(partial);
    // Ctrl-C while writing removes it too (the process exits at once; a trace is not resumable).
    let _partial_guard = crate::run::interrupt::RemoveOnInterrupt::new(&partial);
    let written = (|| {
        let mut writer = SafetensorsWriter::create(&partial, tensors, metadata)?;
        write_all(&mut writer)?;
        writer.finish()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&partial);
        return Err(e.into());
    }
    std::fs::rename(&partial, path).map_err(|e| {
        let _ = std::fs::remove_file(&partial);
        anyhow::anyhow!(
            "cannot move {} to {}: {e}",
            partial.display(),
            path.display()
        )
    })?;
    Ok(())
}

pub(crate) fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Parses a token file: whitespace/comma separated integers, or a JSON list.
pub fn parse_token_file(path: &Path, vocab: usize) -> anyhow::Result<Vec<u32>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read token file {}: {e}", path.display()))?;
    let trimmed = text.trim();
    let body = trimmed
        .strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .unwrap_or(trimmed);
    // Entries are separated by whitespace and at most one comma; two commas with nothing
    // between them are an empty entry, refused rather than skipped.
    let separators = regex::Regex::new(r",\s*,").expect("valid regex");
    if let Some(m) = separators.find(body) {
        anyhow::bail!(
            "token file {}: empty entry at byte {} (two commas with no token id between them), expected whitespace/comma separated integers",
            path.display(),
            m.start()
        );
    }
    let mut ids = Vec::new();
    for (i, piece) in body
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|s| !s.is_empty())
        .enumerate()
    {
        let id: u64 = piece.parse().map_err(|_| {
            anyhow::anyhow!(
                "token file {}: the token at position {i} (0-based, as trace positions are) is {piece:?}, expected a non-negative integer token id",
                path.display()
            )
        })?;
        if id as usize >= vocab {
            anyhow::bail!(
                "token file {}: the token at position {i} (0-based) is id {id}, expected an id below the model's vocab_size {vocab}",
                path.display()
            );
        }
        ids.push(id as u32);
    }
    anyhow::ensure!(
        !ids.is_empty(),
        "token file {} holds no token ids (expected whitespace/comma separated integers or a JSON list)",
        path.display()
    );
    Ok(ids)
}

/// `--prompt FILE`'s token ids: the conversation rendered by the release's encoder (its notes
/// on stderr) and tokenised, refused past `max_positions`.
pub(crate) fn prompt_tokens(
    path: &Path,
    format: ChatFormat,
    tokenizer: &crate::tokenizer::V4Tokenizer,
    max_positions: usize,
) -> anyhow::Result<Vec<u32>> {
    let request = ChatRequest::from_file_as(path, format)?;
    for note in &request.notes {
        eprintln!("note: --prompt {}: {note}", path.display());
    }
    let ids = tokenizer.encode(&request.render().text)?;
    if ids.len() > max_positions {
        return Err(crate::probe::PromptError::PromptTooLong {
            source_name: path.display().to_string(),
            tokens: ids.len(),
            plus: String::new(),
            max_positions,
        }
        .into());
    }
    Ok(ids)
}

// ---------------------------------------------------------------------------------------------
// The command: its plan, the checks before the model runs, the task on the loaded model, and
// the outcome the CLI prints.

/// Where a trace's token ids come from.
#[derive(Clone, Copy, Debug)]
pub enum TraceInput<'a> {
    /// `--tokens FILE`: token ids ([`parse_token_file`]).
    Tokens(&'a Path),
    /// `--prompt FILE`: a conversation, rendered by the encoder of the model's release and
    /// tokenised.
    Prompt(&'a Path),
}

impl<'a> TraceInput<'a> {
    fn path(self) -> &'a Path {
        match self {
            TraceInput::Tokens(p) | TraceInput::Prompt(p) => p,
        }
    }
}

/// Which positions a trace records (`--positions`; parsed by the CLI).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Positions {
    /// Every token of the input.
    All,
    /// The last input token only.
    Last,
    /// Explicit 0-based positions, ascending (a position given twice is kept twice here and
    /// refused by [`check_inputs`], exit 1 as for the other list flags).
    List(Vec<usize>),
}

impl Positions {
    /// The recorded positions over an input of `tokens` tokens (at least one).
    pub fn resolve(&self, tokens: usize) -> Vec<usize> {
        match self {
            Positions::All => (0..tokens).collect(),
            Positions::Last => vec![tokens - 1],
            Positions::List(v) => v.clone(),
        }
    }
}

/// Everything a trace needs, checked flags only: what [`prepare`] and [`PreparedTrace::run`]
/// execute.
pub struct TracePlan<'a> {
    /// The model directory (`--model`, resolved).
    pub model: &'a Path,
    pub input: TraceInput<'a>,
    pub positions: Positions,
    /// The driving index profile.
    pub index: IndexProfile,
    pub kv: KvMode,
    /// `--topk`; `None`: the config's `index_topk`.
    pub topk: Option<usize>,
    /// Prefill chunk (0: auto).
    pub chunk: usize,
    /// The safetensors file to write.
    pub out: &'a Path,
    pub dump_indexer_inputs: bool,
    /// `--logits`; `None`: [`LogitsMode::default_for`] the recorded positions.
    pub logits: Option<LogitsMode>,
    pub device: DeviceChoice,
}

/// A trace with its inputs read and checked and its file laid out, before the room check and
/// the model run ([`PreparedTrace::run`]), so the CLI can say what the file will hold first.
pub struct PreparedTrace<'a> {
    plan: &'a TracePlan<'a>,
    ckpt: Checkpoint,
    pub tokens: Vec<u32>,
    /// The recorded positions, checked ([`check_inputs`]).
    pub positions: Vec<usize>,
    /// The top-k asked for (`--topk`, else the config's).
    pub topk: usize,
    /// The logits kept (the default resolved, checked against the vocabulary).
    pub logits: LogitsMode,
    pub layout: TraceLayout,
    /// The header metadata known before the model runs (the backend and the model's top-k are
    /// added after it).
    pub metadata: BTreeMap<String, String>,
}

/// What a trace did: the line the CLI prints.
#[derive(Clone, Debug)]
pub struct TraceOutcome {
    pub tokens: usize,
    pub positions: usize,
    /// CSA layers recorded.
    pub csa_layers: usize,
    /// The model's top-k.
    pub topk: usize,
    pub logits: LogitsMode,
    pub backend: BackendRecord,
    /// Wall seconds of loading and the forward.
    pub seconds: f64,
    /// The written file's size (`None`: not readable).
    pub file_bytes: Option<u64>,
}

/// Checks `--out`, opens the model, reads the input's tokens, resolves and checks the positions,
/// the top-k and the logits, and lays the file out; nothing runs yet.
pub fn prepare<'a>(plan: &'a TracePlan<'a>) -> anyhow::Result<PreparedTrace<'a>> {
    check_out_path(plan)?;
    let ckpt = super::target::open_model(plan.model)?;
    let cfg = ckpt.config().clone();
    let tokens = match plan.input {
        TraceInput::Tokens(file) => parse_token_file(file, cfg.vocab_size)?,
        TraceInput::Prompt(path) => {
            let tok = super::target::load_tokenizer(plan.model, &cfg)?;
            prompt_tokens(path, ChatFormat::V4, &tok, cfg.max_position_embeddings)?
        }
    };
    let positions = plan.positions.resolve(tokens.len());
    check_inputs(&tokens, &positions)?;
    if let Some(k) = plan.topk {
        super::checks::refuse_topk_past_rows("--topk", &[k], &cfg)?;
    }
    let topk = plan.topk.unwrap_or(cfg.index_topk);
    let logits = plan
        .logits
        .unwrap_or_else(|| LogitsMode::default_for(positions.len(), cfg.vocab_size))
        .check_vocab(cfg.vocab_size)?;
    let layout = TraceLayout::for_config(
        &cfg,
        tokens.len(),
        positions.len(),
        topk,
        plan.dump_indexer_inputs,
        logits,
    );
    let mut metadata = BTreeMap::new();
    metadata.insert("profile".to_string(), plan.index.name().to_string());
    metadata.insert("kv".to_string(), plan.kv.name().to_string());
    metadata.insert("topk".to_string(), topk.to_string());
    metadata.insert("logits".to_string(), logits.name());
    metadata.insert("model".to_string(), plan.model.display().to_string());
    metadata.insert("model_config_sha256".to_string(), cfg.hash_hex());
    // What the dumped head weights are multiplied by in every score: dim^-0.5 · heads^-0.5.
    metadata.insert(
        "index_weight_scale".to_string(),
        crate::numerics::profiles::weight_scale(cfg.index_n_heads, cfg.index_head_dim).to_string(),
    );
    metadata.insert(
        "needlescope_version".to_string(),
        env!("CARGO_PKG_VERSION").to_string(),
    );
    Ok(PreparedTrace {
        plan,
        ckpt,
        tokens,
        positions,
        topk,
        logits,
        layout,
        metadata,
    })
}

impl PreparedTrace<'_> {
    /// The header's bytes, estimated from the metadata known now (the backend's name, added
    /// later, is a few dozen bytes), with its 8-byte length.
    pub fn header_bytes(&self) -> u64 {
        8 + crate::checkpoint::writer::header_bytes(&self.layout.tensors(), &self.metadata).len()
            as u64
    }

    /// Checks the room for the file and the records, loads the model on the chosen backend,
    /// runs the trace and writes the file.
    pub fn run(self) -> anyhow::Result<TraceOutcome> {
        let plan = self.plan;
        check_room(plan, &self.layout, &self.positions)?;
        let work = Workload {
            context: self.tokens.len(),
            chunk: plan.chunk,
            topk: self.topk,
        };
        let target = Target::prepare(&plan.device, &self.ckpt, &work)?;
        let backend = target.record();
        let opts = ModelOptions {
            index: plan.index,
            kv: plan.kv,
            topk: plan.topk,
            chunk: target.chunk(),
        };
        let started = std::time::Instant::now();
        let task = TraceTask {
            tokens: &self.tokens,
            positions: &self.positions,
            dump: plan.dump_indexer_inputs,
            logits: self.logits,
        };
        let result = target.run(&self.ckpt, opts, task)?;
        let mut metadata = self.metadata;
        metadata.insert("topk".to_string(), result.topk.to_string());
        metadata.insert("backend".to_string(), backend.to_string());
        write_trace(plan.out, &result, metadata)?;
        let seconds = started.elapsed().as_secs_f64();
        Ok(TraceOutcome {
            tokens: self.tokens.len(),
            positions: self.positions.len(),
            csa_layers: result.indexer.len(),
            topk: result.topk,
            logits: self.logits,
            backend,
            seconds,
            file_bytes: std::fs::metadata(plan.out).ok().map(|m| m.len()),
        })
    }
}

/// The trace on a loaded model of any backend.
struct TraceTask<'a> {
    tokens: &'a [u32],
    positions: &'a [usize],
    dump: bool,
    logits: LogitsMode,
}

impl ModelTask for TraceTask<'_> {
    type Output = TraceResult;
    fn run<B: Backend>(self, model: &mut Model<B>) -> anyhow::Result<TraceResult> {
        // On stderr, hidden when it is not a terminal (as probe's and sweep's bars).
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(self.tokens.len() as u64),
            indicatif::ProgressDrawTarget::stderr(),
        );
        bar.set_style(super::progress::style(super::progress::PROBE_PREFILL));
        bar.set_message("trace prefill");
        let result = run_trace(
            model,
            self.tokens,
            self.positions,
            self.dump,
            self.logits,
            &mut |done, _| bar.set_position(done as u64),
        );
        bar.finish_and_clear();
        result
    }
}

/// Refuses an `--out` that would overwrite or shadow an input, before anything runs: an
/// existing directory, the token file itself, or a path inside the model directory (a
/// safetensors file there would be read as model weights, or replace them), also through
/// folders that do not exist yet (which `run` makes just before the forward, once every check
/// has passed, so a forward never ends on a missing folder).
pub(crate) fn check_out_path(plan: &TracePlan) -> anyhow::Result<()> {
    let out = plan.out;
    if out.is_dir() {
        anyhow::bail!(
            "--out {}: is a directory, expected the path of the safetensors file to write",
            out.display()
        );
    }
    // The folders still to be made must lie below the existing ones: a `..` among them would
    // step out of what the checks below looked at (`new/../../model/model.safetensors`).
    let existing = existing_ancestor(out);
    if !existing.is_dir() {
        anyhow::bail!(
            "--out {}: {} is a file, expected a folder to write the trace in",
            out.display(),
            existing.display()
        );
    }
    let to_make = out.strip_prefix(&existing).unwrap_or(out);
    if to_make
        .components()
        .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        anyhow::bail!(
            "--out {}: `..` or `.` among the folders still to be made ({}); expected a path \
             without them past the existing folder {}",
            out.display(),
            to_make.display(),
            existing.display()
        );
    }
    // The path with its longest existing ancestor made canonical (folders still to be made
    // kept as given), so the checks below hold for an --out whose folders do not exist yet.
    let canonical_parent = |p: &Path| {
        let a = existing_ancestor(p);
        let real = std::fs::canonicalize(&a).ok()?;
        Some(real.join(p.strip_prefix(&a).unwrap_or(p)))
    };
    let out_full = canonical_parent(out);
    if out_full.is_some() && out_full == canonical_parent(plan.input.path()) {
        let (what, flag) = match plan.input {
            TraceInput::Tokens(_) => ("token file", "--tokens"),
            TraceInput::Prompt(_) => ("conversation", "--prompt"),
        };
        anyhow::bail!(
            "--out {}: is the {what} given to {flag}; expected another path",
            out.display(),
        );
    }
    if let (Some(full), Ok(model)) = (&out_full, std::fs::canonicalize(plan.model)) {
        if full.starts_with(&model) {
            anyhow::bail!(
                "--out {}: is inside the model directory {}, where a safetensors file would be read as (or replace) model weights; expected a path outside it",
                out.display(),
                plan.model.display()
            );
        }
    }
    // Last (after the checks that refuse a path inside the model directory, so no probe file
    // is made there): a folder nothing can be written in (read-only, `/proc`) would otherwise
    // show up as a disk with no room, or fail after the whole model run.
    if let Err(e) = check_writable(&existing) {
        anyhow::bail!(
            "--out {}: cannot write in the folder {}: {e}",
            out.display(),
            existing.display()
        );
    }
    // Only into an existing folder: a typo in a path must not leave a tree of new folders.
    if let Some(parent) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !parent.exists() {
            anyhow::bail!(
                "--out {}: the folder {} does not exist; expected an existing folder (trace \
                 makes none: create it first)",
                out.display(),
                parent.display()
            );
        }
    }
    Ok(())
}

/// Whether a file can be created in the folder `dir`: creates a probe file of a fresh name and
/// removes it. A name already there (a probe a killed run left, its process id since reused) is
/// skipped, not taken for a folder that refuses writes.
fn check_writable(dir: &Path) -> std::io::Result<()> {
    let pid = std::process::id();
    let mut last = None;
    for n in 0..16 {
        let probe = dir.join(format!(".needlescope-write-check-{pid}-{n}"));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&probe)
        {
            Ok(_) => {
                let _ = std::fs::remove_file(&probe);
                return Ok(());
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free probe file name")))
}

/// The longest ancestor of `path` (strictly above it) that exists, `.` for a relative path
/// none of whose folders exists.
fn existing_ancestor(path: &Path) -> PathBuf {
    path.ancestors()
        .skip(1)
        .find(|a| !a.as_os_str().is_empty() && a.exists())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Refuses a trace whose file would not fit on the filesystem of `--out`, or whose records
/// would not fit in the memory available, before the model runs (`--positions all` over a long
/// input on a full-size model is tens of GiB: the logits alone are 0.5 MiB per position with
/// `--logits all`).
fn check_room(plan: &TracePlan, layout: &TraceLayout, positions: &[usize]) -> anyhow::Result<()> {
    let need = RoomNeeded {
        memory: layout.memory_bytes(positions),
        file: layout.file_bytes(),
        tokens: layout.tokens,
        positions: positions.len(),
        logits: layout.logits,
    };
    check_room_for(plan, &need)
}

/// What a trace needs before it runs: memory for the records, disk for the file.
pub(crate) struct RoomNeeded {
    pub memory: u64,
    pub file: u64,
    pub tokens: usize,
    pub positions: usize,
    pub logits: LogitsMode,
}

/// Refuses a trace whose records or file do not fit, saying what to record less of.
pub(crate) fn check_room_for(plan: &TracePlan, need: &RoomNeeded) -> anyhow::Result<()> {
    // The filesystem the file will be on: its nearest folder that exists now.
    let dir = existing_ancestor(plan.out);
    let room = crate::devices::host::Room {
        memory_needed: need.memory,
        memory_available: crate::devices::host::meminfo_bytes("MemAvailable"),
        // The header is a few KiB per tensor name at most.
        disk_needed: need.file + 64 * 1024,
        disk_free: crate::devices::host::free_disk_bytes(&dir),
    };
    room.check().map_err(|short| {
        anyhow::anyhow!(
            "--out {}: a trace of {} positions over {} tokens does not fit: {short}; record fewer positions (--positions last, or a list){}{}",
            plan.out.display(),
            crate::units::group_digits(need.positions as u64),
            crate::units::group_digits(need.tokens as u64),
            match need.logits {
                LogitsMode::None => String::new(),
                mode => format!(", or fewer logits (--logits {mode} now: top:N with a smaller N, or none)"),
            },
            if plan.dump_indexer_inputs {
                ", or leave out --dump-indexer-inputs"
            } else {
                ""
            }
        )
    })
}

#[cfg(test)]
mod tests {
    use super::check_writable;

    /// A probe file left by a killed run (whose process id this one now has) does not make a
    /// writable folder look unwritable, and the check leaves no file of its own behind.
    #[test]
    fn a_leftover_probe_file_is_not_an_unwritable_folder() {
        let dir = tempfile::tempdir().unwrap();
        let pid = std::process::id();
        for stale in [
            format!(".needlescope-write-check-{pid}"),
            format!(".needlescope-write-check-{pid}-0"),
        ] {
            std::fs::write(dir.path().join(stale), b"").unwrap();
        }
        check_writable(dir.path()).unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
        assert!(check_writable(&dir.path().join("missing")).is_err());
    }
}
