//! `needlescope demo`: writes the `planted` synthetic model, runs a small sweep on it and renders
//! the report: the whole product with no downloads (design.md 1).

use clap::Args;
use std::io::Write;
use std::path::PathBuf;

use super::NotImplemented;

#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// Report directory
    #[arg(long, value_name = "DIR", default_value = "reports/demo")]
    pub out: PathBuf,
}

pub fn run(_args: &DemoArgs, _out: &mut dyn Write) -> anyhow::Result<()> {
    Err(NotImplemented {
        command: "demo",
        why: "it needs the planted synthetic model and the sweep, which have not landed; \
              meanwhile: `needlescope synth --preset tiny --out DIR` then `needlescope inspect --model DIR`",
    }
    .into())
}
