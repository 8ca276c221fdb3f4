"""What cuDNN 9 runs its legacy convolution calls as, and what that costs the host: data shared by the legacy
source (which runs some calls through their graph-API twins) and WR's near-ties (which weigh the host work of the
rest).  Pure: no GPU, no import of the sources.

cuDNN 9 implements every legacy call (``cudnnConvolutionForward`` and the backward ones) on a graph-API engine
and finalizes that engine's configuration again at each call.  For the transform-domain algorithms the engine is
fixed (:data:`TWIN_ENGINES`), so ucudnn builds it once and runs it instead (its *twin*); the GEMM-class algorithms
have per-problem knobs, no fixed twin, and every call of theirs pays the finalization on the host
(:data:`LEGACY_CALL_HOST_MS`).
"""
from __future__ import annotations

#: The graph-API engines cuDNN 9 runs its legacy transform-domain algorithms as (FFT, FFT_TILING and
#: WINOGRAD_NONFUSED of each op), with their default knobs: read from cuDNN 9.19's API log of legacy calls
#: (``benchmarks/legacy_twins.py --legacy-once``, H200; backward data's FFT_TILING ran as engine 50 on 3x3 / 5x5
#: filters and 5 on 1x1 / 1x7 / 7x1, with equal workspace and time).  The GEMM algorithms are left out: cuDNN
#: tunes their engines' knobs per problem, so an engine id alone does not name the legacy call's kernels.
#: Twins run float32 data only (:func:`twin_engines`).
TWIN_ENGINES: dict[tuple[str, int], tuple[int, ...]] = {
    ("forward", 4): (3,), ("forward", 5): (4,), ("forward", 7): (6,),
    ("backward_data", 2): (4,), ("backward_data", 3): (50, 5), ("backward_data", 5): (7,),
    ("backward_filter", 2): (18,), ("backward_filter", 5): (17,),
}

#: The host ms a legacy call without a twin costs inside a model's step, at least.  Why a floor and not the
#: benchmark's ``host_ms``: the benchmark times one call repeated through Python, where cuDNN's legacy path costs
#: about what a graph engine launched through the frontend's Python binding costs (ResNet-50 b128 AMP's 1x1
#: backward filters on an H200: 48-62 us against 39-49 us), while in the step, launched from ucudnn.torch's C++
#: path, a layer whose backward filter was legacy IMPLICIT_PRECOMP_GEMM cost its backward 23-110 us more host
#: than PyTorch's and a layer on graph engines 0-50 us less (``benchmarks/results/legacy_host_h200.md``)
LEGACY_CALL_HOST_MS = 0.1


def twin_engines(op: str, algo: int | str, dtype: str) -> tuple[int, ...]:
    """The engines a legacy configuration of ``algo`` may run as for ``op`` on ``dtype`` data (:data:`TWIN_ENGINES`;
    twins run float32 data only), or ``()``: it has no twin."""
    if dtype != "float32":
        return ()
    try:
        return TWIN_ENGINES.get((op, int(algo)), ())
    except (TypeError, ValueError):
        return ()


def runs_as_legacy_call(source: str, algo: int | str, op: str | None = None, dtype: str | None = None) -> bool:
    """Whether a configuration of ``source`` / ``algo`` runs as a cuDNN legacy call in ucudnn's executors: a
    legacy configuration, unless its algorithm has a twin for this op and dtype (:func:`twin_engines`; ``op`` None:
    not known, counted as a legacy call).  ``UCUDNN_LEGACY_TWINS=0`` (an A/B switch that keeps every legacy call)
    is not read here: plans stay the same under it."""
    if source != "legacy":
        return False
    return op is None or dtype is None or not twin_engines(op, algo, dtype)
