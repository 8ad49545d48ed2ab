//! One probe: a needle prompt of exactly the requested length run through the engine once per
//! (driving index profile, top-k) combination, with greedy generation of the answer.
//!
//! For each combination the engine's options are switched (weights stay loaded), a fresh
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
use crate::model::forward::{Engine, EngineOptions, LogitsRequest};
use crate::numerics::profiles::{IndexProfile, KvMode};
use crate::record::{LayerRecord, ProbeRun};
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
    /// selections are held against every scored profile (`ProbeRun::served`).
    pub served: Option<std::sync::Arc<super::capture::EngineCapture>>,
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

/// Runs every (index, top-k) combination of `opts` on `prompt`, on any backend; once `stop`
/// says so (Ctrl-C: `run::interrupt::stop_requested`) only those finished so far.
#[allow(clippy::too_many_arguments)]
pub fn run_probe<B: Backend>(
    engine: &mut Engine<B>,
    tok: &V4Tokenizer,
    scenario: &Scenario,
    prompt: &NeedlePrompt,
    opts: &ProbeOptions,
    cell_suffix: &str,
    progress: &mut dyn ProbeProgress,
    stop: &dyn Fn() -> bool,
) -> anyhow::Result<Vec<ProbeRun>> {
    let eos = engine.config().eos_token_id;
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
            engine.set_options(EngineOptions {
                index,
                kv: opts.kv,
                topk: Some(topk),
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
                served: opts.served.clone(),
            });
            progress.run_started(index, topk, prompt.tokens.len());
            let started = Instant::now();
            let mut state = engine.new_sequence();
            let total = prompt.tokens.len();
            let mut logits = Vec::new();
            let mut done = 0;
            for piece in prompt.tokens.chunks(opts.chunk.max(1)) {
                let want = if done + piece.len() == total {
                    LogitsRequest::Last
                } else {
                    LogitsRequest::None
                };
                let out = engine.forward(&mut state, piece, &mut observer, want)?;
                if let Some((_, l)) = out.logits.into_iter().last() {
                    logits = l;
                }
                done += piece.len();
                progress.prefill(done, total);
            }
            let mut generated = Vec::new();
            // The serving engine's tokens, when it is held against this run.
            let forced = opts.served.as_ref().map(|c| c.output_ids.clone());
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
                if next == eos || generated.len() == limit {
                    break;
                }
                let out =
                    engine.forward(&mut state, &[next], &mut observer, LogitsRequest::Last)?;
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
                served: std::mem::take(&mut observer.served_records),
                selection_disagreements: observer.disagreements.len(),
                selection_checks: observer.selection_checks,
                wall_seconds: started.elapsed().as_secs_f64(),
            };
            progress.run_finished(&run);
            runs.push(run);
            // Ctrl-C: the finished runs are returned (fewer than planned), for the caller to
            // print and record.
            if stop() {
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

/// Driving-profile records of the answer position (the last prompt token) of one run.
pub fn answer_position_records(run: &ProbeRun, last_prompt_pos: usize) -> Vec<&LayerRecord> {
    run.layers
        .iter()
        .filter(|r| r.driving && r.query_pos == last_prompt_pos)
        .collect()
}

/// CSA layers at the answer position under the driving profile: (non-trivial layers that lost
/// a needle (any of them), non-trivial layers, all CSA layers).
pub fn layers_lost(run: &ProbeRun, last_prompt_pos: usize) -> (usize, usize, usize) {
    use std::collections::BTreeSet;
    let recs = answer_position_records(run, last_prompt_pos);
    let layers = |keep: &dyn Fn(&LayerRecord) -> bool| {
        recs.iter()
            .filter(|r| keep(r))
            .map(|r| r.layer)
            .collect::<BTreeSet<_>>()
            .len()
    };
    (
        layers(&|r| !r.trivial && !r.selected),
        layers(&|r| !r.trivial),
        layers(&|_| true),
    )
}

/// With several needles: for each, the non-trivial CSA layers that lost it at the answer
/// position under the driving profile, e.g. `needle 0 "cwd is /srv/a" lost on layers 3, 7;
/// needle 1 "..." kept`; `None` with one needle.
pub fn needles_lost(run: &ProbeRun, last_prompt_pos: usize, needles: &[String]) -> Option<String> {
    if needles.len() < 2 {
        return None;
    }
    let recs = answer_position_records(run, last_prompt_pos);
    let parts: Vec<String> = needles
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let lost: Vec<String> = recs
                .iter()
                .filter(|r| r.needle == i && !r.trivial && !r.selected)
                .map(|r| r.layer.to_string())
                .collect();
            let shown: String = if text.chars().count() > 48 {
                format!("{}...", text.chars().take(45).collect::<String>())
            } else {
                text.clone()
            };
            match lost.len() {
                0 => format!("needle {i} {shown:?} kept"),
                1 => format!("needle {i} {shown:?} lost on layer {}", lost[0]),
                _ => format!("needle {i} {shown:?} lost on layers {}", lost.join(", ")),
            }
        })
        .collect();
    Some(parts.join(", "))
}

/// The one-sentence diagnosis a probe's text starts with: for each run, which layers its
/// profile and top-k lose the needle on and why, told apart by the exact math scored on the
/// same hidden states (kept by exact: the profile's rounding; lost by exact too: the top-k is
/// too small there), or that it keeps the needle everywhere; e.g. `fp8 at top-64 loses the
/// needle on layers 1, 3 (2 of 2 non-trivial CSA layers): the exact math keeps layer 3 (fp8
/// rounding) and loses layer 1 too (top-64 is too small there); bf16 at top-64 keeps it on
/// both non-trivial CSA layers`.
pub fn diagnosis(runs: &[ProbeRun], last_prompt_pos: usize) -> String {
    use crate::record::why::{lost_layers, LossCause};
    let layer_list = |layers: &[usize]| {
        let mut layers = layers.to_vec();
        layers.dedup();
        let names: Vec<String> = layers.iter().map(|l| l.to_string()).collect();
        match names.len() {
            1 => format!("layer {}", names[0]),
            _ => format!("layers {}", names.join(", ")),
        }
    };
    let parts: Vec<String> = runs
        .iter()
        .map(|run| {
            let (lost, nontrivial, total) = layers_lost(run, last_prompt_pos);
            let who = format!("{} at top-{}", run.index, run.topk);
            if nontrivial == 0 {
                return format!(
                    "{who} cannot lose the needle: every CSA layer keeps every visible row \
                     (n_t <= k on all {total})"
                );
            }
            if lost == 0 {
                let all = match nontrivial {
                    1 => "the only non-trivial CSA layer".to_string(),
                    2 => "both non-trivial CSA layers".to_string(),
                    n => format!("all {n} non-trivial CSA layers"),
                };
                return format!("{who} keeps the needle on {all}");
            }
            let layers = lost_layers(run, last_prompt_pos);
            let of = |cause: LossCause| -> Vec<usize> {
                layers
                    .iter()
                    .filter(|l| l.cause == cause)
                    .map(|l| l.layer)
                    .collect()
            };
            let all: Vec<usize> = layers.iter().map(|l| l.layer).collect();
            let mut causes = Vec::new();
            let rounding = of(LossCause::Rounding);
            if !rounding.is_empty() {
                causes.push(format!(
                    "the exact math keeps {} ({} rounding)",
                    layer_list(&rounding),
                    run.index
                ));
            }
            let exact_loses = of(LossCause::ExactLoses);
            if !exact_loses.is_empty() {
                let too = if run.index == IndexProfile::Exact.name() {
                    ""
                } else {
                    " too"
                };
                let verb = if rounding.is_empty() {
                    "the exact math loses"
                } else {
                    "loses"
                };
                causes.push(format!(
                    "{verb} {}{too} (top-{} is too small there)",
                    layer_list(&exact_loses),
                    run.topk
                ));
            }
            let hidden = of(LossCause::NotVisible);
            if !hidden.is_empty() {
                causes.push(format!(
                    "{} cannot see a needle row yet",
                    layer_list(&hidden)
                ));
            }
            let unexplained: Vec<usize> = layers
                .iter()
                .filter(|l| {
                    matches!(
                        l.cause,
                        LossCause::KeptByOther | LossCause::NoProfileKeeps | LossCause::Unknown
                    )
                })
                .map(|l| l.layer)
                .collect();
            if !unexplained.is_empty() {
                causes.push(format!(
                    "{} cannot be told apart without the exact profile",
                    layer_list(&unexplained)
                ));
            }
            format!(
                "{who} loses the needle on {} ({lost} of {nontrivial} non-trivial CSA layers): {}",
                layer_list(&all),
                causes.join(" and ")
            )
        })
        .collect();
    parts.join("; ")
}

/// The one-line conclusion, e.g. "needle lost on 7/21 CSA layers under fp8 at top-512; all
/// kept with bf16 at top-512".
/// `judge_answers` is false for a model whose LM path is not built to answer (the planted demo
/// model): then the verdict part is left out.
///
/// With several needles (`needles`, their texts), "the needle lost on n layers" counts the
/// layers that lost any of them, and each needle's own layers follow in brackets.
pub fn conclusion(
    runs: &[ProbeRun],
    last_prompt_pos: usize,
    judge_answers: bool,
    needles: &[String],
) -> String {
    let mut parts = Vec::new();
    for run in runs {
        let each = needles_lost(run, last_prompt_pos, needles)
            .map_or(String::new(), |e| format!(" [{e}]"));
        let (lost, nontrivial, total) = layers_lost(run, last_prompt_pos);
        let verdict = match run.answer_correct {
            Some(true) => "answer correct",
            Some(false) => "answer wrong",
            None => "no verdict: the generation stopped before its answer ended",
        };
        let all = |n: usize, what: &str| match n {
            1 => format!("the only {what}"),
            n => format!("all {n} {what}s"),
        };
        let what = if nontrivial == 0 {
            format!(
                "needle trivially kept on {} (every visible row selected) under {} at top-{}",
                all(total, "CSA layer"),
                run.index,
                run.topk
            )
        } else if lost == 0 {
            format!(
                "{} kept on {} under {} at top-{}",
                if needles.len() > 1 {
                    "every needle"
                } else {
                    "needle"
                },
                all(nontrivial, "non-trivial CSA layer"),
                run.index,
                run.topk
            )
        } else {
            // With exact scored, how many of those the exact math keeps (lost to rounding);
            // not said when exact is itself the driving profile.
            let rounding = crate::record::why::rounding_losses(&run.layers, last_prompt_pos)
                .filter(|_| run.index != "exact")
                .map_or(String::new(), |n| format!(" (exact keeps {n})"));
            let noun = if needles.len() > 1 {
                "a needle"
            } else {
                "needle"
            };
            format!(
                "{noun} lost on {lost}/{total} CSA layers under {} at top-{}{rounding}",
                run.index, run.topk
            )
        };
        let what = format!("{what}{each}");
        if judge_answers {
            parts.push(format!("{what} ({verdict})"));
        } else {
            parts.push(what);
        }
    }
    parts.join("; ")
}
