"""Hill-climbing auto-tuner for thread coarsening, with its choice cached per shape and device.

Seed 000 (V.A): "with an initial factor ..., the expansion factor continues to
increase linearly if the performance improves; otherwise it stops, as further
expansion leads to high register pressure".  :func:`hill_climb` does that in
both output directions at once (coordinate steps of +1 -- or +1 and +2, where
a neighbour can be worse than the factor after it -- from the start while
the time drops) and measures each candidate once; it knows nothing of GPUs,
so the CPU tests drive it with synthetic cost functions.

Choices persist in a small JSON file beside ucudnn's cache database
(``UCUDNN_DATABASE``'s folder, ``kernel_tuning.json``), keyed by device
(name and compute capability) and by the kernel's full shape key; a later
process on the same device reuses them without measuring.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Callable, Iterable, Sequence, TypeVar

FORMAT = "ucudnn-kernel-tuning/1"
_lock = threading.Lock()
_memory: dict[tuple[str, str], dict] = {}
T = TypeVar("T")


def hill_climb(measure: Callable[[tuple[int, ...]], float], start: tuple[int, ...],
               limits: Iterable[tuple[int, int]],
               steps: Iterable[tuple[int, ...]] | None = None) -> tuple[tuple[int, ...], dict[tuple[int, ...], float]]:
    """The coarsening factors a hill climb from ``start`` settles on, and every time it measured.

    ``measure(factors)`` returns a time (lower is better; ``inf`` marks a
    candidate that cannot run).  From the current point, each direction is
    stepped by +1 within ``limits`` (inclusive ``(lo, hi)`` per direction) --
    or by each of ``steps[i]`` (e.g. ``(1, 2)``: a step may also skip one
    factor, for a cost that is not monotone between neighbours);
    the best improving step is taken; the climb stops when no step improves.
    """
    limits = list(limits)
    strides = [tuple(s) for s in steps] if steps is not None else [(1,)] * len(limits)
    if len(strides) != len(limits):
        raise ValueError(f"steps {steps} do not match limits {limits}")
    times: dict[tuple[int, ...], float] = {}

    def timed(f: tuple[int, ...]) -> float:
        if f not in times:
            times[f] = float(measure(f))
        return times[f]

    current = tuple(start)
    for f, (lo, hi) in zip(current, limits):
        if not lo <= f <= hi:
            raise ValueError(f"start {start} outside limits {limits}")
    best = timed(current)
    while True:
        moves = [current[:i] + (current[i] + d,) + current[i + 1:] for i in range(len(current)) for d in strides[i]
                 if current[i] + d <= limits[i][1]]
        scored = [(timed(s), s) for s in moves]
        if not scored or min(scored)[0] >= best:
            return current, times
        best, current = min(scored)


def confirm(measure: Callable[[tuple[int, ...]], float], times: dict[tuple[int, ...], float], top: int = 3,
            rounds: int = 2) -> tuple[tuple[int, ...], dict[tuple[int, ...], float]]:
    """The fastest of the ``top`` fastest candidates in ``times`` once each is re-measured ``rounds`` more times.

    Why: a climb measures each candidate once, so two candidates within the timing noise of each other
    (seen on the H100: float16 PL6 pooling at 2x1 vs 2x3, PL1 CHWN 1x1 vs 4x4) are ranked by luck and the
    choice flips between processes.  The re-measurements run round-robin (a slow spell of the device hits
    every finalist alike) and each finalist is judged by the median of all its samples.  Returns the choice
    and those medians.
    """
    finite = sorted((t, f) for f, t in times.items() if t != float("inf"))
    finalists = [f for _, f in finite[:max(1, top)]]
    if len(finalists) < 2:
        return (finalists[0] if finalists else min(times, key=times.get)), {}
    samples = {f: [times[f]] for f in finalists}
    for _ in range(rounds):
        for f in finalists:
            samples[f].append(float(measure(f)))
    medians = {f: sorted(v)[len(v) // 2] for f, v in samples.items()}
    return min(finalists, key=lambda f: (medians[f], finalists.index(f))), medians


def grid_point(axes: Sequence[Sequence[int]], coords: Sequence[int]) -> tuple[int, ...] | None:
    """The values at tuning ``coords`` (an index into each axis' values), or None outside the grid."""
    if len(coords) != len(axes) or any(not 0 <= c < len(v) for c, v in zip(coords, axes)):
        return None
    return tuple(v[c] for c, v in zip(coords, axes))


def climb_grid(device: str, key: str, axes: Sequence[Sequence[int]], start: tuple[int, ...],
               candidate: Callable[[tuple[int, ...]], Callable[[], float] | None], max_trials: int,
               finalists: int, rounds: int) -> tuple[int, ...] | None:
    """Tune a kernel's tiling over the grid of ``axes``: :func:`hill_climb` from ``start`` by steps of one index
    along every axis, then :func:`confirm`; the choice is recorded under (``device``, ``key``) and returned as
    coordinates (None: no candidate could be timed).

    ``candidate(coords)`` returns None for a tiling that cannot or should not run (costs no trial), else a
    function timing it in ms.  At most ``max_trials`` candidates are timed during the climb (each may compile
    a kernel); confirming re-times finalists that already ran, outside that budget.  A candidate whose timing
    raises is not a choice."""
    budget = [max_trials]

    def measure(coords: tuple[int, ...]) -> float:
        run = candidate(coords)
        if run is None or budget[0] <= 0:
            return float("inf")
        budget[0] -= 1
        try:
            return float(run())
        except Exception:  # noqa: BLE001 - a candidate that cannot compile or launch is not a choice
            return float("inf")

    limits = [(0, len(v) - 1) for v in axes]
    coords, times = hill_climb(measure, start, limits, [(-1, 1)] * len(axes))
    if all(v == float("inf") for v in times.values()):
        return None
    budget[0] = 10 ** 9   # the finalists compiled already
    coords, medians = confirm(measure, times, finalists, rounds)
    record(device, key, coords, {**times, **medians})
    return coords


def tuned_grid(device: str, key: str, axes: Sequence[Sequence[int]], start: T,
               at: Callable[[tuple[int, ...]], T | None], fits: Callable[[T], bool], worth: Callable[[T], bool],
               time: Callable[[T], float] | None, max_trials: int, finalists: int, rounds: int) -> tuple[T, str]:
    """(tiling, how) of a kernel tuned over the grid of ``axes``: the one shape of ucudnn's own kernels' tuners
    (fused blocks, direct convolution).  ``cache``: the choice recorded before under (``device``, ``key``), if
    ``at`` still makes it and it ``fits``; ``climb``: tuned now by :func:`climb_grid` from ``start`` (a tiling
    with ``coordinates()``) over the tilings that fit and are ``worth`` a trial, each timed in ms by ``time``;
    ``default``: ``start``, when ``time`` is None (no tuning asked, or nothing to run it on) or nothing could be
    timed."""
    cached = lookup(device, key)
    if cached is not None and isinstance(cached.get("choice"), list):
        t = at(tuple(cached["choice"]))
        if t is not None and fits(t):
            return t, "cache"
    if time is None:
        return start, "default"

    def candidate(coords: tuple[int, ...]) -> Callable[[], float] | None:
        t = at(coords)
        if t is None or not fits(t) or not worth(t):
            return None
        return lambda: float(time(t))

    coords = climb_grid(device, key, axes, start.coordinates(), candidate, max_trials, finalists, rounds)  # type: ignore[attr-defined]
    if coords is None:
        return start, "default"
    choice = at(coords)
    return (choice if choice is not None else start), "climb"


def cache_path() -> Path:
    """``kernel_tuning.json`` beside ucudnn's cache database (honours ``UCUDNN_DATABASE``)."""
    from ucudnn.config import database_path

    return database_path().parent / "kernel_tuning.json"


def _read(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"format": FORMAT, "devices": {}}
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("devices"), dict):
        return {"format": FORMAT, "devices": {}}  # another format: start afresh rather than fail
    return doc


def lookup(device: str, key: str) -> dict | None:
    """The cached choice ``{"choice": [...], "time_ms": ..., "trials": {...}}`` or ``None``."""
    entry = _memory.get((device, key))
    if entry is None:
        entry = _read(cache_path()).get("devices", {}).get(device, {}).get(key)
        if entry is not None:
            _memory[(device, key)] = entry
    return entry


def record(device: str, key: str, choice: tuple[int, ...], times: dict[tuple[int, ...], float]) -> dict:
    """Remember ``choice`` for ``key`` on ``device`` in memory and in the JSON file (atomic replace)."""
    finite = {",".join(map(str, f)): round(t, 6) for f, t in sorted(times.items()) if t != float("inf")}
    entry = {"choice": list(choice), "time_ms": finite.get(",".join(map(str, choice))), "trials": finite}
    with _lock:
        _memory[(device, key)] = entry
        path = cache_path()
        doc = _read(path)
        doc["devices"].setdefault(device, {})[key] = entry
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".kernel_tuning.")
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only cache folder costs a re-tune next process, nothing else
    return entry


def clear_memory() -> None:
    """Forget in-process choices (tests; the file stays)."""
    _memory.clear()
