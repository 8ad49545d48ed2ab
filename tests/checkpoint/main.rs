//! Checkpoints: safetensors reading and writing, inventories and audits, the synthetic generators (tiny, flash, planted, v41-tiny) and their byte-level reproducibility.
//!
//! One test binary per area (docs/architecture.md section 8); each module is one family of
//! tests, shared helpers come from `needlescope-testkit` (tests/support).

mod engram;
mod errors;
mod fp8_compressors;
mod hand_written;
mod inventory;
mod inventory_v41;
mod planted;
mod reference_bytes;
mod rounding;
mod roundtrip;
mod synth_speed;
mod synth_v41;
mod v41_formats;
mod verify;
