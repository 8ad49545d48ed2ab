//! PLACEHOLDER: mHC (hc_pre, hc_post, hc_head).
use super::{Executor, GpuBackend, GpuError, GpuMatrix};
use crate::backend::{HcParams, HcWeights};

pub fn hc_pre<E: Executor>(
    g: &GpuBackend<E>,
    streams: &[f32],
    site: &HcWeights<'_, GpuMatrix<E::Buf>>,
    params: &HcParams,
    input: &mut [f32],
    post: &mut [f32],
    comb: &mut [f32],
) -> Result<(), GpuError> {
    let _ = (g, streams, site, params, input, post, comb);
    Err(GpuError::Other(
        "hc_pre: not implemented on the GPU backend yet".into(),
    ))
}
pub fn hc_post<E: Executor>(
    g: &GpuBackend<E>,
    streams: &mut [f32],
    y: &[f32],
    post: &[f32],
    comb: &[f32],
    n: usize,
) -> Result<(), GpuError> {
    let _ = (g, streams, y, post, comb, n);
    Err(GpuError::Other(
        "hc_post: not implemented on the GPU backend yet".into(),
    ))
}
pub fn hc_head<E: Executor>(
    g: &GpuBackend<E>,
    streams: &[f32],
    site: &HcWeights<'_, GpuMatrix<E::Buf>>,
    params: &HcParams,
    out: &mut [f32],
) -> Result<(), GpuError> {
    let _ = (g, streams, site, params, out);
    Err(GpuError::Other(
        "hc_head: not implemented on the GPU backend yet".into(),
    ))
}
