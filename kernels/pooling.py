"""2-D max / average pooling, forward and backward, on CuPy arrays in NCHW, CHWN or NHWC.

    y = pool2d_forward(x, window=3, stride=2, pad=0, mode="max", layout="CHWN")
    y, idx = pool2d_forward(x, 3, 2, 0, return_indices=True)
    dx = pool2d_backward(dy, x, 3, 2, 0, mode="max", indices=idx)   # or recompute: indices=None

``x`` is ``(N, C, H, W)`` for NCHW and ``(C, H, W, N)`` for CHWN; the output
keeps the layout.  NHWC ``(N, H, W, C)`` runs the CHWN kernels: pooling treats
the batch and the channels alike (independent planes), so an NHWC tensor *is*
a CHWN one with the two roles swapped (channels innermost and vectorised,
samples outermost); indices are the same ``h * W + w``.  The output with ``P = (H + 2 pad - window) // stride + 1`` (cuDNN's
floor rule).  ``mode="avg"`` divides by the window size when
``count_include_pad`` (cuDNN's AVERAGE_COUNT_INCLUDE_PADDING) and by the
in-bounds count otherwise.  Max indices are int32 ``h * W + w`` within the
(n, c) plane; ties go to the first maximum in row-major window order.

Each forward thread computes OP x OQ outputs (thread coarsening).  The
factors come from ``coarsening=`` if given, else from the tuning cache for
this shape and device, else -- with ``tune=True``, the default -- from a
hill-climbing search run on this call's own input (autotune.py) and cached;
the search also decides whether the NCHW kernel pipelines its chunks
(cp.async into double-buffered shared memory).  Each candidate is timed over
a batch of back-to-back launches (``ucudnn.binding.timing.time_ms`` with
``min_sample_ms``), so host launch latency does not sway the choice.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ucudnn.errors import InputError

from . import _compile, autotune

SOURCE = "pooling.cu"
DTYPES = {"float32": "float", "float16": "half_t"}
LAYOUTS = ("NCHW", "CHWN")
MODES = ("max", "avg")
NT = 256
# Input elements an NCHW block stages (24 KiB of float32): several blocks per SM keep loads in flight
# while others compute, and each block's compute phase stays short.
SMEM_BUDGET_ELEMS = 6144
SMEM_LIMIT = 48 * 1024
COARSEN_LIMITS = ((1, 4), (1, 4))
# The climb may skip a factor: an even OQ puts a warp's neighbouring threads an even number of 4-byte words
# apart in shared memory for stride-2 windows of float16 (2-way bank conflicts), so 1x2 can lose to 1x1 while
# 1x3 wins (measured on the H100, float16 PL8: 1x1 80 us, 1x2 76 us, 1x3 69 us; PL5: 1x2 127 us vs 80 us).
COARSEN_STEPS = ((1, 2), (1, 2))
PIPELINE_MIN_CC = 80  # cp.async
ASYNC_STAGE = False  # unpipelined NCHW chunks staged through registers unless the auto-tuner picks cp.async
ASYNC_STAGE_BYTES = 24 * 1024  # the chunk the auto-tuner's cp.async staging option stages
TUNE_SAMPLE_MS = 1.0  # each auto-tuner sample times this much back-to-back work
TUNE_FINALISTS, TUNE_ROUNDS = 3, 2  # the climb's best three are re-timed twice more, round-robin (autotune.confirm)


def _pair(v: Any, field: str) -> tuple[int, int]:
    t = (v, v) if isinstance(v, int) else tuple(v)
    if len(t) != 2 or not all(isinstance(i, int) for i in t):
        raise InputError(f"expected an int or a pair of ints, got {v!r}", field)
    return t  # type: ignore[return-value]


@dataclass(frozen=True)
class Pool2d:
    """Geometry of one pooling problem (sizes in NCHW terms whatever the layout)."""

    layout: str
    n: int
    c: int
    h: int
    w: int
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int

    @property
    def p(self) -> int:
        return (self.h + 2 * self.ph - self.kh) // self.sh + 1

    @property
    def q(self) -> int:
        return (self.w + 2 * self.pw - self.kw) // self.sw + 1

    def in_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.c, self.h, self.w) if self.layout == "NCHW" else (self.c, self.h, self.w, self.n)

    def out_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.c, self.p, self.q) if self.layout == "NCHW" else (self.c, self.p, self.q, self.n)


def geometry(shape: tuple[int, ...], window: Any, stride: Any, pad: Any, layout: str) -> Pool2d:
    """Validated :class:`Pool2d` for an input of ``shape`` in ``layout`` (NHWC: as CHWN, module doc)."""
    if layout == "NHWC":
        layout = "CHWN"
    if layout not in LAYOUTS:
        raise InputError(f"unknown layout {layout!r}; use one of {', '.join(LAYOUTS)}, NHWC", "layout")
    if len(shape) != 4:
        raise InputError(f"expected a 4-D array in {layout} order, got shape {tuple(shape)}", "x")
    (kh, kw), (sh, sw), (ph, pw) = _pair(window, "window"), _pair(stride, "stride"), _pair(pad, "pad")
    if kh < 1 or kw < 1:
        raise InputError(f"window must be positive, got {(kh, kw)}", "window")
    if sh < 1 or sw < 1:
        raise InputError(f"stride must be positive, got {(sh, sw)}", "stride")
    if not (0 <= ph < kh and 0 <= pw < kw):
        raise InputError(f"pad must be in [0, window), got {(ph, pw)} for window {(kh, kw)}", "pad")
    n, c, h, w = shape if layout == "NCHW" else (shape[3], shape[0], shape[1], shape[2])
    g = Pool2d(layout, n, c, h, w, kh, kw, sh, sw, ph, pw)
    if g.p < 1 or g.q < 1:
        raise InputError(f"window {(kh, kw)} with pad {(ph, pw)} does not fit the input {h}x{w}", "window")
    if max(g.n * g.c * g.h * g.w, g.n * g.c * g.p * g.q) >= 2**31:
        raise InputError("tensors of 2**31 elements or more are not supported", "x")
    return g


def _vector(extent: int, itemsize: int, align: int) -> int:
    v = 16 // itemsize
    while v > 1 and (extent % v or align % (v * itemsize)):
        v //= 2
    return v


@dataclass(frozen=True)
class PoolLaunch:
    """One forward launch.  ``pipelined`` (NCHW): a block pools ``per`` chunks in turn, fetching the next one
    (cp.async, double-buffered shared memory) while it computes the current one; see :func:`spread`."""

    name_expr: str
    grid: int
    smem: int
    args: tuple  # launch-shape integers after (x, y, idx)
    pipelined: bool = False
    chunks: int = 0


def plan_forward(g: Pool2d, dtype: str, mode: str, include_pad: bool, with_indices: bool,
                 coarsening: tuple[int, int], align: int = 256, pipeline: bool = True,
                 stage_bytes: int | None = None, async_stage: bool | None = None) -> PoolLaunch:
    """Kernel instantiation, grid, dynamic shared memory and integer arguments of one forward launch.

    NCHW: the input is cut into chunks (whole planes, or bands of rows of a large plane) of at most
    ``stage_bytes`` (default ``SMEM_BUDGET_ELEMS`` elements, or half of ``SMEM_LIMIT`` when pipelined).
    ``pipeline`` (needs sm_80's cp.async) double-buffers them -- two chunks of shared memory per
    block -- unless one chunk would not fit in half of ``SMEM_LIMIT``; the plan has one chunk per
    block until :func:`spread` gives each block its share of a resident grid.  ``async_stage`` (default
    :data:`ASYNC_STAGE`): an unpipelined chunk is staged with cp.async (16-byte vectors only) instead of
    register loads.
    """
    t = DTYPES[dtype]
    itemsize = 4 if dtype == "float32" else 2
    op, oq = coarsening
    m = 0 if mode == "max" else (1 if include_pad else 2)
    idx = "true" if with_indices and m == 0 else "false"
    head = f"{t},{g.kh},{g.kw},{g.sh},{g.sw},{op},{oq},{m},{idx}"
    if g.layout == "CHWN":
        v = _vector(g.n, itemsize, align)
        mtp, mtq = -(-g.p // op), -(-g.q // oq)
        threads = g.c * mtp * mtq * (g.n // v)
        return PoolLaunch(f"pool_chwn_fwd<{head},{v},{NT}>", -(-threads // NT), 0,
                          (g.c, g.h, g.w, g.n, g.p, g.q, g.ph, g.pw, mtp, mtq))
    v = _vector(16 // itemsize, itemsize, align)  # the kernel aligns its chunk itself: only the pointer matters
    planes = g.n * g.c
    plane_bytes = g.h * g.w * itemsize
    if pipeline:  # two buffers: each chunk at most half the limit (measured: 24 KiB chunks beat 12 KiB for fp16)
        budget = min(stage_bytes if stage_bytes is not None else SMEM_LIMIT, SMEM_LIMIT // 2 - 16)
    else:
        budget = stage_bytes if stage_bytes is not None else SMEM_BUDGET_ELEMS * itemsize
    if plane_bytes <= budget:
        groups = max(1, min(budget // plane_bytes, planes // 1024))  # keep >= ~1024 chunks where possible
        bp, bands = g.p, 1
        chunk = groups * plane_bytes
    else:
        groups = 1
        rows = budget // (g.w * itemsize)
        bp = max(1, (rows - g.kh) // g.sh + 1)
        bands = -(-g.p // bp)
        if bands == 1:
            bp, bands = g.p, 1
        chunk = (g.h if bands == 1 else min(g.h, (bp - 1) * g.sh + g.kh)) * g.w * itemsize
        if chunk + 16 > SMEM_LIMIT:
            raise InputError(f"rows of {g.w} elements are too wide for the NCHW pooling kernel", "x")
    pipeline = pipeline and v * itemsize == 16 and 2 * (chunk + 16) <= SMEM_LIMIT  # cp.async moves 16 bytes
    async_stage = ASYNC_STAGE if async_stage is None else async_stage
    tail = ",true" if async_stage and not pipeline and v * itemsize == 16 else ""
    stage = -(-(chunk // itemsize + v) // v) * v  # elements per buffer: the chunk and its alignment shift
    chunks = -(-planes // groups) * bands
    smem = (2 if pipeline else 1) * stage * itemsize
    return PoolLaunch(f"pool_nchw_fwd<{head},{v},{NT},{'true' if pipeline else 'false'}{tail}>", chunks, smem,
                      (g.h, g.w, g.p, g.q, g.ph, g.pw, groups, bp, bands, planes, chunks, 1, stage), pipeline, chunks)


def spread(launch: PoolLaunch, resident: int) -> PoolLaunch:
    """``launch`` with its chunks dealt out to at most ``resident`` blocks (those the device runs at once).

    Only a pipelined launch gains from several chunks per block (each block's next fetch overlaps its
    compute); one grid wave also leaves no tail of late blocks.
    """
    if not launch.pipelined or resident < 1:
        return launch
    per = max(1, -(-launch.chunks // resident))
    args = launch.args[:11] + (per,) + launch.args[12:]
    return replace(launch, grid=-(-launch.chunks // per), args=args)


def resident_blocks(kernel: Any, threads: int, smem: int) -> int:
    """Blocks of ``kernel`` the current device keeps resident at once (threads, registers, shared memory).

    Deliberately conservative: a grid that assumed one block too many per SM would run a second,
    nearly empty wave.
    """
    cp = _compile.cupy()
    attrs = cp.cuda.Device().attributes
    sms = attrs["MultiProcessorCount"]
    try:
        regs = max(1, int(kernel.num_regs))
        static = int(kernel.shared_size_bytes)
    except Exception:  # noqa: BLE001 - an older CuPy: assume a register-heavy kernel
        regs, static = 64, 0
    warps = -(-threads // 32)
    by_threads = attrs["MaxThreadsPerMultiProcessor"] // threads
    by_regs = (attrs["MaxRegistersPerMultiprocessor"] // (-(-regs // 8) * 8 * 32)) // warps
    per_block_smem = smem + static + 1024  # the runtime reserves 1 KiB per block
    by_smem = attrs["MaxSharedMemoryPerMultiprocessor"] // per_block_smem
    return sms * max(1, min(by_threads, by_regs, by_smem, 32))


def tuning_key(g: Pool2d, dtype: str, mode: str, include_pad: bool, with_indices: bool) -> str:
    # "/4": choices made without re-timing the finalists (or before the climb could skip a factor, the pipelined
    # NCHW forward, batched timing) are stale.
    return (f"pool2d_forward/4 {g.layout} {dtype} n{g.n} c{g.c} h{g.h} w{g.w} k{g.kh}x{g.kw} s{g.sh}x{g.sw} "
            f"p{g.ph}x{g.pw} {mode}{'' if mode == 'max' else ('+pad' if include_pad else '-pad')}"
            f"{' idx' if with_indices and mode == 'max' else ''}")


_resident: dict[tuple[int, str, int], int] = {}


def _launch(cp: Any, launch: PoolLaunch, x: Any, y: Any, idx: Any) -> None:
    import numpy as np

    kernel = _compile.get_kernel(SOURCE, launch.name_expr)
    if launch.pipelined:
        key = (cp.cuda.Device().id, launch.name_expr, launch.smem)
        if key not in _resident:
            _resident[key] = resident_blocks(kernel, NT, launch.smem)
        launch = spread(launch, _resident[key])
    ints = tuple(np.int32(a) for a in launch.args)
    kernel((launch.grid,), (NT,), (x, y, idx if idx is not None else np.uint64(0)) + ints, shared_mem=launch.smem)


def _coarsening(cp: Any, g: Pool2d, x: Any, y: Any, idx: Any, dtype: str, mode: str, include_pad: bool,
                align: int, tune: bool) -> tuple[int, int, int, int]:
    """(OP, OQ, pipelined, cp.async-staged) for this shape on this device: cached, else hill-climbed and cached.

    The NCHW kernel's pipelining is a third coordinate of the climb (0 or 1; fixed at 0 where the
    device or the shape cannot pipeline): which of the two wins depends on the layer (measured on the
    H100: within 5% either way for float32, up to 15% for pipelining float16).  The fourth (0 or 1, NCHW on
    sm_80+): an unpipelined chunk of :data:`ASYNC_STAGE_BYTES` staged with cp.async instead of the default
    chunk through registers -- measured on the H100 (session 6), float16: PL6 (13 x 13 outputs) 84% -> 90% of
    copy at 1x1, but PL5 / PL8 at their best 3x1 93-95% -> 89-90%; float32 PL5 1x1 91% -> 94%.
    """
    with_indices = idx is not None
    key = tuning_key(g, dtype, mode, include_pad, with_indices)
    device = _compile.device_key()
    cached = autotune.lookup(device, key)
    if cached is not None and len(cached["choice"]) == 4:
        return tuple(cached["choice"])  # type: ignore[return-value]
    sm80 = _compile.compute_capability() >= PIPELINE_MIN_CC and g.layout == "NCHW"
    can_pipe = sm80 and plan_forward(g, dtype, mode, include_pad, with_indices, (1, 1), align, True).pipelined
    can_async = sm80 and plan_forward(g, dtype, mode, include_pad, with_indices, (1, 1), align, False,
                                      ASYNC_STAGE_BYTES, True).name_expr.endswith(",true>")
    if not tune:
        return (1, 1, int(can_pipe), 0)
    from ucudnn.binding.timing import time_ms

    def measure(f: tuple[int, ...]) -> float:
        plan = plan_forward(g, dtype, mode, include_pad, with_indices, f[:2], align, bool(f[2]),  # type: ignore
                            ASYNC_STAGE_BYTES if f[3] else None, bool(f[3]))
        # A batch of back-to-back launches per sample (>= TUNE_SAMPLE_MS): a single launch between two
        # events also times the host's launch latency, which made choices flip between runs.
        return time_ms(lambda: _launch(cp, plan, x, y, idx), repeat=7, warmup=2, min_sample_ms=TUNE_SAMPLE_MS)

    limits = COARSEN_LIMITS + ((0, 1 if can_pipe else 0), (0, 1 if can_async else 0))
    choice, times = autotune.hill_climb(measure, (1, 1, 0, 0), limits, COARSEN_STEPS + ((1,), (1,)))
    choice, medians = autotune.confirm(measure, times, top=TUNE_FINALISTS, rounds=TUNE_ROUNDS)
    autotune.record(device, key, choice, {**times, **medians})
    return choice  # type: ignore[return-value]


def pool2d_forward(x: Any, window: Any, stride: Any = None, pad: Any = 0, mode: str = "max", layout: str = "NCHW",
                   count_include_pad: bool = True, return_indices: bool = False, out: Any = None,
                   coarsening: tuple[int, int] | None = None, tune: bool = True, pipeline: bool | None = None,
                   stage_bytes: int | None = None, async_stage: bool | None = None) -> Any:
    """Pooled ``x``; with ``return_indices`` (max only) also the int32 argmax of every output.

    ``pipeline`` / ``stage_bytes`` (NCHW; benchmarks and tests compare variants with them): force the
    double-buffered kernel on or off (default: the auto-tuner's choice, or on where the device has
    cp.async when ``coarsening`` is given), set the bytes per staged chunk, and stage an unpipelined
    chunk with cp.async (``async_stage``, see :func:`plan_forward`).
    """
    if mode not in MODES:
        raise InputError(f"unknown mode {mode!r}; use one of {', '.join(MODES)}", "mode")
    if return_indices and mode != "max":
        raise InputError("indices exist for max pooling only", "return_indices")
    x = _compile.as_cupy(x, "x")
    cp = _compile.cupy()
    dtype = str(x.dtype)
    if dtype not in DTYPES:
        raise InputError(f"expected float32 or float16, got {dtype}", "x.dtype")
    g = geometry(tuple(x.shape), window, window if stride is None else stride, pad, layout)
    if coarsening is not None:
        coarsening = _pair(coarsening, "coarsening")
        lo, hi = COARSEN_LIMITS[0]
        if not all(lo <= f <= hi for f in coarsening):
            raise InputError(f"coarsening factors must be in [{lo}, {hi}], got {coarsening}", "coarsening")
    x = cp.ascontiguousarray(x)
    if out is None:
        out = cp.empty(g.out_shape(), dtype=x.dtype)
    elif tuple(out.shape) != g.out_shape() or out.dtype != x.dtype or not out.flags.c_contiguous:
        raise InputError(f"expected a C-contiguous {x.dtype} array of shape {g.out_shape()}", "out")
    idx = cp.empty(g.out_shape(), dtype=cp.int32) if return_indices else None
    align = min(p & -p if p else 256 for p in (x.data.ptr, out.data.ptr))
    if coarsening is None:
        op, oq, tuned_pipe, tuned_async = _coarsening(cp, g, x, out, idx, dtype, mode, count_include_pad, align, tune)
        coarsening = (op, oq)
        if pipeline is None:
            pipeline = bool(tuned_pipe)
        if async_stage is None and stage_bytes is None and tuned_async:
            async_stage, stage_bytes = True, ASYNC_STAGE_BYTES
    if pipeline is None:
        pipeline = _compile.compute_capability() >= PIPELINE_MIN_CC
    if async_stage and _compile.compute_capability() < PIPELINE_MIN_CC:
        async_stage = False  # cp.async is sm_80's
    _launch(cp, plan_forward(g, dtype, mode, count_include_pad, return_indices, coarsening, align, pipeline,
                             stage_bytes, async_stage), x, out, idx)
    return (out, idx) if return_indices else out


def pool2d_backward(dy: Any, x: Any, window: Any, stride: Any = None, pad: Any = 0, mode: str = "max",
                    layout: str = "NCHW", indices: Any = None, count_include_pad: bool = True, out: Any = None) -> Any:
    """Gradient with respect to ``x``; for max from ``indices`` if given, else recomputed from ``x``."""
    import numpy as np

    if mode not in MODES:
        raise InputError(f"unknown mode {mode!r}; use one of {', '.join(MODES)}", "mode")
    x = _compile.as_cupy(x, "x")
    dy = _compile.as_cupy(dy, "dy")
    cp = _compile.cupy()
    dtype = str(x.dtype)
    if dtype not in DTYPES:
        raise InputError(f"expected float32 or float16, got {dtype}", "x.dtype")
    g = geometry(tuple(x.shape), window, window if stride is None else stride, pad, layout)
    if tuple(dy.shape) != g.out_shape() or str(dy.dtype) != dtype:
        raise InputError(f"expected dy of shape {g.out_shape()} and dtype {dtype}, got {dy.shape} {dy.dtype}", "dy")
    if indices is not None:
        if mode != "max":
            raise InputError("indices apply to max pooling only", "indices")
        if tuple(indices.shape) != g.out_shape() or str(indices.dtype) != "int32":
            raise InputError(f"expected int32 indices of shape {g.out_shape()}", "indices")
        indices = cp.ascontiguousarray(indices)
    x = cp.ascontiguousarray(x)
    dy = cp.ascontiguousarray(dy)
    if out is None:
        out = cp.empty(x.shape, dtype=x.dtype)
    elif tuple(out.shape) != tuple(x.shape) or out.dtype != x.dtype or not out.flags.c_contiguous:
        raise InputError(f"expected a C-contiguous {x.dtype} array of shape {x.shape}", "out")
    m = 0 if mode == "max" else (1 if count_include_pad else 2)
    src = 0 if indices is not None or m != 0 else 1
    name = f"pool_bwd<{DTYPES[dtype]},{g.kh},{g.kw},{g.sh},{g.sw},{m},{src},{'true' if g.layout == 'CHWN' else 'false'}>"
    total = x.size
    i32 = np.int32
    _compile.get_kernel(SOURCE, name)((-(-total // 256),), (256,), (
        dy, indices if indices is not None else np.uint64(0), x, out, i32(total), i32(g.h), i32(g.w), i32(g.n),
        i32(g.p), i32(g.q), i32(g.ph), i32(g.pw)))
    return out
