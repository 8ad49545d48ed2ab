//! needlescope: explains why a DeepSeek-V4 model forgets a fact that sits in its own prompt.
//!
//! The library holds everything testable; `main.rs` only parses arguments and maps errors to
//! exit codes. Layout (docs/architecture.md section 2): `config` (ModelConfig), `checkpoint` (safetensors
//! shards, number formats, synthetic checkpoints), `numerics` (fp8/fp4/e8m0 codecs, Hadamard,
//! index-key profiles), `backend` (the Backend trait, its CPU reference and the GPU backend),
//! `plan` (footprint and memory plan) and `placement` (layers onto devices), `model` (one file per
//! component in forward order, the per-sequence state and the layer loop with its observer),
//! `probe` (scenarios, prompts, needle spans, ranks), `report` (records, CSV, tables, plots) and
//! `cli` (one file per subcommand).

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
