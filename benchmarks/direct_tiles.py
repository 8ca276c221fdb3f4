"""Issue 17: the direct single-channel forward kernel per tiling, on seed 001's single-channel layers.

For each layer (``own_kernels.py``'s ``seed001-single`` set, or ``--set``) at ``--batch``: every tiling of
``kernels/direct.py``'s grid that fits the device and is ``useful`` for the shape is timed (CUDA events, median of
3 samples of at least 0.5 ms), beside the tuner's pick (``tuned_tiling``: what the ``direct`` source runs) and
cuDNN's fastest zero-workspace algorithm (legacy Find + graph engines, re-timed).  It shows whether the tuner
finds the best tile, how far the best tile is from the write-bandwidth floor (bytes of y, plus x for depthwise
layers, at the device's copy bandwidth measured here), and the speed-up the issue's bar asks of it (>= 1.5x
cuDNN's zero-workspace best).

    python benchmarks/direct_tiles.py --layout NCHW --batch 256
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import md_header, provenance, write  # noqa: E402
from own_kernels import layers  # noqa: E402


def copy_bandwidth(cp, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write counted), the floor's yardstick."""
    from ucudnn.binding.timing import time_ms

    a, b = cp.empty(nbytes // 4, cp.float32), cp.empty(nbytes // 4, cp.float32)
    ms = time_ms(lambda: b.__setitem__(Ellipsis, a), repeat=5, warmup=2, min_sample_ms=2.0)
    return 2 * nbytes / (ms * 1e-3)


def cudnn_best(op: str, problem, ops, max_workspace: int = 0) -> dict:
    """cuDNN's fastest ``op`` (legacy + graph, re-timed) within ``max_workspace`` bytes, with no workspace and with
    any: {"zero": (algorithm, ms), "any": (algorithm (MiB), ms)}."""
    from ucudnn.measure.sources.base import BenchSettings
    from ucudnn.measure.sources.registry import get

    out = {"zero": ("-", float("inf")), "any": ("-", float("inf"))}
    ws = None
    if max_workspace:
        import cupy as cp

        ws = cp.cuda.alloc(max_workspace)
    settings = BenchSettings("strict", max_workspace=max_workspace)
    for name in ("legacy", "graph"):
        ms, _ = get(name).measure(op, problem, ops, ws.ptr if ws is not None else 0, settings)
        for m in ms:
            label = f"{name}:{m.algo}"
            if m.time_ms < out["any"][1]:
                out["any"] = (f"{label} ({m.workspace_bytes / 2**20:.0f} MiB)", m.time_ms)
            if m.workspace_bytes == 0 and m.time_ms < out["zero"][1]:
                out["zero"] = (label, m.time_ms)
    return out


def plane_times(problem, operands) -> dict:
    """Every direct_plane configuration that runs ``problem`` (and whose filter block is at most twice K), and the
    implicit GEMM's forward tiles, timed on ``operands``: {"plane_all": [[[rb, kt, kl], ms], ...] fastest first,
    "plane_best", "plane_best_ms", "igemm_all", "igemm_best_ms"} ({} where direct_plane does not run it)."""
    from ucudnn.kernels import direct_plane as PL
    from ucudnn.kernels import igemm

    from ucudnn.binding.timing import time_ms

    if PL.plane_refusal("forward", problem) is not None:
        return {}

    def ms(launch) -> float:
        return time_ms(lambda: launch(*operands, 1.0, 0.0), repeat=3, warmup=1, min_sample_ms=0.5)

    grid = [(rb, kt, kl) for rb in PL.PLANE_RB for kt in PL.PLANE_KT for kl in PL.PLANE_KL
            if PL.plane_refusal("forward", problem, (rb, kt, kl)) is None and kt * kl <= 2 * problem.k]
    plane = sorted(((list(c), round(ms(PL.plane_launcher(problem, *c)), 4)) for c in grid), key=lambda r: r[1])
    out = {"plane_all": plane, "plane_best": plane[0][0], "plane_best_ms": plane[0][1]}
    if igemm.refusal("forward", problem) is None:
        tiles = sorted(([bn, ks], round(ms(igemm.launcher("forward", problem, None, bn, ks)), 4))
                       for bn, ks, _ in igemm.variants("forward", problem))
        out["igemm_all"] = tiles
        out["igemm_best_ms"] = min(t for _, t in tiles)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--set", dest="layer_set", default="seed001-single")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--layout", default="NCHW")
    ap.add_argument("--only", default=None, help="comma-separated layer names")
    ap.add_argument("--tuned-only", action="store_true",
                    help="time the tuner's pick of the seed kernel only, not its whole grid")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()

    import cupy as cp

    from ucudnn.binding.timing import time_ms
    from ucudnn.kernels import direct as D
    from ucudnn.kernels import _compile
    from ucudnn.measure.benchmarking import Buffers

    bw = copy_bandwidth(cp)
    limit = D.smem_limit()
    rows = []
    for name, problem in layers(args.layer_set, args.batch, args.dtype, args.layout):
        if args.only and name not in args.only.split(","):
            continue
        if D.kernel_name("forward", problem) != "direct_fwd_single":
            continue
        t0 = time.time()
        buf = Buffers(problem)
        ops = buf.operands("forward", problem.n)
        operands = (ops.a, ops.b, ops.out)
        tuned, how = D.tuned_tiling("forward", problem, operands)
        times: dict[tuple, float] = {}
        for coords in ((a, b, c, d) for a in range(len(D.TX_VALUES)) for b in range(len(D.RB_VALUES))
                       for c in range(len(D.KT_VALUES)) for d in range(len(D.CHUNK_VALUES))):
            t = D.Tiling.at(coords)
            if t is None or not D.fits("forward", problem, t, limit) or not (t == tuned or
                                                                            D.useful("forward", problem, t)):
                continue
            if args.tuned_only and t != tuned:
                continue
            launch = D.launcher("forward", problem, t)
            times[tuple(t.as_list())] = time_ms(lambda: launch(*operands, 1.0, 0.0), repeat=3, warmup=1,
                                                min_sample_ms=0.5)
        plane = plane_times(problem, operands)
        ranked = sorted(times.items(), key=lambda kv: kv[1])
        zero_algo, zero_ms = cudnn_best("forward", problem, ops)["zero"]
        y_bytes = problem.n * problem.k * problem.p * problem.q * 4
        x_bytes = problem.n * problem.c * problem.h * problem.w * 4
        floor_ms = (y_bytes + x_bytes) / bw * 1e3   # y written and x read once, at the copy rate (read + write)
        tuned_ms = times[tuple(tuned.as_list())]
        row = {"layer": name, "problem": problem.describe(), "tilings_timed": len(times),
               "tuned": tuned.as_list(), "tuned_how": how, "tuned_ms": round(tuned_ms, 4),
               "best": list(ranked[0][0]), "best_ms": round(ranked[0][1], 4),
               "top": [[list(k), round(v, 4)] for k, v in ranked[:5]],
               "all": [[list(k), round(v, 4)] for k, v in ranked],   # every tile: a tuner can be replayed on it
               "worst_ms": round(ranked[-1][1], 4), "cudnn_zero": zero_algo, "cudnn_zero_ms": round(zero_ms, 4),
               "tuned_vs_cudnn_zero": round(zero_ms / tuned_ms, 3),
               "best_vs_cudnn_zero": round(zero_ms / ranked[0][1], 3),
               "floor_ms": round(floor_ms, 4), **plane, "wall_s": round(time.time() - t0, 1)}
        rows.append(row)
        if plane.get("plane_best"):
            print(f"{name}: plane best {plane['plane_best']} {plane['plane_best_ms']:.4f} ms "
                  f"({zero_ms / plane['plane_best_ms']:.3f}x cuDNN 0-ws); igemm best {plane.get('igemm_best_ms')}",
                  flush=True)
        print(f"{name}: tuned {tuned.as_list()} ({how}) {tuned_ms:.4f} ms, best {ranked[0][0]} {ranked[0][1]:.4f}, "
              f"cuDNN 0-ws {zero_algo} {zero_ms:.4f} -> {row['tuned_vs_cudnn_zero']}x; floor {floor_ms:.4f} ms",
              flush=True)
    tag = f"direct_tiles_{args.layer_set}-{args.dtype}-{args.layout}-b{args.batch}"
    doc = {"provenance": provenance(), "copy_bandwidth_gbs": round(bw / 1e9, 1), "smem_limit": limit,
           "device_key": _compile.device_key(), "rows": rows}
    md = [md_header(f"Direct single-channel forward per tiling: {args.layer_set} b{args.batch} {args.dtype} "
                    f"{args.layout}", doc["provenance"]),
          f"Every fitting, useful tiling [tx, rb, kt, chunk] timed; copy bandwidth {doc['copy_bandwidth_gbs']} GB/s "
          "(the floor: y, and x, moved once at that rate).  Bar (issue 17): direct >= 1.5x cuDNN's zero-workspace "
          "best.", "",
          "| layer | tilings | tuned (how) | tuned ms | best | best ms | cuDNN 0-ws | ms | tuned vs 0-ws "
          "| best vs 0-ws | floor ms | plane best [rb, kt, kl] | ms | vs 0-ws | igemm best ms |",
          "|---|---:|---|---:|---|---:|---|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        md.append(f"| {r['layer']} | {r['tilings_timed']} | {r['tuned']} ({r['tuned_how']}) | {r['tuned_ms']} | "
                  f"{r['best']} | {r['best_ms']} | {r['cudnn_zero']} | {r['cudnn_zero_ms']} | "
                  f"{r['tuned_vs_cudnn_zero']} | {r['best_vs_cudnn_zero']} | {r['floor_ms']} | "
                  + (f"{r['plane_best']} | {r['plane_best_ms']} | {r['cudnn_zero_ms'] / r['plane_best_ms']:.3f} | "
                     if r.get("plane_best") else "- | - | - | ")
                  + f"{r.get('igemm_best_ms', '-')} |")
    write(args.out, tag, doc, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
