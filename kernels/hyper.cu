// hyper.cu: mHC coefficient math and stream mixes (host side: src/backend/gpu/hyper.rs).
//
// The mix projection itself is an f32 GEMM on the host side and the per-token RMS scale comes
// from el_rms_inv (elementwise.cu); the kernels here take the raw mixes [T, rows] and that
// scale r [T] and repeat model::hyper's per-token formulas in the same f32 order:
// m = mix * r, pre_j = sigmoid(m_j * scale_0 + base_j) + hc_eps,
// post_j = 2 * sigmoid(m_{n+j} * scale_1 + base_{n+j}), comb = Sinkhorn(m_{2n+i} * scale_2 +
// base_{2n+i}). One thread per token runs the coefficients (Sinkhorn works in place in that
// token's slice of `comb`, so any stream count works); the stream sums run one thread per
// output element, accumulating over streams j in order from 0.0f like backend::cpu::hyper.

static __device__ __forceinline__ float hc_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// Column normalisation of a [n, n]: a[j][k] /= (Σ_j a[j][k]) + eps.
static __device__ __forceinline__ void hc_normalise_columns(float* a, i64 n, float eps) {
    for (i64 k = 0; k < n; ++k) {
        float sum = 0.0f;
        for (i64 j = 0; j < n; ++j) sum = sum + a[j * n + k];
        sum = sum + eps;
        for (i64 j = 0; j < n; ++j) a[j * n + k] = a[j * n + k] / sum;
    }
}

// model::hyper::sinkhorn: row softmax + eps, a column step, then iters - 1 rounds of
// (row normalisation, column normalisation).
static __device__ void hc_sinkhorn(float* a, i64 n, i64 iters, float eps) {
    for (i64 j = 0; j < n; ++j) {
        float* row = a + j * n;
        float mx = -ns_inf();
        for (i64 k = 0; k < n; ++k) {
            if (row[k] > mx) mx = row[k];
        }
        float sum = 0.0f;
        for (i64 k = 0; k < n; ++k) {
            row[k] = expf(row[k] - mx);
            sum = sum + row[k];
        }
        for (i64 k = 0; k < n; ++k) row[k] = row[k] / sum + eps;
    }
    hc_normalise_columns(a, n, eps);
    for (i64 it = 1; it < iters; ++it) {
        for (i64 j = 0; j < n; ++j) {
            float* row = a + j * n;
            float sum = 0.0f;
            for (i64 k = 0; k < n; ++k) sum = sum + row[k];
            sum = sum + eps;
            for (i64 k = 0; k < n; ++k) row[k] = row[k] / sum;
        }
        hc_normalise_columns(a, n, eps);
    }
}

// Largest n*n whose Sinkhorn runs in a per-thread local array (V4's hc_mult 4: 16).
#define HC_LOCAL 16

// Layer-site coefficients: mixes [T, (2+n)n] (unscaled GEMM output), r [T], base [(2+n)n],
// scale [3] -> pre [T, n], post [T, n], comb [T, n, n] (comb[j·n + k]).
extern "C" __global__ void hc_pre_coeffs(const float* mixes, const float* r, const float* base,
                                         const float* scale, float* pre, float* post,
                                         float* comb, i64 tokens, i64 n, i64 iters,
                                         float hc_eps) {
    i64 rows = (2 + n) * n;
    NS_FOR(t, tokens) {
        const float* m = mixes + t * rows;
        float rt = r[t];
        for (i64 j = 0; j < n; ++j) {
            pre[t * n + j] = hc_sigmoid((m[j] * rt) * scale[0] + base[j]) + hc_eps;
            post[t * n + j] = 2.0f * hc_sigmoid((m[n + j] * rt) * scale[1] + base[n + j]);
        }
        float* c = comb + t * n * n;
        if (n * n <= HC_LOCAL) {
            // Sinkhorn's 20 rounds in a local array (coalesced across the warp, likely in
            // registers), then one copy out: in place they touched the token's slice of comb
            // in global memory some thousand times.
            float local[HC_LOCAL];
            for (i64 i = 0; i < n * n; ++i) local[i] = (m[2 * n + i] * rt) * scale[2] + base[2 * n + i];
            hc_sinkhorn(local, n, iters, hc_eps);
            for (i64 i = 0; i < n * n; ++i) c[i] = local[i];
        } else {
            for (i64 i = 0; i < n * n; ++i) c[i] = (m[2 * n + i] * rt) * scale[2] + base[2 * n + i];
            hc_sinkhorn(c, n, iters, hc_eps);
        }
    }
}

// Head coefficients: mixes [T, n], r [T], base [n], scale [1] -> pre [T, n].
extern "C" __global__ void hc_head_coeffs(const float* mixes, const float* r, const float* base,
                                          const float* scale, float* pre, i64 tokens, i64 n,
                                          float hc_eps) {
    NS_FOR(e, tokens * n) {
        i64 t = e / n, j = e % n;
        pre[e] = hc_sigmoid((mixes[e] * r[t]) * scale[0] + base[j]) + hc_eps;
    }
}

// out[t, i] = Σ_j w[t, j] · x[t, j, i] for streams x [T, n, d], weights w [T, n].
extern "C" __global__ void hc_weighted_sum(const float* x, const float* w, float* out,
                                           i64 tokens, i64 n, i64 d) {
    NS_FOR(e, tokens * d) {
        i64 t = e / d, i = e % d;
        float o = 0.0f;
        for (i64 j = 0; j < n; ++j) o = o + w[t * n + j] * x[(t * n + j) * d + i];
        out[e] = o;
    }
}

// Post-mix: out[t, k, i] = post[t, k] · y[t, i] + Σ_j comb[t, j, k] · old[t, j, i].
// `old` and `out` are distinct [T, n, d] buffers.
extern "C" __global__ void hc_post_mix(const float* old, const float* y, const float* post,
                                       const float* comb, float* out, i64 tokens, i64 n, i64 d) {
    NS_FOR(e, tokens * n * d) {
        i64 i = e % d, k = (e / d) % n, t = e / (n * d);
        float o = post[t * n + k] * y[t * d + i];
        for (i64 j = 0; j < n; ++j) o = o + comb[(t * n + j) * n + k] * old[(t * n + j) * d + i];
        out[e] = o;
    }
}
