"""Training steps of torchvision models: plain PyTorch against ``ucudnn.torch.convert``, uncapped and under memory caps.

Issue 15's benchmark (GPU machine).  Each measurement is one fresh process
(a clean caching allocator; ``torch.cuda.set_per_process_memory_fraction`` for
a cap), running synthetic data: one first step (timed with the host clock: for
ucudnn it includes finding plans, from the plan cache or by benchmarking),
``--warmup`` steps, then ``--steps`` steps timed with CUDA events.  Peak memory
is ``torch.cuda.max_memory_allocated()`` over the timed steps (ucudnn's
workspace comes from torch's allocator, so it is counted).

Modes: ``fp32`` (strict: TF32 off, as the issue's H100 numbers), ``default``
(PyTorch's defaults: TF32 allowed in cuDNN convolutions), ``amp`` (autocast
float16, channels_last).  PyTorch runs with ``cudnn.benchmark = True``.
Implementations: ``torch``, ``ucudnn-64`` and ``ucudnn-256`` (MiB per kernel).

Caps are percentages of PyTorch's own uncapped peak for that model and mode
(``max_memory_reserved``: what the cap limits; at 100% of its allocated peak
PyTorch's ResNet-50 b128 already runs out of memory, fragmentation included),
in steps of 5%: ``--cap-search`` finds, for ``torch`` and ``ucudnn-64``, the
smallest that still trains (it assumes, as memory does, that a run that fits a
cap fits every larger one, and bisects).  Runs append to ``--out`` (JSON
lines), so a long study can span several commands; ``--report`` writes the
Markdown table from them.

    python benchmarks/torch_train.py --models resnet50@128,vgg16@64,alexnet@256 --modes fp32 --cap-search
    python benchmarks/torch_train.py --report
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
OUT = RESULTS / "torch_train.jsonl"
IMPLS = {"torch": None, "ucudnn-64": "64MiB", "ucudnn-256": "256MiB"}
MODES = ("fp32", "default", "amp")


def worker(a: argparse.Namespace) -> dict:
    import torch
    import torchvision

    rec = {"model": a.model, "batch": a.batch, "mode": a.mode, "impl": a.impl, "cap_pct": a.cap_pct,
           "cap_bytes": a.cap_bytes, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "cudnn": torch.backends.cudnn.version()}
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = a.mode != "fp32"
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    if a.cap_bytes:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, a.cap_bytes / total), 0)
    torch.manual_seed(0)
    model = getattr(torchvision.models, a.model)(num_classes=1000).to(dev)
    fmt = torch.channels_last if a.mode == "amp" else torch.contiguous_format
    model = model.to(memory_format=fmt)
    if IMPLS[a.impl]:
        import ucudnn.torch

        ucudnn.torch.convert(model, workspace_limit=IMPLS[a.impl])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(a.batch, 3, 224, 224, device=dev).to(memory_format=fmt)
    t = torch.randint(0, 1000, (a.batch,), device=dev)

    def step():
        with torch.autocast("cuda", dtype=torch.float16, enabled=a.mode == "amp"):
            loss = torch.nn.functional.cross_entropy(model(x), t)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    try:
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        rec["first_step_s"] = time.perf_counter() - t0
        for _ in range(a.warmup):
            step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(a.steps):
            step()
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / a.steps
        rec.update(status="ok", step_ms=ms, images_per_s=a.batch * 1000.0 / ms,
                   peak_allocated=torch.cuda.max_memory_allocated(), peak_reserved=torch.cuda.max_memory_reserved())
    except torch.cuda.OutOfMemoryError as e:
        rec.update(status="oom", error=str(e).splitlines()[0][:200])
    return rec


def run_one(model: str, batch: int, mode: str, impl: str, args: argparse.Namespace, cap_pct: int | None = None,
            cap_bytes: int | None = None) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--model", model, "--batch", str(batch), "--mode", mode,
           "--impl", impl, "--steps", str(args.steps), "--warmup", str(args.warmup)]
    if cap_bytes:
        cmd += ["--cap-pct", str(cap_pct), "--cap-bytes", str(cap_bytes)]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        rec = json.loads(lines[-1]) if lines else {"status": "error", "error": (p.stderr or "")[-400:]}
    except subprocess.TimeoutExpired:
        rec = {"status": "timeout"}
    rec.update(model=model, batch=batch, mode=mode, impl=impl, cap_pct=cap_pct, cap_bytes=cap_bytes,
               cap_base="peak_reserved" if cap_bytes else None, wall_s=time.perf_counter() - t0)
    with open(args.out, "a") as f:
        f.write(json.dumps(rec) + "\n")
    print(json.dumps({k: v for k, v in rec.items() if k != "error"}), flush=True)
    return rec


def cap_search(model: str, batch: int, mode: str, impl: str, peak: int, args: argparse.Namespace) -> int | None:
    """Smallest cap (percent of ``peak``, multiple of 5) at which ``impl`` trains; bisection between 30 and 100."""
    lo, hi = 30 // 5, 100 // 5          # in 5% units; hi is known (or assumed) to fit only once tested
    ok_at: int | None = None
    while lo <= hi:
        mid = (lo + hi) // 2
        r = run_one(model, batch, mode, impl, args, mid * 5, peak * mid * 5 // 100)
        if r.get("status") == "ok":
            ok_at, hi = mid * 5, mid - 1
        else:
            lo = mid + 1
    return ok_at


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model"), ap.add_argument("--batch", type=int), ap.add_argument("--mode", choices=MODES)
    ap.add_argument("--impl", choices=list(IMPLS))
    ap.add_argument("--cap-pct", type=int), ap.add_argument("--cap-bytes", type=int)
    ap.add_argument("--models", default="resnet50@128,vgg16@64,alexnet@256,resnet50@256")
    ap.add_argument("--modes", default="fp32,default,amp")
    ap.add_argument("--impls", default="torch,ucudnn-64,ucudnn-256")
    ap.add_argument("--cap-search", action="store_true", help="find the smallest cap for torch and ucudnn-64")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=300, help="seconds per run")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--report", action="store_true", help="write torch_train.{json,md} from --out")
    ap.add_argument("--reuse", metavar="JSONL", help="take uncapped runs already recorded here instead of rerunning")
    a = ap.parse_args(argv)
    if a.worker:
        print(json.dumps(worker(a)))
        return 0
    if a.report:
        return report(Path(a.out))
    done: dict[tuple, dict] = {}
    if a.reuse:
        for line in Path(a.reuse).read_text().splitlines():
            r = json.loads(line)
            if r.get("cap_pct") is None and r.get("status") == "ok":
                done[(r["model"], r["batch"], r["mode"], r["impl"])] = r
                with open(a.out, "a") as f:
                    f.write(line + "\n")
    for spec in a.models.split(","):
        model, batch = spec.split("@")
        for mode in a.modes.split(","):
            base = {impl: done.get((model, int(batch), mode, impl)) or run_one(model, int(batch), mode, impl, a)
                    for impl in a.impls.split(",")}
            if a.cap_search and base.get("torch", {}).get("status") == "ok":
                peak = base["torch"]["peak_reserved"]
                found = {impl: cap_search(model, int(batch), mode, impl, peak, a) for impl in ("torch", "ucudnn-64")}
                print(f"# {model}@{batch} {mode}: smallest caps {found}", flush=True)
                if found["torch"]:   # bar 2 compares at PyTorch's smallest cap: make sure ucudnn ran there
                    for impl in ("ucudnn-64", "ucudnn-256"):
                        if impl != "ucudnn-64" or (found[impl] or 101) < found["torch"]:
                            run_one(model, int(batch), mode, impl, a, found["torch"], peak * found["torch"] // 100)
    return 0


def report(path: Path) -> int:
    """Latest record per (model, batch, mode, impl, cap) -> JSON + Markdown with the bars."""
    import torch

    recs: dict[tuple, dict] = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if r.get("cap_pct") is not None and r.get("cap_base") != "peak_reserved":
            continue   # caps of an earlier definition (% of the allocated peak)
        recs[(r["model"], r["batch"], r["mode"], r["impl"], r.get("cap_pct"))] = r
    gib = 1 << 30
    rows, bars = [], []
    groups = sorted({k[:3] for k in recs})
    for model, batch, mode in groups:
        torch_base = recs.get((model, batch, mode, "torch", None), {})
        smallest = {}
        for impl in IMPLS:
            caps = [k[4] for k, r in recs.items() if k[:4] == (model, batch, mode, impl) and k[4] is not None
                    and r.get("status") == "ok"]
            smallest[impl] = min(caps) if caps else None
        for impl in IMPLS:
            r = recs.get((model, batch, mode, impl, None))
            if r is None:
                continue
            cap = smallest.get(impl)
            at_cap = recs.get((model, batch, mode, impl, cap)) if cap else None
            ratio = (r["images_per_s"] / torch_base["images_per_s"]) if r.get("status") == "ok" and \
                torch_base.get("status") == "ok" else None
            rows.append(f"| {model} b{batch} | {mode} | {impl} | "
                        + (f"{r['images_per_s']:.0f} | {ratio:.2f}x | {r['peak_allocated'] / gib:.2f} | "
                           if r.get("status") == "ok" else f"{r.get('status')} | | | ")
                        + f"{r.get('first_step_s', float('nan')):.1f} | "
                        + (f"{cap}% | {at_cap['images_per_s']:.0f} |" if at_cap else "not searched / none |  |"))
        tcap, ucap = smallest.get("torch"), smallest.get("ucudnn-64")
        if mode == "fp32" and tcap and ucap:
            bars.append(f"- bar 1, {model} b{batch}: ucudnn-64 trains at {ucap}% vs PyTorch's smallest {tcap}% "
                        f"({'met' if ucap <= tcap - 10 else 'missed'}: needs <= {tcap - 10}%)")
            t_at, u_at = recs.get((model, batch, mode, "torch", tcap)), recs.get((model, batch, mode, "ucudnn-64",
                                                                                   tcap))
            if t_at and u_at and u_at.get("status") == "ok":
                bars.append(f"- bar 2, {model} b{batch}: at {tcap}% ucudnn-64 {u_at['images_per_s']:.0f} vs "
                            f"PyTorch {t_at['images_per_s']:.0f} images/s "
                            f"({u_at['images_per_s'] / t_at['images_per_s']:.2f}x; bar 1.3x)")
        u256 = recs.get((model, batch, mode, "ucudnn-256", None))
        if u256 and u256.get("status") == "ok" and torch_base.get("status") == "ok":
            x = u256["images_per_s"] / torch_base["images_per_s"]
            bars.append(f"- bar 3, {model} b{batch} {mode}: ucudnn-256 uncapped {x:.2f}x PyTorch "
                        f"({'met' if x >= 0.95 else 'missed'}: needs 0.95x)")
    # where the runs were measured: the records say (older records without it: the reporting machine)
    measured = next((r for r in recs.values() if r.get("device")), None)
    here = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "unknown",
            "torch": torch.__version__, "cudnn": torch.backends.cudnn.version()}
    meta = {**(here if measured is None else {k: measured[k] for k in here}),
            "date": datetime.now(timezone.utc).isoformat(timespec="minutes"),
            "command": "python benchmarks/torch_train.py " + " ".join(sys.argv[1:])}
    (RESULTS / "torch_train.json").write_text(json.dumps({"meta": meta, "runs": list(recs.values())}, indent=1))
    md = [f"# Training steps: PyTorch vs ucudnn.torch.convert ({meta['device']}, torch {meta['torch']}, "
          f"cuDNN {meta['cudnn']}, {meta['date']})", "",
          "Synthetic data, SGD, one process per run; peak = torch.cuda.max_memory_allocated() over the timed steps "
          "(ucudnn's workspace included); caps in % of PyTorch's uncapped max_memory_reserved, 5% steps. "
          f"Runs: `{path.name}`.", "",
          "| model | mode | impl | images/s | vs torch | peak GiB | first step s | smallest cap | images/s at cap |",
          "|---|---|---|---:|---:|---:|---:|---:|---:|", *rows, "", "Bars:", *(bars or ["- (no capped runs)"])]
    (RESULTS / "torch_train.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
