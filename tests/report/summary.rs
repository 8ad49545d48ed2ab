//! Summary numbers on hand-made records: recall (answer verdict, or indexer recall when the
//! verdict is empty), median and worst min_needle_rank, CSA layers lost, trivial cells; the
//! terminal table is plain aligned text without colour codes when colour is off.

use needlescope_testkit::report as report_support;

use needlescope::numerics::modes::IndexProfile;
use needlescope::record::verdict::{exact_keeps_by_cell, LayerWord};
use needlescope::record::CellRecord;
use needlescope::report::{render_table, summarize};
use report_support::*;

fn with(id: &str, target: usize, rank: Option<usize>, correct: Option<bool>) -> CellRecord {
    let mut c = cell(id, target, 50.0, IndexProfile::SglangFp8, 512);
    c.min_needle_rank = rank;
    c.answer_correct = correct;
    c
}

#[test]
fn median_worst_and_recall_by_answer() {
    let cells = vec![
        with("a", 4096, Some(3), Some(true)),
        with("b", 4096, Some(100), Some(false)),
        with("c", 4096, Some(7), Some(true)),
        with("d", 4096, Some(10), Some(true)),
        with("e", 4096, None, Some(true)),
    ];
    let g = summarize(&cells, &Default::default());
    assert_eq!(g.len(), 1);
    let g = &g[0];
    assert_eq!((g.cells, g.recalled), (5, 4));
    assert_eq!(g.recall_rate, Some(0.8));
    assert_eq!(g.judged_by, "answer");
    assert_eq!(g.median_rank, Some(8.5), "median of 3, 7, 10, 100");
    assert_eq!(g.worst_rank, Some(100));
}

#[test]
fn indexer_recall_and_layers_lost_when_there_is_no_verdict() {
    let mut lost2 = with("a", 8192, Some(600), None);
    lost2.csa_layers_nontrivial = 21;
    lost2.csa_layers_selected = 19;
    let mut kept = with("b", 8192, Some(5), None);
    kept.csa_layers_nontrivial = 21;
    kept.csa_layers_selected = 21;
    let mut lost1 = with("c", 8192, Some(513), None);
    lost1.csa_layers_nontrivial = 20;
    lost1.csa_layers_selected = 19;
    let g = &summarize(&[lost2, kept, lost1], &Default::default())[0];
    assert_eq!(g.judged_by, "indexer");
    assert_eq!((g.recalled, g.cells), (1, 3));
    assert_eq!(g.median_rank, Some(513.0));
    assert_eq!(g.worst_rank, Some(600));
    assert_eq!((g.layers_lost_worst, g.layers_nontrivial_of_worst), (2, 21));
    assert_eq!(g.layers_lost_total, 3);
    assert_eq!(g.trivial_cells, 0);
}

/// docs/architecture.md section 4: a trivial cell is shown, never evidence. An indexer-judged cell whose every
/// CSA layer is trivial counts neither as recalled nor as lost; an answer verdict always
/// counts; a group of trivial cells only has no rate and reads `trivial` in the table.
#[test]
fn trivial_cells_are_not_evidence_for_recall() {
    let mut trivial = with("t", 2048, Some(1), None);
    trivial.csa_layers_nontrivial = 0;
    let mut lost = with("l", 2048, Some(600), None);
    lost.csa_layers_nontrivial = 3;
    lost.csa_layers_selected = 2;
    let g = &summarize(&[trivial.clone(), lost], &Default::default())[0];
    assert_eq!((g.cells, g.evidence_cells, g.recalled), (2, 1, 0));
    assert_eq!(g.recall_rate, Some(0.0));
    assert_eq!(g.trivial_cells, 1);

    let mut answered = trivial.clone();
    answered.cell_id = "a".into();
    answered.answer_correct = Some(false);
    let g = &summarize(&[trivial.clone(), answered], &Default::default())[0];
    assert_eq!((g.evidence_cells, g.recalled), (1, 0));

    let only = summarize(std::slice::from_ref(&trivial), &Default::default());
    assert_eq!((only[0].evidence_cells, only[0].recall_rate), (0, None));
    let table = render_table(&only, false, LayerWord::Csa);
    let row = table.lines().nth(2).unwrap();
    assert!(row.contains("trivial") && !row.contains('%'), "{table}");
}

#[test]
fn groups_split_by_length_profile_and_topk_in_order() {
    let mut cells = vec![
        with("a", 8192, Some(1), Some(true)),
        with("b", 2048, Some(1), Some(true)),
    ];
    let mut bf = with("c", 2048, Some(2), None);
    bf.index = IndexProfile::SglangBf16Keys;
    bf.csa_layers_nontrivial = 0;
    bf.csa_layers_selected = 0;
    cells.push(bf);
    let mut k1024 = with("d", 2048, Some(4), Some(false));
    k1024.topk = 1024;
    cells.push(k1024);
    let mixed = with("e", 2048, Some(9), None);
    cells.push(mixed);
    let g = summarize(&cells, &Default::default());
    let keys: Vec<(usize, &str, usize)> = g
        .iter()
        .map(|g| (g.target_tokens, g.index.name(), g.topk))
        .collect();
    assert_eq!(
        keys,
        vec![
            (2048, "fp8", 512),
            (2048, "fp8", 1024),
            (2048, "bf16", 512),
            (8192, "fp8", 512)
        ]
    );
    assert_eq!(g[0].judged_by, "mixed");
    assert_eq!(g[0].median_rank, Some(5.0));
    assert_eq!(g[2].trivial_cells, 1);
    assert_eq!(g[1].recall_rate, Some(0.0));
}

#[test]
fn table_is_aligned_plain_text_without_colour() {
    let sweep = sample_sweep(&[2048, 8192], &[0.0, 50.0, 100.0], true, 1);
    let cells: Vec<CellRecord> = sweep.into_iter().map(|c| c.0).collect();
    let table = render_table(
        &summarize(&cells, &Default::default()),
        false,
        LayerWord::Csa,
    );
    println!("{table}");
    assert!(!table.contains('\x1b'), "colour codes in a plain table");
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("length"));
    assert!(lines[1].starts_with("------"));
    // Header + rule + 8 groups, every data row as wide as the rule.
    let width = lines[1].len();
    for row in &lines[2..10] {
        assert!(row.len() <= width, "{row}");
        assert!(
            row.starts_with("    2k") || row.starts_with("    8k"),
            "{row}"
        );
    }
    let coloured = render_table(
        &summarize(&cells, &Default::default()),
        true,
        LayerWord::Csa,
    );
    assert!(coloured.contains("\x1b[3"));
}

/// The recall percentage never rounds a partial recall to 100% or 0%: 199 of 200 is 99%, 1 of
/// 200 is 1% (without colour the figure would contradict the fraction beside it).
#[test]
fn recall_percentage_says_100_only_when_all_and_0_only_when_none() {
    for (recalled, shown) in [
        (199usize, "199/200  99%"),
        (1, "1/200   1%"),
        (200, "200/200 100%"),
        (0, "0/200   0%"),
    ] {
        let cells: Vec<CellRecord> = (0..200)
            .map(|i| with(&format!("c{i}"), 4096, Some(10), Some(i < recalled)))
            .collect();
        let table = render_table(
            &summarize(&cells, &Default::default()),
            false,
            LayerWord::Csa,
        );
        let row = table.lines().nth(2).unwrap();
        assert!(
            row.contains(shown),
            "{recalled}/200 recalled is shown as: {row}"
        );
    }
}

/// Layers lost to rounding come from layers.csv: a lost layer that the exact record of the same
/// layer selects. A group has the figure only when every cell scored exact; the table shows it
/// in "exact keeps", `-` otherwise.
#[test]
fn layers_lost_to_rounding_need_exact_in_every_cell() {
    let mut a = with("a", 4096, Some(900), None);
    a.csa_layers_nontrivial = 3;
    a.csa_layers_selected = 1;
    let mut b = with("b", 4096, Some(700), None);
    b.csa_layers_nontrivial = 3;
    b.csa_layers_selected = 2;
    let layers = vec![
        // a: layer 2 lost, exact keeps it; layer 4 lost, exact loses it too; layer 6 kept.
        layer("a", 2, "fp8", true, 900),
        layer("a", 2, "exact", false, 40),
        layer("a", 4, "fp8", true, 800),
        layer("a", 4, "exact", false, 600),
        layer("a", 6, "fp8", true, 3),
        layer("a", 6, "exact", false, 2),
        // b: layer 2 lost, exact keeps it.
        layer("b", 2, "fp8", true, 700),
        layer("b", 2, "exact", false, 500),
        layer("b", 4, "fp8", true, 5),
        layer("b", 4, "exact", false, 6),
    ];
    // The store sets exact_keeps from each cell's rows; the summary reads it.
    let of = |id: &str, rows: &[_]| -> Vec<_> {
        rows.iter()
            .filter(|r: &&needlescope::record::LayerRecord| r.cell_id == id)
            .cloned()
            .collect()
    };
    a.derive_columns(&of("a", &layers));
    b.derive_columns(&of("b", &layers));
    let cells = [a.clone(), b.clone()];
    let rounding = exact_keeps_by_cell(&cells);
    assert_eq!((rounding["a"], rounding["b"]), (1, 1));
    let g = &summarize(&cells, &rounding)[0];
    assert_eq!(g.layers_lost_total, 3);
    assert_eq!(g.exact_keeps, Some(2));
    let table = render_table(std::slice::from_ref(g), false, LayerWord::Csa);
    let head = table.lines().next().unwrap();
    assert!(head.ends_with("exact keeps"), "{table}");
    assert!(
        table.lines().nth(2).unwrap().ends_with("  3            2"),
        "{table}"
    );

    // Without exact records for cell b, the group has no figure.
    let without_b: Vec<_> = layers
        .iter()
        .filter(|r| !(r.cell_id == "b" && r.profile == "exact"))
        .cloned()
        .collect();
    b.derive_columns(&of("b", &without_b));
    let cells = [a.clone(), b.clone()];
    let rounding = exact_keeps_by_cell(&cells);
    assert!(!rounding.contains_key("b"));
    let g = &summarize(&cells, &rounding)[0];
    assert_eq!(g.exact_keeps, None);
    let table = render_table(std::slice::from_ref(g), false, LayerWord::Csa);
    assert!(
        table.lines().nth(2).unwrap().ends_with("  3            -"),
        "{table}"
    );
}
