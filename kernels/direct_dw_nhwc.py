"""The depthwise K x K layer's NHWC kernels in ``direct.cu`` (``direct_dw_nhwc*``): tiles, launchers and a CPU
emulation of their index math, for the ``direct`` source's ``direct-dw3`` / ``-dw5`` / ``-dw7`` rows on channels-last
layers.

Why kernels of their own: channels-last depthwise layers are what autocast models with ``channels_last`` run
(MobileNet, EfficientNet), and what ConvNeXt runs in any precision (its blocks permute to NHWC for LayerNorm and
Linear and back, so its 7x7 depthwise layers see channels-last strides).  cuDNN's float32 NHWC depthwise backward
filter is slow there: on an H200, ConvNeXt-tiny b64 FP32 spends 64 of its 127 ms a training step in it and in its
NHWC -> NCHW transposes, in PyTorch and in ucudnn alike (``benchmarks/results/torch_kernels-convnext_tiny-fp32.md``).
The NCHW kernels (:mod:`.direct_dw`) walk one channel's plane per lane group; in NHWC the channels are contiguous, so
a thread takes 4 channels and a block stages a tile of positions with its halo in shared memory.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ucudnn.errors import InputError
from ucudnn.problem import ConvProblem

from . import _compile
from .direct import _CTYPE, SOURCE, Launcher
from .direct_dw import DW_OPS, DW_SIZES

KERNEL = "direct_dw_nhwc"
#: forward / backward-data tiles (rows TH, column groups TWT, columns a thread CPT, channel quads CQ): a block
#: computes TH x (TWT * CPT) positions of one sample for 4 * CQ channels with CQ * TWT * TH threads
FWD_TILES = ((8, 4, 2, 8), (4, 4, 4, 8))
#: backward-filter tiles (dy rows TH, columns TW, channel quads CQ): CQ * K * TH threads a block
BWF_TILES = ((4, 16, 8), (8, 8, 4))
#: blocks a backward filter's grid holds per SM and channel block at most (each walks its share of the tiles, so
#: its atomic adds are few: one per tap and channel a block)
BWF_BLOCKS_PER_SM = 4


def tiles_of(op: str) -> tuple[tuple[int, ...], ...]:
    """The tiles ``op``'s kernel is instantiated for (each a configuration the source measures)."""
    return BWF_TILES if op == "backward_filter" else FWD_TILES


def refusal(op: str, problem: ConvProblem) -> str | None:
    """Why the NHWC depthwise kernels do not run ``op`` on ``problem`` (None: they do): the depthwise K x K layer (K in
    :data:`~.direct_dw.DW_SIZES`), stride 1, padding K / 2, dilation 1, one filter per channel, NHWC, float32 or
    float16 (float16's backward filter sums in a float workspace: :func:`workspace_bytes`)."""
    p = problem
    if op not in DW_OPS:
        return f"unknown op {op!r}"
    if p.layout != "NHWC":
        return "NCHW (the direct_dw kernels run it)"
    if p.dtype not in _CTYPE:
        return f"dtype {p.dtype}"
    if not (p.groups == p.c == p.k):
        return "not depthwise with one filter per channel"
    if p.r != p.s or p.r not in DW_SIZES or p.stride != (1, 1) or p.pad != (p.r // 2, p.r // 2) \
            or p.dilation != (1, 1):
        return "not 3x3, 5x5 or 7x7 at stride 1 with padding K / 2"
    return None


def workspace_bytes(op: str, problem: ConvProblem) -> int:
    """Workspace ``op`` needs: float16's backward filter adds its sums atomically into C * K * K floats (float
    atomics), written to dw at the end; everything else none."""
    return 4 * problem.c * problem.r * problem.s if op == "backward_filter" and problem.dtype != "float32" else 0


def check_tile(op: str, tile: Any, field: str = "tile") -> tuple[int, ...]:
    """``tile`` as a tuple, one of :func:`tiles_of` ``op`` (the instances the launcher knows), else InputError."""
    t = tuple(tile) if isinstance(tile, (list, tuple)) else None
    if t not in tiles_of(op):
        raise InputError(f"must be one of {[list(x) for x in tiles_of(op)]} for {op}, got {tile!r}", field)
    return t


def geometry(problem: ConvProblem, op: str, tile: tuple[int, ...]) -> dict[str, int]:
    """The launch of ``op`` at ``problem.n`` with ``tile``: positions a tile covers (rows, cols), tiles across a
    plane's columns and over the plane, channel blocks, threads a block, shared-memory bytes; for backward filter
    also the tiles of all samples (``tiles``)."""
    p, k = problem, problem.r
    if op == "backward_filter":
        th, tw, cq = tile
        threads = cq * k * th
        smem = max((th + k - 1) * (tw + k - 1) + th * tw, th * k * k) * cq * 16
    else:
        th, twt, cpt, cq = tile
        tw = twt * cpt
        threads = cq * twt * th
        smem = ((th + k - 1) * (tw + k - 1) + k * k) * cq * 16
    tiles_w = -(-p.w // tw)
    tiles_hw = -(-p.h // th) * tiles_w
    return {"rows": th, "cols": tw, "tiles_w": tiles_w, "tiles_hw": tiles_hw, "tiles": p.n * tiles_hw,
            "cblocks": -(-p.c // (4 * cq)), "threads": threads, "smem": smem, "quads": cq}


def launcher(op: str, problem: ConvProblem, tile: Any) -> Launcher:
    """``launch(a, b, out, alpha, beta)`` in cuDNN's operand order (forward x, w, y; backward data w, dy, dx;
    backward filter x, dy, dw): a channel quad in one load (C a multiple of 4) where the activations are 16-byte
    aligned, else element loads; both instances compiled here.  Backward filter is two launches: dw = beta * dw,
    then the sums added atomically (not bitwise reproducible)."""
    why = refusal(op, problem)
    if why:
        raise InputError(f"{KERNEL} cannot run {op} on {problem.describe()}: {why}", "problem")
    t = check_tile(op, tile)
    return _compile.calls_launcher(tuple(_calls(op, problem, t)))


def _calls(op: str, p: ConvProblem, t: tuple[int, ...]) -> list[_compile.Call]:
    g = geometry(p, op, t)
    vec_ok = p.c % 4 == 0     # a quad's one load: 16 bytes of float, 8 of half (both asked 16-aligned at the base)
    ints = (np.int32(p.c), np.int32(p.h), np.int32(p.w), np.int32(g["tiles_w"]), np.int32(g["tiles_hw"]))
    dims = ",".join(str(v) for v in t)
    block = (g["threads"], 1, 1)
    if op == "backward_filter":
        def kernel_of(vec: bool) -> Any:
            return _compile.get_kernel(SOURCE, f"{KERNEL}_bwf<{_CTYPE[p.dtype]},{p.r},{'true' if vec else 'false'},"
                                               f"{dims}>")

        from .igemm import sm_count

        taps = np.int32(p.c * p.r * p.s)
        blocks = max(1, min(g["tiles"], -(-BWF_BLOCKS_PER_SM * sm_count() // g["cblocks"])))
        one = (-(-int(taps) // 256), 1, 1), (256, 1, 1), 0
        scale = _compile.get_kernel(SOURCE, "direct_dw_scale<float>")
        sums = ("a", "b", "out" if p.dtype == "float32" else "ws") + ints + (np.int64(g["tiles"]), "alpha")
        sums = _compile.Call(kernel_of(False), kernel_of(True) if vec_ok else None, ("a", "b"),
                             (blocks, g["cblocks"], 1), block, g["smem"], sums)
        if p.dtype == "float32":   # dw = beta * dw, then the sums added atomically
            return [_compile.Call(scale, None, (), *one, ("out", taps, "beta")), sums]
        # float16: the sums added atomically into a zeroed float workspace, then dw = sums + beta * dw
        finish = _compile.get_kernel(SOURCE, f"direct_dw_finish<{_CTYPE[p.dtype]}>")
        return [_compile.Call(scale, None, (), *one, ("ws", taps, np.float32(0.0))), sums,
                _compile.Call(finish, None, (), *one, ("ws", "out", taps, "beta"))]

    rot = "true" if op == "backward_data" else "false"

    def kernel_of(vec: bool) -> Any:
        return _compile.get_kernel(SOURCE, f"{KERNEL}<{_CTYPE[p.dtype]},{p.r},{rot},{'true' if vec else 'false'},"
                                           f"{dims}>")

    src, w = ("a", "b") if op == "forward" else ("b", "a")
    return [_compile.Call(kernel_of(False), kernel_of(True) if vec_ok else None, (src, "out"),
                          (p.n * g["tiles_hw"], g["cblocks"], 1), block, g["smem"],
                          (src, w, "out") + ints + ("alpha", "beta"))]


def emulate(op: str, problem: ConvProblem, tile: Any, a: np.ndarray, b: np.ndarray,
            blocks: int | None = None) -> np.ndarray:
    """``op``'s output computed the way the NHWC kernels do, in float64, operands NHWC (``w`` / ``dw`` [C][K][K][1])
    -- every block (sample, tile, channel block) staging its tile with the halo (zeros outside the plane and past C),
    every thread's CPT columns of one row for its 4 channels with the taps rotated for backward data, stores only
    inside the plane; backward filter: ``blocks`` blocks (default: all tiles, one each) walking their share of all
    samples' tiles, each thread's K sums for its (quad, tap row, dy row), summed over the block's rows, added per
    channel.  The CPU tests compare it with the references."""
    t = check_tile(op, tile)
    p, k = problem, problem.r
    hk = k // 2
    g = geometry(p, op, t)
    cq = g["quads"]
    cpad = g["cblocks"] * 4 * cq

    def staged(plane: np.ndarray, rows: int, cols: int, h0: int, w0: int) -> np.ndarray:
        """[rows][cols][cpad]: plane[h0 + r][w0 + c][:] where inside, zeros elsewhere (and past C)."""
        out = np.zeros((rows, cols, cpad))
        for r in range(rows):
            for c in range(cols):
                h, w = h0 + r, w0 + c
                if 0 <= h < p.h and 0 <= w < p.w:
                    out[r, c, :p.c] = plane[h, w]
        return out

    if op == "backward_filter":
        th, tw, _ = t
        x, dy = np.asarray(a, np.float64), np.asarray(b, np.float64)
        sums = np.zeros((cpad, k, k))
        nblocks = g["tiles"] if blocks is None else blocks
        for blk in range(nblocks):
            part = np.zeros((th, cpad, k, k))       # each dy row's threads' sums, met in shared memory
            for tile_ in range(blk, g["tiles"], nblocks):
                n, tt = divmod(tile_, g["tiles_hw"])
                h0, w0 = (tt // g["tiles_w"]) * th, (tt % g["tiles_w"]) * tw
                xt = staged(x[n], th + k - 1, tw + k - 1, h0 - hk, w0 - hk)
                gt = staged(dy[n], th, tw, h0, w0)
                for r in range(th):
                    for i in range(k):
                        for col in range(tw):
                            part[r, :, i, :] += gt[r, col][:, None] * xt[r + i, col:col + k].T
            sums += part.sum(axis=0)
        return sums[:p.c].reshape(p.c, k, k, 1)

    th, twt, cpt, _ = t
    tw = twt * cpt
    src, w = (a, b) if op == "forward" else (b, a)
    src = np.asarray(src, np.float64)
    taps = np.zeros((cpad, k, k))
    taps[:p.c] = np.asarray(w, np.float64).reshape(p.c, k, k)
    if op == "backward_data":
        taps = taps[:, ::-1, ::-1]
    out = np.full((p.n, p.h, p.w, p.c), np.nan)
    for n in range(p.n):
        for tt in range(g["tiles_hw"]):
            h0, w0 = (tt // g["tiles_w"]) * th, (tt % g["tiles_w"]) * tw
            xt = staged(src[n], th + k - 1, tw + k - 1, h0 - hk, w0 - hk)
            for r in range(th):
                if h0 + r >= p.h:
                    continue
                for gcol in range(twt):
                    acc = np.zeros((cpt, cpad))
                    for i in range(k):
                        for u in range(cpt + k - 1):
                            xv = xt[r + i, gcol * cpt + u]
                            for o in range(cpt):
                                if 0 <= u - o < k:
                                    acc[o] += taps[:, i, u - o] * xv
                    for o in range(cpt):
                        col = w0 + gcol * cpt + o
                        if col >= p.w:
                            break
                        out[n, h0 + r, col] = acc[o, :p.c]
    return out
