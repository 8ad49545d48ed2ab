//! Device memory of [`CudaExecutor`] (a child module, so it reaches the executor's fields):
//! allocations (`cuMemAlloc` at the buffer pool's size class, or a pooled buffer of that class),
//! the out-of-memory retry that empties the pool first (for allocations, launches and cuBLAS
//! calls), real frees of pooled buffers, and the bytes one allocation takes on the device
//! (`BufferPool::footprint`), which the held-bytes count (`held.rs`) and the decoded-copy
//! budget use.

use super::super::executor::GpuError;
use super::super::pool::BufferPool;
use super::{driver_err, CudaBuf, CudaExecutor};
use cudarc::driver::{result as drv, sys};

impl CudaExecutor {
    /// Restarts the held and in-use peaks from now (`Executor::reset_memory_peaks`).
    pub(super) fn reset_peaks_now(&self) {
        self.held
            .reset_peaks(self.pool.as_ref().map_or(0, |p| p.kept_bytes()));
    }

    /// `cuMemAlloc` of `bytes`; when the device is out of memory, frees what the pool keeps and
    /// tries once more.
    pub(super) fn malloc(&self, bytes: usize) -> Result<sys::CUdeviceptr, GpuError> {
        for attempt in 0..2 {
            // SAFETY: plain allocation, zeroed by the caller before use.
            match unsafe { drv::malloc_sync(bytes) } {
                Ok(p) => {
                    self.held.allocated(bytes);
                    return Ok(p);
                }
                Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                    let kept = self.pool.as_ref().map(|p| p.drain()).unwrap_or_default();
                    if attempt == 0 && !kept.is_empty() {
                        self.free_all(kept);
                        continue;
                    }
                    let (free, total) = drv::mem_get_info().unwrap_or((0, 0));
                    return Err(GpuError::OutOfMemory {
                        device: self.ordinal,
                        bytes,
                        free,
                        total,
                    });
                }
                Err(e) => return Err(driver_err("cuMemAlloc", e)),
            }
        }
        unreachable!("the second attempt returns")
    }

    /// Runs `op`; when it failed for lack of device memory where no allocation of ours was
    /// involved (a launch whose kernel needs more local memory, cuBLAS's own workspace), frees
    /// what the pool keeps and runs it once more, as [`Self::malloc`] does for allocations.
    /// Only when `rerunnable`: a GEMM that accumulates into its output (beta 1) may have added
    /// part of its products before failing, so it is not run twice.
    pub(super) fn retry_out_of_memory<T>(
        &self,
        rerunnable: bool,
        mut op: impl FnMut() -> Result<T, GpuError>,
    ) -> Result<T, GpuError> {
        match op() {
            Err(e) if rerunnable && is_out_of_memory(&e) => {
                let kept = self.pool.as_ref().map(|p| p.drain()).unwrap_or_default();
                if kept.is_empty() {
                    return Err(e);
                }
                self.free_all(kept);
                op()
            }
            done => done,
        }
    }

    /// Really frees allocations taken out of the pool.
    pub(super) fn free_all(&self, kept: Vec<(usize, u64)>) {
        for (bytes, ptr) in kept {
            // SAFETY: allocated by malloc_sync in this context, owned by the pool until now.
            match unsafe { drv::free_sync(ptr) } {
                Ok(()) => self.held.freed(bytes),
                Err(e) => eprintln!("warning: cuMemFree of a pooled {bytes}-byte buffer: {e:?}"),
            }
        }
    }
}

/// Whether a launch or a cuBLAS call failed for lack of device memory (the driver's and
/// cuBLAS's own codes, as their errors print them).
pub(super) fn is_out_of_memory(e: &GpuError) -> bool {
    match e {
        GpuError::Launch { why, .. } => why.contains("CUDA_ERROR_OUT_OF_MEMORY"),
        GpuError::Cublas(why) => why.contains("CUBLAS_STATUS_ALLOC_FAILED"),
        _ => false,
    }
}

/// The untimed allocations ([`Executor`](super::super::executor::Executor)'s methods time them
/// when profiling).
impl CudaExecutor {
    pub(super) fn alloc_now(&self, bytes: usize) -> Result<CudaBuf, GpuError> {
        let b = self.alloc_uninit_now(bytes)?;
        // SAFETY: b.ptr is valid for b.cap >= b.len bytes; the memset is ordered after earlier
        // users of a reused buffer (one stream).
        unsafe { drv::memset_d8_sync(b.ptr, 0, b.len) }.map_err(|e| driver_err("cuMemsetD8", e))?;
        Ok(b)
    }

    pub(super) fn alloc_uninit_now(&self, bytes: usize) -> Result<CudaBuf, GpuError> {
        self.bind()?;
        let bytes = bytes.max(1);
        let cap = BufferPool::footprint(self.pool.is_some(), bytes);
        let ptr = match self.pool.as_ref().and_then(|p| p.take(cap)) {
            Some(p) => p,
            None => self.malloc(cap)?,
        };
        self.held
            .handed_out(self.pool.as_ref().map_or(0, |p| p.kept_bytes()));
        Ok(CudaBuf {
            ptr,
            len: bytes,
            cap,
            ctx: self.ctx.clone(),
            pool: self.pool.clone(),
            held: self.held.clone(),
        })
    }
}
