"""Channel slices (issue 18): the second dimension of a kernel's division, besides the batch.

A configuration may compute only ``c`` of a kernel's ``k`` output channels (a measurement's ``channels``).
Forward and backward-filter then write the slice's part of y / dw; backward-data reads the slice's part of dy
and w and *adds* into dx.  A plan covers the whole (n, k) rectangle slice by slice:

    k = c_1 + c_2 + ... + c_m,   each slice c_j run as its own batch division (micro-batches summing to n)

so the kernel's time is the sum over slices of their batch divisions' times, and its workspace the largest of
any step (steps run one after another and share the workspace).  Why slices first, batch inside: the family
is what the executor runs without copies (a slice of y is a strided view; its micro-batches are the usual
prefixes along N), and it is exactly solvable by two nested one-dimensional DPs: WR's batch DP per slice size
(:func:`ucudnn.planning.wr.solve`), then :func:`combine` over k.  A division that cuts some micro-batches
along K and others not is outside the family (not measured, not planned).

Pure Python + NumPy (no GPU), like every planner.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Generic, Sequence, TypeVar

import numpy as np

from ..errors import InputError

C = TypeVar("C")


def combine(k: int, whole: np.ndarray | None, parts: dict[int, np.ndarray]
            ) -> tuple[np.ndarray, Callable[[int], list[int | None]]]:
    """The fastest cover of ``k`` channels, per workspace level, from whole-k and slice costs.

    ``whole``: the cost of computing all ``k`` channels at once, per level (None: not available); ``parts[c]``:
    the cost of one slice of ``c`` < ``k`` channels, per level (every slice of that size costs the same: the
    problem does not depend on where the slice starts).  Returns the best cost per level and a function giving,
    for one level, the slice sizes of that best cover in order (``[None]``: whole).  Ties go to the whole k,
    then to fewer, larger slices.  Infinite cost: no cover at that level.
    """
    levels = (whole if whole is not None else next(iter(parts.values()), np.zeros(1))).shape
    sizes = sorted((c for c in parts if 0 < c < k), reverse=True)   # larger first: ties keep fewer slices
    inf = np.full(levels, np.inf)
    if not sizes:
        best = whole.copy() if whole is not None else inf
        return best, lambda level: [None] if math.isfinite(best[level]) else []
    step = math.gcd(*sizes)
    n_states = k // step + 1
    g = np.full((n_states,) + levels, np.inf)
    pick = np.full((n_states,) + levels, -1, dtype=np.int32)
    g[0] = 0.0
    for s in range(1, n_states):
        kk = s * step
        for i, c in enumerate(sizes):
            if c > kk:
                continue
            cand = parts[c] + g[s - c // step]
            better = cand < g[s]
            g[s] = np.where(better, cand, g[s])
            pick[s] = np.where(better, i, pick[s])
    sliced = g[k // step] if k % step == 0 else inf
    best = sliced.copy()
    use_whole = np.zeros(levels, dtype=bool)
    if whole is not None:
        use_whole = whole <= sliced
        best = np.where(use_whole, whole, sliced)

    def cover(level: int) -> list[int | None]:
        if not math.isfinite(best[level]):
            return []
        if use_whole[level]:
            return [None]
        out: list[int | None] = []
        s = k // step
        while s > 0:
            c = sizes[int(pick[s][level])]
            out.append(c)
            s -= c // step
        return out

    return best, cover


@dataclass(frozen=True)
class Step(Generic[C]):
    """Where one micro-configuration of a plan runs: samples ``[n0, n0 + micro_batch)``, channels ``[k0, k0 + kc)``;
    ``first_in_slice``: the first step of its channel slice; ``first_slice``: in the first channel slice."""

    config: C
    n0: int
    k0: int
    kc: int
    first_in_slice: bool
    first_slice: bool


def steps(configs: Sequence[C], n: int, k: int, field: str = "micro_batches") -> list[Step[C]]:
    """Lay a kernel plan's micro-configurations out on the (n, k) rectangle, slice by slice; checks the cover.

    Every plan before issue 18 is one slice of all k channels whose micro-batches sum to n.  Raises
    :class:`~ucudnn.errors.InputError` naming ``field`` when the micro-batches do not cover the rectangle.
    """
    out: list[Step[C]] = []
    n0 = k0 = 0
    kc: int | None = None
    first_slice = True
    for i, cfg in enumerate(configs):
        c = getattr(cfg, "channels", None)
        c = k if c is None else c
        if n0 == 0:
            if k0 == k and getattr(cfg, "channels", None) is None:    # no slices: one batch too many
                raise InputError(f"micro-batches sum past the mini-batch n={n} (steps 0-{i - 1} already cover "
                                 f"it)", field)
            kc = c
            if k0 + kc > k:
                raise InputError(f"channel slices sum past k={k} at step {i}", field)
        elif c != kc:
            raise InputError(f"step {i} has {c} channels inside a slice of {kc} (each slice's micro-batches "
                             f"must sum to n={n} first)", field)
        mb = cfg.micro_batch  # type: ignore[attr-defined]
        if n0 + mb > n:
            raise InputError(f"micro-batches of the slice at channel {k0} sum past the mini-batch n={n}", field)
        out.append(Step(cfg, n0, k0, kc, n0 == 0, first_slice))
        n0 += mb
        if n0 == n:
            n0, k0, first_slice = 0, k0 + kc, False
    if n0 != 0 and k0 == 0 and kc == k:   # the common case: one slice of all channels
        raise InputError(f"micro-batches sum to {n0}, not the mini-batch n={n}", field)
    if n0 != 0 or k0 != k:
        covered = k0 if n0 == 0 else f"{k0} (+ a slice of {kc} covering {n0} of {n} samples)"
        raise InputError(f"micro-batches cover {covered} of k={k} channels over n={n} samples", field)
    return out
