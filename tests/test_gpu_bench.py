"""Fast benchmarking on the GPU (issue 16): the same plans, less time (skipped without a GPU).

On a small network kernel set (AlexNet at batch 32, FP32 strict): pruning on and off plan the same WR
algorithms (up to timing noise between two runs), pruned rows say so, and the early stop and the per-kernel
budget bound the benchmarking time.
"""
from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.gpu

MiB = 1 << 20
OFF = {"prune_margin": None, "hopeless_factor": None, "kernel_budget_s": None, "split_margin": None}
NOISE = 0.03   # two unpruned runs of the same kernels differ by up to a few % on near-ties


@pytest.fixture(scope="module")
def kernels():
    from ucudnn.planning.network import load_network

    specs = load_network("alexnet").kernels(32, "float32", "NCHW", ops=("forward", "backward_data"))
    return specs[2:6]   # conv2, conv3: each with algorithms Find shows many times slower than the best


@pytest.fixture(scope="module")
def tables(kernels):
    from ucudnn.measure.benchmarking import benchmark

    def timed(**kw):
        t0 = time.perf_counter()
        table = benchmark(kernels, "powerOfTwo", "strict", sources="legacy", **kw)
        return table, time.perf_counter() - t0

    benchmark(kernels[:1], "powerOfTwo", "strict", sources="legacy")   # warm cuDNN's lazily loaded kernels
    return {"off": timed(**OFF), "on": timed()}


def test_pruning_on_and_off_plan_the_same_wr_algorithms(tables):
    """Same algorithms per kernel, or (two runs' timing noise on a near-tie) the same cost at the off run's times."""
    from ucudnn.planning.planner import plan

    (off, _), (on, _) = tables["off"], tables["on"]
    for limit in (8 * MiB, 64 * MiB):
        p_off = plan(off, "wr", workspace_limit=limit)
        p_on = plan(on, "wr", workspace_limit=limit)
        for k_off, k_on in zip(p_off.kernels, p_on.kernels):
            key = lambda c: (c.micro_batch, c.algo, c.math_type)  # noqa: E731
            if [key(c) for c in k_off.configs] == [key(c) for c in k_on.configs]:
                continue
            at_off = {key(m): m.time_ms for m in off.kernel(k_on.name).measurements}
            assert sum(at_off[key(c)] for c in k_on.configs) <= k_off.time_ms * (1 + NOISE), k_on.name
        assert all(c.extra.get("pruned") != "dominated" for k in p_on.kernels for c in k.configs), \
            "a configuration pruned as dominated was chosen: another is faster and fits wherever it does"


def test_pruned_measurements_carry_the_marker_and_find_time(tables):
    from ucudnn.measure.sources.base import BenchSettings

    on, _ = tables["on"]
    rows = [m for k in on.kernels for m in k.measurements]
    assert all(m.extra.get("timed") in ("median", "find", "first-sample") for m in rows)
    pruned = [m for m in rows if m.extra["timed"] == "find"]
    assert pruned and all(m.extra["pruned"] in ("dominated", "long", "budget", "split-dominated") for m in pruned)
    assert on.extra["pruning"]["prune_margin"] == BenchSettings.prune_margin
    off, _ = tables["off"]
    assert {m.extra.get("timed") for k in off.kernels for m in k.measurements} == {"median"}
    assert sum(len(k.measurements) for k in off.kernels) == len(rows), "pruning records every configuration"


def test_pruning_takes_less_time(tables):
    (_, t_off), (_, t_on) = tables["off"], tables["on"]
    assert t_on < t_off


def test_early_stop_records_first_samples_and_saves_time(kernels):
    from ucudnn.measure.benchmarking import benchmark

    t0 = time.perf_counter()
    table = benchmark(kernels[:2], "powerOfTwo", "strict", sources="legacy", prune_margin=None, hopeless_factor=1.0,
                      kernel_budget_s=None)
    t_stop = time.perf_counter() - t0
    t0 = time.perf_counter()
    benchmark(kernels[:2], "powerOfTwo", "strict", sources="legacy", **OFF)
    t_full = time.perf_counter() - t0
    how = [m.extra["timed"] for k in table.kernels for m in k.measurements]
    assert "first-sample" in how and "median" in how
    assert t_stop < t_full


def test_the_kernel_budget_bounds_the_retiming(kernels):
    from ucudnn.measure.benchmarking import benchmark

    table = benchmark(kernels[:1], "powerOfTwo", "strict", sources="legacy", prune_margin=None, hopeless_factor=None,
                      kernel_budget_s=0.05)
    k = table.kernels[0]
    budget = [m for m in k.measurements if m.extra.get("pruned") == "budget"]
    assert budget, "a 50 ms budget cannot re-time every configuration of every micro-batch"
    # what remains is Find's own time at each size: bounded by Find, not by re-timing
    timed = sum(1 for m in k.measurements if m.extra["timed"] == "median")
    assert timed < len(k.measurements)
