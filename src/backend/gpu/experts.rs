//! PLACEHOLDER: router, routed experts, shared expert.
use super::{Executor, GpuBackend, GpuError, GpuMatrix};
use crate::backend::{FfnWeights, Routes};

pub fn router_scores<E: Executor>(
    g: &GpuBackend<E>,
    u: &[f32],
    gate: &GpuMatrix<E::Buf>,
    out: &mut [f32],
) -> Result<(), GpuError> {
    let _ = (g, u, gate, out);
    Err(GpuError::Other(
        "router_scores: not implemented on the GPU backend yet".into(),
    ))
}
pub fn moe_experts<E: Executor>(
    g: &GpuBackend<E>,
    u: &[f32],
    routes: &Routes<'_>,
    experts: &[FfnWeights<GpuMatrix<E::Buf>>],
    swiglu_limit: f32,
    out: &mut [f32],
) -> Result<(), GpuError> {
    let _ = (g, u, routes, experts, swiglu_limit, out);
    Err(GpuError::Other(
        "moe_experts: not implemented on the GPU backend yet".into(),
    ))
}
pub fn ffn<E: Executor>(
    g: &GpuBackend<E>,
    u: &[f32],
    ffn: &FfnWeights<GpuMatrix<E::Buf>>,
    swiglu_limit: f32,
    out: &mut [f32],
) -> Result<(), GpuError> {
    let _ = (g, u, ffn, swiglu_limit, out);
    Err(GpuError::Other(
        "ffn: not implemented on the GPU backend yet".into(),
    ))
}
