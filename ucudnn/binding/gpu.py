"""The GPU side's shared plumbing: CuPy import, cuDNN handles, descriptor sets.

Everything that touches a device goes through here so the planning layers
never import CuPy.  Descriptors are cached per (problem shape, micro-batch,
math type): execution of a plan re-uses them on every call.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..errors import GpuUnavailable
from ..problem import ConvProblem
from . import cudnn

_tls = threading.local()


_cupy: Any = None


def cupy() -> Any:
    """Import CuPy or raise :class:`GpuUnavailable` with the reason (checked once, then cached: it is on the hot path)."""
    global _cupy
    if _cupy is not None:
        return _cupy
    try:
        import cupy as cp  # noqa: F401
    except Exception as e:  # ImportError, or CUDA libs missing
        raise GpuUnavailable(f"CuPy is not usable here ({e}); install ucudnn[cuda13] on a machine with a GPU") from None
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            raise GpuUnavailable("no CUDA device is visible")
    except cp.cuda.runtime.CUDARuntimeError as e:
        raise GpuUnavailable(f"no usable CUDA device ({e})") from None
    _cupy = cp
    return cp


def per_thread(pool: str, key: Any, make: Callable[[], Any]) -> Any:
    """This thread's ``make()`` for ``key`` in its pool named ``pool``, made on first use and kept: resources a
    thread reuses call after call (side streams, extra cuBLAS handles)."""
    cache = getattr(_tls, pool, None)
    if cache is None:
        cache = {}
        setattr(_tls, pool, cache)
    value = cache.get(key)
    if value is None:
        value = cache[key] = make()
    return value


def side_stream(k: int) -> Any:
    """The ``k``-th (1, 2, ...) extra non-blocking CuPy stream of the current device and thread, created once: what a
    launch that overlaps its own steps forks onto (it joins them back to its stream before returning, so a caller
    and a CUDA graph capture see one stream's work)."""
    cp = cupy()
    return per_thread("side_streams", (int(cp.cuda.Device().id), k), lambda: cp.cuda.Stream(non_blocking=True))


def gpu_available() -> bool:
    try:
        cupy()
        cudnn.load()
        return True
    except Exception:
        return False


def device_name(device_id: int | None = None) -> str:
    cp = cupy()
    dev = cp.cuda.Device() if device_id is None else cp.cuda.Device(device_id)
    name = cp.cuda.runtime.getDeviceProperties(dev.id)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def capture(fn: Any) -> Any:
    """``fn``'s CUDA work captured into a CUDA graph on a stream of its own: nothing runs until the graph is
    launched (on any stream).  Whatever the capture raises propagates (the capture is ended first)."""
    cp = cupy()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        try:
            fn()
        finally:
            graph = stream.end_capture()
    return graph


#: the allocator's free memory in bytes, where the layer that owns the allocator knows it better than the device
#: (:func:`set_free_memory`); None: ``cudaMemGetInfo``'s
_free_memory: Callable[[int], int] | None = None


def set_free_memory(fn: Callable[[int], int] | None) -> None:
    """Say how much memory allocations on device ``d`` may still take: ``fn(d)`` bytes (None: the device's free
    memory).  Why: a benchmark sizes its workspace from it, and under PyTorch's
    ``set_per_process_memory_fraction`` (whose caching allocator ucudnn.torch routes CuPy's allocations through)
    the device reports gigabytes free that the process may not take; measured on an H200 under a 1.81 GiB cap
    (AlexNet b256), every first benchmark asked for a 4 GiB workspace and ran out of memory, so every
    convolution fell back to torch's."""
    global _free_memory
    _free_memory = fn


def free_memory(device: int | None = None) -> int:
    """Bytes the current (or given) device's allocations may still take (see :func:`set_free_memory`)."""
    d = current_device() if device is None else device
    if _free_memory is not None:
        return int(_free_memory(d))
    cp = cupy()
    with cp.cuda.Device(d):
        free, _ = cp.cuda.runtime.memGetInfo()
    return int(free)


def current_device() -> int:
    """The current CUDA device (the runtime's, which CuPy's and torch's contexts both set)."""
    return cupy().cuda.runtime.getDevice()


def handle() -> int:
    """This thread's cuDNN handle on the current device, bound to CuPy's current stream."""
    return handle_on(cupy().cuda.get_current_stream().ptr, current_device())


def handle_on(stream: int, device: int) -> int:
    """This thread's cuDNN handle on ``device`` (the current one), bound to ``stream`` (a ``cudaStream_t``).

    Why the stream is remembered: ``cudnnSetStream`` is called only when the handle's stream changes.  A
    training step launches every convolution three times, mostly on one stream, and the call measured
    8-16 us of host time inside a ResNet-50 step on an H100 (``benchmarks/results/torch_profile-*.md``).
    Every caller of ucudnn's handles comes through here, so the remembered stream is the handle's.
    """
    handles = getattr(_tls, "handles", None)
    if handles is None:
        handles = _tls.handles = {}
    entry = handles.get(device)
    if entry is None:
        entry = handles[device] = [cudnn.create(), None]
    if entry[1] != stream:
        cudnn.set_stream(entry[0], stream)
        entry[1] = stream
    return entry[0]


def compute_type(dtype: str) -> str:
    # float16 / bfloat16 accumulate in float32, as the frameworks configure cuDNN
    return "float64" if dtype == "float64" else "float32"


@dataclass
class ConvDescriptors:
    """x, w, y and convolution descriptors of one problem at one micro-batch size and math type."""

    x: int
    w: int
    y: int
    conv: int

    def operands(self, op: str) -> tuple[int, int, int]:
        """(a, b, out) descriptors in cuDNN's argument order for ``op``."""
        return {"forward": (self.x, self.w, self.y), "backward_data": (self.w, self.y, self.x),
                "backward_filter": (self.x, self.y, self.w)}[op]

    def __del__(self) -> None:  # pragma: no cover - runs at interpreter exit too
        try:
            cudnn.destroy_tensor_descriptor(self.x)
            cudnn.destroy_tensor_descriptor(self.y)
            cudnn.destroy_filter_descriptor(self.w)
            cudnn.destroy_convolution_descriptor(self.conv)
        except Exception:
            pass


@lru_cache(maxsize=4096)
def descriptors(problem: ConvProblem, math_type: str = "DEFAULT") -> ConvDescriptors:
    """Descriptors for ``problem`` (its ``n`` is the micro-batch size)."""
    p = problem
    x = cudnn.create_tensor_descriptor()
    cudnn.set_tensor_4d_descriptor(x, p.layout, p.dtype, p.n, p.c, p.h, p.w)
    w = cudnn.create_filter_descriptor()
    cudnn.set_filter_4d_descriptor(w, p.dtype, p.layout, p.k, p.c // p.groups, p.r, p.s)
    conv = cudnn.create_convolution_descriptor()
    cudnn.set_convolution_2d_descriptor(conv, p.pad, p.stride, p.dilation, compute_type(p.dtype))
    if p.groups > 1:
        cudnn.set_convolution_group_count(conv, p.groups)
    cudnn.set_convolution_math_type(conv, math_type)
    n, k, pp, q = cudnn.get_convolution_2d_forward_output_dim(conv, x, w)
    assert (n, k, pp, q) == (p.n, p.k, p.p, p.q), f"cuDNN output dims {(n, k, pp, q)} != {(p.n, p.k, p.p, p.q)}"
    y = cudnn.create_tensor_descriptor()
    if p.k_total is None:
        cudnn.set_tensor_4d_descriptor(y, p.layout, p.dtype, p.n, p.k, p.p, p.q)
    else:   # a channel slice: y (dy) is a view of the wider tensor
        cudnn.set_tensor_4d_descriptor_ex(y, p.dtype, p.n, p.k, p.p, p.q, p.y_strides())
    return ConvDescriptors(x, w, y, conv)


def cupy_dtype(dtype: str) -> Any:
    import numpy as np

    if dtype == "bfloat16":
        try:
            import ml_dtypes  # noqa: F401

            return np.dtype("bfloat16")
        except Exception as e:
            raise GpuUnavailable("bfloat16 arrays need ml_dtypes") from e
    return np.dtype(dtype)
