"""ucudnn inside PyTorch models: a drop-in ``Conv2d``, ``convert``/``revert`` for whole models, ``plan`` up front.

    import ucudnn.torch
    model = ucudnn.torch.convert(torchvision.models.resnet50().cuda(), workspace_limit="64MiB")
    # train as usual: every convolution runs a micro-batched plan under 64 MiB of workspace

The interface layer for PyTorch users (extra ``torch``; the core never
imports torch).  The convolutions are ``torch.library`` custom operators
(``torch.ops.ucudnn.conv2d`` and its gradients, :mod:`.ops`) with fake
implementations, so ``torch.compile`` does not graph-break on them and CUDA
graph capture works; they run on the tensors' own memory, on torch's current
stream, with their workspace from torch's caching allocator (:mod:`.runtime`).
Run eagerly, a converted layer's call is one C++ operator where the compiled launch path has been built
(:mod:`.fastpath`, ``csrc/launch.cpp``: autocast, the autograd node and the one-step legacy / graph launches with
no Python in between; everything else comes back to the Python path).
For inference, :class:`Inference` runs a model's whole forward pass (eval mode) as one ucudnn inference plan:
fused blocks, per-layer layouts, replayed as a CUDA graph (:mod:`.inference`, issue 19).
"""
from __future__ import annotations

from .inference import Inference
from .modules import Conv2d, convert, converted, revert
from .planning import plan

__all__ = ["Conv2d", "Inference", "convert", "converted", "plan", "revert"]
