"""Issue 16: how long a first API call takes, full benchmark (``UCUDNN_BENCHMARK=full``) vs heuristic mode.

Each case runs in a fresh process with an empty plan cache (its own ``UCUDNN_DATABASE``), as a new user's first
call would: CuPy and the inputs are set up first, then one ``ucudnn.conv2d_*`` call is timed from call to
result (device synchronised), which includes loading cuDNN, the lookup chain and either the benchmark (full)
or cuDNN's heuristic plan (heuristic).  In heuristic mode the script then waits for the background benchmark
(``ucudnn.wait_for_benchmarks``) and times the heuristic plan's execution against the measured plan's (median
of 20 calls each), so the cost of running un-benchmarked for a while is visible too.

Bar: a first call in heuristic mode returns in under 1 s.  Cases: the issue's stall (FP16 NHWC, batch 129, 5x5
stride 2, backward data), AlexNet b256 conv2 FP32 forward, and awkward shapes (C = 3 7x7 stride 2 first layer,
odd batch 255, non-square 1x7 filter, depthwise 3x3 stride 2, C = 1 grayscale 5x5).

    python benchmarks/first_call.py --out benchmarks/results          # GPU machine; about 2-4 minutes
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import md_header, provenance, write  # noqa: E402

#: name -> (op, dtype, layout, n, c, h, w, k, r, s, pad, stride, groups)
CASES = {
    "issue16-dgrad-fp16-nhwc-b129-5x5s2": ("backward_data", "float16", "NHWC", 129, 64, 56, 56, 128, 5, 5, 2, 2, 1),
    "alexnet-conv2-fp32-fwd-b256": ("forward", "float32", "NCHW", 256, 96, 27, 27, 256, 5, 5, 2, 1, 1),
    "resnet-conv1-fp32-wgrad-b128-c3-7x7s2": ("backward_filter", "float32", "NCHW", 128, 3, 224, 224, 64, 7, 7, 3, 2, 1),
    "odd-b255-fp32-fwd-3x3": ("forward", "float32", "NCHW", 255, 64, 28, 28, 64, 3, 3, 1, 1, 1),
    "nonsquare-1x7-fp16-nhwc-fwd": ("forward", "float16", "NHWC", 64, 128, 17, 17, 192, 1, 7, 0, 1, 1),
    "depthwise-3x3s2-fp32-dgrad": ("backward_data", "float32", "NCHW", 64, 144, 56, 56, 144, 3, 3, 1, 2, 144),
    "gray-c1-5x5-fp32-fwd": ("forward", "float32", "NCHW", 256, 1, 64, 64, 32, 5, 5, 2, 1, 1),
}
BAR_S = 1.0


def init_only() -> dict:
    """What any first call pays before ucudnn does anything of its own: loading cuDNN and creating a handle."""
    import cupy as cp

    from ucudnn.binding import cudnn
    from ucudnn.binding.gpu import handle

    cp.zeros(1).sum()
    cp.cuda.runtime.deviceSynchronize()
    t0 = time.perf_counter()
    cudnn.load()
    handle()
    return {"cudnn_load_and_handle_s": round(time.perf_counter() - t0, 4)}


def one(case: str, mode: str) -> dict:
    """One first call in this (fresh) process."""
    import cupy as cp

    import ucudnn

    op, dtype, layout, n, c, h, w, k, r, s, pad, stride, groups = CASES[case]
    p = ucudnn.ConvProblem(n, c, h, w, k, r, s, pad=pad, stride=stride, groups=groups, dtype=dtype, layout=layout)
    rng = cp.random.default_rng(0)

    def arr(shape):
        return rng.standard_normal(shape, dtype="float32").astype(dtype)

    x, wt, dy = arr(p.x_shape()), arr(p.w_shape()), arr(p.y_shape())
    kw = dict(stride=stride, padding=pad, groups=groups, layout=layout, workspace_limit="64MiB")
    call = {"forward": lambda: ucudnn.conv2d_forward(x, wt, **kw),
            "backward_data": lambda: ucudnn.conv2d_backward_data(wt, dy, x.shape, **kw),
            "backward_filter": lambda: ucudnn.conv2d_backward_filter(x, dy, wt.shape, **kw)}[op]
    cp.cuda.runtime.deviceSynchronize()
    prof = cProfile.Profile() if os.environ.get("FIRST_CALL_PROFILE") else None
    t0 = time.perf_counter()
    if prof is not None:
        prof.enable()
    call()
    cp.cuda.runtime.deviceSynchronize()
    first = time.perf_counter() - t0
    if prof is not None:   # where a first call's time goes (cumulative, top 30): for diagnosis, not the table
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(30)
        print(text.getvalue(), file=sys.stderr)
    out = {"first_call_s": round(first, 4), "problem": p.describe(), "op": op}
    plan = ucudnn.get_plan(p, op, workspace_limit="64MiB")
    out["first_plan"] = plan.summary()

    def median_ms() -> float:
        for _ in range(3):
            call()
        times = []
        for _ in range(20):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record()
            call()
            b.record()
            b.synchronize()
            times.append(cp.cuda.get_elapsed_time(a, b))
        return round(statistics.median(times), 4)

    if mode == "heuristic":
        # the first call of another kernel in this process, cuDNN already loaded: a model's later layers
        x2, dy2 = x[: n - 1], dy[: n - 1]
        other = {"forward": lambda: ucudnn.conv2d_forward(x2, wt, **kw),
                 "backward_data": lambda: ucudnn.conv2d_backward_data(wt, dy2, x2.shape, **kw),
                 "backward_filter": lambda: ucudnn.conv2d_backward_filter(x2, dy2, wt.shape, **kw)}[op]
        t0 = time.perf_counter()
        other()
        cp.cuda.runtime.deviceSynchronize()
        out["next_kernel_first_call_s"] = round(time.perf_counter() - t0, 4)
        out["heuristic_plan_ms"] = median_ms()
        t1 = time.perf_counter()
        ucudnn.wait_for_benchmarks()
        out["background_benchmark_s"] = round(time.perf_counter() - t1, 3)
        out["measured_plan"] = ucudnn.get_plan(p, op, workspace_limit="64MiB").summary()
    out["measured_plan_ms"] = median_ms()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--modes", default="heuristic,full")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--cache", choices=("fresh", "existing"), default="fresh", help="fresh: no plan cache yet (a "
                    "first run on this machine: the cache is created and migrated inside the first call); existing: an "
                    "empty cache made beforehand (later processes)")
    ap.add_argument("--suffix", default="", help="first_call[-SUFFIX].{json,md}")
    ap.add_argument("--one", help=argparse.SUPPRESS)   # case:mode (child process)
    args = ap.parse_args()
    if args.one:
        case, mode = args.one.split(":")
        print("RESULT " + json.dumps(init_only() if case == "init" else one(case, mode)), flush=True)
        return
    prov = provenance()
    prov["cache"] = args.cache
    done = subprocess.run([sys.executable, __file__, "--one", "init:-"], capture_output=True, text=True, timeout=120)
    prov["init"] = next((json.loads(ln[7:]) for ln in done.stdout.splitlines() if ln.startswith("RESULT ")),
                        {"error": done.stderr.strip().splitlines()[-3:]})
    print(f"init: {prov['init']}", flush=True)
    rows = []
    for case in args.cases.split(","):
        row = {"case": case, "runs": {}}
        for mode in args.modes.split(","):
            with tempfile.TemporaryDirectory() as d:
                env = {**os.environ, "UCUDNN_BENCHMARK": mode, "UCUDNN_DATABASE": str(Path(d) / "cache.sqlite")}
                if args.cache == "existing":   # a user's cache from earlier runs: made, migrated, holding nothing
                    from ucudnn.catalog.store import Store

                    Store(env["UCUDNN_DATABASE"])
                env.pop("UCUDNN_PLAN_SERVER", None)
                env.pop("UCUDNN_BUNDLE_PATH", None)
                done = subprocess.run([sys.executable, __file__, "--one", f"{case}:{mode}"], capture_output=True,
                                      text=True, env=env, timeout=400)
            res = next((json.loads(ln[7:]) for ln in done.stdout.splitlines() if ln.startswith("RESULT ")),
                       {"error": (done.stderr or done.stdout).strip().splitlines()[-3:]})
            print(f"{case} {mode}: {res}", flush=True)
            if os.environ.get("FIRST_CALL_PROFILE"):
                print(done.stderr[-6000:], file=sys.stderr)
            row["runs"][mode] = res
        rows.append(row)
        write(args.out, "first_call" + (f"-{args.suffix}" if args.suffix else ""),
              {"provenance": prov, "bar_s": BAR_S, "cache": args.cache, "rows": rows}, markdown(prov, rows))


def markdown(prov: dict, rows: list) -> str:
    lines = [md_header(f"First API call: full benchmark vs heuristic mode (fresh process, {prov.get('cache')} plan "
                       "cache, 64 MiB)", prov),
             "", f"Bar: a first call in heuristic mode under {BAR_S:g} s. Plan times: median of 20 calls; the "
             "heuristic plan runs until the background benchmark is done. 'next kernel': the first call of a "
             "second kernel in the same process (cuDNN loaded). Loading cuDNN and creating a handle alone, in a "
             f"fresh process: {prov.get('init')}.", "",
             "| case | first call, full (s) | first call, heuristic (s) | bar | next kernel, heuristic (s) | "
             "heuristic plan ms | measured plan ms | background benchmark s | heuristic plan | measured plan |",
             "|---|---:|---:|---|---:|---:|---:|---:|---|---|"]
    for r in rows:
        f, h = r["runs"].get("full", {}), r["runs"].get("heuristic", {})
        first = h.get("first_call_s")
        bar = "-" if first is None else ("ok" if first < BAR_S else "MISS")
        lines.append(f"| {r['case']} | {f.get('first_call_s', f.get('error', '-'))} | "
                     f"{first if first is not None else h.get('error', '-')} | {bar} | "
                     f"{h.get('next_kernel_first_call_s', '-')} | {h.get('heuristic_plan_ms', '-')} | "
                     f"{h.get('measured_plan_ms', f.get('measured_plan_ms', '-'))} | {h.get('background_benchmark_s', '-')} | "
                     f"{h.get('first_plan', '-')} | {h.get('measured_plan', f.get('first_plan', '-'))} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
