//! The cuBLAS calls of [`CudaExecutor`] (a child module, so it reaches the executor's handle
//! and untimed copies): one GEMM or a strided batch through `cublasGemmEx` /
//! `cublasGemmStridedBatchedEx`, and products with a weight each through
//! `cublasGemmBatchedEx`. Row-major `y[m, n] = x[m, k] · w[n, k]ᵀ` is column-major
//! `yᵀ[n, m] = W · X` with w read transposed; f32 output and f32 compute always.

use super::super::executor::{
    bytemuck_lite, check_gemm, check_owned, gemm_key, per_weight_products, Executor, Gemm,
    GemmType, GpuError,
};
use super::{CudaBuf, CudaExecutor};
use cudarc::cublas::sys as blas;
use std::ffi::c_void;

/// cuBLAS's type of `g`'s x and w, and its alpha and beta (beta 1 to accumulate into y).
fn operands(g: &Gemm) -> (blas::cudaDataType, f32, f32) {
    let ty = match g.ty {
        GemmType::Bf16 => blas::cudaDataType::CUDA_R_16BF,
        GemmType::F32 => blas::cudaDataType::CUDA_R_32F,
    };
    (ty, 1.0, if g.accumulate { 1.0 } else { 0.0 })
}

impl CudaExecutor {
    pub(super) fn gemm_now(
        &self,
        g: &Gemm,
        x: &CudaBuf,
        w: &CudaBuf,
        y: &mut CudaBuf,
    ) -> Result<(), GpuError> {
        check_owned(
            || format!("{} on {}", gemm_key(g), self.name()),
            [x, w, &*y],
            |b| self.owns(b),
        )?;
        check_gemm(g, x.len, w.len, y.len)?;
        if g.m == 0 || g.n == 0 {
            return Ok(());
        }
        self.bind()?;
        let (ty, alpha, beta) = operands(g);
        let h = self.blas.lock().unwrap();
        if g.batch > 1 || g.w_kn {
            // w stored [k, n] is column-major [n, k] already: no transpose.
            let transa = if g.w_kn {
                blas::cublasOperation_t::CUBLAS_OP_N
            } else {
                blas::cublasOperation_t::CUBLAS_OP_T
            };
            // SAFETY: check_gemm sized every product of the batch inside its buffer.
            return unsafe {
                cudarc::cublas::result::gemm_strided_batched_ex(
                    h.0,
                    transa,
                    blas::cublasOperation_t::CUBLAS_OP_N,
                    g.n as i32,
                    g.m as i32,
                    g.k as i32,
                    &alpha as *const f32 as *const c_void,
                    (w.ptr + g.w_offset as u64) as *const c_void,
                    ty,
                    g.ldw as i32,
                    g.stride_w as i64,
                    (x.ptr + g.x_offset as u64) as *const c_void,
                    ty,
                    g.ldx as i32,
                    g.stride_x as i64,
                    &beta as *const f32 as *const c_void,
                    (y.ptr + g.y_offset as u64) as *mut c_void,
                    blas::cudaDataType::CUDA_R_32F,
                    g.ldy as i32,
                    g.stride_y as i64,
                    g.batch as i32,
                    blas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    blas::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
                )
            }
            .map_err(|e| {
                GpuError::Cublas(format!(
                    "batched gemm {}x{}x{} x{}: {e:?}",
                    g.m, g.n, g.k, g.batch
                ))
            });
        }
        // Row-major y[m,n] = x[m,k]·w[n,k]ᵀ is column-major Yᵀ[n,m] = Wᵀ·X with W, X read as
        // column-major [k,n] and [k,m] matrices.
        // SAFETY: offsets and leading dimensions were sized by the caller for these buffers.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                h.0,
                blas::cublasOperation_t::CUBLAS_OP_T,
                blas::cublasOperation_t::CUBLAS_OP_N,
                g.n as i32,
                g.m as i32,
                g.k as i32,
                &alpha as *const f32 as *const c_void,
                (w.ptr + g.w_offset as u64) as *const c_void,
                ty,
                g.ldw as i32,
                (x.ptr + g.x_offset as u64) as *const c_void,
                ty,
                g.ldx as i32,
                &beta as *const f32 as *const c_void,
                (y.ptr + g.y_offset as u64) as *mut c_void,
                blas::cudaDataType::CUDA_R_32F,
                g.ldy as i32,
                blas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
            )
        }
        .map_err(|e| GpuError::Cublas(format!("gemm {}x{}x{}: {e:?}", g.m, g.n, g.k)))
    }

    /// [`Executor::gemm_each_weight`] as one `cublasGemmBatchedEx` (pointer arrays uploaded to
    /// the device, each product checked against its buffers first).
    pub(super) fn gemm_each_now(
        &self,
        g: &Gemm,
        x: &CudaBuf,
        ws: &[(&CudaBuf, usize)],
        y: &mut CudaBuf,
    ) -> Result<(), GpuError> {
        let bufs = std::iter::once(x).chain(ws.iter().map(|(w, _)| *w));
        let what = || format!("{} per weight on {}", gemm_key(g), self.name());
        check_owned(what, bufs.chain([&*y]), |b| self.owns(b))?;
        let products = per_weight_products(g, ws)?;
        for (p, (w, _)) in products.iter().zip(ws) {
            check_gemm(p, x.len, w.len, y.len)?;
        }
        if g.m == 0 || g.n == 0 || ws.is_empty() {
            return Ok(());
        }
        let a: Vec<u64> = products
            .iter()
            .zip(ws)
            .map(|(p, (w, _))| w.ptr + p.w_offset as u64)
            .collect();
        let b: Vec<u64> = products.iter().map(|p| x.ptr + p.x_offset as u64).collect();
        let c: Vec<u64> = products.iter().map(|p| y.ptr + p.y_offset as u64).collect();
        // cuBLAS's batched bf16 kernels want 16-byte aligned matrices and cannot check pointers
        // that live in device memory (a misaligned one faults): such a batch runs one by one.
        if a.iter().chain(&b).chain(&c).any(|&p| p % 16 != 0) {
            for (p, (w, _)) in products.iter().zip(ws) {
                self.gemm_now(p, x, w, y)?;
            }
            return Ok(());
        }
        let mut arrays = Vec::with_capacity(3);
        for v in [&a, &b, &c] {
            let mut d = self.alloc_uninit_now(v.len() * 8)?;
            self.write_now(&mut d, 0, bytemuck_lite::bytes_of(v))?;
            arrays.push(d);
        }
        self.bind()?;
        let (ty, alpha, beta) = operands(g);
        let h = self.blas.lock().unwrap();
        // As in gemm_now: row-major y = x·wᵀ is column-major yᵀ = w·xᵀ, w transposed.
        // SAFETY: every product was checked inside its buffers; the pointer arrays are device
        // allocations ordered before the call on the same stream and outlive its queueing
        // (a freed or pooled buffer is only reused by later work on this stream).
        unsafe {
            blas::cublasGemmBatchedEx(
                h.0,
                blas::cublasOperation_t::CUBLAS_OP_T,
                blas::cublasOperation_t::CUBLAS_OP_N,
                g.n as i32,
                g.m as i32,
                g.k as i32,
                &alpha as *const f32 as *const c_void,
                arrays[0].ptr as *const *const c_void,
                ty,
                g.ldw as i32,
                arrays[1].ptr as *const *const c_void,
                ty,
                g.ldx as i32,
                &beta as *const f32 as *const c_void,
                arrays[2].ptr as *const *mut c_void,
                blas::cudaDataType::CUDA_R_32F,
                g.ldy as i32,
                ws.len() as i32,
                blas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
            )
            .result()
        }
        .map_err(|e| {
            GpuError::Cublas(format!(
                "gemm per weight {}x{}x{} x{}: {e:?}",
                g.m,
                g.n,
                g.k,
                ws.len()
            ))
        })?;
        self.batched_gemms
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}
