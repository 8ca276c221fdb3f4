// Fused, numerically stable softmax: forward y = exp(x - max) / sum, backward
// dx = y * (dy - sum(y * dy)), each in ONE pass over memory (seed 000, V.B):
// the row is loaded once into registers, reduced (warp shuffles, then shared
// memory, then -- for long rows on Hopper -- distributed shared memory across
// a thread-block cluster) and written once.
//
// Kernels (softmax.py picks one per shape):
//   softmax_rows_warp     rows up to 32 vectors per lane; a group of LANES lanes per row
//                         (LANES < 32 packs several short rows into one warp)
//   softmax_rows_block    one block per row, VPT vectors per thread
//   softmax_rows_cluster  a cluster of CL blocks per row (sm_90): each holds 1/CL of the
//                         row, so several rows are in flight per SM even at L = 32768
//   softmax_rows_online   float16 forward, clusters as above: exponentials kept as packed halves
//                         against each block's own maximum, one cluster exchange (online softmax)
//   softmax_rows_stream   any length: two reads (the second mostly from L2)
//   softmax_inner         softmax over the middle axis of x[O][L][I] (C of NCHW), i coalesced
// Forward: a = x, b unused.  Backward: a = y, b = dy, out = dx.
#include "common.cuh"

template <typename T, int V>
__device__ __forceinline__ void load_vec(float* dst, const T* p) {
    Pack<T, V> pk;
    pk.load(p);
#pragma unroll
    for (int k = 0; k < V; ++k) dst[k] = to_float(pk.e[k]);
}

template <typename T, int V>
__device__ __forceinline__ void store_vec(T* p, const float* src) {
    Pack<T, V> pk;
#pragma unroll
    for (int k = 0; k < V; ++k) pk.e[k] = from_float<T>(src[k]);
    pk.store(p);
}

// Vectors first, first + stride, ... (N of them) of one row into registers.  Slots past the row (or of
// an inactive thread) hold what leaves the reductions unchanged: -inf forward (exp gives 0), 0 backward.
template <typename T, int V, int N, bool BWD>
__device__ __forceinline__ void load_row(float* va, float* vb, const T* __restrict__ a, const T* __restrict__ b,
                                         long long base, int first, int stride, bool active, int nvec) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const int j = first + i * stride;
        if (active && j < nvec) {
            load_vec<T, V>(va + i * V, a + base + (long long)j * V);
            if constexpr (BWD) load_vec<T, V>(vb + i * V, b + base + (long long)j * V);
        } else {
#pragma unroll
            for (int k = 0; k < V; ++k) {
                va[i * V + k] = BWD ? 0.f : neg_inf();
                if constexpr (BWD) vb[i * V + k] = 0.f;
            }
        }
    }
}

template <typename T, int V, int N>
__device__ __forceinline__ void store_row(T* __restrict__ out, const float* va, long long base, int first, int stride,
                                          bool active, int nvec) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const int j = first + i * stride;
        if (active && j < nvec) store_vec<T, V>(out + base + (long long)j * V, va + i * V);
    }
}

// Softmax of a row whose threads hold E of its values each in registers: forward va <- exp(va - max) / sum,
// backward va <- va * (vb - sum(va * vb)).  Reducing across those threads is the caller's: row_max for the
// maximum, row_sum for the forward sum and row_dot for the backward one (each may use its own scratch).
template <int E, bool BWD, typename Max, typename Sum, typename Dot>
__device__ __forceinline__ void softmax_regs(float* va, const float* vb, Max row_max, Sum row_sum, Dot row_dot) {
    if constexpr (!BWD) {
        float m = neg_inf();
#pragma unroll
        for (int e = 0; e < E; ++e) m = fmaxf(m, va[e]);
        m = row_max(m);
        float s = 0.f;
#pragma unroll
        for (int e = 0; e < E; ++e) {  // padding slots hold -inf: exp gives 0
            va[e] = exp_shifted(va[e], m);
            s += va[e];
        }
        const float inv = 1.f / row_sum(s);
#pragma unroll
        for (int e = 0; e < E; ++e) va[e] *= inv;
    } else {
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < E; ++e) dot = fmaf(va[e], vb[e], dot);
        dot = row_dot(dot);
#pragma unroll
        for (int e = 0; e < E; ++e) va[e] *= vb[e] - dot;
    }
}

// ---------------------------------------------------------------------------------------------
template <typename T, int LANES, int VPL, int V, int NT, bool BWD>
__global__ void __launch_bounds__(NT)
softmax_rows_warp(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, long long R, int L) {
    constexpr int E = VPL * V;
    const int lane = threadIdx.x % LANES;
    const long long row = (long long)blockIdx.x * (NT / LANES) + threadIdx.x / LANES;
    const bool active = row < R;
    const int nvec = L / V;
    const long long base = row * (long long)L;
    float va[E], vb[BWD ? E : 1];
    load_row<T, V, VPL, BWD>(va, vb, a, b, base, lane, LANES, active, nvec);
    const auto row_sum = [](float v) { return group_sum<LANES>(v); };
    softmax_regs<E, BWD>(va, vb, [](float v) { return group_max<LANES>(v); }, row_sum, row_sum);
    store_row<T, V, VPL>(out, va, base, lane, LANES, active, nvec);
}

// ---------------------------------------------------------------------------------------------
// Block-wide reduction; every thread gets the result.  `red` holds one slot per warp.
template <int NT, bool MAX>
__device__ __forceinline__ float block_reduce(float v, float* red) {
    constexpr int W = NT / 32;
    v = MAX ? group_max<32>(v) : group_sum<32>(v);
    if constexpr (W > 1) {
        if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
        __syncthreads();
        const int lane = threadIdx.x % 32;
        v = lane < W ? red[lane] : (MAX ? neg_inf() : 0.f);
        v = MAX ? group_max<32>(v) : group_sum<32>(v);
    }
    return v;
}

__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
__device__ __forceinline__ unsigned int cluster_rank() {
    unsigned int r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
// The value at `p` in the shared memory of the cluster's block `rank`.
__device__ __forceinline__ float cluster_load(const float* p, unsigned int rank) {
    unsigned int remote;
    float v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(p)), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
    return v;
}

// Combine one value per block of the cluster (already block-reduced) into the cluster's result.
template <int CL, bool MAX>
__device__ __forceinline__ float cluster_reduce(float v, float* slot) {
    if (threadIdx.x == 0) *slot = v;
    cluster_arrive();
    cluster_wait();
    const int lane = threadIdx.x % 32;
    float w = lane < CL ? cluster_load(slot, lane) : (MAX ? neg_inf() : 0.f);
    return MAX ? group_max<32>(w) : group_sum<32>(w);
}

// The maximum over one thread's loaded vectors (those inside the row). Half precision in 16-byte
// vectors takes it on packed pairs (max.f16x2, NaN-ignoring like fmaxf, exact): half the
// instructions of converting every element first.
template <typename T, int NT, int VPT, int V>
__device__ __forceinline__ float thread_max(const Pack<T, V> (&raw)[VPT], int j0, int nvec) {
    float m = neg_inf();
    if constexpr (sizeof(T) == 2 && V == 8) {
        unsigned int mm = 0xFC00FC00u;  // (-inf, -inf)
#pragma unroll
        for (int i = 0; i < VPT; ++i)
            if (j0 + i * NT + (int)threadIdx.x < nvec) {
                const unsigned int w[4] = {raw[i].raw.x, raw[i].raw.y, raw[i].raw.z, raw[i].raw.w};
#pragma unroll
                for (int k = 0; k < 4; ++k) asm("max.f16x2 %0, %0, %1;" : "+r"(mm) : "r"(w[k]));
            }
        m = fmaxf(to_float(half_t{(unsigned short)(mm & 0xFFFFu)}), to_float(half_t{(unsigned short)(mm >> 16)}));
    } else {
#pragma unroll
        for (int i = 0; i < VPT; ++i)
            if (j0 + i * NT + (int)threadIdx.x < nvec) {
#pragma unroll
                for (int k = 0; k < V; ++k) m = fmaxf(m, to_float(raw[i].e[k]));
            }
    }
    return m;
}

// One value per thread reduced over the row's threads: the block (``red``: one slot per warp), then,
// with CL > 1, the cluster (``slot``: this block's partial, read by the others).
template <int NT, int CL, bool MAX>
__device__ __forceinline__ float row_reduce(float v, float* red, float* slot) {
    v = block_reduce<NT, MAX>(v, red);
    if constexpr (CL > 1) v = cluster_reduce<CL, MAX>(v, slot);
    return v;
}

// Forward only, the row kept in registers as loaded (RAW): half precision takes half the registers
// of float32 values, so more blocks fit per SM (more bytes in flight), at the price of computing
// each exponential twice (sum, then store).
// CS: streaming cache hints (ld.global.cs / st.global.cs, evict-first): every byte is touched once.
template <typename T, int NT, int VPT, int V, int CL, bool CS>
__device__ __forceinline__ void rows_block_body_raw(const T* __restrict__ a, T* __restrict__ out, int L,
                                                    long long row, int rank) {
    __shared__ float red_a[NT / 32], red_b[NT / 32];
    __shared__ float part[2];
    const int nvec = L / V;
    const long long base = row * (long long)L;
    const int j0 = rank * NT * VPT;
    Pack<T, V> raw[VPT];
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int j = j0 + i * NT + threadIdx.x;
        if (j < nvec) {
            if constexpr (CS) load_stream(raw[i], a + base + (long long)j * V);
            else raw[i].load(a + base + (long long)j * V);
        }
    }
    float m = thread_max<T, NT, VPT, V>(raw, j0, nvec);
    m = row_reduce<NT, CL, true>(m, red_a, &part[0]);
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i)
        if (j0 + i * NT + (int)threadIdx.x < nvec) {
#pragma unroll
            for (int k = 0; k < V; ++k) s += exp_shifted(to_float(raw[i].e[k]), m);
        }
    s = row_reduce<NT, CL, false>(s, red_b, &part[1]);
    const float inv = 1.f / s;
    if constexpr (CL > 1) cluster_arrive();
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int j = j0 + i * NT + threadIdx.x;
        if (j < nvec) {
            Pack<T, V> pk;
#pragma unroll
            for (int k = 0; k < V; ++k) pk.e[k] = from_float<T>(exp_shifted(to_float(raw[i].e[k]), m) * inv);
            if constexpr (CS) __stcs(reinterpret_cast<typename Pack<T, V>::Raw*>(out + base + (long long)j * V), pk.raw);
            else pk.store(out + base + (long long)j * V);
        }
    }
    if constexpr (CL > 1) cluster_wait();
}

// Forward, half precision, ONE cluster exchange (online softmax across the cluster's blocks): each block
// takes its slice's own maximum m_b and sum s_b = sum exp(x - m_b), overwriting the loaded halves with
// those exponentials (packed halves: the registers of the row as loaded, and one ex2 per element, not two
// as in the raw kernel); the cluster then exchanges (m_b, s_b) once: M = max m_b, S = sum s_b exp(m_b - M),
// and the store pass only scales: y = e * exp(m_b - M) / S.  Exponentials of magnitude <= 1 rounded to
// half, then scaled and rounded again: within 1.5 ulp of half precision.
// A slice of only -inf: its exponentials are taken against 0 (all 0, not NaN) and its factor is
// exp(-inf - M) = 0; a row of only -inf gives M = -inf, S = 0 and NaN everywhere, as NumPy's formula.
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}

template <int NT, int VPT, int V, int CL>
__device__ __forceinline__ void rows_block_body_online(const half_t* __restrict__ a, half_t* __restrict__ out,
                                                       int L, long long row, int rank) {
    __shared__ float red_a[NT / 32], red_b[NT / 32];
    __shared__ float part[2];
    const int nvec = L / V;
    const long long base = row * (long long)L;
    const int j0 = rank * NT * VPT;
    Pack<half_t, V> raw[VPT];
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int j = j0 + i * NT + threadIdx.x;
        if (j < nvec) raw[i].load(a + base + (long long)j * V);
    }
    float m = thread_max<half_t, NT, VPT, V>(raw, j0, nvec);
    m = block_reduce<NT, true>(m, red_a);
    const float mb = m == neg_inf() ? 0.f : m;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i)
        if (j0 + i * NT + (int)threadIdx.x < nvec) {
#pragma unroll
            for (int k = 0; k < V; ++k) {
                const float e = exp_shifted(to_float(raw[i].e[k]), mb);
                s += e;
                raw[i].e[k] = from_float<half_t>(e);
            }
        }
    s = block_reduce<NT, false>(s, red_b);
    if (threadIdx.x == 0) part[0] = m, part[1] = s;
    cluster_arrive();
    cluster_wait();
    const int lane = threadIdx.x % 32;
    const float mr = lane < CL ? cluster_load(&part[0], lane) : neg_inf();
    const float sr = lane < CL ? cluster_load(&part[1], lane) : 0.f;
    const float M = group_max<32>(mr);
    const float S = group_sum<32>(sr == 0.f ? 0.f : sr * exp_shifted(mr, M));
    const float scale = exp_shifted(m, M) / S;
    cluster_arrive_relaxed();  // done reading the other blocks' shared memory (the values are in use)
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
        const int j = j0 + i * NT + threadIdx.x;
        if (j < nvec) {
            Pack<half_t, V> pk;
#pragma unroll
            for (int k = 0; k < V; ++k) pk.e[k] = from_float<half_t>(to_float(raw[i].e[k]) * scale);
            pk.store(out + base + (long long)j * V);
        }
    }
    cluster_wait();
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
// Forward, half precision (rows_block_body_online); NT = 256: five blocks per SM, as the raw kernel.
template <int NT, int VPT, int V, int CL>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(NT, NT == 256 ? 5 : 0)
softmax_rows_online(const half_t* __restrict__ a, const half_t* __restrict__ b, half_t* __restrict__ out,
                    long long R, int L) {
    rows_block_body_online<NT, VPT, V, CL>(a, out, L, blockIdx.x / CL, (int)cluster_rank());
}
#endif

template <typename T, int NT, int VPT, int V, int CL, bool BWD>
__device__ __forceinline__ void rows_block_body(const T* __restrict__ a, const T* __restrict__ b,
                                                T* __restrict__ out, int L, long long row, int rank) {
    constexpr int E = VPT * V;
    __shared__ float red_a[NT / 32], red_b[NT / 32];
    __shared__ float part[2];
    const int nvec = L / V;
    const long long base = row * (long long)L;
    const int j0 = rank * NT * VPT + threadIdx.x;
    float va[E], vb[BWD ? E : 1];
    load_row<T, V, VPT, BWD>(va, vb, a, b, base, j0, NT, true, nvec);
    softmax_regs<E, BWD>(
        va, vb, [&](float v) { return row_reduce<NT, CL, true>(v, red_a, &part[0]); },
        [&](float v) { return row_reduce<NT, CL, false>(v, red_b, &part[1]); },
        [&](float v) { return row_reduce<NT, CL, false>(v, red_a, &part[0]); });
    // Done reading the other blocks' shared memory: let them go once they have stored.
    if constexpr (CL > 1) cluster_arrive();
    store_row<T, V, VPT>(out, va, base, j0, NT, true, nvec);
    if constexpr (CL > 1) cluster_wait();
}

template <typename T, int NT, int VPT, int V, bool BWD>
__global__ void __launch_bounds__(NT)
softmax_rows_block(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, long long R, int L) {
    rows_block_body<T, NT, VPT, V, 1, BWD>(a, b, out, L, blockIdx.x, 0);
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
// RAW half precision: at most 51 registers, so five 256-thread blocks fit per SM (the reason for RAW).
template <typename T, int NT, int VPT, int V, int CL, bool BWD, bool RAW = false, bool CS = false>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(NT, RAW && sizeof(T) == 2 && NT == 256 ? 5 : 0)
softmax_rows_cluster(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, long long R, int L) {
    if constexpr (RAW && !BWD)
        rows_block_body_raw<T, NT, VPT, V, CL, CS>(a, out, L, blockIdx.x / CL, (int)cluster_rank());
    else rows_block_body<T, NT, VPT, V, CL, BWD>(a, b, out, L, blockIdx.x / CL, (int)cluster_rank());
}
#endif

// ---------------------------------------------------------------------------------------------
// Any row length: pass 1 keeps a running (max, sum) per thread (online softmax), pass 2 re-reads.
__device__ __forceinline__ void online_add(float& m, float& s, float x) {
    if (x > m) {
        s = s * exp_shifted(m, x) + 1.f;  // m = -inf: s = 0 * 0 + 1
        m = x;
    } else if (x != neg_inf()) {
        s += exp_shifted(x, m);
    }
}

template <typename T, int NT, int V, bool BWD>
__global__ void __launch_bounds__(NT)
softmax_rows_stream(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, long long R, int L) {
    __shared__ float red_a[NT / 32], red_b[NT / 32];
    const int nvec = L / V;
    const long long base = (long long)blockIdx.x * L;
    float va[V], vb[V];
    if constexpr (!BWD) {
        float m = neg_inf(), s = 0.f;
        for (int j = threadIdx.x; j < nvec; j += NT) {
            load_vec<T, V>(va, a + base + (long long)j * V);
#pragma unroll
            for (int k = 0; k < V; ++k) online_add(m, s, va[k]);
        }
        const float M = block_reduce<NT, true>(m, red_a);
        const float S = block_reduce<NT, false>(s == 0.f ? 0.f : s * exp_shifted(m, M), red_b);
        const float inv = 1.f / S;
        for (int j = threadIdx.x; j < nvec; j += NT) {
            load_vec<T, V>(va, a + base + (long long)j * V);
#pragma unroll
            for (int k = 0; k < V; ++k) va[k] = exp_shifted(va[k], M) * inv;
            store_vec<T, V>(out + base + (long long)j * V, va);
        }
    } else {
        float dot = 0.f;
        for (int j = threadIdx.x; j < nvec; j += NT) {
            load_vec<T, V>(va, a + base + (long long)j * V);
            load_vec<T, V>(vb, b + base + (long long)j * V);
#pragma unroll
            for (int k = 0; k < V; ++k) dot = fmaf(va[k], vb[k], dot);
        }
        dot = block_reduce<NT, false>(dot, red_a);
        for (int j = threadIdx.x; j < nvec; j += NT) {
            load_vec<T, V>(va, a + base + (long long)j * V);
            load_vec<T, V>(vb, b + base + (long long)j * V);
#pragma unroll
            for (int k = 0; k < V; ++k) va[k] *= vb[k] - dot;
            store_vec<T, V>(out + base + (long long)j * V, va);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Softmax over the middle axis of x[O][L][I] (the channels of NCHW: O = N, L = C, I = H*W).
// A block of TX x TY threads takes TX * V consecutive positions i (coalesced, V per access) of
// one o; thread (tx, ty) holds channels ty, ty + TY, ... (CPT of them in registers; CPT = 0
// streams the column twice instead).
template <int TX, int TY, int V, bool MAX>
__device__ __forceinline__ void column_reduce(float (&v)[V], float (*red)[TX * V + 1]) {
    const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;
#pragma unroll
    for (int k = 0; k < V; ++k) red[ty][tx * V + k] = v[k];
    __syncthreads();
    if (ty == 0) {
        for (int r = 1; r < TY; ++r)
#pragma unroll
            for (int k = 0; k < V; ++k) v[k] = MAX ? fmaxf(v[k], red[r][tx * V + k]) : v[k] + red[r][tx * V + k];
#pragma unroll
        for (int k = 0; k < V; ++k) red[0][tx * V + k] = v[k];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = red[0][tx * V + k];
    __syncthreads();  // red is reused by the next reduction
}

template <typename T, int TX, int TY, int CPT, int V, bool BWD>
__global__ void __launch_bounds__(TX * TY)
softmax_inner(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, int L, long long I,
              long long tiles_i) {
    __shared__ float red[TY][TX * V + 1];
    const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;
    const long long o = blockIdx.x / tiles_i;
    const long long i = ((blockIdx.x % tiles_i) * TX + tx) * V;
    const bool active = i < I;  // I % V == 0: a vector is all in or all out
    const long long base = o * L * I + i;  // element (o, c, i) at base + c * I
    if constexpr (CPT > 0) {
        float va[CPT][V], vb[BWD ? CPT : 1][V];
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = ty + k * TY;
            if (active && c < L) {
                load_vec<T, V>(va[k], a + base + c * I);
                if constexpr (BWD) load_vec<T, V>(vb[k], b + base + c * I);
            } else {
#pragma unroll
                for (int j = 0; j < V; ++j) {
                    va[k][j] = BWD ? 0.f : neg_inf();
                    if constexpr (BWD) vb[k][j] = 0.f;
                }
            }
        }
        if constexpr (!BWD) {
            float m[V], s[V];
#pragma unroll
            for (int j = 0; j < V; ++j) {
                m[j] = neg_inf();
#pragma unroll
                for (int k = 0; k < CPT; ++k) m[j] = fmaxf(m[j], va[k][j]);
            }
            column_reduce<TX, TY, V, true>(m, red);
#pragma unroll
            for (int j = 0; j < V; ++j) {
                s[j] = 0.f;
#pragma unroll
                for (int k = 0; k < CPT; ++k) {
                    va[k][j] = exp_shifted(va[k][j], m[j]);
                    s[j] += va[k][j];
                }
            }
            column_reduce<TX, TY, V, false>(s, red);
#pragma unroll
            for (int j = 0; j < V; ++j) {
                const float inv = 1.f / s[j];
#pragma unroll
                for (int k = 0; k < CPT; ++k) va[k][j] *= inv;
            }
        } else {
            float dot[V];
#pragma unroll
            for (int j = 0; j < V; ++j) {
                dot[j] = 0.f;
#pragma unroll
                for (int k = 0; k < CPT; ++k) dot[j] = fmaf(va[k][j], vb[k][j], dot[j]);
            }
            column_reduce<TX, TY, V, false>(dot, red);
#pragma unroll
            for (int k = 0; k < CPT; ++k)
#pragma unroll
                for (int j = 0; j < V; ++j) va[k][j] *= vb[k][j] - dot[j];
        }
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = ty + k * TY;
            if (active && c < L) store_vec<T, V>(out + base + c * I, va[k]);
        }
    } else {
        float va[V], vb[V];
        if constexpr (!BWD) {
            float m[V], s[V];
#pragma unroll
            for (int j = 0; j < V; ++j) m[j] = neg_inf(), s[j] = 0.f;
            for (int c = ty; c < L && active; c += TY) {
                load_vec<T, V>(va, a + base + c * I);
#pragma unroll
                for (int j = 0; j < V; ++j) online_add(m[j], s[j], va[j]);
            }
            float M[V], S[V];
#pragma unroll
            for (int j = 0; j < V; ++j) M[j] = m[j];
            column_reduce<TX, TY, V, true>(M, red);
#pragma unroll
            for (int j = 0; j < V; ++j) S[j] = s[j] == 0.f ? 0.f : s[j] * exp_shifted(m[j], M[j]);
            column_reduce<TX, TY, V, false>(S, red);
            for (int c = ty; c < L && active; c += TY) {
                load_vec<T, V>(va, a + base + c * I);
#pragma unroll
                for (int j = 0; j < V; ++j) va[j] = exp_shifted(va[j], M[j]) / S[j];
                store_vec<T, V>(out + base + c * I, va);
            }
        } else {
            float dot[V];
#pragma unroll
            for (int j = 0; j < V; ++j) dot[j] = 0.f;
            for (int c = ty; c < L && active; c += TY) {
                load_vec<T, V>(va, a + base + c * I);
                load_vec<T, V>(vb, b + base + c * I);
#pragma unroll
                for (int j = 0; j < V; ++j) dot[j] = fmaf(va[j], vb[j], dot[j]);
            }
            column_reduce<TX, TY, V, false>(dot, red);
            for (int c = ty; c < L && active; c += TY) {
                load_vec<T, V>(va, a + base + c * I);
                load_vec<T, V>(vb, b + base + c * I);
#pragma unroll
                for (int j = 0; j < V; ++j) va[j] *= vb[j] - dot[j];
                store_vec<T, V>(out + base + c * I, va);
            }
        }
    }
}

#ifdef UCUDNN_NVCC_CHECK
template __global__ void softmax_rows_warp<float, 32, 8, 4, 256, false>(const float*, const float*, float*, long long, int);
template __global__ void softmax_rows_warp<half_t, 8, 1, 2, 256, false>(const half_t*, const half_t*, half_t*, long long, int);
template __global__ void softmax_rows_warp<float, 32, 8, 4, 256, true>(const float*, const float*, float*, long long, int);
template __global__ void softmax_rows_block<float, 1024, 8, 4, false>(const float*, const float*, float*, long long, int);
template __global__ void softmax_rows_block<half_t, 512, 4, 8, true>(const half_t*, const half_t*, half_t*, long long, int);
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
template __global__ void softmax_rows_cluster<float, 256, 8, 4, 4, false>(const float*, const float*, float*, long long, int);
template __global__ void softmax_rows_cluster<half_t, 256, 4, 8, 4, true>(const half_t*, const half_t*, half_t*, long long, int);
template __global__ void softmax_rows_cluster<half_t, 256, 8, 8, 8, false, true>(const half_t*, const half_t*, half_t*, long long, int);
template __global__ void softmax_rows_cluster<half_t, 256, 8, 8, 8, false, true, true>(const half_t*, const half_t*, half_t*, long long, int);
template __global__ void softmax_rows_cluster<float, 256, 16, 4, 8, false, true, true>(const float*, const float*, float*, long long, int);
template __global__ void softmax_rows_cluster<half_t, 256, 8, 8, 8, false>(const half_t*, const half_t*, half_t*, long long, int);
template __global__ void softmax_rows_online<256, 8, 8, 8>(const half_t*, const half_t*, half_t*, long long, int);
template __global__ void softmax_rows_online<512, 8, 8, 4>(const half_t*, const half_t*, half_t*, long long, int);
template __global__ void softmax_rows_online<256, 5, 2, 4>(const half_t*, const half_t*, half_t*, long long, int);
#endif
template __global__ void softmax_rows_stream<float, 1024, 4, false>(const float*, const float*, float*, long long, int);
template __global__ void softmax_rows_stream<half_t, 1024, 8, true>(const half_t*, const half_t*, half_t*, long long, int);
template __global__ void softmax_inner<float, 32, 8, 4, 4, false>(const float*, const float*, float*, int, long long, long long);
template __global__ void softmax_inner<half_t, 32, 8, 3, 8, true>(const half_t*, const half_t*, half_t*, int, long long, long long);
template __global__ void softmax_inner<half_t, 32, 8, 0, 2, true>(const half_t*, const half_t*, half_t*, int, long long, long long);
template __global__ void softmax_inner<float, 32, 8, 0, 1, false>(const float*, const float*, float*, int, long long, long long);
#endif
