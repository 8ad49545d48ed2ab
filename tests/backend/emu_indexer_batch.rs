//! The GPU backend's batched indexer ops on the host emulator against the CPU reference:
//! `index_prepare_queries` bit for bit equal to `CpuBackend::index_prepare_query` token by token
//! in every index profile, and `topk_batch` identical to `CpuBackend::topk` row by row (ragged
//! visibility, ties, NaN, infinities, row groups). A counting executor checks that each call is
//! a constant number of launches and downloads, whatever the number of tokens, and that
//! `index_scores_batch` reads its keys in place from a longer key cache: only the visibility
//! goes up, and the bf16-exactness test (bf16 or f32 GEMM) looks at the visible rows only.

use needlescope::backend::gpu::executor::{Arg, Executor, Gemm, GpuError};
use needlescope::backend::gpu::topk::topk_batch_grouped;
use needlescope::backend::gpu::{EmuExecutor, GemmType, GpuBackend};
use needlescope::backend::{Backend, CpuBackend, HostOps, IndexScoreBatch, RawIndexQueries};
use needlescope::numerics::rng::Rng;
use needlescope::numerics::IndexProfile;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The emulator, counting launches, device-to-host reads, host-to-device bytes and bf16 /
/// f32 GEMMs.
#[derive(Default)]
struct Counting {
    inner: EmuExecutor,
    launches: AtomicUsize,
    reads: AtomicUsize,
    written: AtomicUsize,
    gemms: [AtomicUsize; 2],
}

type Buf = <EmuExecutor as Executor>::Buf;

impl Executor for Counting {
    type Buf = Buf;
    const KIND: &'static str = "cuda-emu";
    fn name(&self) -> String {
        self.inner.name()
    }
    fn alloc(&self, bytes: usize) -> Result<Buf, GpuError> {
        self.inner.alloc(bytes)
    }
    fn len(&self, b: &Buf) -> usize {
        self.inner.len(b)
    }
    fn write(&self, dst: &mut Buf, offset: usize, src: &[u8]) -> Result<(), GpuError> {
        self.written.fetch_add(src.len(), Ordering::Relaxed);
        self.inner.write(dst, offset, src)
    }
    fn read(&self, src: &Buf, offset: usize, dst: &mut [u8]) -> Result<(), GpuError> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.inner.read(src, offset, dst)
    }
    fn launch(&self, kernel: &str, grid: u32, args: &[Arg<'_, Buf>]) -> Result<(), GpuError> {
        self.launches.fetch_add(1, Ordering::Relaxed);
        self.inner.launch(kernel, grid, args)
    }
    fn gemm(&self, g: &Gemm, x: &Buf, w: &Buf, y: &mut Buf) -> Result<(), GpuError> {
        self.gemms[(g.ty == GemmType::F32) as usize].fetch_add(1, Ordering::Relaxed);
        self.inner.gemm(g, x, w, y)
    }
    fn synchronize(&self) -> Result<(), GpuError> {
        self.inner.synchronize()
    }
    fn memory(&self) -> Result<(usize, usize), GpuError> {
        self.inner.memory()
    }
}

fn gpu() -> GpuBackend<Counting> {
    GpuBackend::single(Counting::default(), GemmType::Bf16)
}

/// (launches, reads) since the last call.
fn counts(g: &GpuBackend<Counting>) -> (usize, usize) {
    let d = &g.devices()[0];
    (
        d.launches.swap(0, Ordering::Relaxed),
        d.reads.swap(0, Ordering::Relaxed),
    )
}

fn assert_bits_eq(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "{what}: element {i}: gpu {g:e} vs cpu {w:e}"
        );
    }
}

/// Query rows of many magnitudes (one head in 8 all zeros, one with an fp8 / bf16 tie).
fn raw_queries(n_heads: usize, dim: usize, rng: &mut Rng) -> Vec<f32> {
    let mut v = Vec::with_capacity(n_heads * dim);
    for h in 0..n_heads {
        let scale = 2f32.powi((h % 13) as i32 - 6);
        match h % 8 {
            0 => v.extend(std::iter::repeat_n(0.0, dim)),
            1 => v.extend((0..dim).map(|i| match i {
                0 => 7.0,
                1 => 1.0625 / 64.0,
                2 => 1.0 + 1.0 / 256.0,
                _ => rng.signed() * 0.01,
            })),
            _ => v.extend((0..dim).map(|_| rng.signed() * scale)),
        }
    }
    v
}

#[test]
fn batched_query_preparation_is_bit_identical_to_the_cpu_per_token() {
    let (cpu, gpu) = (CpuBackend::new(), gpu());
    for (heads, dim) in [(4usize, 64usize), (64, 128), (4, 128), (64, 64)] {
        for tokens in [1usize, 7, 33] {
            let mut rng = Rng::new(1000 + (heads * dim + tokens) as u64);
            let q = raw_queries(tokens * heads, dim, &mut rng);
            let mut w: Vec<f32> = (0..tokens * heads).map(|_| rng.signed() * 3.0).collect();
            w[0] = 1.0 + 1.0 / 256.0; // a bf16 tie
            for p in IndexProfile::EVERY {
                let (hd, what) = (heads * dim, format!("{p} T {tokens} {heads}x{dim}"));
                let mut values = vec![f32::NAN; tokens * hd];
                let mut weights = vec![f32::NAN; tokens * heads];
                counts(&gpu);
                let raw = RawIndexQueries {
                    profile: p,
                    queries: &q[..],
                    weights: &w[..],
                    heads,
                    dim,
                };
                gpu.index_prepare_queries_host(&raw, &mut values, &mut weights);
                assert!(gpu.take_error().is_none(), "{what}: device error");
                let (launches, reads) = counts(&gpu);
                assert_eq!(
                    (launches, reads),
                    (1, 2),
                    "{what}: one launch, two downloads"
                );
                for t in 0..tokens {
                    let (qs, ws) = (&q[t * hd..(t + 1) * hd], &w[t * heads..(t + 1) * heads]);
                    let want = cpu.index_prepare_query(p, qs, ws, heads, dim);
                    let got_v = &values[t * hd..(t + 1) * hd];
                    assert_bits_eq(got_v, &want.values, &format!("{what}: token {t} values"));
                    let got_w = &weights[t * heads..(t + 1) * heads];
                    assert_bits_eq(got_w, &want.weights, &format!("{what}: token {t} weights"));
                }
            }
        }
    }
}

#[test]
fn batched_query_preparation_records_a_bad_dim() {
    // A rotating profile with a dim that is not a power of two: an error and NaN outputs.
    let gpu = gpu();
    let (mut v, mut w) = (vec![0.0; 2 * 4 * 48], vec![0.0; 2 * 4]);
    let q = vec![1.0; 2 * 4 * 48];
    let wr = [1.0; 2 * 4];
    let raw = RawIndexQueries {
        profile: IndexProfile::SglangFp8,
        queries: &q[..],
        weights: &wr[..],
        heads: 4,
        dim: 48,
    };
    gpu.index_prepare_queries_host(&raw, &mut v, &mut w);
    assert!(gpu.take_error().is_some());
    assert!(v.iter().chain(&w).all(|x| x.is_nan()));
}

/// Scores drawn from a small set with NaN, infinities and signed zeros: ties everywhere.
fn tricky(rng: &mut Rng) -> f32 {
    match rng.next_u64() % 12 {
        0 => f32::NAN,
        1 => f32::NEG_INFINITY,
        2 => 0.0,
        3 => -0.0,
        4 => f32::INFINITY,
        5 => 1.5,
        6 => -f32::MIN_POSITIVE / 4.0,
        _ => (rng.next_u64() % 1000) as f32 / 37.0 - 13.0,
    }
}

/// `[T, stride]` scores: row t has `visible[t]` scores of `kind` (0 tricky, 1 smooth, 2 all
/// equal, 3 all NaN but the last, -inf), then +inf padding that must never be selected.
fn batch_scores(stride: usize, visible: &[usize], seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    let mut s = vec![f32::INFINITY; visible.len() * stride];
    for (t, &v) in visible.iter().enumerate() {
        let row = &mut s[t * stride..t * stride + v];
        for (i, x) in row.iter_mut().enumerate() {
            *x = match t % 4 {
                0 => tricky(&mut rng),
                1 => rng.signed() * 10.0,
                2 => 0.25,
                _ if i + 1 == v => f32::NEG_INFINITY,
                _ => f32::NAN,
            };
        }
    }
    s
}

/// `topk_batch` on the GPU equals `CpuBackend::topk` row by row; returns the GPU's output.
fn check_batch(
    gpu: &GpuBackend<Counting>,
    scores: &[f32],
    stride: usize,
    visible: &[usize],
    k: usize,
    what: &str,
) -> Vec<i32> {
    let cpu = CpuBackend::new();
    let mut got = vec![7i32; visible.len() * k];
    gpu.topk_batch_host(scores, stride, visible, &mut got);
    assert!(gpu.take_error().is_none(), "{what}: device error");
    for (t, &v) in visible.iter().enumerate() {
        let mut want = vec![7i32; k];
        cpu.topk(&scores[t * stride..t * stride + v], &mut want);
        let row = &got[t * k..(t + 1) * k];
        if let Some(i) = (0..k).find(|&i| row[i] != want[i]) {
            panic!(
                "{what}: row {t} (visible {v}, k {k}): first difference at {i}: gpu {} vs cpu {}",
                row[i], want[i]
            );
        }
    }
    got
}

#[test]
fn topk_batch_matches_cpu_per_row_with_ragged_visibility() {
    let gpu = gpu();
    let (stride, k) = (8192usize, 512usize);
    // Ragged: 0, 1, < k, = k, > k, = stride, and a spread in between.
    let mut visible = vec![0usize, 1, 2, 100, 511, 512, 513, 1000, 8191, 8192, 0, 8192];
    let mut rng = Rng::new(5);
    while visible.len() < 300 {
        visible.push(match rng.next_u64() % 4 {
            0 => (rng.next_u64() % 600) as usize,
            1 => stride,
            _ => (rng.next_u64() % stride as u64) as usize,
        });
    }
    let scores = batch_scores(stride, &visible, 6);
    counts(&gpu);
    let got = check_batch(&gpu, &scores, stride, &visible, k, "T 300");
    // One group: 8 radix passes (4-bit digits) of 3 launches, count, collect, rank; one
    // download.
    assert_eq!(counts(&gpu), (27, 1), "T 300: launches and downloads");
    assert!(got[..k].iter().all(|&r| r == -1), "visible 0 gives all -1");
    assert_eq!(got[k], 0);
    assert!(got[k + 1..2 * k].iter().all(|&r| r == -1));

    // The same rows in groups of 7 rows, and of one row: same output, group edges crossed
    // (rows 10..14 hold a row with nothing visible).
    for group in [7 * stride, 1] {
        let mut again = vec![7i32; got.len()];
        topk_batch_grouped(
            &gpu,
            &gpu.act_of(&scores),
            stride,
            &visible,
            &mut again,
            group,
        )
        .unwrap();
        assert!(again == got, "group of {group} scores differs");
    }
    let groups = visible.len().div_ceil(7);
    counts(&gpu);
    let mut again = vec![7i32; got.len()];
    topk_batch_grouped(
        &gpu,
        &gpu.act_of(&scores),
        stride,
        &visible,
        &mut again,
        7 * stride,
    )
    .unwrap();
    let (launches, reads) = counts(&gpu);
    assert!(
        launches <= 27 * groups && reads <= groups,
        "grouped: {launches}, {reads}"
    );
}

#[test]
fn topk_batch_matches_cpu_on_small_and_edge_shapes() {
    let gpu = gpu();
    // T = 1, a single row through the batch, every k against every visible count.
    for (stride, v) in [
        (1usize, 1usize),
        (5, 5),
        (300, 257),
        (8192, 8192),
        (8192, 3),
    ] {
        let scores = batch_scores(stride, &[v], v as u64);
        for k in [1usize, 2, 7, 256, 512, 9000] {
            check_batch(
                &gpu,
                &scores,
                stride,
                &[v],
                k,
                &format!("T 1 stride {stride}"),
            );
        }
    }
    // Small strides and T = 33, each kind of row; ties, NaN, -inf.
    for stride in [1usize, 3, 64, 300] {
        let visible: Vec<usize> = (0..33).map(|t| (t * 7 + 1) % (stride + 1)).collect();
        let scores = batch_scores(stride, &visible, stride as u64);
        for k in [1usize, 3, 64, 512] {
            check_batch(
                &gpu,
                &scores,
                stride,
                &visible,
                k,
                &format!("stride {stride}"),
            );
        }
    }
    // A row equal to CpuBackend's unit-test rows.
    let s = [1.0, 3.0, 3.0, 2.0, 3.0, f32::NAN, f32::NEG_INFINITY, 0.5];
    let got = check_batch(&gpu, &s, 4, &[4, 4], 3, "two rows");
    assert_eq!(got, [1, 2, 3, 0, 3, 2]);
    // Nothing visible anywhere, k 0, T 0: padding only, no device error.
    let got = check_batch(&gpu, &[0.0; 6], 3, &[0, 0], 4, "nothing visible");
    assert!(got.iter().all(|&r| r == -1));
    check_batch(&gpu, &[1.0; 6], 3, &[3, 3], 0, "k 0");
    check_batch(&gpu, &[], 3, &[], 4, "T 0");
}

#[test]
fn per_row_topk_goes_through_the_batch_and_matches_cpu() {
    let (cpu, gpu) = (CpuBackend::new(), gpu());
    let scores = batch_scores(5000, &[5000], 9);
    for k in [0usize, 1, 100, 5000, 6000] {
        let (mut want, mut got) = (vec![7i32; k], vec![7i32; k]);
        cpu.topk(&scores, &mut want);
        gpu.topk(&scores, &mut got);
        assert!(gpu.take_error().is_none());
        assert_eq!(got, want, "k {k}");
    }
}

#[test]
fn batched_scores_read_the_visible_rows_of_a_device_key_cache() {
    let (cpu, gpu) = (CpuBackend::new(), gpu());
    let (p, heads, dim, rows) = (IndexProfile::SglangFp8, 4usize, 64usize, 40usize);
    let mut rng = Rng::new(17);
    let raw = raw_queries(rows, dim, &mut rng);
    let (mut keys, mut scales) = (vec![0.0; rows * dim], vec![0.0; rows]);
    cpu.index_prepare_keys(p, &raw, dim, &mut keys, &mut scales);
    let tokens = 3;
    let q_raw = raw_queries(tokens * heads, dim, &mut rng);
    let w_raw: Vec<f32> = (0..tokens * heads).map(|_| rng.signed()).collect();
    let (mut q, mut w) = (vec![0.0; q_raw.len()], vec![0.0; w_raw.len()]);
    let raw = RawIndexQueries {
        profile: p,
        queries: &q_raw[..],
        weights: &w_raw[..],
        heads,
        dim,
    };
    cpu.index_prepare_queries_host(&raw, &mut q, &mut w);
    let (q_act, w_act) = (gpu.act_of(&q), gpu.act_of(&w));
    // The cache on the device: the prepared rows, then 5 rows that are not bf16 (and NaN).
    let mut tail = vec![0.3f32; 5 * dim];
    tail[dim] = f32::NAN;
    let (mut k_act, mut s_act) = (gpu.act_of(&keys), gpu.act_of(&scales));
    gpu.act_append(&mut k_act, &gpu.act_of(&tail));
    gpu.act_append(&mut s_act, &gpu.act_of(&[0.3; 5]));
    let stride = rows + 5;
    for (visible, bf16) in [([rows, 7, 0], true), ([rows + 1, 3, rows], false)] {
        counts(&gpu);
        let d = &gpu.devices()[0];
        d.written.swap(0, Ordering::Relaxed);
        d.gemms
            .iter()
            .for_each(|g| _ = g.swap(0, Ordering::Relaxed));
        let mut out = gpu.act_zeros(tokens * stride);
        let batch = IndexScoreBatch {
            profile: p,
            queries: &q_act,
            weights: &w_act,
            first: 0,
            heads,
            dim,
            keys: &k_act,
            key_scales: &s_act,
            visible: &visible,
        };
        gpu.index_scores_batch(&batch, &mut out);
        assert!(gpu.take_error().is_none());
        assert_eq!(
            d.written.load(Ordering::Relaxed),
            4 * tokens,
            "{visible:?}: only the visibility goes up"
        );
        assert_eq!(
            counts(&gpu).1,
            1,
            "{visible:?}: one download (the bf16 flag)"
        );
        let (b, f) = (
            d.gemms[0].load(Ordering::Relaxed),
            d.gemms[1].load(Ordering::Relaxed),
        );
        assert!(
            b + f > 0 && (b > 0) == bf16 && (f > 0) != bf16,
            "{visible:?}: {b} bf16 and {f} f32 GEMMs"
        );
        if bf16 {
            // Prepared inputs: the CPU's scores up to summation order.
            let mut want = vec![0.0; tokens * stride];
            let host = batch.with_tensors(&q[..], &w[..], &keys[..], &scales[..]);
            cpu.index_scores_batch_host(&host, &mut want);
            let got = gpu.act_into_host(out);
            for (i, (x, y)) in got.iter().zip(&want).enumerate() {
                assert!(
                    x == y || (x - y).abs() <= 1e-5 * y.abs().max(1.0),
                    "score {i}: {x} vs {y}"
                );
            }
        }
    }
}
