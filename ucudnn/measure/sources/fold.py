"""ucudnn's fold kernels as an algorithm source: a strided convolution run as a stride-1 one over folded channels.

Why: cuDNN runs first layers badly -- few input channels (C = 3), a large
filter and a stride (AlexNet conv1: 11x11, stride 4).  Its fast engines for
them pad or fold the input inside a workspace that grows with the batch
(151-793 MiB at batch 256 on an H100, ``graph_wr_diagnosis_tf32.md``), so
under a 64 MiB limit they only run on small micro-batches.  Folding the
stride into channels (space-to-depth) is exact: output (n, k, p, q) sums
``w[k, c, sh*rb + i, sw*sb + j] * xpad[n, c, sh*(p + rb) + i, sw*(q + sb) + j]``,
which is a stride-1 convolution of the folded input ``xf[n, (i*sw + j)*C + c,
hb, wb] = xpad[n, c, sh*hb + i, sw*wb + j]`` with the folded filter (taps past
R x S are zero).  AlexNet conv1 becomes 3x3 over 48 channels -- a shape
tensor-core engines run well: PyTorch (unbounded workspace, TF32, NHWC,
n = 64) took 0.349 ms for conv1 forward and 0.093 ms for its folded form.

A fold configuration, at one micro-batch: pack the x and w operands into the
workspace in folded form (y is never folded: the folded convolution has the
same output), run an inner source's configuration on the folded problem, and
unpack a folded result (backward data: dx, backward filter: dw) into the
caller's tensor with the caller's alpha and beta.  The folded problem may run
in the other layout: the pack writes it there at no extra cost and y goes
through ucudnn's transform kernels.  Its workspace is the staged operands
(each 256-byte aligned) plus the inner configuration's own;
its time is the whole step timed back to back as execution runs it.  The
inner configurations are those of the sources it wraps (legacy, graph, or a
relayout of them), so to the planner fold is one more (micro-batch, time,
workspace) row that WR takes only where it wins.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Sequence

from ...planning.arena import align_up
from ...planning.pareto import pareto
from ...planning.table import Measurement, Skipped
from ...problem import DTYPE_BYTES, ROLES, ConvProblem
from .base import AlgorithmSource, BenchSettings, Launch, Operands
from .relayout import OTHER
from .wrapper import Wrapper

#: Folding multiplies the channels by sh*sw; beyond this the folded filter is mostly zero taps (a 1x1 stride-2
#: convolution would do 4x the arithmetic), so only first-layer-like problems are offered.
MAX_FOLDED_CHANNELS = 64
#: The dtypes the fold kernels are built for (kernels/fold.cu: float and half).
FOLDED_DTYPES = ("float32", "float16")


def fold_refusal(problem: ConvProblem) -> str | None:
    """Why ``problem`` is not folded, or None when it is."""
    sh, sw = problem.stride
    if sh == 1 and sw == 1:
        return "stride 1: nothing to fold"
    if problem.dilation != (1, 1):
        return "dilated convolutions are not folded"
    if problem.groups != 1:
        return "grouped convolutions are not folded"
    if problem.dtype not in FOLDED_DTYPES:
        return f"{problem.dtype} is not folded (float32, float16)"
    if problem.c * sh * sw > MAX_FOLDED_CHANNELS:
        return f"{problem.c} channels x stride {sh}x{sw} exceed {MAX_FOLDED_CHANNELS} folded channels"
    return None


def fold_layouts(dtype: str, numerics: str, layout: str = "NCHW") -> tuple[str, ...]:
    """Which layouts a fold of a ``layout`` problem measures by default: where the math is FMA only (float32 under
    ``strict``) the NCHW one alone (``same`` for an NCHW problem, ``other`` for an NHWC one), else both.

    Why: the other layout pays where its engines run the folded problem better: on tensor cores, NHWC (NCHW TF32
    folded into NHWC on an H100); with FMA only, NCHW, where cuDNN keeps its FFT and Winograd algorithms.  On the
    recorded unpruned FP32 strict tables (H100, AlexNet b256 and ResNet-50 b128 NCHW, every conv1 op at every
    power-of-two size) the NHWC fold was 1.2-3x slower than the NCHW fold at each size and no WR or WD plan at any
    limit took it; on the AlexNet NHWC strict table the NCHW fold is what WR takes at 64 and 256 MiB (4.5% of the
    plan at 256 MiB).  Measuring the NHWC fold of an NCHW problem was half of fold's benchmarking time
    (``benchmarks/pruning_cost.py``, "fold layouts")."""
    from ...numerics import allowed_math_types

    if allowed_math_types(numerics, dtype) != ("FMA",):
        return ("same", "other")
    return ("same",) if layout == "NCHW" else ("other",)


@lru_cache(maxsize=1024)
def folded_problem(problem: ConvProblem, layout: str | None = None) -> ConvProblem:
    """The stride-1, unpadded convolution over folded channels that computes the same output, with its tensors
    in ``layout`` (default: the problem's)."""
    from ...errors import InputError

    why = fold_refusal(problem)
    if why:
        raise InputError(f"cannot fold {problem.describe()}: {why}", "problem")
    sh, sw = problem.stride
    rb, sb = -(-problem.r // sh), -(-problem.s // sw)
    return ConvProblem(problem.n, problem.c * sh * sw, problem.p + rb - 1, problem.q + sb - 1, problem.k, rb, sb,
                       dtype=problem.dtype, layout=layout or problem.layout)


def geometries(problem: ConvProblem, layout: str | None = None):
    """(x's, w's) :class:`ucudnn.kernels.fold.FoldGeometry` into ``layout``: the input folds with the padding, the
    filter without."""
    from ucudnn.kernels.fold import FoldGeometry

    f = folded_problem(problem, layout)
    x = FoldGeometry(problem.c, problem.h, problem.w, problem.stride, problem.pad, (f.h, f.w), problem.layout,
                     f.layout)
    w = FoldGeometry(problem.c, problem.r, problem.s, problem.stride, (0, 0), (f.r, f.s), problem.layout, f.layout)
    return x, w


def segments(op: str, problem: ConvProblem, layout: str | None = None) -> dict[str, int]:
    """Aligned bytes of ``op``'s operands in the workspace at ``problem.n``, by role: x and w folded, and y only
    when folding into the other layout (the folded convolution's y is the problem's, in its own layout)."""
    f = folded_problem(problem, layout)
    size = DTYPE_BYTES[problem.dtype]
    return {role: align_up(math.prod(f.shape(role)) * size) for role in ROLES[op]
            if role != "y" or f.layout != problem.layout}


def _pareto(ms: list[Measurement]) -> tuple[list[Measurement], int]:
    """The inner configurations no other beats in both time and workspace (:func:`ucudnn.planning.pareto.pareto`), and
    how many were dropped.

    Folding adds the same work to every inner configuration at a size, so a dominated one stays dominated:
    timing it folded would cost benchmark time and never change a plan."""
    keep = pareto(ms, lambda m: m.time_ms, lambda m: m.workspace_bytes)
    return keep, len(ms) - len(keep)


class FoldSource(Wrapper):
    """Configurations of ``inner`` sources run on the folded problem through ucudnn's fold kernels.

    ``layouts``: fold into the problem's own layout (``same``), the other one (``other``: the fold kernels write
    either at no extra cost, y goes through ucudnn's transform kernels), or both: where the best engines want the
    other layout (NCHW TF32 on an H100), a fold into it needs one folded x in the workspace, not two.  The default
    (None) is :func:`fold_layouts`: both where the math may use tensor cores, NCHW alone where it is FMA only (FP32
    ``strict``)."""

    name = "fold"
    key = "fold"
    estimate_is_lower_bound = True   # a fold row's estimate is its inner configuration's time: the step adds packs

    def __init__(self, inner: Sequence[AlgorithmSource | str] = ("legacy",), layouts: Sequence[str] | None = None):
        super().__init__(inner)
        if layouts is not None and (not layouts or any(x not in ("same", "other") for x in layouts)):
            raise ValueError(f"layouts must name same and/or other, got {list(layouts)}")
        self.layouts = None if layouts is None else tuple(layouts)

    def layouts_for(self, problem: ConvProblem, numerics: str) -> tuple[str, ...]:
        """The layouts ``measure`` folds ``problem`` into under ``numerics``: the ones given, else
        :func:`fold_layouts`."""
        return self.layouts if self.layouts is not None else fold_layouts(problem.dtype, numerics, problem.layout)

    # -- measuring ---------------------------------------------------------------------------
    def prefetch(self, op: str, problem: ConvProblem, settings: BenchSettings) -> bool:
        """Queue the inner sources' host preparation of the folded problems :meth:`measure` will ask them for
        (:mod:`.overlap`; the graph source's ``prefetch``); False when nothing was queued."""
        if fold_refusal(problem):
            return False
        queued = False
        for which in self.layouts_for(problem, settings.numerics):
            fp = folded_problem(problem, problem.layout if which == "same" else OTHER[problem.layout])
            for inner in self.inner:
                fn = getattr(inner, "prefetch", None)
                if fn is not None and fn(op, fp, settings):
                    queued = True
        return queued

    def measure(self, op: str, problem: ConvProblem, ops: Operands, workspace: int,
                settings: BenchSettings) -> tuple[list[Measurement], list[Skipped]]:
        why = fold_refusal(problem)
        if why:
            return [], [Skipped(problem.n, None, None, f"fold: {why}")]
        measured: list[Measurement] = []
        skipped: list[Skipped] = []
        for which in self.layouts_for(problem, settings.numerics):
            layout = problem.layout if which == "same" else OTHER[problem.layout]
            ms, sk = self._measure_into(layout, op, problem, ops, workspace, settings)
            measured += ms
            skipped += sk
        return measured, skipped

    def _measure_into(self, layout: str, op: str, problem: ConvProblem, ops: Operands, workspace: int,
                      settings: BenchSettings) -> tuple[list[Measurement], list[Skipped]]:
        from ...binding.gpu import cupy, cupy_dtype

        cp = cupy()
        mb = problem.n
        fp = folded_problem(problem, layout)
        segs = segments(op, problem, layout)
        try:
            staged = {role: cp.empty(fp.shape(role), dtype=cupy_dtype(problem.dtype)) for role in segs}
        except cp.cuda.memory.OutOfMemoryError as e:
            return [], [Skipped(mb, None, None, f"fold into {layout}: out of memory for the folded operands: {e}")]
        into, _, _ = _movers(problem, layout)
        src = dict(zip(ROLES[op], (ops.a, ops.b, ops.out)))
        for role in ROLES[op][:2]:   # the inner source measures on the real data, folded
            if role in staged:
                into[role](src[role], staged[role].data.ptr)
        inner_ops = Operands(*(staged[r].data.ptr if r in staged else src[r] for r in ROLES[op]))
        extra_ws = sum(segs.values())
        measured: list[Measurement] = []
        skipped: list[Skipped] = []
        for inner in self.inner:
            what = f"fold into {layout} via {inner.name}"
            ms, sk = self.measure_inner(inner, op, fp, inner_ops, workspace, settings, extra_ws)
            skipped += [Skipped(s.micro_batch, s.algo, s.math_type, f"{what}: {s.reason}") for s in sk]
            ms, dropped = _pareto(ms)
            if dropped:
                skipped.append(Skipped(mb, None, None, f"{what}: {dropped} inner configurations slower and larger "
                                                       "than another were not timed folded"))
            cfgs: list[Measurement] = []
            for m in ms:
                info = {"stride": list(problem.stride), "layout": layout, "source": inner.name,
                        "inner_time_ms": round(m.time_ms, 6)}
                if "timed" in m.extra:
                    info["inner_timed"] = m.extra["timed"]
                cfg = Measurement(mb, m.algo, m.math_type, m.time_ms, m.workspace_bytes + extra_ws, self.name,
                                  m.engine, {**m.extra, "fold": info})
                if cfg.workspace_bytes > settings.max_workspace:
                    skipped.append(Skipped(mb, m.algo, m.math_type, f"{what}: needs {cfg.workspace_bytes} bytes, "
                                                                    "over the benchmark cap"))
                    continue
                cfgs.append(cfg)
            # packs, inner call, unpack, back to back (under the fast-benchmarking rules: Wrapper.time_steps)
            rows, sk = self.timed_rows(op, problem, cfgs, ops, workspace, settings, what)
            measured += rows
            skipped += sk
        return measured, skipped

    # -- running -----------------------------------------------------------------------------
    def prepare(self, op: str, problem: ConvProblem, config: Measurement) -> Launch:
        from ...errors import UcudnnError

        info = config.extra.get("fold") or {}
        if list(info.get("stride", problem.stride)) != list(problem.stride):
            raise UcudnnError(f"fold configuration folds stride {info.get('stride')}, the problem's is "
                              f"{list(problem.stride)}")
        layout = info.get("layout", problem.layout)
        fp = folded_problem(problem, layout)
        segs = segments(op, problem, layout)
        moved = sum(segs.values())
        inner, inner_cfg = self.inner_config(config, moved)
        inner_launch = inner.prepare(op, fp, inner_cfg)
        into, unpack, y_back = _movers(problem, layout)
        roles = ROLES[op]
        offset, o = {}, 0
        for role, size in segs.items():
            offset[role], o = o, o + size
        staged_in = [(i, into[r], offset[r]) for i, r in enumerate(roles[:2]) if r in offset]
        out_role = roles[2]

        def launch(ops: Operands, workspace: int, workspace_bytes: int, alpha: float, beta: float) -> None:
            if workspace_bytes < moved:
                raise UcudnnError(f"fold needs {moved} bytes of workspace for the folded operands, "
                                  f"got {workspace_bytes}")
            ptr = [ops.a, ops.b, ops.out]
            for i, move, o in staged_in:
                move(ptr[i], workspace + o)
                ptr[i] = workspace + o
            rest, rest_bytes = workspace + moved, workspace_bytes - moved
            if out_role not in offset:          # forward in the problem's layout: y is the folded convolution's own
                inner_launch(Operands(*ptr), rest, rest_bytes, alpha, beta)
                return
            out = workspace + offset[out_role]
            if out_role == "y":                 # forward into the other layout: y there and back, as relayout does
                if beta != 0.0:
                    into["y"](ops.out, out)
                inner_launch(Operands(ptr[0], ptr[1], out), rest, rest_bytes, alpha, beta)
                y_back(out, ops.out)
                return
            inner_launch(Operands(ptr[0], ptr[1], out), rest, rest_bytes, 1.0, 0.0)
            unpack[out_role](out, ops.out, alpha, beta)

        return launch


def _movers(problem: ConvProblem, layout: str):
    """What moves a step's operands between the caller's tensors and the workspace, for a fold into ``layout``:
    ``into[role](plain, staged)`` (x and w pack; y transforms when the layouts differ), ``unpack[role](folded, plain,
    alpha, beta)`` for x and w, and ``y_back(staged, plain)`` (None when y is not staged)."""
    from ucudnn.kernels.fold import launchers

    xg, wg = geometries(problem, layout)
    size = DTYPE_BYTES[problem.dtype]
    (px, ux), (pw, uw) = launchers(xg, problem.n, size), launchers(wg, problem.k, size)
    into, y_back = {"x": px, "w": pw}, None
    if layout != problem.layout:
        from ucudnn.kernels.layout import launcher

        into["y"] = launcher(problem.y_shape(), size, problem.layout, layout)
        y_back = launcher(folded_problem(problem, layout).y_shape(), size, layout, problem.layout)
    return into, {"x": ux, "w": uw}, y_back
