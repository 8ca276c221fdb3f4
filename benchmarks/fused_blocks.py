"""Issue 19 (part 1): fused-block kernels (kernels/fused.py, seed 004) against cuDNN per layer and PyTorch.

For each seed block (a.1, a.2, b.1, c.1), dtype (FP32, FP16) and batch (1, 8, 64), NCHW, on one GPU:

- fused: ucudnn's fused kernel (tiling tuned through kernels/autotune.py at ``--tune-batches``, else the cost
  model's default), ``--inner`` launches captured in one CUDA graph, replayed; ms per launch;
- (a) cuDNN per layer: each layer's conv + bias (+ ReLU) -- and the block's concat (split) or add (+ ReLU, merge)
  -- timed alone, ``--inner`` back to back in one CUDA graph; per layer the faster of PyTorch's conv2d + bias +
  relu_ and cuDNN's own conv-bias-activation fusion (``torch.cudnn_convolution_relu`` /
  ``torch.cudnn_convolution_add_relu``, cudnnConvolutionBiasActivationForward) where it applies and agrees;
  ``cudnn.benchmark=True`` picks each convolution's fastest algorithm.  The sum is the bar's baseline; the same
  best kernels back to back in one graph are reported beside it;
- (b) PyTorch eager: the block as an nn.Module, one forward between two CUDA events (what an eager caller sees,
  launch gaps included);
- (c) the module captured in a CUDA graph, ``--inner`` replays back to back;
- (d) ``torch.compile(mode="max-autotune")`` of the module, per case under a time limit (``--compile-timeout``)
  and a total budget; a case that runs past either is reported as not run, with the reason.

FP32 rows are strict FP32 everywhere (TF32 off in cuDNN: the fused kernel's FMA arithmetic); ``--tf32`` adds cuDNN
per layer with TF32 as information.  Every figure is the median of ``--reps`` event-timed samples after warm-up.
Each case checks the fused output against the module's (relative 2-norm error in the row).  Activations and
weights stay resident in the 50 MB L2 at these sizes for every method alike.

    python benchmarks/fused_blocks.py --out benchmarks/results
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _capture import warm_up  # noqa: E402
from _report import md_header, provenance, write  # noqa: E402


# ---- the block as a PyTorch module --------------------------------------------------------------------------------
def make_module(block, dtype, seed: int):
    import torch
    from torch import nn

    class BlockModule(nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = nn.ModuleList(
                nn.Conv2d(cin, l.out_channels, l.kernel, l.stride, l.pad, groups=l.groups, bias=l.bias)
                for l, cin in zip(block.layers, block.layer_inputs()))
            self.relu = [l.relu for l in block.layers]

        def conv(self, i, x):
            y = self.convs[i](x)
            return torch.relu_(y) if self.relu[i] else y

        def forward(self, x, x2=None):
            if block.mode == "straight":
                return self.conv(1, self.conv(0, x))
            if block.mode == "split":
                m = self.conv(0, x)
                return torch.cat([self.conv(1, m), self.conv(2, m)], 1)
            m = self.conv(0, x) + self.conv(1, x if x2 is None else x2)
            if block.merge_relu:
                m = torch.relu_(m)
            return self.conv(2, m)

    torch.manual_seed(seed)
    mod = BlockModule()
    with torch.no_grad():
        for c in mod.convs:     # He-scaled filters, small biases: activations of order one through the block
            fan_in = c.in_channels // c.groups * c.kernel_size[0] * c.kernel_size[1]
            c.weight.normal_(0, math.sqrt(2.0 / fan_in))
            if c.bias is not None:
                c.bias.normal_(0, 0.1)
    return mod.to(device="cuda", dtype=getattr(torch, dtype)).eval()


# ---- timing ---------------------------------------------------------------------------------------------------------
def graph_ms(fn, inner: int, reps: int, warmup: int = 3) -> float:
    """Median ms per call of ``fn``: ``inner`` calls captured in one CUDA graph, replayed ``reps`` times between
    events (the kernels' own time, launch gaps removed)."""
    import torch

    warm_up(fn, warmup)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(inner):
            fn()
    for _ in range(2):
        g.replay()
    torch.cuda.synchronize()
    pairs = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        pairs.append((a, b))
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in pairs) / inner


def calls_ms(fn, reps: int, inner: int = 1, warmup: int = 5) -> float:
    """Median ms per call with ``inner`` calls between two events (inner 1: one call's latency as a caller sees it)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    pairs = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        pairs.append((a, b))
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in pairs) / inner


def rel_err(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / max(float(b.norm()), 1e-30))


# ---- cuDNN per layer -------------------------------------------------------------------------------------------------
def per_layer_pieces(block, mod, x, x2):
    """[(piece name, {variant: fn})] producing the block layer by layer; inputs of each piece precomputed."""
    import torch
    import torch.nn.functional as tF

    convs = mod.convs
    pieces = []

    def variants(i, inp, add=None):
        c, layer = convs[i], block.layers[i]
        st, pd, gr = list(c.stride), list(c.padding), c.groups

        def plain():
            y = tF.conv2d(inp, c.weight, c.bias, c.stride, c.padding, 1, gr)
            if add is not None:
                y = y.add_(add)
            return torch.relu_(y) if (layer.relu or (add is not None and block.merge_relu)) else y

        out = {"conv2d+bias+relu": plain}
        if add is None and layer.relu:
            out["cudnn_convolution_relu"] = lambda: torch.cudnn_convolution_relu(inp, c.weight, c.bias, st, pd,
                                                                                 [1, 1], gr)
        if add is not None and block.merge_relu and not layer.relu:
            out["cudnn_convolution_add_relu"] = lambda: torch.cudnn_convolution_add_relu(
                inp, c.weight, add, 1.0, c.bias, st, pd, [1, 1], gr)
        return out

    with torch.no_grad():
        if block.mode == "straight":
            m = mod.conv(0, x)
            pieces = [("L1", variants(0, x)), ("L2", variants(1, m))]
        elif block.mode == "split":
            m = mod.conv(0, x)
            e1, e3 = mod.conv(1, m), mod.conv(2, m)
            pieces = [("L1", variants(0, x)), ("L2", variants(1, m)), ("L3", variants(2, m)),
                      ("concat", {"torch.cat": lambda: torch.cat([e1, e3], 1)})]
        else:
            a = mod.conv(0, x)
            s = mod.conv(1, x if x2 is None else x2) + a
            if block.merge_relu:
                s = torch.relu_(s)
            pieces = [("L1", variants(0, x)), ("L2+add+relu", variants(1, x if x2 is None else x2, add=a)),
                      ("L3", variants(2, s))]
    return pieces


def time_per_layer(block, mod, x, x2, inner: int, reps: int) -> dict:
    import torch

    pieces = per_layer_pieces(block, mod, x, x2)
    rows, best_fns = [], []
    with torch.no_grad():
        for name, vs in pieces:
            ref = list(vs.values())[0]()
            tol = 1e-3 if ref.dtype == torch.float16 else 1e-5
            timed = {}
            for vname, fn in vs.items():
                try:
                    err = rel_err(fn(), ref)
                    if err > tol:
                        timed[vname] = {"skipped": f"disagrees with conv2d (rel err {err:.2e})"}
                        continue
                    timed[vname] = {"ms": graph_ms(fn, inner, reps)}
                except Exception as e:  # noqa: BLE001 - a variant cuDNN does not run here
                    timed[vname] = {"skipped": f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"}
            ok = {k: v["ms"] for k, v in timed.items() if "ms" in v}
            best = min(ok, key=ok.get)
            rows.append({"piece": name, "best": best, "ms": ok[best], "variants": timed})
            best_fns.append(vs[best])

        def seq():
            for fn in best_fns:
                fn()

        seq_ms = graph_ms(seq, inner, reps)
    return {"sum_ms": sum(r["ms"] for r in rows), "seq_ms": seq_ms, "pieces": rows}


# ---- the fused kernel ------------------------------------------------------------------------------------------------
def fused_case(block, mod, x, x2, dtype: str, tune: bool, inner: int, reps: int) -> dict:
    import cupy as cp
    import torch

    from ucudnn.kernels import fused as F

    cpa = lambda t: None if t is None else cp.from_dlpack(t.detach())  # noqa: E731
    xc, x2c = cpa(x), cpa(x2)
    ws = [cpa(c.weight.contiguous()) for c in mod.convs]
    bs = [cpa(c.bias) for c in mod.convs]
    out_t = torch.empty(block.y_shape(x.shape[0], x.shape[2], x.shape[3]), device="cuda", dtype=x.dtype)
    out = cpa(out_t)

    def on_torch_stream(fn):
        def run():
            with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
                fn()
        return run

    def timer(fn):
        return graph_ms(on_torch_stream(fn), inner, max(5, reps // 4), warmup=2)

    t0 = time.perf_counter()
    tiling, how = F.tuned_tiling(block, dtype, "NCHW", tuple(x.shape), (xc, ws, bs, out, x2c) if tune else None,
                                 tune=tune, timer=timer)
    tune_s = time.perf_counter() - t0
    run = F.launcher(block, tiling, dtype, "NCHW", tuple(x.shape))
    fn = on_torch_stream(lambda: run(xc, ws, bs, out, x2c))
    ms = graph_ms(fn, inner, reps)
    out_t.fill_(float("nan"))
    fn()
    torch.cuda.synchronize()
    with torch.no_grad():
        ref = mod(x, x2)
    geo = F.plan(block, tiling, dtype, "NCHW", x.shape[0], x.shape[2], x.shape[3])
    res = {"ms": ms, "tiling": tiling.as_list(), "how": how, "tune_s": round(tune_s, 2),
           "err_vs_module": rel_err(out_t, ref), "nan": bool(torch.isnan(out_t).any()), "grid": list(geo.grid),
           "smem_bytes": geo.smem_bytes, "kernel": "fma"}
    # in FP16 a chain of 1x1 convolutions (kernels/pointwise.cu) and a 1x1 followed by spatial convolutions
    # (kernels/spatial.cu) also have tensor-core kernels (kernels/blocks.py): the fastest kernel is the fused time,
    # the others kept beside it
    from ucudnn.kernels import blocks as K

    for name in K.candidates(block, dtype)[1:]:
        tiling = K.tuned(name, block, dtype, "NCHW", tuple(x.shape), (xc, ws, bs, out, x2c), True, timer)
        tc_run = K.launcher(name, block, tiling, dtype, "NCHW", tuple(x.shape))
        tc_fn = on_torch_stream(lambda: tc_run(xc, ws, bs, out, x2c))
        tc_ms = graph_ms(tc_fn, inner, reps)
        out_t.fill_(float("nan"))
        tc_fn()
        torch.cuda.synchronize()
        tc = {"kernel": name, "ms": tc_ms, "tiling": list(tiling), "err_vs_module": rel_err(out_t, ref),
              "nan": bool(torch.isnan(out_t).any())}
        res.setdefault("tensor_core", {})[name] = tc
        if tc_ms < res["ms"] and not tc["nan"]:
            res.update(ms=tc_ms, tiling=f"tc {name} {list(tiling)}", how="tensor cores", kernel=f"tensor_core_{name}",
                       err_vs_module=tc["err_vs_module"], fma_ms=ms, nan=False)
    return res


# ---- torch.compile ---------------------------------------------------------------------------------------------------
class _Timeout(Exception):
    pass


def compile_case(mod, x, x2, mode: str, timeout: float, reps: int, inner: int) -> dict:
    import torch

    torch._dynamo.reset()

    def alarm(signum, frame):
        raise _Timeout()

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(max(1, int(timeout)))
    t0 = time.perf_counter()
    try:
        compiled = torch.compile(mod, mode=mode, dynamic=False)
        with torch.no_grad():
            compiled(x, x2)
            torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
    except _Timeout:
        return {"mode": mode, "not_run": f"did not compile within {timeout:.0f} s"}
    except Exception as e:  # noqa: BLE001
        return {"mode": mode, "not_run": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    with torch.no_grad():
        ref = mod(x, x2)
        err = rel_err(compiled(x, x2), ref)
        ms = calls_ms(lambda: compiled(x, x2), reps, inner=inner)
    return {"mode": mode, "ms": ms, "compile_s": round(compile_s, 1), "err_vs_module": err}


# ---- report ----------------------------------------------------------------------------------------------------------
def _f(v, digits=4):
    return "-" if v is None else f"{v:.{digits}f}"


def _x(base, fused):
    return "-" if base is None or fused is None else f"{base / fused:.2f}x"


def markdown(doc: dict) -> str:
    out = [md_header("Fused blocks (issue 19, seed 004) vs cuDNN per layer and PyTorch", doc["provenance"])]
    out.append(f"\nSettings: {doc['settings']}\n")
    out.append("Times in ms per block forward (median of event-timed samples). `cuDNN/layer` = sum of each layer's "
               "best cuDNN kernels (conv+bias+ReLU, concat/add included), each timed alone back to back in a CUDA "
               "graph; `layers seq` = those kernels back to back in one graph; `eager` = the nn.Module, one call "
               "between events; `graph` = the module replayed in a CUDA graph; `compile` = torch.compile "
               f"({doc['settings']['compile_mode']}). Speed-ups are baseline / fused. FP32 rows: strict FP32 "
               "(TF32 off).\n")
    out.append("| block | dtype | N | fused | tiling [th,tw,ks,nt] (how) | cuDNN/layer | x | layers seq | x | eager "
               "| x | graph | x | compile | x | err vs module |")
    out.append("|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in doc["rows"]:
        fz = r["fused"]["ms"]
        if fz is None:
            out.append(f"| {r['block']} | {r['dtype']} | {r['batch']} | failed: {r['fused'].get('error')} |")
            continue
        comp = r.get("compile") or {}
        cms = comp.get("ms")
        ctext = _f(cms) if cms is not None else ("not run" if comp else "-")
        out.append(f"| {r['block']} | {r['dtype']} | {r['batch']} | {_f(fz)} | {r['fused']['tiling']} "
                   f"({r['fused']['how']}) | {_f(r['per_layer']['sum_ms'])} | {_x(r['per_layer']['sum_ms'], fz)} | "
                   f"{_f(r['per_layer']['seq_ms'])} | {_x(r['per_layer']['seq_ms'], fz)} | {_f(r['eager_ms'])} | "
                   f"{_x(r['eager_ms'], fz)} | {_f(r['graph_ms'])} | {_x(r['graph_ms'], fz)} | {ctext} | "
                   f"{_x(cms, fz)} | {r['fused']['err_vs_module']:.1e} |")
    out.append("\n## Bar (issue 19): every seed block faster than cuDNN per layer at batch 1\n")
    for r in doc["rows"]:
        if r["batch"] == 1:
            ok = r["fused"]["ms"] is not None and r["fused"]["ms"] < r["per_layer"]["sum_ms"]
            out.append(f"- {r['block']} {r['dtype']}: fused {_f(r['fused']['ms'])} vs {_f(r['per_layer']['sum_ms'])} "
                       f"ms -> {'met' if ok else '**MISSED**'} ({_x(r['per_layer']['sum_ms'], r['fused']['ms'])})")
    out.append("\n## Where fusion stops paying\n")
    out.append("Against the faster of cuDNN per layer (sum) and the module in a CUDA graph:\n")
    for key, rows in _by_case(doc["rows"]).items():
        loses = [r["batch"] for r in rows if r["fused"]["ms"] is None
                 or r["fused"]["ms"] >= min(r["per_layer"]["sum_ms"], r["graph_ms"] or math.inf)]
        wins = [r["batch"] for r in rows if r["batch"] not in loses]
        out.append(f"- {key}: fused faster at batch {wins or 'none'}; slower at {loses or 'none'}")
    if any("tf32_sum_ms" in r["per_layer"] for r in doc["rows"]):
        out.append("\n## FP32 rows: cuDNN per layer with TF32 (information; the fused kernel is strict FP32)\n")
        for r in doc["rows"]:
            if "tf32_sum_ms" in r["per_layer"]:
                out.append(f"- {r['block']} N={r['batch']}: cuDNN/layer TF32 {_f(r['per_layer']['tf32_sum_ms'])} ms "
                           f"(fused FP32 {_x(r['per_layer']['tf32_sum_ms'], r['fused']['ms'])})")
    out.append("\n## Per-layer pieces (best variant, ms)\n")
    for r in doc["rows"]:
        parts = ", ".join(f"{p['piece']} {p['ms']:.4f} ({p['best']})" for p in r["per_layer"]["pieces"])
        out.append(f"- {r['block']} {r['dtype']} N={r['batch']}: {parts}")
    skipped = [(r, p, v, d["skipped"]) for r in doc["rows"] for p in r["per_layer"]["pieces"]
               for v, d in p["variants"].items() if "skipped" in d]
    if skipped:
        out.append("\nVariants not used: " + "; ".join(
            f"{r['block']} {r['dtype']} N={r['batch']} {p['piece']} {v}: {why}" for r, p, v, why in skipped[:12])
            + (" ..." if len(skipped) > 12 else ""))
    notrun = [(r, r["compile"]) for r in doc["rows"] if r.get("compile") and "ms" not in r["compile"]]
    if notrun:
        out.append("\n## torch.compile not run\n")
        for r, c in notrun:
            out.append(f"- {r['block']} {r['dtype']} N={r['batch']} ({c.get('mode')}): {c['not_run']}")
    ran = [(r, r["compile"]) for r in doc["rows"] if r.get("compile") and "ms" in r["compile"]]
    if ran:
        out.append("\ntorch.compile times: " + ", ".join(
            f"{r['block']} {r['dtype']} N={r['batch']} {c['compile_s']} s" for r, c in ran))
    return "\n".join(out)


def _finite(v):
    """The document with non-finite floats as None (the JSON is written with allow_nan=False)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def _by_case(rows):
    out: dict[str, list] = {}
    for r in rows:
        out.setdefault(f"{r['block']} {r['dtype']}", []).append(r)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", default="a.1,a.2,b.1,c.1")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--dtypes", default="float32,float16")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--inner", type=int, default=20, help="calls per captured graph")
    ap.add_argument("--tune-batches", default="1", help="batches whose fused tiling is tuned (others: the model's)")
    ap.add_argument("--tuning-cache", default=None, help="kernel_tuning.json to start from (a previous run's)")
    ap.add_argument("--tf32", action="store_true", help="FP32 rows: also cuDNN per layer with TF32")
    ap.add_argument("--compile-mode", default="max-autotune", help="'none' to skip torch.compile")
    ap.add_argument("--compile-timeout", type=float, default=90.0)
    ap.add_argument("--compile-budget", type=float, default=240.0, help="seconds for all torch.compile cases")
    ap.add_argument("--compile-batches", default="1,8,64")
    ap.add_argument("--compile-only", default="", help="BLOCK/DTYPE/BATCH,... : only these cases (default: all)")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--name", default="fused_blocks")
    args = ap.parse_args()

    import tempfile

    db = Path(tempfile.mkdtemp()) / "cache.sqlite"
    os.environ.setdefault("UCUDNN_DATABASE", str(db))
    if args.tuning_cache and Path(args.tuning_cache).exists():
        from ucudnn.kernels import autotune

        cached = json.loads(Path(args.tuning_cache).read_text())
        cached = cached.get("kernel_tuning", cached)      # a previous fused_blocks.json carries its tuning
        autotune.cache_path().parent.mkdir(parents=True, exist_ok=True)
        autotune.cache_path().write_text(json.dumps(cached))

    import torch

    from ucudnn.kernels import fused as F

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    prov = provenance()
    prov["argv"] = sys.argv
    blocks = [F.SEED_BLOCKS[b] for b in args.blocks.split(",")]
    batches = [int(v) for v in args.batches.split(",")]
    dtypes = args.dtypes.split(",")
    tune_batches = {int(v) for v in args.tune_batches.split(",") if v.strip()}
    rows = []
    cases = {}
    for dtype in dtypes:
        for block in blocks:
            mod = make_module(block, dtype, seed=19)
            for n in batches:
                t0 = time.perf_counter()
                g = torch.Generator(device="cuda").manual_seed(n)
                x = torch.randn(block.x_shape(n, *block.hw), device="cuda", generator=g).to(getattr(torch, dtype))
                x2 = None
                row = {"block": block.name, "dtype": dtype, "batch": n, "mode": block.mode}
                try:
                    row["fused"] = fused_case(block, mod, x, x2, dtype, n in tune_batches, args.inner, args.reps)
                except Exception as e:  # noqa: BLE001 - reported in the row, the run goes on
                    row["fused"] = {"ms": None, "tiling": None, "how": "failed", "err_vs_module": None,
                                    "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
                row["per_layer"] = time_per_layer(block, mod, x, x2, args.inner, args.reps)
                if args.tf32 and dtype == "float32":
                    torch.backends.cudnn.allow_tf32 = True
                    row["per_layer"]["tf32_sum_ms"] = time_per_layer(block, mod, x, x2, args.inner,
                                                                     args.reps)["sum_ms"]
                    torch.backends.cudnn.allow_tf32 = False
                with torch.no_grad():
                    row["eager_ms"] = calls_ms(lambda: mod(x, x2), args.reps)
                    row["graph_ms"] = graph_ms(lambda: mod(x, x2), args.inner, args.reps)
                row["case_s"] = round(time.perf_counter() - t0, 1)
                rows.append(row)
                cases[(block.name, dtype, n)] = (mod, x, x2)
                checkpoint(args, prov, tune_batches, rows)
                print(json.dumps({k: row[k] for k in ("block", "dtype", "batch")} |
                                 {"fused": row["fused"]["ms"], "tiling": row["fused"]["tiling"],
                                  "how": row["fused"]["how"],
                                  "per_layer": row["per_layer"]["sum_ms"], "eager": row["eager_ms"],
                                  "graph": row["graph_ms"], "err": row["fused"]["err_vs_module"],
                                  "s": row["case_s"]}), flush=True)
    # torch.compile last, batch 1 first, within the budget
    if args.compile_mode != "none":
        start = time.perf_counter()
        order = sorted(rows, key=lambda r: (int(r["batch"]) not in {int(v) for v in args.compile_batches.split(",")},
                                            r["batch"], r["dtype"], r["block"]))
        for r in order:
            if r["batch"] not in {int(v) for v in args.compile_batches.split(",")}:
                continue
            if args.compile_only and f"{r['block']}/{r['dtype']}/{r['batch']}" not in args.compile_only.split(","):
                continue
            left = args.compile_budget - (time.perf_counter() - start)
            if left < 15:
                r["compile"] = {"mode": args.compile_mode,
                                "not_run": f"this run's torch.compile budget ({args.compile_budget:.0f} s) was spent"}
                continue
            mod, x, x2 = cases[(r["block"], r["dtype"], r["batch"])]
            r["compile"] = compile_case(mod, x, x2, args.compile_mode, min(args.compile_timeout, left), args.reps,
                                        args.inner)
            print(json.dumps({k: r[k] for k in ("block", "dtype", "batch")} | r["compile"]), flush=True)
            checkpoint(args, prov, tune_batches, rows)
    checkpoint(args, prov, tune_batches, rows, final=True)


def checkpoint(args, prov, tune_batches, rows, final: bool = False) -> None:
    """Write the JSON and Markdown of the rows so far (after every case: a run cut short keeps what it measured)."""
    from ucudnn.kernels import autotune

    settings = {"reps": args.reps, "inner": args.inner, "tune_batches": sorted(tune_batches),
                "compile_mode": args.compile_mode, "compile_timeout_s": args.compile_timeout,
                "compile_budget_s": args.compile_budget, "layout": "NCHW",
                "cudnn_benchmark": True, "tf32": False, "complete": final}
    tuning = json.loads(autotune.cache_path().read_text()) if autotune.cache_path().exists() else None
    doc = _finite({"provenance": prov, "settings": settings, "rows": rows, "kernel_tuning": tuning})
    if final:
        write(args.out, args.name, doc, markdown(doc))
    else:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{args.name}.json").write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")


if __name__ == "__main__":
    main()
