"""Where a converted model's training step spends host time (diagnostic for issue 15's bar 3; GPU machine).

A converted model makes three custom-op calls per convolution per step, each running a plan of one or more
steps.  When the GPU work per step is short (TF32, AMP) the host can become the bottleneck; this script
shows whether it is, and where the host time goes:

* per implementation (``torch``, ``ucudnn-256``): GPU step time (CUDA events) and host time per step
  (the Python loop's wall time with the GPU queue kept full, i.e. how fast the host can issue a step);
* a cProfile of ``--profile-steps`` ucudnn steps, top functions by own time;
* the host cost of one custom-op call on a tiny convolution (GPU time negligible), per op.

    python benchmarks/torch_profile.py --model resnet50 --batch 128 --mode default

Writes ``--out``/torch_profile-MODEL-MODE.{json,md}.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import md_header, provenance, write  # noqa: E402


def build(model_name: str, batch: int, mode: str, limit: str | None):
    import torch
    import torchvision

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = mode != "fp32"
    torch.manual_seed(0)
    fmt = torch.channels_last if mode == "amp" else torch.contiguous_format
    model = getattr(torchvision.models, model_name)(num_classes=1000).cuda().to(memory_format=fmt)
    if limit:
        import ucudnn.torch

        ucudnn.torch.convert(model, workspace_limit=limit)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, 224, 224, device="cuda").to(memory_format=fmt)
    t = torch.randint(0, 1000, (batch,), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.float16, enabled=mode == "amp"):
            loss = torch.nn.functional.cross_entropy(model(x), t)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def step_times(step, n: int) -> dict:
    import torch

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    host = (time.perf_counter() - t0) / n
    e.record()
    torch.cuda.synchronize()
    return {"gpu_ms": s.elapsed_time(e) / n, "host_issue_ms": host * 1e3}


def op_overhead(reps: int = 300) -> dict:
    """Host microseconds per call of each custom op on an 8x8x8 convolution (launch-bound)."""
    import torch

    import ucudnn.torch  # noqa: F401  (registers the ops)

    x = torch.randn(2, 8, 8, 8, device="cuda", requires_grad=True)
    conv = ucudnn.torch.Conv2d(8, 8, 3, padding=1, bias=False, workspace_limit="64MiB").cuda()
    ref = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False).cuda()
    out = {}
    for name, m in (("ucudnn", conv), ("torch", ref)):
        for _ in range(5):
            m(x).sum().backward()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            y = m(x)
        torch.cuda.synchronize()
        out[f"{name}_forward_us"] = (time.perf_counter() - t0) / reps * 1e6
        g = torch.ones_like(y)
        t0 = time.perf_counter()
        for _ in range(reps):
            y = m(x)
            y.backward(g)
        torch.cuda.synchronize()
        out[f"{name}_fwd_bwd_us"] = (time.perf_counter() - t0) / reps * 1e6
    return out


def launch_overhead(reps: int = 500) -> dict:
    """Host microseconds per launch of one prepared configuration of each source (ResNet-50's 1x1 64->256 at
    56x56, micro-batch 8: a few microseconds of GPU work), and GPU microseconds for reference."""
    import cupy as cp

    from ucudnn.binding.gpu import cupy as _cp  # noqa: F401  (binds ucudnn to this CuPy)
    from ucudnn.measure.benchmarking import Buffers
    from ucudnn.measure.sources import registry
    from ucudnn.measure.sources.base import BenchSettings
    from ucudnn.problem import ConvProblem

    problem = ConvProblem(8, 64, 56, 56, 256, 1, 1, 0, 1, 1, 1, "float32", "NCHW")
    buf = Buffers(problem)
    ws = cp.cuda.alloc(256 << 20)
    settings = BenchSettings("tf32", repeat=3, max_workspace=256 << 20)
    out: dict = {}
    for name in ("legacy", "graph"):
        try:
            src = registry.get(name)
            ops = buf.operands("forward", problem.n)
            ms, _ = src.measure("forward", problem, ops, ws.ptr, settings)
            best = min(ms, key=lambda m: m.time_ms)
            launch = src.prepare("forward", problem, best)
            for _ in range(20):
                launch(ops, ws.ptr, best.workspace_bytes, 1.0, 0.0)
            cp.cuda.get_current_stream().synchronize()
            t0 = time.perf_counter()
            for _ in range(reps):
                launch(ops, ws.ptr, best.workspace_bytes, 1.0, 0.0)
            host = (time.perf_counter() - t0) / reps * 1e6
            cp.cuda.get_current_stream().synchronize()
            out[name] = {"host_us_per_launch": round(host, 1), "gpu_us": round(best.time_ms * 1e3, 1),
                         "config": f"{best.algo}/{best.math_type}"}
        except Exception as e:  # noqa: BLE001 - a diagnostic: report, go on
            out[name] = {"error": str(e)[:200]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--mode", default="default", choices=("fp32", "default", "amp"))
    ap.add_argument("--limit", default="256MiB")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--profile-steps", type=int, default=5)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    a = ap.parse_args(argv)
    res: dict = {"model": a.model, "batch": a.batch, "mode": a.mode, "limit": a.limit,
                 "op_overhead": op_overhead(), "launch_overhead": launch_overhead()}
    res["torch"] = step_times(build(a.model, a.batch, a.mode, None), a.steps)
    step = build(a.model, a.batch, a.mode, a.limit)
    res["ucudnn"] = step_times(step, a.steps)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(a.profile_steps):
        step()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)
    res["profile_tottime"] = buf.getvalue()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(40)
    res["profile_cumulative"] = buf.getvalue()
    res["provenance"] = provenance()
    stem = f"torch_profile-{a.model}-{a.mode}"
    md = [md_header(f"Host time of a converted {a.model} b{a.batch} step ({a.mode})", res["provenance"]), "",
          "| impl | GPU ms/step | host ms/step |", "|---|---:|---:|"]
    for k in ("torch", "ucudnn"):
        md.append(f"| {k} | {res[k]['gpu_ms']:.1f} | {res[k]['host_issue_ms']:.1f} |")
    md += ["", "Per custom-op call on a tiny convolution (host-bound):", "",
           *[f"- {k}: {v:.0f} us" for k, v in res["op_overhead"].items()], "",
           "Per launch of one prepared configuration (ResNet-50 1x1 64->256, 56x56, micro-batch 8):", "",
           *[f"- {k}: {v}" for k, v in res["launch_overhead"].items()], "",
           "```", res["profile_tottime"][:6000], "```"]
    write(Path(a.out), stem, res, "\n".join(md) + "\n")
    print(json.dumps({k: res[k] for k in ("torch", "ucudnn", "op_overhead", "launch_overhead")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
