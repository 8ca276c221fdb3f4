"""Space-to-depth folding of a convolution operand (fold.cu), launched on raw device pointers.

Why raw pointers: the fold source (:mod:`ucudnn.sources.fold`) packs and
unpacks the same shapes at every micro-batch of a plan, inside the
workspace; as with the relayout launchers (``ucudnn.kernels.layout.launcher``)
a step's host work is then a few kernel launches, no array objects.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ucudnn.errors import InputError

from . import _compile

SOURCE = "fold.cu"
_CTYPE = {4: "float", 2: "half_t"}
_THREADS = 256
_MAX_Z = 65535  # grid.z walks N


@dataclass(frozen=True)
class FoldGeometry:
    """A plain tensor (per sample: ``c`` channels of ``h`` x ``w``) and the folded one (``c * sh * sw`` channels
    of ``folded_hw``): folded (cf = (i*sw + j)*c + ch, hb, wb) is plain (ch, hb*sh + i - ph, wb*sw + j - pw).
    The plain tensor is in ``layout``, the folded one in ``folded_layout`` (default: the same)."""

    c: int
    h: int
    w: int
    stride: tuple[int, int]
    pad: tuple[int, int]
    folded_hw: tuple[int, int]
    layout: str
    folded_layout: str = ""

    def __post_init__(self) -> None:
        if not self.folded_layout:
            object.__setattr__(self, "folded_layout", self.layout)
        for field in ("layout", "folded_layout"):
            if getattr(self, field) not in ("NCHW", "NHWC"):
                raise InputError(f"must be NCHW or NHWC, got {getattr(self, field)!r}", field)
        if min(self.c, self.h, self.w, *self.stride, *self.folded_hw) < 1 or min(self.pad) < 0:
            raise InputError(f"sizes must be positive and padding non-negative: {self}", "geometry")

    @property
    def cf(self) -> int:
        return self.c * self.stride[0] * self.stride[1]

    def plain_shape(self, n: int) -> tuple[int, int, int, int]:
        return (n, self.c, self.h, self.w) if self.layout == "NCHW" else (n, self.h, self.w, self.c)

    def folded_shape(self, n: int) -> tuple[int, int, int, int]:
        hb, wb = self.folded_hw
        return (n, self.cf, hb, wb) if self.folded_layout == "NCHW" else (n, hb, wb, self.cf)


Pack = Callable[[int, int], None]
Unpack = Callable[[int, int, float, float], None]


def launchers(g: FoldGeometry, n: int, itemsize: int) -> tuple[Pack, Unpack]:
    """``pack(plain, folded)`` and ``unpack(folded, plain, alpha, beta)`` for ``n`` samples of ``g``, on CuPy's
    current stream; the pointers address C-contiguous tensors of ``g.plain_shape(n)`` / ``g.folded_shape(n)``."""
    import numpy as np

    if itemsize not in _CTYPE:
        raise InputError(f"element size {itemsize} bytes is not supported (float32 or float16)", "itemsize")
    if n < 1:
        raise InputError(f"must be positive, got {n}", "n")
    nhwc, folded_nhwc = g.layout == "NHWC", g.folded_layout == "NHWC"
    sh, sw = g.stride
    hb, wb = g.folded_hw
    params = f"{_CTYPE[itemsize]},{g.c},{sh},{sw},{str(nhwc).lower()},{str(folded_nhwc).lower()}"
    i32 = np.int32
    geo = (i32(g.h), i32(g.w), i32(g.pad[0]), i32(g.pad[1]), i32(hb), i32(wb))
    # per-sample elements of the tensor each kernel writes, in its grid's (x extent, y extent)
    pack_xy = ((wb * g.cf, hb) if folded_nhwc else (hb * wb, g.cf))
    unpack_xy = ((g.w * g.c, g.h) if nhwc else (g.h * g.w, g.c))
    plain_bytes = g.c * g.h * g.w * itemsize
    folded_bytes = g.cf * hb * wb * itemsize
    chunks = [(n0, min(_MAX_Z, n - n0)) for n0 in range(0, n, _MAX_Z)]
    kernels: dict[tuple[str, int], object] = {}

    def kernel(name: str):  # per device: a module is loaded on the device that compiled it
        key = (name, _compile.cupy().cuda.runtime.getDevice())
        k = kernels.get(key)
        if k is None:
            k = kernels[key] = _compile.get_kernel(SOURCE, f"{name}<{params}>")
        return k

    def grid(xy: tuple[int, int], z: int) -> tuple[int, int, int]:
        return (-(-xy[0] // _THREADS), xy[1], z)

    def pack(plain: int, folded: int) -> None:
        k = kernel("fold_pack")
        for n0, nz in chunks:
            k(grid(pack_xy, nz), (_THREADS,), (plain + n0 * plain_bytes, folded + n0 * folded_bytes) + geo)

    def unpack(folded: int, plain: int, alpha: float, beta: float) -> None:
        k = kernel("fold_unpack")
        for n0, nz in chunks:
            k(grid(unpack_xy, nz), (_THREADS,),
              (folded + n0 * folded_bytes, plain + n0 * plain_bytes) + geo + (np.float32(alpha), np.float32(beta)))

    return pack, unpack
