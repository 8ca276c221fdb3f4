"""The fft source's filter transform (``fft_filter``, U = conj(DFT(w)) once per call) against an earlier version of
the kernel, compiled side by side in one process, on public layers' filters at every tile size the kernels build
(8, 12, 18, 32): microseconds per call (CUDA events, 50 calls), the largest relative difference of U, and the same
kernel with one part a column (``filter_parts`` forced to 1).

    git show b3423aa:kernels/fft.cu > old_fft.cu     # the thread-per-point kernel
    python benchmarks/fft_filter_ab.py --old-source old_fft.cu --out benchmarks/results

The old kernel is launched with its own signature (no ``parts`` argument, a thread per point of the spectrum).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import md_header, provenance, write  # noqa: E402

#: (Co, Ci, R, S) of public layers' filters: AlexNet (original and torchvision) conv2, Inception-v3 Mixed_6b's 1x7 /
#: 7x1, SRCNN's 9x9 and 5x5, GoogLeNet 3a's 5x5
LAYERS = {"alexnet-conv2": (256, 96, 5, 5), "tv-alexnet-conv2": (192, 64, 5, 5), "inception-1x7": (192, 128, 1, 7),
          "inception-7x1": (192, 128, 7, 1), "srcnn-9x9": (64, 3, 9, 9), "srcnn-5x5": (32, 64, 5, 5),
          "googlenet-5x5": (48, 16, 5, 5)}
TILES = (8, 12, 18, 32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old-source", required=True, help="an earlier kernels/fft.cu (thread-per-point fft_filter)")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--name", default="fft_filter_ab")
    args = ap.parse_args()

    import cupy as cp
    import numpy as np

    from ucudnn.kernels import _compile
    from ucudnn.kernels.fft import Geometry, filter_parts, half
    from ucudnn.problem import ConvProblem

    old_src = _compile.expand_includes(Path(args.old_source).read_text())
    new_src = _compile.source("fft.cu")

    def timed(k, grid, call_args):
        k(grid, (256,), call_args)
        cp.cuda.Device().synchronize()
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        for _ in range(args.reps):
            k(grid, (256,), call_args)
        e1.record()
        e1.synchronize()
        return cp.cuda.get_elapsed_time(e0, e1) / args.reps * 1000

    rows = []
    for name, (co, ci, r, s) in LAYERS.items():
        w = cp.random.standard_normal((co, ci, r, s), dtype=cp.float32)
        for ts in TILES:
            if ts <= max(r, s):
                continue
            geo = Geometry.of(ConvProblem(1, ci, 2 * ts, 2 * ts, co, r, s, (r // 2, s // 2)), "forward", ts)
            hf, f, rule = half(ts), geo.f, filter_parts(geo)
            base = (w, None, np.int32(co), np.int32(ci), np.int32(r), np.int32(s), np.int64(ci * r * s),
                    np.int64(r * s), np.int64(s), np.int64(1))
            got = {}
            for tag, src, threads, extra in (("old", old_src, f * co * ci, ()),
                                             ("new", new_src, hf * co * ci * rule, (np.int32(rule),)),
                                             ("new_one_part", new_src, hf * co * ci, (np.int32(1),))):
                k = cp.RawModule(code=src, options=_compile.OPTIONS,
                                 name_expressions=[f"fft_filter<{ts},false>"]).get_function(f"fft_filter<{ts},false>")
                U = cp.empty((f, co, ci), cp.complex64)
                call_args = (base[0], U) + base[2:] + extra
                got[tag] = (timed(k, (-(-threads // 256),), call_args), U.get())
            ref = got["old"][1]
            diff = max(float(np.abs(got[t][1] - ref).max() / np.abs(ref).max()) for t in ("new", "new_one_part"))
            rows.append({"layer": name, "co": co, "ci": ci, "filter": [r, s], "ts": ts, "parts": rule,
                         "old_us": round(got["old"][0], 2), "new_us": round(got["new"][0], 2),
                         "new_one_part_us": round(got["new_one_part"][0], 2),
                         "speedup": round(got["old"][0] / got["new"][0], 2), "max_rel_diff": diff})
            print(rows[-1], flush=True)
    prov = provenance()
    doc = {"provenance": prov, "old_source": args.old_source, "reps": args.reps, "rows": rows}
    md = [md_header("fft filter transform: separable (a thread per part of a spectrum column) vs a thread per point",
                    prov), "",
          f"us per call, CUDA events over {args.reps} calls, both kernels compiled in this process (old: "
          f"`{args.old_source}`); `parts`: what `filter_parts` picks (one part a column where the filters' columns "
          "make 2^16 threads); max rel. diff: the largest |U_new - U_old| / max |U_old| (summation order).", "",
          "| layer | Co x Ci | filter | TS | parts | old us | new us | new, one part us | speed-up | max rel. diff |",
          "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    md += [f"| {r['layer']} | {r['co']} x {r['ci']} | {r['filter'][0]}x{r['filter'][1]} | {r['ts']} | {r['parts']} | "
           f"{r['old_us']} | {r['new_us']} | {r['new_one_part_us']} | {r['speedup']} | {r['max_rel_diff']:.2g} |"
           for r in rows]
    write(args.out, args.name, doc, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
