"""Heuristic plans (``UCUDNN_BENCHMARK=heuristic``), on CPU: the composition of the division, and the whole of
``heuristic_plan`` over a fake cuDNN binding (the real one: tests/test_gpu_heuristic.py)."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ucudnn.binding import cudnn
from ucudnn.errors import CudnnError, InfeasibleError
from ucudnn.measure import heuristic
from ucudnn.measure.heuristic import UNTIMED_MS, compose, heuristic_plan
from ucudnn.planning.plan import Plan
from ucudnn.planning.table import Measurement
from ucudnn.policy import POLICIES, micro_batch_sizes
from ucudnn.problem import ConvProblem
from ucudnn.schemas import validate


# --- compose: pure ------------------------------------------------------------------------------------------
def coverable(n: int, sizes) -> bool:
    reach = [True] + [False] * n
    for b in range(1, n + 1):
        reach[b] = any(s <= b and reach[b - s] for s in sizes)
    return reach[n]


class Fits:
    """``fits`` for compose from each size's smallest workspace (None: nothing at that size); records the calls."""

    def __init__(self, need: dict[int, int | None], limit: int):
        self.need, self.limit, self.calls = need, limit, []

    def __call__(self, size: int) -> Measurement | None:
        self.calls.append(size)
        w = self.need.get(size)
        return None if w is None or w > self.limit else Measurement(size, 0, "FMA", UNTIMED_MS, w)


@st.composite
def cases(draw, monotone: bool = False):
    n = draw(st.integers(1, 300))
    sizes = micro_batch_sizes(draw(st.sampled_from(POLICIES)), n)
    if monotone:   # the usual shape: the workspace grows with the micro-batch
        steps = draw(st.lists(st.integers(0, 3), min_size=len(sizes), max_size=len(sizes)))
        need = {s: sum(steps[: i + 1]) for i, s in enumerate(sizes)}
    else:
        need = {s: draw(st.none() | st.integers(0, 10)) for s in sizes}
    return n, sizes, need, draw(st.integers(0, 12))


@settings(max_examples=300, deadline=None)
@given(cases())
def test_compose_sums_to_n_with_fitting_sizes_or_says_none_exists(case):
    n, sizes, need, limit = case
    fits = Fits(need, limit)
    out = compose(n, sizes, fits)
    assert len(fits.calls) == len(set(fits.calls)), "each size is asked at most once"
    fitting = [s for s in sizes if need[s] is not None and need[s] <= limit]
    if out is None:
        assert not coverable(n, fitting)
        return
    assert sum(m.micro_batch for m in out) == n
    assert all(m.micro_batch in fitting and m.workspace_bytes <= limit for m in out)


@settings(max_examples=300, deadline=None)
@given(cases(monotone=True))
def test_compose_runs_the_largest_fitting_size_for_the_bulk_and_asks_only_what_it_walks(case):
    n, sizes, need, limit = case
    fits = Fits(need, limit)
    out = compose(n, sizes, fits)
    fitting = [s for s in sizes if need[s] <= limit]
    if not fitting:   # every policy but undivided has size 1, so a monotone need leaves nothing else
        assert out is None
        return
    bulk = max(fitting)
    assert [m.micro_batch for m in out[: n // bulk]] == [bulk] * (n // bulk)
    assert [m.micro_batch for m in out] == sorted((m.micro_batch for m in out), reverse=True)
    # the sizes that failed above the bulk, the bulk, then only the sizes the remainder uses
    assert fits.calls == [s for s in sorted(sizes, reverse=True) if s >= bulk] + sorted(
        {m.micro_batch for m in out if m.micro_batch < bulk}, reverse=True)


def test_compose_255_under_power_of_two_is_128_then_the_binary_remainder():
    fits = Fits({s: s for s in micro_batch_sizes("powerOfTwo", 255)}, limit=128)
    out = compose(255, micro_batch_sizes("powerOfTwo", 255), fits)
    assert [m.micro_batch for m in out] == [128, 64, 32, 16, 8, 4, 2, 1]
    assert fits.calls == [255, 128, 64, 32, 16, 8, 4, 2, 1]


def test_compose_falls_back_to_any_division_where_the_greedy_walk_strands_a_remainder():
    # 8: 5 fits, leaving 3, which 4 and 5 cannot cover; 4 + 4 can
    out = compose(8, [1, 2, 3, 4, 5, 8], Fits({4: 0, 5: 0}, limit=0))
    assert [m.micro_batch for m in out] == [4, 4]


# --- heuristic_plan over a fake binding ---------------------------------------------------------------------
KiB = 1 << 10


def row(algo: int, math: str, status: int = 0, deterministic: bool = True, memory: int = 0) -> cudnn.PerfResult:
    """One heuristic row as the binding returns it: untimed (-1), the heuristic's own workspace figure."""
    return cudnn.PerfResult(algo, status, "CUDNN_STATUS_SUCCESS" if status == 0 else "CUDNN_STATUS_NOT_SUPPORTED",
                            -1.0, memory, deterministic, math)


@dataclass(frozen=True)
class FakeDescriptors:
    mb: int
    math: str

    @property
    def conv(self):
        return (self.mb, self.math)

    def operands(self, op):
        return tuple((role, self.mb, self.math) for role in ("a", "b", "out"))


class FakeCudnn:
    """cuDNN's answers: per descriptor math type, a ranking (best first); per (micro-batch, algo, math type), the
    workspace ``cudnnGet*WorkspaceSize`` reports (a missing entry: cuDNN refuses to size it)."""

    def __init__(self, rankings: dict[str, list[cudnn.PerfResult]], workspace):
        self.rankings, self.workspace = rankings, workspace
        self.queries: list[tuple[int, str]] = []   # (micro-batch, descriptor math type) of each heuristic query

    def install(self, mp):
        mp.setattr(heuristic, "handle", lambda: 7)
        mp.setattr(heuristic, "descriptors", lambda problem, math="DEFAULT": FakeDescriptors(problem.n, math))
        mp.setattr(cudnn, "get_algorithm_max_count", lambda h, op: 8)
        mp.setattr(cudnn, "get_algorithm_v7", self.get_algorithm_v7)
        mp.setattr(cudnn, "get_workspace_size", self.get_workspace_size)
        return self

    def get_algorithm_v7(self, h, op, a, b, conv, out, requested):
        assert h == 7 and requested == 16 and a[0] == "a" and out[0] == "out"
        mb, math = conv
        self.queries.append((mb, math))
        return list(self.rankings.get(math, []))[:requested]

    def get_workspace_size(self, h, op, a, b, conv, out, algo):
        mb, math = conv
        w = self.workspace(mb, algo, math)
        if w is None:
            raise CudnnError("cudnnGetConvolutionForwardWorkspaceSize", 3000, "CUDNN_STATUS_NOT_SUPPORTED")
        return w


@pytest.fixture
def fake(monkeypatch):
    """Install a FakeCudnn: ``fake(rankings, workspace)``."""
    return lambda rankings, workspace: FakeCudnn(rankings, workspace).install(monkeypatch)


P255 = ConvProblem(255, 3, 17, 19, 8, 3, 5, pad=(1, 2), stride=(2, 2))


def divisions(plan):
    return [(c.micro_batch, c.algo, c.math_type) for c in plan.configs]


def test_the_best_ranked_fitting_candidate_at_the_largest_fitting_size_then_the_remainder(fake):
    # algo 1 (cuDNN's first choice) needs 1 KiB a sample, algo 0 100 bytes a sample
    f = fake({"FMA": [row(1, "FMA"), row(0, "FMA")]}, lambda mb, algo, math: mb * (KiB if algo == 1 else 100))
    plan = heuristic_plan(P255, "forward", 10_000, "powerOfTwo", "strict")
    # algo 0 fits up to 100 samples, algo 1 up to 9
    assert divisions(plan) == [(64, 0, "FMA")] * 3 + [(32, 0, "FMA"), (16, 0, "FMA"), (8, 1, "FMA"), (4, 1, "FMA"),
                                                      (2, 1, "FMA"), (1, 1, "FMA")]
    assert plan.batch == 255 and plan.workspace_bytes <= 10_000
    assert [mb for mb, _ in f.queries] == [255, 128, 64, 32, 16, 8, 4, 2, 1]
    assert {(c.extra["rank"], c.algo) for c in plan.configs} == {(1, 0), (0, 1)}


def test_a_plan_is_an_ordinary_legacy_plan_marked_untimed(fake):
    fake({"FMA": [row(1, "FMA")]}, lambda mb, algo, math: mb * KiB)
    plan = heuristic_plan(P255, "backward_filter", 64 * KiB, "powerOfTwo", "strict", name="conv1/backward_filter")
    assert plan.name == "conv1/backward_filter" and plan.op == "backward_filter" and plan.problem == P255
    assert divisions(plan) == [(64, 1, "FMA")] * 3 + [(mb, 1, "FMA") for mb in (32, 16, 8, 4, 2, 1)]
    for c in plan.configs:
        assert c.source == "legacy" and c.engine is None
        assert c.time_ms == UNTIMED_MS and c.extra == {"timed": "heuristic", "rank": 0, "deterministic": True}
    validate(Plan("wr", "powerOfTwo", [plan]).to_dict(), "ucudnn-plan/1")   # the formats take the placeholder
    assert heuristic_plan(P255, "forward", 1 << 30, "powerOfTwo", "strict").name == "forward"


def test_a_size_that_fits_at_once_is_the_only_one_asked(fake):
    f = fake({"FMA": [row(1, "FMA")]}, lambda mb, algo, math: 0)
    plan = heuristic_plan(P255, "forward", 0, "powerOfTwo", "strict")
    assert divisions(plan) == [(255, 1, "FMA")]
    assert f.queries == [(255, "FMA")]


def test_failed_disallowed_and_non_deterministic_rows_are_dropped(fake):
    rankings = {"FMA": [row(7, "FMA", status=3000), row(6, "TENSOR_OP"), row(5, "FMA", deterministic=False),
                        row(4, "FMA")]}
    fake(rankings, lambda mb, algo, math: 0)
    assert divisions(heuristic_plan(P255, "forward", 0, "powerOfTwo", "strict")) == [(255, 5, "FMA")]
    assert divisions(heuristic_plan(P255, "forward", 0, "powerOfTwo", "strict-deterministic")) == [(255, 4, "FMA")]


def test_each_allowed_math_type_is_asked_and_tensor_op_rankings_come_first(fake):
    rankings = {"FMA": [row(1, "FMA")], "DEFAULT": [row(3, "DEFAULT")], "TENSOR_OP": [row(2, "TENSOR_OP")],
                "TENSOR_OP_ALLOW_CONVERSION": [row(9, "TENSOR_OP_ALLOW_CONVERSION")]}
    f = fake(rankings, lambda mb, algo, math: 0)
    assert divisions(heuristic_plan(P255, "forward", 0, "powerOfTwo", "tf32")) == [(255, 2, "TENSOR_OP")]
    assert [m for _, m in f.queries] == ["TENSOR_OP", "DEFAULT", "FMA"]
    f.queries.clear()
    assert divisions(heuristic_plan(P255, "forward", 0, "powerOfTwo", None)) == [(255, 1, "FMA")]   # strict
    assert [m for _, m in f.queries] == ["FMA"]
    half = ConvProblem(8, 3, 9, 9, 8, 3, 3, dtype="float16", layout="NHWC")
    f.queries.clear()
    assert divisions(heuristic_plan(half, "forward", 0, "powerOfTwo", None)) == [(8, 2, "TENSOR_OP")]   # default
    assert [m for _, m in f.queries] == ["TENSOR_OP", "DEFAULT", "TENSOR_OP_ALLOW_CONVERSION"]


def test_rankings_interleave_rank_by_rank_and_repeats_count_once(fake):
    rankings = {"TENSOR_OP": [row(2, "TENSOR_OP"), row(1, "FMA"), row(0, "TENSOR_OP")],
                "DEFAULT": [row(3, "DEFAULT")], "FMA": [row(1, "FMA"), row(4, "FMA")]}
    fake(rankings, lambda mb, algo, math: 0 if algo == 0 else 100)
    plan = heuristic_plan(P255.with_batch(4), "forward", 0, "undivided", "tf32")
    # rank 0: 2/TENSOR_OP, 3/DEFAULT, 1/FMA; rank 1: 1/FMA again (dropped), 4/FMA; rank 2: 0/TENSOR_OP
    assert divisions(plan) == [(4, 0, "TENSOR_OP")] and plan.configs[0].extra["rank"] == 4


def test_the_workspace_is_what_cudnn_sizes_not_the_heuristics_figure(fake):
    # the heuristic says 0 bytes for algo 1, which cuDNN sizes at 1 KiB a sample; algo 2 it cannot size at all
    fake({"FMA": [row(2, "FMA"), row(1, "FMA", memory=0)]}, lambda mb, algo, math: {1: mb * KiB}.get(algo))
    plan = heuristic_plan(P255, "forward", 200 * KiB, "powerOfTwo", "strict")
    assert divisions(plan) == [(mb, 1, "FMA") for mb in (128, 64, 32, 16, 8, 4, 2, 1)]
    assert [c.workspace_bytes for c in plan.configs] == [c.micro_batch * KiB for c in plan.configs]
    # and one the heuristic overstates is sized as cuDNN sizes it
    fake({"FMA": [row(0, "FMA", memory=1 << 40)]}, lambda mb, algo, math: 0)
    assert divisions(heuristic_plan(P255, "forward", 0, "powerOfTwo", "strict")) == [(255, 0, "FMA")]


def test_no_fitting_candidate_names_the_smallest_limit_that_works(fake):
    fake({"FMA": [row(1, "FMA"), row(0, "FMA")]}, lambda mb, algo, math: mb * (KiB if algo == 1 else 100))
    with pytest.raises(InfeasibleError, match="smallest limit that works is") as e:
        heuristic_plan(P255, "forward", 99, "powerOfTwo", "strict", name="c/forward")
    assert e.value.min_workspace == 100 and e.value.kernel == "c/forward"       # 255 single samples on algo 0
    with pytest.raises(InfeasibleError) as e:
        heuristic_plan(P255, "forward", 99, "undivided", "strict")
    assert e.value.min_workspace == 25_500


def test_no_usable_candidate_at_any_limit_is_infeasible_with_no_limit(fake):
    fake({"FMA": [row(1, "FMA", status=3000)], "TENSOR_OP": [row(2, "TENSOR_OP")]}, lambda mb, algo, math: 0)
    with pytest.raises(InfeasibleError, match="no measured configuration covers") as e:
        heuristic_plan(P255, "forward", 1 << 30, "powerOfTwo", "strict")
    assert e.value.min_workspace is None


def test_a_math_type_whose_query_fails_is_skipped_and_all_failing_raises(fake, monkeypatch):
    f = fake({"FMA": [row(1, "FMA")]}, lambda mb, algo, math: 0)

    def refuse_tensor_op(h, op, a, b, conv, out, requested):
        if conv[1] != "FMA":
            raise CudnnError("cudnnGetConvolutionForwardAlgorithm_v7", 3000, "CUDNN_STATUS_NOT_SUPPORTED")
        return f.get_algorithm_v7(h, op, a, b, conv, out, requested)

    monkeypatch.setattr(cudnn, "get_algorithm_v7", refuse_tensor_op)
    assert divisions(heuristic_plan(P255, "forward", 0, "powerOfTwo", "tf32")) == [(255, 1, "FMA")]
    monkeypatch.setattr(cudnn, "get_algorithm_v7", lambda *a: refuse_tensor_op(*a[:3], a[3], (0, "X"), *a[5:]))
    with pytest.raises(CudnnError, match="Algorithm_v7"):
        heuristic_plan(P255, "forward", 0, "powerOfTwo", "tf32")


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 40), policy=st.sampled_from(POLICIES), per_sample=st.lists(st.integers(0, 50), min_size=1,
                                                                                   max_size=3),
       fixed=st.integers(0, 200), limit=st.integers(0, 400))
def test_heuristic_plans_fit_and_sum_or_name_the_smallest_limit(n, policy, per_sample, fixed, limit):
    """Against brute force: algo i needs ``fixed + per_sample[i] * mb`` bytes (ranked in list order)."""
    def need(mb, algo, math):
        return fixed + per_sample[algo] * mb

    sizes = micro_batch_sizes(policy, n)
    with pytest.MonkeyPatch.context() as mp:
        FakeCudnn({"FMA": [row(i, "FMA") for i in range(len(per_sample))]}, need).install(mp)
        problem = P255.with_batch(n)
        try:
            plan = heuristic_plan(problem, "forward", limit, policy, "strict")
        except InfeasibleError as e:
            least = {mb: min(need(mb, a, "FMA") for a in range(len(per_sample))) for mb in sizes}
            works = [L for L in sorted(set(least.values())) if coverable(n, [mb for mb in sizes if least[mb] <= L])]
            assert not works or works[0] > limit
            assert e.min_workspace == (works[0] if works else None)
            return
    assert plan.batch == n and plan.workspace_bytes <= limit
    for c in plan.configs:   # the best-ranked candidate that fits, at its size
        assert c.algo == min(a for a in range(len(per_sample)) if need(c.micro_batch, a, "FMA") <= limit)


# --- the binding's v7 wrapper, over a fake library ------------------------------------------------------------
def test_get_algorithm_v7_calls_the_ops_symbol_and_keeps_cudnns_order(monkeypatch):
    calls = []

    def v7(handle, a, b, conv, out, requested, got, perf):
        calls.append((handle, a, b, conv, out, requested))
        for i, (algo, math, status) in enumerate([(1, 1, 0), (0, 3, 0), (4, 0, 3000)]):
            perf[i].algo, perf[i].mathType, perf[i].status = algo, math, status
            perf[i].time, perf[i].memory, perf[i].determinism = -1.0, 4096 * i, cudnn.DETERMINISTIC
        got._obj.value = 3
        return 0

    class Lib:
        cudnnGetConvolutionBackwardDataAlgorithm_v7 = staticmethod(v7)

        @staticmethod
        def cudnnGetErrorString(status):
            return b"CUDNN_STATUS_NOT_SUPPORTED"

    monkeypatch.setattr(cudnn, "_lib", Lib())
    rows = cudnn.get_algorithm_v7(11, "backward_data", 21, 22, 23, 24, 8)
    assert calls == [(11, 21, 22, 23, 24, 8)]
    assert [(r.algo, r.math_type, r.status_name) for r in rows] == [
        (1, "TENSOR_OP", "CUDNN_STATUS_SUCCESS"), (0, "FMA", "CUDNN_STATUS_SUCCESS"),
        (4, "DEFAULT", "CUDNN_STATUS_NOT_SUPPORTED")]
    assert [r.time_ms for r in rows] == [-1.0] * 3 and [r.workspace_bytes for r in rows] == [0, 4096, 8192]
    assert all(r.deterministic for r in rows)


def test_the_v7_symbols_are_declared_like_find_minus_the_buffers():
    for suffix in ("Forward", "BackwardData", "BackwardFilter"):
        argtypes = cudnn._SIGNATURES[f"cudnnGetConvolution{suffix}Algorithm_v7"]
        assert argtypes == [ctypes.c_void_p] * 5 + [ctypes.c_int, ctypes.POINTER(ctypes.c_int),
                                                    ctypes.POINTER(cudnn.AlgoPerf)]
