//! The report directory survives a kill at any moment, losing at most the cell in flight:
//! torn last lines are truncated, rows of unfinished cells are dropped, resuming with other
//! arguments or another model is refused with the differing fields named.

use needlescope_testkit::report as report_support;

use std::io::Write;
use std::path::Path;

use needlescope::numerics::modes::IndexProfile;
use needlescope::record::{AttentionRecord, CellRecord, LayerRecord, CELLS_COLUMNS};
use needlescope::report::{ReportError, RunDir, RunRecords};
use report_support::*;

fn three_cells() -> Vec<(CellRecord, Vec<LayerRecord>, Vec<AttentionRecord>)> {
    (0..3)
        .map(|i| {
            let id = format!("cell{i}");
            let c = cell(&id, 2048 << i, 50.0, IndexProfile::SglangFp8, 512);
            let layers = csa_layers()
                .iter()
                .map(|&l| layer(&id, l, "fp8", true, 1 + l))
                .collect();
            let (c, layers) = agreeing(c, layers);
            let att = vec![attention(&id, 2), attention(&id, 3)];
            (c, layers, att)
        })
        .collect()
}

fn append_bytes(path: &Path, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    f.write_all(bytes).unwrap();
}

/// Strict parse: header + records, every record deserialises, file ends with a newline.
fn strict<T: serde::de::DeserializeOwned>(path: &Path) -> Vec<T> {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(
        text.ends_with('\n'),
        "{} does not end with a newline",
        path.display()
    );
    let mut r = csv::Reader::from_reader(text.as_bytes());
    r.deserialize().map(|x| x.unwrap()).collect()
}

/// One CSV line of `record` (no header).
fn csv_line<T: serde::Serialize>(record: &T) -> Vec<u8> {
    let mut w = csv::WriterBuilder::new()
        .has_headers(false)
        .from_writer(Vec::new());
    w.serialize(record).unwrap();
    w.into_inner().unwrap()
}

#[test]
fn resume_after_kill_keeps_finished_cells_and_drops_orphan_rows() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path();
    let cells = three_cells();
    {
        let (mut store, done) = RunDir::create_or_resume(run, run_info(false)).unwrap();
        assert!(done.is_empty());
        for (c, l, a) in &cells {
            store.append_cell(c, l, a).unwrap();
        }
    }
    // The kill: cell3's layer rows and half an attention row were written, and half its
    // cells.csv row.
    let c3 = cell("cell3", 65536, 10.0, IndexProfile::SglangFp8, 512);
    let l3: Vec<LayerRecord> = csa_layers()
        .iter()
        .map(|&l| layer("cell3", l, "fp8", true, 9))
        .collect();
    let (c3, l3) = agreeing(c3, l3);
    for r in &l3 {
        append_bytes(&run.join("layers.csv"), &csv_line(r));
    }
    let att = csv_line(&attention("cell3", 2));
    append_bytes(&run.join("attention.csv"), &att[..att.len() / 2]);
    let row = csv_line(&c3);
    append_bytes(&run.join("cells.csv"), &row[..row.len() / 2]);

    // Reading (the `report` path) already ignores the torn and orphan rows, without writing,
    // and says so.
    let len_before = std::fs::metadata(run.join("layers.csv")).unwrap().len();
    let read = RunRecords::read(run).unwrap();
    assert_eq!(read.cells.len(), 3);
    assert!(read.layers.iter().all(|r| r.cell_id != "cell3"));
    assert!(
        read.notes
            .iter()
            .any(|n| n.contains("rows of cell cell3, which cells.csv does not list")),
        "{:?}",
        read.notes
    );
    assert_eq!(
        std::fs::metadata(run.join("layers.csv")).unwrap().len(),
        len_before
    );
    // A second unlisted cell is no kill's doing (a run has one cell in flight): report
    // refuses, naming both; a resume drops both.
    append_bytes(
        &run.join("layers.csv"),
        &csv_line(&layer("ghost", 4, "fp8", true, 9)),
    );
    let err = RunRecords::read(run).err().unwrap().to_string();
    assert!(
        err.contains("holds rows of 2 cells that cells.csv does not list (cell3, ghost)"),
        "{err}"
    );

    let (mut store, done) = RunDir::create_or_resume(run, run_info(false)).unwrap();
    assert_eq!(
        store.notes(),
        ["dropped the rows of 2 cells that cells.csv does not list (cell3, ghost); they are computed again"]
    );
    let want: Vec<CellRecord> = cells.iter().map(|c| c.0.clone()).collect();
    assert_eq!(done, want);
    assert!(store.is_finished("cell2") && !store.is_finished("cell3"));

    let cells_on_disk: Vec<CellRecord> = strict(&run.join("cells.csv"));
    assert_eq!(cells_on_disk, want);
    let layers: Vec<LayerRecord> = strict(&run.join("layers.csv"));
    let want_layers: Vec<LayerRecord> = cells.iter().flat_map(|c| c.1.clone()).collect();
    assert_eq!(layers, want_layers, "orphan layer rows must be dropped");
    let att: Vec<AttentionRecord> = strict(&run.join("attention.csv"));
    let want_att: Vec<AttentionRecord> = cells.iter().flat_map(|c| c.2.clone()).collect();
    assert_eq!(att, want_att, "the torn attention row must be dropped");

    // The cell in flight is redone and lands once.
    let a3 = [attention("cell3", 2), attention("cell3", 3)];
    store.append_cell(&c3, &l3, &a3).unwrap();
    drop(store);
    let back = RunRecords::read(run).unwrap();
    assert_eq!(back.cells.len(), 4);
    assert_eq!(
        back.layers.iter().filter(|r| r.cell_id == "cell3").count(),
        l3.len()
    );
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["cells_finished"], 4);
}

#[test]
fn a_torn_header_is_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    RunDir::create_or_resume(dir.path(), run_info(false)).unwrap();
    std::fs::write(dir.path().join("cells.csv"), b"cell_id,targ").unwrap();
    let (_s, done) = RunDir::create_or_resume(dir.path(), run_info(false)).unwrap();
    assert!(done.is_empty());
    let text = std::fs::read_to_string(dir.path().join("cells.csv")).unwrap();
    assert_eq!(text, format!("{}\n", CELLS_COLUMNS.join(",")));
}

#[test]
fn corruption_before_the_last_line_is_an_error_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = RunDir::create_or_resume(dir.path(), run_info(false)).unwrap();
    for (c, l, a) in three_cells() {
        store.append_cell(&c, &l, &a).unwrap();
    }
    drop(store);
    let path = dir.path().join("cells.csv");
    let text = std::fs::read_to_string(&path).unwrap();
    let broken = text.replacen("cell1,4096", "cell1,lots", 1);
    assert_ne!(broken, text);
    std::fs::write(&path, broken).unwrap();
    let err = RunDir::create_or_resume(dir.path(), run_info(false))
        .err()
        .unwrap();
    let msg = err.to_string();
    // The column by name and 1-based number, and the value (not the csv crate's "field 1").
    assert!(
        msg.contains("cells.csv, line 3: target_tokens (column 2): cannot read \"lots\": invalid digit found in string"),
        "{msg}"
    );
}

#[test]
fn a_wrong_header_is_refused_naming_expected_and_found() {
    let dir = tempfile::tempdir().unwrap();
    RunDir::create_or_resume(dir.path(), run_info(false)).unwrap();
    std::fs::write(dir.path().join("layers.csv"), b"cell_id,layer,rank\n").unwrap();
    let err = RunDir::create_or_resume(dir.path(), run_info(false))
        .err()
        .unwrap();
    assert!(matches!(err, ReportError::Header { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("layers.csv") && msg.contains("expected `cell_id,layer,query_pos"),
        "{msg}"
    );
    assert!(msg.contains("found `cell_id,layer,rank`"), "{msg}");
}

/// Creates a run directory for `info` holding one finished cell (a directory without one
/// is taken over by any run; see `a_run_that_finished_no_cell_is_replaced_by_the_next`).
fn run_with_one_cell(dir: &Path, info: needlescope::record::RunInfo) {
    let (mut store, _) = RunDir::create_or_resume(dir, info).unwrap();
    let first = cell("first", 2048, 0.0, IndexProfile::SglangFp8, 512);
    store
        .append_cell(
            &first,
            &[layer("first", 2, "fp8", true, 1)],
            &[attention("first", 2)],
        )
        .unwrap();
}

#[test]
fn resume_with_other_arguments_is_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    run_with_one_cell(dir.path(), run_info(false));
    let mut other = run_info(false);
    other.sweep_args["topk"] = serde_json::json!([512]);
    other.sweep_args["seed"] = serde_json::json!(3);
    let err = RunDir::create_or_resume(dir.path(), other).err().unwrap();
    let msg = err.to_string();
    assert!(msg.contains("run.json"), "{msg}");
    assert!(
        msg.contains("sweep_args.topk: expected [512,1024] (run.json), found [512]"),
        "{msg}"
    );
    assert!(msg.contains("sweep_args.seed: expected null"), "{msg}");
    assert!(!msg.contains("sweep_args.lengths"), "{msg}");
    let ReportError::ResumeMismatch { differences, .. } = err else {
        panic!("not a ResumeMismatch")
    };
    assert_eq!(differences.len(), 2);
}

#[test]
fn resume_with_another_model_is_refused_naming_the_hash() {
    let dir = tempfile::tempdir().unwrap();
    run_with_one_cell(dir.path(), run_info(false));
    let mut other = run_info(false);
    other.model_config_hash = "sha256:ffff".into();
    let msg = RunDir::create_or_resume(dir.path(), other)
        .err()
        .unwrap()
        .to_string();
    assert!(msg.contains("model_config_hash"), "{msg}");
    assert!(
        msg.contains("\"sha256:0123abcd\"") && msg.contains("\"sha256:ffff\""),
        "{msg}"
    );
}

/// Same config, other weights (or a scenario file reusing a built-in's name): refused, naming
/// the fingerprint.
#[test]
fn resume_with_other_weights_or_scenario_content_is_refused() {
    for field in ["model_fingerprint", "scenario_fingerprint"] {
        let dir = tempfile::tempdir().unwrap();
        let first = run_info(false).with_fingerprints("sha256:aa".into(), "sha256:bb".into());
        run_with_one_cell(dir.path(), first.clone());
        let again = first.clone();
        assert!(RunDir::create_or_resume(dir.path(), again).is_ok());
        let mut other = first.clone();
        match field {
            "model_fingerprint" => other.model_fingerprint = "sha256:cc".into(),
            _ => other.scenario_fingerprint = "sha256:cc".into(),
        }
        let msg = RunDir::create_or_resume(dir.path(), other)
            .err()
            .unwrap()
            .to_string();
        assert!(msg.contains(field) && msg.contains("sha256:cc"), "{msg}");
    }
}

/// A run stopped before its first cell (a probe or sweep interrupted while the model loaded)
/// pins nothing: the next run with other settings takes the directory over, saying so.
#[test]
fn a_run_that_finished_no_cell_is_replaced_by_the_next() {
    let dir = tempfile::tempdir().unwrap();
    RunDir::create_or_resume(dir.path(), run_info(false)).unwrap();
    let mut other = run_info(false);
    other.sweep_args["seed"] = serde_json::json!(3);
    let (store, done) = RunDir::create_or_resume(dir.path(), other.clone()).unwrap();
    assert!(done.is_empty());
    assert_eq!(store.info().sweep_args["seed"], 3);
    assert!(
        store
            .notes()
            .iter()
            .any(|n| n.contains("sweep_args.seed") && n.contains("finished no cell")),
        "{:?}",
        store.notes()
    );
    drop(store);
    let on_disk: needlescope::record::RunInfo =
        serde_json::from_slice(&std::fs::read(dir.path().join("run.json")).unwrap()).unwrap();
    assert_eq!(on_disk.sweep_args["seed"], 3);
}

#[test]
fn resume_keeps_the_original_run_json() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = run_info(false);
    first.start_time = "2020-01-01T00:00:00Z".into();
    RunDir::create_or_resume(dir.path(), first).unwrap();
    let mut again = run_info(false);
    again.model_path = "/elsewhere/DeepSeek-V4-Flash".into();
    let (store, _) = RunDir::create_or_resume(dir.path(), again).unwrap();
    assert_eq!(store.info().start_time, "2020-01-01T00:00:00Z");
    assert_eq!(store.info().model_path, "/models/DeepSeek-V4-Flash");
}

#[test]
fn records_of_another_cell_or_a_finished_cell_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = RunDir::create_or_resume(dir.path(), run_info(false)).unwrap();
    let c = cell("a", 2048, 0.0, IndexProfile::SglangFp8, 512);
    let err = store
        .append_cell(&c, &[layer("b", 2, "fp8", true, 1)], &[])
        .err()
        .unwrap();
    let msg = err.to_string();
    assert!(
        msg.contains("layers.csv") && msg.contains("expected a, found b"),
        "{msg}"
    );
    store.append_cell(&c, &[], &[]).unwrap();
    let msg = store.append_cell(&c, &[], &[]).err().unwrap().to_string();
    assert!(
        msg.contains("cells.csv") && msg.contains("cell_id a"),
        "{msg}"
    );
    assert_eq!(store.cells().len(), 1);
}

#[test]
fn csv_files_without_run_json_are_not_appended_to() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cells.csv"), b"something\n").unwrap();
    let msg = RunDir::create_or_resume(dir.path(), run_info(false))
        .err()
        .unwrap()
        .to_string();
    assert!(
        msg.contains("run.json") && msg.contains("cells.csv"),
        "{msg}"
    );
    let msg = RunRecords::read(dir.path()).err().unwrap().to_string();
    assert!(msg.contains("not a report directory"), "{msg}");
}

#[test]
fn a_row_torn_inside_a_quoted_newline_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path();
    let (mut store, _) = RunDir::create_or_resume(run, run_info(false)).unwrap();
    let first = cell("first", 2048, 0.0, IndexProfile::SglangFp8, 512);
    store
        .append_cell(
            &first,
            &[layer("first", 2, "fp8", true, 1)],
            &[attention("first", 2)],
        )
        .unwrap();
    drop(store);
    let mut torn = cell("torn", 2048, 10.0, IndexProfile::SglangFp8, 512);
    torn.answer_text = "line one\nline two".into();
    let row = csv_line(&torn);
    let cut = row.iter().position(|&b| b == b'\n').unwrap() + 1; // just after the inner newline
    assert!(cut < row.len());
    append_bytes(&run.join("cells.csv"), &row[..cut]);
    let (store, done) = RunDir::create_or_resume(run, run_info(false)).unwrap();
    drop(store); // the directory lock: one writer at a time
    assert_eq!(done, vec![first.clone()]);
    assert_eq!(strict::<CellRecord>(&run.join("cells.csv")), vec![first]);

    // Whole row minus its final newline: also incomplete.
    append_bytes(&run.join("cells.csv"), &row[..row.len() - 1]);
    let (_store, done) = RunDir::create_or_resume(run, run_info(false)).unwrap();
    assert_eq!(done.len(), 1);
}

/// `report` on a run that stopped before its first cell: says there is nothing yet, exit 0.
#[test]
fn report_on_a_run_without_cells_says_so() {
    let dir = tempfile::tempdir().unwrap();
    drop(RunDir::create_or_resume(dir.path(), run_info(false)).unwrap());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_needlescope"))
        .arg("report")
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("no finished cell recorded yet"), "{stdout}");
}

/// summary.json carries the layers lost to rounding (a lost driving layer the exact record of
/// the same layer selects) as cells are appended, and again after a resume, which recomputes
/// them from layers.csv.
#[test]
fn summary_counts_layers_lost_to_rounding_across_a_resume() {
    let dir = tempfile::tempdir().unwrap();
    let lost = |id: &str, layer_no: usize, profile: &str, driving: bool, rank: usize| {
        let mut r = layer(id, layer_no, profile, driving, rank);
        if rank > 512 {
            r.needle_score = Some(0.5);
            r.margin = Some(-0.25);
        }
        r
    };
    let cells: Vec<(CellRecord, Vec<LayerRecord>)> = (0..2)
        .map(|i| {
            let id = format!("c{i}");
            let mut c = cell(
                &id,
                4096,
                10.0 + 40.0 * i as f64,
                IndexProfile::SglangFp8,
                512,
            );
            c.min_needle_rank = Some(900);
            c.csa_layers_selected = 0;
            c.csa_layers_nontrivial = 2;
            c.answer_correct = None;
            // Layer 2: exact keeps it (rounding); layer 3: exact loses it too.
            let layers = vec![
                lost(&id, 2, "fp8", true, 900),
                lost(&id, 2, "exact", false, 40),
                lost(&id, 3, "fp8", true, 800),
                lost(&id, 3, "exact", false, 700),
            ];
            (c, layers)
        })
        .collect();
    let group = |path: &Path| -> serde_json::Value {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path.join("summary.json")).unwrap())
                .unwrap();
        v["groups"][0].clone()
    };
    {
        let (mut store, _) = RunDir::create_or_resume(dir.path(), run_info(true)).unwrap();
        let (c, layers) = &cells[0];
        let att = vec![attention(&c.cell_id, 2), attention(&c.cell_id, 3)];
        store.append_cell(c, layers, &att).unwrap();
        let g = group(dir.path());
        assert_eq!(g["layers_lost_total"], 2);
        assert_eq!(g["layers_lost_to_rounding"], 1);
    }
    let (mut store, done) = RunDir::create_or_resume(dir.path(), run_info(true)).unwrap();
    assert_eq!(done.len(), 1);
    assert_eq!(
        group(dir.path())["layers_lost_to_rounding"],
        1,
        "recomputed on resume"
    );
    let (c, layers) = &cells[1];
    let att = vec![attention(&c.cell_id, 2), attention(&c.cell_id, 3)];
    store.append_cell(c, layers, &att).unwrap();
    let g = group(dir.path());
    assert_eq!(
        (
            g["layers_lost_total"].clone(),
            g["layers_lost_to_rounding"].clone()
        ),
        (4.into(), 2.into())
    );
    drop(store);
    let records = RunRecords::read(dir.path()).unwrap();
    records.write_summary().unwrap();
    assert_eq!(
        group(dir.path())["layers_lost_to_rounding"],
        2,
        "the reader agrees"
    );
}

/// A cells.csv written before `recalled`, `exact_keeps` and `sample` (its header ends at
/// `wall_seconds`) is read with the three derived, with a note, and a resumed run rewrites it
/// in today's form (what it would have written) before appending.
#[test]
fn a_cells_csv_of_an_older_version_is_read_and_rewritten_on_resume() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path();
    let (mut store, _) = RunDir::create_or_resume(run, run_info(false)).unwrap();
    for (c, l, a) in three_cells() {
        store.append_cell(&c, &l, &a).unwrap();
    }
    drop(store);
    let path = run.join("cells.csv");
    let today = std::fs::read_to_string(&path).unwrap();
    let today_cells = RunRecords::read(run).unwrap().cells;
    // The older file: every line without its last three fields.
    let older: String = today
        .lines()
        .map(|l| {
            let mut fields: Vec<&str> = l.split(',').collect();
            fields.truncate(fields.len() - 3);
            fields.join(",") + "\n"
        })
        .collect();
    assert!(older.starts_with(&needlescope::record::CELLS_COLUMNS_BEFORE_DERIVED.join(",")));
    std::fs::write(&path, &older).unwrap();
    let back = RunRecords::read(run).unwrap();
    assert_eq!(back.cells, today_cells);
    assert!(
        back.notes
            .iter()
            .any(|n| n.contains("written by an older needlescope")),
        "{:?}",
        back.notes
    );
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        older,
        "report reads only"
    );
    let (store, done) = RunDir::create_or_resume(run, run_info(false)).unwrap();
    assert_eq!(done, today_cells);
    assert!(
        store
            .notes()
            .iter()
            .any(|n| n.contains("rewritten with the columns recalled")),
        "{:?}",
        store.notes()
    );
    drop(store);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), today);
    // Any other header is still refused.
    std::fs::write(&path, older.replacen("wall_seconds", "seconds", 1)).unwrap();
    assert!(matches!(
        RunRecords::read(run).err().unwrap(),
        ReportError::Header { .. }
    ));
}
