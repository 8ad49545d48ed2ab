//! The record formats of a report directory: CSV headers exactly as docs/outputs.md lists
//! them (names and order), every field type surviving a write/read round trip (including
//! empty optionals, commas, quotes and newlines in answer_text, infinities), and the small
//! helpers (RFC 3339 time, config hash; token counts are `units`' unit tests).

use needlescope_testkit::report as report_support;

use std::time::{Duration, UNIX_EPOCH};

use needlescope::record::{
    config_hash, rfc3339_utc, ATTENTION_COLUMNS, CELLS_COLUMNS, LAYERS_COLUMNS,
};
use needlescope::report::{RunDir, RunRecords};
use report_support::*;

/// docs/outputs.md, copied verbatim (the normative header lines).
const DESIGN_CELLS: &str = "cell_id, target_tokens, prompt_tokens, depth_pct, needle_start, \
    needle_end, answer_start, answer_end, index, kv, topk, answer_text, answer_correct, \
    min_needle_rank, csa_layers_selected, csa_layers_nontrivial, wall_seconds, recalled, \
    exact_keeps, sample";
const DESIGN_LAYERS: &str = "cell_id, layer, query_pos, phase, profile, driving, needle, \
    visible_rows, needle_rows, needle_rank, rank_ties, needle_score, kth_score, margin, selected, trivial, \
    stage, block_rank, block_kept, unconstrained_rank, stage_verdict";
const DESIGN_ATTENTION: &str = "cell_id, layer, layer_type, query_pos, phase, needle_mass_mean, \
    needle_mass_max_head, needle_in_window, sink_mass_mean";

fn design(list: &str) -> Vec<String> {
    list.split(',').map(|s| s.trim().to_string()).collect()
}

/// The header line serde writes for a record type (its field order).
fn serde_header<T: serde::Serialize>(record: &T) -> String {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.serialize(record).unwrap();
    let bytes = w.into_inner().unwrap();
    String::from_utf8(bytes)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn column_constants_are_design_md_section_6_in_order() {
    assert_eq!(CELLS_COLUMNS.to_vec(), design(DESIGN_CELLS));
    assert_eq!(LAYERS_COLUMNS.to_vec(), design(DESIGN_LAYERS));
    assert_eq!(ATTENTION_COLUMNS.to_vec(), design(DESIGN_ATTENTION));
}

#[test]
fn record_field_order_equals_the_column_constants() {
    let c = cell(
        "c0",
        2048,
        10.0,
        needlescope::numerics::modes::IndexProfile::SglangFp8,
        512,
    );
    assert_eq!(serde_header(&c), CELLS_COLUMNS.join(","));
    assert_eq!(
        serde_header(&layer("c0", 2, "fp8", true, 4)),
        LAYERS_COLUMNS.join(",")
    );
    assert_eq!(
        serde_header(&attention("c0", 2)),
        ATTENTION_COLUMNS.join(",")
    );
}

#[test]
fn written_files_start_with_the_design_headers() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let (_store, done) = RunDir::create_or_resume(&run, run_info(false)).unwrap();
    assert!(done.is_empty());
    for (name, cols) in [
        ("cells.csv", CELLS_COLUMNS.to_vec()),
        ("layers.csv", LAYERS_COLUMNS.to_vec()),
        ("attention.csv", ATTENTION_COLUMNS.to_vec()),
    ] {
        let text = std::fs::read_to_string(run.join(name)).unwrap();
        assert_eq!(text, format!("{}\n", cols.join(",")), "{name}");
    }
    let info: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("run.json")).unwrap()).unwrap();
    for key in [
        "command_line",
        "model_path",
        "model_config_hash",
        "needlescope_version",
        "start_time",
        "scenario",
        "synthetic",
        "sweep_args",
        "model_fingerprint",
        "scenario_fingerprint",
    ] {
        assert!(info.get(key).is_some(), "run.json lacks {key}: {info}");
    }
}

#[test]
fn every_field_type_round_trips_through_the_files() {
    use needlescope::numerics::modes::{IndexProfile, KvMode};
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = RunDir::create_or_resume(dir.path(), run_info(true)).unwrap();

    let mut a = cell("16k/d40,fp8", 16384, 37.5, IndexProfile::OfficialFp4, 1024);
    a.kv = KvMode::Exact;
    a.answer_text = "comma, \"quote\"\nnewline and ünïcode".into();
    a.answer_correct = None;
    a.min_needle_rank = None;
    a.wall_seconds = 0.1 + 0.2; // not exactly representable in short decimal
                                // Rows as the probe writes them (the store refuses inconsistent ones): a -inf score with
                                // no k-th score, and at an earlier position a needle not yet visible (rank fields empty).
    let mut la = layer(&a.cell_id, 7, "fp8-no-hadamard-k", false, 1);
    la.needle_score = Some(f32::NEG_INFINITY);
    la.rank_ties = 1023;
    la.kth_score = None;
    la.margin = None;
    la.phase = "3".into();
    let mut la_hidden = layer(&a.cell_id, 7, "fp8-no-hadamard-k", false, 1);
    la_hidden.query_pos = 100;
    la_hidden.needle_rows = 0;
    la_hidden.needle_rank = None;
    la_hidden.needle_score = None;
    la_hidden.margin = None;
    la_hidden.selected = false;
    let mut aa = attention(&a.cell_id, 7);
    aa.layer_type = "hca".into();
    aa.needle_mass_mean = 1.0 / 3.0;
    aa.needle_in_window = true;
    let (a, a_layers) = agreeing(a, vec![la, la_hidden]);
    let (la, la_hidden) = (a_layers[0].clone(), a_layers[1].clone());
    store.append_cell(&a, &a_layers, &[aa.clone()]).unwrap();

    let mut b = cell("b", 2048, 0.0, IndexProfile::SglangBf16Keys, 512);
    b.answer_correct = Some(false);
    b.answer_text = String::new();
    let mut lb = layer("b", 7, "bf16", true, 2);
    lb.needle_score = Some(1.0e-7);
    lb.kth_score = Some(0.0);
    lb.margin = Some(1.0e-7);
    let (b, lbs) = agreeing(b, vec![lb]);
    let lb = lbs[0].clone();
    store
        .append_cell(&b, std::slice::from_ref(&lb), &[attention("b", 7)])
        .unwrap();
    drop(store);

    let back = RunRecords::read(dir.path()).unwrap();
    // The store sets the derived columns from the cell and its rows.
    let (mut a, mut b) = (a, b);
    a.derive_columns(&a_layers);
    b.derive_columns(std::slice::from_ref(&lb));
    assert_eq!((a.recalled, b.recalled), (None, Some(false)));
    assert_eq!(back.cells, vec![a.clone(), b.clone()]);
    assert_eq!(back.layers, vec![la, la_hidden, lb]);
    assert_eq!(back.attention, vec![aa, attention("b", 7)]);
    assert_eq!(back.info.sweep_args, run_info(true).sweep_args);
    assert!(back.info.synthetic);

    // Resuming returns the same records.
    let (_store, done) = RunDir::create_or_resume(dir.path(), run_info(true)).unwrap();
    assert_eq!(done, vec![a, b]);
}

#[test]
fn nan_scores_round_trip_as_nan() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = RunDir::create_or_resume(dir.path(), run_info(false)).unwrap();
    let c = cell(
        "nan",
        2048,
        50.0,
        needlescope::numerics::modes::IndexProfile::Exact,
        512,
    );
    let mut l = layer("nan", 2, "exact", true, 1);
    l.needle_score = Some(f32::NAN);
    l.margin = Some(f32::NAN);
    l.selected = false; // a NaN needle is never selected
    let (c, rows) = agreeing(c, vec![l]);
    assert!(!rows[0].selected);
    store
        .append_cell(&c, &rows, &[attention("nan", 2)])
        .unwrap();
    let back = RunRecords::read(dir.path()).unwrap();
    assert!(back.layers[0].needle_score.unwrap().is_nan());
    assert!(back.layers[0].margin.unwrap().is_nan());
}

#[test]
fn rfc3339_utc_matches_known_instants() {
    for (secs, want) in [
        (0u64, "1970-01-01T00:00:00Z"),
        (951_782_400, "2000-02-29T00:00:00Z"),
        (1_709_164_800, "2024-02-29T00:00:00Z"),
        (1_732_900_985, "2024-11-29T17:23:05Z"),
        (4_107_542_400, "2100-03-01T00:00:00Z"),
    ] {
        assert_eq!(
            rfc3339_utc(UNIX_EPOCH + Duration::from_secs(secs)),
            want,
            "{secs}"
        );
    }
}

/// run.json's config hash is the one `inspect` and `trace` print (the canonical config's), so
/// a reformatted config.json is the same model and a changed field is not.
#[test]
fn config_hash_is_the_canonical_config_hash() {
    let cfg = needlescope::config::ModelConfig::flash();
    assert_eq!(config_hash(&cfg), format!("sha256:{}", cfg.hash_hex()));
    assert_eq!(config_hash(&cfg).len(), "sha256:".len() + 64);
    let mut other = cfg.clone();
    other.index_topk = 1024;
    assert_ne!(config_hash(&cfg), config_hash(&other));
}

#[test]
fn model_name_is_the_last_path_component() {
    let mut info = run_info(false);
    assert_eq!(info.model_name(), "DeepSeek-V4-Flash");
    info.model_path = "/models/x/".into();
    assert_eq!(info.model_name(), "x");
}

/// A cell's summary fields come from the driving profile's records at the last prompt token
/// only: `min_needle_rank` is the worst rank over those CSA layers (docs/outputs.md, despite the
/// name), and the selected / non-trivial counts skip trivial layers. Comparison profiles and
/// decode positions do not count.
#[test]
fn cell_record_takes_the_worst_driving_layer_at_the_last_prompt_token() {
    let id = "L4096-d50-fp8-k512-s0";
    let prompt = needlescope::probe::NeedlePrompt {
        tokens: vec![0; 4096],
        needle: (1000, 1012),
        needles: vec![needlescope::probe::prompt::NeedleSpan::new(
            "The pass key is 71432.",
            (1000, 1012),
            " The pass key is 71432.".into(),
            "haystack",
        )],
        answer: (1005, 1007),
        needle_text: "The pass key is 71432.".into(),
        answer_value: "71432".into(),
        answer_values: vec!["71432".into()],
        key: String::new(),
        question: "What is the pass key?".into(),
        depth_pct: 50.0,
        actual_depth_pct: 49.8,
        needle_span_text: " The pass key is 71432.".into(),
        answer_span_text: " 71432".into(),
        prompt_text: String::new(),
    };
    let mut trivial = layer(id, 5, "fp8", true, 2);
    trivial.trivial = true;
    let mut decode = layer(id, 1, "fp8", true, 9000);
    decode.query_pos = 4096;
    decode.phase = "decode".into();
    let run = needlescope::record::ProbeRun {
        cell_id: id.into(),
        index: "fp8".into(),
        kv: "fp8".into(),
        topk: 512,
        answer_text: "71432".into(),
        answer_correct: Some(true),
        generated_ids: vec![],
        layers: vec![
            layer(id, 1, "fp8", true, 3),
            layer(id, 3, "fp8", true, 700),
            trivial,
            layer(id, 3, "bf16", false, 5000),
            decode,
        ],
        attention: vec![],
        engine_records: vec![],
        selection_disagreements: 0,
        selection_checks: 3,
        wall_seconds: 1.0,
    };
    let c = needlescope::record::CellRecord::of_run(&run, &prompt.place(4096), true);
    assert_eq!(c.min_needle_rank, Some(700));
    assert_eq!((c.csa_layers_selected, c.csa_layers_nontrivial), (1, 2));
    assert_eq!((c.needle_start, c.needle_end), (1000, 1012));
    assert_eq!(c.answer_correct, Some(true));
    let unjudged = needlescope::record::CellRecord::of_run(&run, &prompt.place(4096), false);
    assert_eq!(unjudged.answer_correct, None);
    // A run with no answer to judge (a thinking run that never reached </think>) is judged
    // by the indexer, like an unjudged one.
    let no_answer = needlescope::record::ProbeRun {
        answer_correct: None,
        ..run
    };
    let c = needlescope::record::CellRecord::of_run(&no_answer, &prompt.place(4096), true);
    assert_eq!(c.answer_correct, None);
}
