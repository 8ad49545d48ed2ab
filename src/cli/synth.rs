//! `needlescope synth`: writes a deterministic synthetic checkpoint in the official tensor
//! names and formats (docs/architecture.md section 7) and prints what it wrote.

use clap::{Args, ValueEnum};
use std::io::Write;
use std::path::PathBuf;

use super::flags::parse_positive;
use crate::checkpoint::WeightFormat;
use crate::synth::{synth_with_progress, Preset, SynthOptions, SynthSummary};
use crate::units::{group_digits, human_bytes};

/// Which synthetic model (`--preset`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PresetArg {
    /// Every component of the architecture at toy size (a few MB)
    Tiny,
    /// The demo model: real vocabulary, the needle ranked high with a controlled margin
    Planted,
    /// Real DeepSeek-V4-Flash dimensions and formats (use --layers/--experts to shrink)
    Flash,
    /// DeepSeek-V4.1 at toy size with every layer role, Engram and a draft block; real
    /// vocabulary
    #[value(name = "v41-tiny")]
    V41Tiny,
}

#[derive(Args, Debug, Clone)]
pub struct SynthArgs {
    /// Which synthetic model (v41-tiny: DeepSeek-V4.1)
    #[arg(long, value_enum, default_value_t = PresetArg::Tiny)]
    pub preset: PresetArg,

    /// Weight format: bf16 (no scales), official (fp8 blocks + fp4 experts), nvfp4 (NVIDIA's
    /// re-quantisation: nvfp4 routed experts)
    #[arg(long, value_name = "bf16|official|nvfp4", default_value = "official")]
    pub format: WeightFormat,

    /// Output directory (created; a checkpoint synth wrote there before is replaced, one it did
    /// not write is refused)
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,

    /// Seed of the portable PRNG (same seed, same bytes on every platform)
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = super::flags::parse_seed)]
    pub seed: u64,

    /// Number of safetensors shards (more than 1 adds model.safetensors.index.json)
    #[arg(long, value_name = "N", value_parser = parse_positive, default_value = "1")]
    pub shards: usize,

    /// Keep only the first N main layers of the preset's schedule
    #[arg(long, value_name = "N", value_parser = parse_positive)]
    pub layers: Option<usize>,

    /// Routed experts per layer
    #[arg(long, value_name = "N", value_parser = parse_positive)]
    pub experts: Option<usize>,

    /// Store the compressor and indexer linears (wkv, wgate, weights_proj) as FP8 blocks with
    /// E8M0 scales instead of BF16, as a Flash-Base checkpoint is reported to (tiny, flash)
    #[arg(long)]
    pub fp8_compressors: bool,

    /// planted only: the needle rows' score margin over the haystack rows, in haystack
    /// standard deviations, -3 to 12 (needle about mean + margin x sd) [default: 2]
    #[arg(long, value_name = "SIGMAS", allow_negative_numbers = true, value_parser = super::flags::parse_margin)]
    pub margin: Option<f64>,
}

pub fn run(args: &SynthArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let preset = match args.preset {
        PresetArg::Tiny => Preset::Tiny,
        PresetArg::Flash => Preset::Flash,
        PresetArg::Planted => Preset::Planted,
        PresetArg::V41Tiny => Preset::V41Tiny,
    };
    if args.margin.is_some() && preset != Preset::Planted {
        anyhow::bail!("--margin applies to --preset planted only");
    }
    if args.fp8_compressors && preset == Preset::Planted {
        anyhow::bail!(
            "--fp8-compressors applies to --preset tiny and flash only (the planted model's \
             compressors hold exact BF16 values)"
        );
    }
    let opts = SynthOptions {
        preset,
        format: args.format,
        seed: args.seed,
        shards: args.shards,
        layers: args.layers,
        experts: args.experts,
        fp8_compressors: args.fp8_compressors,
        out: args.out.clone(),
    };
    if preset == Preset::V41Tiny {
        return run_v41(args, &opts, out);
    }
    {
        // A model without a CSA layer has no indexer: say so before writing gigabytes.
        let config = |layers| {
            let o = SynthOptions {
                layers,
                ..opts.clone()
            };
            crate::synth::synth_config(&o)
                .map_err(|e| anyhow::anyhow!("synth into {} failed: {e}", args.out.display()))
        };
        let cfg = config(opts.layers)?;
        let csa = |c: &crate::config::ModelConfig| c.layer_roles().indexed_layers();
        if csa(&cfg).is_empty() {
            let first_csa = csa(&config(None)?).first().copied().unwrap_or(0);
            let kinds: Vec<&str> = (0..cfg.num_hidden_layers)
                .map(|l| cfg.layer_kind(l).name())
                .collect();
            eprintln!(
                "note: --layers {} keeps [{}]: no CSA layer, so probe and sweep will refuse \
                 this model (trace, bench and inspect take it, with no indexer to record); \
                 --layers {} or more keeps one",
                cfg.num_hidden_layers,
                kinds.join(", "),
                first_csa + 1
            );
        }
    }
    let written = if preset == Preset::Planted {
        crate::synth::planted::synth_planted(&opts, args.margin)
    } else {
        // On stderr, hidden when it is not a terminal.
        let bar =
            indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
        bar.set_style(crate::run::progress::style(
            crate::run::progress::SYNTH_BYTES,
        ));
        let written = synth_with_progress(&opts, None, &mut |done, total| {
            bar.set_length(total);
            bar.set_position(done);
        });
        bar.finish_and_clear();
        written
    };
    let s = written
        .map_err(anyhow::Error::from)
        .map_err(|e| e.context(format!("synth into {} failed", args.out.display())))?;
    let schedule = s.config.schedule_summary();
    print_summary(args, &s, &schedule, out)
}

/// `--preset v41-tiny`: the flags it does not take are refused by name before anything is
/// written, then [`crate::synth::v41::synth_v41`].
fn run_v41(args: &SynthArgs, opts: &SynthOptions, out: &mut dyn Write) -> anyhow::Result<()> {
    for (flag, given) in [
        ("--layers", args.layers.is_some()),
        ("--experts", args.experts.is_some()),
        ("--fp8-compressors", args.fp8_compressors),
    ] {
        if given {
            anyhow::bail!(
                "{flag} applies to --preset tiny and flash only (v41-tiny keeps every \
                 DeepSeek-V4.1 layer role and the release's storage as they are)"
            );
        }
    }
    let bar =
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    bar.set_style(crate::run::progress::style(
        crate::run::progress::SYNTH_BYTES,
    ));
    let written = crate::synth::v41::synth_v41(opts, None, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    let s = written
        .map_err(anyhow::Error::from)
        .map_err(|e| e.context(format!("synth into {} failed", args.out.display())))?;
    let schedule = s.config.schedule_summary();
    print_summary(args, &s, &schedule, out)
}

/// What synth wrote, one line each.
fn print_summary<C>(
    args: &SynthArgs,
    s: &SynthSummary<C>,
    schedule: &str,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    writeln!(
        out,
        "wrote {}: {} preset, {} format{}, seed {}",
        s.dir.display(),
        preset_name(args.preset),
        s.format,
        if args.fp8_compressors {
            " with FP8 compressors"
        } else {
            ""
        },
        args.seed
    )?;
    writeln!(out, "  tensors   {}", group_digits(s.tensors as u64))?;
    writeln!(
        out,
        "  bytes     {} payload ({})",
        group_digits(s.payload_bytes),
        human_bytes(s.payload_bytes)
    )?;
    let names: Vec<String> = s
        .files
        .iter()
        .map(|f| {
            f.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| f.display().to_string())
        })
        .collect();
    let shown = if names.len() > 4 {
        format!("{}, ..., {}", names[..2].join(", "), names[names.len() - 1])
    } else {
        names.join(", ")
    };
    // The other files synth writes (stale ones were removed first, so present means new).
    let others: String = [
        "model.safetensors.index.json",
        "config.json",
        "tokenizer.json",
        "planted.json",
    ]
    .iter()
    .filter(|f| s.dir.join(f).is_file())
    .map(|f| format!(" + {f}"))
    .collect();
    writeln!(
        out,
        "  files     {} safetensors ({shown}){others}",
        names.len(),
    )?;
    writeln!(
        out,
        "  time      {:.2} s ({:.1} MB/s)",
        s.seconds,
        s.mb_per_s()
    )?;
    writeln!(out, "  schedule  {schedule}")?;
    writeln!(out, "next: needlescope inspect --model {}", s.dir.display())?;
    Ok(())
}

fn preset_name(p: PresetArg) -> &'static str {
    match p {
        PresetArg::Tiny => "tiny",
        PresetArg::Planted => "planted",
        PresetArg::Flash => "flash",
        PresetArg::V41Tiny => "v41-tiny",
    }
}
