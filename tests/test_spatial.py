"""Tensor-core 1x1 -> spatial blocks (kernels/spatial.cu) without a GPU: which blocks the kernel takes, its halo
arithmetic (every tap of every tile pixel lands in the halo, at the intermediate pixel the convolution reads), the
instantiation it names, and its arithmetic (emulate: float16 operands, float32 sums, a float16 intermediate) against
the float64 reference of the block."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ucudnn.errors import InputError
from ucudnn.kernels import spatial as S
from ucudnn.kernels.fused import DEFAULT_SMEM, SEED_BLOCKS, Block, ConvLayer, reference


def test_the_seed_inception_and_fire_blocks_run_and_the_others_do_not():
    assert S.unsupported(SEED_BLOCKS["a.1"], "float16") is None
    assert S.unsupported(SEED_BLOCKS["b.1"], "float16") is None
    assert "float16" in S.unsupported(SEED_BLOCKS["a.1"], "float32")
    assert "merge" in S.unsupported(SEED_BLOCKS["c.1"], "float16")
    assert "first layer" in S.unsupported(SEED_BLOCKS["a.2"], "float16")      # the depthwise 3x3 first
    strided = Block("s", "straight", 32, (ConvLayer(16, 1), ConvLayer(32, 3, stride=2, pad=1)))
    assert "strided" in S.unsupported(strided, "float16")
    odd = Block("o", "straight", 24, (ConvLayer(16, 1), ConvLayer(32, 3, pad=1)))
    assert "multiples of 16" in S.unsupported(odd, "float16")
    wide = Block("w", "straight", 32, (ConvLayer(16, 1), ConvLayer(32, (1, 9), pad=(0, 4))))
    assert "wider" in S.unsupported(wide, "float16")


def test_the_launcher_refuses_what_the_kernel_cannot_run_before_compiling():
    with pytest.raises(InputError) as e:
        S.launcher(SEED_BLOCKS["c.1"], "float16", "NCHW", (1, 64, 56, 56))
    assert e.value.field == "block"
    with pytest.raises(InputError) as e:
        S.launcher(SEED_BLOCKS["a.1"], "float16", "NCHW", (1, 192, 28, 28), nw=3)
    assert e.value.field == "tiling"
    with pytest.raises(InputError) as e:
        S.launcher(SEED_BLOCKS["a.1"], "float16", "NCHW", (1, 28, 28, 192))
    assert e.value.field == "x"
    with pytest.raises(InputError) as e:
        S.launcher(SEED_BLOCKS["a.1"], "float16", "CHWN", (1, 192, 28, 28))
    assert e.value.field == "layout"


def test_the_instantiation_names_every_layer_and_the_default_tilings_fit_the_seed_blocks():
    a1, b1 = SEED_BLOCKS["a.1"], SEED_BLOCKS["b.1"]
    assert S.name_expr(a1, "NCHW", 4, 4, 4, 0) == ("spatial_chain<192,16,false,4,4,4,2,true,ACT_RELU,"
                                                   "32,5,5,2,2,true,ACT_RELU,0,1,1,0,0,false,ACT_NONE>")
    assert S.name_expr(b1, "NHWC", 8, 8, 8, 3) == ("spatial_chain<64,16,true,8,8,8,3,true,ACT_RELU,"
                                                   "64,1,1,0,0,true,ACT_RELU,64,3,3,1,1,true,ACT_RELU>")
    # a.1, 4 x 4 tile: an 8 x 8 halo of 192 channels, the 16 x 192 producer filters, the 8 x 8 x 16 intermediate
    # and both 16-row tiles of the 5x5 filters (5 * 5 * 16 + 8 halves a row)
    assert S.smem_bytes(a1, 4, 4, 0) == 2 * (64 * 200 + 16 * 200 + 64 * 24 + 32 * 408)
    for block in (a1, b1):
        assert all(S.smem_bytes(block, th, tw, rtb) <= DEFAULT_SMEM for th, tw, _, rtb in S.TILINGS)


def _consumer(draw, pad_sum=None):
    r, s = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    if pad_sum is None:
        ph, pw = draw(st.integers(0, r - 1)), draw(st.integers(0, s - 1))
    else:   # a second consumer producing the same plane: 2 pad - kernel equal to the first's
        ph, pw = (pad_sum[0] + r) / 2, (pad_sum[1] + s) / 2
        if ph != int(ph) or pw != int(pw) or not (0 <= ph < r and 0 <= pw < s):
            return None
        ph, pw = int(ph), int(pw)
    return ConvLayer(16 * draw(st.integers(1, 3)), (r, s), pad=(ph, pw))


@st.composite
def blocks(draw):
    c1 = _consumer(draw)
    if draw(st.booleans()):
        c2 = _consumer(draw, (2 * c1.pad[0] - c1.kernel[0], 2 * c1.pad[1] - c1.kernel[1]))
        if c2 is not None:
            return Block("split", "split", 16, (ConvLayer(16, 1), c1, c2))
    return Block("straight", "straight", 16, (ConvLayer(16, 1), c1))


@settings(max_examples=200, deadline=None)
@given(blocks(), st.integers(1, 8), st.integers(1, 8), st.integers(0, 50), st.integers(0, 50))
def test_every_tap_of_a_tile_reads_the_halo_pixel_of_its_intermediate_position(block, th, tw, oh0, ow0):
    """Tile origin (oh0, ow0): the halo's pixel (row, col) holds intermediate pixel (oh0 - dh + row, ow0 - dw +
    col); tap (i, k) of output pixel (oh, ow) of a pad-(ph, pw) convolution reads intermediate (oh + i - ph, ow + k
    - pw).  Every tap lands inside the halo there, and the halo is no larger than the taps need."""
    hal = S.halo(block, th, tw)
    reached_rows, reached_cols = set(), set()
    for layer in block.layers[1:]:
        (r, s), (ph, pw) = layer.kernel, layer.pad
        for ty in range(th):
            for tx in range(tw):
                for i in range(r):
                    for k in range(s):
                        p = hal.tap(layer, ty, tx, i, k)
                        row, col = divmod(p, hal.hw)
                        assert 0 <= p < hal.hp and 0 <= col < hal.hw
                        assert (oh0 - hal.dh + row, ow0 - hal.dw + col) == (oh0 + ty + i - ph, ow0 + tx + k - pw)
                        reached_rows.add(row)
                        reached_cols.add(col)
    assert reached_rows == set(range(hal.hh)) and reached_cols == set(range(hal.hw))
    assert hal.hpp % 8 == 0 and hal.hp <= hal.hpp < hal.hp + 8


def _weights(block, rng, layout):
    ws, bs = [], []
    for layer, cin in zip(block.layers, block.layer_inputs()):
        r, s = layer.kernel
        w = rng.standard_normal((layer.out_channels, cin, r, s)) * np.sqrt(2.0 / (cin * r * s))
        ws.append(w if layout == "NCHW" else w.transpose(0, 2, 3, 1))
        bs.append(rng.standard_normal(layer.out_channels) * 0.1 if layer.bias else None)
    return ws, bs


@settings(max_examples=25, deadline=None)
@given(blocks(), st.integers(0, 10_000), st.sampled_from(["NCHW", "NHWC"]), st.integers(1, 2), st.integers(1, 9),
       st.integers(1, 9))
def test_the_kernels_arithmetic_is_the_block_within_float16_rounding(block, seed, layout, n, h, w):
    mid, out = block.planes(h, w)
    if min(out) < 1:
        return
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(block.x_shape(n, h, w, layout))
    ws, bs = _weights(block, rng, layout)
    f16 = lambda a: None if a is None else np.asarray(a, np.float16)  # noqa: E731
    em = S.emulate(block, f16(x), [f16(v) for v in ws], [f16(v) for v in bs], layout=layout)
    ref = reference(block, f16(x).astype(np.float64), [f16(v).astype(np.float64) for v in ws],
                    [None if v is None else f16(v).astype(np.float64) for v in bs], layout=layout)
    assert em.dtype == np.float16 and em.shape == block.y_shape(n, h, w, layout)
    err = np.linalg.norm(em.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-30)
    assert err < 3e-3


def test_emulate_refuses_a_block_the_kernel_does_not_run():
    with pytest.raises(InputError) as e:
        S.emulate(SEED_BLOCKS["c.1"], np.zeros((1, 64, 2, 2), np.float16), [], [])
    assert e.value.field == "block"
