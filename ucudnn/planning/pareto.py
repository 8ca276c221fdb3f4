"""Desirable configuration sets: the modified DP of μ-cuDNN (seed 003, section 3.3.1).

A *configuration* of a kernel is a list of micro-configurations (micro-batch,
algorithm, math type) whose micro-batches sum to the mini-batch B.  They run
one after another and share one workspace, so

    T(c) = sum of the micro-configurations' times,   M(c) = max of their workspaces.

WD's ILP needs, per kernel, only the configurations no other one beats in both
time and workspace: the desirable set D(C) (the Pareto front).  The seed builds
it with a DP that carries sets instead of single optima:

    C(b) = D( C_u(b)  ∪  ⋃_{b_u}  ⋃_{c_u ∈ C_u(b_u)}  ⋃_{c ∈ C(b - b_u)}  {c_u} + c )

That loses nothing: if c_u + r is desirable and r is not in C(b - b_u), some
r' in C(b - b_u) is no slower and needs no more workspace, and c_u + r' then
does as well as c_u + r (time adds, workspace takes the max).

How it is computed here (and why it is fast).  M(c) can only take the values
of the measured workspaces, L of them.  A desirable set is therefore fully
described by its *staircase*: for each level l, the fastest time of a
configuration whose workspace is <= levels[l].  With C(b) held as that
staircase T[b, :], the union-then-prune of the recurrence becomes an
element-wise minimum, and ``{c_u} + c`` becomes an addition of two
staircases at the same level (max(M(c_u), M(c)) <= level iff both are):

    T[b, l] = min( T_u[b, l],  min_{b_u <= b/2} T_u[b_u, l] + T[b - b_u, l] )

which numpy evaluates for all levels at once.  D(C(B)) is then read off the
steps of T[B, :]: a level where the time drops is a desirable configuration,
and its workspace is exactly that level.  Only b_u <= b/2 is tried because
every configuration of two or more micro-batches contains one of at most b/2
(the seed's pruning).  Cost: O(sum_b |{b_u <= b/2}| x L) vectorised
operations, e.g. ~16k rows of L for the ``all`` policy at B = 256.

Channel slices (issue 18): measurements of a slice of the output channels get a staircase of their own;
:func:`ucudnn.planning.channels.combine` covers k per level (a slice of c channels at level l costs its
staircase's T[B, l]; all slices of a configuration fit level l iff each does), element-wise as above.

Repeated (problem, op) kernels share one desirable set (see :func:`desirable_sets`).
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence, TypeVar

import numpy as np

from ..policy import micro_batch_sizes
from .channels import combine
from .plan import division_summary
from .table import BenchmarkTable, KernelBench, Measurement

T = TypeVar("T")


@dataclass(frozen=True)
class Configuration:
    """One way to run a kernel: ``micro`` run in sequence (largest micro-batch first)."""

    micro: tuple[Measurement, ...]

    @property
    def time_ms(self) -> float:
        return sum(m.time_ms for m in self.micro)

    @property
    def workspace_bytes(self) -> int:
        return max((m.workspace_bytes for m in self.micro), default=0)

    @property
    def batch(self) -> int:
        """The micro-batches' sum: the mini-batch without channel slices; with them, the mini-batch times the
        number of slices (:attr:`ucudnn.planning.plan.KernelPlan.batch` knows k and gives the mini-batch)."""
        return sum(m.micro_batch for m in self.micro)

    def summary(self) -> str:
        return division_summary(self.micro)


def pareto(items: Iterable[T], time: Callable[[T], float], workspace: Callable[[T], int]) -> list[T]:
    """The seed's D: items no other item beats in both time and workspace, by workspace ascending.

    Of items equal in both, the first is kept.  Each kept item is strictly
    faster than every kept item with less workspace.
    """
    ordered = sorted(items, key=lambda x: (workspace(x), time(x)))
    out: list[T] = []
    best = math.inf
    for x in ordered:
        t = time(x)
        if t < best:
            out.append(x)
            best = t
    return out


def desirable_set(kernel: KernelBench, batch_policy: str = "powerOfTwo",
                  max_workspace: int | None = None) -> list[Configuration]:
    """D(C(B)) for one kernel, workspace ascending (so time descending); [] if no configuration exists.

    ``max_workspace`` drops measurements above it first (nothing above a WD
    budget can be chosen), which also shrinks the DP.
    """
    return _desirable(kernel.measurements, kernel.problem.n, batch_policy, max_workspace, kernel.problem.k)


def _desirable(measurements: Sequence[Measurement], batch: int, batch_policy: str,
               max_workspace: int | None, k: int | None = None) -> list[Configuration]:
    allowed = set(micro_batch_sizes(batch_policy, batch))
    groups: dict[int | None, dict[int, list[Measurement]]] = {}   # channel slice -> micro-batch -> options
    for m in measurements:
        if m.micro_batch in allowed and (max_workspace is None or m.workspace_bytes <= max_workspace):
            groups.setdefault(m.channels, {}).setdefault(m.micro_batch, []).append(m)
    if not groups:
        return []
    # C_u(b_u): only desirable micro-configurations can appear in a desirable configuration
    options = {ch: {s: pareto(ms, lambda m: m.time_ms, lambda m: m.workspace_bytes) for s, ms in by_size.items()}
               for ch, by_size in groups.items()}
    levels = sorted({m.workspace_bytes for by_size in options.values() for opts in by_size.values() for m in opts})
    staircases = {ch: _batch_staircase(by_size, batch, levels) for ch, by_size in options.items()}
    slices = {ch: st for ch, st in staircases.items() if ch is not None and k is not None}
    if slices:   # channel slices (issue 18): cover k per level, then each slice's own batch division
        whole = staircases.get(None)
        best, cover = combine(k, whole[0] if whole else None, {c: st[0] for c, st in slices.items()})
        pick = lambda level: [m for c in cover(level) for m in staircases[c][1](level)]  # noqa: E731
    elif None in staircases:
        best, pick = staircases[None]
    else:
        return []

    out: list[Configuration] = []
    prev = math.inf
    for level in range(len(levels)):
        cur = best[level]
        if not cur < prev:
            continue
        prev = cur
        out.append(Configuration(tuple(pick(level))))
    # the DP sums in its own order; re-prune on the reconstructed sums so times match KernelPlan.time_ms exactly
    return pareto(out, lambda c: c.time_ms, lambda c: c.workspace_bytes)


def _batch_staircase(options: dict[int, list[Measurement]], batch: int, levels: list[int]
                     ) -> tuple[np.ndarray, Callable[[int], list[Measurement]]]:
    """The batch DP over staircases (module doc): the fastest time per workspace level for ``batch`` samples,
    and the micro-configurations of that optimum at one level (largest micro-batch first)."""
    sizes = sorted(options)
    opts = [options[s] for s in sizes]
    n_levels = len(levels)
    # T_u staircases: fastest option of each size at each workspace level, and which one it is
    tu = np.full((len(sizes), n_levels), np.inf)
    tu_pick = np.full((len(sizes), n_levels), -1, dtype=np.int32)
    for i, size_opts in enumerate(opts):
        starts = [bisect.bisect_left(levels, m.workspace_bytes) for m in size_opts] + [n_levels]
        for j, m in enumerate(size_opts):  # workspace ascending, time strictly descending
            tu[i, starts[j]:starts[j + 1]] = m.time_ms
            tu_pick[i, starts[j]:starts[j + 1]] = j

    size_arr = np.asarray(sizes)
    index_of = {s: i for i, s in enumerate(sizes)}
    t = np.full((batch + 1, n_levels), np.inf)
    t[0] = 0.0
    choice = np.full((batch + 1, n_levels), -1, dtype=np.int32)  # index into sizes of the micro-batch split off
    for b in range(1, batch + 1):
        n_split = bisect.bisect_right(sizes, b // 2)
        if n_split:
            cand = tu[:n_split] + t[b - size_arr[:n_split]]
            arg = cand.argmin(axis=0)
            best = cand[arg, np.arange(n_levels)]
        else:
            arg = np.full(n_levels, -1)
            best = np.full(n_levels, np.inf)
        i = index_of.get(b)
        if i is not None:  # running b undivided wins ties: fewer launches
            whole = tu[i] <= best
            best = np.where(whole, tu[i], best)
            arg = np.where(whole, i, arg)
        t[b] = best
        choice[b] = np.where(np.isfinite(best), arg, -1)

    def micro(level: int) -> list[Measurement]:
        out: list[Measurement] = []
        b = batch
        while b > 0:
            i = int(choice[b, level])
            out.append(opts[i][int(tu_pick[i, level])])
            b -= sizes[i]
        out.sort(key=lambda m: -m.micro_batch)
        return out

    return t[batch], micro


def desirable_sets(table: BenchmarkTable, batch_policy: str = "powerOfTwo",
                   max_workspace: int | None = None) -> dict[str, list[Configuration]]:
    """Desirable sets of every kernel of ``table`` by kernel name, each (problem, op) computed once."""
    memo: dict[tuple[str, str], list[Configuration]] = {}
    out: dict[str, list[Configuration]] = {}
    for k in table.kernels:
        key = (k.problem.key(), k.op)
        if key not in memo:
            memo[key] = desirable_set(k, batch_policy, max_workspace)
        out[k.name] = memo[key]
    return out


def fastest_within(configs: Sequence[Configuration], limit: int) -> Configuration | None:
    """The fastest desirable configuration needing at most ``limit`` bytes (the WR optimum at that limit)."""
    fit = [c for c in configs if c.workspace_bytes <= limit]
    return fit[-1] if fit else None
