// Direct convolution without workspace (seed 001), for the direct algorithm source (issue 17).
//
// Three seed kernels, each templated on the element type T (float, or half_t with float32 accumulation), the layout
// (NHWC false: x [N, C, H, W], w [K, C/G, R, S]; true: x [N, H, W, C], w [K, R, S, C/G]) and the tiling:
//
//   direct_fwd_single  one input channel per group (C/G == 1: grayscale or spectrogram first layers, depthwise):
//                      the seed's data split -- each block stages one tile of its input plane plus halo in shared
//                      memory once, with the taps of KT*KL of the group's filters, and applies them KT at a time
//                      (KL rounds); each thread holds RB output rows x KT filters in registers.  Many small
//                      blocks, all loading at once, hide the global-memory latency (the seed's "second method").
//   direct_fwd_multi   C/G > 1: stride-fixed blocks -- a block owns a fixed output tile and KT filters and walks
//                      the group's input channels CC at a time (CC contiguous channels: a 4*CC-byte segment per
//                      pixel in NHWC, the seed's 32/64-byte segments); the next CC channels' tile and taps are
//                      prefetched into the other of two shared-memory buffers while the current ones are used:
//                      by cp.async (ASYNC, sm_80+, float only) or through registers (PF elements per thread
//                      loaded before the compute, stored after it).
//   direct_bwd         backward data as a direct transposed convolution, gather form: each block owns a dx tile
//                      and CT of the group's dx channels and walks the group's dy channels CC at a time, with the
//                      same prefetching; dx pixel (h, w) sums dy[(h + PH - i) / SH, (w + PW - j) / SW] over the
//                      taps (i, j) whose quotient is exact (i from (h + PH) % SH in steps of SH).  No atomics:
//                      every dx element is written once by one thread, in a fixed order (deterministic).
//
// then the single-channel forward by rows of the whole batch (direct_plane; kernels/direct_plane.py), and, at the end
// of this file, the depthwise K x K (3, 5 or 7; 7 at stride 1) NCHW layer's own kernels (direct_dw*; kernels/direct_dw.py): lane groups
// walk bands of a plane with a K-row register window.
//
// out = alpha * conv + beta * out; out is not read when beta == 0.  Threads: NT = 256 as TX columns x TY rows;
// thread (tx, ty) owns column tx and rows ty + TY*rr (rr < RB) of the block's output tile (TY*RB x TX).
// Grid: (tiles of the output plane, groups x channel blocks, N).  Arithmetic is float32 FMA only.
// Shared memory is float, [channel][row][col] tiles then [channel][tap][KT] taps, sized by the launcher
// (kernels/direct.py for the seed kernels: the same index math, mirrored and tested on the CPU).
#include "common.cuh"

#define DIRECT_NT 256
#define DIRECT_PF 8
#define DIRECT_WIN 5   // the single-channel forward keeps its input window in registers for filters up to 5x5

__device__ __forceinline__ int floor_div(int a, int b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// Element (n, c, h, w) of an activation tensor in either layout.
template <bool NHWC>
__device__ __forceinline__ long long act_at(long long n, int c, int h, int w, int C, int H, int W) {
    return NHWC ? ((n * H + h) * W + w) * C + c : ((n * C + c) * H + h) * (long long)W + w;
}

// Element (k, c, i, j) of a filter tensor ([K, CG, R, S] or [K, R, S, CG]).
template <bool NHWC>
__device__ __forceinline__ long long filt_at(int k, int c, int i, int j, int CG, int R, int S) {
    return NHWC ? (((long long)k * R + i) * S + j) * CG + c : (((long long)k * CG + c) * R + i) * S + j;
}

// One stage: `count` elements; src(e, dst) names element e's global source (nullptr: zero) and its shared offset.
// DIRECT_PF elements per thread per round: their loads are all issued before the first lands in shared memory, so
// a thread keeps DIRECT_PF loads in flight instead of one (a block that stages a tile and computes little -- a
// depthwise or 1x1 single-channel forward -- is otherwise bound by one load's latency per element it stages).
template <typename T, typename Src>
__device__ __forceinline__ void stage_now(int count, const Src& src, float* buf) {
    for (int base = threadIdx.x; base < count; base += DIRECT_PF * DIRECT_NT) {
        float v[DIRECT_PF];
        int d[DIRECT_PF];
#pragma unroll
        for (int u = 0; u < DIRECT_PF; ++u) {
            const int e = base + u * DIRECT_NT;
            d[u] = -1;
            v[u] = 0.f;
            if (e < count) {
                const T* p = src(e, d[u]);
                if (p) v[u] = to_float(*p);
            }
        }
#pragma unroll
        for (int u = 0; u < DIRECT_PF; ++u)
            if (d[u] >= 0) buf[d[u]] = v[u];
    }
}

template <typename Src>
__device__ __forceinline__ void stage_async(int count, const Src& src, float* buf, const float* any) {
    for (int e = threadIdx.x; e < count; e += DIRECT_NT) {
        int d;
        const float* p = src(e, d);
        cp_async4(buf + d, p ? p : any, p ? 4 : 0);
    }
}

// Register prefetch: issue() loads the first PF*NT elements into registers (the rest go straight to shared
// memory), land() stores them once the buffer they go to is free.  Loads in flight while the block computes.
template <typename T> struct Prefetch {
    float v[DIRECT_PF];
    int d[DIRECT_PF];
    template <typename Src> __device__ __forceinline__ void issue(int count, const Src& src, float* buf) {
#pragma unroll
        for (int u = 0; u < DIRECT_PF; ++u) {
            const int e = threadIdx.x + u * DIRECT_NT;
            d[u] = -1;
            if (e < count) {
                const T* p = src(e, d[u]);
                v[u] = p ? to_float(*p) : 0.f;
            }
        }
        for (int e = threadIdx.x + DIRECT_PF * DIRECT_NT; e < count; e += DIRECT_NT) {
            int dd;
            const T* p = src(e, dd);
            buf[dd] = p ? to_float(*p) : 0.f;
        }
    }
    __device__ __forceinline__ void land(float* buf) const {
#pragma unroll
        for (int u = 0; u < DIRECT_PF; ++u)
            if (d[u] >= 0) buf[d[u]] = v[u];
    }
};

// Stages `count` elements of rows IW wide into buf: element e is row r0 + e / IW, column e % IW of the source, and
// with WRAP a row past IH - 1 is row 0 of the next image (load's first argument counts the images).  One division
// per thread, then each element DIRECT_NT further on is drow rows and dcol columns on, DIRECT_PF loads in flight per
// thread.  (A full index per element was about half the instructions of a depthwise block, whose compute is 9 FMAs
// per output.)  load(image, row, col) returns the element (zero in the padding).
template <bool WRAP, typename Load>
__device__ __forceinline__ void stage_rows(float* buf, int count, int IW, int r0, int IH, const Load& load) {
    const int drow = DIRECT_NT / IW, dcol = DIRECT_NT - drow * IW;
    int row = threadIdx.x / IW, col = threadIdx.x - row * IW, img = 0;
    row += r0;
    if constexpr (WRAP)
        while (row >= IH) {
            row -= IH;
            ++img;
        }
    for (int base = threadIdx.x; base < count; base += DIRECT_PF * DIRECT_NT) {
        float v[DIRECT_PF];
#pragma unroll
        for (int u = 0; u < DIRECT_PF; ++u) {
            v[u] = base + u * DIRECT_NT < count ? load(img, row, col) : 0.f;
            row += drow;
            col += dcol;
            if (col >= IW) {
                col -= IW;
                ++row;
            }
            if constexpr (WRAP)
                while (row >= IH) {
                    row -= IH;
                    ++img;
                }
        }
#pragma unroll
        for (int u = 0; u < DIRECT_PF; ++u)
            if (base + u * DIRECT_NT < count) buf[base + u * DIRECT_NT] = v[u];
    }
}

// The block's output tile: rows [p0, p0 + TY*RB), columns [q0, q0 + TX); tiles numbered row-major.
template <int TX, int RB>
__device__ __forceinline__ void tile_origin(int Q, int& p0, int& q0) {
    constexpr int TY = DIRECT_NT / TX;
    const int tq = (Q + TX - 1) / TX;
    p0 = (blockIdx.x / tq) * (TY * RB);
    q0 = (blockIdx.x % tq) * TX;
}

// A thread's register block: RB output rows x N channels, float32 sums.
template <int RB, int N>
__device__ __forceinline__ void zero_acc(float (&acc)[RB][N]) {
#pragma unroll
    for (int rr = 0; rr < RB; ++rr)
#pragma unroll
        for (int t = 0; t < N; ++t) acc[rr][t] = 0.f;
}

// Writes a thread's register block: rows row0 + rr*TY (those < H) of column col, channels base + c0 + t of the
// group (those with c0 + t < per_group) of an output [N, C, H, W] (or NHWC) tensor, out = alpha*acc + beta*out.
// The block's first element is addressed once and the others by channel / row strides, and beta is tested once:
// per element a store and an add, where a full index per element made the single-channel forward's epilogue about
// as many instructions as its FMAs (a 5x5 filter, 8 channels x 4 rows per thread).
template <bool BETA, int TY, int RB, int N, typename T>
__device__ __forceinline__ void store_rows(T* first, const float (&acc)[RB][N], long long cs, long long rs, int row0,
                                           int H, int nc, float alpha, float beta) {
#pragma unroll
    for (int rr = 0; rr < RB; ++rr) {
        if (row0 + rr * TY >= H) break;
        T* const row = first + rr * rs;
#pragma unroll
        for (int t = 0; t < N; ++t)
            if (t < nc) {
                const float v = alpha * acc[rr][t];
                row[t * cs] = from_float<T>(BETA ? fmaf(beta, to_float(row[t * cs]), v) : v);
            }
    }
}

template <bool NHWC, int TY, int RB, int N, typename T>
__device__ __forceinline__ void store_acc(T* out, const float (&acc)[RB][N], long long n, int base, int c0,
                                          int per_group, int row0, int col, int C, int H, int W, float alpha,
                                          float beta) {
    T* const first = out + act_at<NHWC>(n, base + c0, row0, col, C, H, W);
    const long long cs = NHWC ? 1 : (long long)H * W;
    const long long rs = (long long)TY * W * (NHWC ? C : 1);
    if (beta == 0.f) store_rows<false, TY>(first, acc, cs, rs, row0, H, per_group - c0, alpha, beta);
    else store_rows<true, TY>(first, acc, cs, rs, row0, H, per_group - c0, alpha, beta);
}

// KT consecutive filter values of one tap (shared memory, warp-uniform address): as float4 reads when KT is a
// multiple of 4 (the taps start 16-byte aligned and each block of KT starts at a multiple of KT).
template <int KT>
__device__ __forceinline__ void load_taps(const float* p, float (&wv)[KT]) {
    if constexpr (KT % 4 == 0) {
#pragma unroll
        for (int v = 0; v < KT / 4; ++v) {
            const float4 q4 = *reinterpret_cast<const float4*>(p + 4 * v);
            wv[4 * v] = q4.x;
            wv[4 * v + 1] = q4.y;
            wv[4 * v + 2] = q4.z;
            wv[4 * v + 3] = q4.w;
        }
    } else {
#pragma unroll
        for (int kt = 0; kt < KT; ++kt) wv[kt] = p[kt];
    }
}

// acc[rr][kt] += the R x S window from row rr of xw times the taps of filter kt: taps [R*S][KB] in shared memory
// from `taps` on (KT consecutive filters per tap, float4 broadcasts), the window in registers.
// A thread's input window: rows a < RB + R - 1 and columns j < S read from ``base`` (rows IW apart), zero past them,
// so window_taps can unroll over DIRECT_WIN x DIRECT_WIN whatever the filter.
template <int RB>
__device__ __forceinline__ void load_window(float (&xw)[RB + DIRECT_WIN - 1][DIRECT_WIN], const float* base, int IW,
                                            int R, int S) {
#pragma unroll
    for (int a = 0; a < RB + DIRECT_WIN - 1; ++a)
#pragma unroll
        for (int j = 0; j < DIRECT_WIN; ++j) xw[a][j] = (a < RB + R - 1 && j < S) ? base[a * IW + j] : 0.f;
}

template <int RB, int KT>
__device__ __forceinline__ void window_taps(float (&acc)[RB][KT], const float (&xw)[RB + DIRECT_WIN - 1][DIRECT_WIN],
                                            const float* taps, int KB, int R, int S) {
#pragma unroll
    for (int i = 0; i < DIRECT_WIN; ++i) {
        if (i >= R) break;
#pragma unroll
        for (int j = 0; j < DIRECT_WIN; ++j) {
            if (j >= S) break;
            float wv[KT];
            load_taps<KT>(taps + (i * S + j) * KB, wv);
#pragma unroll
            for (int rr = 0; rr < RB; ++rr)
#pragma unroll
                for (int kt = 0; kt < KT; ++kt) acc[rr][kt] = fmaf(xw[rr + i][j], wv[kt], acc[rr][kt]);
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Forward, one input channel per group (CG == 1).  Shared: tile [IH][IW], then (from the next multiple of 4 floats,
// so 16-byte aligned) taps [R*S][KT*KL].  grid.y = G * ceil(KG / (KT*KL)).  Stride 1 with filters up to
// DIRECT_WIN x DIRECT_WIN and KT >= 4: a thread owns RB consecutive output rows and holds its input window in
// registers, so a tap reads only its KT filter values (float4 broadcasts).  Otherwise (strides, larger filters, and
// KT < 4: depthwise layers, one filter per group, where the window's registers cost more occupancy than its reads
// save -- H200, MobileNet's 112x112 depthwise 3x3: 0.77 ms without, 0.87 ms with) a thread owns rows ty + rr*TY
// and reads one x per row and tap.
template <typename T, bool NHWC, int TX, int RB, int KT, int KL>
__global__ void __launch_bounds__(DIRECT_NT)
direct_fwd_single(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int C, int H, int W, int K,
                  int P, int Q, int R, int S, int PH, int PW, int SH, int SW, int KG, int IH, int IW, float alpha,
                  float beta) {
    constexpr int TY = DIRECT_NT / TX, KB = KT * KL;
    extern __shared__ __align__(16) float smem[];
    const int xcount = IH * IW, xpad = (xcount + 3) & ~3;
    float* const xs = smem;
    float* const ws = smem + xpad;
    const long long n = blockIdx.z;
    const int kblocks = (KG + KB - 1) / KB;
    const int g = blockIdx.y / kblocks, kb0 = (blockIdx.y % kblocks) * KB;  // channel g is the group's input
    int p0, q0;
    tile_origin<TX, RB>(Q, p0, q0);
    const int hb = p0 * SH - PH, wb = q0 * SW - PW, RS = R * S;
    {   // the tile
        const T* const xb = x + act_at<NHWC>(n, g, 0, 0, C, H, W);
        const long long rstr = (long long)W * (NHWC ? C : 1), cstr = NHWC ? C : 1;
        stage_rows<false>(xs, xcount, IW, 0, IH, [=](int, int row, int col) {
            const int h = hb + row, ww = wb + col;
            return h >= 0 && h < H && ww >= 0 && ww < W ? to_float(xb[h * rstr + ww * cstr]) : 0.f;
        });
    }
    auto wsrc = [&](int e, int& d) -> const T* {   // taps [R*S][KB] from the group's filters kb0 ..
        const int kk = e / RS, ij = e - kk * RS, k = kb0 + kk;
        d = ij * KB + kk;
        return k < KG ? w + (long long)(g * KG + k) * RS + ij : nullptr;  // CG == 1: both layouts agree
    };
    stage_now<T>(KB * RS, wsrc, ws);
    __syncthreads();
    const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;
    const int q = q0 + tx;
    if (KT >= 4 && SH == 1 && SW == 1 && R <= DIRECT_WIN && S <= DIRECT_WIN) {
        // Register window: the thread owns RB consecutive rows (ty*RB + rr), so its whole input footprint --
        // RB + R - 1 rows x S columns of the staged tile, the same for every filter -- is read from shared memory
        // once, into registers, and each tap then costs only its KT filter values (float4 broadcasts).
        float xw[RB + DIRECT_WIN - 1][DIRECT_WIN];
        load_window<RB>(xw, xs + ty * RB * IW + tx, IW, R, S);
#pragma unroll 1
        for (int kl = 0; kl < KL; ++kl) {
            const int k0 = kb0 + kl * KT;
            if (k0 >= KG) break;
            float acc[RB][KT];
            zero_acc(acc);
            window_taps<RB, KT>(acc, xw, ws + kl * KT, KB, R, S);
            if (q < Q) store_acc<NHWC, 1>(y, acc, n, g * KG, k0, KG, p0 + ty * RB, q, K, P, Q, alpha, beta);
        }
        return;
    }
#pragma unroll 1
    for (int kl = 0; kl < KL; ++kl) {
        const int k0 = kb0 + kl * KT;
        if (k0 >= KG) break;
        float acc[RB][KT];
        zero_acc(acc);
        for (int i = 0; i < R; ++i) {
            const float* xrow = xs + (ty * SH + i) * IW + tx * SW;
            const float* wt = ws + i * S * KB + kl * KT;
            for (int j = 0; j < S; ++j) {
                float wv[KT];
                load_taps<KT>(wt + j * KB, wv);
#pragma unroll
                for (int rr = 0; rr < RB; ++rr) {
                    const float xv = xrow[rr * TY * SH * IW + j];
#pragma unroll
                    for (int kt = 0; kt < KT; ++kt) acc[rr][kt] = fmaf(xv, wv[kt], acc[rr][kt]);
                }
            }
        }
        if (q < Q) store_acc<NHWC, TY>(y, acc, n, g * KG, k0, KG, p0 + ty, q, K, P, Q, alpha, beta);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Forward on single-channel planes by rows (C == 1, no groups, NCHW, stride 1, filters up to DIRECT_WIN x DIRECT_WIN):
// direct_plane.  Why: direct_fwd_single tiles each plane TX columns by TY*RB rows, so a 28 x 28 plane fills 77% of a
// 32 x 32 tile (idle lanes, idle rows), and its epilogue bounds-tests every element.  Here a thread is one slot of
// (n, row group, column) numbered over the whole batch -- a row group is RB consecutive output rows of one column --
// so a warp's lanes run on across row groups and images and only the last block has idle ones.  A block stages the
// zero-padded input rows its slots' windows cover (the padded planes, IH = PG*RB + R - 1 rows of IW = Q + S - 1
// columns each, taken as one column of rows: from its first slot's row group to its last slot's window, at most
// ROWS of them) and the taps of KT*KL filters times alpha (so the epilogue stores sums as they are: exact for
// alpha == 1); each thread reads its window into registers once and applies KT filters at a time, KL rounds, and
// stores without per-element tests where its rows and filters are all there.  Shared: rows [ROWS][IW], then (from
// the next multiple of 4 floats) taps [R*S][KT*KL].  grid = (ceil(N*PG*Q / 256), ceil(K / (KT*KL))).
template <typename T, int RB, int KT, int KL>
__global__ void __launch_bounds__(DIRECT_NT)
direct_plane(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int N, int H, int W, int K, int P,
             int Q, int R, int S, int PH, int PW, int PG, int IH, int IW, int ROWS, float alpha, float beta) {
    constexpr int KB = KT * KL, WIN = DIRECT_WIN;
    static_assert(KT % 4 == 0, "the taps are read as float4");
    extern __shared__ __align__(16) float smem[];
    float* const xs = smem;
    float* const ws = smem + ((ROWS * IW + 3) & ~3);
    const int PGQ = PG * Q;
    const long long slot0 = (long long)blockIdx.x * DIRECT_NT, total = (long long)N * PGQ;
    const int kb0 = blockIdx.y * KB, RS = R * S;
    // the padded planes as one column of rows (image n's row r is row n*IH + r): rows vlo .. vhi
    long long vlo, vhi;
    {
        const long long last = min(slot0 + DIRECT_NT, total) - 1;
        const long long na = slot0 / PGQ, nb = last / PGQ;
        vlo = na * IH + (slot0 - na * PGQ) / Q * RB;
        vhi = nb * IH + (last - nb * PGQ) / Q * RB + RB + R - 2;
    }
    const int n0 = (int)(vlo / IH), r0 = (int)(vlo - (long long)n0 * IH);
    stage_rows<true>(xs, (int)(vhi - vlo + 1) * IW, IW, r0, IH, [=](int dn, int row, int col) {
        const int h = row - PH, ww = col - PW;
        return h >= 0 && h < H && ww >= 0 && ww < W ? to_float(x[((long long)(n0 + dn) * H + h) * W + ww]) : 0.f;
    });
    auto wsrc = [&](int e, int& d) -> const T* {   // taps [R*S][KB] of filters kb0 ..
        const int kk = e / RS, ij = e - kk * RS, k = kb0 + kk;
        d = ij * KB + kk;
        return k < K ? w + (long long)k * RS + ij : nullptr;
    };
    stage_now<T>(KB * RS, wsrc, ws);
    __syncthreads();
    if (alpha != 1.f) {   // uniform: alpha folded into the taps
        for (int e = threadIdx.x; e < KB * RS; e += DIRECT_NT) ws[e] *= alpha;
        __syncthreads();
    }
    const long long slot = slot0 + threadIdx.x;
    const bool live = slot < total;
    int n = n0, pg = r0 / RB, q = 0;
    if (live) {
        n = (int)(slot / PGQ);
        const int rem = (int)(slot - (long long)n * PGQ);
        pg = rem / Q;
        q = rem - pg * Q;
    }
    float xw[RB + WIN - 1][WIN];
    load_window<RB>(xw, xs + (int)((long long)n * IH + pg * RB - vlo) * IW + q, IW, R, S);
    const int p0 = pg * RB;
    const long long PQ = (long long)P * Q;
    T* const yb = y + ((long long)n * K + kb0) * PQ + (long long)p0 * Q + q;
    const bool all_rows = p0 + RB <= P;
#pragma unroll 1
    for (int kl = 0; kl < KL; ++kl) {
        const int k0 = kb0 + kl * KT;
        if (k0 >= K) break;
        float acc[RB][KT];
        zero_acc(acc);
        window_taps<RB, KT>(acc, xw, ws + kl * KT, KB, R, S);
        if (!live) continue;
        T* const first = yb + (long long)kl * KT * PQ;
        if (all_rows && k0 + KT <= K) {   // the common case: no bounds per element
            if (beta == 0.f) store_rows<false, 1>(first, acc, PQ, (long long)Q, 0, RB, KT, 1.f, beta);
            else store_rows<true, 1>(first, acc, PQ, (long long)Q, 0, RB, KT, 1.f, beta);
        } else if (beta == 0.f) {
            store_rows<false, 1>(first, acc, PQ, (long long)Q, p0, P, K - k0, 1.f, beta);
        } else {
            store_rows<true, 1>(first, acc, PQ, (long long)Q, p0, P, K - k0, 1.f, beta);
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The multi-channel loop shared by the forward (A = x, B = y, channels walked: the group's CG inputs, KT output
// channels per block) and the backward data (A = dy, B = dx, walked: the group's KG dy channels, CT = KT dx channels
// per block).  One stage: the walked channels [c0, c0 + CC) of the A tile [CC][AH][AW] (rows from ah0, columns
// from aw0, zero outside A) and their taps [CC][R*S][KT].
template <typename T, bool NHWC, int KT, int CC, bool BWD>
struct MultiStage {
    const T* a;
    const T* w;
    long long n;
    int CA, HA, WA;      // A's channels, height, width
    int g, walked, owned, own0;  // group, channels walked (CG or KG), channels owned per group (KG or CG), first owned
    int CG, R, S, AH, AW, ah0, aw0;
    int c0;              // first walked channel of this stage (within the group)
    __device__ __forceinline__ int acount() const { return CC * AH * AW; }
    __device__ __forceinline__ int count() const { return acount() + CC * R * S * KT; }
    __device__ __forceinline__ const T* operator()(int e, int& d) const {
        const int ac = acount(), RS = R * S;
        if (e < ac) {
            int cc, row, col;
            if (NHWC) {      // channel fastest: CC contiguous channels per pixel
                cc = e % CC;
                const int pix = e / CC;
                row = pix / AW;
                col = pix - row * AW;
            } else {         // column fastest
                const int plane = AH * AW;
                cc = e / plane;
                const int rem = e - cc * plane;
                row = rem / AW;
                col = rem - row * AW;
            }
            d = (cc * AH + row) * AW + col;
            const int c = c0 + cc, h = ah0 + row, ww = aw0 + col;
            if (c >= walked || h < 0 || h >= HA || ww < 0 || ww >= WA) return nullptr;
            return a + act_at<NHWC>(n, g * walked + c, h, ww, CA, HA, WA);
        }
        e -= ac;
        int kt, cc, ij;
        if (NHWC) {          // [k][i][j][c]: the filters' channel index fastest
            if (BWD) {       // walked = k (dy channel), owned = c: c fastest -> kt fastest
                cc = e / (RS * KT);
                const int rem = e - cc * RS * KT;
                ij = rem / KT;
                kt = rem - ij * KT;
            } else {         // walked = c: cc fastest
                kt = e / (RS * CC);
                const int rem = e - kt * RS * CC;
                ij = rem / CC;
                cc = rem - ij * CC;
            }
        } else {             // [k][c][i][j]: taps fastest
            if (BWD) {
                cc = e / (KT * RS);
                const int rem = e - cc * KT * RS;
                kt = rem / RS;
                ij = rem - kt * RS;
            } else {
                kt = e / (CC * RS);
                const int rem = e - kt * CC * RS;
                cc = rem / RS;
                ij = rem - cc * RS;
            }
        }
        d = ac + (cc * RS + ij) * KT + kt;
        const int c = c0 + cc, o = own0 + kt;
        if (c >= walked || o >= owned) return nullptr;
        const int i = ij / S, j = ij - i * S;
        // forward: filter (k = owned, c = walked); backward: (k = walked, c = owned)
        return BWD ? w + filt_at<NHWC>(g * walked + c, o, i, j, CG, R, S)
                   : w + filt_at<NHWC>(g * owned + o, c, i, j, CG, R, S);
    }
};

// Walks the stages with two buffers, calling compute(buf) on each once it has landed.
template <typename T, bool NHWC, int KT, int CC, bool BWD, bool ASYNC, typename Compute>
__device__ __forceinline__ void walk_stages(MultiStage<T, NHWC, KT, CC, BWD> st, float* smem, int stage_floats,
                                            const Compute& compute) {
    const int stages = (st.walked + CC - 1) / CC, count = st.count();
    auto buf = [&](int s) { return smem + (s & 1) * stage_floats; };  // no local array: no stack frame
    if constexpr (ASYNC) {
        stage_async(count, st, buf(0), st.w);
        cp_async_commit4();
        for (int s = 0; s < stages; ++s) {
            if (s + 1 < stages) {
                MultiStage<T, NHWC, KT, CC, BWD> nx = st;
                nx.c0 = (s + 1) * CC;
                stage_async(count, nx, buf(s + 1), st.w);
                cp_async_commit4();
                cp_async_wait4<1>();
            } else {
                cp_async_wait4<0>();
            }
            __syncthreads();
            compute(buf(s));
            __syncthreads();
        }
    } else {
        stage_now<T>(count, st, buf(0));
        __syncthreads();
        for (int s = 0; s < stages; ++s) {
            Prefetch<T> pf;
            MultiStage<T, NHWC, KT, CC, BWD> nx = st;
            nx.c0 = (s + 1) * CC;
            const bool more = s + 1 < stages;
            if (more) pf.issue(count, nx, buf(s + 1));
            compute(buf(s));
            if (more) pf.land(buf(s + 1));
            __syncthreads();
        }
    }
}

// Forward, CG > 1 channels per group.  grid.y = G * ceil(KG / KT).
template <typename T, bool NHWC, int TX, int RB, int KT, int CC, bool ASYNC>
__global__ void __launch_bounds__(DIRECT_NT)
direct_fwd_multi(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int C, int H, int W, int K,
                 int P, int Q, int R, int S, int PH, int PW, int SH, int SW, int G, int IH, int IW, float alpha,
                 float beta) {
    static_assert(!ASYNC || sizeof(T) == 4, "cp.async stages 4-byte elements");
    constexpr int TY = DIRECT_NT / TX;
    extern __shared__ __align__(16) float smem[];
    const int CG = C / G, KG = K / G, kblocks = (KG + KT - 1) / KT;
    const int g = blockIdx.y / kblocks, k0 = (blockIdx.y % kblocks) * KT;
    int p0, q0;
    tile_origin<TX, RB>(Q, p0, q0);
    MultiStage<T, NHWC, KT, CC, false> st{x, w, (long long)blockIdx.z, C, H, W, g, CG, KG, k0, CG, R, S, IH, IW,
                                          p0 * SH - PH, q0 * SW - PW, 0};
    const int stage_floats = st.count();
    const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;
    float acc[RB][KT];
    zero_acc(acc);
    const int RS = R * S, xplane = IH * IW;
    // The (i, j) tap loop below is the single-channel kernel's.  Factored into a __forceinline__ helper it compiled
    // to the same FFMA and LDS but different address arithmetic (nvcc 13, SASS compared), so both write it out.
    auto compute = [&](const float* buf) {
        const float* wsm = buf + CC * xplane;
#pragma unroll
        for (int cc = 0; cc < CC; ++cc) {
            for (int i = 0; i < R; ++i) {
                const float* xrow = buf + cc * xplane + (ty * SH + i) * IW + tx * SW;
                const float* wt = wsm + (cc * RS + i * S) * KT;
                for (int j = 0; j < S; ++j) {
                    float wv[KT];
#pragma unroll
                    for (int kt = 0; kt < KT; ++kt) wv[kt] = wt[j * KT + kt];
#pragma unroll
                    for (int rr = 0; rr < RB; ++rr) {
                        const float xv = xrow[rr * TY * SH * IW + j];
#pragma unroll
                        for (int kt = 0; kt < KT; ++kt) acc[rr][kt] = fmaf(xv, wv[kt], acc[rr][kt]);
                    }
                }
            }
        }
    };
    walk_stages<T, NHWC, KT, CC, false, ASYNC>(st, smem, stage_floats, compute);
    const int q = q0 + tx;
    if (q < Q) store_acc<NHWC, TY>(y, acc, blockIdx.z, g * KG, k0, KG, p0 + ty, q, K, P, Q, alpha, beta);
}

// Backward data: dx = alpha * conv_transpose(dy, w) + beta * dx.  The dy tile of a dx tile at (h0, w0) starts at
// row ceil((h0 + PH - R + 1) / SH) and column ceil((w0 + PW - S + 1) / SW); DH x DW as the launcher sizes it.
// grid.x walks dx tiles (H x W), grid.y = G * ceil(CG / CT).
template <typename T, bool NHWC, int TX, int RB, int CT, int CC, bool ASYNC>
__global__ void __launch_bounds__(DIRECT_NT)
direct_bwd(const T* __restrict__ w, const T* __restrict__ dy, T* __restrict__ dx, int C, int H, int W, int K, int P,
           int Q, int R, int S, int PH, int PW, int SH, int SW, int G, int DH, int DW, float alpha, float beta) {
    static_assert(!ASYNC || sizeof(T) == 4, "cp.async stages 4-byte elements");
    constexpr int TY = DIRECT_NT / TX;
    extern __shared__ __align__(16) float smem[];
    const int CG = C / G, KG = K / G, cblocks = (CG + CT - 1) / CT;
    const int g = blockIdx.y / cblocks, c0 = (blockIdx.y % cblocks) * CT;
    int h0, w0;
    tile_origin<TX, RB>(W, h0, w0);
    const int plo = -floor_div(R - 1 - h0 - PH, SH), qlo = -floor_div(S - 1 - w0 - PW, SW);  // ceil divisions
    MultiStage<T, NHWC, CT, CC, true> st{dy, w, (long long)blockIdx.z, K, P, Q, g, KG, CG, c0, CG, R, S, DH, DW,
                                         plo, qlo, 0};
    const int stage_floats = st.count();
    const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;
    const int wcol = w0 + tx;
    float acc[RB][CT];
    zero_acc(acc);
    const int RS = R * S, dplane = DH * DW;
    const int j0 = (wcol + PW) % SW;
    auto compute = [&](const float* buf) {
        const float* wsm = buf + CC * dplane;
#pragma unroll
        for (int rr = 0; rr < RB; ++rr) {
            const int h = h0 + ty + rr * TY;
            for (int i = (h + PH) % SH; i < R; i += SH) {
                const int prow = (h + PH - i) / SH - plo;
                for (int j = j0; j < S; j += SW) {
                    const int pcol = (wcol + PW - j) / SW - qlo;
#pragma unroll
                    for (int cc = 0; cc < CC; ++cc) {
                        const float dv = buf[(cc * DH + prow) * DW + pcol];
                        const float* wt = wsm + (cc * RS + i * S + j) * CT;
#pragma unroll
                        for (int ct = 0; ct < CT; ++ct) acc[rr][ct] = fmaf(dv, wt[ct], acc[rr][ct]);
                    }
                }
            }
        }
    };
    walk_stages<T, NHWC, CT, CC, true, ASYNC>(st, smem, stage_floats, compute);
    if (wcol < W) store_acc<NHWC, TY>(dx, acc, blockIdx.z, g * CG, c0, CG, h0 + ty, wcol, C, H, W, alpha, beta);
}

// ---------------------------------------------------------------------------------------------------------------
// Depthwise K x K (K = 3, 5 or 7), stride 1, padding K / 2, one filter per channel (C = K = G), NCHW (direct_dw).  Why
// its own kernel: such a layer moves x and y once and does K*K FMAs per output, so it is bound by memory bandwidth,
// and a block that stages a tile in shared memory for one filter's taps (direct_fwd_single at KT = 1) spends its
// time waiting on the tile it stages: H200, MobileNet's 112x112 first depthwise layer, b256, 0.67 ms against a
// 0.19 ms copy floor.  A group of WIDTH lanes (a power of two: 4 * WIDTH columns cover the row, or 128 columns of
// it at WIDTH = 32) walks down a band of RW rows of one (sample, channel) plane, 4 columns per lane, with a sliding
// window of K input rows in registers: each input row is loaded once (16-byte loads where rows are 16-byte
// aligned, VEC), the K / 2 columns on either side come from the adjacent lanes by shuffles (from global memory
// only at the group's edges), and each output row is stored once.  The next row is loaded before the current one
// is computed, so a group keeps loads in flight.  Narrow planes put 32 / WIDTH groups in a warp (14x14: 8 planes a
// warp, where one plane a warp left 28 of its 32 lanes idle).  Every group of a warp runs RW iterations, so the
// shuffles always see all 32 lanes; rows past the plane and groups past the last work item compute zeros and
// store nothing.  ROT rotates the taps by 180 degrees: backward data of the same layer (dx = correlation of dy
// with the rotated filter, the same padding, channel c from channel c).  Work items: N*C planes x bands x
// segments, 32 / WIDTH of them a warp, 8 warps a block.
template <int K>
struct DwRow {
    float v[K + 3];   // columns col - K/2 .. col + 3 + K/2 of one input row (zeros outside the plane: the padding)
};

template <typename T, bool VEC>
__device__ __forceinline__ void dw_load(const T* __restrict__ plane, int row, int H, int W, int col, float4& raw) {
    raw = make_float4(0.f, 0.f, 0.f, 0.f);
    if (row < 0 || row >= H) return;
    const T* p = plane + (long long)row * W + col;
    if (VEC) {
        if (col < W) raw = *reinterpret_cast<const float4*>(p);
    } else {
        if (col < W) raw.x = to_float(p[0]);
        if (col + 1 < W) raw.y = to_float(p[1]);
        if (col + 2 < W) raw.z = to_float(p[2]);
        if (col + 3 < W) raw.w = to_float(p[3]);
    }
}

// The window row of a loaded row: the lane's 4 values and K / 2 neighbour columns on either side (shuffles within
// the group of `width` lanes; at the group's first and last lane they are read from the plane, or are padding).
template <typename T, int K>
__device__ __forceinline__ DwRow<K> dw_row(const T* __restrict__ plane, int row, int H, int W, int col, int sub,
                                           int width, const float4& raw) {
    constexpr int HK = K / 2;
    static_assert(HK >= 1 && HK <= 3, "3x3, 5x5 or 7x7: the K / 2 neighbour columns come from one adjacent lane");
    DwRow<K> r;
    const float own[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) r.v[HK + j] = own[j];
    const bool inrow = row >= 0 && row < H;
    const T* const rp = plane + (long long)row * W;
#pragma unroll
    for (int d = 1; d <= HK; ++d) {
        // column col - d: the previous lane's column 4 - d; column col + 3 + d: the next lane's column d - 1
        float l = __shfl_up_sync(0xffffffffu, own[4 - d], 1, width);
        float rr = __shfl_down_sync(0xffffffffu, own[d - 1], 1, width);
        if (sub == 0) l = (inrow && col >= d && col - d < W) ? to_float(rp[col - d]) : 0.f;
        if (sub == width - 1) rr = (inrow && col + 3 + d < W) ? to_float(rp[col + 3 + d]) : 0.f;
        r.v[HK - d] = l;
        r.v[HK + 3 + d] = rr;
    }
    return r;
}

// A work item's coordinates: the group's plane, band and first column; `active` false for a group past the last
// item (it walks the last item's plane and stores nothing).
struct DwItem {
    long long plane;
    int c, col, p0, sub;
    bool active;
};

__device__ __forceinline__ bool dw_item(int C, int bands, int segs, int width, int RW, long long items, DwItem& at) {
    const int lane = threadIdx.x & 31, groups = 32 / width;
    const long long first = ((long long)blockIdx.x * (DIRECT_NT / 32) + threadIdx.x / 32) * groups;
    if (first >= items) return false;   // whole warps only: the shuffles see all 32 lanes
    const long long item = first + lane / width;
    at.active = item < items;
    const long long it = at.active ? item : items - 1;
    const int seg = (int)(it % segs);
    const long long rest = it / segs;
    at.p0 = (int)(rest % bands) * RW;
    at.plane = rest / bands;                              // n * C + c
    at.c = (int)(at.plane % C);
    at.sub = lane & (width - 1);
    at.col = seg * 4 * width + at.sub * 4;
    return true;
}

// A lane's 4 outputs at columns col .. col + 3 of a row (those < W): out = alpha * o + beta * out (out not read when
// beta == 0), one 16-byte store where rows are 16-byte aligned (VEC).
template <typename T, bool VEC>
__device__ __forceinline__ void dw_store(T* __restrict__ out, const float (&o)[4], int col, int W, float alpha,
                                         float beta) {
    if (VEC) {
        float4 v = make_float4(alpha * o[0], alpha * o[1], alpha * o[2], alpha * o[3]);
        if (beta != 0.f) {
            const float4 old = *reinterpret_cast<const float4*>(out);
            v.x += beta * old.x; v.y += beta * old.y; v.z += beta * old.z; v.w += beta * old.w;
        }
        *reinterpret_cast<float4*>(out) = v;
    } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
            if (col + j < W) {
                float v = alpha * o[j];
                if (beta != 0.f) v += beta * to_float(out[j]);
                out[j] = from_float<T>(v);
            }
    }
}

template <typename T, int K, bool ROT, bool VEC, int MINB>
__global__ void __launch_bounds__(DIRECT_NT, MINB)   // MINB blocks an SM at least: registers against loads in flight
direct_dw(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int C, int H, int W, int RW,
          int bands, int segs, int width, long long items, float alpha, float beta) {
    static_assert(!VEC || sizeof(T) == 4, "16-byte rows are float rows");
    constexpr int HK = K / 2, KK = K * K;
    DwItem at;
    if (!dw_item(C, bands, segs, width, RW, items, at)) return;
    const T* const xp = x + at.plane * H * (long long)W;
    T* const yp = y + at.plane * H * (long long)W;
    const int col = at.col, sub = at.sub, p0 = at.p0;
    float f[KK];
#pragma unroll
    for (int i = 0; i < KK; ++i) f[i] = to_float(w[at.c * KK + (ROT ? KK - 1 - i : i)]);
    const bool stores = at.active && col < W;
    DwRow<K> win[K];   // rows p - HK .. p + HK while row p is computed
    float4 raw[K];     // the first K rows' loads, all issued before the first is used
#pragma unroll
    for (int i = 0; i < K; ++i) dw_load<T, VEC>(xp, p0 - HK + i, H, W, col, raw[i]);
#pragma unroll
    for (int i = 0; i < K - 1; ++i) win[i + 1] = dw_row<T, K>(xp, p0 - HK + i, H, W, col, sub, width, raw[i]);
    float4 pending = raw[K - 1];
    for (int p = p0; p < p0 + RW; ++p) {
        float4 next;
        dw_load<T, VEC>(xp, p + HK + 1, H, W, col, next);   // in flight while row p is computed
#pragma unroll
        for (int i = 0; i < K - 1; ++i) win[i] = win[i + 1];
        win[K - 1] = dw_row<T, K>(xp, p + HK, H, W, col, sub, width, pending);
        float o[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            float s = 0.f;
#pragma unroll
            for (int i = 0; i < K; ++i)
#pragma unroll
                for (int t = 0; t < K; ++t) s = fmaf(f[i * K + t], win[i].v[j + t], s);
            o[j] = s;
        }
        if (stores && p < H) dw_store<T, VEC>(yp + (long long)p * W + col, o, col, W, alpha, beta);
        pending = next;
    }
}

// Backward filter of the same layer: dw[c][i][j] = alpha * sum over (n, p, q) of dy[n][c][p][q] *
// x[n][c][p + i - K/2][q + j - K/2] + beta * dw.  The work items and the window of x are the forward's; a lane also
// loads its 4 columns of dy row p and keeps K*K sums, which its group adds up by shuffles at the end; the group's
// first lane then adds alpha times them to dw atomically (one add per tap and work item: 256 x 9 per channel for
// MobileNet's 112x112 layer at b256), after direct_dw_scale has set dw = beta * dw on the same stream.  No
// workspace; the atomics' order varies, so the sums are not bitwise reproducible (the source offers this
// configuration only to numerics that allow that).
template <typename T>
__global__ void __launch_bounds__(DIRECT_NT) direct_dw_scale(T* __restrict__ dw, int count, float beta) {
    const int i = blockIdx.x * DIRECT_NT + threadIdx.x;
    if (i < count) dw[i] = from_float<T>(beta == 0.f ? 0.f : beta * to_float(dw[i]));
}

// A backward-filter group's end: its lanes' KK sums added up by shuffles within the group of `width` lanes, then
// alpha times them added to the channel's taps `dw` by the group's first lane (`adds`), atomically.
template <int KK>
__device__ __forceinline__ void dw_add_sums(float (&acc)[KK], float* __restrict__ dw, int width, bool adds,
                                            float alpha) {
#pragma unroll
    for (int k = 0; k < KK; ++k)
        for (int off = width / 2; off > 0; off /= 2) acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], off, width);
    if (adds)
#pragma unroll
        for (int k = 0; k < KK; ++k) atomicAdd(dw + k, alpha * acc[k]);
}

template <typename T, int K, bool VEC, int MINB>
__global__ void __launch_bounds__(DIRECT_NT, MINB)
direct_dw_bwf(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dw, int C, int H, int W, int RW,
              int bands, int segs, int width, long long items, float alpha) {
    static_assert(sizeof(T) == 4, "dw is summed by float atomics");
    constexpr int HK = K / 2, KK = K * K;
    DwItem at;
    if (!dw_item(C, bands, segs, width, RW, items, at)) return;
    const T* const xp = x + at.plane * H * (long long)W;
    const T* const dyp = dy + at.plane * H * (long long)W;
    const int col = at.col, sub = at.sub, p0 = at.p0;
    float acc[KK];
#pragma unroll
    for (int k = 0; k < KK; ++k) acc[k] = 0.f;
    DwRow<K> win[K];
    float4 raw[K], g;  // the first K rows of x and dy's first row, all issued before the first is used
#pragma unroll
    for (int i = 0; i < K; ++i) dw_load<T, VEC>(xp, p0 - HK + i, H, W, col, raw[i]);
    dw_load<T, VEC>(dyp, p0, H, W, col, g);
#pragma unroll
    for (int i = 0; i < K - 1; ++i) win[i + 1] = dw_row<T, K>(xp, p0 - HK + i, H, W, col, sub, width, raw[i]);
    float4 pending = raw[K - 1];
    for (int p = p0; p < p0 + RW; ++p) {
        float4 next, gnext;
        dw_load<T, VEC>(xp, p + HK + 1, H, W, col, next);   // in flight while row p is summed
        dw_load<T, VEC>(dyp, p + 1, H, W, col, gnext);
#pragma unroll
        for (int i = 0; i < K - 1; ++i) win[i] = win[i + 1];
        win[K - 1] = dw_row<T, K>(xp, p + HK, H, W, col, sub, width, pending);
        if (p < H) {   // rows past the plane read zeros anyway; idle groups add nothing below
            const float d[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int i = 0; i < K; ++i)
#pragma unroll
                    for (int t = 0; t < K; ++t) acc[i * K + t] = fmaf(d[j], win[i].v[j + t], acc[i * K + t]);
        }
        pending = next;
        g = gnext;
    }
    dw_add_sums(acc, reinterpret_cast<float*>(dw) + at.c * KK, width, at.active && sub == 0, alpha);
}

// Backward data of the depthwise K x K layer at stride 2 (padding K / 2), gather form, no atomics: dx[h][w] sums
// w[i][t] * dy[(h + K/2 - i) / 2][(w + K/2 - t) / 2] over the taps whose quotients are exact.  Why: cuDNN runs it
// far from the bandwidth floor (H200, MobileNet V2's 112x112 stride-2 layer at b128: 1.96 ms against 0.18).  A lane
// group walks a band of dx row pairs (2m, 2m + 1) of one plane, 4 dx columns a lane; both rows of a pair read dy rows
// m - K/2 + 1 .. m + 1 only, so a window of K/2 + 1 dy rows slides one row per pair; a lane loads its 2 dy columns
// of a row (w0 / 2, w0 / 2 + 1) and takes the next lane's first (and for 5x5 the previous lane's last) by shuffles.
// Which taps meet which window entries follows from the parities, all known at compile time.
template <typename T, int K, bool VEC, int MINB>
__global__ void __launch_bounds__(DIRECT_NT, MINB)
direct_dw_s2_bwd(const T* __restrict__ w, const T* __restrict__ dy, T* __restrict__ dx, int C, int H, int W, int P,
                 int Q, int RW, int bands, int segs, int width, long long items, float alpha, float beta) {
    static_assert(!VEC || sizeof(T) == 4, "16-byte rows are float rows");
    constexpr int HK = K / 2, KK = K * K, NR = HK + 1, NC = HK + 2;   // dy rows and columns of a lane's window
    DwItem at;
    if (!dw_item(C, bands, segs, width, RW, items, at)) return;
    const T* const dyp = dy + at.plane * P * (long long)Q;
    T* const dxp = dx + at.plane * H * (long long)W;
    const int w0 = at.col, sub = at.sub, m0 = at.p0, u = w0 / 2;   // u, u + 1: the lane's own dy columns
    float f[KK];
#pragma unroll
    for (int i = 0; i < KK; ++i) f[i] = to_float(w[at.c * KK + i]);
    const bool stores = at.active && w0 < W;
    // one dy row's window entries: columns u - (HK - 1) .. u + 2
    auto load = [&](int r, float2& raw) {
        raw = make_float2(0.f, 0.f);
        if (r < 0 || r >= P) return;
        const T* rp = dyp + (long long)r * Q;
        if (u < Q) raw.x = to_float(rp[u]);
        if (u + 1 < Q) raw.y = to_float(rp[u + 1]);
    };
    auto row = [&](int r, const float2& raw, float (&v)[NC]) {
        float next0 = __shfl_down_sync(0xffffffffu, raw.x, 1, width);   // column u + 2
        float prev1 = __shfl_up_sync(0xffffffffu, raw.y, 1, width);     // column u - 1
        const bool inrow = r >= 0 && r < P;
        const T* rp = dyp + (long long)r * Q;
        if (sub == width - 1) next0 = (inrow && u + 2 < Q) ? to_float(rp[u + 2]) : 0.f;
        if (sub == 0) prev1 = (inrow && u >= 1 && u - 1 < Q) ? to_float(rp[u - 1]) : 0.f;
        if (HK == 2) {
            v[0] = prev1; v[1] = raw.x; v[2] = raw.y; v[3] = next0;
        } else {
            v[0] = raw.x; v[1] = raw.y; v[2] = next0;
        }
    };
    float win[NR][NC];   // dy rows m - HK + 1 .. m + 1 while pair m is computed
    float2 raw[NR];
#pragma unroll
    for (int k = 0; k < NR; ++k) load(m0 - HK + 1 + k, raw[k]);
#pragma unroll
    for (int k = 0; k < NR - 1; ++k) row(m0 - HK + 1 + k, raw[k], win[k + 1]);
    float2 pending = raw[NR - 1];
    for (int m = m0; m < m0 + RW; ++m) {
        float2 next;
        load(m + 2, next);                                       // in flight while pair m is computed
#pragma unroll
        for (int k = 0; k < NR - 1; ++k)
#pragma unroll
            for (int c = 0; c < NC; ++c) win[k][c] = win[k + 1][c];
        row(m + 1, pending, win[NR - 1]);
#pragma unroll
        for (int a = 0; a < 2; ++a) {
            const int h = 2 * m + a;
            float o[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                float s = 0.f;
#pragma unroll
                for (int i = 0; i < K; ++i) {
                    if ((a + HK - i) % 2 != 0) continue;
                    const int ro = (a + HK - i) / 2 + HK - 1;     // window row of dy row m + (a + HK - i) / 2
#pragma unroll
                    for (int t = 0; t < K; ++t) {
                        if ((j + HK - t) % 2 != 0) continue;
                        s = fmaf(f[i * K + t], win[ro][(j + HK - t) / 2 + HK - 1], s);
                    }
                }
                o[j] = s;
            }
            if (stores && h < H) dw_store<T, VEC>(dxp + (long long)h * W + w0, o, w0, W, alpha, beta);
        }
        pending = next;
    }
}

// Backward filter of the depthwise K x K layer at stride 2 (padding K / 2): dw[c][i][t] = alpha * sum over (n, p, q)
// of dy[n][c][p][q] * x[n][c][2p + i - K/2][2q + t - K/2] + beta * dw, by atomics as direct_dw_bwf.  Why: cuDNN's
// zero-workspace algorithm is 3x its workspace one (H200, MobileNet V2's 112x112 stride-2 layer at b128: 2.09 ms
// against 0.65 ms with a large workspace).  A lane group walks a band of dy rows of one plane, 4 dy columns a lane;
// each dy row meets K rows of x, two of them new for the next dy row; a lane loads its 8 x columns (2q0 .. 2q0 + 7)
// of a row and takes the K/2 columns before them from the previous lane (and for 5x5 the one after them from the
// next) by shuffles.
template <typename T, int K, bool VEC, int MINB>
__global__ void __launch_bounds__(DIRECT_NT, MINB)
direct_dw_s2_bwf(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dw, int C, int H, int W, int P,
                 int Q, int RW, int bands, int segs, int width, long long items, float alpha) {
    static_assert(sizeof(T) == 4, "dw is summed by float atomics");
    constexpr int HK = K / 2, KK = K * K, NV = 7 + 2 * HK;   // x columns 2q0 - HK .. 2q0 + 6 + HK
    DwItem at;
    if (!dw_item(C, bands, segs, width, RW, items, at)) return;
    const T* const xp = x + at.plane * H * (long long)W;
    const T* const dyp = dy + at.plane * P * (long long)Q;
    const int q0 = at.col, sub = at.sub, p0 = at.p0, c0 = 2 * q0;
    auto load = [&](int r, float4& lo, float4& hi) {
        lo = make_float4(0.f, 0.f, 0.f, 0.f);
        hi = lo;
        if (r < 0 || r >= H) return;
        const T* rp = xp + (long long)r * W + c0;
        if (VEC) {
            if (c0 < W) lo = *reinterpret_cast<const float4*>(rp);
            if (c0 + 4 < W) hi = *reinterpret_cast<const float4*>(rp + 4);
        } else {
            float v[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] = c0 + j < W ? to_float(rp[j]) : 0.f;
            lo = make_float4(v[0], v[1], v[2], v[3]);
            hi = make_float4(v[4], v[5], v[6], v[7]);
        }
    };
    auto row = [&](int r, const float4& lo, const float4& hi, float (&v)[NV]) {
        float l1 = __shfl_up_sync(0xffffffffu, hi.w, 1, width);      // column c0 - 1
        float l2 = __shfl_up_sync(0xffffffffu, hi.z, 1, width);      // column c0 - 2
        float r0 = __shfl_down_sync(0xffffffffu, lo.x, 1, width);    // column c0 + 8
        const bool inrow = r >= 0 && r < H;
        const T* rp = xp + (long long)r * W;
        if (sub == 0) {
            l1 = (inrow && c0 >= 1 && c0 - 1 < W) ? to_float(rp[c0 - 1]) : 0.f;
            l2 = (inrow && c0 >= 2 && c0 - 2 < W) ? to_float(rp[c0 - 2]) : 0.f;
        }
        if (sub == width - 1) r0 = (inrow && c0 + 8 < W) ? to_float(rp[c0 + 8]) : 0.f;
        if (HK == 2) v[0] = l2;
        v[HK - 1] = l1;
        v[HK] = lo.x; v[HK + 1] = lo.y; v[HK + 2] = lo.z; v[HK + 3] = lo.w;
        v[HK + 4] = hi.x; v[HK + 5] = hi.y; v[HK + 6] = hi.z; v[HK + 7] = hi.w;
        if (HK == 2) v[HK + 8] = r0;
    };
    float acc[KK];
#pragma unroll
    for (int k = 0; k < KK; ++k) acc[k] = 0.f;
    float win[K][NV];   // x rows 2p - HK .. 2p + HK while dy row p is summed
    float4 lo[K], hi[K];
#pragma unroll
    for (int i = 0; i < K; ++i) load(2 * p0 - HK + i, lo[i], hi[i]);
#pragma unroll
    for (int i = 0; i < K; ++i) row(2 * p0 - HK + i, lo[i], hi[i], win[i]);
    for (int p = p0; p < p0 + RW; ++p) {
        float4 nlo[2], nhi[2];   // the next dy row's two new x rows: in flight while row p is summed
        load(2 * p + 2 + HK - 1, nlo[0], nhi[0]);
        load(2 * p + 2 + HK, nlo[1], nhi[1]);
        if (p < P) {
            const T* const dr = dyp + (long long)p * Q;
            float d[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) d[j] = q0 + j < Q ? to_float(dr[q0 + j]) : 0.f;
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int i = 0; i < K; ++i)
#pragma unroll
                    for (int t = 0; t < K; ++t) acc[i * K + t] = fmaf(d[j], win[i][2 * j + t], acc[i * K + t]);
        }
#pragma unroll
        for (int i = 0; i < K - 2; ++i)
#pragma unroll
            for (int c = 0; c < NV; ++c) win[i][c] = win[i + 2][c];
        row(2 * p + 2 + HK - 1, nlo[0], nhi[0], win[K - 2]);
        row(2 * p + 2 + HK, nlo[1], nhi[1], win[K - 1]);
    }
    dw_add_sums(acc, reinterpret_cast<float*>(dw) + at.c * KK, width, at.active && sub == 0, alpha);
}

// ---------------------------------------------------------------------------------------------------------------
// Depthwise K x K (3, 5 or 7), stride 1, padding K / 2, one filter per channel, NHWC (direct_dw_nhwc*).  Why: a
// model whose depthwise layers see channels-last activations -- autocast with channels_last (MobileNet, EfficientNet),
// and ConvNeXt in any precision (its blocks permute to NHWC for LayerNorm and Linear and back, so its 7x7 depthwise
// layers get channels-last strides) -- reaches cuDNN's NHWC depthwise kernels, whose backward filter in float32 is
// slow (H200, ConvNeXt-tiny b64 FP32: cuDNN's depthwise backward filters, and their NHWC -> NCHW transposes, are 64
// of the 127 ms of a training step, in PyTorch and in ucudnn alike).  In NHWC the channels are contiguous, so a
// thread takes 4 channels (one 16-byte load of float, 8-byte of half, where the rows are aligned: VEC) and the
// block a tile of TH rows x TW columns of one sample for 4 * CQ channels: the input tile with its K / 2 halo, (TH + K - 1) x (TW + K - 1)
// positions, is staged once in shared memory ([row][column][quad] float4, channels innermost: conflict-free), and
// the taps as [i * K + j][quad].  Forward (and backward data: ROT, the taps rotated by 180 degrees, dy -> dx): a
// thread computes CPT adjacent columns of one row for its 4 channels, reading each tile row's CPT + K - 1 values
// once per tap row (K * CPT * 4 FMAs per K + CPT + K - 1 shared loads).  Threads: CQ quads (fastest) x TWT column
// groups x TH rows.
// 4 half_t in one 8-byte word, as loaded and stored together
struct __align__(8) half4_t {
    half_t v[4];
};

template <typename T, bool VEC>
__device__ __forceinline__ float4 nhwc_load4(const T* __restrict__ p, int c, int C) {
    if (VEC) {
        if constexpr (sizeof(T) == 4) {
            return *reinterpret_cast<const float4*>(p);
        } else {   // half: one 8-byte load
            const half4_t h = *reinterpret_cast<const half4_t*>(p);
            return make_float4(to_float(h.v[0]), to_float(h.v[1]), to_float(h.v[2]), to_float(h.v[3]));
        }
    }
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (c < C) v.x = to_float(p[0]);
    if (c + 1 < C) v.y = to_float(p[1]);
    if (c + 2 < C) v.z = to_float(p[2]);
    if (c + 3 < C) v.w = to_float(p[3]);
    return v;
}

__device__ __forceinline__ void fma4(float4& acc, const float4& a, const float4& b) {
    acc.x = fmaf(a.x, b.x, acc.x); acc.y = fmaf(a.y, b.y, acc.y);
    acc.z = fmaf(a.z, b.z, acc.z); acc.w = fmaf(a.w, b.w, acc.w);
}

// The block's tile of one NHWC plane set, with its halo, into shared memory: [row][column][quad], zeros outside the
// plane and past C.  Rows h0 - HK .. h0 - HK + SR - 1, columns w0 - HK .. w0 - HK + SC - 1.
template <typename T, bool VEC, int CQ>
__device__ __forceinline__ void nhwc_stage(float4* __restrict__ tile, const T* __restrict__ plane, int SR, int SC,
                                           int h0, int w0, int c0, int C, int H, int W) {
    for (int e = threadIdx.x; e < SR * SC * CQ; e += blockDim.x) {
        const int q = e % CQ, rc = e / CQ, col = rc % SC, row = rc / SC;
        const int h = h0 + row, w = w0 + col, c = c0 + 4 * q;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (h >= 0 && h < H && w >= 0 && w < W && c < C)
            v = nhwc_load4<T, VEC>(plane + ((long long)h * W + w) * C + c, c, C);
        tile[e] = v;
    }
}

template <typename T, int K, bool ROT, bool VEC, int TH, int TWT, int CPT, int CQ>
__global__ void __launch_bounds__(CQ * TWT * TH)
direct_dw_nhwc(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int C, int H, int W,
               int tiles_w, int tiles_hw, float alpha, float beta) {
    constexpr int HK = K / 2, KK = K * K, TW = TWT * CPT, SR = TH + K - 1, SC = TW + K - 1;
    extern __shared__ float4 dw_smem[];
    float4* const tile = dw_smem;                 // [SR][SC][CQ]
    float4* const taps = dw_smem + SR * SC * CQ;  // [KK][CQ]
    const int tq = threadIdx.x % CQ, pos = threadIdx.x / CQ, g = pos % TWT, r = pos / TWT;
    const int n = blockIdx.x / tiles_hw, t = blockIdx.x % tiles_hw;
    const int h0 = (t / tiles_w) * TH, w0 = (t % tiles_w) * TW, c0 = blockIdx.y * 4 * CQ;
    for (int e = threadIdx.x; e < KK * CQ; e += blockDim.x) {
        const int q = e % CQ, ij = e / CQ, src = ROT ? KK - 1 - ij : ij;
        float v[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int c = c0 + 4 * q + k;
            v[k] = c < C ? to_float(w[(long long)c * KK + src]) : 0.f;
        }
        taps[e] = make_float4(v[0], v[1], v[2], v[3]);
    }
    const long long plane = (long long)n * H * W * C;
    nhwc_stage<T, VEC, CQ>(tile, x + plane, SR, SC, h0 - HK, w0 - HK, c0, C, H, W);
    __syncthreads();
    float4 acc[CPT];
#pragma unroll
    for (int u = 0; u < CPT; ++u) acc[u] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int i = 0; i < K; ++i) {
        float4 f[K];
#pragma unroll
        for (int j = 0; j < K; ++j) f[j] = taps[(i * K + j) * CQ + tq];
        const float4* const row = tile + ((r + i) * SC + g * CPT) * CQ + tq;
#pragma unroll
        for (int u = 0; u < CPT + K - 1; ++u) {
            const float4 xv = row[u * CQ];
#pragma unroll
            for (int o = 0; o < CPT; ++o)
                if (u - o >= 0 && u - o < K) fma4(acc[o], f[u - o], xv);
        }
    }
    const int h = h0 + r, c = c0 + 4 * tq;
    if (h >= H || c >= C) return;
#pragma unroll
    for (int o = 0; o < CPT; ++o) {
        const int col = w0 + g * CPT + o;
        if (col >= W) break;
        T* const out = y + plane + ((long long)h * W + col) * C + c;
        float4 v = make_float4(alpha * acc[o].x, alpha * acc[o].y, alpha * acc[o].z, alpha * acc[o].w);
        if (VEC) {
            if (beta != 0.f) {
                const float4 old = nhwc_load4<T, true>(out, c, C);
                v.x += beta * old.x; v.y += beta * old.y; v.z += beta * old.z; v.w += beta * old.w;
            }
            if constexpr (sizeof(T) == 4) {
                *reinterpret_cast<float4*>(out) = v;
            } else {
                half4_t h;
                h.v[0] = from_float<T>(v.x); h.v[1] = from_float<T>(v.y);
                h.v[2] = from_float<T>(v.z); h.v[3] = from_float<T>(v.w);
                *reinterpret_cast<half4_t*>(out) = h;
            }
        } else {
            const float vs[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int k = 0; k < 4; ++k)
                if (c + k < C) out[k] = from_float<T>(beta != 0.f ? vs[k] + beta * to_float(out[k]) : vs[k]);
        }
    }
}

// Backward filter of the same NHWC layer: dw[c][i][j] = alpha * sum over (n, h, w) of dy[n][h][w][c] *
// x[n][h + i - K/2][w + j - K/2][c], added to dw (set to beta * dw first by direct_dw_scale) by float atomics; for
// float16 data into a float workspace set to zero first, which direct_dw_finish then writes to dw with its beta.
// A block walks tiles of TH x TW dy positions (its share of all samples' tiles, for 4 * CQ channels), staging the x
// tile with its halo and the dy tile; thread (quad, tap row i, dy row r) slides along the tile's columns with a K-wide
// window of x row r + i in registers: K * 4 FMAs per dy value and 2 shared loads.  At the end the TH rows' sums meet
// in shared memory and one thread per (quad, i) adds K * 4 sums to dw atomically (not bitwise reproducible).
template <typename T, int K, bool VEC, int TH, int TW, int CQ>
__global__ void __launch_bounds__(CQ * K * TH)
direct_dw_nhwc_bwf(const T* __restrict__ x, const T* __restrict__ dy, float* __restrict__ dw, int C, int H, int W,
                   int tiles_w, int tiles_hw, long long tiles, float alpha) {
    constexpr int HK = K / 2, KK = K * K, SR = TH + K - 1, SC = TW + K - 1;
    extern __shared__ float4 dw_smem[];
    float4* const xt = dw_smem;                  // [SR][SC][CQ]
    float4* const gt = dw_smem + SR * SC * CQ;   // [TH][TW][CQ]
    const int tq = threadIdx.x % CQ, pos = threadIdx.x / CQ, i = pos % K, r = pos / K;
    const int c0 = blockIdx.y * 4 * CQ;
    float4 acc[K];
#pragma unroll
    for (int j = 0; j < K; ++j) acc[j] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (long long tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const long long n = tile / tiles_hw;
        const int t = (int)(tile % tiles_hw), h0 = (t / tiles_w) * TH, w0 = (t % tiles_w) * TW;
        const long long plane = n * H * W * C;
        __syncthreads();   // the previous tile's readers are done
        nhwc_stage<T, VEC, CQ>(xt, x + plane, SR, SC, h0 - HK, w0 - HK, c0, C, H, W);
        nhwc_stage<T, VEC, CQ>(gt, dy + plane, TH, TW, h0, w0, c0, C, H, W);
        __syncthreads();
        const float4* const xr = xt + (r + i) * SC * CQ + tq;
        const float4* const gr = gt + r * TW * CQ + tq;
        float4 win[K];
#pragma unroll
        for (int j = 0; j < K - 1; ++j) win[j + 1] = xr[j * CQ];
#pragma unroll 4
        for (int col = 0; col < TW; ++col) {
#pragma unroll
            for (int j = 0; j < K - 1; ++j) win[j] = win[j + 1];
            win[K - 1] = xr[(col + K - 1) * CQ];
            const float4 d = gr[col * CQ];
#pragma unroll
            for (int j = 0; j < K; ++j) fma4(acc[j], d, win[j]);
        }
    }
    __syncthreads();
    float4* const red = dw_smem;   // [TH][K][K][CQ]: the rows' sums
#pragma unroll
    for (int j = 0; j < K; ++j) red[((r * K + i) * K + j) * CQ + tq] = acc[j];
    __syncthreads();
    if (r != 0) return;
#pragma unroll
    for (int j = 0; j < K; ++j) {
        float4 s = red[(i * K + j) * CQ + tq];
        for (int rr = 1; rr < TH; ++rr) {
            const float4 v = red[((rr * K + i) * K + j) * CQ + tq];
            s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
        }
        const float vs[4] = {s.x, s.y, s.z, s.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int c = c0 + 4 * tq + k;
            if (c < C) atomicAdd(dw + (long long)c * KK + i * K + j, alpha * vs[k]);
        }
    }
}

// The float16 NHWC backward filter's end: dw = sums + beta * dw, the sums (alpha applied) from the float workspace
// its atomics added into.
template <typename T>
__global__ void __launch_bounds__(DIRECT_NT) direct_dw_finish(const float* __restrict__ sums, T* __restrict__ dw,
                                                              int count, float beta) {
    const int i = blockIdx.x * DIRECT_NT + threadIdx.x;
    if (i < count) dw[i] = from_float<T>(beta == 0.f ? sums[i] : sums[i] + beta * to_float(dw[i]));
}

#ifdef UCUDNN_NVCC_CHECK
#define DIRECT_FWD_ARGS(T) const T*, const T*, T*, int, int, int, int, int, int, int, int, int, int, int, int, int, \
    int, int, float, float
template __global__ void direct_fwd_single<float, false, 32, 2, 4, 4>(DIRECT_FWD_ARGS(float));
template __global__ void direct_fwd_single<float, false, 32, 4, 8, 2>(DIRECT_FWD_ARGS(float));
template __global__ void direct_fwd_single<float, true, 16, 2, 2, 4>(DIRECT_FWD_ARGS(float));
template __global__ void direct_fwd_single<half_t, true, 16, 4, 8, 2>(DIRECT_FWD_ARGS(half_t));
template __global__ void direct_fwd_multi<float, false, 32, 2, 4, 4, true>(DIRECT_FWD_ARGS(float));
template __global__ void direct_fwd_multi<float, true, 16, 2, 8, 8, false>(DIRECT_FWD_ARGS(float));
template __global__ void direct_fwd_multi<half_t, true, 32, 4, 4, 2, false>(DIRECT_FWD_ARGS(half_t));
template __global__ void direct_bwd<float, false, 32, 2, 4, 4, true>(DIRECT_FWD_ARGS(float));
template __global__ void direct_bwd<float, false, 32, 4, 1, 8, false>(DIRECT_FWD_ARGS(float));
template __global__ void direct_bwd<half_t, true, 8, 2, 4, 2, false>(DIRECT_FWD_ARGS(half_t));
#define DIRECT_PLANE_ARGS(T) const T*, const T*, T*, int, int, int, int, int, int, int, int, int, int, int, int, \
    int, int, float, float
template __global__ void direct_plane<float, 4, 8, 4>(DIRECT_PLANE_ARGS(float));
template __global__ void direct_plane<float, 2, 8, 16>(DIRECT_PLANE_ARGS(float));
template __global__ void direct_plane<float, 1, 4, 1>(DIRECT_PLANE_ARGS(float));
template __global__ void direct_plane<half_t, 4, 8, 4>(DIRECT_PLANE_ARGS(half_t));
#define DIRECT_DW_ARGS(T) const T*, const T*, T*, int, int, int, int, int, int, int, long long, float, float
#define DIRECT_DW_BWF_ARGS const float*, const float*, float*, int, int, int, int, int, int, int, long long, float
template __global__ void direct_dw<float, 3, false, true, 1>(DIRECT_DW_ARGS(float));
template __global__ void direct_dw<float, 3, false, true, 5>(DIRECT_DW_ARGS(float));
template __global__ void direct_dw<float, 3, true, false, 1>(DIRECT_DW_ARGS(float));
template __global__ void direct_dw<half_t, 3, false, false, 1>(DIRECT_DW_ARGS(half_t));
template __global__ void direct_dw<float, 5, false, true, 1>(DIRECT_DW_ARGS(float));
template __global__ void direct_dw<float, 5, true, false, 5>(DIRECT_DW_ARGS(float));
template __global__ void direct_dw<float, 7, false, true, 1>(DIRECT_DW_ARGS(float));
template __global__ void direct_dw<float, 7, true, false, 1>(DIRECT_DW_ARGS(float));
template __global__ void direct_dw<half_t, 7, false, false, 1>(DIRECT_DW_ARGS(half_t));
template __global__ void direct_dw_scale<float>(float*, int, float);
#define DIRECT_DW_S2_ARGS(T) const T*, const T*, T*, int, int, int, int, int, int, int, int, int, long long, float, float
template __global__ void direct_dw_s2_bwd<float, 3, true, 1>(DIRECT_DW_S2_ARGS(float));
template __global__ void direct_dw_s2_bwd<float, 5, false, 1>(DIRECT_DW_S2_ARGS(float));
template __global__ void direct_dw_s2_bwd<half_t, 3, false, 1>(DIRECT_DW_S2_ARGS(half_t));
#define DIRECT_DW_S2_BWF_ARGS const float*, const float*, float*, int, int, int, int, int, int, int, int, int, long long, \
    float
template __global__ void direct_dw_s2_bwf<float, 3, true, 1>(DIRECT_DW_S2_BWF_ARGS);
template __global__ void direct_dw_s2_bwf<float, 5, false, 1>(DIRECT_DW_S2_BWF_ARGS);
template __global__ void direct_dw_bwf<float, 3, true, 1>(DIRECT_DW_BWF_ARGS);
template __global__ void direct_dw_bwf<float, 3, false, 5>(DIRECT_DW_BWF_ARGS);
template __global__ void direct_dw_bwf<float, 5, true, 1>(DIRECT_DW_BWF_ARGS);
template __global__ void direct_dw_bwf<float, 7, true, 1>(DIRECT_DW_BWF_ARGS);
template __global__ void direct_dw_bwf<float, 7, false, 1>(DIRECT_DW_BWF_ARGS);
#define DIRECT_DW_NHWC_ARGS(T) const T*, const T*, T*, int, int, int, int, int, float, float
template __global__ void direct_dw_nhwc<float, 7, false, true, 8, 4, 2, 8>(DIRECT_DW_NHWC_ARGS(float));
template __global__ void direct_dw_nhwc<float, 7, true, false, 4, 4, 4, 8>(DIRECT_DW_NHWC_ARGS(float));
template __global__ void direct_dw_nhwc<float, 3, false, true, 8, 4, 2, 8>(DIRECT_DW_NHWC_ARGS(float));
template __global__ void direct_dw_nhwc<half_t, 5, true, false, 4, 4, 4, 8>(DIRECT_DW_NHWC_ARGS(half_t));
template __global__ void direct_dw_nhwc<half_t, 7, false, true, 8, 4, 2, 8>(DIRECT_DW_NHWC_ARGS(half_t));
#define DIRECT_DW_NHWC_BWF_ARGS const float*, const float*, float*, int, int, int, int, int, long long, float
template __global__ void direct_dw_nhwc_bwf<float, 7, true, 4, 16, 8>(DIRECT_DW_NHWC_BWF_ARGS);
template __global__ void direct_dw_nhwc_bwf<float, 7, false, 8, 8, 4>(DIRECT_DW_NHWC_BWF_ARGS);
template __global__ void direct_dw_nhwc_bwf<float, 3, true, 4, 16, 8>(DIRECT_DW_NHWC_BWF_ARGS);
template __global__ void direct_dw_nhwc_bwf<half_t, 7, true, 4, 16, 8>(const half_t*, const half_t*, float*, int, int,
                                                                         int, int, int, long long, float);
template __global__ void direct_dw_finish<half_t>(const float*, half_t*, int, float);
#endif
