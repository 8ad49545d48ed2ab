//! The device layer under [`super::GpuBackend`]: memory, kernel launches and GEMMs.
//!
//! Two executors implement [`Executor`]: [`super::cuda::CudaExecutor`] (a real GPU through the
//! CUDA driver API, kernels compiled by NVRTC, GEMMs by cuBLAS) and [`super::emu::EmuExecutor`]
//! (the same kernel sources compiled for the host by build.rs, buffers in host memory, GEMMs in
//! f32 on the CPU). The backend's op logic (buffer layout, argument marshalling, the sequence of
//! kernels) is written once against this trait, so the emulator tests it on any machine; only
//! the transport (copies, launches, cuBLAS) is specific to the real device.
//!
//! Buffers are untyped byte allocations. Kernel arguments are a list of [`Arg`]s whose types are
//! checked against the kernel's C signature before every launch (see [`super::executor::signature_of`]), so a
//! marshalling mistake is an error, not undefined behaviour on the device.

// The device layer's error lives in its own file: the kernel compiler reports it too.
pub use super::error::GpuError;
pub use crate::backend::{MemoryUse, OpTime};
use std::sync::atomic::{AtomicU64, Ordering};

/// One kernel argument: a device pointer (buffer plus byte offset) or a scalar.
#[derive(Debug)]
pub enum Arg<'a, B> {
    Buf(&'a B, usize),
    /// A null pointer (optional inputs such as a missing row-id list).
    Null,
    I32(i32),
    U32(u32),
    I64(i64),
    F32(f32),
}

// Manual impls: an argument only borrows its buffer, so it is Copy whatever the buffer type.
impl<B> Clone for Arg<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B> Copy for Arg<'_, B> {}

impl<B> Arg<'_, B> {
    /// The signature code of this argument (matches build.rs's `ns_code`).
    pub fn code(&self) -> char {
        match self {
            Arg::Buf(..) | Arg::Null => 'p',
            Arg::I32(_) => 'i',
            Arg::U32(_) => 'u',
            Arg::I64(_) => 'l',
            Arg::F32(_) => 'f',
        }
    }
}

/// Shorthand for a buffer argument at offset 0.
pub fn buf<B>(b: &B) -> Arg<'_, B> {
    Arg::Buf(b, 0)
}

/// Element type of a GEMM operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmType {
    Bf16,
    F32,
}

impl GemmType {
    pub fn bytes(self) -> usize {
        match self {
            GemmType::Bf16 => 2,
            GemmType::F32 => 4,
        }
    }
}

/// `y[m, n] (+)= x[m, k] · w[n, k]ᵀ`, all row-major with leading dimensions (in elements) and
/// byte offsets into their buffers; `x` and `w` share `ty`, `y` is f32; accumulation in f32.
#[derive(Clone, Copy, Debug)]
pub struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub ty: GemmType,
    pub x_offset: usize,
    pub ldx: usize,
    pub w_offset: usize,
    pub ldw: usize,
    pub y_offset: usize,
    pub ldy: usize,
    /// Add into `y` (beta = 1) instead of overwriting it.
    pub accumulate: bool,
    /// Independent products of the same shape (cuBLAS's strided batch): product `b` reads `x`
    /// and `w` and writes `y` `b * stride_*` elements further on. 1 for a single product.
    pub batch: usize,
    pub stride_x: usize,
    pub stride_w: usize,
    pub stride_y: usize,
    /// `w` is stored `[k, n]` (row-major, `ldw >= n`) instead of `[n, k]`: `y = x · w`.
    pub w_kn: bool,
}

impl Gemm {
    /// A dense GEMM with packed operands: `x [m, k]`, `w [n, k]`, `y [m, n]`.
    pub fn dense(m: usize, n: usize, k: usize, ty: GemmType) -> Self {
        Gemm {
            m,
            n,
            k,
            ty,
            x_offset: 0,
            ldx: k,
            w_offset: 0,
            ldw: k,
            y_offset: 0,
            ldy: n,
            accumulate: false,
            batch: 1,
            stride_x: 0,
            stride_w: 0,
            stride_y: 0,
            w_kn: false,
        }
    }
}

/// Threads per block of every launch (kernels are written for any block size).
pub const BLOCK: u32 = 256;

/// A 1-D grid covering `n` independent work items with [`BLOCK`] threads per block (at least
/// one block; at most 65,535 blocks, the grid-stride loops cover the rest).
pub fn grid_for(n: usize) -> u32 {
    n.div_ceil(BLOCK as usize).clamp(1, 65_535) as u32
}

/// Memory, launches and GEMMs on one device.
pub trait Executor: Send + Sync {
    /// A device allocation of bytes.
    type Buf: Send + Sync;

    /// Backend name for reports (`cuda`, `cuda-emu`).
    const KIND: &'static str;

    /// Short name (`cuda:0`, `emu`).
    fn name(&self) -> String;

    /// A zero-filled allocation of `bytes` (at least 1).
    fn alloc(&self, bytes: usize) -> Result<Self::Buf, GpuError>;

    /// An allocation whose contents are undefined, for a caller that writes all of it before
    /// reading any (a dequant workspace): no fill on the device. The emulator fills it with
    /// 0xFF bytes (NaN as f32 and bf16), so a read of an unwritten element shows up in its tests.
    fn alloc_uninit(&self, bytes: usize) -> Result<Self::Buf, GpuError> {
        self.alloc(bytes)
    }

    /// Size in bytes of an allocation.
    fn len(&self, b: &Self::Buf) -> usize;

    /// Copies host bytes to `dst[offset..]`.
    fn write(&self, dst: &mut Self::Buf, offset: usize, src: &[u8]) -> Result<(), GpuError>;

    /// Copies `src[offset..offset + dst.len()]` to the host (waits for earlier work).
    fn read(&self, src: &Self::Buf, offset: usize, dst: &mut [u8]) -> Result<(), GpuError>;

    /// Launches `kernel` on `grid` blocks of [`BLOCK`] threads. The arguments are checked
    /// against the kernel's signature first.
    fn launch(&self, kernel: &str, grid: u32, args: &[Arg<'_, Self::Buf>]) -> Result<(), GpuError>;

    /// One GEMM (see [`Gemm`]): `x`, `w`, `y` are buffers, offsets in bytes.
    fn gemm(
        &self,
        g: &Gemm,
        x: &Self::Buf,
        w: &Self::Buf,
        y: &mut Self::Buf,
    ) -> Result<(), GpuError>;

    /// `ws.len()` products of one shape, each with its own weight (the routed experts of a MoE
    /// call as one GEMM): product `b` reads `x` from `b · g.stride_x` elements after
    /// `g.x_offset`, its weight `ws[b].0` from byte `ws[b].1` (`g.w_offset` and `g.stride_w`
    /// unused), and writes `y` from `b · g.stride_y` elements after `g.y_offset`. `g.batch`
    /// must equal `ws.len()`; `g.w_kn` must be false. The default runs them one by one.
    fn gemm_each_weight(
        &self,
        g: &Gemm,
        x: &Self::Buf,
        ws: &[(&Self::Buf, usize)],
        y: &mut Self::Buf,
    ) -> Result<(), GpuError> {
        for (p, (w, _)) in per_weight_products(g, ws)?.iter().zip(ws) {
            self.gemm(p, x, w, y)?;
        }
        Ok(())
    }

    /// Waits for all queued work.
    fn synchronize(&self) -> Result<(), GpuError>;

    /// Bytes free and total on the device.
    fn memory(&self) -> Result<(usize, usize), GpuError>;

    /// Bytes of device memory the executor's own buffers hold, now and at most so far (`None`
    /// when it does not count them).
    fn memory_use(&self) -> Option<MemoryUse> {
        None
    }

    /// Restarts the peaks of [`Executor::memory_use`] from the bytes held and in use now, so
    /// that they cover what follows alone (`bench`: one prefill). No-op when not counted.
    fn reset_memory_peaks(&self) {}

    /// The bytes an allocation of `bytes` takes on the device (its buffer pool's size class
    /// when the executor pools): what the decoded-copy budget charges a copy.
    fn footprint(&self, bytes: usize) -> usize {
        bytes
    }

    /// Bytes copied by [`Executor::write`] (host -> device) and [`Executor::read`] (device ->
    /// host) so far. Both executors count; a wrapper that does not forward it reports `(0, 0)`.
    fn transfer_bytes(&self) -> (u64, u64) {
        (0, 0)
    }

    /// Wall time per operation when `NEEDLESCOPE_PROFILE` is set ([`OpProfile`]); empty
    /// otherwise.
    fn op_profile(&self) -> Vec<OpTime> {
        Vec::new()
    }
}

/// Wall time per device operation (kernel name, GEMM shape, allocation, copy), collected when
/// the environment variable `NEEDLESCOPE_PROFILE` turns it on ([`GpuSwitches::profile`](super::GpuSwitches::profile)): each
/// timed operation is bracketed by device synchronisations, so a profiled run is slower than a
/// plain one and the times are each operation's own. `bench` prints the table (see
/// [`Executor::op_profile`]).
#[derive(Debug, Default)]
pub struct OpProfile {
    enabled: bool,
    rows: std::sync::Mutex<std::collections::BTreeMap<String, (u64, f64)>>,
}

impl OpProfile {
    /// On when `NEEDLESCOPE_PROFILE` says so ([`GpuSwitches::profile`](super::GpuSwitches::profile); a bad value counts as
    /// off here, the commands refuse it first).
    pub fn from_env() -> Self {
        Self::new(super::GpuSwitches::or_default().profile)
    }

    pub fn new(enabled: bool) -> Self {
        OpProfile {
            enabled,
            rows: Default::default(),
        }
    }

    /// Runs `op`; when profiling, waits for earlier work first (`sync`), then for `op`'s own,
    /// and adds the wall time to `key()`.
    pub fn time<R>(
        &self,
        key: impl FnOnce() -> String,
        sync: impl Fn() -> Result<(), GpuError>,
        op: impl FnOnce() -> Result<R, GpuError>,
    ) -> Result<R, GpuError> {
        if !self.enabled {
            return op();
        }
        sync()?;
        let t0 = std::time::Instant::now();
        let r = op()?;
        sync()?;
        let dt = t0.elapsed().as_secs_f64();
        let mut rows = self.rows.lock().unwrap();
        let e = rows.entry(key()).or_insert((0, 0.0));
        e.0 += 1;
        e.1 += dt;
        Ok(r)
    }

    /// (operation, calls, seconds) so far, in name order.
    pub fn rows(&self) -> Vec<OpTime> {
        self.rows
            .lock()
            .unwrap()
            .iter()
            .map(|(k, &(calls, seconds))| OpTime {
                op: k.clone(),
                calls,
                seconds,
            })
            .collect()
    }
}

/// The [`OpProfile`] key of a GEMM: operand type and weight shape `[n, k]`.
pub fn gemm_key(g: &Gemm) -> String {
    format!("gemm {:?} n{} k{}", g.ty, g.n, g.k).to_lowercase()
}

/// Host <-> device byte counters of an executor (its [`Executor::transfer_bytes`]).
#[derive(Debug, Default)]
pub struct Transfers {
    to_device: AtomicU64,
    to_host: AtomicU64,
}

impl Transfers {
    /// Counts a completed host -> device copy.
    pub fn wrote(&self, bytes: usize) {
        self.to_device.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Counts a completed device -> host copy.
    pub fn read(&self, bytes: usize) {
        self.to_host.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// (host -> device, device -> host) bytes so far.
    pub fn get(&self) -> (u64, u64) {
        (
            self.to_device.load(Ordering::Relaxed),
            self.to_host.load(Ordering::Relaxed),
        )
    }
}

/// Uploads host values as a new buffer.
pub fn upload<E: Executor, T: bytemuck_lite::Pod>(e: &E, data: &[T]) -> Result<E::Buf, GpuError> {
    let bytes = bytemuck_lite::bytes_of(data);
    let mut b = e.alloc(bytes.len().max(1))?;
    if !bytes.is_empty() {
        e.write(&mut b, 0, bytes)?;
    }
    Ok(b)
}

/// Downloads `out.len()` values from the start of a buffer.
pub fn download<E: Executor, T: bytemuck_lite::Pod>(
    e: &E,
    b: &E::Buf,
    out: &mut [T],
) -> Result<(), GpuError> {
    if out.is_empty() {
        return Ok(());
    }
    e.read(b, 0, bytemuck_lite::bytes_of_mut(out))
}

/// Plain-old-data casts for the few element types we move (no external crate needed).
pub mod bytemuck_lite {
    /// Types whose every bit pattern is valid and which have no padding.
    ///
    /// # Safety
    /// Implement only for such types.
    pub unsafe trait Pod: Copy + 'static {}
    unsafe impl Pod for u8 {}
    unsafe impl Pod for u16 {}
    unsafe impl Pod for u32 {}
    unsafe impl Pod for i32 {}
    unsafe impl Pod for i64 {}
    unsafe impl Pod for u64 {}
    unsafe impl Pod for f32 {}

    pub fn bytes_of<T: Pod>(x: &[T]) -> &[u8] {
        // SAFETY: Pod types have no padding; the byte view covers exactly the slice.
        unsafe { std::slice::from_raw_parts(x.as_ptr().cast(), std::mem::size_of_val(x)) }
    }

    pub fn bytes_of_mut<T: Pod>(x: &mut [T]) -> &mut [u8] {
        // SAFETY: as above, and every byte pattern is a valid T.
        unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr().cast(), std::mem::size_of_val(x)) }
    }
}

// ---------------------------------------------------------------------------------------------
// Checks every executor runs before touching device memory: a kernel launch's arguments
// against the kernel's C signature ([`signature_of`], [`arg_slots`]), a GEMM's dimensions,
// offsets and alignment against its buffers ([`check_gemm`]), a copy's range
// ([`check_range`]), and that every buffer belongs to the executor running the operation
// ([`check_owned`]). On a GPU each mistake would be undefined behaviour or a poisoned context;
// here it is a [`GpuError`] naming the kernel or GEMM.

/// The argument signature of a kernel as the host emulator compiled it (`p` pointer, `i` int,
/// `u` unsigned, `l` long long, `U` unsigned long long, `f` float), or None for an unknown name.
/// Both executors check launches against it.
pub fn signature_of(kernel: &str) -> Option<&'static str> {
    super::kernels::kernel_table()
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

/// The single products of [`Executor::gemm_each_weight`]: product `b` with its own `x`, `w`
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
mod checks_tests {
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
