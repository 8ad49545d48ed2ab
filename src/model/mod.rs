//! The DeepSeek-V4 forward pass, one file per component in forward order:
//! [`embed`] → per layer { [`hyper`] (mHC pre) → [`attention`] (with [`rope`], [`compressor`],
//! [`indexer`]) → mHC post → mHC pre → [`moe`] → mHC post } ([`layer`]) → [`head`].
//! [`state`] holds the per-sequence caches, [`forward`] the [`Engine`] (loading, the chunk /
//! layer loop, the observer calls), [`bench`] the prefill benchmark, [`observer`] the fixed
//! interface to the probe.
//!
//! Every op runs on a [`Backend`](crate::backend::Backend); the CPU backend is the reference.
//! Weights are decoded to f32 at load, one layer at a time (`Layer::load`), so that streaming
//! layers for models larger than RAM is a change to `Engine`'s loop, not to the components.

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
pub mod rope;
pub mod state;

pub use bench::{bench_prefill, BenchFigures};
pub use forward::{Engine, EngineOptions, ForwardOutput, LogitsRequest};
pub use observer::{AttentionObservation, IndexerObservation, NoObserver, Observer};
pub use state::SequenceState;

use crate::backend::Backend;
use crate::checkpoint::{Checkpoint, CheckpointError};

/// Errors of loading or running the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
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

    #[error("tensor {tensor}: {problem}")]
    BadTensor { tensor: String, problem: String },

    #[error(
        "logits requested for position {position}, expected a position of this call \
         ({first}..{end})"
    )]
    LogitsPosition {
        position: usize,
        first: usize,
        end: usize,
    },

    #[error("engine option {option} is {found}, expected {expected}")]
    BadOption {
        option: &'static str,
        found: String,
        expected: String,
    },
}

/// Loads the linear `module` (`module.weight` plus its scales, any stored format) decoded to f32
/// `[out, in]` and uploads it to the backend.
pub(crate) fn load_matrix<B: Backend>(
    backend: &B,
    ckpt: &Checkpoint,
    module: &str,
    out: usize,
    input: usize,
) -> Result<B::Matrix, CheckpointError> {
    let data = ckpt.linear_f32(module, out, input)?;
    Ok(backend.upload_matrix(data, out, input))
}
