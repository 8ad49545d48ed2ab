//! Checks every executor runs before touching device memory: a kernel launch's arguments
//! against the kernel's C signature ([`signature_of`], [`arg_slots`]), a GEMM's dimensions,
//! offsets and alignment against its buffers ([`check_gemm`]), a copy's range
//! ([`check_range`]), and that every buffer belongs to the executor running the operation
//! ([`check_owned`]). On a GPU each mistake would be undefined behaviour or a poisoned context;
//! here it is a [`GpuError`] naming the kernel or GEMM.

use super::executor::{Arg, Gemm, GpuError};

/// The argument signature of a kernel as the host emulator compiled it (`p` pointer, `i` int,
/// `u` unsigned, `l` long long, `U` unsigned long long, `f` float), or None for an unknown name.
/// Both executors check launches against it.
pub fn signature_of(kernel: &str) -> Option<&'static str> {
    super::emu::kernel_table()
        .iter()
        .find(|(n, _)| n == kernel)
        .map(|(_, s)| s.as_str())
}

/// Checks `args` against the kernel's signature.
pub fn check_args<B>(kernel: &str, args: &[Arg<'_, B>]) -> Result<(), GpuError> {
    let want = signature_of(kernel).ok_or_else(|| GpuError::Launch {
        kernel: kernel.into(),
        why: "no such kernel in kernels/*.cu".into(),
    })?;
    let got: String = args.iter().map(|a| a.code()).collect();
    if got != want {
        return Err(GpuError::Launch {
            kernel: kernel.into(),
            why: format!("argument types {got:?} do not match the kernel signature {want:?}"),
        });
    }
    Ok(())
}

/// The single products of [`Executor::gemm_each_weight`](super::executor::Executor::gemm_each_weight): product `b` with its own `x`, `w`
/// and `y` offsets (bytes), `batch` 1. Refuses a batch that does not match the weights or a
/// `w_kn` layout.
pub fn per_weight_products<B>(g: &Gemm, ws: &[(&B, usize)]) -> Result<Vec<Gemm>, GpuError> {
    if g.batch != ws.len() || g.w_kn {
        return Err(GpuError::Other(format!(
            "gemm_each_weight: batch {} for {} weights (w_kn {})",
            g.batch,
            ws.len(),
            g.w_kn
        )));
    }
    let es = g.ty.bytes();
    Ok(ws
        .iter()
        .enumerate()
        .map(|(b, &(_, w_offset))| Gemm {
            x_offset: g.x_offset + b * g.stride_x * es,
            w_offset,
            y_offset: g.y_offset + b * g.stride_y * 4,
            batch: 1,
            stride_x: 0,
            stride_w: 0,
            stride_y: 0,
            ..*g
        })
        .collect())
}

/// Checks a GEMM against its buffers' sizes (bytes) before it runs, on every executor: on a GPU
/// a wrong offset or leading dimension would corrupt memory or poison the context instead of
/// failing here. Also refuses an empty inner dimension (cuBLAS rejects `k = 0`).
pub fn check_gemm(g: &Gemm, x_len: usize, w_len: usize, y_len: usize) -> Result<(), GpuError> {
    let bad = |why: String| Err(GpuError::Other(format!("gemm {g:?}: {why}")));
    if g.k == 0 {
        return bad("empty inner dimension".into());
    }
    // w's stored rows and row length.
    let (w_rows, w_cols) = if g.w_kn { (g.k, g.n) } else { (g.n, g.k) };
    if g.ldx < g.k || g.ldw < w_cols.max(1) || g.ldy < g.n.max(1) {
        return bad("a leading dimension is smaller than its row".into());
    }
    if g.batch == 0 {
        return bad("an empty batch".into());
    }
    // cuBLAS takes every dimension as a 32-bit int.
    if [g.m, g.n, g.k, g.ldx, g.ldw, g.ldy, g.batch]
        .iter()
        .any(|&v| i32::try_from(v).is_err())
    {
        return bad("a dimension does not fit cuBLAS's 32-bit int".into());
    }
    // A misaligned operand faults on the device (and poisons its context) where the emulator,
    // which reads bytes, would not notice: offsets must be whole elements.
    let es = g.ty.bytes();
    if !g.x_offset.is_multiple_of(es)
        || !g.w_offset.is_multiple_of(es)
        || !g.y_offset.is_multiple_of(4)
    {
        return bad(format!(
            "an offset is not a whole number of elements (x and w: {es} bytes, y: 4)"
        ));
    }
    let b = g.batch - 1;
    let need = |off: usize, stride: usize, rows: usize, ld: usize, cols: usize, es: usize| {
        if rows == 0 {
            off
        } else {
            off + (b * stride + (rows - 1) * ld + cols) * es
        }
    };
    for (what, end, len) in [
        (
            "x",
            need(g.x_offset, g.stride_x, g.m, g.ldx, g.k, es),
            x_len,
        ),
        (
            "w",
            need(g.w_offset, g.stride_w, w_rows, g.ldw, w_cols, es),
            w_len,
        ),
        ("y", need(g.y_offset, g.stride_y, g.m, g.ldy, g.n, 4), y_len),
    ] {
        if end > len {
            return bad(format!("{what} needs {end} bytes, its buffer has {len}"));
        }
    }
    Ok(())
}

/// Checks that `n` bytes at `offset` lie inside a buffer of `len` bytes (`what`: read / write).
pub fn check_range(what: &str, offset: usize, n: usize, len: usize) -> Result<(), GpuError> {
    if offset.checked_add(n).is_none_or(|end| end > len) {
        return Err(GpuError::Other(format!(
            "{what} of {n} bytes at {offset} past a {len}-byte buffer"
        )));
    }
    Ok(())
}

/// Checks that every buffer an operation touches is one of the executor's own (`owned`): on a
/// GPU a pointer into another device's memory is an illegal address that poisons the context
/// (or, with peer access, a silent slow read), and the emulator's devices share host memory,
/// so only this check catches an op that mixes devices. `what` names the operation and the
/// executor (called only for the error); `bufs` are the operation's buffers in argument order.
/// A launch's arguments are checked by [`arg_slots`].
pub fn check_owned<'b, B: 'b>(
    what: impl FnOnce() -> String,
    bufs: impl IntoIterator<Item = &'b B>,
    owned: impl Fn(&B) -> bool,
) -> Result<(), GpuError> {
    match bufs.into_iter().position(|b| !owned(b)) {
        None => Ok(()),
        Some(i) => Err(GpuError::Other(format!(
            "{}: its buffer #{i} belongs to another device",
            what()
        ))),
    }
}

/// The 8-byte launch slots of `args` (cuLaunchKernel's convention: parameter i points at slot
/// i; 4-byte values sit in the low bytes, little-endian). `address(buf)` gives a buffer's base
/// address and length, or `None` when the buffer is another device's (see [`check_owned`]);
/// such a buffer and offsets past the end are errors. Checks the signature first.
pub fn arg_slots<B>(
    kernel: &str,
    args: &[Arg<'_, B>],
    address: impl Fn(&B) -> Option<(u64, usize)>,
) -> Result<Vec<u64>, GpuError> {
    check_args(kernel, args)?;
    args.iter()
        .enumerate()
        .map(|(i, a)| {
            Ok(match *a {
                Arg::Buf(b, off) => {
                    let Some((base, len)) = address(b) else {
                        return Err(GpuError::Launch {
                            kernel: kernel.into(),
                            why: format!("argument #{i} is a buffer of another device"),
                        });
                    };
                    if off > len {
                        return Err(GpuError::Launch {
                            kernel: kernel.into(),
                            why: format!("offset {off} past a {len}-byte buffer"),
                        });
                    }
                    base + off as u64
                }
                Arg::Null => 0,
                Arg::I32(v) => v as u32 as u64,
                Arg::U32(v) => v as u64,
                Arg::I64(v) => v as u64,
                Arg::F32(v) => v.to_bits() as u64,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::gpu::executor::GemmType;

    #[test]
    fn gemm_dimensions_must_fit_cublas_ints() {
        let ok = Gemm::dense(4, 3, 2, GemmType::F32);
        assert!(check_gemm(&ok, 4 * 2 * 4, 3 * 2 * 4, 4 * 3 * 4).is_ok());
        // 2^31 rows of one column: the buffers are big enough, cuBLAS's int is not.
        let rows = 1usize << 31;
        let big = Gemm::dense(rows, 1, 1, GemmType::F32);
        let e = check_gemm(&big, rows * 4, 4, rows * 4).unwrap_err();
        assert!(e.to_string().contains("32-bit"), "{e}");
    }
}
