//! A trace records indexer scores and logits: the GPU backend must not download the attention
//! probabilities of its positions (a large copy, discarded). Device -> host bytes of a traced
//! forward on the emulated GPU against the bytes of the records it keeps.

use needlescope_testkit::engine as engine_support;

use engine_support::{synth_model, tokens};
use needlescope::backend::gpu::{EmuBackend, EmuExecutor, GemmType};
use needlescope::backend::Backend;
use needlescope::checkpoint::WeightFormat;
use needlescope::model::{Model, ModelOptions};
use needlescope::run::trace::{run_trace, LogitsMode, TraceLayout};
use needlescope::synth::Preset;

#[test]
fn a_trace_downloads_no_attention_probabilities() {
    let m = synth_model(Preset::Tiny, WeightFormat::Official, None, None);
    let cfg = m.ckpt.config().clone();
    let n = 2048;
    let toks = tokens(n, cfg.vocab_size, 3);
    let positions: Vec<usize> = (0..n).collect();
    let opts = ModelOptions {
        chunk: 512,
        ..ModelOptions::default()
    };
    let engine = Model::load_with(
        EmuBackend::single(EmuExecutor::default(), GemmType::F32),
        &m.ckpt,
        opts,
    )
    .unwrap();
    let before = engine.backend().transfer_bytes().1;
    run_trace(
        &engine,
        &toks,
        &positions,
        false,
        LogitsMode::All,
        &mut |_, _| {},
    )
    .unwrap();
    let d2h = engine.backend().transfer_bytes().1 - before;
    let layout = TraceLayout::for_config(&cfg, n, n, cfg.index_topk, false, LogitsMode::All);
    let records = layout.memory_bytes(&positions);
    // Attention probabilities: per layer and query, heads x entries (window + selected / all
    // compressed rows).
    let h = cfg.num_attention_heads as u64;
    let mut probs = 0u64;
    for l in 0..cfg.num_hidden_layers {
        let ratio = match cfg.layer_kind(l) {
            needlescope::config::LayerKind::Swa => 0,
            k => k.ratio(),
        };
        for t in 0..n as u64 {
            let window = (t + 1).min(cfg.sliding_window as u64);
            let rows = match ratio {
                0 => 0,
                4 => ((t + 1) / 4).min(cfg.index_topk as u64),
                r => (t + 1) / r as u64,
            };
            probs += 4 * h * (window + rows);
        }
    }
    eprintln!("trace --positions all, {n} tokens: device->host {d2h} B; records kept {records} B; attention probabilities (>= what the kernel path downloads, padded to emax) {probs} B");
    assert!(
        d2h < records + records / 2,
        "the trace downloads {d2h} B for {records} B of records"
    );
}
