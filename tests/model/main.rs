//! The CPU reference engine: invariants (chunked = one-shot = token-by-token), index profiles, weight formats, the golden transformers comparison, and its benchmark (ignored).
//!
//! One test binary per area (docs/architecture.md section 8); each module is one family of
//! tests, shared helpers come from `needlescope-testkit` (tests/support).

mod bench;
mod golden_transformers;
mod golden_v41;
mod invariants;
mod profiles;
mod weights;
