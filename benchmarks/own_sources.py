"""Issue 17: WR with and without ucudnn's own algorithm sources (``mec``, ``direct``), executed, side by side.

One benchmark of a network's distinct kernels with every source named in ``--with`` (default
``legacy,graph,mec,direct``); the "without" table is the same table restricted to ``--without``'s sources
(default ``legacy,graph``), so both plans are made from the same measurements.  For each workspace limit per
kernel (default 0, 8, 64 and 256 MiB) both WR plans are executed on the GPU (median of event-timed runs) and
reported with the planned time, the speed-up, and which configurations of the new sources each plan uses.
Bars (issue 17): AlexNet b256 FP32 strict, WR at 8 MiB with the new sources at least 1.5x faster than without;
never slower at any limit (executed, so within the run's noise).

    python benchmarks/own_sources.py --network alexnet --batch 256 --dtype float32 --layout NHWC
    python benchmarks/own_sources.py --network alexnet --layout NCHW --with legacy,graph,mec,direct,relayout \
        --without legacy,graph,relayout      # NCHW: mec and direct run through relayout's transforms
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import md_header, provenance, write  # noqa: E402
from core_wr import distinct_kernels, execute_plan  # noqa: E402

MiB = 1 << 20


def chain(m) -> list[str]:
    """The sources a row runs through: its own, then for a wrapper (relayout, fold) the one it wraps, and so on
    (each wrapper records its inner source under its own name in ``extra``; legacy when unnamed)."""
    from ucudnn.source_names import WRAPPERS

    names = [m.source]
    while names[-1] in WRAPPERS and len(names) <= len(WRAPPERS):
        names.append((m.extra.get(names[-1]) or {}).get("source", "legacy"))
    return names


def source_variant(spec: str):
    """``source:variant[:op]`` naming one of a source's optional configuration variants (the winograd source's
    ``slices``, ``streams``, ``groups``, ``ksplit``: :func:`ucudnn.measure.sources.winograd.variants`), of every
    op or of ``op`` only (``winograd:groups:forward``): a keep(kernel, measurement) predicate leaving out the rows
    that run it; None for any other spec (a source, or ``source:op``).  One spelling for ``channel_wr.py
    --without`` and ``table_ablation.py --drop``."""
    from ucudnn.measure.sources.winograd import variants

    source, _, rest = spec.partition(":")
    name, _, op = rest.partition(":")
    read = variants().get(name) if source == "winograd" else None
    return None if read is None else (lambda k, m: read(m) == 1 or (bool(op) and k.op != op))


def restricted(table, sources: set[str]):
    """``table`` with only the rows every source of whose :func:`chain` is in ``sources`` (so "without mec"
    also drops relayout's and fold's rows that run mec inside)."""
    kept = table.filtered(lambda k, m: set(chain(m)) <= sources)
    kept.extra["sources"] = [s for s in table.extra.get("sources", []) if s in sources]
    return kept


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--network", default="alexnet")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--layout", default="NHWC")
    ap.add_argument("--numerics", default=None)
    ap.add_argument("--with", dest="with_", default="legacy,graph,mec,direct")
    ap.add_argument("--without", default="legacy,graph")
    ap.add_argument("--limits", default="0,8MiB,64MiB,256MiB")
    ap.add_argument("--policy", default="powerOfTwo", help="micro-batch policy of the benchmark and the plans "
                    "(e.g. powerOfTwoAndMidpoints: sizes between the powers of two that a tight limit may allow)")
    ap.add_argument("--exec-repeat", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--table-out", default=None)
    args = ap.parse_args()

    import cupy as cp

    from ucudnn import numerics as num
    from ucudnn.errors import UcudnnError
    from ucudnn.measure.benchmarking import Buffers, benchmark
    from ucudnn.planning.network import load_network
    from ucudnn.planning.planner import plan
    from ucudnn.units import parse_size

    prov = provenance()
    kernels = distinct_kernels(load_network(args.network).kernels(args.batch, args.dtype, args.layout))
    numerics = num.normalize(args.numerics, args.dtype)
    t0 = time.perf_counter()
    table = benchmark(kernels, args.policy, numerics, sources=args.with_)
    cp.cuda.runtime.deviceSynchronize()
    bench_s = time.perf_counter() - t0
    if args.table_out:
        table.save(args.table_out)
    new = set(args.with_.split(",")) - set(args.without.split(","))
    tables = {"with": table, "without": restricted(table, set(args.without.split(",")))}
    bufs = {k.problem: Buffers(k.problem) for k in kernels}
    rows = []
    for lim_text in args.limits.split(","):
        limit = parse_size(lim_text)
        row = {"limit_bytes": limit}
        for name, t in tables.items():
            try:
                p = plan(t, "wr", workspace_limit=limit, batch_policy=args.policy)
            except UcudnnError as e:
                row[name] = {"error": str(e)}
                continue
            times = execute_plan(p, bufs, args.exec_repeat)
            uses = sorted({f"{c.source}:{c.algo}" for kp in p.kernels for c in kp.configs if c.source in new})
            row[name] = {"planned_ms": round(p.total_time_ms, 4), "executed_ms": round(sum(times.values()), 4),
                         "per_kernel_ms": {k: round(v, 4) for k, v in times.items()},
                         "planned_per_kernel_ms": {kp.name: round(kp.time_ms, 4) for kp in p.kernels},
                         "new_source_configs": uses}
        w, wo = row.get("with", {}), row.get("without", {})
        if "executed_ms" in w and "executed_ms" in wo:
            row["speedup"] = round(wo["executed_ms"] / w["executed_ms"], 3)
        rows.append(row)
        print(f"{lim_text}: {row.get('speedup')} with {w.get('executed_ms')} without {wo.get('executed_ms')} "
              f"{w.get('new_source_configs')}", flush=True)
    counts: dict[str, int] = {}
    for k in table.kernels:
        for m in k.measurements:
            counts[m.source] = counts.get(m.source, 0) + 1
    doc = {"provenance": prov, "network": args.network, "batch": args.batch, "dtype": args.dtype,
           "layout": args.layout, "numerics": numerics, "with": args.with_, "without": args.without,
           "benchmark_s": round(bench_s, 2), "rows_per_source": counts,
           "skipped_new_sources": sorted({f"{k.name}: {s.reason}" for k in table.kernels for s in k.skipped
                                          if any(n in s.reason for n in new)})[:40],
           "rows": rows}
    tag = f"own_sources_{args.network}-b{args.batch}-{args.dtype}-{args.layout}-{numerics}"
    if args.policy != "powerOfTwo":
        tag += f"-{args.policy}"
    write(args.out, tag, doc, markdown(prov, doc))


def markdown(prov: dict, doc: dict) -> str:
    lines = [md_header(f"WR with and without {doc['with']} vs {doc['without']}: {doc['network']} b{doc['batch']} "
                       f"{doc['dtype']} {doc['layout']} {doc['numerics']}", prov), "",
             f"One benchmark with every source ({doc['benchmark_s']} s; rows per source {doc['rows_per_source']}); "
             "the plan without the new sources is made from the same table restricted to the old ones.  Executed: "
             "median of event-timed runs of each kernel's plan, summed.", "",
             "| limit / kernel | without: planned ms | without: executed ms | with: planned ms | with: executed ms | "
             "speed-up (executed) | new-source configurations used |", "|---|---:|---:|---:|---:|---:|---|"]
    for r in doc["rows"]:
        w, wo = r.get("with", {}), r.get("without", {})
        lim = f"{r['limit_bytes'] // MiB} MiB"
        lines.append(f"| {lim} | {wo.get('planned_ms', wo.get('error', '-'))} | {wo.get('executed_ms', '-')} | "
                     f"{w.get('planned_ms', w.get('error', '-'))} | {w.get('executed_ms', '-')} | "
                     f"{r.get('speedup', '-')} | {', '.join(w.get('new_source_configs', [])) or '-'} |")
    lines += ["", "Bars: 8 MiB speed-up >= 1.5 (AlexNet b256 FP32 strict); never below 1 at any limit beyond noise."]
    if doc["skipped_new_sources"]:
        lines += ["", "New sources declined (first reasons):", ""] + [f"- {s}" for s in doc["skipped_new_sources"][:12]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
