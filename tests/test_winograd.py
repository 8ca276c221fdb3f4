"""The winograd source's pure-Python side without a GPU (forward, backward data, backward filter): F(4x4, 3x3)'s
transforms against a float64 direct correlation (hypothesis over H, W, pads 0-2, n, C, K); a CPU emulation of
winograd.cu's kernels (their thread index math, edge tiles, NCHW and NHWC, chunks of whole images and tile-range
chunks (any number of tiles, ranges starting mid-row and crossing image boundaries), alpha / beta, channel-slice
strides; backward filter's transform-domain accumulation across chunks) with the GEMM run both row-major and as the
column-major call cuBLAS receives, inside a workspace of exactly the reported size; the workspace formula for image
and tile chunks; the offered tile-chunk sizes; declines as Skipped rows; the source's names and registration; nvcc
compiles winograd.cu for sm_80 and sm_90."""
from __future__ import annotations

import dataclasses
import importlib.util
import re
import shutil
import subprocess
from fractions import Fraction
from importlib import resources

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_mec_source import run_column_major
from ucudnn.kernels import _compile
from ucudnn.kernels.winograd import (AT, BT, FUSED_SMEM, G, OPS, emulate_fused, fused_dims, fused_refusal,
                                     fused_workspace_bytes, TILE_CHUNK_IMAGES, WORKSPACE_ALIGN, Geometry, chunk_sizes,
                                     correlation_reference, direct_correlation, emulate, emulate_backward_filter,
                                     emulate_input,
                                     emulate_output, filter_transform, input_transform, output_transform, refusal,
                                     tile_chunk_sizes, tiles)

from ucudnn.errors import InputError
from ucudnn.measure.sources.base import BenchSettings, Operands
from ucudnn.measure.sources.winograd import WinogradSource, algo_name, chunk_of, tile_algo_name, tiles_of
from ucudnn.planning.table import Measurement
from ucudnn.problem import ConvProblem


# ---- the transforms --------------------------------------------------------------------------------------------
def test_one_dimensional_f43_is_exact_in_rational_arithmetic():
    """A^T [(G g) . (B^T d)] is the 4-output correlation of d with g for every d, g: checked on the basis vectors,
    with the matrices as exact fractions (G's entries are 1/4, 1/6, 1/12, 1/24)."""
    def frac(m):
        return [[Fraction(v).limit_denominator(24) for v in row] for row in m]

    bt, g, at = frac(BT), frac(G), frac(AT)
    for j in range(6):
        for r in range(3):
            gd = [sum(g[a][s] * (1 if s == r else 0) for s in range(3)) for a in range(6)]
            bd = [sum(bt[a][i] * (1 if i == j else 0) for i in range(6)) for a in range(6)]
            out = [sum(at[o][a] * gd[a] * bd[a] for a in range(6)) for o in range(4)]
            assert out == [1 if j == o + r else 0 for o in range(4)], (j, r)


def test_transforms_have_the_documented_shapes():
    assert filter_transform(np.zeros((5, 2, 3, 3))).shape == (5, 2, 6, 6)
    assert input_transform(np.zeros((6, 6))).shape == (6, 6)
    assert output_transform(np.zeros((3, 6, 6))).shape == (3, 4, 4)


@st.composite
def shapes(draw):
    ph, pw = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    h = draw(st.integers(max(1, 3 - 2 * ph), 14))
    w = draw(st.integers(max(1, 3 - 2 * pw), 14))
    return draw(st.integers(1, 3)), draw(st.integers(1, 5)), h, w, draw(st.integers(1, 4)), (ph, pw)


def _scale_err(got, ref):
    return np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-300)


@settings(max_examples=60, deadline=None)
@given(shapes(), st.integers(0, 2**31 - 1))
def test_whole_algorithm_in_float64_matches_direct_correlation(shape, seed):
    n, c, h, w, k, pad = shape
    rng = np.random.default_rng(seed)
    x, wt = rng.standard_normal((n, c, h, w)), rng.standard_normal((k, c, 3, 3))
    ref = direct_correlation(x, wt, pad)
    got = correlation_reference(x, wt, pad)
    assert got.shape == ref.shape == (n, k, h + 2 * pad[0] - 2, w + 2 * pad[1] - 2)
    assert _scale_err(got, ref) < 1e-12


# ---- the kernels, emulated ---------------------------------------------------------------------------------------
def _to_layout(a, layout):
    return np.ascontiguousarray(a if layout == "NCHW" else a.transpose(0, 2, 3, 1))


def _from_layout(a, layout):
    return a if layout == "NCHW" else a.transpose(0, 3, 1, 2)


def _expected(op, problem, x, wt, dy):
    """float64 reference in NCHW: forward y, backward data dx (the adjoint, by definition), backward filter dw
    (sum over n, p, q of the padded x window times dy)."""
    if op == "forward":
        return direct_correlation(x, wt, problem.pad)
    if op == "backward_filter":
        ph, pw = problem.pad
        xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
        win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))[:, :, :problem.p, :problem.q]
        return np.einsum("ncpqrs,nkpq->kcrs", win, dy)
    # dx[n, c, h, w] = sum_{k, r, s} dy[n, k, h - r + ph, w - s + pw] w[k, c, r, s]: computed as the adjoint
    dx = np.zeros(x.shape)
    ph, pw = problem.pad
    for r in range(3):
        for s in range(3):
            full = np.einsum("nkpq,kc->ncpq", dy, wt[:, :, r, s])
            padded = np.zeros((x.shape[0], x.shape[1], problem.h + 2 * ph, problem.w + 2 * pw))
            padded[:, :, r:r + problem.p, s:s + problem.q] = full
            dx += padded[:, :, ph:ph + problem.h, pw:pw + problem.w]
    return dx


def _run(op, problem, chunk, alpha, beta, seed, how="row", tiles=None, csplit=1, fused=False, streams=1, groups=1,
         ksplit=1):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((problem.n, problem.c, problem.h, problem.w))
    wt = rng.standard_normal((problem.k, problem.c, 3, 3))
    dy = rng.standard_normal((problem.n, problem.k, problem.p, problem.q))
    lay = problem.layout
    geo = Geometry.of(problem, op)
    size = (fused_workspace_bytes(geo) if fused
            else geo.workspace_bytes(chunk, tiles, csplit, streams, groups, ksplit))
    ws = np.full(size // 4, np.nan)   # exactly the reported size: NaN shows
    gemm = (lambda gms, bufs: run_column_major(gms, bufs, 1.0, 0.0)) if how == "column" else None
    if op == "backward_filter":
        old = rng.standard_normal(wt.shape)
        out = _to_layout(old, lay).reshape(-1).copy()
        emulate_backward_filter(geo, _to_layout(x, lay).reshape(-1), _to_layout(dy, lay).reshape(-1), out, problem.n,
                                chunk, alpha, beta, workspace=ws, gemm=gemm, tiles=tiles, streams=streams,
                                groups=groups, ksplit=ksplit)
        got = _from_layout(out.reshape(problem.w_shape()), lay)
        return got, alpha * _expected(op, problem, x, wt, dy) + beta * old
    w_flat = (wt if lay == "NCHW" else wt.transpose(0, 2, 3, 1)).reshape(-1).copy()
    src = _to_layout(x if op == "forward" else dy, lay).reshape(-1)
    out_nchw = rng.standard_normal(dy.shape if op == "forward" else x.shape)
    out = _to_layout(out_nchw, lay).reshape(-1).copy()
    if fused:
        emulate_fused(geo, w_flat, src, out, problem.n, alpha, beta, workspace=ws)
        assert not np.isnan(ws).any()   # every word of the reported workspace written (U and its zero padding)
    else:
        emulate(geo, w_flat, src, out, problem.n, chunk, alpha, beta, workspace=ws, gemm=gemm, tiles=tiles,
                csplit=csplit, streams=streams, groups=groups)
    got = _from_layout(out.reshape(problem.x_shape() if op == "backward_data" else problem.y_shape()), lay)
    return got, alpha * _expected(op, problem, x, wt, dy) + beta * out_nchw


@settings(max_examples=60, deadline=None)
@given(shapes(), st.sampled_from(OPS), st.sampled_from(["NCHW", "NHWC"]),
       st.integers(1, 4), st.sampled_from([(1.0, 0.0), (-0.5, 1.0), (2.0, 0.25)]), st.sampled_from(["row", "column"]),
       st.integers(0, 2**31 - 1))
def test_emulated_kernels_compute_the_convolution(shape, op, layout, chunk, scalars, how, seed):
    n, c, h, w, k, pad = shape
    problem = ConvProblem(n, c, h, w, k, 3, 3, pad=pad, layout=layout)
    got, expect = _run(op, problem, min(chunk, n), *scalars, seed, how)
    assert _scale_err(got, expect) < 1e-11


@settings(max_examples=80, deadline=None)
@given(shapes(), st.sampled_from(OPS), st.sampled_from(["NCHW", "NHWC"]),
       st.data(), st.sampled_from([(1.0, 0.0), (-0.5, 1.0), (2.0, 0.25)]), st.sampled_from(["row", "column"]),
       st.integers(0, 2**31 - 1))
def test_emulated_kernels_with_tile_range_chunks_compute_the_convolution(shape, op, layout, data, scalars, how,
                                                                        seed):
    """Chunks of any number of tiles (one tile, part of a row, a few rows, more than an image, the whole call and
    beyond): ranges start mid-row and cross image boundaries, V / M sized for the chunk, the float64 result equal to
    the reference (backward filter: dU accumulated over every chunk, the inverse transform once)."""
    n, c, h, w, k, pad = shape
    problem = ConvProblem(n, c, h, w, k, 3, 3, pad=pad, layout=layout)
    geo = Geometry.of(problem, op)
    total = n * geo.tiles_per_image
    t = data.draw(st.one_of(st.integers(1, total + 3), st.sampled_from(tile_chunk_sizes(geo, n) or [1])))
    got, expect = _run(op, problem, 0, *scalars, seed, how, tiles=t)
    assert _scale_err(got, expect) < 1e-11


@settings(max_examples=60, deadline=None)
@given(shapes(), st.sampled_from(["forward", "backward_data"]), st.sampled_from(["NCHW", "NHWC"]),
       st.sampled_from([2, 4]), st.data(), st.sampled_from([(1.0, 0.0), (-0.5, 1.0)]),
       st.sampled_from(["row", "column"]), st.integers(0, 2**31 - 1))
def test_input_channel_slices_add_up_to_the_convolution(shape, op, layout, csplit, data, scalars, how, seed):
    """The input channels in ``csplit`` slices (forward: x's C, backward data: dy's K), each slice's U and V in the
    workspace in turn and its GEMM adding into M: the same convolution, with U and V a slice's size."""
    n, c, h, w, k, pad = shape
    c, k = (c * csplit, k) if op == "forward" else (c, k * csplit)   # the split channels divide evenly
    problem = ConvProblem(n, c, h, w, k, 3, 3, pad=pad, layout=layout)
    geo = Geometry.of(problem, op)
    t = data.draw(st.one_of(st.none(), st.integers(1, n * geo.tiles_per_image + 2)))
    got, expect = _run(op, problem, 1 if t is None else 0, *scalars, seed, how, tiles=t, csplit=csplit)
    assert _scale_err(got, expect) < 1e-11
    part = geo.slice(csplit)
    assert part.ci * csplit == geo.ci and (part.co, part.in_strides, part.filter_strides) == (
        geo.co, geo.in_strides, geo.filter_strides)
    tt = geo.tiles_per_image if t is None else t
    assert geo.workspace_bytes(1 if t is None else 0, t, csplit) <= geo.workspace_bytes(1 if t is None else 0, t)
    assert {name: size for name, _, size in geo.segments(0, tt, csplit)} == {
        "U": 4 * 36 * geo.co * part.ci, "V": 4 * 36 * part.ci * tt, "M": 4 * 36 * geo.co * tt}


@settings(max_examples=60, deadline=None)
@given(shapes(), st.sampled_from(["forward", "backward_data"]), st.sampled_from(["NCHW", "NHWC"]),
       st.sampled_from([0, 7, 31]), st.sampled_from([(1.0, 0.0), (-0.5, 1.0), (2.0, 0.25)]),
       st.integers(0, 2**31 - 1))
def test_fused_layout_computes_the_convolution(shape, op, layout, wider, scalars, seed):
    """The fused kernel's U layout ``[Cp][36][Kp]`` (channels padded to a step's 8 and a block's 32, the padding
    zero) read as the fused kernel reads it: the float64 result equals the reference for channel counts on and off
    the padding, both layouts and both ops."""
    n, c, h, w, k, pad = shape
    problem = ConvProblem(n, c + wider, h, w, k + wider // 2, 3, 3, pad=pad, layout=layout)
    got, expect = _run(op, problem, 0, *scalars, seed, fused=True)
    assert _scale_err(got, expect) < 1e-11


@settings(max_examples=90, deadline=None)
@given(shapes(), st.sampled_from(OPS), st.sampled_from(["NCHW", "NHWC"]),
       st.sampled_from([2, 3]), st.data(), st.sampled_from([(1.0, 0.0), (-0.5, 1.0)]), st.integers(0, 2**31 - 1))
def test_chunks_over_streams_use_a_v_and_m_each_and_compute_the_convolution(shape, op, layout, streams, data,
                                                                            scalars, seed):
    """Chunk i in stream i % streams's own V and M after the shared U (``V``, ``M``, ``V1``, ``M1``, ...), and for
    backward filter its own dU too (``U``, ``U1``, ... first, evenly spaced, summed by the inverse transform): the
    float64 result equals the reference at exactly the reported workspace (NaN elsewhere), image or tile chunks,
    calls with fewer chunks than streams included."""
    n, c, h, w, k, pad = shape
    problem = ConvProblem(n, c, h, w, k, 3, 3, pad=pad, layout=layout)
    geo = Geometry.of(problem, op)
    t = data.draw(st.one_of(st.none(), st.integers(1, n * geo.tiles_per_image + 2)))
    got, expect = _run(op, problem, 1 if t is None else 0, *scalars, seed, tiles=t, streams=streams)
    assert _scale_err(got, expect) < 1e-11
    tt = geo.tiles_per_image if t is None else t
    segs = geo.segments(0, tt, 1, streams)
    own = op == "backward_filter"
    us = [f"U{i or ''}" for i in range(streams if own else 1)]
    assert {name: size for name, _, size in segs} == {
        **{u: 4 * 36 * geo.co * geo.ci for u in us},
        **{f"{b}{i or ''}": 4 * 36 * ch * tt for i in range(streams) for b, ch in (("V", geo.ci), ("M", geo.co))}}
    assert [name for name, _, _ in segs[:len(us)]] == us   # every dU first: partials' one stride apart
    offsets = {name: off for name, off, _ in segs}
    chunks = len(geo.ranges(n, 1 if t is None else 0, t))
    parts, stride = geo.partials(streams, chunks)
    assert parts == min(streams, chunks) and all(offsets[u] == 4 * i * stride for i, u in enumerate(us) if parts > 1)
    assert geo.stream_buffers(2) == {"U": "U2" if own else "U", "V": "V2", "M": "M2"}


@settings(max_examples=80, deadline=None)
@given(shapes(), st.sampled_from(["NCHW", "NHWC"]), st.sampled_from([2, 3, 4]), st.sampled_from([1, 2, 3]),
       st.data(), st.sampled_from([(1.0, 0.0), (-0.5, 1.0), (2.0, 0.25)]), st.sampled_from(["row", "column"]),
       st.integers(0, 2**31 - 1))
def test_backward_filter_point_groups_add_up_to_the_gradient(shape, layout, groups, streams, data, scalars, how,
                                                              seed):
    """Backward filter with its 36 points in ``groups`` groups: every chunk once per group, dU, V and Z holding one
    group's points (36 / groups), each group's inverse transform adding into dw after the first's (which applies
    the caller's beta): the float64 gradient equals the reference at exactly the reported workspace (NaN
    elsewhere), image or tile chunks, on one to three streams."""
    n, c, h, w, k, pad = shape
    problem = ConvProblem(n, c, h, w, k, 3, 3, pad=pad, layout=layout)
    geo = Geometry.of(problem, "backward_filter")
    t = data.draw(st.one_of(st.none(), st.integers(1, n * geo.tiles_per_image + 2)))
    got, expect = _run("backward_filter", problem, 1 if t is None else 0, *scalars, seed, how, tiles=t,
                       streams=streams, groups=groups)
    assert _scale_err(got, expect) < 1e-11
    tt = geo.tiles_per_image if t is None else t
    pts = 36 // groups
    assert geo.points(groups) == pts
    assert {name: size for name, _, size in geo.segments(0, tt, 1, streams, groups)} == {
        **{f"U{i or ''}": 4 * pts * geo.co * geo.ci for i in range(streams)},
        **{f"{b}{i or ''}": 4 * pts * ch * tt for i in range(streams) for b, ch in (("V", geo.ci), ("M", geo.co))}}
    g = geo.gemm(0, tt, groups=groups)
    assert (g.m, g.n, g.k, g.batch) == (geo.co, geo.ci, tt, pts)


@settings(max_examples=80, deadline=None)
@given(shapes(), st.sampled_from(["forward", "backward_data"]), st.sampled_from(["NCHW", "NHWC"]),
       st.sampled_from([2, 3, 4]), st.sampled_from([1, 2, 3]), st.data(),
       st.sampled_from([(1.0, 0.0), (-0.5, 1.0), (2.0, 0.25)]), st.sampled_from(["row", "column"]),
       st.integers(0, 2**31 - 1))
def test_forward_and_backward_data_point_groups_add_up_to_the_convolution(shape, op, layout, groups, streams, data,
                                                                          scalars, how, seed):
    """Forward and backward data with the 36 points in ``groups`` groups: per group U, V and M hold its points
    (36 / groups), every chunk's output transform adds that group's share A^T M_g A into the output (the caller's
    beta on the first group, 1 after): the float64 result equals the reference at exactly the reported workspace
    (NaN elsewhere), image or tile chunks, on one to three streams."""
    n, c, h, w, k, pad = shape
    problem = ConvProblem(n, c, h, w, k, 3, 3, pad=pad, layout=layout)
    geo = Geometry.of(problem, op)
    t = data.draw(st.one_of(st.none(), st.integers(1, n * geo.tiles_per_image + 2)))
    got, expect = _run(op, problem, 1 if t is None else 0, *scalars, seed, how, tiles=t, streams=streams,
                       groups=groups)
    assert _scale_err(got, expect) < 1e-11
    tt = geo.tiles_per_image if t is None else t
    pts = 36 // groups
    assert {name: size for name, _, size in geo.segments(0, tt, 1, streams, groups)} == {
        "U": 4 * pts * geo.co * geo.ci,
        **{f"{b}{i or ''}": 4 * pts * ch * tt for i in range(streams) for b, ch in (("V", geo.ci), ("M", geo.co))}}
    g = geo.gemm(0, tt, groups=groups)
    assert g.batch == pts and g.k == geo.ci


def test_point_groups_and_input_channel_slices_do_not_combine():
    problem = ConvProblem(2, 8, 8, 8, 8, 3, 3, pad=1)
    with pytest.raises(InputError) as e:
        _run("forward", problem, 1, 1.0, 0.0, 0, csplit=2, groups=2)
    assert e.value.field == "groups"


@settings(max_examples=80, deadline=None)
@given(shapes(), st.sampled_from(["NCHW", "NHWC"]), st.sampled_from([2, 4, 8]), st.sampled_from([1, 2, 3]),
       st.data(), st.sampled_from([(1.0, 0.0), (-0.5, 1.0), (2.0, 0.25)]), st.sampled_from(["row", "column"]),
       st.integers(0, 2**31 - 1))
def test_backward_filter_split_reductions_add_up_to_the_gradient(shape, layout, ksplit, streams, data, scalars, how,
                                                                 seed):
    """Backward filter with each chunk's tiles in ``ksplit`` parts (the last padded with zero tiles), part s's
    products into dU copy s, every stream's copies summed by the inverse transform: the float64 gradient equals
    the reference at exactly the reported workspace (NaN elsewhere), image or tile chunks of any length (a part
    of one tile, parts past the chunk's tiles), on one to three streams where the copies stay evenly spaced."""
    n, c, h, w, k, pad = shape
    problem = ConvProblem(n, c, h, w, k, 3, 3, pad=pad, layout=layout)
    geo = Geometry.of(problem, "backward_filter")
    if geo.ksplit_refusal(ksplit, streams) is not None:   # streams' copies off the alignment: refused, not run
        with pytest.raises(InputError) as e:
            _run("backward_filter", problem, 1, 1.0, 0.0, seed, streams=streams, ksplit=ksplit)
        assert e.value.field == "ksplit"
        return
    t = data.draw(st.one_of(st.none(), st.integers(1, n * geo.tiles_per_image + 2)))
    got, expect = _run("backward_filter", problem, 1 if t is None else 0, *scalars, seed, how, tiles=t,
                       streams=streams, ksplit=ksplit)
    assert _scale_err(got, expect) < 1e-11
    tt = geo.tiles_per_image if t is None else t
    part = -(-tt // ksplit)
    assert geo.part_tiles(tt, ksplit) == part
    assert {name: size for name, _, size in geo.segments(0, tt, 1, streams, 1, ksplit)} == {
        **{f"U{i or ''}": 4 * 36 * ksplit * geo.co * geo.ci for i in range(streams)},
        **{f"{b}{i or ''}": 4 * 36 * ch * ksplit * part for i in range(streams)
           for b, ch in (("V", geo.ci), ("M", geo.co))}}
    g = geo.gemm(0, tt, ksplit=ksplit)
    assert (g.m, g.n, g.k, g.batch, g.stride_c) == (geo.co, geo.ci, part, 36 * ksplit, geo.co * geo.ci)


def test_split_reductions_run_only_backward_filter_without_groups_and_are_measured_for_narrow_layers():
    """Where a split reduction runs and which one the benchmark measures: backward filter only, no point groups, on
    several streams only where each stream's copies end on the workspace's alignment; measured for layers of at
    most 2^14 outputs a point, the largest S with S x outputs within 2^15 and 128 tiles a part."""
    from ucudnn.measure.sources.winograd import ksplit_of, ksplits

    vgg = ConvProblem(64, 64, 224, 224, 64, 3, 3, pad=1)
    bwf = Geometry.of(vgg, "backward_filter")
    assert ksplits(bwf, "backward_filter", 3584, 3) == [1, 8]
    assert ksplits(bwf, "backward_filter", 896, 3) == [1, 4]          # 8 parts would hold 112 tiles
    assert ksplits(bwf, "backward_filter", 128) == [1]
    assert ksplits(bwf, "backward_filter", 3584, 2, groups=2) == [1]
    assert ksplits(Geometry.of(vgg, "forward"), "forward", 3584) == [1]
    assert ksplits(Geometry.of(ConvProblem(64, 128, 112, 112, 128, 3, 3, pad=1), "backward_filter"),
                   "backward_filter", 1568, 3) == [1, 2]
    assert ksplits(Geometry.of(ConvProblem(64, 256, 56, 56, 256, 3, 3, pad=1), "backward_filter"),
                   "backward_filter", 784, 3) == [1]                   # 256 x 256: cuBLAS fills the device already
    odd = Geometry.of(ConvProblem(8, 3, 64, 64, 5, 3, 3, pad=1), "backward_filter")   # 36*4*15 bytes a copy
    assert odd.ksplit_refusal(2, streams=2) is not None and odd.ksplit_refusal(2) is None
    assert ksplits(odd, "backward_filter", 1024, 2) == [1] and ksplits(odd, "backward_filter", 1024) == [1, 8]
    with pytest.raises(InputError) as e:   # and no stride reaches every copy, should a caller ask
        odd.partials(2, 5, ksplit=2)
    assert e.value.field == "u_copies"
    assert odd.partials(1, 5, ksplit=2) == (2, 36 * 15)
    assert "backward filter" in Geometry.of(vgg, "forward").ksplit_refusal(2)
    assert "groups" in bwf.ksplit_refusal(2, groups=2)
    assert "one of" in bwf.ksplit_refusal(3)
    _recorded_choice(ksplit_of, "ksplit", {"tiles": 3584, "ksplit": 8, "streams": 3}, 8, 3, vgg)


def _recorded_choice(parse, key, extra, value, bad, problem, forward_refuses=True):
    """``parse`` reads ``extra.winograd.<key>`` of a recorded row (``value``; 1 where absent), refuses ``bad`` naming
    that field, and (``forward_refuses``: a backward-filter-only choice) forward's prepare refuses it naming it
    too."""
    assert parse(Measurement(64, "x", "FMA", 1.0, 0, "winograd", None, {"winograd": extra})) == value
    assert parse(Measurement(8, "wino-f4", "FMA", 1.0, 0, "winograd")) == 1
    with pytest.raises(InputError) as e:
        parse(Measurement(8, "x", "FMA", 1.0, 0, "winograd", None, {"winograd": {key: bad}}))
    assert e.value.field == f"extra.winograd.{key}"
    if not forward_refuses:
        return
    with pytest.raises(InputError) as e:
        WinogradSource().prepare("forward", problem, Measurement(64, "x", "FMA", 1.0, 0, "winograd", None,
                                                                 {"winograd": {"tiles": 640, key: 2}}))
    assert e.value.field == f"extra.winograd.{key}"


def test_point_groups_shrink_the_workspace_of_every_op():
    """VGG-16 conv4_2 b64 (512 x 512, 28x28): ungrouped, 64 MiB holds backward filter's 192-tile chunks on one
    stream; with four groups of 9 points it holds 640-tile chunks on two streams (dU 9.4 MB each).  Forward and
    backward data share one U (36 MiB): ungrouped, 64 MiB holds 64-tile chunks on three streams; in two groups
    (U 18 MiB) 192-tile chunks on three streams, in three 320-tile chunks on two."""
    wide = ConvProblem(64, 512, 28, 28, 512, 3, 3, pad=1)
    geo = Geometry.of(wide, "backward_filter")
    mib64 = 64 << 20
    assert geo.workspace_bytes(0, 192) <= mib64 < geo.workspace_bytes(0, 256)
    assert geo.workspace_bytes(0, 640, 1, 2, 4) <= mib64 < geo.workspace_bytes(0, 640, 1, 2, 3)
    assert geo.workspace_bytes(0, 384, 1, 2, 3) <= mib64
    for groups in (2, 3, 4):
        assert geo.workspace_bytes(0, 320, 1, 1, groups) * groups == pytest.approx(geo.workspace_bytes(0, 320),
                                                                                   rel=1e-4)
    for op in ("forward", "backward_data"):
        fwd = Geometry.of(wide, op)
        assert fwd.workspace_bytes(0, 64, 1, 3) <= mib64 < fwd.workspace_bytes(0, 128, 1, 3)
        assert fwd.workspace_bytes(0, 192, 1, 3, 2) <= mib64 < fwd.workspace_bytes(0, 256, 1, 3, 2)
        assert fwd.workspace_bytes(0, 320, 1, 2, 3) <= mib64
        assert {name: size for name, _, size in fwd.segments(0, 192, 1, 3, 2)} == {
            "U": 4 * 18 * 512 * 512, **{f"{b}{i or ''}": 4 * 18 * 512 * 192 for i in range(3) for b in "VM"}}
        g = fwd.gemm(0, 192, groups=2)
        assert (g.m, g.n, g.k, g.batch) == (512, 192, 512, 18)
    with pytest.raises(InputError):
        geo.points(5)


def test_point_groups_are_measured_for_wide_backward_filters_and_recorded_for_prepare():
    from ucudnn.measure.sources.winograd import groups_of, point_groups

    wide = ConvProblem(64, 512, 28, 28, 512, 3, 3, pad=1)
    bwf = Geometry.of(wide, "backward_filter")
    assert point_groups(bwf, "backward_filter", 640) == [1, 2, 3, 4] == point_groups(bwf, "backward_filter", 640, 2)
    assert point_groups(bwf, "backward_filter", 896) == [1]                   # dU under a quarter of the workspace
    assert point_groups(bwf, "backward_filter", 640, 3) == [1]                # three streams: not measured
    assert point_groups(bwf, "backward_filter", 49) == [1]                    # under 64 tiles: part of a tile row
    fwd = Geometry.of(wide, "forward")
    assert point_groups(fwd, "forward", 640) == [1, 2, 3] == point_groups(fwd, "forward", 256, 3)
    assert point_groups(fwd, "forward", 896) == [1]                           # U under a quarter of the workspace
    assert point_groups(fwd, "forward", 640, 3) == [1]                        # ... with three streams' V and M
    assert point_groups(fwd, "forward", 640, 1, 2) == [1]                     # input-channel slices: not grouped
    _, sk = WinogradSource().measure("backward_filter", wide, Operands(0, 0, 0), 0, BenchSettings("strict"))
    names = {str(s.algo) for s in sk}
    assert {"wino-f4-t640-g4-p2", "wino-f4-t640-g3", "wino-f4-t192-g2-p2"} <= names
    assert not any("-g" in a and a.endswith("-p3") for a in names)
    _, sk = WinogradSource().measure("forward", wide, Operands(0, 0, 0), 0, BenchSettings("strict"))
    names = {str(s.algo) for s in sk}
    assert {"wino-f4-t192-g2-p3", "wino-f4-t320-g3-p2", "wino-f4-t640-g2"} <= names
    assert not any("-g4" in a or ("-g" in a and "-s" in a) for a in names)
    assert tiles_of(Measurement(64, "wino-f4-t640-g4-p2", "FMA", 1.0, 0, "winograd", None,
                                {"winograd": {"tiles": 640, "groups": 4}})) == 640
    _recorded_choice(groups_of, "groups", {"tiles": 640, "groups": 4, "streams": 2}, 4, 5, wide,
                     forward_refuses=False)
    with pytest.raises(InputError) as e:   # slices and groups: not together
        WinogradSource().prepare("forward", wide, Measurement(64, "x", "FMA", 1.0, 0, "winograd", None,
                                                              {"winograd": {"tiles": 640, "groups": 2, "csplit": 2}}))
    assert e.value.field == "extra.winograd.groups"


def test_stream_counts_are_offered_where_chunks_can_overlap():
    from ucudnn.measure.sources.winograd import stream_counts, streams_of

    assert stream_counts("forward", 1, 1) == [1] and stream_counts("forward", 2, 1) == [1, 2]
    assert stream_counts("backward_data", 17, 1) == [1, 2, 3]
    assert stream_counts("backward_filter", 17, 1) == [1, 2, 3] and stream_counts("backward_filter", 2, 1) == [1, 2]
    assert stream_counts("forward", 17, 2) == [1]
    row = Measurement(8, "wino-f4-t192-p3", "FMA", 1.0, 0, "winograd", None, {"winograd": {"tiles": 192, "streams": 3}})
    assert streams_of(row) == 3 and tiles_of(row) == 192
    assert streams_of(Measurement(8, "wino-f4", "FMA", 1.0, 0, "winograd")) == 1
    with pytest.raises(InputError) as e:
        streams_of(Measurement(8, "x", "FMA", 1.0, 0, "winograd", None, {"winograd": {"streams": 4}}))
    assert e.value.field == "extra.winograd.streams"
    geo = Geometry.of(ConvProblem(2, 8, 9, 9, 8, 3, 3, pad=1), "forward")
    with pytest.raises(InputError):
        geo.segments(0, 9, 1, 4)
    with pytest.raises(InputError):
        emulate(geo, np.zeros(8 * 8 * 9), np.zeros(2 * 8 * 81), np.zeros(2 * 8 * 81), 2, 1, csplit=2, streams=2)


def test_fused_workspace_is_u_padded_to_the_kernels_blocks_whatever_the_batch():
    vgg = ConvProblem(64, 512, 28, 28, 512, 3, 3, pad=(1, 1))
    geo = Geometry.of(vgg, "forward")
    assert fused_dims(geo) == (512, 512) and fused_workspace_bytes(geo) == 36 * 4 * 512 * 512   # 37.7 MB < 64 MiB
    odd = Geometry.of(ConvProblem(3, 3, 9, 9, 33, 3, 3, pad=(1, 1)), "backward_data")   # Ci = K = 33, Co = C = 3
    assert fused_dims(odd) == (32, 40) and fused_workspace_bytes(odd) == 36 * 4 * 32 * 40
    assert fused_workspace_bytes(Geometry.of(dataclasses.replace(vgg, n=1), "forward")) == fused_workspace_bytes(geo)
    assert "backward filter" in fused_refusal(Geometry.of(vgg, "backward_filter"), 64)
    assert fused_refusal(geo, 64) is None and "tiles" in fused_refusal(geo, 2**31 // 49 + 1)
    assert FUSED_SMEM <= 227 * 1024   # the opt-in shared memory of sm_80 / sm_90


def test_input_channel_slices_are_refused_where_they_do_not_divide_or_for_backward_filter():
    p = ConvProblem(2, 6, 8, 8, 4, 3, 3, pad=(1, 1))
    with pytest.raises(InputError) as e:
        Geometry.of(p, "forward").slice(4)
    assert e.value.field == "csplit" and "do not split" in str(e.value)
    with pytest.raises(InputError, match="backward filter"):
        Geometry.of(p, "backward_filter").slice(2)
    with pytest.raises(InputError, match="one of"):
        Geometry.of(p, "forward").slice(3)
    assert Geometry.of(p, "forward").slice_offsets(2, 1) == (3 * 9, 3 * 64)   # channel 3: w (k,c,r,s), x (n,c,h,w)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("op", ["forward", "backward_data"])
def test_tile_range_offsets_read_and_write_the_right_tiles(op, layout):
    """wino_input on tiles t0 .. t0 + count writes exactly that slice of the whole call's V (the right 6x6 patches:
    range starting mid-row, crossing an image boundary, ending on a clipped edge tile); wino_output of that range
    writes exactly the range's 4x4 outputs (clipped) and nothing else."""
    p = ConvProblem(3, 5, 13, 11, 4, 3, 3, pad=(1, 2), layout=layout)
    geo = Geometry.of(p, op)
    tpi, total = geo.tiles_per_image, 3 * geo.tiles_per_image
    ci, co = geo.ci, geo.co
    rng = np.random.default_rng(12)
    x = rng.standard_normal(3 * ci * geo.hi * geo.wi)
    whole = np.full(36 * ci * total, np.nan)
    emulate_input(geo, x, whole, 0, total)
    whole = whole.reshape(36, ci, total) if not geo.cminor else whole.reshape(36, total, ci)
    for t0, count in ((0, 1), (tpi - 2, 5), (geo.tiles_w + 1, tpi), (total - 3, 3), (2, total - 2)):
        v = np.full(36 * ci * count, np.nan)
        emulate_input(geo, x, v, t0, count)
        want = whole[:, :, t0:t0 + count] if not geo.cminor else whole[:, t0:t0 + count, :]
        np.testing.assert_array_equal(v.reshape(want.shape), want)
        # output: M = the tile index + 1 everywhere -> every written element says which tile wrote it
        m = np.zeros((36, co, count) if not geo.cminor else (36, count, co))
        tile_ids = np.arange(t0, t0 + count) + 1.0
        m[0] = tile_ids[None, :] if not geo.cminor else tile_ids[:, None]     # A^T m A at point 0: m0 on (0, 0)
        y = np.zeros(3 * co * geo.ho * geo.wo)
        emulate_output(geo, m.reshape(-1), y, t0, count, 1.0, 0.0)
        sn, sc, sh, sw = geo.out_strides
        expect = np.zeros_like(y)
        for g in range(t0, t0 + count):
            img, rem = divmod(g, tpi)
            th, tw = divmod(rem, geo.tiles_w)
            for kk in range(co):
                if 4 * th < geo.ho and 4 * tw < geo.wo:
                    expect[img * sn + kk * sc + 4 * th * sh + 4 * tw * sw] = g + 1.0
        np.testing.assert_array_equal(y, expect)


def test_tile_chunks_crossing_images_write_only_inside_the_output():
    """13x13, pad 0 (3x3 tiles of 4, the last ones clipped), chunks of 4 tiles (start mid-row, cross images): a
    NaN-filled output fully replaced, nothing past it touched."""
    p = ConvProblem(2, 3, 13, 13, 5, 3, 3, pad=0)
    geo = Geometry.of(p, "forward")
    assert geo.tile_chunks(2, 4) == [(0, 4), (4, 4), (8, 4), (12, 4), (16, 2)]
    rng = np.random.default_rng(2)
    x, wt = rng.standard_normal(p.x_shape()), rng.standard_normal(p.w_shape())
    y = np.full(2 * 5 * 11 * 11 + 7, np.nan)
    ws = emulate(geo, wt.reshape(-1), x.reshape(-1), y, 2, 0, tiles=4)
    assert ws.size == geo.workspace_bytes(0, 4) // 4
    assert np.isnan(y[-7:]).all() and not np.isnan(y[:-7]).any()
    assert _scale_err(y[:-7].reshape(p.y_shape()), direct_correlation(x, wt, (0, 0))) < 1e-12


def test_backward_data_reference_is_the_adjoint_of_forward():
    """<forward(x), dy> == <x, backward_data(dy)>: the test's own dx reference is right."""
    p = ConvProblem(2, 3, 7, 6, 4, 3, 3, pad=(2, 0))
    rng = np.random.default_rng(1)
    x, wt, dy = rng.standard_normal((2, 3, 7, 6)), rng.standard_normal((4, 3, 3, 3)), rng.standard_normal((2, 4, 9, 4))
    lhs = (_expected("forward", p, x, wt, dy) * dy).sum()
    rhs = (x * _expected("backward_data", p, x, wt, dy)).sum()
    assert abs(lhs - rhs) < 1e-9 * abs(lhs)


def test_edge_tiles_write_only_inside_the_output():
    """13x13, pad 0: 11x11 outputs in 3x3 tiles of 4 (the last ones cover 3 columns / rows): every output element
    written exactly where it belongs, a NaN-filled output fully replaced, and nothing past it touched."""
    p = ConvProblem(2, 3, 13, 13, 5, 3, 3, pad=0)
    geo = Geometry.of(p, "forward")
    assert (geo.tiles_h, geo.tiles_w, geo.tiles_per_image) == (3, 3, 9) and tiles(11) == 3 and tiles(12) == 3
    rng = np.random.default_rng(2)
    x, wt = rng.standard_normal(p.x_shape()), rng.standard_normal(p.w_shape())
    y = np.full(2 * 5 * 11 * 11 + 7, np.nan)
    emulate(geo, wt.reshape(-1), x.reshape(-1), y, 2, 2)
    assert np.isnan(y[-7:]).all() and not np.isnan(y[:-7]).any()
    assert _scale_err(y[:-7].reshape(p.y_shape()), direct_correlation(x, wt, (0, 0))) < 1e-12


def test_tile_index_math_matches_a_hand_count():
    p = ConvProblem(3, 4, 27, 9, 6, 3, 3, pad=1)                    # 27x9 output: 7x3 tiles per image
    fwd, bwd = Geometry.of(p, "forward"), Geometry.of(p, "backward_data")
    assert (fwd.ho, fwd.wo, fwd.tiles_h, fwd.tiles_w) == (27, 9, 7, 3)
    assert (bwd.ci, bwd.co, bwd.hi, bwd.wi, bwd.pad, bwd.rot) == (6, 4, 27, 9, (1, 1), True)
    assert Geometry.of(ConvProblem(1, 1, 8, 8, 1, 3, 3, pad=(0, 2)), "backward_data").pad == (2, 0)
    assert fwd.chunks(7, 3) == [(0, 3), (3, 3), (6, 1)]
    g = fwd.gemm(2)
    assert (g.m, g.n, g.k, g.batch, g.a, g.b, g.c) == (6, 2 * 21, 4, 36, "U", "V", "M")
    nhwc = Geometry.of(ConvProblem(3, 4, 27, 9, 6, 3, 3, pad=1, layout="NHWC"), "forward").gemm(2)
    assert (nhwc.m, nhwc.n, nhwc.k, nhwc.trans_b, nhwc.a) == (42, 6, 4, True, "V")
    # backward filter walks the forward's tiles; its GEMM reduces them: dU (6 x 4) over 2 images' 21 tiles
    bwf = Geometry.of(p, "backward_filter")
    assert bwf == Geometry(**{**fwd.__dict__, "op": "backward_filter"})
    g = bwf.gemm(2)
    assert (g.m, g.n, g.k, g.a, g.b, g.c, g.trans_b, g.beta) == (6, 4, 42, "M", "V", "U", True, 0.0)
    g = Geometry.of(ConvProblem(3, 4, 27, 9, 6, 3, 3, pad=1, layout="NHWC"), "backward_filter").gemm(2, None, True)
    assert (g.m, g.n, g.k, g.trans_a, g.lda, g.ldb, g.beta) == (6, 4, 42, True, 6, 4, 1.0)


def test_the_emulators_refuse_the_other_ops_geometry():
    p = ConvProblem(1, 2, 8, 8, 3, 3, 3, pad=1)
    with pytest.raises(InputError):
        emulate(Geometry.of(p, "backward_filter"), np.zeros(54), np.zeros(128), np.zeros(192), 1, 1)
    with pytest.raises(InputError):
        emulate_backward_filter(Geometry.of(p, "forward"), np.zeros(128), np.zeros(192), np.zeros(54), 1, 1)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("op", OPS)
def test_channel_slices_address_the_wider_tensor(op, layout):
    """A slice of k of k_total output channels: y (dy) is read / written through the wide tensor's strides, the
    other channels untouched."""
    k0, k, kt = 2, 3, 7
    wide = ConvProblem(2, 4, 9, 10, kt, 3, 3, pad=1, layout=layout)
    sl = wide.with_channels(k, kt)
    rng = np.random.default_rng(3)
    x, wt = rng.standard_normal(wide.x_shape()), rng.standard_normal(wide.w_shape())
    y = rng.standard_normal(wide.y_shape())
    per_channel = wide.p * wide.q if layout == "NCHW" else 1
    w_slice = wt[k0:k0 + k].reshape(-1).copy()
    geo = Geometry.of(sl, op)
    if op == "forward":
        out = y.reshape(-1).copy()
        emulate(geo, w_slice, x.reshape(-1), out[k0 * per_channel:], 2, 1)
        out = out.reshape(y.shape)
        y_n, x_n = _from_layout(out, layout), _from_layout(x, layout)
        w_n = _from_layout(wt, layout)
        ref = direct_correlation(x_n, w_n[k0:k0 + k], (1, 1))
        np.testing.assert_allclose(y_n[:, k0:k0 + k], ref, rtol=1e-11, atol=1e-11)
        keep = np.ones(kt, bool)
        keep[k0:k0 + k] = False
        np.testing.assert_array_equal(y_n[:, keep], _from_layout(y, layout)[:, keep])
    elif op == "backward_filter":   # dy is the slice of the wide y; dw the slice's k filters
        dw = np.full(w_slice.size, np.nan)
        emulate_backward_filter(geo, x.reshape(-1), y.reshape(-1)[k0 * per_channel:], dw, 2, 1)
        dy_n = _from_layout(y, layout)[:, k0:k0 + k]
        ref = _expected("backward_filter", sl, _from_layout(x, layout), None, dy_n)
        got = _from_layout(dw.reshape((k,) + wide.w_shape()[1:]), layout)
        np.testing.assert_allclose(got, ref, rtol=1e-11, atol=1e-11)
    else:
        dx = np.zeros(wide.x_shape()).reshape(-1)
        emulate(geo, w_slice, y.reshape(-1)[k0 * per_channel:], dx, 2, 2)
        dy_n, w_n = _from_layout(y, layout)[:, k0:k0 + k], _from_layout(wt, layout)[k0:k0 + k]
        ref = _expected("backward_data", sl, np.zeros((2, 4, 9, 10)), w_n, dy_n)
        np.testing.assert_allclose(_from_layout(dx.reshape(wide.x_shape()), layout), ref, rtol=1e-11, atol=1e-11)


# ---- workspace ----------------------------------------------------------------------------------------------------
def _align(b):
    return -(-b // WORKSPACE_ALIGN) * WORKSPACE_ALIGN


@settings(max_examples=40, deadline=None)
@given(shapes(), st.sampled_from(OPS), st.integers(1, 4))
def test_workspace_is_u_v_and_m_exactly(shape, op, chunk):
    n, c, h, w, k, pad = shape
    p = ConvProblem(n, c, h, w, k, 3, 3, pad=pad)
    geo = Geometry.of(p, op)
    ci, co = (k, c) if op == "backward_data" else (c, k)
    t = chunk * tiles(geo.ho) * tiles(geo.wo)
    assert geo.workspace_bytes(chunk) == _align(36 * 4 * co * ci) + _align(36 * 4 * ci * t) + 36 * 4 * co * t
    assert [off % WORKSPACE_ALIGN for _, off, _ in geo.segments(chunk)] == [0, 0, 0]


@settings(max_examples=40, deadline=None)
@given(shapes(), st.sampled_from(OPS), st.sampled_from(["NCHW", "NHWC"]), st.integers(1, 700))
def test_workspace_is_u_v_and_m_exactly_for_tile_chunks(shape, op, layout, t):
    n, c, h, w, k, pad = shape
    p = ConvProblem(n, c, h, w, k, 3, 3, pad=pad, layout=layout)
    geo = Geometry.of(p, op)
    ci, co = (k, c) if op == "backward_data" else (c, k)
    assert geo.workspace_bytes(0, t) == _align(36 * 4 * co * ci) + _align(36 * 4 * ci * t) + 36 * 4 * co * t
    assert [off % WORKSPACE_ALIGN for _, off, _ in geo.segments(0, t)] == [0, 0, 0]
    # a tile chunk of a whole number of images is that image chunk, byte for byte
    assert geo.workspace_bytes(0, 2 * geo.tiles_per_image) == geo.workspace_bytes(2)
    g = geo.gemm(0, t)
    if op == "backward_filter":   # dU (Co x Ci) reduced over the chunk's tiles
        assert (g.m, g.n, g.k, g.c, g.batch) == (co, ci, t, "U", 36)
    else:
        assert (g.m, g.n) == ((co, t) if layout == "NCHW" else (t, co)) and g.k == ci and g.batch == 36
    ranges = geo.tile_chunks(n, t)
    assert ranges[0][0] == 0 and sum(cnt for _, cnt in ranges) == n * geo.tiles_per_image
    assert all(a + ca == b for (a, ca), (b, _) in zip(ranges, ranges[1:])) and max(c for _, c in ranges) <= t


def test_offered_tile_chunks_are_gemm_aligned_from_64_tiles_and_tile_rows_below():
    """From 64 tiles up a chunk's T (its GEMMs' N) is a multiple of 64, four sizes an octave (VGG-16 conv4_2's
    64 MiB fill: 192 tiles, not 196); below 64, whole tile rows; between a sixteenth of an image and the larger of
    4 images and 2048 tiles, below the call's tiles, the power-of-two image chunks left out."""
    conv1_2 = Geometry.of(ConvProblem(64, 64, 224, 224, 64, 3, 3, pad=1), "forward")
    assert tile_chunk_sizes(conv1_2, 64) == [256, 320, 384, 448, 512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048,
                                             2560, 3072, 3584, 4096, 5120, 6144, 7168, 8192, 10240, 12288]
    conv4_2 = Geometry.of(ConvProblem(64, 512, 28, 28, 512, 3, 3, pad=1), "forward")
    assert tile_chunk_sizes(conv4_2, 64)[:9] == [7, 14, 21, 28, 42, 56, 64, 128, 192]
    conv5 = Geometry.of(ConvProblem(64, 512, 14, 14, 512, 3, 3, pad=1), "backward_data")   # 16 tiles an image
    assert tile_chunk_sizes(conv5, 64) == [4, 8, 12, 24, 48, 192, 320, 384, 448, 640, 768, 896]
    for n in (1, 2, 3, 8, 64):
        for geo in (conv1_2, conv4_2, conv5, Geometry.of(ConvProblem(n, 5, 13, 27, 7, 3, 3, pad=1), "backward_data")):
            got = tile_chunk_sizes(geo, n)
            tpi = geo.tiles_per_image
            images = {c * tpi for c in chunk_sizes(n)}
            assert got == sorted(set(got)) and not images & set(got)
            top = min(n * tpi, max(TILE_CHUNK_IMAGES * tpi, 2048))
            assert all(max(geo.tiles_w, tpi // 16) <= t < top for t in got)
            small = [t // geo.tiles_w for t in got if t < 64]
            assert all(t < 64 or t % 64 == 0 for t in got) and all(t % geo.tiles_w == 0 for t in got if t < 64)
            assert all(r & (r - 1) == 0 or (r % 3 == 0 and (r // 3) & (r // 3 - 1) == 0) for r in small)
            big = [t // 64 for t in got if t >= 64]
            assert all(m in (1, 2, 3) or (m >> (m.bit_length() - 3) << (m.bit_length() - 3) == m) for m in big)


def test_tile_chunks_fit_vgg_conv1_2_under_64_mib():
    """conv1_2 (64 -> 64, 224x224: 3136 tiles an image): one image is 55.7 MiB; 64 tile rows (3584 tiles, more than
    an image) 63.6 MiB; 32 tile rows 32.1 MiB."""
    for op in ("forward", "backward_data"):
        geo = Geometry.of(ConvProblem(64, 64, 224, 224, 64, 3, 3, pad=1), op)
        assert geo.workspace_bytes(0, 64 * 56) < 64 << 20 < geo.workspace_bytes(0, 96 * 56)
        assert geo.workspace_bytes(0, 32 * 56) < 33 << 20
        assert len(geo.tile_chunks(64, 64 * 56)) == 56 and geo.chunk_refusal(0, 64 * 56, 64) is None


def test_vgg_workspaces_fit_64_mib_where_cudnns_winograd_does_not():
    """VGG-16 conv4_2 (512 -> 512, 28x28): U is 36 MiB, each image 3.4 MiB of V and of M: four images fit 64 MiB
    (cuDNN's WINOGRAD_NONFUSED asks 146 MiB at any n up to 16).  conv1_2 (64 -> 64, 224x224): one image, 55 MiB."""
    conv4_2 = Geometry.of(ConvProblem(64, 512, 28, 28, 512, 3, 3, pad=1), "forward")
    assert conv4_2.workspace_bytes(4) < 64 << 20 < conv4_2.workspace_bytes(8)
    conv1_2 = Geometry.of(ConvProblem(64, 64, 224, 224, 64, 3, 3, pad=1), "backward_data")
    assert conv1_2.workspace_bytes(1) < 64 << 20 < conv1_2.workspace_bytes(2)


# ---- declines and names ----------------------------------------------------------------------------------------------
REFUSED = {
    "stride": ConvProblem(8, 3, 32, 32, 16, 3, 3, pad=1, stride=2),
    "5x5": ConvProblem(8, 3, 32, 32, 16, 5, 5, pad=2),
    "grouped": ConvProblem(8, 4, 32, 32, 16, 3, 3, pad=1, groups=2),
    "dilated": ConvProblem(8, 3, 32, 32, 16, 3, 3, pad=2, dilation=(2, 2)),
    "over 2": ConvProblem(8, 3, 32, 32, 16, 3, 3, pad=3),
    "float16": ConvProblem(8, 3, 32, 32, 16, 3, 3, pad=1, dtype="float16"),
}


@pytest.mark.parametrize("word", sorted(REFUSED))
@pytest.mark.parametrize("op", ["forward", "backward_data", "backward_filter"])
def test_unsupported_problems_are_skipped_with_the_reason(word, op):
    problem = REFUSED[word]
    ms, sk = WinogradSource().measure(op, problem, Operands(0, 0, 0), 0, BenchSettings("strict"))
    assert ms == [] and len(sk) == 1 and sk[0].reason.startswith("winograd: ")
    assert word in sk[0].reason
    with pytest.raises(InputError):
        WinogradSource().prepare(op, problem, Measurement(8, "wino-f4", "FMA", 1.0, 0, "winograd"))


def test_refusal_accepts_what_the_kernels_run():
    for layout in ("NCHW", "NHWC"):
        for pad in (0, 1, 2, (0, 2)):
            assert refusal(ConvProblem(5, 3, 13, 27, 7, 3, 3, pad=pad, layout=layout), "forward") is None
            assert refusal(ConvProblem(5, 3, 13, 27, 7, 3, 3, pad=pad, layout=layout), "backward_data") is None
            assert refusal(ConvProblem(5, 3, 13, 27, 7, 3, 3, pad=pad, layout=layout), "backward_filter") is None
    assert "unknown op" in refusal(ConvProblem(5, 3, 13, 27, 7, 3, 3, pad=1), "backward")


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None,
                    reason="with a GPU this would launch on null pointers (the GPU tests cover measure)")
def test_measure_without_a_gpu_returns_skipped_rows_instead_of_raising():
    problem = ConvProblem(4, 3, 16, 16, 8, 3, 3, pad=1)
    for op in OPS:
        ms, sk = WinogradSource().measure(op, problem, Operands(0, 0, 0), 0, BenchSettings("strict"))
        assert ms == [] and sk and all(s.reason.startswith("winograd: ") for s in sk)


def test_chunks_and_algorithm_names():
    assert chunk_sizes(1) == [1] and chunk_sizes(6) == [1, 2, 4, 6] and chunk_sizes(8) == [1, 2, 4, 8]
    assert algo_name(8, 8) == "wino-f4" and algo_name(2, 8) == "wino-f4-c2"
    assert chunk_of(Measurement(8, "wino-f4", "FMA", 1.0, 0, "winograd"), 8) == 8
    assert chunk_of(Measurement(8, "wino-f4-c2", "FMA", 1.0, 0, "winograd"), 8) == 2
    assert chunk_of(Measurement(8, "wino-f4", "FMA", 1.0, 0, "winograd", None, {"winograd": {"chunk": 4}}), 8) == 4
    with pytest.raises(InputError):
        chunk_of(Measurement(8, "mec-A", "FMA", 1.0, 0, "winograd"), 8)


def test_tile_chunk_names():
    from ucudnn.measure.sources.winograd import csplit_of, groups_of, ksplit_of, streams_of

    assert tile_algo_name(3584) == "wino-f4-t3584"
    assert tiles_of(Measurement(8, "wino-f4-t3584", "FMA", 1.0, 0, "winograd")) == 3584
    assert tiles_of(Measurement(8, "wino-f4", "FMA", 1.0, 0, "winograd", None, {"winograd": {"tiles": 12}})) == 12
    assert tiles_of(Measurement(8, "wino-f4-c2", "FMA", 1.0, 0, "winograd")) is None
    # a row that kept only its name reads every part of it, as configuration_of names them
    bare = Measurement(8, "wino-f4-t1536-k8-p2", "FMA", 1.0, 0, "winograd")
    assert (tiles_of(bare), ksplit_of(bare), streams_of(bare), groups_of(bare), csplit_of(bare)) == (1536, 8, 2, 1, 1)
    grouped = Measurement(8, "wino-f4-c4-g2", "FMA", 1.0, 0, "winograd")
    assert (chunk_of(grouped, 8), tiles_of(grouped), groups_of(grouped)) == (4, None, 2)
    assert chunk_of(Measurement(8, "wino-f4-s2", "FMA", 1.0, 0, "winograd"), 8) == 8
    # ... and the extra, where present, wins over the name
    assert tiles_of(Measurement(8, "wino-f4-t1536", "FMA", 1.0, 0, "winograd", None, {"winograd": {"tiles": 12}})) == 12
    assert tiles_of(Measurement(8, "wino-f4", "FMA", 1.0, 0, "winograd")) is None
    with pytest.raises(InputError):
        tiles_of(Measurement(8, "wino-f4-t7", "FMA", 1.0, 0, "winograd", None, {"winograd": {"tiles": 0}}))
    with pytest.raises(InputError):
        chunk_of(Measurement(8, "wino-f4-t7", "FMA", 1.0, 0, "winograd"), 8)


def test_configuration_names_carry_every_variant_in_one_order():
    from ucudnn.measure.sources.winograd import configuration_name

    assert configuration_name(64, 64) == "wino-f4" and configuration_name(8, 64) == "wino-f4-c8"
    assert configuration_name(0, 16, 1536, ksplit=8, streams=2) == "wino-f4-t1536-k8-p2"
    assert configuration_name(8, 64, groups=3, streams=2) == "wino-f4-c8-g3-p2"
    assert configuration_name(0, 64, 192, csplit=2, streams=1) == "wino-f4-t192-s2"
    with pytest.raises(InputError) as e:
        configuration_name(8, 64, lanes=2)
    assert e.value.field == "variants"


@given(st.one_of(st.tuples(st.integers(1, 64), st.none()), st.tuples(st.just(0), st.integers(1, 9999))),
       st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 3, 4]), st.sampled_from([1, 2, 4, 8]),
       st.sampled_from([1, 2, 3]))
def test_configuration_names_read_back(chunk_tiles, csplit, groups, ksplit, streams):
    from ucudnn.measure.sources.winograd import configuration_name, configuration_of

    chunk, tiles = chunk_tiles
    name = configuration_name(chunk, 64, tiles, csplit=csplit, groups=groups, ksplit=ksplit, streams=streams)
    expect = {k: v for k, v in dict(csplit=csplit, groups=groups, ksplit=ksplit, streams=streams).items() if v > 1}
    if tiles is not None:
        expect["tiles"] = tiles
    elif chunk < 64:
        expect["chunk"] = chunk
    assert configuration_of(name) == expect


@pytest.mark.parametrize("bad", ["wino-f4-fused", "wino-f4-t12x", "aeng3", "wino-f4-q2", "wino-f4-", "wino-f4t8",
                                 "mec-A"])
def test_configuration_of_refuses_other_names(bad):
    from ucudnn.measure.sources.winograd import configuration_of

    with pytest.raises(InputError) as e:
        configuration_of(bad)
    assert e.value.field == "algo"


def test_input_channel_slices_are_measured_where_u_is_a_quarter_of_the_workspace_and_recorded_for_prepare():
    from ucudnn.measure.sources.winograd import csplit_of, csplits

    wide = ConvProblem(8, 512, 28, 28, 512, 3, 3, pad=1)       # VGG-16 conv4_2: U is 37.7 MB
    geo = Geometry.of(wide, "forward")
    assert csplits(geo, "forward", 168) == [1, 2, 4] and csplits(geo, "forward", 8 * 49) == [1, 2, 4]
    assert csplits(geo, "forward", 800) == [1]                  # U under a quarter: slices pay more than they save
    assert csplits(Geometry.of(wide, "backward_filter"), "backward_filter", 168) == [1]
    assert csplits(Geometry.of(ConvProblem(8, 6, 28, 28, 512, 3, 3, pad=1), "forward"), "forward", 7) == [1, 2]
    for op, split in (("forward", True), ("backward_data", True), ("backward_filter", False)):
        _, sk = WinogradSource().measure(op, wide, Operands(0, 0, 0), 0, BenchSettings("strict"))
        names = [s.algo for s in sk]
        assert any(str(a).endswith("-s2") for a in names) is split, op
        assert any(str(a).endswith("-s4") for a in names) is split, op
    row = Measurement(8, "wino-f4-t168-s2", "FMA", 1.0, 0, "winograd", None, {"winograd": {"tiles": 168, "csplit": 2}})
    assert csplit_of(row) == 2 and tiles_of(row) == 168
    assert csplit_of(Measurement(8, "wino-f4", "FMA", 1.0, 0, "winograd")) == 1
    with pytest.raises(InputError) as e:
        csplit_of(Measurement(8, "wino-f4-s3", "FMA", 1.0, 0, "winograd", None, {"winograd": {"csplit": 3}}))
    assert e.value.field == "extra.winograd.csplit"


def test_a_call_runs_at_most_max_chunks_chunks_smaller_micro_batches_measure_the_rest():
    """VGG-16 conv1_2 (3136 tiles an image): 256-tile chunks are 784 chunks at n = 64, not measured there, but 49 at
    n = 4, measured there (WR runs n = 64 as 16 calls of 4 with the same chunk and workspace)."""
    from ucudnn.measure.sources.winograd import MAX_CHUNKS

    assert MAX_CHUNKS == 64
    for n in (1, 4, 16, 64):
        problem = ConvProblem(n, 64, 224, 224, 64, 3, 3, pad=1)
        geo = Geometry.of(problem, "forward")
        _, sk = WinogradSource().measure("forward", problem, Operands(0, 0, 0), 0, BenchSettings("strict"))
        offered = {str(s.algo) for s in sk}
        for t in tile_chunk_sizes(geo, n):
            assert (tile_algo_name(t) in offered) is (len(geo.tile_chunks(n, t)) <= MAX_CHUNKS), (n, t)
        for c in chunk_sizes(n):
            assert (algo_name(c, n) in offered) is (n // c <= MAX_CHUNKS), (n, c)
    assert tile_algo_name(256) in offered_at(4) and tile_algo_name(256) not in offered_at(64)


def offered_at(n: int) -> set[str]:
    problem = ConvProblem(n, 64, 224, 224, 64, 3, 3, pad=1)
    _, sk = WinogradSource().measure("forward", problem, Operands(0, 0, 0), 0, BenchSettings("strict"))
    return {str(s.algo) for s in sk}


def test_the_registry_builds_the_source_and_the_defaults_do_not_include_it():
    from ucudnn import source_names
    from ucudnn.measure.sources import registry

    assert isinstance(registry.get("winograd"), WinogradSource) and registry.get("winograd").name == "winograd"
    assert source_names.canonical("winograd,legacy,graph") == ("legacy", "graph", "winograd")
    assert "winograd" not in source_names.default_names() or "UCUDNN_SOURCES" in __import__("os").environ


NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_kernel_source_compiles_without_local_memory(arch, tmp_path):
    assert "winograd.cu" in _compile.source_names()
    with resources.as_file(resources.files("ucudnn.kernels").joinpath("winograd.cu")) as path:
        proc = subprocess.run([NVCC, "-std=c++17", f"-arch={arch}", "--cubin", "-DUCUDNN_NVCC_CHECK", "-Xptxas", "-v",
                               "-o", str(tmp_path / "k.cubin"), str(path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    kernels = re.findall(r"Function properties for (\w+)\s*\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, "
                         r"(\d+) bytes spill loads", proc.stderr)
    assert len(kernels) == 12, proc.stderr
    for fn, *local in kernels:
        assert local == ["0", "0", "0"], f"{fn} uses local memory on {arch}"


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("op", OPS)
def test_the_source_hands_cublas_the_described_gemm_with_its_constant_scalars(op, layout, monkeypatch):
    """What cublasGemmStridedBatchedEx receives is geo.gemm's column-major call on the workspace buffers, alpha 1 and
    beta the Gemm's own (0, or 1 where it accumulates: backward filter after a call's first chunk, forward and
    backward data after a chunk's first input-channel slice) read as host float32 scalars."""
    import ctypes

    from ucudnn.binding import cublas
    from ucudnn.measure.sources import winograd as src

    calls = []
    monkeypatch.setattr(cublas, "gemm_strided_batched", lambda *a: calls.append(a))
    geo = Geometry.of(ConvProblem(3, 5, 13, 11, 4, 3, 3, pad=1, layout=layout), op)
    bufs = {"U": 1 << 20, "V": 2 << 20, "M": 3 << 20}
    for accumulate in (False, True):
        src._gemm_call(geo, 7, "32F_PEDANTIC", accumulate)(99, bufs)
        cm = geo.gemm(0, 7, accumulate).column_major()
        h, ta, tb, m, n, k, alpha, a, _, lda, sa, b, _, ldb, sb, beta, c, _, ldc, sc, batch, compute = calls[-1]
        assert (h, ta, tb, m, n, k) == (99, cublas.OPERATIONS[cm["transa"]], cublas.OPERATIONS[cm["transb"]],
                                        cm["m"], cm["n"], cm["k"])
        assert (a, b, c) == (bufs[cm["A"][0]], bufs[cm["B"][0]], bufs[cm["C"][0]])
        assert (lda, sa, ldb, sb, ldc, sc, batch) == (cm["lda"], cm["strideA"], cm["ldb"], cm["strideB"], cm["ldc"],
                                                      cm["strideC"], cm["batchCount"])
        assert compute == cublas.COMPUTE_TYPES["32F_PEDANTIC"]
        scalar = lambda p: ctypes.c_float.from_address(p).value   # noqa: E731
        assert scalar(alpha) == 1.0
        assert scalar(beta) == (1.0 if accumulate else 0.0)


@pytest.mark.parametrize("csplit", [1, 2, 4])
def test_a_sliced_launch_transforms_each_slice_at_its_channel_and_adds_its_gemm_after_the_first(csplit, monkeypatch):
    """The launch's order of work, recorded with the kernels and cuBLAS replaced (CPU): per chunk, each slice's
    filter transform (once a call when unsplit) and input transform at its first channel's byte offset, its GEMM
    adding after the first slice, then one output transform."""
    import types

    from ucudnn.kernels import winograd as kw

    from ucudnn.binding import cublas, gpu
    from ucudnn.measure.sources import winograd as src

    p = ConvProblem(3, 8, 10, 10, 4, 3, 3, pad=1)
    geo = Geometry.of(p, "forward")
    log = []
    stream = types.SimpleNamespace(ptr=0)
    fake_cp = types.SimpleNamespace(cuda=types.SimpleNamespace(get_current_stream=lambda: stream))
    monkeypatch.setattr(gpu, "cupy", lambda: fake_cp)
    monkeypatch.setattr(cublas, "handle", lambda: 7)
    monkeypatch.setattr(cublas, "bind", lambda h, s: None)

    def fake_launchers(g):
        return (lambda w, U, s=None: log.append(("filter", g.ci, w, U)),
                lambda x, V, t0, t, s=None: log.append(("input", g.ci, x, V, t0, t)),
                lambda M, y, t0, t, a, b, s=None: log.append(("output", M, y, t0, t)))

    monkeypatch.setattr(kw, "launchers", fake_launchers)
    monkeypatch.setattr(src, "_gemm_call", lambda g, count, compute, accumulate=False:
                        lambda h, bufs: log.append(("gemm", g.ci, count, accumulate)))
    launch = src._launch(p, "forward", 0, "32F_PEDANTIC", tiles=20, csplit=csplit)
    x, w, y, ws = 1 << 20, 2 << 20, 3 << 20, 4 << 20
    launch(Operands(x, w, y), ws, geo.workspace_bytes(0, 20, csplit), 1.0, 0.0)
    seg = {name: ws + off for name, off, _ in geo.segments(0, 20, csplit)}
    cs = 8 // csplit
    expect = [] if csplit > 1 else [("filter", 8, w, seg["U"])]
    for t0, count in geo.ranges(3, 0, 20):
        for s in range(csplit):
            if csplit > 1:
                expect.append(("filter", cs, w + 4 * s * cs * 9, seg["U"]))        # w (k, c, r, s): c stride 9
            expect += [("input", cs, x + 4 * s * cs * 100, seg["V"], t0, count),    # x (n, c, h, w): c stride 100
                       ("gemm", cs, count, s > 0)]
        expect.append(("output", seg["M"], y, t0, count))
    assert log == expect


@pytest.mark.parametrize("groups,ksplit", [(1, 1), (3, 1), (1, 4)])
@pytest.mark.parametrize("streams", [1, 2, 3])
def test_a_backward_filter_launch_on_streams_gives_each_stream_its_own_du_and_sums_them_once(streams, groups, ksplit,
                                                                                             monkeypatch):
    """The launch's order of work on streams, recorded with the kernels, cuBLAS and the streams replaced (CPU):
    chunk i's transforms on stream i % streams (named at each launch, no stream context), its GEMM on that stream's
    handle into that stream's dU (overwriting on the stream's first chunk), then after the join one inverse
    transform summing every stream's dU from the first, one dU apart.  With point groups all of that once per
    group, the transforms and the inverse transform told the group, the inverse transform's beta 1 after the
    first group's.  With a split reduction the same steps, the GEMMs told the split and the inverse transform
    summing every stream's copies, one dU apart."""
    import types

    from ucudnn.kernels import winograd as kw

    from ucudnn.binding import cublas, gpu
    from ucudnn.measure.sources import winograd as src

    p = ConvProblem(3, 8, 10, 10, 4, 3, 3, pad=1)
    geo = Geometry.of(p, "backward_filter")
    log = []
    main = types.SimpleNamespace(ptr=100)
    monkeypatch.setattr(gpu, "cupy", lambda: types.SimpleNamespace(
        cuda=types.SimpleNamespace(get_current_stream=lambda: main)))

    class FakeStreams:
        def __init__(self, cp, n):
            self.handles = [10 + k for k in range(n)]
            self.n = n

        def fork(self, m):
            log.append(("fork", m.ptr))
            return [m] + [types.SimpleNamespace(ptr=100 + k) for k in range(1, self.n)]

        def join(self, m):
            log.append(("join", m.ptr))

    monkeypatch.setattr(src, "_StreamSet", FakeStreams)
    monkeypatch.setattr(cublas, "handle", lambda: 10)   # one stream: CuPy's handle, bound to the caller's stream
    monkeypatch.setattr(cublas, "bind", lambda h, s: log.append(("bind", h, s)))
    monkeypatch.setattr(kw, "backward_filter_launchers", lambda g, itemsize, gr, ksplit=1: (
        lambda x, V, t0, t, s=None, grp=0: log.append(("input", V, t0, t, s, grp)),
        lambda dy, Z, t0, t, s=None, grp=0: log.append(("dy", Z, t0, t, s, grp)),
        lambda U, w, a, b, parts=1, stride=0, grp=0: log.append(("grad", U, b, parts, stride, grp))))
    monkeypatch.setattr(src, "_gemm_call", lambda g, count, compute, accumulate=False, groups=1, ksplit=1:
                        lambda h, bufs: log.append(("gemm", h, bufs["U"], count, accumulate, groups, ksplit)))
    launch = src._launch(p, "backward_filter", 0, "32F_PEDANTIC", tiles=20, streams=streams, groups=groups,
                         ksplit=ksplit)
    ws = 1 << 24
    launch(Operands(1 << 20, 2 << 20, 3 << 20), ws, geo.workspace_bytes(0, 20, 1, streams, groups, ksplit), 1.0,
           0.5)
    seg = {name: ws + off for name, off, _ in geo.segments(0, 20, 1, streams, groups, ksplit)}
    ranges = geo.ranges(3, 0, 20)
    parts, stride = geo.partials(streams, len(ranges), groups, ksplit)
    expect = [] if streams > 1 else [("bind", 10, 100)]   # one stream: the caller's, nothing forked
    for g in range(groups):
        expect += [("fork", 100)] if streams > 1 else []
        for i, (t0, count) in enumerate(ranges):
            k = i % streams
            own = {b: seg[n] for b, n in geo.stream_buffers(k).items()}
            expect += [("input", own["V"], t0, count, 100 + k, g), ("dy", own["M"], t0, count, 100 + k, g),
                       ("gemm", 10 + k, own["U"], count, i >= streams, groups, ksplit)]
        expect += ([("join", 100)] if streams > 1 else []) + [("grad", seg["U"], 0.5 if g == 0 else 1.0, parts,
                                                               stride, g)]
    assert log == expect
    assert parts == min(streams, len(ranges)) * ksplit
    assert stride == (0 if parts == 1 else 36 // groups * geo.co * geo.ci)
    if streams > 1:
        assert seg["U1"] - seg["U"] == 4 * stride * ksplit
