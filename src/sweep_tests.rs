//! Unit tests of `sweep.rs`.

use super::*;

fn run(disagreements: usize) -> ProbeRun {
    ProbeRun {
        cell_id: "L1024-d50-fp8-k64".into(),
        index: "fp8".into(),
        kv: "exact".into(),
        topk: 64,
        answer_text: String::new(),
        answer_correct: None,
        generated_ids: vec![],
        layers: vec![],
        attention: vec![],
        selection_disagreements: disagreements,
        selection_checks: 21,
        wall_seconds: 0.0,
    }
}

/// A run whose selection disagreed with its ranks is refused before its cell is appended.
#[test]
fn a_run_failing_its_internal_check_is_not_committed() {
    let mut committed = 0;
    let e = commit_checked(&run(2), || {
        committed += 1;
        Ok(())
    })
    .unwrap_err()
    .to_string();
    assert_eq!(committed, 0);
    assert!(e.contains("in run L1024-d50-fp8-k64"), "{e}");
    assert!(e.contains("at 2 of 21 (layer, position) checks"), "{e}");
    assert!(e.ends_with("the cell was not recorded"), "{e}");
    commit_checked(&run(0), || {
        committed += 1;
        Ok(())
    })
    .unwrap();
    assert_eq!(committed, 1);
}
