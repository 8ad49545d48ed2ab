//! Every op of the GPU backend at DeepSeek-V4-Flash's dimensions (`OpDims::flash()`: 64 heads
//! of 512, index heads of 128, 8,192 rows with top-512, 16,384-wide mHC streams, 16 experts of
//! 2,048) on the host emulator against the CPU reference, with the seeds and tolerances of
//! `tests/gpu/main.rs::cuda_ops_match_the_cpu_at_flash_dims` and its attention-by-GEMM
//! check. The small shapes of `tests/backend/emu_parity.rs` do not reach every size-dependent path
//! (16-byte loads over 512-wide rows, split-K mHC products over k = 16,384, the radix top-k
//! over 8,192 rows, tiles of the index-score GEMM, grid-stride loops past one launch's threads),
//! so a kernel or op that goes wrong only at real sizes fails here, on CI, and the one GPU run
//! is left to test only what the emulator cannot: NVRTC's code, cuBLAS and the transport.
//! About 45 s a test on 2 cores, one at a time (each holds about 4 GB of Flash-sized weights
//! and activations: three at once would need over 10 GB).

use needlescope::backend::gpu::{EmuBackend, EmuExecutor, GemmType};
use needlescope::backend::parity::ops::{check_ops, OpDims};
use needlescope::backend::parity::{table, Check};

fn assert_all_pass(what: &str, checks: &[Check]) {
    let t = table(checks);
    eprintln!("{what}:\n{t}");
    assert!(!checks.is_empty());
    assert!(checks.iter().all(Check::passed), "{what}: failures:\n{t}");
}

/// Held by each test while it runs, so that the tests run one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn emu(gemm: GemmType) -> EmuBackend {
    EmuBackend::single(EmuExecutor::default(), gemm)
}

#[test]
fn every_op_matches_the_cpu_at_flash_dims_with_f32_gemms() {
    let _turn = one_at_a_time();
    let b = emu(GemmType::F32);
    assert_all_pass("ops, f32 GEMMs", &check_ops(&b, &OpDims::flash(), 11, 1e-5));
    assert!(needlescope::backend::Backend::take_error(&b).is_none());
}

#[test]
fn every_op_matches_the_cpu_at_flash_dims_with_bf16_gemms() {
    let _turn = one_at_a_time();
    let b = emu(GemmType::Bf16);
    assert_all_pass(
        "ops, bf16 GEMMs",
        &check_ops(&b, &OpDims::flash(), 12, 2e-2),
    );
}

/// The opt-in fast paths together, as `scripts/gpu-check.sh` benches them: attention by GEMM
/// (`NEEDLESCOPE_ATTENTION=gemm`) and routed experts as batched GEMMs (`NEEDLESCOPE_MOE=batched`),
/// which must really have run batched.
#[test]
fn the_fast_paths_match_the_cpu_at_flash_dims() {
    let _turn = one_at_a_time();
    let b = emu(GemmType::F32)
        .with_attention_gemm(true)
        .with_moe_batched(true);
    assert_all_pass(
        "ops, f32 GEMMs, attention by GEMM, batched experts",
        &check_ops(&b, &OpDims::flash(), 13, 1e-5),
    );
    assert!(b.moe_batched_calls() > 0, "the experts ran one by one");
}
