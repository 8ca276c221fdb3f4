"""WR's near-ties on host work (issue 15's host-bound steps): at one micro-batch size, a configuration that is at
most ``HOST_TIE_FRACTION`` slower than the fastest and saves the host at least twice what it gives up (and at
least ``HOST_TIE_MIN_MS``) is taken in its place; where the fastest runs as a cuDNN legacy call (no graph-API
twin), its host work counts as at least ``LEGACY_CALL_HOST_MS`` and the fraction is ``LEGACY_TIE_FRACTION``;
tables without ``host_ms`` plan exactly as before."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from synthetic import kernel

from ucudnn.errors import InfeasibleError
from ucudnn.planning import wr
from ucudnn.planning.table import KernelBench, Measurement
from ucudnn.legacy_engines import LEGACY_CALL_HOST_MS, runs_as_legacy_call
from ucudnn.planning.wr import (HOST_TIE_FRACTION, HOST_TIE_MIN_MS, HOST_TIE_RATIO, LEGACY_TIE_FRACTION,
                                fastest_per_size, plan_kernel)
from ucudnn.problem import ConvProblem

MiB = 1 << 20
PROBLEM = ConvProblem(128, 64, 56, 56, 256, 1, 1, (0, 0))


def row(algo, time_ms, host_ms=None, mb=128, ws=0, source="graph"):
    extra = {} if host_ms is None else {"host_ms": host_ms}
    return Measurement(mb, algo, "FMA", time_ms, ws, source, None, extra)


def test_a_graph_engine_as_fast_within_noise_replaces_a_host_heavy_legacy_call():
    """The recorded case: legacy IMPLICIT_PRECOMP_GEMM backward filter 1.000 ms at 0.110 ms of host a call, the
    graph engine cuDNN runs it as 1.004 ms at 0.025 ms: the engine is the plan's step."""
    legacy, engine = row(1, 1.000, 0.110, source="legacy"), row("eng62_k25=0", 1.004, 0.025)
    assert fastest_per_size([legacy, engine], [128], 64 * MiB)[128] is engine


def test_a_graph_engine_up_to_ten_percent_slower_replaces_a_legacy_call_the_benchmark_saw_as_light():
    """The recorded case (ResNet-50 b128 AMP, 1x1 backward filter, H200): legacy ALGO_1 0.0695 ms at 0.062 ms of
    host in the benchmark's loop, a graph engine 0.0763 ms (9.8% slower) at 0.039: in a step the legacy call
    costs the host at least LEGACY_CALL_HOST_MS, so the engine saves 61 us for 7 us of GPU work."""
    legacy, engine = row(1, 0.0695, 0.0621, source="legacy"), row("eng65_k2=5", 0.0763, 0.0387)
    assert fastest_per_size([legacy, engine], [128], 64 * MiB, op="backward_filter", dtype="float16")[128] is engine
    past = row("eng65_k2=7", 0.0695 * (1 + LEGACY_TIE_FRACTION) + 0.001, 0.0387)
    assert fastest_per_size([legacy, past], [128], 64 * MiB)[128] is legacy, "past LEGACY_TIE_FRACTION"


def test_a_legacy_call_with_a_twin_is_weighed_by_its_recorded_host_work():
    """float32 FFT_TILING forward runs as its graph-API twin (one finalized engine, light on the host): no floor,
    no wider fraction; in float16 (no twins) the same rows take the engine."""
    fft, engine = row(5, 1.0, 0.03, source="legacy"), row("eng4", 1.03, 0.02)
    assert fastest_per_size([fft, engine], [128], 64 * MiB, op="forward", dtype="float32")[128] is fft
    assert fastest_per_size([fft, engine], [128], 64 * MiB, op="forward", dtype="float16")[128] is engine


def test_past_the_legacy_call_the_usual_fraction_picks_among_the_others():
    """The legacy call's wider fraction only lets its fastest replacement in; between the others the 2% rule
    holds, so a configuration 8% slower that saves a few more microseconds than the replacement is not taken."""
    legacy = row(1, 1.0, 0.05, source="legacy")
    first, slower = row("eng1", 1.01, 0.04), row("eng2", 1.08, 0.02)
    assert fastest_per_size([legacy, first, slower], [128], 64 * MiB)[128] is first


def test_between_two_legacy_calls_their_recorded_host_work_decides():
    """Both pay the finalization in a step, so the floor cancels: algorithm 0 saves 85 us for 0.2% (as before)."""
    a, b = row(1, 1.0, 0.110, source="legacy"), row(0, 1.002, 0.025, source="legacy")
    assert fastest_per_size([a, b], [128], 64 * MiB, op="forward", dtype="float32")[128] is b


@pytest.mark.parametrize("source, algo, op, dtype, legacy_call", [
    ("legacy", 1, "backward_filter", "float16", True),
    ("legacy", 1, "backward_filter", "float32", True),     # GEMM-class: no twin
    ("legacy", 5, "forward", "float32", False),            # FFT_TILING: its twin runs
    ("legacy", 5, "forward", "float16", True),             # twins run float32 only
    ("legacy", 5, None, None, True),                       # the op not known: counted as a legacy call
    ("graph", "eng62", "forward", "float32", False),
])
def test_which_configurations_run_as_legacy_calls(source, algo, op, dtype, legacy_call):
    assert runs_as_legacy_call(source, algo, op, dtype) is legacy_call


@pytest.mark.parametrize("slower, host_saved, why", [
    (1.03, 0.2, "3% slower: past the fraction"),
    (1.015, 0.02, "saves the host less than twice the 15 us it gives up"),
    (1.0, HOST_TIE_MIN_MS / 2, "saves the host less than the floor"),
])
def test_the_fastest_stays_where_the_near_tie_rule_does_not_hold(slower, host_saved, why):
    fastest = row(1, 1.0, 0.3)
    other = row(2, slower, 0.3 - host_saved)
    assert fastest_per_size([fastest, other], [128], 64 * MiB)[128] is fastest, why


def test_rows_without_recorded_host_work_plan_as_before():
    a, b = row(1, 1.0), row(2, 1.001, 0.01)      # only one side recorded its host work: no near-tie
    assert fastest_per_size([a, b], [128], 64 * MiB)[128] is a
    assert fastest_per_size([b, a], [128], 64 * MiB)[128] is a


def test_the_near_tie_still_fits_the_limit_and_the_slice():
    fastest = row(1, 1.0, 0.3)
    big = row(2, 1.001, 0.01, ws=65 * MiB)                       # over the limit
    sliced = Measurement(128, 3, "FMA", 1.001, 0, "graph", None, {"host_ms": 0.01}, 128)   # a channel slice
    assert fastest_per_size([fastest, big, sliced], [128], 64 * MiB)[128] is fastest


def test_of_several_near_ties_the_one_saving_the_host_most_is_taken():
    fastest = row(1, 1.0, 0.3)
    a, b = row(2, 1.005, 0.1), row(3, 1.01, 0.02)
    assert fastest_per_size([fastest, a, b], [128], 64 * MiB)[128] is b


def _with_hosts(k: KernelBench, hosts: list[float], graph: list[bool]) -> KernelBench:
    """``k`` with each row's host work recorded; the rows ``graph`` marks become graph-engine rows (the rest stay
    legacy calls: the synthetic kernels' algorithms are legacy ids)."""
    ms = [Measurement(m.micro_batch, m.algo, m.math_type, m.time_ms, m.workspace_bytes, "graph" if g else m.source,
                      m.engine, {"host_ms": h}) for m, h, g in zip(k.measurements, hosts, graph)]
    return KernelBench(k.name, k.op, k.problem, ms)


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10_000), batch=st.integers(1, 24), limit_mib=st.integers(0, 40),
       hosts=st.lists(st.floats(0.0, 0.5, allow_nan=False), min_size=400, max_size=400),
       graph=st.lists(st.booleans(), min_size=400, max_size=400))
def test_a_plan_with_host_ties_is_within_the_fractions_of_the_fastest_and_never_adds_host_work(seed, batch,
                                                                                                limit_mib, hosts,
                                                                                                graph):
    """Against the plan of the same table without host work: total time within both fractions (each step is),
    and each size's pick never costs the host more than that size's fastest (a legacy call's host work counted
    at least LEGACY_CALL_HOST_MS against a configuration that is not one); where the fastest is not a legacy
    call, the pick is within HOST_TIE_FRACTION and saves the host HOST_TIE_RATIO times what it gives up."""
    k = kernel("k", batch, seed, "all")
    kh = _with_hosts(k, hosts, graph)
    k = KernelBench(k.name, k.op, k.problem, [Measurement(m.micro_batch, m.algo, m.math_type, m.time_ms,
                                                          m.workspace_bytes, x.source, m.engine)
                                              for m, x in zip(k.measurements, kh.measurements)])
    try:
        plain = plan_kernel(k, limit_mib * MiB, "all")
    except InfeasibleError:                      # host work never changes what fits
        with pytest.raises(InfeasibleError):
            plan_kernel(kh, limit_mib * MiB, "all")
        return
    tied = plan_kernel(kh, limit_mib * MiB, "all")
    both = (1 + LEGACY_TIE_FRACTION) * (1 + HOST_TIE_FRACTION)
    assert sum(m.micro_batch for m in tied) == batch
    assert max(m.workspace_bytes for m in tied) <= limit_mib * MiB
    assert sum(m.time_ms for m in tied) <= both * sum(m.time_ms for m in plain) + 1e-9

    def weighed(m: Measurement, other: Measurement) -> float:     # a legacy call's floor against a non-legacy one
        legacy = m.source == "legacy" and other.source != "legacy"
        return max(wr.host_ms(m), LEGACY_CALL_HOST_MS) if legacy else wr.host_ms(m)

    sizes = range(1, batch + 1)
    fast = fastest_per_size(kh.measurements, sizes, limit_mib * MiB)
    for b, m in fast.items():
        quickest = min((x for x in kh.measurements if x.micro_batch == b and x.workspace_bytes <= limit_mib * MiB),
                       key=lambda x: (x.time_ms, x.workspace_bytes))
        assert weighed(m, quickest) <= weighed(quickest, m)
        assert m.time_ms <= both * quickest.time_ms + 1e-12
        if m is not quickest and quickest.source != "legacy":
            assert m.time_ms - quickest.time_ms <= HOST_TIE_FRACTION * quickest.time_ms + 1e-12
            assert weighed(quickest, m) - weighed(m, quickest) >= HOST_TIE_RATIO * (m.time_ms - quickest.time_ms)


def _tied_kernel() -> KernelBench:
    """One kernel where the legacy call is fastest by 0.2% and a graph engine saves the host 85 us a call."""
    return KernelBench("conv/backward_filter", "backward_filter", PROBLEM,
                       [row(1, 1.000, 0.110, source="legacy"), row("eng62_k25=0", 1.002, 0.025)])


def test_the_librarys_plans_take_near_ties_unless_their_key_says_host_ties_false():
    from ucudnn.catalog import lookup

    key = {"workspace_limit": 64 * MiB, "batch_policy": "powerOfTwo", "op": "backward_filter"}
    assert [c.algo for c in lookup.wr_plan(_tied_kernel(), key).configs] == ["eng62_k25=0"]
    assert [c.algo for c in lookup.wr_plan(_tied_kernel(), {**key, "host_ties": False}).configs] == [1]


@pytest.mark.parametrize("env, field", [(None, None), ("1", None), ("0", False), ("off", False)])
def test_UCUDNN_HOST_TIES_0_keys_its_plans_apart(monkeypatch, env, field):
    """Plans made without near-ties are cached under their own key, so an A/B in one cache never mixes them."""
    import ucudnn.api as api

    if env is None:
        monkeypatch.delenv("UCUDNN_HOST_TIES", raising=False)
    else:
        monkeypatch.setenv("UCUDNN_HOST_TIES", env)
    monkeypatch.setattr(api, "device_name", lambda: "NVIDIA H200")
    monkeypatch.setattr(api.cudnn, "get_version", lambda: 91900)
    key = api._cache_key(PROBLEM, "forward", "strict", "powerOfTwo", 64 * MiB, ("legacy",))
    assert key.get("host_ties") is field
    assert "host_ties" not in api._cache_key(PROBLEM, "forward", "strict", "powerOfTwo", None, ("legacy",))


def test_UCUDNN_HOST_TIES_refuses_a_word_it_does_not_know(monkeypatch):
    from ucudnn import config
    from ucudnn.errors import InputError

    monkeypatch.setenv("UCUDNN_HOST_TIES", "maybe")
    with pytest.raises(InputError) as e:
        config.host_ties()
    assert e.value.field == "UCUDNN_HOST_TIES"


def test_a_plan_cached_under_an_earlier_rule_version_is_planned_again_from_the_cached_measurements(tmp_path,
                                                                                                    monkeypatch):
    """Plan keys name WR's rule version (``wr_rules``): a plan an earlier version cached (its key without it, here
    the legacy call session 19's rule kept) is not found, and the lookup plans the kernel again from the same
    cache's measurements under today's rule, without a benchmark; measurement keys carry no version."""
    import ucudnn.api as api
    from ucudnn.catalog import lookup
    from ucudnn.catalog.store import Store
    from ucudnn.planning.plan import KernelPlan, MicroConfig, Plan

    monkeypatch.delenv("UCUDNN_HOST_TIES", raising=False)
    monkeypatch.setattr(api, "device_name", lambda: "NVIDIA H200")
    monkeypatch.setattr(api.cudnn, "get_version", lambda: 91900)
    problem = ConvProblem(128, 256, 56, 56, 64, 1, 1, (0, 0), dtype="float16", layout="NHWC")
    kb = KernelBench("conv/backward_filter", "backward_filter", problem,
                     [row(1, 0.0695, 0.0621, source="legacy"), row("eng65_k2=5", 0.0763, 0.0387)])
    plan_key = api._cache_key(problem, "backward_filter", "default", "powerOfTwo", 256 * MiB, ("legacy", "graph"))
    bench_key = api._cache_key(problem, "backward_filter", "default", "powerOfTwo", sources=("legacy", "graph"))
    assert plan_key["wr_rules"] == wr.RULES and "wr_rules" not in bench_key
    store = Store(tmp_path / "cache.sqlite")
    store.put_kernel_bench(bench_key, kb)
    old_key = {k: v for k, v in plan_key.items() if k != "wr_rules"}
    stale = KernelPlan(kb.name, kb.op, problem, [MicroConfig.of(kb.measurements[0])])
    store.put_plan(old_key, Plan("wr", "powerOfTwo", [stale], "NVIDIA H200", 91900, workspace_limit=256 * MiB))

    def benchmark():
        raise AssertionError("the cached measurements answer: no benchmark")

    found = lookup.kernel_plan(plan_key, bench_key, benchmark=benchmark, store=store)
    assert found.layer == "store" and [c.algo for c in found.plan.configs] == ["eng65_k2=5"]
