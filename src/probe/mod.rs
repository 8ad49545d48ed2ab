//! The needle side of needlescope: scenarios, prompt building, needle spans, row mapping, ranks
//! and the observer that turns engine observations into records (docs/architecture.md sections 3 and 4).
//!
//! - [`scenario`]: what a needle test is (needle template, value generator, question, answer
//!   check, haystack kind); built-in scenarios from `scenarios/*.toml` or a user's file; the
//!   needle value / kv key generators (`[value]`, `[key]` tables) and answer judging.
//! - [`chat`]: the DeepSeek-V4 chat encoder: a user's conversation (`--prompt FILE`: a chat
//!   request, a messages array or text) read, checked and rendered as the V4 release renders it.
//! - [`conversation`]: that conversation as a needle prompt: tokens, the span of each
//!   `--needle`, the answer.
//! - [`haystack`]: seeded text generators for the haystack kinds (noise, kv, tools, file);
//!   [`words`] holds their own word lists and templates (draws: `numerics::rng`).
//! - [`prompt`]: the V4 chat prompt of exactly the requested length with exact token spans
//!   (derived and checked from the final encoding; the tokenizer is `crate::tokenizer`).
//! - [`rows`]: CSA/HCA row mapping and visibility (docs/architecture.md section 4, normative).
//! - [`rank`]: needle rank, ties, k-th score, margin, selection; a `record::LayerRecord` from them.
//! - [`observe`]: `NeedleObserver`, the `model::observer::Observer` of a probe run.
//! - [`session`]: one probe: every (index, top-k) run on a prompt, with its answer.
//!
//! The probe knows nothing about backends beyond the `Backend` bound of the engine it drives:
//! it only sees `IndexerObservation` and `AttentionObservation` values, and writes the records
//! of `crate::record`.

pub mod capture;
pub mod chat;
pub mod conversation;
pub mod engine;
pub mod haystack;
pub mod observe;
pub mod prompt;
pub mod rank;
pub mod rows;
pub mod scenario;
pub mod session;

pub mod words;

pub use observe::{CellTopk, NeedleObserver, NeedleObserverConfig};
pub use prompt::{build_prompt, NeedlePrompt, PromptError};
pub use rank::NeedleRank;
pub use rows::RowKind;
pub use scenario::{Scenario, ScenarioError};
