//! mHC ops of the GPU backend (kernels in `kernels/hyper.cu`): the layer-site pre-mix with
//! Sinkhorn, the post-mix and the head mix (docs/spec/model.md 4.3 / 4.4, the formulas of
//! `crate::model::hyper`).
//!
//! Shapes: `streams [T, n, D]`, block input / output `[T, D]`, `post [T, n]`, `comb [T, n, n]`
//! (comb[j·n + k] multiplies stream j into stream k), all device activations; site weights
//! `mix [(2+n)·n, n·D]` (`[n, n·D]` for the head), `base`, `scale` (host, uploaded per call) as
//! in [`HcWeights`]. `hc_pre` / `hc_head` run on the mix's device, `hc_post` on the current
//! site's; its kernel writes a new streams buffer that replaces the old one.
//!
//! Sequence of `hc_pre` / `hc_head`: the mixes of all tokens are one GEMM (split along k, see
//! `matrix::gemm_split_k`), **always in f32** whatever the backend's GEMM type (the reference
//! computes mHC in f32 and Sinkhorn's 20 rounds amplify operand rounding); the per-token RMS scale
//! of the flattened streams is `norm::rms_scales` (f64 accumulation in 32 lanes, the CPU formula);
//! one thread per token computes pre / post and runs Sinkhorn; the weighted stream sum runs one
//! thread per output element. All per-token math is the CPU's f32 arithmetic in the CPU's order, so
//! only the GEMM's summation order (and an ulp of `expf` on a real GPU) separates the results from
//! the reference.

use super::executor::{buf, grid_for, upload, Arg};
use super::{matrix, Act, Executor, GemmType, GpuBackend, GpuError, GpuMatrix};
use crate::backend::{HcParams, HcWeights};

/// `(raw mixes [T, rows], r [T])` on the mix's device: `streams · mixᵀ` in f32 and the RMS scale
/// `1 / sqrt(mean(x²) + eps)` of each token's flattened streams.
fn mixes_and_scale<E: Executor>(
    e: &E,
    xb: &E::Buf,
    tokens: usize,
    mix: &GpuMatrix<E::Buf>,
    eps: f32,
) -> Result<(E::Buf, E::Buf), GpuError> {
    let mixes = matrix::matmul_device(e, GemmType::F32, xb, tokens, mix)?;
    let r = super::norm::rms_scales(e, xb, tokens, mix.cols, eps)?;
    Ok((mixes, r))
}

/// `out [T, D] = Σ_j w[t, j] · X_j` on the device, into `ob` (`len` values).
fn weighted_sum<E: Executor>(
    e: &E,
    xb: &E::Buf,
    wb: &E::Buf,
    tokens: usize,
    n: usize,
    len: usize,
    ob: &E::Buf,
) -> Result<(), GpuError> {
    let d = len / tokens;
    e.launch(
        "hc_weighted_sum",
        grid_for(len),
        &[
            buf(xb),
            buf(wb),
            buf(ob),
            Arg::I64(tokens as i64),
            Arg::I64(n as i64),
            Arg::I64(d as i64),
        ],
    )
}

/// Layer-site pre-mix (see [`crate::backend::Backend::hc_pre`]).
pub fn hc_pre<E: Executor>(
    g: &GpuBackend<E>,
    streams: &Act<E>,
    site: &HcWeights<'_, GpuMatrix<E::Buf>>,
    params: &HcParams,
    input: &mut Act<E>,
    post: &mut Act<E>,
    comb: &mut Act<E>,
) -> Result<(), GpuError> {
    let n = params.streams;
    let width = site.mix.cols;
    let d = width / n;
    let tokens = streams.len() / width;
    assert_eq!(site.mix.rows, (2 + n) * n, "hc_pre: mix rows");
    assert_eq!(input.len(), tokens * d, "hc_pre: input is not [T, D]");
    assert_eq!(post.len(), tokens * n, "hc_pre: post is not [T, n]");
    assert_eq!(comb.len(), tokens * n * n, "hc_pre: comb is not [T, n, n]");
    if tokens == 0 {
        return Ok(());
    }
    let (dev, e) = (site.mix.device, g.dev_of(site.mix));
    let xb = g.on(streams, dev)?;
    let (mixes, r) = mixes_and_scale(e, &xb, tokens, site.mix, params.norm_eps)?;
    let base = upload(e, site.base)?;
    let scale = upload(e, site.scale)?;
    let pre = e.alloc(tokens * n * 4)?;
    let input_len = input.len();
    let (ib, pb, cb) = (
        g.output(input, dev)?,
        g.output(post, dev)?,
        g.output(comb, dev)?,
    );
    e.launch(
        "hc_pre_coeffs",
        grid_for(tokens),
        &[
            buf(&mixes),
            buf(&r),
            buf(&base),
            buf(&scale),
            buf(&pre),
            buf(pb),
            buf(cb),
            Arg::I64(tokens as i64),
            Arg::I64(n as i64),
            Arg::I64(params.sinkhorn_iters as i64),
            Arg::F32(params.hc_eps),
        ],
    )?;
    weighted_sum(e, &xb, &pre, tokens, n, input_len, ib)
}

/// Post-mix in place (see [`crate::backend::Backend::hc_post`]).
pub fn hc_post<E: Executor>(
    g: &GpuBackend<E>,
    streams: &mut Act<E>,
    y: &Act<E>,
    post: &Act<E>,
    comb: &Act<E>,
    n: usize,
) -> Result<(), GpuError> {
    let tokens = post.len() / n;
    if tokens == 0 {
        return Ok(());
    }
    let d = y.len() / tokens;
    let len = streams.len();
    assert_eq!(len, tokens * n * d, "hc_post: streams is not [T, n, D]");
    assert_eq!(comb.len(), tokens * n * n, "hc_post: comb is not [T, n, n]");
    let dev = g.current_index();
    let e = g.dev_at(dev);
    let (yb, pb, cb) = (g.on(y, dev)?, g.on(post, dev)?, g.on(comb, dev)?);
    let ob = e.alloc(len * 4)?;
    e.launch(
        "hc_post_mix",
        grid_for(len),
        &[
            buf(g.migrate(streams, dev)?),
            buf(&*yb),
            buf(&*pb),
            buf(&*cb),
            buf(&ob),
            Arg::I64(tokens as i64),
            Arg::I64(n as i64),
            Arg::I64(d as i64),
        ],
    )?;
    g.replace(streams, dev, ob);
    Ok(())
}

/// Final head mix, no Sinkhorn (see [`crate::backend::Backend::hc_head`]).
pub fn hc_head<E: Executor>(
    g: &GpuBackend<E>,
    streams: &Act<E>,
    site: &HcWeights<'_, GpuMatrix<E::Buf>>,
    params: &HcParams,
    out: &mut Act<E>,
) -> Result<(), GpuError> {
    let n = params.streams;
    let width = site.mix.cols;
    let tokens = streams.len() / width;
    assert_eq!(site.mix.rows, n, "hc_head: mix rows");
    assert_eq!(out.len(), streams.len() / n, "hc_head: out is not [T, D]");
    if tokens == 0 {
        return Ok(());
    }
    let (dev, e) = (site.mix.device, g.dev_of(site.mix));
    let xb = g.on(streams, dev)?;
    let (mixes, r) = mixes_and_scale(e, &xb, tokens, site.mix, params.norm_eps)?;
    let base = upload(e, site.base)?;
    let scale = upload(e, site.scale)?;
    let pre = e.alloc(tokens * n * 4)?;
    e.launch(
        "hc_head_coeffs",
        grid_for(tokens * n),
        &[
            buf(&mixes),
            buf(&r),
            buf(&base),
            buf(&scale),
            buf(&pre),
            Arg::I64(tokens as i64),
            Arg::I64(n as i64),
            Arg::F32(params.hc_eps),
        ],
    )?;
    let len = out.len();
    weighted_sum(e, &xb, &pre, tokens, n, len, g.output(out, dev)?)
}
