//! The executors' buffer pool (`backend::gpu::pool`) on the host emulator: freed buffers are
//! reused by later allocations of their size class and come back zero-filled, pooled bytes still
//! count as used, a full device empties the pool before it reports out of memory, and a whole
//! forward on a pooled executor matches the CPU reference as the unpooled one does.

use needlescope_testkit::engine as engine_support;

use engine_support::{synth_model, tokens};
use needlescope::backend::gpu::executor::{download, upload};
use needlescope::backend::gpu::pool::BufferPool;
use needlescope::backend::gpu::{EmuBackend, EmuExecutor, Executor, GemmType, GpuError};
use needlescope::backend::parity::{table, Check};
use needlescope::checkpoint::WeightFormat;
use needlescope::model::{Model, ModelOptions};
use needlescope::numerics::profiles::{IndexProfile, KvMode};
use needlescope::run::parity::{check_forward, ForwardCase, ForwardTolerance};
use needlescope::synth::Preset;

#[test]
fn a_freed_buffer_is_reused_and_comes_back_zeroed() {
    let e = EmuExecutor::new(0, 1 << 20).with_pool(1 << 16);
    let b = upload(&e, &[7.0f32; 300]).unwrap();
    let class = BufferPool::class(1200);
    assert_eq!(e.used_bytes(), class);
    drop(b);
    // Kept by the pool: still used, as on a device.
    assert_eq!(e.used_bytes(), class);
    // 1100 bytes fall in the same class: the same allocation, zero-filled again.
    let again = e.alloc(1100).unwrap();
    assert_eq!(e.pool_reuses(), 1);
    assert_eq!(e.used_bytes(), class);
    assert_eq!(e.len(&again), 1100);
    let mut back = vec![1.0f32; 275];
    download(&e, &again, &mut back).unwrap();
    assert!(back.iter().all(|&v| v == 0.0), "a reused buffer is zeroed");
    // Another class is a new allocation.
    let other = e.alloc(5000).unwrap();
    assert_eq!(e.pool_reuses(), 1);
    assert_eq!(e.used_bytes(), class + BufferPool::class(5000));
    drop((again, other));
}

#[test]
fn the_pool_keeps_no_more_than_its_limit() {
    let e = EmuExecutor::new(0, 1 << 20).with_pool(4096);
    let a = e.alloc(4096).unwrap();
    let b = e.alloc(4096).unwrap();
    drop(a);
    drop(b); // over the limit: really freed
    assert_eq!(e.used_bytes(), 4096);
}

#[test]
fn a_full_device_empties_the_pool_before_failing() {
    let e = EmuExecutor::new(0, 64 << 10).with_pool(1 << 20);
    let small: Vec<_> = (0..8).map(|_| e.alloc(6 << 10).unwrap()).collect();
    drop(small); // 48 KiB kept
    assert_eq!(e.used_bytes(), 8 * BufferPool::class(6 << 10));
    // 40 KiB fits only once the pool has let go of its buffers.
    let big = e.alloc(40 << 10).expect("the pool is emptied for it");
    assert_eq!(e.used_bytes(), BufferPool::class(40 << 10));
    // Beyond the device it is still a clear out-of-memory error.
    match e.alloc(60 << 10) {
        Err(GpuError::OutOfMemory { bytes, total, .. }) => {
            assert_eq!((bytes, total), (BufferPool::class(60 << 10), 64 << 10))
        }
        other => panic!("expected out of memory, got {:?}", other.map(|_| ())),
    }
    drop(big);
}

#[test]
fn a_forward_on_a_pooled_executor_matches_the_cpu() {
    let m = synth_model(Preset::Tiny, WeightFormat::Official, Some(4), Some(8));
    let opts = ModelOptions {
        topk: Some(16),
        ..ModelOptions::default()
    };
    let b = EmuBackend::single(EmuExecutor::default().with_pool(1 << 30), GemmType::F32);
    let mut gpu = Model::load_with(b, &m.ckpt, opts.clone()).unwrap();
    let mut cpu = Model::load(&m.ckpt, opts).unwrap();
    let toks = tokens(300, m.ckpt.config().vocab_size, 5);
    let cases: Vec<ForwardCase> = [
        (IndexProfile::Exact, KvMode::Exact, 64),
        (IndexProfile::SglangFp8, KvMode::Fp8, 7),
        (IndexProfile::OfficialFp4, KvMode::Exact, 200),
    ]
    .into_iter()
    .map(|(profile, kv, chunk)| ForwardCase { profile, kv, chunk })
    .collect();
    let checks = check_forward(&mut gpu, &mut cpu, &toks, &cases, ForwardTolerance::F32).unwrap();
    let t = table(&checks);
    assert!(checks.iter().all(Check::passed), "{t}");
    let reuses = gpu.backend().devices()[0].pool_reuses();
    assert!(reuses > 1000, "the pool served only {reuses} allocations");
}

/// `alloc_uninit` (no zero fill on a device) is poisoned with NaN on the emulator, so any test
/// path that reads an element it never wrote fails; a reused pooled buffer is poisoned too.
#[test]
fn uninitialised_allocations_read_nan_on_the_emulator() {
    let e = EmuExecutor::new(0, 1 << 20).with_pool(1 << 16);
    for _ in 0..2 {
        let b = e.alloc_uninit(64).unwrap();
        let mut v = vec![0f32; 16];
        download(&e, &b, &mut v).unwrap();
        assert!(v.iter().all(|x| x.is_nan()), "{v:?}");
        let z = e.alloc(64).unwrap();
        download(&e, &z, &mut v).unwrap();
        assert!(v.iter().all(|&x| x == 0.0), "alloc still zero-fills");
    }
    assert!(e.pool_reuses() >= 2);
}
