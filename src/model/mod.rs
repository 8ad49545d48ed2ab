//! The DeepSeek-V4 forward pass, one file per component in forward order:
//! [`embed`] → per layer { [`hyper`] (mHC pre) → [`attention`] (with the RoPE tables of `numerics::rope`, [`compressor`],
//! [`indexer`]) → mHC post → mHC pre → [`moe`] → mHC post } ([`layer`]) → [`head`].
//! [`state`] holds the per-sequence caches, [`forward`] the [`Model`] (loading, the chunk /
//! layer loop, the observer calls), [`mod@bench`] the prefill benchmark, [`observer`] the fixed
//! interface to the probe.
//!
//! Every op runs on a [`Backend`]; the CPU backend is the reference.
//! Linear weights are handed to the backend in their stored format (`load_matrix`); it decodes
//! them at load or on use (`backend::WeightResidency`), so a model larger than RAM runs from
//! the checkpoint's memory map.

pub mod attention;
pub mod bench;
pub mod compressor;
pub mod embed;
pub mod forward;
pub mod head;
pub mod hyper;
pub mod indexer;
pub mod layer;
pub mod moe;
pub mod observer;
pub mod v41;

pub mod state;

pub use bench::{bench_prefill, BenchFigures};
pub use forward::{ForwardOutput, LogitsRequest, Model, ModelOptions};
pub use observer::{AttentionObservation, IndexerObservation, KvRows, NoObserver, Observer};
pub use state::SequenceState;

use crate::backend::Backend;
use crate::checkpoint::{Checkpoint, CheckpointError};

/// Errors of loading or running the model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),

    #[error(
        "token id {token} at position {position} is outside the vocabulary (vocab_size {vocab})"
    )]
    TokenOutOfRange {
        token: u32,
        position: usize,
        vocab: usize,
    },

    #[error("{}: tensor {tensor}: {problem}", .file.display())]
    BadTensor {
        file: std::path::PathBuf,
        tensor: String,
        problem: String,
    },

    #[error(
        "logits requested for position {position}, expected a position of this call \
         ({first}..{end})"
    )]
    LogitsPosition {
        position: usize,
        first: usize,
        end: usize,
    },

    #[error("model option {option} is {found}, expected {expected}")]
    BadOption {
        option: &'static str,
        found: String,
        expected: String,
    },

    #[error("compute backend {backend}: {why}")]
    Backend { backend: String, why: String },
}

/// Loads the linear `module` (`module.weight` plus its scales, any stored format) `[out, in]`
/// onto the backend, which decodes it now or on use (its `WeightResidency`).
pub(crate) fn load_matrix<B: Backend, C: crate::checkpoint::CheckpointConfig>(
    backend: &B,
    ckpt: &Checkpoint<C>,
    module: &str,
    out: usize,
    input: usize,
) -> Result<B::Matrix, CheckpointError> {
    backend.upload_linear(ckpt.loaded_linear(module, out, input)?)
}

/// The most compressed CSA rows (one per 4 tokens) a sequence of the model can reach: the
/// largest top-k that is not trivially "every row" (`max_position_embeddings / 4`, rounded up).
pub fn max_compressed_rows(cfg: &crate::config::ModelConfig) -> usize {
    cfg.max_position_embeddings.div_ceil(4)
}
