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
//
// Backward data has a second form, scatter (OP = IG_BWD_SCATTER): M = (n,p,q) of dy, NC = (c,r,s), kk = k, so
// C = dy w is the lowered dx (col2im's columns) and each element is added atomically into dx at its tap's pixel,
// after igemm_scale(beta).  Why: the gather form's rows are dx pixels and its reduction walks every (k,r,s), most of
// which no dy pixel reaches at stride > 1 (AlexNet conv1, 11x11 stride 4: 1/16 of the taps), and its columns are
// dx's C channels (3 for a first layer: a 64-wide tile nearly idle).  Not deterministic.
//
// The epilogue stores float4 where four rows (LM: lanes along rows, NCHW y / dx, a plane's pixels) or four columns
// (NHWC y / dx, packed dw) are four consecutive floats (vec_out, from the launcher); else one float at a time.
#include "common.cuh"

#define IG_BM 128
#define IG_BN 128
#define IG_BK 8
#define IG_NT 256
#define IG_LD 132   // shared row length: 128 + 4, so the along-kk stores of two threads of one row use other banks

enum : int { IG_FWD = 0, IG_BWD_DATA = 1, IG_BWD_FILTER = 2, IG_BWD_SCATTER = 3 };

struct IgConv {
    int N, C, H, W, K, P, Q, R, S, ph, pw, sh, sw, dh, dw;
    // element strides: x (n,c,h,w), w (k,c,r,s), y (n,k,p,q); 32-bit offsets, as igemm.py refuses tensors of 2^30
    // elements or more (MAX_ELEMENTS; the planner runs smaller micro-batches): a 64-bit address chain per load was
    // a tenth of the loop's instructions
    int xs[4], ws[4], ys[4];
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

// (ch, r, s) of idx + IG_BK from those of idx, in the order ig_split<CIN> decodes (a pixel index (n, p, q) is the
// tap-innermost order with CH, R, S = N, P, Q): a carry chain instead of the two divisions a decode costs, per
// tile load (ncu, H200, AlexNet conv2 backward data: half of the kernel's instructions were not FMAs).  True where
// the step carried into the outer coordinates (the loader then recomputes what it caches of them).  igemm.advance
// is the same chain on the CPU, tested against the decode.
template <bool CIN> __device__ __forceinline__ bool ig_advance(int CH, int R, int S, int& ch, int& r, int& s) {
    if constexpr (CIN) {
        ch += IG_BK;
        if (ch < CH) return false;
        do { ch -= CH; if (++s == S) { s = 0; ++r; } } while (ch >= CH);
    } else {
        s += IG_BK;
        if (s < S) return false;
        do { s -= S; if (++r == R) { r = 0; ++ch; } } while (s >= S);
    }
    return true;
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
    int a_base[4];
    int a_h[4], a_w[4];
    int a_corner[4];   // forward: the offset of the row's input window corner (may lie outside x: padding)
    bool a_ok[4];
    // B: along kk -> one column; along NC -> four columns 32 apart
    int b_base[4];
    int b_h[4], b_w[4];
    bool b_ok[4];
    int a_row, a_k0, b_col, b_k0;   // this thread's first row / column and kk offset within a tile
    bool b_on;                      // this thread loads B
    // the reduction index of this thread's next A and B loads and its decoded (u, v, z): each load() moves them
    // IG_BK on (the kernel loads its stages in order, IG_BK apart) by a carry chain, not the two divisions a decode
    // costs (conv2 backward data 9.87 vs 10.47 ms, backward filter 7.66 vs 8.26; forward too since its B stopped
    // decoding: H200, AlexNet NCHW forward 1.11x, C = 1 layers 1.02-1.09x, measured against the decode)
    int a_kk, a_u, a_v, a_z, b_kk, b_u, b_v, b_z;
    // float4 loads cache what depends on the outer coordinates: the offset of the tap's pixel (forward, backward
    // data: the innermost coordinate is the channel) or of the row of pixels (backward filter: the innermost is q)
    // and whether it is inside the tensor, recomputed only when a step carries (every C / 8 stages for NHWC
    // forward), so a stage's load is one multiply-add and a predicate.  Why: the per-stage decode, bounds checks and
    // address chain were ~130 of ~580 instructions a stage (SASS, backward data, 96-wide tile).
    static constexpr bool A_TAP = VA;
    static constexpr bool B_TAP = VB && OP != IG_FWD;
    // forward's packed filter needs only kk (w[k][kk], whichever the layout); where a thread's A and B loads take
    // the same kk (both along kk, or both along rows / columns with the same kk offset) B reads A's coordinates:
    // fewer registers (the 128-register cap of two blocks per SM) and one carry chain
    static constexpr bool B_CARRY = OP != IG_FWD;
    static constexpr bool SHARED = B_CARRY && A_K == B_K && (A_K || !VB || BN_ == 128);
    int a_tap, b_tap;
    bool a_in, b_in;

    __device__ __forceinline__ IgLoader(const IgConv& conv, const float* a, const float* b, int m0, int n0, int M_,
                                        int NC_, int KR_, int k_begin)
        : g(conv), a_ptr(a), b_ptr(b), M(M_), NC(NC_), KR(KR_) {
        const int tid = threadIdx.x;
        if constexpr (A_K) { a_row = tid >> 1; a_k0 = (tid & 1) * 4; }
        else { a_row = VA ? (tid & 31) * 4 : tid & 31; a_k0 = tid >> 5; }
        if constexpr (B_K) { b_col = tid >> 1; b_k0 = (tid & 1) * 4; }
        else if constexpr (VB) { b_col = (tid % (BN_ / 4)) * 4; b_k0 = tid / (BN_ / 4); }
        else { b_col = tid & 31; b_k0 = tid >> 5; }
        b_on = BC > 1 || (b_col < BN_ && b_k0 < IG_BK);
        a_kk = k_begin + a_k0;
        b_kk = k_begin + b_k0;
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
                a_corner[i] = a_base[i] + a_h[i] * g.xs[2] + a_w[i] * g.xs[3];
            } else if constexpr (OP == IG_BWD_DATA) { // m = (n, h, w): padded coordinates
                int n, h, w;
                ig_pixel(mm, g.H, g.W, n, h, w);
                a_base[i] = n * g.ys[0];
                a_h[i] = h + g.ph;
                a_w[i] = w + g.pw;
            } else if constexpr (OP == IG_BWD_SCATTER) { // m = (n, p, q): dy's pixel
                int n, p, q;
                ig_pixel(mm, g.P, g.Q, n, p, q);
                a_base[i] = n * g.ys[0] + p * g.ys[2] + q * g.ys[3];
                a_h[i] = a_w[i] = 0;
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
            } else if constexpr (OP == IG_BWD_SCATTER) { // col = (c, r, s): packed, so w[k] + col
                b_base[j] = cc;
                b_h[j] = b_w[j] = 0;
            } else {                                  // col = (c, r, s): the tap's offset into the input window
                int c, r, s;
                ig_split<CIN>(cc, g.C, g.R, g.S, c, r, s);
                b_base[j] = c * g.xs[1];
                b_h[j] = r * g.dh - g.ph;
                b_w[j] = s * g.dw - g.pw;
            }
        }
        split_kk(a_kk < KR ? a_kk : 0, a_u, a_v, a_z);   // past KR: never loaded, any coordinates do
        if constexpr (B_CARRY && !SHARED) split_kk(b_kk < KR ? b_kk : 0, b_u, b_v, b_z);
        if constexpr (A_TAP) refresh_a();
        if constexpr (B_TAP) refresh_b();
    }

    // A's cached tap (A_TAP) at (a_u, a_v, a_z), all but the innermost coordinate
    __device__ __forceinline__ void refresh_a() {
        if constexpr (OP == IG_FWD) {                 // (c, r, s): x's pixel under tap (r, s)
            const int h = a_h[0] + a_v * g.dh, w = a_w[0] + a_z * g.dw;
            a_in = a_ok[0] && (unsigned)h < (unsigned)g.H && (unsigned)w < (unsigned)g.W;
            a_tap = a_base[0] + h * g.xs[2] + w * g.xs[3];
        } else if constexpr (OP == IG_BWD_DATA) {     // (k, r, s): the dy pixel tap (r, s) reaches, if any
            const int p = ig_back(a_h[0] - a_v * g.dh, g.sh, g.P), q = ig_back(a_w[0] - a_z * g.dw, g.sw, g.Q);
            a_in = a_ok[0] && p >= 0 && q >= 0;
            a_tap = a_base[0] + p * g.ys[2] + q * g.ys[3];
        } else if constexpr (OP == IG_BWD_SCATTER) {  // k: dy's pixel
            a_in = a_ok[0];
            a_tap = a_base[0];
        } else {                                      // (n, p, q): dy's row (n, p)
            a_in = a_ok[0];
            a_tap = a_base[0] + a_u * g.ys[0] + a_v * g.ys[2];
        }
    }

    // B's reduction index and coordinates: A's where SHARED
    __device__ __forceinline__ int bk() const { return SHARED ? a_kk : b_kk; }
    __device__ __forceinline__ int bu() const { return SHARED ? a_u : b_u; }
    __device__ __forceinline__ int bv() const { return SHARED ? a_v : b_v; }
    __device__ __forceinline__ int bz() const { return SHARED ? a_z : b_z; }

    // B's cached tap (B_TAP) at (bu, bv, bz), all but the innermost coordinate
    __device__ __forceinline__ void refresh_b() {
        if constexpr (OP == IG_BWD_DATA) {            // (k, r, s): w[.][r][s][c..c+3]
            b_in = b_ok[0];
            b_tap = b_base[0] + bv() * g.ws[2] + bz() * g.ws[3];
        } else if constexpr (OP == IG_BWD_SCATTER) {  // k: w[.][col..col+3]
            b_in = b_ok[0];
            b_tap = b_base[0];
        } else {                                      // (n, p, q): x's row h = p * stride + tap for sample n
            const int h = bv() * g.sh + b_h[0];
            b_in = b_ok[0] && (unsigned)h < (unsigned)g.H;
            b_tap = b_base[0] + bu() * g.xs[0] + h * g.xs[2];
        }
    }

    // A[m][kk] for a thread's row i at decoded kk coordinates (forward: c,r,s; backward data: k,r,s; filter: n,p,q)
    __device__ __forceinline__ float a_at(int i, int u, int v, int z) const {
        if constexpr (OP == IG_FWD) {
            const int h = a_h[i] + v * g.dh, w = a_w[i] + z * g.dw;
            if (!a_ok[i] || (unsigned)h >= (unsigned)g.H || (unsigned)w >= (unsigned)g.W) return 0.f;
            return __ldg(a_ptr + (a_base[i] + u * g.xs[1] + h * g.xs[2] + w * g.xs[3]));
        } else if constexpr (OP == IG_BWD_DATA) {
            const int p = ig_back(a_h[i] - v * g.dh, g.sh, g.P), q = ig_back(a_w[i] - z * g.dw, g.sw, g.Q);
            if (!a_ok[i] || p < 0 || q < 0) return 0.f;
            return __ldg(a_ptr + (a_base[i] + u * g.ys[1] + p * g.ys[2] + q * g.ys[3]));
        } else if constexpr (OP == IG_BWD_SCATTER) {
            return a_ok[i] ? __ldg(a_ptr + (a_base[i] + u * g.ys[1])) : 0.f;
        } else {
            if (!a_ok[i]) return 0.f;
            return __ldg(a_ptr + (a_base[i] + u * g.ys[0] + v * g.ys[2] + z * g.ys[3]));
        }
    }

    // B[kk][col] for a thread's column j at decoded kk coordinates
    __device__ __forceinline__ float b_at(int j, int u, int v, int z) const {
        if (!b_ok[j]) return 0.f;
        static_assert(OP != IG_FWD, "forward's B is the packed filter, loaded by kk alone");
        if constexpr (OP == IG_BWD_DATA) {
            return __ldg(b_ptr + (b_base[j] + u * g.ws[0] + v * g.ws[2] + z * g.ws[3]));
        } else if constexpr (OP == IG_BWD_SCATTER) {
            return __ldg(b_ptr + (b_base[j] + u * g.ws[0]));
        } else {
            const int h = v * g.sh + b_h[j], w = z * g.sw + b_w[j];
            if ((unsigned)h >= (unsigned)g.H || (unsigned)w >= (unsigned)g.W) return 0.f;
            return __ldg(b_ptr + (b_base[j] + u * g.xs[0] + h * g.xs[2] + w * g.xs[3]));
        }
    }

    // kk -> (u, v, z) as the op's reduction decodes it
    __device__ __forceinline__ void split_kk(int kk, int& u, int& v, int& z) const {
        if constexpr (OP == IG_FWD) ig_split<CIN>(kk, g.C, g.R, g.S, u, v, z);
        else if constexpr (OP == IG_BWD_DATA) ig_split<CIN>(kk, g.K, g.R, g.S, u, v, z);
        else if constexpr (OP == IG_BWD_SCATTER) { u = kk; v = z = 0; }
        else ig_pixel(kk, g.P, g.Q, u, v, z);
    }

    // kk += IG_BK with its coordinates carried; true where the step moved an outer coordinate
    __device__ __forceinline__ bool advance_kk(int& kk, int& u, int& v, int& z) const {
        kk += IG_BK;
        if constexpr (OP == IG_FWD) return ig_advance<CIN>(g.C, g.R, g.S, u, v, z);
        else if constexpr (OP == IG_BWD_DATA) return ig_advance<CIN>(g.K, g.R, g.S, u, v, z);
        else if constexpr (OP == IG_BWD_SCATTER) { u += IG_BK; return false; }
        else return ig_advance<false>(g.N, g.P, g.Q, u, v, z);
    }

    __device__ __forceinline__ void next_kk(int& u, int& v, int& z) const {
        if constexpr (OP == IG_FWD) ig_next<CIN>(g.C, g.R, g.S, u, v, z);
        else if constexpr (OP == IG_BWD_DATA) ig_next<CIN>(g.K, g.R, g.S, u, v, z);
        else if constexpr (OP == IG_BWD_SCATTER) ++u;
        else { if (++z == g.Q) { z = 0; if (++v == g.P) { v = 0; ++u; } } }
    }

    // this thread's elements of the next stage (kk from a_kk / b_kk), then the indices moved to the stage after
    __device__ __forceinline__ void load(float (&ra)[4], float (&rb)[4]) {
        load_a(ra);
        if (b_on) load_b(rb);                      // before A's coordinates move: SHARED reads them
        if (advance_kk(a_kk, a_u, a_v, a_z)) {
            if constexpr (A_TAP) refresh_a();
            if constexpr (SHARED && B_TAP) refresh_b();
        }
        if constexpr (B_CARRY && !SHARED) {
            if (advance_kk(b_kk, b_u, b_v, b_z) && B_TAP) refresh_b();
        } else if constexpr (!SHARED) {
            b_kk += IG_BK;
        }
    }

    __device__ __forceinline__ void load_a(float (&ra)[4]) const {
        if constexpr (A_K) {                       // one row, kk = a_kk + 0..3
            const int kk = a_kk;
            int u = a_u, v = a_v, z = a_z;
            if constexpr (VA) {                    // four channels of one tap, contiguous and aligned
                float4 f = make_float4(0.f, 0.f, 0.f, 0.f);
                const int inner = OP == IG_FWD ? g.xs[1] : g.ys[1];
                if (kk < KR && a_in) f = __ldg(reinterpret_cast<const float4*>(a_ptr + (a_tap + u * inner)));
                ra[0] = f.x; ra[1] = f.y; ra[2] = f.z; ra[3] = f.w;
            } else {
#pragma unroll
                for (int t = 0; t < 4; ++t) {
                    ra[t] = kk + t < KR ? a_at(0, u, v, z) : 0.f;
                    if (t < 3) next_kk(u, v, z);
                }
            }
        } else if constexpr (VA) {                 // backward filter, NHWC: dy[n][p][q][k..k+3] of one kk
            float4 f = make_float4(0.f, 0.f, 0.f, 0.f);
            if (a_kk < KR && a_in) f = __ldg(reinterpret_cast<const float4*>(a_ptr + (a_tap + a_z * g.ys[3])));
            ra[0] = f.x; ra[1] = f.y; ra[2] = f.z; ra[3] = f.w;
        } else if constexpr (OP == IG_FWD) {       // four rows 32 apart, one tap: the tap's offset is the rows'
            const int dv = a_v * g.dh, dz = a_z * g.dw;  // common part, each row adds its window's corner
            const int tap = a_u * g.xs[1] + dv * g.xs[2] + dz * g.xs[3];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int h = a_h[i] + dv, w = a_w[i] + dz;
                ra[i] = a_kk < KR && a_ok[i] && (unsigned)h < (unsigned)g.H && (unsigned)w < (unsigned)g.W
                            ? __ldg(a_ptr + (a_corner[i] + tap)) : 0.f;
            }
        } else {                                   // four rows 32 apart, one kk = a_kk
#pragma unroll
            for (int i = 0; i < 4; ++i) ra[i] = a_kk < KR ? a_at(i, a_u, a_v, a_z) : 0.f;
        }
    }

    __device__ __forceinline__ void load_b(float (&rb)[4]) const {
        if constexpr (B_K) {                       // one column, kk = b_kk + 0..3
            const int kk = bk();
            if constexpr (VB) {                    // forward's packed filter: w[k][kk..kk+3], aligned
                float4 f = make_float4(0.f, 0.f, 0.f, 0.f);
                if (b_ok[0] && kk < KR) f = __ldg(reinterpret_cast<const float4*>(b_ptr + (b_base[0] + kk)));
                rb[0] = f.x; rb[1] = f.y; rb[2] = f.z; rb[3] = f.w;
            } else if constexpr (OP == IG_FWD) {   // the same, one float at a time (C * R * S not a multiple of 4)
#pragma unroll
                for (int t = 0; t < 4; ++t) rb[t] = b_ok[0] && kk + t < KR ? __ldg(b_ptr + (b_base[0] + kk + t)) : 0.f;
            } else {
                int u = bu(), v = bv(), z = bz();
#pragma unroll
                for (int t = 0; t < 4; ++t) {
                    rb[t] = kk + t < KR ? b_at(0, u, v, z) : 0.f;
                    if (t < 3) next_kk(u, v, z);
                }
            }
        } else if constexpr (VB) {                 // four channels of one kk: backward data's w, filter's x
            float4 f = make_float4(0.f, 0.f, 0.f, 0.f);
            if (bk() < KR && b_in) {
                if constexpr (OP == IG_BWD_FILTER) {   // the pixel's column w = q * stride + tap
                    const int w = bz() * g.sw + b_w[0];
                    if ((unsigned)w < (unsigned)g.W)
                        f = __ldg(reinterpret_cast<const float4*>(b_ptr + (b_tap + w * g.xs[3])));
                } else {                               // w[k][..]: the innermost coordinate is k
                    f = __ldg(reinterpret_cast<const float4*>(b_ptr + (b_tap + bu() * g.ws[0])));
                }
            }
            rb[0] = f.x; rb[1] = f.y; rb[2] = f.z; rb[3] = f.w;
        } else {                                   // four columns 32 apart, one kk = b_kk
#pragma unroll
            for (int j = 0; j < BC; ++j) rb[j] = bk() < KR ? b_at(j, bu(), bv(), bz()) : 0.f;
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
__device__ __forceinline__ int ig_out_row(const IgConv& g, int m) {
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
__device__ __forceinline__ int ig_out_col(const IgConv& g, int col) {
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

// How the epilogue may store (the launcher's vec_out, checked per launch: strides, plane sizes, alignment):
// IG_VEC_ROWS: four consecutive rows of C from a 4-aligned row are four consecutive, 16-byte aligned floats (NCHW
// y or dx: the rows are one plane's pixels; lanes run along rows, LM); IG_VEC_COLS: the same for four columns
// (NHWC y or dx, and dw).  A warp then writes 16-byte pieces of two 256-byte runs, where scalar stores 16 bytes
// apart touched four times the sectors (AlexNet-sized y: the store traffic, not the FMAs, bounded short reductions).
enum : int { IG_VEC_NONE = 0, IG_VEC_ROWS = 1, IG_VEC_COLS = 2 };

// dst[0..n) = alpha * (v0, v1, v2, v3) + beta * dst: one float4 when all four are in range, else one by one
__device__ __forceinline__ void ig_store4(float* dst, float v0, float v1, float v2, float v3, int n, float alpha,
                                          float beta) {
    float4 v = make_float4(alpha * v0, alpha * v1, alpha * v2, alpha * v3);
    if (n >= 4) {
        if (beta != 0.f) {
            const float4 o = *reinterpret_cast<const float4*>(dst);
            v.x = fmaf(beta, o.x, v.x); v.y = fmaf(beta, o.y, v.y); v.z = fmaf(beta, o.z, v.z);
            v.w = fmaf(beta, o.w, v.w);
        }
        *reinterpret_cast<float4*>(dst) = v;
        return;
    }
    const float vs[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int t = 0; t < 4; ++t)
        if (t < n) dst[t] = beta == 0.f ? vs[t] : fmaf(beta, dst[t], vs[t]);
}

// Column j (< TN) of a thread's block within the tile: tx * 4 + 0..3, then the tile's columns from 64: tx * 4 + 0..3
// (TN = 8, 128 wide) or tx * 2 + 0..1 (TN = 6, 96 wide: a 96-channel backward data filled 3/4 of a 128-wide tile)
template <int TN> __device__ __forceinline__ int ig_col(int tx, int j) {
    if (j < 4) return tx * 4 + j;
    return 64 + (TN == 8 ? tx * 4 : tx * 2) + (j - 4);
}

// out = alpha * A B + beta * out over this block's 128 x BN_ tile and its kk range (blockIdx.z's share of
// kk_per_split); a split backward filter adds alpha * A B atomically instead.  BN_ = 64 or 96 for GEMMs whose
// columns a 128-wide tile would leave partly idle (64 or 96 channels), each thread then 8 x 4 or 8 x 6 outputs.
// KS stages of IG_BK reduction elements per shared-memory buffer: one barrier per KS * 8 steps.  Two blocks per SM
// (128 registers), except the 64-wide one-stage tile: three (80 registers; on sm_90 only NCHW backward data spills,
// 12 bytes), as 32 accumulators leave a thread the room and the extra warps cover latency (H200, against two
// blocks: ResNet-50's 64-channel layers forward 0.93 -> 0.83 ms, backward filter 2.51 -> 2.03, C = 1 layers
// 1.08-1.26x; with two stages three blocks lost).
template <int OP, bool A_K, bool B_K, bool CIN, bool VA, bool VB, int BN_, int KS, bool LM>
__global__ void __launch_bounds__(IG_NT, BN_ == 64 && KS == 1 ? 3 : 2)
igemm_conv(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out, int N, int C, int H,
           int W, int K, int P, int Q, int R, int S, int ph, int pw, int sh, int sw, int dh, int dw, long long xs0,
           long long xs1, long long xs2, long long xs3, long long ws0, long long ws1, long long ws2, long long ws3,
           long long ys0, long long ys1, long long ys2, long long ys3, int M, int NC, int KR, int kk_per_split,
           float alpha, float beta, int vec_out) {
    static_assert(!VA || (A_K ? OP != IG_BWD_FILTER : OP == IG_BWD_FILTER), "A's float4 loads: see the header");
    static_assert(!VB || (B_K ? OP == IG_FWD : OP != IG_FWD), "B's float4 loads: see the header");
    static_assert(OP != IG_FWD || B_K, "forward's B (the packed filter) loads along kk");
    static_assert(BN_ == 128 || BN_ == 96 || BN_ == 64, "tile widths: 128, 96 or 64");
    static_assert(!LM || OP == IG_FWD || OP == IG_BWD_DATA, "lanes run along rows only where rows are contiguous");
    constexpr int TN = BN_ / 16;       // a thread's columns: ig_col<TN>(tx, j), j < TN
    constexpr int SK = KS * IG_BK;     // reduction elements per buffer
    const IgConv g{N, C, H, W, K, P, Q, R, S, ph, pw, sh, sw, dh, dw,
                   {(int)xs0, (int)xs1, (int)xs2, (int)xs3}, {(int)ws0, (int)ws1, (int)ws2, (int)ws3},
                   {(int)ys0, (int)ys1, (int)ys2, (int)ys3}};
    __shared__ __align__(16) float As[2][SK][IG_LD];
    __shared__ __align__(16) float Bs[2][SK][IG_LD];
    const int m0 = blockIdx.x * IG_BM, n0 = blockIdx.y * BN_;
    const int k_begin = blockIdx.z * kk_per_split;
    const int k_end = min(KR, k_begin + kk_per_split);
    // a thread's rows ty * 4 + 0..3 (+ 64) and columns ig_col<TN>(tx, j); LM puts a warp's 16 low lanes on rows
    const int tx = LM ? threadIdx.x >> 4 : threadIdx.x & 15, ty = LM ? threadIdx.x & 15 : threadIdx.x >> 4;
    IgLoader<OP, A_K, B_K, CIN, VA, VB, BN_> ld(g, a, b, m0, n0, M, NC, k_end, k_begin);

    float acc[8][TN];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;

    float ra[KS][4], rb[KS][4];
#pragma unroll
    for (int t = 0; t < KS; ++t) {
        ld.load(ra[t], rb[t]);
        ld.store(As[0] + t * IG_BK, Bs[0] + t * IG_BK, ra[t], rb[t]);
    }
    __syncthreads();
    int buf = 0;
    for (int kb = k_begin; kb < k_end; kb += SK) {
        const bool more = kb + SK < k_end;
        if (more) {
#pragma unroll
            for (int t = 0; t < KS; ++t) ld.load(ra[t], rb[t]);
        }
        // one reduction step from shared memory (a macro, not a function: the buffers stay in the shared space)
#define IG_STEP(kk)                                                                                                 \
        {                                                                                                           \
            const float4 a0 = *reinterpret_cast<const float4*>(&As[buf][kk][ty * 4]);                               \
            const float4 a1 = *reinterpret_cast<const float4*>(&As[buf][kk][ty * 4 + 64]);                          \
            const float4 b0 = *reinterpret_cast<const float4*>(&Bs[buf][kk][tx * 4]);                               \
            const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};                                   \
            float bv[8] = {b0.x, b0.y, b0.z, b0.w, 0.f, 0.f, 0.f, 0.f};                                             \
            if constexpr (TN == 8) {                                                                                \
                const float4 b1 = *reinterpret_cast<const float4*>(&Bs[buf][kk][tx * 4 + 64]);                      \
                bv[4] = b1.x; bv[5] = b1.y; bv[6] = b1.z; bv[7] = b1.w;                                             \
            } else if constexpr (TN == 6) {                                                                         \
                const float2 b1 = *reinterpret_cast<const float2*>(&Bs[buf][kk][tx * 2 + 64]);                      \
                bv[4] = b1.x; bv[5] = b1.y;                                                                         \
            }                                                                                                       \
            _Pragma("unroll") for (int i = 0; i < 8; ++i)                                                           \
            _Pragma("unroll") for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);               \
        }
        if (k_end - kb >= SK) {
#pragma unroll
            for (int kk = 0; kk < SK; ++kk) IG_STEP(kk)
        } else {   // the reduction's last, partial buffer: its filled steps only (C*R*S = 25 fills 25 of 32)
#pragma unroll
            for (int kk = 0; kk < SK; ++kk) {
                if (kk >= k_end - kb) break;
                IG_STEP(kk)
            }
        }
#undef IG_STEP
        if (more) {
#pragma unroll
            for (int t = 0; t < KS; ++t) ld.store(As[buf ^ 1] + t * IG_BK, Bs[buf ^ 1] + t * IG_BK, ra[t], rb[t]);
        }
        __syncthreads();
        buf ^= 1;
    }

    if constexpr (OP == IG_BWD_SCATTER) {   // C[(n, p, q)][(c, r, s)] adds into dx[n, c, p*sh - ph + r*dh, ...]
        int coff[TN], ch[TN], cw[TN];
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int col = n0 + ig_col<TN>(tx, j);
            int c, r, s;
            ig_split<CIN>(col < NC ? col : 0, g.C, g.R, g.S, c, r, s);
            coff[j] = col < NC ? c : -1;
            ch[j] = r * g.dh - g.ph;
            cw[j] = s * g.dw - g.pw;
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int m = m0 + ty * 4 + (i & 3) + (i >> 2) * 64;
            if (m >= M) continue;
            int n, p, q;
            ig_pixel(m, g.P, g.Q, n, p, q);
            float* base = out + n * g.xs[0];
#pragma unroll
            for (int j = 0; j < TN; ++j) {
                const int h = p * g.sh + ch[j], w = q * g.sw + cw[j];
                if (coff[j] >= 0 && (unsigned)h < (unsigned)g.H && (unsigned)w < (unsigned)g.W)
                    atomicAdd(base + coff[j] * g.xs[1] + h * g.xs[2] + w * g.xs[3], alpha * acc[i][j]);
            }
        }
        return;
    }
    const bool split = gridDim.z > 1;  // a split backward filter adds its partial sums, one float at a time
    if (!split && LM && vec_out == IG_VEC_ROWS) {          // four consecutive rows: four consecutive floats (NCHW)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int m = m0 + ty * 4 + h * 64;
            if (m >= M) continue;
            const int row = ig_out_row<OP, CIN>(g, m);
#pragma unroll
            for (int j = 0; j < TN; ++j) {
                const int col = n0 + ig_col<TN>(tx, j);
                if (col >= NC) continue;
                ig_store4(out + row + ig_out_col<OP, CIN>(g, col), acc[h * 4][j], acc[h * 4 + 1][j],
                          acc[h * 4 + 2][j], acc[h * 4 + 3][j], min(4, M - m), alpha, beta);
            }
        }
    } else if (!split && !LM && vec_out == IG_VEC_COLS) {  // four consecutive columns: four consecutive floats
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int m = m0 + ty * 4 + (i & 3) + (i >> 2) * 64;
            if (m >= M) continue;
            float* row = out + ig_out_row<OP, CIN>(g, m);
#pragma unroll
            for (int q = 0; q < TN / 4; ++q) {
                const int col = n0 + tx * 4 + q * 64;
                if (col >= NC) continue;
                ig_store4(row + ig_out_col<OP, CIN>(g, col), acc[i][q * 4], acc[i][q * 4 + 1], acc[i][q * 4 + 2],
                          acc[i][q * 4 + 3], min(4, NC - col), alpha, beta);
            }
            if constexpr (TN == 6) {           // the 96-wide tile's last two columns: one at a time
                const int col = n0 + ig_col<TN>(tx, 4);
                if (col < NC)
                    ig_store4(row + ig_out_col<OP, CIN>(g, col), acc[i][4], acc[i][5], 0.f, 0.f, min(2, NC - col),
                              alpha, beta);
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int m = m0 + ty * 4 + (i & 3) + (i >> 2) * 64;
            if (m >= M) continue;
            const int row = ig_out_row<OP, CIN>(g, m);
#pragma unroll
            for (int j = 0; j < TN; ++j) {
                const int col = n0 + ig_col<TN>(tx, j);
                if (col >= NC) continue;
                float* dst = out + row + ig_out_col<OP, CIN>(g, col);
                const float v = alpha * acc[i][j];
                if (split) atomicAdd(dst, v);
                else *dst = beta == 0.f ? v : fmaf(beta, *dst, v);
            }
        }
    }
}

// out *= beta (0: cleared), before a split backward filter or the scatter form adds into it (packed: count elements)
__global__ void igemm_scale(float* __restrict__ out, long long count, float beta) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < count;
         i += (long long)gridDim.x * blockDim.x)
        out[i] = beta == 0.f ? 0.f : beta * out[i];
}

#ifdef UCUDNN_NVCC_CHECK
#define IGEMM_ARGS const float*, const float*, float*, int, int, int, int, int, int, int, int, int, int, int, int, \
    int, int, int, long long, long long, long long, long long, long long, long long, long long, long long, long long, \
    long long, long long, long long, int, int, int, int, float, float, int
template __global__ void igemm_conv<IG_FWD, true, true, true, true, true, 128, 1, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_FWD, true, true, true, true, true, 128, 2, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_FWD, true, true, true, true, true, 64, 1, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_FWD, true, true, true, true, true, 64, 2, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_FWD, false, true, false, false, true, 128, 1, true>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_FWD, false, true, false, false, true, 128, 2, true>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_FWD, false, true, false, false, true, 64, 1, true>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_FWD, false, true, false, false, true, 64, 2, true>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_FWD, true, true, true, false, false, 128, 1, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_FWD, true, true, true, false, false, 128, 2, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_FWD, true, true, true, false, false, 64, 1, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_FWD, true, true, true, false, false, 64, 2, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_DATA, true, false, true, true, false, 128, 1, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_DATA, true, false, true, true, false, 128, 2, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_DATA, true, false, true, true, false, 64, 1, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_DATA, true, false, true, true, false, 64, 2, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_DATA, false, true, false, false, false, 128, 1, true>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_DATA, false, true, false, false, false, 128, 2, true>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_DATA, false, true, false, false, false, 64, 1, true>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_DATA, false, true, false, false, false, 64, 2, true>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_FILTER, false, false, true, false, false, 128, 1, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_FILTER, false, false, true, false, false, 128, 2, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_FILTER, false, false, true, false, false, 64, 1, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_FILTER, false, false, true, false, false, 64, 2, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_FILTER, false, false, true, true, true, 128, 1, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_FILTER, false, false, true, true, true, 128, 2, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_FILTER, false, false, true, true, true, 64, 1, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_FILTER, false, false, true, true, true, 64, 2, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_DATA, true, false, true, true, true, 128, 1, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_DATA, true, false, true, true, true, 128, 2, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_DATA, true, false, true, true, true, 64, 1, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_DATA, true, false, true, true, true, 96, 1, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_DATA, true, false, true, true, true, 96, 2, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_FWD, true, true, true, true, true, 96, 2, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_FILTER, false, false, true, true, true, 96, 2, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_FWD, false, true, false, false, false, 128, 2, true>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_DATA, false, true, false, false, false, 96, 1, true>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_FWD, true, true, true, true, true, 96, 1, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_FILTER, false, false, true, true, true, 96, 1, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_SCATTER, true, false, true, false, false, 96, 1, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_DATA, true, false, true, true, true, 64, 2, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_FILTER, true, true, false, false, false, 128, 1, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_SCATTER, true, false, true, true, true, 128, 1, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_SCATTER, true, false, true, false, false, 128, 2, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_SCATTER, false, false, false, false, false, 128, 1, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_SCATTER, false, false, false, false, true, 64, 1, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_FILTER, true, true, false, false, false, 128, 2, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_FILTER, true, true, false, false, false, 64, 1, false>(IGEMM_ARGS);
template __global__ void igemm_conv<IG_BWD_FILTER, true, true, false, false, false, 64, 2, false>(IGEMM_ARGS);
#endif
