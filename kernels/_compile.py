"""Run-time compilation of ``kernels/*.cu`` with CuPy (NVRTC), one module per kernel instantiation.

Kernels are C++ templates whose parameters are tile shapes, vector widths
and pooling windows: a launcher names the instantiation it needs (a name
expression such as ``layout_transpose<unsigned int,64,1,64,4,4,65,256>``) and
gets a ``cupy.RawKernel``.  NVRTC compiles for the current device's own
architecture (CuPy passes ``-arch=sm_XX``) with ``-std=c++17``; CuPy caches
the binary on disk, and this module keeps the loaded kernel per device, so
only the first call of a shape on a machine pays for the compilation.

The sources include ``common.cuh`` textually here (NVRTC gets no include
path); nvcc (CI, tests/test_kernels_compile.py) reads the same files through
its ordinary ``#include``.  Nothing here imports CuPy at module import time,
so ``import ucudnn.kernels`` works without a GPU.
"""
from __future__ import annotations

import re
import threading
from functools import lru_cache
from importlib import resources
from typing import Any

from ucudnn.errors import InputError

OPTIONS = ("-std=c++17",)
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([A-Za-z0-9_.]+)"\s*$', re.MULTILINE)
_lock = threading.Lock()
_kernels: dict[tuple[int, str, str], Any] = {}


def source_names() -> list[str]:
    """Every CUDA source shipped with the package (``*.cu``)."""
    return sorted(p.name for p in resources.files(__package__).iterdir() if p.name.endswith(".cu"))


@lru_cache(maxsize=None)
def source(name: str) -> str:
    """The text of ``name`` with its local ``#include "x.cuh"`` lines replaced by the headers' text."""
    root = resources.files(__package__)
    seen: set[str] = set()

    def expand(text: str) -> str:
        def sub(m: re.Match) -> str:
            header = m.group(1)
            if header in seen:  # every header is #pragma once
                return ""
            seen.add(header)
            return expand(root.joinpath(header).read_text())

        return _INCLUDE.sub(sub, text)

    return expand(root.joinpath(name).read_text())


def cupy() -> Any:
    """CuPy, or :class:`ucudnn.errors.GpuUnavailable` saying why not."""
    from ucudnn.binding.gpu import cupy as _cupy

    return _cupy()


def as_cupy(x: Any, field: str) -> Any:
    """``x`` if it is a CuPy array; a NumPy array (or anything else) is refused, not copied to the GPU silently."""
    cp = cupy()
    if not isinstance(x, cp.ndarray):
        raise InputError(f"expected a CuPy array, got {type(x).__module__}.{type(x).__name__}", field)
    return x


def get_kernel(source_name: str, name_expr: str) -> Any:
    """The ``cupy.RawKernel`` for template instantiation ``name_expr`` of ``source_name`` on the current device."""
    cp = cupy()
    key = (cp.cuda.Device().id, source_name, name_expr)
    kern = _kernels.get(key)
    if kern is None:
        with _lock:
            kern = _kernels.get(key)
            if kern is None:
                kern = _compile(cp, source_name, [name_expr])[name_expr]
                _kernels[key] = kern
    return kern


def _compile(cp: Any, source_name: str, name_exprs: list[str]) -> dict[str, Any]:
    module = cp.RawModule(code=source(source_name), options=OPTIONS, name_expressions=name_exprs)
    return {n: module.get_function(n) for n in name_exprs}


def device_key() -> str:
    """What a tuned choice depends on: the device's name and compute capability."""
    cp = cupy()
    from ucudnn.binding.gpu import device_name

    return f"{device_name()} sm_{cp.cuda.Device().compute_capability}"


def compute_capability() -> int:
    return int(cupy().cuda.Device().compute_capability)

