"""Executing a kernel plan on CuPy arrays.

Forward and backward-data split along N: micro-batch i reads and writes the
i-th slice of the batched tensors (a prefix pointer offset; slices along N are
contiguous in NCHW and NHWC).  Backward-filter accumulates: the first
micro-batch applies the caller's ``beta``, the rest ``beta = 1`` so the filter
gradient sums over the whole mini-batch; ``alpha`` applies to each.  All
micro-batches share one workspace buffer of the plan's size.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from . import cudnn
from .errors import InputError, UcudnnError
from .gpu import cupy, cupy_dtype, descriptors, handle
from .plan import KernelPlan
from .sources import registry
from .sources.base import Operands

# operand roles per op: (a, b, out) -> which tensor each is
ROLES = {"forward": ("x", "w", "y"), "backward_data": ("w", "y", "x"), "backward_filter": ("x", "y", "w")}


@dataclass
class _Step:
    micro_batch: int
    offset: int            # first sample of this micro-batch
    config: Any            # MicroConfig
    workspace_bytes: int   # what cuDNN says this step needs now


class Executor:
    """A kernel plan made ready to run: descriptors built, workspace needs checked once."""

    def __init__(self, plan: KernelPlan):
        if plan.batch != plan.problem.n:
            raise InputError(f"micro-batches sum to {plan.batch}, not the mini-batch {plan.problem.n}", "micro_batches")
        self.plan = plan
        self.steps: list[_Step] = []
        off = 0
        for cfg in plan.configs:
            need = cfg.workspace_bytes
            if cfg.source == "legacy":
                sub = plan.problem.with_batch(cfg.micro_batch)
                d = descriptors(sub, cfg.math_type)
                a, b, out = d.operands(plan.op)
                need = max(need, cudnn.get_workspace_size(handle(), plan.op, a, b, d.conv, out, int(cfg.algo)))
            self.steps.append(_Step(cfg.micro_batch, off, cfg, need))
            off += cfg.micro_batch
        self.workspace_bytes = max((s.workspace_bytes for s in self.steps), default=0)

    def __call__(self, a: Any, b: Any, out: Any, *, alpha: float = 1.0, beta: float = 0.0,
                 workspace: Any = None) -> Any:
        """Run the plan: ``out = alpha * op(a, b) + beta * out`` with operands in cuDNN's order (see ROLES)."""
        p, op = self.plan.problem, self.plan.op
        shapes = {"x": p.x_shape(), "w": p.w_shape(), "y": p.y_shape()}
        dt = cupy_dtype(p.dtype)
        for name, arr in zip(("a", "b", "out"), (a, b, out)):
            role = ROLES[op][("a", "b", "out").index(name)]
            if tuple(arr.shape) != shapes[role]:
                raise InputError(f"{role} has shape {tuple(arr.shape)}, the plan expects {shapes[role]}", role)
            if arr.dtype != dt:
                raise InputError(f"{role} has dtype {arr.dtype}, the plan expects {p.dtype}", role)
            if not arr.flags.c_contiguous:
                raise InputError(f"{role} must be C-contiguous ({p.layout})", role)
        ws_ptr, ws_size = self._workspace(workspace)
        per_sample = {r: math.prod(shapes[r][1:]) * dt.itemsize for r in ("x", "y")}
        ptr = {id(a): a.data.ptr, id(b): b.data.ptr, id(out): out.data.ptr}
        for i, s in enumerate(self.steps):
            def at(arr: Any, role: str) -> int:
                return ptr[id(arr)] + (s.offset * per_sample[role] if role in per_sample else 0)

            ra, rb, ro = ROLES[op]
            ops = Operands(at(a, ra), at(b, rb), at(out, ro))
            step_beta = beta if (op != "backward_filter" or i == 0) else 1.0
            src = registry.get(s.config.source)
            src.run(op, p.with_batch(s.micro_batch), s.config, ops, ws_ptr, ws_size, alpha, step_beta)
        return out

    def _workspace(self, workspace: Any) -> tuple[int, int]:
        if self.workspace_bytes == 0:
            return 0, 0
        if workspace is None:
            cp = cupy()
            self._own = cp.cuda.alloc(self.workspace_bytes)
            return self._own.ptr, self.workspace_bytes
        size = workspace.nbytes if hasattr(workspace, "nbytes") else workspace.mem.size - (workspace.ptr - workspace.mem.ptr)
        if size < self.workspace_bytes:
            raise UcudnnError(f"workspace of {size} bytes is smaller than the plan needs ({self.workspace_bytes})")
        ptr = workspace.data.ptr if hasattr(workspace, "data") else workspace.ptr
        return ptr, size
