//! The host emulator executor: runs the kernels of `kernels/*.cu`, compiled for the host by
//! build.rs, on host memory, so the GPU backend's op logic is tested on machines without a GPU.
//!
//! A launch of `grid` blocks runs the blocks in parallel on rayon's pool, the threads of one
//! block one after another; the kernel rules in `kernels/common.cuh` (threads never
//! communicate) make this exact. GEMMs run in f32 on the CPU (bf16 operands are widened
//! exactly). Device memory is host memory; the reported capacity is whatever the executor was
//! built with, so placement across several "devices" can be tested too. Every buffer is
//! followed by a guard ([`GUARD_BYTES`]) checked after each launch, so a kernel that writes
//! past an argument's end fails here instead of corrupting a neighbour on a GPU; the launch
//! check (`executor::check_args`) only sees where each argument starts.

//!
//! Memory accounting (off by default) lives in `emu/memory.rs`.

use super::executor::{
    arg_slots, check_gemm, check_owned, check_range, gemm_key, Arg, Executor, Gemm, GemmType,
    GpuError, MemoryUse, OpProfile, OpTime, Transfers, BLOCK,
};
use super::pool::BufferPool;
use buffer::free_host;
pub use buffer::{EmuBuf, GUARD_BYTES};
pub use memory::MemoryStats;
use rayon::prelude::*;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

mod buffer;
mod memory;

extern "C" {
    fn ns_emu_run(
        index: c_int,
        grid: c_uint,
        block: c_uint,
        b0: c_uint,
        b1: c_uint,
        reverse: c_int,
        params: *mut *mut c_void,
    );
}

/// The host emulator (one emulated device with a stated memory capacity).
pub struct EmuExecutor {
    ordinal: usize,
    capacity: usize,
    used: Arc<AtomicUsize>,
    transfers: Transfers,
    profile: OpProfile,
    pool: Option<Arc<BufferPool>>,
    /// Run each launch's blocks and threads in descending order (see [`Self::with_reverse_threads`]).
    reverse_threads: bool,
    /// Peak accounting ([`Self::with_memory_tracking`]); None: off.
    peaks: Option<memory::Peaks>,
}

impl Default for EmuExecutor {
    fn default() -> Self {
        Self::new(0, 1 << 40)
    }
}

impl EmuExecutor {
    /// Emulated device `ordinal` with `capacity` bytes of "device memory".
    pub fn new(ordinal: usize, capacity: usize) -> Self {
        EmuExecutor {
            ordinal,
            capacity,
            used: Arc::new(AtomicUsize::new(0)),
            transfers: Transfers::default(),
            profile: OpProfile::from_env(),
            pool: None,
            reverse_threads: false,
            peaks: None,
        }
    }

    /// The same executor running each launch's blocks and threads in descending order
    /// (`on`) instead of ascending. The kernel rules say threads never read what another
    /// thread of the launch writes, so results must not change; a kernel (or an in-place
    /// copy whose source and destination overlap) that breaks the rule gives other values
    /// in one order or the other, where on a GPU it would race.
    pub fn with_reverse_threads(mut self, on: bool) -> Self {
        self.reverse_threads = on;
        self
    }

    /// The same executor keeping up to `limit` bytes of freed buffers for reuse, as the CUDA
    /// executor does (`backend::gpu::pool`); without it every buffer is freed when dropped.
    pub fn with_pool(mut self, limit: usize) -> Self {
        self.pool = Some(Arc::new(BufferPool::new(limit)));
        self
    }

    /// The same executor recording [`Executor::op_profile`] (`on`) or not, whatever
    /// `NEEDLESCOPE_PROFILE` says: tests count launches with it.
    pub fn with_profile(mut self, on: bool) -> Self {
        self.profile = OpProfile::new(on);
        self
    }

    /// Allocations served from the buffer pool so far (0 without a pool).
    pub fn pool_reuses(&self) -> u64 {
        self.pool.as_ref().map_or(0, |p| p.reused())
    }

    /// Bytes of the emulated device in use (pooled buffers included).
    pub fn used_bytes(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Counts `cap` bytes as used, or fails as a full device would.
    fn reserve(&self, cap: usize) -> Result<(), GpuError> {
        let used = self.used.fetch_add(cap, Ordering::Relaxed) + cap;
        if used <= self.capacity {
            return Ok(());
        }
        self.used.fetch_sub(cap, Ordering::Relaxed);
        Err(GpuError::OutOfMemory {
            device: self.ordinal,
            bytes: cap,
            free: self.capacity.saturating_sub(used - cap),
            total: self.capacity,
        })
    }

    fn index_of(kernel: &str) -> Option<c_int> {
        super::kernels::kernel_table()
            .iter()
            .position(|(n, _)| n == kernel)
            .map(|i| i as c_int)
    }
}

impl Drop for EmuExecutor {
    fn drop(&mut self) {
        if let Some(pool) = &self.pool {
            for (class, addr) in pool.close() {
                free_host(&self.used, class, addr as *mut u8);
            }
        }
    }
}

struct SendPtr(*mut *mut c_void);
// SAFETY: the parameter array is only read by the kernels, during the launch.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

fn to_f32(bytes: &[u8], ty: GemmType, offset: usize, count: usize) -> Vec<f32> {
    let s = &bytes[offset..offset + count * ty.bytes()];
    match ty {
        GemmType::F32 => s
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        GemmType::Bf16 => s
            .chunks_exact(2)
            .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
            .collect(),
    }
}

/// The untimed operations ([`Executor`]'s methods time them when profiling).
impl EmuExecutor {
    fn alloc_now(&self, bytes: usize) -> Result<EmuBuf, GpuError> {
        let cap = self.footprint(bytes);
        let buf = |ptr| {
            let mut b = EmuBuf {
                ptr,
                len: bytes,
                cap,
                used: self.used.clone(),
                pool: self.pool.clone(),
            };
            b.arm_guard();
            b
        };
        if let Some(addr) = self.pool.as_ref().and_then(|p| p.take(cap)) {
            let ptr = addr as *mut u8;
            // SAFETY: a pooled allocation of `cap >= bytes` bytes, owned by nobody else now.
            unsafe { std::ptr::write_bytes(ptr, 0, bytes) };
            let b = buf(ptr);
            self.note_peak();
            return Ok(b);
        }
        if let Err(e) = self.reserve(cap) {
            // Out of memory: free what the pool keeps, then try once more.
            let kept = self.pool.as_ref().map(|p| p.drain()).unwrap_or_default();
            if kept.is_empty() {
                return Err(e);
            }
            for (class, addr) in kept {
                free_host(&self.used, class, addr as *mut u8);
            }
            self.reserve(cap)?;
        }
        // SAFETY: non-zero size layout.
        let ptr = unsafe { std::alloc::alloc_zeroed(EmuBuf::layout(cap)) };
        if ptr.is_null() {
            self.used.fetch_sub(cap, Ordering::Relaxed);
            return Err(GpuError::Other(format!(
                "host allocation of {bytes} bytes failed"
            )));
        }
        let b = buf(ptr);
        self.note_peak();
        Ok(b)
    }

    /// Whether `b` was allocated by this executor (see [`check_owned`]).
    fn owns(&self, b: &EmuBuf) -> bool {
        Arc::ptr_eq(&b.used, &self.used)
    }

    fn write_now(&self, dst: &mut EmuBuf, offset: usize, src: &[u8]) -> Result<(), GpuError> {
        check_owned(
            || format!("write on {}", self.name()),
            [&*dst],
            |b| self.owns(b),
        )?;
        check_range("write", offset, src.len(), dst.len)?;
        // SAFETY: bounds checked above; dst is exclusively borrowed.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.ptr.add(offset), src.len()) };
        self.transfers.wrote(src.len());
        Ok(())
    }

    fn read_now(&self, src: &EmuBuf, offset: usize, dst: &mut [u8]) -> Result<(), GpuError> {
        check_owned(
            || format!("read on {}", self.name()),
            [src],
            |b| self.owns(b),
        )?;
        check_range("read", offset, dst.len(), src.len)?;
        dst.copy_from_slice(&src.as_slice()[offset..offset + dst.len()]);
        self.transfers.read(dst.len());
        Ok(())
    }

    fn launch_now(
        &self,
        kernel: &str,
        grid: u32,
        args: &[Arg<'_, EmuBuf>],
    ) -> Result<(), GpuError> {
        // One 8-byte slot per argument (signature checked); params[i] points at slot i.
        let mut slots = arg_slots(kernel, args, |b| {
            self.owns(b).then_some((b.ptr as u64, b.len))
        })?;
        let index = Self::index_of(kernel).expect("a kernel with a signature is in the table");
        let mut params: Vec<*mut c_void> = slots
            .iter_mut()
            .map(|s| s as *mut u64 as *mut c_void)
            .collect();
        let p = SendPtr(params.as_mut_ptr());
        let reverse = self.reverse_threads as c_int;
        let pieces = (rayon::current_num_threads() * 4).min(grid as usize).max(1) as u32;
        (0..pieces).into_par_iter().for_each(|i| {
            let b0 = (grid as u64 * i as u64 / pieces as u64) as u32;
            let b1 = (grid as u64 * (i + 1) as u64 / pieces as u64) as u32;
            let p = &p;
            // SAFETY: the arguments match the signature (checked); pointers are live buffers;
            // blocks write disjoint outputs (kernel rules).
            unsafe { ns_emu_run(index, grid, BLOCK, b0, b1, reverse, p.0) };
        });
        for (i, arg) in args.iter().enumerate() {
            if let Arg::Buf(b, _) = arg {
                if !b.guard_intact() {
                    return Err(GpuError::Other(format!(
                        "kernel {kernel}: argument {i} (a buffer of {} bytes) was written past \
                         its end",
                        b.len
                    )));
                }
            }
        }
        Ok(())
    }

    fn gemm_now(&self, g: &Gemm, x: &EmuBuf, w: &EmuBuf, y: &mut EmuBuf) -> Result<(), GpuError> {
        check_owned(
            || format!("{} on {}", gemm_key(g), self.name()),
            [x, w, &*y],
            |b| self.owns(b),
        )?;
        check_gemm(g, x.len, w.len, y.len)?;
        let es = g.ty.bytes();
        let (xs, ws) = (x.as_slice(), w.as_slice());
        let yptr = SendPtr(y.ptr as *mut *mut c_void);
        for b in 0..g.batch {
            let (x0, w0) = (
                g.x_offset + b * g.stride_x * es,
                g.w_offset + b * g.stride_w * es,
            );
            let y0 = g.y_offset + b * g.stride_y * 4;
            let xrow = |r: usize| to_f32(xs, g.ty, x0 + r * g.ldx * es, g.k);
            // w's rows as [n, k], whichever way it is stored.
            let wrows: Vec<Vec<f32>> = (0..g.n)
                .into_par_iter()
                .map(|c| {
                    if g.w_kn {
                        (0..g.k)
                            .map(|kk| to_f32(ws, g.ty, w0 + (kk * g.ldw + c) * es, 1)[0])
                            .collect()
                    } else {
                        to_f32(ws, g.ty, w0 + c * g.ldw * es, g.k)
                    }
                })
                .collect();
            (0..g.m).into_par_iter().for_each(|r| {
                let xr = xrow(r);
                let yp = &yptr;
                for (c, wr) in wrows.iter().enumerate() {
                    let dot: f32 = xr.iter().zip(wr).map(|(a, b)| a * b).sum();
                    // SAFETY: bounds checked above; each (b, r, c) is written by one task.
                    unsafe {
                        let p = (yp.0 as *mut u8).add(y0 + (r * g.ldy + c) * 4) as *mut f32;
                        *p = if g.accumulate { *p + dot } else { dot };
                    }
                }
            });
        }
        Ok(())
    }
}

impl Executor for EmuExecutor {
    type Buf = EmuBuf;
    const KIND: &'static str = "cuda-emu";

    fn name(&self) -> String {
        format!("emu:{}", self.ordinal)
    }

    fn alloc(&self, bytes: usize) -> Result<EmuBuf, GpuError> {
        let key = || "alloc (zeroed)".to_string();
        self.profile
            .time(key, || self.synchronize(), || self.alloc_now(bytes))
    }

    fn len(&self, b: &EmuBuf) -> usize {
        b.len
    }

    fn alloc_uninit(&self, bytes: usize) -> Result<EmuBuf, GpuError> {
        let key = || "alloc (uninitialised)".to_string();
        let b = self
            .profile
            .time(key, || self.synchronize(), || self.alloc_now(bytes))?;
        // SAFETY: b owns len bytes; poison them so that reading an unwritten element is seen.
        unsafe { std::ptr::write_bytes(b.ptr, 0xFF, b.len) };
        Ok(b)
    }

    fn write(&self, dst: &mut EmuBuf, offset: usize, src: &[u8]) -> Result<(), GpuError> {
        let key = || "copy host->device".to_string();
        self.profile.time(
            key,
            || self.synchronize(),
            || self.write_now(dst, offset, src),
        )
    }

    fn read(&self, src: &EmuBuf, offset: usize, dst: &mut [u8]) -> Result<(), GpuError> {
        let key = || "copy device->host".to_string();
        self.profile.time(
            key,
            || self.synchronize(),
            || self.read_now(src, offset, dst),
        )
    }

    fn launch(&self, kernel: &str, grid: u32, args: &[Arg<'_, EmuBuf>]) -> Result<(), GpuError> {
        let key = || kernel.to_string();
        self.profile.time(
            key,
            || self.synchronize(),
            || self.launch_now(kernel, grid, args),
        )
    }

    fn gemm(&self, g: &Gemm, x: &EmuBuf, w: &EmuBuf, y: &mut EmuBuf) -> Result<(), GpuError> {
        self.profile.time(
            || gemm_key(g),
            || self.synchronize(),
            || self.gemm_now(g, x, w, y),
        )
    }

    fn synchronize(&self) -> Result<(), GpuError> {
        Ok(())
    }

    fn memory(&self) -> Result<(usize, usize), GpuError> {
        let used = self.used.load(Ordering::Relaxed);
        Ok((self.capacity.saturating_sub(used), self.capacity))
    }

    fn transfer_bytes(&self) -> (u64, u64) {
        self.transfers.get()
    }

    fn reset_memory_peaks(&self) {
        self.reset_peaks()
    }

    fn footprint(&self, bytes: usize) -> usize {
        BufferPool::footprint(self.pool.is_some(), bytes)
    }

    fn memory_use(&self) -> Option<MemoryUse> {
        self.peaks.as_ref()?;
        let m = self.memory_stats();
        Some(MemoryUse {
            held: m.held,
            in_use: m.in_use,
            peak_held: m.peak_held,
            peak_in_use: m.peak_in_use,
        })
    }

    fn op_profile(&self) -> Vec<OpTime> {
        self.profile.rows()
    }
}
