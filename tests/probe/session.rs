//! `run_probe`'s generation loop on the planted model (real vocabulary): every generated token
//! is the argmax of a fresh one-shot prefill over the prompt plus the tokens generated before
//! it (decode steps equal prefill, docs/spec/attention.md 8.4), and generation stops at the config's EOS,
//! which is kept in the ids and left out of the answer text.

use needlescope::checkpoint::{Checkpoint, WeightFormat};
use needlescope::model::forward::{Engine, EngineOptions, LogitsRequest};
use needlescope::model::NoObserver;
use needlescope::numerics::profiles::{IndexProfile, KvMode};
use needlescope::probe::prompt::build_prompt;
use needlescope::probe::scenario::Scenario;
use needlescope::probe::session::{argmax, run_probe, ProbeOptions, Quiet};
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
        served: None,
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
        let mut engine = Engine::load(&ckpt, EngineOptions::default()).unwrap();
        let prompt =
            build_prompt(&tok, &scenario, 300, 50.0, 3, cfg.max_position_embeddings).unwrap();
        let runs = run_probe(
            &mut engine,
            &tok,
            &scenario,
            &prompt,
            &options(),
            "",
            &mut Quiet,
            &|| false,
        )
        .unwrap();
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
        .set_options(EngineOptions {
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
