"""The interface every algorithm source implements.

A source turns (op, problem at one micro-batch size) into measured
micro-configurations, and runs one of them.  The planner never sees sources:
to it, every measurement is just (micro-batch, time, workspace).

Running is split in two because a micro-batched plan calls the same
configuration many times: :meth:`AlgorithmSource.prepare` resolves once what
never changes between calls (descriptors, the built engine plan, the inner
configuration of a relayout) and returns a :data:`Launch` that only takes the
call's pointers and scalars.  On small kernels the host's per-call work
competes with the GPU's (ResNet-50 fp16 kernels take 20-60 us), so the
executor prepares every step once and measurement times the same launchers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

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


#: One configuration made ready to run: ``launch(ops, workspace, workspace_bytes, alpha, beta)`` computes
#: out = alpha * op(a, b) + beta * out on CuPy's current stream.
Launch = Callable[[Operands, int, int, float, float], None]


class AlgorithmSource(Protocol):
    name: str

    def measure(self, op: str, problem: ConvProblem, ops: Operands, workspace: int,
                settings: BenchSettings) -> tuple[list[Measurement], list[Skipped]]:
        """Measure every configuration at ``problem.n`` (the micro-batch size)."""
        ...

    def prepare(self, op: str, problem: ConvProblem, config: Measurement) -> Launch:
        """``config`` at ``problem.n`` made ready to run on the current device (see module doc)."""
        ...

    def run(self, op: str, problem: ConvProblem, config: Measurement, ops: Operands, workspace: int,
            workspace_bytes: int, alpha: float, beta: float) -> None:
        """Run ``config`` once, unprepared: out = alpha * op(a, b) + beta * out."""
        ...


class Prepared:
    """``run`` for sources that implement ``prepare``: one call through the same launcher execution uses."""

    def prepare(self, op: str, problem: ConvProblem, config: Measurement) -> Launch:
        raise NotImplementedError

    def run(self, op: str, problem: ConvProblem, config: Measurement, ops: Operands, workspace: int,
            workspace_bytes: int, alpha: float, beta: float) -> None:
        self.prepare(op, problem, config)(ops, workspace, workspace_bytes, alpha, beta)


class Wrapper(Prepared):
    """A source whose configurations run an inner source's configuration on a transformed problem (relayout,
    fold): the inner configuration travels in the measurement, plus one record under the wrapper's own key
    (``via``, ``fold``) that says what it wraps."""

    name: str
    key: str

    def __init__(self, inner: Sequence[AlgorithmSource | str] = ("legacy",)):
        from . import registry

        self.inner = [registry.get(s) if isinstance(s, str) else s for s in inner]
        if any(s.name == self.name for s in self.inner):
            raise ValueError(f"a {self.name} source cannot wrap itself")

    def inner_config(self, config: Measurement, own_bytes: int) -> tuple[AlgorithmSource, Measurement]:
        """The inner source and configuration ``config`` wraps; ``own_bytes`` of its workspace are the wrapper's."""
        from . import registry

        inner = registry.get((config.extra.get(self.key) or {}).get("source", "legacy"))
        return inner, Measurement(config.micro_batch, config.algo, config.math_type, config.time_ms,
                                  max(0, config.workspace_bytes - own_bytes), inner.name, config.engine,
                                  {k: v for k, v in config.extra.items() if k != self.key})
