"""ucudnn's own Winograd F(4x4, 3x3) convolution (issue 18 part 2), as an algorithm source named ``winograd``.

Why: on VGG-16 b64 FP32 strict, cuDNN's WINOGRAD_NONFUSED (legacy forward algo 7, backward-data algo 5) wins
unbounded but sizes its workspace for internal chunks of 16 images whatever the micro-batch (VGG conv4_2 forward:
146 MiB at n = 1..16), so at 64 MiB neither batch nor channel splits make it fit and ucudnn falls back to implicit
GEMM at up to 3x the time.  This source's workspace is exactly what its configuration touches.

A configuration (``kernels/winograd.py`` describes and emulates every step; ``kernels/winograd.cu`` holds the
transforms): the filter transform U = G g G^T (``[36][Co][Ci]`` float32) written once per call at the start of the
workspace, then for each chunk of ``chunk`` images of the micro-batch: the input transform V = B^T d B of every
6x6 tile, the 36 transform-domain products as ONE ``cublasGemmStridedBatchedEx`` (batch 36), and the output
transform y = alpha * A^T M A + beta * y.  A micro-batch of n images is offered with every chunk size in
:func:`ucudnn.kernels.winograd.chunk_sizes` (powers of two below n, and n): ``wino-f4`` runs the micro-batch as one
chunk, ``wino-f4-c<b>`` in chunks of b images, so the batch-independent filter transform is paid once per call
while V and M stay sized for b images.  That is how "filter transform once per call" is met without an executor
hook: WR chooses, per micro-batch size, between more steps (each transforming the filter) and fewer steps with
smaller internal chunks, from measured times and exact workspaces.

Tile chunks: a chunk may also be a flat range of T tiles over the micro-batch's n * ceil(Ho/4) * ceil(Wo/4) tiles
(``wino-f4-t<T>``; :func:`ucudnn.kernels.winograd.tile_chunk_sizes`: from 64 tiles up multiples of 64, four sizes an
octave, since T is the chunk GEMMs' N and cuBLAS tiles it 64 or 128 wide; below, whole tile rows; from 1/16 of an
image up to 4 images or 2048 tiles, the power-of-two image chunks left out), so V and M can be smaller than one
image's plane: VGG conv1_2 (64 channels, 224x224: 3136 tiles, 55.7 MiB for one image) runs in chunks of 3584 tiles
at 63.6 MiB or of 1792 at 32.1 MiB.  Ranges cross image boundaries freely (the kernels decode each tile's image, row and
column from its index over the call), so only the last chunk is short.

* forward: x (C channels) correlated into y (K), the problem's padding.
* backward data: dy (K channels) correlated into dx (C) with the filter rotated by 180 degrees and K / C swapped,
  padding 2 - pad (so pad <= 2).
* backward filter: per chunk the input transform V of x, Z = A dy A^T of each 4x4 tile of dy (into M's buffer) and
  one strided-batched GEMM adding dU[xi] += Z[xi] V[xi]^T (tiles reduced, the call's first chunk overwriting), then
  once per call dw = alpha * G^T dU G + beta * dw: the transform-domain accumulation runs across the call's chunks
  and the inverse filter transform is paid once per call, not per chunk.  Micro-batches of a plan add into dw
  through beta = 1 like every source's.  Same workspace formula (dU in U's place).

Numerics: the GEMM's compute type and the recorded math label come from :func:`ucudnn.binding.cublas.compute_type`
(``FMA``: CUBLAS_COMPUTE_32F_PEDANTIC under ``strict``; ``TENSOR_OP``: TF32 under ``tf32`` / ``default``); the
transforms run in FP32.  Everything is deterministic.  float32 only (float16 is declined).

Workspace: ``36 * 4 * (Co*Ci + Ci*T + Co*T)`` bytes, T = chunk * ceil(Ho/4) * ceil(Wo/4) (or the tile chunk's T),
U and V 256-byte aligned
(:meth:`ucudnn.kernels.winograd.Geometry.workspace_bytes`).  A launch uses only the workspace pointer it is given,
allocates nothing and never synchronises (kernels are compiled in ``prepare``), so plans of winograd steps are
captured into CUDA graphs like any other.  cuBLAS's own per-handle workspace is outside ucudnn's count, as for mec.

Input-channel slices (``-s2`` / ``-s4`` after the chunk's name, ``extra["winograd"]["csplit"]``; forward and
backward data): the chunk's input channels in 2 or 4 slices, each slice's U and V in the workspace in turn (its
filter transform again per chunk) and its GEMM adding into M.  Why: U is ``36 * Co * Ci`` floats whatever the chunk
(37.7 MB of VGG-16's 512-channel layers: most of 64 MiB), so under a tight limit a chunk holds few tiles and its 36
GEMMs are thin; a slice holds a fraction of U and V, and the same workspace holds chunks two to three times larger.
Measured where U is at least a quarter of the unsplit configuration's workspace (:func:`csplits`).  Workspace
``36 * 4 * (Co*Ci/s + Ci/s*T + Co*T)``.

A call runs at most :data:`MAX_CHUNKS` chunks: a chunk size that needs more at micro-batch n is measured only at the
smaller micro-batches where it does not.  Why: a call's time is its chunks' times (the filter transform aside), so
n images in chunks of T tiles cost what WR pays running n as smaller micro-batches with the same T and the same
workspace; those many-chunk calls were the longest rows of the benchmark.  Replayed on the recorded H200 tables
(``table_ablation.py --max-chunks``, ``benchmarks/results/table_ablation_winograd-max-chunks.md``): the rows over 64
chunks held 58-84% of the winograd rows' recorded time (VGG-16 b64 16.5 of 21.7 s, replay-timed 5.8 of 10.0;
AlexNet b256 8.5 of 10.3; ResNet-50 b128 8.5 of 10.0), and
leaving them out priced the WR plans at +0.00% to +0.28% from 8 MiB to 4 GiB (VGG-16, AlexNet, ResNet-50), within
issue 16's 1% bar for a pruning rule; 32 chunks would have cut more and priced up to +1.49%.

Chunks over streams (``-p2`` / ``-p3`` after the chunk's name, ``extra["winograd"]["streams"]``; unsliced,
calls of at least that many chunks: :func:`stream_counts`): chunk i runs on stream i % streams (the caller's and
:func:`ucudnn.binding.gpu.side_stream`), each stream with its own V and M after the shared U and its own cuBLAS
handle (:func:`ucudnn.binding.cublas.side_handle`), so one chunk's memory-bound transforms run beside another's
GEMMs.  The side streams wait for the filter transform and the caller's stream waits for them before the launch
returns, so a call is still one stream's work (and captures into one graph).  Workspace
``36 * 4 * (Co*Ci + streams * (Ci*T + Co*T))``.  Backward filter: each stream adds into its own dU (``U``,
``U1``, ...: no two streams add into one buffer, so the sum stays deterministic), and the inverse filter transform
sums them in stream order after the join; workspace ``36 * 4 * streams * (Co*Ci + Ci*T + Co*T)``.

Point groups (``-g2`` / ``-g3`` / ``-g4`` after the chunk's name, ``extra["winograd"]["groups"]``; where U (dU) is
at least a quarter of the ungrouped workspace: :func:`point_groups`): the call runs its chunks once per group of
36 / G transform-domain points, U (dU), V and M (Z) holding one group's points.  Why: U is ``36 * Co * Ci`` floats
whatever the chunk, so under a tight limit a large-channel layer's chunks are short.  Backward filter (one or two
streams, 2-4 groups): each chunk reads and writes all of dU for little work (VGG-16 conv4_2 b64 at 64 MiB: 192-tile
chunks, 2.23 ms against 1.77 in one chunk); a group's dU is 1/G of it, so its chunks hold about G times the tiles,
at the price of reading and transforming x and dy once per group (conv4_2 in chunks of 8 images on two streams:
1.57 ms in one group, 1.82 in two); each group's inverse transform adds into dw.  Workspace ``36 / G * 4 * streams
* (Co*Ci + Ci*T + Co*T)``.  Forward and backward data (up to three streams, 2 or 3 groups, unsliced): each group
transforms its points of the filter once per call, reads the input once, and its output transform adds its share
A^T M_g A into y (the transform is linear in M's points; beta 1 after the first group): VGG-16 conv4_2's U is 36 MiB
of a 64 MiB limit, leaving its chunks 64 tiles on three streams; in two groups U is 18 MiB and the chunks about
three times longer.  Workspace ``36 / G * 4 * (Co*Ci + streams * (Ci*T + Co*T))``.

Split reductions (``-k2`` / ``-k4`` / ``-k8`` after the chunk's name, before ``-p``,
``extra["winograd"]["ksplit"]``; backward filter of narrow layers, without point groups: :func:`ksplits`): each
chunk's tiles in S parts, the transforms storing part s as its own V / Z block (the last part padded with zero
tiles) and one GEMM of 36 x S products adding part s into dU copy s, the inverse transform summing the S copies of
every stream.  Why: the GEMMs' outputs are only Co x Ci a point, so for 64- and 128-channel layers cuBLAS runs a few
hundred small blocks with long loops over the tiles (VGG-16 conv1_2: 32 x 32 blocks, 117 us for a 3584-tile chunk,
43 us split in 8; the whole call 5.31 -> 4.19 ms at S = 4 composed from separate launches:
``benchmarks/results/wino_bwf_levers-64MiB.md``).  Workspace ``36 * 4 * streams * (S*Co*Ci + Ci*T' + Co*T')``,
T' = T rounded up to S parts.

Fused (``wino-f4-fused``, ``extra["winograd"]["fused"]``; forward and backward data, sm_90): one kernel
(``wino_fused``) transforms its tiles into shared memory and keeps the 36 points' products in registers, so the
workspace is U alone (``36 * 4 * Cp * Kp`` bytes, channels padded to the kernel's blocks: 0.56 MiB for 64 channels,
36 MiB for 512) whatever the micro-batch, and nothing is chunked.  Labelled ``FMA`` under every numerics (its
products are FP32 FFMA).  Measured on the H200 (``benchmarks/results/wino_fused.md``) it is 0.38-0.91x the 64 MiB
chunks on VGG-16 / ResNet-50 / AlexNet layers (register-bound: one block of 9 warps per SM); it is measured as one
more row, for limits and few-channel layers where the chunks lose more.

Layouts: NCHW (V, M channel-major) and NHWC (channel-minor).  Tensors are addressed through strides, so a channel
slice's y / dy view (``ConvProblem.y_strides``) runs as well; ``channel_slices`` stays False (the benchmark does not
offer slices to this source: chunk variants already multiply its rows).
"""
from __future__ import annotations

import re
from typing import Any, Callable

from ...binding import cublas
from ...errors import InputError, UcudnnError
from ...planning.table import Measurement, Skipped
from ...problem import ConvProblem
from .base import BenchSettings, Launch, Operands, Prepared, Pruner, measured_or_skipped, timed_beta
from .mec import _Scalars, compute_for
from .streams import StreamSet as _StreamSet

ALGO = "wino-f4"
#: the fused kernel's configuration (forward and backward data): one kernel, only U in the workspace
FUSED_ALGO = "wino-f4-fused"
#: the constants 1 and 0 the GEMMs scale by, as host scalars (mec's; host pointer mode: cuBLAS reads them at
#: enqueue, so they live as long as the module -- a launch's local array would be freed when prepare returns)
_CONSTANTS = _Scalars.new()


def problem_refusal(problem: ConvProblem, op: str) -> str | None:
    """Why the winograd source does not run ``op`` of ``problem`` (None: it does)."""
    from ucudnn.kernels.winograd import refusal

    return refusal(problem, op)


def algo_name(chunk: int, n: int) -> str:
    """The recorded algorithm of chunks of ``chunk`` images at micro-batch ``n``."""
    return ALGO if chunk >= n else f"{ALGO}-c{chunk}"


def tile_algo_name(tiles: int) -> str:
    """The recorded algorithm of chunks of ``tiles`` tiles."""
    return f"{ALGO}-t{tiles}"


#: the name suffixes of a chunked configuration's variants, in the order its name carries them
_SUFFIXES = (("csplit", "s"), ("groups", "g"), ("ksplit", "k"), ("streams", "p"))
#: every tag a chunked configuration's name may carry -> what it names: the chunk's size, then the variants
_NAMED = {"t": "tiles", "c": "chunk", **{tag: key for key, tag in _SUFFIXES}}
_SUFFIX = re.compile(r"-([" + "".join(_NAMED) + r"])(\d+)")


def configuration_name(chunk: int, n: int, tiles: int | None = None, **variants: int) -> str:
    """The recorded name of a chunked configuration at micro-batch ``n``: :func:`algo_name` or
    :func:`tile_algo_name`, then ``-s<S>`` / ``-g<G>`` / ``-k<K>`` / ``-p<P>`` for the ``csplit`` / ``groups`` /
    ``ksplit`` / ``streams`` above 1 (``wino-f4-t1536-k8-p2``)."""
    unknown = set(variants) - {key for key, _ in _SUFFIXES}
    if unknown:
        raise InputError(f"unknown winograd variants {sorted(unknown)}", "variants")
    name = algo_name(chunk, n) if tiles is None else tile_algo_name(tiles)
    return name + "".join(f"-{tag}{variants[key]}" for key, tag in _SUFFIXES if variants.get(key, 1) > 1)


def configuration_of(algo: str) -> dict[str, int]:
    """What :func:`configuration_name` put in a name: ``tiles`` or ``chunk`` (neither: the whole micro-batch) and
    the variants above 1 (``wino-f4-t1536-k8-p2`` -> tiles 1536, ksplit 8, streams 2); ``InputError`` (field
    ``algo``) for any other name, the fused kernel's included (it runs no chunks)."""
    rest = str(algo)[len(ALGO):] if str(algo).startswith(ALGO) else None
    found = _SUFFIX.findall(rest) if rest is not None else []
    if rest is None or "".join(f"-{tag}{value}" for tag, value in found) != rest:
        raise InputError(f"not a chunked winograd configuration: {algo!r}", "algo")
    return {_NAMED[tag]: int(value) for tag, value in found}


def _named(config: Measurement) -> dict[str, int]:
    """What a recorded configuration's name says (:func:`configuration_of`), or nothing for a name that is not a
    chunked configuration's: the fallback of every reader below where ``extra.winograd`` does not say."""
    try:
        return configuration_of(str(config.algo))
    except InputError:
        return {}


def tiles_of(config: Measurement) -> int | None:
    """The tile count per chunk of a recorded tile-chunk configuration (its extra, else its algorithm's name
    ``wino-f4-t<T>...``); None for whole-image chunks."""
    info = config.extra.get("winograd") or {}
    tiles = info["tiles"] if "tiles" in info else _named(config).get("tiles")   # the name parsed only when needed
    if tiles is None:
        return None
    if not isinstance(tiles, int) or tiles < 1:
        raise InputError(f"tiles must be a positive integer, got {tiles!r}", "tiles")
    return tiles


def _choice(config: Measurement, key: str, allowed: tuple[int, ...]) -> int:
    """``extra.winograd.<key>`` of a recorded configuration (else what its name says), one of ``allowed`` (1 where
    neither says)."""
    info = config.extra.get("winograd") or {}
    value = info[key] if key in info else _named(config).get(key, 1)   # the name parsed only when needed
    if value not in allowed or isinstance(value, bool):
        raise InputError(f"{key} must be one of {allowed}, got {value!r}", f"extra.winograd.{key}")
    return value


def csplit_of(config: Measurement) -> int:
    """The input-channel slices a recorded configuration runs (``extra.winograd.csplit``; 1 where absent)."""
    from ucudnn.kernels.winograd import CSPLITS

    return _choice(config, "csplit", CSPLITS)


def csplits(geo: Any, op: str, tiles: int) -> list[int]:
    """The input-channel slices measured for chunks of ``tiles`` tiles: 1, and 2 and 4 (forward and backward data,
    where they divide the channels) while U is at least a quarter of the unsplit workspace -- where it is less, a
    slice saves little and pays its transforms again."""
    from ucudnn.kernels.winograd import CSPLITS

    if op == "backward_filter" or 3 * geo.co * geo.ci < (geo.ci + geo.co) * tiles:
        return [1]
    return [cs for cs in CSPLITS if geo.ci % cs == 0]


def groups_of(config: Measurement) -> int:
    """The point groups a recorded backward-filter configuration runs (``extra.winograd.groups``; 1 where
    absent)."""
    from ucudnn.kernels.winograd import POINT_GROUPS

    return _choice(config, "groups", POINT_GROUPS)


def point_groups(geo: Any, op: str, tiles: int, streams: int = 1, csplit: int = 1) -> list[int]:
    """The point groups measured for chunks of ``tiles`` tiles on ``streams`` streams: 1, and more where U (dU) is
    at least a quarter of the ungrouped workspace (the rule :func:`csplits` uses) -- where it is less, a group saves
    little workspace and reads the input again -- for chunks of at least ``TILE_CHUNK_ALIGN`` tiles (a group exists
    to make chunks longer; below it they are parts of a tile row), unsliced.  Backward filter: 2, 3 and 4 on one or
    two streams.  Why these cuts: on the H200's VGG-16 b64 table (``table_ablation --drop-groups``) every group
    count is in some plan from 16 to 64 MiB (32 MiB: 65.8 -> 59.2 ms planned; 48 MiB 54.3 -> 52.7; 64 MiB 48.5 ->
    48.3), but offering them wherever dU is an eighth of the workspace and on three streams as well measured 4092
    grouped rows there (backward filter's benchmark 23.5 -> 69.8 s); the quarter and two streams keep 2208 of them
    and plan within 0.4% of all of them at every limit, and the 64-tile floor leaves out 930 more with the same
    plans at 16, 32 and 64 MiB (AlexNet b256 and ResNet-50 b128 tables: 756 and 879 rows left out, plans the same).
    Forward and backward data: 2 and 3 on up to three streams (their 64 MiB plans run three: VGG-16 conv4_2's
    64-tile chunks, U 36 MiB of the 63), while U is a quarter of the ungrouped workspace on that many streams (each
    stream holds its own V and M); four groups would read the input and add into the output four times.  On the
    H200's VGG-16 b64 and AlexNet b256 tables (``table_ablation_winograd-forward-groups-offered.md``) counting the
    streams leaves out a third of the grouped rows (VGG-16 2356 -> 1588; the winograd rows' recorded time 12887 ->
    12164 ms, AlexNet 3549 -> 3271) with the same WR plans from 8 MiB to 4 GiB."""
    from ucudnn.kernels.winograd import POINT_GROUPS, TILE_CHUNK_ALIGN

    held = 1 if op == "backward_filter" else streams   # V and M copies beside U (bwf: a dU per stream as well)
    if (tiles < TILE_CHUNK_ALIGN or csplit > 1 or 3 * geo.co * geo.ci < held * (geo.ci + geo.co) * tiles
            or (op == "backward_filter" and streams > 2)):
        return [1]
    return list(POINT_GROUPS) if op == "backward_filter" else [g for g in POINT_GROUPS if g <= FORWARD_GROUPS]


#: the most point groups forward and backward data are measured with (:func:`point_groups`)
FORWARD_GROUPS = 3


def is_fused(config: Measurement) -> bool:
    """Whether a recorded configuration runs the fused kernel (``extra.winograd.fused``, else its algorithm's
    name)."""
    info = config.extra.get("winograd") or {}
    return bool(info.get("fused", str(config.algo) == FUSED_ALGO))


def _launch_fused(problem: ConvProblem, op: str) -> Launch:
    """The fused launch of ``op`` at ``problem.n``: U in the fused layout, then one wino_fused over the call."""
    from ucudnn.kernels.winograd import Geometry, fused_launchers, fused_refusal, fused_workspace_bytes

    geo = Geometry.of(problem, op)
    why = fused_refusal(geo, problem.n)
    if why:
        raise InputError(f"winograd cannot run {op} of {problem.describe()} fused: {why}", "problem")
    filter_, conv_ = fused_launchers(geo)
    need, n, forward = fused_workspace_bytes(geo), problem.n, op == "forward"

    def launch(ops: Operands, workspace: int, workspace_bytes: int, alpha: float, beta: float) -> None:
        if workspace_bytes < need:
            raise UcudnnError(f"winograd {op} (fused) needs {need} bytes of workspace, got {workspace_bytes}")
        w, x, y = (ops.b, ops.a, ops.out) if forward else (ops.a, ops.b, ops.out)
        filter_(w, workspace)
        conv_(x, workspace, y, n, alpha, beta)

    return launch


def streams_of(config: Measurement) -> int:
    """The streams a recorded configuration spreads its chunks over (``extra.winograd.streams``; 1 where
    absent)."""
    from ucudnn.kernels.winograd import STREAMS

    return _choice(config, "streams", STREAMS)


def ksplit_of(config: Measurement) -> int:
    """The parts a recorded backward-filter configuration splits its chunks' reduction into
    (``extra.winograd.ksplit``; 1 where absent)."""
    from ucudnn.kernels.winograd import KSPLITS

    return _choice(config, "ksplit", KSPLITS)


def variants() -> dict[str, Callable[[Measurement], int]]:
    """The source's optional configuration variants by name, each read from a recorded row (1: the row runs
    without it; rows of other sources read 1): what an ablation names to plan without one (``channel_wr.py
    --without winograd:groups``, ``table_ablation.py --drop winograd:ksplit``)."""
    return {"slices": csplit_of, "streams": streams_of, "groups": groups_of, "ksplit": ksplit_of}


#: a split reduction is offered while the parts' products number at most this many outputs (Co * Ci * S: VGG-16's
#: 64 x 64 layers in 8 parts, 128 x 128 in 2) and each part holds at least KSPLIT_MIN_TILES tiles
KSPLIT_OUTPUTS = 1 << 15
KSPLIT_MIN_TILES = 128


def ksplits(geo: Any, op: str, tiles: int, streams: int = 1, groups: int = 1) -> list[int]:
    """The reduction splits measured for backward-filter chunks of ``tiles`` tiles: 1, and for narrow layers (Co x Ci
    at most KSPLIT_OUTPUTS / 2) the largest S of KSPLITS with Co * Ci * S at most KSPLIT_OUTPUTS and at least
    KSPLIT_MIN_TILES tiles a part, where the geometry allows it (:meth:`ucudnn.kernels.winograd.Geometry.
    ksplit_refusal`).  One S, not every one: each doubles the layer's backward-filter rows."""
    from ucudnn.kernels.winograd import KSPLITS

    if op != "backward_filter" or groups > 1:
        return [1]
    fit = [k for k in KSPLITS if k > 1 and geo.co * geo.ci * k <= KSPLIT_OUTPUTS and tiles >= k * KSPLIT_MIN_TILES
           and geo.ksplit_refusal(k, streams, groups) is None]
    return [1] + fit[-1:]


def stream_counts(op: str, chunks: int, csplit: int) -> list[int]:
    """The stream counts measured for a call of ``chunks`` chunks: 1, and 2 and 3 (unsliced, where the call has
    that many chunks).  Why: a chunk's transforms are memory-bound and its GEMMs compute-bound, so chunks on two or
    three streams overlap them; at the same workspace (each stream a V and M of half or a third the tiles) measured
    on the H200 (VGG-16 b64 forward, 64 MiB): conv1_2 4.14 -> 3.76 ms, conv3_2 2.13 -> 1.73, conv4_2 1.96 -> 1.76
    on three streams, ResNet-50's 64-channel 3x3 0.66 -> 0.53.  Backward filter too, each stream adding into its
    own dU: its GEMMs make only Co x Ci outputs per point (VGG-16's 256 x 256: 144 blocks of 128 x 128 for 132
    SMs), so one stream's GEMM leaves SMs idle that another stream's fills."""
    from ucudnn.kernels.winograd import STREAMS

    if csplit > 1:
        return [1]
    return [s for s in STREAMS if s <= chunks]


def chunk_of(config: Measurement, n: int) -> int:
    """The chunk size a recorded configuration runs (its extra, else its algorithm's name), at most ``n``."""
    info = config.extra.get("winograd") or {}
    chunk = info.get("chunk")
    if chunk is None:
        named = _named(config)
        if (not named and str(config.algo) != ALGO) or "tiles" in named:
            raise InputError(f"winograd records {ALGO}[-c<chunk>|-t<tiles>][-s|-g|-k|-p<n>] image chunks here, got "
                             f"{config.algo!r}", "algo")
        chunk = named.get("chunk", n)
    if not isinstance(chunk, int) or chunk < 1:
        raise InputError(f"chunk must be a positive integer, got {chunk!r}", "chunk")
    return min(chunk, n)


def _launch(problem: ConvProblem, op: str, chunk: int, compute: str, tiles: int | None = None,
            csplit: int = 1, streams: int = 1, groups: int = 1, ksplit: int = 1) -> Launch:
    """The launch of ``op`` at ``problem.n`` in chunks of ``chunk`` images, or of ``tiles`` tiles when given; forward
    and backward data with their input channels in ``csplit`` slices (each slice's filter and input transformed per
    chunk, its GEMM adding into M after the first), or with their chunks over ``streams`` streams; backward filter
    with its points in ``groups`` groups or its chunks' reduction in ``ksplit`` parts."""
    from ...binding.gpu import cupy
    from ucudnn.kernels.winograd import Geometry

    geo = Geometry.of(problem, op)
    if tiles is not None:
        tiles = min(tiles, problem.n * geo.tiles_per_image)
    why = geo.chunk_refusal(chunk, tiles, problem.n, ksplit)
    if why:
        raise InputError(f"winograd cannot run {op} of {problem.describe()}: {why}", "chunk")
    why = geo.ksplit_refusal(ksplit, streams, groups)
    if why:
        raise InputError(why, "extra.winograd.ksplit")
    if csplit > 1 and streams > 1:
        raise InputError("input-channel slices run on one stream", "extra.winograd.streams")
    if csplit > 1 and groups > 1:
        raise InputError("input-channel slices run without point groups", "extra.winograd.groups")
    cp = cupy()   # after the refusals: a configuration that cannot run is refused without a GPU
    if op == "backward_filter":
        return _launch_backward_filter(cp, geo, problem.n, chunk, compute, tiles, streams, groups, ksplit)
    if streams > 1 or groups > 1:
        return _launch_streams(cp, geo, op, problem.n, chunk, compute, tiles, streams, groups)
    from ucudnn.kernels.winograd import launchers

    part = geo.slice(csplit)
    filter_, input_, _ = launchers(part)
    output_ = launchers(geo)[2]
    need = geo.workspace_bytes(chunk, tiles, csplit)
    offsets = {name: off for name, off, _ in geo.segments(chunk, tiles, csplit)}
    chunks = geo.ranges(problem.n, chunk, tiles)     # (first tile, tiles): x / y stay at image 0
    what = f"chunks of {chunk} images" if tiles is None else f"chunks of {tiles} tiles"
    if csplit > 1:
        what += f", input channels in {csplit} slices"
    gemms = {(count, s > 0): _gemm_call(part, count, compute, accumulate=s > 0)
             for _, count in chunks for s in range(csplit)}
    # each slice's first filter and input element, in bytes from the tensors' (float32)
    moves = [tuple(4 * e for e in geo.slice_offsets(csplit, s)) for s in range(csplit)]
    forward = op == "forward"

    def launch(ops: Operands, workspace: int, workspace_bytes: int, alpha: float, beta: float) -> None:
        if workspace_bytes < need:
            raise UcudnnError(f"winograd {op} ({what}) needs {need} bytes of workspace, got {workspace_bytes}")
        w, x, y = (ops.b, ops.a, ops.out) if forward else (ops.a, ops.b, ops.out)
        bufs = {name: workspace + off for name, off in offsets.items()}
        h, stream = cublas.handle(), cp.cuda.get_current_stream().ptr
        cublas.bind(h, stream)
        if csplit == 1:
            filter_(w, bufs["U"], stream)
        for t0, count in chunks:
            for s, (dw, dx) in enumerate(moves):
                if csplit > 1:
                    filter_(w + dw, bufs["U"], stream)
                input_(x + dx, bufs["V"], t0, count, stream)
                gemms[(count, s > 0)](h, bufs)
            output_(bufs["M"], y, t0, count, alpha, beta, stream)

    return launch


def _launch_streams(cp: Any, geo: Any, op: str, n: int, chunk: int, compute: str, tiles: int | None,
                    streams: int, groups: int = 1) -> Launch:
    """Forward or backward data with chunk i on stream i % ``streams`` (the caller's stream and
    :func:`ucudnn.binding.gpu.side_stream` 1, 2), each stream in its own V and M and with its own cuBLAS handle:
    one chunk's transforms (memory-bound) run beside another's GEMMs (compute-bound).  The side streams wait for the
    filter transform on the caller's stream and the caller's stream waits for them at the end, so the call is one
    stream's work to its caller and to a CUDA graph capture.  With ``groups`` > 1 all of that once per group of
    transform-domain points (:meth:`ucudnn.kernels.winograd.Geometry.points`: U, V and M one group's size), each
    group's output transform adding into y (beta 1 after the first group); a group's filter transform waits for
    the previous group's chunks (they read U)."""
    from ucudnn.kernels.winograd import launchers

    filter_, input_, output_ = launchers(geo, groups=groups)
    need = geo.workspace_bytes(chunk, tiles, 1, streams, groups)
    offsets = {name: off for name, off, _ in geo.segments(chunk, tiles, 1, streams, groups)}
    chunks = geo.ranges(n, chunk, tiles)
    gemms = {count: _gemm_call(geo, count, compute, groups=groups) for _, count in chunks}
    names = [geo.stream_buffers(k) for k in range(streams)]
    fan = _StreamSet(cp, streams)
    forward = op == "forward"
    what = (f"chunks of {chunk} images" if tiles is None else f"chunks of {tiles} tiles") + (
        f" on {streams} streams" if streams > 1 else "") + (f", points in {groups} groups" if groups > 1 else "")

    def launch(ops: Operands, workspace: int, workspace_bytes: int, alpha: float, beta: float) -> None:
        if workspace_bytes < need:
            raise UcudnnError(f"winograd {op} ({what}) needs {need} bytes of workspace, got {workspace_bytes}")
        w, x, y = (ops.b, ops.a, ops.out) if forward else (ops.a, ops.b, ops.out)
        main = cp.cuda.get_current_stream()
        bufs = [{key: workspace + offsets[name] for key, name in nm.items()} for nm in names]
        for g in range(groups):
            scale = beta if g == 0 else 1.0
            filter_(w, bufs[0]["U"], main.ptr, g)
            ptrs = [st.ptr for st in fan.fork(main)]
            for i, (t0, count) in enumerate(chunks):   # each launch names its stream: no stream context a chunk
                k = i % streams
                input_(x, bufs[k]["V"], t0, count, ptrs[k], g)
                gemms[count](fan.handles[k], bufs[k])
                output_(bufs[k]["M"], y, t0, count, alpha, scale, ptrs[k], g)
            fan.join(main)

    return launch


def _gemm_call(geo: Any, count: int, compute: str, accumulate: bool = False,
               groups: int = 1, ksplit: int = 1) -> Callable[[int, dict[str, int]], None]:
    """``call(handle, buffers)``: the cublasGemmStridedBatchedEx of a chunk of ``count`` tiles as ``geo.gemm``
    describes it (operands by workspace buffer name, its alpha and beta as host constants; one point group's
    products with ``groups``, every part's with ``ksplit``)."""
    gm = geo.gemm(0, count, accumulate, groups, ksplit)
    cm = gm.column_major()
    ta, tb = cublas.OPERATIONS[cm["transa"]], cublas.OPERATIONS[cm["transb"]]
    dtype, ctype = cublas.DATA_TYPES["float32"], cublas.COMPUTE_TYPES[compute]
    alpha, beta = _CONSTANTS.ptr(gm.alpha, 0), _CONSTANTS.ptr(gm.beta, 1)
    m, n, k, lda, sa, ldb, sb, ldc, sc, batch = (cm[key] for key in ("m", "n", "k", "lda", "strideA", "ldb",
                                                                     "strideB", "ldc", "strideC", "batchCount"))
    (an, ao), (bn, bo), (cn, co) = cm["A"], cm["B"], cm["C"]

    def call(h: int, bufs: dict[str, int]) -> None:
        cublas.gemm_strided_batched(h, ta, tb, m, n, k, alpha, bufs[an] + 4 * ao, dtype, lda, sa, bufs[bn] + 4 * bo,
                                    dtype, ldb, sb, beta, bufs[cn] + 4 * co, dtype, ldc, sc, batch, ctype)

    return call


def _launch_backward_filter(cp: Any, geo: Any, n: int, chunk: int, compute: str, tiles: int | None,
                            streams: int = 1, groups: int = 1, ksplit: int = 1) -> Launch:
    """Backward filter of ``geo``'s problem at its micro-batch: per chunk V, Z and dU (+)= Z V^T, then dw once.
    With ``streams`` > 1, chunk i on stream i % streams adding into that stream's own dU (its first chunk
    overwriting), and the inverse transform summing them on the caller's stream after the join.  With ``groups``
    > 1 all of that once per group of transform-domain points (V, Z and dU one group's size), each group's inverse
    transform adding into dw (beta 1 after the first group).  With ``ksplit`` > 1 each chunk's tiles in that many
    parts, each adding into its own copy of the stream's dU (one GEMM for all parts), all copies summed by the
    inverse transform."""
    from ucudnn.kernels.winograd import backward_filter_launchers

    input_, dy_, grad_ = backward_filter_launchers(geo, 4, groups, ksplit=ksplit)
    need = geo.workspace_bytes(chunk, tiles, 1, streams, groups, ksplit)
    offsets = {name: off for name, off, _ in geo.segments(chunk, tiles, 1, streams, groups, ksplit)}
    names = [geo.stream_buffers(k) for k in range(streams)]
    ranges = geo.ranges(n, chunk, tiles)
    # a stream's GEMM overwrites its dU on its first chunk and adds to it after (geo.gemm's beta)
    steps = [(t0, count, i % streams, _gemm_call(geo, count, compute, accumulate=i >= streams, groups=groups,
                                                 ksplit=ksplit))
             for i, (t0, count) in enumerate(ranges)]
    parts, stride = geo.partials(streams, len(ranges), groups, ksplit)
    fan = _StreamSet(cp, streams) if streams > 1 else None
    what = (f"chunks of {chunk} images" if tiles is None else f"chunks of {tiles} tiles") + (
        f" on {streams} streams" if streams > 1 else "") + (f", points in {groups} groups" if groups > 1 else "") + (
        f", reductions in {ksplit} parts" if ksplit > 1 else "")

    def launch(ops: Operands, workspace: int, workspace_bytes: int, alpha: float, beta: float) -> None:
        if workspace_bytes < need:
            raise UcudnnError(f"winograd backward_filter ({what}) needs {need} bytes of workspace, "
                              f"got {workspace_bytes}")
        x, dy, dw = ops.a, ops.b, ops.out
        bufs = [{key: workspace + offsets[name] for key, name in nm.items()} for nm in names]
        main = cp.cuda.get_current_stream()
        if fan is None:   # one stream: the caller's, with CuPy's handle
            handles, ptrs = [cublas.handle()], [main.ptr]
            cublas.bind(handles[0], main.ptr)
        for g in range(groups):
            if fan is not None:   # each group's chunks start after the previous group's inverse transform
                ptrs, handles = [st.ptr for st in fan.fork(main)], fan.handles
            for t0, count, k, gemm in steps:
                input_(x, bufs[k]["V"], t0, count, ptrs[k], g)
                dy_(dy, bufs[k]["M"], t0, count, ptrs[k], g)
                gemm(handles[k], bufs[k])
            if fan is not None:
                fan.join(main)
            grad_(bufs[0]["U"], dw, alpha, beta if g == 0 else 1.0, parts, stride, g)

    return launch


#: the most chunks one call runs (see the module doc: more is measured as smaller micro-batches)
MAX_CHUNKS = 64


class WinogradSource(Prepared):
    """Winograd F(4x4, 3x3) on ucudnn's transform kernels and cuBLAS (see the module doc)."""

    name = "winograd"
    channel_slices = False

    def measure(self, op: str, problem: ConvProblem, ops: Operands, workspace: int,
                settings: BenchSettings) -> tuple[list[Measurement], list[Skipped]]:
        return measured_or_skipped("winograd", problem.n, lambda: problem_refusal(problem, op),
                                   lambda: self._measure(op, problem, ops, workspace, settings))

    def _measure(self, op: str, problem: ConvProblem, ops: Operands, workspace: int,
                 settings: BenchSettings) -> tuple[list[Measurement], list[Skipped]]:
        from ucudnn.kernels.winograd import Geometry, chunk_sizes, tile_chunk_sizes

        mb = problem.n
        compute, label = cublas.compute_type(settings.numerics, problem.dtype)
        geo = Geometry.of(problem, op)
        beta = timed_beta(op, problem)
        pruner = Pruner(settings, trust_long=False)
        measured: list[Measurement] = []
        skipped: list[Skipped] = []
        tpi = geo.tiles_per_image
        # (tiles per chunk, images per chunk (0 for a tile chunk), tiles (None for an image chunk), chunks a call),
        # largest first: usually the fastest
        sizes = [(c * tpi, c, None) for c in chunk_sizes(mb)] + [(t, 0, t) for t in tile_chunk_sizes(geo, mb)]
        variants = sorted(((t, c, tl, len(geo.ranges(mb, c, tl))) for t, c, tl in sizes), reverse=True,
                          key=lambda v: v[0])
        # calls of more than MAX_CHUNKS chunks are measured at the smaller micro-batches only
        runs = ((t, c, tl, n, cs, st, gr, ks) for t, c, tl, n in variants if n <= MAX_CHUNKS
                for cs in csplits(geo, op, t) for st in stream_counts(op, n, cs)
                for gr in point_groups(geo, op, t, st, cs)
                for ks in ksplits(geo, op, t, st, gr))
        if op != "backward_filter":
            row = self._measure_fused(op, problem, geo, ops, workspace, beta, settings, pruner)
            (measured if isinstance(row, Measurement) else skipped).append(row)  # type: ignore[arg-type]
        for _, chunk, tiles, n_chunks, csplit, streams, groups, ksplit in runs:
            algo = configuration_name(chunk, mb, tiles, csplit=csplit, groups=groups, ksplit=ksplit, streams=streams)
            ws = geo.workspace_bytes(chunk, tiles, csplit, streams, groups, ksplit)
            why = geo.chunk_refusal(chunk, tiles, mb, ksplit)
            if why:
                skipped.append(Skipped(mb, algo, label, f"winograd: {why}"))
                continue
            if ws > settings.max_workspace:
                skipped.append(Skipped(mb, algo, label, f"winograd: needs {ws} bytes, over the benchmark cap"))
                continue
            info: dict[str, Any] = {"tile": "F(4x4,3x3)", "chunks": n_chunks,
                                    "compute": compute, "layout": problem.layout,
                                    "filter_transform": ("inverse, once per call" if op == "backward_filter"
                                                         else "once per call")}
            if csplit > 1:
                info.update(csplit=csplit, filter_transform="per chunk and input-channel slice")
            if streams > 1:
                info["streams"] = streams
            if groups > 1:
                info.update(groups=groups, points_per_group=geo.points(groups))
            if ksplit > 1:
                info["ksplit"] = ksplit
            if tiles is None:
                info["chunk"] = chunk
            else:
                rows = tiles // geo.tiles_w if tiles % geo.tiles_w == 0 else tiles / geo.tiles_w
                info.update(tiles=tiles, tile_rows=rows)
            config = Measurement(mb, algo, label, 0.0, ws, self.name, None, {"winograd": info, "deterministic": True})
            row = self.time_prepared(op, problem, config, ops, workspace, beta, settings, pruner)
            (measured if isinstance(row, Measurement) else skipped).append(row)  # type: ignore[arg-type]
        return measured, skipped

    def _measure_fused(self, op: str, problem: ConvProblem, geo: Any, ops: Operands, workspace: int, beta: float,
                       settings: BenchSettings, pruner: Pruner) -> Measurement | Skipped:
        """The fused kernel's row: FP32 FFMA whatever the numerics (so labelled ``FMA``, which every float32
        numerics allows), its workspace U alone."""
        from ucudnn.kernels.winograd import fused_refusal, fused_workspace_bytes

        mb, ws = problem.n, fused_workspace_bytes(geo)
        why = fused_refusal(geo, mb)   # a device under sm_90: prepare refuses, time_prepared records why
        if why is None and ws > settings.max_workspace:
            why = f"needs {ws} bytes, over the benchmark cap"
        if why:
            return Skipped(mb, FUSED_ALGO, "FMA", f"winograd: {why}")
        info = {"tile": "F(4x4,3x3)", "fused": True, "compute": "FFMA in the kernel", "layout": problem.layout,
                "filter_transform": "once per call"}
        config = Measurement(mb, FUSED_ALGO, "FMA", 0.0, ws, self.name, None, {"winograd": info,
                                                                               "deterministic": True})
        return self.time_prepared(op, problem, config, ops, workspace, beta, settings, pruner)

    def prepare(self, op: str, problem: ConvProblem, config: Measurement) -> Launch:
        why = problem_refusal(problem, op)
        if why:
            raise InputError(f"winograd cannot run {op} of {problem.describe()}: {why}", "problem")
        if is_fused(config):
            return _launch_fused(problem, op)
        compute = compute_for(config.math_type, problem.dtype)
        tiles, csplit, streams, groups = tiles_of(config), csplit_of(config), streams_of(config), groups_of(config)
        ksplit = ksplit_of(config)
        if tiles is not None:
            return _launch(problem, op, 0, compute, tiles, csplit, streams, groups, ksplit)
        return _launch(problem, op, chunk_of(config, problem.n), compute, csplit=csplit, streams=streams,
                       groups=groups, ksplit=ksplit)
