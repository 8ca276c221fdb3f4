"""ucudnn.torch on CPU with the GPU parts faked: a layer's settings (its sources included) reach the executor
lookup, and ``ucudnn.torch.plan(..., bundle=...)`` writes bundles whose plans the lookup chain finds.

What is faked: ``ucudnn.api._executor`` (records its arguments, plans through the real lookup chain with made-up
measurements), the device name and cuDNN version, CuPy's device context, and for WD the benchmark and the
arena.  Layers run on CPU tensors as if they were on the GPU (``runtime.runs_here``); ucudnn's launch then
declines (``GpuUnavailable``) and torch computes the result, as it does for any fallback.
"""
from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import ucudnn.api as api  # noqa: E402
import ucudnn.execute  # noqa: E402
import ucudnn.measure  # noqa: E402
import ucudnn.torch as ut  # noqa: E402
from ucudnn import config  # noqa: E402
from ucudnn.catalog import lookup  # noqa: E402
from ucudnn.catalog.bundle import BundleReader, list_plans  # noqa: E402
from ucudnn.errors import GpuUnavailable  # noqa: E402
from ucudnn.planning.table import BenchmarkTable, KernelBench, Measurement  # noqa: E402
from ucudnn.policy import micro_batch_sizes  # noqa: E402
from ucudnn.torch import modules, planning, runtime  # noqa: E402

DEVICE, CUDNN = "NVIDIA H100 80GB HBM3", 91900
MiB = 1 << 20


def measured(problem, op, name=None) -> KernelBench:
    """Made-up measurements: a slow algorithm without workspace, a fast one needing 1 MiB per sample."""
    ms = []
    for b in micro_batch_sizes("powerOfTwo", problem.n):
        ms += [Measurement(b, 0, "FMA", 1.0 * b + 0.05, 0), Measurement(b, 1, "FMA", 0.2 * b + 0.05, b * MiB)]
    return KernelBench(name or op, op, problem, ms)


@pytest.fixture
def gpu(monkeypatch):
    """A pretend GPU; ``gpu.calls`` are the executor lookups, ``gpu.benchmarks`` the WD benchmark calls."""
    calls: list[dict] = []
    benchmarks: list[dict] = []

    def executor(problem, op, workspace_limit, batch_policy, numerics, replay=False, sources=None, unwritten=False):
        calls.append({"problem": problem, "op": op, "workspace_limit": workspace_limit,
                      "batch_policy": batch_policy, "numerics": numerics, "replay": replay, "sources": sources,
                      "unwritten": unwritten})
        plan = api._plan_from_store_or_bench(problem, op, workspace_limit, batch_policy or config.batch_policy(),
                                             numerics, sources, unwritten)     # the real lookup chain and keys
        return SimpleNamespace(plan=plan, workspace_bytes=plan.workspace_bytes)

    def launch(op, problem, a, b, out, settings, numerics, unwritten=None):
        runtime.executor(problem, op, settings, numerics, 0)
        raise GpuUnavailable("a pretend GPU runs nothing")

    def benchmark(specs, bp, nm, sources=None, progress=False):
        benchmarks.append({"ops": [s.op for s in specs], "batch_policy": bp, "numerics": nm, "sources": sources})
        return BenchmarkTable(DEVICE, CUDNN, [measured(s.problem, s.op, s.name) for s in specs], nm)

    class Network:   # NetworkExecutor without an arena
        def __init__(self, plan, replay=False):
            self.executors = {k.name: SimpleNamespace(plan=k, workspace_bytes=k.workspace_bytes)
                              for k in plan.kernels}
            self.segments = {k.name: (k.offset or 0, k.workspace_bytes) for k in plan.kernels}
            self.arena = SimpleNamespace(ptr=0)

    monkeypatch.setattr(api, "_executor", executor)
    monkeypatch.setattr(api, "device_name", lambda: DEVICE)
    monkeypatch.setattr(api.cudnn, "get_version", lambda: CUDNN)
    monkeypatch.setattr(api, "_store", None)
    monkeypatch.setattr(api, "_plans", {})
    monkeypatch.setattr(api, "benchmark", benchmark)
    monkeypatch.setattr(ucudnn.measure, "benchmark", benchmark)
    monkeypatch.setattr(ucudnn.execute, "NetworkExecutor", Network)
    monkeypatch.setattr(runtime, "installed", {})
    monkeypatch.setattr(runtime, "runs_here", lambda t: True)
    monkeypatch.setattr(runtime, "launch", launch)
    monkeypatch.setattr(modules.Conv2d, "_unsupported", lambda self, x: None)
    monkeypatch.setattr(planning, "_device_of", lambda model: 0)
    monkeypatch.setattr(planning, "_on_device", lambda index: contextlib.nullcontext())
    return SimpleNamespace(calls=calls, benchmarks=benchmarks)


def elsewhere(monkeypatch, tmp_path, bundle):
    """Another machine with ``bundle`` installed, no benchmarking there; returns the lookups made, as (plan key,
    layer that answered), and a function that starts a fresh process (empty user cache, no plans in memory)."""
    fresh = iter(range(1000))

    def restart():
        monkeypatch.setenv("UCUDNN_DATABASE", str(tmp_path / f"elsewhere-{next(fresh)}.sqlite"))
        monkeypatch.setattr(api, "_store", None)
        monkeypatch.setattr(api, "_plans", {})

    monkeypatch.setenv("UCUDNN_BUNDLE_PATH", str(bundle))
    monkeypatch.setattr(api, "benchmark", lambda *a, **k: pytest.fail("benchmarked instead of using the bundle"))
    found: list[tuple[dict, str]] = []
    real = lookup.kernel_plan

    def spy(plan_key, bench_key, **kw):
        hit = real(plan_key, bench_key, **kw)
        found.append((plan_key, hit.layer))
        return hit

    monkeypatch.setattr(lookup, "kernel_plan", spy)
    return found, restart


# -- sources reach the executor lookup ------------------------------------------------------------------------
def test_a_layers_sources_reach_the_executor_lookup_for_every_op(gpu):
    torch.manual_seed(0)
    m = ut.Conv2d(3, 4, 3, padding=1, sources="legacy")
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    y = m(x)
    y.square().sum().backward()
    assert sorted(c["op"] for c in gpu.calls) == ["backward_data", "backward_filter", "forward"]
    assert {c["sources"] for c in gpu.calls} == {"legacy"}
    xr = x.detach().requires_grad_()
    ref = nn.functional.conv2d(xr, m.weight, m.bias, padding=1)
    torch.testing.assert_close(y, ref)                # torch ran it (the pretend GPU declined): same result
    ref.square().sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)


def test_outputs_not_written_yet_are_offered_to_the_plans_that_can_have_them(gpu, monkeypatch):
    """Forward and backward data plan with their own output's unwritten part (fresh tensors, beta 0); a backward
    filter only where the eager backward hands it the layer's dx first (both gradients wanted), not for a first
    layer (no dx); all of it under ``UCUDNN_UNWRITTEN=1``, none by default."""
    monkeypatch.setenv("UCUDNN_UNWRITTEN", "1")
    torch.manual_seed(0)
    m = ut.Conv2d(3, 4, 3, padding=1, sources="legacy")
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    m(x).square().sum().backward()
    assert {c["op"]: c["unwritten"] for c in gpu.calls} == {
        "forward": True, "backward_data": True, "backward_filter": True}
    gpu.calls.clear()
    m(torch.randn(2, 3, 8, 8)).square().sum().backward()         # a first layer: no dx wanted, none to lend
    assert {c["op"]: c["unwritten"] for c in gpu.calls} == {"forward": True, "backward_filter": False}
    gpu.calls.clear()
    monkeypatch.delenv("UCUDNN_UNWRITTEN")
    m(x).square().sum().backward()
    assert {c["unwritten"] for c in gpu.calls} == {False} and len(gpu.calls) == 3


def test_converted_layers_pass_converts_sources_and_the_default_as_none(gpu):
    model = ut.convert(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Conv2d(4, 4, 1)), sources="graph,legacy")
    model(torch.randn(1, 3, 8, 8))
    assert [c["sources"] for c in gpu.calls] == ["legacy,graph", "legacy,graph"]   # the canonical spelling
    gpu.calls.clear()
    ut.convert(model)                                  # the library's default: no sources named
    model(torch.randn(1, 3, 8, 8))
    assert [c["sources"] for c in gpu.calls] == [None, None]


def test_runtime_executor_passes_sources_by_keyword_and_an_installed_plan_wins(gpu):
    from ucudnn.problem import ConvProblem

    p = ConvProblem(2, 3, 8, 8, 4, 3, 3, (1, 1))
    runtime.executor(p, "forward", runtime.Settings(8 * MiB, "", "legacy,graph", True), "strict", 0)
    assert gpu.calls[-1] == {"problem": p, "op": "forward", "workspace_limit": 8 * MiB, "batch_policy": None,
                             "numerics": "strict", "replay": True, "sources": "legacy,graph", "unwritten": False}
    runtime.installed[(0, p, "forward")] = runtime.Installed("installed")
    assert runtime.executor(p, "forward", runtime.Settings(8 * MiB), "strict", 0) == "installed"
    assert len(gpu.calls) == 1


@pytest.mark.parametrize("policy", ["wr", "wd"])
def test_plan_benchmarks_with_the_sources_it_is_given(gpu, policy):
    model = ut.convert(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 1)))
    ut.plan(model, torch.randn(2, 3, 8, 8), policy, sources="legacy", total_workspace="4MiB")
    assert all(m.sources == "legacy" for _, m in ut.converted(model))
    if policy == "wr":
        assert len(gpu.calls) == 5 and {c["sources"] for c in gpu.calls} == {"legacy"}
    else:
        assert [b["sources"] for b in gpu.benchmarks] == ["legacy"]


# -- bundles written by plan are found by the lookup chain ------------------------------------------------------
def test_trace_names_each_problem_of_a_layer_once():
    conv = ut.Conv2d(4, 4, 3, padding=1)
    model = nn.Sequential(conv)

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = conv

        def forward(self, x):
            return self.conv(x).mean() + self.conv(x[:, :, ::2, ::2]).mean()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(modules.Conv2d, "_unsupported", lambda self, x: None)
        traced = planning.trace(Twice(), torch.randn(2, 4, 8, 8))
        assert [k.name for k in traced] == ["conv", "conv#2"]
        assert [k.problem.h for k in traced] == [8, 4]
        assert [k.name for k in planning.trace(model, torch.randn(2, 4, 8, 8))] == ["0"]


def test_a_wr_bundle_answers_the_lookup_for_each_layers_own_key(gpu, tmp_path, monkeypatch):
    """Two layers of one problem under different limits: each kernel's plan is stored under its own layer's
    key (limit, batch policy, numerics), and the lookup chain finds it there, not measurements alone."""
    model = nn.Sequential(ut.Conv2d(4, 4, 3, padding=1, workspace_limit="1MiB"),
                          ut.Conv2d(4, 4, 3, padding=1, workspace_limit="8MiB", batch_policy="powerOfTwo"))
    path = tmp_path / "model.bundle"
    result = ut.plan(model, torch.randn(8, 4, 8, 8), "wr", bundle=str(path))
    assert [k.name for k in result.kernels] == ["0.forward", "0.backward_filter", "1.forward", "1.backward_data",
                                                "1.backward_filter"]
    traced = {f"{k.name}.{op}": k for k in planning.trace(model, torch.randn(8, 4, 8, 8)) for op in k.ops}

    found, restart = elsewhere(monkeypatch, tmp_path, path)
    reader = BundleReader(path)
    try:
        for kp in result.kernels:
            restart()
            k = traced[kp.name]
            limit = k.module.workspace_limit
            plan = api._plan_from_store_or_bench(k.problem, kp.op, limit, "powerOfTwo", k.numerics,
                                                 k.module.sources or None)
            assert plan.configs == kp.configs and plan.workspace_bytes <= limit
            plan_key, layer = found[-1]
            assert layer == f"bundle:{path}"
            stored = reader.find_plan(plan_key)          # the plan itself, not only its measurements
            assert stored is not None, kp.name
            assert stored[1].kernels[0].configs == kp.configs and stored[1].workspace_limit == limit
    finally:
        reader.close()
    by_limit = {traced[kp.name].module.workspace_limit: kp.workspace_bytes for kp in result.kernels
                if kp.op == "forward"}
    assert by_limit == {MiB: MiB, 8 * MiB: 8 * MiB}     # the two layers' plans differ: both were kept


def test_a_wd_bundle_holds_the_model_plan_under_the_services_key_and_measurements_for_the_lookup(
        gpu, tmp_path, monkeypatch):
    from ucudnn.cluster.precompute import plan_key

    model = ut.convert(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1)))
    path = tmp_path / "model.bundle"
    result = ut.plan(model, torch.randn(8, 3, 8, 8), "wd", total_workspace="6MiB", bundle=str(path))
    assert result.policy == "wd" and result.workspace_bytes <= 6 * MiB
    assert {k.op for k in result.kernels} == {"forward", "backward_data", "backward_filter"}

    [row] = list_plans(path)
    assert (row["policy"], row["total_workspace"], row["kernels"]) == ("wd", 6 * MiB, len(result.kernels))
    reader = BundleReader(path)
    try:
        stored = reader.find_plan(plan_key(row["table"], "wd", "powerOfTwo", 6 * MiB))
        assert stored is not None and [k.name for k in stored[1].kernels] == [k.name for k in result.kernels]
        assert reader.get_table(row["table"]).kernels[0].name == result.kernels[0].name
    finally:
        reader.close()

    # the kernels' measurements answer a converted layer's WR lookup elsewhere, at any limit
    found, restart = elsewhere(monkeypatch, tmp_path, path)
    for kp in result.kernels:
        restart()
        plan = api._plan_from_store_or_bench(kp.problem, kp.op, 2 * MiB, "powerOfTwo",
                                             runtime.numerics_for(torch.float32), None)
        assert found[-1][1] == f"bundle:{path}" and plan.workspace_bytes <= 2 * MiB


@pytest.fixture
def cuda_memory(monkeypatch):
    """torch's reserved-memory counter, cache release and capture state, pretended."""
    mem = SimpleNamespace(reserved=0, emptied=[], capturing=False)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: mem.reserved)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: mem.emptied.append(mem.reserved))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: mem.capturing)
    monkeypatch.setattr(runtime, "_release_pending", False)
    return mem


def test_a_lookup_that_benchmarked_gives_its_buffers_back_at_once(cuda_memory, monkeypatch):
    """A lookup that grew torch's reserved memory (a benchmark's buffers, cached by torch's allocator when freed)
    empties torch's cache before it returns, so nothing the step allocates next is carved from the benchmark's
    segments; one that allocated nothing releases nothing; under a CUDA graph capture it only marks them (the next
    prepared launch after the capture releases)."""
    from ucudnn.problem import ConvProblem

    grows = SimpleNamespace(by=0)

    def lookup(*args, **kwargs):
        cuda_memory.reserved += grows.by
        return "executor"

    monkeypatch.setattr(api, "_executor", lookup)
    monkeypatch.setattr(runtime, "installed", {})
    p = ConvProblem(2, 3, 8, 8, 4, 3, 3, (1, 1))
    assert runtime.executor(p, "forward", runtime.Settings(8 * MiB), "strict", 0) == "executor"
    assert cuda_memory.emptied == [] and not runtime._release_pending
    grows.by = 4 << 30
    runtime.executor(p, "backward_data", runtime.Settings(8 * MiB), "strict", 0)
    assert cuda_memory.emptied == [4 << 30] and not runtime._release_pending
    cuda_memory.capturing = True
    runtime.executor(p, "backward_filter", runtime.Settings(8 * MiB), "strict", 0)
    assert cuda_memory.emptied == [4 << 30] and runtime._release_pending


def test_background_benchmarks_mark_their_buffers_once_torch_serves_cupys_memory(cuda_memory, monkeypatch):
    """Routing CuPy's allocations through torch's allocator (where benchmark buffers start landing in torch's
    cache) also listens to heuristic mode's background benchmarks: each one's end marks the cache for release by
    the next prepared launch, not by the benchmark's own thread."""
    from ucudnn.binding import gpu

    fake_cupy = SimpleNamespace(cuda=SimpleNamespace(
        set_allocator=lambda allocator: None,
        memory=SimpleNamespace(PythonFunctionAllocator=lambda malloc, free: SimpleNamespace(malloc=malloc))))
    monkeypatch.setattr(gpu, "cupy", lambda: fake_cupy)
    monkeypatch.setattr(gpu, "_free_memory", None)
    monkeypatch.setattr(runtime, "_shared", False)
    monkeypatch.setattr(runtime, "_cp", None)
    monkeypatch.setattr(api, "after_background_benchmark", [])
    runtime.share_torch_memory()
    assert api.after_background_benchmark == [runtime._mark_for_release]
    assert cuda_memory.emptied == [] and not runtime._release_pending
    for listener in api.after_background_benchmark:
        listener()
    assert runtime._release_pending and cuda_memory.emptied == []     # marked only: released by a launch


def test_marked_buffers_go_back_to_the_device_once_at_the_next_prepared_launch(cuda_memory, monkeypatch):
    """Buffers marked during a capture go back at the next launch of a prepared call, once, and never while a
    CUDA graph is being captured."""
    import contextlib

    from ucudnn.problem import ConvProblem

    p = ConvProblem(2, 3, 8, 8, 4, 3, 3, (1, 1))
    call = SimpleNamespace(direct=None, run=lambda a, b, out, unwritten=None: None)
    monkeypatch.setattr(runtime, "_shared", True)
    monkeypatch.setattr(runtime, "_ready", lambda *a: call)
    no_context = SimpleNamespace(Device=lambda d: contextlib.nullcontext())
    monkeypatch.setattr(runtime, "_cp", SimpleNamespace(cuda=no_context))
    monkeypatch.setattr(runtime, "cupy_stream", lambda d: contextlib.nullcontext())
    t = SimpleNamespace(get_device=lambda: 0)
    launch = lambda: runtime.launch("forward", p, t, t, t, runtime.Settings(8 * MiB), "strict")  # noqa: E731
    cuda_memory.reserved = 4 << 30
    launch()
    assert cuda_memory.emptied == []                            # nothing marked
    runtime._release_pending = True
    cuda_memory.capturing = True
    launch()
    assert cuda_memory.emptied == [] and runtime._release_pending
    cuda_memory.capturing = False
    launch()
    launch()
    assert cuda_memory.emptied == [4 << 30] and not runtime._release_pending
