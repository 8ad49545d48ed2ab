//! What `report` and a resume accept from a report directory beyond parsing: CSV files re-saved
//! with CRLF line ends read exactly like the store's own; a complete line that is not
//! understood is an error, never skipped; a duplicated or inconsistent cell, an impossible
//! value or a cell outside run.json's grid is refused naming file, line and field; and only one
//! writer holds a directory at a time (`DIR/.lock`).

use needlescope_testkit::report as report_support;

use std::io::Write;
use std::path::Path;

use needlescope::numerics::modes::{IndexProfile, KvMode};
use needlescope::record::{AttentionRecord, CellRecord, LayerRecord, RunInfo};
use needlescope::report::{rerender, ReportError, RunDir, RunRecords};
use report_support::*;

/// run.json of a real sweep: `sweep_args` is a `SweepPlan` (lengths 2048 and 4096, depths 0, 50
/// and 100, profiles fp8 and bf16, top-k 512 and 1024, kv fp8, two samples).
fn sweep_info() -> RunInfo {
    let mut info = run_info(false);
    info.sweep_args = serde_json::json!({
        "scenario": "passkey",
        "lengths": [2048, 4096],
        "depths": [0.0, 50.0, 100.0],
        "indexes": ["fp8", "bf16"],
        "topks": [512, 1024],
        "kv": "fp8",
        "samples": 2,
        "seed": 0,
        "generate": 24,
    });
    info
}

/// run.json of `probe --out` (kv fp8).
fn probe_info() -> RunInfo {
    let mut info = run_info(false);
    info.sweep_args = serde_json::json!({
        "command": "probe", "kv": "fp8", "seed": 0, "generate": 24,
        "compare": [], "probe": "answer",
    });
    info
}

/// A sweep cell with the id the sweep gives it.
fn sweep_cell(length: usize, depth: f64, index: IndexProfile, topk: usize, s: usize) -> CellRecord {
    let id = format!("L{length}-d{depth}-{}-k{topk}-s{s}", index.name());
    cell(&id, length, depth, index, topk)
}

type Cell = (CellRecord, Vec<LayerRecord>, Vec<AttentionRecord>);

/// Four valid sweep cells with layer and attention rows.
fn sweep_cells() -> Vec<Cell> {
    [
        (2048, 0.0, IndexProfile::SglangFp8, 512, 0),
        (2048, 50.0, IndexProfile::SglangBf16Keys, 1024, 1),
        (4096, 100.0, IndexProfile::SglangFp8, 1024, 0),
        (4096, 50.0, IndexProfile::SglangFp8, 512, 1),
    ]
    .into_iter()
    .map(|(l, d, i, k, s)| {
        let c = sweep_cell(l, d, i, k, s);
        let id = c.cell_id.clone();
        let (c, rows) = agreeing(c, grid_layers(&id));
        (c, rows, vec![attention(&id, 2)])
    })
    .collect()
}

/// A cell's layers.csv rows as the probe writes them: every CSA layer (2 and 4 here) under
/// every profile (fp8 driving, bf16 compared) at the probed position.
fn grid_layers(id: &str) -> Vec<LayerRecord> {
    vec![
        layer(id, 2, "fp8", true, 3),
        layer(id, 2, "bf16", false, 4),
        layer(id, 4, "fp8", true, 6),
        layer(id, 4, "bf16", false, 5),
    ]
}

fn write_run(dir: &Path, info: RunInfo, cells: &[Cell]) {
    let (mut store, _) = RunDir::create_or_resume(dir, info).unwrap();
    for (c, l, a) in cells {
        store.append_cell(c, l, a).unwrap();
    }
}

/// One CSV line of `record` (no header).
fn csv_line<T: serde::Serialize>(record: &T) -> Vec<u8> {
    let mut w = csv::WriterBuilder::new()
        .has_headers(false)
        .from_writer(Vec::new());
    w.serialize(record).unwrap();
    w.into_inner().unwrap()
}

fn append_bytes(path: &Path, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    f.write_all(bytes).unwrap();
}

/// Rewrites `name` in `dir` with CRLF line ends; `final_lf: false` drops the last `\n`
/// (the file then ends in a bare CR).
fn to_crlf(dir: &Path, name: &str, final_lf: bool) {
    let path = dir.join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains('\r'));
    let mut crlf = text.replace('\n', "\r\n");
    if !final_lf {
        crlf.pop();
    }
    std::fs::write(&path, crlf).unwrap();
}

fn invalid(err: ReportError) -> (u64, String, String, String) {
    match err {
        ReportError::Invalid {
            line,
            field,
            expected,
            found,
            path,
        } => {
            assert!(path.ends_with("cells.csv"), "{}", path.display());
            (line, field, expected, found)
        }
        other => panic!("expected ReportError::Invalid, found {other}"),
    }
}

#[test]
fn crlf_files_read_exactly_like_lf_for_report_and_resume() {
    for final_lf in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path();
        let cells = sweep_cells();
        write_run(run, sweep_info(), &cells[..3]);
        let lf = RunRecords::read(run).unwrap();
        assert_eq!(lf.cells.len(), 3);
        for name in ["cells.csv", "layers.csv", "attention.csv"] {
            to_crlf(run, name, final_lf);
        }
        let crlf = RunRecords::read(run).unwrap();
        assert_eq!(crlf.cells, lf.cells, "final_lf {final_lf}");
        assert_eq!(crlf.layers, lf.layers, "final_lf {final_lf}");
        assert_eq!(crlf.attention, lf.attention, "final_lf {final_lf}");
        assert!(crlf.notes.is_empty(), "{:?}", crlf.notes);

        // Resume: every cell is finished, nothing is dropped, and a new cell lands once.
        let (mut store, done) = RunDir::create_or_resume(run, sweep_info()).unwrap();
        assert_eq!(done, lf.cells, "final_lf {final_lf}");
        let (c, l, a) = &cells[3];
        store.append_cell(c, l, a).unwrap();
        drop(store);
        let back = RunRecords::read(run).unwrap();
        assert_eq!(back.cells.len(), 4);
        assert_eq!(back.layers.len(), 4 * grid_layers("x").len());
        assert_eq!(back.attention.len(), 4);
        let summary: serde_json::Value =
            serde_json::from_slice(&std::fs::read(run.join("summary.json")).unwrap()).unwrap();
        assert_eq!(summary["cells_finished"], 4);
    }
}

/// A row that is complete (terminated) but does not parse is an error even as the last line:
/// only a line without its terminator is a torn tail. A garbage header is an error even
/// without a newline. `rerender` then writes nothing.
#[test]
fn a_complete_line_that_does_not_parse_is_an_error_even_last() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path();
    write_run(run, sweep_info(), &sweep_cells()[..2]);
    rerender(run, false).unwrap();
    let summary_before = std::fs::read(run.join("summary.json")).unwrap();
    append_bytes(&run.join("cells.csv"), b"L2048-d0-fp8-k512-s1,what\n");
    let msg = RunRecords::read(run).err().unwrap().to_string();
    assert!(msg.contains("cells.csv, line 4"), "{msg}");
    assert!(rerender(run, false).is_err());
    assert_eq!(
        std::fs::read(run.join("summary.json")).unwrap(),
        summary_before
    );
    assert!(RunDir::create_or_resume(run, sweep_info()).is_err());

    std::fs::write(run.join("layers.csv"), b"not,a,header").unwrap();
    std::fs::write(run.join("cells.csv"), b"").unwrap();
    let err = RunRecords::read(run).err().unwrap();
    assert!(matches!(err, ReportError::Header { .. }), "{err}");
}

/// A torn last line (a kill) is still left out, and said so.
#[test]
fn a_torn_last_line_is_left_out_with_a_note() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path();
    let cells = sweep_cells();
    write_run(run, sweep_info(), &cells[..2]);
    let row = csv_line(&cells[2].0);
    append_bytes(&run.join("cells.csv"), &row[..row.len() - 1]);
    let read = RunRecords::read(run).unwrap();
    assert_eq!(read.cells.len(), 2);
    assert_eq!(read.notes.len(), 1, "{:?}", read.notes);
    assert!(
        read.notes[0].contains("cells.csv, line 4") && read.notes[0].contains("incomplete"),
        "{:?}",
        read.notes
    );
}

/// A quote opened at the start of a field mid-file (a hand edit) is named at its line, not
/// taken for a run's torn last record (which would leave every later cell's layer rows
/// orphaned); a quote inside an unquoted field is a plain character, as the csv crate reads it.
#[test]
fn an_unclosed_quote_is_named_at_its_line_and_a_quote_inside_a_field_is_text() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path();
    let cells = sweep_cells();
    write_run(run, sweep_info(), &cells);
    let path = run.join("cells.csv");
    let text = std::fs::read_to_string(&path).unwrap();
    let with_answer = |answer: &str| {
        let mut lines: Vec<String> = text.lines().map(String::from).collect();
        let mut fields: Vec<String> = lines[2].split(',').map(String::from).collect();
        fields[11] = answer.to_string();
        lines[2] = fields.join(",");
        lines.join("\n") + "\n"
    };
    std::fs::write(&path, with_answer("\"oops")).unwrap();
    let err = RunRecords::read(run).err().unwrap().to_string();
    assert!(
        err.contains("cells.csv, line 3: a quoted field opens on this line and never closes"),
        "{err}"
    );
    std::fs::write(&path, with_answer("oo\"ps")).unwrap();
    let read = RunRecords::read(run).unwrap();
    assert_eq!(read.cells.len(), cells.len());
    assert_eq!(read.cells[1].answer_text, "oo\"ps");
    assert!(read.notes.is_empty(), "{:?}", read.notes);
}

#[test]
fn a_duplicated_cell_id_is_refused_by_report_and_resume() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path();
    let cells = sweep_cells();
    write_run(run, sweep_info(), &cells);
    append_bytes(&run.join("cells.csv"), &csv_line(&cells[1].0));
    let (line, field, expected, found) = invalid(RunRecords::read(run).err().unwrap());
    assert_eq!((line, field.as_str()), (6, "cell_id"));
    assert_eq!(expected, "one row per cell");
    assert_eq!(found, "L2048-d50-bf16-k1024-s1 again (first at line 3)");
    let msg = RunDir::create_or_resume(run, sweep_info())
        .err()
        .unwrap()
        .to_string();
    assert!(
        msg.contains("cells.csv, line 6, cell_id: expected one row per cell"),
        "{msg}"
    );
}

/// Every way a sweep cell can contradict its id or run.json's grid, each found by report and
/// resume with its line and field; `append_cell` refuses the same cells before writing.
#[test]
fn sweep_cells_must_match_their_id_and_the_grid() {
    type Edit = fn(&mut CellRecord);
    let cases: [(&str, Edit, &str); 9] = [
        ("cell_id", |c| c.depth_pct = 0.0, "L2048-d0-fp8-k512-s0"),
        (
            "cell_id",
            |c| c.cell_id = "L2048-d50-fp8-k512-s2".into(),
            "-s<0..1>",
        ),
        (
            "cell_id",
            |c| c.cell_id = "L2048-d50-fp8-k512".into(),
            "-s<0..1>",
        ),
        (
            "target_tokens",
            |c| {
                c.target_tokens = 8192;
                c.prompt_tokens = 8192;
                c.cell_id = "L8192-d50-fp8-k512-s0".into();
            },
            "sweep_args.lengths [2048, 4096]",
        ),
        (
            "prompt_tokens",
            |c| c.prompt_tokens = 2047,
            "target_tokens (2048)",
        ),
        (
            "depth_pct",
            |c| {
                c.depth_pct = 25.0;
                c.cell_id = "L2048-d25-fp8-k512-s0".into();
            },
            "sweep_args.depths",
        ),
        (
            "index",
            |c| {
                c.index = IndexProfile::Exact;
                c.cell_id = "L2048-d50-exact-k512-s0".into();
            },
            "sweep_args.indexes [\"fp8\", \"bf16\"]",
        ),
        (
            "topk",
            |c| {
                c.topk = 256;
                c.cell_id = "L2048-d50-fp8-k256-s0".into();
            },
            "sweep_args.topks [512, 1024]",
        ),
        (
            "kv",
            |c| c.kv = KvMode::Exact,
            "fp8 (run.json sweep_args.kv)",
        ),
    ];
    for (want_field, edit, want_expected) in cases {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path();
        let cells = sweep_cells();
        write_run(run, sweep_info(), &cells[..1]);
        let mut bad = sweep_cell(2048, 50.0, IndexProfile::SglangFp8, 512, 0);
        edit(&mut bad);
        append_bytes(&run.join("cells.csv"), &csv_line(&bad));
        let (line, field, expected, found) = invalid(RunRecords::read(run).err().unwrap());
        assert_eq!(
            (line, field.as_str()),
            (3, want_field),
            "{expected} / {found}"
        );
        assert!(expected.contains(want_expected), "{field}: {expected}");
        assert!(RunDir::create_or_resume(run, sweep_info()).is_err());

        let other = tempfile::tempdir().unwrap();
        let (mut store, _) = RunDir::create_or_resume(other.path(), sweep_info()).unwrap();
        let (_, field, ..) = invalid(store.append_cell(&bad, &[], &[]).err().unwrap());
        assert_eq!(field, want_field);
        drop(store);
        assert!(RunRecords::read(other.path()).unwrap().cells.is_empty());
    }
}

#[test]
fn probe_cells_have_ids_without_a_sample() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path();
    let good = cell(
        "L2048-d50-fp8-k512",
        2048,
        50.0,
        IndexProfile::SglangFp8,
        512,
    );
    let att = vec![attention(&good.cell_id, 2)];
    let rows = grid_layers(&good.cell_id);
    let (good, rows) = agreeing(good, rows);
    write_run(run, probe_info(), &[(good, rows, att)]);
    assert_eq!(RunRecords::read(run).unwrap().cells.len(), 1);
    let bad = cell(
        "L2048-d50-fp8-k512-s0",
        2048,
        50.0,
        IndexProfile::SglangFp8,
        1024,
    );
    append_bytes(&run.join("cells.csv"), &csv_line(&bad));
    let (line, field, expected, found) = invalid(RunRecords::read(run).err().unwrap());
    assert_eq!((line, field.as_str()), (3, "cell_id"));
    assert!(expected.starts_with("L2048-d50-fp8-k1024 "), "{expected}");
    assert_eq!(found, "L2048-d50-fp8-k512-s0");
}

/// Impossible values are refused whatever wrote run.json (here a hand-made one whose
/// `sweep_args` is no sweep plan, so ids are free).
#[test]
fn impossible_values_are_refused_naming_the_field() {
    type Edit = fn(&mut CellRecord);
    let cases: [(&str, Edit, &str); 8] = [
        ("min_needle_rank", |c| c.min_needle_rank = Some(0), "0"),
        ("needle_end", |c| c.needle_end = 2049, "100..2049"),
        ("answer_end", |c| c.answer_end = 119, "120..119"),
        ("csa_layers_selected", |c| c.csa_layers_selected = 22, "22"),
        ("depth_pct", |c| c.depth_pct = f64::NAN, "NaN"),
        ("depth_pct", |c| c.depth_pct = 100.5, "100.5"),
        ("depth_pct", |c| c.depth_pct = -1.0, "-1"),
        ("topk", |c| c.topk = 0, "0"),
    ];
    for (want_field, edit, want_found) in cases {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path();
        let first = cell("first", 2048, 50.0, IndexProfile::SglangFp8, 512);
        write_run(run, run_info(false), &[(first, vec![], vec![])]);
        let mut bad = cell("second", 2048, 50.0, IndexProfile::SglangFp8, 512);
        edit(&mut bad);
        append_bytes(&run.join("cells.csv"), &csv_line(&bad));
        let (line, field, _, found) = invalid(RunRecords::read(run).err().unwrap());
        assert_eq!(
            (line, field.as_str(), found.as_str()),
            (3, want_field, want_found)
        );
        let msg = RunDir::create_or_resume(run, run_info(false))
            .err()
            .unwrap()
            .to_string();
        assert!(
            msg.contains(&format!("line 3, {want_field}: expected")),
            "{msg}"
        );
    }
}

/// The derived columns (`recalled`, `exact_keeps`, `sample`) are the store's: whatever a
/// caller passes, the row holds what follows from the cell and its layers.csv rows, and a
/// hand edit of any of them is refused by report and resume, naming the field.
#[test]
fn derived_columns_follow_the_row_and_an_edit_is_refused() {
    let mut cells = sweep_cells();
    // Cell 1 loses layer 4 (rank 6 > k 5) where exact keeps it (rank 2): one rounding loss.
    cells[1].0.topk = 5;
    cells[1].0.cell_id = "L2048-d50-bf16-k5-s1".into();
    let id = cells[1].0.cell_id.clone();
    let mut rows = grid_layers(&id);
    rows.push(layer(&id, 2, "exact", false, 1));
    rows.push(layer(&id, 4, "exact", false, 2));
    // Judged by the indexer (no answer verdict); what a caller says is not what is written.
    cells[1].0.answer_correct = None;
    cells[1].0.recalled = Some(true);
    cells[1].0.sample = Some(7);
    let (c, rows) = agreeing(cells[1].0.clone(), rows);
    cells[1] = (c, rows, vec![attention(&id, 2)]);
    let dir = tempfile::tempdir().unwrap();
    let mut info = sweep_info();
    info.sweep_args["topks"] = serde_json::json!([512, 1024, 5]);
    write_run(dir.path(), info.clone(), &cells);
    let back = RunRecords::read(dir.path()).unwrap();
    let derived: Vec<(Option<bool>, Option<usize>, Option<usize>)> = back
        .cells
        .iter()
        .map(|c| (c.recalled, c.exact_keeps, c.sample))
        .collect();
    assert_eq!(
        derived,
        [
            (Some(true), None, Some(0)),
            (Some(false), Some(1), Some(1)),
            (Some(true), None, Some(0)),
            (Some(true), None, Some(1)),
        ]
    );
    type Edit = fn(&mut CellRecord);
    let cases: [(&str, Edit, u64); 4] = [
        ("recalled", |c| c.recalled = Some(true), 3),
        ("recalled", |c| c.recalled = None, 3),
        ("sample", |c| c.sample = Some(0), 3),
        ("exact_keeps", |c| c.exact_keeps = Some(2), 3),
    ];
    for (field, edit, line) in cases {
        let run = tempfile::tempdir().unwrap();
        write_run(run.path(), info.clone(), &cells);
        let path = run.path().join("cells.csv");
        let text = std::fs::read_to_string(&path).unwrap();
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        let mut bad = back.cells[1].clone();
        edit(&mut bad);
        lines[line as usize - 1] = String::from_utf8(csv_line(&bad)).unwrap().trim_end().into();
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        let err = RunRecords::read(run.path()).err().unwrap();
        let (at, named, ..) = invalid(err);
        assert_eq!((at, named.as_str()), (line, field));
        assert!(RunDir::create_or_resume(run.path(), info.clone()).is_err());
    }
    // An exact_keeps within the lost layers but not what layers.csv says: the cross-file check.
    let run = tempfile::tempdir().unwrap();
    write_run(run.path(), info.clone(), &cells);
    let path = run.path().join("cells.csv");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replacen(",1,1\n", ",0,1\n", 1)).unwrap();
    let msg = RunRecords::read(run.path()).err().unwrap().to_string();
    assert!(
        msg.contains("exact_keeps of cell L2048-d50-bf16-k5-s1") && msg.contains("expected 1"),
        "{msg}"
    );
}

/// Line numbers count physical lines: a quoted answer holding a newline takes two.
#[test]
fn line_numbers_count_newlines_inside_answers() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path();
    let mut cells = sweep_cells();
    cells[0].0.answer_text = "one\ntwo".into();
    write_run(run, sweep_info(), &cells[..2]);
    append_bytes(&run.join("cells.csv"), &csv_line(&cells[1].0));
    let (line, ..) = invalid(RunRecords::read(run).err().unwrap());
    assert_eq!(line, 5);
    // And the store counts them too when it refuses an append.
    let other = tempfile::tempdir().unwrap();
    write_run(other.path(), sweep_info(), &cells[..2]);
    let (mut store, _) = RunDir::create_or_resume(other.path(), sweep_info()).unwrap();
    let mut bad = cells[2].0.clone();
    bad.topk = 0;
    let (line, ..) = invalid(store.append_cell(&bad, &[], &[]).err().unwrap());
    assert_eq!(line, 5);
}

#[test]
fn a_second_writer_is_refused_until_the_first_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path();
    let (mut first, _) = RunDir::create_or_resume(run, sweep_info()).unwrap();
    let err = RunDir::create_or_resume(run, sweep_info()).err().unwrap();
    assert!(matches!(err, ReportError::Locked { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        format!(
            "another needlescope is writing {} (lock {} held); wait for it to finish",
            run.display(),
            run.join(".lock").display()
        )
    );
    // `report` rewrites summary.json and the PNGs: refused too.
    let msg = rerender(run, false).err().unwrap().to_string();
    assert!(msg.contains("another needlescope is writing"), "{msg}");
    // The holder keeps writing undisturbed.
    let (c, l, a) = &sweep_cells()[0];
    first.append_cell(c, l, a).unwrap();
    drop(first);
    let (second, done) = RunDir::create_or_resume(run, sweep_info()).unwrap();
    assert_eq!(done.len(), 1);
    drop(second);
    rerender(run, false).unwrap();
}

/// A layers.csv or attention.csv row that contradicts itself (a rank past the visible rows, a
/// margin that is not score minus k-th score, a share above 1) is refused by `report` and by a
/// resume naming the file, line and field; the store refuses to write such a row at all.
#[test]
fn inconsistent_layer_and_attention_rows_are_refused() {
    type LayerEdit = fn(&mut LayerRecord);
    let layer_cases: [(&str, LayerEdit, &str); 3] = [
        ("needle_rank", |r| r.needle_rank = Some(2000), "2000"),
        ("margin", |r| r.margin = Some(0.5), "0.5"),
        ("needle_score", |r| r.needle_score = None, "(empty)"),
    ];
    for (field, edit, found) in layer_cases {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path();
        let mut cells = sweep_cells();
        write_run(run, sweep_info(), &cells[..1]);
        edit(&mut cells[1].1[1]);
        // The store refuses the row before writing anything of its cell.
        let (mut store, _) = RunDir::create_or_resume(run, sweep_info()).unwrap();
        let (c, l, a) = &cells[1];
        let err = store.append_cell(c, l, a).err().unwrap().to_string();
        assert!(
            err.contains("layers.csv: ")
                && err.contains(&format!("{field} of the row of cell {}", c.cell_id))
                && err.ends_with(&format!("found {found}")),
            "{err}"
        );
        drop(store);
        let lines = |name: &str| {
            std::fs::read_to_string(run.join(name))
                .unwrap()
                .lines()
                .count()
        };
        assert_eq!((lines("cells.csv"), lines("layers.csv")), (2, 5));
        // A row written by hand: line 2 + 4 rows of the first cell + its second row = line 7.
        append_bytes(&run.join("layers.csv"), &csv_line(&cells[1].1[0]));
        append_bytes(&run.join("layers.csv"), &csv_line(&cells[1].1[1]));
        for err in [
            RunRecords::read(run).err().unwrap(),
            RunDir::create_or_resume(run, sweep_info()).err().unwrap(),
        ] {
            match err {
                ReportError::Invalid {
                    path,
                    line,
                    field: got,
                    found: got_found,
                    ..
                } => {
                    assert!(path.ends_with("layers.csv"), "{}", path.display());
                    assert_eq!((line, got.as_str(), got_found.as_str()), (7, field, found));
                }
                other => panic!("{field}: expected ReportError::Invalid, found {other}"),
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path();
    let cells = sweep_cells();
    write_run(run, sweep_info(), &cells[..1]);
    let mut bad = cells[0].2[0].clone();
    bad.needle_mass_max_head = 1.5;
    append_bytes(&run.join("attention.csv"), &csv_line(&bad));
    let msg = RunRecords::read(run).err().unwrap().to_string();
    assert!(
        msg.contains("attention.csv, line 3, needle_mass_max_head: expected a share between 0 and 1, found 1.5"),
        "{msg}"
    );
}

/// A cell the store refused for an inconsistent row is not taken as written: the same cell
/// with consistent rows is then accepted (not refused as a second row of that cell_id).
#[test]
fn a_cell_refused_for_its_rows_can_be_appended_once_fixed() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path();
    let (c, l, a) = sweep_cells().swap_remove(0);
    let mut broken = l.clone();
    broken[0].needle_rank = Some(5000);
    let (mut store, _) = RunDir::create_or_resume(run, sweep_info()).unwrap();
    assert!(store.append_cell(&c, &broken, &a).is_err());
    store.append_cell(&c, &l, &a).unwrap();
    drop(store);
    assert_eq!(RunRecords::read(run).unwrap().cells, vec![c]);
}
