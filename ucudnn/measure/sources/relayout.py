"""ucudnn's own layout kernels as an algorithm source: a kernel run in the other layout (NCHW <-> NHWC).

Why: cuDNN's fastest configurations depend on the layout, and a network's
tensors come in one.  Measured on an H100 (``benchmarks/results/graph_wr_*``):
FP32 strict AlexNet reaches 24.5 ms per step in NCHW (the FFT algorithms
exist for NCHW only) but 48.5 ms in NHWC; FP16 reaches 6.3 ms in NHWC but
9.6 ms in NCHW.  Moving a tensor between layouts costs only its bytes at copy
bandwidth (``ucudnn.kernels.layout``, ~90-98% of it on large tensors), so a
kernel can be cheaper run in the other layout than in its own.

A relayout configuration, at one micro-batch: transform the micro-batch's
inputs (and, with ``beta != 0``, the output) into the other layout inside the
workspace, run an inner source's configuration on them, and transform the
result back.  Its workspace is the three transformed operands (each 256-byte
aligned) plus the inner configuration's own; its time is the whole step
(transforms, inner call, and the host work between them) timed back to back
as execution runs it.  ``via`` keeps the inner time, the transforms' time
and their sum, which under-predicted small micro-batches (host-bound: four
transform launches per step) by up to 1.7x on an H100.  To the planner it
is one more (micro-batch, time, workspace) row, so WR picks it only where
it wins.  A step's transforms are prepared launchers on raw pointers
(:func:`ucudnn.kernels.layout.launcher`): through ``transform_layout`` and
array views a step cost 200-265 us of host time on an H100 host, several
times the transforms' GPU work, and relayout never won.  The measurement says what it wraps
under ``via`` (layout, inner source, inner time, transform time), and keeps
the inner ``algo``, ``math_type`` and ``engine`` from which the inner
configuration is rebuilt at execution.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

from ...binding.timing import time_ms
from ...planning.arena import align_up
from ...planning.table import Measurement, Skipped
from ...problem import ConvProblem
from .base import BenchSettings, Launch, Operands, timed_beta
from .wrapper import Wrapper

OTHER = {"NCHW": "NHWC", "NHWC": "NCHW"}


@lru_cache(maxsize=1024)
def other_layout(problem: ConvProblem) -> ConvProblem:
    """The same convolution with its tensors in the other layout (cached: every executed step asks)."""
    from dataclasses import replace

    return replace(problem, layout=OTHER[problem.layout])


def segments(op: str, problem: ConvProblem, itemsize: int) -> list[int]:
    """Aligned bytes of the transformed (a, b, out) at ``problem.n``: the workspace a relayout adds."""
    return [align_up(math.prod(s) * itemsize) for s in problem.operand_shapes(op)]


class RelayoutSource(Wrapper):
    """Configurations of ``inner`` sources run in the other layout through ucudnn's transform kernels."""

    name = "relayout"
    key = "via"

    # -- measuring ---------------------------------------------------------------------------
    def measure(self, op: str, problem: ConvProblem, ops: Operands, workspace: int,
                settings: BenchSettings) -> tuple[list[Measurement], list[Skipped]]:
        from ...binding.gpu import cupy, cupy_dtype

        mb = problem.n
        if problem.layout not in OTHER:
            return [], [Skipped(mb, None, None, f"relayout: no other layout for {problem.layout}")]
        cp = cupy()
        p2 = other_layout(problem)
        dt = cupy_dtype(problem.dtype)
        try:
            dst = [cp.empty(shape, dtype=dt) for shape in p2.operand_shapes(op)]
        except cp.cuda.memory.OutOfMemoryError as e:
            return [], [Skipped(mb, None, None, f"relayout: out of memory for the transformed operands: {e}")]
        there, back = _transforms(op, problem, p2, dt.itemsize)
        src = (ops.a, ops.b, ops.out)

        def transforms() -> None:
            there[0](src[0], dst[0].data.ptr)
            there[1](src[1], dst[1].data.ptr)
            if timed_beta(op):   # accumulating micro-batches bring the output in as well
                there[2](src[2], dst[2].data.ptr)
            back(dst[2].data.ptr, src[2])

        t_transform = time_ms(transforms, repeat=max(1, settings.repeat), warmup=1,
                              min_sample_ms=settings.min_sample_ms)
        extra_ws = sum(segments(op, p2, dt.itemsize))
        inner_ops = Operands(dst[0].data.ptr, dst[1].data.ptr, dst[2].data.ptr)
        measured: list[Measurement] = []
        skipped: list[Skipped] = []
        for inner in self.inner:
            ms, sk = self.measure_inner(inner, op, p2, inner_ops, workspace, settings)
            skipped += [Skipped(s.micro_batch, s.algo, s.math_type, f"relayout via {p2.layout} {inner.name}: {s.reason}")
                        for s in sk]
            cfgs: list[Measurement] = []
            for m in ms:
                via = {"layout": p2.layout, "source": inner.name, "inner_time_ms": round(m.time_ms, 6),
                       "transform_ms": round(t_transform, 6)}
                if "timed" in m.extra:
                    via["inner_timed"] = m.extra["timed"]
                cfg = Measurement(mb, m.algo, m.math_type, m.time_ms + t_transform, m.workspace_bytes + extra_ws,
                                  self.name, m.engine, {**m.extra, "via": via})
                if cfg.workspace_bytes > settings.max_workspace:
                    skipped.append(Skipped(mb, m.algo, m.math_type, f"relayout via {p2.layout} {inner.name}: needs "
                                           f"{cfg.workspace_bytes} bytes, over the benchmark cap"))
                    continue
                cfgs.append(cfg)
            rows, sk = self.timed_rows(op, problem, cfgs, ops, workspace, settings,
                                       f"relayout via {p2.layout} {inner.name}",
                                       lambda c: {**c.extra, "via": {**c.extra["via"],
                                                                     "sum_of_parts_ms": round(c.time_ms, 6)}})
            measured += rows
            skipped += sk
        return measured, skipped

    # -- running -----------------------------------------------------------------------------
    def prepare(self, op: str, problem: ConvProblem, config: Measurement) -> Launch:
        from ...binding.gpu import cupy_dtype
        from ...errors import UcudnnError

        via = config.extra.get("via") or {}
        p2 = other_layout(problem)
        if via.get("layout", p2.layout) != p2.layout:
            raise UcudnnError(f"relayout configuration runs via {via.get('layout')}, not {p2.layout}")
        dt = cupy_dtype(problem.dtype)
        segs = segments(op, p2, dt.itemsize)
        moved = sum(segs)
        inner, inner_cfg = self.inner_config(config, moved)
        inner_launch = inner.prepare(op, p2, inner_cfg)
        there, back = _transforms(op, problem, p2, dt.itemsize)
        offsets = (0, segs[0], segs[0] + segs[1])

        def launch(ops: Operands, workspace: int, workspace_bytes: int, alpha: float, beta: float) -> None:
            if workspace_bytes < moved:
                raise UcudnnError(f"relayout needs {moved} bytes of workspace for the transformed operands, "
                                  f"got {workspace_bytes}")
            a, b, out = (workspace + o for o in offsets)
            there[0](ops.a, a)
            there[1](ops.b, b)
            if beta != 0.0:
                there[2](ops.out, out)
            inner_launch(Operands(a, b, out), workspace + moved, workspace_bytes - moved, alpha, beta)
            back(out, ops.out)

        return launch


def _transforms(op: str, problem: ConvProblem, p2: ConvProblem, itemsize: int) -> tuple[list[Any], Any]:
    """Prepared transforms of ``op``'s (a, b, out) into ``p2``'s layout, and of out back: a step's host work is
    then a few launches on raw pointers, no array objects."""
    from ucudnn.kernels.layout import launcher

    into = problem.layout, p2.layout
    there = [launcher(shape, itemsize, *into) for shape in problem.operand_shapes(op)]
    return there, launcher(p2.operand_shapes(op)[2], itemsize, *reversed(into))

