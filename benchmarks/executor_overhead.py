"""Host time per executed plan: what ucudnn's executor adds on top of cuDNN's own call.

Why: a micro-batched kernel is several cuDNN calls, and small kernels (ResNet-50
fp16 convolutions take 20-60 us on an H100) end up host-bound when the
executor's Python work per call approaches the GPU's.  This measures, on
problems small enough that the GPU is never the bottleneck:

- ``executor``: host microseconds per ``Executor`` call (N calls back to back,
  host clock, no synchronisation inside), per plan of 1 and of 8 micro-batches;
- ``floor``: the same cuDNN calls made directly (prebuilt descriptors or
  built graph plan, no ucudnn bookkeeping): what any Python wrapper pays;
- ``cuda_graph``: one executor call captured into a CUDA graph and replayed
  (event time per replay): what a user with fixed buffers can get;
- ``torch``: PyTorch's host time for the undivided convolution, for scale.

    python benchmarks/executor_overhead.py --label after --out /tmp/o      # one implementation
    python benchmarks/executor_overhead.py --report /tmp/o/before.json /tmp/o/after.json --out benchmarks/results

Run the first form under two PYTHONPATHs to compare implementations side by side in one session.
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

CASES = {
    # name: (problem kwargs, op, numerics)
    "resnet-like fp16 NHWC 3x3": (dict(n=32, c=64, h=14, w=14, k=64, r=3, s=3, pad=(1, 1), dtype="float16",
                                       layout="NHWC"), "forward", "strict"),
    "resnet-like fp32 NCHW 1x1 wgrad": (dict(n=32, c=64, h=14, w=14, k=64, r=1, s=1), "backward_filter", "strict"),
}


def _plans(problem, op, numerics, source):
    """(1-step plan, 8-step plan) of the fastest configuration of ``source`` at n and n/8."""
    from ucudnn.measure.benchmarking import benchmark
    from ucudnn.planning.plan import KernelPlan, MicroConfig
    from ucudnn.problem import KernelSpec

    table = benchmark([KernelSpec("k", op, problem)], "powerOfTwo", numerics, sources=[source], repeat=1)
    ms = table.kernels[0].measurements
    out = []
    for steps in (1, 8):
        mb = problem.n // steps
        best = min((m for m in ms if m.micro_batch == mb), key=lambda m: m.time_ms)
        out.append(KernelPlan("k", op, problem, [MicroConfig.of(best)] * steps))
    return out


def _host_us(fn, calls: int) -> float:
    import cupy as cp

    for _ in range(20):
        fn()
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    cp.cuda.Device().synchronize()
    return (t1 - t0) / calls * 1e6


def _floor(plan, operands, ws):
    """The plan's cuDNN calls made directly (no executor): a callable."""
    from ucudnn.binding import cudnn
    from ucudnn.binding.gpu import descriptors, handle
    from ucudnn.measure.sources import registry

    cfg, p, op = plan.configs[0], plan.problem.with_batch(plan.configs[0].micro_batch), plan.op
    a, b, out = operands
    steps = len(plan.configs)
    if cfg.source == "legacy":
        d = descriptors(p, cfg.math_type)
        da, db, do = d.operands(op)
        h, algo = handle(), int(cfg.algo)

        def fn():
            for _ in range(steps):
                cudnn.convolution(h, op, 1.0, da, a.data.ptr, db, b.data.ptr, d.conv, algo, ws.ptr,
                                  cfg.workspace_bytes, 0.0, do, out.data.ptr)
        return fn
    from ucudnn.measure.sources.graph import UIDS, EngineIdentity

    src = registry.get("graph")
    built = src.plan_for(op, p, EngineIdentity.from_json(cfg.engine))
    h = handle()
    pack = {UIDS[0]: a.data.ptr, UIDS[1]: b.data.ptr, UIDS[2]: out.data.ptr}

    def fn():
        for _ in range(steps):
            built.graph.execute_plan_at_index(pack, ws.ptr, built.index, handle=h)
    return fn


def _captured(fn):
    """Event ms per replay of ``fn`` captured into a CUDA graph, or the reason capture failed."""
    from ucudnn.binding.timing import time_replay_ms
    from ucudnn.errors import summary

    try:
        return time_replay_ms(fn), None
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        return None, summary(e)


def _torch_us(problem, op, calls):
    try:
        import torch
        import torch.nn.functional as F
    except Exception:  # noqa: BLE001
        return None
    p = problem
    dt = {"float32": torch.float32, "float16": torch.float16}[p.dtype]
    mf = torch.channels_last if p.layout == "NHWC" else torch.contiguous_format
    x = torch.randn(p.n, p.c, p.h, p.w, device="cuda", dtype=dt).to(memory_format=mf)
    w = torch.randn(p.k, p.c, p.r, p.s, device="cuda", dtype=dt).to(memory_format=mf)
    dy = torch.randn(p.n, p.k, p.p, p.q, device="cuda", dtype=dt).to(memory_format=mf)
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    if op == "forward":
        fn = lambda: F.conv2d(x, w, padding=p.pad)  # noqa: E731
    else:
        fn = lambda: torch.ops.aten.convolution_backward(  # noqa: E731
            dy, x, w, None, [1, 1], list(p.pad), [1, 1], False, [0, 0], 1, [False, True, False])
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def measure(label: str, calls: int) -> dict:
    import cupy as cp

    from ucudnn.binding.timing import time_ms
    from ucudnn.execute.executor import Executor
    from ucudnn.problem import ConvProblem

    rows, profiles = [], {}
    for case, (kw, op, numerics) in CASES.items():
        problem = ConvProblem(**kw)
        rng = cp.random.default_rng(0)
        shapes = dict(zip(("a", "b", "out"), problem.operand_shapes(op)))
        arrs = [rng.standard_normal(s, dtype="float32").astype(problem.dtype) for s in shapes.values()]
        ws = cp.cuda.alloc(256 << 20)
        torch_us = _torch_us(problem, op, calls)
        for source in ("legacy", "graph"):
            try:
                plans = _plans(problem, op, numerics, source)
            except Exception as e:  # noqa: BLE001 - e.g. no engine for this case
                rows.append(dict(case=case, op=op, source=source, error=str(e)[:200]))
                continue
            for plan in plans:
                ex = Executor(plan)
                call = lambda: ex(*arrs, workspace=ws)  # noqa: E731
                host = _host_us(call, calls)
                event = time_ms(call, repeat=5, warmup=2, min_sample_ms=5.0) * 1e3
                floor_fn = _floor(plan, arrs, ws)
                floor = _host_us(floor_fn, calls)
                graph_ms, graph_err = _captured(call)
                steps = len(plan.configs)
                rows.append(dict(case=case, op=op, source=source, steps=steps, micro_batch=plan.configs[0].micro_batch,
                                 config=f"{plan.configs[0].algo}/{plan.configs[0].math_type}",
                                 executor_host_us=round(host, 2), executor_event_us=round(event, 2),
                                 floor_host_us=round(floor, 2),
                                 added_us_per_step=round((host - floor) / steps, 2),
                                 cuda_graph_us=None if graph_ms is None else round(graph_ms * 1e3, 2),
                                 cuda_graph_error=graph_err, torch_host_us=None if torch_us is None else round(torch_us, 2)))
                if steps == 8:
                    prof = cProfile.Profile()
                    prof.enable()
                    for _ in range(500):
                        call()
                    prof.disable()
                    cp.cuda.Device().synchronize()
                    s = io.StringIO()
                    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(12)
                    profiles[f"{case} / {source} / 8 steps"] = s.getvalue()[-4000:]
    return {"label": label, "provenance": provenance(), "calls": calls, "rows": rows, "profiles": profiles}


def report(paths: list[str], out: str) -> None:
    docs = [json.loads(Path(p).read_text()) for p in paths]
    prov = docs[-1]["provenance"]
    md = md_header("Executor host overhead per call (host-bound problems)", prov)
    md += ("\nHost microseconds per call (N back-to-back calls, host clock); `floor`: the same cuDNN calls made "
           "directly; `added/step`: (executor - floor) / micro-batches; `CUDA graph`: event time per replay of one "
           "captured executor call; `event`: device time per call as timed with CUDA events (= max(host, GPU)).\n\n")
    md += "| implementation | case | source | steps x micro-batch | executor host us | floor us | added us/step | event us | CUDA graph us | PyTorch host us |\n"
    md += "|---|---|---|---|---:|---:|---:|---:|---:|---:|\n"
    for d in docs:
        for r in d["rows"]:
            if "error" in r:
                md += f"| {d['label']} | {r['case']} | {r['source']} | - | error: {r['error'][:60]} | | | | | |\n"
                continue
            cg = r["cuda_graph_us"] if r["cuda_graph_us"] is not None else f"failed: {r['cuda_graph_error'][:50]}"
            md += (f"| {d['label']} | {r['case']} {r['op']} | {r['source']} | {r['steps']} x {r['micro_batch']} | "
                   f"{r['executor_host_us']} | {r['floor_host_us']} | {r['added_us_per_step']} | "
                   f"{r['executor_event_us']} | {cg} | {r['torch_host_us']} |\n")
    write(out, "executor_overhead", {"runs": docs}, md)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", default="current")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--report", nargs="+", default=None, help="merge these raw JSON files into the result table")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    if args.report:
        return report(args.report, args.out)
    doc = measure(args.label, args.calls)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"{args.label}.json").write_text(json.dumps(doc, indent=1) + "\n")
    for r in doc["rows"]:
        print(r)
    for k, v in doc["profiles"].items():
        print("==", k, "\n", v[-2500:])


if __name__ == "__main__":
    main()
