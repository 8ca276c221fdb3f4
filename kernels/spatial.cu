// Fused 1x1 -> spatial blocks on tensor cores (FP16 storage, FP32 accumulation): seed 004's straight blocks whose
// first layer is a 1x1 and whose second is an R x S convolution (a.1: GoogLeNet's 1x1 reduce, then 5x5), and its
// split blocks whose consumers are two such convolutions concatenated (b.1: SqueezeNet's fire, 1x1 squeeze, then
// 1x1 | 3x3 expands).
//
// Why: fused.cu computes with float32 FMA; with FP16 data cuDNN's per-layer kernels run on tensor cores, and on a.1
// the FMA kernel only tied them (H100, batch 1: 20.4 vs 20.4 us).  pointwise.cu covers chains of 1x1s; here the
// consumer is an implicit GEMM over the intermediate's halo.
//
// A thread block of NW warps owns a TH x TW tile of output pixels of one sample and RTB 16-row tiles of the output
// channels (blockIdx.x: pixel tile, blockIdx.y: group of row tiles, blockIdx.z: sample):
//   1. staging: the producer's weights (cp.async), this block's consumer filter rows as wcs[k][tap * M + m] (KRSC
//      filters by cp.async; KCRS ones transposed through registers), and x over the halo the consumers read as
//      xs[p][c] (NHWC by cp.async, NCHW through registers, 16 loads in flight per thread), zero outside the plane;
//   2. the producer GEMM mid[M x HP] = W1[M x C] . xs[C x HP] over the halo's HP pixels, bias + activation, zero
//      where the halo pixel is outside the plane (the consumers' zero padding), stored as FP16 mid[p][m];
//   3. each consumer row tile: y[16 x TP] = Wc[16 x (R S M)] . im2col(mid), one k-step = one tap x 16 intermediate
//      channels, its B fragment read from mid at the tap's halo pixel (no im2col buffer); bias, activation, written
//      to the block's output at the consumer's channel offset (split: concatenated).
// Rows of C + 8, M + 8 and R S M + 8 halves put the 8 rows one fragment reads in distinct banks.  Fragment layouts:
// mma.cuh.  kernels/spatial.py: the launcher, the halo geometry (halo(), the same arithmetic, property-tested), and
// emulate (this arithmetic in NumPy).
#include "mma.cuh"

// The halo of a TH x TW output tile: the consumers' taps reach DH rows above / DW columns left of the tile (the
// larger pad), and HH x HW pixels in all.  Consumer j's tap (i, k) of tile pixel (ty, tx) is halo pixel
// (ty + i + DH - PHj, tx + k + DW - PWj).
template <int TH, int TW, int R1, int S1, int PH1, int PW1, int K2, int R2, int S2, int PH2, int PW2> struct Halo {
    static constexpr int DH = (K2 > 0 && PH2 > PH1) ? PH2 : PH1;
    static constexpr int DW = (K2 > 0 && PW2 > PW1) ? PW2 : PW1;
    static constexpr int EH1 = R1 - 1 + DH - PH1, EH2 = K2 > 0 ? R2 - 1 + DH - PH2 : 0;
    static constexpr int EW1 = S1 - 1 + DW - PW1, EW2 = K2 > 0 ? S2 - 1 + DW - PW2 : 0;
    static constexpr int HH = TH + (EH1 > EH2 ? EH1 : EH2);
    static constexpr int HW = TW + (EW1 > EW2 ? EW1 : EW2);
    static constexpr int HP = HH * HW, HPP = (HP + 7) / 8 * 8;
};

// Rows [k_lo, k_hi) of one consumer's filters (R S = RS taps of M channels each) into shared rows local0, ...
template <bool KRSC, int M, int RS, int LDC, int NTH>
__device__ __forceinline__ void stage_filters(const half_t* __restrict__ w, half_t* wcs, int k_lo, int k_hi,
                                              int local0) {
    constexpr int RED = RS * M;
    const int count = (k_hi - k_lo) * (RED / 8);
    if (count <= 0) return;
    const half_t* src = w + (size_t)k_lo * RED;
    half_t* dst = wcs + local0 * LDC;
    if constexpr (KRSC || RS == 1) {   // already [k][tap][m]
        for (int i = threadIdx.x; i < count; i += NTH) {
            const int k = i / (RED / 8), r = (i % (RED / 8)) * 8;
            cp_async16(dst + k * LDC + r, src + 8 * i, true);
        }
    } else {                           // KCRS: [k][m][tap] -> [k][tap][m]
        batched_copy<NTH, 4, uint4>(
            count, [&](int i) { return __ldg(reinterpret_cast<const uint4*>(src) + i); },
            [&](int i, uint4 v) {
                Pack<half_t, 8> pk;
                pk.raw = v;
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    const int s = 8 * i + e, k = s / RED, rem = s % RED;
                    dst[k * LDC + (rem % RS) * M + rem / RS] = pk.e[e];
                }
            });
    }
}

// One consumer row tile: acc[j] = W[16 rows x (taps, M)] . im2col(mid) for the NJ 8-pixel columns j0 + j; bias,
// activation and the store to y at output channel oc0 + row.
template <int R, int S, int OFH, int OFW, int M, int LDM, int LDC, int HWD, int TW, int TP, int CT, int NJ, bool B,
          int A, bool NHWC>
__device__ __forceinline__ void consume(const half_t* wrows, const half_t* mid, const half_t* __restrict__ bias,
                                        int k0, int oc0, int KT, int j0, half_t* __restrict__ y, int OH, int OW,
                                        int oh0, int ow0, int g, int t) {
    int pb[NJ];
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
        int n = 8 * (j0 + j) + g;
        if (n >= TP) n = 0;   // a padding column: any valid pixel, its result is dropped
        pb[j] = (n / TW + OFH) * HWD + n % TW + OFW;
    }
    float acc[NJ][4] = {};
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
        for (int k = 0; k < S; ++k) {
            const int tap = i * S + k, off = i * HWD + k;
#pragma unroll
            for (int m0 = 0; m0 < M; m0 += 16) {
                const half_t* ar = wrows + g * LDC + tap * M + m0 + 2 * t;
                const unsigned a[4] = {lds_pair(ar), lds_pair(ar + 8 * LDC), lds_pair(ar + 8),
                                       lds_pair(ar + 8 * LDC + 8)};
#pragma unroll
                for (int j = 0; j < NJ; ++j)
                    if (j0 + j < CT) {
                        const half_t* b = mid + (pb[j] + off) * LDM + m0 + 2 * t;
                        mma16816(acc[j], a, lds_pair(b), lds_pair(b + 8));
                    }
            }
        }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = g + 8 * h;
        const float bb = bias_at<B>(bias, k0 + row);
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int n = 8 * (j0 + j) + 2 * t + e;
                if (j0 + j < CT && n < TP) {
                    const int oh = oh0 + n / TW, ow = ow0 + n % TW;
                    if (oh < OH && ow < OW) {
                        const half_t v = from_float<half_t>(act<A>(acc[j][2 * h + e] + bb));
                        if constexpr (NHWC) y[((size_t)oh * OW + ow) * KT + oc0 + row] = v;
                        else y[((size_t)(oc0 + row) * OH + oh) * OW + ow] = v;
                    }
                }
            }
    }
}

template <int C, int M, bool NHWC, int TH, int TW, int NW, int RTB, bool B1, int A1, int K1, int R1, int S1, int PH1,
          int PW1, bool BC1, int AC1, int K2, int R2, int S2, int PH2, int PW2, bool BC2, int AC2>
__global__ void __launch_bounds__(NW * 32)
    spatial_chain(const half_t* __restrict__ x, const half_t* __restrict__ w1, const half_t* __restrict__ b1,
                  const half_t* __restrict__ wc1, const half_t* __restrict__ bc1, const half_t* __restrict__ wc2,
                  const half_t* __restrict__ bc2, half_t* __restrict__ y, int H, int W, int tiles_w) {
    static_assert(C % 16 == 0 && M % 16 == 0 && K1 % 16 == 0 && K2 % 16 == 0, "channels must be multiples of 16");
    using G = Halo<TH, TW, R1, S1, PH1, PW1, K2, R2, S2, PH2, PW2>;
    constexpr int NTH = NW * 32, LDX = C + 8, LDM = M + 8, KT = K1 + K2;
    constexpr int RED1 = R1 * S1 * M, RED2 = K2 > 0 ? R2 * S2 * M : 0;
    constexpr int LDC = (RED1 > RED2 ? RED1 : RED2) + 8;
    constexpr int TP = TH * TW, CT = (TP + 7) / 8, NJC = CT < 4 ? CT : 4, CCH = (CT + NJC - 1) / NJC;
    constexpr int CTP = G::HPP / 8, NJP = CTP < 4 ? CTP : 4, PCH = (CTP + NJP - 1) / NJP;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    half_t* xs = reinterpret_cast<half_t*>(smem_raw);
    half_t* w1s = xs + G::HPP * LDX;
    half_t* mid = w1s + M * LDX;
    half_t* wcs = mid + G::HPP * LDM;

    const int OH = H + 2 * PH1 - R1 + 1, OW = W + 2 * PW1 - S1 + 1;
    const int oh0 = (blockIdx.x / tiles_w) * TH, ow0 = (blockIdx.x % tiles_w) * TW;
    const int ih0 = oh0 - G::DH, iw0 = ow0 - G::DW;
    const int r0 = blockIdx.y * RTB * 16, r1 = r0 + RTB * 16 < KT ? r0 + RTB * 16 : KT;
    const size_t n = blockIdx.z;
    x += n * C * H * W;
    y += n * KT * OH * OW;

    // 1. staging: cp.async first (it needs no registers), then the register paths while those copies fly
    for (int i = threadIdx.x; i < M * (C / 8); i += NTH) {
        const int m = i / (C / 8), c = (i % (C / 8)) * 8;
        cp_async16(w1s + m * LDX + c, w1 + m * C + c, true);
    }
    if constexpr (NHWC) {
        for (int i = threadIdx.x; i < G::HP * (C / 8); i += NTH) {
            const int p = i / (C / 8), c = (i % (C / 8)) * 8;
            const int ih = ih0 + p / G::HW, iw = iw0 + p % G::HW;
            const bool in = ih >= 0 && ih < H && iw >= 0 && iw < W;
            cp_async16(xs + p * LDX + c, in ? x + ((size_t)ih * W + iw) * C + c : x, in);
        }
    }
    stage_filters<NHWC, M, R1 * S1, LDC, NTH>(wc1, wcs, r0, r1 < K1 ? r1 : K1, 0);
    if constexpr (K2 > 0)
        stage_filters<NHWC, M, R2 * S2, LDC, NTH>(wc2, wcs, (r0 > K1 ? r0 : K1) - K1, r1 - K1,
                                                  (r0 > K1 ? r0 : K1) - r0);
    if constexpr (!NHWC) {
        const size_t plane = (size_t)H * W;
        batched_copy<NTH, 16, half_t>(
            C * G::HP,
            [&](int i) {
                const int c = i / G::HP, p = i % G::HP;
                const int ih = ih0 + p / G::HW, iw = iw0 + p % G::HW;
                half_t v;
                v.bits = 0;
                if (ih >= 0 && ih < H && iw >= 0 && iw < W) v = x[c * plane + (size_t)ih * W + iw];
                return v;
            },
            [&](int i, half_t v) { xs[(i % G::HP) * LDX + i / G::HP] = v; });
    }
    cp_async_wait_all();
    __syncthreads();

    // 2. the producer over the halo
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    for (int item = warp; item < (M / 16) * PCH; item += NW) {
        const int m0 = (item / PCH) * 16, j0 = (item % PCH) * NJP;
        float acc[NJP][4] = {};
#pragma unroll 4
        for (int k0 = 0; k0 < C; k0 += 16) {
            const half_t* ar = w1s + (m0 + g) * LDX + k0 + 2 * t;
            const unsigned a[4] = {lds_pair(ar), lds_pair(ar + 8 * LDX), lds_pair(ar + 8), lds_pair(ar + 8 * LDX + 8)};
#pragma unroll
            for (int j = 0; j < NJP; ++j)
                if (j0 + j < CTP) {
                    const half_t* b = xs + (8 * (j0 + j) + g) * LDX + k0 + 2 * t;
                    mma16816(acc[j], a, lds_pair(b), lds_pair(b + 8));
                }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int m = m0 + g + 8 * h;
            const float bb = bias_at<B1>(b1, m);
#pragma unroll
            for (int j = 0; j < NJP; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int p = 8 * (j0 + j) + 2 * t + e;
                    if (j0 + j < CTP) {
                        const int ih = ih0 + p / G::HW, iw = iw0 + p % G::HW;
                        const bool in = p < G::HP && ih >= 0 && ih < H && iw >= 0 && iw < W;
                        mid[p * LDM + m] = from_float<half_t>(in ? act<A1>(acc[j][2 * h + e] + bb) : 0.f);
                    }
                }
        }
    }
    __syncthreads();

    // 3. the consumers' row tiles of this block (a row tile never straddles the two: K1 % 16 == 0)
    const int ntiles = (r1 - r0) / 16;
    for (int item = warp; item < ntiles * CCH; item += NW) {
        const int lr = (item / CCH) * 16, row0 = r0 + lr, j0 = (item % CCH) * NJC;
        if (row0 < K1)
            consume<R1, S1, G::DH - PH1, G::DW - PW1, M, LDM, LDC, G::HW, TW, TP, CT, NJC, BC1, AC1, NHWC>(
                wcs + lr * LDC, mid, bc1, row0, row0, KT, j0, y, OH, OW, oh0, ow0, g, t);
        else if constexpr (K2 > 0)
            consume<R2, S2, G::DH - PH2, G::DW - PW2, M, LDM, LDC, G::HW, TW, TP, CT, NJC, BC2, AC2, NHWC>(
                wcs + lr * LDC, mid, bc2, row0 - K1, row0, KT, j0, y, OH, OW, oh0, ow0, g, t);
    }
}

#ifdef UCUDNN_NVCC_CHECK
#define SP_ARGS const half_t*, const half_t*, const half_t*, const half_t*, const half_t*, const half_t*, \
    const half_t*, half_t*, int, int, int
// The seed's a.1 (192 -> 1x1 16 + ReLU -> 5x5 pad 2, 32 + ReLU) NCHW and NHWC, and b.1 (64 -> 1x1 16 + ReLU ->
// 1x1 64 + ReLU | 3x3 pad 1, 64 + ReLU) NCHW.
template __global__ void spatial_chain<192, 16, false, 4, 4, 4, 2, true, ACT_RELU, 32, 5, 5, 2, 2, true, ACT_RELU, 0,
                                       1, 1, 0, 0, false, ACT_NONE>(SP_ARGS);
template __global__ void spatial_chain<192, 16, true, 4, 8, 4, 1, true, ACT_RELU, 32, 5, 5, 2, 2, true, ACT_RELU, 0,
                                       1, 1, 0, 0, false, ACT_NONE>(SP_ARGS);
template __global__ void spatial_chain<64, 16, false, 8, 8, 8, 8, true, ACT_RELU, 64, 1, 1, 0, 0, true, ACT_RELU, 64,
                                       3, 3, 1, 1, true, ACT_RELU>(SP_ARGS);
#endif
