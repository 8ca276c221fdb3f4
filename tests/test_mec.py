"""MEC (kernels/mec.py, mec.cu) without a GPU: Algorithm 2's lowering and GEMM plans against a direct convolution,
the geometry's workspace and coverage, the kernels' index math, and the kernels' nvcc build."""
from __future__ import annotations

import numpy as np
import pytest
import test_kernels_compile
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from numpy.lib.stride_tricks import sliding_window_view
from ucudnn.kernels.mec import (DEFAULT_T, MecGeometry, backward_data_reference, backward_filter_reference,
                                conv_forward_reference, dx_gather_range, lower_reference, lowered_source, run_gemms)

from ucudnn.errors import InputError
from ucudnn.problem import ConvProblem


# ---- float64 direct convolution, NHWC x, KRSC w -----------------------------------------------------------------
def _windows(x: np.ndarray, g: MecGeometry) -> np.ndarray:
    """[N, P, Q, C, R, S]: the padded input's window of every output element."""
    xp = np.pad(x, ((0, 0), (g.pad[0],) * 2, (g.pad[1],) * 2, (0, 0)))
    win = sliding_window_view(xp, (g.r, g.s), axis=(1, 2))[:, ::g.stride[0], ::g.stride[1]]
    return win[:, :g.p, :g.q]


def direct_forward(x, w, g):
    return np.einsum("npqcij,kijc->npqk", _windows(x, g), w)


def direct_backward_filter(x, dy, g):
    return np.einsum("npqcij,npqk->kijc", _windows(x, g), dy)


def direct_backward_data(dy, w, g):
    sh, sw = g.stride
    dxp = np.zeros((dy.shape[0], g.h + 2 * g.pad[0] + g.r + sh * g.p, g.w + 2 * g.pad[1] + g.s + sw * g.q, g.c))
    for i in range(g.r):
        for j in range(g.s):
            dxp[:, i:i + sh * g.p:sh, j:j + sw * g.q:sw] += np.einsum("npqk,kc->npqc", dy, w[:, i, j])
    return dxp[:, g.pad[0]:g.pad[0] + g.h, g.pad[1]:g.pad[1] + g.w]


# ---- problems ---------------------------------------------------------------------------------------------------
@st.composite
def problems(draw):
    c = draw(st.one_of(st.sampled_from([1, 3]), st.integers(1, 8)))
    h, w = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    r, s = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    pad = (draw(st.integers(0, 3)), draw(st.integers(0, 3)))
    assume(r <= h + 2 * pad[0] and s <= w + 2 * pad[1])
    g = MecGeometry(draw(st.integers(1, 5)), c, h, w, draw(st.integers(1, 6)), r, s, pad,
                    (draw(st.integers(1, 4)), draw(st.integers(1, 4))))
    return g.n, g


def _operands(n, g, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(g.x_shape(n)), rng.standard_normal(g.w_shape()), rng.standard_normal(g.y_shape(n)))


BATCHING = st.sampled_from([None, "rows", "samples"])
SETTINGS = settings(max_examples=60, deadline=None)


@SETTINGS
@given(problems(), st.sampled_from("AB"), BATCHING)
def test_forward_by_algorithm_2_equals_the_direct_convolution(nproblem, solution, batch_over):
    n, g = nproblem
    if solution == "A" and not g.solution_a_allowed(n):
        with pytest.raises(InputError, match=r"\|y\| <= \|L\|"):
            g.forward_gemms(n, "A")
        solution = "B"
    x, w, _ = _operands(n, g)
    np.testing.assert_allclose(conv_forward_reference(x, w, g, solution, batch_over), direct_forward(x, w, g),
                               rtol=1e-12, atol=1e-12)


@SETTINGS
@given(problems(), BATCHING, st.floats(-2, 2), st.sampled_from([0.0, 1.0, -0.5]))
def test_backward_data_by_gemms_and_gather_equals_the_direct_adjoint(nproblem, batch_over, alpha, beta):
    n, g = nproblem
    x, w, dy = _operands(n, g, 1)
    got = backward_data_reference(dy, w, g, x.copy(), alpha, beta, batch_over)
    np.testing.assert_allclose(got, alpha * direct_backward_data(dy, w, g) + beta * x, rtol=1e-12, atol=1e-12)


@SETTINGS
@given(problems(), st.floats(-2, 2), st.floats(-2, 2))
def test_backward_filter_accumulates_like_cudnn(nproblem, alpha, beta):
    n, g = nproblem
    x, w, dy = _operands(n, g, 2)
    np.testing.assert_allclose(backward_filter_reference(x, dy, g, w.copy(), alpha, beta),
                               alpha * direct_backward_filter(x, dy, g) + beta * w, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(backward_filter_reference(x, dy, g), direct_backward_filter(x, dy, g), rtol=1e-12,
                               atol=1e-12)


def test_backward_data_with_beta_zero_ignores_nan_in_dx():
    g = MecGeometry(2, 3, 7, 6, 4, 3, 2, (1, 0), (2, 1))
    _, w, dy = _operands(2, g)
    dx = np.full(g.x_shape(2), np.nan)
    assert np.isfinite(backward_data_reference(dy, w, g, dx)).all()


# ---- geometry ---------------------------------------------------------------------------------------------------
def _written(gemm):
    """Flat offsets each batch entry of ``gemm`` writes."""
    rows, cols = np.arange(gemm.m)[:, None] * gemm.ldc, np.arange(gemm.n)[None, :]
    return [(gemm.c_offset + i * gemm.stride_c + rows + cols).ravel() for i in range(gemm.batch)]


def _counts(gemms, size):
    counts = np.zeros(size, int)
    for gm in gemms:
        entries = _written(gm)
        flat = np.concatenate(entries)
        assert len(np.unique(flat)) == flat.size, f"entries of one GEMM write an element twice: {gm}"
        np.add.at(counts, flat, 1)
    return counts


@settings(max_examples=40, deadline=None)
@given(problems(), BATCHING)
def test_workspace_formula_and_gemm_coverage(nproblem, batch_over):
    n, g = nproblem
    x, _, _ = _operands(n, g)
    lowered = lower_reference(x.astype(np.float16), g)
    assert lowered.nbytes == g.lowered_bytes(n, 2) == g.lowered_elements(n) * 2
    assert lowered.shape == (n, g.q, g.lh, g.s, g.c) and g.lh <= g.h + 2 * g.pad[0]
    y_size = n * g.p * g.q * g.k
    solutions = ["A", "B"] if g.solution_a_allowed(n) else ["B"]
    for solution in solutions:   # every output element by exactly one GEMM entry
        assert (_counts(g.forward_gemms(n, solution, batch_over), y_size) == 1).all()
    # backward data: every dL element of a window (row hh with hh % sh < R, or covered by a later row) written
    d_lowered = _counts(g.backward_data_gemms(n, batch_over), g.lowered_elements(n)).reshape(g.lowered_shape(n))
    hh = np.arange(g.lh)
    times = sum(((hh >= p * g.stride[0]) & (hh < p * g.stride[0] + g.r)).astype(int) for p in range(g.p))
    assert (d_lowered == times[None, None, :, None, None]).all()
    # backward filter: all of dw, once per (sample, output row), the caller's beta first
    fw = g.backward_filter_gemms(n)
    assert (_counts(fw, g.k * g.rsc) == n * g.p).all()
    assert [gm.beta for gm in fw] == [None] + [1.0] * (len(fw) - 1)


def test_the_seed_rule_picks_solution_a_for_narrow_outputs_that_fit_in_l():
    g = MecGeometry(32, 64, 56, 56, 64, 3, 3, (1, 1), (1, 1))        # Q = 56 <= T; |y| = |L| / 3
    assert g.solution_a_allowed(32) and g.choose(32) == "A" and g.choose(32, threshold=55) == "B"
    wide = MecGeometry(8, 64, 224, 224, 64, 3, 3, (1, 1), (1, 1))
    assert wide.q > DEFAULT_T and wide.choose(8) == "B" and wide.choose(8, threshold=224) == "A"
    many_filters = MecGeometry(4, 3, 8, 8, 512, 1, 1)               # |y| > |L|: Solution A cannot permute through L
    assert not many_filters.solution_a_allowed(4) and many_filters.choose(4, threshold=10**6) == "B"


def test_geometry_of_a_problem_and_refusals():
    p = ConvProblem(8, 3, 32, 30, 16, 5, 3, pad=(2, 1), stride=(2, 3), layout="NHWC")
    g = MecGeometry.of(p)
    assert g == MecGeometry(8, 3, 32, 30, 16, 5, 3, (2, 1), (2, 3)) and g.x_shape() == (8, 32, 30, 3)
    assert (g.p, g.q, g.lh, g.lowered_shape(8)) == (16, 10, 35, (8, 10, 35, 3, 3))
    for bad in (ConvProblem(8, 3, 32, 32, 16, 3, 3), ConvProblem(8, 4, 32, 32, 16, 3, 3, layout="NHWC", groups=2),
                ConvProblem(8, 3, 32, 32, 16, 3, 3, layout="NHWC", dilation=(2, 2))):
        with pytest.raises(InputError):
            MecGeometry.of(bad)
    with pytest.raises(InputError, match="does not fit"):
        MecGeometry(1, 3, 2, 2, 4, 5, 1)
    with pytest.raises(InputError, match="NHWC"):
        MecGeometry(1, 3, 8, 8, 4, 3, 3, layout="NCHW")
    assert MecGeometry.of(p).lowered_bytes(8) == 4 * MecGeometry(8, 3, 32, 30, 16, 5, 3, (2, 1), (2, 3), dtype="float16"
                                                                  ).lowered_bytes(4)
    with pytest.raises(InputError):
        g.forward_gemms(8, "C")


def test_column_major_arguments_compute_the_same_product():
    g = MecGeometry(2, 3, 9, 8, 5, 3, 2, (1, 1), (2, 1))
    x, w, _ = _operands(2, g)
    gm = g.forward_gemms(2, "B", "rows")[1]
    cm = gm.column_major()
    lowered = lower_reference(x, g).reshape(-1)
    bufs = {"L": lowered, "w": w.reshape(-1)}

    def col(name_off, ld, rows, cols, stride, t):   # a column-major operand as BLAS reads it, op applied
        buf, off = bufs[name_off[0]], name_off[1]
        a = np.lib.stride_tricks.as_strided(buf[off:], (cm["batchCount"], rows, cols),
                                            (stride * 8, 8, ld * 8))
        return a.transpose(0, 2, 1) if t == "T" else a

    ka = (cm["k"], cm["m"]) if cm["transa"] == "T" else (cm["m"], cm["k"])
    kb = (cm["n"], cm["k"]) if cm["transb"] == "T" else (cm["k"], cm["n"])
    got = col(cm["A"], cm["lda"], *ka, cm["strideA"], cm["transa"]) @ col(cm["B"], cm["ldb"], *kb, cm["strideB"],
                                                                          cm["transb"])
    y = np.zeros(2 * g.p * g.q * g.k)
    run_gemms([gm], {**bufs, "y": y})
    for i in range(gm.batch):
        o = gm.c_offset + i * gm.stride_c
        np.testing.assert_allclose(got[i], y[o:o + gm.m * gm.ldc].reshape(gm.m, gm.ldc)[:, :gm.n].T, rtol=1e-12)


# ---- the kernels' index math ------------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(problems())
def test_mec_lower_thread_formula_builds_the_reference_lowering(nproblem):
    _, g = nproblem
    x = np.random.default_rng(3).standard_normal(g.x_shape(1))
    ref = lower_reference(x, g)[0].reshape(g.q, -1)
    for q in range(g.q):
        for t in range(g.lowered_row):
            h, w, ch = lowered_source(g, t, q)
            assert ref[q, t] == (x[0, h, w, ch] if 0 <= h < g.h and 0 <= w < g.w else 0.0)


@given(st.integers(0, 40), st.integers(1, 4), st.integers(1, 5), st.integers(1, 12))
def test_dx_gather_range_is_every_window_covering_the_column(wp, sw, s, q):
    brute = [qq for qq in range(q) for j in range(s) if qq * sw + j == wp]
    assert list(dx_gather_range(wp, sw, s, q)) == brute


# ---- nvcc build (the same check every kernel source gets) -------------------------------------------------------
def test_mec_source_is_self_contained_at_run_time():
    test_kernels_compile.test_run_time_source_is_self_contained("mec.cu")


@pytest.mark.skipif(test_kernels_compile.NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_mec_kernels_compile_with_nvcc(arch, tmp_path):
    test_kernels_compile.test_source_compiles_with_nvcc_without_spilling_hot_kernels("mec.cu", arch, tmp_path)
