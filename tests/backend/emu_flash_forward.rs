//! A whole forward of the GPU backend at DeepSeek-V4-Flash's dimensions on the host emulator
//! against the CPU reference: `synth --preset flash --layers 4 --experts 16 --format official`
//! (layers SWA, SWA, CSA, HCA with their compressors, FP8 + FP4 weights through decoded copies),
//! 300 tokens in chunks of 64 under fp8 index keys and fp8 KV, the case of
//! `tests/gpu/main.rs::cuda_forward_matches_the_cpu_on_flash_four_layers` that exercises
//! the most (rounding replays, KV replays, many chunks). The op checks at these sizes
//! (`tests/backend/emu_flash_ops.rs`) run on CI; this composes them at real sizes before a GPU run.
//! Ignored: about 6.5 minutes and 16 GB of memory on 2 cores. Run with
//! `cargo test --release --test backend -- --ignored --nocapture emu_flash_forward::`.

use needlescope_testkit::engine as engine_support;

use engine_support::{synth_model, tokens};
use needlescope::backend::gpu::{EmuBackend, EmuExecutor, GemmType};
use needlescope::backend::parity::{table, Check};
use needlescope::checkpoint::WeightFormat;
use needlescope::model::{Model, ModelOptions};
use needlescope::numerics::profiles::{IndexProfile, KvMode};
use needlescope::run::parity::{check_forward, ForwardCase, ForwardTolerance};
use needlescope::synth::Preset;

#[test]
#[ignore = "6.5 minutes and 16 GB: cargo test --release --test backend -- --ignored emu_flash_forward::"]
fn forward_at_flash_dims_matches_the_cpu_on_the_emulator() {
    let m = synth_model(Preset::Flash, WeightFormat::Official, Some(4), Some(16));
    let opts = ModelOptions {
        topk: Some(64),
        ..ModelOptions::default()
    };
    let mut cpu = Model::load(&m.ckpt, opts.clone()).expect("CPU engine");
    let toks = tokens(300, m.ckpt.config().vocab_size, 3);
    // As the CLI runs it: decoded weight copies kept.
    let emu =
        EmuBackend::single(EmuExecutor::default(), GemmType::F32).with_decode_budgets(&[8 << 30]);
    let mut g = Model::load_with(emu, &m.ckpt, opts).expect("emulated GPU engine");
    let case = ForwardCase {
        profile: IndexProfile::SglangFp8,
        kv: KvMode::Fp8,
        chunk: 64,
    };
    let checks =
        check_forward(&mut g, &mut cpu, &toks, &[case], ForwardTolerance::F32).expect("forwards");
    let t = table(&checks);
    eprintln!("{t}");
    assert!(!checks.is_empty());
    assert!(checks.iter().all(Check::passed), "parity failures:\n{t}");
}
