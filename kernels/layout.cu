// 4-D layout transformation (NCHW / CHWN / NHWC, any pair) as one tiled transpose.
//
// Every pair reduces (layout.py) to   x[P][A][M][D]  ->  y[P][D][M][A]:
// H and W stay adjacent in all three layouts, so they merge into one
// dimension and each transformation swaps two (merged) dimensions A and D,
// with P a batch in front and M a dimension left in the middle (seed
// paper 000, section IV.C: "flatten to 2-D, then transpose tiles").
//
// A block moves one TA x TM x TD tile through shared memory.  Reads walk the
// tile in x's order (d fastest), writes in y's order (a fastest), so both
// sides are coalesced; VI / VO elements travel per global access (16-byte
// LDG/STG where the shape allows).  A small dimension (C = 3) is taken whole
// (TA == A or TD == D): then a tile's rows are contiguous in memory on that
// side and accesses stay coalesced although the dimension is tiny.  SD is the
// padded shared-memory row length, chosen in layout.py against bank conflicts.
// The kernel moves raw bits: T is an unsigned integer of the element's size.
#include "common.cuh"

template <typename T, int TA, int TM, int TD, int VI, int VO, int SD, int NT, bool FI, bool FO>
__global__ void __launch_bounds__(NT)
layout_transpose(const T* __restrict__ x, T* __restrict__ y, int A, int M, int D, int tiles_a, int tiles_m,
                 int tiles_d) {
    // Vectors run along d (loads) and a (stores) -- or, with FI / FO, along the tile's flattened
    // order on that side, which is contiguous in memory when the small dimension is taken whole
    // (TD == D / TA == A): then C = 3 still moves 16 bytes per access.  layout.py guarantees that
    // no vector crosses a jump in addresses and that every vector is aligned; a vector cut by the
    // tensor's edge falls back to single elements.
    static_assert(FI || TD % VI == 0, "vectors must not straddle tile rows");
    static_assert(FO || TA % VO == 0, "vectors must not straddle tile rows");
    constexpr int TILE = TA * TM * TD;
    constexpr int NVI = (TILE + VI - 1) / VI;
    constexpr int NVO = (TILE + VO - 1) / VO;
    constexpr int IT_IN = (NVI + NT - 1) / NT;
    constexpr int IT_OUT = (NVO + NT - 1) / NT;
    __shared__ T sh[TA * TM * SD];

    unsigned int b = blockIdx.x;
    const int td = b % tiles_d;
    b /= tiles_d;
    const int ta = b % tiles_a;
    b /= tiles_a;
    const int tm = b % tiles_m;
    const long long p = b / tiles_m;
    const int a0 = ta * TA, m0 = tm * TM, d0 = td * TD;
    const int ra = min(TA, A - a0), rm = min(TM, M - m0), rd = min(TD, D - d0);
    const long long x_a = (long long)M * D;  // x strides: a -> M*D, m -> D, d -> 1
    const long long y_d = (long long)M * A;  // y strides: d -> M*A, m -> A, a -> 1
    const T* xb = x + ((p * A + a0) * M + m0) * (long long)D + d0;
    T* yb = y + ((p * D + d0) * M + m0) * (long long)A + a0;

    // Issue every load of the tile before the first shared-memory store:
    // IT_IN independent accesses per thread in flight.
    Pack<T, VI> in[IT_IN];
#pragma unroll
    for (int i = 0; i < IT_IN; ++i) {
        const int v = i * NT + threadIdx.x;
        const int e = v * VI;
        const int a = e / (TM * TD), m = (e / TD) % TM, d = e % TD;
        in[i].raw = {};
        if constexpr (!FI) {
            if ((NVI % NT == 0 || v < NVI) && a < ra && m < rm && d < rd) in[i].load(xb + a * x_a + (long long)m * D + d);
        } else if (v < NVI) {
            bool all = e + VI <= TILE;
#pragma unroll
            for (int k = 0; k < VI; ++k) {
                const int f = e + k, ak = f / (TM * TD), mk = (f / TD) % TM, dk = f % TD;
                all = all && ak < ra && mk < rm && dk < rd;
            }
            if (all) {
                in[i].load(xb + a * x_a + (long long)m * D + d);
            } else {
#pragma unroll
                for (int k = 0; k < VI; ++k) {
                    const int f = e + k, ak = f / (TM * TD), mk = (f / TD) % TM, dk = f % TD;
                    if (f < TILE && ak < ra && mk < rm && dk < rd) in[i].e[k] = xb[ak * x_a + (long long)mk * D + dk];
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < IT_IN; ++i) {
        const int v = i * NT + threadIdx.x;
        const int e = v * VI;
        if (NVI % NT == 0 || v < NVI) {
#pragma unroll
            for (int k = 0; k < VI; ++k) {
                const int f = FI ? e + k : e;
                const int a = f / (TM * TD), m = (f / TD) % TM, d = f % TD + (FI ? 0 : k);
                if (!FI || f < TILE) sh[(a * TM + m) * SD + d] = in[i].e[k];
            }
        }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < IT_OUT; ++i) {
        const int v = i * NT + threadIdx.x;
        const int e = v * VO;
        const int d = e / (TM * TA), m = (e / TA) % TM, a = e % TA;
        if constexpr (!FO) {
            if ((NVO % NT == 0 || v < NVO) && d < rd && m < rm && a < ra) {
                Pack<T, VO> out;
#pragma unroll
                for (int k = 0; k < VO; ++k) out.e[k] = sh[((a + k) * TM + m) * SD + d];
                out.store(yb + d * y_d + (long long)m * A + a);
            }
        } else if (v < NVO) {
            Pack<T, VO> out;
            bool all = e + VO <= TILE;
#pragma unroll
            for (int k = 0; k < VO; ++k) {
                const int f = e + k, dk = f / (TM * TA), mk = (f / TA) % TM, ak = f % TA;
                const bool ok = f < TILE && dk < rd && mk < rm && ak < ra;
                all = all && ok;
                out.e[k] = sh[ok ? (ak * TM + mk) * SD + dk : 0];
            }
            if (all) {
                out.store(yb + d * y_d + (long long)m * A + a);
            } else {
#pragma unroll
                for (int k = 0; k < VO; ++k) {
                    const int f = e + k, dk = f / (TM * TA), mk = (f / TA) % TM, ak = f % TA;
                    if (f < TILE && dk < rd && mk < rm && ak < ra) yb[dk * y_d + (long long)mk * A + ak] = out.e[k];
                }
            }
        }
    }
}

// The tile a rows kernel's block moves, as (p, tile along a, tile along d): blocks run along d first.
struct RowsTile {
    int p, ta, td;
};
__device__ __forceinline__ RowsTile rows_tile(int tiles_a, int tiles_d) {
    unsigned int b = blockIdx.x;
    const int td = b % tiles_d;
    b /= tiles_d;
    const int ta = b % tiles_a;
    return {(int)(b / tiles_a), ta, td};
}

// x[P][A][M = 1][D] -> y[P][D][A] when y's rows (length A) are not a multiple of VO elements: the
// rows start at every alignment, so the tile kernel above would store single elements.  Here y is
// cut along its flat index instead: row r = p * D + d owns [align(r * A), align((r + 1) * A)), where
// align rounds down to a multiple of VO, and tile column j owns the piece [align(r * A + j * TA),
// align(r * A + min((j + 1) * TA, A))) of it -- every store one aligned VO-vector (only the
// tensor's last A % VO elements are single).  A piece reaches at most VO - 1 elements left of
// a = j * TA, so the block stages rows a in [j * TA - (VO - 1), (j + 1) * TA) of its TD columns d;
// the up to VO - 1 elements a piece of column j = 0 takes from the end of the row before are read
// straight from x.  Stores: 8 lanes along a row (128 contiguous bytes at 16-byte vectors) x 4 rows
// per warp, conflict-free in shared memory for SD = 1 (mod 8) words.
template <typename T, int TA, int TD, int VI, int VO, int SD, int NT>
__global__ void __launch_bounds__(NT)
layout_rows_aligned(const T* __restrict__ x, T* __restrict__ y, int A, int D, int tiles_a, int tiles_d, int P) {
    constexpr int LA = TA + VO - 1;  // staged rows a
    constexpr int NDV = TD / VI;     // load vectors per staged row
    constexpr int NVI = LA * NDV;
    constexpr int NV = TA / VO;      // store vectors per piece, at most
    constexpr int NVO = TD * NV;
    constexpr int IT_IN = (NVI + NT - 1) / NT;
    static_assert(TD % VI == 0 && TA % VO == 0 && NV % 8 == 0, "tile shape");
    __shared__ T sh[LA * SD];

    const auto [p, ta, td] = rows_tile(tiles_a, tiles_d);
    const int a0 = ta * TA, d0 = td * TD;
    const int rd = min(TD, D - d0);
    const long long R = (long long)P * D;
    const T* xp = x + (long long)p * A * D;

    Pack<T, VI> in[IT_IN];
#pragma unroll
    for (int i = 0; i < IT_IN; ++i) {
        const int v = i * NT + threadIdx.x;
        const int ra = v / NDV, dv = (v % NDV) * VI;
        const int a = a0 - (VO - 1) + ra;
        in[i].raw = {};
        if ((NVI % NT == 0 || v < NVI) && a >= 0 && a < A && dv < rd) in[i].load(xp + (long long)a * D + d0 + dv);
    }
#pragma unroll
    for (int i = 0; i < IT_IN; ++i) {
        const int v = i * NT + threadIdx.x;
        const int ra = v / NDV, dv = (v % NDV) * VI;
        if (NVI % NT == 0 || v < NVI) {
#pragma unroll
            for (int k = 0; k < VI; ++k) sh[ra * SD + dv + k] = in[i].e[k];
        }
    }
    __syncthreads();
    const int a1 = min(a0 + TA, A);
#pragma unroll
    for (int i = 0; i < (NVO + NT - 1) / NT; ++i) {
        const int v = i * NT + threadIdx.x;
        const int k = v % 8 + 8 * (v / (8 * TD)), dd = (v / 8) % TD;
        if ((NVO % NT != 0 && v >= NVO) || dd >= rd) continue;
        const long long r = (long long)p * D + d0 + dd;
        const long long lo = (r * A + a0) / VO * VO, hi = (r * A + a1) / VO * VO;
        const long long f = lo + (long long)k * VO;
        if (f >= hi) continue;
        Pack<T, VO> out;
#pragma unroll
        for (int e = 0; e < VO; ++e) {
            const int a = (int)(f + e - r * A);
            if (a >= 0) {
                out.e[e] = sh[(a - a0 + VO - 1) * SD + dd];
            } else {  // the end of row r - 1
                const long long q = r - 1, pq = q / D;
                out.e[e] = x[(pq * A + a + A) * D + (q - pq * D)];
            }
        }
        out.store(y + f);
    }
    // The tensor's last R * A % VO elements: no whole vector left for them.
    if (p == P - 1 && ta == tiles_a - 1 && td == tiles_d - 1) {
        const long long end = R * A, f = end / VO * VO + threadIdx.x;
        if (f < end) y[f] = sh[((int)(f - (R - 1) * A) - a0 + VO - 1) * SD + (D - 1 - d0)];
    }
}

// The same cut of y (row r's piece of tile column j is [align(r * A + j * TA), align(r * A + min((j + 1) * TA,
// A))), align rounding down to VO elements), staged the other way round: shared memory holds y's pieces, not
// x's rows.  Staged row dd starts at a 16-byte boundary with the piece's first element, i.e. element a of y's
// row r = p * D + d0 + dd sits at column a - a0 + s, s = (r * A + a0) % VO, its row's own shift.  Then:
//  - a warp stores one piece as consecutive 16-byte vectors (LDS.128 -> STG.128, 32 lanes = 512 contiguous
//    bytes; the rows kernel above wrote 4 rows x 128 bytes per warp, twice the 128-byte lines per store), or,
//    BULK (sm_90), one thread per piece hands it to the bulk copy engine (cp.async.bulk shared -> global);
//  - the transposition happens on the way in: a warp loads GR rows a x GV vectors along d (16 rows x 2
//    16-byte vectors for 4-byte elements, so its scalar shared-memory stores hit 32 distinct banks for
//    SA = 4 (mod 32) words; layout.py picks GV and SA with a bank model).
// x rows a in [a0 - (VO - 1), a0 + TA) are staged (a piece reaches at most VO - 1 elements left of a0);
// a piece of tile column 0 takes its first s elements from the end of the row before, read straight from x
// after the tile's loads (issued with them, they took 15 more registers: 3 blocks per SM, not 4, at 256 x 32).
// ASYNC (4-byte elements, sm_80+): the loads go straight from x into their shifted place in shared memory as
// 4-byte cp.async copies -- no registers hold the tile, so more blocks fit per SM and every load of the tile
// is in flight at once.  A warp copies one x row's 32 consecutive d (128 contiguous bytes); staged row dd then
// starts at dd * SA + 4 * ((dd / 4) % 8) with SA = 0 (mod 32) words, so the 32 lanes' words -- that base plus
// the row's shift s(dd) in [0, 4), which runs through all four values over any 4 consecutive dd when A is
// odd -- fall in 32 distinct banks (2-way when A = 2 mod 4).
template <typename T, int TA, int TD, int VI, int VO, int SA, int GV, int NT, bool BULK, bool ASYNC = false>
__global__ void __launch_bounds__(NT)
layout_rows_shifted(const T* __restrict__ x, T* __restrict__ y, int A, int D, int tiles_a, int tiles_d, int P) {
    constexpr int LA = TA + VO - 1;          // x rows a staged
    constexpr int NDV = TD / VI;             // load vectors per x row
    constexpr int GR = 32 / GV;              // rows per warp load
    constexpr int NVG = (NDV + GV - 1) / GV;
    constexpr int NSLOT = (LA + GR - 1) / GR * NVG * 32;
    constexpr int IT_IN = (NSLOT + NT - 1) / NT;
    constexpr int NW = NT / 32;
    constexpr int IT_OUT = (TA / VO + 31) / 32;  // store vectors per lane and piece
    static_assert(TD % VI == 0 && TA % VO == 0 && SA % VO == 0 && SA >= TA + VO && 32 % GV == 0, "tile shape");
    static_assert((VO & (VO - 1)) == 0 && TD <= NT && (!BULK || VO * sizeof(T) == 16), "vectors of 16 bytes");
    static_assert(!ASYNC || (sizeof(T) == 4 && SA % 32 == 0 && TD % 32 == 0 && NT % TD == 0 && NT / TD >= VO),
                  "async staging");
    __shared__ __align__(16) T sh[TD * SA + (ASYNC ? 28 : 0)];
    auto row = [](int dd) { return ASYNC ? dd * SA + 4 * ((dd >> 2) & 7) : dd * SA; };  // staged row dd's start

    const auto [p, ta, td] = rows_tile(tiles_a, tiles_d);
    const int a0 = ta * TA, d0 = td * TD;
    const int a1 = min(a0 + TA, A), rd = min(TD, D - d0);
    const long long r0 = (long long)p * D + d0;  // y's row of dd = 0
    const int am = A % VO, c0 = (int)((r0 * A + a0) % VO);  // row dd's shift: (c0 + dd * am) % VO
    auto floor_vo = [](long long f) { return f & ~(long long)(VO - 1); };  // f >= 0
    const T* xp = x + (long long)p * A * D + d0;

    if constexpr (ASYNC) {
        const int dd = threadIdx.x % TD, s = (c0 + dd * am) & (VO - 1);
        if (dd < rd) {
            const int ra0 = threadIdx.x / TD;
            const unsigned int dst = smem_addr(sh + row(dd) + s - (VO - 1));  // + 4 * ra
            unsigned long long src;  // x[a][dd] of this thread's row a, stepped by NT / TD rows
            asm("cvta.to.global.u64 %0, %1;" : "=l"(src) : "l"(xp + dd));
            src += ((long long)(a0 - (VO - 1) + ra0) * D) * (long long)sizeof(T);
            const long long step = (long long)(NT / TD) * D * (long long)sizeof(T);
            const int lim = min(LA, A - a0 + VO - 1);  // rows a < A
            // Only a thread's first row can lie before x (a < 0) or before its piece (column < 0): NT / TD >= VO.
            if (ra0 < lim && a0 - (VO - 1) + ra0 >= 0 && ra0 - (VO - 1) + s >= 0)
                asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst + 4 * ra0), "l"(src) : "memory");
#pragma unroll 4
            for (int ra = ra0 + NT / TD; ra < lim; ra += NT / TD) {
                src += step;
                asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst + 4 * ra), "l"(src) : "memory");
            }
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
        asm volatile("cp.async.wait_group 0;" ::: "memory");
    }
    Pack<T, VI> in[ASYNC ? 1 : IT_IN];
#pragma unroll
    for (int i = 0; i < (ASYNC ? 0 : IT_IN); ++i) {
        const int v = i * NT + threadIdx.x, w = v / 32, l = v % 32;
        const int ra = w / NVG * GR + l % GR, dv = (w % NVG * GV + l / GR) * VI;
        const int a = a0 - (VO - 1) + ra;
        in[i].raw = {};
        if ((NSLOT % NT == 0 || v < NSLOT) && ra < LA && dv < rd && a >= 0 && a < A)
            in[i].load(xp + (long long)a * D + dv);
    }
#pragma unroll
    for (int i = 0; i < (ASYNC ? 0 : IT_IN); ++i) {
        const int v = i * NT + threadIdx.x, w = v / 32, l = v % 32;
        const int ra = w / NVG * GR + l % GR, dv = (w % NVG * GV + l / GR) * VI;
        const int a = a0 - (VO - 1) + ra;
        if ((NSLOT % NT == 0 || v < NSLOT) && ra < LA && dv < rd && a >= 0 && a < A) {
#pragma unroll
            for (int k = 0; k < VI; ++k) {
                const int dd = dv + k, col = ra - (VO - 1) + ((c0 + dd * am) & (VO - 1));
                if (col >= 0) sh[dd * SA + col] = in[i].e[k];
            }
        }
    }
    if (a0 == 0) {  // the first s elements of column 0's pieces: the end of y's row before
        for (int t = threadIdx.x; t < TD * (VO - 1); t += NT) {
            const int dd = t / (VO - 1), e = t % (VO - 1), s = (c0 + dd * am) & (VO - 1);
            if (dd < rd && e < s) {
                const long long q = r0 + dd - 1, pq = q / D;
                sh[row(dd) + e] = x[(pq * A + A - s + e) * D + (q - pq * D)];
            }
        }
    }
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
    if constexpr (BULK) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
    __syncthreads();
    bool bulk_done = false;
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
    if constexpr (BULK) {
        if (threadIdx.x < rd) {
            const long long rA = (r0 + threadIdx.x) * A;
            const long long lo = floor_vo(rA + a0), hi = floor_vo(rA + a1);
            if (hi > lo) {
                asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(y + lo),
                             "r"(smem_addr(sh + row(threadIdx.x))), "r"((int)((hi - lo) * sizeof(T)))
                             : "memory");
                asm volatile("cp.async.bulk.commit_group;" ::: "memory");
            }
        }
        bulk_done = true;
    }
#endif
    if (!bulk_done) {
        const int lane = threadIdx.x % 32;
        for (int dd = threadIdx.x / 32; dd < rd; dd += NW) {
            const long long rA = (r0 + dd) * A;
            const long long lo = floor_vo(rA + a0);
            const int n = (int)((floor_vo(rA + a1) - lo) / VO);
#pragma unroll
            for (int q = 0; q < IT_OUT; ++q) {
                const int j = q * 32 + lane;
                if (j < n) {
                    Pack<T, VO> out;
                    out.raw = *reinterpret_cast<const typename Pack<T, VO>::Raw*>(sh + row(dd) + j * VO);
                    out.store(y + lo + (long long)j * VO);
                }
            }
        }
    }
    // The tensor's last R * A % VO elements: no whole vector left for them.
    if (p == P - 1 && ta == tiles_a - 1 && td == tiles_d - 1) {
        const long long R = (long long)P * D, end = R * A, f = floor_vo(end) + threadIdx.x;
        const long long lo = floor_vo((R - 1) * A + a0);
        if (f < end) y[f] = sh[row(D - 1 - d0) + (int)(f - lo)];
    }
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
    if constexpr (BULK) {  // the copy engine reads shared memory until the group completes
        if (threadIdx.x < rd) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    }
#endif
}

#ifdef UCUDNN_NVCC_CHECK
// Representative instantiations so `nvcc --cubin` (CI, resource reports) generates code.
#define UCUDNN_LAYOUT(T, ...) \
    template __global__ void layout_transpose<T, __VA_ARGS__>(const T*, T*, int, int, int, int, int, int);
UCUDNN_LAYOUT(unsigned int, 64, 1, 64, 4, 4, 65, 256, false, false)
UCUDNN_LAYOUT(unsigned int, 128, 1, 64, 4, 4, 65, 256, false, false)
UCUDNN_LAYOUT(unsigned short, 64, 2, 64, 8, 8, 67, 256, false, false)
UCUDNN_LAYOUT(unsigned short, 64, 1, 128, 8, 8, 129, 256, false, false)
UCUDNN_LAYOUT(unsigned int, 3, 1, 1024, 4, 4, 1035, 256, false, true)
UCUDNN_LAYOUT(unsigned int, 1024, 1, 3, 4, 4, 3, 256, true, false)
UCUDNN_LAYOUT(unsigned short, 3, 40, 64, 8, 8, 65, 256, false, true)
UCUDNN_LAYOUT(unsigned short, 64, 16, 3, 8, 8, 3, 256, true, false)
#define UCUDNN_LAYOUT_ROWS(T, ...) \
    template __global__ void layout_rows_aligned<T, __VA_ARGS__>(const T*, T*, int, int, int, int, int);
UCUDNN_LAYOUT_ROWS(unsigned int, 64, 48, 4, 4, 49, 256)
UCUDNN_LAYOUT_ROWS(unsigned short, 64, 64, 8, 8, 66, 256)
UCUDNN_LAYOUT_ROWS(unsigned int, 64, 96, 4, 4, 97, 256)
UCUDNN_LAYOUT_ROWS(unsigned int, 128, 48, 4, 4, 49, 256)
#define UCUDNN_LAYOUT_SHIFTED(T, ...) \
    template __global__ void layout_rows_shifted<T, __VA_ARGS__>(const T*, T*, int, int, int, int, int);
UCUDNN_LAYOUT_SHIFTED(unsigned int, 128, 48, 4, 4, 132, 2, 256, false)
UCUDNN_LAYOUT_SHIFTED(unsigned int, 128, 48, 4, 4, 132, 2, 256, true)
UCUDNN_LAYOUT_SHIFTED(unsigned int, 256, 32, 4, 4, 260, 2, 256, false)
UCUDNN_LAYOUT_SHIFTED(unsigned short, 256, 48, 8, 8, 264, 1, 256, false)
UCUDNN_LAYOUT_SHIFTED(unsigned char, 512, 32, 16, 16, 528, 1, 256, false)
UCUDNN_LAYOUT_SHIFTED(unsigned int, 256, 32, 4, 4, 288, 1, 256, true, true)
UCUDNN_LAYOUT_SHIFTED(unsigned int, 128, 64, 4, 4, 160, 1, 256, true, true)
UCUDNN_LAYOUT_SHIFTED(unsigned int, 128, 32, 4, 4, 160, 1, 256, false, true)
#endif
