//! Index profiles and KV modes end to end, observation consistency, and input errors.

use needlescope_testkit::engine as engine_support;

use engine_support::*;
use needlescope::checkpoint::WeightFormat;
use needlescope::model::{LogitsRequest, Model, ModelError, ModelOptions, NoObserver};
use needlescope::numerics::hadamard_inplace;
use needlescope::numerics::profiles::{self, IndexProfile, KvMode};
use needlescope::synth::Preset;

fn opts(index: IndexProfile, kv: KvMode, chunk: usize) -> ModelOptions {
    ModelOptions {
        index,
        kv,
        topk: None,
        chunk,
    }
}

/// Re-scores an observation's raw inputs under `profile` (what the probe does).
fn rescore(profile: IndexProfile, r: &IndexerRecord) -> Vec<f32> {
    let q = profiles::prepare_query(profile, &r.q_raw, &r.weights_raw, r.heads, r.head_dim);
    let keys = profiles::prepare_keys(profile, &r.keys_raw, r.head_dim);
    let mut out = vec![0.0; keys.rows()];
    profiles::score_rows(profile, &q, &keys, &mut out);
    out
}

#[test]
fn every_profile_and_kv_mode_runs_end_to_end_on_tiny() {
    let model = tiny();
    let toks = tokens(120, 4096, 11);
    let mut engine =
        Model::load(&model.ckpt, opts(IndexProfile::Exact, KvMode::Exact, 32)).unwrap();
    let mut exact_logits = None;
    // DeepSeek-V4.1's KV rounding is refused by name on a V4 model.
    let e = engine
        .set_options(opts(IndexProfile::Exact, KvMode::Release, 32))
        .unwrap_err()
        .to_string();
    assert!(e.contains("kv is release"), "{e}");
    for kv in KvMode::V4 {
        for index in IndexProfile::ALL {
            engine.set_options(opts(index, kv, 32)).unwrap();
            let mut rec = Recorder::all(&[]);
            let mut state = engine.new_sequence();
            let out = engine
                .forward(&mut state, &toks, &mut rec, LogitsRequest::Last)
                .unwrap();
            let logits = &out.logits[0].1;
            assert!(
                logits.iter().all(|v| v.is_finite()),
                "{index}/{kv}: finite logits"
            );
            for (&(layer, pos), r) in &rec.indexer {
                // The observed scores are the driving profile applied to the observed raw inputs.
                if pos % 17 == 0 || pos == 119 {
                    let what = format!("{index}/{kv} layer {layer} pos {pos}");
                    assert_close(&rescore(index, r), &r.scores, 1e-6, &what);
                }
                // While n_t <= k the selected set is every visible row, whatever the profile.
                let n_t = (pos + 1) / 4;
                if n_t <= 8 {
                    let mut set: Vec<i32> =
                        r.selected.iter().copied().filter(|&x| x >= 0).collect();
                    set.sort();
                    assert_eq!(
                        set,
                        (0..n_t as i32).collect::<Vec<_>>(),
                        "{index}/{kv} at {pos}"
                    );
                }
            }
            match (index, kv) {
                (IndexProfile::Exact, KvMode::Exact) => exact_logits = Some(logits.clone()),
                (IndexProfile::Exact, KvMode::Fp8) => {
                    assert!(
                        Some(logits) != exact_logits.as_ref(),
                        "kv fp8 must round something"
                    )
                }
                _ => {}
            }
        }
    }
}

#[test]
fn exact_scores_are_unchanged_by_the_hadamard_rotation() {
    let model = tiny();
    let engine = Model::load(&model.ckpt, opts(IndexProfile::Exact, KvMode::Exact, 64)).unwrap();
    let mut rec = Recorder::at(&[63, 199], &[]);
    let mut state = engine.new_sequence();
    engine
        .forward(
            &mut state,
            &tokens(200, 4096, 12),
            &mut rec,
            LogitsRequest::None,
        )
        .unwrap();
    for (key, r) in &rec.indexer {
        let mut rotated = r.clone();
        for head in rotated.q_raw.chunks_mut(r.head_dim) {
            hadamard_inplace(head).unwrap();
        }
        for row in rotated.keys_raw.chunks_mut(r.head_dim) {
            hadamard_inplace(row).unwrap();
        }
        assert_close(
            &rescore(IndexProfile::Exact, &rotated),
            &r.scores,
            1e-4,
            &format!("{key:?}"),
        );
    }
}

#[test]
fn token_ids_outside_the_vocabulary_are_errors_and_leave_the_state_alone() {
    let model = tiny();
    let engine = Model::load(&model.ckpt, ModelOptions::default()).unwrap();
    let mut state = engine.new_sequence();
    engine
        .forward(&mut state, &[1, 2, 3], &mut NoObserver, LogitsRequest::None)
        .unwrap();
    let err = engine
        .forward(&mut state, &[5, 4096], &mut NoObserver, LogitsRequest::Last)
        .unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::TokenOutOfRange {
                token: 4096,
                position: 4,
                vocab: 4096
            }
        ),
        "{err}"
    );
    assert_eq!(state.len(), 3);
    let err = engine
        .forward(
            &mut state,
            &[5],
            &mut NoObserver,
            LogitsRequest::Positions(vec![2]),
        )
        .unwrap_err();
    assert!(
        matches!(err, ModelError::LogitsPosition { position: 2, .. }),
        "{err}"
    );
    assert_eq!(state.len(), 3);
}

#[test]
fn a_sequence_cannot_continue_under_other_rounding() {
    let model = tiny();
    let mut engine = Model::load(&model.ckpt, ModelOptions::default()).unwrap();
    let mut state = engine.new_sequence();
    engine
        .forward(&mut state, &[1, 2], &mut NoObserver, LogitsRequest::None)
        .unwrap();
    engine
        .set_options(opts(IndexProfile::SglangFp8, KvMode::Exact, 8))
        .unwrap();
    assert!(engine
        .forward(&mut state, &[3], &mut NoObserver, LogitsRequest::None)
        .is_err());
    state.reset();
    assert!(engine
        .forward(&mut state, &[3], &mut NoObserver, LogitsRequest::None)
        .is_ok());
}

/// Runs every index profile under both KV modes on a Flash-dimension synthetic checkpoint in
/// official format (FP8 block linears, FP4 experts; hidden 4096, 64 heads of 512, vocab
/// 129,280, index heads 64 x 128) and returns the last logits of each run, profiles fastest.
fn flash_runs(layers: usize, tokens_n: usize) -> Vec<Vec<f32>> {
    let t0 = std::time::Instant::now();
    let model = synth_model(Preset::Flash, WeightFormat::Official, Some(layers), Some(8));
    let t_synth = t0.elapsed();
    let mut engine =
        Model::load(&model.ckpt, opts(IndexProfile::Exact, KvMode::Exact, 16)).unwrap();
    let t_load = t0.elapsed() - t_synth;
    let toks = tokens(tokens_n, 129280, 13);
    let mut last = Vec::new();
    for kv in KvMode::V4 {
        for index in IndexProfile::ALL {
            engine.set_options(opts(index, kv, 16)).unwrap();
            let mut state = engine.new_sequence();
            let out = engine
                .forward(&mut state, &toks, &mut NoObserver, LogitsRequest::Last)
                .unwrap();
            let l = &out.logits[0].1;
            assert_eq!(l.len(), 129280);
            assert!(
                l.iter().all(|v| v.is_finite()),
                "{index}/{kv}: finite logits"
            );
            last.push(l.clone());
        }
    }
    eprintln!(
        "flash {layers} layers: synth {:.1}s, load {:.1}s, 16 forwards of {tokens_n} tokens {:.1}s",
        t_synth.as_secs_f64(),
        t_load.as_secs_f64(),
        (t0.elapsed() - t_synth - t_load).as_secs_f64()
    );
    last
}

/// `synth --preset flash --layers 2 --experts 8`: the Flash schedule's first two layers (SWA,
/// hash routers). Ignored by default: ~9 GB of RAM for the f32 weights and ~85 s in release
/// (synth 32 s, load 16 s, forwards 34 s on 2 cores). Run with
/// `cargo test --release --test model -- --ignored profiles::flash --nocapture`.
#[test]
#[ignore]
fn flash_two_layers_official_format_runs_every_profile_and_kv_mode() {
    let last = flash_runs(2, 20);
    let n = IndexProfile::ALL.len();
    assert!(
        last[..n].iter().all(|l| *l == last[0]),
        "no CSA layer: profiles cannot matter"
    );
    assert!(last[0] != last[n], "kv fp8 must round something");
}

/// `synth --preset flash --layers 4 --experts 8`: adds a CSA layer (indexer at 64 x 128, real
/// Hadamard size) and an HCA layer. Ignored by default (~11 GB of RAM, a few minutes in release);
/// run as above with the filter `flash_four`.
#[test]
#[ignore]
fn flash_four_layers_official_format_runs_every_profile_and_kv_mode() {
    let last = flash_runs(4, 40);
    assert!(
        last[0] != last[IndexProfile::ALL.len()],
        "kv fp8 must round something"
    );
}
