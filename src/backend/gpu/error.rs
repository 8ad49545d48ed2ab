//! [`GpuError`]: the one error type of the GPU device layer, shared by the executors
//! ([`super::executor`]), the kernel compiler ([`super::kernels`]) and the backend's op logic.
//! Ops record it rather than return it (see [`super`]); the engine turns it into its own error.

use thiserror::Error;

/// An error of the device layer.
#[derive(Debug, Error)]
pub enum GpuError {
    #[error("CUDA driver: {0}")]
    Driver(String),
    #[error("cuBLAS: {0}")]
    Cublas(String),
    #[error("NVRTC: {0}")]
    Nvrtc(String),
    #[error("kernel {kernel}: {why}")]
    Launch { kernel: String, why: String },
    #[error(
        "device {device}: out of memory allocating {bytes} bytes ({free} free of {total}); the \
         placement plan should have refused this model: please report it"
    )]
    OutOfMemory {
        device: usize,
        bytes: usize,
        free: usize,
        total: usize,
    },
    #[error("{0}")]
    Other(String),
}
