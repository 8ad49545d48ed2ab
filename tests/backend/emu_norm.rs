//! The GPU backend's elementwise and mHC ops on the host emulator against the CPU reference:
//! rms_norm, rope, swiglu, kv_fp8_sim, compressor_pool (`kernels/elementwise.cu`) and hc_pre,
//! hc_post, hc_head (`kernels/hyper.cu`), on fresh pseudo-random inputs at several shapes,
//! under both GEMM types.
//!
//! Thresholds (normalised error = max |gpu - cpu| / max |cpu|):
//! - bit-exact (NaN matches NaN): rms_norm, rope, swiglu, kv_fp8_sim, compressor_pool, hc_post.
//!   The kernels repeat the CPU's arithmetic in its order and the emulator's expf is the same
//!   libm call as Rust's.
//! - hc_pre (input, post, comb) and hc_head: 2e-5 under BOTH GEMM types. Only the f32 mix
//!   GEMM's summation order differs; the mixes must be f32 even on a bf16-GEMM backend (bf16
//!   operands would give ~1e-2 after Sinkhorn), which the Bf16 case checks.

use emu_support::norm_err;
use needlescope::backend::gpu::{EmuBackend, EmuExecutor, GemmType};
use needlescope::backend::{Backend, CpuBackend, HcParams, HcWeights, HostOps, PoolLayout};
use needlescope::config::{LayerKind, ModelConfig};
use needlescope::numerics::rope::RopeTable;
use needlescope_testkit::emu as emu_support;

/// Uniform values in [-1, 1) from the crate PRNG.
fn random(n: usize, seed: u64) -> Vec<f32> {
    needlescope::numerics::rng::Rng::new(seed).signed_n(n)
}

fn backends() -> [EmuBackend; 2] {
    [
        EmuBackend::single(EmuExecutor::default(), GemmType::F32),
        EmuBackend::single(EmuExecutor::default(), GemmType::Bf16),
    ]
}

/// The reference output is meaningful: not all zero, no NaN, and (when given) not the input.
fn check_meaningful(what: &str, want: &[f32], input: Option<&[f32]>) {
    assert!(!want.is_empty(), "{what}: empty output");
    assert!(want.iter().any(|v| *v != 0.0), "{what}: all zero");
    assert!(
        want.iter().all(|v| !v.is_nan()),
        "{what}: NaN in the reference"
    );
    if let Some(x) = input {
        assert!(want != x, "{what}: the op left its input unchanged");
    }
}

/// Bit-for-bit equality (any NaN matches any NaN), showing the first difference.
fn assert_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some((i, (g, w))) = got
        .iter()
        .zip(want)
        .enumerate()
        .find(|(_, (g, w))| g.to_bits() != w.to_bits() && !(g.is_nan() && w.is_nan()))
    {
        panic!(
            "{what}: element {i}: gpu {g:e} ({:#x}) vs cpu {w:e} ({:#x})",
            g.to_bits(),
            w.to_bits()
        );
    }
}

fn no_error(gpu: &EmuBackend, what: &str) {
    if let Some(e) = gpu.take_error() {
        panic!("{what}: device error {e}");
    }
}

#[test]
fn rms_norm_is_bit_exact() {
    let cpu = CpuBackend::new();
    for gpu in backends() {
        for (i, &(rows, dim)) in [(1, 1), (3, 7), (17, 129), (5, 4096)].iter().enumerate() {
            let x: Vec<f32> = random(rows * dim, 10 + i as u64)
                .iter()
                .map(|v| v * 3.0)
                .collect();
            let w: Vec<f32> = random(dim, 20 + i as u64).iter().map(|v| v + 1.5).collect();
            for weight in [None, Some(&w[..])] {
                let what = format!("rms_norm [{rows}x{dim}] weight {}", weight.is_some());
                let mut want = x.clone();
                cpu.rms_norm_host(&mut want, dim, weight, 1e-6);
                let mut got = x.clone();
                gpu.rms_norm_host(&mut got, dim, weight, 1e-6);
                no_error(&gpu, &what);
                check_meaningful(&what, &want, Some(&x));
                assert_bits(&what, &got, &want);
            }
        }
    }
}

#[test]
fn rope_is_bit_exact_forward_and_inverse() {
    let cpu = CpuBackend::new();
    let tables = [
        RopeTable::plain(16, 10000.0),
        ModelConfig::flash().rope_table(LayerKind::Csa),
    ];
    for gpu in backends() {
        for table in &tables {
            let d_r = table.rope_dim();
            // (vectors per position, vector length): rope dims only, and a nope head in front.
            for (vecs, vec_len) in [(1, d_r), (3, d_r + 9)] {
                let positions = [0usize, 1, 7, 4095, 123_457, 1_000_003];
                let n = positions.len() * vecs * vec_len;
                let x = random(n, (d_r * vecs + vec_len) as u64);
                for inverse in [false, true] {
                    let what = format!("rope d_r {d_r} vecs {vecs} len {vec_len} inv {inverse}");
                    let mut want = x.clone();
                    cpu.rope_host(table, &mut want, vec_len, &positions, inverse);
                    let mut got = x.clone();
                    gpu.rope_host(table, &mut got, vec_len, &positions, inverse);
                    no_error(&gpu, &what);
                    check_meaningful(&what, &want, Some(&x));
                    assert_bits(&what, &got, &want);
                }
            }
        }
    }
}

#[test]
fn swiglu_is_bit_exact() {
    let cpu = CpuBackend::new();
    for gpu in backends() {
        for (i, &n) in [1usize, 333, 10_001].iter().enumerate() {
            // Gate and up beyond the limit on both sides.
            let gate: Vec<f32> = random(n, 30 + i as u64).iter().map(|v| v * 25.0).collect();
            let up: Vec<f32> = random(n, 40 + i as u64).iter().map(|v| v * 25.0).collect();
            for limit in [10.0f32, 7.25, f32::INFINITY] {
                let what = format!("swiglu n {n} limit {limit}");
                let mut want = gate.clone();
                cpu.swiglu_host(&mut want, &up, limit);
                let mut got = gate.clone();
                gpu.swiglu_host(&mut got, &up, limit);
                no_error(&gpu, &what);
                check_meaningful(&what, &want, Some(&gate));
                assert_bits(&what, &got, &want);
            }
        }
    }
}

/// The e4m3 ties of [`kv_values`]: placed at the start of a 64-block whose amax is 300, so the
/// scale is 1 and each value is an exact midpoint of the e4m3 grid (or of bf16), with the value
/// the CPU must round it to.
const KV_TIES: [(f32, f32); 8] = [
    (300.0, 288.0),
    (1.0625, 1.0),
    (-1.1875, -1.25),
    (17.0, 16.0),
    (-3.0 / 1024.0, -1.0 / 256.0),
    (1.0 / 1024.0, 0.0),
    (1.0 + 1.0 / 256.0, 1.0),
    (-0.0, -0.0),
];

/// KV rows cycling through four kinds of 64-blocks: the [`KV_TIES`] among values below 1;
/// values over ~70 binades (2^-50 .. 2^20: most land in e4m3's subnormal range or flush to
/// zero next to the block's amax); values below the 1e-4 amax floor; values above 448 (2^8 ..
/// 2^20, and 3e38 near the top of bf16's range).
fn kv_values(n: usize, seed: u64) -> Vec<f32> {
    let u = random(2 * n, seed);
    (0..n)
        .map(|k| {
            let (a, b) = (u[2 * k], u[2 * k + 1]);
            match (k / 64) % 4 {
                0 if k % 64 < KV_TIES.len() => KV_TIES[k % 64].0,
                0 => a * 0.9,
                1 => b * 2f32.powi((a.abs() * 70.0) as i32 - 50),
                2 => a * 1e-6,
                _ if k % 64 == 5 => 3.0e38,
                _ => b * 2f32.powi(8 + (a.abs() * 12.0) as i32),
            }
        })
        .collect()
}

#[test]
fn kv_fp8_sim_is_bit_exact() {
    let cpu = CpuBackend::new();
    for gpu in backends() {
        // (rows, row_len, nope): the model's 512 + 64, a partial last block, nope past the row,
        // no nope dims, odd sizes.
        for (i, &(rows, row_len, nope)) in [
            (3usize, 576usize, 512usize),
            (2, 100, 70),
            (2, 50, 64),
            (4, 64, 0),
            (5, 131, 129),
        ]
        .iter()
        .enumerate()
        {
            let x = kv_values(rows * row_len, 50 + i as u64);
            let what = format!("kv_fp8_sim [{rows}x{row_len}] nope {nope}");
            let mut want = x.clone();
            cpu.kv_fp8_sim_host(&mut want, row_len, nope);
            if nope >= KV_TIES.len() {
                for (k, &(_, rounded)) in KV_TIES.iter().enumerate() {
                    assert_eq!(want[k].to_bits(), rounded.to_bits(), "premise: tie {k}");
                }
            }
            let mut got = x.clone();
            gpu.kv_fp8_sim_host(&mut got, row_len, nope);
            no_error(&gpu, &what);
            check_meaningful(&what, &want, Some(&x));
            assert_bits(&what, &got, &want);
        }
        // NaN and infinity ride through like on the CPU (the block with inf saturates).
        let mut x = kv_values(128, 99);
        x[3] = f32::NAN;
        x[70] = f32::INFINITY;
        let mut want = x.clone();
        cpu.kv_fp8_sim_host(&mut want, 128, 128);
        let mut got = x.clone();
        gpu.kv_fp8_sim_host(&mut got, 128, 128);
        no_error(&gpu, "kv_fp8_sim specials");
        assert!(want[3].is_nan() && want.iter().any(|v| *v != 0.0 && !v.is_nan()));
        assert_bits("kv_fp8_sim specials", &got, &want);
    }
}

#[test]
fn compressor_pool_is_bit_exact() {
    let cpu = CpuBackend::new();
    for gpu in backends() {
        // (ratio, c, overlap, first window, row 0 has its previous window, rows, extra tokens)
        let cases = [
            (1usize, 3usize, false, 0usize, false, 1usize, 0usize),
            (4, 5, true, 0, false, 3, 2),
            (4, 5, true, 4, true, 3, 3),
            (4, 512, true, 8, true, 2, 0),
            (2, 4, false, 2, false, 2, 1),
            (128, 7, false, 37, false, 4, 127),
        ];
        for (i, &(ratio, c, overlap, first_window, first_has_previous, rows, extra)) in
            cases.iter().enumerate()
        {
            let layout = PoolLayout {
                ratio,
                c,
                overlap,
                first_window,
                first_has_previous,
            };
            let width = layout.width();
            let n = (layout.tokens_needed(rows) + extra) * width;
            let values = random(n, 60 + i as u64);
            let logits: Vec<f32> = random(n, 70 + i as u64).iter().map(|v| v * 8.0).collect();
            let ape = random(ratio * width, 80 + i as u64);
            let what = format!("compressor_pool {layout:?} x {rows} rows");
            let mut want = vec![0f32; rows * c];
            cpu.compressor_pool_host(&values, &logits, &ape, layout, &mut want);
            let mut got = vec![f32::NAN; rows * c];
            gpu.compressor_pool_host(&values, &logits, &ape, layout, &mut got);
            no_error(&gpu, &what);
            check_meaningful(&what, &want, None);
            assert_bits(&what, &got, &want);
        }
    }
}

fn hc_params() -> HcParams {
    HcParams {
        streams: 4,
        sinkhorn_iters: 20,
        norm_eps: 1e-6,
        hc_eps: 1e-6,
    }
}

/// Tolerance of the mHC mixes (f32 GEMM summation order only).
const HC_TOL: f32 = 2e-5;

#[test]
fn hc_pre_and_head_match_cpu_with_f32_mixes_under_both_gemm_types() {
    let cpu = CpuBackend::new();
    let mut worst = [0f32; 4];
    // 4 streams (V4) run Sinkhorn in a local array on the device, 5 in place: both paths.
    for (gpu, streams) in backends()
        .into_iter()
        .map(|g| (g, 4))
        .chain(backends().into_iter().map(|g| (g, 5)))
    {
        let p = HcParams {
            streams,
            ..hc_params()
        };
        let n = p.streams;
        for (i, &(tokens, d)) in [(1usize, 7usize), (5, 64), (33, 129)].iter().enumerate() {
            let seed = 80 + 10 * i as u64;
            let width = n * d;
            let streams: Vec<f32> = random(tokens * width, seed)
                .iter()
                .map(|v| v * 4.0)
                .collect();
            // Mix weights sized so that the mixes are O(1) and sigmoid / Sinkhorn are not saturated.
            let w_scale = 2.0 / (width as f32).sqrt();
            for (rows, scale) in [((2 + n) * n, vec![0.7f32, 1.3, 2.1]), (n, vec![0.9f32])] {
                let mix: Vec<f32> = random(rows * width, seed + 1)
                    .iter()
                    .map(|v| v * w_scale)
                    .collect();
                let base: Vec<f32> = random(rows, seed + 2).iter().map(|v| v * 0.5).collect();
                let mc = cpu.upload_matrix(mix.clone(), rows, width);
                let mg = gpu.upload_matrix(mix, rows, width);
                let cs = HcWeights {
                    mix: &mc,
                    base: &base,
                    scale: &scale,
                };
                let gs = HcWeights {
                    mix: &mg,
                    base: &base,
                    scale: &scale,
                };
                let what = format!("{:?} T {tokens} D {d} n {n} rows {rows}", gpu.gemm_type());
                let mut want_in = vec![0f32; tokens * d];
                let mut got_in = vec![f32::NAN; tokens * d];
                if rows == n {
                    cpu.hc_head_host(&streams, &cs, &p, &mut want_in);
                    gpu.hc_head_host(&streams, &gs, &p, &mut got_in);
                    no_error(&gpu, &what);
                    check_meaningful(&what, &want_in, None);
                    let e = norm_err(&got_in, &want_in);
                    eprintln!("hc_head {what}: out {e:.2e}");
                    assert!(e <= HC_TOL, "hc_head {what}: error {e}");
                    worst[3] = worst[3].max(e);
                    continue;
                }
                let (mut want_post, mut want_comb) =
                    (vec![0f32; tokens * n], vec![0f32; tokens * n * n]);
                let (mut got_post, mut got_comb) =
                    (vec![f32::NAN; tokens * n], vec![f32::NAN; tokens * n * n]);
                cpu.hc_pre_host(
                    &streams,
                    &cs,
                    &p,
                    &mut want_in,
                    &mut want_post,
                    &mut want_comb,
                );
                gpu.hc_pre_host(&streams, &gs, &p, &mut got_in, &mut got_post, &mut got_comb);
                no_error(&gpu, &what);
                for (k, (name, got, want)) in [
                    ("input", &got_in, &want_in),
                    ("post", &got_post, &want_post),
                    ("comb", &got_comb, &want_comb),
                ]
                .into_iter()
                .enumerate()
                {
                    check_meaningful(name, want, None);
                    let e = norm_err(got, want);
                    eprintln!("hc_pre {what}: {name} {e:.2e}");
                    assert!(e <= HC_TOL, "hc_pre {what}: {name} error {e}");
                    worst[k] = worst[k].max(e);
                }
                // Sinkhorn really ran: comb columns sum to ~1.
                for t in 0..tokens {
                    for k in 0..n {
                        let col: f32 = (0..n).map(|j| got_comb[t * n * n + j * n + k]).sum();
                        assert!(
                            (col - 1.0).abs() < 1e-4,
                            "{what}: comb column sums to {col}"
                        );
                    }
                }
            }
        }
    }
    eprintln!(
        "worst normalised errors: input {:.2e} post {:.2e} comb {:.2e} head {:.2e}",
        worst[0], worst[1], worst[2], worst[3]
    );
}

#[test]
fn hc_post_is_bit_exact() {
    let cpu = CpuBackend::new();
    let n = 4;
    for gpu in backends() {
        for (i, &(tokens, d)) in [(1usize, 1usize), (3, 65), (9, 512)].iter().enumerate() {
            let seed = 200 + i as u64;
            let streams = random(tokens * n * d, seed);
            let y = random(tokens * d, seed + 1);
            let post: Vec<f32> = random(tokens * n, seed + 2)
                .iter()
                .map(|v| v + 1.0)
                .collect();
            let comb: Vec<f32> = random(tokens * n * n, seed + 3)
                .iter()
                .map(|v| v.abs())
                .collect();
            let what = format!("hc_post T {tokens} D {d}");
            let mut want = streams.clone();
            cpu.hc_post_host(&mut want, &y, &post, &comb, n);
            let mut got = streams.clone();
            gpu.hc_post_host(&mut got, &y, &post, &comb, n);
            no_error(&gpu, &what);
            check_meaningful(&what, &want, Some(&streams));
            assert_bits(&what, &got, &want);
        }
    }
}
