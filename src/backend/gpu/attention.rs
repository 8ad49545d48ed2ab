//! PLACEHOLDER: sparse attention with sink.
use super::{Executor, GpuBackend, GpuError};
use crate::backend::{AttentionBatch, AttentionProbs};

pub fn sparse_attention<E: Executor>(
    g: &GpuBackend<E>,
    batch: &AttentionBatch<'_>,
    out: &mut [f32],
    probs: &mut [Option<AttentionProbs>],
) -> Result<(), GpuError> {
    let _ = (g, batch, out, probs);
    Err(GpuError::Other(
        "sparse_attention: not implemented on the GPU backend yet".into(),
    ))
}
