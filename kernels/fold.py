"""Space-to-depth folding of a convolution operand (fold.cu), launched on raw device pointers.

Why raw pointers: the fold source (:mod:`ucudnn.measure.sources.fold`) packs and
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
    pack_name, unpack_name = f"fold_pack<{params}>", f"fold_unpack<{params}>"

    def launches(xy: tuple[int, int]) -> list[tuple[tuple[int, int, int], int, int]]:
        """(grid, plain offset, folded offset) per launch: grid.z walks at most _MAX_Z samples."""
        return [((-(-xy[0] // _THREADS), xy[1], min(_MAX_Z, n - n0)), n0 * plain_bytes, n0 * folded_bytes)
                for n0 in range(0, n, _MAX_Z)]

    pack_launches, unpack_launches = launches(pack_xy), launches(unpack_xy)

    def pack(plain: int, folded: int) -> None:
        k = _compile.get_kernel(SOURCE, pack_name)   # cached per device there
        for grid, po, fo in pack_launches:
            k(grid, (_THREADS,), (plain + po, folded + fo) + geo)

    def unpack(folded: int, plain: int, alpha: float, beta: float) -> None:
        k = _compile.get_kernel(SOURCE, unpack_name)
        scalars = (np.float32(alpha), np.float32(beta))
        for grid, po, fo in unpack_launches:
            k(grid, (_THREADS,), (folded + fo, plain + po) + geo + scalars)

    return pack, unpack
