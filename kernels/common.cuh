// common.cuh: prepended to every kernel family before NVRTC compiles it, and included first when
// the same sources are built for the host emulator (kernels/emu/shim.h, see build.rs).
//
// Rules every kernel follows, so that NVRTC and the host emulator run the same arithmetic:
// - `extern "C" __global__` with a 1-D launch; every thread walks a grid-stride loop (NS_FOR)
//   over independent outputs. No shared memory, no __syncthreads, no warp intrinsics, no
//   atomics: threads never communicate, so running them one after another is exact.
// - Only IEEE-exact arithmetic (+ - * / sqrtf, compiled without FMA contraction: NVRTC gets
//   --fmad=false, the host -ffp-contract=off) plus expf/logf/log1pf where the CPU reference
//   uses them too (those may differ by an ulp between libdevice and libm).
// - No CUDA headers: bf16 is a raw u16, converted by the helpers below.
#ifndef NS_COMMON_CUH
#define NS_COMMON_CUH

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

// Grid-stride loop over [0, n).
#define NS_FOR(i, n)                                                                  \
    for (i64 i = (i64)blockIdx.x * (i64)blockDim.x + (i64)threadIdx.x; i < (i64)(n); \
         i += (i64)gridDim.x * (i64)blockDim.x)

static __device__ __forceinline__ u32 ns_f32_bits(float x) {
    union { float f; u32 u; } v;
    v.f = x;
    return v.u;
}

static __device__ __forceinline__ float ns_bits_f32(u32 u) {
    union { float f; u32 u; } v;
    v.u = u;
    return v.f;
}

static __device__ __forceinline__ float ns_nan() { return ns_bits_f32(0x7FC00000u); }
static __device__ __forceinline__ float ns_inf() { return ns_bits_f32(0x7F800000u); }
static __device__ __forceinline__ bool ns_isnan(float x) { return x != x; }

// bf16 (raw bits) -> f32: exact.
static __device__ __forceinline__ float ns_bf16_to_f32(u16 b) { return ns_bits_f32(((u32)b) << 16); }

// f32 -> bf16 bits, round to nearest, ties to even; NaN stays a (quiet) NaN. Same as half::bf16.
static __device__ __forceinline__ u16 ns_f32_to_bf16(float x) {
    u32 u = ns_f32_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (u16)((u >> 16) | 0x0040u);
    u32 lsb = (u >> 16) & 1u;
    return (u16)((u + 0x7FFFu + lsb) >> 16);
}

// f32 rounded to bf16 and back (numerics::codecs::bf16_round).
static __device__ __forceinline__ float ns_bf16_round(float x) { return ns_bf16_to_f32(ns_f32_to_bf16(x)); }

// 2^e as f32 for e in [-126, 127] (exact).
static __device__ __forceinline__ float ns_pow2(int e) { return ns_bits_f32((u32)(e + 127) << 23); }

// e4m3fn code -> f32 (no infinities; 0x7F / 0xFF are NaN).
static __device__ __forceinline__ float ns_e4m3_to_f32(u8 b) {
    u32 sign = b & 0x80u, exp = (b >> 3) & 0xFu, man = b & 7u;
    float v;
    if (exp == 15u && man == 7u) return ns_nan();
    if (exp == 0u) v = (float)man * ns_pow2(-9);
    else v = ns_bits_f32(((exp + 120u) << 23) | (man << 20));
    return sign ? -v : v;
}

// e8m0 scale -> f32: 2^(b-127); 255 is NaN, 0 is 2^-127 (a subnormal).
static __device__ __forceinline__ float ns_e8m0_to_f32(u8 b) {
    if (b == 255u) return ns_nan();
    if (b == 0u) return ns_bits_f32(1u << 22);
    return ns_bits_f32(((u32)b) << 23);
}

// e2m1 code (low nibble) -> f32: 0, 0.5, 1, 1.5, 2, 3, 4, 6 built from the bits (exponent e,
// mantissa m: m/2 when e = 0, else (1 + m/2) * 2^(e-1)), with no table: a dynamically indexed
// local array lives in slow local memory on the GPU.
static __device__ __forceinline__ float ns_e2m1_to_f32(u32 code) {
    u32 e = (code >> 1) & 3u, m = code & 1u;
    float v = e == 0u ? (m ? 0.5f : 0.0f) : ns_bits_f32(((e + 126u) << 23) | (m << 22));
    return (code & 8u) ? -v : v;
}

// Four consecutive floats at p: one 16-byte load on the device (p must be 16-byte aligned: the
// caller checks with ns_aligned16), four loads on the host emulator. The values are the same.
static __device__ __forceinline__ bool ns_aligned16(const void* p) {
    return ((u64)p & 15u) == 0;
}
static __device__ __forceinline__ void ns_load4(const float* p, float out[4]) {
#ifdef __CUDA_ARCH__
    float4 v = *reinterpret_cast<const float4*>(p);
    out[0] = v.x;
    out[1] = v.y;
    out[2] = v.z;
    out[3] = v.w;
#else
    for (int l = 0; l < 4; ++l) out[l] = p[l];
#endif
}

#endif
