"""ucudnn's own kernels compute what NumPy computes (GPU; skipped without one).

Every kernel, both dtypes, every layout, on awkward shapes: sizes that are not
multiples of a tile, C = 3, rows of length 1, odd lengths that defeat vector
accesses, -inf entries, huge magnitudes.  Inputs are fresh random numbers
(never zeros); outputs are poisoned with NaN before each run, so an element
the kernel forgets to write fails the comparison.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

DTYPES = ["float32", "float16"]


@pytest.fixture
def cp():
    import cupy

    return cupy


@pytest.fixture
def rng():
    return np.random.default_rng()


def poisoned(cp, shape, dtype):
    return cp.full(shape, np.nan, dtype=dtype)


def close(got, ref, dtype, rtol=None, atol=None):
    """float32: ~1e-6 relative; float16 outputs carry their own rounding (2**-11)."""
    got = np.asarray(got, dtype=np.float64)
    rtol = rtol if rtol is not None else (2e-6 if dtype == "float32" else 2e-3)
    atol = atol if atol is not None else (1e-7 if dtype == "float32" else 2e-5)
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol, equal_nan=True)


# --- layout -------------------------------------------------------------------------------------
LAYOUT_SHAPES = [(5, 3, 7, 9), (64, 3, 11, 13), (33, 17, 5, 3), (2, 64, 8, 8), (1, 1, 1, 1), (70, 40, 3, 3),
                 (3, 130, 1, 67), (40, 3, 10, 10), (4, 3, 16, 20), (9, 96, 7, 7),  # the last three: flat vectors
                 (40, 48, 3, 5)]  # NHWC <-> CHWN: tiles of several m


@pytest.mark.parametrize("nchw", LAYOUT_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("src,dst", list(itertools.permutations(["NCHW", "CHWN", "NHWC"], 2)))
def test_layout_transform_is_numpys_transpose(cp, rng, src, dst, dtype, nchw):
    from ucudnn.kernels import transform_layout
    from ucudnn.kernels.layout import output_shape

    x = rng.standard_normal(output_shape(nchw, "NCHW", src)).astype(dtype)
    out = poisoned(cp, output_shape(nchw, "NCHW", dst), dtype)
    y = transform_layout(cp.asarray(x), src, dst, out=out)
    assert y is out
    np.testing.assert_array_equal(cp.asnumpy(y), np.transpose(x, [src.index(c) for c in dst]))


@pytest.mark.parametrize("dtype", ["uint8", "float64"])
def test_layout_transform_moves_any_element_size(cp, rng, dtype):
    from ucudnn.kernels import transform_layout

    x = (rng.standard_normal((9, 5, 6, 66)) * 100).astype(dtype)
    y = transform_layout(cp.asarray(x), "NCHW", "NHWC")
    np.testing.assert_array_equal(cp.asnumpy(y), x.transpose(0, 2, 3, 1))


@pytest.mark.parametrize("kernel", ["tile", "rows", "shifted", "bulk"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "uint8", "float64"])
@pytest.mark.parametrize("nhwc", [(1, 3, 11, 33), (3, 5, 7, 40), (2, 11, 11, 96), (2, 1, 67, 130), (4, 9, 9, 64)],
                         ids=lambda s: "x".join(map(str, s)))
def test_odd_length_output_rows_transpose_exactly_with_either_kernel(cp, rng, nhwc, dtype, kernel):
    from ucudnn.kernels import transform_layout

    x = (rng.standard_normal(nhwc) * 100).astype(dtype)
    out = cp.full((nhwc[0], nhwc[3], nhwc[1], nhwc[2]), 7, dtype=dtype)  # 7: never a value of x at these odds
    y = transform_layout(cp.asarray(x), "NHWC", "NCHW", out=out, kernel=kernel)
    np.testing.assert_array_equal(cp.asnumpy(y), x.transpose(0, 3, 1, 2))


@pytest.mark.parametrize("tile", [(64, 1, 96), (128, 1, 48), (32, 1, 40)])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("nhwc", [(3, 5, 7, 96), (2, 11, 11, 40), (1, 13, 3, 130)], ids=lambda s: "x".join(map(str, s)))
def test_rows_kernel_with_any_allowed_tile_transposes_exactly(cp, rng, nhwc, dtype, tile):
    from ucudnn.kernels import transform_layout

    from ucudnn.errors import InputError

    x = (rng.standard_normal(nhwc) * 100).astype(dtype)
    out = cp.full((nhwc[0], nhwc[3], nhwc[1], nhwc[2]), 7, dtype=dtype)
    try:
        y = transform_layout(cp.asarray(x), "NHWC", "NCHW", out=out, kernel="rows", tile=tile)
    except InputError as e:  # a tile the rows kernel cannot take for this element size is refused, by name
        assert e.field == "tile" and tile[0] % (8 * 16 // x.itemsize)
        return
    np.testing.assert_array_equal(cp.asnumpy(y), x.transpose(0, 3, 1, 2))


@pytest.mark.parametrize("kernel,tile", [("shifted", (256, 1, 32)), ("bulk", (256, 1, 40)),
                                         ("shifted", (512, 1, 7))])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("nhwc", [(3, 5, 7, 96), (2, 23, 29, 40), (1, 55, 55, 130)], ids=lambda s: "x".join(map(str, s)))
def test_shifted_rows_kernel_with_other_tiles_transposes_exactly(cp, rng, nhwc, dtype, kernel, tile):
    from ucudnn.kernels import transform_layout

    x = (rng.standard_normal(nhwc) * 100).astype(dtype)
    out = cp.full((nhwc[0], nhwc[3], nhwc[1], nhwc[2]), 7, dtype=dtype)
    y = transform_layout(cp.asarray(x), "NHWC", "NCHW", out=out, kernel=kernel, tile=tile)
    np.testing.assert_array_equal(cp.asnumpy(y), x.transpose(0, 3, 1, 2))


@pytest.mark.parametrize("tile", [None, (256, 1, 32), (128, 1, 64), (128, 1, 32)], ids=str)
@pytest.mark.parametrize("dtype", ["float32", "int32"])
@pytest.mark.parametrize("nhwc", [(1, 3, 11, 33), (3, 5, 7, 96), (2, 7, 6, 70), (2, 11, 11, 40), (2, 1, 67, 130),
                                  (2, 23, 29, 40), (1, 55, 55, 130), (4, 9, 9, 64)],
                         ids=lambda s: "x".join(map(str, s)))
def test_rows_kernel_with_cp_async_staging_transposes_exactly(cp, rng, nhwc, dtype, tile):
    # H * W = 1, 2 and 3 (mod 4): every row shift pattern; D under, at and over the tile; several tiles along a
    from ucudnn.kernels import transform_layout

    x = (rng.standard_normal(nhwc) * 100).astype(dtype)
    out = cp.full((nhwc[0], nhwc[3], nhwc[1], nhwc[2]), 7, dtype=dtype)
    y = transform_layout(cp.asarray(x), "NHWC", "NCHW", out=out, kernel="async", tile=tile)
    np.testing.assert_array_equal(cp.asnumpy(y), x.transpose(0, 3, 1, 2))


def test_rows_kernel_with_cp_async_staging_refuses_what_it_cannot_take(cp):
    from ucudnn.kernels import transform_layout

    from ucudnn.errors import InputError

    with pytest.raises(InputError, match="async") as e:
        transform_layout(cp.ones((2, 5, 7, 96), "float16"), "NHWC", "NCHW", kernel="async")
    assert e.value.field == "tile"
    with pytest.raises(InputError, match="async"):
        transform_layout(cp.ones((2, 5, 7, 96), "float32"), "NHWC", "NCHW", kernel="async", tile=(128, 1, 48))


def test_layout_transform_of_a_misaligned_view_drops_to_narrow_accesses(cp, rng):
    from ucudnn.kernels import transform_layout

    flat = cp.asarray(rng.standard_normal(1 + 64 * 32 * 8 * 8).astype("float32"))
    x = flat[1:].reshape(64, 32, 8, 8)  # data pointer 4 bytes past a 256-byte boundary
    y = transform_layout(x, "NCHW", "CHWN")
    np.testing.assert_array_equal(cp.asnumpy(y), cp.asnumpy(x).transpose(1, 2, 3, 0))


@pytest.mark.parametrize("offset", [0, 1, 3])   # elements past a 256-byte boundary, both ends
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("src,dst", [("NCHW", "NHWC"), ("NHWC", "NCHW"), ("NCHW", "CHWN"), ("NHWC", "NHWC")])
def test_a_prepared_launcher_on_raw_pointers_transposes_like_transform_layout(cp, rng, src, dst, dtype, offset):
    from ucudnn.kernels.layout import launcher, output_shape

    shape = (7, 5, 11, 13) if src == "NCHW" else (7, 11, 13, 5)
    n = int(np.prod(shape))
    x = cp.asarray(rng.standard_normal(n + offset).astype(dtype))[offset:]
    y = cp.full(n + offset, np.nan, dtype=dtype)[offset:]
    launch = launcher(shape, np.dtype(dtype).itemsize, src, dst)
    for _ in range(2):   # the second call takes the cached plan
        launch(x.data.ptr, y.data.ptr)
    perm = [src.index(c) for c in dst]
    np.testing.assert_array_equal(cp.asnumpy(y).reshape(output_shape(shape, src, dst)),
                                  cp.asnumpy(x).reshape(shape).transpose(perm))


def test_layout_transform_of_a_non_contiguous_input_and_same_layout(cp, rng):
    from ucudnn.kernels import transform_layout

    x = cp.asarray(rng.standard_normal((4, 6, 5, 8)).astype("float32"))[:, ::2]
    np.testing.assert_array_equal(cp.asnumpy(transform_layout(x, "NCHW", "NHWC")), cp.asnumpy(x).transpose(0, 2, 3, 1))
    same = transform_layout(x, "NCHW", "NCHW")
    np.testing.assert_array_equal(cp.asnumpy(same), cp.asnumpy(x))


def test_layout_transform_refuses_numpy_and_bad_out(cp):
    from ucudnn.kernels import transform_layout

    from ucudnn.errors import InputError

    with pytest.raises(InputError, match="x"):
        transform_layout(np.zeros((1, 2, 3, 4), "float32"), "NCHW", "NHWC")
    with pytest.raises(InputError, match="out"):
        transform_layout(cp.ones((1, 2, 3, 4), "float32"), "NCHW", "NHWC", out=cp.empty((1, 2, 3, 4), "float32"))


# --- softmax ------------------------------------------------------------------------------------
def softmax_ref(x, axis):
    x = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)


def softmax_grad_ref(y, dy, axis):
    y, dy = y.astype(np.float64), dy.astype(np.float64)
    return y * (dy - (y * dy).sum(axis=axis, keepdims=True))


ROW_CASES = [  # (rows, length, forced kernel or None)
    (128, 10, None), (7, 1, None), (5, 3, None), (33, 1000, None), (3, 4097, None), (4, 33, None), (2, 2048, None),
    (3, 10000, None), (2, 32768, None), (2, 70001, None), (65, 1000, "block"), (5, 777, "stream"),
    (3, 12345, "block"), (9, 8192, "stream"), (2, 70001, "cluster_raw"), (3, 40000, "cluster_raw"),
    (5, 131072, "cluster_raw"), (2, 70001, "cluster_online"), (3, 40000, "cluster_online"),
    (5, 131072, "cluster_online"),
]


def _forced_ok(kernel):
    from ucudnn.kernels import _compile

    return not (kernel or "").startswith("cluster") or _compile.compute_capability() >= 90


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,length,kernel", ROW_CASES)
def test_softmax_rows_forward_and_backward_match_numpy(cp, rng, rows, length, kernel, dtype):
    from ucudnn.kernels import softmax_backward, softmax_forward

    x = (rng.standard_normal((rows, length)) * 4).astype(dtype)
    y = softmax_forward(cp.asarray(x), out=poisoned(cp, x.shape, dtype), kernel=kernel)
    close(cp.asnumpy(y), softmax_ref(x, -1), dtype)
    yh = cp.asnumpy(y)
    dy = rng.standard_normal(x.shape).astype(dtype)
    dx = softmax_backward(y, cp.asarray(dy), out=poisoned(cp, x.shape, dtype), kernel=kernel)
    close(cp.asnumpy(dx), softmax_grad_ref(yh, dy, -1), dtype, atol=1e-6 if dtype == "float32" else 1e-4)


@pytest.mark.parametrize("hints", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_raw_cluster_softmax_with_or_without_cache_hints_matches_numpy(cp, rng, monkeypatch, dtype, hints):
    from ucudnn.kernels import softmax, softmax_forward

    if not _forced_ok("cluster_raw"):
        pytest.skip("clusters need sm_90")
    monkeypatch.setattr(softmax, "RAW_STREAM_HINTS", hints)
    x = (rng.standard_normal((4, 70000)) * 4).astype(dtype)
    x[1, ::5] = -np.inf
    x[2] += 6e4 if dtype == "float16" else 1e30
    y = softmax_forward(cp.asarray(x), out=poisoned(cp, x.shape, dtype), kernel="cluster_raw")
    close(cp.asnumpy(y), softmax_ref(x, -1), dtype)


@pytest.mark.parametrize("threads", [256, 512])
@pytest.mark.parametrize("length", [40000, 131072])
def test_online_cluster_softmax_combines_blocks_whose_slices_are_all_minus_inf(cp, rng, monkeypatch, threads, length):
    from ucudnn.kernels import softmax, softmax_forward

    if not _forced_ok("cluster_online"):
        pytest.skip("clusters need sm_90")
    monkeypatch.setattr(softmax, "ONLINE_NT", threads)
    x = (rng.standard_normal((5, length)) * 4).astype("float16")
    x[0, : length // 2] = -np.inf  # whole slices of -inf: those blocks' factor is 0, not NaN
    x[1, length // 3:] = -np.inf
    x[2] = -np.inf  # a row of only -inf -> NaN, as NumPy's formula
    x[3] += np.float16(6e4)  # huge magnitudes: only differences matter
    x[4, ::7] = -np.inf
    y = cp.asnumpy(softmax_forward(cp.asarray(x), out=poisoned(cp, x.shape, "float16"), kernel="cluster_online"))
    close(y, softmax_ref(x, -1), "float16")
    assert np.all(y[0, : length // 2] == 0) and np.all(np.isnan(y[2])) and np.all(y[4, ::7] == 0)


@pytest.mark.parametrize("kernel", ["warp", "block", "cluster", "cluster_raw", "cluster_online", "stream"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_is_stable_for_inf_entries_huge_magnitudes_and_unit_rows(cp, rng, kernel, dtype):
    from ucudnn.kernels import softmax_forward

    if not _forced_ok(kernel):
        pytest.skip("clusters need sm_90")
    big = 1e30 if dtype == "float32" else 6e4
    length = 300 if kernel == "warp" else 5000
    x = rng.standard_normal((6, length)) * 3
    x[0] += big  # huge but equal-ish magnitudes: only differences matter
    x[1] = -big + x[1]
    x[2, ::3] = -np.inf  # -inf entries -> exactly 0
    x[3] = -np.inf  # a row of only -inf -> NaN, as NumPy's formula
    x = x.astype(dtype)
    y = cp.asnumpy(softmax_forward(cp.asarray(x), out=poisoned(cp, x.shape, dtype), kernel=kernel))
    ref = softmax_ref(x, -1)
    close(y, ref, dtype)
    assert np.all(y[2, ::3] == 0) and np.all(np.isnan(y[3])) and np.isfinite(y[[0, 1, 2, 4, 5]]).all()
    ones = softmax_forward(cp.asarray(rng.standard_normal((9, 1)).astype(dtype)) * 1000)
    assert np.all(cp.asnumpy(ones) == 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,axis", [((2, 3, 5, 7), 1), ((4, 21, 16, 16), 1), ((2, 1000, 3, 3), 1),
                                        ((3, 4, 5, 6), 0), ((3, 4, 5, 6), 2), ((6, 1, 4, 4), 1), ((5, 37), 0)])
def test_softmax_over_channels_and_other_axes_matches_numpy(cp, rng, shape, axis, dtype):
    from ucudnn.kernels import softmax_backward, softmax_forward

    x = (rng.standard_normal(shape) * 4).astype(dtype)
    x.reshape(-1)[::7] = -np.inf
    y = softmax_forward(cp.asarray(x), axis=axis, out=poisoned(cp, shape, dtype))
    close(cp.asnumpy(y), softmax_ref(x, axis), dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    dx = softmax_backward(y, cp.asarray(dy), axis=axis, out=poisoned(cp, shape, dtype))
    close(cp.asnumpy(dx), softmax_grad_ref(cp.asnumpy(y), dy, axis), dtype, atol=1e-6 if dtype == "float32" else 1e-4)


def test_softmax_refuses_bad_input(cp):
    from ucudnn.kernels import softmax_backward, softmax_forward

    from ucudnn.errors import InputError

    with pytest.raises(InputError, match="x.dtype"):
        softmax_forward(cp.ones((2, 3), "float64"))
    with pytest.raises(InputError, match="axis"):
        softmax_forward(cp.ones((2, 3), "float32"), axis=2)
    with pytest.raises(InputError, match="dy"):
        softmax_backward(cp.ones((2, 3), "float32"), cp.ones((3, 2), "float32"))
    with pytest.raises(InputError, match="kernel"):
        softmax_forward(cp.ones((2, 3, 4), "float32"), axis=1, kernel="warp")


# --- pooling ------------------------------------------------------------------------------------
def pool_ref(x_nchw, k, s, p, mode, include_pad):
    """(y, argmax h*W+w, divisor) in float64 for NCHW input; ties to the first max in row-major order."""
    (kh, kw), (sh, sw), (ph, pw) = k, s, p
    n, c, h, w = x_nchw.shape
    P, Q = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    xf = x_nchw.astype(np.float64)
    best = np.full((n, c, P, Q), -np.inf)
    arg = np.full((n, c, P, Q), -1, dtype=np.int64)
    total = np.zeros((n, c, P, Q))
    count = np.zeros((P, Q))
    for i in range(kh):
        for j in range(kw):
            hh = np.arange(P) * sh - ph + i
            ww = np.arange(Q) * sw - pw + j
            ok = (hh[:, None] >= 0) & (hh[:, None] < h) & (ww[None, :] >= 0) & (ww[None, :] < w)
            v = xf[:, :, np.clip(hh, 0, h - 1)][:, :, :, np.clip(ww, 0, w - 1)]
            take = ok & ((v > best) | (arg < 0))
            best = np.where(take, v, best)
            arg = np.where(take, hh[:, None] * w + ww[None, :], arg)
            total += np.where(ok, v, 0)
            count += ok
    if mode == "max":
        return best, arg, None
    div = np.full((P, Q), kh * kw, dtype=np.float64) if include_pad else count
    return total / div, None, div


def pool_grad_ref(x_nchw, dy, k, s, p, mode, include_pad):
    n, c, h, w = x_nchw.shape
    _, arg, div = pool_ref(x_nchw, k, s, p, mode, include_pad)
    dyf = dy.astype(np.float64)
    dx = np.zeros((n, c, h * w))
    if mode == "max":
        for i, j in np.ndindex(n, c):
            np.add.at(dx[i, j], arg[i, j].ravel(), dyf[i, j].ravel())
        return dx.reshape(n, c, h, w)
    (kh, kw), (sh, sw), (ph, pw) = k, s, p
    dx = np.zeros((n, c, h + 2 * ph, w + 2 * pw))
    g = dyf / div
    for a in range(kh):
        for b in range(kw):
            dx[:, :, a:a + sh * g.shape[2]:sh, b:b + sw * g.shape[3]:sw] += g
    return dx[:, :, ph:ph + h, pw:pw + w]


def to_layout(a_nchw, layout):
    return a_nchw if layout == "NCHW" else np.ascontiguousarray(a_nchw.transpose(1, 2, 3, 0))


def from_layout(a, layout):
    return a if layout == "NCHW" else a.transpose(3, 0, 1, 2)


POOL_CASES = [  # (N, C, H, W, window, stride, pad)
    (2, 3, 13, 13, 3, 2, 0), (3, 5, 12, 12, 2, 2, 0), (2, 4, 11, 9, 3, 1, 1), (1, 2, 55, 55, 3, 2, 0),
    (1, 2, 100, 90, 3, 2, 1), (32, 3, 7, 7, (3, 2), (2, 1), (1, 0)), (8, 2, 5, 6, 5, 3, 2), (3, 1, 1, 1, 1, 1, 0),
]


@pytest.mark.parametrize("layout", ["NCHW", "CHWN"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", POOL_CASES, ids=lambda c: "-".join(map(str, c)))
def test_max_pooling_values_indices_and_gradients_match_numpy(cp, rng, case, dtype, layout):
    from ucudnn.kernels import pool2d_backward, pool2d_forward

    n, c, h, w, k, s, p = case
    k2, s2, p2 = [(v, v) if isinstance(v, int) else v for v in (k, s, p)]
    x = (np.round(rng.standard_normal((n, c, h, w)) * 2) / 2).astype(dtype)  # steps of 0.5: many ties
    ref, arg, _ = pool_ref(x, k2, s2, p2, "max", True)
    xd = cp.asarray(to_layout(x, layout))
    for coarsening in ([(1, 1), (2, 2), (1, 4)] if dtype == "float32" else [(3, 1), (1, 3)]):
        out = poisoned(cp, to_layout(ref, layout).shape, dtype)
        y, idx = pool2d_forward(xd, k, s, p, "max", layout, return_indices=True, out=out, coarsening=coarsening)
        np.testing.assert_array_equal(from_layout(cp.asnumpy(y), layout).astype(np.float64), ref)
        np.testing.assert_array_equal(from_layout(cp.asnumpy(idx), layout), arg)
        plain = pool2d_forward(xd, k, s, p, "max", layout, coarsening=coarsening,  # no indices: another path
                               out=poisoned(cp, to_layout(ref, layout).shape, dtype))
        np.testing.assert_array_equal(from_layout(cp.asnumpy(plain), layout).astype(np.float64), ref)
    dy = rng.standard_normal(ref.shape).astype(dtype)
    dref = pool_grad_ref(x, dy, k2, s2, p2, "max", True)
    dyd = cp.asarray(to_layout(dy, layout))
    for indices in (idx, None):
        dx = pool2d_backward(dyd, xd, k, s, p, "max", layout, indices=indices, out=poisoned(cp, xd.shape, dtype))
        close(from_layout(cp.asnumpy(dx), layout), dref, dtype, atol=1e-6 if dtype == "float32" else 2e-3)


@pytest.mark.parametrize("include_pad", [True, False])
@pytest.mark.parametrize("layout", ["NCHW", "CHWN"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [POOL_CASES[i] for i in (0, 2, 5, 6)], ids=lambda c: "-".join(map(str, c)))
def test_average_pooling_and_its_gradient_match_numpy(cp, rng, case, dtype, layout, include_pad):
    from ucudnn.kernels import pool2d_backward, pool2d_forward

    n, c, h, w, k, s, p = case
    k2, s2, p2 = [(v, v) if isinstance(v, int) else v for v in (k, s, p)]
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    ref, _, _ = pool_ref(x, k2, s2, p2, "avg", include_pad)
    xd = cp.asarray(to_layout(x, layout))
    for coarsening in [(1, 1), (2, 3)] if include_pad else [(2, 1)]:
        y = pool2d_forward(xd, k, s, p, "avg", layout, count_include_pad=include_pad, coarsening=coarsening,
                           out=poisoned(cp, to_layout(ref, layout).shape, dtype))
        close(from_layout(cp.asnumpy(y), layout), ref, dtype, atol=1e-6 if dtype == "float32" else 1e-3)
    dy = rng.standard_normal(ref.shape).astype(dtype)
    dx = pool2d_backward(cp.asarray(to_layout(dy, layout)), xd, k, s, p, "avg", layout,
                         count_include_pad=include_pad, out=poisoned(cp, xd.shape, dtype))
    close(from_layout(cp.asnumpy(dx), layout), pool_grad_ref(x, dy, k2, s2, p2, "avg", include_pad), dtype,
          atol=1e-6 if dtype == "float32" else 2e-3)


@pytest.mark.parametrize("pipeline,async_stage", [(True, False), (False, False), (False, True)],
                         ids=["pipelined", "registers", "cpasync"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,k,s,p,stage", [
    ((64, 64, 24, 24), 3, 2, 0, 2304),  # one plane per chunk, several chunks per block
    ((8, 16, 61, 59), 3, 2, 1, 2000),  # bands of rows, odd rows: every chunk starts at another alignment
    ((5, 7, 13, 13), (3, 2), (2, 1), (1, 0), None),
    ((1024, 16, 13, 13), 3, 2, 1, 5408),  # 8 or 16 odd planes per chunk: more vectors than one round of loads
])
def test_nchw_pooling_with_staged_chunks_matches_numpy(cp, rng, shape, k, s, p, stage, dtype, pipeline,
                                                       async_stage):
    from ucudnn.kernels import pool2d_forward

    k2, s2, p2 = [(v, v) if isinstance(v, int) else v for v in (k, s, p)]
    x = (np.round(rng.standard_normal(shape) * 2) / 2).astype(dtype)
    ref, arg, _ = pool_ref(x, k2, s2, p2, "max", True)
    xd = cp.asarray(x)
    for coarsening in [(1, 1), (2, 3)]:
        y, idx = pool2d_forward(xd, k, s, p, "max", "NCHW", return_indices=True, coarsening=coarsening,
                                pipeline=pipeline, stage_bytes=stage, async_stage=async_stage,
                                out=poisoned(cp, ref.shape, dtype))
        np.testing.assert_array_equal(cp.asnumpy(y).astype(np.float64), ref)
        np.testing.assert_array_equal(cp.asnumpy(idx), arg)
        plain = pool2d_forward(xd, k, s, p, "max", "NCHW", coarsening=coarsening, pipeline=pipeline,
                               stage_bytes=stage, async_stage=async_stage, out=poisoned(cp, ref.shape, dtype))
        np.testing.assert_array_equal(cp.asnumpy(plain).astype(np.float64), ref)
    avg = pool2d_forward(xd, k, s, p, "avg", "NCHW", count_include_pad=False, coarsening=(2, 2), pipeline=pipeline,
                         stage_bytes=stage, async_stage=async_stage, out=poisoned(cp, ref.shape, dtype))
    close(cp.asnumpy(avg), pool_ref(x, k2, s2, p2, "avg", False)[0], dtype, atol=1e-6 if dtype == "float32" else 1e-3)


def test_pooling_tunes_once_per_shape_and_reuses_the_cached_choice(cp, rng, monkeypatch):
    from ucudnn.kernels import autotune, pool2d_forward

    autotune.clear_memory()
    x = cp.asarray(rng.standard_normal((64, 16, 24, 24)).astype("float32"))
    y = pool2d_forward(x, 3, 2, 0, "max", "NCHW")
    ref, _, _ = pool_ref(cp.asnumpy(x), (3, 3), (2, 2), (0, 0), "max", True)
    np.testing.assert_array_equal(cp.asnumpy(y), ref)
    doc = autotune._read(autotune.cache_path())
    (entries,) = doc["devices"].values()
    (entry,) = entries.values()
    # coarsening, whether the NCHW kernel pipelines its chunks, whether it stages them with cp.async
    op, oq, pipelined, staged_async = entry["choice"]
    assert 1 <= op <= 4 and 1 <= oq <= 4 and pipelined in (0, 1) and staged_async in (0, 1) and entry["trials"]
    autotune.clear_memory()  # a new process: the file answers, no second search
    monkeypatch.setattr(autotune, "hill_climb", lambda *a, **k: pytest.fail("tuned twice"))
    np.testing.assert_array_equal(cp.asnumpy(pool2d_forward(x, 3, 2, 0, "max", "NCHW")), ref)


def test_pooling_refuses_bad_input(cp):
    from ucudnn.kernels import pool2d_backward, pool2d_forward

    from ucudnn.errors import InputError

    x = cp.ones((2, 3, 8, 8), "float32")
    with pytest.raises(InputError, match="mode"):
        pool2d_forward(x, 2, 2, 0, mode="median")
    with pytest.raises(InputError, match="return_indices"):
        pool2d_forward(x, 2, 2, 0, mode="avg", return_indices=True)
    with pytest.raises(InputError, match="coarsening"):
        pool2d_forward(x, 2, 2, 0, coarsening=(5, 1))
    with pytest.raises(InputError, match="dy"):
        pool2d_backward(cp.ones((2, 3, 3, 3), "float32"), x, 2, 2, 0)
    with pytest.raises(InputError, match="x.dtype"):
        pool2d_forward(x.astype("float64"), 2, 2, 0)
