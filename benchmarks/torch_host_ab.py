"""Before / after one change of ucudnn's host path: converted training steps of two code trees, interleaved.

Why interleaved pairs: a converted ResNet-50 b128 AMP step is host-bound, and on the GPU machine its host time
moves by 10-25% between runs of the same code on the same machine (one run 37.7 ms, the next 49.1), and more
between machines, while PyTorch's own step is GPU-bound and steady.  A change is judged by pairs run back to back
(before, after, before, after, ...) on one machine, each a fresh process of ``torch_train.py`` on the same plans
(the plan cache answers after the first benchmark), never by runs from different calls.

    # on the GPU machine, with the change's parent checked out in BEFORE (e.g. git archive ... | tar -x -C BEFORE)
    python benchmarks/torch_host_ab.py --before BEFORE --pairs 3 --out ab.jsonl
    # anywhere: the report from recorded pairs
    python benchmarks/torch_host_ab.py --report benchmarks/results/torch_host_ab.jsonl

Records are ``torch_train.py`` records with ``label`` (before / after / torch), ``commit`` and ``machine`` added.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def _run_one(tree: Path, only: str, steps: int, sources: str, impls: str) -> list[dict]:
    """One torch_train.py process of ``tree``'s code; its records."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.jsonl"
        others = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                  if p and Path(p).resolve() not in (HERE.parent, tree)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), *others])}   # this tree's ucudnn first
        subprocess.run([sys.executable, str(tree / "benchmarks" / "torch_train.py"), "--only", only, "--impls", impls,
                        "--sources", sources, "--steps", str(steps), "--out", str(out)], env=env, check=False,
                       cwd=tree, timeout=600)
        return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def run(before: Path, after: Path, pairs: int, only: str, steps: int, sources: str, machine: str) -> list[dict]:
    records = [{**r, "label": "torch", "machine": machine} for r in _run_one(after, only, steps, sources, "torch")]
    for _ in range(pairs):
        for label, tree in (("before", before), ("after", after)):
            records += [{**r, "label": label, "machine": machine}
                        for r in _run_one(tree, only, steps, sources, "ucudnn-256")]
    return records


def report(records: list[dict]) -> tuple[dict, str]:
    """Per machine: before / after step times in run order, the pairs' ratios (after / before, each after-run
    against the before-run just preceding it), medians, and PyTorch's step on that machine."""
    doc: dict = {"machines": {}}
    md = ["# Host path before / after, interleaved on one machine (issue 15)", "",
          "ResNet-50 b128 AMP training steps (`torch_train.py` records, `ucudnn-256`, sources legacy,graph,fold); "
          "step ms = CUDA-event time per step over the timed steps.  Pairs: each `after` run against the `before` "
          "run just before it.", "",
          "| machine | before ms (in order) | after ms (in order) | after / before per pair | median before | "
          "median after | PyTorch ms | after vs PyTorch (median) |", "|---|---|---|---|---:|---:|---:|---:|"]
    for machine in sorted({r["machine"] for r in records}):
        rows = [r for r in sorted(records, key=lambda r: r["recorded_at"]) if r["machine"] == machine
                and r["mode"] == "amp"]
        before = [r["step_ms"] for r in rows if r["label"] == "before"]
        after = [r["step_ms"] for r in rows if r["label"] == "after"]
        torch_ms = [r["step_ms"] for r in rows if r["label"] == "torch"]
        ratios, last_before = [], None
        for r in rows:
            if r["label"] == "before":
                last_before = r["step_ms"]
            elif r["label"] == "after" and last_before is not None:
                ratios.append(round(r["step_ms"] / last_before, 3))
                last_before = None
        mb = statistics.median(before) if before else None
        ma = statistics.median(after) if after else None
        mt = statistics.median(torch_ms) if torch_ms else None
        doc["machines"][machine] = {"before_ms": before, "after_ms": after, "pair_ratios": ratios,
                                    "median_before_ms": mb, "median_after_ms": ma, "torch_ms": torch_ms,
                                    "after_vs_torch": None if not (ma and mt) else round(mt / ma, 3),
                                    "commits": sorted({r.get("commit", "?") for r in rows})}
        f = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        md.append(f"| {machine} | {', '.join(f'{v:.2f}' for v in before)} | {', '.join(f'{v:.2f}' for v in after)} "
                  f"| {', '.join(map(str, ratios)) or '-'} | {f(mb)} | {f(ma)} | {f(mt)} | "
                  f"{'-' if not (ma and mt) else f'{mt / ma:.2f}x'} |")
    dev = sorted({r.get("device", "?") for r in records})
    md += ["", f"Device: {', '.join(dev)}; torch {sorted({r.get('torch', '?') for r in records})}, cuDNN "
           f"{sorted({r.get('cudnn', '?') for r in records})}; recorded "
           f"{min(r['recorded_at'] for r in records)} to {max(r['recorded_at'] for r in records)}.", ""]
    return doc, "\n".join(md) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="a checkout of the code before the change (its own benchmarks/)")
    ap.add_argument("--after", type=Path, default=HERE.parent)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--only", default="resnet50@128:amp")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--sources", default="legacy,graph,fold")
    ap.add_argument("--machine", default="m1", help="a name for this machine in the records")
    ap.add_argument("--out", type=Path, default=Path("torch_host_ab.jsonl"))
    ap.add_argument("--report", type=Path, metavar="JSONL", help="write torch_host_ab.md/.json from these records")
    a = ap.parse_args(argv)
    if a.report:
        records = [json.loads(line) for line in a.report.read_text().splitlines() if line.strip()]
        doc, md = report(records)
        doc["command"] = "python benchmarks/torch_host_ab.py " + " ".join(argv if argv is not None else sys.argv[1:])
        (RESULTS / "torch_host_ab.json").write_text(json.dumps(doc, indent=1) + "\n")
        (RESULTS / "torch_host_ab.md").write_text(md)
        print(md)
        return 0
    if a.before is None:
        ap.error("--before is required to run pairs (or --report to write the report)")
    records = run(a.before.resolve(), a.after.resolve(), a.pairs, a.only, a.steps, a.sources, a.machine)
    with a.out.open("a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
