"""The winograd source on the GPU (skipped without one): forward, backward data and backward filter against a
float64 direct correlation and undivided cuDNN on VGG-like layers and awkward shapes (odd H / W, pad 0 and 2,
C = 3, C not a multiple of 8, n = 1 and 5), NCHW and NHWC, FP32 strict and TF32; internal chunks; alpha / beta;
channel slices; chunks over streams; point groups (every op) and split reductions; micro-batched plans through the
Executor mixed with legacy steps, eager and CUDA-graph replayed (backward filter accumulating across
micro-batches); a captured graph replayed on new data; tile-range chunks (``wino-f4-t<T>``: part of a tile row, a
few rows, ranges crossing image boundaries, a VGG conv1_2 plane in chunks of 64 tile rows) against undivided cuDNN,
and one captured and replayed; measure()'s rows (image and tile chunks) with exact workspace.  No timing is
asserted.

``python tests/test_gpu_winograd.py`` prints a timing report (filter transform against a whole step, VGG layers)."""
from __future__ import annotations

import numpy as np
import pytest
from conv_checks import OPS, check_channel_slice, close, host as _host, launch_once, nchw as _nchw
from conv_checks import operands as _operands
from conv_checks import reference as _reference, run_plan, undivided_cudnn as _cudnn
from ucudnn.kernels.winograd import Geometry, fused_workspace_bytes, tile_chunk_sizes

from ucudnn.planning.table import Measurement
from ucudnn.problem import ConvProblem

pytestmark = pytest.mark.gpu

CASES = {
    "vgg-64x56": ConvProblem(3, 64, 56, 56, 64, 3, 3, pad=1),
    "vgg-128x28": ConvProblem(3, 128, 28, 28, 128, 3, 3, pad=1),
    "odd-13-pad0": ConvProblem(5, 3, 13, 13, 10, 3, 3, pad=0),
    "odd-27-pad2": ConvProblem(1, 12, 27, 27, 20, 3, 3, pad=2),
    "c13-nonsquare-pad12": ConvProblem(2, 13, 17, 15, 9, 3, 3, pad=(1, 2)),
    "nhwc-odd": ConvProblem(5, 13, 13, 27, 24, 3, 3, pad=1, layout="NHWC"),
    "nhwc-vgg": ConvProblem(2, 64, 28, 28, 96, 3, 3, pad=1, layout="NHWC"),
}
TOL = {"FMA": 1e-4, "TENSOR_OP": 3e-2}   # max error / max |reference|


def _config(problem, op, chunk=None, math="FMA", n=None, tiles=None, csplit=1, fused=False, streams=1, groups=1,
            ksplit=1):
    n = problem.n if n is None else n
    if fused:
        ws = fused_workspace_bytes(Geometry.of(problem.with_batch(n), op))
        return Measurement(n, "wino-f4-fused", "FMA", 1.0, ws, "winograd", None, {"winograd": {"fused": True}})
    split = {"csplit": csplit} if csplit > 1 else {}
    suffix = f"-s{csplit}" if csplit > 1 else ""
    if groups > 1:
        split["groups"] = groups
        suffix += f"-g{groups}"
    if ksplit > 1:
        split["ksplit"] = ksplit
        suffix += f"-k{ksplit}"
    if streams > 1:
        split["streams"] = streams
        suffix += f"-p{streams}"
    if tiles is not None:
        ws = Geometry.of(problem.with_batch(n), op).workspace_bytes(0, tiles, csplit, streams, groups, ksplit)
        return Measurement(n, f"wino-f4-t{tiles}{suffix}", math, 1.0, ws, "winograd", None,
                           {"winograd": {"tiles": tiles, **split}})
    chunk = n if chunk is None else min(chunk, n)
    ws = Geometry.of(problem.with_batch(n), op).workspace_bytes(chunk, None, csplit, streams, groups, ksplit)
    algo = ("wino-f4" if chunk >= n else f"wino-f4-c{chunk}") + suffix
    return Measurement(n, algo, math, 1.0, ws, "winograd", None, {"winograd": {"chunk": chunk, **split}})


def _close(got, ref, math, what=""):
    return close(got, ref, TOL[math], what)


def _launch_once(problem, op, chunk=None, alpha=1.0, beta=0.0, seed=0, math="FMA", tiles=None, reference=True,
                 csplit=1, fused=False, streams=1, groups=1, ksplit=1):
    """(result, float64 expectation) of one prepared launch with exactly the reported workspace (NaN-filled)."""
    from ucudnn.measure.sources.winograd import WinogradSource

    cfg = _config(problem, op, chunk, math, tiles=tiles, csplit=csplit, fused=fused, streams=streams, groups=groups,
                  ksplit=ksplit)
    return launch_once(WinogradSource(), cfg, problem, op, alpha, beta, seed, _reference if reference else None)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_the_float64_reference(name, op):
    problem = CASES[name]
    got, expect = _launch_once(problem, op)
    _close(got, expect, "FMA", f"{name} {op}")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("name", ["odd-13-pad0", "nhwc-odd", "vgg-128x28"])
def test_chunks_and_tf32(name, op):
    problem = CASES[name]
    got, expect = _launch_once(problem, op, chunk=2, seed=4)
    _close(got, expect, "FMA", f"{name} {op} chunks of 2")
    got, expect = _launch_once(problem, op, seed=5, math="TENSOR_OP")
    _close(got, expect, "TENSOR_OP", f"{name} {op} TF32")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("name", ["c13-nonsquare-pad12", "nhwc-odd"])
def test_alpha_and_beta_scale_and_accumulate(name, op):
    got, expect = _launch_once(CASES[name], op, chunk=2, alpha=-0.75, beta=0.5, seed=3)
    _close(got, expect, "FMA", f"{name} {op}")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("name", ["vgg-64x56", "vgg-128x28", "odd-27-pad2", "nhwc-vgg"])
def test_matches_undivided_cudnn(name, op):
    problem = CASES[name]
    ref = _cudnn(problem, op, 5)
    got, expect = _launch_once(problem, op, seed=5)
    _close(ref, expect, "FMA", f"{name} {op}: cuDNN itself")
    _close(got, ref, "FMA", f"{name} {op} vs cuDNN")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_channel_slice_runs_on_the_wide_tensors_view(layout, op):
    """k of k_total channels: y (dy) addressed through the wide tensor's strides, other channels untouched; backward
    filter reads the slice of dy and writes that slice's dw."""
    from ucudnn.measure.sources.winograd import WinogradSource

    check_channel_slice(WinogradSource(), ConvProblem(3, 16, 19, 14, 24, 3, 3, pad=1, layout=layout), _config, op,
                        TOL["FMA"])


def _tile_counts(problem, op):
    geo = Geometry.of(problem, op)
    tpi, tw = geo.tiles_per_image, geo.tiles_w
    # part of a row (starts mid-row), 3 rows, an image and a bit (crosses images), a prime count
    return sorted({max(1, tw // 2), 3 * tw, tpi + tw, 37})


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("name", ["vgg-64x56", "odd-27-pad2", "odd-13-pad0", "nhwc-vgg", "nhwc-odd"])
def test_tile_chunks_match_undivided_cudnn(name, op):
    problem = CASES[name]
    ref = _cudnn(problem, op, 5)
    for t in _tile_counts(problem, op):
        got, _ = _launch_once(problem, op, seed=5, tiles=t, reference=False)
        _close(got, ref, "FMA", f"{name} {op} chunks of {t} tiles vs cuDNN")


@pytest.mark.parametrize("op", OPS)
def test_vgg_conv1_2_plane_in_tile_row_chunks_matches_cudnn(op):
    """VGG conv1_2 (64 -> 64, 224x224) at n = 2: chunks of 64 tile rows (3584 tiles: more than one image, so the
    second chunk starts inside image 0 and ends in image 1) and of 8 rows, at their exact workspace."""
    problem = ConvProblem(2, 64, 224, 224, 64, 3, 3, pad=1)
    ref = _cudnn(problem, op, 6)
    for t in (64 * 56, 8 * 56):
        got, _ = _launch_once(problem, op, seed=6, tiles=t, reference=False)
        _close(got, ref, "FMA", f"conv1_2 {op} chunks of {t} tiles vs cuDNN")


@pytest.mark.parametrize("csplit", [2, 4])
@pytest.mark.parametrize("op", ["forward", "backward_data"])
@pytest.mark.parametrize("name", ["vgg-64x56", "vgg-128x28", "nhwc-vgg", "c13-nonsquare-pad12"])
def test_input_channel_slices_match_cudnn_and_float64(name, op, csplit):
    """The input channels in 2 or 4 slices (where they divide), in image chunks and in tile chunks crossing images,
    alpha / beta into live data: equal to cuDNN and to the float64 reference."""
    problem = CASES[name]
    ci = problem.c if op == "forward" else problem.k
    if ci % csplit:
        pytest.skip(f"{ci} input channels do not split into {csplit}")
    ref = _cudnn(problem, op, 9)
    got, _ = _launch_once(problem, op, chunk=1, seed=9, reference=False, csplit=csplit)
    _close(got, ref, "FMA", f"{name} {op} one-image chunks in {csplit} slices vs cuDNN")
    tpi = Geometry.of(problem, op).tiles_per_image
    got, expect = _launch_once(problem, op, alpha=-0.75, beta=0.5, seed=9, tiles=tpi + 3, csplit=csplit)
    _close(got, expect, "FMA", f"{name} {op} chunks of {tpi + 3} tiles in {csplit} slices")


@pytest.mark.parametrize("streams", [2, 3])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("name", ["vgg-64x56", "odd-27-pad2", "nhwc-odd", "c13-nonsquare-pad12"])
def test_chunks_over_streams_match_cudnn_and_float64(name, op, streams):
    """Chunks spread over 2 or 3 streams (each its own V, M and cuBLAS handle, forked from and joined back to the
    caller's stream; backward filter each its own dU, summed by the inverse transform): image chunks and tile
    chunks crossing images equal cuDNN; alpha / beta into live data equal float64."""
    problem = CASES[name]
    ref = _cudnn(problem, op, 14)
    got, _ = _launch_once(problem, op, chunk=1, seed=14, reference=False, streams=streams)
    _close(got, ref, "FMA", f"{name} {op} one-image chunks on {streams} streams vs cuDNN")
    tpi = Geometry.of(problem, op).tiles_per_image
    for t in (max(1, tpi // 3), tpi + 5):
        got, _ = _launch_once(problem, op, seed=14, tiles=t, reference=False, streams=streams)
        _close(got, ref, "FMA", f"{name} {op} chunks of {t} tiles on {streams} streams vs cuDNN")
    got, expect = _launch_once(problem, op, alpha=-0.75, beta=0.5, seed=15, tiles=tpi // 2 + 1, streams=streams)
    _close(got, expect, "FMA", f"{name} {op} {streams} streams, alpha / beta")


@pytest.mark.parametrize("groups", [2, 3, 4])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("name", ["vgg-64x56", "odd-27-pad2", "nhwc-odd", "c13-nonsquare-pad12", "vgg-128x28"])
def test_point_groups_match_cudnn_and_float64(name, op, groups):
    """Every op with its 36 points in 2, 3 or 4 groups: backward filter runs its chunks once per group (dU / V / Z a
    group's size) and each group's inverse transform adds into dw; forward and backward data transform the group's
    points of U once, then run every chunk's V, GEMM and output transform on them, the output adding each group's
    share.  One stream and 2 / 3 streams, image and tile chunks crossing images, equal cuDNN; alpha / beta into
    live data equal float64 (the first group applies beta, the others add); TF32 within TF32's tolerance."""
    problem = CASES[name]
    ref = _cudnn(problem, op, 16)
    tpi = Geometry.of(problem, op).tiles_per_image
    for streams in (1, 2, 3):
        got, _ = _launch_once(problem, op, chunk=1, seed=16, reference=False, streams=streams, groups=groups)
        _close(got, ref, "FMA", f"{name} {op} one-image chunks, {groups} groups on {streams} streams vs cuDNN")
        got, _ = _launch_once(problem, op, seed=16, tiles=tpi + 5, reference=False, streams=streams, groups=groups)
        _close(got, ref, "FMA", f"{name} {op} chunks of {tpi + 5} tiles, {groups} groups on {streams} streams")
    got, expect = _launch_once(problem, op, alpha=-0.75, beta=0.5, seed=17, tiles=tpi // 2 + 1, streams=2,
                               groups=groups)
    _close(got, expect, "FMA", f"{name} {op} {groups} groups, alpha / beta")
    got, expect = _launch_once(problem, op, seed=18, math="TENSOR_OP", groups=groups)
    _close(got, expect, "TENSOR_OP", f"{name} {op} {groups} groups TF32")


@pytest.mark.parametrize("ksplit", [2, 4, 8])
@pytest.mark.parametrize("name", ["vgg-64x56", "odd-27-pad2", "nhwc-odd", "c13-nonsquare-pad12", "vgg-128x28"])
def test_backward_filter_split_reductions_match_cudnn_and_float64(name, ksplit):
    """Backward filter with each chunk's tiles in 2, 4 or 8 parts (part s its own V / Z block, the last parts padded
    with zero tiles, adding into dU copy s; the inverse transform summing every copy): one stream and, where the
    copies stay evenly spaced, 2 / 3 streams, image chunks and tile chunks crossing images (chunks shorter than the
    parts too), equal cuDNN; alpha / beta into live data equal float64; TF32 within TF32's tolerance."""
    problem, op = CASES[name], "backward_filter"
    geo = Geometry.of(problem, op)
    ref = _cudnn(problem, op, 16)
    tpi = geo.tiles_per_image
    for streams in (s for s in (1, 2, 3) if geo.ksplit_refusal(ksplit, s) is None):
        for tiles in (None, tpi + 5, 3):
            got, _ = _launch_once(problem, op, chunk=1 if tiles is None else None, seed=16, reference=False,
                                  tiles=tiles, streams=streams, ksplit=ksplit)
            _close(got, ref, "FMA", f"{name} chunks of {tiles or tpi} tiles in {ksplit} parts, {streams} streams")
    got, expect = _launch_once(problem, op, alpha=-0.75, beta=0.5, seed=17, tiles=tpi // 2 + 1, ksplit=ksplit)
    _close(got, expect, "FMA", f"{name} {ksplit} parts, alpha / beta")
    got, expect = _launch_once(problem, op, seed=18, math="TENSOR_OP", ksplit=ksplit)
    _close(got, expect, "TENSOR_OP", f"{name} {ksplit} parts TF32")


@pytest.mark.parametrize("replay", [False, True])
@pytest.mark.parametrize("op", OPS)
def test_stream_steps_in_plans_through_the_executor_eager_and_replayed(op, replay):
    """A plan mixing a 3-stream step, a 2-stream tile-chunk step and a one-stream step (n = 5, alpha / beta), eager
    and captured into one CUDA graph (the side streams fork from and join the capture) then replayed twice on new
    data."""
    import cupy as cp

    from ucudnn.execute.executor import Executor
    from ucudnn.planning.plan import KernelPlan, MicroConfig

    problem = CASES["nhwc-odd"]
    tpi = Geometry.of(problem, op).tiles_per_image
    grouped = 3   # one step's points in groups as well
    split = 4 if op == "backward_filter" else 1      # and one step's reduction in parts
    steps = [_config(problem, op, 1, n=3, streams=3), _config(problem, op, n=1, tiles=tpi // 2, streams=2,
                                                               groups=grouped), _config(problem, op, 1, n=1,
                                                                                        ksplit=split)]
    plan = KernelPlan(f"test/winograd-streams/{op}", op, problem, [MicroConfig.of(m) for m in steps])
    ex = Executor(plan, replay=replay)
    out_shape = problem.operand_shapes(op)[2]
    out, ws = cp.empty(out_shape, cp.float32), cp.cuda.alloc(ex.workspace_bytes)
    a, b = (cp.asarray(t) for t in _operands(op, *_host(problem, 20)))
    for seed in (21, 22, 23):   # the same operand buffers, new data: what a replayed graph reads
        x, w, dy = _host(problem, seed)
        a.set(_operands(op, x, w, dy)[0])
        b.set(_operands(op, x, w, dy)[1])
        old = np.random.default_rng(seed).standard_normal(out_shape).astype(np.float32)
        out.set(old)
        ex(a, b, out, alpha=0.5, beta=0.25, workspace=ws, workspace_bytes=ex.workspace_bytes)
        _close(out.get(), 0.5 * _reference(op, problem, x, w, dy) + 0.25 * old, "FMA", f"{op} streams seed {seed}")
    assert ex.replay_failures == []
    assert len(ex._graphs) == (1 if replay else 0)


FUSED_CASES = {**CASES,
               # two output-channel blocks with a tail, input channels past a step's 8, tiles past a block's 24
               "k40-c20": ConvProblem(3, 20, 30, 22, 40, 3, 3, pad=1),
               "c1-k33-pad0": ConvProblem(2, 1, 9, 11, 33, 3, 3, pad=0),
               "nhwc-k72-c24": ConvProblem(3, 24, 17, 17, 72, 3, 3, pad=(2, 1), layout="NHWC")}


@pytest.mark.parametrize("op", ["forward", "backward_data"])
@pytest.mark.parametrize("name", sorted(FUSED_CASES))
def test_fused_kernel_matches_the_float64_reference_and_cudnn(name, op):
    """wino_fused (V and M in shared memory and registers, U alone in the workspace): equal to float64 and to
    undivided cuDNN; with alpha / beta into live data."""
    problem = FUSED_CASES[name]
    got, expect = _launch_once(problem, op, seed=12, fused=True)
    _close(got, expect, "FMA", f"{name} {op} fused")
    _close(got, _cudnn(problem, op, 12), "FMA", f"{name} {op} fused vs cuDNN")
    got, expect = _launch_once(problem, op, alpha=-0.75, beta=0.5, seed=13, fused=True)
    _close(got, expect, "FMA", f"{name} {op} fused, alpha / beta")


def test_fused_kernel_on_vgg_conv1_2_matches_cudnn():
    problem = ConvProblem(2, 64, 224, 224, 64, 3, 3, pad=1)
    for op in ("forward", "backward_data"):
        got, _ = _launch_once(problem, op, seed=6, fused=True, reference=False)
        _close(got, _cudnn(problem, op, 6), "FMA", f"conv1_2 {op} fused vs cuDNN")


@pytest.mark.parametrize("replay", [False, True])
@pytest.mark.parametrize("op", ["forward", "backward_data"])
@pytest.mark.parametrize("name", ["odd-13-pad0", "nhwc-odd"])
def test_fused_steps_in_micro_batched_plans_through_the_executor(name, op, replay):
    """A plan of a fused step, a chunked winograd step and a legacy step over n = 5 (alpha / beta), eager and
    captured then replayed."""
    import cupy as cp

    from ucudnn.execute.executor import Executor
    from ucudnn.planning.plan import KernelPlan, MicroConfig

    problem = CASES[name]
    plan = KernelPlan(f"test/winograd-fused/{op}", op, problem,
                      [MicroConfig.of(_config(problem, op, n=2, fused=True)),
                       MicroConfig.of(_config(problem, op, 1, n=2)),
                       MicroConfig.of(Measurement(1, 0, "FMA", 1.0, 0, "legacy"))])
    x, w, dy = _host(problem, 7)
    out_shape = problem.operand_shapes(op)[2]
    old = np.random.default_rng(8).standard_normal(out_shape).astype(np.float32)
    ex = Executor(plan, replay=replay)
    a, b = (cp.asarray(t) for t in _operands(op, x, w, dy))
    out, ws = cp.empty(out_shape, cp.float32), cp.cuda.alloc(ex.workspace_bytes)
    for _ in range(2 if replay else 1):
        out.set(old)
        ex(a, b, out, alpha=0.5, beta=0.25, workspace=ws, workspace_bytes=ex.workspace_bytes)
        _close(out.get(), 0.5 * _reference(op, problem, x, w, dy) + 0.25 * old, "FMA", f"{name} {op} fused plan")
    assert ex.replay_failures == []


def test_fused_kernel_writes_a_channel_slice_of_the_wide_output():
    import cupy as cp

    from ucudnn.measure.sources.base import Operands
    from ucudnn.measure.sources.winograd import WinogradSource

    for layout in ("NCHW", "NHWC"):
        wide = ConvProblem(3, 16, 19, 14, 48, 3, 3, pad=1, layout=layout)
        k0, k = 8, 33
        sl = wide.with_channels(k, wide.k)
        x, w, y = _host(wide, 11)
        cx, cy = cp.asarray(x), cp.asarray(y)
        per_channel = 4 * (wide.p * wide.q if layout == "NCHW" else 1)
        w_slice = cp.ascontiguousarray(cp.asarray(w)[k0:k0 + k])
        cfg = _config(sl, "forward", fused=True)
        ws = cp.cuda.alloc(cfg.workspace_bytes)
        WinogradSource().prepare("forward", sl, cfg)(Operands(cx.data.ptr, w_slice.data.ptr,
                                                              cy.data.ptr + k0 * per_channel),
                                                     ws.ptr, cfg.workspace_bytes, 1.0, 0.0)
        got = _nchw(cy.get(), layout)
        _close(got[:, k0:k0 + k], _nchw(_reference("forward", wide, x, w, y), layout)[:, k0:k0 + k], "FMA",
               f"{layout} fused slice")
        keep = np.r_[0:k0, k0 + k:wide.k]
        np.testing.assert_array_equal(got[:, keep], _nchw(y, layout)[:, keep])


@pytest.mark.parametrize("op", OPS)
def test_tile_chunks_alpha_beta_against_float64(op):
    got, expect = _launch_once(CASES["c13-nonsquare-pad12"], op, alpha=-0.75, beta=0.5, seed=3, tiles=7)
    _close(got, expect, "FMA", f"c13 {op} chunks of 7 tiles")


def test_a_captured_tile_chunk_graph_replays_on_new_data():
    import cupy as cp

    from ucudnn.binding.gpu import capture
    from ucudnn.measure.sources.base import Operands
    from ucudnn.measure.sources.winograd import WinogradSource

    problem = CASES["vgg-64x56"]   # 14x14 tiles an image; chunks of 3 rows + the short last one
    x, w, dy = _host(problem, 9)
    cdy, cw = cp.asarray(dy), cp.asarray(w)
    dx = cp.empty(problem.x_shape(), cp.float32)
    cfg = _config(problem, "backward_data", tiles=42)
    ws = cp.cuda.alloc(cfg.workspace_bytes)
    launch = WinogradSource().prepare("backward_data", problem, cfg)
    graph = capture(lambda: launch(Operands(cw.data.ptr, cdy.data.ptr, dx.data.ptr), ws.ptr, cfg.workspace_bytes,
                                   1.0, 0.0))
    dy2 = np.random.default_rng(10).standard_normal(dy.shape).astype(np.float32)
    cdy.set(dy2)
    graph.launch(cp.cuda.get_current_stream())
    _close(dx.get(), _reference("backward_data", problem, x, w, dy2), "FMA", "tile chunks replayed")


def _plan(problem, op, steps):
    from ucudnn.planning.plan import KernelPlan, MicroConfig

    configs = []
    for mb, source, what in steps:
        if source == "winograd":
            configs.append(MicroConfig.of(_config(problem, op, what, n=mb)))
        else:
            configs.append(MicroConfig.of(Measurement(mb, what, "FMA", 1.0, 0, "legacy")))
    return KernelPlan(f"test/winograd/{op}", op, problem, configs)


SPLITS = [[(2, "winograd", 2), (2, "winograd", 1), (1, "winograd", 1)], [(3, "winograd", 2), (2, "legacy", 0)]]


@pytest.mark.parametrize("replay", [False, True])
@pytest.mark.parametrize("split", range(len(SPLITS)))
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("name", ["odd-13-pad0", "nhwc-odd"])
def test_micro_batched_plans_through_the_executor(name, op, split, replay):
    run_plan(_plan(CASES[name], op, SPLITS[split]), CASES[name], op, replay, TOL["FMA"])   # n = 5


def test_a_captured_graph_replays_on_new_data():
    import cupy as cp

    from ucudnn.binding.gpu import capture
    from ucudnn.measure.sources.base import Operands
    from ucudnn.measure.sources.winograd import WinogradSource

    problem = CASES["vgg-128x28"]
    x, w, dy = _host(problem, 9)
    cx, cw = cp.asarray(x), cp.asarray(w)
    y = cp.empty(problem.y_shape(), cp.float32)
    cfg = _config(problem, "forward", chunk=2)
    ws = cp.cuda.alloc(cfg.workspace_bytes)
    launch = WinogradSource().prepare("forward", problem, cfg)
    graph = capture(lambda: launch(Operands(cx.data.ptr, cw.data.ptr, y.data.ptr), ws.ptr, cfg.workspace_bytes,
                                   1.0, 0.0))
    x2 = np.random.default_rng(10).standard_normal(x.shape).astype(np.float32)
    cx.set(x2)
    graph.launch(cp.cuda.get_current_stream())
    _close(y.get(), _reference("forward", problem, x2, w, dy), "FMA", "replayed")


def test_measure_records_labelled_rows_with_exact_workspace():
    import cupy as cp

    from ucudnn.measure.benchmarking import Buffers
    from ucudnn.measure.sources.base import BenchSettings
    from ucudnn.measure.sources.winograd import WinogradSource, csplits, point_groups

    problem = CASES["vgg-128x28"].with_batch(4)
    buf = Buffers(problem)
    for numerics, label in (("strict", "FMA"), ("tf32", "TENSOR_OP")):
        settings = BenchSettings(numerics, repeat=2, warmup=1, max_workspace=256 << 20)
        ws = cp.cuda.alloc(settings.max_workspace)
        for op in OPS:
            geo = Geometry.of(problem, op)
            ms, sk = WinogradSource().measure(op, problem, buf.operands(op, problem.n), ws.ptr, settings)
            fused = [m for m in ms if m.extra["winograd"].get("fused")]
            # the fused kernel: forward and backward data, FP32 FFMA whatever the numerics, U its whole workspace
            assert [(m.algo, m.math_type, m.workspace_bytes) for m in fused] == (
                [] if op == "backward_filter" else [("wino-f4-fused", "FMA", fused_workspace_bytes(geo))]), sk
            ms = [m for m in ms if m not in fused]
            # chunks over streams: every op, unsliced, named and sized for a V and M (backward filter: and a dU)
            # per stream
            for m in ms:
                info = m.extra["winograd"]
                if "streams" not in info:
                    continue
                st, t = info["streams"], info.get("tiles")
                assert st in (2, 3) and m.algo.endswith(f"-p{st}")
                assert "csplit" not in info and info["chunks"] >= st
                assert m.workspace_bytes == geo.workspace_bytes(0 if t is not None else info["chunk"], t, 1, st,
                                                                info.get("groups", 1))
            assert any("streams" in m.extra["winograd"] for m in ms)
            # point groups: every op, where point_groups offers them, named and sized for one group
            for m in ms:
                info = m.extra["winograd"]
                if "groups" not in info:
                    continue
                gr, st, t = info["groups"], info.get("streams", 1), info.get("tiles")
                tt = t if t is not None else info["chunk"] * geo.tiles_per_image
                assert gr in point_groups(geo, op, tt, st) and gr > 1 and "csplit" not in info
                assert f"-g{gr}" in m.algo and info["points_per_group"] == 36 // gr
                assert m.workspace_bytes == geo.workspace_bytes(0 if t is not None else info["chunk"], t, 1, st, gr)
            assert any("groups" in m.extra["winograd"] for m in ms)
            ms = [m for m in ms if "streams" not in m.extra["winograd"] and "groups" not in m.extra["winograd"]]
            whole = [m for m in ms if "csplit" not in m.extra["winograd"]]
            images = [m for m in whole if "chunk" in m.extra["winograd"]]
            tiled = [m for m in whole if "tiles" in m.extra["winograd"]]
            assert sorted(m.extra["winograd"]["chunk"] for m in images) == [1, 2, 4], sk
            assert sorted(m.extra["winograd"]["tiles"] for m in tiled) == tile_chunk_sizes(geo, 4), sk
            assert len(images) + len(tiled) == len(whole)
            # input-channel slices: only where csplits offers them, named and sized for their slices
            for m in ms:
                info = m.extra["winograd"]
                if "csplit" not in info:
                    continue
                cs, t = info["csplit"], info.get("tiles")
                assert cs in csplits(geo, op, t if t is not None else info["chunk"] * geo.tiles_per_image)
                assert cs > 1 and m.algo.endswith(f"-s{cs}") and op != "backward_filter"
                assert m.workspace_bytes == geo.workspace_bytes(0 if t is not None else info["chunk"], t, cs)
            for m in images:
                chunk = m.extra["winograd"]["chunk"]
                assert m.algo == ("wino-f4" if chunk == 4 else f"wino-f4-c{chunk}")
                assert m.workspace_bytes == geo.workspace_bytes(chunk)
            for m in tiled:
                t = m.extra["winograd"]["tiles"]
                assert m.algo == f"wino-f4-t{t}" and m.workspace_bytes == geo.workspace_bytes(0, t)
            for m in ms:
                assert m.source == "winograd" and m.math_type == label and m.time_ms > 0
                assert m.extra["deterministic"] is True


# ---- timing report (not a test) -----------------------------------------------------------------------------------
def _timing_report() -> None:
    import cupy as cp

    from ucudnn.binding.timing import time_ms
    from ucudnn.kernels.winograd import launchers
    from ucudnn.measure.benchmarking import Buffers
    from ucudnn.measure.sources.base import Operands
    from ucudnn.measure.sources.winograd import WinogradSource

    layers = {"vgg conv4_2 fwd": ("forward", ConvProblem(64, 512, 28, 28, 512, 3, 3, pad=1)),
              "vgg conv5_2 fwd": ("forward", ConvProblem(64, 512, 14, 14, 512, 3, 3, pad=1)),
              "vgg conv3_2 bwd-data": ("backward_data", ConvProblem(64, 256, 56, 56, 256, 3, 3, pad=1)),
              "vgg conv2_2 bwd-data": ("backward_data", ConvProblem(64, 128, 112, 112, 128, 3, 3, pad=1))}
    ws = cp.cuda.alloc(256 << 20)
    print("| layer | micro-batch | chunk | workspace MiB | step ms | filter transform ms | share | per image ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, (op, full) in layers.items():
        buf = Buffers(full)
        for mb, chunk in ((1, 1), (2, 2), (4, 4), (16, 2), (64, 2), (64, 4)):
            p = full.with_batch(mb)
            geo = Geometry.of(p, op)
            need = geo.workspace_bytes(chunk)
            if need > 256 << 20:
                continue
            cfg = _config(p, op, chunk)
            launch = WinogradSource().prepare(op, p, cfg)
            ops = buf.operands(op, mb)
            t = time_ms(lambda: launch(ops, ws.ptr, need, 1.0, 0.0), repeat=3, warmup=1, min_sample_ms=2.0)
            filt = launchers(geo)[0]
            w_ptr = ops.b if op == "forward" else ops.a
            tf = time_ms(lambda: filt(w_ptr, ws.ptr), repeat=3, warmup=1, min_sample_ms=2.0)
            print(f"| {name} | {mb} | {chunk} | {need / 2**20:.1f} | {t:.3f} | {tf:.4f} | {tf / t:.0%} | "
                  f"{t / mb:.4f} |")
    _ = Operands


if __name__ == "__main__":
    _timing_report()
