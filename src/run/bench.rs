//! `bench`'s plan and task: the model loaded once on the chosen backend, an untimed warm-up
//! prefill if asked, then one timed prefill of a fresh sequence per prompt length, ascending,
//! each measured into a [`BenchRow`]: wall time, the process's peak resident set size, time and
//! counted FLOPs per layer type ([`crate::model::bench`]), the prefill speed projected to the
//! 43-layer Flash schedule, the devices' memory and, with `NEEDLESCOPE_PROFILE=1` on a GPU
//! backend, the operation profile of that length.
//!
//! The CLI fills a [`BenchPlan`] from its flags and calls [`run`], which hands each figure to a
//! [`BenchProgress`] as soon as it is measured (a length can take minutes: its row shows while
//! the next one runs) and returns the [`BenchOutcome`]; the CLI prints them all.

use super::device::DeviceChoice;
use super::target::{ModelTask, Target};
use crate::backend::{Backend, DeviceMemoryUse, OpTime, WeightResidency};
use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::devices::placement::Workload;
use crate::devices::plan::DevicePlan;
use crate::model::bench::{
    by_layer_type, projected_tokens_per_s, time_prefill, LayerTypeFigures, PrefillProfile,
};
use crate::model::forward::Model;
use crate::model::ModelOptions;
use crate::numerics::profiles::{IndexProfile, KvMode};
use crate::record::BackendRecord;
use std::path::Path;
use std::time::Instant;

/// Everything a bench needs, as the flags gave it: what [`run`] executes.
pub struct BenchPlan<'a> {
    /// The model directory (`--model`, resolved).
    pub model: &'a Path,
    /// Prompt lengths in tokens, as given (checked and sorted by [`run`]).
    pub lengths: Vec<usize>,
    /// Untimed prefill of this many tokens first.
    pub warmup: Option<usize>,
    pub device: DeviceChoice,
    pub index: IndexProfile,
    pub kv: KvMode,
    /// Prefill chunk (0: auto).
    pub chunk: usize,
    /// The CPU's weight residency (`Auto` resolved against the host's memory).
    pub weights: WeightResidency,
}

/// What the bench runs on, known before the model loads.
#[derive(Clone, Debug)]
pub struct BenchSetup {
    pub cfg: ModelConfig,
    /// `NEEDLESCOPE_PROFILE` is set but the backend is the CPU, which has no op profile.
    pub profile_on_cpu: bool,
    /// The prefill chunk (`auto` resolved).
    pub chunk: usize,
    pub threads: usize,
    pub backend: BackendRecord,
}

/// The model as loaded (and warmed up), before the timed prefills.
#[derive(Clone, Debug)]
pub struct BenchStart {
    /// Seconds from the start of loading to the end of it.
    pub load_seconds: f64,
    /// Each device's memory right after loading (the weights; empty on the CPU).
    pub loaded: Vec<DeviceMemoryUse>,
    /// The backend's reference GEMM: what it is and its measured TFLOP/s.
    pub reference: Option<(String, f64)>,
    /// How the weights are held (`decoded`, `streamed`, or the GPU's stored format).
    pub weights: &'static str,
    /// The memory plan of each used device, in the backend's device order (empty on the CPU).
    pub plans: Vec<DevicePlan>,
}

/// One timed length.
#[derive(Clone, Debug)]
pub struct BenchRow {
    pub prefill: PrefillProfile,
    /// The process's peak resident set size after it, in MiB ([`crate::devices::host::peak_rss_mib`]).
    pub peak_rss_mib: Option<f64>,
    /// Time and counted FLOPs per layer type.
    pub types: Vec<LayerTypeFigures>,
    pub projection: Projection,
    /// The operations' calls and seconds in this length, largest first; `None` when the backend
    /// keeps no op profile (the CPU, or `NEEDLESCOPE_PROFILE` unset).
    pub ops: Option<Vec<OpTime>>,
}

/// The prefill speed of the 43-layer Flash model projected from one length's per-type times.
#[derive(Clone, Debug, PartialEq)]
pub enum Projection {
    /// Tokens/s of the 43 layers. `routed_experts` is the measured model's count: a Flash-sized
    /// model with fewer routed experts (`synth --preset flash --experts 8`) does the same
    /// arithmetic per token (each token runs its top-k and the shared expert), so it projects
    /// too; only a streamed prefill's expert decoding per chunk grows with the count.
    TokensPerS {
        tokens_per_s: f64,
        routed_experts: usize,
    },
    /// The model's layers are not Flash-sized: the first dimension that differs.
    NotFlashSized {
        field: &'static str,
        found: usize,
        flash: usize,
    },
    /// Not every layer type (SWA, CSA, HCA) was measured.
    NotEveryType,
}

/// What a bench measured.
#[derive(Clone, Debug)]
pub struct BenchOutcome {
    pub start: BenchStart,
    /// One per length, ascending.
    pub rows: Vec<BenchRow>,
}

/// Where the figures go as they are measured (the CLI prints them).
pub trait BenchProgress {
    /// The backend is chosen and the model loads next.
    fn setup(&mut self, setup: &BenchSetup) -> anyhow::Result<()>;
    /// The untimed warm-up prefill ran.
    fn warmed_up(&mut self, warmup: &PrefillProfile) -> anyhow::Result<()>;
    /// The model is loaded and warmed up; the timed prefills follow.
    fn started(&mut self, start: &BenchStart) -> anyhow::Result<()>;
    /// One length was timed.
    fn measured(&mut self, start: &BenchStart, row: &BenchRow) -> anyhow::Result<()>;
}

/// Checks the lengths against the model, decides the backend, loads the model once and times
/// each length, handing the figures to `progress` as they come.
pub fn run(plan: &BenchPlan, progress: &mut dyn BenchProgress) -> anyhow::Result<BenchOutcome> {
    let ckpt = super::target::open_model(plan.model)?;
    let cfg = ckpt.config().clone();
    super::checks::refuse_duplicates("--lengths", &plan.lengths, |&l| l)?;
    let mut lengths = plan.lengths.clone();
    lengths.sort_unstable();
    let longest = [("--lengths", lengths.last().copied())]
        .into_iter()
        .chain([("--warmup", plan.warmup)]);
    for (flag, tokens) in longest {
        if let Some(n) = tokens.filter(|&n| n > cfg.max_position_embeddings) {
            anyhow::bail!(
                "{flag} {n}: expected at most the model's max_position_embeddings ({})",
                cfg.max_position_embeddings
            );
        }
    }
    let work = Workload {
        context: lengths
            .last()
            .copied()
            .unwrap_or(1)
            .max(plan.warmup.unwrap_or(0)),
        chunk: plan.chunk,
        topk: cfg.index_topk,
    };
    let mut target = Target::prepare(&plan.device, &ckpt, &work)?;
    target.set_cpu_weights(&ckpt, plan.weights);
    let profiling = crate::backend::gpu::GpuSwitches::from_env()
        .map_err(anyhow::Error::msg)?
        .profile;
    progress.setup(&BenchSetup {
        cfg: cfg.clone(),
        profile_on_cpu: profiling && matches!(target, Target::Cpu { .. }),
        chunk: target.chunk(),
        threads: rayon::current_num_threads(),
        backend: target.record(),
    })?;
    // Deterministic ids in [3, vocab): the same prompts on every run.
    let prompt = |n: usize| -> Vec<u32> {
        let mut rng = crate::numerics::rng::Rng::new(0x9e37_79b9_7f4a_7c15);
        (0..n)
            .map(|_| 3 + rng.below(cfg.vocab_size - 3) as u32)
            .collect()
    };
    let prompts = lengths.iter().map(|&n| prompt(n)).collect();
    let opts = ModelOptions {
        index: plan.index,
        kv: plan.kv,
        topk: None,
        chunk: target.chunk(),
    };
    let task = BenchTask {
        ckpt: &ckpt,
        topk: cfg.index_topk,
        warmup: plan.warmup.map_or_else(Vec::new, prompt),
        prompts,
        load_started: Instant::now(),
        weights: target.weights_label(),
        plans: target.device_plans(),
        progress,
    };
    target.run(&ckpt, opts, task)
}

/// Times one prefill per prompt on the loaded model, measuring a [`BenchRow`] each.
struct BenchTask<'a> {
    ckpt: &'a Checkpoint,
    topk: usize,
    /// Untimed prompt run first (empty: none).
    warmup: Vec<u32>,
    prompts: Vec<Vec<u32>>,
    /// When loading began (the task starts right after it).
    load_started: Instant,
    weights: &'static str,
    /// The memory plan of each used device, in the backend's device order (empty on the CPU).
    plans: Vec<DevicePlan>,
    progress: &'a mut dyn BenchProgress,
}

impl ModelTask for BenchTask<'_> {
    type Output = BenchOutcome;
    fn run<B: Backend>(self, model: &mut Model<B>) -> anyhow::Result<BenchOutcome> {
        let load_seconds = self.load_started.elapsed().as_secs_f64();
        let loaded = model.backend().device_memory();
        if !self.warmup.is_empty() {
            let w = time_prefill(model, &self.warmup)?;
            self.progress.warmed_up(&w)?;
        }
        let start = BenchStart {
            load_seconds,
            loaded,
            reference: model.backend().reference_gemm_tflops(),
            weights: self.weights,
            plans: self.plans,
        };
        self.progress.started(&start)?;
        let mut rows = Vec::with_capacity(self.prompts.len());
        let mut profiled = model.backend().op_profile();
        for tokens in &self.prompts {
            let prefill = time_prefill(model, tokens)?;
            let peak_rss_mib = crate::devices::host::peak_rss_mib();
            let types = by_layer_type(self.ckpt, &prefill, self.topk);
            let projection = projection(self.ckpt.config(), &types, &prefill);
            let now = model.backend().op_profile();
            let ops = (!now.is_empty()).then(|| profile_since(&profiled, &now));
            profiled = now;
            let row = BenchRow {
                prefill,
                peak_rss_mib,
                types,
                projection,
                ops,
            };
            self.progress.measured(&start, &row)?;
            rows.push(row);
        }
        Ok(BenchOutcome { start, rows })
    }
}

/// The projection of one length to the 43-layer Flash schedule: only from layers of Flash's
/// own size, its routed expert count aside (the first dimension that differs, if any, is what
/// it says instead).
fn projection(cfg: &ModelConfig, types: &[LayerTypeFigures], p: &PrefillProfile) -> Projection {
    let flash = ModelConfig::flash();
    // Every dimension but the routed expert count (see `Projection::TokensPerS`); a token
    // must still pick as many of them.
    let differs = [
        ("hidden_size", cfg.hidden_size, flash.hidden_size),
        (
            "num_experts_per_tok",
            cfg.num_experts_per_tok,
            flash.num_experts_per_tok,
        ),
        (
            "n_shared_experts",
            cfg.n_shared_experts,
            flash.n_shared_experts,
        ),
        (
            "num_attention_heads",
            cfg.num_attention_heads,
            flash.num_attention_heads,
        ),
        ("head_dim", cfg.head_dim, flash.head_dim),
        (
            "moe_intermediate_size",
            cfg.moe_intermediate_size,
            flash.moe_intermediate_size,
        ),
        ("index_n_heads", cfg.index_n_heads, flash.index_n_heads),
        ("index_head_dim", cfg.index_head_dim, flash.index_head_dim),
        ("sliding_window", cfg.sliding_window, flash.sliding_window),
        ("vocab_size", cfg.vocab_size, flash.vocab_size),
    ]
    .into_iter()
    .find(|(_, a, b)| a != b);
    match (differs, projected_tokens_per_s(&flash, types, p)) {
        (None, Some(t)) => Projection::TokensPerS {
            tokens_per_s: t,
            routed_experts: cfg.n_routed_experts,
        },
        (Some((field, found, flash)), _) => Projection::NotFlashSized {
            field,
            found,
            flash,
        },
        (None, None) => Projection::NotEveryType,
    }
}

/// The operations' calls and seconds since `before` (a profile is cumulative), largest first.
fn profile_since(before: &[OpTime], now: &[OpTime]) -> Vec<OpTime> {
    let mut rows: Vec<OpTime> = now
        .iter()
        .map(|r| {
            let (calls, seconds) = before
                .iter()
                .find(|b| b.op == r.op)
                .map_or((0, 0.0), |b| (b.calls, b.seconds));
            OpTime {
                op: r.op.clone(),
                calls: r.calls - calls,
                seconds: r.seconds - seconds,
            }
        })
        .filter(|r| r.calls > 0)
        .collect();
    rows.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LayerKind;

    /// One measured layer of each type, 1 s each, and a 1-token prefill with a free embed and
    /// head.
    fn measured() -> (Vec<LayerTypeFigures>, PrefillProfile) {
        let types = [LayerKind::Swa, LayerKind::Csa, LayerKind::Hca]
            .into_iter()
            .map(|kind| LayerTypeFigures {
                kind,
                layers: 1,
                seconds_per_layer: 1.0,
                flops_per_layer: 1e9,
            })
            .collect();
        let profile = PrefillProfile {
            tokens: 43,
            seconds: 3.0,
            site_seconds: vec![0.0, 1.0, 1.0, 1.0, 0.0],
            transfer_bytes: (0, 0),
            resident_notes: Vec::new(),
            device_memory: Vec::new(),
        };
        (types, profile)
    }

    #[test]
    fn a_flash_sized_model_with_fewer_routed_experts_projects_and_says_so() {
        let (types, profile) = measured();
        let mut cfg = ModelConfig::flash();
        cfg.num_hidden_layers = 4;
        cfg.n_routed_experts = 8;
        // 43 layers at 1 s each: 1 token/s.
        assert_eq!(
            projection(&cfg, &types, &profile),
            Projection::TokensPerS {
                tokens_per_s: 1.0,
                routed_experts: 8
            }
        );
        cfg.num_experts_per_tok = 4;
        assert_eq!(
            projection(&cfg, &types, &profile),
            Projection::NotFlashSized {
                field: "num_experts_per_tok",
                found: 4,
                flash: 6
            }
        );
        let mut cfg = ModelConfig::flash();
        cfg.hidden_size = 1024;
        assert!(matches!(
            projection(&cfg, &types, &profile),
            Projection::NotFlashSized {
                field: "hidden_size",
                ..
            }
        ));
        assert_eq!(
            projection(&ModelConfig::flash(), &types[..2], &profile),
            Projection::NotEveryType
        );
    }
}
