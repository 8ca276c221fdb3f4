"""ucudnn's own tiled-FFT convolution (issue 18 part 2, for filters of 4 taps and more), as an algorithm source
named ``fft``.

Why: the shipped AlexNet's conv2 (5x5, 96 -> 256 channels, 27x27, b256, FP32 strict) runs cuDNN's FFT_TILING / FFT
unbounded (0.79 ms forward with 476 MiB, 0.78 ms backward data with 750 MiB on the H200), and at 64 MiB 16
micro-batches of WINOGRAD_NONFUSED at 1.42 / 1.46 ms: cuDNN's transform-domain algorithms size their workspace for
the batch and transform the filter again each micro-batch.  Winograd F(4x4, 3x3) (the ``winograd`` source) does not
take 5x5.  This source's configuration transforms the filter once per call and runs the micro-batch in chunks of T
tiles, so its workspace is what it touches: ``8 * F * (Co*Ci + Ci*T + Co*T)`` bytes.

Measured (H200, ``benchmarks/results/README.md``, ``fft_profile.md``): in no 64 MiB plan of that AlexNet (its U
alone is 35 MiB at TS 18, and its complex GEMMs alone, 46 TFLOPS pedantic, take as long as cuDNN's whole FFT), in its
32 MiB plan (1.31x); on public large-filter layers (SRCNN, Inception-v3, GoogLeNet;
``benchmarks/networks/large_filters.json``) WR 1.64x / 1.68x / 1.41x faster with it at 16 / 32 / 64 MiB.

A configuration (``kernels/fft.py`` describes and emulates every step; ``kernels/fft.cu`` holds the transforms):
TS x TS tiles (``fft-t<TS>``; the two cheapest tile sizes by :func:`ucudnn.kernels.fft.tile_cost` are measured,
and up to two more whose U, the call's fixed workspace, is at most half the smallest before:
:func:`ucudnn.kernels.fft.tile_sizes`),
U = conj(DFT(w)) once per call at the start of the workspace, then per chunk of T tiles (``-c<T>``; no suffix: the
whole micro-batch in one chunk) the input DFTs, one complex ``cublasGemmStridedBatchedEx`` over the F = TS * (TS/2
+ 1) points, and the inverse DFT of each output tile.  Backward filter accumulates ``conj(dW)`` in the transform
domain across the call's chunks and inverts once (see ``kernels/fft.py``); backward data is the forward on dy with
the filter rotated.

Numerics: the GEMM's compute type and the recorded math label come from :func:`ucudnn.binding.cublas.compute_type`
(``FMA``: pedantic FP32 complex products under ``strict``; ``TENSOR_OP``: TF32 under ``tf32`` / ``default``); the
DFTs run in FP32 with double-precision twiddles.  Deterministic.  float32, NCHW and NHWC (tensors through strides,
so channel slices of y run too), stride 1, no dilation or groups.

Chunks over streams (``-p2``, measured, and ``-p3``, ``extra.fft.streams``; calls of at least that many chunks):
chunk i runs on stream i % streams with its own V and M (:class:`~ucudnn.measure.sources.streams.StreamSet`, as
the winograd source's), so one chunk's DFTs (memory- and FMA-bound) run beside another's GEMMs; backward filter
gives each stream its own Gc, summed by the inverse.  Workspace ``8 * F * (Co*Ci + streams * (Ci*T + Co*T))``
(backward filter: ``streams`` Gc).

A launch allocates nothing and never synchronises (kernels are compiled in ``prepare``), so plans with fft steps
capture into CUDA graphs.  cuBLAS's own per-handle workspace is outside ucudnn's count, as for mec and winograd.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ...binding import cublas
from ...errors import InputError, UcudnnError
from ...planning.table import Measurement, Skipped
from ...problem import ConvProblem
from .base import BenchSettings, Launch, Operands, Prepared, Pruner, measured_or_skipped, timed_beta
from .mec import compute_for
from .streams import StreamSet

ALGO = "fft"
#: complex 1 and 0 the GEMMs scale by, as host scalars (host pointer mode: cuBLAS reads them at enqueue, so they
#: live as long as the module)
_CONSTANTS = np.array([1.0, 0.0], np.complex64)


def problem_refusal(problem: ConvProblem, op: str) -> str | None:
    """Why the fft source does not run ``op`` of ``problem`` (None: it does)."""
    from ucudnn.kernels.fft import refusal

    return refusal(problem, op)


def algo_name(ts: int, tiles: int | None, streams: int = 1) -> str:
    """The recorded algorithm of TS-tiles in chunks of ``tiles`` tiles (None: one chunk a call), on ``streams``."""
    return f"{ALGO}-t{ts}" + ("" if tiles is None else f"-c{tiles}") + ("" if streams == 1 else f"-p{streams}")


def parse(config: Measurement) -> tuple[int, int | None, int]:
    """(tile size, tiles per chunk or None, streams) of a recorded configuration: ``extra.fft`` where present, else
    its algorithm's name ``fft-t<TS>[-c<T>][-p<S>]``."""
    from ucudnn.kernels.transform_workspace import STREAMS

    info = config.extra.get("fft") or {}
    ts, tiles, streams = info.get("tile"), info.get("tiles"), info.get("streams", 1)
    if ts is None:
        parts = str(config.algo).split("-")
        ok = len(parts) >= 2 and parts[0] == ALGO and parts[1][:1] == "t" and parts[1][1:].isdigit()
        rest = {p[:1]: p[1:] for p in parts[2:]}
        ok = ok and len(rest) == len(parts) - 2 and set(rest) <= {"c", "p"} and all(v.isdigit() for v in rest.values())
        ok = ok and [p[:1] for p in parts[2:]] == sorted(rest, key="cp".index)
        if not ok:
            raise InputError(f"fft records {ALGO}-t<TS>[-c<tiles>][-p<streams>], got {config.algo!r}", "algo")
        ts = int(parts[1][1:])
        tiles = int(rest["c"]) if "c" in rest else None
        streams = int(rest.get("p", 1))
    for key, value in (("tile", ts), ("tiles", tiles), ("streams", streams)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise InputError(f"must be a positive integer, got {value!r}", f"extra.fft.{key}")
    if streams not in STREAMS:
        raise InputError(f"must be one of {STREAMS}, got {streams!r}", "extra.fft.streams")
    return ts, tiles, streams


#: the stream counts measured (``-p3`` still runs from a recorded row).  Why not 3: on the public large-filter layers
#: (H200, ``channel_wr_large_filters-b64-float32-NCHW-strict-fft-streams-replay.md``) no plan took a 3-stream row,
#: and measuring 2 and 3 streams took the benchmark from 14 to 31 s for a 1.5% better 64 MiB plan
MEASURED_STREAMS = (1, 2)


def stream_counts(chunks: int) -> list[int]:
    """The stream counts measured for a call of ``chunks`` chunks: 1, and 2 where the call has two chunks or more
    (one chunk's DFTs beside another's GEMMs, as the winograd source does)."""
    return [s for s in MEASURED_STREAMS if s <= chunks]


def _gemm_call(geo: Any, count: int, compute: str, accumulate: bool = False) -> Callable[[int, dict[str, int]], None]:
    """``call(handle, buffers)``: the complex strided-batched GEMM of a chunk of ``count`` tiles (``geo.gemm``)."""
    gm = geo.gemm(count, accumulate)
    ta, tb = cublas.OPERATIONS[gm.transa], cublas.OPERATIONS[gm.transb]
    dtype, ctype = cublas.COMPLEX_TYPES["complex64"], cublas.COMPUTE_TYPES[compute]
    alpha = _CONSTANTS.ctypes.data
    beta = _CONSTANTS.ctypes.data + (0 if gm.beta == 1.0 else 8)

    def call(h: int, bufs: dict[str, int]) -> None:
        cublas.gemm_strided_batched(h, ta, tb, gm.m, gm.n, gm.k, alpha, bufs[gm.a], dtype, gm.lda, gm.stride_a,
                                    bufs[gm.b], dtype, gm.ldb, gm.stride_b, beta, bufs[gm.c], dtype, gm.ldc,
                                    gm.stride_c, gm.batch, ctype)

    return call


def _launch(problem: ConvProblem, op: str, ts: int, tiles: int | None, compute: str, streams: int = 1) -> Launch:
    """The launch of ``op`` at ``problem.n`` in TS x TS tiles, chunks of ``tiles`` tiles (None: one chunk), chunk i
    on stream i % ``streams`` (the caller's and side streams forked after the filter's DFT and joined before the
    launch returns; backward filter: each stream adding into its own Gc, summed by the inverse)."""
    from ...binding.gpu import cupy
    from ucudnn.kernels.fft import Geometry, backward_filter_launchers, launchers

    cp = cupy()
    geo = Geometry.of(problem, op, ts)
    total = problem.n * geo.tiles_per_image
    t = total if tiles is None else min(tiles, total)
    why = geo.chunk_refusal(t, problem.n)
    if why:
        raise InputError(f"fft cannot run {op} of {problem.describe()}: {why}", "tiles")
    need = geo.workspace_bytes(t, streams)
    offsets = {name: off for name, off, _ in geo.segments(t, streams)}
    names = [geo.stream_buffers(k) for k in range(streams)]
    ranges = geo.ranges(problem.n, t)
    what = f"{ts}x{ts} tiles, chunks of {t} tiles" + (f" on {streams} streams" if streams > 1 else "")
    bwf = op == "backward_filter"
    # a stream's first chunk overwrites its Gc, later ones add (backward filter)
    steps = [(t0, count, i % streams, _gemm_call(geo, count, compute, accumulate=bwf and i >= streams))
             for i, (t0, count) in enumerate(ranges)]
    if bwf:
        input_, dy_, grad_ = backward_filter_launchers(geo, 4, *geo.partials(streams, len(ranges)))
    else:
        filter_, input_, output_ = launchers(geo)
    fan = StreamSet(cp, streams) if streams > 1 else None
    forward = op == "forward"

    def launch(ops: Operands, workspace: int, workspace_bytes: int, alpha: float, beta: float) -> None:
        if workspace_bytes < need:
            raise UcudnnError(f"fft {op} ({what}) needs {need} bytes of workspace, got {workspace_bytes}")
        bufs = [{key: workspace + offsets[name] for key, name in nm.items()} for nm in names]
        main = cp.cuda.get_current_stream()
        if not bwf:
            w, x, y = (ops.b, ops.a, ops.out) if forward else (ops.a, ops.b, ops.out)
            filter_(w, bufs[0]["U"], main.ptr)   # before the fork: every stream's GEMMs read U
        if fan is None:
            handles, ptrs = [cublas.handle()], [main.ptr]
            cublas.bind(handles[0], main.ptr)
        else:
            ptrs, handles = [st.ptr for st in fan.fork(main)], fan.handles
        if bwf:
            x, dy, dw = ops.a, ops.b, ops.out
            for t0, count, k, gemm in steps:
                input_(x, bufs[k]["V"], t0, count, ptrs[k])
                dy_(dy, bufs[k]["M"], t0, count, ptrs[k])
                gemm(handles[k], bufs[k])
        else:
            for t0, count, k, gemm in steps:
                input_(x, bufs[k]["V"], t0, count, ptrs[k])
                gemm(handles[k], bufs[k])
                output_(bufs[k]["M"], y, t0, count, alpha, beta, ptrs[k])
        if fan is not None:
            fan.join(main)
        if bwf:
            grad_(bufs[0]["U"], dw, alpha, beta, main.ptr)

    return launch


class FftSource(Prepared):
    """Tiled-FFT convolution on ucudnn's DFT kernels and cuBLAS's complex GEMMs (see the module doc)."""

    name = "fft"
    channel_slices = False

    def measure(self, op: str, problem: ConvProblem, ops: Operands, workspace: int,
                settings: BenchSettings) -> tuple[list[Measurement], list[Skipped]]:
        return measured_or_skipped("fft", problem.n, lambda: problem_refusal(problem, op),
                                   lambda: self._measure(op, problem, ops, workspace, settings))

    def _measure(self, op: str, problem: ConvProblem, ops: Operands, workspace: int,
                 settings: BenchSettings) -> tuple[list[Measurement], list[Skipped]]:
        from ucudnn.kernels.fft import Geometry, chunk_sizes, tile_sizes

        mb = problem.n
        compute, label = cublas.compute_type(settings.numerics, problem.dtype)
        beta = timed_beta(op, problem)
        pruner = Pruner(settings, trust_long=False)
        measured: list[Measurement] = []
        skipped: list[Skipped] = []
        for ts in tile_sizes(problem, op):
            geo = Geometry.of(problem, op, ts)
            total = mb * geo.tiles_per_image
            # largest chunks first: usually the fastest
            for t, streams in ((t, st) for t in sorted(chunk_sizes(geo, mb), reverse=True)
                               for st in stream_counts(len(geo.ranges(mb, t)))):
                tiles = None if t >= total else t
                algo = algo_name(ts, tiles, streams)
                ws = geo.workspace_bytes(t, streams)
                why = geo.chunk_refusal(t, mb)
                if why is None and ws > settings.max_workspace:
                    why = f"needs {ws} bytes, over the benchmark cap"
                if why:
                    skipped.append(Skipped(mb, algo, label, f"fft: {why}"))
                    continue
                info: dict[str, Any] = {"tile": ts, "output_tile": [geo.mh, geo.mw], "chunks": len(geo.ranges(mb, t)),
                                        "compute": compute, "layout": problem.layout,
                                        "filter_transform": ("inverse, once per call" if op == "backward_filter"
                                                             else "once per call")}
                if tiles is not None:
                    info["tiles"] = tiles
                if streams > 1:
                    info["streams"] = streams
                config = Measurement(mb, algo, label, 0.0, ws, self.name, None, {"fft": info, "deterministic": True})
                row = self.time_prepared(op, problem, config, ops, workspace, beta, settings, pruner)
                (measured if isinstance(row, Measurement) else skipped).append(row)  # type: ignore[arg-type]
        return measured, skipped

    def prepare(self, op: str, problem: ConvProblem, config: Measurement) -> Launch:
        why = problem_refusal(problem, op)
        if why:
            raise InputError(f"fft cannot run {op} of {problem.describe()}: {why}", "problem")
        ts, tiles, streams = parse(config)
        return _launch(problem, op, ts, tiles, compute_for(config.math_type, problem.dtype), streams)
