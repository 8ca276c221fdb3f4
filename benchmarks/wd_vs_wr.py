"""Issue 3's benchmark: WD (one network budget) vs WR (per-kernel limit) vs undivided, real execution.

For each network: benchmark its distinct kernels (``powerOfTwo``), expand to every
kernel of the network (each takes its own arena segment under WD), then for each
per-kernel limit M plan WD at a total of (#kernels x M), WR at M per kernel and
undivided at M, and EXECUTE all three on the GPU: WD through
:class:`ucudnn.execute.NetworkExecutor` (one arena, each kernel in its segment), the
others with a workspace each.  Two passes, per-kernel minimum kept.

    python benchmarks/wd_vs_wr.py --network alexnet --batch 256 --limits 8MiB,64MiB --out benchmarks/results
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import md_header, provenance, write  # noqa: E402
from core_wr import distinct_kernels, execute_plan  # noqa: E402


def execute_network(plan, bufs, repeat: int) -> dict[str, float]:
    from ucudnn.binding.timing import time_ms
    from ucudnn.execute.executor import NetworkExecutor

    net = NetworkExecutor(plan)
    times = {}
    for kp in plan.kernels:
        a, bb, out = bufs[kp.problem].arrays(kp.op)
        times[kp.name] = time_ms(lambda: net(kp.name, a, bb, out), repeat=repeat, warmup=2, min_sample_ms=1.0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--network", default="alexnet")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--layout", default="NCHW")
    ap.add_argument("--limits", default="8MiB,64MiB")
    ap.add_argument("--exec-repeat", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()

    from ucudnn.measure.benchmarking import Buffers, benchmark
    from ucudnn.planning.network import load_network
    from ucudnn.planning.wd import compare_policies
    from ucudnn.units import format_size, parse_size

    prov = provenance()
    net = load_network(args.network)
    kernels = distinct_kernels(net.kernels(args.batch, args.dtype, args.layout))
    t0 = time.perf_counter()
    distinct = benchmark(kernels, "powerOfTwo", None)
    bench_s = time.perf_counter() - t0
    table = net.table_from(distinct)
    bufs = {k.problem: Buffers(k.problem) for k in kernels}
    rows = []
    for limit in args.limits.split(","):
        lim = parse_size(limit)
        cmp = compare_policies(table, "powerOfTwo", workspace_limit=lim, total_workspace=lim * len(table.kernels))
        plans = cmp["plans"]
        measured = {}
        for _ in range(2):
            for name, pl in plans.items():
                t = execute_network(pl, bufs, args.exec_repeat) if name == "wd" else execute_plan(pl, bufs, args.exec_repeat)
                measured[name] = {k: min(v, measured.get(name, {}).get(k, v)) for k, v in t.items()}
        row = {"limit": limit, "total_workspace": cmp["total_workspace"], "policies": {}}
        for name, pl in plans.items():
            row["policies"][name] = {"predicted_ms": pl.total_time_ms, "measured_ms": sum(measured[name].values()),
                                     "workspace_bytes": pl.workspace_bytes, "stats": pl.stats}
        rows.append(row)
        print(limit, {n: round(v["measured_ms"], 3) for n, v in row["policies"].items()}, flush=True)
    doc = {"provenance": prov, "network": args.network, "batch": args.batch, "dtype": args.dtype,
           "kernels": len(table.kernels), "distinct_kernels": len(kernels), "benchmark_seconds": bench_s, "rows": rows}
    md = md_header(f"WD vs WR vs undivided, {args.network} b{args.batch} {args.dtype} {args.layout}, "
                   f"{len(table.kernels)} kernels ({len(kernels)} distinct)", prov)
    md += (f"\nBenchmarking (powerOfTwo, distinct kernels): {bench_s:.1f} s. WD gets (#kernels x limit) in one arena; "
           "WR and undivided get the limit per kernel. Measured = real execution (two passes, per-kernel min).\n\n"
           "| limit/kernel | WD total | policy | predicted ms | measured ms | arena / max workspace | WD speed-up (measured) | ILP vars | ILP solve s |\n"
           "|---|---|---|---:|---:|---:|---:|---:|---:|\n")
    for r in rows:
        wd_ms = r["policies"]["wd"]["measured_ms"]
        for name, v in r["policies"].items():
            st = v["stats"]
            md += (f"| {r['limit']} | {format_size(r['total_workspace'])} | {name} | {v['predicted_ms']:.3f} | "
                   f"{v['measured_ms']:.3f} | {format_size(v['workspace_bytes'])} | {v['measured_ms'] / wd_ms:.2f}x | "
                   f"{st.get('variables', '')} | {st.get('solve_seconds', '') if not isinstance(st.get('solve_seconds'), float) else round(st['solve_seconds'], 3)} |\n")
    write(args.out, f"wd_vs_wr_{args.network}-b{args.batch}-{args.dtype}-{args.layout}", doc, md)


if __name__ == "__main__":
    main()
