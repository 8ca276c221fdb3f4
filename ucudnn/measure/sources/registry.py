"""Sources by name, so a plan's ``source`` field finds the code that runs it."""
from __future__ import annotations

import importlib

from .base import AlgorithmSource

_SOURCES: dict[str, AlgorithmSource] = {}
# ucudnn's own sources, created on first use (the graph source needs the optional frontend only when it runs)
_BUILTIN = {"legacy": ("ucudnn.measure.sources.legacy", "LegacySource"), "graph": ("ucudnn.measure.sources.graph", "GraphSource"),
            "relayout": ("ucudnn.measure.sources.relayout", "RelayoutSource"), "fold": ("ucudnn.measure.sources.fold", "FoldSource")}


def register(source: AlgorithmSource) -> None:
    _SOURCES[source.name] = source


def known() -> list[str]:
    return sorted(set(_SOURCES) | set(_BUILTIN))


def get(name: str) -> AlgorithmSource:
    if name not in _SOURCES and name in _BUILTIN:
        module, cls = _BUILTIN[name]
        register(getattr(importlib.import_module(module), cls)())
    try:
        return _SOURCES[name]
    except KeyError:
        from ...errors import InputError

        raise InputError(f"unknown algorithm source {name!r}; known: {', '.join(known())}", "source") from None
