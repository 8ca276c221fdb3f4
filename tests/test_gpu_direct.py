"""The direct source's kernels on the GPU (skipped without one): forward and backward data against undivided cuDNN
(legacy, algorithm 0) and a float64 reference, micro-batched through the Executor, alpha/beta, CUDA-graph capture,
measurement rows and the tuner.

Cases: C = 1 (square, 1x7, 5x3 filters), C = 3 (5x3, AlexNet-like 11x11 stride 4), depthwise (multiplier 1 and 2,
stride 2), grouped and multi-channel layers (stride 4, 1x1); pads 0-3, strides 1-4, odd batches split unevenly;
float32 (FMA) and float16 (float32 accumulation), NCHW and NHWC.

``python tests/test_gpu_direct.py`` prints a one-off speed observation instead: the direct source's row against the
legacy source's zero-workspace rows on the seed's single-channel layers at batch 256 (not a test: no timing in
tests).
"""
from __future__ import annotations

import numpy as np
import pytest
from cudnn_reference import undivided

from ucudnn.problem import ConvProblem

pytestmark = pytest.mark.gpu

CASES = {
    "c1-3x3": (ConvProblem(7, 1, 29, 31, 16, 3, 3, pad=(1, 1)), [4, 3]),
    "c1-1x7-stride": (ConvProblem(7, 1, 24, 40, 8, 1, 7, pad=(0, 3), stride=(1, 2)), [5, 2]),
    "c1-5x3-pad3-stride3": (ConvProblem(7, 1, 20, 17, 12, 5, 3, pad=(3, 2), stride=(3, 2)), [7]),
    "c3-5x3-stride2": (ConvProblem(7, 3, 21, 19, 10, 5, 3, pad=(2, 1), stride=(2, 2)), [4, 2, 1]),
    "c3-11x11-stride4": (ConvProblem(5, 3, 47, 47, 16, 11, 11, pad=(2, 2), stride=(4, 4)), [3, 2]),
    "depthwise-3x3-m2": (ConvProblem(7, 16, 14, 15, 32, 3, 3, pad=(1, 1), groups=16), [6, 1]),
    "depthwise-5x5-stride2": (ConvProblem(7, 8, 13, 13, 8, 5, 5, pad=(2, 2), stride=(2, 2), groups=8), [7]),
    "multi-stride4-pad0": (ConvProblem(3, 16, 23, 23, 24, 3, 3, stride=(4, 4)), [2, 1]),
    "grouped": (ConvProblem(5, 12, 11, 11, 8, 3, 3, pad=(1, 1), groups=4), [3, 2]),
    "multi-1x1": (ConvProblem(7, 32, 9, 9, 16, 1, 1), [7]),
}
VARIANTS = [("float32", "NCHW"), ("float32", "NHWC"), ("float16", "NCHW"), ("float16", "NHWC")]
#: relative error (2-norm) against cuDNN and against float64: FP32 FMA sums in another order; FP16 rounds y / dx
TOL_CUDNN = {"float32": 2e-5, "float16": 5e-3}
TOL_REF = {"float32": 2e-6, "float16": 1e-3}


def rel_err(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _variant(p: ConvProblem, dtype: str, layout: str) -> ConvProblem:
    return ConvProblem(p.n, p.c, p.h, p.w, p.k, p.r, p.s, p.pad, p.stride, p.dilation, p.groups, dtype, layout)


def _tensors(p: ConvProblem, seed: int):
    import cupy as cp

    rng = cp.random.default_rng(seed)
    return tuple(rng.standard_normal(shape, dtype="float32").astype(p.dtype)
                 for shape in (p.x_shape(), p.w_shape(), p.y_shape()))


def _plan(p: ConvProblem, op: str, sizes: list[int], source=None):
    """A KernelPlan of the direct source's configurations at ``sizes`` (default tiles: no tuning, no timing)."""
    from ucudnn.measure.sources.direct import DirectSource
    from ucudnn.planning.plan import KernelPlan, MicroConfig

    source = source or DirectSource(tune=False)
    return KernelPlan(f"test/{op}", op, p, [MicroConfig.of(source.configure(op, p.with_batch(mb))) for mb in sizes])


def _cudnn(p: ConvProblem, op: str, a, b, out, alpha: float = 1.0, beta: float = 0.0):
    """Undivided cuDNN, algorithm 0 (no workspace); None where cuDNN does not run it."""
    from ucudnn.errors import CudnnError

    try:
        return undivided(p, op, a, b, out, alpha, beta)
    except CudnnError:
        return None


def _reference(p: ConvProblem, op: str, x, w, dy) -> np.ndarray:
    from ucudnn.kernels.direct import backward_data_reference, forward_reference

    if op == "forward":
        return forward_reference(x.get(), w.get(), p)
    if op == "backward_filter":
        from ucudnn.kernels.direct import backward_filter_reference

        return backward_filter_reference(x.get(), dy.get(), p)
    return backward_data_reference(dy.get(), w.get(), p)


def _operands(op: str, x, w, dy):
    return {"forward": (x, w), "backward_data": (w, dy), "backward_filter": (x, dy)}[op]


@pytest.mark.parametrize("op", ["forward", "backward_data"])
@pytest.mark.parametrize("dtype, layout", VARIANTS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_micro_batched_direct_matches_cudnn_and_float64(name, dtype, layout, op):
    import cupy as cp

    from ucudnn.execute.executor import Executor

    base, sizes = CASES[name]
    p = _variant(base, dtype, layout)
    x, w, dy = _tensors(p, seed=len(name))
    a, b = _operands(op, x, w, dy)
    plan = _plan(p, op, sizes)
    assert plan.workspace_bytes == 0
    out = cp.full(p.operand_shapes(op)[2], cp.nan, dtype=p.dtype)
    Executor(plan)(a, b, out)
    got = out.get()
    assert not np.isnan(got).any(), "every output element is written"
    assert rel_err(got, _reference(p, op, x, w, dy)) < TOL_REF[dtype]
    ref = _cudnn(p, op, a, b, cp.empty_like(out))
    if ref is not None:
        assert rel_err(got, ref.get()) < TOL_CUDNN[dtype]


@pytest.mark.parametrize("op", ["forward", "backward_data"])
@pytest.mark.parametrize("name", ["c1-5x3-pad3-stride3", "depthwise-3x3-m2", "c3-5x3-stride2"])
def test_alpha_and_beta_scale_and_accumulate(name, op):
    import cupy as cp

    from ucudnn.execute.executor import Executor

    p, sizes = CASES[name]
    x, w, dy = _tensors(p, seed=11)
    a, b = _operands(op, x, w, dy)
    old = cp.random.default_rng(12).standard_normal(p.operand_shapes(op)[2], dtype="float32")
    out = old.copy()
    Executor(_plan(p, op, sizes))(a, b, out, alpha=0.5, beta=2.0)
    expect = 0.5 * _reference(p, op, x, w, dy) + 2.0 * old.get()
    assert rel_err(out.get(), expect) < TOL_REF["float32"]


@pytest.mark.parametrize("tiling", [[8, 1, 1, 1], [16, 4, 8, 2], [32, 2, 2, 16]])
@pytest.mark.parametrize("op", ["forward", "backward_data"])
@pytest.mark.parametrize("name", ["c1-3x3", "c3-11x11-stride4", "grouped"])
def test_every_tiling_computes_the_same_convolution(name, op, tiling):
    """Tilings the tuner may pick, including more channels per thread or per stage than the layer has, with and
    without cp.async staging (float)."""
    import cupy as cp

    from ucudnn.kernels import _compile
    from ucudnn.kernels.direct import Tiling, fits, launcher, smem_limit, uses_async

    p, _ = CASES[name]
    t = Tiling.from_list(tiling)
    if not fits(op, p, t, smem_limit()):
        pytest.skip("tiling over the device's shared memory")
    x, w, dy = _tensors(p, seed=5)
    a, b = _operands(op, x, w, dy)
    ref = _reference(p, op, x, w, dy)
    for async_copy in sorted({False, uses_async(op, p, _compile.compute_capability())}):
        out = cp.full(p.operand_shapes(op)[2], cp.nan, dtype=p.dtype)
        launcher(op, p, t, async_copy)(a.data.ptr, b.data.ptr, out.data.ptr, 1.0, 0.0)
        assert rel_err(out.get(), ref) < TOL_REF["float32"], f"async={async_copy}"


def test_batches_beyond_one_grid_are_split_across_launches(monkeypatch):
    import cupy as cp

    from ucudnn.kernels import direct
    from ucudnn.kernels.direct import Tiling

    monkeypatch.setattr(direct, "_MAX_Z", 2)     # 7 samples -> launches of 2, 2, 2, 1
    p, _ = CASES["c3-5x3-stride2"]
    x, w, dy = _tensors(p, seed=6)
    for op in ("forward", "backward_data"):
        a, b = _operands(op, x, w, dy)
        out = cp.full(p.operand_shapes(op)[2], cp.nan, dtype=p.dtype)
        direct.launcher(op, p, Tiling(16, 2, 4, 2))(a.data.ptr, b.data.ptr, out.data.ptr, 1.0, 0.0)
        assert rel_err(out.get(), _reference(p, op, x, w, dy)) < TOL_REF["float32"]


@pytest.mark.parametrize("op", ["forward", "backward_data"])
def test_plans_capture_into_a_cuda_graph_and_replay(op):
    import cupy as cp

    from ucudnn.execute.executor import Executor

    p, sizes = CASES["depthwise-5x5-stride2"]
    p = _variant(p, "float16", "NHWC")
    x, w, dy = _tensors(p, seed=8)
    a, b = _operands(op, x, w, dy)
    ex = Executor(_plan(p, op, [4, 2, 1]), replay=True)
    out = cp.full(p.operand_shapes(op)[2], cp.nan, dtype=p.dtype)
    for _ in range(2):
        ex(a, b, out)
    assert ex.replay_failures == [] and len(ex._graphs) == 1
    assert rel_err(out.get(), _reference(p, op, x, w, dy)) < TOL_REF["float16"]


@pytest.mark.parametrize("timing", ["eager", "replay"])
def test_measure_records_one_zero_workspace_row_per_op_and_skips_backward_filter(timing):
    import cupy as cp

    from ucudnn.measure.benchmarking import Buffers
    from ucudnn.measure.sources.base import BenchSettings
    from ucudnn.measure.sources.direct import DirectSource

    p = _variant(CASES["c1-3x3"][0], "float16", "NHWC")
    buf = Buffers(p)
    settings = BenchSettings("default", repeat=2, warmup=1, timing=timing)
    src = DirectSource(tune=False)
    ws = cp.cuda.alloc(1024)
    for op in ("forward", "backward_data"):
        ms, sk = src.measure(op, p.with_batch(4), buf.operands(op, 4), ws.ptr, settings)
        assert sk == [] and len(ms) == 1
        m = ms[0]
        assert (m.micro_batch, m.algo, m.math_type, m.workspace_bytes, m.source) == (4, "direct-single", "DEFAULT",
                                                                                     0, "direct")
        assert m.time_ms > 0 and m.extra["direct"]["tuned"] == "default" and m.extra["deterministic"] is True
    ms, sk = src.measure("backward_filter", p, buf.operands("backward_filter", 7), ws.ptr, settings)
    assert ms == [] and sk[0].reason.startswith("direct: no backward-filter kernel; igemm: float16")


def test_tuned_configuration_rebuilds_its_launch_from_the_table():
    """The tuner climbs on the benchmark's buffers, records the tiles in the row, and prepare() runs exactly them."""
    import cupy as cp

    from ucudnn.measure.benchmarking import Buffers
    from ucudnn.measure.sources.base import BenchSettings
    from ucudnn.measure.sources.direct import DirectSource
    from ucudnn.planning.table import Measurement

    p = CASES["c1-3x3"][0]
    buf = Buffers(p)
    ms, _ = DirectSource(tune=True).measure("forward", p, buf.operands("forward", 7), 0,
                                            BenchSettings("strict", repeat=2))
    (m,) = [row for row in ms if row.algo == "direct-single"]     # beside it: the implicit-GEMM row
    assert m.extra["direct"]["tuned"] in ("climb", "cache") and m.math_type == "FMA"
    again = Measurement.from_dict(m.to_dict())          # through the table's JSON form
    out = cp.full(p.y_shape(), cp.nan, dtype=p.dtype)
    from ucudnn.measure.sources.base import Operands

    DirectSource(tune=False).prepare("forward", p, again)(Operands(buf.x.data.ptr, buf.w.data.ptr, out.data.ptr),
                                                         0, 0, 1.0, 0.0)
    assert rel_err(out.get(), _reference(p, "forward", buf.x, buf.w, None)) < TOL_REF["float32"]


@pytest.mark.parametrize("op", ["forward", "backward_data"])
@pytest.mark.parametrize("via, name", [("fold", "c3-11x11-stride4"), ("relayout", "c1-3x3"),
                                       ("relayout", "depthwise-5x5-stride2")])
def test_fold_and_relayout_wrap_the_direct_source(via, name, op):
    """Issue 17: the new sources are wrappable -- fold runs direct on the folded stride-1 problem (48 channels: the
    multi-channel kernels), relayout runs it in the other layout; the executor finds direct through the registry."""
    import cupy as cp
    from test_gpu_execute import _micro_plan

    from ucudnn.execute.executor import Executor
    from ucudnn.measure.sources.direct import DirectSource
    from ucudnn.measure.sources.fold import FoldSource
    from ucudnn.measure.sources.relayout import RelayoutSource

    p, sizes = CASES[name]
    wrapper = {"fold": FoldSource, "relayout": RelayoutSource}[via]([DirectSource(tune=False)])
    plan = _micro_plan(p, op, sizes, source=wrapper)
    assert {c.source for c in plan.configs} == {via} and all(c.extra["direct"] for c in plan.configs)
    x, w, dy = _tensors(p, seed=21)
    a, b = _operands(op, x, w, dy)
    out = cp.full(p.operand_shapes(op)[2], cp.nan, dtype=p.dtype)
    Executor(plan)(a, b, out)
    assert rel_err(out.get(), _reference(p, op, x, w, dy)) < TOL_REF["float32"]


def test_benchmark_table_and_wr_plan_run_direct_rows():
    """benchmark() with sources legacy + direct, the table through its JSON Schema, WR at a zero workspace limit,
    executed: whichever source the plan picks, the result is the convolution.  A float32 layer gets the seed
    kernel's row (forward, backward data), one implicit-GEMM row per tile (every op; backward data of this C = 1
    layer also in the scatter form) and, forward, one row per configuration of the single-channel rows kernel."""
    import cupy as cp

    import ucudnn
    from ucudnn.execute.executor import Executor
    from ucudnn.kernels.igemm import variants
    from ucudnn.measure.benchmarking import benchmark
    from ucudnn.measure.sources.direct import IGEMM, PLANE_ALGO, PLANE_CONFIGS, DirectSource
    from ucudnn.planning.table import BenchmarkTable
    from ucudnn.problem import KernelSpec

    p = ConvProblem(24, 1, 40, 40, 32, 3, 3, pad=(1, 1))
    specs = [KernelSpec(f"c1/{op}", op, p) for op in ("forward", "backward_data", "backward_filter")]
    table = benchmark(specs, "undivided", "strict", sources=["legacy", DirectSource(tune=False)], repeat=2)
    table = BenchmarkTable.from_dict(table.to_dict())
    for kb in table.kernels:
        direct = [m for m in kb.measurements if m.source == "direct"]
        seed = [(m.workspace_bytes, m.math_type) for m in direct if m.algo not in (IGEMM, PLANE_ALGO)]
        tiles = [(m.extra["direct"]["bn"], m.extra["direct"]["ks"], m.extra["direct"].get("scatter", False))
                 for m in direct if m.algo == IGEMM]
        rows = [tuple(m.extra["direct"][k] for k in ("rb", "kt", "kl")) for m in direct if m.algo == PLANE_ALGO]
        assert seed == ([] if kb.op == "backward_filter" else [(0, "FMA")])
        assert rows == (list(PLANE_CONFIGS) if kb.op == "forward" else [])
        assert tiles == variants(kb.op, p) and all(m.workspace_bytes == 0 for m in direct)
    plan = ucudnn.plan(table, "wr", workspace_limit=0, batch_policy="undivided")
    x, w, dy = _tensors(p, seed=22)
    for kp in plan.kernels:
        a, b = _operands(kp.op, x, w, dy)
        out = cp.full(p.operand_shapes(kp.op)[2], cp.nan, dtype=p.dtype)
        Executor(kp)(a, b, out)
        # backward filter sums 24 * 40 * 40 products per weight (legacy's or igemm's split order): 10x the bound
        tol = TOL_REF["float32"] * (10 if kp.op == "backward_filter" else 1)
        assert rel_err(out.get(), _reference(p, kp.op, x, w, dy)) < tol, kp.configs[0].source


def test_registry_finds_the_source():
    from ucudnn.measure.sources import registry

    assert registry.get("direct").name == "direct"


# ---- the depthwise kernel (direct-dw3, direct-dw5, direct-dw7) -----------------------------------------------------
DW_CASES = {
    "mobilenet-like": (ConvProblem(5, 8, 28, 28, 8, 3, 3, pad=(1, 1), groups=8), [3, 2]),     # 16-byte rows
    "odd-width": (ConvProblem(7, 6, 13, 15, 6, 3, 3, pad=(1, 1), groups=6), [4, 3]),         # element loads
    "three-segments": (ConvProblem(3, 2, 9, 260, 2, 3, 3, pad=(1, 1), groups=2), [2, 1]),    # 128-column edges
    "one-row": (ConvProblem(4, 3, 1, 129, 3, 3, 3, pad=(1, 1), groups=3), [4]),
    "narrow-7x7": (ConvProblem(5, 13, 7, 7, 13, 3, 3, pad=(1, 1), groups=13), [3, 2]),     # 16 groups a warp, idle ones
    "narrow-14x12": (ConvProblem(3, 9, 14, 12, 9, 3, 3, pad=(1, 1), groups=9), [3]),       # 4 lanes a row, 16-byte
    "5x5-efficientnet-like": (ConvProblem(5, 8, 28, 28, 8, 5, 5, pad=(2, 2), groups=8), [3, 2]),
    "5x5-odd-width": (ConvProblem(4, 6, 11, 133, 6, 5, 5, pad=(2, 2), groups=6), [3, 1]),  # 2 segments, elements
    "5x5-narrow-7x7": (ConvProblem(3, 13, 7, 7, 13, 5, 5, pad=(2, 2), groups=13), [3]),
    "7x7-convnext-like": (ConvProblem(5, 8, 28, 28, 8, 7, 7, pad=(3, 3), groups=8), [3, 2]),
    "7x7-odd-width": (ConvProblem(4, 6, 11, 133, 6, 7, 7, pad=(3, 3), groups=6), [3, 1]),   # 2 segments, elements
    "7x7-narrow-7x7": (ConvProblem(3, 13, 7, 7, 13, 7, 7, pad=(3, 3), groups=13), [3]),     # window wider than the row
    "7x7-one-row": (ConvProblem(2, 3, 1, 6, 3, 7, 7, pad=(3, 3), groups=3), [1, 1]),
    # stride 2: backward data and backward filter
    "s2-mobilenet-like": (ConvProblem(5, 8, 28, 28, 8, 3, 3, pad=(1, 1), stride=(2, 2), groups=8), [3, 2]),
    "s2-odd": (ConvProblem(4, 6, 15, 133, 6, 3, 3, pad=(1, 1), stride=(2, 2), groups=6), [3, 1]),
    "s2-5x5": (ConvProblem(3, 7, 14, 14, 7, 5, 5, pad=(2, 2), stride=(2, 2), groups=7), [2, 1]),
    "s2-5x5-odd": (ConvProblem(3, 5, 13, 29, 5, 5, 5, pad=(2, 2), stride=(2, 2), groups=5), [3]),
}


def _dw_plan(p: ConvProblem, op: str, sizes: list[int], rows: int, minb: int):
    from ucudnn.measure.sources.direct import configure_dw
    from ucudnn.planning.plan import KernelPlan, MicroConfig

    return KernelPlan(f"test/{op}", op, p, [MicroConfig.of(configure_dw(op, p.with_batch(mb), rows, minb))
                                            for mb in sizes])


@pytest.mark.parametrize("op", ["forward", "backward_data", "backward_filter"])
@pytest.mark.parametrize("rows, minb", [(4, 1), (16, 5), (0, 1), (0, 5)])   # 5 also on 5x5: slow (spills), still right
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", sorted(DW_CASES))
def test_dw_micro_batched_matches_cudnn_and_float64(name, dtype, rows, minb, op):
    """Micro-batched through the executor (backward filter accumulating across micro-batches)."""
    import cupy as cp

    from ucudnn.execute.executor import Executor

    base, sizes = DW_CASES[name]
    if base.stride == (2, 2) and op == "forward":
        pytest.skip("stride 2: backward data and filter only")
    p = _variant(base, dtype, "NCHW")
    x, w, dy = _tensors(p, seed=len(name) + rows)
    a, b = _operands(op, x, w, dy)
    if dtype == "float16" and (minb == 5 or op == "backward_filter"):
        pytest.skip("the launch bound variant and backward filter are float only")
    out = cp.full(p.operand_shapes(op)[2], cp.nan, dtype=p.dtype)
    Executor(_dw_plan(p, op, sizes, rows, minb if dtype == "float32" else 1))(a, b, out)
    got = out.get()
    assert not np.isnan(got).any(), "every output element is written"
    # backward filter sums n * h * w products per tap in its own order: 10x the bound
    assert rel_err(got, _reference(p, op, x, w, dy)) < TOL_REF[dtype] * (10 if op == "backward_filter" else 1)
    ref = _cudnn(p, op, a, b, cp.empty_like(out))
    if ref is not None:
        assert rel_err(got, ref.get()) < TOL_CUDNN[dtype] * (10 if op == "backward_filter" else 1)


def _alpha_beta_unaligned(p: ConvProblem, op: str, launch, seed: int) -> None:
    """``launch(a, b, out, alpha, beta)`` gives out = alpha * conv + beta * out, with the activation operand and
    out 16-byte aligned and 4 bytes off it (the kernels' element loads)."""
    import cupy as cp

    x, w, dy = _tensors(p, seed=seed)
    a, b = _operands(op, x, w, dy)
    shape = p.operand_shapes(op)[2]
    old = cp.random.default_rng(seed + 1).standard_normal(shape, dtype="float32")
    src = b if op == "backward_data" else a
    tol = TOL_REF["float32"] * (10 if op == "backward_filter" else 1)
    for shift in (0, 1):
        moved = cp.empty(src.size + 1, dtype=cp.float32)
        moved[shift:shift + src.size] = src.ravel()
        outbuf = cp.empty(old.size + 1, dtype=cp.float32)
        outbuf[shift:shift + old.size] = old.ravel()
        src_ptr = moved.data.ptr + 4 * shift
        ptrs = (a.data.ptr, src_ptr) if op == "backward_data" else (src_ptr, b.data.ptr)
        launch(*ptrs, outbuf.data.ptr + 4 * shift, 0.5, 2.0)
        got = outbuf[shift:shift + old.size].reshape(shape).get()
        expect = 0.5 * _reference(p, op, x, w, dy) + 2.0 * old.get()
        assert rel_err(got, expect) < tol, f"shift {shift}"


@pytest.mark.parametrize("op", ["forward", "backward_data", "backward_filter"])
@pytest.mark.parametrize("name", ["mobilenet-like", "5x5-efficientnet-like", "7x7-convnext-like", "s2-mobilenet-like"])
def test_dw_alpha_beta_and_unaligned_rows(name, op):
    """out = alpha * conv + beta * out, and operands 4 bytes off 16-byte alignment take the element loads."""
    from ucudnn.kernels.direct_dw import dw_launcher

    p = DW_CASES[name][0]
    if p.stride == (2, 2) and op == "forward":
        pytest.skip("stride 2: backward data and filter only")
    _alpha_beta_unaligned(p, op, dw_launcher(op, p, 16), seed=31)


def _replays_equal_to_float64(p: ConvProblem, op: str, plan, seed: int) -> None:
    """``plan`` run twice from one captured CUDA graph (no replay failure) gives the float64 reference's ``op``."""
    import cupy as cp

    from ucudnn.execute.executor import Executor

    x, w, dy = _tensors(p, seed=seed)
    a, b = _operands(op, x, w, dy)
    ex = Executor(plan, replay=True)
    out = cp.full(p.operand_shapes(op)[2], cp.nan, dtype=p.dtype)
    for _ in range(2):
        ex(a, b, out)
    assert ex.replay_failures == [] and len(ex._graphs) == 1
    tol = TOL_REF["float32"] * (10 if op == "backward_filter" else 1)
    assert rel_err(out.get(), _reference(p, op, x, w, dy)) < tol


@pytest.mark.parametrize("name", ["mobilenet-like", "5x5-efficientnet-like", "7x7-convnext-like", "s2-5x5"])
def test_dw_measured_rows_capture_and_replay(name):
    """The source measures every depthwise configuration of the layer's filter size as a zero-workspace row beside
    the seed kernel's, and a plan of them replays from a CUDA graph."""

    from ucudnn.measure.benchmarking import Buffers
    from ucudnn.measure.sources.base import BenchSettings
    from ucudnn.measure.sources.direct import DW_ALGOS, DW_CONFIGS, DirectSource

    p = DW_CASES[name][0]
    buf = Buffers(p)
    for op in ("backward_data", "backward_filter") if p.stride == (2, 2) else ("forward", "backward_data",
                                                                               "backward_filter"):
        ms, _ = DirectSource(tune=False).measure(op, p, buf.operands(op, p.n), 0, BenchSettings("strict", repeat=2))
        dw = [m for m in ms if m.algo == DW_ALGOS[p.r]]
        assert [(m.extra["direct"]["rows"], m.extra["direct"]["minb"]) for m in dw] == list(DW_CONFIGS[p.r])
        assert all(m.workspace_bytes == 0 and m.time_ms > 0 for m in dw)
        assert all(m.extra["deterministic"] is (op != "backward_filter") for m in dw)
        _replays_equal_to_float64(p, op, _dw_plan(p, op, DW_CASES[name][1], 0, 1), seed=33)


# ---- the depthwise NHWC kernels (direct_dw_nhwc: channels-last 3x3, 5x5, 7x7) -------------------------------------
DW_NHWC_CASES = {
    "convnext-like-7x7": (ConvProblem(5, 40, 28, 28, 40, 7, 7, pad=(3, 3), groups=40, layout="NHWC"), [3, 2]),
    "odd-channels-7x7": (ConvProblem(3, 6, 11, 13, 6, 7, 7, pad=(3, 3), groups=6, layout="NHWC"), [2, 1]),
    "plane-narrower-than-filter": (ConvProblem(4, 12, 3, 5, 12, 7, 7, pad=(3, 3), groups=12, layout="NHWC"), [4]),
    "mobilenet-like-3x3": (ConvProblem(5, 72, 14, 14, 72, 3, 3, pad=(1, 1), groups=72, layout="NHWC"), [3, 2]),
    "efficientnet-like-5x5": (ConvProblem(3, 36, 15, 9, 36, 5, 5, pad=(2, 2), groups=36, layout="NHWC"), [2, 1]),
    "one-channel-3x3": (ConvProblem(3, 1, 9, 9, 1, 3, 3, pad=(1, 1), groups=1, layout="NHWC"), [3]),
}


def _dw_nhwc_plan(p: ConvProblem, op: str, sizes: list[int], tile):
    from ucudnn.measure.sources.direct import configure_dw_nhwc
    from ucudnn.planning.plan import KernelPlan, MicroConfig

    return KernelPlan(f"test/{op}", op, p, [MicroConfig.of(configure_dw_nhwc(op, p.with_batch(mb), tile))
                                            for mb in sizes])


@pytest.mark.parametrize("op", ["forward", "backward_data", "backward_filter"])
@pytest.mark.parametrize("tile", [0, 1])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", sorted(DW_NHWC_CASES))
def test_dw_nhwc_micro_batched_matches_cudnn_and_float64(name, dtype, tile, op):
    """Micro-batched through the executor (backward filter accumulating across micro-batches; float16's sums in a
    float workspace), every tile."""
    import cupy as cp

    from ucudnn.execute.executor import Executor
    from ucudnn.kernels import direct_dw_nhwc as NH

    base, sizes = DW_NHWC_CASES[name]
    p = _variant(base, dtype, "NHWC")
    x, w, dy = _tensors(p, seed=len(name) + tile)
    a, b = _operands(op, x, w, dy)
    out = cp.full(p.operand_shapes(op)[2], cp.nan, dtype=p.dtype)
    Executor(_dw_nhwc_plan(p, op, sizes, NH.tiles_of(op)[tile]))(a, b, out)
    got = out.get()
    assert not np.isnan(got).any(), "every output element is written"
    bound = 10 if op == "backward_filter" else 1
    assert rel_err(got, _reference(p, op, x, w, dy)) < TOL_REF[dtype] * bound
    ref = _cudnn(p, op, a, b, cp.empty_like(out))
    if ref is not None:
        assert rel_err(got, ref.get()) < TOL_CUDNN[dtype] * bound


@pytest.mark.parametrize("op", ["forward", "backward_data", "backward_filter"])
def test_dw_nhwc_alpha_beta_and_unaligned_operands(op):
    """out = alpha * conv + beta * out, and operands 4 bytes off 16-byte alignment take the element loads."""
    from ucudnn.kernels import direct_dw_nhwc as NH

    p = DW_NHWC_CASES["convnext-like-7x7"][0]
    _alpha_beta_unaligned(p, op, NH.launcher(op, p, NH.tiles_of(op)[0]), seed=41)


def test_dw_nhwc_measured_rows_capture_and_replay():
    """The source measures every NHWC tile of the layer as a zero-workspace row, and a plan of them replays from a
    CUDA graph."""

    from ucudnn.kernels import direct_dw_nhwc as NH
    from ucudnn.measure.benchmarking import Buffers
    from ucudnn.measure.sources.base import BenchSettings
    from ucudnn.measure.sources.direct import DW_ALGOS, DirectSource

    p, sizes = DW_NHWC_CASES["convnext-like-7x7"]
    buf = Buffers(p)
    for op in ("forward", "backward_data", "backward_filter"):
        ms, _ = DirectSource(tune=False).measure(op, p, buf.operands(op, p.n), 0, BenchSettings("strict", repeat=2))
        dw = [m for m in ms if m.algo == DW_ALGOS[7]]
        assert [tuple(m.extra["direct"]["tile"]) for m in dw] == list(NH.tiles_of(op))
        assert all(m.workspace_bytes == 0 and m.time_ms > 0 for m in dw)
        _replays_equal_to_float64(p, op, _dw_nhwc_plan(p, op, sizes, NH.tiles_of(op)[1]), seed=43)


# ---- the single-channel forward by rows (direct-plane) --------------------------------------------------------
PLANE_CASES = {
    "mnist-like": (ConvProblem(9, 1, 28, 28, 40, 5, 5, pad=(2, 2)), [5, 4]),           # K past a filter block
    "odd-plane-3x2": (ConvProblem(7, 1, 13, 11, 12, 3, 2, pad=(1, 0)), [4, 3]),        # P, Q not multiples of rows
    "1x5-no-pad": (ConvProblem(5, 1, 9, 17, 8, 1, 5), [5]),
    "4x4-asymmetric-pad": (ConvProblem(6, 1, 20, 9, 20, 4, 4, pad=(2, 1)), [3, 3]),
    "k130-3x3": (ConvProblem(3, 1, 32, 32, 130, 3, 3, pad=(1, 1)), [2, 1]),
    "one-row-planes": (ConvProblem(300, 1, 1, 7, 8, 1, 3, pad=(0, 1)), [299, 1]),      # 38 images a block
    "wide-rows-3x5": (ConvProblem(3, 1, 9, 300, 12, 3, 5, pad=(1, 2)), [2, 1]),        # a block: one or two rows
    "c1-112-1x1": (ConvProblem(2, 1, 112, 112, 16, 1, 1), [2]),
}
PLANE_TEST_CONFIGS = [(4, 8, 4), (2, 8, 16), (1, 4, 1), (4, 4, 8)]


def _plane_plan(p: ConvProblem, sizes: list[int], config: tuple[int, int, int]):
    from ucudnn.measure.sources.direct import configure_plane
    from ucudnn.planning.plan import KernelPlan, MicroConfig

    return KernelPlan("test/forward", "forward", p, [MicroConfig.of(configure_plane(p.with_batch(mb), *config))
                                                     for mb in sizes])


@pytest.mark.parametrize("config", PLANE_TEST_CONFIGS)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", sorted(PLANE_CASES))
def test_plane_micro_batched_matches_cudnn_and_float64(name, dtype, config):
    """Micro-batched through the executor, unevenly: every y element written, equal to float64 and to cuDNN."""
    import cupy as cp
    from ucudnn.kernels.direct_plane import plane_refusal

    from ucudnn.execute.executor import Executor

    base, sizes = PLANE_CASES[name]
    p = _variant(base, dtype, "NCHW")
    if any(plane_refusal("forward", p.with_batch(mb), config) for mb in sizes):
        pytest.skip(f"{config}: {plane_refusal('forward', p, config)}")
    x, w, dy = _tensors(p, seed=len(name) + config[2])
    out = cp.full(p.y_shape(), cp.nan, dtype=p.dtype)
    Executor(_plane_plan(p, sizes, config))(x, w, out)
    got = out.get()
    assert not np.isnan(got).any(), "every output element is written"
    assert rel_err(got, _reference(p, "forward", x, w, dy)) < TOL_REF[dtype]
    ref = _cudnn(p, "forward", x, w, cp.empty_like(out))
    if ref is not None:
        assert rel_err(got, ref.get()) < TOL_CUDNN[dtype]


@pytest.mark.parametrize("name", ["mnist-like", "odd-plane-3x2", "one-row-planes"])
def test_plane_alpha_and_beta_scale_and_accumulate(name):
    """y = alpha * conv + beta * y into live data (alpha folded into the staged taps)."""
    import cupy as cp
    from ucudnn.kernels.direct_plane import plane_launcher

    p = PLANE_CASES[name][0]
    x, w, dy = _tensors(p, seed=41)
    old = cp.random.default_rng(42).standard_normal(p.y_shape(), dtype="float32")
    for alpha, beta in ((0.5, 2.0), (1.0, 1.0), (-3.0, 0.0)):
        out = old.copy()
        plane_launcher(p, 4, 8, 2)(x.data.ptr, w.data.ptr, out.data.ptr, alpha, beta)
        expect = alpha * _reference(p, "forward", x, w, dy) + beta * old.get()
        assert rel_err(out.get(), expect) < TOL_REF["float32"], (alpha, beta)


def test_plane_rows_are_measured_and_replay_from_a_cuda_graph():
    """The source measures one zero-workspace, deterministic row per rows-kernel configuration of a 28 x 28
    single-channel forward (none for backward data), and a plan of them replays from a CUDA graph."""
    import cupy as cp

    from ucudnn.execute.executor import Executor
    from ucudnn.measure.benchmarking import Buffers
    from ucudnn.measure.sources.base import BenchSettings
    from ucudnn.measure.sources.direct import PLANE_ALGO, PLANE_CONFIGS, DirectSource

    p, sizes = PLANE_CASES["mnist-like"]
    buf = Buffers(p)
    for op in ("forward", "backward_data"):
        ms, _ = DirectSource(tune=False).measure(op, p, buf.operands(op, p.n), 0, BenchSettings("strict", repeat=2))
        rows = [m for m in ms if m.algo == PLANE_ALGO]
        if op == "backward_data":
            assert rows == []
            continue
        assert [tuple(m.extra["direct"][k] for k in ("rb", "kt", "kl")) for m in rows] == list(PLANE_CONFIGS)
        assert all(m.workspace_bytes == 0 and m.time_ms > 0 and m.extra["deterministic"] for m in rows)
    x, w, dy = _tensors(p, seed=43)
    ex = Executor(_plane_plan(p, sizes, PLANE_CONFIGS[0]), replay=True)
    out = cp.full(p.y_shape(), cp.nan, dtype=p.dtype)
    for _ in range(2):
        ex(x, w, out)
    assert ex.replay_failures == [] and len(ex._graphs) == 1
    assert rel_err(out.get(), _reference(p, "forward", x, w, dy)) < TOL_REF["float32"]
