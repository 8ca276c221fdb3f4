"""Issue 18 diagnosis: where a chunked winograd call spends its time, per chunk size.

The winograd source's configurations that fit 64 MiB run a micro-batch in chunks of tiles, and a chunked call is
1.3-1.45x the one-chunk call of the same layer even replayed from a CUDA graph (``channel_wr_*-winograd-replay.md``);
``table_ablation_winograd-chunk-penalty.md`` shows that removing three quarters of that penalty would take VGG-16
past issue 18's bar.  This script says which part of a chunk costs what, so the fix goes where the time is.

For each layer (FP32 strict, NCHW, forward; ``--layers``) and each chunk of T tiles (the largest that fits
``--limit``, then doubling up to the whole micro-batch; or, with ``--tiles``, the listed counts between half that
largest and ``--limit``): the filter transform (once a call), the input transform,
the 36 GEMMs (``cublasGemmStridedBatchedEx``, as the source runs them) and the output transform of one chunk (with
``--csplit 2,4`` also with the input channels in slices: a slice's filter, input and GEMM parts, done per slice), each
captured into a CUDA graph and timed replayed (no host cost), their sum over the call's chunks, and the whole call
as the source prepares it, eager and replayed.  With ``--lt``, also the fastest cuBLASLt algorithm for the same
strided-batched GEMM (``gemm_probe.Matmul``: every algorithm its heuristic offers within 64 MiB of its own
workspace, timed), to say how much a better GEMM choice would give.

    python benchmarks/wino_chunks.py --layers vgg16-conv4_2,vgg16-conv3_2,vgg16-conv2_2,alexnet-conv4 --lt
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import md_header, provenance, write  # noqa: E402

MiB = 1 << 20
#: name -> (batch, channels in, plane side, channels out): 3x3, padding 1, stride 1
LAYERS = {"vgg16-conv1_2": (64, 64, 224, 64), "vgg16-conv2_1": (64, 64, 112, 128),
          "vgg16-conv3_1": (64, 128, 56, 256), "vgg16-conv4_1": (64, 256, 28, 512), "vgg16-conv2_2": (64, 128, 112, 128),
          "vgg16-conv3_2": (64, 256, 56, 256), "vgg16-conv4_2": (64, 512, 28, 512),
          "vgg16-conv5_1": (64, 512, 14, 512), "alexnet-conv3": (256, 256, 13, 384),
          "alexnet-conv4": (256, 384, 13, 384), "resnet50-layer3-conv2": (128, 256, 14, 256)}


def chunk_tiles(geo, n: int, limit: int, csplit: int = 1) -> list[int]:
    """Tiles per chunk to time: the most that fit ``limit`` bytes of workspace (with the input channels in
    ``csplit`` slices), then doubling, up to the call's tiles (the one-chunk configuration); [] if not even one tile
    row fits."""
    total = n * geo.tiles_per_image
    fits = [t for t in range(geo.tiles_w, total + 1, geo.tiles_w) if geo.workspace_bytes(0, t, csplit) <= limit]
    if not fits:
        return []
    out, t = [], max(fits)
    while t < total:
        out.append(t)
        t *= 2
    return out + [total]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", default="vgg16-conv4_2,vgg16-conv3_2,vgg16-conv2_2,alexnet-conv4")
    ap.add_argument("--limit", default="64MiB", help="workspace the smallest chunk fits")
    ap.add_argument("--lt", action="store_true", help="also time cuBLASLt's best algorithm for each chunk GEMM")
    ap.add_argument("--csplit", default="1", help="input-channel slices to time, comma-separated (1, 2, 4)")
    ap.add_argument("--tiles", default=None,
                    help="time these tiles per chunk instead (comma-separated, any count: chunks are flat tile "
                         "ranges), those within --limit, and the one-chunk call")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--name", default="wino_chunks")
    args = ap.parse_args()

    import cupy as cp
    from ucudnn.kernels.winograd import Geometry, launchers

    from ucudnn.binding import cublas
    from ucudnn.binding.gpu import capture
    from ucudnn.binding.timing import time_ms
    from ucudnn.measure.benchmarking import Buffers
    from ucudnn.measure.sources.base import Operands
    from ucudnn.measure.sources.winograd import WinogradSource, _gemm_call, configuration_name
    from ucudnn.planning.table import Measurement
    from ucudnn.problem import ConvProblem
    from ucudnn.units import parse_size

    limit = parse_size(args.limit)
    compute, label = cublas.compute_type("strict", "float32")

    def replayed(fn) -> float:
        graph = capture(fn)
        return time_ms(lambda: graph.launch(cp.cuda.get_current_stream()), repeat=5, warmup=2, min_sample_ms=1.0)

    rows = []
    for name, csplit in ((nm, int(cs)) for nm in args.layers.split(",") for cs in args.csplit.split(",")):
        n, c, hw, k = LAYERS[name]
        p = ConvProblem(n, c, hw, hw, k, 3, 3, pad=(1, 1))
        geo = Geometry.of(p, "forward")
        if geo.ci % csplit:
            continue
        sizes = chunk_tiles(geo, n, limit, csplit)
        if args.tiles and sizes:
            sizes = sorted({int(t) for t in args.tiles.split(",") if sizes[0] // 2 <= int(t) < n * geo.tiles_per_image
                            and geo.workspace_bytes(0, int(t), csplit) <= limit} | {sizes[0], sizes[-1]})
        if not sizes:
            print(f"{name}: no tile chunk fits {args.limit} in {csplit} slices", flush=True)
            continue
        buf = Buffers(p)
        ops = buf.operands("forward", n)
        ws = cp.cuda.alloc(geo.workspace_bytes(0, sizes[-1], csplit))
        part = geo.slice(csplit)
        filter_, input_, _ = launchers(part)           # one slice's transforms (the whole layer's when unsplit)
        output_ = launchers(geo)[2]
        total = n * geo.tiles_per_image
        for t in sizes:
            bufs = {seg: ws.ptr + off for seg, off, _ in geo.segments(0, t, csplit)}
            gemm = _gemm_call(part, t, compute)

            def run_gemm(gemm=gemm, bufs=bufs) -> None:
                h = cublas.handle()
                cublas.bind(h, cp.cuda.get_current_stream().ptr)
                gemm(h, bufs)

            parts = {"filter": replayed(lambda bufs=bufs, f=filter_, ops=ops: f(ops.b, bufs["U"])),
                     "input": replayed(lambda bufs=bufs, t=t, f=input_, ops=ops: f(ops.a, bufs["V"], 0, t)),
                     "gemm": replayed(run_gemm),
                     "output": replayed(lambda bufs=bufs, t=t, f=output_, ops=ops: f(bufs["M"], ops.out, 0, t, 1.0,
                                                                                    0.0))}
            chunks = len(geo.tile_chunks(n, t))
            size = geo.workspace_bytes(0, t, csplit)
            extra = {"tiles": t, **({"csplit": csplit} if csplit > 1 else {})}
            config = Measurement(n, configuration_name(0, n, t, csplit=csplit), label, 0.0, size,
                                 "winograd", None, {"winograd": extra})
            launch = WinogradSource().prepare("forward", p, config)

            def whole(launch=launch, ptr=ws.ptr, size=size, ops=ops) -> None:
                launch(Operands(ops.a, ops.b, ops.out), ptr, size, 1.0, 0.0)

            eager = time_ms(whole, repeat=5, warmup=2, min_sample_ms=1.0)
            # per chunk: each slice's input transform and GEMM (and its filter transform when split), one output
            per_chunk = csplit * (parts["input"] + parts["gemm"] + (parts["filter"] if csplit > 1 else 0.0))
            row = {"layer": name, "problem": p.describe(), "csplit": csplit, "tiles": t, "chunks": chunks,
                   "one_chunk": t == total, "workspace_mib": round(size / MiB, 2),
                   **{f"{key}_ms": round(v, 4) for key, v in parts.items()},
                   # the last chunk may be short: its parts prorated by its tiles (total / t chunks in all)
                   "sum_ms": round((parts["filter"] if csplit == 1 else 0.0)
                                   + total / t * (per_chunk + parts["output"]), 4),
                   "eager_ms": round(eager, 4), "replayed_ms": round(replayed(whole), 4),
                   "gemm_tflops": round(2 * 36 * part.co * part.ci * t / (parts["gemm"] * 1e-3) / 1e12, 1)}
            if args.lt:
                row.update(lt_best(part, t, bufs))
            rows.append(row)
            print({key: v for key, v in row.items() if key != "problem"}, flush=True)
    doc = {"provenance": provenance(), "limit": limit, "rows": rows}
    md = [md_header("Chunked winograd (F(4x4, 3x3), FP32 strict, NCHW forward): time per part of a chunk",
                    doc["provenance"]),
          f"Chunks of T tiles, from the most that fit {args.limit} of workspace to the whole call (one chunk).  Parts "
          "timed captured and replayed (no host cost); sum = filter + (tiles / T) x (input + GEMM + output), the "
          "short last chunk prorated; the whole "
          "call as the source prepares it, eager and replayed." + (" cuBLASLt: its fastest algorithm for the same "
                                                                  "GEMM." if args.lt else ""), "",
          "| layer | slices | T | chunks | MiB | filter | input | GEMM (TFLOPS) | output | sum | eager | replayed |"
          + (" cuBLASLt GEMM |" if args.lt else ""),
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if args.lt else "")]
    for r in rows:
        md.append(f"| {r['layer']} | {r['csplit']} | {r['tiles']} | {r['chunks']} | {r['workspace_mib']} | "
                  f"{r['filter_ms']} | {r['input_ms']} | {r['gemm_ms']} ({r['gemm_tflops']}) | {r['output_ms']} | {r['sum_ms']} | "
                  f"{r['eager_ms']} | {r['replayed_ms']} |" + (f" {r.get('lt_gemm_ms', '-')} |" if args.lt else ""))
    write(args.out, args.name, doc, "\n".join(md) + "\n")


def lt_best(geo, t: int, bufs: dict[str, int]) -> dict:
    """The fastest cuBLASLt algorithm (of those its heuristic offers within 64 MiB) for the chunk GEMM of ``t``
    tiles, timed as the source's own call is: {"lt_gemm_ms", "lt_algorithms"} (empty where none runs)."""
    import ctypes

    import cupy as cp
    from gemm_probe import Matmul

    from ucudnn.binding.timing import time_ms

    cm = geo.gemm(0, t).column_major()
    mm = Matmul("float32", "32F_PEDANTIC", cm["transa"], cm["transb"], cm["m"], cm["n"], cm["k"], cm["lda"],
                cm["ldb"], cm["ldc"], cm["strideA"], cm["strideB"], cm["strideC"], cm["batchCount"])
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    (an, ao), (bn, bo), (cn, co) = cm["A"], cm["B"], cm["C"]
    a, b, c = bufs[an] + 4 * ao, bufs[bn] + 4 * bo, bufs[cn] + 4 * co
    lt_ws = cp.cuda.alloc(64 * MiB)
    best = None
    algos = mm.algorithms(64 * MiB)
    for algo in algos:
        st = algo.struct()
        try:
            ms = time_ms(lambda st=st: mm.run(st, ctypes.addressof(one), a, b, ctypes.addressof(zero), c, lt_ws.ptr,
                                              64 * MiB, cp.cuda.get_current_stream().ptr),
                         repeat=3, warmup=1, min_sample_ms=0.5)
        except Exception:  # noqa: BLE001, S112 - an algorithm the device refuses is skipped
            continue
        best = ms if best is None else min(best, ms)
    return {"lt_gemm_ms": None if best is None else round(best, 4), "lt_algorithms": len(algos)}


if __name__ == "__main__":
    main()
