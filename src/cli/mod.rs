//! The command line: one file per subcommand (its clap argument struct and the orchestration
//! that calls into the library), plus the flag syntax shared between them ([`values`]).
//!
//! Flags parse into validated values at the clap layer (token counts, depth lists, profile
//! lists, device specs), so a bad value is a usage error (exit 2) that names the flag and the
//! expected form. Subcommands print to the writer they are given (stdout in the binary) and
//! return `anyhow::Result`; `main` prints the whole error chain and exits 1.
//!
//! The commands that run the model (probe, sweep, trace, bench) share `--device` /
//! `--gpu-gemm` ([`device::DeviceArgs`]); [`engine::Target`] is the one place that turns them
//! into a backend (CPU reference, CUDA GPUs, or the host emulator of the GPU backend), places
//! the layers over the devices and loads the engine.

use clap::{Parser, Subcommand};
use std::io::Write;

pub mod bench;
pub mod demo;
pub mod device;
pub mod doctor;
pub mod engine;
pub mod inspect;
pub mod probe;
pub mod report;
pub mod sweep;
pub mod synth;
pub mod trace;
pub mod values;

/// needlescope: explains why a DeepSeek-V4 model forgets a fact that sits in its own prompt.
///
/// It runs the model over a needle-in-a-haystack prompt and shows, on every CSA layer, where the
/// lightning indexer ranked the needle and whether it survived top-k selection, under several
/// index-key numerics (fp8, bf16, fp4, ...).
#[derive(Parser, Debug)]
#[command(name = "needlescope", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Synthetic model, full sweep, CSV + PNG, no downloads
    Demo(demo::DemoArgs),
    /// What is in a checkpoint (or a config): schedule, sizes, inventory check, memory plan
    Inspect(inspect::InspectArgs),
    /// One prompt: needle ranks on every CSA layer under each index profile and top-k
    Probe(probe::ProbeArgs),
    /// Lengths x depths x profiles x top-k grid, resumable, into a report directory
    Sweep(sweep::SweepArgs),
    /// Re-render tables, CSV and PNG of a finished or interrupted sweep
    Report(report::ReportArgs),
    /// Dump indexer scores, top-k and logits of a token file to safetensors
    Trace(trace::TraceArgs),
    /// Write a deterministic synthetic checkpoint (tiny, planted, flash)
    Synth(synth::SynthArgs),
    /// Check the environment: CPU, CUDA driver, GPUs, NVRTC
    Doctor(doctor::DoctorArgs),
    /// Time the prefill at several lengths
    Bench(bench::BenchArgs),
}

/// Runs a parsed command line, printing to stdout.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    run_to(cli, &mut out)?;
    out.flush()?;
    Ok(())
}

/// Runs a parsed command line, printing to `out`.
pub fn run_to(cli: Cli, out: &mut dyn Write) -> anyhow::Result<()> {
    match cli.command {
        Command::Demo(a) => demo::run(&a, out),
        Command::Inspect(a) => inspect::run(&a, out),
        Command::Probe(a) => probe::run(&a, out),
        Command::Sweep(a) => sweep::run(&a, out),
        Command::Report(a) => report::run(&a, out),
        Command::Trace(a) => trace::run(&a, out),
        Command::Synth(a) => synth::run(&a, out),
        Command::Doctor(a) => doctor::run(&a, out),
        Command::Bench(a) => bench::run(&a, out),
    }
}

/// Whether an error is (caused by) writing to a closed pipe, which is not a failure.
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    use std::io::ErrorKind::BrokenPipe;
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == BrokenPipe)
            || e.downcast_ref::<serde_json::Error>()
                .is_some_and(|j| j.io_error_kind() == Some(BrokenPipe))
    })
}

/// `1234567` -> `1,234,567`.
pub fn group_digits(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes in binary units: `1.50 GiB`, `12.0 MiB`, `512 B`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn digits_group_by_thousands() {
        assert_eq!(group_digits(0), "0");
        assert_eq!(group_digits(999), "999");
        assert_eq!(group_digits(1000), "1,000");
        assert_eq!(group_digits(159_609_485_896), "159,609,485,896");
        assert_eq!(human_bytes(1536), "1.50 KiB");
        assert_eq!(human_bytes(12), "12 B");
    }
}
