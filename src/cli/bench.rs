//! `needlescope bench`: times the prefill of a model at several prompt lengths on one backend
//! and prints tokens/s and the peak resident set size (the speed and memory figures of the
//! CPU engine issue; `scripts/bench-cpu.sh` adds the transformers comparison).

use clap::Args;
use std::io::Write;
use std::path::PathBuf;

use super::values::parse_token_count;
use super::{DeviceChoice, NotImplemented};
use crate::backend::WeightResidency;
use crate::checkpoint::Checkpoint;
use crate::model::{bench_prefill, EngineOptions};
use crate::numerics::profiles::{IndexProfile, KvMode};

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Model directory: config.json, safetensors
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,

    /// Prompt lengths in tokens, comma list (k = 1024, m = 1048576)
    #[arg(long, value_name = "TOKENS", value_delimiter = ',', value_parser = parse_token_count, default_value = "1k,4k,16k")]
    pub lengths: Vec<usize>,

    /// Backend
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto)]
    pub device: DeviceChoice,

    /// Driving index profile
    #[arg(long, value_name = "PROFILE", default_value = "exact")]
    pub index: IndexProfile,

    /// Main KV rounding: exact or fp8
    #[arg(long, value_name = "MODE", default_value = "exact")]
    pub kv: KvMode,

    /// Prefill chunk in tokens
    #[arg(long, value_name = "TOKENS", value_parser = parse_token_count, default_value = "2048")]
    pub chunk: usize,

    /// Weights: decoded (f32 at load), streamed (stored format, decoded on use) or auto
    /// (decoded when the f32 model fits in a quarter of RAM)
    #[arg(long, value_name = "MODE", default_value = "auto")]
    pub weights: WeightResidency,
}

pub fn run(args: &BenchArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    if args.device == DeviceChoice::Cuda {
        return Err(NotImplemented {
            command: "bench --device cuda",
            why: "the CUDA backend has not landed; use --device cpu",
        }
        .into());
    }
    let ckpt = Checkpoint::open(&args.model)?;
    let cfg = ckpt.config().clone();
    writeln!(
        out,
        "model {} ({}), index {}, kv {}, chunk {}, {} rayon threads",
        args.model.display(),
        cfg.schedule_summary(),
        args.index,
        args.kv,
        args.chunk,
        rayon::current_num_threads()
    )?;
    writeln!(
        out,
        "{:>8} {:>10} {:>12} {:>10} {:>14} {:>9}",
        "tokens", "prefill s", "tokens/s", "load s", "peak RSS MiB", "weights"
    )?;
    let mut lengths = args.lengths.clone();
    lengths.sort_unstable();
    for &n in &lengths {
        // Deterministic ids in [3, vocab): the same prompt on every run.
        let mut s: u64 = 0x9e37_79b9_7f4a_7c15;
        let tokens: Vec<u32> = (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                3 + ((s >> 33) % (cfg.vocab_size as u64 - 3)) as u32
            })
            .collect();
        let opts = EngineOptions {
            index: args.index,
            kv: args.kv,
            topk: None,
            chunk: args.chunk,
        };
        let f = bench_prefill(&ckpt, opts, args.weights, &tokens)?;
        writeln!(
            out,
            "{:>8} {:>10.3} {:>12.1} {:>10.3} {:>14} {:>9}",
            f.tokens,
            f.seconds,
            f.tokens_per_s,
            f.load_seconds,
            peak_rss_mib().map_or("-".into(), |m| format!("{m:.0}")),
            f.weights
        )?;
        out.flush()?;
    }
    writeln!(
        out,
        "peak RSS is the process high-water mark (VmHWM) after each length (streamed weights: it counts the mapped checkpoint pages, which the OS may drop); lengths run in ascending order"
    )?;
    Ok(())
}

/// The process's peak resident set size in MiB (Linux `VmHWM`), if readable.
pub fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}
