"""Where a training step's host time goes, sampled by py-spy with native frames (issue 15's bar 3; GPU machine).

cProfile instruments every Python call and moves the costs it measures (a converted ResNet-50 AMP step: 61 ms
profiled against 37 ms plain, ``torch_profile-resnet50-amp-direct.md``); py-spy samples the running process from
outside (pausing it a few microseconds per sample, 251 times a second), Python and native frames alike, so the shares it
reports are those of the real step.  One implementation per process (``--impl torch`` or ``ucudnn``): the model is
built as ``torch_profile.build`` builds it, warmed up (ucudnn: its plans found or benchmarked), timed (CUDA-event
ms per step and the host's ms to issue one, ``torch_profile.step_times``), then stepped while py-spy samples it for
``--seconds``; the same steps are then timed with Python's cyclic garbage collector off and on again (does
collection show in the step?).

Writes ``--out``/torch_host_spy-MODEL-MODE-IMPL.{json,md}: samples by layer of the call path (ucudnn's Python,
torch's Python, the autograd engine, cuDNN, the CUDA driver, the interpreter), the top frames by own samples and
by inclusive samples.  Needs ``py-spy`` (a wheel: ``pip download py-spy``).

    python benchmarks/torch_host_spy.py --impl ucudnn --model resnet50 --batch 128 --mode amp --out /tmp/out
    python benchmarks/torch_host_spy.py --resummarise RUN.json spy-ucudnn.raw OUT_DIR
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import gc
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import md_header, provenance, write  # noqa: E402

#: (layer, test on a frame's text): the first that matches names the layer a sample's innermost frame is in
LAYERS = [
    ("cudnn (native)", lambda f: "libcudnn" in f),
    ("cuda driver / runtime (native)", lambda f: "libcuda" in f or "libcudart" in f),
    ("cublas (native)", lambda f: "libcublas" in f),
    ("torch C++ (native)", lambda f: "libtorch" in f or "libc10" in f or "_C.cpython" in f),
    ("cudnn-frontend binding (native)", lambda f: "_compiled_module" in f),
    ("ucudnn (Python)", lambda f: _in(f, "ucudnn/")),
    ("torch (Python)", lambda f: _in(f, "torch/") or _in(f, "torchvision/")),
    ("python interpreter (native)", lambda f: "libpython" in f or "python3" in f.split("(")[-1]),
]


def _in(frame: str, package: str) -> bool:
    """Whether a Python frame (``func (path:line)``; paths relative to sys.path entries) is in ``package``."""
    return f"({package}" in frame or f"/{package}" in frame


def frame_layer(frame: str) -> str:
    for name, test in LAYERS:
        if test(frame):
            return name
    return "other"


def parse_raw(path: Path) -> collections.Counter:
    """py-spy's ``--format raw`` (collapsed stacks, ``frame;frame;... count``) as a Counter of stack tuples."""
    stacks: collections.Counter = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks[tuple(stack.split(";"))] += int(count)
    return stacks


def summarise(stacks: collections.Counter, top: int = 40) -> dict:
    total = sum(stacks.values())
    own: collections.Counter = collections.Counter()
    incl: collections.Counter = collections.Counter()
    layers: collections.Counter = collections.Counter()
    ucudnn_incl = 0
    for stack, n in stacks.items():
        own[stack[-1]] += n
        layers[frame_layer(stack[-1])] += n
        for f in set(stack):
            incl[f] += n
        if any(_in(f, "ucudnn/") for f in stack):
            ucudnn_incl += n
    pct = lambda v: round(100.0 * v / max(total, 1), 2)  # noqa: E731
    return {"samples": total, "ucudnn_inclusive_pct": pct(ucudnn_incl),
            "layers_pct": {k: pct(v) for k, v in layers.most_common()},
            "top_own": [[f, pct(v)] for f, v in own.most_common(top)],
            "top_inclusive": [[f, pct(v)] for f, v in incl.most_common(top)]}


def allow_ptrace() -> None:
    """Let any process of this user read this one (Yama's ptrace_scope 1 lets only ancestors; py-spy is a child)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(0x59616D61, ctypes.c_ulong(-1 & 0xFFFFFFFFFFFFFFFF), 0, 0, 0)   # PR_SET_PTRACER, ANY
    except Exception:  # noqa: BLE001 - best effort: py-spy reports if it cannot attach
        pass


def timed_steps(step, n: int) -> float:
    import torch

    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n):
        step()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / n


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--resummarise":   # --resummarise RUN.json RAW OUT
        resummarise(*sys.argv[2:5])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--impl", choices=("torch", "ucudnn"), required=True)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--mode", default="amp", choices=("fp32", "default", "amp"))
    ap.add_argument("--limit", default="256MiB")
    ap.add_argument("--sources", default=None)
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--rate", type=int, default=251)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--blocks", type=int, default=8, help="blocks of 10 steps timed one after another (drift)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args()

    from torch_profile import build, step_times

    spy = shutil.which("py-spy")
    t0 = time.perf_counter()
    step = build(args.model, args.batch, args.mode, args.limit if args.impl == "ucudnn" else None, args.sources)
    step()
    first_s = time.perf_counter() - t0
    times = step_times(step, args.steps)
    gc_ms = {"on": timed_steps(step, args.steps)}
    gc.disable()
    gc_ms["off"] = timed_steps(step, args.steps)
    gc.enable()
    gc_ms["on_again"] = timed_steps(step, args.steps)
    drift = [round(timed_steps(step, 10), 3) for _ in range(args.blocks)]   # does the step slow down over time?
    doc = {"provenance": provenance(), "args": vars(args), "first_step_s": round(first_s, 2), "times": times,
           "gc_ms": {k: round(v, 3) for k, v in gc_ms.items()}, "drift_ms_per_10_steps": drift}
    if spy is None:
        doc["error"] = "py-spy is not installed"
    else:
        allow_ptrace()
        raw = Path(args.out) / f"spy-{args.impl}.raw"
        raw.parent.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen([spy, "record", "--pid", str(os.getpid()), "--rate", str(args.rate), "--duration",
                                 str(args.seconds), "--native", "--format", "raw", "-o", str(raw)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        steps = 0
        while proc.poll() is None:
            step()
            steps += 1
        import torch

        torch.cuda.synchronize()
        doc["spy_log"] = (proc.stdout.read() if proc.stdout else "")[-2000:]
        doc["spy_steps"] = steps
        if raw.exists():
            doc["spy"] = summarise(parse_raw(raw))
        else:
            doc["error"] = "py-spy wrote no samples"
    write_report(args.out, doc)


def markdown(doc: dict) -> str:
    a, times = doc["args"], doc["times"]
    md = [md_header(f"Host samples of a {a['model']} b{a['batch']} {a['mode']} training step: {a['impl']}",
                    doc["provenance"]),
          f"Step: {times['gpu_ms']:.2f} GPU ms, host issues one in {times['host_issue_ms']:.2f} ms; "
          f"GC on / off / on: {doc['gc_ms']}; blocks of 10 steps in order: "
          f"{doc.get('drift_ms_per_10_steps')} ms.  First step {doc['first_step_s']} s.", ""]
    s = doc.get("spy")
    if s:
        md += [f"py-spy ({a['rate']} samples/s with native frames, the process paused per sample): {s['samples']} "
               f"samples over {doc['spy_steps']} steps; ucudnn on the stack in {s['ucudnn_inclusive_pct']}%.", "",
               "| innermost frame's layer | % of samples |", "|---|---:|"]
        md += [f"| {k} | {v} |" for k, v in s["layers_pct"].items()]
        md += ["", "Top frames by own samples (%):", ""] + [f"- {v} `{f[:200]}`" for f, v in s["top_own"]]
        md += ["", "Top frames by inclusive samples (%):", ""] + [f"- {v} `{f[:200]}`" for f, v in s["top_inclusive"]]
    else:
        md.append(f"py-spy: {doc.get('error')} ({doc.get('spy_log', '')[-300:]})")
    return "\n".join(md) + "\n"


def write_report(out: str, doc: dict) -> None:
    a = doc["args"]
    write(out, f"torch_host_spy-{a['model']}-{a['mode']}-{a['impl']}", doc, markdown(doc))


def resummarise(json_path: str, raw_path: str, out: str) -> None:
    """Rebuild a recorded run's summary and report from its py-spy raw file (e.g. after the frame layers
    change): the samples are the run's, only their grouping is redone."""
    doc = json.loads(Path(json_path).read_text())
    doc["spy"] = summarise(parse_raw(Path(raw_path)))
    write_report(out, doc)


if __name__ == "__main__":
    main()
