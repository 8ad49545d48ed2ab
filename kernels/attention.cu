// attention.cu: sparse attention with sink (docs/spec/attention.md 4.5), the arithmetic of
// src/backend/cpu/attention.rs step for step.
//
// Layout (see src/backend/gpu/attention.rs): `table [U, d]` holds every distinct attended vector
// once; `idx [T, E]` (E = the most entries of any query) gives query t's entries as table rows,
// `count [T]` how many are real (the rest are -1). `w [T, H, E]` holds the logits, then the
// unnormalised weights exp(l - m), then (attn_probs) the probabilities; `inv [T, H]` is
// 1 / denominator and `sink_p [T, H]` the sink's share. Padding entries (e >= count[t]) are 0.
//
// Four launches, each thread owning its outputs:
//   attn_logits  (t, h, e): w = dot8(q, table[idx]) * scale (attn_logits4: four heads a thread)
//   attn_softmax (t, h):    m = max(sink, w...); w = exp(w - m); denominators in entry order
//   attn_values  (t, h, c): out = (sum_e w_e * v_e[c]) * inv, entries in order
//                (attn_values4: four heads and four columns a thread)
//   attn_probs   (t, h, e): w = w * inv
// The dot product is linalg::dot's: eight interleaved f32 accumulators, a fixed pairwise
// combine, then the tail. With -ffp-contract=off / --fmad=false every step rounds as the CPU's.

// f32::max: a NaN operand yields the other one.
static __device__ __forceinline__ float attn_fmax(float a, float b) {
    if (a != a) return b;
    if (b != b) return a;
    return a > b ? a : b;
}

// linalg::dot: 8 lanes, ((l0+l4)+(l1+l5)) + ((l2+l6)+(l3+l7)) + tail.
static __device__ __forceinline__ float attn_dot8(const float* a, const float* b, i64 n) {
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    i64 chunks = n / 8;
    for (i64 c = 0; c < chunks; ++c) {
        for (int l = 0; l < 8; ++l) {
            float p = a[c * 8 + l] * b[c * 8 + l];
            acc[l] = acc[l] + p;
        }
    }
    float tail = 0.0f;
    for (i64 i = chunks * 8; i < n; ++i) {
        float p = a[i] * b[i];
        tail = tail + p;
    }
    float lo = (acc[0] + acc[4]) + (acc[1] + acc[5]);
    float hi = (acc[2] + acc[6]) + (acc[3] + acc[7]);
    return (lo + hi) + tail;
}

// queries [T, H, d]; one thread per (t, h, e).
extern "C" __global__ void attn_logits(const float* queries, const float* table, const int* idx,
                                       const int* count, i64 tokens, i64 heads, i64 d, i64 emax,
                                       float scale, float* w) {
    NS_FOR(i, tokens * heads * emax) {
        i64 e = i % emax, th = i / emax, t = th / heads;
        if (e < (i64)count[t]) {
            const float* q = queries + th * d;
            const float* v = table + (i64)idx[t * emax + e] * d;
            w[i] = attn_dot8(q, v, d) * scale;
        } else {
            w[i] = 0.0f;
        }
    }
}

// attn_logits for four heads per thread, when heads % 4 == 0: thread (t, g, e) reads the entry's
// row once per 8-wide step for heads 4g..4g+3 (the query heads of a token share its entries).
// Each head's sum is attn_dot8's, lane by lane and in the same order, so the logits are the same
// bits. With d a multiple of 8 and aligned buffers, rows are read in 16-byte loads.
extern "C" __global__ void attn_logits4(const float* queries, const float* table, const int* idx,
                                        const int* count, i64 tokens, i64 heads, i64 d, i64 emax,
                                        float scale, float* w) {
    i64 groups = heads / 4;
    // 16-byte loads when every row starts 16-byte aligned (d a multiple of 8 keeps it so).
    bool vec = (d & 7) == 0 && ns_aligned16(queries) && ns_aligned16(table);
    NS_FOR(i, tokens * groups * emax) {
        i64 e = i % emax, tg = i / emax, t = tg / groups, h0 = (tg % groups) * 4;
        float* out = w + (t * heads + h0) * emax + e;
        if (e >= (i64)count[t]) {
            for (int j = 0; j < 4; ++j) out[j * emax] = 0.0f;
            continue;
        }
        const float* q = queries + (t * heads + h0) * d;
        const float* v = table + (i64)idx[t * emax + e] * d;
        float acc[4][8];
        for (int j = 0; j < 4; ++j)
            for (int l = 0; l < 8; ++l) acc[j][l] = 0.0f;
        i64 chunks = d / 8;
        for (i64 c = 0; c < chunks; ++c) {
            float vv[8];
            if (vec) {
                ns_load4(v + c * 8, vv);
                ns_load4(v + c * 8 + 4, vv + 4);
            } else {
                for (int l = 0; l < 8; ++l) vv[l] = v[c * 8 + l];
            }
            for (int j = 0; j < 4; ++j) {
                float qq[8];
                const float* qj = q + j * d + c * 8;
                if (vec) {
                    ns_load4(qj, qq);
                    ns_load4(qj + 4, qq + 4);
                } else {
                    for (int l = 0; l < 8; ++l) qq[l] = qj[l];
                }
                for (int l = 0; l < 8; ++l) {
                    float p = qq[l] * vv[l];
                    acc[j][l] = acc[j][l] + p;
                }
            }
        }
        for (int j = 0; j < 4; ++j) {
            float tail = 0.0f;
            for (i64 k = chunks * 8; k < d; ++k) {
                float p = q[j * d + k] * v[k];
                tail = tail + p;
            }
            float lo = (acc[j][0] + acc[j][4]) + (acc[j][1] + acc[j][5]);
            float hi = (acc[j][2] + acc[j][6]) + (acc[j][3] + acc[j][7]);
            out[j * emax] = ((lo + hi) + tail) * scale;
        }
    }
}

// The GEMM path (src/backend/gpu/attention.rs, NEEDLESCOPE_ATTENTION=gemm), for `tokens` queries:
// each query's entries gathered densely, out[t, e, :] = table[idx[t, e]] (zeros past count[t]).
extern "C" __global__ void attn_gather(const float* table, const int* idx, const int* count,
                                       i64 tokens, i64 emax, i64 d, float* out) {
    NS_FOR(i, tokens * emax * d) {
        i64 c = i % d, te = i / d, t = te / emax, e = te % emax;
        out[i] = e < (i64)count[t] ? table[(i64)idx[t * emax + e] * d + c] : 0.0f;
    }
}

// x[r, :] *= s[r] for rows of dim values; with s null, x *= scale.
extern "C" __global__ void attn_scale_rows(float* x, const float* s, float scale, i64 rows,
                                           i64 dim) {
    NS_FOR(i, rows * dim) { x[i] = x[i] * (s ? s[i / dim] : scale); }
}

// One thread per (t, h): logits -> exp(l - m) in place, inv = 1 / denominator, sink share.
extern "C" __global__ void attn_softmax(const float* sinks, const int* count, i64 tokens,
                                        i64 heads, i64 emax, float* w, float* inv,
                                        float* sink_p) {
    NS_FOR(th, tokens * heads) {
        i64 t = th / heads, h = th % heads;
        i64 n = (i64)count[t];
        float* row = w + th * emax;
        float sink = sinks[h];
        float m = sink;
        for (i64 e = 0; e < n; ++e) m = attn_fmax(m, row[e]);
        float denom = 0.0f;
        for (i64 e = 0; e < n; ++e) {
            float x = expf(row[e] - m);
            row[e] = x;
            denom = denom + x;
        }
        float sw = expf(sink - m);
        denom = denom + sw;
        float r = 1.0f / denom;
        inv[th] = r;
        sink_p[th] = sw * r;
    }
}

// One thread per (t, h, c): out[t, h, c] = (sum_e w[t, h, e] * table[idx[t, e], c]) * inv[t, h].
extern "C" __global__ void attn_values(const float* table, const int* idx, const int* count,
                                       const float* w, const float* inv, i64 tokens, i64 heads,
                                       i64 d, i64 emax, float* out) {
    NS_FOR(i, tokens * heads * d) {
        i64 c = i % d, th = i / d, t = th / heads;
        i64 n = (i64)count[t];
        const float* row = w + th * emax;
        const int* ids = idx + t * emax;
        float acc = 0.0f;
        for (i64 e = 0; e < n; ++e) {
            float p = row[e] * table[(i64)ids[e] * d + c];
            acc = acc + p;
        }
        out[i] = acc * inv[th];
    }
}

// attn_values for four heads and four columns a thread, when heads and d divide by four: thread
// (t, g, q) reads columns 4q..4q+3 of each entry's row once (one 16-byte load when aligned) for
// heads 4g..4g+3, where attn_values reads each value once per head and column. Each output's
// sum is attn_values's, entry by entry in the same order, so the outputs are the same bits.
extern "C" __global__ void attn_values4(const float* table, const int* idx, const int* count,
                                        const float* w, const float* inv, i64 tokens, i64 heads,
                                        i64 d, i64 emax, float* out) {
    i64 groups = heads / 4, quads = d / 4;
    bool vec = ns_aligned16(table);
    NS_FOR(i, tokens * groups * quads) {
        i64 c0 = (i % quads) * 4, tg = i / quads, t = tg / groups, h0 = (tg % groups) * 4;
        i64 n = (i64)count[t];
        const float* rows = w + (t * heads + h0) * emax;
        const int* ids = idx + t * emax;
        float acc[4][4];
        for (int j = 0; j < 4; ++j)
            for (int l = 0; l < 4; ++l) acc[j][l] = 0.0f;
        for (i64 e = 0; e < n; ++e) {
            const float* src = table + (i64)ids[e] * d + c0;
            float v[4];
            if (vec) {
                ns_load4(src, v);
            } else {
                for (int l = 0; l < 4; ++l) v[l] = src[l];
            }
            for (int j = 0; j < 4; ++j) {
                float wj = rows[j * emax + e];
                for (int l = 0; l < 4; ++l) {
                    float p = wj * v[l];
                    acc[j][l] = acc[j][l] + p;
                }
            }
        }
        for (int j = 0; j < 4; ++j) {
            float r = inv[t * heads + h0 + j];
            float* o = out + (t * heads + h0 + j) * d + c0;
            for (int l = 0; l < 4; ++l) o[l] = acc[j][l] * r;
        }
    }
}

// One thread per (t, h, e): the probabilities, w * inv (padding stays 0).
extern "C" __global__ void attn_probs(const int* count, const float* inv, i64 tokens, i64 heads,
                                      i64 emax, float* w) {
    NS_FOR(i, tokens * heads * emax) {
        i64 e = i % emax, th = i / emax, t = th / heads;
        if (e < (i64)count[t]) w[i] = w[i] * inv[th];
    }
}
