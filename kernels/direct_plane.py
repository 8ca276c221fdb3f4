"""The single-channel forward by rows in ``direct.cu`` (``direct_plane``; issue 17): launch geometry, the launcher and a
CPU emulation of its index math, for the ``direct`` source's ``direct-plane`` configurations.

Why: the seed's single-channel kernel (``kernels/direct.py``) tiles each plane 32 columns by 32 rows, so a 28 x 28
plane leaves a quarter of its lanes and rows idle, and with a reduction of only R*S the idle lanes and the epilogue
are what separates it from writing y at bandwidth.  Here a thread is one (image, row group, column) slot of the whole
batch, and a block stages only the padded input rows its windows cover.
"""
from __future__ import annotations

import numpy as np

from ucudnn.errors import InputError
from ucudnn.problem import ConvProblem

from . import _compile
from .direct import _CTYPE, _MAX_Y, DEFAULT_SMEM, NT, SOURCE, Launcher, _staged, refusal

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
