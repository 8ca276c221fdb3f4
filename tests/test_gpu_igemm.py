"""The direct source's implicit-GEMM kernel (``direct-igemm``, kernels/igemm.cu) on the GPU (skipped without one):
all three ops against a float64 reference and undivided cuDNN, micro-batched through the Executor (backward filter
accumulating across micro-batches), alpha / beta, misaligned operands (the scalar-load kernels), a channel slice of
y, the deterministic unsplit backward filter, CUDA-graph capture, and the measured rows.

Cases: C = 1 and 3 (AlexNet-like 11x11 stride 4), non-square filters, pads 0-3, strides 1-4, dilation 2, odd
batches split unevenly, channel counts that are and are not multiples of 4 and 128; NCHW and NHWC, float32.
"""
from __future__ import annotations

import numpy as np
import pytest
from cudnn_reference import undivided

from ucudnn.problem import ConvProblem

pytestmark = pytest.mark.gpu

CASES = {
    "c1-3x3": (ConvProblem(7, 1, 29, 31, 16, 3, 3, pad=(1, 1)), [4, 3]),
    "c3-11x11-stride4": (ConvProblem(5, 3, 47, 47, 16, 11, 11, pad=(2, 2), stride=(4, 4)), [3, 2]),
    "c3-5x3-stride2": (ConvProblem(7, 3, 21, 19, 10, 5, 3, pad=(2, 1), stride=(2, 2)), [4, 2, 1]),
    "multi-stride3-pad0": (ConvProblem(3, 20, 23, 23, 24, 3, 3, stride=(3, 3)), [2, 1]),
    "multi-5x5": (ConvProblem(5, 64, 13, 13, 136, 5, 5, pad=(2, 2)), [5]),
    "multi-1x1-stride2": (ConvProblem(9, 32, 9, 9, 40, 1, 1, stride=(2, 2)), [8, 1]),
    "dilated-3x2": (ConvProblem(4, 12, 15, 14, 20, 3, 2, pad=(2, 1), dilation=(2, 2)), [3, 1]),
    "wide-k": (ConvProblem(2, 8, 7, 7, 260, 3, 3, pad=(1, 1)), [2]),
    "c96-k100-5x5": (ConvProblem(3, 96, 11, 9, 100, 5, 5, pad=(2, 2)), [2, 1]),
}
LAYOUTS = ["NCHW", "NHWC"]
TOL_REF = 2e-6      # relative 2-norm error against float64: FP32 FMA sums
TOL_CUDNN = 2e-5


def rel_err(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _in(p: ConvProblem, layout: str) -> ConvProblem:
    return ConvProblem(p.n, p.c, p.h, p.w, p.k, p.r, p.s, p.pad, p.stride, p.dilation, p.groups, p.dtype, layout)


def _tensors(p: ConvProblem, seed: int):
    import cupy as cp

    rng = cp.random.default_rng(seed)
    return tuple(rng.standard_normal(shape, dtype="float32") for shape in (p.x_shape(), p.w_shape(), p.y_shape()))


def _operands(op: str, x, w, dy):
    return {"forward": (x, w), "backward_data": (w, dy), "backward_filter": (x, dy)}[op]


def _plan(p: ConvProblem, op: str, sizes: list[int], numerics: str = "strict", bn: int | None = None,
          ks: int = 1, scatter: bool = False):
    from ucudnn.measure.sources.direct import DirectSource
    from ucudnn.planning.plan import KernelPlan, MicroConfig

    src = DirectSource(tune=False)
    return KernelPlan(f"test/{op}", op, p, [MicroConfig.of(src.configure_igemm(op, p.with_batch(mb), numerics,
                                                                               bn, ks, scatter))
                                            for mb in sizes])


def _reference(p: ConvProblem, op: str, a, b) -> np.ndarray:
    from ucudnn.kernels.igemm import reference

    return reference(op, p, a.get(), b.get())


@pytest.mark.parametrize("op", ["forward", "backward_data", "backward_filter"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_micro_batched_igemm_matches_float64_and_cudnn(name, layout, op):
    import cupy as cp

    from ucudnn.errors import CudnnError
    from ucudnn.execute.executor import Executor

    base, sizes = CASES[name]
    p = _in(base, layout)
    x, w, dy = _tensors(p, seed=len(name))
    a, b = _operands(op, x, w, dy)
    plan = _plan(p, op, sizes)
    assert plan.workspace_bytes == 0
    out = cp.full(p.operand_shapes(op)[2], cp.nan, dtype="float32")
    Executor(plan)(a, b, out)
    got = out.get()
    assert not np.isnan(got).any(), "every output element is written"
    assert rel_err(got, _reference(p, op, a, b)) < TOL_REF
    try:
        ref = undivided(p, op, a, b, cp.empty_like(out))
    except CudnnError:
        return
    assert rel_err(got, ref.get()) < TOL_CUDNN


@pytest.mark.parametrize("tile", [(128, 2), (96, 1), (96, 2), (64, 1), (64, 2)], ids=lambda t: f"bn{t[0]}-ks{t[1]}")
@pytest.mark.parametrize("op", ["forward", "backward_data", "backward_filter"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", ["c3-11x11-stride4", "multi-5x5", "wide-k", "dilated-3x2", "c96-k100-5x5"])
def test_every_tile_computes_the_same_convolution(name, layout, op, tile):
    """The 96- and 64-wide tiles and two stages per buffer, forced on shapes of every kind (columns below, between
    and above one tile's width, reductions that end mid-stage), micro-batched."""
    import cupy as cp

    from ucudnn.execute.executor import Executor

    base, sizes = CASES[name]
    p = _in(base, layout)
    x, w, dy = _tensors(p, seed=len(name) + 7)
    a, b = _operands(op, x, w, dy)
    plan = _plan(p, op, sizes, bn=tile[0], ks=tile[1])
    assert {c.extra["direct"]["bn"] for c in plan.configs} == {tile[0]}
    out = cp.full(p.operand_shapes(op)[2], cp.nan, dtype="float32")
    Executor(plan)(a, b, out)
    got = out.get()
    assert not np.isnan(got).any(), "every output element is written"
    assert rel_err(got, _reference(p, op, a, b)) < TOL_REF


@pytest.mark.parametrize("tile", [(128, 1), (128, 2), (96, 1), (96, 2), (64, 1), (64, 2)])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_backward_datas_scatter_form_matches_float64_micro_batched_with_alpha_and_beta(name, layout, tile):
    """The scatter form (dy w added atomically into dx) on every case and tile, micro-batched unevenly, blending
    0.5 * dx' + 2 * dx into an output that holds data."""
    import cupy as cp

    from ucudnn.execute.executor import Executor

    base, sizes = CASES[name]
    p = _in(base, layout)
    x, w, dy = _tensors(p, seed=len(name) + 11)
    plan = _plan(p, "backward_data", sizes, bn=tile[0], ks=tile[1], scatter=True)
    assert all(c.extra["direct"]["scatter"] and not c.extra["deterministic"] for c in plan.configs)
    old = cp.random.default_rng(5).standard_normal(x.shape, dtype="float32")
    out = old.copy()
    Executor(plan)(w, dy, out, alpha=0.5, beta=2.0)
    want = 0.5 * _reference(p, "backward_data", w, dy) + 2.0 * old.get().astype(np.float64)
    assert rel_err(out.get(), want) < TOL_REF


def test_the_scatter_form_is_refused_under_deterministic_numerics_and_replays_captured():
    import cupy as cp

    from ucudnn.errors import InputError
    from ucudnn.execute.executor import Executor

    p = _in(CASES["c3-11x11-stride4"][0], "NHWC")
    with pytest.raises(InputError) as e:
        _plan(p, "backward_data", [p.n], "strict-deterministic", scatter=True)
    assert e.value.field == "scatter"
    x, w, dy = _tensors(p, seed=3)
    out = cp.zeros(x.shape, dtype="float32")
    ex = Executor(_plan(p, "backward_data", [3, 2], scatter=True), replay=True)
    ex(w, dy, out)
    dy[...] = cp.random.default_rng(23).standard_normal(dy.shape, dtype="float32")
    ex(w, dy, out)
    assert ex.replay_failures == [] and len(ex._graphs) == 1
    assert rel_err(out.get(), _reference(p, "backward_data", w, dy)) < TOL_REF


@pytest.mark.parametrize("op", ["forward", "backward_data", "backward_filter"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_alpha_and_beta_scale_and_accumulate(layout, op):
    import cupy as cp

    from ucudnn.execute.executor import Executor

    base, sizes = CASES["multi-5x5"]
    p = _in(base, layout)
    x, w, dy = _tensors(p, seed=11)
    a, b = _operands(op, x, w, dy)
    old = cp.random.default_rng(12).standard_normal(p.operand_shapes(op)[2], dtype="float32")
    out = old.copy()
    Executor(_plan(p, op, [3, 2]))(a, b, out, alpha=0.5, beta=2.0)
    assert rel_err(out.get(), 0.5 * _reference(p, op, a, b) + 2.0 * old.get()) < TOL_REF


@pytest.mark.parametrize("op", ["forward", "backward_data", "backward_filter"])
def test_misaligned_operands_take_the_scalar_loads(op):
    """Operands 4 bytes past a 16-byte boundary: the launch must not use its float4 loads."""
    import cupy as cp

    from ucudnn.kernels.igemm import launcher

    p = ConvProblem(3, 16, 11, 11, 24, 3, 3, pad=(1, 1), layout="NHWC")
    x, w, dy = _tensors(p, seed=3)
    a, b = _operands(op, x, w, dy)
    shifted = []
    for t in (a, b):
        buf = cp.zeros(t.size + 1, dtype="float32")
        buf[1:] = t.ravel()
        shifted.append(buf)
    out = cp.zeros(int(np.prod(p.operand_shapes(op)[2])) + 1, dtype="float32")
    launcher(op, p)(shifted[0].data.ptr + 4, shifted[1].data.ptr + 4, out.data.ptr + 4, 1.0, 0.0)
    assert rel_err(out[1:].get(), _reference(p, op, a, b).ravel()) < TOL_REF


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("op", ["forward", "backward_filter", "backward_data"])
def test_a_channel_slice_runs_on_the_wider_tensors_view(layout, op):
    """k of k_total output channels: y / dy keep the wider tensor's strides, w / dw are the slice's filters;
    backward data of a slice adds into dx (the plan's later slices run with beta = 1)."""
    import cupy as cp

    from ucudnn.kernels.igemm import launcher

    whole = ConvProblem(3, 8, 10, 9, 12, 3, 3, pad=(1, 1), layout=layout)
    part = whole.with_channels(4, 12)
    x, w, dy = _tensors(whole, seed=5)
    k0 = 4
    y_off = k0 * (whole.p * whole.q if layout == "NCHW" else 1) * 4
    w_part = w[k0:k0 + 4]
    if op == "forward":
        y = cp.zeros_like(dy)
        launcher(op, part)(x.data.ptr, w_part.data.ptr, y.data.ptr + y_off, 1.0, 0.0)
        ref = _reference(whole, op, x, w)
        sl = (slice(None), slice(k0, k0 + 4)) if layout == "NCHW" else (Ellipsis, slice(k0, k0 + 4))
        assert rel_err(y.get()[sl], ref[sl]) < TOL_REF
        rest = np.ones(y.shape, bool)
        rest[sl] = False
        assert not y.get()[rest].any()
    elif op == "backward_filter":
        dw = cp.zeros_like(w_part)
        launcher(op, part)(x.data.ptr, dy.data.ptr + y_off, dw.data.ptr, 1.0, 0.0)
        assert rel_err(dw.get(), _reference(whole, op, x, dy)[k0:k0 + 4]) < TOL_REF
    else:
        dx = cp.zeros_like(x)
        for k in range(0, 12, 4):
            off = k * (whole.p * whole.q if layout == "NCHW" else 1) * 4
            launcher(op, part)(cp.ascontiguousarray(w[k:k + 4]).data.ptr, dy.data.ptr + off, dx.data.ptr, 1.0,
                               0.0 if k == 0 else 1.0)
        assert rel_err(dx.get(), _reference(whole, op, w, dy)) < TOL_REF


def test_deterministic_numerics_run_backward_filter_unsplit_and_repeatably():
    import cupy as cp

    from ucudnn.execute.executor import Executor

    p = ConvProblem(16, 32, 13, 13, 48, 3, 3, pad=(1, 1), layout="NHWC")
    plan = _plan(p, "backward_filter", [16], "strict-deterministic")
    assert all(c.extra["direct"]["splits"] == 1 and c.extra["deterministic"] for c in plan.configs)
    split = _plan(p, "backward_filter", [16])
    assert split.configs[0].extra["direct"]["splits"] > 1 and not split.configs[0].extra["deterministic"]
    x, w, dy = _tensors(p, seed=9)
    runs = []
    for _ in range(2):
        dw = cp.zeros_like(w)
        Executor(plan)(x, dy, dw)
        runs.append(dw.get())
    assert np.array_equal(runs[0], runs[1])
    assert rel_err(runs[0], _reference(p, "backward_filter", x, dy)) < TOL_REF


@pytest.mark.parametrize("op", ["forward", "backward_data", "backward_filter"])
def test_captured_plan_replays_with_new_inputs(op):
    import cupy as cp

    from ucudnn.execute.executor import Executor

    p = ConvProblem(6, 16, 12, 12, 32, 3, 3, pad=(1, 1), layout="NHWC")
    x, w, dy = _tensors(p, seed=21)
    a, b = _operands(op, x, w, dy)
    out = cp.zeros(p.operand_shapes(op)[2], dtype="float32")
    ex = Executor(_plan(p, op, [4, 2]), replay=True)
    ex(a, b, out)
    a[...] = cp.random.default_rng(22).standard_normal(a.shape, dtype="float32")
    ex(a, b, out)
    assert ex.replay_failures == [] and len(ex._graphs) == 1
    assert rel_err(out.get(), _reference(p, op, a, b)) < TOL_REF


@pytest.mark.parametrize("op", ["forward", "backward_data", "backward_filter"])
def test_the_source_measures_an_igemm_row_per_op(op):
    import cupy as cp

    from ucudnn.kernels.igemm import variants
    from ucudnn.measure.sources.base import BenchSettings, Operands
    from ucudnn.measure.sources.direct import IGEMM, DirectSource

    p = ConvProblem(8, 64, 13, 13, 128, 3, 3, pad=(1, 1), layout="NHWC")
    x, w, dy = _tensors(p, seed=1)
    a, b = _operands(op, x, w, dy)
    out = cp.zeros(p.operand_shapes(op)[2], dtype="float32")
    ms, sk = DirectSource(tune=False).measure(op, p, Operands(a.data.ptr, b.data.ptr, out.data.ptr), 0,
                                              BenchSettings("strict"))
    rows = [m for m in ms if m.algo == IGEMM]
    assert [(m.extra["direct"]["bn"], m.extra["direct"]["ks"], m.extra["direct"].get("scatter", False))
            for m in rows] == variants(op, p)
    assert all(m.time_ms > 0 and m.workspace_bytes == 0 and m.math_type == "FMA" and m.source == "direct"
               for m in rows)
    assert not [s for s in sk if s.algo == IGEMM]
