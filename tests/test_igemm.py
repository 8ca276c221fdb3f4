"""The implicit-GEMM kernel (kernels/igemm.py, igemm.cu) without a GPU: its float64 references against a naive
loop, the kernel's gather and output index math emulated against the references for all three ops (hypothesis
over layouts, pads, strides 1-4, dilation, non-square filters, odd batches, C = 1 or 3), the alpha / beta blend,
channel slices of y, the choice of load directions and vector loads, the split of backward filter, and the carry
chain that walks each thread's reduction index (hypothesis)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from ucudnn.kernels import igemm as G

from ucudnn.errors import InputError
from ucudnn.problem import ConvProblem

SETTINGS = settings(max_examples=60, deadline=None)


@st.composite
def problems(draw):
    c, k = draw(st.sampled_from([1, 3, 4, 5, 8])), draw(st.integers(1, 6))
    h, w = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    r, s = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    pad = (draw(st.integers(0, 3)), draw(st.integers(0, 3)))
    stride = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    assume(dil[0] * (r - 1) + 1 <= h + 2 * pad[0] and dil[1] * (s - 1) + 1 <= w + 2 * pad[1])
    return ConvProblem(draw(st.integers(1, 3)), c, h, w, k, r, s, pad=pad, stride=stride, dilation=dil,
                       layout=draw(st.sampled_from(["NCHW", "NHWC"])))


def operands(op: str, p: ConvProblem, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape) for shape in p.operand_shapes(op)[:2])


def naive(op: str, p: ConvProblem, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Loops over every output and tap, NCHW inside, the definition of cross-correlation and its adjoints."""
    to = (lambda t: t.transpose(0, 3, 1, 2)) if p.layout == "NHWC" else (lambda t: t)
    back = (lambda t: t.transpose(0, 2, 3, 1)) if p.layout == "NHWC" else (lambda t: t)
    (ph, pw), (sh, sw), (dh, dw) = p.pad, p.stride, p.dilation
    if op == "forward":
        x, w, out = to(a), to(b), np.zeros((p.n, p.k, p.p, p.q))
    elif op == "backward_data":
        w, dy, out = to(a), to(b), np.zeros((p.n, p.c, p.h, p.w))
    else:
        x, dy, out = to(a), to(b), np.zeros((p.k, p.c, p.r, p.s))
    for n in range(p.n):
        for k in range(p.k):
            for pp in range(p.p):
                for qq in range(p.q):
                    for c in range(p.c):
                        for i in range(p.r):
                            for j in range(p.s):
                                h, v = pp * sh - ph + i * dh, qq * sw - pw + j * dw
                                if not (0 <= h < p.h and 0 <= v < p.w):
                                    continue
                                if op == "forward":
                                    out[n, k, pp, qq] += x[n, c, h, v] * w[k, c, i, j]
                                elif op == "backward_data":
                                    out[n, c, h, v] += dy[n, k, pp, qq] * w[k, c, i, j]
                                else:
                                    out[k, c, i, j] += dy[n, k, pp, qq] * x[n, c, h, v]
    return back(out)


@pytest.mark.parametrize("op", G.OPS)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_references_equal_the_naive_loops(op, layout):
    p = ConvProblem(2, 3, 7, 6, 4, 3, 2, pad=(1, 2), stride=(2, 1), dilation=(2, 1), layout=layout)
    a, b = operands(op, p)
    np.testing.assert_allclose(G.reference(op, p, a, b), naive(op, p, a, b), rtol=1e-12, atol=1e-12)


@SETTINGS
@given(p=problems(), op=st.sampled_from(G.OPS))
def test_the_kernels_index_math_computes_each_op(p, op):
    a, b = operands(op, p)
    got = G.emulate(op, p, a, b)
    np.testing.assert_allclose(got, G.reference(op, p, a, b).ravel(), rtol=1e-10, atol=1e-10)


@SETTINGS
@given(p=problems(), beta=st.sampled_from([0.0, 1.0, -0.5]))
def test_backward_datas_scatter_form_adds_each_taps_product_into_its_pixel(p, beta):
    w, dy = operands("backward_data", p)
    old = np.random.default_rng(2).standard_normal(p.n * p.c * p.h * p.w)
    got = G.emulate("backward_data", p, w, dy, old, alpha=0.5, beta=beta, scatter=True)
    want = 0.5 * G.reference("backward_data", p, w, dy).ravel() + beta * old
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_the_scatter_form_is_dy_times_the_packed_filter_and_measured_where_strides_skip_taps():
    conv1 = ConvProblem(256, 3, 224, 224, 64, 11, 11, pad=(2, 2), stride=(4, 4), layout="NHWC")
    g = G.Gemm.of("backward_data", conv1, scatter=True)
    assert (g.m, g.nc, g.kr) == (256 * 55 * 55, 3 * 121, 64) and g.a_k and g.vec_a and not g.vec_b
    assert g.name_expr(True, False).startswith(f"igemm_conv<{G.SCATTER_CODE},") and not g.lm
    assert G.out_vector(g, conv1, 0) == G.VEC_NONE                 # atomics, one float each
    assert G.Gemm.of("backward_data", conv1).nc == 3              # the gather form: 3 of 64 columns busy
    assert [sc for _, _, sc in G.variants("backward_data", conv1)] == [False] * 4 + [True] * 2
    assert not any(sc for _, _, sc in G.variants("backward_data", conv1, deterministic=True))
    wide = ConvProblem(8, 64, 13, 13, 128, 3, 3, pad=(1, 1))
    assert not any(sc for _, _, sc in G.variants("backward_data", wide))  # stride 1, 64 channels: gather only
    with pytest.raises(InputError, match="only backward data") as e:
        G.Gemm.of("forward", wide, scatter=True)
    assert e.value.field == "scatter"


@pytest.mark.parametrize("op", G.OPS)
def test_alpha_and_beta_blend_with_the_output(op):
    p = ConvProblem(3, 4, 5, 5, 8, 3, 3, pad=(1, 1), layout="NHWC")
    a, b = operands(op, p)
    old = np.random.default_rng(1).standard_normal(int(np.prod(p.operand_shapes(op)[2])))
    got = G.emulate(op, p, a, b, old, alpha=0.5, beta=-2.0)
    np.testing.assert_allclose(got, 0.5 * G.reference(op, p, a, b).ravel() - 2.0 * old, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_a_channel_slice_writes_only_its_channels_of_the_wider_y(layout):
    whole = ConvProblem(2, 3, 6, 5, 8, 3, 3, pad=(1, 1), layout=layout)
    part = whole.with_channels(3, 8)
    x, w = operands("forward", whole)
    w_part = w[:3]
    got = G.emulate("forward", part, x, w_part)
    ref = G.reference("forward", whole, x, w)
    y = ref if layout == "NCHW" else ref.transpose(0, 3, 1, 2)
    y_got = np.zeros(whole.n * 8 * whole.p * whole.q)
    y_got[:got.size] = got
    y_got = y_got.reshape(whole.y_shape())
    y_got = y_got if layout == "NCHW" else y_got.transpose(0, 3, 1, 2)
    np.testing.assert_allclose(y_got[:, :3], y[:, :3], rtol=1e-10, atol=1e-10)
    assert not y_got[:, 3:].any()


@given(p=problems(), op=st.sampled_from(G.OPS), slice_k=st.booleans(), k_total=st.integers(0, 9))
@SETTINGS
def test_float4_stores_are_claimed_only_where_four_rows_or_columns_are_four_aligned_floats(p, op, slice_k, k_total):
    if slice_k and op == "forward":
        p = p.with_channels(p.k, p.k + k_total)
    g = G.Gemm.of(op, p)
    rows, cols = G.out_offsets(g, p)
    form = G.out_vector(g, p, 0)
    assert G.out_vector(g, p, 4) == G.VEC_NONE            # an unaligned output pointer stores single floats
    assert form != G.VEC_ROWS or g.lm                      # lanes run along rows where rows are stored as float4
    quads = {G.VEC_ROWS: (rows, cols), G.VEC_COLS: (cols, rows)}.get(form)
    if quads is None:
        return
    along, other = quads
    assert (other % 4 == 0).all()
    for first in range(0, len(along), 4):                 # every 4-aligned quad: 16-byte aligned, consecutive
        q = along[first:first + 4]
        assert q[0] % 4 == 0 and (q == q[0] + np.arange(len(q))).all()


def test_nchw_outputs_store_along_rows_and_nhwc_and_dw_along_columns():
    c1 = ConvProblem(256, 1, 28, 28, 512, 5, 5, pad=(2, 2))
    assert G.out_vector(G.Gemm.of("forward", c1), c1, 0) == G.VEC_ROWS
    odd = ConvProblem(3, 1, 27, 27, 16, 5, 5, pad=(2, 2))                  # 729 pixels a plane
    assert G.out_vector(G.Gemm.of("forward", odd), odd, 0) == G.VEC_NONE
    nhwc = ConvProblem(8, 64, 27, 27, 192, 5, 5, pad=(2, 2), layout="NHWC")
    for op in G.OPS:
        assert G.out_vector(G.Gemm.of(op, nhwc), nhwc, 0) == G.VEC_COLS
    assert G.Gemm.of("forward", c1).name_expr(False, False).endswith(",true>")


def test_loads_run_along_contiguous_memory_and_vectors_need_four_aligned_channels():
    nhwc = ConvProblem(8, 64, 27, 27, 192, 5, 5, pad=(2, 2), layout="NHWC")
    f = G.Gemm.of("forward", nhwc)
    assert (f.m, f.nc, f.kr) == (8 * 27 * 27, 192, 64 * 25)
    assert f.a_k and f.b_k and f.cin and f.vec_a and f.vec_b
    assert G.vector_ok(f, 1 << 20, 1 << 20) == (True, True)
    assert G.vector_ok(f, (1 << 20) + 4, 1 << 20) == (False, True)
    d = G.Gemm.of("backward_data", nhwc)
    assert (d.m, d.nc, d.kr) == (8 * 27 * 27, 64, 192 * 25) and d.a_k and not d.b_k and d.vec_a and d.vec_b
    wg = G.Gemm.of("backward_filter", nhwc)
    assert (wg.m, wg.nc, wg.kr) == (192, 64 * 25, 8 * 27 * 27) and not wg.a_k and not wg.b_k
    assert wg.vec_a and wg.vec_b                  # four consecutive channels of dy and of x
    odd = ConvProblem(8, 6, 9, 9, 10, 3, 3, layout="NHWC")
    assert not any((G.Gemm.of(op, odd).vec_a or G.Gemm.of(op, odd).vec_b) for op in ("backward_filter",))
    assert not G.Gemm.of("backward_data", odd).vec_b
    rgb = ConvProblem(8, 3, 224, 224, 64, 11, 11, pad=(2, 2), stride=(4, 4), layout="NHWC")
    assert not G.Gemm.of("forward", rgb).vec_a and not G.Gemm.of("forward", rgb).vec_b
    nchw = G.Gemm.of("forward", ConvProblem(8, 64, 27, 27, 192, 5, 5, pad=(2, 2)))
    assert not nchw.a_k and nchw.b_k and not nchw.cin and not nchw.vec_a and nchw.vec_b


@given(k=st.integers(1, 400), c=st.integers(1, 400), n=st.integers(1, 300), hw=st.integers(1, 60),
       sms=st.sampled_from([1, 80, 132]))
@settings(max_examples=80, deadline=None)
def test_backward_filters_split_covers_the_reduction_exactly_once(k, c, n, hw, sms):
    g = G.Gemm.of("backward_filter", ConvProblem(n, c, hw, hw, k, 3, 3, pad=(1, 1), layout="NHWC"))
    z, per = g.split(sms)
    assert per % G.BK == 0 and z >= 1
    assert (z - 1) * per < g.kr <= z * per           # every split has work, the last one ends at kr
    assert z == 1 or per >= G.MIN_SPLIT - G.BK


def test_forward_and_backward_data_do_not_split():
    p = ConvProblem(1, 384, 13, 13, 256, 3, 3, pad=(1, 1))
    for op in ("forward", "backward_data"):
        assert G.Gemm.of(op, p).split(132) == (1, G.Gemm.of(op, p).kr)
        with pytest.raises(InputError, match="only backward filter"):
            G.Gemm.of(op, p).split_into(2)


@given(kr_n=st.integers(1, 64), splits=st.integers(1, 5000))
@settings(max_examples=60, deadline=None)
def test_a_recorded_split_count_rebuilds_a_split_that_covers_the_reduction(kr_n, splits):
    g = G.Gemm.of("backward_filter", ConvProblem(kr_n, 8, 9, 9, 16, 3, 3, pad=(1, 1)))
    z, per = g.split_into(splits)
    assert per % G.BK == 0 and 1 <= z <= splits and (z - 1) * per < g.kr <= z * per


@pytest.mark.parametrize("problem, why", [
    (ConvProblem(2, 4, 5, 5, 4, 3, 3, dtype="float16"), "FP32 only"),
    (ConvProblem(2, 4, 5, 5, 4, 3, 3, groups=2), "grouped"),
    (ConvProblem(2 ** 14, 64, 32, 32, 64, 3, 3, pad=(1, 1)), "x spans 1073741824 elements"),
    (ConvProblem(2 ** 13, 64, 32, 32, 128, 3, 3, pad=(1, 1)), "y spans 1073741824 elements"),
])
def test_refusals_name_the_reason(problem, why):
    assert why in G.refusal("forward", problem)
    if problem.dtype == "float32" and problem.groups == 1:       # the 32-bit offsets: a smaller micro-batch runs
        assert G.refusal("forward", problem.with_batch(problem.n // 2)) is None
    with pytest.raises(InputError, match=why):
        G.Gemm.of("forward", problem)


@given(nc=st.integers(1, 2000))
@settings(max_examples=200, deadline=None)
def test_the_tile_width_leaves_the_fewest_columns_idle_and_the_wider_wins_a_tie(nc):
    idle = {bn: -(-nc // bn) * bn - nc for bn in G.WIDTHS}
    picked = G.tile_width(nc)
    assert idle[picked] == min(idle.values())
    assert all(bn < picked for bn in G.WIDTHS if idle[bn] == idle[picked] and bn != picked)
    assert idle[picked] < G.NARROW                    # never a whole narrow tile's width idle


@pytest.mark.parametrize("k, widths", [(64, [128, 128, 64, 64]), (96, [128, 128, 96, 96]),
                                       (192, [128, 128, 96, 96]), (256, [128, 128]), (384, [128, 128])])
def test_the_source_measures_both_stage_counts_and_a_narrower_tile_where_it_fits(k, widths):
    p = ConvProblem(8, 64, 13, 13, k, 3, 3, pad=(1, 1), layout="NHWC")
    v = G.variants("forward", p)
    assert [bn for bn, _, _ in v] == widths and [ks for _, ks, _ in v] == [1, 2] * (len(widths) // 2)
    assert not any(scatter for _, _, scatter in v)
    assert G.Gemm.of("forward", p).bn == widths[-1]             # the default tile is tile_width's
    g = G.Gemm.of("forward", p, 64, 2)
    assert (g.bn, g.ks) == (64, 2) and g.grid()[1] == -(-k // 64)
    assert g.name_expr(True, True).endswith(",64,2,false>")


@pytest.mark.parametrize("bn, ks, field", [(80, 1, "bn"), (128, 3, "ks"), (64, 0, "ks"), (True, 1, "bn")])
def test_a_tile_the_kernel_is_not_built_for_is_refused_by_name(bn, ks, field):
    with pytest.raises(InputError) as e:
        G.Gemm.of("forward", ConvProblem(2, 4, 5, 5, 4, 3, 3), bn, ks)
    assert e.value.field == field


@given(dims=st.tuples(st.integers(1, 40), st.integers(1, 7), st.integers(1, 30)), cin=st.booleans(),
       start=st.integers(0, 7), steps=st.integers(1, 60))
@settings(max_examples=300, deadline=None)
def test_the_carry_chain_walks_the_reduction_as_a_decode_would_and_says_when_the_tap_moves(dims, cin, start, steps):
    """The kernel decodes a thread's first reduction index once and then carries it BK at a time (ig_advance);
    its float4 loads recompute their cached tap only where the step carried.  Stepping must land on the decode of
    every index, and carry exactly where an outer coordinate changed -- including channels fewer than BK, where
    one step wraps several taps."""
    CH, R, S = dims
    total = CH * R * S
    kk = start
    coords = tuple(int(v) for v in G._split(np.array(kk), CH, R, S, cin))
    for _ in range(steps):
        if kk + G.BK >= total:
            break
        ch, r, s, carried = G.advance(*coords, dims, cin)
        kk += G.BK
        want = tuple(int(v) for v in G._split(np.array(kk), CH, R, S, cin))
        assert (ch, r, s) == want
        inner_before, inner_after = (coords[0], ch) if cin else (coords[2], s)
        outer_moved = (coords[1:] if cin else coords[:2]) != ((r, s) if cin else (ch, r))
        assert carried == outer_moved, (coords, (ch, r, s))
        assert carried or inner_after == inner_before + G.BK
        coords = (ch, r, s)
