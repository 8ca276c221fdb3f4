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

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol

from ...planning.table import Measurement, Skipped
from ...problem import ConvProblem


@dataclass
class Operands:
    """Device pointers of one kernel call at one micro-batch: cuDNN's (a, b) -> out order."""

    a: int
    b: int
    out: int


#: Timed samples per configuration, and the least each sample lasts (calls back to back).  Issue 16: 5 samples of
#: 1 ms were the defaults before.  On an H100 (AlexNet b256, FP32 strict, legacy) 3 samples of 0.5 ms planned WR
#: at 64 MiB within +0.02% of 5 x 1 ms, as close as two 5 x 1 ms runs are to each other
#: (``benchmarks/results/bench_time-*.md``).  Samples of 0.25 ms were too short: a 0.1 ms call then runs 3 times a
#: sample and the host's launch gap shows (AlexNet conv2 backward data, 16 samples, algo 5 measured 0.16-0.55 ms
#: where 1 ms samples gave 0.10 ms), and two unpruned runs planned 9% apart.
DEFAULT_REPEAT = 3
DEFAULT_MIN_SAMPLE_MS = 0.5


@dataclass
class BenchSettings:
    """How a benchmark measures; the last four fields trade benchmarking time for nothing in the plans.

    Pruning (issue 16, "the same plans, less time"; :class:`Pruner` applies the rules, and
    ``benchmarks/pruning_cost.py`` reports what each costs in planned time on the recorded tables):

    * ``prune_margin`` — a configuration whose first estimate (Find's own time for legacy, the quick sample
      for graph) is more than ``prune_margin`` times another's at the same micro-batch, and that needs no
      less workspace, is recorded with that estimate instead of being re-timed.  None: re-time everything.
    * ``hopeless_factor`` — early stop: a configuration whose first timed sample is more than this many
      times the best re-timed time at that micro-batch is recorded with that first sample (its own
      timing, one sample instead of the median: :meth:`Pruner.hopeless`).  None: never stop early.
    * ``kernel_budget_s`` — per kernel (every micro-batch, every source): once spent, the remaining
      configurations are recorded with their first estimate.  None: no budget.
    * ``trust_estimate_ms`` — a configuration whose first estimate is at least this long is recorded with it
      instead of being re-timed (``pruned = "long"``): one run of a call that long is as exact as a median of
      several, and re-timing it costs the most (``warmup + 1 + repeat`` more runs of the slowest calls; Find has
      already run it).  Backward filter is exempt where the estimate was taken with beta = 0 (Find's:
      :func:`timed_beta`).  Measured on an H100 (cuDNN 9.19, unpruned AlexNet b256 tables): Find's time of every
      row over 1 ms was within -4% / +11% of the re-timed median (10th / 90th percentile: FP32 strict NCHW 1.00 /
      1.06, FP16 NHWC 1.00 / 1.11; ResNet-50 b128 FP32 0.99 / 1.11), where rows under 1 ms were off by up to 47%
      (launch overhead inside Find's single run).  Replayed on the recorded tables, trusting from 1 ms made an
      AlexNet FP16 NHWC WR plan 6% slower (a row between 1 and 2 ms whose estimate misled it), from 2 ms changed
      no plan by more than the other rules.  An earlier single measurement (trust at 5 ms, AlexNet FP16 NHWC)
      priced +31%, not reproduced: two unpruned FP16 runs differ by about 2% priced that way.

    Defaults (issue 16) and what each costs, replayed on the recorded tables (``benchmarks/pruning_cost.py``):
    margin 1.5, early stop at 2x, trust from 2 ms, 3 samples of 0.5 ms: WR plans at 8/64/256 MiB within 1% of
    the unpruned plans on AlexNet and ResNet-50, re-timing cut from 3.8 to about 1 modelled GPU second on AlexNet
    FP32 and from 7.0 to about 0.6 on AlexNet FP16 NHWC.  Measured end to end: ``benchmarks/bench_time.py``.
    """

    numerics: str
    repeat: int = DEFAULT_REPEAT   # timed samples per configuration (median); 0 = trust the source's own timing
    warmup: int = 1
    max_workspace: int = 4 << 30   # workspace offered while benchmarking
    min_sample_ms: float = DEFAULT_MIN_SAMPLE_MS   # back-to-back calls per timing sample (ucudnn.binding.timing)
    timing: str = "eager"          # how a configuration's call is timed: see time_config
    prune_margin: float | None = 1.5
    hopeless_factor: float | None = 2.0
    kernel_budget_s: float | None = 60.0
    trust_estimate_ms: float | None = 2.0
    deadline: float | None = None  # time.perf_counter() at which this kernel's budget ends (start_kernel)

    def __post_init__(self) -> None:
        from ...errors import InputError

        for name in ("prune_margin", "hopeless_factor"):
            v = getattr(self, name)
            if v is not None and not v >= 1.0:
                raise InputError(f"must be at least 1.0 (or None: off), got {v!r}", name)
        if self.trust_estimate_ms is not None and not self.trust_estimate_ms > 0:
            raise InputError(f"must be a positive number of ms (or None: off), got {self.trust_estimate_ms!r}",
                             "trust_estimate_ms")
        if self.kernel_budget_s is not None and not self.kernel_budget_s > 0:
            raise InputError(f"must be a positive number of seconds (or None: no budget), got {self.kernel_budget_s!r}",
                             "kernel_budget_s")

    def start_kernel(self) -> None:
        """Start the per-kernel budget's clock (the benchmark loop calls it before each kernel's first size)."""
        self.deadline = None if self.kernel_budget_s is None else time.perf_counter() + self.kernel_budget_s

    def trusts(self, estimate_ms: float) -> bool:
        """The trust rule: an estimate this long is recorded as it is (``trust_estimate_ms``; False when off)."""
        return self.trust_estimate_ms is not None and estimate_ms >= self.trust_estimate_ms

    def budget_spent(self) -> bool:
        return self.deadline is not None and time.perf_counter() > self.deadline

    @classmethod
    def unpruned(cls, numerics: str, **kw: object) -> "BenchSettings":
        """Every configuration re-timed in full: the reference the pruning rules are measured against."""
        return cls(numerics, prune_margin=None, hopeless_factor=None, kernel_budget_s=None,  # type: ignore[arg-type]
                   trust_estimate_ms=None, **kw)


def dominated(estimate_ms: float, workspace: int, others: Iterable[tuple[float, int]], margin: float | None) -> bool:
    """True iff some other configuration is faster by more than ``margin`` and needs no more workspace.

    Why such a configuration need not be re-timed: WR picks, for each micro-batch size, the fastest
    configuration that fits the limit, so it uses a slower one only when that one needs *less* workspace.
    A configuration that is slower *and* needs no less workspace than another is never chosen while the
    other fits, and the other fits whenever it does.  So with exact estimates pruning it changes no WR plan
    (nor WD's, which chooses among WR's per-size Pareto fronts).  Estimates are not exact (Find times one run
    with beta = 0, see :func:`timed_beta`; the quick sample is one call), so the margin must exceed their
    error: a pruned configuration could only have been chosen if its estimate were wrong by more than that.
    ``benchmarks/pruning_cost.py`` measures the cost of the default margin on the recorded tables.
    """
    if margin is None:
        return False
    return any(t * margin < estimate_ms and ws <= workspace for t, ws in others)


@dataclass
class Pruner:
    """One source's bookkeeping at one micro-batch size: which configurations to re-time, and how long.

    Feed it configurations in order of their first estimate, fastest first (so dominators and the best
    re-timed time are known early); :meth:`decide` says how to record each, :meth:`record` what came out.
    """

    settings: BenchSettings
    trust_long: bool = True    # False where the estimate is not the plan's call (Find's beta = 0 for wgrad)
    estimates: list[tuple[float, int]] = field(default_factory=list)   # (first estimate ms, workspace) recorded
    timed: list[tuple[float, int]] = field(default_factory=list)       # (re-timed ms, workspace) recorded
    counts: dict[str, int] = field(default_factory=dict)               # how each configuration was recorded

    def decide(self, estimate_ms: float, workspace: int) -> str | None:
        """None: re-time; else why the estimate is recorded instead (``dominated``, ``long``, ``budget``)."""
        if dominated(estimate_ms, workspace, self.estimates, self.settings.prune_margin):
            return "dominated"
        if self.trust_long and self.settings.trusts(estimate_ms):
            return "long"
        if self.settings.budget_spent():
            return "budget"
        return None

    def hopeless(self, first_ms: float, workspace: int) -> bool:
        """Early stop: ``first_ms`` exceeds ``hopeless_factor`` x the best re-timed time at this micro-batch.

        Any workspace counts as the reference, unlike :func:`dominated`: what is recorded is this
        configuration's own first sample (under the plan's beta), not another estimate, so WR may still
        choose it where it needs the least workspace, and a single sample of a call k times slower than the
        best is set by the call's own duration rather than launch jitter.  What is saved is the median's
        ``repeat`` samples (on AlexNet fp16, legacy algorithm 0 without workspace takes 420 ms a call at
        b256 where algorithm 1 takes 0.5 ms).  ``workspace`` is kept for the signature's symmetry with
        :meth:`decide`.
        """
        k = self.settings.hopeless_factor
        return k is not None and any(t * k < first_ms for t, _ in self.timed)

    def record(self, estimate_ms: float, workspace: int, timed_ms: float | None, how: str) -> None:
        """``timed_ms``: the full median (None when the estimate or a first sample was recorded)."""
        self.estimates.append((estimate_ms, workspace))
        if timed_ms is not None:
            self.timed.append((timed_ms, workspace))
        self.counts[how] = self.counts.get(how, 0) + 1


TIMINGS = ("eager", "replay")


def time_config(fn: Callable[[], None], settings: BenchSettings,
                timer: Callable[..., float] | None = None,
                give_up: Callable[[float], bool] | None = None) -> float:
    """ms of one configuration's call as the plan will run it, by ``settings.timing``:

    * ``eager`` — called back to back from Python, as :class:`ucudnn.execute.Executor` runs a plan: the host's
      launch work counts where it exceeds the GPU's (a small micro-batch's step can be host-bound);
    * ``replay`` — captured once into a CUDA graph and replayed (:func:`ucudnn.binding.timing.time_replay_ms`), as a
      plan captured by its user runs: GPU time only.  Measured on an H100 (AlexNet conv2, fp32, relayout via
      NCHW Winograd, 12 samples): 165 us of host work per step, 104 us of GPU work.  A configuration that cannot
      be captured raises :class:`~ucudnn.errors.CaptureError` (sources record it as skipped).

    ``give_up(first_sample_ms)``: early stop (:meth:`Pruner.hopeless`); sampling also stops at the kernel's
    budget (``settings.deadline``).  ``timer`` replaces the clock (tests without a GPU); it is passed
    ``give_up`` / ``deadline`` only when they are set.
    """
    from ...binding.timing import time_ms, time_replay_ms

    kw: dict[str, object] = {"repeat": max(1, settings.repeat), "warmup": settings.warmup,
                             "min_sample_ms": settings.min_sample_ms}
    if give_up is not None:
        kw["give_up"] = give_up
    if settings.deadline is not None:
        kw["deadline"] = settings.deadline
    if timer is not None:
        return timer(fn, **kw)
    if settings.timing != "replay":
        return time_ms(fn, **kw)  # type: ignore[arg-type]
    try:
        return time_replay_ms(fn, **kw)  # type: ignore[arg-type]
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
