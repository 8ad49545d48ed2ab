//! The kernel sources (`kernels/*.cu`, embedded by build.rs) and NVRTC compilation.
//!
//! Each family is compiled as `common.cuh` + the family's source, for one real architecture
//! (`sm_90`, `sm_120`, ...) to a CUBIN, with `--fmad=false` (no FMA contraction, so the device
//! rounds like the CPU reference and the host emulator) and `-default-device`. A CUBIN for a real
//! architecture needs no PTX JIT, so a newer NVRTC (13.x) works with an older CUDA 13 driver.
//!
//! Compiled images are cached twice: per process (a map keyed by family and architecture) and on
//! disk under `$NEEDLESCOPE_KERNEL_CACHE` or `~/.cache/needlescope/kernels/`, one file per
//! sha256 of (source, options, architecture, NVRTC version, driver version). Each file is the
//! CUBIN sealed with its length and sha256 ([`seal_cache_entry`]): a CUBIN is an ELF image whose
//! magic survives truncation and whose code has no checksum of its own, so a torn, truncated or
//! damaged file would otherwise load (and fail, or compute garbage) on every later run. A file
//! that does not unseal ([`unseal_cache_entry`]) or cannot be read is ignored and rebuilt.

use super::error::GpuError;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/kernel_sources.rs"));
}

pub use embedded::{COMMON, FAMILIES};

/// NVRTC options every family is compiled with (the architecture is added per call).
pub const NVRTC_OPTIONS: &[&str] = &["--fmad=false", "-default-device", "--std=c++17"];

pub use super::kernel_scan::kernel_names;

/// The family that defines `kernel`.
pub fn family_of(kernel: &str) -> Option<&'static str> {
    static MAP: OnceLock<HashMap<String, &'static str>> = OnceLock::new();
    MAP.get_or_init(|| {
        FAMILIES
            .iter()
            .flat_map(|(f, src)| kernel_names(src).into_iter().map(move |k| (k, *f)))
            .collect()
    })
    .get(kernel)
    .copied()
}

/// The full NVRTC source of a family.
pub fn family_source(family: &str) -> Option<String> {
    FAMILIES
        .iter()
        .find(|(f, _)| *f == family)
        .map(|(_, src)| format!("{COMMON}\n#line 1 \"{family}.cu\"\n{src}"))
}

/// Checks an architecture name (`sm_90`, `sm_120a`, `compute_90` is refused: we need CUBINs).
pub fn check_arch(arch: &str) -> Result<(), GpuError> {
    let digits = arch.strip_prefix("sm_").unwrap_or("");
    // At most one `a` / `f` suffix (`sm_90a`, `sm_100f`; `sm_90aa` is no architecture), and
    // two or three digits (`sm_75` .. `sm_120`).
    let core = digits.strip_suffix(['a', 'f']).unwrap_or(digits);
    if (2..=3).contains(&core.len()) && core.chars().all(|c| c.is_ascii_digit()) {
        Ok(())
    } else {
        Err(GpuError::Nvrtc(format!(
            "architecture {arch:?}: expected a real architecture like sm_90 or sm_120"
        )))
    }
}

/// The NVRTC library version, or an error saying it could not be loaded.
pub fn nvrtc_version() -> Result<(i32, i32), GpuError> {
    if !crate::backend::gpu::driver::nvrtc_present() {
        return Err(GpuError::Nvrtc(format!(
            "the NVRTC library could not be loaded (tried {}); install the CUDA toolkit's \
             libnvrtc or the PyPI wheel nvidia-cuda-nvrtc and put its lib directory on \
             LD_LIBRARY_PATH",
            cudarc::get_lib_name_candidates("nvrtc")
                .iter()
                .filter(|n| n.starts_with("libnvrtc.so"))
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present; nvrtcVersion writes two ints.
    let rc = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if rc != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(GpuError::Nvrtc(format!("nvrtcVersion failed: {rc:?}")));
    }
    Ok((major, minor))
}

fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("NEEDLESCOPE_KERNEL_CACHE") {
        return Some(PathBuf::from(d));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/needlescope/kernels"))
}

/// Compiles one family for `arch` to a CUBIN (no caching).
pub fn compile_family(family: &str, arch: &str) -> Result<Vec<u8>, GpuError> {
    use cudarc::nvrtc::sys as nv;
    check_arch(arch)?;
    nvrtc_version()?;
    let src = family_source(family)
        .ok_or_else(|| GpuError::Nvrtc(format!("no kernel family {family:?}")))?;
    let c_src = std::ffi::CString::new(src).map_err(|e| GpuError::Nvrtc(e.to_string()))?;
    let c_name = std::ffi::CString::new(format!("{family}.cu")).unwrap();
    let prog = cudarc::nvrtc::result::create_program(&c_src, Some(&c_name))
        .map_err(|e| GpuError::Nvrtc(format!("{family}: create program: {e:?}")))?;
    let mut opts: Vec<String> = NVRTC_OPTIONS.iter().map(|s| s.to_string()).collect();
    opts.push(format!("--gpu-architecture={arch}"));
    // SAFETY: prog is a live program; the option strings outlive the call.
    let compiled = unsafe { cudarc::nvrtc::result::compile_program(prog, &opts) };
    let log = unsafe { cudarc::nvrtc::result::get_program_log(prog) }
        .map(|l| {
            let bytes: Vec<u8> = l.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
            String::from_utf8_lossy(&bytes).trim().to_string()
        })
        .unwrap_or_default();
    let result = match compiled {
        Err(e) => Err(GpuError::Nvrtc(format!(
            "{family}.cu for {arch}: {e:?}\n{log}"
        ))),
        Ok(()) => {
            let mut size = 0usize;
            // SAFETY: compiled program; size then buffer of that size.
            let rc = unsafe { nv::nvrtcGetCUBINSize(prog, &mut size) };
            if rc != nv::nvrtcResult::NVRTC_SUCCESS || size == 0 {
                Err(GpuError::Nvrtc(format!(
                    "{family}.cu for {arch}: no CUBIN ({rc:?}); is {arch} a real architecture?"
                )))
            } else {
                let mut cubin = vec![0u8; size];
                let rc = unsafe { nv::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast()) };
                if rc == nv::nvrtcResult::NVRTC_SUCCESS {
                    Ok(cubin)
                } else {
                    Err(GpuError::Nvrtc(format!(
                        "{family}.cu: nvrtcGetCUBIN: {rc:?}"
                    )))
                }
            }
        }
    };
    // SAFETY: destroyed once.
    let _ = unsafe { cudarc::nvrtc::result::destroy_program(prog) };
    result
}

/// The disk-cache key of a family for `arch` under `driver` (a version string; "none" when no
/// driver is involved, as for `doctor --compile-kernels`).
pub fn cache_key(family: &str, arch: &str, driver: &str) -> Result<String, GpuError> {
    let src = family_source(family)
        .ok_or_else(|| GpuError::Nvrtc(format!("no kernel family {family:?}")))?;
    let (ma, mi) = nvrtc_version()?;
    let mut h = Sha256::new();
    h.update(src.as_bytes());
    for o in NVRTC_OPTIONS {
        h.update(o.as_bytes());
        h.update([0]);
    }
    h.update(format!("{arch}|nvrtc {ma}.{mi}|driver {driver}").as_bytes());
    let d = h.finalize();
    Ok(format!(
        "{family}-{arch}-{}",
        d.iter()
            .take(12)
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    ))
}

/// Extension of the disk cache's files (sealed CUBINs; files of the unsealed format, `.cubin`,
/// written by earlier versions, are not read).
pub const CACHE_EXTENSION: &str = "sealed-cubin";

/// Tag of the trailer [`seal_cache_entry`] appends.
const SEAL_TAG: &[u8; 8] = b"NSCUBIN1";
/// Trailer: tag, image length (u64 little-endian), sha256 of the image.
const SEAL_BYTES: usize = 8 + 8 + 32;

/// A disk-cache file for the CUBIN `image`: the image, then a trailer holding a tag, the
/// image's length and its sha256, so that [`unseal_cache_entry`] refuses any truncation or
/// damage (an ELF header alone cannot: it survives truncation).
pub fn seal_cache_entry(image: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(image.len() + SEAL_BYTES);
    out.extend_from_slice(image);
    out.extend_from_slice(SEAL_TAG);
    out.extend_from_slice(&(image.len() as u64).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(image));
    out
}

/// The CUBIN inside a disk-cache file written by [`seal_cache_entry`], or None when the file is
/// truncated, damaged, of another format, or not an ELF image.
pub fn unseal_cache_entry(file: &[u8]) -> Option<&[u8]> {
    let body = file.len().checked_sub(SEAL_BYTES)?;
    let (image, trailer) = file.split_at(body);
    let (tag, rest) = trailer.split_at(8);
    let (len, digest) = rest.split_at(8);
    let len = u64::from_le_bytes(len.try_into().ok()?);
    let sealed = tag == SEAL_TAG
        && len == image.len() as u64
        && image.starts_with(b"\x7fELF")
        && Sha256::digest(image).as_slice() == digest;
    sealed.then_some(image)
}

/// Where a compiled image came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CubinSource {
    Process,
    Disk,
    Compiled,
}

/// A family's CUBIN for `arch`, from the process cache, the disk cache, or NVRTC (then stored in
/// both caches).
pub fn cubin(
    family: &str,
    arch: &str,
    driver: &str,
) -> Result<(Arc<Vec<u8>>, CubinSource), GpuError> {
    type Cache = Mutex<HashMap<(String, String, String), Arc<Vec<u8>>>>;
    static PROCESS: OnceLock<Cache> = OnceLock::new();
    let key = (family.to_string(), arch.to_string(), driver.to_string());
    let cache = PROCESS.get_or_init(Default::default);
    if let Some(c) = cache.lock().unwrap().get(&key) {
        return Ok((c.clone(), CubinSource::Process));
    }
    let name = cache_key(family, arch, driver)?;
    let path = cache_dir().map(|d| d.join(format!("{name}.{CACHE_EXTENSION}")));
    let mut source = CubinSource::Compiled;
    let cached = path.as_ref().and_then(|p| std::fs::read(p).ok());
    let image = match cached.as_deref().and_then(unseal_cache_entry) {
        Some(image) => {
            source = CubinSource::Disk;
            image.to_vec()
        }
        // Missing, torn, truncated or foreign: compile and replace it.
        None => {
            let bytes = compile_family(family, arch)?;
            if let Some(p) = &path {
                // Best effort: write to a name unique to this process and call, then rename
                // (atomic: a reader sees the old file or the whole new one).
                if let Some(dir) = p.parent() {
                    let _ = std::fs::create_dir_all(dir);
                }
                static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
                let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let tmp = p.with_extension(format!("tmp{}-{n}", std::process::id()));
                if std::fs::write(&tmp, seal_cache_entry(&bytes)).is_ok() {
                    if std::fs::rename(&tmp, p).is_err() {
                        let _ = std::fs::remove_file(&tmp);
                    }
                } else {
                    let _ = std::fs::remove_file(&tmp);
                }
            }
            bytes
        }
    };
    let image = Arc::new(image);
    cache.lock().unwrap().insert(key, image.clone());
    Ok((image, source))
}

/// Result of compiling one family for one architecture (`doctor --compile-kernels`).
pub struct CompileReport {
    pub family: &'static str,
    pub arch: String,
    pub kernels: usize,
    pub result: Result<(usize, CubinSource), GpuError>,
}

/// Compiles every family for every architecture (through the caches, keyed under `driver`: the
/// driver's version as [`cache_key`] takes it, or "none"), reporting each.
pub fn compile_all(archs: &[String], driver: &str) -> Vec<CompileReport> {
    let mut out = Vec::new();
    for arch in archs {
        for (family, src) in FAMILIES {
            let result = check_arch(arch)
                .and_then(|_| cubin(family, arch, driver))
                .map(|(c, s)| (c.len(), s));
            out.push(CompileReport {
                family,
                arch: arch.clone(),
                kernels: kernel_names(src).len(),
                result,
            });
        }
    }
    out
}

extern "C" {
    fn ns_emu_kernel_count() -> std::ffi::c_int;
    fn ns_emu_kernel_name(i: std::ffi::c_int) -> *const std::ffi::c_char;
    fn ns_emu_kernel_sig(i: std::ffi::c_int) -> *const std::ffi::c_char;
}

/// `(name, signature)` of every kernel, in the launch table the build compiled into the host
/// emulator (the signatures every executor checks launches against).
pub fn kernel_table() -> &'static [(String, String)] {
    static TABLE: OnceLock<Vec<(String, String)>> = OnceLock::new();
    TABLE.get_or_init(|| {
        // SAFETY: the table is static C data; indices are in range.
        unsafe {
            (0..ns_emu_kernel_count())
                .map(|i| {
                    let name = std::ffi::CStr::from_ptr(ns_emu_kernel_name(i)).to_string_lossy();
                    let sig = std::ffi::CStr::from_ptr(ns_emu_kernel_sig(i)).to_string_lossy();
                    (name.into_owned(), sig.into_owned())
                })
                .collect()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_has_one_family_and_an_emulator_signature() {
        let mut seen = std::collections::HashSet::new();
        for (family, src) in FAMILIES {
            for k in kernel_names(src) {
                assert!(seen.insert(k.clone()), "kernel {k} defined twice");
                assert_eq!(family_of(&k), Some(*family));
                assert!(
                    super::super::executor::signature_of(&k).is_some(),
                    "kernel {k} missing from the emulator table"
                );
            }
        }
        assert!(!seen.is_empty());
    }

    #[test]
    fn arch_names() {
        for ok in ["sm_90", "sm_120", "sm_90a", "sm_100f"] {
            assert!(check_arch(ok).is_ok(), "{ok}");
        }
        for bad in [
            "compute_90",
            "sm9",
            "sm_",
            "90",
            "sm_x0",
            "sm_90aa",
            "sm_90af",
            "sm_1200",
            "sm_a",
        ] {
            assert!(check_arch(bad).is_err(), "{bad}");
        }
    }
}
