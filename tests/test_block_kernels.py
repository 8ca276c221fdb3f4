"""kernels/blocks.py without a GPU: which fused-block kernels run a block (the FMA kernel always; in FP16 the
tensor-core kernels where their layer shapes allow), and the launcher's refusals before anything compiles."""
from __future__ import annotations

import numpy as np
import pytest

from ucudnn.errors import InputError
from ucudnn.kernels import blocks as K
from ucudnn.kernels import pointwise as P
from ucudnn.kernels import spatial as S
from ucudnn.kernels.fused import DEFAULT_SMEM, SEED_BLOCKS, Block, ConvLayer


def test_the_fma_kernel_runs_every_block_and_fp16_adds_the_tensor_core_kernels_that_fit():
    assert {name: K.candidates(b, "float32", DEFAULT_SMEM) for name, b in SEED_BLOCKS.items()} == \
        {"a.1": ["fma"], "a.2": ["fma"], "b.1": ["fma"], "c.1": ["fma"]}
    assert {name: K.candidates(b, "float16", DEFAULT_SMEM) for name, b in SEED_BLOCKS.items()} == \
        {"a.1": ["fma", "spatial"], "a.2": ["fma"], "b.1": ["fma", "spatial"], "c.1": ["fma", "pointwise"]}
    # MobileNet V2's project -> next expand (960 -> 160 -> 960): the spatial kernel stages the producer's 160 x 960
    # filters whole, more shared memory than any device has; the pointwise kernel reads them from global memory
    wide = Block("project-expand", "straight", 960, (ConvLayer(160, 1, relu=False), ConvLayer(960, 1, relu6=True,
                                                                                                 relu=False)))
    assert K.candidates(wide, "float16", 227 << 10) == ["fma", "pointwise"]
    assert S.fitting(wide, 227 << 10) == []
    chain = Block("1x1-1x1", "straight", 32, (ConvLayer(64, 1), ConvLayer(32, 1)))
    assert K.candidates(chain, "float16", DEFAULT_SMEM) == ["fma", "pointwise", "spatial"]


def test_the_launcher_names_a_bad_kernel_or_tiling_before_compiling():
    with pytest.raises(InputError) as e:
        K.launcher("wmma", SEED_BLOCKS["a.1"], [4, 8, 8, 2], "float16", "NCHW", (1, 192, 28, 28))
    assert e.value.field == "kernel"
    with pytest.raises(InputError) as e:
        K.launcher("spatial", SEED_BLOCKS["a.1"], [4, 8], "float16", "NCHW", (1, 192, 28, 28))
    assert e.value.field == "tiling"
    with pytest.raises(InputError) as e:
        K.launcher("pointwise", SEED_BLOCKS["a.1"], [32, 4], "float16", "NCHW", (1, 192, 28, 28))
    assert e.value.field == "block"


def test_untuned_tensor_core_kernels_run_their_default_tiling():
    ops = (None, [], [], None, None)
    assert K.tuned("spatial", SEED_BLOCKS["a.1"], "float16", "NCHW", (1, 192, 28, 28), ops, False,
                   smem=DEFAULT_SMEM) == list(S.TILINGS[0])
    assert K.tuned("pointwise", SEED_BLOCKS["c.1"], "float16", "NCHW", (1, 64, 56, 56), ops, True, None,
                   smem=DEFAULT_SMEM) == list(P.TILINGS[0])
    # under a smaller limit the first tiling that fits it, not the default
    a1 = SEED_BLOCKS["a.1"]
    limit = S.smem_bytes(a1, 4, 4, 0)
    assert S.smem_bytes(a1, *S.TILINGS[0][:2], S.TILINGS[0][3]) > limit
    th, tw, nw, rtb = K.tuned("spatial", a1, "float16", "NCHW", (1, 192, 28, 28), ops, False, smem=limit)
    assert S.smem_bytes(a1, th, tw, rtb) <= limit and (th, tw, nw, rtb) == S.fitting(a1, limit)[0]
    with pytest.raises(InputError) as e:
        K.tuned("spatial", SEED_BLOCKS["a.1"], "float16", "NCHW", (1, 192, 28, 28), ops, False, smem=1024)
    assert e.value.field == "tiling"


# ---- what each launcher passes its kernel (no GPU: the compiled kernel replaced by a recorder) -----------------------
class _Array:
    """Just what the launchers read of a CuPy array: shape, dtype, contiguity and the device pointer."""

    def __init__(self, shape, ptr, dtype="float16"):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.flags = type("Flags", (), {"c_contiguous": True})()
        self.data = type("Data", (), {"ptr": ptr})()


class _Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, grid, block, args, shared_mem=0):
        self.calls.append((grid, block, [int(a) for a in args], shared_mem))


@pytest.fixture
def recorder(monkeypatch):
    from ucudnn.kernels import _compile

    rec = _Recorder()
    monkeypatch.setattr(_compile, "get_kernel", lambda source, name: rec)
    monkeypatch.setattr(P, "smem_limit", lambda: 227 << 10)
    monkeypatch.setattr(S, "smem_limit", lambda: 227 << 10)
    return rec


def _operands(block, layout, n, h, w):
    x = _Array(block.x_shape(n, h, w, layout), 0x10000)
    ws = [_Array(s, 0x20000 * (i + 1)) for i, s in enumerate(block.weight_shapes(layout))]
    bs = [_Array((l.out_channels,), 0x1000000 + 0x100 * i) if l.bias else None for i, l in enumerate(block.layers)]
    out = _Array(block.y_shape(n, h, w, layout), 0x4000000)
    return x, ws, bs, out


def test_the_spatial_launcher_passes_x_each_layers_weights_and_bias_then_y_and_the_plane(recorder):
    b1 = SEED_BLOCKS["b.1"]
    x, ws, bs, out = _operands(b1, "NCHW", 2, 56, 56)
    K.launcher("spatial", b1, [4, 8, 8, 2], "float16", "NCHW", x.shape)(x, ws, bs, out)
    (grid, block, args, smem), = recorder.calls
    assert grid == (14 * 7, 4, 2) and block == (256,) and smem == S.smem_bytes(b1, 4, 8, 2)
    assert args == [x.data.ptr, ws[0].data.ptr, bs[0].data.ptr, ws[1].data.ptr, bs[1].data.ptr, ws[2].data.ptr,
                    bs[2].data.ptr, out.data.ptr, 56, 56, 7]
    a1 = Block("a.1-no-bias", "straight", 192, (ConvLayer(16, 1, bias=False), ConvLayer(32, 5, pad=2)))
    x, ws, bs, out = _operands(a1, "NHWC", 1, 28, 28)
    K.launcher("spatial", a1, [4, 4, 4, 0], "float16", "NHWC", x.shape)(x, ws, bs, out)
    assert recorder.calls[-1][2] == [x.data.ptr, ws[0].data.ptr, 0, ws[1].data.ptr, bs[1].data.ptr, 0, 0,
                                     out.data.ptr, 28, 28, 7]


def test_the_pointwise_launcher_fills_its_three_slots(recorder):
    c1 = SEED_BLOCKS["c.1"]
    x, ws, bs, out = _operands(c1, "NCHW", 1, 56, 56)
    K.launcher("pointwise", c1, [32, 4], "float16", "NCHW", x.shape)(x, ws, bs, out)   # x2 defaults to x
    (grid, block, args, _), = recorder.calls
    assert grid == (98, 1, 1) and block == (128,)
    assert args == [x.data.ptr, x.data.ptr, *[p for i in range(3) for p in (ws[i].data.ptr, bs[i].data.ptr)],
                    out.data.ptr, 56 * 56]
    chain = Block("chain", "straight", 32, (ConvLayer(64, 1), ConvLayer(32, 1, bias=False)))
    x, ws, bs, out = _operands(chain, "NHWC", 1, 7, 9)
    K.launcher("pointwise", chain, [16, 4], "float16", "NHWC", x.shape)(x, ws, bs, out)
    assert recorder.calls[-1][2] == [x.data.ptr, x.data.ptr, ws[0].data.ptr, bs[0].data.ptr, 0, 0, ws[1].data.ptr,
                                     0, out.data.ptr, 63]


def test_the_launchers_name_a_missing_or_extra_bias_and_a_misaligned_filter(recorder):
    a1 = SEED_BLOCKS["a.1"]
    x, ws, bs, out = _operands(a1, "NCHW", 1, 28, 28)
    launch = K.launcher("spatial", a1, [4, 8, 8, 2], "float16", "NCHW", x.shape)
    with pytest.raises(InputError) as e:
        launch(x, ws, [bs[0], None], out)
    assert e.value.field == "biases[1]"
    with pytest.raises(InputError) as e:
        launch(x, [ws[0], _Array(ws[1].shape, 0x20008)], bs, out)
    assert e.value.field == "weights[1]" and "16-byte" in str(e.value)
    with pytest.raises(InputError) as e:
        launch(x, ws[:1], bs[:1], out)
    assert e.value.field == "weights"
    assert not recorder.calls


def test_tuning_a_tensor_core_kernel_times_each_fitting_tiling_once_and_keeps_the_fastest(recorder):
    a1 = SEED_BLOCKS["a.1"]
    x, ws, bs, out = _operands(a1, "NCHW", 1, 28, 28)
    limit = S.smem_bytes(a1, 4, 4, 0)                 # leaves out the default (4, 8, 8, 2)
    fit = S.fitting(a1, limit)
    times = iter([3.0, 1.0, 2.0, 1.0, 5.0, 4.0, 6.0][:len(fit)])

    def timer(fn):
        fn()
        return next(times)

    got = K.tuned("spatial", a1, "float16", "NCHW", x.shape, (x, ws, bs, out, None), True, timer, smem=limit)
    assert got == list(fit[1])                        # the first of the two fastest
    assert len(recorder.calls) == len(fit) >= 2       # each timed once, on the operands
    with pytest.raises(InputError) as e:
        K.tuned("spatial", a1, "float16", "NCHW", x.shape, (x, ws, bs, out, None), True, timer, smem=1024)
    assert e.value.field == "tiling"
