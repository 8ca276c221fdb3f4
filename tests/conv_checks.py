"""What the GPU tests of ucudnn's own convolution sources (winograd, fft, mec) share: random host operands, a float64
reference in the problem's layout, the relative-error check, and a hand-made micro-batched plan run through the
Executor eagerly or captured and replayed.  One place, so the sources are held to the same checks."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ucudnn.kernels.reference import conv2d_nchw
from ucudnn.problem import ConvProblem

OPS = ("forward", "backward_data", "backward_filter")


def nchw(a: np.ndarray, layout: str) -> np.ndarray:
    """``a`` (4-D, in ``layout``) viewed as NCHW."""
    return a if layout == "NCHW" else a.transpose(0, 3, 1, 2)


def host(p: ConvProblem, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Standard-normal x, w and dy of ``p``'s shapes and dtype."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(p.dtype)
    return tuple(rng.standard_normal(s).astype(dt) for s in (p.x_shape(), p.w_shape(), p.y_shape()))  # type: ignore


def operands(op: str, x: Any, w: Any, dy: Any) -> tuple[Any, Any]:
    """The two inputs of ``op`` in the order a Launch takes them (``Operands.a``, ``.b``)."""
    return {"forward": (x, w), "backward_data": (w, dy), "backward_filter": (x, dy)}[op]


def reference(op: str, p: ConvProblem, x: np.ndarray, w: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """``op`` of a stride-1, undilated, ungrouped ``p`` in float64, in ``p``'s layout: forward the correlation,
    backward data the full correlation of dy with the rotated, transposed filter, backward filter the correlation
    of the padded input with dy."""
    lay = p.layout
    x64, w64, dy64 = (nchw(a.astype(np.float64), lay) for a in (x, w, dy))
    if op == "forward":
        out = conv2d_nchw(x64, w64, p.pad)
    elif op == "backward_data":
        out = conv2d_nchw(dy64, w64[:, :, ::-1, ::-1].transpose(1, 0, 2, 3),
                          (p.r - 1 - p.pad[0], p.s - 1 - p.pad[1]))[:, :, :p.h, :p.w]
    else:   # dw[k, c, r, s] = sum over n, p, q of x_padded[n, c, p + r, q + s] dy[n, k, p, q]
        ph, pw = p.pad
        xp = np.pad(x64, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
        win = np.lib.stride_tricks.sliding_window_view(xp, (p.p, p.q), axis=(2, 3))[:, :, :p.r, :p.s]
        out = np.einsum("ncrspq,nkpq->kcrs", win, dy64)
    return out if lay == "NCHW" else out.transpose(0, 2, 3, 1)


def close(got: Any, ref: np.ndarray, tol: float, what: str = "") -> float:
    """Assert max |got - ref| / max |ref| < ``tol``; the relative error."""
    err = np.abs(np.asarray(got, np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30)
    assert err < tol, f"{what}: relative error {err:.3g}"
    return err


def run_plan(plan: Any, problem: ConvProblem, op: str, replay: bool, tol: float,
             ref: Callable[..., np.ndarray] = reference, alpha: float = 0.5, beta: float = 0.25,
             seed: int = 7) -> Any:
    """``plan`` of ``op`` through an Executor on fresh operands, alpha / beta into live data, checked against
    ``ref`` (called as ``ref(op, problem, x, w, dy)``); replayed: captured on the first call and replayed on the
    second, one graph and no replay failure.  Returns the Executor."""
    import cupy as cp

    from ucudnn.execute.executor import Executor

    x, w, dy = host(problem, seed)
    out_shape = problem.operand_shapes(op)[2]
    old = np.random.default_rng(seed + 1).standard_normal(out_shape).astype(np.dtype(problem.dtype))
    ex = Executor(plan, replay=replay)
    a, b = (cp.asarray(t) for t in operands(op, x, w, dy))
    out, ws = cp.empty(out_shape, old.dtype), cp.cuda.alloc(ex.workspace_bytes)
    for _ in range(2 if replay else 1):
        out.set(old)
        ex(a, b, out, alpha=alpha, beta=beta, workspace=ws, workspace_bytes=ex.workspace_bytes)
        expect = alpha * ref(op, problem, x, w, dy) + (beta * old if beta != 0 else 0)
        close(out.get(), expect, tol, f"{plan.name} replay={replay}")
    assert ex.replay_failures == []
    assert len(ex._graphs) == (1 if replay else 0)
    return ex
