"""Whole-network inference, end to end (issue 19): ucudnn's inference plans against PyTorch (GPU machine).

Per (network, dtype, batch): ``ucudnn.plan_inference`` measures and plans (fusion + layouts, WR convs under
``--workspace-limit``), then, side by side in one process on the same weights and input:

* ``ucudnn`` the plan, replayed in a CUDA graph; ``ucudnn-unfused`` the same costs planned without fusion;
  ``ucudnn-NCHW`` / ``ucudnn-NHWC`` every layer in one layout (the baselines the layout choice must never lose
  to); ``ucudnn eager`` the plan launched step by step from Python;
* ``torch eager`` (torchvision model in eval mode, ``cudnn.benchmark``, NCHW and channels_last), ``torch graph``
  (the module replayed in a CUDA graph), ``torch.compile`` (``mode="max-autotune"``, ``--compile-batches``).

Replayed times: ``--inner`` forward passes captured back to back in one CUDA graph, replayed ``--reps`` times
between events (the GPU's time per forward, launch gaps removed: fused_blocks.graph_ms).  ucudnn's CuPy launches
are captured on torch's stream (cupy ExternalStream), so both sides are timed by the same code.  Eager:
``--inner`` calls between two events.  Strict FP32 on both sides (TF32 off); FP16 uses tensor cores on both.
Each case checks ucudnn's output against PyTorch's (max abs difference of the softmax output).

    python benchmarks/inference_e2e.py --networks squeezenet1_1 --dtypes float32,float16 --batches 1,8,64 \
        --out benchmarks/results/inference_e2e.jsonl
    python benchmarks/inference_e2e.py --report benchmarks/results/inference_e2e.jsonl --out-dir benchmarks/results
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import md_header, provenance, write  # noqa: E402


def _cupy_on_torch_stream(fn):
    import cupy as cp
    import torch

    def run():
        with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            fn()
    return run


def case(name: str, dtype: str, batch: int, args) -> dict:
    import cupy as cp
    import torch
    import torchvision
    from fused_blocks import calls_ms, compile_case, graph_ms

    import ucudnn
    from ucudnn.execute.inference import InferenceSession, weights_from_torch
    from ucudnn.planning.inference import replan
    from ucudnn.planning.network import load_network

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    tdt = getattr(torch, dtype)
    model = getattr(torchvision.models, name)(num_classes=1000).eval().cuda()
    net = load_network(name)
    weights = weights_from_torch(net, model)
    model = model.to(tdt)
    x = torch.randn(batch, 3, 224, 224, device="cuda", dtype=tdt)
    row: dict = {"network": name, "dtype": dtype, "batch": batch, "workspace_limit": args.workspace_limit,
                 "sources": args.sources}
    t0 = time.perf_counter()
    doc = ucudnn.plan_inference(net, batch, dtype, workspace_limit=args.workspace_limit, sources=args.sources,
                                block_tuning_s=args.block_tuning_s, log=lambda m: print(f"  [{name} {dtype} b{batch}] {m}", flush=True))
    row["plan_s"] = round(time.perf_counter() - t0, 1)
    row["predicted_ms"] = doc["predicted_ms"]
    row["baselines_predicted"] = doc["baselines"]
    row["steps"] = len(doc["steps"])
    row["fused_steps"] = sum(s["kind"] == "fused" for s in doc["steps"])
    row["tensor_core_steps"] = sum(s["kind"] == "fused" and s.get("kernel", "fma") != "fma" for s in doc["steps"])
    row["wide_steps"] = sum(s["kind"] == "wide_conv" for s in doc["steps"])
    row["epilogue_steps"] = sum("epilogue" in s for s in doc["steps"])
    row["layouts_used"] = sorted({s["layout"] for s in doc["steps"] if s["kind"] != "transform"})
    row["transforms"] = sum(s["kind"] == "transform" for s in doc["steps"])
    row["declined"] = len(doc["costs"].get("declined", {}))
    plans = {"ucudnn": doc, "ucudnn-unfused": replan(doc, fuse=False),
             "ucudnn-no-epilogue": replan(doc, epilogues=False)}
    for lo in ("NCHW", "NHWC"):
        try:
            plans[f"ucudnn-{lo}"] = replan(doc, layouts=[lo])
        except ucudnn.InputError as e:   # a node that cannot run in this layout: no single-layout plan
            row.setdefault("single_layout_impossible", {})[lo] = str(e)
    xc = cp.asarray(x.detach())   # DLPack-free: a copy, once
    with torch.no_grad():
        ref = torch.softmax(model(x).float(), dim=1)
    ms: dict = {}
    for label, d in plans.items():
        s = InferenceSession(d, weights)
        cp.copyto(s.input, xc)
        run = _cupy_on_torch_stream(s.run_steps)
        run()
        torch.cuda.synchronize()
        err = float((torch.as_tensor(cp.asnumpy(s.output).reshape(ref.shape), device="cuda") - ref).abs().max())
        ms[label] = {"replayed": graph_ms(run, args.inner, args.reps), "err": err,
                     "predicted": d["predicted_ms"]}
        if label == "ucudnn":
            ms[label]["eager"] = calls_ms(run, args.reps, inner=args.inner)
    with torch.no_grad():
        for fmt_name, fmt in (("NCHW", torch.contiguous_format), ("channels_last", torch.channels_last)):
            m = model.to(memory_format=fmt)
            xi = x.contiguous(memory_format=fmt)
            ms[f"torch-{fmt_name}"] = {"eager": calls_ms(lambda: m(xi), args.reps, inner=args.inner),
                                       "replayed": graph_ms(lambda: m(xi), args.inner, args.reps)}
        model = model.to(memory_format=torch.contiguous_format)
        if batch in args.compile_batches and args.compile_mode != "none":
            class Wrap(torch.nn.Module):
                def __init__(self, m):
                    super().__init__()
                    self.m = m

                def forward(self, a, _b):
                    return self.m(a)

            r = compile_case(Wrap(model), x, None, args.compile_mode, args.compile_timeout, args.reps, args.inner)
            ms["torch.compile"] = r
    row["ms"] = ms
    torch_best = min(ms[f"torch-{f}"]["replayed"] for f in ("NCHW", "channels_last"))
    row["speedup_vs_torch_replayed"] = round(torch_best / ms["ucudnn"]["replayed"], 3)
    if "ms" in ms.get("torch.compile", {}):
        row["speedup_vs_compile"] = round(ms["torch.compile"]["ms"] / ms["ucudnn"]["replayed"], 3)
    singles = [ms[f"ucudnn-{lo}"]["replayed"] for lo in ("NCHW", "NHWC") if f"ucudnn-{lo}" in ms]
    row["plan_vs_best_single_layout"] = round(min(singles) / ms["ucudnn"]["replayed"], 3) if singles else None
    return row


def report(path: Path, out_dir: Path) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    failed = [r for r in rows if "ms" not in r]
    rows = [r for r in rows if "ms" in r]
    latest: dict = {}
    for r in rows:
        latest[(r["network"], r["dtype"], r["batch"])] = r
    rows = sorted(latest.values(), key=lambda r: (r["network"], r["dtype"], r["batch"]))
    prov = rows[-1].get("provenance", {}) if rows else {}
    md = [md_header("Whole-network inference: ucudnn plans vs PyTorch (issue 19)", prov), "",
          "ms per forward pass, replayed in a CUDA graph unless marked eager (median; ucudnn and PyTorch timed by "
          "the same code in one process). `ucudnn` = the plan (fusion + per-layer layouts); `unfused` = same costs "
          "without fusion; `NCHW`/`NHWC` = every layer in one layout; `no epilogue` = the plan without cuDNN's fused conv + bias + "
          "activation; wide steps: a concat of convs run as one conv; `torch` = best of NCHW / channels_last; "
          "`compile` = torch.compile(mode=\"max-autotune\") called back to back. err = max |softmax difference| vs "
          "PyTorch.", "",
          "| network | dtype | batch | ucudnn | ucudnn eager | unfused | NCHW | NHWC | torch eager | torch replayed | "
          "compile | vs torch replayed | vs compile | plan vs best layout | no epilogue | fused / wide / epilogue "
          "steps | err | plan s | run |",
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]

    def f(v, d=4):
        return "-" if v is None else f"{v:.{d}f}"

    for r in rows:
        m = r["ms"]
        te = min(m[f"torch-{k}"]["eager"] for k in ("NCHW", "channels_last"))
        tr = min(m[f"torch-{k}"]["replayed"] for k in ("NCHW", "channels_last"))
        comp = m.get("torch.compile", {})
        tc = f" ({r['tensor_core_steps']} tc)" if "tensor_core_steps" in r else ""   # recorded since 2026-11-25 12:30
        md.append(f"| {r['network']} | {r['dtype']} | {r['batch']} | {f(m['ucudnn']['replayed'])} | "
                  f"{f(m['ucudnn'].get('eager'))} | {f(m['ucudnn-unfused']['replayed'])} | "
                  f"{f(m.get('ucudnn-NCHW', {}).get('replayed'))} | {f(m.get('ucudnn-NHWC', {}).get('replayed'))} | {f(te)} | {f(tr)} | "
                  f"{f(comp.get('ms')) if 'ms' in comp else (comp.get('not_run', '-')[:30] if comp else '-')} | "
                  f"{r['speedup_vs_torch_replayed']:.2f}x | "
                  f"{(str(r['speedup_vs_compile']) + 'x') if 'speedup_vs_compile' in r else '-'} | "
                  f"{f(r['plan_vs_best_single_layout'], 2)}x | {f(m.get('ucudnn-no-epilogue', {}).get('replayed'))} | "
                  f"{r['fused_steps']}{tc} / {r.get('wide_steps', 0)} / {r.get('epilogue_steps', 0)} | "
                  f"{m['ucudnn']['err']:.1e} | "
                  f"{r['plan_s']} | {r.get('provenance', {}).get('date', '-')[:16]} |")
    for r in failed:
        md.append(f"\nFailed: {r['network']} {r['dtype']} b{r['batch']}: {r.get('error', '?')[:200]}")
    md += ["", "Bars (issue 19): SqueezeNet 1.1 at batch 1 faster than both PyTorch replayed and torch.compile; the "
           "layout choice never slower than the best single layout (plan vs best layout >= 1.00x, within timing "
           "noise)."]
    write(out_dir, "inference_e2e", {"rows": rows}, "\n".join(md))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--networks", default="squeezenet1_1,mobilenet_v2")
    ap.add_argument("--dtypes", default="float32,float16")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--workspace-limit", default="8MiB")
    ap.add_argument("--sources", default="legacy,graph")
    ap.add_argument("--block-tuning-s", type=float, default=60.0, help="device time for tuning fused tilings per case")
    ap.add_argument("--inner", type=int, default=20)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--compile-batches", default="1")
    ap.add_argument("--compile-mode", default="max-autotune")
    ap.add_argument("--compile-timeout", type=float, default=240.0)
    ap.add_argument("--out", help="JSONL file to append each case's record to")
    ap.add_argument("--report", help="JSONL file to make the Markdown + JSON report from (no GPU)")
    ap.add_argument("--out-dir", default="benchmarks/results")
    args = ap.parse_args()
    if args.report:
        report(Path(args.report), Path(args.out_dir))
        return
    args.compile_batches = {int(b) for b in args.compile_batches.split(",") if b}
    prov = provenance()
    for name in args.networks.split(","):
        for dtype in args.dtypes.split(","):
            for batch in (int(b) for b in args.batches.split(",")):
                try:
                    row = case(name, dtype, batch, args)
                except Exception as e:  # noqa: BLE001 - one failing case is reported, the rest still run
                    import traceback

                    traceback.print_exc()
                    row = {"network": name, "dtype": dtype, "batch": batch, "error": f"{type(e).__name__}: {e}"}
                row["provenance"] = prov
                print(json.dumps({k: v for k, v in row.items() if k not in ("provenance", "baselines_predicted")}),
                      flush=True)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
