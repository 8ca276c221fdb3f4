"""Issue 17, per kernel: ucudnn's own algorithms (``mec``, ``direct``) against cuDNN's best that fits in the same
workspace (legacy + graph), on the seeds' layers.

Layer sets (batch ``--batch``, default 256; padding keeps the output size where the seed does not say):

* ``seed002`` -- MEC's benchmark, seed 002's Table 2, cv1-cv12 (input h x w x c, filter r x s x k, stride);
* ``seed001-single`` -- seed 001's single-channel convolutions (C = 1): feature maps 28 to 256, 512 to 32
  filters, 1x1 / 3x3 / 5x5, and one depthwise layer (C/G = 1 per group, MobileNet's first block);
* ``seed001-multi`` -- seed 001's multi-channel convolutions: feature maps 7 to 112, 64 to 512 channels.

Each (layer, op) is benchmarked at each ``--sizes`` micro-batch as its own kernel (policy ``undivided``: that
micro-batch only), with every source and every pruning rule off, so each row is a re-timed median.  Per row:
the fastest configuration of the new sources (time, workspace), cuDNN's fastest within that workspace, cuDNN's
fastest with no workspace and with any; direct against cuDNN's zero-workspace best (issue 17's single-channel
bar: >= 1.5x).  Rows are appended to ``<out>/<tag>.jsonl`` as they finish (a run cut short keeps them).

    python benchmarks/own_kernels.py --set seed001-single --dtype float32 --sizes 8,256
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import md_header, provenance, write  # noqa: E402

MiB = 1 << 20
NEW = ("mec", "direct")
OLD = ("legacy", "graph")

#: seed 002 Table 2: (name, h = w, c, r = s, k, stride, pad)
SEED002 = [("cv1", 227, 3, 11, 96, 4, 0), ("cv2", 231, 3, 11, 96, 4, 0), ("cv3", 227, 3, 7, 64, 2, 3),
           ("cv4", 224, 64, 7, 64, 2, 3), ("cv5", 24, 96, 5, 256, 1, 2), ("cv6", 12, 256, 3, 512, 1, 1),
           ("cv7", 224, 3, 3, 64, 1, 1), ("cv8", 112, 64, 3, 128, 1, 1), ("cv9", 56, 64, 3, 64, 1, 1),
           ("cv10", 28, 128, 3, 128, 1, 1), ("cv11", 14, 256, 3, 256, 1, 1), ("cv12", 7, 512, 3, 512, 1, 1)]
#: seed 001's single-channel range (maps 28 .. 1K, filters 512 .. 32, 1/3/5): (name, h = w, k, r = s, groups)
SEED001_SINGLE = [("c1-28-k512-5x5", 28, 512, 5, 1), ("c1-56-k256-3x3", 56, 256, 3, 1),
                  ("c1-112-k128-1x1", 112, 128, 1, 1), ("c1-128-k64-5x5", 128, 64, 5, 1),
                  ("c1-256-k32-3x3", 256, 32, 3, 1), ("dw-112-c32-3x3", 112, 32, 3, 32)]
#: seed 001's multi-channel range (maps 7 .. 512, channels 64 .. 512, 1/3/5): (name, h = w, c = k, r = s)
SEED001_MULTI = [("m-7-c512-3x3", 7, 512, 3), ("m-14-c256-3x3", 14, 256, 3), ("m-28-c128-5x5", 28, 128, 5),
                 ("m-56-c64-3x3", 56, 64, 3), ("m-112-c64-1x1", 112, 64, 1)]


def layers(name: str, batch: int, dtype: str, layout: str):
    from ucudnn.problem import ConvProblem

    kw = dict(dtype=dtype, layout=layout)
    if name == "seed002":
        return [(n, ConvProblem(batch, c, h, h, k, r, r, pad=(p, p), stride=(s, s), **kw))
                for n, h, c, r, k, s, p in SEED002]
    if name == "seed001-single":
        return [(n, ConvProblem(batch, g, h, h, k, r, r, pad=(r // 2, r // 2), groups=g, **kw))
                for n, h, k, r, g in SEED001_SINGLE]
    if name == "seed001-multi":
        return [(n, ConvProblem(batch, c, h, h, c, r, r, pad=(r // 2, r // 2), **kw)) for n, h, c, r in SEED001_MULTI]
    raise SystemExit(f"unknown layer set {name!r}")


def best(rows, fits=lambda m: True):
    rows = [m for m in rows if fits(m)]
    return min(rows, key=lambda m: m.time_ms) if rows else None


def summarise(layer: str, op: str, n: int, kb) -> dict:
    ms = kb.measurements
    new = [m for m in ms if m.source in NEW]
    old = [m for m in ms if m.source in OLD]
    bn = best(new)
    row = {"layer": layer, "op": op, "n": n, "benchmark_s": round(kb.benchmark_seconds or 0.0, 2)}

    def cfg(m):
        return None if m is None else {"source": m.source, "algo": str(m.algo), "math": m.math_type,
                                       "ms": round(m.time_ms, 4), "workspace_bytes": m.workspace_bytes}
    row["new_best"] = cfg(bn)
    row["cudnn_any"] = cfg(best(old))
    row["cudnn_zero"] = cfg(best(old, lambda m: m.workspace_bytes == 0))
    row["direct"] = cfg(best(new, lambda m: m.source == "direct"))
    row["mec"] = cfg(best(new, lambda m: m.source == "mec"))
    if bn is not None:
        fit = best(old, lambda m: m.workspace_bytes <= bn.workspace_bytes)
        row["cudnn_within_new_ws"] = cfg(fit)
        if fit is not None:
            row["speedup_equal_ws"] = round(fit.time_ms / bn.time_ms, 3)
    d, z = row["direct"], row["cudnn_zero"]
    if d and z:
        row["direct_vs_cudnn_zero"] = round(z["ms"] / d["ms"], 3)
    row["declined"] = sorted({s.reason for s in kb.skipped if any(s.reason.startswith(f"{x}:") for x in NEW)})[:4]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--set", dest="layer_set", default="seed002")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--sizes", default="8,256")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--layout", default="NHWC")
    ap.add_argument("--numerics", default=None)
    ap.add_argument("--ops", default="forward,backward_data,backward_filter")
    ap.add_argument("--only", default=None, help="comma-separated layer names")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--report", action="store_true",
                    help="write the JSON + Markdown of <out>/<tag>.jsonl (rows of one or more runs), measure nothing")
    args = ap.parse_args()
    if args.report:
        return report(Path(args.out), args)

    import cupy as cp

    from ucudnn import numerics as num
    from ucudnn.measure.benchmarking import benchmark
    from ucudnn.problem import KernelSpec

    prov = provenance()
    numerics = num.normalize(args.numerics, args.dtype)
    tag = f"own_kernels_{args.layer_set}-{args.dtype}-{args.layout}-{numerics}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / f"{tag}.jsonl"
    only = set(args.only.split(",")) if args.only else None
    rows = []
    for name, problem in layers(args.layer_set, args.batch, args.dtype, args.layout):
        if only and name not in only:
            continue
        for n in [int(s) for s in args.sizes.split(",")]:
            for op in args.ops.split(","):
                spec = KernelSpec(f"{name}/{op}", op, problem.with_batch(n))
                t0 = time.perf_counter()
                try:
                    table = benchmark([spec], "undivided", numerics, sources=",".join(OLD + NEW),
                                      prune_margin=None, hopeless_factor=None, kernel_budget_s=None,
                                      trust_estimate_ms=None, split_margin=None, progress=False)
                except Exception as e:  # noqa: BLE001 - one layer's failure is a row, not the end of the run
                    row = {"layer": name, "op": op, "n": n, "error": f"{type(e).__name__}: {e}"[:300]}
                else:
                    row = summarise(name, op, n, table.kernels[0])
                row["wall_s"] = round(time.perf_counter() - t0, 2)
                rows.append(row)
                with jsonl.open("a") as f:
                    f.write(json.dumps({"provenance": prov, **row}) + "\n")
                print(json.dumps(row), flush=True)
                cp.get_default_memory_pool().free_all_blocks()
    doc = {"provenance": prov, "set": args.layer_set, "batch": args.batch, "dtype": args.dtype,
           "layout": args.layout, "numerics": numerics, "rows": rows}
    write(out, tag, doc, markdown(prov, doc))


def report(out: Path, args: argparse.Namespace) -> None:
    """The JSON + Markdown of every row recorded in ``<out>/<tag>.jsonl`` (a later row of the same layer, op and n
    replaces an earlier one); the provenance shown is the last run's, each row keeps its own in the JSONL."""
    numerics = args.numerics or ("strict" if args.dtype == "float32" else "default")
    tag = f"own_kernels_{args.layer_set}-{args.dtype}-{args.layout}-{numerics}"
    recs = [json.loads(line) for line in (out / f"{tag}.jsonl").read_text().splitlines() if line.strip()]
    order = {(name, op, n): i for i, (name, op, n) in enumerate(
        (name, op, n) for name, _ in layers(args.layer_set, args.batch, args.dtype, args.layout)
        for n in [int(s) for s in args.sizes.split(",")] for op in args.ops.split(","))}
    rows = {}
    for r in recs:
        rows[(r["layer"], r["op"], r["n"])] = r
    prov = recs[-1]["provenance"]
    kept = [{k: v for k, v in r.items() if k != "provenance"}
            for _, r in sorted(rows.items(), key=lambda kv: order.get(kv[0], len(order)))]
    missing = [f"{name}/{op}@{n}" for (name, op, n) in order if (name, op, n) not in rows]
    doc = {"provenance": prov, "set": args.layer_set, "batch": args.batch, "dtype": args.dtype,
           "layout": args.layout, "numerics": numerics, "rows": kept, "not_measured": missing}
    write(out, tag, doc, markdown(prov, doc))


def _ms(c) -> str:
    return "-" if not c else f"{c['ms']:.3f}"


def markdown(prov: dict, doc: dict) -> str:
    lines = [md_header(f"ucudnn's own algorithms per kernel vs cuDNN: {doc['set']} b{doc['batch']} {doc['dtype']} "
                       f"{doc['layout']} {doc['numerics']}", prov), "",
             "Each (layer, op) at each micro-batch n benchmarked alone, every source, no pruning.  new = the fastest "
             "mec or direct configuration; cuDNN (legacy + graph) at the same workspace = its fastest needing no "
             "more than new's; direct vs cuDNN's best zero-workspace algorithm (issue 17 bar on single-channel "
             "layers: >= 1.5x).  ms per call.", "",
             "| layer | op | n | new best (source, MiB) | cuDNN within that workspace | speed-up at equal workspace | "
             "direct | cuDNN 0-ws | direct vs 0-ws | cuDNN any (MiB) |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---|"]
    for r in doc["rows"]:
        if "error" in r:
            lines.append(f"| {r['layer']} | {r['op']} | {r['n']} | error: {r['error'][:80]} | | | | | | |")
            continue
        nb, anyc = r.get("new_best"), r.get("cudnn_any")
        nbs = "-" if not nb else f"{nb['ms']:.3f} ({nb['source']} {nb['algo']}, {nb['workspace_bytes'] / MiB:.1f})"
        anys = "-" if not anyc else f"{anyc['ms']:.3f} ({anyc['workspace_bytes'] / MiB:.1f})"
        lines.append(f"| {r['layer']} | {r['op']} | {r['n']} | {nbs} | {_ms(r.get('cudnn_within_new_ws'))} | "
                     f"{r.get('speedup_equal_ws', '-')} | {_ms(r.get('direct'))} | {_ms(r.get('cudnn_zero'))} | "
                     f"{r.get('direct_vs_cudnn_zero', '-')} | {anys} |")
    wins = [r for r in doc["rows"] if r.get("speedup_equal_ws", 0) > 1.0]
    lines += ["", f"new sources faster than cuDNN at equal workspace: {len(wins)} of "
              f"{sum('speedup_equal_ws' in r for r in doc['rows'])} rows"]
    if doc.get("not_measured"):
        lines += ["", f"Not measured (the run's time limit): {', '.join(doc['not_measured'])}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
