"""Graph-API micro-configurations execute correctly inside plans (GPU + nvidia-cudnn-frontend; skipped otherwise).

Each case runs a plan whose micro-batches all use graph-API engines, with an
uneven split so pointer offsets (some not 16-byte aligned), the accumulation
of backward filter over micro-batches and the caller's alpha / beta are all
exercised, and compares with one undivided legacy cuDNN call.  Strict FP32
is checked against a float64 reference tightly enough that TF32 would fail.
"""
from __future__ import annotations

import numpy as np
import pytest

from ucudnn.problem import ConvProblem

pytestmark = pytest.mark.gpu

from cudnn_reference import undivided  # noqa: E402
from test_gpu_execute import _conv_ref_nchw, _run_and_reference, _tensors, rel_err  # noqa: E402


def _frontend_or_skip():
    from ucudnn.measure.sources.graph import GraphUnavailable, frontend

    try:
        return frontend()
    except GraphUnavailable as e:
        pytest.skip(str(e))


CASES = {
    "odd-batch-nchw": (ConvProblem(37, 16, 20, 20, 32, 3, 3, pad=(1, 1)), [16, 16, 5], "strict"),
    "nhwc-float32-tf32": (ConvProblem(33, 16, 16, 16, 32, 3, 3, pad=(1, 1), layout="NHWC"), [32, 1], "tf32"),
    "nhwc-float16": (ConvProblem(66, 16, 16, 16, 32, 3, 3, pad=(1, 1), dtype="float16", layout="NHWC"), [32, 32, 2],
                     "strict"),
    "misaligned-c3-stride4": (ConvProblem(13, 3, 35, 35, 16, 11, 11, stride=(4, 4)), [8, 4, 1], "strict"),
}
TOL = {"strict": 2e-5, "tf32": 5e-3, "float16": 2e-2}


def _graph_plan(problem, op, sizes, numerics, pick=min):
    """A plan of ``sizes`` whose every micro-batch runs a measured graph-API engine (``pick`` by time)."""
    import cupy as cp

    from ucudnn.measure.benchmarking import Buffers
    from ucudnn.measure.sources import registry
    from ucudnn.measure.sources.base import BenchSettings
    from ucudnn.planning.plan import KernelPlan, MicroConfig

    src = registry.get("graph")
    settings = BenchSettings(numerics, repeat=1, warmup=0, max_workspace=256 << 20)
    buf = Buffers(problem)
    ws = cp.cuda.alloc(settings.max_workspace)
    configs, all_ms = [], []
    for mb in sizes:
        ms, skipped = src.measure(op, problem.with_batch(mb), buf.operands(op, mb), ws.ptr, settings)
        assert ms, f"no graph engine measured for {op} at {mb}: {[s.reason for s in skipped][:5]}"
        configs.append(MicroConfig.of(pick(ms, key=lambda m: m.time_ms)))
        all_ms += ms
    return KernelPlan(f"graph/{op}", op, problem, configs), all_ms


@pytest.fixture(params=sorted(CASES))
def case(request):
    _frontend_or_skip()
    return CASES[request.param]


@pytest.mark.parametrize("op", ["forward", "backward_data", "backward_filter"])
def test_graph_plan_execution_matches_undivided_cudnn(case, op):
    import cupy as cp

    problem, sizes, numerics = case
    plan, _ = _graph_plan(problem, op, sizes, numerics)
    assert all(c.source == "graph" for c in plan.configs)
    out, ref = _run_and_reference(plan, seed=hash((problem, op)) % 1000)
    assert not cp.isnan(out).any()
    tol = TOL["float16"] if problem.dtype == "float16" else TOL[numerics]
    assert rel_err(out.get(), ref.get()) < tol


@pytest.mark.parametrize("op", ["forward", "backward_data", "backward_filter"])
def test_graph_plan_with_the_slowest_engines_too(op):
    """Another engine per size (the slowest measured): engines differ in how they index and accumulate."""
    _frontend_or_skip()
    problem, sizes, numerics = CASES["odd-batch-nchw"]
    plan, _ = _graph_plan(problem, op, sizes, numerics, pick=max)
    out, ref = _run_and_reference(plan, seed=11)
    assert rel_err(out.get(), ref.get()) < TOL[numerics]


def test_graph_backward_filter_accumulates_with_callers_alpha_beta():
    import cupy as cp

    from ucudnn.execute.executor import Executor

    _frontend_or_skip()
    problem, sizes, numerics = CASES["odd-batch-nchw"]
    plan, _ = _graph_plan(problem, "backward_filter", sizes, numerics)
    x, w, dy = _tensors(problem, seed=3)
    dw0 = cp.random.default_rng(4).standard_normal(w.shape, dtype="float32")
    out = dw0.copy()
    Executor(plan)(x, dy, out, alpha=0.5, beta=2.0)
    ref = undivided(problem, "backward_filter", x, dy, dw0.copy(), alpha=0.5, beta=2.0)
    assert rel_err(out.get(), ref.get()) < TOL[numerics]


def test_strict_fp32_graph_engines_compute_true_fp32_and_tf32_ones_are_labelled():
    """Every engine measured under strict numerics is FP32-accurate (TF32 would be ~1e-3 off)."""
    import cupy as cp

    from ucudnn.measure.benchmarking import Buffers
    from ucudnn.measure.sources import graph as G
    from ucudnn.measure.sources.base import BenchSettings

    _frontend_or_skip()
    src = G.GraphSource()   # every configuration: the registry's top 12 per mode need not nest across modes
    problem = ConvProblem(8, 64, 14, 14, 64, 3, 3, pad=(1, 1))
    buf = Buffers(problem)
    ws = cp.cuda.alloc(256 << 20)
    ref = _conv_ref_nchw(buf.x.get(), buf.w.get(), problem)
    seen = {}
    for numerics in ("strict", "tf32"):
        ms, _ = src.measure("forward", problem, buf.operands("forward", 8), ws.ptr,
                            BenchSettings(numerics, repeat=1, warmup=0, max_workspace=256 << 20))
        assert ms
        for m in ms:
            assert G.admissible(m.extra.get("notes", ()), numerics, "float32")
            buf.out[...] = cp.nan
            src.run("forward", problem, m, buf.operands("forward", 8), ws.ptr, m.workspace_bytes, 1.0, 0.0)
            err = rel_err(buf.out.get(), ref)
            seen[(numerics, m.algo)] = (m.math_type, err)
            if numerics == "strict":
                assert m.math_type == "FMA" and err < 1e-5, f"{m.algo}: {err}"
    assert {t for (mode, _), (t, _) in seen.items() if mode == "strict"} == {"FMA"}
    # tf32 mode offers strictly more (the TF32 engines), each labelled by its notes
    strict = {a for mode, a in seen if mode == "strict"}
    tf32 = {a for mode, a in seen if mode == "tf32"}
    assert strict <= tf32
    assert all(seen[("tf32", a)][0] == "TENSOR_OP" for a in tf32 - strict)


def test_a_legacy_plus_graph_table_plans_and_executes():
    import cupy as cp

    from ucudnn.execute.executor import Executor
    from ucudnn.measure.benchmarking import benchmark
    from ucudnn.planning.planner import plan
    from ucudnn.planning.table import BenchmarkTable
    from ucudnn.problem import KernelSpec

    _frontend_or_skip()
    p = ConvProblem(24, 32, 14, 14, 32, 3, 3, pad=(1, 1), layout="NHWC")
    kernels = [KernelSpec(f"c/{op}", op, p) for op in ("forward", "backward_data", "backward_filter")]
    table = benchmark(kernels, "powerOfTwo", "strict", sources="legacy,graph", repeat=1)
    again = BenchmarkTable.loads(table.to_json())   # the schema accepts it; engines survive
    assert {m.source for k in again.kernels for m in k.measurements} == {"legacy", "graph"}
    pl = plan(again, "wr", workspace_limit="1MiB")
    x, w, dy = _tensors(p, seed=5)
    for kp in pl.kernels:
        a, b = {"forward": (x, w), "backward_data": (w, dy), "backward_filter": (x, dy)}[kp.op]
        shape = {"forward": dy.shape, "backward_data": x.shape, "backward_filter": w.shape}[kp.op]
        out = cp.full(shape, cp.nan, dtype=x.dtype)
        Executor(kp)(a, b, out)
        ref = undivided(p, kp.op, a, b, cp.empty(shape, dtype=x.dtype))
        assert rel_err(out.get(), ref.get()) < 2e-5, kp.summary()
    assert np.isfinite(pl.total_time_ms)
