"""ucudnn: micro-batched cuDNN convolutions under workspace limits.

Layers, bottom up (each imports only those below it):

* ``ucudnn.cudnn`` — ctypes binding to libcudnn's convolution API, nothing else.
* ``ucudnn.sources`` / ``ucudnn.measure`` — algorithm sources and per-micro-batch benchmarking (GPU).
* ``ucudnn.table``, ``ucudnn.policy``, ``ucudnn.wr``, ``ucudnn.pareto``, ``ucudnn.wd``,
  ``ucudnn.planner`` — planning, pure Python (no GPU, no CuPy).
* ``ucudnn.execute`` — runs plans on CuPy arrays.
* ``ucudnn.api``, ``ucudnn.cli``, ``ucudnn.server``, ``ucudnn.client`` — interfaces.

The names exported here are the small public API.  GPU functions import
CuPy lazily, so ``import ucudnn`` works on a machine without a GPU.
"""
from __future__ import annotations

__version__ = "0.1.0"

from .errors import (CudnnError, CudnnNotFound, GpuUnavailable, InfeasibleError, InputError, TableError,
                     UcudnnError)
from .plan import KernelPlan, MicroConfig, Plan
from .planner import plan
from .problem import ConvProblem
from .table import BenchmarkTable, KernelBench, Measurement
from .units import format_size, parse_size


def __getattr__(name: str):
    # GPU-facing API, imported on first use so the planner never pulls in CuPy.
    if name in ("conv2d_forward", "conv2d_backward_data", "conv2d_backward_filter", "Conv2d", "get_plan"):
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'ucudnn' has no attribute {name!r}")


__all__ = [
    "BenchmarkTable", "ConvProblem", "Conv2d", "CudnnError", "CudnnNotFound", "GpuUnavailable", "InfeasibleError",
    "InputError", "KernelBench", "KernelPlan", "Measurement", "MicroConfig", "Plan", "TableError", "UcudnnError",
    "conv2d_backward_data", "conv2d_backward_filter", "conv2d_forward", "format_size", "get_plan", "parse_size",
    "plan",
]
