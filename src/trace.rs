//! `trace`: run token ids through the engine and record, for chosen query positions, what the
//! indexer did on every CSA layer, plus the logits (design.md section 6, "trace").
//!
//! Output tensors (one safetensors file):
//! - `tokens` i64 `[T]`, `positions` i64 `[P]`;
//! - per CSA layer L: `layers.L.indexer.scores` f32 `[P, floor(T/4)]` (driving-profile scores,
//!   -inf where row w is not visible to the query, i.e. w >= floor((t+1)/4)) and
//!   `layers.L.indexer.topk` i32 `[P, k]` (the engine's selection: descending score, ties to
//!   the lower row, -1 padding);
//! - `logits` f32 `[P, vocab]`;
//! - with `dump_indexer_inputs`, per CSA layer: `layers.L.indexer.q` f32 `[P, heads, dim]`
//!   (after RoPE, before any Hadamard or rounding), `layers.L.indexer.keys` f32
//!   `[floor(T/4), dim]` (after norm and RoPE, before any Hadamard or rounding) and
//!   `layers.L.indexer.weights` f32 `[P, heads]` (weights_proj output before the indexer scale
//!   `index_head_dim^-0.5 · index_n_heads^-0.5`, 2^-6.5 on Flash), so anyone can recompute the
//!   scores under any profile.
//!
//! Header metadata: profile, kv, topk, model (directory), model config hash, backend, version,
//! `index_weight_scale` (that scale, as the f32 the scores use).
//! The keys of all floor(T/4) rows are taken from the observation of the last token, which is
//! observed (but not recorded unless requested) whenever inputs are dumped.

use crate::backend::Backend;
use crate::checkpoint::dtype::Dtype;
use crate::checkpoint::inventory::ExpectedTensor;
use crate::checkpoint::writer::SafetensorsWriter;
use crate::model::forward::{Engine, LogitsRequest};
use crate::model::{IndexerObservation, Observer};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

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
    pub logits: Vec<Vec<f32>>,
}

struct TraceObserver<'a> {
    recorded: &'a BTreeSet<usize>,
    last: usize,
    dump: bool,
    result: &'a mut TraceResult,
}

impl Observer for TraceObserver<'_> {
    fn wants_position(&self, pos: usize) -> bool {
        self.recorded.contains(&pos) || (self.dump && pos == self.last)
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

/// Checks a trace's inputs before anything is loaded: tokens present, positions inside them.
pub fn check_inputs(tokens: &[u32], positions: &[usize]) -> anyhow::Result<()> {
    anyhow::ensure!(!tokens.is_empty(), "the token file holds no token ids");
    if let Some(&bad) = positions.iter().find(|&&p| p >= tokens.len()) {
        anyhow::bail!(
            "--positions: position {bad} is outside the {} input tokens (expected 0..={})",
            tokens.len(),
            tokens.len() - 1
        );
    }
    Ok(())
}

/// Runs the trace on a loaded engine of any backend. `positions` must be ascending, unique and
/// inside the token list ([`check_inputs`]).
pub fn run_trace<B: Backend>(
    engine: &Engine<B>,
    tokens: &[u32],
    positions: &[usize],
    dump_indexer_inputs: bool,
) -> anyhow::Result<TraceResult> {
    check_inputs(tokens, positions)?;
    let recorded: BTreeSet<usize> = positions.iter().copied().collect();
    let mut result = TraceResult {
        tokens: tokens.to_vec(),
        positions: positions.to_vec(),
        topk: engine.topk(),
        ..TraceResult::default()
    };
    let mut state = engine.new_sequence();
    let out = {
        let mut observer = TraceObserver {
            recorded: &recorded,
            last: tokens.len() - 1,
            dump: dump_indexer_inputs,
            result: &mut result,
        };
        engine.forward(
            &mut state,
            tokens,
            &mut observer,
            LogitsRequest::Positions(positions.to_vec()),
        )?
    };
    result.logits = out.logits.into_iter().map(|(_, l)| l).collect();
    Ok(result)
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Writes a trace to `path` as safetensors (layout in the module docs).
pub fn write_trace(
    path: &Path,
    trace: &TraceResult,
    metadata: BTreeMap<String, String>,
) -> anyhow::Result<()> {
    let t = trace.tokens.len();
    let p = trace.positions.len();
    let rows = t / 4;
    let mut tensors: Vec<(ExpectedTensor, Vec<u8>)> = Vec::new();
    let mut push = |name: String, dtype: Dtype, shape: Vec<usize>, bytes: Vec<u8>| {
        tensors.push((ExpectedTensor { name, dtype, shape }, bytes));
    };
    push(
        "tokens".into(),
        Dtype::I64,
        vec![t],
        trace
            .tokens
            .iter()
            .flat_map(|&x| (x as i64).to_le_bytes())
            .collect(),
    );
    push(
        "positions".into(),
        Dtype::I64,
        vec![p],
        trace
            .positions
            .iter()
            .flat_map(|&x| (x as i64).to_le_bytes())
            .collect(),
    );
    for (layer, per_pos) in &trace.indexer {
        let mut scores = vec![f32::NEG_INFINITY; p * rows];
        let mut topk = Vec::with_capacity(p * trace.topk);
        for (i, (s, sel)) in per_pos.iter().enumerate() {
            scores[i * rows..i * rows + s.len()].copy_from_slice(s);
            topk.extend(sel.iter().flat_map(|x| x.to_le_bytes()));
        }
        push(
            format!("layers.{layer}.indexer.scores"),
            Dtype::F32,
            vec![p, rows],
            f32_bytes(&scores),
        );
        push(
            format!("layers.{layer}.indexer.topk"),
            Dtype::I32,
            vec![p, trace.topk],
            topk,
        );
        if let Some(inputs) = trace.inputs.get(layer) {
            let q: Vec<f32> = inputs.iter().flat_map(|(q, _)| q.iter().copied()).collect();
            let w: Vec<f32> = inputs.iter().flat_map(|(_, w)| w.iter().copied()).collect();
            push(
                format!("layers.{layer}.indexer.q"),
                Dtype::F32,
                vec![p, trace.index_heads, trace.index_dim],
                f32_bytes(&q),
            );
            push(
                format!("layers.{layer}.indexer.weights"),
                Dtype::F32,
                vec![p, trace.index_heads],
                f32_bytes(&w),
            );
            let keys = trace.keys.get(layer).cloned().unwrap_or_default();
            push(
                format!("layers.{layer}.indexer.keys"),
                Dtype::F32,
                vec![keys.len() / trace.index_dim.max(1), trace.index_dim],
                f32_bytes(&keys),
            );
        }
    }
    let vocab = trace.logits.first().map_or(0, |l| l.len());
    let logits: Vec<f32> = trace.logits.iter().flatten().copied().collect();
    push(
        "logits".into(),
        Dtype::F32,
        vec![p, vocab],
        f32_bytes(&logits),
    );

    // Written beside `path` and renamed when complete: a failed write leaves no file that
    // looks like a trace.
    let specs = tensors.iter().map(|(s, _)| s.clone()).collect();
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = std::path::PathBuf::from(partial);
    let written = (|| {
        let mut writer = SafetensorsWriter::create(&partial, specs, &metadata)?;
        for (spec, bytes) in &tensors {
            writer.write(&spec.name, bytes)?;
        }
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
