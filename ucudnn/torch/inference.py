"""An inference plan run on a PyTorch model in eval mode (issue 19): ``ucudnn.torch.Inference``.

    model = torchvision.models.squeezenet1_1().cuda().eval()
    fast = ucudnn.torch.Inference(model, "squeezenet1_1", batch=1)      # measures and plans (GPU)
    probs = fast(x)                                                     # x: a CUDA tensor, NCHW

The plan (``ucudnn-inference-plan/1``, :func:`ucudnn.plan_inference`) runs with the model's own parameters,
read by module path (the spec's node names), BatchNorm folded where the spec says ``bn``; a plan made
before (a document or a file) can be given instead of measuring again.  The call runs on torch's current
stream; the input is read through DLPack (no copy beyond the session's input buffer) and the result is
returned as a tensor viewing a fresh copy of the session's output, so it stays valid after the next call.
Weights are read once: after changing the model's parameters, build a new ``Inference``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch

from ..errors import InputError
from . import runtime


class Inference(torch.nn.Module):
    """``model``'s forward pass (eval mode) as one ucudnn inference plan (module doc)."""

    def __init__(self, model: torch.nn.Module, network: Any, batch: int = 1, dtype: str = "float32", *,
                 plan: Mapping[str, Any] | str | Path | None = None, workspace_limit: Any = "8MiB",
                 sources: Any = None, replay: bool = True, **plan_kw: Any):
        super().__init__()
        from ..inference import InferenceSession, network_of, plan_inference, weights_from_torch
        from ..planning.inference import load_plan
        from ..planning.network import Network, load_network

        if model.training:
            raise InputError("an inference plan computes eval-mode outputs: call model.eval() first", "model")
        if plan is None:
            net = network if isinstance(network, Network) else load_network(network)
            device = next(model.parameters()).device
            if device.type != "cuda":
                raise InputError(f"the model is on {device}; inference plans run on CUDA devices", "model")
            with torch.cuda.device(device):
                plan = plan_inference(net, batch, dtype, workspace_limit=workspace_limit, sources=sources,
                                      **plan_kw)
        elif not isinstance(plan, Mapping):
            plan = load_plan(plan)
        self.plan = dict(plan)
        self.network = network_of(self.plan)
        self.session = InferenceSession(self.plan, weights_from_torch(self.network, model), replay=replay)
        self._dtype = getattr(torch, self.plan["dtype"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import cupy as cp

        want = tuple(self.session.input.shape)
        if x.device.type != "cuda" or x.dtype != self._dtype:
            raise InputError(f"expected a CUDA {self._dtype} tensor, got {x.device} {x.dtype}", "x")
        if self.plan["input_layout"] == "NHWC":
            x = x.permute(0, 2, 3, 1)
        if tuple(x.shape) != want:
            raise InputError(f"expected {want} in {self.plan['input_layout']} order, got {tuple(x.shape)}", "x")
        device = x.device.index if x.device.index is not None else torch.cuda.current_device()
        with runtime.cupy_stream(device):   # CuPy's view of torch's current stream, as for every launch
            cp.copyto(self.session.input, cp.from_dlpack(x.contiguous()))
            y = self.session(self.session.input).copy()
        out = torch.from_dlpack(y)
        if self.plan["output_layout"] == "NHWC":
            out = out.permute(0, 3, 1, 2)
        return out.reshape(out.shape[0], -1) if out.shape[2:] == (1, 1) else out
