"""Issue 17: the depthwise kernel (``direct-dw3`` / ``-dw5`` / ``-dw7``) per configuration, on public depthwise layers.

For each layer (seed 001's ``dw-112-c32-3x3``, MobileNet V2's depthwise 3x3 layers, EfficientNet-B0's depthwise 5x5
layers and ConvNeXt-tiny's depthwise 7x7 layers, NCHW, ``--batch``; stride 1 for all three ops, stride 2 for
backward data and filter) and op: every (band rows, launch bound) of ``kernels/direct.py``'s ``DW_ROWS`` x
``DW_MINB`` timed (CUDA events, median of 3 samples of at least 0.5 ms), beside the seed's single-channel kernel at
its tuned tile (what ``direct-single`` runs; it has no backward filter), cuDNN's fastest with no workspace and with
any (legacy + graph, re-timed), and the floor: x (dx) and y (dy) moved once at the device's copy bandwidth (measured
here). It shows which configurations the source should measure (``DW_CONFIGS``) and how far the kernel is from the
floor. (The first runs, 3x3 stride 1 only, were made under this script's earlier name, ``dw3_configs.py``:
``results/dw3_configs-b256.md``.)

    python benchmarks/dw_configs.py --batch 256
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import md_header, provenance, write  # noqa: E402
from direct_tiles import copy_bandwidth, cudnn_best  # noqa: E402

#: (name, h = w, channels, filter size, stride): seed 001's depthwise layer, MobileNet V2's depthwise 3x3 layers and
#: EfficientNet-B0's depthwise 5x5 layers (stride 2: backward data and filter), ConvNeXt-tiny's 7x7 layers
LAYERS = [("dw-112-c32-3x3", 112, 32, 3, 1), ("mbv2-56-c144", 56, 144, 3, 1), ("mbv2-28-c192", 28, 192, 3, 1),
          ("mbv2-14-c384", 14, 384, 3, 1), ("mbv2-14-c576", 14, 576, 3, 1), ("mbv2-7-c960", 7, 960, 3, 1),
          ("effb0-28-c240-5x5", 28, 240, 5, 1), ("effb0-14-c672-5x5", 14, 672, 5, 1),
          ("effb0-7-c1152-5x5", 7, 1152, 5, 1),
          ("mbv2-112s2-c96", 112, 96, 3, 2), ("mbv2-56s2-c144", 56, 144, 3, 2), ("mbv2-28s2-c192", 28, 192, 3, 2),
          ("mbv2-14s2-c576", 14, 576, 3, 2), ("effb0-56s2-c144-5x5", 56, 144, 5, 2),
          ("effb0-14s2-c672-5x5", 14, 672, 5, 2),
          ("cnx-56-c96-7x7", 56, 96, 7, 1), ("cnx-28-c192-7x7", 28, 192, 7, 1), ("cnx-14-c384-7x7", 14, 384, 7, 1),
          ("cnx-7-c768-7x7", 7, 768, 7, 1)]


def torch_ms(op: str, p, time_ms) -> float | None:
    """PyTorch's own ``op`` on ``p`` (``cudnn.benchmark``; FP32 NCHW depthwise runs torch's native depthwise kernel,
    not cuDNN), or None without torch: what a converted model's layer competes with."""
    try:
        import torch
    except ImportError:
        return None
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda"
    fmt = torch.channels_last if p.layout == "NHWC" else torch.contiguous_format   # channels-last: cuDNN's NHWC
    x = torch.randn(p.n, p.c, p.h, p.w, device=dev).contiguous(memory_format=fmt)
    w = torch.randn(p.k, p.c // p.groups, p.r, p.s, device=dev).contiguous(memory_format=fmt)
    dy = torch.randn(p.n, p.k, p.p, p.q, device=dev).contiguous(memory_format=fmt)
    args = (None, list(p.stride), list(p.pad), [1, 1], False, [0, 0], p.groups)
    if op == "forward":
        def run():
            torch.ops.aten.convolution(x, w, *args)
    else:
        mask = [op == "backward_data", op == "backward_filter", False]

        def run():
            torch.ops.aten.convolution_backward(dy, x, w, None, *args[1:], mask)
    return time_ms(run, repeat=3, warmup=2, min_sample_ms=0.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--only", default=None, help="comma-separated layer names")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--suffix", default="", help="appended to the result files' name")
    ap.add_argument("--layout", default="NCHW", choices=("NCHW", "NHWC"),
                    help="NHWC: the channels-last kernels' tiles (kernels/direct_dw_nhwc.py) against cuDNN's and "
                         "PyTorch's channels-last convolutions (stride 1 layers)")
    args = ap.parse_args()

    import cupy as cp

    from ucudnn.binding.timing import time_ms
    from ucudnn.kernels import _compile
    from ucudnn.kernels import direct as D
    from ucudnn.kernels import direct_dw as DW
    from ucudnn.kernels import direct_dw_nhwc as NH
    from ucudnn.measure.benchmarking import Buffers
    from ucudnn.problem import ConvProblem

    bw = copy_bandwidth(cp)
    nhwc = args.layout == "NHWC"
    rows = []
    for name, hw, c, k, stride in LAYERS:
        if args.only and name not in args.only.split(","):
            continue
        p = ConvProblem(args.batch, c, hw, hw, c, k, k, pad=(k // 2, k // 2), stride=(stride, stride), groups=c,
                        layout=args.layout)
        buf = Buffers(p)
        floor_ms = p.n * p.c * (p.h * p.w + p.p * p.q) * 4 / bw * 1e3    # x (dx) and y (dy) moved once
        for op in DW.DW_OPS:
            if (NH.refusal if nhwc else DW.dw_refusal)(op, p):
                continue
            t0 = time.time()
            ops = buf.operands(op, p.n)
            operands = (ops.a, ops.b, ops.out)
            times = {}
            configs = NH.tiles_of(op) if nhwc else [(r, mb) for r in DW.DW_ROWS for mb in DW.DW_MINB]
            for cfg in configs:
                launch = NH.launcher(op, p, cfg) if nhwc else DW.dw_launcher(op, p, *cfg)
                times[cfg] = time_ms(lambda: launch(*operands, 1.0, 0.0), repeat=3, warmup=1, min_sample_ms=0.5)
            tiling, how, seed_ms = None, None, None
            if op in D.OPS and D.refusal(op, p) is None:   # the seed's single-channel kernel: no backward filter
                tiling, how = D.tuned_tiling(op, p, operands)
                seed = D.launcher(op, p, tiling, D.uses_async(op, p, _compile.compute_capability()))
                seed_ms = time_ms(lambda: seed(*operands, 1.0, 0.0), repeat=3, warmup=1, min_sample_ms=0.5)
            cu = cudnn_best(op, p, ops, 1 << 30)
            pt = torch_ms(op, p, time_ms)
            ranked = sorted(times.items(), key=lambda kv: kv[1])
            best, best_ms = ranked[0]
            row = {"layer": name, "op": op, "problem": p.describe(),
                   "configs": [[*cfg, round(t, 4)] for cfg, t in ranked],
                   "best": list(best), "best_ms": round(best_ms, 4),
                   "seed_single": tiling and tiling.as_list(), "seed_single_how": how,
                   "seed_single_ms": seed_ms and round(seed_ms, 4),
                   "cudnn_zero": cu["zero"][0], "cudnn_zero_ms": round(cu["zero"][1], 4),
                   "cudnn_any": cu["any"][0], "cudnn_any_ms": round(cu["any"][1], 4),
                   "best_vs_cudnn_zero": round(cu["zero"][1] / best_ms, 3),
                   "best_vs_cudnn_any": round(cu["any"][1] / best_ms, 3),
                   "torch_ms": pt and round(pt, 4), "best_vs_torch": pt and round(pt / best_ms, 3),
                   "best_vs_seed_single": seed_ms and round(seed_ms / best_ms, 3),
                   "floor_ms": round(floor_ms, 4), "best_over_floor": round(best_ms / floor_ms, 2),
                   "wall_s": round(time.time() - t0, 1)}
            rows.append(row)
            print(f"{name} {op}: dw best {row['best']} {best_ms:.4f} ms, seed single {seed_ms}, cuDNN 0-ws "
                  f"{row['cudnn_zero']} {row['cudnn_zero_ms']} -> {row['best_vs_cudnn_zero']}x, any "
                  f"{row['cudnn_any']} {row['cudnn_any_ms']}; PyTorch {row['torch_ms']}; floor {floor_ms:.4f}",
                  flush=True)
        del buf
    doc = {"provenance": provenance(), "copy_bandwidth_gbs": round(bw / 1e9, 1), "rows": rows}
    configs = ("Every tile timed (forward / backward data [rows, column groups, columns a thread, channel quads], "
               "backward filter [rows, columns, channel quads])" if nhwc else
               "Every (band rows, launch bound) timed (rows 0: the whole plane)")
    md = [md_header(f"Depthwise kernel (direct-dw3, -dw5, -dw7) per configuration, {args.layout} float32 b{args.batch}",
                    doc["provenance"]),
          f"{configs}; copy bandwidth {doc['copy_bandwidth_gbs']} GB/s (the floor: x and y moved once at that rate).  "
          "Bar (issue 17): direct >= 1.5x cuDNN's zero-workspace best.", "",
          f"| layer | op | dw best {'tile' if nhwc else '[rows, minb]'} | ms | seed single ms | cuDNN 0-ws | ms "
          "| dw vs 0-ws | cuDNN any | ms | dw vs any | PyTorch ms | dw vs PyTorch | floor ms | dw / floor |",
          "|---|---|---|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        md.append(f"| {r['layer']} | {r['op']} | {r['best']} | {r['best_ms']} | {r['seed_single_ms']} | "
                  f"{r['cudnn_zero']} | {r['cudnn_zero_ms']} | {r['best_vs_cudnn_zero']} | {r['cudnn_any']} | "
                  f"{r['cudnn_any_ms']} | {r['best_vs_cudnn_any']} | {r.get('torch_ms')} | {r.get('best_vs_torch')} | "
                  f"{r['floor_ms']} | {r['best_over_floor']} |")
    md += ["", "Every configuration (ms), per layer and op:", ""]
    md += [f"- {r['layer']} {r['op']}: " + ", ".join(f"{c[:-1]} {c[-1]}" for c in r["configs"]) for r in rows]
    layout = "-nhwc" if nhwc else ""
    write(args.out, f"dw_configs-b{args.batch}{layout}{args.suffix}", doc, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
