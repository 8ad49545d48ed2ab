//! Safetensors element types and the three weight formats a DeepSeek-V4 checkpoint comes in.
//!
//! [`Dtype`] covers every byte-sized safetensors dtype string (`"BF16"`, `"F8_E4M3"`,
//! `"F8_E8M0"`, ...). The sub-byte `F4`/`F6_*` strings of newer safetensors versions are
//! deliberately unknown: V4 checkpoints store packed FP4 as `I8` (official) or `U8` (NVFP4), so
//! meeting one means the file is not a checkpoint we understand.
//!
//! [`WeightFormat`] is how the linears of a whole checkpoint are stored (docs/spec/model.md 2.4-2.5):
//! `Bf16` (a bf16 synthetic or converted checkpoint: no scale tensors at all), `Official`
//! (FP8 e4m3 blocks of `weight_block_size`, 128x128 on V4 and 32x32 on V4.1, with E8M0
//! `.scale`; routed experts packed FP4 with E8M0 1x32 `.scale`) and `Nvfp4` (NVIDIA's re-quantisation: main-layer routed experts packed FP4 with
//! e4m3 1x16 `weight_scale` and an f32 `weight_scale_2`; everything else as `Official`).

use std::fmt;
use std::str::FromStr;

/// A safetensors element type (all byte-sized ones).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dtype {
    Bool,
    U8,
    I8,
    F8E5M2,
    F8E4M3,
    F8E8M0,
    I16,
    U16,
    F16,
    BF16,
    I32,
    U32,
    F32,
    F64,
    I64,
    U64,
}

impl Dtype {
    /// Every dtype, in a fixed order (used for histograms).
    pub const ALL: [Dtype; 16] = [
        Dtype::Bool,
        Dtype::U8,
        Dtype::I8,
        Dtype::F8E5M2,
        Dtype::F8E4M3,
        Dtype::F8E8M0,
        Dtype::I16,
        Dtype::U16,
        Dtype::F16,
        Dtype::BF16,
        Dtype::I32,
        Dtype::U32,
        Dtype::F32,
        Dtype::F64,
        Dtype::I64,
        Dtype::U64,
    ];

    /// The dtype string as written in a safetensors header.
    pub fn as_str(self) -> &'static str {
        match self {
            Dtype::Bool => "BOOL",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::F8E5M2 => "F8_E5M2",
            Dtype::F8E4M3 => "F8_E4M3",
            Dtype::F8E8M0 => "F8_E8M0",
            Dtype::I16 => "I16",
            Dtype::U16 => "U16",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::I32 => "I32",
            Dtype::U32 => "U32",
            Dtype::F32 => "F32",
            Dtype::F64 => "F64",
            Dtype::I64 => "I64",
            Dtype::U64 => "U64",
        }
    }

    /// Parses a header dtype string; `None` for anything we do not know (including `F4`).
    pub fn parse(s: &str) -> Option<Dtype> {
        Dtype::ALL.iter().copied().find(|d| d.as_str() == s)
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::Bool | Dtype::U8 | Dtype::I8 => 1,
            Dtype::F8E5M2 | Dtype::F8E4M3 | Dtype::F8E8M0 => 1,
            Dtype::I16 | Dtype::U16 | Dtype::F16 | Dtype::BF16 => 2,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 4,
            Dtype::F64 | Dtype::I64 | Dtype::U64 => 8,
        }
    }

    /// Payload bytes of a tensor of this dtype and shape; `None` on overflow (a hostile header).
    pub fn byte_len(self, shape: &[usize]) -> Option<usize> {
        shape
            .iter()
            .try_fold(self.size(), |acc, &d| acc.checked_mul(d))
    }
}

/// As its header string (`"BF16"`), e.g. in `inspect --json`.
impl serde::Serialize for Dtype {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Number of elements of a shape (1 for a scalar `[]`).
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Formats a shape as `[a, b]` for messages.
pub fn shape_str(shape: &[usize]) -> String {
    format!("{shape:?}")
}

/// How the linears of a checkpoint are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// Every linear stored BF16, no scale tensors.
    Bf16,
    /// The official release: FP8 block linears and FP4 (MXFP4-like) routed experts.
    Official,
    /// NVIDIA's NVFP4 re-quantisation of the official release.
    Nvfp4,
}

impl WeightFormat {
    pub const ALL: [WeightFormat; 3] = [
        WeightFormat::Bf16,
        WeightFormat::Official,
        WeightFormat::Nvfp4,
    ];

    /// The CLI spelling (`bf16`, `official`, `nvfp4`).
    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::Bf16 => "bf16",
            WeightFormat::Official => "official",
            WeightFormat::Nvfp4 => "nvfp4",
        }
    }
}

impl fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown `--format` spelling.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown weight format {found:?}, expected one of bf16, official, nvfp4")]
pub struct ParseFormatError {
    pub found: String,
}

impl FromStr for WeightFormat {
    type Err = ParseFormatError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        WeightFormat::ALL
            .iter()
            .copied()
            .find(|f| f.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| ParseFormatError {
                found: s.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_string_round_trips() {
        for d in Dtype::ALL {
            assert_eq!(Dtype::parse(d.as_str()), Some(d));
        }
        assert_eq!(Dtype::parse("F4"), None);
        assert_eq!(
            Dtype::parse("bf16"),
            None,
            "dtype strings are case-sensitive"
        );
    }

    #[test]
    fn byte_len_multiplies_and_detects_overflow() {
        assert_eq!(Dtype::BF16.byte_len(&[129280, 4096]), Some(1_059_061_760));
        assert_eq!(Dtype::F32.byte_len(&[]), Some(4));
        assert_eq!(Dtype::I64.byte_len(&[usize::MAX, 2]), None);
    }

    #[test]
    fn weight_format_parses_cli_names() {
        assert_eq!(
            "official".parse::<WeightFormat>(),
            Ok(WeightFormat::Official)
        );
        assert_eq!("NVFP4".parse::<WeightFormat>(), Ok(WeightFormat::Nvfp4));
        let e = "fp8".parse::<WeightFormat>().unwrap_err().to_string();
        assert!(e.contains("fp8") && e.contains("official"), "{e}");
    }
}
