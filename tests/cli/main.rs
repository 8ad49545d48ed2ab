//! The binary driven as a user would: help, bad checkpoints, edges of every flag, devices, inspect (and --verify), bench, trace.
//!
//! One test binary per area (docs/architecture.md section 8); each module is one family of
//! tests, shared helpers come from `needlescope-testkit` (tests/support).

mod bad_checkpoint;
mod bench;
mod cpu_gemm;
mod device;
mod edges;
mod emu_combos;
mod help;
mod host_plan;
mod hub;
mod inspect;
mod inspect_verify;
mod probe_v41;
mod synth_v41;
mod trace;
mod trace_transfer;
mod trace_v41;
