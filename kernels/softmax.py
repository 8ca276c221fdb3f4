"""Fused softmax forward / backward on CuPy arrays (float32, float16), along any axis.

    y  = softmax_forward(x, axis=-1)          # rows: batch x categories
    y  = softmax_forward(x, axis=1)           # over C of an NCHW tensor
    dx = softmax_backward(y, dy, axis=-1)     # dx = y * (dy - sum(y * dy))

A contiguous array viewed along ``axis`` is ``[O][L][I]``; ``I == 1`` is the rows
case (``softmax.cu``'s row kernels), otherwise the inner kernel runs with
``I`` coalesced.  :func:`plan_rows` / :func:`plan_inner` choose the kernel and
its shape (pure Python, tested on the CPU); ``kernel=`` forces one row kernel
("warp", "block", "cluster", "cluster_raw", "cluster_online", "stream") for tests and benchmarks.
"cluster_raw" (forward) keeps the row in registers as loaded and computes each exponential twice;
"cluster_online" (float16 forward) keeps the exponentials as packed halves, taken against each block's
own maximum, and combines the blocks in one cluster exchange.

Numerics: float32 arithmetic for both dtypes (float16 "cluster_online" rounds each exponential, <= 1,
to half once before scaling: within 1.5 ulp of float16, not 0.5); the row maximum is subtracted
before exponentiating, so magnitudes up to float32's range are safe, ``-inf``
entries give exactly 0, a row of length 1 gives 1, and a row of only ``-inf``
gives NaN (as NumPy's formula does).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any

from ucudnn.errors import InputError

from . import _compile

SOURCE = "softmax.cu"
DTYPES = {"float32": "float", "float16": "half_t"}
ROW_KERNELS = ("warp", "block", "cluster", "cluster_raw", "cluster_online", "stream")
WARP_MAX_ELEMS = 32  # row elements per lane held in registers by the warp kernel
BLOCK_MAX_ELEMS = 32  # ... per thread by the block kernel (1024 threads: rows up to 32768)
CLUSTER_MAX_ELEMS = 64  # ... per thread by the cluster kernel (8 x 256 threads: rows up to 131072)
CLUSTER_MAX = 8  # portable cluster size
CLUSTER_NT = 256
# cluster_raw: streaming cache hints (evict-first loads and stores; every byte is touched once).
RAW_STREAM_HINTS = False
# cluster_online: threads per block; the cluster shrinks as blocks grow (the same elements per thread).
# 256 (clusters of 8 at 131072): 97.6% of copy on the H100; 512 (clusters of 4): 96.2%.
ONLINE_NT = 256


@dataclass(frozen=True)
class Launch:
    """One kernel launch: template instantiation, grid and block sizes."""

    kind: str
    name_expr: str
    grid: int
    block: int


def _pow2_ceil(v: int) -> int:
    return 1 << (max(1, v) - 1).bit_length()


def _vector(length: int, itemsize: int, align: int) -> int:
    v = 16 // itemsize
    while v > 1 and (length % v or align % (v * itemsize)):
        v //= 2
    return v


def plan_rows(rows: int, length: int, dtype: str, backward: bool = False, cc: int = 90, align: int = 256,
              kernel: str | None = None) -> Launch:
    """The row kernel for ``rows`` x ``length`` on a device of compute capability ``cc`` (e.g. 90)."""
    t = DTYPES[dtype]
    itemsize = 4 if dtype == "float32" else 2
    v = _vector(length, itemsize, align)
    nvec = length // v
    bwd = "true" if backward else "false"
    if kernel is None:
        if -(-nvec // 32) * v <= WARP_MAX_ELEMS:
            kernel = "warp"
        elif length <= 1024 * BLOCK_MAX_ELEMS:
            kernel = "block"
        elif cc >= 90 and length <= CLUSTER_MAX * CLUSTER_NT * CLUSTER_MAX_ELEMS:
            # float16 forward: exponentials kept as packed halves, one cluster exchange (measured at
            # 1024x131072 on the H100: 97.6% of copy; the raw kernel, the row as loaded and every exponential
            # computed twice, 89%; the plain kernel's float values, 87%).  float32 keeps its values (94% vs 92%).
            kernel = "cluster_online" if itemsize == 2 and not backward else "cluster"
        else:
            kernel = "stream"
    if kernel not in ROW_KERNELS:
        raise InputError(f"unknown row kernel {kernel!r}; use one of {', '.join(ROW_KERNELS)}", "kernel")
    if kernel == "warp":
        lanes = min(32, _pow2_ceil(nvec))
        vpl = -(-nvec // lanes)
        if vpl * v > 2 * WARP_MAX_ELEMS:
            raise InputError(f"rows of {length} are too long for the warp kernel", "kernel")
        nt = 256
        return Launch("warp", f"softmax_rows_warp<{t},{lanes},{vpl},{v},{nt},{bwd}>", -(-rows // (nt // lanes)), nt)
    if kernel == "block":
        nt = min(1024, max(128, _pow2_ceil(-(-length // BLOCK_MAX_ELEMS))))
        vpt = -(-nvec // nt)
        if vpt * v > BLOCK_MAX_ELEMS:
            raise InputError(f"rows of {length} are too long for the block kernel", "kernel")
        return Launch("block", f"softmax_rows_block<{t},{nt},{vpt},{v},{bwd}>", rows, nt)
    if kernel == "cluster_online" and itemsize == 2 and not backward:
        if cc < 90:
            raise InputError("the cluster kernel needs compute capability 9.0 or newer", "kernel")
        cl = max(2, min(CLUSTER_MAX, _pow2_ceil(-(-length // (CLUSTER_NT * BLOCK_MAX_ELEMS)))))
        nt = ONLINE_NT
        cl = max(2, cl * CLUSTER_NT // nt)
        vpt = -(-nvec // (cl * nt))
        if vpt * v > CLUSTER_MAX_ELEMS:
            raise InputError(f"rows of {length} are too long for the cluster kernel", "kernel")
        return Launch(kernel, f"softmax_rows_online<{nt},{vpt},{v},{cl}>", rows * cl, nt)
    if kernel in ("cluster", "cluster_raw", "cluster_online"):  # online: float16 forward only; else cluster
        if cc < 90:
            raise InputError("the cluster kernel needs compute capability 9.0 or newer", "kernel")
        cl = max(2, min(CLUSTER_MAX, _pow2_ceil(-(-length // (CLUSTER_NT * BLOCK_MAX_ELEMS)))))
        vpt = -(-nvec // (cl * CLUSTER_NT))
        if vpt * v > CLUSTER_MAX_ELEMS:
            raise InputError(f"rows of {length} are too long for the cluster kernel", "kernel")
        raw = (f",true,{'true' if RAW_STREAM_HINTS else 'false'}" if kernel == "cluster_raw" and not backward
               else "")
        return Launch(kernel, f"softmax_rows_cluster<{t},{CLUSTER_NT},{vpt},{v},{cl},{bwd}{raw}>", rows * cl,
                      CLUSTER_NT)
    return Launch("stream", f"softmax_rows_stream<{t},1024,{v},{bwd}>", rows, 1024)


def plan_inner(outer: int, length: int, inner: int, dtype: str, backward: bool = False,
               align: int = 256) -> tuple[Launch, int]:
    """The inner-axis kernel for ``[outer][length][inner]`` and its number of tiles along ``inner``."""
    t = DTYPES[dtype]
    itemsize = 4 if dtype == "float32" else 2
    bwd = "true" if backward else "false"
    v = _vector(inner, itemsize, align)
    while True:
        tx = min(32, _pow2_ceil(-(-inner // v)))
        ty = max(1, 256 // tx)
        while ty * 16 < length and tx * ty < 1024:
            ty *= 2
        cpt = -(-length // ty)
        if cpt > 16:
            cpt = 0  # stream: two reads of the column
        if v == 1 or max(cpt, 1) * v <= 32:
            break
        v //= 2  # keep cpt * v values per thread in registers
    tiles = -(-inner // (tx * v))
    return Launch("inner", f"softmax_inner<{t},{tx},{ty},{cpt},{v},{bwd}>", outer * tiles, tx * ty), tiles


def _prepare(x: Any, field: str) -> Any:
    x = _compile.as_cupy(x, field)
    cp = _compile.cupy()
    if str(x.dtype) not in DTYPES:
        raise InputError(f"expected float32 or float16, got {x.dtype}", f"{field}.dtype")
    if x.ndim < 1:
        raise InputError("softmax needs at least one dimension", field)
    return cp.ascontiguousarray(x)


def _axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise InputError(f"axis {axis} is out of range for a {ndim}-D array", "axis")
    return axis % ndim


def _run(a: Any, b: Any, axis: int, out: Any, backward: bool, kernel: str | None) -> Any:
    cp = _compile.cupy()
    import numpy as np

    ax = _axis(axis, a.ndim)
    if out is None:
        out = cp.empty_like(a)
    elif out.shape != a.shape or out.dtype != a.dtype or not out.flags.c_contiguous:
        raise InputError(f"expected a C-contiguous {a.dtype} array of shape {a.shape}", "out")
    if a.size == 0:
        return out
    outer, length, inner = prod(a.shape[:ax]), a.shape[ax], prod(a.shape[ax + 1:])
    if length >= 2**31 or outer * length * inner >= 2**62:
        raise InputError(f"softmax axis of {length} elements is too long", "axis")
    dtype = str(a.dtype)
    bb = b if b is not None else a
    if inner == 1:
        align = min(p & -p if p else 256 for p in (a.data.ptr, bb.data.ptr, out.data.ptr))
        launch = plan_rows(outer, length, dtype, backward, _compile.compute_capability(), align, kernel)
        args = (a, bb, out, np.int64(outer), np.int32(length))
    else:
        if kernel is not None:
            raise InputError("kernel= chooses among the row kernels; this axis is not the last one", "kernel")
        align = min(p & -p if p else 256 for p in (a.data.ptr, bb.data.ptr, out.data.ptr))
        launch, tiles = plan_inner(outer, length, inner, dtype, backward, align)
        args = (a, bb, out, np.int32(length), np.int64(inner), np.int64(tiles))
    _compile.get_kernel(SOURCE, launch.name_expr)((launch.grid,), (launch.block,), args)
    return out


def softmax_forward(x: Any, axis: int = -1, out: Any = None, kernel: str | None = None) -> Any:
    """Softmax of ``x`` along ``axis`` (numerically stable, one pass over memory where the axis fits on chip)."""
    x = _prepare(x, "x")
    return _run(x, None, axis, out, False, kernel)


def softmax_backward(y: Any, dy: Any, axis: int = -1, out: Any = None, kernel: str | None = None) -> Any:
    """Gradient of softmax: ``dx = y * (dy - sum(y * dy, axis))`` from the forward's output ``y``."""
    y = _prepare(y, "y")
    dy = _prepare(dy, "dy")
    if dy.shape != y.shape or dy.dtype != y.dtype:
        raise InputError(f"expected dy of y's shape {y.shape} and dtype {y.dtype}, got {dy.shape} {dy.dtype}", "dy")
    return _run(y, dy, axis, out, True, kernel)
