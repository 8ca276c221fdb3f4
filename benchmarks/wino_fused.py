"""Issue 18: the fused Winograd kernel (``wino-f4-fused``: V and M never in global memory, only U in the workspace)
against the chunked winograd configurations and PyTorch's cuDNN, per layer.

For each layer (FP32 strict, NCHW; forward and backward data): the fused call, the chunked call with the most tiles
that fit ``--limit`` (what 64 MiB allowed before the fused kernel), the one-chunk call (the winograd source
unbounded) where it fits ``--max-workspace``, all three as the source prepares them and timed replayed from a CUDA
graph; and PyTorch (``cudnn.benchmark``, TF32 off, its own unbounded workspace) on the same shapes, timed eagerly
with CUDA events after its autotuning.  Workspace beside each; time per call and direct-convolution-equivalent TFLOPS.

    python benchmarks/wino_fused.py --layers all
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import md_header, provenance, write  # noqa: E402

MiB = 1 << 20
#: name -> (batch, channels in, plane side, channels out): 3x3, padding 1, stride 1 -- the distinct such layers of
#: VGG-16 b64, ResNet-50 b128 and AlexNet b256 (issue 18's networks)
LAYERS = {"vgg16-conv1_2": (64, 64, 224, 64), "vgg16-conv2_1": (64, 64, 112, 128),
          "vgg16-conv2_2": (64, 128, 112, 128), "vgg16-conv3_1": (64, 128, 56, 256),
          "vgg16-conv3_2": (64, 256, 56, 256), "vgg16-conv4_1": (64, 256, 28, 512),
          "vgg16-conv4_2": (64, 512, 28, 512), "vgg16-conv5_1": (64, 512, 14, 512),
          "resnet50-layer1": (128, 64, 56, 64), "resnet50-layer2": (128, 128, 28, 128),
          "resnet50-layer3": (128, 256, 14, 256), "resnet50-layer4": (128, 512, 7, 512),
          "alexnet-conv3": (256, 192, 13, 384), "alexnet-conv4": (256, 384, 13, 256),
          "alexnet-conv5": (256, 256, 13, 256)}


def torch_ms(p, op: str) -> float | None:
    """PyTorch's time for ``op`` of ``p`` (cudnn.benchmark, TF32 off), ms a call, or None without torch."""
    try:
        import torch
    except ImportError:
        return None
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    x = torch.randn(p.n, p.c, p.h, p.w, device=dev)
    w = torch.randn(p.k, p.c, 3, 3, device=dev)
    dy = torch.randn(p.n, p.k, p.p, p.q, device=dev)
    if op == "forward":
        def call():
            return torch.nn.functional.conv2d(x, w, padding=p.pad)
    else:
        def call():
            return torch.ops.aten.convolution_backward(dy, x, w, None, [1, 1], list(p.pad), [1, 1], False, [0, 0], 1,
                                                       [True, False, False])[0]
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(5):
        start.record()
        for _ in range(5):
            call()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 5)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", default="all", help="comma-separated names of LAYERS, or all")
    ap.add_argument("--limit", default="64MiB", help="workspace the chunked configuration fits")
    ap.add_argument("--max-workspace", default="6GiB", help="the largest one-chunk workspace timed")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--name", default="wino_fused")
    args = ap.parse_args()

    import cupy as cp
    from ucudnn.kernels.winograd import Geometry, fused_workspace_bytes, tile_chunk_sizes

    from ucudnn.binding.gpu import capture
    from ucudnn.binding.timing import time_ms
    from ucudnn.measure.benchmarking import Buffers
    from ucudnn.measure.sources.base import Operands
    from ucudnn.measure.sources.winograd import FUSED_ALGO, WinogradSource, tile_algo_name
    from ucudnn.planning.table import Measurement
    from ucudnn.problem import ConvProblem
    from ucudnn.units import parse_size

    limit, top = parse_size(args.limit), parse_size(args.max_workspace)
    names = list(LAYERS) if args.layers == "all" else args.layers.split(",")

    def replayed(fn) -> float:
        graph = capture(fn)
        return time_ms(lambda: graph.launch(cp.cuda.get_current_stream()), repeat=5, warmup=2, min_sample_ms=1.0)

    rows = []
    for name in names:
        n, c, hw, k = LAYERS[name]
        p = ConvProblem(n, c, hw, hw, k, 3, 3, pad=(1, 1))
        flop = 2.0 * n * k * c * 9 * p.p * p.q
        buf = Buffers(p)
        for op in ("forward", "backward_data"):
            geo = Geometry.of(p, op)
            total = n * geo.tiles_per_image
            fit = [t for t in tile_chunk_sizes(geo, n) + [total] if geo.workspace_bytes(0, t) <= limit]
            configs = {"fused": Measurement(n, FUSED_ALGO, "FMA", 0.0, fused_workspace_bytes(geo), "winograd", None,
                                            {"winograd": {"fused": True}})}
            if fit:
                t = max(fit)
                configs["chunked"] = Measurement(n, tile_algo_name(t), "FMA", 0.0, geo.workspace_bytes(0, t),
                                                 "winograd", None, {"winograd": {"tiles": t}})
            if geo.workspace_bytes(0, total) <= top:
                configs["one_chunk"] = Measurement(n, tile_algo_name(total), "FMA", 0.0, geo.workspace_bytes(0, total),
                                                   "winograd", None, {"winograd": {"tiles": total}})
            ops = buf.operands(op, n)
            row = {"layer": name, "op": op, "problem": p.describe(), "gflop": round(flop / 1e9, 1)}
            for what, cfg in configs.items():
                ws = cp.cuda.alloc(max(cfg.workspace_bytes, 256))
                launch = WinogradSource().prepare(op, p, cfg)
                ms = replayed(lambda launch=launch, ws=ws, cfg=cfg, ops=ops: launch(Operands(ops.a, ops.b, ops.out),
                                                                                       ws.ptr, cfg.workspace_bytes,
                                                                                       1.0, 0.0))
                row[what] = {"ms": round(ms, 4), "workspace_mib": round(cfg.workspace_bytes / MiB, 2),
                             "tflops": round(flop / (ms * 1e-3) / 1e12, 1), "algo": cfg.algo}
                del ws
            if not args.no_torch:
                t = torch_ms(p, op)
                if t is not None:
                    row["pytorch"] = {"ms": round(t, 4), "tflops": round(flop / (t * 1e-3) / 1e12, 1)}
                    import torch

                    torch.cuda.empty_cache()
            rows.append(row)
            print({key: v for key, v in row.items() if key != "problem"}, flush=True)
    doc = {"provenance": provenance(), "limit": limit, "rows": rows}

    def cell(r, key):
        v = r.get(key)
        return "-" if v is None else f"{v['ms']} ({v['tflops']})" + (f" {v['workspace_mib']} MiB"
                                                                      if "workspace_mib" in v else "")

    md = [md_header("Fused Winograd F(4x4, 3x3) per layer (FP32 strict, NCHW)", doc["provenance"]),
          (f"ms a call (direct-convolution TFLOPS) and workspace; winograd configurations replayed from a CUDA graph; "
           f"chunked = the most tiles that fit {args.limit}; one chunk = the winograd source unbounded; PyTorch = "
           "cudnn.benchmark with TF32 off, its own unbounded workspace, eager."), "",
          "| layer | op | fused | chunked | one chunk | PyTorch | chunked ÷ fused | PyTorch ÷ fused |",
          "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        f = r["fused"]["ms"]
        ch = r.get("chunked", {}).get("ms")
        pt = r.get("pytorch", {}).get("ms")
        md.append(f"| {r['layer']} | {r['op']} | {cell(r, 'fused')} | {cell(r, 'chunked')} | {cell(r, 'one_chunk')} | "
                  f"{cell(r, 'pytorch')} | {f'{ch / f:.2f}x' if ch else '-'} | {f'{pt / f:.2f}x' if pt else '-'} |")
    write(args.out, args.name, doc, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
