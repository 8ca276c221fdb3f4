"""Fused-block kernels (kernels/fused.py, fused.cu) without a GPU: the block description and its refusals, the float64
reference against ucudnn's direct-convolution reference, the kernel's tiling and halo index math emulated tile by
tile and work item by work item against the reference (hypothesis over modes, filters, strides, pads, groups,
planes, tilings, layouts and activations: none, ReLU, ReLU6), MobileNet V2's ReLU6 blocks, tile coverage and halo
windows, launch geometry, the default tiling, the launcher's
argument checks and pointer arithmetic (a fake kernel), the tuner's plumbing with a synthetic clock, and the nvcc
build for sm_80 and sm_90."""
from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
from importlib import resources
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from ucudnn.kernels import _compile, autotune
from ucudnn.kernels import fused as F
from ucudnn.kernels.direct import forward_reference

from ucudnn.errors import InputError
from ucudnn.problem import ConvProblem

NVCC = shutil.which("nvcc")
SETTINGS = settings(max_examples=40, deadline=None)
L = F.ConvLayer


# ---- strategies ---------------------------------------------------------------------------------------------------
def _groups(draw, cin: int, cout: int) -> int:
    return draw(st.sampled_from([g for g in range(1, cin + 1) if cin % g == 0 and cout % g == 0]))


@st.composite
def layers(draw, cin: int, kernel=None, stride=None, pad=None, out=None):
    kind = draw(st.sampled_from(["dense", "depthwise", "grouped"]))
    if out is None:
        out = cin * draw(st.integers(1, 2)) if kind == "depthwise" else draw(st.integers(1, 6))
    groups = cin if kind == "depthwise" and out % cin == 0 else _groups(draw, cin, out) if kind == "grouped" else 1
    r, s = kernel or (draw(st.integers(1, 5)), draw(st.integers(1, 5)))
    stride = stride or (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pad = pad or (draw(st.integers(0, r - 1)), draw(st.integers(0, s - 1)))
    act = draw(st.sampled_from(F.ACTIVATIONS))
    return L(out, (r, s), stride, pad, groups, draw(st.booleans()), act == "relu", act == "relu6")


@st.composite
def blocks(draw):
    mode = draw(st.sampled_from(F.MODES))
    cin = draw(st.integers(1, 6))
    if mode == "straight":
        l1 = draw(layers(cin))
        ls = (l1, draw(layers(l1.out_channels)))
        merge_relu = False
    elif mode == "split":
        l1 = draw(layers(cin))
        l2 = draw(layers(l1.out_channels))
        r3, s3 = (l2.kernel[0] + 2 * draw(st.integers(-1, 1)), l2.kernel[1] + 2 * draw(st.integers(-1, 1)))
        pad3 = (l2.pad[0] + (r3 - l2.kernel[0]) // 2, l2.pad[1] + (s3 - l2.kernel[1]) // 2)
        assume(1 <= r3 <= 7 and 1 <= s3 <= 7 and 0 <= pad3[0] < r3 and 0 <= pad3[1] < s3)
        ls = (l1, l2, draw(layers(l1.out_channels, (r3, s3), l2.stride, pad3)))
        merge_relu = False
    else:
        l1 = draw(layers(cin))
        l2 = draw(layers(cin, l1.kernel, l1.stride, l1.pad, out=l1.out_channels))
        ls = (l1, l2, draw(layers(l1.out_channels)))
        merge_relu = draw(st.booleans())
    return F.Block("random", mode, cin, ls, merge_relu)


@st.composite
def cases(draw, max_hw: int = 12):
    b = draw(blocks())
    h, w = draw(st.integers(1, max_hw)), draw(st.integers(1, max_hw))
    mid, out = b.planes(h, w)
    assume(min(mid) >= 1 and min(out) >= 1)
    outs = [b.layers[s].out_channels for s in b.slots()[2:] if s is not None]
    ks = draw(st.sampled_from([k for k in (1, 2, 3) if all(o % k == 0 for o in outs)]))
    t = F.Tiling(draw(st.sampled_from([1, 2, 3, 4, 5, 8])), draw(st.sampled_from([1, 2, 3, 4, 7, 8])), ks,
                 draw(st.sampled_from([64, 128, 256])))
    assume(F.fits(b, t, 1 << 30))       # the pipelined producer runs one item per thread
    return b, h, w, t, draw(st.sampled_from(F.LAYOUTS)), draw(st.integers(1, 2))


def _operands(b: F.Block, n: int, h: int, w: int, layout: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(b.x_shape(n, h, w, layout))
    x2 = rng.standard_normal(b.x_shape(n, h, w, layout)) if b.mode == "merge" else None
    ws = [rng.standard_normal(s) for s in b.weight_shapes(layout)]
    bs = [rng.standard_normal(l.out_channels) if l.bias else None for l in b.layers]
    return x, ws, bs, x2


# ---- the block description -------------------------------------------------------------------------------------------
def test_seed_blocks_are_the_seeds_table_1():
    B = F.SEED_BLOCKS
    assert list(B) == ["a.1", "a.2", "b.1", "c.1"]
    assert [b.mode for b in B.values()] == ["straight", "straight", "split", "merge"]
    shapes = {k: (b.x_shape(1, *b.hw)[1:], b.y_shape(1, *b.hw)[1:], b.weight_shapes()) for k, b in B.items()}
    assert shapes["a.1"] == ((192, 28, 28), (32, 28, 28), [(16, 192, 1, 1), (32, 16, 5, 5)])
    assert shapes["a.2"] == ((16, 80, 80), (16, 80, 80), [(16, 1, 3, 3), (16, 16, 1, 1)])
    assert shapes["b.1"] == ((64, 56, 56), (128, 56, 56), [(16, 64, 1, 1), (64, 16, 1, 1), (64, 16, 3, 3)])
    assert shapes["c.1"] == ((64, 56, 56), (64, 56, 56), [(256, 64, 1, 1), (256, 64, 1, 1), (64, 256, 1, 1)])
    # the networks' conventions: MobileNet V2's projection and ResNet's pre-add convolutions are linear
    assert [l.relu for l in B["a.2"].layers] == [True, False]
    assert [l.relu for l in B["c.1"].layers] == [False, False, True] and B["c.1"].merge_relu
    assert all(l.relu for l in B["a.1"].layers + B["b.1"].layers)
    assert all(l.bias for b in B.values() for l in b.layers)
    assert F.Block.from_dict(B["c.1"].to_dict()) == B["c.1"]


@pytest.mark.parametrize("make, field", [
    (lambda: F.Block("x", "diagonal", 4, (L(4), L(4))), "mode"),
    (lambda: F.Block("x", "straight", 4, (L(4), L(4), L(4))), "layers"),
    (lambda: F.Block("x", "split", 4, (L(4), L(4))), "layers"),
    (lambda: F.Block("x", "straight", 0, (L(4), L(4))), "in_channels"),
    (lambda: F.Block("x", "straight", 6, (L(4, groups=4), L(4))), "layers[0].groups"),
    (lambda: F.Block("x", "straight", 4, (L(6), L(4, groups=4))), "layers[1].groups"),
    (lambda: F.Block("x", "merge", 4, (L(8), L(16), L(4))), "layers[1].out_channels"),
    (lambda: F.Block("x", "merge", 4, (L(8, 3, pad=1), L(8, 1), L(4))), "layers[1].kernel"),
    (lambda: F.Block("x", "merge", 4, (L(8), L(8, stride=2), L(4))), "layers[1].stride"),
    (lambda: F.Block("x", "split", 4, (L(8), L(4, 1), L(4, 3))), "layers[2].pad"),
    (lambda: F.Block("x", "split", 4, (L(8), L(4, 1), L(4, 1, stride=2))), "layers[2].stride"),
    (lambda: F.Block("x", "straight", 4, (L(4), L(4)), merge_relu=True), "merge_relu"),
    (lambda: F.Block("x", "straight", 4, (L(4), "conv")), "layers[1]"),
    (lambda: F.Block("", "straight", 4, (L(4), L(4))), "name"),
    (lambda: L(0), "out_channels"),
    (lambda: L(4, kernel=0), "kernel"),
    (lambda: L(4, kernel=12), "kernel"),
    (lambda: L(4, kernel=(3, 3, 3)), "kernel"),
    (lambda: L(4, kernel=3, pad=3), "pad"),
    (lambda: L(4, stride=5), "stride"),
    (lambda: L(4, groups=3), "groups"),
    (lambda: L(4, relu="yes"), "relu"),
    (lambda: L(4, bias=1), "bias"),
    (lambda: L(4, relu6=True), "relu6"),                  # relu defaults to true: ReLU6 replaces it
    (lambda: L(4, relu=True, relu6=True), "relu6"),
    (lambda: L(4, relu=False, relu6=1), "relu6"),
    (lambda: L(4, relu=False, relu6=None), "relu6"),
    (lambda: F.Tiling(4, 4, 1, 100), "tiling.nt"),
    (lambda: F.Tiling(0, 4), "tiling.th"),
    (lambda: F.Tiling.from_list([4, 4]), "tiling"),
    (lambda: F.plan(F.SEED_BLOCKS["b.1"], F.Tiling(4, 4, 3), "float32", "NCHW", 1, 56, 56), "tiling.ks"),
    (lambda: F.plan(F.SEED_BLOCKS["a.1"], F.Tiling(4, 4), "bfloat16", "NCHW", 1, 28, 28), "dtype"),
    (lambda: F.plan(F.SEED_BLOCKS["a.1"], F.Tiling(4, 4), "float32", "CHWN", 1, 28, 28), "layout"),
    (lambda: F.plan(F.Block("x", "straight", 2, (L(2, 5), L(2, 5))), F.Tiling(4, 4), "float32", "NCHW", 1, 6, 6), "x"),
])
def test_bad_descriptions_are_refused_naming_the_field(make, field):
    with pytest.raises(InputError) as e:
        make()
    assert e.value.field == field, str(e.value)
    assert str(e.value).startswith(field + ": ")


@pytest.mark.parametrize("doc, field", [
    ({"name": "x", "mode": "straight", "in_channels": 4, "layers": [{"out_channels": 4}, {"out_channels": 4,
                                                                                        "kernel": [3, 0]}]},
     "layers[1].kernel"),
    ({"name": "x", "mode": "straight", "in_channels": 4, "layers": [{"out_channels": 4}, {"out_channel": 4}]},
     "layers[1]"),
    ({"name": "x", "mode": "straight", "in_channels": 4, "layers": [{"out_channels": 4}, 7]}, "layers[1]"),
    ({"name": "x", "mode": "straight", "layers": [{"out_channels": 4}, {"out_channels": 4}]}, "in_channels"),
    ({"name": "x", "mode": "straight", "in_channels": 4, "layers": "conv"}, "layers"),
    ({"name": "x", "mode": "straight", "in_channels": 4, "layers": [], "colour": "red"}, "colour"),
    ({"name": "x", "mode": "straight", "in_channels": 4, "layers": [{"out_channels": 4},
                                                                    {"out_channels": 4, "relu6": True}]},
     "layers[1].relu6"),
    ({"name": "x", "mode": "straight", "in_channels": 4, "layers": [{"out_channels": 4, "relu": False,
                                                                     "relu6": "yes"}, {"out_channels": 4}]},
     "layers[0].relu6"),
])
def test_from_dict_names_the_dotted_path(doc, field):
    with pytest.raises(InputError) as e:
        F.Block.from_dict(doc)
    assert e.value.field == field, str(e.value)


# ---- ReLU6 (MobileNet V2) ------------------------------------------------------------------------------------------
def _mobilenet_v2(c: int = 8, out: int = 6) -> dict[str, F.Block]:
    """MobileNet V2 inverted-residual pieces with ReLU6: depthwise 3x3 (stride 1 and 2) + ReLU6 -> the linear 1x1
    projection (a.2 with ReLU6), and the expand 1x1 + ReLU6 (a pipelined producer) -> depthwise 3x3 + ReLU6."""
    r6 = dict(relu=False, relu6=True)
    return {
        "dw-s1": F.Block("mv2-dw-s1", "straight", c, (L(c, 3, pad=1, groups=c, **r6), L(out, 1, relu=False))),
        "dw-s2": F.Block("mv2-dw-s2", "straight", c, (L(c, 3, stride=2, pad=1, groups=c, **r6), L(out, 1, relu=False))),
        "expand": F.Block("mv2-expand", "straight", out, (L(c, 1, **r6), L(c, 3, pad=1, groups=c, **r6))),
        "expand-s2": F.Block("mv2-expand-s2", "straight", out, (L(c, 1, **r6), L(c, 3, stride=2, pad=1, groups=c,
                                                                                  **r6))),
        # the other modes with ReLU6 producers and consumers (merge: activations before the add, two sums)
        "split": F.Block("r6-split", "split", out, (L(c, 1, **r6), L(4, 1, **r6), L(4, 3, pad=1, **r6))),
        "merge": F.Block("r6-merge", "merge", out, (L(c, 1, **r6), L(c, 1, relu=False), L(4, 3, pad=1, **r6)),
                         merge_relu=True),
        "merge-dw": F.Block("r6-merge-dw", "merge", c, (L(c, 3, pad=1, groups=c, **r6), L(c, 3, pad=1, groups=c, **r6),
                                                        L(out, 1, relu=False))),
    }


def test_relu6_layer_description_json_and_key():
    r6 = L(8, 3, pad=1, groups=8, relu=False, relu6=True)
    assert (r6.relu, r6.relu6, r6.activation) == (False, True, "relu6")
    assert [l.activation for l in (L(4), L(4, relu=False))] == ["relu", "none"]
    assert L(4).relu6 is False and L(4) == L(4, relu=True, relu6=False)
    assert r6.to_dict() == {"out_channels": 8, "kernel": [3, 3], "stride": [1, 1], "pad": [1, 1], "groups": 8,
                            "bias": True, "relu": False, "relu6": True}
    b = _mobilenet_v2()["dw-s2"]
    assert F.Block.from_dict(b.to_dict()) == b
    assert F.Block.from_dict(json.loads(json.dumps(b.to_dict()))) == b
    assert b.key() == "straight/c8/k8f3x3s2,2p1,1g8br6/k6f1x1s1,1p0,0g1b"
    # ReLU6 is part of the key: the same structure with ReLU or no activation tunes and caches apart
    keys = {F.Block("x", "straight", 8, (L(8, 3, pad=1, groups=8, relu=r, relu6=r6_), L(6, 1, relu=False))).key()
            for r, r6_ in ((False, False), (True, False), (False, True))}
    assert len(keys) == 3


def test_keys_and_json_of_blocks_without_relu6_are_unchanged():
    """Tuning caches stay valid: the seed blocks' keys, JSON and kernel names are what they were before ReLU6."""
    assert {k: b.key() for k, b in F.SEED_BLOCKS.items()} == {
        "a.1": "straight/c192/k16f1x1s1,1p0,0g1br/k32f5x5s1,1p2,2g1br",
        "a.2": "straight/c16/k16f3x3s1,1p1,1g16br/k16f1x1s1,1p0,0g1b",
        "b.1": "split/c64/k16f1x1s1,1p0,0g1br/k64f1x1s1,1p0,0g1br/k64f3x3s1,1p1,1g1br",
        "c.1": "merge/c64/k256f1x1s1,1p0,0g1b/k256f1x1s1,1p0,0g1b/k64f1x1s1,1p0,0g1br/mr",
    }
    for b in F.SEED_BLOCKS.values():
        for doc in b.to_dict()["layers"]:
            assert set(doc) == {"out_channels", "kernel", "stride", "pad", "groups", "bias", "relu"}
        assert "relu6" not in json.dumps(b.to_dict())
        for dtype in F.DTYPES:   # every Layer<...> keeps its 11 arguments (RELU6 left to its default)
            layers_ = re.findall(r"Layer<([^<>]*)>", F.plan(b, F.Tiling(4, 8), dtype, "NCHW", 1, *b.hw).name_expr)
            assert layers_ and all(len(a.split(",")) == 11 for a in layers_)
    assert F.tuning_key(F.SEED_BLOCKS["a.2"], "float32", "NCHW", (1, 16, 80, 80)) == \
        "fused/straight/c16/k16f3x3s1,1p1,1g16br/k16f1x1s1,1p0,0g1b/float32/NCHW/1x16x80x80"


def test_relu6_plan_names_the_activation():
    b = _mobilenet_v2(16, 8)["dw-s2"]
    geo = F.plan(b, F.Tiling(4, 8), "float16", "NHWC", 2, 17, 18)
    assert geo.name_expr.startswith("fused_block<half_t,true,Layer<16,16,3,3,2,2,1,1,16,true,false,true>,NoLayer,"
                                    "Layer<8,16,1,1,1,1,0,0,1,true,false>,NoLayer,false,Tile<4,8,1,256,")
    e = _mobilenet_v2(16, 8)["expand"]
    assert F.pipelined(e)
    assert F.plan(e, F.Tiling(2, 4), "float32", "NCHW", 1, 9, 9).name_expr.startswith(
        "fused_block<float,false,Layer<16,8,1,1,1,1,0,0,1,true,false,true>,NoLayer,"
        "Layer<16,16,3,3,1,1,1,1,16,true,false,true>,NoLayer,false,")


def test_activate_is_the_kernels_act():
    v = np.array([-3.0, -0.0, 0.5, 5.999, 6.0, 6.5, 1e9])
    np.testing.assert_array_equal(F.activate(v, "relu6"), [0, 0, 0.5, 5.999, 6, 6, 6])
    np.testing.assert_array_equal(F.activate(v, "relu"), [0, 0, 0.5, 5.999, 6, 6.5, 1e9])
    np.testing.assert_array_equal(F.activate(v, "none"), v)
    with pytest.raises(ValueError):
        F.activate(v, "gelu")


@pytest.mark.parametrize("layout", F.LAYOUTS)
@pytest.mark.parametrize("name", list(_mobilenet_v2()))
def test_relu6_blocks_emulated_equal_the_reference(name, layout):
    """ReLU6 producers (global and pipelined) and consumers, in every mode: emulated tile by tile at several tilings
    equals the float64 reference, and the operands are large enough that the cap at 6 is reached often."""
    b = _mobilenet_v2()[name]
    x, ws, bs, x2 = _operands(b, 2, 11, 9, layout, seed=6)
    x, x2 = 3 * x, (None if x2 is None else 3 * x2)
    ref = F.reference(b, x, ws, bs, x2, layout)
    l1 = b.layers[0]
    m = F.conv_reference(F._nchw(x, layout), F._nchw(ws[0], layout), bs[0], l1)
    assert l1.relu6 and 0.05 < (m == 6).mean() < 0.9 and ((m > 0) & (m < 6)).mean() > 0.05
    assert m.max() == 6 and m.min() == 0
    linear = dataclasses.replace(l1, relu6=False)
    assert np.abs(F.conv_reference(F._nchw(x, layout), F._nchw(ws[0], layout), bs[0], linear)).max() > 6
    for t in (F.Tiling(1, 1, 1, 64), F.Tiling(4, 8, 2, 256), F.Tiling(3, 2, 1, 128),
              F.default_tiling(b, 2, 11, 9)):
        outs = [b.layers[s].out_channels for s in b.slots()[2:] if s is not None]
        if any(o % t.ks for o in outs) or not F.fits(b, t, 1 << 30):
            continue
        np.testing.assert_allclose(F.emulate(b, t, x, ws, bs, x2, layout), ref, atol=1e-9, rtol=1e-9)
    assert F.pipelined(b) == (name in ("expand", "expand-s2", "split", "merge"))


def test_relu6_reference_clamps_each_layer_and_not_the_merge():
    """The straight block is conv -> ReLU6 -> conv (linear); the merge's add is followed by a plain ReLU."""
    blocks = _mobilenet_v2()
    b = blocks["dw-s2"]
    x, ws, bs, _ = _operands(b, 1, 8, 8, "NCHW", seed=2)
    x = 4 * x
    linear0 = dataclasses.replace(b.layers[0], relu6=False)
    mid = np.clip(F.conv_reference(x, ws[0], bs[0], linear0), 0, 6)
    np.testing.assert_allclose(F.reference(b, x, ws, bs), F.conv_reference(mid, ws[1], bs[1], b.layers[1]))
    mb = blocks["merge"]
    x, ws, bs, x2 = _operands(mb, 1, 6, 7, "NCHW", seed=3)
    x, x2 = 4 * x, 4 * x2
    s = np.clip(F.conv_reference(x, ws[0], bs[0], dataclasses.replace(mb.layers[0], relu6=False)), 0, 6) \
        + F.conv_reference(x2, ws[1], bs[1], mb.layers[1])
    assert (s > 6).any(), "the merge's ReLU does not cap"
    np.testing.assert_allclose(F.reference(mb, x, ws, bs, x2),
                               F.conv_reference(np.maximum(s, 0), ws[2], bs[2], mb.layers[2]))


# ---- references ------------------------------------------------------------------------------------------------------
@SETTINGS
@given(layers(4), st.integers(1, 9), st.integers(1, 9),
       st.sampled_from(F.LAYOUTS))
def test_one_layer_reference_equals_the_direct_reference(layer, h, w, layout):
    assume(min(layer.out_plane(h, w)) >= 1)
    rng = np.random.default_rng(1)
    p = ConvProblem(2, 4, h, w, layer.out_channels, *layer.kernel, pad=layer.pad, stride=layer.stride,
                    groups=layer.groups, layout=layout)
    x, wt = rng.standard_normal(p.x_shape()), rng.standard_normal(p.w_shape())
    b = rng.standard_normal(layer.out_channels)
    nchw = (lambda a: a.transpose(0, 3, 1, 2)) if layout == "NHWC" else (lambda a: a)
    got = F.conv_reference(nchw(x), nchw(wt), b if layer.bias else None, layer)
    want = nchw(forward_reference(x, wt, p)) + (b[None, :, None, None] if layer.bias else 0)
    want = np.minimum(np.maximum(want, 0), 6) if layer.relu6 else np.maximum(want, 0) if layer.relu else want
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_block_reference_composes_the_layers():
    b = F.SEED_BLOCKS["c.1"]
    x, ws, bs, x2 = _operands(b, 2, 5, 6, "NCHW")
    m = F.conv_reference(x, ws[0], bs[0], b.layers[0]) + F.conv_reference(x2, ws[1], bs[1], b.layers[1])
    want = F.conv_reference(np.maximum(m, 0), ws[2], bs[2], b.layers[2])
    np.testing.assert_allclose(F.reference(b, x, ws, bs, x2), want)
    one = F.reference(b, x, ws, bs)      # the seed's c.1: one input feeds both merged layers
    np.testing.assert_allclose(one, F.reference(b, x, ws, bs, x))
    s = F.SEED_BLOCKS["b.1"]
    x, ws, bs, _ = _operands(s, 1, 7, 5, "NHWC")
    y = F.reference(s, x, ws, bs, layout="NHWC")
    assert y.shape == (1, 7, 5, 128)
    mid = F.conv_reference(x.transpose(0, 3, 1, 2), ws[0].transpose(0, 3, 1, 2), bs[0], s.layers[0])
    np.testing.assert_allclose(y[..., 64:].transpose(0, 3, 1, 2),
                               F.conv_reference(mid, ws[2].transpose(0, 3, 1, 2), bs[2], s.layers[2]))


# ---- the kernel's index math, tile by tile ---------------------------------------------------------------------------
@SETTINGS
@given(cases())
def test_emulated_kernel_equals_the_reference(case):
    b, h, w, t, layout, n = case
    x, ws, bs, x2 = _operands(b, n, h, w, layout, seed=3)
    np.testing.assert_allclose(F.emulate(b, t, x, ws, bs, x2, layout), F.reference(b, x, ws, bs, x2, layout),
                               atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("layout", F.LAYOUTS)
@pytest.mark.parametrize("name", list(F.SEED_BLOCKS))
def test_seed_blocks_emulated_on_odd_planes(name, layout):
    """The seed blocks' real channel counts on an odd plane (edge tiles on both sides, partial tiles), with the
    default tiling of the seed's batch-1 shape and one with channel slices."""
    b = F.SEED_BLOCKS[name]
    x, ws, bs, x2 = _operands(b, 2, 9, 11, layout, seed=4)
    ref = F.reference(b, x, ws, bs, x2, layout)
    for t in (F.default_tiling(b, 1, *b.hw), F.Tiling(4, 8, 2 if name != "a.2" else 4, 256)):
        np.testing.assert_allclose(F.emulate(b, t, x, ws, bs, x2, layout), ref, atol=1e-9, rtol=1e-9)


@settings(max_examples=100, deadline=None)
@given(cases(max_hw=60))
def test_tiles_cover_the_output_plane_exactly_once_and_halos_hold_every_window(case):
    b, h, w, t, _, _ = case
    _, (p, q) = b.planes(h, w)
    (mp, mq), _ = b.planes(h, w)
    tp, tq = F.tiles(b, t, h, w)
    seen = np.zeros((p, q), dtype=int)
    consumers = [b.layers[s] for s in b.slots()[2:] if s is not None]
    for bx in range(tp * tq):
        p0, q0 = F.tile_origin(bx, b, t, h, w)
        assert p0 < p and q0 < q, "no thread block is launched for an empty tile"
        seen[p0:p0 + t.th, q0:q0 + t.tw] += 1
        m0, n0, mh, mw = F.halo_window(b, t, p0, q0)
        rows = [o * c.stride[0] - c.pad[0] + i for c in consumers for o in range(p0, p0 + t.th)
                for i in range(c.kernel[0])]
        cols = [o * c.stride[1] - c.pad[1] + j for c in consumers for o in range(q0, q0 + t.tw)
                for j in range(c.kernel[1])]
        assert (m0, n0) == (min(rows), min(cols)) and (m0 + mh - 1, n0 + mw - 1) == (max(rows), max(cols)), \
            "the halo region is exactly the union of the consumers' windows over the tile"
        for k, s in enumerate(b.slots()[:2]):
            if s is None:
                continue
            l1 = b.layers[s]
            i0, j0, ih, iw = F.input_window(b, t, p0, q0, k)
            assert i0 == m0 * l1.stride[0] - l1.pad[0] and j0 == n0 * l1.stride[1] - l1.pad[1]
            assert i0 + ih - 1 == (m0 + mh - 1) * l1.stride[0] - l1.pad[0] + l1.kernel[0] - 1
            assert j0 + iw - 1 == (n0 + mw - 1) * l1.stride[1] - l1.pad[1] + l1.kernel[1] - 1
    assert (seen[:p, :q] == 1).all()
    assert mp >= 1 and mq >= 1


def test_edge_tiles_of_a1_stage_zero_padding_outside_the_plane():
    """a.1 at 28x28 with 8x8 tiles: 4x4 tiles, the last at (24, 24) covers 4x4 real outputs; its halo (5x5 filter,
    pad 2) reaches rows and columns -2..-1 (first tile) and 28..29 (last tile): intermediate positions outside the
    28x28 plane, produced as zeros (the 5x5 layer's padding), never read from x."""
    b = F.SEED_BLOCKS["a.1"]
    t = F.Tiling(8, 8)
    assert F.tiles(b, t, 28, 28) == (4, 4)
    assert F.tile_origin(15, b, t, 28, 28) == (24, 24)
    assert F.halo_window(b, t, 0, 0) == (-2, -2, 12, 12)
    assert F.halo_window(b, t, 24, 24) == (22, 22, 12, 12)
    assert F.input_window(b, t, 24, 24) == (22, 22, 12, 12)          # 1x1 producer: the same window of x
    g = F.geometry(b, t)
    assert (g.mh, g.mw, g.off1, g.ws1, g.ws1_floats) == (12, 12, (0, 0), True, 16 * 25 * 32)
    s = F.SEED_BLOCKS["b.1"]
    gs = F.geometry(s, F.Tiling(7, 8, 2))
    # the fire's expand 1x1 reads the halo region one row and column in, the 3x3 from its corner
    assert (gs.mh, gs.mw, gs.off1, gs.off2, gs.k1s, gs.k2s, gs.ws1, gs.ws2) == (9, 10, (1, 1), (0, 0), 32, 32,
                                                                                 False, True)
    d = F.SEED_BLOCKS["a.2"]
    assert F.input_window(d, F.Tiling(8, 16), 72, 64) == (71, 63, 10, 18)   # depthwise 3x3 producer reads a halo
    x = np.ones(b.x_shape(1, 28, 28))
    ws = [np.ones(s_) for s_ in b.weight_shapes()]
    bs = [np.zeros(l.out_channels) for l in b.layers]
    y = F.emulate(b, t, x, ws, bs)
    # a corner output sees 3x3 of the 5x5 window inside the plane: 9 * 16 intermediate channels of 192 each
    assert y[0, 0, 0, 0] == 9 * 16 * 192 and y[0, 0, 27, 27] == 9 * 16 * 192 and y[0, 0, 14, 14] == 25 * 16 * 192


def test_staged_filters_are_each_written_once_and_transposed():
    for name, slot in (("a.1", 1), ("b.1", 2)):
        b = F.SEED_BLOCKS[name]
        layer, cin = b.layers[slot], b.layer_inputs()[slot]
        for layout in F.LAYOUTS:
            for ksl in (layer.out_channels, layer.out_channels // 2):
                dst, src = F.stage_order(layer, cin, ksl, layout)
                cgrs = cin // layer.groups * layer.kernel[0] * layer.kernel[1]
                assert sorted(dst) == list(range(cgrs * ksl)) and sorted(src) == list(range(cgrs * ksl))
                w = np.arange(layer.out_channels * cgrs, dtype=float).reshape(b.weight_shapes(layout)[slot])
                buf = np.empty(cgrs * ksl)
                buf[dst] = w.reshape(-1)[src]
                wn = w if layout == "NCHW" else w.transpose(0, 3, 1, 2)
                want = wn[:ksl].reshape(ksl, cgrs).T.reshape(-1)              # [c][tap][k]
                np.testing.assert_array_equal(buf, want)


@settings(max_examples=60, deadline=None)
@given(blocks(), st.sampled_from([1, 2, 4, 7, 8, 16]), st.sampled_from([1, 4, 8, 28]), st.sampled_from([64, 256, 512]))
def test_stage_work_register_tiles(b, th, tw, nt):
    t = F.Tiling(th, tw, 1, nt)
    assume(F.fits(b, t, 1 << 30))
    g = F.geometry(b, t)
    if g.pcc:   # pipelined producer: one item per thread, chunks of 4..32 channels within the prefetch budget
        px, kt = g.producer
        assert -(-g.mplane // px) * (g.km // kt) <= nt and g.pcc in (4, 8, 16, 32)
        per_w = 1.25 if all(c % 4 == 0 for c in b.layer_inputs()[:g.nprod]) else 2
        assert 2 * g.nprod * g.pcc * g.mplane + per_w * g.nprod * g.pcc * g.km <= F.PIPE_REGS * nt or g.pcc == 4
    cap = 16 if nt >= 512 else 32
    for (px, kt), nk in ((g.producer, g.km), (g.consumer1, g.k1s)):
        assert nk % kt == 0 and 1 <= px <= 8 and px * kt <= cap
    for slot, (px, kt), on in ((b.slots()[2], g.consumer1, g.ws1), (b.slots()[3], g.consumer2, g.ws2)):
        if slot is not None and on:
            assert (b.layers[slot].out_channels // b.layers[slot].groups) % kt == 0


# ---- launch geometry and tilings -------------------------------------------------------------------------------------
def test_plan_names_the_instantiation_and_sizes_the_grid():
    b = F.SEED_BLOCKS["a.1"]
    t = F.Tiling(4, 8, 2, 128)
    g = F.geometry(b, t)
    geo = F.plan(b, t, "float16", "NCHW", 65, 28, 28)
    (px, kt), (cx, ckt) = g.producer, g.consumer1
    assert geo.name_expr == ("fused_block<half_t,false,Layer<16,192,1,1,1,1,0,0,1,true,true>,NoLayer,"
                             "Layer<32,16,5,5,1,1,2,2,1,true,true>,NoLayer,false,"
                             f"Tile<4,8,2,128,{px},{kt},{cx},{ckt},1,1,16>>")
    assert geo.grid == (7 * 4, 2, 65) and geo.block == 128
    # intermediate 16 x 8 x 12, the 5x5 slice's filters 16 x 25 x 16, two pipeline buffers of 16 channels of x
    # over the halo (16 x 96) and of filters (16 x (16 + 4))
    assert (g.pcc, g.kmp, g.xbuf, g.wbuf) == (16, 20, 16 * 96, 16 * 20)
    assert geo.smem_bytes == 4 * (16 * 8 * 12 + 16 * 25 * 16 + 2 * (16 * 96 + 16 * 20))
    assert F.geometry(F.SEED_BLOCKS["a.2"], t).pcc == 0       # depthwise producer: not pipelined
    assert geo.ints == (28, 28, 28, 28, 28, 28, 28, 28)
    assert (geo.x_sample, geo.x2_sample, geo.y_sample) == (192 * 784, 0, 32 * 784)
    m = F.plan(F.SEED_BLOCKS["c.1"], F.Tiling(1, 28), "float32", "NHWC", 1, 56, 56)
    assert m.name_expr.startswith("fused_block<float,true,Layer<256,64,1,1,1,1,0,0,1,true,false>,"
                                  "Layer<256,64,1,1,1,1,0,0,1,true,false>,Layer<64,256,1,1,1,1,0,0,1,true,true>,"
                                  "NoLayer,true,Tile<1,28,1,256,")
    assert m.grid == (56 * 2, 1, 1) and m.x2_sample == 64 * 56 * 56
    s = F.plan(F.Block("s", "straight", 3, (L(4, 3, stride=2), L(5, (3, 1), stride=(1, 2), pad=(1, 0)))),
               F.Tiling(2, 2), "float32", "NCHW", 1, 11, 9)
    assert s.ints == (11, 9, 11, 9, 5, 4, 5, 2)


@pytest.mark.parametrize("n", [1, 8, 64])
@pytest.mark.parametrize("name", list(F.SEED_BLOCKS))
def test_default_tiling_of_the_seed_blocks(name, n):
    b = F.SEED_BLOCKS[name]
    t = F.default_tiling(b, n, *b.hw, smem_limit=227 << 10)
    assert t.coordinates() is not None, "on the tuner's grid"
    assert F.fits(b, t, 227 << 10)
    tp, tq = F.tiles(b, t, *b.hw)
    if n == 1:   # at batch 1 the model fills the H100's SMs with thread blocks
        assert tp * tq * t.ks >= 0.7 * F.DEFAULT_SMS
    for other in (F.Tiling(8, 8), F.Tiling(4, 4), F.Tiling(2, 8), F.Tiling(1, 28)):
        if F.fits(b, other, 227 << 10):
            assert F.modelled_time(b, t, n, *b.hw) <= F.modelled_time(b, other, n, *b.hw)


@settings(max_examples=60, deadline=None)
@given(cases(max_hw=40), st.integers(1, 64))
def test_default_tiling_always_fits(case, n):
    b, h, w, _, _, _ = case
    t = F.default_tiling(b, n, h, w)
    assert F.fits(b, t) and F.plan(b, t, "float32", "NCHW", n, h, w).smem_bytes <= F.DEFAULT_SMEM


# ---- the launcher's checks and arguments, on a fake kernel -----------------------------------------------------------
class _FakeArray:
    def __init__(self, shape, dtype="float32", ptr=1 << 20, contiguous=True):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.ndim = len(self.shape)
        self.flags = SimpleNamespace(c_contiguous=contiguous)
        self.data = SimpleNamespace(ptr=ptr)


def _fake(monkeypatch):
    calls = []

    class Kernel:
        max_dynamic_shared_size_bytes = 0

        def __call__(self, grid, block, args, shared_mem=0):
            calls.append((grid, block, args, shared_mem))

    kernel = Kernel()
    monkeypatch.setattr(_compile, "get_kernel", lambda src, expr: kernel)
    monkeypatch.setattr(F, "smem_limit", lambda: 227 << 10)
    return calls, kernel


def test_launcher_passes_slots_and_splits_huge_batches(monkeypatch):
    calls, kernel = _fake(monkeypatch)
    monkeypatch.setattr(F, "_MAX_Z", 3)
    b = F.SEED_BLOCKS["c.1"]
    t = F.Tiling(2, 8)
    n = 7
    x, x2 = _FakeArray(b.x_shape(n, 6, 8), "float16", 1 << 20), _FakeArray(b.x_shape(n, 6, 8), "float16", 1 << 24)
    ws = [_FakeArray(s, "float16", (1 + i) << 28) for i, s in enumerate(b.weight_shapes())]
    bs = [_FakeArray((l.out_channels,), "float16", (5 + i) << 28) for i, l in enumerate(b.layers)]
    out = _FakeArray(b.y_shape(n, 6, 8), "float16", 1 << 32)
    F.launcher(b, t, "float16", "NCHW", x.shape)(x, ws, bs, out, x2)
    geo = F.plan(b, t, "float16", "NCHW", n, 6, 8)
    assert [c[0] for c in calls] == [(geo.grid[0], 1, 3), (geo.grid[0], 1, 3), (geo.grid[0], 1, 1)]
    args = calls[1][2]
    xs, ys = 2 * 64 * 48, 2 * 64 * 48
    assert args[:2] == ((1 << 20) + 3 * xs, (1 << 24) + 3 * xs)
    # merge: P1 = layer 0, P2 = layer 1, C1 = layer 2, C2 empty
    assert args[2:10] == (1 << 28, 5 << 28, 2 << 28, 6 << 28, 3 << 28, 7 << 28, 0, 0)
    assert args[10] == (1 << 32) + 3 * ys and tuple(int(v) for v in args[11:]) == geo.ints
    assert calls[0][3] == geo.smem_bytes
    assert kernel.max_dynamic_shared_size_bytes == (geo.smem_bytes if geo.smem_bytes > 48 << 10 else 0)
    calls.clear()
    F.launcher(b, t, "float16", "NCHW", x.shape)(x, ws, bs, out)          # x2 defaults to x
    assert calls[0][2][1] == calls[0][2][0]


@pytest.mark.parametrize("mutate, field", [
    (lambda a: a.update(x=_FakeArray((1, 192, 28, 27))), "x"),
    (lambda a: a.update(x=_FakeArray((1, 192, 28, 28), "float16")), "x"),
    (lambda a: a.update(x=_FakeArray((1, 192, 28, 28), contiguous=False)), "x"),
    (lambda a: a["ws"].__setitem__(0, _FakeArray((16, 192, 1, 1), ptr=(1 << 20) + 4)), "weights[0]"),
    (lambda a: a["ws"].__setitem__(1, _FakeArray((32, 16, 3, 3))), "weights[1]"),
    (lambda a: a["bs"].__setitem__(1, None), "biases[1]"),
    (lambda a: a.update(out=_FakeArray((1, 32, 28, 28), "float64")), "out"),
    (lambda a: a.update(ws=a["ws"][:1]), "weights"),
])
def test_launcher_refuses_bad_operands_naming_them(monkeypatch, mutate, field):
    _fake(monkeypatch)
    b = F.SEED_BLOCKS["a.1"]
    args = {"x": _FakeArray(b.x_shape(1, 28, 28)), "ws": [_FakeArray(s) for s in b.weight_shapes()],
            "bs": [_FakeArray((l.out_channels,)) for l in b.layers], "out": _FakeArray(b.y_shape(1, 28, 28))}
    run = F.launcher(b, F.Tiling(4, 4), "float32", "NCHW", args["x"].shape)
    mutate(args)
    with pytest.raises(InputError) as e:
        run(args["x"], args["ws"], args["bs"], args["out"])
    assert e.value.field == field


def test_launcher_refuses_a_tiling_over_the_devices_shared_memory(monkeypatch):
    _, kernel = _fake(monkeypatch)
    b = F.SEED_BLOCKS["c.1"]
    with pytest.raises(InputError) as e:
        F.launcher(b, F.Tiling(16, 16), "float32", "NCHW", b.x_shape(1, 56, 56))
    assert e.value.field == "tiling"
    F.launcher(b, F.Tiling(2, 14), "float32", "NCHW", b.x_shape(1, 56, 56))    # over 48 KiB: opts in
    assert kernel.max_dynamic_shared_size_bytes == F.plan(b, F.Tiling(2, 14), "float32", "NCHW", 1, 56,
                                                          56).smem_bytes > 48 << 10
    with pytest.raises(InputError) as e:      # 56 x 256 intermediate outputs: more than one item per thread
        F.launcher(b, F.Tiling(4, 14), "float32", "NCHW", b.x_shape(1, 56, 56))
    assert e.value.field == "tiling"


# ---- tuning, with a synthetic clock ----------------------------------------------------------------------------------
def test_tuner_climbs_records_and_reuses_its_choice(monkeypatch, tmp_path):
    monkeypatch.setenv("UCUDNN_DATABASE", str(tmp_path / "db.sqlite"))
    autotune.clear_memory()
    monkeypatch.setattr(_compile, "device_key", lambda: "fake-gpu sm_90")
    monkeypatch.setattr(F, "smem_limit", lambda: 227 << 10)
    monkeypatch.setattr(F, "sm_count", lambda: 132)
    launched: list[F.Tiling] = []
    monkeypatch.setattr(F, "launcher", lambda block, t, *a: (lambda *args: launched.append(t)))
    b = F.SEED_BLOCKS["b.1"]
    start = F.default_tiling(b, 1, 56, 56, 227 << 10, 132)
    best = F.Tiling.at(tuple(min(c + 1, 3) if i == 2 else c for i, c in enumerate(start.coordinates())))

    def timer(fn):
        fn()
        return 1.0 + sum(abs(a - c) for a, c in zip(launched[-1].coordinates(), best.coordinates()))

    shape = b.x_shape(1, 56, 56)
    t, how = F.tuned_tiling(b, "float32", "NCHW", shape, ("x", [], [], "out", None), timer=timer)
    assert (t, how) == (best, "climb")
    n = len(launched)
    assert n <= F.TUNE_MAX_TRIALS + F.TUNE_FINALISTS * F.TUNE_ROUNDS
    autotune.clear_memory()                                    # from the JSON file now
    assert F.tuned_tiling(b, "float32", "NCHW", shape, None) == (best, "cache")
    assert len(launched) == n
    assert F.tuned_tiling(b, "float16", "NCHW", shape, None) == (start, "default")   # another key
    autotune.clear_memory()


# ---- the CUDA source -------------------------------------------------------------------------------------------------
def test_run_time_source_is_self_contained():
    text = _compile.source(F.SOURCE)
    assert '#include "' not in text and "#include <" not in text
    assert text.count("struct __align__(2) half_t") == 1
    assert F.SOURCE in _compile.source_names()


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_source_compiles_with_nvcc_without_warnings_or_spills(arch, tmp_path):
    """The seed blocks' instantiations (float and half, NCHW and NHWC, each mode) and two MobileNet V2 blocks with
    ReLU6 build for the architecture with no warning, and every one keeps its register tiles in registers: no stack
    frame, no spills."""
    src = resources.files("ucudnn.kernels").joinpath(F.SOURCE)
    with resources.as_file(src) as path:
        proc = subprocess.run([NVCC, "-std=c++17", f"-arch={arch}", "--cubin", "-DUCUDNN_NVCC_CHECK", "-Xptxas", "-v",
                               "-o", str(tmp_path / "k.cubin"), str(path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr.lower(), proc.stderr
    kernels = re.findall(r"Function properties for (\w+)\s*\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, "
                         r"(\d+) bytes spill loads", proc.stderr)
    assert len([k for k in kernels if "fused_block" in k[0]]) == 10
    # ReLU6 instantiations: Layer<..., RELU6 = true> mangles as a third bool template argument of one
    assert sum(bool(re.search(r"ELb[01]ELb0ELb1EE", k[0])) for k in kernels) == 2
    for fn, stack, stores, loads in kernels:
        assert (stack, stores, loads) == ("0", "0", "0"), f"{fn} uses local memory on {arch}"
