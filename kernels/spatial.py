"""Fused 1x1 -> spatial blocks on tensor cores (``spatial.cu``): seed 004's straight blocks of a 1x1 then an R x S
convolution (a.1: GoogLeNet's 1x1 reduce, then 5x5) and split blocks of a 1x1 then two such convolutions
concatenated (b.1: SqueezeNet's fire), in FP16 with FP32 accumulation.

Why a third fused kernel: :mod:`kernels.fused` computes in float32 FMA and only tied cuDNN's tensor-core per-layer
kernels on a.1 in FP16 (H100, batch 1: 20.4 vs 20.4 us); :mod:`kernels.pointwise` runs chains of 1x1s only.  Here
the producer is a GEMM over the output tile's halo and each consumer an implicit GEMM reading its taps straight from
the intermediate in shared memory.

    launch = launcher(SEED_BLOCKS["a.1"], "float16", "NCHW", x.shape)          # compiles once (NVRTC)
    launch(x, weights, biases, out)                                            # the fused.launcher signature

A tiling is (``th`` x ``tw`` output pixels, ``nw`` warps, ``rtb`` 16-row tiles of output channels per thread block,
0: all); :func:`kernels.blocks.tuned` times :data:`TILINGS` on the operands.  :func:`halo` is the kernel's halo
arithmetic (the CPU tests check every tap lands in it), :func:`emulate` its arithmetic in NumPy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ucudnn.errors import InputError

from . import _compile
from .fused import Block, ConvLayer, Launch, _check, layer_ptrs, smem_limit
from .pointwise import _ACT_ENUM, _act

SOURCE = "spatial.cu"
LAYOUTS = ("NCHW", "NHWC")
MAX_FILTER = 7          # consumer filters up to 7 x 7 (every tap is unrolled)
#: (th, tw, nw, rtb) tried by :func:`kernels.blocks.tuned`, the first being the default; rtb 0 = every row tile in
#: one block.
TILINGS: tuple[tuple[int, int, int, int], ...] = (
    (4, 8, 8, 2), (4, 4, 4, 0), (4, 4, 4, 1), (2, 4, 4, 1), (4, 8, 4, 1), (2, 8, 4, 0), (8, 8, 8, 0))
_MAX_Z = 65535


def _consumers(block: Block) -> tuple[ConvLayer, ...]:
    return tuple(block.layers[1:])


def unsupported(block: Block, dtype: str) -> str | None:
    """Why this kernel cannot run ``block`` in ``dtype`` (None: it can)."""
    if dtype != "float16":
        return "tensor-core blocks run float16 data"
    if block.mode not in ("straight", "split"):
        return f"a {block.mode} block has no single producer"
    p = block.layers[0]
    if p.kernel != (1, 1) or p.stride != (1, 1) or p.pad != (0, 0) or p.groups != 1:
        return "the first layer is not a 1x1, stride-1, unpadded, ungrouped convolution"
    if block.in_channels % 16 or p.out_channels % 16:
        return f"the first layer's channels ({block.in_channels} -> {p.out_channels}) are not multiples of 16"
    for i, c in enumerate(_consumers(block), 1):
        if c.stride != (1, 1) or c.groups != 1:
            return f"layer {i} is strided or grouped"
        if max(c.kernel) > MAX_FILTER:
            return f"layer {i}'s filter {c.kernel} is wider than {MAX_FILTER}"
        if c.out_channels % 16:
            return f"layer {i}'s {c.out_channels} output channels are not a multiple of 16"
    return None


@dataclass(frozen=True)
class Halo:
    """spatial.cu's ``Halo``: the intermediate pixels a th x tw output tile reads.  ``dh``/``dw``: how far above /
    left of the tile the halo starts (the larger pad); ``hh`` x ``hw`` pixels, ``hpp`` rounded up to 8 (the
    producer GEMM's columns)."""

    dh: int
    dw: int
    hh: int
    hw: int

    @property
    def hp(self) -> int:
        return self.hh * self.hw

    @property
    def hpp(self) -> int:
        return -(-self.hp // 8) * 8

    def tap(self, layer: ConvLayer, ty: int, tx: int, i: int, k: int) -> int:
        """The halo pixel (row-major index) that ``layer``'s tap (i, k) of tile pixel (ty, tx) reads."""
        ph, pw = layer.pad
        return (ty + i + self.dh - ph) * self.hw + tx + k + self.dw - pw


def halo(block: Block, th: int, tw: int) -> Halo:
    cs = _consumers(block)
    dh, dw = max(c.pad[0] for c in cs), max(c.pad[1] for c in cs)
    eh = max(c.kernel[0] - 1 + dh - c.pad[0] for c in cs)
    ew = max(c.kernel[1] - 1 + dw - c.pad[1] for c in cs)
    return Halo(dh, dw, th + eh, tw + ew)


def _rows(block: Block) -> int:
    return sum(c.out_channels for c in _consumers(block)) // 16


def _rtb(block: Block, rtb: int) -> int:
    return _rows(block) if rtb <= 0 else min(rtb, _rows(block))


def smem_bytes(block: Block, th: int, tw: int, rtb: int = 0) -> int:
    c, m, hal = block.in_channels, block.mid_channels, halo(block, th, tw)
    ldc = max(l.kernel[0] * l.kernel[1] * m for l in _consumers(block)) + 8
    return 2 * (hal.hpp * (c + 8) + m * (c + 8) + hal.hpp * (m + 8) + 16 * _rtb(block, rtb) * ldc)


def fitting(block: Block, limit: int) -> list[tuple[int, int, int, int]]:
    """The tilings of :data:`TILINGS` whose shared memory fits ``limit`` bytes, in order (wide layers may fit
    none: the producer's filters and the halo of every input channel are staged whole)."""
    return [t for t in TILINGS if smem_bytes(block, t[0], t[1], t[3]) <= limit]


def name_expr(block: Block, layout: str, th: int, tw: int, nw: int, rtb: int = 0) -> str:
    b = lambda v: "true" if v else "false"  # noqa: E731
    p, c1 = block.layers[0], block.layers[1]
    c2 = block.layers[2] if block.mode == "split" else None

    def cons(c: ConvLayer | None) -> str:
        if c is None:
            return "0,1,1,0,0,false,ACT_NONE"
        return (f"{c.out_channels},{c.kernel[0]},{c.kernel[1]},{c.pad[0]},{c.pad[1]},{b(c.bias)},"
                f"{_ACT_ENUM[c.activation]}")

    return (f"spatial_chain<{block.in_channels},{block.mid_channels},{b(layout == 'NHWC')},{th},{tw},{nw},"
            f"{_rtb(block, rtb)},{b(p.bias)},{_ACT_ENUM[p.activation]},{cons(c1)},{cons(c2)}>")


def launcher(block: Block, dtype: str, layout: str, x_shape: Sequence[int], th: int = TILINGS[0][0],
             tw: int = TILINGS[0][1], nw: int = TILINGS[0][2], rtb: int = TILINGS[0][3]) -> Launch:
    """``launch(x, weights, biases, out, x2=None)`` on CuPy arrays, as :func:`kernels.fused.launcher`'s (``x2`` is
    ignored: no merge here); runs on CuPy's current stream, allocates nothing, capturable in a CUDA graph.
    InputError if the block is not one this kernel runs (:func:`unsupported`) or the tiling is out of range."""
    why = unsupported(block, dtype)
    if why is not None:
        raise InputError(why, "block")
    if layout not in LAYOUTS:
        raise InputError(f"must be one of {LAYOUTS}, got {layout!r}", "layout")
    if not (1 <= th <= 32 and 1 <= tw <= 32 and nw in (1, 2, 4, 8, 16) and rtb >= 0):
        raise InputError(f"expected th, tw in 1..32, nw in 1..16 (a power of two), rtb >= 0; got {th}, {tw}, {nw}, "
                         f"{rtb}", "tiling")
    x_shape = tuple(int(v) for v in x_shape)
    n, h, w = (x_shape[0], x_shape[2], x_shape[3]) if layout == "NCHW" else x_shape[:3]
    want_x = block.x_shape(n, h, w, layout)
    if x_shape != want_x:
        raise InputError(f"expected an input of shape {want_x}, got {x_shape}", "x")
    block.check_plane(h, w)
    _, (oh, ow) = block.planes(h, w)
    if max(block.in_channels * h * w, block.out_channels * oh * ow) >= 2 ** 31:
        raise InputError("a sample of 2**31 elements or more", "x")
    smem = smem_bytes(block, th, tw, rtb)
    limit = smem_limit()
    if smem > limit:
        raise InputError(f"{th}x{tw} tiles need {smem} bytes of shared memory, the device allows {limit}", "tiling")
    kernel = _compile.get_kernel(SOURCE, name_expr(block, layout, th, tw, nw, rtb))
    if smem > 48 << 10:
        kernel.max_dynamic_shared_size_bytes = smem
    y_shape = block.y_shape(n, h, w, layout)
    w_shapes = block.weight_shapes(layout)
    tiles_h, tiles_w = -(-oh // th), -(-ow // tw)
    groups = -(-_rows(block) // _rtb(block, rtb))
    per_x, per_y = block.in_channels * h * w * 2, block.out_channels * oh * ow * 2
    parts = [(n0, min(_MAX_Z, n - n0)) for n0 in range(0, n, _MAX_Z)]
    ints = (np.int32(h), np.int32(w), np.int32(tiles_w))
    nlayers = len(block.layers)

    def launch(x: Any, weights: Sequence[Any], biases: Sequence[Any], out: Any, x2: Any = None) -> None:
        xp = _check(x, "x", want_x, dtype, 16)
        wp, bp = layer_ptrs(block, weights, biases, w_shapes, dtype, [16] * nlayers)
        ptrs = [p for pair in zip(wp, bp) for p in pair] + [0, 0] * (3 - nlayers)
        yp = _check(out, "out", y_shape, dtype)
        for n0, cnt in parts:
            kernel((tiles_h * tiles_w, groups, cnt), (32 * nw,), (xp + n0 * per_x, *ptrs, yp + n0 * per_y, *ints),
                   shared_mem=smem)

    return launch


# ---- the kernel's arithmetic in NumPy -------------------------------------------------------------------------------
def emulate(block: Block, x: np.ndarray, weights: Sequence[np.ndarray], biases: Sequence[np.ndarray | None],
            x2: np.ndarray | None = None, layout: str = "NCHW") -> np.ndarray:
    """What the kernel computes, in NumPy: float32 sums of float16 operands, the intermediate (after its bias and
    activation) rounded to float16 and zero-padded, each consumer's output rounded to float16.  Arrays in
    ``layout``, float16."""
    why = unsupported(block, "float16")
    if why is not None:
        raise InputError(why, "block")
    f32 = lambda a: np.asarray(a, np.float16).astype(np.float32)  # noqa: E731
    xs = f32(x) if layout == "NCHW" else f32(x).transpose(0, 3, 1, 2)     # [n, c, h, w]
    ws = [f32(v) if layout == "NCHW" else f32(v).transpose(0, 3, 1, 2) for v in weights]   # [k, c, r, s]

    def bias(i: int) -> Any:
        return f32(biases[i])[None, :, None, None] if block.layers[i].bias else 0.0

    p = block.layers[0]
    mid = np.einsum("nchw,mc->nmhw", xs, ws[0][:, :, 0, 0]) + bias(0)
    mid = _act(mid, p.activation).astype(np.float16).astype(np.float32)
    outs = []
    for i, c in enumerate(_consumers(block), 1):
        (r, s), (ph, pw) = c.kernel, c.pad
        oh, ow = c.out_plane(*mid.shape[2:])
        padded = np.pad(mid, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
        acc = np.zeros((mid.shape[0], c.out_channels, oh, ow), np.float32)
        for a in range(r):
            for b in range(s):
                acc += np.einsum("nmhw,km->nkhw", padded[:, :, a:a + oh, b:b + ow], ws[i][:, :, a, b])
        outs.append(_act(acc + bias(i), c.activation).astype(np.float16))
    y = np.concatenate(outs, axis=1)
    return np.ascontiguousarray(y.transpose(0, 2, 3, 1)) if layout == "NHWC" else y


__all__ = ["unsupported", "launcher", "emulate", "halo", "Halo", "smem_bytes", "fitting", "TILINGS"]
