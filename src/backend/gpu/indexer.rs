//! PLACEHOLDER: lightning indexer (prepare keys / queries, scores, top-k).
use super::{Executor, GpuBackend, GpuError};
use crate::numerics::profiles::{IndexProfile, PreparedQuery};

pub fn index_prepare_keys<E: Executor>(
    g: &GpuBackend<E>,
    profile: IndexProfile,
    raw: &[f32],
    dim: usize,
    prepared: &mut [f32],
    scales: &mut [f32],
) -> Result<(), GpuError> {
    let _ = (g, profile, raw, dim, prepared, scales);
    Err(GpuError::Other(
        "index_prepare_keys: not implemented on the GPU backend yet".into(),
    ))
}
pub fn index_prepare_query<E: Executor>(
    g: &GpuBackend<E>,
    profile: IndexProfile,
    q_raw: &[f32],
    weights_raw: &[f32],
    heads: usize,
    dim: usize,
) -> Result<PreparedQuery, GpuError> {
    let _ = (g, profile, q_raw, weights_raw, heads, dim);
    Err(GpuError::Other(
        "index_prepare_query: not implemented on the GPU backend yet".into(),
    ))
}
pub fn index_scores<E: Executor>(
    g: &GpuBackend<E>,
    profile: IndexProfile,
    query: &PreparedQuery,
    keys: &[f32],
    key_scales: &[f32],
    dim: usize,
    out: &mut [f32],
) -> Result<(), GpuError> {
    let _ = (g, profile, query, keys, key_scales, dim, out);
    Err(GpuError::Other(
        "index_scores: not implemented on the GPU backend yet".into(),
    ))
}
#[allow(clippy::too_many_arguments)]
pub fn index_scores_batch<E: Executor>(
    g: &GpuBackend<E>,
    profile: IndexProfile,
    queries: &[f32],
    weights: &[f32],
    heads: usize,
    dim: usize,
    keys: &[f32],
    key_scales: &[f32],
    visible: &[usize],
    out: &mut [f32],
) -> Result<(), GpuError> {
    let _ = (
        g, profile, queries, weights, heads, dim, keys, key_scales, visible, out,
    );
    Err(GpuError::Other(
        "index_scores_batch: not implemented on the GPU backend yet".into(),
    ))
}
pub fn topk<E: Executor>(
    g: &GpuBackend<E>,
    scores: &[f32],
    out: &mut [i32],
) -> Result<(), GpuError> {
    let _ = (g, scores, out);
    Err(GpuError::Other(
        "topk: not implemented on the GPU backend yet".into(),
    ))
}
