//! Parity of a backend with the CPU reference: every op on fresh random inputs ([`ops`]) and
//! whole forward passes (`crate::run::parity`, which drives two engines), reported as [`Check`]s with a normalised error and the
//! threshold it must meet.
//!
//! Used by `tests/backend/emu_parity.rs` (the GPU backend's logic on the host emulator, on CI) and
//! `tests/gpu/main.rs` (real GPUs, ignored by default, run by `scripts/gpu-check.sh`).
//!
//! Error measure: `max |got - want| / max |want|` over an op's outputs (a relative error that
//! does not blow up at small elements); `want` is never all zeros (inputs are drawn away from
//! zero and checked). Selections are compared as sets, a difference counting only when the
//! reference scores of the differing rows are not within the score tolerance of the k-th score
//! (ties and near-ties aside).

pub mod ops;

/// One comparison.
#[derive(Clone, Debug)]
pub struct Check {
    /// What was compared (`matmul [37x96]`, `L1 index scores exact chunk 7`, ...).
    pub what: String,
    pub error: f64,
    pub threshold: f64,
}

impl Check {
    pub fn passed(&self) -> bool {
        self.error.is_finite() && self.error <= self.threshold
    }
}

/// A table of checks, one per line, failures marked.
pub fn table(checks: &[Check]) -> String {
    let mut s = String::new();
    for c in checks {
        s.push_str(&format!(
            "{:<4} {:<60} error {:>10.3e}  threshold {:>8.1e}\n",
            if c.passed() { "ok" } else { "FAIL" },
            c.what,
            c.error,
            c.threshold
        ));
    }
    s
}

/// `max |got - want| / max |want|`; infinite on a length mismatch or a NaN, NaN-free -inf
/// positions must match exactly.
pub fn normalised_error(got: &[f32], want: &[f32]) -> f64 {
    if got.len() != want.len() {
        return f64::INFINITY;
    }
    let mut scale = 0f64;
    let mut worst = 0f64;
    for (&g, &w) in got.iter().zip(want) {
        if w.is_infinite() || g.is_infinite() {
            if g != w {
                return f64::INFINITY;
            }
            continue;
        }
        if g.is_nan() != w.is_nan() {
            return f64::INFINITY;
        }
        if w.is_nan() {
            continue;
        }
        scale = scale.max(w.abs() as f64);
        worst = worst.max((g as f64 - w as f64).abs());
    }
    if scale == 0.0 {
        // An all-zero reference proves nothing: fail unless both are exactly equal and empty.
        return if got.is_empty() { 0.0 } else { f64::INFINITY };
    }
    worst / scale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_measure() {
        assert_eq!(normalised_error(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!((normalised_error(&[1.0, 2.1], &[1.0, 2.0]) - 0.05).abs() < 1e-6);
        assert!(
            normalised_error(&[0.0], &[0.0]).is_infinite(),
            "all-zero reference"
        );
        assert!(normalised_error(&[1.0], &[1.0, 2.0]).is_infinite());
        assert!(normalised_error(&[f32::NAN], &[1.0]).is_infinite());
        assert_eq!(
            normalised_error(&[f32::NEG_INFINITY, 1.0], &[f32::NEG_INFINITY, 1.0]),
            0.0
        );
        assert!(normalised_error(&[0.0, 1.0], &[f32::NEG_INFINITY, 1.0]).is_infinite());
    }
}
