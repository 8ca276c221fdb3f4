"""Training steps of torchvision models: plain PyTorch against ``ucudnn.torch.convert``, uncapped and under memory caps.

Issue 15's benchmark (GPU machine).  Each measurement is one fresh process
(a clean caching allocator; ``torch.cuda.set_per_process_memory_fraction`` for
a cap), running synthetic data: one first step (timed with the host clock: for
ucudnn it includes finding plans, from the plan cache or by benchmarking),
``--warmup`` steps, then ``--steps`` steps timed with CUDA events.  Peak memory
is ``torch.cuda.max_memory_allocated()`` over the timed steps (ucudnn's
workspace comes from torch's allocator, so it is counted); ``memory`` keeps
the caching allocator's state beside it (``memory_summary``: allocated,
reserved and inactive-split bytes, segments, retries), on an out-of-memory
too, where it says what the allocator held when it gave up, and ``phase`` which
step failed (the first, a warm-up or a timed one).

Modes: ``fp32`` (strict: TF32 off, as the issue's H100 numbers), ``default``
(PyTorch's defaults: TF32 allowed in cuDNN convolutions), ``amp`` (autocast
float16, channels_last).  PyTorch runs with ``cudnn.benchmark = True``.
Implementations: ``torch``, ``ucudnn-16``, ``ucudnn-64``, ``ucudnn-256`` (MiB per kernel), ``ucudnn-256-replay``
(``convert(replay=True)``)
and ``ucudnn-64-py`` / ``ucudnn-256-py`` (on the Python launch path, ``UCUDNN_TORCH_FASTPATH=0``: the others take the
compiled one, loaded before the first step; records say which ran, ``launch_path``, and how many launches each
side made, ``launches_compiled`` / ``launches_python``).

Caps are percentages of PyTorch's own uncapped peak for that model and mode
(``max_memory_reserved``: what the cap limits; at 100% of its allocated peak
PyTorch's ResNet-50 b128 already runs out of memory, fragmentation included),
in steps of 5%: ``--cap-search`` finds, for ``torch`` and ``ucudnn-64``, the
smallest that still trains (it assumes, as memory does, that a run that fits a
cap fits every larger one, and bisects).  Runs append to ``--out`` (JSON
lines), so a long study can span several commands; ``--only`` runs given
(model, mode) combinations instead of every ``--models`` x ``--modes`` one.

``--repeat N`` runs each uncapped combination N times, the implementations interleaved (torch, ucudnn-64,
ucudnn-256, torch, ...), and the report takes the median images/s of that series: a converted step that is
host-bound moves 10-25% between runs of the same code on the same machine, PyTorch's GPU-bound one does not.

``--sources`` names ucudnn's algorithm sources (``ucudnn.torch.convert(...,
sources=...)``; default: the library's default).  Each record carries the
sources asked for (``sources``, null for the default) and the ones that
meant (``sources_used``), the GPU, torch and cuDNN versions and the time.

``--report`` writes ``results/torch_train.md`` (``--report-md``; ``--report-json``
also a JSON twin) from the records of ``--out`` alone, so it runs anywhere,
no GPU or torch needed: where runs were measured comes from the records
("not recorded" where they predate those fields), never from the machine
writing the report.  It gives issue 15's three bars with their numbers.

    python benchmarks/torch_train.py --models resnet50@128,vgg16@64,alexnet@256 --modes fp32 --cap-search
    python benchmarks/torch_train.py --only resnet50@128:default,vgg16@64:amp --sources legacy,graph
    python benchmarks/torch_train.py --only resnet50@128:amp --impls torch,ucudnn-256 --repeat 3 --steps 30
    python benchmarks/torch_train.py --only alexnet@256:fp32 --impls torch,ucudnn-64 --caps 80,75   # fixed caps
    python benchmarks/torch_train.py --report --out benchmarks/results/torch_train_h100.jsonl
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
OUT = RESULTS / "torch_train.jsonl"
#: the environment an implementation's worker runs under, beyond the caller's, by suffix of ``ucudnn-64-`` /
#: ``ucudnn-256-``: ``py``, ucudnn.torch's Python launch path (the others take the compiled one,
#: ``ucudnn/torch/csrc/launch.cpp``, where it builds, loaded before the first step); ``unwritten`` /
#: ``no-unwritten``, plans that may / never borrow output not written yet (``UCUDNN_UNWRITTEN``; off by default);
#: ``even``, the ``powerOfTwoAndEvenSplits`` batch policy (``UCUDNN_BATCH_SIZE_POLICY``: a mini-batch that is no
#: power of two as near-equal micro-batches; the default since session 17); ``pow2``, μ-cuDNN's ``powerOfTwo``
#: (the default before); ``no-twins``, legacy transform-domain calls kept (``UCUDNN_LEGACY_TWINS=0``); ``no-host-ties``,
#: plans that take the fastest configuration at each size whatever its host work (``UCUDNN_HOST_TIES=0``: planned
#: from the same tables under their own key)
SUFFIX_ENV = {"py": {"UCUDNN_TORCH_FASTPATH": "0"}, "unwritten": {"UCUDNN_UNWRITTEN": "1"},
              "no-unwritten": {"UCUDNN_UNWRITTEN": "0"},
              "even": {"UCUDNN_BATCH_SIZE_POLICY": "powerOfTwoAndEvenSplits"},
              "pow2": {"UCUDNN_BATCH_SIZE_POLICY": "powerOfTwo"}, "no-twins": {"UCUDNN_LEGACY_TWINS": "0"},
              "no-host-ties": {"UCUDNN_HOST_TIES": "0"}}
IMPL_ENV = {f"ucudnn-{mib}-{suffix}": env for suffix, env in SUFFIX_ENV.items() for mib in (64, 256)}
#: each implementation's per-kernel workspace limit (None: plain PyTorch).  ``torch-heuristic``: plain PyTorch with
#: ``cudnn.benchmark`` off (cuDNN's heuristics pick each algorithm): two valid algorithm choices of PyTorch itself,
#: so its loss against ``torch``'s says how far rounding alone moves a model's loss over the steps (the yardstick
#: for a converted model's)
IMPLS = {"torch": None, "torch-heuristic": None, "ucudnn-16": "16MiB", "ucudnn-64": "64MiB", "ucudnn-256": "256MiB",
         "ucudnn-256-replay": "256MiB", **{impl: impl.split("-")[1] + "MiB" for impl in IMPL_ENV}}
MODES = ("fp32", "default", "amp")
#: constructor arguments a torchvision model needs to train as a plain classifier (the auxiliary heads return
#: tuples in training mode, which the step's loss does not take)
MODEL_KWARGS = {"googlenet": {"aux_logits": False, "init_weights": True},
                "inception_v3": {"aux_logits": False, "init_weights": True}}


#: torch.cuda.memory_stats() keys a record keeps (current and peak where the allocator has both): what the caching
#: allocator holds beside the allocations -- why a run can fail under a cap above its own allocated peak
MEMORY_KEYS = ("allocated_bytes.all", "reserved_bytes.all", "inactive_split_bytes.all", "segment.all",
               "allocated_bytes.large_pool", "reserved_bytes.large_pool", "allocated_bytes.small_pool",
               "reserved_bytes.small_pool")
MEMORY_COUNTS = ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free")


def memory_summary(stats: dict) -> dict:
    """The caching allocator's state from ``torch.cuda.memory_stats()``: each :data:`MEMORY_KEYS` entry's current
    and peak value, and the :data:`MEMORY_COUNTS` counters (keys the allocator does not report are left out)."""
    out: dict = {}
    for key in MEMORY_KEYS:
        for when in ("current", "peak"):
            if f"{key}.{when}" in stats:
                out[f"{key}.{when}"] = stats[f"{key}.{when}"]
    out.update({k: stats[k] for k in MEMORY_COUNTS if k in stats})
    return out


def count_plan_origins() -> dict:
    """Counts, filled as the run goes, of where the lookup chain found each kernel's plan (``memory``, ``store``:
    the user cache, ``server``, ``bundle``, ``benchmark``: measured here): the record's ``plans_from``, which says
    whether a first step benchmarked (``benchmarks/torch_first_step.py`` compares a cold cache with a bundle)."""
    from ucudnn.catalog import lookup

    counts: dict = {}
    chain = lookup.kernel_plan

    def counted(*args, **kwargs):
        found = chain(*args, **kwargs)
        where = found.layer.split(":", 1)[0]
        counts[where] = counts.get(where, 0) + 1
        return found

    lookup.kernel_plan = counted
    return counts


def worker(a: argparse.Namespace) -> dict:
    import torch
    import torchvision

    rec = {"model": a.model, "batch": a.batch, "mode": a.mode, "impl": a.impl, "cap_pct": a.cap_pct,
           "cap_bytes": a.cap_bytes, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "cudnn": torch.backends.cudnn.version(), "steps": a.steps, "warmup": a.warmup,
           "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or "default"}   # the caching allocator's settings
    torch.backends.cudnn.benchmark = a.impl != "torch-heuristic"
    torch.backends.cudnn.allow_tf32 = a.mode != "fp32"
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    if a.cap_bytes:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, a.cap_bytes / total), 0)
    torch.manual_seed(0)
    model = getattr(torchvision.models, a.model)(num_classes=1000, **MODEL_KWARGS.get(a.model, {})).to(dev)
    fmt = torch.channels_last if a.mode == "amp" else torch.contiguous_format
    model = model.to(memory_format=fmt)
    if IMPLS[a.impl]:
        import ucudnn.torch

        from ucudnn.torch import fastpath

        rec["warnings"] = heard = []     # what ucudnn said (a layer torch ran, a plan it shrank), first few
        rec["n_warnings"] = 0

        class Heard(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                rec["n_warnings"] += 1
                if len(heard) < 8:
                    heard.append(record.getMessage()[:300])

        logging.getLogger("ucudnn").addHandler(Heard(logging.WARNING))

        ucudnn.torch.convert(model, workspace_limit=IMPLS[a.impl], sources=a.sources,
                             replay=a.impl.endswith("-replay"))
        rec["plans_from"] = count_plan_origins()
        t0 = time.perf_counter()
        fastpath.start(wait=True)       # built once per machine (cached), loaded per process: not a step's cost
        rec["launch_path"] = "compiled" if fastpath.state() == "ready" else "python"
        rec["launch_path_load_s"] = round(time.perf_counter() - t0, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(a.batch, 3, 224, 224, device=dev).to(memory_format=fmt)
    t = torch.randint(0, 1000, (a.batch,), device=dev)

    def step():
        with torch.autocast("cuda", dtype=torch.float16, enabled=a.mode == "amp"):
            loss = torch.nn.functional.cross_entropy(model(x), t)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    phase = "first step"   # where an out-of-memory happens: the first step, a warm-up or a timed one
    try:
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        rec["first_step_s"] = time.perf_counter() - t0
        rec["loss_first"] = loss.item()     # the same seed, weights and data in every implementation's process
        for i in range(a.warmup):
            phase = f"warm-up step {i + 1}"
            step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        # an event after every step (no synchronisation): the steps' spread shows a one-off stall (an allocator
        # refill, a collection) that a mean over few steps would spread over all of them; host = wall ms until
        # the step's last launch is queued
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(a.steps + 1)]
        host = []
        marks[0].record()
        for i in range(a.steps):
            phase = f"timed step {i + 1}"
            t0 = time.perf_counter()
            loss = step()
            host.append((time.perf_counter() - t0) * 1e3)
            marks[i + 1].record()
        torch.cuda.synchronize()
        rec["loss_last"] = loss.item()      # read after the timing: no synchronisation inside it
        ms = marks[0].elapsed_time(marks[-1]) / a.steps
        each = [marks[i].elapsed_time(marks[i + 1]) for i in range(a.steps)]
        rec["step_ms_each"] = [round(v, 3) for v in each]
        rec["step_ms_median"] = statistics.median(each)
        rec["host_ms_median"] = statistics.median(host)
        if IMPLS[a.impl]:   # kernels whose plans take workspace from output not written yet (UCUDNN_UNWRITTEN)
            from ucudnn.torch import runtime

            borrowing = [(key[0], key[1], c.executor.plan) for key, c in runtime._calls.items()
                         if c.executor.takes_unwritten]
            rec["unwritten_kernels"] = len(borrowing)
            rec["unwritten_plans"] = [f"{op} {p.describe()}: " + " ".join(
                f"{cfg.micro_batch}{'*' if cfg.unwritten else ''}/{cfg.source}:{cfg.algo}/{cfg.time_ms:.3f}ms"
                for cfg in plan.configs)
                for op, p, plan in borrowing]
            if a.record_plans:   # every kernel's plan: micro-batches, source:algorithm, predicted ms, workspace
                rec["plans"] = [f"{key[0]} {p.problem.describe()}: {p.summary()} = {p.time_ms:.3f} ms, "
                                f"{p.workspace_bytes >> 20} MiB"
                                for key, p in ((k, c.executor.plan) for k, c in runtime._calls.items())]
        if rec.get("launch_path") == "compiled":   # launches from C++ / handed to Python, over all steps
            counts = list(torch.ops.ucudnn_c.stats())
            rec["launches_compiled"], rec["launches_python"] = sum(counts[:3]), sum(counts[3:])
        rec.update(status="ok", step_ms=ms, images_per_s=a.batch * 1000.0 / ms,
                   peak_allocated=torch.cuda.max_memory_allocated(), peak_reserved=torch.cuda.max_memory_reserved(),
                   memory=memory_summary(torch.cuda.memory_stats()))
    except torch.cuda.OutOfMemoryError as e:
        # the allocator's state where it gave up (peaks over the whole run: the failing step included)
        rec.update(status="oom", phase=phase, error=str(e).splitlines()[0][:400],
                   memory=memory_summary(torch.cuda.memory_stats()))
    return rec


def sources_used(impl: str, sources: str | None) -> str | None:
    """The algorithm sources ``impl``'s convolutions run with: None for PyTorch's; for ucudnn the canonical
    names ``sources`` means (None: the library's default, which depends on the installed extras)."""
    if not IMPLS[impl]:
        return None
    from ucudnn import source_names

    return ",".join(source_names.canonical(sources))


def run_worker(cmd: list[str], timeout: float, env: dict | None = None, tail: int = 400) -> dict:
    """One worker process (``cmd``): the last JSON record it printed, else why there is none (its stderr's last
    ``tail`` characters, or a timeout)."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"status": "timeout"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else {"status": "error", "error": (p.stderr or "")[-tail:]}


def run_one(model: str, batch: int, mode: str, impl: str, args: argparse.Namespace, cap_pct: int | None = None,
            cap_bytes: int | None = None, repeat: int = 0) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--model", model, "--batch", str(batch), "--mode", mode,
           "--impl", impl, "--steps", str(args.steps), "--warmup", str(args.warmup)] + \
        (["--record-plans"] if args.record_plans else [])
    if cap_bytes:
        cmd += ["--cap-pct", str(cap_pct), "--cap-bytes", str(cap_bytes)]
    if args.sources is not None:
        cmd += ["--sources", args.sources]
    env = {**os.environ, **IMPL_ENV[impl]} if impl in IMPL_ENV else None
    t0 = time.perf_counter()
    rec = run_worker(cmd, args.timeout, env)
    rec.update(model=model, batch=batch, mode=mode, impl=impl, cap_pct=cap_pct, cap_bytes=cap_bytes,
               cap_base="peak_reserved" if cap_bytes else None, wall_s=time.perf_counter() - t0,
               sources=args.sources if IMPLS[impl] else None, sources_used=sources_used(impl, args.sources),
               recorded_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), series=args.series,
               repeat=repeat)
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


def combinations(a: argparse.Namespace) -> list[tuple[str, int, str]]:
    """(model, batch, mode) to run: ``--only``'s, else every ``--models`` x ``--modes`` one."""
    specs = [c.split(":", 1) for c in a.only.split(",")] if a.only else \
        [(m, mode) for m in a.models.split(",") for mode in a.modes.split(",")]
    out = []
    for spec, mode in specs:
        model, _, batch = spec.partition("@")
        if not batch.isdigit() or mode not in MODES:
            raise SystemExit(f"torch_train: expected model@batch:mode with a mode of {', '.join(MODES)}, "
                             f"got {spec}:{mode}")
        out.append((model, int(batch), mode))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model"), ap.add_argument("--batch", type=int), ap.add_argument("--mode", choices=MODES)
    ap.add_argument("--impl", choices=list(IMPLS))
    ap.add_argument("--cap-pct", type=int), ap.add_argument("--cap-bytes", type=int)
    ap.add_argument("--models", default="resnet50@128,vgg16@64,alexnet@256,resnet50@256")
    ap.add_argument("--modes", default="fp32,default,amp")
    ap.add_argument("--only", metavar="MODEL@BATCH:MODE,...",
                    help="run only these combinations (e.g. resnet50@128:default,vgg16@64:amp) instead of "
                         "every --models x --modes one")
    ap.add_argument("--impls", default="torch,ucudnn-64,ucudnn-256")
    ap.add_argument("--sources", default=None,
                    help="ucudnn's algorithm sources, e.g. legacy,graph (default: the library's default)")
    ap.add_argument("--cap-search", action="store_true", help="find the smallest cap for torch and ucudnn-64")
    ap.add_argument("--caps", default="", metavar="PCT,...",
                    help="also run every --impls at these caps (percent of PyTorch's uncapped reserved peak of "
                         "the series), e.g. 90,85")
    ap.add_argument("--repeat", type=int, default=1,
                    help="uncapped runs of each combination, interleaved over --impls; the report takes the median "
                         "images/s of a series (host-bound steps move 10-25%% between runs)")
    ap.add_argument("--record-plans", action="store_true",
                    help="converted runs record every kernel's plan (micro-batches, sources, predicted ms)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=300, help="seconds per run")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--report", action="store_true", help="write the Markdown report from the records of --out")
    ap.add_argument("--report-md", default=str(RESULTS / "torch_train.md"))
    ap.add_argument("--report-json", default=None, help="also write the report's JSON twin here")
    ap.add_argument("--reuse", metavar="JSONL", help="take uncapped runs already recorded here instead of rerunning")
    a = ap.parse_args(argv)
    if a.worker:
        print(json.dumps(worker(a)))
        return 0
    if a.report:
        return report(Path(a.out), Path(a.report_md), Path(a.report_json) if a.report_json else None)
    todo = combinations(a)
    done: dict[tuple, dict] = {}
    if a.reuse:
        for line in Path(a.reuse).read_text().splitlines():
            r = json.loads(line)
            if r.get("cap_pct") is None and r.get("status") == "ok":
                done[(r["model"], r["batch"], r["mode"], r["impl"], sources_label(r))] = r
                with open(a.out, "a") as f:
                    f.write(line + "\n")
    a.series = f"{datetime.now(timezone.utc).isoformat(timespec='seconds')}/{os.getpid()}"
    for model, batch, mode in todo:
        base = {impl: done.get((model, batch, mode, impl, sources_used(impl, a.sources)))
                or run_one(model, batch, mode, impl, a) for impl in a.impls.split(",")}
        for rep in range(1, a.repeat):   # interleaved: every impl once per round, so drift hits them alike
            base = {impl: run_one(model, batch, mode, impl, a, repeat=rep) for impl in a.impls.split(",")}
        # caps are percentages of PyTorch's uncapped reserved peak of this series: none without that run
        peak = base["torch"]["peak_reserved"] if base.get("torch", {}).get("status") == "ok" else None
        if a.caps and peak is not None:
            for pct in (int(c) for c in a.caps.split(",")):
                for impl in a.impls.split(","):
                    run_one(model, batch, mode, impl, a, pct, peak * pct // 100)
        if a.cap_search and peak is not None:
            found = {impl: cap_search(model, batch, mode, impl, peak, a) for impl in ("torch", "ucudnn-64")}
            print(f"# {model}@{batch} {mode}: smallest caps {found}", flush=True)
            if found["torch"]:   # bar 2 compares at PyTorch's smallest cap: make sure ucudnn ran there
                for impl in ("ucudnn-64", "ucudnn-256"):
                    if impl != "ucudnn-64" or (found[impl] or 101) < found["torch"]:
                        run_one(model, batch, mode, impl, a, found["torch"], peak * found["torch"] // 100)
    return 0


# --- the report: from records alone ------------------------------------------------------------------------------
MODEL_NAMES = {"resnet50": "ResNet-50", "vgg16": "VGG-16", "alexnet": "AlexNet"}
BAR1_FRACTION, BAR2_SPEEDUP, BAR2_MODELS, BAR3_RATIO = 0.9, 1.3, 2, 0.95
NOT_RECORDED = "not recorded"


def sources_label(r: dict) -> str | None:
    """The sources a run's ucudnn layers used (None for PyTorch's runs).  Runs recorded before records named
    them ran with the legacy source alone: ucudnn.torch passed no sources then, and legacy was the default."""
    if not IMPLS.get(r["impl"]):
        return None
    return r.get("sources_used") or "legacy"


def load(path: Path) -> tuple[dict[tuple, dict], dict[str, int]]:
    """The latest record per (model, batch, mode, impl, sources, cap), and counts: records read, and capped
    records left out for an earlier definition of the cap (% of the allocated peak, not of the reserved one).

    Where the latest record's series (one ``--repeat`` invocation) holds several successful runs of the key, the
    record returned carries their median images/s (``images_per_s``; ``step_ms`` to match) and ``repeats``: the
    count and the images/s of each, so one noisy run does not decide a row.  Records without a series (older
    ones) each stand alone."""
    recs: dict[tuple, dict] = {}
    series: dict[tuple, list[dict]] = {}
    counts = {"records": 0, "old_caps": 0}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        counts["records"] += 1
        if r.get("cap_pct") is not None and r.get("cap_base") != "peak_reserved":
            counts["old_caps"] += 1
            continue
        key = (r["model"], r["batch"], r["mode"], r["impl"], sources_label(r), r.get("cap_pct"))
        same = series.get(key, [])
        series[key] = same + [r] if r.get("series") and same and same[-1].get("series") == r["series"] else [r]
        recs[key] = r
    for key, runs in series.items():
        ok = [r for r in runs if _ok(r)]
        if len(ok) > 1:
            values = sorted(r["images_per_s"] for r in ok)
            med = statistics.median(values)
            recs[key] = {**(recs[key] if _ok(recs[key]) else ok[-1]), "images_per_s": med,
                         "step_ms": key[1] * 1000.0 / med, "repeats": {"n": len(ok), "images_per_s": values}}
    return recs, counts


def _ok(r: dict | None) -> bool:
    return bool(r) and r.get("status") == "ok"


def _smallest_cap(recs: dict[tuple, dict], variant: tuple) -> dict:
    """Where ``variant`` (model, batch, mode, impl, sources) trains under a cap: its smallest surviving cap,
    whether the step below it was tried and failed (then it is the smallest: memory is monotone), every cap
    tried, and the run at that cap."""
    tried = {k[5]: r for k, r in recs.items() if k[:5] == variant and k[5] is not None}
    ok = sorted(c for c, r in tried.items() if _ok(r))
    cap = ok[0] if ok else None
    below = tried.get(cap - 5) if cap is not None else None
    return {"cap": cap, "bracketed": cap is not None and (below is not None and not _ok(below) or cap <= 30),
            "tried": {c: tried[c].get("status") for c in sorted(tried)}, "run": tried.get(cap)}


def _measured_on(runs: list[dict]) -> dict[str, str]:
    """Device, torch and cuDNN of the runs, and their step counts, from the records ("not recorded" where they
    do not say)."""
    out = {}
    for field in ("device", "torch", "cudnn", "warmup", "steps", "alloc_conf"):
        values = sorted({str(r[field]) for r in runs if r.get(field) is not None})
        missing = sum(1 for r in runs if r.get(field) is None)
        text = ", ".join(values) if values else NOT_RECORDED
        if values and missing:
            text += f" ({NOT_RECORDED} for {missing} of {len(runs)} runs)"
        out[field] = text
    stamps = sorted(r["recorded_at"] for r in runs if r.get("recorded_at"))
    out["recorded"] = f"{stamps[0]} to {stamps[-1]}" if stamps else NOT_RECORDED
    out["sources_unrecorded"] = sum(1 for r in runs if IMPLS.get(r["impl"]) and not r.get("sources_used"))
    return out


def summarize(recs: dict[tuple, dict]) -> dict:
    """Rows per (model, mode, implementation) and the bars, as data (the JSON twin; the Markdown renders it)."""
    rows, bar1, bar2, bar3 = [], [], [], []
    variants = sorted({k[:5] for k in recs}, key=lambda v: (_model_order(v[0]), v[1], MODES.index(v[2]),
                                                          list(IMPLS).index(v[3]), v[4] or ""))
    for model, batch, mode, impl, src in variants:
        base = recs.get((model, batch, mode, impl, src, None))
        torch_base = recs.get((model, batch, mode, "torch", None, None))
        caps = _smallest_cap(recs, (model, batch, mode, impl, src))
        rows.append({"model": model, "batch": batch, "mode": mode, "impl": impl, "sources": src,
                     "status": base.get("status") if base else "not run",
                     "images_per_s": base.get("images_per_s") if _ok(base) else None,
                     "repeats": base.get("repeats") if _ok(base) else None,
                     "vs_torch": base["images_per_s"] / torch_base["images_per_s"]
                     if _ok(base) and _ok(torch_base) else None,
                     "peak_allocated": base.get("peak_allocated") if _ok(base) else None,
                     "peak_reserved": base.get("peak_reserved") if _ok(base) else None,
                     "first_step_s": base.get("first_step_s") if base else None,
                     "smallest_cap": caps["cap"], "cap_bracketed": caps["bracketed"], "caps_tried": caps["tried"],
                     "images_per_s_at_cap": caps["run"]["images_per_s"] if caps["run"] else None})
        if impl == "ucudnn-64" and mode == "fp32":
            t = _smallest_cap(recs, (model, batch, mode, "torch", None))
            if t["cap"] is not None:
                need = BAR1_FRACTION * t["cap"]
                decided = caps["bracketed"] and t["bracketed"] or (caps["cap"] is not None and caps["cap"] <= need)
                # the cap the bar asks for, in bytes (caps are % of PyTorch's uncapped reserved peak), against
                # ucudnn-64's own uncapped allocated peak: a cap under that peak leaves no workspace policy room
                need_bytes = need / 100 * torch_base["peak_reserved"] if _ok(torch_base) else None
                own = base.get("peak_allocated") if _ok(base) else None
                bar1.append({"model": model, "batch": batch, "sources": src, "torch_cap": t["cap"],
                             "ucudnn_cap": caps["cap"], "ucudnn_caps_tried": caps["tried"], "needs_at_most": need,
                             "needs_bytes": need_bytes, "ucudnn_peak_allocated": own,
                             "below_own_peak": None if need_bytes is None or own is None else need_bytes < own,
                             "met": caps["cap"] is not None and caps["cap"] <= need, "decided": decided})
                t_run, u_run = t["run"], recs.get((model, batch, mode, impl, src, t["cap"]))
                x = u_run["images_per_s"] / t_run["images_per_s"] if _ok(u_run) else None
                bar2.append({"model": model, "batch": batch, "sources": src, "cap": t["cap"],
                             "torch_images_per_s": t_run["images_per_s"],
                             "ucudnn_images_per_s": u_run["images_per_s"] if _ok(u_run) else None,
                             "ucudnn_status": u_run.get("status") if u_run else "not run", "speedup": x,
                             "met": x is not None and x >= BAR2_SPEEDUP})
        if impl == "ucudnn-256" and _ok(base) and _ok(torch_base):
            x = base["images_per_s"] / torch_base["images_per_s"]
            bar3.append({"model": model, "batch": batch, "mode": mode, "sources": src, "ratio": x,
                         "met": x >= BAR3_RATIO})
    measured_modes = {r["mode"] for r in rows}
    b3_measured = {(b["model"], b["mode"]) for b in bar3}
    return {"rows": rows, "bar1": bar1, "bar2": bar2, "bar3": bar3,
            "modes_not_measured": [m for m in MODES if m not in measured_modes],
            # what the bars need and these records lack: the models without an FP32 cap search (bars 1
            # and 2), its (model, mode) pairs without an uncapped ucudnn-256 / PyTorch pair (bar 3)
            "fp32_caps_not_searched": [m for m in MODEL_NAMES if m not in {b["model"] for b in bar1}],
            "pairs_not_measured": [(m, mode) for mode in MODES for m in MODEL_NAMES if (m, mode) not in b3_measured],
            "models": sorted({(r["model"], r["batch"]) for r in rows}, key=lambda mb: (_model_order(mb[0]), mb[1]))}


def _model_order(model: str) -> tuple[int, str]:
    return (list(MODEL_NAMES).index(model) if model in MODEL_NAMES else len(MODEL_NAMES), model)


def _name(model: str, batch: int) -> str:
    return f"{MODEL_NAMES.get(model, model)} b{batch}"


def _cap_text(cap: int | None, bracketed: bool, tried: dict) -> str:
    if cap is None:
        return "none (" + ", ".join(f"{c}% {s}" for c, s in tried.items()) + ")" if tried else "not searched"
    return f"{cap}%" + ("" if bracketed else " (lower not tried)")


def _verdict(met: bool) -> str:
    return "**met**" if met else "**missed**"


def _repeats_text(rep: dict | None) -> str:
    """" (median of n: lo-hi)" for a row measured several times in one series, else nothing."""
    if not rep:
        return ""
    v = rep["images_per_s"]
    return f" (median of {rep['n']}: {min(v):.0f}-{max(v):.0f})"


def render(summary: dict, meta: dict) -> str:
    gib = 1 << 30
    f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
    unrecorded = meta["device"] == NOT_RECORDED
    md = ["# Training steps: PyTorch vs ucudnn.torch.convert (issue 15)", "",
          f"- measured on: GPU {meta['device']}; torch {meta['torch']}; cuDNN {meta['cudnn']}; "
          f"when: {meta['recorded']}" + (f" (the runs predate these fields; their file is named `{meta['runs']}`)"
                                         if unrecorded else "")
          + (f"; `PYTORCH_CUDA_ALLOC_CONF`: {meta['alloc_conf']}" if meta["alloc_conf"] != NOT_RECORDED else ""),
          f"- runs: `{meta['runs']}`: {meta['records']} records, {meta['distinct']} distinct runs reported (the "
          f"latest of a repeated one, or the median of its series' repeats where it has several), {meta['old_caps']} capped runs of an earlier cap definition (% of the "
          "allocated peak) left out",
          f"- report: generated {meta['date']} by `{meta['command']}` from those recorded runs alone: no number "
          "here was measured by the machine that wrote it", "",
          f"Synthetic data, SGD with momentum, one fresh process per run, warm-up steps: {meta['warmup']}, timed "
          f"steps: {meta['steps']}" + (" (the script's defaults are 2 and 10)" if meta["steps"] == NOT_RECORDED
                                       else "") + "; PyTorch "
          "with `cudnn.benchmark = True` and an unbounded workspace; ucudnn-16 / ucudnn-64 / ucudnn-256: "
          "`ucudnn.torch.convert(workspace_limit=16 / 64 / 256 MiB per kernel)`. fp32 = strict FP32 (TF32 off), "
          "default = PyTorch's defaults (TF32 in cuDNN convolutions). Peak = `torch.cuda.max_memory_allocated()` "
          "(reserved: `max_memory_reserved()`) over the timed steps, ucudnn's workspace included. First step = "
          "host time of the first training step: for ucudnn it includes finding every plan, from the plan cache "
          "or by benchmarking (the records do not say which; ucudnn-64 ran before ucudnn-256 of the same model "
          "and mode, and a kernel's measurements serve every limit). Caps: "
          "`set_per_process_memory_fraction` at a % of PyTorch's own uncapped reserved peak for that model and "
          "mode, in 5% steps; the smallest cap that still trains was bisected between 30% and 100% for PyTorch "
          "and ucudnn-64; ucudnn-256 ran only at PyTorch's smallest cap. Reserved memory includes blocks torch's "
          "caching allocator kept from the first step (for ucudnn, benchmark buffers included); the allocator "
          "releases cached blocks before it reports an out-of-memory, so an uncapped reserved peak is no floor "
          "for the caps." + (f" Sources: the algorithm sources of ucudnn's runs; {meta['sources_unrecorded']} "
                             "ucudnn runs recorded none: they ran the legacy source alone (ucudnn.torch passed no "
                             "sources then, and legacy was the library's default)."
                             if meta["sources_unrecorded"] else ""), "",
          "| model | mode | impl | sources | images/s | vs PyTorch | peak GiB (reserved) | first step s | "
          "smallest cap that trains | images/s there |",
          "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in summary["rows"]:
        ok = r["images_per_s"] is not None
        md.append(f"| {_name(r['model'], r['batch'])} | {r['mode']} | {r['impl']} | {r['sources'] or '-'} | "
                  + (f"{r['images_per_s']:.0f}{_repeats_text(r.get('repeats'))} | {f(r['vs_torch'], '.2f')}x | "
                     f"{r['peak_allocated'] / gib:.2f} ({r['peak_reserved'] / gib:.2f}) | " if ok else
                     f"{r['status']} | | | ")
                  + f"{f(r['first_step_s'], '.1f')} | "
                  + f"{_cap_text(r['smallest_cap'], r['cap_bracketed'], r['caps_tried'])} | "
                  + f"{f(r['images_per_s_at_cap'], '.0f')} |")
    md += ["", "Caps tried (status of the latest run at each):", ""]
    md += [f"- {_name(r['model'], r['batch'])} {r['mode']} {r['impl']}: "
           + ", ".join(f"{c}% {s}" for c, s in r["caps_tried"].items()) for r in summary["rows"] if r["caps_tried"]]

    # bars 1 and 2 are per model (the three: ResNet-50, VGG-16, AlexNet), at the batch its caps were
    # searched at; a model measured at a second batch (ResNet-50 b256) is still one model
    b1, b2, b3 = summary["bar1"], summary["bar2"], summary["bar3"]
    if not any(m in MODEL_NAMES for m, _ in summary["models"]):    # another workload: the bars are not its
        md += ["", f"Issue 15's bars are set on {', '.join(MODEL_NAMES.values())}; none of them is in these records."]
        return "\n".join(md) + "\n"
    md += ["", "## Issue 15's bars", ""]
    # a bar over the three models (and three modes) is decided by these records only where it is missed
    # by what they hold, or they hold every model (and mode) it names: a file of one model's runs does not meet it
    by_model: dict[str, bool] = {}
    for b in b1:
        by_model[b["model"]] = by_model.get(b["model"], True) and b["met"]
    unsearched = [MODEL_NAMES[m] for m in summary["fp32_caps_not_searched"]]
    unsearched_text = f"; no FP32 cap search here for {', '.join(unsearched)}" if unsearched else ""
    verdict1 = "**missed**" if not all(by_model.values()) else "**not decided**" if unsearched else "**met**"
    # bars 1 and 2 compare FP32 caps: records without an FP32 cap search (another mode's) say nothing about them
    none_here = "**not measured here** (no FP32 cap search in these records)"
    md.append(f"1. ucudnn at 64 MiB per kernel trains at a cap at least 10% below the smallest cap PyTorch survives "
              f"(read as: at most {BAR1_FRACTION:.0%} of PyTorch's smallest cap), on every model in FP32: "
              + (f"{verdict1} ({sum(by_model.values())} of {len(by_model)} models measured here{unsearched_text})"
                 if b1 else none_here))
    md += [f"   - {_name(b['model'], b['batch'])}: ucudnn-64 "
           f"{_cap_text(b['ucudnn_cap'], True, b['ucudnn_caps_tried'])} vs PyTorch "
           f"{b['torch_cap']}% (needs <= {b['needs_at_most']:.1f}%): {'met' if b['met'] else 'missed'}"
           + ("" if b["decided"] else " (not decided: a cap below the smallest was not tried)")
           + ("" if b.get("below_own_peak") is None else
              f"; that cap is {b['needs_bytes'] / 2**30:.2f} GiB, ucudnn-64's own uncapped allocated peak "
              f"{b['ucudnn_peak_allocated'] / 2**30:.2f} GiB"
              + (" (the cap is under it: activations, weights and gradients, not workspace, set the floor)"
                 if b["below_own_peak"] else "")) for b in b1]
    met2 = {b["model"] for b in b2 if b["met"]}
    n2, open2 = len(met2), len(unsearched)
    verdict2 = "**met**" if n2 >= BAR2_MODELS else "**missed**" if n2 + open2 < BAR2_MODELS else "**not decided**"
    md.append(f"2. At the smallest cap PyTorch survives, ucudnn (64 MiB per kernel) at least {BAR2_SPEEDUP}x "
              f"PyTorch's images/s on at least {BAR2_MODELS} of the {len(MODEL_NAMES)} models (FP32, where the caps "
              f"were searched): " + (f"{verdict2} ({n2} of {len({b['model'] for b in b2})} models measured here"
                                     f"{unsearched_text})" if b2 else none_here))
    md += [f"   - {_name(b['model'], b['batch'])} at {b['cap']}%: ucudnn-64 "
           + (f"{b['ucudnn_images_per_s']:.0f} vs PyTorch {b['torch_images_per_s']:.0f} images/s = "
              f"{b['speedup']:.2f}x" if b["speedup"] is not None else
              f"{b['ucudnn_status']} vs PyTorch {b['torch_images_per_s']:.0f} images/s")
           + f": {'met' if b['met'] else 'missed'}" for b in b2]
    pairs = summary["pairs_not_measured"]
    missing = [f"{mode} ({', '.join(MODEL_NAMES[m] for m, md_ in pairs if md_ == mode)})"
               for mode in MODES if any(md_ == mode for _, md_ in pairs)]
    measured_met = bool(b3) and all(b["met"] for b in b3)
    # every measured row met but a model x mode unmeasured: the bar is open, not missed
    verdict3 = "**not decided**" if measured_met and missing else _verdict(measured_met)
    md.append(f"3. Uncapped, ucudnn at 256 MiB per kernel at least {BAR3_RATIO}x PyTorch's images/s on every model "
              f"and mode: {verdict3} ({sum(b['met'] for b in b3)} of {len(b3)} measured model x mode"
              + (f"; not measured here: {'; '.join(missing)}" if missing else "") + ")")
    md += [f"   - {_name(b['model'], b['batch'])} {b['mode']}: {b['ratio']:.2f}x: {'met' if b['met'] else 'missed'}"
           for b in b3]
    return "\n".join(md) + "\n"


def report(path: Path, md_path: Path, json_path: Path | None = None) -> int:
    """The Markdown report (and, asked for, its JSON twin) from the records of ``path``; no GPU or torch needed."""
    recs, counts = load(path)
    summary = summarize(recs)
    meta = {**_measured_on(list(recs.values())), "runs": path.name, **counts, "distinct": len(recs),
            "date": datetime.now(timezone.utc).isoformat(timespec="minutes"),
            "command": "python benchmarks/torch_train.py " + " ".join(sys.argv[1:])}
    text = render(summary, meta)
    md_path.write_text(text)
    if json_path is not None:
        json_path.write_text(json.dumps({"meta": meta, **summary, "runs": list(recs.values())}, indent=1,
                                        default=str) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
