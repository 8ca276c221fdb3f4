// Fused chains of 1x1 convolutions on tensor cores (FP16 storage, FP32 accumulation): seed 004's straight and merge
// blocks when every layer is a 1x1, stride-1, ungrouped convolution -- a chain of GEMMs over the pixels.
//
// Why beside fused.cu: fused.cu computes with float32 FMA, which is what FP32 data needs; with FP16 data cuDNN's
// per-layer 1x1 kernels use tensor cores, and on the seed's ResNet block c.1 (64 -> 256 twice, added, -> 64) the
// FMA kernel lost to them (H100, batch 1: 28.3 vs 23.2 us).  Here each layer is mma.sync m16n8k16 (f16 x f16 -> f32)
// in registers, the intermediate stays in shared memory as FP16 (what a per-layer FP16 network stores too).
//
//   straight  y = L2(L1(x))                      (slots: L1 = w1/b1, L2 = w3/b3)
//   merge     y = L3(relu?(L1(x) + L2(x2)))      (ResNet: the residual add of two linear 1x1s, then the next 1x1)
//
// A block of NW warps owns PT pixels of one sample (blockIdx.x: pixel tile, blockIdx.z: sample):
//   1. stage x (and x2) over the tile into shared memory pixel-major, xs[p][c] (a row of C + 8 halves: the 8-half
//      pad puts the 8 rows one mma B-fragment reads in distinct banks), zero beyond the plane;
//   2. the first GEMM, mid[M x PT] = W1[M x C] . x[C x PT]: warp w takes the 16-row tiles w, w + NW, ... of M, each
//      against every 8-pixel column of the tile (A fragments read once from global memory / L1, reused across
//      the columns); bias, activation (merge: each layer's own, then the add and MRELU) applied to the accumulator
//      registers, whose (row, column) the PTX fragment layout fixes; stored as FP16 into mid[p][m];
//   3. the second GEMM, y[K x PT] = W3[K x M] . mid[M x PT], the same way, bias and activation, written to y.
// Fragment layouts: mma.cuh.  kernels/pointwise.py: the launcher, and emulate (this arithmetic in NumPy;
// tests/test_pointwise.py).
#include "mma.cuh"

// acc[j] += W[m0 .. m0 + 16, :] . s[:, 8j .. 8j + 8] for the NJ pixel columns of the tile; W row-major [rows][KD],
// s pixel-major with rows of LD halves (the reduction dimension contiguous).
template <int KD, int LD, int NJ>
__device__ __forceinline__ void gemm_rows(float (&acc)[NJ][4], const half_t* __restrict__ w, const half_t* s, int m0,
                                          int g, int t) {
#pragma unroll 4
    for (int k0 = 0; k0 < KD; k0 += 16) {
        const half_t* r0 = w + (m0 + g) * KD + k0 + 2 * t;
        const half_t* r1 = r0 + 8 * KD;
        const unsigned a[4] = {ldg_pair(r0), ldg_pair(r1), ldg_pair(r0 + 8), ldg_pair(r1 + 8)};
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            const half_t* b = s + (8 * j + g) * LD + k0 + 2 * t;
            mma16816(acc[j], a, lds_pair(b), lds_pair(b + 8));
        }
    }
}

// x over pixels [p0, p0 + PT) of one sample into s[p][c] (rows of C + 8), zeros past the plane.
template <int C, bool NHWC, int PT, int NTH>
__device__ __forceinline__ void stage(const half_t* __restrict__ x, half_t* s, int p0, int P) {
    constexpr int LD = C + 8;
    if constexpr (NHWC) {   // a pixel's C channels are contiguous: 16-byte pieces
        constexpr int V = C / 8;
        for (int i = threadIdx.x; i < PT * V; i += NTH) {
            const int p = i / V, c = (i % V) * 8;
            Pack<half_t, 8> pk;
            if (p0 + p < P) pk.load(x + (size_t)(p0 + p) * C + c);
            else pk.raw = uint4{0, 0, 0, 0};
            pk.store(s + p * LD + c);
        }
    } else {                // a channel's pixels are contiguous: consecutive threads read consecutive pixels
        for (int i = threadIdx.x; i < PT * C; i += NTH) {
            const int c = i / PT, p = i % PT;
            half_t v;
            v.bits = 0;
            if (p0 + p < P) v = x[(size_t)c * P + p0 + p];
            s[p * LD + c] = v;
        }
    }
}

template <int MODE, int C, int M, int K, bool NHWC, int PT, int NW, bool B1, int A1, bool B2, int A2, bool MRELU,
          bool B3, int A3>
__global__ void __launch_bounds__(NW * 32)
    pointwise_chain(const half_t* __restrict__ x, const half_t* __restrict__ x2, const half_t* __restrict__ w1,
                    const half_t* __restrict__ b1, const half_t* __restrict__ w2, const half_t* __restrict__ b2,
                    const half_t* __restrict__ w3, const half_t* __restrict__ b3, half_t* __restrict__ y, int P) {
    static_assert(C % 16 == 0 && M % 16 == 0 && K % 16 == 0, "channels must be multiples of 16");
    static_assert(PT % 8 == 0 && PT >= 8, "the pixel tile is a multiple of 8");
    constexpr bool MERGE = MODE == 1;
    constexpr int NJ = PT / 8, LDX = C + 8, LDM = M + 8, NTH = NW * 32;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    half_t* xs = reinterpret_cast<half_t*>(smem_raw);
    half_t* x2s = xs + PT * LDX;
    half_t* mid = x2s + (MERGE ? PT * LDX : 0);

    const int p0 = blockIdx.x * PT;
    const size_t n = blockIdx.z;
    stage<C, NHWC, PT, NTH>(x + n * C * P, xs, p0, P);
    if constexpr (MERGE) stage<C, NHWC, PT, NTH>(x2 + n * C * P, x2s, p0, P);
    __syncthreads();

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    for (int m0 = warp * 16; m0 < M; m0 += NW * 16) {
        float acc[NJ][4] = {};
        gemm_rows<C, LDX, NJ>(acc, w1, xs, m0, g, t);
        float acc2[MERGE ? NJ : 1][4] = {};
        if constexpr (MERGE) gemm_rows<C, LDX, NJ>(acc2, w2, x2s, m0, g, t);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int m = m0 + g + 8 * h;
            const float bb1 = bias_at<B1>(b1, m);
            const float bb2 = bias_at<B2>(b2, m);
#pragma unroll
            for (int j = 0; j < NJ; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float v = act<A1>(acc[j][2 * h + e] + bb1);
                    if constexpr (MERGE) {
                        v += act<A2>(acc2[j][2 * h + e] + bb2);
                        if constexpr (MRELU) v = fmaxf(v, 0.f);
                    }
                    mid[(8 * j + 2 * t + e) * LDM + m] = from_float<half_t>(v);
                }
        }
    }
    __syncthreads();

    y += n * K * P;
    for (int m0 = warp * 16; m0 < K; m0 += NW * 16) {
        float acc[NJ][4] = {};
        gemm_rows<M, LDM, NJ>(acc, w3, mid, m0, g, t);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int k = m0 + g + 8 * h;
            const float bb = bias_at<B3>(b3, k);
#pragma unroll
            for (int j = 0; j < NJ; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int p = p0 + 8 * j + 2 * t + e;
                    if (p < P) {
                        const half_t v = from_float<half_t>(act<A3>(acc[j][2 * h + e] + bb));
                        if constexpr (NHWC) y[(size_t)p * K + k] = v;
                        else y[(size_t)k * P + p] = v;
                    }
                }
        }
    }
}

#ifdef UCUDNN_NVCC_CHECK
#define PW_ARGS const half_t*, const half_t*, const half_t*, const half_t*, const half_t*, const half_t*, \
    const half_t*, const half_t*, half_t*, int
// The seed's c.1 (merge, 64 -> 256 twice, ReLU after the add, -> 64 + ReLU) NCHW and NHWC, and a straight chain
// (MobileNet-style expand 32 -> 192 + ReLU6, linear projection -> 32) NHWC.
template __global__ void pointwise_chain<1, 64, 256, 64, false, 32, 4, true, ACT_NONE, true, ACT_NONE, true, true,
                                         ACT_RELU>(PW_ARGS);
template __global__ void pointwise_chain<1, 64, 256, 64, true, 64, 8, true, ACT_NONE, true, ACT_NONE, true, true,
                                         ACT_RELU>(PW_ARGS);
template __global__ void pointwise_chain<0, 32, 192, 32, true, 32, 4, true, ACT_RELU6, false, ACT_NONE, false, true,
                                         ACT_NONE>(PW_ARGS);
#endif
