//! Tests of `cuda.rs` that need no GPU: how out-of-memory errors are recognised.

use super::alloc::is_out_of_memory;
use super::*;

/// The codes are found in the errors as launches and GEMMs word them (the driver's and
/// cuBLAS's Debug forms); nothing else is retried.
#[test]
fn out_of_memory_is_recognised_in_launch_and_cublas_errors() {
    // DriverError's Debug asks the driver for the text (absent here); its first field is
    // the code's own Debug form, which is what is matched.
    let code = |c: sys::CUresult| format!("DriverError({c:?}, \"...\")");
    let launch = GpuError::Launch {
        kernel: "k".into(),
        why: code(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY),
    };
    assert!(is_out_of_memory(&launch), "{launch}");
    let blas =
        cudarc::cublas::result::CublasError(blas::cublasStatus_t::CUBLAS_STATUS_ALLOC_FAILED);
    assert!(is_out_of_memory(&GpuError::Cublas(format!(
        "gemm 1x1x1: {blas:?}"
    ))));
    let other = GpuError::Launch {
        kernel: "k".into(),
        why: code(sys::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS),
    };
    assert!(!is_out_of_memory(&other));
    assert!(!is_out_of_memory(&GpuError::Other(
        "CUDA_ERROR_OUT_OF_MEMORY".into()
    )));
}
