"""Whole-network inference (issue 19): plan a network's forward pass on this GPU, run it in one call.

    import ucudnn
    plan = ucudnn.plan_inference("squeezenet1_1", batch=1, workspace_limit="8MiB")   # measures (GPU)
    weights = ucudnn.inference.weights_from_torch(plan_network, torchvision_model)  # or random_weights
    y = ucudnn.infer(plan, x, weights)       # x: CuPy array in plan["input_layout"]

:func:`plan_inference` measures every way of running each part (:mod:`ucudnn.execute.inference_costs`) and
plans: per block fused (seed 004) or per layer with WR plans under the per-kernel limit, per layer the layout
(seed 000's choice as a DP / ILP over the graph), pooling and softmax through ucudnn's kernels
(:mod:`ucudnn.planning.inference`).  The plan is a ``ucudnn-inference-plan/1`` document; :func:`infer` runs it
through a cached :class:`InferenceSession` (prepared once, replayed as a CUDA graph by default).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .execute.inference import InferenceSession, random_weights, weights_from_torch
from .planning.inference import LAYOUTS, load_plan, replan
from .planning.inference import plan_inference as plan_from_costs
from .planning.network import Network, load_network

__all__ = ["plan_inference", "infer", "InferenceSession", "weights_from_torch", "random_weights", "load_plan",
           "replan", "plan_from_costs", "network_of"]


def network_of(plan: Mapping[str, Any]) -> Network:
    """The network spec a plan document was made for."""
    return Network.from_dict(plan["network"])


def plan_inference(network: str | Path | Network, batch: int | None = None, dtype: str = "float32", *,
                   workspace_limit: Any = "8MiB", input_layout: str = "NCHW", layouts: Sequence[str] = LAYOUTS,
                   sources: Any = None, numerics: str | None = None, batch_policy: str = "powerOfTwo",
                   fuse: bool = True, block_tuning_s: float = 60.0, epilogues: bool = True,
                   out: str | Path | None = None,
                   log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measure ``network`` (a shipped name such as ``squeezenet1_1``, a spec file, or a :class:`Network`) at
    ``batch`` on the current GPU and plan its forward pass; write the plan to ``out`` if given.
    ``block_tuning_s``: time for tuning fused tilings on the device; ``epilogues``: also measure cuDNN's fused
    conv + bias + activation per conv (:func:`measure_costs`)."""
    from .execute.inference_costs import measure_costs

    net = network if isinstance(network, Network) else load_network(network)
    if input_layout not in layouts:
        layouts = (*layouts, input_layout)
    costs = measure_costs(net, batch or net.default_batch, dtype, workspace_limit=workspace_limit, layouts=layouts,
                          sources=sources, numerics=numerics, batch_policy=batch_policy, fuse=fuse,
                          block_tuning_s=block_tuning_s, epilogues=epilogues, log=log)
    doc = plan_from_costs(net, costs, input_layout=input_layout, fuse=fuse)
    if out is not None:
        Path(out).write_text(json.dumps(doc, indent=1) + "\n")
    return doc


_sessions: dict[tuple, tuple[Any, Any, InferenceSession]] = {}


def infer(plan: Mapping[str, Any], x: Any, weights: Mapping[str, Any], *, replay: bool = True) -> Any:
    """One forward pass of ``plan`` on ``x`` (CuPy, the plan's batch, dtype and input layout) with ``weights``
    (``{conv node: (weight, bias)}``).  The session for (plan, weights) is prepared on the first call and kept;
    the returned array is the session's output buffer, overwritten by the next call with the same plan."""
    from .binding.gpu import cupy

    key = (id(plan), id(weights), cupy().cuda.Device().id, bool(replay))
    hit = _sessions.get(key)
    if hit is None or hit[0] is not plan or hit[1] is not weights:
        hit = _sessions[key] = (plan, weights, InferenceSession(plan, weights, replay=replay))
    return hit[2](x)
