//! The verdict: everything that says, from records alone, whether a needle was lost, where
//! and why. One module owns it so that the probe's text, its `--json`, the sweep's lines, the
//! summary and report.html say the same thing in the same words:
//!
//! - the lost layers of a run or cell at the answer position and each one's [`LossCause`]
//!   ([`lost_layers`]), the count the `exact` profile keeps ([`exact_keeps`]: cells.csv's
//!   `exact_keeps` column), and the `why:` line ([`why`]);
//! - the layer counts ([`layers_lost`], [`needles_lost`]), the probe's one-sentence
//!   [`diagnosis`] and one-line [`conclusion`];
//! - a cell's verdict in words ([`CellVerdict`]);
//! - the serving engine held against the reference ([`EngineVerdict`]: the closest profile,
//!   where the engine lost a needle, its conclusion).
//!
//! The comparison of causes is exact, not statistical: every scored profile ranks the same keys
//! of the same forward, so a layer the `exact` profile (the un-quantised math) keeps and the
//! driving profile loses was lost to the driving profile's rounding, and a layer `exact` loses
//! too was lost by the un-quantised math itself at this top-k. "Selected" is the definition of
//! docs/architecture.md section 4 (rank <= k, rank = 1 + rows scoring strictly higher; ties are
//! in `rank_ties`). Without `exact` among the scored profiles, a layer another profile keeps, or
//! none keeps, is said as such, and a run scored under no other profile cannot be told apart at
//! all; the text then says to add `--compare exact`. Only the answer position counts: it
//! produces the first answer token.

use super::engine::EngineLayerRecord;
use super::stage::StageVerdict;
use super::{LayerRecord, ProbeRun};
use serde::Serialize;

/// What lost the needle on one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LossCause {
    /// `exact` keeps the needle: the driving profile's rounding lost it (the layers counted
    /// by [`exact_keeps`]; `"rounding"` in `probe --json`, its published name).
    #[serde(rename = "rounding")]
    ExactKeeps,
    /// `exact` (driving or scored) loses it too: at this top-k the un-quantised math itself
    /// misses the needle here (another rounding may still keep it by chance).
    ExactLoses,
    /// `exact` was not scored; another scored profile keeps it.
    KeptByOther,
    /// `exact` was not scored; the other scored profiles lose it too.
    NoProfileKeeps,
    /// Only the driving profile was scored: nothing to tell causes apart.
    Unknown,
    /// No needle row is visible to the query yet (the needle ends in the last few tokens), so
    /// no profile can select it.
    NotVisible,
    /// DeepSeek-V4.1: a reindex layer whose candidate stage dropped every needle block under
    /// the driving profile, and `exact` does not keep it either: no top-k of this layer could
    /// select it (`candidate_miss`).
    CandidateStage,
}

/// A scored profile that selects the needle where the driving one does not.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Keeper {
    pub profile: String,
    pub rank: usize,
}

/// One non-trivial CSA layer whose driving selection missed the needle at the answer position.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LostLayer {
    pub layer: usize,
    /// Which of the run's needles (0 when there is one).
    pub needle: usize,
    /// The driving profile's needle rank (`None`: no needle row visible).
    pub rank: Option<usize>,
    /// The other scored profiles that select the needle at this top-k.
    pub kept_by: Vec<Keeper>,
    /// The `exact` profile's needle rank, when it was scored (driving or compared) and a needle
    /// row is visible.
    pub exact_rank: Option<usize>,
    /// The best rank over every scored profile, the driving one included.
    pub best_rank: Option<usize>,
    pub cause: LossCause,
    /// DeepSeek-V4.1 reindex layers: the driving rank without the candidate mask.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unconstrained_rank: Option<usize>,
}

/// The lost layers of one run at the answer position (`last_prompt_pos`), in layer order.
pub fn lost_layers(run: &ProbeRun, last_prompt_pos: usize) -> Vec<LostLayer> {
    lost_layers_of(&run.layers, last_prompt_pos)
}

/// CSA layers lost to the driving profile's rounding at the answer position, among the
/// records of one run or cell: lost layers (non-trivial, some needle not selected under the
/// driving profile) on which `exact` selects every needle. With one needle these are the
/// layers of cause [`LossCause::ExactKeeps`]; with several a layer counts once, as layers are
/// counted lost once (`csa_layers_selected`), so the count never exceeds the layers lost.
/// `None` when `exact` was not scored there (neither driving nor compared), so rounding cannot
/// be told from the rest.
pub fn exact_keeps<'a>(
    records: impl IntoIterator<Item = &'a LayerRecord>,
    last_prompt_pos: usize,
) -> Option<usize> {
    use std::collections::BTreeMap;
    let exact = crate::numerics::profiles::IndexProfile::Exact.name();
    let here: Vec<&LayerRecord> = records
        .into_iter()
        .filter(|r| r.query_pos == last_prompt_pos)
        .collect();
    if !here.iter().any(|r| r.profile == exact) {
        return None;
    }
    // Per layer: lost under the driving profile; every needle selected by exact.
    let mut lost: BTreeMap<usize, bool> = BTreeMap::new();
    let mut exact_keeps: BTreeMap<usize, bool> = BTreeMap::new();
    for r in &here {
        if r.driving && !r.trivial {
            *lost.entry(r.layer).or_default() |= !r.selected;
        }
        if r.profile == exact {
            *exact_keeps.entry(r.layer).or_insert(true) &= r.selected;
        }
    }
    Some(
        lost.iter()
            .filter(|&(layer, &lost)| lost && exact_keeps.get(layer) == Some(&true))
            .count(),
    )
}

/// Per cell id, the CSA layers lost to the driving profile's rounding at the answer position
/// ([`exact_keeps`]); cells where `exact` was not scored are absent.
pub type ExactKeepsByCell = std::collections::HashMap<String, usize>;

/// [`ExactKeepsByCell`] of `cells`: their `exact_keeps` column (set by the store from the
/// cell's layers.csv rows, and checked against them when a directory is read).
pub fn exact_keeps_by_cell(cells: &[super::CellRecord]) -> ExactKeepsByCell {
    cells
        .iter()
        .filter_map(|c| Some((c.cell_id.clone(), c.exact_keeps?)))
        .collect()
}

/// [`lost_layers`] over any records (those at other positions are skipped).
pub fn lost_layers_of<'a>(
    records: impl IntoIterator<Item = &'a LayerRecord>,
    last_prompt_pos: usize,
) -> Vec<LostLayer> {
    let here: Vec<&LayerRecord> = records
        .into_iter()
        .filter(|r| r.query_pos == last_prompt_pos)
        .collect();
    let exact = crate::numerics::profiles::IndexProfile::Exact.name();
    let mut lost: Vec<LostLayer> = here
        .iter()
        .filter(|r| r.driving && !r.trivial && !r.selected)
        .map(|driving| {
            let others: Vec<&&LayerRecord> = here
                .iter()
                .filter(|r| !r.driving && r.layer == driving.layer && r.needle == driving.needle)
                .collect();
            let kept_by: Vec<Keeper> = others
                .iter()
                .filter(|r| r.selected)
                .filter_map(|r| {
                    Some(Keeper {
                        profile: r.profile.clone(),
                        rank: r.needle_rank?,
                    })
                })
                .collect();
            let exact_rank = if driving.profile == exact {
                Some(driving.needle_rank)
            } else {
                others
                    .iter()
                    .find(|r| r.profile == exact)
                    .map(|r| r.needle_rank)
            };
            let cause = match exact_rank {
                _ if driving.needle_rows == 0 => LossCause::NotVisible,
                _ if kept_by.iter().any(|k| k.profile == exact) => LossCause::ExactKeeps,
                _ if driving.stage_verdict == Some(StageVerdict::CandidateMiss) => {
                    LossCause::CandidateStage
                }
                Some(_) => LossCause::ExactLoses,
                None if !kept_by.is_empty() => LossCause::KeptByOther,
                None if !others.is_empty() => LossCause::NoProfileKeeps,
                None => LossCause::Unknown,
            };
            let best_rank = std::iter::once(driving.needle_rank)
                .chain(others.iter().map(|r| r.needle_rank))
                .flatten()
                .min();
            LostLayer {
                layer: driving.layer,
                needle: driving.needle,
                rank: driving.needle_rank,
                kept_by,
                exact_rank: exact_rank.flatten(),
                best_rank,
                cause,
                unconstrained_rank: driving.unconstrained_rank,
            }
        })
        .collect();
    lost.sort_by_key(|l| (l.layer, l.needle));
    lost
}

/// One line saying why, e.g. `fp8 rounding lost layer 3 (exact keeps it: rank 16 vs 114);
/// the exact math loses layer 1 too (exact rank 80 > 64; fp8 rank 353): the top-k is too small
/// there`; `None` when nothing was lost and no selected needle ties rows across the cut-off
/// ([`tied_at_cutoff`]). Ranks are those of these hidden states: a larger top-k
/// changes what earlier layers attend to, so later layers' ranks would move too.
pub fn why(run: &ProbeRun, last_prompt_pos: usize) -> Option<String> {
    why_of(&run.layers, &run.index, run.topk, last_prompt_pos)
}

/// [`why`] from the layer records of one run or cell (layers.csv rows of one `cell_id`), its
/// driving profile `index` and top-k: what the report directory's `report.html` says per cell.
pub fn why_of(
    layers: &[LayerRecord],
    index: &str,
    topk: usize,
    last_prompt_pos: usize,
) -> Option<String> {
    let lost = lost_layers_of(layers, last_prompt_pos);
    let tied = tied_at_cutoff_of(layers, topk, last_prompt_pos);
    if lost.is_empty() && tied.is_empty() {
        return None;
    }
    let of = |cause: LossCause| -> Vec<&LostLayer> {
        lost.iter().filter(|l| l.cause == cause).collect()
    };
    // With several needles each lost layer names its needle: `layer 3 (needle 1)`.
    let several = layers.iter().any(|r| r.needle > 0);
    let name = |layer: usize, needle: usize| match several {
        true => format!("{layer} (needle {needle})"),
        false => layer.to_string(),
    };
    let layers = |ls: &[&LostLayer]| {
        let names: Vec<String> = ls.iter().map(|l| name(l.layer, l.needle)).collect();
        let noun = if ls.len() == 1 { "layer" } else { "layers" };
        format!("{noun} {}", names.join(", "))
    };
    let ranks = |ls: &[&LostLayer], f: &dyn Fn(&LostLayer) -> Option<usize>| {
        ls.iter()
            .map(|l| f(l).map_or("-".to_string(), |r| r.to_string()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let them = |ls: &[&LostLayer]| if ls.len() == 1 { "it" } else { "them" };
    let mut parts = Vec::new();
    let kept_by_exact = of(LossCause::ExactKeeps);
    if !kept_by_exact.is_empty() {
        parts.push(format!(
            "{} rounding lost {} (exact keeps {}: rank {} vs {})",
            index,
            layers(&kept_by_exact),
            them(&kept_by_exact),
            ranks(&kept_by_exact, &|l| l.exact_rank),
            ranks(&kept_by_exact, &|l| l.rank)
        ));
    }
    let exact_loses = of(LossCause::ExactLoses);
    if !exact_loses.is_empty() {
        let exact = crate::numerics::profiles::IndexProfile::Exact.name();
        let driving = if index == exact {
            String::new()
        } else {
            format!("; {} rank {}", index, ranks(&exact_loses, &|l| l.rank))
        };
        parts.push(format!(
            "the exact math loses {}{} (exact rank {} > {}{driving}): the top-k is too small there",
            layers(&exact_loses),
            if index == exact { "" } else { " too" },
            ranks(&exact_loses, &|l| l.exact_rank),
            topk,
        ));
    }
    let other = of(LossCause::KeptByOther);
    if !other.is_empty() {
        let keepers: Vec<String> = other
            .iter()
            .map(|l| {
                let k = &l.kept_by[0];
                format!("{} rank {}", k.profile, k.rank)
            })
            .collect();
        parts.push(format!(
            "{} kept by another profile ({}), lost under {} (rank {})",
            layers(&other),
            keepers.join(", "),
            index,
            ranks(&other, &|l| l.rank)
        ));
    }
    let none = of(LossCause::NoProfileKeeps);
    if !none.is_empty() {
        parts.push(format!(
            "{} lost under every scored profile (best rank {})",
            layers(&none),
            ranks(&none, &|l| l.best_rank)
        ));
    }
    let unknown = of(LossCause::Unknown);
    if !unknown.is_empty() {
        parts.push(format!(
            "{} lost under {} (rank {})",
            layers(&unknown),
            index,
            ranks(&unknown, &|l| l.rank)
        ));
    }
    let hidden = of(LossCause::NotVisible);
    if !hidden.is_empty() {
        parts.push(format!(
            "{} cannot select the needle: none of its rows is visible to the query yet",
            layers(&hidden)
        ));
    }
    let dropped = of(LossCause::CandidateStage);
    if !dropped.is_empty() {
        parts.push(format!(
            "{} cannot select the needle: the candidate stage dropped every block holding it \
             (rank without the mask {})",
            layers(&dropped),
            ranks(&dropped, &|l| l.unconstrained_rank)
        ));
    }
    let unexplained = [
        LossCause::KeptByOther,
        LossCause::NoProfileKeeps,
        LossCause::Unknown,
    ];
    if lost.iter().any(|l| unexplained.contains(&l.cause)) {
        parts.push("add --compare exact to tell rounding from a too-small top-k".to_string());
    }
    for r in tied {
        let rank = r.needle_rank.unwrap_or_default();
        let needle = match r.needle_ties {
            0 => String::new(),
            1 => "; 1 of them another needle row".to_string(),
            n => format!("; {n} of them other needle rows"),
        };
        parts.push(format!(
            "layer {} counts as selected (rank {rank} <= {}), but its needle score ties {} other \
             rows (ranks {rank}-{}{needle}), so whether an engine keeps it may depend on its tie \
             order",
            name(r.layer, r.needle),
            topk,
            r.rank_ties,
            rank + r.rank_ties
        ));
    }
    Some(parts.join("; "))
}

/// Non-trivial CSA layers at the answer position whose driving needle counts as selected
/// (rank <= k) while an engine's tie order could still drop every needle row: the rank of docs/architecture.md section 4
/// does not depend on tie order, an engine's top-k does. The tie group fills places
/// `rank..=rank + rank_ties`; tied needle rows (`needle_ties`) keep the needle whatever the
/// order, so only the group's other rows can push it out: they must be able to fill all
/// `k - rank + 1` places left to the group ([`crate::probe::rank::NeedleRank::ties_straddle`],
/// the observer's own rule). Common under the fp4 profiles, whose scores take few distinct
/// values.
pub fn tied_at_cutoff(run: &ProbeRun, last_prompt_pos: usize) -> Vec<&LayerRecord> {
    tied_at_cutoff_of(&run.layers, run.topk, last_prompt_pos)
}

/// [`tied_at_cutoff`] over the layer records of one run or cell at top-k `topk`.
pub fn tied_at_cutoff_of(
    layers: &[LayerRecord],
    topk: usize,
    last_prompt_pos: usize,
) -> Vec<&LayerRecord> {
    layers
        .iter()
        .filter(|r| r.driving && r.query_pos == last_prompt_pos && !r.trivial && r.selected)
        .filter(|r| {
            let others = r.rank_ties.saturating_sub(r.needle_ties);
            r.needle_rank.is_some_and(|rank| rank + others > topk)
        })
        .collect()
}

/// Driving-profile records of the answer position (the last prompt token) among one run's
/// or cell's layer records.
pub fn answer_position_records(
    layers: &[LayerRecord],
    last_prompt_pos: usize,
) -> Vec<&LayerRecord> {
    layers
        .iter()
        .filter(|r| r.driving && r.query_pos == last_prompt_pos)
        .collect()
}

/// CSA layers at the answer position under the driving profile: (non-trivial layers that lost
/// a needle (any of them), non-trivial layers, all CSA layers).
pub fn layers_lost(run: &ProbeRun, last_prompt_pos: usize) -> (usize, usize, usize) {
    use std::collections::BTreeSet;
    let recs = answer_position_records(&run.layers, last_prompt_pos);
    let layers = |keep: &dyn Fn(&LayerRecord) -> bool| {
        recs.iter()
            .filter(|r| keep(r))
            .map(|r| r.layer)
            .collect::<BTreeSet<_>>()
            .len()
    };
    (
        layers(&|r| !r.trivial && !r.selected),
        layers(&|r| !r.trivial),
        layers(&|_| true),
    )
}

/// With several needles: for each, the non-trivial CSA layers that lost it at the answer
/// position under the driving profile, e.g. `needle 0 "cwd is /srv/a" lost on layers 3, 7;
/// needle 1 "..." kept`; `None` with one needle.
pub fn needles_lost(run: &ProbeRun, last_prompt_pos: usize, needles: &[String]) -> Option<String> {
    if needles.len() < 2 {
        return None;
    }
    let recs = answer_position_records(&run.layers, last_prompt_pos);
    let parts: Vec<String> = needles
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let lost: Vec<String> = recs
                .iter()
                .filter(|r| r.needle == i && !r.trivial && !r.selected)
                .map(|r| r.layer.to_string())
                .collect();
            let shown: String = if text.chars().count() > 48 {
                format!("{}...", text.chars().take(45).collect::<String>())
            } else {
                text.clone()
            };
            match lost.len() {
                0 => format!("needle {i} {shown:?} kept"),
                1 => format!("needle {i} {shown:?} lost on layer {}", lost[0]),
                _ => format!("needle {i} {shown:?} lost on layers {}", lost.join(", ")),
            }
        })
        .collect();
    Some(parts.join(", "))
}

/// What the ranked layers of a run or directory are called in text: DeepSeek-V4's CSA layers,
/// or DeepSeek-V4.1's index layers (the index sources; their records carry a stage). Records
/// carry no family, so the word is read off them: V4 records never have a stage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LayerWord {
    #[default]
    Csa,
    Index,
}

impl LayerWord {
    /// The word for these layer records.
    pub fn of(layers: &[LayerRecord]) -> Self {
        match layers.iter().any(|r| r.stage.is_some()) {
            true => LayerWord::Index,
            false => LayerWord::Csa,
        }
    }

    /// `CSA` or `index`, as in "worst CSA rank" / "worst index rank".
    pub fn short(self) -> &'static str {
        match self {
            LayerWord::Csa => "CSA",
            LayerWord::Index => "index",
        }
    }

    /// `CSA layer` or `index layer`.
    pub fn noun(self) -> &'static str {
        match self {
            LayerWord::Csa => "CSA layer",
            LayerWord::Index => "index layer",
        }
    }
}

impl std::fmt::Display for LayerWord {
    /// [`Self::short`].
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.short())
    }
}

/// What a run's ranked layers are called ([`LayerWord::noun`]).
pub fn layer_word(run: &ProbeRun) -> &'static str {
    LayerWord::of(&run.layers).noun()
}

/// DeepSeek-V4.1: which stage of the two-level selection lost the needle at the answer
/// position (driving profile), e.g. `the candidate source (layer 20) drops the needle's blocks
/// (best block rank 3100), so reindex layers 24, 28 cannot select it (candidate_miss)`; `None`
/// when no reindex layer lost it.
pub fn stage_clause(run: &ProbeRun, last_prompt_pos: usize) -> Option<String> {
    use super::stage::{LayerStage, StageVerdict};
    let recs = answer_position_records(&run.layers, last_prompt_pos);
    let lost_with = |verdict: StageVerdict| -> Vec<usize> {
        let mut layers: Vec<usize> = recs
            .iter()
            .filter(|r| !r.trivial && !r.selected && r.stage_verdict == Some(verdict))
            .map(|r| r.layer)
            .collect();
        layers.dedup();
        layers
    };
    let (dropped, below) = (
        lost_with(StageVerdict::CandidateMiss),
        lost_with(StageVerdict::TopkMiss),
    );
    if dropped.is_empty() && below.is_empty() {
        return None;
    }
    let source = recs
        .iter()
        .filter(|r| r.stage == Some(LayerStage::CandidateSource))
        .min_by_key(|r| r.block_rank.unwrap_or(usize::MAX));
    let list = |l: &[usize]| join_layers(l.iter().copied());
    let mut parts = Vec::new();
    if !dropped.is_empty() {
        let at = match source {
            Some(s) => format!(
                "the candidate source (layer {}) drops the needle's blocks (best block rank {})",
                s.layer,
                s.block_rank.map_or("-".into(), |r| r.to_string())
            ),
            None => "the candidate stage drops every needle block".into(),
        };
        parts.push(format!(
            "{at}, so reindex {} cannot select it (candidate_miss)",
            plural("layer", &dropped, &list(&dropped))
        ));
    }
    if !below.is_empty() {
        let (keep, rank) = match below.len() {
            1 => ("keeps", "ranks"),
            _ => ("keep", "rank"),
        };
        parts.push(format!(
            "reindex {} {keep} its block but {rank} it below top-{} inside the candidates \
             (topk_miss)",
            plural("layer", &below, &list(&below)),
            run.topk
        ));
    }
    Some(parts.join("; "))
}

/// `layer 3` or `layers 3, 7`.
fn plural(word: &str, items: &[usize], list: &str) -> String {
    match items.len() {
        1 => format!("{word} {list}"),
        _ => format!("{word}s {list}"),
    }
}

/// The one-sentence diagnosis a probe's text starts with: for each run, which layers its
/// profile and top-k lose the needle on and why, told apart by the exact math scored on the
/// same hidden states (kept by exact: the profile's rounding; lost by exact too: the top-k is
/// too small there), or that it keeps the needle everywhere; e.g. `fp8 at top-64 loses the
/// needle on layers 1, 3 (2 of 2 non-trivial CSA layers): the exact math keeps layer 3 (fp8
/// rounding) and loses layer 1 too (top-64 is too small there); bf16 at top-64 keeps it on
/// both non-trivial CSA layers`.
pub fn diagnosis(runs: &[ProbeRun], last_prompt_pos: usize) -> String {
    let layer_list = |layers: &[usize]| {
        let mut layers = layers.to_vec();
        layers.dedup();
        let names: Vec<String> = layers.iter().map(|l| l.to_string()).collect();
        match names.len() {
            1 => format!("layer {}", names[0]),
            _ => format!("layers {}", names.join(", ")),
        }
    };
    let parts: Vec<String> = runs
        .iter()
        .map(|run| {
            let (lost, nontrivial, total) = layers_lost(run, last_prompt_pos);
            let who = format!("{} at top-{}", run.index, run.topk);
            let word = layer_word(run);
            if nontrivial == 0 {
                return format!(
                    "{who} cannot lose the needle: every {word} keeps every visible row \
                     (n_t <= k on all {total})"
                );
            }
            if lost == 0 {
                let all = match nontrivial {
                    1 => format!("the only non-trivial {word}"),
                    2 => format!("both non-trivial {word}s"),
                    n => format!("all {n} non-trivial {word}s"),
                };
                return format!("{who} keeps the needle on {all}");
            }
            let layers = lost_layers(run, last_prompt_pos);
            let of = |cause: LossCause| -> Vec<usize> {
                layers
                    .iter()
                    .filter(|l| l.cause == cause)
                    .map(|l| l.layer)
                    .collect()
            };
            let all: Vec<usize> = layers.iter().map(|l| l.layer).collect();
            let mut causes = Vec::new();
            let kept_by_exact = of(LossCause::ExactKeeps);
            if !kept_by_exact.is_empty() {
                causes.push(format!(
                    "the exact math keeps {} ({} rounding)",
                    layer_list(&kept_by_exact),
                    run.index
                ));
            }
            let exact_loses = of(LossCause::ExactLoses);
            if !exact_loses.is_empty() {
                let too = if run.index == crate::numerics::profiles::IndexProfile::Exact.name() {
                    ""
                } else {
                    " too"
                };
                let verb = if kept_by_exact.is_empty() {
                    "the exact math loses"
                } else {
                    "loses"
                };
                causes.push(format!(
                    "{verb} {}{too} (top-{} is too small there)",
                    layer_list(&exact_loses),
                    run.topk
                ));
            }
            let hidden = of(LossCause::NotVisible);
            if !hidden.is_empty() {
                causes.push(format!(
                    "{} cannot see a needle row yet",
                    layer_list(&hidden)
                ));
            }
            let unexplained: Vec<usize> = layers
                .iter()
                .filter(|l| {
                    matches!(
                        l.cause,
                        LossCause::KeptByOther | LossCause::NoProfileKeeps | LossCause::Unknown
                    )
                })
                .map(|l| l.layer)
                .collect();
            if !unexplained.is_empty() {
                causes.push(format!(
                    "{} cannot be told apart without the exact profile",
                    layer_list(&unexplained)
                ));
            }
            let stages = stage_clause(run, last_prompt_pos)
                .map_or(String::new(), |s| format!("; stages: {s}"));
            format!(
                "{who} loses the needle on {} ({lost} of {nontrivial} non-trivial {word}s): {}{stages}",
                layer_list(&all),
                causes.join(" and ")
            )
        })
        .collect();
    parts.join("; ")
}

/// The one-line conclusion, e.g. "needle lost on 7/21 CSA layers under fp8 at top-512; all
/// kept with bf16 at top-512".
/// `judge_answers` is false for a model whose LM path is not built to answer (the planted demo
/// model): then the verdict part is left out.
///
/// With several needles (`needles`, their texts), "the needle lost on n layers" counts the
/// layers that lost any of them, and each needle's own layers follow in brackets.
pub fn conclusion(
    runs: &[ProbeRun],
    last_prompt_pos: usize,
    judge_answers: bool,
    needles: &[String],
) -> String {
    let mut parts = Vec::new();
    for run in runs {
        let each = needles_lost(run, last_prompt_pos, needles)
            .map_or(String::new(), |e| format!(" [{e}]"));
        let (lost, nontrivial, total) = layers_lost(run, last_prompt_pos);
        let word = layer_word(run);
        let verdict = match run.answer_correct {
            Some(true) => "answer correct",
            Some(false) => "answer wrong",
            None => "no verdict: the generation stopped before its answer ended",
        };
        let all = |n: usize, what: &str| match n {
            1 => format!("the only {what}"),
            n => format!("all {n} {what}s"),
        };
        let what = if nontrivial == 0 {
            format!(
                "needle trivially kept on {} (every visible row selected) under {} at top-{}",
                all(total, word),
                run.index,
                run.topk
            )
        } else if lost == 0 {
            format!(
                "{} kept on {} under {} at top-{}",
                if needles.len() > 1 {
                    "every needle"
                } else {
                    "needle"
                },
                all(nontrivial, &format!("non-trivial {word}")),
                run.index,
                run.topk
            )
        } else {
            // With exact scored, how many of those the exact math keeps (lost to rounding);
            // not said when exact is itself the driving profile.
            let kept = exact_keeps(&run.layers, last_prompt_pos)
                .filter(|_| run.index != "exact")
                .map_or(String::new(), |n| format!(" (exact keeps {n})"));
            let noun = if needles.len() > 1 {
                "a needle"
            } else {
                "needle"
            };
            format!(
                "{noun} lost on {lost}/{total} {word}s under {} at top-{}{kept}",
                run.index, run.topk
            )
        };
        let what = format!("{what}{each}");
        if judge_answers {
            parts.push(format!("{what} ({verdict})"));
        } else {
            parts.push(what);
        }
    }
    parts.join("; ")
}

/// A cell's verdict in words, the one place the sweep lines, the engine-only tables and the
/// probe's engine section say it: the answer's verdict where it is judged, else the selection
/// (`by`: whose selection, the reference's indexer or the serving engine's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CellVerdict {
    Correct,
    Wrong,
    /// No answer verdict and every CSA layer trivial (n_t <= k): no evidence either way.
    Trivial,
    /// No answer verdict; the needle selected on every non-trivial CSA layer.
    Recalled,
    /// No answer verdict; the needle lost on some non-trivial CSA layer.
    Lost,
}

impl CellVerdict {
    /// From the answer verdict and the (selected, non-trivial) CSA layer counts.
    pub fn of(answer_correct: Option<bool>, selected: usize, nontrivial: usize) -> CellVerdict {
        match answer_correct {
            Some(true) => CellVerdict::Correct,
            Some(false) => CellVerdict::Wrong,
            None if nontrivial == 0 => CellVerdict::Trivial,
            None if selected >= nontrivial => CellVerdict::Recalled,
            None => CellVerdict::Lost,
        }
    }

    /// The word of a table or line: `correct`, `WRONG`, `trivial`, `recalled`, `LOST`.
    pub fn word(self) -> &'static str {
        match self {
            CellVerdict::Correct => "correct",
            CellVerdict::Wrong => "WRONG",
            CellVerdict::Trivial => "trivial",
            CellVerdict::Recalled => "recalled",
            CellVerdict::Lost => "LOST",
        }
    }

    /// The word with whose selection judged (`recalled (indexer)`, `LOST (engine)`,
    /// `trivial (n_t <= k)`), as a sweep's line says it.
    pub fn line(self, by: &str, k: &str) -> String {
        match self {
            CellVerdict::Correct | CellVerdict::Wrong => self.word().to_string(),
            CellVerdict::Trivial => format!("trivial (n_t <= {k})"),
            CellVerdict::Recalled | CellVerdict::Lost => format!("{} ({by})", self.word()),
        }
    }
}

/// The closest profile of an engine is the one with the highest mean overlap over the answer
/// position's non-trivial CSA layers (on a trivial layer, n_t <= K, every profile selects every
/// row); ties go to the earlier profile of `IndexProfile::ALL`. It is called inconclusive when
/// the runner-up's mean is within [`INCONCLUSIVE_GAP`] of it.
/// Two profiles whose mean overlaps differ by less than this are not told apart (a
/// difference of one row in a hundred: rounding profiles that move only rows near the
/// cut-off).
pub const INCONCLUSIVE_GAP: f32 = 0.01;

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
pub struct EngineVerdict {
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

impl EngineVerdict {
    /// From one run's engine records and (with a local model) its layer records, at the answer
    /// position `answer_pos`. `profile_order` orders profiles for ties (`IndexProfile::ALL`);
    /// `driving` is the reference's driving profile.
    pub fn of(
        engine_records: &[EngineLayerRecord],
        layers: &[LayerRecord],
        answer_pos: usize,
        profile_order: &[&str],
        driving: Option<&str>,
    ) -> EngineVerdict {
        let here: Vec<&EngineLayerRecord> = engine_records
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
        EngineVerdict {
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
    //! Tests of `why.rs`: the why line, lost layers and the tie note on hand-made records.

    use super::*;

    /// A record at the answer position 99 of layer `layer` under `profile`, top-k 10.
    fn rec(layer: usize, profile: &str, driving: bool, rank: Option<usize>) -> LayerRecord {
        LayerRecord {
            cell_id: "c".into(),
            layer,
            query_pos: 99,
            phase: "prompt".into(),
            profile: profile.into(),
            driving,
            needle: 0,
            visible_rows: 25,
            needle_rows: 2,
            needle_rank: rank,
            rank_ties: 0,
            needle_ties: 0,
            needle_score: None,
            kth_score: None,
            margin: None,
            selected: rank.is_some_and(|r| r <= 10),
            trivial: false,
            ..Default::default()
        }
    }

    fn run(index: &str, layers: Vec<LayerRecord>) -> ProbeRun {
        ProbeRun {
            cell_id: "c".into(),
            index: index.into(),
            kv: "fp8".into(),
            topk: 10,
            answer_text: String::new(),
            answer_correct: Some(false),
            generated_ids: vec![],
            layers,
            attention: vec![],
            engine_records: vec![],
            selection_disagreements: 0,
            selection_checks: 0,
            wall_seconds: 0.0,
        }
    }

    fn causes(r: &ProbeRun) -> Vec<(usize, LossCause)> {
        lost_layers(r, 99)
            .iter()
            .map(|l| (l.layer, l.cause))
            .collect()
    }

    #[test]
    fn exact_tells_rounding_from_a_small_topk() {
        let r = run(
            "fp8",
            vec![
                rec(2, "fp8", true, Some(40)),
                rec(2, "exact", false, Some(3)),
                rec(2, "bf16", false, Some(5)),
                rec(4, "fp8", true, Some(70)),
                rec(4, "exact", false, Some(30)),
                rec(4, "bf16", false, Some(8)),
                rec(6, "fp8", true, Some(2)),
                rec(6, "exact", false, Some(50)),
                // Another position: never counted.
                LayerRecord {
                    query_pos: 98,
                    ..rec(8, "fp8", true, Some(90))
                },
            ],
        );
        assert_eq!(
            causes(&r),
            [(2, LossCause::ExactKeeps), (4, LossCause::ExactLoses)]
        );
        let lost = lost_layers(&r, 99);
        assert_eq!(lost[0].exact_rank, Some(3));
        assert_eq!(lost[0].best_rank, Some(3));
        assert_eq!(lost[1].best_rank, Some(8));
        assert_eq!(
            lost[1].kept_by,
            [Keeper {
                profile: "bf16".into(),
                rank: 8
            }]
        );
        let text = why(&r, 99).unwrap();
        assert_eq!(
            text,
            "fp8 rounding lost layer 2 (exact keeps it: rank 3 vs 40); the exact math loses \
         layer 4 too (exact rank 30 > 10; fp8 rank 70): the top-k is too small there"
        );
    }

    #[test]
    fn exact_keeps_count_only_where_exact_was_scored() {
        let scored = [
            rec(2, "fp8", true, Some(40)),
            rec(2, "exact", false, Some(3)),
            rec(4, "fp8", true, Some(70)),
            rec(4, "exact", false, Some(30)),
            rec(6, "fp8", true, Some(50)),
            rec(6, "exact", false, Some(10)),
        ];
        assert_eq!(exact_keeps(&scored, 99), Some(2));
        assert_eq!(exact_keeps(&scored, 98), None, "nothing at that position");
        let kept = [
            rec(2, "fp8", true, Some(4)),
            rec(2, "exact", false, Some(3)),
        ];
        assert_eq!(exact_keeps(&kept, 99), Some(0));
        let unscored = [
            rec(2, "fp8", true, Some(40)),
            rec(2, "bf16", false, Some(3)),
        ];
        assert_eq!(exact_keeps(&unscored, 99), None);
        let driving_exact = [rec(2, "exact", true, Some(40))];
        assert_eq!(exact_keeps(&driving_exact, 99), Some(0));
        // Several needles: a layer counts once, and only when exact selects every needle.
        let needle = |mut r: LayerRecord, n: usize| {
            r.needle = n;
            r
        };
        let several = [
            rec(2, "fp8", true, Some(40)),
            needle(rec(2, "fp8", true, Some(50)), 1),
            rec(2, "exact", false, Some(3)),
            needle(rec(2, "exact", false, Some(5)), 1),
            rec(4, "fp8", true, Some(70)),
            needle(rec(4, "fp8", true, Some(2)), 1),
            rec(4, "exact", false, Some(3)),
            needle(rec(4, "exact", false, Some(30)), 1),
        ];
        assert_eq!(exact_keeps(&several, 99), Some(1));
    }

    #[test]
    fn without_exact_the_text_asks_for_it() {
        let r = run(
            "fp8",
            vec![
                rec(2, "fp8", true, Some(40)),
                rec(2, "bf16", false, Some(5)),
                rec(4, "fp8", true, Some(70)),
                rec(4, "bf16", false, Some(30)),
            ],
        );
        assert_eq!(
            causes(&r),
            [(2, LossCause::KeptByOther), (4, LossCause::NoProfileKeeps)]
        );
        let text = why(&r, 99).unwrap();
        assert!(
            text.contains("layer 2 kept by another profile (bf16 rank 5)"),
            "{text}"
        );
        assert!(text.contains("layer 4 lost under every scored profile (best rank 30)"));
        assert!(text.ends_with("add --compare exact to tell rounding from a too-small top-k"));
        let hidden = LayerRecord {
            needle_rows: 0,
            ..rec(6, "fp8", true, None)
        };
        let not_yet = run("fp8", vec![hidden, rec(6, "exact", false, None)]);
        assert_eq!(causes(&not_yet), [(6, LossCause::NotVisible)]);
        assert_eq!(
            why(&not_yet, 99).unwrap(),
            "layer 6 cannot select the needle: none of its rows is visible to the query yet"
        );
        let alone = run(
            "fp8",
            vec![rec(2, "fp8", true, Some(40)), rec(4, "fp8", true, None)],
        );
        assert_eq!(
            causes(&alone),
            [(2, LossCause::Unknown), (4, LossCause::Unknown)]
        );
        assert_eq!(
            why(&alone, 99).unwrap(),
            "layers 2, 4 lost under fp8 (rank 40, -); add --compare exact to tell rounding \
         from a too-small top-k"
        );
    }

    #[test]
    fn a_driving_exact_loss_is_the_math_itself_and_nothing_lost_says_nothing() {
        let r = run(
            "exact",
            vec![
                rec(2, "exact", true, Some(12)),
                rec(2, "fp8", false, Some(9)),
            ],
        );
        assert_eq!(causes(&r), [(2, LossCause::ExactLoses)]);
        assert_eq!(
            why(&r, 99).unwrap(),
            "the exact math loses layer 2 (exact rank 12 > 10): the top-k is too small there"
        );
        let tie = LayerRecord {
            rank_ties: 3,
            ..rec(4, "official-fp4", true, Some(9))
        };
        let tied = run("official-fp4", vec![tie]);
        assert!(lost_layers(&tied, 99).is_empty());
        assert_eq!(
            why(&tied, 99).unwrap(),
            "layer 4 counts as selected (rank 9 <= 10), but its needle score ties 3 other rows \
         (ranks 9-12), so whether an engine keeps it may depend on its tie order"
        );
        let clear = LayerRecord {
            rank_ties: 1,
            ..rec(4, "official-fp4", true, Some(9))
        };
        assert!(
            why(&run("official-fp4", vec![clear]), 99).is_none(),
            "ranks 9-10 fit in 10"
        );
        // Tied rows that are all needle rows keep the needle in any tie order: no note. With
        // some tied rows not needle rows, only those can push it out.
        let all_needle = LayerRecord {
            rank_ties: 3,
            needle_ties: 3,
            ..rec(4, "official-fp4", true, Some(9))
        };
        assert!(
            why(&run("official-fp4", vec![all_needle]), 99).is_none(),
            "ranks 9-12 are all needle rows: one of them is kept"
        );
        let one_other = LayerRecord {
            rank_ties: 3,
            needle_ties: 2,
            ..rec(4, "official-fp4", true, Some(9))
        };
        assert!(
            why(&run("official-fp4", vec![one_other]), 99).is_none(),
            "one non-needle row cannot fill places 9 and 10"
        );
        let two_others = LayerRecord {
            rank_ties: 3,
            needle_ties: 1,
            ..rec(4, "official-fp4", true, Some(9))
        };
        assert_eq!(
            why(&run("official-fp4", vec![two_others]), 99).unwrap(),
            "layer 4 counts as selected (rank 9 <= 10), but its needle score ties 3 other rows \
         (ranks 9-12; 1 of them another needle row), so whether an engine keeps it may \
         depend on its tie order"
        );
        let kept = run("fp8", vec![rec(2, "fp8", true, Some(4))]);
        assert!(lost_layers(&kept, 99).is_empty() && why(&kept, 99).is_none());
        let trivial = run(
            "fp8",
            vec![LayerRecord {
                trivial: true,
                ..rec(2, "fp8", true, Some(40))
            }],
        );
        assert!(
            why(&trivial, 99).is_none(),
            "a trivial layer is never a loss"
        );
    }

    /// The records the observer writes carry the needle rows' share of the ties, so the tie
    /// note is exact on a live run: rows 4..7 are the needle, rows 4, 5 and 6 and row 1 share
    /// the best score.
    #[test]
    fn records_carry_the_needle_rows_among_the_ties() {
        use crate::probe::rank::{kth_scores, rank_needle, RecordMeta};
        let scores = [0.9, 0.5, 0.8, 0.1, 0.5, 0.5, 0.5, 0.2];
        let rank = rank_needle(&scores, 4..7);
        let meta = RecordMeta {
            cell_id: "c",
            layer: 4,
            query_pos: 99,
            phase: "prompt",
            profile: "official-fp4",
            driving: true,
            needle: 0,
        };
        let k = 4;
        let r = LayerRecord::new(&meta, &rank, kth_scores(&scores, &[k])[0], k);
        assert_eq!((r.needle_rank, r.rank_ties, r.needle_ties), (Some(3), 3, 2));
        let four = ProbeRun {
            topk: k,
            ..run("official-fp4", vec![r])
        };
        // Places 3 and 4 for a group of rows 1, 4, 5, 6: row 1 alone cannot fill both.
        assert!(why(&four, 99).is_none(), "{:?}", why(&four, 99));
        let three = ProbeRun {
            topk: 3,
            ..run(
                "official-fp4",
                vec![LayerRecord::new(&meta, &rank, None, 3)],
            )
        };
        // Place 3 alone: row 1 may take it.
        assert!(why(&three, 99)
            .unwrap()
            .contains("2 of them other needle rows"));
    }

    fn engine_rec(layer: usize, profile: &str, overlap: f32, selected: bool) -> EngineLayerRecord {
        EngineLayerRecord {
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
            engine_rec(1, "exact", 0.5, false),
            engine_rec(1, "fp8", 0.75, false),
            engine_rec(1, "fp8-no-hadamard-k", 1.0, false),
            engine_rec(3, "exact", 0.5, true),
            engine_rec(3, "fp8", 0.75, true),
            engine_rec(3, "fp8-no-hadamard-k", 1.0, true),
        ];
        let v = EngineVerdict::of(&recs, &[], 99, &order, None);
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

        let close = vec![
            engine_rec(1, "exact", 0.995, true),
            engine_rec(1, "fp8", 1.0, true),
        ];
        let v = EngineVerdict::of(&close, &[], 99, &order, None);
        assert!(v.inconclusive);
        assert!(v.conclusion(None, 1).contains("inconclusive"));
        // Equal means: the earlier profile of the order.
        let tie = vec![
            engine_rec(1, "fp8", 1.0, true),
            engine_rec(1, "exact", 1.0, true),
        ];
        let v = EngineVerdict::of(&tie, &[], 99, &order, None);
        assert_eq!(v.closest.unwrap().profile, "exact");
    }
}
