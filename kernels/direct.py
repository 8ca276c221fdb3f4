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

The same CUDA source holds two kernel families made for one layer shape each, with modules of their own:
``direct_plane.py`` (the single-channel NCHW forward by rows of the whole batch) and ``direct_dw.py`` (the depthwise
K x K layer).  They take this module's constants and :func:`refusal`; this module imports neither.
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
