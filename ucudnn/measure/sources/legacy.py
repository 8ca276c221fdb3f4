"""Legacy cuDNN algorithms: ``cudnnFind*AlgorithmEx`` enumerates, CUDA events re-time.

cuDNN 9's Find returns one algorithm id several times, under different math
types and workspace sizes, so a micro-configuration is (micro-batch, algo,
math type).  Find's own timing is one noisy run; unless ``repeat`` is 0 each
successful configuration is re-run and the median of ``repeat`` event-timed
runs is recorded (eagerly, or replayed from a CUDA graph: ``BenchSettings.timing``).
Failures (unsupported, out of memory, not capturable) become ``Skipped`` rows
with the reason; nothing raises out of :meth:`measure`.

Fast benchmarking: Find has already timed every algorithm, so its times are
the first estimate :class:`~ucudnn.measure.sources.base.Pruner` works with.
Configurations are re-timed fastest-by-Find first; one dominated by Find's
times (slower by ``prune_margin``, needing no less workspace) or met after the
kernel's budget is spent is recorded with Find's time and
``extra["timed"] = "find"`` (``extra["pruned"]`` says why); so is one whose Find time is over
``split_margin`` times what WR can already do at that size with no more workspace, mostly by running it as
smaller micro-batches measured before (split dominance,
:class:`~ucudnn.measure.sources.base.SplitReference`: Find times every algorithm anyway, so the rule saves
the re-timing only); one whose first sample is hopeless is recorded
with that sample and ``extra["timed"] = "first-sample"``.  Re-timed ones carry
``extra["timed"] = "median"``.

Find is the benchmark's window for host work (:mod:`.overlap`): while it runs, the overlap helper prepares
other sources' configurations (the graph source's heuristics, builds and note probes).

Execution through twins: cuDNN 9 runs every legacy call on a graph-API engine and finalizes that engine's
configuration again at each call.  For the transform-domain algorithms (FFT, FFT_TILING, WINOGRAD_NONFUSED) the
engine is fixed (:data:`~ucudnn.legacy_engines.TWIN_ENGINES`), so :meth:`LegacySource.prepare` builds it once
through the graph source (its *twin*: same workspace, numerics no looser) and runs it for the calls that do not
accumulate: the same kernels with 20-60 us less host work a call (``benchmarks/results/legacy_twins_h200-notes.md``).
Benchmarks keep timing the legacy call itself.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from ... import config as config_module
from ... import numerics as num
from ...binding import cudnn
from ...binding.gpu import current_device, descriptors, handle, handle_on
from ...binding.timing import HostRecorder
from ...errors import CaptureError, CudnnError, UcudnnError
from ...legacy_engines import twin_engines
from ...planning.table import Measurement, Skipped
from ...problem import ConvProblem
from .base import (BenchSettings, Launch, Native, Operands, Prepared, Pruner, host_extra, identity, time_config,
                   timed_beta)
from .overlap import OVERLAP


class LegacySource(Prepared):
    name = "legacy"
    channel_slices = True   # descriptors take y as a strided view (binding.gpu.descriptors)

    def measure(self, op: str, problem: ConvProblem, ops: Operands, workspace: int,
                settings: BenchSettings) -> tuple[list[Measurement], list[Skipped]]:
        mb = problem.n
        det_only = num.deterministic_only(settings.numerics)
        h = handle()
        results: list[cudnn.PerfResult] = []
        skipped: list[Skipped] = []
        for desc_math in num.find_math_types(settings.numerics, problem.dtype):   # one Find can return several
            d = descriptors(problem, desc_math)
            a, b, out = d.operands(op)
            requested = 2 * cudnn.get_algorithm_max_count(h, op)
            try:
                with OVERLAP.window():   # Find waits on the GPU with the GIL released: other sources prepare meanwhile
                    results += cudnn.find_algorithm_ex(h, op, a, ops.a, b, ops.b, d.conv, out, ops.out, requested,
                                                       workspace, settings.max_workspace)
            except CudnnError as e:
                skipped.append(Skipped(mb, None, desc_math, f"{e.call}: {e.status_name}"))
        allowed = set(num.allowed_math_types(settings.numerics, problem.dtype))
        beta = timed_beta(op, problem)   # not Find's beta = 0 (see timed_beta)
        candidates: list[cudnn.PerfResult] = []
        seen: set[tuple[int, str]] = set()
        for r in results:
            key = (r.algo, r.math_type)
            if key in seen:
                continue
            seen.add(key)
            if r.math_type not in allowed:
                continue  # another numerics mode's configuration: not ours to record
            if r.status != 0:
                skipped.append(Skipped(mb, r.algo, r.math_type, r.status_name))
                continue
            if det_only and not r.deterministic:
                skipped.append(Skipped(mb, r.algo, r.math_type, "non-deterministic"))
                continue
            if r.workspace_bytes > settings.max_workspace:
                skipped.append(Skipped(mb, r.algo, r.math_type,
                                       f"needs {r.workspace_bytes} bytes, over the benchmark cap"))
                continue
            candidates.append(r)
        measured: list[Measurement] = []
        pruner = Pruner(settings, trust_long=beta == 0.0,   # Find times with beta = 0: no estimate of a beta = 1 call
                        split=settings.split_reference(problem))        # split dominance: Find's time decides
        # fastest by Find first: dominators and the best re-timed time are known before they are needed
        for r in sorted(candidates, key=lambda r: (r.time_ms, r.workspace_bytes)):
            extra = {"deterministic": r.deterministic}
            config = Measurement(mb, r.algo, r.math_type, r.time_ms, r.workspace_bytes, extra=extra)
            if settings.repeat <= 0:
                measured.append(config)
                continue
            why = pruner.decide(r.time_ms, r.workspace_bytes, identity(config))   # Find's estimate
            if why is not None:
                pruner.record(r.time_ms, r.workspace_bytes, None, why)
                measured.append(Measurement(mb, r.algo, r.math_type, max(r.time_ms, 1e-6), r.workspace_bytes,
                                            extra={**extra, "timed": "find", "pruned": why}))
                continue
            try:
                launch = self.prepare(op, problem, config, twin=False)   # as Find timed it; no plan builds
                with HostRecorder() as host:
                    t, how = pruner.retime(lambda give_up: time_config(
                        lambda: launch(ops, workspace, r.workspace_bytes, 1.0, beta), settings, give_up=give_up),
                        r.time_ms, r.workspace_bytes)
            except CudnnError as e:
                skipped.append(Skipped(mb, r.algo, r.math_type, f"{e.call}: {e.status_name}"))
                continue
            except CaptureError as e:
                skipped.append(Skipped(mb, r.algo, r.math_type, str(e)))
                continue
            measured.append(Measurement(mb, r.algo, r.math_type, max(t, 1e-6), r.workspace_bytes,
                                        extra={**extra, "find_time_ms": round(r.time_ms, 6), "timed": how,
                                               **host_extra(host.ms)}))
        return measured, skipped

    def prepare(self, op: str, problem: ConvProblem, config: Measurement, twin: bool = True) -> Launch:
        """The configuration's launcher: the legacy call, or where the algorithm has a graph-API twin
        (:func:`twin_of`; ``twin`` False: never) that twin's plan for calls with alpha 1 and beta 0, the legacy
        call for the others (a twin built with beta 0 would need scratch beyond the legacy workspace to add)."""
        d = descriptors(problem, config.math_type)   # the launcher refers to d, so d outlives the descriptor cache
        a, b, out = d.operands(op)
        algo = int(config.algo)
        call = cudnn.convolution

        def launch(ops: Operands, workspace: int, workspace_bytes: int, alpha: float, beta: float) -> None:
            call(handle(), op, alpha, a, ops.a, b, ops.b, d.conv, algo, workspace, workspace_bytes, beta, out, ops.out)

        launch.direct = _direct(op, d, a, b, out, algo)  # type: ignore[attr-defined]
        launch.native = Native("legacy", op, problem, (a, b, out, d.conv), algo, keep=d)  # type: ignore[attr-defined]
        graph_launch = twin_of(op, problem, config) if twin else None
        if graph_launch is None:
            return launch
        legacy_launch = launch
        from .graph import ALIGNMENT

        def twin_launch(ops: Operands, workspace: int, workspace_bytes: int, alpha: float, beta: float) -> None:
            if alpha == 1.0 and beta == 0.0 and not (ops.a | ops.b | ops.out) % ALIGNMENT:
                graph_launch(ops, workspace, workspace_bytes, alpha, beta)
            else:
                legacy_launch(ops, workspace, workspace_bytes, alpha, beta)

        twin_launch.direct = getattr(graph_launch, "direct", None) or launch.direct  # type: ignore[attr-defined]
        twin_launch.native = dataclasses.replace(  # type: ignore[attr-defined]
            launch.native, twin=getattr(graph_launch, "native", None))  # type: ignore[attr-defined]
        twin_launch.twin = graph_launch  # type: ignore[attr-defined]
        return twin_launch


def twin_of(op: str, problem: ConvProblem, config: Measurement) -> Launch | None:
    """The graph source's launcher of the engine cuDNN runs ``config``'s algorithm as (:func:`twin_engines`,
    :meth:`~ucudnn.measure.sources.graph.GraphSource.twin`), or None: not a transform-domain algorithm, not
    float32 data, twins turned off, no graph source here, or no engine that is provably the same algorithm."""
    engines = twin_engines(op, config.algo, problem.dtype)
    if not engines or not config_module.legacy_twins():
        return None
    try:
        from . import registry
        from .graph import GraphUnavailable

        graph = registry.get("graph")
    except Exception:  # noqa: BLE001 - no graph source in this installation
        return None
    try:
        cfg = graph.twin(op, problem, engines, config.workspace_bytes,  # type: ignore[attr-defined]
                         deterministic=bool(config.extra.get("deterministic", True)))
        return None if cfg is None else graph.prepare(op, problem, cfg)  # type: ignore[attr-defined]
    except (GraphUnavailable, CudnnError, UcudnnError):
        return None


def _direct(op: str, d: Any, a_desc: int, b_desc: int, out_desc: int, algo: int) -> Any:
    """The :data:`~.base.Direct` shortcut of one prepared legacy configuration: the cuDNN entry point and the
    scalars 1 and 0 bound at its first call (preparing loads nothing more than it did), the descriptors and
    algo at preparation (``d`` is kept alive by the closure, as by the launcher), this thread's handle for the
    current device bound to the caller's stream.  Legacy descriptors belong to no device: it never declines."""
    bound: list = []

    def direct(pa: int, pb: int, po: int, workspace: int, workspace_bytes: int, stream: int) -> bool:
        if not bound:
            bound.extend((*cudnn.entry_point(op), cudnn.scalar_ref(1.0), cudnn.scalar_ref(0.0)))
        fn, name, one, zero = bound
        status = fn(handle_on(stream, current_device()), one, a_desc, pa, b_desc, pb, d.conv, algo, workspace,
                    workspace_bytes, zero, out_desc, po)
        if status:
            raise CudnnError(name, status, cudnn.status_name(status))
        return True

    return direct
