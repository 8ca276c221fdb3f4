// Winograd F(4x4, 3x3) convolution transforms, for the winograd algorithm source (issue 18).
//
// A 3x3, stride-1 correlation of an input (Ci channels, Hi x Wi, padding PH/PW) into an output (Co channels,
// Ho x Wo) is computed tile by tile: each 4x4 output tile reads a 6x6 input tile starting at
// (4*th - PH, 4*tw - PW) (zero outside the input), and
//     Y = A^T [ (G g G^T) (.) (B^T d B) ] A
// element-wise over the 36 points xi = 6*i + j of the transform domain.  The product over channels is 36 GEMMs
// (cuBLAS, launched by the source): M[xi] = U[xi] (Co x Ci) @ V[xi] (Ci x T).  Backward data is the same
// machinery on dy with the filter rotated by 180 degrees and its K / C roles swapped (wino_filter's ROT).
// kernels/winograd.py holds the matrices, the geometry, a float64 reference and a CPU emulation of these kernels.
//
// Workspace (float32):  U [36][Co][Ci] (dU for backward filter; M then holds Z); V and M per transform-domain point
// either channel-major ([36][Ci][T], [36][Co][T]: CMINOR = false, for NCHW tensors) or channel-minor ([36][T][Ci],
// [36][T][Co]: CMINOR = true, for NHWC tensors).  Either way a thread's linear index within a plane is its offset
// there, and consecutive threads walk the tensor's fastest dimension (tiles along a row for NCHW, channels for NHWC).
// Tiles: g = (n*TH + th)*TW + tw over the n images of the call (x / y point at image 0).  A chunk is a flat RANGE
// of T_ tiles starting at tile t0 (whole images, a few tile rows of one image, or a range across an image
// boundary): the thread's local tile t (0 <= t < T_) indexes V / M, its global tile g = t0 + t picks the 6x6 patch
// it reads and the 4x4 outputs it writes.  Tensors are addressed through element strides (n, c, h, w), so NCHW,
// NHWC and channel slices of a wider y / dy are one code path.
//
// wino_filter:  one thread per (o, i): 9 filter taps -> 36 values U[xi][o][i].  g[r][s] = w[o*so + i*si + r*sr +
//               s*ss] (ROT: w[... (2-r)*sr + (2-s)*ss]).  Grid (ceil(Co*Ci / 256)).
// wino_input:   one thread per (c, t): 6x6 tile of global tile t0 + t -> 36 values V[xi][...].
//               Grid (ceil(Ci*T / 256)).
// wino_output:  one thread per (k, t): 36 values of M -> the 4x4 outputs of global tile t0 + t,
//               y = alpha * v + beta * y (y not read when beta == 0), edge tiles clipped to Ho x Wo.
//               Grid (ceil(Co*T / 256)).
// wino_dy:      one thread per (k, t): the 4x4 dy values of global tile t0 + t (zero past Ho x Wo) -> 36 values
//               Z[xi][...] = (A dy A^T)[xi], in M's layout.  Grid (ceil(Co*T / 256)).
// wino_filter_grad: one thread per (o, i): 36 values dU[xi][o][i] -> the 9 taps dw = alpha * G^T dU G + beta * dw
//               (dw not read when beta == 0); with PARTS > 1 dU is the sum of PARTS partial dU, PSTRIDE floats
//               apart (chunks over streams: one per stream).  Grid (ceil(Co*Ci / 256)).
// Point groups (-g<G>): wino_input and wino_dy store only the NP points p0 .. p0 + NP - 1 (at xi - p0: V and Z are
//               [NP][...]), wino_filter_grad reads only those (dU [NP][Co][Ci], the other points zero), so a
//               backward-filter call runs its tiles once per group of points with dU, V and Z a group's size and adds
//               each group's G^T dU G into dw.  Forward and backward data likewise: wino_filter stores only the
//               group's points of U, wino_output reads only the group's points of M (the others zero) and adds
//               its share A^T M_g A into y (beta 1 after the first group; A^T M A is linear in M's points).
//               Ungrouped calls pass p0 = 0, NP = 36.
#include "common.cuh"
#include "mma.cuh"

// B^T d for one column d[0..5] (stride DS) into r[0..5] (stride RS)
__device__ __forceinline__ void wino_bt(const float* d, int ds, float* r, int rs)
{
    const float d0 = d[0], d1 = d[ds], d2 = d[2 * ds], d3 = d[3 * ds], d4 = d[4 * ds], d5 = d[5 * ds];
    r[0] = 4.f * d0 - 5.f * d2 + d4;
    r[rs] = -4.f * d1 - 4.f * d2 + d3 + d4;
    r[2 * rs] = 4.f * d1 - 4.f * d2 - d3 + d4;
    r[3 * rs] = -2.f * d1 - d2 + 2.f * d3 + d4;
    r[4 * rs] = 2.f * d1 - d2 - 2.f * d3 + d4;
    r[5 * rs] = 4.f * d1 - 5.f * d3 + d5;
}

// G g for one column g[0..2] (stride GS) into u[0..5] (stride US)
__device__ __forceinline__ void wino_g(const float* g, int gs, float* u, int us)
{
    const float g0 = g[0], g1 = g[gs], g2 = g[2 * gs];
    u[0] = 0.25f * g0;
    u[us] = -(g0 + g1 + g2) * (1.f / 6.f);
    u[2 * us] = -(g0 - g1 + g2) * (1.f / 6.f);
    u[3 * us] = g0 * (1.f / 24.f) + g1 * (1.f / 12.f) + g2 * (1.f / 6.f);
    u[4 * us] = g0 * (1.f / 24.f) - g1 * (1.f / 12.f) + g2 * (1.f / 6.f);
    u[5 * us] = g2;
}

// A^T m for one column m[0..5] (stride MS) into o[0..3] (stride OS)
__device__ __forceinline__ void wino_at(const float* m, int ms, float* o, int os)
{
    const float m0 = m[0], m1 = m[ms], m2 = m[2 * ms], m3 = m[3 * ms], m4 = m[4 * ms], m5 = m[5 * ms];
    o[0] = m0 + m1 + m2 + m3 + m4;
    o[os] = m1 - m2 + 2.f * m3 - 2.f * m4;
    o[2 * os] = m1 + m2 + 4.f * m3 + 4.f * m4;
    o[3 * os] = m1 - m2 + 8.f * m3 - 8.f * m4 + m5;
}

// A v for one column v[0..3] (stride VS) into r[0..5] (stride RS): the transpose of wino_at
__device__ __forceinline__ void wino_a(const float* v, int vs, float* r, int rs)
{
    const float v0 = v[0], v1 = v[vs], v2 = v[2 * vs], v3 = v[3 * vs];
    r[0] = v0;
    r[rs] = v0 + v1 + v2 + v3;
    r[2 * rs] = v0 - v1 + v2 - v3;
    r[3 * rs] = v0 + 2.f * v1 + 4.f * v2 + 8.f * v3;
    r[4 * rs] = v0 - 2.f * v1 + 4.f * v2 - 8.f * v3;
    r[5 * rs] = v3;
}

// G^T u for one column u[0..5] (stride US) into g[0..2] (stride GS): the transpose of wino_g
__device__ __forceinline__ void wino_gt(const float* u, int us, float* g, int gs)
{
    const float u0 = u[0], u1 = u[us], u2 = u[2 * us], u3 = u[3 * us], u4 = u[4 * us], u5 = u[5 * us];
    g[0] = 0.25f * u0 - (u1 + u2) * (1.f / 6.f) + (u3 + u4) * (1.f / 24.f);
    g[gs] = (u2 - u1) * (1.f / 6.f) + (u3 - u4) * (1.f / 12.f);
    g[2 * gs] = (u3 + u4 - u1 - u2) * (1.f / 6.f) + u5;
}

// The filter transform u [6][6] = G g G^T of the 3x3 taps at base (strides sr, ss; rotated by 180 degrees when ROT).
// wino_filter and wino_filter_fused.
template <typename T, bool ROT>
__device__ __forceinline__ void wino_filter_taps(const T* base, long long sr, long long ss, float* u)
{
    float g[9], tmp[18];
#pragma unroll
    for (int r = 0; r < 3; ++r)
#pragma unroll
        for (int s = 0; s < 3; ++s)
            g[r * 3 + s] = to_float(base[(ROT ? 2 - r : r) * sr + (ROT ? 2 - s : s) * ss]);
#pragma unroll
    for (int s = 0; s < 3; ++s) wino_g(g + s, 3, tmp + s, 3);      // tmp [6][3] = G g
#pragma unroll
    for (int a = 0; a < 6; ++a) wino_g(tmp + 3 * a, 1, u + 6 * a, 1);   // u [6][6] = (G g) G^T
}

// The 36 transform-domain values m of one (output channel, tile) -> its 4x4 outputs y = alpha * A^T m A + beta * y
// at rows h0.., columns w0.. of the channel's plane base (element strides sh, sw; y not read when beta == 0), clipped
// to Ho x Wo.  m is overwritten (the column pass runs in place).  wino_output and wino_fused.
template <typename T>
__device__ __forceinline__ void wino_store_tile(float* m, T* base, int h0, int w0, int Ho, int Wo, long long sh,
                                                long long sw, float alpha, float beta)
{
    float o[16];
#pragma unroll
    for (int b = 0; b < 6; ++b) wino_at(m + b, 6, m + b, 6);            // rows 0..3 of m = A^T m (columns)
#pragma unroll
    for (int a = 0; a < 4; ++a) wino_at(m + 6 * a, 1, o + 4 * a, 1);    // o [4][4] = (A^T m) A (rows)
#pragma unroll
    for (int a = 0; a < 4; ++a) {
        if (h0 + a >= Ho) break;
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            if (w0 + b >= Wo) break;
            T* p = base + (h0 + a) * sh + (w0 + b) * sw;
            float v = alpha * o[a * 4 + b];
            if (beta != 0.f) v += beta * to_float(*p);
            *p = from_float<T>(v);
        }
    }
}

template <typename T, bool ROT>
__global__ void __launch_bounds__(256) wino_filter(const T* __restrict__ w, float* __restrict__ U, int Co, int Ci,
                                                   long long so, long long si, long long sr, long long ss,
                                                   int p0, int np_)
{
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= Co * Ci) return;
    const int o = idx / Ci, i = idx - o * Ci;
    float u[36];
    wino_filter_taps<T, ROT>(w + o * so + i * si, sr, ss, u);
    const long long plane = (long long)Co * Ci;
#pragma unroll
    for (int xi = 0; xi < 36; ++xi)
        if (xi >= p0 && xi < p0 + np_) U[(xi - p0) * plane + idx] = u[xi];
}

// Thread idx's (channel, tile) of a transform over C channels x T_ tiles (channel-minor when CMINOR: idx = t * C + c,
// else idx = c * T_ + t): the tile t within the range, and numbered from t0 over the whole call, split into (sample,
// tile row, tile column) of a TH x TW tile grid.
struct WinoTile {
    int ch, n, th, tw, t;
};

template <bool CMINOR>
__device__ __forceinline__ WinoTile wino_tile(int idx, int C, int T_, int t0, int TH, int TW) {
    int c, t;
    if (CMINOR) { t = idx / C; c = idx - t * C; }
    else { c = idx / T_; t = idx - c * T_; }
    const int g = t0 + t;   // the tile's index over the whole call
    const int tw = g % TW, nt = g / TW;
    const int th = nt % TH, n = nt / TH;
    return {c, n, th, tw, t};
}

// Where channel c's tile t (wino_tile's, over C channels) stores its values when the tiles are kept in S parts of
// TS = ceil(T_ / S) (backward filter's split GEMMs: part s of the chunk's tiles is its own [NP][C][TS] block, so each
// part's products read plain strided matrices and add into their own dU copy): the part's base offset plus the
// thread's offset in a point's plane (channel-minor when CMINOR), and the plane's size; tiles t >= T_ are padding
// of the last parts, stored as zeros.  S == 1 is the unsplit layout: offset idx.
struct WinoSlot {
    long long base, plane;
};

template <bool CMINOR>
__device__ __forceinline__ WinoSlot wino_slot(int c, int t, int C, int TS, int np_)
{
    const int s = t / TS, tl = t - s * TS;
    const long long plane = (long long)C * TS;
    const long long local = CMINOR ? (long long)tl * C + c : (long long)c * TS + tl;
    return {(long long)s * np_ * plane + local, plane};
}

template <typename T, bool CMINOR>
__global__ void __launch_bounds__(256) wino_input(const T* __restrict__ x, float* __restrict__ V, int Ci, int T_,
                                                  int t0, int TH, int TW, int Hi, int Wi, int PH, int PW, long long sn,
                                                  long long sc, long long sh, long long sw, int p0, int np_, int S)
{
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    const int TS = (T_ + S - 1) / S, Tp = S * TS;   // tiles a part, and the tiles padded to S whole parts
    if (idx >= Ci * Tp) return;
    const WinoTile at = wino_tile<CMINOR>(idx, Ci, Tp, t0, TH, TW);
    const WinoSlot slot = wino_slot<CMINOR>(at.ch, at.t, Ci, TS, np_);
    const bool live = at.t < T_;
    const int c = at.ch, n = at.n, th = at.th, tw = at.tw;
    const int h0 = 4 * th - PH, w0 = 4 * tw - PW;
    const T* base = x + (long long)n * sn + (long long)c * sc;
    float d[36], tmp[36];
#pragma unroll
    for (int a = 0; a < 6; ++a) {
        const int h = h0 + a;
        const bool hin = live && h >= 0 && h < Hi;
#pragma unroll
        for (int b = 0; b < 6; ++b) {
            const int ww = w0 + b;
            d[a * 6 + b] = (hin && ww >= 0 && ww < Wi) ? to_float(base[h * sh + ww * sw]) : 0.f;
        }
    }
#pragma unroll
    for (int b = 0; b < 6; ++b) wino_bt(d + b, 6, tmp + b, 6);            // tmp = B^T d (columns)
#pragma unroll
    for (int a = 0; a < 6; ++a) wino_bt(tmp + 6 * a, 1, d + 6 * a, 1);    // d = (B^T d) B (rows)
#pragma unroll
    for (int xi = 0; xi < 36; ++xi)
        if (xi >= p0 && xi < p0 + np_) V[slot.base + (xi - p0) * slot.plane] = d[xi];
}

template <typename T, bool CMINOR>
__global__ void __launch_bounds__(256) wino_output(const float* __restrict__ M, T* __restrict__ y, int Co, int T_,
                                                   int t0, int TH, int TW, int Ho, int Wo, long long sn, long long sc,
                                                   long long sh, long long sw, float alpha, float beta, int p0,
                                                   int np_)
{
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= Co * T_) return;
    const WinoTile at = wino_tile<CMINOR>(idx, Co, T_, t0, TH, TW);
    const int k = at.ch, n = at.n, th = at.th, tw = at.tw;
    const long long plane = (long long)Co * T_;
    float m[36];
#pragma unroll
    for (int xi = 0; xi < 36; ++xi) m[xi] = (xi >= p0 && xi < p0 + np_) ? M[(xi - p0) * plane + idx] : 0.f;
    wino_store_tile(m, y + (long long)n * sn + (long long)k * sc, 4 * th, 4 * tw, Ho, Wo, sh, sw, alpha, beta);
}

template <typename T, bool CMINOR>
__global__ void __launch_bounds__(256) wino_dy(const T* __restrict__ dy, float* __restrict__ Z, int Co, int T_, int t0,
                                               int TH, int TW, int Ho, int Wo, long long sn, long long sc,
                                               long long sh, long long sw, int p0, int np_, int S)
{
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    const int TS = (T_ + S - 1) / S, Tp = S * TS;   // as wino_input
    if (idx >= Co * Tp) return;
    const WinoTile at = wino_tile<CMINOR>(idx, Co, Tp, t0, TH, TW);
    const WinoSlot slot = wino_slot<CMINOR>(at.ch, at.t, Co, TS, np_);
    const int k = at.ch, n = at.n, th = at.th, tw = at.tw;
    const T* base = dy + (long long)n * sn + (long long)k * sc;
    const int h0 = 4 * th, w0 = 4 * tw;
    float d[16], tmp[24], z[36];
#pragma unroll
    for (int a = 0; a < 4; ++a) {
        const bool hin = at.t < T_ && h0 + a < Ho;
#pragma unroll
        for (int b = 0; b < 4; ++b)
            d[a * 4 + b] = (hin && w0 + b < Wo) ? to_float(base[(h0 + a) * sh + (w0 + b) * sw]) : 0.f;
    }
#pragma unroll
    for (int b = 0; b < 4; ++b) wino_a(d + b, 4, tmp + b, 4);            // tmp [6][4] = A dy (columns)
#pragma unroll
    for (int a = 0; a < 6; ++a) wino_a(tmp + 4 * a, 1, z + 6 * a, 1);    // z [6][6] = (A dy) A^T (rows)
#pragma unroll
    for (int xi = 0; xi < 36; ++xi)
        if (xi >= p0 && xi < p0 + np_) Z[slot.base + (xi - p0) * slot.plane] = z[xi];
}

template <typename T>
__global__ void __launch_bounds__(256) wino_filter_grad(const float* __restrict__ U, T* __restrict__ w, int Co, int Ci,
                                                        long long so, long long si, long long sr, long long ss,
                                                        float alpha, float beta, int parts, long long pstride,
                                                        int p0, int np_)
{
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= Co * Ci) return;
    const int o = idx / Ci, i = idx - o * Ci;
    const long long plane = (long long)Co * Ci;
    float u[36], tmp[18], g[9];
#pragma unroll
    for (int xi = 0; xi < 36; ++xi) u[xi] = (xi >= p0 && xi < p0 + np_) ? U[(xi - p0) * plane + idx] : 0.f;
    // chunks over streams: each stream accumulated its own dU, pstride floats apart; summed here, in stream order
    for (int p = 1; p < parts; ++p) {
        const float* Up = U + p * pstride;
#pragma unroll
        for (int xi = 0; xi < 36; ++xi)
            if (xi >= p0 && xi < p0 + np_) u[xi] += Up[(xi - p0) * plane + idx];
    }
#pragma unroll
    for (int b = 0; b < 6; ++b) wino_gt(u + b, 6, tmp + b, 6);           // tmp [3][6] = G^T u (columns)
#pragma unroll
    for (int r = 0; r < 3; ++r) wino_gt(tmp + 6 * r, 1, g + 3 * r, 1);   // g [3][3] = (G^T u) G (rows)
    T* base = w + o * so + i * si;
#pragma unroll
    for (int r = 0; r < 3; ++r)
#pragma unroll
        for (int s = 0; s < 3; ++s) {
            T* p = base + r * sr + s * ss;
            float v = alpha * g[r * 3 + s];
            if (beta != 0.f) v += beta * to_float(*p);
            *p = from_float<T>(v);
        }
}

// ---- fused: the whole F(4x4, 3x3) convolution in one kernel, V and M never in global memory ---------------------
//
// Why: the chunked path writes V and M of every chunk to the workspace and reads them back (36 floats a tile per
// channel each way), and under 64 MiB its chunks make thin GEMMs; a block that transforms its tiles into shared
// memory and keeps the 36 points' products in registers needs only U in the workspace (36 * Cp * Kp floats: 37.7
// MB for a 512 x 512 layer), whatever the batch.  Measured (benchmarks/results/wino_fused.md, H200): correct but
// latency-bound -- 36 points x 32 channels x 24 tiles of accumulators fill the register file, so one block of 9
// warps runs per SM and its load, transform and product phases take turns -- and slower than the 64 MiB chunks on
// every VGG-16 / ResNet-50 / AlexNet layer (0.38-0.91x); kept as a configuration the benchmark measures (its
// workspace is U alone, and few-channel layers are where it comes closest).
//
// wino_filter_fused: U in the fused kernel's layout Uf [Cp][36][Kp] (Cp = Ci rounded up to WF_BC, Kp = Co rounded
//               up to WF_BK, the padding zero): one thread per (i, o), o fastest.  Grid (ceil(Kp*Cp / 256)).
// wino_fused:   a block computes WF_BK output channels x WF_BT tiles (flat over the call's n * TH * TW tiles).
//               WF_NT = 288 threads: thread (xi, kq, tq) accumulates point xi's 8 x 12 products (channels
//               8kq.., tiles 12tq..) over the input channels, WF_BC channels a step.  Per step U's slab
//               [WF_BC][36][WF_BK] and the raw 6x6 patches of WF_BC channels x WF_BT tiles (threads 0..191, one
//               each) arrive by cp.async into the next stage while the products of this stage run; then each of
//               those threads input-transforms its own patch into V [WF_BC][36][WF_BT].  At the end the products
//               go through shared memory (padded against bank conflicts) and each (channel, tile) is
//               output-transformed and written, y = alpha * v + beta * y.
//               Grid (ceil(n*TH*TW / WF_BT), Kp / WF_BK), dynamic shared memory WF_SMEM bytes (185856: sm_90's
//               227 KB opt-in; not sm_80's 163 KB, where the kernel is compiled empty and never launched).
#define WF_BK 32
#define WF_BT 24
#define WF_BC 8
#define WF_NT 288
#define WF_US (WF_BC * 36 * WF_BK)
#define WF_VS (WF_BC * 36 * WF_BT)
#define WF_MK 25
#define WF_MX (WF_BK * WF_MK + 1)
#define WF_XP 37
#define WF_XS (WF_BC * WF_BT * WF_XP)
#define WF_SMEM (2 * (WF_US + WF_VS + WF_XS) * 4)

template <typename T, bool ROT>
__global__ void __launch_bounds__(256) wino_filter_fused(const T* __restrict__ w, float* __restrict__ Uf, int Co,
                                                         int Ci, int Kp, int Cp, long long so, long long si,
                                                         long long sr, long long ss)
{
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= Kp * Cp) return;
    const int i = idx / Kp, o = idx - i * Kp;
    float u[36];
    if (o < Co && i < Ci) {
        wino_filter_taps<T, ROT>(w + o * so + i * si, sr, ss, u);
    } else {
#pragma unroll
        for (int xi = 0; xi < 36; ++xi) u[xi] = 0.f;
    }
    float* dst = Uf + (long long)i * 36 * Kp + o;
#pragma unroll
    for (int xi = 0; xi < 36; ++xi) dst[(long long)xi * Kp] = u[xi];
}

template <typename T>
__global__ void __launch_bounds__(WF_NT, 1) wino_fused(const T* __restrict__ x, const float* __restrict__ Uf,
                                                       T* __restrict__ y, int Ci, int Co, int Kp, int ntiles, int TH,
                                                       int TW, int Hi, int Wi, int Ho, int Wo, int PH, int PW,
                                                       long long xn, long long xc, long long xh, long long xw,
                                                       long long yn, long long yc, long long yh, long long yw,
                                                       float alpha, float beta)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    __trap();   // WF_SMEM is over sm_80's 163 KB a block: fused_launchers refuses these devices
#else
    extern __shared__ __align__(16) float wf_smem[];
    float* Us = wf_smem;               // [2][WF_BC][36][WF_BK]
    float* Vs = wf_smem + 2 * WF_US;   // [2][WF_BC][36][WF_BT]
    float* Xs = Vs + 2 * WF_VS;        // [2][WF_BC * WF_BT] raw 6x6 patches, WF_XP floats apart (odd: no conflicts)
    const int tid = threadIdx.x;
    const int xi = tid >> 3, kq = (tid >> 1) & 3, tq = tid & 1;
    const int tb = blockIdx.x * WF_BT, k0 = blockIdx.y * WF_BK;

    // the (channel of each step, tile) this thread transforms
    const bool tr = tid < WF_BC * WF_BT;
    const int tc = tid / WF_BT, tt = tid - tc * WF_BT;
    const int g = tb + tt;
    const bool tvalid = tr && g < ntiles;
    int h0 = 0, w0 = 0;
    long long xoff = 0;
    unsigned rowok = 0, colok = 0;
    if (tvalid) {
        const int tw = g % TW, nt = g / TW;
        const int th = nt % TH, n = nt / TH;
        h0 = 4 * th - PH;
        w0 = 4 * tw - PW;
        xoff = (long long)n * xn;
#pragma unroll
        for (int a = 0; a < 6; ++a) {
            if (h0 + a >= 0 && h0 + a < Hi) rowok |= 1u << a;
            if (w0 + a >= 0 && w0 + a < Wi) colok |= 1u << a;
        }
    }
    const int steps = (Ci + WF_BC - 1) / WF_BC;
    float acc[8][12];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 12; ++j) acc[i][j] = 0.f;

    // step s's U slab (WF_BC * 36 rows of WF_BK floats, 16 bytes a copy) and this thread's 6x6 patch of step s's
    // channel (zero outside the input and past the channels) into stage buf, by cp.async
#define WF_LOAD(s, buf)                                                                                         \
    {                                                                                                           \
        const float* src = Uf + (long long)(s) * WF_BC * 36 * Kp + k0;                                          \
        float* dst = Us + (buf) * WF_US;                                                                        \
        _Pragma("unroll") for (int e = tid; e < WF_BC * 36 * (WF_BK / 4); e += WF_NT) {                         \
            const int row = e / (WF_BK / 4), q = e - row * (WF_BK / 4);                                         \
            cp_async16(dst + row * WF_BK + 4 * q, src + (long long)row * Kp + 4 * q, true);                     \
        }                                                                                                       \
        if (tr) {                                                                                               \
            const int c = (s) * WF_BC + tc;                                                                     \
            const bool ok = tvalid && c < Ci;                                                                   \
            const T* base = x + xoff + (long long)c * xc;                                                       \
            float* raw = Xs + (buf) * WF_XS + tid * WF_XP;                                                      \
            _Pragma("unroll") for (int a = 0; a < 6; ++a)                                                       \
            _Pragma("unroll") for (int b = 0; b < 6; ++b) {                                                     \
                const bool in = ok && ((rowok >> a) & 1u) && ((colok >> b) & 1u);                               \
                cp_async4(raw + a * 6 + b, in ? base + (long long)(h0 + a) * xh + (long long)(w0 + b) * xw : x, \
                          in ? 4 : 0);                                                                          \
            }                                                                                                   \
        }                                                                                                       \
    }
    // this thread's patch of stage buf, input-transformed (B^T d B: columns in place, then rows into stage buf of V),
    // six values at a time so that few registers are live beside the accumulators
#define WF_TRANSFORM(buf)                                                                                       \
    if (tr) {                                                                                                   \
        float* raw = Xs + (buf) * WF_XS + tid * WF_XP;                                                          \
        float* dst = Vs + (buf) * WF_VS + tc * 36 * WF_BT + tt;                                                 \
        _Pragma("unroll") for (int b = 0; b < 6; ++b) wino_bt(raw + b, 6, raw + b, 6);                          \
        _Pragma("unroll") for (int a = 0; a < 6; ++a) wino_bt(raw + 6 * a, 1, dst + 6 * a * WF_BT, WF_BT);      \
    }

    WF_LOAD(0, 0)
    cp_async_wait_all();
    WF_TRANSFORM(0)
    __syncthreads();
    for (int s = 0; s < steps; ++s) {
        const int buf = s & 1;
        const bool more = s + 1 < steps;
        if (more) WF_LOAD(s + 1, buf ^ 1)
        const float* ub = Us + buf * WF_US + xi * WF_BK + 8 * kq;
        const float* vb = Vs + buf * WF_VS + xi * WF_BT + 12 * tq;
#pragma unroll
        for (int c = 0; c < WF_BC; ++c) {
            const float4 a0 = *reinterpret_cast<const float4*>(ub + c * 36 * WF_BK);
            const float4 a1 = *reinterpret_cast<const float4*>(ub + c * 36 * WF_BK + 4);
            const float4 b0 = *reinterpret_cast<const float4*>(vb + c * 36 * WF_BT);
            const float4 b1 = *reinterpret_cast<const float4*>(vb + c * 36 * WF_BT + 4);
            const float4 b2 = *reinterpret_cast<const float4*>(vb + c * 36 * WF_BT + 8);
            const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float bv[12] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w, b2.x, b2.y, b2.z, b2.w};
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int j = 0; j < 12; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        if (more) {
            cp_async_wait_all();   // this thread's copies: its own patch, and its share of U
            WF_TRANSFORM(buf ^ 1)
        }
        __syncthreads();
    }
#undef WF_LOAD
#undef WF_TRANSFORM

    float* Ms = wf_smem;   // [36][WF_BK] rows of WF_MK (padded), planes of WF_MX
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 12; ++j) Ms[xi * WF_MX + (8 * kq + i) * WF_MK + 12 * tq + j] = acc[i][j];
    __syncthreads();
    for (int p = tid; p < WF_BK * WF_BT; p += WF_NT) {
        const int k = p / WF_BT, t = p - k * WF_BT;
        const int ko = k0 + k, gt = tb + t;
        if (ko >= Co || gt >= ntiles) continue;
        float m[36];
#pragma unroll
        for (int q = 0; q < 36; ++q) m[q] = Ms[q * WF_MX + k * WF_MK + t];
        const int tw = gt % TW, nt = gt / TW;
        const int th = nt % TH, n = nt / TH;
        wino_store_tile(m, y + (long long)n * yn + (long long)ko * yc, 4 * th, 4 * tw, Ho, Wo, yh, yw, alpha, beta);
    }
#endif
}

#ifdef UCUDNN_NVCC_CHECK
template __global__ void wino_filter<float, false>(const float*, float*, int, int, long long, long long, long long,
                                                   long long, int, int);
template __global__ void wino_filter<float, true>(const float*, float*, int, int, long long, long long, long long,
                                                  long long, int, int);
template __global__ void wino_input<float, false>(const float*, float*, int, int, int, int, int, int, int, int, int,
                                                  long long, long long, long long, long long, int, int, int);
template __global__ void wino_input<float, true>(const float*, float*, int, int, int, int, int, int, int, int, int,
                                                 long long, long long, long long, long long, int, int, int);
template __global__ void wino_output<float, false>(const float*, float*, int, int, int, int, int, int, int, long long,
                                                   long long, long long, long long, float, float, int, int);
template __global__ void wino_output<float, true>(const float*, float*, int, int, int, int, int, int, int, long long,
                                                  long long, long long, long long, float, float, int, int);
template __global__ void wino_dy<float, false>(const float*, float*, int, int, int, int, int, int, int, long long,
                                               long long, long long, long long, int, int, int);
template __global__ void wino_dy<float, true>(const float*, float*, int, int, int, int, int, int, int, long long,
                                              long long, long long, long long, int, int, int);
template __global__ void wino_filter_grad<float>(const float*, float*, int, int, long long, long long, long long,
                                                 long long, float, float, int, long long, int, int);
template __global__ void wino_filter_fused<float, false>(const float*, float*, int, int, int, int, long long,
                                                         long long, long long, long long);
template __global__ void wino_filter_fused<float, true>(const float*, float*, int, int, int, int, long long,
                                                        long long, long long, long long);
template __global__ void wino_fused<float>(const float*, const float*, float*, int, int, int, int, int, int, int, int,
                                           int, int, int, int, long long, long long, long long, long long, long long,
                                           long long, long long, long long, float, float);
#endif
