"""Split dominance (issue 16): a configuration slower than what WR can already do with smaller micro-batches is
neither sampled nor re-timed, and no WR / WD / undivided plan changes.  No GPU: Find, the frontend and the clock
are fakes, and the recorded fixtures are replayed (:func:`ucudnn.measure.pruning.simulate`)."""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ucudnn.errors import InfeasibleError
from ucudnn.measure import pruning
from ucudnn.measure.sources.base import BenchSettings, Operands, SplitReference, split_plan
from ucudnn.planning.planner import plan
from ucudnn.planning.table import BenchmarkTable, KernelBench, Measurement
from ucudnn.planning.wr import fastest_per_size, plan_kernel, solve
from ucudnn.problem import ConvProblem

MiB = 1 << 20
FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("*.json.gz"))
#: the unpruned runs of benchmarks/bench_time.py kept beside its results (AlexNet FP16 NHWC, ResNet-50 b128)
OFF_RUNS = sorted((Path(__file__).parent.parent / "benchmarks" / "results" / "bench_time-tables").glob("*-off.json.gz"))
SPLIT_ONLY = replace(BenchSettings.unpruned("strict"), split_margin=BenchSettings.split_margin)


def rows(options: dict[int, list[tuple[float, int]]], source: str = "graph") -> list[Measurement]:
    """{size: [(ms, workspace), ...]}: configuration i at every size is algorithm i (one identity across sizes)."""
    return [Measurement(b, f"a{i}", "FMA", t, ws, source, extra={"quick_ms": t})
            for b, opts in sorted(options.items()) for i, (t, ws) in enumerate(opts)]


def partitions(b: int, largest: int | None = None) -> list[tuple[int, ...]]:
    """Every non-increasing sequence of powers of two summing to ``b``, none over ``largest`` (brute force)."""
    if b == 0:
        return [()]
    out = []
    s = 1
    while s <= b and (largest is None or s <= largest):
        out += [(s,) + rest for rest in partitions(b - s, s)]
        s *= 2
    return out


def brute_split_ms(ms: list[Measurement], b: int, workspace: int) -> float:
    """The fastest way to run b samples as smaller power-of-two micro-batches, each the fastest row of its size
    needing at most ``workspace``: every partition tried."""
    best = {s: min((m.time_ms for m in ms if m.micro_batch == s and m.workspace_bytes <= workspace),
                   default=math.inf) for s in {m.micro_batch for m in ms}}
    return min((sum(best.get(s, math.inf) for s in p) for p in partitions(b) if max(p) < b), default=math.inf)


def total(kernel: KernelBench, limit: int, policy: str) -> float | None:
    try:
        return sum(m.time_ms for m in plan_kernel(kernel, limit, policy))
    except InfeasibleError:
        return None


# --- the split itself ---------------------------------------------------------------------------------
def test_the_brute_force_enumerates_power_of_two_partitions():
    assert sorted(p for p in partitions(4) if max(p) < 4) == [(1, 1, 1, 1), (2, 1, 1), (2, 2)]


sizes_and_times = st.dictionaries(st.sampled_from([1, 2, 4, 8, 16, 32]),
                                  st.lists(st.tuples(st.floats(0.01, 10, allow_nan=False),
                                                     st.integers(0, 4).map(lambda m: m * MiB)), min_size=1, max_size=4),
                                  min_size=1)


@settings(max_examples=300, deadline=None)
@given(options=sizes_and_times, b=st.integers(1, 64), limit_mib=st.integers(0, 4))
def test_the_split_is_wrs_dp_over_the_smaller_powers_of_two(options, b, limit_mib):
    """``split_plan``'s closed form gives the optimum of :func:`ucudnn.planning.wr.solve` over the powers of two
    below b, and a plan that realises it."""
    ms = rows(options)
    limit = limit_mib * MiB
    smaller = [s for s in options if s < b]
    best = fastest_per_size(ms, smaller, limit)
    got = split_plan(best, b)
    ref = solve(b, {s: m for s, m in best.items()})
    if ref is None:
        assert got is None
        return
    assert got is not None
    assert sum(m.time_ms for m in got) == pytest.approx(sum(m.time_ms for m in ref))
    assert sum(m.micro_batch for m in got) == b and all(m.micro_batch < b for m in got)
    assert all(m.workspace_bytes <= limit and m in ms for m in got)


@settings(max_examples=200, deadline=None)
@given(options=sizes_and_times, b=st.sampled_from([2, 4, 8, 16, 32]), limit_mib=st.integers(0, 4))
def test_the_split_time_is_an_upper_bound_that_wr_realises(options, b, limit_mib):
    """T_split(b, w) is a plan WR can run under any limit M >= w: WR's optimum for b samples is never slower."""
    ms = rows(options)
    sp = SplitReference.of(ms, b, 64, 1.0).split(limit_mib * MiB)
    t_split = math.inf if sp is None else sum(m.time_ms for m in sp)
    assert t_split == pytest.approx(brute_split_ms(ms, b, limit_mib * MiB))   # brute force agrees
    if math.isinf(t_split):
        return
    kernel = KernelBench("k/forward", "forward", ConvProblem(b, 8, 8, 8, 8, 3, 3, (1, 1)),
                         [m for m in ms if m.micro_batch <= b])
    for limit in range(limit_mib, 5):
        wr = plan_kernel(kernel, limit * MiB, "powerOfTwo")
        assert sum(m.time_ms for m in wr) <= t_split * (1 + 1e-9)


@settings(max_examples=200, deadline=None)
@given(options=sizes_and_times, b=st.sampled_from([2, 4, 8, 16]), margin=st.floats(1.0, 3.0),
       t=st.floats(0.01, 40), ws_mib=st.integers(0, 4))
def test_a_configuration_is_split_dominated_exactly_when_a_brute_force_split_beats_it_by_the_margin(
        options, b, margin, t, ws_mib):
    ms = [m for m in rows(options) if m.micro_batch < b]
    ref = SplitReference.of(ms, b, 64, margin)
    assert ref.dominates(t, ws_mib * MiB) == (t > margin * brute_split_ms(ms, b, ws_mib * MiB))


def test_at_the_full_mini_batch_only_other_configurations_at_that_size_count():
    """An ``undivided`` plan runs the full mini-batch whole: a split is no reference there, a configuration at
    that size needing no more workspace is."""
    ms = rows({8: [(1.0, 0)], 16: [(3.0, 4 * MiB)]}, source="legacy")
    full = SplitReference.of(ms, 16, 16, 1.5)
    assert full.split(8 * MiB) is None
    assert not full.dominates(2.5, 0)               # 2 x 8 would beat it, but undivided cannot split
    assert full.dominates(5.0, 4 * MiB) and not full.dominates(5.0, 2 * MiB)   # legacy a0 at 16 fits only the first
    part = SplitReference.of(ms, 16, 32, 1.5)
    assert part.dominates(3.5, 0) and part.reference(0)[1] == "split 2x8"


def test_the_split_is_the_fastest_one_whatever_the_host_work_of_its_rows():
    """The reference is GPU time: at size 8 a legacy call 0.100 ms at 0.06 ms of host and a graph engine 0.108 ms
    at 0.01 (WR's plans take the engine, a legacy near-tie) -- the split of 16 samples is 2 x 0.100 ms."""
    legacy = Measurement(8, 1, "FMA", 0.100, 0, "legacy", extra={"host_ms": 0.06})
    engine = Measurement(8, "eng65", "FMA", 0.108, 0, "graph", extra={"host_ms": 0.01})
    assert fastest_per_size([legacy, engine], [8], 0)[8] is engine          # what a plan runs
    assert SplitReference.of([legacy, engine], 16, 32, 1.5).split_ms(0) == pytest.approx(0.200)


def test_the_lower_bound_is_the_configurations_own_row_at_the_largest_smaller_size():
    ms = rows({1: [(0.1, 0), (0.5, 0)], 2: [(0.2, 0), (1.0, 0)], 4: [(0.4, 0)]})
    ref = SplitReference.of(ms, 8, 8 * 4, 1.5)
    assert ref.previous[("graph", "a1", "FMA")].micro_batch == 2        # a1 was not recorded at 4
    assert ref.unneeded("graph", "a1", "FMA", 0) is None                 # 1.0 ms is no more than 1.5 x 0.8 ms
    assert ref.unneeded("graph", "a9", "FMA", 0) is None                 # new at this size: always sampled
    why = SplitReference.of(ms, 4, 32, 1.1).unneeded("graph", "a1", "FMA", 0)
    assert why.startswith("split-dominated: not sampled, 1 ms at n=2") and "split 2x2" in why


def test_channel_slices_and_transformed_problems_get_no_reference():
    p = ConvProblem(32, 16, 12, 12, 32, 3, 3, (1, 1))
    s = BenchSettings("strict")
    s.start_kernel(p, rows({1: [(1.0, 0)]}))
    assert s.split_reference(p.with_batch(4)) is not None
    assert s.split_reference(p.with_batch(4).with_channels(16)) is None         # a channel slice
    assert s.split_reference(replace(p, n=4, layout="NHWC")) is None             # relayout's problem
    assert s.split_reference(replace(p, n=4, c=48, h=4, w=4)) is None            # fold's problem


def test_the_rule_is_off_with_none_and_without_the_kernels_rows():
    p = ConvProblem(32, 16, 12, 12, 32, 3, 3, (1, 1))
    off = BenchSettings("strict", split_margin=None)
    off.start_kernel(p, rows({1: [(1.0, 0)]}))
    assert off.split_reference(p.with_batch(2)) is None
    assert BenchSettings.unpruned("strict").split_margin is None
    on = BenchSettings("strict")
    on.start_kernel()                      # a caller that does not pass the rows: nothing to compare with
    assert on.split_reference(p.with_batch(2)) is None
    table = BenchmarkTable.load(str(FIXTURES[0]))
    assert not {"split-dominated", "split-skipped"} & set(
        pruning.simulate(table, BenchSettings.unpruned(table.numerics or "strict"), "exact").counts)


# --- in the sources ------------------------------------------------------------------------------------
def test_legacy_records_finds_time_for_a_split_dominated_configuration_without_retiming_it(monkeypatch):
    from test_fast_bench import PROBLEM, fake_legacy

    from ucudnn.measure.sources import legacy as L

    calls = fake_legacy(monkeypatch, [(0, 2.1, 0), (1, 3.5, 4 * MiB), (2, 3.5, 0)], {0: 2.0, 1: 3.4, 2: 3.6})
    history = rows({8: [(1.0, 0)]}, source="legacy")
    s = BenchSettings("strict", prune_margin=None, hopeless_factor=None, trust_estimate_ms=None)
    s.start_kernel(PROBLEM.with_batch(64), history)     # PROBLEM's 16 is not the full mini-batch
    ms, _ = L.LegacySource().measure("forward", PROBLEM, Operands(0, 0, 0), 0, s)
    got = {m.algo: m for m in ms}
    # 2 x 8 samples take 2.0 ms with no workspace: algorithms 1 and 2 (Find 3.5 ms > 1.5 x 2.0) are not re-timed
    assert [a for a, _ in calls] == [0]
    assert got[1].time_ms == 3.5 and got[1].extra["timed"] == "find" and got[1].extra["pruned"] == "split-dominated"
    assert got[2].extra["pruned"] == "split-dominated" and got[0].extra["timed"] == "median"
    s.split_margin = None
    calls.clear()
    L.LegacySource().measure("forward", PROBLEM, Operands(0, 0, 0), 0, s)
    assert sorted(a for a, _ in calls) == [0, 1, 2]


def test_graph_does_not_sample_an_engine_its_smaller_size_rules_out_and_keeps_the_quick_sample_of_another():
    from test_graph_source import OPS, WS, Cfg, P, source

    def lists(op, n):   # 1: fast, needs 1 MiB; 2: 1 ms a sample; 3: fast up to 2 samples, then 5 ms
        return {"A": [Cfg(1, ms=0.1 * n, ws=MiB), Cfg(2, ms=1.0 * n), Cfg(3, ms=0.1 * n if n <= 2 else 5.0)]}

    src, fe, timer, _ = source(lists)
    s = BenchSettings("strict", repeat=3, min_sample_ms=0.0, prune_margin=None, hopeless_factor=None,
                      trust_estimate_ms=None, kernel_budget_s=None)
    history: list[Measurement] = []
    s.start_kernel(P.with_batch(64), history)
    for n in (1, 2):
        ms, _ = src.measure("forward", P.with_batch(n), OPS, WS, s)
        history += ms
    timer.calls.clear()
    stats = dict(src.stats)
    ms, sk = src.measure("forward", P.with_batch(4), OPS, WS, s)
    got = {m.engine["id"]: m for m in ms}
    # engine 2: 1 ms at n=1 already exceeds 1.5 x (2 x 0.2 ms: engine 3 at n=2, no workspace): not run at all
    assert 2 not in got and [x.reason for x in sk if x.algo == "eng2"][0].startswith("split-dominated")
    assert all(tag != "eng2" for tag, _ in timer.calls)
    # engine 3: 5 ms at n=4, its quick sample over 1.5 x 0.4 ms: recorded so, no median
    assert got[3].extra["timing"] == "quick" and got[3].extra["pruned"] == "split-dominated"
    assert got[1].extra["timing"] == "median" and "pruned" not in got[1].extra
    assert src.stats["configs_split_skipped"] - stats["configs_split_skipped"] == 1
    assert src.stats["configs_split_quick"] - stats["configs_split_quick"] == 1
    off, *_ = source(lists)
    ms, sk = off.measure("forward", P.with_batch(4), OPS, WS, replace(s, split_margin=None))
    assert {m.extra["timing"] for m in ms} == {"median"} and len(ms) == 3


# --- plans do not change ------------------------------------------------------------------------------
def monotone_kernel(draw_times: list[list[float]], workspaces: list[list[int]], batch: int) -> KernelBench:
    """Configuration i at size 2^j takes the cumulative sum of its increments: time never falls with the size."""
    sizes = [1 << j for j in range(batch.bit_length()) if 1 << j <= batch]
    ms = []
    for i, (incs, wss) in enumerate(zip(draw_times, workspaces)):
        t = 0.0
        for j, b in enumerate(sizes):
            t += incs[j]
            ms.append(Measurement(b, f"e{i}", "FMA", round(t, 6), wss[j], "graph", extra={"quick_ms": round(t, 6)}))
    ms.append(Measurement(1, "slow", "FMA", 50.0, 0, "legacy"))   # something always fits
    return KernelBench("k/forward", "forward", ConvProblem(batch, 8, 8, 8, 8, 3, 3, (1, 1)), ms)


configs = st.integers(1, 5).flatmap(lambda n: st.tuples(
    st.lists(st.lists(st.floats(0.01, 5.0, allow_nan=False), min_size=6, max_size=6), min_size=n, max_size=n),
    st.lists(st.lists(st.integers(0, 3).map(lambda m: m * MiB), min_size=6, max_size=6), min_size=n, max_size=n)))


@settings(max_examples=150, deadline=None)
@given(cfg=configs, margin=st.floats(1.0, 3.0))
def test_with_exact_times_no_wr_or_undivided_plan_changes_at_any_limit(cfg, margin):
    """Exact first estimates, times that never fall with the micro-batch: every configuration the rule drops or
    keeps unre-timed is one no WR plan (hence no WD plan: WD chooses among each kernel's WR plans) and no
    undivided plan would choose, at any limit."""
    table = BenchmarkTable("fake", 1, [monotone_kernel(*cfg, batch=32)], "strict",
                           {"batch_policy": "powerOfTwo", "sources": ["legacy", "graph"]})
    sim = pruning.simulate(table, replace(SPLIT_ONLY, split_margin=margin), "exact")
    k, got = table.kernels[0], sim.table.kernels[0]
    for limit in range(0, 4):
        for policy in ("powerOfTwo", "undivided"):
            assert total(got, limit * MiB, policy) == pytest.approx(total(k, limit * MiB, policy))


@pytest.mark.parametrize("path", FIXTURES + OFF_RUNS, ids=lambda p: p.name.removesuffix(".json.gz"))
def test_on_the_recorded_tables_no_wr_plan_changes_beyond_the_bar(path):
    """Replayed on every recorded fixture and unpruned bench_time run: WR at 8/64/256 MiB priced at the recorded
    times is unchanged with exact estimates and within 1% with the recorded ones (Find's time, the quick sample);
    undivided plans too."""
    table = BenchmarkTable.load(str(path))
    for estimate, bar in (("exact", 1e-9), ("recorded", 0.01)):
        sim = pruning.simulate(table, replace(SPLIT_ONLY, numerics=table.numerics or "strict"), estimate)
        for limit in (8 * MiB, 64 * MiB, 256 * MiB):
            for policy in ("wr", "undivided"):
                try:
                    ref = plan(table, policy, workspace_limit=limit)
                except InfeasibleError:
                    with pytest.raises(InfeasibleError):
                        plan(sim.table, policy, workspace_limit=limit)
                    continue
                got = plan(sim.table, policy, workspace_limit=limit)
                assert pruning.true_time_ms(got, table) <= ref.total_time_ms * (1 + bar), (estimate, limit, policy)


def test_on_the_default_sources_fixture_most_slow_quick_samples_are_not_taken():
    """AlexNet b256 FP32 strict, legacy + graph + fold (the unpruned run of bench_time-alexnet-default): the
    graph source's quick samples, modelled, fall from 6.0 s (every other rule on) to under 2 s."""
    path = next(p for p in FIXTURES if "strict-legacy-graph-fold-unpruned" in p.name)
    table = BenchmarkTable.load(str(path))
    before = pruning.simulate(table, replace(BenchSettings("strict"), split_margin=None))
    after = pruning.simulate(table, BenchSettings("strict"))
    assert after.counts["split-skipped"] > 200
    assert before.quick_ms > 5000 and after.quick_ms < 2000
    assert after.retime_ms <= before.retime_ms


def test_wrappers_inner_sources_get_split_dominance_on_their_own_transformed_rows():
    """fold / relayout measure a transformed problem: its rows at smaller sizes, kept per kernel and transform,
    are what split dominance compares with inside them (BenchSettings.for_inner)."""
    from ucudnn.measure.sources.base import BenchSettings
    from ucudnn.problem import ConvProblem

    kernel = ConvProblem(256, 3, 227, 227, 96, 11, 11, stride=4)
    folded = ConvProblem(256, 48, 57, 57, 96, 3, 3)
    settings = BenchSettings("strict")
    assert settings.for_inner(folded.with_batch(8), "fold") == (settings, None)   # no kernel started: inactive
    measured: list = []
    settings.start_kernel(kernel, measured)
    inner, rows = settings.for_inner(folded.with_batch(8), ("fold", "NCHW", "legacy"))
    assert inner.kernel == folded and inner.measured is rows and rows == []
    assert settings.split_reference(folded.with_batch(8)) is None          # the kernel's own rows do not apply
    assert inner.split_reference(folded.with_batch(8)) is not None
    again, same = settings.for_inner(folded.with_batch(16), ("fold", "NCHW", "legacy"))
    assert same is rows and settings.for_inner(folded.with_batch(16), ("fold", "NHWC", "legacy"))[1] is not rows
    settings.start_kernel(kernel, [])
    assert settings.for_inner(folded.with_batch(8), ("fold", "NCHW", "legacy"))[1] is not rows   # per kernel
    off = BenchSettings("strict", split_margin=None)
    off.start_kernel(kernel, [])
    assert off.for_inner(folded, "fold") == (off, None)
