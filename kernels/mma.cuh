// Tensor-core helpers shared by ucudnn's FP16 fused-block kernels (pointwise.cu, spatial.cu): mma.sync
// m16n8k16 (f16 x f16 -> f32) and the 32-bit pair loads its fragments are made of.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 .row.col, g = lane / 4, t = lane % 4): A regs {a0a1, a2a3, a4a5, a6a7}
// = rows (g, g + 8, g, g + 8), columns (2t, 2t, 2t + 8, 2t + 8) (+0, +1); B regs {b0b1, b2b3} = k rows 2t (+0,
// +1) and 2t + 8 (+0, +1) of column g; C regs c0..c3 = (row g, column 2t), (g, 2t + 1), (g + 8, 2t), (g + 8,
// 2t + 1).
#pragma once
#include "common.cuh"

__device__ __forceinline__ unsigned ldg_pair(const half_t* p) {
    return __ldg(reinterpret_cast<const unsigned*>(p));
}

__device__ __forceinline__ unsigned lds_pair(const half_t* p) { return *reinterpret_cast<const unsigned*>(p); }

__device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <bool B> __device__ __forceinline__ float bias_at(const half_t* __restrict__ b, int m) {
    if constexpr (B) return to_float(b[m]);
    else return 0.f;
}

// cp.async of 16 bytes global -> shared (sm_80+, what mma.sync needs anyway); valid false zero-fills the 16 bytes
// without reading (src must still be a global address).  Completed by cp_async_wait_all.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    unsigned long long g;
    asm("cvta.to.global.u64 %0, %1;" : "=l"(g) : "l"(src));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(g),
                 "r"(valid ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// count items moved by NTH threads, U per thread at a time: U loads issued before the first of their U stores, so a
// thread keeps U global loads in flight (the register path, for copies that transpose or scatter).
template <int NTH, int U, typename T, typename Load, typename Store>
__device__ __forceinline__ void batched_copy(int count, Load load, Store store) {
    for (int base = threadIdx.x; base < count; base += NTH * U) {
        T v[U];
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (base + u * NTH < count) v[u] = load(base + u * NTH);
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (base + u * NTH < count) store(base + u * NTH, v[u]);
    }
}
