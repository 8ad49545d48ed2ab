// indexer.cu: the lightning indexer on the device: index-profile rounding of keys and queries,
// the head combination of scores, and an exact top-k (src/backend/gpu/{indexer,topk}.rs drive them).
//
// Design: the rounding simulations are straight ports of numerics::{quant, codecs, hadamard} into
// device functions, one thread per key row / query head working on its own row (in a local
// array up to 128 values, else in place in the output; the Hadamard butterfly runs in the
// CPU's order, which matters only for the final scale multiply since each stage is exact
// pairwise +/-). A row's recipe (bf16 before,
// rotation, bf16 after, one quantiser) is chosen by the host per profile, so every profile is
// the same four steps with some switched off. Scores: the host runs the dot products as GEMM
// tiles; idx_combine applies ReLU, head weights and row scales in the CPU's order (heads in
// order from -0.0). Top-k (src/backend/gpu/topk.rs), for many score rows in the same launches: a
// radix select over order-preserving u32 keys across several small launches (per-(row, lane)
// 16-bin histograms over interleaved scores, a 16-bin sum per row, one picking thread per row),
// then each row's winners are collected per chunk in row order and placed by rank (each
// candidate counts who beats it).

#define IDX_BF_PRE 1
#define IDX_ROTATE 2
#define IDX_BF_POST 4
// Quantiser in bits 4..7 of a recipe.
#define IDX_Q_SHIFT 4
#define IDX_Q_NONE 0
#define IDX_Q_FP8_FP32 1
#define IDX_Q_FP8_POW2 2
#define IDX_Q_FP4_SGLANG 3
#define IDX_Q_FP4_RNE 4
#define IDX_Q_FP4_RNE_PACK_V41 5

static __device__ __forceinline__ float idx_abs(float x) { return ns_bits_f32(ns_f32_bits(x) & 0x7FFFFFFFu); }

static __device__ __forceinline__ bool idx_signbit(float x) { return (ns_f32_bits(x) >> 31) != 0u; }

// Round to nearest integer, ties to even, for 0 <= y < 2^22 (adding 2^23 leaves no fraction
// bits; the compiler may not reassociate without fast-math).
static __device__ __forceinline__ float idx_rne(float y) { return (y + 8388608.0f) - 8388608.0f; }

// quant::amax: largest |v| (NaN ignored, as f32::max does).
static __device__ float idx_amax(const float* v, i64 n) {
    float m = 0.0f;
    for (i64 i = 0; i < n; ++i) {
        float a = idx_abs(v[i]);
        if (a > m) m = a;
    }
    return m;
}

static __device__ __forceinline__ float idx_at_least(float a, float lo) { return a < lo ? lo : a; }

static __device__ __forceinline__ float idx_clamp(float x, float lim) {
    if (x < -lim) return -lim;
    if (x > lim) return lim;
    return x;
}

// quant::pow2_ceil_bits: 2^ceil(log2 t) from the bits of t, capped at 2^127.
static __device__ float idx_pow2_ceil(float t) {
    u32 bits = ns_f32_bits(t);
    int e = (int)((bits >> 23) & 0xFFu) - 127 + ((bits & 0x7FFFFFu) != 0u ? 1 : 0);
    if (e > 127) e = 127;
    if (e >= -126) return ns_pow2(e);
    return ns_bits_f32(1u << (e + 149));
}

// codecs::f32_to_e4m3: nearest, ties to even, saturating at +-448, NaN -> 0x7F, sign kept.
static __device__ u32 idx_f32_to_e4m3(float x) {
    if (ns_isnan(x)) return 0x7Fu;
    u32 sign = idx_signbit(x) ? 0x80u : 0u;
    float a = idx_abs(x);
    if (a >= 448.0f) return sign | 0x7Eu;
    if (a < ns_pow2(-6)) return sign | (u32)idx_rne(a * ns_pow2(9));
    int e = (int)((ns_f32_bits(a) >> 23) & 0xFFu) - 127;
    u32 q = (u32)idx_rne(a * ns_pow2(3 - e));
    if (q == 16u) {
        q = 8u;
        e += 1;
    }
    u32 code = ((u32)(e + 7) << 3) | (q - 8u);
    return sign | (code < 0x7Eu ? code : 0x7Eu);
}

// codecs::f32_to_e2m1_rne: ties to the even mantissa bit, saturating at +-6, NaN -> +6.
static __device__ u32 idx_f32_to_e2m1_rne(float x) {
    if (ns_isnan(x)) return 7u;
    u32 sign = idx_signbit(x) ? 8u : 0u;
    float a = idx_abs(x);
    u32 code;
    if (a <= 0.25f) code = 0u;
    else if (a < 0.75f) code = 1u;
    else if (a <= 1.25f) code = 2u;
    else if (a < 1.75f) code = 3u;
    else if (a <= 2.5f) code = 4u;
    else if (a < 3.5f) code = 5u;
    else if (a <= 5.0f) code = 6u;
    else code = 7u;
    return sign | code;
}

// codecs::f32_to_e2m1_sglang: the number of midpoints strictly below |x| (ties to smaller).
static __device__ u32 idx_f32_to_e2m1_sglang(float x) {
    if (ns_isnan(x)) return 7u;
    u32 sign = idx_signbit(x) ? 8u : 0u;
    float a = idx_abs(x);
    const float mid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    u32 code = 0u;
    for (int i = 0; i < 7; ++i) code += a > mid[i] ? 1u : 0u;
    return sign | code;
}

// hadamard::hadamard_inplace: butterfly h = 1, 2, .., n/2, then one multiply by fp32(1/sqrt n).
static __device__ void idx_hadamard(float* x, i64 n, float scale) {
    for (i64 h = 1; h < n; h *= 2) {
        for (i64 base = 0; base < n; base += 2 * h) {
            for (i64 j = base; j < base + h; ++j) {
                float u = x[j], v = x[j + h];
                x[j] = u + v;
                x[j + h] = u - v;
            }
        }
    }
    for (i64 i = 0; i < n; ++i) x[i] *= scale;
}

static __device__ void idx_bf16_round_all(float* x, i64 n) {
    for (i64 i = 0; i < n; ++i) x[i] = ns_bf16_round(x[i]);
}

// quant::fp8_row_scale_fp32_inplace: s = fp32(max(amax, 1e-4) / 448), e4m3(clamp(x * fp32(1/s))).
static __device__ float idx_fp8_fp32(float* x, i64 n) {
    float scale = idx_at_least(idx_amax(x, n), 1e-4f) / 448.0f;
    float inv = 1.0f / scale;
    for (i64 i = 0; i < n; ++i) x[i] = ns_e4m3_to_f32((u8)idx_f32_to_e4m3(idx_clamp(x[i] * inv, 448.0f)));
    return scale;
}

// quant::fp8_row_scale_pow2_inplace: s = pow2ceil(fp32(max(amax, 1e-4) / 448)), e4m3(clamp(x / s)).
static __device__ float idx_fp8_pow2(float* x, i64 n) {
    float scale = idx_pow2_ceil(idx_at_least(idx_amax(x, n), 1e-4f) / 448.0f);
    for (i64 i = 0; i < n; ++i) x[i] = ns_e4m3_to_f32((u8)idx_f32_to_e4m3(idx_clamp(x[i] / scale, 448.0f)));
    return scale;
}

// quant::fp4_sim_pow2_rne per block: s = pow2ceil(max(amax, 6*2^-126) * fp32(1/6)),
// bf16(e2m1_rne(clamp(x / s, +-6)) * s).
static __device__ void idx_fp4_rne(float* x, i64 n, i64 block) {
    const float recip6 = 1.0f / 6.0f;
    const float lo = 6.0f * ns_pow2(-126);
    for (i64 b0 = 0; b0 < n; b0 += block) {
        i64 len = n - b0 < block ? n - b0 : block;
        float* c = x + b0;
        float s = idx_pow2_ceil(idx_at_least(idx_amax(c, len), lo) * recip6);
        for (i64 i = 0; i < len; ++i) {
            u32 code = idx_f32_to_e2m1_rne(idx_clamp(c[i] / s, 6.0f));
            c[i] = ns_bf16_round(ns_e2m1_to_f32(code) * s);
        }
    }
}

// quant::fp4_sim_sglang per block: s = pow2ceil(fp32(max(amax, 1e-4) / 6)), e2m1_sglang(x / s) * s.
static __device__ void idx_fp4_sglang(float* x, i64 n, i64 block) {
    for (i64 b0 = 0; b0 < n; b0 += block) {
        i64 len = n - b0 < block ? n - b0 : block;
        float* c = x + b0;
        float s = idx_pow2_ceil(idx_at_least(idx_amax(c, len), 1e-4f) / 6.0f);
        for (i64 i = 0; i < len; ++i) c[i] = ns_e2m1_to_f32(idx_f32_to_e2m1_sglang(c[i] / s)) * s;
    }
}

// quant::fp4_pack_sglang_v41 per block: s = pow2ceil(max(fp32(amax / 6), 1e-4)),
// e2m1_sglang(x / s) * s (SGLang's DeepSeek-V4.1 index-key pool).
static __device__ void idx_fp4_pack_v41(float* x, i64 n, i64 block) {
    for (i64 b0 = 0; b0 < n; b0 += block) {
        i64 len = n - b0 < block ? n - b0 : block;
        float* c = x + b0;
        float s = idx_pow2_ceil(idx_at_least(idx_amax(c, len) / 6.0f, 1e-4f));
        for (i64 i = 0; i < len; ++i) c[i] = ns_e2m1_to_f32(idx_f32_to_e2m1_sglang(c[i] / s)) * s;
    }
}

// One row (a key row or a query head) through a recipe, in place; returns its scale (1 unless
// an fp8 quantiser gives one).
static __device__ float idx_prepare_vec(float* x, i64 n, int recipe, i64 block, float had_scale) {
    if (recipe & IDX_BF_PRE) idx_bf16_round_all(x, n);
    if (recipe & IDX_ROTATE) idx_hadamard(x, n, had_scale);
    if (recipe & IDX_BF_POST) idx_bf16_round_all(x, n);
    switch ((recipe >> IDX_Q_SHIFT) & 15) {
    case IDX_Q_FP8_FP32: return idx_fp8_fp32(x, n);
    case IDX_Q_FP8_POW2: return idx_fp8_pow2(x, n);
    case IDX_Q_FP4_SGLANG: idx_fp4_sglang(x, n, block); return 1.0f;
    case IDX_Q_FP4_RNE: idx_fp4_rne(x, n, block); return 1.0f;
    case IDX_Q_FP4_RNE_PACK_V41:
        idx_fp4_rne(x, n, block);
        idx_fp4_pack_v41(x, n, block);
        return 1.0f;
    default: return 1.0f;
    }
}

// idx_prepare_vec of the row src[0..n] into dst[0..n] (src may equal dst). A row of at most
// IDX_LOCAL_DIM values (Flash's 128) is prepared in a per-thread local array: local memory is
// interleaved across a warp's threads, so the ~20 passes over the row are coalesced, where
// working in place touches one separate cache line per thread and pass. Longer rows work in
// place in dst. The same arithmetic either way.
#define IDX_LOCAL_DIM 128
static __device__ float idx_prepare_copy(const float* src, float* dst, i64 n, int recipe, i64 block,
                                         float had_scale) {
    if (n <= IDX_LOCAL_DIM) {
        float v[IDX_LOCAL_DIM];
        for (i64 i = 0; i < n; ++i) v[i] = src[i];
        float scale = idx_prepare_vec(v, n, recipe, block, had_scale);
        for (i64 i = 0; i < n; ++i) dst[i] = v[i];
        return scale;
    }
    if (src != dst) {
        for (i64 i = 0; i < n; ++i) dst[i] = src[i];
    }
    return idx_prepare_vec(dst, n, recipe, block, had_scale);
}

// Key rows [rows, dim] prepared in place; scales[rows] their multipliers.
extern "C" __global__ void idx_prepare_keys(float* rows_io, float* scales, i64 rows, i64 dim, int recipe,
                                            i64 block, float had_scale) {
    NS_FOR(r, rows) {
        float* row = rows_io + r * dim;
        scales[r] = idx_prepare_copy(row, row, dim, recipe, block, had_scale);
    }
}

// Query heads q_in [heads, dim] prepared into q_out, and the effective head weights
// (profiles::head_weight): rule 0 w*S, 1 bf(w)*S, 2 bf(bf(w)*S), 3 (bf(w)*S)*s_q. Heads are
// independent: `heads` may be T tokens x their heads (S is the host's, from the per-token heads).
extern "C" __global__ void idx_prepare_query(const float* q_in, float* q_out, const float* w_raw, float* w_out,
                                             i64 heads, i64 dim, int recipe, int wrule, i64 block,
                                             float had_scale, float s) {
    NS_FOR(h, heads) {
        float s_q = idx_prepare_copy(q_in + h * dim, q_out + h * dim, dim, recipe, block, had_scale);
        float w = w_raw[h];
        float out;
        if (wrule == 0) out = w * s;
        else if (wrule == 1) out = ns_bf16_round(w) * s;
        else if (wrule == 2) out = ns_bf16_round(ns_bf16_round(w) * s);
        else out = (ns_bf16_round(w) * s) * s_q;
        w_out[h] = out;
    }
}

// -inf where row r of token t is not visible (r >= visible[t]); out is [tokens, stride].
extern "C" __global__ void idx_mask(float* out, const int* visible, i64 tokens, i64 stride) {
    NS_FOR(e, tokens * stride) {
        i64 t = e / stride, r = e % stride;
        if (r >= (i64)visible[t]) out[e] = -ns_inf();
    }
}

static __device__ __forceinline__ float idx_relu(float x) { return x < 0.0f ? 0.0f : x; }

// Head combination of one tile: d [ntok*heads, nb] holds the dots of tokens t0.. with rows r0..;
// writes out[t*stride + r] for the visible ones. f32: s_k * sum_h w_h * relu(d); official-fp4
// (REF bf16 scores): bf(sum_h bf(relu(bf(d)) * w_h)) * s_k. Heads in order from -0.0.
extern "C" __global__ void idx_combine(const float* d, const float* weights, const float* scales,
                                       const int* visible, float* out, i64 t0, i64 ntok, i64 r0, i64 nb,
                                       i64 heads, i64 stride, int official) {
    NS_FOR(e, ntok * nb) {
        i64 i = e / nb, j = e % nb;
        i64 t = t0 + i, r = r0 + j;
        if (r >= (i64)visible[t]) continue;
        const float* dt = d + i * heads * nb + j;
        const float* w = weights + t * heads;
        float acc = -0.0f;
        if (official) {
            for (i64 h = 0; h < heads; ++h) acc += ns_bf16_round(idx_relu(ns_bf16_round(dt[h * nb])) * w[h]);
            out[t * stride + r] = ns_bf16_round(acc) * scales[r];
        } else {
            for (i64 h = 0; h < heads; ++h) acc += w[h] * idx_relu(dt[h * nb]);
            out[t * stride + r] = scales[r] * acc;
        }
    }
}

// ---- top-k (selection::topk) of `rows` score rows at once ----
// Row r is s[r*stride .. r*stride + visible[r]]; it takes min(k, visible[r]) winners into
// out[r*k ..] (-1 after them). The count and collect kernels run one thread per (row, chunk)
// pair e = r*chunks + c (contiguous chunks: collect keeps row order); per-row state sits at
// index r.
// A score as a totally ordered key: NaN 0 (lowest), then -inf .. +inf, -0.0 == +0.0.
static __device__ __forceinline__ u32 idx_order_key(float s) {
    if (ns_isnan(s)) return 0u;
    u32 b = s == 0.0f ? 0u : ns_f32_bits(s);
    return b ^ ((b & 0x80000000u) ? 0xFFFFFFFFu : 0x80000000u);
}

static __device__ __forceinline__ i64 idx_min64(i64 a, i64 b) { return a < b ? a : b; }

// state[2r..2r+2] = {prefix, rank}: the bits of row r's k-th key found so far and the wanted
// rank (1-based, by descending key) among its keys that share them (0: the row takes nothing).
// Radix digits of IDX_DIGIT_BITS bits, most significant first: shifts 28, 24, ..., 0.
#define IDX_DIGIT_BITS 4
#define IDX_BINS 16

static __device__ __forceinline__ bool idx_matches(u32 key, u32 prefix, int shift) {
    return shift == 32 - IDX_DIGIT_BITS || ((key ^ prefix) >> (shift + IDX_DIGIT_BITS)) == 0u;
}

// Per (row, lane) e: hist[e*IDX_BINS + digit] counts the keys of the lane matching the row's
// prefix. Lane l of a row reads its keys l, l + lanes, l + 2*lanes, ... (interleaved, so the
// adjacent threads of a row read adjacent scores: coalesced loads; the order of counting does
// not matter). The counters are registers (a compare per bin and key), written once.
extern "C" __global__ void idx_topk_hist(const float* s, i64 stride, const int* visible, i64 rows, i64 lanes,
                                         const u32* state, int shift, u32* hist) {
    NS_FOR(e, rows * lanes) {
        i64 r = e / lanes, l = e % lanes;
        u32 count[IDX_BINS];
#pragma unroll
        for (int b = 0; b < IDX_BINS; ++b) count[b] = 0u;
        u32 prefix = state[2 * r];
        const float* row = s + r * stride;
        i64 end = (i64)visible[r];
        for (i64 i = l; i < end; i += lanes) {
            u32 key = idx_order_key(row[i]);
            if (!idx_matches(key, prefix, shift)) continue;
            u32 digit = (key >> shift) & (IDX_BINS - 1u);
#pragma unroll
            for (int b = 0; b < IDX_BINS; ++b) count[b] += digit == (u32)b ? 1u : 0u;
        }
        u32* h = hist + e * IDX_BINS;
#pragma unroll
        for (int b = 0; b < IDX_BINS; ++b) h[b] = count[b];
    }
}

// total[r*IDX_BINS + b] = sum over the lanes l of row r of hist[(r*lanes + l)*IDX_BINS + b].
extern "C" __global__ void idx_topk_total(const u32* hist, i64 rows, i64 lanes, u32* total) {
    NS_FOR(e, rows * IDX_BINS) {
        i64 r = e / IDX_BINS, b = e % IDX_BINS;
        const u32* h = hist + r * lanes * IDX_BINS + b;
        u32 sum = 0u;
        for (i64 l = 0; l < lanes; ++l) sum += h[l * IDX_BINS];
        total[e] = sum;
    }
}

// One thread per row: the digit holding the wanted rank, from the top digit down.
extern "C" __global__ void idx_topk_pick(const u32* total, u32* state, i64 rows, int shift) {
    NS_FOR(r, rows) {
        u32 rank = state[2 * r + 1];
        if (rank == 0u) continue;
        const u32* t = total + r * IDX_BINS;
        for (int b = IDX_BINS - 1; b >= 0; --b) {
            if (t[b] >= rank) {
                state[2 * r] |= (u32)b << shift;
                state[2 * r + 1] = rank;
                break;
            }
            rank -= t[b];
        }
    }
}

// Per (row, chunk) e: counts[2e] keys above the row's k-th key K = state[2r], counts[2e+1] keys
// equal to it.
extern "C" __global__ void idx_topk_count(const float* s, i64 stride, const int* visible, i64 rows, i64 chunk,
                                          i64 chunks, const u32* state, u32* counts) {
    NS_FOR(e, rows * chunks) {
        i64 r = e / chunks, c = e % chunks;
        u32 kth = state[2 * r], gt = 0u, eq = 0u;
        const float* row = s + r * stride;
        i64 end = idx_min64((c + 1) * chunk, (i64)visible[r]);
        for (i64 i = c * chunk; i < end; ++i) {
            u32 key = idx_order_key(row[i]);
            gt += key > kth ? 1u : 0u;
            eq += key == kth ? 1u : 0u;
        }
        counts[2 * e] = gt;
        counts[2 * e + 1] = eq;
    }
}

// Per (row, chunk): its winners in row order into the row's k candidate slots, keys above K
// first (offsets from the row's earlier chunks' counts), then the first state[2r+1] keys equal
// to K over all the row's chunks (ties to the lower row).
extern "C" __global__ void idx_topk_collect(const float* s, i64 stride, const int* visible, i64 rows, i64 chunk,
                                            i64 chunks, const u32* state, const u32* counts, i64 k,
                                            u32* cand_key, int* cand_row) {
    NS_FOR(e, rows * chunks) {
        i64 r = e / chunks, c = e % chunks;
        i64 n = (i64)visible[r];
        i64 take = idx_min64(k, n);
        if (take == 0) continue;
        u32 kth = state[2 * r];
        i64 ties = (i64)state[2 * r + 1];
        i64 gt_off = 0, eq_off = 0;
        for (i64 p = r * chunks; p < e; ++p) {
            gt_off += (i64)counts[2 * p];
            eq_off += (i64)counts[2 * p + 1];
        }
        i64 eq_base = take - ties;
        u32* ck = cand_key + r * k;
        int* cr = cand_row + r * k;
        const float* row = s + r * stride;
        i64 end = idx_min64((c + 1) * chunk, n);
        for (i64 i = c * chunk; i < end; ++i) {
            u32 key = idx_order_key(row[i]);
            if (key > kth) {
                ck[gt_off] = key;
                cr[gt_off] = (int)i;
                ++gt_off;
            } else if (key == kth) {
                if (eq_off < ties) {
                    ck[eq_base + eq_off] = key;
                    cr[eq_base + eq_off] = (int)i;
                }
                ++eq_off;
            }
        }
    }
}

// Per (row, slot i): a candidate's place = how many of the row's candidates rank above it (key
// desc, row asc; unique); slots past the row's take write the -1 padding.
extern "C" __global__ void idx_topk_rank(const u32* cand_key, const int* cand_row, const int* visible, i64 rows,
                                         i64 k, int* out) {
    NS_FOR(e, rows * k) {
        i64 r = e / k, i = e % k;
        i64 take = idx_min64(k, (i64)visible[r]);
        int* o = out + r * k;
        if (i >= take) {
            o[i] = -1;
            continue;
        }
        const u32* ck = cand_key + r * k;
        const int* cr = cand_row + r * k;
        u32 ki = ck[i];
        int ri = cr[i];
        i64 rank = 0;
        for (i64 j = 0; j < take; ++j) {
            u32 kj = ck[j];
            rank += (kj > ki || (kj == ki && cr[j] < ri)) ? 1 : 0;
        }
        o[rank] = ri;
    }
}
