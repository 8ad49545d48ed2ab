// dequant.cu: stored weight formats -> f32 or bf16 rows, and f32 <-> bf16 activations.
//
// Every dequant kernel writes `nrows x cols` values: output row i is weight row
// `ids ? ids[i] : r0 + i` (ids: gathered rows, e.g. embedding lookups; null for a band of rows).
// `out` is float* when out_bf16 == 0, else bf16 bits (u16*). The arithmetic is exactly that of
// numerics::formats (value = code * scale in f32; NVFP4: code * (e4m3 scale * scale_2)), so the
// f32 output equals the CPU decode bit for bit.

static __device__ __forceinline__ void ns_store(void* out, i64 e, float v, int out_bf16) {
    if (out_bf16) ((u16*)out)[e] = ns_f32_to_bf16(v);
    else ((float*)out)[e] = v;
}

static __device__ __forceinline__ i64 ns_row(const int* ids, i64 r0, i64 i) {
    return ids ? (i64)ids[i] : r0 + i;
}

extern "C" __global__ void dequant_bf16(const u16* w, const int* ids, i64 r0, i64 nrows, i64 cols,
                                        void* out, int out_bf16) {
    NS_FOR(e, nrows * cols) {
        i64 i = e / cols, c = e % cols;
        ns_store(out, e, ns_bf16_to_f32(w[ns_row(ids, r0, i) * cols + c]), out_bf16);
    }
}

extern "C" __global__ void dequant_f32(const float* w, const int* ids, i64 r0, i64 nrows, i64 cols,
                                       void* out, int out_bf16) {
    NS_FOR(e, nrows * cols) {
        i64 i = e / cols, c = e % cols;
        ns_store(out, e, w[ns_row(ids, r0, i) * cols + c], out_bf16);
    }
}

// e4m3 codes [rows, cols], e8m0 scales [ceil(rows/block_r), ceil(cols/block_c)].
extern "C" __global__ void dequant_fp8_block(const u8* w, const u8* scale, i64 block_r, i64 block_c,
                                             const int* ids, i64 r0, i64 nrows, i64 cols,
                                             void* out, int out_bf16) {
    i64 sc = (cols + block_c - 1) / block_c;
    NS_FOR(e, nrows * cols) {
        i64 i = e / cols, c = e % cols;
        i64 r = ns_row(ids, r0, i);
        float v = ns_e4m3_to_f32(w[r * cols + c]) * ns_e8m0_to_f32(scale[(r / block_r) * sc + c / block_c]);
        ns_store(out, e, v, out_bf16);
    }
}

// Packed e2m1 [rows, cols/2] (low nibble = even column), e8m0 scales [rows, ceil(cols/group)].
extern "C" __global__ void dequant_fp4_group(const u8* packed, const u8* scale, i64 group,
                                             const int* ids, i64 r0, i64 nrows, i64 cols,
                                             void* out, int out_bf16) {
    i64 sc = (cols + group - 1) / group;
    NS_FOR(e, nrows * cols) {
        i64 i = e / cols, c = e % cols;
        i64 r = ns_row(ids, r0, i);
        u8 b = packed[r * (cols / 2) + c / 2];
        u32 code = (c & 1) ? (u32)(b >> 4) : (u32)(b & 0x0F);
        float v = ns_e2m1_to_f32(code) * ns_e8m0_to_f32(scale[r * sc + c / group]);
        ns_store(out, e, v, out_bf16);
    }
}

// NVFP4: packed e2m1 [rows, cols/2], e4m3 scales [rows, ceil(cols/16)], f32 global scale_2.
extern "C" __global__ void dequant_nvfp4(const u8* packed, const u8* scale, float scale_2,
                                         const int* ids, i64 r0, i64 nrows, i64 cols,
                                         void* out, int out_bf16) {
    i64 sc = (cols + 15) / 16;
    NS_FOR(e, nrows * cols) {
        i64 i = e / cols, c = e % cols;
        i64 r = ns_row(ids, r0, i);
        u8 b = packed[r * (cols / 2) + c / 2];
        u32 code = (c & 1) ? (u32)(b >> 4) : (u32)(b & 0x0F);
        float s = ns_e4m3_to_f32(scale[r * sc + c / 16]) * scale_2;
        ns_store(out, e, ns_e2m1_to_f32(code) * s, out_bf16);
    }
}

// Eight consecutive values from four packed bytes at `src`, each code times `s`, to out[e0..].
static __device__ __forceinline__ void ns_fp4_store8(const u8* src, float s, void* out, i64 e0,
                                                     int out_bf16) {
    for (int k = 0; k < 4; ++k) {
        u8 b = src[k];
        ns_store(out, e0 + 2 * k, ns_e2m1_to_f32((u32)(b & 0x0F)) * s, out_bf16);
        ns_store(out, e0 + 2 * k + 1, ns_e2m1_to_f32((u32)(b >> 4)) * s, out_bf16);
    }
}

// dequant_fp4_group with eight values (four packed bytes) per thread, when cols and group are
// multiples of 8 (the eight share a row and a scale): one row / scale lookup and one 64-bit
// division per eight values instead of per value. Same values, bit for bit.
extern "C" __global__ void dequant_fp4_group8(const u8* packed, const u8* scale, i64 group,
                                              const int* ids, i64 r0, i64 nrows, i64 cols,
                                              void* out, int out_bf16) {
    i64 sc = (cols + group - 1) / group, per_row = cols / 8;
    NS_FOR(q, nrows * per_row) {
        i64 i = q / per_row, c0 = (q % per_row) * 8;
        i64 r = ns_row(ids, r0, i);
        float s = ns_e8m0_to_f32(scale[r * sc + c0 / group]);
        ns_fp4_store8(packed + r * (cols / 2) + c0 / 2, s, out, i * cols + c0, out_bf16);
    }
}

// dequant_nvfp4 with eight values per thread, when cols is a multiple of 8 (the eight share a
// 16-value scale block).
extern "C" __global__ void dequant_nvfp4_8(const u8* packed, const u8* scale, float scale_2,
                                           const int* ids, i64 r0, i64 nrows, i64 cols,
                                           void* out, int out_bf16) {
    i64 sc = (cols + 15) / 16, per_row = cols / 8;
    NS_FOR(q, nrows * per_row) {
        i64 i = q / per_row, c0 = (q % per_row) * 8;
        i64 r = ns_row(ids, r0, i);
        float s = ns_e4m3_to_f32(scale[r * sc + c0 / 16]) * scale_2;
        ns_fp4_store8(packed + r * (cols / 2) + c0 / 2, s, out, i * cols + c0, out_bf16);
    }
}

// f32 -> bf16 bits (round to nearest even), n values.
extern "C" __global__ void f32_to_bf16(const float* x, u16* y, i64 n) {
    NS_FOR(i, n) { y[i] = ns_f32_to_bf16(x[i]); }
}
