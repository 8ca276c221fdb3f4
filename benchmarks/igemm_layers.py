"""Issue 17: the implicit-GEMM kernel (``direct-igemm``) per kernel of a network, whole micro-batch, no workspace,
every tile and form the source measures (``igemm.variants``: width x stages per buffer, and backward data's
scatter form where it is offered) and the fastest of them,
against cuDNN's fastest configuration that needs no workspace and its fastest within ``--limit`` (legacy + graph,
benchmarked alone, no pruning), side by side in one run.  Reports ms and TFLOPS (2 * MACs / time) of each.

    python benchmarks/igemm_layers.py --network alexnet --batch 256 --layout NHWC --limit 8MiB
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import md_header, provenance, write  # noqa: E402
from core_wr import distinct_kernels  # noqa: E402

MiB = 1 << 20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--network", default="alexnet")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--layout", default="NHWC")
    ap.add_argument("--limit", default="8MiB", help="cuDNN's workspace limit for the 'within the limit' column")
    ap.add_argument("--no-cudnn", action="store_true", help="time the kernel alone")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--suffix", default="")
    args = ap.parse_args()

    from ucudnn.binding.timing import time_ms
    from ucudnn.kernels import igemm
    from ucudnn.measure.benchmarking import Buffers, benchmark
    from ucudnn.planning.network import load_network
    from ucudnn.units import parse_size

    prov = provenance()
    limit = parse_size(args.limit)
    kernels = distinct_kernels(load_network(args.network).kernels(args.batch, "float32", args.layout))
    best: dict[tuple, dict] = {}
    if not args.no_cudnn:
        table = benchmark(kernels, "undivided", "strict", sources="legacy,graph", prune_margin=None,
                          hopeless_factor=None, kernel_budget_s=None, trust_estimate_ms=None, split_margin=None,
                          confirm_factor=None, progress=False)
        for k in table.kernels:
            rows = [m for m in k.measurements if m.micro_batch == args.batch]
            zero = [m for m in rows if m.workspace_bytes == 0]
            fit = [m for m in rows if m.workspace_bytes <= limit]
            best[(k.problem, k.op)] = {
                "zero": min(zero, key=lambda m: m.time_ms) if zero else None,
                "fit": min(fit, key=lambda m: m.time_ms) if fit else None}
    rows = []
    for k in kernels:
        p, op = k.problem, k.op
        row: dict = {"kernel": k.name, "op": op, "problem": p.describe(), "gflop": round(p.flops() / 1e9, 2)}
        why = igemm.refusal(op, p)
        if why:
            row["igemm"] = {"refused": why}
        else:
            buf = Buffers(p)
            ops = buf.operands(op, p.n)
            beta = 1.0 if op == "backward_filter" else 0.0
            times = {}
            for bn, ks, sc in igemm.variants(op, p):   # every tile and form the direct source measures
                run = igemm.launcher(op, p, bn=bn, ks=ks, scatter=sc)
                times[(bn, ks, sc)] = time_ms(lambda: run(ops.a, ops.b, ops.out, 1.0, beta), repeat=5, warmup=2,
                                              min_sample_ms=2.0)
            (bn, ks, sc), t = min(times.items(), key=lambda kv: kv[1])
            row["igemm"] = {"ms": round(t, 4), "tflops": round(p.flops() / t / 1e9, 2), "bn": bn, "ks": ks,
                            "scatter": sc, "splits": igemm.Gemm.of(op, p, bn, ks, sc).split(igemm.sm_count())[0],
                            "tiles_ms": {f"{b}x{k}{'-scatter' if c else ''}": round(v, 4)
                                         for (b, k, c), v in times.items()}}
            del buf
        for col in ("zero", "fit"):
            m = best.get((p, op), {}).get(col)
            if m is not None:
                row[col] = {"ms": round(m.time_ms, 4), "tflops": round(p.flops() / m.time_ms / 1e9, 2),
                            "config": f"{m.source}:{m.algo}/{m.math_type}",
                            "workspace_mib": round(m.workspace_bytes / MiB, 2)}
        mine = row["igemm"].get("ms")
        for col in ("zero", "fit"):
            if mine and col in row:
                row[f"vs_{col}"] = round(row[col]["ms"] / mine, 3)
        rows.append(row)
        print(row, flush=True)
    doc = {"provenance": prov, "network": args.network, "batch": args.batch, "layout": args.layout,
           "limit_bytes": limit, "cudnn": not args.no_cudnn, "rows": rows,
           "totals_ms": {c: round(sum(r[c]["ms"] for r in rows if c in r and "ms" in r[c]), 4)
                         for c in ("igemm", "zero", "fit")}}
    write(args.out, f"igemm_layers_{args.network}-b{args.batch}-{args.layout}{args.suffix}", doc, markdown(prov, doc))


def markdown(prov: dict, doc: dict) -> str:
    lim = doc["limit_bytes"] // MiB
    lines = [md_header(f"Implicit-GEMM kernel per kernel: {doc['network']} b{doc['batch']} float32 {doc['layout']} "
                       "strict", prov), "",
             "Whole batch, one call each. igemm: no workspace, the fastest of the tiles the source measures "
             "(width x stages per buffer; 'scatter': backward data's scatter form). " + (f"cuDNN (legacy + graph, FMA only): its fastest with no workspace and "
                                                f"its fastest within {lim} MiB, at the whole batch. "
                                                if doc.get("cudnn", True) else "cuDNN: not measured (--no-cudnn). ")
             + f"Totals (ms): {doc['totals_ms']}.", "",
             f"| kernel | GFLOP | igemm ms (TFLOPS) | cuDNN 0 MiB ms (TFLOPS) | cuDNN <= {lim} MiB ms (TFLOPS, config) | "
             f"igemm vs 0 MiB | igemm vs <= {lim} MiB |", "|---|---:|---:|---:|---|---:|---:|"]

    def cell(v):
        if v is None:
            return "-"
        tile = f", tile {v['bn']}x{v['ks']}{' scatter' if v.get('scatter') else ''}" if "bn" in v else ""
        return v.get("refused") or f"{v['ms']} ({v['tflops']}{tile})"

    for r in doc["rows"]:
        fit = r.get("fit")
        fit_s = "-" if fit is None else f"{fit['ms']} ({fit['tflops']}, {fit['config']}, {fit['workspace_mib']} MiB)"
        lines.append(f"| {r['kernel']} | {r['gflop']} | {cell(r['igemm'])} | {cell(r.get('zero'))} | {fit_s} | "
                     f"{r.get('vs_zero', '-')} | {r.get('vs_fit', '-')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
