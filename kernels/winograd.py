"""Winograd F(4x4, 3x3) convolution (Lavin & Gray): transform matrices, tiling geometry, workspace layout, GEMM
description, float64 NumPy references, a CPU emulation of winograd.cu's kernels, and their launchers.

The ``winograd`` algorithm source (``ucudnn/measure/sources/winograd.py``) runs a configuration as:

1. ``wino_filter``: U[xi] = (G g G^T)[xi] for every (output channel o, input channel i): ``U [36][Co][Ci]``;
2. per chunk: ``wino_input`` (V = B^T d B of every 6x6 input tile), one ``cublasGemmStridedBatchedEx`` over the
   36 transform-domain points (M[xi] = U[xi] V[xi], channels reduced), and ``wino_output``
   (y = alpha * A^T M A + beta * y, edge tiles clipped).

A chunk is a flat range of tiles over the call's ``n * TH * TW`` tiles (tile g = (image * TH + row) * TW + col):
``chunk`` whole images (``Geometry.chunks``) or ``tiles`` tiles (``Geometry.tile_chunks``: a few tile rows of one
image, or a range across image boundaries), so V and M can be sized for less than one image's plane.  The kernels
take the range's first tile ``t0`` and the tensors' image-0 pointers.

Forward is the correlation of x (Ci = C) into y (Co = K) with the problem's padding.  Backward data is the same
correlation of dy (Ci = K) into dx (Co = C) with the filter rotated by 180 degrees, its K / C roles swapped and
padding ``2 - pad`` (the full convolution of dy), so ``pad <= 2``.

Backward filter (issue 18: "transform-domain accumulation across micro-batches, one inverse transform at the end")
differentiates the products: with V the forward's input transform of x and Z = A dy A^T of each 4x4 tile of dy
(``wino_dy``, zero past the output's edge; Z lives in M's buffer), per chunk one strided-batched GEMM adds
``dU[xi] (Co x Ci) += Z[xi] V[xi]^T`` (tiles reduced; the first chunk of a call overwrites), and once per call
``wino_filter_grad`` writes ``dw = alpha * G^T dU G + beta * dw``.  Its geometry is the forward's (Ci = C, Co = K).
With a split reduction (``ksplit`` S) the transforms store a chunk's tiles in S parts of ceil(T / S) (part s its own
``[36][C][T/S]`` block, the last parts padded with zero tiles), one GEMM of 36 x S products adds part s into dU
copy s, and the inverse transform sums the copies (:meth:`Geometry.gemm`, :meth:`Geometry.ksplit_refusal`).

Fused (``wino_fused``, forward and backward data, sm_90): U in its own layout ``[Cp][36][Kp]`` (channels padded to
the kernel's step and block, :func:`fused_dims`) is the whole workspace; a block of the kernel transforms its tiles'
patches into shared memory, accumulates the 36 products in registers and output-transforms them, so V and M never
reach global memory (:func:`fused_launchers`; :func:`emulate_fused` checks the layout's index math on the CPU).

Layouts: NCHW keeps V and M channel-major (``[36][Ci][T]``, ``[36][Co][T]``; M[xi] = U[xi] @ V[xi]), NHWC
channel-minor (``[36][T][Ci]``, ``[36][T][Co]``; M[xi] = V[xi] @ U[xi]^T), so each kernel's threads walk the
tensor's fastest dimension.  Tensors are addressed by element strides, so y (dy) may be a channel slice of a wider
tensor (:meth:`ucudnn.problem.ConvProblem.y_strides`).  The workspace is float32 throughout.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from ucudnn.errors import InputError
from ucudnn.problem import ConvProblem

from . import _compile
from ._compile import F32, I32, PTR
from . import transform_workspace as workspace
from .mec import WORKSPACE_ALIGN, Gemm, align_up, run_gemms
from .transform_workspace import STREAMS

SOURCE = "winograd.cu"
#: output tile (m), filter size (r) and input tile (alpha = m + r - 1) of F(4x4, 3x3)
M_TILE, R_FILTER, A_TILE = 4, 3, 6
POINTS = A_TILE * A_TILE
_THREADS = 256
_INT_MAX = (1 << 31) - 1
OPS = ("forward", "backward_data", "backward_filter")
#: the data types the kernels are instantiated for (the workspace is float32 whatever the data)
DTYPES = ("float32",)
#: input-channel slices a forward or backward-data call may run in (:meth:`Geometry.slice`)
CSPLITS = (1, 2, 4)
#: groups of transform-domain points a backward-filter call may run its tiles in (:meth:`Geometry.points`)
POINT_GROUPS = (1, 2, 3, 4)
#: parts a backward-filter chunk's tile reduction may be split into, each adding into its own dU copy
#: (:meth:`Geometry.ksplit_refusal`)
KSPLITS = (1, 2, 4, 8)

# Lavin & Gray's F(4, 3) matrices (interpolation points 0, +-1, +-2, inf)
BT = np.array([[4, 0, -5, 0, 1, 0],
               [0, -4, -4, 1, 1, 0],
               [0, 4, -4, -1, 1, 0],
               [0, -2, -1, 2, 1, 0],
               [0, 2, -1, -2, 1, 0],
               [0, 4, 0, -5, 0, 1]], dtype=np.float64)
G = np.array([[1 / 4, 0, 0],
              [-1 / 6, -1 / 6, -1 / 6],
              [-1 / 6, 1 / 6, -1 / 6],
              [1 / 24, 1 / 12, 1 / 6],
              [1 / 24, -1 / 12, 1 / 6],
              [0, 0, 1]], dtype=np.float64)
AT = np.array([[1, 1, 1, 1, 1, 0],
               [0, 1, -1, 2, -2, 0],
               [0, 1, 1, 4, 4, 0],
               [0, 1, -1, 8, -8, 1]], dtype=np.float64)


# ---- float64 references --------------------------------------------------------------------------------------------
def filter_transform(g: np.ndarray) -> np.ndarray:
    """``G g G^T`` over the last two axes (``[..., 3, 3]`` -> ``[..., 6, 6]``)."""
    return np.einsum("ar,...rs,bs->...ab", G, g, G)


def input_transform(d: np.ndarray) -> np.ndarray:
    """``B^T d B`` over the last two axes (``[..., 6, 6]``)."""
    return np.einsum("ai,...ij,bj->...ab", BT, d, BT)


def output_transform(m: np.ndarray) -> np.ndarray:
    """``A^T m A`` over the last two axes (``[..., 6, 6]`` -> ``[..., 4, 4]``)."""
    return np.einsum("ai,...ij,bj->...ab", AT, m, AT)


def tiles(size: int) -> int:
    """Output tiles along one axis of ``size`` outputs."""
    return -(-size // M_TILE)


def correlation_reference(x: np.ndarray, w: np.ndarray, pad: tuple[int, int]) -> np.ndarray:
    """The whole algorithm in float64 on NCHW arrays: ``x [N, Ci, H, W]`` correlated with ``w [Co, Ci, 3, 3]``
    (padding ``pad``, stride 1) -> ``[N, Co, H + 2ph - 2, W + 2pw - 2]``, tile by tile."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    n, ci, h, wd = x.shape
    ph, pw = pad
    ho, wo = h + 2 * ph - 2, wd + 2 * pw - 2
    th, tw = tiles(ho), tiles(wo)
    # padded so every 6x6 tile is inside: rows -ph .. 4*th - ph + 6
    xp = np.zeros((n, ci, 4 * th + 2, 4 * tw + 2))
    hh, ww = min(h, 4 * th + 2 - ph), min(wd, 4 * tw + 2 - pw)
    xp[:, :, ph:ph + hh, pw:pw + ww] = x[:, :, :hh, :ww]
    d = np.lib.stride_tricks.sliding_window_view(xp, (A_TILE, A_TILE), axis=(2, 3))[:, :, ::M_TILE, ::M_TILE]
    v = input_transform(d)                                   # [n, ci, th, tw, 6, 6]
    u = filter_transform(w)                                  # [co, ci, 6, 6]
    m = np.einsum("kcab,nctsab->nktsab", u, v)
    y = output_transform(m)                                  # [n, co, th, tw, 4, 4]
    y = y.transpose(0, 1, 2, 4, 3, 5).reshape(n, w.shape[0], 4 * th, 4 * tw)
    return y[:, :, :ho, :wo]


def direct_correlation(x: np.ndarray, w: np.ndarray, pad: tuple[int, int]) -> np.ndarray:
    """Plain float64 correlation (NCHW, stride 1, any filter): the reference the Winograd result is checked against."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    ph, pw = pad
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    win = np.lib.stride_tricks.sliding_window_view(xp, w.shape[2:], axis=(2, 3))   # [n, ci, ho, wo, r, s]
    return np.einsum("ncpqrs,kcrs->nkpq", win, w)


# ---- geometry ------------------------------------------------------------------------------------------------------
def refusal(problem: ConvProblem, op: str) -> str | None:
    """Why the Winograd F(4x4, 3x3) kernels do not run ``op`` of ``problem`` (None: they do)."""
    if op not in OPS:
        return f"unknown op {op!r}"
    if (problem.r, problem.s) != (3, 3):
        return f"F(4x4, 3x3) runs 3x3 filters, not {problem.r}x{problem.s}"
    if problem.stride != (1, 1):
        return f"stride {list(problem.stride)}: Winograd runs stride 1 only"
    if problem.dilation != (1, 1):
        return f"dilated convolutions (dilation {list(problem.dilation)}) are not built"
    if problem.groups != 1:
        return f"grouped convolutions (groups = {problem.groups}) are not built"
    if max(problem.pad) > 2:
        return f"padding {list(problem.pad)} over 2 (backward data runs the full convolution with padding 2 - pad)"
    if problem.dtype not in DTYPES:
        return f"{problem.dtype}: winograd.cu's kernels are built for {' and '.join(DTYPES)}"
    if problem.layout not in ("NCHW", "NHWC"):
        return f"layout {problem.layout}"
    if problem.k * problem.c > _INT_MAX:
        return "K x C over 2^31 filter elements"
    return None


@dataclass(frozen=True)
class Geometry:
    """One op of one problem as the kernels see it: an input of ``ci`` channels (``hi x wi``) correlated into an
    output of ``co`` channels (``ho x wo``) with padding ``pad``; strides in elements, (n, c, h, w) order; the
    filter read as ``w[o*so + i*si + r*sr + s*ss]`` (rotated by 180 degrees when ``rot``)."""

    op: str
    ci: int
    co: int
    hi: int
    wi: int
    ho: int
    wo: int
    pad: tuple[int, int]
    in_strides: tuple[int, int, int, int]
    out_strides: tuple[int, int, int, int]
    filter_strides: tuple[int, int, int, int]
    rot: bool
    cminor: bool      # NHWC: V and M channel-minor

    @classmethod
    def of(cls, problem: ConvProblem, op: str) -> "Geometry":
        why = refusal(problem, op)
        if why:
            raise InputError(f"winograd cannot run {op} of {problem.describe()}: {why}", "problem")
        p = problem
        x_str, y_str = p.x_strides(), p.y_strides()
        wk, wc, wr, ws = p.w_strides()   # (k, c, r, s): NCHW [K][C][3][3], NHWC [K][3][3][C]
        cminor = p.layout == "NHWC"
        if op != "backward_data":   # forward, and backward filter (the same tiles, differentiated)
            return cls(op, p.c, p.k, p.h, p.w, p.p, p.q, p.pad, x_str, y_str, (wk, wc, wr, ws), False, cminor)
        pad = (2 - p.pad[0], 2 - p.pad[1])
        return cls(op, p.k, p.c, p.p, p.q, p.h, p.w, pad, y_str, x_str, (wc, wk, wr, ws), True, cminor)

    @property
    def tiles_h(self) -> int:
        return tiles(self.ho)

    @property
    def tiles_w(self) -> int:
        return tiles(self.wo)

    @property
    def tiles_per_image(self) -> int:
        return self.tiles_h * self.tiles_w

    def slice(self, csplit: int) -> Geometry:
        """The geometry of one of ``csplit`` equal slices of the input channels (forward: x's C, backward data: dy's
        K): the same tensors and strides, ``ci / csplit`` channels from a slice's first (its pointers moved by
        :meth:`slice_offsets`).  Why: U, the filter transform, takes 36 * Co * Ci floats of the workspace (37.7 MB
        of VGG-16's 512-channel layers, most of 64 MiB), so chunks hold few tiles and their GEMMs are thin; a slice
        holds 1/csplit of U and V, its GEMM adds into M (beta 1 after the first slice), and the chunks grow."""
        if csplit not in CSPLITS:
            raise InputError(f"must be one of {CSPLITS}, got {csplit!r}", "csplit")
        if self.op == "backward_filter" and csplit != 1:
            raise InputError("backward filter does not split its input channels", "csplit")
        if self.ci % csplit:
            raise InputError(f"{self.ci} input channels do not split into {csplit} equal slices", "csplit")
        return replace(self, ci=self.ci // csplit)

    def slice_offsets(self, csplit: int, part: int) -> tuple[int, int]:
        """(filter, input) element offsets of slice ``part`` of ``csplit``: its first input channel's."""
        c0 = part * (self.ci // csplit)
        return c0 * self.filter_strides[1], c0 * self.in_strides[1]

    def points(self, groups: int = 1) -> int:
        """The transform-domain points of one of ``groups`` point groups.  Why: U (dU for backward filter) is
        ``36 * Co * Ci`` floats whatever the chunk (37.7 MB of VGG-16's 512-channel layers, most of 64 MiB), so
        under a tight limit the chunks are short and their GEMMs thin (forward conv4_2 at 64 MiB: 64-tile chunks;
        backward filter: 192-tile chunks, 2.23 ms against 1.77 in one chunk).  A group of 36 / G points needs U,
        V and M (Z) of that size, so the same workspace holds G times the tiles a chunk.  Backward filter reads x
        and dy once per group (each group's transforms store only its points) and adds each group's share of the
        inverse transform into dw; forward and backward data transform the group's points of the filter once per
        group, read the input once per group and add each group's share of the output transform into y (A^T M A
        is linear in M's points; beta 1 after the first group)."""
        if groups not in POINT_GROUPS:
            raise InputError(f"must be one of {POINT_GROUPS}, got {groups!r}", "groups")
        return POINTS // groups

    def segments(self, chunk: int, tiles: int | None = None, csplit: int = 1,
                 streams: int = 1, groups: int = 1, ksplit: int = 1) -> tuple[tuple[str, int, int], ...]:
        """(name, byte offset, bytes) of U, V and M for chunks of ``chunk`` images, or of ``tiles`` tiles when given
        (float32, 256-byte aligned); with ``csplit`` input-channel slices U and V hold one slice; with ``streams``
        > 1 a V and M per stream after U (``V``, ``M``, ``V1``, ``M1``, ...: chunk i runs on stream i % streams),
        and for backward filter a dU per stream first (``U``, ``U1``, ...: :meth:`partials`); with ``groups``
        (backward filter) every segment holds one group's points (:meth:`points`); with ``ksplit`` (backward
        filter) each stream's dU is ``ksplit`` copies and V and M hold the chunk's tiles padded to whole parts
        (:meth:`part_tiles`)."""
        t = self._chunk_tiles(chunk, tiles)
        return workspace.segments(self.op == "backward_filter", self.co, self.ci // csplit,
                                  ksplit * self.part_tiles(t, ksplit), streams, 4 * self.points(groups), ksplit)

    @staticmethod
    def part_tiles(tiles: int, ksplit: int = 1) -> int:
        """Tiles in each of the ``ksplit`` parts of a chunk of ``tiles`` tiles (the last part padded with zero
        tiles): the K of each part's GEMM."""
        return -(-tiles // ksplit)

    def ksplit_refusal(self, ksplit: int, streams: int = 1, groups: int = 1) -> str | None:
        """Why backward filter's chunk reduction does not split in ``ksplit`` parts here, or None.  Why split: a
        chunk's GEMMs make only Co x Ci outputs a point and reduce over its tiles, so for narrow layers cuBLAS runs
        few blocks with long loops (VGG-16 conv1_2's 64 x 64: 144 blocks of 32 x 32, 117 us for 3584 tiles, 43 us
        in 8 parts: ``wino_bwf_levers-64MiB.md``); part s of the tiles is its own V / Z block and adds into its own
        dU copy, summed by the inverse transform with the streams' copies.  Not with point groups; on several
        streams only where a stream's copies end on the workspace's alignment (so every copy is one stride
        apart)."""
        if ksplit not in KSPLITS:
            return f"must be one of {KSPLITS}, got {ksplit!r}"
        if ksplit == 1:
            return None
        if self.op != "backward_filter":
            return "only backward filter splits its chunks' reduction"
        if groups > 1:
            return "split reductions run without point groups"
        if streams > 1 and (ksplit * 4 * POINTS * self.co * self.ci) % WORKSPACE_ALIGN:
            return f"{ksplit} dU copies of {self.co} x {self.ci} do not end on {WORKSPACE_ALIGN}-byte alignment"
        return None

    def stream_buffers(self, k: int) -> dict[str, str]:
        """The segment names stream ``k`` uses for the GEMM's buffer names U, V, M (U shared, but for backward
        filter: each stream accumulates its own dU)."""
        return workspace.stream_buffers(self.op == "backward_filter", k)

    def partials(self, streams: int, chunks: int, groups: int = 1, ksplit: int = 1) -> tuple[int, int]:
        """(parts, stride in floats) of backward filter's per-stream dU on ``streams`` streams over a call of
        ``chunks`` chunks: the streams that ran a chunk (each wrote its dU), their dU buffers that far apart (every
        dU the same size, 256-byte aligned, so evenly spaced).  Why: a stream's GEMMs add into its own dU, so no
        two streams add into one buffer; the inverse filter transform sums them once per call.  With ``ksplit``
        every such stream wrote ``ksplit`` copies, one dU apart (:meth:`ksplit_refusal`)."""
        return workspace.partials(streams, chunks, 4 * self.points(groups) * self.co * self.ci, 4, ksplit)

    def _chunk_tiles(self, chunk: int, tiles: int | None) -> int:
        return chunk * self.tiles_per_image if tiles is None else tiles

    def workspace_bytes(self, chunk: int, tiles: int | None = None, csplit: int = 1, streams: int = 1,
                        groups: int = 1, ksplit: int = 1) -> int:
        """Exactly what a configuration running chunks of ``chunk`` images (or of ``tiles`` tiles) touches: U, V and
        M (the last not padded): ``36 * 4 * (Co*Cs (aligned) + Cs*T (aligned) + Co*T)`` bytes, T = chunk * tiles
        per image (or ``tiles``), Cs = Ci / ``csplit``; a V and M per stream with ``streams`` (and for backward
        filter a dU per stream); 36 / ``groups`` points in place of 36 with point groups; ``ksplit`` dU copies a
        stream and T padded to whole parts with split reductions."""
        return max(off + size for _, off, size in self.segments(chunk, tiles, csplit, streams, groups, ksplit))

    def chunk_refusal(self, chunk: int, tiles: int | None = None, n: int | None = None,
                      ksplit: int = 1) -> str | None:
        """Why chunks of ``chunk`` images (or ``tiles`` tiles, padded to ``ksplit`` whole parts) of a call on ``n``
        images do not run (32-bit thread and tile indices), or None."""
        t = ksplit * self.part_tiles(self._chunk_tiles(chunk, tiles), ksplit)
        what = f"chunks of {chunk} images" if tiles is None else f"chunks of {tiles} tiles"
        if max(self.ci, self.co) * t > _INT_MAX:
            return f"{what}: {max(self.ci, self.co) * t} transformed elements per point, over 2^31"
        if n is not None and n * self.tiles_per_image > _INT_MAX:
            return f"{n * self.tiles_per_image} tiles in the call, over 2^31"
        return None

    def gemm(self, images: int, tiles: int | None = None, accumulate: bool = False, groups: int = 1,
             ksplit: int = 1) -> Gemm:
        """The 36 products of a chunk of ``images`` images, or of ``tiles`` tiles when given (row-major, over the
        workspace buffers U, V, M).  Backward filter: ``U[xi] (Co x Ci) = M[xi] V[xi]^T`` over the chunk's tiles,
        added to U when ``accumulate`` (every chunk of a call after its first), one group's points with ``groups``;
        with ``ksplit`` the tiles in that many parts, the products of part s (its own [points][C][T/ksplit] V and Z
        block) into dU copy s: one batch of ``points * ksplit`` products.
        Forward and backward data add into M when ``accumulate`` (an input-channel slice after the chunk's first:
        :meth:`slice`), one group's points with ``groups``."""
        t = self._chunk_tiles(images, tiles)
        ci, co = self.ci, self.co
        points = self.points(groups)
        if self.op == "backward_filter":
            beta = 1.0 if accumulate else 0.0
            t, batch = self.part_tiles(t, ksplit), points * ksplit
            if self.cminor:   # M [T][Co], V [T][Ci]: U = M^T @ V
                return Gemm(a="M", b="V", c="U", m=co, n=ci, k=t, lda=co, ldb=ci, ldc=ci, stride_a=co * t,
                            stride_b=ci * t, stride_c=co * ci, batch=batch, trans_a=True, alpha=1.0, beta=beta)
            # M [Co][T], V [Ci][T]: U = M @ V^T
            return Gemm(a="M", b="V", c="U", m=co, n=ci, k=t, lda=t, ldb=t, ldc=ci, stride_a=co * t,
                        stride_b=ci * t, stride_c=co * ci, batch=batch, trans_b=True, alpha=1.0, beta=beta)
        if ksplit != 1:
            raise InputError("only backward filter splits its chunks' reduction", "ksplit")
        beta = 1.0 if accumulate else 0.0
        if self.cminor:   # M[xi] (T x Co) = V[xi] (T x Ci) @ U[xi]^T
            return Gemm(a="V", b="U", c="M", m=t, n=co, k=ci, lda=ci, ldb=ci, ldc=co, stride_a=ci * t,
                        stride_b=co * ci, stride_c=co * t, batch=points, trans_b=True, alpha=1.0, beta=beta)
        # M[xi] (Co x T) = U[xi] (Co x Ci) @ V[xi] (Ci x T)
        return Gemm(a="U", b="V", c="M", m=co, n=t, k=ci, lda=ci, ldb=t, ldc=t, stride_a=co * ci, stride_b=ci * t,
                    stride_c=co * t, batch=points, alpha=1.0, beta=beta)

    def chunks(self, n: int, chunk: int) -> list[tuple[int, int]]:
        """(first image, images) of each chunk of a call on ``n`` images."""
        return [(n0, min(chunk, n - n0)) for n0 in range(0, n, chunk)]

    def tile_chunks(self, n: int, tiles: int) -> list[tuple[int, int]]:
        """(first tile, tiles) of each chunk of ``tiles`` tiles of a call on ``n`` images (flat over its
        ``n * TH * TW`` tiles; the last chunk may be shorter)."""
        total = n * self.tiles_per_image
        return [(t0, min(tiles, total - t0)) for t0 in range(0, total, tiles)]

    def ranges(self, n: int, chunk: int, tiles: int | None = None) -> list[tuple[int, int]]:
        """(first tile, tiles) of each chunk: chunks of ``chunk`` images as tile ranges, or of ``tiles`` tiles."""
        if tiles is None:
            tpi = self.tiles_per_image
            return [(n0 * tpi, images * tpi) for n0, images in self.chunks(n, chunk)]
        return self.tile_chunks(n, tiles)


def chunk_sizes(n: int) -> list[int]:
    """The chunk sizes offered at micro-batch ``n``: the powers of two below ``n``, and ``n`` (one chunk)."""
    out, c = [], 1
    while c < n:
        out.append(c)
        c *= 2
    return out + [n]


#: tile chunks are offered up to this many images' tiles, or TILE_CHUNK_TOP tiles where that is more (small planes)
TILE_CHUNK_IMAGES = 4
TILE_CHUNK_TOP = 2048
#: and down to this fraction of one image's tiles
TILE_CHUNK_MIN_FRACTION = 16
#: chunks of TILE_CHUNK_ALIGN tiles or more are multiples of it: T is the N (NCHW) or M (NHWC) of the chunk's 36
#: GEMMs, and cuBLAS's tiles along it are 64 or 128 wide -- VGG-16 conv4_2 (512 channels) at 192 tiles runs its GEMMs
#: at 37 TFLOPS, at 196 at 26 (``wino_chunks-tiles.md``)
TILE_CHUNK_ALIGN = 64


def tile_chunk_sizes(geo: "Geometry", n: int) -> list[int]:
    """The tile-range chunk sizes offered at micro-batch ``n``, ascending.  From ``TILE_CHUNK_ALIGN`` tiles up:
    ``TILE_CHUNK_ALIGN * m`` for m = 1, 2, 3 and 4..7 times a power of two (four sizes an octave, so some size fills
    any workspace limit to within a fifth); below it, ``TW * r`` tiles for ``r`` tile rows a power of two or three
    times one.  From ``tiles_per_image / TILE_CHUNK_MIN_FRACTION`` (at least one row) to below the larger of
    ``TILE_CHUNK_IMAGES`` images' tiles and ``TILE_CHUNK_TOP`` tiles (and below the call's tiles); the image chunks of
    :func:`chunk_sizes` (powers of two) left out.  Below one image they make any plane fit a small workspace; above,
    they fill the workspace between b and 2b images in sizes the GEMMs tile evenly."""
    tpi, tw = geo.tiles_per_image, geo.tiles_w
    top = min(n * tpi, max(TILE_CHUNK_IMAGES * tpi, TILE_CHUNK_TOP))
    low = max(tw, tpi // TILE_CHUNK_MIN_FRACTION)
    sizes, r = set(), 1
    while r * tw < TILE_CHUNK_ALIGN:
        sizes.update(t for t in (r * tw, 3 * r * tw) if t < TILE_CHUNK_ALIGN)
        r *= 2
    m = 1
    while TILE_CHUNK_ALIGN * m < top:
        sizes.update(TILE_CHUNK_ALIGN * k for k in ((1, 2, 3) if m == 1 else (m, m * 5 // 4, m * 3 // 2, m * 7 // 4)))
        m = 4 if m == 1 else 2 * m
    images = {c * tpi for c in chunk_sizes(n)}
    return sorted(t for t in sizes if low <= t < top and t not in images)


# ---- CPU emulation of winograd.cu (thread by thread index math, vectorised over threads) ---------------------------
def _bt(d0, d1, d2, d3, d4, d5):
    return (4 * d0 - 5 * d2 + d4, -4 * d1 - 4 * d2 + d3 + d4, 4 * d1 - 4 * d2 - d3 + d4,
            -2 * d1 - d2 + 2 * d3 + d4, 2 * d1 - d2 - 2 * d3 + d4, 4 * d1 - 5 * d3 + d5)


def _g(g0, g1, g2):
    return (0.25 * g0, -(g0 + g1 + g2) / 6, -(g0 - g1 + g2) / 6, g0 / 24 + g1 / 12 + g2 / 6,
            g0 / 24 - g1 / 12 + g2 / 6, g2)


def _at(m0, m1, m2, m3, m4, m5):
    return (m0 + m1 + m2 + m3 + m4, m1 - m2 + 2 * m3 - 2 * m4, m1 + m2 + 4 * m3 + 4 * m4,
            m1 - m2 + 8 * m3 - 8 * m4 + m5)


def _separable(f, block: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
    """f applied to every column of ``block`` (rows x cols of per-thread vectors), then to every row."""
    cols = [f(*[block[a][b] for a in range(len(block))]) for b in range(len(block[0]))]   # cols[b][i]
    tmp = [[cols[b][i] for b in range(len(cols))] for i in range(len(cols[0]))]
    return [list(f(*row)) for row in tmp]


def emulate_filter(geo: Geometry, w: np.ndarray, U: np.ndarray, p0: int = 0, points: int = POINTS) -> None:
    """wino_filter: ``U`` (flat, >= points*Co*Ci) from flat ``w``, points ``p0 .. p0 + points - 1``."""
    idx = np.arange(geo.co * geo.ci)
    o, i = idx // geo.ci, idx % geo.ci
    so, si, sr, ss = geo.filter_strides
    base = o * so + i * si
    g = [[w[base + ((2 - r) if geo.rot else r) * sr + ((2 - s) if geo.rot else s) * ss] for s in range(3)]
         for r in range(3)]
    _scatter(_separable(_g, g), U, geo.co * geo.ci, idx, p0, points)


def _tile_of(geo: Geometry, idx: np.ndarray, channels: int, t_count: int, t0: int = 0) -> tuple[np.ndarray, ...]:
    """(channel, n, th, tw, t) of each thread of wino_input / wino_output (wino_tile's decoding of ``idx``; the
    thread's tile t of the range is ``t0 + t`` over the whole call)."""
    if geo.cminor:
        t, c = idx // channels, idx % channels
    else:
        c, t = idx // t_count, idx % t_count
    g = t0 + t
    tw, nt = g % geo.tiles_w, g // geo.tiles_w
    return c, nt // geo.tiles_h, nt % geo.tiles_h, tw, t


def _gather(flat: np.ndarray, base: np.ndarray, strides: tuple[int, int], h0: np.ndarray, w0: np.ndarray, size: int,
            bounds: tuple[int, int]) -> list[list[np.ndarray]]:
    """A ``size x size`` patch per thread from ``flat`` (rows from ``h0``, columns from ``w0``, element strides
    ``strides``), zero outside ``[0, bounds)``: the kernels' tile reads."""
    (sh, sw), (hi, wi) = strides, bounds
    out = []
    for a in range(size):
        row = []
        for b in range(size):
            h, ww = h0 + a, w0 + b
            ok = (h >= 0) & (h < hi) & (ww >= 0) & (ww < wi)
            row.append(np.where(ok, flat[np.where(ok, base + h * sh + ww * sw, 0)], 0.0))
        out.append(row)
    return out


def _scatter(block: list[list[np.ndarray]], dst: np.ndarray, plane: int, idx: np.ndarray, p0: int = 0,
             points: int = POINTS) -> None:
    """The transform-domain values ``p0 .. p0 + points - 1`` of each thread into ``dst`` ([points][plane] from
    ``p0``, the thread's offset ``idx``)."""
    for a in range(6):
        for b in range(6):
            if p0 <= a * 6 + b < p0 + points:
                dst[(a * 6 + b - p0) * plane + idx] = block[a][b]


def _unscatter(src: np.ndarray, plane: int, idx: np.ndarray, p0: int = 0, points: int = POINTS, parts: int = 1,
               stride: int = 0) -> list[list[np.ndarray]]:
    """:func:`_scatter`'s inverse: each thread's 6 x 6 transform-domain values read from ``src`` ([points][plane]
    from ``p0``, the thread's offset ``idx``), the points outside the group zero; with ``parts`` the sum of that
    many such buffers ``stride`` floats apart (backward filter's per-stream dU)."""
    def point(xi: int) -> np.ndarray:
        if not p0 <= xi < p0 + points:
            return np.zeros(idx.shape)
        total = src[(xi - p0) * plane + idx]
        for p in range(1, parts):
            total = total + src[p * stride + (xi - p0) * plane + idx]
        return total

    return [[point(a * 6 + b) for b in range(6)] for a in range(6)]


def _slots(geo: Geometry, channels: int, t_count: int, parts: int, points: int,
           t0: int) -> tuple[np.ndarray, ...]:
    """wino_tile and wino_slot for every thread of wino_input / wino_dy over tiles ``t0 .. t0 + t_count`` stored in
    ``parts`` parts of ceil(t_count / parts) tiles: (channel, n, th, tw, each thread's store offset of point 0, a
    point's plane, which threads hold a real tile)."""
    ts = Geometry.part_tiles(t_count, parts)
    tp = parts * ts
    c, n, th, tw, t = _tile_of(geo, np.arange(channels * tp), channels, tp, t0)
    s, tl = t // ts, t % ts
    plane = channels * ts
    local = tl * channels + c if geo.cminor else c * ts + tl
    return c, n, th, tw, s * points * plane + local, plane, t < t_count


def emulate_input(geo: Geometry, x: np.ndarray, V: np.ndarray, t0: int, t_count: int, p0: int = 0,
                  points: int = POINTS, parts: int = 1) -> None:
    """wino_input on tiles ``t0 .. t0 + t_count`` of flat ``x`` (image 0 at the view's start), storing points
    ``p0 .. p0 + points - 1``, the tiles in ``parts`` parts (padded with zero tiles: :meth:`Geometry.gemm`)."""
    c, n, th, tw, dst, plane, live = _slots(geo, geo.ci, t_count, parts, points, t0)
    sn, sc, sh, sw = geo.in_strides
    d = _gather(x, np.where(live, n * sn + c * sc, 0), (sh, sw), np.where(live, 4 * th - geo.pad[0], -A_TILE),
                4 * tw - geo.pad[1], A_TILE, (geo.hi, geo.wi))
    _scatter(_separable(_bt, d), V, plane, dst, p0, points)


def emulate_output(geo: Geometry, M: np.ndarray, y: np.ndarray, t0: int, t_count: int, alpha: float,
                   beta: float, p0: int = 0, points: int = POINTS) -> None:
    """wino_output on tiles ``t0 .. t0 + t_count`` of flat ``y`` (image 0 at the view's start;
    y = alpha * A^T M A + beta * y, clipped to Ho x Wo), M holding points ``p0 .. p0 + points - 1`` (the others
    zero)."""
    idx = np.arange(geo.co * t_count)
    k, n, th, tw, _ = _tile_of(geo, idx, geo.co, t_count, t0)
    o = _separable(_at, _unscatter(M, geo.co * t_count, idx, p0, points))
    sn, sc, sh, sw = geo.out_strides
    base = n * sn + k * sc
    for a in range(4):
        for b in range(4):
            h, ww = 4 * th + a, 4 * tw + b
            ok = (h < geo.ho) & (ww < geo.wo)
            p = (base + h * sh + ww * sw)[ok]
            v = alpha * o[a][b][ok]
            y[p] = v + beta * y[p] if beta != 0 else v


def _a(v0, v1, v2, v3):
    return (v0, v0 + v1 + v2 + v3, v0 - v1 + v2 - v3, v0 + 2 * v1 + 4 * v2 + 8 * v3, v0 - 2 * v1 + 4 * v2 - 8 * v3,
            v3)


def _gt(u0, u1, u2, u3, u4, u5):
    return (0.25 * u0 - (u1 + u2) / 6 + (u3 + u4) / 24, (u2 - u1) / 6 + (u3 - u4) / 12, (u3 + u4 - u1 - u2) / 6 + u5)


def emulate_dy(geo: Geometry, dy: np.ndarray, Z: np.ndarray, t0: int, t_count: int, p0: int = 0,
               points: int = POINTS, parts: int = 1) -> None:
    """wino_dy on tiles ``t0 .. t0 + t_count`` of flat ``dy`` (image 0 at the view's start): Z = A dy A^T, the 4x4
    tile zero past Ho x Wo, in M's layout, points ``p0 .. p0 + points - 1``, in ``parts`` parts as
    :func:`emulate_input`."""
    k, n, th, tw, dst, plane, live = _slots(geo, geo.co, t_count, parts, points, t0)
    sn, sc, sh, sw = geo.out_strides
    d = _gather(dy, np.where(live, n * sn + k * sc, 0), (sh, sw), np.where(live, 4 * th, geo.ho), 4 * tw, M_TILE,
                (geo.ho, geo.wo))
    _scatter(_separable(_a, d), Z, plane, dst, p0, points)


def emulate_filter_grad(geo: Geometry, U: np.ndarray, w: np.ndarray, alpha: float, beta: float, parts: int = 1,
                        stride: int = 0, p0: int = 0, points: int = POINTS) -> None:
    """wino_filter_grad: flat ``w`` (the filter's strides) = alpha * G^T dU G + beta * w, dU the sum of ``parts``
    buffers ``stride`` floats apart from the start of flat ``U``, holding points ``p0 .. p0 + points - 1`` (the
    others zero)."""
    idx = np.arange(geo.co * geo.ci)
    o, i = idx // geo.ci, idx % geo.ci
    g = _separable(_gt, _unscatter(U, geo.co * geo.ci, idx, p0, points, parts, stride))
    so, si, sr, ss = geo.filter_strides
    for r in range(3):
        for s in range(3):
            p = o * so + i * si + r * sr + s * ss
            v = alpha * g[r][s]
            w[p] = v + beta * w[p] if beta != 0 else v


def emulate_backward_filter(geo: Geometry, x: np.ndarray, dy: np.ndarray, w: np.ndarray, n: int, chunk: int,
                            alpha: float = 1.0, beta: float = 0.0, workspace: np.ndarray | None = None,
                            gemm: Callable[[list[Gemm], dict[str, np.ndarray]], None] | None = None,
                            tiles: int | None = None, streams: int = 1, groups: int = 1,
                            ksplit: int = 1) -> np.ndarray:
    """One backward-filter launch on the CPU, as the source runs it (flat ``x``, ``dy``, ``w`` addressed by the
    geometry's strides; chunks and workspace as :func:`emulate`).  With ``streams``, chunk i accumulates into
    stream i % streams's own dU (its first chunk overwriting) and the inverse transform sums them.  With
    ``groups``, the chunks run once per group of points (:meth:`Geometry.points`), each group's inverse transform
    adding into dw after the first's.  With ``ksplit``, each chunk's tiles in that many parts, each part's
    products into its own dU copy (:meth:`Geometry.gemm`), all copies summed by the inverse transform.  Returns
    the workspace."""
    if geo.op != "backward_filter":
        raise InputError(f"emulate_backward_filter runs backward_filter geometry, got {geo.op!r}", "geo")
    why = geo.ksplit_refusal(ksplit, streams, groups)
    if why:
        raise InputError(why, "ksplit")
    words = geo.workspace_bytes(chunk, tiles, 1, streams, groups, ksplit) // 4
    ws = np.full(words, np.nan) if workspace is None else workspace
    every = {name: ws[off // 4: off // 4 + size // 4]
             for name, off, size in geo.segments(chunk, tiles, 1, streams, groups, ksplit)}
    run = gemm or (lambda gms, bufs: run_gemms(gms, bufs))
    ranges = geo.ranges(n, chunk, tiles)
    points = geo.points(groups)
    parts, stride = geo.partials(streams, len(ranges), groups, ksplit)
    for g in range(groups):
        p0 = g * points
        for i, (t0, count) in enumerate(ranges):
            seg = {name: every[buf] for name, buf in geo.stream_buffers(i % streams).items()}
            emulate_input(geo, x, seg["V"], t0, count, p0, points, ksplit)
            emulate_dy(geo, dy, seg["M"], t0, count, p0, points, ksplit)
            run([geo.gemm(0, count, accumulate=i >= streams, groups=groups, ksplit=ksplit)], seg)
        # U, the first dU, at the workspace's start; groups after the first add into dw
        emulate_filter_grad(geo, ws, w, alpha, beta if g == 0 else 1.0, parts, stride, p0, points)
    return ws


def emulate(geo: Geometry, w: np.ndarray, x: np.ndarray, y: np.ndarray, n: int, chunk: int, alpha: float = 1.0,
            beta: float = 0.0, workspace: np.ndarray | None = None,
            gemm: Callable[[list[Gemm], dict[str, np.ndarray]], None] | None = None,
            tiles: int | None = None, csplit: int = 1, streams: int = 1, groups: int = 1) -> np.ndarray:
    """One launch on the CPU, as the source runs it: ``x`` the input (x, or dy for backward data), ``y`` the output
    (flat arrays addressed by the geometry's strides), in chunks of ``chunk`` images, or of ``tiles`` tiles when
    given; the workspace a flat float array of ``workspace_bytes(chunk, tiles) / 4`` elements split into U, V, M at
    the segments' offsets.  ``gemm(gemms, buffers)`` replaces the row-major GEMM execution (tests pass cuBLAS's
    column-major view).  Returns the workspace.  Backward filter: :func:`emulate_backward_filter`."""
    if geo.op == "backward_filter":
        raise InputError("emulate runs forward and backward data; backward filter is emulate_backward_filter", "geo")
    if streams > 1 and csplit > 1:
        raise InputError("input-channel slices run on one stream", "streams")
    if groups > 1 and csplit > 1:
        raise InputError("input-channel slices run without point groups", "groups")
    words = geo.workspace_bytes(chunk, tiles, csplit, streams, groups) // 4
    ws = np.full(words, np.nan) if workspace is None else workspace
    every = {name: ws[off // 4: off // 4 + size // 4]
             for name, off, size in geo.segments(chunk, tiles, csplit, streams, groups)}
    part = geo.slice(csplit)
    run = gemm or (lambda gms, bufs: run_gemms(gms, bufs))
    points = geo.points(groups)
    for g in range(groups):   # a group's U once, then every chunk on its points, adding into y after the first
        p0, scale = g * points, beta if g == 0 else 1.0
        if csplit == 1:
            emulate_filter(part, w, every["U"], p0, points)
        for i, (t0, count) in enumerate(geo.ranges(n, chunk, tiles)):
            # chunk i runs on stream i % streams, in that stream's V and M
            seg = {name: every[buf] for name, buf in geo.stream_buffers(i % streams).items()}
            for s in range(csplit):   # a slice's U (again, per chunk), its V, its GEMM adding into M after the first
                w_off, x_off = geo.slice_offsets(csplit, s)
                if csplit > 1:
                    emulate_filter(part, w[w_off:], seg["U"])
                emulate_input(part, x[x_off:], seg["V"], t0, count, p0, points)
                run([part.gemm(0, count, accumulate=s > 0, groups=groups)], seg)
            emulate_output(geo, seg["M"], y, t0, count, alpha, scale, p0, points)
    return ws


# ---- fused (wino_fused): U in the workspace, V and M in shared memory and registers -------------------------------
#: a wino_fused block: FUSED_BK output channels x FUSED_BT tiles, FUSED_BC input channels a step, FUSED_THREADS threads
#: (winograd.cu's WF_* constants)
FUSED_BK, FUSED_BT, FUSED_BC, FUSED_THREADS = 32, 24, 8, 288
#: its dynamic shared memory: two stages of U's slab, V and the raw 6x6 patches (37 floats apart)
#: (185856 bytes: under sm_90's 227 KB opt-in, over sm_80's 163 KB, so FUSED_MIN_CC)
FUSED_SMEM = 2 * 4 * POINTS * FUSED_BC * (FUSED_BK + FUSED_BT) + 2 * 4 * FUSED_BC * FUSED_BT * 37
FUSED_MIN_CC = 90


def fused_dims(geo: Geometry) -> tuple[int, int]:
    """(Kp, Cp): the output and input channels of ``geo`` rounded up to a block's and a step's (U's padding)."""
    return align_up(geo.co, FUSED_BK), align_up(geo.ci, FUSED_BC)


def fused_workspace_bytes(geo: Geometry) -> int:
    """What the fused kernel touches: U in its layout ``[Cp][36][Kp]`` (float32), whatever the batch."""
    kp, cp = fused_dims(geo)
    return 4 * POINTS * kp * cp


def fused_refusal(geo: Geometry, n: int) -> str | None:
    """Why wino_fused does not run ``geo`` on ``n`` images (32-bit tile and grid indices), or None."""
    if geo.op == "backward_filter":
        return "backward filter accumulates over tiles: the fused kernel runs forward and backward data"
    tiles_ = n * geo.tiles_per_image
    if tiles_ + FUSED_BT > _INT_MAX:
        return f"{tiles_} tiles in the call, over 2^31"
    kp, cp = fused_dims(geo)
    if kp * cp > _INT_MAX or kp // FUSED_BK > 65535:
        return f"{geo.co} x {geo.ci} channels: over the fused kernel's grid"
    return None


def emulate_filter_fused(geo: Geometry, w: np.ndarray, Uf: np.ndarray) -> None:
    """wino_filter_fused: ``Uf`` (flat, >= Cp*36*Kp) in the fused layout ``[Cp][36][Kp]``, zero in the padding."""
    kp, cp = fused_dims(geo)
    U = np.zeros(POINTS * geo.co * geo.ci)
    emulate_filter(geo, w, U)
    full = np.zeros((cp, POINTS, kp))
    full[:geo.ci, :, :geo.co] = U.reshape(POINTS, geo.co, geo.ci).transpose(2, 0, 1)
    Uf[:full.size] = full.ravel()


def emulate_fused(geo: Geometry, w: np.ndarray, x: np.ndarray, y: np.ndarray, n: int, alpha: float = 1.0,
                  beta: float = 0.0, workspace: np.ndarray | None = None) -> np.ndarray:
    """One fused launch on the CPU: U written in the fused layout into the workspace, then per tile the input
    transform, the 36 products read from that layout (``M[xi][k][t] = sum_c Uf[c][xi][k] V[xi][c][t]``, the padded
    channels included) and the output transform -- the kernels' index math, not their blocking.  Returns the
    workspace."""
    why = fused_refusal(geo, n)
    if why:
        raise InputError(f"wino_fused cannot run {geo.op}: {why}", "geo")
    kp, cp = fused_dims(geo)
    ws = np.full(fused_workspace_bytes(geo) // 4, np.nan) if workspace is None else workspace
    emulate_filter_fused(geo, w, ws)
    t = n * geo.tiles_per_image
    V = np.zeros(POINTS * geo.ci * t)
    channel_major = replace(geo, cminor=False)
    emulate_input(channel_major, x, V, 0, t)
    Vp = np.zeros((POINTS, cp, t))
    Vp[:, :geo.ci] = V.reshape(POINTS, geo.ci, t)
    M = np.einsum("cxk,xct->xkt", ws[:cp * POINTS * kp].reshape(cp, POINTS, kp), Vp)[:, :geo.co]
    emulate_output(channel_major, M.ravel(), y, 0, t, alpha, beta)
    return ws


# ---- GPU launchers (winograd.cu), on raw device pointers -----------------------------------------------------------
# launchers take an optional last argument, the raw stream to launch on (default CuPy's current stream)
FilterFn = Callable[..., None]   # (w, U[, stream])
InputFn = Callable[..., None]    # (x, V, t0, tiles[, stream]); also wino_dy's (dy, Z, t0, tiles[, stream])
OutputFn = Callable[..., None]   # (M, y, t0, tiles, alpha, beta[, stream])
GradFn = Callable[..., None]     # (dU, w, alpha, beta[, parts, stride])


def _checked(geo: Geometry, itemsize: int) -> None:
    if itemsize != 4:
        raise InputError(f"element size {itemsize} bytes is not supported (float32)", "itemsize")


class _TileArgs:
    """Grid and scalar arguments (after the two pointers) of the per-tile kernels for a tile range, built once per
    (t0, tiles): the input side (wino_input, over Ci channels) and the output side (wino_output / wino_dy, Co)."""

    def __init__(self, geo: Geometry, ksplit: int = 1) -> None:
        self.geo, self.ksplit = geo, ksplit
        self._cache: dict[tuple[int, int], tuple[tuple, tuple]] = {}

    def packed(self, kernel: Any, side: int, head: tuple, tail: tuple) -> Callable[[int, int], Any]:
        """``launch(t0, t)``: ``kernel``'s :class:`~ucudnn.kernels._compile.PackedLaunch` for that tile range
        (``side`` 0: the input side's grid and arguments, 1: the output side's), ``head`` and ``tail`` around
        them (the grid covering the tiles padded to ``ksplit`` whole parts); built at a range's first launch and
        kept, as a prepared call runs the same ranges every time."""
        made: dict[tuple[int, int], Any] = {}

        def launch(t0: int, t: int) -> Any:
            hit = made.get((t0, t))
            if hit is None:
                grid, args = self(t0, t)[side]
                hit = made[(t0, t)] = _compile.packed(kernel, grid, (_THREADS,), head + args + tail)
            return hit

        return launch

    def __call__(self, t0: int, t: int) -> tuple[tuple, tuple]:
        key = (t0, t)
        if key not in self._cache:
            g, i32, i64 = self.geo, np.int32, np.int64
            th, tw = g.tiles_h, g.tiles_w
            tp = self.ksplit * Geometry.part_tiles(t, self.ksplit)   # threads for the parts' padding tiles too
            self._cache[key] = (
                ((-(-g.ci * tp // _THREADS),), (i32(g.ci), i32(t), i32(t0), i32(th), i32(tw), i32(g.hi), i32(g.wi),
                                                 i32(g.pad[0]), i32(g.pad[1])) + tuple(i64(v) for v in g.in_strides)),
                ((-(-g.co * tp // _THREADS),), (i32(g.co), i32(t), i32(t0), i32(th), i32(tw), i32(g.ho), i32(g.wo))
                 + tuple(i64(v) for v in g.out_strides)))
        return self._cache[key]


def launchers(geo: Geometry, itemsize: int = 4, groups: int = 1) -> tuple[FilterFn, InputFn, OutputFn]:
    """Forward and backward data: ``filter(w, U[, stream, group])``, ``input(x, V, t0, tiles[, stream, group])``,
    ``output(M, y, t0, tiles, alpha, beta[, stream, group])`` on CuPy's current stream unless a stream is named (x,
    y: pointers to the call's image 0; the chunk is tiles ``t0 .. t0 + tiles`` of the call), each on point group
    ``group`` of ``groups`` (:meth:`Geometry.points`; U, V and M hold that group's points, the output transform
    reads only them).  The kernels are compiled (or fetched) here, so a launch inside a CUDA graph capture only
    enqueues."""
    _checked(geo, itemsize)
    if geo.op == "backward_filter":
        raise InputError("backward filter launches through backward_filter_launchers", "geo")
    cm = "true" if geo.cminor else "false"
    names = (f"wino_filter<float,{'true' if geo.rot else 'false'}>", f"wino_input<float,{cm}>",
             f"wino_output<float,{cm}>")
    kf, ki, ko = (_compile.get_kernel(SOURCE, name) for name in names)   # compiled once, here
    points = geo.points(groups)
    f_args = (np.int32(geo.co), np.int32(geo.ci)) + tuple(np.int64(v) for v in geo.filter_strides)
    filt = _compile.packed(kf, (-(-geo.co * geo.ci // _THREADS),), (_THREADS,),
                           (PTR, PTR) + f_args + (I32, np.int32(points)))
    shapes = _TileArgs(geo)
    inputs = shapes.packed(ki, 0, (PTR, PTR), (I32, np.int32(points), np.int32(1)))
    outputs = shapes.packed(ko, 1, (PTR, PTR), (F32, F32, I32, np.int32(points)))

    def filter_(w: int, U: int, stream: int | None = None, group: int = 0) -> None:
        filt(w, U, group * points, stream=stream)

    def input_(x: int, V: int, t0: int, tiles: int, stream: int | None = None, group: int = 0) -> None:
        inputs(t0, tiles)(x, V, group * points, stream=stream)

    def output_(M: int, y: int, t0: int, tiles: int, alpha: float, beta: float, stream: int | None = None,
                group: int = 0) -> None:
        outputs(t0, tiles)(M, y, alpha, beta, group * points, stream=stream)

    return filter_, input_, output_


def backward_filter_launchers(geo: Geometry, itemsize: int = 4, groups: int = 1,
                              ksplit: int = 1) -> tuple[InputFn, InputFn, GradFn]:
    """Backward filter: ``input(x, V, t0, tiles, stream, group)`` (the forward's), ``dy(dy, Z, t0, tiles, stream,
    group)`` (Z = A dy A^T into M's buffer) and ``grad(dU, w, alpha, beta, parts=1, stride=0, group=0)`` (w = alpha
    * G^T dU G + beta * w, dU the sum of ``parts`` buffers ``stride`` floats apart: :meth:`Geometry.partials`), each
    on point group ``group`` of ``groups`` (:meth:`Geometry.points`), the transforms storing a chunk's tiles in
    ``ksplit`` parts (:meth:`Geometry.gemm`), compiled here like :func:`launchers`."""
    _checked(geo, itemsize)
    if geo.op != "backward_filter":
        raise InputError(f"backward_filter_launchers takes backward_filter geometry, got {geo.op!r}", "geo")
    why = geo.ksplit_refusal(ksplit, groups=groups)
    if why:
        raise InputError(why, "ksplit")
    cm = "true" if geo.cminor else "false"
    ki, kd, kg = (_compile.get_kernel(SOURCE, name)
                  for name in (f"wino_input<float,{cm}>", f"wino_dy<float,{cm}>", "wino_filter_grad<float>"))
    g_args = (np.int32(geo.co), np.int32(geo.ci)) + tuple(np.int64(v) for v in geo.filter_strides)
    g_grid = (-(-geo.co * geo.ci // _THREADS),)
    points = geo.points(groups)
    shapes = _TileArgs(geo, ksplit)
    inputs = shapes.packed(ki, 0, (PTR, PTR), (I32, np.int32(points), np.int32(ksplit)))
    dys = shapes.packed(kd, 1, (PTR, PTR), (I32, np.int32(points), np.int32(ksplit)))

    def input_(x: int, V: int, t0: int, tiles: int, stream: int | None = None, group: int = 0) -> None:
        inputs(t0, tiles)(x, V, group * points, stream=stream)

    def dy_(dy: int, Z: int, t0: int, tiles: int, stream: int | None = None, group: int = 0) -> None:
        dys(t0, tiles)(dy, Z, group * points, stream=stream)

    def grad_(U: int, w: int, alpha: float, beta: float, parts: int = 1, stride: int = 0, group: int = 0) -> None:
        kg(g_grid, (_THREADS,), (U, w) + g_args + (np.float32(alpha), np.float32(beta), np.int32(parts),
                                                   np.int64(stride), np.int32(group * points), np.int32(points)))

    return input_, dy_, grad_


def fused_launchers(geo: Geometry, itemsize: int = 4) -> tuple[FilterFn, Callable[[int, int, int, int, float, float],
                                                                                  None]]:
    """Forward and backward data in one kernel: ``filter(w, Uf)`` (U in the fused layout, padding zeroed) and
    ``conv(x, Uf, y, n, alpha, beta)`` over ``n`` images (x, y: image 0's pointers), compiled here like
    :func:`launchers` (the kernel's shared-memory size set once)."""
    _checked(geo, itemsize)
    if geo.op == "backward_filter":
        raise InputError("the fused kernel runs forward and backward data", "geo")
    if _compile.compute_capability() < FUSED_MIN_CC:
        raise InputError(f"the fused kernel needs sm_{FUSED_MIN_CC} ({FUSED_SMEM} bytes of shared memory a block), "
                         f"this device is sm_{_compile.compute_capability()}", "device")
    kp, cp = fused_dims(geo)
    kf = _compile.get_kernel(SOURCE, f"wino_filter_fused<float,{'true' if geo.rot else 'false'}>")
    kc = _compile.get_kernel(SOURCE, "wino_fused<float>")
    kc.max_dynamic_shared_size_bytes = FUSED_SMEM
    i32, i64 = np.int32, np.int64
    f_args = (i32(geo.co), i32(geo.ci), i32(kp), i32(cp)) + tuple(i64(v) for v in geo.filter_strides)
    f_grid = (-(-kp * cp // _THREADS),)
    head = (i32(geo.ci), i32(geo.co), i32(kp))
    tail = ((i32(geo.tiles_h), i32(geo.tiles_w), i32(geo.hi), i32(geo.wi), i32(geo.ho), i32(geo.wo),
             i32(geo.pad[0]), i32(geo.pad[1])) + tuple(i64(v) for v in geo.in_strides)
            + tuple(i64(v) for v in geo.out_strides))

    def filter_(w: int, Uf: int) -> None:
        kf(f_grid, (_THREADS,), (w, Uf) + f_args)

    def conv_(x: int, Uf: int, y: int, n: int, alpha: float, beta: float) -> None:
        why = fused_refusal(geo, n)
        if why:
            raise InputError(f"wino_fused cannot run {geo.op}: {why}", "n")
        t = n * geo.tiles_per_image
        kc((-(-t // FUSED_BT), kp // FUSED_BK), (FUSED_THREADS,),
           (x, Uf, y) + head + (i32(t),) + tail + (np.float32(alpha), np.float32(beta)), shared_mem=FUSED_SMEM)

    return filter_, conv_


__all__ = [
    "AT",
    "BT",
    "CSPLITS",
    "KSPLITS",
    "POINT_GROUPS",
    "FUSED_BC",
    "FUSED_BK",
    "FUSED_BT",
    "FUSED_MIN_CC",
    "FUSED_SMEM",
    "FUSED_THREADS",
    "STREAMS",
    "TILE_CHUNK_ALIGN",
    "TILE_CHUNK_IMAGES",
    "TILE_CHUNK_MIN_FRACTION",
    "TILE_CHUNK_TOP",
    "WORKSPACE_ALIGN",
    "G",
    "Geometry",
    "backward_filter_launchers",
    "chunk_sizes",
    "correlation_reference",
    "direct_correlation",
    "emulate",
    "emulate_backward_filter",
    "emulate_filter_fused",
    "emulate_fused",
    "filter_transform",
    "fused_dims",
    "fused_launchers",
    "fused_refusal",
    "fused_workspace_bytes",
    "input_transform",
    "launchers",
    "output_transform",
    "refusal",
    "tile_chunk_sizes",
]
