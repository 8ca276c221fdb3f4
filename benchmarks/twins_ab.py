"""One plan executed eagerly with and without legacy twins, alternating in one process (GPU machine).

Why: ``channel_wr.py`` run twice (``UCUDNN_LEGACY_TWINS`` on, then off from the first run's table) compares two
processes, and eager per-kernel times move by up to 0.8 ms between processes on kernels no twin touches (the
benchmarking process ran VGG-16's winograd steps slower).  Here one process plans once from a recorded table and
executes the same plan ``--rounds`` times each way, interleaved (fresh executors each time, so every legacy
configuration is prepared again under the switch), and reports per kernel the median of the rounds.

    python benchmarks/twins_ab.py --table alexnet.table.json.gz --network alexnet --batch 256 --unwritten
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _report import md_header, provenance, write  # noqa: E402
from core_wr import distinct_kernels, execute_plan  # noqa: E402


def summarize(rounds: dict[str, list[dict[str, float]]], plan_summary: dict[str, str]) -> dict:
    """Per kernel and in total, the median over rounds of each setting's ms, and on / off."""
    kernels = list(plan_summary)
    med = {s: {k: statistics.median(r[k] for r in rs) for k in kernels} for s, rs in rounds.items()}
    totals = {s: [round(sum(r.values()), 4) for r in rs] for s, rs in rounds.items()}
    rows = [{"kernel": k, "plan": plan_summary[k], "on_ms": round(med["on"][k], 4), "off_ms": round(med["off"][k], 4),
             "off_over_on": round(med["off"][k] / med["on"][k], 3)} for k in kernels]
    return {"totals_ms": totals, "median_total_on_ms": round(statistics.median(totals["on"]), 4),
            "median_total_off_ms": round(statistics.median(totals["off"]), 4), "kernels": rows}


def markdown(prov: dict, doc: dict) -> str:
    s = doc["summary"]
    lines = [md_header(f"Legacy twins on / off, one process: {doc['network']} b{doc['batch']} {doc['dtype']} "
                      f"{doc['layout']}, WR at {doc['limit']}{' with unwritten memory' if doc['unwritten'] else ''}",
                      prov)]
    lines += [f"The plan of `{doc['table']}` executed eagerly {doc['rounds']} times with twins and "
              f"{doc['rounds']} times without (`UCUDNN_LEGACY_TWINS=0`), interleaved; ms = median of event-timed "
              "runs of each kernel's plan; per kernel the median over rounds.", "",
              f"Totals: with twins {s['totals_ms']['on']} ms (median **{s['median_total_on_ms']}**), without "
              f"{s['totals_ms']['off']} ms (median **{s['median_total_off_ms']}**): "
              f"**{s['median_total_off_ms'] / s['median_total_on_ms']:.3f}x**.", "",
              "| kernel | plan | with twins ms | without ms | without / with |", "|---|---|---:|---:|---:|"]
    for r in s["kernels"]:
        lines.append(f"| {r['kernel']} | {r['plan']} | {r['on_ms']} | {r['off_ms']} | {r['off_over_on']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", required=True)
    ap.add_argument("--network", default="alexnet")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--layout", default="NCHW")
    ap.add_argument("--limit", default="64MiB")
    ap.add_argument("--unwritten", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--exec-repeat", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--suffix", default="")
    args = ap.parse_args(argv)

    from ucudnn.measure.benchmarking import Buffers
    from ucudnn.planning.network import load_network
    from ucudnn.planning.planner import plan
    from ucudnn.planning.table import BenchmarkTable
    from ucudnn.units import parse_size

    prov = provenance()
    net = load_network(args.network)
    kernels = distinct_kernels(net.kernels(args.batch, args.dtype, args.layout))
    table = BenchmarkTable.load(args.table)
    p = plan(table, "wr", workspace_limit=parse_size(args.limit), unwritten=args.unwritten)
    bufs = {k.problem: Buffers(k.problem) for k in kernels}
    rounds: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
    for _ in range(args.rounds):
        for setting in ("on", "off"):
            os.environ["UCUDNN_LEGACY_TWINS"] = "1" if setting == "on" else "0"
            rounds[setting].append(execute_plan(p, bufs, args.exec_repeat))
            print(setting, round(sum(rounds[setting][-1].values()), 4), flush=True)
    doc = {"provenance": prov, "network": net.name, "batch": args.batch, "dtype": args.dtype, "layout": args.layout,
           "limit": args.limit, "unwritten": args.unwritten, "table": Path(args.table).name, "rounds": args.rounds,
           "planned_ms": round(p.total_time_ms, 4), "raw": rounds,
           "summary": summarize(rounds, {kp.name: kp.summary() for kp in p.kernels})}
    write(args.out, f"twins_ab_{net.name}-b{args.batch}-{args.dtype}-{args.layout}{args.suffix}", doc,
          markdown(prov, doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
