"""Channel-sliced plans (issue 18) equal undivided cuDNN (GPU; skipped without one).

Each case benchmarks one kernel with ``channel_policy="halves"``, builds a plan that covers k with uneven
slices (k/2 + k/4 + k/4), each slice split unevenly along the batch, with the fastest measured configuration of
the named source at each (micro-batch, slice), executes it with the caller's alpha and beta, and compares with
one undivided cuDNN call; eagerly and captured in a CUDA graph.
"""
from __future__ import annotations

import numpy as np
import pytest
from cudnn_reference import undivided

from ucudnn.problem import ConvProblem, KernelSpec

pytestmark = pytest.mark.gpu

CASES = {
    "odd-batch-3x5-stride2": ConvProblem(7, 16, 13, 11, 64, 3, 5, pad=(1, 2), stride=(2, 1)),
    "nhwc-5x5": ConvProblem(5, 24, 15, 15, 32, 5, 5, pad=(2, 2), layout="NHWC"),
    "alexnet-conv2-like": ConvProblem(6, 32, 27, 27, 64, 5, 5, pad=(2, 2)),
    "first-layer-c3-stride4": ConvProblem(5, 3, 47, 47, 32, 11, 11, stride=(4, 4)),
    "float16-nhwc": ConvProblem(9, 16, 14, 14, 64, 3, 3, pad=(1, 1), dtype="float16", layout="NHWC"),
}
#: float32: transform-based engines differ from algorithm 0 by up to ~1e-3 whether sliced or not (H100: graph wgrad
#: eng17_k25=0 on the alexnet-conv2-like case, 8.7e-4 unsliced and sliced alike, where eng0/eng1/eng20 are 1e-7..1e-6);
#: a slicing error (offset, stride, beta) is O(1)
TOL = {"float32": 1.5e-3, "float16": 2e-2}
BATCHES = {7: [4, 2, 1], 5: [4, 1], 6: [4, 2], 9: [8, 1]}


def rel_err(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _sliced_plan(problem, op, source):
    from ucudnn.measure.benchmarking import benchmark
    from ucudnn.planning.plan import KernelPlan, MicroConfig

    numerics = "strict" if problem.dtype == "float32" else "default"
    table = benchmark([KernelSpec("k", op, problem)], "powerOfTwo", numerics, sources=source, repeat=1,
                      channel_policy="halves", max_workspace=256 << 20, progress=False)
    ms = table.kernels[0].measurements
    configs = []
    for c in (problem.k // 2, problem.k // 4, problem.k // 4):
        for mb in BATCHES[problem.n]:
            opts = [m for m in ms if m.channels == c and m.micro_batch == mb]
            if not opts:
                pytest.skip(f"{source} measured nothing at micro-batch {mb}, {c} channels")
            configs.append(MicroConfig.of(min(opts, key=lambda m: m.time_ms)))
    return KernelPlan(f"test/{op}", op, problem, configs)


@pytest.mark.parametrize("source", ["legacy", "graph"])
@pytest.mark.parametrize("op", ["forward", "backward_data", "backward_filter"])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("replay", [False, True], ids=["eager", "replay"])
def test_a_channel_sliced_plan_equals_undivided_cudnn(case, op, source, replay):
    import cupy as cp

    from ucudnn.execute.executor import Executor
    from ucudnn.measure.benchmarking import Buffers

    if source == "graph":
        pytest.importorskip("cudnn")
    problem = CASES[case]
    plan = _sliced_plan(problem, op, source)
    assert {c.channels for c in plan.configs} == {problem.k // 2, problem.k // 4}
    buf = Buffers(problem)
    a, b, out = buf.arrays(op)
    rng = cp.random.default_rng(7)
    start = rng.standard_normal(out.shape, dtype="float32").astype(out.dtype)
    alpha, beta = 0.75, 0.5
    ref = start.copy()
    undivided(problem, op, a, b, ref, alpha, beta)
    got = start.copy()
    ex = Executor(plan, replay=replay)
    for _ in range(2 if replay else 1):   # replay: the second call replays the captured graph
        got[...] = start
        ex(a, b, got, alpha=alpha, beta=beta)
    cp.cuda.Device().synchronize()
    if replay:
        assert not ex.replay_failures, ex.replay_failures
    assert rel_err(got.get(), ref.get()) < TOL[problem.dtype], plan.summary()


def test_the_benchmark_measures_slices_only_with_sources_that_run_them():
    from ucudnn.measure.benchmarking import benchmark

    p = CASES["alexnet-conv2-like"]
    table = benchmark([KernelSpec("k", "forward", p)], "powerOfTwo", "strict", sources="legacy,direct", repeat=1,
                      channel_policy="halves", max_workspace=64 << 20, progress=False)
    sliced = [m for m in table.kernels[0].measurements if m.channels is not None]
    assert sliced and {m.source for m in sliced} == {"legacy"} and {m.channels for m in sliced} == {32, 16, 8}
    assert table.extra["channel_policy"] == "halves"


def test_a_bundle_precomputed_with_halves_answers_a_process_that_runs_with_halves(tmp_path, monkeypatch):
    """``ucudnn precompute --channel-policy halves`` on this GPU, the worker's environment saying nothing: the
    units measure channel slices (the job's policy, not the worker's) and store them under the key a process with
    ``UCUDNN_CHANNEL_POLICY=halves`` looks up; that process plans from the bundle without a benchmark, and its plan
    computes what one undivided cuDNN call does (whether that plan slices is the timings' choice).  A process
    without the policy is not answered by it."""
    import json

    import cupy as cp

    import ucudnn.api as api
    from ucudnn.catalog.bundle import BundleReader
    from ucudnn.cli import main

    p = ConvProblem(8, 32, 27, 27, 64, 5, 5, pad=(2, 2))
    net = {"format": "ucudnn-network/1", "name": "one-5x5", "default_batch": p.n,
           "layers": [{"name": "conv", "c": p.c, "h": p.h, "w": p.w, "k": p.k, "r": p.r, "s": p.s,
                       "pad": list(p.pad), "stride": [1, 1]}]}
    (tmp_path / "net.json").write_text(json.dumps(net))
    monkeypatch.delenv("UCUDNN_CHANNEL_POLICY", raising=False)
    monkeypatch.delenv("UCUDNN_BUNDLE_PATH", raising=False)
    monkeypatch.setenv("UCUDNN_DATABASE", str(tmp_path / "precompute.db"))
    bundle = tmp_path / "halves.bundle"
    assert main(["precompute", "--network", str(tmp_path / "net.json"), "--ops", "forward", "--sources", "legacy",
                 "--channel-policy", "halves", "--workspace-limits", "1MiB", "--engine", "local", "--repeat", "1",
                 "--out", str(bundle), "--no-progress"]) == 0
    reader = BundleReader(bundle)
    [row] = reader.list_tables()
    measured = reader.get_table(row["id"]).kernels[0].measurements
    reader.close()
    assert {m.channels for m in measured} >= {None, p.k // 2}

    calls: list[str] = []
    real = api.benchmark

    def counted(kernels, *a, **kw):
        calls.append(kernels[0].op)
        return real(kernels, *a, **kw)

    monkeypatch.setattr(api, "benchmark", counted)
    monkeypatch.setattr(api, "_store", None)
    monkeypatch.setattr(api, "_plans", {})
    monkeypatch.setenv("UCUDNN_DATABASE", str(tmp_path / "user.db"))
    monkeypatch.setenv("UCUDNN_BUNDLE_PATH", str(bundle))
    monkeypatch.setenv("UCUDNN_CHANNEL_POLICY", "halves")
    plan = api._plan_from_store_or_bench(p, "forward", 1 << 20, "powerOfTwo", "strict", sources="legacy")
    assert calls == [], "the bundle should have answered"
    assert plan.configs and sum(c.micro_batch * (c.channels or p.k) for c in plan.configs) == p.n * p.k

    rng = np.random.default_rng(3)
    x = cp.asarray(rng.standard_normal(p.x_shape(), dtype=np.float32))
    w = cp.asarray(rng.standard_normal(p.w_shape(), dtype=np.float32))
    got = api.conv2d_forward(x, w, padding=p.pad, workspace_limit=1 << 20, numerics="strict", sources="legacy")
    assert calls == []
    ref = undivided(p, "forward", x, w, cp.empty(p.y_shape(), dtype=cp.float32))
    assert rel_err(got.get(), ref.get()) < TOL["float32"]

    monkeypatch.setenv("UCUDNN_CHANNEL_POLICY", "none")
    monkeypatch.setattr(api, "_plans", {})
    api._plan_from_store_or_bench(p, "forward", 1 << 20, "powerOfTwo", "strict", sources="legacy")
    assert calls == ["forward"]   # unsliced: another key, measured here
