"""Where a training step's GPU sits idle: the gaps between its kernels, PyTorch's step against the converted one
(issue 15's host path; diagnostic, GPU machine).

Why: a converted step whose kernels sum to PyTorch's (``torch_profile.py --kernels``) can still be slower; the
difference is then time the GPU waits, for the host (a call whose launch costs more host time than the GPU work
queued ahead of it) or for a synchronisation.  A CUDA-only profiler trace (no CPU-side events, so the host is
slowed as little as the trace allows) of ``--steps`` steps gives each kernel's start and end; the gaps between
one kernel's end and the next one's start, summed per step, grouped by the pair of kernels around them (the
kernel after a gap is the one the GPU waited for), say where the step waits.

    python benchmarks/torch_gaps.py --model inception_v3 --batch 64 --mode fp32 --impl ucudnn-64
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def gaps(model: str, batch: int, mode: str, impl: str, steps: int = 3) -> dict:
    from torch_profile import _cuda_profile, build

    limit = None if impl == "torch" else impl.split("-")[1] + "MiB"
    prof = _cuda_profile(build(model, batch, mode, limit), steps, warm=4)
    path = tempfile.mktemp(suffix=".json")
    prof.export_chrome_trace(path)
    return {"model": model, "batch": batch, "mode": mode, "impl": impl,
            **summarize(json.load(open(path))["traceEvents"], steps)}


def summarize(events: list[dict], steps: int) -> dict:
    """The GPU's idle time in a chrome trace's device events (kernels, memsets, memcpys; any stream): the gaps
    where no device event runs, per step, with the pair of events around each (the one that ended last before
    it, the one that starts it), a histogram in 5 us bins (100: 100 us and more) and the pairs that waited
    longest over gaps of more than 20 us.  ``busy`` sums the events' durations (events that overlap on several
    streams count each); gaps are measured against the union of the events, so an overlap is never a gap."""
    ks = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")),
                key=lambda e: e["ts"])
    streams = collections.Counter(e.get("args", {}).get("stream") for e in ks)
    busy = sum(e["dur"] for e in ks)
    span = ks[-1]["ts"] + ks[-1]["dur"] - ks[0]["ts"]
    found = []
    end, prev = ks[0]["ts"] + ks[0]["dur"], ks[0]
    for e in ks[1:]:
        g = e["ts"] - end
        if g > 0:
            found.append((g, prev["name"][:70], e["name"][:70]))
        if e["ts"] + e["dur"] > end:
            end, prev = e["ts"] + e["dur"], e
    found.sort(reverse=True)
    hist = collections.Counter(min(int(g // 5) * 5, 100) for g, _, _ in found)
    by_pair: collections.Counter = collections.Counter()
    for g, p, n in found:
        if g > 20:
            by_pair[(p[:50], n[:50])] += g
    return {"span_ms_per_step": span / steps / 1e3, "busy_ms_per_step": busy / steps / 1e3,
            "gap_ms_per_step": sum(g for g, _, _ in found) / steps / 1e3, "n_gaps": len(found) / steps,
            "n_events": len(ks) / steps, "streams": dict(streams), "hist_us": sorted(hist.items()),
            "top_gaps": found[:20], "gap_us_by_pair_over_20us": by_pair.most_common(25)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--mode", default="amp", choices=("fp32", "default", "amp"))
    ap.add_argument("--impl", default="ucudnn-256", help="torch, or ucudnn-<MiB per kernel>")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="append the record (JSON lines) here")
    a = ap.parse_args(argv)
    rec = gaps(a.model, a.batch, a.mode, a.impl, a.steps)
    print("REC", json.dumps(rec))
    if a.out is not None:
        with open(a.out, "a") as f:
            f.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
