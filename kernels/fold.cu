// Space-to-depth folding of a strided convolution's operands (ucudnn.sources.fold).
//
// A convolution with stride (SH, SW) over C channels equals a stride-1
// convolution over C*SH*SW channels of the "folded" input: folded element
// (n, cf, hb, wb) with cf = (i*SW + j)*C + c is the padded input's element
// (n, c, hb*SH + i, wb*SW + j), zero where that falls into the padding.  The
// filter folds the same way (no padding; taps past R x S are zero).  AlexNet's
// conv1 (C = 3, 11x11, stride 4) becomes a 3x3 convolution over 48 channels,
// which cuDNN's tensor-core engines run several times faster than the
// original (benchmarks/results/graph_wr_*): the kernels here only move bytes.
//
// fold_pack:   plain (src) -> folded (dst), every folded element written.
// fold_unpack: folded (src) -> plain (dst), dst = alpha * folded + beta * dst
//              (dst is not read when beta == 0; plain elements no window
//              reaches get alpha * 0, as their true gradient is zero).
// Each side is NCHW ([N, C, H, W] / [N, CF, HB, WB]) or NHWC ([N, H, W, C] /
// [N, HB, WB, CF]), independently: folding into the other layout costs
// nothing extra (the gather reads one, writes the other), so a kernel whose
// best engines want the other layout need not copy its folded operand again.
// One thread per element of the tensor written (written_element);
// C, SH, SW are template parameters so the channel decode is multiplies, and
// grid.z walks N (the launcher splits N beyond 65535).
#include "common.cuh"

// The element of an [N, C, H, W] (NCHW) or [N, H, W, C] (NHWC) tensor this thread writes, for the grids the
// launcher uses: NHWC (ceil(W*C / 256), H, N), one row (n, h) of W*C contiguous elements per grid.y; NCHW
// (ceil(H*W / 256), C, N), one plane (n, c) per grid.y.  False for the threads past the row or plane.
template <bool NHWC>
__device__ __forceinline__ bool written_element(int C, int H, int W, int& c, int& h, int& w, long long& o)
{
    const long long n = blockIdx.z;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (NHWC) {
        if (t >= W * C) return false;
        h = blockIdx.y;
        c = t % C;
        w = t / C;
        o = (n * H + h) * (long long)(W * C) + t;
    } else {
        if (t >= H * W) return false;
        c = blockIdx.y;
        h = t / W;
        w = t - h * W;
        o = (n * C + c) * (long long)(H * W) + t;
    }
    return true;
}

template <typename T, int C, int SH, int SW, bool PLAIN_NHWC, bool FOLDED_NHWC>
__global__ void __launch_bounds__(256) fold_pack(const T* __restrict__ src, T* __restrict__ dst, int H, int W,
                                                 int PH, int PW, int HB, int WB)
{
    constexpr int CF = C * SH * SW;
    const long long n = blockIdx.z;
    int cf, hb, wb;
    long long o;
    if (!written_element<FOLDED_NHWC>(CF, HB, WB, cf, hb, wb, o)) return;
    const int c = cf % C, ij = cf / C;
    const int h = hb * SH + ij / SW - PH, w = wb * SW + ij % SW - PW;
    T v = from_float<T>(0.f);
    if (h >= 0 && h < H && w >= 0 && w < W)
        v = PLAIN_NHWC ? src[((n * H + h) * W + w) * C + c] : src[((n * C + c) * H + h) * W + w];
    dst[o] = v;
}

template <typename T, int C, int SH, int SW, bool PLAIN_NHWC, bool FOLDED_NHWC>
__global__ void __launch_bounds__(256) fold_unpack(const T* __restrict__ src, T* __restrict__ dst, int H, int W,
                                                   int PH, int PW, int HB, int WB, float alpha, float beta)
{
    constexpr int CF = C * SH * SW;
    const long long n = blockIdx.z;
    int c, h, w;
    long long o;
    if (!written_element<PLAIN_NHWC>(C, H, W, c, h, w, o)) return;
    const int hp = h + PH, wp = w + PW;
    const int hb = hp / SH, wb = wp / SW;
    float v = 0.f;
    if (hb < HB && wb < WB) {
        const int cf = ((hp % SH) * SW + wp % SW) * C + c;
        v = to_float(FOLDED_NHWC ? src[((n * HB + hb) * WB + wb) * (long long)CF + cf]
                                 : src[((n * CF + cf) * HB + hb) * (long long)WB + wb]);
    }
    v *= alpha;
    if (beta != 0.f) v += beta * to_float(dst[o]);
    dst[o] = from_float<T>(v);
}

#ifdef UCUDNN_NVCC_CHECK
template __global__ void fold_pack<float, 3, 4, 4, true, true>(const float*, float*, int, int, int, int, int, int);
template __global__ void fold_pack<float, 3, 4, 4, false, true>(const float*, float*, int, int, int, int, int, int);
template __global__ void fold_pack<half_t, 3, 2, 2, true, false>(const half_t*, half_t*, int, int, int, int, int, int);
template __global__ void fold_unpack<float, 3, 4, 4, false, true>(const float*, float*, int, int, int, int, int, int, float,
                                                                  float);
template __global__ void fold_unpack<half_t, 3, 2, 2, false, false>(const half_t*, half_t*, int, int, int, int, int, int,
                                                                    float, float);
#endif
