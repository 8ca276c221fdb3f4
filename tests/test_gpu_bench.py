"""Fast benchmarking on the GPU (issue 16): the same plans, less time (skipped without a GPU).

On a small network kernel set (AlexNet at batch 32, FP32 strict): pruning on and off plan the same WR
algorithms (up to timing noise: priced at the fastest of two unpruned runs), pruned rows say so, and the early stop and the per-kernel
budget bound the benchmarking time.
"""
from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.gpu

MiB = 1 << 20
OFF = {"prune_margin": None, "hopeless_factor": None, "kernel_budget_s": None, "split_margin": None}
NOISE = 0.10   # per kernel: two runs differ by a few % on near-ties of 0.1-0.2 ms calls (3.4% seen on conv3)
PLAN_BAR = 0.01   # issue 16: planned totals within 1% of the unpruned plans


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
    return {"off": timed(**OFF), "on": timed(), "off2": timed(**OFF)}


def _without_host(table):
    """``table`` with no ``host_ms``: WR then plans the fastest configuration at each size."""
    import dataclasses

    from ucudnn.planning.table import KernelBench

    return dataclasses.replace(table, kernels=[
        KernelBench(k.name, k.op, k.problem, [dataclasses.replace(m, extra={x: v for x, v in m.extra.items()
                                                                             if x != "host_ms"})
                                              for m in k.measurements], k.skipped, k.benchmark_seconds)
        for k in table.kernels])


def test_pruning_on_and_off_plan_the_same_wr_algorithms(tables):
    """Same algorithms per kernel, or (timing noise on a near-tie) the same cost at the unpruned runs' times: each
    configuration at the fastest of two unpruned runs (``pruning.fastest_of``: noise only adds time), the pruned plan's
    total within 1% of the unpruned one's there, each kernel within the noise of a near-tie."""
    from ucudnn.measure.pruning import fastest_of
    from ucudnn.planning.planner import plan

    (off, _), (off2, _), (on, _) = tables["off"], tables["off2"], tables["on"]
    # pruning's question is the fastest configuration's: plan without host near-ties (each run's host times would
    # otherwise move picks within HOST_TIE_FRACTION, a planning rule this test is not about)
    ref, on = _without_host(fastest_of([off, off2])), _without_host(on)
    for limit in (8 * MiB, 64 * MiB):
        p_ref = plan(ref, "wr", workspace_limit=limit)
        p_on = plan(on, "wr", workspace_limit=limit)
        total = 0.0
        for k_ref, k_on in zip(p_ref.kernels, p_on.kernels):
            key = lambda c: (c.micro_batch, c.algo, c.math_type)  # noqa: E731
            at_ref = {key(m): m.time_ms for m in ref.kernel(k_on.name).measurements}
            cost = sum(at_ref[key(c)] for c in k_on.configs)
            total += cost
            if [key(c) for c in k_ref.configs] != [key(c) for c in k_on.configs]:
                assert cost <= k_ref.time_ms * (1 + NOISE), k_on.name
        assert total <= p_ref.total_time_ms * (1 + PLAN_BAR), limit
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


def test_timed_rows_record_the_hosts_work_per_call_and_rows_kept_from_find_do_not(tables):
    """``host_ms`` (planning's near-ties on host work, ``ucudnn.planning.wr.HOST_TIE_FRACTION``): every row a
    timing produced has it, positive, and mostly at most its time (one timing's median of the longer of GPU and
    host is at least its host median; a median confirmed by a second timing keeps the smaller time and that
    timing's host: on the H200 a 1-image call was kept at 0.089 ms with 0.112 ms of host); a row that kept Find's
    time has none."""
    on, _ = tables["on"]
    timed = [m for k in on.kernels for m in k.measurements if m.extra.get("timed") in ("median", "first-sample")]
    kept = [m for k in on.kernels for m in k.measurements if m.extra.get("timed") == "find"]
    assert timed and all(m.extra["host_ms"] > 0 for m in timed)
    assert sum(m.extra["host_ms"] <= m.time_ms * 1.0001 for m in timed) >= 0.8 * len(timed)
    assert all("host_ms" not in m.extra for m in kept)
