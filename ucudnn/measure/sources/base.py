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

import dataclasses
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol

from ...errors import CaptureError, summary
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
    """How a benchmark measures; the last five fields trade benchmarking time for nothing in the plans.

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
    * ``split_margin`` — split dominance (:class:`SplitReference`): a configuration at micro-batch b that is more
      than ``split_margin`` times slower than what WR can already do with no more workspace — run b as smaller
      micro-batches measured before it (sizes are benchmarked in ascending order), or run another configuration
      already recorded at b — is never WR's or WD's choice.  Before its first sample, its own time at the
      largest smaller size (a lower bound: a call does not get faster with more samples) decides whether it is
      sampled at all (not sampled: left out of the table and listed in ``skipped`` as ``split-dominated``,
      never recorded with a made-up time); after the first sample (Find's time, the quick sample), whether it is
      re-timed (recorded with that sample, ``pruned = "split-dominated"``).  None: off.  Needs the kernel's
      measurements so far: :meth:`start_kernel`.
    * ``confirm_factor`` — a median more than this many times the configuration's first estimate (Find's time,
      the quick sample, the inner configuration's time) is timed once more and the smaller median kept (timing
      noise only adds time).  Why: on an H100 (AlexNet b256 FP32 strict, two unpruned runs, issue 16's fifth pass)
      2-3 of 1,800 medians per run were 2-7x their estimate and the other run's median (legacy WINOGRAD_NONFUSED
      conv2 forward at n = 16: 0.666 ms, Find 0.143 ms, the other run 0.096 ms), and one of them made an unpruned
      WR plan at 64 MiB 6.9% slower than the same plan at the two runs' faster timings.  None: off.
    * ``split_wrapped`` — split dominance reaches the wrappers (fold, relayout; issue 16's fourth pass): a wrapped
      step runs its inner configuration plus the wrapper's moves, so the inner configuration's time is a lower bound
      of the wrapped row's, and the wrapped row's workspace is the inner one's plus the wrapper's operands.  So the
      kernel's own reference at the size (:meth:`SplitReference.reference` within that workspace) also dominates,
      by the same argument, (1) an inner configuration of the transformed problem, before its sample (its time at a
      smaller size: not sampled) and after it (no median), and (2) a wrapped row whose inner time is over the margin
      (not timed wrapped: recorded with the inner time, ``pruned = "split-dominated"``, which is below its real
      time and still over the margin).  Off (False): the wrappers see only their inner rows' own splits.

    Defaults (issue 16) and what each costs, replayed on the recorded tables (``benchmarks/pruning_cost.py``):
    margin 1.5, early stop at 2x, trust from 2 ms, 3 samples of 0.5 ms: WR plans at 8/64/256 MiB within 1% of
    the unpruned plans on AlexNet and ResNet-50, re-timing cut from 3.8 to about 1 modelled GPU second on AlexNet
    FP32 and from 7.0 to about 0.6 on AlexNet FP16 NHWC.  Split dominance at 1.5 (issue 16's third pass): alone at
    most +0.58% on any replayed plan (+0.000% with exact estimates; at 1.0 +7.7%, at 1.25 +0.99%), and the graph
    source's modelled quick samples 6.0 -> 1.9 s on AlexNet FP32 strict with the default sources, 7.1 -> 2.9 s on
    ResNet-50 FP32.  Split dominance on fold's rows (fourth pass, ``split_wrapped``): no replayed plan moves (worst
    costs unchanged; +0.000% with exact estimates), modelled re-timing 2.67 -> 2.47 s on AlexNet FP32 strict; measured,
    fold's own wall seconds (its wrapped timings) 1.91 -> 0.60 in one H100 run and 0.81 -> 0.57 / 1.08 in another
    (``benchmarks/results/bench_time-p4r1-fp32.md``, ``-p4r2-fp32.md``: run-to-run noise).  Measured end to end:
    ``benchmarks/bench_time.py`` (``benchmarks/results/bench_time-*.md``).
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
    split_margin: float | None = 1.5
    split_wrapped: bool = True
    confirm_factor: float | None = 2.0
    deadline: float | None = None  # time.perf_counter() at which this kernel's budget ends (start_kernel)
    # The kernel being benchmarked and its measurements so far (start_kernel): what split dominance compares with.
    kernel: ConvProblem | None = field(default=None, repr=False, compare=False)
    measured: list[Measurement] | None = field(default=None, repr=False, compare=False)
    # Wrappers' inner rows per transformed problem this kernel (for_inner), so split dominance works inside them.
    inner_rows: dict[tuple, list[Measurement]] = field(default_factory=dict, repr=False, compare=False)
    # An inner source's settings (for_inner with the wrapper's workspace): the wrapping settings, and the bytes the
    # wrapper adds to an inner configuration's workspace (split_wrapped).
    outer: "BenchSettings | None" = field(default=None, repr=False, compare=False)
    outer_extra: int = field(default=0, repr=False, compare=False)

    def __post_init__(self) -> None:
        from ...errors import InputError

        for name in ("prune_margin", "hopeless_factor", "split_margin", "confirm_factor"):
            v = getattr(self, name)
            if v is not None and not v >= 1.0:
                raise InputError(f"must be at least 1.0 (or None: off), got {v!r}", name)
        if self.trust_estimate_ms is not None and not self.trust_estimate_ms > 0:
            raise InputError(f"must be a positive number of ms (or None: off), got {self.trust_estimate_ms!r}",
                             "trust_estimate_ms")
        if self.kernel_budget_s is not None and not self.kernel_budget_s > 0:
            raise InputError(f"must be a positive number of seconds (or None: no budget), got {self.kernel_budget_s!r}",
                             "kernel_budget_s")

    def start_kernel(self, problem: ConvProblem | None = None, measured: list[Measurement] | None = None) -> None:
        """Start the per-kernel budget's clock (the benchmark loop calls it before each kernel's first size).

        ``problem`` (the kernel at its full mini-batch) and ``measured`` (the list the benchmark loop extends,
        in place, with each source's rows as each micro-batch size completes, sizes ascending) are what split
        dominance needs: at size b a source finds there every smaller size's rows and the rows other sources
        recorded at b before it (:meth:`split_reference`).  Without them the rule is inactive."""
        self.deadline = None if self.kernel_budget_s is None else time.perf_counter() + self.kernel_budget_s
        self.kernel, self.measured = problem, measured
        self.inner_rows = {}

    def for_inner(self, problem: ConvProblem, key: object,
                  extra_workspace: int | None = None) -> "tuple[BenchSettings, list[Measurement] | None]":
        """Settings for an inner source measuring a wrapper's transformed ``problem`` (fold's folded convolution,
        relayout's other layout) at this micro-batch, and the list its rows are to be added to (None: nothing
        to add; the settings are then these).

        Why: split dominance needs the rows of the problem being measured, and a transformed problem's are not
        the kernel's (:meth:`split_reference` declines them).  The wrapper keeps, per kernel and ``key`` (which
        transform, which inner source), the inner source's own rows at the smaller sizes, so a configuration of
        the transformed problem slower than the split of its micro-batch into smaller ones of the same
        transformed problem is not sampled there either.  The wrapped step adds the wrapper's moves to each
        inner call (packs, transforms: about proportional to the micro-batch, plus a launch or two per call),
        which the margin covers as it covers the estimates' error.  Measured on an H100 (AlexNet b256 FP32
        strict, default sources): the fold-wrapped conv1 kernels took 10.1 of the benchmark's 17.2 s.

        ``extra_workspace``: the bytes the wrapper adds to each inner configuration's workspace.  Given (and
        ``split_wrapped``), the inner settings' split references also hold the kernel's own reference at the size
        (``split_wrapped`` in the class doc): the wrapped row, at least as slow as the inner configuration and needing
        ``extra_workspace`` more, is what WR would weigh against the kernel's other rows."""
        if self.split_margin is None or self.kernel is None or self.measured is None:
            return self, None
        rows = self.inner_rows.setdefault((key, problem.with_batch(1)), [])
        wrapped = extra_workspace is not None and self.split_wrapped
        inner = dataclasses.replace(self, kernel=problem.with_batch(self.kernel.n), measured=rows,
                                    inner_rows=self.inner_rows, outer=self if wrapped else None,
                                    outer_extra=int(extra_workspace or 0) if wrapped else 0)
        return inner, rows

    def split_reference(self, problem: ConvProblem) -> "SplitReference | None":
        """What split dominance compares ``problem``'s configurations with (:class:`SplitReference`), or None: the
        rule is off, no kernel was started with its measurements, or ``problem`` is not the kernel's own at a
        micro-batch size (a wrapper's transformed problem, a channel slice: their rows are not the kernel's)."""
        if self.split_margin is None or self.kernel is None or self.measured is None:
            return None
        if problem.with_batch(self.kernel.n) != self.kernel:
            return None
        ref = SplitReference.of(self.measured, problem.n, self.kernel.n, self.split_margin)
        if self.outer is not None and self.outer.kernel is not None:   # a wrapper's inner source (split_wrapped)
            ref.outer = self.outer.split_reference(self.outer.kernel.with_batch(problem.n))
            ref.outer_extra = self.outer_extra
        return ref

    def trusts(self, estimate_ms: float) -> bool:
        """The trust rule: an estimate this long is recorded as it is (``trust_estimate_ms``; False when off)."""
        return self.trust_estimate_ms is not None and estimate_ms >= self.trust_estimate_ms

    def budget_spent(self) -> bool:
        return self.deadline is not None and time.perf_counter() > self.deadline

    @classmethod
    def unpruned(cls, numerics: str, **kw: object) -> "BenchSettings":
        """Every configuration re-timed in full: the reference the pruning rules are measured against."""
        return cls(numerics, prune_margin=None, hopeless_factor=None, kernel_budget_s=None,  # type: ignore[arg-type]
                   trust_estimate_ms=None, split_margin=None, **kw)


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


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def split_plan(best: dict[int, Measurement], size: int) -> list[Measurement] | None:
    """The fastest way to run ``size`` samples as micro-batches of power-of-two sizes below ``size``, or None.

    ``best``: the fastest configuration per size that fits a limit (:func:`ucudnn.planning.wr.fastest_per_size`).
    The same optimum as WR's DP (:func:`ucudnn.planning.wr.solve`) over those sizes, in O(log size) steps
    instead of O(size x sizes), which matters because the benchmark asks for it per configuration: let
    C(1) = T(1) and C(2s) = min(T(2s), 2 C(s)), the fastest way to run a power of two samples in power-of-two
    pieces.  Merging two equal pieces into one of twice the size never costs more (by C's definition), and
    merging every equal pair leaves the binary digits of ``size``; so the fastest split of a power of two b is
    two runs of C(b/2) (the last merge would give b itself, which is not a split), and of any other size one
    C per binary digit.  ``tests/test_split_dominance.py`` checks it against ``solve``.  Ties go to fewer
    micro-batches, as in ``solve``.
    """
    closed: dict[int, tuple[float, int, tuple[tuple[Measurement, int], ...]]] = {}
    s = 1
    while s < size:
        options = []
        if s in best:
            options.append((best[s].time_ms, 1, ((best[s], 1),)))
        half = closed.get(s // 2) if s > 1 else None
        if half is not None:
            options.append((2 * half[0], 2 * half[1], tuple((m, 2 * n) for m, n in half[2])))
        if options:
            closed[s] = min(options, key=lambda o: (o[0], o[1]))
        s *= 2
    if _power_of_two(size):
        if size // 2 not in closed:
            return None
        parts = tuple((m, 2 * n) for m, n in closed[size // 2][2])
    else:
        digits = [1 << i for i in range(size.bit_length()) if size >> i & 1]
        if any(d not in closed for d in digits):
            return None
        parts = tuple(p for d in digits for p in closed[d][2])
    out = [m for m, n in parts for _ in range(n)]
    out.sort(key=lambda m: -m.micro_batch)   # largest first, as solve returns them
    return out


def identity(m: Measurement) -> tuple[str, str, str]:
    """A configuration across micro-batch sizes: (source, algorithm or engine tag, math type)."""
    return (m.source, str(m.algo), m.math_type)


def find_overhead_ms(previous: Measurement | None) -> float:
    """How much cuDNN Find's time of a configuration exceeded its re-timed median at the largest smaller size (0 where
    it was not re-timed there, or Find was not slower).

    Why: Find runs each algorithm once, and a short call's single run carries a launch overhead a median of calls
    back to back does not (0.05-0.13 ms on an H100, nearly independent of the call's length).  Split dominance on
    Find's time alone left out a configuration that was the best at its size: AlexNet b256 FP32 strict, legacy
    algorithm 5, conv5 backward data at n = 32, Find 0.255 ms against 1.5 x a 0.148 ms split, re-timed 0.130 ms; conv4
    backward filter at n = 16, Find 0.227 ms, re-timed 0.107 (issue 16's fifth pass: about 1% of the WR plan at
    64 MiB).  The overhead at the smaller size is what the same configuration's Find time carried there."""
    if previous is None or previous.extra.get("timed", "median") != "median":
        return 0.0
    find = previous.extra.get("find_time_ms")
    if not isinstance(find, (int, float)):
        return 0.0
    return max(0.0, float(find) - previous.time_ms)


@dataclass
class SplitReference:
    """Split dominance (``BenchSettings.split_margin``): what WR can already do at micro-batch ``size`` of one kernel,
    from the rows recorded before it (every smaller size's, and other sources' at ``size``).

    Why a configuration c at size b slower than ``margin`` x :meth:`reference` (w_c) is never WR's choice, nor
    WD's: WR's DP (:mod:`ucudnn.planning.wr`) may run b samples as any sequence of measured micro-batches.  If c
    were in a plan under a limit M (so w_c <= M), replacing it by the split (smaller micro-batches, each needing
    no more than w_c) or by a faster configuration at b needing no more than w_c keeps the plan within M and
    makes it faster, so an optimal plan never holds c.  WD chooses per kernel among WR plans under per-kernel
    workspaces; the same replacement keeps the kernel's workspace and lowers its time, so a WD optimum never
    holds c either.  ``margin`` covers the estimates' error: the first sample (Find's single run, the graph
    source's quick sample) and, before any sample, c's own time at the largest smaller size as a lower bound
    (a call on more samples is not faster, up to noise: :meth:`unneeded`).  The smaller sizes' rows are what
    the planner will see, so the split is one the planner can build.

    Two restrictions keep it exact for every plan the table may be asked for:

    * splits use power-of-two sizes only: a table may be planned under any policy whose sizes it holds
      (``powerOfTwo`` from a ``powerOfTwoAndMidpoints`` or ``all`` table, :mod:`ucudnn.policy`), and every
      policy but ``undivided`` holds every power of two below the mini-batch;
    * at the kernel's full mini-batch (``full``) a split is no reference, only other configurations at that
      size: an ``undivided`` plan (cuDNN alone, the baseline that ``compare_policies`` and the benchmarks plan
      from the same table) runs that size whole, and a configuration slower than one needing no more workspace
      is not its choice either.
    """

    size: int
    full: bool
    margin: float
    smaller: list[Measurement]            # rows at power-of-two sizes below size
    same: list[Measurement]               # rows other sources recorded at size
    previous: dict[tuple, Measurement]    # identity -> its row at the largest smaller size
    _splits: dict[int, list[Measurement] | None] = field(default_factory=dict, repr=False)
    # A wrapper's inner rows: the kernel's own reference at this size, and the bytes the wrapper adds to an inner
    # configuration's workspace (BenchSettings.split_wrapped)
    outer: "SplitReference | None" = field(default=None, repr=False)
    outer_extra: int = 0

    @classmethod
    def of(cls, measured: Iterable[Measurement], size: int, batch: int, margin: float) -> "SplitReference":
        """From a kernel's rows so far (channel slices left out: they cover only some of the channels)."""
        smaller: list[Measurement] = []
        same: list[Measurement] = []
        previous: dict[tuple, Measurement] = {}
        for m in measured:
            if getattr(m, "channels", None) is not None:
                continue
            if m.micro_batch < size:
                if _power_of_two(m.micro_batch):
                    smaller.append(m)
                cur = previous.get(identity(m))
                if cur is None or m.micro_batch >= cur.micro_batch:
                    previous[identity(m)] = m
            elif m.micro_batch == size:
                same.append(m)
        return cls(size, size >= batch, margin, smaller, same, previous)

    def split(self, workspace: int) -> list[Measurement] | None:
        """The fastest split of ``size`` into smaller power-of-two micro-batches needing at most ``workspace`` (None
        at the full mini-batch: there it is no reference, see the class doc)."""
        return None if self.full else self._split(workspace)

    def extrapolated_ms(self, key: tuple) -> float:
        """The configuration ``key``'s (:func:`identity`) smallest time at a smaller size scaled linearly to
        ``size`` (inf: none recorded): a call on more samples rarely takes more than proportionally longer, so an
        estimate far over it is an outlier, not a reason to prune."""
        return min((m.time_ms * self.size / m.micro_batch for m in self.smaller if identity(m) == key),
                   default=math.inf)

    def split_ms(self, workspace: int) -> float:
        """ms of the fastest split within ``workspace``, at the full mini-batch too (inf: none): what WR weighs a
        configuration at ``size`` against, for a near-tie (the graph source's trusted quick sample)."""
        sp = self._split(workspace)
        return sum(m.time_ms for m in sp) if sp else math.inf

    def _split(self, workspace: int) -> list[Measurement] | None:
        # the rows that fit are set by the largest workspace among them that fits: one split per such threshold
        key = max((m.workspace_bytes for m in self.smaller if m.workspace_bytes <= workspace), default=None)
        if key is None:
            return None
        if key not in self._splits:
            from ...planning.wr import fastest_per_size

            # the fastest rows, not WR's host near-ties: a reference for GPU time (near-ties would raise it by up
            # to their fractions and prune less than the measured rows allow)
            fast = fastest_per_size(self.smaller, {m.micro_batch for m in self.smaller}, key, host_ties=False)
            self._splits[key] = split_plan(fast, self.size)
        return self._splits[key]

    def reference(self, workspace: int, others: Iterable[tuple[float, int]] = ()) -> tuple[float, str]:
        """(ms, what): the fastest known way to run ``size`` samples within ``workspace``: the split, another
        source's row at ``size``, or one of ``others`` (the caller's own (ms, workspace) at ``size``); for a wrapper's
        inner rows also the kernel's own reference within ``workspace + outer_extra``; inf: none."""
        best, what = math.inf, "nothing fits"
        sp = self.split(workspace)
        if sp:
            best = sum(m.time_ms for m in sp)
            what = "split " + "+".join(f"{n}x{b}" for b, n in sorted(Counter(m.micro_batch for m in sp).items(),
                                                                          reverse=True))
        for m in self.same:
            if m.workspace_bytes <= workspace and m.time_ms < best:
                best, what = m.time_ms, f"{m.source} {m.algo} at this size"
        for t, ws in others:
            if ws <= workspace and t < best:
                best, what = t, "another configuration at this size"
        if self.outer is not None:   # the wrapped row needs outer_extra more: the kernel's rows within that
            t, how = self.outer.reference(workspace + self.outer_extra)
            if t < best:
                best, what = t, f"the kernel's {how}"
        return best, what

    def dominates(self, estimate_ms: float, workspace: int, others: Iterable[tuple[float, int]] = ()) -> bool:
        """After the first sample: ``estimate_ms`` over ``margin`` x :meth:`reference` (record it, do not re-time)."""
        return estimate_ms > self.margin * self.reference(workspace, others)[0]

    def unneeded(self, source: str, algo: object, math_type: str, workspace: int,
                 others: Iterable[tuple[float, int]] = ()) -> str | None:
        """Before any sample: why this configuration need not be sampled at ``size`` at all (the ``Skipped``
        reason), or None.  Its own recorded time at the largest smaller size is a lower bound of its time here;
        a configuration with no row at a smaller size is always sampled."""
        prev = self.previous.get((source, str(algo), math_type))
        if prev is None:
            return None
        ref, what = self.reference(workspace, others)
        if not prev.time_ms > self.margin * ref:
            return None
        return (f"split-dominated: not sampled, {prev.time_ms:.4g} ms at n={prev.micro_batch} (a lower bound at "
                f"n={self.size}) > {self.margin:g} x {ref:.4g} ms ({what}, within {workspace} bytes)")


@dataclass
class Pruner:
    """One source's bookkeeping at one micro-batch size: which configurations to re-time, and how long.

    Feed it configurations in order of their first estimate, fastest first (so dominators and the best
    re-timed time are known early); :meth:`decide` says how to record each, :meth:`record` what came out.
    """

    settings: BenchSettings
    trust_long: bool = True    # False where the estimate is not the plan's call (Find: beta 0; plan: 1)
    estimates: list[tuple[float, int]] = field(default_factory=list)   # (first estimate ms, workspace) recorded
    timed: list[tuple[float, int]] = field(default_factory=list)       # (re-timed ms, workspace) recorded
    counts: dict[str, int] = field(default_factory=dict)               # how each configuration was recorded
    split: SplitReference | None = None   # split dominance at this size (BenchSettings.split_reference)

    def decide(self, estimate_ms: float, workspace: int, key: tuple | None = None) -> str | None:
        """None: re-time; else why the estimate is recorded instead (``dominated``, ``split-dominated``, ``long``,
        ``budget``).  ``key``: the configuration's :func:`identity`, where the estimate is Find's: split dominance
        then weighs it less Find's overhead on that configuration at the largest smaller size
        (:func:`find_overhead_ms`), and an estimate over ``confirm_factor`` x the configuration's own time at a
        smaller size scaled to this one (:meth:`SplitReference.extrapolated_ms`) decides nothing: it is re-timed.
        Why: Find timed legacy WINOGRAD_NONFUSED (AlexNet conv5 forward, n = 32, H100) at 0.819 ms where its median is
        0.135 ms and it ran 8 samples in 0.080 ms; split dominance on that estimate cost the WR plan 4%."""
        implausible = key is not None and self.split is not None and self.settings.confirm_factor is not None \
            and estimate_ms > self.settings.confirm_factor * self.split.extrapolated_ms(key)
        if not implausible:   # an implausible estimate decides nothing: it is timed (within the budget)
            if dominated(estimate_ms, workspace, self.estimates, self.settings.prune_margin):
                return "dominated"
            if self.split is not None:
                split_ms = estimate_ms
                if key is not None:
                    split_ms -= find_overhead_ms(self.split.previous.get(key))
                if self.split.dominates(split_ms, workspace):
                    return "split-dominated"
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

    def retime(self, time: Callable[[Callable[[float], bool] | None], float], estimate_ms: float | None,
              workspace: int) -> tuple[float, str]:
        """Time one configuration with the early stop and record it: ``time(give_up)`` runs the timing
        (:func:`time_config` with that ``give_up``: None when early stop is off).  Returns (ms, how): ``median``, or
        ``first-sample`` when the first sample was :meth:`hopeless`.  ``estimate_ms``: the configuration's first
        estimate (Find's time, the inner measurement), None where it has none but this timing.  An error in
        ``time`` propagates and nothing is recorded (the source records the configuration as skipped)."""
        stopped: list[float] = []

        def give_up(ms: float) -> bool:
            if self.hopeless(ms, workspace):
                stopped.append(ms)
            return bool(stopped)

        t = time(give_up if self.settings.hopeless_factor is not None else None)
        how = "first-sample" if stopped else "median"
        if not stopped and estimate_ms is not None:
            t = self.confirm(lambda: time(None), estimate_ms, t)
        self.record(t if estimate_ms is None else estimate_ms, workspace, None if stopped else t, how)
        return t, how

    def confirm(self, time: Callable[[], float], estimate_ms: float, median_ms: float) -> float:
        """``median_ms``, or where it is over ``confirm_factor`` x ``estimate_ms`` the smaller of it and one more
        median ``time()`` (``BenchSettings.confirm_factor``; counted as ``confirmed``)."""
        k = self.settings.confirm_factor
        if k is None or not median_ms > k * estimate_ms:
            return median_ms
        self.counts["confirmed"] = self.counts.get("confirmed", 0) + 1
        return min(median_ms, time())

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


def host_extra(ms: float | None) -> dict[str, float]:
    """``{"host_ms": ms}`` (the host's enqueue ms per call of an eager timing, 4 decimals of a ms: what
    :class:`ucudnn.binding.timing.HostRecorder` read), else ``{}``: a measurement records host work only where it
    was measured (tables: ``host_ms``; why: :mod:`ucudnn.binding.timing`)."""
    return {} if ms is None else {"host_ms": round(ms, 4)}


def timed_beta(op: str, problem: ConvProblem | None = None) -> float:
    """The beta every source measures ``op`` with: the one most of a plan's steps run.

    Backward filter sums over micro-batches, so every step after a plan's first runs with beta = 1
    (:class:`ucudnn.execute.Executor`), and some algorithms are slower so: on an H100, legacy WINOGRAD_NONFUSED
    wgrad (AlexNet conv2, TF32, n = 16) timed 1.5 ms with beta = 0 (Find's way) and ran 2.5-2.8 ms per 256
    samples in a plan.  Backward data of a channel slice (``problem.k_total``, issue 18) adds into dx: every
    slice after a plan's first runs with beta = 1.  The other ops run with the caller's beta, 0 in training."""
    return 1.0 if op == "backward_filter" or (op == "backward_data" and problem is not None
                                               and problem.k_total is not None) else 0.0


#: One configuration made ready to run: ``launch(ops, workspace, workspace_bytes, alpha, beta)`` computes
#: out = alpha * op(a, b) + beta * out on CuPy's current stream.
Launch = Callable[[Operands, int, int, float, float], None]

#: A launcher's shortcut for the common call of a one-step plan, set as its ``direct`` attribute by the sources
#: that have one (graph, legacy): ``direct(a, b, out, workspace, workspace_bytes, stream) -> bool`` computes
#: out = op(a, b) (alpha 1, beta 0) on raw pointers on ``stream`` (a ``cudaStream_t``, the current device's), with
#: no CuPy context, and returns False, having done nothing, when this call needs the full launcher (operands
#: not aligned as the engine needs, another device than the one prepared on, too little workspace).
#:
#: Why: the torch layer launches every convolution of a training step three times; each of those launches
#: used to go through CuPy's device and stream contexts, the executor, the launcher and the frontend's Python
#: wrapper, 40-50 Python frames, and inside a real step (caches cold) that cost 150-200 us of host time per
#: launch: ResNet-50 AMP on an H100 was host-bound at 44-50 ms per step against PyTorch's 28
#: (``benchmarks/results/torch_profile-resnet50-amp.md``).
Direct = Callable[[int, int, int, int, int, int], bool]


def direct_of(launch: Launch) -> Direct | None:
    """``launch``'s :data:`Direct` shortcut, or None when its source has none."""
    return getattr(launch, "direct", None)


@dataclass(frozen=True)
class Native:
    """A launcher's call described as data, set as its ``native`` attribute beside :data:`Direct` by the sources
    whose calls a compiled launch path can make itself (ucudnn.torch's ``csrc/launch.cpp``): out = op(a, b) with
    alpha 1 and beta 0 (legacy: or 1, for a step that accumulates) through cuDNN's C API, no Python in between.

    ``kind`` "legacy": ``descriptors`` (a, b, out, convolution: the source's own cuDNN descriptors, owned by
    ``keep``, which must outlive every launch made from them) and ``algo``.  ``kind`` "graph": the engine
    configuration (``engine_id``, ``knobs``: cudnnBackendKnobType_t number -> choice) of ``problem``, rebuilt
    there through the backend API, and the engine's own workspace (``engine_bytes``).  ``kind`` "kernel": ucudnn's
    own kernels, ``calls`` (``kernels._compile.Call``: function, grid, block, shared memory and arguments each,
    the operands and alpha / beta filled at launch; beta 1 for a step that accumulates), launched by the driver.

    Why data and not another closure: the point is to leave Python; a compiled path can hold numbers, not
    frames."""

    kind: str
    op: str
    problem: ConvProblem
    descriptors: tuple[int, ...] = ()
    algo: int = 0
    engine_id: int = -1
    knobs: tuple[tuple[int, int], ...] = ()
    engine_bytes: int = 0
    calls: tuple = ()
    keep: Any = None
    #: a legacy configuration's graph-API twin (kind "graph": the engine cuDNN runs the algorithm as, built once;
    #: :meth:`~ucudnn.measure.sources.graph.GraphSource.twin`), which a compiled path runs instead of the legacy
    #: call for steps that do not accumulate (less host work, the same kernels); None: the legacy call always
    twin: "Native | None" = None


def native_of(launch: Launch) -> Native | None:
    """``launch``'s :class:`Native` description, or None when its source has none."""
    return getattr(launch, "native", None)


def measured_or_skipped(name: str, mb: int, refusal: Callable[[], str | None],
                        measure: Callable[[], tuple[list[Measurement], list[Skipped]]]
                        ) -> tuple[list[Measurement], list[Skipped]]:
    """``measure()`` for a source whose ``measure`` must never raise (ucudnn's own kernels: a compile or launch
    failure on some shape is a row, not a failed benchmark): a problem the source refuses (``refusal()``, a
    reason or None) and any unexpected failure both become one :class:`Skipped` row saying why."""
    try:
        why = refusal()
        if why:
            return [], [Skipped(mb, None, None, f"{name}: {why}")]
        return measure()
    except Exception as e:  # noqa: BLE001 - an unexpected failure is a skipped row
        return [], [Skipped(mb, None, None, f"{name}: {summary(e)}")]


class AlgorithmSource(Protocol):
    name: str
    #: Sources that set ``channel_slices = True`` (legacy, graph) measure and run channel slices: problems with
    #: ``k_total`` set, whose y (dy) is a strided view (issue 18).  The benchmark offers slices to those only.

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

    def time_prepared(self, op: str, problem: ConvProblem, config: Measurement, ops: Operands, workspace: int,
                      beta: float, settings: BenchSettings, pruner: "Pruner") -> Measurement | Skipped:
        """``config`` (time 0) prepared and timed as execution runs it, through ``pruner``'s early stop: its row,
        ``extra`` gaining how it was timed, or a ``Skipped`` naming this source and why (a capture failure, or
        any error of this configuration alone: cuBLAS, CuPy, out of memory)."""
        from ...binding.timing import HostRecorder

        mb, algo, label, ws = config.micro_batch, config.algo, config.math_type, config.workspace_bytes
        try:
            launch = self.prepare(op, problem, config)
            with HostRecorder() as host:
                t, how = pruner.retime(lambda give_up: time_config(lambda: launch(ops, workspace, ws, 1.0, beta),
                                                                  settings, give_up=give_up), None, ws)
        except CaptureError as e:
            return Skipped(mb, algo, label, f"{self.name}: {e}")  # type: ignore[attr-defined]
        except Exception as e:  # noqa: BLE001 - cuBLAS / CuPy / out-of-memory: this configuration only
            return Skipped(mb, algo, label, f"{self.name}: {summary(e)}")  # type: ignore[attr-defined]
        return Measurement(mb, algo, label, max(t, 1e-6), ws, config.source, config.channels,
                           {**config.extra, "timed": how, **host_extra(host.ms)})
