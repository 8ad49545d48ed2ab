//! `needlescope probe`: one prompt (scenario, length, depth), one forward pass per (driving
//! index profile, top-k); reports the needle's rank on every CSA layer under the driving profile
//! and each `--compare` profile, and whether the generated answer is right (design.md 3, 6).

use clap::{Args, ValueEnum};
use std::io::Write;
use std::path::PathBuf;

use super::values::{parse_depth, parse_positive, parse_token_count};
use super::{DeviceChoice, NotImplemented};
use crate::numerics::profiles::{IndexProfile, KvMode};

/// Which query positions are probed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ProbeSet {
    /// The last prompt token and every generated token
    Answer,
    /// As `answer`, plus every token of the question
    Question,
}

#[derive(Args, Debug, Clone)]
pub struct ProbeArgs {
    /// Model directory: config.json, safetensors (sharded with index.json or single), tokenizer.json
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,

    /// Scenario: a built-in name (passkey, ...) or a scenario TOML file
    #[arg(long, value_name = "NAME|FILE", default_value = "passkey")]
    pub scenario: String,

    /// Prompt length in tokens, e.g. 16000, 16k (= 16384) or 1m
    #[arg(long, value_name = "TOKENS", value_parser = parse_token_count, default_value = "16k")]
    pub length: usize,

    /// Needle depth in percent of the haystack: 0 = start, 100 = end
    #[arg(long, value_name = "PCT", value_parser = parse_depth, default_value = "50")]
    pub depth: f64,

    /// Driving index profiles, comma list (one run each): exact, fp8, bf16, bf16-qk, sglang-fp4, official-fp4, vllm-fp8, fp8-no-hadamard-k
    #[arg(
        long,
        value_name = "PROFILES",
        value_delimiter = ',',
        default_value = "fp8"
    )]
    pub index: Vec<IndexProfile>,

    /// Extra profiles scored on the same hidden states (free counterfactuals), comma list
    #[arg(long, value_name = "PROFILES", value_delimiter = ',')]
    pub compare: Vec<IndexProfile>,

    /// Top-k values, comma list, one run each [default: the config's index_topk]
    #[arg(long, value_name = "K", value_delimiter = ',', value_parser = parse_positive)]
    pub topk: Vec<usize>,

    /// Main KV rounding: exact (f32) or fp8 (e4m3 blocks of 64 on the non-RoPE dims)
    #[arg(long, value_name = "MODE", default_value = "fp8")]
    pub kv: KvMode,

    /// Tokens to generate after the prompt (to check the answer)
    #[arg(long, value_name = "N", default_value_t = 24)]
    pub generate: usize,

    /// Prefill chunk in tokens
    #[arg(long, value_name = "TOKENS", value_parser = parse_token_count, default_value = "2048")]
    pub chunk: usize,

    /// Backend
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto)]
    pub device: DeviceChoice,

    /// Probed positions
    #[arg(long, value_enum, default_value_t = ProbeSet::Answer)]
    pub probe: ProbeSet,

    /// Print one JSON object (prompt and runs) instead of tables
    #[arg(long)]
    pub json: bool,

    /// Also write the records (layers.csv, attention.csv, summary.json) into this directory
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,

    /// Seed of the haystack filler
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

pub fn run(_args: &ProbeArgs, _out: &mut dyn Write) -> anyhow::Result<()> {
    Err(NotImplemented {
        command: "probe",
        why: "the forward engine and the probe have not landed",
    }
    .into())
}
