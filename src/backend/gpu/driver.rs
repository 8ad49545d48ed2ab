//! Is there a usable CUDA driver, and what GPUs does it see?
//!
//! cudarc is built with `dynamic-loading`: its first call into the driver `dlopen`s
//! `libcuda.so` and *panics* if the library is missing. So we first ask cudarc's own
//! `is_culib_present()` (which only tries to load the library, never calls into it) and touch the
//! driver API only when that says yes. Calls that still fail (an old driver missing a symbol that
//! the cuda-13000 bindings look up) are caught and reported as an error line rather than a
//! panic. Nothing here allocates device memory or creates a context.

use serde::Serialize;

/// One GPU as the driver reports it.
#[derive(Clone, Debug, Serialize)]
pub struct GpuInfo {
    pub ordinal: usize,
    pub name: String,
    pub total_memory: u64,
    /// Compute capability (major, minor): (9, 0) is sm_90.
    pub compute_capability: (i32, i32),
}

impl GpuInfo {
    /// The NVRTC architecture name, `sm_XY`.
    pub fn arch(&self) -> String {
        format!(
            "sm_{}{}",
            self.compute_capability.0, self.compute_capability.1
        )
    }
}

/// What `doctor` reports about CUDA.
#[derive(Clone, Debug, Serialize)]
pub struct CudaReport {
    /// Whether the driver library (libcuda) could be loaded.
    pub driver_present: bool,
    /// Library names tried when looking for the driver.
    pub driver_candidates: Vec<String>,
    /// Driver API version, e.g. (13, 0).
    pub driver_version: Option<(i32, i32)>,
    pub devices: Vec<GpuInfo>,
    /// Whether the NVRTC library could be loaded, and its version.
    pub nvrtc_present: bool,
    pub nvrtc_version: Option<(i32, i32)>,
    /// Whether the cuBLAS library could be loaded, and its version (major, minor, patch).
    pub cublas_present: bool,
    pub cublas_version: Option<(i32, i32, i32)>,
    /// The first error met while querying a present driver (init failed, no device, ...).
    pub error: Option<String>,
}

/// Whether the CUDA driver library can be loaded (never calls into it).
pub fn driver_present() -> bool {
    // SAFETY: only dlopen-s candidate names; no symbol is called.
    quietly(|| unsafe { cudarc::driver::sys::is_culib_present() }).unwrap_or(false)
}

/// Whether the NVRTC library can be loaded (never calls into it).
pub fn nvrtc_present() -> bool {
    // SAFETY: as above.
    quietly(|| unsafe { cudarc::nvrtc::sys::is_culib_present() }).unwrap_or(false)
}

/// Whether the cuBLAS library can be loaded (never calls into it).
pub fn cublas_present() -> bool {
    // SAFETY: as above.
    quietly(|| unsafe { cudarc::cublas::sys::is_culib_present() }).unwrap_or(false)
}

/// cuBLAS's version through `cublasGetProperty` (needs no handle and no GPU).
fn cublas_version() -> Option<(i32, i32, i32)> {
    use cudarc::cublas::sys::{cublasGetProperty, cublasStatus_t, libraryPropertyType};
    let property = |p: libraryPropertyType| {
        let mut v = 0;
        // SAFETY: the library is present; cublasGetProperty writes one int.
        let rc = unsafe { cublasGetProperty(p, &mut v) };
        (rc == cublasStatus_t::CUBLAS_STATUS_SUCCESS).then_some(v)
    };
    quietly(|| {
        Some((
            property(libraryPropertyType::MAJOR_VERSION)?,
            property(libraryPropertyType::MINOR_VERSION)?,
            property(libraryPropertyType::PATCH_LEVEL)?,
        ))
    })
    .ok()
    .flatten()
}

/// Probes the driver, NVRTC and cuBLAS; never panics.
pub fn probe() -> CudaReport {
    let mut r = CudaReport {
        driver_present: driver_present(),
        driver_candidates: cudarc::get_lib_name_candidates("cuda"),
        driver_version: None,
        devices: Vec::new(),
        nvrtc_present: nvrtc_present(),
        nvrtc_version: None,
        cublas_present: cublas_present(),
        cublas_version: None,
        error: None,
    };
    if r.cublas_present {
        r.cublas_version = cublas_version();
    }
    if r.nvrtc_present {
        r.nvrtc_version = quietly(|| {
            let (mut major, mut minor) = (0, 0);
            // SAFETY: the library is present; nvrtcVersion writes two ints.
            let rc = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
            (rc == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS).then_some((major, minor))
        })
        .ok()
        .flatten();
    }
    if !r.driver_present {
        return r;
    }
    match quietly(query_driver) {
        Ok(Ok((version, devices))) => {
            r.driver_version = Some(version);
            r.devices = devices;
        }
        Ok(Err(e)) => r.error = Some(e),
        Err(panic) => r.error = Some(format!("the CUDA driver could not be queried: {panic}")),
    }
    r
}

fn query_driver() -> Result<((i32, i32), Vec<GpuInfo>), String> {
    use cudarc::driver::{result, sys};
    let mut v = 0i32;
    // SAFETY: the library is present; cuDriverGetVersion writes one int and needs no cuInit.
    let rc = unsafe { sys::cuDriverGetVersion(&mut v) };
    if rc != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuDriverGetVersion failed: {rc:?}"));
    }
    let version = (v / 1000, (v % 1000) / 10);
    result::init().map_err(|e| format!("cuInit failed: {e}"))?;
    let count = result::device::get_count().map_err(|e| format!("cuDeviceGetCount failed: {e}"))?;
    let mut devices = Vec::new();
    for ordinal in 0..count {
        let dev =
            result::device::get(ordinal).map_err(|e| format!("cuDeviceGet({ordinal}): {e}"))?;
        let name = result::device::get_name(dev).unwrap_or_else(|_| "?".into());
        // SAFETY: `dev` came from cuDeviceGet.
        let total = unsafe { result::device::total_mem(dev) }.unwrap_or(0) as u64;
        let attr = |a| unsafe { result::device::get_attribute(dev, a) }.unwrap_or(-1);
        let cc = (
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
        );
        devices.push(GpuInfo {
            ordinal: ordinal as usize,
            name,
            total_memory: total,
            compute_capability: cc,
        });
    }
    Ok((version, devices))
}

/// Runs `f`, turning a panic into an error string without printing the panic message.
pub fn quietly<T>(f: impl FnOnce() -> T + std::panic::UnwindSafe) -> Result<T, String> {
    // The panic hook is process-wide: one caller at a time, or two could leave the silent hook
    // installed for good.
    static HOOK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = HOOK.lock().unwrap_or_else(|p| p.into_inner());
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let out = std::panic::catch_unwind(f);
    std::panic::set_hook(hook);
    out.map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "unknown panic".into())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_never_panics_and_is_consistent() {
        let r = probe();
        if !r.driver_present {
            assert!(r.devices.is_empty() && r.driver_version.is_none());
            assert!(r.driver_candidates.iter().any(|c| c.contains("cuda")));
        }
    }
}
