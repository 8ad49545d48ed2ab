//! Decoded weight copies (`backend::gpu::matrix`) on the host emulator: a product with a copy
//! gives the banded path's result bit for bit in every stored format and GEMM type, the copy is
//! made once (later products launch no dequantisation), weights stored in the GEMM's own type
//! are read in place with no copy, the budget is never exceeded (what does not fit keeps the
//! banded path) and is given back with the weights, and whole forwards with copies (routed
//! experts expert by expert or as batched GEMMs) match the CPU reference.

use needlescope_testkit::engine as engine_support;

use engine_support::{synth_model, tokens};
use needlescope::backend::gpu::{EmuBackend, EmuExecutor, GemmType};
use needlescope::backend::parity::{table, Check};
use needlescope::backend::{Backend, HostOps};
use needlescope::checkpoint::linear::{LinearForm, SharedLinear};
use needlescope::checkpoint::{Checkpoint, WeightFormat};
use needlescope::model::{Model, ModelOptions};
use needlescope::numerics::profiles::{IndexProfile, KvMode};
use needlescope::numerics::rng::Rng;
use needlescope::run::parity::{check_forward, ForwardCase, ForwardTolerance};
use needlescope::synth::Preset;

/// Every linear weight of the checkpoint that loads (FP4 packs two values a byte: the logical
/// input is then twice the stored width).
fn all_linears(ckpt: &Checkpoint) -> Vec<SharedLinear> {
    let mut names: Vec<String> = ckpt
        .names()
        .filter(|n| n.ends_with(".weight"))
        .map(str::to_string)
        .collect();
    names.sort();
    names
        .iter()
        .filter_map(|n| {
            let info = ckpt.info(n)?;
            let [out, input] = info.shape[..] else {
                return None;
            };
            let module = n.trim_end_matches(".weight");
            [input, 2 * input]
                .into_iter()
                .find_map(|i| ckpt.shared_linear(module, out, i).ok())
        })
        .collect()
}

fn launches(b: &EmuBackend, prefix: &str) -> u64 {
    b.op_profile()
        .iter()
        .filter(|r| r.op.starts_with(prefix))
        .map(|r| r.calls)
        .sum()
}

fn profiled(gemm: GemmType) -> EmuBackend {
    EmuBackend::single(EmuExecutor::default().with_profile(true), gemm)
}

fn stored_in(form: LinearForm, gemm: GemmType) -> bool {
    matches!(
        (form, gemm),
        (LinearForm::Bf16, GemmType::Bf16) | (LinearForm::F32, GemmType::F32)
    )
}

#[test]
fn copies_give_the_banded_products_bit_for_bit_and_are_made_once() {
    for format in [WeightFormat::Official, WeightFormat::Nvfp4] {
        let m = synth_model(Preset::Tiny, format, Some(2), Some(4));
        let weights = all_linears(&m.ckpt);
        assert!(weights.len() > 10, "{format:?}: {} linears", weights.len());
        for gemm in [GemmType::F32, GemmType::Bf16] {
            let banded = profiled(gemm);
            let copying = profiled(gemm).with_decode_budgets(&[1 << 30]);
            let mut expected_bytes = 0;
            let mut copied = 0;
            // Every weight stays alive so that the budget's account can be checked at the end.
            let mut held = Vec::new();
            for (i, w) in weights.iter().enumerate() {
                let (out, input) = (w.rows(), w.cols());
                let x = Rng::new(i as u64 + 3).values(3 * input, 1.0);
                let wb = banded.upload_linear(w.clone()).unwrap();
                let wc = copying.upload_linear(w.clone()).unwrap();
                let mut want = vec![0f32; 3 * out];
                banded.matmul_host(&x, &wb, &mut want);
                let before = launches(&copying, "dequant_");
                for pass in 0..2 {
                    let mut got = vec![0f32; 3 * out];
                    copying.matmul_host(&x, &wc, &mut got);
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{format:?} {gemm:?} {} pass {pass}", w.module());
                }
                let decodes = launches(&copying, "dequant_") - before;
                // Grouped products read row ranges of the copy at an offset.
                if out % 2 == 0 {
                    let xg = Rng::new(i as u64 + 5).values(3 * 2 * input, 1.0);
                    let (mut a, mut b) = (vec![0f32; 3 * out], vec![0f32; 3 * out]);
                    banded.matmul_grouped_host(&xg, 2, &wb, &mut a);
                    copying.matmul_grouped_host(&xg, 2, &wc, &mut b);
                    let same = a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits());
                    assert!(same, "{format:?} {gemm:?} {} grouped", w.module());
                }
                if stored_in(wc.form, gemm) {
                    assert_eq!(decodes, 0, "{}: read in place", w.module());
                    assert!(!wc.decode.is_resident(), "{}: no copy needed", w.module());
                } else {
                    assert_eq!(decodes, 1, "{}: decoded once for both products", w.module());
                    assert!(wc.decode.is_resident(), "{}", w.module());
                    expected_bytes += out * input * gemm_bytes(gemm);
                    copied += 1;
                }
                held.push((wb, wc));
            }
            assert!(copied > 0, "{format:?} {gemm:?}: nothing was copied");
            let use_ = copying.decode_cache_use();
            assert_eq!(use_.len(), 1);
            let (_, used, limit, copies) = &use_[0];
            assert_eq!(
                (*used, *copies),
                (expected_bytes, copied),
                "{format:?} {gemm:?}"
            );
            assert_eq!(*limit, 1 << 30);
            assert!(banded.take_error().is_none() && copying.take_error().is_none());
        }
    }
}

fn gemm_bytes(g: GemmType) -> usize {
    match g {
        GemmType::F32 => 4,
        GemmType::Bf16 => 2,
    }
}

#[test]
fn the_budget_is_never_exceeded_and_comes_back_with_the_weights() {
    let m = synth_model(Preset::Tiny, WeightFormat::Official, Some(2), Some(4));
    let weights = all_linears(&m.ckpt);
    let sizes: Vec<usize> = weights.iter().map(|w| w.rows() * w.cols() * 4).collect();
    // Room for about a third of the copies.
    let limit = sizes.iter().sum::<usize>() / 3;
    let b = EmuBackend::single(EmuExecutor::default(), GemmType::F32).with_decode_budgets(&[limit]);
    let reference = EmuBackend::single(EmuExecutor::default(), GemmType::F32);
    let mut held = Vec::new();
    let (mut resident, mut banded) = (0, 0);
    for (i, w) in weights.iter().enumerate() {
        let x = Rng::new(i as u64 + 11).values(2 * w.cols(), 1.0);
        let wg = b.upload_linear(w.clone()).unwrap();
        let wr = reference.upload_linear(w.clone()).unwrap();
        let (mut got, mut want) = (vec![0f32; 2 * w.rows()], vec![0f32; 2 * w.rows()]);
        b.matmul_host(&x, &wg, &mut got);
        reference.matmul_host(&x, &wr, &mut want);
        assert_eq!(
            got,
            want,
            "{}: same product with or without a copy",
            w.module()
        );
        let (_, used, _, _) = b.decode_cache_use()[0].clone();
        assert!(used <= limit, "{used} > {limit}");
        if wg.decode.is_resident() {
            resident += 1;
        } else if !matches!(wg.form, LinearForm::F32) {
            banded += 1;
        }
        held.push(wg);
    }
    assert!(
        resident > 0 && banded > 0,
        "{resident} copied, {banded} banded"
    );
    assert!(b.decode_cache_use()[0].1 > 0);
    drop(held);
    assert_eq!(
        (b.decode_cache_use()[0].1, b.decode_cache_use()[0].3),
        (0, 0),
        "dropped weights give their copies' bytes back"
    );
    // A zero budget makes no copies at all.
    let none = EmuBackend::single(EmuExecutor::default(), GemmType::F32).with_decode_budgets(&[0]);
    let w = none.upload_linear(weights[0].clone()).unwrap();
    let mut y = vec![0f32; w.rows];
    none.matmul_host(&vec![1.0; w.cols], &w, &mut y);
    assert!(!w.decode.is_resident() && none.decode_cache_use().is_empty());
}

#[test]
fn a_forward_with_copies_matches_the_cpu_and_decodes_each_weight_once() {
    forward_with_copies(false);
}

/// The same with the routed experts as batched GEMMs over their decoded copies
/// (`NEEDLESCOPE_MOE=batched`).
#[test]
fn a_forward_with_batched_experts_matches_the_cpu() {
    forward_with_copies(true);
}

fn forward_with_copies(moe_batched: bool) {
    let m = synth_model(Preset::Tiny, WeightFormat::Official, Some(4), Some(8));
    let opts = ModelOptions {
        topk: Some(16),
        ..ModelOptions::default()
    };
    let exec = EmuExecutor::default().with_profile(true);
    let b = EmuBackend::single(exec, GemmType::F32)
        .with_decode_budgets(&[1 << 32])
        .with_moe_batched(moe_batched);
    let mut gpu = Model::load_with(b, &m.ckpt, opts.clone()).unwrap();
    let mut cpu = Model::load(&m.ckpt, opts).unwrap();
    let toks = tokens(200, m.ckpt.config().vocab_size, 9);
    let cases: Vec<ForwardCase> = [
        (IndexProfile::Exact, KvMode::Exact, 64),
        (IndexProfile::SglangFp8, KvMode::Fp8, 33),
    ]
    .into_iter()
    .map(|(profile, kv, chunk)| ForwardCase { profile, kv, chunk })
    .collect();
    let checks = check_forward(&mut gpu, &mut cpu, &toks, &cases, ForwardTolerance::F32).unwrap();
    assert!(checks.iter().all(Check::passed), "{}", table(&checks));
    // Many chunks ran; every weight was decoded at most once (row gathers of the embedding
    // decode rows each call, and are not products).
    let (_, _, _, copies) = gpu.backend().decode_cache_use()[0].clone();
    let products = launches(gpu.backend(), "dequant_") - launches(gpu.backend(), "dequant_bf16");
    assert!(copies > 10, "{copies} copies");
    assert!(
        products <= copies as u64,
        "{products} dequant launches for {copies} copies"
    );
    let batched_calls = gpu.backend().moe_batched_calls();
    if moe_batched {
        assert!(batched_calls > 4, "only {batched_calls} batched MoE calls");
    } else {
        assert_eq!(batched_calls, 0);
    }
}

/// A copy the budget allows but the device cannot allocate is not made, and the budget it
/// reserved comes back (else every such failure would shrink the room for later copies).
#[test]
fn a_copy_whose_allocation_fails_gives_its_budget_back() {
    let m = synth_model(Preset::Tiny, WeightFormat::Official, Some(2), Some(4));
    let w = all_linears(&m.ckpt)
        .into_iter()
        .filter(|w| w.view().kind() == "fp8-block")
        .max_by_key(|w| w.rows() * w.cols())
        .expect("an FP8 weight");
    let copy_bytes = w.rows() * w.cols() * 4;
    // Room for the stored bytes (one a value), inputs and outputs; not for an f32 copy.
    let device = EmuExecutor::new(0, 2 * w.rows() * w.cols());
    let b = EmuBackend::single(device, GemmType::F32).with_decode_budgets(&[copy_bytes * 8]);
    let wg = b.upload_linear(w.clone()).unwrap();
    let x = Rng::new(5).values(w.cols(), 1.0);
    let mut y = vec![0f32; w.rows()];
    b.matmul_host(&x, &wg, &mut y);
    // The banded path needs as much room as the copy here, so the product fails too; what
    // matters is the budget.
    let _ = b.take_error();
    assert!(!wg.decode.is_resident());
    let (_, used, _, copies) = b.decode_cache_use()[0].clone();
    assert_eq!(
        (used, copies),
        (0, 0),
        "the failed copy's reservation is released"
    );
}
