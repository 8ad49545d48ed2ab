//! needlescope: explains why a DeepSeek-V4 model forgets a fact that sits in its own prompt.
//!
//! The library holds everything testable; `main.rs` only parses arguments and maps errors to
//! exit codes. The modules are layers (docs/architecture.md sections 2 and 9; the test
//! `tests/architecture` enforces that none imports one above it), bottom to top:
//! `units` and `numerics` (codecs, profiles, Hadamard, RoPE, mHC maths, the PRNG), `config`
//! (ModelConfig), `tokenizer`, `checkpoint` (safetensors), `backend` (the Backend trait, the CPU
//! reference, the GPU backend), `devices` (host room, memory plan, placement), `model` (the
//! engine, one file per component in forward order, the Observer trait), `record` (the record
//! schema and the "why" analysis), then `probe` (scenarios, prompts, ranks, the observer),
//! `report` (the report directory, summary, plots) and `synth` (synthetic checkpoints), `run`
//! (target selection, the sweep and trace loops, Ctrl-C) and `cli` (one file per subcommand).

pub mod backend;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod devices;

pub mod model;
pub mod numerics;

pub mod probe;
pub mod record;
pub mod report;
pub mod run;
pub mod synth;
pub mod tokenizer;
pub mod units;
