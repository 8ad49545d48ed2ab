//! Orchestration: everything a command does between its parsed flags and its printed result.
//! [`hub`] finds the model directory `--model` names (a path, or a repository of the Hugging Face
//! cache); [`target`] decides the device and opens the model and tokenizer ([`device`] resolves
//! the device spec); [`prompt`] turns prompt flags into a scenario and a prompt; [`probe`] runs
//! one prompt's runs ([`probe_v41`] on a DeepSeek-V4.1 checkpoint; or the serving engine alone, [`engine_only`] for a grid of them, through
//! [`sglang`]); [`sweep`] runs a grid cell by cell into a report directory; [`trace`] dumps
//! scores and logits ([`trace_logits`]: which logits it keeps); [`bench`](mod@bench) times prefills;
//! [`parity`] holds two backends against each other; [`checks`] refuses
//! arguments no run can honour; [`interrupt`] turns Ctrl-C into "stop after the work in
//! flight"; [`progress`] styles the bars. `cli` calls into here; nothing here parses a command
//! line or imports `cli`.

pub mod bench;
pub mod checks;
pub mod device;
pub mod engine_only;
pub mod hub;
pub mod interrupt;
pub mod parity;
pub mod probe;
pub mod probe_v41;
pub mod progress;
pub mod prompt;
pub mod sglang;
pub mod sweep;
pub mod target;
pub mod trace;
pub mod trace_logits;
pub mod trace_v41;
