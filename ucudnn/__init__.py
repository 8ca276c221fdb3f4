"""ucudnn: micro-batched cuDNN convolutions under workspace limits.

Layers, bottom up; each package imports only those below it (tests check it):

* basics — :mod:`.errors`, :mod:`.units`, :mod:`.config`, :mod:`.problem`, :mod:`.numerics`, :mod:`.policy`:
  what every layer shares (convolution problems, numerics, batch-size policies, sizes, environment).
* :mod:`.binding` — ctypes over libcudnn, CuPy plumbing (GPU).
* :mod:`.measure` — benchmarking with pluggable algorithm sources (GPU).
* :mod:`.planning` — tables, plans, WR, Pareto sets, WD, arenas: pure Python (no GPU, no CuPy).
* :mod:`.execute` — runs plans on device arrays.
* :mod:`.catalog` — where tables and plans are kept and found (store, bundles, plan-server client, lookup chain).
* :mod:`.cluster` — precomputing plans on engines (local processes or Ray).
* interfaces — :mod:`.api` (this package's ``conv2d_*`` and ``Conv2d``), :mod:`.cli`, ``ucudnn.server`` (HTTP).

The names exported here are the small public API.  GPU functions import
CuPy lazily, so ``import ucudnn`` works on a machine without a GPU.
"""
from __future__ import annotations

__version__ = "0.1.0"

from . import _moved
from .errors import CudnnError, CudnnNotFound, GpuUnavailable, InfeasibleError, InputError, TableError, UcudnnError
from .planning.plan import KernelPlan, MicroConfig, Plan
from .planning.planner import plan
from .planning.table import BenchmarkTable, KernelBench, Measurement
from .problem import ConvProblem
from .units import format_size, parse_size

_moved.install()

_API = ("conv2d_forward", "conv2d_backward_data", "conv2d_backward_filter", "Conv2d", "get_plan", "wait_for_benchmarks")
_INFERENCE = ("infer", "plan_inference")


def __getattr__(name: str):
    # GPU-facing API, imported on first use so the planner never pulls in CuPy.
    if name in _API:
        from . import api

        return getattr(api, name)
    if name in _INFERENCE:
        from . import inference

        return getattr(inference, name)
    # old flat module paths (``ucudnn.network.from_torch``): see ucudnn._moved
    if f"ucudnn.{name}" in _moved.MOVED:
        import importlib

        try:
            return importlib.import_module(f"ucudnn.{name}")
        except ImportError as e:   # hasattr() and getattr(..., default) expect AttributeError
            raise AttributeError(f"module 'ucudnn' has no attribute {name!r} ({e})") from e
    raise AttributeError(f"module 'ucudnn' has no attribute {name!r}")


__all__ = [
    "BenchmarkTable", "ConvProblem", "Conv2d", "CudnnError", "CudnnNotFound", "GpuUnavailable", "InfeasibleError",
    "InputError", "KernelBench", "KernelPlan", "Measurement", "MicroConfig", "Plan", "TableError", "UcudnnError",
    "conv2d_backward_data", "conv2d_backward_filter", "conv2d_forward", "format_size", "get_plan", "infer", "parse_size",
    "plan", "plan_inference", "wait_for_benchmarks",
]
