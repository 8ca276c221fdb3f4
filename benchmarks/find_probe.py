"""Issue 16 diagnosis: where the legacy source's benchmarking time goes (cudnnFind per math type vs re-timing).

For each distinct kernel of a network under ``powerOfTwo`` and each math type the numerics allow, runs
cudnnFind*AlgorithmEx once and records its wall time and every row it returns (algo, math type, status, time,
workspace), then cuDNN's heuristic (``_v7``) under the same descriptor.  Reported: Find's wall seconds per
math type, the sum of Find's own per-row times (how many times Find runs each algorithm, roughly), and
which (algo, math type) rows each math type's Find returns that no other does — i.e. whether a Find per math
type is needed at all.

    python benchmarks/find_probe.py --networks alexnet --dtypes float32,float16 --out benchmarks/results
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import md_header, provenance, write  # noqa: E402
from bench_time import BATCH, LAYOUT  # noqa: E402
from core_wr import distinct_kernels  # noqa: E402


def probe(net: str, dtype: str) -> dict:
    import cupy as cp

    from ucudnn import numerics as num
    from ucudnn.binding import cudnn
    from ucudnn.binding.gpu import descriptors, handle
    from ucudnn.measure.benchmarking import Buffers
    from ucudnn.planning.network import load_network
    from ucudnn.policy import micro_batch_sizes

    layout, numerics = LAYOUT[dtype]
    kernels = distinct_kernels(load_network(net).kernels(BATCH[net], dtype, layout))
    ws_bytes = 1 << 30
    ws = cp.cuda.alloc(ws_bytes)
    h = handle()
    maths = num.allowed_math_types(numerics, dtype)
    rows = []
    for spec in kernels:
        buf = Buffers(spec.problem)
        a_arr, b_arr, o_arr = buf.arrays(spec.op)
        for mb in micro_batch_sizes("powerOfTwo", spec.problem.n):
            p = spec.problem.with_batch(mb)
            for math in maths:
                d = descriptors(p, math)
                a, b, out = d.operands(spec.op)
                n = 2 * cudnn.get_algorithm_max_count(h, spec.op)
                cp.cuda.runtime.deviceSynchronize()
                t0 = time.perf_counter()
                try:
                    found = cudnn.find_algorithm_ex(h, spec.op, a, a_arr.data.ptr, b, b_arr.data.ptr, d.conv, out,
                                                    o_arr.data.ptr, n, ws.ptr, ws_bytes)
                    err = None
                except Exception as e:  # noqa: BLE001 - recorded
                    found, err = [], str(e)
                cp.cuda.runtime.deviceSynchronize()
                find_s = time.perf_counter() - t0
                t0 = time.perf_counter()
                heur = cudnn.get_algorithm_v7(h, spec.op, a, b, d.conv, out, n)
                heur_s = time.perf_counter() - t0
                rows.append({"kernel": spec.name, "op": spec.op, "mb": mb, "math": math, "find_s": find_s,
                             "error": err, "heuristic_s": heur_s,
                             "found": [[r.algo, r.math_type, r.status, round(r.time_ms, 5), r.workspace_bytes]
                                       for r in found],
                             "heuristic": [[r.algo, r.math_type, r.status, r.workspace_bytes] for r in heur]})
        del buf
    return {"network": net, "dtype": dtype, "layout": layout, "numerics": numerics, "math_types": list(maths),
            "rows": rows}


def summarise(doc: dict) -> dict:
    maths = doc["math_types"]
    out = {"find_s": {m: 0.0 for m in maths}, "find_rows_ms": {m: 0.0 for m in maths},
           "unique_ok_rows": {m: 0 for m in maths}, "ok_rows": {m: 0 for m in maths}, "heuristic_s": 0.0}
    groups: dict[tuple, dict[str, set]] = {}
    for r in doc["rows"]:
        out["find_s"][r["math"]] += r["find_s"]
        out["heuristic_s"] += r["heuristic_s"]
        ok = {(f[0], f[1]) for f in r["found"] if f[2] == 0}
        out["find_rows_ms"][r["math"]] += sum(f[3] for f in r["found"] if f[2] == 0)
        out["ok_rows"][r["math"]] += len(ok)
        groups.setdefault((r["kernel"], r["op"], r["mb"]), {})[r["math"]] = ok
    for g in groups.values():
        for m, ok in g.items():
            others = set().union(*(v for k, v in g.items() if k != m)) if len(g) > 1 else set()
            out["unique_ok_rows"][m] += len(ok - others)
    return out


def markdown(prov: dict, docs: list[dict]) -> str:
    lines = [md_header("cudnnFind per math type: wall time and what each call adds", prov), "",
             "| network | dtype / layout / numerics | math type | Find wall s | sum of Find's row times s | ok rows | "
             "rows no other math type's Find returned |", "|---|---|---|---:|---:|---:|---:|"]
    for d in docs:
        s = d["summary"]
        for m in d["math_types"]:
            lines.append(f"| {d['network']} b{BATCH[d['network']]} | {d['dtype']} / {d['layout']} / {d['numerics']} | {m} "
                         f"| {s['find_s'][m]:.2f} | {s['find_rows_ms'][m] / 1e3:.2f} | {s['ok_rows'][m]} "
                         f"| {s['unique_ok_rows'][m]} |")
        lines.append(f"| | | heuristic (_v7), all math types | {s['heuristic_s']:.3f} | | | |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--networks", default="alexnet")
    ap.add_argument("--dtypes", default="float32,float16")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    prov = provenance()
    docs = []
    for net in args.networks.split(","):
        for dtype in args.dtypes.split(","):
            d = probe(net, dtype)
            d["summary"] = summarise(d)
            print(net, dtype, json.dumps(d["summary"]), flush=True)
            docs.append(d)
    write(args.out, "find_probe", {"provenance": prov, "runs": docs}, markdown(prov, docs))


if __name__ == "__main__":
    main()
