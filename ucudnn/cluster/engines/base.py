"""Precompute units, the targets they are measured on, and the outcome of measuring one.

A *unit* is the smallest piece of benchmarking worth distributing: one
(device model, cuDNN version, problem, op) at every micro-batch size its
batch policy names (plus the numerics mode, which decides the math types).
Its key is exactly the library's kernel-cache key (``ucudnn.api._cache_key``
without a limit), so a unit measured by ``ucudnn precompute`` is a cache hit
for every later ``conv2d_*`` call on that GPU model, from the store, the plan
service or a bundle.  Identical convolutions in several networks or layers are
one unit: the key has no kernel name.

This module is pure Python (no CuPy): the driver of a precompute job builds
and orders units on a machine with no GPU.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ... import source_names
from ...catalog.store import key_id
from ...catalog.target import Target
from ...errors import UcudnnError
from ...numerics import allowed_math_types
from ...planning.table import BenchmarkTable, KernelBench
from ...policy import key_policy, micro_batch_sizes
from ...problem import ConvProblem


@dataclass(frozen=True)
class Unit:
    """One (target, problem, op, numerics, batch policy, sources, channel policy): measured once, stored under
    :meth:`key`.

    ``sources``: the algorithm sources measured, canonical (:func:`ucudnn.source_names.canonical`); the default
    is the library's, so precomputed units answer ``conv2d_*`` calls made with the default sources.  A unit
    replayed from a recorded table carries the sources that table was measured with.
    """

    target: Target
    problem: ConvProblem
    op: str
    numerics: str
    batch_policy: str
    sources: tuple[str, ...] = field(default_factory=source_names.default_names)
    #: the channel policy measured (:func:`ucudnn.policy.channel_sizes`): part of the key, as in the library's
    channel_policy: str = "none"

    @property
    def micro_batches(self) -> list[int]:
        return micro_batch_sizes(self.batch_policy, self.problem.n)

    def key(self) -> dict[str, Any]:
        """The library's kernel-cache key (``ucudnn.api._cache_key``): precomputed units are its cache hits."""
        key = {"device": self.target.device, "cudnn_version": self.target.cudnn_version,
               "problem": self.problem.to_dict(), "op": self.op, "numerics": self.numerics,
               "batch_policy": key_policy(self.batch_policy, self.problem.n)}
        sources = source_names.key_field(self.sources, self.op, self.problem)
        if sources is not None:
            key["sources"] = sources
        if self.channel_policy != "none":   # left out for none, as ucudnn.api._cache_key does
            key["channel_policy"] = self.channel_policy
        return key

    @property
    def id(self) -> str:
        return key_id(self.key())

    def label(self) -> str:
        return f"{self.op} {self.problem.describe()}"

    def cost(self) -> float:
        """A relative cost estimate, used to start long units first (longest-processing-time order).

        Find runs every algorithm under every allowed math type at every
        micro-batch size; the arithmetic grows with the micro-batch.  Only the
        order matters: dispatch is dynamic, so a wrong guess costs balance, not
        correctness.
        """
        math = len(allowed_math_types(self.numerics, self.problem.dtype))
        return math * sum(self.problem.flops(b) + 1e9 for b in self.micro_batches)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "op": self.op, "problem": self.problem.describe(), "numerics": self.numerics,
                "batch_policy": self.batch_policy, "sources": ",".join(self.sources),
                "channel_policy": self.channel_policy, **self.target.to_dict()}


class UnitError(UcudnnError):
    """A unit that could not be measured; the message is the reason reported for it."""


@dataclass
class UnitResult:
    """What a worker answers for one unit: the measurements, or the reason there are none.

    ``seconds`` is the worker's wall time on the unit (GPU time: a GPU worker
    runs one unit at a time), ``worker`` names the worker for the report.
    """

    unit_id: str
    bench: KernelBench | None
    error: str | None
    seconds: float
    worker: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None and self.bench is not None


@dataclass
class UnitOutcome:
    """The driver's record of one unit over all its attempts."""

    unit: Unit
    status: str = "pending"            # pending | measured | skipped | failed
    attempts: int = 0
    reasons: list[str] = field(default_factory=list)
    seconds: float = 0.0               # worker time of every attempt (GPU-seconds spent)
    dispatch_seconds: float = 0.0      # driver-observed round trip minus worker time (scheduling overhead)
    bench: KernelBench | None = None
    worker: str = ""

    def report(self) -> dict[str, Any]:
        return {**self.unit.to_dict(), "status": self.status, "attempts": self.attempts, "reasons": self.reasons}


@dataclass(eq=False)
class Worker:
    """One worker of an engine: a name for reports, the targets it measures, an engine-private handle."""

    name: str
    targets: list[Target]
    handle: Any = None
    alive: bool = True
    busy_seconds: float = 0.0
    units: int = 0


@dataclass
class PlanTask:
    """Plan one stored table under several (policy, size) requests: a CPU task."""

    table_id: str
    table: BenchmarkTable                    # as an object: no re-validation in every worker
    requests: list[tuple[str, int]]          # ("wr", workspace_limit) | ("wd", total_workspace)
    batch_policy: str


def plan_task(task: PlanTask) -> list[dict[str, Any]]:
    """Run in a worker: one answer per request, ``{"plan": Plan}`` or ``{"error", "min_workspace"}``.

    Infeasible limits are answers, not failures: the report names the
    smallest limit that works, as ``ucudnn plan`` does.
    """
    from ...errors import InfeasibleError, UcudnnError
    from ...planning.planner import plan

    table = task.table
    out: list[dict[str, Any]] = []
    for policy, size in task.requests:
        t0 = time.perf_counter()
        try:
            p = plan(table, policy, workspace_limit=size if policy != "wd" else None,
                     total_workspace=size if policy == "wd" else None, batch_policy=task.batch_policy)
            out.append({"plan": p, "seconds": time.perf_counter() - t0})
        except InfeasibleError as e:
            out.append({"error": str(e), "infeasible": True, "min_workspace": e.min_workspace})
        except UcudnnError as e:
            out.append({"error": str(e), "infeasible": False})
    return out
