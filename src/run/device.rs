//! Where a run computes: the device spec (`--device`, parsed by `cli::device`), the GEMM choice,
//! and the spec's resolution against what the CUDA driver sees.
//!
//! Spec syntax ([`DeviceSpec`]): `auto` | `cpu` | `cuda` | `cuda:0,2`; hidden, for tests:
//! `emu` | `emu:N` | `emu:NxSIZE` (the GPU backend on N host-emulated devices). A bad spec is a
//! usage error (exit 2) naming the flag, the expected form and what was found.
//!
//! Resolution ([`resolve`]), from a driver probe ([`crate::backend::gpu::driver::probe`]):
//! - `cpu`: the CPU reference backend;
//! - `cuda`: every GPU the driver sees; `cuda:0,2`: those ordinals. No driver, a driver that
//!   fails, no GPU or an ordinal the driver does not see is an error (exit 1) naming what is
//!   missing;
//! - `auto`: every visible GPU when the driver works and sees at least one, else the CPU with
//!   exactly one note for stderr saying why;
//! - `emu...`: N emulated devices (1 TiB each unless sized), to run the whole GPU path,
//!   multi-device placement included, on machines without a GPU.

use crate::backend::gpu::driver::CudaReport;
use crate::backend::gpu::GemmType;
use crate::devices::plan::DeviceSet;

/// Capacity of an emulated device when the spec gives none.
pub const EMU_DEFAULT_CAPACITY: u64 = 1 << 40;

/// Where the model runs, as written on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceSpec {
    /// Every visible GPU, else the CPU (with a note).
    Auto,
    /// The CPU reference backend.
    Cpu,
    /// GPUs by ordinal; `None` = every visible GPU.
    Cuda(Option<Vec<usize>>),
    /// Hidden, for tests and CI (`emu`, `emu:N`, `emu:NxSIZE`): the GPU backend on
    /// host-emulated devices of these capacities, so the whole CUDA code path runs without a
    /// GPU. Not listed in `--help`.
    Emu(Vec<u64>),
}

const FORM: &str = "expected auto, cpu, cuda, or cuda:N,... with GPU ordinals (cuda:0 or cuda:0,2)";

impl std::str::FromStr for DeviceSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        match t {
            "auto" => return Ok(DeviceSpec::Auto),
            "cpu" => return Ok(DeviceSpec::Cpu),
            "cuda" => return Ok(DeviceSpec::Cuda(None)),
            "emu" => return Ok(DeviceSpec::Emu(vec![EMU_DEFAULT_CAPACITY])),
            _ => {}
        }
        if let Some(list) = t.strip_prefix("cuda:") {
            let mut ordinals = Vec::new();
            for part in list.split(',') {
                let p = part.trim();
                if p.is_empty() {
                    return Err(format!("{FORM}; found {t:?}, which has an empty ordinal"));
                }
                let o: usize = p
                    .parse()
                    .map_err(|_| format!("{FORM}; found {t:?}: {p:?} is not a GPU ordinal"))?;
                if ordinals.contains(&o) {
                    return Err(format!("{FORM}; found {t:?}: GPU {o} is listed twice"));
                }
                ordinals.push(o);
            }
            return Ok(DeviceSpec::Cuda(Some(ordinals)));
        }
        if let Some(rest) = t.strip_prefix("emu:") {
            const EMU: &str =
                "expected emu, emu:N or emu:NxSIZE (N emulated devices, e.g. emu:2 or emu:2x8G)";
            if let Ok(n) = rest.trim().parse::<usize>() {
                if n == 0 || n > 64 {
                    return Err(format!("{EMU}; found {t:?}: N must be 1..=64"));
                }
                return Ok(DeviceSpec::Emu(vec![EMU_DEFAULT_CAPACITY; n]));
            }
            let set: DeviceSet = rest
                .parse()
                .map_err(|e| format!("{EMU}; found {t:?}: {e}"))?;
            if set.capacities.len() > 64 {
                return Err(format!("{EMU}; found {t:?}: at most 64 devices"));
            }
            return Ok(DeviceSpec::Emu(set.capacities));
        }
        Err(format!("{FORM}; found {t:?}"))
    }
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSpec::Auto => f.write_str("auto"),
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(None) => f.write_str("cuda"),
            DeviceSpec::Cuda(Some(o)) => {
                let list: Vec<String> = o.iter().map(|x| x.to_string()).collect();
                write!(f, "cuda:{}", list.join(","))
            }
            DeviceSpec::Emu(c) => write!(f, "emu:{}", c.len()),
        }
    }
}

/// Name of a GEMM type in reports (`bf16`, `f32`).
pub fn gemm_name(g: GemmType) -> &'static str {
    match g {
        GemmType::Bf16 => "bf16",
        GemmType::F32 => "f32",
    }
}

/// The device and GEMM choice of a run (what `--device` and `--gpu-gemm` say).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceChoice {
    pub device: DeviceSpec,
    /// The GEMM operands asked for; `None`: not asked (f32 on a GPU, nothing to ignore on the
    /// CPU).
    pub gpu_gemm: Option<GemmType>,
    /// `--cpu-gemm`: the CPU backend's linear products; `None`: not asked (f32).
    pub cpu_gemm: Option<GemmType>,
}

impl DeviceChoice {
    /// The CPU reference backend, no GEMM choice (what `demo` runs on).
    pub fn cpu() -> Self {
        DeviceChoice {
            device: DeviceSpec::Cpu,
            gpu_gemm: None,
            cpu_gemm: None,
        }
    }

    /// The GEMM type of GPU runs.
    pub fn gemm(&self) -> GemmType {
        self.gpu_gemm.unwrap_or(GemmType::F32)
    }
}

/// Which backend a spec resolves to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolved {
    Cpu,
    /// CUDA devices by ordinal, in the order given.
    Cuda(Vec<usize>),
    /// Emulated devices of these capacities.
    Emu(Vec<u64>),
}

/// A spec that cannot be honoured on this machine.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error(
        "--device {spec}: no CUDA driver found: {lib} could not be loaded (install the NVIDIA \
         driver or put its directory on LD_LIBRARY_PATH; `needlescope doctor` shows what was \
         found); --device cpu runs the CPU reference backend"
    )]
    NoDriver { spec: String, lib: String },
    #[error("--device {spec}: the CUDA driver is present but cannot be used: {why}")]
    DriverFailed { spec: String, why: String },
    #[error(
        "--device {spec}: the CUDA driver sees no GPU; --device cpu runs the CPU reference backend"
    )]
    NoGpu { spec: String },
    #[error("--device {spec}: GPU {ordinal} does not exist: the CUDA driver sees {count} GPU(s): {list}")]
    NoSuchGpu {
        spec: String,
        ordinal: usize,
        count: usize,
        list: String,
    },
}

/// The driver library name to mention: `libcuda.so.1` when among the candidates.
fn driver_lib(probe: &CudaReport) -> String {
    let want = "libcuda.so.1";
    if probe.driver_candidates.iter().any(|c| c == want) || probe.driver_candidates.is_empty() {
        want.to_string()
    } else {
        probe.driver_candidates[0].clone()
    }
}

/// Resolves `spec` against a driver probe (called only for `auto` and `cuda`). Returns the
/// backend and, for an `auto` that falls back to the CPU, the one note line for stderr.
pub fn resolve(
    spec: &DeviceSpec,
    probe: impl FnOnce() -> CudaReport,
) -> Result<(Resolved, Option<String>), DeviceError> {
    let ordinals = match spec {
        DeviceSpec::Cpu => return Ok((Resolved::Cpu, None)),
        DeviceSpec::Emu(c) => return Ok((Resolved::Emu(c.clone()), None)),
        DeviceSpec::Auto => None,
        DeviceSpec::Cuda(o) => Some(o.clone()),
    };
    let r = probe();
    let name = spec.to_string();
    let missing = if !r.driver_present {
        Some(DeviceError::NoDriver {
            spec: name.clone(),
            lib: driver_lib(&r),
        })
    } else if let Some(why) = &r.error {
        Some(DeviceError::DriverFailed {
            spec: name.clone(),
            why: why.clone(),
        })
    } else if r.devices.is_empty() {
        Some(DeviceError::NoGpu { spec: name.clone() })
    } else {
        None
    };
    if let Some(e) = missing {
        if *spec != DeviceSpec::Auto {
            return Err(e);
        }
        let why = match e {
            DeviceError::NoDriver { lib, .. } => format!("no CUDA driver found ({lib})"),
            DeviceError::DriverFailed { why, .. } => format!("the CUDA driver failed ({why})"),
            _ => "the CUDA driver sees no GPU".to_string(),
        };
        return Ok((Resolved::Cpu, Some(auto_note(&why))));
    }
    let visible: Vec<usize> = r.devices.iter().map(|d| d.ordinal).collect();
    let chosen = match ordinals.flatten() {
        None => visible,
        Some(list) => {
            if let Some(&bad) = list.iter().find(|o| !visible.contains(o)) {
                return Err(DeviceError::NoSuchGpu {
                    spec: name,
                    ordinal: bad,
                    count: visible.len(),
                    list: r
                        .devices
                        .iter()
                        .map(|d| format!("{} ({})", d.ordinal, d.name))
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
            list
        }
    };
    Ok((Resolved::Cuda(chosen), None))
}

/// The note printed when `--device auto` runs on the CPU.
pub fn auto_note(why: &str) -> String {
    format!("note: --device auto: {why}; running on the CPU reference backend")
}

#[cfg(test)]
mod tests {
    //! Unit tests of `--device` parsing and resolution against synthetic driver probes.

    use super::*;
    use crate::backend::gpu::driver::GpuInfo;

    fn report(driver: bool, gpus: usize, error: Option<&str>) -> CudaReport {
        CudaReport {
            driver_present: driver,
            driver_candidates: vec!["libcuda.so".into(), "libcuda.so.1".into()],
            driver_version: driver.then_some((13, 0)),
            devices: (0..gpus)
                .map(|i| GpuInfo {
                    ordinal: i,
                    name: format!("GPU{i}"),
                    total_memory: 80 << 30,
                    compute_capability: (9, 0),
                })
                .collect(),
            nvrtc_present: false,
            nvrtc_version: None,
            cublas_present: false,
            cublas_version: None,
            error: error.map(str::to_string),
        }
    }

    fn spec(s: &str) -> DeviceSpec {
        s.parse().unwrap()
    }

    #[test]
    fn specs_parse() {
        assert_eq!(spec("auto"), DeviceSpec::Auto);
        assert_eq!(spec("cpu"), DeviceSpec::Cpu);
        assert_eq!(spec("cuda"), DeviceSpec::Cuda(None));
        assert_eq!(spec("cuda:0"), DeviceSpec::Cuda(Some(vec![0])));
        assert_eq!(spec("cuda:2,0"), DeviceSpec::Cuda(Some(vec![2, 0])));
        assert_eq!(spec("emu"), DeviceSpec::Emu(vec![EMU_DEFAULT_CAPACITY]));
        assert_eq!(
            spec("emu:3"),
            DeviceSpec::Emu(vec![EMU_DEFAULT_CAPACITY; 3])
        );
        assert_eq!(spec("emu:2x1G"), DeviceSpec::Emu(vec![1 << 30; 2]));
        assert_eq!(spec("cuda:0,2").to_string(), "cuda:0,2");
    }

    #[test]
    fn bad_specs_say_what_was_expected_and_found() {
        for (bad, why) in [
            ("cuda:", "empty ordinal"),
            ("cuda:x", "\"x\" is not a GPU ordinal"),
            ("cuda:0,,1", "empty ordinal"),
            ("cuda:1,1", "listed twice"),
            ("gpu", "found \"gpu\""),
            ("CUDA", "found \"CUDA\""),
            ("", "found \"\""),
        ] {
            let e = bad.parse::<DeviceSpec>().unwrap_err();
            assert!(e.contains("expected auto, cpu, cuda"), "{bad}: {e}");
            assert!(e.contains(why), "{bad}: {e}");
        }
        for bad in ["emu:0", "emu:x", "emu:2x"] {
            let e = bad.parse::<DeviceSpec>().unwrap_err();
            assert!(e.contains("expected emu, emu:N"), "{bad}: {e}");
        }
    }

    #[test]
    fn cpu_and_emu_never_probe_the_driver() {
        let never = || -> CudaReport { panic!("probed") };
        assert_eq!(resolve(&spec("cpu"), never).unwrap(), (Resolved::Cpu, None));
        let (r, note) = resolve(&spec("emu:2"), never).unwrap();
        assert_eq!(r, Resolved::Emu(vec![EMU_DEFAULT_CAPACITY; 2]));
        assert!(note.is_none());
    }

    #[test]
    fn auto_falls_back_to_the_cpu_with_one_note() {
        for (probe, why) in [
            (
                report(false, 0, None),
                "no CUDA driver found (libcuda.so.1)",
            ),
            (report(true, 0, None), "the CUDA driver sees no GPU"),
            (
                report(true, 0, Some("cuInit failed")),
                "the CUDA driver failed (cuInit failed)",
            ),
        ] {
            let (r, note) = resolve(&DeviceSpec::Auto, || probe).unwrap();
            assert_eq!(r, Resolved::Cpu);
            let note = note.unwrap();
            assert_eq!(note.lines().count(), 1);
            assert!(note.starts_with("note: --device auto: "), "{note}");
            assert!(note.contains(why), "{note}");
            assert!(
                note.ends_with("running on the CPU reference backend"),
                "{note}"
            );
        }
        let (r, note) = resolve(&DeviceSpec::Auto, || report(true, 2, None)).unwrap();
        assert_eq!(r, Resolved::Cuda(vec![0, 1]));
        assert!(note.is_none());
    }

    #[test]
    fn cuda_fails_naming_what_is_missing() {
        let e = resolve(&spec("cuda"), || report(false, 0, None)).unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("--device cuda: no CUDA driver found: libcuda.so.1"),
            "{m}"
        );
        let e = resolve(&spec("cuda:0"), || report(true, 0, None)).unwrap_err();
        assert!(e.to_string().contains("sees no GPU"), "{e}");
        let e = resolve(&spec("cuda"), || report(true, 1, Some("cuInit: 999"))).unwrap_err();
        assert!(e.to_string().contains("cannot be used: cuInit: 999"), "{e}");
        let e = resolve(&spec("cuda:0,3"), || report(true, 2, None)).unwrap_err();
        let m = e.to_string();
        assert!(m.contains("--device cuda:0,3: GPU 3 does not exist"), "{m}");
        assert!(m.contains("sees 2 GPU(s): 0 (GPU0), 1 (GPU1)"), "{m}");
    }

    #[test]
    fn cuda_takes_all_or_the_listed_gpus() {
        let r = resolve(&spec("cuda"), || report(true, 3, None)).unwrap();
        assert_eq!(r, (Resolved::Cuda(vec![0, 1, 2]), None));
        let r = resolve(&spec("cuda:2,0"), || report(true, 3, None)).unwrap();
        assert_eq!(r, (Resolved::Cuda(vec![2, 0]), None));
    }

    #[test]
    fn gemm_defaults_to_f32() {
        assert_eq!(DeviceChoice::cpu().gemm(), GemmType::F32);
        let a = DeviceChoice {
            device: DeviceSpec::Auto,
            gpu_gemm: Some(GemmType::Bf16),
            cpu_gemm: None,
        };
        assert_eq!(a.gemm(), GemmType::Bf16);
    }
}
