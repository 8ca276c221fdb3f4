"""Legacy algorithms against graph-API engines made by engine id: GPU time, host time per call, workspace and
result, side by side on the same problem (issue 15's host path; diagnostic, GPU machine).

Why: ``torch_fwd_host.py`` (session 18) measured a converted Inception v3's layers: a call that runs a legacy
algorithm costs the host 50-240 us more than PyTorch's call of the same layer (FFT_TILING forward +144 us,
backward pairs up to +240), while a graph-API engine's call costs what PyTorch's does.  cuDNN 9 runs its legacy
API on the same engines as the graph API; if a legacy algorithm's kernels are reachable as a graph engine (by id,
``create_execution_plan``: the heuristics do not list every engine), ucudnn can run the legacy choices at the
graph API's host cost.  This probe says, per problem and op: each legacy algorithm's workspace, GPU ms and host
us a call; each engine id that builds, the same; and which engine matches which algorithm (workspace, GPU time
and output).

    python benchmarks/legacy_twins.py --out $OUT/twins.json
    CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG=stdout python benchmarks/legacy_twins.py --legacy-once  # the backend log
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

OPS = ("forward", "backward_data", "backward_filter")
ALGOS = {"forward": 8, "backward_data": 6, "backward_filter": 7}


def problems():
    from ucudnn.problem import ConvProblem as P

    return {
        "inception-7x1-c160": P(64, 160, 12, 12, 160, 7, 1, pad=(3, 0)),
        "inception-1x7-c192": P(64, 192, 12, 12, 192, 1, 7, pad=(0, 3)),
        "inception-3x3-5px-c448": P(64, 448, 5, 5, 384, 3, 3, pad=(1, 1)),
        "inception-5x5-35px-c48": P(64, 48, 35, 35, 64, 5, 5, pad=(2, 2)),
        "inception-1x1-c768": P(64, 768, 12, 12, 192, 1, 1),
        "alexnet-conv2-n16": P(16, 96, 27, 27, 256, 5, 5, pad=(2, 2)),
        "resnet-3x3-c256-n128-f16-nhwc": P(128, 256, 14, 14, 256, 3, 3, pad=(1, 1), dtype="float16",
                                           layout="NHWC"),
    }


def _roles(op: str) -> tuple[str, str, str]:
    return {"forward": ("x", "w", "y"), "backward_data": ("w", "y", "x"), "backward_filter": ("x", "y", "w")}[op]


def _buffers(p) -> dict:
    """Random x, w and y of ``p`` on the GPU (flat; cuDNN reads them through its descriptors), seeded."""
    import torch

    dt = {"float32": torch.float32, "float16": torch.float16}[p.dtype]
    numel = {"x": p.n * p.c * p.h * p.w, "w": p.k * (p.c // p.groups) * p.r * p.s, "y": p.n * p.k * p.p * p.q}
    torch.manual_seed(0)
    return {r: torch.randn(n, device="cuda", dtype=dt) for r, n in numel.items()}


def _timing(run, reps: int, sleep_cycles: int) -> tuple[float, float]:
    """(GPU ms a call from events over ``reps`` calls, host us a call enqueued behind a GPU sleep), best of 3."""
    import torch

    run()
    torch.cuda.synchronize()
    gpu, host = [], []
    for _ in range(3):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(reps):
            run()
        e1.record()
        torch.cuda.synchronize()
        gpu.append(e0.elapsed_time(e1) / reps)
        torch.cuda._sleep(sleep_cycles)
        t0 = time.perf_counter()
        for _ in range(reps):
            run()
        host.append((time.perf_counter() - t0) / reps * 1e6)
        torch.cuda.synchronize()
    return min(gpu), min(host)


def knob_numbers(knobs: dict) -> dict[int, int]:
    """An API log's knob choices by name (``{"TILE_SIZE": 4}``) as cudnnBackendKnobType_t numbers (``{2: 4}``), the
    numbers an engine tag carries; a name the table does not know raises ValueError."""
    from ucudnn.measure.sources.graph import BACKEND_KNOBS

    return {BACKEND_KNOBS.index(k): int(v) for k, v in knobs.items()}


def probe(name: str, p, op: str, max_engine: int, reps: int, logged: dict | None = None) -> dict:
    """Legacy algorithms and engines by id (default knobs) of one problem and op, timed; with ``logged`` (an
    ``.engines.json`` of ``--report``) also each legacy algorithm's logged engine built with the logged knobs
    (kind ``logged``: ``knobs_match`` says whether the built plan carries exactly those knobs; the frontend cannot
    set every knob, USE_TEX for one)."""
    import torch

    from ucudnn.binding import cudnn
    from ucudnn.binding.gpu import descriptors, handle
    from ucudnn.errors import CudnnError
    from ucudnn.measure.sources.graph import EngineIdentity, GraphSource
    from ucudnn.measure.sources.legacy import LegacySource
    from ucudnn.planning.table import Measurement

    bufs = _buffers(p)
    a, b, out = (bufs[r] for r in _roles(op))
    ws_cap = 1 << 30
    ws = torch.empty(ws_cap, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    sleep_cycles = int(2e9 * 0.02)
    rows: list[dict] = []
    ref = None

    def run_of(direct, need):
        return lambda: direct(a.data_ptr(), b.data_ptr(), out.data_ptr(), ws.data_ptr(), max(need, 1), stream)

    def record(kind, ident, need, direct):
        nonlocal ref
        fn = run_of(direct, need)
        try:
            out.zero_()
            fn()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            rows.append({"kind": kind, "id": ident, "error": str(e)[:200]})
            return
        res = out.detach().float().clone()
        if ref is None:
            ref = res
        err = float(((res - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item())
        gpu_ms, host_us = _timing(fn, reps, sleep_cycles)
        rows.append({"kind": kind, "id": ident, "ws": need, "gpu_ms": round(gpu_ms, 5), "host_us": round(host_us, 1),
                     "rel_err_vs_first": err})

    h = handle()
    d = descriptors(p, "DEFAULT")   # the math the recorded API log was taken under (--legacy-once)
    da, db, dout = d.operands(op)
    legacy = LegacySource()
    for algo in range(ALGOS[op]):
        try:
            need = cudnn.get_workspace_size(h, op, da, db, d.conv, dout, algo)
        except CudnnError as e:
            rows.append({"kind": "legacy", "id": algo, "error": e.status_name})
            continue
        if need > ws_cap:
            rows.append({"kind": "legacy", "id": algo, "error": f"ws {need}"})
            continue
        launch = legacy.prepare(op, p, Measurement(p.n, algo, "DEFAULT", 1.0, need), twin=False)
        record("legacy", algo, need, launch.direct)
    gs = GraphSource()
    fe = gs._frontend()
    for key, (eid, knobs) in sorted((logged or {}).items()):
        prob, lop, algo = key.split()
        if prob != name or lop != op:
            continue
        try:
            want = knob_numbers(knobs)
            kt = gs._knob_types()
            g = gs.graph(op, p)
            g.create_execution_plan(int(eid), {kt[k]: v for k, v in want.items() if k in kt})
            tag = g.get_plan_name_at_index(0)
            g.build_plan_at_index(0)
            need = int(g.get_workspace_size_plan_at_index(0))
            ident = EngineIdentity.parse_tag(tag)
            from ucudnn.measure.sources.graph import _Built

            gs._plans[(gs._device(), op, p, ident)] = _Built(g, 0, need)
            launch = gs.prepare(op, p, Measurement(p.n, ident.tag, "", 1.0, need, "graph", ident.to_json()))
        except Exception as e:  # noqa: BLE001
            rows.append({"kind": "logged", "id": f"eng{eid}", "for_algo": int(algo), "error": str(e)[:200]})
            continue
        record("logged", tag, need, launch.direct)
        rows[-1].update(for_algo=int(algo), knobs_match=dict(ident.knobs) == want)
    listed = {}
    for mode in ("A", "B", "FALLBACK"):
        try:
            g = gs.graph(op, p)
            g.create_execution_plans([getattr(fe.heur_mode, mode)])
            listed[mode] = [g.get_plan_name_at_index(i) for i in range(g.get_execution_plan_count())]
        except Exception as e:  # noqa: BLE001
            listed[mode] = f"error: {str(e)[:120]}"
    for eid in range(max_engine):
        try:
            g = gs.graph(op, p)
            g.create_execution_plan(eid, {})
            tag = g.get_plan_name_at_index(0)
            g.build_plan_at_index(0)
            need = int(g.get_workspace_size_plan_at_index(0))
        except Exception:  # noqa: BLE001 - not an engine of this problem
            continue
        if need > ws_cap:
            rows.append({"kind": "engine", "id": tag, "error": f"ws {need}"})
            continue
        ident = EngineIdentity.parse_tag(tag)
        try:
            launch = gs.prepare(op, p, Measurement(p.n, ident.tag, "", 1.0, need, "graph", ident.to_json()))
        except Exception as e:  # noqa: BLE001
            rows.append({"kind": "engine", "id": tag, "error": str(e)[:200]})
            continue
        if getattr(launch, "direct", None) is None:
            rows.append({"kind": "engine", "id": tag, "error": "no direct launch"})
            continue
        record("engine", tag, need, launch.direct)
    return {"problem": name, "op": op, "dims": [p.n, p.c, p.h, p.w, p.k, p.r, p.s], "dtype": p.dtype,
            "layout": p.layout, "listed": listed, "rows": rows}


def legacy_once() -> None:
    """Each supported legacy algorithm once per problem and op, with a marker line before it (for the backend log)."""
    import torch

    from ucudnn.binding import cudnn
    from ucudnn.binding.gpu import descriptors, handle
    from ucudnn.errors import CudnnError

    h = handle()
    for name, p in problems().items():
        bufs = _buffers(p)
        ws = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
        d = descriptors(p, "DEFAULT")
        for op in OPS:
            da, db, dout = d.operands(op)
            a, b, out = (bufs[r] for r in _roles(op))
            for algo in range(ALGOS[op]):
                try:
                    need = cudnn.get_workspace_size(h, op, da, db, d.conv, dout, algo)
                except CudnnError:
                    continue
                if need > 1 << 30:
                    continue
                for i in range(2):
                    print(f"@@@ MARK {name} {op} algo {algo} call {i}", flush=True)
                    try:
                        cudnn.convolution(h, op, 1.0, da, a.data_ptr(), db, b.data_ptr(), d.conv, algo,
                                          ws.data_ptr(), max(need, 1), 0.0, dout, out.data_ptr())
                    except CudnnError as e:
                        print(f"@@@ FAIL {e.status_name}", flush=True)
                    torch.cuda.synchronize()


def parse_log(lines) -> dict:
    """The engine (id and knob choices) each legacy call of ``--legacy-once`` ran as, from cuDNN's API log on its
    stdout (``CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG=stdout``): {"problem op algo": [engine id, {knob: choice}]},
    the first engine configuration the log finalizes after each call's marker line."""
    import re

    out: dict = {}
    cur, first = None, False
    for line in lines:
        m = re.match(r"@@@ MARK (\S+) (\S+) algo (\d+) call \d+", line)
        if m:
            cur, first = " ".join(m.groups()), True
            continue
        if cur and first and "engineId" in line:
            doc = json.loads(line.split("val=", 1)[1].strip().rstrip(";"))
            eng = doc["engine"]
            knobs = {k.replace("CUDNN_KNOB_TYPE_", ""): v for k, v in eng.get("knobChoices", {}).items()}
            out.setdefault(cur, [eng["engineId"], knobs])
            first = False
    return out


def report(records: list[dict], mapping: dict, meta: dict) -> str:
    """Markdown: per problem and op, each legacy algorithm beside the engine its log names (and, where that engine
    built here by id with its default knobs, its workspace, GPU ms and host us a call), strict-FP32 rows only for
    float32 data (results within 2e-5 of the first row: Find's DEFAULT math lets some legacy GEMMs use TF32)."""
    lines = [f"# Legacy algorithms and their graph-API engines ({meta.get('device', '?')})", ""]
    lines += [f"- {k}: `{v}`" for k, v in meta.items()] + [""]
    lines += ["| problem | op | legacy algo | ws MiB | GPU ms | host us | engine (log) | engine ws MiB "
              "| engine GPU ms | engine host us |", "|---|---|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in records:
        rows = [x for x in r["rows"] if "gpu_ms" in x]
        engines = {str(x["id"]): x for x in rows if x["kind"] == "engine"}
        for x in rows:
            if x["kind"] != "legacy":
                continue
            eid, knobs = mapping.get(f"{r['problem']} {r['op']} {x['id']}", [None, {}])
            e = engines.get(f"eng{eid}") if eid is not None else None
            same = e is not None and e["ws"] == x["ws"]
            lines.append(f"| {r['problem']} | {r['op']} | {x['id']} | {x['ws'] / 2**20:.2f} | {x['gpu_ms']:.4f} | "
                         f"{x['host_us']:.1f} | {'eng%s' % eid if eid is not None else '?'}"
                         f"{' ' + json.dumps(knobs) if knobs else ''} | "
                         + (f"{e['ws'] / 2**20:.2f} | {e['gpu_ms']:.4f} | {e['host_us']:.1f} |" if same
                            else "- | - | - |"))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--max-engine", type=int, default=80)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--only", default="", help="comma-separated problem names")
    ap.add_argument("--legacy-once", action="store_true")
    ap.add_argument("--report", nargs=3, metavar=("TWINS_JSON", "LOG", "MD"),
                    help="write the Markdown report from a run's JSON and its --legacy-once log (plain or .gz)")
    ap.add_argument("--meta", default="{}", help="JSON of the run's device / versions / date for the report")
    ap.add_argument("--logged", type=Path, default=None, metavar="ENGINES_JSON",
                    help="also build each legacy algorithm's logged engine with its logged knobs; --max-engine 0 "
                         "skips the scan of engine ids by default knobs")
    args = ap.parse_args(argv)
    if args.legacy_once:
        legacy_once()
        return 0
    if args.report:
        import gzip

        twins, log, md = args.report
        opener = gzip.open if log.endswith(".gz") else open
        with opener(log, "rt") as f:
            mapping = parse_log(f)
        records = json.loads(Path(twins).read_text())
        Path(md).write_text(report(records, mapping, json.loads(args.meta)))
        Path(md).with_suffix(".engines.json").write_text(json.dumps(mapping, indent=1, sort_keys=True))
        return 0
    only = [s for s in args.only.split(",") if s]
    out = []
    for name, p in problems().items():
        if only and name not in only:
            continue
        for op in OPS:
            t0 = time.perf_counter()
            logged = json.loads(args.logged.read_text()) if args.logged else None
            r = probe(name, p, op, args.max_engine, args.reps, logged)
            r["probe_s"] = round(time.perf_counter() - t0, 2)
            out.append(r)
            best = sorted((x for x in r["rows"] if "gpu_ms" in x), key=lambda x: x["gpu_ms"])[:4]
            print(name, op, [(x["kind"], x["id"], x["gpu_ms"], x["host_us"]) for x in best], flush=True)
    if args.out:
        import torch

        from ucudnn.binding import cudnn

        meta = {"device": torch.cuda.get_device_name(), "cudnn": cudnn.get_version(), "torch": torch.__version__,
                "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": " ".join(sys.argv)}
        args.out.write_text(json.dumps(out, indent=1))
        args.out.with_suffix(".meta.json").write_text(json.dumps(meta, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
