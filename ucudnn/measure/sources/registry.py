"""Sources by name, so a plan's ``source`` field finds the code that runs it."""
from __future__ import annotations

import importlib

from .base import AlgorithmSource

_SOURCES: dict[str, AlgorithmSource] = {}
# ucudnn's own sources, created on first use (the graph source needs the optional frontend only when it runs)
_BUILTIN = {"legacy": ("ucudnn.measure.sources.legacy", "LegacySource"), "graph": ("ucudnn.measure.sources.graph", "GraphSource"),
            "relayout": ("ucudnn.measure.sources.relayout", "RelayoutSource"), "fold": ("ucudnn.measure.sources.fold", "FoldSource"),
            "mec": ("ucudnn.measure.sources.mec", "MecSource"), "direct": ("ucudnn.measure.sources.direct", "DirectSource"),
            "depthwise": ("ucudnn.measure.sources.direct", "DepthwiseSource"),
            "winograd": ("ucudnn.measure.sources.winograd", "WinogradSource"),
            "fft": ("ucudnn.measure.sources.fft", "FftSource")}


def register(source: AlgorithmSource) -> None:
    _SOURCES[source.name] = source


def known() -> list[str]:
    return sorted(set(_SOURCES) | set(_BUILTIN))


#: The graph source a name gets: the first 12 engine configurations that build at each micro-batch size, in
#: cuDNN's heuristic order (replayed on the recorded AlexNet H100 tables, strict and TF32, NCHW and NHWC, WR at
#: 64 MiB plans the same as with every configuration; 8 loses up to 5.7%, 4 up to 6.1%).  ``GraphSource()``
#: itself, and ``ucudnn bench --graph-top-k``, still offer every configuration or another k.
DEFAULT_GRAPH_TOP_K = 12
_KWARGS = {"graph": {"top_k": DEFAULT_GRAPH_TOP_K}}


def get(name: str) -> AlgorithmSource:
    if name not in _SOURCES and name in _BUILTIN:
        module, cls = _BUILTIN[name]
        register(getattr(importlib.import_module(module), cls)(**_KWARGS.get(name, {})))
    try:
        return _SOURCES[name]
    except KeyError:
        from ...errors import InputError

        raise InputError(f"unknown algorithm source {name!r}; known: {', '.join(known())}", "source") from None
