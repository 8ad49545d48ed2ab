//! `needlescope bench`: times prefill and decode of a model at several prompt lengths on one
//! backend.

use clap::Args;
use std::io::Write;
use std::path::PathBuf;

use super::values::parse_token_count;
use super::{DeviceChoice, NotImplemented};

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Model directory: config.json, safetensors
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,

    /// Prompt lengths in tokens, comma list (k = 1024, m = 1048576)
    #[arg(long, value_name = "TOKENS", value_delimiter = ',', value_parser = parse_token_count, default_value = "1k,4k,16k")]
    pub lengths: Vec<usize>,

    /// Backend
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto)]
    pub device: DeviceChoice,
}

pub fn run(_args: &BenchArgs, _out: &mut dyn Write) -> anyhow::Result<()> {
    Err(NotImplemented {
        command: "bench",
        why: "the forward engine has not landed",
    }
    .into())
}
