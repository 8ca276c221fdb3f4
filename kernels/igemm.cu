// Implicit-GEMM convolution in FP32 on the FMA units: forward, backward data and backward filter, no workspace
// (issue 17; kernels/igemm.py describes the GEMM each op is and emulates this index math on the CPU).
//
// Why: under a tight workspace limit cuDNN keeps its zero-workspace FP32 kernels, which run AlexNet's layers at
// 11-20 TFLOPS on an H100; an explicit lowering (mec) needs workspace per sample, so within 8 MiB its GEMMs stay
// small.  Gathering the lowered operand straight from the tensors gives one GEMM over the whole micro-batch
// (M = N*P*Q output pixels for forward) at no workspace: the classic 128 x 128 x 8 SGEMM tile, 256 threads of
// 8 x 8 outputs each, shared-memory double buffering with the next tile's loads in flight during the FMAs.
//
// One kernel body for the three ops (OP), each a GEMM C[M][NC] = sum_kk A[M][kk] B[kk][NC]:
//   forward          M = (n,p,q)  NC = k        kk = (c,r,s)  A = x gathered   B = w           C = y
//   backward data    M = (n,h,w)  NC = c        kk = (k,r,s)  A = dy gathered  B = w           C = dx
//   backward filter  M = k        NC = (c,r,s)  kk = (n,p,q)  A = dy           B = x gathered  C = dw (split kk)
// Tensors are addressed through element strides (x: n,c,h,w; w: k,c,r,s; y: n,k,p,q), so one body serves NCHW,
// NHWC and channel slices of y.  A_K / B_K pick which way a thread's four loads run (along kk, or along M / NC):
// the launcher picks the one that is contiguous in memory, so a warp's loads coalesce.  CIN orders (c,r,s) and
// (k,r,s) channel-innermost (NHWC) or tap-innermost (NCHW); VA / VB make a thread's four loads one float4 where
// they are contiguous and 16-byte aligned (the launcher checks): four kk of one row / column (A_K / B_K), else
// four consecutive rows / columns of one kk (NHWC channels: backward filter's dy and x, backward data's w).
// Backward filter with gridDim.z > 1 splits the reduction and adds with atomicAdd into dw, which igemm_scale has
// multiplied by beta first (not deterministic).
#include "common.cuh"

#define IG_BM 128
#define IG_BN 128
#define IG_BK 8
#define IG_NT 256
#define IG_LD 132   // shared row length: 128 + 4, so the along-kk stores of two threads of one row use other banks

enum : int { IG_FWD = 0, IG_BWD_DATA = 1, IG_BWD_FILTER = 2 };

struct IgConv {
    int N, C, H, W, K, P, Q, R, S, ph, pw, sh, sw, dh, dw;
    long long xs[4], ws[4], ys[4];   // element strides: x (n,c,h,w), w (k,c,r,s), y (n,k,p,q)
};

// (ch, r, s) of a flat index over CH channels and R x S taps: channel innermost (CIN) or tap innermost
template <bool CIN> __device__ __forceinline__ void ig_split(int idx, int CH, int R, int S, int& ch, int& r, int& s) {
    if constexpr (CIN) {
        const int t = idx / CH;
        ch = idx - t * CH;
        r = t / S;
        s = t - r * S;
    } else {
        const int t = idx / S;
        s = idx - t * S;
        ch = t / R;
        r = t - ch * R;
    }
}

template <bool CIN> __device__ __forceinline__ void ig_next(int CH, int R, int S, int& ch, int& r, int& s) {
    if constexpr (CIN) {
        if (++ch == CH) { ch = 0; if (++s == S) { s = 0; ++r; } }
    } else {
        if (++s == S) { s = 0; if (++r == R) { r = 0; ++ch; } }
    }
}

// (n, a, b) of a flat index over N x A x B (row-major): output or input pixels
__device__ __forceinline__ void ig_pixel(int idx, int A, int B, int& n, int& a, int& b) {
    const int t = idx / B;
    b = idx - t * B;
    n = t / A;
    a = t - n * A;
}

// p of h + pad - r * dil = p * stride (backward data's gather), or -1 when no output row lands there
__device__ __forceinline__ int ig_back(int v, int stride, int P) {
    if (v < 0) return -1;
    int p = v;
    if (stride != 1) {
        p = v / stride;
        if (p * stride != v) return -1;
    }
    return p < P ? p : -1;
}

// What one thread loads of A (rows of M) and B (columns of NC) per kk step: four values each, in registers, then
// stored to shared memory as As[kk][m] / Bs[kk][n].  Fixed coordinates (a thread's rows or columns) are decoded once.
template <int OP, bool A_K, bool B_K, bool CIN, bool VA, bool VB, int BN_>
struct IgLoader {
    // B's four-per-thread loads (along kk, or float4 along NC) need 128 threads for a 64-wide tile: the other
    // warps load no B; B's scalar loads along NC take BN_ / 32 columns a thread
    static constexpr int BC = (B_K || VB) ? 1 : BN_ / 32;
    const IgConv& g;
    const float* __restrict__ a_ptr;
    const float* __restrict__ b_ptr;
    int M, NC, KR;
    // A: along kk -> one row (am[0]); along M -> four rows (am[0..3]) 32 apart
    long long a_base[4];
    int a_h[4], a_w[4];
    bool a_ok[4];
    // B: along kk -> one column; along NC -> four columns 32 apart
    long long b_base[4];
    int b_h[4], b_w[4];
    bool b_ok[4];
    int a_row, a_k0, b_col, b_k0;   // this thread's first row / column and kk offset within a tile
    bool b_on;                      // this thread loads B

    __device__ __forceinline__ IgLoader(const IgConv& conv, const float* a, const float* b, int m0, int n0, int M_,
                                        int NC_, int KR_)
        : g(conv), a_ptr(a), b_ptr(b), M(M_), NC(NC_), KR(KR_) {
        const int tid = threadIdx.x;
        if constexpr (A_K) { a_row = tid >> 1; a_k0 = (tid & 1) * 4; }
        else { a_row = VA ? (tid & 31) * 4 : tid & 31; a_k0 = tid >> 5; }
        if constexpr (B_K) { b_col = tid >> 1; b_k0 = (tid & 1) * 4; }
        else if constexpr (VB) { b_col = (tid & (BN_ / 4 - 1)) * 4; b_k0 = tid / (BN_ / 4); }
        else { b_col = tid & 31; b_k0 = tid >> 5; }
        b_on = BC > 1 || (b_col < BN_ && b_k0 < IG_BK);
        constexpr int AR = (A_K || VA) ? 1 : 4;
#pragma unroll
        for (int i = 0; i < AR; ++i) {
            const int m = m0 + a_row + 32 * i;
            a_ok[i] = m < M;
            const int mm = a_ok[i] ? m : 0;
            if constexpr (OP == IG_FWD) {            // m = (n, p, q): the input window's corner
                int n, p, q;
                ig_pixel(mm, g.P, g.Q, n, p, q);
                a_base[i] = n * g.xs[0];
                a_h[i] = p * g.sh - g.ph;
                a_w[i] = q * g.sw - g.pw;
            } else if constexpr (OP == IG_BWD_DATA) { // m = (n, h, w): padded coordinates
                int n, h, w;
                ig_pixel(mm, g.H, g.W, n, h, w);
                a_base[i] = n * g.ys[0];
                a_h[i] = h + g.ph;
                a_w[i] = w + g.pw;
            } else {                                  // m = k
                a_base[i] = mm * g.ys[1];
                a_h[i] = a_w[i] = 0;
            }
        }
#pragma unroll
        for (int j = 0; j < BC; ++j) {
            const int col = n0 + b_col + 32 * j;
            b_ok[j] = col < NC;
            const int cc = b_ok[j] ? col : 0;
            if constexpr (OP == IG_FWD) {             // col = k
                b_base[j] = cc * g.ws[0];
                b_h[j] = b_w[j] = 0;
            } else if constexpr (OP == IG_BWD_DATA) { // col = c
                b_base[j] = cc * g.ws[1];
                b_h[j] = b_w[j] = 0;
            } else {                                  // col = (c, r, s): the tap's offset into the input window
                int c, r, s;
                ig_split<CIN>(cc, g.C, g.R, g.S, c, r, s);
                b_base[j] = c * g.xs[1];
                b_h[j] = r * g.dh - g.ph;
                b_w[j] = s * g.dw - g.pw;
            }
        }
    }

    // A[m][kk] for a thread's row i at decoded kk coordinates (forward: c,r,s; backward data: k,r,s; filter: n,p,q)
    __device__ __forceinline__ float a_at(int i, int u, int v, int z) const {
        if constexpr (OP == IG_FWD) {
            const int h = a_h[i] + v * g.dh, w = a_w[i] + z * g.dw;
            if (!a_ok[i] || (unsigned)h >= (unsigned)g.H || (unsigned)w >= (unsigned)g.W) return 0.f;
            return __ldg(a_ptr + a_base[i] + u * g.xs[1] + h * g.xs[2] + w * g.xs[3]);
        } else if constexpr (OP == IG_BWD_DATA) {
            const int p = ig_back(a_h[i] - v * g.dh, g.sh, g.P), q = ig_back(a_w[i] - z * g.dw, g.sw, g.Q);
            if (!a_ok[i] || p < 0 || q < 0) return 0.f;
            return __ldg(a_ptr + a_base[i] + u * g.ys[1] + p * g.ys[2] + q * g.ys[3]);
        } else {
            if (!a_ok[i]) return 0.f;
            return __ldg(a_ptr + a_base[i] + u * g.ys[0] + v * g.ys[2] + z * g.ys[3]);
        }
    }

    // B[kk][col] for a thread's column j at decoded kk coordinates
    __device__ __forceinline__ float b_at(int j, int u, int v, int z) const {
        if (!b_ok[j]) return 0.f;
        if constexpr (OP == IG_FWD) {
            return __ldg(b_ptr + b_base[j] + u * g.ws[1] + v * g.ws[2] + z * g.ws[3]);
        } else if constexpr (OP == IG_BWD_DATA) {
            return __ldg(b_ptr + b_base[j] + u * g.ws[0] + v * g.ws[2] + z * g.ws[3]);
        } else {
            const int h = v * g.sh + b_h[j], w = z * g.sw + b_w[j];
            if ((unsigned)h >= (unsigned)g.H || (unsigned)w >= (unsigned)g.W) return 0.f;
            return __ldg(b_ptr + b_base[j] + u * g.xs[0] + h * g.xs[2] + w * g.xs[3]);
        }
    }

    // kk -> (u, v, z) as the op's reduction decodes it
    __device__ __forceinline__ void split_kk(int kk, int& u, int& v, int& z) const {
        if constexpr (OP == IG_FWD) ig_split<CIN>(kk, g.C, g.R, g.S, u, v, z);
        else if constexpr (OP == IG_BWD_DATA) ig_split<CIN>(kk, g.K, g.R, g.S, u, v, z);
        else ig_pixel(kk, g.P, g.Q, u, v, z);
    }

    __device__ __forceinline__ void next_kk(int& u, int& v, int& z) const {
        if constexpr (OP == IG_FWD) ig_next<CIN>(g.C, g.R, g.S, u, v, z);
        else if constexpr (OP == IG_BWD_DATA) ig_next<CIN>(g.K, g.R, g.S, u, v, z);
        else { if (++z == g.Q) { z = 0; if (++v == g.P) { v = 0; ++u; } } }
    }

    __device__ __forceinline__ void load(int kb, float (&ra)[4], float (&rb)[4]) const {
        if constexpr (A_K) {                       // one row, kk = kb + a_k0 + 0..3
            const int kk = kb + a_k0;
            int u, v, z;
            split_kk(kk < KR ? kk : 0, u, v, z);
            if constexpr (VA) {                    // four channels of one tap, contiguous and aligned
                float4 f = make_float4(0.f, 0.f, 0.f, 0.f);
                if (kk < KR) {
                    if constexpr (OP == IG_FWD) {
                        const int h = a_h[0] + v * g.dh, w = a_w[0] + z * g.dw;
                        if (a_ok[0] && (unsigned)h < (unsigned)g.H && (unsigned)w < (unsigned)g.W)
                            f = __ldg(reinterpret_cast<const float4*>(a_ptr + a_base[0] + u * g.xs[1] + h * g.xs[2] +
                                                                     w * g.xs[3]));
                    } else {
                        const int p = ig_back(a_h[0] - v * g.dh, g.sh, g.P), q = ig_back(a_w[0] - z * g.dw, g.sw, g.Q);
                        if (a_ok[0] && p >= 0 && q >= 0)
                            f = __ldg(reinterpret_cast<const float4*>(a_ptr + a_base[0] + u * g.ys[1] + p * g.ys[2] +
                                                                     q * g.ys[3]));
                    }
                }
                ra[0] = f.x; ra[1] = f.y; ra[2] = f.z; ra[3] = f.w;
            } else {
#pragma unroll
                for (int t = 0; t < 4; ++t) {
                    ra[t] = kk + t < KR ? a_at(0, u, v, z) : 0.f;
                    if (t < 3) next_kk(u, v, z);
                }
            }
        } else if constexpr (VA) {                 // backward filter, NHWC: dy[n][p][q][k..k+3] of one kk
            const int kk = kb + a_k0;
            float4 f = make_float4(0.f, 0.f, 0.f, 0.f);
            if (kk < KR && a_ok[0]) {
                int u, v, z;
                split_kk(kk, u, v, z);
                f = __ldg(reinterpret_cast<const float4*>(a_ptr + a_base[0] + u * g.ys[0] + v * g.ys[2] + z * g.ys[3]));
            }
            ra[0] = f.x; ra[1] = f.y; ra[2] = f.z; ra[3] = f.w;
        } else {                                   // four rows 32 apart, one kk = kb + a_k0
            const int kk = kb + a_k0;
            int u, v, z;
            split_kk(kk < KR ? kk : 0, u, v, z);
#pragma unroll
            for (int i = 0; i < 4; ++i) ra[i] = kk < KR ? a_at(i, u, v, z) : 0.f;
        }
        if (!b_on) return;
        if constexpr (B_K) {                       // one column, kk = kb + b_k0 + 0..3
            const int kk = kb + b_k0;
            if constexpr (VB) {                    // forward's packed filter: w[k][kk..kk+3], aligned
                float4 f = make_float4(0.f, 0.f, 0.f, 0.f);
                if (b_ok[0] && kk < KR) f = __ldg(reinterpret_cast<const float4*>(b_ptr + b_base[0] + kk));
                rb[0] = f.x; rb[1] = f.y; rb[2] = f.z; rb[3] = f.w;
            } else {
                int u, v, z;
                split_kk(kk < KR ? kk : 0, u, v, z);
#pragma unroll
                for (int t = 0; t < 4; ++t) {
                    rb[t] = kk + t < KR ? b_at(0, u, v, z) : 0.f;
                    if (t < 3) next_kk(u, v, z);
                }
            }
        } else if constexpr (VB) {                 // four channels of one kk: backward data's w, filter's x
            const int kk = kb + b_k0;
            float4 f = make_float4(0.f, 0.f, 0.f, 0.f);
            if (kk < KR && b_ok[0]) {
                int u, v, z;
                split_kk(kk, u, v, z);
                if constexpr (OP == IG_BWD_DATA) {
                    f = __ldg(reinterpret_cast<const float4*>(b_ptr + b_base[0] + u * g.ws[0] + v * g.ws[2] +
                                                             z * g.ws[3]));
                } else {
                    const int h = v * g.sh + b_h[0], w = z * g.sw + b_w[0];
                    if ((unsigned)h < (unsigned)g.H && (unsigned)w < (unsigned)g.W)
                        f = __ldg(reinterpret_cast<const float4*>(b_ptr + b_base[0] + u * g.xs[0] + h * g.xs[2] +
                                                                 w * g.xs[3]));
                }
            }
            rb[0] = f.x; rb[1] = f.y; rb[2] = f.z; rb[3] = f.w;
        } else {                                   // four columns 32 apart, one kk = kb + b_k0
            const int kk = kb + b_k0;
            int u, v, z;
            split_kk(kk < KR ? kk : 0, u, v, z);
#pragma unroll
            for (int j = 0; j < BC; ++j) rb[j] = kk < KR ? b_at(j, u, v, z) : 0.f;
        }
    }

    __device__ __forceinline__ void store(float (*As)[IG_LD], float (*Bs)[IG_LD], const float (&ra)[4],
                                          const float (&rb)[4]) const {
        if constexpr (!A_K && VA)
            *reinterpret_cast<float4*>(&As[a_k0][a_row]) = make_float4(ra[0], ra[1], ra[2], ra[3]);
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            if constexpr (A_K) As[a_k0 + t][a_row] = ra[t];
            else if constexpr (!VA) As[a_k0][a_row + 32 * t] = ra[t];
        }
        if (!b_on) return;
        if constexpr (!B_K && VB)
            *reinterpret_cast<float4*>(&Bs[b_k0][b_col]) = make_float4(rb[0], rb[1], rb[2], rb[3]);
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            if constexpr (B_K) Bs[b_k0 + t][b_col] = rb[t];
            else if constexpr (!VB) { if (t < BC) Bs[b_k0][b_col + 32 * t] = rb[t]; }
        }
    }
};

// Where C[m][col] lives: y (forward), dx (backward data), dw (backward filter)
template <int OP, bool CIN>
__device__ __forceinline__ long long ig_out_row(const IgConv& g, int m) {
    if constexpr (OP == IG_FWD) {
        int n, p, q;
        ig_pixel(m, g.P, g.Q, n, p, q);
        return n * g.ys[0] + p * g.ys[2] + q * g.ys[3];
    } else if constexpr (OP == IG_BWD_DATA) {
        int n, h, w;
        ig_pixel(m, g.H, g.W, n, h, w);
        return n * g.xs[0] + h * g.xs[2] + w * g.xs[3];
    } else {
        return m * g.ws[0];
    }
}

template <int OP, bool CIN>
__device__ __forceinline__ long long ig_out_col(const IgConv& g, int col) {
    if constexpr (OP == IG_FWD) {
        return col * g.ys[1];
    } else if constexpr (OP == IG_BWD_DATA) {
        return col * g.xs[1];
    } else {
        int c, r, s;
        ig_split<CIN>(col, g.C, g.R, g.S, c, r, s);
        return c * g.ws[1] + r * g.ws[2] + s * g.ws[3];
    }
}

// out = alpha * A B + beta * out over this block's 128 x BN_ tile and its kk range (blockIdx.z's share of
// kk_per_split); a split backward filter adds alpha * A B atomically instead.  BN_ = 64 for narrow GEMMs (64
// output channels: a 128-wide tile would leave half its columns idle), each thread then 8 x 4 outputs.  KS stages
// of IG_BK reduction elements per shared-memory buffer: one barrier per KS * 8 steps.
template <int OP, bool A_K, bool B_K, bool CIN, bool VA, bool VB, int BN_, int KS>
__global__ void __launch_bounds__(IG_NT, 2)
igemm_conv(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out, int N, int C, int H,
           int W, int K, int P, int Q, int R, int S, int ph, int pw, int sh, int sw, int dh, int dw, long long xs0,
           long long xs1, long long xs2, long long xs3, long long ws0, long long ws1, long long ws2, long long ws3,
           long long ys0, long long ys1, long long ys2, long long ys3, int M, int NC, int KR, int kk_per_split,
           float alpha, float beta) {
    static_assert(!VA || (A_K ? OP != IG_BWD_FILTER : OP == IG_BWD_FILTER), "A's float4 loads: see the header");
    static_assert(!VB || (B_K ? OP == IG_FWD : OP != IG_FWD), "B's float4 loads: see the header");
    static_assert(BN_ == 128 || BN_ == 64, "tile widths: 128 or 64");
    constexpr int TN = BN_ / 16;       // a thread's columns: tx * 4 + 0..3 (and + 64 for the 128-wide tile)
    constexpr int SK = KS * IG_BK;     // reduction elements per buffer
    const IgConv g{N, C, H, W, K, P, Q, R, S, ph, pw, sh, sw, dh, dw, {xs0, xs1, xs2, xs3}, {ws0, ws1, ws2, ws3},
                   {ys0, ys1, ys2, ys3}};
    __shared__ __align__(16) float As[2][SK][IG_LD];
    __shared__ __align__(16) float Bs[2][SK][IG_LD];
    const int m0 = blockIdx.x * IG_BM, n0 = blockIdx.y * BN_;
    const int k_begin = blockIdx.z * kk_per_split;
    const int k_end = min(KR, k_begin + kk_per_split);
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    IgLoader<OP, A_K, B_K, CIN, VA, VB, BN_> ld(g, a, b, m0, n0, M, NC, k_end);

    float acc[8][TN];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;

    float ra[KS][4], rb[KS][4];
#pragma unroll
    for (int t = 0; t < KS; ++t) {
        ld.load(k_begin + t * IG_BK, ra[t], rb[t]);
        ld.store(As[0] + t * IG_BK, Bs[0] + t * IG_BK, ra[t], rb[t]);
    }
    __syncthreads();
    int buf = 0;
    for (int kb = k_begin; kb < k_end; kb += SK) {
        const bool more = kb + SK < k_end;
        if (more) {
#pragma unroll
            for (int t = 0; t < KS; ++t) ld.load(kb + SK + t * IG_BK, ra[t], rb[t]);
        }
#pragma unroll
        for (int kk = 0; kk < SK; ++kk) {
            const float4 a0 = *reinterpret_cast<const float4*>(&As[buf][kk][ty * 4]);
            const float4 a1 = *reinterpret_cast<const float4*>(&As[buf][kk][ty * 4 + 64]);
            const float4 b0 = *reinterpret_cast<const float4*>(&Bs[buf][kk][tx * 4]);
            const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            float bv[8] = {b0.x, b0.y, b0.z, b0.w, 0.f, 0.f, 0.f, 0.f};
            if constexpr (TN == 8) {
                const float4 b1 = *reinterpret_cast<const float4*>(&Bs[buf][kk][tx * 4 + 64]);
                bv[4] = b1.x; bv[5] = b1.y; bv[6] = b1.z; bv[7] = b1.w;
            }
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        if (more) {
#pragma unroll
            for (int t = 0; t < KS; ++t) ld.store(As[buf ^ 1] + t * IG_BK, Bs[buf ^ 1] + t * IG_BK, ra[t], rb[t]);
        }
        __syncthreads();
        buf ^= 1;
    }

    const bool split = gridDim.z > 1;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int m = m0 + ty * 4 + (i & 3) + (i >> 2) * 64;
        if (m >= M) continue;
        const long long row = ig_out_row<OP, CIN>(g, m);
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int col = n0 + tx * 4 + (j & 3) + (j >> 2) * 64;
            if (col >= NC) continue;
            float* dst = out + row + ig_out_col<OP, CIN>(g, col);
            const float v = alpha * acc[i][j];
            if (split) atomicAdd(dst, v);
            else *dst = beta == 0.f ? v : fmaf(beta, *dst, v);
        }
    }
}

// out *= beta (0: cleared), before a split backward filter adds its partial sums; dw is packed (count elements)
__global__ void igemm_scale(float* __restrict__ out, long long count, float beta) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < count;
         i += (long long)gridDim.x * blockDim.x)
        out[i] = beta == 0.f ? 0.f : beta * out[i];
}

#ifdef UCUDNN_NVCC_CHECK
#define IGEMM_ARGS const float*, const float*, float*, int, int, int, int, int, int, int, int, int, int, int, int, \
    int, int, int, long long, long long, long long, long long, long long, long long, long long, long long, long long, \
    long long, long long, long long, int, int, int, int, float, float
template __global__ void igemm_conv<IG_FWD, true, true, true, true, true, 128, 1>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_FWD, true, true, true, true, true, 128, 2>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_FWD, true, true, true, true, true, 64, 1>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_FWD, true, true, true, true, true, 64, 2>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_FWD, false, true, false, false, true, 128, 1>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_FWD, false, true, false, false, true, 128, 2>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_FWD, false, true, false, false, true, 64, 1>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_FWD, false, true, false, false, true, 64, 2>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_FWD, true, true, true, false, false, 128, 1>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_FWD, true, true, true, false, false, 128, 2>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_FWD, true, true, true, false, false, 64, 1>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_FWD, true, true, true, false, false, 64, 2>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_DATA, true, false, true, true, false, 128, 1>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_DATA, true, false, true, true, false, 128, 2>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_DATA, true, false, true, true, false, 64, 1>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_DATA, true, false, true, true, false, 64, 2>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_DATA, false, true, false, false, false, 128, 1>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_DATA, false, true, false, false, false, 128, 2>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_DATA, false, true, false, false, false, 64, 1>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_DATA, false, true, false, false, false, 64, 2>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_FILTER, false, false, true, false, false, 128, 1>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_FILTER, false, false, true, false, false, 128, 2>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_FILTER, false, false, true, false, false, 64, 1>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_FILTER, false, false, true, false, false, 64, 2>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_FILTER, false, false, true, true, true, 128, 1>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_FILTER, false, false, true, true, true, 128, 2>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_FILTER, false, false, true, true, true, 64, 1>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_FILTER, false, false, true, true, true, 64, 2>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_DATA, true, false, true, true, true, 128, 1>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_DATA, true, false, true, true, true, 128, 2>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_DATA, true, false, true, true, true, 64, 1>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_DATA, true, false, true, true, true, 64, 2>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_FILTER, true, true, false, false, false, 128, 1>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_FILTER, true, true, false, false, false, 128, 2>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_FILTER, true, true, false, false, false, 64, 1>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_FILTER, true, true, false, false, false, 64, 2>(IGEMM_ARGS);
#endif
