//! `needlescope doctor`: what this machine offers: CPU threads, the CUDA driver and its GPUs
//! (name, memory, compute capability), NVRTC. `--compile-kernels` will compile every NVRTC
//! kernel for the given architectures once the CUDA backend lands.

use clap::Args;
use std::io::Write;

use super::values::parse_arch;
use super::{human_bytes, NotImplemented};
use crate::cuda_probe;

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
    let r = cuda_probe::probe();
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
    if !args.compile_kernels.is_empty() {
        return Err(NotImplemented {
            command: "doctor --compile-kernels",
            why: "no NVRTC kernels exist yet (the CUDA backend has not landed)",
        }
        .into());
    }
    Ok(())
}
