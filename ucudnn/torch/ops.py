"""ucudnn's convolution as PyTorch custom operators: ``torch.ops.ucudnn.conv2d`` and its two gradients.

Registered with ``torch.library.custom_op``, each with a fake (meta)
implementation, so ``torch.compile`` traces through them without a graph break
and FakeTensor shape propagation knows their outputs; autograd is registered on
the forward op (``register_autograd``) and computes only what
``ctx.needs_input_grad`` asks for (no dx for a network's first layer).

Every op runs ucudnn's plan when it can and PyTorch's own convolution when
ucudnn cannot (no plan fits the limit, no libcudnn, out of memory for the
workspace): the reason is logged once and the result is the same convolution.
"""
from __future__ import annotations

import functools
from typing import Sequence

import torch
from torch import Tensor

from . import runtime

_ARGS = "stride, padding, dilation, groups, layout, numerics, workspace_limit, batch_policy, sources, replay"


def _out_hw(size: int, k: int, pad: int, stride: int, dil: int) -> int:
    return (size + 2 * pad - dil * (k - 1) - 1) // stride + 1


def _y_shape(x: Tensor, w: Tensor, stride: Sequence[int], padding: Sequence[int],
             dilation: Sequence[int]) -> tuple[int, int, int, int]:
    return (x.shape[0], w.shape[0], _out_hw(x.shape[2], w.shape[2], padding[0], stride[0], dilation[0]),
            _out_hw(x.shape[3], w.shape[3], padding[1], stride[1], dilation[1]))


def _empty(shape: Sequence[int], like: Tensor, layout: str) -> Tensor:
    """The one way outputs are made, by the real ops and the fake ones alike (same strides under compile)."""
    return torch.empty(tuple(shape), dtype=like.dtype, device=like.device, memory_format=runtime.memory_format(layout))


@functools.lru_cache(maxsize=1024)
def _settings(workspace_limit: int, batch_policy: str, sources: str, replay: bool) -> runtime.Settings:
    """One Settings object per distinct layer configuration (cached: it is part of every launch's key)."""
    return runtime.Settings(int(workspace_limit), batch_policy, sources, bool(replay))


#: (x shape, w shape, stride, padding, dilation, groups, dtype, layout, workspace_limit, batch_policy, sources,
#: replay) -> (problem, settings): a call's problem and settings in one lookup, the same two objects every time
#: (which the launch path's identity cache relies on: :func:`ucudnn.torch.runtime.prepared`)
_layers: dict[tuple, tuple] = {}


def _layer(x: Tensor, w: Tensor, stride, padding, dilation, groups, layout, workspace_limit, batch_policy, sources,
           replay) -> tuple:
    key = (x.shape, w.shape, tuple(stride), tuple(padding), tuple(dilation), groups, x.dtype, layout,
           workspace_limit, batch_policy, sources, replay)
    hit = _layers.get(key)
    if hit is None:
        if len(_layers) >= 4096:
            _layers.clear()
        hit = _layers[key] = (runtime.problem_of(x.shape, w.shape, stride, padding, dilation, groups, x.dtype, layout),
                              _settings(workspace_limit, batch_policy, sources, replay))
    return hit


def _run(op: str, x: Tensor, w: Tensor, a: Tensor, b: Tensor, out: Tensor, stride, padding, dilation, groups,
         layout, numerics, workspace_limit, batch_policy, sources, replay) -> bool:
    """Run ``op`` by ucudnn into ``out``; False (reason logged once) when torch must do it instead."""
    if not runtime.runs_here(a):   # modules send other devices to torch before this; direct callers may not
        return False
    problem, settings = _layer(x, w, stride, padding, dilation, groups, layout, workspace_limit, batch_policy,
                               sources, replay)
    try:
        runtime.launch(op, problem, a, b, out, settings, numerics)
        return True
    except runtime.FALLBACK_ERRORS as e:
        runtime.note_fallback(problem, op, e)
        return False


# --- the implementations: called by the custom ops (torch.compile) and by the eager autograd function ---------
def forward_impl(x: Tensor, weight: Tensor, stride, padding, dilation, groups, layout, numerics, workspace_limit,
                 batch_policy, sources, replay) -> Tensor:
    """y = conv2d(x, weight), no bias (the module adds it, so autograd handles it natively)."""
    fmt = runtime.memory_format(layout)
    x, w = x.contiguous(memory_format=fmt), weight.contiguous(memory_format=fmt)
    y = _empty(_y_shape(x, w, stride, padding, dilation), x, layout)
    if _run("forward", x, w, x, w, y, stride, padding, dilation, groups, layout, numerics, workspace_limit,
            batch_policy, sources, replay):
        return y
    return torch.ops.aten.convolution(x, w, None, stride, padding, dilation, False, [0, 0], groups).contiguous(
        memory_format=fmt)


#: gradient -> (ucudnn op, index in aten.convolution_backward's output mask and result, which is also the index
#: of the operand (x, weight) whose shape it has; ucudnn's op reads the other operand and dy)
_GRADIENTS = {"dx": ("backward_data", 0), "dw": ("backward_filter", 1)}


def backward_impl(which: str, grad_y: Tensor, x: Tensor, weight: Tensor, stride, padding, dilation, groups, layout,
                  numerics, workspace_limit, batch_policy, sources, replay) -> Tensor:
    """dx (``which="dx"``; ``x`` only gives the shape) or dw (``"dw"``, summed over the batch) of conv2d.

    One body for both gradients: operands in the layout's memory format, the output made by :func:`_empty`
    (as the fake implementations make it), ucudnn's plan, else ``aten.convolution_backward`` asked for this
    gradient alone.
    """
    op, index = _GRADIENTS[which]
    fmt = runtime.memory_format(layout)
    dy = grad_y.contiguous(memory_format=fmt)
    xc = x.contiguous(memory_format=fmt)
    w = weight.contiguous(memory_format=fmt)
    if index:
        out = _empty(w.shape, dy, layout)
        ran = _run(op, xc, w, xc, dy, out, stride, padding, dilation, groups, layout, numerics, workspace_limit,
                   batch_policy, sources, replay)
    else:
        out = _empty(xc.shape, dy, layout)
        ran = _run(op, xc, w, w, dy, out, stride, padding, dilation, groups, layout, numerics, workspace_limit,
                   batch_policy, sources, replay)
    if ran:
        return out
    mask = [i == index for i in range(3)]
    return torch.ops.aten.convolution_backward(dy, xc, w, None, stride, padding, dilation, False, [0, 0], groups,
                                               mask)[index].contiguous(memory_format=fmt)


# --- custom ops: what torch.compile traces (fake implementations give shapes and strides) ----------------------
@torch.library.custom_op("ucudnn::conv2d", mutates_args=(), device_types="cuda")
def conv2d(x: Tensor, weight: Tensor, stride: list[int], padding: list[int], dilation: list[int], groups: int,
           layout: str, numerics: str, workspace_limit: int, batch_policy: str, sources: str, replay: bool) -> Tensor:
    """y = conv2d(x, weight) (no bias: the module adds it, so autograd handles it natively)."""
    return forward_impl(x, weight, stride, padding, dilation, groups, layout, numerics, workspace_limit,
                        batch_policy, sources, replay)


@conv2d.register_fake
def _conv2d_fake(x, weight, stride, padding, dilation, groups, layout, numerics, workspace_limit, batch_policy,
                 sources, replay):
    return _empty(_y_shape(x, weight, stride, padding, dilation), x, layout)


@torch.library.custom_op("ucudnn::conv2d_backward_data", mutates_args=(), device_types="cuda")
def conv2d_backward_data(grad_y: Tensor, x: Tensor, weight: Tensor, stride: list[int], padding: list[int],
                         dilation: list[int], groups: int, layout: str, numerics: str, workspace_limit: int,
                         batch_policy: str, sources: str, replay: bool) -> Tensor:
    """dx of conv2d (``x`` gives the shape and the fallback's operand; its values are not read by ucudnn)."""
    return backward_impl("dx", grad_y, x, weight, stride, padding, dilation, groups, layout, numerics,
                         workspace_limit, batch_policy, sources, replay)


@conv2d_backward_data.register_fake
def _conv2d_backward_data_fake(grad_y, x, weight, stride, padding, dilation, groups, layout, numerics,
                               workspace_limit, batch_policy, sources, replay):
    return _empty(x.shape, grad_y, layout)


@torch.library.custom_op("ucudnn::conv2d_backward_filter", mutates_args=(), device_types="cuda")
def conv2d_backward_filter(grad_y: Tensor, x: Tensor, weight: Tensor, stride: list[int], padding: list[int],
                           dilation: list[int], groups: int, layout: str, numerics: str, workspace_limit: int,
                           batch_policy: str, sources: str, replay: bool) -> Tensor:
    """dw of conv2d, summed over the batch (micro-batches accumulate in ucudnn's plan)."""
    return backward_impl("dw", grad_y, x, weight, stride, padding, dilation, groups, layout, numerics,
                         workspace_limit, batch_policy, sources, replay)


@conv2d_backward_filter.register_fake
def _conv2d_backward_filter_fake(grad_y, x, weight, stride, padding, dilation, groups, layout, numerics,
                                 workspace_limit, batch_policy, sources, replay):
    return _empty(weight.shape, grad_y, layout)


def _setup_context(ctx, inputs, output) -> None:
    x, weight, *args = inputs
    ctx.save_for_backward(x, weight)
    ctx.args = args


def _gradients(ctx, grad_y: Tensor, dx_fn, dw_fn) -> tuple:
    """The gradients autograd asks for (``ctx.needs_input_grad``), None for the rest: both backward paths."""
    x, weight = ctx.saved_tensors
    dx = dx_fn(grad_y, x, weight, *ctx.args) if ctx.needs_input_grad[0] else None
    dw = dw_fn(grad_y, x, weight, *ctx.args) if ctx.needs_input_grad[1] else None
    return (dx, dw) + (None,) * len(ctx.args)


def _backward(ctx, grad_y: Tensor):
    return _gradients(ctx, grad_y, conv2d_backward_data, conv2d_backward_filter)


torch.library.register_autograd("ucudnn::conv2d", _backward, setup_context=_setup_context)


# --- eager: the same implementations without the custom-op dispatcher -------------------------------------------
def _backward_data_eager(*a):
    return backward_impl("dx", *a)


def _backward_filter_eager(*a):
    return backward_impl("dw", *a)


class EagerConv2d(torch.autograd.Function):
    """conv2d for eager execution: what ``torch.ops.ucudnn.conv2d`` computes, without its dispatch.

    Why both: a custom op is what ``torch.compile`` needs (no graph break, fake tensors), but each call
    through ``torch.library``'s Python dispatch costs hundreds of microseconds of host time, and a
    ResNet-50 training step makes 159 of them: measured on an H100 in TF32 that made the step host-bound
    (``benchmarks/results/torch_profile-*.md``).  Modules use this class when not being compiled.
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, *args) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.args = args
        return forward_impl(x, weight, *args)

    @staticmethod
    def backward(ctx, grad_y: Tensor):
        return _gradients(ctx, grad_y, _backward_data_eager, _backward_filter_eager)


#: ``torch.autograd.Function.apply`` without its Python prologue: the C++ ``_FunctionBase.apply`` bound to
#: EagerConv2d.  The prologue binds default arguments (EagerConv2d has no ``setup_context``, so it binds none),
#: unwraps dead functorch wrappers (done here for the two tensors) and routes functorch transforms
#: (:func:`conv2d_any` sends those through ``EagerConv2d.apply``); it costs host time on every call.
_eager_apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, EagerConv2d)
_unwrap_if_dead = torch._C._functorch.unwrap_if_dead
_functorch_active = torch._C._are_functorch_transforms_active


def conv2d_any(x: Tensor, weight: Tensor, *args) -> Tensor:
    """The custom op under ``torch.compile`` / export, the eager autograd function otherwise (same results)."""
    if torch.compiler.is_compiling():
        return conv2d(x, weight, *args)
    if _functorch_active():
        return EagerConv2d.apply(x, weight, *args)
    return _eager_apply(_unwrap_if_dead(x), _unwrap_if_dead(weight), *args)
