"""The depthwise K x K layer's own kernels in ``direct.cu`` (``direct_dw*``; issue 17): launch geometry, launchers and a
CPU emulation of their index math, for the ``direct`` source's ``direct-dw3`` / ``direct-dw5`` / ``direct-dw7``
configurations (7 x 7: ConvNeXt's depthwise layers, stride 1).

Why kernels of its own: a depthwise layer (one filter per channel, MobileNet's, EfficientNet's) is bound by memory
bandwidth; the seed's single-channel block (``kernels/direct.py``) stages a tile for one filter's taps and waits on
it, and cuDNN's zero-workspace backward filter there is slow.  Here a group of lanes walks a band of one plane's rows
with a K-row window in registers, so x and y (dy) move once.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ucudnn.errors import InputError
from ucudnn.problem import ConvProblem

from . import _compile
from .direct import _CTYPE, NT, SOURCE, Launcher, _pow2_at_least, refusal

# ---- depthwise 3x3, 5x5 and 7x7 (direct_dw) ---------------------------------------------------------------------
DW = "direct_dw"
DW_SIZES = (3, 5, 7)          # filter sizes (K x K, padding K / 2) at stride 1: a lane's 4 columns hold K / 2 <= 3
DW_S2_SIZES = (3, 5)          # ... and at stride 2 (backward data and filter)
DW_SEGMENT = 128              # columns a group of 32 lanes covers at a time: 32 lanes x 4
DW_WARPS = NT // 32           # warps per block
DW_ROWS = (4, 8, 16, 32, 0)   # rows of a group's band (0: the whole plane)
DW_MINB = (1, 5)              # the kernel's launch bound: blocks an SM must hold (1: no register cap)
DW_OPS = ("forward", "backward_data", "backward_filter")


def dw_refusal(op: str, problem: ConvProblem) -> str | None:
    """Why :data:`DW` does not run ``op`` on ``problem`` (None: it does): it is the depthwise K x K layer (K in
    :data:`DW_SIZES`), padding K / 2, one filter per channel, in NCHW: at stride 1 all three ops, at stride 2
    (K in :data:`DW_S2_SIZES`) backward data (``direct_dw_s2_bwd``) and backward filter (``direct_dw_s2_bwf``);
    backward filter in float32 only (float atomics sum it)."""
    p = problem
    if op not in DW_OPS:
        return f"unknown op {op!r}"
    why = refusal("forward" if op == "backward_filter" else op, p)
    if why:
        return why
    if op == "backward_filter" and p.dtype != "float32":
        return f"backward filter sums by float atomics: {p.dtype} is not supported (float32)"
    if not (p.groups == p.c == p.k):
        return "not depthwise with one filter per channel"
    if p.r != p.s or p.r not in DW_SIZES or p.stride not in ((1, 1), (2, 2)) or p.pad != (p.r // 2, p.r // 2):
        return "not 3x3, 5x5 or 7x7 at stride 1 or 2 with padding K / 2"
    if p.stride == (2, 2) and p.r not in DW_S2_SIZES:
        return f"{p.r}x{p.r} at stride 2 (stride 2: 3x3 and 5x5 only)"
    if p.stride == (2, 2) and op == "forward":
        return "stride 2: backward data and filter only (cuDNN is near the copy floor on the forward)"
    if p.layout != "NCHW":
        return "NHWC (the single-channel kernel runs it)"
    return None


def dw_width(w: int) -> int:
    """Lanes of a group walking one row: 4 columns a lane, a power of two from 2 up to a warp (wider rows are cut
    into :data:`DW_SEGMENT`-column segments)."""
    return min(32, _pow2_at_least(max(2, -(-w // 4))))


def dw_geometry(problem: ConvProblem, rows: int, op: str = "forward") -> tuple[int, int, int, int, int, int]:
    """(rows per band, bands per plane, segments per row, lanes per group, work items, warps) of a launch of ``op``
    at ``problem.n``: a work item is one (plane, band, segment), 32 / lanes of them a warp.  Rows and columns are
    the plane's at stride 1; at stride 2 dx row pairs and dx columns (backward data), dy rows and columns (backward
    filter)."""
    if rows not in DW_ROWS:
        raise InputError(f"must be one of {DW_ROWS}, got {rows!r}", "rows")
    p = problem
    if p.stride == (2, 2):
        units, cols = ((-(-p.h // 2), p.w) if op == "backward_data" else (p.p, p.q))
    else:
        units, cols = p.h, p.w
    rw = units if rows == 0 else min(rows, units)
    width = dw_width(cols)
    bands, segs = -(-units // rw), -(-cols // (4 * width))
    items = problem.n * problem.c * bands * segs
    return rw, bands, segs, width, items, -(-items // (32 // width))


def dw_launcher(op: str, problem: ConvProblem, rows: int, minb: int = 1) -> Launcher:
    """``launch(a, b, out, alpha, beta)`` of :data:`DW` in cuDNN's operand order (as :func:`launcher`; backward
    filter: x, dy, dw): 16-byte rows (float, W a multiple of 4) when the row operands are 16-byte aligned, else
    element loads; both instances are compiled here, so a launch compiles nothing.  Backward filter is two
    launches: dw = beta * dw, then the sums added atomically (not bitwise reproducible)."""
    why = dw_refusal(op, problem)
    if why:
        raise InputError(f"{DW} cannot run {op} on {problem.describe()}: {why}", "problem")
    if minb not in DW_MINB:
        raise InputError(f"must be one of {DW_MINB}, got {minb!r}", "minb")
    p = problem
    rw, bands, segs, width, items, warps = dw_geometry(p, rows, op)
    rot = "true" if op == "backward_data" else "false"
    vec_ok = p.dtype == "float32" and p.w % 4 == 0

    def kernel_of(vec: bool) -> Any:
        v = "true" if vec else "false"
        if p.stride == (2, 2):
            name = "bwf" if op == "backward_filter" else "bwd"
            return _compile.get_kernel(SOURCE, f"{DW}_s2_{name}<{_CTYPE[p.dtype]},{p.r},{v},{minb}>")
        if op == "backward_filter":
            return _compile.get_kernel(SOURCE, f"{DW}_bwf<float,{p.r},{v},{minb}>")
        return _compile.get_kernel(SOURCE, f"{DW}<{_CTYPE[p.dtype]},{p.r},{rot},{v},{minb}>")

    scalar = kernel_of(False)
    vector = kernel_of(True) if vec_ok else None
    planes = (p.c, p.h, p.w) + ((p.p, p.q) if p.stride == (2, 2) else ())    # the stride-2 kernels take dy's too
    ints = tuple(np.int32(v) for v in planes + (rw, bands, segs, width)) + (np.int64(items),)
    grid, block = (-(-warps // DW_WARPS), 1, 1), (NT, 1, 1)

    if p.stride == (2, 2) and op == "backward_data":      # w, dy, dx; 16-byte dx rows
        calls = (_compile.Call(scalar, vector, ("out",), grid, block, 0, ("a", "b", "out") + ints + ("alpha", "beta")),)
    elif op == "backward_filter":     # x, dy, dw; 16-byte x rows: dw = beta * dw, then the sums added atomically
        taps = np.int32(p.c * p.r * p.s)
        scale = _compile.Call(_compile.get_kernel(SOURCE, f"{DW}_scale<float>"), None, (),
                              (-(-p.c * p.r * p.s // NT), 1, 1), block, 0, ("out", taps, "beta"))
        calls = (scale, _compile.Call(scalar, vector, ("a", "b"), grid, block, 0,
                                      ("a", "b", "out") + ints + ("alpha",)))
    else:
        src, w = ("a", "b") if op == "forward" else ("b", "a")
        calls = (_compile.Call(scalar, vector, (src, "out"), grid, block, 0,
                               (src, w, "out") + ints + ("alpha", "beta")),)
    return _compile.calls_launcher(calls)


def _dw_items(problem: ConvProblem, rows: int, op: str = "forward"):
    """The kernels' work items in launch order, idle groups left out: (n, c, first band unit, units, first column of
    each lane) -- a band's units and the columns as :func:`dw_geometry` has them for ``op``."""
    rw, bands, segs, width, items, warps = dw_geometry(problem, rows, op)
    lanes = np.arange(width)
    for item in range(items):
        seg, rest = item % segs, item // segs
        band, plane = rest % bands, rest // bands
        n, c = divmod(plane, problem.c)
        yield n, c, band * rw, rw, seg * 4 * width + lanes * 4


def _lane_values(plane: np.ndarray, row: int, cols: np.ndarray, count: int) -> np.ndarray:
    """[lanes][count]: what each lane loads of ``row`` from its first column on (zeros outside the plane)."""
    out = np.zeros((len(cols), count))
    if 0 <= row < plane.shape[0]:
        for j in range(count):
            ok = cols + j < plane.shape[1]
            out[ok, j] = plane[row, cols[ok] + j]
    return out


def dw_emulate(op: str, problem: ConvProblem, rows: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``op``'s output computed the way :data:`DW` does -- warps of 32 / lanes groups, each group's work item
    (plane, band, segment) from its index (idle groups past the last item store nothing), each lane's 4 columns,
    the K / 2 neighbour columns on either side by the shuffles' rule within the group (its edge lanes read the
    plane, or the padding), every group walking the band's rows (rows past the plane store nothing), the taps
    rotated for backward data, backward filter's sums per group -- in float64 (NCHW).  The CPU tests compare it with
    the references."""
    p = problem
    if p.stride == (2, 2):
        return _dw_s2_bwf_emulate(p, rows, a, b) if op == "backward_filter" else _dw_s2_emulate(p, rows, a, b)
    k, hk = p.r, p.r // 2
    bwf = op == "backward_filter"
    x, w = (a, b) if op != "backward_data" else (b, a)
    x = np.asarray(x, np.float64)
    if bwf:
        dy, sums = np.asarray(w, np.float64), np.zeros((p.c, k * k))
    else:
        taps = np.asarray(w, np.float64).reshape(p.c, k * k)
        if op == "backward_data":
            taps = taps[:, ::-1]
    out = np.full((p.n, p.c, p.h, p.w), np.nan)

    def window(plane: np.ndarray, row: int, col: np.ndarray) -> np.ndarray:
        """[lanes][4 + 2 * hk]: columns col - hk .. col + 3 + hk of ``row`` as the group assembles them."""
        inrow = 0 <= row < p.h
        raw = _lane_values(plane, row, col, 4)
        v = np.zeros((len(col), 4 + 2 * hk))
        v[:, hk:hk + 4] = raw
        for d in range(1, hk + 1):    # column col - d: the previous lane's 4 - d; col + 3 + d: the next lane's d - 1
            v[1:, hk - d] = raw[:-1, 4 - d]
            v[:-1, hk + 3 + d] = raw[1:, d - 1]
            c0, c1 = col[0] - d, col[-1] + 3 + d
            v[0, hk - d] = plane[row, c0] if inrow and c0 >= 0 and c0 < p.w else 0.0
            v[-1, hk + 3 + d] = plane[row, c1] if inrow and c1 < p.w else 0.0
        return v

    for n, c, p0, rw, col in _dw_items(p, rows):     # idle groups store nothing: not listed
        plane = x[n, c]
        part = np.zeros((len(col), k * k))
        for row in range(p0, p0 + rw):
            if row >= p.h:             # every group walks rw rows; past the plane it stores nothing
                continue
            win = [window(plane, row - hk + i, col) for i in range(k)]
            if bwf:                    # k * k sums a lane: dy's 4 columns against the window
                d = _lane_values(dy[n, c], row, col, 4)
                for i in range(k):
                    for t in range(k):
                        part[:, k * i + t] += (d * win[i][:, t:t + 4]).sum(axis=1)
                continue
            o = np.zeros((len(col), 4))
            for j in range(4):
                for i in range(k):
                    for t in range(k):
                        o[:, j] += taps[c][k * i + t] * win[i][:, j + t]
            for j in range(4):
                ok = col + j < p.w
                out[n, c, row, col[ok] + j] = o[ok, j]
        if bwf:                        # the group's sums (shuffles), added by its first lane
            sums[c] += part.sum(axis=0)
    return sums.reshape(p.c, 1, k, k) if bwf else out


def _dw_s2_emulate(problem: ConvProblem, rows: int, w: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """Stride-2 backward data as ``direct_dw_s2_bwd`` computes it: per work item a band of dx row pairs, a window of
    K/2 + 1 dy rows x K/2 + 2 dy columns a lane (its own 2, the next lane's first, for 5x5 the previous lane's last;
    the group's edge lanes read the plane or the padding), the taps met by parity."""
    p = problem
    k, hk = p.r, p.r // 2
    taps = np.asarray(w, np.float64).reshape(p.c, k, k)
    dyv = np.asarray(dy, np.float64)
    out = np.full((p.n, p.c, p.h, p.w), np.nan)

    def window(plane: np.ndarray, r: int, u: np.ndarray) -> np.ndarray:
        """[lanes][hk + 2]: dy columns u - (hk - 1) .. u + 2 of row r."""
        inrow = 0 <= r < p.p
        raw = _lane_values(plane, r, u, 2)
        nxt = np.zeros(len(u))
        nxt[:-1] = raw[1:, 0]
        nxt[-1] = plane[r, u[-1] + 2] if inrow and u[-1] + 2 < p.q else 0.0
        if hk == 1:
            return np.stack([raw[:, 0], raw[:, 1], nxt], axis=1)
        prv = np.zeros(len(u))
        prv[1:] = raw[:-1, 1]
        prv[0] = plane[r, u[0] - 1] if inrow and u[0] >= 1 and u[0] - 1 < p.q else 0.0
        return np.stack([prv, raw[:, 0], raw[:, 1], nxt], axis=1)

    for n, c, m0, rw, w0 in _dw_items(p, rows, "backward_data"):       # bands of dx row pairs
        u = w0 // 2
        for m in range(m0, m0 + rw):
            win = [window(dyv[n, c], m - hk + 1 + kk, u) for kk in range(hk + 1)]
            for a in range(2):
                h = 2 * m + a
                if h >= p.h:
                    continue
                o = np.zeros((len(w0), 4))
                for j in range(4):
                    for i in range(k):
                        if (a + hk - i) % 2:
                            continue
                        ro = (a + hk - i) // 2 + hk - 1
                        for t in range(k):
                            if (j + hk - t) % 2:
                                continue
                            o[:, j] += taps[c, i, t] * win[ro][:, (j + hk - t) // 2 + hk - 1]
                for j in range(4):
                    ok = w0 + j < p.w
                    out[n, c, h, w0[ok] + j] = o[ok, j]
    return out


def _dw_s2_bwf_emulate(problem: ConvProblem, rows: int, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """Stride-2 backward filter as ``direct_dw_s2_bwf`` sums it: per work item a band of dy rows, 4 dy columns a
    lane, each meeting a window of K x rows by 8 + 2 * (K/2) - 1 x columns (its own 8 from 2q0, the K/2 before them
    from the previous lane, for 5x5 the one after from the next; the group's edge lanes read the plane or the
    padding), the group's sums added per channel."""
    p = problem
    k, hk = p.r, p.r // 2
    xv, dyv = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    sums = np.zeros((p.c, k * k))

    def window(plane: np.ndarray, r: int, c0: np.ndarray) -> np.ndarray:
        """[lanes][7 + 2 * hk]: x columns c0 - hk .. c0 + 6 + hk of row r."""
        inrow = 0 <= r < p.h
        own = _lane_values(plane, r, c0, 8)
        v = np.zeros((len(c0), 7 + 2 * hk))
        v[:, hk:hk + 8] = own
        for d in range(1, hk + 1):   # column c0 - d: the previous lane's 8 - d
            v[1:, hk - d] = own[:-1, 8 - d]
            v[0, hk - d] = plane[r, c0[0] - d] if inrow and c0[0] - d >= 0 and c0[0] - d < p.w else 0.0
        if hk == 2:                  # column c0 + 8: the next lane's first
            v[:-1, hk + 8] = own[1:, 0]
            v[-1, hk + 8] = plane[r, c0[-1] + 8] if inrow and c0[-1] + 8 < p.w else 0.0
        return v

    for n, c, p0, rw, q0 in _dw_items(p, rows, "backward_filter"):
        part = np.zeros((len(q0), k * k))
        for r in range(p0, p0 + rw):
            if r >= p.p:
                continue
            win = [window(xv[n, c], 2 * r - hk + i, 2 * q0) for i in range(k)]
            d = _lane_values(dyv[n, c], r, q0, 4)
            for i in range(k):
                for t in range(k):
                    part[:, k * i + t] += sum(d[:, j] * win[i][:, 2 * j + t] for j in range(4))
        sums[c] += part.sum(axis=0)
    return sums.reshape(p.c, 1, k, k)
