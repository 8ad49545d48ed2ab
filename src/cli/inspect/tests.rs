//! Unit tests of the inspect rendering helpers.

use super::*;

#[test]
fn ranges_compact_arithmetic_runs() {
    assert_eq!(compact_ranges(&[0, 1]), "0-1");
    assert_eq!(compact_ranges(&[2]), "2");
    let csa: Vec<usize> = std::iter::once(2).chain((4..=42).step_by(2)).collect();
    assert_eq!(compact_ranges(&csa), "2-42/2");
    assert_eq!(compact_ranges(&[3, 5, 7, 41]), "3-7/2, 41");
    assert_eq!(compact_ranges(&[1, 3]), "1, 3");
    assert_eq!(compact_ranges(&[]), "");
}

#[test]
fn roles_group_by_role_not_by_run() {
    let roles = crate::config::ModelConfig::tiny().layer_roles();
    let rows = super::build::role_rows(&roles);
    let groups: Vec<(String, Vec<usize>)> = text::role_groups(&rows)
        .into_iter()
        .map(|(k, layers)| (k.join(" "), layers))
        .collect();
    assert_eq!(
        groups,
        vec![
            ("SWA 0 - - -".to_string(), vec![0]),
            ("CSA 4 own own -".to_string(), vec![1, 3]),
            ("HCA 128 own - -".to_string(), vec![2]),
        ]
    );
}
