//! Combinations the GPU backend supports that `tests/backend/emu_parity.rs` leaves out, on the host
//! emulator against the CPU reference (`run::parity`, same thresholds): every
//! index profile under both KV modes as the driving profile, the NVIDIA NVFP4 checkpoint,
//! chunks of 1 and chunks shorter than the compress ratio or not dividing the prompt, prompts
//! too short for a compressed row (HCA with none), decode steps on the prefill's sequence
//! state (across compress-ratio, window and HCA boundaries), top-k past every visible row,
//! layers split over two and three emulated devices at each layer kind, and the opt-in GEMM
//! attention and batched experts combined with each of these.

use needlescope_testkit::engine as engine_support;

use engine_support::{synth_model, SynthModel};
use needlescope::backend::gpu::{EmuBackend, EmuExecutor, GemmType, GpuBackend};
use needlescope::backend::parity::{table, Check};
use needlescope::checkpoint::WeightFormat;
use needlescope::model::{Model, ModelOptions};
use needlescope::numerics::profiles::{IndexProfile, KvMode};
use needlescope::run::parity::{check_forward_decode, ForwardCase, ForwardTolerance};
use needlescope::synth::Preset;
use std::sync::OnceLock;

/// The tiny official (FP8 + FP4) model: SWA, CSA (ratio 4), HCA (ratio 128), CSA; window 128.
fn official() -> &'static SynthModel {
    static M: OnceLock<SynthModel> = OnceLock::new();
    M.get_or_init(|| synth_model(Preset::Tiny, WeightFormat::Official, Some(4), Some(8)))
}

/// Token ids without the zero id (never zeros as inputs).
fn tokens(n: usize, seed: u64) -> Vec<u32> {
    engine_support::tokens(n, 4095, seed)
        .into_iter()
        .map(|t| t + 1)
        .collect()
}

fn single() -> EmuBackend {
    EmuBackend::single(EmuExecutor::default(), GemmType::F32)
}

/// Both opt-in fast paths on (GEMM attention with one query a tile, batched experts over
/// decoded copies), as `NEEDLESCOPE_ATTENTION=gemm NEEDLESCOPE_MOE=batched` on the CLI.
fn fast(b: EmuBackend) -> EmuBackend {
    let n = b.devices().len();
    b.with_attention_gemm(true)
        .with_attention_tile_bytes(1)
        .with_decode_budgets(&vec![1 << 32; n])
        .with_moe_batched(true)
}

fn split(layer_device: &[usize]) -> EmuBackend {
    let n = layer_device.iter().max().unwrap() + 1;
    let devices = (0..n).map(|i| EmuExecutor::new(i, 1 << 34)).collect();
    GpuBackend::new(devices, layer_device.to_vec(), GemmType::F32)
}

/// Runs `cases` on `toks` (the last `steps` tokens decoded one call each) on `backend` and on
/// the CPU, asserting every check; returns the checks.
fn parity(
    m: &SynthModel,
    backend: EmuBackend,
    topk: usize,
    toks: &[u32],
    steps: usize,
    cases: &[ForwardCase],
    tol: ForwardTolerance,
) -> Vec<Check> {
    let opts = ModelOptions {
        topk: Some(topk),
        ..ModelOptions::default()
    };
    let mut gpu = Model::load_with(backend, &m.ckpt, opts.clone()).expect("emulated engine");
    let mut cpu = Model::load(&m.ckpt, opts).expect("CPU engine");
    let checks =
        check_forward_decode(&mut gpu, &mut cpu, toks, steps, cases, tol).expect("forwards run");
    let t = table(&checks);
    eprintln!("{t}");
    assert!(!checks.is_empty());
    assert!(checks.iter().all(Check::passed), "parity failures:\n{t}");
    assert!(needlescope::backend::Backend::take_error(gpu.backend()).is_none());
    checks
}

fn case(profile: IndexProfile, kv: KvMode, chunk: usize) -> ForwardCase {
    ForwardCase { profile, kv, chunk }
}

fn index_checked(checks: &[Check]) -> bool {
    checks.iter().any(|c| c.what.contains("index scores"))
}

/// Every index profile drives the forward under both KV modes (the existing parity tests drive
/// with exact, fp8 and official-fp4 only), with a chunk that does not divide the prompt.
#[test]
fn every_index_profile_under_both_kv_modes_drives_like_the_cpu() {
    let toks = tokens(150, 11);
    let mut cases = Vec::new();
    for (i, p) in IndexProfile::ALL.into_iter().enumerate() {
        let kv = if i % 2 == 0 {
            KvMode::Fp8
        } else {
            KvMode::Exact
        };
        cases.push(case(p, kv, 61));
        let other = if kv == KvMode::Fp8 {
            KvMode::Exact
        } else {
            KvMode::Fp8
        };
        cases.push(case(p, other, 150));
    }
    let checks = parity(
        official(),
        single(),
        16,
        &toks,
        0,
        &cases,
        ForwardTolerance::F32,
    );
    assert!(index_checked(&checks));
}

/// Chunks of 1, 2 and 3 tokens (shorter than the CSA compress ratio of 4: a compressed row is
/// completed across calls), 5 (not dividing anything) and 129 (past the window of 128).
#[test]
fn chunks_shorter_than_the_compress_ratio_match_the_cpu() {
    let toks = tokens(136, 12);
    let cases = [
        case(IndexProfile::Exact, KvMode::Exact, 1),
        case(IndexProfile::SglangFp8, KvMode::Fp8, 2),
        case(IndexProfile::OfficialFp4, KvMode::Exact, 3),
        case(IndexProfile::Exact, KvMode::Exact, 5),
        case(IndexProfile::VllmFp8, KvMode::Fp8, 129),
    ];
    let checks = parity(
        official(),
        single(),
        16,
        &toks,
        0,
        &cases,
        ForwardTolerance::F32,
    );
    assert!(index_checked(&checks));
}

/// Prompts of 1 to 9 tokens (no complete compressed row before 4: empty CSA key caches; HCA
/// has no row below 128 tokens) and around the HCA ratio (127, 128, 129).
#[test]
fn prompts_too_short_for_a_compressed_row_match_the_cpu() {
    for n in [1usize, 2, 3, 4, 5, 7, 8, 9, 127, 128, 129] {
        let toks = tokens(n, 13 + n as u64);
        let cases = [
            case(IndexProfile::Exact, KvMode::Exact, 256),
            case(IndexProfile::SglangFp8, KvMode::Fp8, 3),
        ];
        eprintln!("== {n} tokens");
        parity(
            official(),
            single(),
            8,
            &toks,
            0,
            &cases,
            ForwardTolerance::F32,
        );
    }
}

/// Decode steps after a prefill: across CSA row boundaries (every 4), the window's first
/// eviction (128) and the first HCA row (128), starting from prefills of 1, 2 and 125 tokens.
#[test]
fn decode_steps_match_the_cpu() {
    for (n, steps) in [(10usize, 9usize), (133, 8), (3, 2)] {
        let toks = tokens(n, 21 + n as u64);
        let cases = [
            case(IndexProfile::Exact, KvMode::Exact, 64),
            case(IndexProfile::SglangFp8, KvMode::Fp8, 7),
            case(IndexProfile::SglangFp4, KvMode::Exact, 200),
        ];
        eprintln!("== {n} tokens, last {steps} decoded");
        parity(
            official(),
            single(),
            8,
            &toks,
            steps,
            &cases,
            ForwardTolerance::F32,
        );
    }
}

/// Top-k far past every visible row (512 on at most 40 CSA rows): every row selected, padded.
#[test]
fn topk_past_every_visible_row_matches_the_cpu() {
    let toks = tokens(160, 31);
    let cases = [
        case(IndexProfile::Exact, KvMode::Exact, 64),
        case(IndexProfile::OfficialFp4, KvMode::Fp8, 33),
    ];
    parity(
        official(),
        single(),
        512,
        &toks,
        4,
        &cases,
        ForwardTolerance::F32,
    );
}

/// Layers split over two and three emulated devices with a boundary before each layer kind
/// (CSA, HCA, CSA after HCA), prefill and decode.
#[test]
fn splits_over_two_and_three_devices_match_the_cpu() {
    let toks = tokens(140, 41);
    let cases = [
        case(IndexProfile::SglangFp8, KvMode::Fp8, 50),
        case(IndexProfile::Exact, KvMode::Exact, 3),
    ];
    for ld in [
        &[0usize, 1, 1, 1][..],
        &[0, 0, 1, 1],
        &[0, 0, 0, 1],
        &[0, 1, 2, 2],
        &[0, 0, 1, 2],
    ] {
        eprintln!("== layers on devices {ld:?}");
        parity(
            official(),
            split(ld),
            16,
            &toks,
            3,
            &cases,
            ForwardTolerance::F32,
        );
    }
}

/// The NVIDIA NVFP4 checkpoint (FP4 with e4m3 1x16 scales and a global scale) end to end.
#[test]
fn nvfp4_checkpoint_matches_the_cpu() {
    let m = synth_model(Preset::Tiny, WeightFormat::Nvfp4, Some(4), Some(8));
    let toks = tokens(150, 51);
    let cases = [
        case(IndexProfile::Exact, KvMode::Exact, 64),
        case(IndexProfile::SglangFp8, KvMode::Fp8, 7),
    ];
    parity(&m, single(), 16, &toks, 2, &cases, ForwardTolerance::F32);
    parity(
        &m,
        fast(single()),
        16,
        &toks,
        2,
        &cases,
        ForwardTolerance::F32,
    );
}

/// Both opt-in fast paths with every combination above: chunk 1, short prompts, decode steps,
/// top-k past the rows, two and three devices, every profile.
#[test]
fn opt_in_fast_paths_match_the_cpu_in_every_combination() {
    let m = official();
    let toks = tokens(136, 61);
    let mut cases = vec![
        case(IndexProfile::Exact, KvMode::Exact, 1),
        case(IndexProfile::OfficialFp4, KvMode::Fp8, 3),
    ];
    for p in IndexProfile::ALL {
        cases.push(case(p, KvMode::Fp8, 61));
    }
    parity(
        m,
        fast(single()),
        16,
        &toks,
        5,
        &cases,
        ForwardTolerance::F32,
    );
    for n in [1usize, 3, 5] {
        let toks = tokens(n, 62);
        let cases = [case(IndexProfile::SglangFp8, KvMode::Fp8, 2)];
        parity(
            m,
            fast(single()),
            8,
            &toks,
            n / 2,
            &cases,
            ForwardTolerance::F32,
        );
    }
    let cases = [case(IndexProfile::Exact, KvMode::Exact, 40)];
    parity(
        m,
        fast(single()),
        512,
        &toks,
        3,
        &cases,
        ForwardTolerance::F32,
    );
    for ld in [&[0usize, 1, 1, 1][..], &[0, 1, 2, 2], &[0, 0, 1, 2]] {
        parity(
            m,
            fast(split(ld)),
            16,
            &toks,
            3,
            &cases,
            ForwardTolerance::F32,
        );
    }
}

/// bf16 GEMMs on bf16 weights (read in place, no dequantisation) through the first CSA layer,
/// with decode steps, chunk 1 and a fp4 profile.
#[test]
fn bf16_gemms_on_bf16_weights_stay_close_through_the_first_csa_layer() {
    let m = synth_model(Preset::Tiny, WeightFormat::Bf16, Some(2), Some(8));
    let toks = tokens(120, 71);
    let cases = [
        case(IndexProfile::Exact, KvMode::Exact, 1),
        case(IndexProfile::OfficialFp4, KvMode::Fp8, 50),
    ];
    let b = EmuBackend::single(EmuExecutor::default(), GemmType::Bf16);
    parity(&m, b, 16, &toks, 3, &cases, ForwardTolerance::BF16);
}

/// Under fp8 KV the reference replays the tested engine's main KV rows before their e4m3
/// rounding (`Observer::replace_kv_input`). On these ids (those of the CLI traces in
/// tests/cli/emu_combos.rs) the GEMM attention's other summation order flips one e4m3 code of a
/// window KV element of the HCA layer, which every later position attends to; without the
/// replay the logits then differ by about 1.3e-2, with it they hold to the exact-KV bound.
#[test]
fn fp8_kv_rounding_flips_are_replayed_so_logits_hold_to_the_exact_kv_bound() {
    static M: OnceLock<SynthModel> = OnceLock::new();
    let m = M.get_or_init(|| synth_model(Preset::Tiny, WeightFormat::Official, None, None));
    let toks: Vec<u32> = (0..170u32).map(|i| (i * 37) % 4000 + 3).collect();
    let cases = [case(IndexProfile::SglangFp8, KvMode::Fp8, 3)];
    let checks = parity(
        m,
        fast(single()),
        64,
        &toks,
        0,
        &cases,
        ForwardTolerance::F32,
    );
    let kv = checks
        .iter()
        .find(|c| c.what.starts_with("KV rows before fp8 rounding"))
        .expect("a KV replay check");
    assert!(
        kv.error > 0.0,
        "the engines' KV rows should differ: {}",
        kv.what
    );
}
