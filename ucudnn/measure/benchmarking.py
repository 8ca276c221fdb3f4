"""Benchmarking kernels at every micro-batch size a batch policy asks for (GPU).

This is step (1) of WR: for each micro-batch size b, measure every
configuration every algorithm source offers.  Identical (problem, op) pairs
are measured once (ResNet repeats layers).  Output: a
:class:`~ucudnn.planning.table.BenchmarkTable`, the interchange format.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Iterable, Sequence

from .. import numerics as num
from .. import source_names
from ..binding import cudnn
from ..binding.gpu import cupy, cupy_dtype, device_name, free_memory
from ..errors import InputError
from ..planning.table import BenchmarkTable, KernelBench, Measurement, Skipped
from ..policy import channel_sizes, micro_batch_sizes, normalize_channel_policy
from ..problem import ConvProblem, KernelSpec
from .sources.base import TIMINGS, AlgorithmSource, BenchSettings, Operands
from .sources.overlap import OVERLAP


class Buffers:
    """Random x, w, y (and their gradients share them) for one problem at its full mini-batch.

    Micro-batches use prefixes: slicing along N keeps NCHW and NHWC contiguous.
    """

    def __init__(self, problem: ConvProblem):
        cp = cupy()
        dt = cupy_dtype(problem.dtype)
        rng = cp.random.default_rng(12345)
        self.problem = problem
        self.x = rng.standard_normal(problem.x_shape(), dtype="float32").astype(dt)
        self.w = rng.standard_normal(problem.w_shape(), dtype="float32").astype(dt)
        self.y = rng.standard_normal(problem.y_shape(), dtype="float32").astype(dt)
        self.dw = cp.empty_like(self.w)
        self.dx = cp.empty_like(self.x)
        self.out = cp.empty_like(self.y)

    def arrays(self, op: str) -> tuple:
        """(a, b, out) of ``op`` in cuDNN's operand order (see ucudnn.execute.executor.ROLES)."""
        return {"forward": (self.x, self.w, self.out), "backward_data": (self.w, self.y, self.dx),
                "backward_filter": (self.x, self.y, self.dw)}[op]

    def operands(self, op: str, micro_batch: int) -> Operands:
        # a micro-batch is a prefix of each batched tensor: same base pointers, smaller descriptors
        a, b, out = self.arrays(op)
        return Operands(a.data.ptr, b.data.ptr, out.data.ptr)


#: Sources that wrap the other sources named (see :func:`resolve_sources`)
WRAPPERS = source_names.WRAPPERS


def default_sources() -> list[AlgorithmSource]:
    """The default sources (:func:`ucudnn.source_names.default_names`: ``UCUDNN_SOURCES``, else legacy, graph
    where ``nvidia-cudnn-frontend`` is installed, and fold)."""
    return resolve_sources(source_names.default_names())


def resolve_sources(sources: Iterable[AlgorithmSource | str] | str | None) -> list[AlgorithmSource]:
    """Sources from names (``"legacy,graph"``, ``["legacy", "graph"]``) or instances; None: the defaults.

    Two names wrap the other sources named instead of measuring cuDNN directly: ``relayout`` runs them in
    the other layout through ucudnn's transform kernels, ``fold`` runs strided first layers as stride-1
    convolutions over folded channels through ucudnn's fold kernels (and wraps a relayout named too).
    ``"legacy,graph,relayout"``: both, and both again in the other layout; either wrapper alone wraps legacy.

    Names resolve through :mod:`ucudnn.measure.sources.registry`, so execution later
    finds the very instance that measured (the graph source keeps its built plans).
    """
    from .sources import registry

    if sources is None:
        return default_sources()
    sources = source_names.split(sources)
    base = [registry.get(s) if isinstance(s, str) else s for s in sources if s not in WRAPPERS]
    wrapped: dict[str, AlgorithmSource] = {}
    if "relayout" in sources:
        from .sources.relayout import RelayoutSource

        wrapped["relayout"] = RelayoutSource(base or ["legacy"])
    if "fold" in sources:
        from .sources.fold import FoldSource

        wrapped["fold"] = FoldSource(base + list(wrapped.values()) or ["legacy"])
    for w in wrapped.values():
        registry.register(w)
    out = [wrapped[s] if s in WRAPPERS else base.pop(0) for s in sources]
    if not out:
        raise InputError("name at least one algorithm source (legacy, graph)", "sources")
    return out


def benchmark(kernels: Sequence[KernelSpec], batch_policy: str = "powerOfTwo", numerics: str | None = None, *,
              sources: Iterable[AlgorithmSource | str] | str | None = None, repeat: int = BenchSettings.repeat, warmup: int = 1,
              min_sample_ms: float = BenchSettings.min_sample_ms,
              max_workspace: int | None = None, progress: bool | None = None, timing: str = "eager",
              prune_margin: float | None = BenchSettings.prune_margin,
              hopeless_factor: float | None = BenchSettings.hopeless_factor,
              kernel_budget_s: float | None = BenchSettings.kernel_budget_s,
              trust_estimate_ms: float | None = BenchSettings.trust_estimate_ms,
              split_margin: float | None = BenchSettings.split_margin,
              channel_policy: str | None = None, split_wrapped: bool = BenchSettings.split_wrapped,
              confirm_factor: float | None = BenchSettings.confirm_factor,
              overlap_cpu: bool = True) -> BenchmarkTable:
    """Measure ``kernels`` on the current device; never raises for an algorithm that fails.

    ``prune_margin``, ``hopeless_factor``, ``kernel_budget_s``, ``trust_estimate_ms``, ``split_margin``,
    ``split_wrapped``: fast benchmarking; ``confirm_factor``: a median far over its estimate timed again (:class:`~ucudnn.measure.sources.base.BenchSettings`; None / False turns a rule
    off).  The table records them.

    ``overlap_cpu``: while legacy's Find waits on the GPU, a helper thread prepares the sources' later configurations
    (the graph source's heuristics, builds and note probes: :mod:`ucudnn.measure.sources.overlap`); never while a
    configuration is timed, and the measurements do not depend on it, only the wall time.  False: everything inline.

    ``progress``: None (default) shows progress on stderr once the benchmark has run 2 s; True at once; False never.

    ``timing``: ``eager`` (the default) times each configuration called back to back as the executor runs a
    plan; ``replay`` times it captured into a CUDA graph, for plans their users capture and replay
    (:func:`ucudnn.measure.sources.base.time_config`).  The table records which.

    ``channel_policy`` (issue 18; :func:`ucudnn.policy.channel_sizes`): also measure slices of each ungrouped
    kernel's output channels at every micro-batch size, with the sources that run channel slices (legacy,
    graph: ``channel_slices = True``); the planners then cover k with them where that is faster under a limit.
    Default (None): ``UCUDNN_CHANNEL_POLICY`` (:func:`ucudnn.config.channel_policy`), ``none`` unless set.
    """
    if timing not in TIMINGS:
        raise InputError(f"unknown timing {timing!r}; use one of {', '.join(TIMINGS)}", "timing")
    cp = cupy()
    sources = resolve_sources(sources)
    dtypes = {k.problem.dtype for k in kernels}
    numerics = num.normalize(numerics, "float32" if "float32" in dtypes else next(iter(dtypes)))
    if max_workspace is None:   # a quarter of what allocations may still take (a torch cap included: gpu.free_memory)
        max_workspace = min(4 << 30, free_memory() // 4)
    settings = BenchSettings(numerics, repeat, warmup, max_workspace, min_sample_ms=min_sample_ms, timing=timing, prune_margin=prune_margin,
                             hopeless_factor=hopeless_factor, kernel_budget_s=kernel_budget_s,
                             trust_estimate_ms=trust_estimate_ms, split_margin=split_margin,
                             split_wrapped=split_wrapped, confirm_factor=confirm_factor)
    memo: dict[tuple[ConvProblem, str], KernelBench] = {}
    if channel_policy is None:
        from .. import config

        channel_policy = config.channel_policy()
    channel_policy = normalize_channel_policy(channel_policy)
    slicing = [s for s in sources if getattr(s, "channel_slices", False)]
    slices = {k.problem: channel_sizes(channel_policy, k.problem.k, k.problem.groups) if slicing else []
              for k in kernels}
    steps = sum(len(micro_batch_sizes(batch_policy, k.problem.n)) * (1 + len(slices[k.problem])) for k in kernels)
    bar = _progress(progress, steps)
    out: list[KernelBench] = []
    with OVERLAP.activated(overlap_cpu):   # host work prepared during Find (sources.overlap)
        try:
            for src in sources:   # per-benchmark state (the graph source's reused heuristics lists)
                if hasattr(src, "start_benchmark"):
                    src.start_benchmark()
            _prefetch(kernels, batch_policy, sources, settings)
            workspace = cp.cuda.alloc(max_workspace) if max_workspace else None
            ws_ptr = workspace.ptr if workspace is not None else 0
            bufs: dict[ConvProblem, Buffers] = {}
            for spec in kernels:
                key = (spec.problem, spec.op)
                if key in memo:
                    kb = memo[key]
                    out.append(KernelBench(spec.name, spec.op, spec.problem, kb.measurements, kb.skipped,
                                           0.0))
                    bar.advance(len(micro_batch_sizes(batch_policy, spec.problem.n)) * (1 + len(slices[spec.problem])),
                                spec.name)
                    continue
                t0 = time.perf_counter()
                measurements: list[Measurement] = []
                settings.start_kernel(spec.problem, measurements)   # split dominance reads the rows so far (+= extends)
                skipped: list[Skipped] = []
                try:
                    if spec.problem not in bufs:
                        bufs.clear()  # keep one problem's buffers alive at a time
                        bufs[spec.problem] = Buffers(spec.problem)
                    buf = bufs[spec.problem]
                except cp.cuda.memory.OutOfMemoryError as e:
                    skipped.append(Skipped(spec.problem.n, None, None, f"out of memory allocating tensors: {e}"))
                    buf = None
                for mb in micro_batch_sizes(batch_policy, spec.problem.n):
                    if buf is not None:
                        for src in sources:
                            ms, sk = src.measure(spec.op, spec.problem.with_batch(mb), buf.operands(spec.op, mb),
                                                 ws_ptr, settings)
                            measurements += [_tag(m, src.name) for m in ms]
                            skipped += sk
                    bar.advance(1, spec.name)
                for c in slices[spec.problem]:   # channel slices: the first c output channels, y as a strided view
                    for mb in micro_batch_sizes(batch_policy, spec.problem.n):
                        if buf is not None:
                            sub = spec.problem.with_batch(mb).with_channels(c)
                            for src in slicing:
                                ms, sk = src.measure(spec.op, sub, buf.operands(spec.op, mb), ws_ptr, settings)
                                measurements += [_tag(m, src.name, c) for m in ms]
                                skipped += sk
                        bar.advance(1, f"{spec.name} k{c}")
                cp.cuda.get_current_stream().synchronize()
                kb = KernelBench(spec.name, spec.op, spec.problem, measurements, skipped, time.perf_counter() - t0)
                memo[key] = kb
                out.append(kb)
        finally:
            bar.close()
    return BenchmarkTable(device_name(), cudnn.get_version(), out, numerics,
                          {"batch_policy": batch_policy, **({"channel_policy": channel_policy}
                                                            if channel_policy != "none" else {}),
                           "repeat": repeat, "min_sample_ms": min_sample_ms,
                           "timing": timing,
                           "cupy_version": cp.__version__, "sources": [s.name for s in sources],
                           **{f"{s.name}_top_k": s.top_k for s in sources if getattr(s, "top_k", None)},
                           "pruning": {"prune_margin": prune_margin, "hopeless_factor": hopeless_factor,
                                       "kernel_budget_s": kernel_budget_s, "trust_estimate_ms": trust_estimate_ms,
                                       "split_margin": split_margin, "split_wrapped": split_wrapped,
                                       "confirm_factor": confirm_factor}})


def _prefetch(kernels: Sequence[KernelSpec], batch_policy: str, sources: Sequence[AlgorithmSource],
              settings: BenchSettings) -> None:
    """Queue every source's host preparation (``prefetch``, where a source has one) in the order the benchmark
    loop will measure: kernel by kernel (each distinct (problem, op) once), micro-batch sizes ascending, sources in
    order (fold's inner problems after the graph source's own).  The helper works through the queue inside Find's
    windows; what it has not reached when needed runs inline (:mod:`ucudnn.measure.sources.overlap`)."""
    if not OVERLAP.active:
        return
    hooks = [getattr(s, "prefetch", None) for s in sources]
    if not any(hooks):
        return
    seen: set[tuple[ConvProblem, str]] = set()
    for spec in kernels:
        if (spec.problem, spec.op) in seen:
            continue
        seen.add((spec.problem, spec.op))
        for mb in micro_batch_sizes(batch_policy, spec.problem.n):
            for hook in hooks:
                if hook is not None:
                    hook(spec.op, spec.problem.with_batch(mb), settings)


def _tag(m: Measurement, source: str, channels: int | None = None) -> Measurement:
    if m.source == source and m.channels == channels:
        return m
    return dataclasses.replace(m, source=source, channels=channels)


class _progress:
    """Benchmark progress on stderr: a rich bar on a terminal, a plain line every 10 s otherwise.

    ``enabled``: True shows it from the start, False never, None (the default everywhere) shows it once the
    benchmark has run for :data:`PROGRESS_AFTER_S` (``UCUDNN_PROGRESS=0`` / ``1``: never / at once), so a
    first call that benchmarks says so instead of stalling silently, and quick benchmarks stay quiet.
    A timer thread starts it, since one micro-batch size of one kernel can take longer than the delay.
    """

    def __init__(self, enabled: bool | None, total: int):
        import os
        import threading

        env = os.environ.get("UCUDNN_PROGRESS", "").strip()
        if enabled is None and env in ("0", "1"):
            enabled = env == "1"
        self.total, self.done, self.what = total, 0, ""
        self._t0 = time.perf_counter()
        self._p = self._console = self._timer = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        if enabled is False:
            return
        self._timer = threading.Timer(0.0 if enabled else PROGRESS_AFTER_S, self._start)
        self._timer.daemon = True
        self._timer.start()

    def _start(self) -> None:
        import threading

        from rich.console import Console

        with self._lock:
            if self._stop.is_set():
                return
            self._console = Console(stderr=True)
            if self._console.is_terminal or self._console.is_jupyter:
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

                self._p = Progress(TextColumn("ucudnn benchmark {task.description:<24}"), BarColumn(),
                                   MofNCompleteColumn(), TimeRemainingColumn(), console=self._console,
                                   transient=False)
                self._p.start()
                self._task = self._p.add_task(self.what, total=self.total, completed=self.done)
                return
        self._line("benchmarking (results are cached: this happens once per kernel)")
        threading.Thread(target=self._tick, daemon=True).start()

    def _line(self, note: str = "") -> None:
        self._console.print(f"ucudnn: {self.done}/{self.total} micro-batch sizes measured, "
                            f"{time.perf_counter() - self._t0:.1f} s{f' ({self.what})' if self.what else ''}"
                            f"{f'; {note}' if note else ''}", highlight=False, soft_wrap=True)

    def _tick(self) -> None:
        while not self._stop.wait(PROGRESS_EVERY_S):
            with self._lock:
                self._line()

    def advance(self, n: int, what: str) -> None:
        with self._lock:
            self.done += n
            self.what = what
            if self._p is not None:
                self._p.update(self._task, advance=n, description=what)

    def close(self) -> None:
        with self._lock:
            self._stop.set()
            if self._timer is not None:
                self._timer.cancel()
            if self._p is not None:
                self._p.stop()
            elif self._console is not None:
                self._line("done")


#: Seconds a benchmark runs before its progress shows (issue 16: "whenever a benchmark takes longer than 2 s")
PROGRESS_AFTER_S = 2.0
#: Seconds between plain progress lines where stderr is not a terminal
PROGRESS_EVERY_S = 10.0
