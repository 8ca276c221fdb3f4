"""Issue 16: benchmarking wall time and planned WR time, pruning off (before) vs on (after), on the GPU.

For each network (AlexNet b256, ResNet-50 b128), data type (FP32 strict NCHW, FP16 NHWC with numerics
``default``), source set (``legacy``; ``default``: the library's default sources) and mode (``off``: every configuration re-timed in
full, as before issue 16; ``on``: the default fast-benchmarking rules), benchmark the network's distinct
kernels under ``powerOfTwo`` in a fresh process (so neither mode inherits the other's warm caches), then
plan WR at 64 MiB per kernel.  Reported per combination: wall seconds off/on, planned WR total off/on
(each from its own table), the ``on`` plan priced at the ``off`` table's full timings (the real cost of
pruning, free of run-to-run noise in the pruned rows), and how the ``on`` run recorded its rows.

Bars printed beside the numbers: AlexNet FP32 under 3 s and FP16 NHWC under 10 s with ``legacy``; with
the default sources under 3x those; planned totals within 1% of the unpruned plans.  A set naming ``graph``
needs ``nvidia-cudnn-frontend``: skipped with a note where it does not import.

``--price-at`` prices each run's plan at a recorded unpruned table instead of (or as well as) an off run;
``--mode-major`` runs every combination's first mode before any second one, so a cap cuts the off runs.

One GPU command may run at most 10 minutes: ``--time-cap`` (seconds, default 540) bounds the whole run
(a run that would pass it is cut and reported as such), and the flags restrict it, e.g.

    python benchmarks/bench_time.py --networks alexnet --dtypes float32 --sources legacy --time-cap 300

Writes ``--out``/``bench_time[-SUFFIX].json`` and ``.md`` (device, versions, command, date).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import md_header, provenance, write  # noqa: E402
from core_wr import distinct_kernels  # noqa: E402

MiB = 1 << 20
BATCH = {"alexnet": 256, "resnet50": 128}
LAYOUT = {"float32": ("NCHW", "strict"), "float16": ("NHWC", "default")}
#: Bars (seconds) with the legacy source; with more sources, 3x.
LEGACY_BAR_S = {("alexnet", "float32"): 3.0, ("alexnet", "float16"): 10.0}
PLAN_BAR = 0.01


def one_run(net: str, dtype: str, sources: str, mode: str, table_out: str) -> dict:
    """Benchmark one combination in this process; the parent reads the returned summary as JSON."""
    import cupy as cp

    from ucudnn import source_names
    from ucudnn.measure.benchmarking import benchmark, resolve_sources
    from ucudnn.measure.sources.base import BenchSettings
    from ucudnn.planning.network import load_network
    from ucudnn.planning.planner import plan

    layout, numerics = LAYOUT[dtype]
    names = source_names.canonical(None if sources == "default" else sources)
    if "graph" in names:
        from ucudnn.measure.sources.graph import GraphUnavailable, frontend

        try:
            frontend()
        except GraphUnavailable as e:
            return {"skipped": f"graph source unavailable: {e}"}
    srcs = resolve_sources(list(names))   # fresh instances: each run is a process of its own
    kernels = distinct_kernels(load_network(net).kernels(BATCH[net], dtype, layout))
    # off: the reference, as every configuration was timed before issue 16 (no rule, 5 samples of at least 1 ms)
    off = {"prune_margin": None, "hopeless_factor": None, "kernel_budget_s": None, "trust_estimate_ms": None,
           "split_margin": None, "repeat": 5, "min_sample_ms": 1.0}
    rules = {"off": off, "on": {},
             # the defaults without split dominance: the defaults before it (issue 16's third pass)
             "nosplit": {"split_margin": None},
             # the defaults' rules with shorter timing: 3 samples of at least 0.5 ms instead of 5 of 1 ms
             "fast": {"repeat": 3, "min_sample_ms": 0.5},
             # off again: the run-to-run noise floor of "plan from one table, priced at another's timings"
             "off2": off}[mode]
    cp.cuda.runtime.deviceSynchronize()
    t0 = time.perf_counter()
    table = benchmark(kernels, "powerOfTwo", numerics, sources=srcs, **rules)
    cp.cuda.runtime.deviceSynchronize()
    wall = time.perf_counter() - t0
    table.save(table_out)
    counts: dict[str, int] = {}
    pruned: dict[str, int] = {}
    not_sampled = 0
    for k in table.kernels:
        for m in k.measurements:
            how = str(m.extra.get("timed", m.extra.get("timing", "?")))
            counts[how] = counts.get(how, 0) + 1
            if "pruned" in m.extra:
                pruned[str(m.extra["pruned"])] = pruned.get(str(m.extra["pruned"]), 0) + 1
        not_sampled += sum(1 for x in k.skipped if x.reason.startswith("split-dominated"))
    p = plan(table, "wr", workspace_limit=64 * MiB)
    defaults = BenchSettings(numerics)
    stats = {s.name: {k: round(v, 3) for k, v in s.stats.items()} for s in srcs if isinstance(getattr(s, "stats", None), dict)}
    return {"wall_s": round(wall, 3), "planned_wr64_ms": round(p.total_time_ms, 4), "kernels": len(kernels),
            "source_stats": stats,
            "sources": ",".join(names),
            "recorded_as": counts, "pruned_as": pruned, "not_sampled_split_dominated": not_sampled,
            "numerics": numerics, "layout": layout,
            "rules": {**{"prune_margin": defaults.prune_margin, "hopeless_factor": defaults.hopeless_factor,
                         "kernel_budget_s": defaults.kernel_budget_s, "trust_estimate_ms": defaults.trust_estimate_ms,
                         "split_margin": defaults.split_margin}, **rules}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--networks", default="alexnet,resnet50")
    ap.add_argument("--dtypes", default="float32,float16")
    ap.add_argument("--sources", default="legacy;default", help="source sets separated by ';' (default: the "
                    "library's default sources, ucudnn.source_names.default_names, resolved on the GPU machine)")
    ap.add_argument("--modes", default="off,on", help="off (before: no pruning), on (after: the defaults), "
                    "fast (3 samples of 0.5 ms: the defaults since the second pass), off2 (off again: the noise floor of "
                    "mode@off), nosplit (the defaults without split dominance: the defaults before it)")
    ap.add_argument("--mode-major", action="store_true", help="run every combination's first mode, then every "
                    "combination's second, ...: a time cap then cuts the last modes (e.g. the off runs), not the last "
                    "combinations")
    ap.add_argument("--price-at", action="append", default=[], metavar="NET:DTYPE:SOURCES=TABLE",
                    help="also price each run's WR 64 MiB plan at this recorded unpruned table's timings (e.g. "
                    "alexnet:float32:default=tests/fixtures/alexnet-b256-float32-NCHW-strict-legacy-graph-fold-"
                    "unpruned-h100.json.gz, the off run of bench_time-alexnet-default): the planned-time cost without "
                    "running off again")
    ap.add_argument("--time-cap", type=float, default=540.0, help="seconds for the whole command")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--suffix", default="", help="bench_time-SUFFIX.{json,md}: keep several partial runs")
    ap.add_argument("--merge", help="comma-separated bench_time-*.json files: concatenate into bench_time.{json,md}")
    ap.add_argument("--tables", help="keep each run's benchmark table in this folder (default: a temporary one)")
    ap.add_argument("--one", help=argparse.SUPPRESS)         # net:dtype:sources:mode:table_path (child process)
    args = ap.parse_args()
    if args.one:
        net, dtype, sources, mode, table_out = args.one.split(":", 4)
        print("RESULT " + json.dumps(one_run(net, dtype, sources, mode, table_out)), flush=True)
        return

    if args.merge:
        docs = [json.loads(Path(f).read_text()) for f in args.merge.split(",")]
        prov = {**docs[0]["provenance"], "command": " ; ".join(d["provenance"]["command"] for d in docs),
                "date": " ; ".join(d["provenance"]["date"] for d in docs)}
        rows = [r for d in docs for r in d["rows"]]
        write(args.out, "bench_time", {"provenance": prov, "merged_from": args.merge.split(","), "rows": rows},
              markdown(prov, rows))
        return
    deadline = time.monotonic() + args.time_cap
    prov = provenance()
    prov["ucudnn"] = _version("ucudnn")
    prov["cudnn_frontend"] = _version("nvidia-cudnn-frontend")
    rows = []
    tmp = Path(args.tables) if args.tables else Path(tempfile.mkdtemp(prefix="bench_time_"))
    tmp.mkdir(parents=True, exist_ok=True)
    refs = dict(x.split("=", 1) for x in args.price_at)
    combos = [(net, dtype, sources) for net in args.networks.split(",") for dtype in args.dtypes.split(",")
              for sources in args.sources.split(";")]
    modes = args.modes.split(",")
    runs = [(c, m) for m in modes for c in combos] if args.mode_major else [(c, m) for c in combos for m in modes]
    by_combo: dict[tuple, dict] = {}
    tables: dict[tuple, dict[str, str]] = {}
    for (net, dtype, sources), mode in runs:
        combo = (net, dtype, sources)
        if combo not in by_combo:
            by_combo[combo] = {"network": net, "batch": BATCH[net], "dtype": dtype, "layout": LAYOUT[dtype][0],
                               "numerics": LAYOUT[dtype][1], "sources": sources, "runs": {}}
            rows.append(by_combo[combo])
        row, paths = by_combo[combo], tables.setdefault(combo, {})
        left = deadline - time.monotonic()
        if left < 10:
            row["runs"][mode] = {"skipped": "time cap reached before this run"}
            continue
        paths[mode] = str(tmp / f"{net}-{dtype}-{sources.replace(',', '+')}-{mode}.json")
        cmd = [sys.executable, __file__, "--one", f"{net}:{dtype}:{sources}:{mode}:{paths[mode]}"]
        print(f"== {net} {dtype} {sources} pruning {mode} (time left {left:.0f} s)", flush=True)
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=left, env=os.environ)
            res = next((json.loads(ln[7:]) for ln in done.stdout.splitlines() if ln.startswith("RESULT ")),
                       {"error": (done.stderr or done.stdout).strip().splitlines()[-3:]})
        except subprocess.TimeoutExpired:
            res = {"skipped": f"cut by the time cap after {left:.0f} s"}
        print(f"   {res}", flush=True)
        row["runs"][mode] = res
        _prices(row, paths, refs.get(":".join(combo)))
        _save(args, prov, rows)
    _save(args, prov, rows)


def _prices(row: dict, paths: dict[str, str], reference: str | None) -> None:
    """Each run's plan priced at the off run's timings and (``--price-at``) at a recorded unpruned table's."""
    for m in row["runs"]:
        if m != "off" and all("wall_s" in row["runs"].get(k, {}) for k in ("off", m)):
            row.setdefault("plan_at_off_times_ms", {})[m] = _price(paths[m], paths["off"])
    row["on_plan_at_off_times_ms"] = row.get("plan_at_off_times_ms", {}).get("on")
    if reference:
        from ucudnn.planning.planner import plan
        from ucudnn.planning.table import BenchmarkTable

        row["reference"] = {"table": reference, "planned_wr64_ms": round(
            plan(BenchmarkTable.load(reference), "wr", workspace_limit=64 * MiB).total_time_ms, 4)}
        row["plan_at_reference_times_ms"] = {m: _price(paths[m], reference) for m in row["runs"]
                                             if "wall_s" in row["runs"][m]}


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _price(on_path: str, off_path: str) -> float | None:
    """The ``on`` table's WR 64 MiB plan priced at the ``off`` table's full timings (None: a configuration the
    off run did not record, e.g. a graph engine one run offered and the other did not)."""
    from ucudnn.measure.pruning import true_time_ms
    from ucudnn.planning.planner import plan
    from ucudnn.planning.table import BenchmarkTable

    try:
        return round(true_time_ms(plan(BenchmarkTable.load(on_path), "wr", workspace_limit=64 * MiB),
                                  BenchmarkTable.load(off_path)), 4)
    except KeyError:
        return None


def _save(args, prov, rows) -> None:
    name = "bench_time" + (f"-{args.suffix}" if args.suffix else "")
    write(args.out, name, {"provenance": prov, "time_cap_s": args.time_cap, "rows": rows}, markdown(prov, rows))


def markdown(prov, rows) -> str:
    lines = [md_header("Benchmarking time, pruning off (before) vs on (after), and planned WR at 64 MiB", prov),
             f"- ucudnn `{prov.get('ucudnn')}`, nvidia-cudnn-frontend `{prov.get('cudnn_frontend')}`", "",
             "Each run in a fresh process; distinct kernels, `powerOfTwo`. Planned: WR 64 MiB per kernel, total ms, "
             "from each run's own table; `mode@off`: that mode's plan priced at the off table's full timings (`off2@off`: the "
             "same unpruned benchmark run twice, i.e. the noise floor of this comparison); `mode@ref`: priced at a recorded "
             "unpruned table's timings (`--price-at`), against that table's own plan. Plan bar: against off where it ran, "
             "else the reference. Split dominance: rows not sampled (left out, listed as skipped) and rows kept without "
             "a median (`pruned` split-dominated).", "",
             "| network | dtype / layout / numerics | sources | mode | bench s off | bench s mode | bar | "
             "WR64 ms off | WR64 ms mode | mode@off | mode@ref (ref's plan) | plan bar | mode recorded as | split dominance |",
             "|---|---|---|---|---:|---:|---|---:|---:|---:|---:|---|---|---|"]
    for r in rows:
        off = r["runs"].get("off", {})

        def cell(run, key):
            return run.get(key, run.get("skipped") or ("error" if "error" in run else "-"))

        for mode, on in r["runs"].items():
            if mode == "off":
                continue
            bar = LEGACY_BAR_S.get((r["network"], r["dtype"]))
            bar_s = "-"
            if bar is not None:
                bar = bar if r["sources"] == "legacy" else 3 * bar
                bar_s = (f"< {bar:g} s: " + ("ok" if on["wall_s"] < bar else "MISS")) if "wall_s" in on else f"< {bar:g} s"
            priced = (r.get("plan_at_off_times_ms") or {}).get(mode)
            if priced is None and mode == "on":
                priced = r.get("on_plan_at_off_times_ms")
            at_ref = (r.get("plan_at_reference_times_ms") or {}).get(mode)
            ref_ms = (r.get("reference") or {}).get("planned_wr64_ms")
            ref_s = f"{at_ref} ({ref_ms})" if at_ref is not None else "-"
            plan_s = "-"
            if "planned_wr64_ms" in on and "planned_wr64_ms" in off:
                ref = off["planned_wr64_ms"]
                got = priced or on["planned_wr64_ms"]
                plan_s = f"{(got / ref - 1) * 100:+.2f}%: " + ("ok" if got <= ref * (1 + PLAN_BAR) else "MISS")
            elif at_ref is not None and ref_ms:
                plan_s = f"{(at_ref / ref_ms - 1) * 100:+.2f}% (ref): " + ("ok" if at_ref <= ref_ms * (1 + PLAN_BAR)
                                                                           else "MISS")
            counts = ", ".join(f"{k} {v}" for k, v in sorted(on.get("recorded_as", {}).items()))
            split_s = (f"{on.get('not_sampled_split_dominated', 0)} not sampled, "
                       f"{on.get('pruned_as', {}).get('split-dominated', 0)} no median") if "wall_s" in on else "-"
            lines.append(f"| {r['network']} b{r['batch']} | {r['dtype']} / {r['layout']} / {r['numerics']} | "
                         f"{r['sources']} | {mode} | {cell(off, 'wall_s')} | {cell(on, 'wall_s')} | {bar_s} | "
                         f"{cell(off, 'planned_wr64_ms')} | {cell(on, 'planned_wr64_ms')} | {priced or '-'} | {ref_s} | "
                         f"{plan_s} | {counts} | {split_s} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
