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
