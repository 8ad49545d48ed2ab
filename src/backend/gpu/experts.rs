//! The MoE ops on the GPU backend (docs/spec/model.md 5; kernels in `kernels/moe.cu`): router scores, the
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
//! - batched (`GpuBackend::with_moe_batched`, when every used expert's weights are resident):
//!   each expert's rows are padded to a size of the series 1, 2, 3, 4, 6, 8, 12, ...
//!   ([`padded_group_rows`], padding rows have token 0 and route weight 0 and are never
//!   summed), the groups ordered by size ([`BatchedLayout`]); each size class is one
//!   `gemm_each_weight` call per weight instead of one GEMM per expert. Less than 1.5 times
//!   the real rows in all, within the plan's workspace (which counts twice).
//!
//! With [`GemmType::F32`] every step equals the CPU's up to the GEMMs' summation order (and
//! `expf` ulps); with [`GemmType::Bf16`] GEMM operands (gathered rows, SwiGLU output) are
//! rounded to bf16 (ties to even), accumulation stays f32. The products run on the device
//! holding the weights ([`GpuBackend::dev_of`]); the routed experts of a call must share one.
//! `u` and the outputs are device activations; only the router scores (which the model routes
//! with) are downloaded, and the routes uploaded.

use super::executor::{buf, download, grid_for, upload, Arg, Executor, GemmType};
pub use super::experts_layout::{padded_group_rows, BatchedLayout, SizeClass};
use super::matrix::{self, gemm_weight, resident_operand, WeightProduct};
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

/// Device buffers of FFNs over `rows` rows (the input rows live elsewhere): each FFN works on
/// its own span of rows, so the routed experts of a call share one set.
struct Scratch<B> {
    /// f32 `[rows, I]` products of w1 and w3.
    gate: B,
    up: B,
    /// SwiGLU output in the GEMM type `[rows, I]`.
    act: B,
    /// f32 output `[rows, D]`.
    y: B,
    ty: GemmType,
    d: usize,
    inter: usize,
}

impl<B> Scratch<B> {
    fn new<E: Executor<Buf = B>>(
        e: &E,
        ty: GemmType,
        rows: usize,
        d: usize,
        inter: usize,
    ) -> Result<Self, GpuError> {
        // Every step writes the rows the next one reads (GEMM outputs, SwiGLU): no zero fill.
        Ok(Scratch {
            gate: e.alloc_uninit(rows * inter * 4)?,
            up: e.alloc_uninit(rows * inter * 4)?,
            act: e.alloc_uninit(rows * inter * ty.bytes())?,
            y: e.alloc_uninit(rows * d * 4)?,
            ty,
            d,
            inter,
        })
    }

    /// Rows `first..first + n` of gate and up: `x` rows (GEMM type, `[*, D]`) times w1 and w3.
    fn gate_up<E: Executor<Buf = B>>(
        &mut self,
        e: &E,
        w: &FfnWeights<GpuMatrix<B>>,
        x: &B,
        first: usize,
        n: usize,
    ) -> Result<(), GpuError> {
        let (ty, d, inter) = (self.ty, self.d, self.inter);
        for (m, y) in [(&w.w1, &mut self.gate), (&w.w3, &mut self.up)] {
            let p = WeightProduct {
                x,
                x_offset: first * d * ty.bytes(),
                ldx: d,
                m: n,
                y,
                y_offset: first * inter * 4,
                ldy: inter,
            };
            gemm_weight(e, ty, m, 0..inter, p)?;
        }
        Ok(())
    }

    /// The clamped SwiGLU of rows `0..rows` into `act`, each row times `row_w[row]` (or not,
    /// for [`Arg::Null`]).
    fn swiglu<E: Executor<Buf = B>>(
        &self,
        e: &E,
        rows: usize,
        row_w: Arg<'_, B>,
        limit: f32,
    ) -> Result<(), GpuError> {
        if rows * self.inter == 0 {
            return Ok(());
        }
        e.launch(
            "moe_swiglu",
            grid_for(rows * self.inter),
            &[
                buf(&self.gate),
                buf(&self.up),
                row_w,
                Arg::I64(rows as i64),
                Arg::I64(self.inter as i64),
                Arg::F32(limit),
                buf(&self.act),
                Arg::I32((self.ty == GemmType::Bf16) as i32),
            ],
        )
    }

    /// Gate and up of the padded groups of one size class (see [`BatchedLayout`]): group p of
    /// `class` has rows `class.first + p·class.per ..`, times its own w1 / w3; one batched
    /// GEMM each.
    fn gate_up_each<E: Executor<Buf = B>>(
        &mut self,
        e: &E,
        w: &ResidentExperts<'_, B>,
        x: &B,
        class: &SizeClass,
    ) -> Result<(), GpuError> {
        let g = class.gemm(self.d, self.inter, self.ty);
        e.gemm_each_weight(&g, x, &class.pick(&w.w1), &mut self.gate)?;
        e.gemm_each_weight(&g, x, &class.pick(&w.w3), &mut self.up)
    }

    /// y of the padded groups of [`Self::gate_up_each`]: each group's `act` rows times its w2.
    fn down_each<E: Executor<Buf = B>>(
        &mut self,
        e: &E,
        w: &ResidentExperts<'_, B>,
        class: &SizeClass,
    ) -> Result<(), GpuError> {
        let g = class.gemm(self.inter, self.d, self.ty);
        e.gemm_each_weight(&g, &self.act, &class.pick(&w.w2), &mut self.y)
    }

    /// Rows `first..first + n` of y: those rows of `act` times w2.
    fn down<E: Executor<Buf = B>>(
        &mut self,
        e: &E,
        w: &FfnWeights<GpuMatrix<B>>,
        first: usize,
        n: usize,
    ) -> Result<(), GpuError> {
        let (ty, d, inter) = (self.ty, self.d, self.inter);
        let p = WeightProduct {
            x: &self.act,
            x_offset: first * inter * ty.bytes(),
            ldx: inter,
            m: n,
            y: &mut self.y,
            y_offset: first * d * 4,
            ldy: d,
        };
        gemm_weight(e, ty, &w.w2, 0..d, p)
    }
}

/// The whole weights of a call's used experts, resident in the GEMM type (stored that way or
/// decoded copies), as `(buffer, byte offset)` operands for [`Executor::gemm_each_weight`].
struct ResidentExperts<'a, B> {
    w1: Vec<(&'a B, usize)>,
    w3: Vec<(&'a B, usize)>,
    w2: Vec<(&'a B, usize)>,
}

/// [`ResidentExperts`] of `used`, or None when some weight has no resident form (no copy
/// budget left): the call then runs expert by expert.
fn resident_experts<'a, E: Executor>(
    e: &E,
    ty: GemmType,
    experts: &'a [FfnWeights<GpuMatrix<E::Buf>>],
    used: &[usize],
) -> Result<Option<ResidentExperts<'a, E::Buf>>, GpuError> {
    let mut r = ResidentExperts {
        w1: Vec::with_capacity(used.len()),
        w3: Vec::with_capacity(used.len()),
        w2: Vec::with_capacity(used.len()),
    };
    for &x in used {
        let f = &experts[x];
        for (m, list) in [(&f.w1, &mut r.w1), (&f.w3, &mut r.w3), (&f.w2, &mut r.w2)] {
            match resident_operand(e, m, ty)? {
                Some(b) => list.push((b, 0)),
                None => return Ok(None),
            }
        }
    }
    Ok(Some(r))
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
    s.gate_up(e, ffn, x, 0, tokens)?;
    s.swiglu(e, tokens, Arg::Null, swiglu_limit)?;
    s.down(e, ffn, 0, tokens)?;
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
    if used.iter().any(|&x| experts[x].w1.rows != inter_max) {
        return Err(GpuError::Other(
            "moe: routed experts of different intermediate sizes".into(),
        ));
    }
    let inter = inter_max;
    let (e, ty) = (g.dev_of(&experts[used[0]].w1), g.gemm_type());
    let counts: Vec<usize> = used.iter().map(|&x| members[x].len()).collect();
    let slots = tokens * k;
    // The batched products need every used expert's whole weights resident (stored in the
    // GEMM type or decoded copies); they pad each expert's rows to its size class (less than
    // 1.5 times the real rows in all, within the memory plan's MoE workspace).
    let batched = if g.moe_batched() {
        resident_experts(e, ty, experts, &used)?
    } else {
        None
    };
    let layout = batched.as_ref().map(|_| BatchedLayout::new(&counts));
    if batched.is_some() {
        g.count_moe_batched();
    }
    // First row of each used expert: packed one after another, or as the batched layout says.
    let starts: Vec<usize> = match &layout {
        Some(l) => l.starts.clone(),
        None => counts
            .iter()
            .scan(0usize, |first, &n| {
                let start = *first;
                *first += n;
                Some(start)
            })
            .collect(),
    };
    let rows = layout.as_ref().map_or(slots, |l| l.rows);
    let to_i32 = |v: usize| {
        i32::try_from(v).map_err(|_| GpuError::Other("moe: row index exceeds i32".into()))
    };
    // Per row its token and route weight (padding rows: token 0, weight 0); per slot its row.
    let (mut token_ids, mut row_w, mut row_of_slot) =
        (vec![0i32; rows], vec![0f32; rows], vec![0i32; slots]);
    for (p, &x) in used.iter().enumerate() {
        for (r, &slot) in members[x].iter().enumerate() {
            let row = starts[p] + r;
            token_ids[row] = to_i32(slot / k)?;
            row_w[row] = routes.weights[slot];
            row_of_slot[slot] = to_i32(row)?;
        }
    }
    let ub = g.on(u, device)?;
    let token_ids = upload(e, &token_ids)?;
    let row_of_slot = upload(e, &row_of_slot)?;
    let row_w = upload(e, &row_w)?;
    // All rows gathered at once (written in full: no zero fill), then each expert's rows
    // through w1 and w3, one SwiGLU over every row with its route weight, and each expert's
    // rows through w2.
    let xrows = e.alloc_uninit(rows * d * ty.bytes())?;
    gather(e, &ub, buf(&token_ids), rows, d, &xrows, ty)?;
    let mut s = Scratch::new(e, ty, rows, d, inter)?;
    match (&batched, &layout) {
        (Some(w), Some(l)) => {
            for class in &l.classes {
                s.gate_up_each(e, w, &xrows, class)?;
            }
        }
        _ => {
            for ((&x, &first), &n) in used.iter().zip(&starts).zip(&counts) {
                s.gate_up(e, &experts[x], &xrows, first, n)?;
            }
        }
    }
    s.swiglu(e, rows, buf(&row_w), swiglu_limit)?;
    match (&batched, &layout) {
        (Some(w), Some(l)) => {
            for class in &l.classes {
                s.down_each(e, w, class)?;
            }
        }
        _ => {
            for ((&x, &first), &n) in used.iter().zip(&starts).zip(&counts) {
                s.down(e, &experts[x], first, n)?;
            }
        }
    }
    if d == 0 {
        return Ok(());
    }
    e.launch(
        "moe_sum_rows",
        grid_for(tokens * d),
        &[
            buf(&s.y),
            buf(&row_of_slot),
            Arg::I64(tokens as i64),
            Arg::I64(k as i64),
            Arg::I64(d as i64),
            buf(g.output(out, device)?),
        ],
    )
}
