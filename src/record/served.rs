//! The serving engine held against the reference: [`ServedLayerRecord`] (one engine.csv row,
//! docs/outputs.md) and [`ServedVerdict`], what the records of one run say (which profile the
//! engine's selections agree with best, where the engine lost a needle, the one-line
//! conclusion).
//!
//! A record is one (cell, CSA layer, probed position, needle, scored profile): whether the
//! engine's own selection E at that position held a row of the needle, |E| (its rows other than
//! the -1 padding), and the overlap |E ∩ R| / |E| with R, the top-K rows under the profile on
//! needlescope's hidden states (K = the engine's, ties to the lower row as the reference
//! engine breaks them). With no local model (engine-only mode) the profile is empty and the
//! overlap absent: one record per (layer, position, needle).
//!
//! The closest profile is the one with the highest mean overlap over the answer position's
//! non-trivial CSA layers (on a trivial layer, n_t <= K, every profile selects every row);
//! ties go to the earlier profile of `IndexProfile::ALL`. It is called inconclusive when the
//! runner-up's mean is within [`INCONCLUSIVE_GAP`] of it.

use serde::{Deserialize, Serialize};

use super::LayerRecord;

/// Two profiles whose mean overlaps differ by less than this are not told apart (a
/// difference of one row in a hundred: rounding profiles that move only rows near the
/// cut-off).
pub const INCONCLUSIVE_GAP: f32 = 0.01;

/// One row of engine.csv (docs/outputs.md): exactly these fields, in this order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServedLayerRecord {
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
pub const SERVED_COLUMNS: [&str; 11] = [
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
pub fn engine_layers_selected(served: &[ServedLayerRecord], answer_pos: usize) -> (usize, usize) {
    let mut by_layer: std::collections::BTreeMap<usize, bool> = Default::default();
    for r in served
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

/// A profile's mean overlap over the answer position's non-trivial CSA layers.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProfileAgreement {
    pub profile: String,
    pub mean_overlap: f32,
}

/// A layer at the answer position where the engine's selection held no row of a needle.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EngineLoss {
    pub layer: usize,
    pub needle: usize,
    /// The reference's needle rank under the driving profile at the engine's K (None without a
    /// local model or with no needle row visible).
    pub reference_rank: Option<usize>,
    /// Whether the reference under the driving profile selects the needle there.
    pub reference_keeps: Option<bool>,
}

/// What one run's engine records say.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ServedVerdict {
    /// Every scored profile, best agreement first.
    pub agreement: Vec<ProfileAgreement>,
    /// None without a local model or without a non-trivial layer at the answer position.
    pub closest: Option<ProfileAgreement>,
    pub runner_up: Option<ProfileAgreement>,
    pub inconclusive: bool,
    /// The answer position's layers where the engine lost a needle (non-trivial layers only).
    pub lost: Vec<EngineLoss>,
    /// Non-trivial CSA layers at the answer position.
    pub nontrivial_layers: usize,
}

impl ServedVerdict {
    /// From one run's engine records and (with a local model) its layer records, at the answer
    /// position `answer_pos`. `profile_order` orders profiles for ties (`IndexProfile::ALL`);
    /// `driving` is the reference's driving profile.
    pub fn of(
        served: &[ServedLayerRecord],
        layers: &[LayerRecord],
        answer_pos: usize,
        profile_order: &[&str],
        driving: Option<&str>,
    ) -> ServedVerdict {
        let here: Vec<&ServedLayerRecord> = served
            .iter()
            .filter(|r| r.query_pos == answer_pos && r.visible_rows > r.engine_topk)
            .collect();
        let mut nontrivial: Vec<usize> = here.iter().map(|r| r.layer).collect();
        nontrivial.sort_unstable();
        nontrivial.dedup();
        // Mean overlap per profile, over layers (each layer once: needle 0's rows).
        let mut agreement: Vec<ProfileAgreement> = Vec::new();
        for &p in profile_order {
            let vals: Vec<f32> = here
                .iter()
                .filter(|r| r.profile == p && r.needle == 0)
                .filter_map(|r| r.overlap)
                .collect();
            if vals.is_empty() {
                continue;
            }
            agreement.push(ProfileAgreement {
                profile: p.to_string(),
                mean_overlap: vals.iter().sum::<f32>() / vals.len() as f32,
            });
        }
        // Stable: equal means keep the profile order.
        agreement.sort_by(|a, b| b.mean_overlap.total_cmp(&a.mean_overlap));
        let closest = agreement.first().cloned();
        let runner_up = agreement.get(1).cloned();
        let inconclusive = match (&closest, &runner_up) {
            (Some(a), Some(b)) => a.mean_overlap - b.mean_overlap < INCONCLUSIVE_GAP,
            _ => closest.is_none(),
        };
        let mut lost = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for r in here.iter().filter(|r| !r.needle_selected) {
            if !seen.insert((r.layer, r.needle)) {
                continue;
            }
            let reference = driving.and_then(|d| {
                layers.iter().find(|l| {
                    l.query_pos == answer_pos
                        && l.layer == r.layer
                        && l.needle == r.needle
                        && l.profile == d
                })
            });
            lost.push(EngineLoss {
                layer: r.layer,
                needle: r.needle,
                reference_rank: reference.and_then(|l| l.needle_rank),
                reference_keeps: reference.map(|l| l.selected),
            });
        }
        ServedVerdict {
            agreement,
            closest,
            runner_up,
            inconclusive,
            lost,
            nontrivial_layers: nontrivial.len(),
        }
    }

    /// The one-line conclusion a person acts on, e.g. "the engine lost the needle on layers 12
    /// and 18, where the reference under fp8 keeps it; its selections agree best with
    /// fp8-no-hadamard-k (0.97) over fp8 (0.61): its index keys look un-rotated".
    pub fn conclusion(&self, driving: Option<&str>, needles: usize) -> String {
        let mut parts = Vec::new();
        let noun = if needles > 1 {
            "a needle"
        } else {
            "the needle"
        };
        if self.nontrivial_layers == 0 {
            parts.push(format!(
                "every CSA layer is trivial at the answer position (the engine's K covers every \
                 visible row), so the engine cannot lose {noun} there"
            ));
        } else if self.lost.is_empty() {
            parts.push(format!(
                "the engine kept {} on all {} non-trivial CSA layers",
                if needles > 1 {
                    "every needle"
                } else {
                    "the needle"
                },
                self.nontrivial_layers
            ));
        } else {
            let layers = join_layers(self.lost.iter().map(|l| l.layer));
            let mut s = format!(
                "the engine lost {noun} on {} {layers} (of {} non-trivial CSA layers)",
                if self.lost_layer_count() == 1 {
                    "layer"
                } else {
                    "layers"
                },
                self.nontrivial_layers
            );
            if let Some(d) = driving {
                let kept = join_layers(
                    self.lost
                        .iter()
                        .filter(|l| l.reference_keeps == Some(true))
                        .map(|l| l.layer),
                );
                let lost_too = join_layers(
                    self.lost
                        .iter()
                        .filter(|l| l.reference_keeps == Some(false))
                        .map(|l| l.layer),
                );
                match (kept.is_empty(), lost_too.is_empty()) {
                    (false, true) => s += &format!(", where the reference under {d} keeps it"),
                    (true, false) => s += &format!(", where the reference under {d} loses it too"),
                    (false, false) => s += &format!(
                        "; the reference under {d} keeps it on {kept} and loses it too on {lost_too}"
                    ),
                    (true, true) => {}
                }
            }
            parts.push(s);
        }
        match (&self.closest, &self.runner_up) {
            (Some(a), Some(b)) if self.inconclusive => parts.push(format!(
                "its selections agree about equally with {} ({:.2}) and {} ({:.2}): inconclusive \
                 (closer than {INCONCLUSIVE_GAP})",
                a.profile, a.mean_overlap, b.profile, b.mean_overlap
            )),
            (Some(a), Some(b)) => {
                let hint = profile_hint(&a.profile).map_or(String::new(), |h| format!(": {h}"));
                parts.push(format!(
                    "its selections agree best with {} ({:.2}) over {} ({:.2}){hint}",
                    a.profile, a.mean_overlap, b.profile, b.mean_overlap
                ))
            }
            (Some(a), None) => parts.push(format!(
                "its selections agree with {} at {:.2} (the only profile scored)",
                a.profile, a.mean_overlap
            )),
            _ => {}
        }
        parts.join("; ")
    }

    fn lost_layer_count(&self) -> usize {
        let mut l: Vec<usize> = self.lost.iter().map(|l| l.layer).collect();
        l.sort_unstable();
        l.dedup();
        l.len()
    }
}

/// What an engine behaving like `profile` most likely does.
pub fn profile_hint(profile: &str) -> Option<&'static str> {
    Some(match profile {
        "exact" => "it scores at full precision",
        "fp8" => "it behaves like SGLang's default fp8 indexer",
        "bf16" => "its index keys look stored in bf16, not fp8",
        "bf16-qk" => "its indexer looks fully bf16, with no fp8 rounding",
        "sglang-fp4" => "its index keys look stored in SGLang's fp4 format",
        "official-fp4" => "it behaves like the official fp4 reference indexer",
        "vllm-fp8" => "its queries and keys look un-rotated (no Hadamard), as in vLLM before the rotation was added",
        "fp8-no-hadamard-k" => "its index keys look un-rotated while its queries are rotated",
        _ => return None,
    })
}

/// `12`, `12 and 18`, `3, 12 and 18` (ascending, each once).
fn join_layers(layers: impl Iterator<Item = usize>) -> String {
    let mut v: Vec<usize> = layers.collect();
    v.sort_unstable();
    v.dedup();
    let s: Vec<String> = v.iter().map(|l| l.to_string()).collect();
    match s.len() {
        0 => String::new(),
        1 => s[0].clone(),
        n => format!("{} and {}", s[..n - 1].join(", "), s[n - 1]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(layer: usize, profile: &str, overlap: f32, selected: bool) -> ServedLayerRecord {
        ServedLayerRecord {
            cell_id: "c".into(),
            layer,
            query_pos: 99,
            phase: "prompt".into(),
            needle: 0,
            engine_topk: 8,
            visible_rows: 25,
            selected_rows: 8,
            needle_selected: selected,
            profile: profile.into(),
            overlap: Some(overlap),
        }
    }

    #[test]
    fn the_closest_profile_has_the_highest_mean_and_gaps_below_the_threshold_are_inconclusive() {
        let order = ["exact", "fp8", "fp8-no-hadamard-k"];
        let recs = vec![
            rec(1, "exact", 0.5, false),
            rec(1, "fp8", 0.75, false),
            rec(1, "fp8-no-hadamard-k", 1.0, false),
            rec(3, "exact", 0.5, true),
            rec(3, "fp8", 0.75, true),
            rec(3, "fp8-no-hadamard-k", 1.0, true),
        ];
        let v = ServedVerdict::of(&recs, &[], 99, &order, None);
        assert_eq!(v.closest.as_ref().unwrap().profile, "fp8-no-hadamard-k");
        assert_eq!(v.runner_up.as_ref().unwrap().profile, "fp8");
        assert!(!v.inconclusive);
        assert_eq!(v.lost.len(), 1);
        let line = v.conclusion(None, 1);
        assert!(
            line.contains("lost the needle on layer 1 (of 2 non-trivial CSA layers)"),
            "{line}"
        );
        assert!(
            line.contains("fp8-no-hadamard-k (1.00) over fp8 (0.75)"),
            "{line}"
        );
        assert!(line.contains("un-rotated"), "{line}");

        let close = vec![rec(1, "exact", 0.995, true), rec(1, "fp8", 1.0, true)];
        let v = ServedVerdict::of(&close, &[], 99, &order, None);
        assert!(v.inconclusive);
        assert!(v.conclusion(None, 1).contains("inconclusive"));
        // Equal means: the earlier profile of the order.
        let tie = vec![rec(1, "fp8", 1.0, true), rec(1, "exact", 1.0, true)];
        let v = ServedVerdict::of(&tie, &[], 99, &order, None);
        assert_eq!(v.closest.unwrap().profile, "exact");
    }
}
