//! The record schema (docs/outputs.md, normative): [`CellRecord`] (one cells.csv row),
//! [`LayerRecord`] (layers.csv), [`AttentionRecord`] (attention.csv), [`ProbeRun`] (one
//! (index, top-k) run of a probe, as `probe --json` prints it), [`RunInfo`] (run.json), the cell
//! ids, the records built from a run ([`CellRecord::of_run`]), and the verdict of lost layers
//! ([`verdict`]) and, for DeepSeek-V4.1, the stage of the two-level selection that lost a
//! needle ([`stage`]). The probe fills these records, the
//! report stores and renders them; neither the model nor a backend is visible from here. The `*_COLUMNS` constants are the CSV headers in the order of docs/architecture.md section 5; the serde field
//! order of each record must equal them (a test checks it).
//!
//! Everything the tables and plots show is read from these records; the few accessors on
//! [`CellRecord`] only combine its own fields (e.g. layers lost = non-trivial - selected).

use serde::{Deserialize, Serialize};
use std::time::{SystemTime, UNIX_EPOCH};

pub use crate::numerics::modes::{IndexProfile, KvMode};

pub mod engine;
pub mod stage;
pub mod verdict;

/// One row of layers.csv (docs/outputs.md): exactly these fields, in this order.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LayerRecord {
    pub cell_id: String,
    pub layer: usize,
    pub query_pos: usize,
    /// "prompt" or the decode step number (1 = the first generated token's position).
    pub phase: String,
    pub profile: String,
    pub driving: bool,
    /// Which of the run's needles (0-based, in the order named: `--needle`, or placement order
    /// for `--needles N`); 0 when there is one.
    pub needle: usize,
    pub visible_rows: usize,
    pub needle_rows: usize,
    pub needle_rank: Option<usize>,
    pub rank_ties: usize,
    /// Of `rank_ties`, how many are needle rows themselves (they keep the needle whatever the
    /// tie order). Not a layers.csv column (docs/outputs.md fixes those): 0 in records read back
    /// from a file or JSON, which makes [`verdict::tied_at_cutoff`] conservative.
    #[serde(skip)]
    pub needle_ties: usize,
    pub needle_score: Option<f32>,
    pub kth_score: Option<f32>,
    pub margin: Option<f32>,
    pub selected: bool,
    pub trivial: bool,
    /// DeepSeek-V4.1: the layer's part in the two-level selection ([`stage::LayerStage`]);
    /// empty on DeepSeek-V4 (and in files written before the column).
    #[serde(default)]
    pub stage: Option<stage::LayerStage>,
    /// On the candidate source: the rank of the needle's best block among the query's blocks
    /// (the pinned newest block first; [`stage::needle_block_rank`]); else empty.
    #[serde(default)]
    pub block_rank: Option<usize>,
    /// On the candidate source: whether it kept the needle's best block; on a reindex layer:
    /// whether a needle row lies in a kept block (the candidate stage passed it on); else
    /// empty.
    #[serde(default)]
    pub block_kept: Option<bool>,
    /// On a reindex layer: the needle's rank among every visible row, without the candidate
    /// mask (where the layer alone would have ranked it); else empty.
    #[serde(default)]
    pub unconstrained_rank: Option<usize>,
    /// On a reindex layer: where the needle was lost, if it was ([`stage::StageVerdict`]);
    /// else empty.
    #[serde(default)]
    pub stage_verdict: Option<stage::StageVerdict>,
}

/// Over records of one position and profile (one per CSA layer and needle): the non-trivial
/// layers on which every needle was selected, and the non-trivial layers.
pub fn layers_selected<'a>(records: impl IntoIterator<Item = &'a LayerRecord>) -> (usize, usize) {
    let mut by_layer: std::collections::BTreeMap<usize, bool> = Default::default();
    for r in records.into_iter().filter(|r| !r.trivial) {
        *by_layer.entry(r.layer).or_insert(true) &= r.selected;
    }
    (
        by_layer.values().filter(|&&all| all).count(),
        by_layer.len(),
    )
}

/// One row of attention.csv (docs/outputs.md), exactly these fields in this order.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AttentionRecord {
    pub cell_id: String,
    pub layer: usize,
    /// "swa", "csa" or "hca".
    pub layer_type: String,
    pub query_pos: usize,
    pub phase: String,
    pub needle_mass_mean: f32,
    pub needle_mass_max_head: f32,
    pub needle_in_window: bool,
    pub sink_mass_mean: f32,
}

/// One (index profile, top-k) forward pass and its answer.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ProbeRun {
    pub cell_id: String,
    pub index: String,
    pub kv: String,
    pub topk: usize,
    pub answer_text: String,
    /// The verdict on the answer; `None` when there is no answer to judge (a thinking
    /// scenario whose generation ended before `</think>`).
    pub answer_correct: Option<bool>,
    pub generated_ids: Vec<u32>,
    pub layers: Vec<LayerRecord>,
    #[serde(skip)]
    pub attention: Vec<AttentionRecord>,
    /// The serving engine's selections held against this run (`--engine`; engine.csv rows).
    #[serde(skip)]
    pub engine_records: Vec<engine::EngineLayerRecord>,
    /// Positions where the engine's selection disagreed with the driving rank (ties aside).
    pub selection_disagreements: usize,
    pub selection_checks: usize,
    pub wall_seconds: f64,
}

impl ProbeRun {
    /// The internal check: an error when the engine's selection disagreed with the needle rank
    /// outside straddling ties at any (layer, position), since a rank that does not follow
    /// from what the engine selected must never be recorded. Callers check before recording.
    pub fn check_selection(&self) -> Result<(), String> {
        if self.selection_disagreements == 0 {
            return Ok(());
        }
        Err(format!(
            "internal check failed: in run {} the engine's selection disagreed with the needle \
             rank at {} of {} (layer, position) checks outside exact ties",
            self.cell_id, self.selection_disagreements, self.selection_checks
        ))
    }
}

/// The `phase` column of layers.csv, attention.csv and engine.csv: "prompt" for positions inside the prompt, else the decode step number (1 = the position of
/// the first generated token).
pub fn phase_label(pos: usize, prompt_len: usize) -> String {
    if pos < prompt_len {
        "prompt".into()
    } else {
        (pos + 1 - prompt_len).to_string()
    }
}

/// A cell's id without the sample part: `L{prompt tokens}-d{depth}-{index}-k{topk}` (a
/// `probe --out` cell; a sweep cell appends `-s{sample}`). The one place the form is written:
/// the probe, the sweep's resume lookup and the report's checks all use it.
pub fn cell_id_base(
    prompt_tokens: usize,
    depth_pct: f64,
    index: IndexProfile,
    topk: usize,
) -> String {
    format!("L{prompt_tokens}-d{depth_pct}-{}-k{topk}", index.name())
}

/// cells.csv columns, in order.
pub const CELLS_COLUMNS: [&str; 20] = [
    "cell_id",
    "target_tokens",
    "prompt_tokens",
    "depth_pct",
    "needle_start",
    "needle_end",
    "answer_start",
    "answer_end",
    "index",
    "kv",
    "topk",
    "answer_text",
    "answer_correct",
    "min_needle_rank",
    "csa_layers_selected",
    "csa_layers_nontrivial",
    "wall_seconds",
    "recalled",
    "exact_keeps",
    "sample",
];

/// The cells.csv columns written before `recalled`, `exact_keeps` and `sample` (needlescope
/// 0.1 until 2026-12): such a file is still read, those three derived from the rest, and a
/// resumed run rewrites it with them.
pub const CELLS_COLUMNS_BEFORE_DERIVED: &[&str] = CELLS_COLUMNS.split_at(17).0;

/// layers.csv columns, in order.
pub const LAYERS_COLUMNS: [&str; 21] = [
    "cell_id",
    "layer",
    "query_pos",
    "phase",
    "profile",
    "driving",
    "needle",
    "visible_rows",
    "needle_rows",
    "needle_rank",
    "rank_ties",
    "needle_score",
    "kth_score",
    "margin",
    "selected",
    "trivial",
    "stage",
    "block_rank",
    "block_kept",
    "unconstrained_rank",
    "stage_verdict",
];

/// The layers.csv columns written before DeepSeek-V4.1's stage columns (needlescope 0.1 until
/// 2026-12): such a file is still read, the stage columns empty (every row a V4 layer's).
pub const LAYERS_COLUMNS_BEFORE_STAGE: &[&str] = LAYERS_COLUMNS.split_at(16).0;

/// attention.csv columns, in order.
pub const ATTENTION_COLUMNS: [&str; 9] = [
    "cell_id",
    "layer",
    "layer_type",
    "query_pos",
    "phase",
    "needle_mass_mean",
    "needle_mass_max_head",
    "needle_in_window",
    "sink_mass_mean",
];

/// One cells.csv row: one probe of one (length, depth, index profile, top-k) grid cell (one
/// sample of it when the sweep runs several prompts per cell).
///
/// The CSA-layer counts are taken at the answer position (the last prompt token, which produces
/// the first answer token) under the driving profile at this cell's `topk`:
/// `csa_layers_nontrivial` counts CSA layers with n_t > k, `csa_layers_selected` counts those
/// NON-TRIVIAL layers on which the needle was selected (so it never exceeds the former).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CellRecord {
    /// Unique within a run; also names `layers_<cell_id>.png`.
    pub cell_id: String,
    pub target_tokens: usize,
    pub prompt_tokens: usize,
    pub depth_pct: f64,
    pub needle_start: usize,
    pub needle_end: usize,
    pub answer_start: usize,
    pub answer_end: usize,
    /// Driving index profile.
    pub index: IndexProfile,
    pub kv: KvMode,
    pub topk: usize,
    /// What the model generated (may be empty, may hold commas, quotes or newlines).
    pub answer_text: String,
    /// Whether the generated answer holds the expected value; empty (`None`) when the run judges
    /// by indexer recall only (a synthetic model whose LM path cannot answer).
    pub answer_correct: Option<bool>,
    /// The needle rank on the CSA layer where it ranked WORST at the answer position (driving
    /// profile); each layer's needle rank is already the best over its needle rows (docs/architecture.md section 4),
    /// so this is "min over needle rows, max over CSA layers": the layer most likely to lose the
    /// needle, the number the heatmap writes in each cell. Empty when no needle row was visible.
    pub min_needle_rank: Option<usize>,
    pub csa_layers_selected: usize,
    pub csa_layers_nontrivial: usize,
    pub wall_seconds: f64,
    /// The cell's verdict however it was judged ([`Self::verdict`]): `answer_correct` when
    /// present, else indexer recall; empty when the cell is no evidence (judged by the indexer
    /// with every CSA layer trivial).
    #[serde(default)]
    pub recalled: Option<bool>,
    /// Of the CSA layers lost at the answer position, those the `exact` profile selects on the
    /// same hidden states (lost to the driving profile's rounding); empty when `exact` was not
    /// scored in the cell ([`crate::record::verdict::exact_keeps`]).
    #[serde(default)]
    pub exact_keeps: Option<usize>,
    /// The sample of a sweep cell (its cell_id's `-s{sample}`); empty for a probe's cell.
    #[serde(default)]
    pub sample: Option<usize>,
}

/// Where a cell's prompt put its needle: what cells.csv and engine_cells.csv say of the prompt
/// (the probe layer fills it from its prompt, so records need no prompt type).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PromptPlace {
    /// The length asked for (a sweep's grid length, a probe's `--length`, or a conversation's
    /// own length).
    pub target_tokens: usize,
    /// The prompt's real length; its last token is the answer position.
    pub prompt_tokens: usize,
    pub depth_pct: f64,
    /// The first needle's token span `[a, b)`.
    pub needle: (usize, usize),
    /// The answer value's token span `[a, b)`.
    pub answer: (usize, usize),
}

/// How a cell's success is judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Judge {
    /// `answer_correct` is present.
    Answer,
    /// `answer_correct` is empty: selected on every non-trivial CSA layer.
    Indexer,
}

impl CellRecord {
    /// Indexer recall: the needle was selected on every non-trivial CSA layer at the answer
    /// position (vacuously true when every layer is trivial; see [`Self::all_trivial`]).
    pub fn indexer_recall(&self) -> bool {
        self.csa_layers_selected >= self.csa_layers_nontrivial
    }

    /// The cells.csv record of one probe run whose prompt is `place`; `judge_by_answer` false
    /// leaves `answer_correct` empty (the indexer judges).
    pub fn of_run(run: &ProbeRun, place: &PromptPlace, judge_by_answer: bool) -> CellRecord {
        let answer_pos = place.prompt_tokens - 1;
        let recs = verdict::answer_position_records(&run.layers, answer_pos);
        let (selected, nontrivial) = layers_selected(recs.iter().copied());
        let mut cell = CellRecord {
            cell_id: run.cell_id.clone(),
            target_tokens: place.target_tokens,
            prompt_tokens: place.prompt_tokens,
            depth_pct: place.depth_pct,
            needle_start: place.needle.0,
            needle_end: place.needle.1,
            answer_start: place.answer.0,
            answer_end: place.answer.1,
            index: run.index.parse().expect("profile names round trip"),
            kv: run.kv.parse().expect("kv names round trip"),
            topk: run.topk,
            answer_text: run.answer_text.clone(),
            // No answer to judge (a thinking run that never reached </think>): the indexer's
            // recall judges the cell, as for a model that does not answer.
            answer_correct: judge_by_answer.then_some(run.answer_correct).flatten(),
            // Over every needle: the worst rank of any, and a layer counts as selected only
            // when it selects all of them (docs/outputs.md).
            min_needle_rank: recs.iter().filter_map(|r| r.needle_rank).max(),
            csa_layers_selected: selected,
            csa_layers_nontrivial: nontrivial,
            wall_seconds: run.wall_seconds,
            recalled: None,
            exact_keeps: None,
            sample: None,
        };
        cell.derive_columns(&run.layers);
        cell
    }

    /// The verdict: `answer_correct` when present, else indexer recall.
    pub fn recalled(&self) -> bool {
        self.answer_correct.unwrap_or_else(|| self.indexer_recall())
    }

    /// The `recalled` column: [`Self::recalled`] for a cell that is evidence
    /// ([`Self::is_evidence`]), else empty.
    pub fn verdict(&self) -> Option<bool> {
        self.is_evidence().then(|| self.recalled())
    }

    /// The sample a sweep's cell_id names (`...-s{sample}`); `None` for a probe's id.
    pub fn sample_of_id(cell_id: &str) -> Option<usize> {
        let (_, n) = cell_id.rsplit_once("-s")?;
        (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .then(|| n.parse().ok())
            .flatten()
    }

    /// Sets the columns derived from the others and from the cell's layers.csv rows
    /// (`recalled`, `exact_keeps`, `sample`), as the writer does before appending the row.
    pub fn derive_columns<'a>(&mut self, layers: impl IntoIterator<Item = &'a LayerRecord>) {
        self.recalled = self.verdict();
        self.sample = Self::sample_of_id(&self.cell_id);
        self.exact_keeps = self
            .prompt_tokens
            .checked_sub(1)
            .and_then(|answer| verdict::exact_keeps(layers, answer));
    }

    pub fn judge(&self) -> Judge {
        match self.answer_correct {
            Some(_) => Judge::Answer,
            None => Judge::Indexer,
        }
    }

    /// CSA layers that lost the needle: non-trivial and not selected.
    pub fn layers_lost(&self) -> usize {
        self.csa_layers_nontrivial
            .saturating_sub(self.csa_layers_selected)
    }

    /// Every CSA layer was trivial (n_t <= k): the indexer could not lose the needle, so the
    /// cell is no evidence either way.
    pub fn all_trivial(&self) -> bool {
        self.csa_layers_nontrivial == 0
    }

    /// Whether the cell counts towards a recall rate: it has an answer verdict, or a CSA layer
    /// where the indexer could have lost the needle (docs/architecture.md section 4: a trivial cell is shown,
    /// never counted as evidence).
    pub fn is_evidence(&self) -> bool {
        self.answer_correct.is_some() || !self.all_trivial()
    }

    /// The answer position: the last prompt token.
    pub fn answer_position(&self) -> usize {
        self.prompt_tokens.saturating_sub(1)
    }
}

/// What a run computed on (run.json `backend`). Runs written before the field existed ran on
/// the CPU, which is what a missing field reads as.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendRecord {
    /// `cpu`, `cuda` or `cuda-emu` (the GPU backend on host-emulated devices).
    pub kind: String,
    /// GEMM operand precision of a GPU backend (`bf16`, `f32`); on the CPU `bf16` with
    /// `--cpu-gemm bf16`, absent for its f32 reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemm: Option<String>,
    /// The devices and what each held, e.g. `cuda:0 layers 0-21 +embed`; informational (a
    /// resumed run may use other devices).
    #[serde(default)]
    pub devices: Vec<String>,
}

impl Default for BackendRecord {
    fn default() -> Self {
        BackendRecord::cpu()
    }
}

impl BackendRecord {
    /// The CPU reference backend.
    pub fn cpu() -> Self {
        BackendRecord {
            kind: "cpu".into(),
            gemm: None,
            devices: Vec::new(),
        }
    }

    /// What determines the numerics (compared on resume): the kind and the GEMM precision.
    pub fn numerics(&self) -> String {
        match &self.gemm {
            Some(g) => format!("{} gemm {g}", self.kind),
            None => self.kind.clone(),
        }
    }
}

impl std::fmt::Display for BackendRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.kind)?;
        if let Some(g) = &self.gemm {
            write!(f, " (GEMM {g})")?;
        }
        if !self.devices.is_empty() {
            write!(f, ": {}", self.devices.join(", "))?;
        }
        Ok(())
    }
}

/// run.json: what was run, on what, when; the resume check compares `sweep_args`,
/// `model_config_hash`, `model_fingerprint`, `scenario`, `scenario_fingerprint`, `synthetic`
/// and the backend's numerics (see
/// [`RunInfo::resume_differences`] in `resume.rs`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// argv as given (program name first).
    pub command_line: Vec<String>,
    pub model_path: String,
    /// [`config_hash`] of the model's config.
    pub model_config_hash: String,
    pub needlescope_version: String,
    /// RFC 3339, UTC, seconds ([`rfc3339_utc`]).
    pub start_time: String,
    pub scenario: String,
    /// The model is synthetic (`synth`): every plot title says so.
    pub synthetic: bool,
    /// Every argument that determines the results (lengths, depths, profiles, top-k, kv,
    /// samples, seeds...), as the sweep chooses to serialise them; compared key by key on
    /// resume. Leave out what does not change results (output directory, device, chunk size).
    pub sweep_args: serde_json::Value,
    /// [`crate::checkpoint::Checkpoint::fingerprint`] of the weights (compared on resume: the
    /// config alone does not tell two checkpoints apart); empty in runs written before it was
    /// recorded, which therefore do not resume.
    #[serde(default)]
    pub model_fingerprint: String,
    /// [`crate::probe::scenario::Scenario::fingerprint`] of the scenario's content (compared on
    /// resume: a file may reuse a built-in's name); empty in older runs.
    #[serde(default)]
    pub scenario_fingerprint: String,
    /// The backend the run computes on ([`BackendRecord`]; `cpu` when absent, as in runs
    /// written before it was recorded). Its numerics (kind and GEMM precision) must match on
    /// resume, its device list need not.
    #[serde(default)]
    pub backend: BackendRecord,
    /// Every invocation that wrote cells into the directory, in order (argv each; the first is
    /// `command_line`): a grid grown by a second sweep, or a probe adding its cells, appends
    /// its own. Empty in directories written before it was recorded ([`Self::invocations`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command_lines: Vec<Vec<String>>,
}

impl RunInfo {
    /// [`Self::command_lines`], or `command_line` alone where none were recorded.
    pub fn invocations(&self) -> Vec<Vec<String>> {
        match self.command_lines.is_empty() {
            true => vec![self.command_line.clone()],
            false => self.command_lines.clone(),
        }
    }

    /// The invocations with `line` appended, unless it is the last already (a resume by the
    /// same command line adds nothing new to read).
    pub fn with_invocation(&self, line: &[String]) -> Vec<Vec<String>> {
        let mut lines = self.invocations();
        if lines.last().map(Vec::as_slice) != Some(line) {
            lines.push(line.to_vec());
        }
        lines
    }

    /// A run starting now, with this crate's version and the process's command line.
    pub fn new(
        model_path: impl Into<String>,
        model_config_hash: impl Into<String>,
        scenario: impl Into<String>,
        synthetic: bool,
        sweep_args: serde_json::Value,
    ) -> Self {
        RunInfo {
            command_line: std::env::args_os()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            model_path: model_path.into(),
            model_config_hash: model_config_hash.into(),
            needlescope_version: env!("CARGO_PKG_VERSION").to_string(),
            start_time: rfc3339_utc(SystemTime::now()),
            scenario: scenario.into(),
            synthetic,
            sweep_args,
            model_fingerprint: String::new(),
            scenario_fingerprint: String::new(),
            backend: BackendRecord::cpu(),
            command_lines: Vec::new(),
        }
    }

    /// The same run with the weights' and the scenario's fingerprints.
    pub fn with_fingerprints(mut self, model: String, scenario: String) -> Self {
        self.model_fingerprint = model;
        self.scenario_fingerprint = scenario;
        self
    }

    /// The same run on another backend.
    pub fn with_backend(mut self, backend: BackendRecord) -> Self {
        self.backend = backend;
        self
    }

    /// The cells a sweep's grid holds (lengths x depths x index profiles x top-k x samples),
    /// or None for a directory that another command wrote (a probe's has no plan).
    pub fn cells_planned(&self) -> Option<usize> {
        if engine::is_engine_only(&self.sweep_args)
            && self.sweep_args.get("command").and_then(|c| c.as_str()) == Some("sweep")
        {
            let count = |key: &str| self.sweep_args.get(key)?.as_array().map(Vec::len);
            let samples = self.sweep_args.get("samples")?.as_u64()? as usize;
            return Some(count("lengths")? * count("depths")? * samples);
        }
        if writer(&self.sweep_args) != "sweep" {
            return None;
        }
        let count = |key: &str| self.sweep_args.get(key)?.as_array().map(Vec::len);
        let samples = self
            .sweep_args
            .get("samples")
            .map_or(Some(1), |s| s.as_u64().map(|n| n as usize))?;
        Some(
            ["lengths", "depths", "indexes", "topks"]
                .iter()
                .map(|k| count(k))
                .product::<Option<usize>>()?
                * samples,
        )
    }

    /// The short model name for plot titles: the last component of `model_path`.
    pub fn model_name(&self) -> &str {
        let p = self.model_path.trim_end_matches(['/', '\\']);
        p.rsplit(['/', '\\'])
            .next()
            .filter(|s| !s.is_empty())
            .unwrap_or(p)
    }
}

/// `sha256:<hex>` of a model config (the `model_config_hash` of run.json): the hash of its
/// canonical JSON ([`ModelConfig::hash_hex`](crate::config::ModelConfig::hash_hex), what `inspect` and `trace` print), so that a
/// reformatted config.json is the same model.
pub fn config_hash(cfg: &crate::config::ModelConfig) -> String {
    format!("sha256:{}", cfg.hash_hex())
}

/// RFC 3339 UTC timestamp with whole seconds, e.g. `2025-11-29T17:23:05Z`, from std only
/// (days-to-civil conversion of the proleptic Gregorian calendar). Times before 1970 clamp.
pub fn rfc3339_utc(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // H. Hinnant's civil_from_days, shifted so eras start on 0000-03-01.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}Z")
}

/// A cell id made safe as part of a file name: characters outside `[A-Za-z0-9._-]` become `_`.
pub fn file_stem(cell_id: &str) -> String {
    cell_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The command whose arguments `sweep_args` holds: `probe` (it records its name), `sweep`
/// (`demo` too: a sweep plan, recognised by its `indexes`), else `other`.
pub(crate) fn writer(sweep_args: &serde_json::Value) -> &'static str {
    if sweep_args.get("command").and_then(|c| c.as_str()) == Some("probe") {
        "probe"
    } else if sweep_args.get("indexes").is_some() {
        "sweep"
    } else {
        "other"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_json_without_a_backend_reads_as_cpu_and_resume_compares_numerics_only() {
        let info = RunInfo::new("m", "sha256:00", "passkey", true, serde_json::json!({}));
        let mut old = serde_json::to_value(&info).unwrap();
        old.as_object_mut().unwrap().remove("backend");
        let old: RunInfo = serde_json::from_value(old).unwrap();
        assert_eq!(old.backend, BackendRecord::cpu());
        assert!(old.resume_differences(&info).is_empty());
        let gpu = |devices: &[&str]| BackendRecord {
            kind: "cuda".into(),
            gemm: Some("bf16".into()),
            devices: devices.iter().map(|d| d.to_string()).collect(),
        };
        let a = info.clone().with_backend(gpu(&["cuda:0 layers 0-3"]));
        let b = info
            .clone()
            .with_backend(gpu(&["cuda:0 layers 0-1", "cuda:1 layers 2-3"]));
        assert!(a.resume_differences(&b).is_empty(), "devices may change");
        let d = old.resume_differences(&a);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].field, "backend");
        assert_eq!(d[0].expected, "\"cpu\"");
        assert_eq!(d[0].found, "\"cuda gemm bf16\"");
        assert_eq!(
            b.backend.to_string(),
            "cuda (GEMM bf16): cuda:0 layers 0-1, cuda:1 layers 2-3"
        );
    }
}
