"""``ucudnn.torch.Conv2d``, a drop-in ``torch.nn.Conv2d``, and ``convert`` / ``revert`` for whole models.

Conversion changes a module's class in place, the way ``torch.nn.utils``'
reparametrisations and ``SyncBatchNorm.convert_sync_batchnorm`` keep a model's
identity: the same ``Parameter`` objects (optimizer state, DDP's hooks and
gradient buckets still refer to them), the same ``state_dict`` keys and values,
the same ``repr``.  Only ``forward`` changes: it runs ``torch.ops.ucudnn.conv2d``
(micro-batched plans under the layer's workspace limit) when ucudnn can, and
``nn.Conv2d.forward`` unchanged otherwise, saying why once per layer.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .. import config
from ..errors import InputError
from ..policy import normalize_policy
from ..units import parse_size
from . import fastpath, ops, runtime

_ATTRS = ("workspace_limit", "batch_policy", "sources", "replay")


def _validate_sources(sources: Any) -> str:
    """Canonical comma-separated source names ("" : the default), checked now, not at the first call."""
    if sources is None or sources == "":
        return ""
    from .. import source_names
    from ..measure.sources import registry

    return ",".join(source_names.canonical(sources, "sources", known=registry.known()))


def _configure(m: nn.Conv2d, workspace_limit: Any, batch_policy: Any, sources: Any, replay: Any) -> None:
    limit = config.default_workspace_limit() if workspace_limit is None else workspace_limit
    m.workspace_limit = parse_size(limit, "workspace_limit")
    m.batch_policy = normalize_policy(batch_policy) if batch_policy else ""
    m.sources = _validate_sources(sources)
    if not isinstance(replay, bool):
        raise InputError(f"must be True or False, got {replay!r}", "replay")
    m.replay = replay
    m._ucudnn_layers = {}


class Conv2d(nn.Conv2d):
    """``torch.nn.Conv2d`` whose convolutions run as ucudnn plans under a per-layer workspace limit.

    Same constructor, parameters, ``state_dict`` and ``repr`` as ``nn.Conv2d``, plus
    ``workspace_limit`` (bytes or ``"64MiB"``; default ``UCUDNN_DEFAULT_WORKSPACE_LIMIT`` or 64 MiB),
    ``batch_policy`` (default ``UCUDNN_BATCH_SIZE_POLICY`` or ``powerOfTwoAndEvenSplits``), ``sources`` (algorithm
    sources, default ucudnn's) and ``replay`` (capture each call's steps in a CUDA graph and replay them).
    Layout follows the input (``channels_last``: the NHWC plans), numerics follow torch's switches
    (``allow_tf32``, deterministic algorithms), autocast float16 / bfloat16 runs the half-precision plans.
    """

    def __init__(self, *args: Any, workspace_limit: int | str | None = None, batch_policy: str | None = None,
                 sources: str | list[str] | None = None, replay: bool = False, **kwargs: Any):
        super().__init__(*args, **kwargs)
        _configure(self, workspace_limit, batch_policy, sources, replay)

    def _unsupported(self, x: Tensor) -> str | None:
        """Why ucudnn cannot run this call (torch runs it unchanged), or None."""
        if not x.is_cuda:
            return f"{x.device.type} tensors"
        if x.dim() != 4:
            return f"{x.dim()}-D input (ucudnn runs batched 4-D input)"
        if self.padding_mode != "zeros":
            return f"padding_mode {self.padding_mode!r}"
        if isinstance(self.padding, str) and self.padding == "same" and any(
                d * (k - 1) % 2 for d, k in zip(self.dilation, self.kernel_size)):
            return "asymmetric 'same' padding"
        if not torch.backends.cudnn.enabled:
            return "torch.backends.cudnn.enabled is False"
        return None

    def _padding(self) -> list[int]:
        if isinstance(self.padding, str):
            if self.padding == "valid":
                return [0, 0]
            return [d * (k - 1) // 2 for d, k in zip(self.dilation, self.kernel_size)]
        return list(self.padding)

    def _operands(self, input: Tensor) -> tuple[str | None, Tensor, Tensor, Tensor | None]:
        """(why ucudnn cannot run this call or None, x, weight, bias) with autocast's casts applied."""
        reason = self._unsupported(input)
        x, w, b = input, self.weight, self.bias
        if reason is None:
            if torch.is_autocast_enabled("cuda"):
                dt = torch.get_autocast_dtype("cuda")
                x, w = x.to(dt), w.to(dt)
                b = b.to(dt) if b is not None else None
            if x.dtype not in runtime.DTYPES:
                reason = f"dtype {x.dtype}"
            elif w.dtype != x.dtype or w.device != x.device:
                reason = "weight and input differ in dtype or device"
        return reason, x, w, b

    def problem(self, x: Tensor) -> Any:
        """The ucudnn problem of this layer on ``x`` (already cast and on the GPU)."""
        return runtime.problem_of(x.shape, self.weight.shape, self.stride, self._padding(), self.dilation,
                                  self.groups, x.dtype, runtime.layout_of(x, self.weight))

    def forward(self, input: Tensor) -> Tensor:
        if type(input) is Tensor and input.is_cuda and fastpath.ready() and runtime.recording is None and \
                not ops._is_compiling() and not ops._functorch_active():
            w, b = fastpath.params(self, Conv2d)
            y = fastpath.forward(self, input, w, b)   # the compiled launch path (csrc/launch.cpp), when it takes it
            if y is not None:
                return y
        reason, x, w, b = self._operands(input)
        if reason is not None:
            _fallback_note(self, reason)
            return super().forward(input)
        if runtime.recording is not None:
            runtime.recording.append((self, self.problem(x), x.requires_grad, w.requires_grad))
            return super().forward(input)
        layout = runtime.layout_of(x, w)
        key = (x.shape, x.dtype, layout, self.stride, self.padding, self.dilation, self.groups, self.workspace_limit,
               self.batch_policy, self.sources, self.replay)
        layer = self._ucudnn_layers.get(key)     # (x's shape, dtype, layout, the layer's attributes) -> its Layer
        if layer is None:
            layer = ops.remember(self._ucudnn_layers, key, ops._layer(
                x, w, self.stride, self._padding(), self.dilation, self.groups, layout, self.workspace_limit,
                self.batch_policy, self.sources, self.replay))
        y = ops.conv2d_layer(x, w, layer, runtime.numerics_for(x.dtype))
        # the bias into y in place (torch's convolution does the same): the op saved x and w, not y, so autograd
        # allows it, and no second output-sized tensor lives beside y
        return y if b is None else y.add_(b.view(1, -1, 1, 1))


@torch.compiler.disable
def _fallback_note(m: nn.Module, reason: str) -> None:
    runtime.log_once((id(m), reason), f"{m!r} runs through torch: {reason}")


def convert(model: nn.Module, workspace_limit: int | str | None = "64MiB", batch_policy: str | None = None,
            sources: str | list[str] | None = None, replay: bool = False) -> nn.Module:
    """Make every ``nn.Conv2d`` in ``model`` (``model`` itself too) a :class:`Conv2d`, in place; returns ``model``.

    Only exact ``nn.Conv2d`` instances convert (a subclass may have its own ``forward``); layers converted
    before take the new settings.  Nothing is copied: parameters, buffers, hooks and ``state_dict`` stay.
    """
    if not isinstance(model, nn.Module):
        raise InputError(f"expected a torch.nn.Module, got {type(model).__name__}", "model")
    probe = nn.Conv2d.__new__(Conv2d)      # validate once, before touching any layer
    _configure(probe, workspace_limit, batch_policy, sources, replay)
    for m in model.modules():
        if type(m) is nn.Conv2d or type(m) is Conv2d:
            m.__class__ = Conv2d
            for a in _ATTRS:
                setattr(m, a, getattr(probe, a))
            m._ucudnn_layers = {}
    return model


def revert(model: nn.Module) -> nn.Module:
    """Undo :func:`convert`: every :class:`Conv2d` in ``model`` becomes a plain ``nn.Conv2d`` again, in place."""
    if not isinstance(model, nn.Module):
        raise InputError(f"expected a torch.nn.Module, got {type(model).__name__}", "model")
    for m in model.modules():
        if type(m) is Conv2d:
            m.__class__ = nn.Conv2d
            for a in (*_ATTRS, "_ucudnn_layers"):
                m.__dict__.pop(a, None)
    return model


def converted(model: nn.Module) -> list[tuple[str, Conv2d]]:
    """The converted layers of ``model`` with their module paths."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, Conv2d)]
