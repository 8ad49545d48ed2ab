//! Device residency: through the GPU backend a prefill keeps each layer's activations, caches
//! and compressor state on the device, and only what the model needs on the host crosses (top-k
//! indices and router scores down; attention entries, routes and small per-op tables up). Counted on the emulator, whose executor counts every byte
//! copied each way exactly as the CUDA executor does.

use needlescope_testkit::engine as engine_support;

use engine_support::{synth_model, tokens};
use needlescope::backend::gpu::{EmuBackend, EmuExecutor, GemmType, GpuBackend};
use needlescope::backend::Backend;
use needlescope::checkpoint::WeightFormat;
use needlescope::model::bench::time_prefill;
use needlescope::model::{Model, ModelOptions};
use needlescope::synth::Preset;

/// On `tiny` (D = 64, 4 streams: one hidden state is 1 KiB) the per-op design of bb340dd, which
/// uploaded every op's inputs and downloaded its outputs, moved 18.5 KiB up and 14.5 KiB down
/// per token and layer (bench on 4 official layers, 256 tokens); resident activations moved
/// 2.2 and 1.3 KiB, with the caches and the embedding resident too about 1.7 and 1.0 KiB, and
/// with the compressors pooling on the device (their projections and the raw index keys no
/// longer downloaded, the slot arrays no longer uploaded) 0.9 KiB and 65 B. The bounds (1.1 KiB
/// up, 0.25 KiB down) break with one more `[T, D]` activation (256 B) crossing per layer either
/// way.
#[test]
fn a_prefill_moves_only_what_the_model_needs_on_the_host() {
    let m = synth_model(Preset::Tiny, WeightFormat::Official, Some(4), None);
    let cfg = m.ckpt.config().clone();
    assert_eq!(
        cfg.hidden_size * cfg.hc_mult * 4,
        1024,
        "tiny's hidden state"
    );
    for (n, chunk) in [(256, 256), (600, 128)] {
        let opts = ModelOptions {
            chunk,
            ..ModelOptions::default()
        };
        let backend = EmuBackend::single(EmuExecutor::default(), GemmType::F32);
        let engine = Model::load_with(backend, &m.ckpt, opts).expect("emulated engine loads");
        let p = time_prefill(&engine, &tokens(n, cfg.vocab_size, 9)).expect("prefill runs");
        let (up, down) = p.transfer_per_token_layer().expect("tokens and layers");
        eprintln!("{n} tokens, chunk {chunk}: {up:.0} B up, {down:.0} B down per token-layer");
        assert!(up > 0.0 && down > 0.0, "the counters count");
        assert!(
            up < 1.1 * 1024.0 && down < 256.0,
            "{n} tokens, chunk {chunk}: {up:.0} B up, {down:.0} B down per token and layer"
        );
    }
}

#[test]
fn the_cpu_copies_nothing() {
    let m = synth_model(Preset::Tiny, WeightFormat::Bf16, Some(2), Some(8));
    let engine = Model::load(&m.ckpt, ModelOptions::default()).unwrap();
    let p = time_prefill(&engine, &tokens(40, m.ckpt.config().vocab_size, 1)).unwrap();
    assert_eq!(p.transfer_bytes, (0, 0));
    assert_eq!(engine.backend().transfer_bytes(), (0, 0));
}

/// Two devices (layers 0-1 and 2-3): the hidden streams cross the boundary once per chunk,
/// `[T, n, D]` down and up, and nothing else is copied twice.
#[test]
fn a_device_boundary_costs_one_move_of_the_streams() {
    let m = synth_model(Preset::Tiny, WeightFormat::Bf16, Some(4), Some(8));
    let cfg = m.ckpt.config().clone();
    let toks = tokens(300, cfg.vocab_size, 4);
    let opts = ModelOptions {
        chunk: 100,
        ..ModelOptions::default()
    };
    let run = |backend: EmuBackend| {
        let engine = Model::load_with(backend, &m.ckpt, opts.clone()).unwrap();
        time_prefill(&engine, &toks).unwrap().transfer_bytes
    };
    let one = run(EmuBackend::single(EmuExecutor::default(), GemmType::F32));
    let devices = vec![EmuExecutor::new(0, 1 << 30), EmuExecutor::new(1, 1 << 30)];
    let two = run(GpuBackend::new(devices, vec![0, 0, 1, 1], GemmType::F32));
    let streams = (toks.len() * cfg.hc_mult * cfg.hidden_size * 4) as u64;
    assert_eq!(
        two.0 - one.0,
        streams,
        "extra host -> device bytes {two:?} vs {one:?}"
    );
    assert_eq!(
        two.1 - one.1,
        streams,
        "extra device -> host bytes {two:?} vs {one:?}"
    );
}

/// The KV caches and index keys stay on the device: the traffic per token and layer does not
/// grow with the context (before, the index keys and attended rows were uploaded every chunk,
/// so CSA layers moved more the longer the sequence).
#[test]
fn the_traffic_per_token_does_not_grow_with_the_context() {
    let m = synth_model(Preset::Tiny, WeightFormat::Official, Some(4), None);
    let cfg = m.ckpt.config().clone();
    let opts = ModelOptions {
        chunk: 128,
        ..ModelOptions::default()
    };
    let backend = EmuBackend::single(EmuExecutor::default(), GemmType::F32);
    let engine = Model::load_with(backend, &m.ckpt, opts).unwrap();
    let per_token = |n: usize| {
        let p = time_prefill(&engine, &tokens(n, cfg.vocab_size, 12)).unwrap();
        let (up, down) = p.transfer_per_token_layer().unwrap();
        up + down
    };
    let (short, long) = (per_token(256), per_token(1536));
    eprintln!("{short:.0} B per token-layer at 256 tokens, {long:.0} B at 1536");
    assert!(
        long <= short * 1.05,
        "{long:.0} B per token and layer at 1536 tokens vs {short:.0} B at 256"
    );
}
