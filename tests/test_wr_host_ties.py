"""WR's near-ties on host work (issue 15's host-bound steps): at one micro-batch size, a configuration that is at
most ``HOST_TIE_FRACTION`` slower than the fastest and saves the host at least twice what it gives up (and at
least ``HOST_TIE_MIN_MS``) is taken in its place; tables without ``host_ms`` plan exactly as before."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from synthetic import kernel

from ucudnn.errors import InfeasibleError
from ucudnn.planning import wr
from ucudnn.planning.table import KernelBench, Measurement
from ucudnn.planning.wr import HOST_TIE_FRACTION, HOST_TIE_MIN_MS, HOST_TIE_RATIO, fastest_per_size, plan_kernel
from ucudnn.problem import ConvProblem

MiB = 1 << 20
PROBLEM = ConvProblem(128, 64, 56, 56, 256, 1, 1, (0, 0))


def row(algo, time_ms, host_ms=None, mb=128, ws=0, source="legacy"):
    extra = {} if host_ms is None else {"host_ms": host_ms}
    return Measurement(mb, algo, "FMA", time_ms, ws, source, None, extra)


def test_a_graph_engine_as_fast_within_noise_replaces_a_host_heavy_legacy_call():
    """The recorded case: legacy IMPLICIT_PRECOMP_GEMM backward filter 1.000 ms at 0.110 ms of host a call, the
    graph engine cuDNN runs it as 1.004 ms at 0.025 ms: the engine is the plan's step."""
    legacy, engine = row(1, 1.000, 0.110), row("eng62_k25=0", 1.004, 0.025, source="graph")
    assert fastest_per_size([legacy, engine], [128], 64 * MiB)[128] is engine


@pytest.mark.parametrize("slower, host_saved, why", [
    (1.03, 0.2, "3% slower: past the fraction"),
    (1.015, 0.02, "saves the host less than twice the 15 us it gives up"),
    (1.0, HOST_TIE_MIN_MS / 2, "saves the host less than the floor"),
])
def test_the_fastest_stays_where_the_near_tie_rule_does_not_hold(slower, host_saved, why):
    fastest = row(1, 1.0, 0.3)
    other = row(2, slower, 0.3 - host_saved, source="graph")
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
    a, b = row(2, 1.005, 0.1, source="graph"), row(3, 1.01, 0.02, source="graph")
    assert fastest_per_size([fastest, a, b], [128], 64 * MiB)[128] is b


def _with_hosts(k: KernelBench, hosts: list[float]) -> KernelBench:
    ms = [Measurement(m.micro_batch, m.algo, m.math_type, m.time_ms, m.workspace_bytes, m.source, m.engine,
                      {"host_ms": h}) for m, h in zip(k.measurements, hosts)]
    return KernelBench(k.name, k.op, k.problem, ms)


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10_000), batch=st.integers(1, 24), limit_mib=st.integers(0, 40),
       hosts=st.lists(st.floats(0.0, 0.5, allow_nan=False), min_size=400, max_size=400))
def test_a_plan_with_host_ties_is_within_the_fraction_of_the_fastest_and_never_adds_host_work(seed, batch,
                                                                                               limit_mib, hosts):
    """Against the plan of the same table without host work: total time within HOST_TIE_FRACTION (each step
    is), and the summed host work of each size's pick is never larger (each replaces its fastest only for less)."""
    k = kernel("k", batch, seed, "all")
    kh = _with_hosts(k, hosts)
    try:
        plain = plan_kernel(k, limit_mib * MiB, "all")
    except InfeasibleError:                      # host work never changes what fits
        with pytest.raises(InfeasibleError):
            plan_kernel(kh, limit_mib * MiB, "all")
        return
    tied = plan_kernel(kh, limit_mib * MiB, "all")
    assert sum(m.micro_batch for m in tied) == batch
    assert max(m.workspace_bytes for m in tied) <= limit_mib * MiB
    assert sum(m.time_ms for m in tied) <= (1 + HOST_TIE_FRACTION) * sum(m.time_ms for m in plain) + 1e-9
    sizes = range(1, batch + 1)
    fast = fastest_per_size(kh.measurements, sizes, limit_mib * MiB)
    for b, m in fast.items():
        quickest = min((x for x in kh.measurements if x.micro_batch == b and x.workspace_bytes <= limit_mib * MiB),
                       key=lambda x: (x.time_ms, x.workspace_bytes))
        assert wr.host_ms(m) <= wr.host_ms(quickest)
        assert m.time_ms - quickest.time_ms <= HOST_TIE_FRACTION * quickest.time_ms + 1e-12
        if m is not quickest:
            assert wr.host_ms(quickest) - wr.host_ms(m) >= HOST_TIE_RATIO * (m.time_ms - quickest.time_ms)


def _tied_kernel() -> KernelBench:
    """One kernel where the legacy call is fastest by 0.2% and a graph engine saves the host 85 us a call."""
    return KernelBench("conv/backward_filter", "backward_filter", PROBLEM,
                       [row(1, 1.000, 0.110), row("eng62_k25=0", 1.002, 0.025, source="graph")])


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
