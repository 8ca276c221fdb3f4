"""Why WR legacy+graph at 64 MiB loses to PyTorch in TF32 on AlexNet: a focused diagnosis (GPU), and its report.

On the worst AlexNet b256 TF32 kernels (NCHW and NHWC):

1. PyTorch's own choice: cudnn.benchmark with the cuDNN frontend's log on
   (``CUDNN_FRONTEND_LOG_INFO=1``, in a subprocess so ucudnn's frontend stays
   quiet): every plan PyTorch timed and the one it keeps; the profiler's
   kernel names and PyTorch's median time.
2. The graph source at n = 256 with no practical workspace cap: is PyTorch's
   plan among ours, at what time and workspace.
3. The fastest configuration within 64 MiB at micro-batch sizes 16-256,
   powers of two and between, and the WR optimum over powers of two vs over
   those sizes too (would a finer batch-size policy pay?).
4. Knob enumeration of the top engines through the frontend's
   ``create_execution_plan(engine_id, knobs)`` (random knob combinations).
5. Executor host time vs CUDA-graph replay of a kernel plan.

    python benchmarks/graph_wr_diagnose.py                      # GPU: raw outputs under $OUT
    python benchmarks/graph_wr_diagnose.py --report RAW_DIR     # no GPU: results JSON + Markdown
"""
import itertools
import json
import os
import random
import re
import subprocess
import sys
import time

OUT = os.environ.get("OUT", "/tmp/out")
FOCUS = {("NCHW", "conv1/backward_data"), ("NCHW", "conv1/backward_filter"), ("NCHW", "conv2/forward"),
         ("NCHW", "conv2/backward_filter"), ("NHWC", "conv1/backward_data"), ("NHWC", "conv1/backward_filter"),
         ("NHWC", "conv2/backward_filter"), ("NHWC", "conv1/forward")}
LIM = 64 << 20
#: a plan PyTorch timed, as the frontend logs it: "Plan ConvBwdData_eng50 took    1.57571"
TORCH_PLAN = re.compile(r"Plan \w+?_(eng\S+) took\s+([\d.]+)")
T0 = time.perf_counter()


def log(*a):
    print(f"[{time.perf_counter() - T0:6.1f}s]", *a, flush=True)


def kernels(layout):
    from ucudnn.planning.network import load_network
    seen, out = set(), []
    for k in load_network("alexnet").kernels(256, "float32", layout):
        if (k.problem, k.op) not in seen:
            seen.add((k.problem, k.op))
            out.append(k)
    return out


TORCH_CHILD = r'''
import sys, torch, torch.nn.functional as F
sys.path.insert(0, ".")
from ucudnn.network import load_network
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = True
focus = set(tuple(x.split("|")) for x in sys.argv[1].split(","))
for layout in ("NCHW", "NHWC"):
    seen = set()
    for k in load_network("alexnet").kernels(256, "float32", layout):
        if (layout, k.name) not in focus: continue
        p = k.problem
        mf = torch.channels_last if layout == "NHWC" else torch.contiguous_format
        x = torch.randn(p.n, p.c, p.h, p.w, device="cuda").to(memory_format=mf)
        w = torch.randn(p.k, p.c, p.r, p.s, device="cuda").to(memory_format=mf)
        dy = torch.randn(p.n, p.k, p.p, p.q, device="cuda").to(memory_format=mf)
        kw = dict(stride=p.stride, padding=p.pad, dilation=p.dilation, groups=p.groups)
        if k.op == "forward":
            fn = lambda: F.conv2d(x, w, **kw)
        else:
            mask = [k.op == "backward_data", k.op == "backward_filter", False]
            fn = lambda: torch.ops.aten.convolution_backward(dy, x, w, None, list(p.stride), list(p.pad), list(p.dilation), False, [0, 0], p.groups, mask)
        print(f"@@BEGIN {layout} {k.name}", flush=True)
        fn(); torch.cuda.synchronize()
        print(f"@@END {layout} {k.name}", flush=True)
        for _ in range(3): fn()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ts = []
        for _ in range(7):
            s.record(); [fn() for _ in range(5)]; e.record(); e.synchronize(); ts.append(s.elapsed_time(e) / 5)
        ts.sort()
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3): fn()
            torch.cuda.synchronize()
        ev = [(e.key, e.device_time_total / 3, e.count) for e in prof.key_averages() if e.device_time_total > 0]
        ev.sort(key=lambda t: -t[1])
        print(f"@@TORCH {layout} {k.name} median {ts[3]:.4f} ms; kernels: " + " | ".join(f"{n[:90]} {t/1e3:.4f}ms x{c//3}" for n, t, c in ev[:4]), flush=True)
'''


def part1_torch():
    env = dict(os.environ, CUDNN_FRONTEND_LOG_INFO="1", CUDNN_FRONTEND_LOG_FILE="stdout")
    arg = ",".join(f"{l}|{n}" for l, n in sorted(FOCUS))
    r = subprocess.run([sys.executable, "-c", TORCH_CHILD, arg], env=env, capture_output=True, text=True, timeout=150)
    text = r.stdout
    open(f"{OUT}/torch_fe_log.txt", "w").write(text + "\n---stderr---\n" + r.stderr[-20000:])
    choices = {}
    cur = None
    plans = []
    for line in text.splitlines():
        if line.startswith("@@BEGIN"):
            cur = tuple(line.split()[1:3]); plans = []
        elif line.startswith("@@END"):
            plans.sort(key=lambda t: t[1])
            choices[cur] = plans
            log("torch", cur, "plans timed:", len(plans), "best:", plans[:4])
            cur = None
        elif line.startswith("@@TORCH"):
            log(line)
        elif cur is not None:
            m = TORCH_PLAN.search(line)
            if m:
                plans.append((m.group(1), float(m.group(2))))
    if r.returncode:
        log("torch child rc", r.returncode, r.stderr[-1500:])
    log("torch log lines", len(text.splitlines()))
    return choices


def main():
    os.makedirs(OUT, exist_ok=True)
    choices = part1_torch()

    import cupy as cp

    from ucudnn.binding.gpu import handle
    from ucudnn.binding.timing import time_ms
    from ucudnn.measure.benchmarking import Buffers
    from ucudnn.measure.sources import registry
    from ucudnn.measure.sources.base import BenchSettings
    from ucudnn.measure.sources.graph import EngineIdentity, GraphSource, scratch_bytes
    from ucudnn.planning import wr

    src = GraphSource()
    registry.register(src)
    fe = src._frontend()
    log("frontend", getattr(fe, "__version__", "?"), "knob_type members:",
        {m: int(getattr(fe.knob_type, m)) for m in dir(fe.knob_type) if m.isupper()} if hasattr(fe, "knob_type") else None)
    big = cp.cuda.alloc(3 << 30)
    results = {}
    for layout in ("NCHW", "NHWC"):
        for k in kernels(layout):
            if (layout, k.name) not in FOCUS:
                continue
            p, op = k.problem, k.op
            buf = Buffers(p)
            ops = buf.operands(op, 256)
            res = results.setdefault(f"{layout} {k.name}", {})
            # 2. unbounded at 256
            ms, sk = src.measure(op, p, ops, big.ptr, BenchSettings("tf32", repeat=3, max_workspace=3 << 30))
            ms.sort(key=lambda m: m.time_ms)
            ttag = (choices.get((layout, k.name)) or [(None, None)])[0][0]
            res["n256"] = [(m.algo, round(m.time_ms, 4), m.workspace_bytes >> 20) for m in ms[:8]]
            log(layout, k.name, "n=256 unbounded top:", res["n256"][:6])
            log("   torch tag", ttag, "in our list:", [(m.algo, round(m.time_ms, 4), m.workspace_bytes >> 20)
                                                    for m in ms if m.algo == ttag])
            rc = [s for s in sk if "runtime" in s.reason]
            log("   skipped:", len(sk), "runtime-compiled:", len(rc), [s.algo for s in rc][:8])
            if ttag and not any(m.algo == ttag for m in ms):
                try:
                    ident = EngineIdentity.parse_tag(ttag)
                    built = src.plan_for(op, p, ident)
                    cfg = src._config(256, ident, built.engine_bytes + scratch_bytes(op, p) + 512)
                    t = time_ms(lambda: src.run(op, p, cfg, ops, big.ptr, 3 << 30, 1.0, 0.0), repeat=5, warmup=2,
                                min_sample_ms=1.0)
                    log("   torch tag built by us:", ttag, round(t, 4), "ms ws", built.engine_bytes >> 20, "MiB")
                except Exception as e:  # noqa: BLE001
                    log("   torch tag not buildable by us:", ttag, str(e)[:200])
            # 3. within 64 MiB per size
            sizes = [16, 24, 32, 37, 43, 52, 64, 86, 128, 256]
            allm = []
            per = {}
            for mb in sizes:
                m2, _ = src.measure(op, p.with_batch(mb), ops, big.ptr, BenchSettings("tf32", repeat=2, max_workspace=LIM))
                m2 = [m for m in m2 if m.workspace_bytes <= LIM]
                allm += m2
                if m2:
                    b = min(m2, key=lambda m: m.time_ms)
                    per[mb] = (b.algo, round(b.time_ms, 4), round(b.time_ms * 256 / mb, 4), b.workspace_bytes >> 20)
            res["per_size"] = per
            for mb, v in per.items():
                log(f"   mb {mb:3d}: best {v[0]} {v[1]} ms -> x256/mb {v[2]} ms, ws {v[3]} MiB")
            for name, ss in (("pow2", [1, 2, 4, 8, 16, 32, 64, 128, 256]), ("pow2+", sizes)):
                best = wr.fastest_per_size(allm, ss, LIM)
                sol = wr.solve(256, best)
                if sol:
                    log(f"   WR {name}: {sum(m.time_ms for m in sol):.4f} ms", [(m.micro_batch, m.algo) for m in sol][:3])
            # 4. knobs of the top engines at the size the 64 MiB plan uses and at 256
            top_engines = []
            for m in sorted(allm, key=lambda m: m.time_ms * 256 / m.micro_batch)[:40]:
                e = EngineIdentity.parse_tag(m.algo).engine_id
                if e not in top_engines:
                    top_engines.append(e)
            for m in ms[:6]:
                e = EngineIdentity.parse_tag(m.algo).engine_id
                if e not in top_engines:
                    top_engines.append(e)
            bestmb = min(per, key=lambda s: per[s][2]) if per else 256
            mbs = sorted({bestmb} | ({256} if op == "backward_filter" else set()))
            knob_rows = []
            for mb in mbs:
                q = p.with_batch(mb)
                for e in top_engines[:3]:
                    try:
                        g = src.graph(op, q)
                        knobs = g.get_knobs_for_engine(e)
                    except Exception as ex:  # noqa: BLE001
                        log("   knobs of", e, "failed:", str(ex)[:160])
                        continue
                    if not knob_rows:
                        log("   knob object dir:", [a for a in dir(knobs[0]) if not a.startswith("_")] if knobs else None)
                    spec = []
                    for kb in knobs:
                        ty = getattr(kb, "type", None) or getattr(kb, "knob_type", None)
                        lo = getattr(kb, "minValue", getattr(kb, "min_value", None))
                        hi = getattr(kb, "maxValue", getattr(kb, "max_value", None))
                        st = getattr(kb, "stride", 1) or 1
                        spec.append((ty, list(range(lo, hi + 1, st))))
                    combos = list(itertools.product(*[v for _, v in spec]))
                    random.Random(0).shuffle(combos)
                    combos = combos[:80]
                    n_ok = 0
                    best = None
                    t1 = time.perf_counter()
                    for c in combos:
                        d = {ty: v for (ty, _), v in zip(spec, c)}
                        try:
                            g.create_execution_plan(e, d)
                            i = g.get_execution_plan_count() - 1
                            g.build_plan_at_index(i)
                            wsb = int(g.get_workspace_size_plan_at_index(i))
                        except Exception:  # noqa: BLE001
                            continue
                        if wsb + scratch_bytes(op, q) > LIM:
                            continue
                        n_ok += 1
                        h = handle()
                        f = lambda: g.execute_plan_at_index({1: ops.a, 2: ops.b, 3: ops.out}, big.ptr, i, handle=h)
                        try:
                            t = time_ms(f, repeat=1, warmup=1, min_sample_ms=0.5)
                        except Exception:  # noqa: BLE001
                            continue
                        if best is None or t < best[0]:
                            best = (t, g.get_plan_name_at_index(i), wsb >> 20)
                    if best:
                        t = time_ms(lambda: None, repeat=1) if False else best[0]
                        knob_rows.append((mb, e, len(combos), n_ok, best))
                    log(f"   knobs mb={mb} eng{e}: {[(str(ty).split('.')[-1], len(v)) for ty, v in spec]} "
                        f"combos {len(combos)} built<=64MiB {n_ok} best {best} ({time.perf_counter() - t1:.1f}s)")
            res["knobs"] = knob_rows
            if time.perf_counter() - T0 > 300:
                log("time budget: stopping diagnosis loop")
                break
        if time.perf_counter() - T0 > 300:
            break
    json.dump(results, open(f"{OUT}/diag.json", "w"), indent=1, default=str)
    part5()


def part5():
    """Executor overhead vs CUDA graph replay, on small NHWC kernels."""
    import cupy as cp

    from ucudnn.binding.timing import time_ms
    from ucudnn.execute.executor import Executor
    from ucudnn.measure.benchmarking import Buffers, benchmark
    from ucudnn.planning.planner import plan
    ks = [k for k in kernels("NHWC") if k.name in ("conv5/forward", "conv5/backward_filter", "conv3/backward_data")]
    t = benchmark(ks, "powerOfTwo", "tf32", sources="legacy,graph", repeat=2)
    for lim in (64 << 20, 1 << 20):
        try:
            pl = plan(t, "wr", workspace_limit=lim)
        except Exception as e:  # noqa: BLE001
            log("plan failed", e); continue
        for kp in pl.kernels:
            buf = Buffers(kp.problem)
            a, b, out = buf.arrays(kp.op)
            ex = Executor(kp)
            ws = cp.cuda.alloc(max(ex.workspace_bytes, 1))
            direct = time_ms(lambda: ex(a, b, out, workspace=ws), repeat=7, warmup=2, min_sample_ms=1.0)
            direct20 = time_ms(lambda: ex(a, b, out, workspace=ws), repeat=7, warmup=2, min_sample_ms=20.0, max_inner=1000)
            s = cp.cuda.Stream(non_blocking=True)
            try:
                with s:
                    ex(a, b, out, workspace=ws)
                    s.synchronize()
                    s.begin_capture()
                    ex(a, b, out, workspace=ws)
                    gr = s.end_capture()
                    gr.upload()
                    graph_t = time_ms(lambda: gr.launch(), repeat=7, warmup=2, min_sample_ms=1.0)
                    ref = out.copy()
                    out.fill(0)
                    gr.launch(); s.synchronize()
                    same = bool((out == ref).all()) if kp.op != "backward_filter" else float(abs(out - ref).max())
            except Exception as e:  # noqa: BLE001
                graph_t, same = None, f"capture failed: {e}"
            th = time.perf_counter()
            for _ in range(200):
                ex(a, b, out, workspace=ws)
            host_us = (time.perf_counter() - th) / 200 * 1e6
            cp.cuda.Device().synchronize()
            log(f"exec {kp.name} lim {lim >> 20}MiB [{kp.summary()[:70]}] predicted {kp.time_ms:.4f} executor {direct:.4f} "
                f"(20ms samples {direct20:.4f}) graph {graph_t} same {same} host/call {host_us:.1f}us")


def torch_plans(text):
    """{(layout, kernel): [(tag, ms), ...] fastest first} from the child's log (PyTorch keeps the first)."""
    out, cur = {}, None
    for line in text.splitlines():
        if line.startswith("@@BEGIN"):
            cur = tuple(line.split()[1:3])
            out[cur] = []
        elif line.startswith("@@END"):
            cur = None
        elif cur is not None:
            m = TORCH_PLAN.search(line)
            if m:
                out[cur].append((m.group(1), float(m.group(2))))
    return {k: sorted(v, key=lambda t: t[1]) for k, v in out.items()}


def report(raw, out_dir):
    """Results JSON + Markdown from a run's raw outputs (diag.json, diag_log.txt, torch_fe_log.txt)."""
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _report import md_header, write

    raw = Path(raw)
    diag = json.loads((raw / "diag.json").read_text())
    logtext = (raw / "diag_log.txt").read_text()
    chosen = torch_plans((raw / "torch_fe_log.txt").read_text())
    torch_line = {}
    wr_line = {}
    cur = None
    for line in logtext.splitlines():
        m = re.search(r"@@TORCH (\S+) (\S+) median ([\d.]+) ms; kernels: (.*)", line)
        if m:
            torch_line[f"{m.group(1)} {m.group(2)}"] = (float(m.group(3)), m.group(4))
        m = re.search(r"\] (NCHW|NHWC) (\S+) n=256 unbounded", line)
        if m:
            cur = f"{m.group(1)} {m.group(2)}"
        m = re.search(r"WR (pow2\+?): ([\d.]+) ms", line)
        if m and cur:
            wr_line.setdefault(cur, {})[m.group(1)] = float(m.group(2))
    rows = []
    for key, d in diag.items():
        layout, name = key.split(" ", 1)
        plans = chosen.get((layout, name), [])
        tag = plans[0][0] if plans else None
        ours = {t: (ms, ws) for t, ms, ws in d.get("n256", [])}
        rows.append({"kernel": key, "torch_ms": torch_line.get(key, (None,))[0],
                     "torch_plan": tag, "torch_plans_timed": len(plans),
                     "torch_kernels": torch_line.get(key, (None, ""))[1],
                     "ours_at_256": {"time_ms": ours[tag][0], "workspace_mib": ours[tag][1]} if tag in ours else None,
                     "best_within_64MiB_per_size": d.get("per_size", {}),
                     "wr_64MiB_ms": wr_line.get(key, {})})
    prov = {"device": "NVIDIA H100 80GB HBM3 (nvidia-h100-x1)", "cudnn_version": 91900,
            "cudnn_frontend": "1.22.1 (ucudnn) / PyTorch's bundled frontend", "torch": "2.11.0+cu130",
            "command": "graph_wr_diagnose.py (raw outputs), then graph_wr_diagnose.py --report",
            "date": "2026-11-22"}
    md = md_header("Why WR legacy+graph at 64 MiB loses to PyTorch in TF32 (AlexNet b256): diagnosis", prov)
    md += ("\nPyTorch (cudnn.benchmark, allow_tf32) times the first 10 configurations of heuristic mode INSTANT + "
           "fallback and keeps the fastest; the frontend's log names it. Every plan PyTorch keeps is in the graph "
           "source's list and times the same at n = 256 -- but needs 151-793 MiB of workspace, growing with the "
           "batch (layout transforms, padded/folded C = 3 tensors, FFT and Winograd transforms). Within 64 MiB "
           "those engines run only on small micro-batches, where they are slower per sample.\n\n"
           "| kernel | PyTorch ms | PyTorch's plan | ours at n=256: ms / MiB | WR at 64 MiB, powers of two | "
           "WR at 64 MiB, + 24, 37, 43, 52, 86 | best per-sample size within 64 MiB, x 256/size |\n"
           "|---|---:|---|---:|---:|---:|---:|\n")
    for r in rows:
        o = r["ours_at_256"]
        w = r["wr_64MiB_ms"]
        md += (f"| {r['kernel']} | {r['torch_ms']:.3f} | {r['torch_plan']} | "
               + (f"{o['time_ms']:.3f} / {o['workspace_mib']}" if o else "-") + " | "
               + f"{w.get('pow2', float('nan')):.3f} | {w.get('pow2+', float('nan')):.3f} | "
               + (lambda b: f"{b[1][2]:.3f} ({b[0]})" if b else "-")(
                   min(r["best_within_64MiB_per_size"].items(), key=lambda kv: kv[1][2], default=None)) + " |\n")
    md += ("\nWR columns: the graph source alone, timed at those sizes in this run (the second over sizes 16-256 "
           "only, so it cannot always use the best size; backward filter includes the explicit accumulation of "
           "micro-batches after the first). Last column: the most efficient measured size as if 256 were a "
           "multiple of it, a bound on what a finer batch-size policy could reach. Knob enumeration (80 random knob combinations "
           "of each top engine through create_execution_plan) found nothing faster: the knobs of the winning "
           "engines eng34/48/50 (SPLIT_K, KBLOCK) are deprecated backend knobs the frontend cannot set (NOT_SET), "
           "and of the others' combinations at most 1 in 80 built. PyTorch's kernels (profiler) are in the JSON.\n")
    ex = [m.groups() for m in re.finditer(
        r"exec (\S+) lim (\d+)MiB \[(.*?)\] predicted ([\d.]+) executor ([\d.]+) \(20ms samples ([\d.]+)\) "
        r"graph ([\d.]+) same \S+ host/call ([\d.]+)us", logtext)]
    md += ("\nExecutor (NHWC TF32 kernels whose plan is one call, WR legacy+graph): the plan executed by "
           "ucudnn.execute.Executor with 1 ms timing samples (as graph_wr.py and PyTorch are timed), with 20 ms "
           "samples, and as a captured CUDA graph replayed; host time per Executor call.\n\n"
           "| kernel | limit MiB | plan | predicted ms | executor ms | executor, 20 ms samples | CUDA graph ms | "
           "host us/call |\n|---|---:|---|---:|---:|---:|---:|---:|\n")
    for k, lim, pl, pr, e1, e20, gr, host in ex:
        md += f"| {k} | {lim} | {pl[:60]} | {pr} | {e1} | {e20} | {float(gr):.4f} | {host} |\n"
    write(out_dir, "graph_wr_diagnosis_tf32", {"provenance": prov, "rows": rows, "executor": ex,
                                               "raw": "graph_wr_diagnosis_tf32_raw.tar.gz"}, md)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--report":
        report(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "benchmarks/results")
    else:
        main()
        log("done")
