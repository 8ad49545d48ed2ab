//! The MoE ops on the GPU backend (model.md 5; kernels in `kernels/moe.cu`): router scores, the
//! dense shared expert and the routed experts grouped by expert.
//!
//! - `router_scores`: `u [T, D] · gateᵀ` always in [`GemmType::F32`] (the router picks experts:
//!   REF scores in f32), then `sqrt(softplus(·))` in place (`moe_sqrtsoftplus`, softplus linear
//!   above 20) → `[T, E]`.
//! - `ffn`: `w1` and `w3` products in the backend's GEMM type, clamped SwiGLU (`moe_swiglu`,
//!   written straight in the GEMM type), `w2` product → `[T, D]`.
//! - `moe_experts`: `u` is read in place; the token slots are grouped by expert on the host (the
//!   routes are host data) into one group-major row order, uploaded as token ids, route weights
//!   and each slot's row. One `moe_gather` writes all rows `[S, D]` (S = tokens·k) in the GEMM
//!   type; per expert with tokens, the `w1` and `w3` products of its rows; one `moe_swiglu`
//!   over all rows with each row's route weight multiplying the SwiGLU output (before `w2`, as
//!   the CPU and REF do); per expert the `w2` product of its rows; finally `moe_sum_rows` sums
//!   each token's slots in slot order starting from 0, the CPU's formula and order
//!   (deterministic, no atomics). So a call launches three GEMMs per used expert and three
//!   kernels, and its buffers hold all S rows (the memory plan's MoE workspace).
//!
//! With [`GemmType::F32`] every step equals the CPU's up to the GEMMs' summation order (and
//! `expf` ulps); with [`GemmType::Bf16`] GEMM operands (gathered rows, SwiGLU output) are
//! rounded to bf16 (ties to even), accumulation stays f32. The products run on the device
//! holding the weights ([`GpuBackend::dev_of`]); the routed experts of a call must share one.
//! `u` and the outputs are device activations; only the router scores (which the model routes
//! with) are downloaded, and the routes uploaded.

use super::executor::{buf, download, grid_for, upload, Arg, Executor, GemmType};
use super::matrix::{self, gemm_weight, WeightProduct};
use super::{Act, GpuBackend, GpuError, GpuMatrix};
use crate::backend::{FfnWeights, Routes};

pub fn router_scores<E: Executor>(
    g: &GpuBackend<E>,
    u: &Act<E>,
    gate: &GpuMatrix<E::Buf>,
    out: &mut [f32],
) -> Result<(), GpuError> {
    let m = u.len() / gate.cols.max(1);
    assert_eq!(u.len(), m * gate.cols, "router: u not [T, D]");
    assert_eq!(out.len(), m * gate.rows, "router: out not [T, E]");
    if out.is_empty() {
        return Ok(());
    }
    let e = g.dev_of(gate);
    let ub = g.on(u, gate.device)?;
    let y = matrix::matmul_device(e, GemmType::F32, &ub, m, gate)?;
    let n = out.len();
    e.launch(
        "moe_sqrtsoftplus",
        grid_for(n),
        &[buf(&y), Arg::I64(n as i64)],
    )?;
    download(e, &y, out)
}

/// The intermediate size of `w` after checking its shapes against `d` and that all three
/// matrices live on device `device`.
fn ffn_inter<B>(w: &FfnWeights<GpuMatrix<B>>, d: usize, device: usize) -> Result<usize, GpuError> {
    let inter = w.w1.rows;
    let shapes_ok = w.w1.cols == d
        && (w.w3.rows, w.w3.cols) == (inter, d)
        && (w.w2.rows, w.w2.cols) == (d, inter);
    if !shapes_ok {
        return Err(GpuError::Other(format!(
            "ffn weights w1 {:?}, w3 {:?}, w2 {:?} do not fit a hidden size of {d}",
            (w.w1.rows, w.w1.cols),
            (w.w3.rows, w.w3.cols),
            (w.w2.rows, w.w2.cols)
        )));
    }
    if [&w.w1, &w.w2, &w.w3].iter().any(|m| m.device != device) {
        return Err(GpuError::Other(
            "ffn weights are spread over several devices".into(),
        ));
    }
    Ok(inter)
}

/// Device buffers of one FFN over up to `rows` rows (the input rows live elsewhere).
struct Scratch<B> {
    gate: B,
    up: B,
    /// SwiGLU output in the GEMM type `[rows, I]`.
    act: B,
    /// f32 output `[rows, D]`.
    y: B,
}

impl<B> Scratch<B> {
    fn new<E: Executor<Buf = B>>(
        e: &E,
        ty: GemmType,
        rows: usize,
        d: usize,
        inter: usize,
    ) -> Result<Self, GpuError> {
        // Every use writes the rows it reads first (GEMM outputs, SwiGLU): no zero fill.
        Ok(Scratch {
            gate: e.alloc_uninit(rows * inter * 4)?,
            up: e.alloc_uninit(rows * inter * 4)?,
            act: e.alloc_uninit(rows * inter * ty.bytes())?,
            y: e.alloc_uninit(rows * d * 4)?,
        })
    }
}

/// `s.y [n, D]` = FFN(`x [n, D]`, in the GEMM type), the SwiGLU output scaled per row by
/// `row_w` (or not, for [`Arg::Null`]) before the down projection.
#[allow(clippy::too_many_arguments)]
fn ffn_rows<E: Executor>(
    e: &E,
    ty: GemmType,
    w: &FfnWeights<GpuMatrix<E::Buf>>,
    x: &E::Buf,
    n: usize,
    row_w: Arg<'_, E::Buf>,
    limit: f32,
    s: &mut Scratch<E::Buf>,
) -> Result<(), GpuError> {
    let (d, inter) = (w.w1.cols, w.w1.rows);
    if n == 0 {
        return Ok(());
    }
    for (m, y) in [(&w.w1, &mut s.gate), (&w.w3, &mut s.up)] {
        let p = WeightProduct {
            x,
            x_offset: 0,
            ldx: d,
            m: n,
            y,
            y_offset: 0,
            ldy: inter,
        };
        gemm_weight(e, ty, m, 0..inter, p)?;
    }
    if inter > 0 {
        e.launch(
            "moe_swiglu",
            grid_for(n * inter),
            &[
                buf(&s.gate),
                buf(&s.up),
                row_w,
                Arg::I64(n as i64),
                Arg::I64(inter as i64),
                Arg::F32(limit),
                buf(&s.act),
                Arg::I32((ty == GemmType::Bf16) as i32),
            ],
        )?;
    }
    let p = WeightProduct {
        x: &s.act,
        x_offset: 0,
        ldx: inter,
        m: n,
        y: &mut s.y,
        y_offset: 0,
        ldy: d,
    };
    gemm_weight(e, ty, &w.w2, 0..d, p)
}

/// Launches `moe_gather`: rows `ids[i]` of `src [*, d]` into `dst` in the GEMM type.
fn gather<E: Executor>(
    e: &E,
    src: &E::Buf,
    ids: Arg<'_, E::Buf>,
    n: usize,
    d: usize,
    dst: &E::Buf,
    ty: GemmType,
) -> Result<(), GpuError> {
    if n * d == 0 {
        return Ok(());
    }
    e.launch(
        "moe_gather",
        grid_for(n * d),
        &[
            buf(src),
            ids,
            Arg::I64(n as i64),
            Arg::I64(d as i64),
            buf(dst),
            Arg::I32((ty == GemmType::Bf16) as i32),
        ],
    )
}

pub fn ffn<E: Executor>(
    g: &GpuBackend<E>,
    u: &Act<E>,
    ffn: &FfnWeights<GpuMatrix<E::Buf>>,
    swiglu_limit: f32,
    out: &mut Act<E>,
) -> Result<(), GpuError> {
    let d = ffn.w1.cols;
    let tokens = u.len() / d.max(1);
    assert_eq!(u.len(), tokens * d, "ffn: u not [T, D]");
    assert_eq!(out.len(), u.len(), "ffn: out not [T, D]");
    let inter = ffn_inter(ffn, d, ffn.w1.device)?;
    if out.is_empty() {
        return Ok(());
    }
    let (dev, e, ty) = (ffn.w1.device, g.dev_of(&ffn.w1), g.gemm_type());
    let ub = g.on(u, dev)?;
    let mut converted = None;
    let x = matrix::to_gemm_type(e, &ub, u.len(), ty, &mut converted)?;
    let mut s = Scratch::new(e, ty, tokens, d, inter)?;
    ffn_rows(e, ty, ffn, x, tokens, Arg::Null, swiglu_limit, &mut s)?;
    g.replace(out, dev, s.y);
    Ok(())
}

pub fn moe_experts<E: Executor>(
    g: &GpuBackend<E>,
    u: &Act<E>,
    routes: &Routes<'_>,
    experts: &[FfnWeights<GpuMatrix<E::Buf>>],
    swiglu_limit: f32,
    out: &mut Act<E>,
) -> Result<(), GpuError> {
    let k = routes.per_token;
    let tokens = routes.experts.len() / k.max(1);
    assert_eq!(
        routes.weights.len(),
        routes.experts.len(),
        "moe: one weight per route"
    );
    if tokens == 0 {
        assert!(out.is_empty(), "moe: out not [T, D]");
        return Ok(());
    }
    let d = u.len() / tokens;
    assert_eq!(u.len(), tokens * d, "moe: u not [T, D]");
    assert_eq!(out.len(), tokens * d, "moe: out not [T, D]");
    // Slots per expert, in slot order (as the CPU).
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); experts.len()];
    for (slot, &x) in routes.experts.iter().enumerate() {
        assert!(
            x < experts.len(),
            "moe: route to expert {x} of {}",
            experts.len()
        );
        members[x].push(slot);
    }
    let used: Vec<usize> = (0..experts.len())
        .filter(|&x| !members[x].is_empty())
        .collect();
    let device = experts[used[0]].w1.device;
    let mut inter_max = 0;
    for &x in &used {
        inter_max = inter_max.max(ffn_inter(&experts[x], d, device)?);
    }
    let to_i32 = |v: usize| {
        i32::try_from(v).map_err(|_| GpuError::Other("moe: slot index exceeds i32".into()))
    };
    // Group-major token ids, slot ids and route weights of all used experts.
    let (mut token_ids, mut slot_ids, mut row_w) = (Vec::new(), Vec::new(), Vec::new());
    for &x in &used {
        for &slot in &members[x] {
            token_ids.push(to_i32(slot / k)?);
            slot_ids.push(to_i32(slot)?);
            row_w.push(routes.weights[slot]);
        }
    }
    if used.iter().any(|&x| experts[x].w1.rows != inter_max) {
        return Err(GpuError::Other(
            "moe: routed experts of different intermediate sizes".into(),
        ));
    }
    let inter = inter_max;
    // Row of each slot in the group-major order (the inverse of slot_ids).
    let mut row_of_slot = vec![0i32; slot_ids.len()];
    for (row, &slot) in slot_ids.iter().enumerate() {
        row_of_slot[slot as usize] = to_i32(row)?;
    }
    let (e, ty) = (g.dev_of(&experts[used[0]].w1), g.gemm_type());
    let es = ty.bytes();
    let rows = token_ids.len();
    let ub = g.on(u, device)?;
    let token_ids = upload(e, &token_ids)?;
    let row_of_slot = upload(e, &row_of_slot)?;
    let row_w = upload(e, &row_w)?;
    // Every buffer below is written in full before it is read (the gather, each expert's
    // products over its own rows, the SwiGLU over all rows): no zero fill.
    let xrows = e.alloc_uninit(rows * d * es)?;
    let mut gate = e.alloc_uninit(rows * inter * 4)?;
    let mut up = e.alloc_uninit(rows * inter * 4)?;
    let act = e.alloc_uninit(rows * inter * es)?;
    let mut y = e.alloc_uninit(rows * d * 4)?;
    gather(e, &ub, buf(&token_ids), rows, d, &xrows, ty)?;
    // Per expert, its rows of gate and up; then one SwiGLU over every row (route weights per
    // row); then per expert its rows of y.
    let spans: Vec<(usize, usize)> = used
        .iter()
        .scan(0usize, |first, &x| {
            let span = (*first, members[x].len());
            *first += span.1;
            Some(span)
        })
        .collect();
    for (&x, &(first, n)) in used.iter().zip(&spans) {
        for (m, out_rows) in [(&experts[x].w1, &mut gate), (&experts[x].w3, &mut up)] {
            let p = WeightProduct {
                x: &xrows,
                x_offset: first * d * es,
                ldx: d,
                m: n,
                y: out_rows,
                y_offset: first * inter * 4,
                ldy: inter,
            };
            gemm_weight(e, ty, m, 0..inter, p)?;
        }
    }
    if inter > 0 {
        e.launch(
            "moe_swiglu",
            grid_for(rows * inter),
            &[
                buf(&gate),
                buf(&up),
                buf(&row_w),
                Arg::I64(rows as i64),
                Arg::I64(inter as i64),
                Arg::F32(swiglu_limit),
                buf(&act),
                Arg::I32((ty == GemmType::Bf16) as i32),
            ],
        )?;
    }
    for (&x, &(first, n)) in used.iter().zip(&spans) {
        let p = WeightProduct {
            x: &act,
            x_offset: first * inter * es,
            ldx: inter,
            m: n,
            y: &mut y,
            y_offset: first * d * 4,
            ldy: d,
        };
        gemm_weight(e, ty, &experts[x].w2, 0..d, p)?;
    }
    if d == 0 {
        return Ok(());
    }
    e.launch(
        "moe_sum_rows",
        grid_for(tokens * d),
        &[
            buf(&y),
            buf(&row_of_slot),
            Arg::I64(tokens as i64),
            Arg::I64(k as i64),
            Arg::I64(d as i64),
            buf(g.output(out, device)?),
        ],
    )
}
