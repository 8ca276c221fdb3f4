"""Undivided cuDNN: the reference the GPU tests hold ucudnn's split, sliced, folded and own-kernel executions to."""
from __future__ import annotations

from typing import Any


def undivided(problem: Any, op: str, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0) -> Any:
    """One cuDNN call of ``op`` over the whole batch with algorithm 0 (needs no workspace), FMA math for float32
    (no TF32), into ``out`` (CuPy arrays in cuDNN's operand order); returns ``out``.  CudnnError where cuDNN does not
    run it."""
    from ucudnn.binding import cudnn
    from ucudnn.binding.gpu import descriptors, handle

    d = descriptors(problem, "FMA" if problem.dtype == "float32" else "DEFAULT")
    da, db, do = d.operands(op)
    cudnn.convolution(handle(), op, alpha, da, a.data.ptr, db, b.data.ptr, d.conv, 0, 0, 0, beta, do, out.data.ptr)
    return out
