"""Direct convolution without workspace (seed 001; direct.cu): tilings, launch geometry, launchers, the per-device
tile tuner, and float64 NumPy references for the ``direct`` algorithm source (issue 17).

Why a direct convolution at all: it needs no workspace, so under tight limits it competes where cuDNN is left
with its slow zero-workspace algorithms, and on single-channel layers (C/G == 1: grayscale and spectrogram first
layers, depthwise convolutions) an implicit GEMM has a reduction of only R*S and runs far from peak, while a
direct kernel is bound by writing y.

A kernel launch is fixed by the op, the problem at a micro-batch and a :class:`Tiling`; :func:`plan` turns them
into a :class:`LaunchGeometry` (template instantiation, grid, shared memory, scalar arguments).  The index math
the kernels do per block (which input rows and columns a tile stages, which dy rows a dx tile needs) is mirrored
here (:func:`forward_window`, :func:`backward_window`, :func:`tile_origin`) and exercised on the CPU by
:func:`emulate`, which computes a convolution block by block exactly as the kernels stage it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ucudnn.errors import InputError
from ucudnn.problem import DTYPE_BYTES, ConvProblem

from . import _compile, autotune
from .reference import conv2d_nchw

SOURCE = "direct.cu"
NT = 256                      # threads per block (DIRECT_NT)
_CTYPE = {"float32": "float", "float16": "half_t"}
_MAX_Z = 65535                # grid.z walks N; more samples are split across launches
_MAX_Y = 65535
DEFAULT_SMEM = 48 << 10       # what any block may use without opting in (and the CPU's assumption)
OPS = ("forward", "backward_data")
#: tuning coordinates: (tx index, log2 rb, log2 kt, log2 chunk); values per index
TX_VALUES = (8, 16, 32)
RB_VALUES = (1, 2, 4)
KT_VALUES = (1, 2, 4, 8)
CHUNK_VALUES = (1, 2, 4, 8, 16)
TUNE_MAX_TRIALS = 14          # candidates compiled and timed per tuning before the climb is cut short
TUNE_FINALISTS, TUNE_ROUNDS = 3, 2
AXES = (TX_VALUES, RB_VALUES, KT_VALUES, CHUNK_VALUES)   # the tuning grid, in Tiling's field order


@dataclass(frozen=True)
class Tiling:
    """One kernel's tile parameters (template arguments).

    ``tx``: threads along the output row (the block is ``tx`` x ``256 / tx``); ``rb``: output rows per thread;
    ``kt``: channels per thread (forward: output filters; backward data: dx channels); ``chunk``: single-channel
    forward -- rounds of ``kt`` filters a block applies to its staged tile (``KL``), others -- channels staged per
    prefetch step (``CC``)."""

    tx: int
    rb: int
    kt: int
    chunk: int

    def __post_init__(self) -> None:
        for name, allowed in (("tx", TX_VALUES), ("rb", RB_VALUES), ("kt", KT_VALUES), ("chunk", CHUNK_VALUES)):
            v = getattr(self, name)
            if v not in allowed:
                raise InputError(f"must be one of {allowed}, got {v!r}", f"tiling.{name}")

    @property
    def ty(self) -> int:
        return NT // self.tx

    @property
    def rows(self) -> int:
        """Output rows of a block's tile."""
        return self.ty * self.rb

    def as_list(self) -> list[int]:
        return [self.tx, self.rb, self.kt, self.chunk]

    @classmethod
    def from_list(cls, v: Any) -> "Tiling":
        if not isinstance(v, (list, tuple)) or len(v) != 4 or not all(isinstance(i, int) for i in v):
            raise InputError(f"expected [tx, rb, kt, chunk], got {v!r}", "tiling")
        return cls(*v)

    def coordinates(self) -> tuple[int, int, int, int]:
        return (TX_VALUES.index(self.tx), RB_VALUES.index(self.rb), KT_VALUES.index(self.kt),
                CHUNK_VALUES.index(self.chunk))

    @classmethod
    def at(cls, coords: tuple[int, ...]) -> "Tiling | None":
        """The tiling at tuning coordinates, or None outside the grid."""
        values = autotune.grid_point(AXES, coords)
        return None if values is None else cls(*values)


# ---- what runs -----------------------------------------------------------------------------------------------
def family(problem: ConvProblem) -> str:
    """``single`` (one input channel per group) or ``multi``."""
    return "single" if problem.c // problem.groups == 1 else "multi"


def kernel_name(op: str, problem: ConvProblem) -> str:
    """Which of direct.cu's kernels runs ``op`` on ``problem``."""
    if op == "backward_data":
        return "direct_bwd"
    return "direct_fwd_single" if family(problem) == "single" else "direct_fwd_multi"


def refusal(op: str, problem: ConvProblem) -> str | None:
    """Why the direct kernels do not run ``op`` on ``problem`` (None: they do)."""
    if op == "backward_filter":
        return "no backward-filter kernel"
    if op not in OPS:
        return f"unknown op {op!r}"
    if problem.dtype not in _CTYPE:
        return f"{problem.dtype} is not supported (float32, float16)"
    if problem.dilation != (1, 1):
        return f"dilation {list(problem.dilation)} is not supported (1 only)"
    if problem.groups * max(problem.k // problem.groups, problem.c // problem.groups) > _MAX_Y:
        return "too many channel blocks for one grid"
    return None


def uses_async(op: str, problem: ConvProblem, compute_capability: int) -> bool:
    """cp.async prefetching: the multi-stage kernels (not the single-channel forward), float, sm_80+."""
    return (compute_capability >= 80 and problem.dtype == "float32"
            and kernel_name(op, problem) != "direct_fwd_single")


# ---- index math mirrored from direct.cu --------------------------------------------------------------------------
def tiles(op: str, problem: ConvProblem, t: Tiling) -> tuple[int, int]:
    """(tile rows, tile columns) of the plane a block tiles: y's (forward) or dx's (backward data)."""
    rows, cols = (problem.p, problem.q) if op == "forward" else (problem.h, problem.w)
    return -(-rows // t.rows), -(-cols // t.tx)


def tile_origin(block_x: int, op: str, problem: ConvProblem, t: Tiling) -> tuple[int, int]:
    """(first row, first column) of block ``block_x``'s tile (tile_origin in direct.cu)."""
    _, tq = tiles(op, problem, t)
    return (block_x // tq) * t.rows, (block_x % tq) * t.tx


def forward_window(p0: int, q0: int, problem: ConvProblem, t: Tiling) -> tuple[int, int, int, int]:
    """(first input row, first input column, rows, columns) a forward tile at (p0, q0) stages (may reach into the
    padding: negative or past the input, staged as zeros)."""
    (sh, sw), (ph, pw) = problem.stride, problem.pad
    return p0 * sh - ph, q0 * sw - pw, (t.rows - 1) * sh + problem.r, (t.tx - 1) * sw + problem.s


def backward_window(h0: int, w0: int, problem: ConvProblem, t: Tiling) -> tuple[int, int, int, int]:
    """(first dy row, first dy column, rows, columns) a dx tile at (h0, w0) stages: the dy entries whose windows
    reach the tile, ``ceil((h0 + ph - r + 1) / sh)`` on, at most ``floor((rows + r - 2) / sh) + 1`` of them."""
    (sh, sw), (ph, pw) = problem.stride, problem.pad
    plo = -((problem.r - 1 - h0 - ph) // sh)
    qlo = -((problem.s - 1 - w0 - pw) // sw)
    return plo, qlo, (t.rows + problem.r - 2) // sh + 1, (t.tx + problem.s - 2) // sw + 1


def walked_owned(op: str, problem: ConvProblem) -> tuple[int, int]:
    """(channels a block walks through, channels it owns) per group: forward (C/G, K/G), backward (K/G, C/G)."""
    cg, kg = problem.c // problem.groups, problem.k // problem.groups
    return (cg, kg) if op == "forward" else (kg, cg)


def smem_floats(op: str, problem: ConvProblem, t: Tiling) -> int:
    """Shared memory of one block, in floats (both buffers for the prefetching kernels)."""
    rs = problem.r * problem.s
    if kernel_name(op, problem) == "direct_fwd_single":   # the taps start at the next multiple of 4 floats
        _, _, ih, iw = forward_window(0, 0, problem, t)
        return -(-ih * iw // 4) * 4 + t.kt * t.chunk * rs
    _, _, ah, aw = (forward_window if op == "forward" else backward_window)(0, 0, problem, t)
    return 2 * (t.chunk * ah * aw + t.chunk * rs * t.kt)


@dataclass(frozen=True)
class LaunchGeometry:
    """Everything one launch of a tiling needs but the pointers and scalars."""

    name_expr: str
    grid: tuple[int, int, int]     # grid.z: samples (the launcher splits beyond _MAX_Z)
    smem_bytes: int
    ints: tuple[int, ...]           # the kernel's int arguments after the three pointers
    a_sample: int                   # elements per sample of the operands that advance with N (0: w)
    b_sample: int
    out_sample: int


def plan(op: str, problem: ConvProblem, t: Tiling, async_copy: bool = False) -> LaunchGeometry:
    """The launch of ``op`` on ``problem`` (at its ``n``) with tiling ``t``; ``async_copy``: cp.async staging."""
    why = refusal(op, problem)
    if why:
        raise InputError(f"direct cannot run {op} on {problem.describe()}: {why}", "problem")
    p = problem
    name = kernel_name(op, p)
    if async_copy and (p.dtype != "float32" or name == "direct_fwd_single"):
        raise InputError("cp.async staging is for the float multi-stage kernels", "async_copy")
    kg = p.k // p.groups
    tp, tq = tiles(op, p, t)
    nhwc = "true" if p.layout == "NHWC" else "false"
    geo = (p.c, p.h, p.w, p.k, p.p, p.q, p.r, p.s, p.pad[0], p.pad[1], p.stride[0], p.stride[1])
    x_s, y_s = p.c * p.h * p.w, p.k * p.p * p.q
    if name == "direct_fwd_single":
        _, _, ih, iw = forward_window(0, 0, p, t)
        expr = f"{name}<{_CTYPE[p.dtype]},{nhwc},{t.tx},{t.rb},{t.kt},{t.chunk}>"
        grid_y = p.groups * -(-kg // (t.kt * t.chunk))
        ints = geo + (kg, ih, iw)
        samples = (x_s, 0, y_s)
    else:
        walked, owned = walked_owned(op, p)
        _, _, ah, aw = (forward_window if op == "forward" else backward_window)(0, 0, p, t)
        expr = f"{name}<{_CTYPE[p.dtype]},{nhwc},{t.tx},{t.rb},{t.kt},{t.chunk},{'true' if async_copy else 'false'}>"
        grid_y = p.groups * -(-owned // t.kt)
        ints = geo + (p.groups, ah, aw)
        samples = (x_s, 0, y_s) if op == "forward" else (0, y_s, x_s)
    return LaunchGeometry(expr, (tp * tq, grid_y, p.n), 4 * smem_floats(op, p, t), ints, *samples)


def fits(op: str, problem: ConvProblem, t: Tiling, smem_limit: int = DEFAULT_SMEM) -> bool:
    """True iff the tiling's shared memory fits ``smem_limit`` bytes."""
    return 4 * smem_floats(op, problem, t) <= smem_limit


def _pow2_at_least(v: int) -> int:
    return 1 << max(0, (v - 1).bit_length())


def useful(op: str, problem: ConvProblem, t: Tiling) -> bool:
    """False for tilings that only waste threads or registers on this shape: a tile or channel block more than
    twice what the problem has (the tuner skips them; they would still run correctly)."""
    walked, owned = walked_owned(op, problem)
    rows, cols = (problem.p, problem.q) if op == "forward" else (problem.h, problem.w)
    if t.tx > max(8, _pow2_at_least(cols)) or (t.rb > 1 and t.rows > _pow2_at_least(rows)):
        return False
    if kernel_name(op, problem) == "direct_fwd_single":
        return t.kt <= _pow2_at_least(owned) and t.kt * t.chunk <= _pow2_at_least(owned)
    return t.kt <= _pow2_at_least(owned) and t.chunk <= _pow2_at_least(walked)


def default_tiling(op: str, problem: ConvProblem, smem_limit: int = DEFAULT_SMEM) -> Tiling:
    """A tiling without tuning: the widest row tile the output needs, 2 rows and up to 8 (single forward) or 4
    channels per thread, shrunk until it fits ``smem_limit``.  Always returns a tiling that fits (the smallest
    one uses a few KiB for any filter up to 32x32 at stride 4)."""
    walked, owned = walked_owned(op, problem)
    cols = problem.q if op == "forward" else problem.w
    tx = 32 if cols >= 24 else 16 if cols >= 12 else 8
    single = kernel_name(op, problem) == "direct_fwd_single"
    kt = min(8 if single else 4, _pow2_at_least(owned))
    chunk = min(8, _pow2_at_least(-(-owned // kt))) if single else min(4, _pow2_at_least(walked))
    order = [Tiling(tx, rb, kt, c) for rb in (2, 1) for c in sorted({chunk, max(1, chunk // 2), 1}, reverse=True)]
    order += [Tiling(x, 1, k, 1) for x in TX_VALUES[::-1] for k in (kt, 1)]
    for cand in order:
        if fits(op, problem, cand, smem_limit):
            return cand
    raise InputError(f"no direct tiling fits {smem_limit} bytes of shared memory for {problem.describe()}",
                     "problem")


# ---- launching ---------------------------------------------------------------------------------------------------
Launcher = Callable[[int, int, int, float, float], None]


def smem_limit() -> int:
    """Shared memory one block of the current device may use once it opts in."""
    cp = _compile.cupy()
    return int(cp.cuda.runtime.deviceGetAttribute(97, cp.cuda.Device().id))  # MaxSharedMemoryPerBlockOptin


def launcher(op: str, problem: ConvProblem, t: Tiling, async_copy: bool = False) -> Launcher:
    """``launch(a, b, out, alpha, beta)`` on raw pointers in cuDNN's operand order (forward: x, w, y; backward data:
    w, dy, dx), on CuPy's current stream: out = alpha * op(a, b) + beta * out.  The kernel is compiled (or found)
    here, so launching allocates nothing, compiles nothing and never synchronises (CUDA-graph capturable)."""
    geo = plan(op, problem, t, async_copy)
    kernel = _compile.get_kernel(SOURCE, geo.name_expr)
    if geo.smem_bytes > DEFAULT_SMEM:
        limit = smem_limit()
        if geo.smem_bytes > limit:
            raise InputError(f"tiling {t.as_list()} needs {geo.smem_bytes} bytes of shared memory, the device "
                             f"allows {limit}", "tiling")
        kernel.max_dynamic_shared_size_bytes = geo.smem_bytes
    size = DTYPE_BYTES[problem.dtype]
    ints = tuple(np.int32(v) for v in geo.ints)
    gx, gy, n = geo.grid
    parts = [(n0, min(_MAX_Z, n - n0)) for n0 in range(0, n, _MAX_Z)]
    smem = geo.smem_bytes

    def launch(a: int, b: int, out: int, alpha: float, beta: float) -> None:
        scalars = (np.float32(alpha), np.float32(beta))
        for n0, cnt in parts:
            kernel((gx, gy, cnt), (NT,), (a + n0 * geo.a_sample * size, b + n0 * geo.b_sample * size,
                                          out + n0 * geo.out_sample * size) + ints + scalars, shared_mem=smem)

    return launch


# ---- depthwise 3x3 and 5x5 (direct_dw) --------------------------------------------------------------------------
DW = "direct_dw"
DW_SIZES = (3, 5)             # filter sizes (K x K, padding K / 2)
DW_SEGMENT = 128              # columns a group of 32 lanes covers at a time: 32 lanes x 4
DW_WARPS = NT // 32           # warps per block
DW_ROWS = (4, 8, 16, 32, 0)   # rows of a group's band (0: the whole plane)
DW_MINB = (1, 5)              # the kernel's launch bound: blocks an SM must hold (1: no register cap)
DW_OPS = ("forward", "backward_data", "backward_filter")


def dw_refusal(op: str, problem: ConvProblem) -> str | None:
    """Why :data:`DW` does not run ``op`` on ``problem`` (None: it does): it is the depthwise K x K layer (K in
    :data:`DW_SIZES`), padding K / 2, one filter per channel, in NCHW: at stride 1 all three ops, at stride 2
    backward data (``direct_dw_s2_bwd``) and backward filter (``direct_dw_s2_bwf``); backward filter in float32
    only (float atomics sum it)."""
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
        return "not 3x3 or 5x5 at stride 1 or 2 with padding K / 2"
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
    grid = (-(-warps // DW_WARPS), 1, 1)

    if p.stride == (2, 2) and op == "backward_data":      # w, dy, dx; 16-byte dx rows
        def launch_s2(a: int, b: int, out: int, alpha: float, beta: float) -> None:
            kernel = vector if vector is not None and not out % 16 else scalar
            kernel(grid, (NT,), (a, b, out) + ints + (np.float32(alpha), np.float32(beta)))

        return launch_s2

    if op == "backward_filter":     # x, dy, dw; 16-byte x rows
        scale = _compile.get_kernel(SOURCE, f"{DW}_scale<float>")
        taps = np.int32(p.c * p.r * p.s)
        scale_grid = (-(-p.c * p.r * p.s // NT), 1, 1)

        def launch_bwf(a: int, b: int, out: int, alpha: float, beta: float) -> None:
            kernel = vector if vector is not None and not (a | b) % 16 else scalar
            scale(scale_grid, (NT,), (out, taps, np.float32(beta)))
            kernel(grid, (NT,), (a, b, out) + ints + (np.float32(alpha),))

        return launch_bwf

    def launch(a: int, b: int, out: int, alpha: float, beta: float) -> None:
        src, w = (a, b) if op == "forward" else (b, a)
        kernel = vector if vector is not None and not (src | out) % 16 else scalar
        kernel(grid, (NT,), (src, w, out) + ints + (np.float32(alpha), np.float32(beta)))

    return launch


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


# ---- single-channel planes by rows (direct_plane) ------------------------------------------------------------------
PLANE = "direct_plane"
PLANE_WIN = 5                 # DIRECT_WIN: the largest filter side whose window a thread keeps in registers
PLANE_RB = (1, 2, 4)          # output rows of one column a thread owns (a row group)
PLANE_KT = (4, 8)             # filters a thread applies at a time (float4 tap reads)
PLANE_KL = (1, 2, 4, 8, 16)   # rounds of KT filters a block applies to its staged rows


def plane_geometry(problem: ConvProblem, rb: int) -> tuple[int, int, int, int, int]:
    """(row groups per plane PG, padded rows per plane IH, padded columns IW, rows a block stages at most ROWS,
    blocks along x) of :data:`PLANE` at ``problem.n``.  Slots are (n, row group, column) numbered over the batch,
    256 a block; 256 consecutive slots touch at most ``ceil(255 / Q) + 1`` row groups and ``ceil(255 / (PG*Q)) + 1``
    images, and a block stages its groups' rows plus the R - 1 halo rows of each image (or whole planes, if
    fewer)."""
    if rb not in PLANE_RB:
        raise InputError(f"must be one of {PLANE_RB}, got {rb!r}", "rb")
    p = problem
    pg = -(-p.p // rb)
    ih, pgq = pg * rb + p.r - 1, pg * p.q
    images = min(p.n, -(-(NT - 1) // pgq) + 1)
    rows = min(images * ih, (-(-(NT - 1) // p.q) + 1) * rb + (p.r - 1) * images)
    return pg, ih, p.q + p.s - 1, rows, -(-p.n * pgq // NT)


def plane_rows(problem: ConvProblem, rb: int, block: int) -> tuple[int, int]:
    """(first, last) padded row block ``block`` stages, image n's row r counted as ``n * IH + r``: from its first
    slot's row group to its last slot's window (the kernel's vlo, vhi)."""
    pg, ih, _, _, _ = plane_geometry(problem, rb)
    pgq = pg * problem.q
    first, last = block * NT, min(block * NT + NT, problem.n * pgq) - 1
    na, nb = first // pgq, last // pgq
    return (na * ih + (first - na * pgq) // problem.q * rb,
            nb * ih + (last - nb * pgq) // problem.q * rb + rb + problem.r - 2)


def plane_smem_floats(problem: ConvProblem, rb: int, kt: int, kl: int) -> int:
    """Shared memory of one :data:`PLANE` block in floats: the staged rows (rounded up to 4 floats), the taps."""
    _, _, iw, rows, _ = plane_geometry(problem, rb)
    return -(-rows * iw // 4) * 4 + kt * kl * problem.r * problem.s


def plane_refusal(op: str, problem: ConvProblem, config: tuple[int, int, int] | None = None) -> str | None:
    """Why :data:`PLANE` does not run ``op`` on ``problem`` (with ``config`` = (rb, kt, kl): in that
    configuration); None: it does.  It is the forward of one input channel without groups, NCHW, stride 1, filters up
    to 5 x 5, whose staged rows and taps fit the shared memory any block may use (48 KiB)."""
    p = problem
    if op != "forward":
        return "forward only"
    why = refusal(op, p)
    if why:
        return why
    if p.c != 1 or p.groups != 1:
        return "not one input channel without groups"
    if p.layout != "NCHW":
        return "NHWC (the single-channel kernel runs it)"
    if p.stride != (1, 1):
        return f"stride {list(p.stride)} (1 only)"
    if p.r > PLANE_WIN or p.s > PLANE_WIN:
        return f"filter {p.r}x{p.s} is larger than {PLANE_WIN}x{PLANE_WIN}"
    if config is not None:
        rb, kt, kl = config
        for name, v, allowed in (("rb", rb, PLANE_RB), ("kt", kt, PLANE_KT), ("kl", kl, PLANE_KL)):
            if v not in allowed:
                return f"{name} {v!r} is not one of {allowed}"
        if -(-p.k // (kt * kl)) > _MAX_Y:
            return "too many filter blocks for one grid"
        if 4 * plane_smem_floats(p, rb, kt, kl) > DEFAULT_SMEM:
            return f"rows of {p.w + 2 * p.pad[1]} columns do not fit a block's shared memory in configuration {config}"
    elif all(plane_refusal(op, p, (rb, 4, 1)) for rb in PLANE_RB):
        return f"rows of {p.w + 2 * p.pad[1]} columns do not fit a block's shared memory"
    return None


def plane_launcher(problem: ConvProblem, rb: int, kt: int, kl: int) -> Launcher:
    """``launch(x, w, y, alpha, beta)`` of :data:`PLANE` (as :func:`launcher`): y = alpha * conv + beta * y, the
    kernel compiled here (a launch compiles nothing, allocates nothing, never synchronises)."""
    why = plane_refusal("forward", problem, (rb, kt, kl))
    if why:
        raise InputError(f"{PLANE} cannot run forward on {problem.describe()}: {why}", "problem")
    p = problem
    pg, ih, iw, rows, blocks = plane_geometry(p, rb)
    kernel = _compile.get_kernel(SOURCE, f"{PLANE}<{_CTYPE[p.dtype]},{rb},{kt},{kl}>")
    ints = tuple(np.int32(v) for v in (p.n, p.h, p.w, p.k, p.p, p.q, p.r, p.s, p.pad[0], p.pad[1], pg, ih, iw, rows))
    grid = (blocks, -(-p.k // (kt * kl)), 1)
    smem = 4 * plane_smem_floats(p, rb, kt, kl)

    def launch(a: int, b: int, out: int, alpha: float, beta: float) -> None:
        kernel(grid, (NT,), (a, b, out) + ints + (np.float32(alpha), np.float32(beta)), shared_mem=smem)

    return launch


def plane_emulate(problem: ConvProblem, rb: int, kt: int, kl: int, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """y computed the way :data:`PLANE` does, in float64: per block the padded rows it stages (:func:`plane_rows`,
    at most ROWS of them: more raises), per slot its row group's window read back from them (a read outside the
    staged rows raises), rows past the plane not stored."""
    p = problem
    pg, ih, iw, rows, blocks = plane_geometry(p, rb)
    pgq = pg * p.q
    xv, wv = np.asarray(x, np.float64), np.asarray(w, np.float64).reshape(p.k, p.r, p.s)
    padded, _ = _staged(xv, -p.pad[0], -p.pad[1], ih, iw)
    column = padded.reshape(p.n * ih, iw)          # the padded planes as one column of rows
    y = np.full((p.n, p.k, p.p, p.q), np.nan)
    for bx in range(blocks):
        vlo, vhi = plane_rows(p, rb, bx)
        assert vhi - vlo + 1 <= rows, "a block stages more rows than its buffer holds"
        staged = column[vlo:vhi + 1]
        for slot in range(bx * NT, min(bx * NT + NT, p.n * pgq)):
            n, rem = divmod(slot, pgq)
            g, q = divmod(rem, p.q)
            top = n * ih + g * rb - vlo
            assert 0 <= top and top + rb + p.r - 1 <= len(staged), "a window outside the staged rows"
            win = staged[top:top + rb + p.r - 1, q:q + p.s]
            for rr in range(min(rb, p.p - g * rb)):
                y[n, :, g * rb + rr, q] = np.einsum("krs,rs->k", wv, win[rr:rr + p.r])
    return y


# ---- tuning ------------------------------------------------------------------------------------------------------
def tuning_key(op: str, problem: ConvProblem) -> str:
    """What a tuned tiling is kept under (with the device): the shape class -- everything but the batch, which
    counts only as small (< 16 samples: fewer blocks than an H100 has SMs on small planes) or large."""
    p = problem
    return (f"direct/{op}/{kernel_name(op, p)}/{p.dtype}/{p.layout}/c{p.c}k{p.k}g{p.groups}/{p.h}x{p.w}/"
            f"{p.r}x{p.s}/pad{p.pad[0]},{p.pad[1]}/stride{p.stride[0]},{p.stride[1]}/"
            f"n{'small' if p.n < 16 else 'large'}")


def tuned_tiling(op: str, problem: ConvProblem, operands: tuple[int, int, int] | None, tune: bool = True,
                 timer: Callable[[Callable[[], None]], float] | None = None) -> tuple[Tiling, str]:
    """(tiling, how): ``cache`` (tuned before on this device), ``climb`` (tuned now: a hill climb over
    :class:`Tiling`'s coordinates from :func:`default_tiling`, on ``operands`` -- pointers of the problem's a, b,
    out, whose ``out`` it overwrites -- then :func:`autotune.confirm`), or ``default`` (``tune`` False or no
    operands).  ``timer(fn)`` returns ms (default: CUDA events, :func:`ucudnn.binding.timing.time_ms`)."""
    limit = smem_limit()
    start = default_tiling(op, problem, limit)
    timed = None
    if tune and operands is not None:
        if timer is None:
            from ucudnn.binding.timing import time_ms

            def timer(fn: Callable[[], None]) -> float:
                return time_ms(fn, repeat=3, warmup=1, min_sample_ms=0.5)

        cc = _compile.compute_capability()

        def timed(t: Tiling) -> float:
            launch = launcher(op, problem, t, uses_async(op, problem, cc))
            a, b, out = operands
            return float(timer(lambda: launch(a, b, out, 1.0, 0.0)))

    return autotune.tuned_grid(_compile.device_key(), tuning_key(op, problem), AXES, start, Tiling.at,
                               lambda t: fits(op, problem, t, limit), lambda t: t == start or useful(op, problem, t),
                               timed, TUNE_MAX_TRIALS, TUNE_FINALISTS, TUNE_ROUNDS)


# ---- float64 references and the block-by-block emulation ------------------------------------------------------------
def _to_nchw(a: np.ndarray, layout: str) -> np.ndarray:
    return a.transpose(0, 3, 1, 2) if layout == "NHWC" else a


def _from_nchw(a: np.ndarray, layout: str) -> np.ndarray:
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1) if layout == "NHWC" else a)


def forward_reference(x: np.ndarray, w: np.ndarray, problem: ConvProblem) -> np.ndarray:
    """y in float64 and the problem's layout (any groups, stride, padding; dilation 1)."""
    p = problem
    y = conv2d_nchw(_to_nchw(np.asarray(x, np.float64), p.layout), _to_nchw(np.asarray(w, np.float64), p.layout),
                    p.pad, p.stride, (1, 1), p.groups)
    return _from_nchw(y, p.layout)


def backward_data_reference(dy: np.ndarray, w: np.ndarray, problem: ConvProblem) -> np.ndarray:
    """dx in float64 and the problem's layout: the adjoint of :func:`forward_reference` (scatter form)."""
    p = problem
    dyn = _to_nchw(np.asarray(dy, np.float64), p.layout)
    wn = _to_nchw(np.asarray(w, np.float64), p.layout)
    cg, kg = p.c // p.groups, p.k // p.groups
    sh, sw = p.stride
    dxp = np.zeros((p.n, p.c, p.h + 2 * p.pad[0] + p.r + sh * p.p, p.w + 2 * p.pad[1] + p.s + sw * p.q))
    for g in range(p.groups):
        d = dyn[:, g * kg:(g + 1) * kg]
        for i in range(p.r):
            for j in range(p.s):
                dxp[:, g * cg:(g + 1) * cg, i:i + sh * p.p:sh, j:j + sw * p.q:sw] += np.einsum(
                    "nkhw,kc->nchw", d, wn[g * kg:(g + 1) * kg, :, i, j])
    return _from_nchw(dxp[:, :, p.pad[0]:p.pad[0] + p.h, p.pad[1]:p.pad[1] + p.w], p.layout)


def backward_filter_reference(x: np.ndarray, dy: np.ndarray, problem: ConvProblem) -> np.ndarray:
    """dw in float64 and the problem's layout, any groups (dilation 1): each group's x correlated with its dy."""
    p = problem
    xn = _to_nchw(np.asarray(x, np.float64), p.layout)
    dyn = _to_nchw(np.asarray(dy, np.float64), p.layout)
    cg, kg = p.c // p.groups, p.k // p.groups
    (sh, sw), (ph, pw) = p.stride, p.pad
    xp = np.pad(xn, ((0, 0), (0, 0), (ph, ph + p.r + sh * p.p), (pw, pw + p.s + sw * p.q)))
    dw = np.zeros((p.k, cg, p.r, p.s))
    for g in range(p.groups):
        for i in range(p.r):
            for j in range(p.s):
                patch = xp[:, g * cg:(g + 1) * cg, i:i + sh * p.p:sh, j:j + sw * p.q:sw]
                dw[g * kg:(g + 1) * kg, :, i, j] = np.einsum("nchw,nkhw->kc", patch, dyn[:, g * kg:(g + 1) * kg])
    return _from_nchw(dw, p.layout)


def _staged(a: np.ndarray, r0: int, c0: int, rows: int, cols: int) -> tuple[np.ndarray, int]:
    """a[:, :, r0:r0+rows, c0:c0+cols] (NCHW), zero outside a -- what a block stages -- and how many elements of
    it lie inside a."""
    out = np.zeros(a.shape[:2] + (rows, cols))
    h, w = a.shape[2:]
    hr = slice(max(r0, 0), min(r0 + rows, h))
    wr = slice(max(c0, 0), min(c0 + cols, w))
    if hr.start < hr.stop and wr.start < wr.stop:
        out[:, :, hr.start - r0:hr.stop - r0, wr.start - c0:wr.stop - c0] = a[:, :, hr, wr]
    return out, max(0, hr.stop - hr.start) * max(0, wr.stop - wr.start)


def emulate(op: str, problem: ConvProblem, t: Tiling, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``op``'s output computed block by block the way direct.cu does -- each block's tile from
    :func:`tile_origin`, staged through :func:`forward_window` / :func:`backward_window` and read back at the
    kernels' shared-memory offsets (an offset outside the staged tile raises) -- in float64 and the problem's
    layout.  The CPU tests compare it with the references: the kernels' index math without a GPU."""
    p = problem
    g_, (sh, sw), (ph, pw) = p.groups, p.stride, p.pad
    cg, kg = p.c // g_, p.k // g_
    tp, tq = tiles(op, p, t)
    if op == "forward":
        x, w = _to_nchw(np.asarray(a, np.float64), p.layout), _to_nchw(np.asarray(b, np.float64), p.layout)
        y = np.full((p.n, p.k, p.p, p.q), np.nan)
        for bx in range(tp * tq):
            p0, q0 = tile_origin(bx, op, p, t)
            h0, w0, ih, iw = forward_window(p0, q0, p, t)
            rows, cols = min(t.rows, p.p - p0), min(t.tx, p.q - q0)
            for g in range(g_):
                tile, _ = _staged(x[:, g * cg:(g + 1) * cg], h0, w0, ih, iw)
                acc = np.zeros((p.n, kg, rows, cols))
                for i in range(p.r):
                    for j in range(p.s):
                        rr = np.arange(rows) * sh + i
                        cc = np.arange(cols) * sw + j
                        assert rr[-1] < ih and cc[-1] < iw, "a forward read past its staged tile"
                        patch = tile[:, :, rr][:, :, :, cc]
                        acc += np.einsum("nchw,kc->nkhw", patch, w[g * kg:(g + 1) * kg, :, i, j])
                y[:, g * kg:(g + 1) * kg, p0:p0 + rows, q0:q0 + cols] = acc
        return _from_nchw(y, p.layout)
    w, dy = _to_nchw(np.asarray(a, np.float64), p.layout), _to_nchw(np.asarray(b, np.float64), p.layout)
    dx = np.full((p.n, p.c, p.h, p.w), np.nan)
    for bx in range(tp * tq):
        h0, w0 = tile_origin(bx, op, p, t)
        plo, qlo, dh, dw = backward_window(h0, w0, p, t)
        rows, cols = min(t.rows, p.h - h0), min(t.tx, p.w - w0)
        for g in range(g_):
            tile, _ = _staged(dy[:, g * kg:(g + 1) * kg], plo, qlo, dh, dw)
            acc = np.zeros((p.n, cg, rows, cols))
            for hr in range(rows):
                h = h0 + hr
                for i in range((h + ph) % sh, p.r, sh):
                    prow = (h + ph - i) // sh - plo
                    assert 0 <= prow < dh, "a backward read outside its staged rows"
                    for wc in range(cols):
                        wcol = w0 + wc
                        for j in range((wcol + pw) % sw, p.s, sw):
                            pcol = (wcol + pw - j) // sw - qlo
                            assert 0 <= pcol < dw, "a backward read outside its staged columns"
                            acc[:, :, hr, wc] += tile[:, :, prow, pcol] @ w[g * kg:(g + 1) * kg, :, i, j]
            dx[:, g * cg:(g + 1) * cg, h0:h0 + rows, w0:w0 + cols] = acc
    return _from_nchw(dx, p.layout)
