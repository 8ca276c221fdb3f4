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

    unsigned int b = blockIdx.x;
    const int td = b % tiles_d;
    b /= tiles_d;
    const int ta = b % tiles_a;
    const int p = (int)(b / tiles_a);
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
#endif
