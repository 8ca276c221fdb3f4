"""Implicit-GEMM convolution in FP32 (``igemm.cu``): the GEMM each op is, launch geometry, launchers, a CPU
emulation of the kernel's index math and float64 references, for the ``direct`` source's ``direct-igemm``
configurations (issue 17).

Why: within 8 MiB of workspace cuDNN runs AlexNet b256's FP32 layers at 11-20 TFLOPS, and an explicit lowering
(mec) keeps its GEMMs small because the lowered operand must fit the workspace.  Gathering that operand inside
the GEMM's tile loads makes each op one GEMM over the whole micro-batch with no workspace at all:

=================  ===========  ==========  ===========  =====================
op                 M (rows)     NC (cols)   kk (reduced)  A, B -> C
=================  ===========  ==========  ===========  =====================
forward            (n, p, q)    k           (c, r, s)     x gathered, w -> y
backward data      (n, h, w)    c           (k, r, s)     dy gathered, w -> dx
backward filter    k            (c, r, s)   (n, p, q)     dy, x gathered -> dw
backward data,     (n, p, q)    (c, r, s)   k             dy, w -> added into dx
scatter form
=================  ===========  ==========  ===========  =====================

Backward data gathers: dx[n, c, h, w] takes dy[n, k, p, q] where ``h + pad - r * dil = p * stride`` (no rotated
filter, any stride). Backward filter splits its long reduction across blocks (``grid.z``) that add into dw
atomically, after ``igemm_scale`` multiplied dw by beta; the order of those additions varies from run to run,
so its rows are recorded as not deterministic. Forward and gathered backward data are deterministic.

Backward data's scatter form (``scatter=True``) computes dy times the packed filter, col2im's columns, and adds
each product into dx at its tap's pixel (atomically, after ``igemm_scale``; not deterministic).  Why: at stride s
the gather's reduction walks every (k, r, s) of which only 1 / s^2 reach a dy pixel, and its columns are dx's
channels, three for a first layer (AlexNet conv1, 11x11 stride 4: 913 ms gathered, 2.48 ms scattered on an H200).
:func:`variants` offers it for strides over 1 and fewer than 64 channels.

The epilogue stores float4 (:func:`out_vector`) where four consecutive rows (NCHW y and dx: a warp's lanes then run
along rows, ``lm``) or columns (NHWC y and dx, dw) are four consecutive floats.

The launch picks, per layout, which way each thread's loads run (``a_k`` / ``b_k``: along the reduction or along
the rows / columns) so that a warp's loads are contiguous, the order of (c, r, s) (``cin``: channel innermost for
NHWC), and float4 loads where the four elements a thread loads are contiguous (four of the reduction, or four
consecutive NHWC channels of the rows / columns) and the pointer is 16-byte aligned (:func:`vector_ok`, checked
per launch: micro-batch offsets move the pointers).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ucudnn.errors import InputError
from ucudnn.problem import ConvProblem

from . import _compile
from .reference import conv2d_nchw

SOURCE = "igemm.cu"
BM = BN = 128          # the block's tile of C (BN: the wide tile; narrow GEMMs may take NARROW)
NARROW = 64            # the narrow tile's width: 64 output columns (each thread 8 x 4 outputs)
MID = 96               # the middle tile's width: 96 output columns (each thread 8 x 6 outputs)
WIDTHS = (BN, MID, NARROW)
BK = 8                 # reduction elements per shared-memory stage
#: stages per shared-memory buffer the kernel is built for (one barrier per ks * BK reduction steps)
STAGES = (1, 2)
NT = 256               # threads per block
OPS = ("forward", "backward_data", "backward_filter")
_OP_CODE = {"forward": 0, "backward_data": 1, "backward_filter": 2}
SCATTER_CODE = 3       # IG_BWD_SCATTER
#: a split of backward filter's reduction reduces at least this many elements (32 stages)
MIN_SPLIT = 256
#: blocks a split backward filter aims for per multiprocessor (two resident, two waves)
BLOCKS_PER_SM = 4
DEFAULT_SMS = 132
_MAX_GRID_YZ = 65535
#: the largest tensor (elements) the kernel indexes: its offsets are 32-bit, and a load may form the offset of one
#: sample or row past the end that it never reads, so half the int32 range.  A larger micro-batch is refused; the
#: planner runs smaller ones
MAX_ELEMENTS = 2 ** 30


def extents(problem: ConvProblem) -> dict[str, int]:
    """Elements each tensor spans: x, w packed; y (dy) through its strides (a channel slice spans the wider y)."""
    p = problem
    ys = p.y_strides()
    y = 1 + sum((d - 1) * st for d, st in zip((p.n, p.k, p.p, p.q), ys))
    return {"x": p.n * p.c * p.h * p.w, "w": p.k * p.c * p.r * p.s, "y": y}


def refusal(op: str, problem: ConvProblem) -> str | None:
    """Why the implicit-GEMM kernel does not run ``op`` of ``problem`` (None: it does)."""
    if op not in OPS:
        return f"unknown op {op!r}"
    if problem.dtype != "float32":
        return f"{problem.dtype}: the implicit-GEMM kernel is FP32 only"
    if problem.groups != 1:
        return "grouped convolution (the seed kernels run depthwise layers)"
    big = {name: e for name, e in extents(problem).items() if e >= MAX_ELEMENTS}
    if big:
        name, e = max(big.items(), key=lambda kv: kv[1])
        return (f"{name} spans {e} elements: the kernel's offsets are 32-bit (under {MAX_ELEMENTS}); smaller "
                f"micro-batches run")
    return None


def packed_strides(layout: str, c: int, h: int, w: int) -> tuple[int, int, int, int]:
    """Element strides (n, c, h, w) of a packed tensor; for a filter, (k, c, r, s) of ``[k][c][r][s]`` /
    ``[k][r][s][c]``."""
    return (c * h * w, h * w, w, 1) if layout == "NCHW" else (h * w * c, 1, w * c, c)


@dataclass(frozen=True)
class Gemm:
    """One op of one problem as the kernel runs it (see the module doc)."""

    op: str
    m: int
    nc: int
    kr: int
    a_k: bool          # A's loads run along the reduction (else along M)
    b_k: bool          # B's loads run along the reduction (else along NC)
    cin: bool          # (c, r, s) / (k, r, s) channel innermost
    vec_a: bool        # A may load float4 along the reduction (shape-wise; the pointer is checked per launch)
    vec_b: bool
    x_strides: tuple[int, int, int, int]
    w_strides: tuple[int, int, int, int]
    y_strides: tuple[int, int, int, int]
    bn: int = BN       # the block tile's width (columns of C)
    ks: int = 1        # stages of BK per shared-memory buffer
    lm: bool = False   # a warp's lanes run along C's rows (NCHW y and dx: rows are a plane's pixels)
    scatter: bool = False  # backward data as dy w added into dx (see the module doc)

    @classmethod
    def of(cls, op: str, problem: ConvProblem, bn: int | None = None, ks: int = 1,
           scatter: bool = False) -> "Gemm":
        """``op`` of ``problem`` as a GEMM; ``bn`` the tile width (None: :func:`tile_width` of its columns),
        ``ks`` the stages per buffer; ``scatter``: backward data's scatter form."""
        check_tile(BN if bn is None else bn, ks)
        if scatter and op != "backward_data":
            raise InputError(f"only backward data has a scatter form, not {op}", "scatter")
        why = refusal(op, problem)
        if why:
            raise InputError(f"igemm cannot run {op} of {problem.describe()}: {why}", "problem")
        p = problem
        nhwc = p.layout == "NHWC"
        xs = packed_strides(p.layout, p.c, p.h, p.w)
        ws = packed_strides(p.layout, p.c, p.r, p.s)
        ys = p.y_strides()
        if op == "forward":
            m, nc, kr = p.n * p.p * p.q, p.k, p.c * p.r * p.s
            a_k, b_k = nhwc, True
            vec_a = nhwc and p.c % 4 == 0
            vec_b = kr % 4 == 0            # w[k][kk] is packed in the reduction's own order
        elif op == "backward_data" and scatter:
            m, nc, kr = p.n * p.p * p.q, p.c * p.r * p.s, p.k
            a_k, b_k = nhwc, False
            vec_a = nhwc and p.k % 4 == 0 and all(v % 4 == 0 for v in (ys[0], ys[2], ys[3]))  # dy[n][p][q][k..k+3]
            vec_b = nc % 4 == 0            # w[k][col..col+3]: the packed filter's row
        elif op == "backward_data":
            m, nc, kr = p.n * p.h * p.w, p.c, p.k * p.r * p.s
            a_k, b_k = nhwc, not nhwc
            vec_a = nhwc and p.k % 4 == 0 and all(v % 4 == 0 for v in (ys[0], ys[2], ys[3]))
            vec_b = nhwc and p.c % 4 == 0  # w[k][r][s][c..c+3]
        else:
            m, nc, kr = p.k, p.c * p.r * p.s, p.n * p.p * p.q
            a_k, b_k = not nhwc, not nhwc
            vec_a = nhwc and p.k % 4 == 0 and all(v % 4 == 0 for v in (ys[0], ys[2], ys[3]))  # dy[..][k..k+3]
            vec_b = nhwc and p.c % 4 == 0  # x[n][h][w][c..c+3] of one tap
        lm = not nhwc and op != "backward_filter" and not scatter
        return cls(op, m, nc, kr, a_k, b_k, nhwc, vec_a, vec_b, xs, ws, ys, tile_width(nc) if bn is None else bn, ks,
                   lm, scatter)

    def name_expr(self, vec_a: bool, vec_b: bool) -> str:
        b = lambda v: "true" if v else "false"  # noqa: E731
        op = SCATTER_CODE if self.scatter else _OP_CODE[self.op]
        return (f"igemm_conv<{op},{b(self.a_k)},{b(self.b_k)},{b(self.cin)},{b(vec_a)},{b(vec_b)},{self.bn},{self.ks},"
                f"{b(self.lm)}>")

    def grid(self, splits: int = 1) -> tuple[int, int, int]:
        return (-(-self.m // BM), -(-self.nc // self.bn), splits)

    def split(self, sms: int = DEFAULT_SMS) -> tuple[int, int]:
        """(blocks along the reduction, reduction elements each) for backward filter; (1, kr) otherwise."""
        if self.op != "backward_filter":
            return 1, self.kr
        gx, gy, _ = self.grid()
        want = max(1, -(-BLOCKS_PER_SM * sms // (gx * gy)))
        return self.split_into(max(1, min(want, self.kr // MIN_SPLIT, _MAX_GRID_YZ)))

    def split_into(self, splits: int) -> tuple[int, int]:
        """(blocks along the reduction, reduction elements each: a multiple of BK) for about ``splits`` blocks."""
        check_splits(splits)
        if self.op != "backward_filter" and splits != 1:
            raise InputError(f"only backward filter splits its reduction, not {self.op}", "splits")
        per = -(-max(1, self.kr) // min(splits, _MAX_GRID_YZ))
        per = -(-per // BK) * BK
        return -(-self.kr // per), per


def check_tile(bn: Any, ks: Any, where: str = "") -> None:
    """Refuse a tile the kernel is not built for (``where``: the fields' prefix, e.g. a table row's
    ``extra.direct.``)."""
    if bn not in WIDTHS or isinstance(bn, bool):
        raise InputError(f"bn must be one of {WIDTHS}, got {bn!r}", f"{where}bn")
    if ks not in STAGES or isinstance(ks, bool):
        raise InputError(f"ks must be one of {STAGES}, got {ks!r}", f"{where}ks")


def check_splits(splits: Any, where: str = "") -> None:
    """Refuse a split count of backward filter's reduction that is not a positive integer."""
    if not isinstance(splits, int) or isinstance(splits, bool) or splits < 1:
        raise InputError(f"splits must be a positive integer, got {splits!r}", f"{where}splits")


def tile_width(nc: int) -> int:
    """The tile width for ``nc`` columns: the one that leaves the fewest columns idle (64 output channels: the
    narrow tile; 96 or 192: the middle one, where the wide tile leaves a quarter or a third idle), the wider on a
    tie, whose threads do more FMAs per shared-memory load."""
    return min(WIDTHS, key=lambda bn: (-(-nc // bn) * bn - nc, -bn))


def variants(op: str, problem: ConvProblem, deterministic: bool = False) -> list[tuple[int, int, bool]]:
    """The (tile width, stages per buffer, scatter) the ``direct`` source measures for ``op`` of ``problem``: the
    wide tile with one and two stages, and the narrower tile :func:`tile_width` picks where it picks one, also with
    one and two (two spilled at two blocks per SM until the loads cached their taps); for backward data with a stride
    over 1 or fewer than 64 input channels, the scatter form's tiles too (its atomics make it non-deterministic: not
    where ``deterministic``).  Which is fastest depends on the shape and the device: measured, not guessed."""
    forms = [False]
    if op == "backward_data" and not deterministic and (problem.stride != (1, 1) or problem.c < NARROW):
        forms.append(True)
    out = []
    for scatter in forms:
        nc = Gemm.of(op, problem, scatter=scatter).nc
        out += [(BN, 1, scatter), (BN, 2, scatter)]
        if tile_width(nc) != BN:
            out += [(tile_width(nc), 1, scatter), (tile_width(nc), 2, scatter)]
    return out


def vector_ok(g: Gemm, ptr_a: int, ptr_b: int) -> tuple[bool, bool]:
    """Whether this launch may use float4 loads for A and B (16-byte aligned operands)."""
    return g.vec_a and ptr_a % 16 == 0, g.vec_b and ptr_b % 16 == 0


#: the epilogue's store forms (``IG_VEC_*`` in igemm.cu): one float per store, or float4 over four rows / columns
VEC_NONE, VEC_ROWS, VEC_COLS = 0, 1, 2


def out_vector(g: Gemm, problem: ConvProblem, ptr_out: int) -> int:
    """How this launch's epilogue may store C (``VEC_*``): float4 over four consecutive rows where the lanes run
    along rows (``lm``) and every 4-aligned quad of rows is four consecutive floats (a packed plane whose pixel count
    is a multiple of 4, channel and sample strides multiples of 4), or over four consecutive columns where columns
    are unit-stride (NHWC y and dx, the packed dw) and every other stride is a multiple of 4; the output pointer
    16-byte aligned (micro-batch offsets and channel slices move it).  Else one float per store."""
    if ptr_out % 16 or g.scatter:          # the scatter form adds atomically, one float each
        return VEC_NONE
    p = problem
    if g.op == "backward_filter":
        return VEC_COLS if g.w_strides[0] % 4 == 0 else VEC_NONE
    st, (a, b) = (g.y_strides, (p.p, p.q)) if g.op == "forward" else (g.x_strides, (p.h, p.w))
    if g.lm:
        ok = st[3] == 1 and st[2] == b and (a * b) % 4 == 0 and st[0] % 4 == 0 and st[1] % 4 == 0
        return VEC_ROWS if ok else VEC_NONE
    ok = st[1] == 1 and all(v % 4 == 0 for v in (st[0], st[2], st[3]))
    return VEC_COLS if ok else VEC_NONE


def _operand_roles(op: str) -> tuple[int, int]:
    """Which of cuDNN's (a, b) operands are the kernel's A and B: forward (x, w) -> A = x, B = w; backward data
    (w, dy) -> A = dy, B = w; backward filter (x, dy) -> A = dy, B = x."""
    return {"forward": (0, 1), "backward_data": (1, 0), "backward_filter": (1, 0)}[op]


Launcher = Callable[[int, int, int, float, float], None]


def sm_count() -> int:
    cp = _compile.cupy()
    return int(cp.cuda.runtime.deviceGetAttribute(16, cp.cuda.Device().id))  # MultiProcessorCount


def launcher(op: str, problem: ConvProblem, splits: int | None = None, bn: int | None = None,
             ks: int = 1, scatter: bool = False) -> Launcher:
    """``launch(a, b, out, alpha, beta)`` on raw pointers in cuDNN's operand order (forward: x, w, y; backward data:
    w, dy, dx; backward filter: x, dy, dw), on CuPy's current stream: out = alpha * op(a, b) + beta * out.
    ``splits``: backward filter's blocks along the reduction (None: :meth:`Gemm.split` for this device).  Every
    kernel a launch may pick is compiled here, so launching compiles and allocates nothing and never synchronises
    (CUDA-graph capturable).  ``bn``, ``ks``, ``scatter``: the tile and form (see :meth:`Gemm.of`)."""
    g = Gemm.of(op, problem, bn, ks, scatter)
    p = problem
    splits, per = g.split(sm_count()) if splits is None else g.split_into(splits)
    grid = g.grid(splits)
    if grid[1] > _MAX_GRID_YZ:
        raise InputError(f"igemm: {g.nc} output columns exceed the grid", "problem")
    kernels: dict[tuple[bool, bool], Any] = {}
    for va in {False, g.vec_a}:
        for vb in {False, g.vec_b}:
            kernels[(va, vb)] = _compile.get_kernel(SOURCE, g.name_expr(va, vb))
    scale = _compile.get_kernel(SOURCE, "igemm_scale") if splits > 1 or scatter else None
    i32, i64 = np.int32, np.int64
    dh, dw = p.dilation
    args = tuple(i32(v) for v in (p.n, p.c, p.h, p.w, p.k, p.p, p.q, p.r, p.s, p.pad[0], p.pad[1], p.stride[0],
                                  p.stride[1], dh, dw))
    args += tuple(i64(v) for v in g.x_strides + g.w_strides + g.y_strides)
    args += (i32(g.m), i32(g.nc), i32(g.kr), i32(per))
    ia, ib = _operand_roles(op)
    count = p.n * p.c * p.h * p.w if scatter else p.k * p.c * p.r * p.s    # what the atomics add into
    store = out_vector(g, p, 0)         # the shape's store form; an unaligned output pointer takes single floats
    scale_grid = (min(-(-count // NT), 4096),)

    def launch(a: int, b: int, out: int, alpha: float, beta: float) -> None:
        ptrs = (a, b)
        pa, pb = ptrs[ia], ptrs[ib]
        kern = kernels[vector_ok(g, pa, pb)]
        if scale is not None:
            scale(scale_grid, (NT,), (out, i64(count), np.float32(beta)))
            beta = 1.0
        vec = store if out % 16 == 0 else VEC_NONE
        kern(grid, (NT,), (pa, pb, out) + args + (np.float32(alpha), np.float32(beta), i32(vec)))

    return launch


# ---- the kernel's index math on the CPU, and float64 references ----------------------------------------------------
def _split(idx: np.ndarray, ch: int, r: int, s: int, cin: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ch, r, s) of flat indices, as ``ig_split`` decodes them."""
    if cin:
        t = idx // ch
        return idx - t * ch, t // s, t % s
    t = idx // s
    return t // r, t % r, idx - t * s


def advance(ch: int, r: int, s: int, dims: tuple[int, int, int], cin: bool) -> tuple[int, int, int, bool]:
    """``ig_advance``: the coordinates of index + BK from those of index, in ``_split``'s order over ``dims`` =
    (CH, R, S) (a pixel index (n, p, q) is the tap-innermost order over (N, P, Q)), and whether the step carried
    into the outer coordinates -- the kernel's loads then recompute the tap they cache.  A carry chain, not a
    decode: the innermost coordinate may wrap more than once when it is shorter than BK (C = 1 or 3)."""
    CH, R, S = dims
    # (innermost, middle, outer) coordinate and the first two extents, in the decode's order
    inner, mid, outer, n_in, n_mid = (ch, s, r, CH, S) if cin else (s, r, ch, S, R)
    inner += BK
    carried = inner >= n_in
    while inner >= n_in:
        inner -= n_in
        mid += 1
        if mid == n_mid:
            mid, outer = 0, outer + 1
    return (inner, outer, mid, carried) if cin else (outer, mid, inner, carried)


def _pixel(idx: np.ndarray, a: int, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t = idx // b
    return t // a, t % a, idx - t * b


def out_offsets(g: Gemm, problem: ConvProblem) -> tuple[np.ndarray, np.ndarray]:
    """Element offsets of C's rows and columns in the output (``ig_out_row`` / ``ig_out_col``): C[m][col] is at
    ``rows[m] + cols[col]``."""
    p = problem
    if g.op == "forward":
        n, a, b = _pixel(np.arange(g.m), p.p, p.q)
        st = g.y_strides
    elif g.op == "backward_data":
        n, a, b = _pixel(np.arange(g.m), p.h, p.w)
        st = g.x_strides
    else:
        c, r, s = _split(np.arange(g.nc), p.c, p.r, p.s, g.cin)
        ws = g.w_strides
        return np.arange(g.m) * ws[0], c * ws[1] + r * ws[2] + s * ws[3]
    return n * st[0] + a * st[2] + b * st[3], np.arange(g.nc) * st[1]


def emulate(op: str, problem: ConvProblem, a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None,
            alpha: float = 1.0, beta: float = 0.0, scatter: bool = False) -> np.ndarray:
    """One launch on the CPU as the kernel computes it: A and B gathered element by element through the same index
    decoding and strides (flat operands in the problem's layout), C = A B in float64, written through the
    kernel's output addressing.  ``a``, ``b`` in cuDNN's operand order; returns ``out`` (float64, flat)."""
    g = Gemm.of(op, problem, scatter=scatter)
    p = problem
    if scatter:
        return _emulate_scatter(g, p, a, b, out, alpha, beta)
    dh, dwl = p.dilation
    (ph, pw), (sh, sw) = p.pad, p.stride
    ia, ib = _operand_roles(op)
    A_src = np.asarray((a, b)[ia], np.float64).ravel()
    B_src = np.asarray((a, b)[ib], np.float64).ravel()
    xs, ws, ys = g.x_strides, g.w_strides, g.y_strides
    m = np.arange(g.m)[:, None]
    kk = np.arange(g.kr)[None, :]
    col = np.arange(g.nc)[None, :]
    kkc = np.arange(g.kr)[:, None]
    if op == "forward":
        n, pp, qq = _pixel(m, p.p, p.q)
        c, r, s = _split(kk, p.c, p.r, p.s, g.cin)
        h, w = pp * sh - ph + r * dh, qq * sw - pw + s * dwl
        ok = (h >= 0) & (h < p.h) & (w >= 0) & (w < p.w)
        A = np.where(ok, A_src[np.where(ok, n * xs[0] + c * xs[1] + h * xs[2] + w * xs[3], 0)], 0.0)
        c2, r2, s2 = _split(kkc, p.c, p.r, p.s, g.cin)
        B = B_src[col * ws[0] + c2 * ws[1] + r2 * ws[2] + s2 * ws[3]]
    elif op == "backward_data":
        n, hh, ww = _pixel(m, p.h, p.w)
        k, r, s = _split(kk, p.k, p.r, p.s, g.cin)
        vh, vw = hh + ph - r * dh, ww + pw - s * dwl
        ok = (vh >= 0) & (vh % sh == 0) & (vh // sh < p.p) & (vw >= 0) & (vw % sw == 0) & (vw // sw < p.q)
        A = np.where(ok, A_src[np.where(ok, n * ys[0] + k * ys[1] + (vh // sh) * ys[2] + (vw // sw) * ys[3], 0)],
                     0.0)
        k2, r2, s2 = _split(kkc, p.k, p.r, p.s, g.cin)
        B = B_src[k2 * ws[0] + col * ws[1] + r2 * ws[2] + s2 * ws[3]]
    else:
        n, pp, qq = _pixel(kk, p.p, p.q)
        A = A_src[m * ys[1] + n * ys[0] + pp * ys[2] + qq * ys[3]]
        n2, p2, q2 = _pixel(kkc, p.p, p.q)
        c, r, s = _split(col, p.c, p.r, p.s, g.cin)
        h, w = p2 * sh + r * dh - ph, q2 * sw + s * dwl - pw
        ok = (h >= 0) & (h < p.h) & (w >= 0) & (w < p.w)
        B = np.where(ok, B_src[np.where(ok, c * xs[1] + n2 * xs[0] + h * xs[2] + w * xs[3], 0)], 0.0)
    C = A @ B
    rows, cols = out_offsets(g, p)
    size = int(np.prod(problem.shape({"forward": "y", "backward_data": "x", "backward_filter": "w"}[op])))
    if op == "forward" and p.k_total is not None:
        size = 1 + sum((d - 1) * st for d, st in zip((p.n, p.k, p.p, p.q), ys))
    result = np.zeros(size) if out is None else np.asarray(out, np.float64).ravel().copy()
    idx = rows[:, None] + cols[None, :]
    result[idx] = alpha * C + (beta * result[idx] if beta else 0.0)
    return result


def _emulate_scatter(g: Gemm, p: ConvProblem, w: np.ndarray, dy: np.ndarray, out: np.ndarray | None, alpha: float,
                     beta: float) -> np.ndarray:
    """Backward data's scatter form as the kernel computes it: C[(n,p,q)][(c,r,s)] = sum_k dy w (dy's rows through
    y's strides, w's packed rows), then each element added into dx at its tap's pixel, after dx *= beta."""
    xs, ws, ys = g.x_strides, g.w_strides, g.y_strides
    dy_src, w_src = np.asarray(dy, np.float64).ravel(), np.asarray(w, np.float64).ravel()
    n, pp, qq = _pixel(np.arange(g.m)[:, None], p.p, p.q)
    k = np.arange(g.kr)[None, :]
    A = dy_src[n * ys[0] + k * ys[1] + pp * ys[2] + qq * ys[3]]
    B = w_src[np.arange(g.kr)[:, None] * ws[0] + np.arange(g.nc)[None, :]]
    C = A @ B
    c, r, s = _split(np.arange(g.nc)[None, :], p.c, p.r, p.s, g.cin)
    h = pp * p.stride[0] - p.pad[0] + r * p.dilation[0]
    w_ = qq * p.stride[1] - p.pad[1] + s * p.dilation[1]
    ok = (h >= 0) & (h < p.h) & (w_ >= 0) & (w_ < p.w)
    size = p.n * p.c * p.h * p.w
    result = np.zeros(size) if out is None else beta * np.asarray(out, np.float64).ravel()
    idx = n * xs[0] + c * xs[1] + h * xs[2] + w_ * xs[3]
    np.add.at(result, idx[ok], alpha * C[ok])
    return result


def _nchw(a: np.ndarray, layout: str) -> np.ndarray:
    return a.transpose(0, 3, 1, 2) if layout == "NHWC" else a


def _layout(a: np.ndarray, layout: str) -> np.ndarray:
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1) if layout == "NHWC" else a)


def reference(op: str, problem: ConvProblem, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``op(a, b)`` in float64 and the problem's layout (shapes as ``problem.operand_shapes(op)``; packed y),
    written from the definition, independently of the GEMM view: forward by :func:`conv2d_nchw`, backward data
    by scattering dy through each tap, backward filter by correlating the padded x with dy."""
    p = problem
    (ph, pw), (sh, sw), (dh, dwl) = p.pad, p.stride, p.dilation
    if op == "forward":
        x, w = (_nchw(np.asarray(v, np.float64), p.layout) for v in (a, b))
        return _layout(conv2d_nchw(x, w, p.pad, p.stride, p.dilation, p.groups), p.layout)
    if op == "backward_data":
        w, dy = _nchw(np.asarray(a, np.float64), p.layout), _nchw(np.asarray(b, np.float64), p.layout)
        dxp = np.zeros((p.n, p.c, p.h + 2 * ph + dh * p.r + sh * p.p, p.w + 2 * pw + dwl * p.s + sw * p.q))
        for i in range(p.r):
            for j in range(p.s):
                dxp[:, :, i * dh:i * dh + sh * p.p:sh, j * dwl:j * dwl + sw * p.q:sw] += np.einsum(
                    "nkhw,kc->nchw", dy, w[:, :, i, j])
        return _layout(dxp[:, :, ph:ph + p.h, pw:pw + p.w], p.layout)
    x, dy = _nchw(np.asarray(a, np.float64), p.layout), _nchw(np.asarray(b, np.float64), p.layout)
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph + dh * p.r + sh * p.p), (pw, pw + dwl * p.s + sw * p.q)))
    dw = np.zeros((p.k, p.c, p.r, p.s))
    for i in range(p.r):
        for j in range(p.s):
            patch = xp[:, :, i * dh:i * dh + sh * p.p:sh, j * dwl:j * dwl + sw * p.q:sw]
            dw[:, :, i, j] = np.einsum("nchw,nkhw->kc", patch, dy)
    return _layout(dw, p.layout)


__all__ = ["BK", "BM", "BN", "MAX_ELEMENTS", "MID", "NARROW", "NT", "OPS", "STAGES", "VEC_COLS", "VEC_NONE", "VEC_ROWS",
           "WIDTHS", "Gemm", "advance", "check_splits", "check_tile", "emulate", "extents", "launcher", "out_vector",
           "packed_strides", "reference", "refusal", "tile_width", "variants", "vector_ok"]
