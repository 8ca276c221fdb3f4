"""The mec source on the GPU (skipped without one): every op and variant against a float64 direct convolution and
undivided cuDNN on awkward NHWC shapes, FP32 strict and FP16; alpha / beta; micro-batched plans through the Executor
(backward filter accumulating, mixed with legacy steps); CUDA-graph replay; exact workspace (the launch gets no more
than it reports); measure()'s rows.  No timing is asserted."""
from __future__ import annotations

import numpy as np
import pytest
from conv_checks import close, host as _host, launch_once, run_plan, undivided_cudnn
from test_mec import direct_backward_data, direct_backward_filter, direct_forward
from ucudnn.kernels.mec import VARIANTS, MecGeometry, program, refusal

from ucudnn.planning.table import Measurement
from ucudnn.problem import ConvProblem

pytestmark = pytest.mark.gpu

CASES = {
    "nonsquare-pad-stride12": ConvProblem(7, 3, 13, 11, 8, 5, 3, pad=(2, 1), stride=(1, 2), layout="NHWC"),
    "c1-stride3": ConvProblem(5, 1, 17, 19, 4, 3, 4, pad=(1, 0), stride=(3, 3), layout="NHWC"),
    "conv1-like-stride4": ConvProblem(3, 3, 47, 47, 16, 11, 11, stride=4, layout="NHWC"),
    "odd-batch-255": ConvProblem(255, 3, 6, 5, 4, 3, 2, pad=1, stride=2, layout="NHWC"),
    "stride-over-filter": ConvProblem(3, 5, 12, 13, 6, 2, 2, stride=(3, 4), layout="NHWC"),
    "alexnet-conv2": ConvProblem(8, 96, 27, 27, 256, 5, 5, pad=2, layout="NHWC"),
}
MATH = {"float32": "FMA", "float16": "TENSOR_OP"}
TOL = {"float32": 2e-5, "float16": 2e-2}   # max error / max |reference|


def _config(problem, op, variant, n=None):
    n = problem.n if n is None else n
    ws = program(MecGeometry.of(problem), op, variant, n).workspace_bytes
    return Measurement(n, f"mec-{variant}", MATH[problem.dtype], 1.0, ws, "mec", None, {"mec": {"variant": variant}})


def _reference(op, p, x, w, dy):
    g = MecGeometry.of(p.with_batch(x.shape[0]))
    x, w, dy = (a.astype(np.float64) for a in (x, w, dy))
    return {"forward": lambda: direct_forward(x, w, g), "backward_data": lambda: direct_backward_data(dy, w, g),
            "backward_filter": lambda: direct_backward_filter(x, dy, g)}[op]()


def _close(got, ref, dtype, what=""):
    close(got, ref, TOL[dtype], what)


def _launch_once(problem, op, variant, alpha=1.0, beta=0.0, seed=0):
    """(result, float64 expectation) of one prepared launch with exactly the reported workspace (NaN-filled)."""
    from ucudnn.measure.sources.mec import MecSource

    return launch_once(MecSource(), _config(problem, op, variant), problem, op, alpha, beta, seed, _reference)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op", sorted(VARIANTS))
@pytest.mark.parametrize("name", sorted(CASES))
def test_every_variant_matches_the_float64_reference(name, op, dtype):
    from dataclasses import replace

    problem = replace(CASES[name], dtype=dtype)
    ran = 0
    for variant in VARIANTS[op]:
        if refusal(MecGeometry.of(problem), op, variant, problem.n):
            continue
        got, expect = _launch_once(problem, op, variant)
        _close(got, expect, dtype, f"{name} {op} {variant}")
        ran += 1
    assert ran


@pytest.mark.parametrize("op,variant", [(op, v) for op in sorted(VARIANTS) for v in VARIANTS[op]])
def test_alpha_and_beta_scale_and_accumulate(op, variant):
    problem = CASES["nonsquare-pad-stride12"]
    if refusal(MecGeometry.of(problem), op, variant, problem.n):
        pytest.skip("variant does not run here")
    got, expect = _launch_once(problem, op, variant, alpha=-0.75, beta=0.5, seed=3)   # forward A: B's GEMMs
    _close(got, expect, "float32", f"{op} {variant}")


@pytest.mark.parametrize("op", sorted(VARIANTS))
@pytest.mark.parametrize("name", ["conv1-like-stride4", "alexnet-conv2"])
def test_matches_undivided_cudnn(name, op):
    problem = CASES[name]
    got, _ = _launch_once(problem, op, "A", seed=5)
    _close(got, undivided_cudnn(problem, op, 5), "float32", f"{name} {op} vs cuDNN")


def _plan(problem, op, steps):
    """A KernelPlan of (micro-batch, source, variant-or-algo) steps, by hand."""
    from ucudnn.planning.plan import KernelPlan, MicroConfig

    configs = []
    for mb, source, what in steps:
        if source == "mec":
            configs.append(MicroConfig.of(_config(problem, op, what, mb)))
        else:
            configs.append(MicroConfig.of(Measurement(mb, what, "FMA", 1.0, 0, "legacy")))
    return KernelPlan(f"test/mec/{op}", op, problem, configs)


SPLITS = [[(2, "mec", "A"), (2, "mec", "B"), (3, "mec", "A")], [(4, "mec", "A"), (3, "legacy", 0)]]


@pytest.mark.parametrize("replay", [False, True])
@pytest.mark.parametrize("split", range(len(SPLITS)))
@pytest.mark.parametrize("op", sorted(VARIANTS))
def test_micro_batched_plans_through_the_executor(op, split, replay):
    problem = CASES["nonsquare-pad-stride12"]       # n = 7
    steps = [(mb, s, w if s != "mec" or not refusal(MecGeometry.of(problem), op, w, mb) else "A")
             for mb, s, w in SPLITS[split]]
    plan = _plan(problem, op, steps)
    alpha, beta = (0.5, 0.25) if op == "backward_filter" else (1.0, 0.0)
    ex = run_plan(plan, problem, op, replay, TOL["float32"], _reference, alpha, beta)
    assert ex.workspace_bytes == max(c.workspace_bytes for c in plan.configs)


def test_a_captured_graph_replays_on_new_data():
    import cupy as cp

    from ucudnn.binding.gpu import capture
    from ucudnn.measure.sources.base import Operands
    from ucudnn.measure.sources.mec import MecSource

    problem = CASES["alexnet-conv2"]
    x, w, _ = _host(problem, 9)
    cx, cw = cp.asarray(x), cp.asarray(w)
    y = cp.empty(problem.y_shape(), cp.float32)
    cfg = _config(problem, "forward", "A")
    ws = cp.cuda.alloc(cfg.workspace_bytes)
    launch = MecSource().prepare("forward", problem, cfg)
    graph = capture(lambda: launch(Operands(cx.data.ptr, cw.data.ptr, y.data.ptr), ws.ptr, cfg.workspace_bytes,
                                   1.0, 0.0))
    x2 = np.random.default_rng(10).standard_normal(x.shape).astype(np.float32)
    cx.set(x2)
    graph.launch(cp.cuda.get_current_stream())
    _close(y.get(), _reference("forward", problem, x2, w, np.zeros(problem.y_shape())), "float32", "replayed")


def test_measure_records_labelled_reproducible_rows_with_exact_workspace():
    import cupy as cp

    from ucudnn.measure.benchmarking import Buffers
    from ucudnn.measure.sources.base import BenchSettings
    from ucudnn.measure.sources.mec import MecSource

    problem = CASES["alexnet-conv2"]
    buf = Buffers(problem)
    for numerics, label in (("strict", "FMA"), ("tf32", "TENSOR_OP")):
        settings = BenchSettings(numerics, repeat=2, warmup=1, max_workspace=256 << 20)
        ws = cp.cuda.alloc(settings.max_workspace)
        for op in VARIANTS:
            ms, sk = MecSource(forward="both").measure(op, problem, buf.operands(op, problem.n), ws.ptr, settings)
            assert ms, sk
            for m in ms:
                assert m.source == "mec" and m.math_type == label and m.time_ms > 0
                assert m.algo == f"mec-{m.extra['mec']['variant']}" and m.extra["deterministic"] is True
                assert m.workspace_bytes == program(MecGeometry.of(problem), op, m.extra["mec"]["variant"],
                                                    problem.n).workspace_bytes
                if op == "forward":
                    assert {"T", "rule"} <= set(m.extra["mec"])
    half = ConvProblem(8, 96, 27, 27, 256, 5, 5, pad=2, layout="NHWC", dtype="float16")
    settings = BenchSettings("default", repeat=1, warmup=0, max_workspace=256 << 20)
    ms, sk = MecSource().measure("forward", half, Buffers(half).operands("forward", 8),
                                 cp.cuda.alloc(settings.max_workspace).ptr, settings)
    assert len(ms) == 1 and ms[0].math_type == "TENSOR_OP", sk


def test_nchw_runs_through_relayout_wrapping_mec():
    import cupy as cp

    from ucudnn.measure.benchmarking import Buffers
    from ucudnn.measure.sources.base import BenchSettings
    from ucudnn.measure.sources.relayout import RelayoutSource

    problem = ConvProblem(4, 3, 13, 11, 8, 5, 3, pad=(2, 1), stride=(1, 2))   # NCHW
    settings = BenchSettings("strict", repeat=1, warmup=0, max_workspace=64 << 20)
    ms, sk = RelayoutSource(inner=("mec",)).measure("forward", problem, Buffers(problem).operands("forward", 4),
                                                    cp.cuda.alloc(settings.max_workspace).ptr, settings)
    assert ms and all(m.source == "relayout" for m in ms), sk
