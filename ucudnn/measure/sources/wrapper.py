"""Sources that run an inner source's configuration on a transformed problem (relayout, fold).

Kept apart from :mod:`.base` because a wrapper finds its inner sources by name
through :mod:`.registry`, and the registry needs :mod:`.base`'s protocol: here
both are below, so no module imports the other back.
"""
from __future__ import annotations

from typing import Callable, Sequence

from ...planning.table import Measurement, Skipped
from ...problem import ConvProblem
from . import registry
from ...errors import CaptureError
from .base import AlgorithmSource, BenchSettings, Operands, Prepared, Pruner, host_extra, time_config, timed_beta


class Wrapper(Prepared):
    """A source whose configurations run an inner source's configuration on a transformed problem (relayout,
    fold): the inner configuration travels in the measurement, plus one record under the wrapper's own key
    (``via``, ``fold``) that says what it wraps."""

    name: str
    key: str
    #: Whether a wrapped configuration's first estimate (its ``time_ms`` before :meth:`time_steps`) is at most the
    #: wrapped step's time, so that split dominance may decide on it (``BenchSettings.split_wrapped``): fold's is the inner
    #: configuration's own time (the step adds packs to it); relayout's adds separately timed transforms, whose launches
    #: overlap inside a step (measured 0.125 ms summed, 0.086 ms as one replayed step, AlexNet conv3 backward filter
    #: n = 16), so it is not.  Its inner sources do not meet the kernel's rows either (it passes no
    #: ``extra_workspace`` to :meth:`measure_inner`): replayed on the recorded relayout tables that cost a WR plan
    #: 4.2% (an inner engine's outlier median at a smaller size, 1.8 ms where the wrapped step ran in 0.25 ms).
    estimate_is_lower_bound: bool = False

    def __init__(self, inner: Sequence[AlgorithmSource | str] = ("legacy",)):
        self.inner = [registry.get(s) if isinstance(s, str) else s for s in inner]
        if any(s.name == self.name for s in self.inner):
            raise ValueError(f"a {self.name} source cannot wrap itself")

    def measure_inner(self, inner: AlgorithmSource, op: str, problem: ConvProblem, ops: Operands, workspace: int,
                      settings: BenchSettings,
                      extra_workspace: int | None = None) -> tuple[list[Measurement], list[Skipped]]:
        """``inner``'s own measurement of the transformed ``problem`` (the folded convolution, the other layout),
        under split dominance against ``inner``'s rows of that problem at the smaller sizes
        (:meth:`~ucudnn.measure.sources.base.BenchSettings.for_inner`), which it then joins.  ``extra_workspace``: the
        bytes this wrapper adds to each inner configuration's workspace; given, the kernel's own rows dominate too
        (``BenchSettings.split_wrapped``)."""
        inner_settings, rows_so_far = settings.for_inner(problem, (self.name, inner.name), extra_workspace)
        ms, sk = inner.measure(op, problem, ops, workspace, inner_settings)
        if rows_so_far is not None:
            rows_so_far += ms
        return ms, sk

    def time_steps(self, op: str, problem: ConvProblem, configs: Sequence[Measurement], ops: Operands,
                   workspace: int, settings: BenchSettings) -> list[tuple[float, str] | CaptureError]:
        """Each of ``configs`` timed by :meth:`time_step` under the fast-benchmarking rules, in input order.

        A configuration's ``time_ms`` (the inner measurement, plus the transforms' for relayout) is its first
        estimate, as Find's time is for legacy: configurations are timed fastest estimate first; one dominated
        by the estimates (:func:`~ucudnn.measure.sources.base.dominated`), over the split-dominance margin of the
        kernel's own rows at this size (``BenchSettings.split_wrapped``, where :attr:`estimate_is_lower_bound`) or met
        past the kernel's budget keeps its estimate (``"estimate"``), one whose first sample is
        hopeless keeps that (``"first-sample"``), the rest get the median (``"median"``).  A configuration that
        cannot be captured gives its error."""
        return [got if isinstance(got, CaptureError) else got[:2]
                for got in self._time_steps(op, problem, configs, ops, workspace, settings)]

    def _time_steps(self, op: str, problem: ConvProblem, configs: Sequence[Measurement], ops: Operands,
                    workspace: int, settings: BenchSettings
                    ) -> list[tuple[float, str, str | None, dict[str, float]] | CaptureError]:
        """:meth:`time_steps` with why an estimate was kept (``Pruner.decide``'s reason; None when timed) and the
        timing's host work (:func:`~ucudnn.measure.sources.base.host_extra`; empty for an estimate)."""
        from ...binding.timing import HostRecorder

        out: dict[int, tuple[float, str, str | None, dict[str, float]] | CaptureError] = {}
        split = settings.split_reference(problem) if settings.split_wrapped and self.estimate_is_lower_bound else None
        pruner = Pruner(settings, split=split)
        for i in sorted(range(len(configs)), key=lambda i: (configs[i].time_ms, configs[i].workspace_bytes)):
            cfg = configs[i]
            why = pruner.decide(cfg.time_ms, cfg.workspace_bytes)
            if why is not None:
                pruner.record(cfg.time_ms, cfg.workspace_bytes, None, why)
                out[i] = (cfg.time_ms, "estimate", why, {})
                continue
            try:
                with HostRecorder() as host:
                    t, how = pruner.retime(lambda give_up: self.time_step(op, problem, cfg, ops, workspace, settings,
                                                                          give_up), cfg.time_ms, cfg.workspace_bytes)
                out[i] = (t, how, None, host_extra(host.ms))
            except CaptureError as e:
                out[i] = e
        return [out[i] for i in range(len(configs))]

    def timed_rows(self, op: str, problem: ConvProblem, configs: list[Measurement], ops: Operands, workspace: int,
                   settings: BenchSettings, what: str,
                   extra: Callable[[Measurement], dict] = lambda c: c.extra) -> tuple[list[Measurement], list[Skipped]]:
        """The rows a wrapper records for ``configs`` at one size: timed by :meth:`time_steps` (as they are when
        ``settings.repeat`` is 0), ``extra(config)`` plus how each was timed; capture failures skipped as
        ``what: reason``."""
        if settings.repeat <= 0:
            return list(configs), []
        rows: list[Measurement] = []
        skipped: list[Skipped] = []
        for cfg, got in zip(configs, self._time_steps(op, problem, configs, ops, workspace, settings)):
            if isinstance(got, CaptureError):
                skipped.append(Skipped(cfg.micro_batch, cfg.algo, cfg.math_type, f"{what}: {got}"))
                continue
            t, how, why, host = got
            inner = {k: v for k, v in extra(cfg).items() if k != "host_ms"}   # the inner call's, not this step's
            rows.append(Measurement(cfg.micro_batch, cfg.algo, cfg.math_type, t, cfg.workspace_bytes, self.name,
                                    cfg.engine, {**inner, "timed": how, **({"pruned": why} if why else {}), **host}))
        return rows, skipped

    def time_step(self, op: str, problem: ConvProblem, config: Measurement, ops: Operands, workspace: int,
                  settings: BenchSettings, give_up: Callable[[float], bool] | None = None) -> float:
        """ms of one step of ``config`` timed as execution runs it (the wrapper's moves, the inner call and the
        host work between them, back to back): summing separately timed parts under-predicted small
        micro-batches of relayout by up to 1.7x on an H100.  Replay timing (``settings.timing``) times the
        same step captured into a CUDA graph."""
        launch = self.prepare(op, problem, config)
        beta = timed_beta(op)
        return time_config(lambda: launch(ops, workspace, config.workspace_bytes, 1.0, beta), settings,
                           give_up=give_up)

    def inner_config(self, config: Measurement, own_bytes: int) -> tuple[AlgorithmSource, Measurement]:
        """The inner source and configuration ``config`` wraps; ``own_bytes`` of its workspace are the wrapper's."""
        inner = registry.get((config.extra.get(self.key) or {}).get("source", "legacy"))
        return inner, Measurement(config.micro_batch, config.algo, config.math_type, config.time_ms,
                                  max(0, config.workspace_bytes - own_bytes), inner.name, config.engine,
                                  {k: v for k, v in config.extra.items() if k != self.key})
