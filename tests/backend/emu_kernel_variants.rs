//! Kernels that do the work of another with more per thread write exactly what the simple one
//! writes, bit for bit: the eight-values-per-thread FP4 dequant kernels (`dequant_fp4_group8`,
//! `dequant_nvfp4_8`, used whenever a row splits into whole eights sharing a scale) for every
//! byte value and scale, f32 and bf16 outputs, a band of rows and gathered rows; and the
//! four-heads-per-thread attention logits (`attn_logits4`, used when the heads divide by four),
//! with a dot-product tail and padded entries, and with 16-byte loads; the four-heads,
//! four-columns attention values (`attn_values4`); and `moe_sum_rows` (the routed experts' sum read
//! through a row map) against the CPU's slot-order sum.

use needlescope::backend::gpu::executor::{buf, download, grid_for, upload, Arg};
use needlescope::backend::gpu::{EmuExecutor, Executor};
use needlescope::numerics::rng::Rng;

const ROWS: usize = 6;
const COLS: usize = 96;

fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| (r.next_u64() >> 56) as u8).collect()
}

/// Runs `kernel` (one value or eight per thread) and returns the output bits.
type Buf = <EmuExecutor as Executor>::Buf;

fn run(
    e: &EmuExecutor,
    (kernel, per_thread): (&str, usize),
    scale_args: &[Arg<'_, Buf>],
    packed: &Buf,
    ids: Option<&[i32]>,
    out_bf16: bool,
) -> Vec<u32> {
    let nrows = ids.map_or(ROWS - 1, |i| i.len());
    let n = nrows * COLS;
    let width = if out_bf16 { 2 } else { 4 };
    let out = e.alloc(n * width).unwrap();
    let ids_buf = ids.map(|i| upload(e, i).unwrap());
    let mut args = vec![buf(packed)];
    args.extend_from_slice(scale_args);
    args.extend([
        ids_buf.as_ref().map_or(Arg::Null, buf),
        Arg::I64(1),
        Arg::I64(nrows as i64),
        Arg::I64(COLS as i64),
        buf(&out),
        Arg::I32(out_bf16 as i32),
    ]);
    e.launch(kernel, grid_for(n / per_thread), &args).unwrap();
    if out_bf16 {
        let mut v = vec![0u16; n];
        download(e, &out, &mut v).unwrap();
        v.into_iter().map(u32::from).collect()
    } else {
        let mut v = vec![0f32; n];
        download(e, &out, &mut v).unwrap();
        v.into_iter().map(f32::to_bits).collect()
    }
}

#[test]
fn eight_per_thread_fp4_kernels_match_the_per_value_ones() {
    let e = EmuExecutor::default();
    let packed = upload(&e, &bytes(ROWS * COLS / 2, 1)).unwrap();
    // e8m0 scales per 32 values, every byte value (255 is NaN) somewhere.
    let group = 32usize;
    let mut e8m0 = bytes(ROWS * COLS / group, 2);
    e8m0[0] = 255;
    e8m0[1] = 0;
    let e8m0 = upload(&e, &e8m0).unwrap();
    // e4m3 scales per 16 values (0x7F is NaN).
    let mut e4m3 = bytes(ROWS * COLS / 16, 3);
    e4m3[2] = 0x7F;
    let e4m3 = upload(&e, &e4m3).unwrap();
    let gathered = [4i32, 0, 5, 2];
    for ids in [None, Some(&gathered[..])] {
        for out_bf16 in [false, true] {
            let g = [buf(&e8m0), Arg::I64(group as i64)];
            let one = run(&e, ("dequant_fp4_group", 1), &g, &packed, ids, out_bf16);
            let eight = run(&e, ("dequant_fp4_group8", 8), &g, &packed, ids, out_bf16);
            assert_eq!(one, eight, "fp4 group, ids {ids:?}, bf16 {out_bf16}");
            assert!(one.iter().any(|&b| b != 0));
            let n = [buf(&e4m3), Arg::F32(0.37)];
            let one = run(&e, ("dequant_nvfp4", 1), &n, &packed, ids, out_bf16);
            let eight = run(&e, ("dequant_nvfp4_8", 8), &n, &packed, ids, out_bf16);
            assert_eq!(one, eight, "nvfp4, ids {ids:?}, bf16 {out_bf16}");
        }
    }
}

/// An attention batch for the kernel comparisons: `tokens` queries of `heads` heads over a
/// table of `rows` rows of `d` values, entry lists of the given counts (0 and full included),
/// padded to `emax` with -1.
struct AttentionInputs {
    tokens: usize,
    heads: usize,
    d: usize,
    emax: usize,
    queries: Buf,
    table: Buf,
    idx: Buf,
    count: Buf,
}

impl AttentionInputs {
    fn new(e: &EmuExecutor, heads: usize, d: usize, seed: u64) -> Self {
        let (tokens, emax, rows) = (5usize, 7usize, 9usize);
        let mut r = Rng::new(seed);
        let count: Vec<i32> = vec![7, 3, 0, 5, 1];
        let idx: Vec<i32> = (0..tokens * emax)
            .map(|i| {
                let (t, j) = (i / emax, i % emax);
                if (j as i32) < count[t] {
                    ((t * 3 + j * 5) % rows) as i32
                } else {
                    -1
                }
            })
            .collect();
        AttentionInputs {
            tokens,
            heads,
            d,
            emax,
            queries: upload(e, &r.values(tokens * heads * d, 1.0)).unwrap(),
            table: upload(e, &r.values(rows * d, 1.0)).unwrap(),
            idx: upload(e, &idx).unwrap(),
            count: upload(e, &count).unwrap(),
        }
    }

    fn dims(&self) -> [Arg<'static, Buf>; 4] {
        [self.tokens, self.heads, self.d, self.emax].map(|v| Arg::I64(v as i64))
    }
}

fn bits(e: &EmuExecutor, b: &Buf, n: usize) -> Vec<u32> {
    let mut v = vec![0f32; n];
    download(e, b, &mut v).unwrap();
    v.into_iter().map(f32::to_bits).collect()
}

/// `attn_logits4` against `attn_logits`, with a dot-product tail (d = 44) and without (d = 48:
/// the 16-byte loads).
#[test]
fn four_heads_per_thread_logits_match_one_head_per_thread() {
    let e = EmuExecutor::default();
    for d in [44usize, 48] {
        let a = AttentionInputs::new(&e, 8, d, 9);
        let n = a.tokens * a.heads * a.emax;
        let logits = |kernel: &str, threads: usize| {
            let w = upload(&e, &vec![f32::NAN; n]).unwrap();
            let mut args = vec![buf(&a.queries), buf(&a.table), buf(&a.idx), buf(&a.count)];
            args.extend(a.dims());
            args.extend([Arg::F32(0.125), buf(&w)]);
            e.launch(kernel, grid_for(threads), &args).unwrap();
            bits(&e, &w, n)
        };
        let one = logits("attn_logits", n);
        let four = logits("attn_logits4", n / 4);
        assert_eq!(one, four, "d {d}");
        assert!(
            one.iter().all(|b| !f32::from_bits(*b).is_nan()),
            "every logit written (d {d})"
        );
        assert!(one.iter().any(|&b| b != 0));
    }
}

/// `attn_values4` (four heads and four columns a thread) against `attn_values`, for d = 44 and
/// 48, queries with no entry included.
#[test]
fn four_by_four_values_match_one_value_per_thread() {
    let e = EmuExecutor::default();
    for d in [44usize, 48] {
        let a = AttentionInputs::new(&e, 8, d, 11);
        let mut r = Rng::new(12);
        let rows = a.tokens * a.heads;
        let weights = upload(&e, &r.values(rows * a.emax, 1.0)).unwrap();
        let inv = upload(&e, &r.values(rows, 1.0)).unwrap();
        let n = rows * d;
        let values = |kernel: &str, threads: usize| {
            let out = upload(&e, &vec![f32::NAN; n]).unwrap();
            let mut args = vec![
                buf(&a.table),
                buf(&a.idx),
                buf(&a.count),
                buf(&weights),
                buf(&inv),
            ];
            args.extend(a.dims());
            args.push(buf(&out));
            e.launch(kernel, grid_for(threads), &args).unwrap();
            bits(&e, &out, n)
        };
        let one = values("attn_values", n);
        let sixteen = values("attn_values4", n / 16);
        assert_eq!(one, sixteen, "d {d}");
        assert!(
            one.iter().all(|b| !f32::from_bits(*b).is_nan()),
            "every value written (d {d})"
        );
        assert!(one.iter().any(|&b| b != 0));
    }
}

/// Batched GEMMs (`Gemm::batch`, strides) and `w` stored `[k, n]` (`Gemm::w_kn`), as the
/// GEMM attention path uses them, against plain loops; a batch reaching past its buffer is
/// refused, as is an offset that is not a whole number of elements.
#[test]
fn batched_and_kn_gemms_match_loops() {
    use needlescope::backend::gpu::executor::Gemm;
    use needlescope::backend::gpu::GemmType;
    let e = EmuExecutor::default();
    let (batch, m, n, k) = (3usize, 4usize, 5usize, 6usize);
    let mut r = Rng::new(4);
    let x = r.values(batch * m * k, 1.0);
    let w = r.values(batch * n * k, 1.0);
    let (xb, wb) = (upload(&e, &x).unwrap(), upload(&e, &w).unwrap());
    for w_kn in [false, true] {
        let mut y = e.alloc(batch * m * n * 4).unwrap();
        let g = Gemm {
            batch,
            stride_x: m * k,
            stride_w: n * k,
            stride_y: m * n,
            w_kn,
            ldw: if w_kn { n } else { k },
            ..Gemm::dense(m, n, k, GemmType::F32)
        };
        e.gemm(&g, &xb, &wb, &mut y).unwrap();
        let mut got = vec![0f32; batch * m * n];
        download(&e, &y, &mut got).unwrap();
        for b in 0..batch {
            for i in 0..m {
                for j in 0..n {
                    let want: f32 = (0..k)
                        .map(|l| {
                            let wv = if w_kn {
                                w[b * n * k + l * n + j]
                            } else {
                                w[b * n * k + j * k + l]
                            };
                            x[b * m * k + i * k + l] * wv
                        })
                        .sum();
                    let g = got[b * m * n + i * n + j];
                    assert!(
                        (g - want).abs() <= 1e-5 * want.abs().max(1.0),
                        "{w_kn} {b} {i} {j}"
                    );
                }
            }
        }
        let too_far = Gemm {
            batch: batch + 1,
            ..g
        };
        assert!(
            e.gemm(&too_far, &xb, &wb, &mut y).is_err(),
            "a batch past the buffers"
        );
        // An offset inside an element would fault on a GPU: refused here too.
        for misaligned in [
            Gemm { x_offset: 2, ..g },
            Gemm { w_offset: 1, ..g },
            Gemm { y_offset: 2, ..g },
        ] {
            let err = e.gemm(&misaligned, &xb, &wb, &mut y).unwrap_err();
            assert!(
                err.to_string().contains("whole number of elements"),
                "{err}"
            );
        }
    }
}

/// `moe_sum_rows` (slot values read through a row map, the experts' grouped outputs) sums each
/// token's slots in slot order from 0, the CPU's formula, bit for bit.
#[test]
fn summing_through_a_row_map_matches_the_slot_order_sum() {
    let e = EmuExecutor::default();
    let (tokens, k, d) = (37usize, 6usize, 24usize);
    let slots = tokens * k;
    let per_slot = Rng::new(41).values(slots * d, 3.0);
    // A permutation: slot s lives in row perm[s] of the grouped buffer.
    let mut perm: Vec<usize> = (0..slots).collect();
    let mut r = Rng::new(42);
    for i in (1..slots).rev() {
        let j = (r.values(1, 1.0)[0].abs() * (i + 1) as f32) as usize % (i + 1);
        perm.swap(i, j);
    }
    assert!(perm.iter().enumerate().any(|(s, &p)| s != p));
    let mut grouped = vec![0f32; slots * d];
    for (s, &row) in perm.iter().enumerate() {
        grouped[row * d..(row + 1) * d].copy_from_slice(&per_slot[s * d..(s + 1) * d]);
    }
    let row_of_slot: Vec<i32> = perm.iter().map(|&r| r as i32).collect();
    let (gr, map) = (
        upload(&e, &grouped).unwrap(),
        upload(&e, &row_of_slot).unwrap(),
    );
    let out = e.alloc(tokens * d * 4).unwrap();
    let [t_, k_, d_] = [tokens as i64, k as i64, d as i64].map(Arg::I64);
    e.launch(
        "moe_sum_rows",
        grid_for(tokens * d),
        &[buf(&gr), buf(&map), t_, k_, d_, buf(&out)],
    )
    .unwrap();
    let mut got = vec![0f32; tokens * d];
    download(&e, &out, &mut got).unwrap();
    for t in 0..tokens {
        for c in 0..d {
            let mut want = 0.0f32;
            for s in 0..k {
                want += per_slot[(t * k + s) * d + c];
            }
            assert_eq!(
                got[t * d + c].to_bits(),
                want.to_bits(),
                "token {t} channel {c}"
            );
        }
    }
}
