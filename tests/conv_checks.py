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


def launch_once(source: Any, config: Any, problem: ConvProblem, op: str, alpha: float = 1.0, beta: float = 0.0,
                seed: int = 0, ref: Callable[..., np.ndarray] | None = reference
                ) -> tuple[np.ndarray, np.ndarray | None]:
    """(result, float64 expectation) of ``source``'s prepared ``config`` launched once on fresh operands with exactly
    the reported workspace, filled with 0xFF bytes (NaN) so a step that reads what it never wrote shows; the output
    NaN-filled too unless ``beta`` accumulates into live data.  The expectation is ``alpha * ref(op, problem, x, w,
    dy) + beta * old`` (``ref`` None: no expectation, None)."""
    import cupy as cp

    from ucudnn.measure.sources.base import Operands

    x, w, dy = host(problem, seed)
    out_shape = problem.operand_shapes(op)[2]
    old = np.random.default_rng(seed + 1).standard_normal(out_shape).astype(np.dtype(problem.dtype))
    a, b = (cp.asarray(t) for t in operands(op, x, w, dy))
    out = cp.asarray(old) if beta != 0 else cp.full(out_shape, cp.nan, dtype=old.dtype)
    ws = cp.cuda.alloc(max(config.workspace_bytes, 1))
    cp.ndarray((max(config.workspace_bytes, 1),), cp.uint8, ws).fill(0xFF)
    source.prepare(op, problem, config)(Operands(a.data.ptr, b.data.ptr, out.data.ptr), ws.ptr,
                                        config.workspace_bytes, alpha, beta)
    if ref is None:
        return out.get(), None
    expect = alpha * ref(op, problem, x, w, dy) + (beta * old.astype(np.float64) if beta != 0 else 0)
    return out.get(), expect


def undivided_cudnn(problem: ConvProblem, op: str, seed: int) -> np.ndarray:
    """Undivided cuDNN's result of ``op`` (algorithm 0, no workspace; FMA math for float32) on :func:`host`'s data for
    ``seed``, as float64: the check that a source agrees with the library it replaces, beside the float64
    reference."""
    import cupy as cp
    from cudnn_reference import undivided

    x, w, dy = host(problem, seed)
    a, b = (cp.asarray(t) for t in operands(op, x, w, dy))
    out = undivided(problem, op, a, b, cp.empty(problem.operand_shapes(op)[2], cp.dtype(problem.dtype)))
    return out.get().astype(np.float64)


def check_channel_slice(source: Any, wide: ConvProblem, config: Callable[[ConvProblem, str], Any], op: str,
                        tol: float, k0: int = 8, k: int = 8) -> None:
    """Output channels ``k0 .. k0 + k`` of ``wide`` run as a channel slice (``wide.with_channels``) on the wide
    tensors' views: forward writes only that slice of y (the others untouched), backward filter reads that slice of
    dy and writes that slice's dw, backward data takes that slice of dy (the other channels' share left out).
    ``config(slice_problem, op)`` is the source's configuration."""
    import cupy as cp

    from ucudnn.measure.sources.base import Operands

    layout = wide.layout
    sl = wide.with_channels(k, wide.k)
    x, w, y = host(wide, 11)
    cx, cw, cy = cp.asarray(x), cp.asarray(w), cp.asarray(y)
    per_channel = 4 * (wide.p * wide.q if layout == "NCHW" else 1)
    w_slice = cp.ascontiguousarray(cw[k0:k0 + k])
    cfg = config(sl, op)
    ws = cp.cuda.alloc(cfg.workspace_bytes)
    launch = source.prepare(op, sl, cfg)
    if op == "forward":
        launch(Operands(cx.data.ptr, w_slice.data.ptr, cy.data.ptr + k0 * per_channel), ws.ptr, cfg.workspace_bytes,
               1.0, 0.0)
        got = nchw(cy.get(), layout)
        ref = nchw(reference("forward", wide, x, w, y), layout)
        close(got[:, k0:k0 + k], ref[:, k0:k0 + k], tol, "slice")
        keep = np.r_[0:k0, k0 + k:wide.k]
        np.testing.assert_array_equal(got[:, keep], nchw(y, layout)[:, keep])
    elif op == "backward_filter":
        dw = cp.full(w_slice.shape, cp.nan, cp.float32)
        launch(Operands(cx.data.ptr, cy.data.ptr + k0 * per_channel, dw.data.ptr), ws.ptr, cfg.workspace_bytes,
               1.0, 0.0)
        close(dw.get(), reference("backward_filter", wide, x, w, y)[k0:k0 + k], tol, "slice dw")
    else:
        dx = cp.zeros(wide.x_shape(), cp.float32)
        launch(Operands(w_slice.data.ptr, cy.data.ptr + k0 * per_channel, dx.data.ptr), ws.ptr, cfg.workspace_bytes,
               1.0, 0.0)
        yk = nchw(y, layout).copy()
        yk[:, :k0] = 0
        yk[:, k0 + k:] = 0
        yk = yk if layout == "NCHW" else yk.transpose(0, 2, 3, 1)
        close(dx.get(), reference("backward_data", wide, x, w, yk), tol, "slice dx")
