"""The fft source's pure-Python side without a GPU: the tile DFTs and their inverse against NumPy's FFT; a CPU
emulation of fft.cu's kernels (their index math: overlap-save tiles, edge tiles, NCHW and NHWC strides, tile-range
chunks crossing image boundaries, alpha / beta) with the complex GEMMs run as the exact column-major calls cuBLAS
receives (op C included) inside a workspace of exactly the reported size, for forward, backward data and backward
filter against float64 direct correlations (hypothesis over shapes: odd batches, C = 1 or 3, non-square filters,
padding up to R - 1); the tile-size and chunk choices; refusals; the source's names and registration; nvcc compiles
fft.cu for sm_80 and sm_90 (tests/test_kernels_compile.py)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conv_checks import reference
from hypothesis import given, settings
from hypothesis import strategies as st

from ucudnn.errors import InputError
from ucudnn.kernels.fft import (FILTER_THREADS, MAX_CHUNKS, TILE_SIZES, CGemm, Geometry, chunk_sizes, emulate_filter,
                                emulate_filter_grad, emulate_input, emulate_output, filter_parts, half, inverse,
                                points,
                                refusal, spectrum, tile_cost, tile_sizes, tiles_per_block)
from ucudnn.measure.sources import registry
from ucudnn.measure.sources.fft import FftSource, algo_name, parse
from ucudnn.planning.table import Measurement
from ucudnn.problem import ConvProblem


# ---- the transforms --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ts", [8, 18, 32])
def test_tile_spectrum_is_numpys_half_spectrum_and_inverts(ts):
    rng = np.random.default_rng(ts)
    tile = rng.standard_normal((3, ts, ts))
    spec = spectrum(tile, ts)
    np.testing.assert_allclose(spec, np.fft.rfft2(tile), atol=1e-9)
    np.testing.assert_allclose(inverse(spec, ts, ts, ts), tile, atol=1e-9)
    np.testing.assert_allclose(inverse(spec, ts, 5, 3), tile[:, :5, :3], atol=1e-9)


def test_points_and_blocks():
    assert points(18) == 18 * 10 and points(32) == 32 * 17
    for ts in TILE_SIZES:
        g = tiles_per_block(ts)
        assert g & (g - 1) == 0 and 1 <= g <= 32
        # the shared memory of fft_input (tile + row spectra) fits the static 48 KiB; twice the tiles would not
        per_tile = 4 * ts * (ts + 1) + 8 * ts * (ts // 2 + 2)
        assert 8 * ts + g * per_tile <= 48 * 1024
        assert g == 32 or 8 * ts + 2 * g * per_tile > 48 * 1024
        # fft_output: column spectra (G x TS x (TS/2 + 2) complex) and the staged outputs (G x TS x TS floats)
        assert g * (8 * ts * (ts // 2 + 2) + 4 * ts * ts) <= 48 * 1024


# ---- emulation: the source's steps with the exact GEMM calls ------------------------------------------------------
def _col(buf: np.ndarray, off: int, rows: int, cols: int, ld: int) -> np.ndarray:
    """A column-major rows x cols matrix at ``buf[off:]`` with leading dimension ``ld``."""
    idx = off + np.arange(rows)[:, None] + ld * np.arange(cols)[None, :]
    return buf[idx]


def run_cgemm(gm: CGemm, bufs: dict[str, np.ndarray]) -> None:
    """cublasGemmStridedBatchedEx on complex buffers, as cuBLAS reads the arguments (column-major, op N / T / C)."""
    def op(mat: np.ndarray, trans: str) -> np.ndarray:
        return {"N": mat, "T": mat.T, "C": np.conj(mat.T)}[trans]

    ar, ac = (gm.m, gm.k) if gm.transa == "N" else (gm.k, gm.m)
    br, bc = (gm.k, gm.n) if gm.transb == "N" else (gm.n, gm.k)
    assert gm.lda >= ar and gm.ldb >= br and gm.ldc >= gm.m
    for i in range(gm.batch):
        a = op(_col(bufs[gm.a], i * gm.stride_a, ar, ac, gm.lda), gm.transa)
        b = op(_col(bufs[gm.b], i * gm.stride_b, br, bc, gm.ldb), gm.transb)
        cidx = i * gm.stride_c + np.arange(gm.m)[:, None] + gm.ldc * np.arange(gm.n)[None, :]
        bufs[gm.c][cidx] = a @ b + (gm.beta * bufs[gm.c][cidx] if gm.beta else 0)


def _workspace(geo: Geometry, tiles: int) -> dict[str, np.ndarray]:
    """U, V and M as views of one complex buffer of exactly the reported size (so an overrun would raise)."""
    total = geo.workspace_bytes(tiles)
    assert total % 8 == 0
    ws = np.full(total // 8, np.nan + 0j)
    return {name: ws[off // 8:(off + size) // 8] for name, off, size in geo.segments(tiles)}


def run_forward(geo: Geometry, w, x, y, n: int, tiles: int, alpha=1.0, beta=0.0) -> None:
    bufs = _workspace(geo, tiles)
    bufs["U"][:] = emulate_filter(geo, w).ravel()
    for t0, count in geo.ranges(n, tiles):
        V = emulate_input(geo, x, t0, count, geo.ci, geo.in_strides, (geo.hi, geo.wi), (-geo.pad[0], -geo.pad[1]),
                          (geo.ts, geo.ts))
        bufs["V"][:V.size] = V.ravel()
        run_cgemm(geo.gemm(count), bufs)
        M = bufs["M"][:geo.f * geo.co * count].reshape(geo.f, geo.co, count)
        emulate_output(geo, M, y, t0, count, alpha, beta)


def run_backward_filter(geo: Geometry, x, dy, dw, n: int, tiles: int, alpha=1.0, beta=0.0) -> None:
    bufs = _workspace(geo, tiles)
    for i, (t0, count) in enumerate(geo.ranges(n, tiles)):
        D = emulate_input(geo, x, t0, count, geo.ci, geo.in_strides, (geo.hi, geo.wi), (-geo.pad[0], -geo.pad[1]),
                          (geo.ts, geo.ts))
        E = emulate_input(geo, dy, t0, count, geo.co, geo.out_strides, (geo.ho, geo.wo), (0, 0), (geo.mh, geo.mw))
        bufs["V"][:D.size] = D.ravel()
        bufs["M"][:E.size] = E.ravel()
        run_cgemm(geo.gemm(count, accumulate=i > 0), bufs)
    Gc = bufs["U"].reshape(geo.f, geo.co, geo.ci)
    emulate_filter_grad(geo, Gc, dw, alpha, beta)


def _flat(a: np.ndarray, layout: str) -> np.ndarray:
    """An NCHW array (or KCRS filter) flattened in ``layout``."""
    return (a if layout == "NCHW" else a.transpose(0, 2, 3, 1)).ravel().copy()


def _unflat(f: np.ndarray, shape: tuple[int, ...], layout: str) -> np.ndarray:
    if layout == "NCHW":
        return f.reshape(shape)
    n, c, h, w = shape
    return f.reshape(n, h, w, c).transpose(0, 3, 1, 2)


shapes = st.fixed_dictionaries({
    "n": st.integers(1, 3), "c": st.sampled_from([1, 2, 3]), "k": st.integers(1, 3),
    "h": st.integers(4, 13), "w": st.integers(4, 13), "r": st.integers(1, 6), "s": st.integers(4, 7),
    "ph": st.integers(0, 6), "pw": st.integers(0, 6), "layout": st.sampled_from(["NCHW", "NHWC"]),
    "tile": st.sampled_from([8, 10, 12]), "chunk": st.integers(1, 7), "swap": st.booleans()})


def _problem(d) -> ConvProblem | None:
    r, s = (d["s"], d["r"]) if d["swap"] else (d["r"], d["s"])
    pad = (min(d["ph"], r - 1), min(d["pw"], s - 1))
    if d["h"] + 2 * pad[0] < r or d["w"] + 2 * pad[1] < s or d["tile"] < max(r, s) + 1:
        return None
    return ConvProblem(d["n"], d["c"], d["h"], d["w"], d["k"], r, s, pad, layout=d["layout"])


@settings(max_examples=40, deadline=None)
@given(shapes, st.sampled_from([(1.0, 0.0), (0.5, 2.0)]))
def test_forward_and_backward_data_emulations_match_the_float64_reference(d, ab):
    p = _problem(d)
    if p is None:
        return
    rng = np.random.default_rng(0)
    x = rng.standard_normal((p.n, p.c, p.h, p.w))
    w = rng.standard_normal((p.k, p.c, p.r, p.s))
    dy = rng.standard_normal((p.n, p.k, p.p, p.q))
    alpha, beta = ab
    wf = _flat(w, p.layout)
    # forward
    geo = Geometry.of(p, "forward", d["tile"])
    y0 = rng.standard_normal((p.n, p.k, p.p, p.q))
    yf = _flat(y0, p.layout)
    run_forward(geo, wf, _flat(x, p.layout), yf, p.n, d["chunk"], alpha, beta)
    pn = dataclasses.replace(p, layout="NCHW")   # the arrays here are NCHW; the kernels read p's layout
    ref = alpha * reference("forward", pn, x, w, dy) + beta * y0
    np.testing.assert_allclose(_unflat(yf, y0.shape, p.layout), ref, atol=1e-9)
    # backward data
    geo = Geometry.of(p, "backward_data", d["tile"])
    dx0 = rng.standard_normal(x.shape)
    dxf = _flat(dx0, p.layout)
    run_forward(geo, wf, _flat(dy, p.layout), dxf, p.n, d["chunk"], alpha, beta)
    np.testing.assert_allclose(_unflat(dxf, x.shape, p.layout),
                               alpha * reference("backward_data", pn, x, w, dy) + beta * dx0, atol=1e-9)


@settings(max_examples=40, deadline=None)
@given(shapes, st.sampled_from([(1.0, 0.0), (0.5, 2.0)]))
def test_backward_filter_emulation_matches_the_gradient(d, ab):
    p = _problem(d)
    if p is None:
        return
    rng = np.random.default_rng(1)
    x = rng.standard_normal((p.n, p.c, p.h, p.w))
    dy = rng.standard_normal((p.n, p.k, p.p, p.q))
    w0 = rng.standard_normal((p.k, p.c, p.r, p.s))
    alpha, beta = ab
    geo = Geometry.of(p, "backward_filter", d["tile"])
    dwf = _flat(w0, p.layout)
    run_backward_filter(geo, _flat(x, p.layout), _flat(dy, p.layout), dwf, p.n, d["chunk"], alpha, beta)
    ref = reference("backward_filter", dataclasses.replace(p, layout="NCHW"), x, w0, dy)
    got = _unflat(dwf, w0.shape, p.layout) if p.layout == "NCHW" else dwf.reshape(p.k, p.r, p.s, p.c).transpose(
        0, 3, 1, 2)
    np.testing.assert_allclose(got, alpha * ref + beta * w0, atol=1e-9)


def test_alexnet_conv2_geometry_and_workspace():
    p = ConvProblem(256, 64, 27, 27, 192, 5, 5, (2, 2))
    geo = Geometry.of(p, "forward", 18)
    assert (geo.mh, geo.mw, geo.tiles_h, geo.tiles_w, geo.f) == (14, 14, 2, 2, 180)
    # U 192 x 64 x 180 complex, then V and M for 128 tiles, U and V 256-byte aligned
    u, v, m = 8 * 180 * 192 * 64, 8 * 180 * 64 * 128, 8 * 180 * 192 * 128
    assert geo.workspace_bytes(128) == u + v + m
    assert geo.workspace_bytes(128) < 64 << 20 < geo.workspace_bytes(192)
    bd = Geometry.of(p, "backward_data", 18)
    assert (bd.ci, bd.co, bd.pad, bd.rot) == (192, 64, (2, 2), True)


def test_tile_sizes_rank_by_work_then_halve_u_and_need_room_for_the_filter():
    """The two cheapest tile sizes, then the cheapest whose U is at most half the smallest offered so far, twice:
    AlexNet conv2's TS 32 and 18 (one 28x28 output tile an image; four 14x14) need U of 107 and 35 MB, so under
    32 MiB only TS 12 (84 points: 16.5 MB) or 8 (40: 7.9 MB) run at all."""
    alex = ConvProblem(256, 64, 27, 27, 192, 5, 5, (2, 2))
    assert tile_sizes(alex, "forward") == [32, 18, 12, 8]
    assert tile_sizes(alex, "forward", smaller=0) == [32, 18]
    for p in [alex, ConvProblem(3, 1, 17, 17, 5, 1, 7, (0, 3)), ConvProblem(1, 3, 224, 224, 8, 7, 5, (3, 2)),
              ConvProblem(2, 4, 11, 11, 4, 9, 9, (4, 4))]:
        for op in ("forward", "backward_data", "backward_filter"):
            sizes = tile_sizes(p, op)
            assert all(ts in TILE_SIZES and ts > max(p.r, p.s) for ts in sizes) and len(set(sizes)) == len(sizes)
            ranked = sorted((ts for ts in TILE_SIZES if ts > max(p.r, p.s)), key=lambda ts: (tile_cost(p, op, ts), ts))
            assert sizes[:2] == ranked[:2] and 2 <= len(sizes) <= 4
            for k in range(2, len(sizes)):   # each later one: the cheapest with at most half the smallest U before
                cap = min(points(ts) for ts in sizes[:k]) // 2
                assert sizes[k] == next(ts for ts in ranked if points(ts) <= cap)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 300), st.integers(1, 64), st.integers(5, 60))
def test_chunk_sizes_cover_the_call_in_at_most_max_chunks(n, hw, _):
    p = ConvProblem(n, 4, hw + 4, hw + 4, 4, 5, 5)
    geo = Geometry.of(p, "forward", 16)
    total = n * geo.tiles_per_image
    sizes = chunk_sizes(geo, n)
    assert sizes == sorted(set(sizes)) and sizes[-1] == total
    for t in sizes:
        assert 1 <= t <= total and -(-total // t) <= MAX_CHUNKS
        ranges = geo.ranges(n, t)
        assert sum(c for _, c in ranges) == total and all(c <= t for _, c in ranges)
        assert [t0 for t0, _ in ranges] == list(range(0, total, t))


@pytest.mark.parametrize("problem, op, words", [
    (ConvProblem(2, 4, 9, 9, 4, 3, 3, (1, 1)), "forward", "3x3"),
    (ConvProblem(2, 4, 40, 40, 4, 17, 17), "forward", "over 16"),
    (ConvProblem(2, 4, 9, 9, 4, 5, 5, (1, 1), stride=(2, 2)), "forward", "stride"),
    (ConvProblem(2, 4, 9, 9, 4, 5, 5, (1, 1), dilation=(2, 2)), "forward", "dilated"),
    (ConvProblem(2, 4, 9, 9, 4, 5, 5, (1, 1), groups=2), "forward", "grouped"),
    (ConvProblem(2, 4, 9, 9, 4, 5, 5, (1, 1), dtype="float16"), "forward", "float16"),
    (ConvProblem(2, 4, 9, 9, 4, 5, 5, (5, 1)), "backward_data", "padding"),
])
def test_refusals_name_the_reason(problem, op, words):
    why = refusal(problem, op)
    assert why and words in why
    with pytest.raises(InputError) as e:
        Geometry.of(problem, op, 16)
    assert e.value.field == "problem"


def test_tile_size_errors_name_the_field():
    p = ConvProblem(2, 4, 9, 9, 4, 5, 5, (1, 1))
    for ts in (7, 34, 6):
        with pytest.raises(InputError) as e:
            Geometry.of(p, "forward", ts)
        assert e.value.field == "tile"


# ---- the source ------------------------------------------------------------------------------------------------
def test_algo_names_round_trip_and_bad_names_are_refused():
    for ts, tiles, streams in [(18, None, 1), (32, 12, 1), (8, 4096, 3), (20, 256, 2)]:
        m = Measurement(4, algo_name(ts, tiles, streams), "FMA", 1.0, 0, "fft")
        assert parse(m) == (ts, tiles, streams)
        extra = {"tile": ts, "tiles": tiles, **({"streams": streams} if streams > 1 else {})}
        m2 = Measurement(4, "x", "FMA", 1.0, 0, "fft", None, {"fft": extra})
        assert parse(m2) == (ts, tiles, streams)
    assert algo_name(20, 256, 2) == "fft-t20-c256-p2" and algo_name(18, None, 3) == "fft-t18-p3"
    for bad in ("fft", "fft-18", "fft-t18-128", "wino-f4", "fft-t18-c", "fft-t18-p2-c4", "fft-t18-c4-c4",
                "fft-t18-x2"):
        with pytest.raises(InputError) as e:
            parse(Measurement(4, bad, "FMA", 1.0, 0, "fft"))
        assert e.value.field == "algo", bad
    with pytest.raises(InputError) as e:
        parse(Measurement(4, "x", "FMA", 1.0, 0, "fft", None, {"fft": {"tile": 18, "tiles": 0}}))
    assert e.value.field == "extra.fft.tiles"
    with pytest.raises(InputError) as e:
        parse(Measurement(4, "fft-t18-p4", "FMA", 1.0, 0, "fft"))
    assert e.value.field == "extra.fft.streams"


def test_streams_get_their_own_buffers_and_backward_filter_its_own_gc():
    p = ConvProblem(4, 8, 20, 20, 12, 5, 5, (2, 2))
    for op in ("forward", "backward_filter"):
        geo = Geometry.of(p, op, 16)
        one, three = geo.workspace_bytes(40), geo.workspace_bytes(40, 3)
        vm = 8 * geo.f * (geo.ci + geo.co) * 40
        u = 8 * geo.f * geo.co * geo.ci
        assert three - one == (2 * vm + (2 * u if op == "backward_filter" else 0))
        names = [n for n, _, _ in geo.segments(40, 3)]
        assert names == (["U", "U1", "U2"] if op == "backward_filter" else ["U"]) + [
            "V", "M", "V1", "M1", "V2", "M2"]
        assert geo.stream_buffers(2) == {"U": "U2" if op == "backward_filter" else "U", "V": "V2", "M": "M2"}
    geo = Geometry.of(p, "backward_filter", 16)
    assert geo.partials(3, 2) == (2, dict((n, o) for n, o, _ in geo.segments(40, 3))["U1"] // 8)
    assert geo.partials(3, 1) == (1, 0)
    with pytest.raises(InputError) as e:
        geo.segments(40, 4)
    assert e.value.field == "streams"


@pytest.mark.parametrize("streams", [2, 3])
def test_chunks_over_streams_compute_the_same_gradient(streams):
    """Backward filter with chunk i adding into stream i % streams' Gc, the inverse summing the parts."""
    p = ConvProblem(3, 3, 11, 9, 4, 5, 3, (2, 1))
    rng = np.random.default_rng(5)
    x, dy = rng.standard_normal((p.n, p.c, p.h, p.w)), rng.standard_normal((p.n, p.k, p.p, p.q))
    geo = Geometry.of(p, "backward_filter", 12)
    tiles = 2
    ranges = geo.ranges(p.n, tiles)
    total = geo.workspace_bytes(tiles, streams)
    ws = np.full(total // 8, np.nan + 0j)
    seg = {n: ws[o // 8:(o + sz) // 8] for n, o, sz in geo.segments(tiles, streams)}
    for i, (t0, count) in enumerate(ranges):
        k = i % streams
        bufs = {key: seg[name] for key, name in geo.stream_buffers(k).items()}
        D = emulate_input(geo, x.ravel(), t0, count, geo.ci, geo.in_strides, (geo.hi, geo.wi),
                          (-geo.pad[0], -geo.pad[1]), (geo.ts, geo.ts))
        E = emulate_input(geo, dy.ravel(), t0, count, geo.co, geo.out_strides, (geo.ho, geo.wo), (0, 0),
                          (geo.mh, geo.mw))
        bufs["V"][:D.size] = D.ravel()
        bufs["M"][:E.size] = E.ravel()
        run_cgemm(geo.gemm(count, accumulate=i >= streams), bufs)
    parts, pstride = geo.partials(streams, len(ranges))
    dw = np.zeros(p.k * p.c * p.r * p.s)
    u0 = dict((n, o) for n, o, _ in geo.segments(tiles, streams))["U"] // 8
    emulate_filter_grad(geo, ws[u0:], dw, 1.0, 0.0, parts, pstride)
    xp = np.pad(x, ((0, 0), (0, 0), (p.pad[0], p.pad[0]), (p.pad[1], p.pad[1])))
    win = np.lib.stride_tricks.sliding_window_view(xp, (p.p, p.q), axis=(2, 3))[:, :, :p.r, :p.s]
    np.testing.assert_allclose(dw.reshape(p.k, p.c, p.r, p.s), np.einsum("ncrspq,nkpq->kcrs", win, dy), atol=1e-9)


def test_source_is_registered_and_declines_3x3_as_a_skipped_row():
    src = registry.get("fft")
    assert isinstance(src, FftSource) and src.name == "fft" and not src.channel_slices
    from ucudnn.measure.sources.base import BenchSettings, Operands

    p = ConvProblem(2, 4, 9, 9, 4, 3, 3, (1, 1))
    rows, skipped = src.measure("forward", p, Operands(0, 0, 0), 0, BenchSettings("strict"))
    assert rows == [] and len(skipped) == 1 and "3x3" in skipped[0].reason


# ---- fft.cu's paired sums (the kernels' loops, transcribed) ----------------------------------------------------
def _paired_row(row: np.ndarray, ts: int) -> np.ndarray:
    """fft_input's row pass: b and TS - b summed and differenced (real row -> half spectrum)."""
    h2, c, s = ts // 2, np.cos(2 * np.pi * np.arange(ts) / ts), np.sin(2 * np.pi * np.arange(ts) / ts)
    out = np.zeros(h2 + 1, complex)
    for kb in range(h2 + 1):
        re, im = row[0] + (-row[h2] if kb & 1 else row[h2]), 0.0
        for b in range(1, h2):
            re += (row[b] + row[ts - b]) * c[kb * b % ts]
            im -= (row[b] - row[ts - b]) * s[kb * b % ts]
        out[kb] = re + 1j * im
    return out


def _paired_col(col: np.ndarray, ts: int) -> np.ndarray:
    """fft_input's column pass: V[ka] = A - iB, V[TS - ka] = A + iB."""
    h2, c, s = ts // 2, np.cos(2 * np.pi * np.arange(ts) / ts), np.sin(2 * np.pi * np.arange(ts) / ts)
    out = np.full(ts, np.nan, complex)
    for ka in range(h2 + 1):
        sg = -1 if ka & 1 else 1
        a_, b_ = col[0] + sg * col[h2], 0j
        for a in range(1, h2):
            a_ += (col[a] + col[ts - a]) * c[ka * a % ts]
            b_ += (col[a] - col[ts - a]) * s[ka * a % ts]
        out[ka] = complex(a_.real + b_.imag, a_.imag - b_.real)
        if 0 < ka < h2:
            out[ts - ka] = complex(a_.real - b_.imag, a_.imag + b_.real)
    return out


def _paired_inverse_col(col: np.ndarray, ts: int, mh: int) -> np.ndarray:
    """fft_output's column pass: S[a] = base + P + iQ, S[TS - a] = base + P - iQ, rows below MH."""
    h2, c, s = ts // 2, np.cos(2 * np.pi * np.arange(ts) / ts), np.sin(2 * np.pi * np.arange(ts) / ts)
    out = np.full(ts, np.nan, complex)
    for a in range(h2 + 1):
        if not (a < mh or (a > 0 and ts - a < mh)):
            continue
        sg = -1 if a & 1 else 1
        p, q = col[0] + sg * col[h2], 0j
        for ka in range(1, h2):
            p += (col[ka] + col[ts - ka]) * c[ka * a % ts]
            q += (col[ka] - col[ts - ka]) * s[ka * a % ts]
        if a < mh:
            out[a] = complex(p.real - q.imag, p.imag + q.real)
        if 0 < a < h2 and ts - a < mh:
            out[ts - a] = complex(p.real + q.imag, p.imag - q.real)
    return out[:mh]


def _paired_inverse_row(sp: np.ndarray, ts: int, mw: int) -> np.ndarray:
    """fft_output's row pass on the weighted half spectrum: y[b] = P - Q, y[TS - b] = P + Q, columns below MW."""
    h2, c, s = ts // 2, np.cos(2 * np.pi * np.arange(ts) / ts), np.sin(2 * np.pi * np.arange(ts) / ts)
    out = np.full(ts, np.nan)
    for b in range(h2 + 1):
        if not (b < mw or (b > 0 and ts - b < mw)):
            continue
        pc = sum(sp[kb].real * c[kb * b % ts] for kb in range(h2 + 1))
        qs = sum(sp[kb].imag * s[kb * b % ts] for kb in range(h2 + 1))
        if b < mw:
            out[b] = pc - qs
        if 0 < b < h2 and ts - b < mw:
            out[ts - b] = pc + qs
    return out[:mw]


@pytest.mark.parametrize("ts", [8, 10, 18, 32])
def test_the_kernels_paired_sums_are_the_dft(ts):
    rng = np.random.default_rng(ts)
    tile = rng.standard_normal((ts, ts))
    rows = np.array([_paired_row(r, ts) for r in tile])                                 # [a, kb]
    np.testing.assert_allclose(rows, np.fft.rfft(tile, axis=1), atol=1e-9)
    spec = np.array([_paired_col(rows[:, kb], ts) for kb in range(ts // 2 + 1)]).T      # [ka, kb]
    np.testing.assert_allclose(spec, np.fft.rfft2(tile), atol=1e-9)
    for mh, mw in [(ts, ts), (ts - 4, ts - 6), (2, 3), (ts // 2 + 1, ts // 2)]:
        cols = np.array([_paired_inverse_col(spec[:, kb], ts, mh) for kb in range(ts // 2 + 1)]).T   # [a, kb]
        weighted = cols * np.r_[1, np.full(ts // 2 - 1, 2.0), 1] / (ts * ts)
        got = np.array([_paired_inverse_row(weighted[a], ts, mw) for a in range(mh)])
        np.testing.assert_allclose(got, tile[:mh, :mw], atol=1e-9)


def test_measured_stream_counts_need_as_many_chunks():
    from ucudnn.measure.sources.fft import stream_counts

    assert stream_counts(1) == [1] and stream_counts(2) == [1, 2] and stream_counts(40) == [1, 2]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 512), st.integers(1, 512), st.sampled_from(TILE_SIZES))
def test_the_filter_transform_splits_columns_only_where_the_filters_leave_the_device_idle(co, ci, ts):
    """A thread per column of each filter's spectrum where that makes FILTER_THREADS threads (AlexNet conv2's
    256 x 96 filters: 1 part), more parts a column for few filters, never more than a thread a point."""
    geo = Geometry.of(ConvProblem(1, ci, 40, 40, co, 5, 5, (2, 2)), "forward", ts)
    parts = filter_parts(geo)
    columns = co * ci * half(geo.ts)
    assert 1 <= parts <= geo.ts
    assert (parts == 1) is (columns >= FILTER_THREADS)
    assert parts == geo.ts or columns * parts >= FILTER_THREADS
    assert parts == 1 or columns * (parts - 1) < FILTER_THREADS
    assert filter_parts(Geometry.of(ConvProblem(1, 96, 27, 27, 256, 5, 5, (2, 2)), "forward", 18)) == 1
