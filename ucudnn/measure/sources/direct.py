"""ucudnn's direct convolution kernels (seed 001, ``kernels/direct.cu``) as an algorithm source: zero workspace.

Why: under tight workspace limits cuDNN is left with its zero-workspace algorithms, and on single-channel layers
(C/G == 1: grayscale and spectrogram first layers, depthwise convolutions) those run an implicit GEMM whose
reduction is only R*S long.  A direct kernel stages a tile of the input plane and applies many filters to it from
shared memory, so it is bound by writing y.  Multi-channel layers get the seed's stride-fixed blocks with
prefetching; there cuDNN is usually faster, and the planner sees that from the measurements.

One configuration per (op, micro-batch): forward (``algo`` ``direct-single`` or ``direct-multi``) or backward data
(a direct transposed convolution, gather form, deterministic; ``direct-single`` / ``direct-multi`` by the same
family of the layer).  Backward filter, dilation other than 1 and dtypes other than float32 / float16 are recorded
as skipped.  The tile sizes are tuned per shape class and device (``kernels/autotune``, cached beside ucudnn's
database) and recorded in ``extra["direct"]``, so :meth:`DirectSource.prepare` rebuilds exactly the measured
launch whatever the tuning cache holds later.

Numerics: float32 runs FP32 FMA only (math type ``FMA``: allowed by every numerics mode, ``strict`` included);
float16 data accumulates in float32 (``DEFAULT``, as cuDNN labels its FP32-accumulating configurations: allowed
by every float16 mode).  The kernels are deterministic, so ``-deterministic`` numerics keep them.
"""
from __future__ import annotations

from typing import Any

from ... import numerics as num
from ...errors import CaptureError, InputError, UcudnnError, summary
from ...planning.table import Measurement, Skipped
from ...problem import ConvProblem
from .base import BenchSettings, Launch, Operands, Prepared, time_config, timed_beta

#: the math type each dtype's rows are labelled with (see the module doc)
MATH_TYPES = {"float32": "FMA", "float16": "DEFAULT"}


def algo_name(problem: ConvProblem) -> str:
    """The configuration's identity in a table: the kernel family of the layer."""
    from ucudnn.kernels.direct import family

    return f"direct-{family(problem)}"


class DirectSource(Prepared):
    """Direct convolution kernels, forward and backward data, zero workspace.

    ``tune``: hill-climb the tile sizes of a shape class not in the tuning cache on the benchmark's own buffers
    (default); False takes :func:`ucudnn.kernels.direct.default_tiling` (tests, quick benchmarks)."""

    name = "direct"
    workspace_bytes = 0

    def __init__(self, tune: bool = True):
        self.tune = tune

    # -- measuring ---------------------------------------------------------------------------
    def refusal(self, op: str, problem: ConvProblem, numerics: str | None = None) -> str | None:
        """Why this source records no configuration for ``op`` on ``problem`` (None: it measures one)."""
        from ucudnn.kernels.direct import refusal

        why = refusal(op, problem)
        if why:
            return why
        math = MATH_TYPES[problem.dtype]
        if numerics is not None and math not in num.allowed_math_types(numerics, problem.dtype):
            return f"{math} math is not allowed under {numerics} numerics"
        return None

    def measure(self, op: str, problem: ConvProblem, ops: Operands, workspace: int,
                settings: BenchSettings) -> tuple[list[Measurement], list[Skipped]]:
        mb = problem.n
        why = self.refusal(op, problem, settings.numerics)
        if why:
            return [], [Skipped(mb, None, None, f"direct: {why}")]
        math = MATH_TYPES[problem.dtype]
        algo = algo_name(problem)
        try:
            config = self.configure(op, problem, ops)
            launch = self.prepare(op, problem, config)
            beta = timed_beta(op)
            t = time_config(lambda: launch(ops, workspace, 0, 1.0, beta), settings)
        except CaptureError as e:
            return [], [Skipped(mb, algo, math, f"direct: {e}")]
        except Exception as e:  # noqa: BLE001 - a compile or launch failure is a skipped row, never an exception
            return [], [Skipped(mb, algo, math, f"direct: {summary(e)}")]
        return [Measurement(mb, config.algo, math, max(t, 1e-6), 0, self.name, None,
                            {**config.extra, "timed": "median"})], []

    def configure(self, op: str, problem: ConvProblem, ops: Operands | None = None) -> Measurement:
        """The configuration (time 0) this source runs ``op`` on ``problem`` with on the current device: the
        tuned (or cached, or default) tiling, and cp.async where the device has it."""
        from ucudnn.kernels import _compile
        from ucudnn.kernels.direct import tuned_tiling, uses_async

        operands = None if ops is None else (ops.a, ops.b, ops.out)
        tiling, how = tuned_tiling(op, problem, operands, tune=self.tune)
        info = {"kernel": _kernel(op, problem), "tiling": tiling.as_list(),
                "async": uses_async(op, problem, _compile.compute_capability()), "tuned": how}
        return Measurement(problem.n, algo_name(problem), MATH_TYPES[problem.dtype], 0.0, 0, self.name, None,
                           {"direct": info, "deterministic": True})

    # -- running -----------------------------------------------------------------------------
    def prepare(self, op: str, problem: ConvProblem, config: Measurement) -> Launch:
        from ucudnn.kernels.direct import Tiling, launcher

        info = _info(config)
        kernel = _kernel(op, problem)
        if info.get("kernel", kernel) != kernel:
            raise UcudnnError(f"direct configuration runs {info.get('kernel')}, {op} on this problem needs {kernel}")
        if str(config.algo) != algo_name(problem):
            raise UcudnnError(f"direct configuration {config.algo!r} is not this problem's ({algo_name(problem)})")
        run = launcher(op, problem, Tiling.from_list(info.get("tiling")), bool(info.get("async", False)))

        def launch(ops: Operands, workspace: int, workspace_bytes: int, alpha: float, beta: float) -> None:
            run(ops.a, ops.b, ops.out, alpha, beta)

        return launch


def _kernel(op: str, problem: ConvProblem) -> str:
    from ucudnn.kernels.direct import kernel_name, refusal

    why = refusal(op, problem)
    if why:
        raise InputError(f"direct cannot run {op} on {problem.describe()}: {why}", "op")
    return kernel_name(op, problem)


def _info(config: Measurement) -> dict[str, Any]:
    info = config.extra.get("direct")
    if not isinstance(info, dict) or "tiling" not in info:
        raise InputError("a direct configuration needs extra.direct.tiling (the tuned tile sizes)", "extra.direct")
    return info
