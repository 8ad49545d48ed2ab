// moe.cu: the elementwise and data-movement steps of the router, the routed experts and the
// shared expert (docs/spec/model.md 5), the arithmetic of src/backend/cpu/experts.rs step for step.
// The products themselves are GEMMs (src/backend/gpu/matrix.rs).
//
//   moe_sqrtsoftplus: x = sqrt(softplus(x)), PyTorch softplus (linear above 20)
//   moe_gather:       rows of x [T, d] picked by an i32 id list, as f32 or bf16 (GEMM operand)
//   moe_swiglu:       a = silu(min(g, l)) * clamp(v, -l, l), times an optional per-row weight
//                     (the route weight, applied before w2 as the CPU does), as f32 or bf16
//   moe_sum_rows:     out[t] = 0 + slot 0 + slot 1 + ... (slot order, as the CPU), slot s
//                     read from row row_of_slot[s] of the experts' outputs (grouped by expert)

static __device__ __forceinline__ void moe_store(void* out, i64 e, float v, int out_bf16) {
    if (out_bf16) ((u16*)out)[e] = ns_f32_to_bf16(v);
    else ((float*)out)[e] = v;
}

extern "C" __global__ void moe_sqrtsoftplus(float* x, i64 n) {
    NS_FOR(i, n) {
        float v = x[i];
        float sp = v > 20.0f ? v : log1pf(expf(v));
        x[i] = sqrtf(sp);
    }
}

// out[i, c] = x[ids[i], c] for i < rows.
extern "C" __global__ void moe_gather(const float* x, const int* ids, i64 rows, i64 d, void* out,
                                      int out_bf16) {
    NS_FOR(e, rows * d) {
        i64 i = e / d, c = e % d;
        moe_store(out, e, x[(i64)ids[i] * d + c], out_bf16);
    }
}

// gate, up [rows, inter] f32; row_w [rows] or null; out [rows, inter] f32 or bf16.
// As Rust's f32::min(g, l), a NaN g gives l (the comparison fails); clamp keeps a NaN v.
extern "C" __global__ void moe_swiglu(const float* gate, const float* up, const float* row_w,
                                      i64 rows, i64 inter, float limit, void* out, int out_bf16) {
    NS_FOR(e, rows * inter) {
        float g = gate[e];
        float g1 = g < limit ? g : limit;
        float v = up[e];
        if (v < -limit) v = -limit;
        if (v > limit) v = limit;
        float silu = g1 / (1.0f + expf(-g1));
        float a = silu * v;
        if (row_w) a = a * row_w[e / inter];
        moe_store(out, e, a, out_bf16);
    }
}

// rows [*, d] (slot s's value in row row_of_slot[s]) -> out [tokens, d], summing a token's
// slots in slot order starting from 0 (the CPU's formula and order).
extern "C" __global__ void moe_sum_rows(const float* rows, const int* row_of_slot, i64 tokens,
                                        i64 k, i64 d, float* out) {
    NS_FOR(e, tokens * d) {
        i64 t = e / d, c = e % d;
        float acc = 0.0f;
        for (i64 s = 0; s < k; ++s) acc = acc + rows[(i64)row_of_slot[t * k + s] * d + c];
        out[e] = acc;
    }
}
