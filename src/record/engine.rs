//! The serving engine's records: [`EngineLayerRecord`] (one engine.csv row, docs/outputs.md),
//! [`EngineCellRecord`] (one engine_cells.csv row of an engine-only run), their cell ids, and
//! how many non-trivial layers the engine's selection kept. What the records say (the closest
//! profile, where the engine lost a needle, the conclusion) is
//! [`crate::record::verdict::EngineVerdict`].
//!
//! A record is one (cell, CSA layer, probed position, needle, scored profile): whether the
//! engine's own selection E at that position held a row of the needle, |E| (its rows other than
//! the -1 padding), and the overlap |E ∩ R| / |E| with R, the top-K rows under the profile on
//! needlescope's hidden states (K = the engine's, ties to the lower row as the reference
//! engine breaks them). With no local model (engine-only mode) the profile is empty and the
//! overlap absent: one record per (layer, position, needle).

use serde::{Deserialize, Serialize};

/// One row of engine.csv (docs/outputs.md): exactly these fields, in this order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EngineLayerRecord {
    pub cell_id: String,
    pub layer: usize,
    pub query_pos: usize,
    /// "prompt" or the decode step number, as in layers.csv.
    pub phase: String,
    pub needle: usize,
    /// The engine's K (read from its payload).
    pub engine_topk: usize,
    pub visible_rows: usize,
    /// Rows the engine selected at this (layer, position): |E|.
    pub selected_rows: usize,
    /// Whether E holds a row of this needle.
    pub needle_selected: bool,
    /// The scored profile R is taken under; empty without a local model.
    pub profile: String,
    /// |E ∩ R| / |E|; empty without a local model.
    pub overlap: Option<f32>,
}

/// engine.csv columns, in order.
pub const ENGINE_COLUMNS: [&str; 11] = [
    "cell_id",
    "layer",
    "query_pos",
    "phase",
    "needle",
    "engine_topk",
    "visible_rows",
    "selected_rows",
    "needle_selected",
    "profile",
    "overlap",
];

/// One row of engine_cells.csv (docs/outputs.md): one prompt of an engine-only sweep (no
/// local model), exactly these fields in this order. Counts are taken at the answer position
/// from the engine's own selection, as cells.csv counts the reference's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EngineCellRecord {
    /// [`engine_cell_id`].
    pub cell_id: String,
    pub target_tokens: usize,
    pub prompt_tokens: usize,
    pub depth_pct: f64,
    pub needle_start: usize,
    pub needle_end: usize,
    pub engine_topk: usize,
    /// The engine's generated text.
    pub answer_text: String,
    /// Its verdict; empty when answers are not judged (a synthetic model) or it did not end.
    pub answer_correct: Option<bool>,
    /// Non-trivial CSA layers whose engine selection held every needle.
    pub csa_layers_selected: usize,
    pub csa_layers_nontrivial: usize,
    /// Seconds of the exchange with the engine.
    pub wall_seconds: f64,
}

/// What the engine answered for one prompt: its K, its generated text and that text's verdict
/// (empty when answers are not judged or the answer did not end).
#[derive(Clone, Debug, PartialEq)]
pub struct EngineAnswer {
    pub topk: usize,
    pub text: String,
    pub correct: Option<bool>,
}

impl EngineCellRecord {
    /// The engine_cells.csv record of one prompt (`place`) held against the engine alone, from
    /// its answer and its membership records (`engine_records`, counted at the answer position).
    pub fn of(
        cell_id: String,
        place: &super::PromptPlace,
        answer: EngineAnswer,
        engine_records: &[EngineLayerRecord],
        wall_seconds: f64,
    ) -> EngineCellRecord {
        let (selected, nontrivial) =
            engine_layers_selected(engine_records, place.prompt_tokens - 1);
        EngineCellRecord {
            cell_id,
            target_tokens: place.target_tokens,
            prompt_tokens: place.prompt_tokens,
            depth_pct: place.depth_pct,
            needle_start: place.needle.0,
            needle_end: place.needle.1,
            engine_topk: answer.topk,
            answer_text: answer.text,
            answer_correct: answer.correct,
            csa_layers_selected: selected,
            csa_layers_nontrivial: nontrivial,
            wall_seconds,
        }
    }
}

/// engine_cells.csv columns, in order.
pub const ENGINE_CELLS_COLUMNS: [&str; 12] = [
    "cell_id",
    "target_tokens",
    "prompt_tokens",
    "depth_pct",
    "needle_start",
    "needle_end",
    "engine_topk",
    "answer_text",
    "answer_correct",
    "csa_layers_selected",
    "csa_layers_nontrivial",
    "wall_seconds",
];

/// The cell id of an engine-only cell: `L{prompt tokens}-d{depth}-engine-k{K}`, with
/// `-s{sample}` in a sweep.
pub fn engine_cell_id(
    prompt_tokens: usize,
    depth_pct: f64,
    topk: usize,
    sample: Option<usize>,
) -> String {
    let suffix = sample.map_or(String::new(), |s| format!("-s{s}"));
    format!("L{prompt_tokens}-d{depth_pct}-engine-k{topk}{suffix}")
}

/// Whether run.json's arguments are an engine-only run's (`"local": false`).
pub fn is_engine_only(sweep_args: &serde_json::Value) -> bool {
    sweep_args.get("local") == Some(&serde_json::Value::Bool(false))
}

/// (non-trivial layers whose selection held every needle, non-trivial layers) at `answer_pos`,
/// from engine records (each (layer, needle) counted once whatever the profile).
pub fn engine_layers_selected(
    engine_records: &[EngineLayerRecord],
    answer_pos: usize,
) -> (usize, usize) {
    let mut by_layer: std::collections::BTreeMap<usize, bool> = Default::default();
    for r in engine_records
        .iter()
        .filter(|r| r.query_pos == answer_pos && r.visible_rows > r.engine_topk)
    {
        *by_layer.entry(r.layer).or_insert(true) &= r.needle_selected;
    }
    (
        by_layer.values().filter(|&&all| all).count(),
        by_layer.len(),
    )
}
