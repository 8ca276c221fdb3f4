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
from dataclasses import dataclass
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
    return expand_includes(resources.files(__package__).joinpath(name).read_text())


def expand_includes(text: str) -> str:
    """``text`` (a CUDA source) with its local ``#include "x.cuh"`` lines replaced by the shipped headers' text,
    each header once (every header is ``#pragma once``): what NVRTC compiles, for a shipped source (:func:`source`)
    or another version of one (``benchmarks/fft_filter_ab.py`` compiles an earlier kernel beside the current)."""
    root = resources.files(__package__)
    seen: set[str] = set()

    def expand(part: str) -> str:
        def sub(m: re.Match) -> str:
            header = m.group(1)
            if header in seen:
                return ""
            seen.add(header)
            return expand(root.joinpath(header).read_text())

        return _INCLUDE.sub(sub, part)

    return expand(text)


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


class Slot:
    """A kernel argument filled at each call of a :class:`PackedLaunch` (its C type: ``ptr``, ``f32`` or ``i32``)."""

    def __init__(self, kind: str) -> None:
        if kind not in _SLOT_CTYPES:
            raise InputError(f"slot kind must be one of {sorted(_SLOT_CTYPES)}, got {kind!r}", "kind")
        self.kind = kind


#: the ctypes type (name) and zero of each slot kind
_SLOT_CTYPES = {"ptr": ("c_void_p", 0), "f32": ("c_float", 0.0), "i32": ("c_int32", 0)}
#: the per-call argument markers of :func:`packed`
PTR, F32, I32 = Slot("ptr"), Slot("f32"), Slot("i32")
#: the ctypes type of each NumPy scalar type a packed launch takes as a fixed argument
_CTYPES = {"int32": "c_int32", "int64": "c_int64", "uint32": "c_uint32", "uint64": "c_uint64",
           "float32": "c_float", "float64": "c_double"}


class PackedLaunch:
    """One kernel launch whose arguments were converted once into a parameter block: a call writes only the
    :class:`Slot` arguments and calls ``cuLaunchKernel`` (CuPy's driver binding) on the given stream.

    Why: ``RawKernel.__call__`` converts every argument at every launch; a chunked winograd call launches two
    transforms a chunk with 16 arguments each, and eagerly those calls were host-bound (35-65 us of host work a
    chunk on the H200 host against 20-40 us of GPU work: ``benchmarks/results/eager_truth_winograd-bwf-streams.md``).
    The driver copies the parameter block at launch (and into a graph node under capture), so refilling it for the
    next call is safe; a lock keeps two threads from filling it at once.  Where the kernel exposes no function
    pointer the call goes through ``RawKernel`` unchanged."""

    def __init__(self, kernel: Any, grid: tuple[int, ...], block: tuple[int, ...], args: tuple,
                 shared_mem: int = 0) -> None:
        import ctypes

        import numpy as np

        self._kernel, self._args = kernel, args
        self._grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        self._block = tuple(int(b) for b in block) + (1,) * (3 - len(block))
        self._shared = int(shared_mem)
        values, slots = [], []
        for i, a in enumerate(args):
            if isinstance(a, Slot):
                name, zero = _SLOT_CTYPES[a.kind]
                v = getattr(ctypes, name)(zero)
                slots.append(v)
            elif isinstance(a, np.generic) and a.dtype.name in _CTYPES:
                v = getattr(ctypes, _CTYPES[a.dtype.name])(a.item())
            else:
                raise InputError(f"argument {i} must be a Slot or a NumPy scalar of {sorted(_CTYPES)}, "
                                 f"got {a!r}", "args")
            values.append(v)
        self._values, self._slots = values, slots   # _values: the block points into them, so they live as long
        self._params = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
        self._params_ptr = ctypes.addressof(self._params)
        self._lock = threading.Lock()
        fn = getattr(getattr(kernel, "kernel", None), "ptr", None)
        self._func = int(fn) if fn else None
        self._launch_kernel = cupy().cuda.driver.launchKernel if self._func else None

    def __call__(self, *filled: Any, stream: int | None = None) -> None:
        """Launch with the :class:`Slot` arguments ``filled`` in order, on ``stream`` (a raw stream pointer;
        default CuPy's current stream)."""
        if len(filled) != len(self._slots):
            raise InputError(f"this launch takes {len(self._slots)} per-call arguments, got {len(filled)}", "filled")
        if self._func is None:   # no function pointer: CuPy's own launch, argument by argument
            it = iter(filled)
            args = tuple(next(it) if isinstance(a, Slot) else a for a in self._args)
            if stream is None:
                self._kernel(self._grid, self._block, args, shared_mem=self._shared)
            else:
                with cupy().cuda.ExternalStream(stream):
                    self._kernel(self._grid, self._block, args, shared_mem=self._shared)
            return
        if stream is None:
            stream = cupy().cuda.get_current_stream().ptr
        (gx, gy, gz), (bx, by, bz) = self._grid, self._block
        with self._lock:
            for slot, value in zip(self._slots, filled):
                slot.value = value
            self._launch_kernel(self._func, gx, gy, gz, bx, by, bz, self._shared, stream, self._params_ptr, 0)


#: the per-call arguments of a :class:`Call`: the operands in cuDNN's order, the scaling factors and the workspace
CALL_ROLES = ("a", "b", "out", "alpha", "beta", "ws")


@dataclass(frozen=True)
class Call:
    """One kernel launch of a launcher, as data: ``scalar`` (a ``cupy.RawKernel``), or ``vector`` where every operand
    named in ``aligned`` is 16-byte aligned, on ``grid`` x ``block`` with ``smem`` bytes of dynamic shared memory;
    ``args`` each a :data:`CALL_ROLES` name (filled at each launch) or a NumPy scalar (int32, int64, float32).

    Why data: the same description runs here (:func:`run_calls`) and in ucudnn.torch's compiled launch path, which
    launches ucudnn's own kernels without Python (``csrc/launch.cpp``): one source of truth for both."""

    scalar: Any
    vector: Any
    aligned: tuple[str, ...]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    args: tuple


def run_calls(calls: tuple[Call, ...], a: int, b: int, out: int, alpha: float, beta: float, ws: int = 0) -> None:
    """Launch ``calls`` in order on CuPy's current stream, the operand pointers, scaling factors and workspace
    pointer filled in."""
    import numpy as np

    roles = {"a": a, "b": b, "out": out, "alpha": np.float32(alpha), "beta": np.float32(beta), "ws": ws}
    for c in calls:     # ``aligned`` names operands only (a, b, out)
        kernel = c.vector if c.vector is not None and not any(roles[r] % 16 for r in c.aligned) else c.scalar
        kernel(c.grid, c.block, tuple(roles[x] if isinstance(x, str) else x for x in c.args), shared_mem=c.smem)


def calls_launcher(calls: tuple[Call, ...]) -> Any:
    """``launch(a, b, out, alpha, beta, ws=0)`` running ``calls`` (:func:`run_calls`), with ``launch.calls``: what
    ucudnn.torch's compiled path launches itself from the same description."""
    def launch(a: int, b: int, out: int, alpha: float, beta: float, ws: int = 0) -> None:
        run_calls(calls, a, b, out, alpha, beta, ws)

    launch.calls = calls   # type: ignore[attr-defined]
    return launch


def packed(kernel: Any, grid: tuple[int, ...], block: tuple[int, ...], args: tuple,
           shared_mem: int = 0) -> PackedLaunch:
    """``kernel`` (a ``cupy.RawKernel``) launched on ``grid`` x ``block`` with ``args`` converted once: NumPy
    scalars are fixed, :data:`PTR` / :data:`F32` are filled at each call (:class:`PackedLaunch`)."""
    return PackedLaunch(kernel, grid, block, args, shared_mem)
