"""A converted model's first training step: benchmarking every kernel, from the user's plan cache, and from a bundle
that ``ucudnn precompute --torch-model`` made on another process (issue 15: "first-iteration cost (benchmarking; and
with a bundle)").

Each row is one fresh process of ``torch_train.py --worker`` (same model, data and step), which records the first
step's host time and where the lookup chain found each kernel's plan (``plans_from``):

- ``torch``: PyTorch with ``cudnn.benchmark`` (its own first-step search), for reference;
- ``cold``: ``ucudnn.torch.convert(workspace_limit=64 MiB)`` with an empty plan cache (``UCUDNN_DATABASE`` a new
  file) and no bundle: every kernel benchmarked in the first step;
- ``cache``: the same plan cache again, now filled (what a second run on the same machine pays);
- ``bundle``: an empty plan cache and ``UCUDNN_BUNDLE_PATH`` naming the bundle that
  ``ucudnn precompute --torch-model torchvision.models:NAME@B --input-shape 3,224,224 --workspace-limits 64MiB
  --out F.bundle`` wrote (its own store, its wall time recorded as ``precompute_s``): what a cluster's machines pay
  when plans were precomputed once for their GPU model.
- ``bundle at bB`` (``--bundle-batch B``): the same with a bundle precomputed at a larger batch B: the lookup
  chain plans the job's batch from B's micro-batches and measures only the job's own size (``larger-batch``);

Writes ``results/torch_first_step.{json,md}`` (``--name``) and the raw records (``--out``, JSON lines).

    python benchmarks/torch_first_step.py --only resnet50@128:fp32,vgg16@64:fp32,alexnet@256:fp32,resnet50@128:amp
    python benchmarks/torch_first_step.py --only resnet50@96:fp32 --bundle-batch 128
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _report  # noqa: E402
from torch_train import combinations, run_worker  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
#: precompute's --dtype / --layout / --numerics for torch_train's modes (what ucudnn.torch plans those layers with)
MODE_PLANS = {"fp32": ("float32", "NCHW", "strict"), "default": ("float32", "NCHW", "tf32"),
              "amp": ("float16", "NHWC", "default")}


def worker(model: str, batch: int, mode: str, impl: str, env: dict, a: argparse.Namespace) -> dict:
    """One fresh ``torch_train.py --worker`` process; its record (or why there is none)."""
    cmd = [sys.executable, str(HERE / "torch_train.py"), "--worker", "--model", model, "--batch", str(batch),
           "--mode", mode, "--impl", impl, "--steps", str(a.steps), "--warmup", "1"]
    if a.sources and impl != "torch":
        cmd += ["--sources", a.sources]
    t0 = time.perf_counter()
    rec = run_worker(cmd, a.timeout, {**os.environ, **env}, tail=600)
    rec["wall_s"] = time.perf_counter() - t0
    return rec


def precompute(model: str, batch: int, mode: str, bundle: Path, store: Path, a: argparse.Namespace) -> dict:
    """``ucudnn precompute --torch-model`` for this model and mode at 64 MiB, into ``bundle``: wall time, status."""
    dtype, layout, numerics = MODE_PLANS[mode]
    cmd = [sys.executable, "-m", "ucudnn", "precompute", "--torch-model", f"torchvision.models:{model}@{batch}",
           "--input-shape", "3,224,224", "--dtype", dtype, "--layout", layout, "--numerics", numerics,
           "--workspace-limits", "64MiB", "--engine", "local", "--no-progress", "--out", str(bundle)]
    cmd += ["--sources", a.sources] if a.sources else []
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout,
                           env={**os.environ, "UCUDNN_DATABASE": str(store)})
        ok = p.returncode == 0 and bundle.exists()
        return {"status": "ok" if ok else "error", "precompute_s": time.perf_counter() - t0, "command": cmd[2:],
                **({} if ok else {"error": (p.stderr or p.stdout or "")[-600:]})}
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "precompute_s": time.perf_counter() - t0, "command": cmd[2:]}


def measure(model: str, batch: int, mode: str, a: argparse.Namespace, scratch: Path) -> list[dict]:
    tag = f"{model}-b{batch}-{mode}"
    cache = scratch / f"{tag}-cache.db"
    rows = [dict(kind="torch", **worker(model, batch, mode, "torch", {}, a))]
    no_bundle = {"UCUDNN_BUNDLE_PATH": ""}
    rows.append(dict(kind="cold", **worker(model, batch, mode, "ucudnn-64", {"UCUDNN_DATABASE": str(cache),
                                                                              **no_bundle}, a)))
    rows.append(dict(kind="cache", **worker(model, batch, mode, "ucudnn-64", {"UCUDNN_DATABASE": str(cache),
                                                                               **no_bundle}, a)))

    def with_bundle(kind: str, at: int, name: str) -> dict:
        """Precompute a bundle at batch ``at``, then the job (batch ``batch``) with it and an empty plan cache."""
        made = scratch / f"{model}-b{at}-{mode}.bundle"
        pre = precompute(model, at, mode, made, scratch / f"{tag}-precompute-{name}.db", a)
        rec = worker(model, batch, mode, "ucudnn-64", {"UCUDNN_DATABASE": str(scratch / f"{tag}-empty-{name}.db"),
                                                       "UCUDNN_BUNDLE_PATH": str(made)}, a) \
            if pre["status"] == "ok" else {"status": "skipped", "error": "precompute failed"}
        return dict(kind=kind, precompute=pre, **rec)

    rows.append(with_bundle("bundle", batch, "same"))
    if a.bundle_batch and a.bundle_batch > batch:   # a bundle made at a larger batch: the job's batch derived
        rows.append(with_bundle(f"bundle at b{a.bundle_batch}", a.bundle_batch, "larger"))
    command = _report.provenance()["command"]
    for r in rows:
        r.update(model=model, batch=batch, mode=mode, sources=a.sources, command=command,
                 recorded_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        with open(a.out, "a") as f:
            f.write(json.dumps(r) + "\n")
        print(json.dumps({k: v for k, v in r.items() if k not in ("error", "memory")}), flush=True)
    return rows


def _cell(r: dict, key: str, fmt: str) -> str:
    v = r.get(key)
    return format(v, fmt) if isinstance(v, (int, float)) else "-"


def markdown(doc: dict) -> str:
    p = doc["provenance"]
    lines = ["# First training step of converted torchvision models: benchmarking, plan cache, bundle", "",
             f"- device: `{p.get('device')}`, torch `{p.get('torch')}`, cuDNN `{p.get('cudnn_version')}`",
             f"- date: `{p.get('date')}`", f"- command: `{p.get('command')}`", "",
             "One fresh process per row (`torch_train.py --worker`, synthetic data, SGD); first step = host time of "
             "the first training step (forward, backward, optimizer step, synchronised), ucudnn at 64 MiB per "
             "kernel (sources: convert's and precompute's). `plans from`: where the lookup chain found each "
             "kernel's plan in that process. cold = empty plan cache; cache = the same cache again; bundle = "
             "empty plan cache and "
             "`UCUDNN_BUNDLE_PATH` naming the bundle `ucudnn precompute --torch-model` wrote (its wall time beside "
             "it). images/s over the timed steps after one warm-up step.", "",
             "| model | mode | sources | run | first step s | plans from | images/s | precompute s |",
             "|---|---|---|---|---:|---|---:|---:|"]
    for r in doc["rows"]:
        origins = ", ".join(f"{k} {v}" for k, v in sorted((r.get("plans_from") or {}).items())) or "-"
        if r.get("status") != "ok":
            origins = f"{r.get('status')}: {(r.get('error') or '')[:80]}"
        pre = r.get("precompute") or {}
        lines.append(f"| {r['model']} b{r['batch']} | {r['mode']} | {r.get('sources') or 'default'} | {r['kind']} | "
                     f"{_cell(r, 'first_step_s', '.2f')} | "
                     f"{origins} | {_cell(r, 'images_per_s', '.0f')} | {_cell(pre, 'precompute_s', '.1f')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="resnet50@128:fp32,vgg16@64:fp32,alexnet@256:fp32,resnet50@128:amp",
                    metavar="MODEL@BATCH:MODE,...")
    ap.add_argument("--sources", default=None, help="ucudnn's algorithm sources (convert's and precompute's; "
                    "default: the library's default)")
    ap.add_argument("--bundle-batch", type=int, default=None, metavar="B",
                    help="also precompute at this larger batch and run the job's batch with that bundle (its "
                         "plans derived from the larger batch's micro-batches, the job's own size measured)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--timeout", type=int, default=400, help="seconds per process")
    ap.add_argument("--out", default=str(RESULTS / "torch_first_step.jsonl"))
    ap.add_argument("--results", default=str(RESULTS))
    ap.add_argument("--name", default="torch_first_step")
    ap.add_argument("--keep", metavar="DIR", help="keep the plan caches and bundles here (default: a temporary "
                    "folder, removed at the end)")
    ap.add_argument("--report", metavar="JSONL", help="write the report from these records only (no GPU)")
    a = ap.parse_args(argv)
    a.models, a.modes = "", ""
    if a.report:
        rows = [json.loads(ln) for ln in open(a.report) if ln.strip()]
        prov = {"command": "; ".join(dict.fromkeys(r.get("command") or "not recorded" for r in rows)), **next(
            ({k: r.get(k) for k in ("device", "torch")} for r in rows if r.get("device")), {})}
        prov.update(date=max((r.get("recorded_at") or "" for r in rows), default=""),
                    cudnn_version=next((r.get("cudnn") for r in rows if r.get("cudnn")), None))
        doc = {"provenance": prov, "rows": rows}
    else:
        rows: list[dict] = []
        with tempfile.TemporaryDirectory(prefix="ucudnn-first-step-") as scratch:
            where = Path(a.keep) if a.keep else Path(scratch)
            where.mkdir(parents=True, exist_ok=True)
            for model, batch, mode in combinations(a):
                rows += measure(model, batch, mode, a, where)
        doc = {"provenance": _report.provenance(), "rows": rows}
    _report.write(a.results, a.name, doc, markdown(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
