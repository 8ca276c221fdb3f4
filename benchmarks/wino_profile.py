"""Issue 18 diagnosis: where a winograd call's time goes, kernel by kernel, at the configurations WR's 64 MiB and
unbounded plans run -- the transforms, the chunk GEMMs (and what the same GEMM takes alone), the inverse filter
transform -- so the gap between the two is read from the device, not guessed.

Each configuration (VGG-16 b64 FP32 strict NCHW, the plans of ``channel_wr_vgg16-b64-float32-NCHW-strict-winograd-
ksplit-replay.md``) is prepared by the winograd source, timed with CUDA events (ms a call, and a layer's ms: the
plan's calls of its micro-batch), then three calls run under ``torch.profiler`` (CUPTI sees CuPy's and cuBLAS's
kernels too): per kernel kind the count and device microseconds a call, the union of the intervals in which some
kernel ran (busy) and the span from first start to last end.  Each chunk GEMM's shape is timed alone with the same
cuBLAS call (FP32 pedantic), so "GEMM TFLOPS in the call" against "alone" says how much the call's concurrency
(chunks over streams, transforms beside GEMMs) costs the GEMMs.

    python benchmarks/wino_profile.py --out benchmarks/results

``--from-results channel_wr_X.json`` profiles, instead of the VGG-16 list above, every kernel that report lists
under 90% of its unbounded speed at ``--limit`` (default 64 MiB) whose plan there, or unbounded, is one winograd
configuration over equal micro-batches (``16x4 awino-f4-t1536-k8-p2/FMA``): the network's problems come from its
spec (``ucudnn.planning.network.load_network``), so any network's plans can be read the same way.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import md_header, provenance, write  # noqa: E402
from wino_bwf_levers import problem, timed  # noqa: E402

MiB = 1 << 20
#: (layer, op, micro-batch, calls a batch, algorithm, which plan): the winograd configurations WR chose for VGG-16 b64
#: at 64 MiB and unbounded (4 GiB) on the H200, where both are winograd rows
CONFIGS = [
    ("vgg16-conv1_2", "backward_filter", 16, 4, "wino-f4-t1536-k8-p2", "64 MiB"),
    ("vgg16-conv1_2", "backward_filter", 64, 1, "wino-f4-t8192-k8-p3", "unbounded"),
    ("vgg16-conv2_1", "backward_filter", 64, 1, "wino-f4-t1024-k4-p2", "64 MiB"),
    ("vgg16-conv2_1", "backward_filter", 64, 1, "wino-f4-t2048-k4-p3", "unbounded"),
    ("vgg16-conv3_2", "backward_filter", 64, 1, "wino-f4-t320-p2", "64 MiB"),
    ("vgg16-conv3_2", "backward_filter", 64, 1, "wino-f4-c4-p3", "unbounded"),
    ("vgg16-conv4_2", "backward_filter", 64, 1, "wino-f4-c8-g3-p2", "64 MiB"),
    ("vgg16-conv4_2", "backward_filter", 64, 1, "wino-f4-c16-p2", "unbounded"),
    ("vgg16-conv4_2", "forward", 64, 1, "wino-f4-t64-p3", "64 MiB"),
    ("vgg16-conv4_2", "forward", 64, 1, "wino-f4-t768-p2", "unbounded"),
    ("vgg16-conv2_2", "forward", 32, 2, "wino-f4-t768-p2", "64 MiB"),
    ("vgg16-conv2_2", "forward", 32, 2, "wino-f4-t768-p3", "unbounded"),
]
_PLAN = re.compile(r"^(\d+)(?:x(\d+))? a(wino-f4[-a-z0-9]*)/[A-Z_]+$")


def config_of(algo: str) -> dict[str, int]:
    """``extra["winograd"]`` of a chunked winograd configuration's name (the source's
    :func:`~ucudnn.measure.sources.winograd.configuration_of`)."""
    from ucudnn.measure.sources.winograd import configuration_of

    return configuration_of(algo)


def plan_step(summary: str) -> tuple[int, int, str] | None:
    """(micro-batch, calls, algorithm) of a kernel plan's summary that is one chunked winograd configuration over
    equal micro-batches (``16x4 awino-f4-t1536-k8-p2/FMA`` -> 16, 4, ``wino-f4-t1536-k8-p2``), else None (other
    sources, several steps, channel slices, the fused kernel)."""
    from ucudnn.errors import InputError

    m = _PLAN.match(summary.strip())
    if m is None:
        return None
    try:
        config_of(m.group(3))
    except InputError:
        return None
    return int(m.group(1)), int(m.group(2) or 1), m.group(3)


def configs_from_results(doc: dict[str, Any], limit: int) -> list[tuple[str, str, Any, int, int, str, str]]:
    """(layer, op, problem at its micro-batch, micro-batch, calls, algorithm, plan) for each kernel a channel_wr
    report lists under 90% of unbounded at ``limit`` bytes whose plan there or unbounded is a winograd
    configuration (:func:`plan_step`); the problems from the report's network spec at its batch, dtype and
    layout."""
    from ucudnn.planning.network import load_network

    rows = [r for r in doc["rows"] if r["limit_bytes"] == limit]
    if not rows:
        raise ValueError(f"the report has no row at {limit} bytes (it has "
                         f"{sorted(r['limit_bytes'] for r in doc['rows'])})")
    specs = {k.name: k for k in load_network(doc["network"]).kernels(doc["batch"], doc["dtype"], doc["layout"])}
    out = []
    for short in rows[0]["short_kernels"]:
        name = short["kernel"]
        for summary, plan in ((short["plan"], f"{limit >> 20} MiB"), (short["unbounded_plan"], "unbounded")):
            step = plan_step(summary)
            if step is not None:
                mb, calls, algo = step
                spec = specs[name]
                out.append((name.split("/")[0], spec.op, spec.problem.with_batch(mb), mb, calls, algo, plan))
    return out


def chunk_images(info: dict[str, int], mb: int) -> int:
    """The images a chunk of configuration ``info`` holds at micro-batch ``mb`` (0 for tile chunks), as the
    source's ``Geometry`` methods take it."""
    return 0 if "tiles" in info else info.get("chunk", mb)


def workspace_of(geo: Any, info: dict[str, int], mb: int) -> int:
    """Bytes the configuration ``info`` (:func:`config_of`) of ``geo``'s problem touches at micro-batch ``mb``."""
    return geo.workspace_bytes(chunk_images(info, mb), info.get("tiles"), info.get("csplit", 1),
                               info.get("streams", 1), info.get("groups", 1), info.get("ksplit", 1))


def kind_of(name: str) -> str:
    """The kind of a profiled kernel: one of the winograd transforms, or a GEMM (cuBLAS's kernel name)."""
    for kind in ("wino_filter_grad", "wino_filter", "wino_input", "wino_output", "wino_dy"):
        if kind in name:
            return kind
    return "gemm"


def busy(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of (start, end) intervals: the time in which at least one kernel ran."""
    total, cur = 0.0, None
    for s, e in sorted(intervals):
        if cur is None or s > cur[1]:
            if cur is not None:
                total += cur[1] - cur[0]
            cur = [s, e]
        else:
            cur[1] = max(cur[1], e)
    return total + (cur[1] - cur[0] if cur is not None else 0.0)


def gemm_alone(geo: Any, tiles: int, ksplit: int, groups: int) -> tuple[float, float]:
    """(us, GFLOP) of one chunk GEMM of ``tiles`` tiles run alone: the source's own cuBLAS call
    (``winograd._gemm_call``, FP32 pedantic) on scratch buffers of its operands' names."""
    import cupy as cp

    from ucudnn.binding import cublas
    from ucudnn.measure.sources.winograd import _gemm_call

    cm = geo.gemm(0, tiles, False, groups, ksplit).column_major()
    floats: dict[str, int] = {}
    for operand, stride in (("A", "strideA"), ("B", "strideB"), ("C", "strideC")):
        name, offset = cm[operand]
        floats[name] = max(floats.get(name, 0), offset + cm[stride] * cm["batchCount"] + 64)
    scratch = {name: cp.random.standard_normal(size, dtype=cp.float32) for name, size in floats.items()}
    bufs = {name: a.data.ptr for name, a in scratch.items()}
    call = _gemm_call(geo, tiles, "32F_PEDANTIC", groups=groups, ksplit=ksplit)
    h = cublas.handle()
    cublas.bind(h, cp.cuda.get_current_stream().ptr)
    us = timed(lambda: call(h, bufs), 20) * 1e3
    return us, 2.0 * cm["m"] * cm["n"] * cm["k"] * cm["batchCount"] / 1e9


def profile(fn: Callable[[], None], calls: int = 3) -> dict[str, Any]:
    """Kernel kinds (count and device us a call), busy and span us a call, of ``calls`` calls of ``fn``."""
    import cupy as cp
    import torch

    cp.cuda.Device().synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        cp.cuda.Device().synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kinds: dict[str, dict[str, float]] = {}
    spans = []
    for e in events:
        d = kinds.setdefault(kind_of(e.name), {"count": 0.0, "us": 0.0})
        d["count"] += 1 / calls
        d["us"] += e.time_range.elapsed_us() / calls
        spans.append((e.time_range.start, e.time_range.end))
    return {"kinds": {k: {kk: round(vv, 2) for kk, vv in v.items()} for k, v in kinds.items()},
            "busy_us": round(busy(spans) / calls, 1),
            "span_us": round((max(e for _, e in spans) - min(s for s, _ in spans)) / calls, 1) if spans else 0.0}


def measure(layer: str, op: str, p: Any, mb: int, calls: int, algo: str, ws: Any, ws_bytes: int) -> dict[str, Any]:
    """One configuration of problem ``p`` (at micro-batch ``mb``) timed, replayed, profiled (see the module doc)."""
    import cupy as cp

    from ucudnn.binding import gpu
    from ucudnn.kernels.winograd import Geometry
    from ucudnn.measure.sources.base import Operands
    from ucudnn.measure.sources.winograd import WinogradSource
    from ucudnn.planning.table import Measurement

    info = config_of(algo)
    a, b, out = (cp.random.standard_normal(s, dtype=cp.float32) for s in p.operand_shapes(op))
    cfg = Measurement(mb, algo, "FMA", 0.0, 0, "winograd", None, {"winograd": dict(info)})
    launch = WinogradSource().prepare(op, p, cfg)
    ops = Operands(a.data.ptr, b.data.ptr, out.data.ptr)

    def call() -> None:
        launch(ops, ws.ptr, ws_bytes, 1.0, 0.0)

    geo = Geometry.of(p, op)
    chunk = chunk_images(info, mb)
    tiles = info.get("tiles") or min(chunk, mb) * geo.tiles_per_image
    eager = timed(call, 12)
    call()                                  # launchers built before the capture
    graph = gpu.capture(call)
    replay = graph.launch                   # as channel_wr executes plans: replayed from a CUDA graph
    ms = timed(replay, 12)
    prof = profile(replay)
    alone_us, gflop = gemm_alone(geo, tiles, info.get("ksplit", 1), info.get("groups", 1))
    gemm = prof["kinds"].get("gemm", {"count": 0, "us": 0})
    # every GEMM of the call (the last chunk may be short; each group's chunks again), against its kernels' time
    gm = [geo.gemm(0, count, False, info.get("groups", 1), info.get("ksplit", 1)).column_major()
          for _, count in geo.ranges(mb, chunk, info.get("tiles"))]
    call_gflop = info.get("groups", 1) * sum(2.0 * g["m"] * g["n"] * g["k"] * g["batchCount"] for g in gm) / 1e9
    need = workspace_of(geo, info, mb)
    return {"layer": layer, "op": op, "micro_batch": mb, "calls": calls, "algo": algo, "workspace_mib":
            round(need / MiB, 2), "ms_call": round(ms, 4), "ms_call_eager": round(eager, 4),
            "ms_layer": round(ms * calls, 4), **prof, "gemm_gflop_call": round(call_gflop, 3),
            "gemm_us_alone": round(alone_us, 2),
            "gemm_tflops_in_call": round(call_gflop / gemm["us"] * 1e3, 2) if gemm["us"] else None,
            "gemm_tflops_alone": round(gflop / alone_us * 1e3, 2)}


def markdown(doc: dict[str, Any]) -> str:
    kinds = ("wino_filter", "wino_input", "wino_dy", "gemm", "wino_output", "wino_filter_grad")
    what = doc.get("what", "VGG-16 b64, 64 MiB and unbounded plans")
    md = [md_header(f"Winograd calls kernel by kernel: {what}", doc["provenance"]), "",
          "FP32 strict NCHW.  ms: event-timed calls back to back, replayed from a CUDA graph of one call as "
          "channel_wr executes plans (layer = the plan's calls of its micro-batch; eager: the same call launched "
          "from Python).  Kernel columns: device us a replayed call summed over its kernels of that kind (count in "
          "brackets; kernels on different streams overlap, so they can sum past the call).  busy: the union of "
          "kernel intervals a call; span: first start to last end.  GEMM TFLOPS: the call's GEMM arithmetic over "
          "its GEMM kernels' summed time, against one full chunk's cuBLAS call alone.", "",
          "| layer / op | plan | algorithm | MiB | ms layer | ms call (eager) | " + " | ".join(kinds) +
          " | busy / span us | GEMM TFLOPS in call / alone |",
          "|---|---|---|---:|---:|---:|" + "---:|" * len(kinds) + "---:|---:|"]
    for r in doc["rows"]:
        cells = []
        for k in kinds:
            v = r["kinds"].get(k)
            cells.append(f"{v['us']:.0f} ({v['count']:.0f})" if v else "-")
        md.append(f"| {r['layer']} {r['op']} | {r['plan']} | {r['micro_batch']} x {r['algo']} | {r['workspace_mib']} "
                  f"| {r['ms_layer']} | {r['ms_call']} ({r['ms_call_eager']}) | " + " | ".join(cells) +
                  f" | {r['busy_us']:.0f} / {r['span_us']:.0f} | {r['gemm_tflops_in_call']} / "
                  f"{r['gemm_tflops_alone']} |")
    return "\n".join(md)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--name", default=None, help="results file name (default wino_profile-<network>)")
    ap.add_argument("--from-results", default=None, metavar="JSON",
                    help="profile the winograd plans of a channel_wr report's short kernels instead")
    ap.add_argument("--limit", default="64MiB", help="with --from-results: the report's limit to read")
    args = ap.parse_args()
    import json

    import cupy as cp

    from ucudnn.units import parse_size

    if args.from_results:
        src = json.loads(Path(args.from_results).read_text())
        todo = configs_from_results(src, parse_size(args.limit, "--limit"))
        what = (f"{src['network']} b{src['batch']} {src['dtype']} {src['layout']}, the short kernels' plans at "
                f"{args.limit} and unbounded ({Path(args.from_results).name})")
        name = args.name or f"wino_profile-{src['network']}"
    else:
        todo = [(layer, op, problem(layer, mb), mb, calls, algo, plan) for layer, op, mb, calls, algo, plan in CONFIGS]
        what, name = "VGG-16 b64, 64 MiB and unbounded plans", args.name or "wino_profile-vgg16"
    from ucudnn.kernels.winograd import Geometry

    # one workspace for every configuration: the largest any of them touches
    ws_bytes = max(workspace_of(Geometry.of(p, op), config_of(algo), mb) for _, op, p, mb, _, algo, _ in todo)
    ws = cp.cuda.alloc(ws_bytes)
    rows = []
    for layer, op, p, mb, calls, algo, plan in todo:
        row = {"plan": plan, **measure(layer, op, p, mb, calls, algo, ws, ws_bytes)}
        print(row, flush=True)
        rows.append(row)
    doc = {"provenance": provenance(), "what": what, "rows": rows}
    write(args.out, name, doc, markdown(doc))


if __name__ == "__main__":
    main()
