"""Batch-size policies against the best any micro-batch sizes give, over many mini-batch sizes (CPU only).

A recorded table that holds every micro-batch size (``--batch-policy all``) answers, for any mini-batch B up to its
own: what WR plans under a workspace limit with each policy's sizes (``ucudnn.policy.micro_batch_sizes``), and
what it plans with every size 1..B (the optimum WR can reach).  A micro-batch's rows do not depend on the
mini-batch it is part of, so the table's rows at sizes <= B are B's.  Planned totals are predictions from
measured rows, not executions.

Why: the default ``powerOfTwo`` covers a mini-batch that is no power of two with a tail of small steps
(127 = 64 + 32 + 16 + 8 + 4 + 2 + 1); this says how much that costs, and what ``powerOfTwoAndMidpoints`` and
``powerOfTwoAndEvenSplits`` win back for their extra benchmarks.

    python benchmarks/policy_sweep.py --out benchmarks/results      # the shipped AlexNet table of every size
"""
from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _report import md_header, provenance, write  # noqa: E402

TABLE = HERE.parent / "ucudnn" / "data" / "tables" / "alexnet-b256-float32-NCHW-all-h100.json.gz"
POLICIES = ("powerOfTwo", "powerOfTwoAndMidpoints", "powerOfTwoAndEvenSplits")
NAMED = (96, 100, 127, 129, 200, 255)


def load(path: Path):
    from ucudnn.planning.table import BenchmarkTable

    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return BenchmarkTable.from_dict(json.load(f))


def planned_ms(table, batch: int, limit: int, policy: str) -> float:
    """WR's planned total of every kernel of ``table`` at mini-batch ``batch`` under ``limit`` with ``policy``."""
    from ucudnn.planning.wr import plan_kernel

    total = 0.0
    for k in table.kernels:
        at = dataclasses.replace(k, problem=dataclasses.replace(k.problem, n=batch),
                                 measurements=[m for m in k.measurements if m.micro_batch <= batch])
        total += sum(m.time_ms for m in plan_kernel(at, limit, policy))
    return total


def sweep(table, batches: list[int], limits: list[int]) -> dict:
    from ucudnn.policy import micro_batch_sizes

    held = min(len(k.micro_batches()) for k in table.kernels)
    if held < max(batches):
        raise SystemExit(f"the table holds {held} micro-batch sizes per kernel, fewer than the largest mini-batch "
                         f"asked ({max(batches)}): it needs every size (ucudnn bench --batch-policy all)")
    out: dict = {"limits": {}}
    for limit in limits:
        rows = []
        for b in batches:
            best = planned_ms(table, b, limit, "all")
            row = {"batch": b, "all_ms": round(best, 4)}
            for p in POLICIES:
                ms = planned_ms(table, b, limit, p)
                row[p] = {"ms": round(ms, 4), "fraction": round(best / ms, 4),
                          "sizes": len(micro_batch_sizes(p, b))}
            rows.append(row)
        summary = {}
        for p in POLICIES:
            fr = [(r[p]["fraction"], r["batch"]) for r in rows]
            worst = min(fr)
            summary[p] = {"median": round(statistics.median(f for f, _ in fr), 4), "min": worst[0],
                          "min_batch": worst[1], "mean_sizes": round(statistics.mean(r[p]["sizes"] for r in rows), 2)}
        out["limits"][limit] = {"summary": summary, "rows": rows}
    return out


def main(argv: list[str] | None = None) -> int:
    from ucudnn.units import format_size, parse_size

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", type=Path, default=TABLE, help="a recorded table holding every micro-batch size")
    ap.add_argument("--batches", default="33-256", help="mini-batch sizes, FIRST-LAST")
    ap.add_argument("--limits", default="8MiB,32MiB,64MiB,256MiB")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    a = ap.parse_args(argv)
    lo, _, hi = a.batches.partition("-")
    batches = list(range(int(lo), int(hi or lo) + 1))
    limits = [parse_size(x) for x in a.limits.split(",")]
    table = load(a.table)
    res = sweep(table, batches, limits)
    prov = provenance()
    prov["command"] = "policy_sweep.py " + " ".join(argv if argv is not None else sys.argv[1:])
    k0 = table.kernels[0]
    source = (f"`{a.table.name}`: {len(table.kernels)} kernels, {k0.problem.dtype} {k0.problem.layout}, "
              f"sources {', '.join(sorted({m.source for k in table.kernels for m in k.measurements}))}, "
              f"recorded on `{table.device}`, cuDNN {table.cudnn_version}")
    md = [md_header("Batch-size policies against every size: WR planned from a recorded table", prov),
          f"Table {source}.  For each mini-batch B in {batches[0]}-{batches[-1]}: WR planned with each policy's "
          "micro-batch sizes, against WR with every size 1..B (the best WR can do; 1.000 = as good).  Planned "
          "totals from measured rows (no GPU here), summed over the table's kernels.", "",
          "| limit | policy | median fraction of best | worst (B) | mean sizes benchmarked |",
          "|---|---|---:|---:|---:|"]
    for limit, r in res["limits"].items():
        for p, s in r["summary"].items():
            md.append(f"| {format_size(limit)} | {p} | {s['median']:.3f} | {s['min']:.3f} ({s['min_batch']}) | "
                      f"{s['mean_sizes']:.1f} |")
    md += ["", "Named mini-batches (planned ms; fraction of best):", "",
           "| limit | B | every size | " + " | ".join(POLICIES) + " |", "|---|---:|---:|" + "---:|" * len(POLICIES)]
    for limit, r in res["limits"].items():
        for row in r["rows"]:
            if row["batch"] in NAMED:
                md.append(f"| {format_size(limit)} | {row['batch']} | {row['all_ms']:.2f} | " + " | ".join(
                    f"{row[p]['ms']:.2f} ({row[p]['fraction']:.3f})" for p in POLICIES) + " |")
    doc = {"provenance": prov, "table": str(a.table.name),
           "limits": {str(k): v for k, v in res["limits"].items()}}
    stem = "policy_sweep" if a.table == TABLE else f"policy_sweep_{a.table.name.split('.')[0]}"
    write(a.out, stem, doc, "\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
