"""Fused-block kernels on the GPU (skipped without one): each seed block in FP32 and FP16 (FP16 storage, FP32
accumulation) at batches 1, 3 and 8 against per-layer cuDNN (torch.nn.functional.conv2d with cuDNN, TF32 off) and
the float64 reference; NHWC; seeded random blocks (odd planes, channel counts no tile divides, strides, groups,
rectangular filters) at several tilings; batches split across launches; CUDA-graph capture and replay equal to
the eager launch; the tuner on the device; MobileNet V2 blocks with ReLU6 (depthwise 3x3 stride 1 and 2 + ReLU6 ->
linear 1x1, expand 1x1 + ReLU6 -> depthwise 3x3 + ReLU6) in FP32 and FP16, NCHW and NHWC, against the float64
reference and per-layer cuDNN.

Outputs are poisoned with NaN before each launch: every element must be written.  Inputs are random normal and
filters He-scaled, so activations stay of order one through the block (no test on zeros)."""
from __future__ import annotations

import numpy as np
import pytest

from ucudnn.kernels import fused as F

pytestmark = pytest.mark.gpu

#: relative error (2-norm) against the float64 reference and against per-layer cuDNN
TOL_REF = {"float32": 1e-5, "float16": 2e-3}
TOL_CUDNN = {"float32": 1e-4, "float16": 6e-3}


def rel_err(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def operands(block: F.Block, n: int, h: int, w: int, dtype: str, layout: str = "NCHW", seed: int = 0,
             scale: float = 1.0):
    """Random operands; ``scale`` multiplies x (and x2): ReLU6 blocks take 4 so that the cap at 6 is reached."""
    import cupy as cp

    rng = np.random.default_rng(seed)
    x = cp.asarray((scale * rng.standard_normal(block.x_shape(n, h, w, layout))).astype(dtype))
    x2 = cp.asarray((scale * rng.standard_normal(block.x_shape(n, h, w, layout))).astype(dtype)) \
        if block.mode == "merge" else None
    ws, bs = [], []
    for layer, cin, shape in zip(block.layers, block.layer_inputs(), block.weight_shapes(layout)):
        fan_in = cin // layer.groups * layer.kernel[0] * layer.kernel[1]
        ws.append(cp.asarray((rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(dtype)))
        bs.append(cp.asarray((0.1 * rng.standard_normal(layer.out_channels)).astype(dtype)) if layer.bias else None)
    return x, ws, bs, x2


def run_fused(block, x, ws, bs, x2, layout="NCHW", tiling=None):
    import cupy as cp

    n, h, w = (x.shape[0], x.shape[2], x.shape[3]) if layout == "NCHW" else x.shape[:3]
    out = cp.full(block.y_shape(n, h, w, layout), cp.nan, dtype=x.dtype)
    if tiling is None:
        F.fused_forward(block, x, ws, bs, out, x2, layout=layout)
    else:
        F.launcher(block, tiling, str(x.dtype), layout, x.shape)(x, ws, bs, out, x2)
    got = out.get()
    assert not np.isnan(got).any(), "every output element is written"
    return got


def host(a):
    return None if a is None else a.get()


def torch_per_layer(block: F.Block, x, ws, bs, x2):
    """The block layer by layer through PyTorch's cuDNN convolutions (NCHW), in the operands' dtype."""
    import torch
    import torch.nn.functional as tF

    t = lambda a: None if a is None else torch.from_dlpack(a)  # noqa: E731

    def conv(inp, i):
        layer = block.layers[i]
        y = tF.conv2d(inp, t(ws[i]), t(bs[i]), layer.stride, layer.pad, 1, layer.groups)
        return tF.relu6(y) if layer.relu6 else torch.relu(y) if layer.relu else y

    prev = (torch.backends.cudnn.enabled, torch.backends.cudnn.allow_tf32)
    torch.backends.cudnn.enabled, torch.backends.cudnn.allow_tf32 = True, False
    try:
        with torch.no_grad():
            xt = t(x)
            if block.mode == "straight":
                y = conv(conv(xt, 0), 1)
            elif block.mode == "split":
                m = conv(xt, 0)
                y = torch.cat([conv(m, 1), conv(m, 2)], 1)
            else:
                m = conv(xt, 0) + conv(t(x2) if x2 is not None else xt, 1)
                y = conv(torch.relu(m) if block.merge_relu else m, 2)
        torch.cuda.synchronize()
        return y.cpu().numpy()
    finally:
        torch.backends.cudnn.enabled, torch.backends.cudnn.allow_tf32 = prev


@pytest.mark.parametrize("n", [1, 3, 8])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", list(F.SEED_BLOCKS))
def test_seed_blocks_match_cudnn_per_layer_and_float64(name, dtype, n):
    pytest.importorskip("torch")
    b = F.SEED_BLOCKS[name]
    x, ws, bs, x2 = operands(b, n, *b.hw, dtype, seed=n)
    got = run_fused(b, x, ws, bs, x2)
    ref = F.reference(b, host(x), [host(w) for w in ws], [host(v) for v in bs], host(x2))
    assert rel_err(got, ref) < TOL_REF[dtype]
    assert rel_err(got, torch_per_layer(b, x, ws, bs, x2)) < TOL_CUDNN[dtype]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", list(F.SEED_BLOCKS))
def test_seed_blocks_in_nhwc(name, dtype):
    b = F.SEED_BLOCKS[name]
    x, ws, bs, x2 = operands(b, 3, *b.hw, dtype, layout="NHWC", seed=7)
    got = run_fused(b, x, ws, bs, x2, layout="NHWC")
    ref = F.reference(b, host(x), [host(w) for w in ws], [host(v) for v in bs], host(x2), layout="NHWC")
    assert rel_err(got, ref) < TOL_REF[dtype]


def test_merge_reads_its_second_input():
    """c.1 with a separate x2 (ResNet: the shortcut's input) differs from c.1 on x alone, and matches the reference."""
    b = F.SEED_BLOCKS["c.1"]
    x, ws, bs, x2 = operands(b, 2, 13, 9, "float32", seed=3)
    two = run_fused(b, x, ws, bs, x2)
    one = run_fused(b, x, ws, bs, None)
    hw = [host(w) for w in ws], [host(v) for v in bs]
    assert rel_err(two, F.reference(b, host(x), *hw, host(x2))) < TOL_REF["float32"]
    assert rel_err(one, F.reference(b, host(x), *hw)) < TOL_REF["float32"]
    assert rel_err(one, two) > 0.1


RANDOM = [
    F.Block("r-straight-rect", "straight", 5, (F.ConvLayer(7, (3, 1), pad=(1, 0)), F.ConvLayer(6, (1, 5), pad=(0, 2)))),
    F.Block("r-straight-stride", "straight", 6, (F.ConvLayer(6, 3, stride=2, pad=1, groups=6),
                                                 F.ConvLayer(10, 3, stride=2, pad=1, groups=2, relu=False))),
    F.Block("r-split", "split", 9, (F.ConvLayer(5, 3, pad=1, bias=False), F.ConvLayer(3, 1),
                                    F.ConvLayer(11, 5, pad=2, relu=False))),
    F.Block("r-merge", "merge", 3, (F.ConvLayer(12, 3, pad=1, relu=True), F.ConvLayer(12, 3, pad=1, groups=3),
                                    F.ConvLayer(7, 3, pad=1, groups=1)), merge_relu=False),
    # pipelined 1x1 producers: channels no chunk divides, a strided 1x1, ReLU before the add (two sums)
    F.Block("r-pipe-straight", "straight", 37, (F.ConvLayer(20, 1, stride=2), F.ConvLayer(9, 3, pad=1))),
    F.Block("r-pipe-merge", "merge", 13, (F.ConvLayer(24, 1, relu=True), F.ConvLayer(24, 1, relu=False, bias=False),
                                          F.ConvLayer(10, 3, pad=1, relu=False)), merge_relu=True),
    # ReLU6 producers and consumers in the other modes (global and pipelined producers, two sums before the add)
    F.Block("r-relu6-merge", "merge", 6, (F.ConvLayer(10, 3, pad=1, relu=False, relu6=True),
                                          F.ConvLayer(10, 3, pad=1, groups=2, relu=False),
                                          F.ConvLayer(7, 1, relu=False, relu6=True)), merge_relu=True),
    F.Block("r-relu6-pipe-split", "split", 11, (F.ConvLayer(12, 1, relu=False, relu6=True),
                                                F.ConvLayer(5, 1, relu=False, relu6=True),
                                                F.ConvLayer(6, 3, pad=1, relu=False, relu6=True))),
]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("block", RANDOM, ids=[b.name for b in RANDOM])
def test_random_blocks_on_odd_planes_at_several_tilings(block, dtype):
    rng = np.random.default_rng(len(block.name))
    for trial in range(3):
        n, h, w = int(rng.integers(1, 6)), int(rng.integers(5, 40)) | 1, int(rng.integers(5, 40)) | 1
        x, ws, bs, x2 = operands(block, n, h, w, dtype, seed=trial,
                                 scale=4.0 if any(l.relu6 for l in block.layers) else 1.0)
        ref = F.reference(block, host(x), [host(v) for v in ws], [host(v) for v in bs], host(x2))
        outs = [block.layers[s].out_channels for s in block.slots()[2:] if s is not None]
        for t in (None, F.Tiling(int(rng.choice([1, 2, 4, 7, 8])), int(rng.choice([1, 4, 7, 8, 16])),
                                 int(rng.choice([k for k in (1, 2, 3) if all(o % k == 0 for o in outs)])),
                                 int(rng.choice([64, 128, 256, 512])))):
            if t is not None and not F.fits(block, t, F.smem_limit()):
                t = F.Tiling(2, 4, 1, 256)
            got = run_fused(block, x, ws, bs, x2, tiling=t)
            assert rel_err(got, ref) < TOL_REF[dtype], (n, h, w, t)


def test_batches_beyond_one_grid_are_split_across_launches(monkeypatch):
    monkeypatch.setattr(F, "_MAX_Z", 2)          # 5 samples -> launches of 2, 2, 1
    b = F.SEED_BLOCKS["b.1"]
    x, ws, bs, x2 = operands(b, 5, 15, 17, "float16", seed=9)
    got = run_fused(b, x, ws, bs, x2, tiling=F.Tiling(4, 8))
    ref = F.reference(b, host(x), [host(w) for w in ws], [host(v) for v in bs])
    assert rel_err(got, ref) < TOL_REF["float16"]


def captured(run, b, x, ws, bs, x2, eager, launches: int = 1):
    """``run`` captured into a CUDA graph on a fresh NaN output: capturing runs nothing, ``launches`` replays
    write what the eager launch wrote.  Returns (out, graph, stream) for further replays."""
    import cupy as cp

    out = cp.full(b.y_shape(x.shape[0], *b.hw), cp.nan, dtype=x.dtype)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        run(x, ws, bs, out, x2)
        graph = stream.end_capture()
    assert np.isnan(out.get()).all(), "capturing runs nothing"
    for _ in range(launches):
        graph.launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(out.get(), eager)
    return out, graph, stream


@pytest.mark.parametrize("name", list(F.SEED_BLOCKS))
def test_cuda_graph_replay_equals_the_eager_launch(name):
    import cupy as cp

    b = F.SEED_BLOCKS[name]
    x, ws, bs, x2 = operands(b, 2, *b.hw, "float16", seed=5)
    eager = run_fused(b, x, ws, bs, x2)
    run = F.launcher(b, F.default_tiling(b, 2, *b.hw, F.smem_limit(), F.sm_count()), "float16", "NCHW", x.shape)
    out, graph, stream = captured(run, b, x, ws, bs, x2, eager, launches=2)
    x[...] = -x                                           # replay reads the captured pointers' new contents
    cp.cuda.Device().synchronize()
    graph.launch(stream)
    stream.synchronize()
    ref = F.reference(b, host(x), [host(w) for w in ws], [host(v) for v in bs], host(x2))
    assert rel_err(out.get(), ref) < TOL_REF["float16"]


def test_tuner_on_the_device_picks_a_correct_tiling(monkeypatch, tmp_path):
    from ucudnn.kernels import autotune

    monkeypatch.setenv("UCUDNN_DATABASE", str(tmp_path / "db.sqlite"))
    autotune.clear_memory()
    b = F.SEED_BLOCKS["a.2"]
    x, ws, bs, x2 = operands(b, 1, *b.hw, "float32", seed=2)
    import cupy as cp

    scratch = cp.empty(b.y_shape(1, *b.hw), dtype="float32")

    def timer(fn):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        fn()
        start.record()
        for _ in range(10):
            fn()
        end.record()
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) / 10

    t, how = F.tuned_tiling(b, "float32", "NCHW", x.shape, (x, ws, bs, scratch, x2), timer=timer)
    assert how == "climb" and F.tuned_tiling(b, "float32", "NCHW", x.shape, None) == (t, "cache")
    got = run_fused(b, x, ws, bs, x2, tiling=t)
    assert rel_err(got, F.reference(b, host(x), [host(w) for w in ws], [host(v) for v in bs])) < TOL_REF["float32"]
    autotune.clear_memory()


# ---- MobileNet V2: ReLU6 ---------------------------------------------------------------------------------------------
def _r6(out, kernel=1, **kw):
    return F.ConvLayer(out, kernel, relu=False, relu6=True, **kw)


#: MobileNet V2 inverted-residual pieces (expansion 6): the depthwise 3x3 + ReLU6 -> linear 1x1 projection (seed a.2
#: with ReLU6) at stride 1 and 2, and the expand 1x1 + ReLU6 -> depthwise 3x3 + ReLU6 (a pipelined producer).
MOBILENET_V2 = [
    F.Block("mv2-dw-s1", "straight", 144, (_r6(144, 3, pad=1, groups=144), F.ConvLayer(24, 1, relu=False)),
            hw=(56, 56)),
    F.Block("mv2-dw-s2", "straight", 144, (_r6(144, 3, stride=2, pad=1, groups=144), F.ConvLayer(32, 1, relu=False)),
            hw=(56, 56)),
    F.Block("mv2-dw-s2-odd", "straight", 96, (_r6(96, 3, stride=2, pad=1, groups=96), F.ConvLayer(24, 1, relu=False)),
            hw=(15, 23)),
    F.Block("mv2-expand", "straight", 24, (_r6(144, 1), _r6(144, 3, pad=1, groups=144)), hw=(28, 28)),
    F.Block("mv2-expand-s2", "straight", 16, (_r6(96, 1), _r6(96, 3, stride=2, pad=1, groups=96)), hw=(29, 27)),
]


def _nchw_operands(x, ws, x2, layout):
    """The operands in NCHW (filters [K, C/G, R, S]) for the per-layer cuDNN comparison."""
    import cupy as cp

    if layout == "NCHW":
        return x, ws, x2
    t = lambda a: None if a is None else cp.ascontiguousarray(a.transpose(0, 3, 1, 2))  # noqa: E731
    return t(x), [t(w) for w in ws], t(x2)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("block", MOBILENET_V2, ids=[b.name for b in MOBILENET_V2])
def test_mobilenet_v2_relu6_blocks_match_cudnn_per_layer_and_float64(block, dtype, layout):
    pytest.importorskip("torch")
    outs = [block.layers[s].out_channels for s in block.slots()[2:] if s is not None]
    sliced = next(t for t in (F.Tiling(4, 8, 2, 128), F.Tiling(2, 4, 2, 256), F.Tiling(2, 2, 1, 256))
                  if all(o % t.ks == 0 for o in outs) and F.fits(block, t, F.smem_limit()))
    for n, tiling in ((1, None), (3, None), (2, sliced)):
        x, ws, bs, x2 = operands(block, n, *block.hw, dtype, layout=layout, seed=11 + n, scale=4.0)
        hx, hws, hbs = host(x), [host(w) for w in ws], [host(v) for v in bs]
        mid = F.conv_reference(F._nchw(hx, layout), F._nchw(hws[0], layout), hbs[0], block.layers[0])
        assert 0.02 < (mid == 6).mean() < 0.9, "ReLU6 caps a fair share of the intermediate"
        got = run_fused(block, x, ws, bs, x2, layout=layout, tiling=tiling)
        ref = F.reference(block, hx, hws, hbs, host(x2), layout=layout)
        assert rel_err(got, ref) < TOL_REF[dtype], (n, tiling)
        # the same block with a plain ReLU (no cap) is far off: the kernel did clamp
        relu = F.Block(block.name, block.mode, block.in_channels,
                       tuple(F.ConvLayer(l.out_channels, l.kernel, l.stride, l.pad, l.groups, l.bias, l.relu6)
                             for l in block.layers))
        assert rel_err(F.reference(relu, hx, hws, hbs, host(x2), layout=layout), ref) > 10 * TOL_CUDNN[dtype]
        cudnn = torch_per_layer(block, *_nchw_operands(x, ws, x2, layout)[:2], bs, None)
        if layout == "NHWC":
            cudnn = cudnn.transpose(0, 2, 3, 1)
        assert rel_err(got, cudnn) < TOL_CUDNN[dtype], (n, tiling)


# ---- the tensor-core kernels: chains of 1x1s (kernels/pointwise.cu), a 1x1 then spatial convs (kernels/spatial.cu) -
CHAINS = [F.SEED_BLOCKS["c.1"],
          F.Block("c.1-no-mrelu", "merge", 32, (F.ConvLayer(48, 1, relu=True),
                                                F.ConvLayer(48, 1, relu6=True, relu=False),
                                                F.ConvLayer(16, 1, relu=False, bias=False))),
          F.Block("expand-project", "straight", 32, (F.ConvLayer(192, 1, relu6=True, relu=False),
                                                     F.ConvLayer(32, 1, relu=False)))]
SPATIAL = [F.SEED_BLOCKS["a.1"], F.SEED_BLOCKS["b.1"],
           # non-square filters, a pad smaller than the filter's half (the output plane shrinks), no producer ReLU
           F.Block("rect-shrink", "straight", 48, (F.ConvLayer(32, 1, relu=False),
                                                   F.ConvLayer(16, (3, 5), pad=(0, 1), relu6=True, relu=False))),
           # split: a 1x3 | 3x1 pair (same plane), the second without bias or activation
           F.Block("split-1x3-3x1", "split", 32, (F.ConvLayer(16, 1), F.ConvLayer(32, (1, 3), pad=(0, 1)),
                                                  F.ConvLayer(16, (3, 1), pad=(1, 0), bias=False, relu=False)))]
TENSOR_CORE = [("pointwise", b) for b in CHAINS] + [("spatial", b) for b in SPATIAL]


def _tc_module(kernel):
    from ucudnn.kernels import pointwise, spatial

    return {"pointwise": pointwise, "spatial": spatial}[kernel]


def run_tensor_core(kernel, block, x, ws, bs, x2, layout, tiling):
    import cupy as cp

    from ucudnn.kernels import blocks as K

    n, h, w = (x.shape[0], x.shape[2], x.shape[3]) if layout == "NCHW" else x.shape[:3]
    out = cp.full(block.y_shape(n, h, w, layout), cp.nan, dtype=x.dtype)
    K.launcher(kernel, block, tiling, str(x.dtype), layout, x.shape)(x, ws, bs, out, x2)
    got = out.get()
    assert not np.isnan(got).any(), "every output element is written"
    return got


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("kernel,block", TENSOR_CORE, ids=[f"{k}-{b.name}" for k, b in TENSOR_CORE])
def test_tensor_core_blocks_match_their_arithmetic_float64_and_cudnn(kernel, block, layout):
    """Odd batch, a plane no tile divides (7 x 9 = 63), every tiling; the seed blocks at their own plane."""
    mod = _tc_module(kernel)
    planes = [(7, 9)] + ([block.hw] if block.hw else [])
    for (h, w), n in zip(planes, (3, 1)):
        x, ws, bs, x2 = operands(block, n, h, w, "float16", layout, seed=h * n + (kernel == "spatial"), scale=2.0)
        em = mod.emulate(block, host(x), [host(v) for v in ws], [host(v) for v in bs], host(x2), layout)
        ref = F.reference(block, host(x), [host(v) for v in ws], [host(v) for v in bs], host(x2), layout=layout)
        xs, wn, x2n = _nchw_operands(x, ws, x2, layout)
        cudnn = torch_per_layer(block, xs, wn, bs, x2n)
        for tiling in mod.TILINGS:
            got = run_tensor_core(kernel, block, x, ws, bs, x2, layout, tiling)
            assert rel_err(got, em) < 2e-3, tiling          # the same arithmetic up to the order of FP32 sums
            assert rel_err(got, ref) < TOL_REF["float16"], tiling
            nchw = got if layout == "NCHW" else got.transpose(0, 3, 1, 2)
            assert rel_err(nchw, cudnn) < TOL_CUDNN["float16"], tiling


@pytest.mark.parametrize("kernel,name,seed", [("pointwise", "c.1", 9), ("spatial", "a.1", 5)])
def test_a_tensor_core_block_replays_in_a_cuda_graph(kernel, name, seed):
    from ucudnn.kernels import blocks as K

    b = F.SEED_BLOCKS[name]
    x, ws, bs, x2 = operands(b, 2, *b.hw, "float16", seed=seed)
    tiling = _tc_module(kernel).TILINGS[0]
    eager = run_tensor_core(kernel, b, x, ws, bs, x2, "NCHW", tiling)
    captured(K.launcher(kernel, b, tiling, "float16", "NCHW", x.shape), b, x, ws, bs, x2, eager)
