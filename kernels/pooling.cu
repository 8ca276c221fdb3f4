// 2-D pooling (max, average with or without the padding in the count), forward and backward,
// for NCHW and CHWN (seed 000, V.A).
//
// Forward, thread coarsening: each thread computes an OP x OQ block of outputs and walks
// the union of their windows once, so every input element it needs is read once and used
// for all of its outputs from registers (the seed's register reuse; OP, OQ come from the
// hill-climbing auto-tuner, autotune.py).
//   pool_nchw_fwd  a block stages G whole (n, c) planes -- or one band of rows of a large
//                  plane -- in shared memory with 16-byte coalesced loads, then computes
//                  from there: NCHW's windows are strided along W, shared memory absorbs it.
//   pool_chwn_fwd  straight from global memory: consecutive threads take consecutive n
//                  (V of them per thread), so every window element is a coalesced load.
// Backward gathers (one thread per input element, no atomics, deterministic): the
// gradient of an input is the sum over the outputs whose windows cover it; for max, only
// those whose argmax it is -- taken from the forward's indices, or recomputed from x.
// Ties: the first maximum in window order (row-major) wins, in both directions.
// MODE: 0 max, 1 average counting padding, 2 average over the in-bounds elements only.
#include "common.cuh"

// Accumulator type: float, except max pooling of half precision without indices in NCHW, which
// compares the raw halves (max.f16, exact, NaN-ignoring like fmaxf) and so skips a conversion per
// window element -- in that kernel the conversions, not the bytes, set the pace.
template <bool B, typename A, typename C> struct Pick { typedef A type; };
template <typename A, typename C> struct Pick<false, A, C> { typedef C type; };
#define UCUDNN_HALF_NEG_INF ((unsigned short)0xFC00)

__device__ __forceinline__ unsigned short hmax(unsigned short a, unsigned short b) {
    unsigned short r;
    asm("max.f16 %0, %1, %2;" : "=h"(r) : "h"(a), "h"(b));
    return r;
}

template <int MODE, typename Acc> __device__ __forceinline__ Acc pool_init() {
    if constexpr (sizeof(Acc) == 2) return UCUDNN_HALF_NEG_INF;
    else return MODE == 0 ? neg_inf() : 0.f;
}
template <typename Acc, typename T> __device__ __forceinline__ Acc pool_value(T v) {
    if constexpr (sizeof(Acc) == 2) return v.bits;  // only with T = half_t
    else return to_float(v);
}

template <int KH, int KW, int MODE>
__device__ __forceinline__ float pool_divisor(int hs, int ws, int H, int W) {
    if constexpr (MODE == 1) return (float)(KH * KW);
    const int hc = min(hs + KH, H) - max(hs, 0), wc = min(ws + KW, W) - max(ws, 0);
    return (float)(hc * wc);
}

// Fold one input value (at in-plane position pos, in bounds iff ok) into every output of the
// OP x OQ block whose window holds patch position (ph, pw).  All conditions are compile-time
// (ph, pw come from unrolled loops; ok is the constant true on the interior fast path).
template <int KH, int KW, int SH, int SW, int OP, int OQ, int MODE, bool IDX, typename Acc>
__device__ __forceinline__ void pool_fold(Acc (&acc)[OP][OQ], int (&arg)[OP][OQ], int ph, int pw, Acc v, bool ok,
                                          int pos) {
#pragma unroll
    for (int op = 0; op < OP; ++op) {
        if (ph - op * SH < 0 || ph - op * SH >= KH) continue;
#pragma unroll
        for (int oq = 0; oq < OQ; ++oq) {
            if (pw - oq * SW < 0 || pw - oq * SW >= KW) continue;
            if constexpr (sizeof(Acc) == 2) {
                acc[op][oq] = hmax(acc[op][oq], ok ? v : UCUDNN_HALF_NEG_INF);
            } else if constexpr (MODE == 0 && !IDX) {
                acc[op][oq] = fmaxf(acc[op][oq], ok ? v : neg_inf());  // NaN-ignoring, as cuDNN's default
            } else if constexpr (MODE == 0) {
                if (ok && (v > acc[op][oq] || arg[op][oq] < 0)) {  // the first maximum, even of -inf
                    acc[op][oq] = v;
                    arg[op][oq] = pos;
                }
            } else if (ok) {
                acc[op][oq] += v;
            }
        }
    }
}

// The patch of an OP x OQ output block, row-major (the order that defines "first maximum"), fully
// unrolled so acc / arg stay in registers.  CHECK = 0: the caller proved it lies inside; 1: every
// element is bounds-checked; 2 (max without indices only): positions outside the staged rows
// [hlo, hhi) x [0, W) are clamped onto its edge -- no predicates, no selects.  Exact for max: a
// valid output whose window reaches past an edge also holds the edge element the clamp reads (pad <
// window, and the floor rule keeps every window's start inside), and repeating an element of the
// window does not change its maximum; the outputs of a block past P or Q are never stored.
template <int CHECK, typename T, int KH, int KW, int SH, int SW, int OP, int OQ, int MODE, bool IDX, typename Acc>
__device__ __forceinline__ void nchw_patch(const T* plane, int hs, int ws, int hlo, int hhi, int W,
                                           Acc (&acc)[OP][OQ], int (&arg)[OP][OQ]) {
    static_assert(CHECK != 2 || (MODE == 0 && !IDX), "clamping is exact for max without indices only");
    constexpr int PH = (OP - 1) * SH + KH, PW = (OQ - 1) * SW + KW;
#pragma unroll
    for (int ph = 0; ph < PH; ++ph) {
        const int h = CHECK == 2 ? min(max(hs + ph, hlo), hhi - 1) : hs + ph;
        const bool hok = CHECK != 1 || (h >= hlo && h < hhi);
#pragma unroll
        for (int pw = 0; pw < PW; ++pw) {
            const int w = CHECK == 2 ? min(max(ws + pw, 0), W - 1) : ws + pw;
            const bool ok = hok && (CHECK != 1 || (w >= 0 && w < W));
            const Acc v = ok ? pool_value<Acc>(plane[h * W + w]) : Acc(0);
            pool_fold<KH, KW, SH, SW, OP, OQ, MODE, IDX, Acc>(acc, arg, ph, pw, v, ok, h * W + w);
        }
    }
}

template <bool CHECK, typename T, int KH, int KW, int SH, int SW, int OP, int OQ, int MODE, bool IDX, int V>
__device__ __forceinline__ void chwn_patch(const T* xc, int hs, int ws, int H, int W, int N,
                                           float (&acc)[V][OP][OQ], int (&arg)[V][OP][OQ]) {
    constexpr int PH = (OP - 1) * SH + KH, PW = (OQ - 1) * SW + KW;
#pragma unroll
    for (int ph = 0; ph < PH; ++ph) {
        const int h = hs + ph;
        const bool hok = !CHECK || (h >= 0 && h < H);
#pragma unroll
        for (int pw = 0; pw < PW; ++pw) {
            const int w = ws + pw;
            const bool ok = hok && (!CHECK || (w >= 0 && w < W));
            Pack<T, V> pk;
            if (ok) pk.load(xc + ((long long)h * W + w) * N);
            else pk.raw = {};
#pragma unroll
            for (int k = 0; k < V; ++k)
                pool_fold<KH, KW, SH, SW, OP, OQ, MODE, IDX, float>(acc[k], arg[k], ph, pw, to_float(pk.e[k]), ok,
                                                                   h * W + w);
        }
    }
}

// cp.async (sm_80+): a 16-byte global -> shared copy that completes in the background, so a block
// can fetch its next chunk while it computes on the current one.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    unsigned long long g;
    asm("cvta.to.global.u64 %0, %1;" : "=l"(g) : "l"(src));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(g) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_one() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }

// One chunk of the NCHW forward: gn whole planes from plane g0 (bands == 1), or the input rows
// [hlo, hhi) of output rows [p0, p1) of plane g0.  Its input is x[start, start + count).
struct PoolChunk {
    long long g0, start;
    int gn, p0, p1, hlo, hhi, count;
};

template <int KH, int SH>
__device__ __forceinline__ PoolChunk pool_chunk(int c, int H, int W, int P, int padh, int G, int BP, int bands,
                                                int planes) {
    PoolChunk k;
    const int band = c % bands;
    k.g0 = (long long)(c / bands) * G;
    k.gn = (int)min((long long)G, planes - k.g0);
    k.p0 = band * BP;
    k.p1 = min(P, k.p0 + BP);
    k.hlo = bands == 1 ? 0 : max(0, k.p0 * SH - padh);
    k.hhi = bands == 1 ? H : min(H, (k.p1 - 1) * SH - padh + KH);
    k.start = k.g0 * H * W + (long long)k.hlo * W;
    k.count = k.gn * (k.hhi - k.hlo) * W;
    return k;
}

// Copies chunk k into buf so that sh[i] = x[start + i] with sh = buf + start % V: global and shared
// addresses are 16-byte aligned together whatever W is.  The aligned middle goes in V-element
// vectors -- cp.async when PIPE (it lands while the block computes), else loads issued U deep before
// the first store; the few elements before and after it travel as scalars through `edge`, a
// register that the caller stores once the chunk is due (edge_at says where; -1: none).
template <typename T, int V, int NT, bool PIPE>
__device__ __forceinline__ void pool_stage(const T* __restrict__ x, T* buf, const PoolChunk& k, T& edge,
                                           int& edge_at) {
    const int mis = (int)(k.start % V);
    T* sh = buf + mis;
    const T* src = x + k.start;
    const int head = min(k.count, (V - mis) % V);
    const int nv = (k.count - head) / V;
    const int tail = head + nv * V;
    edge_at = -1;
    if (threadIdx.x < head) edge_at = mis + threadIdx.x;
    else if (threadIdx.x < head + (k.count - tail)) edge_at = mis + tail + threadIdx.x - head;
    if (edge_at >= 0) edge = x[k.start + edge_at - mis];
    if constexpr (PIPE) {
        for (int j = threadIdx.x; j < nv; j += NT) cp_async16(sh + head + j * V, src + head + (long long)j * V);
    } else {
        constexpr int U = 16 / V > 4 ? 16 / V : 4;  // >= 64 bytes in flight per thread before the first store
        for (int j0 = threadIdx.x; j0 < nv; j0 += U * NT) {
            Pack<T, V> pk[U];
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (j0 + u * NT < nv) pk[u].load(src + head + (long long)(j0 + u * NT) * V);
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (j0 + u * NT < nv) pk[u].store(sh + head + (j0 + u * NT) * V);
        }
    }
}

// The pooling of one staged chunk: OP x OQ output blocks strided over the block's threads.
template <typename T, int KH, int KW, int SH, int SW, int OP, int OQ, int MODE, bool IDX, int NT>
__device__ __forceinline__ void pool_compute(const T* sh, const PoolChunk& k, T* __restrict__ y,
                                             int* __restrict__ idx, int H, int W, int P, int Q, int padh, int padw) {
    constexpr int PH = (OP - 1) * SH + KH, PW = (OQ - 1) * SW + KW;
    const int rows = k.hhi - k.hlo, hlo = k.hlo, hhi = k.hhi, p0 = k.p0, p1 = k.p1;
    const int mtp = (p1 - p0 + OP - 1) / OP, mtq = (Q + OQ - 1) / OQ;
    const int per_plane = mtp * mtq;
    // The chunk's first output: one 64-bit offset per block, then 32-bit offsets within the chunk (its
    // G * P * Q outputs), which cut the store epilogue's address arithmetic roughly in half.
    T* const yc = y + k.g0 * P * Q;
    int* const ic = IDX ? idx + k.g0 * P * Q : idx;
    // Output block t = (g, mp, mq) advances by NT per iteration: divide once, then step.
    int g = threadIdx.x / per_plane, mp = threadIdx.x % per_plane / mtq, mq = threadIdx.x % mtq;
    const int dg = NT / per_plane, dmp = NT % per_plane / mtq, dmq = NT % per_plane % mtq;
    for (; g < k.gn; mq += dmq, mp += dmp + (mq >= mtq), mq -= mq >= mtq ? mtq : 0, g += dg + (mp >= mtp),
                     mp -= mp >= mtp ? mtp : 0) {
        const int ps = p0 + mp * OP, qs = mq * OQ;
        const int hs = ps * SH - padh, ws = qs * SW - padw;
        const T* plane = sh + (g * rows - hlo) * W;  // row h of plane g at plane + h * W, h in [hlo, hhi)
        typedef typename Pick<sizeof(T) == 2 && MODE == 0 && !IDX, unsigned short, float>::type Acc;
        Acc acc[OP][OQ];
        int arg[OP][OQ];
#pragma unroll
        for (int op = 0; op < OP; ++op)
#pragma unroll
            for (int oq = 0; oq < OQ; ++oq) acc[op][oq] = pool_init<MODE, Acc>(), arg[op][oq] = -1;
        // The patch, row-major (the order that defines "first maximum"); fully unrolled, so
        // every pool_fold condition is a constant and acc / arg stay in registers.
        // A block past the edge (padding, or the last of a row of Q % OQ outputs) shares its warp with
        // interior ones: max without indices clamps (CHECK 2), nearly the interior path's cost, and takes
        // that path for the whole warp when any lane needs it -- one path per warp, not both in turn
        // (float16 PL6, 13 x 13 outputs in 1 x 3 blocks: a lane of every fifth block on the edge).
        bool inside = hs >= hlo && hs + PH <= hhi && ws >= 0 && ws + PW <= W;
        if constexpr (MODE == 0 && !IDX) inside = __all_sync(__activemask(), inside);
        if (inside)  // interior: no bounds checks
            nchw_patch<0, T, KH, KW, SH, SW, OP, OQ, MODE, IDX, Acc>(plane, hs, ws, hlo, hhi, W, acc, arg);
        else
            nchw_patch<MODE == 0 && !IDX ? 2 : 1, T, KH, KW, SH, SW, OP, OQ, MODE, IDX, Acc>(plane, hs, ws, hlo, hhi,
                                                                                           W, acc, arg);
        const int obase = (g * P + ps) * Q + qs;  // 32-bit, within the chunk's outputs
        T* const yo = yc + obase;
#pragma unroll
        for (int op = 0; op < OP; ++op)
#pragma unroll
            for (int oq = 0; oq < OQ; ++oq) {
                const int p = ps + op, q = qs + oq;
                if (p >= p1 || q >= Q) continue;
                if constexpr (sizeof(Acc) == 2) {
                    yo[op * Q + oq] = T{acc[op][oq]};
                } else {
                    float v = acc[op][oq];
                    if constexpr (MODE != 0) v /= pool_divisor<KH, KW, MODE>(p * SH - padh, q * SW - padw, H, W);
                    yo[op * Q + oq] = from_float<T>(v);
                }
                if constexpr (IDX) ic[obase + op * Q + oq] = arg[op][oq];
            }
    }
}

// PIPE: a block handles chunks [blockIdx.x * per, ...) one after another in two shared-memory
// buffers; the next chunk's cp.async copies are in flight while the block pools the current one.
// Otherwise one chunk per block (per is 1): stage, barrier, compute -- kept apart because the loop
// costs registers (31 -> 48 for float32 1x1: 5 blocks per SM instead of 8, measured 10-18% slower).
// ASYNC (without PIPE): the one chunk is staged with cp.async -- every 16-byte copy of it in flight at once and
// none through registers, where the register loads go U vectors deep per round trip (a chunk of more than
// U * NT vectors, e.g. 24 KiB of float16, takes several round trips).
template <typename T, int KH, int KW, int SH, int SW, int OP, int OQ, int MODE, bool IDX, int V, int NT, bool PIPE,
          bool ASYNC = false>
__global__ void __launch_bounds__(NT)
pool_nchw_fwd(const T* __restrict__ x, T* __restrict__ y, int* __restrict__ idx, int H, int W, int P, int Q,
              int padh, int padw, int G, int BP, int bands, int planes, int chunks, int per, int stage) {
    static_assert(!(PIPE || ASYNC) || V * sizeof(T) == 16, "cp.async copies 16-byte vectors");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* const buf0 = reinterpret_cast<T*>(smem_raw);
    T edge = T{};
    int edge_at;
    if constexpr (!PIPE) {  // one chunk per block (PER == 1): stage, barrier, compute
        const PoolChunk k = pool_chunk<KH, SH>(blockIdx.x, H, W, P, padh, G, BP, bands, planes);
        pool_stage<T, V, NT, ASYNC>(x, buf0, k, edge, edge_at);
        if constexpr (ASYNC) {
            cp_async_commit();
            asm volatile("cp.async.wait_group 0;" ::: "memory");
        }
        if (edge_at >= 0) buf0[edge_at] = edge;
        __syncthreads();
        pool_compute<T, KH, KW, SH, SW, OP, OQ, MODE, IDX, NT>(buf0 + (int)(k.start % V), k, y, idx, H, W, P, Q, padh,
                                                              padw);
        return;
    }
    const int c0 = blockIdx.x * per, c1 = min(chunks, c0 + per);
    PoolChunk k = pool_chunk<KH, SH>(c0, H, W, P, padh, G, BP, bands, planes);
    pool_stage<T, V, NT, PIPE>(x, buf0, k, edge, edge_at);
    cp_async_commit();
    for (int c = c0, b = 0; c < c1; ++c, b ^= 1) {
        T* const cur = buf0 + b * stage;
        T edge_cur = edge;
        const int edge_at_cur = edge_at;
        PoolChunk next;
        if (c + 1 < c1) {
            next = pool_chunk<KH, SH>(c + 1, H, W, P, padh, G, BP, bands, planes);
            pool_stage<T, V, NT, PIPE>(x, buf0 + (b ^ 1) * stage, next, edge, edge_at);
        }
        cp_async_commit();  // possibly empty: one group per iteration keeps wait_group 1 exact
        cp_async_wait_one();
        if (edge_at_cur >= 0) cur[edge_at_cur] = edge_cur;
        __syncthreads();
        pool_compute<T, KH, KW, SH, SW, OP, OQ, MODE, IDX, NT>(cur + (int)(k.start % V), k, y, idx, H, W, P, Q, padh,
                                                              padw);
        __syncthreads();  // everyone is done with cur before the iteration after next refills it
        k = next;
    }
}

template <typename T, int KH, int KW, int SH, int SW, int OP, int OQ, int MODE, bool IDX, int V, int NT>
__global__ void __launch_bounds__(NT)
pool_chwn_fwd(const T* __restrict__ x, T* __restrict__ y, int* __restrict__ idx, int C, int H, int W, int N, int P,
              int Q, int padh, int padw, int mtp, int mtq) {
    constexpr int PH = (OP - 1) * SH + KH, PW = (OQ - 1) * SW + KW;
    const int nv = N / V;
    const long long gid = (long long)blockIdx.x * NT + threadIdx.x;
    const int j = (int)(gid % nv);
    long long t = gid / nv;
    const int mq = (int)(t % mtq);
    t /= mtq;
    const int mp = (int)(t % mtp);
    const long long c = t / mtp;
    if (c >= C) return;  // no barrier in this kernel
    const int n0 = j * V, ps = mp * OP, qs = mq * OQ;
    const int hs = ps * SH - padh, ws = qs * SW - padw;
    const T* xc = x + c * H * W * (long long)N + n0;
    float acc[V][OP][OQ];
    int arg[V][OP][OQ];
#pragma unroll
    for (int k = 0; k < V; ++k)
#pragma unroll
        for (int op = 0; op < OP; ++op)
#pragma unroll
            for (int oq = 0; oq < OQ; ++oq) acc[k][op][oq] = pool_init<MODE, float>(), arg[k][op][oq] = -1;
    if (hs >= 0 && hs + PH <= H && ws >= 0 && ws + PW <= W)  // interior: no bounds checks
        chwn_patch<false, T, KH, KW, SH, SW, OP, OQ, MODE, IDX, V>(xc, hs, ws, H, W, N, acc, arg);
    else
        chwn_patch<true, T, KH, KW, SH, SW, OP, OQ, MODE, IDX, V>(xc, hs, ws, H, W, N, acc, arg);
#pragma unroll
    for (int op = 0; op < OP; ++op)
#pragma unroll
        for (int oq = 0; oq < OQ; ++oq) {
            const int p = ps + op, q = qs + oq;
            if (p >= P || q >= Q) continue;
            const float div = MODE == 0 ? 1.f : pool_divisor<KH, KW, MODE>(p * SH - padh, q * SW - padw, H, W);
            Pack<T, V> out;
#pragma unroll
            for (int k = 0; k < V; ++k) out.e[k] = from_float<T>(MODE == 0 ? acc[k][op][oq] : acc[k][op][oq] / div);
            const long long o = ((c * P + p) * Q + q) * N + n0;
            out.store(y + o);
            if constexpr (IDX) {
#pragma unroll
                for (int k = 0; k < V; ++k) idx[o + k] = arg[k][op][oq];
            }
        }
}

// ---------------------------------------------------------------------------------------------
// Backward.  SRC: 0 = argmax indices from the forward, 1 = recompute the argmax from x.
template <typename T, int KH, int KW, int SH, int SW, int MODE, int SRC, bool CHWN>
__global__ void __launch_bounds__(256)
pool_bwd(const T* __restrict__ dy, const int* __restrict__ idx, const T* __restrict__ x, T* __restrict__ dx,
         int total, int H, int W, int N, int P, int Q, int padh, int padw) {
    // 32-bit index arithmetic: pooling.py refuses tensors of 2**31 elements or more.
    const int e = blockIdx.x * 256 + threadIdx.x;
    if (e >= total) return;
    // NCHW: e = (plane, h, w); CHWN: e = (c, h, w, n).  ybase / xbase: offset of (p, q) = (0, 0).
    int h, w;
    long long ybase, xbase, ystep_q, xstep_w;
    if constexpr (CHWN) {
        const int n = e % N;
        int r = e / N;
        w = r % W;
        r /= W;
        h = r % H;
        const long long c = r / H;
        ybase = c * P * Q * (long long)N + n;
        xbase = c * H * W * (long long)N + n;
        ystep_q = N;
        xstep_w = N;
    } else {
        w = e % W;
        const int r = e / W;
        h = r % H;
        const long long plane = r / H;
        ybase = plane * P * Q;
        xbase = plane * H * W;
        ystep_q = 1;
        xstep_w = 1;
    }
    const int p_lo = h + padh < KH ? 0 : (h + padh - KH) / SH + 1, p_hi = min(P - 1, (h + padh) / SH);
    const int q_lo = w + padw < KW ? 0 : (w + padw - KW) / SW + 1, q_hi = min(Q - 1, (w + padw) / SW);
    const int me = h * W + w;
    float acc = 0.f;
    for (int p = p_lo; p <= p_hi; ++p) {
        for (int q = q_lo; q <= q_hi; ++q) {
            const long long yo = ybase + ((long long)p * Q + q) * ystep_q;
            const float g = to_float(dy[yo]);
            const int hs = p * SH - padh, ws = q * SW - padw;
            if constexpr (MODE != 0) {
                acc += g / pool_divisor<KH, KW, MODE>(hs, ws, H, W);
            } else if constexpr (SRC == 0) {
                if (idx[yo] == me) acc += g;
            } else {
                float best = neg_inf();
                int at = -1;
#pragma unroll
                for (int kh = 0; kh < KH; ++kh)
#pragma unroll
                    for (int kw = 0; kw < KW; ++kw) {
                        const int hh = hs + kh, ww = ws + kw;
                        if (hh < 0 || hh >= H || ww < 0 || ww >= W) continue;
                        const float v = to_float(x[xbase + ((long long)hh * W + ww) * xstep_w]);
                        if (v > best || at < 0) best = v, at = hh * W + ww;
                    }
                if (at == me) acc += g;
            }
        }
    }
    const long long xo = xbase + (long long)me * xstep_w;
    dx[xo] = from_float<T>(acc);
}

#ifdef UCUDNN_NVCC_CHECK
#define UCUDNN_POOL_NCHW(T, ...)                                                                                     \
    template __global__ void pool_nchw_fwd<T, __VA_ARGS__>(const T*, T*, int*, int, int, int, int, int, int, int, int, \
                                                           int, int, int, int, int);
UCUDNN_POOL_NCHW(float, 3, 3, 2, 2, 1, 1, 0, false, 4, 256, false)
UCUDNN_POOL_NCHW(float, 3, 3, 2, 2, 2, 2, 0, true, 4, 256, true)
UCUDNN_POOL_NCHW(half_t, 3, 3, 2, 2, 2, 2, 0, false, 8, 256, true)
UCUDNN_POOL_NCHW(half_t, 3, 3, 2, 2, 2, 2, 0, false, 8, 256, false)
UCUDNN_POOL_NCHW(half_t, 3, 3, 2, 2, 1, 1, 0, false, 8, 256, false)
UCUDNN_POOL_NCHW(half_t, 3, 3, 2, 2, 1, 3, 0, false, 8, 256, false)
UCUDNN_POOL_NCHW(float, 3, 3, 2, 2, 1, 3, 0, false, 4, 256, false)
UCUDNN_POOL_NCHW(half_t, 2, 2, 2, 2, 1, 2, 2, false, 8, 256, true)
UCUDNN_POOL_NCHW(half_t, 3, 3, 2, 2, 2, 1, 0, false, 8, 256, false, true)
UCUDNN_POOL_NCHW(float, 3, 3, 2, 2, 1, 1, 0, false, 4, 256, false, true)
template __global__ void pool_chwn_fwd<float, 3, 3, 2, 2, 2, 2, 0, false, 4, 256>(const float*, float*, int*, int, int,
                                                                                 int, int, int, int, int, int, int,
                                                                                 int);
template __global__ void pool_chwn_fwd<half_t, 3, 3, 2, 2, 1, 1, 1, true, 8, 256>(const half_t*, half_t*, int*, int,
                                                                                  int, int, int, int, int, int, int,
                                                                                  int, int);
template __global__ void pool_bwd<float, 3, 3, 2, 2, 0, 0, false>(const float*, const int*, const float*, float*,
                                                                 int, int, int, int, int, int, int, int);
template __global__ void pool_bwd<float, 3, 3, 2, 2, 0, 1, true>(const float*, const int*, const float*, float*,
                                                                int, int, int, int, int, int, int, int);
template __global__ void pool_bwd<half_t, 2, 2, 2, 2, 2, 0, false>(const half_t*, const int*, const half_t*, half_t*,
                                                                  int, int, int, int, int, int, int, int);
#endif
