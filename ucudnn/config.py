"""Defaults from the environment, with μ-cuDNN's variable names.

Users of the original μ-cuDNN already set these; ucudnn honours them as
defaults that explicit arguments and CLI flags override.

| variable | meaning | default |
| --- | --- | --- |
| ``UCUDNN_BATCH_SIZE_POLICY`` | ``all`` / ``powerOfTwo`` / ``powerOfTwoAndMidpoints`` / ``powerOfTwoAndEvenSplits`` / ``undivided`` | ``powerOfTwoAndEvenSplits`` (``powerOfTwo`` at a power-of-two batch) |
| ``UCUDNN_BENCHMARK_DEVICES`` | ``0,1,2`` or ``all``: GPUs benchmarks are spread over | the current device |
| ``UCUDNN_DEFAULT_WORKSPACE_LIMIT`` | per-kernel limit (bytes, or ``64MiB``) | 64 MiB |
| ``UCUDNN_TOTAL_WORKSPACE_SIZE`` | if set, plan whole networks (WD) under this total | unset |
| ``UCUDNN_DATABASE`` | SQLite file caching benchmarks and plans | user cache dir |
| ``UCUDNN_CUDNN_LIBRARY`` | path of libcudnn.so.9 to load | search wheels, then system |
| ``UCUDNN_PLAN_SERVER`` | plan service URL consulted before benchmarking | unset |
| ``UCUDNN_BUNDLE_PATH`` | ``:``-separated plan bundles to look plans up in | unset |
| ``UCUDNN_SOURCES`` | algorithm sources benchmarked (``legacy,graph,fold``; see :mod:`ucudnn.source_names`) | legacy, graph where installed, depthwise, fold |
| ``UCUDNN_BENCHMARK`` | ``full``: a kernel no cache knows is benchmarked before its first call runs; ``heuristic``: it runs at once on cuDNN's heuristic choice and is benchmarked in a background thread | ``full`` |
| ``UCUDNN_PROGRESS`` | ``1`` / ``0``: benchmark progress on stderr always / never | after 2 s |
| ``UCUDNN_CHANNEL_POLICY`` | ``none`` / ``halves`` / ``powerOfTwo``: channel slices benchmarked besides micro-batches (:func:`ucudnn.policy.channel_sizes`, issue 18) | ``none`` |
| ``UCUDNN_UNWRITTEN`` | ``1`` / ``0``: plans may take workspace from output a call has not written yet (:func:`unwritten`) | ``0`` |
| ``UCUDNN_LEGACY_TWINS`` | ``1`` / ``0``: legacy transform-domain calls run as the graph-API engine cuDNN runs them as, built once (:func:`legacy_twins`) | ``1`` |
| ``UCUDNN_HOST_TIES`` | ``1`` / ``0``: plans take, between configurations of nearly the same time, the one costing the host less (:func:`host_ties`) | ``1`` |
"""
from __future__ import annotations

import os
from pathlib import Path

from .policy import normalize_channel_policy, normalize_policy
from .units import parse_size

DEFAULT_WORKSPACE_LIMIT = 64 << 20


def _env(name: str) -> str | None:
    value = os.environ.get(name, "").strip()
    return value or None


#: the batch policy when ``UCUDNN_BATCH_SIZE_POLICY`` is unset.  Not μ-cuDNN's ``powerOfTwo``: at a power-of-two
#: mini-batch both measure the same sizes and are keyed alike (``policy.key_policy``), so nothing changes there; a
#: mini-batch that is no power of two (127, an epoch's last batch) also gets its even splits, B // 2^j and
#: ceil(B / 2^j), instead of a tail of 8 + 4 + 2 + 1 on slow algorithms.  Measured: ResNet-18 b127 FP32 training
#: 2604 -> 2982 images/s (0.89x -> 1.02x PyTorch, H200, ``benchmarks/results/torch_train_even_splits_h200*``);
#: planned over mini-batches 33-256, 0.863 -> 0.938 of every size's best at 64 MiB (``policy_sweep.md``)
DEFAULT_BATCH_POLICY = "powerOfTwoAndEvenSplits"


def batch_policy() -> str:
    return normalize_policy(_env("UCUDNN_BATCH_SIZE_POLICY") or DEFAULT_BATCH_POLICY, "UCUDNN_BATCH_SIZE_POLICY")


def channel_policy() -> str:
    """``UCUDNN_CHANNEL_POLICY``: which output-channel slices every benchmark measures (``none`` unless set).

    An environment default rather than an argument of every call, as ``UCUDNN_SOURCES`` is: it reaches the
    Python API, ``ucudnn.torch`` and the CLI alike, and the kernel-cache key records it (``ucudnn.api._cache_key``)."""
    return normalize_channel_policy(_env("UCUDNN_CHANNEL_POLICY") or "none", "UCUDNN_CHANNEL_POLICY")


def default_workspace_limit() -> int:
    v = _env("UCUDNN_DEFAULT_WORKSPACE_LIMIT")
    return parse_size(v, "UCUDNN_DEFAULT_WORKSPACE_LIMIT") if v else DEFAULT_WORKSPACE_LIMIT


def total_workspace_size() -> int | None:
    v = _env("UCUDNN_TOTAL_WORKSPACE_SIZE")
    if not v:
        return None
    size = parse_size(v, "UCUDNN_TOTAL_WORKSPACE_SIZE")
    return size if size > 0 else None  # μ-cuDNN: 0 means "not set"


def benchmark_devices(device_count: int | None = None) -> list[int] | None:
    """Device ids from ``UCUDNN_BENCHMARK_DEVICES``; ``all`` needs ``device_count``; None if unset."""
    v = _env("UCUDNN_BENCHMARK_DEVICES")
    if not v:
        return None
    if v == "all":
        if device_count is None:
            raise ValueError("UCUDNN_BENCHMARK_DEVICES=all needs the device count")
        return list(range(device_count))
    try:
        return [int(x) for x in v.split(",") if x.strip()]
    except ValueError:
        from .errors import InputError

        raise InputError(f"expected comma-separated device ids or 'all', got {v!r}", "UCUDNN_BENCHMARK_DEVICES") from None


BENCHMARK_MODES = ("full", "heuristic")


def benchmark_mode() -> str:
    """``UCUDNN_BENCHMARK``: ``full`` (default) or ``heuristic`` (see :func:`ucudnn.api.wait_for_benchmarks`)."""
    v = (_env("UCUDNN_BENCHMARK") or "full").lower()
    if v not in BENCHMARK_MODES:
        from .errors import InputError

        raise InputError(f"expected one of {', '.join(BENCHMARK_MODES)}, got {v!r}", "UCUDNN_BENCHMARK")
    return v


_SWITCH = {"1": True, "on": True, "true": True, "yes": True, "0": False, "off": False, "false": False, "no": False}


def _switch(name: str, default: str) -> bool:
    """An on / off variable (``1`` / ``0`` and the :data:`_SWITCH` spellings), ``default`` when unset; anything
    else is refused naming the variable."""
    v = (_env(name) or default).lower()
    if v not in _SWITCH:
        from .errors import InputError

        raise InputError(f"expected 1 or 0 (on / off), got {v!r}", name)
    return _SWITCH[v]


def unwritten() -> bool:
    """``UCUDNN_UNWRITTEN``: whether the library's plans may take a micro-batch's workspace from memory its call
    owns and has not written yet (``1``; ``0``, the default, turns it off).

    Forward and backward data: the output of the samples after the running micro-batch; backward filter: the
    layer's dx before backward data writes it, where the caller hands that buffer over (``ucudnn.torch``'s eager
    backward does).  The step's peak memory does not grow; a kernel takes such a plan only where it is predicted
    faster (:func:`ucudnn.planning.wr.kernel_configs`).  Measured on an H200, FP32 at 64 MiB per kernel: VGG-16
    b64's kernels replayed 0.876 -> 0.935 of the same sources' unbounded speed
    (``benchmarks/results/channel_wr_vgg16-b64-float32-NCHW-strict-winograd-unwritten-replay.md``), its
    converted training step +2.6-2.8% (``benchmarks/results/torch_train_unwritten_h200.md``).  Off by default: in
    one of four AlexNet b256 runs a converted step with one such kernel trained 19% slower than without it, a loss
    not yet explained (the same report)."""
    return _switch("UCUDNN_UNWRITTEN", "0")


def legacy_twins() -> bool:
    """``UCUDNN_LEGACY_TWINS``: whether prepared legacy FFT / FFT_TILING / WINOGRAD_NONFUSED configurations run
    through their graph-API twins (``1``, the default; ``0`` keeps every legacy call, for A/B measurements).  Read at
    each preparation (:func:`ucudnn.measure.sources.legacy.twin_of`)."""
    return _switch("UCUDNN_LEGACY_TWINS", "1")


def host_ties() -> bool:
    """``UCUDNN_HOST_TIES``: whether the library's WR plans break near-ties on recorded host work (``1``, the
    default; ``0``: the fastest configuration at each size whatever its host work, for A/B measurements and for
    steps known to be GPU-bound).  Read when a plan is made; a plan made with ``0`` is cached under its own key
    (``host_ties: false``).  The rule: :func:`ucudnn.planning.wr.lighter` (``wr.HOST_TIE_FRACTION``, for legacy
    calls ``wr.LEGACY_TIE_FRACTION``)."""
    return _switch("UCUDNN_HOST_TIES", "1")


def cache_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("ucudnn"))


def database_path() -> Path:
    """Where the plan cache lives: ``UCUDNN_DATABASE`` or ``<user cache dir>/ucudnn.sqlite``."""
    v = _env("UCUDNN_DATABASE")
    return Path(v).expanduser() if v else cache_dir() / "ucudnn.sqlite"


def cudnn_library() -> str | None:
    return _env("UCUDNN_CUDNN_LIBRARY")


def plan_server() -> str | None:
    return _env("UCUDNN_PLAN_SERVER")


def bundle_paths() -> list[Path]:
    v = _env("UCUDNN_BUNDLE_PATH")
    return [Path(p).expanduser() for p in v.split(os.pathsep) if p] if v else []
