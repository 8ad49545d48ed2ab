//! `report` and a resumed `sweep` through the binary on a tiny planted sweep: CSVs re-saved with
//! CRLF line ends (Excel, a Windows editor) read like the originals; a duplicated cell is
//! refused with a non-zero exit and summary.json left as it was; a directory another process
//! writes to (holds `DIR/.lock`) is refused by `sweep` before anything is written, and `report`
//! only prints its table there.

use std::path::Path;
use std::process::Output;

use needlescope_testkit::planted as planted_support;
use planted_support::{bin, ok, planted};

fn refused(out: Output, what: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{what} succeeded: {stderr}");
    assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    stderr
}

/// A 4-cell sweep (512 tokens, depths 25 and 75, fp8, top-k 32 and 64).
fn sweep(out: &Path) -> Output {
    bin()
        .arg("sweep")
        .arg("--model")
        .arg(planted())
        .args(["--lengths", "512", "--depths", "25,75", "--index", "fp8"])
        .args([
            "--topk",
            "32,64",
            "--kv",
            "exact",
            "--generate",
            "0",
            "--out",
        ])
        .arg(out)
        .output()
        .unwrap()
}

fn report(dir: &Path) -> Output {
    bin().arg("report").arg(dir).output().unwrap()
}

fn cells_finished(dir: &Path) -> serde_json::Value {
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("summary.json")).unwrap()).unwrap();
    summary["cells_finished"].clone()
}

#[test]
fn report_and_resume_read_crlf_files_like_lf() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    ok(sweep(&out), "sweep");
    assert_eq!(cells_finished(&out), 4);
    for name in ["cells.csv", "layers.csv", "attention.csv"] {
        let path = out.join(name);
        let text = std::fs::read_to_string(&path).unwrap();
        let mut crlf = text.replace('\n', "\r\n");
        if name == "cells.csv" {
            crlf.pop(); // the last line ends in a bare CR
        }
        std::fs::write(&path, crlf).unwrap();
    }
    let stdout = ok(report(&out), "report");
    assert!(!stdout.contains("no finished cell"), "{stdout}");
    assert_eq!(cells_finished(&out), 4);
    let again = ok(sweep(&out), "resumed sweep");
    assert!(again.contains("0 cells run, 4 already finished"), "{again}");
    assert_eq!(cells_finished(&out), 4);
}

/// A depth whose shortest decimal has 17 digits goes into run.json, cells.csv and the cell id;
/// report and a resumed sweep must read it back as the same f64 (serde_json's default float
/// parser was one ulp off: "expected one of run.json sweep_args.depths [.., 99.9], found
/// 99.89999999999999", and the run could be neither reported nor resumed).
#[test]
fn a_depth_with_seventeen_digits_reads_back_exactly_for_report_and_resume() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let run = || {
        bin()
            .arg("sweep")
            .arg("--model")
            .arg(planted())
            .args(["--lengths", "512", "--depths", "99.89999999999999"])
            .args(["--index", "fp8", "--topk", "32", "--kv", "exact"])
            .args(["--generate", "0", "--out"])
            .arg(&out)
            .output()
            .unwrap()
    };
    ok(run(), "sweep");
    let cells = std::fs::read_to_string(out.join("cells.csv")).unwrap();
    assert!(
        cells.contains("L512-d99.89999999999999-fp8-k32-s0"),
        "{cells}"
    );
    ok(report(&out), "report");
    assert_eq!(cells_finished(&out), 1);
    let again = ok(run(), "resumed sweep");
    assert!(again.contains("0 cells run, 1 already finished"), "{again}");
}

#[test]
fn report_and_resume_refuse_a_duplicated_cell_and_keep_summary() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    ok(sweep(&out), "sweep");
    let cells = out.join("cells.csv");
    let text = std::fs::read_to_string(&cells).unwrap();
    let second = text.lines().nth(2).unwrap().to_string();
    let id = second.split(',').next().unwrap().to_string();
    assert!(id.starts_with("L512-d") && id.ends_with("-s0"), "{id}");
    std::fs::write(&cells, format!("{text}{second}\n")).unwrap();
    let summary = std::fs::read(out.join("summary.json")).unwrap();
    let stderr = refused(report(&out), "report");
    assert!(
        stderr.contains("cells.csv, line 6, cell_id: expected one row per cell")
            && stderr.contains(&format!("found {id} again (first at line 3)")),
        "{stderr}"
    );
    assert_eq!(std::fs::read(out.join("summary.json")).unwrap(), summary);
    let stderr = refused(sweep(&out), "resumed sweep");
    assert!(stderr.contains("cells.csv, line 6"), "{stderr}");
    assert_eq!(std::fs::read(out.join("summary.json")).unwrap(), summary);
}

/// While another writer holds the directory, `sweep` is refused and `report` prints the
/// table of the cells finished so far, writing nothing.
#[test]
fn sweep_is_refused_and_report_only_reads_while_another_writer_holds_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    ok(sweep(&out), "sweep");
    let cells_before = std::fs::read(out.join("cells.csv")).unwrap();
    let summary_before = std::fs::read(out.join("summary.json")).unwrap();
    let held = needlescope::report::DirLock::acquire(&out).unwrap();
    let want = format!(
        "another needlescope is writing {} (lock {} held); wait for it to finish",
        out.display(),
        out.join(".lock").display()
    );
    let read_only = report(&out);
    let stderr = String::from_utf8_lossy(&read_only.stderr).into_owned();
    let table = ok(read_only, "report while another writer holds the directory");
    assert!(
        stderr.contains(
            "another needlescope is writing there; the table below is of the cells finished so far"
        ),
        "{stderr}"
    );
    assert!(table.contains("fp8") && !table.contains("wrote"), "{table}");
    let stderr = refused(sweep(&out), "sweep");
    assert!(stderr.contains(&want), "{stderr}");
    assert_eq!(std::fs::read(out.join("cells.csv")).unwrap(), cells_before);
    assert_eq!(
        std::fs::read(out.join("summary.json")).unwrap(),
        summary_before
    );
    drop(held);
    ok(report(&out), "report after the writer ended");
}

/// `--out` naming an existing file: sweep and demo say so, naming the flag, and leave the
/// file as it was (they said "File exists (os error 17)").
#[test]
fn out_that_is_a_file_is_refused_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("afile");
    std::fs::write(&file, "keep me").unwrap();
    let e = refused(sweep(&file), "sweep --out FILE");
    assert!(
        e.contains("afile") && e.contains("report directory (--out)"),
        "{e}"
    );
    assert!(
        e.contains("expected a directory") && e.contains("found a file"),
        "{e}"
    );
    let out = bin().arg("demo").arg("--out").arg(&file).output().unwrap();
    let e = refused(out, "demo --out FILE");
    assert!(
        e.contains("--out") && e.contains("is a file, expected a directory"),
        "{e}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
}

/// The records of `dir` as sorted lines, cells.csv without its wall_seconds column (the only
/// one a recomputed cell may change).
fn records_without_times(dir: &Path) -> Vec<Vec<String>> {
    ["cells.csv", "layers.csv", "attention.csv"]
        .iter()
        .map(|name| {
            let text = std::fs::read_to_string(dir.join(name)).unwrap();
            let wall = text
                .lines()
                .next()
                .unwrap()
                .split(',')
                .position(|c| c == "wall_seconds");
            let mut lines: Vec<String> = text
                .lines()
                .map(|l| {
                    let mut fields: Vec<&str> = l.split(',').collect();
                    if *name == "cells.csv" {
                        fields.remove(wall.unwrap());
                    }
                    fields.join(",")
                })
                .collect();
            lines.sort();
            lines
        })
        .collect()
}

/// Damage a kill cannot cause (a layers.csv row deleted, the end of layers.csv cut off,
/// layers.csv, attention.csv or cells.csv deleted): `report` refuses, naming the file and the cell, and leaves
/// summary.json alone; the same sweep run again says what it found, computes the damaged cells
/// again and ends with the records of the undamaged run. (Before, report rendered what was
/// left without a word and resume called the run finished, or silently started over.)
#[test]
fn damaged_records_are_refused_by_report_and_computed_again_on_resume() {
    let dir = tempfile::tempdir().unwrap();
    let clean = dir.path().join("clean");
    ok(sweep(&clean), "sweep");
    let want = records_without_times(&clean);
    let layers_text = std::fs::read_to_string(clean.join("layers.csv")).unwrap();
    let lines: Vec<&str> = layers_text.lines().collect();
    // Each cell has 4 rows: 2 CSA layers, each under fp8 and under exact (scored by itself).
    let victim = lines[3];
    let victim_cell = victim.split(',').next().unwrap().to_string();

    type Damage = fn(&Path, &str);
    let cases: [(&str, Damage, &str, &str); 5] = [
        (
            "a middle layers.csv row deleted",
            |run, victim| {
                let text = std::fs::read_to_string(run.join("layers.csv")).unwrap();
                let kept: String = text
                    .lines()
                    .filter(|l| *l != victim)
                    .map(|l| format!("{l}\n"))
                    .collect();
                std::fs::write(run.join("layers.csv"), kept).unwrap();
            },
            "layers.csv: finished cell VICTIM: 3 of its 4 rows; missing layer",
            "cell VICTIM: layers.csv, 3 of its 4 rows; missing layer",
        ),
        (
            "the end of layers.csv cut off",
            |run, _| {
                let path = run.join("layers.csv");
                let len = std::fs::metadata(&path).unwrap().len();
                let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                f.set_len(len - 30).unwrap();
            },
            "layers.csv: finished cell LAST: 3 of its 4 rows; missing layer",
            "cell LAST: layers.csv, 3 of its 4 rows; missing layer",
        ),
        (
            "layers.csv deleted",
            |run, _| std::fs::remove_file(run.join("layers.csv")).unwrap(),
            "layers.csv: finished cell FIRST: no rows; the files were edited or damaged",
            "cell FIRST: layers.csv, no rows; it is computed again",
        ),
        (
            "attention.csv deleted",
            |run, _| std::fs::remove_file(run.join("attention.csv")).unwrap(),
            "attention.csv: finished cell FIRST: no rows; the files were edited or damaged",
            "cell FIRST: attention.csv, no rows; it is computed again",
        ),
        (
            "cells.csv deleted",
            |run, _| std::fs::remove_file(run.join("cells.csv")).unwrap(),
            "cells.csv: layers.csv or attention.csv holds rows of 4 cells that cells.csv does not list",
            "dropped the rows of 4 cells that cells.csv does not list",
        ),
    ];
    let cell_ids: Vec<String> = std::fs::read_to_string(clean.join("cells.csv"))
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| l.split(',').next().unwrap().to_string())
        .collect();
    let name = |s: &str| {
        s.replace("VICTIM", &victim_cell)
            .replace("FIRST", &cell_ids[0])
            .replace("LAST", &cell_ids[3])
    };
    for (i, (what, damage, refusal, note)) in cases.iter().enumerate() {
        let run = dir.path().join(format!("run{i}"));
        copy_dir(&clean, &run);
        damage(&run, victim);
        let summary = std::fs::read(run.join("summary.json")).unwrap();
        let stderr = refused(report(&run), what);
        assert!(stderr.contains(&name(refusal)), "{what}: {stderr}");
        assert!(
            stderr.contains("running the same command again computes those cells again"),
            "{what}: {stderr}"
        );
        assert_eq!(
            std::fs::read(run.join("summary.json")).unwrap(),
            summary,
            "{what}"
        );
        let again = ok(sweep(&run), what);
        assert!(again.contains(&name(note)), "{what}: {again}");
        assert_eq!(records_without_times(&run), want, "{what}");
        ok(report(&run), what);
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

/// A sweep stopped before its last cell committed (its layers.csv rows written, its cells.csv
/// row not): report says how many of the grid's cells are finished, notes the stopped cell's
/// rows it left out, and summary.json records the plan.
#[test]
fn report_on_a_stopped_sweep_says_how_many_cells_are_finished() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    ok(sweep(&out), "sweep");
    let cells = out.join("cells.csv");
    let text = std::fs::read_to_string(&cells).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    let last = lines.pop().unwrap();
    let last_id = last.split(',').next().unwrap();
    std::fs::write(&cells, lines.join("\n") + "\n").unwrap();
    let stopped_plot = out.join(format!(
        "layers_{}.png",
        needlescope::record::file_stem(last_id)
    ));
    assert!(stopped_plot.is_file());
    // The temporary of a render cut short.
    let partial = out.join(".heatmap_fp8_64.png.partial.png");
    std::fs::write(&partial, b"torn").unwrap();
    let first = report(&out);
    let stderr = String::from_utf8_lossy(&first.stderr).to_string();
    let stdout = ok(first, "report");
    // The directory shows exactly its records: no plot of the unfinished cell, no temporary.
    assert!(!stopped_plot.exists() && !partial.exists());
    let pngs: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".png"))
        .collect();
    assert!(pngs.iter().all(|n| !n.starts_with('.')), "{pngs:?}");
    assert!(
        stdout.contains(&format!(
            "3 of 4 cells finished (the run stopped early; the same sweep command with --out {} \
             resumes it)",
            out.display()
        )),
        "{stdout}"
    );
    assert!(
        stderr.contains(&format!(
            "rows of cell {last_id}, which cells.csv does not list"
        )),
        "{stderr}"
    );
    assert_eq!(cells_finished(&out), 3);
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["cells_planned"], 4);
    let again = ok(sweep(&out), "resumed sweep");
    assert!(
        again.contains(&format!("dropped the rows of cell {last_id}")),
        "{again}"
    );
    let stdout = ok(report(&out), "report after the resume");
    assert!(!stdout.contains("cells finished"), "{stdout}");
}
