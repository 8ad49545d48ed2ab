//! PLACEHOLDER: elementwise ops (rms_norm, rope, swiglu, kv_fp8_sim, compressor_pool).
use super::{Executor, GpuBackend, GpuError};
use crate::model::rope::RopeTable;

pub fn rms_norm<E: Executor>(
    g: &GpuBackend<E>,
    x: &mut [f32],
    dim: usize,
    weight: Option<&[f32]>,
    eps: f32,
) -> Result<(), GpuError> {
    let _ = (g, x, dim, weight, eps);
    Err(GpuError::Other(
        "rms_norm: not implemented on the GPU backend yet".into(),
    ))
}
pub fn rope<E: Executor>(
    g: &GpuBackend<E>,
    table: &RopeTable,
    x: &mut [f32],
    vec_len: usize,
    positions: &[usize],
    inverse: bool,
) -> Result<(), GpuError> {
    let _ = (g, table, x, vec_len, positions, inverse);
    Err(GpuError::Other(
        "rope: not implemented on the GPU backend yet".into(),
    ))
}
pub fn swiglu<E: Executor>(
    g: &GpuBackend<E>,
    gate: &mut [f32],
    up: &[f32],
    limit: f32,
) -> Result<(), GpuError> {
    let _ = (g, gate, up, limit);
    Err(GpuError::Other(
        "swiglu: not implemented on the GPU backend yet".into(),
    ))
}
pub fn kv_fp8_sim<E: Executor>(
    g: &GpuBackend<E>,
    rows: &mut [f32],
    row_len: usize,
    nope_dims: usize,
) -> Result<(), GpuError> {
    let _ = (g, rows, row_len, nope_dims);
    Err(GpuError::Other(
        "kv_fp8_sim: not implemented on the GPU backend yet".into(),
    ))
}
pub fn compressor_pool<E: Executor>(
    g: &GpuBackend<E>,
    values: &[f32],
    logits: &[f32],
    slots: usize,
    width: usize,
    out: &mut [f32],
) -> Result<(), GpuError> {
    let _ = (g, values, logits, slots, width, out);
    Err(GpuError::Other(
        "compressor_pool: not implemented on the GPU backend yet".into(),
    ))
}
