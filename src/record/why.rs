//! Why the needle was lost: each CSA layer that lost it at the answer position, told apart by
//! the other profiles scored on the same hidden states (`--compare`, and the other `--index`
//! profiles).
//!
//! The comparison is exact, not statistical: every scored profile ranks the same keys of the
//! same forward, so a layer the `exact` profile (the un-quantised math) keeps and the driving
//! profile loses was lost to the driving profile's rounding, and a layer `exact` loses too was
//! lost by the un-quantised math itself at this top-k. "Selected" is the definition of docs/architecture.md section 4
//! (rank <= k, rank = 1 + rows scoring strictly higher; ties are in `rank_ties`). Without
//! `exact` among the scored profiles, a layer another profile keeps, or none keeps, is said as
//! such, and a run scored under no other profile cannot be told apart at all; the text then
//! says to add `--compare exact`. Only the answer position counts, as in the conclusion: it
//! produces the first answer token.

use super::{LayerRecord, ProbeRun};
use serde::Serialize;

/// What lost the needle on one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LossCause {
    /// `exact` keeps the needle: the driving profile's rounding lost it.
    Rounding,
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
}

/// The lost layers of one run at the answer position (`last_prompt_pos`), in layer order.
pub fn lost_layers(run: &ProbeRun, last_prompt_pos: usize) -> Vec<LostLayer> {
    lost_layers_of(&run.layers, last_prompt_pos)
}

/// CSA layers lost to the driving profile's rounding at the answer position, among the
/// records of one run or cell: lost layers (non-trivial, some needle not selected under the
/// driving profile) on which `exact` selects every needle. With one needle these are the
/// layers of cause [`LossCause::Rounding`]; with several a layer counts once, as layers are
/// counted lost once (`csa_layers_selected`), so the count never exceeds the layers lost.
/// `None` when `exact` was not scored there (neither driving nor compared), so rounding cannot
/// be told from the rest.
pub fn rounding_losses<'a>(
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
                _ if kept_by.iter().any(|k| k.profile == exact) => LossCause::Rounding,
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
    let rounding = of(LossCause::Rounding);
    if !rounding.is_empty() {
        parts.push(format!(
            "{} rounding lost {} (exact keeps {}: rank {} vs {})",
            index,
            layers(&rounding),
            them(&rounding),
            ranks(&rounding, &|l| l.exact_rank),
            ranks(&rounding, &|l| l.rank)
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
            served: vec![],
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
            [(2, LossCause::Rounding), (4, LossCause::ExactLoses)]
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
    fn rounding_losses_count_only_where_exact_was_scored() {
        let scored = [
            rec(2, "fp8", true, Some(40)),
            rec(2, "exact", false, Some(3)),
            rec(4, "fp8", true, Some(70)),
            rec(4, "exact", false, Some(30)),
            rec(6, "fp8", true, Some(50)),
            rec(6, "exact", false, Some(10)),
        ];
        assert_eq!(rounding_losses(&scored, 99), Some(2));
        assert_eq!(
            rounding_losses(&scored, 98),
            None,
            "nothing at that position"
        );
        let kept = [
            rec(2, "fp8", true, Some(4)),
            rec(2, "exact", false, Some(3)),
        ];
        assert_eq!(rounding_losses(&kept, 99), Some(0));
        let unscored = [
            rec(2, "fp8", true, Some(40)),
            rec(2, "bf16", false, Some(3)),
        ];
        assert_eq!(rounding_losses(&unscored, 99), None);
        let driving_exact = [rec(2, "exact", true, Some(40))];
        assert_eq!(rounding_losses(&driving_exact, 99), Some(0));
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
        assert_eq!(rounding_losses(&several, 99), Some(1));
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
}
