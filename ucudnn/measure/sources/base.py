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
from typing import Callable, Protocol

from ...planning.table import Measurement, Skipped
from ...problem import ConvProblem


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
    min_sample_ms: float = 1.0     # back-to-back calls per timing sample (see ucudnn.binding.timing)
    timing: str = "eager"          # how a configuration's call is timed: see time_config


TIMINGS = ("eager", "replay")


def time_config(fn: Callable[[], None], settings: BenchSettings,
                timer: Callable[..., float] | None = None) -> float:
    """ms of one configuration's call as the plan will run it, by ``settings.timing``:

    * ``eager`` — called back to back from Python, as :class:`ucudnn.execute.Executor` runs a plan: the host's
      launch work counts where it exceeds the GPU's (a small micro-batch's step can be host-bound);
    * ``replay`` — captured once into a CUDA graph and replayed (:func:`ucudnn.binding.timing.time_replay_ms`), as a
      plan captured by its user runs: GPU time only.  Measured on an H100 (AlexNet conv2, fp32, relayout via
      NCHW Winograd, 12 samples): 165 us of host work per step, 104 us of GPU work.  A configuration that cannot
      be captured raises :class:`~ucudnn.errors.CaptureError` (sources record it as skipped).

    ``timer`` replaces the clock (tests without a GPU).
    """
    from ...binding.timing import time_ms, time_replay_ms

    kw = {"repeat": max(1, settings.repeat), "warmup": settings.warmup, "min_sample_ms": settings.min_sample_ms}
    if timer is not None:
        return timer(fn, **kw)
    if settings.timing != "replay":
        return time_ms(fn, **kw)
    try:
        return time_replay_ms(fn, **kw)
    except Exception as e:  # noqa: BLE001 - any failure inside capture means: not replayable
        from ...errors import CaptureError, summary

        raise CaptureError(f"cannot be captured into a CUDA graph: {summary(e)}") from e


def timed_beta(op: str) -> float:
    """The beta every source measures ``op`` with: the one most of a plan's steps run.

    Backward filter sums over micro-batches, so every step after a plan's first runs with beta = 1
    (:class:`ucudnn.execute.Executor`), and some algorithms are slower so: on an H100, legacy WINOGRAD_NONFUSED
    wgrad (AlexNet conv2, TF32, n = 16) timed 1.5 ms with beta = 0 (Find's way) and ran 2.5-2.8 ms per 256
    samples in a plan.  The other ops run with the caller's beta, 0 in training."""
    return 1.0 if op == "backward_filter" else 0.0


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
