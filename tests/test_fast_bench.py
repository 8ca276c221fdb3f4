"""Fast benchmarking (issue 16): Find's times prune, hopeless configurations stop early, a budget bounds a
kernel, and on exact estimates the dominance rule never changes a WR plan.  No GPU: Find and the clock are fakes."""
from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from synthetic import from_options

from ucudnn.binding.cudnn import PerfResult
from ucudnn.errors import InputError
from ucudnn.measure import pruning
from ucudnn.measure.sources import legacy as L
from ucudnn.measure.sources.base import BenchSettings, Operands, Pruner, dominated
from ucudnn.planning.table import BenchmarkTable
from ucudnn.planning.wr import plan_kernel
from ucudnn.problem import ConvProblem

MiB = 1 << 20


# --- the rules -----------------------------------------------------------------------------------
def test_a_configuration_is_dominated_only_by_a_faster_one_needing_no_more_workspace():
    others = [(1.0, 8 * MiB)]
    assert dominated(2.5, 8 * MiB, others, 2.0)            # 2.5x slower, same workspace
    assert dominated(2.5, 16 * MiB, others, 2.0)           # slower and needs more
    assert not dominated(2.5, 4 * MiB, others, 2.0)        # slower but needs less: WR may want it
    assert not dominated(1.9, 8 * MiB, others, 2.0)        # within the margin: re-time it
    assert not dominated(100.0, 8 * MiB, others, None)     # rule off


def test_hopeless_compares_the_first_sample_with_the_best_retimed_time_at_that_micro_batch():
    p = Pruner(BenchSettings("strict", hopeless_factor=4.0))
    assert not p.hopeless(50.0, 0)                         # nothing re-timed yet: no reference
    p.record(1.0, 8 * MiB, 1.2, "median")
    assert p.hopeless(5.0, 8 * MiB)
    assert not p.hopeless(4.5, 8 * MiB)
    assert p.hopeless(50.0, 0)                             # its own sample is recorded: WR may still use it
    q = Pruner(BenchSettings("strict", hopeless_factor=4.0))
    q.record(9.0, 0, None, "first-sample")                 # a first sample is no reference
    assert not q.hopeless(50.0, 0)


def test_the_budget_prunes_once_spent():
    s = BenchSettings("strict", prune_margin=None, kernel_budget_s=0.01, trust_estimate_ms=None)
    s.start_kernel()
    p = Pruner(s)
    assert p.decide(1.0, 0) is None
    time.sleep(0.02)
    assert p.decide(1.0, 0) == "budget"
    assert BenchSettings("strict", kernel_budget_s=None).budget_spent() is False


@pytest.mark.parametrize("field,value", [("prune_margin", 0.5), ("hopeless_factor", 0.0), ("kernel_budget_s", -1.0),
                                         ("split_margin", 0.9)])
def test_settings_name_the_field_they_refuse(field, value):
    with pytest.raises(InputError) as e:
        BenchSettings("strict", **{field: value})
    assert e.value.field == field


def test_unpruned_settings_turn_every_rule_off():
    s = BenchSettings.unpruned("strict", repeat=3)
    assert (s.prune_margin, s.hopeless_factor, s.kernel_budget_s, s.trust_estimate_ms, s.split_margin, s.repeat) == \
        (None, None, None, None, None, 3)


# --- the legacy source with a fake Find ---------------------------------------------------------
class FakeDescriptors:
    conv = 0

    def operands(self, op):
        return 0, 0, 0


def fake_legacy(monkeypatch, find, true_ms):
    """Find returns ``find`` [(algo, find ms, workspace)]; re-timing algo a takes ``true_ms[a]`` per sample."""
    calls: list[tuple[int, bool]] = []

    def find_ex(*args):
        return [PerfResult(a, 0, "SUCCESS", t, ws, True, "FMA") for a, t, ws in find]

    def timer(fn, settings, give_up=None):
        fn()
        algo = calls[-1][0]
        stopped = give_up is not None and give_up(true_ms[algo])
        calls[-1] = (algo, stopped)
        return true_ms[algo]

    monkeypatch.setattr(L, "handle", lambda: 1)
    monkeypatch.setattr(L, "descriptors", lambda p, m: FakeDescriptors())
    monkeypatch.setattr(L.cudnn, "find_algorithm_ex", find_ex)
    monkeypatch.setattr(L.cudnn, "get_algorithm_max_count", lambda h, op: 8)
    monkeypatch.setattr(L.cudnn, "convolution", lambda h, op, alpha, a, pa, b, pb, conv, algo, *rest: calls.append((algo, False)))
    monkeypatch.setattr(L, "time_config", timer)
    return calls


PROBLEM = ConvProblem(16, 64, 28, 28, 64, 3, 3, (1, 1))


def measure(settings):
    ms, sk = L.LegacySource().measure("forward", PROBLEM, Operands(0, 0, 0), 0, settings)
    assert not sk
    return {m.algo: m for m in ms}


def test_legacy_records_find_time_for_a_dominated_configuration_and_does_not_retime_it(monkeypatch):
    calls = fake_legacy(monkeypatch, [(0, 1.0, 4 * MiB), (1, 3.0, 8 * MiB), (2, 3.0, 0)], {0: 1.1, 1: 2.9, 2: 3.2})
    got = measure(BenchSettings("strict", prune_margin=2.0, hopeless_factor=None, trust_estimate_ms=None))
    assert [a for a, _ in calls] == [0, 2]                  # algo 1: slower by Find and needs more workspace
    assert got[1].time_ms == 3.0 and got[1].extra["timed"] == "find" and got[1].extra["pruned"] == "dominated"
    assert got[2].extra["timed"] == "median" and got[2].time_ms == 3.2   # needs less: WR may want it
    assert got[0].extra == {"deterministic": True, "find_time_ms": 1.0, "timed": "median"}


def test_legacy_stops_early_on_a_hopeless_first_sample(monkeypatch):
    calls = fake_legacy(monkeypatch, [(0, 1.0, 4 * MiB), (1, 1.5, 8 * MiB)], {0: 1.0, 1: 9.0})
    got = measure(BenchSettings("strict", prune_margin=2.0, hopeless_factor=4.0, trust_estimate_ms=None))
    assert calls == [(0, False), (1, True)]
    assert got[1].time_ms == 9.0 and got[1].extra["timed"] == "first-sample"


def test_legacy_records_find_time_for_a_long_call_except_in_backward_filter(monkeypatch):
    """One run of a call of 5 ms or more is as good as a median; Find's wgrad time is taken with beta = 0."""
    find = [(0, 1.0, 4 * MiB), (1, 6.0, 0), (2, 30.0, 0)]
    calls = fake_legacy(monkeypatch, find, {0: 1.1, 1: 6.2, 2: 31.0})
    got = measure(BenchSettings("strict", prune_margin=None, hopeless_factor=None, trust_estimate_ms=5.0))
    assert [a for a, _ in calls] == [0]
    assert got[1].time_ms == 6.0 and got[1].extra["timed"] == "find" and got[1].extra["pruned"] == "long"
    calls.clear()
    ms, _ = L.LegacySource().measure("backward_filter", PROBLEM, Operands(0, 0, 0), 0,
                                     BenchSettings("strict", prune_margin=None, hopeless_factor=None,
                                                   trust_estimate_ms=5.0))
    assert sorted(a for a, _ in calls) == [0, 1, 2] and {m.extra["timed"] for m in ms} == {"median"}


def test_legacy_unpruned_retimes_everything(monkeypatch):
    calls = fake_legacy(monkeypatch, [(0, 1.0, 4 * MiB), (1, 30.0, 8 * MiB)], {0: 1.0, 1: 30.0})
    got = measure(BenchSettings.unpruned("strict"))
    assert [a for a, _ in calls] == [0, 1] and {m.extra["timed"] for m in got.values()} == {"median"}


def test_legacy_records_the_host_work_of_what_it_timed_and_none_for_what_it_kept_from_find(monkeypatch):
    """``host_ms`` (planning's near-ties, ``ucudnn.planning.wr.HOST_TIE_FRACTION``) is the timing's own: a row
    kept at Find's time has none, not the previous row's."""
    from ucudnn.binding import timing

    fake_legacy(monkeypatch, [(0, 1.0, 4 * MiB), (1, 3.0, 8 * MiB), (2, 3.0, 0)], {0: 1.1, 1: 2.9, 2: 3.2})
    inner = L.time_config

    def timer(fn, settings, give_up=None):
        t = inner(fn, settings, give_up)
        timing._last.host_ms = 0.05 * t            # what time_ms leaves behind: the host ms per call
        return t

    monkeypatch.setattr(L, "time_config", timer)
    got = measure(BenchSettings("strict", prune_margin=2.0, hopeless_factor=None, trust_estimate_ms=None))
    assert got[0].extra["host_ms"] == pytest.approx(0.055) and got[2].extra["host_ms"] == pytest.approx(0.16)
    assert "host_ms" not in got[1].extra           # dominated: Find's time kept, nothing timed


def test_legacy_with_repeat_zero_trusts_find_as_before(monkeypatch):
    calls = fake_legacy(monkeypatch, [(0, 1.0, 0), (1, 30.0, 0)], {0: 1.0, 1: 30.0})
    got = measure(BenchSettings("strict", repeat=0))
    assert calls == [] and all("timed" not in m.extra for m in got.values())


# --- simulation on recorded tables ---------------------------------------------------------------
def test_simulation_on_a_shipped_table_prunes_and_keeps_the_wr_plans():
    from ucudnn.planning.planner import plan

    table = BenchmarkTable.load("builtin:alexnet-b256-float32-NCHW-h100")
    sim = pruning.simulate(table, BenchSettings(table.numerics), "exact")
    assert sim.counts["dominated"] > 0 and sim.retime_ms < sim.retime_ms_unpruned
    for limit in (8 * MiB, 64 * MiB):
        ref = plan(table, "wr", workspace_limit=limit)
        got = plan(sim.table, "wr", workspace_limit=limit)
        assert pruning.true_time_ms(got, table) == pytest.approx(ref.total_time_ms)


def test_simulation_refuses_an_unknown_estimate():
    with pytest.raises(InputError) as e:
        pruning.simulate(BenchmarkTable("x", 1, []), BenchSettings("strict"), "guess")
    assert e.value.field == "estimate"


option_lists = st.dictionaries(
    st.sampled_from([1, 2, 4, 8]),
    st.lists(st.tuples(st.floats(0.01, 10, allow_nan=False), st.integers(0, 8).map(lambda m: m * MiB)),
             min_size=1, max_size=5),
    min_size=1)


@settings(max_examples=200, deadline=None)
@given(options=option_lists, margin=st.floats(1.0, 4.0), limit_mib=st.integers(0, 8))
def test_dominance_pruning_never_changes_the_wr_plan_when_find_is_exact(options, margin, limit_mib):
    """With exact first estimates a pruned configuration keeps its true time, and it is never WR's choice."""
    options[1] = options.get(1, []) + [(20.0, 0)]    # something always fits
    table = BenchmarkTable("fake", 1, [from_options(8, options)], "strict", {"batch_policy": "powerOfTwo"})
    sim = pruning.simulate(table, BenchSettings("strict", prune_margin=margin, hopeless_factor=None,
                                                kernel_budget_s=None, trust_estimate_ms=None), "exact")
    limit = limit_mib * MiB
    ref = plan_kernel(table.kernels[0], limit)
    got = plan_kernel(sim.table.kernels[0], limit)
    assert sum(m.time_ms for m in got) == pytest.approx(sum(m.time_ms for m in ref))
    assert all(m.extra.get("timed") != "find" for m in got)


# --- the graph source: the quick sample is its first estimate ------------------------------------
def test_graph_prunes_by_the_settings_margin_and_stops_hopeless_engines_at_their_quick_sample():
    from test_graph_source import OPS as GOPS
    from test_graph_source import WS, Cfg, P, source

    lists = {"A": [Cfg(1, ms=1.0, ws=0), Cfg(2, ms=5.0, ws=1 << 20), Cfg(3, ms=0.4, ws=8 << 20),
                   Cfg(4, ms=1.2, ws=0), Cfg(5, ms=2.0, ws=0)]}
    src, fe, timer, _ = source(lists)                       # no quick_margin: BenchSettings decides
    s = BenchSettings("strict", repeat=3, min_sample_ms=0.0, prune_margin=2.0, hopeless_factor=4.0)
    ms, _ = src.measure("forward", P, GOPS, WS, s)
    timing = {m.engine["id"]: m.extra["timing"] for m in ms}
    # 2: dominated by 1 (5x, more workspace); 5: within the margin of 1 but 5x the best median (3): hopeless
    assert timing == {1: "median", 2: "quick", 3: "median", 4: "median", 5: "quick"}
    assert [m.engine["id"] for m in ms] == [1, 2, 3, 4, 5]     # reported in heuristic order
    off, *_ = source(lists)
    ms, _ = off.measure("forward", P, GOPS, WS, BenchSettings.unpruned("strict", repeat=3, min_sample_ms=0.0))
    assert {m.extra["timing"] for m in ms} == {"median"}


# --- wrappers (relayout, fold): the inner measurement is the first estimate ----------------------
def test_wrappers_time_steps_under_the_same_rules_and_keep_input_order():
    from ucudnn.errors import CaptureError
    from ucudnn.measure.sources.wrapper import Wrapper
    from ucudnn.planning.table import Measurement

    true = {"a": 1.0, "b": 9.0, "c": 1.1, "d": 3.0, "e": 0.0}

    class Fake(Wrapper):
        name, key = "fake", "fake"
        timed: list[str] = []

        def time_step(self, op, problem, config, ops, workspace, settings, give_up=None):
            if config.algo == "e":
                raise CaptureError("cannot be captured into a CUDA graph: nope")
            self.timed.append(config.algo)
            if give_up is not None:
                give_up(true[config.algo])   # the first sample; a stop returns it, as time_ms does
            return true[config.algo]

    cfgs = [Measurement(16, a, "FMA", est, ws, "fake") for a, est, ws in
            [("b", 5.0, 8 * MiB), ("a", 1.0, 4 * MiB), ("c", 1.2, 0), ("d", 1.5, 8 * MiB), ("e", 1.3, 0)]]
    got = Fake([]).time_steps("forward", PROBLEM, cfgs, Operands(0, 0, 0), 0,
                              BenchSettings("strict", prune_margin=2.0, hopeless_factor=2.5, trust_estimate_ms=None))
    assert got[0] == (5.0, "estimate")            # b: 5x a's estimate, more workspace: keeps its estimate
    assert got[1] == (1.0, "median") and got[2] == (1.1, "median")
    assert got[3] == (3.0, "first-sample")        # d: its first sample is 3x the best median
    assert isinstance(got[4], CaptureError)
    assert Fake.timed == ["a", "c", "d"]          # fastest estimate first; b never timed


def test_a_wrapped_row_records_its_own_steps_host_work_not_the_inner_calls():
    """A wrapper's row is the whole step (its moves and the inner call): its ``host_ms`` is the step's timing's;
    the inner configuration's ``host_ms`` is dropped, and a row that kept its estimate records none."""
    from ucudnn.binding import timing
    from ucudnn.measure.sources.wrapper import Wrapper
    from ucudnn.planning.table import Measurement

    class Fake(Wrapper):
        name, key = "fake", "fake"

        def time_step(self, op, problem, config, ops, workspace, settings, give_up=None):
            timing._last.host_ms = 0.07                 # what time_ms leaves behind
            return 1.0

    cfgs = [Measurement(16, "a", "FMA", 1.0, 0, "fake", None, {"host_ms": 0.01}),
            Measurement(16, "b", "FMA", 5.0, 8 * MiB, "fake", None, {"host_ms": 0.01})]
    rows, _ = Fake([]).timed_rows("forward", PROBLEM, cfgs, Operands(0, 0, 0), 0,
                                  BenchSettings("strict", prune_margin=2.0, hopeless_factor=None,
                                                trust_estimate_ms=None), "fake")
    by = {m.algo: m.extra for m in rows}
    assert by["a"]["timed"] == "median" and by["a"]["host_ms"] == pytest.approx(0.07)
    assert by["b"]["timed"] == "estimate" and "host_ms" not in by["b"]


# --- which math types Find runs under ------------------------------------------------------------
def test_16_bit_data_runs_find_once_under_tensor_op_which_returns_the_default_rows_too(monkeypatch):
    """Measured (find_probe): for half data Find under TENSOR_OP returns every DEFAULT row, and ALLOW_CONVERSION
    the same kernels as TENSOR_OP; FP32 keeps a Find per math type."""
    from ucudnn import numerics as num

    assert num.find_math_types("default", "float16") == ("TENSOR_OP",)
    assert num.find_math_types("default", "bfloat16") == ("TENSOR_OP",)
    assert num.find_math_types("strict", "float16") == ("TENSOR_OP", "FMA")
    for mode in ("strict", "tf32", "default"):
        assert num.find_math_types(mode, "float32") == num.allowed_math_types(mode, "float32")
    finds: list[str] = []
    monkeypatch.setattr(L, "handle", lambda: 1)
    monkeypatch.setattr(L, "descriptors", lambda p, m: finds.append(m) or FakeDescriptors())
    monkeypatch.setattr(L.cudnn, "get_algorithm_max_count", lambda h, op: 8)
    monkeypatch.setattr(L.cudnn, "find_algorithm_ex", lambda *a: [
        PerfResult(1, 0, "SUCCESS", 0.5, 4 * MiB, True, "TENSOR_OP"), PerfResult(1, 0, "SUCCESS", 9.0, 4 * MiB, True, "DEFAULT"),
        PerfResult(0, 0, "SUCCESS", 20.0, 0, True, "DEFAULT")])
    ms, sk = L.LegacySource().measure("forward", ConvProblem(16, 64, 28, 28, 64, 3, 3, (1, 1), dtype="float16"),
                                      Operands(0, 0, 0), 0, BenchSettings("default", repeat=0))
    assert finds == ["TENSOR_OP"] and not sk
    assert sorted((m.algo, m.math_type) for m in ms) == [(0, "DEFAULT"), (1, "DEFAULT"), (1, "TENSOR_OP")]


def test_retime_applies_the_early_stop_and_records_what_it_timed():
    """One place times a configuration under the early stop for every source (legacy, wrappers, mec, winograd)."""
    p = Pruner(BenchSettings("strict"))
    p.record(1.0, 0, 1.0, "median")                              # the best re-timed so far: 1 ms
    seen = []

    def timing(first):
        def run(give_up):
            seen.append(give_up)
            return first if give_up is not None and give_up(first) else first / 2
        return run

    assert p.retime(timing(5.0), 4.0, 0) == (5.0, "first-sample")   # 5 ms > 2 x 1 ms: its first sample stands
    assert p.retime(timing(1.5), None, 0) == (0.75, "median")      # not hopeless: the median is what it timed
    assert p.estimates[-2:] == [(4.0, 0), (0.75, 0)] and p.timed[-1] == (0.75, 0)
    assert p.counts == {"median": 2, "first-sample": 1}
    off = Pruner(BenchSettings("strict", hopeless_factor=None))
    assert off.retime(timing(9.0), 9.0, 0) == (4.5, "median") and seen[-1] is None


def test_a_median_far_over_its_estimate_is_timed_once_more_and_the_smaller_median_kept():
    """Timing noise only adds time: a median 2-7x its estimate (Find's, the quick sample) was an outlier on the
    H100 (``BenchSettings.confirm_factor``), so it is confirmed by one more median, never averaged in."""
    medians = iter([0.666, 0.096])
    p = Pruner(BenchSettings("strict", hopeless_factor=None))
    assert p.retime(lambda give_up: next(medians), 0.143, 0) == (0.096, "median")     # 0.666 > 2 x 0.143: again
    assert p.counts == {"median": 1, "confirmed": 1} and p.timed == [(0.096, 0)]
    again = iter([0.3, 0.5])
    assert p.retime(lambda give_up: next(again), 0.143, 0) == (0.3, "median")          # the smaller of the two
    within = iter([0.28, 99.0])
    assert p.retime(lambda give_up: next(within), 0.143, 0) == (0.28, "median")        # under 2x: one median
    assert p.counts["confirmed"] == 2
    off = Pruner(BenchSettings("strict", hopeless_factor=None, confirm_factor=None))
    assert off.retime(lambda give_up: 5.0, 0.1, 0) == (5.0, "median") and "confirmed" not in off.counts
    with pytest.raises(InputError, match="at least 1.0"):
        BenchSettings("strict", confirm_factor=0.5)


# ---- the one timing path of sources with their own kernels (mec, winograd) ------------------------------------------
class _OwnKernels:
    """A source with its own kernels whose ``prepare`` fails as told."""

    name = "own"

    def __init__(self, fail=None):
        self.fail = fail

    def prepare(self, op, problem, config):
        if self.fail is not None:
            raise self.fail
        return lambda ops, workspace, ws, alpha, beta: None


def _time_prepared(fail, monkeypatch, ms=0.25):
    from ucudnn.measure.sources import base
    from ucudnn.planning.table import Measurement

    monkeypatch.setattr(base, "time_config", lambda fn, settings, give_up=None: (fn(), ms)[1])
    src = type("Own", (base.Prepared,), dict(vars(_OwnKernels)))(fail)
    p = ConvProblem(4, 8, 6, 6, 16, 3, 3, (1, 1))
    cfg = Measurement(4, "k", "FMA", 0.0, 1024, "own", None, {"own": {"v": 1}, "deterministic": True})
    pruner = Pruner(BenchSettings("strict", hopeless_factor=4.0))
    return src.time_prepared("forward", p, cfg, Operands(0, 0, 0), 0, 0.0, BenchSettings("strict"), pruner), pruner


def test_a_timed_configuration_keeps_its_identity_and_says_how_it_was_timed(monkeypatch):
    row, pruner = _time_prepared(None, monkeypatch)
    assert (row.micro_batch, row.algo, row.math_type, row.workspace_bytes, row.source) == (4, "k", "FMA", 1024, "own")
    assert row.time_ms == 0.25 and row.extra == {"own": {"v": 1}, "deterministic": True, "timed": "median"}
    assert pruner.timed == [(0.25, 1024)]


def test_a_configuration_that_fails_is_a_skipped_row_naming_the_source(monkeypatch):
    from ucudnn.errors import CaptureError

    row, pruner = _time_prepared(CaptureError("cannot capture cublas"), monkeypatch)
    assert row.reason == "own: cannot capture cublas" and pruner.timed == []
    row, _ = _time_prepared(MemoryError("out of memory"), monkeypatch)
    assert row.reason.startswith("own: ") and "out of memory" in row.reason and row.algo == "k"


def test_the_fastest_of_several_tables_takes_each_configurations_smallest_time():
    from ucudnn.planning.table import KernelBench, Measurement

    def table(times, extra=()):
        ms = [Measurement(n, 7, "FMA", t, 48 * MiB, "legacy") for n, t in times] + list(extra)
        return BenchmarkTable("H100", 91900, [KernelBench("conv2/forward", "forward", PROBLEM, ms)], "strict")

    only_b = Measurement(4, 1, "FMA", 0.5, 0, "legacy")
    a = table([(8, 0.098), (16, 0.666)])
    b = table([(8, 0.093), (16, 0.096)], [only_b])
    got = pruning.fastest_of([a, b])
    assert [m.time_ms for m in got.kernels[0].measurements] == [0.093, 0.096]   # a's rows, each at its fastest
    assert [m.time_ms for m in a.kernels[0].measurements] == [0.098, 0.666]     # the inputs are left alone
    assert pruning.fastest_of([a]).kernels[0].measurements == a.kernels[0].measurements


def test_split_dominance_weighs_finds_estimate_less_finds_overhead_on_that_configuration_at_the_smaller_size():
    """Find's single run of a short call carries a launch overhead (0.05-0.13 ms on an H100): the configuration's own
    overhead at the largest smaller size is taken off before comparing with the split (H100 AlexNet conv5 backward
    data, legacy algorithm 5: Find 0.255 ms at n = 32, re-timed 0.130; at n = 16 Find 0.200, re-timed 0.0742)."""
    from ucudnn.measure.sources.base import SplitReference, find_overhead_ms, identity
    from ucudnn.planning.table import Measurement

    at16 = Measurement(16, 5, "FMA", 0.0742, 0, "legacy", extra={"find_time_ms": 0.2, "timed": "median"})
    split = SplitReference.of([at16], 32, 256, 1.5)
    assert split.reference(0)[0] == pytest.approx(2 * 0.0742)
    assert find_overhead_ms(at16) == pytest.approx(0.1258)
    p = Pruner(BenchSettings("strict"), split=split)
    assert p.decide(0.255, 0) == "split-dominated"              # Find's time alone: 0.255 > 1.5 x 0.148
    assert p.decide(0.255, 0, identity(at16)) is None           # less 0.126 of overhead: re-timed
    # a configuration whose Find carried little overhead: over the margin and plausible, pruned; implausible, re-timed
    quiet16 = Measurement(16, 5, "FMA", 0.0742, 0, "legacy", extra={"find_time_ms": 0.08, "timed": "median"})
    q = Pruner(BenchSettings("strict"), split=SplitReference.of([quiet16], 32, 256, 1.5))
    assert q.decide(0.26, 0, identity(quiet16)) == "split-dominated"   # 0.26 - 0.006 > 1.5 x 0.148, < 2 x 0.148
    assert q.decide(0.40, 0, identity(quiet16)) is None                 # over 2 x its own time scaled to n = 32
    # no overhead where the smaller size was not re-timed, or Find was faster than the median
    assert find_overhead_ms(Measurement(16, 5, "FMA", 0.2, 0, extra={"find_time_ms": 0.1, "timed": "find"})) == 0.0
    assert find_overhead_ms(Measurement(16, 5, "FMA", 0.2, 0, extra={"find_time_ms": 0.1})) == 0.0
    assert find_overhead_ms(None) == 0.0


def test_an_estimate_far_over_the_configurations_own_smaller_sizes_scaled_up_is_retimed_not_used():
    """Find timed legacy WINOGRAD_NONFUSED at n = 32 at 0.819 ms where 8 samples took 0.080 ms (0.32 ms scaled to 32)
    and its median is 0.135: over ``confirm_factor`` x that, the estimate prunes nothing (H100, issue 16)."""
    from ucudnn.measure.sources.base import SplitReference, identity
    from ucudnn.planning.table import Measurement

    rows = [Measurement(8, 7, "FMA", 0.080, 0, "legacy", extra={"find_time_ms": 0.142}),
            Measurement(16, 7, "FMA", 0.237, 0, "legacy", extra={"find_time_ms": 0.158}),
            Measurement(16, 1, "FMA", 0.05, 0, "legacy")]
    split = SplitReference.of(rows, 32, 256, 1.5)
    key = identity(rows[0])
    assert split.extrapolated_ms(key) == pytest.approx(0.32)          # the lower envelope: 8 samples, not 16's outlier
    assert split.extrapolated_ms(("legacy", "3", "FMA")) == float("inf")
    p = Pruner(BenchSettings("strict"), split=split)
    assert p.decide(0.819, 0) == "split-dominated"                    # without its identity: pruned on the outlier
    assert p.decide(0.819, 0, key) is None                            # 0.819 > 2 x 0.32: re-timed
    assert p.decide(0.60, 0, key) == "split-dominated"                # plausible (< 0.64) and over the margin
    off = Pruner(BenchSettings("strict", confirm_factor=None), split=split)
    assert off.decide(0.819, 0, key) == "split-dominated"
