//! Comparisons shared by the GPU emulator tests.

/// |x - y|, but 0 for equal values (infinities included) and +inf when exactly one is NaN:
/// `f32::max` skips NaN, so a plain fold would call a NaN output a perfect match.
pub fn gap(x: f32, y: f32) -> f32 {
    if x == y || (x.is_nan() && y.is_nan()) {
        0.0
    } else if x.is_nan() || y.is_nan() {
        f32::INFINITY
    } else {
        (x - y).abs()
    }
}

/// max |a-b| / max |b| (NaN-aware, see [`gap`]).
pub fn norm_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-30);
    a.iter().zip(b).fold(0f32, |m, (&x, &y)| m.max(gap(x, y))) / scale
}
