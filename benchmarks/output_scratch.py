"""What memory a call owns but has not written yet would buy WR, planned from recorded tables (CPU only, issue 18).

A convolution's call allocates its output before it computes it: while the micro-batches of a forward (backward
data) call run in order, the y (dx) of the images after the running micro-batch is not written yet, and a layer's
backward filter can run before its backward data, while the whole dx is unwritten.  A micro-configuration may take
its workspace from there instead of from the per-kernel limit's buffer
(:func:`ucudnn.planning.wr.solve_with_unwritten`): no memory is added to the step's peak, and the configurations
the same sources run unbounded (large micro-batches, long Winograd chunks) become plannable.  This script plans
WR at each limit from the recorded tables with and without that memory and reports the planned totals beside the
unbounded plan of the same table (issue 18's bar: 64 MiB at >= 0.9 of unbounded).  Planned, not executed:
``plan_wr(..., unwritten=True)`` makes such plans and the executor runs them (``workspace_from: unwritten``
steps; its bookkeeping checked on the CPU), but none has run on a GPU yet, and neither ``ucudnn.api`` nor
``ucudnn.torch`` plans with it.

The network's first layer gets no dx (its input needs no gradient in training); the table's backward data of it is
planned at the limit alone.

    python benchmarks/output_scratch.py --table benchmarks/results/channel_wr_vgg16-...table.json.gz --out results
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import md_header, provenance, write  # noqa: E402

UNBOUNDED = "4GiB"


def analyse(path: Path, limits: list[str]) -> dict:
    from ucudnn.planning.table import BenchmarkTable
    from ucudnn.planning.wr import solve_kernel, solve_with_unwritten, unwritten_bytes
    from ucudnn.policy import micro_batch_sizes
    from ucudnn.units import parse_size

    table = BenchmarkTable.load(path)
    policy = table.extra.get("batch_policy", "powerOfTwo")
    first = table.kernels[0].problem if table.kernels else None
    seen: set = set()
    kernels = []
    for k in table.kernels:
        key = (k.problem.key(), k.op)
        if key in seen:
            continue
        seen.add(key)
        kernels.append(k)

    def total(plan) -> float:
        return sum(m.time_ms for m in plan) if plan is not None else float("inf")

    label = table.extra.get("network") or path.name.removeprefix("channel_wr_").split(".table")[0]
    out: dict = {"table": path.name, "network": label, "device": table.device,
                 "cudnn_version": table.cudnn_version, "numerics": table.numerics, "limits": []}
    unbounded_rows = {}
    for k in kernels:
        sizes = micro_batch_sizes(policy, k.problem.n)
        unbounded_rows[(k.name, k.op)] = total(solve_kernel(k, sizes, parse_size(UNBOUNDED)))
    unbounded = sum(unbounded_rows.values())
    for text in limits:
        limit = parse_size(text)
        rows = []
        for k in kernels:
            sizes = micro_batch_sizes(policy, k.problem.n)
            per_image, fixed = unwritten_bytes(k)
            if k.op == "backward_filter" and k.problem == first:
                fixed = 0
            alone = total(solve_kernel(k, sizes, limit))
            plan = solve_with_unwritten(k, sizes, limit, per_image, fixed)
            withit = min(alone, total(plan))
            used = [m.workspace_bytes for m in plan or [] if m.workspace_bytes > limit] if withit < alone else []
            rows.append({"kernel": k.name, "op": k.op, "alone_ms": alone, "with_ms": withit,
                         "unbounded_ms": unbounded_rows[(k.name, k.op)],
                         "unwritten_used_mib": round(max(used) / 2**20, 2) if used else 0.0})
        alone_sum, with_sum = sum(r["alone_ms"] for r in rows), sum(r["with_ms"] for r in rows)
        out["limits"].append({"limit": text, "alone_ms": alone_sum, "with_ms": with_sum, "unbounded_ms": unbounded,
                              "fraction_alone": unbounded / alone_sum, "fraction_with": unbounded / with_sum,
                              "rows": sorted(rows, key=lambda r: r["with_ms"] - r["alone_ms"])})
    return out


def markdown(docs: list[dict], prov: dict) -> str:
    lines = [md_header("WR with memory the call owns but has not written yet (planned from recorded tables)", prov),
             "Planned ms from each table's measurements (CPU): WR at the limit alone against WR where a "
             "micro-configuration may also take its workspace from the output not yet written (forward: y of the "
             "images after it; backward data: their dx; backward filter: the layer's whole dx, its backward data "
             f"running after it; the first layer gets none).  Unbounded: WR at {UNBOUNDED} from the same table.  "
             "Not executed on a GPU yet (`plan_wr(..., unwritten=True)` makes these plans; the library's lookups "
             "do not use it).", "",
             "| table | limit | alone ms | with unwritten memory ms | unbounded ms | fraction of unbounded: alone -> "
             "with |", "|---|---|---:|---:|---:|---|"]
    for d in docs:
        for lim in d["limits"]:
            lines.append(f"| {d['network']} | {lim['limit']} | {lim['alone_ms']:.2f} | "
                         f"{lim['with_ms']:.2f} | {lim['unbounded_ms']:.2f} | {lim['fraction_alone']:.3f} -> "
                         f"**{lim['fraction_with']:.3f}** |")
    for d in docs:
        for lim in d["limits"]:
            gains = [r for r in lim["rows"] if r["with_ms"] < r["alone_ms"]][:8]
            if not gains:
                continue
            lines += ["", f"{d['network']} at {lim['limit']}, kernels that gain most:", "",
                      "| kernel | op | alone ms | with ms | unbounded ms | unwritten MiB used |",
                      "|---|---|---:|---:|---:|---:|"]
            lines += [f"| {r['kernel']} | {r['op']} | {r['alone_ms']:.3f} | {r['with_ms']:.3f} | "
                      f"{r['unbounded_ms']:.3f} | {r['unwritten_used_mib']} |" for r in gains]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", action="append", required=True, help="a recorded table (repeatable)")
    ap.add_argument("--limits", default="16MiB,32MiB,64MiB")
    ap.add_argument("--out", default=None, help="write <out>/output_scratch.json and .md")
    a = ap.parse_args(argv)
    docs = [analyse(Path(t), a.limits.split(",")) for t in a.table]
    prov = provenance()
    md = markdown(docs, prov)
    if a.out:
        write(a.out, "output_scratch", {"provenance": prov, "tables": docs}, md)
    else:
        print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
