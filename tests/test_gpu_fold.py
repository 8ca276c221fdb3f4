"""ucudnn's fold kernels against NumPy's fold (GPU; skipped without one).

Every element the kernels write is compared exactly (they only move bytes):
both layouts on either side, both element sizes, padding, strides that differ per axis,
folded sizes that leave plain rows unused or add zero rows, and N split
across launches.
"""
from __future__ import annotations

import numpy as np
import pytest
from numpy_fold import nchw_fold
from ucudnn.kernels.fold import FoldGeometry, launchers

pytestmark = pytest.mark.gpu

GEOMETRIES = {
    "alexnet-conv1-x": FoldGeometry(3, 227, 227, (4, 4), (0, 0), (57, 57), "NCHW"),
    "alexnet-conv1-w": FoldGeometry(3, 11, 11, (4, 4), (0, 0), (3, 3), "NCHW"),
    "padded-uneven-stride": FoldGeometry(2, 13, 17, (2, 3), (3, 1), (8, 6), "NCHW"),
    "unused-trailing-rows": FoldGeometry(5, 15, 15, (2, 2), (1, 1), (6, 7), "NCHW"),
}


LAYOUTS = [("NCHW", "NCHW"), ("NHWC", "NHWC"), ("NCHW", "NHWC"), ("NHWC", "NCHW")]   # (plain, folded)


def _in_layout(layout: str, nchw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(nchw.transpose(0, 2, 3, 1) if layout == "NHWC" else nchw)


def _case(name: str, layouts: tuple[str, str]) -> FoldGeometry:
    g = GEOMETRIES[name]
    return FoldGeometry(g.c, g.h, g.w, g.stride, g.pad, g.folded_hw, *layouts)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("layouts", LAYOUTS)
@pytest.mark.parametrize("name", sorted(GEOMETRIES))
def test_pack_writes_numpys_fold_exactly(name, layouts, dtype):
    import cupy as cp

    g = _case(name, layouts)
    n = 3
    plain = np.random.default_rng(0).standard_normal((n, g.c, g.h, g.w)).astype(dtype)
    src = cp.asarray(_in_layout(g.layout, plain))
    dst = cp.full(g.folded_shape(n), cp.nan, dtype=dtype)
    pack, _ = launchers(g, n, np.dtype(dtype).itemsize)
    pack(src.data.ptr, dst.data.ptr)
    np.testing.assert_array_equal(dst.get(), _in_layout(g.folded_layout, nchw_fold(plain, g)))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("layouts", LAYOUTS)
@pytest.mark.parametrize("name", sorted(GEOMETRIES))
def test_unpack_inverts_pack_and_zeroes_what_no_window_reaches(name, layouts, dtype):
    import cupy as cp

    g = _case(name, layouts)
    n = 2
    plain = np.random.default_rng(1).standard_normal((n, g.c, g.h, g.w)).astype(dtype)
    folded = cp.asarray(_in_layout(g.folded_layout, nchw_fold(plain, g)))
    out = cp.full(g.plain_shape(n), cp.nan, dtype=dtype)   # beta = 0: the old contents are never read
    _, unpack = launchers(g, n, np.dtype(dtype).itemsize)
    unpack(folded.data.ptr, out.data.ptr, 1.0, 0.0)
    (sh, sw), (ph, pw), (hb, wb) = g.stride, g.pad, g.folded_hw
    expect = plain.copy()
    expect[:, :, max(0, hb * sh - ph):, :] = 0
    expect[:, :, :, max(0, wb * sw - pw):] = 0
    np.testing.assert_array_equal(out.get(), _in_layout(g.layout, expect))


def test_unpack_scales_by_alpha_and_accumulates_beta_times_the_old_contents():
    import cupy as cp

    g = GEOMETRIES["padded-uneven-stride"]
    rng = np.random.default_rng(2)
    plain = rng.standard_normal((4, g.c, g.h, g.w)).astype("float32")
    old = rng.standard_normal(plain.shape).astype("float32")
    out = cp.asarray(old)
    _, unpack = launchers(g, 4, 4)
    unpack(cp.asarray(nchw_fold(plain, g)).data.ptr, out.data.ptr, 0.5, 2.0)
    np.testing.assert_allclose(out.get(), 0.5 * plain + 2.0 * old, rtol=1e-6)


def test_batches_beyond_one_grid_are_split_across_launches(monkeypatch):
    import cupy as cp
    from ucudnn.kernels import fold

    monkeypatch.setattr(fold, "_MAX_Z", 2)   # 5 samples -> launches of 2, 2 and 1
    g = _case("padded-uneven-stride", ("NHWC", "NCHW"))
    plain = np.random.default_rng(3).standard_normal((5, g.c, g.h, g.w)).astype("float32")
    dst = cp.full(g.folded_shape(5), cp.nan, dtype="float32")
    pack, _ = fold.launchers(g, 5, 4)
    pack(cp.asarray(_in_layout(g.layout, plain)).data.ptr, dst.data.ptr)
    np.testing.assert_array_equal(dst.get(), _in_layout(g.folded_layout, nchw_fold(plain, g)))
