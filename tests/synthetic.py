"""Small synthetic benchmark tables for planner tests (no GPU, no recorded data needed).

The cost model mimics the shapes real tables have: an algorithm with no
workspace that is slow, algorithms whose workspace grows with the
micro-batch and that are fast, one with a fixed workspace, and a per-launch
overhead that makes tiny micro-batches inefficient.  Numbers are made up;
tests built on them check planner logic, never performance.
"""
from __future__ import annotations

import random

from ucudnn.planning.table import BenchmarkTable, KernelBench, Measurement
from ucudnn.policy import micro_batch_sizes
from ucudnn.problem import ConvProblem

MiB = 1 << 20


def kernel(name: str, batch: int, seed: int, policy: str = "all", op: str = "forward", c: int = 64,
           n_algos: int = 4) -> KernelBench:
    rng = random.Random(seed)
    problem = ConvProblem(batch, c, 28, 28, 64, 3, 3, (1, 1))
    # (per-sample ms, workspace per sample, fixed workspace, launch overhead ms)
    algos = [(1.0, 0, 0, 0.05)]
    for _ in range(n_algos - 1):
        algos.append((rng.uniform(0.2, 0.8), rng.choice([0, 1, 2, 4]) * MiB // 8,
                      rng.choice([0, 1, 8, 32]) * MiB, rng.uniform(0.02, 0.3)))
    ms = []
    for b in micro_batch_sizes(policy, batch):
        for a, (per, ws_per, ws_fix, over) in enumerate(algos):
            t = over + per * b * rng.uniform(0.95, 1.05)
            ms.append(Measurement(b, a, "FMA", round(t, 4), ws_per * b + ws_fix))
    return KernelBench(name, op, problem, ms)


def table(n_kernels: int = 6, batch: int = 32, policy: str = "all", seed: int = 0, repeats: int = 1) -> BenchmarkTable:
    """``n_kernels`` distinct kernels; with ``repeats`` > 1 each appears that many times (same problem)."""
    kernels = []
    for i in range(n_kernels):
        base = kernel(f"conv{i}/forward", batch, seed * 1000 + i, policy, c=16 * (i + 1))
        for r in range(repeats):
            name = base.name if r == 0 else f"conv{i}_{r}/forward"
            kernels.append(KernelBench(name, base.op, base.problem, base.measurements))
    return BenchmarkTable("Synthetic GPU", 90000, kernels, "strict")


def from_options(batch: int, options: dict[int, list[tuple[float, int]]], name: str = "k/forward") -> KernelBench:
    """A kernel measured exactly at ``options``: {micro_batch: [(time_ms, workspace_bytes), ...]}."""
    problem = ConvProblem(batch, 8, 8, 8, 8, 3, 3, (1, 1))
    ms = [Measurement(b, a, "FMA", t, w) for b, opts in options.items() for a, (t, w) in enumerate(opts)]
    return KernelBench(name, "forward", problem, ms)
