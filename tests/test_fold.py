"""The fold source without a GPU: which problems fold, the folded problem, its exactness, workspace and wiring.

The kernels are checked against the same NumPy fold (numpy_fold.py) on the GPU (test_gpu_fold.py), and folded plans against
undivided cuDNN there.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy_fold import nchw_fold
from ucudnn.kernels.fold import FoldGeometry, launchers

from ucudnn.errors import InputError, UcudnnError
from ucudnn.measure.sources.base import Operands
from ucudnn.measure.sources.fold import (FoldSource, fold_layouts, fold_refusal, folded_problem, geometries,
                                         segments)
from ucudnn.planning.planner import plan
from ucudnn.planning.table import BenchmarkTable, KernelBench, Measurement
from ucudnn.problem import ConvProblem

FIXTURES = Path(__file__).parent / "fixtures"
CONV1 = ConvProblem(64, 3, 227, 227, 96, 11, 11, stride=(4, 4))                   # AlexNet
RESNET_CONV1 = ConvProblem(32, 3, 224, 224, 64, 7, 7, pad=(3, 3), stride=(2, 2), layout="NHWC", dtype="float16")


def test_alexnet_conv1_folds_into_a_3x3_stride_1_convolution_over_48_channels_with_the_same_output():
    f = folded_problem(CONV1)
    assert (f.n, f.c, f.h, f.w, f.k, f.r, f.s) == (64, 48, 57, 57, 96, 3, 3)
    assert (f.pad, f.stride, f.dilation) == ((0, 0), (1, 1), (1, 1))
    assert (f.p, f.q, f.layout, f.dtype) == (CONV1.p, CONV1.q, CONV1.layout, CONV1.dtype)


def test_a_padded_stride_2_first_layer_folds_its_padding_into_the_input():
    f = folded_problem(RESNET_CONV1)
    assert (f.c, f.h, f.w, f.r, f.s, f.pad) == (12, 115, 115, 4, 4, (0, 0))
    assert (f.p, f.q, f.layout, f.dtype) == (112, 112, "NHWC", "float16")


@pytest.mark.parametrize("problem, why", [
    (ConvProblem(8, 64, 56, 56, 64, 3, 3, pad=(1, 1)), "stride 1"),
    (ConvProblem(8, 3, 32, 32, 8, 3, 3, stride=(2, 2), dilation=(2, 2)), "dilated"),
    (ConvProblem(8, 4, 32, 32, 8, 3, 3, stride=(2, 2), groups=2), "grouped"),
    (ConvProblem(8, 3, 32, 32, 8, 3, 3, stride=(2, 2), dtype="bfloat16"), "bfloat16"),
    (ConvProblem(8, 256, 28, 28, 512, 1, 1, stride=(2, 2)), "exceed 64 folded channels"),
])
def test_problems_that_would_not_gain_are_not_folded_and_say_why(problem, why):
    assert why in fold_refusal(problem)
    with pytest.raises(InputError, match=why):
        folded_problem(problem)


def _conv(x: np.ndarray, w: np.ndarray, stride, pad) -> np.ndarray:
    """float64 direct convolution (cross-correlation), NCHW."""
    x = np.pad(x, ((0, 0), (0, 0), (pad[0],) * 2, (pad[1],) * 2))
    k, _, r, s = w.shape
    p, q = (x.shape[2] - r) // stride[0] + 1, (x.shape[3] - s) // stride[1] + 1
    y = np.zeros((x.shape[0], k, p, q))
    for i in range(r):
        for j in range(s):
            patch = x[:, :, i:i + stride[0] * (p - 1) + 1:stride[0], j:j + stride[1] * (q - 1) + 1:stride[1]]
            y += np.einsum("nchw,kc->nkhw", patch, w[:, :, i, j])
    return y


@settings(max_examples=40, deadline=None)
@given(c=st.integers(1, 4), h=st.integers(5, 19), w=st.integers(5, 19), r=st.integers(1, 7), s=st.integers(1, 7),
       sh=st.integers(1, 4), sw=st.integers(1, 4), ph=st.integers(0, 3), pw=st.integers(0, 3))
def test_the_folded_convolution_computes_exactly_the_strided_one(c, h, w, r, s, sh, sw, ph, pw):
    if (sh, sw) == (1, 1) or r > h + 2 * ph or s > w + 2 * pw:
        return
    p = ConvProblem(2, c, h, w, 3, r, s, pad=(ph, pw), stride=(sh, sw))
    rng = np.random.default_rng(0)
    x, wt = rng.standard_normal(p.x_shape()), rng.standard_normal(p.w_shape())
    xg, wg = geometries(p)
    f = folded_problem(p)
    xf, wf = nchw_fold(x, xg), nchw_fold(wt, wg)
    assert xf.shape == f.x_shape() and wf.shape == f.w_shape()
    np.testing.assert_allclose(_conv(xf, wf, (1, 1), (0, 0)), _conv(x, wt, p.stride, p.pad), rtol=1e-10, atol=1e-10)


def test_the_workspace_added_is_the_folded_x_and_w_each_aligned_and_never_y():
    up = lambda n: -(-n // 256) * 256  # noqa: E731
    x, w = up(64 * 48 * 57 * 57 * 4), up(96 * 48 * 3 * 3 * 4)
    assert segments("forward", CONV1) == {"x": x, "w": w}
    assert segments("backward_data", CONV1) == {"w": w, "x": x}
    assert segments("backward_filter", CONV1) == {"x": x, "w": w}


def test_folding_into_the_other_layout_stages_y_too_and_folds_x_and_w_straight_into_that_layout():
    up = lambda n: -(-n // 256) * 256  # noqa: E731
    f = folded_problem(CONV1, "NHWC")
    assert (f.layout, f.c, f.h, f.r) == ("NHWC", 48, 57, 3) and f.x_shape() == (64, 57, 57, 48)
    assert segments("backward_filter", CONV1, "NHWC") == {"x": up(64 * 48 * 57 * 57 * 4), "y": up(64 * 96 * 55 * 55 * 4),
                                                          "w": up(96 * 48 * 3 * 3 * 4)}
    xg, wg = geometries(CONV1, "NHWC")
    assert (xg.layout, xg.folded_layout, xg.folded_shape(2)) == ("NCHW", "NHWC", (2, 57, 57, 48))
    assert wg.plain_shape(96) == (96, 3, 11, 11) and wg.folded_shape(96) == (96, 3, 3, 48)


def test_fold_launchers_refuse_element_sizes_they_have_no_kernel_for():
    xg, _ = geometries(CONV1)
    with pytest.raises(InputError, match="8 bytes"):
        launchers(xg, 4, 8)
    with pytest.raises(InputError, match="NCHW or NHWC"):
        FoldGeometry(3, 8, 8, (2, 2), (0, 0), (4, 4), "CHWN")


def test_preparing_prepares_the_inner_configuration_on_the_folded_problem_without_the_folded_bytes(inner):
    moved = sum(segments("backward_data", CONV1).values())
    via = {"layout": "NHWC", "source": "graph"}   # a wrapped relayout's own record passes through untouched
    cfg = Measurement(64, 1, "DEFAULT", 1.0, moved + 4096, "fold", None,
                      {"fold": {"stride": [4, 4], "source": inner.name}, "via": via})
    FoldSource().prepare("backward_data", CONV1, cfg)
    [(op, problem, inner_cfg)] = inner.prepared
    assert (op, problem) == ("backward_data", folded_problem(CONV1))
    assert (inner_cfg.source, inner_cfg.algo, inner_cfg.workspace_bytes) == (inner.name, 1, 4096)
    assert "fold" not in inner_cfg.extra and inner_cfg.extra["via"] == via


def test_a_configuration_folded_into_the_other_layout_prepares_its_inner_one_there(inner):
    moved = sum(segments("forward", CONV1, "NHWC").values())
    cfg = Measurement(64, 1, "DEFAULT", 1.0, moved + 512, "fold", None,
                      {"fold": {"stride": [4, 4], "layout": "NHWC", "source": inner.name}})
    FoldSource().prepare("forward", CONV1, cfg)
    [(_, problem, inner_cfg)] = inner.prepared
    assert problem == folded_problem(CONV1, "NHWC") and inner_cfg.workspace_bytes == 512


def test_a_fold_source_folds_into_the_same_or_the_other_layout_and_nothing_else():
    assert FoldSource(layouts=["other", "same"]).layouts == ("other", "same")
    with pytest.raises(ValueError, match="layouts"):
        FoldSource(layouts=["CHWN"])
    with pytest.raises(ValueError, match="layouts"):
        FoldSource(layouts=[])


@pytest.mark.parametrize("dtype, numerics, layout, layouts", [
    ("float32", "strict", "NCHW", ("same",)),               # FMA only: NCHW, where cuDNN keeps FFT and Winograd
    ("float32", "strict", "NHWC", ("other",)),
    ("float32", "strict-deterministic", "NCHW", ("same",)),
    ("float32", "tf32", "NCHW", ("same", "other")),         # tensor cores: NCHW TF32 folds best into NHWC
    ("float32", "default", "NHWC", ("same", "other")),
    ("float16", "default", "NHWC", ("same", "other")),
    ("float16", "strict", "NCHW", ("same", "other")),       # FP32 accumulation, still on tensor cores
])
def test_by_default_a_fold_measures_nchw_alone_where_the_math_is_fma_only(dtype, numerics, layout, layouts):
    problem = ConvProblem(64, 3, 227, 227, 96, 11, 11, stride=(4, 4), dtype=dtype, layout=layout)
    assert FoldSource().layouts is None
    assert fold_layouts(dtype, numerics, layout) == layouts
    assert FoldSource().layouts_for(problem, numerics) == layouts
    assert FoldSource(layouts=["other"]).layouts_for(problem, numerics) == ("other",)   # given layouts win


@pytest.mark.parametrize("name, limits", [
    ("alexnet-b256-float32-NCHW-strict-legacy-graph-fold-unpruned-h100", (0, 8 << 20, 64 << 20, 256 << 20, 4 << 30)),
    ("alexnet-b256-float32-NHWC-strict-legacy-graph-relayout-fold-replay-midpoints-h100", (8 << 20, 64 << 20, 256 << 20)),
])
def test_on_the_recorded_fp32_strict_tables_no_plan_takes_an_nhwc_fold(name, limits):
    """The evidence behind :func:`fold_layouts`' FMA-only default: H100 AlexNet b256 FP32 strict tables (NCHW, and
    NHWC whose folds also went into NCHW), planned with and without the NHWC folds' rows: the same plans, WR at each
    limit and WD."""
    from ucudnn.measure.pruning import default_fold_rows

    table = BenchmarkTable.load(FIXTURES / f"{name}.json.gz")
    nhwc = [m for k in table.kernels for m in k.measurements if m.source == "fold" and m.extra["fold"]["layout"] == "NHWC"]
    assert nhwc   # the table did measure them
    nchw_only = default_fold_rows(table)
    assert not [m for k in nchw_only.kernels for m in k.measurements
                if m.source == "fold" and m.extra["fold"]["layout"] == "NHWC"]
    assert [m for k in nchw_only.kernels for m in k.measurements if m.source == "fold"]
    for limit in limits:
        full = plan(table, "wr", workspace_limit=limit)
        assert plan(nchw_only, "wr", workspace_limit=limit).total_time_ms == pytest.approx(full.total_time_ms)
    n = len(table.kernels)
    assert (plan(nchw_only, "wd", total_workspace=n * (64 << 20)).total_time_ms
            == pytest.approx(plan(table, "wd", total_workspace=n * (64 << 20)).total_time_ms))


def test_run_refuses_a_workspace_too_small_for_the_folded_operands(inner):
    cfg = Measurement(64, 1, "DEFAULT", 1.0, 0, "fold", None, {"fold": {"stride": [4, 4], "source": inner.name}})
    with pytest.raises(UcudnnError, match="workspace for the folded operands"):
        FoldSource().run("forward", CONV1, cfg, Operands(0, 0, 0), 0, 1 << 20, 1.0, 0.0)


def test_run_refuses_a_configuration_measured_for_another_stride(inner):
    cfg = Measurement(64, 1, "DEFAULT", 1.0, 0, "fold", None, {"fold": {"stride": [2, 2], "source": inner.name}})
    with pytest.raises(UcudnnError, match="stride"):
        FoldSource().run("forward", CONV1, cfg, Operands(0, 0, 0), 0, 1 << 30, 1.0, 0.0)


def test_fold_by_name_wraps_the_other_sources_named_including_a_relayout():
    from ucudnn.measure.benchmarking import resolve_sources
    from ucudnn.measure.sources import registry

    legacy, relayout, fold = resolve_sources("legacy,relayout,fold")
    assert [s.name for s in fold.inner] == ["legacy", "relayout"] and fold.inner[1] is relayout
    assert [s.name for s in relayout.inner] == ["legacy"]
    assert registry.get("fold") is fold
    (alone,) = resolve_sources("fold")
    assert [s.name for s in alone.inner] == ["legacy"]
    with pytest.raises(ValueError):
        FoldSource([FoldSource()])


def _table(measurements):
    return BenchmarkTable("NVIDIA H100 80GB HBM3", 91900,
                          [KernelBench("conv1/forward", "forward", CONV1, measurements, [], 1.0)], "tf32")


def test_a_table_with_fold_measurements_is_valid_and_round_trips():
    info = {"stride": [4, 4], "source": "graph", "inner_time_ms": 0.09}
    t = _table([Measurement(64, 1, "DEFAULT", 3.0, 0),
                Measurement(64, "eng1", "TENSOR_OP", 0.4, 40 << 20, "fold", None, {"fold": info})])
    m = BenchmarkTable.loads(t.to_json()).kernels[0].measurements[1]   # validated against the schema
    assert (m.source, m.extra["fold"]) == ("fold", info)


def test_a_fold_measurement_without_its_inner_source_is_refused_naming_the_field():
    from ucudnn.errors import TableError

    t = _table([Measurement(64, 1, "DEFAULT", 1.0, 0, "fold", None, {"fold": {"stride": [4, 4]}})])
    with pytest.raises(TableError, match=r"measurements\[0\]\.fold"):
        BenchmarkTable.loads(t.to_json())


def test_the_planner_takes_a_fold_configuration_only_where_it_fits_and_wins():
    info = {"stride": [4, 4], "source": "legacy"}
    t = _table([Measurement(64, 1, "DEFAULT", 1.4, 0), Measurement(32, 1, "DEFAULT", 0.72, 0),
                Measurement(64, 1, "TENSOR_OP", 0.4, 50 << 20, "fold", None, {"fold": info}),
                Measurement(32, 1, "TENSOR_OP", 0.2, 26 << 20, "fold", None, {"fold": info})])
    wide = plan(t, "wr", workspace_limit=64 << 20, batch_policy="powerOfTwo")
    assert [(c.micro_batch, c.source) for c in wide.kernels[0].configs] == [(64, "fold")]
    narrow = plan(t, "wr", workspace_limit=32 << 20, batch_policy="powerOfTwo")
    assert [(c.micro_batch, c.source) for c in narrow.kernels[0].configs] == [(32, "fold")] * 2
    tiny = plan(t, "wr", workspace_limit=16 << 20, batch_policy="powerOfTwo")
    assert {c.source for c in tiny.kernels[0].configs} == {"legacy"}


# --- a table recorded on an H100 (benchmarks/graph_wr.py --fold legacy,graph,relayout --tables-out) ---------
RECORDED = (__import__("pathlib").Path(__file__).parent / "fixtures"
            / "alexnet-b256-float32-NHWC-tf32-legacy-graph-fold-h100.json.gz")


def test_recorded_fold_measurements_are_conv1s_and_count_the_folded_operands():
    t = BenchmarkTable.load(RECORDED)
    folded = [(k, m) for k in t.kernels for m in k.measurements if m.source == "fold"]
    assert folded and {k.name.split("/")[0] for k, _ in folded} == {"conv1"}   # the only strided layer
    assert {m.extra["fold"]["source"] for _, m in folded} >= {"legacy", "graph", "relayout"}
    for k, m in folded:
        assert m.extra["fold"]["stride"] == [4, 4]
        assert m.workspace_bytes >= sum(segments(k.op, k.problem.with_batch(m.micro_batch)).values())
    assert all(any(s.reason.startswith("fold: stride 1") for s in k.skipped) for k in t.kernels
               if k.name.split("/")[0] != "conv1")


def test_wr_on_the_recorded_table_folds_conv1_within_the_limit_and_plans_faster():
    t = BenchmarkTable.load(RECORDED)
    wr = plan(t, "wr", workspace_limit=64 << 20, batch_policy="powerOfTwo")
    assert all(k.workspace_bytes <= 64 << 20 and k.batch == 256 for k in wr.kernels)
    conv1 = [k for k in wr.kernels if k.name.startswith("conv1/")]
    assert conv1 and all(c.source == "fold" for k in conv1 for c in k.configs)
    native = BenchmarkTable(t.device, t.cudnn_version, [
        KernelBench(k.name, k.op, k.problem, [m for m in k.measurements if m.source != "fold"], k.skipped,
                    k.benchmark_seconds) for k in t.kernels], t.numerics, dict(t.extra))
    without = plan(native, "wr", workspace_limit=64 << 20, batch_policy="powerOfTwo")
    assert sum(k.time_ms for k in conv1) < 0.6 * sum(k.time_ms for k in without.kernels if k.name.startswith("conv1/"))


def test_wr_on_a_recorded_nchw_tf32_table_folds_conv1_into_nhwc_where_the_fast_engines_are():
    t = BenchmarkTable.load(RECORDED.with_name("alexnet-b256-float32-NCHW-tf32-legacy-graph-fold-h100.json.gz"))
    wr = plan(t, "wr", workspace_limit=64 << 20, batch_policy="powerOfTwo")
    conv1 = [c for k in wr.kernels if k.name.startswith("conv1/") for c in k.configs]
    assert conv1 and all(c.source == "fold" and c.extra["fold"]["layout"] == "NHWC" for c in conv1)
    for k in t.kernels:   # folds into the other layout count y in the workspace, in the same one they do not
        for m in k.measurements:
            if m.source == "fold":
                layout = m.extra["fold"]["layout"]
                assert m.workspace_bytes >= sum(segments(k.op, k.problem.with_batch(m.micro_batch), layout).values())
