//! `needlescope bench`: its flags and its output. The model is loaded once on the backend
//! `--device` picks and the prefill timed at several prompt lengths ([`crate::run::bench`]);
//! this file turns the flags into a [`BenchPlan`] and prints each figure as it is measured:
//! the tokens/s table with the peak resident set size, per length the time and counted TFLOP/s
//! per layer type, the projected Flash prefill, the devices' memory against their plan and the
//! operation profile (`NEEDLESCOPE_PROFILE=1`) (`scripts/bench-cpu.sh` adds the transformers
//! comparison on the CPU).

use super::device::DeviceArgs;
use super::flags::parse_token_count;
use crate::backend::{DeviceMemoryUse, OpTime, WeightResidency};
use crate::config::ModelConfig;
use crate::devices::plan::{DevicePlan, FIXED_WORKSPACE};
use crate::model::bench::PrefillProfile;
use crate::numerics::profiles::{IndexProfile, KvMode};
use crate::run::bench::{BenchPlan, BenchProgress, BenchRow, BenchSetup, BenchStart, Projection};
use crate::units::three_significant;
use clap::Args;
use std::io::Write;
use std::path::PathBuf;

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Model directory: config.json, safetensors; or a Hugging Face repo id (ORG/NAME) in the local cache (HF_HUB_CACHE, HF_HOME/hub or ~/.cache/huggingface/hub; never downloaded)
    #[arg(long, value_name = "DIR|ORG/NAME")]
    pub model: PathBuf,

    /// With --model ORG/NAME or a models--ORG--NAME directory of the Hugging Face cache: the ref
    /// (branch, tag) or commit whose snapshot to use [default: main]
    #[arg(long, value_name = "REV")]
    pub revision: Option<String>,

    /// Prompt lengths in tokens, comma list (k = 1024, m = 1048576)
    #[arg(long, value_name = "TOKENS", value_delimiter = ',', value_parser = parse_token_count, default_value = "1k,4k,16k")]
    pub lengths: Vec<usize>,

    #[command(flatten)]
    pub device: DeviceArgs,

    /// Driving index profile
    #[arg(long, value_name = "PROFILE", default_value = "exact")]
    pub index: IndexProfile,

    /// Main KV rounding: exact or fp8
    #[arg(long, value_name = "MODE", default_value = "exact")]
    pub kv: KvMode,

    /// Prefill chunk in tokens, or auto: 2048 on the CPU, on GPUs the largest of 8192, 4096 and 2048 that fits (results equal up to f32 rounding: a chunk changes GEMM shapes and so summation order)
    #[arg(long, value_name = "TOKENS|auto", value_parser = super::flags::parse_chunk, default_value = "auto")]
    pub chunk: usize,

    /// Untimed prefill of this many tokens before the timed ones, so that one-off work (kernel
    /// compilation, the GPU's decoded weight copies) stays out of the figures [default: none]
    #[arg(long, value_name = "TOKENS", value_parser = parse_token_count)]
    pub warmup: Option<usize>,

    /// Weights on the CPU: decoded (f32 at load), streamed (stored format, decoded on use) or
    /// auto (decoded when the f32 model fits in a quarter of RAM); GPUs keep the stored format
    #[arg(long, value_name = "MODE", default_value = "auto")]
    pub weights: WeightResidency,
}

/// Prints the figures of [`crate::run::bench::run`] as they come.
struct Printer<'a> {
    args: &'a BenchArgs,
    out: &'a mut dyn Write,
    /// The CPU backend's worker threads, for the projection per core (`None` on GPUs).
    cpu_threads: Option<usize>,
}

impl BenchProgress for Printer<'_> {
    fn setup(&mut self, setup: &BenchSetup) -> anyhow::Result<()> {
        self.cpu_threads = (setup.backend.kind == "cpu").then_some(setup.threads);
        if setup.profile_on_cpu {
            writeln!(
                self.out,
                "note: NEEDLESCOPE_PROFILE times the operations of a GPU backend; this run is on the \
                 CPU, so no op profile follows"
            )?;
        }
        writeln!(
            self.out,
            "model {} ({}), index {}, kv {}, chunk {}, {} rayon threads, backend {}",
            self.args.model.display(),
            setup.cfg.schedule_summary(),
            self.args.index,
            self.args.kv,
            setup.chunk,
            setup.threads,
            setup.backend
        )?;
        Ok(())
    }

    fn warmed_up(&mut self, w: &PrefillProfile) -> anyhow::Result<()> {
        writeln!(
            self.out,
            "warm-up: {} tokens in {:.3} s (untimed below)",
            w.tokens, w.seconds
        )?;
        Ok(())
    }

    fn started(&mut self, start: &BenchStart) -> anyhow::Result<()> {
        if let Some((what, t)) = &start.reference {
            writeln!(
                self.out,
                "reference: {what}: {} TFLOP/s (measured in this run)",
                three_significant(*t)
            )?;
        }
        writeln!(
            self.out,
            "{:>8} {:>10} {:>12} {:>10} {:>14} {:>9}",
            "tokens", "prefill s", "tokens/s", "load s", "peak RSS MiB", "weights"
        )?;
        Ok(())
    }

    fn measured(&mut self, start: &BenchStart, row: &BenchRow) -> anyhow::Result<()> {
        let f = &row.prefill;
        writeln!(
            self.out,
            "{:>8} {:>10.3} {:>12.1} {:>10.3} {:>14} {:>9}",
            f.tokens,
            f.seconds,
            f.tokens as f64 / f.seconds.max(1e-12),
            start.load_seconds,
            row.peak_rss_mib.map_or("-".into(), |m| format!("{m:.0}")),
            start.weights
        )?;
        layer_breakdown(row, start.reference.as_ref(), self.cpu_threads, self.out)?;
        for line in memory_lines(&start.loaded, &f.device_memory, &start.plans) {
            writeln!(self.out, "{:>14} {line}", "device memory:")?;
        }
        if let Some(ops) = &row.ops {
            write_op_profile(ops, f.seconds, self.out)?;
        }
        self.out.flush()?;
        Ok(())
    }
}

/// One length's time and counted TFLOP/s per layer type (model::bench's FLOP model), against the
/// backend's reference GEMM, and the prefill speed projected to the 43-layer Flash schedule.
fn layer_breakdown(
    row: &BenchRow,
    reference: Option<&(String, f64)>,
    cpu_threads: Option<usize>,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let p = &row.prefill;
    for f in &row.types {
        let pct = reference.map_or(String::new(), |(_, r)| {
            format!(" ({:.1}% of the reference)", 100.0 * f.tflops() / r)
        });
        writeln!(
            out,
            "{:>14} x{}: {:>10.2} ms/layer {:>9} TFLOP/s{pct}",
            format!("{:?}", f.kind).to_uppercase(),
            f.layers,
            f.seconds_per_layer * 1e3,
            three_significant(f.tflops()),
        )?;
    }
    if let Some((up, down)) = p
        .transfer_per_token_layer()
        .filter(|_| p.transfer_bytes != (0, 0))
    {
        writeln!(
            out,
            "{:>14} {:.1} KiB up, {:.1} KiB down per token per layer ({:.1} / {:.1} MiB in all)",
            "host<->device:",
            up / 1024.0,
            down / 1024.0,
            p.transfer_bytes.0 as f64 / (1 << 20) as f64,
            p.transfer_bytes.1 as f64 / (1 << 20) as f64,
        )?;
    }
    for note in &p.resident_notes {
        writeln!(out, "{:>14} {note}", "kept decoded:")?;
    }
    match row.projection {
        Projection::TokensPerS {
            tokens_per_s: t,
            routed_experts,
        } => {
            let per_core = cpu_threads.map_or(String::new(), |n| {
                format!(
                    ", {} tok/s per core ({n} threads)",
                    three_significant(t / n.max(1) as f64)
                )
            });
            let experts = if routed_experts == ModelConfig::flash().n_routed_experts {
                String::new()
            } else {
                format!(
                    " (measured with {routed_experts} routed experts: the same arithmetic per \
                     token; a streamed prefill decodes more expert weight per chunk with all 256)"
                )
            };
            writeln!(
                out,
                "{:>14} {} tok/s for the 43-layer Flash prefill at {} tokens{per_core}{experts}",
                "projected:",
                three_significant(t),
                p.tokens
            )?
        }
        Projection::NotFlashSized {
            field,
            found,
            flash: want,
        } => writeln!(
            out,
            "{:>14} none: not Flash-sized ({field} {found}, Flash has {want})",
            "projected:"
        )?,
        Projection::NotEveryType => writeln!(
            out,
            "{:>14} none: not every layer type (SWA, CSA, HCA) was measured",
            "projected:"
        )?,
    }
    Ok(())
}

/// Turns the flags into a [`BenchPlan`], runs it ([`crate::run::bench::run`]), printing each
/// figure as it comes, then the notes on how to read them.
pub fn run(args: &BenchArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let plan = BenchPlan {
        model: &args.model,
        lengths: args.lengths.clone(),
        warmup: args.warmup,
        device: args.device.choice(),
        index: args.index,
        kv: args.kv,
        chunk: args.chunk,
        weights: args.weights,
    };
    crate::run::bench::run(
        &plan,
        &mut Printer {
            args,
            out: &mut *out,
            cpu_threads: None,
        },
    )?;
    writeln!(
        out,
        "per type: mean wall ms per layer and counted TFLOP/s (linear, attention and indexer arithmetic, model::bench); projected = tokens / (embed + head + the 43 Flash layers at the measured per-type times), for models with Flash's dimensions (any routed expert count) where every layer type was measured; per core = that / the CPU's worker threads"
    )?;
    writeln!(
        out,
        "the model is loaded once (load s), then each length is one prefill of a fresh sequence in ascending order; peak RSS is the process high-water mark (VmHWM) after each length (streamed weights: it counts the mapped checkpoint pages, which the OS may drop)"
    )?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The device-side figures of `needlescope bench` (GPU backends): the operation profile of one
// length (`NEEDLESCOPE_PROFILE=1`: calls and wall time per kernel, GEMM shape, allocation and
// copy) and each device's peak memory against its memory plan.

/// Kernel and GEMM rows shown of an operation profile; the rest are summed in one line.
const PROFILE_ROWS: usize = 24;

/// One length's operation profile (`NEEDLESCOPE_PROFILE=1`): the largest kernels and GEMMs by
/// wall time, every allocation and copy row, the rest summed, then what the timed operations
/// leave of the prefill (host work, frees, launch gaps).
fn write_op_profile(rows: &[OpTime], prefill_s: f64, out: &mut dyn Write) -> anyhow::Result<()> {
    let timed: f64 = rows.iter().map(|r| r.seconds).sum();
    writeln!(
        out,
        "  op profile (NEEDLESCOPE_PROFILE: every device op synchronised and timed, so the prefill above is slower than unprofiled):"
    )?;
    writeln!(
        out,
        "  {:<44} {:>9} {:>10} {:>7} {:>10}",
        "operation", "calls", "total ms", "share", "mean us"
    )?;
    let line = |out: &mut dyn Write, op: &str, calls: u64, s: f64| {
        writeln!(
            out,
            "  {:<44} {:>9} {:>10.1} {:>6.1}% {:>10}",
            op,
            calls,
            s * 1e3,
            100.0 * s / prefill_s.max(1e-12),
            if calls > 0 {
                format!("{:.1}", s * 1e6 / calls as f64)
            } else {
                "-".into()
            }
        )
    };
    // The largest kernels and GEMMs, then always the allocations and copies (what the buffer
    // pool, uninitialised allocations and stream-ordered uploads are judged by), then the rest.
    let is_memory = |r: &&OpTime| r.op.starts_with("alloc ") || r.op.starts_with("copy ");
    let (memory, compute): (Vec<&OpTime>, Vec<&OpTime>) = rows.iter().partition(is_memory);
    let shown = compute.len().min(PROFILE_ROWS);
    for r in compute[..shown].iter().chain(&memory) {
        line(out, &r.op, r.calls, r.seconds)?;
    }
    if compute.len() > shown {
        let rest = &compute[shown..];
        let calls = rest.iter().map(|r| r.calls).sum();
        let s = rest.iter().map(|r| r.seconds).sum();
        line(out, &format!("({} more operations)", rest.len()), calls, s)?;
    }
    line(
        out,
        "(not in a timed op: host work, frees)",
        0,
        (prefill_s - timed).max(0.0),
    )?;
    Ok(())
}

/// Per device, the peak bytes its buffers had in use during one prefill (`time_prefill`
/// restarts the peaks, so the reference GEMM, the warm-up and earlier lengths are not in it)
/// against the memory plan: the peak less what was in use right after loading (the weights)
/// and the decoded weight copies held now (charged at their allocations' size, as the
/// executors count them), against the plan's state + workspace less its fixed part (the CUDA
/// context and cuBLAS's own memory, which the executors do not count). The plan is the run's,
/// made for its longest length. Decoded copies made after the peak make the comparison
/// lenient; `NEEDLESCOPE_DECODE_CACHE_MIB=0` makes it exact.
fn memory_lines(
    loaded: &[DeviceMemoryUse],
    now: &[DeviceMemoryUse],
    plans: &[DevicePlan],
) -> Vec<String> {
    use crate::units::human_bytes;
    let b = |n: u64| human_bytes(n);
    now.iter()
        .enumerate()
        .map(|(i, d)| {
            let m = d.memory;
            let weights = loaded
                .iter()
                .find(|l| l.device == d.device)
                .map_or(0, |l| l.memory.in_use) as u64;
            let beyond = (m.peak_in_use as u64).saturating_sub(weights + d.decoded_copies as u64);
            let head = format!(
                "{}: peak {} in use ({} held with the pool), {} after loading, {} of decoded copies",
                d.device,
                b(m.peak_in_use as u64),
                b(m.peak_held as u64),
                b(weights),
                b(d.decoded_copies as u64)
            );
            match plans.get(i) {
                Some(p) => {
                    let allowed = (p.state + p.workspace).saturating_sub(FIXED_WORKSPACE);
                    let verdict = if beyond <= allowed {
                        "within the plan"
                    } else {
                        "OVER THE PLAN"
                    };
                    format!(
                        "{head}; plan: weights {}, state + workspace less its fixed {}: {}; \
                         the peak less weights and copies, {}, is {verdict}",
                        b(p.weights),
                        b(FIXED_WORKSPACE),
                        b(allowed),
                        b(beyond),
                    )
                }
                None => head,
            }
        })
        .collect()
}

#[cfg(test)]
mod bench_device_tests {
    use super::*;

    /// The peak less the weights loaded and the decoded copies is held to the plan's state and
    /// workspace less the fixed part; a device without a plan row gets the figures alone.
    #[test]
    fn memory_lines_compare_the_peak_beyond_weights_and_copies_with_the_plan() {
        let mib = 1usize << 20;
        let device = |in_use: usize, peak: usize, copies: usize| DeviceMemoryUse {
            device: "cuda:0".into(),
            memory: crate::backend::MemoryUse {
                held: in_use,
                in_use,
                peak_held: peak,
                peak_in_use: peak,
            },
            decoded_copies: copies,
        };
        let loaded = [device(100 * mib, 100 * mib, 0)];
        let mut plan = DevicePlan::idle(0, 1 << 40);
        plan.weights = 100 << 20;
        plan.state = 10 << 20;
        plan.workspace = FIXED_WORKSPACE + (20 << 20);
        // 100 MiB weights + 5 MiB copies + 30 MiB activations: exactly the allowance.
        let now = [device(105 * mib, 135 * mib, 5 * mib)];
        let lines = memory_lines(&loaded, &now, std::slice::from_ref(&plan));
        assert_eq!(lines.len(), 1);
        assert!(
            lines[0].contains("30.00 MiB, is within the plan"),
            "{}",
            lines[0]
        );
        let over = [device(105 * mib, 136 * mib, 5 * mib)];
        let lines = memory_lines(&loaded, &over, std::slice::from_ref(&plan));
        assert!(lines[0].ends_with("is OVER THE PLAN"), "{}", lines[0]);
        let bare = memory_lines(&loaded, &over, &[]);
        assert!(!bare[0].contains("plan"), "{}", bare[0]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(projection: Projection) -> BenchRow {
        BenchRow {
            prefill: PrefillProfile {
                tokens: 1000,
                seconds: 10.0,
                site_seconds: Vec::new(),
                transfer_bytes: (0, 0),
                resident_notes: Vec::new(),
                device_memory: Vec::new(),
            },
            peak_rss_mib: None,
            types: Vec::new(),
            projection,
            ops: None,
        }
    }

    fn printed(projection: Projection, cpu_threads: Option<usize>) -> String {
        let mut out = Vec::new();
        layer_breakdown(&row(projection), None, cpu_threads, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_projection_names_its_rate_per_core_and_a_smaller_expert_count() {
        let eight = Projection::TokensPerS {
            tokens_per_s: 12.5,
            routed_experts: 8,
        };
        let text = printed(eight.clone(), Some(2));
        assert!(
            text.contains("12.500 tok/s for the 43-layer Flash prefill at 1000 tokens, 6.250 tok/s per core (2 threads)"),
            "{text}"
        );
        assert!(text.contains("measured with 8 routed experts"), "{text}");
        // A GPU backend has no per-core rate; all 256 experts need no remark.
        let all = Projection::TokensPerS {
            tokens_per_s: 12.5,
            routed_experts: 256,
        };
        let text = printed(all, None);
        assert!(
            !text.contains("per core") && !text.contains("routed experts"),
            "{text}"
        );
    }
}
