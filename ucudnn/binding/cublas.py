"""The slice of cuBLAS the ``mec`` source needs: strided-batched GEMMs on CuPy's cuBLAS handle.

Why CuPy's handle: one per device and thread, already created (and its library loaded) by CuPy, so ucudnn adds no
handle of its own.  The calls go through ctypes on the libcublas CuPy loaded (dlopen by soname finds the loaded
copy), not through CuPy's Cython binding (``cupy_backends.cuda.libs.cublas``, the fallback): CuPy 14's refuses every
call while a stream is being captured ("calling cuBLAS API during stream capture is currently unsupported", seen on
an H100), and a plan's steps must be capturable into CUDA graphs.  Every call takes integers for handles, device
pointers and host pointers to the scalars, as CuPy's binding does.

Numerics (:func:`compute_type`): cuBLAS's ``CUBLAS_COMPUTE_32F`` may still use TF32 tensor cores when the handle's
math mode allows them (CuPy sets ``CUBLAS_TF32_TENSOR_OP_MATH`` under ``CUPY_TF32=1``), so true FP32 asks for
``CUBLAS_COMPUTE_32F_PEDANTIC``, which forbids any reduced-precision shortcut whatever the handle says.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable

from ..errors import InputError, UcudnnError

# --- enums (cublas_api.h, library_types.h) ---------------------------------------------------------------------
OPERATIONS = {"N": 0, "T": 1, "C": 2}
DATA_TYPES = {"float32": 0, "float16": 2, "bfloat16": 14}      # cudaDataType: CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF
#: complex operands (the fft source's transform-domain products): cudaDataType CUDA_C_32F
COMPLEX_TYPES = {"complex64": 4}
COMPUTE_TYPES = {"32F": 68, "32F_PEDANTIC": 69, "32F_FAST_TF32": 77}   # cublasComputeType_t
GEMM_DEFAULT = -1                                                # cublasGemmAlgo_t: the library's heuristic
POINTER_MODE_HOST = 0


class CublasError(UcudnnError, RuntimeError):
    """A cuBLAS call failed (its status, or CuPy's error for it)."""


def compute_type(numerics: str, dtype: str) -> tuple[str, str]:
    """(cuBLAS compute type, ucudnn math label) of a GEMM under ``numerics`` on ``dtype`` data.

    The labels are cuDNN's math-type vocabulary (:func:`ucudnn.numerics.allowed_math_types`), so the planner's
    numerics rules read them as they read legacy rows: ``FMA`` true FP32 (pedantic: no TF32 even where the
    handle's math mode would allow it); ``TENSOR_OP`` tensor cores (TF32 for float32 data under ``tf32`` and
    ``default``; FP16 / BF16 inputs with FP32 accumulation for half data under every mode)."""
    from .. import numerics as num

    base = num.normalize(numerics, dtype).partition("-")[0]
    if dtype not in DATA_TYPES:
        raise InputError(f"must be one of {', '.join(DATA_TYPES)}, got {dtype!r}", "dtype")
    if dtype == "float32":
        return ("32F_PEDANTIC", "FMA") if base == "strict" else ("32F_FAST_TF32", "TENSOR_OP")
    return "32F", "TENSOR_OP"


# --- the calls --------------------------------------------------------------------------------------------------
_lock = threading.Lock()
_impl: dict[str, Callable[..., Any]] | None = None


def _cupy_impl() -> dict[str, Callable[..., Any]] | None:
    try:
        from cupy_backends.cuda.libs import cublas as cb  # type: ignore[import-not-found]
    except Exception:  # noqa: BLE001 - not this CuPy
        return None
    names = ("gemmStridedBatchedEx", "setStream", "setPointerMode")
    if not all(hasattr(cb, n) for n in names):
        return None
    return {"gemm": cb.gemmStridedBatchedEx, "set_stream": cb.setStream, "set_pointer_mode": cb.setPointerMode,
            "math_mode": getattr(cb, "getMathMode", None), "create": cb.create,
            "impl": lambda: "cupy_backends.cuda.libs.cublas"}


def load(stem: str = "libcublas") -> ctypes.CDLL:
    """``stem`` (libcublas, libcublasLt) by soname, CUDA 13's first: after :func:`handle`, which makes CuPy load
    its libcublas (and libcublasLt with it), the soname resolves to the copy CuPy loaded."""
    handle()
    errors = []
    for name in (f"{stem}.so.13", f"{stem}.so.12", f"{stem}.so"):
        try:
            return ctypes.CDLL(name)
        except OSError as e:
            errors.append(str(e))
    raise CublasError(f"{stem} could not be loaded: {'; '.join(errors)}")


def _ctypes_impl() -> dict[str, Callable[..., Any]]:
    lib = load("libcublas")
    vp, i, ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
    gemm = lib.cublasGemmStridedBatchedEx
    gemm.argtypes = [vp, i, i, i, i, i, vp, vp, i, i, ll, vp, i, i, ll, vp, vp, i, i, ll, i, i, i]
    gemm.restype = i
    set_stream = lib.cublasSetStream_v2
    set_stream.argtypes, set_stream.restype = [vp, vp], i
    set_mode = lib.cublasSetPointerMode_v2
    set_mode.argtypes, set_mode.restype = [vp, i], i
    get_math = lib.cublasGetMathMode
    get_math.argtypes, get_math.restype = [vp, ctypes.POINTER(i)], i
    create = lib.cublasCreate_v2
    create.argtypes, create.restype = [ctypes.POINTER(vp)], i

    def create_handle() -> int:
        out = vp()
        check("cublasCreate", create(ctypes.byref(out)))
        return int(out.value)

    def math_mode(h: int) -> int:
        out = i()
        check("cublasGetMathMode", get_math(h, ctypes.byref(out)))
        return out.value

    def check(call: str, status: int) -> None:
        if status != 0:
            raise CublasError(f"{call} failed: status {status}")

    return {"gemm": lambda *a: check("cublasGemmStridedBatchedEx", gemm(*a)),
            "set_stream": lambda h, s: check("cublasSetStream", set_stream(h, s)),
            "set_pointer_mode": lambda h, m: check("cublasSetPointerMode", set_mode(h, m)),
            "math_mode": math_mode, "create": create_handle,
            "impl": lambda: f"ctypes {lib._name}"}


def _calls() -> dict[str, Callable[..., Any]]:
    global _impl
    if _impl is None:
        with _lock:
            if _impl is None:
                try:
                    _impl = _ctypes_impl()
                except CublasError:
                    fallback = _cupy_impl()
                    if fallback is None:
                        raise
                    _impl = fallback
    return _impl


def implementation() -> str:
    """Which binding the calls go through (for reports and tests)."""
    return _calls()["impl"]()


def handle() -> int:
    """CuPy's cuBLAS handle of the current device and thread."""
    from .gpu import cupy

    return int(cupy().cuda.device.get_cublas_handle())


def side_handle(k: int) -> int:
    """The ``k``-th (1, 2, ...) extra cuBLAS handle of the current device and thread, created once: a call that
    runs GEMMs on several streams at once gives each stream its own handle (one handle's workspace is not
    shared safely by concurrent streams); index 0 is :func:`handle`."""
    from .gpu import cupy, per_thread

    if k == 0:
        return handle()
    return per_thread("cublas_side_handles", (int(cupy().cuda.Device().id), k), lambda: int(_calls()["create"]()))


def bind(h: int, stream: int) -> None:
    """Make ``h`` run on ``stream`` and read scalars from host memory (CuPy may have left either otherwise)."""
    calls = _calls()
    calls["set_stream"](h, stream)
    calls["set_pointer_mode"](h, POINTER_MODE_HOST)


def math_mode(h: int) -> int:
    """The handle's cublasMath_t: 0 DEFAULT, 3 TF32_TENSOR_OP (what CuPy sets under ``CUPY_TF32=1``), for reports."""
    get = _calls()["math_mode"]
    if get is None:
        raise CublasError(f"{implementation()} cannot read a handle's math mode")
    return int(get(h))


def gemm_strided_batched(h: int, transa: int, transb: int, m: int, n: int, k: int, alpha: int, a: int, atype: int,
                         lda: int, stride_a: int, b: int, btype: int, ldb: int, stride_b: int, beta: int, c: int,
                         ctype: int, ldc: int, stride_c: int, batch: int, compute: int,
                         algo: int = GEMM_DEFAULT) -> None:
    """cublasGemmStridedBatchedEx (column-major); ``alpha`` / ``beta``: host addresses of the scalars (float32
    for the 32F compute types)."""
    try:
        _calls()["gemm"](h, transa, transb, m, n, k, alpha, a, atype, lda, stride_a, b, btype, ldb, stride_b, beta,
                         c, ctype, ldc, stride_c, batch, compute, algo)
    except CublasError:
        raise
    except Exception as e:  # noqa: BLE001 - CuPy's CUBLASError and friends, under one type
        raise CublasError(f"cublasGemmStridedBatchedEx failed: {e}") from e
