//! `needlescope trace`: runs a token file through the model and writes indexer scores, top-k
//! selections and logits of the chosen positions to one safetensors file (design.md 6), for
//! comparison with other engines.

use clap::Args;
use std::io::Write;
use std::path::PathBuf;

use super::values::{parse_positive, parse_token_count, Positions};
use super::NotImplemented;
use crate::numerics::profiles::{IndexProfile, KvMode};

#[derive(Args, Debug, Clone)]
pub struct TraceArgs {
    /// Model directory: config.json, safetensors
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,

    /// Token ids, whitespace- or comma-separated integers
    #[arg(long, value_name = "FILE")]
    pub tokens: PathBuf,

    /// Positions to record: all, last, or a comma list of 0-based positions
    #[arg(long, value_name = "all|last|LIST", default_value = "last")]
    pub positions: Positions,

    /// Driving index profile (decides the real selection)
    #[arg(long, value_name = "PROFILE", default_value = "exact")]
    pub index: IndexProfile,

    /// Main KV rounding: exact or fp8
    #[arg(long, value_name = "MODE", default_value = "exact")]
    pub kv: KvMode,

    /// Top-k of the indexer [default: the config's index_topk]
    #[arg(long, value_name = "K", value_parser = parse_positive)]
    pub topk: Option<usize>,

    /// Prefill chunk in tokens
    #[arg(long, value_name = "TOKENS", value_parser = parse_token_count, default_value = "2048")]
    pub chunk: usize,

    /// Output safetensors file
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,

    /// Also dump the raw indexer inputs per CSA layer (q, keys, head weights)
    #[arg(long)]
    pub dump_indexer_inputs: bool,
}

pub fn run(_args: &TraceArgs, _out: &mut dyn Write) -> anyhow::Result<()> {
    Err(NotImplemented {
        command: "trace",
        why: "the forward engine has not landed",
    }
    .into())
}
