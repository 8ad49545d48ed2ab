//! `needlescope doctor`: what this machine offers: CPU threads, the CUDA driver and its GPUs
//! (name, memory, compute capability), NVRTC, cuBLAS. `--compile-kernels` compiles every NVRTC kernel
//! for the given architectures (no GPU needed) into the kernel caches; with a driver present the
//! CUBINs are cached under its version, so the engine's first run on this machine finds them.

use clap::Args;
use std::io::Write;

use super::flags::parse_arch;
use crate::backend::gpu::driver;
use crate::backend::gpu::kernels::{self, CubinSource};
use crate::units::human_bytes;

#[derive(Args, Debug, Clone)]
pub struct DoctorArgs {
    /// Compile every NVRTC kernel for these architectures, comma list (sm_90,sm_120)
    #[arg(long, value_name = "ARCH,...", value_delimiter = ',', value_parser = parse_arch)]
    pub compile_kernels: Vec<String>,
}

pub fn run(args: &DoctorArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    writeln!(out, "needlescope {}", env!("CARGO_PKG_VERSION"))?;
    writeln!(
        out,
        "cpu          {} threads (rayon)",
        rayon::current_num_threads()
    )?;
    let r = driver::probe();
    if !r.driver_present {
        let tried: std::collections::BTreeSet<&String> = r.driver_candidates.iter().collect();
        writeln!(
            out,
            "cuda driver  not found: no loadable libcuda ({} names tried, e.g. libcuda.so.1; set LD_LIBRARY_PATH if it is installed elsewhere); GPU backend unavailable, the CPU backend will be used",
            tried.len()
        )?;
    } else {
        match r.driver_version {
            Some((major, minor)) => writeln!(out, "cuda driver  CUDA {major}.{minor}")?,
            None => writeln!(out, "cuda driver  present")?,
        }
        if let Some(e) = &r.error {
            writeln!(out, "cuda error   {e}")?;
        }
        if r.devices.is_empty() && r.error.is_none() {
            writeln!(out, "gpus         none visible")?;
        }
        for g in &r.devices {
            writeln!(
                out,
                "gpu {}        {} | {} | compute capability {}.{} ({})",
                g.ordinal,
                g.name,
                human_bytes(g.total_memory),
                g.compute_capability.0,
                g.compute_capability.1,
                g.arch()
            )?;
        }
    }
    match (r.nvrtc_present, r.nvrtc_version) {
        (true, Some((major, minor))) => writeln!(out, "nvrtc        {major}.{minor}")?,
        (true, None) => writeln!(out, "nvrtc        present (version unknown)")?,
        (false, _) => writeln!(
            out,
            "nvrtc        not found (kernels cannot be compiled; install the NVRTC library or wheel)"
        )?,
    }
    match (r.cublas_present, r.cublas_version) {
        (true, Some((major, minor, patch))) => {
            writeln!(out, "cublas       {major}.{minor}.{patch}")?
        }
        (true, None) => writeln!(out, "cublas       present (version unknown)")?,
        (false, _) => writeln!(
            out,
            "cublas       not found (libcublas.so.13: the GPU backend cannot run; install the CUDA 13 toolkit or the nvidia-cublas wheel and add its lib directory to LD_LIBRARY_PATH)"
        )?,
    }
    if !args.compile_kernels.is_empty() {
        let driver = r.driver_version.map_or_else(
            || "none".to_string(),
            |(major, minor)| format!("{major}.{minor}"),
        );
        // Each architecture once, in the order given (`sm_90,sm_90` compiles it once).
        let mut archs: Vec<String> = Vec::new();
        for a in &args.compile_kernels {
            if !archs.contains(a) {
                archs.push(a.clone());
            }
        }
        compile_kernels(&archs, &driver, out)?;
    }
    Ok(())
}

/// Compiles every kernel family for every architecture through NVRTC (no GPU needed), one line
/// per family and architecture; an error if any fails, naming them.
fn compile_kernels(archs: &[String], driver: &str, out: &mut dyn Write) -> anyhow::Result<()> {
    let version = kernels::nvrtc_version()?;
    writeln!(
        out,
        "compiling    {} kernel families for {} with NVRTC {}.{} (options {})",
        kernels::FAMILIES.len(),
        archs.join(", "),
        version.0,
        version.1,
        kernels::NVRTC_OPTIONS.join(" ")
    )?;
    let mut failed = Vec::new();
    for r in kernels::compile_all(archs, driver) {
        match &r.result {
            Ok((bytes, source)) => writeln!(
                out,
                "  ok         {:<8} {:<15} {:>2} kernels, {:>7} bytes CUBIN{}",
                r.arch,
                format!("{}.cu", r.family),
                r.kernels,
                bytes,
                match source {
                    CubinSource::Compiled => "",
                    CubinSource::Disk => " (disk cache)",
                    CubinSource::Process => " (cached)",
                }
            )?,
            Err(e) => {
                writeln!(out, "  FAILED     {:<8} {}.cu: {e}", r.arch, r.family)?;
                failed.push(format!("{}.cu for {}", r.family, r.arch));
            }
        }
    }
    if !failed.is_empty() {
        anyhow::bail!(
            "{} kernel compilation(s) failed: {}",
            failed.len(),
            failed.join(", ")
        );
    }
    writeln!(out, "kernels      all compiled")?;
    Ok(())
}
