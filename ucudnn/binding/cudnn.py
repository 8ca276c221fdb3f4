"""Thin ctypes binding to libcudnn's (legacy) convolution API.

CuPy 14 removed ``cupy.cuda.cudnn``; this module replaces the part ucudnn
needs, in the spirit of CuPy's thin bindings: one Python function per C
function, integers for handles, descriptors and device pointers, and every
status other than ``CUDNN_STATUS_SUCCESS`` raised as :class:`CudnnError`
naming the call.  Nothing here allocates device memory or knows about
plans: memory and streams come from the caller (CuPy).

The library is found in this order: ``UCUDNN_CUDNN_LIBRARY`` (a path), the
``nvidia-cudnn-cu13`` / ``-cu12`` wheels on ``sys.path``, then the system
loader (``libcudnn.so.9``).
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import CudnnError, CudnnNotFound

# --- enums (cudnn_graph.h / cudnn_cnn.h, cuDNN 9) ---------------------------------
DATA_TYPES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 9}
TENSOR_FORMATS = {"NCHW": 0, "NHWC": 1}
CROSS_CORRELATION = 1
MATH_TYPES = {"DEFAULT": 0, "TENSOR_OP": 1, "TENSOR_OP_ALLOW_CONVERSION": 2, "FMA": 3}
MATH_TYPE_NAMES = {v: k for k, v in MATH_TYPES.items()}
NON_DETERMINISTIC, DETERMINISTIC = 0, 1

FWD_ALGOS = ["IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT", "FFT_TILING", "WINOGRAD",
             "WINOGRAD_NONFUSED"]
BWD_DATA_ALGOS = ["ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"]
BWD_FILTER_ALGOS = ["ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING"]
ALGO_NAMES = {"forward": FWD_ALGOS, "backward_data": BWD_DATA_ALGOS, "backward_filter": BWD_FILTER_ALGOS}


def algo_name(op: str, algo: int) -> str:
    names = ALGO_NAMES[op]
    return names[algo] if 0 <= algo < len(names) else f"ALGO_{algo}"


class AlgoPerf(ctypes.Structure):
    """cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t (identical layouts)."""

    _fields_ = [("algo", ctypes.c_int), ("status", ctypes.c_int), ("time", ctypes.c_float),
                ("memory", ctypes.c_size_t), ("determinism", ctypes.c_int), ("mathType", ctypes.c_int),
                ("reserved", ctypes.c_int * 3)]


@dataclass(frozen=True)
class PerfResult:
    """One row of a Find call or a heuristic query (:func:`get_algorithm_v7`), as Python values."""

    algo: int
    status: int
    status_name: str
    time_ms: float
    workspace_bytes: int
    deterministic: bool
    math_type: str


# --- loading ------------------------------------------------------------------------
_lib: ctypes.CDLL | None = None
_lib_path: str | None = None
_lock = threading.Lock()


def _candidates() -> list[str]:
    found: list[str] = []
    user = os.environ.get("UCUDNN_CUDNN_LIBRARY", "").strip()
    if user:
        return [user]
    for entry in sys.path:
        for sub in ("nvidia/cudnn/lib", "nvidia/cu13/lib", "nvidia/cu12/lib"):
            found.extend(sorted(glob.glob(os.path.join(entry, sub, "libcudnn.so.9*"))))
    found.append("libcudnn.so.9")
    return found


def load() -> ctypes.CDLL:
    """Load libcudnn once; raise :class:`CudnnNotFound` listing where it looked."""
    global _lib, _lib_path
    if _lib is not None:   # every call goes through here: no lock once loaded
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried: list[str] = []
        for path in _candidates():
            try:
                lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError as e:
                tried.append(f"{path} ({e})")
                continue
            _declare(lib)
            _lib, _lib_path = lib, path
            return lib
        raise CudnnNotFound("could not load libcudnn.so.9; tried: " + "; ".join(tried) +
                            ". Install nvidia-cudnn-cu13 or set UCUDNN_CUDNN_LIBRARY.")


def library_path() -> str | None:
    return _lib_path


_P = ctypes.c_void_p
_I = ctypes.c_int
_S = ctypes.c_size_t
_PP = ctypes.POINTER(ctypes.c_void_p)
_PI = ctypes.POINTER(ctypes.c_int)
_PS = ctypes.POINTER(ctypes.c_size_t)
_PERF = ctypes.POINTER(AlgoPerf)

_SIGNATURES: dict[str, list] = {
    "cudnnCreate": [_PP], "cudnnDestroy": [_P], "cudnnSetStream": [_P, _P],
    "cudnnCreateTensorDescriptor": [_PP], "cudnnDestroyTensorDescriptor": [_P],
    "cudnnSetTensor4dDescriptor": [_P, _I, _I, _I, _I, _I, _I],
    "cudnnSetTensor4dDescriptorEx": [_P, _I, _I, _I, _I, _I, _I, _I, _I, _I],
    "cudnnCreateFilterDescriptor": [_PP], "cudnnDestroyFilterDescriptor": [_P],
    "cudnnSetFilter4dDescriptor": [_P, _I, _I, _I, _I, _I, _I],
    "cudnnCreateConvolutionDescriptor": [_PP], "cudnnDestroyConvolutionDescriptor": [_P],
    "cudnnSetConvolution2dDescriptor": [_P, _I, _I, _I, _I, _I, _I, _I, _I],
    "cudnnSetConvolutionGroupCount": [_P, _I], "cudnnSetConvolutionMathType": [_P, _I],
    "cudnnGetConvolution2dForwardOutputDim": [_P, _P, _P, _PI, _PI, _PI, _PI],
    "cudnnGetConvolutionForwardAlgorithmMaxCount": [_P, _PI],
    "cudnnGetConvolutionBackwardDataAlgorithmMaxCount": [_P, _PI],
    "cudnnGetConvolutionBackwardFilterAlgorithmMaxCount": [_P, _PI],
    "cudnnFindConvolutionForwardAlgorithmEx": [_P, _P, _P, _P, _P, _P, _P, _P, _I, _PI, _PERF, _P, _S],
    "cudnnFindConvolutionBackwardDataAlgorithmEx": [_P, _P, _P, _P, _P, _P, _P, _P, _I, _PI, _PERF, _P, _S],
    "cudnnFindConvolutionBackwardFilterAlgorithmEx": [_P, _P, _P, _P, _P, _P, _P, _P, _I, _PI, _PERF, _P, _S],
    "cudnnGetConvolutionForwardAlgorithm_v7": [_P, _P, _P, _P, _P, _I, _PI, _PERF],
    "cudnnGetConvolutionBackwardDataAlgorithm_v7": [_P, _P, _P, _P, _P, _I, _PI, _PERF],
    "cudnnGetConvolutionBackwardFilterAlgorithm_v7": [_P, _P, _P, _P, _P, _I, _PI, _PERF],
    "cudnnGetConvolutionForwardWorkspaceSize": [_P, _P, _P, _P, _P, _I, _PS],
    "cudnnGetConvolutionBackwardDataWorkspaceSize": [_P, _P, _P, _P, _P, _I, _PS],
    "cudnnGetConvolutionBackwardFilterWorkspaceSize": [_P, _P, _P, _P, _P, _I, _PS],
    "cudnnConvolutionForward": [_P, _P, _P, _P, _P, _P, _P, _I, _P, _S, _P, _P, _P],
    "cudnnConvolutionBackwardData": [_P, _P, _P, _P, _P, _P, _P, _I, _P, _S, _P, _P, _P],
    "cudnnConvolutionBackwardFilter": [_P, _P, _P, _P, _P, _P, _P, _I, _P, _S, _P, _P, _P],
    # used by ucudnn.kernels' benchmarks to compare against cuDNN's own memory-bound ops
    "cudnnTransformTensor": [_P, _P, _P, _P, _P, _P, _P],
    "cudnnSoftmaxForward": [_P, _I, _I, _P, _P, _P, _P, _P, _P],
    "cudnnCreatePoolingDescriptor": [_PP], "cudnnDestroyPoolingDescriptor": [_P],
    "cudnnSetPooling2dDescriptor": [_P, _I, _I, _I, _I, _I, _I, _I, _I],
    "cudnnPoolingForward": [_P, _P, _P, _P, _P, _P, _P, _P],
}


def _declare(lib: ctypes.CDLL) -> None:
    lib.cudnnGetVersion.restype = ctypes.c_size_t
    lib.cudnnGetVersion.argtypes = []
    lib.cudnnGetErrorString.restype = ctypes.c_char_p
    lib.cudnnGetErrorString.argtypes = [_I]
    for name, argtypes in _SIGNATURES.items():
        fn = getattr(lib, name, None)
        if fn is None:  # an optional symbol missing in this build: calling it raises CudnnError
            continue
        fn.restype = _I
        fn.argtypes = argtypes


def status_name(status: int) -> str:
    try:
        raw = load().cudnnGetErrorString(status)
        return raw.decode() if raw else f"CUDNN_STATUS_{status}"
    except CudnnNotFound:
        return f"CUDNN_STATUS_{status}"


def _symbol(name: str) -> Callable:
    """libcudnn's function ``name`` (argument types set by :func:`load`), or a CudnnError saying it is missing."""
    fn: Callable | None = getattr(load(), name, None)
    if fn is None:
        raise CudnnError(name, -1, "SYMBOL_NOT_FOUND", f"{_lib_path} does not export {name}")
    return fn


def _call(name: str, *args) -> None:
    status = _symbol(name)(*args)
    if status != 0:
        raise CudnnError(name, status, status_name(status))


def get_version() -> int:
    """cuDNN's version as an integer: 9.19.0 -> 91900."""
    return int(load().cudnnGetVersion())


# --- handle -------------------------------------------------------------------------
def create() -> int:
    h = ctypes.c_void_p()
    _call("cudnnCreate", ctypes.byref(h))
    return h.value or 0


def destroy(handle: int) -> None:
    _call("cudnnDestroy", handle)


def set_stream(handle: int, stream: int) -> None:
    _call("cudnnSetStream", handle, stream)


# --- descriptors --------------------------------------------------------------------
def _create(kind: str) -> int:
    d = ctypes.c_void_p()
    _call(f"cudnnCreate{kind}Descriptor", ctypes.byref(d))
    return d.value or 0


def create_tensor_descriptor() -> int:
    return _create("Tensor")


def destroy_tensor_descriptor(desc: int) -> None:
    _call("cudnnDestroyTensorDescriptor", desc)


def set_tensor_4d_descriptor(desc: int, layout: str, dtype: str, n: int, c: int, h: int, w: int) -> None:
    _call("cudnnSetTensor4dDescriptor", desc, TENSOR_FORMATS[layout], DATA_TYPES[dtype], n, c, h, w)


def set_tensor_4d_descriptor_ex(desc: int, dtype: str, n: int, c: int, h: int, w: int,
                                strides: tuple[int, int, int, int]) -> None:
    """A 4-D tensor with explicit element strides in (n, c, h, w) order: a view such as a channel slice."""
    _call("cudnnSetTensor4dDescriptorEx", desc, DATA_TYPES[dtype], n, c, h, w, *strides)


def create_filter_descriptor() -> int:
    return _create("Filter")


def destroy_filter_descriptor(desc: int) -> None:
    _call("cudnnDestroyFilterDescriptor", desc)


def set_filter_4d_descriptor(desc: int, dtype: str, layout: str, k: int, c: int, r: int, s: int) -> None:
    _call("cudnnSetFilter4dDescriptor", desc, DATA_TYPES[dtype], TENSOR_FORMATS[layout], k, c, r, s)


def create_convolution_descriptor() -> int:
    return _create("Convolution")


def destroy_convolution_descriptor(desc: int) -> None:
    _call("cudnnDestroyConvolutionDescriptor", desc)


def set_convolution_2d_descriptor(desc: int, pad: tuple[int, int], stride: tuple[int, int],
                                  dilation: tuple[int, int], compute_type: str) -> None:
    _call("cudnnSetConvolution2dDescriptor", desc, pad[0], pad[1], stride[0], stride[1], dilation[0], dilation[1],
          CROSS_CORRELATION, DATA_TYPES[compute_type])


def set_convolution_group_count(desc: int, groups: int) -> None:
    _call("cudnnSetConvolutionGroupCount", desc, groups)


def set_convolution_math_type(desc: int, math_type: str) -> None:
    _call("cudnnSetConvolutionMathType", desc, MATH_TYPES[math_type])


def get_convolution_2d_forward_output_dim(conv: int, x: int, w: int) -> tuple[int, int, int, int]:
    dims = [ctypes.c_int() for _ in range(4)]
    _call("cudnnGetConvolution2dForwardOutputDim", conv, x, w, *(ctypes.byref(d) for d in dims))
    return tuple(d.value for d in dims)  # type: ignore[return-value]


# --- algorithms ---------------------------------------------------------------------
_OP_SUFFIX = {"forward": "Forward", "backward_data": "BackwardData", "backward_filter": "BackwardFilter"}


def get_algorithm_max_count(handle: int, op: str) -> int:
    n = ctypes.c_int()
    _call(f"cudnnGetConvolution{_OP_SUFFIX[op]}AlgorithmMaxCount", handle, ctypes.byref(n))
    return n.value


def find_algorithm_ex(handle: int, op: str, a_desc: int, a: int, b_desc: int, b: int, conv: int, out_desc: int,
                      out: int, requested: int, workspace: int, workspace_bytes: int) -> list[PerfResult]:
    """cudnnFind{Forward,BackwardData,BackwardFilter}AlgorithmEx.

    Argument order follows cuDNN: forward (x, w -> y), backward_data (w, dy -> dx),
    backward_filter (x, dy -> dw).  ``out`` is overwritten.
    """
    perf = (AlgoPerf * requested)()
    got = ctypes.c_int()
    _call(f"cudnnFindConvolution{_OP_SUFFIX[op]}AlgorithmEx", handle, a_desc, a, b_desc, b, conv, out_desc, out,
          requested, ctypes.byref(got), perf, workspace, workspace_bytes)
    return _perf_results(perf, got.value)


def get_algorithm_v7(handle: int, op: str, a_desc: int, b_desc: int, conv: int, out_desc: int,
                     requested: int) -> list[PerfResult]:
    """cudnnGetConvolution{Forward,BackwardData,BackwardFilter}Algorithm_v7: cuDNN's heuristic ranking.

    Nothing runs and no memory is touched, so it answers in a fraction of Find's time: what a first call that
    must not wait on a benchmark can go on.  Rows come best first (kept in that order); ``time_ms`` is -1 (not
    timed); ``workspace_bytes`` is the heuristic's own figure (it matched :func:`get_workspace_size` on every
    row seen on an H100 with cuDNN 9.19, but the executor checks the latter).  Descriptor order as in
    :func:`find_algorithm_ex`.
    """
    perf = (AlgoPerf * requested)()
    got = ctypes.c_int()
    _call(f"cudnnGetConvolution{_OP_SUFFIX[op]}Algorithm_v7", handle, a_desc, b_desc, conv, out_desc, requested,
          ctypes.byref(got), perf)
    return _perf_results(perf, got.value)


def _perf_results(perf, count: int) -> list[PerfResult]:
    """The first ``count`` rows of an AlgoPerf array (the three ops' perf structs share its layout)."""
    return [PerfResult(p.algo, p.status, status_name(p.status) if p.status else "CUDNN_STATUS_SUCCESS",
                       float(p.time), int(p.memory), p.determinism == DETERMINISTIC,
                       MATH_TYPE_NAMES.get(p.mathType, str(p.mathType)))
            for p in perf[:count]]


def get_workspace_size(handle: int, op: str, a_desc: int, b_desc: int, conv: int, out_desc: int, algo: int) -> int:
    """cudnnGet*WorkspaceSize with the same descriptor order as :func:`find_algorithm_ex`."""
    size = ctypes.c_size_t()
    _call(f"cudnnGetConvolution{_OP_SUFFIX[op]}WorkspaceSize", handle, a_desc, b_desc, conv, out_desc, algo,
          ctypes.byref(size))
    return size.value


def _scalar(value: float, dtype: str):
    # cuDNN takes alpha/beta as double for double data, float otherwise
    return ctypes.c_double(value) if dtype == "float64" else ctypes.c_float(value)


def convolution(handle: int, op: str, alpha: float, a_desc: int, a: int, b_desc: int, b: int, conv: int, algo: int,
                workspace: int, workspace_bytes: int, beta: float, out_desc: int, out: int,
                scalar_dtype: str = "float32") -> None:
    """cudnnConvolution{Forward,BackwardData,BackwardFilter}: out = alpha * op(a, b) + beta * out.

    Operand order as in :func:`find_algorithm_ex`.
    """
    al, be = _scalar(alpha, scalar_dtype), _scalar(beta, scalar_dtype)
    _call(f"cudnnConvolution{_OP_SUFFIX[op]}", handle, ctypes.byref(al), a_desc, a, b_desc, b, conv, algo,
          workspace, workspace_bytes, ctypes.byref(be), out_desc, out)


def entry_point(op: str) -> tuple[Callable, str]:
    """(the ctypes function of ``op``'s cudnnConvolution* entry point, its name), for callers that bind it once
    (a prepared launcher's shortcut): the same function :func:`convolution` calls."""
    name = f"cudnnConvolution{_OP_SUFFIX[op]}"
    return _symbol(name), name


def scalar_ref(value: float, dtype: str = "float32") -> Any:
    """A by-reference scalar argument (alpha, beta) that lives as long as the returned object."""
    return ctypes.byref(_scalar(value, dtype))


# --- other ops (baselines for ucudnn.kernels' benchmarks) ------------------------------
def transform_tensor(handle: int, alpha: float, x_desc: int, x: int, beta: float, y_desc: int, y: int) -> None:
    al, be = ctypes.c_float(alpha), ctypes.c_float(beta)
    _call("cudnnTransformTensor", handle, ctypes.byref(al), x_desc, x, ctypes.byref(be), y_desc, y)


SOFTMAX_ACCURATE, SOFTMAX_MODE_INSTANCE, SOFTMAX_MODE_CHANNEL = 1, 0, 1


def softmax_forward(handle: int, algorithm: int, mode: int, x_desc: int, x: int, y_desc: int, y: int) -> None:
    al, be = ctypes.c_float(1.0), ctypes.c_float(0.0)
    _call("cudnnSoftmaxForward", handle, algorithm, mode, ctypes.byref(al), x_desc, x, ctypes.byref(be), y_desc, y)


POOLING_MAX, POOLING_AVG_INCLUDE_PAD, POOLING_AVG_EXCLUDE_PAD = 0, 1, 2


def create_pooling_descriptor() -> int:
    return _create("Pooling")


def destroy_pooling_descriptor(desc: int) -> None:
    _call("cudnnDestroyPoolingDescriptor", desc)


def set_pooling_2d_descriptor(desc: int, mode: int, window: tuple[int, int], pad: tuple[int, int],
                              stride: tuple[int, int]) -> None:
    _call("cudnnSetPooling2dDescriptor", desc, mode, 0, window[0], window[1], pad[0], pad[1], stride[0], stride[1])


def pooling_forward(handle: int, pool: int, x_desc: int, x: int, y_desc: int, y: int) -> None:
    al, be = ctypes.c_float(1.0), ctypes.c_float(0.0)
    _call("cudnnPoolingForward", handle, pool, ctypes.byref(al), x_desc, x, ctypes.byref(be), y_desc, y)
