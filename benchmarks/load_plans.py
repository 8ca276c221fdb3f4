"""Load test of the plan service: cached-plan throughput and latency, and cold plan latency (WR, WD).

    python benchmarks/load_plans.py                       # ResNet-50 H100 table, 50 clients, 10 s per scenario
    python benchmarks/load_plans.py --clients 50 --seconds 10 --table builtin:resnet50-b128-float32-NCHW-h100

Runs ``ucudnn serve`` (the real CLI: uvicorn, SQLite store in a temporary
directory) as one process and the load generator as another: ``hey`` (Go,
Debian package) when installed, else a small asyncio/httpx client started as
a separate Python process (``--worker``).  Each scenario is closed-loop: N
clients each send their next request as soon as the previous one is answered,
for a fixed time; latency percentiles come from every request's own timing.

Bar (issue 5): 50 concurrent clients asking for a cached plan get >= 500
requests/s with p99 < 50 ms on the 2-core development machine.  The machine is
shared: the load average before each scenario is recorded with its numbers.

Writes benchmarks/results/load_plans.json and .md.
"""
from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _report  # noqa: E402

BAR_RPS, BAR_P99_MS = 500.0, 50.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(store: str, port: int) -> subprocess.Popen:
    import httpx

    env = {k: v for k, v in os.environ.items() if k != "UCUDNN_API_TOKEN"}
    proc = subprocess.Popen([sys.executable, "-m", "ucudnn", "serve", "--host", "127.0.0.1", "--port", str(port),
                             "--store", store, "--log-level", "warning"], env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"ucudnn serve exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("ucudnn serve did not come up in 60 s")


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def summarize(latencies_s: list[float], statuses: list[int], wall_s: float) -> dict[str, Any]:
    lat = sorted(latencies_s)
    n = len(lat)

    def pct(p: float) -> float:
        return round(1000 * lat[min(n - 1, int(p * n))], 2) if n else float("nan")

    ok = sum(1 for s in statuses if s == 200)
    return {"requests": n, "ok": ok, "errors": n - ok, "seconds": round(wall_s, 3),
            "rps": round(ok / wall_s, 1) if wall_s else 0.0,
            "p50_ms": pct(0.50), "p90_ms": pct(0.90), "p99_ms": pct(0.99), "max_ms": round(1000 * lat[-1], 2) if n else None,
            "mean_ms": round(1000 * sum(lat) / n, 2) if n else None}


def run_hey(url: str, method: str, body: bytes | None, clients: int, seconds: float) -> dict[str, Any]:
    cmd = ["hey", "-z", f"{seconds}s", "-c", str(clients), "-o", "csv", "-m", method]
    tmp = None
    if body is not None:
        tmp = tempfile.NamedTemporaryFile(suffix=".json", delete=False)
        tmp.write(body)
        tmp.close()
        cmd += ["-T", "application/json", "-D", tmp.name]
    out = subprocess.run(cmd + [url], check=True, capture_output=True, text=True, timeout=seconds + 120).stdout
    if tmp:
        os.unlink(tmp.name)
    rows = list(csv.DictReader(io.StringIO(out)))
    lat = [float(r["response-time"]) for r in rows]
    offsets = [float(r["offset"]) for r in rows]
    wall = max(o + l for o, l in zip(offsets, lat)) - min(offsets) if rows else 0.0
    return summarize(lat, [int(r["status-code"]) for r in rows], wall)


def run_python_worker(url: str, method: str, body: bytes | None, clients: int, seconds: float) -> dict[str, Any]:
    """The fallback load generator, in its own process (never in the server's)."""
    payload = json.dumps({"url": url, "method": method, "body": body.decode() if body else None,
                          "clients": clients, "seconds": seconds})
    out = subprocess.run([sys.executable, __file__, "--worker", payload], check=True, capture_output=True, text=True,
                         timeout=seconds + 120).stdout
    d = json.loads(out)
    return summarize(d["latencies"], d["statuses"], d["wall"])


def worker(spec: dict[str, Any]) -> None:
    import httpx

    async def main() -> None:
        lat: list[float] = []
        statuses: list[int] = []
        body = spec["body"].encode() if spec["body"] else None
        headers = {"content-type": "application/json"} if body else {}
        limits = httpx.Limits(max_connections=spec["clients"], max_keepalive_connections=spec["clients"])
        async with httpx.AsyncClient(limits=limits, timeout=30) as client:
            stop = time.perf_counter() + spec["seconds"]

            async def one() -> None:
                while time.perf_counter() < stop:
                    t0 = time.perf_counter()
                    r = await client.request(spec["method"], spec["url"], content=body, headers=headers)
                    lat.append(time.perf_counter() - t0)
                    statuses.append(r.status_code)

            t0 = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(spec["clients"])))
            wall = time.perf_counter() - t0
        print(json.dumps({"latencies": lat, "statuses": statuses, "wall": wall}))

    asyncio.run(main())


def timed_post(url: str, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    import httpx

    t0 = time.perf_counter()
    r = httpx.post(url, json=body, timeout=600)
    ms = 1000 * (time.perf_counter() - t0)
    r.raise_for_status()
    return ms, r.json()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", default="builtin:resnet50-b128-float32-NCHW-h100")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--workspace-limit", default="64MiB")
    ap.add_argument("--wd-budgets", default="256MiB,1GiB,4GiB", help="cold WD plans, one solve each")
    ap.add_argument("--tool", choices=("auto", "hey", "python"), default="auto")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return

    import httpx

    from ucudnn.planning.table import BenchmarkTable

    tool = args.tool if args.tool != "auto" else ("hey" if shutil.which("hey") else "python")
    load = run_hey if tool == "hey" else run_python_worker
    prov = _report.provenance()
    prov["cpus"] = os.cpu_count()
    prov["load_tool"] = tool
    if tool == "hey":
        v = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "hey"], capture_output=True, text=True).stdout
        prov["load_tool"] = f"hey {v}".strip()
    for pkg in ("fastapi", "uvicorn", "starlette", "pydantic", "sqlalchemy", "uvloop", "httptools"):
        try:
            from importlib.metadata import version

            prov[pkg] = version(pkg)
        except Exception:  # noqa: BLE001
            pass

    table = BenchmarkTable.load(args.table)
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        proc = start_server(f"sqlite:///{tmp}/plans.sqlite", port)
        try:
            tid = httpx.post(f"{base}/v1/tables", json=table.to_dict(), timeout=60).json()["id"]
            cold: dict[str, Any] = {}
            wr_body = {"table_id": tid, "policy": "wr", "workspace_limit": args.workspace_limit,
                       "batch_policy": "powerOfTwo"}
            cold["wr " + args.workspace_limit], wr_plan = timed_post(f"{base}/v1/plans", wr_body)
            wd_bodies = []
            for i, budget in enumerate(args.wd_budgets.split(",")):
                body = {"table_id": tid, "policy": "wd", "total_workspace": budget, "batch_policy": "powerOfTwo"}
                ms, plan = timed_post(f"{base}/v1/plans", body)
                label = f"wd {budget}" + (" (first WD request: imports the ILP stack)" if i == 0 else "")
                cold[label] = ms
                cold[label + " solver"] = plan.get("stats", {}).get("solve_seconds")
                wd_bodies.append(body)
            scenarios = [
                ("POST /v1/plans, cached WR plan (identical request)", "POST", f"{base}/v1/plans",
                 json.dumps(wr_body).encode()),
                ("GET /v1/plans/{id}, cached WR plan", "GET", f"{base}/v1/plans/{wr_plan['id']}", None),
                ("POST /v1/plans, cached WD plan (identical request)", "POST", f"{base}/v1/plans",
                 json.dumps(wd_bodies[0]).encode()),
            ]
            results = []
            for name, method, url, body in scenarios:
                load(url, method, body, args.clients, 1.0)  # warm-up: connections, caches
                loadavg = os.getloadavg()[0]
                r = load(url, method, body, args.clients, args.seconds)
                r.update(scenario=name, loadavg_before=round(loadavg, 2),
                         meets_bar=bool(r["rps"] >= BAR_RPS and r["p99_ms"] < BAR_P99_MS and r["errors"] == 0))
                results.append(r)
                print(json.dumps(r), flush=True)
            response_bytes = len(httpx.get(f"{base}/v1/plans/{wr_plan['id']}").content)
        finally:
            stop_server(proc)

    doc = {"provenance": prov, "table": args.table, "table_device": table.device, "kernels": len(table.kernels),
           "clients": args.clients, "seconds": args.seconds, "plan_response_bytes": response_bytes,
           "cold_ms": {k: (round(v, 1) if isinstance(v, float) and "solver" not in k else v) for k, v in cold.items()},
           "load": results, "bar": {"rps": BAR_RPS, "p99_ms": BAR_P99_MS}}
    md = _report.md_header("Plan service under load", prov)
    versions = ", ".join(f"{k} {prov[k]}" for k in ("python", "fastapi", "starlette", "uvicorn", "uvloop", "httptools",
                                                     "pydantic", "sqlalchemy") if k in prov)
    md += f"- versions: {versions}\n"
    md += (f"- server: `ucudnn serve` (uvicorn, SQLite store), one process; load: {prov['load_tool']}, "
           f"{args.clients} concurrent clients, closed loop, {args.seconds:g} s per scenario; {prov['cpus']} CPU cores "
           f"shared by server and load tool (and by anything else running: see load average)\n"
           f"- table: `{args.table}` ({len(table.kernels)} kernels, {table.device}); plan response {response_bytes} bytes\n\n"
           "| scenario | requests/s | p50 ms | p90 ms | p99 ms | max ms | errors | load avg before | bar (>= 500/s, p99 < 50 ms) |\n"
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n")
    for r in results:
        md += (f"| {r['scenario']} | {r['rps']:.0f} | {r['p50_ms']} | {r['p90_ms']} | {r['p99_ms']} | {r['max_ms']} | "
               f"{r['errors']} | {r['loadavg_before']} | {'met' if r['meets_bar'] else 'NOT met'} |\n")
    md += "\nCold plans (one request each, client-side wall time: HTTP + planner + store write):\n\n"
    md += "| request | ms | solver (ILP solve) s |\n| --- | ---: | ---: |\n"
    for k, v in cold.items():
        if not k.endswith(" solver"):
            s = cold.get(k + " solver")
            md += f"| {k} | {v:.1f} | {s if s is not None else ''} |\n"
    _report.write(args.out, "load_plans", doc, md)


if __name__ == "__main__":
    main()
