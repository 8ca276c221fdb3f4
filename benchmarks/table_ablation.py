"""What a source (or one op of it) is worth in a recorded table: WR planned at each limit from the whole table and
from the same table without that source's rows (CPU only: planning is pure Python, the times are the table's).

A planned total is a prediction from measurements, not an execution: the executed totals of the same plans are in
the benchmark's own report (e.g. ``channel_wr_*.md``).  Use it to see which part of a source the plans rely on.

    python benchmarks/table_ablation.py --table benchmarks/results/X.table.json.gz --drop winograd:backward_filter \\
        --drop winograd --limits 64MiB,4GiB
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import md_header, provenance, write  # noqa: E402
from own_sources import chain  # noqa: E402


def dropper(spec: str):
    """``source`` or ``source:op``: a keep(kernel, measurement) predicate leaving out the rows that run that source
    (itself or inside a wrapper: :func:`own_sources.chain`), of every op or of ``op`` only."""
    source, _, op = spec.partition(":")
    return lambda k, m: not (source in chain(m) and (not op or k.op == op))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--table", action="append", required=True, help="a recorded table (repeatable)")
    ap.add_argument("--drop", action="append", default=[], help="source or source:op (repeatable)")
    ap.add_argument("--limits", default="64MiB,4GiB")
    ap.add_argument("--out", default=None, help="write <out>/<--name>.json and .md")
    ap.add_argument("--name", default="table_ablation")
    args = ap.parse_args()

    from ucudnn.planning.planner import plan
    from ucudnn.planning.table import BenchmarkTable

    limits = args.limits.split(",")
    rows = []
    for path in args.table:
        table = BenchmarkTable.load(path)
        for label, t in [("all rows", table)] + [(f"without {d}", table.filtered(dropper(d))) for d in args.drop]:
            planned = {lim: round(plan(t, "wr", workspace_limit=lim).total_time_ms, 3) for lim in limits}
            rows.append({"table": Path(path).name, "device": table.device, "rows": label, "planned_ms": planned})
            print(f"{Path(path).name} | {label} | " + " | ".join(f"{lim} {v}" for lim, v in planned.items()))
    if args.out:
        doc = {"provenance": provenance(), "limits": limits, "rows": rows}
        md = [md_header("WR planned from recorded tables, with and without rows of a source", doc["provenance"]),
              "Planned (predicted) ms from the tables' measurements, WR at each limit per kernel (planning runs on "
              "the CPU; the device is the table's).", "",
              "| table | device | rows | " + " | ".join(limits) + " |", "|---|---|---|" + "---:|" * len(limits)]
        md += [f"| {r['table']} | {r['device']} | {r['rows']} | "
               + " | ".join(str(r["planned_ms"][lim]) for lim in limits) + " |" for r in rows]
        write(args.out, args.name, doc, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
