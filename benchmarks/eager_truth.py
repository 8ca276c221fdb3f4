"""Does a planned eager time say what the plan then runs in?  For every kernel of WR's plan at a limit (from a
recorded table), the plan executed eagerly and timed four ways, side by side in one process:

* ``planned`` — the table's times summed (what WR chose by);
* ``gpu`` — GPU time between two events behind a long hold (the whole call queued before the start event: the
  GPU's time alone, what the timer reported before it took the host's time into account);
* ``timer`` — :func:`ucudnn.binding.timing.time_ms` as benchmarks and channel_wr.py time plans (the longer of the
  GPU's and the host's time per call);
* ``wall`` — wall clock over 30 calls back to back, the device synchronised before and after: the ground truth
  for a training loop that runs the plan eagerly;
* ``host`` — the host's enqueue time of one call on an idle GPU;
* ``replay`` — wall clock of the same plan replayed from a CUDA graph (``Executor(replay=True)``).

    python benchmarks/eager_truth.py --table benchmarks/results/X.table.json.gz --limit 64MiB
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import md_header, provenance, write  # noqa: E402

COLUMNS = ("planned", "gpu", "timer", "wall", "host", "replay")


def _gpu_only(cp, timing, fn, n: int = 5) -> float:
    stream = cp.cuda.get_current_stream()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    out = []
    for _ in range(n):
        timing._hold(stream, 0.05)   # the call fully queued behind the hold (MAX_HOLD_S raised in main)
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        out.append(cp.cuda.get_elapsed_time(start, end))
    return sorted(out)[n // 2]


def _wall(cp, fn, n: int = 30) -> float:
    fn()
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    cp.cuda.Device().synchronize()
    return (time.perf_counter() - t0) / n * 1e3


def _host(cp, fn, n: int = 10) -> float:
    ts = []
    for _ in range(n):
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    cp.cuda.Device().synchronize()
    return sorted(ts)[n // 2] * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--table", action="append", required=True, help="a recorded table (repeatable)")
    ap.add_argument("--limit", default="64MiB")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--name", default="eager_truth")
    args = ap.parse_args()

    import cupy as cp

    from ucudnn.binding import timing
    from ucudnn.execute.executor import Executor
    from ucudnn.measure.benchmarking import Buffers
    from ucudnn.planning.planner import plan
    from ucudnn.planning.table import BenchmarkTable

    rows, totals = [], []
    for path in args.table:
        table = BenchmarkTable.load(path)
        p = plan(table, "wr", workspace_limit=args.limit)
        bufs: dict = {}
        total = dict.fromkeys(COLUMNS, 0.0)
        for kp in p.kernels:
            if kp.problem not in bufs:
                bufs[kp.problem] = Buffers(kp.problem)
            a, b, out = bufs[kp.problem].arrays(kp.op)
            eager, replayed = Executor(kp), Executor(kp, replay=True)
            ws = cp.cuda.alloc(max(eager.workspace_bytes, 1))

            def fn(eager=eager, a=a, b=b, out=out, ws=ws) -> None:
                eager(a, b, out, workspace=ws)

            saved, timing.MAX_HOLD_S = timing.MAX_HOLD_S, 0.05
            try:
                gpu = _gpu_only(cp, timing, fn)
            finally:
                timing.MAX_HOLD_S = saved
            row = {"table": Path(path).name, "kernel": kp.name, "steps": len(kp.configs),
                   "config": f"{kp.configs[0].micro_batch} {kp.configs[0].algo}", "planned": kp.time_ms, "gpu": gpu,
                   "timer": timing.time_ms(fn, repeat=5, warmup=2, min_sample_ms=1.0), "wall": _wall(cp, fn),
                   "host": _host(cp, fn),
                   "replay": _wall(cp, lambda r=replayed, a=a, b=b, o=out, w=ws: r(a, b, o, workspace=w))}
            rows.append(row)
            total = {c: total[c] + row[c] for c in COLUMNS}
            print(" ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()),
                  flush=True)
        totals.append({"table": Path(path).name, "device": table.device, **{c: round(total[c], 3) for c in COLUMNS}})
        print(totals[-1], flush=True)
    doc = {"provenance": provenance(), "limit": args.limit, "totals": totals, "rows": rows}
    md = [md_header(f"Eager plans at {args.limit}: planned, timed and wall-clock", doc["provenance"]),
          ("ms per call of each kernel's WR plan, summed over the table's kernels (columns: the module doc). "
           "`gpu` is what the timer reported before it counted host time; `timer` what it reports now."), "",
          "| table | device | " + " | ".join(COLUMNS) + " | timer / wall | gpu / wall |",
          "|---|---|" + "---:|" * (len(COLUMNS) + 2)]
    md += [f"| {t['table']} | {t['device']} | " + " | ".join(str(t[c]) for c in COLUMNS)
           + f" | {t['timer'] / t['wall']:.3f} | {t['gpu'] / t['wall']:.3f} |" for t in totals]
    md += ["", "Kernels whose wall clock is over 5% from the GPU time:", "",
           "| table | kernel | steps | first step | " + " | ".join(COLUMNS) + " |",
           "|---|---|---:|---|" + "---:|" * len(COLUMNS)]
    md += [f"| {r['table']} | {r['kernel']} | {r['steps']} | {r['config']} | "
           + " | ".join(f"{r[c]:.3f}" for c in COLUMNS) + " |" for r in rows if abs(r["wall"] / r["gpu"] - 1) > 0.05]
    write(args.out, args.name, doc, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
