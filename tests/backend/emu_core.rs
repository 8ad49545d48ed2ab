//! The GPU backend's weight path on the host emulator: every stored format (bf16, FP8 block,
//! FP4 group, NVFP4) uploaded as stored, dequantised on the "device" and multiplied, against the
//! CPU reference; gathers (embedding lookups); grouped products; the NaN-and-error contract;
//! activations that grow and drop their front (the caches) with device copies only.

use needlescope_testkit::engine as engine_support;

use engine_support::synth_model;
use needlescope::backend::gpu::{EmuBackend, EmuExecutor, GemmType};
use needlescope::backend::parity::normalised_error;
use needlescope::backend::{Backend, CpuBackend, HostOps};
use needlescope::checkpoint::{Checkpoint, WeightFormat};
use needlescope::numerics::rng::Rng;
use needlescope::synth::Preset;

/// Every linear `module` of the checkpoint with its `[out, in]` shape (2-D `*.weight` tensors).
fn linears(ckpt: &Checkpoint) -> Vec<(String, usize, usize)> {
    let mut v: Vec<(String, usize, usize)> = ckpt
        .names()
        .filter(|n| n.ends_with(".weight"))
        .filter_map(|n| {
            let info = ckpt.info(n)?;
            (info.shape.len() == 2).then(|| {
                (
                    n.trim_end_matches(".weight").to_string(),
                    info.shape[0],
                    info.shape[1],
                )
            })
        })
        .collect();
    v.sort();
    v
}

fn random(n: usize, seed: u64) -> Vec<f32> {
    Rng::new(seed).values(n, 1.0)
}

fn check_format(format: WeightFormat) {
    let m = synth_model(Preset::Tiny, format, Some(2), Some(4));
    let cpu = CpuBackend::new();
    let f32_gpu = EmuBackend::single(EmuExecutor::default(), GemmType::F32);
    let bf16_gpu = EmuBackend::single(EmuExecutor::default(), GemmType::Bf16);
    let mut kinds = std::collections::BTreeSet::new();
    let list = linears(&m.ckpt);
    assert!(!list.is_empty());
    for (i, (module, out, input)) in list.iter().enumerate() {
        // The expert / attention tensors with scales are what we are after; keep it quick.
        if i % 3 != 0 && !module.contains("experts.0.") && !module.contains("wq_a") {
            continue;
        }
        // Packed FP4 stores two values per byte: the logical input is twice the stored width.
        let Some((w, input)) = [*input, input * 2]
            .into_iter()
            .find_map(|i| m.ckpt.shared_linear(module, *out, i).ok().map(|w| (w, i)))
        else {
            continue;
        };
        let input = &input;
        kinds.insert(w.view().kind());
        let t = 5;
        let x = random(t * input, i as u64 + 1);
        let wc = cpu.upload_linear(w.clone()).unwrap();
        let mut want = vec![0f32; t * out];
        cpu.matmul_host(&x, &wc, &mut want);
        for (gpu, tol) in [(&f32_gpu, 1e-5f64), (&bf16_gpu, 2e-2)] {
            let wg = gpu.upload_linear(w.clone()).unwrap();
            let mut got = vec![0f32; t * out];
            gpu.matmul_host(&x, &wg, &mut got);
            assert!(gpu.take_error().is_none());
            let e = normalised_error(&got, &want);
            assert!(
                e <= tol,
                "{format:?} {module} [{out}x{input}] {:?}: error {e}",
                gpu.gemm_type()
            );
            assert!(e > 0.0 || gpu.gemm_type() == GemmType::F32 || want.iter().all(|v| *v == 0.0));
            // Gathered rows are the exact decode.
            let rows = [0usize, out - 1, out / 2];
            let mut g = vec![0f32; 3 * input];
            let mut c = vec![0f32; 3 * input];
            gpu.gather_rows_host(&wg, &rows, &mut g);
            cpu.gather_rows_host(&wc, &rows, &mut c);
            assert_eq!(g, c, "{module}: gathered rows differ");
        }
    }
    eprintln!("{format:?}: formats seen {kinds:?}");
    let expected: &[&str] = match format {
        WeightFormat::Bf16 => &["bf16"],
        WeightFormat::Official => &["bf16", "fp8-block", "fp4-group"],
        WeightFormat::Nvfp4 => &["bf16", "nvfp4"],
    };
    for k in expected {
        assert!(
            kinds.contains(k),
            "{format:?}: no {k} linear was tested ({kinds:?})"
        );
    }
}

#[test]
fn matmul_and_gather_match_cpu_in_every_stored_format() {
    for f in [
        WeightFormat::Bf16,
        WeightFormat::Official,
        WeightFormat::Nvfp4,
    ] {
        check_format(f);
    }
}

#[test]
fn grouped_matmul_matches_cpu() {
    let cpu = CpuBackend::new();
    let gpu = EmuBackend::single(EmuExecutor::default(), GemmType::F32);
    let (groups, out, input, t) = (4, 24, 40, 7);
    let w = random(groups * out * input, 9);
    let x = random(t * groups * input, 10);
    let wc = cpu.upload_matrix(w.clone(), groups * out, input);
    let wg = gpu.upload_matrix(w, groups * out, input);
    let (mut a, mut b) = (vec![0f32; t * groups * out], vec![0f32; t * groups * out]);
    cpu.matmul_grouped_host(&x, groups, &wc, &mut a);
    gpu.matmul_grouped_host(&x, groups, &wg, &mut b);
    assert!(
        normalised_error(&b, &a) < 1e-6,
        "error {}",
        normalised_error(&b, &a)
    );
}

#[test]
fn a_failed_op_is_recorded_and_its_output_is_nan() {
    // A device with 1 KiB of memory cannot hold the 2 KiB activations: the upload fails, the op
    // on the lost activation fails, its output reads as NaN, and the first failure is kept.
    // (Failures inside an op, with its operands resident, are in gpu_emu_attention_moe.rs.)
    let gpu = EmuBackend::single(EmuExecutor::new(0, 1024), GemmType::F32);
    let w = gpu.upload_matrix(vec![1.0; 64], 8, 8);
    assert!(gpu.take_error().is_none());
    let x = vec![1.0f32; 8 * 64];
    let mut y = vec![0f32; 8 * 64];
    gpu.matmul_host(&x, &w, &mut y);
    assert!(y.iter().all(|v| v.is_nan()));
    let e = gpu.take_error().expect("error recorded");
    assert!(
        e.contains("activation") && e.contains("out of memory"),
        "{e}"
    );
    assert!(gpu.take_error().is_none(), "taken once");
}

#[test]
fn launches_are_checked_against_the_kernel_signature() {
    use needlescope::backend::gpu::executor::{buf, Arg, Executor};
    let e = EmuExecutor::default();
    let x = e.alloc(16).unwrap();
    let y = e.alloc(8).unwrap();
    // f32_to_bf16(const float*, u16*, long long)
    let ok = e.launch("f32_to_bf16", 1, &[buf(&x), buf(&y), Arg::I64(4)]);
    assert!(ok.is_ok(), "{ok:?}");
    let wrong = e
        .launch("f32_to_bf16", 1, &[buf(&x), buf(&y), Arg::I32(4)])
        .unwrap_err()
        .to_string();
    assert!(
        wrong.contains("\"ppi\"") && wrong.contains("\"ppl\""),
        "{wrong}"
    );
    let short = e
        .launch("f32_to_bf16", 1, &[buf(&x)])
        .unwrap_err()
        .to_string();
    assert!(short.contains("signature"), "{short}");
    let unknown = e.launch("no_such_kernel", 1, &[]).unwrap_err().to_string();
    assert!(unknown.contains("no such kernel"), "{unknown}");
    let past = e
        .launch("f32_to_bf16", 1, &[Arg::Buf(&x, 17), buf(&y), Arg::I64(0)])
        .unwrap_err()
        .to_string();
    assert!(past.contains("offset 17"), "{past}");
}

/// A buffer of another device passed to a launch, a GEMM or a copy is an error naming the
/// operation and the device (on a GPU it would be an illegal address; the emulator's devices
/// share host memory, so without the check it would silently work). The whole-forward tests on
/// two emulated devices run under the same check, so no op mixes devices.
#[test]
fn buffers_of_another_device_are_refused() {
    use needlescope::backend::gpu::executor::{buf, Arg, Executor, Gemm};
    let (d0, d1) = (EmuExecutor::new(0, 1 << 20), EmuExecutor::new(1, 1 << 20));
    let x0 = d0.alloc(16).unwrap();
    let (mut y0, y1) = (d0.alloc(8).unwrap(), d1.alloc(8).unwrap());
    assert!(d0
        .launch("f32_to_bf16", 1, &[buf(&x0), buf(&y0), Arg::I64(4)])
        .is_ok());
    let e = d0
        .launch("f32_to_bf16", 1, &[buf(&x0), buf(&y1), Arg::I64(4)])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("kernel f32_to_bf16: argument #1 is a buffer of another device"),
        "{e}"
    );
    let e = d1.write(&mut y0, 0, &[0u8; 4]).unwrap_err().to_string();
    assert!(e.contains("write on emu:1"), "{e}");
    let e = d1.read(&y0, 0, &mut [0u8; 4]).unwrap_err().to_string();
    assert!(e.contains("read on emu:1"), "{e}");
    // y[1, 1] = x[1, 2] . w[1, 2]^T with w on the other device.
    let w1 = d1.alloc(8).unwrap();
    let mut out = d0.alloc(4).unwrap();
    let g = Gemm::dense(1, 1, 2, GemmType::F32);
    let e = d0.gemm(&g, &x0, &w1, &mut out).unwrap_err().to_string();
    assert!(e.contains("buffer #1 belongs to another device"), "{e}");
    assert!(d0.gemm(&g, &x0, &x0, &mut out).is_ok());
}

/// The launch check sees where each buffer argument starts, not how far the kernel writes:
/// the emulator's guard after every buffer catches a kernel that writes past the end (here a
/// count one too large), pooled buffers included (their size class leaves slack).
#[test]
fn a_kernel_writing_past_a_buffer_end_is_an_error() {
    use needlescope::backend::gpu::executor::{buf, Arg, Executor};
    for e in [
        EmuExecutor::default(),
        EmuExecutor::default().with_pool(1 << 20),
    ] {
        let x = e.alloc(5 * 4).unwrap();
        let y = e.alloc(4 * 2).unwrap();
        assert!(e
            .launch("f32_to_bf16", 1, &[buf(&x), buf(&y), Arg::I64(4)])
            .is_ok());
        let err = e
            .launch("f32_to_bf16", 1, &[buf(&x), buf(&y), Arg::I64(5)])
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "kernel f32_to_bf16: argument 1 (a buffer of 8 bytes) was written past its end"
        );
        // A buffer reused from the pool is guarded at its new length.
        drop(y);
        let y = e.alloc(3 * 2).unwrap();
        assert!(e
            .launch("f32_to_bf16", 1, &[buf(&x), buf(&y), Arg::I64(4)])
            .is_err());
    }
}

#[test]
fn gemms_outside_their_buffers_are_refused_on_every_executor() {
    use needlescope::backend::gpu::executor::{Executor, Gemm};
    let e = EmuExecutor::default();
    let (x, w) = (e.alloc(4 * 8 * 4).unwrap(), e.alloc(3 * 8 * 4).unwrap());
    let mut y = e.alloc(4 * 3 * 4).unwrap();
    assert!(e
        .gemm(&Gemm::dense(4, 3, 8, GemmType::F32), &x, &w, &mut y)
        .is_ok());
    let mut past = Gemm::dense(4, 3, 8, GemmType::F32);
    past.x_offset = 4;
    let err = e.gemm(&past, &x, &w, &mut y).unwrap_err().to_string();
    assert!(
        err.contains("x needs 132 bytes, its buffer has 128"),
        "{err}"
    );
    let mut short_ld = Gemm::dense(4, 3, 8, GemmType::F32);
    short_ld.ldw = 7;
    assert!(e.gemm(&short_ld, &x, &w, &mut y).is_err());
    let err = e
        .gemm(&Gemm::dense(4, 3, 0, GemmType::F32), &x, &w, &mut y)
        .unwrap_err()
        .to_string();
    assert!(err.contains("empty inner dimension"), "{err}");
}

#[test]
fn caches_grow_and_drop_their_front_with_device_copies_only() {
    // Threads in both orders: an in-place move whose source overlaps its destination would
    // come out right in one order only (on a GPU it races).
    caches_grow_and_drop(false);
    caches_grow_and_drop(true);
}

fn caches_grow_and_drop(reverse_threads: bool) {
    use needlescope::backend::gpu::act::MIN_CAPACITY;
    let exec = EmuExecutor::default().with_reverse_threads(reverse_threads);
    let g = EmuBackend::single(exec, GemmType::F32);
    let mut rng = Rng::new(3);
    let (mut a, mut model) = (g.act_zeros(0), Vec::new());
    // (appended, dropped, capacity after): appends that fit, that double, that outgrow a
    // doubling; drops whose rest overlaps what goes (a new buffer of the same capacity) and
    // whose rest does not (in place); a rest of at most a quarter of the buffer moves to one
    // twice its size (at least MIN_CAPACITY), so dropping everything shrinks to MIN_CAPACITY.
    let steps = [
        (5, 0, MIN_CAPACITY),
        (300, 2, MIN_CAPACITY),
        (1500, 1000, 2 * MIN_CAPACITY),
        (0, 3, 2 * MIN_CAPACITY),
        (6000, 100, 6800),
        (7, 5000, 6800),
        (50, 0, 6800),
        (0, 1000, 1514),
        (0, usize::MAX, MIN_CAPACITY),
        (10, 0, MIN_CAPACITY),
        (3000, 0, 3010),
        (0, 2900, MIN_CAPACITY),
        // Exactly a quarter left (512 of 2048) already moves to half the buffer.
        (2 * MIN_CAPACITY - 110, 0, 2 * MIN_CAPACITY),
        (0, 3 * MIN_CAPACITY / 2, MIN_CAPACITY),
        // A rest that starts just inside what goes (101 values after dropping 100): moved to a
        // new buffer, never copied onto itself.
        (0, 311, MIN_CAPACITY),
        (0, 100, MIN_CAPACITY),
    ];
    for (step, &(add, drop, capacity)) in steps.iter().enumerate() {
        let tail_values = rng.values(add, 1.0);
        let tail = g.act_of(&tail_values);
        let before = g.transfer_bytes();
        g.act_append(&mut a, &tail);
        model.extend_from_slice(&tail_values);
        let drop = drop.min(model.len());
        g.act_drop_front(&mut a, drop);
        model.drain(..drop);
        assert_eq!(g.transfer_bytes(), before, "step {step}: no host copies");
        assert!(g.take_error().is_none(), "step {step}");
        assert_eq!(g.act_len(&a), model.len(), "step {step}");
        assert_eq!(g.capacity(&a), capacity, "step {step}: capacity");
        assert_eq!(&*g.act_host(&a), model.as_slice(), "step {step}: values");
    }
}

#[test]
fn an_append_from_another_device_moves_the_tail_and_a_failed_one_reads_nan() {
    use needlescope::backend::gpu::GpuBackend;
    use needlescope::backend::Site;
    let devices = vec![EmuExecutor::new(0, 1 << 20), EmuExecutor::new(1, 12 << 10)];
    let g = GpuBackend::new(devices, vec![0, 1], GemmType::F32);
    g.enter_site(Site::Layer(0));
    let mut a = g.act_of(&[1.0, 2.0]);
    g.enter_site(Site::Layer(1));
    g.act_append(&mut a, &g.act_of(&[3.0]));
    assert!(g.take_error().is_none());
    assert_eq!(a.device(), 0, "the cache stays on its device");
    assert_eq!(&*g.act_host(&a), &[1.0, 2.0, 3.0]);
    // Device 1 has 12 KiB: 4 KiB held, 4 KiB of tail and an 8 KiB grown buffer do not fit.
    let mut b = g.act_of(&vec![1.0; 1000]);
    g.act_append(&mut b, &g.act_of(&vec![2.0; 1000]));
    let e = g.take_error().expect("the failed growth is recorded");
    assert!(
        e.contains("act_append") && e.contains("out of memory"),
        "{e}"
    );
    assert_eq!(g.act_len(&b), 2000, "the length is the appended one");
    assert!(g.act_host(&b).iter().all(|v| v.is_nan()));
}

#[test]
fn narrow_products_over_long_inner_dimensions_are_split_and_summed_in_part_order() {
    use needlescope::backend::gpu::executor::{download, upload, Gemm};
    use needlescope::backend::gpu::matrix::{gemm_split_k, split_k_parts};
    // The mHC mixes ([T, 16384] x [16384, 24]) and the indexer's head weights (n 64, k 4096).
    assert_eq!(split_k_parts(2048, 24, 16384), Some(16));
    assert_eq!(split_k_parts(2048, 64, 4096), Some(4));
    assert_eq!(
        split_k_parts(2048, 65, 16384),
        None,
        "wide outputs stay whole"
    );
    assert_eq!(
        split_k_parts(2048, 24, 1024),
        None,
        "short inner dimensions stay whole"
    );
    assert_eq!(split_k_parts(7, 24, 3000), Some(2), "parts divide k");
    assert_eq!(split_k_parts(7, 24, 4099), None, "a prime k stays whole");

    // y = x · wᵀ for x [5, k], w [3, k], written at column 1 of a [5, 4] output; 2 parts, and
    // 4 (two parts add the same either way round; four show the order).
    for (k, parts) in [(3000, 2), (4000, 4)] {
        let (m, n) = (5, 3);
        let (xs, ws) = (random(m * k, 21), random(n * k, 22));
        let e = EmuExecutor::default();
        let (x, w) = (upload(&e, &xs).unwrap(), upload(&e, &ws).unwrap());
        let mut y = upload(&e, &vec![7.0f32; m * 4]).unwrap();
        let g = Gemm {
            y_offset: 4,
            ldy: 4,
            ..Gemm::dense(m, n, k, GemmType::F32)
        };
        gemm_split_k(&e, &g, parts, &x, &w, &mut y).unwrap();
        let mut got = vec![0f32; m * 4];
        download(&e, &y, &mut got).unwrap();
        let mut order_shows = false;
        for i in 0..m {
            assert_eq!(got[i * 4], 7.0, "row {i}: column 0 untouched");
            for j in 0..n {
                // The emulator's GEMM sums each part in order; the parts add in order.
                let part = |p: usize| -> f32 {
                    (p * k / parts..(p + 1) * k / parts)
                        .map(|kk| xs[i * k + kk] * ws[j * k + kk])
                        .sum()
                };
                let want = (0..parts).fold(0.0f32, |acc, p| acc + part(p));
                let reversed = (0..parts).rev().fold(0.0f32, |acc, p| acc + part(p));
                order_shows |= want.to_bits() != reversed.to_bits();
                assert_eq!(
                    got[i * 4 + 1 + j].to_bits(),
                    want.to_bits(),
                    "k {k}: ({i}, {j})"
                );
            }
        }
        assert!(
            parts == 2 || order_shows,
            "k {k}: no output tells the part order"
        );
    }
}
