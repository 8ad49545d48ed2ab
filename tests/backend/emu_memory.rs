//! The memory plan's promise (`plan`: no out-of-memory midway) against real forwards on the host
//! emulator: the emulated device counts every allocation the GPU backend makes (at its pool size
//! class; `EmuExecutor::with_memory_tracking`), so the peak of the bytes in use during a whole
//! prefill, less the weights (what is in use once the engine is loaded), is what the run needed
//! besides its weights. The plan charges that device `state + workspace`, of which
//! `FIXED_WORKSPACE` is for what the emulator does not see (CUDA context, cuBLAS workspace,
//! kernel modules, allocator granularity); the rest must bound the measured peak, with decoded
//! weight copies off (they live in the plan's free headroom, `backend::gpu::matrix`).
//!
//! Configurations: the tiny model, and a model with Flash's proportions at small dimensions
//! (`flash_like`: 4 residual streams, heads x head_dim = 8 x hidden, q / o ranks hidden / 4,
//! 8 output groups, experts of hidden / 2 with 6 per token, Flash's window 128 and top-k 512),
//! with SWA, CSA and HCA layers; several contexts and chunks; the kernel and GEMM attention
//! paths, routed experts one by one and batched; pooled (as the CUDA executor runs by default)
//! and unpooled. Each case prints measured against planned, so the plan's overcount shows.
//! `NEEDLESCOPE_MEMORY_CASES=all` adds longer cases.

use needlescope_testkit::engine as engine_support;

use engine_support::tokens;
use needlescope::backend::gpu::emu::MemoryStats;
use needlescope::backend::gpu::switches::DEFAULT_POOL_BYTES;
use needlescope::backend::gpu::{EmuBackend, EmuExecutor, GemmType};
use needlescope::checkpoint::{Checkpoint, WeightFormat};
use needlescope::config::ModelConfig;
use needlescope::devices::plan::{plan, DeviceSet, Footprint, FIXED_WORKSPACE, PROBED_LOGIT_ROWS};
use needlescope::model::{LogitsRequest, Model, ModelOptions, NoObserver};
use needlescope::synth::{synth_with_config, SynthOptions};

const MIB: f64 = (1u64 << 20) as f64;

/// Flash's proportions at small dimensions (see the module docs); layers SWA, CSA, HCA, CSA.
fn flash_like() -> ModelConfig {
    let mut c = ModelConfig::flash();
    c.vocab_size = 8192;
    c.hidden_size = 128;
    c.num_hidden_layers = 4;
    c.compress_ratios = vec![0, 4, 128, 4, 0];
    c.num_nextn_predict_layers = 1;
    c.num_hash_layers = 1;
    c.num_attention_heads = 16;
    c.head_dim = 64;
    c.qk_rope_head_dim = 16;
    c.q_lora_rank = 32;
    c.o_groups = 8;
    c.o_lora_rank = 32;
    c.index_n_heads = 16;
    c.index_head_dim = 32;
    c.n_routed_experts = 16;
    c.num_experts_per_tok = 6;
    c.moe_intermediate_size = 64;
    c
}

/// A synthetic checkpoint of `cfg` in `format`, kept alive with its directory.
struct Fixture {
    _dir: tempfile::TempDir,
    ckpt: Checkpoint,
}

fn model(cfg: ModelConfig, format: WeightFormat) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let opts = SynthOptions::new(needlescope::synth::Preset::Tiny, format, dir.path());
    synth_with_config(cfg, &opts).expect("synth writes the checkpoint");
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    Fixture { _dir: dir, ckpt }
}

/// One measured run.
#[derive(Clone, Copy, Debug)]
struct Case {
    context: usize,
    chunk: usize,
    gemm: GemmType,
    attention_gemm: bool,
    moe_batched: bool,
    pooled: bool,
    /// Logits of every position (`trace --positions all`), not only the last 256.
    probe_all: bool,
}

/// What a run measured and what the plan charges.
struct Outcome {
    weights_measured: usize,
    weights_planned: u64,
    /// Peak in use less the weights (pooled bytes not counted).
    peak: usize,
    /// Peak held less the weights (pooled bytes counted).
    peak_held: usize,
    state: u64,
    workspace: u64,
}

fn run(m: &Fixture, case: Case) -> Outcome {
    let cfg = m.ckpt.config().clone();
    let mut exec = EmuExecutor::new(0, 1 << 40);
    if case.pooled {
        exec = exec.with_pool(DEFAULT_POOL_BYTES);
    }
    let backend = EmuBackend::single(exec.with_memory_tracking(true), case.gemm)
        .with_attention_gemm(case.attention_gemm)
        .with_moe_batched(case.moe_batched);
    // No decode budgets: decoded copies off (NEEDLESCOPE_DECODE_CACHE_MIB=0).
    let opts = ModelOptions {
        chunk: case.chunk,
        ..ModelOptions::default()
    };
    let engine = Model::load_with(backend, &m.ckpt, opts).unwrap();
    let dev = &engine.backend().devices()[0];
    let loaded: MemoryStats = dev.memory_stats();
    dev.reset_peaks();
    // The last device keeps the logits of up to PROBED_LOGIT_ROWS probed positions: probe the
    // last 256 (all in the last chunk when it is that long).
    // With `probe_all`, every position: the engine computes them a group of
    // PROBED_LOGIT_ROWS at a time, within the same charge.
    let first = if case.probe_all {
        0
    } else {
        case.context.saturating_sub(256)
    };
    let probed: Vec<usize> = (first..case.context).collect();
    let mut seq = engine.new_sequence();
    let toks = tokens(case.context, cfg.vocab_size, 0);
    let out = engine
        .forward(
            &mut seq,
            &toks,
            &mut NoObserver,
            LogitsRequest::Positions(probed.clone()),
        )
        .unwrap();
    assert_eq!(out.logits.len(), probed.len());
    assert!(out
        .logits
        .iter()
        .all(|(_, l)| l.iter().all(|v| v.is_finite())));
    let s = dev.memory_stats();
    let fp = Footprint::of_checkpoint(&m.ckpt);
    let devices: DeviceSet = "1x1T".parse().unwrap();
    let p = plan(&cfg, &fp, &devices, case.context, case.chunk);
    let d = &p.devices[0];
    Outcome {
        weights_measured: loaded.in_use,
        weights_planned: d.weights,
        peak: s.peak_in_use - loaded.in_use,
        peak_held: s.peak_held.saturating_sub(loaded.in_use),
        state: d.state,
        workspace: d.workspace,
    }
}

fn check(name: &str, m: &Fixture, cases: &[Case]) {
    let mut failures = Vec::new();
    for &case in cases {
        let t0 = std::time::Instant::now();
        let o = run(m, case);
        let planned = o.state + o.workspace - FIXED_WORKSPACE;
        println!(
            "{name:<10} ctx {:>6} chunk {:>5} {:?}{}{}{}{} | weights {:>8.2} MiB (plan {:>8.2}) | \
             non-weight peak in use {:>8.2} MiB, held {:>8.2} MiB | plan state {:>8.2} + \
             workspace {:>8.2} (less fixed) = {:>8.2} MiB | x{:.2} | {:.1}s",
            case.context,
            case.chunk,
            case.gemm,
            if case.attention_gemm {
                " attn-gemm"
            } else {
                ""
            },
            if case.moe_batched { " moe-batched" } else { "" },
            if case.pooled { " pooled" } else { "" },
            if case.probe_all { " all-logits" } else { "" },
            o.weights_measured as f64 / MIB,
            o.weights_planned as f64 / MIB,
            o.peak as f64 / MIB,
            o.peak_held as f64 / MIB,
            o.state as f64 / MIB,
            (o.workspace - FIXED_WORKSPACE) as f64 / MIB,
            planned as f64 / MIB,
            planned as f64 / o.peak.max(1) as f64,
            t0.elapsed().as_secs_f64(),
        );
        if (o.peak as u64) > planned {
            failures.push(format!(
                "{name} {case:?}: measured {} > planned {planned}",
                o.peak
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

fn all() -> bool {
    std::env::var("NEEDLESCOPE_MEMORY_CASES").is_ok_and(|v| v == "all")
}

const fn case(context: usize, chunk: usize, gemm: GemmType) -> Case {
    Case {
        context,
        chunk,
        gemm,
        attention_gemm: false,
        moe_batched: false,
        pooled: true,
        probe_all: false,
    }
}

#[test]
fn the_plan_bounds_the_tiny_models_peaks() {
    let m = model(ModelConfig::tiny(), WeightFormat::Official);
    let mut cases = vec![
        case(300, 64, GemmType::F32),
        case(1024, 256, GemmType::Bf16),
        Case {
            pooled: false,
            ..case(1024, 256, GemmType::Bf16)
        },
        Case {
            attention_gemm: true,
            ..case(1024, 1024, GemmType::Bf16)
        },
        case(2048, 512, GemmType::F32),
    ];
    if all() {
        cases.push(case(4096, 4096, GemmType::Bf16));
    }
    check("tiny", &m, &cases);
    // Batched routed experts need resident weights: bf16 stored, bf16 GEMMs.
    let m = model(ModelConfig::tiny(), WeightFormat::Bf16);
    check(
        "tiny-bf16",
        &m,
        &[
            Case {
                moe_batched: true,
                ..case(1024, 256, GemmType::Bf16)
            },
            Case {
                moe_batched: true,
                attention_gemm: true,
                ..case(2048, 2048, GemmType::Bf16)
            },
        ],
    );
}

#[test]
fn the_plan_bounds_the_flash_like_models_peaks() {
    let m = model(flash_like(), WeightFormat::Official);
    let mut cases = vec![
        case(2048, 512, GemmType::Bf16),
        case(4096, 1024, GemmType::Bf16),
        Case {
            attention_gemm: true,
            ..case(4096, 2048, GemmType::Bf16)
        },
    ];
    if all() {
        cases.push(case(8192, 2048, GemmType::Bf16));
        cases.push(case(8192, 8192, GemmType::F32));
    }
    check("flash-like", &m, &cases);
    let m = model(flash_like(), WeightFormat::Bf16);
    check(
        "flash-bf16",
        &m,
        &[Case {
            moe_batched: true,
            attention_gemm: true,
            ..case(4096, 2048, GemmType::Bf16)
        }],
    );
}

/// Logits of every position of a chunk (`trace --positions all`) are computed a group of
/// `PROBED_LOGIT_ROWS` (1,024) at a time, the rows the plan charges: probing all 2,048
/// positions of one chunk peaks less than one group above probing the last 256 (at once they
/// would add 1,792 rows of tiny's 4,096 logits, 28 MiB; at Flash's vocabulary and chunk 8,192,
/// 3.9 GiB).
#[test]
fn logits_of_every_position_are_computed_in_groups_the_plan_charges() {
    let m = model(ModelConfig::tiny(), WeightFormat::Official);
    let last = run(&m, case(2048, 2048, GemmType::F32));
    let every = run(
        &m,
        Case {
            probe_all: true,
            ..case(2048, 2048, GemmType::F32)
        },
    );
    let vocab = m.ckpt.config().vocab_size;
    let one_group = PROBED_LOGIT_ROWS as usize * vocab * 4;
    assert!(
        every.peak < last.peak + one_group,
        "all positions peak at {} bytes, the last 256 at {}: a group of logits or more apart",
        every.peak,
        last.peak
    );
}

/// `bench` reports each length's own device-memory peak: `time_prefill` restarts the peaks, so
/// a short prefill after a long one peaks lower (without the restart it would report the long
/// one's peak again), and higher than what the weights alone hold.
#[test]
fn each_timed_prefill_reports_its_own_memory_peak() {
    use needlescope::backend::Backend;
    use needlescope::model::bench::time_prefill;
    let m = model(ModelConfig::tiny(), WeightFormat::Official);
    let exec = EmuExecutor::new(0, 1 << 40).with_pool(DEFAULT_POOL_BYTES);
    let backend = EmuBackend::single(exec.with_memory_tracking(true), GemmType::F32);
    let opts = ModelOptions {
        chunk: 1024,
        ..ModelOptions::default()
    };
    let engine = Model::load_with(backend, &m.ckpt, opts).unwrap();
    let weights = engine.backend().device_memory()[0].memory.in_use;
    let vocab = m.ckpt.config().vocab_size;
    let long = time_prefill(&engine, &tokens(1024, vocab, 1)).unwrap();
    let short = time_prefill(&engine, &tokens(64, vocab, 2)).unwrap();
    let (long, short) = (
        long.device_memory[0].memory.peak_in_use,
        short.device_memory[0].memory.peak_in_use,
    );
    assert!(short > weights, "short {short}, weights {weights}");
    assert!(short < long, "short {short} not below long {long}");
}

/// On a pooled device a decoded copy takes its buffer's size class, and that is what the copy
/// budget charges, so the budget bounds the device memory copies really hold and `bench` can
/// take them off the executor's count. Experts of 34 x 64 (8,704 bytes in f32, class 9,216):
/// the same forward makes the same copies pooled and unpooled, charged more when pooled (their
/// classes, at most an eighth more than their bytes).
#[test]
fn a_pooled_device_charges_each_decoded_copy_its_allocation_class() {
    let mut cfg = ModelConfig::tiny();
    cfg.moe_intermediate_size = 34;
    let m = model(cfg, WeightFormat::Bf16);
    let charged = |pooled: bool| {
        let mut exec = EmuExecutor::new(0, 1 << 40);
        if pooled {
            exec = exec.with_pool(DEFAULT_POOL_BYTES);
        }
        let b = EmuBackend::single(exec, GemmType::F32).with_decode_budgets(&[1 << 30]);
        let engine = Model::load_with(b, &m.ckpt, ModelOptions::default()).unwrap();
        let mut seq = engine.new_sequence();
        let toks = tokens(64, m.ckpt.config().vocab_size, 0);
        engine
            .forward(&mut seq, &toks, &mut NoObserver, LogitsRequest::Last)
            .unwrap();
        let (_, used, _, copies) = engine.backend().decode_cache_use()[0].clone();
        (used, copies)
    };
    let (exact, copies) = charged(false);
    let (classes, pooled_copies) = charged(true);
    assert!(copies > 0);
    assert_eq!(copies, pooled_copies, "the same copies");
    assert!(
        exact < classes && classes <= exact + exact / 8,
        "pooled {classes}, unpooled {exact}"
    );
}
