"""Execution layer: run plans on device arrays, one micro-configuration after another, in the caller's workspace.

:class:`Executor` runs one kernel's plan; :class:`NetworkExecutor` runs a WD plan
with each kernel in its segment of one arena.  Both may capture a call in a
CUDA graph and replay it (``replay=True``).
"""
from __future__ import annotations

from .executor import Executor, NetworkExecutor

__all__ = ["Executor", "NetworkExecutor"]
