"""Channel slices (issue 18) without a GPU: policies, the k cover, plan layout, WR / WD with slices, execution
bookkeeping (which views and betas each step gets).  Numerical results are in test_gpu_channels.py.
"""
from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ucudnn.errors import InfeasibleError, InputError, TableError
from ucudnn.execute.executor import Executor
from ucudnn.planning.channels import combine, steps
from ucudnn.planning.pareto import desirable_set, fastest_within
from ucudnn.planning.plan import KernelPlan, MicroConfig, Plan
from ucudnn.planning.table import BenchmarkTable, KernelBench, Measurement
from ucudnn.planning.wr import plan_kernel, plan_wr
from ucudnn.policy import channel_sizes
from ucudnn.problem import ConvProblem

MiB = 1 << 20


# --- policies -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("policy, k, expect", [
    ("none", 256, []),
    ("halves", 256, [128, 64, 32]),
    ("halves", 96, [48, 24]),          # 12 is not a multiple of 8: slices must keep y 16-byte aligned
    ("halves", 100, []),               # 50 / 25: not multiples of 8
    ("powerOfTwo", 96, [64, 32, 16, 8]),
    ("powerOfTwo", 8, []),
    (None, 64, []),
])
def test_channel_policies_list_aligned_slices_below_k(policy, k, expect):
    assert channel_sizes(policy, k) == expect


def test_grouped_convolutions_get_no_channel_slices():
    assert channel_sizes("halves", 256, groups=2) == []


def test_an_unknown_channel_policy_names_the_field():
    with pytest.raises(InputError) as e:
        channel_sizes("thirds", 96)
    assert e.value.field == "channel_policy"


def test_a_channel_slice_problem_is_a_strided_view_of_the_wider_y():
    p = ConvProblem(4, 3, 8, 8, 64, 3, 3, pad=1)
    s = p.with_channels(16)
    assert (s.k, s.k_total) == (16, 64) and s.y_shape() == (4, 16, 8, 8)
    assert s.y_strides() == (64 * 64, 64, 8, 1) and p.y_strides() == (64 * 64, 64, 8, 1)
    nhwc = ConvProblem(4, 3, 8, 8, 64, 3, 3, pad=1, layout="NHWC").with_channels(16)
    assert nhwc.y_strides() == (64 * 64, 1, 8 * 64, 64)
    assert "k_total" not in p.to_dict() and p.key() == ConvProblem(4, 3, 8, 8, 64, 3, 3, pad=1).key()
    with pytest.raises(InputError, match="k_total"):
        ConvProblem(4, 4, 8, 8, 64, 3, 3, groups=2).with_channels(32)


# --- the k cover --------------------------------------------------------------------------------------------
def _brute(k, whole, parts):
    best = whole if whole is not None else math.inf
    sizes = sorted(parts)
    for m in range(1, k // min(sizes) + 1 if sizes else 1):
        for combo in itertools.combinations_with_replacement(sizes, m):
            if sum(combo) == k:
                best = min(best, sum(parts[c] for c in combo))
    return best


@settings(max_examples=200, deadline=None)
@given(k8=st.integers(2, 16), data=st.data())
def test_the_cover_is_the_cheapest_multiset_of_slices_and_sums_to_k(k8, data):
    k = 8 * k8
    sizes = data.draw(st.sets(st.sampled_from([c for c in (8, 16, 24, 32, 48, 64, 96) if c < k]), max_size=4))
    parts = {c: data.draw(st.floats(0.1, 10)) for c in sizes}
    whole = data.draw(st.one_of(st.none(), st.floats(0.1, 40)))
    best, cover = combine(k, None if whole is None else np.array([whole]),
                          {c: np.array([t]) for c, t in parts.items()})
    expect = _brute(k, whole, parts)
    assert best[0] == pytest.approx(expect) if math.isfinite(expect) else not math.isfinite(best[0])
    if math.isfinite(expect):
        chosen = cover(0)
        assert chosen == [None] or sum(chosen) == k
        assert sum(whole if c is None else parts[c] for c in chosen) == pytest.approx(best[0])


def test_the_whole_k_wins_ties_and_levels_are_independent():
    best, cover = combine(64, np.array([2.0, 5.0]), {32: np.array([1.0, 1.0])})
    assert list(best) == [2.0, 2.0] and cover(0) == [None] and cover(1) == [32, 32]


# --- plan layout --------------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 40), data=st.data())
def test_steps_cover_every_sample_and_channel_exactly_once(n, data):
    k_slices = data.draw(st.lists(st.sampled_from([8, 16, 32]), min_size=1, max_size=5))
    k = sum(k_slices)
    configs = []
    for c in k_slices:
        rest = n
        while rest:
            mb = data.draw(st.integers(1, rest))
            configs.append(MicroConfig(mb, 0, "FMA", 1.0, 0, channels=None if len(k_slices) == 1 else c))
            rest -= mb
    grid = np.zeros((n, k), dtype=int)
    out = steps(configs, n, k)
    for i, s in enumerate(out):
        grid[s.n0:s.n0 + s.config.micro_batch, s.k0:s.k0 + s.kc] += 1
        assert s.first_in_slice == (s.n0 == 0) and s.first_slice == (s.k0 == 0)
    assert (grid == 1).all()


@pytest.mark.parametrize("configs, match", [
    ([(4, None), (4, None)], "sum to 8, not the mini-batch n=10"),
    ([(10, 32), (10, 16)], "cover 48 of k=64"),
    ([(10, 32), (5, 32), (5, 16)], "16 channels inside a slice of 32"),
    ([(10, 32), (10, 64)], "past k=64"),
    ([(10, None), (2, None)], r"sum past the mini-batch n=10 \(steps 0-0 already cover it\)"),
    ([(6, None), (4, None), (3, None)], r"sum past the mini-batch n=10 \(steps 0-1"),
])
def test_plans_that_do_not_cover_the_rectangle_are_refused_naming_the_field(configs, match):
    cfgs = [MicroConfig(mb, 0, "FMA", 1.0, 0, channels=c) for mb, c in configs]
    with pytest.raises(InputError, match=match) as e:
        steps(cfgs, 10, 64)
    assert e.value.field == "micro_batches"


# --- planning -----------------------------------------------------------------------------------------------
P = ConvProblem(64, 64, 27, 27, 192, 5, 5, pad=2)


def _kernel(extra: list[Measurement]) -> KernelBench:
    """A Winograd-like kernel: the fast algorithm pays a fixed 1 ms filter transform per call and needs
    100 MiB x (micro-batch / 64) of workspace, so under 64 MiB it runs 32 samples at a time and pays the transform
    twice; a slow zero-workspace algorithm always fits."""
    ms = [Measurement(b, 0, "FMA", 1.0 * b, 0) for b in (1, 2, 4, 8, 16, 32, 64)]
    ms += [Measurement(b, 1, "FMA", 0.1 * b + 1.0, int(100 * MiB * b / 64)) for b in (1, 2, 4, 8, 16, 32, 64)]
    return KernelBench("conv2", "forward", P, ms + extra)


def _sliced(c: int) -> list[Measurement]:
    """The same algorithm on c of the 192 channels: time, transform and workspace scale with c, plus 0.05 ms
    a call."""
    f = c / 192
    return [Measurement(b, 1, "FMA", (0.1 * b + 1.0) * f + 0.05, int(100 * MiB * b / 64 * f), channels=c)
            for b in (1, 2, 4, 8, 16, 32, 64)]


def test_a_table_without_slices_plans_exactly_as_before():
    plan = plan_kernel(_kernel([]), 64 * MiB)
    assert [(m.micro_batch, m.algo, m.channels) for m in plan] == [(32, 1, None), (32, 1, None)]
    assert sum(m.time_ms for m in plan) == pytest.approx(8.4)


def test_under_a_limit_wr_covers_k_with_slices_where_that_is_faster():
    k = _kernel(_sliced(96) + _sliced(48))
    plan = plan_kernel(k, 64 * MiB)
    # two slices of 96 channels run all 64 samples at once (50 MiB each): 7.5 ms against 8.4 ms batch-only
    assert [(m.micro_batch, m.channels) for m in plan] == [(64, 96), (64, 96)]
    assert sum(m.time_ms for m in plan) == pytest.approx(7.5)
    unbounded = plan_kernel(k, 1 << 40)
    assert [(m.micro_batch, m.channels) for m in unbounded] == [(64, None)]   # 7.4 ms: slices pay 0.05 a call


def test_wr_with_slices_is_never_slower_than_without_at_any_limit():
    with_slices = _kernel(_sliced(96) + _sliced(48))
    without = _kernel([])
    for limit in (0, 1 * MiB, 8 * MiB, 20 * MiB, 40 * MiB, 64 * MiB, 128 * MiB):
        a = sum(m.time_ms for m in plan_kernel(with_slices, limit))
        b = sum(m.time_ms for m in plan_kernel(without, limit))
        assert a <= b + 1e-9


def test_the_desirable_set_with_slices_gives_the_wr_optimum_at_every_level():
    kernel = _kernel(_sliced(96) + _sliced(48) + _sliced(24))
    configs = desirable_set(kernel)
    levels = sorted({m.workspace_bytes for m in kernel.measurements})
    for limit in levels:
        best = fastest_within(configs, limit)
        wr = plan_kernel(kernel, limit)
        assert best is not None and best.time_ms == pytest.approx(sum(m.time_ms for m in wr))
        steps(list(best.micro), P.n, P.k)   # every desirable configuration is a valid cover


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_wr_with_slices_equals_brute_force_over_slice_covers(seed):
    """Against an independent enumeration: every cover of k by measured slice sizes, each slice with its own
    batch-only WR optimum; random times and workspaces."""
    rng = np.random.default_rng(seed)
    p = ConvProblem(8, 16, 9, 9, 32, 3, 3, pad=1)
    ms = []
    for ch in (None, 16, 8):
        for b in (1, 2, 4, 8):
            for algo in range(3):
                ms.append(Measurement(b, algo, "FMA", float(rng.uniform(0.1, 2)) * b, int(rng.integers(0, 9)) * MiB,
                                      channels=ch))
    kernel = KernelBench("k", "forward", p, ms)
    for limit in (0, 2 * MiB, 5 * MiB, 9 * MiB):
        def batch_only(ch):   # the batch-only WR optimum of one slice size, as a table of just that slice
            alone = [dataclasses.replace(m, channels=None) for m in ms if m.channels == ch]
            try:
                return sum(m.time_ms for m in plan_kernel(KernelBench("k", "forward", p, alone), limit))
            except InfeasibleError:
                return math.inf
        cost = {ch: batch_only(ch) for ch in (None, 16, 8)}
        expect = min(cost[None], 2 * cost[16], cost[16] + 2 * cost[8], 4 * cost[8])
        try:
            got = sum(m.time_ms for m in plan_kernel(kernel, limit))
        except InfeasibleError:
            got = math.inf
        assert got == pytest.approx(expect) if math.isfinite(expect) else got == math.inf


def test_tables_and_plans_record_the_slice_and_read_it_back():
    kernel = _kernel(_sliced(96))
    table = BenchmarkTable("H100", 91900, [kernel], "strict")
    back = BenchmarkTable.loads(table.to_json())
    assert [m.channels for m in back.kernels[0].measurements] == [m.channels for m in kernel.measurements]
    plan = plan_wr(back, 64 * MiB)
    again = Plan.from_dict(plan.to_dict())
    assert [c.channels for c in again.kernels[0].configs] == [96, 96]
    assert again.kernels[0].batch == 64 and "k96" in again.kernels[0].summary()


def test_a_slice_as_wide_as_k_is_refused_naming_the_measurement():
    doc = BenchmarkTable("H100", 91900, [_kernel([Measurement(64, 1, "FMA", 1.0, 0, channels=192)])],
                         "strict").to_dict()
    with pytest.raises(TableError) as e:
        BenchmarkTable.from_dict(doc)
    assert e.value.field.endswith(".channels")


# --- execution bookkeeping ----------------------------------------------------------------------------------
Q = ConvProblem(10, 3, 8, 8, 32, 3, 3, pad=(1, 1))        # NCHW float32
XS, YS, YC, WK = 3 * 64 * 4, 32 * 64 * 4, 64 * 4, 3 * 9 * 4   # x, y per sample; y per channel; w per filter


class _Recorder:
    name = "recorder"

    def __init__(self):
        self.prepared, self.calls = [], []

    def prepare(self, op, problem, config):
        self.prepared.append((problem.n, problem.k, problem.k_total))
        return lambda ops, ws, wsb, alpha, beta: self.calls.append((ops.a, ops.b, ops.out, beta))


@pytest.fixture
def recorder(monkeypatch):
    from ucudnn.measure.sources import registry

    rec = _Recorder()
    monkeypatch.setitem(registry._SOURCES, rec.name, rec)
    return rec


def _run(op, layout_=((16, [10]), (16, [6, 4])), problem=Q, beta=0.0):
    cfgs = [MicroConfig(mb, 0, "FMA", 1.0, 0, "recorder", channels=c) for c, mbs in layout_ for mb in mbs]
    ex = Executor(KernelPlan("k", op, problem, cfgs))
    ex.launch((1 << 30, 2 << 30, 3 << 30), 0, 0, beta=beta)
    return ex


def test_forward_slices_write_their_channels_of_each_sample(recorder):
    _run("forward", beta=0.5)
    assert recorder.prepared == [(10, 16, 32), (6, 16, 32), (4, 16, 32)]
    assert recorder.calls == [(1 << 30, 2 << 30, 3 << 30, 0.5),
                              ((1 << 30), (2 << 30) + 16 * WK, (3 << 30) + 16 * YC, 0.5),
                              ((1 << 30) + 6 * XS, (2 << 30) + 16 * WK, (3 << 30) + 6 * YS + 16 * YC, 0.5)]


def test_backward_data_adds_every_slice_after_the_first_into_dx(recorder):
    _run("backward_data", beta=0.0)
    assert recorder.calls == [(1 << 30, 2 << 30, 3 << 30, 0.0),
                              ((1 << 30) + 16 * WK, (2 << 30) + 16 * YC, 3 << 30, 1.0),
                              ((1 << 30) + 16 * WK, (2 << 30) + 6 * YS + 16 * YC, (3 << 30) + 6 * XS, 1.0)]


def test_backward_filter_accumulates_within_a_slice_and_starts_each_slice_with_the_callers_beta(recorder):
    _run("backward_filter", beta=0.25)
    assert [(out, beta) for *_, out, beta in recorder.calls] == [
        (3 << 30, 0.25), ((3 << 30) + 16 * WK, 0.25), ((3 << 30) + 16 * WK, 1.0)]
    assert [b for _, b, _, _ in recorder.calls] == [2 << 30, (2 << 30) + 16 * YC, (2 << 30) + 6 * YS + 16 * YC]


def test_nhwc_slices_start_k0_elements_into_each_pixel(recorder):
    nhwc = ConvProblem(10, 3, 8, 8, 32, 3, 3, pad=(1, 1), layout="NHWC")
    _run("forward", problem=nhwc)
    assert [out for _, _, out, _ in recorder.calls] == [3 << 30, (3 << 30) + 16 * 4, (3 << 30) + 6 * YS + 16 * 4]


def test_wd_takes_sliced_configurations_and_its_plans_execute_as_covers():
    from ucudnn.planning.wd import plan_wd

    table = BenchmarkTable("H100", 91900, [_kernel(_sliced(96) + _sliced(48)),
                                           KernelBench("conv3", "forward", P, _kernel([]).measurements)], "strict")
    wd = plan_wd(table, 110 * MiB)
    assert wd.workspace_bytes <= 110 * MiB
    for k in wd.kernels:
        steps(k.configs, P.n, P.k)
    # 110 MiB in all: conv2 slices its channels (7.5 ms in 50 MiB) beside conv3's two micro-batches (8.4 ms, 50 MiB)
    wr = plan_wr(table, 55 * MiB)
    assert wd.total_time_ms <= wr.total_time_ms + 1e-9
    assert any(c.channels is not None for k in wd.kernels for c in k.configs)
