"""Plans: which micro-configurations each kernel runs, and what that costs.

``ucudnn-plan/1`` (schema: ``ucudnn/schemas/plan.schema.json``) is what the
planners produce, the CLI prints, the service answers and execution reads.
A plan carries its kernels' problems so it can be executed without the table.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..problem import ConvProblem
from .table import Measurement

FORMAT = "ucudnn-plan/1"
#: a micro-configuration's ``workspace_from`` when its workspace is memory the call owns but has not written yet
#: (:func:`ucudnn.planning.wr.solve_with_unwritten`): forward / backward data, the output of the images after its
#: micro-batch; backward filter, its layer's dx, which the caller passes (``Executor(...)(..., unwritten=dx)``)
UNWRITTEN = "unwritten"


@dataclass(frozen=True)
class MicroConfig(Measurement):
    """One micro-batch of a kernel's plan: exactly the measured option it runs.

    The same record as :class:`~ucudnn.planning.table.Measurement` (same fields, same
    JSON), so a plan says precisely which measurement each step came from.
    """

    @classmethod
    def of(cls, m: Measurement, unwritten: bool = False) -> "MicroConfig":
        """The plan's record of measurement ``m``; ``unwritten``: its workspace is taken from memory the call has
        not written yet (:data:`UNWRITTEN`), not from the kernel's workspace buffer."""
        extra = {**m.extra, "workspace_from": UNWRITTEN} if unwritten else m.extra
        return cls(m.micro_batch, m.algo, m.math_type, m.time_ms, m.workspace_bytes, m.source, m.engine, extra,
                   m.channels)

    @property
    def unwritten(self) -> bool:
        """Whether its workspace is memory the call has not written yet (:data:`UNWRITTEN`)."""
        return self.extra.get("workspace_from") == UNWRITTEN


def division_summary(configs: Iterable[Measurement]) -> str:
    """``128x2 a1/FMA + 64 a0/FMA``: micro-batch x count, algorithm / math type, in order of appearance;
    a channel slice's steps read ``128x2 k48 a1/FMA`` (48 of the kernel's output channels), a step whose workspace
    is output not written yet ``128 a5/FMA (unwritten)``."""
    counts = Counter((c.micro_batch, c.channels, c.algo, c.math_type, bool(getattr(c, "unwritten", False)))
                     for c in configs)
    return " + ".join(f"{mb}{f'x{n}' if n > 1 else ''}{f' k{ch}' if ch is not None else ''} a{algo}/{math}"
                      f"{' (unwritten)' if uw else ''}" for (mb, ch, algo, math, uw), n in counts.items())


@dataclass
class KernelPlan:
    """A kernel's configuration: micro-batches that sum to the mini-batch, run one after another.

    With channel slices (issue 18) the micro-batches are laid out slice by slice, each slice's summing to the
    mini-batch (:func:`ucudnn.planning.channels.steps`).  Micro-batches run sequentially and reuse one workspace, so the kernel needs
    the largest of their workspaces, and takes the sum of their times.
    ``offset`` is the kernel's segment in a shared workspace arena (WD plans).
    """

    name: str
    op: str
    problem: ConvProblem
    configs: list[MicroConfig]
    offset: int | None = None

    @property
    def time_ms(self) -> float:
        return sum(c.time_ms for c in self.configs)

    @property
    def workspace_bytes(self) -> int:
        """The workspace buffer the kernel needs: the largest of its micro-configurations' that do not take theirs
        from unwritten memory (:data:`UNWRITTEN`)."""
        return max((c.workspace_bytes for c in self.configs if not c.unwritten), default=0)

    @property
    def batch(self) -> int:
        """Samples the plan covers: the mini-batch when every channel slice's micro-batches sum to it."""
        k = self.problem.k
        return sum(c.micro_batch * (k if c.channels is None else c.channels) for c in self.configs) // k

    def summary(self) -> str:
        return division_summary(self.configs)

    def to_dict(self) -> dict[str, Any]:
        d = {"name": self.name, "op": self.op, "problem": self.problem.to_dict(),
             "time_ms": self.time_ms, "workspace_bytes": self.workspace_bytes,
             "micro_batches": [c.to_dict() for c in self.configs]}
        if self.offset is not None:
            d["offset"] = self.offset
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "KernelPlan":
        return cls(d["name"], d["op"], ConvProblem.from_dict(d["problem"]),
                   [MicroConfig.from_dict(c) for c in d["micro_batches"]], d.get("offset"))


@dataclass
class Plan:
    """A plan for a set of kernels under one policy and limit."""

    policy: str                      # "wr" | "wd" | "undivided"
    batch_policy: str
    kernels: list[KernelPlan]
    device: str = ""
    cudnn_version: int = 0
    workspace_limit: int | None = None   # per kernel (wr, undivided)
    total_workspace: int | None = None   # whole network (wd)
    numerics: str | None = None
    stats: dict[str, Any] = field(default_factory=dict)  # solver info: variables, solve time, status

    @property
    def total_time_ms(self) -> float:
        return sum(k.time_ms for k in self.kernels)

    @property
    def workspace_bytes(self) -> int:
        """Workspace the plan needs: per-kernel max (wr) or the arena size (wd, with offsets)."""
        if any(k.offset is not None for k in self.kernels):
            return max((k.offset or 0) + k.workspace_bytes for k in self.kernels)
        return max((k.workspace_bytes for k in self.kernels), default=0)

    def kernel(self, name: str) -> KernelPlan:
        for k in self.kernels:
            if k.name == name:
                return k
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "format": FORMAT, "policy": self.policy, "batch_policy": self.batch_policy,
            "device": self.device, "cudnn_version": self.cudnn_version,
            "workspace_limit": self.workspace_limit, "total_workspace": self.total_workspace,
            "total_time_ms": self.total_time_ms, "workspace_bytes": self.workspace_bytes,
            "kernels": [k.to_dict() for k in self.kernels],
        }
        if self.numerics is not None:
            d["numerics"] = self.numerics
        if self.stats:
            d["stats"] = self.stats
        return d

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Plan":
        from ..schemas import validate

        validate(d, FORMAT)
        return cls(d["policy"], d["batch_policy"], [KernelPlan.from_dict(k) for k in d["kernels"]],
                   d.get("device", ""), d.get("cudnn_version", 0), d.get("workspace_limit"),
                   d.get("total_workspace"), d.get("numerics"), d.get("stats", {}))
