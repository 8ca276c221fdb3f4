"""Precompute at scale: GPU scaling of `ucudnn precompute` (1 vs 2 GPUs, local vs Ray) and planning throughput.

Issue 8's bars: two GPUs at least 1.8x faster end to end than one; Ray's overhead under 5% of GPU time;
planning 100 (table, limit) combinations in under 10 s on a 2-core machine.

    # GPU machine: AlexNet b256 + ResNet-50 b128, float32 + float16, powerOfTwo, each config in a fresh store
    python benchmarks/precompute_scaling.py gpu --configs ray:2:5,ray:1:5,local:2:5,local:1:5 --deadline-s 330
    # any machine: 100 (table, limit) plans from the shipped H100 tables, local and Ray engines
    python benchmarks/precompute_scaling.py planning --engines local,ray
    # here, once: the wheel set the GPU machine needs (Ray without its Java jars, PuLP with Linux x86-64 CBC only)
    python benchmarks/precompute_scaling.py prepare-wheels --out .whl-ray

On nvidia-h200-x2 (one `run` call, carry [".whl-ray"] made by prepare-wheels; about 6-7 minutes):

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl-ray/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit;
    python3 benchmarks/precompute_scaling.py gpu --configs ray:2:0,ray:1:0,local:2:0,local:1:0,ray:2:5 \
        --deadline-s 330 --out $OUT

(repeat 0 trusts cuDNN Find's own timing, as the issue's reference numbers did, so all four engine/GPU configs
fit one call; the last config measures the library's default repeat 5 for GPU-seconds per network.)

A config ``ENGINE:GPUS:REPEAT`` runs the whole job (worker start, every unit, tables, WR + WD plans) in a new
store and is timed end to end.  With Ray, one Ray instance serves every Ray config (as a cluster's would);
its start is reported apart.  Configs that would not finish before ``--deadline-s`` (estimated from the GPU
time already measured) are skipped and say so.  GPU-seconds are the workers' time on units (each worker
holds one GPU); "at `all`" scales each unit by |sizes(all)| / |sizes(powerOfTwo)| (Find's cost is mostly per
size), next to the recorded AlexNet `all` table's own benchmark time as a check.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import md_header, provenance, write  # noqa: E402

from ucudnn.policy import micro_batch_sizes

RESULTS = Path(__file__).resolve().parent / "results"
NETWORKS = ["alexnet@256", "resnet50@128"]
DTYPES = ["float32", "float16"]


# -- the GPU run ------------------------------------------------------------------------------------------------
def run_config(engine_name: str, gpus: int, repeat: int, args: argparse.Namespace) -> dict[str, Any]:
    from ucudnn.catalog.store import Store
    from ucudnn.cluster.engines import ReplaySource, make_engine
    from ucudnn.cluster.precompute import JobSpec, NetworkRequest, run_job

    spec = JobSpec(networks=[NetworkRequest.parse(n, "network") for n in args.networks], dtypes=args.dtypes,
                   layouts=[args.layout], batch_policy="powerOfTwo", repeat=repeat,
                   workspace_limits=[8 << 20, 64 << 20, 512 << 20], total_workspaces=[120 << 20, 960 << 20])
    spec.check()
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        engine = make_engine(engine_name, workers=gpus)
        try:
            source = (ReplaySource(args.replay.split(","), time_scale=args.replay_time_scale)
                      if args.replay else None)  # a dry run of this script on a machine with no GPU
            summary = run_job(spec, engine, Store(Path(d) / "store.sqlite"), source=source)
        finally:
            engine.close()
        wall = time.perf_counter() - t0
    per_net: dict[str, float] = {}
    for t in summary["tables"]:
        per_net[t["name"]] = t["gpu_seconds"]
    sizes_pow2 = {t["name"]: len(micro_batch_sizes("powerOfTwo", int(t["name"].split("-b")[1].split("-")[0])))
                  for t in summary["tables"]}
    at_all = {n: round(s * int(n.split("-b")[1].split("-")[0]) / sizes_pow2[n], 1) for n, s in per_net.items()}
    return {"engine": engine_name, "gpus": gpus, "repeat": repeat, "wall_seconds": round(wall, 3),
            "gpu_seconds": summary["gpu_seconds"], "seconds": summary["seconds"],
            "dispatch_overhead_seconds": summary["dispatch_overhead_seconds"], "units": summary["units"],
            "workers": summary["workers"], "targets": summary["targets"], "gpu_seconds_per_table": per_net,
            "estimated_gpu_seconds_at_all": at_all, "plans": {k: (len(v) if isinstance(v, list) else v)
                                                              for k, v in summary["plans"].items()},
            "ok": summary["ok"], "failed_units": summary["failed_units"][:5]}


def cmd_gpu(args: argparse.Namespace) -> int:
    prov = provenance()
    configs = []
    for c in args.configs.split(","):
        eng, gpus, rep = c.split(":")
        configs.append((eng, int(gpus), int(rep)))
    t_start = time.perf_counter()
    ray_init_s = None
    if any(e == "ray" for e, _, _ in configs):
        import logging

        import ray

        t0 = time.perf_counter()
        ray.init(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
        ray_init_s = round(time.perf_counter() - t0, 3)
        prov["ray"] = ray.__version__
        prov["ray_resources"] = {k: v for k, v in ray.cluster_resources().items() if not k.startswith("node:")}
    results, skipped = [], []
    gpu_s_by_repeat: dict[int, float] = {}
    for eng, gpus, rep in configs:
        elapsed = time.perf_counter() - t_start
        est = gpu_s_by_repeat.get(rep)
        if est is None and gpu_s_by_repeat:  # a new repeat count: assume each timed run costs a Find's worth
            known = min(gpu_s_by_repeat, key=lambda r: abs(r - rep))
            est = gpu_s_by_repeat[known] * (1 + rep) / (1 + known)
        if est is not None and elapsed + est / gpus * 1.15 + 15 > args.deadline_s:
            skipped.append({"config": f"{eng}:{gpus}:{rep}", "reason": f"would end after the deadline "
                            f"({elapsed:.0f} s + ~{est / gpus:.0f} s > {args.deadline_s:.0f} s)"})
            continue
        print(f"== {eng} x{gpus} repeat={rep}", file=sys.stderr, flush=True)
        r = run_config(eng, gpus, rep, args)
        gpu_s_by_repeat[rep] = r["gpu_seconds"]
        results.append(r)
        print(json.dumps({k: r[k] for k in ("engine", "gpus", "repeat", "wall_seconds", "gpu_seconds")}),
              file=sys.stderr, flush=True)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"{args.name}.partial.json").write_text(json.dumps(results, indent=1))
    doc = {"provenance": prov, "ray_init_seconds": ray_init_s, "networks": args.networks, "dtypes": args.dtypes,
           "layout": args.layout, "configs": results, "skipped": skipped, "comparisons": compare(results)}
    write(args.out, args.name, doc, markdown_gpu(doc))
    partial = Path(args.out) / f"{args.name}.partial.json"
    if partial.exists():
        partial.unlink()
    return 0


def compare(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Speed-up of 2 GPUs over 1 (same engine, repeat) and Ray's overhead over local (same GPUs, repeat)."""
    by = {(r["engine"], r["gpus"], r["repeat"]): r for r in results}
    out = []
    for (eng, g, rep), r in by.items():
        one = by.get((eng, 1, rep))
        if g == 2 and one is not None:
            out.append({"what": f"{eng} 2 GPUs vs 1, repeat {rep}", "speedup": round(one["wall_seconds"] /
                                                                                     r["wall_seconds"], 3),
                        "bar": ">= 1.8"})
        loc = by.get(("local", g, rep))
        if eng == "ray" and loc is not None:
            out.append({"what": f"ray vs local, {g} GPU(s), repeat {rep}",
                        "overhead_of_gpu_time": round((r["wall_seconds"] - loc["wall_seconds"]) / r["gpu_seconds"], 4),
                        "bar": "< 0.05"})
        if eng == "ray":
            out.append({"what": f"ray dispatch (per-unit round trip minus GPU time), {g} GPU(s), repeat {rep}",
                        "overhead_of_gpu_time": round(r["dispatch_overhead_seconds"] / r["gpu_seconds"], 4),
                        "bar": "< 0.05"})
    return out


def markdown_gpu(doc: dict[str, Any]) -> str:
    lines = [md_header("Precompute scaling: AlexNet b256 + ResNet-50 b128, "
                       f"{' + '.join(doc['dtypes'])} {doc['layout']}, powerOfTwo", doc["provenance"]), ""]
    if doc["ray_init_seconds"] is not None:
        lines.append(f"Ray {doc['provenance'].get('ray')} started once for every Ray config in "
                     f"{doc['ray_init_seconds']} s (not in the wall times below: a cluster's Ray is already up).\n")
    lines += ["Planning overlaps measuring (a table is planned once its last unit is in); *plan s* is what is left "
              "after the last unit.", "",
              "| engine | GPUs | repeat | wall s (end to end) | worker start s | measure s | plan s | tables planned "
              "while measuring | GPU-s | units measured | dispatch overhead s |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in doc["configs"]:
        s = r["seconds"]
        lines.append(f"| {r['engine']} | {r['gpus']} | {r['repeat']} | {r['wall_seconds']:.1f} | {s['startup']:.1f} | "
                     f"{s['measure']:.1f} | {s['plan']:.1f} | "
                     f"{s.get('tables_planned_while_measuring', '-')}/{len(r['gpu_seconds_per_table'])} | {r['gpu_seconds']:.1f} | {r['units']['measured']} | "
                     f"{r['dispatch_overhead_seconds']:.2f} |")
    for s in doc["skipped"]:
        lines.append(f"\nSkipped {s['config']}: {s['reason']}.")
    if doc["comparisons"]:
        lines += ["", "| comparison | value | bar |", "|---|---:|---|"]
        for c in doc["comparisons"]:
            v = c.get("speedup", c.get("overhead_of_gpu_time"))
            lines.append(f"| {c['what']} | {v} | {c['bar']} |")
    if doc["configs"]:
        lines += ["", "GPU-seconds per table (units of that table measured in the config) and the estimate at `all`:",
                  "", "| config | table | GPU-s powerOfTwo | est. GPU-s at all |", "|---|---|---:|---:|"]
        for r in doc["configs"]:
            if r["gpus"] != max(c["gpus"] for c in doc["configs"] if c["repeat"] == r["repeat"]) or r["engine"] != \
                    doc["configs"][0]["engine"]:
                continue
            for name, s in r["gpu_seconds_per_table"].items():
                lines.append(f"| {r['engine']}:{r['gpus']}:{r['repeat']} | {name} | {s:.1f} | "
                             f"{r['estimated_gpu_seconds_at_all'][name]:.0f} |")
    return "\n".join(lines)


# -- planning throughput (CPU) ------------------------------------------------------------------------------------
def cmd_planning(args: argparse.Namespace) -> int:
    from ucudnn.catalog.store import Store
    from ucudnn.cluster.engines import ReplaySource, make_engine
    from ucudnn.cluster.precompute import JobSpec, run_job
    from ucudnn.planning.network import load_network
    from ucudnn.planning.table import BenchmarkTable

    prov = provenance()
    names = ["alexnet-b256-float32-NCHW-h100", "alexnet-b256-float16-NHWC-h100", "resnet50-b128-float32-NCHW-h100"]
    limits = [s << 20 for s in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024)]
    totals = [s << 20 for s in (64, 120, 256, 480, 960, 1536, 2048, 4096, 8192, 16384)]
    rows = []
    with tempfile.TemporaryDirectory() as d:
        paths = [f"builtin:{n}" for n in names]
        full = load_network("resnet50").table_from(BenchmarkTable.load(paths[2]))  # every kernel: 159
        full.save(Path(d) / "resnet50-b128-all-kernels.json")
        paths.append(str(Path(d) / "resnet50-b128-all-kernels.json"))
        for eng in args.engines.split(","):
            for rep in range(args.repeat):
                spec = JobSpec(tables=paths, workspace_limits=limits, total_workspaces=totals)
                spec.check()
                t0 = time.perf_counter()
                engine = make_engine(eng, workers=None)
                try:
                    summary = run_job(spec, engine, Store(Path(d) / f"{eng}-{rep}.sqlite"),
                                      source=ReplaySource(paths))
                finally:
                    engine.close()
                rows.append({"engine": eng, "run": rep, "plans": summary["plans"]["stored"],
                             "infeasible": len(summary["plans"]["failed"]), "plan_seconds": summary["seconds"]["plan"],
                             "job_seconds": summary["seconds"]["total"], "wall_seconds": round(time.perf_counter() - t0, 3),
                             "startup_seconds": summary["seconds"]["startup"]})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    doc = {"provenance": prov, "cpus": os.cpu_count(), "tables": [p.removeprefix("builtin:") for p in names] +
           ["resnet50-b128 expanded to all 159 kernels"], "workspace_limits": limits, "total_workspaces": totals,
           "combinations": len(paths) * (len(limits) + len(totals)), "runs": rows}
    md = [md_header("Planning throughput: 100 (table, limit) combinations, WR + WD, into a store", prov), "",
          f"- {doc['combinations']} combinations: 4 tables (recorded H100: AlexNet fp32, AlexNet fp16 NHWC, ResNet-50 "
          f"fp32 69 unique kernels, ResNet-50 fp32 all 159 kernels) x ({len(limits)} WR limits + {len(totals)} WD "
          f"budgets); {os.cpu_count()} CPU cores", "- plan s: planning left after the last unit is measured (planner runs + store writes; planning overlaps "
          "measuring); "
          "job s: the whole precompute job from recorded tables (replay), worker start included", "",
          "| engine | plans | infeasible | plan s (median) | job s (median) | wall s incl. engine start (median) |",
          "|---|---:|---:|---:|---:|---:|"]
    for eng in args.engines.split(","):
        rs = [r for r in rows if r["engine"] == eng]
        md.append(f"| {eng} | {rs[0]['plans']} | {rs[0]['infeasible']} | "
                  f"{statistics.median(r['plan_seconds'] for r in rs):.2f} | "
                  f"{statistics.median(r['job_seconds'] for r in rs):.2f} | "
                  f"{statistics.median(r['wall_seconds'] for r in rs):.2f} |")
    md.append("\nBar (issue 8): planning 100 combinations in under 10 s on this 2-core machine.")
    write(args.out, args.name, doc, "\n".join(md))
    return 0


# -- the wheel set for the GPU machine ------------------------------------------------------------------------------
def repack(src: Path, dst_dir: Path, drop: tuple[str, ...]) -> Path:
    """Copy a wheel without the folders in ``drop``; RECORD lists exactly what is left."""
    dst = dst_dir / src.name
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        record_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        kept = [i for i in zin.infolist() if not i.filename.startswith(drop)]
        names = {i.filename for i in kept}
        for info in kept:
            if info.filename == record_name:
                lines = [ln for ln in zin.read(info).decode().splitlines() if ln.split(",")[0] in names]
                zout.writestr(info, "\n".join(lines) + "\n")
            else:
                zout.writestr(info, zin.read(info))
    return dst


PIP_PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
                "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_27_x86_64",
                "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
                "--platform", "manylinux1_x86_64"]
# not on the GPU machine (KINDS.md's package list): ucudnn's core needs beyond it, and Ray's
NEEDED = ["sqlalchemy", "alembic", "mako", "jsonschema", "jsonschema-specifications", "referencing", "rpds-py",
          "platformdirs", "pulp", "ray"]


def pinned(name: str) -> str:
    """``name==version`` as installed here (the versions the tests ran with), else the newest."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{name}=={version(name)}"
    except PackageNotFoundError:
        return name


def cmd_prepare_wheels(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *PIP_PLATFORM, "-d", d,
                        *[pinned(n) for n in NEEDED]], check=True)
        for whl in sorted(Path(d).glob("*.whl")):
            name = whl.name.lower()
            if name.startswith("ray-"):  # Java workers' jars (32 MB), the dashboard's web build, RLlib
                repack(whl, out, ("ray/jars/", "ray/dashboard/client/", "ray/rllib/"))
            elif name.startswith("pulp-"):  # CBC for Linux x86-64 only
                repack(whl, out, tuple(f"pulp/solverdir/cbc/{p}/" for p in
                                       ("linux/arm64", "linux/i32", "osx", "win")))
            else:
                shutil.copy(whl, out / whl.name)
    total = sum(p.stat().st_size for p in out.glob("*.whl"))
    for p in sorted(out.glob("*.whl")):
        print(f"{p.stat().st_size / 1e6:8.2f} MB  {p.name}")
    print(f"{total / 2**20:.1f} MiB in {out}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gpu")
    g.add_argument("--configs", default="ray:2:5,ray:1:5,local:2:5,local:1:5", help="ENGINE:GPUS:REPEAT,...")
    g.add_argument("--networks", default=",".join(NETWORKS))
    g.add_argument("--dtypes", default=",".join(DTYPES))
    g.add_argument("--layout", default="NCHW")
    g.add_argument("--deadline-s", type=float, default=1e9)
    g.add_argument("--replay", metavar="T,...", help="dry run: replay these recorded tables instead of measuring")
    g.add_argument("--replay-time-scale", type=float, default=0.0, help="dry run: sleep recorded seconds x this")
    g.add_argument("--out", default=str(RESULTS))
    g.add_argument("--name", default="precompute_scaling")
    p = sub.add_parser("planning")
    p.add_argument("--engines", default="local,ray")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--name", default="precompute_planning")
    w = sub.add_parser("prepare-wheels")
    w.add_argument("--out", default=".whl-ray")
    args = ap.parse_args()
    if args.cmd == "gpu":
        args.networks = args.networks.split(",")
        args.dtypes = args.dtypes.split(",")
        return cmd_gpu(args)
    if args.cmd == "planning":
        return cmd_planning(args)
    return cmd_prepare_wheels(args)


if __name__ == "__main__":
    sys.exit(main())
