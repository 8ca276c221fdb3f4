"""Tensor-core chains of 1x1 convolutions (kernels/pointwise.cu) without a GPU: which blocks the kernel takes, its
launch geometry, and its arithmetic (emulate: float16 operands, float32 sums, a float16 intermediate) against the
float64 reference of the block."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ucudnn.errors import InputError
from ucudnn.kernels import pointwise as P
from ucudnn.kernels.fused import SEED_BLOCKS, Block, ConvLayer, reference


def test_the_seed_resnet_block_is_a_chain_and_the_others_are_not():
    assert P.unsupported(SEED_BLOCKS["c.1"], "float16") is None
    assert "float16" in P.unsupported(SEED_BLOCKS["c.1"], "float32")
    assert "split" in P.unsupported(SEED_BLOCKS["b.1"], "float16")
    assert "layer 1" in P.unsupported(SEED_BLOCKS["a.1"], "float16")          # the 5x5
    assert "layer 0" in P.unsupported(SEED_BLOCKS["a.2"], "float16")          # the depthwise 3x3
    odd = Block("odd", "straight", 24, (ConvLayer(64, 1), ConvLayer(32, 1)))
    assert "multiples of 16" in P.unsupported(odd, "float16")


def test_the_launcher_refuses_what_the_kernel_cannot_run_before_compiling():
    with pytest.raises(InputError) as e:
        P.launcher(SEED_BLOCKS["b.1"], "float16", "NCHW", (1, 64, 56, 56))
    assert e.value.field == "block"
    with pytest.raises(InputError) as e:
        P.launcher(SEED_BLOCKS["c.1"], "float16", "NCHW", (1, 64, 56, 56), pt=24)
    assert e.value.field == "tiling"


def test_the_instantiation_names_every_layer_and_the_shared_memory_holds_the_tiles():
    c1 = SEED_BLOCKS["c.1"]
    assert P.name_expr(c1, "NCHW", 32, 4) == \
        "pointwise_chain<1,64,256,64,false,32,4,true,ACT_NONE,true,ACT_NONE,true,true,ACT_RELU>"
    # x and x2 tiles (32 pixels x 72 halves) and the intermediate (32 x 264 halves)
    assert P.smem_bytes(c1, 32) == 2 * (2 * 32 * 72 + 32 * 264)
    s = Block("s", "straight", 32, (ConvLayer(192, 1, relu6=True, relu=False), ConvLayer(32, 1, relu=False, bias=False)))
    assert P.name_expr(s, "NHWC", 64, 8) == \
        "pointwise_chain<0,32,192,32,true,64,8,true,ACT_RELU6,false,ACT_NONE,false,false,ACT_NONE>"


def _weights(block, rng, layout):
    ws, bs = [], []
    for layer, cin in zip(block.layers, block.layer_inputs()):
        w = rng.standard_normal((layer.out_channels, cin, 1, 1)) / np.sqrt(cin)
        ws.append(w if layout == "NCHW" else w.transpose(0, 2, 3, 1))
        bs.append(rng.standard_normal(layer.out_channels) * 0.1 if layer.bias else None)
    return ws, bs


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(["NCHW", "NHWC"]), st.sampled_from(["merge", "straight"]),
       st.integers(1, 3), st.integers(1, 9), st.integers(1, 9))
def test_the_kernels_arithmetic_is_the_block_within_float16_rounding(seed, layout, mode, n, h, w):
    rng = np.random.default_rng(seed)
    if mode == "merge":
        block = Block("m", "merge", 32, (ConvLayer(48, 1, relu=False), ConvLayer(48, 1, relu=False),
                                         ConvLayer(16, 1)), merge_relu=True)
    else:
        block = Block("s", "straight", 16, (ConvLayer(64, 1, relu6=True, relu=False), ConvLayer(32, 1, relu=False)))
    ws, bs = _weights(block, rng, layout)
    x = rng.standard_normal(block.x_shape(n, h, w, layout)).astype(np.float16)
    x2 = rng.standard_normal(x.shape).astype(np.float16) if mode == "merge" else None
    got = P.emulate(block, x, ws, bs, x2, layout)
    to = (lambda a: a) if layout == "NCHW" else (lambda a: a.transpose(0, 3, 1, 2))
    nchw_w = [w if layout == "NCHW" else w.transpose(0, 3, 1, 2) for w in ws]
    want = reference(block, to(x).astype(np.float64), [np.asarray(w, np.float16).astype(np.float64) for w in nchw_w],
                     [None if b is None else np.asarray(b, np.float16).astype(np.float64) for b in bs],
                     None if x2 is None else to(x2).astype(np.float64))
    assert got.dtype == np.float16 and to(got).shape == want.shape
    np.testing.assert_allclose(to(got).astype(np.float64), want, rtol=2e-2, atol=2e-2)
