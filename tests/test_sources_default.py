"""Issue 16: algorithm sources everywhere, with good defaults; heuristic mode; progress on long benchmarks.

What the library measures with is part of every cache key, the default is the fastest exact set the installed
extras allow, and a first call in ``UCUDNN_BENCHMARK=heuristic`` mode runs at once while the benchmark happens
in the background.  Runs without a GPU: the GPU-facing pieces are replaced by fakes that record what they were
asked.
"""
from __future__ import annotations

import contextlib
import io
import re
import threading
import time
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ucudnn import source_names
from ucudnn.errors import InputError
from ucudnn.planning.plan import KernelPlan, MicroConfig
from ucudnn.planning.table import BenchmarkTable, KernelBench, Measurement
from ucudnn.problem import ConvProblem

PROBLEM = ConvProblem(8, 16, 12, 12, 32, 3, 3, pad=1)
H100, CUDNN = "NVIDIA H100 80GB HBM3", 91900


# -- names ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("written, canonical", [
    ("legacy", ("legacy",)),
    ("graph,legacy", ("legacy", "graph")),
    (" legacy , graph ,", ("legacy", "graph")),
    (["fold", "graph", "legacy"], ("legacy", "graph", "fold")),
    ("fold,relayout,legacy,legacy", ("legacy", "relayout", "fold")),
])
def test_equal_requests_have_one_canonical_spelling(written, canonical):
    assert source_names.canonical(written) == canonical


@pytest.mark.parametrize("written, message", [("legacy,cufft", "unknown algorithm source 'cufft'; known: depthwise, direct, fft, fold, graph, legacy, mec"),
                                              ("", "name at least one algorithm source"),
                                              (",,", "name at least one algorithm source")])
def test_bad_source_names_name_the_field(written, message):
    with pytest.raises(InputError, match=re.escape(message)) as e:
        source_names.canonical(written, "--sources")
    assert e.value.field == "--sources"


def test_the_default_is_legacy_graph_depthwise_and_fold_where_the_frontend_is_installed(monkeypatch):
    monkeypatch.delenv("UCUDNN_SOURCES", raising=False)
    monkeypatch.setattr(source_names, "graph_installed", lambda: True)
    assert source_names.canonical(None) == ("legacy", "graph", "depthwise", "fold")
    monkeypatch.setattr(source_names, "graph_installed", lambda: False)
    assert source_names.canonical(None) == ("legacy", "depthwise", "fold")


def test_a_request_naming_direct_measures_the_depthwise_rows_once_as_direct():
    assert source_names.canonical("legacy,depthwise,direct") == ("legacy", "direct")
    assert source_names.canonical("depthwise,legacy") == ("legacy", "depthwise")


DEPTHWISE = ConvProblem(8, 96, 56, 56, 96, 7, 7, pad=3, groups=96, layout="NHWC")


@pytest.mark.parametrize("problem", [PROBLEM, ConvProblem(8, 96, 56, 56, 192, 3, 3, pad=1, groups=96),
                                     ConvProblem(8, 1, 28, 28, 16, 3, 3, pad=1)])
def test_a_layer_the_depthwise_source_cannot_measure_keeps_the_key_it_had_without_it(problem):
    """Adding depthwise to the default kept every cached plan and bundle entry of the layers it declines."""
    for op in ("forward", "backward_data", "backward_filter"):
        assert source_names.key_field(("legacy", "graph", "depthwise", "fold"), op, problem) == "legacy,graph,fold"
        assert source_names.key_field(("legacy", "depthwise"), op, problem) is None      # legacy alone: no field
    assert source_names.key_field(("legacy", "graph", "depthwise", "fold"), "forward", DEPTHWISE) == \
        "legacy,graph,depthwise,fold"
    assert source_names.effective(("legacy", "depthwise"), "forward", DEPTHWISE) == ("legacy", "depthwise")


def test_every_layer_the_depthwise_source_measures_keeps_it_in_its_key():
    """The key's test is a superset of the kernels' own: a layer they run never shares a key with a measurement
    made without them (a single channel with one filter included)."""
    from ucudnn.measure.sources.direct import depthwise_refusal

    for c, k, groups, r, layout in [(96, 96, 96, 7, "NHWC"), (32, 32, 32, 3, "NCHW"), (1, 1, 1, 3, "NHWC"),
                                    (1, 1, 1, 5, "NCHW"), (6, 6, 6, 5, "NHWC")]:
        p = ConvProblem(4, c, 9, 9, k, r, r, pad=r // 2, groups=groups, layout=layout)
        for op in ("forward", "backward_data", "backward_filter"):
            assert depthwise_refusal(op, p) is None
            assert "depthwise" in source_names.effective(("legacy", "depthwise"), op, p)


def test_UCUDNN_SOURCES_sets_the_default_and_is_checked(monkeypatch):
    monkeypatch.setenv("UCUDNN_SOURCES", "graph,legacy,relayout")
    assert source_names.default_names() == ("legacy", "graph", "relayout")
    monkeypatch.setenv("UCUDNN_SOURCES", "legacy,nope")
    with pytest.raises(InputError) as e:
        source_names.default_names()
    assert e.value.field == "UCUDNN_SOURCES"


def test_legacy_alone_keeps_the_keys_written_before_sources_joined_them():
    assert source_names.key_field(("legacy",)) is None
    assert source_names.key_field(("legacy", "graph", "fold")) == "legacy,graph,fold"


# -- the library's cache key and lookups ------------------------------------------------------------------------
@pytest.fixture
def fake_gpu(monkeypatch):
    """ucudnn.api on a pretend GPU: benchmarks are fakes that record their sources; no store, no server."""
    import ucudnn.api as api

    monkeypatch.setattr(api._Background, "START_DELAY_S", 0.05)

    calls: list[tuple] = []

    def benchmark(kernels, bp, nm, sources=None):
        calls.append((kernels[0].op, tuple(sources)))
        k = kernels[0]
        ms = [Measurement(mb, 1, "FMA", 1.0 * mb, 0) for mb in (1, 2, 4, 8)]
        return BenchmarkTable(H100, CUDNN, [KernelBench(k.name, k.op, k.problem, ms)], nm)

    class Device(contextlib.nullcontext):
        id = 0

    fake_cupy = SimpleNamespace(cuda=SimpleNamespace(Device=lambda *a: Device(),
                                                     Stream=lambda **kw: contextlib.nullcontext()))
    monkeypatch.setattr(api, "benchmark", benchmark)
    monkeypatch.setattr(api, "device_name", lambda: H100)
    monkeypatch.setattr(api.cudnn, "get_version", lambda: CUDNN)
    monkeypatch.setattr(api, "_store", None)
    monkeypatch.setattr(api, "_store_failed", True)
    monkeypatch.setattr(api, "_plans", {})
    monkeypatch.setattr(api, "_executors", {})
    monkeypatch.setattr(api, "cupy", lambda: fake_cupy)
    monkeypatch.delenv("UCUDNN_PLAN_SERVER", raising=False)
    monkeypatch.delenv("UCUDNN_BUNDLE_PATH", raising=False)
    monkeypatch.delenv("UCUDNN_SOURCES", raising=False)
    monkeypatch.delenv("UCUDNN_BENCHMARK", raising=False)
    api.calls = calls
    return api


def test_the_cache_key_names_the_sources_except_legacy_alone(fake_gpu):
    api = fake_gpu
    legacy = api._cache_key(PROBLEM, "forward", "strict", "powerOfTwo", sources=("legacy",))
    both = api._cache_key(PROBLEM, "forward", "strict", "powerOfTwo", sources=("legacy", "graph"))
    assert "sources" not in legacy and both["sources"] == "legacy,graph"
    assert {k: v for k, v in both.items() if k != "sources"} == legacy


def test_the_sources_asked_for_are_the_sources_benchmarked(fake_gpu):
    api = fake_gpu
    api._plan_from_store_or_bench(PROBLEM, "forward", 64 << 20, "powerOfTwo", "strict", "graph, legacy")
    api._plan_from_store_or_bench(PROBLEM, "forward", 64 << 20, "powerOfTwo", "strict", ["legacy"])
    # a different spelling of a set already measured is an in-process hit, not a second benchmark
    api._plan_from_store_or_bench(PROBLEM, "forward", 64 << 20, "powerOfTwo", "strict", "legacy,graph")
    assert api.calls == [("forward", ("legacy", "graph")), ("forward", ("legacy",))]


def test_no_sources_means_the_default_sources(fake_gpu, monkeypatch):
    api = fake_gpu
    monkeypatch.setattr(source_names, "graph_installed", lambda: True)
    api._plan_from_store_or_bench(PROBLEM, "forward", 64 << 20, "powerOfTwo", "strict")
    monkeypatch.setenv("UCUDNN_SOURCES", "legacy")
    api._plan_from_store_or_bench(PROBLEM, "backward_data", 64 << 20, "powerOfTwo", "strict")
    assert api.calls == [("forward", ("legacy", "graph", "depthwise", "fold")), ("backward_data", ("legacy",))]


def test_conv2d_layer_checks_its_sources_when_made():
    import ucudnn

    with pytest.raises(InputError) as e:
        ucudnn.Conv2d(sources="legacy,cufft")
    assert e.value.field == "sources"
    assert ucudnn.Conv2d(sources=["graph", "legacy"]).kw["sources"] == "legacy,graph"


# -- heuristic mode ---------------------------------------------------------------------------------------------
def _heuristic(problem, op, limit, bp, nm, name=None):
    return KernelPlan(op, op, problem, [MicroConfig(problem.n, 0, "FMA", 1.0, 0, extra={"timed": "heuristic"})])


def test_heuristic_mode_runs_at_once_and_benchmarks_in_the_background(fake_gpu, monkeypatch):
    api = fake_gpu
    import ucudnn.measure.heuristic as heuristic

    release = threading.Event()
    real = api.benchmark

    def slow_benchmark(*a, **kw):
        release.wait(10)
        return real(*a, **kw)

    monkeypatch.setattr(api, "benchmark", slow_benchmark)
    monkeypatch.setattr(heuristic, "heuristic_plan", _heuristic)
    monkeypatch.setenv("UCUDNN_BENCHMARK", "heuristic")
    monkeypatch.setattr(api, "Executor", lambda plan, replay=False: SimpleNamespace(plan=plan, replay=replay))
    t0 = time.perf_counter()
    ex = api._executor(PROBLEM, "forward", "64MiB", "powerOfTwo", "strict", sources="legacy")
    assert time.perf_counter() - t0 < 1.0
    assert ex.plan.configs[0].extra["timed"] == "heuristic"        # cuDNN's choice, not a measurement
    assert api._executor(PROBLEM, "forward", "64MiB", "powerOfTwo", "strict", sources="legacy") is ex
    assert not api.wait_for_benchmarks(timeout=0.05)                 # still benchmarking
    release.set()
    assert api.wait_for_benchmarks(timeout=10)
    measured = api._executor(PROBLEM, "forward", "64MiB", "powerOfTwo", "strict", sources="legacy")
    assert measured is not ex and "timed" not in measured.plan.configs[0].extra
    assert api.calls == [("forward", ("legacy",))]                   # once, in the background


def test_background_benchmarks_wait_until_first_calls_stop_coming(fake_gpu, monkeypatch):
    """A model's first forward pass submits a kernel per layer: no benchmark competes with it for the GPU."""
    api = fake_gpu
    import ucudnn.measure.heuristic as heuristic

    started: list[float] = []
    real = api.benchmark
    monkeypatch.setattr(api, "benchmark", lambda *a, **kw: started.append(time.monotonic()) or real(*a, **kw))
    monkeypatch.setattr(heuristic, "heuristic_plan", _heuristic)
    monkeypatch.setattr(api._Background, "START_DELAY_S", 0.3)
    monkeypatch.setenv("UCUDNN_BENCHMARK", "heuristic")
    monkeypatch.setattr(api, "Executor", lambda plan, replay=False: SimpleNamespace(plan=plan, replay=replay))
    for n in (8, 16, 32):            # three layers' first calls, 0.1 s apart
        api._executor(PROBLEM.with_batch(n), "forward", "64MiB", "powerOfTwo", "strict", sources="legacy")
        last = time.monotonic()
        time.sleep(0.1)
    assert api.wait_for_benchmarks(timeout=10) and len(started) == 3
    assert min(started) >= last + 0.3


def test_heuristic_mode_uses_a_cached_plan_when_there_is_one(fake_gpu, monkeypatch):
    api = fake_gpu
    import ucudnn.measure.heuristic as heuristic

    api._plan_from_store_or_bench(PROBLEM, "forward", 64 << 20, "powerOfTwo", "strict", "legacy")
    monkeypatch.setattr(heuristic, "heuristic_plan", _heuristic)
    monkeypatch.setenv("UCUDNN_BENCHMARK", "heuristic")
    kp = api._plan_from_store_or_bench(PROBLEM, "forward", 64 << 20, "powerOfTwo", "strict", "legacy")
    assert "timed" not in kp.configs[0].extra and len(api.calls) == 1


def test_a_failed_background_benchmark_keeps_the_heuristic_plan(fake_gpu, monkeypatch, caplog):
    api = fake_gpu
    import ucudnn.measure.heuristic as heuristic

    def broken(*a, **kw):
        raise RuntimeError("cudnnFind exploded")

    monkeypatch.setattr(api, "benchmark", broken)
    monkeypatch.setattr(heuristic, "heuristic_plan", _heuristic)
    monkeypatch.setenv("UCUDNN_BENCHMARK", "heuristic")
    monkeypatch.setattr(api, "Executor", lambda plan, replay=False: SimpleNamespace(plan=plan, replay=replay))
    ex = api._executor(PROBLEM, "forward", "64MiB", "powerOfTwo", "strict", sources="legacy")
    assert api.wait_for_benchmarks(timeout=10)
    assert api._executor(PROBLEM, "forward", "64MiB", "powerOfTwo", "strict", sources="legacy") is ex
    assert "cudnnFind exploded" in caplog.text and "heuristic plan stays" in caplog.text


def test_each_background_benchmark_tells_its_listeners_when_it_ends(fake_gpu, monkeypatch, caplog):
    """Measured or failed, a background benchmark calls every listener once (the torch layer marks the
    benchmark's buffers there); a listener that raises is logged and stops neither the others nor the benchmarks."""
    api = fake_gpu
    import ucudnn.measure.heuristic as heuristic

    heard: list[str] = []

    def broken_listener():
        raise RuntimeError("listener exploded")

    monkeypatch.setattr(api, "after_background_benchmark", [broken_listener, lambda: heard.append("ended")])
    monkeypatch.setattr(heuristic, "heuristic_plan", _heuristic)
    monkeypatch.setenv("UCUDNN_BENCHMARK", "heuristic")
    monkeypatch.setattr(api, "Executor", lambda plan, replay=False: SimpleNamespace(plan=plan, replay=replay))
    api._executor(PROBLEM, "forward", "64MiB", "powerOfTwo", "strict", sources="legacy")
    assert api.wait_for_benchmarks(timeout=10)
    assert heard == ["ended"] and "listener exploded" in caplog.text

    def broken(*a, **kw):
        raise RuntimeError("cudnnFind exploded")

    monkeypatch.setattr(api, "benchmark", broken)
    api._executor(PROBLEM, "backward_data", "64MiB", "powerOfTwo", "strict", sources="legacy")
    assert api.wait_for_benchmarks(timeout=10)
    assert heard == ["ended", "ended"]


def test_UCUDNN_BENCHMARK_is_checked(monkeypatch):
    from ucudnn import config

    monkeypatch.setenv("UCUDNN_BENCHMARK", "Heuristic")
    assert config.benchmark_mode() == "heuristic"
    monkeypatch.setenv("UCUDNN_BENCHMARK", "sometimes")
    with pytest.raises(InputError) as e:
        config.benchmark_mode()
    assert e.value.field == "UCUDNN_BENCHMARK"


# -- progress -------------------------------------------------------------------------------------------------------
def _progress_output(monkeypatch, enabled, seconds: float, after: float = 0.05) -> str:
    import rich.console

    from ucudnn.measure import benchmarking

    buf = io.StringIO()
    real = rich.console.Console
    monkeypatch.setattr(rich.console, "Console", lambda **kw: real(file=buf, force_terminal=False, width=200))
    monkeypatch.setattr(benchmarking, "PROGRESS_AFTER_S", after)
    monkeypatch.delenv("UCUDNN_PROGRESS", raising=False)
    bar = benchmarking._progress(enabled, 4)
    bar.advance(1, "conv1/forward")
    time.sleep(seconds)
    bar.advance(1, "conv2/forward")
    bar.close()
    return buf.getvalue()


def test_a_benchmark_longer_than_the_delay_says_so_on_stderr(monkeypatch):
    out = _progress_output(monkeypatch, None, 0.3)
    assert "ucudnn: 1/4 micro-batch sizes measured" in out and "(conv1/forward)" in out
    assert "2/4 micro-batch sizes measured" in out and out.rstrip().endswith("done")


def test_a_quick_benchmark_stays_quiet(monkeypatch):
    assert _progress_output(monkeypatch, None, 0.0, after=5.0) == ""
    assert _progress_output(monkeypatch, False, 0.3) == ""


# -- the default graph source's top-k, replayed on recorded tables ------------------------------------------------
def _top_k(table: BenchmarkTable, k: int) -> BenchmarkTable:
    """``table`` as a graph source with ``top_k=k`` would have recorded it: per kernel and micro-batch, the k
    graph configurations first in cuDNN's heuristic order (every legacy row kept)."""
    kernels = []
    for kb in table.kernels:
        graph = sorted((m for m in kb.measurements if m.source == "graph"), key=lambda m: m.extra["heuristic_rank"])
        kept = [m for m in kb.measurements if m.source != "graph"]
        for mb in {m.micro_batch for m in graph}:
            kept += [m for m in graph if m.micro_batch == mb][:k]
        kernels.append(KernelBench(kb.name, kb.op, kb.problem, kept, kb.skipped, kb.benchmark_seconds))
    return BenchmarkTable(table.device, table.cudnn_version, kernels, table.numerics, dict(table.extra))


@pytest.mark.parametrize("fixture", ["alexnet-b256-float32-NHWC-strict-legacy-graph-h100.json.gz",
                                     "alexnet-b256-float32-NHWC-tf32-legacy-graph-fold-h100.json.gz",
                                     "alexnet-b256-float32-NCHW-tf32-legacy-graph-fold-h100.json.gz"])
def test_the_default_graph_top_k_plans_as_well_as_every_configuration(fixtures, fixture):
    from ucudnn.measure.sources.registry import DEFAULT_GRAPH_TOP_K
    from ucudnn.planning.planner import plan

    table = BenchmarkTable.load(fixtures / fixture)
    full = plan(table, "wr", workspace_limit=64 << 20).total_time_ms
    assert plan(_top_k(table, DEFAULT_GRAPH_TOP_K), "wr", workspace_limit=64 << 20).total_time_ms <= full * 1.001


def test_no_background_benchmark_starts_once_the_interpreter_is_exiting(fake_gpu, monkeypatch):
    api = fake_gpu
    import ucudnn.measure.heuristic as heuristic

    monkeypatch.setattr(api, "_background", api._Background())
    monkeypatch.setattr(heuristic, "heuristic_plan", _heuristic)
    monkeypatch.setenv("UCUDNN_BENCHMARK", "heuristic")
    api._background.stop()                    # what atexit does
    api._plan_from_store_or_bench(PROBLEM, "forward", 64 << 20, "powerOfTwo", "strict", "legacy")
    assert api.wait_for_benchmarks(timeout=10) and api.calls == []


def test_the_channel_policy_comes_from_the_environment_and_joins_the_key_only_when_set(fake_gpu, monkeypatch):
    from ucudnn import config

    api = fake_gpu
    monkeypatch.delenv("UCUDNN_CHANNEL_POLICY", raising=False)
    plain = api._cache_key(PROBLEM, "forward", "strict", "powerOfTwo", sources=("legacy",))
    assert config.channel_policy() == "none" and "channel_policy" not in plain   # keys written before stay valid
    monkeypatch.setenv("UCUDNN_CHANNEL_POLICY", "Halves")
    sliced = api._cache_key(PROBLEM, "forward", "strict", "powerOfTwo", sources=("legacy",))
    assert sliced["channel_policy"] == "halves" and {k: v for k, v in sliced.items() if k != "channel_policy"} == plain
    monkeypatch.setenv("UCUDNN_CHANNEL_POLICY", "thirds")
    with pytest.raises(InputError) as e:
        config.channel_policy()
    assert e.value.field == "UCUDNN_CHANNEL_POLICY"


def test_a_changed_channel_policy_is_a_new_executor_not_the_cached_one(fake_gpu, monkeypatch):
    api = fake_gpu
    monkeypatch.delenv("UCUDNN_CHANNEL_POLICY", raising=False)
    monkeypatch.setattr(api, "Executor", lambda plan, replay=False: ("executor", plan.configs[0].micro_batch))
    api._executor(PROBLEM, "forward", 64 << 20, "powerOfTwo", "strict", sources="legacy")
    monkeypatch.setenv("UCUDNN_CHANNEL_POLICY", "halves")
    api._executor(PROBLEM, "forward", 64 << 20, "powerOfTwo", "strict", sources="legacy")
    assert [c for c in api.calls if c[0] == "forward"] == [("forward", ("legacy",))] * 2   # benchmarked again


def test_a_plan_that_may_borrow_unwritten_output_has_a_key_of_its_own_and_heuristic_mode_replaces_it_too(
        fake_gpu, monkeypatch):
    """``unwritten=True`` (a caller that runs with beta 0, or brings dx) is part of the executor's key and of the
    plan's cache key (left out when False, so keys written before it still answer); the measurement key is
    shared.  Heuristic mode's background benchmark replaces such an executor like any other."""
    api = fake_gpu
    import ucudnn.measure.heuristic as heuristic

    plain_key = api._cache_key(PROBLEM, "forward", "strict", "powerOfTwo", 64 << 20, ("legacy",))
    key = api._cache_key(PROBLEM, "forward", "strict", "powerOfTwo", 64 << 20, ("legacy",), unwritten=True)
    assert "unwritten" not in plain_key and key == {**plain_key, "unwritten": True}
    assert "unwritten" not in api._cache_key(PROBLEM, "forward", "strict", "powerOfTwo", unwritten=True)
    monkeypatch.setattr(heuristic, "heuristic_plan", _heuristic)
    monkeypatch.setenv("UCUDNN_BENCHMARK", "heuristic")
    monkeypatch.setattr(api, "Executor", lambda plan, replay=False: SimpleNamespace(plan=plan, replay=replay))
    plain = api._executor(PROBLEM, "forward", "64MiB", "powerOfTwo", "strict", sources="legacy")
    borrowing = api._executor(PROBLEM, "forward", "64MiB", "powerOfTwo", "strict", sources="legacy", unwritten=True)
    assert borrowing is not plain
    assert api.wait_for_benchmarks(timeout=10)
    measured = api._executor(PROBLEM, "forward", "64MiB", "powerOfTwo", "strict", sources="legacy", unwritten=True)
    assert measured is not borrowing and "timed" not in measured.plan.configs[0].extra


@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 3), st.sampled_from([1, 2, 3, 5, 7]),
       st.sampled_from([(1, 1), (2, 2)]), st.sampled_from(["NCHW", "NHWC"]), st.sampled_from(["float32", "float16"]),
       st.booleans(), st.sampled_from(["forward", "backward_data", "backward_filter"]))
@settings(max_examples=300, deadline=None)
def test_no_layer_the_depthwise_kernels_run_is_left_out_of_its_key(groups, cm, km, r, stride, layout, dtype,
                                                                   half_pad, op):
    """Over grouped layers of every kind: wherever the depthwise kernels run an op, its key names the source."""
    from ucudnn.measure.sources.direct import depthwise_refusal

    p = ConvProblem(3, groups * cm, 9, 10, groups * km, r, r, pad=r // 2 if half_pad else 0, stride=stride,
                    groups=groups, dtype=dtype, layout=layout)
    if depthwise_refusal(op, p) is None:
        assert "depthwise" in source_names.effective(("legacy", "depthwise"), op, p)
