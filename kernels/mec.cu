// MEC's compact lowering (seed 002, Algorithm 2, lines 4-6) and its adjoint, for the mec algorithm source (issue 17).
//
// NHWC input x [N, H, W, C]; lowered L [N, Q, LH, S, C] with
//     L[n, q, hh, j, c] = x[n, hh - PH, q*SW + j - PW, c]   (0 where that falls into the padding)
// LH = (P - 1)*SH + R rows: the padded rows some window reaches.  The GEMMs (cuBLAS, launched by the source)
// multiply column partitions of L's rows by the filter; see kernels/mec.py for their description.
//
// mec_lower:     x -> L, every element of L written.  One L row (n, q) is LH runs of S*C elements, each run
//                contiguous in x as well (S adjacent columns, all channels), so both sides are coalesced.
//                Grid (ceil(LH*S*C / 256), Q, N).
// mec_gather_dx: dL -> dx, dx = alpha * sum + beta * dx (dx not read when beta == 0): each dx element sums the
//                dL entries it was lowered to -- row hh = h + PH of the lowered rows q whose window covers
//                column wp = w + PW, tap j = wp - q*SW -- a gather, so no atomics and a fixed summation order.
//                (Vertical overlaps were summed already, by the GEMMs that wrote dL.)  Grid (ceil(W*C / 256), H, N).
// mec_swap:      dst[b][a][e] = src[a][b][e] (a < A, b < B, e < E words of type W): the two outer dimensions of a
//                tensor exchanged, rows of E words moved whole (coalesced on both sides).  Solution A's h-n-w-c
//                output back to n-h-w-c (Algorithm 2, lines 14-19), and dy (n-h-w-c) to h-n-w-c for the
//                backward GEMMs that run all samples of an output row at once.  W is the widest word (2-16 bytes)
//                the row and both pointers allow.  Grid (ceil(E / 256), min(B, 65535), min(A, 65535)), strided.
// Index math mirrored in Python (mec.py: lowered_source, dx_gather_range) and tested there on the CPU.
#include "common.cuh"

template <typename T>
__global__ void __launch_bounds__(256) mec_lower(const T* __restrict__ x, T* __restrict__ L, int C, int H, int W,
                                                 int S, int PH, int PW, int SW, int Q, int LH)
{
    const int sc = S * C;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= LH * sc) return;
    const long long n = blockIdx.z;
    const int q = blockIdx.y;
    const int hh = t / sc, rem = t - hh * sc;
    const int j = rem / C, c = rem - j * C;
    const int h = hh - PH, w = q * SW + j - PW;
    T v = from_float<T>(0.f);
    if (h >= 0 && h < H && w >= 0 && w < W) v = x[((n * H + h) * W + w) * C + c];
    L[(n * Q + q) * (long long)(LH * sc) + t] = v;
}

template <typename T>
__global__ void __launch_bounds__(256) mec_gather_dx(const T* __restrict__ dL, T* __restrict__ dx, int C, int H,
                                                     int W, int S, int PH, int PW, int SW, int Q, int LH,
                                                     float alpha, float beta)
{
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= W * C) return;
    const long long n = blockIdx.z;
    const int h = blockIdx.y;
    const int w = t / C, c = t - w * C;
    const int hh = h + PH, wp = w + PW;
    float v = 0.f;
    if (hh < LH) {
        const int q0 = wp >= S ? (wp - S) / SW + 1 : 0;
        const int q1 = min(Q - 1, wp / SW);
        const long long row = (long long)LH * S * C;
        for (int q = q0; q <= q1; ++q)
            v += to_float(dL[(n * Q + q) * row + ((long long)hh * S + (wp - q * SW)) * C + c]);
    }
    v *= alpha;
    const long long o = (n * H + h) * (long long)(W * C) + t;
    if (beta != 0.f) v += beta * to_float(dx[o]);
    dx[o] = from_float<T>(v);
}

template <typename W>
__global__ void __launch_bounds__(256) mec_swap(const W* __restrict__ src, W* __restrict__ dst, int A, int B, int E)
{
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= E) return;
    for (long long a = blockIdx.z; a < A; a += gridDim.z)
        for (long long b = blockIdx.y; b < B; b += gridDim.y)
            dst[(b * A + a) * E + e] = src[(a * B + b) * E + e];
}

#ifdef UCUDNN_NVCC_CHECK
template __global__ void mec_lower<float>(const float*, float*, int, int, int, int, int, int, int, int, int);
template __global__ void mec_lower<half_t>(const half_t*, half_t*, int, int, int, int, int, int, int, int, int);
template __global__ void mec_gather_dx<float>(const float*, float*, int, int, int, int, int, int, int, int, int,
                                              float, float);
template __global__ void mec_gather_dx<half_t>(const half_t*, half_t*, int, int, int, int, int, int, int, int, int,
                                               float, float);
template __global__ void mec_swap<unsigned short>(const unsigned short*, unsigned short*, int, int, int);
template __global__ void mec_swap<unsigned int>(const unsigned int*, unsigned int*, int, int, int);
template __global__ void mec_swap<uint2>(const uint2*, uint2*, int, int, int);
template __global__ void mec_swap<uint4>(const uint4*, uint4*, int, int, int);
#endif
