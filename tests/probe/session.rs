//! `run_probe`'s generation loop on the planted model (real vocabulary): every generated token
//! is the argmax of a fresh one-shot prefill over the prompt plus the tokens generated before
//! it (decode steps equal prefill, docs/spec/attention.md 8.4), and generation stops at the config's EOS,
//! which is kept in the ids and left out of the answer text.

use needlescope::checkpoint::{Checkpoint, WeightFormat};
use needlescope::model::forward::{LogitsRequest, Model, ModelOptions};
use needlescope::model::NoObserver;
use needlescope::numerics::profiles::{IndexProfile, KvMode};
use needlescope::probe::prompt::build_prompt;
use needlescope::probe::scenario::Scenario;
use needlescope::probe::session::{argmax, run_probe, ProbeInputs, ProbeOptions, Quiet, StopCheck};
use needlescope::synth::planted::synth_planted;
use needlescope::synth::{Preset, SynthOptions};
use needlescope::tokenizer::V4Tokenizer;

const GENERATE: usize = 4;

fn options() -> ProbeOptions {
    ProbeOptions {
        indexes: vec![IndexProfile::SglangFp8],
        compare: vec![],
        topks: vec![16],
        kv: KvMode::Fp8,
        generate: GENERATE,
        chunk: 96,
        probe_question: false,
        engine: None,
    }
}

#[test]
fn greedy_tokens_equal_prefill_argmax_and_stop_at_eos() {
    let dir = tempfile::tempdir().unwrap();
    let opts = SynthOptions::new(Preset::Planted, WeightFormat::Bf16, dir.path());
    synth_planted(&opts, None).expect("synth planted");
    let tok = V4Tokenizer::builtin().unwrap();
    let scenario = Scenario::load("passkey").unwrap();
    let probe = |model: &std::path::Path| {
        let ckpt = Checkpoint::open(model).unwrap();
        let cfg = ckpt.config().clone();
        let mut engine = Model::load(&ckpt, ModelOptions::default()).unwrap();
        let prompt =
            build_prompt(&tok, &scenario, 300, 50.0, 3, cfg.max_position_embeddings).unwrap();
        let opts = options();
        let inputs = ProbeInputs {
            tok: &tok,
            scenario: &scenario,
            prompt: &prompt,
            opts: &opts,
            cell_suffix: "",
        };
        let runs = run_probe(&mut engine, &inputs, &mut Quiet, StopCheck::never()).unwrap();
        assert_eq!(runs.len(), 1);
        (engine, prompt, runs.into_iter().next().unwrap())
    };

    let (mut engine, prompt, run) = probe(dir.path());
    let generated = run.generated_ids.clone();
    assert_eq!(
        generated.len(),
        GENERATE,
        "no EOS in this model's greedy output"
    );
    engine
        .set_options(ModelOptions {
            index: IndexProfile::SglangFp8,
            kv: KvMode::Fp8,
            topk: Some(16),
            chunk: 300 + GENERATE,
        })
        .unwrap();
    for n in 0..generated.len() {
        let mut tokens = prompt.tokens.clone();
        tokens.extend(&generated[..n]);
        let mut state = engine.new_sequence();
        let out = engine
            .forward(&mut state, &tokens, &mut NoObserver, LogitsRequest::Last)
            .unwrap();
        let logits = &out.logits.last().unwrap().1;
        assert_eq!(
            argmax(logits),
            Some(generated[n]),
            "generated token {n} differs from the one-shot prefill's argmax"
        );
    }

    // The second generated token made EOS: generation stops at its first occurrence, EOS stays
    // in the ids and is not part of the answer text.
    let eos = generated[1];
    let stop = generated.iter().position(|&t| t == eos).unwrap();
    let config = dir.path().join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    v["eos_token_id"] = serde_json::json!(eos);
    std::fs::write(&config, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    let (_, _, stopped) = probe(dir.path());
    assert_eq!(stopped.generated_ids, generated[..=stop]);
    let text_ids: Vec<u32> = generated[..stop].to_vec();
    assert_eq!(stopped.answer_text, tok.decode(&text_ids).unwrap());
}

/// Progress that asks Ctrl-C's stop when the run at `stop_at_topk` starts, and records the
/// prefill it saw of that run.
struct StopAtRun<'a> {
    stop_at_topk: usize,
    pressed: &'a std::cell::Cell<bool>,
    prefilled_after_press: usize,
}

impl needlescope::probe::session::ProbeProgress for StopAtRun<'_> {
    fn run_started(&mut self, _index: IndexProfile, topk: usize, _prompt_tokens: usize) {
        if topk == self.stop_at_topk {
            self.pressed.set(true);
        }
    }
    fn prefill(&mut self, done: usize, _total: usize) {
        if self.pressed.get() {
            self.prefilled_after_press = done;
        }
    }
}

/// A probe's stop (`within_runs`) drops the run in flight after its next chunk and keeps the
/// finished runs; a sweep's finishes the run in flight and starts no other.
#[test]
fn a_stop_within_runs_drops_the_run_in_flight_at_the_next_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let opts = SynthOptions::new(Preset::Planted, WeightFormat::Bf16, dir.path());
    synth_planted(&opts, None).expect("synth planted");
    let tok = V4Tokenizer::builtin().unwrap();
    let scenario = Scenario::load("passkey").unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let cfg = ckpt.config().clone();
    let mut engine = Model::load(&ckpt, ModelOptions::default()).unwrap();
    let prompt = build_prompt(&tok, &scenario, 300, 50.0, 3, cfg.max_position_embeddings).unwrap();
    let opts = ProbeOptions {
        topks: vec![16, 32, 48],
        generate: 0,
        ..options()
    };
    let inputs = ProbeInputs {
        tok: &tok,
        scenario: &scenario,
        prompt: &prompt,
        opts: &opts,
        cell_suffix: "",
    };
    for (within_runs, kept, prefilled) in [(true, vec![16], 96), (false, vec![16, 32], 300)] {
        let pressed = std::cell::Cell::new(false);
        let mut progress = StopAtRun {
            stop_at_topk: 32,
            pressed: &pressed,
            prefilled_after_press: 0,
        };
        let requested = || pressed.get();
        let stop = StopCheck {
            requested: &requested,
            within_runs,
        };
        let runs = run_probe(&mut engine, &inputs, &mut progress, stop).unwrap();
        let topks: Vec<usize> = runs.iter().map(|r| r.topk).collect();
        assert_eq!(topks, kept, "within_runs {within_runs}");
        assert_eq!(
            progress.prefilled_after_press, prefilled,
            "within_runs {within_runs}: the stopped run's prefill ends after one chunk of 96"
        );
    }
}
