// elementwise.cu: RMS norm, RoPE, clamped SwiGLU, the residual add, split-K sums
// (src/backend/gpu/matrix.rs), compressor pooling and the `--kv fp8` e4m3 simulation (host
// side: src/backend/gpu/norm.rs), the bf16-exactness test of the indexer's scores
// (src/backend/gpu/scores.rs), and the copies that grow and trim the per-sequence caches
// (src/backend/gpu/act.rs) and gather attended rows (src/backend/gpu/attention.rs).
//
// Each kernel repeats the CPU reference's arithmetic in the same order, so on the host emulator
// the results are bit-identical (the only transcendental, expf, is the same libm call there):
// - RMS norm: the mean square is accumulated in double, one thread per vector, in index order,
//   and `1 / sqrt(ms + eps)` is taken in double then rounded once to float (backend::cpu).
//   A second kernel applies `x * r (* w)` one thread per element.
// - RoPE: cos / sin come from the host (model::rope, f64 then rounded); the kernel only rotates
//   pairs, `(a c - b s, a s + b c)` with s negated for the inverse (model::rope::rotate_pairs).
// - kv_fp8: numerics::quant::kv_fp8_sim, one thread per element; the thread recomputes the
//   amax of its 64-element block from the (read-only) input, so input and output are separate
//   buffers. The e4m3 encoder is numerics::codecs::f32_to_e4m3 line for line.
// Min / max follow Rust's f32::min / max / clamp: a NaN operand of min / max is ignored, clamp
// lets NaN through.

// ---- RMS norm ---------------------------------------------------------------------------------

// The mean square of each of `rows` vectors of `dim` in two launches, as
// backend::cpu::rms_scale: el_rms_lanes runs one thread per (row, lane) of NS_RMS_LANES
// interleaved lanes (lane l adds the squares of elements l, l + NS_RMS_LANES, ... in double;
// adjacent threads read adjacent elements), then el_rms_inv adds each row's lanes in order from
// 0.0 and writes r[row] = (float)(1 / sqrt(sum / dim + eps)).
#define NS_RMS_LANES 32

extern "C" __global__ void el_rms_lanes(const float* x, double* lanes, i64 rows, i64 dim) {
    NS_FOR(e, rows * NS_RMS_LANES) {
        i64 row = e / NS_RMS_LANES, lane = e % NS_RMS_LANES;
        const float* v = x + row * dim;
        double ss = 0.0;
        for (i64 i = lane; i < dim; i += NS_RMS_LANES) {
            double a = (double)v[i];
            ss += a * a;
        }
        lanes[e] = ss;
    }
}

extern "C" __global__ void el_rms_inv(const double* lanes, float* r, i64 rows, i64 dim, float eps) {
    NS_FOR(row, rows) {
        double ss = 0.0;
        for (i64 l = 0; l < NS_RMS_LANES; ++l) ss = ss + lanes[row * NS_RMS_LANES + l];
        double ms = ss / (double)dim;
        r[row] = (float)(1.0 / sqrt(ms + (double)eps));
    }
}

// x[row, i] = x[row, i] * r[row] (* w[i] when w is not null), in place.
extern "C" __global__ void el_rms_apply(float* x, const float* r, const float* w, i64 rows,
                                        i64 dim) {
    NS_FOR(e, rows * dim) {
        float v = x[e] * r[e / dim];
        if (w) v = v * w[e % dim];
        x[e] = v;
    }
}

// ---- RoPE -------------------------------------------------------------------------------------

// x is [npos, per_pos] with per_pos = vecs * vec_len; the last d_r dims of every vector are
// interleaved pairs rotated by cos / sin [npos, d_r / 2] of the vector's position.
extern "C" __global__ void el_rope(float* x, const float* cs, const float* sn, i64 npos,
                                   i64 per_pos, i64 vec_len, i64 d_r, int inverse) {
    i64 half = d_r / 2, vecs = per_pos / vec_len;
    NS_FOR(p, npos * vecs * half) {
        i64 i = p % half, v = p / half, pos = v / vecs;
        float c = cs[pos * half + i];
        float s = inverse ? -sn[pos * half + i] : sn[pos * half + i];
        float* pair = x + v * vec_len + (vec_len - d_r) + 2 * i;
        float a = pair[0], b = pair[1];
        pair[0] = a * c - b * s;
        pair[1] = a * s + b * c;
    }
}

// ---- SwiGLU -----------------------------------------------------------------------------------

// gate <- silu(min(gate, limit)) * clamp(up, -limit, limit) (backend::cpu::experts::swiglu).
extern "C" __global__ void el_swiglu(float* gate, const float* up, i64 n, float limit) {
    NS_FOR(i, n) {
        float g = gate[i];
        float g1 = ns_isnan(g) ? limit : (ns_isnan(limit) ? g : (limit < g ? limit : g));
        float silu = g1 / (1.0f + expf(-g1));
        float v = up[i];
        if (v < -limit) v = -limit;
        if (v > limit) v = limit;
        gate[i] = silu * v;
    }
}

// ---- Residual add ------------------------------------------------------------------------------

// x[i] = x[i] + y[i] (Backend::add_assign; one f32 addition, as the CPU).
extern "C" __global__ void el_add_assign(float* x, const float* y, i64 n) {
    NS_FOR(i, n) { x[i] = x[i] + y[i]; }
}

// ---- Split-K sums ------------------------------------------------------------------------------

// y[i*ldy + j] = parts[0][i][j] + parts[1][i][j] + ... in part order, parts [nparts, m, n]: the
// partial products of a GEMM cut along its inner dimension (matrix::gemm_split_k).
extern "C" __global__ void el_sum_parts(const float* parts, float* y, i64 nparts, i64 m, i64 n,
                                        i64 ldy) {
    NS_FOR(e, m * n) {
        i64 i = e / n, j = e % n;
        float acc = parts[e];
        for (i64 p = 1; p < nparts; ++p) acc = acc + parts[p * m * n + e];
        y[i * ldy + j] = acc;
    }
}

// ---- Compressor pooling -----------------------------------------------------------------------

// Backend::compressor_pool over the buffered token projections values / logits [n, width]
// (width = 2c with overlap, else c) and the slot biases ape [ratio, width]; out [rows, c]. Row
// i's current window starts at buffer token first_window + i*ratio; with overlap its slots are
// the previous window's tokens through channels 0..c, then the current window's through c..2c,
// and row 0's previous window is missing (logit -inf, value 0) unless has_previous. Logit =
// g + ape; max, exp, then num / den summed over slots in order like
// backend::cpu::attention::compressor_pool. exp(-inf) = 0.
static __device__ __forceinline__ void el_pool_slot(const float* values, const float* logits,
                                                    const float* ape, i64 i, i64 s, i64 k, i64 c,
                                                    i64 ratio, int overlap, i64 first_window,
                                                    int has_previous, float* l, float* v) {
    i64 width = overlap ? 2 * c : c;
    i64 j, off = 0;
    if (!overlap) {
        j = first_window + i * ratio + s;
    } else if (s >= ratio) {
        j = first_window + i * ratio + s - ratio;
        off = c;
    } else if (i == 0 && !has_previous) {
        *l = -ns_inf();
        *v = 0.0f;
        return;
    } else {
        j = first_window + i * ratio + s - ratio;
    }
    *l = logits[j * width + off + k] + ape[(s % ratio) * width + off + k];
    *v = values[j * width + off + k];
}

extern "C" __global__ void el_compressor_pool(const float* values, const float* logits,
                                              const float* ape, float* out, i64 rows, i64 c,
                                              i64 ratio, int overlap, i64 first_window,
                                              int has_previous) {
    i64 slots = overlap ? 2 * ratio : ratio;
    NS_FOR(e, rows * c) {
        i64 i = e / c, k = e % c;
        float l, v, mx = -ns_inf();
        for (i64 s = 0; s < slots; ++s) {
            el_pool_slot(values, logits, ape, i, s, k, c, ratio, overlap, first_window,
                         has_previous, &l, &v);
            if (l > mx) mx = l;
        }
        float num = 0.0f, den = 0.0f;
        for (i64 s = 0; s < slots; ++s) {
            el_pool_slot(values, logits, ape, i, s, k, c, ratio, overlap, first_window,
                         has_previous, &l, &v);
            float w = expf(l - mx);
            den = den + w;
            num = num + w * v;
        }
        out[e] = num / den;
    }
}

// ---- KV fp8 simulation ------------------------------------------------------------------------

// numerics::quant::pow2_ceil_bits: 2^(exponent(t) - 127 + (mantissa(t) != 0)), the exponent
// capped at 127; t > 0 gives an exponent >= -127 (2^-127 is the subnormal 1 << 22).
static __device__ __forceinline__ float el_pow2_ceil_bits(float t) {
    u32 bits = ns_f32_bits(t);
    int e = (int)((bits >> 23) & 0xFFu) - 127 + ((bits & 0x7FFFFFu) != 0u ? 1 : 0);
    if (e > 127) e = 127;
    if (e >= -126) return ns_pow2(e);
    if (e >= -149) return ns_bits_f32(1u << (e + 149));
    return 0.0f;
}

// numerics::codecs::f32_to_e4m3: nearest, ties to even, saturating at ±448, NaN -> 0x7F,
// sign of zero kept.
static __device__ __forceinline__ u8 el_f32_to_e4m3(float x) {
    if (ns_isnan(x)) return 0x7F;
    u32 sign = (ns_f32_bits(x) & 0x80000000u) ? 0x80u : 0u;
    float a = ns_bits_f32(ns_f32_bits(x) & 0x7FFFFFFFu);
    if (a >= 448.0f) return (u8)(sign | 0x7Eu);
    // Subnormal grid, step 2^-9: code = rne(a * 2^9) (8 lands exactly on 2^-6, code 0x08).
    if (a < ns_pow2(-6)) return (u8)(sign | (u32)rintf(a * ns_pow2(9)));
    // Normal: a = 2^e * (q / 8), q in [8, 16); both scalings are exact.
    int e = (int)((ns_f32_bits(a) >> 23) & 0xFFu) - 127;
    u32 q = (u32)rintf(a * ns_pow2(3 - e));
    if (q == 16u) {
        q = 8u;
        e += 1;
    }
    u32 code = ((u32)(e + 7) << 3) | (q - 8u);
    return (u8)(sign | (code < 0x7Eu ? code : 0x7Eu));
}

// `--kv fp8` on rows [rows, row_len]: every value rounded to bf16, then the first
// min(nope, row_len) dims of each row get REF's act_quant in blocks of 64 (a partial last
// block allowed): s = pow2ceil(max(amax, 1e-4) * fp32(1/448)),
// out = bf16(e4m3(clamp(x / s, ±448)) * s). `in` and `out` must not alias.
extern "C" __global__ void el_kv_fp8_sim(const float* in, float* out, i64 rows, i64 row_len,
                                         i64 nope) {
    i64 n = nope < row_len ? nope : row_len;
    NS_FOR(e, rows * row_len) {
        i64 r = e / row_len, c = e % row_len;
        float x = ns_bf16_round(in[e]);
        if (c >= n) {
            out[e] = x;
            continue;
        }
        i64 b0 = (c / 64) * 64, b1 = b0 + 64 < n ? b0 + 64 : n;
        float amax = 0.0f;
        for (i64 k = b0; k < b1; ++k) {
            float a = ns_bits_f32(ns_f32_bits(ns_bf16_round(in[r * row_len + k])) & 0x7FFFFFFFu);
            if (a > amax) amax = a;
        }
        float floored = amax > 1e-4f ? amax : 1e-4f;
        float s = el_pow2_ceil_bits(floored * (1.0f / 448.0f));
        float y = x / s;
        if (y < -448.0f) y = -448.0f;
        if (y > 448.0f) y = 448.0f;
        out[e] = ns_bf16_round(ns_e4m3_to_f32(el_f32_to_e4m3(y)) * s);
    }
}

// ---- bf16 exactness ---------------------------------------------------------------------------

// out[p] = 1 when some x[i] with i % parts == p has a bit of `mask` set, else 0 (a strided
// OR, coalesced across threads). With mask 0xFFFF over f32 bits: "not exactly a bf16"; the
// host repeats it over the 0/1 flags (same mask) until one flag is left.
extern "C" __global__ void el_any_bits(const u32* x, i64 n, u32 mask, i64 parts, u32* out) {
    NS_FOR(p, parts) {
        u32 any = 0u;
        for (i64 i = p; i < n; i += parts) any |= x[i] & mask;
        out[p] = any != 0u ? 1u : 0u;
    }
}

// ---- Copies -----------------------------------------------------------------------------------

// dst[i] = src[i] for i < n. The ranges must not overlap (threads run in any order); callers
// pass byte offsets into larger buffers.
extern "C" __global__ void el_copy(const float* src, float* dst, i64 n) {
    NS_FOR(i, n) { dst[i] = src[i]; }
}

// dst[r, c] = src[ids[r], c] for r < n, c < dim: rows of a [rows, dim] tensor gathered into a
// packed [n, dim] one (ids are validated by the host).
extern "C" __global__ void el_gather_rows(const float* src, const int* ids, i64 n, i64 dim,
                                          float* dst) {
    NS_FOR(i, n * dim) {
        i64 r = i / dim, c = i % dim;
        dst[i] = src[(i64)ids[r] * dim + c];
    }
}
