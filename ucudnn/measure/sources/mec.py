"""MEC, memory-efficient convolution by compact lowering (seed 002, Algorithm 2), as an algorithm source.

Why: under tight workspace limits cuDNN's fast algorithms do not fit even for a handful of samples (AlexNet b256
FP32 strict at 8 MiB per kernel: WR no faster than undivided).  MEC lowers each sample to ``Q x LH x S x C``
elements (AlexNet conv2: 1.6 MB in FP32, im2col's R-fold less) and runs the convolution as GEMMs over column
partitions of that matrix, so a micro-batch runs at GEMM speed inside a few MiB.

A configuration (``kernels/mec.py`` describes every step, and executes them with NumPy for the CPU tests):

* forward ``mec-A`` / ``mec-B`` -- the seed's Solutions: lower x into L (workspace), then A: one strided-batched
  GEMM over the P output rows with m = n*Q (y written h-n-w-c, then permuted to n-h-w-c through L, the seed's
  lines 14-19); B: m = Q per (sample, row), straight into y, min(n, P) GEMM calls.  A needs |y| <= |L| and
  beta = 0 (its GEMM overwrites y out of order): a call with beta != 0 runs B's GEMMs in the same workspace.
  The seed picks A when Q <= T; T is tuned once per device and math (:func:`tuned_threshold`, cached by
  ``kernels/autotune.py``), and by default only the rule's choice is timed (``MecSource(forward="both")``
  times both and lets the planner choose).
* backward data ``mec-A`` / ``mec-B`` -- zero dL (workspace), GEMMs dy x w into dL's row partitions (rows whose
  windows overlap vertically accumulate in order), then mec_gather_dx sums the horizontal overlaps into dx with
  the caller's alpha and beta (a gather: deterministic).  A swaps dy to h-n-w-c in the workspace (n > 1) so a
  GEMM spans all samples of a row: min(ceil(R/sh), P) calls; B per sample, dL only.
* backward filter ``mec-A`` / ``mec-B`` -- lower x into L, then dw = alpha * sum dy^T x L-partition + beta * dw,
  the caller's beta on the first GEMM, 1 after (so a plan's micro-batches accumulate as for any source).  A
  swaps dy (n > 1) and makes P calls reducing over n*Q; B makes n*P calls over Q with L alone (offered while
  n*P <= ``MAX_GEMM_CALLS``).

GEMMs run through ``cublasGemmStridedBatchedEx`` on CuPy's cuBLAS handle bound to CuPy's current stream
(:mod:`ucudnn.binding.cublas`); the numerics decide the compute type and the recorded math label (``FMA``: FP32
pedantic, never TF32; ``TENSOR_OP``: TF32 under ``tf32`` / ``default``, and FP16 with FP32 accumulation).
GEMMs, lowering and gather are deterministic, so ``-deterministic`` numerics keep every configuration.

Workspace: ``workspace_bytes`` is exactly L (or dL) plus, for the A backward variants at n > 1, dy's swapped
copy, 256-byte aligned (:class:`ucudnn.kernels.mec.Program`).  A launch uses only the workspace pointer it is
given, allocates nothing and never synchronises, so a plan of mec steps is captured into CUDA graphs like any
other.  cuBLAS's own internal workspace (its per-handle pool) is outside ucudnn's count, as cuDNN's handle's is.

Layouts: NHWC (x ``[N, H, W, C]``, w ``[K, R, S, C]``) only, groups = dilation = 1; NCHW problems are recorded as
skipped: the ``relayout`` source wrapping mec (``RelayoutSource(inner=("mec",))``) runs them through ucudnn's
transform kernels with those buffers counted in its workspace.  float32 and float16 (mec.cu's kernels).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ...binding import cublas
from ...errors import InputError, UcudnnError, summary
from ...planning.table import Measurement, Skipped
from ...problem import DTYPE_BYTES, ConvProblem
from .base import BenchSettings, Launch, Operands, Prepared, Pruner, measured_or_skipped, time_config, timed_beta

#: data types mec.cu's lowering and gather kernels are built for
MEC_DTYPES = ("float32", "float16")
#: the output widths Q at which T is tuned (3x3, 64 -> 64 channels, batch sized to keep the work level)
TUNE_WIDTHS = (7, 14, 28, 56, 112, 224)
FORWARD_MODES = ("rule", "both")


def problem_refusal(problem: ConvProblem) -> str | None:
    """Why MEC does not run ``problem`` (None: it does)."""
    if problem.layout != "NHWC":
        return ("mec runs NHWC convolutions; NCHW needs its operands transformed to NHWC: run it through the "
                "relayout source wrapping mec (RelayoutSource(inner=('mec',)), transforms counted in its workspace)")
    if problem.groups != 1:
        return f"grouped convolutions (groups = {problem.groups}) are not built"
    if problem.dilation != (1, 1):
        return f"dilated convolutions (dilation {list(problem.dilation)}) are not built"
    if problem.dtype not in MEC_DTYPES:
        return f"{problem.dtype}: mec.cu's kernels are built for {' and '.join(MEC_DTYPES)}"
    if max(problem.q, problem.h) > 65535:
        return f"Q = {problem.q} or H = {problem.h} over 65535 (a launch grid dimension)"
    return None


def compute_for(math_type: str, dtype: str) -> str:
    """The cuBLAS compute type of a recorded configuration (its math label and dtype): the inverse of
    :func:`ucudnn.binding.cublas.compute_type`, so a table row alone rebuilds its launch."""
    if dtype == "float32":
        table = {"FMA": "32F_PEDANTIC", "TENSOR_OP": "32F_FAST_TF32"}
    else:
        table = {"TENSOR_OP": "32F"}
    try:
        return table[math_type]
    except KeyError:
        raise InputError(f"mec records {', '.join(table)} for {dtype}, got {math_type!r}", "math_type") from None


def threshold_from(times: dict[int, tuple[float, float]]) -> int:
    """The T of the seed's rule (A when Q <= T) that minimises the summed time over the tuning widths, from
    ``times[q] = (Solution A ms, Solution B ms)``: 0 when B wins everywhere, ties to the smaller T."""
    best_t, best = 0, sum(b for _, b in times.values())
    for t in sorted(times):
        cost = sum(a if q <= t else b for q, (a, b) in times.items())
        if cost < best:
            best_t, best = t, cost
    return best_t


def tuning_problem(q: int, dtype: str) -> ConvProblem:
    """The tuning shape of width ``q``: 3x3 pad 1, 64 -> 64 channels, about 12544 output pixels per call."""
    return ConvProblem(max(1, 12544 // (q * q)), 64, q, q, 64, 3, 3, pad=1, dtype=dtype, layout="NHWC")


def tuned_threshold(dtype: str, compute: str, settings: BenchSettings) -> tuple[int, str]:
    """(T, how) for ``dtype`` data under ``compute`` on the current device: the cached choice, else tuned now
    (forward A against B on :data:`TUNE_WIDTHS`) and cached; the seed's default where tuning fails."""
    from ucudnn.kernels import _compile, autotune
    from ucudnn.kernels.mec import DEFAULT_T

    device = _compile.device_key()
    key = f"mec-threshold/{dtype}/{compute}"
    cached = autotune.lookup(device, key)
    if cached is not None:
        return int(cached["choice"][0]), "cached"
    try:
        times = {q: _time_solutions(tuning_problem(q, dtype), compute, settings) for q in TUNE_WIDTHS}
    except Exception as e:  # noqa: BLE001 - a failed tuning costs the tuned T, not the benchmark
        return DEFAULT_T, f"default (tuning failed: {summary(e)})"
    t = threshold_from(times)
    trials = {(q, i): ms for q, pair in times.items() for i, ms in enumerate(pair)}
    autotune.record(device, key, (t,), trials)
    return t, "tuned"


def _time_solutions(problem: ConvProblem, compute: str, settings: BenchSettings) -> tuple[float, float]:
    from ...binding.gpu import cupy, cupy_dtype
    from ucudnn.kernels.mec import MecGeometry, program

    cp = cupy()
    g = MecGeometry.of(problem)
    dt = cupy_dtype(problem.dtype)
    x = cp.ones(problem.x_shape(), dt)
    w = cp.ones(problem.w_shape(), dt)
    y = cp.empty(problem.y_shape(), dt)
    ws = cp.empty(program(g, "forward", "B", problem.n).workspace_bytes, cp.uint8)
    ops = Operands(x.data.ptr, w.data.ptr, y.data.ptr)
    quick = BenchSettings(settings.numerics, repeat=3, warmup=1, min_sample_ms=settings.min_sample_ms,
                          timing=settings.timing, hopeless_factor=None, kernel_budget_s=None)
    out = []
    for variant in "AB":
        launch = _launch(g, "forward", variant, compute)
        out.append(time_config(lambda: launch(ops, ws.data.ptr, ws.nbytes, 1.0, 0.0), quick))
    return out[0], out[1]


# ---- running -----------------------------------------------------------------------------------------------------
Run = Callable[[dict[str, int], float, float], None]


@dataclass
class _Scalars:
    """Host float32 scalars cuBLAS reads at enqueue (host pointer mode): [alpha, beta, 1, 0] of the current call."""

    buf: np.ndarray

    @classmethod
    def new(cls) -> "_Scalars":
        return cls(np.array([1.0, 0.0, 1.0, 0.0], np.float32))

    def ptr(self, which: float | None, caller: int) -> int:
        """Address of the caller's scalar (``which`` None; ``caller`` 0 alpha, 1 beta) or of the constant."""
        if which is None:
            return self.buf.ctypes.data + 4 * caller
        if which not in (0.0, 1.0):
            raise InputError(f"GEMM constants are 0 or 1, got {which}", "gemm")
        return self.buf.ctypes.data + 4 * (2 if which == 1.0 else 3)


def _compile_steps(g: Any, prog: Any, compute: str) -> Run:
    """``run(buffers, alpha, beta)``: ``prog``'s steps as prepared launchers on device addresses by buffer name."""
    from ...binding.gpu import cupy
    from ucudnn.kernels.mec import Copy, Gemm, GatherDx, Lower, Swap, Zero, launchers, swap_launcher

    cp = cupy()
    rt = cp.cuda.runtime
    e = DTYPE_BYTES[g.dtype]
    dtype = cublas.DATA_TYPES[g.dtype]
    ctype = cublas.COMPUTE_TYPES[compute]
    lower, gather = launchers(g, prog.n, e)
    scal = _Scalars.new()
    calls: list[Callable[[dict[str, int], int, int], None]] = []
    for st in prog.steps:
        if isinstance(st, Gemm):
            cm = st.column_major()
            (an, ao), (bn, bo), (cn, co) = cm["A"], cm["B"], cm["C"]
            args = (cublas.OPERATIONS[cm["transa"]], cublas.OPERATIONS[cm["transb"]], cm["m"], cm["n"], cm["k"])
            alpha_ptr, beta_ptr = scal.ptr(st.alpha, 0), scal.ptr(st.beta, 1)

            def gemm(b: dict[str, int], h: int, stream: int, args=args, cm=cm, an=an, ao=ao, bn=bn, bo=bo, cn=cn,
                     co=co, alpha_ptr=alpha_ptr, beta_ptr=beta_ptr) -> None:
                cublas.gemm_strided_batched(h, *args, alpha_ptr, b[an] + ao * e, dtype, cm["lda"], cm["strideA"],
                                            b[bn] + bo * e, dtype, cm["ldb"], cm["strideB"], beta_ptr,
                                            b[cn] + co * e, dtype, cm["ldc"], cm["strideC"], cm["batchCount"], ctype)
            calls.append(gemm)
        elif isinstance(st, Lower):
            calls.append(lambda b, h, s, st=st: lower(b[st.src], b[st.dst]))
        elif isinstance(st, GatherDx):
            calls.append(lambda b, h, s, st=st: gather(b[st.src], b[st.dst], float(scal.buf[0]), float(scal.buf[1])))
        elif isinstance(st, Swap):
            swap = swap_launcher(st.outer, st.inner, st.row, e)
            calls.append(lambda b, h, s, st=st, swap=swap: swap(b[st.src], b[st.dst]))
        elif isinstance(st, Zero):
            calls.append(lambda b, h, s, st=st: rt.memsetAsync(b[st.buf], 0, st.elements * e, s))
        elif isinstance(st, Copy):
            calls.append(lambda b, h, s, st=st: rt.memcpyAsync(b[st.dst], b[st.src], st.elements * e,
                                                               rt.memcpyDeviceToDevice, s))
        else:  # pragma: no cover - Step is closed
            raise TypeError(st)
    has_gemm = prog.gemm_calls > 0

    def run(buffers: dict[str, int], alpha: float, beta: float) -> None:
        scal.buf[0], scal.buf[1] = alpha, beta
        stream = cp.cuda.get_current_stream().ptr
        h = 0
        if has_gemm:
            h = cublas.handle()
            cublas.bind(h, stream)
        for call in calls:
            call(buffers, h, stream)

    return run


def _launch(g: Any, op: str, variant: str, compute: str) -> Launch:
    """The launch of ``variant`` of ``op`` at ``g.n`` (forward A falls back to B's GEMMs when beta != 0)."""
    from ucudnn.kernels.mec import OPERANDS, program

    prog = program(g, op, variant, g.n)
    run = _compile_steps(g, prog, compute)
    fallback = _compile_steps(g, program(g, op, "B", g.n), compute) if (op, variant) == ("forward", "A") else None
    names = OPERANDS[op]
    segments = [(name, off) for name, off, _ in prog.segments]
    need = prog.workspace_bytes

    def launch(ops: Operands, workspace: int, workspace_bytes: int, alpha: float, beta: float) -> None:
        if workspace_bytes < need:
            raise UcudnnError(f"mec {op} {variant} needs {need} bytes of workspace, got {workspace_bytes}")
        buffers = {names[0]: ops.a, names[1]: ops.b, names[2]: ops.out}
        for name, off in segments:
            buffers[name] = workspace + off
        (fallback if fallback is not None and beta != 0.0 else run)(buffers, alpha, beta)

    return launch


class MecSource(Prepared):
    """Seed 002's MEC on ucudnn's lowering kernels and cuBLAS (see the module doc).

    ``forward``: ``"rule"`` times the Solution the seed's rule picks with the device's tuned T (``threshold``
    overrides it), ``"both"`` times A and B.  Backward ops time every variant that runs (they differ in workspace).
    """

    name = "mec"

    def __init__(self, forward: str = "rule", threshold: int | None = None):
        if forward not in FORWARD_MODES:
            raise InputError(f"must be one of {', '.join(FORWARD_MODES)}, got {forward!r}", "forward")
        if threshold is not None and (not isinstance(threshold, int) or threshold < 0):
            raise InputError(f"must be a non-negative integer, got {threshold!r}", "threshold")
        self.forward = forward
        self.threshold = threshold

    def variants(self, op: str, problem: ConvProblem, threshold: int | None) -> tuple[list[str], list[Skipped]]:
        """The variants to time at ``problem.n``, in order, and the ones that do not run (with why)."""
        from ucudnn.kernels.mec import VARIANTS, MecGeometry, refusal

        g, mb = MecGeometry.of(problem), problem.n
        order = list(VARIANTS[op])
        if op == "forward":
            chosen = g.choose(mb, threshold if threshold is not None else 0)
            order = [chosen] + [v for v in order if v != chosen]
            if self.forward == "rule":
                order = order[:1]
        runs, skipped = [], []
        for v in order:
            why = refusal(g, op, v, mb)
            if why:
                skipped.append(Skipped(mb, f"mec-{v}", None, f"mec: {why}"))
            else:
                runs.append(v)
        return runs, skipped

    def measure(self, op: str, problem: ConvProblem, ops: Operands, workspace: int,
                settings: BenchSettings) -> tuple[list[Measurement], list[Skipped]]:
        return measured_or_skipped("mec", problem.n, lambda: problem_refusal(problem),
                                   lambda: self._measure(op, problem, ops, workspace, settings))

    def _measure(self, op: str, problem: ConvProblem, ops: Operands, workspace: int,
                 settings: BenchSettings) -> tuple[list[Measurement], list[Skipped]]:
        from ucudnn.kernels.mec import MecGeometry, program

        mb = problem.n
        compute, label = cublas.compute_type(settings.numerics, problem.dtype)
        threshold, how_t = None, None
        if op == "forward":
            threshold, how_t = ((self.threshold, "given") if self.threshold is not None
                                else tuned_threshold(problem.dtype, compute, settings))
        variants, skipped = self.variants(op, problem, threshold)
        g = MecGeometry.of(problem)
        beta = timed_beta(op)
        pruner = Pruner(settings, trust_long=False)
        measured: list[Measurement] = []
        for v in variants:
            prog = program(g, op, v, mb)
            ws = prog.workspace_bytes
            algo = f"mec-{v}"
            if ws > settings.max_workspace:
                skipped.append(Skipped(mb, algo, label, f"mec: needs {ws} bytes, over the benchmark cap"))
                continue
            info: dict[str, Any] = {"variant": v, "compute": compute, "gemm_calls": prog.gemm_calls,
                                    "layout": problem.layout}
            if threshold is not None:
                info.update(T=threshold, T_from=how_t, rule=g.choose(mb, threshold))
            config = Measurement(mb, algo, label, 0.0, ws, self.name, None, {"mec": info, "deterministic": True})
            row = self.time_prepared(op, problem, config, ops, workspace, beta, settings, pruner)
            (measured if isinstance(row, Measurement) else skipped).append(row)  # type: ignore[arg-type]
        return measured, skipped

    def prepare(self, op: str, problem: ConvProblem, config: Measurement) -> Launch:
        from ucudnn.kernels.mec import MecGeometry

        why = problem_refusal(problem)
        if why:
            raise InputError(f"mec cannot run {problem.describe()}: {why}", "problem")
        info = config.extra.get("mec") or {}
        variant = info.get("variant") or str(config.algo).removeprefix("mec-")
        compute = compute_for(config.math_type, problem.dtype)
        return _launch(MecGeometry.of(problem), op, variant, compute)
