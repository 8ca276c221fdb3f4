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
from contextlib import contextmanager
from typing import Any, Iterator, NamedTuple

import torch
from torch import nn

from ..errors import InputError
from ..planning.plan import KernelPlan, Plan
from ..policy import key_policy_of, normalize_policy
from ..problem import ConvProblem, KernelSpec
from ..units import parse_size
from . import runtime
from .modules import Conv2d, converted

log = logging.getLogger("ucudnn.torch")
POLICIES = ("wr", "wd")


class Traced(NamedTuple):
    """One distinct convolution of a traced model: the first layer that ran it, and the ops a step needs."""

    name: str              # unique among a trace's entries: the layer's path (``#2``... for its other problems)
    module: Conv2d
    problem: ConvProblem
    numerics: str
    ops: list[str]


def trace(model: nn.Module, example_input: Any) -> list[Traced]:
    """Each distinct (layer settings, problem, numerics) a forward of ``example_input`` meets, with the ops a
    training step runs for it: forward always, backward_filter when the weight trains, backward_data when the
    layer's input needs a gradient (not for the first layer).

    Entries are named by the layer's module path; a layer met with several problems (one module applied to
    inputs of several shapes) names its later ones ``path#2``, ``path#3``..., so each kernel of a plan
    (``name.op``) belongs to exactly one entry.
    """
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
    seen: dict[tuple, Traced] = {}
    used: dict[str, int] = {}
    for m, problem, x_grad, w_grad in calls:
        numerics = runtime.numerics_for(_TORCH_DTYPES[problem.dtype])
        key = (problem, numerics, m.workspace_limit, m.batch_policy, m.sources, m.replay)
        ops = ["forward"] + (["backward_data"] if x_grad else []) + (["backward_filter"] if w_grad else [])
        if key in seen:
            seen[key].ops[:] = sorted(set(seen[key].ops) | set(ops), key=ops_order)
        else:
            used[names[m]] = n = used.get(names[m], 0) + 1
            seen[key] = Traced(names[m] if n == 1 else f"{names[m]}#{n}", m, problem, numerics, ops)
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
    (``UCUDNN_BUNDLE_PATH``) with the same GPU model and cuDNN: converted layers with the same settings find
    their WR plans and measurements there; a WD plan is kept whole, under the plan service's key
    (:func:`_write_bundle` says why the per-kernel lookup never answers with it).
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
    index = _device_of(model)
    with _on_device(index):
        if policy == "wr":
            result, table = _plan_wr(kernels, index), None
        else:
            result, table = _plan_wd(kernels, index, parse_size(total_workspace, "total_workspace"))
    if bundle:
        _write_bundle(bundle, kernels, result, table)
    return result


def _device_of(model: nn.Module) -> int:
    """The CUDA device index of ``model``'s parameters (InputError naming ``model`` when it has none there)."""
    device = next((p.device for p in model.parameters() if p.is_cuda), None)
    if device is None:
        raise InputError("must be on a CUDA device (model.cuda())", "model")
    return device.index if device.index is not None else torch.cuda.current_device()


@contextmanager
def _on_device(index: int) -> Iterator[None]:
    """CuPy on device ``index`` and torch's current stream there, its allocations from torch's allocator."""
    runtime.share_torch_memory()
    from ..binding.gpu import cupy

    with cupy().cuda.Device(index), runtime.cupy_stream(index):
        yield


def _progress(total: int, what: str) -> Any:
    from rich.progress import Progress

    p = Progress(transient=True)
    p.start()
    return p, p.add_task(what, total=total)


def _settings(m: Conv2d) -> runtime.Settings:
    return runtime.Settings(m.workspace_limit, m.batch_policy, m.sources, m.replay)


def _batch_policy(m: Conv2d) -> str:
    """The layer's batch policy as the API plans it (the layer's, else ``UCUDNN_BATCH_SIZE_POLICY``)."""
    from .. import config

    return normalize_policy(m.batch_policy or config.batch_policy())


def _cache_key(problem: ConvProblem, op: str, numerics: str, batch_policy: str, sources: str,
               limit: int | None = None) -> dict:
    """The key the lookup chain (``ucudnn.api``) finds a kernel's plan (``limit``) or measurements (no limit)
    under, for a layer with these settings (``sources`` "" : the library's default sources), so what this
    module stores is what a converted layer looks up later."""
    from .. import api

    return api._cache_key(problem, op, numerics, batch_policy, limit, api._source_names(sources or None))


def _plan_wr(kernels: list[Traced], device: int) -> Plan:
    """Each kernel's plan through the lookup chain (``runtime.executor``: the layer's limit, batch policy and
    sources), as a converted layer's first call would find it."""
    from .. import api

    out: list[KernelPlan] = []
    progress, task = _progress(sum(len(k.ops) for k in kernels), "ucudnn: planning the model's convolutions")
    try:
        for k in kernels:
            for op in k.ops:
                kp = runtime.executor(k.problem, op, _settings(k.module), k.numerics, device).plan
                out.append(KernelPlan(f"{k.name}.{op}", op, k.problem, kp.configs))
                progress.advance(task)
    finally:
        progress.stop()
    limits = {k.module.workspace_limit for k in kernels}
    numerics = {k.numerics for k in kernels}
    return Plan("wr", _batch_policy(kernels[0].module), out, api.device_name(), api.cudnn.get_version(),
                workspace_limit=max(limits), numerics=numerics.pop() if len(numerics) == 1 else None)


def _plan_wd(kernels: list[Traced], device: int, total: int) -> tuple[Plan, Any]:
    """The whole model under ``total`` bytes (ILP), installed with one arena; returns (plan, its table).

    Measurements come from the user cache under the lookup chain's keys, else are benchmarked with the
    layers' sources and stored there.
    """
    from .. import api
    from ..execute import NetworkExecutor
    from ..measure import benchmark
    from ..planning.planner import plan as make_plan
    from ..planning.table import BenchmarkTable

    numerics = {k.numerics for k in kernels}
    policies = {k.module.batch_policy for k in kernels}
    sources = {k.module.sources for k in kernels}
    if len(numerics) > 1 or len(policies) > 1 or len(sources) > 1:
        raise InputError("a WD plan needs one numerics mode, batch policy and source set for the whole model "
                         f"(found {sorted(numerics)}, {sorted(policies)}, {sorted(sources)})", "model")
    nm, bp, src = numerics.pop(), _batch_policy(kernels[0].module), sources.pop()
    store = api._get_store()
    specs = [KernelSpec(f"{k.name}.{op}", op, k.problem) for k in kernels for op in k.ops]
    benches, missing = {}, []
    for s in specs:
        kb = store.get_kernel_bench(_cache_key(s.problem, s.op, nm, bp, src)) if store is not None else None
        if kb is None:
            missing.append(s)
        else:
            benches[s.name] = kb
    if missing:
        log.info("ucudnn: benchmarking %d of the model's %d kernels", len(missing), len(specs))
        table = benchmark(missing, bp, nm, sources=src or None, progress=True)
        for s, kb in zip(missing, table.kernels):
            benches[s.name] = kb
            if store is not None:
                store.put_kernel_bench(_cache_key(s.problem, s.op, nm, bp, src), kb)
    table = BenchmarkTable(api.device_name(), api.cudnn.get_version(),
                           [_named(benches[s.name], s.name) for s in specs], numerics=nm)
    # named as the plan service names it (a bundle written from it answers that service's default request)
    wd = make_plan(table, "wd", total_workspace=total, batch_policy=key_policy_of(bp, (s.problem.n for s in specs)))
    replay = any(k.module.replay for k in kernels)
    ne = NetworkExecutor(wd, replay=replay)          # its arena comes from torch's allocator (shared pool)
    for kp in wd.kernels:
        off, size = ne.segments[kp.name]
        runtime.installed[(device, kp.problem, kp.op)] = runtime.Installed(ne.executors[kp.name],
                                                                           ne.arena.ptr + off, size, ne)
    api.plans_changed()
    return wd, table


def _named(kb: Any, name: str) -> Any:
    from dataclasses import replace

    return replace(kb, name=name)


def _write_bundle(path: str, kernels: list[Traced], result: Plan, table: Any = None) -> None:
    """The kernels' measurements and plans in a store file that the lookup chain reads as a bundle.

    Every kernel's measurements go under the lookup chain's measurement key (``ucudnn.api._cache_key``
    without a limit: the layer's numerics, batch policy and sources), so a converted layer with the same
    settings on a machine with this bundle (``UCUDNN_BUNDLE_PATH``) plans from them without benchmarking,
    under any limit.  A WR plan's kernels also go under the lookup's plan key (with the layer's limit): found
    as they are.

    A WD plan is one plan for the whole model, and the lookup chain finds plans of single kernels, so it
    never finds a WD plan (by design: a kernel's segment of one model's budget is no answer for a kernel
    elsewhere).  It is stored with its table under the plan service's key (table id, ``wd``, batch policy,
    total workspace), as ``ucudnn precompute`` stores its WD plans: ``ucudnn bundle list`` shows it, and a
    plan service that imported the bundle answers a WD request for that table and budget from it.
    """
    from .. import api
    from ..catalog.bundle import finalize
    from ..catalog.store import Store

    entries = {f"{k.name}.{op}": k for k in kernels for op in k.ops}
    user = api._get_store()
    dst = Store(path)
    try:
        for kp in result.kernels:
            k = entries[kp.name]
            bp, sources = _batch_policy(k.module), k.module.sources
            bench_key = _cache_key(k.problem, kp.op, k.numerics, bp, sources)
            kb = user.get_kernel_bench(bench_key) if user is not None else None
            if kb is not None:
                dst.put_kernel_bench(bench_key, kb)
            if result.policy == "wr":
                limit = k.module.workspace_limit
                dst.put_plan(_cache_key(k.problem, kp.op, k.numerics, bp, sources, limit),
                             Plan("wr", bp, [kp], result.device, result.cudnn_version, workspace_limit=limit,
                                  numerics=k.numerics))
        if result.policy == "wd":
            from ..cluster.precompute import plan_key

            table_id = dst.put_table(table)
            dst.put_plan(plan_key(table_id, "wd", result.batch_policy, result.total_workspace), result, table_id)
    finally:
        dst.engine.dispose()
    finalize(path)
