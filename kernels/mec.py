"""MEC, memory-efficient convolution by compact lowering (seed 002, Algorithm 2): geometry, GEMM plans, NumPy
references, and the launchers of mec.cu.  :func:`program` lists every step of one configuration (lowering, swaps,
GEMMs, gather) with its workspace layout; the ``mec`` algorithm source (``ucudnn/measure/sources/mec.py``) runs
those steps on the GPU and :func:`run_program` runs them with NumPy.

Layout is NHWC throughout (x ``[N, H, W, C]``, w ``[K, R, S, C]`` as cuDNN's NHWC filters, y ``[N, P, Q, K]``);
groups = dilation = 1.  Per sample the lowered matrix ``L`` is ``[Q][LH][S][C]`` (the seed's o_w x i_h x k_w x i_c):

    L[n, q, hh, j, c] = x_padded[n, hh, q*sw + j, c]

where ``LH = (P - 1)*sh + R`` counts the padded input rows some window reaches (``h + 2*ph`` less the bottom rows
a stride leaves unread), so no byte of ``L`` is dead.  Output row ``p`` is the GEMM
``y[n, p] (Q x K) = L[n][:, p*sh*S*C : p*sh*S*C + R*S*C] (Q x RSC, row stride LH*S*C) @ w^T (RSC x K)``.

GEMMs are described row-major (:class:`Gemm`): ``C = alpha * op(A) @ op(B) + beta * C`` per batch entry.  cuBLAS is
column-major: the same product is ``C^T = op(B)^T @ op(A)^T``, i.e. ``cublasGemmStridedBatchedEx`` with the operands
swapped (:meth:`Gemm.column_major`).

Backward data writes ``dL`` (the lowered form of dx) by GEMMs that accumulate where output rows' windows overlap
(``sh < R``), then mec.cu's ``mec_gather_dx`` sums the horizontally overlapping entries of ``dL`` into each dx
element (a gather, no atomics: :func:`dx_gather_range` is its index math).  Backward filter accumulates
``dy[n, p]^T @ L[n]``-partitions into dw.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Callable, Iterator

import numpy as np

from ucudnn.errors import InputError
from ucudnn.problem import DTYPE_BYTES, ConvProblem

from . import _compile
from .fold import _CTYPE, _MAX_Z, _THREADS

SOURCE = "mec.cu"
#: the seed's threshold on Q (o_w) below which Solution A runs: "around 100" on the GPUs it measured
DEFAULT_T = 100


@dataclass(frozen=True)
class Gemm:
    """One (strided-batched) GEMM, row-major, on flat buffers named ``a``, ``b``, ``c``: for each entry ``i <
    batch``, ``C_i (m x n, row stride ldc) = alpha * op(A_i) @ op(B_i) + beta * C_i`` where ``A_i`` starts at element
    ``a_offset + i*stride_a`` (``m x k`` with row stride ``lda``, or stored ``k x m`` when ``trans_a``), likewise
    B (``k x n``, or stored ``n x k`` when ``trans_b``).  ``beta`` None is the caller's beta; 1.0 accumulates.
    ``alpha`` None is the caller's alpha (a GEMM into a workspace buffer that a later step scales takes 1.0).
    Entries of one GEMM never write the same element (they may run concurrently); GEMMs of a list run in order."""

    a: str
    b: str
    c: str
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int
    a_offset: int = 0
    b_offset: int = 0
    c_offset: int = 0
    stride_a: int = 0
    stride_b: int = 0
    stride_c: int = 0
    batch: int = 1
    trans_a: bool = False
    trans_b: bool = False
    beta: float | None = None
    alpha: float | None = None

    def column_major(self) -> dict:
        """The cublasGemmStridedBatchedEx arguments (column-major) computing this GEMM: operands swapped."""
        return dict(transa="T" if self.trans_b else "N", transb="T" if self.trans_a else "N", m=self.n, n=self.m,
                    k=self.k, A=(self.b, self.b_offset), lda=self.ldb, strideA=self.stride_b,
                    B=(self.a, self.a_offset), ldb=self.lda, strideB=self.stride_a, C=(self.c, self.c_offset),
                    ldc=self.ldc, strideC=self.stride_c, batchCount=self.batch)


@dataclass(frozen=True)
class MecGeometry(ConvProblem):
    """A convolution MEC runs: a :class:`ucudnn.problem.ConvProblem` in NHWC (the default here), without groups or
    dilation.  Methods take the micro-batch size ``n`` explicitly (a plan runs several)."""

    layout: str = "NHWC"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.layout != "NHWC" or self.groups != 1 or self.dilation != (1, 1):
            raise InputError(f"MEC runs NHWC convolutions without groups or dilation: {self.describe()}", "problem")

    @classmethod
    def of(cls, problem: ConvProblem) -> "MecGeometry":
        return cls(**{f.name: getattr(problem, f.name) for f in fields(problem)})

    @property
    def lh(self) -> int:
        """Rows of the lowered matrix: the padded input rows a window reaches (<= h + 2*ph)."""
        return (self.p - 1) * self.stride[0] + self.r

    @property
    def rsc(self) -> int:
        return self.r * self.s * self.c

    @property
    def lowered_row(self) -> int:
        """Elements of one row ``L[n, q]`` (the GEMMs' lda over L)."""
        return self.lh * self.s * self.c

    def lowered_shape(self, n: int) -> tuple[int, int, int, int, int]:
        return (n, self.q, self.lh, self.s, self.c)

    def lowered_elements(self, n: int) -> int:
        return n * self.q * self.lowered_row

    def lowered_bytes(self, n: int, itemsize: int | None = None) -> int:
        """The workspace MEC needs at micro-batch ``n``: ``L`` (forward, backward filter) or ``dL`` (backward data),
        of ``itemsize``-byte elements (default: the problem's dtype)."""
        return self.lowered_elements(n) * (DTYPE_BYTES[self.dtype] if itemsize is None else itemsize)

    def solution_a_allowed(self, n: int) -> bool:
        """Solution A permutes its h-n-w-c output through L, so L must hold y."""
        return n * self.p * self.q * self.k <= self.lowered_elements(n)

    def choose(self, n: int, threshold: int = DEFAULT_T) -> str:
        """The seed's rule (Algorithm 2, line 8): "A" when o_w <= T and |O| <= |L|, else "B"."""
        return "A" if self.q <= threshold and self.solution_a_allowed(n) else "B"

    # ---- forward -------------------------------------------------------------------------------------------
    def forward_gemms(self, n: int, solution: str, batch_over: str | None = None) -> list[Gemm]:
        """y from L and w.  "A": one GEMM over the P output rows (batched, stride sh*S*C), each row over all n
        samples at once (m = n*Q), into y as h-n-w-c (``[P][N][Q][K]``), which :func:`solution_a_permutation`
        then brings to n-h-w-c through L.  "B": m = Q per (sample, row), written straight into NHWC y; strided
        batches run over ``batch_over`` ("rows": one GEMM per sample; "samples": one per row; None: the larger)."""
        sc, row, rsc, k = self.s * self.c, self.lowered_row, self.rsc, self.k
        base = dict(a="L", b="w", c="y", n=k, k=rsc, lda=row, ldb=rsc, trans_b=True)
        if solution == "A":
            if not self.solution_a_allowed(n):
                raise InputError(f"Solution A needs |y| <= |L| (n={n}): {self}", "solution")
            return [Gemm(**base, m=n * self.q, ldc=k, stride_a=self.stride[0] * sc, stride_c=n * self.q * k,
                         batch=self.p)]
        if solution != "B":
            raise InputError(f"must be 'A' or 'B', got {solution!r}", "solution")
        per_row = dict(m=self.q, ldc=k)
        rows = (self.stride[0] * sc, self.q * k)           # (A, C) strides between output rows
        samples = (self.q * row, self.p * self.q * k)      # and between samples
        return [Gemm(**base, **per_row, a_offset=i * outer[0], c_offset=i * outer[1], stride_a=inner[0],
                     stride_c=inner[1], batch=count)
                for i, outer, inner, count in self._batches(n, batch_over, rows, samples)]

    def _batches(self, n: int, batch_over: str | None, rows: tuple[int, ...], samples: tuple[int, ...]
                 ) -> Iterator[tuple[int, tuple[int, ...], tuple[int, ...], int]]:
        """(index of the loop, outer strides, inner (batch) strides, batch count) per GEMM of an (n, P) grid."""
        if batch_over is None:
            batch_over = "rows" if self.p >= n else "samples"
        if batch_over == "rows":
            return ((i, samples, rows, self.p) for i in range(n))
        if batch_over == "samples":
            return ((i, rows, samples, n) for i in range(self.p))
        raise InputError(f"must be 'rows', 'samples' or None, got {batch_over!r}", "batch_over")

    # ---- backward data -------------------------------------------------------------------------------------
    def backward_data_gemms(self, n: int, batch_over: str | None = None) -> list[Gemm]:
        """dL (zeroed first) += dy[n, p] (Q x K) @ w (K x RSC) at row p's partition.  Partitions of rows p, p'
        overlap when |p - p'|*sh < R, so one batch holds only rows ``g`` apart (g = ceil(R/sh)): "rows" batches
        rows p = j, j+g, ... of one sample, "samples" one row of every sample."""
        sc, row, rsc, k = self.s * self.c, self.lowered_row, self.rsc, self.k
        g = -(-self.r // self.stride[0])
        base = dict(a="dy", b="w", c="dL", m=self.q, n=rsc, k=k, lda=k, ldb=rsc, ldc=row, beta=1.0, alpha=1.0)
        if batch_over is None:
            batch_over = "rows" if -(-self.p // g) >= n else "samples"
        if batch_over == "rows":
            return [Gemm(**base, a_offset=i * self.p * self.q * k + j * self.q * k,
                         c_offset=i * self.q * row + j * self.stride[0] * sc, stride_a=g * self.q * k,
                         stride_c=g * self.stride[0] * sc, batch=len(range(j, self.p, g)))
                    for i in range(n) for j in range(min(g, self.p))]
        if batch_over == "samples":
            return [Gemm(**base, a_offset=p * self.q * k, c_offset=p * self.stride[0] * sc,
                         stride_a=self.p * self.q * k, stride_c=self.q * row, batch=n) for p in range(self.p)]
        raise InputError(f"must be 'rows', 'samples' or None, got {batch_over!r}", "batch_over")

    # ---- backward filter -----------------------------------------------------------------------------------
    def backward_filter_gemms(self, n: int) -> list[Gemm]:
        """dw (K x RSC) = alpha * sum over (sample, row) of dy[n, p]^T (K x Q) @ L partition (Q x RSC) + beta * dw:
        one GEMM per (sample, row), in order, the first with the caller's beta, the others accumulating."""
        sc, row, rsc, k = self.s * self.c, self.lowered_row, self.rsc, self.k
        return [Gemm(a="dy", b="L", c="dw", m=k, n=rsc, k=self.q, lda=k, ldb=row, ldc=rsc, trans_a=True,
                     a_offset=(i * self.p + p) * self.q * k, b_offset=i * self.q * row + p * self.stride[0] * sc,
                     beta=None if (i, p) == (0, 0) else 1.0)
                for i in range(n) for p in range(self.p)]


    # ---- every sample of an output row at once: dy as h-n-w-c (``dyT [P][N][Q][K]``, mec_swap) -------------------
    def backward_data_gemms_hnwc(self, n: int, a: str = "dyT") -> list[Gemm]:
        """dL (zeroed first) += dyT[p] (n*Q x K) @ w (K x RSC) at row p's partition of all n samples' L rows (the
        rows (sample, q) of L are ``lowered_row`` apart, so one GEMM covers them, as Solution A does forward).
        Rows ``g = ceil(R/sh)`` apart share a strided batch (their partitions do not overlap): min(g, P) calls.
        ``a`` names dy itself where n = 1 (h-n-w-c is then n-h-w-c)."""
        sc, row, rsc, k, nq = self.s * self.c, self.lowered_row, self.rsc, self.k, n * self.q
        g = -(-self.r // self.stride[0])
        return [Gemm(a=a, b="w", c="dL", m=nq, n=rsc, k=k, lda=k, ldb=rsc, ldc=row, a_offset=j * nq * k,
                     c_offset=j * self.stride[0] * sc, stride_a=g * nq * k, stride_c=g * self.stride[0] * sc,
                     batch=len(range(j, self.p, g)), beta=1.0, alpha=1.0)
                for j in range(min(g, self.p))]

    def backward_filter_gemms_hnwc(self, n: int, a: str = "dyT") -> list[Gemm]:
        """dw = alpha * sum over rows p of dyT[p]^T (K x n*Q) @ (row p's partition of all n samples' L rows) +
        beta * dw: P calls, each reducing over n*Q (the per-sample plan makes n*P calls reducing over Q)."""
        sc, row, rsc, k, nq = self.s * self.c, self.lowered_row, self.rsc, self.k, n * self.q
        return [Gemm(a=a, b="L", c="dw", m=k, n=rsc, k=nq, lda=k, ldb=row, ldc=rsc, trans_a=True,
                     a_offset=p * nq * k, b_offset=p * self.stride[0] * sc, beta=None if p == 0 else 1.0)
                for p in range(self.p)]


# ---- programs: what one configuration runs, step by step ---------------------------------------------------------
@dataclass(frozen=True)
class Lower:
    """mec_lower: ``dst`` (L) from NHWC ``src`` (x)."""

    src: str
    dst: str


@dataclass(frozen=True)
class Swap:
    """mec_swap: ``dst[inner][outer][row] = src[outer][inner][row]`` (sizes in elements)."""

    src: str
    dst: str
    outer: int
    inner: int
    row: int


@dataclass(frozen=True)
class Zero:
    """``elements`` zeros at the start of ``buf`` (cudaMemsetAsync)."""

    buf: str
    elements: int


@dataclass(frozen=True)
class Copy:
    """``elements`` from ``src`` to ``dst`` (cudaMemcpyAsync, device to device)."""

    src: str
    dst: str
    elements: int


@dataclass(frozen=True)
class GatherDx:
    """mec_gather_dx with the caller's alpha and beta: ``dst`` (dx) from ``src`` (dL)."""

    src: str
    dst: str


Step = Gemm | Lower | Swap | Zero | Copy | GatherDx

#: the (a, b, out) operands of each op by the names programs use (cuDNN's order, as ucudnn.problem.ROLES)
OPERANDS: dict[str, tuple[str, str, str]] = {"forward": ("x", "w", "y"), "backward_data": ("w", "dy", "dx"),
                                             "backward_filter": ("x", "dy", "dw")}
#: the variants of each op.  Forward: the seed's Solutions A and B.  Backward data and filter: "A" runs every
#: sample of an output row in one GEMM (dy swapped to h-n-w-c in the workspace where n > 1: fewer, larger GEMMs,
#: more workspace); "B" runs per sample (dL / L only; backward filter's n*P calls are offered up to MAX_GEMM_CALLS)
VARIANTS: dict[str, tuple[str, ...]] = {"forward": ("A", "B"), "backward_data": ("A", "B"),
                                        "backward_filter": ("A", "B")}
#: workspace buffers start at multiples of this (cuBLAS and vector loads like aligned operands)
WORKSPACE_ALIGN = 256
#: per-sample backward filter launches n*P GEMMs from the host; past this many the host is the bottleneck
MAX_GEMM_CALLS = 64


def align_up(nbytes: int, to: int = WORKSPACE_ALIGN) -> int:
    return -(-nbytes // to) * to


@dataclass(frozen=True)
class Program:
    """One MEC configuration at micro-batch ``n``: steps run in order on CuPy's current stream, on the operands
    (:data:`OPERANDS`) and the workspace buffers of ``segments`` (name, byte offset, bytes)."""

    op: str
    variant: str
    n: int
    steps: tuple[Step, ...]
    segments: tuple[tuple[str, int, int], ...]

    @property
    def workspace_bytes(self) -> int:
        """Exactly the bytes the steps touch from the workspace's start (the last segment is not padded)."""
        return max((off + size for _, off, size in self.segments), default=0)

    @property
    def gemm_calls(self) -> int:
        return sum(isinstance(s, Gemm) for s in self.steps)


def _segments(sizes: list[tuple[str, int]]) -> tuple[tuple[str, int, int], ...]:
    out, off = [], 0
    for name, size in sizes:
        out.append((name, off, size))
        off = align_up(off + size)
    return tuple(out)


def refusal(g: MecGeometry, op: str, variant: str, n: int) -> str | None:
    """Why ``variant`` of ``op`` does not run at micro-batch ``n`` (None: it does)."""
    if op not in VARIANTS:
        raise InputError(f"must be one of {', '.join(VARIANTS)}, got {op!r}", "op")
    if variant not in VARIANTS[op]:
        raise InputError(f"{op} has variants {', '.join(VARIANTS[op])}, got {variant!r}", "variant")
    if n < 1:
        raise InputError(f"must be positive, got {n}", "n")
    if op == "forward" and variant == "A" and not g.solution_a_allowed(n):
        return f"Solution A permutes y through L, and |y| = {n * g.p * g.q * g.k} > |L| = {g.lowered_elements(n)}"
    if op == "backward_filter" and variant == "B":
        if n == 1:
            return "at n = 1 the per-sample plan is variant A's"
        if n * g.p > MAX_GEMM_CALLS:
            return f"n*P = {n * g.p} GEMM calls per step, over {MAX_GEMM_CALLS}"
    return None


def program(g: MecGeometry, op: str, variant: str, n: int, itemsize: int | None = None) -> Program:
    """The steps and workspace of ``variant`` of ``op`` at micro-batch ``n`` (elements of ``itemsize`` bytes,
    default the problem's dtype).  Forward "A" assumes beta = 0 (its GEMM writes y in h-n-w-c order over y's old
    contents): a caller with beta != 0 runs "B" instead, in the same workspace."""
    why = refusal(g, op, variant, n)
    if why:
        raise InputError(f"{op} variant {variant} at n = {n}: {why}", "variant")
    e = DTYPE_BYTES[g.dtype] if itemsize is None else itemsize
    lowered = g.lowered_elements(n)
    y_elems = n * g.p * g.q * g.k
    qk = g.q * g.k
    steps: list[Step]
    if op == "forward":
        if variant == "A":
            gemms = [replace(gm, beta=0.0) for gm in g.forward_gemms(n, "A")]
            steps = [Lower("x", "L"), *gemms, Swap("y", "L", g.p, n, qk), Copy("L", "y", y_elems)]
        else:
            steps = [Lower("x", "L"), *g.forward_gemms(n, "B")]
        return Program(op, variant, n, tuple(steps), _segments([("L", lowered * e)]))
    swapped = variant == "A" and n > 1
    dy = "dyT" if swapped else "dy"
    pre: list[Step] = [Swap("dy", "dyT", n, g.p, qk)] if swapped else []
    sizes = [("dL" if op == "backward_data" else "L", lowered * e)] + ([("dyT", y_elems * e)] if swapped else [])
    if op == "backward_data":
        if variant == "A":
            gemms = g.backward_data_gemms_hnwc(n, dy)
        else:   # fewer host calls of the two batchings
            rows_calls = n * min(-(-g.r // g.stride[0]), g.p)
            gemms = g.backward_data_gemms(n, "rows" if rows_calls <= g.p else "samples")
        steps = [*pre, Zero("dL", lowered), *gemms, GatherDx("dL", "dx")]
    else:
        gemms = g.backward_filter_gemms_hnwc(n, dy) if variant == "A" else g.backward_filter_gemms(n)
        steps = [Lower("x", "L"), *pre, *gemms]
    return Program(op, variant, n, tuple(steps), _segments(sizes))


def run_program(prog: Program, g: MecGeometry, operands: dict[str, np.ndarray], alpha: float = 1.0,
                beta: float = 0.0, gemm: Callable[..., None] | None = None) -> None:
    """Execute ``prog`` with NumPy on flat operand arrays (by the names of :data:`OPERANDS`), as the GPU does:
    one workspace array whose unwritten elements are NaN, so a step reading what no step wrote shows.
    ``gemm(gemms, buffers, alpha, beta)`` replaces :func:`run_gemms` (the tests run cuBLAS's column-major view)."""
    gemm = run_gemms if gemm is None else gemm
    dtype = next(iter(operands.values())).dtype
    e = dtype.itemsize
    workspace = np.full(-(-prog.workspace_bytes // e), np.nan, dtype)
    bufs = dict(operands)
    for name, off, size in prog.segments:
        assert off % e == 0 and size % e == 0
        bufs[name] = workspace[off // e:(off + size) // e]
    n = prog.n
    for st in prog.steps:
        if isinstance(st, Gemm):
            gemm([st], bufs, alpha, beta)
        elif isinstance(st, Lower):
            low = lower_reference(bufs[st.src].reshape(g.x_shape(n)), g).reshape(-1)
            bufs[st.dst][:low.size] = low
        elif isinstance(st, Swap):
            size = st.outer * st.inner * st.row
            src = bufs[st.src][:size].reshape(st.outer, st.inner, st.row)
            bufs[st.dst][:size] = src.transpose(1, 0, 2).reshape(-1)
        elif isinstance(st, Zero):
            bufs[st.buf][:st.elements] = 0
        elif isinstance(st, Copy):
            bufs[st.dst][:st.elements] = bufs[st.src][:st.elements]
        elif isinstance(st, GatherDx):
            dx = bufs[st.dst]
            dx[:] = gather_dx_reference(bufs[st.src], g, n, dx.reshape(g.x_shape(n)), alpha, beta).reshape(-1)
        else:  # pragma: no cover - Step is closed
            raise TypeError(st)


def swap_word(row_bytes: int, src: int, dst: int) -> int:
    """The widest word (16, 8, 4 or 2 bytes) mec_swap can move rows of ``row_bytes`` in between byte addresses
    ``src`` and ``dst``: it must divide the row and both addresses."""
    for word in (16, 8, 4, 2):
        if row_bytes % word == 0 and src % word == 0 and dst % word == 0:
            return word
    raise InputError(f"rows of {row_bytes} bytes at {src:#x} -> {dst:#x} are not 2-byte aligned", "swap")

# ---- index math shared with mec.cu -----------------------------------------------------------------------------
def lowered_source(g: MecGeometry, t: int, q: int) -> tuple[int, int, int]:
    """mec_lower's thread ``t`` of L row (n, q) (``t < LH*S*C``): (x row, x column, channel) it copies, the row
    or column outside ``[0, h) x [0, w)`` for padding (written as 0)."""
    sc = g.s * g.c
    hh, rem = divmod(t, sc)
    j, ch = divmod(rem, g.c)
    return hh - g.pad[0], q * g.stride[1] + j - g.pad[1], ch


def dx_gather_range(wp: int, sw: int, s: int, q: int) -> range:
    """The lowered columns ``qq`` whose window covers padded input column ``wp`` (tap ``j = wp - qq*sw``), as
    mec_gather_dx loops over them: ``ceil((wp - s + 1)/sw) <= qq <= min(q - 1, wp // sw)``."""
    lo = (wp - s) // sw + 1 if wp >= s else 0
    return range(lo, min(q - 1, wp // sw) + 1)


# ---- NumPy references (float64 or the input's dtype) ----------------------------------------------------------
def run_gemms(gemms: list[Gemm], buffers: dict[str, np.ndarray], alpha: float = 1.0, beta: float = 0.0) -> None:
    """Execute ``gemms`` on the flat (1-D, contiguous) arrays of ``buffers`` as a strided-batched BLAS would."""
    from numpy.lib.stride_tricks import as_strided

    def view(buf: np.ndarray, off: int, rows: int, cols: int, ld: int, stride: int, batch: int) -> np.ndarray:
        e = buf.itemsize
        last = off + (batch - 1) * stride + (rows - 1) * ld + cols
        if off < 0 or last > buf.size:
            raise IndexError(f"GEMM operand [{off}, {last}) outside a buffer of {buf.size}")
        return as_strided(buf[off:], (batch, rows, cols), (stride * e, ld * e, e), writeable=False)

    for gm in gemms:
        a = view(buffers[gm.a], gm.a_offset, *((gm.k, gm.m) if gm.trans_a else (gm.m, gm.k)), gm.lda, gm.stride_a,
                 gm.batch)
        b = view(buffers[gm.b], gm.b_offset, *((gm.n, gm.k) if gm.trans_b else (gm.k, gm.n)), gm.ldb, gm.stride_b,
                 gm.batch)
        a = a.transpose(0, 2, 1) if gm.trans_a else a
        b = b.transpose(0, 2, 1) if gm.trans_b else b
        out = buffers[gm.c]
        bt = beta if gm.beta is None else gm.beta
        al = alpha if gm.alpha is None else gm.alpha
        for i in range(gm.batch):   # entries in order; a GPU runs them concurrently (they never share outputs)
            o = gm.c_offset + i * gm.stride_c
            c = as_strided(out[o:], (gm.m, gm.n), (gm.ldc * out.itemsize, out.itemsize))
            c[...] = al * (a[i] @ b[i]) + (bt * c if bt != 0 else 0)


def lower_reference(x: np.ndarray, g: MecGeometry) -> np.ndarray:
    """L ``[N, Q, LH, S, C]`` from NHWC x (Algorithm 2, lines 4-6), padding as zeros."""
    n = x.shape[0]
    ph, pw = g.pad
    xp = np.zeros((n, g.lh, (g.q - 1) * g.stride[1] + g.s, g.c), x.dtype)
    rows, cols = min(g.h, g.lh - ph), min(g.w, xp.shape[2] - pw)
    xp[:, ph:ph + rows, pw:pw + cols] = x[:, :rows, :cols]
    out = np.empty(g.lowered_shape(n), x.dtype)
    for q in range(g.q):
        out[:, q] = xp[:, :, q * g.stride[1]:q * g.stride[1] + g.s]
    return out


def solution_a_permutation(y_hnwc: np.ndarray, lowered: np.ndarray, g: MecGeometry, n: int) -> np.ndarray:
    """Algorithm 2 lines 14-19: copy y (h-n-w-c) into L's space, then permute it back into y as n-h-w-c."""
    size = n * g.p * g.q * g.k
    lowered[:size] = y_hnwc[:size]
    y_hnwc[:size] = lowered[:size].reshape(g.p, n, g.q * g.k).transpose(1, 0, 2).reshape(-1)
    return y_hnwc


def conv_forward_reference(x: np.ndarray, w: np.ndarray, g: MecGeometry, solution: str = "B",
                           batch_over: str | None = None) -> np.ndarray:
    """y ``[N, P, Q, K]`` by Algorithm 2: lowering, then the GEMMs of ``solution`` on L's flat storage."""
    n = x.shape[0]
    lowered = lower_reference(x, g).reshape(-1)
    y = np.zeros(n * g.p * g.q * g.k, np.result_type(x, w))
    run_gemms(g.forward_gemms(n, solution, batch_over), {"L": lowered, "w": np.ascontiguousarray(w).reshape(-1),
                                                         "y": y})
    if solution == "A":
        solution_a_permutation(y, lowered, g, n)
    return y.reshape(g.y_shape(n))


def gather_dx_reference(d_lowered: np.ndarray, g: MecGeometry, n: int, dx: np.ndarray | None = None,
                        alpha: float = 1.0, beta: float = 0.0) -> np.ndarray:
    """dx = alpha * (the sum of dL's entries each dx element was lowered to) + beta * dx: mec_gather_dx."""
    dl = d_lowered.reshape(g.lowered_shape(n))
    acc = np.zeros(g.x_shape(n), dl.dtype)
    rows = max(0, min(g.h, g.lh - g.pad[0]))    # dx rows past LH are in no window: gradient 0
    for col in range(g.w):
        wp = col + g.pad[1]
        for qq in dx_gather_range(wp, g.stride[1], g.s, g.q):
            acc[:, :rows, col] += dl[:, qq, g.pad[0]:g.pad[0] + rows, wp - qq * g.stride[1]]
    return alpha * acc + (beta * dx if beta != 0 else 0)


def backward_data_reference(dy: np.ndarray, w: np.ndarray, g: MecGeometry, dx: np.ndarray | None = None,
                            alpha: float = 1.0, beta: float = 0.0, batch_over: str | None = None) -> np.ndarray:
    """dx ``[N, H, W, C]``: the GEMMs into a zeroed dL, then the gather (the lowering's adjoint)."""
    n = dy.shape[0]
    d_lowered = np.zeros(g.lowered_elements(n), np.result_type(dy, w))
    run_gemms(g.backward_data_gemms(n, batch_over), {"dy": np.ascontiguousarray(dy).reshape(-1),
                                                     "w": np.ascontiguousarray(w).reshape(-1), "dL": d_lowered})
    return gather_dx_reference(d_lowered, g, n, dx, alpha, beta)


def backward_filter_reference(x: np.ndarray, dy: np.ndarray, g: MecGeometry, dw: np.ndarray | None = None,
                              alpha: float = 1.0, beta: float = 0.0) -> np.ndarray:
    """dw ``[K, R, S, C]`` = alpha * (lowered x against dy, summed over samples and rows) + beta * dw."""
    n = x.shape[0]
    out = (np.zeros(g.k * g.rsc, np.result_type(x, dy)) if dw is None
           else np.array(dw, np.result_type(x, dy, dw)).reshape(-1))
    run_gemms(g.backward_filter_gemms(n), {"L": lower_reference(x, g).reshape(-1),
                                           "dy": np.ascontiguousarray(dy).reshape(-1), "dw": out}, alpha, beta)
    return out.reshape(g.w_shape())


# ---- GPU launchers (mec.cu), on raw device pointers ------------------------------------------------------------
LowerFn = Callable[[int, int], None]
GatherDxFn = Callable[[int, int, float, float], None]


def launchers(g: MecGeometry, n: int, itemsize: int) -> tuple[LowerFn, GatherDxFn]:
    """``lower(x, L)`` and ``gather_dx(dL, dx, alpha, beta)`` for ``n`` samples of ``g`` on CuPy's current stream;
    the pointers address C-contiguous ``g.x_shape(n)`` / ``g.lowered_shape(n)`` tensors.  gather_dx reads dx
    only when beta != 0; its dx rows beyond L's get alpha * 0."""
    if itemsize not in _CTYPE:
        raise InputError(f"element size {itemsize} bytes is not supported (float32 or float16)", "itemsize")
    if n < 1:
        raise InputError(f"must be positive, got {n}", "n")
    if g.q > _MAX_Z or g.h > _MAX_Z:
        raise InputError(f"Q and H must be at most {_MAX_Z}: {g}", "geometry")
    i32 = np.int32
    geo = tuple(i32(v) for v in (g.c, g.h, g.w, g.s, *g.pad, g.stride[1], g.q, g.lh))
    x_bytes = g.h * g.w * g.c * itemsize
    l_bytes = g.q * g.lowered_row * itemsize
    lower_name, gather_name = f"mec_lower<{_CTYPE[itemsize]}>", f"mec_gather_dx<{_CTYPE[itemsize]}>"
    # grids: lower (row of L / 256, Q, N); gather (dx row / 256, H, N); grid.z split past _MAX_Z samples
    lower_xy = (-(-g.lowered_row // _THREADS), g.q)
    gather_xy = (-(-(g.w * g.c) // _THREADS), g.h)
    chunks = [(n0, min(_MAX_Z, n - n0)) for n0 in range(0, n, _MAX_Z)]

    def lower(x: int, lowered: int) -> None:
        k = _compile.get_kernel(SOURCE, lower_name)
        for n0, nz in chunks:
            k(lower_xy + (nz,), (_THREADS,), (x + n0 * x_bytes, lowered + n0 * l_bytes) + geo)

    def gather_dx(d_lowered: int, dx: int, alpha: float, beta: float) -> None:
        k = _compile.get_kernel(SOURCE, gather_name)
        scalars = (np.float32(alpha), np.float32(beta))
        for n0, nz in chunks:
            k(gather_xy + (nz,), (_THREADS,), (d_lowered + n0 * l_bytes, dx + n0 * x_bytes) + geo + scalars)

    return lower, gather_dx


_WORD = {16: "uint4", 8: "uint2", 4: "unsigned int", 2: "unsigned short"}
Swapper = Callable[[int, int], None]


def swap_launcher(outer: int, inner: int, row: int, itemsize: int) -> Swapper:
    """``swap(src, dst)``: mec_swap of ``[outer][inner][row]`` elements of ``itemsize`` bytes into
    ``[inner][outer][row]`` on CuPy's current stream, in the widest word the row and the two pointers allow."""
    if min(outer, inner, row) < 1:
        raise InputError(f"sizes must be positive, got {outer} x {inner} x {row}", "swap")
    row_bytes = row * itemsize
    if row_bytes // 2 >= 1 << 31:
        raise InputError(f"a row of {row_bytes} bytes is too long", "swap")
    grid = {w: (-(-(row_bytes // w) // _THREADS), min(inner, _MAX_Z), min(outer, _MAX_Z)) for w in _WORD}
    args = {w: (np.int32(outer), np.int32(inner), np.int32(row_bytes // w)) for w in _WORD}

    def swap(src: int, dst: int) -> None:
        word = swap_word(row_bytes, src, dst)
        k = _compile.get_kernel(SOURCE, f"mec_swap<{_WORD[word]}>")
        k(grid[word], (_THREADS,), (src, dst) + args[word])

    return swap
