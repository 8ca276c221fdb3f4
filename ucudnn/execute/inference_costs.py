"""Measuring what an inference plan chooses between (issue 19): every part of a network, executed and replayed.

:func:`measure_costs` builds each candidate step exactly as :class:`~ucudnn.execute.inference.InferenceSession`
would (the same :class:`~ucudnn.execute.inference.Step` constructors, on buffers of the real shapes) and times it
captured in a CUDA graph and replayed (:func:`ucudnn.binding.timing.time_replay_ms`): at inference batch sizes
most kernels take microseconds, and a session replays its whole forward pass as one graph, so the host's launch
work is not what the plan pays.  Measured:

* each conv node in each layout: the WR plan under ``workspace_limit`` from a benchmark of the node's forward
  problem with ``sources`` (replay-timed), executed with its bias and activation pass;
* each other node (pooling, global average pooling, concat, add, softmax) in each layout;
* each fusable block (:func:`ucudnn.planning.inference.find_blocks`) as one fused kernel per layout, its tiling
  tuned on the device first (:func:`kernels.fused.tuned_tiling`, cached per device and shape);
* each wide block (a concat of convs reading one tensor, :func:`ucudnn.planning.inference.wide_node`) as its
  merged conv: a WR plan of the merged problem from the same benchmark, with its bias and activation pass;
* each conv node and wide block whose bias / activation cuDNN's graph API can fuse into the conv
  (:mod:`ucudnn.execute.conv_epilogue`): the fastest fused engine configuration within the limit
  (``epilogue_tuning_s`` bounds the time spent);
* each tensor's transforms NCHW <-> NHWC (none for a 1x1 plane or one channel: the same memory).

Equal shapes are timed once (MobileNet repeats its blocks).  A part that cannot run (a block the fused kernels
do not support, a pooling the kernels cannot express) is recorded in ``declined`` with the reason and is simply
not an option for the planner.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np

from .. import numerics as num
from ..binding import cudnn
from ..binding.gpu import cupy, device_name
from ..binding.timing import time_replay_ms
from ..errors import InputError, UcudnnError, summary
from ..measure.benchmarking import benchmark
from ..planning.inference import INPUT, LAYOUTS, InferenceCosts, find_blocks, wide_node
from ..planning.network import Network, op_of, problem_of
from ..planning.plan import KernelPlan
from ..planning.planner import plan as plan_table
from ..problem import KernelSpec
from ..units import parse_size
from . import inference as inf


def _time(fn: Callable[[], None]) -> float:
    return round(time_replay_ms(fn, repeat=3, warmup=2, min_sample_ms=2.0), 6)


def measure_costs(network: Network, batch: int, dtype: str = "float32", *, workspace_limit: Any = "8MiB",
                  layouts: Sequence[str] = LAYOUTS, sources: Any = None, numerics: str | None = None,
                  batch_policy: str = "powerOfTwo", fuse: bool = True, seed: int = 0,
                  block_tuning_s: float = 60.0, epilogues: bool = True, epilogue_tuning_s: float = 120.0,
                  log: Callable[[str], None] | None = None) -> InferenceCosts:
    """:class:`InferenceCosts` of ``network`` at ``batch`` on the current device (module doc).

    ``block_tuning_s``: wall time for tuning fused tilings on the device (each trial compiles a kernel, about
    half a second); blocks reached after it run the cost model's default tiling (or one tuned before on this
    device, from the tuning cache).  0: no tuning.  ``epilogues``: also measure cuDNN's fused conv + bias +
    activation per conv (``epilogue_tuning_s``: wall time for it; convs reached after it have no fused option)."""
    cp = cupy()
    if dtype not in ("float32", "float16"):
        raise InputError(f"expected float32 or float16, got {dtype!r}", "dtype")
    for lo in layouts:
        if lo not in LAYOUTS:
            raise InputError(f"must be among {LAYOUTS}, got {lo!r}", "layouts")
    if batch < 1:
        raise InputError(f"expected a positive batch, got {batch}", "batch")
    limit = parse_size(workspace_limit, "workspace_limit")
    nm = num.normalize(numerics, dtype)
    say = log or (lambda _m: None)
    shapes = network.shapes()
    shapes[INPUT] = network.input_shape()
    ins = network.inputs()
    node = {n["name"]: n for n in network.nodes}
    weights = inf.random_weights(network, seed)
    costs = InferenceCosts(network.name, batch, dtype, nm, limit, device_name(), cudnn.get_version())
    rng = np.random.default_rng(seed)

    def buf(t: str, lo: str) -> Any:
        return cp.asarray(rng.standard_normal(inf.shape_in(shapes[t], batch, lo)), dtype=dtype)

    def empty(t: str, lo: str) -> Any:
        return cp.empty(inf.shape_in(shapes[t], batch, lo), dtype=dtype)

    ws_holder: list[Any] = [None]
    seen: dict[tuple, Any] = {}
    t0 = time.perf_counter()
    wides = {b.name: b for b in find_blocks(network) if b.mode == "wide"} if fuse else {}
    merged = {name: wide_node(network, b.convs) for name, b in wides.items()}
    epi_until = time.perf_counter() + (epilogue_tuning_s if epilogues else 0.0)

    def workspace_for(nbytes: int) -> None:
        if nbytes and (ws_holder[0] is None or ws_holder[0].nbytes < nbytes):
            ws_holder[0] = cp.empty(nbytes, dtype=cp.uint8)

    def epilogue(key: str, n: dict[str, Any], problem: Any, lo: str, operands: Callable[[], tuple]) -> None:
        """Tune cuDNN's fused conv + bias + activation of one conv (node or merged) into costs.epilogues;
        ``operands()`` gives its (x, (w, b), out), made only when a tuning runs."""
        from .conv_epilogue import tune

        if not (n.get("bias") or n.get("act")):
            return
        k = ("epilogue", problem, n.get("act"), bool(n.get("bias")))
        if k not in seen:
            if time.perf_counter() > epi_until:
                costs.declined[f"epilogue:{key}@{lo}"] = "not tuned: epilogue_tuning_s spent"
                return
            x, (w, b), out = operands()
            seen[k] = tune(problem, bool(n.get("bias")), n.get("act"), nm, limit, (x, w, b, out), _time)
        best, why = seen[k]
        if best is None:
            costs.declined[f"epilogue:{key}@{lo}"] = why
        else:
            costs.epilogues.setdefault(key, {})[lo] = best.to_dict()

    for lo in layouts:
        # conv nodes (and wide blocks' merged convs): one benchmark of the distinct forward problems, WR plans
        specs = network.kernels(batch, dtype, lo, ops=["forward"])
        specs += [KernelSpec(f"{name}/forward", "forward", problem_of(m, batch, dtype, lo))
                  for name, m in merged.items()]
        distinct = list({s.problem: s for s in specs}.values())
        say(f"{lo}: benchmarking {len(distinct)} distinct forward problems of {len(specs)} conv layers")
        table = benchmark(distinct, batch_policy, nm, sources=sources, timing="replay")
        by_problem: dict[Any, KernelPlan] = {}
        try:
            wr = plan_table(table, "wr", workspace_limit=limit, batch_policy=batch_policy)
            by_problem = {k.problem: k for k in wr.kernels}
        except UcudnnError as e:   # infeasible kernels: plan them one by one below
            say(f"{lo}: WR over the table failed ({summary(e)}); planning kernels one at a time")
            for kb in table.kernels:
                try:
                    sub = plan_table(type(table)(table.device, table.cudnn_version, [kb], table.numerics,
                                                 table.extra), "wr", workspace_limit=limit,
                                     batch_policy=batch_policy)
                    by_problem[kb.problem] = sub.kernels[0]
                except UcudnnError as e2:
                    costs.declined[f"{kb.name}@{lo}"] = summary(e2)
        for s in specs:
            name = s.name.rsplit("/", 1)[0]
            kp = by_problem.get(s.problem)
            if kp is None:
                costs.declined.setdefault(name, f"no plan fits {limit} bytes in {lo}")
                continue
            kp = KernelPlan(name, "forward", kp.problem, kp.configs)
            costs.conv_plans.setdefault(name, {})[lo] = kp.to_dict()
            wide = wides.get(name)
            n = merged[name] if wide else node[name]
            key = ("conv", s.problem, n.get("act"), bool(n.get("bias")))
            made: list[tuple] = []

            def operands(wide: Any = wide, name: str = name, lo: str = lo, made: list = made) -> tuple:
                """(x, (w, b), out) of this conv in this layout, made once, on first need."""
                if not made:
                    src = wide.inputs[0] if wide else (ins[name][0] if ins[name] else INPUT)
                    wb = inf.wide_weights(network, wide.convs, weights) if wide else weights[name]
                    made.append((buf(src, lo), inf.prepare_weights(*wb, lo, dtype),
                                 empty(wide.output if wide else name, lo)))
                return made[0]

            if key not in seen:
                x, w, out = operands()
                step = inf.conv_step(n, kp, x, w, out, lambda: ws_holder[0])
                workspace_for(step.workspace_bytes)
                seen[key] = _time(step.run)
            (costs.blocks if wide else costs.nodes).setdefault(name, {})[lo] = seen[key]
            if epilogues:
                epilogue(name, n, s.problem, lo, operands)
        # the other nodes
        for n in network.nodes:
            op, name = op_of(n), n["name"]
            if op == "conv":
                continue
            srcs = ins[name] or [INPUT]
            key = (op, lo, tuple(shapes[t] for t in srcs), tuple(sorted((k, str(v)) for k, v in n.items()
                                                                        if k not in ("name", "after"))))
            if key not in seen:
                xs, out = [buf(t, lo) for t in srcs], empty(name, lo)
                try:
                    step = _other_step(n, xs, out, lo)
                    seen[key] = _time(step.run)
                except InputError as e:
                    costs.declined[f"{name}@{lo}"] = summary(e)
                    continue
            costs.nodes.setdefault(name, {})[lo] = seen[key]
        say(f"{lo}: nodes measured ({time.perf_counter() - t0:.1f} s; "
            f"{sum(lo in v for v in costs.epilogues.values())} fused epilogues)")
    # fused blocks
    if fuse:
        tune_until = time.perf_counter() + block_tuning_s
        for b in find_blocks(network):
            if b.mode == "wide":   # measured with the conv nodes above
                continue
            for lo in layouts:
                try:
                    t, tiling, kernel = _time_block(network, b, lo, batch, dtype, weights, buf, empty, seen,
                                                    time.perf_counter() < tune_until)
                except (InputError, UcudnnError) as e:
                    costs.declined[f"{b.name}@{lo}"] = summary(e)
                    continue
                costs.blocks.setdefault(b.name, {})[lo] = t
                costs.tilings.setdefault(b.name, {})[lo] = tiling
                if kernel != "fma":
                    costs.block_kernels.setdefault(b.name, {})[lo] = kernel
        say(f"fused blocks measured ({time.perf_counter() - t0:.1f} s)")
    # layout transforms of every tensor
    if len(layouts) > 1:
        for t in [INPUT, *(n["name"] for n in network.nodes)]:
            for src in layouts:
                for dst in layouts:
                    if src == dst:
                        continue
                    key = ("transform", shapes[t], src, dst)
                    if key not in seen:
                        if inf.same_memory(shapes[t]):
                            seen[key] = 0.0
                        else:
                            step = inf.transform_step(t, buf(t, src), empty(t, dst), src, dst)
                            seen[key] = _time(step.run)
                    costs.transforms.setdefault(t, {})[f"{src}>{dst}"] = seen[key]
        say(f"transforms measured ({time.perf_counter() - t0:.1f} s)")
    return costs


def _other_step(n: dict[str, Any], xs: list[Any], out: Any, lo: str) -> inf.Step:
    op, name = op_of(n), n["name"]
    if op == "pool":
        return inf.pool_step(n, xs[0], out, lo)
    if op == "global_avg_pool":
        return inf.global_pool_step(name, xs[0], out, lo)
    if op == "concat":
        return inf.concat_step(name, xs, out, lo)
    if op == "add":
        return inf.add_step(n, xs[0], xs[1], out)
    return inf.softmax_step(name, xs[0], out, lo)


def _time_block(network: Network, b: Any, lo: str, batch: int, dtype: str, weights: dict, buf: Callable,
                empty: Callable, seen: dict, tune: bool) -> tuple[float, list[int], str]:
    """(ms, tiling, kernel) of the fastest fused-block kernel that runs the block (:mod:`kernels.blocks`: in FP16
    the tensor-core kernels beside the FMA one), each at its tuned tiling."""
    from ..kernels import blocks as K

    block = inf.fused_block(network, b.convs, b.mode, b.merge_relu)
    xs = [buf(t, lo) for t in b.inputs]
    key = ("fused", block.key(), lo, tuple(x.shape for x in xs))
    if key in seen:
        return seen[key]
    out = empty(b.output, lo)
    ws = [inf.prepare_weights(*weights[c], lo, dtype) for c in b.convs]
    w_list, b_list = [w for w, _ in ws], [bb for _, bb in ws]
    x2 = xs[1] if len(xs) > 1 else None
    operands = (xs[0], w_list, b_list, out, x2)
    best: tuple[float, list[int], str] | None = None
    for kernel in K.candidates(block, dtype):
        try:
            tiling = K.tuned(kernel, block, dtype, lo, tuple(xs[0].shape), operands, tune,
                             None if kernel == "fma" else _time)
            step_doc = {"name": b.output, "convs": list(b.convs), "mode": b.mode, "merge_relu": b.merge_relu,
                        "tiling": tiling, "kernel": kernel}
            step = inf.fused_step(network, step_doc, xs, dict(zip(b.convs, ws)), out, lo, dtype)
        except InputError:
            if kernel == "fma":
                raise
            continue    # a tensor-core kernel that cannot take these operands: the others still can
        ms = _time(step.run)
        if best is None or ms < best[0]:
            best = (ms, tiling, kernel)
    assert best is not None   # the FMA kernel runs every block
    seen[key] = best
    return best
