"""Issue 2's benchmark: real execution of WR plans vs cuDNN undivided (and PyTorch), side by side in one run.

For a network's distinct conv kernels (x 3 ops): benchmark tables at each
batch policy (timed: the benchmarking cost is reported), plans at each
per-kernel workspace limit (undivided, WR per policy), then EXECUTE every plan
on the GPU (CUDA events, median) and report measured totals, the speed-up
over undivided, and measured / predicted (the overhead of executing a plan).
PyTorch (cudnn.benchmark=True, unbounded workspace, matching numerics) runs on
the same layers for reference.

    python benchmarks/core_wr.py --network alexnet --batch 256 --dtype float32 --layout NCHW \
        --policies powerOfTwo,all --limits 8MiB,64MiB,512MiB --out benchmarks/results
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import md_header, provenance, write  # noqa: E402


def distinct_kernels(kernels):
    seen, out = set(), []
    for k in kernels:
        if (k.problem, k.op) not in seen:
            seen.add((k.problem, k.op))
            out.append(k)
    return out


def execute_plan(plan, bufs, repeat: int, replay: bool = False):
    """Measured ms of each kernel of ``plan`` (median of ``repeat`` event-timed runs); ``replay``: each kernel run
    by ``Executor(replay=True)``, which captures its call into a CUDA graph once and replays it (a graph launch
    of host work per call instead of every step's launches)."""
    from ucudnn.binding.timing import time_ms
    from ucudnn.execute.executor import Executor

    times = {}
    for kp in plan.kernels:
        a, bb, out = bufs[kp.problem].arrays(kp.op)
        ex = Executor(kp, replay=replay)
        import cupy as cp

        ws = cp.cuda.alloc(max(ex.workspace_bytes, 1))
        # a backward filter planned on unwritten memory borrows its layer's dx (issue 18), as a training step would
        # before that layer's backward data writes it
        spare = bufs[kp.problem].dx if ex.takes_unwritten and kp.op == "backward_filter" else None
        times[kp.name] = time_ms(lambda: ex(a, bb, out, workspace=ws, unwritten=spare), repeat=repeat, warmup=2,
                                 min_sample_ms=1.0)
        if replay and ex.replay_failures:
            print(f"   {kp.name}: not replayed ({ex.replay_failures[0]})", flush=True)
    return times


def torch_times(kernels, numerics: str, repeat: int, replay: bool = False):
    """PyTorch's own choice (cudnn.benchmark, unbounded workspace) on the same kernels; ``replay``: each call
    captured once into a CUDA graph (``torch.cuda.graph``, after cudnn.benchmark's search) and replayed."""
    import torch
    import torch.nn.functional as F

    from ucudnn.binding.timing import time_ms

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = numerics.startswith("tf32")
    out = {}
    for k in kernels:
        p = k.problem
        dt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[p.dtype]
        mf = torch.channels_last if p.layout == "NHWC" else torch.contiguous_format
        x = torch.randn(p.n, p.c, p.h, p.w, device="cuda", dtype=dt).to(memory_format=mf)
        w = torch.randn(p.k, p.c // p.groups, p.r, p.s, device="cuda", dtype=dt).to(memory_format=mf)
        dy = torch.randn(p.n, p.k, p.p, p.q, device="cuda", dtype=dt).to(memory_format=mf)
        kw = dict(stride=p.stride, padding=p.pad, dilation=p.dilation, groups=p.groups)
        if k.op == "forward":
            fn = lambda: F.conv2d(x, w, **kw)  # noqa: E731
        else:
            mask = [k.op == "backward_data", k.op == "backward_filter", False]
            fn = lambda: torch.ops.aten.convolution_backward(  # noqa: E731
                dy, x, w, None, list(p.stride), list(p.pad), list(p.dilation), False, [0, 0], p.groups, mask)
        import cupy as cp

        ts = torch.cuda.current_stream()
        try:
            stream = cp.cuda.Stream.from_external(ts)
        except Exception:  # noqa: BLE001 - older torch without the CUDA stream protocol
            stream = cp.cuda.ExternalStream(ts.cuda_stream)
        with stream:
            if replay:
                for _ in range(3):   # cudnn.benchmark searches on the first call: never inside the capture
                    fn()
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    fn()
                fn = g.replay
            out[k.name] = time_ms(fn, repeat=repeat, warmup=3, min_sample_ms=1.0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--network", default="alexnet")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--layout", default="NCHW")
    ap.add_argument("--numerics", default=None)
    ap.add_argument("--policies", default="powerOfTwo,all")
    ap.add_argument("--limits", default="8MiB,64MiB,512MiB")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per configuration while benchmarking")
    ap.add_argument("--all-repeat", type=int, default=0, help="timed runs per configuration for the 'all' policy "
                    "(0: cuDNN Find's own time, as the seed does; 'all' benchmarks B sizes)")
    ap.add_argument("--exec-repeat", type=int, default=7)
    ap.add_argument("--torch", action="store_true")
    ap.add_argument("--baseline-math", default=None, help="also plan undivided and WR on the table restricted to "
                    "this cuDNN math type (e.g. DEFAULT: what a caller that never sets the math type gets)")
    ap.add_argument("--tables-out", default=None, help="also save each benchmark table here")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()

    import cupy as cp

    from ucudnn import numerics as num
    from ucudnn.measure.benchmarking import Buffers, benchmark
    from ucudnn.planning.network import load_network
    from ucudnn.planning.planner import plan
    from ucudnn.units import parse_size

    prov = provenance()
    kernels = distinct_kernels(load_network(args.network).kernels(args.batch, args.dtype, args.layout))
    numerics = num.normalize(args.numerics, args.dtype)
    tag = f"{args.network}-b{args.batch}-{args.dtype}-{args.layout}"
    tables, bench_s = {}, {}
    for pol in args.policies.split(","):
        t0 = time.perf_counter()
        tables[pol] = benchmark(kernels, pol, numerics, repeat=args.all_repeat if pol == "all" else args.repeat)
        cp.cuda.runtime.deviceSynchronize()
        bench_s[pol] = time.perf_counter() - t0
        if args.tables_out:
            Path(args.tables_out).mkdir(parents=True, exist_ok=True)
            suffix = ".json.gz" if pol == "all" else ".json"  # 'all' tables are megabytes
            tables[pol].save(Path(args.tables_out) / f"{tag}-{pol}-h100{suffix}")
        print(f"benchmarked {pol}: {bench_s[pol]:.1f} s", flush=True)

    bufs = {}
    for k in kernels:
        if k.problem not in bufs:
            bufs[k.problem] = Buffers(k.problem)
    base_table = tables.get("powerOfTwo") or next(iter(tables.values()))
    plans = []
    for limit in args.limits.split(","):
        lim = parse_size(limit)
        plans.append((limit, "undivided", plan(base_table, "undivided", workspace_limit=lim)))
        plans += [(limit, f"wr-{pol}", plan(tables[pol], "wr", workspace_limit=lim, batch_policy=pol)) for pol in tables]
        if args.baseline_math:
            only = base_table.restricted([args.baseline_math])
            plans.append((limit, f"undivided[{args.baseline_math}]", plan(only, "undivided", workspace_limit=lim)))
            plans.append((limit, f"wr-powerOfTwo[{args.baseline_math}]", plan(only, "wr", workspace_limit=lim)))
    # Two passes over every plan (METHOD: time the same thing twice; a difference below that spread is noise).
    passes = [[execute_plan(pl, bufs, args.exec_repeat) for _, _, pl in plans] for _ in range(2)]
    rows = []
    for i, (limit, name, pl) in enumerate(plans):
        per_pass = [sum(p[i].values()) for p in passes]
        measured = {k: min(p[i][k] for p in passes) for k in passes[0][i]}
        rows.append({"limit": limit, "limit_bytes": pl.workspace_limit, "plan": name,
                     "predicted_ms": pl.total_time_ms, "measured_ms": sum(measured.values()),
                     "measured_passes_ms": per_pass, "workspace_bytes": pl.workspace_bytes,
                     "kernels": {k.name: {"predicted_ms": k.time_ms, "measured_ms": measured[k.name],
                                          "measured_passes_ms": [p[i][k.name] for p in passes],
                                          "division": k.summary(), "workspace_bytes": k.workspace_bytes}
                                 for k in pl.kernels}})
        print(f"{limit:>7} {name:<14} predicted {pl.total_time_ms:9.3f} ms  measured "
              + " / ".join(f"{t:9.3f}" for t in per_pass) + " ms", flush=True)
    torch_total = None
    if args.torch:
        tt = torch_times(kernels, numerics, args.exec_repeat)
        torch_total = sum(tt.values())
    doc = {"provenance": prov, "network": args.network, "batch": args.batch, "dtype": args.dtype,
           "layout": args.layout, "numerics": numerics, "kernels": len(kernels),
           "benchmark_seconds": bench_s, "rows": rows, "torch_total_ms": torch_total,
           "torch_kernels_ms": tt if args.torch else None}
    md = md_header(f"WR vs undivided, {tag}, numerics {numerics}, {len(kernels)} kernels", prov)
    md += "\nBenchmarking time: " + ", ".join(f"{p} {s:.1f} s" for p, s in bench_s.items())
    md += " (all: repeat=%d)\n\n" % args.all_repeat
    md += ("Measured: each plan executed in two passes (per kernel the faster pass is kept; both pass totals shown).\n\n"
           "| limit/kernel | plan | predicted ms | measured ms | pass 1 / pass 2 ms | measured/predicted | speed-up vs undivided |\n"
           "|---|---|---:|---:|---:|---:|---:|\n")
    for r in rows:
        base = "undivided" + (r["plan"][r["plan"].index("["):] if "[" in r["plan"] else "")
        und = next(x for x in rows if x["limit"] == r["limit"] and x["plan"] == base)
        md += (f"| {r['limit']} | {r['plan']} | {r['predicted_ms']:.3f} | {r['measured_ms']:.3f} | "
               f"{r['measured_passes_ms'][0]:.2f} / {r['measured_passes_ms'][1]:.2f} | "
               f"{r['measured_ms'] / r['predicted_ms']:.3f} | {und['measured_ms'] / r['measured_ms']:.2f}x |\n")
    if torch_total is not None:
        md += f"\nPyTorch (cudnn.benchmark, unbounded workspace, same numerics): {torch_total:.3f} ms total"
        for r in rows:
            if r["plan"].startswith("wr-"):
                md += f"; {r['plan']} @ {r['limit']}: {torch_total / r['measured_ms']:.2f}x PyTorch's speed"
        md += "\n"
    write(args.out, f"core_wr_{tag}", doc, md)


if __name__ == "__main__":
    main()
