//! `needlescope demo`: writes the `planted` synthetic model into a cache directory (reused on
//! the next run), runs a small recall sweep on it and renders the report: the whole product in
//! one command, with no downloads (docs/architecture.md sections 1 and 7).
//!
//! Default grid (about 20 s on 2 cores): contexts 1k, 2k, 4k, 8k, 16k x depths
//! 10, 30, 50, 70, 90 % x index profiles fp8 and bf16 x top-k 64 and 128 (the planted model's
//! `index_topk` and twice it: at 1k-16k tokens they play the role of 512 / 1,024 at 8k-128k on
//! the real model, the same rows per selected row), `--kv exact`. The planted model's LM path
//! does not copy the needle, so cells are judged by indexer recall (needle selected on every
//! non-trivial CSA layer at the answer position) and every title says "synthetic model". It
//! runs on the CPU reference backend, so its numbers are the same on every machine.
//!
//! The report directory is locked (`crate::report::DirLock`) from the start, before the
//! previous demo report is cleared, until the new one is rendered.

use clap::Args;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::flags::{parse_token_count, DepthList};
use crate::checkpoint::WeightFormat;
use crate::numerics::profiles::{IndexProfile, KvMode};
use crate::run::sweep::{run_sweep_locked, SweepPlan};
use crate::synth::planted::{
    planted_info, synth_planted, CONSTRUCTION_VERSION, DEFAULT_MARGIN, DEMO_TOPK,
};
use crate::synth::{Preset, SynthOptions};

#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// Report directory (a previous demo report in it is replaced)
    #[arg(long, value_name = "DIR", default_value = "reports/demo")]
    pub out: PathBuf,

    /// Where the planted model is cached [default: $XDG_CACHE_HOME/needlescope or ~/.cache/needlescope]
    #[arg(long, value_name = "DIR")]
    pub cache: Option<PathBuf>,

    /// Context lengths of the grid
    #[arg(long, value_name = "TOKENS", value_delimiter = ',', value_parser = parse_token_count, default_value = "1k,2k,4k,8k,16k")]
    pub lengths: Vec<usize>,

    /// Needle depths in percent
    #[arg(long, value_name = "PCTS", default_value = "10,30,50,70,90")]
    pub depths: DepthList,

    /// Index profiles
    #[arg(
        long,
        value_name = "PROFILES",
        value_delimiter = ',',
        default_value = "fp8,bf16"
    )]
    pub index: Vec<IndexProfile>,

    /// Needle margin of the planted model, in haystack standard deviations (-3 to 12)
    #[arg(long, value_name = "SIGMAS", default_value_t = DEFAULT_MARGIN, allow_negative_numbers = true, value_parser = super::flags::parse_margin)]
    pub margin: f64,
}

/// The cache directory of the planted model for `margin`.
fn model_dir(args: &DemoArgs) -> PathBuf {
    let root = args.cache.clone().unwrap_or_else(|| {
        std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .unwrap_or_else(std::env::temp_dir)
            .join("needlescope")
    });
    root.join(format!(
        "planted-v{}-m{}",
        env!("CARGO_PKG_VERSION"),
        args.margin
    ))
}

pub fn run(args: &DemoArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    // Locked before anything is written (the model cache included) and held until the report
    // is rendered: a second demo or a sweep into the same directory is refused.
    if args.out.exists() && !args.out.is_dir() {
        anyhow::bail!(
            "--out {}: is a file, expected a directory for the demo report",
            args.out.display()
        );
    }
    // Refused before the lock file is made, so a refusal leaves the directory as it was.
    refuse_foreign_report(&args.out)?;
    std::fs::create_dir_all(&args.out)
        .map_err(|e| anyhow::anyhow!("--out {}: {e}", args.out.display()))?;
    let lock = crate::report::DirLock::acquire(&args.out)?;
    let dir = model_dir(args);
    // Two demos starting together on an empty cache: the second waits for the first to write
    // the model, then finds it cached (it never reads a half-written one).
    let _cache_lock = lock_cache(&dir)?;
    let mut cached = planted_info(&dir).is_some_and(|info| {
        info.margin == args.margin
            && info.construction == CONSTRUCTION_VERSION
            && dir.join("config.json").exists()
    });
    // A cache cut short (an interrupted write, a full disk) is ours to rebuild.
    if cached {
        if let Err(e) = crate::checkpoint::Checkpoint::open(&dir) {
            writeln!(
                out,
                "the cached planted model is damaged ({e}); writing it again"
            )?;
            cached = false;
        }
    }
    if cached {
        writeln!(out, "planted model: {} (cached)", dir.display())?;
    } else {
        writeln!(out, "writing the planted model to {} ...", dir.display())?;
        // The cache's directory name is needlescope's own: whatever an earlier (or older)
        // demo left there, cut short, is ours to replace.
        if dir.is_dir() {
            crate::synth::write_synth_mark(&dir, "planted")?;
        }
        let opts = SynthOptions::new(Preset::Planted, WeightFormat::Bf16, &dir);
        let summary = synth_planted(&opts, Some(args.margin))?;
        writeln!(
            out,
            "planted model: {} tensors, {:.1} MB in {:.1} s",
            summary.tensors,
            summary.payload_bytes as f64 / 1e6,
            summary.seconds
        )?;
    }
    let plan = SweepPlan {
        scenario: "passkey".into(),
        lengths: args.lengths.clone(),
        depths: args.depths.0.clone(),
        indexes: args.index.clone(),
        compare: vec![IndexProfile::Exact],
        topks: DEMO_TOPK.to_vec(),
        kv: KvMode::Exact,
        samples: 1,
        seed: 0,
        generate: 0,
        chunk: 4096,
        haystack_file: None,
        engine: None,
        candidate_blocks: None,
    };
    clear_previous_report(&args.out)?;
    let started = std::time::Instant::now();
    // Rerun, the demo clears its report and starts afresh: an interrupted one says so.
    crate::run::interrupt::restart_hint(Some("rerunning the demo starts it afresh".into()));
    let outcome = run_sweep_locked(
        &dir,
        &plan,
        &lock,
        &crate::run::device::DeviceChoice::cpu(),
        out,
    );
    crate::run::interrupt::restart_hint(None);
    let outcome = outcome?;
    let done = crate::report::rerender_locked(&lock, crate::report::stdout_wants_colour())?;
    drop(lock);
    writeln!(out)?;
    write!(out, "{}", done.table)?;
    writeln!(
        out,
        "\n{} cells in {:.0} s.",
        outcome.cells_run,
        started.elapsed().as_secs_f64(),
    )?;
    writeln!(out, "{}", done.files_line(&args.out))?;
    writeln!(
        out,
        "re-render any time with: needlescope report {}",
        args.out.display()
    )?;
    Ok(())
}

/// Refuses `out` when it holds a report of another command (the demo replaces only its own).
fn refuse_foreign_report(out: &std::path::Path) -> anyhow::Result<()> {
    let run_json = out.join("run.json");
    if !run_json.exists() {
        // Records without their run.json (a report that lost it, a user's own files): not
        // the demo's to replace, as sweep and probe refuse to append to them.
        let stray: Vec<&str> = RECORD_FILES
            .into_iter()
            .filter(|name| std::fs::metadata(out.join(name)).is_ok_and(|m| m.len() > 0))
            .collect();
        if !stray.is_empty() {
            anyhow::bail!(
                "--out {}: holds {} without run.json, so not a demo report (the demo replaces \
                 only its own); pass another --out",
                out.display(),
                stray.join(", ")
            );
        }
        return Ok(());
    }
    let command = std::fs::read(&run_json)
        .ok()
        .and_then(|b| serde_json::from_slice::<crate::record::RunInfo>(&b).ok())
        .map(|info| info.command_line);
    let subcommand = command
        .as_ref()
        .and_then(|argv| argv.iter().skip(1).find(|a| !a.starts_with('-')).cloned());
    if subcommand.as_deref() != Some("demo") {
        let found = command.map_or("an unreadable run.json".to_string(), |argv| {
            format!("a report of `{}`", argv.join(" "))
        });
        anyhow::bail!(
            "--out {}: expected no report or a previous demo report (the demo replaces only its \
             own), found {found}; pass another --out",
            out.display()
        );
    }
    Ok(())
}

/// The demo always runs its sweep afresh (only the model is cached): a previous demo report in
/// `out` — recognised by its run.json, whose command must be `demo` (checked again here, under
/// the lock), so no other directory and no other command's report is ever touched — is
/// removed file by file (records, summary and PNGs).
fn clear_previous_report(out: &std::path::Path) -> anyhow::Result<()> {
    refuse_foreign_report(out)?;
    for entry in std::fs::read_dir(out)? {
        let path = entry?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let ours = RECORD_FILES.contains(&name.as_str())
            || (name.ends_with(".png")
                && (name.starts_with("heatmap_")
                    || name.starts_with("layers_")
                    || name == "rank_vs_length.png"));
        if ours && path.is_file() {
            remove(&path)?;
        }
    }
    // Last, so that a removal cut short leaves a report the next demo still recognises.
    let run_json = out.join("run.json");
    if run_json.is_file() {
        remove(&run_json)?;
    }
    Ok(())
}

/// A report's record files besides run.json (which marks whose report it is).
const RECORD_FILES: [&str; 4] = ["cells.csv", "layers.csv", "attention.csv", "summary.json"];

fn remove(path: &std::path::Path) -> anyhow::Result<()> {
    std::fs::remove_file(path).map_err(|e| anyhow::anyhow!("cannot remove {}: {e}", path.display()))
}

/// Waits for, then holds, the lock of the planted model's cache directory `dir` (a file
/// beside it, `<dir>.lock`), until dropped.
fn lock_cache(dir: &Path) -> anyhow::Result<std::fs::File> {
    let mut name = dir.as_os_str().to_owned();
    name.push(".lock");
    let path = std::path::PathBuf::from(name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| anyhow::anyhow!("{}: {e}", parent.display()))?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    file.lock()
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(file)
}
