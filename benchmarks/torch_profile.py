"""Where a converted model's training step spends host time (diagnostic for issue 15's bar 3; GPU machine).

A converted model makes three custom-op calls per convolution per step, each running a plan of one or more
steps.  When the GPU work per step is short (TF32, AMP) the host can become the bottleneck; this script
shows whether it is, and where the host time goes:

* per implementation (``torch``, ``ucudnn-256``): GPU step time (CUDA events) and host time per step
  (the Python loop's wall time with the GPU queue kept full, i.e. how fast the host can issue a step);
* a cProfile of ``--profile-steps`` ucudnn steps, top functions by own time;
* the host cost of one call on a tiny convolution (GPU time negligible), float32 NCHW and autocast float16
  channels_last, with a layer-by-layer breakdown of one forward (``call_breakdown``) and a cProfile;
* GPU kernel time per step (torch.profiler), so a host-bound step still shows what the GPU alone would take;
* ``--bisect``: the converted model's step with one layer of ucudnn's call path stubbed out at a time;
* ``--launch-costs``: host time per call of each kernel, layer by layer of the launch path, beside
  PyTorch's own call;
* ``--layers``: the convolutions' GPU time per step, layer shape by layer shape, PyTorch's against ucudnn's,
  with ucudnn's plans.

    python benchmarks/torch_profile.py --model resnet50 --batch 128 --mode default
    python benchmarks/torch_profile.py --mode amp --sources legacy,graph,fold --bisect --out /tmp/out

Writes ``--out``/torch_profile-MODEL-MODE.{json,md}.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import md_header, provenance, write  # noqa: E402


def build(model_name: str, batch: int, mode: str, limit: str | None, sources: str | None = None,
          replay: bool = False):
    import torch
    import torchvision

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = mode != "fp32"
    torch.manual_seed(0)
    fmt = torch.channels_last if mode == "amp" else torch.contiguous_format
    from torch_train import MODEL_KWARGS   # the constructor arguments torch_train's runs of this model use

    model = getattr(torchvision.models, model_name)(num_classes=1000, **MODEL_KWARGS.get(model_name, {}))
    model = model.cuda().to(memory_format=fmt)
    if limit:
        import ucudnn.torch

        from ucudnn.torch import fastpath

        ucudnn.torch.convert(model, workspace_limit=limit, sources=sources, replay=replay)
        fastpath.start(wait=True)   # the compiled launch path from the first step (UCUDNN_TORCH_FASTPATH=0: Python's)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, 224, 224, device="cuda").to(memory_format=fmt)
    t = torch.randint(0, 1000, (batch,), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.float16, enabled=mode == "amp"):
            loss = torch.nn.functional.cross_entropy(model(x), t)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def step_times(step, n: int) -> dict:
    import torch

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    host = (time.perf_counter() - t0) / n
    e.record()
    torch.cuda.synchronize()
    return {"gpu_ms": s.elapsed_time(e) / n, "host_issue_ms": host * 1e3}


def _tiny(channels_last: bool):
    """A launch-bound convolution (GPU time negligible): 2x8x8x8, 3x3, both implementations."""
    import torch

    import ucudnn.torch  # noqa: F401  (registers the ops)

    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(2, 8, 8, 8, device="cuda").to(memory_format=fmt).requires_grad_()
    conv = ucudnn.torch.Conv2d(8, 8, 3, padding=1, bias=False, workspace_limit="64MiB").cuda().to(memory_format=fmt)
    ref = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False).cuda().to(memory_format=fmt)
    return x, conv, ref


def op_overhead(reps: int = 300, amp: bool = False) -> dict:
    """Host microseconds per call on a tiny convolution (launch-bound): forward alone, forward + backward;
    ``amp``: under autocast float16 with channels_last (ResNet-50's AMP path), else float32 NCHW."""
    import torch

    x, conv, ref = _tiny(channels_last=amp)
    out = {}
    for name, m in (("ucudnn", conv), ("torch", ref)):
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            for _ in range(5):
                m(x).float().sum().backward()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(reps):
                y = m(x)
            torch.cuda.synchronize()
            out[f"{name}_forward_us"] = (time.perf_counter() - t0) / reps * 1e6
            g = torch.ones_like(y)
            t0 = time.perf_counter()
            for _ in range(reps):
                y = m(x)
                y.backward(g)
            torch.cuda.synchronize()
            out[f"{name}_fwd_bwd_us"] = (time.perf_counter() - t0) / reps * 1e6
    return out


def op_profile(reps: int = 300, amp: bool = True) -> str:
    """cProfile of ``reps`` forward + backward calls of the tiny ucudnn convolution: where one call's host time
    goes (top functions by own time; ``ncalls`` / ``reps`` is the count per call)."""
    import torch

    x, conv, _ = _tiny(channels_last=amp)
    with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
        for _ in range(5):
            y = conv(x)
            y.backward(torch.ones_like(y))
        g = torch.ones_like(y)
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(reps):
            y = conv(x)
            y.backward(g)
        prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(45)
    return buf.getvalue()


def _per_call_us(fn, reps: int = 2000) -> float:
    """Host microseconds per call of ``fn`` (wall clock, best of three runs of ``reps`` calls)."""
    import torch

    best = float("inf")
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps * 1e6)
    torch.cuda.synchronize()
    return round(best, 2)


def call_breakdown() -> dict:
    """Host microseconds per call of each layer of one ucudnn forward on a tiny float16 NHWC convolution
    (launch-bound), outermost first, beside PyTorch's: what each layer adds is the difference to the next.

    Wall clock, no profiler (cProfile's per-call cost would dwarf the layers measured)."""
    import torch

    from ucudnn.binding.gpu import handle
    from ucudnn.torch import ops, runtime

    x, conv, ref = _tiny(channels_last=True)
    x = x.detach()
    x16, w16 = x.half(), conv.weight.detach().half().contiguous(memory_format=torch.channels_last)
    args = ([1, 1], [1, 1], [1, 1], 1, "NHWC", "default", conv.workspace_limit, "", "", False)
    y = ops.forward_impl(x16, w16, *args)                      # finds the plan
    problem = runtime.problem_of(x16.shape, w16.shape, (1, 1), (1, 1), (1, 1), 1, torch.float16, "NHWC")
    settings = runtime.Settings(conv.workspace_limit)
    ex = runtime.executor(problem, "forward", settings, "default", 0)
    cp = runtime._cp
    stream = runtime.cupy_stream(0)
    ws = torch.empty(max(ex.workspace_bytes, 1), dtype=torch.uint8, device="cuda")
    ptrs = (x16.data_ptr(), w16.data_ptr(), y.data_ptr())
    operands = _operands(ptrs)
    out: dict = {"plan": [f"{s.config.source}:{s.micro_batch}" for s in ex.steps],
                 "workspace_bytes": ex.workspace_bytes}

    def in_ctx(fn):
        def call():
            with cp.cuda.Device(0), stream:
                fn()
        return call

    rows = [
        ("torch F.conv2d fp16 (no grad)", lambda: torch.nn.functional.conv2d(x16, w16, padding=1)),
        ("torch.empty(y)", lambda: torch.empty(y.shape, dtype=y.dtype, device=y.device,
                                               memory_format=torch.channels_last)),
        ("torch.empty(workspace) + free", lambda: torch.empty(max(ex.workspace_bytes, 1), dtype=torch.uint8,
                                                              device="cuda")),
        ("x.to(float16)", lambda: x.to(torch.float16)),
        ("cupy device + stream context", in_ctx(lambda: None)),
        ("binding.gpu.handle() in context", in_ctx(handle)),
        ("step launch (source) in context", in_ctx(
            lambda: ex.steps[0].launch(operands, ws.data_ptr(), ex.workspace_bytes, 1.0, 0.0))),
        ("Executor.launch in context", in_ctx(lambda: ex.launch(ptrs, ws.data_ptr(), ex.workspace_bytes))),
        ("runtime.launch", lambda: runtime.launch("forward", problem, x16, w16, y, settings, "default")),
        ("ops.forward_impl", lambda: ops.forward_impl(x16, w16, *args)),
    ]
    with torch.no_grad():
        for name, fn in rows:
            try:
                out[name] = _per_call_us(fn)
            except Exception as e:  # noqa: BLE001 - a diagnostic: report, go on
                out[name] = f"error: {str(e)[:120]}"
    xg = x.clone().requires_grad_()
    with torch.autocast("cuda", dtype=torch.float16):
        out["module forward, autocast, grad (ucudnn)"] = _per_call_us(lambda: conv(xg), 1000)
        out["module forward, autocast, grad (torch)"] = _per_call_us(lambda: ref(xg), 1000)
    return out


def _operands(ptrs):
    from ucudnn.measure.sources.base import Operands

    return Operands(*ptrs)


def plan_shapes(step) -> dict:
    """How the converted model's kernels run: plans by number of steps and by the sources of their steps."""
    from collections import Counter

    from ucudnn.torch import runtime

    runtime.forget_prepared()     # a cache: only this model's kernels are prepared again
    step()
    steps, sources = Counter(), Counter()
    for call in runtime._calls.values():
        steps[len(call.executor.steps)] += 1
        sources.update(s.config.source for s in call.executor.steps)
    return {"kernels": len(runtime._calls), "by_steps": dict(steps), "steps_by_source": dict(sources)}


def _cuda_profile(step, n: int, warm: int = 1):
    """torch.profiler's CUDA activity over ``n`` steps after ``warm`` unprofiled ones."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warm):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    return prof


def gpu_kernel_ms(step, n: int = 3) -> dict:
    """GPU time per step summed over its kernels (torch.profiler), so host-bound steps still show what the
    GPU alone would take; with the five longest kernels' names."""
    prof = _cuda_profile(step, n)
    total = 0.0
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0) or 0.0
        if t > 0:
            total += t
            rows.append((t, e.key))
    rows.sort(reverse=True)
    return {"kernel_ms_per_step": round(total / n / 1e3, 2),
            "top": [f"{t / n / 1e3:.2f} ms {k[:90]}" for t, k in rows[:6]]}


def api_calls(step, n: int = 3) -> dict:
    """CUDA runtime / driver API calls per step (torch.profiler's CUPTI trace): count and host us per step of
    each, so a step whose host time and GPU time add up (rather than overlap) shows whether something in it
    waits on the GPU (a synchronisation, a cudaMalloc or cudaFree, a blocking copy) or only issues slowly."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        if e.key.startswith(("cuda", "cu", "CUDA")) and not e.key.startswith("cudnn"):
            host = getattr(e, "self_cpu_time_total", 0.0) or getattr(e, "cpu_time_total", 0.0)
            rows.append({"api": e.key, "calls_per_step": round(e.count / n, 1),
                         "host_us_per_step": round(host / n, 1)})
    rows.sort(key=lambda r: -r["host_us_per_step"])
    return {"rows": rows[:25]}


def launch_overhead(reps: int = 500) -> dict:
    """Host microseconds per launch of one prepared configuration of each source (ResNet-50's 1x1 64->256 at
    56x56, micro-batch 8: a few microseconds of GPU work), and GPU microseconds for reference."""
    import cupy as cp

    from ucudnn.binding.gpu import cupy as _cp  # noqa: F401  (binds ucudnn to this CuPy)
    from ucudnn.measure.benchmarking import Buffers
    from ucudnn.measure.sources import registry
    from ucudnn.measure.sources.base import BenchSettings
    from ucudnn.problem import ConvProblem

    problem = ConvProblem(8, 64, 56, 56, 256, 1, 1, 0, 1, 1, 1, "float32", "NCHW")
    buf = Buffers(problem)
    ws = cp.cuda.alloc(256 << 20)
    settings = BenchSettings("tf32", repeat=3, max_workspace=256 << 20)
    out: dict = {}
    for name in ("legacy", "graph"):
        try:
            src = registry.get(name)
            ops = buf.operands("forward", problem.n)
            ms, _ = src.measure("forward", problem, ops, ws.ptr, settings)
            best = min(ms, key=lambda m: m.time_ms)
            launch = src.prepare("forward", problem, best)
            for _ in range(20):
                launch(ops, ws.ptr, best.workspace_bytes, 1.0, 0.0)
            cp.cuda.get_current_stream().synchronize()
            t0 = time.perf_counter()
            for _ in range(reps):
                launch(ops, ws.ptr, best.workspace_bytes, 1.0, 0.0)
            host = (time.perf_counter() - t0) / reps * 1e6
            cp.cuda.get_current_stream().synchronize()
            out[name] = {"host_us_per_launch": round(host, 1), "gpu_us": round(best.time_ms * 1e3, 1),
                         "config": f"{best.algo}/{best.math_type}"}
        except Exception as e:  # noqa: BLE001 - a diagnostic: report, go on
            out[name] = {"error": str(e)[:200]}
    return out


def bisect(model_name: str, batch: int, mode: str, limit: str, sources: str | None, steps: int) -> dict:
    """Host and GPU ms per training step of the converted model with one layer of ucudnn's call path taken out
    at a time (the results of the stubbed variants are wrong: only their time counts), so the difference to
    the full path is what that layer costs in the real step:

    * ``full``: as shipped; ``gc off``: Python's cyclic garbage collector disabled while timing;
    * ``no source launches``: every ``Executor.launch`` returns at once (the cuDNN calls of the plans' steps);
    * ``no runtime.launch``: ucudnn's launch layer skipped too (prepared-call lookup, CuPy contexts, workspace);
    * ``glue + torch convs``: the module, autograd function and ops run, torch's own convolutions instead of
      ucudnn's plans (``ops._run`` declines every call);
    * ``replay``: the layers converted with ``replay=True`` (each call's steps replayed as a CUDA graph).

    ``launch_us``: host microseconds per ``Executor.launch`` in the full path, by (op, first step's source,
    steps), with the count per step.
    """
    import gc
    from collections import defaultdict

    from ucudnn.execute.executor import Executor
    from ucudnn.torch import ops, runtime

    out: dict = {}
    step = build(model_name, batch, mode, limit, sources)
    out["full"] = step_times(step, steps)
    gc.collect()
    gc.disable()
    try:
        out["gc off"] = step_times(step, steps)
    finally:
        gc.enable()
    orig_exec = Executor.launch
    stats: dict = defaultdict(lambda: [0, 0.0])

    def timed(self, *a, **k):
        t0 = time.perf_counter()
        orig_exec(self, *a, **k)
        st = stats[(self.plan.op, self.steps[0].config.source, len(self.steps))]
        st[0] += 1
        st[1] += time.perf_counter() - t0

    n = 3
    Executor.launch = timed
    try:
        for _ in range(n):
            step()
    finally:
        Executor.launch = orig_exec
    import torch

    torch.cuda.synchronize()
    out["launch_us"] = {f"{op} {src} x{k}": {"per_step": c // n, "us": round(t / c * 1e6, 1)}
                        for (op, src, k), (c, t) in sorted(stats.items())}
    for name, target, attr, stub in (("no source launches", Executor, "launch", lambda *a, **k: None),
                                     ("no runtime.launch", runtime, "launch", lambda *a, **k: None),
                                     ("glue + torch convs", ops, "_run", lambda *a, **k: False)):
        saved = getattr(target, attr)
        setattr(target, attr, stub)
        try:
            out[name] = _safe(step_times, step, steps)
        finally:
            setattr(target, attr, saved)
    del step
    out["torch"] = _safe(lambda: step_times(build(model_name, batch, mode, None), steps))
    out["replay"] = _safe(lambda: step_times(build(model_name, batch, mode, limit, sources, replay=True), steps))
    return out


def _avg_device_us(e) -> float:
    return float(getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0) or 0.0)


def _shape_key(x_shape, w_shape) -> str:
    return f"x{list(x_shape)} w{list(w_shape)}"


def layer_times(model_name: str, batch: int, mode: str, limit: str, sources: str | None, n: int = 3) -> dict:
    """GPU time of the convolutions per training step, layer shape by layer shape, PyTorch's against ucudnn's
    (torch.profiler: device time of the kernels each convolution call launches), the rest of the step's kernels,
    ucudnn's plans (steps, sources, planned time) and, per ucudnn call, the GPU span between CUDA events
    recorded around it (its kernels plus any launch gaps inside the call).

    PyTorch's: ``aten::cudnn_convolution`` (forward) and ``aten::convolution_backward`` (dx and dw in one call)
    grouped by input shapes; ucudnn's: a ``record_function`` range around each ``runtime.launch`` -- the Python
    path's launches only: what the compiled path launches from C++ counts in the rest of the step (run with
    ``UCUDNN_TORCH_FASTPATH=0`` to range every call, or see :func:`kernel_names`)."""
    import gc
    from collections import defaultdict

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from ucudnn.torch import runtime

    def kernels_total(prof) -> float | None:
        try:
            return sum(_avg_device_us(e) for e in prof.key_averages()
                       if str(getattr(e, "device_type", "")).endswith("CUDA")) / n / 1e3
        except Exception:  # noqa: BLE001 - a diagnostic: report, go on
            return None

    out: dict = {"n_steps_profiled": n}
    # --- PyTorch ---
    step = build(model_name, batch, mode, None)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    t_rows: dict = defaultdict(lambda: {"fwd": 0.0, "bwd": 0.0, "calls": 0})
    for e in prof.key_averages(group_by_input_shape=True):
        if e.key == "aten::cudnn_convolution":
            k, which = _shape_key(e.input_shapes[0], e.input_shapes[1]), "fwd"
        elif e.key == "aten::convolution_backward":
            k, which = _shape_key(e.input_shapes[1], e.input_shapes[2]), "bwd"
        else:
            continue
        t_rows[k][which] += _avg_device_us(e) / n / 1e3
        t_rows[k]["calls"] += e.count // n
    out["torch_kernels_ms"] = kernels_total(prof)
    del step, prof
    gc.collect()
    torch.cuda.empty_cache()
    # --- ucudnn ---
    step = build(model_name, batch, mode, limit, sources)
    step()     # plans (benchmarks if no cache has them)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    orig = runtime.launch

    def ranged(op, problem, *a, **k):
        p = problem
        with record_function(f"ucudnn|{op}|{_shape_key([p.n, p.c, p.h, p.w], [p.k, p.c // p.groups, p.r, p.s])}"):
            return orig(op, problem, *a, **k)

    runtime.launch = ranged
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                step()
            torch.cuda.synchronize()
    finally:
        runtime.launch = orig
    u_rows: dict = defaultdict(lambda: {"forward": 0.0, "backward_data": 0.0, "backward_filter": 0.0, "calls": 0})
    for e in prof.key_averages():
        if e.key.startswith("ucudnn|"):
            _, op, k = e.key.split("|", 2)
            u_rows[k][op] += _avg_device_us(e) / n / 1e3
            u_rows[k]["calls"] += e.count // n
    out["ucudnn_kernels_ms"] = kernels_total(prof)
    del prof
    # per-call GPU span (CUDA events around each launch)
    spans: list = []

    def evented(op, problem, *a, **k):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        r = orig(op, problem, *a, **k)
        e.record()
        spans.append((op, problem, s, e))
        return r

    runtime.launch = evented
    try:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    finally:
        runtime.launch = orig
    span_rows: dict = defaultdict(float)
    for op, p, s, e in spans:
        span_rows[(op, _shape_key([p.n, p.c, p.h, p.w], [p.k, p.c // p.groups, p.r, p.s]))] += s.elapsed_time(e) / n
    plans = []
    for key, call in runtime._calls.items():
        ex = call.executor
        p = ex.plan.problem
        plans.append({"op": key[0], "shape": _shape_key([p.n, p.c, p.h, p.w], [p.k, p.c // p.groups, p.r, p.s]),
                      "problem": p.describe(), "planned_ms": round(ex.plan.time_ms, 4),
                      "workspace_mib": round(ex.workspace_bytes / 2**20, 1),
                      "steps": [f"{s.config.source}:{s.micro_batch}:{s.config.algo}/{s.config.math_type}"
                                + (f":k{s.config.channels}" if s.config.channels is not None else "")
                                for s in ex.steps]})
    out["plans"] = plans
    rows = []
    for k in sorted(set(t_rows) | set(u_rows)):
        t, u = t_rows.get(k), u_rows.get(k)
        rows.append({"shape": k, "torch_fwd_ms": round(t["fwd"], 4) if t else None,
                     "torch_bwd_ms": round(t["bwd"], 4) if t else None, "torch_calls": t["calls"] if t else 0,
                     "ucudnn_fwd_ms": round(u["forward"], 4) if u else None,
                     "ucudnn_bwd_ms": round(u["backward_data"] + u["backward_filter"], 4) if u else None,
                     "ucudnn_dx_ms": round(u["backward_data"], 4) if u else None,
                     "ucudnn_dw_ms": round(u["backward_filter"], 4) if u else None,
                     "ucudnn_calls": u["calls"] if u else 0,
                     "ucudnn_span_ms": round(sum(v for (op, kk), v in span_rows.items() if kk == k), 4)})
    out["layers"] = rows
    tot = lambda f: round(sum(r[f] or 0.0 for r in rows), 3)  # noqa: E731
    out["totals"] = {f: tot(f) for f in ("torch_fwd_ms", "torch_bwd_ms", "ucudnn_fwd_ms", "ucudnn_bwd_ms",
                                         "ucudnn_dx_ms", "ucudnn_dw_ms", "ucudnn_span_ms")}
    for impl in ("torch", "ucudnn"):
        k = out[f"{impl}_kernels_ms"]
        out["totals"][f"{impl}_non_conv_ms"] = None if k is None else round(
            k - out["totals"][f"{impl}_fwd_ms"] - out["totals"][f"{impl}_bwd_ms"], 3)
    return out


def kernel_names(model_name: str, batch: int, mode: str, limit: str, sources: str | None, n: int = 3,
                 top: int = 40) -> dict:
    """GPU time per step of every CUDA kernel by name, PyTorch's step against the converted one (torch.profiler over
    ``n`` steps after warm-up): what :func:`layer_times` cannot attribute -- it ranges ucudnn's Python launches
    only, so kernels the compiled path launches from C++ count there as the rest of the step.  Rows: the ``top``
    kernel names by the larger of the two times, each side's ms per step and calls per step."""
    import gc

    import torch

    def per_name(step) -> dict:
        prof = _cuda_profile(step, n, warm=3)
        out: dict = {}
        for e in prof.key_averages():
            if str(getattr(e, "device_type", "")).endswith("CUDA"):
                ms, calls = out.get(e.key, (0.0, 0))
                out[e.key] = (ms + _avg_device_us(e) / n / 1e3, calls + e.count / n)
        return out

    sides = {}
    for impl, lim in (("torch", None), ("ucudnn", limit)):
        step = build(model_name, batch, mode, lim, sources if lim else None)
        step()      # plans (benchmarks if no cache has them)
        sides[impl] = per_name(step)
        del step
        gc.collect()
        torch.cuda.empty_cache()
    names = sorted(set(sides["torch"]) | set(sides["ucudnn"]),
                   key=lambda k: -max(sides["torch"].get(k, (0,))[0], sides["ucudnn"].get(k, (0,))[0]))
    rows = [{"kernel": k[:160], "torch_ms": round(sides["torch"].get(k, (0.0, 0))[0], 4),
             "torch_calls": round(sides["torch"].get(k, (0.0, 0))[1], 1),
             "ucudnn_ms": round(sides["ucudnn"].get(k, (0.0, 0))[0], 4),
             "ucudnn_calls": round(sides["ucudnn"].get(k, (0.0, 0))[1], 1)} for k in names[:top]]
    return {"n_steps_profiled": n, "rows": rows,
            "torch_total_ms": round(sum(v[0] for v in sides["torch"].values()), 3),
            "ucudnn_total_ms": round(sum(v[0] for v in sides["ucudnn"].values()), 3)}


def launch_costs(model_name: str, batch: int, mode: str, limit: str, sources: str | None, reps: int = 100) -> dict:
    """Host microseconds per call, kernel by kernel of the converted model, of ucudnn's layers from the outside
    in (``runtime.launch``, ``Executor.launch`` in CuPy's context, the step's source launcher, and for graph steps
    cudnn-frontend's ``execute_plan_at_index`` and its compiled method called directly) beside PyTorch's own call
    for the same convolution (``aten.convolution`` / ``aten.convolution_backward`` for that one gradient), on
    buffers of the kernel's shapes.  ``reps`` calls back to back, no synchronisation inside, best of three:
    the GPU queue stays short of full, so this is the host's time per call."""
    import torch

    from ucudnn.torch import runtime

    step = build(model_name, batch, mode, limit, sources)
    runtime.forget_prepared()
    step()
    torch.cuda.synchronize()
    cp = runtime._cp
    stream = runtime.cupy_stream(0)
    rows = []
    for key, call in list(runtime._calls.items()):
        op, problem, settings, numerics = key[0], key[1], key[2], key[3]
        ex = call.executor
        p = problem
        fmt = runtime.memory_format(p.layout)
        dt = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[p.dtype]
        x = torch.randn(p.n, p.c, p.h, p.w, device="cuda", dtype=dt).contiguous(memory_format=fmt)
        w = torch.randn(p.k, p.c // p.groups, p.r, p.s, device="cuda", dtype=dt).contiguous(memory_format=fmt)
        dy = torch.randn(p.n, p.k, p.p, p.q, device="cuda", dtype=dt).contiguous(memory_format=fmt)
        a, b, out = {"forward": (x, w, torch.empty_like(dy)), "backward_data": (w, dy, torch.empty_like(x)),
                     "backward_filter": (x, dy, torch.empty_like(w))}[op]
        ws = torch.empty(max(ex.workspace_bytes, 1), dtype=torch.uint8, device="cuda")
        ptrs = (a.data_ptr(), b.data_ptr(), out.data_ptr())
        args = (list(p.stride), list(p.pad), list(p.dilation), False, [0, 0], p.groups)
        if op == "forward":
            torch_fn = lambda: torch.ops.aten.convolution(x, w, None, *args)  # noqa: E731
        else:
            mask = [op == "backward_data", op == "backward_filter", False]
            torch_fn = lambda: torch.ops.aten.convolution_backward(dy, x, w, None, *args, mask)  # noqa: E731

        def in_ctx(fn):
            def f():
                with cp.cuda.Device(0), stream:
                    fn()
            return f

        row = {"op": op, "problem": p.describe(), "steps": [f"{s.config.source}:{s.micro_batch}" for s in ex.steps],
               "planned_gpu_us": round(ex.plan.time_ms * 1e3, 1)}
        variants = [("torch", torch_fn),
                    ("runtime.launch", lambda: runtime.launch(op, problem, a, b, out, settings, numerics)),
                    ("Executor.launch", in_ctx(lambda: ex.launch(ptrs, ws.data_ptr(), ex.workspace_bytes)))]
        st = ex.steps[0]
        if len(ex.steps) == 1 and not any(st.shifts):
            from ucudnn.measure.sources.base import Operands

            ops_ = Operands(*ptrs)
            variants.append(("source launcher", in_ctx(lambda: st.launch(ops_, ws.data_ptr(), ex.workspace_bytes,
                                                                           1.0, 0.0))))
            if st.config.source == "graph":
                try:
                    from ucudnn.binding.gpu import handle
                    from ucudnn.measure.sources import registry
                    from ucudnn.measure.sources.graph import UIDS, EngineIdentity

                    g = registry.get("graph")
                    ident = EngineIdentity.from_json(st.config.engine if st.config.engine is not None
                                                     else st.config.algo)
                    built = g.plan_for(op, p.with_batch(st.micro_batch), ident)
                    wsp = ws.data_ptr()
                    variants.append(("frontend execute_plan_at_index", in_ctx(
                        lambda: built.graph.execute_plan_at_index({UIDS[0]: ptrs[0], UIDS[1]: ptrs[1],
                                                                   UIDS[2]: ptrs[2]}, wsp, built.index,
                                                                  handle=handle()))))
                    h = None

                    def direct():
                        built.graph._execute_plan_at_index({UIDS[0]: ptrs[0], UIDS[1]: ptrs[1], UIDS[2]: ptrs[2]},
                                                           wsp, built.index, h, None, None, None)

                    with cp.cuda.Device(0), stream:
                        h = handle()
                    variants.append(("pybind _execute_plan_at_index", direct))
                    variants.append(("binding.gpu.handle()", in_ctx(handle)))
                except Exception as e:  # noqa: BLE001 - a diagnostic: report, go on
                    row["graph_error"] = f"{type(e).__name__}: {str(e)[:160]}"
        for name, fn in variants:
            try:
                for _ in range(3):
                    fn()
                row[name] = round(_per_call_us(fn, reps), 1)
            except Exception as e:  # noqa: BLE001
                row[name] = f"error: {type(e).__name__}: {str(e)[:120]}"
        rows.append(row)
        variants.clear()    # and this kernel's buffers, before the next kernel's
        x = w = dy = a = b = out = ws = None
    names = ["torch", "runtime.launch", "Executor.launch", "source launcher", "frontend execute_plan_at_index",
             "pybind _execute_plan_at_index", "binding.gpu.handle()"]
    sums = {n: round(sum(r[n] for r in rows if isinstance(r.get(n), float)), 1) for n in names}
    counts = {n: sum(1 for r in rows if isinstance(r.get(n), float)) for n in names}
    return {"rows": rows, "sum_us_over_kernels": sums, "kernels_measured": counts}


def _layers_md(res: dict) -> list[str]:
    L = res["layers"]
    md = [f"Kernel time per step (torch.profiler, {L['n_steps_profiled']} steps): PyTorch {L['torch_kernels_ms']} ms, "
          f"ucudnn {L['ucudnn_kernels_ms']} ms", "", f"Totals (ms per step): {L['totals']}", "",
          "| layer shape | torch fwd | torch bwd (dx+dw) | ucudnn fwd | ucudnn dx | ucudnn dw | ucudnn span | calls t/u |",
          "|---|---:|---:|---:|---:|---:|---:|---:|"]
    f = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    for r in L["layers"]:
        md.append(f"| {r['shape']} | {f(r['torch_fwd_ms'])} | {f(r['torch_bwd_ms'])} | {f(r['ucudnn_fwd_ms'])} | "
                  f"{f(r['ucudnn_dx_ms'])} | {f(r['ucudnn_dw_ms'])} | {f(r['ucudnn_span_ms'])} | "
                  f"{r['torch_calls']}/{r['ucudnn_calls']} |")
    md += ["", "Plans (op, problem, planned ms, workspace MiB, steps source:micro-batch:algo/math):", ""]
    md += [f"- {p['op']} {p['problem']}: {p['planned_ms']} ms, {p['workspace_mib']} MiB, {' '.join(p['steps'])}"
           for p in L["plans"]]
    return md


def _safe(fn, *args) -> dict:
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - a diagnostic: report, go on
        return {"error": f"{type(e).__name__}: {str(e)[:200]}"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--mode", default="default", choices=("fp32", "default", "amp"))
    ap.add_argument("--limit", default="256MiB")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--profile-steps", type=int, default=5)
    ap.add_argument("--sources", default=None, help="ucudnn's algorithm sources (default: the library's)")
    ap.add_argument("--no-launch-overhead", action="store_true", help="skip the per-source launch measurement")
    ap.add_argument("--no-cprofile", action="store_true", help="skip the cProfile runs")
    ap.add_argument("--bisect", action="store_true",
                    help="only the per-layer bisection of the converted model's step (see bisect()); --out/torch_bisect-*")
    ap.add_argument("--layers", action="store_true",
                    help="only the per-layer GPU time of the convolutions, PyTorch's against ucudnn's, and ucudnn's "
                         "plans (see layer_times()); --out/torch_layers-*")
    ap.add_argument("--kernels", action="store_true",
                    help="only the GPU time per step of every kernel by name, PyTorch's step against the converted "
                         "one (see kernel_names()); --out/torch_kernels-*")
    ap.add_argument("--launch-costs", action="store_true",
                    help="only the host time per call of each of the converted model's kernels, layer by layer of "
                         "ucudnn's launch path, beside PyTorch's (see launch_costs()); --out/torch_launch_costs-*")
    ap.add_argument("--api", action="store_true",
                    help="only the CUDA API calls per step of PyTorch's and the converted model's steps (see "
                         "api_calls()); --out/torch_api-*")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    a = ap.parse_args(argv)
    if a.api:
        res = {"model": a.model, "batch": a.batch, "mode": a.mode, "limit": a.limit, "sources": a.sources}
        for impl, limit in (("torch", None), ("ucudnn", a.limit)):
            step = build(a.model, a.batch, a.mode, limit, a.sources if limit else None)
            res[impl] = {**step_times(step, a.steps), **_safe(api_calls, step)}
            del step
        res["provenance"] = provenance()
        md = [md_header(f"CUDA API calls per {a.model} b{a.batch} step ({a.mode}), PyTorch vs ucudnn at {a.limit}",
                        res["provenance"]), ""]
        for impl in ("torch", "ucudnn"):
            r = res[impl]
            md += [f"{impl}: GPU {r['gpu_ms']:.1f} ms/step, host {r['host_issue_ms']:.1f} ms/step", "",
                   "| API | calls / step | host us / step |", "|---|---:|---:|",
                   *[f"| {x['api']} | {x['calls_per_step']} | {x['host_us_per_step']} |" for x in r.get("rows", [])],
                   ""]
        write(Path(a.out), f"torch_api-{a.model}-{a.mode}", res, "\n".join(md) + "\n")
        print("\n".join(md))
        return 0
    if a.launch_costs:
        res = {"model": a.model, "batch": a.batch, "mode": a.mode, "limit": a.limit, "sources": a.sources,
               "launch_costs": launch_costs(a.model, a.batch, a.mode, a.limit, a.sources), "provenance": provenance()}
        lc = res["launch_costs"]
        md = [md_header(f"Host us per call of each kernel of a converted {a.model} b{a.batch} ({a.mode})",
                        res["provenance"]), "", f"Sum over the kernels (us): {lc['sum_us_over_kernels']}", "",
              f"Kernels measured: {lc['kernels_measured']}", "",
              *[f"- {r}" for r in lc["rows"]]]
        write(Path(a.out), f"torch_launch_costs-{a.model}-{a.mode}", res, "\n".join(md) + "\n")
        return 0
    if a.kernels:
        res = {"model": a.model, "batch": a.batch, "mode": a.mode, "limit": a.limit, "sources": a.sources,
               "kernels": kernel_names(a.model, a.batch, a.mode, a.limit, a.sources), "provenance": provenance()}
        k = res["kernels"]
        md = [md_header(f"GPU kernels of a {a.model} b{a.batch} step ({a.mode}), PyTorch vs ucudnn at {a.limit}",
                        res["provenance"]), "",
              f"ms per step over every kernel (torch.profiler, {k['n_steps_profiled']} steps): PyTorch "
              f"{k['torch_total_ms']}, ucudnn {k['ucudnn_total_ms']}", "",
              "| kernel | PyTorch ms | calls | ucudnn ms | calls |", "|---|---:|---:|---:|---:|",
              *[f"| `{r['kernel']}` | {r['torch_ms']} | {r['torch_calls']} | {r['ucudnn_ms']} | {r['ucudnn_calls']} |"
                for r in k["rows"]]]
        write(Path(a.out), f"torch_kernels-{a.model}-{a.mode}", res, "\n".join(md) + "\n")
        print("\n".join(md))
        return 0
    if a.layers:
        res = {"model": a.model, "batch": a.batch, "mode": a.mode, "limit": a.limit, "sources": a.sources,
               "layers": layer_times(a.model, a.batch, a.mode, a.limit, a.sources), "provenance": provenance()}
        md = [md_header(f"Convolution GPU time of a {a.model} b{a.batch} step ({a.mode}), PyTorch vs ucudnn "
                        f"at {a.limit}", res["provenance"]), "", *_layers_md(res)]
        write(Path(a.out), f"torch_layers-{a.model}-{a.mode}", res, "\n".join(md) + "\n")
        return 0
    if a.bisect:
        res = {"model": a.model, "batch": a.batch, "mode": a.mode, "limit": a.limit, "sources": a.sources,
               "bisect": bisect(a.model, a.batch, a.mode, a.limit, a.sources, a.steps), "provenance": provenance()}
        md = [md_header(f"Host time of a converted {a.model} b{a.batch} step ({a.mode}), layer by layer",
                        res["provenance"]), "", "| variant | GPU ms/step | host ms/step |", "|---|---:|---:|"]
        for k, v in res["bisect"].items():
            if k != "launch_us":
                md.append(f"| {k} | {v.get('gpu_ms', float('nan')):.1f} | {v.get('host_issue_ms', float('nan')):.1f} |"
                          if "error" not in v else f"| {k} | {v['error']} | |")
        md += ["", "Host us per Executor.launch in the full path (op, source, steps):", "",
               *[f"- {k}: {v}" for k, v in res["bisect"]["launch_us"].items()]]
        write(Path(a.out), f"torch_bisect-{a.model}-{a.mode}", res, "\n".join(md) + "\n")
        print("\n".join(md))
        return 0
    res: dict = {"model": a.model, "batch": a.batch, "mode": a.mode, "limit": a.limit, "sources": a.sources,
                 "op_overhead": op_overhead(), "op_overhead_amp": op_overhead(amp=True),
                 "call_breakdown": call_breakdown(),
                 "op_profile_amp": "" if a.no_cprofile else op_profile(),
                 "launch_overhead": {} if a.no_launch_overhead else launch_overhead()}
    step = build(a.model, a.batch, a.mode, None)
    res["torch"] = step_times(step, a.steps)
    res["torch"].update(_safe(gpu_kernel_ms, step))
    del step
    step = build(a.model, a.batch, a.mode, a.limit, a.sources)
    res["ucudnn"] = step_times(step, a.steps)
    res["ucudnn"].update(_safe(gpu_kernel_ms, step))
    res["plans"] = _safe(plan_shapes, step)
    res["profile_tottime"] = res["profile_cumulative"] = ""
    if not a.no_cprofile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(a.profile_steps):
            step()
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)
        res["profile_tottime"] = buf.getvalue()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(40)
        res["profile_cumulative"] = buf.getvalue()
    res["provenance"] = provenance()
    stem = f"torch_profile-{a.model}-{a.mode}"
    md = [md_header(f"Host time of a converted {a.model} b{a.batch} step ({a.mode})", res["provenance"]), "",
          "| impl | GPU ms/step | host ms/step | GPU kernels ms/step |", "|---|---:|---:|---:|"]
    for k in ("torch", "ucudnn"):
        md.append(f"| {k} | {res[k]['gpu_ms']:.1f} | {res[k]['host_issue_ms']:.1f} | "
                  f"{res[k].get('kernel_ms_per_step', '-')} |")
    md += ["", f"Plans of the converted model: {res['plans']}", "",
           "Host us per call, one tiny float16 NHWC forward, layer by layer (outermost last):", "",
           *[f"- {k}: {v}" for k, v in res["call_breakdown"].items()]]
    md += ["", "Per call on a tiny convolution (host-bound), float32 NCHW:", "",
           *[f"- {k}: {v:.0f} us" for k, v in res["op_overhead"].items()], "",
           "The same under autocast float16, channels_last:", "",
           *[f"- {k}: {v:.0f} us" for k, v in res["op_overhead_amp"].items()], "",
           "Per launch of one prepared configuration (ResNet-50 1x1 64->256, 56x56, micro-batch 8):", "",
           *[f"- {k}: {v}" for k, v in res["launch_overhead"].items()], "",
           "```", res["profile_tottime"][:6000], "```", "",
           "cProfile of 300 forward + backward calls of the tiny convolution (autocast float16, channels_last):", "",
           "```", res["op_profile_amp"][:8000], "```"]
    write(Path(a.out), stem, res, "\n".join(md) + "\n")
    print(json.dumps({k: res[k] for k in ("torch", "ucudnn", "plans", "op_overhead", "op_overhead_amp",
                                          "call_breakdown", "launch_overhead")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
