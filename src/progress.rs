//! Progress bar styles shared by `probe`, `sweep` and `demo` (indicatif, on stderr).
//!
//! Two keys replace indicatif's own: `{rate}` is a whole number of steps per second with digit
//! groups and the template's unit after it (`1,234/s`; indicatif's `{per_sec}` prints four
//! decimals), and `{eta_or_unknown}` says `?` until a rate is known (indicatif's `{eta}` says
//! `0s` before the first step).

use indicatif::{HumanDuration, ProgressState, ProgressStyle};
use std::fmt::Write;

/// A sweep's bar over its cells.
pub const SWEEP_CELLS: &str = "cells   [{bar:30}] {pos}/{len} (eta {eta_or_unknown}) {msg}";
/// A sweep's bar over the running prefill.
pub const SWEEP_PREFILL: &str = "prefill [{bar:30}] {pos}/{len} tokens ({rate}) {msg}";
/// A probe's bar over one run's prefill.
pub const PROBE_PREFILL: &str =
    "{msg} [{bar:30}] {pos}/{len} tokens ({rate}, eta {eta_or_unknown})";

/// `template` (an indicatif template that may use `{rate}` and `{eta_or_unknown}`) with bar
/// characters `=> `; a template that does not parse falls back to the default bar.
pub fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .with_key("rate", |s: &ProgressState, w: &mut dyn Write| {
            let _ = w.write_str(&rate_text(s.per_sec()));
        })
        .with_key("eta_or_unknown", |s: &ProgressState, w: &mut dyn Write| {
            let _ = w.write_str(&eta_text(s.per_sec(), s.eta()));
        })
        .progress_chars("=> ")
}

/// `1,234/s`, or `-/s` while no rate is known.
pub fn rate_text(per_sec: f64) -> String {
    if per_sec.is_finite() && per_sec > 0.0 {
        format!("{}/s", crate::units::group_digits(per_sec.round() as u64))
    } else {
        "-/s".to_string()
    }
}

/// The ETA as indicatif words it (`3m`, `12s`), or `?` while no rate is known.
pub fn eta_text(per_sec: f64, eta: std::time::Duration) -> String {
    if per_sec.is_finite() && per_sec > 0.0 {
        format!("{:#}", HumanDuration(eta))
    } else {
        "?".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_whole_grouped_numbers_and_unknown_says_so() {
        assert_eq!(rate_text(11_632.648_1), "11,633/s");
        assert_eq!(rate_text(0.0), "-/s");
        assert_eq!(rate_text(f64::NAN), "-/s");
        assert_eq!(eta_text(0.0, std::time::Duration::ZERO), "?");
        assert_eq!(eta_text(2.0, std::time::Duration::from_secs(12)), "12s");
        // The templates in use parse (a bad one would silently fall back to the default bar).
        for t in [SWEEP_CELLS, SWEEP_PREFILL, PROBE_PREFILL] {
            assert!(ProgressStyle::with_template(t).is_ok(), "{t}");
        }
    }
}
