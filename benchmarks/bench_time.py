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

Where off and off2 both ran, each plan is also priced at the fastest of their timings per configuration
(``ucudnn.measure.pruning.fastest_of``: two unpruned runs' own plans differed by 31% at each other's times, from one
outlying median), and the plan bar is taken there; ``--reprice`` recomputes the prices from a finished run's tables
(no GPU).  ``--price-at`` prices each run's plan at a recorded unpruned table instead of (or as well as) an off run;
``--mode-major`` runs every combination's first mode before any second one, so a cap cuts the off runs.

Where the time goes (issue 16's fourth pass): each run also reports every source's own wall seconds (fold's inner
sources apart), cuDNN Find's, the graph source's host parts (heuristics, note probes, builds, timing; heuristics lists
asked in every mode or reused) and the overlap helper's (``ucudnn.measure.sources.overlap``); ``prev`` runs the
defaults before that pass, ``nooverlap`` / ``nowrapped`` / ``noprobe`` / ``noreuse`` the defaults without one of its
parts; ``--profile`` writes a cProfile summary per run; ``--heuristics-probe`` times the heuristics per mode.

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
           "split_margin": None, "confirm_factor": None, "repeat": 5, "min_sample_ms": 1.0}
    rules = {"off": off, "on": {}, "on2": {},   # on2: the defaults again (the run-to-run noise of the wall time)
             # the defaults before issue 16's fourth pass: split dominance not reaching fold's rows, no host work
             # overlapped with Find, numerical notes probed through lined-up heuristics lists
             "prev": {"split_wrapped": False, "overlap_cpu": False},
             # the fourth pass's parts one at a time (each: the defaults without it)
             "nooverlap": {"overlap_cpu": False}, "nowrapped": {"split_wrapped": False}, "noprobe": {},
             "noreuse": {},
             # the defaults with the graph source's heuristics in modes A and FALLBACK only (not B): a measurement of
             # what mode B's query costs and adds, not a rule
             "nob": {},
             # the defaults without split dominance: the defaults before it (issue 16's third pass)
             "nosplit": {"split_margin": None},
             # the defaults' rules with shorter timing: 3 samples of at least 0.5 ms instead of 5 of 1 ms
             "fast": {"repeat": 3, "min_sample_ms": 0.5},
             # off again: the run-to-run noise floor of "plan from one table, priced at another's timings"
             "off2": off}[mode]
    for s in srcs:   # prev / noprobe: notes through lined-up heuristics lists (the graph source's fast_probe off)
        if hasattr(s, "fast_probe"):
            s.fast_probe = mode not in ("prev", "noprobe")
        if hasattr(s, "reuse_lists"):   # prev / noreuse: every heuristic mode at every size
            s.reuse_lists = mode not in ("prev", "noreuse")
        if hasattr(s, "modes") and mode == "nob":
            s.modes = ("A", "FALLBACK")
    clock = _SourceClock(srcs)
    profile = None
    if os.environ.get("BENCH_TIME_PROFILE"):
        import cProfile

        profile = cProfile.Profile()
    cp.cuda.runtime.deviceSynchronize()
    t0 = time.perf_counter()
    if profile is not None:
        profile.enable()
    table = benchmark(kernels, "powerOfTwo", numerics, sources=srcs, **rules)
    cp.cuda.runtime.deviceSynchronize()
    wall = time.perf_counter() - t0
    if profile is not None:
        profile.disable()
        _dump_profile(profile, table_out.removesuffix(".json") + ".profile.txt", f"{net} {dtype} {sources} {mode}")
    clock.restore()
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
    from ucudnn.measure.sources.overlap import OVERLAP

    return {"wall_s": round(wall, 3), "planned_wr64_ms": round(p.total_time_ms, 4), "kernels": len(kernels),
            "source_stats": stats, "source_seconds": clock.summary(), "overlap": OVERLAP.stats.as_dict(),
            "sources": ",".join(names),
            "recorded_as": counts, "pruned_as": pruned, "not_sampled_split_dominated": not_sampled,
            "numerics": numerics, "layout": layout,
            "rules": {**{"prune_margin": defaults.prune_margin, "hopeless_factor": defaults.hopeless_factor,
                         "kernel_budget_s": defaults.kernel_budget_s, "trust_estimate_ms": defaults.trust_estimate_ms,
                         "split_margin": defaults.split_margin}, **rules}}


class _SourceClock:
    """Wall seconds per source's ``measure`` (exclusive of the sources it calls: fold's inner legacy / graph count as
    theirs, under ``fold>legacy`` / ``fold>graph``), per op and per micro-batch size, and of cuDNN Find calls."""

    def __init__(self, srcs):
        from ucudnn.binding import cudnn
        from ucudnn.measure.sources import registry

        self.total: dict[str, float] = {}
        self.by_size: dict[str, dict[int, float]] = {}
        self.by_op: dict[str, dict[str, float]] = {}
        self.find_s = 0.0
        self.finds = 0
        self._stack: list[list] = []
        self._patched: list[tuple[object, str, object]] = []
        seen = set()
        for src in list(srcs) + [registry.get(n) for n in ("legacy", "graph") if n in {s.name for s in srcs}]:
            if id(src) in seen:
                continue
            seen.add(id(src))
            self._patch(src, "measure", self._timed(src.name, src.measure))
        self._patch(cudnn, "find_algorithm_ex", self._find(cudnn.find_algorithm_ex))

    def _patch(self, obj, name, fn):
        self._patched.append((obj, name, obj.__dict__.get(name, None) if hasattr(obj, "__dict__") else None))
        setattr(obj, name, fn)

    def restore(self):
        for obj, name, old in reversed(self._patched):
            if old is None:
                try:
                    delattr(obj, name)
                except AttributeError:
                    pass
            else:
                setattr(obj, name, old)

    def _timed(self, name, fn):
        def measure(op, problem, *a, **kw):
            label = ">".join([f[0] for f in self._stack] + [name])
            frame = [name, 0.0]
            self._stack.append(frame)
            t0 = time.perf_counter()
            try:
                return fn(op, problem, *a, **kw)
            finally:
                dt = time.perf_counter() - t0
                self._stack.pop()
                if self._stack:
                    self._stack[-1][1] += dt
                own = dt - frame[1]
                self.total[label] = self.total.get(label, 0.0) + own
                sz = self.by_size.setdefault(label, {})
                sz[problem.n] = sz.get(problem.n, 0.0) + own
                bo = self.by_op.setdefault(label, {})
                bo[op] = bo.get(op, 0.0) + own
        return measure

    def _find(self, fn):
        def find(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.find_s += time.perf_counter() - t0
                self.finds += 1
        return find

    def summary(self) -> dict:
        return {"exclusive_s": {k: round(v, 3) for k, v in sorted(self.total.items())},
                "find_s": round(self.find_s, 3), "finds": self.finds,
                "by_size_s": {k: {str(b): round(t, 3) for b, t in sorted(v.items())} for k, v in self.by_size.items()},
                "by_op_s": {k: {o: round(t, 3) for o, t in v.items()} for k, v in self.by_op.items()}}


def _dump_profile(profile, path: str, title: str) -> None:
    import io
    import pstats

    buf = io.StringIO()
    st = pstats.Stats(profile, stream=buf)
    buf.write(f"### {title}: by cumulative time\n")
    st.sort_stats("cumulative").print_stats(45)
    buf.write(f"### {title}: by own time\n")
    st.sort_stats("tottime").print_stats(30)
    Path(path).write_text(buf.getvalue())


def heuristics_probe(out: str) -> None:
    """The graph source's heuristics query, per mode (A, B, FALLBACK, and all three as the source asks), on AlexNet
    b256's distinct kernels at every powerOfTwo size, FP32 strict NCHW and FP16 NHWC: seconds of the graph's
    construction and of each ``create_execution_plans``, and the configurations each list admits (numerics and
    workspace filters, distinct tags, buildable), to tell which modes the admitted top-k comes from."""
    from ucudnn import numerics as num
    from ucudnn.measure.sources import graph as G
    from ucudnn.planning.network import load_network
    from ucudnn.policy import micro_batch_sizes

    src = G.GraphSource()
    fe = src._frontend()
    rows = []
    for dtype in ("float32", "float16"):
        layout, numerics = LAYOUT[dtype]
        numerics = num.normalize(numerics, dtype)
        excluded = G.excluded_notes(numerics, dtype)
        for spec in distinct_kernels(load_network("alexnet").kernels(BATCH["alexnet"], dtype, layout)):
            for mb in micro_batch_sizes("powerOfTwo", spec.problem.n):
                problem = spec.problem.with_batch(mb)
                row = {"dtype": dtype, "kernel": spec.name, "mb": mb}
                for modes in (("A",), ("B",), ("FALLBACK",), ("A", "B", "FALLBACK"), ("A", "FALLBACK")):
                    t0 = time.perf_counter()
                    g = src.graph(spec.op, problem)
                    t1 = time.perf_counter()
                    try:
                        g.create_execution_plans([getattr(fe.heur_mode, m) for m in modes])
                    except Exception as e:  # noqa: BLE001
                        row["+".join(modes)] = {"error": str(e)[:100]}
                        continue
                    t2 = time.perf_counter()
                    if excluded:
                        g.deselect_numeric_notes([getattr(fe.numerical_note, n) for n in excluded])
                    g.deselect_workspace_greater_than(4 << 30)
                    tags, seen = [], set()
                    for i in range(g.get_execution_plan_count()):
                        tag = g.get_plan_name_at_index(i)
                        if tag in seen:
                            continue
                        seen.add(tag)
                        try:
                            g.build_plan_at_index(i)
                        except Exception:  # noqa: BLE001
                            continue
                        tags.append(tag)
                    row["+".join(modes)] = {"graph_s": round(t1 - t0, 5), "heur_s": round(t2 - t1, 5),
                                            "count": g.get_execution_plan_count(), "admitted": tags}
                if tags:   # what a probe graph of one engine costs (the graph source's fast note probe)
                    t0 = time.perf_counter()
                    try:
                        p = src.graph(spec.op, problem)
                        p.create_execution_plan(G.EngineIdentity.parse_tag(tags[0]).engine_id, {})
                        row["engine_graph_s"] = round(time.perf_counter() - t0, 5)
                    except Exception as e:  # noqa: BLE001
                        row["engine_graph_error"] = str(e)[:100]
                rows.append(row)
    Path(out).write_text(json.dumps(rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--networks", default="alexnet,resnet50")
    ap.add_argument("--dtypes", default="float32,float16")
    ap.add_argument("--sources", default="legacy;default", help="source sets separated by ';' (default: the "
                    "library's default sources, ucudnn.source_names.default_names, resolved on the GPU machine)")
    ap.add_argument("--modes", default="off,on", help="off (before: no pruning), on (after: the defaults), "
                    "fast (3 samples of 0.5 ms: the defaults since the second pass), off2 (off again: the noise floor of "
                    "mode@off), nosplit (the defaults without split dominance: the defaults before it), prev (the "
                    "defaults before the fourth pass: no split dominance on fold's rows, no host work overlapped with "
                    "Find, notes probed through lined-up heuristics lists, every heuristic mode at every size), "
                    "nooverlap / "
                    "nowrapped / noprobe / noreuse (the defaults without one of those), nob (heuristic modes A and "
                    "FALLBACK only: a measurement, not a rule)")
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
    ap.add_argument("--reprice", metavar="JSON", help="price a finished run's plans again from its tables (--tables), "
                    "writing bench_time-SUFFIX.{json,md}: no GPU")
    ap.add_argument("--one", help=argparse.SUPPRESS)         # net:dtype:sources:mode:table_path (child process)
    ap.add_argument("--profile", action="store_true", help="profile each run (cProfile) into "
                    "bench_time-SUFFIX.profile.txt beside the results (the profiler slows host-bound parts)")
    ap.add_argument("--heuristics-probe", metavar="JSON", help="time the graph source's heuristics per mode on "
                    "AlexNet's kernels (FP32 strict, FP16 NHWC) into JSON, instead of benchmarking")
    args = ap.parse_args()
    if args.heuristics_probe:
        heuristics_probe(args.heuristics_probe)
        return
    if args.profile:
        os.environ["BENCH_TIME_PROFILE"] = "1"
    if args.one:
        net, dtype, sources, mode, table_out = args.one.split(":", 4)
        print("RESULT " + json.dumps(one_run(net, dtype, sources, mode, table_out)), flush=True)
        return

    if args.reprice:   # prices again from a finished run's tables (e.g. one whose tables came back from the GPU)
        doc = json.loads(Path(args.reprice).read_text())
        refs = dict(x.split("=", 1) for x in args.price_at)
        for row in doc["rows"]:
            paths = {m: str(Path(args.tables) / f"{row['network']}-{row['dtype']}-"
                                                 f"{row['sources'].replace(',', '+')}-{m}.json") for m in row["runs"]}
            _prices(row, paths, refs.get(f"{row['network']}:{row['dtype']}:{row['sources']}"))
        doc["provenance"]["repriced"] = f"prices recomputed from the run's tables ({time.strftime('%Y-%m-%d')})"
        _save(args, doc["provenance"], doc["rows"])
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
        print(f"   {({k: v for k, v in res.items() if k != 'source_seconds'})}", flush=True)
        prof = Path(paths[mode].removesuffix(".json") + ".profile.txt")
        if prof.exists():
            name = "bench_time" + (f"-{args.suffix}" if args.suffix else "") + ".profile.txt"
            with open(Path(args.out) / name, "a") as f:
                f.write(prof.read_text() + "\n")
        row["runs"][mode] = res
        _prices(row, paths, refs.get(":".join(combo)))
        _save(args, prov, rows)
    _save(args, prov, rows)


def _prices(row: dict, paths: dict[str, str], reference: str | None) -> None:
    """Each run's plan priced at the off run's timings, at the fastest of the off and off2 runs' (where both ran:
    :func:`ucudnn.measure.pruning.fastest_of`, free of one run's outliers) and (``--price-at``) at a recorded unpruned
    table's."""
    for m in row["runs"]:
        if m != "off" and all("wall_s" in row["runs"].get(k, {}) for k in ("off", m)):
            row.setdefault("plan_at_off_times_ms", {})[m] = _price(paths[m], paths["off"])
    row["on_plan_at_off_times_ms"] = row.get("plan_at_off_times_ms", {}).get("on")
    if all("wall_s" in row["runs"].get(k, {}) for k in ("off", "off2")):
        from ucudnn.measure.pruning import fastest_of
        from ucudnn.planning.planner import plan
        from ucudnn.planning.table import BenchmarkTable

        fastest = fastest_of([BenchmarkTable.load(paths["off"]), BenchmarkTable.load(paths["off2"])])
        row["fastest_unpruned"] = {"of": ["off", "off2"], "planned_wr64_ms": round(
            plan(fastest, "wr", workspace_limit=64 * MiB).total_time_ms, 4)}
        row["plan_at_fastest_times_ms"] = {m: _price(paths[m], fastest) for m in row["runs"]
                                           if "wall_s" in row["runs"][m]}
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


def _price(on_path: str, off) -> float | None:
    """The ``on`` table's WR 64 MiB plan priced at the ``off`` table's full timings (a path or a table; None: a
    configuration the off run did not record, e.g. a graph engine one run offered and the other did not)."""
    from ucudnn.measure.pruning import true_time_ms
    from ucudnn.planning.planner import plan
    from ucudnn.planning.table import BenchmarkTable

    try:
        return round(true_time_ms(plan(BenchmarkTable.load(on_path), "wr", workspace_limit=64 * MiB),
                                  off if isinstance(off, BenchmarkTable) else BenchmarkTable.load(off)), 4)
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
             "`mode@fastest`: priced at the fastest of the off and off2 runs' timings per configuration (timing noise "
             "only adds time: `ucudnn.measure.pruning.fastest_of`), against that table's own plan; where both ran, "
             "the plan bar is taken there, free of one run's outliers.", "",
             "| network | dtype / layout / numerics | sources | mode | bench s off | bench s mode | bar | "
             "WR64 ms off | WR64 ms mode | mode@off | mode@fastest (its plan) | mode@ref (ref's plan) | plan bar | "
             "mode recorded as | split dominance |",
             "|---|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|---|---|---|"]
    for r in rows:
        off = r["runs"].get("off", {})

        def cell(run, key):
            return run.get(key, run.get("skipped") or ("error" if "error" in run else "-"))

        fastest_ms = (r.get("fastest_unpruned") or {}).get("planned_wr64_ms")
        for mode, on in r["runs"].items():
            if mode == "off" and not fastest_ms:
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
            at_fastest = (r.get("plan_at_fastest_times_ms") or {}).get(mode)
            fastest_s = f"{at_fastest} ({fastest_ms})" if at_fastest is not None else "-"
            plan_s = "-"
            if at_fastest is not None and fastest_ms:
                plan_s = f"{(at_fastest / fastest_ms - 1) * 100:+.2f}% (fastest): " + (
                    "ok" if at_fastest <= fastest_ms * (1 + PLAN_BAR) else "MISS")
            elif "planned_wr64_ms" in on and "planned_wr64_ms" in off:
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
                         f"{cell(off, 'planned_wr64_ms')} | {cell(on, 'planned_wr64_ms')} | {priced or '-'} | "
                         f"{fastest_s} | {ref_s} | "
                         f"{plan_s} | {counts} | {split_s} |")
    lines += _where_the_time_goes(rows)
    return "\n".join(lines)


def _where_the_time_goes(rows) -> list[str]:
    """Per run: each source's own wall seconds (fold's inner sources apart), Find's, the graph source's host parts,
    and the overlap helper's (jobs run ahead inside Find's windows, seconds the main thread waited for one)."""
    out = ["", "## Where the time goes (wall seconds, per run)", "",
           "Source seconds are exclusive (`fold>graph`: the graph source measuring fold's folded problems); Find: every "
           "cudnnFind call (inside legacy's seconds; with the overlap helper on, also the wait for the GIL when Find "
           "returns while a helper's frontend call holds it); graph heuristics / probe / build: host work of the graph "
           "source (wherever it ran: on the overlap helper it overlaps Find); lists: heuristics queries in every mode / "
           "in the cheap modes with the previous size's configurations carried; overlap: jobs run ahead / inline, their "
           "seconds, the main thread's wait for a job under way at a window's end, and the seconds of Find windows.", "",
           "| network | dtype | mode | wall s | legacy | graph | fold | fold>legacy | fold>graph | Find | "
           "graph heuristics | graph probe | graph build | graph timing | graph lists full / reused (carried) | "
           "overlap ahead/inline | overlap job s | overlap wait s | windows s |", "|---|---|---|" + "---:|" * 16]
    for r in rows:
        for mode, run in r["runs"].items():
            if "wall_s" not in run:
                continue
            ex = (run.get("source_seconds") or {}).get("exclusive_s", {})
            g = (run.get("source_stats") or {}).get("graph", {})
            ov = run.get("overlap") or {}

            def f(d, k):
                v = d.get(k)
                return "-" if v is None else f"{v:.2f}"

            out.append(f"| {r['network']} | {r['dtype']} | {mode} | {run['wall_s']:.2f} | {f(ex, 'legacy')} | "
                       f"{f(ex, 'graph')} | {f(ex, 'fold')} | {f(ex, 'fold>legacy')} | {f(ex, 'fold>graph')} | "
                       f"{f(run.get('source_seconds') or {}, 'find_s')} | {f(g, 'heuristics_s')} | {f(g, 'probe_s')} | "
                       f"{f(g, 'build_s')} | {f(g, 'time_s')} | {g.get('lists_full', '-')} / {g.get('lists_reused', '-')} "
                       f"({g.get('configs_carried', '-')}) | {ov.get('jobs_ahead', '-')}/{ov.get('jobs_inline', '-')} | "
                       f"{f(ov, 'job_s')} | {f(ov, 'wait_s')} | {f(ov, 'window_s')} |")
    return out


if __name__ == "__main__":
    main()
