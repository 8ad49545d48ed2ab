//! Orchestration above the probe, report and synth layers: the whole-forward backend parity
//! harness (`parity`), and (as the architecture issue lands) target selection, model opening,
//! the sweep and trace loops, Ctrl-C handling and progress styles. `cli` calls into here; nothing
//! here parses command lines.

pub mod parity;
