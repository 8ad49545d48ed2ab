//! Weight residency (backend::WeightResidency): weights decoded to f32 at load and weights kept
//! in their stored format and decoded on use give bit-identical logits, index scores,
//! selections and hidden states, in every stored format; a streamed engine outlives the
//! `Checkpoint` it was loaded from; `Auto` decodes a model as small as tiny.

use needlescope_testkit::engine as engine_support;

use engine_support::*;
use needlescope::backend::WeightResidency;
use needlescope::checkpoint::{Checkpoint, WeightFormat};
use needlescope::model::{ForwardOutput, LogitsRequest, Model, ModelOptions};
use needlescope::synth::Preset;

const T: usize = 160;

fn opts() -> ModelOptions {
    ModelOptions {
        chunk: 48,
        ..ModelOptions::default()
    }
}

fn run(engine: &Model, tokens: &[u32]) -> (ForwardOutput, Recorder) {
    let mut rec = Recorder::all(&["layers.", "logits", "embed"]);
    let mut state = engine.new_sequence();
    let out = engine
        .forward(&mut state, tokens, &mut rec, LogitsRequest::All)
        .expect("forward");
    (out, rec)
}

/// Asserts `a` and `b` are the same f32 values bit for bit, naming the first difference.
fn assert_bits(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths differ");
    if let Some(i) = (0..a.len()).find(|&i| a[i].to_bits() != b[i].to_bits()) {
        panic!(
            "{what}: first difference at {i}: decoded {} vs streamed {}",
            a[i], b[i]
        );
    }
}

fn assert_identical(a: &(ForwardOutput, Recorder), b: &(ForwardOutput, Recorder), what: &str) {
    assert_eq!(a.0.logits.len(), T, "{what}: logits of every position");
    for ((pa, la), (pb, lb)) in a.0.logits.iter().zip(&b.0.logits) {
        assert_eq!(pa, pb);
        assert_bits(la, lb, &format!("{what}: logits at {pa}"));
    }
    assert!(!a.1.indexer.is_empty(), "{what}: tiny has CSA layers");
    assert_eq!(
        a.1.indexer.len(),
        b.1.indexer.len(),
        "{what}: indexer calls"
    );
    for (key, ra) in &a.1.indexer {
        let rb = &b.1.indexer[key];
        assert_bits(
            &ra.scores,
            &rb.scores,
            &format!("{what}: scores at {key:?}"),
        );
        assert_eq!(ra.selected, rb.selected, "{what}: selection at {key:?}");
    }
    assert_eq!(a.1.rows.len(), b.1.rows.len(), "{what}: intermediates");
    for (name, rows) in &a.1.rows {
        for (pos, row) in rows {
            assert_bits(
                row,
                b.1.row(name, *pos),
                &format!("{what}: {name} at {pos}"),
            );
        }
    }
}

fn decoded_equals_streamed(format: WeightFormat) {
    let model = synth_model(Preset::Tiny, format, None, None);
    let toks = tokens(T, model.ckpt.config().vocab_size, 7);
    let decoded = Model::load_weights(&model.ckpt, opts(), WeightResidency::Decoded).unwrap();
    assert_eq!(decoded.backend().weights(), WeightResidency::Decoded);
    let a = run(&decoded, &toks);
    drop(decoded);
    // A checkpoint opened just for the load: the engine keeps the memory maps alive itself.
    let ckpt = Checkpoint::open(model.dir.path()).unwrap();
    let streamed = Model::load_weights(&ckpt, opts(), WeightResidency::Streamed).unwrap();
    drop(ckpt);
    assert_eq!(streamed.backend().weights(), WeightResidency::Streamed);
    let b = run(&streamed, &toks);
    assert_identical(&a, &b, &format!("tiny {format:?}"));
}

#[test]
fn decoded_and_streamed_weights_agree_bitwise_bf16() {
    decoded_equals_streamed(WeightFormat::Bf16);
}

#[test]
fn decoded_and_streamed_weights_agree_bitwise_official_fp8_fp4() {
    decoded_equals_streamed(WeightFormat::Official);
}

#[test]
fn decoded_and_streamed_weights_agree_bitwise_nvfp4() {
    decoded_equals_streamed(WeightFormat::Nvfp4);
}

#[test]
fn auto_decodes_a_model_that_fits() {
    let model = tiny();
    let engine = Model::load(&model.ckpt, opts()).unwrap();
    assert_eq!(engine.backend().weights(), WeightResidency::Decoded);
    let bytes = needlescope::devices::plan::decoded_weight_bytes(
        &needlescope::devices::plan::Footprint::of_checkpoint(&model.ckpt),
    );
    assert!(
        bytes > 0 && bytes < 1 << 30,
        "tiny decodes to {bytes} bytes"
    );
}

/// `load_reporting` (the CLI's load bar) reports every part once, in order (embedding, each
/// decoder layer, head), with a fixed total, and loads the same engine as `load_with`.
#[test]
fn loading_reports_each_part_once_in_order() {
    let m = synth_model(Preset::Tiny, WeightFormat::Official, None, None);
    let layers = m.ckpt.config().num_hidden_layers;
    let mut seen = Vec::new();
    let reported = Model::load_reporting(
        needlescope::backend::CpuBackend::new(),
        &m.ckpt,
        opts(),
        &mut |done, total| seen.push((done, total)),
    )
    .expect("load");
    let want: Vec<(usize, usize)> = (1..=layers + 2).map(|d| (d, layers + 2)).collect();
    assert_eq!(seen, want);
    let plain =
        Model::load_with(needlescope::backend::CpuBackend::new(), &m.ckpt, opts()).expect("load");
    let toks = tokens(T, m.ckpt.config().vocab_size, 5);
    assert_eq!(run(&reported, &toks).0.logits, run(&plain, &toks).0.logits);
}
