"""Issue 16: what each fast-benchmarking rule costs in planned time, on the recorded tables (CPU only).

For every shipped real table (``ucudnn/data/tables``), recorded fixture (``tests/fixtures``) and unpruned
``bench_time.py`` off-run table (``benchmarks/results/bench_time-tables``: AlexNet FP16 NHWC and ResNet-50 with the
default sources, ResNet-50 with legacy), replay
each rule with :func:`ucudnn.measure.pruning.simulate` — what it would have pruned and recorded — then
plan WR at 8, 64 and 256 MiB per kernel and WD at 64 MiB x #kernels from the pruned table, and price each
plan at the recorded (fully re-timed) times.  The cost of a rule is that price over the unpruned plan's.

Two estimates of what a rule sees before re-timing: ``recorded`` (Find's own time ``find_time_ms``,
the graph source's ``quick_ms``, where the table kept them; the recorded time otherwise) and
``exact`` (the recorded time: Find as if it were exact).  The budget is spent by a model of the
re-timing cost (:func:`ucudnn.measure.pruning.retime_cost_ms`), also reported (GPU seconds, modelled), as
is the graph source's quick-sample time (:func:`ucudnn.measure.pruning.quick_cost_ms`), which split
dominance saves.  Bar: every plan within 1% of the unpruned one.

    python benchmarks/pruning_cost.py [--out benchmarks/results] [--no-wd]
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import md_header, provenance, write  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20
LIMITS = (8 * MiB, 64 * MiB, 256 * MiB)
WD_PER_KERNEL = 64 * MiB
BAR = 0.01


#: The rule that is not a timing setting: fold measures the NCHW fold only where the math is FMA only
#: (``ucudnn.measure.sources.fold.fold_layouts``, issue 16's fifth pass), replayed by dropping those rows.
FOLD_LAYOUTS = "fold layouts (NCHW only where FMA only)"


def rules():
    """(name, settings, fold's default layouts) triples: each rule alone at its default, all together, the
    margin's sensitivity."""
    from ucudnn.measure.sources.base import BenchSettings

    d = BenchSettings("strict")
    off = BenchSettings.unpruned("strict")
    out = [(FOLD_LAYOUTS, off),
           ("dominance", replace(off, prune_margin=d.prune_margin)),
           ("early-stop", replace(off, hopeless_factor=d.hopeless_factor)),
           ("budget", replace(off, kernel_budget_s=d.kernel_budget_s)),
           ("split dominance", replace(off, split_margin=d.split_margin)),
           ("all (defaults)", d),
           ("all but split dominance (the defaults before it)", replace(d, split_margin=None)),
           ("all but split dominance on fold's rows (the defaults before issue 16's fourth pass)",
            replace(d, split_wrapped=False)),
           ("split dominance, not on fold's rows", replace(off, split_margin=d.split_margin, split_wrapped=False))]
    out += [(f"dominance margin {m}", replace(off, prune_margin=m)) for m in (1.1, 1.25, 1.5, 3.0)]
    out += [(f"early-stop k={k}", replace(off, hopeless_factor=k)) for k in (1.5, 2.0)]
    out += [("budget 0.1 s (tight)", replace(off, kernel_budget_s=0.1))]
    out += [(f"long calls >= {t} ms", replace(off, trust_estimate_ms=t)) for t in (1.0, 2.0, 5.0)]
    out += [(f"split margin {m}", replace(off, split_margin=m)) for m in (1.0, 1.25, 2.0)]
    out += [("defaults before issue 16's second pass (margin 2, early stop 4x, no trust)",
             replace(d, prune_margin=2.0, hopeless_factor=4.0, trust_estimate_ms=None, split_margin=None, repeat=5,
                     min_sample_ms=1.0))]
    return [(name, s, name in (FOLD_LAYOUTS, "all (defaults)")) for name, s in out]


def tables() -> list[tuple[str, str]]:
    from ucudnn.planning.table import builtin_tables

    out = [(f"builtin:{n}", f"builtin:{n}") for n in builtin_tables()]
    out += [(p.name.removesuffix(".json.gz").removesuffix(".json"), str(p))
            for p in sorted((ROOT / "tests" / "fixtures").glob("*.json*"))]
    out += [("bench_time off " + p.name.removesuffix(".json.gz"), str(p))
            for p in sorted((ROOT / "benchmarks" / "results" / "bench_time-tables").glob("*-off.json.gz"))]
    return out


def plans(table, policy: str, wd: bool):
    from ucudnn.planning.planner import plan

    out = {}
    for limit in LIMITS:
        try:
            out[f"WR {limit // MiB} MiB"] = plan(table, "wr", workspace_limit=limit, batch_policy=policy)
        except Exception as e:  # noqa: BLE001 - an infeasible limit is reported, not fatal
            out[f"WR {limit // MiB} MiB"] = e
    key = f"WD {WD_PER_KERNEL // MiB} MiB x kernels"
    out[key] = None
    if wd:
        try:
            out[key] = plan(table, "wd", total_workspace=WD_PER_KERNEL * len(table.kernels), batch_policy=policy)
        except Exception as e:  # noqa: BLE001
            out[key] = e
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--no-wd", action="store_true", help="plan WR only (WD's ILP is the slow part)")
    ap.add_argument("--tables", default="", help="comma-separated substrings: only tables whose name has one")
    args = ap.parse_args()

    from ucudnn.measure.pruning import ESTIMATES, default_fold_rows, simulate, true_time_ms
    from ucudnn.planning.table import BenchmarkTable

    rows = []
    t_start = time.perf_counter()
    wanted = [s for s in args.tables.split(",") if s]
    for name, path in tables():
        if wanted and not any(w in name for w in wanted):
            continue
        table = BenchmarkTable.load(path)
        policy = table.extra.get("batch_policy", "powerOfTwo")
        wd = not args.no_wd and policy != "all"   # WD over 256 sizes x 15 kernels: minutes of ILP, skipped
        ref = plans(table, policy, wd)
        ref_ms = {k: (true_time_ms(p, table) if p is not None and not isinstance(p, Exception) else None)
                  for k, p in ref.items()}
        for rule, s, fold_default in rules():
            base = default_fold_rows(table) if fold_default else table
            for est in ESTIMATES:
                sim = simulate(base, replace(s, numerics=table.numerics or "strict"), est, policy)
                got = plans(sim.table, policy, wd)
                cost = {}
                for k, p in got.items():
                    if p is None or ref_ms.get(k) is None or isinstance(p, Exception):
                        cost[k] = None if p is None or ref_ms.get(k) is None else "infeasible"
                        continue
                    cost[k] = true_time_ms(p, table) / ref_ms[k] - 1
                counts = dict(sim.counts)
                if fold_default:
                    counts["fold layout not measured"] = (sum(len(k.measurements) for k in table.kernels)
                                                                 - sum(len(k.measurements) for k in base.kernels))
                rows.append({"table": name, "rule": rule, "estimate": est, "counts": counts,
                             "retime_s": round(sim.retime_ms / 1e3, 3),
                             "retime_s_unpruned": round(sim.retime_ms_unpruned / 1e3, 3),
                             "quick_s": round(sim.quick_ms / 1e3, 3),
                             "quick_s_unpruned": round(sim.quick_ms_unpruned / 1e3, 3),
                             "reference_ms": {k: (round(v, 4) if v is not None else None) for k, v in ref_ms.items()},
                             "cost": {k: (round(v, 6) if isinstance(v, float) else v) for k, v in cost.items()}})
                print(f"{name[:48]:48} {rule:24} {est:8} " + " ".join(
                    f"{k}={v * 100:+.2f}%" if isinstance(v, float) else f"{k}={v}" for k, v in cost.items()),
                    flush=True)
    prov = provenance()
    doc = {"provenance": prov, "bar": BAR, "limits_mib": [m // MiB for m in LIMITS], "wd_per_kernel_mib": WD_PER_KERNEL // MiB,
           "seconds": round(time.perf_counter() - t_start, 1), "rows": rows}
    write(args.out, "pruning_cost", doc, markdown(doc))


def markdown(doc) -> str:
    rows = doc["rows"]
    lines = [md_header("Fast benchmarking: what each pruning rule costs in planned time (recorded tables)",
                       doc["provenance"]),
             "Each rule is replayed on a recorded table (`ucudnn.measure.pruning.simulate`); WR at 8/64/256 MiB per "
             f"kernel and WD at {doc['wd_per_kernel_mib']} MiB x #kernels are planned from the pruned table and priced "
             "at the recorded full times. Cost = that price over the unpruned plan's, worst over the plans. "
             "`recorded`: the rules see Find's own time / the quick sample; `exact`: the recorded time. "
             "Re-timing and quick-sample seconds are modelled GPU time (`retime_cost_ms`, `quick_cost_ms`: the graph "
             "source's own rows), not measured; `split-skipped`: graph rows split dominance leaves unsampled (not in "
             "the table). "
             f"Bar: within {doc['bar'] * 100:.0f}%.", ""]
    worst_by_rule: dict[str, float] = {}
    for r in rows:
        vals = [v for v in r["cost"].values() if isinstance(v, float)]
        bad = [k for k, v in r["cost"].items() if v == "infeasible"]
        w = max(vals, default=0.0) if not bad else float("inf")
        worst_by_rule[r["rule"] + " / " + r["estimate"]] = max(worst_by_rule.get(r["rule"] + " / " + r["estimate"], 0.0), w)
    lines += ["## Worst cost per rule over all tables and plans", "", "| rule / estimate | worst cost | bar |", "|---|---:|---|"]
    for k, w in worst_by_rule.items():
        lines.append(f"| {k} | {w * 100:+.3f}% | {'ok' if w <= doc['bar'] else 'MISS'} |")
    split_rows = {(r["table"], r["rule"]): r for r in rows if r["estimate"] == "recorded"}
    without, with_ = "all but split dominance (the defaults before it)", "all (defaults)"
    lines += ["", "## Split dominance: the defaults without and with it (estimate `recorded`)", "",
              "| table | graph quick samples s (modelled) | re-timing s (modelled) | not sampled (split-skipped) | "
              "no median (split-dominated) | worst cost without | worst cost with |", "|---|---:|---:|---:|---:|---:|---:|"]

    def worst(r) -> str:
        vals = [v for v in r["cost"].values() if isinstance(v, float)]
        return "infeasible" if "infeasible" in r["cost"].values() else f"{max(vals, default=0.0) * 100:+.3f}%"

    for (table, rule), a in split_rows.items():
        b = split_rows.get((table, with_))
        if rule != without or b is None:
            continue
        lines.append(f"| {table} | {a['quick_s']} -> {b['quick_s']} | {a['retime_s']} -> {b['retime_s']} | "
                     f"{b['counts'].get('split-skipped', 0)} | {b['counts'].get('split-dominated', 0)} | {worst(a)} | "
                     f"{worst(b)} |")
    before4 = "all but split dominance on fold's rows (the defaults before issue 16's fourth pass)"
    lines += ["", "## Split dominance on fold's rows (issue 16's fourth pass): the defaults without and with it", "",
              "Fold rows (and their inner graph configurations) weighed against the kernel's own rows at their size "
              "(`BenchSettings.split_wrapped`). Modelled: the wrapped timing, and the inner graph source's skip by its "
              "time at a smaller size; the inner sources' own re-timing is not in the tables.", "",
              "| table | re-timing s (modelled) | split-skipped | split-dominated | worst cost without | worst cost with "
              "(exact) | worst cost with (recorded) |", "|---|---:|---:|---:|---:|---:|---:|"]
    exact_rows = {(r["table"], r["rule"]): r for r in rows if r["estimate"] == "exact"}
    for (table, rule), a in split_rows.items():
        b = split_rows.get((table, with_))
        e = exact_rows.get((table, with_))
        if rule != before4 or b is None or e is None:
            continue
        lines.append(f"| {table} | {a['retime_s']} -> {b['retime_s']} | {a['counts'].get('split-skipped', 0)} -> "
                     f"{b['counts'].get('split-skipped', 0)} | {a['counts'].get('split-dominated', 0)} -> "
                     f"{b['counts'].get('split-dominated', 0)} | {worst(a)} | {worst(e)} | {worst(b)} |")
    lines += ["", "## Per table (estimate `recorded`)", "",
              "| table | rule | recorded as (count) | re-timing s (modelled) | graph quick samples s (modelled) | "
              + " | ".join(next(iter(rows))["cost"].keys() if rows else []) + " |", "|---|---|---|---:|---:|" + "---:|" * 4]
    for r in rows:
        if r["estimate"] != "recorded":
            continue
        counts = ", ".join(f"{k} {v}" for k, v in sorted(r["counts"].items()))
        costs = " | ".join(f"{v * 100:+.2f}%" if isinstance(v, float) else str(v or "-") for v in r["cost"].values())
        quick = f"{r['quick_s']} of {r['quick_s_unpruned']}" if r.get("quick_s_unpruned") else "-"
        lines.append(f"| {r['table']} | {r['rule']} | {counts} | {r['retime_s']} of {r['retime_s_unpruned']} | {quick} "
                     f"| {costs} |")
    lines += ["", f"Run time: {doc['seconds']} s."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
