//! Row mapping and ranks, exactly docs/architecture.md section 4 and docs/spec/attention.md 5.4 / 6.5 / 10.

use needlescope::probe::rank::{kth_scores, rank_needle, trivial, RecordMeta};

use needlescope::probe::rows::{csa_needle_rows, csa_visible_rows, hca_needle_rows, RowKind};
use needlescope::record::LayerRecord;

const CSA: RowKind = RowKind::Csa;
const HCA: RowKind = RowKind::Hca;

#[test]
fn csa_rows_pool_eight_tokens_with_stride_four_clipped_at_zero() {
    assert_eq!(CSA.row_tokens(0), (0, 3));
    assert_eq!(CSA.row_tokens(1), (0, 7));
    assert_eq!(CSA.row_tokens(250), (996, 1003));
    assert_eq!(HCA.row_tokens(7), (896, 1023));
}

#[test]
fn worked_example_needle_1000_1012_maps_to_rows_250_to_253() {
    let needle = (1000, 1012);
    assert_eq!(CSA.span_rows(needle), 250..254);
    for (w, from) in [(250, 1003), (251, 1007), (252, 1011), (253, 1015)] {
        assert_eq!(CSA.visible_from(w), from, "row {w}");
        assert!(CSA.row_touches(w, needle));
    }
    assert!(!CSA.row_touches(249, needle) && !CSA.row_touches(254, needle));
    // Visibility thresholds: the rows appear one by one as their last token is processed.
    for (t, rows) in [
        (1002, 250..250),
        (1003, 250..251),
        (1010, 250..252),
        (1011, 250..253),
        (1014, 250..253),
        (1015, 250..254),
        (5000, 250..254),
    ] {
        assert_eq!(csa_needle_rows(needle, t), rows, "t = {t}");
    }
    assert_eq!(HCA.span_rows(needle), 7..8);
    assert_eq!(HCA.visible_from(7), 1023);
    assert_eq!(hca_needle_rows(needle, 1022), 7..7);
    assert_eq!(hca_needle_rows(needle, 1023), 7..8);
}

#[test]
fn needle_at_token_zero_uses_rows_from_zero() {
    let needle = (0, 5);
    assert_eq!(CSA.span_rows(needle), 0..3);
    assert_eq!(
        csa_needle_rows(needle, 2),
        0..0,
        "no row is complete before token 3"
    );
    assert_eq!(csa_needle_rows(needle, 3), 0..1);
    assert_eq!(csa_needle_rows(needle, 11), 0..3);
    assert_eq!(HCA.span_rows(needle), 0..1);
}

#[test]
fn needle_straddling_a_multiple_of_four_touches_three_rows() {
    let needle = (6, 10); // tokens 6, 7 | 8, 9
    assert_eq!(CSA.span_rows(needle), 1..4);
    assert_eq!(
        (0..6)
            .filter(|&w| CSA.row_touches(w, needle))
            .collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    let one = (8, 9); // a single token right at a multiple of four: rows 2 and 3
    assert_eq!(CSA.span_rows(one), 2..4);
    let end = (4, 8); // ends just before a multiple of four
    assert_eq!(CSA.span_rows(end), 1..3);
}

#[test]
fn last_prompt_token_sees_the_row_holding_it_only_when_the_length_is_a_multiple_of_four() {
    for len in [1000usize, 1001, 1002, 1003, 1004] {
        let t = len - 1;
        let n_t = csa_visible_rows(t);
        assert_eq!(n_t, len / 4, "len {len}");
        // The newest visible row ends at token 4*n_t - 1.
        let newest_token = CSA.row_tokens(n_t - 1).1;
        assert_eq!(newest_token, 4 * (len / 4) - 1);
        let last_in_visible_row = newest_token >= t;
        assert_eq!(
            last_in_visible_row,
            len % 4 == 0,
            "len {len} (mod 4 = {})",
            len % 4
        );
        // The row that will hold the last token is visible iff it is complete.
        let holder = t / 4;
        assert_eq!(holder < n_t, len % 4 == 0, "len {len}");
        // Tokens 4*n_t .. t (len mod 4 of them) are in no visible CSA row.
        let uncovered = (0..=t)
            .filter(|&p| !(0..n_t).any(|w| CSA.row_touches(w, (p, p + 1))))
            .count();
        assert_eq!(uncovered, len % 4, "len {len}");
    }
    // A needle ending at the last prompt token keeps only its completed rows.
    assert_eq!(csa_needle_rows((996, 1002), 1001), 249..250);
    assert_eq!(csa_needle_rows((996, 1004), 1003), 249..251);
}

#[test]
fn empty_spans_have_no_rows() {
    assert_eq!(CSA.span_rows((10, 10)), 0..0);
    assert_eq!(csa_needle_rows((10, 10), 100), 0..0);
}

fn ranks(
    scores: &[f32],
    rows: std::ops::Range<usize>,
) -> (Option<usize>, usize, Option<f32>, Option<usize>) {
    let r = rank_needle(scores, rows);
    (r.needle_rank, r.rank_ties, r.needle_score, r.best_row)
}

#[test]
fn rank_is_one_plus_rows_strictly_higher_and_best_over_needle_rows() {
    let s = [0.1, 0.9, 0.5, 0.7, 0.3];
    assert_eq!(ranks(&s, 2..3), (Some(3), 0, Some(0.5), Some(2)));
    assert_eq!(
        ranks(&s, 2..5),
        (Some(2), 0, Some(0.7), Some(3)),
        "best needle row wins"
    );
    assert_eq!(ranks(&s, 1..2), (Some(1), 0, Some(0.9), Some(1)));
    assert_eq!(
        ranks(&s, 5..8),
        (None, 0, None, None),
        "needle rows not visible yet"
    );
    assert_eq!(
        rank_needle(&s, 4..9).needle_rows,
        1,
        "rows clipped to the visible ones"
    );
}

#[test]
fn ties_count_other_rows_with_exactly_the_needle_score() {
    // Two other rows equal to the needle score: rank counts only strictly higher rows.
    let s = [0.9, 0.5, 0.5, 0.5, 0.1];
    assert_eq!(ranks(&s, 3..4), (Some(2), 2, Some(0.5), Some(3)));
    // Needle rows tied with each other: the lowest index is reported, the other is a tie.
    assert_eq!(
        ranks(&[0.2, 0.8, 0.8, 0.1], 1..3),
        (Some(1), 1, Some(0.8), Some(1))
    );
}

#[test]
fn needle_tied_at_the_kth_place_is_selected_with_zero_margin_and_straddling_ties() {
    let s = [0.9, 0.5, 0.5, 0.1];
    let r = rank_needle(&s, 2..3);
    assert_eq!((r.needle_rank, r.rank_ties), (Some(2), 1));
    let kth = kth_scores(&s, &[2])[0];
    assert_eq!(kth, Some(0.5));
    let meta = RecordMeta {
        cell_id: "c",
        layer: 2,
        query_pos: 99,
        phase: "prompt",
        profile: "fp8",
        driving: true,
        needle: 0,
    };
    let rec = LayerRecord::new(&meta, &r, kth, 2);
    assert!(rec.selected && !rec.trivial);
    assert_eq!(rec.margin, Some(0.0));
    assert!(
        r.ties_straddle(2),
        "two rows share places 2-3, the engine's tie order decides"
    );
    assert!(!r.ties_straddle(3) && !r.ties_straddle(1));
    let out = LayerRecord::new(&meta, &r, kth_scores(&s, &[1])[0], 1);
    assert!(!out.selected);
    assert_eq!(out.margin, Some(0.5 - 0.9));
}

#[test]
fn kth_score_is_none_with_fewer_than_k_visible_rows() {
    let s = [3.0, 1.0, 2.0];
    assert_eq!(
        kth_scores(&s, &[1, 2, 3, 4, 0]),
        vec![Some(3.0), Some(2.0), Some(1.0), None, None]
    );
    assert_eq!(kth_scores(&[], &[1]), vec![None]);
}

#[test]
fn trivial_means_every_visible_row_fits_in_the_top_k() {
    assert!(trivial(512, 512) && trivial(3, 512) && !trivial(513, 512));
    let s = vec![0.0f32; 600];
    let meta = RecordMeta {
        cell_id: "c",
        layer: 0,
        query_pos: 2399,
        phase: "prompt",
        profile: "exact",
        driving: false,
        needle: 0,
    };
    let r = rank_needle(&s[..512], 0..1);
    assert!(LayerRecord::new(&meta, &r, None, 512).trivial);
    let r = rank_needle(&s, 0..1);
    let rec = LayerRecord::new(&meta, &r, kth_scores(&s, &[512])[0], 512);
    assert!(!rec.trivial && rec.selected, "rank 1 with 599 ties");
    assert_eq!(rec.rank_ties, 599);
}

#[test]
fn nan_scores_rank_below_everything() {
    let s = [f32::NAN, f32::NEG_INFINITY, 0.5];
    assert_eq!(ranks(&s, 0..1).0, Some(3), "a NaN needle is last");
    assert_eq!(ranks(&s, 1..2).0, Some(2), "NaN rows never count as higher");
    assert_eq!(kth_scores(&s, &[2])[0], Some(f32::NEG_INFINITY));
}

#[test]
fn a_nan_needle_is_never_selected() {
    // Three numbers, then NaNs; the needle rows (8, 9) are NaN. Rank 4 (below the numbers),
    // but an engine's top-4 may keep row 3 (a NaN of another row) instead: not selected.
    let mut s = vec![1.0, 2.0, 3.0];
    s.extend([f32::NAN; 7]);
    let r = rank_needle(&s, 8..10);
    assert_eq!((r.needle_rank, r.rank_ties, r.needle_ties), (Some(4), 6, 1));
    assert!(!r.selected(4) && !r.selected(10));
    let all_nan = rank_needle(&[f32::NAN; 5], 2..3);
    assert_eq!(all_nan.needle_rank, Some(1));
    assert!(!all_nan.selected(1) && !all_nan.selected(5));
    let meta = RecordMeta {
        cell_id: "c",
        layer: 2,
        query_pos: 39,
        phase: "prompt",
        profile: "fp8",
        driving: true,
        needle: 0,
    };
    let rec = LayerRecord::new(&meta, &r, kth_scores(&s, &[4])[0], 4);
    assert!(!rec.selected && !rec.trivial);
    assert!(rec.margin.unwrap().is_nan());
}

#[test]
fn ties_among_needle_rows_only_do_not_straddle() {
    // Rows 1 and 2 (both needle rows) share places 2-3; top-2 keeps one of them whatever the
    // tie order, so an engine that dropped both would be wrong, not a tie-order choice.
    let s = [5.0, 4.0, 4.0];
    let r = rank_needle(&s, 1..3);
    assert_eq!((r.needle_rank, r.rank_ties, r.needle_ties), (Some(2), 1, 1));
    assert!(r.selected(2) && !r.ties_straddle(2));
    // One needle row and one other row tied at places 2-3: the order decides.
    let r = rank_needle(&[5.0, 4.0, 4.0, 1.0], 2..4);
    assert_eq!((r.needle_rank, r.rank_ties, r.needle_ties), (Some(2), 1, 0));
    assert!(r.ties_straddle(2));
    // Two needle rows and two others tied at places 2-5, top-3 leaves two places: the two
    // others can take both, so it straddles; top-4 leaves three: a needle row is kept.
    let r = rank_needle(&[9.0, 4.0, 4.0, 4.0, 4.0], 3..5);
    assert_eq!((r.needle_rank, r.rank_ties, r.needle_ties), (Some(2), 3, 1));
    assert!(r.ties_straddle(3) && !r.ties_straddle(4));
}

#[test]
fn layer_record_serialises_with_exactly_the_layers_csv_fields() {
    let meta = RecordMeta {
        cell_id: "16k-40-fp8-512",
        layer: 7,
        query_pos: 16383,
        phase: "prompt",
        profile: "fp8",
        driving: true,
        needle: 0,
    };
    let r = rank_needle(&[0.25, 1.0], 0..1);
    let rec = LayerRecord::new(&meta, &r, None, 512);
    let mut w = csv::Writer::from_writer(Vec::new());
    w.serialize(&rec).unwrap();
    let text = String::from_utf8(w.into_inner().unwrap()).unwrap();
    let mut lines = text.lines();
    assert_eq!(
        lines.next().unwrap(),
        "cell_id,layer,query_pos,phase,profile,driving,needle,visible_rows,needle_rows,needle_rank,rank_ties,needle_score,kth_score,margin,selected,trivial,stage,block_rank,block_kept,unconstrained_rank,stage_verdict"
    );
    assert_eq!(
        lines.next().unwrap(),
        "16k-40-fp8-512,7,16383,prompt,fp8,true,0,2,1,2,0,0.25,,,true,true,,,,,"
    );
}

/// HCA rows are non-overlapping windows of 128 tokens: a span that ends with the last token of
/// a row (128w + 127) touches no later row, one that starts on a row's first token no earlier
/// one. Checked against `row_touches` across several 128-token boundaries.
#[test]
fn hca_span_rows_stop_exactly_at_the_128_token_boundaries() {
    assert_eq!(
        HCA.span_rows((100, 128)),
        0..1,
        "token 127 is the last of row 0"
    );
    assert_eq!(HCA.span_rows((128, 256)), 1..2);
    assert_eq!(HCA.span_rows((127, 129)), 0..2);
    assert_eq!(hca_needle_rows((200, 256), 255), 1..2);
    for a in [0usize, 1, 127, 128, 129, 255, 256] {
        for b in a..a + 300 {
            let r = HCA.span_rows((a, b));
            for w in 0..6 {
                assert_eq!(
                    r.contains(&w),
                    HCA.row_touches(w, (a, b)),
                    "span [{a},{b}) row {w}"
                );
            }
        }
    }
}
