"""The interface every algorithm source implements.

A source turns (op, problem at one micro-batch size) into measured
micro-configurations, and runs one of them.  The planner never sees sources:
to it, every measurement is just (micro-batch, time, workspace).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..problem import ConvProblem
from ..table import Measurement, Skipped


@dataclass
class Operands:
    """Device pointers of one kernel call at one micro-batch: cuDNN's (a, b) -> out order."""

    a: int
    b: int
    out: int


@dataclass
class BenchSettings:
    numerics: str
    repeat: int = 5          # timed runs per configuration (median); 0 = trust the source's own timing
    warmup: int = 1
    max_workspace: int = 4 << 30   # workspace offered while benchmarking
    min_sample_ms: float = 1.0     # back-to-back calls per timing sample (see ucudnn.timing)


class AlgorithmSource(Protocol):
    name: str

    def measure(self, op: str, problem: ConvProblem, ops: Operands, workspace: int,
                settings: BenchSettings) -> tuple[list[Measurement], list[Skipped]]:
        """Measure every configuration at ``problem.n`` (the micro-batch size)."""
        ...

    def run(self, op: str, problem: ConvProblem, config: Measurement, ops: Operands, workspace: int,
            workspace_bytes: int, alpha: float, beta: float) -> None:
        """Run ``config`` once: out = alpha * op(a, b) + beta * out."""
        ...
