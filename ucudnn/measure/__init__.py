"""Measurement layer: benchmark kernels at every micro-batch size, over pluggable algorithm sources (GPU).

* :mod:`.benchmarking` — :func:`benchmark` builds a :class:`~ucudnn.planning.table.BenchmarkTable`,
  the interchange format the planning layer reads; :func:`resolve_sources` turns names into sources.
* :mod:`.timing` — how one configuration is timed (eager or replayed in a CUDA graph).
* :mod:`.sources` — where micro-configurations come from: ``legacy`` (cuDNN's Find), ``graph``
  (cudnn-frontend engines), and the wrappers ``relayout`` and ``fold`` (ucudnn's own kernels).
"""
from __future__ import annotations

from .benchmarking import WRAPPERS, Buffers, benchmark, default_sources, resolve_sources

__all__ = ["WRAPPERS", "Buffers", "benchmark", "default_sources", "resolve_sources"]
