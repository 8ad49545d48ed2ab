//! One probe: a needle prompt of exactly the requested length run through the model once per
//! (driving index profile, top-k) combination, with greedy generation of the answer.
//!
//! For each combination the model's options are switched (weights stay loaded), a fresh
//! sequence is prefilled chunk by chunk (so progress can be shown), then up to `generate`
//! tokens are decoded greedily, stopping at EOS. The `NeedleObserver` probes the last prompt
//! token (it produces the first answer token), every generated token's position and, with
//! `probe_question`, every token of the question; `--compare` profiles are re-scored on the same
//! hidden states for free. The scenario's check decides whether the answer is correct; the
//! answer text is kept verbatim.
//!
//! Cell ids: `L{length}-d{depth}-{index}-k{topk}` (plus `-s{sample}` when a sweep asks).

use super::observe::{CellTopk, NeedleObserver, NeedleObserverConfig};

use super::prompt::NeedlePrompt;
use super::scenario::Scenario;
use crate::backend::Backend;
use crate::model::forward::{ForwardOutput, LogitsRequest, Model, ModelOptions};
use crate::model::observer::Observer;
use crate::model::v41::{ModelV41, V41Options, V41State};
use crate::model::{ModelError, SequenceState};
use crate::numerics::profiles::{IndexProfile, KvMode};
use crate::record::ProbeRun;
use crate::tokenizer::V4Tokenizer;
use std::time::Instant;

/// The profiles every run of a probe or sweep scores besides its driving one, on the same
/// hidden states: the command's other driving profiles (`--index`) and its `--compare` ones,
/// in that order, each once. (A run's own driving profile is left out where it is used.)
pub fn comparison_profiles(
    indexes: &[IndexProfile],
    compare: &[IndexProfile],
) -> Vec<IndexProfile> {
    let mut all: Vec<IndexProfile> = Vec::new();
    for &p in indexes.iter().chain(compare) {
        if !all.contains(&p) {
            all.push(p);
        }
    }
    all
}

/// `--compare` with `exact` added when a rounding profile drives and it is not scored: it
/// costs no forward, and only it tells a layer lost to rounding from one the top-k is too small
/// for ([`crate::record::verdict`]).
pub fn with_exact(indexes: &[IndexProfile], compare: &[IndexProfile]) -> Vec<IndexProfile> {
    let exact = IndexProfile::Exact;
    let mut out = compare.to_vec();
    if indexes.iter().any(|&p| p != exact) && !compare.contains(&exact) && !indexes.contains(&exact)
    {
        out.push(exact);
    }
    out
}

/// What one probe runs.
#[derive(Clone, Debug)]
pub struct ProbeOptions {
    pub indexes: Vec<IndexProfile>,
    /// Scored besides each run's driving profile ([`comparison_profiles`]).
    pub compare: Vec<IndexProfile>,
    pub topks: Vec<usize>,
    pub kv: KvMode,
    /// Maximum generated tokens (0 = only the prefill).
    pub generate: usize,
    pub chunk: usize,
    /// Also probe every token of the question.
    pub probe_question: bool,
    /// A serving engine's capture (`--engine`): its answer tokens are fed instead of greedy
    /// choices (so both sides see the same context at every decode position), and its
    /// selections are held against every scored profile (`ProbeRun::engine_records`).
    pub engine: Option<std::sync::Arc<super::capture::EngineCapture>>,
}

/// Progress callbacks: prefill tokens done of total, then each generated token.
pub trait ProbeProgress {
    fn run_started(&mut self, _index: IndexProfile, _topk: usize, _prompt_tokens: usize) {}
    fn prefill(&mut self, _done: usize, _total: usize) {}
    fn generated(&mut self, _count: usize) {}
    fn run_finished(&mut self, _run: &ProbeRun) {}
}

/// No progress output.
pub struct Quiet;
impl ProbeProgress for Quiet {}

/// Token positions of the question inside the prompt (tokens overlapping its bytes).
pub fn question_positions(tok: &V4Tokenizer, prompt: &NeedlePrompt) -> Vec<usize> {
    let Some(start) = prompt.prompt_text.rfind(&prompt.question) else {
        return Vec::new();
    };
    let end = start + prompt.question.len();
    let Ok((_, offsets)) = tok.encode_with_offsets(&prompt.prompt_text) else {
        return Vec::new();
    };
    offsets
        .iter()
        .enumerate()
        .filter(|(_, &(a, b))| a < end && b > start)
        .map(|(i, _)| i)
        .collect()
}

/// The cell id of one combination.
pub fn cell_id(prompt: &NeedlePrompt, index: IndexProfile, topk: usize) -> String {
    crate::record::cell_id_base(prompt.tokens.len(), prompt.depth_pct, index, topk)
}

/// What [`run_probe`] runs: the prompt and its scenario (which judges the answer), the
/// tokenizer (which decodes it), the runs' options, and the suffix of every cell id (a sweep's
/// `-s{sample}`).
pub struct ProbeInputs<'a> {
    pub tok: &'a V4Tokenizer,
    pub scenario: &'a Scenario,
    pub prompt: &'a NeedlePrompt,
    pub opts: &'a ProbeOptions,
    pub cell_suffix: &'a str,
}

/// When Ctrl-C stops [`run_probe`]: `requested` says it was pressed
/// (`run::interrupt::stop_requested`); it is checked after each run, and with `within_runs` also
/// after each prefill chunk and generated token, dropping the run in flight (a probe, whose one
/// run can take hours; a sweep finishes its cell in flight).
#[derive(Clone, Copy)]
pub struct StopCheck<'a> {
    pub requested: &'a dyn Fn() -> bool,
    pub within_runs: bool,
}

impl StopCheck<'_> {
    /// Never stops (tests, library users without a Ctrl-C handler).
    pub fn never() -> StopCheck<'static> {
        StopCheck {
            requested: &|| false,
            within_runs: false,
        }
    }
}

/// What a probe's run switches on a loaded model (the weights stay).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RunSwitch {
    pub index: IndexProfile,
    pub kv: KvMode,
    pub topk: usize,
    pub chunk: usize,
}

/// A model a probe runs: DeepSeek-V4 ([`Model`]) or DeepSeek-V4.1 ([`ModelV41`]), on any
/// backend. The probe needs only this: switch a run's options, start a sequence, append tokens
/// with an observer, and the token that ends an answer.
pub trait ProbeModel {
    type State;
    /// The token that ends an answer.
    fn eos(&self) -> u32;
    /// Switches the run's profile, KV rounding, top-k and chunk.
    fn switch(&mut self, run: RunSwitch) -> Result<(), ModelError>;
    fn new_sequence(&self) -> Self::State;
    fn forward(
        &self,
        state: &mut Self::State,
        tokens: &[u32],
        observer: &mut dyn Observer,
        logits: LogitsRequest,
    ) -> Result<ForwardOutput, ModelError>;
}

impl<B: Backend> ProbeModel for Model<B> {
    type State = SequenceState<B::Act>;
    fn eos(&self) -> u32 {
        self.config().eos_token_id
    }
    fn switch(&mut self, run: RunSwitch) -> Result<(), ModelError> {
        self.set_options(ModelOptions {
            index: run.index,
            kv: run.kv,
            topk: Some(run.topk),
            chunk: run.chunk,
        })
    }
    fn new_sequence(&self) -> Self::State {
        Model::new_sequence(self)
    }
    fn forward(
        &self,
        state: &mut Self::State,
        tokens: &[u32],
        observer: &mut dyn Observer,
        logits: LogitsRequest,
    ) -> Result<ForwardOutput, ModelError> {
        Model::forward(self, state, tokens, observer, logits)
    }
}

/// DeepSeek-V4.1 keeps its candidate budget (`--candidate-blocks`) across runs.
impl<B: Backend> ProbeModel for ModelV41<B> {
    type State = V41State<B::Act>;
    fn eos(&self) -> u32 {
        crate::tokenizer::SPECIAL_TOKENS
            .iter()
            .find(|t| t.1 == crate::tokenizer::EOS)
            .map_or(1, |t| t.2)
    }
    fn switch(&mut self, run: RunSwitch) -> Result<(), ModelError> {
        let opts = V41Options {
            index: run.index,
            kv: run.kv,
            topk: Some(run.topk),
            chunk: run.chunk,
            ..self.options().clone()
        };
        self.set_options(opts)
    }
    fn new_sequence(&self) -> Self::State {
        ModelV41::new_sequence(self)
    }
    fn forward(
        &self,
        state: &mut Self::State,
        tokens: &[u32],
        observer: &mut dyn Observer,
        logits: LogitsRequest,
    ) -> Result<ForwardOutput, ModelError> {
        ModelV41::forward(self, state, tokens, observer, logits)
    }
}

/// Runs every (index, top-k) combination of `inputs.opts` on `inputs.prompt`, on any model
/// and backend; once `stop` says so only those finished so far.
pub fn run_probe<M: ProbeModel>(
    model: &mut M,
    inputs: &ProbeInputs,
    progress: &mut dyn ProbeProgress,
    stop: StopCheck,
) -> anyhow::Result<Vec<ProbeRun>> {
    let ProbeInputs {
        tok,
        scenario,
        prompt,
        opts,
        cell_suffix,
    } = *inputs;
    let abandon = || stop.within_runs && (stop.requested)();
    let eos = model.eos();
    let last = prompt.tokens.len() - 1;
    let mut prompt_positions = vec![last];
    if opts.probe_question {
        prompt_positions.extend(question_positions(tok, prompt));
        prompt_positions.sort_unstable();
        prompt_positions.dedup();
    }
    let mut runs = Vec::new();
    for &index in &opts.indexes {
        for &topk in &opts.topks {
            model.switch(RunSwitch {
                index,
                kv: opts.kv,
                topk,
                chunk: opts.chunk,
            })?;
            let id = format!("{}{}", cell_id(prompt, index, topk), cell_suffix);
            let compare: Vec<IndexProfile> = opts
                .compare
                .iter()
                .copied()
                .filter(|&p| p != index)
                .collect();
            let mut observer = NeedleObserver::new(NeedleObserverConfig {
                needles: prompt.needles.iter().map(|n| n.span).collect(),
                answer: prompt.answer,
                prompt_len: prompt.tokens.len(),
                prompt_positions: prompt_positions.clone(),
                probe_decode: true,
                driving: index,
                compare,
                cells: vec![CellTopk {
                    cell_id: id.clone(),
                    topk,
                }],
                engine: opts.engine.clone(),
            });
            progress.run_started(index, topk, prompt.tokens.len());
            let started = Instant::now();
            let mut state = model.new_sequence();
            let total = prompt.tokens.len();
            let mut logits = Vec::new();
            let mut done = 0;
            for piece in prompt.tokens.chunks(opts.chunk.max(1)) {
                let want = if done + piece.len() == total {
                    LogitsRequest::Last
                } else {
                    LogitsRequest::None
                };
                let out = model.forward(&mut state, piece, &mut observer, want)?;
                if let Some((_, l)) = out.logits.into_iter().last() {
                    logits = l;
                }
                done += piece.len();
                progress.prefill(done, total);
                if abandon() {
                    return Ok(runs);
                }
            }
            let mut generated = Vec::new();
            // The serving engine's tokens, when it is held against this run.
            let forced = opts.engine.as_ref().map(|c| c.output_ids.clone());
            let limit = forced.as_ref().map_or(opts.generate, |f| f.len());
            while generated.len() < limit && !logits.is_empty() {
                let position = prompt.tokens.len() + generated.len() - 1;
                let chosen = match &forced {
                    Some(f) => Some(f[generated.len()]),
                    None => argmax(&logits),
                };
                let next = chosen.ok_or_else(|| {
                    anyhow::anyhow!(
                        "cannot judge the answer: the logits at position {position} \
                         (generated token {}) hold NaN or infinite values: damaged weight \
                         values (e.g. head.weight or a norm) or an overflow (on a GPU, compare \
                         with --gpu-gemm f32)",
                        generated.len() + 1
                    )
                })?;
                generated.push(next);
                progress.generated(generated.len());
                if abandon() {
                    return Ok(runs);
                }
                if next == eos || generated.len() == limit {
                    break;
                }
                let out = model.forward(&mut state, &[next], &mut observer, LogitsRequest::Last)?;
                logits = out
                    .logits
                    .into_iter()
                    .last()
                    .map(|(_, l)| l)
                    .unwrap_or_default();
            }
            if let Some(err) = observer.errors.first() {
                anyhow::bail!("cannot rank the needle: {err}");
            }
            let text_ids: Vec<u32> = generated.iter().copied().filter(|&t| t != eos).collect();
            let answer_text = tok.decode(&text_ids)?;
            let ended = generated.last() == Some(&eos);
            let answer_correct =
                scenario.judge_generated(&answer_text, &prompt.answer_values, ended);
            let run = ProbeRun {
                cell_id: id,
                index: index.name().to_string(),
                kv: opts.kv.name().to_string(),
                topk,
                answer_text,
                answer_correct,
                generated_ids: generated,
                layers: std::mem::take(&mut observer.layer_records),
                attention: std::mem::take(&mut observer.attention_records),
                engine_records: std::mem::take(&mut observer.engine_records),
                selection_disagreements: observer.disagreements.len(),
                selection_checks: observer.selection_checks,
                wall_seconds: started.elapsed().as_secs_f64(),
            };
            progress.run_finished(&run);
            runs.push(run);
            // Ctrl-C: the finished runs are returned (fewer than planned), for the caller to
            // print and record.
            if (stop.requested)() {
                return Ok(runs);
            }
        }
    }
    Ok(runs)
}

/// Greedy choice: the highest logit, ties to the lower token id; `None` when any logit is NaN
/// or infinite (no honest choice exists, and a NaN at index 0 would otherwise win silently).
pub fn argmax(logits: &[f32]) -> Option<u32> {
    if logits.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    Some(best as u32)
}
