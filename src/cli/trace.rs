//! `needlescope trace`: runs a token file through the model and writes indexer scores, top-k
//! selections and logits of the chosen positions to one safetensors file (docs/outputs.md), for
//! comparison with other engines. `--logits` picks which logits (whole rows, the top N with
//! their token ids, or none; `run::trace_logits`); before the model runs, one line on stderr
//! gives the file's size and what it holds. `--device` picks the backend (the header metadata
//! records it as `backend`).

use clap::Args;
use std::io::Write;
use std::path::PathBuf;

use super::device::DeviceArgs;
use super::flags::{parse_positive, Positions};
use crate::backend::Backend;
use crate::devices::placement::Workload;
use crate::model::forward::{Model, ModelOptions};
use crate::numerics::profiles::{IndexProfile, KvMode};
use crate::run::target::{ModelTask, Target};
use crate::run::trace::{self, LogitsMode, TraceLayout};
use std::collections::BTreeMap;

#[derive(Args, Debug, Clone)]
pub struct TraceArgs {
    /// Model directory: config.json, safetensors; or a Hugging Face repo id (ORG/NAME) in the local cache (HF_HUB_CACHE, HF_HOME/hub or ~/.cache/huggingface/hub; never downloaded)
    #[arg(long, value_name = "DIR|ORG/NAME")]
    pub model: PathBuf,

    /// With --model ORG/NAME or a models--ORG--NAME directory of the Hugging Face cache: the ref
    /// (branch, tag) or commit whose snapshot to use [default: main]
    #[arg(long, value_name = "REV")]
    pub revision: Option<String>,

    /// Token ids, whitespace- or comma-separated integers (what `needlescope prompt --ids-out` writes)
    #[arg(
        long,
        value_name = "FILE",
        required_unless_present = "prompt",
        conflicts_with = "prompt"
    )]
    pub tokens: Option<PathBuf>,

    /// A conversation instead of --tokens: an OpenAI-style chat request (*.json) or a messages array, or a UTF-8 text file (one user message), rendered as DeepSeek-V4's encoder renders it
    #[arg(long, value_name = "FILE")]
    pub prompt: Option<PathBuf>,

    /// Positions to record: all, last, or a comma list of 0-based positions
    #[arg(long, value_name = "all|last|LIST", default_value = "last")]
    pub positions: Positions,

    /// Driving index profile (decides the real selection)
    #[arg(long, value_name = "PROFILE", default_value = "exact")]
    pub index: IndexProfile,

    /// Main KV rounding: exact or fp8
    #[arg(long, value_name = "MODE", default_value = "exact")]
    pub kv: KvMode,

    /// Top-k of the indexer [default: the config's index_topk]
    #[arg(long, allow_negative_numbers = true, value_name = "K", value_parser = parse_positive)]
    pub topk: Option<usize>,

    /// Prefill chunk in tokens, or auto: 2048 on the CPU, on GPUs the largest of 8192, 4096 and 2048 that fits (results equal up to f32 rounding: a chunk changes GEMM shapes and so summation order)
    #[arg(long, value_name = "TOKENS|auto", value_parser = super::flags::parse_chunk, default_value = "auto")]
    pub chunk: usize,

    /// Output safetensors file
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,

    /// Also dump the raw indexer inputs per CSA layer (q, keys, head weights)
    #[arg(long)]
    pub dump_indexer_inputs: bool,

    /// Logits kept per recorded position: none; top:N, the N largest (descending, ties to the lower token id) with their token ids; all, the whole row [default: all for at most 16 positions, else top:20]
    #[arg(long, value_name = "none|top:N|all")]
    pub logits: Option<LogitsMode>,

    #[command(flatten)]
    pub device: DeviceArgs,
}

/// The trace on a loaded model of any backend.
struct TraceTask<'a> {
    tokens: &'a [u32],
    positions: &'a [usize],
    dump: bool,
    logits: LogitsMode,
}

impl ModelTask for TraceTask<'_> {
    type Output = trace::TraceResult;
    fn run<B: Backend>(self, model: &mut Model<B>) -> anyhow::Result<trace::TraceResult> {
        // On stderr, hidden when it is not a terminal (as probe's and sweep's bars).
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(self.tokens.len() as u64),
            indicatif::ProgressDrawTarget::stderr(),
        );
        bar.set_style(crate::run::progress::style(
            crate::run::progress::PROBE_PREFILL,
        ));
        bar.set_message("trace prefill");
        let result = trace::run_trace(
            model,
            self.tokens,
            self.positions,
            self.dump,
            self.logits,
            &mut |done, _| bar.set_position(done as u64),
        );
        bar.finish_and_clear();
        result
    }
}

/// Refuses an `--out` that would overwrite or shadow an input, before anything runs: an
/// existing directory, the token file itself, or a path inside the model directory (a
/// safetensors file there would be read as model weights, or replace them), also through
/// folders that do not exist yet (which `run` makes just before the forward, once every check
/// has passed, so a forward never ends on a missing folder).
fn check_out_path(args: &TraceArgs) -> anyhow::Result<()> {
    let out = &args.out;
    if out.is_dir() {
        anyhow::bail!(
            "--out {}: is a directory, expected the path of the safetensors file to write",
            out.display()
        );
    }
    // The folders still to be made must lie below the existing ones: a `..` among them would
    // step out of what the checks below looked at (`new/../../model/model.safetensors`).
    let existing = existing_ancestor(out);
    if !existing.is_dir() {
        anyhow::bail!(
            "--out {}: {} is a file, expected a folder to write the trace in",
            out.display(),
            existing.display()
        );
    }
    let to_make = out.strip_prefix(&existing).unwrap_or(out);
    if to_make
        .components()
        .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        anyhow::bail!(
            "--out {}: `..` or `.` among the folders still to be made ({}); expected a path \
             without them past the existing folder {}",
            out.display(),
            to_make.display(),
            existing.display()
        );
    }
    // The path with its longest existing ancestor made canonical (folders still to be made
    // kept as given), so the checks below hold for an --out whose folders do not exist yet.
    let canonical_parent = |p: &std::path::Path| {
        let a = existing_ancestor(p);
        let real = std::fs::canonicalize(&a).ok()?;
        Some(real.join(p.strip_prefix(&a).unwrap_or(p)))
    };
    let out_full = canonical_parent(out);
    let input = args.tokens.as_ref().or(args.prompt.as_ref());
    if out_full.is_some() && input.is_some_and(|i| out_full == canonical_parent(i)) {
        anyhow::bail!(
            "--out {}: is the {} given to {}; expected another path",
            out.display(),
            if args.tokens.is_some() {
                "token file"
            } else {
                "conversation"
            },
            if args.tokens.is_some() {
                "--tokens"
            } else {
                "--prompt"
            }
        );
    }
    if let (Some(full), Ok(model)) = (&out_full, std::fs::canonicalize(&args.model)) {
        if full.starts_with(&model) {
            anyhow::bail!(
                "--out {}: is inside the model directory {}, where a safetensors file would be read as (or replace) model weights; expected a path outside it",
                out.display(),
                args.model.display()
            );
        }
    }
    // Last (after the checks that refuse a path inside the model directory, so no probe file
    // is made there): a folder nothing can be written in (read-only, `/proc`) would otherwise
    // show up as a disk with no room, or fail after the whole model run.
    if let Err(e) = check_writable(&existing) {
        anyhow::bail!(
            "--out {}: cannot write in the folder {}: {e}",
            out.display(),
            existing.display()
        );
    }
    // Only into an existing folder: a typo in a path must not leave a tree of new folders.
    if let Some(parent) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !parent.exists() {
            anyhow::bail!(
                "--out {}: the folder {} does not exist; expected an existing folder (trace \
                 makes none: create it first)",
                out.display(),
                parent.display()
            );
        }
    }
    Ok(())
}

/// Whether a file can be created in the folder `dir`: creates a probe file of a fresh name and
/// removes it. A name already there (a probe a killed run left, its process id since reused) is
/// skipped, not taken for a folder that refuses writes.
fn check_writable(dir: &std::path::Path) -> std::io::Result<()> {
    let pid = std::process::id();
    let mut last = None;
    for n in 0..16 {
        let probe = dir.join(format!(".needlescope-write-check-{pid}-{n}"));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&probe)
        {
            Ok(_) => {
                let _ = std::fs::remove_file(&probe);
                return Ok(());
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free probe file name")))
}

/// The longest ancestor of `path` (strictly above it) that exists, `.` for a relative path
/// none of whose folders exists.
fn existing_ancestor(path: &std::path::Path) -> PathBuf {
    path.ancestors()
        .skip(1)
        .find(|a| !a.as_os_str().is_empty() && a.exists())
        .map_or_else(|| PathBuf::from("."), std::path::Path::to_path_buf)
}

/// Says on stderr what the trace will write, before the model runs: the file's size and what
/// it holds (logits, indexer, the rest), so a `--positions all` of gigabytes is no surprise.
/// The header is estimated from the metadata known now (the backend's name, added later, is a
/// few dozen bytes).
fn announce_size(args: &TraceArgs, layout: &TraceLayout, metadata: &BTreeMap<String, String>) {
    let sizes = layout.sizes();
    let header =
        8 + crate::checkpoint::writer::header_bytes(&layout.tensors(), metadata).len() as u64;
    let total = layout.file_bytes() + header;
    let human = crate::units::human_bytes;
    let logits = match layout.logits {
        LogitsMode::None => "none".to_string(),
        LogitsMode::Top(n) => format!(
            "{} (top:{n}: {} x {n} values and token ids)",
            human(sizes.logits),
            crate::units::group_digits(layout.positions as u64),
        ),
        LogitsMode::All => format!(
            "{} (all: {} x {})",
            human(sizes.logits),
            crate::units::group_digits(layout.positions as u64),
            crate::units::group_digits(layout.vocab as u64)
        ),
    };
    let inputs = if layout.dump.is_some() {
        format!(" (raw inputs {})", human(sizes.indexer_inputs))
    } else {
        String::new()
    };
    eprintln!(
        "trace: {} to write to {}: logits {logits}, indexer {}{inputs}, other {} (tokens, \
         positions, header)",
        human(total),
        args.out.display(),
        human(sizes.indexer + sizes.indexer_inputs),
        human(sizes.other + header),
    );
}

/// Refuses a trace whose file would not fit on the filesystem of `--out`, or whose records
/// would not fit in the memory available, before the model runs (`--positions all` over a long
/// input on a full-size model is tens of GiB: the logits alone are 0.5 MiB per position with
/// `--logits all`).
fn check_room(args: &TraceArgs, layout: &TraceLayout, positions: &[usize]) -> anyhow::Result<()> {
    // The filesystem the file will be on: its nearest folder that exists now.
    let dir = existing_ancestor(&args.out);
    let room = crate::devices::host::Room {
        memory_needed: layout.memory_bytes(positions),
        memory_available: crate::devices::host::meminfo_bytes("MemAvailable"),
        // The header is a few KiB per tensor name at most.
        disk_needed: layout.file_bytes() + 64 * 1024,
        disk_free: crate::devices::host::free_disk_bytes(&dir),
    };
    room.check().map_err(|short| {
        anyhow::anyhow!(
            "--out {}: a trace of {} positions over {} tokens does not fit: {short}; record fewer positions (--positions last, or a list){}{}",
            args.out.display(),
            crate::units::group_digits(positions.len() as u64),
            crate::units::group_digits(layout.tokens as u64),
            match layout.logits {
                LogitsMode::None => String::new(),
                mode => format!(", or fewer logits (--logits {mode} now: top:N with a smaller N, or none)"),
            },
            if args.dump_indexer_inputs {
                ", or leave out --dump-indexer-inputs"
            } else {
                ""
            }
        )
    })
}

pub fn run(args: &TraceArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    check_out_path(args)?;
    let ckpt = crate::run::target::open_model(&args.model)?;
    let cfg = ckpt.config().clone();
    let tokens = match (&args.tokens, &args.prompt) {
        (Some(file), _) => trace::parse_token_file(file, cfg.vocab_size)?,
        (None, Some(path)) => {
            let request = crate::probe::chat::ChatRequest::from_file(path)?;
            for note in &request.notes {
                eprintln!("note: --prompt {}: {note}", path.display());
            }
            let tok = crate::run::target::load_tokenizer(&args.model, &cfg)?;
            let ids = tok.encode(&request.render().text)?;
            if ids.len() > cfg.max_position_embeddings {
                return Err(crate::probe::PromptError::PromptTooLong {
                    source_name: path.display().to_string(),
                    tokens: ids.len(),
                    plus: String::new(),
                    max_positions: cfg.max_position_embeddings,
                }
                .into());
            }
            ids
        }
        (None, None) => anyhow::bail!("expected --tokens FILE or --prompt FILE"),
    };
    let positions: Vec<usize> = match &args.positions {
        Positions::All => (0..tokens.len()).collect(),
        Positions::Last => vec![tokens.len() - 1],
        Positions::List(v) => v.clone(),
    };
    trace::check_inputs(&tokens, &positions)?;
    if let Some(k) = args.topk {
        crate::run::checks::refuse_topk_past_rows("--topk", &[k], &cfg)?;
    }
    let topk = args.topk.unwrap_or(cfg.index_topk);
    let logits = args
        .logits
        .unwrap_or_else(|| LogitsMode::default_for(positions.len(), cfg.vocab_size))
        .check_vocab(cfg.vocab_size)?;
    let layout = TraceLayout::for_config(
        &cfg,
        tokens.len(),
        positions.len(),
        topk,
        args.dump_indexer_inputs,
        logits,
    );
    let mut metadata = BTreeMap::new();
    metadata.insert("profile".to_string(), args.index.name().to_string());
    metadata.insert("kv".to_string(), args.kv.name().to_string());
    metadata.insert("topk".to_string(), topk.to_string());
    metadata.insert("logits".to_string(), logits.name());
    metadata.insert("model".to_string(), args.model.display().to_string());
    metadata.insert("model_config_sha256".to_string(), cfg.hash_hex());
    // What the dumped head weights are multiplied by in every score: dim^-0.5 · heads^-0.5.
    metadata.insert(
        "index_weight_scale".to_string(),
        crate::numerics::profiles::weight_scale(cfg.index_n_heads, cfg.index_head_dim).to_string(),
    );
    metadata.insert(
        "needlescope_version".to_string(),
        env!("CARGO_PKG_VERSION").to_string(),
    );
    announce_size(args, &layout, &metadata);
    check_room(args, &layout, &positions)?;
    let work = Workload {
        context: tokens.len(),
        chunk: args.chunk,
        topk,
    };
    let target = Target::prepare(&args.device.choice(), &ckpt, &work)?;
    let backend = target.record();
    let opts = ModelOptions {
        index: args.index,
        kv: args.kv,
        topk: args.topk,
        chunk: target.chunk(),
    };
    let started = std::time::Instant::now();
    let task = TraceTask {
        tokens: &tokens,
        positions: &positions,
        dump: args.dump_indexer_inputs,
        logits,
    };
    let result = target.run(&ckpt, opts, task)?;
    metadata.insert("topk".to_string(), result.topk.to_string());
    metadata.insert("backend".to_string(), backend.to_string());
    trace::write_trace(&args.out, &result, metadata)?;
    writeln!(
        out,
        "traced {}, {}, {} (index {}, kv {}, top-k {}, logits {}) on {} in {:.2} s -> {} ({})",
        crate::units::count_of(tokens.len(), "token"),
        crate::units::count_of(positions.len(), "position"),
        crate::units::count_of(result.indexer.len(), "CSA layer"),
        args.index,
        args.kv,
        result.topk,
        logits,
        backend,
        started.elapsed().as_secs_f64(),
        args.out.display(),
        std::fs::metadata(&args.out).map_or_else(
            |_| "size unknown".to_string(),
            |m| crate::units::human_bytes(m.len())
        )
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_writable;

    /// A probe file left by a killed run (whose process id this one now has) does not make a
    /// writable folder look unwritable, and the check leaves no file of its own behind.
    #[test]
    fn a_leftover_probe_file_is_not_an_unwritable_folder() {
        let dir = tempfile::tempdir().unwrap();
        let pid = std::process::id();
        for stale in [
            format!(".needlescope-write-check-{pid}"),
            format!(".needlescope-write-check-{pid}-0"),
        ] {
            std::fs::write(dir.path().join(stale), b"").unwrap();
        }
        check_writable(dir.path()).unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
        assert!(check_writable(&dir.path().join("missing")).is_err());
    }
}
