"""Tiled-FFT convolution (overlap-save over TS x TS tiles): geometry, tile-size choice, workspace layout, the
complex GEMMs, float64 references, a CPU emulation of fft.cu's kernels, and their launchers.

The ``fft`` algorithm source (``ucudnn/measure/sources/fft.py``) runs a configuration as:

1. ``fft_filter``: U[f] = conj(DFT(w))[f] of every (output channel o, input channel i), the filter zero-padded to
   TS x TS: ``U [F][Co][Ci]`` complex, F = TS * (TS/2 + 1) points of a real tile's half spectrum -- once per call;
2. per chunk of T tiles: ``fft_input`` (V = DFT of every TS x TS input tile), one complex
   ``cublasGemmStridedBatchedEx`` over the F points (M[f] = U[f] V[f], input channels reduced), and ``fft_output``
   (y = alpha * IDFT(M) + beta * y on the tile's first MH x MW points, edge tiles clipped).

Why a tiled FFT beside Winograd F(4x4, 3x3): for filters of 4 taps and more (AlexNet's 5x5, Inception's 1x7 / 7x1)
cuDNN's FFT algorithms win unbounded but need hundreds of MiB (AlexNet conv2 b256: 476 MiB forward, 750 backward
data), and under 64 MiB cuDNN runs them on small micro-batches, each paying the filter transform again.  A
configuration here pays the filter transform once per call whatever its chunks, and its workspace is exactly U + V +
M: ``8 * F * (Co*Ci + Ci*T + Co*T)`` bytes.  Each output of a TS-tile costs ``4 * F * Ci / (MH * MW)`` real
multiply-adds in the GEMMs against ``R * S * Ci`` directly (AlexNet conv2, TS 18: 3.7 against 25 per input channel).

Geometry: output tiles MH x MW = (TS - R + 1) x (TS - S + 1); the input tile of output tile (th, tw) starts at
(MH*th - PH, MW*tw - PW).  A chunk is a flat range of tiles over the call's ``n * TH * TW`` (tile g = (image * TH +
row) * TW + col), so V and M may hold less than one image; only the last chunk is short.

Backward data is the forward machinery on dy (Ci = K) into dx (Co = C) with the filter rotated by 180 degrees, its
roles swapped and padding ``R - 1 - PH`` (so ``pad <= R - 1``).  Backward filter: per chunk D = DFT of the x tiles
(V's buffer) and E = DFT of the MH x MW dy tiles zero-padded to TS x TS (M's buffer, ``fft_input`` with dy's window),
then one complex GEMM Gc[f] (Co x Ci) (+)= sum_t E[f][o][t] conj(D[f][i][t]) (op C on D; the first chunk overwrites):
the transform-domain accumulation runs across the call's chunks; once per call ``fft_filter_grad`` writes
``dw = alpha * IDFT(conj(Gc))[r][s] + beta * dw`` for the R x S lags.

Checked against :func:`ucudnn.kernels.reference.conv2d_nchw` (tests/test_fft.py, tests/test_gpu_fft.py).

The GEMMs are FP32 complex (CUDA_C_32F, compute type from :func:`ucudnn.binding.cublas.compute_type`: pedantic FP32
under ``strict``); the transforms are direct DFT sums in FP32 with the twiddles computed in double.  Everything is
deterministic.  float32 only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ucudnn.errors import InputError
from ucudnn.problem import ConvProblem

from . import _compile
from ._compile import F32, PTR
from . import transform_workspace as workspace

SOURCE = "fft.cu"
OPS = ("forward", "backward_data", "backward_filter")
DTYPES = ("float32",)
_THREADS = 256
_INT_MAX = (1 << 31) - 1
#: the tile sizes the kernels are built for (even: the half spectrum's last column is real)
TILE_SIZES = tuple(range(8, 33, 2))
#: filters this wide or wider in either dimension are offered; 3x3 (and smaller) is Winograd F(4x4, 3x3)'s, which
#: needs 2.25 products an output against a TS-tile's 4 * F / (MH * MW) (3.6 at TS 16): the FFT tiles do not pay
MIN_FILTER = 4
#: the widest filter row fft_filter_grad keeps in registers, the most rows fft_filter keeps (FFT_MAX_S in fft.cu)
MAX_FILTER = 16
#: tile sizes measured per problem (the cheapest by :func:`tile_cost`)
TILE_CHOICES = 2
#: and up to this many more, each the cheapest whose U is at most half the smallest U offered before it
SMALL_U_CHOICES = 2
#: shared memory a block of fft_input / fft_output may use (the static limit)
_SMEM = 48 * 1024


def half(ts: int) -> int:
    """Columns of a real TS-point DFT's half spectrum."""
    return ts // 2 + 1


def points(ts: int) -> int:
    """F: transform-domain points of a TS x TS real tile (TS rows x TS/2 + 1 columns)."""
    return ts * half(ts)


def tiles_per_block(ts: int) -> int:
    """G: tiles a block of fft_input / fft_output transforms -- the largest power of two up to 32 whose shared
    memory (fft_input's tile, ``G * TS * (TS + 1)`` floats, and its row spectra, ``G * TS * (TS/2 + 2)`` complex)
    fits 48 KiB."""
    per_tile = 4 * ts * (ts + 1) + 8 * ts * (half(ts) + 1)
    g = 32
    while g > 1 and 8 * ts + g * per_tile > _SMEM:
        g //= 2
    return g


# ---- float64 references --------------------------------------------------------------------------------------------
def twiddles(ts: int) -> np.ndarray:
    """e^{2 pi i j / TS} for j < TS (the kernels' table: cos and sin)."""
    return np.exp(2j * np.pi * np.arange(ts) / ts)


def dft_rows(ts: int) -> np.ndarray:
    """The half-spectrum DFT along a row: ``[kb, b] = e^{-2 pi i kb b / TS}``, kb <= TS/2."""
    return np.conj(twiddles(ts)[(np.arange(half(ts))[:, None] * np.arange(ts)[None, :]) % ts])


def dft_cols(ts: int) -> np.ndarray:
    """The full DFT along a column: ``[ka, a] = e^{-2 pi i ka a / TS}``."""
    return np.conj(twiddles(ts)[(np.arange(ts)[:, None] * np.arange(ts)[None, :]) % ts])


def half_weights(ts: int) -> np.ndarray:
    """The inverse's weights over the half spectrum's columns: 1 for kb = 0 and kb = TS/2, 2 between."""
    wk = np.full(half(ts), 2.0)
    wk[0] = 1.0
    if ts % 2 == 0:
        wk[-1] = 1.0
    return wk


def spectrum(tile: np.ndarray, ts: int) -> np.ndarray:
    """[..., TS, TS] real -> [..., TS, TS/2 + 1]: the kernels' DFT (rows to half spectra, then columns)."""
    r = np.einsum("...ab,kb->...ak", tile, dft_rows(ts))
    return np.einsum("...ak,ja->...jk", r, dft_cols(ts))


def inverse(spec: np.ndarray, ts: int, mh: int, mw: int) -> np.ndarray:
    """[..., TS, TS/2 + 1] half spectrum -> the real inverse DFT's first ``mh x mw`` points (the kernels' sums)."""
    cols = np.conj(dft_cols(ts))[:mh]                                                # [a, ka]: e^{+...}
    s = np.einsum("...jk,aj->...ak", spec, cols)
    rows = twiddles(ts)[(np.arange(half(ts))[:, None] * np.arange(mw)[None, :]) % ts]   # [kb, b]
    return np.einsum("...ak,kb,k->...ab", s, rows, half_weights(ts)).real / (ts * ts)


# ---- geometry ------------------------------------------------------------------------------------------------------
def refusal(problem: ConvProblem, op: str) -> str | None:
    """Why the tiled-FFT kernels do not run ``op`` of ``problem`` (None: they do)."""
    if op not in OPS:
        return f"unknown op {op!r}"
    r, s = problem.r, problem.s
    if max(r, s) < MIN_FILTER:
        return f"{r}x{s} filters: FFT tiles run filters of {MIN_FILTER} taps or more (3x3 is Winograd's)"
    if max(r, s) > MAX_FILTER:
        return f"{r}x{s} filters: over {MAX_FILTER} taps"
    if problem.stride != (1, 1):
        return f"stride {list(problem.stride)}: FFT tiles run stride 1 only"
    if problem.dilation != (1, 1):
        return f"dilated convolutions (dilation {list(problem.dilation)}) are not built"
    if problem.groups != 1:
        return f"grouped convolutions (groups = {problem.groups}) are not built"
    if problem.pad[0] > r - 1 or problem.pad[1] > s - 1:
        return f"padding {list(problem.pad)} over the filter's {r - 1}x{s - 1} (backward data pads R - 1 - pad)"
    if problem.dtype not in DTYPES:
        return f"{problem.dtype}: fft.cu's kernels are built for {' and '.join(DTYPES)}"
    if problem.layout not in ("NCHW", "NHWC"):
        return f"layout {problem.layout}"
    if problem.p < 1 or problem.q < 1:
        return "empty output"
    return None


@dataclass(frozen=True)
class Geometry:
    """One op of one problem as the kernels see it: an input of ``ci`` channels (``hi x wi``) correlated into an
    output of ``co`` channels (``ho x wo``) by an ``r x s`` filter with padding ``pad``, in TS x TS tiles (``ts``);
    strides in elements, (n, c, h, w) order; the filter read as ``w[o*so + i*si + r*sr + s*ss]`` (rotated by 180
    degrees when ``rot``).  Backward filter keeps the forward's geometry (x in, dy out)."""

    op: str
    ci: int
    co: int
    hi: int
    wi: int
    ho: int
    wo: int
    r: int
    s: int
    pad: tuple[int, int]
    in_strides: tuple[int, int, int, int]
    out_strides: tuple[int, int, int, int]
    filter_strides: tuple[int, int, int, int]
    rot: bool
    ts: int

    @classmethod
    def of(cls, problem: ConvProblem, op: str, ts: int) -> "Geometry":
        why = refusal(problem, op)
        if why:
            raise InputError(f"fft cannot run {op} of {problem.describe()}: {why}", "problem")
        p = problem
        if ts not in TILE_SIZES:
            raise InputError(f"must be one of {TILE_SIZES}, got {ts!r}", "tile")
        if ts < max(p.r, p.s) + 1:
            raise InputError(f"a {ts}x{ts} tile holds no 2-point output tile of a {p.r}x{p.s} filter", "tile")
        x_str, y_str = p.x_strides(), p.y_strides()
        wk, wc, wr, ws = p.w_strides()   # (k, c, r, s): NCHW [K][C][R][S], NHWC [K][R][S][C]
        if op != "backward_data":
            return cls(op, p.c, p.k, p.h, p.w, p.p, p.q, p.r, p.s, p.pad, x_str, y_str, (wk, wc, wr, ws), False, ts)
        pad = (p.r - 1 - p.pad[0], p.s - 1 - p.pad[1])
        return cls(op, p.k, p.c, p.p, p.q, p.h, p.w, p.r, p.s, pad, y_str, x_str, (wc, wk, wr, ws), True, ts)

    @property
    def f(self) -> int:
        return points(self.ts)

    @property
    def mh(self) -> int:
        return self.ts - self.r + 1

    @property
    def mw(self) -> int:
        return self.ts - self.s + 1

    @property
    def tiles_h(self) -> int:
        return -(-self.ho // self.mh)

    @property
    def tiles_w(self) -> int:
        return -(-self.wo // self.mw)

    @property
    def tiles_per_image(self) -> int:
        return self.tiles_h * self.tiles_w

    def segments(self, tiles: int, streams: int = 1) -> tuple[tuple[str, int, int], ...]:
        """(name, byte offset, bytes) of U, V and M for chunks of ``tiles`` tiles (complex64, 256-byte aligned);
        with ``streams`` > 1 a V and M per stream after U (``V``, ``M``, ``V1``, ``M1``, ...: chunk i runs on stream
        i % streams), and for backward filter a Gc per stream first (``U``, ``U1``, ...: :meth:`partials`)."""
        return workspace.segments(self.op == "backward_filter", self.co, self.ci, tiles, streams, 8 * self.f)

    def workspace_bytes(self, tiles: int, streams: int = 1) -> int:
        """Exactly what chunks of ``tiles`` tiles touch: ``8 * F * (Co*Ci + Ci*T + Co*T)`` bytes (U and V aligned);
        a V and M per stream with ``streams`` (and for backward filter a Gc per stream)."""
        return max(off + size for _, off, size in self.segments(tiles, streams))

    def stream_buffers(self, k: int) -> dict[str, str]:
        """The segment names stream ``k`` uses for the GEMM's buffer names U, V, M (U shared, but for backward
        filter: each stream accumulates its own Gc)."""
        return workspace.stream_buffers(self.op == "backward_filter", k)

    def partials(self, streams: int, chunks: int) -> tuple[int, int]:
        """(parts, stride in complex elements) of backward filter's per-stream Gc over a call of ``chunks`` chunks:
        the streams that ran a chunk, their Gc buffers that far apart (evenly spaced: same size, aligned)."""
        return workspace.partials(streams, chunks, 8 * self.f * self.co * self.ci, 8)

    def chunk_refusal(self, tiles: int, n: int) -> str | None:
        """Why chunks of ``tiles`` tiles of a call on ``n`` images do not run (32-bit kernel indices), or None."""
        if tiles < 1:
            return f"chunks of {tiles} tiles"
        if max(self.ci, self.co) * tiles > _INT_MAX or self.co * self.ci * self.f > _INT_MAX:
            return f"chunks of {tiles} tiles: over 2^31 transformed elements"
        if n * self.tiles_per_image > _INT_MAX:
            return f"{n * self.tiles_per_image} tiles in the call, over 2^31"
        return None

    def ranges(self, n: int, tiles: int) -> list[tuple[int, int]]:
        """(first tile, tiles) of each chunk of ``tiles`` tiles of a call on ``n`` images."""
        total = n * self.tiles_per_image
        return [(t0, min(tiles, total - t0)) for t0 in range(0, total, tiles)]

    def gemm(self, tiles: int, accumulate: bool = False) -> CGemm:
        """The F complex products of a chunk of ``tiles`` tiles (column-major, over the buffers U, V, M).  Forward
        and backward data: M^T (T x Co) = V^T (T x Ci) U^T (Ci x Co), i.e. ``M[f][o][t] = sum_i U[f][o][i]
        V[f][i][t]``.  Backward filter: Gc (Ci x Co) (+)= D^H (Ci x T) E (T x Co), i.e. ``Gc[f][o][i] (+)= sum_t
        conj(D[f][i][t]) E[f][o][t]`` (D in V, E in M, Gc in U), added when ``accumulate``."""
        f, t, ci, co = self.f, tiles, self.ci, self.co
        if self.op == "backward_filter":
            return CGemm("C", "N", ci, co, t, "V", t, ci * t, "M", t, co * t, "U", ci, co * ci, f,
                         1.0 if accumulate else 0.0)
        return CGemm("N", "N", t, co, ci, "V", t, ci * t, "U", ci, co * ci, "M", t, co * t, f, 0.0)


@dataclass(frozen=True)
class CGemm:
    """One complex strided-batched GEMM in cuBLAS's column-major terms: ``C_i = op(A_i) @ op(B_i) + beta * C_i``
    for i < batch, A / B / C named workspace buffers (complex64 element strides)."""

    transa: str
    transb: str
    m: int
    n: int
    k: int
    a: str
    lda: int
    stride_a: int
    b: str
    ldb: int
    stride_b: int
    c: str
    ldc: int
    stride_c: int
    batch: int
    beta: float


#: fft_filter splits each spectrum column into parts until it runs about this many threads (or a thread a point)
FILTER_THREADS = 1 << 16


def filter_parts(geo: "Geometry") -> int:
    """How many parts fft_filter splits each column of a filter's spectrum into: 1 where the Co x Ci filters' TS/2 + 1
    columns make :data:`FILTER_THREADS` threads, else more, up to TS (a thread a point).  Why: a thread per column
    computes the R row DFTs once and walks down the column (measured on the H200 against a thread per point, the
    HEAD kernel: AlexNet conv2's 256 x 96 filters at TS 18 115 -> 31 us, TS 32 327 -> 69 us), but a few hundred
    filters make too few threads to fill the device (SRCNN's 64 x 3 9x9 at TS 12: 9.4 -> 13.0 us):
    ``benchmarks/results/fft_filter_ab.md``."""
    columns = geo.co * geo.ci * half(geo.ts)
    return max(1, min(geo.ts, -(-FILTER_THREADS // columns)))


def tile_cost(problem: ConvProblem, op: str, ts: int) -> float:
    """A tile size's work, in multiply-adds (a ranking, not a time): the complex GEMMs (4 per point and channel
    pair), the transforms (about 6 * TS multiply-adds per point and channel) and the transform-domain traffic
    (V and M written and read: 16 bytes per point and channel, weighed as 4 multiply-adds a byte)."""
    g = Geometry.of(problem, op, ts)
    work = 4 * g.ci * g.co + (6 * ts + 64) * (g.ci + g.co)
    return float(g.tiles_per_image * g.f * work)


def tile_sizes(problem: ConvProblem, op: str, choices: int = TILE_CHOICES,
               smaller: int = SMALL_U_CHOICES) -> list[int]:
    """The ``choices`` cheapest tile sizes for ``op`` of ``problem`` by :func:`tile_cost` (ties: the smaller tile,
    whose U is smaller), cheapest first; then up to ``smaller`` more, each the cheapest whose U (``F`` points of
    ``Co x Ci``) is at most half the smallest U offered so far.  Why: U is the call's fixed workspace, so a limit
    under it rules a tile size out whatever the chunk -- AlexNet conv2 (96 -> 256, 27x27) b256 offered TS 32 and 18
    only (U 107 and 35 MB), and at 32 MiB its plans fell back to cuDNN's zero-workspace kernels at 6.8-7.7 ms an op
    (``channel_wr_alexnet-b256-float32-NCHW-strict-winograd-groups-replay.md``)."""
    ok = sorted((ts for ts in TILE_SIZES if ts >= max(problem.r, problem.s) + 1),
                key=lambda ts: (tile_cost(problem, op, ts), ts))
    out = ok[:choices]
    for _ in range(smaller if out else 0):
        cap = min(points(ts) for ts in out) // 2
        nxt = next((ts for ts in ok if points(ts) <= cap), None)
        if nxt is None:
            break
        out.append(nxt)
    return out


#: a call runs at most this many chunks (more is measured as smaller micro-batches: the winograd source's rule)
MAX_CHUNKS = 64


def chunk_sizes(geo: Geometry, n: int) -> list[int]:
    """The tile counts per chunk offered at micro-batch ``n``, ascending: powers of two below 64, from 64 up two
    sizes an octave (64, 96, 128, 192, ...: T is the GEMMs' M, tiled 64 or 128 wide by cuBLAS), and the call's
    ``n * TH * TW`` tiles; only sizes that run the call in at most :data:`MAX_CHUNKS` chunks."""
    total = n * geo.tiles_per_image
    sizes = {total}
    t = 8
    while t < total:
        sizes.add(t)
        if t >= 64 and t * 3 // 2 < total:
            sizes.add(t * 3 // 2)
        t *= 2
    return sorted(t for t in sizes if -(-total // t) <= MAX_CHUNKS)


# ---- CPU emulation of fft.cu (the kernels' index math, vectorised) -------------------------------------------------
def _tile_index(geo: Geometry, g: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    per = geo.tiles_per_image
    img, rem = g // per, g % per
    return img, rem // geo.tiles_w, rem % geo.tiles_w


def emulate_filter(geo: Geometry, w: np.ndarray) -> np.ndarray:
    """fft_filter: U ``[F][Co][Ci]`` complex from flat ``w``."""
    so, si, sr, ss = geo.filter_strides
    o, i = np.meshgrid(np.arange(geo.co), np.arange(geo.ci), indexing="ij")
    rr = np.arange(geo.r)[::-1] if geo.rot else np.arange(geo.r)
    sc = np.arange(geo.s)[::-1] if geo.rot else np.arange(geo.s)
    taps = w[(o * so + i * si)[..., None, None] + rr[:, None] * sr + sc[None, :] * ss]   # [co, ci, r, s]
    tile = np.zeros((geo.co, geo.ci, geo.ts, geo.ts))
    tile[:, :, :geo.r, :geo.s] = taps
    return np.conj(spectrum(tile, geo.ts)).reshape(geo.co, geo.ci, geo.f).transpose(2, 0, 1)


def emulate_input(geo: Geometry, x: np.ndarray, t0: int, count: int, channels: int, strides: tuple[int, ...],
                  bounds: tuple[int, int], origin: tuple[int, int], window: tuple[int, int]) -> np.ndarray:
    """fft_input: ``[F][channels][count]`` complex, the DFT of each tile's TS x TS window of flat ``x`` (element
    (a, b) read where a < window[0], b < window[1], at (MH*th + origin[0] + a, MW*tw + origin[1] + b), zero
    outside ``bounds``)."""
    sn, sc, sh, sw = strides
    img, th, tw = _tile_index(geo, t0 + np.arange(count))
    a, b = np.arange(geo.ts), np.arange(geo.ts)
    h = (th * geo.mh + origin[0])[:, None, None] + a[None, :, None]
    ww = (tw * geo.mw + origin[1])[:, None, None] + b[None, None, :]
    ok = (h >= 0) & (h < bounds[0]) & (ww >= 0) & (ww < bounds[1])
    ok &= (a[None, :, None] < window[0]) & (b[None, None, :] < window[1])
    c = np.arange(channels)
    flat = img[None, :, None, None] * sn + c[:, None, None, None] * sc + h[None] * sh + ww[None] * sw
    tile = np.where(ok[None], x[np.where(ok[None], flat, 0)], 0.0)                  # [c, t, TS, TS]
    return spectrum(tile, geo.ts).reshape(channels, count, geo.f).transpose(2, 0, 1)


def emulate_output(geo: Geometry, M: np.ndarray, y: np.ndarray, t0: int, count: int, alpha: float,
                   beta: float) -> None:
    """fft_output: the MH x MW outputs of each tile of ``M [F][Co][count]`` into flat ``y``."""
    sn, sc, sh, sw = geo.out_strides
    spec = M.transpose(1, 2, 0).reshape(geo.co, count, geo.ts, half(geo.ts))
    vals = inverse(spec, geo.ts, geo.mh, geo.mw)                                  # [co, t, mh, mw]
    img, th, tw = _tile_index(geo, t0 + np.arange(count))
    h = (th * geo.mh)[:, None, None] + np.arange(geo.mh)[None, :, None]
    ww = (tw * geo.mw)[:, None, None] + np.arange(geo.mw)[None, None, :]
    ok = np.broadcast_to((h < geo.ho) & (ww < geo.wo), vals.shape)
    flat = (img[None, :, None, None] * sn + np.arange(geo.co)[:, None, None, None] * sc + h[None] * sh
            + ww[None] * sw)
    idx = flat[ok]
    new = alpha * vals[ok]
    if beta != 0.0:
        new = new + beta * y[idx]
    y[idx] = new


def emulate_filter_grad(geo: Geometry, Gc: np.ndarray, dw: np.ndarray, alpha: float, beta: float, parts: int = 1,
                        pstride: int = 0) -> None:
    """fft_filter_grad: ``dw = alpha * IDFT(conj(Gc))[:R, :S] + beta * dw`` from ``Gc [F][Co][Ci]`` (flat), the sum
    of ``parts`` buffers ``pstride`` elements apart."""
    n = geo.f * geo.co * geo.ci
    Gc = sum(Gc.ravel()[p * pstride:p * pstride + n] for p in range(parts)).reshape(geo.f, geo.co, geo.ci)
    so, si, sr, ss = geo.filter_strides
    spec = np.conj(Gc).transpose(1, 2, 0).reshape(geo.co, geo.ci, geo.ts, half(geo.ts))
    vals = inverse(spec, geo.ts, geo.r, geo.s)                                   # [co, ci, r, s]
    o, i, r, s = np.meshgrid(np.arange(geo.co), np.arange(geo.ci), np.arange(geo.r), np.arange(geo.s),
                             indexing="ij")
    idx = o * so + i * si + r * sr + s * ss
    new = alpha * vals
    if beta != 0.0:
        new = new + beta * dw[idx]
    dw[idx] = new


def emulate(geo: Geometry, w: np.ndarray, x: np.ndarray, y: np.ndarray, n: int, tiles: int, alpha: float = 1.0,
            beta: float = 0.0) -> None:
    """Forward / backward data as the source runs it, on flat float64 arrays: U once, then per chunk of ``tiles``
    tiles V, the F GEMMs and the output transform."""
    U = emulate_filter(geo, w)
    for t0, count in geo.ranges(n, tiles):
        V = emulate_input(geo, x, t0, count, geo.ci, geo.in_strides, (geo.hi, geo.wi), (-geo.pad[0], -geo.pad[1]),
                          (geo.ts, geo.ts))
        M = U @ V                                                                   # [F][Co][T]
        emulate_output(geo, M, y, t0, count, alpha, beta)


def emulate_backward_filter(geo: Geometry, x: np.ndarray, dy: np.ndarray, dw: np.ndarray, n: int, tiles: int,
                            alpha: float = 1.0, beta: float = 0.0) -> None:
    """Backward filter as the source runs it: per chunk D (x's tiles) and E (dy's MH x MW tiles, zero-padded),
    Gc (+)= E D^H over the chunk's tiles, then the inverse once."""
    Gc = None
    for t0, count in geo.ranges(n, tiles):
        D = emulate_input(geo, x, t0, count, geo.ci, geo.in_strides, (geo.hi, geo.wi), (-geo.pad[0], -geo.pad[1]),
                          (geo.ts, geo.ts))
        E = emulate_input(geo, dy, t0, count, geo.co, geo.out_strides, (geo.ho, geo.wo), (0, 0), (geo.mh, geo.mw))
        part = E @ np.conj(D).transpose(0, 2, 1)                                    # [F][Co][Ci]
        Gc = part if Gc is None else Gc + part
    emulate_filter_grad(geo, Gc, dw, alpha, beta)


# ---- launchers -----------------------------------------------------------------------------------------------------
FilterFn = Callable[..., None]


class _Ranges:
    """The packed launches of one tile kernel per (first tile, tiles), built at a range's first launch and kept (a
    prepared call runs the same ranges every time)."""

    def __init__(self, make: Callable[[int, int], Any]) -> None:
        self._make = make
        self._made: dict[tuple[int, int], Any] = {}

    def __call__(self, t0: int, t: int) -> Any:
        hit = self._made.get((t0, t))
        if hit is None:
            hit = self._made[(t0, t)] = self._make(t0, t)
        return hit


def _tile_launches(geo: Geometry, kernel: Any, channels: int, window: tuple[int, int], origin: tuple[int, int],
                   bounds: tuple[int, int], strides: tuple[int, ...], output: bool) -> _Ranges:
    g, i32, i64 = tiles_per_block(geo.ts), np.int32, np.int64

    def make(t0: int, t: int) -> Any:
        grid = (-(-t // g), channels)
        head = (PTR, PTR, i32(channels), i32(t), i64(t0), i32(geo.tiles_h), i32(geo.tiles_w), i32(geo.mh),
                i32(geo.mw), i32(bounds[0]), i32(bounds[1]))
        if output:
            args = head + tuple(i64(v) for v in strides) + (F32, F32)
        else:
            args = head + (i32(origin[0]), i32(origin[1]), i32(window[0]), i32(window[1])) + tuple(
                i64(v) for v in strides)
        return _compile.packed(kernel, grid, (_THREADS,), args)

    return _Ranges(make)


def _checked(itemsize: int) -> None:
    if itemsize != 4:
        raise InputError(f"element size {itemsize} bytes is not supported (float32)", "itemsize")


def launchers(geo: Geometry, itemsize: int = 4) -> tuple[FilterFn, FilterFn, FilterFn]:
    """Forward and backward data: ``filter(w, U, stream)``, ``input(x, V, t0, tiles, stream)`` and ``output(M, y,
    t0, tiles, alpha, beta, stream)`` (x, y: pointers to the call's image 0; ``stream`` a raw stream pointer).  The
    kernels are compiled (or fetched) here, so a launch inside a CUDA graph capture only enqueues."""
    _checked(itemsize)
    if geo.op == "backward_filter":
        raise InputError("backward filter launches through backward_filter_launchers", "geo")
    g = tiles_per_block(geo.ts)
    kf = _compile.get_kernel(SOURCE, f"fft_filter<{geo.ts},{'true' if geo.rot else 'false'}>")
    ki = _compile.get_kernel(SOURCE, f"fft_input<{geo.ts},{g}>")
    ko = _compile.get_kernel(SOURCE, f"fft_output<{geo.ts},{g}>")
    parts = filter_parts(geo)
    count = geo.co * geo.ci * half(geo.ts) * parts   # fft_filter: a thread per part of a column of a spectrum
    filt = _compile.packed(kf, (-(-count // _THREADS),), (_THREADS,), (PTR, PTR) + (
        np.int32(geo.co), np.int32(geo.ci), np.int32(geo.r), np.int32(geo.s)) + tuple(
        np.int64(v) for v in geo.filter_strides) + (np.int32(parts),))
    inputs = _tile_launches(geo, ki, geo.ci, (geo.ts, geo.ts), (-geo.pad[0], -geo.pad[1]), (geo.hi, geo.wi),
                            geo.in_strides, False)
    outputs = _tile_launches(geo, ko, geo.co, (0, 0), (0, 0), (geo.ho, geo.wo), geo.out_strides, True)

    def filter_(w: int, U: int, stream: int | None = None) -> None:
        filt(w, U, stream=stream)

    def input_(x: int, V: int, t0: int, tiles: int, stream: int | None = None) -> None:
        inputs(t0, tiles)(x, V, stream=stream)

    def output_(M: int, y: int, t0: int, tiles: int, alpha: float, beta: float, stream: int | None = None) -> None:
        outputs(t0, tiles)(M, y, alpha, beta, stream=stream)

    return filter_, input_, output_


def backward_filter_launchers(geo: Geometry, itemsize: int = 4, parts: int = 1,
                              pstride: int = 0) -> tuple[FilterFn, FilterFn, FilterFn]:
    """Backward filter: ``input(x, D, t0, tiles, stream)``, ``dy(dy, E, t0, tiles, stream)`` (the MH x MW dy tiles,
    zero-padded) and ``grad(Gc, dw, alpha, beta, stream)`` (Gc the sum of ``parts`` buffers ``pstride`` complex
    elements apart: :meth:`Geometry.partials`), compiled here like :func:`launchers`."""
    _checked(itemsize)
    if geo.op != "backward_filter":
        raise InputError(f"backward_filter_launchers takes backward_filter geometry, got {geo.op!r}", "geo")
    g = tiles_per_block(geo.ts)
    ki = _compile.get_kernel(SOURCE, f"fft_input<{geo.ts},{g}>")
    kg = _compile.get_kernel(SOURCE, f"fft_filter_grad<{geo.ts}>")
    inputs = _tile_launches(geo, ki, geo.ci, (geo.ts, geo.ts), (-geo.pad[0], -geo.pad[1]), (geo.hi, geo.wi),
                            geo.in_strides, False)
    dys = _tile_launches(geo, ki, geo.co, (geo.mh, geo.mw), (0, 0), (geo.ho, geo.wo), geo.out_strides, False)
    count = geo.co * geo.ci * geo.r
    grad = _compile.packed(kg, (-(-count // _THREADS),), (_THREADS,), (PTR, PTR) + (
        np.int32(geo.co), np.int32(geo.ci), np.int32(geo.r), np.int32(geo.s)) + tuple(
        np.int64(v) for v in geo.filter_strides) + (F32, F32, np.int32(parts), np.int64(pstride)))

    def input_(x: int, D: int, t0: int, tiles: int, stream: int | None = None) -> None:
        inputs(t0, tiles)(x, D, stream=stream)

    def dy_(dy: int, E: int, t0: int, tiles: int, stream: int | None = None) -> None:
        dys(t0, tiles)(dy, E, stream=stream)

    def grad_(Gc: int, dw: int, alpha: float, beta: float, stream: int | None = None) -> None:
        grad(Gc, dw, alpha, beta, stream=stream)

    return input_, dy_, grad_
