"""ucudnn's convolution as PyTorch custom operators: ``torch.ops.ucudnn.conv2d`` and its two gradients.

Registered with ``torch.library.custom_op``, each with a fake (meta)
implementation, so ``torch.compile`` traces through them without a graph break
and FakeTensor shape propagation knows their outputs; autograd is registered on
the forward op (``register_autograd``) and computes only what
``ctx.needs_input_grad`` asks for (no dx for a network's first layer).

Every op runs ucudnn's plan when it can and PyTorch's own convolution when
ucudnn cannot (no plan fits the limit, no libcudnn, out of memory even for a
workspace-free plan: a workspace that does not fit first makes the layer's plan
smaller, :func:`ucudnn.torch.runtime.degrade`): the reason is logged once and
the result is the same convolution.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any, Sequence

import torch
from torch import Tensor

from .. import config
from . import runtime

def _out_hw(size: int, k: int, pad: int, stride: int, dil: int) -> int:
    return (size + 2 * pad - dil * (k - 1) - 1) // stride + 1


def _y_shape(x: Tensor, w: Tensor, stride: Sequence[int], padding: Sequence[int],
             dilation: Sequence[int]) -> tuple[int, int, int, int]:
    return (x.shape[0], w.shape[0], _out_hw(x.shape[2], w.shape[2], padding[0], stride[0], dilation[0]),
            _out_hw(x.shape[3], w.shape[3], padding[1], stride[1], dilation[1]))


def _empty(shape: Sequence[int], like: Tensor, layout: str) -> Tensor:
    """The one way outputs are made, by the real ops and the fake ones alike (same strides under compile)."""
    return torch.empty(tuple(shape), dtype=like.dtype, device=like.device,
                       memory_format=runtime.MEMORY_FORMATS[layout])


@functools.lru_cache(maxsize=1024)
def _settings(workspace_limit: int, batch_policy: str, sources: str, replay: bool) -> runtime.Settings:
    """One Settings object per distinct layer configuration (cached: it is part of every launch's key)."""
    return runtime.Settings(int(workspace_limit), batch_policy, sources, bool(replay))


@dataclass(frozen=True, eq=False)
class Layer:
    """One convolution as the ops run it: its problem and settings (the same objects on every call, which the
    launch path's identity cache relies on: :func:`ucudnn.torch.runtime.prepared`), and what every call of it
    would otherwise derive again (y's shape, the memory format, the operator arguments of the fallback and of
    the custom ops).  Made once per distinct configuration (:func:`_layer`); modules keep theirs."""

    problem: Any
    settings: runtime.Settings
    #: the backward filter's settings when its launch brings the layer's dx (``Settings.dx_unwritten``)
    dw_settings: runtime.Settings
    stride: list
    padding: list
    dilation: list
    groups: int
    layout: str
    y_shape: tuple
    fmt: Any

    def args(self, numerics: str) -> tuple:
        """The custom ops' arguments after the tensors (what ``torch.compile`` traces)."""
        s = self.settings
        return (self.stride, self.padding, self.dilation, self.groups, self.layout, numerics, s.workspace_limit,
                s.batch_policy, s.sources, s.replay)


#: (x shape, w shape, stride, padding, dilation, groups, dtype, layout, workspace_limit, batch_policy, sources,
#: replay) -> its Layer
_layers: dict[tuple, Layer] = {}


#: how many calls a converted module remembers by key (its ``_ucudnn_layers``: the Python path's Layer per call
#: key, the compiled path's entries): bounded, so a model fed ever new shapes starts over
LAYERS_PER_MODULE = 64


def remember(layers: dict, key: Any, value: Any) -> Any:
    """``layers[key] = value`` within :data:`LAYERS_PER_MODULE` (a new key in a full dict starts it over)."""
    if key not in layers and len(layers) >= LAYERS_PER_MODULE:
        layers.clear()
    layers[key] = value
    return value


def _layer(x: Tensor, w: Tensor, stride, padding, dilation, groups, layout, workspace_limit, batch_policy, sources,
           replay) -> Layer:
    key = (tuple(x.shape), tuple(w.shape), tuple(stride), tuple(padding), tuple(dilation), groups, x.dtype, layout,
           workspace_limit, batch_policy, sources, replay)
    hit = _layers.get(key)
    if hit is None:
        if len(_layers) >= 4096:
            _layers.clear()
        settings = _settings(workspace_limit, batch_policy, sources, replay)
        hit = _layers[key] = Layer(
            runtime.problem_of(x.shape, w.shape, stride, padding, dilation, groups, x.dtype, layout),
            settings, replace(settings, dx_unwritten=True), list(stride), list(padding), list(dilation),
            int(groups), layout, _y_shape(x, w, stride, padding, dilation), runtime.MEMORY_FORMATS[layout])
    return hit


def torch_result(op: str, layer: Layer, a: Tensor, b: Tensor, out: Tensor) -> Tensor:
    """``op(a, b)`` by torch's own convolution, operands in cuDNN's order (forward x, w; backward data w, dy;
    backward filter x, dy), ``out`` giving the result's shape: what runs when ucudnn cannot."""
    if op == "forward":
        r = torch.ops.aten.convolution(a, b, None, layer.stride, layer.padding, layer.dilation, False, [0, 0],
                                       layer.groups)
    elif op == "backward_data":     # convolution_backward reads only the input's shape for dx
        r = torch.ops.aten.convolution_backward(b, out, a, None, layer.stride, layer.padding, layer.dilation, False,
                                                [0, 0], layer.groups, [True, False, False])[0]
    else:                           # ... and only the weight's shape for dw
        r = torch.ops.aten.convolution_backward(b, a, out, None, layer.stride, layer.padding, layer.dilation, False,
                                                [0, 0], layer.groups, [False, True, False])[1]
    return r.contiguous(memory_format=layer.fmt)


def _run(op: str, layer: Layer, a: Tensor, b: Tensor, out: Tensor, numerics: str,
         unwritten: Tensor | None = None) -> bool:
    """Run ``op`` by ucudnn into ``out``; False (reason logged once) when torch must do it instead.
    ``unwritten``: a backward filter's layer's dx, allocated and not written yet (its plan may borrow it)."""
    if not runtime.runs_here(a):   # modules send other devices to torch before this; direct callers may not
        return False
    try:
        settings = layer.settings if unwritten is None else layer.dw_settings
        runtime.launch(op, layer.problem, a, b, out, settings, numerics, unwritten)
        return True
    except runtime.FALLBACK_ERRORS as e:
        runtime.note_fallback(layer.problem, op, e)
        return False


# --- the implementations: called by the custom ops (torch.compile) and by the eager autograd function ---------
def _forward(layer: Layer, x: Tensor, weight: Tensor, numerics: str) -> Tensor:
    fmt = layer.fmt
    x, w = x.contiguous(memory_format=fmt), weight.contiguous(memory_format=fmt)
    y = _empty(layer.y_shape, x, layer.layout)
    if _run("forward", layer, x, w, y, numerics):
        return y
    return torch_result("forward", layer, x, w, y)


def forward_impl(x: Tensor, weight: Tensor, stride, padding, dilation, groups, layout, numerics, workspace_limit,
                 batch_policy, sources, replay) -> Tensor:
    """y = conv2d(x, weight), no bias (the module adds it, so autograd handles it natively)."""
    return _forward(_layer(x, weight, stride, padding, dilation, groups, layout, workspace_limit, batch_policy,
                           sources, replay), x, weight, numerics)


#: gradient -> (ucudnn op, index in aten.convolution_backward's output mask and result, which is also the index
#: of the operand (x, weight) whose shape it has; ucudnn's op reads the other operand and dy)
_GRADIENTS = {"dx": ("backward_data", 0), "dw": ("backward_filter", 1)}


def _backward(which: str, layer: Layer, grad_y: Tensor, x: Tensor, weight: Tensor, numerics: str,
              out: Tensor | None = None, unwritten: Tensor | None = None) -> Tensor:
    """dx (``which="dx"``; ``x`` only gives the shape) or dw (``"dw"``, summed over the batch) of conv2d.

    One body for both gradients: operands in the layout's memory format, the output made by :func:`_empty`
    (as the fake implementations make it) unless ``out`` is given, ucudnn's plan, else
    ``aten.convolution_backward`` asked for this gradient alone.  ``unwritten`` (dw only): dx's buffer before
    dx is computed into it, which dw's plan may use as workspace.
    """
    op, index = _GRADIENTS[which]
    fmt = layer.fmt
    dy = grad_y.contiguous(memory_format=fmt)
    xc = x.contiguous(memory_format=fmt)
    w = weight.contiguous(memory_format=fmt)
    a = xc if index else w
    if out is None:
        out = _empty(w.shape if index else xc.shape, dy, layer.layout)
    if _run(op, layer, a, dy, out, numerics, unwritten):
        return out
    return torch_result(op, layer, a, dy, out)


def backward_impl(which: str, grad_y: Tensor, x: Tensor, weight: Tensor, stride, padding, dilation, groups, layout,
                  numerics, workspace_limit, batch_policy, sources, replay) -> Tensor:
    """dx or dw of conv2d (:func:`_backward`) from the custom ops' arguments."""
    return _backward(which, _layer(x, weight, stride, padding, dilation, groups, layout, workspace_limit,
                                   batch_policy, sources, replay), grad_y, x, weight, numerics)


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


def _custom_backward(ctx, grad_y: Tensor):
    """The custom op's gradients: those autograd asks for (``ctx.needs_input_grad``) through the gradient
    custom ops, None for the rest (the eager path's twin is :meth:`EagerConv2d.backward`)."""
    x, weight = ctx.saved_tensors
    dx = conv2d_backward_data(grad_y, x, weight, *ctx.args) if ctx.needs_input_grad[0] else None
    dw = conv2d_backward_filter(grad_y, x, weight, *ctx.args) if ctx.needs_input_grad[1] else None
    return (dx, dw) + (None,) * len(ctx.args)


torch.library.register_autograd("ucudnn::conv2d", _custom_backward, setup_context=_setup_context)


# --- eager: the same implementations without the custom-op dispatcher -------------------------------------------
class EagerConv2d(torch.autograd.Function):
    """conv2d for eager execution: what ``torch.ops.ucudnn.conv2d`` computes, without its dispatch.

    Why both: a custom op is what ``torch.compile`` needs (no graph break, fake tensors), but each call
    through ``torch.library``'s Python dispatch costs hundreds of microseconds of host time, and a
    ResNet-50 training step makes 159 of them: measured on an H100 in TF32 that made the step host-bound
    (``benchmarks/results/torch_profile-*.md``).  Modules use this class when not being compiled; it takes
    the call's :class:`Layer` (one object, derived once) rather than the ten arguments the custom ops take.
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, layer: Layer, numerics: str) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.layer, ctx.numerics = layer, numerics
        return _forward(layer, x, weight, numerics)

    @staticmethod
    def backward(ctx, grad_y: Tensor):
        x, weight = ctx.saved_tensors
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        layer, numerics = ctx.layer, ctx.numerics
        if need_dx and need_dw and config.unwritten():
            # dw first, into whose plan dx's buffer may lend its memory before dx is computed into it
            # (``UCUDNN_UNWRITTEN``; issue 18: VGG-16's backward filters run their unbounded plans there)
            dx = _empty(x.shape, grad_y, layer.layout)
            dw = _backward("dw", layer, grad_y, x, weight, numerics, unwritten=dx)
            return _backward("dx", layer, grad_y, x, weight, numerics, out=dx), dw, None, None
        dx = _backward("dx", layer, grad_y, x, weight, numerics) if need_dx else None
        dw = _backward("dw", layer, grad_y, x, weight, numerics) if need_dw else None
        return dx, dw, None, None


#: ``torch.autograd.Function.apply`` without its Python prologue: the C++ ``_FunctionBase.apply`` bound to
#: EagerConv2d.  The prologue binds default arguments (EagerConv2d has no ``setup_context``, so it binds none),
#: unwraps dead functorch wrappers (done here for the two tensors) and routes functorch transforms
#: (:func:`conv2d_layer` sends those through ``EagerConv2d.apply``); it costs host time on every call.
_eager_apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, EagerConv2d)
_unwrap_if_dead = torch._C._functorch.unwrap_if_dead
_functorch_active = torch._C._are_functorch_transforms_active
_is_compiling = torch.compiler.is_compiling


def conv2d_layer(x: Tensor, weight: Tensor, layer: Layer, numerics: str) -> Tensor:
    """conv2d of ``layer``: the custom op under ``torch.compile`` / export, the eager autograd function
    otherwise (same results)."""
    if _is_compiling():
        return conv2d(x, weight, *layer.args(numerics))
    if _functorch_active():
        return EagerConv2d.apply(x, weight, layer, numerics)
    return _eager_apply(_unwrap_if_dead(x), _unwrap_if_dead(weight), layer, numerics)


def conv2d_any(x: Tensor, weight: Tensor, stride, padding, dilation, groups, layout, numerics, workspace_limit,
               batch_policy, sources, replay) -> Tensor:
    """:func:`conv2d_layer` from the custom ops' arguments."""
    if _is_compiling():
        return conv2d(x, weight, stride, padding, dilation, groups, layout, numerics, workspace_limit, batch_policy,
                      sources, replay)
    return conv2d_layer(x, weight, _layer(x, weight, stride, padding, dilation, groups, layout, workspace_limit,
                                          batch_policy, sources, replay), numerics)
