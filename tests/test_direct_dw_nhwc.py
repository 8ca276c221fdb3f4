"""The depthwise NHWC kernels (``direct_dw_nhwc*`` in kernels/direct.cu, kernels/direct_dw_nhwc.py) without a GPU:
their tiles, halos, channel blocks and backward filter's shares of the tiles emulated block by block against the
float64 references (hypothesis over shapes, channel counts that are not multiples of 4 or of a block, filter sizes,
tiles), their refusals, launch geometry and the direct source's rows for them."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ucudnn.kernels import direct as D
from ucudnn.kernels import direct_dw_nhwc as NH

from ucudnn.errors import InputError
from ucudnn.measure.sources.base import BenchSettings, Operands
from ucudnn.measure.sources.direct import DW_ALGOS, DirectSource
from ucudnn.problem import ConvProblem


@st.composite
def nhwc_depthwise(draw):
    """Depthwise K x K (3, 5, 7) / stride 1 / padding K / 2 NHWC problems: planes from 1 x 1 (narrower than the
    filter) to 20 a side, channels from 1 to 40 (a partial quad, more than one block of 32)."""
    c, k = draw(st.sampled_from([1, 3, 4, 6, 8, 33, 40])), draw(st.sampled_from([3, 5, 7]))
    return ConvProblem(draw(st.integers(1, 2)), c, draw(st.integers(1, 20)), draw(st.integers(1, 20)), c, k, k,
                       pad=(k // 2, k // 2), groups=c, layout="NHWC")


def _reference(op: str, p: ConvProblem, seed: int = 0):
    rng = np.random.default_rng(seed)
    x, w, dy = rng.standard_normal(p.x_shape()), rng.standard_normal(p.w_shape()), rng.standard_normal(p.y_shape())
    if op == "forward":
        return (x, w), D.forward_reference(x, w, p)
    if op == "backward_data":
        return (w, dy), D.backward_data_reference(dy, w, p)
    return (x, dy), D.backward_filter_reference(x, dy, p)


@settings(max_examples=40, deadline=None)
@given(nhwc_depthwise(), st.sampled_from(["forward", "backward_data"]), st.sampled_from(NH.FWD_TILES))
def test_forward_and_backward_data_emulated_tile_by_tile_equal_the_reference(p, op, tile):
    """Every output position is computed once, by the thread of its tile's row and column group, from the staged tile
    with its halo (zeros outside the plane), the taps rotated for backward data."""
    (a, b), ref = _reference(op, p, seed=p.h * 31 + p.w)
    got = NH.emulate(op, p, tile, a, b)
    assert not np.isnan(got).any(), "every output element is written"
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(nhwc_depthwise(), st.sampled_from(NH.BWF_TILES), st.integers(1, 5))
def test_backward_filter_emulated_over_block_shares_equals_the_reference(p, tile, blocks):
    """Blocks walking their share of all samples' tiles (any number of blocks) sum every (dy position, tap) once."""
    (a, b), ref = _reference("backward_filter", p, seed=p.h * 37 + p.w)
    np.testing.assert_allclose(NH.emulate("backward_filter", p, tile, a, b, blocks=blocks), ref, rtol=1e-10,
                               atol=1e-10)


@pytest.mark.parametrize("problem, op, why", [
    (ConvProblem(2, 4, 8, 8, 4, 3, 3, pad=(1, 1), groups=4), "forward", "NCHW"),
    (ConvProblem(2, 4, 8, 8, 8, 3, 3, pad=(1, 1), groups=4, layout="NHWC"), "forward", "one filter per channel"),
    (ConvProblem(2, 4, 8, 8, 4, 9, 9, pad=(4, 4), groups=4, layout="NHWC"), "forward", "not 3x3, 5x5 or 7x7"),
    (ConvProblem(2, 4, 8, 8, 4, 3, 3, pad=(1, 1), stride=(2, 2), groups=4, layout="NHWC"), "backward_data",
     "at stride 1"),
    (ConvProblem(2, 4, 8, 8, 4, 5, 5, pad=(1, 1), groups=4, layout="NHWC"), "forward", "padding K / 2"),
    (ConvProblem(2, 4, 8, 8, 4, 3, 3, pad=(1, 1), groups=4, layout="NHWC", dtype="bfloat16"), "backward_filter",
     "dtype bfloat16"),
])
def test_only_the_same_padded_stride_one_nhwc_depthwise_layer_runs(problem, op, why):
    assert why in NH.refusal(op, problem)
    with pytest.raises(InputError) as e:
        NH.launcher(op, problem, NH.tiles_of(op)[0])
    assert e.value.field == "problem"


def test_geometry_and_tiles():
    p = ConvProblem(3, 96, 56, 56, 96, 7, 7, pad=(3, 3), groups=96, layout="NHWC")
    g = NH.geometry(p, "forward", (8, 4, 2, 8))
    assert (g["rows"], g["cols"], g["tiles_w"], g["tiles_hw"], g["cblocks"], g["threads"]) == (8, 8, 7, 49, 3, 256)
    assert g["smem"] == (14 * 14 + 49) * 8 * 16 <= 48 * 1024
    b = NH.geometry(p, "backward_filter", (4, 16, 8))
    assert (b["tiles"], b["threads"]) == (3 * 14 * 4, 8 * 7 * 4)
    for op in ("forward", "backward_filter"):      # every instance stays in the default 48 KiB of shared memory
        for t in NH.tiles_of(op):
            assert NH.geometry(p, op, t)["smem"] <= 48 * 1024
    with pytest.raises(InputError) as e:
        NH.check_tile("forward", (4, 16, 8), "extra.direct.tile")
    assert e.value.field == "extra.direct.tile"


@pytest.mark.parametrize("k", [3, 5, 7])
def test_nhwc_depthwise_layers_get_the_nhwc_tiles_recorded_for_prepare(k):
    p = ConvProblem(4, 8, 16, 16, 8, k, k, pad=(k // 2, k // 2), groups=8, layout="NHWC")
    for op in ("forward", "backward_data", "backward_filter"):
        ms, sk = DirectSource().measure(op, p, Operands(0, 0, 0), 0, BenchSettings("strict"))
        # no GPU here: every configuration is a skipped row, the NHWC depthwise tiles among them, each once
        assert ms == [] and [s.algo for s in sk].count(DW_ALGOS[k]) == len(NH.tiles_of(op))
    _, sk = DirectSource().measure("backward_filter", p, Operands(0, 0, 0), 0, BenchSettings("strict-deterministic"))
    assert DW_ALGOS[k] not in [s.algo for s in sk]


def test_a_recorded_nhwc_tile_is_checked_before_it_runs():
    from ucudnn.planning.table import Measurement

    p = ConvProblem(2, 8, 16, 16, 8, 7, 7, pad=(3, 3), groups=8, layout="NHWC")
    with pytest.raises(InputError) as e:
        DirectSource().prepare("forward", p, Measurement(2, DW_ALGOS[7], "FMA", 1.0, 0, "direct", None,
                                                         {"direct": {"kernel": NH.KERNEL, "tile": [3, 3, 3, 3]}}))
    assert e.value.field == "extra.direct.tile"


class _FakeKernel:
    """A ``cupy.RawKernel`` stand-in: records its launches."""

    def __init__(self, name, log):
        self.name, self.log = name, log

    def __call__(self, grid, block, args, shared_mem=0):
        self.log.append((self.name, grid, block, args, shared_mem))


@pytest.mark.parametrize("layout, op, dtype", [("NHWC", "forward", "float32"), ("NHWC", "backward_data", "float32"),
                                               ("NHWC", "backward_filter", "float32"),
                                               ("NHWC", "backward_filter", "float16"),
                                               ("NCHW", "backward_filter", "float32"),
                                               ("NCHW", "backward_data", "float32")])
def test_a_depthwise_launch_runs_exactly_the_calls_it_describes_to_the_compiled_path(monkeypatch, layout, op, dtype):
    """What the compiled launch path is handed (``launch.native.calls``) is what the Python launch runs: the vector
    kernel where the operands it names are 16-byte aligned, else the scalar one, the operands and alpha / beta in
    their places."""
    import numpy as np
    from ucudnn.kernels import _compile, igemm

    from ucudnn.measure.sources.direct import configure_dw, configure_dw_nhwc

    log: list = []
    monkeypatch.setattr(_compile, "get_kernel", lambda source, name: _FakeKernel(name, log))
    monkeypatch.setattr(igemm, "sm_count", lambda: 132)
    p = ConvProblem(4, 40, 14, 12, 40, 7, 7, pad=(3, 3), groups=40, layout=layout, dtype=dtype)
    config = configure_dw_nhwc(op, p, NH.tiles_of(op)[0]) if layout == "NHWC" else configure_dw(op, p, 8, 1)
    half_bwf = dtype == "float16" and op == "backward_filter"
    assert config.workspace_bytes == (4 * 40 * 49 if half_bwf else 0)    # float16 sums in C * K * K floats
    launch = DirectSource().prepare(op, p, config)
    native = launch.native
    assert native.kind == "kernel" and native.op == op and native.problem == p
    # backward filter: dw = beta * dw, then the sums; float16: zero the float sums, add them, dw = sums + beta * dw
    assert len(native.calls) == (3 if half_bwf else 2 if op == "backward_filter" else 1)
    assert any("ws" in c.args for c in native.calls) is half_bwf
    for a, b, out, vector in ((4096, 8192, 12288, True), (4100, 8196, 12292, False)):
        log.clear()
        launch(Operands(a, b, out), 65536, config.workspace_bytes, 0.5, 1.0)
        assert len(log) == len(native.calls)
        ptrs = {"a": a, "b": b, "out": out, "alpha": np.float32(0.5), "beta": np.float32(1.0), "ws": 65536}
        for (name, grid, block, args, smem), c in zip(log, native.calls):
            kernel = c.vector if vector and c.vector is not None else c.scalar
            assert name == kernel.name and (grid, block, smem) == (c.grid, c.block, c.smem)
            assert args == tuple(ptrs[x] if isinstance(x, str) else x for x in c.args)
    # C a multiple of 4: every call that reads activations has its one-load-a-quad variant
    assert all(c.vector is not None for c in native.calls if c.aligned)
