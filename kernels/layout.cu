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

#ifdef UCUDNN_NVCC_CHECK
// Representative instantiations so `nvcc --cubin` (CI, resource reports) generates code.
#define UCUDNN_LAYOUT(T, ...) \
    template __global__ void layout_transpose<T, __VA_ARGS__>(const T*, T*, int, int, int, int, int, int);
UCUDNN_LAYOUT(unsigned int, 64, 1, 64, 4, 4, 65, 256, false, false)
UCUDNN_LAYOUT(unsigned short, 64, 1, 128, 8, 8, 129, 256, false, false)
UCUDNN_LAYOUT(unsigned int, 3, 1, 1024, 4, 4, 1035, 256, false, true)
UCUDNN_LAYOUT(unsigned int, 1024, 1, 3, 4, 4, 3, 256, true, false)
UCUDNN_LAYOUT(unsigned short, 3, 40, 64, 8, 8, 65, 256, false, true)
UCUDNN_LAYOUT(unsigned short, 64, 16, 3, 8, 8, 3, 256, true, false)
#endif
