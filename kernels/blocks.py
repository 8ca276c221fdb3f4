"""The fused-block kernels by name: which of them run a block, their launchers and their tuners behind one
signature, so the inference planner, its executor and the benchmarks pick among them in one place.

- ``fma``: :mod:`kernels.fused` (float32 FMA arithmetic, every mode, FP32 and FP16 storage), tiling
  ``[th, tw, ks, nt]``;
- ``pointwise``: :mod:`kernels.pointwise` (FP16 on tensor cores, chains of 1x1s: straight and merge), ``[pt, nw]``;
- ``spatial``: :mod:`kernels.spatial` (FP16 on tensor cores, a 1x1 then R x S convolutions: straight and split),
  ``[th, tw, nw, rtb]``.

Why several: in FP32 the FMA kernel is what strict FP32 allows; in FP16 cuDNN's per-layer kernels use tensor cores,
and the FMA kernel ties or loses to them (H100, batch 1: seed block a.1 20.4 vs 20.4 us, c.1 28.3 vs 23.2) where
the tensor-core kernels win (14.8 and 11.7 us).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from ucudnn.errors import InputError

from . import fused as F
from . import pointwise as P
from . import spatial as S

KERNELS = ("fma", "pointwise", "spatial")
_TC = {"pointwise": P, "spatial": S}


def candidates(block: F.Block, dtype: str, smem: int | None = None) -> list[str]:
    """The kernels that run ``block`` in ``dtype`` with a tiling whose shared memory fits ``smem`` bytes (None: the
    current device's limit), the FMA kernel first."""
    limit = F.smem_limit() if smem is None else smem
    return ["fma"] + [k for k, mod in _TC.items()
                      if mod.unsupported(block, dtype) is None and mod.fitting(block, limit)]


def _kernel(kernel: str) -> None:
    if kernel not in KERNELS:
        raise InputError(f"must be one of {KERNELS}, got {kernel!r}", "kernel")


def launcher(kernel: str, block: F.Block, tiling: Sequence[int], dtype: str, layout: str,
             x_shape: Sequence[int]) -> F.Launch:
    """``launch(x, weights, biases, out, x2=None)`` of ``kernel`` at ``tiling`` (its list form)."""
    _kernel(kernel)
    tiling = [int(v) for v in tiling]
    if kernel == "fma":
        return F.launcher(block, F.Tiling.from_list(tiling), dtype, layout, x_shape)
    want = len(_TC[kernel].TILINGS[0])
    if len(tiling) != want:
        raise InputError(f"a {kernel} tiling has {want} numbers, got {tiling}", "tiling")
    return _TC[kernel].launcher(block, dtype, layout, x_shape, *tiling)


def tuned(kernel: str, block: F.Block, dtype: str, layout: str, x_shape: Sequence[int],
          operands: tuple[Any, Sequence[Any], Sequence[Any], Any, Any], tune: bool,
          timer: Callable[[Callable[[], None]], float] | None = None, smem: int | None = None) -> list[int]:
    """``kernel``'s tiling for the block on ``operands`` (whose ``out`` it overwrites).  The FMA kernel: its hill
    climb and tuning cache when ``tune``, else its cost model's default.  The tensor-core kernels: of their
    :data:`TILINGS` that fit ``smem`` bytes (None: the device's limit; InputError if none does), the fastest by
    ``timer`` when ``tune``, else the first."""
    _kernel(kernel)
    if kernel == "fma":
        return F.tuned_tiling(block, dtype, layout, tuple(x_shape), operands, tune=tune, timer=timer)[0].as_list()
    mod = _TC[kernel]
    limit = F.smem_limit() if smem is None else smem
    fit = mod.fitting(block, limit)
    if not fit:
        raise InputError(f"no {kernel} tiling of {mod.TILINGS} fits {limit} bytes of shared memory", "tiling")
    if not tune or timer is None:
        return list(fit[0])
    times = {}
    for tiling in fit:      # the first of equal times wins
        launch = mod.launcher(block, dtype, layout, x_shape, *tiling)
        times[tiling] = float(timer(lambda launch=launch: launch(*operands)))
    return list(min(times, key=times.get))


__all__ = ["KERNELS", "candidates", "launcher", "tuned"]
