"""Where a whole-network inference pass spends its GPU time: kernels per forward, ucudnn's plan against PyTorch
replayed and ``torch.compile`` (issue 19's diagnosis; GPU machine).

Plans (or loads, ``--plan``) one case, captures one forward of each side in a CUDA graph, replays it under
``torch.profiler`` and lists, per side, the kernels of one forward (name, count, total us), the kernel sum and the
replayed ms.  The gap between the replayed time and the kernel sum is what launches between kernels cost inside a
graph; the kernel count says how many there are.

    python benchmarks/inference_profile.py --network squeezenet1_1 --dtype float16 --batch 1 --out $OUT
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _capture import warm_up  # noqa: E402
from _report import provenance  # noqa: E402


def kernels(fn, replays: int = 5) -> dict:
    """Kernels of one ``fn()`` (captured once in a CUDA graph, replayed ``replays`` times under the profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    warm_up(fn, 3)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            g.replay()
        torch.cuda.synchronize()
    agg: dict = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type.name != "CUDA":
            continue
        a = agg[e.name[:120]]
        a[0] += 1
        a[1] += e.device_time
    rows = sorted(([k, c / replays, us / replays] for k, (c, us) in agg.items()), key=lambda r: -r[2])
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ev[0].record()
    for _ in range(20):
        g.replay()
    ev[1].record()
    torch.cuda.synchronize()
    return {"replayed_ms": ev[0].elapsed_time(ev[1]) / 20, "kernels": round(sum(r[1] for r in rows), 1),
            "kernel_us": round(sum(r[2] for r in rows), 2), "rows": [[k, round(c, 2), round(u, 2)] for k, c, u in rows]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--network", default="squeezenet1_1")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--workspace-limit", default="8MiB")
    ap.add_argument("--sources", default="legacy,graph")
    ap.add_argument("--block-tuning-s", type=float, default=20.0)
    ap.add_argument("--plan", help="an inference plan document to run instead of planning")
    ap.add_argument("--compile", action="store_true", help="also profile torch.compile(mode='max-autotune')")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import cupy as cp
    import torch
    import torchvision

    import ucudnn
    from ucudnn.execute.inference import InferenceSession, weights_from_torch
    from ucudnn.planning.inference import replan
    from ucudnn.planning.network import load_network

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    tdt = getattr(torch, args.dtype)
    model = getattr(torchvision.models, args.network)(num_classes=1000).eval().cuda()
    net = load_network(args.network)
    weights = weights_from_torch(net, model)
    model = model.to(tdt)
    x = torch.randn(args.batch, 3, 224, 224, device="cuda", dtype=tdt)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = f"{args.network}-{args.dtype}-b{args.batch}"
    if args.plan:
        doc = json.loads(Path(args.plan).read_text())
    else:
        t0 = time.perf_counter()
        doc = ucudnn.plan_inference(net, args.batch, args.dtype, workspace_limit=args.workspace_limit,
                                    sources=args.sources, block_tuning_s=args.block_tuning_s, log=print)
        print(f"planned in {time.perf_counter() - t0:.1f} s")
        (out / f"inference_plan-{tag}.json").write_text(json.dumps(doc))
    result: dict = {"provenance": provenance(), "case": tag, "predicted_ms": doc["predicted_ms"],
                    "steps": [[s["kind"], s["name"], s["layout"]] for s in doc["steps"]]}
    sides = {"ucudnn": doc, "ucudnn-unfused": replan(doc, fuse=False)}
    for label, d in sides.items():
        sess = InferenceSession(d, weights)
        cp.copyto(sess.input, cp.asarray(x.detach()).reshape(sess.input.shape) if d["input_layout"] == "NCHW"
                  else cp.asarray(x.detach().permute(0, 2, 3, 1).contiguous()))

        def run(sess=sess):
            with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
                sess.run_steps()
        result[label] = kernels(run)
    with torch.no_grad():
        for fmt_name, fmt in (("torch-NCHW", torch.contiguous_format), ("torch-channels_last", torch.channels_last)):
            m = model.to(memory_format=fmt)
            xi = x.contiguous(memory_format=fmt)
            result[fmt_name] = kernels(lambda m=m, xi=xi: m(xi))
        if args.compile:
            m = model.to(memory_format=torch.contiguous_format)
            c = torch.compile(m, mode="max-autotune-no-cudagraphs", dynamic=False)
            c(x)
            result["torch.compile"] = kernels(lambda: c(x))
    for k, v in result.items():
        if isinstance(v, dict) and "rows" in v:
            print(f"{k}: replayed {v['replayed_ms']:.4f} ms, {v['kernels']} kernels, kernel sum {v['kernel_us']} us")
            for r in v["rows"][:25]:
                print(f"    {r[1]:6.1f} x {r[2]:8.2f} us  {r[0]}")
    (out / f"inference_profile-{tag}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
