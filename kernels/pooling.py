"""2-D max / average pooling, forward and backward, on CuPy arrays in NCHW or CHWN.

    y = pool2d_forward(x, window=3, stride=2, pad=0, mode="max", layout="CHWN")
    y, idx = pool2d_forward(x, 3, 2, 0, return_indices=True)
    dx = pool2d_backward(dy, x, 3, 2, 0, mode="max", indices=idx)   # or recompute: indices=None

``x`` is ``(N, C, H, W)`` for NCHW and ``(C, H, W, N)`` for CHWN; the output
keeps the layout with ``P = (H + 2 pad - window) // stride + 1`` (cuDNN's
floor rule).  ``mode="avg"`` divides by the window size when
``count_include_pad`` (cuDNN's AVERAGE_COUNT_INCLUDE_PADDING) and by the
in-bounds count otherwise.  Max indices are int32 ``h * W + w`` within the
(n, c) plane; ties go to the first maximum in row-major window order.

Each forward thread computes OP x OQ outputs (thread coarsening).  The
factors come from ``coarsening=`` if given, else from the tuning cache for
this shape and device, else -- with ``tune=True``, the default -- from a
hill-climbing search run on this call's own input (autotune.py) and cached.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ucudnn.errors import InputError

from . import _compile, autotune

SOURCE = "pooling.cu"
DTYPES = {"float32": "float", "float16": "half_t"}
LAYOUTS = ("NCHW", "CHWN")
MODES = ("max", "avg")
NT = 256
# Input elements an NCHW block stages (24 KiB of float32): several blocks per SM keep loads in flight
# while others compute, and each block's compute phase stays short.
SMEM_BUDGET_ELEMS = 6144
SMEM_LIMIT = 48 * 1024
COARSEN_LIMITS = ((1, 4), (1, 4))


def _pair(v: Any, field: str) -> tuple[int, int]:
    t = (v, v) if isinstance(v, int) else tuple(v)
    if len(t) != 2 or not all(isinstance(i, int) for i in t):
        raise InputError(f"expected an int or a pair of ints, got {v!r}", field)
    return t  # type: ignore[return-value]


@dataclass(frozen=True)
class Pool2d:
    """Geometry of one pooling problem (sizes in NCHW terms whatever the layout)."""

    layout: str
    n: int
    c: int
    h: int
    w: int
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int

    @property
    def p(self) -> int:
        return (self.h + 2 * self.ph - self.kh) // self.sh + 1

    @property
    def q(self) -> int:
        return (self.w + 2 * self.pw - self.kw) // self.sw + 1

    def in_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.c, self.h, self.w) if self.layout == "NCHW" else (self.c, self.h, self.w, self.n)

    def out_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.c, self.p, self.q) if self.layout == "NCHW" else (self.c, self.p, self.q, self.n)


def geometry(shape: tuple[int, ...], window: Any, stride: Any, pad: Any, layout: str) -> Pool2d:
    """Validated :class:`Pool2d` for an input of ``shape`` in ``layout``."""
    if layout not in LAYOUTS:
        raise InputError(f"unknown layout {layout!r}; use one of {', '.join(LAYOUTS)}", "layout")
    if len(shape) != 4:
        raise InputError(f"expected a 4-D array in {layout} order, got shape {tuple(shape)}", "x")
    (kh, kw), (sh, sw), (ph, pw) = _pair(window, "window"), _pair(stride, "stride"), _pair(pad, "pad")
    if kh < 1 or kw < 1:
        raise InputError(f"window must be positive, got {(kh, kw)}", "window")
    if sh < 1 or sw < 1:
        raise InputError(f"stride must be positive, got {(sh, sw)}", "stride")
    if not (0 <= ph < kh and 0 <= pw < kw):
        raise InputError(f"pad must be in [0, window), got {(ph, pw)} for window {(kh, kw)}", "pad")
    n, c, h, w = shape if layout == "NCHW" else (shape[3], shape[0], shape[1], shape[2])
    g = Pool2d(layout, n, c, h, w, kh, kw, sh, sw, ph, pw)
    if g.p < 1 or g.q < 1:
        raise InputError(f"window {(kh, kw)} with pad {(ph, pw)} does not fit the input {h}x{w}", "window")
    if max(g.n * g.c * g.h * g.w, g.n * g.c * g.p * g.q) >= 2**31:
        raise InputError("tensors of 2**31 elements or more are not supported", "x")
    return g


def _vector(extent: int, itemsize: int, align: int) -> int:
    v = 16 // itemsize
    while v > 1 and (extent % v or align % (v * itemsize)):
        v //= 2
    return v


@dataclass(frozen=True)
class PoolLaunch:
    name_expr: str
    grid: int
    smem: int
    args: tuple  # launch-shape integers after (x, y, idx)


def plan_forward(g: Pool2d, dtype: str, mode: str, include_pad: bool, with_indices: bool,
                 coarsening: tuple[int, int], align: int = 256) -> PoolLaunch:
    """Kernel instantiation, grid, dynamic shared memory and integer arguments of one forward launch."""
    t = DTYPES[dtype]
    itemsize = 4 if dtype == "float32" else 2
    op, oq = coarsening
    m = 0 if mode == "max" else (1 if include_pad else 2)
    idx = "true" if with_indices and m == 0 else "false"
    head = f"{t},{g.kh},{g.kw},{g.sh},{g.sw},{op},{oq},{m},{idx}"
    if g.layout == "CHWN":
        v = _vector(g.n, itemsize, align)
        mtp, mtq = -(-g.p // op), -(-g.q // oq)
        threads = g.c * mtp * mtq * (g.n // v)
        return PoolLaunch(f"pool_chwn_fwd<{head},{v},{NT}>", -(-threads // NT), 0,
                          (g.c, g.h, g.w, g.n, g.p, g.q, g.ph, g.pw, mtp, mtq))
    v = _vector(16 // itemsize, itemsize, align)  # the kernel aligns its chunk itself: only the pointer matters
    planes = g.n * g.c
    plane_bytes = g.h * g.w * itemsize
    budget = SMEM_BUDGET_ELEMS * itemsize
    if plane_bytes <= budget:
        groups = max(1, min(budget // plane_bytes, planes // 1024))  # keep >= ~1024 blocks where possible
        bp, bands = g.p, 1
        smem = groups * plane_bytes
    else:
        groups = 1
        rows = budget // (g.w * itemsize)
        bp = max(1, (rows - g.kh) // g.sh + 1)
        bands = -(-g.p // bp)
        if bands == 1:
            bp, bands = g.p, 1
        smem = (g.h if bands == 1 else min(g.h, (bp - 1) * g.sh + g.kh)) * g.w * itemsize
        if smem + 16 > SMEM_LIMIT:
            raise InputError(f"rows of {g.w} elements are too wide for the NCHW pooling kernel", "x")
    grid = -(-planes // groups) * bands
    smem += v * itemsize  # room for the alignment shift
    return PoolLaunch(f"pool_nchw_fwd<{head},{v},{NT}>", grid, smem,
                      (g.h, g.w, g.p, g.q, g.ph, g.pw, groups, bp, bands, planes))


def tuning_key(g: Pool2d, dtype: str, mode: str, include_pad: bool, with_indices: bool) -> str:
    return (f"pool2d_forward {g.layout} {dtype} n{g.n} c{g.c} h{g.h} w{g.w} k{g.kh}x{g.kw} s{g.sh}x{g.sw} "
            f"p{g.ph}x{g.pw} {mode}{'' if mode == 'max' else ('+pad' if include_pad else '-pad')}"
            f"{' idx' if with_indices and mode == 'max' else ''}")


def _launch(cp: Any, launch: PoolLaunch, x: Any, y: Any, idx: Any) -> None:
    import numpy as np

    kernel = _compile.get_kernel(SOURCE, launch.name_expr)
    ints = tuple(np.int32(a) for a in launch.args)
    kernel((launch.grid,), (NT,), (x, y, idx if idx is not None else np.uint64(0)) + ints, shared_mem=launch.smem)


def _coarsening(cp: Any, g: Pool2d, x: Any, y: Any, idx: Any, dtype: str, mode: str, include_pad: bool,
                align: int, tune: bool) -> tuple[int, int]:
    with_indices = idx is not None
    key = tuning_key(g, dtype, mode, include_pad, with_indices)
    device = _compile.device_key()
    cached = autotune.lookup(device, key)
    if cached is not None:
        return tuple(cached["choice"])  # type: ignore[return-value]
    if not tune:
        return (1, 1)
    from ucudnn.timing import time_ms

    def measure(f: tuple[int, ...]) -> float:
        plan = plan_forward(g, dtype, mode, include_pad, with_indices, f, align)  # type: ignore[arg-type]
        return time_ms(lambda: _launch(cp, plan, x, y, idx), repeat=7, warmup=2)

    choice, times = autotune.hill_climb(measure, (1, 1), COARSEN_LIMITS)
    autotune.record(device, key, choice, times)
    return choice  # type: ignore[return-value]


def pool2d_forward(x: Any, window: Any, stride: Any = None, pad: Any = 0, mode: str = "max", layout: str = "NCHW",
                   count_include_pad: bool = True, return_indices: bool = False, out: Any = None,
                   coarsening: tuple[int, int] | None = None, tune: bool = True) -> Any:
    """Pooled ``x``; with ``return_indices`` (max only) also the int32 argmax of every output."""
    if mode not in MODES:
        raise InputError(f"unknown mode {mode!r}; use one of {', '.join(MODES)}", "mode")
    if return_indices and mode != "max":
        raise InputError("indices exist for max pooling only", "return_indices")
    x = _compile.as_cupy(x, "x")
    cp = _compile.cupy()
    dtype = str(x.dtype)
    if dtype not in DTYPES:
        raise InputError(f"expected float32 or float16, got {dtype}", "x.dtype")
    g = geometry(tuple(x.shape), window, window if stride is None else stride, pad, layout)
    if coarsening is not None:
        coarsening = _pair(coarsening, "coarsening")
        lo, hi = COARSEN_LIMITS[0]
        if not all(lo <= f <= hi for f in coarsening):
            raise InputError(f"coarsening factors must be in [{lo}, {hi}], got {coarsening}", "coarsening")
    x = cp.ascontiguousarray(x)
    if out is None:
        out = cp.empty(g.out_shape(), dtype=x.dtype)
    elif tuple(out.shape) != g.out_shape() or out.dtype != x.dtype or not out.flags.c_contiguous:
        raise InputError(f"expected a C-contiguous {x.dtype} array of shape {g.out_shape()}", "out")
    idx = cp.empty(g.out_shape(), dtype=cp.int32) if return_indices else None
    align = min(p & -p if p else 256 for p in (x.data.ptr, out.data.ptr))
    if coarsening is None:
        coarsening = _coarsening(cp, g, x, out, idx, dtype, mode, count_include_pad, align, tune)
    _launch(cp, plan_forward(g, dtype, mode, count_include_pad, return_indices, coarsening, align), x, out, idx)
    return (out, idx) if return_indices else out


def pool2d_backward(dy: Any, x: Any, window: Any, stride: Any = None, pad: Any = 0, mode: str = "max",
                    layout: str = "NCHW", indices: Any = None, count_include_pad: bool = True, out: Any = None) -> Any:
    """Gradient with respect to ``x``; for max from ``indices`` if given, else recomputed from ``x``."""
    import numpy as np

    if mode not in MODES:
        raise InputError(f"unknown mode {mode!r}; use one of {', '.join(MODES)}", "mode")
    x = _compile.as_cupy(x, "x")
    dy = _compile.as_cupy(dy, "dy")
    cp = _compile.cupy()
    dtype = str(x.dtype)
    if dtype not in DTYPES:
        raise InputError(f"expected float32 or float16, got {dtype}", "x.dtype")
    g = geometry(tuple(x.shape), window, window if stride is None else stride, pad, layout)
    if tuple(dy.shape) != g.out_shape() or str(dy.dtype) != dtype:
        raise InputError(f"expected dy of shape {g.out_shape()} and dtype {dtype}, got {dy.shape} {dy.dtype}", "dy")
    if indices is not None:
        if mode != "max":
            raise InputError("indices apply to max pooling only", "indices")
        if tuple(indices.shape) != g.out_shape() or str(indices.dtype) != "int32":
            raise InputError(f"expected int32 indices of shape {g.out_shape()}", "indices")
        indices = cp.ascontiguousarray(indices)
    x = cp.ascontiguousarray(x)
    dy = cp.ascontiguousarray(dy)
    if out is None:
        out = cp.empty(x.shape, dtype=x.dtype)
    elif tuple(out.shape) != tuple(x.shape) or out.dtype != x.dtype or not out.flags.c_contiguous:
        raise InputError(f"expected a C-contiguous {x.dtype} array of shape {x.shape}", "out")
    m = 0 if mode == "max" else (1 if count_include_pad else 2)
    src = 0 if indices is not None or m != 0 else 1
    name = f"pool_bwd<{DTYPES[dtype]},{g.kh},{g.kw},{g.sh},{g.sw},{m},{src},{'true' if layout == 'CHWN' else 'false'}>"
    total = x.size
    i32 = np.int32
    _compile.get_kernel(SOURCE, name)((-(-total // 256),), (256,), (
        dy, indices if indices is not None else np.uint64(0), x, out, i32(total), i32(g.h), i32(g.w), i32(g.n),
        i32(g.p), i32(g.q), i32(g.ph), i32(g.pw)))
    return out
