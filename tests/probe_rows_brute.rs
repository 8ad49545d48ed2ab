//! The needle observer against a naive transcription of design.md section 4, by brute force:
//! every query position t < 90, every needle start up to t + 5 and lengths 1-13 (spans on and
//! off row boundaries, needles in the first row, past the query, the query inside or right
//! after the needle), random scores heavy with ties, top-k 1 to 40 (trivial and not). Every
//! record field (visible rows, needle rows, rank, ties, needle score, k-th score, margin,
//! selected, trivial) must equal the definition's, and the engine-selection check must raise
//! no false disagreement, and one for a selection that contradicts an unambiguous rank.
use needlescope::model::observer::{IndexerObservation, Observer};
use needlescope::numerics::profiles::IndexProfile;
use needlescope::probe::observe::{CellTopk, NeedleObserver, NeedleObserverConfig};

fn engine_topk(scores: &[f32], k: usize) -> Vec<i32> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    (0..k)
        .map(|i| idx.get(i).map_or(-1, |&w| w as i32))
        .collect()
}

#[test]
fn every_record_field_follows_the_definitions_for_every_span_and_query() {
    let mut seed = 12345u64;
    let mut rnd = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) as usize
    };
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
                        needle: (a, b),
                        answer: (a, b),
                        prompt_len: t + 1,
                        prompt_positions: vec![t],
                        probe_decode: true,
                        driving: IndexProfile::SglangFp8,
                        compare: vec![],
                        cells: cells.clone(),
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
                    // design.md: w in [floor(a/4), floor((b-1)/4) + 1], restricted to visible rows.
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
