//! The command line: one file per subcommand (its clap argument struct and the orchestration
//! that calls into the library), plus the flag syntax shared between them ([`flags`]).
//!
//! Flags parse into validated values at the clap layer (token counts, depth lists, profile
//! lists, device specs), so a bad value is a usage error (exit 2) that names the flag and the
//! expected form. Subcommands print to the writer they are given (stdout in the binary) and
//! return `anyhow::Result`; `main` prints the whole error chain and exits 1.
//!
//! The commands that run the model (probe, sweep, trace, bench) share `--device` /
//! `--gpu-gemm` ([`device::DeviceArgs`]); [`crate::run::target::Target`] is the one place that turns them
//! into a backend (CPU reference, CUDA GPUs, or the host emulator of the GPU backend), places
//! the layers over the devices and loads the engine.

use clap::{Parser, Subcommand};
use std::io::Write;
use std::path::PathBuf;

pub mod bench;
pub mod demo;
pub mod device;
pub mod doctor;
pub mod engine;
pub mod flags;
pub mod inspect;
pub mod probe;
pub mod prompt;
pub mod report;
pub mod sweep;
pub mod synth;
pub mod trace;

/// needlescope: explains why a DeepSeek-V4 model forgets a fact that sits in its own prompt.
///
/// It runs the model over a needle-in-a-haystack prompt and shows, on every CSA layer, where the
/// lightning indexer ranked the needle and whether it survived top-k selection, under several
/// index-key numerics (fp8, bf16, fp4, ...).
#[derive(Parser, Debug)]
#[command(name = "needlescope", version, propagate_version = true)]
pub struct Cli {
    /// Threads for the CPU work (the CPU backend's GEMMs, attention, decoding; accepted before
    /// or after the subcommand) [default: RAYON_NUM_THREADS when set, else one per core]
    #[arg(long, global = true, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: Option<u16>,
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
    /// Render a prompt (a --prompt conversation or a scenario) without a model: tokens, needle spans, ids
    Prompt(prompt::PromptArgs),
    /// Lengths x depths x profiles x top-k grid, resumable, into a report directory
    Sweep(sweep::SweepArgs),
    /// Re-render the summary table, summary.json and PNGs of a report directory from its CSV records
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

/// Parses a command line as clap does, then refuses what clap's derive lets through: `--needle`
/// or `--answer` without `--prompt` (their `requires` is not enforced inside the flattened
/// group), which would otherwise be accepted and ignored. A refusal is a usage error: clap's
/// message and exit code 2, naming both flags.
pub fn parse_from<I, T>(args: I) -> Cli
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = Cli::parse_from(args);
    if let Err((sub, message)) = cli.unenforced_relations() {
        use clap::CommandFactory;
        let mut command = Cli::command();
        let mut sub = command
            .find_subcommand_mut(sub)
            .expect("a subcommand of Cli")
            .clone();
        sub.error(clap::error::ErrorKind::MissingRequiredArgument, message)
            .exit();
    }
    cli
}

impl Cli {
    /// The relations between flags that clap's derive does not enforce (see [`parse_from`]):
    /// the subcommand and the message of the first broken one.
    pub fn unenforced_relations(&self) -> Result<(), (&'static str, String)> {
        let (sub, conversation) = match &self.command {
            Command::Probe(a) => ("probe", &a.conversation),
            Command::Prompt(a) => ("prompt", &a.conversation),
            _ => return Ok(()),
        };
        if conversation.prompt.is_some() {
            return Ok(());
        }
        for (flag, given) in [
            ("--needle", !conversation.needle.is_empty()),
            ("--answer", conversation.answer.is_some()),
        ] {
            if given {
                return Err((
                    sub,
                    format!(
                        "{flag} names a needle or answer of your own conversation: it needs \
                         --prompt FILE (a scenario's needle and answer are its own)"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Runs a parsed command line, printing to stdout.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    crate::backend::cpu::tune_allocator();
    if let Some(n) = cli.threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(usize::from(n))
            .build_global()
            .map_err(|e| anyhow::anyhow!("--threads {n}: the thread pool could not start: {e}"))?;
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    run_to(cli, &mut out)?;
    out.flush()?;
    Ok(())
}

/// Runs a parsed command line, printing to `out`.
pub fn run_to(cli: Cli, out: &mut dyn Write) -> anyhow::Result<()> {
    // `--model` may name a repository of the Hugging Face cache: every command sees the
    // snapshot directory it resolves to (run::hub).
    let locate = |model: &mut PathBuf, revision: &Option<String>| -> anyhow::Result<()> {
        *model = crate::run::hub::locate_model(model, revision.as_deref())?;
        Ok(())
    };
    let name = cli.command.name();
    let result = match cli.command {
        Command::Demo(a) => demo::run(&a, out),
        Command::Inspect(mut a) => {
            if let Some(model) = a.model.as_mut() {
                locate(model, &a.revision)?;
            }
            inspect::run(&a, out)
        }
        Command::Probe(mut a) => {
            locate(&mut a.model, &a.revision)?;
            a.generate = generate_default(a.generate_flag, &a.model);
            probe::run(&a, out)
        }
        Command::Prompt(mut a) => {
            if let Some(model) = a.model.as_mut() {
                locate(model, &a.revision)?;
            }
            prompt::run(&a, out)
        }
        Command::Sweep(mut a) => {
            locate(&mut a.model, &a.revision)?;
            a.generate = generate_default(a.generate_flag, &a.model);
            sweep::run(&a, out)
        }
        Command::Report(a) => report::run(&a, out),
        Command::Trace(mut a) => {
            locate(&mut a.model, &a.revision)?;
            trace::run(&a, out)
        }
        Command::Synth(a) => synth::run(&a, out),
        Command::Doctor(a) => doctor::run(&a, out),
        Command::Bench(mut a) => {
            locate(&mut a.model, &a.revision)?;
            bench::run(&a, out)
        }
    };
    result.map_err(|e| name_refused_family(e, name))
}

impl Command {
    /// The subcommand as typed (`probe`, `inspect`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Command::Demo(_) => "demo",
            Command::Inspect(_) => "inspect",
            Command::Probe(_) => "probe",
            Command::Prompt(_) => "prompt",
            Command::Sweep(_) => "sweep",
            Command::Report(_) => "report",
            Command::Trace(_) => "trace",
            Command::Synth(_) => "synth",
            Command::Doctor(_) => "doctor",
            Command::Bench(_) => "bench",
        }
    }
}

/// A DeepSeek-V4.1 checkpoint given to a command that runs DeepSeek-V4 only: the error says
/// which command refused it (the config loader that refuses it does not know).
fn name_refused_family(err: anyhow::Error, command: &str) -> anyhow::Error {
    use crate::checkpoint::CheckpointError;
    use crate::config::{ConfigError, Family};
    let v41 = |c: &ConfigError| {
        matches!(
            c,
            ConfigError::Unsupported {
                family: Family::V41,
                ..
            }
        )
    };
    // A transparent `CheckpointError::Config` hides its config error from the chain.
    let refused = err.chain().any(|e| {
        e.downcast_ref::<ConfigError>().is_some_and(v41)
            || matches!(e.downcast_ref::<CheckpointError>(), Some(CheckpointError::Config(c)) if v41(c))
    });
    if refused {
        err.context(format!(
            "needlescope {command} does not run DeepSeek-V4.1 checkpoints yet"
        ))
    } else {
        err
    }
}

/// `--index` and `--kv` of probe and sweep as given, else the defaults of the model's family:
/// `fp8` / `fp8` on DeepSeek-V4 (what SGLang serves), `v41-fp4` / `release` on DeepSeek-V4.1
/// (the release's). A config that cannot be read takes V4's; the run's own loader reports it.
pub fn family_defaults(
    model: &std::path::Path,
    index: &[crate::numerics::profiles::IndexProfile],
    kv: Option<crate::numerics::profiles::KvMode>,
) -> (
    Vec<crate::numerics::profiles::IndexProfile>,
    crate::numerics::profiles::KvMode,
) {
    use crate::numerics::profiles::{IndexProfile, KvMode};
    let v41 = matches!(
        crate::config::load_any(model),
        Ok(crate::config::ModelDescription::V41(_))
    );
    let (i, k) = match v41 {
        true => (IndexProfile::V41Fp4, KvMode::Release),
        false => (IndexProfile::SglangFp8, KvMode::Fp8),
    };
    let index = match index.is_empty() {
        true => vec![i],
        false => index.to_vec(),
    };
    (index, kv.unwrap_or(k))
}

/// `--generate` of probe and sweep: as given, else 24 tokens, or none on a model `synth` wrote
/// (its LM path does not answer: generating would print noise and judge nothing, so the
/// indexer judges, as `demo` does).
pub fn generate_default(flag: Option<usize>, model: &std::path::Path) -> usize {
    flag.unwrap_or_else(|| {
        if crate::run::target::model_marks(model).synthetic {
            0
        } else {
            24
        }
    })
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

/// The error as the binary prints it: the chain of causes joined by ": ", leaving out a cause
/// whose text is already in what precedes it (most errors here name their cause in their own
/// message, so `{:#}` would repeat it).
pub fn error_text(err: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in err.chain() {
        let part = cause.to_string();
        if text.is_empty() {
            text = part;
        } else if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn synth_takes_a_negative_margin() {
        let cli = Cli::try_parse_from([
            "needlescope",
            "synth",
            "--preset",
            "planted",
            "--margin",
            "-3",
            "--out",
            "x",
        ])
        .unwrap();
        match cli.command {
            Command::Synth(args) => assert_eq!(args.margin, Some(-3.0)),
            _ => panic!("not synth"),
        }
    }

    #[test]
    fn error_text_names_each_cause_once() {
        let io = || std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        // A message that already names its source, as the config errors do.
        let named = crate::config::ConfigError::Io {
            path: "m/config.json".into(),
            source: io(),
        };
        let text = error_text(&anyhow::Error::new(named));
        assert_eq!(text.matches("no such file").count(), 1, "{text}");
        assert!(text.contains("m/config.json"), "{text}");
        // Context over a cause it does not name: both, in order.
        let err = anyhow::Error::new(io()).context("cannot open the report");
        assert_eq!(error_text(&err), "cannot open the report: no such file");
    }

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
