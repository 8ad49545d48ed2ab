//! End to end on the planted synthetic model: probe and sweep through the binary, and the planted trends.
//!
//! One test binary per area (docs/architecture.md section 8); each module is one family of
//! tests, shared helpers come from `needlescope-testkit` (tests/support).

mod conversation;
mod engine;
mod planted_trends;
mod probe_sweep;
