"""Where a converted training step's time goes: eager step vs the same step replayed as a CUDA graph (issue 15).

Why: a step that is slower eagerly can be slower on the GPU (other engines, more kernels) or on the host (the
launch path).  Replaying a captured step removes the host: eager minus replayed is what the host adds, and the
replayed times of PyTorch and ucudnn compare their kernels alone.  Each implementation runs in a fresh process
(``--worker``), interleaved ``--repeat`` times; ucudnn's records also say which launch path ran and, for the
compiled one, which plans its launches were (legacy / graph, launched from C++, or handed to Python).

    python benchmarks/torch_step_split.py --out results/torch_step_split-resnet50-amp.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _capture import warm_up  # noqa: E402
from _report import md_header, provenance, write  # noqa: E402
IMPLS = ("torch", "ucudnn-256", "ucudnn-256-py")


def worker(a: argparse.Namespace) -> dict:
    import torch

    from torch_profile import build   # the model, data and step torch_profile / torch_host_spy time

    step = build(a.model, a.batch, a.mode, None if a.impl == "torch" else "256MiB", a.sources)
    rec: dict = {"model": a.model, "batch": a.batch, "mode": a.mode, "impl": a.impl,
                 "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                 "cudnn": torch.backends.cudnn.version()}
    if a.impl != "torch":
        from ucudnn.torch import fastpath

        rec["launch_path"] = "compiled" if fastpath.state() == "ready" else "python"
    warm_up(step, 3)

    def timed(fn) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        start.record()
        for _ in range(a.steps):
            fn()
        end.record()
        host = (time.perf_counter() - t0) * 1000 / a.steps       # until the last launch is queued
        torch.cuda.synchronize()
        return start.elapsed_time(end) / a.steps, host

    import gc

    mem0, gc0 = torch.cuda.memory_stats(), [g["collections"] for g in gc.get_stats()]
    rec["eager_ms"], rec["eager_host_ms"] = timed(step)
    mem1, gc1 = torch.cuda.memory_stats(), [g["collections"] for g in gc.get_stats()]
    # what could stall the host between launches: the allocator going to the driver, Python's collector
    rec["during_eager"] = {**{k: mem1.get(k, 0) - mem0.get(k, 0) for k in
                              ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams")},
                           "gc_collections": [b - a for a, b in zip(gc0, gc1)]}
    if a.impl == "ucudnn-256" and rec.get("launch_path") == "compiled":
        from ucudnn.torch import fastpath

        kinds: Counter = Counter()
        for _, call in fastpath._keep:      # each compiled program's steps, by the kind of their configuration
            for step in getattr(call.executor, "native_steps", None) or ():
                kinds[step.native.kind] += 1
        rec["native_launches_by_kind"] = dict(kinds)
        counts = list(torch.ops.ucudnn_c.stats())
        rec["launches_compiled"], rec["launches_python"] = sum(counts[:3]), sum(counts[3:])
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            step()
        rec["replayed_ms"], _ = timed(graph.replay)
    except Exception as e:  # noqa: BLE001 - a step that does not capture is reported, not fatal
        rec["replay_error"] = str(e).splitlines()[0][:200]
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--impl", choices=IMPLS)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--mode", default="amp", choices=("fp32", "default", "amp"))
    ap.add_argument("--sources", default=None)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--out", type=Path, default=HERE / "results" / "torch_step_split.json")
    a = ap.parse_args(argv)
    if a.worker:
        print(json.dumps(worker(a)), flush=True)
        return 0
    records = []
    for r in range(a.repeat):
        for impl in a.impls.split(","):
            cmd = [sys.executable, __file__, "--worker", "--impl", impl, "--model", a.model, "--batch",
                   str(a.batch), "--mode", a.mode, "--steps", str(a.steps)] + (
                ["--sources", a.sources] if a.sources else [])
            env = {**os.environ, "UCUDNN_TORCH_FASTPATH": "0"} if impl.endswith("-py") else None
            p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
            rec = json.loads(lines[-1]) if lines else {"impl": impl, "error": p.stderr[-400:]}
            rec["repeat"] = r
            records.append(rec)
            print(json.dumps({k: v for k, v in rec.items() if k not in ("error",)}), flush=True)
    summary = {}
    for impl in a.impls.split(","):
        rows = [r for r in records if r.get("impl") == impl and "eager_ms" in r]
        summary[impl] = {k: round(statistics.median(r[k] for r in rows if k in r), 3)
                         for k in ("eager_ms", "eager_host_ms", "replayed_ms") if any(k in r for r in rows)}
    prov = provenance()
    doc = {"provenance": prov, "summary": summary, "records": records}
    md = [md_header(f"Eager vs replayed training step: {a.model} b{a.batch} {a.mode} (issue 15)", prov),
          f"Workers: torch {records[0].get('torch')}, cuDNN {records[0].get('cudnn')}.  Medians of {a.repeat} fresh "
          "processes per implementation, interleaved.  eager = CUDA-event ms per step; host = wall ms per step "
          "until the last launch is queued; replayed = the same step captured in a CUDA graph (GPU work alone).", "",
          "| impl | eager ms | host ms | replayed ms | eager - replayed |", "|---|---:|---:|---:|---:|"]
    for impl, s in summary.items():
        e, h, rp = s.get("eager_ms"), s.get("eager_host_ms"), s.get("replayed_ms")
        md.append(f"| {impl} | {e} | {h} | {rp} | {'-' if e is None or rp is None else round(e - rp, 3)} |")
    write(a.out.parent, a.out.stem, doc, "\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
