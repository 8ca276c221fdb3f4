"""Exceptions ucudnn raises.

One hierarchy so callers can catch ``UcudnnError`` and know the library
refused something deliberately (bad input, infeasible limit, cuDNN status)
rather than crashed.
"""
from __future__ import annotations


class UcudnnError(Exception):
    """Base class of every error ucudnn raises on purpose."""


class InputError(UcudnnError, ValueError):
    """Malformed user input. ``field`` names the offending field (dotted path)."""

    def __init__(self, message: str, field: str | None = None):
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)


class TableError(InputError):
    """A benchmark table that does not follow ``ucudnn-benchmark-table/1``."""


class InfeasibleError(UcudnnError):
    """No configuration fits the workspace limit.

    ``min_workspace`` is the smallest limit (bytes) under which a plan exists,
    or ``None`` if no measured configuration works at all.
    """

    def __init__(self, message: str, min_workspace: int | None, kernel: str | None = None):
        self.min_workspace = min_workspace
        self.kernel = kernel
        super().__init__(message)


class CudnnError(UcudnnError, RuntimeError):
    """A libcudnn call returned a status other than CUDNN_STATUS_SUCCESS."""

    def __init__(self, call: str, status: int, name: str, message: str = ""):
        self.call = call
        self.status = status
        self.status_name = name
        super().__init__(f"{call} failed: {name} ({status}){': ' + message if message else ''}")


def summary(e: BaseException) -> str:
    """``Type: first line of the message`` (200 characters of it at most): one line for a skipped row or a log."""
    text = str(e)
    return f"{type(e).__name__}: {text.splitlines()[0][:200] if text else ''}"


class CaptureError(UcudnnError, RuntimeError):
    """A configuration could not be captured into a CUDA graph (replay timing): it cannot run in a replayed plan."""


class CudnnNotFound(UcudnnError, OSError):
    """libcudnn.so.9 could not be located or loaded."""


class GpuUnavailable(UcudnnError, RuntimeError):
    """The operation needs a GPU (CuPy + CUDA device) and none is usable."""
