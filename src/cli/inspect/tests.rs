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
