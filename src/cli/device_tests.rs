//! Unit tests of `--device` parsing and resolution against synthetic driver probes.

use super::*;
use crate::cuda_probe::GpuInfo;

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
    assert_eq!(DeviceArgs::cpu().gemm(), GemmType::F32);
    let a = DeviceArgs {
        device: DeviceSpec::Auto,
        gpu_gemm: Some(GpuGemm::Bf16),
    };
    assert_eq!(a.gemm(), GemmType::Bf16);
}
