//! The one place that decides the backend of a run and loads the model on it.
//!
//! [`Target::prepare`] turns `--device` / `--gpu-gemm` ([`DeviceChoice`]) into a backend before any
//! weight is read: it resolves the spec against the CUDA driver ([`super::device::resolve`]),
//! opens the devices, asks them for their free memory and places the layers
//! ([`crate::devices::placement::place_auto`]), refusing when the model does not fit; `--chunk auto` is
//! resolved there too ([`Target::chunk`]: the largest candidate chunk that fits on GPUs, 2,048
//! on the CPU). [`Target::run`] then
//! loads the model on that backend and hands it to an [`ModelTask`], the generic body of a
//! command (probe, sweep, trace, bench), monomorphised for each backend type. Rust closures
//! cannot be generic, hence the small trait instead of a callback.
//!
//! [`open_model`] opens the checkpoint of a run and checks its headers against its config
//! ([`crate::checkpoint::audit::check_config_describes`]): weights the config has no place for
//! (a layer past `num_hidden_layers`, an indexer on a layer the config calls HCA) are refused
//! before the tokenizer, the devices or any weight.
//!
//! `auto` runs on the GPUs when the driver sees one and they open (else on the CPU, with one
//! note); a model that does not fit them is then refused as with `cuda`, not silently moved to
//! the CPU. Notes for stderr (the `auto` fallback, an ignored `--gpu-gemm`: at most one line)
//! are written to the writer given to [`Target::prepare_with`]; [`Target::prepare`] uses
//! stderr.

use std::io::Write;

use super::device::{auto_note, gemm_name, resolve, DeviceChoice, DeviceSpec, Resolved};
use crate::backend::gpu::driver::CudaReport;
use crate::backend::gpu::matrix::headroom_budget;
use crate::backend::gpu::GpuSwitches;
use crate::backend::gpu::{CudaExecutor, EmuExecutor, Executor, GemmType, GpuBackend};
use crate::backend::{Backend, CpuBackend, WeightResidency};
use crate::checkpoint::Checkpoint;
use crate::devices::placement::{
    place_auto, DeviceMemory, Placement, Workload, AUTO_CHUNK, CPU_AUTO_CHUNK,
};
use crate::devices::plan::Footprint;
use crate::model::forward::{auto_residency, Model, ModelOptions};
use crate::record::BackendRecord;
use std::path::Path;

/// Opens the model directory of a run (probe, sweep, trace, bench) and refuses weights its
/// config does not describe; tensors of kinds the forward never reads, and tensors the
/// index's weight_map does not list, get one note each on stderr.
pub fn open_model(dir: &std::path::Path) -> anyhow::Result<Checkpoint> {
    let ckpt = Checkpoint::open(dir)?;
    if let Some(first) = ckpt.unindexed().first() {
        eprintln!(
            "note: {} tensor(s) in the shards are not listed in {}'s weight_map (first: {first}); \
             they are read like the listed ones, as serving engines do",
            ckpt.unindexed().len(),
            crate::checkpoint::reader::INDEX_FILE
        );
    }
    let ignored = crate::checkpoint::audit::check_config_describes(&ckpt)?;
    if let Some(first) = ignored.first() {
        eprintln!(
            "note: {} tensor(s) of kinds the forward never reads are ignored (first: {first})",
            ignored.len()
        );
    }
    Ok(ckpt)
}

/// The model directory's tokenizer.json, else the built-in V4 tokenizer; checked up front: its
/// vocabulary must fit the model, its special tokens must be DeepSeek-V4's
/// ([`crate::tokenizer::V4Tokenizer::check_special_tokens`]) and its BOS / EOS ids the config's `bos_token_id` /
/// `eos_token_id` (the model directory's config.json).
pub fn load_tokenizer(
    model: &Path,
    cfg: &crate::config::ModelConfig,
) -> anyhow::Result<crate::tokenizer::V4Tokenizer> {
    let vocab = cfg.vocab_size;
    let file = model.join("tokenizer.json");
    // symlink_metadata: a dangling link is an error naming it, not a silent built-in fallback.
    let tok = if file.symlink_metadata().is_ok() {
        crate::tokenizer::V4Tokenizer::from_file(&file)?
    } else {
        crate::tokenizer::V4Tokenizer::builtin()?
    };
    tok.check_special_tokens()?;
    if tok.vocab_size() > vocab {
        anyhow::bail!(
            "tokenizer {} has {} tokens but the model's vocab_size is {vocab}: needle prompts need a model with the real DeepSeek-V4 vocabulary (e.g. `synth --preset planted` or the official checkpoint)",
            tok.source_name(),
            tok.vocab_size()
        );
    }
    let config = model.join("config.json");
    tok.check_config_ids(cfg.bos_token_id, cfg.eos_token_id, &config)?;
    Ok(tok)
}

/// The body of a command, run on a loaded model of whatever backend the run uses.
pub trait ModelTask {
    type Output;
    fn run<B: Backend>(self, model: &mut Model<B>) -> anyhow::Result<Self::Output>;
}

/// A decided and placed backend, not loaded yet.
pub enum Target {
    /// The CPU reference, with linears resident as given (`Auto` already resolved).
    Cpu {
        weights: WeightResidency,
        /// The prefill chunk (`auto` resolved).
        chunk: usize,
        /// The most tokens the run holds (its host memory plan's context).
        context: usize,
        /// The linear products' operands (`--cpu-gemm`; f32 unless asked).
        gemm: GemmType,
    },
    Cuda(GpuTarget<CudaExecutor>),
    Emu(GpuTarget<EmuExecutor>),
}

/// Opened GPU devices (only those that run something) and their layer placement.
pub struct GpuTarget<E: Executor> {
    pub devices: Vec<E>,
    pub placement: Placement,
    pub gemm: GemmType,
}

impl Target {
    /// [`Target::prepare_with`] with the real driver and notes on stderr.
    pub fn prepare(
        args: &DeviceChoice,
        ckpt: &Checkpoint,
        work: &Workload,
    ) -> anyhow::Result<Self> {
        Self::prepare_with(
            args,
            ckpt,
            work,
            crate::backend::gpu::driver::probe,
            &mut std::io::stderr(),
        )
    }

    /// Decides the backend for `args` (see the module docs); `probe` is asked about the CUDA
    /// driver only for `auto` and `cuda`. Errors: the spec cannot be honoured, a device cannot
    /// be opened, or the model does not fit (before anything is loaded).
    pub fn prepare_with(
        args: &DeviceChoice,
        ckpt: &Checkpoint,
        work: &Workload,
        probe: impl FnOnce() -> CudaReport,
        notes: &mut dyn Write,
    ) -> anyhow::Result<Self> {
        let gemm = args.gemm();
        let (resolved, note) = resolve(&args.device, probe)?;
        if !matches!(resolved, Resolved::Cpu) {
            // The GPU backend's switches: a bad value is refused, not read as the default.
            GpuSwitches::from_env().map_err(anyhow::Error::msg)?;
        }
        let target = match resolved {
            Resolved::Cpu => None,
            Resolved::Emu(capacities) => {
                let devices = capacities
                    .iter()
                    .enumerate()
                    // Memory tracked, so that `bench` can hold the plan to its peaks.
                    .map(|(i, &c)| EmuExecutor::new(i, c as usize).with_memory_tracking(true))
                    .collect();
                Some(Target::Emu(GpuTarget::placed(devices, ckpt, work, gemm)?))
            }
            Resolved::Cuda(ordinals) => match open_cuda(&ordinals) {
                Ok(devices) => Some(Target::Cuda(GpuTarget::placed(devices, ckpt, work, gemm)?)),
                // `auto` takes the GPUs only when they can be used.
                Err(why) if args.device == DeviceSpec::Auto => {
                    let note = auto_note(&format!("the GPU backend cannot start ({why})"));
                    return Self::cpu_with_note(args, ckpt, work, Some(note), notes);
                }
                Err(why) => anyhow::bail!("--device {}: {why}", args.device),
            },
        };
        match target {
            Some(t) => {
                if let Some(g) = args.cpu_gemm {
                    writeln!(
                        notes,
                        "note: --cpu-gemm {} is ignored on a GPU backend (its products: --gpu-gemm)",
                        gemm_name(g)
                    )?;
                }
                Ok(t)
            }
            None => Self::cpu_with_note(args, ckpt, work, note, notes),
        }
    }

    /// The CPU target, writing the one note line (the `auto` fallback and / or an ignored
    /// `--gpu-gemm`).
    fn cpu_with_note(
        args: &DeviceChoice,
        ckpt: &Checkpoint,
        work: &Workload,
        note: Option<String>,
        notes: &mut dyn Write,
    ) -> anyhow::Result<Self> {
        let ignored = args.gpu_gemm.map(gemm_name);
        let gemm = args.cpu_gemm.unwrap_or(GemmType::F32);
        let line = match (note, ignored) {
            (Some(n), Some(g)) => Some(format!("{n} (--gpu-gemm {g} ignored)")),
            (Some(n), None) => Some(n),
            (None, Some(g)) => Some(format!(
                "note: --gpu-gemm {g} is ignored on the CPU reference backend (its products: \
                 --cpu-gemm)"
            )),
            (None, None) => None,
        };
        if let Some(l) = line {
            writeln!(notes, "{l}")?;
        }
        Ok(Target::Cpu {
            weights: auto_residency(ckpt),
            chunk: match work.chunk {
                AUTO_CHUNK => CPU_AUTO_CHUNK,
                c => c,
            },
            context: work.context,
            gemm,
        })
    }

    /// Sets the CPU weight residency (`Auto` resolved for `ckpt`); no effect on a GPU target,
    /// which keeps weights on the device in their stored format.
    pub fn set_cpu_weights(&mut self, ckpt: &Checkpoint, weights: WeightResidency) {
        if let Target::Cpu { weights: w, .. } = self {
            *w = match weights {
                WeightResidency::Auto => auto_residency(ckpt),
                other => other,
            };
        }
    }

    /// Where the linear weights live: `decoded` / `streamed` on the CPU, `device` on a GPU.
    pub fn weights_label(&self) -> &'static str {
        match self {
            Target::Cpu { weights, .. } => weights.name(),
            _ => "device",
        }
    }

    /// The prefill chunk of the run: `--chunk` as given, or what `auto` chose (see
    /// [`crate::devices::placement::place_auto`]); at most the context on a GPU (its plan's chunk).
    pub fn chunk(&self) -> usize {
        match self {
            Target::Cpu { chunk, .. } => *chunk,
            Target::Cuda(t) => t.placement.plan.chunk,
            Target::Emu(t) => t.placement.plan.chunk,
        }
    }

    /// The memory plan of each device the run uses, in the backend's device order (empty on
    /// the CPU).
    pub fn device_plans(&self) -> Vec<crate::devices::plan::DevicePlan> {
        match self {
            Target::Cpu { .. } => Vec::new(),
            Target::Cuda(t) => t.placement.plan.devices.clone(),
            Target::Emu(t) => t.placement.plan.devices.clone(),
        }
    }

    /// What run.json and the outputs record about the backend.
    pub fn record(&self) -> BackendRecord {
        match self {
            Target::Cpu { gemm, .. } => BackendRecord {
                // The reference's f32 leaves no mark (the records of every earlier CPU run).
                gemm: (*gemm == GemmType::Bf16).then(|| gemm_name(*gemm).to_string()),
                ..BackendRecord::cpu()
            },
            Target::Cuda(t) => t.record(),
            Target::Emu(t) => t.record(),
        }
    }

    /// Loads the model on the target (with `opts`) and runs `task` on it.
    pub fn run<T: ModelTask>(
        self,
        ckpt: &Checkpoint,
        opts: ModelOptions,
        task: T,
    ) -> anyhow::Result<T::Output> {
        match self {
            Target::Cpu {
                weights,
                chunk,
                context,
                gemm,
            } => {
                super::checks::refuse_host_shortfall(
                    ckpt.config(),
                    &Footprint::of_checkpoint(ckpt),
                    context,
                    chunk,
                    weights,
                )?;
                let backend = CpuBackend::with_weights(weights).with_gemm(gemm);
                task.run(&mut load_with_bar(backend, ckpt, opts)?)
            }
            Target::Cuda(t) => t.run(ckpt, opts, task),
            Target::Emu(t) => t.run(ckpt, opts, task),
        }
    }
}

impl<E: Executor> GpuTarget<E> {
    /// Places the model over `devices` by their free memory, keeping the devices that run
    /// something.
    fn placed(
        devices: Vec<E>,
        ckpt: &Checkpoint,
        work: &Workload,
        gemm: GemmType,
    ) -> anyhow::Result<Self> {
        let mut memory = Vec::with_capacity(devices.len());
        for d in &devices {
            let (free, _total) = d
                .memory()
                .map_err(|e| anyhow::anyhow!("{}: cannot read its free memory: {e}", d.name()))?;
            memory.push(DeviceMemory {
                name: d.name(),
                free: free as u64,
            });
        }
        let placement = place_auto(
            ckpt.config(),
            &Footprint::of_checkpoint(ckpt),
            &memory,
            work,
        )?;
        let mut slots: Vec<Option<E>> = devices.into_iter().map(Some).collect();
        let devices = placement
            .used
            .iter()
            .map(|&i| slots[i].take().expect("placement uses each device once"))
            .collect();
        Ok(GpuTarget {
            devices,
            placement,
            gemm,
        })
    }

    fn record(&self) -> BackendRecord {
        BackendRecord {
            kind: E::KIND.into(),
            gemm: Some(gemm_name(self.gemm).into()),
            devices: self.placement.ranges(),
        }
    }

    fn run<T: ModelTask>(
        self,
        ckpt: &Checkpoint,
        opts: ModelOptions,
        task: T,
    ) -> anyhow::Result<T::Output> {
        let budgets = decode_budgets(&self.placement, self.devices.len())?;
        let backend = GpuBackend::new(self.devices, self.placement.layer_device, self.gemm)
            .with_decode_budgets(&budgets);
        task.run(&mut load_with_bar(backend, ckpt, opts)?)
    }
}

/// Loads the model with a bar over the model's parts on stderr (hidden when stderr is not a
/// terminal, cleared when done): on a GPU every stored weight is read from disk and uploaded,
/// minutes for Flash.
fn load_with_bar<B: Backend>(
    backend: B,
    ckpt: &Checkpoint,
    opts: ModelOptions,
) -> Result<Model<B>, crate::model::ModelError> {
    let bar =
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    bar.set_style(crate::run::progress::style(crate::run::progress::LOADING));
    let model = Model::load_reporting(backend, ckpt, opts, &mut |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    });
    bar.finish_and_clear();
    model
}

/// Per used device, the bytes decoded weight copies may take: what the placement's memory plan
/// leaves free there, less a margin, capped by `NEEDLESCOPE_DECODE_CACHE_MIB`
/// ([`headroom_budget`]).
fn decode_budgets(placement: &Placement, devices: usize) -> anyhow::Result<Vec<usize>> {
    let cap = GpuSwitches::from_env()
        .map_err(anyhow::Error::msg)?
        .decode_cache_bytes;
    let mut budgets: Vec<usize> = placement
        .plan
        .devices
        .iter()
        .map(|d| headroom_budget(d.free, d.capacity, cap))
        .collect();
    budgets.resize(devices, 0);
    Ok(budgets)
}

/// Opens the CUDA devices, in order.
fn open_cuda(ordinals: &[usize]) -> Result<Vec<CudaExecutor>, String> {
    ordinals
        .iter()
        .map(|&o| CudaExecutor::new(o).map_err(|e| format!("cannot open cuda:{o}: {e}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> (tempfile::TempDir, Checkpoint) {
        crate::synth::tiny_for_tests()
    }

    fn no_gpu() -> CudaReport {
        let mut r = crate::backend::gpu::driver::probe();
        r.driver_present = true;
        r.devices.clear();
        r.error = None;
        r
    }

    const WORK: Workload = Workload {
        context: 64,
        chunk: 32,
        topk: 8,
    };

    fn prepare(spec: &str, gemm: Option<GemmType>) -> (anyhow::Result<Target>, String) {
        let (_dir, ckpt) = tiny();
        let args = DeviceChoice {
            device: spec.parse::<DeviceSpec>().unwrap(),
            gpu_gemm: gemm,
            cpu_gemm: None,
        };
        let mut notes = Vec::new();
        let t = Target::prepare_with(&args, &ckpt, &WORK, no_gpu, &mut notes);
        (t, String::from_utf8(notes).unwrap())
    }

    #[test]
    fn auto_without_a_gpu_is_the_cpu_with_one_note() {
        let (t, notes) = prepare("auto", None);
        assert!(matches!(t.unwrap(), Target::Cpu { .. }));
        assert_eq!(
            notes,
            "note: --device auto: the CUDA driver sees no GPU; running on the CPU reference backend\n"
        );
        let (_, notes) = prepare("auto", Some(GemmType::F32));
        assert_eq!(notes.lines().count(), 1);
        assert!(
            notes.ends_with("backend (--gpu-gemm f32 ignored)\n"),
            "{notes}"
        );
        let (t, notes) = prepare("cpu", None);
        assert_eq!(t.unwrap().record(), BackendRecord::cpu());
        assert!(notes.is_empty());
    }

    /// `--chunk auto` is 2,048 on the CPU; an explicit chunk is kept; on the emulated GPU the
    /// placement's choice (at most the context).
    #[test]
    fn auto_chunk_resolves_with_the_backend() {
        let (_dir, ckpt) = tiny();
        let run = |spec: &str, chunk: usize| {
            let args = DeviceChoice {
                device: spec.parse::<DeviceSpec>().unwrap(),
                gpu_gemm: None,
                cpu_gemm: None,
            };
            let work = Workload { chunk, ..WORK };
            Target::prepare_with(&args, &ckpt, &work, no_gpu, &mut Vec::new())
                .unwrap()
                .chunk()
        };
        assert_eq!(run("cpu", AUTO_CHUNK), CPU_AUTO_CHUNK);
        assert_eq!(run("cpu", 32), 32);
        assert_eq!(
            run("emu", AUTO_CHUNK),
            WORK.context,
            "8,192 capped at the context"
        );
        assert_eq!(run("emu", 32), 32);
    }

    #[test]
    fn cuda_without_a_gpu_is_an_error() {
        let (t, notes) = prepare("cuda", None);
        let e = t.err().unwrap().to_string();
        assert!(
            e.contains("--device cuda: the CUDA driver sees no GPU"),
            "{e}"
        );
        assert!(notes.is_empty());
    }

    #[test]
    fn emu_places_and_records_the_devices() {
        let (t, notes) = prepare("emu:3", Some(GemmType::F32));
        assert!(notes.is_empty());
        let t = t.unwrap();
        assert_eq!(t.weights_label(), "device");
        let r = t.record();
        assert_eq!(
            (r.kind.as_str(), r.gemm.as_deref()),
            ("cuda-emu", Some("f32"))
        );
        // A toy model is not spread: its layers weigh less than a device's workspace.
        assert_eq!(r.devices, vec!["emu:0 layers 0-3 +embed +head".to_string()]);
        let Target::Emu(g) = t else { panic!() };
        assert_eq!(g.devices.len(), 1);
        assert_eq!(g.placement.idle, vec!["emu:1", "emu:2"]);
        let (t, _) = prepare("emu:2x1G", None);
        let e = t.err().unwrap().to_string();
        assert!(e.contains("does not fit on emu:0, emu:1"), "{e}");
    }
}

/// What a model directory says about itself, beyond the architecture.
#[derive(Clone, Copy, Debug, Default)]
pub struct ModelMarks {
    /// Written by `synth` (its `synth.json` or a planted model's `planted.json`): every report
    /// says "synthetic model".
    pub synthetic: bool,
    /// False when the LM path is not built to answer (judge by indexer recall).
    pub answers: bool,
}

impl ModelMarks {
    /// Whether a run's verdict is its generated answer: the model is built to answer and the
    /// run generates at least one token. With `--generate 0` there is no answer to judge, so
    /// indexer recall decides (`answer_correct` empty), as for a model that cannot answer.
    pub fn judges_answers(&self, generate: usize) -> bool {
        self.answers && generate > 0
    }
}

/// What a model directory says about itself beyond the architecture: a planted checkpoint's
/// `planted.json` (see `checkpoint::planted`) marks it synthetic and says whether its LM path
/// answers; any other checkpoint `synth` wrote has its `synth.json` (random weights: synthetic,
/// and its answers mean nothing, so indexer recall judges).
pub fn model_marks(model_dir: &Path) -> ModelMarks {
    // Only the two fields needed, so a planted.json from another version still counts.
    let path = model_dir.join(crate::synth::planted::INFO_FILE);
    let Ok(text) = std::fs::read_to_string(path) else {
        let synthetic = model_dir.join(crate::synth::SYNTH_MARK_FILE).is_file();
        return ModelMarks {
            synthetic,
            answers: !synthetic,
        };
    };
    let value: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    ModelMarks {
        synthetic: value
            .get("synthetic")
            .and_then(|v| v.as_bool())
            .unwrap_or(true),
        answers: value
            .get("lm_copies_needle")
            .and_then(|v| v.as_bool())
            .unwrap_or(false),
    }
}

/// Whether a model directory holds weights (a safetensors file or a shard index): without
/// them, `--engine` runs engine-only.
pub fn has_weights(model: &Path) -> bool {
    std::fs::read_dir(model)
        .map(|entries| {
            entries.flatten().any(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.ends_with(".safetensors") || name.ends_with(".safetensors.index.json")
            })
        })
        .unwrap_or(false)
}
