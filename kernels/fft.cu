// Tiled-FFT convolution transforms, for the fft algorithm source (issue 18: a transform-domain source for the filters
// of 4 taps and more, where cuDNN's FFT wins unbounded and Winograd F(4x4, 3x3) does not apply).
//
// An R x S, stride-1 correlation of an input (Ci channels, Hi x Wi, padding PH / PW) into an output (Co channels,
// Ho x Wo) is computed tile by tile (overlap-save): each MH x MW output tile (MH = TS - R + 1, MW = TS - S + 1) reads
// the TS x TS input tile starting at (MH*th - PH, MW*tw - PW) (zero outside the input), and is the circular
// correlation of that tile with the zero-padded filter, free of wrap-around in its first MH x MW points:
//     Y = IDFT( conj(DFT(w)) (.) DFT(d) )
// element-wise over the F = TS * (TS/2 + 1) points of the real input's half spectrum (ka in [0, TS), kb in
// [0, TS/2]).  The product over channels is F complex GEMMs (cuBLAS cgemm, launched by the source):
// M[f] = U[f] (Co x Ci) @ V[f] (Ci x T).  Backward data is the same machinery on dy with the filter rotated by 180
// degrees, its K / C roles swapped and padding R - 1 - PH (fft_filter's ROT).  Backward filter: per tile, the lags
// (r, s) of the circular correlation of the input tile with the zero-padded dy tile, summed over tiles in the
// transform domain: dW[f] (Co x Ci) = sum_t conj(E[f][co][t]) D[f][ci][t], computed by cgemm as its conjugate
// Gc[f][co][ci] (op C on D), then once per call dw = alpha * IDFT(conj(Gc))[r][s] + beta * dw.
// kernels/fft.py holds the geometry, a float64 reference and a CPU emulation of these kernels.
//
// Workspace (complex float32, float2): U [F][Co][Ci] (Gc for backward filter), V [F][Ci][T] (D), M [F][Co][T] (E).
// Tiles: g = (n*TH + th)*TW + tw over the n images of the call (tensors point at image 0); a chunk is the RANGE of T
// tiles from t0: the local tile t indexes V / M, the global tile t0 + t picks where it reads and writes.  Tensors
// are addressed through element strides (n, c, h, w): NCHW, NHWC and channel slices are one code path.
//
// The DFTs are direct sums over the tile (TS <= 32, even, a template parameter, so every loop unrolls and each thread
// keeps its row or column in registers), with the twiddles folded in as constants (FftTwiddles) and the symmetric
// pairs (j, TS - j) summed and differenced first, which halves the multiply-adds (a quarter on the input's
// columns); fft_filter and fft_filter_grad read them from shared memory.
//
// fft_filter:  one thread per (part, kb, o, i): rows ka of column kb of U[f][o][i] = conj(DFT(w[o][i]))[f] in its
//              PART of PARTS equal ranges, separably (the R rows' DFTs at kb, then down its part of the column:
//              R*S + TS/PARTS*R products against TS/PARTS*R*S point by point); PARTS > 1 only where Co*Ci pairs
//              would leave the device idle.  Grid (ceil(PARTS*(TS/2+1)*Co*Ci / 256)).
// fft_input:   a block per (G tiles, channel) of FFT_THREADS threads: the TS x TS tiles -> V[f][c][t] (rows, then
//              columns).
//              The tile's window: element (a, b) is read where a < WH and b < WW (TS x TS for x; the MH x MW dy
//              tile of backward filter, zero-padded), at (MH*th + OH + a, MW*tw + OW + b).  Grid (ceil(T/G), Ci).
// fft_output:  a block per (G tiles, channel): M[f][k][t] -> the MH x MW outputs of each tile (columns, then rows),
//              y = alpha * v + beta * y (y not read when beta == 0), edge tiles clipped; a thread per output row
//              of a tile in the second pass, staged in shared memory and written by consecutive threads (a warp, or
//              a half-warp where MW <= 16, per row).  Grid (ceil(T/G), Co).
// fft_filter_grad: one thread per (r, o, i): Gc[f][o][i] -> the S taps of row r of dw = alpha * IDFT + beta * dw
//              (dw not read when beta == 0); with PARTS > 1 Gc is the sum of PARTS buffers PSTRIDE complex apart
//              (chunks over streams: one per stream).  Grid (ceil(R*Co*Ci / 256)).
#include "common.cuh"

#define FFT_THREADS 256
//: the widest filter row fft_filter_grad keeps in registers (and the most rows fft_filter's column pass keeps)
#define FFT_MAX_S 16

// (cos, sin)(2 pi j / TS) for j < TS into tw (shared), by the block's threads
template <int TS>
__device__ __forceinline__ void fft_twiddles(float2* tw)
{
    for (int j = threadIdx.x; j < TS; j += blockDim.x) {
        double s, c;
        sincospi(2.0 * j / TS, &s, &c);
        tw[j] = make_float2((float)c, (float)s);
    }
}

// cos / sin by Taylor series in double, at compile time: the twiddles of loops over constant indices become
// immediate operands of the FFMAs (no shared-memory loads, no registers); |x| <= pi, 24 terms: below 1e-17
__host__ __device__ constexpr double fft_series(double x, int first)
{
    double term = first ? x : 1.0, sum = term;
    int n = first;
    for (int i = 0; i < 24; ++i) {
        term *= -x * x / ((n + 1) * (n + 2));
        n += 2;
        sum += term;
    }
    return sum;
}

template <int TS> struct FftTwiddles {
    float c[TS];
    float s[TS];
    __host__ __device__ constexpr FftTwiddles() : c(), s()
    {
        constexpr double pi = 3.14159265358979323846;
        for (int j = 0; j < TS; ++j) {
            double x = 2.0 * pi * j / TS;
            if (x > pi) x -= 2.0 * pi;
            c[j] = (float)fft_series(x, 0);
            s[j] = (float)fft_series(x, 1);
        }
    }
};

// the image, tile row and tile column of global tile g
__device__ __forceinline__ void fft_tile_of(long long g, int TH, int TW, long long& img, int& th, int& tw)
{
    const long long per = (long long)TH * TW;
    img = g / per;
    const int rem = (int)(g - img * per);
    th = rem / TW;
    tw = rem - th * TW;
}

// Where each of a block's G tiles sits, decoded once per block (64-bit division, slow) by its first G threads: the
// element offset of its image (and channel), its first row and first column; row 2^30 for a tile past T.
template <int G>
__device__ __forceinline__ void fft_tile_table(long long t0, int tb, int T, int TH, int TW, int MH, int MW, int OH,
                                               int OW, long long sn, long long chan, long long (&base)[G],
                                               int (&row0)[G], int (&col0)[G])
{
    const int g = threadIdx.x;
    if (g < G) {
        if (tb + g < T) {
            long long img;
            int th, tw;
            fft_tile_of(t0 + tb + g, TH, TW, img, th, tw);
            base[g] = img * sn + chan;
            row0[g] = th * MH + OH;
            col0[g] = tw * MW + OW;
        } else {
            base[g] = 0;
            row0[g] = 1 << 30;   // past every row: read as zero, never written
            col0[g] = 0;
        }
    }
}

// The column DFT of col[0 .. TS-1] with its symmetric pairs folded: rows a and TS - a summed and differenced once,
// then for each k <= TS/2 that NEED(k) asks for, P = col[0] + (-1)^k col[TS/2] + sum_a sums[a] cos(2 pi k a / TS) and
// Q = sum_a differences[a] sin(2 pi k a / TS), handed to EMIT(k, P, Q): the forward transform's outputs k and TS - k
// are P - iQ and P + iQ, the inverse's P + iQ and P - iQ (fft_input's columns, fft_output's inverse columns).
template <int TS, typename Need, typename Emit>
__device__ __forceinline__ void fft_paired_columns(const float2 (&col)[TS], Need need, Emit emit)
{
    constexpr int H2 = TS / 2;
    constexpr FftTwiddles<TS> TWD{};
    float2 cs[H2], cd[H2];
#pragma unroll
    for (int a = 1; a < H2; ++a) {
        cs[a] = make_float2(col[a].x + col[TS - a].x, col[a].y + col[TS - a].y);
        cd[a] = make_float2(col[a].x - col[TS - a].x, col[a].y - col[TS - a].y);
    }
#pragma unroll
    for (int k = 0; k <= H2; ++k) {
        if (!need(k)) continue;
        const float sg = (k & 1) ? -1.f : 1.f;
        float pr = fmaf(sg, col[H2].x, col[0].x), pi = fmaf(sg, col[H2].y, col[0].y), qr = 0.f, qi = 0.f;
#pragma unroll
        for (int a = 1; a < H2; ++a) {
            const float ec = TWD.c[(k * a) % TS], es = TWD.s[(k * a) % TS];
            pr = fmaf(cs[a].x, ec, pr);
            pi = fmaf(cs[a].y, ec, pi);
            qr = fmaf(cd[a].x, es, qr);
            qi = fmaf(cd[a].y, es, qi);
        }
        emit(k, make_float2(pr, pi), make_float2(qr, qi));
    }
}

template <int TS, bool ROT>
__global__ void __launch_bounds__(FFT_THREADS)
fft_filter(const float* __restrict__ w, float2* __restrict__ U, int Co, int Ci, int R, int S, long long so,
           long long si, long long sr, long long ss, int parts)
{
    constexpr int HF = TS / 2 + 1;
    __shared__ float2 tw[TS];
    fft_twiddles<TS>(tw);
    __syncthreads();
    const long long oi_count = (long long)Co * Ci;
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= oi_count * HF * parts) return;
    const long long oi = idx % oi_count;
    const int kb = (int)((idx / oi_count) % HF), part = (int)(idx / (oi_count * HF));
    const int span = (TS + parts - 1) / parts, ka0 = part * span, ka1 = min(TS, ka0 + span);
    const int o = (int)(oi / Ci), i = (int)(oi - (long long)o * Ci);
    const float* g = w + o * so + i * si;
    // the rows' DFTs at column kb: X[r] = sum_s g[r][s] e^{+2 pi i kb s / TS}
    float2 X[FFT_MAX_S];
#pragma unroll
    for (int r = 0; r < FFT_MAX_S; ++r) {
        float re = 0.f, im = 0.f;
        if (r < R) {
            const int rr = ROT ? R - 1 - r : r;
            int j = 0;
            for (int s = 0; s < S; ++s) {
                const int sc = ROT ? S - 1 - s : s;
                const float v = __ldg(g + rr * sr + sc * ss);
                const float2 t = tw[j];
                re = fmaf(v, t.x, re);          // conj(sum v e^{-i theta}) = sum v cos + i sum v sin
                im = fmaf(v, t.y, im);
                j += kb;
                if (j >= TS) j -= TS;
            }
        }
        X[r] = make_float2(re, im);
    }
    // then down the column, rows ka0 .. ka1 - 1 of it: U[ka][kb] = sum_r X[r] e^{+2 pi i ka r / TS}
    for (int ka = ka0; ka < ka1; ++ka) {
        float re = 0.f, im = 0.f;
        int j = 0;
#pragma unroll
        for (int r = 0; r < FFT_MAX_S; ++r) {
            if (r < R) {
                const float2 t = tw[j];
                re = fmaf(X[r].x, t.x, fmaf(-X[r].y, t.y, re));
                im = fmaf(X[r].x, t.y, fmaf(X[r].y, t.x, im));
                j += ka;
                if (j >= TS) j -= TS;
            }
        }
        U[(long long)(ka * HF + kb) * oi_count + oi] = make_float2(re, im);
    }
}

// three blocks an SM where that fits in registers without spilling (TS <= 24: 80 registers, from 111 at TS 18; TS 32
// spills at 80); two otherwise
template <int TS, int G>
__global__ void __launch_bounds__(FFT_THREADS, TS <= 24 ? 3 : 2)
fft_input(const float* __restrict__ x, float2* __restrict__ V, int C, int T, long long t0, int TH, int TW, int MH,
          int MW, int H, int W, int OH, int OW, int WH, int WW, long long sn, long long sc, long long sh,
          long long sw)
{
    constexpr int HF = TS / 2 + 1, H2 = TS / 2;
    constexpr int LD = TS + 1;
    __shared__ float d[G][TS][LD];
    __shared__ float2 R[G][TS][HF + 1];
    __shared__ long long base[G];
    __shared__ int row0[G], col0[G];
    const int c = blockIdx.y;
    const int tb = blockIdx.x * G;
    fft_tile_table<G>(t0, tb, T, TH, TW, MH, MW, OH, OW, sn, c * sc, base, row0, col0);
    __syncthreads();
    // the G tiles' TS x TS elements, consecutive threads along a tile row (coalesced); zero outside the input, the
    // window and T.  Every load of a thread is issued before the first store to shared memory: with one load in flight
    // a thread (a loop of load, store) the transform waited on memory latency (the H200, AlexNet conv2's dy tiles,
    // 256 channels: 0.55 ms a call for what moves 0.5 GB)
    constexpr int ELEMS = G * TS * TS, EACH = (ELEMS + FFT_THREADS - 1) / FFT_THREADS;
    float v[EACH];
#pragma unroll
    for (int it = 0; it < EACH; ++it) {
        const int e = threadIdx.x + it * FFT_THREADS;
        const int g = e / (TS * TS), a = (e / TS) % TS, b = e % TS;
        v[it] = 0.f;
        if (e < ELEMS) {
            const int h = row0[g] + a, ww = col0[g] + b;
            if (a < WH && b < WW && h >= 0 && h < H && ww >= 0 && ww < W) v[it] = __ldg(x + base[g] + h * sh + ww * sw);
        }
    }
#pragma unroll
    for (int it = 0; it < EACH; ++it) {
        const int e = threadIdx.x + it * FFT_THREADS;
        if (e < ELEMS) d[e / (TS * TS)][(e / TS) % TS][e % TS] = v[it];
    }
    __syncthreads();
    constexpr FftTwiddles<TS> TWD{};
    // rows: R[g][a][kb] = sum_b d[g][a][b] e^{-2 pi i kb b / TS}
    for (int idx = threadIdx.x; idx < G * TS; idx += blockDim.x) {
        const int g = idx / TS, a = idx - g * TS;
        float row[TS];
#pragma unroll
        for (int b = 0; b < TS; ++b) row[b] = d[g][a][b];
        // b and TS - b share cos and negate sin: sums and differences halve the multiply-adds
        float ps[H2], ds[H2];
#pragma unroll
        for (int b = 1; b < H2; ++b) {
            ps[b] = row[b] + row[TS - b];
            ds[b] = row[b] - row[TS - b];
        }
#pragma unroll
        for (int kb = 0; kb < HF; ++kb) {
            float re = row[0] + ((kb & 1) ? -row[H2] : row[H2]), im = 0.f;
#pragma unroll
            for (int b = 1; b < H2; ++b) {
                re = fmaf(ps[b], TWD.c[(kb * b) % TS], re);
                im = fmaf(-ds[b], TWD.s[(kb * b) % TS], im);
            }
            R[g][a][kb] = make_float2(re, im);
        }
    }
    __syncthreads();
    // columns: V[ka][kb] = sum_a R[a][kb] e^{-2 pi i ka a / TS}; consecutive threads, consecutive tiles
    for (int idx = threadIdx.x; idx < G * HF; idx += blockDim.x) {
        const int kb = idx / G, g = idx - kb * G;
        const int t = tb + g;
        if (t >= T) continue;
        float2 col[TS];
#pragma unroll
        for (int a = 0; a < TS; ++a) col[a] = R[g][a][kb];
        float2* out = V + (long long)c * T + t;
        const long long plane = (long long)C * T;
        // V[ka] = P - iQ, V[TS - ka] = P + iQ
        fft_paired_columns<TS>(col, [](int) { return true; }, [&](int ka, float2 P, float2 Q) {
            out[(long long)(ka * HF + kb) * plane] = make_float2(P.x + Q.y, P.y - Q.x);
            if (ka > 0 && ka < H2) out[(long long)((TS - ka) * HF + kb) * plane] = make_float2(P.x - Q.y, P.y + Q.x);
        });
    }
}

template <int TS, int G>
__global__ void __launch_bounds__(FFT_THREADS)
fft_output(const float2* __restrict__ M, float* __restrict__ y, int K, int T, long long t0, int TH, int TW, int MH,
           int MW, int Ho, int Wo, long long sn, long long sc, long long sh, long long sw, float alpha, float beta)
{
    constexpr int HF = TS / 2 + 1, H2 = TS / 2;
    static_assert(TS % 2 == 0, "even tiles: the half spectrum's last column is real");
    __shared__ float2 Sx[G][TS][HF + 1];
    __shared__ float out[G][TS][TS];
    __shared__ long long base[G];
    __shared__ int row0[G], col0[G];
    const int k = blockIdx.y;
    const int tb = blockIdx.x * G;
    fft_tile_table<G>(t0, tb, T, TH, TW, MH, MW, 0, 0, sn, k * sc, base, row0, col0);
    constexpr FftTwiddles<TS> TWD{};
    const long long plane = (long long)K * T;
    // columns, inverse: Sx[g][a][kb] = sum_ka M[ka][kb] e^{+2 pi i ka a / TS}, a < MH
    for (int idx = threadIdx.x; idx < G * HF; idx += blockDim.x) {
        const int kb = idx / G, g = idx - kb * G;
        const int t = tb + g;
        if (t >= T) continue;
        const float2* in = M + (long long)k * T + t;
        float2 col[TS];
#pragma unroll
        for (int ka = 0; ka < TS; ++ka) col[ka] = in[(long long)(ka * HF + kb) * plane];
        // the rows a < MH only: S[a] = P + iQ, S[TS - a] = P - iQ
        fft_paired_columns<TS>(col, [&](int a) { return a < MH || (a > 0 && TS - a < MH); },
                               [&](int a, float2 P, float2 Q) {
            if (a < MH) Sx[g][a][kb] = make_float2(P.x - Q.y, P.y + Q.x);
            if (a > 0 && a < H2 && TS - a < MH) Sx[g][TS - a][kb] = make_float2(P.x + Q.y, P.y - Q.x);
        });
    }
    __syncthreads();
    // rows, inverse (half spectrum: weight 2 but for kb = 0 and kb = TS / 2): one thread per output row of a tile
    const float scale = alpha / (float)(TS * TS);
    for (int idx = threadIdx.x; idx < G * MH; idx += blockDim.x) {
        const int g = idx / MH, a = idx - g * MH;
        if (row0[g] + a >= Ho) continue;   // rows past the output (and tiles past T): not written
        float2 sp[HF];
#pragma unroll
        for (int kb = 0; kb < HF; ++kb) {
            const float wk = (kb == 0 || 2 * kb == TS) ? scale : 2.f * scale;
            sp[kb] = make_float2(wk * Sx[g][a][kb].x, wk * Sx[g][a][kb].y);
        }
        // columns b and TS - b share cos and negate sin: y[b] = P - Q, y[TS - b] = P + Q
#pragma unroll
        for (int b = 0; b <= H2; ++b) {
            if (b < MW || (b > 0 && TS - b < MW)) {
                float pc = 0.f, qs = 0.f;
#pragma unroll
                for (int kb = 0; kb < HF; ++kb) {
                    pc = fmaf(sp[kb].x, TWD.c[(kb * b) % TS], pc);
                    qs = fmaf(sp[kb].y, TWD.s[(kb * b) % TS], qs);
                }
                if (b < MW) out[g][a][b] = pc - qs;
                if (b > 0 && b < H2 && TS - b < MW) out[g][a][TS - b] = pc + qs;
            }
        }
    }
    __syncthreads();
    // the tiles' outputs to y: a warp per output row of a tile, a lane per column (coalesced), or a half-warp per row
    // where rows are 16 wide or less; (tile, row) advanced by additions, not divided out each row (a division by the
    // runtime MH a row was most of this kernel's instructions: the H200, AlexNet conv2, TS 18)
    const int lanes = MW <= 16 ? 16 : 32, per_warp = 32 / lanes;
    const int lane = threadIdx.x & (lanes - 1);
    const int first = (threadIdx.x >> 5) * per_warp + ((threadIdx.x & 31) >> (lanes == 16 ? 4 : 5));
    const int step = (FFT_THREADS >> 5) * per_warp;
    const int g_step = step / MH, a_step = step - g_step * MH;
    int g = first / MH, a = first - g * MH;
    while (g < G) {
        const int h = row0[g] + a, ww = col0[g] + lane;
        if (h < Ho && lane < MW && ww < Wo) {
            float* p = y + base[g] + h * sh + ww * sw;
            float v = out[g][a][lane];
            if (beta != 0.f) v = fmaf(beta, *p, v);
            *p = v;
        }
        g += g_step;
        a += a_step;
        if (a >= MH) {
            a -= MH;
            ++g;
        }
    }
}

template <int TS>
__global__ void __launch_bounds__(FFT_THREADS)
fft_filter_grad(const float2* __restrict__ Gc, float* __restrict__ dw, int Co, int Ci, int R, int S, long long so,
                long long si, long long sr, long long ss, float alpha, float beta, int parts, long long pstride)
{
    constexpr int HF = TS / 2 + 1;
    __shared__ float2 tw[TS];
    fft_twiddles<TS>(tw);
    __syncthreads();
    const long long oi_count = (long long)Co * Ci;
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= oi_count * R) return;
    const long long oi = idx % oi_count;
    const int r = (int)(idx / oi_count);
    const int o = (int)(oi / Ci), i = (int)(oi - (long long)o * Ci);
    float acc[FFT_MAX_S];
#pragma unroll
    for (int s = 0; s < FFT_MAX_S; ++s) acc[s] = 0.f;
    int ja = 0;   // (ka * r) mod TS
    for (int ka = 0; ka < TS; ++ka) {
        const float2 ea = tw[ja];
        for (int kb = 0; kb < HF; ++kb) {
            const long long at = (long long)(ka * HF + kb) * oi_count + oi;
            float2 gv = Gc[at];
            for (int p = 1; p < parts; ++p) {   // chunks over streams: one Gc per stream, summed here
                const float2 q = Gc[p * pstride + at];
                gv.x += q.x;
                gv.y += q.y;
            }
            // z = conj(gv) e^{+2 pi i ka r / TS}
            const float zx = gv.x * ea.x + gv.y * ea.y, zy = gv.x * ea.y - gv.y * ea.x;
            const float wk = (kb == 0 || 2 * kb == TS) ? 1.f : 2.f;
            int j = 0;
#pragma unroll
            for (int s = 0; s < FFT_MAX_S; ++s) {
                if (s < S) {
                    const float2 e = tw[j];
                    acc[s] = fmaf(wk, zx * e.x - zy * e.y, acc[s]);
                }
                j += kb;
                if (j >= TS) j -= TS;
            }
        }
        ja += r;
        if (ja >= TS) ja -= TS;
    }
    const float scale = alpha / (float)(TS * TS);
    float* p = dw + o * so + i * si + r * sr;
#pragma unroll
    for (int s = 0; s < FFT_MAX_S; ++s) {
        if (s < S) {
            float v = scale * acc[s];
            if (beta != 0.f) v = fmaf(beta, p[s * ss], v);
            p[s * ss] = v;
        }
    }
}

#ifdef UCUDNN_NVCC_CHECK
#define FFT_INSTANTIATE(TS, G)                                                                                       \
    template __global__ void fft_filter<TS, false>(const float*, float2*, int, int, int, int, long long, long long,    \
                                                   long long, long long, int);                                        \
    template __global__ void fft_filter<TS, true>(const float*, float2*, int, int, int, int, long long, long long,     \
                                                  long long, long long, int);                                         \
    template __global__ void fft_input<TS, G>(const float*, float2*, int, int, long long, int, int, int, int, int, int, \
                                              int, int, int, int, long long, long long, long long, long long);       \
    template __global__ void fft_output<TS, G>(const float2*, float*, int, int, long long, int, int, int, int, int,    \
                                               int, long long, long long, long long, long long, float, float);       \
    template __global__ void fft_filter_grad<TS>(const float2*, float*, int, int, int, int, long long, long long,      \
                                                 long long, long long, float, float, int, long long);
FFT_INSTANTIATE(8, 32)
FFT_INSTANTIATE(16, 16)
FFT_INSTANTIATE(18, 16)
FFT_INSTANTIATE(24, 8)
FFT_INSTANTIATE(32, 4)
#endif
