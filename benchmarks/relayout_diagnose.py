"""Why the relayout source does (or does not) win a kernel: its parts, side by side, at chosen micro-batches.

For each kernel and micro-batch size: the best native graph-API configuration
within the limit; the same kernel's relayout configurations (inner engine in
the other layout + ucudnn's transforms): the inner engine's own time, the
transforms' time, their sum, and the step as executed (what the planner
sees); and the host time of one relayout step (its Python work and four
transform launches), measured alone.

    python benchmarks/relayout_diagnose.py --network alexnet --combo float32:NCHW:tf32 \
        --kernels conv3/forward,conv4/forward,conv4/backward_data --sizes 64,128 --out benchmarks/results
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import md_header, provenance, write  # noqa: E402


def _best(ms, limit):
    fit = [m for m in ms if m.workspace_bytes <= limit]
    return min(fit, key=lambda m: m.time_ms) if fit else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--network", default="alexnet")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--combo", default="float32:NCHW:tf32")
    ap.add_argument("--kernels", default="conv3/forward,conv4/forward,conv4/backward_data,conv5/backward_filter")
    ap.add_argument("--sizes", default="64,128")
    ap.add_argument("--limit", default="64MiB")
    ap.add_argument("--inner", default="graph", help="sources the relayout wraps (graph, legacy or both)")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()

    import cupy as cp

    from ucudnn import numerics as num
    from ucudnn.measure.benchmarking import Buffers
    from ucudnn.measure.sources import registry
    from ucudnn.measure.sources.base import BenchSettings
    from ucudnn.measure.sources.graph import GraphSource
    from ucudnn.measure.sources.relayout import RelayoutSource
    from ucudnn.planning.network import load_network
    from ucudnn.units import format_size, parse_size

    dtype, layout, numerics = args.combo.split(":")
    numerics = num.normalize(numerics, dtype)
    limit = parse_size(args.limit)
    want = args.kernels.split(",")
    kernels = {k.name: k for k in load_network(args.network).kernels(args.batch, dtype, layout)}
    graph = GraphSource()
    registry.register(graph)
    relayout = RelayoutSource([graph if s == "graph" else s for s in args.inner.split(",")])
    registry.register(relayout)
    ws = cp.cuda.alloc(4 << 30)
    settings = BenchSettings(numerics, repeat=3, warmup=1, max_workspace=4 << 30, min_sample_ms=1.0)
    rows = []
    for name in want:
        k = kernels[name]
        buf = Buffers(k.problem)
        for n in (int(s) for s in args.sizes.split(",")):
            p = k.problem.with_batch(n)
            ops = buf.operands(k.op, n)
            native = [m for s in relayout.inner for m in s.measure(k.op, p, ops, ws.ptr, settings)[0]]
            relayed, skipped = relayout.measure(k.op, p, ops, ws.ptr, settings)
            nb, rb, ra = _best(native, limit), _best(relayed, limit), _best(relayed, 1 << 62)
            host_us = None
            if rb is not None:   # host time of one executed relayout step, GPU never the bottleneck here
                launch = relayout.prepare(k.op, p, rb)
                beta = 1.0 if k.op == "backward_filter" else 0.0
                cp.cuda.Device().synchronize()
                t0 = time.perf_counter()
                for _ in range(50):
                    launch(ops, ws.ptr, rb.workspace_bytes, 1.0, beta)
                host_us = (time.perf_counter() - t0) / 50 * 1e6
                cp.cuda.Device().synchronize()
            via = (rb.extra.get("via") or {}) if rb is not None else {}
            rows.append(dict(kernel=name, micro_batch=n,
                             native_ms=nb and round(nb.time_ms, 4), native_mib=nb and round(nb.workspace_bytes / 2**20, 1),
                             native_config=nb and nb.algo,
                             relayout_ms=rb and round(rb.time_ms, 4), relayout_mib=rb and round(rb.workspace_bytes / 2**20, 1),
                             relayout_config=rb and rb.algo, inner_ms=via.get("inner_time_ms"),
                             transform_ms=via.get("transform_ms"), sum_of_parts_ms=via.get("sum_of_parts_ms"),
                             relayout_host_us_per_step=host_us and round(host_us, 1),
                             relayout_best_any_ms=ra and round(ra.time_ms, 4),
                             relayout_best_any_mib=ra and round(ra.workspace_bytes / 2**20, 1),
                             relayout_configs=len(relayed), relayout_skipped=len(skipped)))
            print(rows[-1], flush=True)
    prov = provenance()
    md = md_header(f"Relayout parts, {args.network} b{args.batch} {args.combo}, limit {format_size(limit)}, "
                   f"sources {args.inner}", prov)
    md += ("\nPer kernel and micro-batch: best native configuration (same sources) within the limit vs the best relayout "
           "configuration within it (inner engine in the other layout + ucudnn's transforms). `step` is the relayout "
           "step timed as executed (what the planner uses); `host us` the host time of one step alone.\n\n"
           "| kernel | n | native ms (MiB) | relayout step ms (MiB) | inner ms | transforms ms | sum of parts ms | "
           "host us/step | relayout, any workspace: ms (MiB) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    for r in rows:
        md += (f"| {r['kernel']} | {r['micro_batch']} | {r['native_ms']} ({r['native_mib']}) | {r['relayout_ms']} "
               f"({r['relayout_mib']}) | {r['inner_ms']} | {r['transform_ms']} | {r['sum_of_parts_ms']} | "
               f"{r['relayout_host_us_per_step']} | {r['relayout_best_any_ms']} ({r['relayout_best_any_mib']}) |\n")
    write(args.out, f"relayout_diagnose_{args.network}-{dtype}-{layout}-{numerics}-{args.inner.replace(',', '-')}", {"provenance": prov, "rows": rows}, md)


if __name__ == "__main__":
    main()
