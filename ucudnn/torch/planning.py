"""Plans for a whole converted model, made up front: ``ucudnn.torch.plan(model, example_input, ...)``.

Without it, the first forward of each distinct convolution finds its plan
through the lookup chain (in-process, user cache, plan server, bundles) and
benchmarks only what none of them has.  ``plan`` does that for every
convolution of the model at once, before training starts, and offers WD: one
workspace budget for the whole model, divided by the ILP, in one arena taken
from torch's allocator.
"""
from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from ..errors import InputError
from ..planning.plan import KernelPlan, Plan
from ..problem import ConvProblem, KernelSpec
from ..units import parse_size
from . import runtime
from .modules import Conv2d, converted

log = logging.getLogger("ucudnn.torch")
POLICIES = ("wr", "wd")


def trace(model: nn.Module, example_input: Any) -> list[tuple[str, Conv2d, ConvProblem, str, list[str]]]:
    """Each distinct (layer settings, problem, numerics) a forward of ``example_input`` meets, with the ops a
    training step runs for it: forward always, backward_filter when the weight trains, backward_data when the
    layer's input needs a gradient (not for the first layer)."""
    names = {m: n for n, m in converted(model)}
    if not names:
        raise InputError("has no ucudnn.torch.Conv2d layers; call ucudnn.torch.convert(model) first", "model")
    runtime.recording = []
    try:
        with torch.enable_grad():
            model(*example_input) if isinstance(example_input, tuple) else model(example_input)
        calls = runtime.recording
    finally:
        runtime.recording = None
    seen: dict[tuple, tuple[str, Conv2d, ConvProblem, str, list[str]]] = {}
    for m, problem, x_grad, w_grad in calls:
        numerics = runtime.numerics_for(_TORCH_DTYPES[problem.dtype])
        key = (problem, numerics, m.workspace_limit, m.batch_policy, m.sources, m.replay)
        ops = ["forward"] + (["backward_data"] if x_grad else []) + (["backward_filter"] if w_grad else [])
        if key in seen:
            seen[key][4][:] = sorted(set(seen[key][4]) | set(ops), key=ops_order)
        else:
            seen[key] = (names[m], m, problem, numerics, ops)
    return list(seen.values())


_TORCH_DTYPES = {v: k for k, v in runtime.DTYPES.items()}


def ops_order(op: str) -> int:
    return ("forward", "backward_data", "backward_filter").index(op)


def plan(model: nn.Module, example_input: Any, policy: str = "wr", *, workspace_limit: int | str | None = None,
         total_workspace: int | str | None = None, batch_policy: str | None = None,
         sources: str | list[str] | None = None, bundle: str | None = None) -> Plan:
    """Benchmark and plan every convolution of a converted ``model`` now; returns the model's plan.

    ``wr``: each kernel under its layer's limit (``workspace_limit`` overrides every layer's), through the
    lookup chain, so later forwards start at once.  ``wd``: the whole model shares ``total_workspace``
    (bytes or ``"1GiB"``); the ILP divides it and the plans are installed with one arena from torch's
    allocator.  ``bundle``: also write the measurements and plans to this bundle file, for other machines
    (``UCUDNN_BUNDLE_PATH``) with the same GPU model and cuDNN.
    """
    if policy not in POLICIES:
        raise InputError(f"unknown policy {policy!r}; use one of {', '.join(POLICIES)}", "policy")
    if policy == "wd" and total_workspace is None:
        raise InputError("the wd policy needs a total workspace budget", "total_workspace")
    if workspace_limit is not None or batch_policy is not None or sources is not None:
        from .modules import convert

        for _, m in converted(model):   # same validation and meaning as convert's
            convert(m, m.workspace_limit if workspace_limit is None else workspace_limit,
                    batch_policy or m.batch_policy or None, m.sources if sources is None else sources, m.replay)
    kernels = trace(model, example_input)
    device = next((p.device for p in model.parameters() if p.is_cuda), None)
    if device is None:
        raise InputError("must be on a CUDA device (model.cuda())", "model")
    index = device.index if device.index is not None else torch.cuda.current_device()
    runtime.share_torch_memory()
    from ..binding.gpu import cupy

    with cupy().cuda.Device(index), runtime._cupy_stream(index):
        if policy == "wr":
            result = _plan_wr(kernels, index)
        else:
            result = _plan_wd(kernels, index, parse_size(total_workspace, "total_workspace"))
    if bundle:
        _write_bundle(bundle, kernels, result)
    return result


def _progress(total: int, what: str) -> Any:
    from rich.progress import Progress

    p = Progress(transient=True)
    p.start()
    return p, p.add_task(what, total=total)


def _plan_wr(kernels: list, device: int) -> Plan:
    from .. import api

    out: list[KernelPlan] = []
    progress, task = _progress(sum(len(k[4]) for k in kernels), "ucudnn: planning the model's convolutions")
    try:
        for name, m, problem, numerics, ops in kernels:
            settings = runtime.Settings(m.workspace_limit, m.batch_policy, m.sources, m.replay)
            for op in ops:
                kp = runtime.executor(problem, op, settings, numerics, device).plan
                out.append(KernelPlan(f"{name}.{op}", op, problem, kp.configs))
                progress.advance(task)
    finally:
        progress.stop()
    limits = {m.workspace_limit for _, m, *_ in kernels}
    numerics = {k[3] for k in kernels}
    return Plan("wr", kernels[0][1].batch_policy or api.config.batch_policy(), out, api.device_name(),
                api.cudnn.get_version(), workspace_limit=max(limits),
                numerics=numerics.pop() if len(numerics) == 1 else None)


def _plan_wd(kernels: list, device: int, total: int) -> Plan:
    from .. import api, config
    from ..execute import NetworkExecutor
    from ..measure import benchmark
    from ..planning.planner import plan as make_plan
    from ..planning.table import BenchmarkTable
    from ..policy import normalize_policy

    numerics = {k[3] for k in kernels}
    policies = {k[1].batch_policy for k in kernels}
    sources = {k[1].sources for k in kernels}
    if len(numerics) > 1 or len(policies) > 1 or len(sources) > 1:
        raise InputError("a WD plan needs one numerics mode, batch policy and source set for the whole model "
                         f"(found {sorted(numerics)}, {sorted(policies)}, {sorted(sources)})", "model")
    nm, bp = numerics.pop(), normalize_policy(policies.pop() or config.batch_policy())
    src = sources.pop() or None
    store = api._get_store()
    specs = [KernelSpec(f"{name}.{op}", op, problem) for name, _, problem, _, ops in kernels for op in ops]
    benches, missing = {}, []
    for s in specs:
        kb = store.get_kernel_bench(api._cache_key(s.problem, s.op, nm, bp)) if store is not None else None
        if kb is None:
            missing.append(s)
        else:
            benches[s.name] = kb
    if missing:
        log.info("ucudnn: benchmarking %d of the model's %d kernels", len(missing), len(specs))
        table = benchmark(missing, bp, nm, sources=src, progress=True)
        for s, kb in zip(missing, table.kernels):
            benches[s.name] = kb
            if store is not None:
                store.put_kernel_bench(api._cache_key(s.problem, s.op, nm, bp), kb)
    table = BenchmarkTable(api.device_name(), api.cudnn.get_version(),
                           [_named(benches[s.name], s.name) for s in specs], numerics=nm)
    wd = make_plan(table, "wd", total_workspace=total, batch_policy=bp)
    replay = any(k[1].replay for k in kernels)
    ne = NetworkExecutor(wd, replay=replay)          # its arena comes from torch's allocator (shared pool)
    for kp in wd.kernels:
        off, size = ne.segments[kp.name]
        runtime.installed[(device, kp.problem, kp.op)] = runtime.Installed(ne.executors[kp.name],
                                                                           ne.arena.ptr + off, size, ne)
    return wd


def _named(kb: Any, name: str) -> Any:
    from dataclasses import replace

    return replace(kb, name=name)


def _write_bundle(path: str, kernels: list, result: Plan) -> None:
    """The kernels' measurements and plans in a store file that the lookup chain reads as a bundle."""
    from .. import api
    from ..catalog.store import Store

    user = api._get_store()
    dst = Store(path)
    for kp in result.kernels:
        name, m, problem, numerics, _ = next(k for k in kernels if k[2] == kp.problem)
        bp = result.batch_policy
        kb = user.get_kernel_bench(api._cache_key(problem, kp.op, numerics, bp)) if user is not None else None
        if kb is not None:
            dst.put_kernel_bench(api._cache_key(problem, kp.op, numerics, bp), kb)
        if result.policy == "wr":
            key = api._cache_key(problem, kp.op, numerics, bp, m.workspace_limit)
            dst.put_plan(key, Plan("wr", bp, [kp], result.device, result.cudnn_version,
                                   workspace_limit=m.workspace_limit, numerics=numerics))
    if result.policy == "wd":
        dst.put_plan({"model_plan": "wd", "device": result.device, "cudnn_version": result.cudnn_version,
                      "kernels": [k.name for k in result.kernels]}, result)
