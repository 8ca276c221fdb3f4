"""Issue 18 diagnosis: where an ``fft`` configuration's time goes -- filter DFT, input DFTs, complex GEMMs, inverse
DFTs -- on the layers where cuDNN's FFT wins unbounded, and what the GEMM could take with cuBLAS's other complex
products: ``CUBLAS_COMPUTE_32F_PEDANTIC`` (what the source runs under ``strict``), ``CUBLAS_COMPUTE_32F`` (FP32, the
library free to reorder) and ``cublasCgemm3mStridedBatched`` (Gauss's three real products a complex one, FP32).

For each layer, op, tile size and chunk size: every kernel kind timed alone over the call's chunks (CUDA events,
back to back), the whole call as the source launches it, and the three GEMMs' TFLOPS (4 real multiply-adds a complex
one, whichever product ran).  Every GEMM's result is compared with the pedantic one (largest relative difference).

    python benchmarks/fft_profile.py --out benchmarks/results
"""
from __future__ import annotations

import argparse
import ctypes
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import md_header, provenance, write  # noqa: E402
from wino_bwf_levers import timed  # noqa: E402

MiB = 1 << 20
#: (batch, C, H=W, K, R=S, pad) of public layers where cuDNN's FFT is the unbounded winner: AlexNet (the shipped,
#: original one) conv2, torchvision AlexNet conv2, Inception-v3 Mixed_5b's 5x5 (b64), SRCNN's 5x5 (b64, 96x96)
LAYERS = {"alexnet-conv2": (256, 96, 27, 256, 5, 2), "tv-alexnet-conv2": (256, 64, 27, 192, 5, 2),
          "inception-5b-5x5": (64, 48, 35, 64, 5, 2), "srcnn-conv3": (64, 32, 96, 1, 5, 2)}


def problem(name: str) -> Any:
    from ucudnn.problem import ConvProblem

    n, c, h, k, r, pad = LAYERS[name]
    return ConvProblem(n=n, c=c, h=h, w=h, k=k, r=r, s=r, pad=(pad, pad), stride=(1, 1), dtype="float32",
                       layout="NCHW")


def same(new: Callable[[int], None], old: Callable[[int], None], geo: Any, tiles: int, channels: int) -> bool:
    """Whether two input transforms of one chunk write the same V (bit for bit: the same arithmetic)."""
    import cupy as cp

    a, b = (cp.full((geo.f, channels, tiles), cp.nan, cp.complex64) for _ in range(2))
    new(a.data.ptr)
    old(b.data.ptr)
    return bool(cp.array_equal(a, b))


_gemm3m: Any = None


def gemm3m() -> Any:
    """cublasCgemm3mStridedBatched through ctypes on the libcublas ucudnn's binding loaded."""
    global _gemm3m
    if _gemm3m is None:
        from ucudnn.binding.cublas import load

        f = load("libcublas").cublasCgemm3mStridedBatched
        vp, i, ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
        f.argtypes = [vp, i, i, i, i, i, vp, vp, i, ll, vp, i, ll, vp, vp, i, ll, i]
        f.restype = i
        _gemm3m = f
    return _gemm3m


def old_input(old_src: str | None, geo: Any, channels: int, window: tuple[int, int], origin: tuple[int, int],
              bounds: tuple[int, int], strides: tuple[int, ...], kind: str = "input") -> Any:
    """``fft_input`` (``kind="output"``: ``fft_output``) of an earlier ``kernels/fft.cu`` (``--old-source``),
    launched as the source launches its own (``kernels.fft._tile_launches``), or None."""
    if old_src is None:
        return None
    import cupy as cp

    from ucudnn.kernels import _compile
    from ucudnn.kernels.fft import _tile_launches, tiles_per_block

    name = f"fft_{kind}<{geo.ts},{tiles_per_block(geo.ts)}>"
    kernel = cp.RawModule(code=old_src, options=_compile.OPTIONS, name_expressions=[name]).get_function(name)
    return _tile_launches(geo, kernel, channels, window, origin, bounds, strides, kind == "output")


def old_grad(old_src: str | None, geo: Any) -> Any:
    """``fft_filter_grad`` of ``--old-source``, launched as ``kernels.fft.backward_filter_launchers`` launches its
    own, as ``grad(Gc, dw, alpha, beta, stream)``, or None."""
    if old_src is None:
        return None
    import cupy as cp
    import numpy as np

    from ucudnn.kernels import _compile
    from ucudnn.kernels._compile import F32, PTR

    name = f"fft_filter_grad<{geo.ts}>"
    kernel = cp.RawModule(code=old_src, options=_compile.OPTIONS, name_expressions=[name]).get_function(name)
    count = geo.co * geo.ci * geo.r
    grad = _compile.packed(kernel, (-(-count // 256),), (256,), (PTR, PTR) + (
        np.int32(geo.co), np.int32(geo.ci), np.int32(geo.r), np.int32(geo.s)) + tuple(
        np.int64(v) for v in geo.filter_strides) + (F32, F32, np.int32(1), np.int64(0)))
    return lambda Gc, dw, alpha, beta, stream: grad(Gc, dw, alpha, beta, stream=stream)


def profile(name: str, op: str, ts: int, tiles: int | None, reps: int, old_src: str | None = None) -> dict[str, Any]:
    import cupy as cp

    from ucudnn.binding import cublas
    from ucudnn.kernels.fft import Geometry, backward_filter_launchers, launchers
    from ucudnn.measure.sources.base import Operands
    from ucudnn.measure.sources.fft import _CONSTANTS, _launch

    p = problem(name)
    geo = Geometry.of(p, op, ts)
    total = p.n * geo.tiles_per_image
    t = total if tiles is None else min(tiles, total)
    ranges = geo.ranges(p.n, t)
    need = geo.workspace_bytes(t)
    ws = cp.cuda.alloc(need)
    base = ws.ptr
    bufs = {nm: base + off for nm, off, _ in geo.segments(t)}
    x = cp.random.standard_normal((p.n, p.c, p.h, p.w), dtype=cp.float32)
    y = cp.random.standard_normal((p.n, p.k, p.p, p.q), dtype=cp.float32)
    w = cp.random.standard_normal((p.k, p.c, p.r, p.s), dtype=cp.float32)
    h = cublas.handle()
    stream = cp.cuda.get_current_stream().ptr
    cublas.bind(h, stream)
    row: dict[str, Any] = {"layer": name, "op": op, "ts": ts, "tiles": t, "chunks": len(ranges),
                           "workspace_mib": round(need / MiB, 2), "F": geo.f, "tiles_per_image": geo.tiles_per_image}
    bwf = op == "backward_filter"
    if bwf:
        input_, dy_, grad_ = backward_filter_launchers(geo)
        row["filter_ms"] = timed(lambda: grad_(bufs["U"], w.data.ptr, 1.0, 0.0, stream), reps)
        row["input_ms"] = timed(lambda: [input_(x.data.ptr, bufs["V"], t0, c, stream) for t0, c in ranges], reps)
        row["output_ms"] = timed(lambda: [dy_(y.data.ptr, bufs["M"], t0, c, stream) for t0, c in ranges], reps)
        old = old_input(old_src, geo, geo.ci, (geo.ts, geo.ts), (-geo.pad[0], -geo.pad[1]), (geo.hi, geo.wi),
                        geo.in_strides)
        old_dy = old_input(old_src, geo, geo.co, (geo.mh, geo.mw), (0, 0), (geo.ho, geo.wo), geo.out_strides)
        grad_old = old_grad(old_src, geo)
        if old is not None:
            row["old_filter_ms"] = timed(lambda: grad_old(bufs["U"], w.data.ptr, 1.0, 0.0, stream), reps)
            wa, wb = cp.full_like(w, cp.nan), cp.full_like(w, cp.nan)
            grad_(bufs["U"], wa.data.ptr, 1.0, 0.0, stream)
            grad_old(bufs["U"], wb.data.ptr, 1.0, 0.0, stream)
            row["old_grad_equal"] = bool(cp.array_equal(wa, wb))
            row["old_input_ms"] = timed(lambda: [old(t0, c)(x.data.ptr, bufs["V"], stream=stream) for t0, c in ranges],
                                        reps)
            row["old_output_ms"] = timed(lambda: [old_dy(t0, c)(y.data.ptr, bufs["M"], stream=stream)
                                                  for t0, c in ranges], reps)
            row["old_equal"] = same(lambda b: input_(x.data.ptr, b, 0, ranges[0][1], stream),
                                    lambda b: old(0, ranges[0][1])(x.data.ptr, b, stream=stream), geo, ranges[0][1],
                                    geo.ci) and same(lambda b: dy_(y.data.ptr, b, 0, ranges[0][1], stream),
                                                     lambda b: old_dy(0, ranges[0][1])(y.data.ptr, b, stream=stream),
                                                     geo, ranges[0][1], geo.co)
        ops = Operands(x.data.ptr, y.data.ptr, w.data.ptr)
    else:
        filter_, input_, output_ = launchers(geo)
        src, dst, wt = (x, y, w) if op == "forward" else (y, x, w)
        row["filter_ms"] = timed(lambda: filter_(wt.data.ptr, bufs["U"], stream), reps)
        row["input_ms"] = timed(lambda: [input_(src.data.ptr, bufs["V"], t0, c, stream) for t0, c in ranges], reps)
        row["output_ms"] = timed(lambda: [output_(bufs["M"], dst.data.ptr, t0, c, 1.0, 0.0, stream)
                                          for t0, c in ranges], reps)
        old = old_input(old_src, geo, geo.ci, (geo.ts, geo.ts), (-geo.pad[0], -geo.pad[1]), (geo.hi, geo.wi),
                        geo.in_strides)
        if old is not None:
            row["old_input_ms"] = timed(lambda: [old(t0, c)(src.data.ptr, bufs["V"], stream=stream)
                                                 for t0, c in ranges], reps)
            row["old_equal"] = same(lambda b: input_(src.data.ptr, b, 0, ranges[0][1], stream),
                                    lambda b: old(0, ranges[0][1])(src.data.ptr, b, stream=stream), geo,
                                    ranges[0][1], geo.ci)
            old_out = old_input(old_src, geo, geo.co, (0, 0), (0, 0), (geo.ho, geo.wo), geo.out_strides, "output")
            row["old_output_ms"] = timed(lambda: [old_out(t0, c)(bufs["M"], dst.data.ptr, 1.0, 0.0, stream=stream)
                                                  for t0, c in ranges], reps)
            # y from one M by both inverse transforms: the same arithmetic, so the same bits
            ya, yb = cp.full_like(dst, cp.nan), cp.full_like(dst, cp.nan)
            for t0, c in ranges:
                output_(bufs["M"], ya.data.ptr, t0, c, 1.0, 0.0, stream)
                old_out(t0, c)(bufs["M"], yb.data.ptr, 1.0, 0.0, stream=stream)
            row["old_equal"] = row["old_equal"] and bool(cp.array_equal(ya, yb))
        ops = Operands(wt.data.ptr, src.data.ptr, dst.data.ptr) if op == "backward_data" else \
            Operands(src.data.ptr, wt.data.ptr, dst.data.ptr)
    # the GEMMs over the call's chunks: the source's (pedantic), plain 32F, and 3M
    dtype = cublas.COMPLEX_TYPES["complex64"]
    alpha = _CONSTANTS.ctypes.data
    beta0 = _CONSTANTS.ctypes.data + 8
    # each distinct chunk size's GEMM once, with how many chunks of that size the call runs
    calls = [(geo.gemm(c), times) for c, times in sorted(Counter(c for _, c in ranges).items())]
    flops = sum(8 * gm.m * gm.n * gm.k * gm.batch * times for gm, times in calls)

    def ex(compute: str) -> Callable[[], None]:
        ctype = cublas.COMPUTE_TYPES[compute]

        def run() -> None:
            for gm, times in calls:
                for _ in range(times):
                    cublas.gemm_strided_batched(h, cublas.OPERATIONS[gm.transa], cublas.OPERATIONS[gm.transb], gm.m,
                                                gm.n, gm.k, alpha, bufs[gm.a], dtype, gm.lda, gm.stride_a, bufs[gm.b],
                                                dtype, gm.ldb, gm.stride_b, beta0, bufs[gm.c], dtype, gm.ldc,
                                                gm.stride_c, gm.batch, ctype)
        return run

    def three_m() -> Callable[[], None]:
        f = gemm3m()

        def run() -> None:
            for gm, times in calls:
                for _ in range(times):
                    st = f(h, cublas.OPERATIONS[gm.transa], cublas.OPERATIONS[gm.transb], gm.m, gm.n, gm.k, alpha,
                           bufs[gm.a], gm.lda, gm.stride_a, bufs[gm.b], gm.ldb, gm.stride_b, beta0, bufs[gm.c],
                           gm.ldc, gm.stride_c, gm.batch)
                    if st != 0:
                        raise RuntimeError(f"cublasCgemm3mStridedBatched status {st}")
        return run

    # fill V / M / U with one real chunk's spectra so the products compare meaningfully
    if bwf:
        input_(x.data.ptr, bufs["V"], 0, ranges[0][1], stream)
        dy_(y.data.ptr, bufs["M"], 0, ranges[0][1], stream)
    else:
        filter_(wt.data.ptr, bufs["U"], stream)
        input_(src.data.ptr, bufs["V"], 0, ranges[0][1], stream)
    gm0 = geo.gemm(ranges[0][1])
    out_elems = gm0.stride_c * gm0.batch
    results = {}
    for label, fn in (("pedantic", ex("32F_PEDANTIC")), ("32F", ex("32F")), ("3m", three_m())):
        try:
            row[f"gemm_{label}_ms"] = timed(fn, reps)
            row[f"gemm_{label}_tflops"] = round(flops / row[f"gemm_{label}_ms"] / 1e9, 1)
            fn()
            cp.cuda.Device().synchronize()
            c_ptr = bufs[gm0.c]
            mem = cp.cuda.UnownedMemory(c_ptr, out_elems * 8, ws)
            results[label] = cp.ndarray((out_elems,), cp.complex64, cp.cuda.MemoryPointer(mem, 0)).copy()
        except Exception as e:  # noqa: BLE001 - a product cuBLAS refuses is a row, not a crash
            row[f"gemm_{label}_error"] = str(e)[:200]
    if "pedantic" in results:
        ref = results["pedantic"]
        scale = float(cp.abs(ref).max()) or 1.0
        for label in ("32F", "3m"):
            if label in results:
                row[f"gemm_{label}_rel_diff"] = float(cp.abs(results[label] - ref).max()) / scale
    launch = _launch(p, op, ts, None if t >= total else t, "32F_PEDANTIC")
    row["call_ms"] = timed(lambda: launch(ops, base, need, 1.0, 0.0), reps)
    row["parts_ms"] = row["filter_ms"] + row["input_ms"] + row["output_ms"] + row.get("gemm_pedantic_ms", 0.0)
    del ws
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", default=",".join(LAYERS))
    ap.add_argument("--ops", default="forward,backward_data,backward_filter")
    ap.add_argument("--tiles", default="18,32", help="tile sizes")
    ap.add_argument("--chunks", default="0,64,256,1024", help="tiles a chunk (0: the whole call in one chunk)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--old-source", help="an earlier kernels/fft.cu: its transforms timed beside this tree's")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--name", default="fft_profile")
    args = ap.parse_args()
    old_src = None
    if args.old_source:
        from ucudnn.kernels import _compile

        old_src = _compile.expand_includes(Path(args.old_source).read_text())
    rows = []
    for name in args.layers.split(","):
        for op in args.ops.split(","):
            for ts in (int(v) for v in args.tiles.split(",")):
                for c in (int(v) for v in args.chunks.split(",")):
                    try:
                        row = profile(name, op, ts, c or None, args.reps, old_src)
                    except Exception as e:  # noqa: BLE001
                        row = {"layer": name, "op": op, "ts": ts, "tiles": c, "error": str(e)[:300]}
                    print(row, flush=True)
                    rows.append(row)
    cols = ["layer", "op", "ts", "tiles", "chunks", "workspace_mib", "call_ms", "filter_ms", "old_filter_ms",
            "input_ms", "old_input_ms", "output_ms", "old_output_ms", "old_equal", "old_grad_equal",
            "gemm_pedantic_ms", "gemm_pedantic_tflops", "gemm_32F_ms", "gemm_32F_tflops", "gemm_3m_ms",
            "gemm_3m_tflops", "gemm_3m_rel_diff"]
    lines = [md_header("fft configurations kernel by kernel (issue 18 diagnosis)", provenance()),
        "Each kind of kernel timed alone over the call's chunks (ms a call, CUDA events); `call_ms` the source's "
        "launch as WR runs it. GEMM TFLOPS count 8 real flops a complex multiply-add whichever product ran "
        "(3M does three real products instead of four). `old_*`: the input and inverse transforms (backward filter: "
        "the dy transform, in `output_ms`, and the inverse, in `filter_ms`) of `--old-source` on the same chunks; "
        "`old_equal` / `old_grad_equal`: both wrote the same V (and "
        "y) / dw bit for bit.",
        "",
        "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['layer']} | {r['op']} | {r['ts']} | {r['tiles']} | error: {r['error'][:80]} |")
            continue
        lines.append("| " + " | ".join(
            (f"{r.get(c):.4g}" if isinstance(r.get(c), float) else str(r.get(c, ""))) for c in cols) + " |")
    write(args.out, args.name, {"rows": rows, "provenance": provenance()}, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
