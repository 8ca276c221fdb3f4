"""Issue 6's benchmark: WR over legacy cuDNN + graph-API engines vs legacy alone vs PyTorch, side by side.

For each (dtype, layout, numerics) combination of a network's distinct conv
kernels (x 3 ops), in one process:

1. benchmark tables: legacy source, graph source (each timed: the
   benchmarking cost is reported), and their union;
2. plans at the per-kernel workspace limit: undivided legacy, WR legacy,
   undivided legacy+graph, WR legacy+graph;
3. every plan EXECUTED on the GPU (two passes, CUDA events, median);
4. PyTorch (cudnn.benchmark=True, unbounded workspace, allow_tf32 matching
   the numerics) on the same kernels;
5. pruning study (pure planning, from the same measurements): what timing
   only the top-k configurations by heuristic rank, or skipping the full
   timing of configurations dominated by a quick sample, would have cost in
   benchmarking time and in planned time.

    python benchmarks/graph_wr.py --network alexnet --batch 256 \
        --combos float32:NCHW:strict,float32:NCHW:tf32,float16:NHWC:strict --limit 64MiB --torch
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import md_header, provenance, write  # noqa: E402
from core_wr import distinct_kernels, execute_plan, torch_times  # noqa: E402


def by_source(table, sources):
    """The same table keeping only measurements of ``sources``."""
    from ucudnn.planning.table import BenchmarkTable, KernelBench

    keep = set(sources)
    ks = [KernelBench(k.name, k.op, k.problem, [m for m in k.measurements if m.source in keep], k.skipped,
                      k.benchmark_seconds) for k in table.kernels]
    return BenchmarkTable(table.device, table.cudnn_version, ks, table.numerics, dict(table.extra))


def union(a, b):
    """Per kernel, the measurements of both tables (same kernels, device, cuDNN, numerics)."""
    from ucudnn.planning.table import BenchmarkTable, KernelBench

    assert [k.name for k in a.kernels] == [k.name for k in b.kernels]
    ks = [KernelBench(x.name, x.op, x.problem, x.measurements + y.measurements, x.skipped + y.skipped,
                      (x.benchmark_seconds or 0) + (y.benchmark_seconds or 0)) for x, y in zip(a.kernels, b.kernels)]
    return BenchmarkTable(a.device, a.cudnn_version, ks, a.numerics, dict(a.extra))


def pruned(table, top_k=None, margin=None):
    """Graph measurements as a pruned benchmark would have left them, and its estimated cost (s).

    top_k: per (kernel, micro-batch) keep the k best-ranked graph configurations (rank = heuristic order;
    the source's top_k keeps the first k that build, which these are).  margin: a configuration whose quick
    sample is slower than another's (needing no more workspace) by the margin keeps its quick time, and its
    full timing is not paid.  Cost: the recorded build + timing wall time of what is kept.
    """
    from collections import defaultdict

    from ucudnn.planning.table import BenchmarkTable, KernelBench, Measurement

    kernels, cost = [], 0.0
    for k in table.kernels:
        groups = defaultdict(list)
        for m in k.measurements:
            if m.source == "graph":
                groups[m.micro_batch].append(m)
        keep = [m for m in k.measurements if m.source != "graph"]
        for mb, ms in groups.items():
            ms = sorted(ms, key=lambda m: m.extra.get("heuristic_rank", 0))
            if top_k is not None:
                ms = ms[:top_k]
            for m in ms:
                q = m.extra.get("quick_ms", m.time_ms)
                dominated = margin is not None and any(
                    o.extra.get("quick_ms", o.time_ms) * margin < q and o.workspace_bytes <= m.workspace_bytes
                    for o in ms if o is not m)
                if dominated:
                    keep.append(Measurement(m.micro_batch, m.algo, m.math_type, max(q, m.time_ms), m.workspace_bytes,
                                            m.source, m.engine, m.extra))
                    cost += (m.extra.get("build_ms", 0.0) + 2 * q) / 1e3
                else:
                    keep.append(m)
                    cost += m.extra.get("bench_ms", 0.0) / 1e3
        kernels.append(KernelBench(k.name, k.op, k.problem, keep, k.skipped, k.benchmark_seconds))
    return BenchmarkTable(table.device, table.cudnn_version, kernels, table.numerics, dict(table.extra)), cost


def by_kernel(kernels, source, args, numerics, deadline, log=False):
    """``source``'s table of ``kernels`` measured kernel by kernel (progress in the log, and a deadline), and the
    seconds it took."""
    import cupy as cp

    from ucudnn.measure.benchmarking import benchmark
    from ucudnn.planning.table import BenchmarkTable

    t0 = time.perf_counter()
    tables = []
    for i, k in enumerate(kernels):
        if time.perf_counter() > deadline:
            raise TimeoutError(f"deadline reached while benchmarking the {source.name} source "
                               f"({i}/{len(kernels)} kernels)")
        tk = time.perf_counter()
        tables.append(benchmark([k], args.batch_policy, numerics, sources=[source], repeat=args.repeat,
                                timing=args.timing))
        if log:
            print(f"   {source.name} {k.name}: {len(tables[-1].kernels[0].measurements)} measurements, "
                  f"{time.perf_counter() - tk:.1f} s", flush=True)
    cp.cuda.runtime.deviceSynchronize()
    return BenchmarkTable.merge(tables), time.perf_counter() - t0


def run_combo(args, net, dtype, layout, numerics, prov, out_dir, deadline):
    import cupy as cp

    from ucudnn import numerics as num
    from ucudnn.measure.benchmarking import Buffers, benchmark
    from ucudnn.measure.sources import registry
    from ucudnn.measure.sources.graph import GraphSource
    from ucudnn.planning.network import load_network
    from ucudnn.planning.planner import plan
    from ucudnn.units import parse_size

    numerics = num.normalize(numerics, dtype)
    kernels = distinct_kernels(load_network(net).kernels(args.batch, dtype, layout))
    tag = f"{net}-b{args.batch}-{dtype}-{layout}-{numerics}"
    print(f"== {tag}: {len(kernels)} kernels", flush=True)
    graph = GraphSource(top_k=args.graph_top_k, quick_margin=args.quick_margin)
    registry.register(graph)   # execution finds the instance holding the built plans
    t0 = time.perf_counter()
    legacy = benchmark(kernels, args.batch_policy, numerics, sources=["legacy"], repeat=args.repeat,
                       timing=args.timing)
    cp.cuda.runtime.deviceSynchronize()
    t_legacy = time.perf_counter() - t0
    print(f"   legacy table {t_legacy:.1f} s", flush=True)
    gtable, t_graph = by_kernel(kernels, graph, args, numerics, deadline, log=True)
    print(f"   graph table {t_graph:.1f} s; stats {graph.stats}", flush=True)
    both = union(legacy, gtable)
    gstats = dict(graph.stats)  # the relayout source below may run the same graph instance again
    t_relayout, relayed = None, None
    if args.relayout:  # the same kernels run in the other layout through ucudnn's transform kernels
        from ucudnn.measure.sources.relayout import RelayoutSource

        inner = [graph if n == "graph" else n for n in args.relayout.split(",")]
        relayout = RelayoutSource(inner)
        registry.register(relayout)
        rtable, t_relayout = by_kernel(kernels, relayout, args, numerics, deadline)
        relayed = union(both, rtable)
        print(f"   relayout ({args.relayout}) table {t_relayout:.1f} s", flush=True)
    t_fold, folded = None, None
    if args.fold:  # strided first layers run as stride-1 convolutions over folded channels (ucudnn's fold kernels)
        from ucudnn.measure.sources.fold import FoldSource

        names = args.fold.split(",")
        named = {"graph": graph}
        if "relayout" in names:   # the --relayout source, or one of the other sources named only for the fold
            if relayed is None:
                from ucudnn.measure.sources.relayout import RelayoutSource

                relayout = RelayoutSource([named.get(n, n) for n in names if n != "relayout"] or ["legacy"])
                registry.register(relayout)
            named["relayout"] = relayout
        fold = FoldSource([named.get(n, n) for n in names])
        registry.register(fold)
        ftable, t_fold = by_kernel(kernels, fold, args, numerics, deadline)
        folded = union(relayed if relayed is not None else both, ftable)
        print(f"   fold ({args.fold}) table {t_fold:.1f} s", flush=True)
    if args.tables_out:
        Path(args.tables_out).mkdir(parents=True, exist_ok=True)
        both.save(Path(args.tables_out) / f"{tag}-legacy-graph-h100.json.gz")
        if relayed is not None:
            relayed.save(Path(args.tables_out) / f"{tag}-legacy-graph-relayout-h100.json.gz")
        if folded is not None:
            folded.save(Path(args.tables_out) / f"{tag}-legacy-graph{'-relayout' if relayed else ''}-fold-h100.json.gz")

    bufs = {}
    for k in kernels:
        if k.problem not in bufs:
            bufs[k.problem] = Buffers(k.problem)
    lim = parse_size(args.limit)
    plans = [("undivided legacy", plan(legacy, "undivided", workspace_limit=lim)),
             ("WR legacy", plan(legacy, "wr", workspace_limit=lim, batch_policy=args.batch_policy)),
             ("undivided legacy+graph", plan(both, "undivided", workspace_limit=lim)),
             ("WR legacy+graph", plan(both, "wr", workspace_limit=lim, batch_policy=args.batch_policy))]
    if relayed is not None:
        plans.append((f"WR legacy+graph+relayout({args.relayout})",
                      plan(relayed, "wr", workspace_limit=lim, batch_policy=args.batch_policy)))
    if folded is not None:
        plans.append((f"WR legacy+graph{f'+relayout({args.relayout})' if relayed else ''}+fold({args.fold})",
                      plan(folded, "wr", workspace_limit=lim, batch_policy=args.batch_policy)))
    if args.batch_policy != "powerOfTwo":   # the same measurements planned with powerOfTwo's sizes only
        name, _ = plans[-1]
        last = folded if folded is not None else relayed if relayed is not None else both
        plans.append((f"{name} [powerOfTwo sizes]", plan(last, "wr", workspace_limit=lim, batch_policy="powerOfTwo")))
    passes = [[execute_plan(pl, bufs, args.exec_repeat) for _, pl in plans] for _ in range(2)]
    replays = [execute_plan(pl, bufs, args.exec_repeat, replay=True) for _, pl in plans] if args.replay else None
    rows = []
    for i, (name, pl) in enumerate(plans):
        per_pass = [sum(p[i].values()) for p in passes]
        measured = {k: min(p[i][k] for p in passes) for k in passes[0][i]}
        graph_share = sum(c.source == "graph" or "graph" in ((c.extra.get("via") or {}).get("source"),
                                                            (c.extra.get("fold") or {}).get("source"))
                          for kp in pl.kernels for c in kp.configs)
        relayout_share = sum(c.source == "relayout" for kp in pl.kernels for c in kp.configs)
        fold_share = sum(c.source == "fold" for kp in pl.kernels for c in kp.configs)
        rows.append({"plan": name, "predicted_ms": pl.total_time_ms, "measured_ms": sum(measured.values()),
                     "measured_passes_ms": per_pass,
                     "replayed_ms": sum(replays[i].values()) if replays else None, "workspace_bytes": pl.workspace_bytes,
                     "graph_micro_batches": graph_share, "relayout_micro_batches": relayout_share,
                     "fold_micro_batches": fold_share,
                     "micro_batches": sum(len(kp.configs) for kp in pl.kernels),
                     "kernels": {kp.name: {"predicted_ms": kp.time_ms, "measured_ms": measured[kp.name],
                                           "replayed_ms": replays[i][kp.name] if replays else None,
                                           "division": " + ".join(f"{c.micro_batch} {c.source}:{c.algo}/{c.math_type}"
                                                                  for c in kp.configs),
                                           "workspace_bytes": kp.workspace_bytes} for kp in pl.kernels}})
        print(f"   {name:<24} predicted {pl.total_time_ms:8.3f} ms  measured "
              + " / ".join(f"{t:8.3f}" for t in per_pass)
              + (f"  replayed {rows[-1]['replayed_ms']:8.3f}" if replays else ""), flush=True)
    torch_ms = tt = torch_replay_ms = ttr = None
    if args.torch:
        tt = torch_times(kernels, numerics, args.exec_repeat)
        torch_ms = sum(tt.values())
        print(f"   PyTorch {torch_ms:.3f} ms", flush=True)
        if args.replay:
            ttr = torch_times(kernels, numerics, args.exec_repeat, replay=True)
            torch_replay_ms = sum(ttr.values())
            print(f"   PyTorch replayed {torch_replay_ms:.3f} ms", flush=True)

    # pruning study: planned time of WR legacy+graph from pruned measurements, and what benchmarking would cost
    study = []
    full_graph_cost = sum(m.extra.get("bench_ms", 0.0) for k in gtable.kernels for m in k.measurements) / 1e3
    for top_k, margin in [(None, None), (1, None), (3, None), (5, None), (10, None), (None, 1.5), (5, 1.5)]:
        if args.graph_top_k is not None and top_k is not None and top_k >= args.graph_top_k:
            continue
        t, cost = pruned(both, top_k, margin)
        try:
            pt = plan(t, "wr", workspace_limit=lim, batch_policy=args.batch_policy).total_time_ms
        except Exception as e:  # noqa: BLE001 - a pruned table may lose feasibility
            pt = None
            print(f"   pruning top_k={top_k} margin={margin}: {e}", flush=True)
        study.append({"top_k": top_k, "quick_margin": margin, "planned_ms": pt, "graph_config_seconds": cost})
    best = study[0]["planned_ms"]
    doc = {"provenance": prov, "network": net, "batch": args.batch, "dtype": dtype, "layout": layout,
           "numerics": numerics, "kernels": len(kernels), "limit": args.limit, "batch_policy": args.batch_policy,
           "timing": args.timing,
           "graph_source": {"modes": list(graph.modes), "top_k": args.graph_top_k, "quick_margin": args.quick_margin,
                            "stats": gstats, "config_seconds": full_graph_cost},
           "benchmark_seconds": {"legacy": t_legacy, "graph": t_graph, "relayout": t_relayout,
                                 "fold": t_fold},
           "rows": rows, "torch_total_ms": torch_ms, "torch_kernels_ms": tt,
           "torch_replayed_total_ms": torch_replay_ms, "torch_replayed_kernels_ms": ttr, "pruning": study}
    title = f"WR legacy+graph vs legacy vs PyTorch, {tag}, {len(kernels)} kernels, {args.limit} per kernel"
    md = md_header(title, prov)
    md += (f"\nBenchmarking time: legacy {t_legacy:.1f} s, graph {t_graph:.1f} s "
           f"(heuristics {gstats['heuristics_s']:.1f} s, plan builds {gstats['build_s']:.1f} s, "
           f"note probes {gstats['probe_s']:.1f} s, timing {gstats['time_s']:.1f} s; "
           f"{int(gstats['configs_built'])} configurations built"
           + (f", top-k {args.graph_top_k}" if args.graph_top_k else "")
           + (f", quick margin {args.quick_margin}" if args.quick_margin else "") + ")"
           + (f"; relayout ({args.relayout}) {t_relayout:.1f} s" if t_relayout is not None else "")
           + (f"; fold ({args.fold}) {t_fold:.1f} s" if t_fold is not None else "") + "\n\n"
           f"Batch-size policy: `{args.batch_policy}`; configurations timed `{args.timing}`"
           + (" (captured into CUDA graphs and replayed: the plans are made for replay)" if args.timing == "replay"
              else "") + ".")
    rep = bool(replays)
    if rep:
        md += (" `replayed`: ucudnn's kernels run by `Executor(replay=True)` (each call captured into a CUDA graph "
               "once, then replayed), PyTorch's captured with `torch.cuda.graph` and replayed.")
    md += ("\n\n| plan | predicted ms | measured ms | pass 1 / pass 2 ms | graph micro-batches | vs PyTorch |"
           + (" replayed ms | vs PyTorch replayed |" if rep else "") + "\n|---|---:|---:|---:|---:|---:|"
           + ("---:|---:|" if rep else "") + "\n")
    for r in rows:
        vs = f"{torch_ms / r['measured_ms']:.2f}x" if torch_ms else "-"
        md += (f"| {r['plan']} | {r['predicted_ms']:.3f} | {r['measured_ms']:.3f} | "
               f"{r['measured_passes_ms'][0]:.2f} / {r['measured_passes_ms'][1]:.2f} | "
               f"{r['graph_micro_batches']}/{r['micro_batches']} | {vs} |")
        if rep:
            vr = f"{torch_replay_ms / r['replayed_ms']:.2f}x" if torch_replay_ms else "-"
            md += f" {r['replayed_ms']:.3f} | {vr} |"
        md += "\n"
    if torch_ms:
        md += (f"| PyTorch (cudnn.benchmark, unbounded workspace) | | {torch_ms:.3f} | | | 1.00x |"
               + (f" {torch_replay_ms:.3f} | 1.00x |" if rep and torch_replay_ms else " | |" if rep else "") + "\n")
    md += ("\nPruning (planned WR legacy+graph time from the same measurements; graph benchmarking cost = "
           "recorded build + timing time of the configurations kept):\n\n"
           "| pruning | planned ms | vs unpruned | graph config seconds |\n|---|---:|---:|---:|\n")
    for s in study:
        name = ("none" if s["top_k"] is None and s["quick_margin"] is None else
                " + ".join(x for x in (f"top-{s['top_k']}" if s["top_k"] else "",
                                       f"quick margin {s['quick_margin']}" if s["quick_margin"] else "") if x))
        pm = f"{s['planned_ms']:.3f}" if s["planned_ms"] is not None else "infeasible"
        rel = f"{s['planned_ms'] / best:.3f}" if s["planned_ms"] and best else "-"
        md += f"| {name} | {pm} | {rel} | {s['graph_config_seconds']:.1f} |\n"
    write(out_dir, f"graph_wr_{tag}", doc, md)
    return doc


def summarize(results: str) -> None:
    """One table of every graph_wr_*.json under ``results``: the issue's bar (WR legacy+graph vs PyTorch)."""
    import json

    docs = [json.loads(p.read_text()) for p in sorted(Path(results).glob("graph_wr_*.json"))
            if p.name != "graph_wr_summary.json"]
    docs = [d for d in docs if "network" in d and "torch_total_ms" in d]   # one combination each (not diagnoses)
    rows = []
    for d in docs:
        plans = {r["plan"]: r["measured_ms"] for r in d["rows"]}
        gs = d["graph_source"]
        rows.append({"network": d["network"], "batch": d["batch"], "dtype": d["dtype"], "layout": d["layout"],
                     "numerics": d["numerics"], "limit": d["limit"], "torch_ms": d["torch_total_ms"],
                     "plans_ms": plans, "benchmark_seconds": d["benchmark_seconds"],
                     "pruning": {"top_k": gs["top_k"], "quick_margin": gs["quick_margin"]},
                     "batch_policy": d.get("batch_policy", "powerOfTwo"), "timing": d.get("timing", "eager"),
                     "replayed_ms": {r["plan"]: r.get("replayed_ms") for r in d["rows"]},
                     "torch_replayed_ms": d.get("torch_replayed_total_ms"),
                     "date": d["provenance"]["date"], "device": d["provenance"].get("device")})
    md = ("# Graph-API engines: summary of graph_wr results\n\n"
          "Measured totals (ms, sum over a network's distinct conv kernels x 3 ops; each row from one run, side by "
          "side); a plan's measured time is, per kernel, the lower of two executed passes (each the median of timed "
          "samples); both passes' totals are in each combination's own file. Bar: WR legacy+graph at 64 MiB per "
          "kernel faster than PyTorch (cudnn.benchmark, unbounded workspace, same numerics). `timing`: how the "
          "plans' configurations were timed (eager: called from Python as an executor runs them; replay: captured "
          "into CUDA graphs, plans made for replay); `replayed`: ucudnn's plans run by `Executor(replay=True)` "
          "(each call captured into a CUDA graph once, then replayed), PyTorch's calls captured with "
          "`torch.cuda.graph` and replayed. Findings and caveats: graph_wr_notes.md.\n\n"
          "| network | dtype | layout | numerics | undivided legacy | WR legacy | WR legacy+graph | PyTorch | "
          "WR legacy+graph vs PyTorch | best WR with ucudnn's kernels as sources | vs PyTorch | benchmarking s "
          "(legacy + graph [+ relayout] [+ fold]) | graph pruning | batch policy, timing | best replayed vs PyTorch "
          "replayed |\n"
          "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|\n")
    for r in rows:
        p, t = r["plans_ms"], r["torch_ms"]
        own = [k for k in p if k.startswith("WR legacy+graph+")]   # plans with ucudnn's kernels as sources
        rk = min(own, key=p.get) if own else None
        replayed = min((v for v in r["replayed_ms"].values() if v), default=None)
        prune = ", ".join(x for x in (f"top-{r['pruning']['top_k']}" if r["pruning"]["top_k"] else "",
                                      f"quick margin {r['pruning']['quick_margin']}" if r["pruning"]["quick_margin"]
                                      else "") if x) or "none"
        md += (f"| {r['network']} b{r['batch']} | {r['dtype']} | {r['layout']} | {r['numerics']} | "
               f"{p['undivided legacy']:.2f} | {p['WR legacy']:.2f} | {p['WR legacy+graph']:.2f} | "
               f"{t:.2f} | {t / p['WR legacy+graph']:.2f}x | "
               + (f"{p[rk]:.2f} ({rk.removeprefix('WR legacy+graph+')}) | {t / p[rk]:.2f}x | " if rk else "- | - | ")
               + f"{r['benchmark_seconds']['legacy']:.0f} + {r['benchmark_seconds']['graph']:.0f}"
               + (f" + {r['benchmark_seconds']['relayout']:.0f}" if r['benchmark_seconds'].get('relayout') else "")
               + (f" + {r['benchmark_seconds']['fold']:.0f}" if r['benchmark_seconds'].get('fold') else "")
               + f" | {prune} | {r['batch_policy']}, {r['timing']} | "
               + (f"{replayed:.2f} vs {r['torch_replayed_ms']:.2f} ({r['torch_replayed_ms'] / replayed:.2f}x)"
                  if r["torch_replayed_ms"] and replayed else "-") + " |\n")
    write(results, "graph_wr_summary", {"rows": rows}, md)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--network", default="alexnet")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--combos", default="float32:NCHW:strict",
                    help="comma-separated dtype:layout:numerics, e.g. float32:NHWC:tf32,float16:NHWC:strict")
    ap.add_argument("--limit", default="64MiB", help="per-kernel workspace limit")
    ap.add_argument("--batch-policy", default="powerOfTwo")
    ap.add_argument("--repeat", type=int, default=3, help="timed samples per configuration while benchmarking")
    ap.add_argument("--timing", default="eager", choices=("eager", "replay"),
                    help="how configurations are timed while benchmarking (ucudnn.measure.benchmark's timing)")
    ap.add_argument("--exec-repeat", type=int, default=7)
    ap.add_argument("--graph-top-k", type=int, default=None)
    ap.add_argument("--quick-margin", type=float, default=None)
    ap.add_argument("--relayout", default=None, help="also measure these sources (e.g. legacy or legacy,graph) run "
                    "in the other layout through ucudnn's transform kernels, and plan with them")
    ap.add_argument("--fold", default=None, help="also measure these sources (e.g. legacy,graph or "
                    "legacy,graph,relayout) on strided first layers folded into stride-1 convolutions by ucudnn's fold "
                    "kernels, and plan with them; relayout there is --relayout's source, or without --relayout one "
                    "wrapping the other sources named, measured on the folded problems only")
    ap.add_argument("--torch", action="store_true")
    ap.add_argument("--replay", action="store_true", help="also time every plan run by Executor(replay=True), and "
                    "PyTorch captured once per kernel into a CUDA graph and replayed")
    ap.add_argument("--budget-s", type=float, default=1e9, help="start no new combination after this many seconds")
    ap.add_argument("--deadline-s", type=float, default=1e9, help="abandon a combination still benchmarking the "
                    "graph source after this many seconds (its results are not written)")
    ap.add_argument("--tables-out", default=None)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--summary", action="store_true", help="only summarize the graph_wr_*.json under --out (no GPU)")
    args = ap.parse_args()
    if args.summary:
        summarize(args.out)
        return

    prov = provenance()
    try:
        import cudnn as fe

        prov["cudnn_frontend"] = getattr(fe, "__version__", "?")
    except Exception as e:  # noqa: BLE001
        prov["cudnn_frontend"] = f"unavailable: {e}"
    start = time.perf_counter()
    budget, deadline = start + args.budget_s, start + args.deadline_s
    done = []
    for combo in args.combos.split(","):
        dtype, layout, numerics = combo.split(":")
        if time.perf_counter() > budget:
            print(f"== {combo}: not run (budget of {args.budget_s:.0f} s spent)", flush=True)
            continue
        try:
            done.append(run_combo(args, args.network, dtype, layout, numerics, prov, args.out, deadline))
        except TimeoutError as e:
            print(f"== {combo}: stopped: {e}", flush=True)
    print(f"total {time.perf_counter() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
