"""WR (seed 003, section 3.2): the per-kernel DP is exact, respects the limit, and explains infeasibility."""
from __future__ import annotations


import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from synthetic import from_options

from ucudnn.errors import InfeasibleError
from ucudnn.planning.planner import plan
from ucudnn.planning.table import BenchmarkTable
from ucudnn.planning.wr import min_feasible_workspace, plan_kernel

MiB = 1 << 20


def brute_force(batch, options, limit):
    """Fastest multiset of micro-configurations summing to ``batch``, by enumerating compositions."""
    best = None

    def rec(remaining, time):
        nonlocal best
        if remaining == 0:
            best = time if best is None else min(best, time)
            return
        for b, opts in options.items():
            if b <= remaining:
                for t, w in opts:
                    if w <= limit:
                        rec(remaining - b, time + t)

    rec(batch, 0.0)
    return best


option_lists = st.dictionaries(
    st.integers(1, 6),
    st.lists(st.tuples(st.floats(0.01, 10, allow_nan=False), st.integers(0, 8) .map(lambda m: m * MiB)), min_size=1, max_size=3),
    min_size=1, max_size=4)


@settings(max_examples=150, deadline=None)
@given(batch=st.integers(1, 7), options=option_lists, limit_mib=st.integers(0, 8))
def test_dp_equals_exhaustive_search(batch, options, limit_mib):
    k = from_options(batch, {b: o for b, o in options.items() if b <= batch} or {1: [(1.0, 0)]})
    opts = {m.micro_batch: [] for m in k.measurements}
    for m in k.measurements:
        opts[m.micro_batch].append((m.time_ms, m.workspace_bytes))
    expected = brute_force(batch, opts, limit_mib * MiB)
    if expected is None:
        with pytest.raises(InfeasibleError):
            plan_kernel(k, limit_mib * MiB, "all")
        return
    configs = plan_kernel(k, limit_mib * MiB, "all")
    assert sum(c.micro_batch for c in configs) == batch
    assert max(c.workspace_bytes for c in configs) <= limit_mib * MiB
    assert sum(c.time_ms for c in configs) == pytest.approx(expected, rel=1e-9)


@settings(max_examples=100, deadline=None)
@given(batch=st.integers(1, 7), options=option_lists)
def test_min_feasible_workspace_is_the_exact_threshold(batch, options):
    k = from_options(batch, {b: o for b, o in options.items() if b <= batch} or {1: [(1.0, 0)]})
    need = min_feasible_workspace(k, "all")
    if need is None:
        return
    plan_kernel(k, need, "all")  # feasible at the threshold
    if need > 0:
        with pytest.raises(InfeasibleError) as e:
            plan_kernel(k, need - 1, "all")
        assert e.value.min_workspace == need


def test_splitting_beats_a_slow_fitting_algorithm():
    # at 128: fast algo needs 100 MiB, slow one none; at 64 the fast one needs 50 MiB
    k = from_options(128, {128: [(10.0, 0), (1.0, 100 * MiB)], 64: [(5.0, 0), (0.6, 50 * MiB)]})
    configs = plan_kernel(k, 64 * MiB, "powerOfTwo")
    assert [(c.micro_batch, c.algo) for c in configs] == [(64, 1), (64, 1)]
    assert plan_kernel(k, 128 * MiB, "powerOfTwo")[0].micro_batch == 128


def test_powerOfTwo_ignores_sizes_it_does_not_name():
    k = from_options(6, {6: [(10.0, 0)], 3: [(1.0, 0)], 2: [(2.0, 0)], 1: [(3.0, 0)]})
    assert sum(c.time_ms for c in plan_kernel(k, 0, "all")) == 2.0         # 3 + 3
    assert sum(c.time_ms for c in plan_kernel(k, 0, "powerOfTwo")) == 6.0  # 2 + 2 + 2 (3 is not a power of two)
    assert sum(c.time_ms for c in plan_kernel(k, 0, "undivided")) == 10.0


def test_midpoints_take_the_largest_micro_batch_that_fits_when_a_power_of_two_does_not():
    # workspace grows with the micro-batch: 12 samples fit 64 MiB, 16 do not; each step pays a fixed 1 ms
    k = from_options(48, {n: [(1.0 + 0.01 * n, 5 * MiB * n)] for n in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48)})
    assert [c.micro_batch for c in plan_kernel(k, 64 * MiB, "powerOfTwo")] == [8] * 6
    assert [c.micro_batch for c in plan_kernel(k, 64 * MiB, "powerOfTwoAndMidpoints")] == [12] * 4


# --- on real tables recorded on an H100 -------------------------------------------------------------

@pytest.fixture(scope="module")
def alexnet():
    return BenchmarkTable.load("builtin:alexnet-b256-float32-NCHW-h100")


def test_real_table_even_splits_run_an_odd_batch_as_near_equal_steps_of_the_fast_algorithm():
    """AlexNet FP32 (H100, every micro-batch size recorded) at mini-batch 127 and 64 MiB per kernel: powerOfTwo
    covers 127 with 16 x 7 + 8 + 4 + 2 + 1, its small tail on slow algorithms; even splits run 16 x 7 + 15, all on
    WINOGRAD_NONFUSED, and plan the network 4.0% slower than every size does (powerOfTwo: 31.5% slower)."""
    import dataclasses

    every = BenchmarkTable.load("builtin:alexnet-b256-float32-NCHW-all-h100")
    at = [dataclasses.replace(k, problem=dataclasses.replace(k.problem, n=127),
                              measurements=[m for m in k.measurements if m.micro_batch <= 127])
          for k in every.kernels]
    t = {p: sum(m.time_ms for k in at for m in plan_kernel(k, 64 * MiB, p))
         for p in ("all", "powerOfTwoAndEvenSplits", "powerOfTwo")}
    assert t["all"] <= t["powerOfTwoAndEvenSplits"] <= 1.05 * t["all"] and t["powerOfTwo"] >= 1.3 * t["all"]
    conv2 = next(k for k in at if k.name == "conv2/forward")
    assert sorted(m.micro_batch for m in plan_kernel(conv2, 64 * MiB, "powerOfTwoAndEvenSplits")) == [15] + [16] * 7
    assert sorted(m.micro_batch for m in plan_kernel(conv2, 64 * MiB, "powerOfTwo")) == [1, 2, 4, 8] + [16] * 7


@pytest.mark.parametrize("limit", ["8MiB", "64MiB", "512MiB"])
def test_real_table_midpoints_plan_between_powerOfTwo_and_all(limit):
    every = BenchmarkTable.load("builtin:alexnet-b256-float32-NCHW-all-h100")
    t = {p: plan(every, "wr", workspace_limit=limit, batch_policy=p).total_time_ms
         for p in ("all", "powerOfTwoAndMidpoints", "powerOfTwo")}
    assert t["all"] <= t["powerOfTwoAndMidpoints"] <= t["powerOfTwo"]


@pytest.mark.parametrize("limit", ["8MiB", "64MiB", "512MiB"])
def test_real_table_plans_respect_the_limit_and_cover_the_batch(alexnet, limit):
    p = plan(alexnet, "wr", workspace_limit=limit, batch_policy="powerOfTwo")
    assert len(p.kernels) == 15
    for k in p.kernels:
        assert k.batch == 256
        assert k.workspace_bytes <= int(limit.removesuffix("MiB")) * MiB


def test_real_table_wr_is_never_slower_than_undivided_and_more_memory_never_hurts(alexnet):
    totals = []
    for limit in ("8MiB", "64MiB", "512MiB"):
        wr = plan(alexnet, "wr", workspace_limit=limit, batch_policy="powerOfTwo").total_time_ms
        und = plan(alexnet, "undivided", workspace_limit=limit).total_time_ms
        assert wr <= und + 1e-9
        totals.append(wr)
    assert totals == sorted(totals, reverse=True)


def test_real_fp16_nhwc_conv1_backward_data_is_rescued_by_splitting():
    t = BenchmarkTable.load("builtin:alexnet-b256-float16-NHWC-h100")
    und = plan(t, "undivided", workspace_limit="64MiB").kernel("conv1/backward_data")
    wr = plan(t, "wr", workspace_limit="64MiB").kernel("conv1/backward_data")
    # cuDNN's only fitting algorithm at 256 samples is the slow zero-workspace one
    assert und.configs[0].workspace_bytes == 0 and und.time_ms > 100
    assert len(wr.configs) > 1 and wr.time_ms < und.time_ms / 20


def test_infeasible_limit_names_the_smallest_that_works():
    k = from_options(4, {4: [(1.0, 10 * MiB)], 2: [(1.0, 6 * MiB)], 1: [(1.0, 5 * MiB)]})
    t = BenchmarkTable("Test GPU", 1, [k])
    with pytest.raises(InfeasibleError) as e:
        plan(t, "wr", workspace_limit="1MiB", batch_policy="all")
    assert e.value.min_workspace == 5 * MiB
    assert "5 MiB" in str(e.value)


def test_recorded_replay_timed_table_plans_faster_with_midpoints_than_with_powers_of_two(fixtures):
    """H100, AlexNet fp32 strict NHWC, timed replayed: conv2's relayout Winograd fits 12 samples in 64 MiB, not 16."""
    t = BenchmarkTable.load(fixtures / "alexnet-b256-float32-NHWC-strict-legacy-graph-relayout-fold-replay-midpoints-"
                                       "h100.json.gz")
    assert t.extra["timing"] == "replay" and t.extra["batch_policy"] == "powerOfTwoAndMidpoints"
    mid = plan(t, "wr", workspace_limit="64MiB", batch_policy="powerOfTwoAndMidpoints")
    pow2 = plan(t, "wr", workspace_limit="64MiB", batch_policy="powerOfTwo")
    assert mid.total_time_ms < 0.95 * pow2.total_time_ms
    assert all(k.workspace_bytes <= 64 * MiB for k in mid.kernels)
    conv2 = {c.micro_batch for k in mid.kernels if k.name.startswith("conv2/") for c in k.configs}
    assert 12 in conv2 and 16 not in conv2
