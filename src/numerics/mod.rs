//! Number formats and index-key numerics: everything that turns f32 values into the rounded
//! values some engine would have computed, and back.
//!
//! - [`codecs`]: scalar decode tables and encoders (e4m3fn, e8m0, e2m1, bf16), shared by the CPU
//!   reference and the GPU kernels (the tables are plain statics that can be uploaded as is).
//! - [`formats`]: whole-tensor weight formats over raw little-endian bytes (FP8 blocks of the
//!   config's `weight_block_size`, 128x128 on V4 and 32x32 on V4.1; FP4 group 32 with e8m0
//!   scales; NVFP4 with e4m3 group-16 scales) in both directions.
//! - [`quant`]: activation "simulations" (quantise then dequantise in place) as REF, SGLang and
//!   vLLM do them, including their exact scale arithmetic.
//! - [`hadamard`]: the orthonormal Walsh-Hadamard rotation of the indexer.
//! - [`modes`]: the names of the switches, [`IndexProfile`] (`--index`) and [`KvMode`] (`--kv`).
//! - [`profiles`]: how index queries and keys are prepared and scored under each profile.
//! - [`score_batch`]: the same scores for blocks of queries × key rows, dot products as GEMMs.
//! - [`engram`]: DeepSeek-V4.1's Engram gate, per token.
//! - [`numpy_rng`]: NumPy's `default_rng` stream, to re-derive constants a release drew with it
//!   (DeepSeek-V4.1's Engram multipliers); needlescope's own draws use [`rng`].
//!
//! Errors: functions that read tensors whose sizes come from a file return
//! `Result<_, FormatError>`; they never panic on a size mismatch.

pub mod codecs;
pub mod engram;
pub mod formats;
pub mod hadamard;
pub mod mhc;
pub mod modes;
pub mod numpy_rng;
pub mod profiles;
pub mod quant;
pub mod rng;
pub mod rope;
pub mod score_batch;

pub use hadamard::{hadamard_inplace, hadamard_rows};
pub use profiles::{IndexProfile, KvMode, ParseNameError, PreparedKeys, PreparedQuery};

/// A tensor's bytes or shape do not fit the format it claims to be in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// A buffer has the wrong number of elements (or bytes) for the stated shape.
    #[error("{what}: expected {expected} elements, found {found}")]
    Length {
        what: &'static str,
        expected: usize,
        found: usize,
    },
    /// Packed FP4 needs an even number of columns (two codes per byte).
    #[error("packed fp4 needs an even column count, found {cols}")]
    OddColumns { cols: usize },
    /// A block or group size of zero.
    #[error("{what}: block size must be positive")]
    ZeroBlock { what: &'static str },
    /// A raw byte buffer whose length is not a multiple of the element width.
    #[error("{what}: {len} bytes is not a multiple of the element width {width}")]
    ByteLength {
        what: &'static str,
        len: usize,
        width: usize,
    },
    /// The Hadamard rotation is defined for power-of-two lengths only.
    #[error("hadamard rotation needs a power-of-two length, found {n}")]
    NotPowerOfTwo { n: usize },
}
