"""Issue 18 diagnosis: three levers for the winograd source's backward filter under a tight workspace limit, each
timed with and without it in one process, to say which of them moves WR's fraction of unbounded speed.

Why backward filter: at 64 MiB per kernel VGG-16 b64 loses most to it (conv1_2 5.95 vs 4.95 ms unbounded, conv4_2
1.98 vs 1.53, conv3_2 2.22 vs 1.78: ``channel_wr_vgg16-b64-float32-NCHW-strict-winograd-groups-replay.md``), and
its chunk GEMMs (dU[xi] (Co x Ci) += Z[xi] V[xi]^T, the chunk's tiles reduced) make only Co x Ci outputs a point:
cuBLAS runs VGG's 64 x 64 on 32 x 32 tiles, 144 blocks a GEMM.

The levers (FP32 strict, NCHW, every configuration as the source prepares it, or composed from its launchers):

- ``streams``: chunks over 1-8 streams (the source measures 1-3; more are offered here by widening
  ``transform_workspace.STREAMS`` in this process), the best chunk a stream count fits under the limit, with point
  groups;
- ``splitk``: each chunk's GEMM split along its tiles into S parts (S = 2, 4, 8), each adding into its own copy of dU
  (the inverse transform sums streams x S copies), composed from the source's launchers: part s of a chunk's tiles
  transformed into its own V / Z (S launches of the transforms), one GEMM of 36 x S products; at the configuration
  the limit's plan runs and at the unbounded plan's (both checked against the unsplit call).  This measurement is
  why the source now splits reductions itself (``-kS``: one transform launch storing every part, so short chunks do
  not pay S launches; ``channel_wr_*-winograd-ksplit-replay.md``);
- ``chunkcap``: calls of up to 256 chunks (the source measures at most ``MAX_CHUNKS`` = 64 a call, smaller
  micro-batches past that), the largest chunk that fits for each micro-batch, stream count and point group count.

    python benchmarks/wino_bwf_levers.py --out benchmarks/results
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import md_header, provenance, write  # noqa: E402
from wino_chunks import LAYERS  # noqa: E402

MiB = 1 << 20
#: layer -> (micro-batch, tiles, streams) of the configuration WR's 64 MiB and unbounded plans ran on the H200
#: (the recorded VGG-16 / ResNet-50 tables); the split-K lever is timed at both
PLANNED = {"vgg16-conv1_2": ((16, 896, 3), (64, 3584, 3)), "vgg16-conv2_1": ((64, 704, 3), (64, 1568, 3)),
           "vgg16-conv2_2": ((32, 448, 3), (64, 1568, 3)), "vgg16-conv3_2": ((64, 320, 2), (64, 784, 3)),
           "resnet50-layer1-conv2": ((128, 1152, 3), (128, 3136, 3))}
LAYERS = {**LAYERS, "resnet50-layer1-conv2": (128, 64, 56, 64)}


def problem(name: str, n: int | None = None) -> Any:
    from ucudnn.problem import ConvProblem

    b, c, h, k = LAYERS[name]
    return ConvProblem(n=n or b, c=c, h=h, w=h, k=k, r=3, s=3, pad=(1, 1), stride=(1, 1), dtype="float32",
                       layout="NCHW")


def timed(fn: Callable[[], None], reps: int = 12) -> float:
    """ms per call: 3 warm-up calls, then ``reps`` back to back between events."""
    import cupy as cp

    for _ in range(3):
        fn()
    cp.cuda.Device().synchronize()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) / reps


class Bench:
    """One layer's operands at a micro-batch, a workspace, and the source's backward-filter launch of a config."""

    def __init__(self, name: str, ws_bytes: int) -> None:
        import cupy as cp

        self.name, self.cp = name, cp
        self.ws_bytes = ws_bytes
        self.ws = cp.cuda.alloc(ws_bytes)
        self._ops: dict[int, Any] = {}

    def operands(self, mb: int) -> Any:
        if mb not in self._ops:
            p = problem(self.name, mb)
            x, dy = (self.cp.random.standard_normal(s, dtype=self.cp.float32)
                     for s in p.operand_shapes("backward_filter")[:2])
            self._ops[mb] = (p, x, dy, self.cp.empty(p.operand_shapes("backward_filter")[2], self.cp.float32))
        return self._ops[mb]

    def source_call(self, mb: int, tiles: int, streams: int, groups: int = 1) -> tuple[float, Any]:
        """(ms per micro-batch call, dw) of the source's configuration."""
        from ucudnn.measure.sources.base import Operands
        from ucudnn.measure.sources.winograd import WinogradSource
        from ucudnn.planning.table import Measurement

        p, x, dy, dw = self.operands(mb)
        info = {"tiles": tiles, "streams": streams, **({"groups": groups} if groups > 1 else {})}
        cfg = Measurement(mb, f"wino-f4-t{tiles}", "FMA", 0.0, 0, "winograd", None, {"winograd": info})
        launch = WinogradSource().prepare("backward_filter", p, cfg)
        ops = Operands(x.data.ptr, dy.data.ptr, dw.data.ptr)
        ms = timed(lambda: launch(ops, self.ws.ptr, self.ws_bytes, 1.0, 0.0))
        launch(ops, self.ws.ptr, self.ws_bytes, 1.0, 0.0)
        return ms, dw.copy()


def splitk_launch(p: Any, tiles: int, streams: int, split: int) -> tuple[Callable[[int, int, int, int], None], int]:
    """Backward filter with each chunk's GEMM split along its tiles into ``split`` parts, composed from the source's
    launchers: ``(launch(x, dy, dw, workspace), workspace bytes)``; the dU copies of all streams first (streams x
    split, contiguous), then each stream's V and Z (part s of a chunk at s x its size)."""
    import cupy as cp

    from ucudnn.binding import cublas
    from ucudnn.kernels import winograd as kw
    from ucudnn.kernels.mec import Gemm
    from ucudnn.measure.sources.streams import StreamSet

    geo = kw.Geometry.of(p, "backward_filter")
    co, ci = geo.co, geo.ci
    ranges = geo.ranges(p.n, 0, tiles)
    if any(count % split for _, count in ranges):
        raise ValueError(f"a chunk of {p.n}-image call in {tiles}-tile chunks does not split in {split}")
    input_, dy_, grad_ = kw.backward_filter_launchers(geo)
    u_bytes = kw.POINTS * co * ci * 4
    du_all = streams * split * u_bytes
    per_stream = kw.POINTS * (ci + co) * tiles * 4
    consts = np.array([1.0, 0.0], np.float32)
    ctype, dtype = cublas.COMPUTE_TYPES["32F_PEDANTIC"], cublas.DATA_TYPES["float32"]

    def gemm_for(count: int, accumulate: bool) -> Callable[[int, dict[str, int]], None]:
        ts = count // split
        cm = Gemm(a="M", b="V", c="U", m=co, n=ci, k=ts, lda=ts, ldb=ts, ldc=ci, stride_a=co * ts, stride_b=ci * ts,
                  stride_c=co * ci, batch=kw.POINTS * split, trans_b=True).column_major()
        ta, tb = cublas.OPERATIONS[cm["transa"]], cublas.OPERATIONS[cm["transb"]]
        beta = consts.ctypes.data + (0 if accumulate else 4)

        def call(h: int, bufs: dict[str, int]) -> None:
            cublas.gemm_strided_batched(h, ta, tb, cm["m"], cm["n"], cm["k"], consts.ctypes.data, bufs[cm["A"][0]],
                                        dtype, cm["lda"], cm["strideA"], bufs[cm["B"][0]], dtype, cm["ldb"],
                                        cm["strideB"], beta, bufs[cm["C"][0]], dtype, cm["ldc"], cm["strideC"],
                                        cm["batchCount"], ctype)
        return call

    steps = [(t0, count, i % streams, gemm_for(count, i >= streams)) for i, (t0, count) in enumerate(ranges)]
    parts = min(streams, len(ranges)) * split
    fan = StreamSet(cp, streams) if streams > 1 else None

    def launch(x: int, dy: int, dw: int, ws: int) -> None:
        main = cp.cuda.get_current_stream()
        if fan is None:
            handles, ptrs = [cublas.handle()], [main.ptr]
            cublas.bind(handles[0], main.ptr)
        else:
            ptrs, handles = [st.ptr for st in fan.fork(main)], fan.handles
        for t0, count, k, gemm in steps:
            v = ws + du_all + k * per_stream
            z = v + kw.POINTS * ci * tiles * 4
            ts = count // split
            for s in range(split):
                input_(x, v + s * kw.POINTS * ci * ts * 4, t0 + s * ts, ts, ptrs[k])
                dy_(dy, z + s * kw.POINTS * co * ts * 4, t0 + s * ts, ts, ptrs[k])
            gemm(handles[k], {"U": ws + k * split * u_bytes, "V": v, "M": z})
        if fan is not None:
            fan.join(main)
        grad_(ws, dw, 1.0, 0.0, parts, kw.POINTS * co * ci)

    return launch, du_all + streams * per_stream


def lever_streams(bench: Bench, limit: int) -> dict[str, Any]:
    """Best ms per batch under ``limit`` for each stream count 1-8 (largest fitting chunk per micro-batch / groups)."""
    from ucudnn.kernels import winograd as kw

    base = problem(bench.name)
    geo = kw.Geometry.of(base, "backward_filter")
    best: dict[int, Any] = {}
    for div in (1, 2, 4):
        mb = base.n // div
        for streams in (1, 2, 3, 4, 6, 8):
            for groups in (1, 2, 3):
                fit = [t for t in range(64, mb * geo.tiles_per_image + 1, 64)
                       if geo.workspace_bytes(0, t, 1, streams, groups) <= limit]
                if not fit or len(geo.ranges(mb, 0, max(fit))) < streams:
                    continue
                t = max(fit)
                ms = bench.source_call(mb, t, streams, groups)[0] * div
                if streams not in best or ms < best[streams]["ms"]:
                    best[streams] = {"ms": round(ms, 4), "micro_batch": mb, "tiles": t, "groups": groups,
                                     "chunks": len(geo.ranges(mb, 0, t))}
    return {str(k): v for k, v in sorted(best.items())}


def lever_splitk(bench: Bench) -> list[dict[str, Any]]:
    """The limit's and the unbounded plan's configuration unsplit and with split GEMMs (ms per batch, workspace,
    relative difference of dw against the unsplit call)."""
    from ucudnn.kernels import winograd as kw

    out = []
    for which, (mb, tiles, streams) in zip(("64 MiB plan", "unbounded plan"), PLANNED[bench.name]):
        p, x, dy, _ = bench.operands(mb)
        scale = problem(bench.name).n // mb
        ms, ref = bench.source_call(mb, tiles, streams)
        geo = kw.Geometry.of(p, "backward_filter")
        row: dict[str, Any] = {"config": which, "micro_batch": mb, "tiles": tiles, "streams": streams,
                               "S1": {"ms": round(ms * scale, 4),
                                      "MiB": round(geo.workspace_bytes(0, tiles, 1, streams) / MiB, 2)}}
        for split in (2, 4, 8):
            try:
                launch, need = splitk_launch(p, tiles, streams, split)
            except ValueError as e:
                row[f"S{split}"] = str(e)
                continue
            dw = bench.cp.empty_like(ref)
            launch(x.data.ptr, dy.data.ptr, dw.data.ptr, bench.ws.ptr)
            err = float(bench.cp.abs(dw - ref).max() / bench.cp.abs(ref).max())
            ms = timed(lambda: launch(x.data.ptr, dy.data.ptr, dw.data.ptr, bench.ws.ptr))
            row[f"S{split}"] = {"ms": round(ms * scale, 4), "MiB": round(need / MiB, 2), "rel_diff": err}
        out.append(row)
    return out


def lever_chunkcap(bench: Bench, limit: int, cap: int = 256) -> dict[str, Any]:
    """The best configuration under ``limit`` with at most MAX_CHUNKS chunks a call against at most ``cap``."""
    from ucudnn.kernels import winograd as kw
    from ucudnn.measure.sources.winograd import MAX_CHUNKS

    base = problem(bench.name)
    geo = kw.Geometry.of(base, "backward_filter")
    rows = []
    for div in (1, 2, 4, 8):
        mb = base.n // div
        sizes = sorted({c * geo.tiles_per_image for c in kw.chunk_sizes(mb)} | set(kw.tile_chunk_sizes(geo, mb)))
        for streams in (1, 2, 3):
            for groups in (1, 2, 3, 4):
                fit = [t for t in sizes if geo.workspace_bytes(0, t, 1, streams, groups) <= limit
                       and (groups == 1 or t >= kw.TILE_CHUNK_ALIGN)]
                for t in sorted(fit, reverse=True)[:2]:
                    n = len(geo.ranges(mb, 0, t))
                    if n > cap or n < streams:
                        continue
                    ms = bench.source_call(mb, t, streams, groups)[0] * div
                    rows.append({"ms": round(ms, 4), "micro_batch": mb, "tiles": t, "streams": streams,
                                 "groups": groups, "chunks": n})
    within = [r for r in rows if r["chunks"] <= MAX_CHUNKS]
    return {"max_chunks": min(within, key=lambda r: r["ms"]) if within else None,
            f"up_to_{cap}": min(rows, key=lambda r: r["ms"]) if rows else None, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", default=",".join(PLANNED))
    ap.add_argument("--limit", default="64MiB")
    ap.add_argument("--levers", default="streams,splitk,chunkcap")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()

    from ucudnn.kernels import transform_workspace, winograd as kw
    from ucudnn.units import parse_size

    limit = parse_size(args.limit, "--limit")
    transform_workspace.STREAMS = kw.STREAMS = (1, 2, 3, 4, 5, 6, 8)   # the streams lever offers more than the source
    levers = args.levers.split(",")
    doc: dict[str, Any] = {"provenance": provenance(), "limit_bytes": limit, "layers": {}}
    bench_ws = 512 * MiB
    for name in args.layers.split(","):
        bench = Bench(name, bench_ws)
        entry: dict[str, Any] = {}
        if "streams" in levers:
            entry["streams"] = lever_streams(bench, limit)
        if "splitk" in levers and name in PLANNED:
            entry["splitk"] = lever_splitk(bench)
        if "chunkcap" in levers:
            entry["chunkcap"] = lever_chunkcap(bench, limit)
        doc["layers"][name] = entry
        print(name, {k: (v if k != "chunkcap" else {kk: vv for kk, vv in v.items() if kk != "rows"})
                     for k, v in entry.items()}, flush=True)
        del bench

    md = [md_header(f"Winograd backward filter under {args.limit}: three levers", doc["provenance"]), ""]
    md.append("ms per batch (the layer's batch: VGG-16 b64, ResNet-50 b128), FP32 strict NCHW, event-timed eager calls "
              "back to back; each lever with and without it in this one process.\n")
    if "streams" in levers:
        md += ["## Chunks over more streams (best configuration under the limit per stream count)", "",
               "| layer | 1 | 2 | 3 | 4 | 6 | 8 |", "|---|---:|---:|---:|---:|---:|---:|"]
        for name, e in doc["layers"].items():
            s = e["streams"]
            md.append(f"| {name} | " + " | ".join(str(s.get(str(k), {}).get("ms", "-")) for k in (1, 2, 3, 4, 6, 8))
                      + " |")
    if "splitk" in levers:
        md += ["", "## Split GEMMs (S copies of dU a stream), at the 64 MiB plan's and the unbounded plan's "
               "configuration", "", "| layer | config | S1 ms (MiB) | S2 | S4 | S8 | max rel. diff |",
               "|---|---|---:|---:|---:|---:|---:|"]
        for name, e in doc["layers"].items():
            for r in e.get("splitk", []):
                cells = [f"{r['S1']['ms']} ({r['S1']['MiB']})"]
                diffs = []
                for s in (2, 4, 8):
                    v = r.get(f"S{s}")
                    cells.append(f"{v['ms']} ({v['MiB']})" if isinstance(v, dict) else "-")
                    if isinstance(v, dict):
                        diffs.append(v["rel_diff"])
                worst = f"{max(diffs):.1e}" if diffs else "-"
                md.append(f"| {name} | {r['config']}: {r['micro_batch']} x t{r['tiles']}-p{r['streams']} | "
                          + " | ".join(cells) + f" | {worst} |")
    if "chunkcap" in levers:
        md += ["", "## Calls of up to 256 chunks", "", "| layer | at most 64 chunks: ms (config) | up to 256 | gain |",
               "|---|---|---|---:|"]
        for name, e in doc["layers"].items():
            a, b = e["chunkcap"]["max_chunks"], e["chunkcap"]["up_to_256"]
            if a and b:
                cfg = "{micro_batch} x t{tiles}-p{streams}-g{groups} ({chunks} chunks)"
                md.append(f"| {name} | {a['ms']} ({cfg.format(**a)}) | {b['ms']} ({cfg.format(**b)}) | "
                          f"{a['ms'] / b['ms']:.3f}x |")
    write(args.out, f"wino_bwf_levers-{args.limit}", doc, "\n".join(md))


if __name__ == "__main__":
    main()
