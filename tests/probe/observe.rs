//! NeedleObserver on synthetic observations: records per (cell, profile), compare profiles
//! re-scored from raw keys, the engine-selection check, shape errors without panics, and the
//! needle attention mass, and a brute-force check of every record field against docs/architecture.md section 4.

use needlescope::config::LayerKind;
use needlescope::model::observer::{AttentionObservation, IndexerObservation, Observer};
use needlescope::numerics::profiles::{prepare_keys, prepare_query, score_rows, IndexProfile};
use needlescope::probe::observe::{rescore, CellTopk, NeedleObserver, NeedleObserverConfig};
use needlescope::probe::rank::{kth_scores, rank_needle};
use needlescope::record::phase_label;

const HEADS: usize = 2;
const DIM: usize = 8;

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as f32 + 1.0) * (seed as f32 * 0.37 + 0.11)).sin())
        .collect()
}

fn config(
    needle: (usize, usize),
    compare: Vec<IndexProfile>,
    ks: &[usize],
) -> NeedleObserverConfig {
    NeedleObserverConfig {
        needles: vec![needle],
        answer: (needle.0 + 1, needle.1),
        prompt_len: 64,
        prompt_positions: vec![63],
        probe_decode: true,
        driving: IndexProfile::SglangFp8,
        compare,
        cells: ks
            .iter()
            .map(|&k| CellTopk {
                cell_id: format!("k{k}"),
                topk: k,
            })
            .collect(),
        engine: None,
    }
}

struct Inputs {
    q: Vec<f32>,
    w: Vec<f32>,
    keys: Vec<f32>,
    scores: Vec<f32>,
}

fn inputs(t: usize) -> Inputs {
    let n_t = (t + 1) / 4;
    let q = values(HEADS * DIM, 1);
    let w = vec![1.0, 0.5];
    let keys = values(n_t * DIM, 2);
    let obs = IndexerObservation {
        layer: 2,
        query_pos: t,
        heads: HEADS,
        head_dim: DIM,
        q_raw: &q,
        weights_raw: &w,
        keys_raw: &keys,
        visible_rows: n_t,
        scores: &[],
        selected: &[],
        rows: needlescope::config::RowMapping::CSA,
        stage: needlescope::model::observer::IndexStage::Plain,
    };
    let scores = rescore(IndexProfile::SglangFp8, &obs);
    Inputs { q, w, keys, scores }
}

fn observe(o: &mut NeedleObserver, x: &Inputs, t: usize, selected: &[i32]) {
    let obs = IndexerObservation {
        layer: 2,
        query_pos: t,
        heads: HEADS,
        head_dim: DIM,
        q_raw: &x.q,
        weights_raw: &x.w,
        keys_raw: &x.keys,
        visible_rows: (t + 1) / 4,
        scores: &x.scores,
        selected,
        rows: needlescope::config::RowMapping::CSA,
        stage: needlescope::model::observer::IndexStage::Plain,
    };
    o.indexer(&obs);
}

/// The engine's selection: top-k by score, ties to the lower row, -1 padding.
fn engine_topk(scores: &[f32], k: usize) -> Vec<i32> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    (0..k)
        .map(|i| idx.get(i).map_or(-1, |&w| w as i32))
        .collect()
}

#[test]
fn probed_positions_are_the_last_prompt_token_and_decode_steps() {
    let o = NeedleObserver::new(config((10, 20), vec![], &[4]));
    assert!(o.wants_position(63) && o.wants_position(64) && o.wants_position(70));
    assert!(!o.wants_position(62) && !o.wants_position(0));
    assert_eq!(phase_label(63, 64), "prompt");
    assert_eq!(phase_label(64, 64), "1");
    assert_eq!(phase_label(66, 64), "3");
}

#[test]
fn one_record_per_cell_and_profile_with_driving_ranks_from_engine_scores() {
    let t = 63;
    let x = inputs(t);
    let cfg = config(
        (10, 20),
        vec![
            IndexProfile::Exact,
            IndexProfile::SglangFp8,
            IndexProfile::Bf16Qk,
        ],
        &[4, 8],
    );
    let mut o = NeedleObserver::new(cfg);
    observe(&mut o, &x, t, &engine_topk(&x.scores, 4));
    assert!(o.errors.is_empty(), "{:?}", o.errors);
    // 2 cells x 3 profiles (the driving profile listed in --compare is not scored twice).
    assert_eq!(o.layer_records.len(), 6);
    let expected = rank_needle(&x.scores, 2..6);
    let driving: Vec<_> = o.layer_records.iter().filter(|r| r.driving).collect();
    assert_eq!(driving.len(), 2);
    for r in &driving {
        assert_eq!(
            (r.profile.as_str(), r.layer, r.query_pos, r.phase.as_str()),
            ("fp8", 2, 63, "prompt")
        );
        assert_eq!((r.visible_rows, r.needle_rows), (16, 4));
        assert_eq!(r.needle_rank, expected.needle_rank);
        assert_eq!(r.needle_score, expected.needle_score);
    }
    assert_eq!(driving[0].cell_id, "k4");
    assert_eq!(driving[1].cell_id, "k8");
    assert_eq!(o.selection_checks, 1);
    assert!(o.disagreements.is_empty(), "{:?}", o.disagreements);
}

#[test]
fn compare_profiles_are_rescored_from_raw_keys_like_the_numerics_reference() {
    let t = 63;
    let x = inputs(t);
    let mut o = NeedleObserver::new(config(
        (30, 34),
        vec![IndexProfile::Bf16Qk, IndexProfile::OfficialFp4],
        &[4],
    ));
    observe(&mut o, &x, t, &engine_topk(&x.scores, 4));
    for profile in [IndexProfile::Bf16Qk, IndexProfile::OfficialFp4] {
        let q = prepare_query(profile, &x.q, &x.w, HEADS, DIM);
        let keys = prepare_keys(profile, &x.keys, DIM);
        let mut reference = vec![0.0; 16];
        score_rows(profile, &q, &keys, &mut reference);
        let expected = rank_needle(&reference, 7..10);
        let rec = o
            .layer_records
            .iter()
            .find(|r| r.profile == profile.name())
            .unwrap();
        assert!(!rec.driving);
        assert_eq!(rec.needle_rank, expected.needle_rank, "{profile}");
        assert_eq!(rec.needle_score, expected.needle_score, "{profile}");
    }
}

#[test]
fn engine_selection_that_contradicts_the_rank_is_counted_as_a_disagreement() {
    let t = 63;
    let x = inputs(t);
    let needle = (10, 20);
    let rank = rank_needle(&x.scores, 2..6);
    let k = rank.needle_rank.unwrap(); // the needle is exactly inside the top-k
    let mut o = NeedleObserver::new(config(needle, vec![], &[k]));
    let honest = engine_topk(&x.scores, k);
    observe(&mut o, &x, t, &honest);
    assert!(o.disagreements.is_empty());
    // An engine that drops every needle row although one ranks inside the top-k.
    let mut wrong: Vec<i32> = (0..16).filter(|w| !(2..6).contains(w)).take(k).collect();
    wrong.resize(k, -1);
    observe(&mut o, &x, t, &wrong);
    assert_eq!(o.selection_checks, 2);
    assert_eq!(o.disagreements.len(), 1);
    assert!(!o.disagreements[0].engine_selected_needle);
    assert_eq!(o.disagreements[0].topk, k);
}

#[test]
fn ties_straddling_the_cutoff_are_not_disagreements() {
    let t = 15; // 4 visible rows
    let mut x = inputs(t);
    x.scores = vec![0.9, 0.5, 0.5, 0.1]; // the needle row 2 ties row 1 at places 2-3
    let mut cfg = config((8, 9), vec![], &[2]);
    cfg.prompt_positions = vec![t];
    let mut o = NeedleObserver::new(cfg);
    // Needle rows are 2..4; the engine kept row 1 at the tie (ties to the lower row).
    observe(&mut o, &x, t, &[0, 1]);
    assert_eq!(o.selection_checks, 1);
    assert!(o.disagreements.is_empty(), "{:?}", o.disagreements);
    let rec = &o.layer_records[0];
    assert_eq!(
        (rec.needle_rank, rec.rank_ties, rec.selected, rec.margin),
        (Some(2), 1, true, Some(0.0))
    );
}

#[test]
fn malformed_observations_are_recorded_errors_not_panics() {
    let t = 63;
    let x = inputs(t);
    let mut o = NeedleObserver::new(config((10, 20), vec![IndexProfile::Exact], &[4]));
    let bad = IndexerObservation {
        layer: 5,
        query_pos: t,
        heads: HEADS,
        head_dim: DIM,
        q_raw: &x.q[1..],
        weights_raw: &x.w,
        keys_raw: &x.keys,
        visible_rows: 15,
        scores: &x.scores,
        selected: &[40],
        rows: needlescope::config::RowMapping::CSA,
        stage: needlescope::model::observer::IndexStage::Plain,
    };
    o.indexer(&bad);
    assert!(o.layer_records.is_empty());
    let text: Vec<String> = o.errors.iter().map(|e| e.to_string()).collect();
    assert!(
        text.iter().any(|e| e.contains("layer 5")
            && e.contains("visible_rows")
            && e.contains("expected 16, found 15")),
        "{text:?}"
    );
    assert!(text.iter().any(|e| e.contains("q_raw length")), "{text:?}");
}

#[test]
fn attention_mass_counts_needle_window_tokens_and_rows_that_pool_needle_tokens() {
    let mut o = NeedleObserver::new(config((10, 14), vec![], &[4]));
    // Window tokens 12..16 (two needle tokens), CSA rows 1 (tokens 0-7: no needle), 2 (4-11: yes).
    let window = [12usize, 13, 14, 15];
    let rows = [1usize, 2];
    #[rustfmt::skip]
    let probs = [
        0.1, 0.1, 0.1, 0.1, 0.2, 0.3, // head 0: needle = 0.1 + 0.1 + 0.3 = 0.5
        0.0, 0.2, 0.0, 0.0, 0.5, 0.1, // head 1: needle = 0.2 + 0.1 = 0.3
    ];
    let sinks = [0.1, 0.2];
    o.attention(&AttentionObservation {
        layer: 3,
        kind: LayerKind::Csa,
        query_pos: 64,
        heads: 2,
        window_positions: &window,
        compressed_rows: &rows,
        ratio: 4,
        probs: &probs,
        sink_probs: &sinks,
    });
    assert!(o.errors.is_empty(), "{:?}", o.errors);
    let r = &o.attention_records[0];
    assert_eq!(
        (
            r.cell_id.as_str(),
            r.layer,
            r.layer_type.as_str(),
            r.query_pos,
            r.phase.as_str()
        ),
        ("k4", 3, "csa", 64, "1")
    );
    assert!(
        (r.needle_mass_mean - 0.4).abs() < 1e-6,
        "{}",
        r.needle_mass_mean
    );
    assert!((r.needle_mass_max_head - 0.5).abs() < 1e-6);
    assert!(r.needle_in_window);
    assert!((r.sink_mass_mean - 0.15).abs() < 1e-6);

    // HCA row 0 pools tokens 0-127: the whole needle; the window has moved past it.
    o.attention(&AttentionObservation {
        layer: 4,
        kind: LayerKind::Hca,
        query_pos: 300,
        heads: 1,
        window_positions: &[299],
        compressed_rows: &[0, 1],
        ratio: 128,
        probs: &[0.2, 0.7, 0.05],
        sink_probs: &[0.05],
    });
    let r = &o.attention_records[1];
    assert_eq!(r.layer_type, "hca");
    assert!(!r.needle_in_window);
    assert!((r.needle_mass_mean - 0.7).abs() < 1e-6);

    // No needle token in the window and no compressed row (an SWA layer past the needle): the
    // mass is +0.0, never -0.0 (an empty f32 sum), so the CSV says 0.0.
    o.attention(&AttentionObservation {
        layer: 0,
        kind: LayerKind::Swa,
        query_pos: 300,
        heads: 2,
        window_positions: &[299],
        compressed_rows: &[],
        ratio: 0,
        probs: &[0.9, 0.8],
        sink_probs: &[0.1, 0.2],
    });
    let r = &o.attention_records[2];
    assert_eq!(r.needle_mass_mean.to_bits(), 0.0f32.to_bits());
    assert_eq!(r.needle_mass_max_head.to_bits(), 0.0f32.to_bits());
    let mut none = o.attention_records.clone();
    none.truncate(2);
    o.attention_records = none;

    // Wrong probability count: an error, no record.
    o.attention(&AttentionObservation {
        layer: 5,
        kind: LayerKind::Swa,
        query_pos: 300,
        heads: 2,
        window_positions: &[299],
        compressed_rows: &[],
        ratio: 0,
        probs: &[1.0],
        sink_probs: &[0.0, 0.0],
    });
    assert_eq!(o.attention_records.len(), 2);
    assert!(o.errors[0].to_string().contains("probs length"));
}

#[test]
fn attention_record_serialises_with_exactly_the_attention_csv_fields() {
    let mut o = NeedleObserver::new(config((0, 4), vec![], &[4]));
    o.attention(&AttentionObservation {
        layer: 0,
        kind: LayerKind::Swa,
        query_pos: 63,
        heads: 1,
        window_positions: &[2, 63],
        compressed_rows: &[],
        ratio: 0,
        probs: &[0.25, 0.5],
        sink_probs: &[0.25],
    });
    let mut w = csv::Writer::from_writer(Vec::new());
    w.serialize(&o.attention_records[0]).unwrap();
    let text = String::from_utf8(w.into_inner().unwrap()).unwrap();
    assert_eq!(
        text,
        "cell_id,layer,layer_type,query_pos,phase,needle_mass_mean,needle_mass_max_head,needle_in_window,sink_mass_mean\n\
         k4,0,swa,63,prompt,0.25,0.25,true,0.25\n"
    );
}

/// A compare profile ranks the needle among its own re-scored rows, so its records' k-th
/// score and margin come from those scores too, never from the driving profile's.
#[test]
fn compare_profile_records_take_the_kth_score_and_margin_from_their_own_scores() {
    let t = 63;
    let x = inputs(t);
    let profile = IndexProfile::Exact;
    let mut o = NeedleObserver::new(config((30, 34), vec![profile], &[4, 8]));
    observe(&mut o, &x, t, &engine_topk(&x.scores, 4));
    assert!(o.errors.is_empty(), "{:?}", o.errors);
    let q = prepare_query(profile, &x.q, &x.w, HEADS, DIM);
    let keys = prepare_keys(profile, &x.keys, DIM);
    let mut reference = vec![0.0; 16];
    score_rows(profile, &q, &keys, &mut reference);
    let needle = rank_needle(&reference, 7..10).needle_score.unwrap();
    for k in [4usize, 8] {
        let kth = kth_scores(&reference, &[k])[0];
        assert_ne!(
            kth,
            kth_scores(&x.scores, &[k])[0],
            "precondition: the driving profile's k-th score differs"
        );
        let rec = o
            .layer_records
            .iter()
            .find(|r| r.profile == profile.name() && r.cell_id == format!("k{k}"))
            .unwrap();
        assert_eq!(rec.kth_score, kth, "k {k}");
        assert_eq!(rec.margin, Some(needle - kth.unwrap()), "k {k}");
    }
}

/// The needle observer against a naive transcription of docs/architecture.md section 4, by brute force:
/// every query position t < 90, every needle start up to t + 5 and lengths 1-13 (spans on and
/// off row boundaries, needles in the first row, past the query, the query inside or right
/// after the needle), random scores heavy with ties, top-k 1 to 40 (trivial and not). Every
/// record field (visible rows, needle rows, rank, ties, needle score, k-th score, margin,
/// selected, trivial) must equal the definition's, and the engine-selection check must raise
/// no false disagreement, and one for a selection that contradicts an unambiguous rank.
#[test]
fn every_record_field_follows_the_definitions_for_every_span_and_query() {
    let mut rng = needlescope::numerics::rng::Rng::new(12345);
    let mut rnd = || (rng.next_u64() >> 33) as usize;
    let (mut checked, mut flipped) = (0, 0);
    for t in 0..90usize {
        for a in 0..t + 6 {
            for len in 1..14 {
                let b = a + len;
                let n_t = (t + 1) / 4;
                let scores: Vec<f32> = (0..n_t).map(|_| (rnd() % 5) as f32).collect();
                let ks = [1usize, 2, 3, 5, 8, 40];
                let cells: Vec<CellTopk> = ks
                    .iter()
                    .map(|&k| CellTopk {
                        cell_id: format!("k{k}"),
                        topk: k,
                    })
                    .collect();
                let q = vec![0.5f32; 8];
                let w = vec![1.0f32; 1];
                let keys = vec![0.25f32; n_t * 8];
                let observe = |selected: &[i32]| {
                    let mut o = NeedleObserver::new(NeedleObserverConfig {
                        needles: vec![(a, b)],
                        answer: (a, b),
                        prompt_len: t + 1,
                        prompt_positions: vec![t],
                        probe_decode: true,
                        driving: IndexProfile::SglangFp8,
                        compare: vec![],
                        cells: cells.clone(),
                        engine: None,
                    });
                    o.indexer(&IndexerObservation {
                        layer: 2,
                        query_pos: t,
                        heads: 1,
                        head_dim: 8,
                        q_raw: &q,
                        weights_raw: &w,
                        keys_raw: &keys,
                        visible_rows: n_t,
                        scores: &scores,
                        selected,
                        rows: needlescope::config::RowMapping::CSA,
                        stage: needlescope::model::observer::IndexStage::Plain,
                    });
                    o
                };
                let o = observe(&engine_topk(&scores, ks[0]));
                assert!(o.errors.is_empty(), "{:?}", o.errors);
                assert!(
                    o.disagreements.is_empty(),
                    "t {t} [{a},{b}) {:?}",
                    o.disagreements
                );
                let rows: Vec<usize> = (0..n_t)
                    // docs/architecture.md section 4: w in [floor(a/4), floor((b-1)/4) + 1], restricted to visible rows.
                    .filter(|&w| a / 4 <= w && w <= (b - 1) / 4 + 1)
                    .collect();
                let best = rows
                    .iter()
                    .map(|&w| scores[w])
                    .fold(None, |m: Option<f32>, s| Some(m.map_or(s, |m| m.max(s))));
                let mut sorted = scores.clone();
                sorted.sort_by(|x, y| y.total_cmp(x));
                assert_eq!(o.layer_records.len(), ks.len());
                for (r, &k) in o.layer_records.iter().zip(&ks) {
                    let rank = best.map(|b| 1 + scores.iter().filter(|&&s| s > b).count());
                    let ties = best.map_or(0, |b| scores.iter().filter(|&&s| s == b).count() - 1);
                    let kth = (k <= n_t).then(|| sorted[k - 1]);
                    let ctx = format!("t {t} needle [{a},{b}) k {k} scores {scores:?}");
                    assert_eq!(r.visible_rows, n_t, "{ctx}");
                    assert_eq!(r.needle_rows, rows.len(), "{ctx}");
                    assert_eq!(r.needle_rank, rank, "{ctx}");
                    assert_eq!(r.rank_ties, ties, "{ctx}");
                    assert_eq!(r.needle_score, best, "{ctx}");
                    assert_eq!(r.kth_score, kth, "{ctx}");
                    assert_eq!(r.margin, best.zip(kth).map(|(b, k)| b - k), "{ctx}");
                    assert_eq!(r.selected, rank.is_some_and(|r| r <= k), "{ctx}");
                    assert_eq!(r.trivial, n_t <= k, "{ctx}");
                    checked += 1;
                }
                // An engine selection that contradicts an unambiguous rank at k = 1 (no
                // non-needle row tied with the best needle row) must be caught.
                if let Some(best) = best {
                    let rank = 1 + scores.iter().filter(|&&s| s > best).count();
                    let tied_outside = (0..n_t).any(|w| !rows.contains(&w) && scores[w] == best);
                    let outside = (0..n_t).filter(|w| !rows.contains(w));
                    let wrong = match (rank, tied_outside) {
                        (1, false) => outside.max_by(|&x, &y| scores[x].total_cmp(&scores[y])),
                        (1, true) => None,
                        _ => Some(rows[0]),
                    };
                    if let Some(row) = wrong {
                        let o = observe(&[row as i32]);
                        assert_eq!(o.disagreements.len(), 1, "t {t} [{a},{b}) row {row}");
                        flipped += 1;
                    }
                }
            }
        }
    }
    assert_eq!(checked, 354_510, "cases checked");
    assert!(
        flipped > 10_000,
        "{flipped} contradicting selections checked"
    );
}
