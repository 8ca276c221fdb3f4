// Shared device helpers for ucudnn's memory-bound kernels.
//
// No standard or CUDA headers on purpose: the same text compiles under NVRTC
// (CuPy, at run time, where no CUDA include path is guaranteed) and under
// nvcc (CI).  Half precision is therefore handled as raw 16-bit storage
// (`half_t`) converted with PTX `cvt`; arithmetic always runs in float32.
#pragma once

struct __align__(2) half_t {
    unsigned short bits;
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(half_t v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
    return f;
}

template <typename T> __device__ __forceinline__ T from_float(float f);
template <> __device__ __forceinline__ float from_float<float>(float f) { return f; }
template <> __device__ __forceinline__ half_t from_float<half_t>(float f) {
    half_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
    return h;
}

// A conv layer's activation after its bias: none, ReLU (max(v, 0)) or ReLU6 (min(max(v, 0), 6): MobileNet V2's
// expand and depthwise layers).  Fused blocks (fused.cu, pointwise.cu); kernels/fused.py: ConvLayer.activation.
enum : int { ACT_NONE = 0, ACT_RELU = 1, ACT_RELU6 = 2 };

template <int ACT> __device__ __forceinline__ float act(float v) {
    static_assert(ACT == ACT_NONE || ACT == ACT_RELU || ACT == ACT_RELU6, "unknown activation");
    if constexpr (ACT == ACT_RELU6) return fminf(fmaxf(v, 0.f), 6.f);
    else if constexpr (ACT == ACT_RELU) return fmaxf(v, 0.f);
    else return v;
}

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// One aligned global access of BYTES bytes: the widest load/store the element
// count allows (16 bytes is one LDG.128 / STG.128).
template <int BYTES> struct RawWord;
template <> struct RawWord<16> { typedef uint4 type; };
template <> struct RawWord<8> { typedef uint2 type; };
template <> struct RawWord<4> { typedef unsigned int type; };
template <> struct RawWord<2> { typedef unsigned short type; };
template <> struct RawWord<1> { typedef unsigned char type; };

// V elements of T moved as one access.  Only ever indexed with compile-time
// constants (unrolled loops), so it stays in registers.
template <typename T, int V> struct Pack {
    typedef typename RawWord<sizeof(T) * V>::type Raw;
    union {
        Raw raw;
        T e[V];
    };
    __device__ __forceinline__ void load(const T* p) { raw = *reinterpret_cast<const Raw*>(p); }
    __device__ __forceinline__ void store(T* p) const { *reinterpret_cast<Raw*>(p) = raw; }
};

// Streaming load (evict-first): data read once must not push reused data out of L2.
template <typename T, int V> __device__ __forceinline__ void load_stream(Pack<T, V>& pk, const T* p) {
    typedef typename Pack<T, V>::Raw Raw;
    pk.raw = __ldcs(reinterpret_cast<const Raw*>(p));
}

// The shared-memory (state space) address of a generic pointer into shared memory.
__device__ __forceinline__ unsigned int smem_addr(const void* p) {
    unsigned int r;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}

// cp.async of one 4-byte word (direct.cu, winograd.cu); src_bytes 0 zero-fills (padding, channels past the group).
__device__ __forceinline__ void cp_async4(float* dst, const void* src, int src_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned long long g;
    asm("cvta.to.global.u64 %0, %1;" : "=l"(g) : "l"(src));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_addr(dst)), "l"(g), "r"(src_bytes)
                 : "memory");
#else
    *dst = src_bytes ? *reinterpret_cast<const float*>(src) : 0.f;
#endif
}
__device__ __forceinline__ void cp_async_commit4() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void cp_async_wait4() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

template <int WIDTH> __device__ __forceinline__ float group_max(float v) {
#pragma unroll
    for (int o = WIDTH / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

template <int WIDTH> __device__ __forceinline__ float group_sum(float v) {
#pragma unroll
    for (int o = WIDTH / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// exp(x - m) via ex2 (see below).  The difference is taken first: x - m is exact when x
// is near m (Sterbenz), so rows of huge magnitude (1e30) keep full accuracy,
// which folding m into an FMA would not.  x = -inf gives 0; m = -inf (a row
// of only -inf) gives NaN, as NumPy does.
#define UCUDNN_LOG2E 1.4426950408889634f
// ex2.approx.ftz: the MUFU instruction alone (exp2f adds a rescaling for results under 2**-126, which
// softmax outputs -- each divided by a sum >= 1 -- would not keep anyway: flushed to 0, an absolute
// error under 1.2e-38).
__device__ __forceinline__ float exp_shifted(float x, float m) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"((x - m) * UCUDNN_LOG2E));
    return r;
}
