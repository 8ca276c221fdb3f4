"""ucudnn precompute on Ray: a local Ray instance with two logical GPUs of model H100 and the replay source.

One Ray instance for the module (starting one costs seconds).  The sources
below are pickled by value into the actors, so workers need nothing from
this test directory.  Skipped where Ray (the ``cluster`` extra) is missing.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from ucudnn.catalog.store import Store
from ucudnn.cli import main
from ucudnn.cluster.engines import ReplaySource, UnitError
from ucudnn.cluster.engines.ray_engine import RayEngine, gpus_by_type
from ucudnn.cluster.precompute import JobSpec, NetworkRequest, run_job
from ucudnn.errors import GpuUnavailable

ALEXNET = "builtin:alexnet-b256-float32-NCHW-h100"
RESNET = "builtin:resnet50-b128-float32-NCHW-h100"


@pytest.fixture(autouse=True)
def _legacy_sources(monkeypatch):
    """The recorded tables these jobs replay were measured with the legacy source alone."""
    monkeypatch.setenv("UCUDNN_SOURCES", "legacy")



@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    """Two logical GPUs on a node Ray labels H100 (as it labels a real H100 node)."""
    ray.init(num_cpus=2, num_gpus=2, resources={"accelerator_type:H100": 1}, include_dashboard=False,
             log_to_driver=False, logging_level=logging.WARNING)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    ray.shutdown()


class GpuReplay(ReplaySource):
    """Replay that claims a GPU per worker like the real source, logging which GPU ran each unit and when."""

    def __init__(self, tables, log_dir: Path, time_scale: float = 0.0, fail: dict | None = None):
        super().__init__(tables, time_scale=time_scale, needs_gpu=True)
        self.log_dir = str(log_dir)
        self.fail = fail or {}  # op -> ("raise" | "exit", attempts that fail)

    def measure(self, unit):
        kind, n = self.fail.get(unit.op, (None, 0))
        counter = Path(self.log_dir) / f"attempts-{unit.id}"
        done = int(counter.read_text()) if counter.exists() else 0
        counter.write_text(str(done + 1))
        t0 = time.time()
        if done < n and kind == "raise":
            raise UnitError(f"CUDA error: out of memory (injected, attempt {done + 1})")
        if done < n and kind == "exit":
            os._exit(1)  # the worker process dies, as on a lost node
        kb = super().measure(unit)
        with open(Path(self.log_dir) / "runs.jsonl", "a") as f:
            f.write(json.dumps({"gpus": [str(g) for g in ray.get_gpu_ids()], "pid": os.getpid(), "start": t0,
                                "end": time.time(), "unit": unit.id}) + "\n")
        return kb


def runs(log_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (log_dir / "runs.jsonl").read_text().splitlines()]


def job(tmp_path: Path, source, spec: JobSpec, **engine_kw) -> dict:
    engine = RayEngine(**engine_kw)
    try:
        return run_job(spec, engine, Store(tmp_path / "s.sqlite"), source=source)
    finally:
        engine.close()


def test_the_cluster_reports_its_gpus_per_model():
    assert gpus_by_type(ray.nodes()) == {"H100": 2}


def test_each_worker_holds_a_whole_gpu_and_runs_one_unit_at_a_time(tmp_path):
    source = GpuReplay([ALEXNET, RESNET], tmp_path, time_scale=0.02)
    spec = JobSpec(tables=[ALEXNET, RESNET], workspace_limits=[64 << 20])
    summary = job(tmp_path, source, spec)
    assert summary["ok"] and summary["units"]["measured"] == 84
    assert sorted(w["name"] for w in summary["workers"]) == ["ray:H100#0", "ray:H100#1"]
    log = runs(tmp_path)
    assert all(len(r["gpus"]) == 1 for r in log)
    by_gpu: dict[str, list[dict]] = {}
    for r in log:
        by_gpu.setdefault(r["gpus"][0], []).append(r)
    assert len(by_gpu) == 2  # both GPUs worked
    assert all(len({r["pid"] for r in rs}) == 1 for rs in by_gpu.values())  # one worker per GPU
    for rs in by_gpu.values():
        rs.sort(key=lambda r: r["start"])
        assert all(a["end"] <= b["start"] for a, b in zip(rs, rs[1:]))  # never two units at once on a GPU


def test_networks_are_measured_once_per_distinct_unit_and_a_rerun_skips_them(tmp_path):
    spec = JobSpec(networks=[NetworkRequest("alexnet", [256]), NetworkRequest("resnet50", [128])],
                   tables=[ALEXNET, RESNET], workspace_limits=[64 << 20], total_workspaces=[1 << 30])
    first = job(tmp_path, GpuReplay(spec.tables, tmp_path), spec)
    assert first["units"]["kernels_requested"] == 15 + 159 and first["units"]["total"] == 84
    assert len(runs(tmp_path)) == 84  # 90 duplicate kernels never reached a GPU
    assert first["plans"]["stored"] == 4 and first["ok"]
    again = job(tmp_path, GpuReplay(spec.tables, tmp_path), spec)
    assert again["units"]["skipped"] == 84 and again["units"]["measured"] == 0
    assert len(runs(tmp_path)) == 84 and again["plans"]["already_stored"] == 4


def test_a_unit_that_keeps_failing_is_retried_then_reported_with_its_reasons(tmp_path):
    source = GpuReplay([ALEXNET], tmp_path, fail={"backward_filter": ("raise", 99)})
    spec = JobSpec(tables=[ALEXNET], workspace_limits=[64 << 20], max_retries=2)
    summary = job(tmp_path, source, spec)
    assert summary["units"]["failed"] == 5 and summary["units"]["measured"] == 10 and not summary["ok"]
    for f in summary["failed_units"]:
        assert f["op"] == "backward_filter" and f["attempts"] == 3
        assert all("out of memory (injected" in r for r in f["reasons"])
    assert summary["tables"][0]["status"] == "incomplete"
    assert Store(tmp_path / "s.sqlite").list_tables() == []


def test_a_lost_worker_is_replaced_and_its_unit_measured_on_retry(tmp_path):
    source = GpuReplay([ALEXNET], tmp_path, fail={"forward": ("exit", 1)})
    spec = JobSpec(tables=[ALEXNET], workspace_limits=[64 << 20], max_retries=2)
    summary = job(tmp_path, source, spec)
    assert summary["ok"] and summary["units"]["measured"] == 15 and summary["units"]["retried"] == 5
    assert all(w["alive"] for w in summary["workers"])


def test_gpu_models_the_cluster_lacks_are_refused_with_what_it_has(tmp_path):
    engine = RayEngine(gpu_models=["A100"])
    with pytest.raises(GpuUnavailable, match="2 x H100"):
        engine.start(GpuReplay([ALEXNET], tmp_path))
    engine.close()


def test_the_exact_command_plans_recorded_tables_on_ray_and_lists_the_bundle(tmp_path, capsys):
    a, b = tmp_path / "A.json", tmp_path / "B.json"
    a.write_text(_shipped("alexnet-b256-float32-NCHW-h100"))
    b.write_text(_shipped("resnet50-b128-float32-NCHW-h100"))
    out = tmp_path / "plans.bundle"
    rc = main(["precompute", "--from-table", str(a), "--from-table", str(b), "--workspace-limits",
               "8MiB,64MiB,512MiB", "--total-workspaces", "120MiB,960MiB", "--batch-policy", "powerOfTwo",
               "--engine", "ray", "--out", str(out)])
    summary = json.loads(capsys.readouterr().out)
    assert rc == 0 and summary["engine"] == "ray" and summary["plans"]["stored"] == 10
    assert main(["bundle", "list", str(out), "--json"]) == 0
    plans = json.loads(capsys.readouterr().out)
    assert len(plans) == 10
    assert {p["policy"] for p in plans} == {"wr", "wd"}
    for p in plans:
        assert {"table", "policy", "batch_policy", "device", "cudnn_version", "total_time_ms"} <= set(p)
        size = p["workspace_limit"] if p["policy"] == "wr" else p["total_workspace"]
        assert size in (8 << 20, 64 << 20, 512 << 20, 120 << 20, 960 << 20)
        assert p["device"] == "NVIDIA H100 80GB HBM3" and p["cudnn_version"] == 91900


def _shipped(name: str) -> str:
    from importlib import resources

    return resources.files("ucudnn.data.tables").joinpath(name + ".json").read_text()
