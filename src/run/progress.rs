//! Progress bar styles shared by `probe`, `sweep`, `demo`, `trace`, `synth`, `inspect --verify`
//! and the model load (indicatif, on stderr), and the sweep's pair of bars.
//!
//! Two keys replace indicatif's own: `{rate}` is a whole number of steps per second with digit
//! groups and the template's unit after it (`1,234/s`; indicatif's `{per_sec}` prints four
//! decimals), and `{eta_or_unknown}` says `?` until a rate is known (indicatif's `{eta}` says
//! `0s` before the first step).

use crate::numerics::profiles::IndexProfile;
use crate::probe::session::ProbeProgress;
use indicatif::{HumanDuration, ProgressState, ProgressStyle};
use std::fmt::Write;

/// A sweep's bar over its cells: the bar and ETA count prompt tokens (a 16k cell is 16 times
/// a 1k one, not one step like it), the message says how many cells are finished.
pub const SWEEP_CELLS: &str = "cells   [{bar:30}] {msg} (eta {eta_or_unknown})";
/// A sweep's bar over the running prefill.
pub const SWEEP_PREFILL: &str = "prefill [{bar:30}] {pos}/{len} tokens ({rate}) {msg}";
/// A probe's bar over one run's prefill.
pub const PROBE_PREFILL: &str =
    "{msg} [{bar:30}] {pos}/{len} tokens ({rate}, eta {eta_or_unknown})";

/// A sweep's bar over the prompts it builds before its first cell.
pub const SWEEP_PROMPTS: &str = "checking prompts [{bar:30}] {pos}/{len} (eta {eta_or_unknown})";

/// The bar over loading a model's parts (embedding, decoder layers, head) onto the backend.
pub const LOADING: &str = "loading weights [{bar:30}] {pos}/{len} parts (eta {eta_or_unknown})";

/// `synth`'s bar over the payload it writes.
pub const SYNTH_BYTES: &str =
    "writing [{bar:30}] {bytes}/{total_bytes} ({binary_bytes_per_sec}, eta {eta_or_unknown})";

/// `inspect --verify`'s bar over the checkpoint's stored bytes.
pub const VERIFY_BYTES: &str =
    "verifying [{bar:30}] {bytes}/{total_bytes} ({binary_bytes_per_sec}, eta {eta_or_unknown})";

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

/// Progress of a sweep: a bar over cells (with ETA) and one over the running prefill, both on
/// stderr and hidden when stderr is not a terminal.
pub(crate) struct SweepBars {
    /// Position and length in prompt tokens; the message counts cells.
    pub(crate) cells: indicatif::ProgressBar,
    pub(crate) prefill: indicatif::ProgressBar,
    cells_done: u64,
    cells_total: u64,
    multi: indicatif::MultiProgress,
}

impl SweepBars {
    /// Bars for `total_cells` cells of `total_tokens` prompt tokens in all, of which
    /// `done_cells` with `done_tokens` were finished before this run (a resume).
    pub(crate) fn new(
        total_cells: u64,
        done_cells: u64,
        total_tokens: u64,
        done_tokens: u64,
    ) -> Self {
        // Hidden until [`Self::show`]: the model's loading bar runs in between, and two draw
        // targets on one terminal would overwrite each other's lines.
        let multi =
            indicatif::MultiProgress::with_draw_target(indicatif::ProgressDrawTarget::hidden());
        let cells = multi.add(indicatif::ProgressBar::new(total_tokens));
        cells.set_style(style(SWEEP_CELLS));
        cells.set_position(done_tokens);
        cells.set_message(format!("{done_cells}/{total_cells}"));
        // Cells finished before a resume are not this run's speed: start the rate (and so the
        // ETA) from here, or the jump to `done` in no time would read as a huge rate.
        cells.reset_eta();
        let prefill = multi.add(indicatif::ProgressBar::new(0));
        prefill.set_style(style(SWEEP_PREFILL));
        SweepBars {
            cells,
            prefill,
            cells_done: done_cells,
            cells_total: total_cells,
            multi,
        }
    }

    /// Draws the bars from now on (on stderr, hidden when it is not a terminal); until then
    /// they are kept up to date but not drawn.
    pub(crate) fn show(&self) {
        self.multi
            .set_draw_target(indicatif::ProgressDrawTarget::stderr());
    }

    /// One more cell finished, of `tokens` prompt tokens.
    pub(crate) fn cell_done(&mut self, tokens: usize) {
        self.cells_done += 1;
        self.cells
            .set_message(format!("{}/{}", self.cells_done, self.cells_total));
        self.cells.inc(tokens as u64);
    }
}

impl ProbeProgress for SweepBars {
    fn run_started(&mut self, index: IndexProfile, topk: usize, prompt_tokens: usize) {
        self.prefill.set_length(prompt_tokens as u64);
        self.prefill.set_position(0);
        self.prefill.set_message(format!("{index} top-{topk}"));
    }
    fn prefill(&mut self, done: usize, _total: usize) {
        self.prefill.set_position(done as u64);
    }
    fn generated(&mut self, count: usize) {
        self.prefill.set_message(format!("generated {count}"));
    }
}

/// Prefill / generation progress of a probe on stderr. On a terminal the bar shows its ETA;
/// otherwise (the bar is hidden) a run whose first prefill chunk projects a long prefill says
/// so in one line ([`eta_line`]), so a long job is never silent.
pub struct ProbeBar {
    bar: Option<indicatif::ProgressBar>,
    /// The run in flight: its label and when it started; `None` once its projection was
    /// considered.
    run: Option<(String, std::time::Instant)>,
}

impl ProbeBar {
    pub fn new() -> Self {
        ProbeBar {
            bar: None,
            run: None,
        }
    }
    pub fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

/// A projected prefill at least this long is announced on a non-terminal stderr.
pub const ETA_LINE_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

/// The line that announces a long prefill once `done` of `total` prompt tokens took `elapsed`:
/// `None` when the projection (linear in tokens) is shorter than [`ETA_LINE_AFTER`]. The
/// projection is a lower bound: later chunks attend over a longer context.
pub fn eta_line(
    label: &str,
    done: usize,
    total: usize,
    elapsed: std::time::Duration,
) -> Option<String> {
    if done == 0 || done >= total {
        return None;
    }
    let projected = elapsed.mul_f64(total as f64 / done as f64);
    (projected >= ETA_LINE_AFTER).then(|| {
        format!(
            "{label}: the first {} of {} prompt tokens took {}; the prefill will take at least \
             {} (later chunks see a longer context); Ctrl-C stops at the next chunk",
            crate::units::group_digits(done as u64),
            crate::units::group_digits(total as u64),
            indicatif::HumanDuration(elapsed),
            indicatif::HumanDuration(projected)
        )
    })
}

impl crate::probe::session::ProbeProgress for ProbeBar {
    fn run_started(
        &mut self,
        index: crate::numerics::profiles::IndexProfile,
        topk: usize,
        prompt_tokens: usize,
    ) {
        self.finish();
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(prompt_tokens as u64),
            indicatif::ProgressDrawTarget::stderr(),
        );
        bar.set_style(style(PROBE_PREFILL));
        let label = format!("prefill {index} top-{topk}");
        bar.set_message(label.clone());
        self.bar = Some(bar);
        self.run = Some((label, std::time::Instant::now()));
    }
    fn prefill(&mut self, done: usize, total: usize) {
        if let Some(b) = &self.bar {
            b.set_position(done as u64);
        }
        if let Some((label, started)) = self.run.take() {
            let hidden = self.bar.as_ref().is_none_or(|b| b.is_hidden());
            if let Some(line) = eta_line(&label, done, total, started.elapsed()).filter(|_| hidden)
            {
                eprintln!("{line}");
            }
        }
    }
    fn generated(&mut self, count: usize) {
        if let Some(b) = &self.bar {
            b.set_message(format!("generated {count} tokens"));
        }
    }
}

impl Default for ProbeBar {
    fn default() -> Self {
        Self::new()
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
        for t in [
            SWEEP_CELLS,
            SWEEP_PREFILL,
            PROBE_PREFILL,
            SWEEP_PROMPTS,
            LOADING,
            SYNTH_BYTES,
        ] {
            assert!(ProgressStyle::with_template(t).is_ok(), "{t}");
        }
    }

    /// A resumed sweep starts its cells bar at the finished work without taking that jump
    /// for this run's speed (it would promise an ETA of about zero).
    #[test]
    fn a_resumed_sweep_has_no_rate_until_a_cell_finishes() {
        let mut bars = SweepBars::new(100, 60, 100_000, 30_000);
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert_eq!(bars.cells.position(), 30_000);
        assert_eq!(bars.cells.message(), "60/100");
        assert_eq!(bars.cells.per_sec(), 0.0);
        bars.cell_done(1024);
        assert!(bars.cells.per_sec() > 0.0);
    }

    /// The bar (and so the ETA) moves by a cell's prompt tokens: after a 1k cell of a 1k + 16k
    /// grid it is 1/17 done, not half; the message counts cells.
    #[test]
    fn the_cells_bar_weighs_cells_by_their_tokens() {
        let mut bars = SweepBars::new(2, 0, 17 * 1024, 0);
        assert_eq!(bars.cells.message(), "0/2");
        bars.cell_done(1024);
        assert_eq!(bars.cells.message(), "1/2");
        assert_eq!(bars.cells.position(), 1024);
        assert_eq!(bars.cells.length(), Some(17 * 1024));
        bars.cell_done(16 * 1024);
        assert_eq!(bars.cells.message(), "2/2");
        assert_eq!(bars.cells.position(), 17 * 1024);
    }

    #[test]
    fn a_long_prefill_is_announced_after_its_first_chunk_and_a_short_one_is_not() {
        use std::time::Duration;
        let line = eta_line("prefill fp8 top-512", 2048, 1 << 20, Duration::from_secs(2))
            .expect("512 chunks of 2 s: about 17 minutes");
        assert!(
            line.starts_with("prefill fp8 top-512: the first 2,048 of 1,048,576"),
            "{line}"
        );
        assert!(line.contains("at least 17 minutes"), "{line}");
        assert!(line.contains("Ctrl-C stops at the next chunk"), "{line}");
        assert_eq!(
            eta_line("p", 2048, 16384, Duration::from_secs(2)),
            None,
            "16 s"
        );
        assert!(
            eta_line("p", 2048, 32768, Duration::from_secs(2)).is_some(),
            "32 s"
        );
        assert_eq!(eta_line("p", 0, 16384, Duration::from_secs(9)), None);
        assert_eq!(
            eta_line("p", 16384, 16384, Duration::from_secs(90)),
            None,
            "one chunk"
        );
    }
}
