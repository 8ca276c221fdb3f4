"""Host microseconds per forward and per backward call, layer by layer: a converted model's layers against the
same nn.Conv2d layers, with the GPU kept busy so that no call waits for it (issue 15's host path; diagnostic, GPU
machine).

Why: ``torch_gaps.py`` shows where a converted step's GPU waits; this says which layers' calls cost the host the
most, and under which plan.  Each layer's recorded input (a forward pre-hook during a training step) is passed
to the layer ``--calls`` times under ``no_grad`` right after a sleep kernel of about 40 ms, best of three: the
calls are enqueued while the GPU sleeps, so the loop's wall time per call is the host's (few enough launches
that the launch queue does not fill).  Backward: ``torch.autograd.grad`` of the layer's output for its input and
weight (dx and dw), the same way.  Each row names the converted layer's plans (source:micro-batch:algorithm per
step) of the three ops.  (The session-17 record of Inception v3 holds the forward columns only, taken with 100 ms
sleeps: the backward ones and the shorter sleep, with its check, came later.)

    python benchmarks/torch_fwd_host.py --model inception_v3 --batch 64 --mode fp32 --limit 64MiB
"""
from __future__ import annotations

import argparse
import collections
import copy
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def forward_host(model_name: str, batch: int, mode: str, limit: str, calls: int = 20) -> dict:
    import torch
    import torchvision

    import ucudnn.torch as ut
    from torch_train import MODEL_KWARGS
    from ucudnn.torch import fastpath, runtime

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = mode != "fp32"
    torch.manual_seed(0)
    fmt = torch.channels_last if mode == "amp" else torch.contiguous_format
    ref = getattr(torchvision.models, model_name)(num_classes=1000, **MODEL_KWARGS.get(model_name, {}))
    ref = ref.cuda().to(memory_format=fmt)
    conv = ut.convert(copy.deepcopy(ref), workspace_limit=limit)
    fastpath.start(wait=True)
    x = torch.randn(batch, 3, 224, 224, device="cuda").to(memory_format=fmt)
    t = torch.randint(0, 1000, (batch,), device="cuda")
    inputs: dict = {}

    def grab(name):
        def hook(m, args):
            inputs.setdefault(name, args[0].detach())
        return hook

    hooks = [m.register_forward_pre_hook(grab(n)) for n, m in conv.named_modules() if isinstance(m, torch.nn.Conv2d)]

    def amp():
        return torch.autocast("cuda", dtype=torch.float16, enabled=mode == "amp")

    for mdl in (ref, conv):          # plans (benchmarks where no cache has them), cuDNN's own benchmark too
        for _ in range(2):
            with amp():
                loss = torch.nn.functional.cross_entropy(mdl(x), t)
            loss.backward()
    for h in hooks:
        h.remove()
    torch.cuda.synchronize()
    refm, convm = dict(ref.named_modules()), dict(conv.named_modules())

    sleep_s = 0.04                              # ~40 ms of GPU sleep (cycles at ~2 GHz) ahead of each round
    woke: list[str] = []

    def host_us(fn, what: str = "") -> float:
        best = 1e9
        for _ in range(3):
            torch.cuda.synchronize()
            torch.cuda._sleep(int(2e9 * sleep_s))
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            best = min(best, (time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
        if best * calls > 0.75e6 * sleep_s:     # the GPU may have woken before the last call: say so
            woke.append(what)
        return best

    def backward(layer, inp):
        """One backward of ``layer`` on ``inp`` (dx and dw, through autograd as a step runs it), repeatable."""
        xin = inp.detach().requires_grad_()
        with amp():
            y = layer(xin)
        gy = torch.ones_like(y)
        return lambda: torch.autograd.grad(y, (xin, layer.weight), gy, retain_graph=True)

    rows = []
    for name, inp in inputs.items():
        r, c = refm[name], convm[name]
        with torch.no_grad(), amp():
            row = {"layer": name, "shape": list(inp.shape), "w": list(c.weight.shape), "stride": list(c.stride),
                   "torch_us": round(host_us(lambda: r(inp), f"{name} torch"), 1),
                   "ucudnn_us": round(host_us(lambda: c(inp), f"{name} ucudnn"), 1)}
        # backward: autograd's own per-call work is in both columns alike; the difference is the convolution's
        for key, layer in (("backward_torch_us", r), ("backward_ucudnn_us", c)):
            try:
                row[key] = round(host_us(backward(layer, inp), f"{name} {key}"), 1)
            except Exception as e:  # noqa: BLE001 - a diagnostic: say what failed, measure the rest
                row[key], row[f"{key}_error"] = 0.0, f"{type(e).__name__}: {str(e)[:160]}"
        rows.append(row)
    plans: dict = collections.defaultdict(list)
    for key, call in runtime._calls.items():
        p = key[1]
        plans[(key[0], p.c, p.h, p.w, p.k, p.r, p.s, tuple(p.stride))].append(
            " ".join(f"{s.config.source}:{s.micro_batch}:{s.config.algo}" for s in call.executor.steps))
    for row in rows:
        _, cc, h, w = row["shape"]
        k, _, rr, ss = row["w"]
        for op, field in (("forward", "plan"), ("backward_data", "plan_dx"), ("backward_filter", "plan_dw")):
            row[field] = plans.get((op, cc, h, w, k, rr, ss, tuple(row["stride"])), ["?"])[-1]
    total = lambda f: round(sum(r[f] for r in rows))  # noqa: E731
    return {"model": model_name, "batch": batch, "mode": mode, "limit": limit, "n_layers": len(rows),
            "sum_torch_us": total("torch_us"), "sum_ucudnn_us": total("ucudnn_us"),
            "sum_backward_torch_us": total("backward_torch_us"), "sum_backward_ucudnn_us": total("backward_ucudnn_us"),
            "sleep_s": sleep_s, "gpu_may_have_woken": woke, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="inception_v3")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--mode", default="fp32", choices=("fp32", "default", "amp"))
    ap.add_argument("--limit", default="64MiB")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None, help="write the record (JSON) here")
    a = ap.parse_args(argv)
    rec = forward_host(a.model, a.batch, a.mode, a.limit, a.calls)
    print("REC", json.dumps(rec))
    if a.out is not None:
        a.out.write_text(json.dumps(rec, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
