//! The probe layer: scenarios, tokenizer, prompts and needle spans, rows and ranks, the observer, sessions.
//!
//! One test binary per area (docs/architecture.md section 8); each module is one family of
//! tests, shared helpers come from `needlescope-testkit` (tests/support).

mod capture;
mod chat;
mod model_tokenizer;
mod observe;
mod prompt;
mod question_positions;
mod rows_ranks;
mod scenario;
mod session;
mod tokenizer;
