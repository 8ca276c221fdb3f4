"""Which algorithm sources a benchmark uses, by name: the defaults, ``UCUDNN_SOURCES``, and their cache-key form.

Sources change the measurements, so they are part of every cache key (the
library's, precompute's units, bundles, the plan service).  This module is the
one place that turns what a user wrote (``"graph, legacy"``, a list, None)
into one canonical spelling, so equal requests hit equal keys.  It is pure:
no GPU, no import of the sources themselves.

The default (None everywhere) is the fastest *exact* set the installed
extras allow: ``legacy`` (cudnnFind), ``graph`` (cuDNN graph-API engines)
when ``nvidia-cudnn-frontend`` is installed, ``depthwise`` (ucudnn's depthwise
K x K kernels, NCHW and NHWC) and ``fold`` (strided first layers as stride-1
convolutions over folded channels).  ``depthwise`` and ``fold`` decline every
other layer at no cost.  ``relayout`` stays opt-in: it pays on some layers and
doubles benchmarking time on all of them.

Keys name only the sources that can measure the key's layer: a source whose
layers are few (:data:`NARROW`) leaves the key of every other layer, so adding
``depthwise`` to the default kept every cached plan and bundle entry of the
layers it declines.
"""
from __future__ import annotations

import os
from functools import lru_cache
from typing import Iterable

from .errors import InputError

#: Sources measuring cuDNN (or ucudnn's kernels) directly, in canonical order
BASE = ("legacy", "graph", "mec", "direct", "depthwise", "winograd", "fft")
#: Sources that wrap the other sources named, in the order they wrap (fold wraps a relayout too)
WRAPPERS = ("relayout", "fold")
BUILTIN = BASE + WRAPPERS
#: What keys written before sources were part of the key measured with: such keys stay valid for it
LEGACY_ONLY = "legacy"
#: source -> the source whose measurements include all of its own (a request naming both measures them once)
INCLUDED_IN = {"depthwise": "direct"}


def _depthwise(op: str, problem) -> bool:
    """Whether ``problem`` may be a layer the ``depthwise`` source measures (one filter per channel, one channel a
    group: a single-channel layer with one filter too): a superset of what its kernels run, so a key never leaves
    out a source that measured its layer."""
    return problem.groups == problem.c == problem.k


#: Sources that measure few layers, with the test of those (pure: shapes only): a key of any other layer leaves
#: them out (:func:`key_field`)
NARROW = {"depthwise": _depthwise}


@lru_cache(maxsize=1)
def graph_installed() -> bool:
    """Whether ``nvidia-cudnn-frontend`` is installed (its metadata; importing it needs libcudnn and a GPU)."""
    from importlib.metadata import PackageNotFoundError, distribution

    for dist in ("nvidia-cudnn-frontend", "nvidia_cudnn_frontend"):
        try:
            distribution(dist)
            return True
        except PackageNotFoundError:
            continue
    return False


def default_names() -> tuple[str, ...]:
    """The default sources: ``UCUDNN_SOURCES`` when set, else legacy (+ graph where installed) + depthwise + fold."""
    env = os.environ.get("UCUDNN_SOURCES", "").strip()
    if env:
        return canonical(env, "UCUDNN_SOURCES")
    return ("legacy", "graph", "depthwise", "fold") if graph_installed() else ("legacy", "depthwise", "fold")


def split(sources: str | Iterable[str]) -> list[str]:
    """``"legacy, graph"`` or ``["legacy", "graph"]`` -> ``["legacy", "graph"]`` (order and duplicates kept)."""
    names = sources.split(",") if isinstance(sources, str) else list(sources)
    return [n.strip() if isinstance(n, str) else n for n in names if not (isinstance(n, str) and not n.strip())]


def canonical(sources: str | Iterable[str] | None, field: str = "sources",
              known: Iterable[str] = BUILTIN) -> tuple[str, ...]:
    """The canonical tuple of source names: base sources first (in :data:`BASE` order, then others sorted), then
    wrappers in :data:`WRAPPERS` order; duplicates dropped.  None: :func:`default_names`.

    Order does not change what a benchmark measures (every named source is measured at every size), so
    ``"graph,legacy"`` and ``"legacy,graph"`` are one request; a source another named one includes
    (:data:`INCLUDED_IN`: ``depthwise`` in ``direct``) is dropped.  Unknown names raise :class:`InputError`
    naming ``field``; ``known`` widens the builtin names with registered ones.
    """
    if sources is None:
        return default_names()
    names = split(sources)
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise InputError(f"expected source names such as 'legacy,graph', got {sources!r}", field)
    known = set(known) | set(BUILTIN)
    unknown = sorted({n for n in names if n not in known})
    if unknown:
        what = f"source {unknown[0]!r}" if len(unknown) == 1 else "sources " + ", ".join(map(repr, unknown))
        raise InputError(f"unknown algorithm {what}; known: {', '.join(sorted(known))}", field)
    if not names:
        raise InputError("name at least one algorithm source (legacy, graph)", field)
    names = [n for n in names if INCLUDED_IN.get(n) not in names]
    base = [n for n in BASE if n in names] + sorted({n for n in names if n not in BUILTIN})
    wraps = [n for n in WRAPPERS if n in names]
    return tuple(base + wraps)


def effective(names: Iterable[str], op: str | None, problem) -> tuple[str, ...]:
    """``names`` less the :data:`NARROW` sources that cannot measure ``op`` on ``problem``: they add no row to its
    table, so a request with them and one without are the same measurement of this layer."""
    return tuple(n for n in names if n not in NARROW or NARROW[n](op, problem))


def key_field(names: Iterable[str], op: str | None = None, problem=None) -> str | None:
    """The cache key's ``sources`` value: None (left out of the key) for legacy alone, so keys written before
    sources joined the key (all legacy) still answer; else the canonical names joined by commas.  With the key's
    ``op`` and ``problem``, the names are :func:`effective`'s."""
    if problem is not None:
        names = effective(names, op, problem)
    text = ",".join(names)
    return None if text == LEGACY_ONLY else text


def of_table(extra: dict) -> tuple[str, ...]:
    """The canonical sources a recorded table was measured with: its ``extra["sources"]`` (what
    :func:`ucudnn.measure.benchmark` records), else legacy (tables older than that field are legacy tables)."""
    names = split(extra.get("sources") or LEGACY_ONLY)
    return canonical(names, "sources", known=names)
