// Fused convolution blocks (seed 004, "cross-layer data reuse"): two or three consecutive convolution layers of a
// block in ONE kernel, the intermediate activation kept in shared memory, bias and activation (none, ReLU or
// ReLU6 per layer) between the layers.
//
// A block description (kernels/fused.py: Block) is instantiated as C++ template arguments -- one Layer<...> type
// per convolution, the tiling as Tile<...> -- so every channel count, filter size, stride, pad and activation is a
// compile-time constant and the loops over taps and register tiles unroll.  The three modes of the seed map onto
// one kernel, fused_block<T, NHWC, P1, P2, C1, C2, MRELU, TL>, with two producer slots and two consumer slots:
//
//   straight  P1 (from x) -> mid -> C1                         (GoogLeNet 1x1 -> 5x5, MobileNet dw -> pw)
//   split     P1 (from x) -> mid -> C1 and C2, concatenated    (SqueezeNet fire: squeeze -> expand 1x1 | 3x3)
//   merge     P1 (from x) + P2 (from x2) -> mid -> C1          (ResNet: the two 1x1 convolutions whose sum the
//             residual add forms, ReLU after the add (MRELU), then the next 1x1)
//
// An unused slot is NoLayer.  Each block of threads owns one sample (blockIdx.z), one TH x TW tile of the output
// plane (blockIdx.x, tiles row-major) and one of KS slices of every consumer's output channels (blockIdx.y):
//
//   1. (consumers with R*S > 1 and C/G > 1) stage this slice's filter taps into shared memory as float,
//      transposed to [c][tap][k] so that a thread's KT filters are one vector load (a broadcast across the warp);
//   2. produce the intermediate ("mid", P1::K channels) over the tile's halo region -- MH x MW positions: the
//      union of every consumer's window over the tile --, bias, activation; positions outside the intermediate
//      plane are stored as 0, which is the consumers' zero padding (the seed's "pad in shared memory after the
//      first layer").  Dense 1x1 producers (a.1, b.1, c.1: a GEMM over input channels) run produce_pipelined:
//      PCC input channels of x over the halo and of the filters at a time are staged in shared memory, the next
//      chunk's loads in flight (registers) while the current one is computed -- at batch 1 these kernels are
//      bound by L2 latency, and one dependent load per channel (the first version) was 2x slower.  Other
//      producers (depthwise / spatial: a.2) read x straight from global memory (L1), tap by tap;
//   3. __syncthreads(), then each consumer reads mid from shared memory and writes its channels of y
//      (split: C1's at [0, C1::K), C2's after them).
//
// Both stages hand out work items of PX output pixels x KT output channels (a register tile of float
// accumulators per thread): item i -> channel block i / PB, pixel slot i % PB, pixels slot + u * PB (u < PX), so a
// warp's lanes hold neighbouring pixels (coalesced x / y, conflict-free shared memory) and one channel block
// (weights: one broadcast load).  Filters of 1x1 layers are read from global memory (L1) WV input channels at a
// time; others tap by tap.  Arithmetic is float32 FMA (no tensor cores); T = half_t stores activations,
// filters and biases in 16 bits.  Nothing but y is written: no workspace.  The index math is mirrored in
// kernels/fused.py and emulated block by block on the CPU (tests/test_fused.py).
#include "common.cuh"

// A layer's activation after its bias: act<ACT_NONE | ACT_RELU | ACT_RELU6> (common.cuh).

// One convolution: K outputs, C inputs, R x S filter, stride (SH, SW), zero padding (PH, PW), G groups; bias, then
// ReLU (RELU_) or ReLU6 (RELU6_; defaults to false, so the names of layers without it read as before).
template <int K_, int C_, int R_, int S_, int SH_, int SW_, int PH_, int PW_, int G_, bool BIAS_, bool RELU_,
          bool RELU6_ = false>
struct Layer {
    static constexpr int K = K_, C = C_, R = R_, S = S_, SH = SH_, SW = SW_, PH = PH_, PW = PW_, G = G_;
    static constexpr int CG = C / G, KG = K / G, RS = R * S;
    static constexpr bool BIAS = BIAS_, NONE = false;
    static constexpr int ACT = RELU6_ ? ACT_RELU6 : RELU_ ? ACT_RELU : ACT_NONE;
    static_assert(K % G == 0 && C % G == 0, "channels must divide into the groups");
    static_assert(!(RELU_ && RELU6_), "ReLU6 replaces the ReLU");
};

struct NoLayer {
    static constexpr int K = 0, C = 0, R = 1, S = 1, SH = 1, SW = 1, PH = 0, PW = 0, G = 1;
    static constexpr int CG = 1, KG = 1, RS = 1;
    static constexpr bool BIAS = false, NONE = true;
    static constexpr int ACT = ACT_NONE;
};

// The tiling: TH x TW output tile, KS channel slices, NT threads; (PX, KT) of the producer stage and of each
// consumer (kernels/fused.py: stage_work picks them).
template <int TH_, int TW_, int KS_, int NT_, int PPX_, int PKT_, int C1PX_, int C1KT_, int C2PX_, int C2KT_,
          int PCC_>
struct Tile {
    static constexpr int TH = TH_, TW = TW_, KS = KS_, NT = NT_;
    static constexpr int PPX = PPX_, PKT = PKT_, C1PX = C1PX_, C1KT = C1KT_, C2PX = C2PX_, C2KT = C2KT_;
    static constexpr int PCC = PCC_;  // > 0: the pipelined 1x1 producer, PCC input channels per stage
};

__host__ __device__ constexpr int cmax(int a, int b) { return a > b ? a : b; }

// Compile-time geometry of one instantiation (fused.py: Geometry mirrors it).
template <class P1, class P2, class C1, class C2, class TL>
struct Geometry {
    static constexpr int SH = C1::SH, SW = C1::SW;  // consumers share their stride (split: same output plane)
    static constexpr int LOH = cmax(C1::PH, C2::PH), LOW = cmax(C1::PW, C2::PW);
    static constexpr int HIH = cmax(C1::R - 1 - C1::PH, C2::R - 1 - C2::PH);
    static constexpr int HIW = cmax(C1::S - 1 - C1::PW, C2::S - 1 - C2::PW);
    static constexpr int MH = (TL::TH - 1) * SH + LOH + HIH + 1, MW = (TL::TW - 1) * SW + LOW + HIW + 1;
    static constexpr int MPLANE = MH * MW, KM = P1::K;
    static constexpr int K1S = C1::K / TL::KS, K2S = C2::K / TL::KS, KY = C1::K + C2::K;
    static constexpr bool WS1 = C1::RS > 1 && C1::CG > 1, WS2 = !C2::NONE && C2::RS > 1 && C2::CG > 1;
    static constexpr int MID_FLOATS = (KM * MPLANE + 3) / 4 * 4;
    static constexpr int WS1_FLOATS = WS1 ? C1::CG * C1::RS * K1S : 0;
    static constexpr int WS2_FLOATS = WS2 ? C2::CG * C2::RS * K2S : 0;
    // pipelined producer: per buffer x [NPROD][PCC][MPLANE] then filters [NPROD][PCC][KMP]; two buffers
    static constexpr int NPROD = P2::NONE ? 1 : 2, KMP = (KM + 3) / 4 * 4 + 4;
    static constexpr int XBUF = (NPROD * TL::PCC * MPLANE + 3) / 4 * 4, WBUF = NPROD * TL::PCC * KMP;
    static constexpr int PIPE_FLOATS = TL::PCC > 0 ? 2 * (XBUF + WBUF) : 0;
    static_assert(C1::K % TL::KS == 0 && C2::K % TL::KS == 0, "KS must divide every consumer's channels");
    static_assert(P2::NONE || (P2::K == P1::K), "merged producers must agree on channels");
    static_assert(C2::NONE || (C2::SH == C1::SH && C2::SW == C1::SW), "split consumers share their stride");
    static_assert(C1::C == P1::K && (C2::NONE || C2::C == P1::K), "consumers read the intermediate");
};

// Element offset of pixel (h, w) of one sample and the stride between its channels.
template <bool NHWC> __device__ __forceinline__ long long pix_at(int h, int w, int C, int W) {
    return NHWC ? ((long long)h * W + w) * C : (long long)h * W + w;
}

// Filter element (k, c, i, j): [K][CG][R][S] with NCHW activations, [K][R][S][CG] with NHWC (cuDNN's formats).
template <bool NHWC, class L> __device__ __forceinline__ long long filt(int k, int c, int i, int j) {
    return NHWC ? (((long long)k * L::R + i) * L::S + j) * L::CG + c
                : (((long long)k * L::CG + c) * L::R + i) * L::S + j;
}

template <typename T> __device__ __forceinline__ float bias_of(const T* b, int k) { return to_float(b[k]); }

// KT consecutive floats from shared memory in the widest aligned vectors (p is 4*VW-byte aligned by construction).
template <int KT, int VW> __device__ __forceinline__ void load_row(const float* p, float (&v)[KT]) {
    if constexpr (VW == 4) {
#pragma unroll
        for (int q = 0; q < KT / 4; ++q) {
            const float4 f = reinterpret_cast<const float4*>(p)[q];
            v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
        }
    } else if constexpr (VW == 2) {
#pragma unroll
        for (int q = 0; q < KT / 2; ++q) {
            const float2 f = reinterpret_cast<const float2*>(p)[q];
            v[2 * q] = f.x, v[2 * q + 1] = f.y;
        }
    } else {
#pragma unroll
        for (int q = 0; q < KT; ++q) v[q] = p[q];
    }
}

// Input channels a 1x1 layer's filters are read at once: WV contiguous values (16 bytes of float, 8 of half).
template <class L> __host__ __device__ constexpr int weight_vector() {
    return L::RS == 1 ? (L::CG % 4 == 0 ? 4 : L::CG % 2 == 0 ? 2 : 1) : 1;
}

// acc[u][kt] += sum over the CG input channels c of x_at(c, u) * w(kt, c): a 1x1 layer whose KT filters read the same
// input channels (wk: the first filter's weights), WV weights of each filter per vector load (a broadcast across the
// warp).  x_at(c, u) is pixel u's value of input channel c: from global memory (producers) or from the intermediate
// in shared memory (consumers).
template <typename T, int PX, int KT, int CG, int WV, typename XAt>
__device__ __forceinline__ void reduce_1x1(float (&acc)[PX][KT], const T* __restrict__ wk, XAt x_at) {
#pragma unroll 1
    for (int cc = 0; cc < CG; cc += WV) {
        float wv[KT][WV];
#pragma unroll
        for (int kt = 0; kt < KT; ++kt) {
            Pack<T, WV> pk;
            pk.load(wk + kt * CG + cc);
#pragma unroll
            for (int v = 0; v < WV; ++v) wv[kt][v] = to_float(pk.e[v]);
        }
#pragma unroll
        for (int v = 0; v < WV; ++v) {
            float xv[PX];
#pragma unroll
            for (int u = 0; u < PX; ++u) xv[u] = x_at(cc + v, u);
#pragma unroll
            for (int u = 0; u < PX; ++u)
#pragma unroll
                for (int kt = 0; kt < KT; ++kt) acc[u][kt] = fmaf(xv[u], wv[kt][v], acc[u][kt]);
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Producer reduction: acc[u][kt] += sum over layer L's window of x(c, hb[u] + i, wb[u] + j) * w(k0 + kt, c, i, j),
// x read from global memory (zero outside the input plane).
template <typename T, bool NHWC, class L, int PX, int KT>
__device__ __forceinline__ void reduce_global(float (&acc)[PX][KT], const T* __restrict__ xn, int H, int W,
                                              const int (&hb)[PX], const int (&wb)[PX], const T* __restrict__ w,
                                              int k0) {
    constexpr int CG = L::CG, KG = L::KG;
    constexpr bool SHARED = KG % KT == 0;  // the KT filters read the same input channels
    const long long cs = NHWC ? 1 : (long long)H * W;
    if constexpr (L::RS == 1) {
        long long off[PX];
        bool ok[PX];
#pragma unroll
        for (int u = 0; u < PX; ++u) {
            ok[u] = hb[u] >= 0 && hb[u] < H && wb[u] >= 0 && wb[u] < W;
            off[u] = ok[u] ? pix_at<NHWC>(hb[u], wb[u], L::C, W) : 0;
        }
        if constexpr (SHARED) {
            constexpr int WV = weight_vector<L>();
            const T* xg = xn + (long long)(k0 / KG) * CG * cs;
            reduce_1x1<T, PX, KT, CG, WV>(acc, w + (long long)k0 * CG, [&](int c, int u) {
                return ok[u] ? to_float(xg[c * cs + off[u]]) : 0.f;
            });
        } else {
#pragma unroll 1
            for (int cc = 0; cc < CG; ++cc) {
#pragma unroll
                for (int kt = 0; kt < KT; ++kt) {
                    const int k = k0 + kt, c = (k / KG) * CG + cc;
                    const float wv = to_float(w[(long long)k * CG + cc]);
#pragma unroll
                    for (int u = 0; u < PX; ++u)
                        acc[u][kt] = fmaf(ok[u] ? to_float(xn[c * cs + off[u]]) : 0.f, wv, acc[u][kt]);
                }
            }
        }
    } else {
#pragma unroll 1
        for (int cc = 0; cc < CG; ++cc) {
#pragma unroll
            for (int i = 0; i < L::R; ++i) {
#pragma unroll
                for (int j = 0; j < L::S; ++j) {
                    float wv[KT];
#pragma unroll
                    for (int kt = 0; kt < KT; ++kt) wv[kt] = to_float(w[filt<NHWC, L>(k0 + kt, cc, i, j)]);
                    float xv[PX][SHARED ? 1 : KT];
#pragma unroll
                    for (int u = 0; u < PX; ++u) {
                        const int h = hb[u] + i, ww = wb[u] + j;
                        const bool ok = h >= 0 && h < H && ww >= 0 && ww < W;
                        const long long o = ok ? pix_at<NHWC>(h, ww, L::C, W) : 0;
#pragma unroll
                        for (int t = 0; t < (SHARED ? 1 : KT); ++t) {
                            const int c = ((k0 + t) / KG) * CG + cc;
                            xv[u][t] = ok ? to_float(xn[c * cs + o]) : 0.f;
                        }
                    }
#pragma unroll
                    for (int u = 0; u < PX; ++u)
#pragma unroll
                        for (int kt = 0; kt < KT; ++kt)
                            acc[u][kt] = fmaf(xv[u][SHARED ? 0 : kt], wv[kt], acc[u][kt]);
                }
            }
        }
    }
}

// Consumer reduction from the intermediate in shared memory ([KM][MH][MW] floats): pixel u's window starts at
// mid offset base[u]; filters from the staged [c][tap][KSL] copy (WS) or from global memory.
template <typename T, bool NHWC, class L, int PX, int KT, int MPLANE, int MW, int KSL, bool WS>
__device__ __forceinline__ void reduce_smem(float (&acc)[PX][KT], const float* __restrict__ mid,
                                            const int (&base)[PX], const T* __restrict__ w,
                                            const float* __restrict__ ws, int k0, int kk0) {
    constexpr int CG = L::CG, KG = L::KG, RS = L::RS;
    constexpr bool SHARED = KG % KT == 0;
    static_assert(!WS || SHARED, "a staged consumer's KT filters lie in one group");
    if constexpr (WS) {
        constexpr int VW = (KT % 4 == 0 && KSL % 4 == 0) ? 4 : (KT % 2 == 0 && KSL % 2 == 0) ? 2 : 1;
        const int g = k0 / KG;
#pragma unroll 1
        for (int cc = 0; cc < CG; ++cc) {
            const float* mc = mid + (g * CG + cc) * MPLANE;
            const float* wc = ws + cc * RS * KSL + kk0;
#pragma unroll
            for (int i = 0; i < L::R; ++i) {
#pragma unroll
                for (int j = 0; j < L::S; ++j) {
                    float wv[KT];
                    load_row<KT, VW>(wc + (i * L::S + j) * KSL, wv);
                    float xv[PX];
#pragma unroll
                    for (int u = 0; u < PX; ++u) xv[u] = mc[base[u] + i * MW + j];
#pragma unroll
                    for (int u = 0; u < PX; ++u)
#pragma unroll
                        for (int kt = 0; kt < KT; ++kt) acc[u][kt] = fmaf(xv[u], wv[kt], acc[u][kt]);
                }
            }
        }
    } else if constexpr (RS == 1 && SHARED) {
        constexpr int WV = weight_vector<L>();
        const float* mg = mid + (k0 / KG) * CG * MPLANE;
        reduce_1x1<T, PX, KT, CG, WV>(acc, w + (long long)k0 * CG, [&](int c, int u) {
            return mg[c * MPLANE + base[u]];
        });
    } else {
#pragma unroll 1
        for (int cc = 0; cc < CG; ++cc) {
#pragma unroll
            for (int i = 0; i < L::R; ++i) {
#pragma unroll
                for (int j = 0; j < L::S; ++j) {
#pragma unroll
                    for (int kt = 0; kt < KT; ++kt) {
                        const int k = k0 + kt;
                        const float wv = to_float(w[filt<NHWC, L>(k, cc, i, j)]);
                        const float* mc = mid + ((k / KG) * CG + cc) * MPLANE + i * MW + j;
#pragma unroll
                        for (int u = 0; u < PX; ++u) acc[u][kt] = fmaf(mc[base[u]], wv, acc[u][kt]);
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Stage 1: the intermediate over the halo region, MH x MW positions from (m0, n0) of the intermediate plane.
template <typename T, bool NHWC, class P1, class P2, bool MRELU, class G, int NT, int PX, int KT>
__device__ __forceinline__ void produce(float* __restrict__ mid, const T* __restrict__ xn, const T* __restrict__ x2n,
                                        const T* __restrict__ w1, const T* __restrict__ b1,
                                        const T* __restrict__ w2, const T* __restrict__ b2, int H, int W, int H2,
                                        int W2, int MP, int MQ, int m0, int n0) {
    constexpr int NPIX = G::MPLANE, PB = (NPIX + PX - 1) / PX, KB = G::KM / KT, ITEMS = PB * KB;
    constexpr int MACT = MRELU ? ACT_RELU : ACT_NONE;  // after the merge's add: a plain ReLU or nothing
    static_assert(G::KM % KT == 0, "KT divides the intermediate's channels");
#pragma unroll 1
    for (int item = threadIdx.x; item < ITEMS; item += NT) {
        const int kb = item / PB, ps = item - kb * PB, k0 = kb * KT;
        int pix[PX], hb[PX], wb[PX];
        bool in[PX];
#pragma unroll
        for (int u = 0; u < PX; ++u) {
            const int p = ps + u * PB;
            pix[u] = p < NPIX ? p : -1;
            const int pc = p < NPIX ? p : 0;
            const int mh = pc / G::MW, mw = pc - mh * G::MW, m = m0 + mh, q = n0 + mw;
            in[u] = m >= 0 && m < MP && q >= 0 && q < MQ;
            hb[u] = m * P1::SH - P1::PH;
            wb[u] = q * P1::SW - P1::PW;
        }
        float acc[PX][KT];
#pragma unroll
        for (int u = 0; u < PX; ++u)
#pragma unroll
            for (int kt = 0; kt < KT; ++kt) acc[u][kt] = 0.f;
        reduce_global<T, NHWC, P1, PX, KT>(acc, xn, H, W, hb, wb, w1, k0);
        float v[PX][KT];
        if constexpr (P2::NONE) {
#pragma unroll
            for (int kt = 0; kt < KT; ++kt) {
                const float bb = P1::BIAS ? bias_of(b1, k0 + kt) : 0.f;
#pragma unroll
                for (int u = 0; u < PX; ++u) v[u][kt] = act<P1::ACT>(acc[u][kt] + bb);
            }
        } else {
            int hb2[PX], wb2[PX];
#pragma unroll
            for (int u = 0; u < PX; ++u) {
                const int pc = pix[u] >= 0 ? pix[u] : 0;
                const int mh = pc / G::MW, mw = pc - mh * G::MW;
                hb2[u] = (m0 + mh) * P2::SH - P2::PH;
                wb2[u] = (n0 + mw) * P2::SW - P2::PW;
            }
            if constexpr (P1::ACT != ACT_NONE || P2::ACT != ACT_NONE) {  // activations before the add: two sums
#pragma unroll
                for (int kt = 0; kt < KT; ++kt) {
                    const float bb = P1::BIAS ? bias_of(b1, k0 + kt) : 0.f;
#pragma unroll
                    for (int u = 0; u < PX; ++u) v[u][kt] = act<P1::ACT>(acc[u][kt] + bb), acc[u][kt] = 0.f;
                }
                reduce_global<T, NHWC, P2, PX, KT>(acc, x2n, H2, W2, hb2, wb2, w2, k0);
#pragma unroll
                for (int kt = 0; kt < KT; ++kt) {
                    const float bb = P2::BIAS ? bias_of(b2, k0 + kt) : 0.f;
#pragma unroll
                    for (int u = 0; u < PX; ++u) v[u][kt] = act<MACT>(v[u][kt] + act<P2::ACT>(acc[u][kt] + bb));
                }
            } else {                               // linear producers: one accumulator, both biases at the end
                reduce_global<T, NHWC, P2, PX, KT>(acc, x2n, H2, W2, hb2, wb2, w2, k0);
#pragma unroll
                for (int kt = 0; kt < KT; ++kt) {
                    const float bb = (P1::BIAS ? bias_of(b1, k0 + kt) : 0.f) + (P2::BIAS ? bias_of(b2, k0 + kt) : 0.f);
#pragma unroll
                    for (int u = 0; u < PX; ++u) v[u][kt] = act<MACT>(acc[u][kt] + bb);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < PX; ++u) {
            if (pix[u] < 0) continue;
#pragma unroll
            for (int kt = 0; kt < KT; ++kt) mid[(k0 + kt) * NPIX + pix[u]] = in[u] ? v[u][kt] : 0.f;
        }
    }
}

// Stage 2: consumer L over the TH x TW tile at (p0, q0), channels [ks0, ks0 + KSL), written to y's channels
// coff + k.  OFFH / OFFW: where L's window starts inside the halo region (split consumers of smaller windows).
template <typename T, bool NHWC, class L, class G, class TL, int PX, int KT, int KSL, bool WS, int OFFH, int OFFW>
__device__ __forceinline__ void consume(const float* __restrict__ mid, const float* __restrict__ ws,
                                        const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ yn,
                                        int coff, int ks0, int P, int Q, int p0, int q0) {
    constexpr int NPIX = TL::TH * TL::TW, PB = (NPIX + PX - 1) / PX, KB = KSL / KT, ITEMS = PB * KB;
    static_assert(KSL % KT == 0, "KT divides the slice");
#pragma unroll 1
    for (int item = threadIdx.x; item < ITEMS; item += TL::NT) {
        const int kb = item / PB, ps = item - kb * PB, kk0 = kb * KT, k0 = ks0 + kk0;
        int base[PX], oh[PX], ow[PX];
        bool ok[PX];
#pragma unroll
        for (int u = 0; u < PX; ++u) {
            const int p = ps + u * PB, pc = p < NPIX ? p : 0;
            oh[u] = pc / TL::TW;
            ow[u] = pc - oh[u] * TL::TW;
            ok[u] = p < NPIX && p0 + oh[u] < P && q0 + ow[u] < Q;
            base[u] = (oh[u] * L::SH + OFFH) * G::MW + ow[u] * L::SW + OFFW;
        }
        float acc[PX][KT];
#pragma unroll
        for (int u = 0; u < PX; ++u)
#pragma unroll
            for (int kt = 0; kt < KT; ++kt) acc[u][kt] = 0.f;
        reduce_smem<T, NHWC, L, PX, KT, G::MPLANE, G::MW, KSL, WS>(acc, mid, base, w, ws, k0, kk0);
#pragma unroll
        for (int kt = 0; kt < KT; ++kt) {
            const float bb = L::BIAS ? bias_of(b, k0 + kt) : 0.f;
            const int c = coff + k0 + kt;
#pragma unroll
            for (int u = 0; u < PX; ++u) {
                if (!ok[u]) continue;
                const long long o = NHWC ? ((long long)(p0 + oh[u]) * Q + q0 + ow[u]) * G::KY + c
                                         : ((long long)c * P + p0 + oh[u]) * Q + q0 + ow[u];
                yn[o] = from_float<T>(act<L::ACT>(acc[u][kt] + bb));
            }
        }
    }
}

// Filters of consumer L's slice [ks0, ks0 + KSL) into shared memory, transposed: ws[(c * RS + tap) * KSL + kk].
// Lanes walk 4 consecutive source elements x 8 filters (16-byte runs of global memory, few bank conflicts).
template <typename T, bool NHWC, class L, int NT, int KSL>
__device__ __forceinline__ void stage_weights(float* __restrict__ ws, const T* __restrict__ w, int ks0) {
    constexpr int CGRS = L::CG * L::RS, K8 = (KSL + 7) / 8, R4 = (CGRS + 3) / 4, COUNT = 32 * K8 * R4, U = 8;
#pragma unroll 1
    for (int e0 = threadIdx.x; e0 < COUNT; e0 += U * NT) {  // U loads in flight per thread, then U stores
        float v[U];
        int dst[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int e = e0 + u * NT;
            const int chunk = e >> 5, kk = (chunk % K8) * 8 + ((e >> 2) & 7), r = (chunk / K8) * 4 + (e & 3);
            dst[u] = -1;
            if (e >= COUNT || kk >= KSL || r >= CGRS) continue;
            int cc, ij;  // source order: [k][c][tap] (NCHW) or [k][tap][c] (NHWC)
            if (NHWC) {
                ij = r / L::CG;
                cc = r - ij * L::CG;
            } else {
                cc = r / L::RS;
                ij = r - cc * L::RS;
            }
            dst[u] = (cc * L::RS + ij) * KSL + kk;
            v[u] = to_float(w[(long long)(ks0 + kk) * CGRS + r]);
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (dst[u] >= 0) ws[dst[u]] = v[u];
    }
}


// Stage 1, pipelined (1x1 producers, one group): the reduction walks the input channels PCC at a time; each chunk
// of x over the halo region ([NPROD][PCC][MPLANE], zero outside the input plane and past the channels) and of the
// filters (transposed, [NPROD][PCC][KMP]) is loaded by all threads into registers while the previous chunk is
// computed from the other shared-memory buffer (direct.cu's register prefetch), so every thread has XPF + WPF
// loads in flight at once instead of one chain of dependent loads.  One work item per thread (ITEMS <= NT).
template <typename T, bool NHWC, class P1, class P2, bool MRELU, class G, int NT, int PX, int KT, int CC>
__device__ __forceinline__ void produce_pipelined(float* __restrict__ mid, float* __restrict__ pipe,
                                                  const T* __restrict__ xn, const T* __restrict__ x2n,
                                                  const T* __restrict__ w1, const T* __restrict__ b1,
                                                  const T* __restrict__ w2, const T* __restrict__ b2, int H, int W,
                                                  int H2, int W2, int MP, int MQ, int m0, int n0) {
    constexpr int NPIX = G::MPLANE, KM = G::KM, KMP = G::KMP, NPROD = G::NPROD;
    constexpr int PB = (NPIX + PX - 1) / PX, ITEMS = PB * (KM / KT);
    // filters move FV input channels at a time where every producer's channels allow (1x1: [K][C] rows)
    constexpr int FV = (P1::C % 4 == 0 && (P2::NONE || P2::C % 4 == 0)) ? 4 : 1;
    constexpr int XE = NPROD * CC * NPIX, WE = NPROD * (CC / FV) * KM;
    constexpr int XPF = (XE + NT - 1) / NT, WPF = (WE + NT - 1) / NT;
    constexpr int CMAX = cmax(P1::C, P2::C), NCH = (CMAX + CC - 1) / CC;
    // separate sums where an activation comes before the add
    constexpr bool TWO = !P2::NONE && (P1::ACT != ACT_NONE || P2::ACT != ACT_NONE);
    constexpr int MACT = MRELU ? ACT_RELU : ACT_NONE;
    constexpr int VW = (KT % 4 == 0) ? 4 : (KT % 2 == 0) ? 2 : 1;
    static_assert(ITEMS <= NT, "one producer item per thread");
    static_assert(P1::RS == 1 && P1::G == 1 && (P2::NONE || (P2::RS == 1 && P2::G == 1)), "1x1 dense producers");
    const int item = threadIdx.x;
    const bool active = item < ITEMS;
    const int kb = active ? item / PB : 0, ps = item - kb * PB, k0 = kb * KT;
    int pix[PX];
#pragma unroll
    for (int u = 0; u < PX; ++u) {
        const int p = ps + u * PB;
        pix[u] = (active && p < NPIX) ? p : -1;
    }
    float acc[PX][KT], acc2[TWO ? PX : 1][TWO ? KT : 1];
#pragma unroll
    for (int u = 0; u < PX; ++u)
#pragma unroll
        for (int kt = 0; kt < KT; ++kt) acc[u][kt] = 0.f;
    if constexpr (TWO) {
#pragma unroll
        for (int u = 0; u < PX; ++u)
#pragma unroll
            for (int kt = 0; kt < KT; ++kt) acc2[u][kt] = 0.f;
    }
    // x: XPF scalars per thread; filters: WPF packs of FV input channels (one 16- or 8-byte load each).  Offsets are
    // 32-bit (the launcher refuses samples of 2**31 elements or more): fewer registers per prefetched element.
    float xv_[XPF], wv_[WPF][FV];
    int xd[XPF], wd[WPF];
    auto fetch = [&](int c0) {
#pragma unroll
        for (int f = 0; f < XPF; ++f) {
            const int e = threadIdx.x + f * NT;
            xd[f] = -1;
            xv_[f] = 0.f;
            if (e >= XE) continue;
            const int pr = e / (CC * NPIX), r = e - pr * (CC * NPIX), cc = r / NPIX, pp = r - cc * NPIX;
            const int mh = pp / G::MW, mw = pp - mh * G::MW, c = c0 + cc;
            xd[f] = (pr * CC + cc) * NPIX + pp;
            if (pr == 0) {
                const int h = (m0 + mh) * P1::SH - P1::PH, w = (n0 + mw) * P1::SW - P1::PW;
                if (c < P1::C && h >= 0 && h < H && w >= 0 && w < W)
                    xv_[f] = to_float(xn[NHWC ? (h * W + w) * P1::C + c : (c * H + h) * W + w]);
            } else {
                const int h = (m0 + mh) * P2::SH - P2::PH, w = (n0 + mw) * P2::SW - P2::PW;
                if (c < P2::C && h >= 0 && h < H2 && w >= 0 && w < W2)
                    xv_[f] = to_float(x2n[NHWC ? (h * W2 + w) * P2::C + c : (c * H2 + h) * W2 + w]);
            }
        }
#pragma unroll
        for (int f = 0; f < WPF; ++f) {
            const int e = threadIdx.x + f * NT;  // pack e: producer, output k, channels [cc, cc + FV)
            wd[f] = -1;
#pragma unroll
            for (int j = 0; j < FV; ++j) wv_[f][j] = 0.f;
            if (e >= WE) continue;
            const int pr = e / (CC / FV * KM), r = e - pr * (CC / FV * KM), k = r / (CC / FV);
            const int cc = (r - k * (CC / FV)) * FV, c = c0 + cc;
            wd[f] = G::XBUF + (pr * CC + cc) * KMP + k;
            const T* src = pr == 0 ? w1 + k * P1::C + c : w2 + k * P2::C + c;
            if (c < (pr == 0 ? P1::C : P2::C)) {
                if constexpr (FV > 1) {
                    Pack<T, FV> pk;
                    pk.load(src);
#pragma unroll
                    for (int j = 0; j < FV; ++j) wv_[f][j] = to_float(pk.e[j]);
                } else {
                    wv_[f][0] = to_float(*src);
                }
            }
        }
    };
    auto land = [&](float* buf) {
#pragma unroll
        for (int f = 0; f < XPF; ++f)
            if (xd[f] >= 0) buf[xd[f]] = xv_[f];
#pragma unroll
        for (int f = 0; f < WPF; ++f)
            if (wd[f] >= 0) {
#pragma unroll
                for (int j = 0; j < FV; ++j) buf[wd[f] + j * KMP] = wv_[f][j];
            }
    };
    float* const buf0 = pipe;
    float* const buf1 = pipe + G::XBUF + G::WBUF;
    fetch(0);
    land(buf0);
    __syncthreads();
#pragma unroll 1
    for (int ch = 0; ch < NCH; ++ch) {
        float* const cur = (ch & 1) ? buf1 : buf0;
        const bool more = ch + 1 < NCH;
        if (more) fetch((ch + 1) * CC);
        if (active) {
#pragma unroll 1
            for (int cc = 0; cc < CC; ++cc) {
#pragma unroll
                for (int pr = 0; pr < NPROD; ++pr) {
                    float wv[KT], xv[PX];
                    load_row<KT, VW>(cur + G::XBUF + (pr * CC + cc) * KMP + k0, wv);
#pragma unroll
                    for (int u = 0; u < PX; ++u) xv[u] = cur[(pr * CC + cc) * NPIX + (pix[u] >= 0 ? pix[u] : 0)];
#pragma unroll
                    for (int u = 0; u < PX; ++u)
#pragma unroll
                        for (int kt = 0; kt < KT; ++kt) {
                            if (TWO && pr == 1) acc2[TWO ? u : 0][TWO ? kt : 0] =
                                fmaf(xv[u], wv[kt], acc2[TWO ? u : 0][TWO ? kt : 0]);
                            else acc[u][kt] = fmaf(xv[u], wv[kt], acc[u][kt]);
                        }
                }
            }
        }
        if (more) land((ch & 1) ? buf0 : buf1);
        __syncthreads();
    }
    if (!active) return;
#pragma unroll
    for (int kt = 0; kt < KT; ++kt) {
        const int k = k0 + kt;
        const float bb1 = P1::BIAS ? bias_of(b1, k) : 0.f;
        float bb2 = 0.f;
        if constexpr (!P2::NONE) bb2 = P2::BIAS ? bias_of(b2, k) : 0.f;
#pragma unroll
        for (int u = 0; u < PX; ++u) {
            if (pix[u] < 0) continue;
            float val;
            if constexpr (P2::NONE) val = act<P1::ACT>(acc[u][kt] + bb1);
            else if constexpr (TWO)
                val = act<MACT>(act<P1::ACT>(acc[u][kt] + bb1) + act<P2::ACT>(acc2[u][kt] + bb2));
            else val = act<MACT>(acc[u][kt] + bb1 + bb2);
            const int mh = pix[u] / G::MW, mw = pix[u] - mh * G::MW, m = m0 + mh, q = n0 + mw;
            mid[k * NPIX + pix[u]] = (m >= 0 && m < MP && q >= 0 && q < MQ) ? val : 0.f;
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The fused block.  x: [N, P1::C, H, W] (x2: [N, P2::C, H2, W2], merge only), y: [N, C1::K + C2::K, P, Q] (or the
// NHWC forms); (MP, MQ): the intermediate plane.  Grid: (tiles of the output plane, KS, N).
template <typename T, bool NHWC, class P1, class P2, class C1, class C2, bool MRELU, class TL>
__global__ void __launch_bounds__(TL::NT)
fused_block(const T* __restrict__ x, const T* __restrict__ x2, const T* __restrict__ w1, const T* __restrict__ b1,
            const T* __restrict__ w2, const T* __restrict__ b2, const T* __restrict__ w3, const T* __restrict__ b3,
            const T* __restrict__ w4, const T* __restrict__ b4, T* __restrict__ y, int H, int W, int H2, int W2,
            int MP, int MQ, int P, int Q) {
    using G = Geometry<P1, P2, C1, C2, TL>;
    extern __shared__ __align__(16) float smem[];
    float* const mid = smem;
    float* const ws1 = smem + G::MID_FLOATS;
    float* const ws2 = ws1 + G::WS1_FLOATS;
    float* const pipe = ws2 + G::WS2_FLOATS;
    const int tq = (Q + TL::TW - 1) / TL::TW;
    const int p0 = (blockIdx.x / tq) * TL::TH, q0 = (blockIdx.x % tq) * TL::TW;
    const int s = blockIdx.y;
    const long long n = blockIdx.z;
    if constexpr (G::WS1) stage_weights<T, NHWC, C1, TL::NT, G::K1S>(ws1, w3, s * G::K1S);
    if constexpr (G::WS2) stage_weights<T, NHWC, C2, TL::NT, G::K2S>(ws2, w4, s * G::K2S);
    const T* xn = x + n * P1::C * H * W;
    const T* x2n = P2::NONE ? x : x2 + n * P2::C * H2 * W2;
    if constexpr (TL::PCC > 0) {
        produce_pipelined<T, NHWC, P1, P2, MRELU, G, TL::NT, TL::PPX, TL::PKT, TL::PCC>(
            mid, pipe, xn, x2n, w1, b1, w2, b2, H, W, H2, W2, MP, MQ, p0 * G::SH - G::LOH, q0 * G::SW - G::LOW);
    } else {
        produce<T, NHWC, P1, P2, MRELU, G, TL::NT, TL::PPX, TL::PKT>(mid, xn, x2n, w1, b1, w2, b2, H, W, H2, W2, MP,
                                                                   MQ, p0 * G::SH - G::LOH, q0 * G::SW - G::LOW);
    }
    __syncthreads();
    T* yn = y + n * G::KY * P * Q;
    consume<T, NHWC, C1, G, TL, TL::C1PX, TL::C1KT, G::K1S, G::WS1, G::LOH - C1::PH, G::LOW - C1::PW>(
        mid, ws1, w3, b3, yn, 0, s * G::K1S, P, Q, p0, q0);
    if constexpr (!C2::NONE)
        consume<T, NHWC, C2, G, TL, TL::C2PX, TL::C2KT, G::K2S, G::WS2, G::LOH - C2::PH, G::LOW - C2::PW>(
            mid, ws2, w4, b4, yn, C1::K, s * G::K2S, P, Q, p0, q0);
}

#ifdef UCUDNN_NVCC_CHECK
#define FUSED_ARGS(T) const T*, const T*, const T*, const T*, const T*, const T*, const T*, const T*, const T*, \
    const T*, T*, int, int, int, int, int, int, int, int
// The seed blocks at their default tilings (kernels/fused.py default_tiling on an H100): batch 1 FP32 NCHW and
// batch 8 FP16 (NCHW; NHWC for a.2 and c.1); then two MobileNet V2 blocks with ReLU6 (expand 24 -> 144): the
// depthwise 3x3 stride 2 + ReLU6 -> linear 1x1 projection (batch 1 FP32 NCHW) and the expand 1x1 + ReLU6 (a
// pipelined producer) -> depthwise 3x3 + ReLU6 (batch 8 FP16 NHWC).
template __global__ void fused_block<float, false, Layer<16, 192, 1, 1, 1, 1, 0, 0, 1, true, true>, NoLayer,
                                     Layer<32, 16, 5, 5, 1, 1, 2, 2, 1, true, true>, NoLayer, false, Tile<2, 2, 1,
                                     256, 1, 4, 1, 4, 1, 1, 32>>(FUSED_ARGS(float));
template __global__ void fused_block<half_t, false, Layer<16, 192, 1, 1, 1, 1, 0, 0, 1, true, true>, NoLayer,
                                     Layer<32, 16, 5, 5, 1, 1, 2, 2, 1, true, true>, NoLayer, false, Tile<4, 14, 1,
                                     256, 2, 8, 2, 8, 1, 1, 32>>(FUSED_ARGS(half_t));
template __global__ void fused_block<float, false, Layer<16, 16, 3, 3, 1, 1, 1, 1, 16, true, true>, NoLayer,
                                     Layer<16, 16, 1, 1, 1, 1, 0, 0, 1, true, false>, NoLayer, false, Tile<1, 28,
                                     1, 128, 4, 1, 1, 4, 1, 1, 0>>(FUSED_ARGS(float));
template __global__ void fused_block<half_t, true, Layer<16, 16, 3, 3, 1, 1, 1, 1, 16, true, true>, NoLayer,
                                     Layer<16, 16, 1, 1, 1, 1, 0, 0, 1, true, false>, NoLayer, false, Tile<16, 28,
                                     1, 256, 8, 4, 2, 16, 1, 1, 0>>(FUSED_ARGS(half_t));
template __global__ void fused_block<float, false, Layer<16, 64, 1, 1, 1, 1, 0, 0, 1, true, true>, NoLayer,
                                     Layer<64, 16, 1, 1, 1, 1, 0, 0, 1, true, true>, Layer<64, 16, 3, 3, 1, 1, 1,
                                     1, 1, true, true>, false, Tile<7, 7, 2, 256, 1, 8, 2, 8, 2, 8,
                                     32>>(FUSED_ARGS(float));
template __global__ void fused_block<half_t, false, Layer<16, 64, 1, 1, 1, 1, 0, 0, 1, true, true>, NoLayer,
                                     Layer<64, 16, 1, 1, 1, 1, 0, 0, 1, true, true>, Layer<64, 16, 3, 3, 1, 1, 1,
                                     1, 1, true, true>, false, Tile<14, 14, 1, 256, 2, 16, 2, 16, 2, 16,
                                     16>>(FUSED_ARGS(half_t));
template __global__ void fused_block<float, false, Layer<256, 64, 1, 1, 1, 1, 0, 0, 1, true, false>, Layer<256, 64,
                                     1, 1, 1, 1, 0, 0, 1, true, false>, Layer<64, 256, 1, 1, 1, 1, 0, 0, 1, true,
                                     true>, NoLayer, true, Tile<1, 28, 1, 256, 2, 16, 2, 8, 1, 1,
                                     16>>(FUSED_ARGS(float));
template __global__ void fused_block<half_t, true, Layer<256, 64, 1, 1, 1, 1, 0, 0, 1, true, false>, Layer<256, 64,
                                     1, 1, 1, 1, 0, 0, 1, true, false>, Layer<64, 256, 1, 1, 1, 1, 0, 0, 1, true,
                                     true>, NoLayer, true, Tile<4, 8, 1, 256, 2, 16, 2, 8, 1, 1,
                                     16>>(FUSED_ARGS(half_t));
template __global__ void fused_block<float, false, Layer<144, 144, 3, 3, 2, 2, 1, 1, 144, true, false, true>,
                                     NoLayer, Layer<32, 144, 1, 1, 1, 1, 0, 0, 1, true, false>, NoLayer, false,
                                     Tile<1, 2, 1, 128, 2, 2, 1, 1, 1, 1, 0>>(FUSED_ARGS(float));
template __global__ void fused_block<half_t, true, Layer<144, 24, 1, 1, 1, 1, 0, 0, 1, true, false, true>, NoLayer,
                                     Layer<144, 144, 3, 3, 1, 1, 1, 1, 144, true, false, true>, NoLayer, false,
                                     Tile<4, 7, 1, 256, 2, 16, 7, 4, 1, 1, 16>>(FUSED_ARGS(half_t));
#endif
