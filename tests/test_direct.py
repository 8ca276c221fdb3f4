"""The direct source's kernels (kernels/direct.py, direct.cu) without a GPU: the float64 references against a naive
loop and each other, the kernels' tile and halo index math emulated block by block against the references
(hypothesis over shapes, groups, pads, strides, non-square filters, tilings, layouts), launch geometry, the tuner's
plumbing with a synthetic clock, the source's refusals and labels, and the nvcc build for sm_80 and sm_90."""
from __future__ import annotations

import re
import shutil
import subprocess
from importlib import resources

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from ucudnn.kernels import _compile, autotune
from ucudnn.kernels import direct as D
from ucudnn.kernels import direct_dw as DW
from ucudnn.kernels import direct_plane as PL

from ucudnn.errors import InputError
from ucudnn.measure.sources.base import BenchSettings, Operands
from ucudnn.measure.sources.direct import MATH_TYPES, DirectSource
from ucudnn.numerics import allowed_math_types
from ucudnn.planning.table import Measurement
from ucudnn.problem import ConvProblem

NVCC = shutil.which("nvcc")
SETTINGS = settings(max_examples=50, deadline=None)


# ---- problems and tilings ---------------------------------------------------------------------------------------
@st.composite
def problems(draw, max_hw: int = 11):
    kind = draw(st.sampled_from(["c1", "depthwise", "multi", "grouped"]))
    if kind == "c1":
        c, groups, k = 1, 1, draw(st.integers(1, 9))
    elif kind == "depthwise":
        c = groups = draw(st.integers(1, 4))
        k = c * draw(st.integers(1, 3))
    elif kind == "multi":
        c, groups, k = draw(st.integers(2, 5)), 1, draw(st.integers(1, 6))
    else:
        groups = draw(st.integers(2, 3))
        c, k = groups * draw(st.integers(2, 3)), groups * draw(st.integers(1, 2))
    h, w = draw(st.integers(1, max_hw)), draw(st.integers(1, max_hw))
    r, s = draw(st.integers(1, 5)), draw(st.integers(1, 7))
    pad = (draw(st.integers(0, 3)), draw(st.integers(0, 3)))
    stride = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    assume(r <= h + 2 * pad[0] and s <= w + 2 * pad[1])
    return ConvProblem(draw(st.integers(1, 3)), c, h, w, k, r, s, pad=pad, stride=stride, groups=groups,
                       layout=draw(st.sampled_from(["NCHW", "NHWC"])))


TILINGS = st.builds(D.Tiling, st.sampled_from(D.TX_VALUES), st.sampled_from(D.RB_VALUES),
                    st.sampled_from(D.KT_VALUES), st.sampled_from(D.CHUNK_VALUES))


def _operands(p: ConvProblem, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(p.x_shape()), rng.standard_normal(p.w_shape()), rng.standard_normal(p.y_shape())


def _naive_forward_nchw(x, w, p: ConvProblem):
    """Seven nested loops, straight from the definition (NCHW only): the references' own reference."""
    cg, kg = p.c // p.groups, p.k // p.groups
    y = np.zeros((p.n, p.k, p.p, p.q))
    for n in range(p.n):
        for k in range(p.k):
            g = k // kg
            for oy in range(p.p):
                for ox in range(p.q):
                    acc = 0.0
                    for c in range(cg):
                        for i in range(p.r):
                            for j in range(p.s):
                                h, ww = oy * p.stride[0] - p.pad[0] + i, ox * p.stride[1] - p.pad[1] + j
                                if 0 <= h < p.h and 0 <= ww < p.w:
                                    acc += x[n, g * cg + c, h, ww] * w[k, c, i, j]
                    y[n, k, oy, ox] = acc
    return y


# ---- references ---------------------------------------------------------------------------------------------------
@SETTINGS
@given(problems(max_hw=7))
def test_forward_reference_equals_the_definition(p):
    p = ConvProblem(p.n, p.c, p.h, p.w, p.k, p.r, p.s, p.pad, p.stride, groups=p.groups)  # NCHW
    x, w, _ = _operands(p)
    np.testing.assert_allclose(D.forward_reference(x, w, p), _naive_forward_nchw(x, w, p), atol=1e-12)


@SETTINGS
@given(problems())
def test_backward_data_reference_is_the_adjoint_of_the_forward(p):
    x, w, dy = _operands(p, 1)
    lhs = np.vdot(D.forward_reference(x, w, p), dy)
    rhs = np.vdot(x, D.backward_data_reference(dy, w, p))
    assert lhs == pytest.approx(rhs, rel=1e-10, abs=1e-10)


def test_references_keep_the_layout():
    p = ConvProblem(2, 3, 6, 5, 4, 3, 2, pad=(1, 0), stride=(2, 1), layout="NHWC")
    x, w, dy = _operands(p)
    assert D.forward_reference(x, w, p).shape == p.y_shape()
    assert D.backward_data_reference(dy, w, p).shape == p.x_shape()


# ---- the kernels' index math, block by block ---------------------------------------------------------------------
@SETTINGS
@given(problems(), TILINGS)
def test_forward_emulated_block_by_block_equals_the_reference(p, t):
    x, w, _ = _operands(p, 2)
    np.testing.assert_allclose(D.emulate("forward", p, t, x, w), D.forward_reference(x, w, p), atol=1e-10)


@SETTINGS
@given(problems(), TILINGS)
def test_backward_data_emulated_block_by_block_equals_the_reference(p, t):
    _, w, dy = _operands(p, 3)
    np.testing.assert_allclose(D.emulate("backward_data", p, t, w, dy), D.backward_data_reference(dy, w, p),
                               atol=1e-10)


@SETTINGS
@given(problems(max_hw=40), TILINGS, st.sampled_from(D.OPS))
def test_tiles_cover_the_written_plane_exactly_once(p, t, op):
    tp, tq = D.tiles(op, p, t)
    rows, cols = (p.p, p.q) if op == "forward" else (p.h, p.w)
    seen = np.zeros((rows, cols), dtype=int)
    for bx in range(tp * tq):
        r0, c0 = D.tile_origin(bx, op, p, t)
        assert r0 < rows and c0 < cols, "no block is launched for an empty tile"
        seen[r0:r0 + t.rows, c0:c0 + t.tx] += 1
    assert (seen == 1).all()


@SETTINGS
@given(problems(max_hw=40), TILINGS)
def test_backward_window_holds_every_dy_entry_a_dx_tile_reads(p, t):
    """The staged dy rows are exactly wide enough: every (dx row, tap) pair of the tile with an exact quotient
    lands inside, and the count the kernel is launched with is the launcher's."""
    (sh, _), (ph, _) = p.stride, p.pad
    tp, tq = D.tiles("backward_data", p, t)
    for bx in range(0, tp * tq, tq):
        h0, w0 = D.tile_origin(bx, "backward_data", p, t)
        plo, _, dh, _ = D.backward_window(h0, w0, p, t)
        for h in range(h0, h0 + t.rows):
            for i in range((h + ph) % sh, p.r, sh):
                assert 0 <= (h + ph - i) // sh - plo < dh


# ---- launch geometry ----------------------------------------------------------------------------------------------
def test_plan_names_the_instantiation_and_sizes_the_grid():
    p = ConvProblem(7, 1, 28, 30, 64, 5, 3, pad=(2, 1))
    t = D.Tiling(32, 2, 8, 4)
    geo = D.plan("forward", p, t)
    assert geo.name_expr == "direct_fwd_single<float,false,32,2,8,4>"
    assert geo.grid == (-(-28 // 16) * -(-30 // 32), 64 // 32, 7)
    ih, iw = 15 + 5, 31 + 3
    assert geo.smem_bytes == 4 * (ih * iw + 32 * 15)
    assert geo.ints[-3:] == (64, ih, iw)
    # the taps start 16-byte aligned (the kernel reads 4 filters' tap as one float4): a 10 x 33 tile is padded to 332
    odd = D.plan("forward", ConvProblem(2, 1, 9, 9, 8, 3, 2, pad=1), D.Tiling(32, 1, 4, 1))
    assert odd.ints[-2:] == (10, 33) and odd.smem_bytes == 4 * (332 + 4 * 6)
    assert (geo.a_sample, geo.b_sample, geo.out_sample) == (28 * 30, 0, 64 * 28 * 30)

    q = ConvProblem(3, 16, 13, 13, 24, 3, 3, pad=(1, 1), stride=(2, 2), groups=2, dtype="float16", layout="NHWC")
    g = D.plan("backward_data", q, D.Tiling(8, 1, 4, 4))
    assert g.name_expr == "direct_bwd<half_t,true,8,1,4,4,false>"
    assert g.grid == (1 * 2, 2 * 2, 3)           # 32 x 8 dx tile; groups x ceil(8 / 4) dx-channel blocks
    dh, dw = (32 + 3 - 2) // 2 + 1, (8 + 3 - 2) // 2 + 1
    assert g.ints[-3:] == (2, dh, dw)
    assert g.smem_bytes == 4 * 2 * (4 * dh * dw + 4 * 9 * 4)
    assert (g.a_sample, g.b_sample, g.out_sample) == (0, 24 * 7 * 7, 16 * 13 * 13)

    assert D.plan("forward", ConvProblem(1, 8, 9, 9, 8, 3, 3), D.Tiling(8, 1, 1, 1), True).name_expr.endswith(
        ",true>")


def test_plan_refuses_what_the_kernels_do_not_run_naming_the_field():
    p = ConvProblem(1, 1, 8, 8, 4, 3, 3)
    with pytest.raises(InputError) as e:
        D.plan("forward", p, D.Tiling(8, 1, 1, 1), async_copy=True)    # single-channel forward stages once
    assert e.value.field == "async_copy"
    with pytest.raises(InputError) as e:
        D.plan("backward_filter", p, D.Tiling(8, 1, 1, 1))
    assert e.value.field == "problem"
    with pytest.raises(InputError) as e:
        D.Tiling(12, 1, 1, 1)
    assert e.value.field == "tiling.tx"
    with pytest.raises(InputError) as e:
        D.Tiling.from_list([8, 1, 1])
    assert e.value.field == "tiling"


@pytest.mark.parametrize("problem, why", [
    (ConvProblem(1, 3, 8, 8, 4, 3, 3, dilation=(2, 1)), "dilation"),
    (ConvProblem(1, 3, 8, 8, 4, 3, 3, dtype="bfloat16"), "bfloat16"),
])
def test_refusals_name_the_reason(problem, why):
    assert why in D.refusal("forward", problem)
    assert "backward-filter" in D.refusal("backward_filter", ConvProblem(1, 1, 8, 8, 4, 3, 3))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 512), st.integers(1, 64), st.integers(1, 256), st.integers(1, 11), st.integers(1, 11),
       st.integers(1, 4), st.integers(1, 4), st.sampled_from(D.OPS), st.booleans())
def test_default_tiling_always_fits_48_kib(c, k, hw, r, s, sh, sw, op, depthwise):
    assume(r <= hw and s <= hw)
    groups = c if depthwise else 1
    p = ConvProblem(4, c, hw, hw, k * groups if depthwise else k, r, s, stride=(sh, sw), groups=groups)
    t = D.default_tiling(op, p)
    assert D.fits(op, p, t)
    assert D.plan(op, p, t).smem_bytes <= D.DEFAULT_SMEM


def test_default_tiling_gives_single_channel_forward_eight_filters_per_thread():
    p = ConvProblem(256, 1, 224, 224, 64, 3, 3, pad=(1, 1))
    t = D.default_tiling("forward", p)
    assert (t.tx, t.kt) == (32, 8) and t.kt * t.chunk == 64


# ---- tuning, with a synthetic clock ---------------------------------------------------------------------------------
def test_tuner_climbs_records_and_reuses_its_choice(monkeypatch, tmp_path):
    monkeypatch.setenv("UCUDNN_DATABASE", str(tmp_path / "db.sqlite"))
    autotune.clear_memory()
    monkeypatch.setattr(_compile, "device_key", lambda: "fake-gpu sm_90")
    monkeypatch.setattr(_compile, "compute_capability", lambda: 90)
    monkeypatch.setattr(D, "smem_limit", lambda: 100 << 10)
    launched: list[D.Tiling] = []

    def fake_launcher(op, problem, t, async_copy=False):
        assert async_copy is False                      # single-channel forward: no cp.async
        return lambda *args: launched.append(t)

    monkeypatch.setattr(D, "launcher", fake_launcher)
    best = D.Tiling(32, 4, 8, 2)

    def timer(fn):
        fn()
        t = launched[-1]
        return 1.0 + sum(abs(a - b) for a, b in zip(t.coordinates(), best.coordinates()))

    p = ConvProblem(64, 1, 64, 64, 32, 3, 3, pad=(1, 1))
    t, how = D.tuned_tiling("forward", p, (1, 2, 3), timer=timer)
    assert (t, how) == (best, "climb")
    n = len(launched)
    assert n <= D.TUNE_MAX_TRIALS + D.TUNE_FINALISTS * D.TUNE_ROUNDS
    autotune.clear_memory()                              # from the JSON file now
    assert D.tuned_tiling("forward", p, (1, 2, 3), timer=timer) == (best, "cache")
    assert len(launched) == n
    assert D.tuned_tiling("forward", p.with_batch(4), None) == (D.default_tiling("forward", p, 100 << 10),
                                                               "default")   # the small-batch class is its own
    autotune.clear_memory()


# ---- the source without a GPU ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("numerics", ["strict", "tf32", "default", "strict-deterministic", "default-deterministic"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_rows_carry_a_math_type_every_numerics_of_their_dtype_allows(numerics, dtype):
    assert MATH_TYPES[dtype] in allowed_math_types(numerics, dtype)
    assert DirectSource().refusal("forward", ConvProblem(1, 1, 8, 8, 4, 3, 3, dtype=dtype), numerics) is None


@pytest.mark.parametrize("op, problem, reason", [
    ("backward_filter", ConvProblem(4, 1, 8, 8, 4, 3, 3, dtype="float16"),
     "direct: no backward-filter kernel; igemm: float16: the implicit-GEMM kernel is FP32 only"),
    ("forward", ConvProblem(4, 3, 9, 9, 3, 3, 3, dilation=(2, 2), groups=3),
     "direct: dilation [2, 2] is not supported (1 only); igemm: grouped convolution"),
    ("backward_data", ConvProblem(4, 3, 9, 9, 4, 3, 3, dtype="bfloat16"), "direct: bfloat16 is not supported"),
])
def test_measure_records_unsupported_cases_as_skipped_without_touching_a_gpu(op, problem, reason):
    ms, sk = DirectSource().measure(op, problem, Operands(0, 0, 0), 0, BenchSettings("strict"))
    assert ms == [] and len(sk) == 1
    assert sk[0].reason.startswith(reason) and sk[0].micro_batch == 4


def test_float32_layers_without_groups_get_an_implicit_gemm_configuration_for_every_op():
    from ucudnn.kernels import igemm
    from ucudnn.measure.sources.direct import IGEMM

    src = DirectSource()
    wgrad = ConvProblem(4, 1, 8, 8, 4, 3, 3)          # no seed kernel for backward filter, igemm runs it
    assert src.refusal("backward_filter", wgrad, "strict") is None
    assert src.refusal("forward", ConvProblem(4, 3, 9, 9, 4, 3, 3, dilation=(2, 2)), "strict") is None
    ms, sk = src.measure("backward_filter", wgrad, Operands(0, 0, 0), 0, BenchSettings("strict"))
    # no GPU here: a skipped row per tile variant, never an exception
    assert ms == [] and [s.algo for s in sk] == [IGEMM] * len(igemm.variants("backward_filter", wgrad))


def test_an_igemm_configuration_needs_a_positive_split_count():
    from ucudnn.measure.sources.direct import IGEMM

    p = ConvProblem(2, 4, 8, 8, 4, 3, 3)
    bad = Measurement(2, IGEMM, "FMA", 1.0, 0, "direct", None, {"direct": {"splits": 0}})
    with pytest.raises(InputError) as e:
        DirectSource().prepare("backward_filter", p, bad)
    assert e.value.field == "extra.direct.splits"


@pytest.mark.parametrize("tile, field", [({"bn": 32}, "extra.direct.bn"), ({"ks": 4}, "extra.direct.ks"),
                                         ({"bn": True}, "extra.direct.bn")])
def test_an_igemm_configuration_names_a_tile_the_kernel_is_built_for(tile, field):
    from ucudnn.measure.sources.direct import IGEMM

    p = ConvProblem(2, 4, 8, 8, 4, 3, 3)
    bad = Measurement(2, IGEMM, "FMA", 1.0, 0, "direct", None, {"direct": {"splits": 1, **tile}})
    with pytest.raises(InputError) as e:
        DirectSource().prepare("forward", p, bad)
    assert e.value.field == field


@pytest.mark.parametrize("op, info, field", [
    ("backward_data", {"scatter": "yes"}, "extra.direct.scatter"),     # not a boolean
    ("forward", {"scatter": True}, "scatter"),                        # only backward data has the form
])
def test_an_igemm_configuration_names_a_form_the_op_has(op, info, field):
    from ucudnn.measure.sources.direct import IGEMM

    p = ConvProblem(2, 4, 8, 8, 4, 3, 3, stride=(2, 2))
    bad = Measurement(2, IGEMM, "FMA", 1.0, 0, "direct", None, {"direct": {"splits": 1, **info}})
    with pytest.raises(InputError) as e:
        DirectSource().prepare(op, p, bad)
    assert e.value.field == field


def test_deterministic_numerics_never_measure_or_configure_the_atomic_scatter_form():
    from ucudnn.kernels import igemm
    from ucudnn.measure.sources.base import BenchSettings, Operands
    from ucudnn.measure.sources.direct import IGEMM

    p = ConvProblem(4, 3, 17, 17, 8, 5, 5, pad=(2, 2), stride=(2, 2))
    src = DirectSource(tune=False)
    rows = {}
    for numerics in ("strict", "strict-deterministic"):
        _, sk = src.measure("backward_data", p, Operands(0, 0, 0), 0, BenchSettings(numerics))
        rows[numerics] = [s for s in sk if s.algo == IGEMM]      # no GPU here: one skipped row per variant
    every, gather_only = igemm.variants("backward_data", p), igemm.variants("backward_data", p, deterministic=True)
    assert len(rows["strict"]) == len(every) and len(rows["strict-deterministic"]) == len(gather_only)
    assert gather_only == [v for v in every if not v[2]] and len(gather_only) < len(every)
    with pytest.raises(InputError) as e:
        src.configure_igemm("backward_data", p, "strict-deterministic", scatter=True)
    assert e.value.field == "scatter"


def test_prepare_refuses_a_configuration_without_its_tiling():
    p = ConvProblem(2, 1, 8, 8, 4, 3, 3)
    with pytest.raises(InputError) as e:
        DirectSource().prepare("forward", p, Measurement(2, "direct-single", "FMA", 1.0, 0, "direct"))
    assert e.value.field == "extra.direct"


def test_source_identity():
    from ucudnn.measure.sources.direct import algo_name

    assert DirectSource.name == "direct" and DirectSource.workspace_bytes == 0
    assert algo_name(ConvProblem(1, 1, 8, 8, 4, 3, 3)) == "direct-single"
    assert algo_name(ConvProblem(1, 8, 8, 8, 16, 3, 3, groups=8)) == "direct-single"      # depthwise
    assert algo_name(ConvProblem(1, 8, 8, 8, 16, 3, 3, groups=4)) == "direct-multi"


# ---- the depthwise kernel (direct_dw: 3x3, 5x5 and 7x7) ---------------------------------------------------------
@st.composite
def depthwise(draw, sizes=DW.DW_SIZES):
    """Depthwise K x K (3, 5 or 7) / stride 1 / padding K / 2 NCHW problems: widths across 4-column lanes and
    128-column segments (1 .. 300, multiples of 4 and not), heights from 1, a few planes."""
    c, k = draw(st.integers(1, 5)), draw(st.sampled_from(sizes))
    return ConvProblem(draw(st.integers(1, 2)), c, draw(st.integers(1, 20)),
                       draw(st.one_of(st.integers(1, 140), st.sampled_from([128, 129, 256, 260, 300]))),
                       c, k, k, pad=(k // 2, k // 2), groups=c)


def _dw_emulation_matches(p: ConvProblem, rows: int, op: str) -> None:
    """The depthwise kernels' emulation of ``op`` equals the float64 reference, every output element written."""
    x, w, dy = _operands(p, seed=p.h * 7 + p.w)
    if op == "forward":
        got, ref = DW.dw_emulate(op, p, rows, x, w), D.forward_reference(x, w, p)
    elif op == "backward_data":
        got, ref = DW.dw_emulate(op, p, rows, w, dy), D.backward_data_reference(dy, w, p)
    else:
        got, ref = DW.dw_emulate(op, p, rows, x, dy), D.backward_filter_reference(x, dy, p)
    assert not np.isnan(got).any(), "every output element is written"
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


@settings(max_examples=80, deadline=None)
@given(depthwise(), st.sampled_from(DW.DW_ROWS), st.sampled_from(DW.DW_OPS))
def test_dw_emulated_group_by_group_equals_the_reference(p, rows, op):
    """Bands, segments, lane groups and the shuffled neighbour columns cover the plane exactly once and compute the
    convolution (backward data through the rotated taps; backward filter as the groups' summed products)."""
    _dw_emulation_matches(p, rows, op)


@settings(max_examples=60, deadline=None)
@given(depthwise(DW.DW_S2_SIZES), st.sampled_from(DW.DW_ROWS), st.sampled_from(["backward_data", "backward_filter"]))
def test_dw_stride_two_emulated_equals_the_reference(p1, rows, op):
    """Stride 2.  Backward data: bands of dx row pairs, each lane's dy window from its own 2 columns and its
    neighbours', the taps met by parity, cover dx exactly once and sum the transposed convolution.  Backward filter:
    bands of dy rows, each lane's 8 x columns and its neighbours' meeting its 4 dy columns, summed per channel."""
    _dw_emulation_matches(ConvProblem(p1.n, p1.c, p1.h, p1.w, p1.k, p1.r, p1.s, pad=p1.pad, stride=(2, 2),
                                      groups=p1.groups), rows, op)


@pytest.mark.parametrize("problem, why", [
    (ConvProblem(2, 4, 8, 8, 4, 3, 3, pad=(1, 1), groups=4, layout="NHWC"), "NHWC"),
    (ConvProblem(2, 4, 8, 8, 8, 3, 3, pad=(1, 1), groups=4), "one filter per channel"),
    (ConvProblem(2, 4, 8, 8, 4, 9, 9, pad=(4, 4), groups=4), "not 3x3, 5x5 or 7x7"),
    (ConvProblem(2, 4, 8, 8, 4, 3, 5, pad=(1, 2), groups=4), "not 3x3, 5x5 or 7x7"),
    (ConvProblem(2, 4, 8, 8, 4, 7, 7, pad=(3, 3), stride=(2, 2), groups=4), "7x7 at stride 2"),
    (ConvProblem(2, 4, 8, 8, 4, 3, 3, pad=(1, 1), stride=(2, 2), groups=4), "stride 2: backward data and filter"),
    (ConvProblem(2, 4, 8, 8, 4, 3, 3, pad=(1, 1), stride=(3, 3), groups=4), "at stride 1 or 2"),
    (ConvProblem(2, 4, 8, 8, 4, 3, 3, pad=(0, 0), groups=4), "padding K / 2"),
    (ConvProblem(2, 4, 8, 8, 4, 5, 5, pad=(1, 1), groups=4), "padding K / 2"),
    (ConvProblem(2, 1, 8, 8, 4, 3, 3, pad=(1, 1)), "one filter per channel"),
])
def test_dw_runs_only_the_same_padded_depthwise_3x3_5x5_and_7x7(problem, why):
    assert why in DW.dw_refusal("forward", problem)
    if problem.stride != (2, 2):
        assert why in DW.dw_refusal("backward_filter", problem)
    for k in DW.DW_S2_SIZES:     # stride 2: backward data and backward filter
        s2 = ConvProblem(2, 4, 9, 9, 4, k, k, pad=(k // 2, k // 2), stride=(2, 2), groups=4)
        assert DW.dw_refusal("backward_data", s2) is None and DW.dw_refusal("backward_filter", s2) is None
    for k in DW.DW_SIZES:
        dw = ConvProblem(2, 4, 8, 8, 4, k, k, pad=(k // 2, k // 2), groups=4)
        assert DW.dw_refusal("backward_filter", dw) is None
    assert "float atomics" in DW.dw_refusal("backward_filter", ConvProblem(2, 4, 8, 8, 4, 3, 3, pad=(1, 1),
                                                                          groups=4, dtype="float16"))
    with pytest.raises(InputError) as e:
        DW.dw_launcher("forward", problem, 0)
    assert e.value.field == "problem"


def test_dw_geometry_splits_planes_into_bands_and_segments():
    p = ConvProblem(3, 5, 112, 112, 5, 3, 3, pad=(1, 1), groups=5)
    assert DW.dw_geometry(p, 0) == (112, 1, 1, 32, 15, 15)
    assert DW.dw_geometry(p, 16) == (16, 7, 1, 32, 105, 105)
    assert DW.dw_geometry(p.with_batch(1), 32)[:4] == (32, 4, 1, 32)
    wide = ConvProblem(1, 2, 5, 300, 2, 3, 3, pad=(1, 1), groups=2)
    assert DW.dw_geometry(wide, 4) == (4, 2, 3, 32, 12, 12)
    # narrow planes: 14 columns take 4 lanes (16 columns), 8 planes a warp
    narrow = ConvProblem(3, 5, 14, 14, 5, 3, 3, pad=(1, 1), groups=5)
    assert DW.dw_geometry(narrow, 0) == (14, 1, 1, 4, 15, 2)
    # stride 2: backward data in bands of dx row pairs over dx columns, backward filter over dy rows and columns
    s2 = ConvProblem(3, 5, 113, 112, 5, 3, 3, pad=(1, 1), stride=(2, 2), groups=5)
    assert DW.dw_geometry(s2, 0, "backward_data")[:4] == (57, 1, 1, 32)
    assert DW.dw_geometry(s2, 16, "backward_data")[:3] == (16, 4, 1)
    assert DW.dw_geometry(s2, 0, "backward_filter")[:4] == (57, 1, 1, 16)     # dy: 57 x 56
    assert [DW.dw_width(w) for w in (1, 7, 8, 9, 14, 28, 56, 112, 129)] == [2, 2, 2, 4, 4, 8, 16, 32, 32]
    with pytest.raises(InputError) as e:
        DW.dw_geometry(p, 3)
    assert e.value.field == "rows"


@pytest.mark.parametrize("k", [3, 5, 7])
def test_depthwise_layers_get_their_size_s_configurations_recorded_for_prepare(k):
    from ucudnn.measure.sources.direct import DW_ALGOS, DW_CONFIGS

    p = ConvProblem(4, 8, 16, 16, 8, k, k, pad=(k // 2, k // 2), groups=8)
    algo = DW_ALGOS[k]
    for op in DW.DW_OPS:
        assert DirectSource().refusal(op, p, "strict") is None
        ms, sk = DirectSource().measure(op, p, Operands(0, 0, 0), 0, BenchSettings("strict"))
        # no GPU here: every configuration is a skipped row, the depthwise ones among them, each once
        assert ms == [] and [s.algo for s in sk].count(algo) == len(DW_CONFIGS[k])
        assert not {s.algo for s in sk} & (set(DW_ALGOS.values()) - {algo})
    # backward filter's atomics are not bitwise reproducible: deterministic numerics do not measure them
    ms, sk = DirectSource().measure("backward_filter", p, Operands(0, 0, 0), 0, BenchSettings("strict-deterministic"))
    assert algo not in [s.algo for s in sk]
    # NHWC: the NHWC kernels' tiles instead (tests/test_direct_dw_nhwc.py)
    from ucudnn.kernels import direct_dw_nhwc

    ms, sk = DirectSource().measure("forward", ConvProblem(4, 8, 16, 16, 8, k, k, pad=(k // 2, k // 2), groups=8,
                                                           layout="NHWC"), Operands(0, 0, 0), 0,
                                    BenchSettings("strict"))
    assert [s.algo for s in sk].count(algo) == len(direct_dw_nhwc.FWD_TILES)


def test_a_depthwise_configuration_needs_its_band_rows_and_its_filter_size():
    from ucudnn.measure.sources.direct import DW_ALGOS

    p = ConvProblem(2, 8, 16, 16, 8, 3, 3, pad=(1, 1), groups=8)
    dw3 = DW_ALGOS[3]
    with pytest.raises(InputError) as e:
        DirectSource().prepare("forward", p, Measurement(2, dw3, "FMA", 1.0, 0, "direct", None, {"direct": {}}))
    assert e.value.field == "extra.direct.rows"
    with pytest.raises(InputError) as e:
        DirectSource().prepare("forward", p, Measurement(2, dw3, "FMA", 1.0, 0, "direct", None,
                                                         {"direct": {"rows": 16, "minb": 3}}))
    assert e.value.field == "minb"
    from ucudnn.errors import UcudnnError

    with pytest.raises(UcudnnError, match="is not this problem's"):
        DirectSource().prepare("forward", p, Measurement(2, DW_ALGOS[5], "FMA", 1.0, 0, "direct", None,
                                                         {"direct": {"rows": 16, "minb": 1}}))


# ---- the single-channel forward by rows (direct_plane) -------------------------------------------------------
PLANE_CONFIGS = st.tuples(st.sampled_from(PL.PLANE_RB), st.sampled_from(PL.PLANE_KT), st.sampled_from(PL.PLANE_KL))


@st.composite
def plane_problems(draw):
    """Single-channel NCHW stride-1 forwards the rows kernel runs: planes 1-40 a side, filters up to 5 x 5,
    batches 1-40 (many images a block where planes are small)."""
    h, w = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    r, s = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    pad = (draw(st.integers(0, r - 1)), draw(st.integers(0, s - 1)))
    assume(r <= h + 2 * pad[0] and s <= w + 2 * pad[1])
    return ConvProblem(draw(st.integers(1, 40)), 1, h, w, draw(st.integers(1, 12)), r, s, pad=pad)


@settings(max_examples=40, deadline=None)
@given(plane_problems(), PLANE_CONFIGS)
def test_plane_emulated_block_by_block_equals_the_reference(p, config):
    """Every slot's window lies in the planes its block staged, and the slots write y exactly (emulate raises on a
    read outside the staged planes; NaN would remain where no slot wrote)."""
    assume(PL.plane_refusal("forward", p, config) is None)
    x, w, _ = _operands(p, 4)
    got = PL.plane_emulate(p, *config, x, w)
    np.testing.assert_allclose(got, D.forward_reference(x, w, p), atol=1e-10)


@settings(max_examples=100, deadline=None)
@given(plane_problems(), st.sampled_from(PL.PLANE_RB))
def test_plane_blocks_stage_at_most_the_rows_the_launcher_sizes(p, rb):
    """Every block's staged rows fit the ROWS the launcher sizes shared memory for, and cover its first and last
    slot's windows; the blocks cover the batch's slots exactly."""
    pg, ih, iw, rows, blocks = PL.plane_geometry(p, rb)
    assert (ih, iw) == (pg * rb + p.r - 1, p.q + p.s - 1) and pg * rb >= p.p > (pg - 1) * rb
    pgq = pg * p.q
    assert blocks * D.NT >= p.n * pgq > (blocks - 1) * D.NT
    for bx in range(blocks):
        vlo, vhi = PL.plane_rows(p, rb, bx)
        assert vhi - vlo + 1 <= rows
        last = min(bx * D.NT + D.NT, p.n * pgq) - 1
        n, rem = divmod(last, pgq)
        assert vhi == n * ih + rem // p.q * rb + rb + p.r - 2 <= (n + 1) * ih - 1


def test_plane_geometry_of_a_28x28_5x5_layer():
    p = ConvProblem(256, 1, 28, 28, 512, 5, 5, pad=(2, 2))
    # 7 row groups of 4 x 28 columns = 196 slots an image; 256 slots: at most 11 groups, 3 images -> 11*4 + 3*4 rows
    assert PL.plane_geometry(p, 4) == (7, 32, 32, 56, 196)
    assert PL.plane_smem_floats(p, 4, 8, 4) == 56 * 32 + 32 * 25
    assert PL.plane_geometry(p.with_batch(1), 4)[3] == 32          # one image: its whole padded plane
    assert PL.plane_rows(p, 4, 0) == (0, 32 + 2 * 4 + 4 + 3)       # slots 0-255: image 0, image 1 to its group 2
    wide = ConvProblem(2, 1, 256, 256, 32, 3, 3, pad=(1, 1))      # 256 slots: one row group or two
    assert PL.plane_geometry(wide, 4)[3] == 2 * 4 + 2 * 2


@pytest.mark.parametrize("problem, why", [
    (ConvProblem(2, 3, 28, 28, 8, 3, 3, pad=(1, 1)), "one input channel"),
    (ConvProblem(2, 4, 28, 28, 4, 3, 3, pad=(1, 1), groups=4), "one input channel"),
    (ConvProblem(2, 1, 28, 28, 8, 3, 3, pad=(1, 1), layout="NHWC"), "NHWC"),
    (ConvProblem(2, 1, 28, 28, 8, 3, 3, pad=(1, 1), stride=(2, 1)), "stride"),
    (ConvProblem(2, 1, 28, 28, 8, 7, 3, pad=(3, 1)), "larger than 5x5"),
    (ConvProblem(2, 1, 28, 28, 8, 3, 3, dilation=(2, 2)), "dilation"),
    (ConvProblem(2, 1, 28, 28, 8, 3, 3, dtype="bfloat16"), "bfloat16"),
    (ConvProblem(2, 1, 8, 4000, 8, 3, 3, pad=(1, 1)), "do not fit"),
])
def test_plane_refuses_what_it_does_not_run_and_says_why(problem, why):
    assert why in PL.plane_refusal("forward", problem)
    assert PL.plane_refusal("backward_data", ConvProblem(2, 1, 28, 28, 8, 3, 3, pad=(1, 1))) == "forward only"
    with pytest.raises(InputError, match=why) as e:
        PL.plane_launcher(problem, 4, 8, 4)
    assert e.value.field == "problem"


def test_plane_refuses_a_configuration_outside_its_grid_or_shared_memory():
    p = ConvProblem(8, 1, 28, 28, 64, 5, 5, pad=(2, 2))
    assert PL.plane_refusal("forward", p, (4, 8, 4)) is None
    assert "kt 2" in PL.plane_refusal("forward", p, (4, 2, 4))
    assert "rb 3" in PL.plane_refusal("forward", p, (3, 8, 4))
    wide = ConvProblem(8, 1, 8, 600, 64, 5, 5, pad=(2, 2))      # 2 row groups + 2 images' halos: 16 rows of 604
    assert PL.plane_geometry(wide, 4)[3] == 2 * 4 + 2 * 4
    assert PL.plane_refusal("forward", wide, (4, 8, 4)) is None      # 37.8 KiB of rows + 3.1 KiB of taps
    assert "do not fit" in PL.plane_refusal("forward", wide, (4, 8, 16))   # + 12.5 KiB


def test_single_channel_forwards_get_small_plane_configurations_recorded_for_prepare():
    from ucudnn.measure.sources.direct import PLANE_ALGO
    from ucudnn.measure.sources.direct import PLANE_CONFIGS as CONFIGS

    p = ConvProblem(4, 1, 28, 28, 64, 5, 5, pad=(2, 2))
    ms, sk = DirectSource().measure("forward", p, Operands(0, 0, 0), 0, BenchSettings("strict"))
    assert ms == [] and [s.algo for s in sk].count(PLANE_ALGO) == len(CONFIGS)   # no GPU: skipped rows
    for op, q in (("backward_data", p), ("forward", ConvProblem(4, 1, 28, 28, 64, 5, 5, pad=(2, 2), layout="NHWC"))):
        _, sk = DirectSource().measure(op, q, Operands(0, 0, 0), 0, BenchSettings("strict"))
        assert PLANE_ALGO not in [s.algo for s in sk]
    with pytest.raises(InputError) as e:
        DirectSource().prepare("forward", p, Measurement(4, PLANE_ALGO, "FMA", 1.0, 0, "direct", None,
                                                         {"direct": {"rb": 4, "kt": 8}}))
    assert e.value.field == "extra.direct.kl"
    with pytest.raises(InputError) as e:
        DirectSource().prepare("forward", p.with_batch(4), Measurement(4, PLANE_ALGO, "FMA", 1.0, 0, "direct", None,
                                                                       {"direct": {"rb": 3, "kt": 8, "kl": 4}}))
    assert e.value.field == "extra.direct" and "rb 3" in str(e.value)


# ---- the CUDA source ---------------------------------------------------------------------------------------------------
def test_run_time_source_is_self_contained():
    text = _compile.source(D.SOURCE)
    assert '#include "' not in text and "#include <" not in text
    assert text.count("struct __align__(2) half_t") == 1


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_source_compiles_with_nvcc(arch, tmp_path):
    """Every kernel of direct.cu builds for the architecture (cp.async included); the float single-channel forward --
    the kernel the issue's speed bar is about -- keeps its accumulators in registers."""
    src = resources.files("ucudnn.kernels").joinpath(D.SOURCE)
    with resources.as_file(src) as path:
        proc = subprocess.run([NVCC, "-std=c++17", f"-arch={arch}", "--cubin", "-DUCUDNN_NVCC_CHECK", "-Xptxas", "-v",
                               "-o", str(tmp_path / "k.cubin"), str(path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    kernels = re.findall(r"Function properties for (\w+)\s*\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, "
                         r"(\d+) bytes spill loads", proc.stderr)
    names = {fn for fn, *_ in kernels}
    assert {n for n in names if "direct_fwd_single" in n} and {n for n in names if "direct_fwd_multi" in n}
    assert {n for n in names if "direct_bwd" in n}
    assert {n for n in names if "direct_plane" in n}
    for fn, stack, stores, loads in kernels:
        if "direct_fwd_singleIf" in fn or "direct_planeIf" in fn:
            assert (stack, stores, loads) == ("0", "0", "0"), f"{fn} uses local memory on {arch}"


def test_plane_launcher_passes_the_geometry_the_kernel_reads(monkeypatch):
    """What a launch hands the kernel (CPU, the compiled kernel replaced): the instantiation, a grid of
    ceil(N*PG*Q / 256) x ceil(K / (KT*KL)) blocks of 256 threads, the shared memory of plane_smem_floats, and the
    int arguments in the kernel's order."""
    calls, names = [], []

    def fake_kernel(name):
        names.append(name)
        return lambda grid, block, args, shared_mem=0: calls.append((grid, block, args, shared_mem))

    monkeypatch.setattr(_compile, "get_kernel", lambda source, name: fake_kernel(name))
    p = ConvProblem(9, 1, 28, 27, 40, 5, 3, pad=(2, 1))
    PL.plane_launcher(p, 4, 8, 2)(11, 22, 33, 0.5, 2.0)
    pg, ih, iw, rows, blocks = PL.plane_geometry(p, 4)
    assert names == ["direct_plane<float,4,8,2>"]
    (grid, block, args, smem), = calls
    assert grid == (blocks, 3, 1) and block == (PL.NT,) and smem == 4 * PL.plane_smem_floats(p, 4, 8, 2)
    assert [int(a) for a in args[3:17]] == [9, 28, 27, 40, 28, 27, 5, 3, 2, 1, pg, ih, iw, rows]
    assert args[:3] == (11, 22, 33) and [float(a) for a in args[17:]] == [0.5, 2.0]
