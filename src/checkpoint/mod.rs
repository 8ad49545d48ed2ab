//! Checkpoints: safetensors shards read zero-copy, the expected tensor inventory of a release,
//! and a streaming safetensors writer (the synthetic checkpoints that use it are `crate::synth`).
//!
//! - [`dtype`]: safetensors dtypes and [`WeightFormat`] (bf16 / official FP8+FP4 / NVFP4).
//! - [`header`]: one shard's 8-byte length + JSON header, validated against the file.
//! - [`reader`]: [`Checkpoint::open`] (config.json, index.json or single file, mmap per shard),
//!   typed accessors (`f32_tensor`, `i64_tensor`, `raw_bytes`).
//! - [`linear`]: [`QuantWeight`], a borrowed view of one linear in whatever format it is stored,
//!   checked against the config-implied shapes, and its decode to f32.
//! - [`inventory`]: the exact tensor list of a release computed from the config alone
//!   (docs/spec/model.md section 3), and [`inventory_v41`] the DeepSeek-V4.1 one
//!   (docs/spec/v41.md section 4); [`audit`](mod@audit): the diff of a checkpoint against it.
//!   `compressor_kinds`: the compressor / indexer linears whose storage a checkpoint chooses.
//! - [`writer`]: safetensors files written tensor by tensor, shard assignment and names.
//! - [`verify`](mod@verify): every stored value read once, in bounded pieces: NaN, infinite
//!   and all-zero tensors (`inspect --verify`).
//!
//! Every error names the file, the tensor (or field), what was expected and what was found;
//! nothing here panics on a malformed file.

pub mod audit;
mod compressor_kinds;
pub mod dtype;
pub mod header;
pub mod inventory;
pub mod inventory_v41;
pub mod linear;
pub mod reader;
pub mod verify;
pub mod writer;

pub use audit::{audit, compare, InventoryDiff, Mismatch};
pub use dtype::{Dtype, WeightFormat};
pub use inventory::{expected_inventory, ExpectedTensor};
pub use linear::QuantWeight;
pub use reader::{Checkpoint, TensorInfo};

use crate::config::ConfigError;
use crate::numerics::FormatError;
use std::path::PathBuf;

/// Everything that can go wrong reading or writing a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(transparent)]
    Config(#[from] ConfigError),

    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },

    #[error(
        "model directory {}: is a file, expected a directory holding config.json and the \
         *.safetensors weights",
        .0.display()
    )]
    NotADirectory(PathBuf),

    #[error(
        "{}: both model.safetensors and other *.safetensors files ({}) but no \
         model.safetensors.index.json: expected one single-file checkpoint, or shards with their \
         index; move the extra files out",
        .dir.display(),
        .others.join(", ")
    )]
    AmbiguousWeights { dir: PathBuf, others: Vec<String> },

    #[error(
        "{dir}: no weights found: expected model.safetensors.index.json, model.safetensors \
         or *.safetensors files, found none"
    )]
    NoWeights { dir: PathBuf },

    #[error(
        "{file}: file is {file_len} bytes, expected at least 8 (the little-endian header \
         length); the file is truncated or not safetensors"
    )]
    TooShort { file: PathBuf, file_len: u64 },

    #[error(
        "{file}: header length field says {header_len} bytes, but only {available} bytes \
         follow it (file is {file_len} bytes); the file is truncated or not safetensors"
    )]
    HeaderLength {
        file: PathBuf,
        header_len: u64,
        available: u64,
        file_len: u64,
    },

    #[error("{file}: header is not valid JSON, expected a safetensors JSON object: {source}")]
    HeaderJson {
        file: PathBuf,
        source: serde_json::Error,
    },

    #[error("{file}: tensor {tensor}: header field `{field}` is {found}, expected {expected}")]
    HeaderEntry {
        file: PathBuf,
        tensor: String,
        field: &'static str,
        expected: String,
        found: String,
    },

    #[error(
        "{file}: tensor {tensor}: unknown dtype {found:?}, expected a byte-sized safetensors \
         dtype (BF16, F16, F32, F64, I64, I32, I8, U8, F8_E4M3, F8_E8M0, ...)"
    )]
    UnknownDtype {
        file: PathBuf,
        tensor: String,
        found: String,
    },

    #[error(
        "{file}: tensor {tensor}: data_offsets [{start}, {end}] expected inside the data \
         section [0, {data_len}], found outside it (truncated file or wrong header)"
    )]
    OffsetsOutOfRange {
        file: PathBuf,
        tensor: String,
        start: u64,
        end: u64,
        data_len: u64,
    },

    #[error(
        "{file}: tensor {tensor}: {dtype} {shape:?} expected {expected} bytes, data_offsets \
         [{start}, {end}] hold {found}"
    )]
    OffsetsSize {
        file: PathBuf,
        tensor: String,
        dtype: Dtype,
        shape: Vec<usize>,
        start: u64,
        end: u64,
        expected: u64,
        found: u64,
    },

    #[error(
        "{file}: tensor {tensor}: data_offsets start at {start}, expected {expected} (where \
         {previous} ends): tensors must tile the data section with no gap or overlap"
    )]
    OffsetsNotContiguous {
        file: PathBuf,
        tensor: String,
        start: u64,
        expected: u64,
        previous: String,
    },

    #[error(
        "{file}: the data section is {data_len} bytes, but its tensors end at {end} ({last}): \
         a safetensors file has nothing after its last tensor"
    )]
    TrailingData {
        file: PathBuf,
        end: u64,
        data_len: u64,
        last: String,
    },

    #[error("{file}: tensor {tensor}: named twice in the header")]
    NameRepeatedInHeader { file: PathBuf, tensor: String },

    #[error("tensor {tensor}: expected in one shard, found in both {first} and {second}")]
    DuplicateTensor {
        tensor: String,
        first: PathBuf,
        second: PathBuf,
    },

    #[error("{index}: expected {expected}, found {found}")]
    IndexFormat {
        index: PathBuf,
        expected: String,
        found: String,
    },

    #[error(
        "{index}: tensor {tensor} is mapped to shard file {shard}, expected it in {dir}, \
         found no such file"
    )]
    MissingShard {
        index: PathBuf,
        dir: PathBuf,
        shard: String,
        tensor: String,
    },

    #[error(
        "{index}: tensor {tensor} is mapped to {shard}, expected in that shard's header, \
         found only other tensors there"
    )]
    NotInShard {
        index: PathBuf,
        shard: PathBuf,
        tensor: String,
    },

    #[error("{dir}: tensor {tensor} expected, found no tensor of that name in any shard")]
    MissingTensor { dir: PathBuf, tensor: String },

    #[error("{file}: tensor {tensor}: expected dtype {expected}, found {found}")]
    WrongDtype {
        file: PathBuf,
        tensor: String,
        expected: String,
        found: Dtype,
    },

    #[error("{file}: tensor {tensor}: expected shape {expected:?}{why}, found {found:?}")]
    WrongShape {
        file: PathBuf,
        tensor: String,
        expected: Vec<usize>,
        found: Vec<usize>,
        why: String,
    },

    #[error(
        "{file}: {scale} missing: weight {weight} is {dtype}, which expects a scale tensor \
         {scale} ({expected}), found none in the checkpoint"
    )]
    MissingScale {
        file: PathBuf,
        weight: String,
        dtype: Dtype,
        scale: String,
        expected: String,
    },

    #[error("{file}: tensor {tensor}: {what}")]
    Unsupported {
        file: PathBuf,
        tensor: String,
        what: String,
    },

    #[error("{0}")]
    UndescribedTensors(Box<Undescribed>),

    #[error(
        "{file}: tensor {tensor}: {dtype} scale at {at:?} is {code}, expected a finite scale \
         (the file is damaged, or holds another format)"
    )]
    BadScale {
        file: PathBuf,
        tensor: String,
        dtype: Dtype,
        at: Vec<usize>,
        code: String,
    },

    #[error("tensor {tensor}: cannot decode: {source}")]
    Decode { tensor: String, source: FormatError },

    #[error("tensor {tensor}: cannot encode: {source}")]
    Encode { tensor: String, source: FormatError },

    #[error(
        "{}: holds a checkpoint that synth did not write ({files}); synth replaces only its own \
         output, marked by its synth.json (output of a needlescope from before that mark has none: \
         remove its files by hand); choose a new or empty --out",
        dir.display()
    )]
    ForeignOutDir { dir: PathBuf, files: String },

    #[error(
        "{}: not empty and not synth's output (it holds {files}, and no synth.json); synth \
         writes only into a new or empty directory, or one it wrote before; choose a new or \
         empty --out",
        dir.display()
    )]
    NotEmptyOutDir { dir: PathBuf, files: String },

    #[error("synth option {field}: expected {expected}, found {found}")]
    SynthOption {
        field: &'static str,
        expected: String,
        found: String,
    },

    #[error("{what} is not implemented yet")]
    NotImplemented { what: String },

    #[error("{tensor}: could not be placed on {device}: {why}")]
    Device {
        tensor: String,
        device: String,
        why: String,
    },
}

/// A stored tensor of a kind the model knows that the config has no place for (boxed in
/// [`CheckpointError::UndescribedTensors`]).
#[derive(Debug)]
pub struct Undescribed {
    pub config: PathBuf,
    pub file: PathBuf,
    pub tensor: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// The config field most likely wrong, and why.
    pub hint: String,
    /// Further such tensors.
    pub others: usize,
    pub dir: PathBuf,
}

impl std::fmt::Display for Undescribed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: does not describe the checkpoint: {} holds {} ({} {:?}), expected no such \
             tensor: {}",
            self.config.display(),
            self.file.display(),
            self.tensor,
            self.dtype,
            self.shape,
            self.hint
        )?;
        if self.others > 0 {
            write!(f, " ({} more such tensors)", self.others)?;
        }
        write!(
            f,
            "; fix config.json to match the weights (`needlescope inspect --model {}` lists \
             every difference)",
            self.dir.display()
        )
    }
}

impl CheckpointError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        CheckpointError::Io {
            path: path.into(),
            source,
        }
    }
}
