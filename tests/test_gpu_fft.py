"""The fft source on the GPU (skipped without one): forward, backward data and backward filter against a float64
direct correlation and undivided cuDNN on AlexNet's conv2 shape (5x5) and awkward shapes (C = 1 and 3, odd H / W,
non-square 1x7 / 7x1 / 5x3 filters, pad 0 to R - 1, n = 1 and 5), NCHW and NHWC, FP32 strict and TF32, every tile
size the source offers; chunks of tiles crossing image boundaries; chunks over 2 and 3 streams; alpha / beta; a
channel slice's view of y;
micro-batched plans through the Executor mixed with legacy steps, eager and CUDA-graph replayed (backward filter
accumulating across micro-batches); measure()'s rows with exact workspace.  No timing is asserted."""
from __future__ import annotations

import pytest
from conv_checks import OPS, check_channel_slice, close, launch_once, run_plan, undivided_cudnn

from ucudnn.kernels.fft import Geometry, chunk_sizes, tile_sizes
from ucudnn.planning.table import Measurement
from ucudnn.problem import ConvProblem

pytestmark = pytest.mark.gpu

CASES = {
    "alexnet-conv2-b2": ConvProblem(2, 64, 27, 27, 192, 5, 5, pad=2),
    "c1-odd-pad0": ConvProblem(5, 1, 13, 11, 6, 5, 5, pad=0),
    "c3-7x7-pad3": ConvProblem(1, 3, 30, 23, 8, 7, 7, pad=3),
    "1x7": ConvProblem(3, 16, 17, 17, 24, 1, 7, pad=(0, 3)),
    "7x1": ConvProblem(3, 16, 17, 17, 24, 7, 1, pad=(3, 0)),
    "5x3-pad12": ConvProblem(2, 13, 19, 15, 9, 5, 3, pad=(1, 2)),
    "nhwc-5x5": ConvProblem(5, 12, 14, 21, 20, 5, 5, pad=2, layout="NHWC"),
}
TOL = {"FMA": 1e-4, "TENSOR_OP": 3e-2}   # max error / max |reference|


def _config(problem, op, ts=None, tiles=None, math="FMA", n=None, streams=1):
    from ucudnn.measure.sources.fft import algo_name

    n = problem.n if n is None else n
    p = problem.with_batch(n)
    ts = tile_sizes(p, op)[0] if ts is None else ts
    geo = Geometry.of(p, op, ts)
    t = n * geo.tiles_per_image if tiles is None else min(tiles, n * geo.tiles_per_image)
    extra = {"tile": ts} if tiles is None else {"tile": ts, "tiles": tiles}
    if streams > 1:
        extra["streams"] = streams
    return Measurement(n, algo_name(ts, tiles, streams), math, 1.0, geo.workspace_bytes(t, streams), "fft", None,
                       {"fft": extra})


def _close(got, ref, math, what=""):
    return close(got, ref, TOL[math], what)


def _launch_once(problem, op, ts=None, tiles=None, alpha=1.0, beta=0.0, seed=0, math="FMA", streams=1):
    """(result, float64 expectation) of one prepared launch with exactly the reported workspace (NaN-filled)."""
    from ucudnn.measure.sources.fft import FftSource

    return launch_once(FftSource(), _config(problem, op, ts, tiles, math, streams=streams), problem, op, alpha, beta,
                       seed)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_every_offered_tile_size_matches_the_float64_reference(name, op):
    problem = CASES[name]
    for ts in tile_sizes(problem, op):
        got, expect = _launch_once(problem, op, ts=ts)
        _close(got, expect, "FMA", f"{name} {op} t{ts}")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("name", ["alexnet-conv2-b2", "c1-odd-pad0", "nhwc-5x5", "1x7"])
def test_tile_chunks_and_tf32(name, op):
    problem = CASES[name]
    geo = Geometry.of(problem, op, tile_sizes(problem, op)[-1])
    # a chunk of 3 tiles: ranges start mid-row and cross image boundaries; many chunks accumulate (backward filter)
    got, expect = _launch_once(problem, op, ts=geo.ts, tiles=3, seed=4)
    _close(got, expect, "FMA", f"{name} {op} chunks of 3 tiles")
    got, expect = _launch_once(problem, op, seed=5, math="TENSOR_OP")
    _close(got, expect, "TENSOR_OP", f"{name} {op} TF32")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("name", ["5x3-pad12", "nhwc-5x5"])
def test_alpha_and_beta_scale_and_accumulate(name, op):
    got, expect = _launch_once(CASES[name], op, tiles=5, alpha=-0.75, beta=0.5, seed=3)
    _close(got, expect, "FMA", f"{name} {op}")


@pytest.mark.parametrize("streams", [2, 3])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("name", ["alexnet-conv2-b2", "c1-odd-pad0", "nhwc-5x5"])
def test_chunks_over_streams(name, op, streams):
    """Chunk i on stream i % streams (own V and M; backward filter its own Gc), alpha / beta, 4 to 20 chunks."""
    got, expect = _launch_once(CASES[name], op, tiles=2, alpha=0.5, beta=0.25, seed=6, streams=streams)
    _close(got, expect, "FMA", f"{name} {op} on {streams} streams")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("name", ["alexnet-conv2-b2", "c3-7x7-pad3", "nhwc-5x5"])
def test_matches_undivided_cudnn(name, op):
    problem = CASES[name]
    ref = undivided_cudnn(problem, op, 5)
    got, expect = _launch_once(problem, op, seed=5)
    _close(ref, expect, "FMA", f"{name} {op}: cuDNN itself")
    _close(got, ref, "FMA", f"{name} {op} vs cuDNN")


@pytest.mark.parametrize("op", OPS)
def test_channel_slice_runs_on_the_wide_tensors_view(op):
    """k of k_total channels: y (dy) addressed through the wide tensor's strides, other channels untouched."""
    from ucudnn.measure.sources.fft import FftSource

    check_channel_slice(FftSource(), ConvProblem(3, 16, 19, 14, 24, 5, 5, pad=2), _config, op, TOL["FMA"])


def _plan(problem, op, steps):
    from ucudnn.planning.plan import KernelPlan, MicroConfig

    configs = []
    for mb, source, tiles in steps:
        if source == "fft":
            configs.append(MicroConfig.of(_config(problem, op, tiles=tiles, n=mb, streams=2 if tiles == 1 else 1)))
        else:
            configs.append(MicroConfig.of(Measurement(mb, tiles, "FMA", 1.0, 0, "legacy")))
    return KernelPlan(f"test/fft/{op}", op, problem, configs)


# tiles 1: that step on 2 streams
SPLITS = [[(2, "fft", 3), (2, "fft", None), (1, "fft", None)], [(3, "fft", 2), (2, "legacy", 0)],
          [(2, "fft", 1), (3, "fft", None)]]


@pytest.mark.parametrize("replay", [False, True])
@pytest.mark.parametrize("split", range(len(SPLITS)))
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("name", ["c1-odd-pad0", "nhwc-5x5"])
def test_micro_batched_plans_through_the_executor(name, op, split, replay):
    run_plan(_plan(CASES[name], op, SPLITS[split]), CASES[name], op, replay, TOL["FMA"])   # n = 5


def test_measure_records_labelled_rows_with_exact_workspace():
    import cupy as cp

    from ucudnn.measure.benchmarking import Buffers
    from ucudnn.measure.sources.base import BenchSettings
    from ucudnn.measure.sources.fft import MEASURED_STREAMS, FftSource, parse

    problem = CASES["alexnet-conv2-b2"].with_batch(4)
    buf = Buffers(problem)
    for numerics, label in (("strict", "FMA"), ("tf32", "TENSOR_OP")):
        settings = BenchSettings(numerics, repeat=2, warmup=1, max_workspace=256 << 20)
        ws = cp.cuda.alloc(settings.max_workspace)
        for op in OPS:
            ms, sk = FftSource().measure(op, problem, buf.operands(op, problem.n), ws.ptr, settings)
            assert ms and not sk, sk
            seen = set()
            for m in ms:
                ts, tiles, streams = parse(m)
                geo = Geometry.of(problem, op, ts)
                total = 4 * geo.tiles_per_image
                t = total if tiles is None else tiles
                assert m.source == "fft" and m.math_type == label and m.time_ms > 0
                assert m.workspace_bytes == geo.workspace_bytes(t, streams)
                assert (tiles is None) == ("tiles" not in m.extra["fft"])
                assert m.extra["fft"].get("streams", 1) == streams <= m.extra["fft"]["chunks"]
                seen.add((ts, t, streams))
            # every tile size the source ranks first, with every chunk size, on 1 or 2 streams as chunks allow
            want = set()
            for ts in tile_sizes(problem, op):
                geo = Geometry.of(problem, op, ts)
                for t in chunk_sizes(geo, 4):
                    want |= {(ts, t, st) for st in MEASURED_STREAMS if st <= len(geo.ranges(4, t))}
            assert seen == want
