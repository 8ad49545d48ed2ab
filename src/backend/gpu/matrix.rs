//! Weights on the device in their stored format, and the products with them.
//!
//! A [`GpuMatrix`] keeps the checkpoint's bytes as they are (bf16, f32, FP8 e4m3 with e8m0
//! 128x128 block scales, FP4 e2m1 with e8m0 1x32 group scales, NVFP4 e2m1 with e4m3 1x16 scales
//! and an f32 global scale). A product dequantises the weight a band of rows at a time
//! (`kernels/dequant.cu`) into a workspace of the GEMM's element type and runs one cuBLAS GEMM per
//! band with f32 accumulation: at most [`WORKSPACE_BYTES`] of decoded weight exist at once.
//!
//! A narrow product over a long inner dimension (the mHC mixes, n = 24, k = 16,384) is cut
//! along k into parts run as one strided-batched GEMM and summed in order ([`gemm_split_k`]),
//! so it spreads over the GPU instead of occupying a handful of SMs.
//!
//! With [`GemmType::F32`] the dequantised weights equal the CPU decode bit for bit and only the
//! GEMM's summation order differs from the reference. With [`GemmType::Bf16`] activations are
//! rounded to bf16 (ties to even) and so are decoded weights (exact for bf16, FP8 and FP4 values;
//! NVFP4 values times their f32 global scale may round), as in the serving engines.

use super::executor::{buf, grid_for, upload, Arg, Executor, Gemm, GemmType, GpuError};
use super::{Act, GpuBackend};
use crate::checkpoint::linear::{LinearForm, QuantWeight, SharedLinear};
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// Most bytes of decoded weight a product materialises at once.
pub const WORKSPACE_BYTES: usize = 256 << 20;

/// A weight `[rows, cols]` resident on one device in its stored format.
pub struct GpuMatrix<B> {
    pub rows: usize,
    pub cols: usize,
    /// Index of the device (in the backend's device list) holding it.
    pub device: usize,
    pub form: LinearForm,
    /// Codes / values as stored; None when the upload failed (the failure is recorded).
    pub data: Option<B>,
    /// Scales (FP8 / FP4 / NVFP4 formats).
    pub scale: Option<B>,
    /// The decoded copy products may keep (see [the decoded copies below]).
    pub decode: DecodeSlot<B>,
}

impl<B> GpuMatrix<B> {
    fn data(&self) -> Result<&B, GpuError> {
        self.data
            .as_ref()
            .ok_or_else(|| GpuError::Other("weight was not uploaded (see the first error)".into()))
    }

    /// The same weight, its decoded copy (when made) counted against `budget`.
    pub fn with_decode_budget(mut self, budget: Option<Arc<DecodeBudget>>) -> Self {
        self.decode = DecodeSlot::new(budget);
        self
    }

    fn scale(&self) -> Result<&B, GpuError> {
        self.scale
            .as_ref()
            .ok_or_else(|| GpuError::Other("weight scales missing on the device".into()))
    }
}

/// A decoded f32 matrix `[rows, cols]` already uploaded to device `device` (`data` None when
/// the upload failed and was recorded).
pub fn decoded<B>(data: Option<B>, rows: usize, cols: usize, device: usize) -> GpuMatrix<B> {
    GpuMatrix {
        rows,
        cols,
        device,
        form: LinearForm::F32,
        data,
        scale: None,
        decode: DecodeSlot::default(),
    }
}

/// Rows `rows` of `table` decoded into `out [rows.len(), cols]` (see
/// [`crate::backend::Backend::gather_rows`]), on the table's device.
pub fn gather_rows<E: Executor>(
    g: &GpuBackend<E>,
    table: &GpuMatrix<E::Buf>,
    rows: &[usize],
    out: &mut Act<E>,
) -> Result<(), GpuError> {
    assert_eq!(
        out.len(),
        rows.len() * table.cols,
        "gather_rows: out not [n, D]"
    );
    let e = g.dev_of(table);
    let ids: Vec<i32> = rows.iter().map(|&r| r as i32).collect();
    let ids = upload(e, &ids)?;
    let o = g.output(out, table.device)?;
    dequant_rows(e, table, Some(&ids), 0, rows.len(), o, GemmType::F32)
}

/// Uploads a linear weight in its stored format (bytes and scales as they are) to device `e`,
/// index `device` of the backend.
pub fn upload_stored<E: Executor>(
    e: &E,
    device: usize,
    w: &SharedLinear,
) -> Result<GpuMatrix<E::Buf>, GpuError> {
    let view = w.view();
    let (data, scale): (&[u8], Option<&[u8]>) = match view {
        QuantWeight::Bf16 { data, .. } | QuantWeight::F32 { data, .. } => (data, None),
        QuantWeight::Fp8Block { weight, scale, .. } => (weight, Some(scale)),
        QuantWeight::Fp4Group { packed, scale, .. } | QuantWeight::Nvfp4 { packed, scale, .. } => {
            (packed, Some(scale))
        }
    };
    Ok(GpuMatrix {
        rows: w.rows(),
        cols: w.cols(),
        device,
        form: view.form(),
        data: Some(upload(e, data)?),
        scale: scale.map(|s| upload(e, s)).transpose()?,
        decode: DecodeSlot::default(),
    })
}

/// Dequantises rows of `w` into `out` (`[nrows, cols]` of `ty`): rows `ids[i]` when `ids` is
/// given (i32 row numbers on the device), else rows `r0..r0 + nrows`.
pub fn dequant_rows<E: Executor>(
    e: &E,
    w: &GpuMatrix<E::Buf>,
    ids: Option<&E::Buf>,
    r0: usize,
    nrows: usize,
    out: &E::Buf,
    ty: GemmType,
) -> Result<(), GpuError> {
    if nrows == 0 || w.cols == 0 {
        return Ok(());
    }
    let ids_arg = ids.map_or(Arg::Null, buf);
    let tail = [
        ids_arg,
        Arg::I64(r0 as i64),
        Arg::I64(nrows as i64),
        Arg::I64(w.cols as i64),
        buf(out),
        Arg::I32((ty == GemmType::Bf16) as i32),
    ];
    // The packed FP4 forms take eight values per thread when rows split into whole eights
    // sharing a scale (every real checkpoint: groups of 32 / 16).
    let by_eight = w.cols % 8 == 0
        && match w.form {
            LinearForm::Fp4Group { group } => group % 8 == 0,
            LinearForm::Nvfp4 { .. } => true,
            _ => false,
        };
    let grid = grid_for(nrows * w.cols / if by_eight { 8 } else { 1 });
    let data = w.data()?;
    let mut args: Vec<Arg<'_, E::Buf>> = vec![buf(data)];
    let kernel = match w.form {
        LinearForm::Bf16 => "dequant_bf16",
        LinearForm::F32 => "dequant_f32",
        LinearForm::Fp8Block { block } => {
            args.extend([
                buf(w.scale()?),
                Arg::I64(block.0 as i64),
                Arg::I64(block.1 as i64),
            ]);
            "dequant_fp8_block"
        }
        LinearForm::Fp4Group { group } => {
            args.extend([buf(w.scale()?), Arg::I64(group as i64)]);
            if by_eight {
                "dequant_fp4_group8"
            } else {
                "dequant_fp4_group"
            }
        }
        LinearForm::Nvfp4 { scale_2 } => {
            args.extend([buf(w.scale()?), Arg::F32(scale_2)]);
            if by_eight {
                "dequant_nvfp4_8"
            } else {
                "dequant_nvfp4"
            }
        }
    };
    args.extend(tail);
    e.launch(kernel, grid, &args)
}

/// Converts `n` f32 values of `x` to the GEMM type: `x` itself for f32, a new bf16 buffer else.
pub fn to_gemm_type<'a, E: Executor>(
    e: &E,
    x: &'a E::Buf,
    n: usize,
    ty: GemmType,
    scratch: &'a mut Option<E::Buf>,
) -> Result<&'a E::Buf, GpuError> {
    to_gemm_type_at(e, x, 0, n, ty, scratch).map(|(b, _)| b)
}

/// [`to_gemm_type`] of the `n` values from byte `at` of `x`: the operand and the byte offset of
/// those values in it (`at` for f32, 0 for a new bf16 buffer).
pub fn to_gemm_type_at<'a, E: Executor>(
    e: &E,
    x: &'a E::Buf,
    at: usize,
    n: usize,
    ty: GemmType,
    scratch: &'a mut Option<E::Buf>,
) -> Result<(&'a E::Buf, usize), GpuError> {
    match ty {
        GemmType::F32 => Ok((x, at)),
        GemmType::Bf16 => {
            let y = e.alloc_uninit(n * 2)?;
            if n > 0 {
                e.launch(
                    "f32_to_bf16",
                    grid_for(n),
                    &[Arg::Buf(x, at), buf(&y), Arg::I64(n as i64)],
                )?;
            }
            Ok((scratch.insert(y), 0))
        }
    }
}

/// Device operands of one product with a weight.
pub struct WeightProduct<'a, B> {
    /// Activations of the GEMM type, `m` rows with leading dimension `ldx`, from byte `x_offset`.
    pub x: &'a B,
    pub x_offset: usize,
    pub ldx: usize,
    pub m: usize,
    /// f32 output, leading dimension `ldy`, from byte `y_offset`; output column j is weight row
    /// `rows.start + j`.
    pub y: &'a mut B,
    pub y_offset: usize,
    pub ldy: usize,
}

/// `y[:, j] = x · W[rows.start + j]ᵀ` for the weight rows `rows`, banded through a workspace.
pub fn gemm_weight<E: Executor>(
    e: &E,
    ty: GemmType,
    w: &GpuMatrix<E::Buf>,
    rows: Range<usize>,
    p: WeightProduct<'_, E::Buf>,
) -> Result<(), GpuError> {
    if p.m == 0 || rows.is_empty() {
        return Ok(());
    }
    let es = ty.bytes();
    let product = |n: usize, w_offset: usize, y_offset: usize| Gemm {
        m: p.m,
        n,
        k: w.cols,
        ty,
        x_offset: p.x_offset,
        ldx: p.ldx,
        w_offset,
        ldw: w.cols,
        y_offset,
        ldy: p.ldy,
        accumulate: false,
        ..Gemm::dense(0, 0, 0, ty)
    };
    if let Some(whole) = resident_operand(e, w, ty)? {
        let g = product(rows.len(), rows.start * w.cols * es, p.y_offset);
        return match split_k_parts(p.m, rows.len(), w.cols) {
            Some(parts) => gemm_split_k(e, &g, parts, p.x, whole, p.y),
            None => e.gemm(&g, p.x, whole, p.y),
        };
    }
    let band = (WORKSPACE_BYTES / (w.cols.max(1) * es)).clamp(1, rows.len());
    // Every band's rows are decoded before its GEMM reads them: no zero fill.
    let work = e.alloc_uninit(band * w.cols * es)?;
    let mut r = rows.start;
    while r < rows.end {
        let n = band.min(rows.end - r);
        dequant_rows(e, w, None, r, n, &work, ty)?;
        let g = product(n, 0, p.y_offset + (r - rows.start) * 4);
        e.gemm(&g, p.x, &work, p.y)?;
        r += n;
    }
    Ok(())
}

/// Fewest inner-dimension elements of one split-K part.
const SPLIT_K_MIN: usize = 1024;

/// How many parts [`gemm_split_k`] cuts the inner dimension of an `[m, k] x [k, n]` product
/// into, or None to run it whole. A narrow output (n <= 64: the mHC mixes' 24 columns, the
/// indexer's 64 head weights) over a long inner dimension gives cuBLAS too few output tiles to
/// spread over the SMs (an H200 took 3.75 ms for the mixes' [2048, 16384] x [16384, 24] in
/// f32, 25x what reading the operands costs); cut into parts of at least `SPLIT_K_MIN` it is
/// up to 16 times as many independent tiles.
pub fn split_k_parts(m: usize, n: usize, k: usize) -> Option<usize> {
    if n > 64 || m == 0 {
        return None;
    }
    let parts = (1..=16usize)
        .rev()
        .find(|&p| k.is_multiple_of(p) && k / p >= SPLIT_K_MIN)?;
    (parts > 1).then_some(parts)
}

/// One product `g` (batch 1, no accumulation) as `parts` products over slices of its inner
/// dimension (one strided-batched GEMM into an f32 workspace `[parts, m, n]`), then
/// `el_sum_parts` adds the parts in order into `g`'s output. The same values as the whole
/// product up to the f32 summation order.
pub fn gemm_split_k<E: Executor>(
    e: &E,
    g: &Gemm,
    parts: usize,
    x: &E::Buf,
    w: &E::Buf,
    y: &mut E::Buf,
) -> Result<(), GpuError> {
    assert!(
        g.batch == 1 && !g.accumulate && !g.w_kn && g.k.is_multiple_of(parts),
        "split-K of {g:?} in {parts}"
    );
    let kp = g.k / parts;
    let (m, n) = (g.m, g.n);
    // The batched GEMM writes every part.
    let mut partial = e.alloc_uninit(parts * m * n * 4)?;
    let split = Gemm {
        k: kp,
        y_offset: 0,
        ldy: n,
        batch: parts,
        stride_x: kp,
        stride_w: kp,
        stride_y: m * n,
        ..*g
    };
    e.gemm(&split, x, w, &mut partial)?;
    e.launch(
        "el_sum_parts",
        grid_for(m * n),
        &[
            buf(&partial),
            Arg::Buf(&*y, g.y_offset),
            Arg::I64(parts as i64),
            Arg::I64(m as i64),
            Arg::I64(n as i64),
            Arg::I64(g.ldy as i64),
        ],
    )
}

/// Dense product of device activations `x [m, cols]` (f32) with all rows of `w` into the f32
/// buffer `y [m, rows]` (all of it written).
pub fn matmul_into<E: Executor>(
    e: &E,
    ty: GemmType,
    x: &E::Buf,
    m: usize,
    w: &GpuMatrix<E::Buf>,
    y: &mut E::Buf,
) -> Result<(), GpuError> {
    let mut scratch = None;
    let xg = to_gemm_type(e, x, m * w.cols, ty, &mut scratch)?;
    gemm_weight(
        e,
        ty,
        w,
        0..w.rows,
        WeightProduct {
            x: xg,
            x_offset: 0,
            ldx: w.cols,
            m,
            y,
            y_offset: 0,
            ldy: w.rows,
        },
    )
}

/// [`matmul_into`] a new buffer.
pub fn matmul_device<E: Executor>(
    e: &E,
    ty: GemmType,
    x: &E::Buf,
    m: usize,
    w: &GpuMatrix<E::Buf>,
) -> Result<E::Buf, GpuError> {
    // The product overwrites all of it.
    let mut y = e.alloc_uninit(m * w.rows * 4)?;
    matmul_into(e, ty, x, m, w, &mut y)?;
    Ok(y)
}

/// Grouped product (`wo_a`): `x [m, G·in]` (f32, device), `w [G·out, in]`; group g of every row
/// times rows `g·out..(g+1)·out`, into the f32 buffer `y [m, G·out]` (all of it written).
pub fn matmul_grouped_into<E: Executor>(
    e: &E,
    ty: GemmType,
    x: &E::Buf,
    m: usize,
    groups: usize,
    w: &GpuMatrix<E::Buf>,
    y: &mut E::Buf,
) -> Result<(), GpuError> {
    let (out, input) = (w.rows / groups, w.cols);
    let mut scratch = None;
    let xg = to_gemm_type(e, x, m * groups * input, ty, &mut scratch)?;
    for g in 0..groups {
        gemm_weight(
            e,
            ty,
            w,
            g * out..(g + 1) * out,
            WeightProduct {
                x: xg,
                x_offset: g * input * ty.bytes(),
                ldx: groups * input,
                m,
                y: &mut *y,
                y_offset: g * out * 4,
                ldy: w.rows,
            },
        )?;
    }
    Ok(())
}

/// Achieved TFLOP/s of one device GEMM `[m, k] x [n, k]ᵀ` of `ty` operands with f32 output,
/// operands already resident (one warm-up, then the mean of `reps` timed runs): the reference
/// the benchmark compares its layers against.
pub fn gemm_tflops<E: Executor>(
    e: &E,
    m: usize,
    n: usize,
    k: usize,
    ty: GemmType,
    reps: usize,
) -> Result<f64, GpuError> {
    // Random-looking operands: all-zero ones run measurably faster on tensor cores.
    let filled = |count: usize, seed: u32| -> Result<E::Buf, GpuError> {
        let mut s = seed | 1;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 2001) as f32 / 1000.0 - 1.0
        };
        match ty {
            GemmType::F32 => upload(e, &(0..count).map(|_| next()).collect::<Vec<f32>>()),
            GemmType::Bf16 => upload(
                e,
                &(0..count)
                    .map(|_| (next().to_bits() >> 16) as u16)
                    .collect::<Vec<u16>>(),
            ),
        }
    };
    let x = filled(m * k, 7)?;
    let w = filled(n * k, 11)?;
    let mut y = e.alloc(m * n * 4)?;
    let g = Gemm::dense(m, n, k, ty);
    e.gemm(&g, &x, &w, &mut y)?;
    e.synchronize()?;
    let t0 = std::time::Instant::now();
    for _ in 0..reps.max(1) {
        e.gemm(&g, &x, &w, &mut y)?;
    }
    e.synchronize()?;
    let secs = t0.elapsed().as_secs_f64() / reps.max(1) as f64;
    Ok(2.0 * (m * n * k) as f64 / secs.max(1e-12) / 1e12)
}

// ---------------------------------------------------------------------------------------------
// Decoded copies of stored weights kept on the device, so that a weight used by every chunk of a
// prefill (and by every prompt of a sweep) is dequantised once instead of once per product.
//
// A product with a [`GpuMatrix`] reads, in this order of preference:
// 1. the stored bytes themselves when they already are the GEMM's element type (bf16 weights
// with [`GemmType::Bf16`], f32 ones with [`GemmType::F32`]): no copy, no decode;
// 2. the weight's decoded copy `[rows, cols]` in the GEMM type, made on its first product when
// the device's [`DecodeBudget`] has room (the dequantisation is the banded path's, so the
// copy holds the same values bit for bit);
// 3. otherwise the banded path of [`super::matrix::gemm_weight`] (decode a band into a
// workspace, one GEMM per band), as before.
//
// The budget of a device is what the memory plan leaves free there once weights, sequence state
// for the run's context and workspace are counted, less a margin ([`headroom_budget`]), so the
// plan's promise (no out-of-memory midway) holds with copies as without. A copy that does not
// fit the budget, or whose allocation fails anyway, is simply not made: the weight keeps the
// banded path. Copies are made first come, first served, and freed with their weight. A copy is
// charged what its allocation takes on the device ([`Executor::footprint`]: its buffer pool's size
// class), not its values' bytes, so the budget bounds the device memory the copies really hold.

/// Bytes of one device's memory that decoded copies may take.
#[derive(Debug)]
pub struct DecodeBudget {
    limit: usize,
    used: AtomicUsize,
    copies: AtomicUsize,
}

impl DecodeBudget {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(DecodeBudget {
            limit,
            used: AtomicUsize::new(0),
            copies: AtomicUsize::new(0),
        })
    }

    /// Takes `bytes` from the budget; false (and nothing taken) when they do not fit.
    fn reserve(&self, bytes: usize) -> bool {
        let taken = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&u| u <= self.limit)
            })
            .is_ok();
        if taken {
            self.copies.fetch_add(1, Ordering::Relaxed);
        }
        taken
    }

    fn release(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
        self.copies.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes held by decoded copies now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// Decoded copies held now.
    pub fn copies(&self) -> usize {
        self.copies.load(Ordering::Relaxed)
    }
}

/// The budget for decoded copies on a device the memory plan leaves `plan_free` bytes free on
/// (capacity `capacity`): that less a margin of max(2 GiB, 5% of the capacity) for what the plan
/// does not itemise (CUDA context, cuBLAS and NVRTC modules, allocation granularity), capped by
/// `cap` ([`GpuSwitches::decode_cache_bytes`](super::GpuSwitches::decode_cache_bytes)) when
/// given.
pub fn headroom_budget(plan_free: i64, capacity: u64, cap: Option<usize>) -> usize {
    let margin = (2u64 << 30).max(capacity / 20);
    let headroom = (plan_free.max(0) as u64).saturating_sub(margin) as usize;
    cap.map_or(headroom, |c| headroom.min(c))
}

/// A decoded copy of a whole weight in one GEMM type.
struct DecodedCopy<B> {
    ty: GemmType,
    buf: B,
    bytes: usize,
}

/// A weight's decoded copy, made on first use when its device's budget allows.
pub struct DecodeSlot<B> {
    budget: Option<Arc<DecodeBudget>>,
    /// Set on the first product: `None` when no copy could be made (the banded path is used).
    copy: OnceLock<Option<DecodedCopy<B>>>,
}

impl<B> Default for DecodeSlot<B> {
    fn default() -> Self {
        DecodeSlot {
            budget: None,
            copy: OnceLock::new(),
        }
    }
}

impl<B> DecodeSlot<B> {
    /// A slot that may make a copy within `budget` (none: never).
    pub fn new(budget: Option<Arc<DecodeBudget>>) -> Self {
        DecodeSlot {
            budget,
            copy: OnceLock::new(),
        }
    }

    /// Whether the weight's decoded copy exists.
    pub fn is_resident(&self) -> bool {
        matches!(self.copy.get(), Some(Some(_)))
    }
}

impl<B> Drop for DecodeSlot<B> {
    fn drop(&mut self) {
        if let (Some(budget), Some(Some(copy))) = (&self.budget, self.copy.get()) {
            budget.release(copy.bytes);
        }
    }
}

/// The operand a GEMM of type `ty` can read all of `w` from without decoding it again: its
/// stored bytes when they are of type `ty`, else its decoded copy (made now if this is the first
/// product and the budget allows). `None`: decode band by band.
pub fn resident_operand<'a, E: Executor>(
    e: &E,
    w: &'a GpuMatrix<E::Buf>,
    ty: GemmType,
) -> Result<Option<&'a E::Buf>, GpuError> {
    let stored_as_gemm_type = matches!(
        (w.form, ty),
        (LinearForm::Bf16, GemmType::Bf16) | (LinearForm::F32, GemmType::F32)
    );
    if stored_as_gemm_type {
        return w.data.as_ref().map(Some).ok_or_else(|| {
            GpuError::Other("weight was not uploaded (see the first error)".into())
        });
    }
    let Some(budget) = &w.decode.budget else {
        return Ok(None);
    };
    let copy = w.decode.copy.get_or_init(|| {
        let values_bytes = w.rows * w.cols * ty.bytes();
        // Charged at what the allocation takes on the device (its pool size class).
        let bytes = e.footprint(values_bytes);
        if values_bytes == 0 || !budget.reserve(bytes) {
            return None;
        }
        let made = e.alloc_uninit(values_bytes).and_then(|buf| {
            dequant_rows(e, w, None, 0, w.rows, &buf, ty)?;
            Ok(buf)
        });
        match made {
            Ok(buf) => Some(DecodedCopy { ty, buf, bytes }),
            Err(_) => {
                budget.release(bytes);
                None
            }
        }
    });
    Ok(copy.as_ref().filter(|c| c.ty == ty).map(|c| &c.buf))
}

#[cfg(test)]
mod decoded_tests {
    use super::*;

    #[test]
    fn budget_takes_what_fits_and_gives_back() {
        let b = DecodeBudget::new(100);
        assert!(b.reserve(60));
        assert!(!b.reserve(50), "over the limit: nothing taken");
        assert_eq!((b.used(), b.copies()), (60, 1));
        assert!(b.reserve(40));
        b.release(60);
        assert_eq!((b.used(), b.copies()), (40, 1));
    }

    #[test]
    fn headroom_keeps_a_margin_and_obeys_the_cap() {
        let gib = 1i64 << 30;
        // 80 GiB device, 30 GiB left by the plan: margin 4 GiB (5%).
        let cap = 80u64 << 30;
        assert_eq!(headroom_budget(30 * gib, cap, None), 26 << 30);
        // Small device: the 2 GiB floor.
        assert_eq!(headroom_budget(3 * gib, 8 << 30, None), 1 << 30);
        assert_eq!(headroom_budget(gib, 8 << 30, None), 0);
        assert_eq!(headroom_budget(-gib, 8 << 30, None), 0);
        assert_eq!(headroom_budget(30 * gib, cap, Some(1 << 30)), 1 << 30);
        assert_eq!(headroom_budget(30 * gib, cap, Some(0)), 0);
        assert_eq!(
            headroom_budget(30 * gib, cap, Some(999_999 << 20)),
            26 << 30,
            "the cap never exceeds the plan's headroom"
        );
    }
}
