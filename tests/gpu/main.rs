//! GPU parity (ignored by default: needs a CUDA 13 driver, a GPU and libcublas / libnvrtc 13 on
//! the library path). Every op of the CUDA backend against the CPU reference at DeepSeek-V4-Flash
//! dimensions, then whole forwards on `tiny` and on `synth --preset flash --layers 4 --experts
//! 16` (official FP8 + FP4), several profiles and chunk sizes, both GEMM precisions.
//!
//! Run: `cargo test --release --test gpu -- --ignored --nocapture --test-threads 1`
//! (scripts/gpu-check.sh does this and prints the tables).

use needlescope_testkit::engine as engine_support;

use engine_support::{synth_model, tokens};
use needlescope::backend::gpu::{CudaBackend, CudaExecutor, GemmType};
use needlescope::backend::parity::ops::{check_ops, OpDims};
use needlescope::backend::parity::{table, Check};
use needlescope::checkpoint::WeightFormat;
use needlescope::model::{Model, ModelOptions};
use needlescope::numerics::profiles::{IndexProfile, KvMode};
use needlescope::run::parity::{check_forward, ForwardCase, ForwardTolerance};
use needlescope::synth::Preset;

fn gpu(gemm: GemmType) -> CudaBackend {
    CudaBackend::single(CudaExecutor::new(0).expect("GPU 0 opens"), gemm)
}

fn report(name: &str, checks: &[Check]) {
    let t = table(checks);
    println!("== {name}\n{t}");
    assert!(!checks.is_empty());
    assert!(
        checks.iter().all(Check::passed),
        "{name}: parity failures:\n{t}"
    );
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-check.sh"]
fn cuda_ops_match_the_cpu_at_flash_dims() {
    report(
        "ops, f32 GEMMs",
        &check_ops(&gpu(GemmType::F32), &OpDims::flash(), 11, 1e-5),
    );
    report(
        "ops, bf16 GEMMs",
        &check_ops(&gpu(GemmType::Bf16), &OpDims::flash(), 12, 2e-2),
    );
}

fn cases() -> Vec<ForwardCase> {
    let mut v = Vec::new();
    for (profile, kv) in [
        (IndexProfile::Exact, KvMode::Exact),
        (IndexProfile::SglangFp8, KvMode::Fp8),
        (IndexProfile::OfficialFp4, KvMode::Exact),
        (IndexProfile::SglangBf16Keys, KvMode::Exact),
    ] {
        for chunk in [64, 1000] {
            v.push(ForwardCase { profile, kv, chunk });
        }
    }
    v
}

/// Whole forwards with decoded weight copies, as the CLI runs them. bf16 GEMMs: checked end to
/// end only through the first CSA layer (a model cut after it),
/// because bf16 activation rounding flips MoE routing on the untrained synthetic weights
/// further down (see tests/backend/emu_parity.rs); f32 GEMMs on the full model.
#[allow(clippy::too_many_arguments)]
fn forward(
    preset: Preset,
    format: WeightFormat,
    layers: usize,
    bf16_layers: usize,
    experts: Option<usize>,
    n: usize,
    cases: &[ForwardCase],
    moe_batched: bool,
) {
    // Open the GPU first: without one, fail before writing a checkpoint.
    drop(gpu(GemmType::F32));
    for (gemm, tol, layers) in [
        (GemmType::F32, ForwardTolerance::F32, layers),
        (GemmType::Bf16, ForwardTolerance::BF16, bf16_layers),
    ] {
        let m = synth_model(preset, format, Some(layers), experts);
        let opts = ModelOptions {
            topk: Some(64),
            ..ModelOptions::default()
        };
        let mut cpu = Model::load(&m.ckpt, opts.clone()).expect("CPU engine");
        let toks = tokens(n, m.ckpt.config().vocab_size, 3);
        // As the CLI runs it: decoded weight copies kept (the op checks above take the banded
        // path, which the copies must equal).
        let b = gpu(gemm)
            .with_decode_budgets(&[8 << 30])
            .with_moe_batched(moe_batched);
        let mut g = Model::load_with(b, &m.ckpt, opts.clone()).expect("GPU engine");
        let checks = check_forward(&mut g, &mut cpu, &toks, cases, tol).expect("forwards");
        report(
            &format!(
                "{preset:?} {format:?} {layers} layers, {gemm:?} GEMMs, batched MoE {moe_batched}"
            ),
            &checks,
        );
        if moe_batched {
            assert!(
                g.backend().moe_batched_calls() > 0,
                "no MoE call ran batched"
            );
            // A batch with a misaligned matrix falls back to one GEMM per expert: the check
            // must see cublasGemmBatchedEx itself run.
            let calls: u64 = g
                .backend()
                .devices()
                .iter()
                .map(|d| d.batched_gemm_calls())
                .sum();
            assert!(calls > 0, "no cublasGemmBatchedEx call was made");
            eprintln!("cublasGemmBatchedEx calls: {calls}");
        }
    }
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-check.sh"]
fn cuda_forward_matches_the_cpu_on_tiny() {
    forward(
        Preset::Tiny,
        WeightFormat::Official,
        4,
        2,
        None,
        1500,
        &cases(),
        false,
    );
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-check.sh"]
fn cuda_forward_matches_the_cpu_on_flash_four_layers() {
    // Fewer cases: the CPU reference at Flash dims is the slow side. Flash layers 0-1 are SWA,
    // layer 2 the first CSA.
    let few: Vec<ForwardCase> = cases().into_iter().step_by(3).collect();
    forward(
        Preset::Flash,
        WeightFormat::Official,
        4,
        3,
        Some(16),
        300,
        &few,
        false,
    );
}

/// Routed experts as batched cuBLAS GEMMs over their decoded copies (`NEEDLESCOPE_MOE=batched`,
/// `cublasGemmBatchedEx`; off by default until this has passed on a GPU): forwards on tiny.
#[test]
#[ignore = "needs a GPU: scripts/gpu-check.sh"]
fn cuda_batched_experts_match_the_cpu() {
    forward(
        Preset::Tiny,
        WeightFormat::Official,
        4,
        2,
        None,
        1500,
        &cases(),
        true,
    );
}

/// Sparse attention as batched cuBLAS GEMMs (`NEEDLESCOPE_ATTENTION=gemm`, off by default until
/// this has passed on a GPU): every op at Flash dims, then the tiny forwards, f32 GEMMs.
#[test]
#[ignore = "needs a GPU: scripts/gpu-check.sh"]
fn cuda_attention_by_gemm_matches_the_cpu() {
    let g = || gpu(GemmType::F32).with_attention_gemm(true);
    report(
        "ops, f32 GEMMs, attention by GEMM",
        &check_ops(&g(), &OpDims::flash(), 13, 1e-5),
    );
    let m = synth_model(Preset::Tiny, WeightFormat::Official, Some(4), None);
    let opts = ModelOptions {
        topk: Some(64),
        ..ModelOptions::default()
    };
    let mut cpu = Model::load(&m.ckpt, opts.clone()).expect("CPU engine");
    let toks = tokens(1500, m.ckpt.config().vocab_size, 3);
    let mut e = Model::load_with(g(), &m.ckpt, opts).expect("GPU engine");
    let checks =
        check_forward(&mut e, &mut cpu, &toks, &cases(), ForwardTolerance::F32).expect("forwards");
    report("Tiny Official 4 layers, attention by GEMM", &checks);
}
