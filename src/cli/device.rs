//! `--device` and `--gpu-gemm` (probe, sweep, trace, bench) as clap reads them: the parser of a
//! device spec (its syntax and resolution are `run::device`'s) and the shared flag struct.
//! A bad spec is a usage error (exit 2) naming the flag, the expected form and what was found.

use clap::builder::{PossibleValue, TypedValueParser};
use clap::{Args, ValueEnum};

use crate::backend::gpu::GemmType;
use crate::run::device::{DeviceChoice, DeviceSpec};

/// The clap parser of `--device`: `DeviceSpec::from_str`, plus the possible values for the
/// help (`emu` hidden: it is for tests).
#[derive(Clone, Copy, Debug, Default)]
pub struct DeviceParser;

impl TypedValueParser for DeviceParser {
    type Value = DeviceSpec;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<DeviceSpec, clap::Error> {
        let parse: fn(&str) -> Result<DeviceSpec, String> = str::parse;
        parse.parse_ref(cmd, arg, value)
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(
            [
                PossibleValue::new("auto").help(
                    "every visible GPU when the CUDA driver sees one, else the CPU (one note on stderr)",
                ),
                PossibleValue::new("cpu").help("the CPU reference backend (f32 throughout; --cpu-gemm bf16 for bf16 products)"),
                PossibleValue::new("cuda")
                    .help("every visible GPU; an error without a CUDA driver or a GPU"),
                PossibleValue::new("cuda:N,...").help("these GPU ordinals, e.g. cuda:0,2"),
                PossibleValue::new("emu").hide(true),
            ]
            .into_iter(),
        ))
    }
}

/// `--gpu-gemm`, `--cpu-gemm`: operand precision of the linear products.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GemmOperands {
    /// f32 operands: the reference's values (up to summation order on a GPU); the default
    F32,
    /// bf16 operands, f32 accumulation: the serving engines' numerics, and the fast path
    Bf16,
}

impl From<GemmOperands> for GemmType {
    fn from(g: GemmOperands) -> GemmType {
        match g {
            GemmOperands::Bf16 => GemmType::Bf16,
            GemmOperands::F32 => GemmType::F32,
        }
    }
}

/// The device flags shared by probe, sweep, trace and bench.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct DeviceArgs {
    /// Where the model runs: auto, cpu, cuda (every visible GPU) or cuda:0,2 (those GPUs; the
    /// layers are split in contiguous ranges by free memory)
    // Hidden value, for tests and CI: `emu`, `emu:N` or `emu:NxSIZE` runs the GPU backend on N
    // host-emulated devices (SIZE each, 1 TiB by default): the CUDA code path, multi-device
    // placement included, without a GPU (see `DeviceSpec::Emu`).
    #[arg(
        long,
        value_name = "auto|cpu|cuda|cuda:N,...",
        default_value = "auto",
        value_parser = DeviceParser
    )]
    pub device: DeviceSpec,

    /// GEMM operands on the GPU: f32 (the CPU reference's values up to summation order) or bf16
    /// (f32 accumulation; the serving engines' numerics and much faster, but ranks near the
    /// top-k cut-off may differ from the reference) [default: f32]; ignored on the CPU (see
    /// --cpu-gemm)
    #[arg(long, value_name = "bf16|f32")]
    pub gpu_gemm: Option<GemmOperands>,

    /// GEMM operands of the linear products on the CPU: f32 (the reference) or bf16 (f32
    /// accumulation, AMX tiles where the CPU has them: the serving engines' numerics and
    /// faster, but ranks near the top-k cut-off may differ from the reference; the mHC mixes,
    /// the router and the attention stay f32) [default: f32]; ignored on a GPU (see --gpu-gemm)
    #[arg(long, value_name = "bf16|f32")]
    pub cpu_gemm: Option<GemmOperands>,
}

impl DeviceArgs {
    /// What the flags choose, for the run layer.
    pub fn choice(&self) -> DeviceChoice {
        DeviceChoice {
            device: self.device.clone(),
            gpu_gemm: self.gpu_gemm.map(GemmType::from),
            cpu_gemm: self.cpu_gemm.map(GemmType::from),
        }
    }
}
