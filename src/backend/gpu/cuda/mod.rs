//! The CUDA executor: one GPU through the driver API (cudarc), kernels from NVRTC CUBINs
//! (see [`super::kernels`]), GEMMs by cuBLAS (`gemm`: `cublasGemmEx` and its batched forms, f32
//! compute type, so bf16 operands accumulate in f32 and f32 operands are never demoted to TF32).
//!
//! Everything runs on the context's legacy default stream, so work is ordered and a device to
//! host copy waits for the kernels before it; host to device copies are stream-ordered and do
//! not wait. The primary context is bound to the calling thread
//! before every driver call (the engine may call from any thread). Families are loaded on their
//! first launch. Allocations, the out-of-memory retry and frees are in `alloc`, the count of
//! the bytes they hold in `held`.

use super::executor::{
    arg_slots, check_owned, check_range, gemm_key, Arg, Executor, Gemm, GpuError, MemoryUse,
    OpProfile, OpTime, Transfers, BLOCK,
};
use super::kernels;
use super::pool::BufferPool;
use cudarc::cublas::sys as blas;
use cudarc::driver::{result as drv, sys, CudaContext};
use held::HeldBytes;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

mod alloc;
mod gemm;
mod held;

fn driver_err(what: &str, e: drv::DriverError) -> GpuError {
    GpuError::Driver(format!("{what}: {e:?}"))
}

/// A device allocation of `len` bytes (`cap` really allocated: its pool size class).
pub struct CudaBuf {
    ptr: sys::CUdeviceptr,
    len: usize,
    cap: usize,
    ctx: Arc<CudaContext>,
    pool: Option<Arc<BufferPool>>,
    held: Arc<HeldBytes>,
}

// SAFETY: a device pointer is a plain address; access goes through the driver.
unsafe impl Send for CudaBuf {}
unsafe impl Sync for CudaBuf {}

/// Ops drop temporaries (and grown caches drop their old allocation) right after queueing the
/// kernels that read them. That is safe because everything runs on the legacy default stream:
/// a buffer goes back to the executor's [`BufferPool`] and is handed out again only to work
/// queued after those kernels, and a buffer really freed goes through `cuMemFree`, which waits
/// for the device's queued work first. Moving to other streams or `cuMemFreeAsync` must keep
/// each buffer alive until its kernels are done. An error here (a kernel that faulted after its
/// launch returned) is printed, since the op that queued it has already returned; run with
/// `CUDA_LAUNCH_BLOCKING=1` to have the failing launch itself report it (scripts/gpu-check.sh
/// does for the op parity step).
impl Drop for CudaBuf {
    fn drop(&mut self) {
        if self
            .pool
            .as_ref()
            .is_some_and(|p| p.give(self.cap, self.ptr))
        {
            return;
        }
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by malloc_sync in this context, freed once.
            match unsafe { drv::free_sync(self.ptr) } {
                Ok(()) => self.held.freed(self.cap),
                Err(e) => eprintln!("warning: cuMemFree of a {}-byte buffer: {e:?}", self.len),
            }
        }
    }
}

struct Loaded {
    modules: HashMap<&'static str, sys::CUmodule>,
    functions: HashMap<String, sys::CUfunction>,
}

// SAFETY: module and function handles are context-wide and usable from any thread.
unsafe impl Send for Loaded {}

/// One GPU.
pub struct CudaExecutor {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    arch: String,
    driver: String,
    loaded: Mutex<Loaded>,
    blas: Mutex<BlasHandle>,
    transfers: Transfers,
    profile: OpProfile,
    pool: Option<Arc<BufferPool>>,
    /// `cublasGemmBatchedEx` calls made (not the one-by-one fallback of a misaligned batch).
    batched_gemms: AtomicU64,
    /// Device bytes our allocations hold, and their peaks (`cuda/held.rs`).
    held: Arc<HeldBytes>,
}

struct BlasHandle(blas::cublasHandle_t);
// SAFETY: the handle is used under the mutex only.
unsafe impl Send for BlasHandle {}

impl CudaExecutor {
    /// Opens GPU `ordinal` (its primary context) and a cuBLAS handle. Fails with a clear error
    /// when the driver is missing, the ordinal does not exist or cuBLAS cannot be loaded.
    pub fn new(ordinal: usize) -> Result<Self, GpuError> {
        if !crate::backend::gpu::driver::driver_present() {
            return Err(GpuError::Driver(
                "no CUDA driver (libcuda) could be loaded on this machine".into(),
            ));
        }
        // A bad pool setting fails before any device state exists.
        let pool = BufferPool::limited(
            super::GpuSwitches::from_env()
                .map_err(GpuError::Other)?
                .pool_bytes,
        );
        let count = crate::backend::gpu::driver::quietly(CudaContext::device_count)
            .map_err(GpuError::Driver)?
            .map_err(|e| driver_err("cuDeviceGetCount", e))?;
        if ordinal as i32 >= count {
            return Err(GpuError::Driver(format!(
                "GPU {ordinal} does not exist: the driver sees {count} device(s)"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| driver_err("context", e))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| driver_err("compute capability", e))?;
        let mut version = 0i32;
        // SAFETY: writes one int.
        unsafe { sys::cuDriverGetVersion(&mut version) };
        if !crate::backend::gpu::driver::quietly(|| unsafe { blas::is_culib_present() })
            .unwrap_or(false)
        {
            return Err(GpuError::Cublas(
                "the cuBLAS library (libcublas.so.13) could not be loaded; install the CUDA 13 \
                 toolkit or the nvidia-cublas wheel and add its lib directory to LD_LIBRARY_PATH"
                    .into(),
            ));
        }
        ctx.bind_to_thread().map_err(|e| driver_err("bind", e))?;
        let handle = cudarc::cublas::result::create_handle()
            .map_err(|e| GpuError::Cublas(format!("create handle: {e:?}")))?;
        Ok(CudaExecutor {
            ordinal,
            ctx,
            arch: format!("sm_{major}{minor}"),
            driver: format!("{}.{}", version / 1000, (version % 1000) / 10),
            loaded: Mutex::new(Loaded {
                modules: HashMap::new(),
                functions: HashMap::new(),
            }),
            blas: Mutex::new(BlasHandle(handle)),
            transfers: Transfers::default(),
            profile: OpProfile::from_env(),
            pool: pool.map(Arc::new),
            batched_gemms: AtomicU64::new(0),
            held: Arc::default(),
        })
    }

    /// Allocations served from the buffer pool so far (0 without a pool).
    pub fn pool_reuses(&self) -> u64 {
        self.pool.as_ref().map_or(0, |p| p.reused())
    }

    /// `cublasGemmBatchedEx` calls made so far ([`Executor::gemm_each_weight`] batches that ran
    /// as one call; a batch with a misaligned matrix runs one GEMM at a time and is not counted).
    pub fn batched_gemm_calls(&self) -> u64 {
        self.batched_gemms.load(Ordering::Relaxed)
    }

    /// The architecture kernels are compiled for (`sm_90`).
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// Whether `b` lives on this executor's device (see [`check_owned`]).
    fn owns(&self, b: &CudaBuf) -> bool {
        b.ctx.ordinal() == self.ordinal
    }

    fn bind(&self) -> Result<(), GpuError> {
        self.ctx.bind_to_thread().map_err(|e| driver_err("bind", e))
    }

    fn function(&self, kernel: &str) -> Result<sys::CUfunction, GpuError> {
        // Modules load into the current context: make it this device's.
        self.bind()?;
        let mut l = self.loaded.lock().unwrap();
        if let Some(&f) = l.functions.get(kernel) {
            return Ok(f);
        }
        let family = kernels::family_of(kernel).ok_or_else(|| GpuError::Launch {
            kernel: kernel.into(),
            why: "not defined in kernels/*.cu".into(),
        })?;
        let module = match l.modules.get(family) {
            Some(&m) => m,
            None => {
                let (image, _) = kernels::cubin(family, &self.arch, &self.driver)?;
                // SAFETY: image is a CUBIN for this device's architecture; load_data copies it.
                let m = unsafe { drv::module::load_data(image.as_ptr() as *const c_void) }
                    .map_err(|e| driver_err(&format!("loading {family}.cu ({})", self.arch), e))?;
                l.modules.insert(family, m);
                m
            }
        };
        let name = std::ffi::CString::new(kernel).unwrap();
        // SAFETY: live module.
        let f = unsafe { drv::module::get_function(module, name) }
            .map_err(|e| driver_err(&format!("function {kernel}"), e))?;
        l.functions.insert(kernel.to_string(), f);
        Ok(f)
    }
}

impl Drop for CudaExecutor {
    fn drop(&mut self) {
        if self.bind().is_ok() {
            if let Some(pool) = &self.pool {
                self.free_all(pool.close());
            }
            // SAFETY: created in `new`, destroyed once.
            let _ = unsafe { cudarc::cublas::result::destroy_handle(self.blas.lock().unwrap().0) };
        }
    }
}

/// The untimed operations ([`Executor`]'s methods time them when profiling).
impl CudaExecutor {
    fn write_now(&self, dst: &mut CudaBuf, offset: usize, src: &[u8]) -> Result<(), GpuError> {
        check_owned(
            || format!("write on {}", self.name()),
            [&*dst],
            |b| self.owns(b),
        )?;
        check_range("write", offset, src.len(), dst.len)?;
        self.bind()?;
        // The stream-ordered copy on the legacy default stream: a plain cuMemcpyHtoD from
        // pageable memory first waits for all queued device work (CUDA's "API synchronization
        // behavior"), which would stall the queue at every small upload (entry tables, routes,
        // norm weights); the async form only stages the bytes. It returns once the pageable
        // slice has been staged, so `src` may be dropped after it as before.
        // SAFETY: bounds checked; `src` is a live host slice for the duration of the call.
        unsafe { drv::memcpy_htod_async(dst.ptr + offset as u64, src, std::ptr::null_mut()) }
            .map_err(|e| driver_err("cuMemcpyHtoDAsync", e))?;
        self.transfers.wrote(src.len());
        Ok(())
    }

    fn read_now(&self, src: &CudaBuf, offset: usize, dst: &mut [u8]) -> Result<(), GpuError> {
        check_owned(
            || format!("read on {}", self.name()),
            [src],
            |b| self.owns(b),
        )?;
        check_range("read", offset, dst.len(), src.len)?;
        self.bind()?;
        // SAFETY: bounds checked; the synchronous copy waits for the default stream.
        unsafe { drv::memcpy_dtoh_sync(dst, src.ptr + offset as u64) }
            .map_err(|e| driver_err("cuMemcpyDtoH", e))?;
        self.transfers.read(dst.len());
        Ok(())
    }

    fn launch_now(
        &self,
        kernel: &str,
        grid: u32,
        args: &[Arg<'_, CudaBuf>],
    ) -> Result<(), GpuError> {
        let f = self.function(kernel)?;
        self.bind()?;
        let mut slots = arg_slots(kernel, args, |b| self.owns(b).then_some((b.ptr, b.len)))?;
        let mut params: Vec<*mut c_void> = slots
            .iter_mut()
            .map(|s| s as *mut u64 as *mut c_void)
            .collect();
        // SAFETY: argument types match the kernel signature (checked), pointers are live
        // allocations of this context; the legacy default stream orders the launch.
        unsafe {
            drv::launch_kernel(
                f,
                (grid, 1, 1),
                (BLOCK, 1, 1),
                0,
                std::ptr::null_mut(),
                &mut params,
            )
        }
        .map_err(|e| GpuError::Launch {
            kernel: kernel.into(),
            why: format!("{e:?}"),
        })
    }
}

impl Executor for CudaExecutor {
    type Buf = CudaBuf;
    const KIND: &'static str = "cuda";

    fn name(&self) -> String {
        format!("cuda:{}", self.ordinal)
    }

    fn alloc(&self, bytes: usize) -> Result<CudaBuf, GpuError> {
        let key = || "alloc (zeroed)".to_string();
        self.profile
            .time(key, || self.synchronize(), || self.alloc_now(bytes))
    }

    fn len(&self, b: &CudaBuf) -> usize {
        b.len
    }

    fn alloc_uninit(&self, bytes: usize) -> Result<CudaBuf, GpuError> {
        let key = || "alloc (uninitialised)".to_string();
        self.profile
            .time(key, || self.synchronize(), || self.alloc_uninit_now(bytes))
    }

    fn write(&self, dst: &mut CudaBuf, offset: usize, src: &[u8]) -> Result<(), GpuError> {
        let key = || "copy host->device".to_string();
        self.profile.time(
            key,
            || self.synchronize(),
            || self.write_now(dst, offset, src),
        )
    }

    fn read(&self, src: &CudaBuf, offset: usize, dst: &mut [u8]) -> Result<(), GpuError> {
        let key = || "copy device->host".to_string();
        self.profile.time(
            key,
            || self.synchronize(),
            || self.read_now(src, offset, dst),
        )
    }

    fn launch(&self, kernel: &str, grid: u32, args: &[Arg<'_, CudaBuf>]) -> Result<(), GpuError> {
        let key = || kernel.to_string();
        self.profile.time(
            key,
            || self.synchronize(),
            // A launch that failed to start wrote nothing: running it again is safe.
            || self.retry_out_of_memory(true, || self.launch_now(kernel, grid, args)),
        )
    }

    fn gemm(&self, g: &Gemm, x: &CudaBuf, w: &CudaBuf, y: &mut CudaBuf) -> Result<(), GpuError> {
        self.profile.time(
            || gemm_key(g),
            || self.synchronize(),
            || self.retry_out_of_memory(!g.accumulate, || self.gemm_now(g, x, w, &mut *y)),
        )
    }

    fn gemm_each_weight(
        &self,
        g: &Gemm,
        x: &CudaBuf,
        ws: &[(&CudaBuf, usize)],
        y: &mut CudaBuf,
    ) -> Result<(), GpuError> {
        self.profile.time(
            || format!("{} per weight", gemm_key(g)),
            || self.synchronize(),
            || self.retry_out_of_memory(!g.accumulate, || self.gemm_each_now(g, x, ws, &mut *y)),
        )
    }

    fn synchronize(&self) -> Result<(), GpuError> {
        self.bind()?;
        drv::ctx::synchronize().map_err(|e| driver_err("synchronize", e))
    }

    fn memory(&self) -> Result<(usize, usize), GpuError> {
        self.bind()?;
        drv::mem_get_info().map_err(|e| driver_err("cuMemGetInfo", e))
    }

    fn transfer_bytes(&self) -> (u64, u64) {
        self.transfers.get()
    }

    fn memory_use(&self) -> Option<MemoryUse> {
        Some(
            self.held
                .snapshot(self.pool.as_ref().map_or(0, |p| p.kept_bytes())),
        )
    }

    fn reset_memory_peaks(&self) {
        self.reset_peaks_now()
    }

    fn footprint(&self, bytes: usize) -> usize {
        BufferPool::footprint(self.pool.is_some(), bytes)
    }

    fn op_profile(&self) -> Vec<OpTime> {
        self.profile.rows()
    }
}

#[cfg(test)]
mod tests;
