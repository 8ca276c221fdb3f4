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


def _kind(plan: str) -> str:
    """A plan's kind for grouping: each step's source and, for legacy, its algorithm (``legacy:64:5`` ->
    ``legacy a5``; ``graph:64:eng70_k2=2`` -> ``graph``); several steps joined by ``+`` (distinct kinds)."""
    kinds = []
    for step in plan.split(" "):
        parts = step.split(":")
        k = f"legacy a{parts[-1]}" if parts[0] == "legacy" else parts[0]
        if k not in kinds:
            kinds.append(k)
    return "+".join(kinds)


def compare(a: dict, b: dict, label_a: str = "A", label_b: str = "B") -> str:
    """Markdown: two records of the same model and plans (e.g. with and without a launch change), host us summed
    per kind of plan (forward by its plan; backward by its dx and dw plans), with PyTorch's own layers from each
    record beside them (their difference is the run-to-run noise).  Raises if the records' plans differ."""
    rb = {r["layer"]: r for r in b["rows"]}
    groups: dict[tuple, list[float]] = {}
    for r in a["rows"]:
        s = rb[r["layer"]]
        if (r["plan"], r["plan_dx"], r["plan_dw"]) != (s["plan"], s["plan_dx"], s["plan_dw"]):
            raise ValueError(f"{r['layer']}: the records ran different plans")
        for key, ours, torch_ in ((("forward", _kind(r["plan"])), "ucudnn_us", "torch_us"),
                                  (("backward", f"{_kind(r['plan_dx'])} / {_kind(r['plan_dw'])}"),
                                   "backward_ucudnn_us", "backward_torch_us")):
            g = groups.setdefault(key, [0, 0.0, 0.0, 0.0, 0.0])
            g[0] += 1
            g[1] += r[ours]
            g[2] += s[ours]
            g[3] += r[torch_]
            g[4] += s[torch_]
    out = [f"| pass | plans (dx / dw) | layers | {label_a} us | {label_b} us | per call | PyTorch us ({label_a} run) |"
           f" PyTorch us ({label_b} run) |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for (pass_, kind), (n, x, y, tx, ty) in sorted(groups.items(), key=lambda kv: kv[1][1] - kv[1][2]):
        out.append(f"| {pass_} | {kind} | {n} | {x:.0f} | {y:.0f} | {(x - y) / n:+.0f} | {tx:.0f} | {ty:.0f} |")
    tot = [sum(g[i] for g in groups.values()) for i in range(1, 5)]
    out.append(f"| all | | {len(a['rows'])} | {tot[0]:.0f} | {tot[1]:.0f} | | {tot[2]:.0f} | {tot[3]:.0f} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="inception_v3")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--mode", default="fp32", choices=("fp32", "default", "amp"))
    ap.add_argument("--limit", default="64MiB")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None, help="write the record (JSON) here")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("A_JSON", "B_JSON"),
                    help="print the Markdown comparison of two records (no GPU)")
    ap.add_argument("--labels", default="A,B", help="the two records' names in --compare's table")
    a = ap.parse_args(argv)
    if a.compare:
        la, lb = a.labels.split(",")
        print(compare(*(json.loads(p.read_text()) for p in a.compare), la, lb), end="")
        return 0
    rec = forward_host(a.model, a.batch, a.mode, a.limit, a.calls)
    print("REC", json.dumps(rec))
    if a.out is not None:
        a.out.write_text(json.dumps(rec, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
