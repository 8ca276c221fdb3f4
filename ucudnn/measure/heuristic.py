"""Heuristic kernel plans: run a convolution now on cuDNN's own choice of algorithm, benchmark it later.

Why: a first call that benchmarks waits for it (AlexNet b256 ``powerOfTwo``: 7.8 s).  With
``UCUDNN_BENCHMARK=heuristic`` the first call instead runs the plan made here, while the real benchmark
runs later and replaces it.  cuDNN's ``Get*Algorithm_v7`` heuristics rank the algorithms without running
any, so the plan costs a few heuristic and workspace queries, no timing and no ``cudnnFind``.

The plan: the largest micro-batch size of the batch policy at which some candidate fits the workspace
limit, repeated as often as it goes into the mini-batch, then the remainder covered the same way at the
next sizes down (:func:`compose`).  At each size the candidate is the best-ranked one that is allowed
(success status, a math type of the numerics, deterministic where asked) and whose workspace, as
``cudnnGet*WorkspaceSize`` reports it (what the executor checks; the heuristic's own figure agreed with it
on every row tried on an H100, cuDNN 9.19, but it is not the contract), fits.  The walk queries the sizes
from the top down to the first that fits, then only those the remainder uses: on an H100 a plan takes
0.4-13 ms (tests/test_gpu_heuristic.py), against seconds for a benchmark.
Most problems have a zero-workspace algorithm at every size, so a tight limit mostly gives an undivided
plan on a lower-ranked algorithm: whether a faster one on micro-batches pays is for the benchmark to say.

Every micro-configuration is an ordinary ``legacy`` one, so the executor runs it exactly like a
benchmarked one; its ``time_ms`` is :data:`UNTIMED_MS` and ``extra["timed"] == "heuristic"`` (with the
candidate's ``rank``, 0 = cuDNN's first choice), so no consumer takes it for a measurement.
"""
from __future__ import annotations

from typing import Callable, Sequence

from .. import numerics as num
from ..binding import cudnn
from ..binding.gpu import descriptors, handle
from ..errors import CudnnError
from ..planning.plan import KernelPlan, MicroConfig
from ..planning.table import KernelBench, Measurement
from ..planning.wr import plan_kernel, solve
from ..policy import micro_batch_sizes
from ..problem import ConvProblem

#: the ``time_ms`` of an untimed configuration: positive and finite (the table and plan formats ask for
#: that) and far above any real convolution, so a planner mixing it with measurements never prefers it
UNTIMED_MS = 1e6

#: the order in which the math types' rankings are interleaved: tensor-op variants first where the numerics
#: allow them (cuDNN 9 ranks them only when the descriptor asks, and they are the fast ones: see
#: :func:`ucudnn.numerics.allowed_math_types`), true FP32 (FMA) last
MATH_PREFERENCE = ("TENSOR_OP", "DEFAULT", "TENSOR_OP_ALLOW_CONVERSION", "FMA")


def compose(n: int, sizes: Sequence[int], fits: Callable[[int], Measurement | None]) -> list[Measurement] | None:
    """Micro-configurations summing to ``n``: the largest size that ``fits`` as often as it goes, then the
    remainder the same way at the smaller sizes; None if no division of ``n`` into fitting sizes exists.

    ``fits(size)`` is the configuration to run at ``size`` (None: nothing fits there); it is called at most
    once per size, and only for sizes the greedy walk reaches, so the caller's queries stay few.  Where the
    walk strands a remainder (fitting is not monotone in the size, e.g. 8 = 5 + 3 with only 4 and 5 fitting),
    every size is asked and WR's dynamic programme finds a division with the fewest micro-batches.
    """
    found: dict[int, Measurement | None] = {}

    def fit(size: int) -> Measurement | None:
        if size not in found:
            found[size] = fits(size)
        return found[size]

    out: list[Measurement] = []
    rest = n
    for size in sorted(sizes, reverse=True):
        if size > rest or (m := fit(size)) is None:
            continue
        out += [m] * (rest // size)
        rest %= size
        if rest == 0:
            return out
    return solve(n, {s: m for s in sizes if s <= n and (m := fit(s)) is not None})


def heuristic_plan(problem: ConvProblem, op: str, workspace_limit: int, batch_policy: str, numerics: str | None,
                   name: str | None = None) -> KernelPlan:
    """A plan for ``op`` on ``problem`` from cuDNN's heuristics, within ``workspace_limit`` bytes (GPU).

    Raises :class:`~ucudnn.errors.InfeasibleError` (WR's, over every candidate) naming the smallest limit
    under which the heuristics' candidates give a plan (its ``min_workspace``; None when they give none at any
    limit).  Finding that limit asks every size of the policy, which only this failure pays for.
    """
    name = name or op
    sizes = micro_batch_sizes(batch_policy, problem.n)
    ranking = _Ranking(problem, op, num.normalize(numerics, problem.dtype))
    configs = compose(problem.n, sizes, lambda mb: ranking.first_fitting(mb, workspace_limit))
    if configs is None:   # then WR over every candidate finds no plan either, and its error names the least limit
        kernel = KernelBench(name, op, problem, [m for mb in sizes for m in ranking.every(mb)])
        configs = plan_kernel(kernel, workspace_limit, batch_policy)
    return KernelPlan(name, op, problem, [MicroConfig.of(m) for m in configs])


class _Ranking:
    """cuDNN's allowed candidates for one kernel at each micro-batch size, best first (heuristics cached)."""

    def __init__(self, problem: ConvProblem, op: str, numerics: str):
        self.problem, self.op = problem, op
        self.allowed = num.allowed_math_types(numerics, problem.dtype)
        self.deterministic = num.deterministic_only(numerics)
        self.handle = handle()
        self.requested = 2 * cudnn.get_algorithm_max_count(self.handle, op)   # as Find asks: room for variants
        self._ranked: dict[int, list[cudnn.PerfResult]] = {}

    def ranked(self, mb: int) -> list[cudnn.PerfResult]:
        """The allowed heuristic results at ``mb``: each math type's ranking (asked under that math type, since
        cuDNN 9 offers tensor-op variants only when asked), interleaved rank by rank in
        :data:`MATH_PREFERENCE` order; failed, disallowed, non-deterministic (where that matters) and
        repeated (algo, math type) rows dropped."""
        if mb in self._ranked:
            return self._ranked[mb]
        sub = self.problem.with_batch(mb)
        rankings: list[list[cudnn.PerfResult]] = []
        error: CudnnError | None = None
        for math in (m for m in MATH_PREFERENCE if m in self.allowed):
            d = descriptors(sub, math)
            a, b, out = d.operands(self.op)
            try:
                rankings.append(cudnn.get_algorithm_v7(self.handle, self.op, a, b, d.conv, out, self.requested))
            except CudnnError as e:   # this math type has no ranking here; the others may
                error = e
        if error is not None and not rankings:
            raise error
        seen: set[tuple[int, str]] = set()
        ranked: list[cudnn.PerfResult] = []
        for rank in range(max(map(len, rankings), default=0)):
            for r in (ranking[rank] for ranking in rankings if rank < len(ranking)):
                key = (r.algo, r.math_type)
                if (r.status == 0 and r.math_type in self.allowed and key not in seen
                        and (r.deterministic or not self.deterministic)):
                    seen.add(key)
                    ranked.append(r)
        self._ranked[mb] = ranked
        return ranked

    def sized(self, mb: int, rank: int, r: cudnn.PerfResult) -> Measurement | None:
        """``r`` at ``mb`` with the workspace ``cudnnGet*WorkspaceSize`` reports, the figure the executor checks
        (None: cuDNN cannot size it, so it could not run it either)."""
        d = descriptors(self.problem.with_batch(mb), r.math_type)
        a, b, out = d.operands(self.op)
        try:
            workspace = cudnn.get_workspace_size(self.handle, self.op, a, b, d.conv, out, r.algo)
        except CudnnError:
            return None
        return Measurement(mb, r.algo, r.math_type, UNTIMED_MS, workspace,
                           extra={"timed": "heuristic", "rank": rank, "deterministic": r.deterministic})

    def first_fitting(self, mb: int, limit: int) -> Measurement | None:
        """The best-ranked candidate at ``mb`` that fits ``limit``; workspaces asked in rank order, up to it."""
        for rank, r in enumerate(self.ranked(mb)):
            m = self.sized(mb, rank, r)
            if m is not None and m.workspace_bytes <= limit:
                return m
        return None

    def every(self, mb: int) -> list[Measurement]:
        """Every candidate at ``mb`` that cuDNN can size."""
        return [m for rank, r in enumerate(self.ranked(mb)) if (m := self.sized(mb, rank, r)) is not None]

