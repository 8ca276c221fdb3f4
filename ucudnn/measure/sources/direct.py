"""ucudnn's direct convolution kernels (seed 001, ``kernels/direct.cu``) as an algorithm source: zero workspace.

Why: under tight workspace limits cuDNN is left with its zero-workspace algorithms, and on single-channel layers
(C/G == 1: grayscale and spectrogram first layers, depthwise convolutions) those run an implicit GEMM whose
reduction is only R*S long.  A direct kernel stages a tile of the input plane and applies many filters to it from
shared memory, so it is bound by writing y.  Multi-channel layers get the seed's stride-fixed blocks with
prefetching; there cuDNN is usually faster, and the planner sees that from the measurements.

Seed kernels: one configuration per (op, micro-batch): forward (``algo`` ``direct-single`` or ``direct-multi``) or
backward data (a direct transposed convolution, gather form, deterministic; ``direct-single`` / ``direct-multi`` by
the same family of the layer).  Backward filter, dilation other than 1 and dtypes other than float32 / float16 are
recorded as skipped.  The tile sizes are tuned per shape class and device (``kernels/autotune``, cached beside
ucudnn's database) and recorded in ``extra["direct"]``, so :meth:`DirectSource.prepare` rebuilds exactly the
measured launch whatever the tuning cache holds later.

Implicit GEMM (``direct-igemm``, ``kernels/igemm.cu``): every float32 layer without groups also gets
configurations of the FP32 implicit-GEMM kernel, one per tile (``kernels.igemm.variants``: 128 x 128, and 128 x 96
or 128 x 64 where those leave fewer columns idle, each with one or two stages per buffer;
``extra["direct"]["bn"]`` / ``["ks"]``; backward data at
strides over 1 or with few channels also in its scatter form, ``["scatter"]``: atomic, not deterministic), for all
three ops: each op one GEMM over the micro-batch, its lowered operand gathered in the tile loads, so still no
workspace.  Why
beside the seed's kernels: within 8 MiB cuDNN runs AlexNet b256's FP32 layers at 11-20 TFLOPS, and the seed's
multi-channel kernel (stride-fixed blocks) below that; a 128 x 128 GEMM tile gives the FMA units ten times more work
per loaded element.  Its backward filter splits the reduction over blocks that add atomically
(``extra["direct"]["splits"]``, recorded so ``prepare`` runs the measured launch): not deterministic when split, so
``-deterministic`` numerics measure it unsplit.

Depthwise 3x3, 5x5 and 7x7 (``direct-dw3`` / ``direct-dw5`` / ``direct-dw7``, ``direct_dw*`` in
``kernels/direct.cu``): the depthwise layer with one filter per channel, padding K / 2 (MobileNet's, EfficientNet's
and MnasNet's depthwise layers, ConvNeXt's 7x7) also gets configurations of kernels made for it.  NCHW: at stride 1
all three ops, at stride 2 (3x3, 5x5) backward data and backward filter; a group of lanes walks a band of one
plane's rows with a window in registers, so x and y (dy) move once and nothing is staged (``DW_CONFIGS``: band height
and launch bound per filter size, recorded in ``extra["direct"]``).  NHWC (channels-last models: autocast with
``channels_last``, and ConvNeXt, whose blocks permute to NHWC and back): at stride 1 all three ops, 4 channels a
thread and a tile with its halo staged in shared memory (``kernels/direct_dw_nhwc.py``; the tile recorded in
``extra["direct"]``).  Backward filter adds its sums to dw atomically (float32; not deterministic, so
``-deterministic`` numerics do not measure it).  Why: such a layer is bound by memory bandwidth, the seed's
single-channel block stages a tile for one filter's taps and waits on it, and cuDNN's zero-workspace backward filter
there is slow (H200, MobileNet's 112x112 layer at b256: 15.7 ms; 0.72 ms with 784 MiB; this kernel 0.27 ms with
none; ConvNeXt-tiny's NHWC layers: 64 of a 127 ms FP32 training step at b64).

Single-channel planes by rows (``direct-plane``, ``direct_plane`` in ``kernels/direct.cu``): the NCHW forward of one
input channel without groups, stride 1, filters up to 5 x 5 (rows up to a few hundred columns wide, so that a block's
rows fit its shared memory) also gets configurations of a kernel whose threads are numbered over (image, row group,
column) of the whole batch and whose blocks stage just the input rows their windows cover (``PLANE_CONFIGS``: rows,
filters per thread and rounds, recorded in ``extra["direct"]``).  Why: the seed's single-channel kernel tiles each plane 32 columns by 32 rows, so a 28 x 28
plane leaves a quarter of its lanes and rows idle, and with a reduction of R*S only, the idle lanes and the epilogue
are what separates it from writing y at bandwidth.

Numerics: float32 runs FP32 FMA only (math type ``FMA``: allowed by every numerics mode, ``strict`` included);
float16 data accumulates in float32 (``DEFAULT``, as cuDNN labels its FP32-accumulating configurations: allowed
by every float16 mode).  The seed's kernels are deterministic, so ``-deterministic`` numerics keep them.
"""
from __future__ import annotations

from typing import Any

from ... import numerics as num
from ...binding.timing import HostRecorder
from ...errors import CaptureError, InputError, UcudnnError, summary
from ...planning.table import Measurement, Skipped
from ...problem import ConvProblem
from .base import BenchSettings, Launch, Native, Operands, Prepared, Pruner, host_extra, time_config, timed_beta

#: the math type each dtype's rows are labelled with (see the module doc)
MATH_TYPES = {"float32": "FMA", "float16": "DEFAULT"}


#: the implicit-GEMM kernel's configurations (``kernels/igemm.py``)
IGEMM = "direct-igemm"
#: the depthwise kernel's configurations (``kernels/direct_dw.py``) per filter size: rows of a lane
#: group's band (0: the whole plane) and the launch bound (blocks an SM must hold), each measured as its own row.
#: 3x3: the three whose worst row was closest to its best on seed 001's and MobileNet V2's stride-1 layers (H200,
#: ``dw3_configs-b256.md``); 5x5 and 7x7: no launch bound (a 5-row window spills under one; 7x7 takes 150-161
#: registers a thread unbounded)
DW_CONFIGS = {3: ((8, 1), (0, 1), (4, 5)), 5: ((8, 1), (0, 1), (4, 1)), 7: ((8, 1), (0, 1), (4, 1))}
#: the depthwise configurations' algorithm names, per filter size
DW_ALGOS = {k: f"direct-dw{k}" for k in DW_CONFIGS}
#: the single-channel rows kernel's configurations (``kernels/direct_plane.py``): (rows a thread owns, filters
#: it applies at a time, rounds of them a block makes), each measured as its own row
PLANE_CONFIGS = ((4, 8, 4), (4, 8, 8), (2, 8, 16), (4, 4, 16))
PLANE_ALGO = "direct-plane"


def algo_name(problem: ConvProblem) -> str:
    """The seed kernels' configuration identity in a table: the kernel family of the layer."""
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
        why = self._kernels_refusal(op, problem)
        if why:
            return why
        math = MATH_TYPES[problem.dtype]
        if numerics is not None and math not in num.allowed_math_types(numerics, problem.dtype):
            return f"{math} math is not allowed under {numerics} numerics"
        return None

    def _kernels_refusal(self, op: str, problem: ConvProblem) -> str | None:
        """Why none of this source's kernels runs ``op`` on ``problem`` (None: one does)."""
        from ucudnn.kernels import igemm
        from ucudnn.kernels.direct import refusal

        why, why_igemm = refusal(op, problem), igemm.refusal(op, problem)
        if why and why_igemm and depthwise_refusal(op, problem) is not None:
            return why if why == why_igemm else f"{why}; igemm: {why_igemm}"
        return None

    def measure(self, op: str, problem: ConvProblem, ops: Operands, workspace: int,
                settings: BenchSettings) -> tuple[list[Measurement], list[Skipped]]:
        mb = problem.n
        why = self.refusal(op, problem, settings.numerics)
        if why:
            return [], [Skipped(mb, None, None, f"{self.name}: {why}")]
        math = MATH_TYPES[problem.dtype]
        beta = timed_beta(op, problem)
        measured: list[Measurement] = []
        skipped: list[Skipped] = []
        # the atomic configurations (depthwise backward filter, igemm's scatter form) are not measured for
        # -deterministic numerics
        deterministic = settings.numerics is not None and num.deterministic_only(settings.numerics)
        variants = self._variants(op, problem, ops, settings.numerics, deterministic)
        # the seed kernel first: where the implicit GEMM is hopeless beside it (AlexNet conv1's backward data, C = 3
        # at stride 4: 1.4 s a call at n = 256 on an H100, most of each 128-column tile idle), one sample is kept
        pruner = Pruner(settings, trust_long=False)
        for algo, configure in variants:
            try:
                config = configure()
                if config.workspace_bytes > settings.max_workspace:
                    skipped.append(Skipped(mb, algo, math, f"{self.name}: needs {config.workspace_bytes} bytes of "
                                                           f"workspace, {settings.max_workspace} offered"))
                    continue
                launch = self.prepare(op, problem, config)
                with HostRecorder() as host:
                    t, how = pruner.retime(lambda give_up: time_config(lambda: launch(ops, workspace, 0, 1.0, beta),
                                                                       settings, give_up=give_up), None, 0)
            except CaptureError as e:
                skipped.append(Skipped(mb, algo, math, f"{self.name}: {e}"))
                continue
            except Exception as e:  # noqa: BLE001 - a compile or launch failure is a skipped row, never an exception
                skipped.append(Skipped(mb, algo, math, f"{self.name}: {summary(e)}"))
                continue
            measured.append(Measurement(mb, config.algo, math, max(t, 1e-6), config.workspace_bytes, self.name, None,
                                        {**config.extra, "timed": how, **host_extra(host.ms)}))
        return measured, skipped

    def _variants(self, op: str, problem: ConvProblem, ops: Operands, numerics: str | None,
                  deterministic: bool) -> list[tuple[str, Any]]:
        """(algorithm, configure()) of every configuration measured for ``op`` on ``problem``: the seed kernel
        first, then the depthwise kernels', the single-channel rows kernel's and the implicit GEMM's."""
        from ucudnn.kernels import igemm
        from ucudnn.kernels.direct import refusal
        from ucudnn.kernels.direct_plane import plane_refusal

        variants = []
        if refusal(op, problem) is None:
            variants.append((algo_name(problem), lambda: self.configure(op, problem, ops)))
        variants += depthwise_variants(op, problem, deterministic, self.name)
        for config in PLANE_CONFIGS:
            if plane_refusal(op, problem, config) is None:
                variants.append((PLANE_ALGO, lambda c=config: configure_plane(problem, *c)))
        if igemm.refusal(op, problem) is None:
            for bn, ks, scatter in igemm.variants(op, problem, deterministic):
                variants.append((IGEMM, lambda bn=bn, ks=ks, sc=scatter: self.configure_igemm(
                    op, problem, numerics, bn, ks, sc)))
        return variants

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

    def configure_igemm(self, op: str, problem: ConvProblem, numerics: str | None = None, bn: int | None = None,
                        ks: int = 1, scatter: bool = False) -> Measurement:
        """The implicit-GEMM configuration of ``op`` on ``problem`` for the current device with the tile ``bn``
        x ``ks`` and form (:func:`kernels.igemm.variants`): backward filter's split of the reduction (one block
        per output tile under ``-deterministic`` numerics), backward data's scatter form (atomic adds: refused
        under ``-deterministic`` numerics).  The tile and form are recorded, so ``prepare`` runs the measured
        launch whatever :func:`kernels.igemm.tile_width` picks later."""
        from ucudnn.kernels import igemm

        deterministic = numerics is not None and num.deterministic_only(numerics)
        if scatter and deterministic:
            raise InputError(f"igemm's scatter form adds atomically: not under {numerics} numerics", "scatter")
        g = igemm.Gemm.of(op, problem, bn, ks, scatter)
        splits = 1 if deterministic else g.split(igemm.sm_count())[0]
        info = {"kernel": "igemm_conv", "splits": splits, "bn": g.bn, "ks": g.ks}
        if scatter:
            info["scatter"] = True
        return Measurement(problem.n, IGEMM, MATH_TYPES[problem.dtype], 0.0, 0, self.name, None,
                           {"direct": info, "deterministic": splits == 1 and not scatter})

    # -- running -----------------------------------------------------------------------------
    def prepare(self, op: str, problem: ConvProblem, config: Measurement) -> Launch:
        from ucudnn.kernels.direct import Tiling, launcher

        if str(config.algo) == IGEMM:
            return _igemm_launch(op, problem, config)
        if str(config.algo) in DW_ALGOS.values():
            return _dw_launch(op, problem, config)
        if str(config.algo) == PLANE_ALGO:
            return _plane_launch(op, problem, config)
        info = _info(config)
        kernel = _kernel(op, problem)
        if info.get("kernel", kernel) != kernel:
            raise UcudnnError(f"direct configuration runs {info.get('kernel')}, {op} on this problem needs {kernel}")
        if str(config.algo) != algo_name(problem):
            raise UcudnnError(f"direct configuration {config.algo!r} is not this problem's ({algo_name(problem)})")
        tiling = Tiling.from_list(info.get("tiling"))
        return _no_workspace(launcher(op, problem, tiling, bool(info.get("async", False))))


class DepthwiseSource(DirectSource):
    """The depthwise kernels alone (``depthwise``: the ``direct-dwK`` rows, NCHW and NHWC), zero workspace.

    Why a source of its own: it is in the default set.  It declines every layer that is not depthwise K x K at no
    cost, and on those it measures two or three configurations per op that beat cuDNN's every algorithm (any
    workspace) on MobileNet's, EfficientNet's and ConvNeXt's layers, where the rest of ``direct`` (the seed's
    kernels, tuned; the implicit GEMM's tiles) costs benchmark time on every layer for wins under tight limits only.
    ``direct`` includes these rows: a request naming both measures them once, as ``direct``
    (:func:`ucudnn.source_names.canonical`)."""

    name = "depthwise"

    def _kernels_refusal(self, op: str, problem: ConvProblem) -> str | None:
        return depthwise_refusal(op, problem)

    def _variants(self, op: str, problem: ConvProblem, ops: Operands, numerics: str | None,
                  deterministic: bool) -> list[tuple[str, Any]]:
        return depthwise_variants(op, problem, deterministic, self.name)


def depthwise_refusal(op: str, problem: ConvProblem) -> str | None:
    """Why neither depthwise kernel family (NCHW ``direct_dw``, NHWC ``direct_dw_nhwc``) runs ``op`` on ``problem``."""
    from ucudnn.kernels import direct_dw_nhwc
    from ucudnn.kernels.direct_dw import dw_refusal

    why = dw_refusal(op, problem) if problem.layout == "NCHW" else direct_dw_nhwc.refusal(op, problem)
    return None if why is None else f"depthwise kernels: {why}"


def depthwise_variants(op: str, problem: ConvProblem, deterministic: bool, source: str = "direct"
                       ) -> list[tuple[str, Any]]:
    """(algorithm, configure()) of the depthwise kernels' configurations of ``op`` on ``problem`` (none where they
    do not run it; backward filter's atomics not under ``deterministic`` numerics)."""
    from ucudnn.kernels import direct_dw_nhwc
    from ucudnn.kernels.direct_dw import dw_refusal

    if op == "backward_filter" and deterministic:
        return []
    algo = DW_ALGOS.get(problem.r)
    if dw_refusal(op, problem) is None:
        return [(algo, lambda rows=rows, minb=minb: configure_dw(op, problem, rows, minb, source))
                for rows, minb in DW_CONFIGS[problem.r]]
    if direct_dw_nhwc.refusal(op, problem) is None:
        return [(algo, lambda tile=tile: configure_dw_nhwc(op, problem, tile, source))
                for tile in direct_dw_nhwc.tiles_of(op)]
    return []


def _no_workspace(run: Any) -> Launch:
    """A kernel launcher's ``run(a, b, out, alpha, beta)`` as the source's :data:`~.base.Launch`: the direct
    kernels take no workspace, so the workspace arguments are ignored."""

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


def _igemm_launch(op: str, problem: ConvProblem, config: Measurement) -> Launch:
    """The recorded implicit-GEMM configuration's launch (its split of backward filter's reduction)."""
    from ucudnn.kernels import igemm

    info = config.extra.get("direct") or {}
    splits = info.get("splits", 1)
    bn, ks = info.get("bn", igemm.BN), info.get("ks", 1)     # tables before the tile choice: the wide tile
    scatter = info.get("scatter", False)
    igemm.check_splits(splits, "extra.direct.")
    igemm.check_tile(bn, ks, "extra.direct.")
    if not isinstance(scatter, bool):
        raise InputError(f"scatter must be true or false, got {scatter!r}", "extra.direct.scatter")
    return _no_workspace(igemm.launcher(op, problem, splits, bn, ks, scatter))


def configure_dw(op: str, problem: ConvProblem, rows: int, minb: int, source: str = "direct") -> Measurement:
    """The depthwise configuration (time 0) of ``op`` with ``rows`` per band and launch bound ``minb`` (backward
    filter sums by atomics: not deterministic)."""
    return Measurement(problem.n, DW_ALGOS[problem.r], MATH_TYPES[problem.dtype], 0.0, 0, source, None,
                       {"direct": {"kernel": "direct_dw", "rows": rows, "minb": minb},
                        "deterministic": op != "backward_filter"})


def configure_dw_nhwc(op: str, problem: ConvProblem, tile: tuple[int, ...], source: str = "direct") -> Measurement:
    """The NHWC depthwise configuration (time 0) of ``op`` with ``tile`` (``kernels.direct_dw_nhwc``; backward
    filter sums by atomics: not deterministic; float16's in a float workspace)."""
    from ucudnn.kernels.direct_dw_nhwc import workspace_bytes

    return Measurement(problem.n, DW_ALGOS[problem.r], MATH_TYPES[problem.dtype], 0.0,
                       workspace_bytes(op, problem), source, None,
                       {"direct": {"kernel": "direct_dw_nhwc", "tile": list(tile)},
                        "deterministic": op != "backward_filter"})


def _dw_launch(op: str, problem: ConvProblem, config: Measurement) -> Launch:
    """The recorded depthwise configuration's launch (its algorithm names the filter size it was made for; its
    ``extra.direct.kernel`` the NCHW kernels' band rows or the NHWC kernels' tile)."""
    from ucudnn.kernels import direct_dw_nhwc
    from ucudnn.kernels.direct_dw import dw_launcher

    info = config.extra.get("direct") or {}
    if str(config.algo) != DW_ALGOS.get(problem.r):
        raise UcudnnError(f"direct configuration {config.algo!r} is not this problem's ({problem.r}x{problem.s})")
    if info.get("kernel") == direct_dw_nhwc.KERNEL:
        tile = direct_dw_nhwc.check_tile(op, info.get("tile"), "extra.direct.tile")
        return _described(op, problem, direct_dw_nhwc.launcher(op, problem, tile))
    if "rows" not in info:
        raise InputError(f"a {config.algo} configuration needs extra.direct.rows", "extra.direct.rows")
    return _described(op, problem, dw_launcher(op, problem, info["rows"], info.get("minb", 1)))


def _described(op: str, problem: ConvProblem, run: Any) -> Launch:
    """A kernel launcher that says what it launches (``run.calls``; the workspace pointer passed on) as the source's
    :data:`~.base.Launch`, with that as its :class:`~.base.Native` description, so ucudnn.torch's compiled path
    launches it without Python."""
    def launch(ops: Operands, workspace: int, workspace_bytes: int, alpha: float, beta: float) -> None:
        run(ops.a, ops.b, ops.out, alpha, beta, workspace)

    launch.native = Native("kernel", op, problem, calls=run.calls, keep=run)  # type: ignore[attr-defined]
    return launch


def configure_plane(problem: ConvProblem, rb: int, kt: int, kl: int) -> Measurement:
    """The single-channel rows configuration (time 0) of the forward with ``rb`` rows and ``kt`` filters a thread, ``kl``
    rounds a block (deterministic: every y element is written once, by one thread)."""
    return Measurement(problem.n, PLANE_ALGO, MATH_TYPES[problem.dtype], 0.0, 0, "direct", None,
                       {"direct": {"kernel": "direct_plane", "rb": rb, "kt": kt, "kl": kl}, "deterministic": True})


def _plane_launch(op: str, problem: ConvProblem, config: Measurement) -> Launch:
    """The recorded single-channel rows configuration's launch; a configuration this problem cannot run is refused by name."""
    from ucudnn.kernels.direct_plane import plane_launcher, plane_refusal

    info = config.extra.get("direct") or {}
    try:
        shape = (info["rb"], info["kt"], info["kl"])
    except KeyError as e:
        raise InputError(f"a {PLANE_ALGO} configuration needs extra.direct.{e.args[0]}",
                         f"extra.direct.{e.args[0]}") from None
    why = plane_refusal(op, problem, shape)
    if why:
        raise InputError(f"{PLANE_ALGO} cannot run {op} on {problem.describe()}: {why}", "extra.direct")
    return _no_workspace(plane_launcher(problem, *shape))
