//! Elementwise and per-vector ops of the GPU backend (kernels in `kernels/elementwise.cu`):
//! RMS norm, RoPE, clamped SwiGLU, the residual add, compressor pooling and the `--kv fp8`
//! simulation, all on device-resident activations ([`GpuAct`]) on the current site's device
//! (an operand living elsewhere is moved there first, see [`super::act`]).
//!
//! Shapes (the [`crate::backend::Backend`] contract): `rms_norm` on `x [rows, dim]` in place,
//! optional `weight [dim]` (host, uploaded per call); `rope` on `x [P, vecs, vec_len]` with
//! `positions [P]`, rotating the last `table.rope_dim()` dims of every vector; `swiglu` on
//! `gate [n]`, `up [n]`; `add_assign` on `x [n]`, `y [n]`; `compressor_pool` from the
//! device-resident token projections `values`, `logits [n, width]` (and host slot biases
//! `ape [ratio, width]`, uploaded) to `out [rows, c]`, each output element gathering its slots
//! by index ([`PoolLayout`]); `kv_fp8_sim` on `rows [R, row_len]` in place.
//!
//! Every op repeats the CPU reference's arithmetic in its order, so on the host emulator the
//! results are bit-identical; on a GPU only `expf` (SwiGLU, pooling) may differ by an ulp.
//! Numerical choices that are not obvious:
//! - RMS norm takes the mean square in f64 over 32 interleaved lanes per vector (one thread per
//!   lane, then one per vector adds the lanes), exactly the CPU's `rms_scale`; scaling runs one
//!   thread per element.
//! - RoPE's cos / sin are evaluated on the host by [`RopeTable::cos_sin`] (REF's f32 angle, its
//!   sin / cos correctly rounded from f64), exactly the values the CPU uses, and uploaded as
//!   `[P, rope_dim/2]` tables; the kernel only rotates. Device `sinf` / `cosf` may differ from
//!   the correctly rounded value in the last ulp, which would break bit parity with the CPU.
//! - `kv_fp8_sim` writes a new buffer that replaces the rows', because each element recomputes
//!   its 64-block's amax from the original values.

use super::executor::{buf, grid_for, Arg};
use super::{Act, Executor, GpuAct, GpuBackend, GpuError};
use crate::backend::PoolLayout;
use crate::numerics::rope::RopeTable;
use rayon::prelude::*;

/// `r [rows]`: `1 / sqrt(mean(x²) + eps)` of each `dim`-long vector of `x` (f32 on the device),
/// the CPU's [`crate::backend::cpu::rms_scale`] bit for bit: `el_rms_lanes` sums the squares in
/// f64 over [`crate::backend::cpu::RMS_LANES`] interleaved lanes per vector (coalesced reads,
/// `rows x 32` threads: one thread per 16,384-wide mHC row took 0.76 ms on an H200), then
/// `el_rms_inv` adds the lanes in order.
pub fn rms_scales<E: Executor>(
    e: &E,
    x: &E::Buf,
    rows: usize,
    dim: usize,
    eps: f32,
) -> Result<E::Buf, GpuError> {
    let lanes = crate::backend::cpu::RMS_LANES;
    // Both kernels write every element they produce.
    let sums = e.alloc_uninit(rows * lanes * 8)?;
    let r = e.alloc_uninit(rows * 4)?;
    e.launch(
        "el_rms_lanes",
        grid_for(rows * lanes),
        &[
            buf(x),
            buf(&sums),
            Arg::I64(rows as i64),
            Arg::I64(dim as i64),
        ],
    )?;
    e.launch(
        "el_rms_inv",
        grid_for(rows),
        &[
            buf(&sums),
            buf(&r),
            Arg::I64(rows as i64),
            Arg::I64(dim as i64),
            Arg::F32(eps),
        ],
    )?;
    Ok(r)
}

/// In-place RMS norm of every `dim`-long vector of `x` (see [`crate::backend::Backend::rms_norm`]).
pub fn rms_norm<E: Executor>(
    g: &GpuBackend<E>,
    x: &mut Act<E>,
    dim: usize,
    weight: Option<&[f32]>,
    eps: f32,
) -> Result<(), GpuError> {
    assert!(
        dim > 0 && x.len().is_multiple_of(dim),
        "rms_norm: length not a multiple of dim"
    );
    if let Some(w) = weight {
        assert_eq!(w.len(), dim, "rms_norm: weight length");
    }
    if x.is_empty() {
        return Ok(());
    }
    let (n, rows) = (x.len(), x.len() / dim);
    let d = g.current_index();
    let e = g.dev_at(d);
    let xb = g.migrate(x, d)?;
    let wb = weight.map(|w| g.up(w)).transpose()?;
    let rb = rms_scales(e, xb, rows, dim, eps)?;
    e.launch(
        "el_rms_apply",
        grid_for(n),
        &[
            buf(xb),
            buf(&rb),
            wb.as_ref().map_or(Arg::Null, buf),
            Arg::I64(rows as i64),
            Arg::I64(dim as i64),
        ],
    )
}

/// In-place RoPE (see [`crate::backend::Backend::rope`]).
pub fn rope<E: Executor>(
    g: &GpuBackend<E>,
    table: &RopeTable,
    x: &mut Act<E>,
    vec_len: usize,
    positions: &[usize],
    inverse: bool,
) -> Result<(), GpuError> {
    if positions.is_empty() || x.is_empty() {
        return Ok(());
    }
    let per_pos = x.len() / positions.len();
    assert_eq!(
        per_pos * positions.len(),
        x.len(),
        "rope: x not [P, vecs, len]"
    );
    assert!(
        vec_len > 0 && per_pos.is_multiple_of(vec_len),
        "rope: row not a whole number of vectors"
    );
    let d_r = table.rope_dim();
    assert!(d_r <= vec_len, "rope: rope dims exceed the vector");
    let half = d_r / 2;
    let (mut cos, mut sin) = (
        vec![0f32; positions.len() * half],
        vec![0f32; positions.len() * half],
    );
    // sin_cos per (position, pair): spread over rayon's pool like the CPU's rope.
    cos.par_chunks_mut(half)
        .zip(sin.par_chunks_mut(half))
        .zip(positions.par_iter())
        .for_each(|((c, s), &pos)| table.cos_sin(pos, c, s));
    let pairs = positions.len() * (per_pos / vec_len) * half;
    let d = g.current_index();
    let xb = g.migrate(x, d)?;
    let (cb, sb) = (g.up(&cos)?, g.up(&sin)?);
    g.dev_at(d).launch(
        "el_rope",
        grid_for(pairs),
        &[
            buf(xb),
            buf(&cb),
            buf(&sb),
            Arg::I64(positions.len() as i64),
            Arg::I64(per_pos as i64),
            Arg::I64(vec_len as i64),
            Arg::I64(d_r as i64),
            Arg::I32(inverse as i32),
        ],
    )
}

/// Clamped SwiGLU in place: `gate ← silu(min(gate, l)) · clamp(up, -l, l)`.
pub fn swiglu<E: Executor>(
    g: &GpuBackend<E>,
    gate: &mut Act<E>,
    up: &Act<E>,
    limit: f32,
) -> Result<(), GpuError> {
    assert_eq!(gate.len(), up.len(), "swiglu: gate and up differ in length");
    if gate.is_empty() {
        return Ok(());
    }
    let (n, d) = (gate.len(), g.current_index());
    let ub = g.on(up, d)?;
    let gb = g.migrate(gate, d)?;
    g.dev_at(d).launch(
        "el_swiglu",
        grid_for(n),
        &[buf(gb), buf(&*ub), Arg::I64(n as i64), Arg::F32(limit)],
    )
}

/// In-place `x ← x + y`.
pub fn add_assign<E: Executor>(
    g: &GpuBackend<E>,
    x: &mut Act<E>,
    y: &Act<E>,
) -> Result<(), GpuError> {
    assert_eq!(x.len(), y.len(), "add_assign: x and y differ in length");
    if x.is_empty() {
        return Ok(());
    }
    let (n, d) = (x.len(), g.current_index());
    let yb = g.on(y, d)?;
    let xb = g.migrate(x, d)?;
    g.dev_at(d).launch(
        "el_add_assign",
        grid_for(n),
        &[buf(xb), buf(&*yb), Arg::I64(n as i64)],
    )
}

/// `--kv fp8` simulation of the first `nope_dims` dims of every row of length `row_len`.
pub fn kv_fp8_sim<E: Executor>(
    g: &GpuBackend<E>,
    rows: &mut Act<E>,
    row_len: usize,
    nope_dims: usize,
) -> Result<(), GpuError> {
    if rows.is_empty() {
        return Ok(());
    }
    assert!(
        row_len > 0 && rows.len().is_multiple_of(row_len),
        "kv_fp8_sim: rows not [R, row_len]"
    );
    let (n, d) = (rows.len(), g.current_index());
    let e = g.dev_at(d);
    let ob = e.alloc(n * 4)?;
    e.launch(
        "el_kv_fp8_sim",
        grid_for(n),
        &[
            buf(g.migrate(rows, d)?),
            buf(&ob),
            Arg::I64((n / row_len) as i64),
            Arg::I64(row_len as i64),
            Arg::I64(nope_dims as i64),
        ],
    )?;
    g.replace(rows, d, ob);
    Ok(())
}

/// Compressor pooling ([`crate::backend::Backend::compressor_pool`]) from the device-resident
/// token projections: only the slot biases are uploaded.
pub fn compressor_pool<E: Executor>(
    g: &GpuBackend<E>,
    values: &GpuAct<E::Buf>,
    logits: &GpuAct<E::Buf>,
    ape: &[f32],
    layout: PoolLayout,
    out: &mut GpuAct<E::Buf>,
) -> Result<(), GpuError> {
    let c = layout.c;
    let rows = layout.check(values.len(), logits.len(), ape.len(), out.len());
    if out.is_empty() {
        return Ok(());
    }
    let d = g.current_index();
    let vb = g.on(values, d)?;
    let lb = g.on(logits, d)?;
    let ab = g.up(ape)?;
    let ob = g.output(out, d)?;
    g.dev_at(d).launch(
        "el_compressor_pool",
        grid_for(rows * c),
        &[
            buf(&*vb),
            buf(&*lb),
            buf(&ab),
            buf(ob),
            Arg::I64(rows as i64),
            Arg::I64(c as i64),
            Arg::I64(layout.ratio as i64),
            Arg::I32(layout.overlap as i32),
            Arg::I64(layout.first_window as i64),
            Arg::I32(layout.first_has_previous as i32),
        ],
    )
}
