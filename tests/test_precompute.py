"""ucudnn precompute on CPU: recorded H100 tables replayed as if measured, the local engine, the job spec.

Ray-specific behaviour is in test_precompute_ray.py; these tests cover the
shared pipeline (units, de-duplication, skipping, resume, retries, tables,
plans) through the local engine or an in-process fake engine.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import Future
from importlib import resources
from pathlib import Path

import pytest

from ucudnn.catalog.store import Store
from ucudnn.cli import main
from ucudnn.cluster.engines import PlanTask, ReplaySource, Unit, UnitError, UnitResult, Worker, dispatch, plan_task
from ucudnn.cluster.engines.base import Target
from ucudnn.cluster.engines.local import LocalEngine
from ucudnn.cluster.precompute import JobSpec, NetworkRequest, expand, plan_key, run_job
from ucudnn.errors import InputError
from ucudnn.planning.network import load_network
from ucudnn.planning.table import BenchmarkTable

ALEXNET = "builtin:alexnet-b256-float32-NCHW-h100"
RESNET = "builtin:resnet50-b128-float32-NCHW-h100"
H100 = Target("NVIDIA H100 80GB HBM3", 91900)


@pytest.fixture(autouse=True)
def _legacy_sources(monkeypatch):
    """The recorded tables these jobs replay were measured with the legacy source alone."""
    monkeypatch.setenv("UCUDNN_SOURCES", "legacy")



@pytest.fixture(scope="module")
def recorded() -> list[BenchmarkTable]:
    return [BenchmarkTable.load(ALEXNET), BenchmarkTable.load(RESNET)]


class InlineEngine:
    """The engine protocol in this process: workers are names, units run synchronously (no processes)."""

    name = "inline"

    def __init__(self, source, workers: int = 2, die_on: set[str] | None = None):
        self.source, self.n, self.die_on = source, workers, die_on or set()
        self.calls: list[tuple[str, str]] = []
        self.restarts = 0

    def start(self, source):
        self.source = source
        return [Worker(f"inline:{i}", source.probe()) for i in range(self.n)]

    def submit(self, worker, unit):
        fut: Future = Future()
        self.calls.append((worker.name, unit.id))
        if unit.id in self.die_on:  # the worker process vanishes under this unit, once
            self.die_on.discard(unit.id)
            fut.set_exception(ConnectionError("worker process exited"))
            return fut
        t0 = time.perf_counter()
        try:
            fut.set_result(UnitResult(unit.id, self.source.measure(unit), None, time.perf_counter() - t0, worker.name))
        except Exception as e:  # noqa: BLE001
            fut.set_result(UnitResult(unit.id, None, f"{type(e).__name__}: {e}", 0.0, worker.name))
        return fut

    def restart(self, worker):
        self.restarts += 1
        return True

    def release(self):
        pass

    def plan(self, tasks):
        for t in tasks:
            yield t, plan_task(t)

    def close(self):
        pass


class FlakySource(ReplaySource):
    """Replay, but the units of some recorded kernels fail their first ``n`` attempts (counted in files)."""

    def __init__(self, tables, state_dir: Path, failures: dict[str, int]):
        super().__init__(tables)
        self.state_dir = str(state_dir)
        # recorded kernel name -> (problem, op) -> failures before success
        self.failures = {}
        for t in self.tables:
            for k in t.kernels:
                if k.name in failures:
                    self.failures[(k.problem, k.op)] = failures[k.name]

    def measure(self, unit):
        n = self.failures.get((unit.problem, unit.op), 0)
        count_file = Path(self.state_dir) / unit.id
        done = int(count_file.read_text()) if count_file.exists() else 0
        if done < n:
            count_file.write_text(str(done + 1))
            raise UnitError(f"injected failure {done + 1} of {n}")
        return super().measure(unit)


def spec_for(**kw) -> JobSpec:
    spec = JobSpec(**kw)
    spec.check()
    return spec


# -- units ----------------------------------------------------------------------------------------------
def test_a_unit_key_is_the_library_cache_key(monkeypatch):
    """A precomputed unit is found by ucudnn.api under exactly the key the library computes itself."""
    import ucudnn.api as api

    monkeypatch.setattr(api, "device_name", lambda: H100.device)
    monkeypatch.setattr(api.cudnn, "get_version", lambda: H100.cudnn_version)
    spec = load_network("alexnet").kernels(256)[1]
    unit = Unit(H100, spec.problem, spec.op, "strict", "powerOfTwo")
    assert unit.key() == api._cache_key(spec.problem, spec.op, "strict", "powerOfTwo", sources=unit.sources)
    assert unit.sources == api._source_names(None)        # the library's default sources
    legacy = Unit(H100, spec.problem, spec.op, "strict", "powerOfTwo", ("legacy",))
    assert legacy.key() == api._cache_key(spec.problem, spec.op, "strict", "powerOfTwo")   # keys before sources
    monkeypatch.setenv("UCUDNN_CHANNEL_POLICY", "halves")   # a job run with slices looks up under its policy
    sliced = Unit(H100, spec.problem, spec.op, "strict", "powerOfTwo", unit.sources, "halves")
    assert sliced.key() == api._cache_key(spec.problem, spec.op, "strict", "powerOfTwo", sources=unit.sources)
    assert sliced.id != unit.id and sliced.to_dict()["channel_policy"] == "halves"


def test_accelerator_type_follows_rays_naming():
    assert Target("NVIDIA H100 80GB HBM3", 1).accelerator_type == "H100"
    assert Target("NVIDIA H200", 1).accelerator_type == "H200"
    assert Target("NVIDIA A100-SXM4-80GB", 1).accelerator_type == "A100"
    assert Target("NVIDIA GeForce RTX 4090", 1).accelerator_type == "GeForce-RTX-4090"


def test_the_same_convolution_in_two_networks_is_one_unit(tmp_path, recorded):
    """A network file repeating AlexNet's layers adds kernels to plan but no unit to measure."""
    twin = json.loads(resources.files("ucudnn.data.networks").joinpath("alexnet.json").read_text())
    twin["name"] = "alexnet-twin"
    (tmp_path / "twin.json").write_text(json.dumps(twin))
    spec = spec_for(networks=[NetworkRequest("alexnet", [256]), NetworkRequest(str(tmp_path / "twin.json"), [256]),
                              NetworkRequest("resnet50", [128])], tables=[ALEXNET, RESNET], workspace_limits=[64 << 20])
    source = ReplaySource(recorded)
    engine = InlineEngine(source)
    summary = run_job(spec, engine, Store(tmp_path / "s.sqlite"), source=source)
    resnet_unique = len({(k.problem, k.op) for k in load_network("resnet50").kernels(128)})
    assert summary["units"]["kernels_requested"] == 15 + 15 + 159
    assert summary["units"]["total"] == 15 + resnet_unique
    assert summary["units"]["measured"] == 15 + resnet_unique
    assert len(engine.calls) == len({uid for _, uid in engine.calls}) == 15 + resnet_unique  # each measured once
    assert [t["status"] for t in summary["tables"]] == ["stored"] * 3


def test_units_the_store_holds_are_skipped_and_tables_and_plans_are_not_made_twice(tmp_path, recorded):
    spec = spec_for(tables=[ALEXNET], workspace_limits=[8 << 20, 64 << 20], total_workspaces=[120 << 20])
    store = Store(tmp_path / "s.sqlite")
    first = run_job(spec, InlineEngine(ReplaySource(recorded)), store, source=ReplaySource(recorded))
    engine = InlineEngine(ReplaySource(recorded))
    again = run_job(spec, engine, store, source=ReplaySource(recorded))
    assert first["units"]["measured"] == 15 and first["plans"]["stored"] == 3
    assert again["units"] == {**first["units"], "measured": 0, "skipped": 15}
    assert engine.calls == []
    assert again["plans"]["stored"] == 0 and again["plans"]["already_stored"] == 3
    assert len(store.list_tables()) == 1 and len(store.list_plans()) == 3


def test_a_recorded_table_replayed_keeps_its_id(tmp_path, recorded):
    """Planning --from-table T stores T itself (same content id): a service given T finds these plans."""
    spec = spec_for(tables=[ALEXNET], workspace_limits=[64 << 20])
    summary = run_job(spec, InlineEngine(ReplaySource(recorded)), Store(tmp_path / "s.sqlite"),
                      source=ReplaySource(recorded))
    assert summary["tables"][0]["id"] == recorded[0].content_id()


def test_units_missing_from_the_recording_fail_with_the_reason_and_store_no_table(tmp_path, recorded):
    """Asking for batch policy `all` from a powerOfTwo recording: every unit lacks sizes; nothing partial is stored."""
    spec = spec_for(tables=[ALEXNET], workspace_limits=[64 << 20], batch_policy="all", max_retries=0)
    store = Store(tmp_path / "s.sqlite")
    summary = run_job(spec, InlineEngine(ReplaySource(recorded)), store, source=ReplaySource(recorded))
    assert summary["units"]["failed"] == 15 and not summary["ok"]
    assert "no measurements at micro-batch sizes [3, 5, 6" in summary["failed_units"][0]["reasons"][0]
    assert summary["tables"][0]["status"] == "incomplete"
    assert store.list_tables() == [] and store.list_plans() == []


def test_a_failing_unit_is_retried_then_reported_and_its_table_is_not_stored(tmp_path, recorded):
    source = FlakySource(recorded, tmp_path, {"conv1/forward": 1, "conv2/backward_data": 99})
    spec = spec_for(networks=[NetworkRequest("alexnet", [256])], tables=[ALEXNET], workspace_limits=[64 << 20],
                    max_retries=2)
    store = Store(tmp_path / "s.sqlite")
    summary = run_job(spec, InlineEngine(source), store, source=source)
    assert summary["units"]["measured"] == 14 and summary["units"]["failed"] == 1
    assert summary["units"]["retried"] == 2
    [failed] = summary["failed_units"]
    assert failed["op"] == "backward_data" and failed["attempts"] == 3 and len(failed["reasons"]) == 3
    assert "injected failure 3 of 99" in failed["reasons"][-1]
    assert summary["tables"][0]["status"] == "incomplete" and summary["tables"][0]["missing_kernels"] == [
        "conv2/backward_data"]
    assert store.list_tables() == []  # partial results are never stored as a complete table
    assert len(_bench_rows(store)) == 14  # ... but each measured unit is kept: a rerun measures only the failure
    again = run_job(spec, InlineEngine(ReplaySource(recorded)), store, source=ReplaySource(recorded))
    assert again["units"]["measured"] == 1 and again["units"]["skipped"] == 14 and again["ok"]


def test_retries_prefer_another_worker(tmp_path, recorded):
    source = FlakySource(recorded, tmp_path, {"conv1/forward": 1})
    engine = InlineEngine(source, workers=2)
    run_job(spec_for(tables=[ALEXNET], workspace_limits=[64 << 20]), engine, Store(tmp_path / "s.sqlite"),
            source=source)
    conv1 = Unit(H100, recorded[0].kernels[0].problem, "forward", "strict", "powerOfTwo", ("legacy",)).id
    workers = [w for w, uid in engine.calls if uid == conv1]
    assert len(workers) == 2 and workers[0] != workers[1]


def test_a_worker_that_dies_is_restarted_and_its_unit_retried(tmp_path, recorded):
    conv1 = Unit(H100, recorded[0].kernels[0].problem, "forward", "strict", "powerOfTwo", ("legacy",)).id
    engine = InlineEngine(ReplaySource(recorded), die_on={conv1})
    summary = run_job(spec_for(tables=[ALEXNET], workspace_limits=[64 << 20]), engine, Store(tmp_path / "s.sqlite"),
                      source=ReplaySource(recorded))
    assert engine.restarts == 1 and summary["units"]["measured"] == 15 and summary["ok"]


def test_dispatch_fails_units_no_worker_can_measure(recorded):
    other = Target("NVIDIA A100-SXM4-80GB", 90100)
    unit = Unit(other, recorded[0].kernels[0].problem, "forward", "strict", "powerOfTwo")
    engine = InlineEngine(ReplaySource(recorded))
    [outcome] = dispatch(engine, engine.start(ReplaySource(recorded)), [unit])
    assert outcome.status == "failed" and "no worker of this engine is a NVIDIA A100" in outcome.reasons[0]


def test_longest_units_start_first(recorded):
    kernels = load_network("resnet50").kernels(128)
    units = [Unit(H100, k.problem, k.op, "strict", "powerOfTwo") for k in kernels[:12]]
    engine = InlineEngine(ReplaySource(recorded), workers=1)
    dispatch(engine, engine.start(ReplaySource(recorded)), units)
    order = [uid for _, uid in engine.calls]
    costs = {u.id: u.cost() for u in units}
    assert [costs[u] for u in order] == sorted(costs.values(), reverse=True)


# -- plans -------------------------------------------------------------------------------------------------
def test_infeasible_limits_are_reported_with_the_smallest_limit_that_works(tmp_path, recorded):
    """conv2/forward without its workspace-free algorithms: 1 byte is too small, and the answer says what is not."""
    doc = recorded[0].to_dict()
    doc["kernels"][3]["measurements"] = [m for m in doc["kernels"][3]["measurements"] if m["workspace_bytes"] > 0]
    BenchmarkTable.from_dict(doc).save(tmp_path / "t.json")
    spec = spec_for(tables=[str(tmp_path / "t.json")], workspace_limits=[1, 64 << 20], max_retries=0)
    summary = run_job(spec, InlineEngine(None), Store(tmp_path / "s.sqlite"),
                      source=ReplaySource(spec.tables))
    [bad] = summary["plans"]["failed"]
    assert bad["workspace_limit"] == 1 and bad["infeasible"] and bad["min_workspace"] > 1
    assert "conv2/forward" in bad["error"]
    assert summary["plans"]["stored"] == 1 and summary["ok"]


def test_a_complete_table_is_planned_while_the_gpus_measure_the_rest(tmp_path, recorded):
    """Planning overlaps measuring: only the last table's plans wait for the GPUs to finish."""
    import threading

    class Watching(InlineEngine):
        def __init__(self, source):
            super().__init__(source)
            self.planning = threading.Event()
            self.overlapped: bool | None = None

        def submit(self, worker, unit):
            if self.overlapped is None:  # first unit of the second job: AlexNet's plans must already be under way
                self.overlapped = self.planning.wait(timeout=10)
            return super().submit(worker, unit)

        def plan(self, tasks):
            self.planning.set()
            yield from super().plan(tasks)

    store = Store(tmp_path / "s.sqlite")
    run_job(spec_for(tables=[ALEXNET], workspace_limits=[8 << 20]), InlineEngine(ReplaySource(recorded)), store,
            source=ReplaySource(recorded))  # AlexNet's units are now stored
    engine = Watching(ReplaySource(recorded))
    spec = spec_for(tables=[ALEXNET, RESNET], workspace_limits=[64 << 20])
    summary = run_job(spec, engine, store, source=ReplaySource(recorded))
    assert engine.overlapped is True
    assert summary["seconds"]["tables_planned_while_measuring"] >= 1
    assert summary["plans"]["stored"] == 2 and [t["status"] for t in summary["tables"]] == ["stored"] * 2


def test_plans_are_stored_under_the_plan_service_key(tmp_path, recorded):
    """A plan service on the same store answers precomputed plans without planning."""
    from fastapi.testclient import TestClient
    from ucudnn.server.app import create_app
    from ucudnn.server.models import PlanRequest
    from ucudnn.server.planning import PlanService

    store_path = tmp_path / "s.sqlite"
    summary = run_job(spec_for(tables=[ALEXNET], workspace_limits=[64 << 20], total_workspaces=[960 << 20]),
                      InlineEngine(ReplaySource(recorded)), Store(store_path), source=ReplaySource(recorded))
    tid = summary["tables"][0]["id"]
    for policy, size, field in (("wr", 64 << 20, "workspace_limit"), ("wd", 960 << 20, "total_workspace")):
        req = PlanRequest(table_id=tid, policy=policy, batch_policy="powerOfTwo", **{field: size})
        assert PlanService.key(req, tid) == plan_key(tid, policy, "powerOfTwo", size)
    stored = {p["id"]: p for p in summary["plans"]["new"]}
    with TestClient(create_app(str(store_path), api_token=None)) as client:
        r = client.post("/v1/plans", json={"table_id": tid, "policy": "wd", "total_workspace": "960MiB"})
        assert r.status_code == 200
        assert r.json()["id"] in stored


def test_planning_in_a_process_pool_gives_the_same_plans(tmp_path, recorded):
    """Many (table, limit) pairs go to a process pool; the answers equal those made in the driver."""
    table = recorded[0]
    reqs = [("wr", s << 20) for s in (1, 4, 8, 16, 64, 256, 512)] * 2 + [("wd", s << 20) for s in (120, 960)] * 6
    tasks = [PlanTask(f"t{i}", table, reqs[i::2], "powerOfTwo") for i in range(2)]
    engine = LocalEngine()
    try:
        pooled = dict((t.table_id, ans) for t, ans in engine.plan(tasks))
    finally:
        engine.close()
    for t in tasks:
        inline = plan_task(t)
        def plans(answers):  # solver statistics (solve times) aside
            return [{k: v for k, v in a["plan"].to_dict().items() if k != "stats"} for a in answers]

        assert plans(pooled[t.table_id]) == plans(inline)


# -- the local engine, killed and resumed -------------------------------------------------------------------
def _bench_rows(store: Store) -> list[str]:
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from ucudnn.catalog.store import KernelBenchRow

    with Session(store.engine) as s:
        return list(s.execute(select(KernelBenchRow.id)).scalars())


JOB_SCRIPT = textwrap.dedent("""
    import sys
    from ucudnn.engines import ReplaySource
    from ucudnn.engines.local import LocalEngine
    from ucudnn.precompute import JobSpec, run_job
    from ucudnn.store import Store
    spec = JobSpec(tables=[{table!r}], workspace_limits=[64 << 20])
    source = ReplaySource(spec.tables, time_scale={scale})
    engine = LocalEngine(workers=1)
    try:
        run_job(spec, engine, Store(sys.argv[1]), source=source)
    finally:
        engine.close()
""")


def test_a_job_killed_halfway_resumes_without_measuring_anything_twice(tmp_path, recorded):
    db = tmp_path / "s.sqlite"
    script = JOB_SCRIPT.format(table=RESNET, scale=0.5)  # ~0.15 s a unit, 69 units: ~10 s if left alone
    proc = subprocess.Popen([sys.executable, "-c", script, str(db)], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        stored: list[str] = []
        while time.monotonic() < deadline and proc.poll() is None:
            if db.exists():
                try:
                    stored = _bench_rows(Store(db))
                except Exception:  # noqa: BLE001 - the job may be creating the schema right now
                    stored = []
                if len(stored) >= 8:
                    break
            time.sleep(0.2)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        os.killpg(proc.pid, signal.SIGKILL)  # the job and its worker process, mid-measurement
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    store = Store(db)
    before = set(_bench_rows(store))
    assert 8 <= len(before) < 69
    source = ReplaySource(recorded)
    engine = InlineEngine(source)
    summary = run_job(spec_for(tables=[RESNET], workspace_limits=[64 << 20]), engine, store, source=source)
    measured_again = {uid for _, uid in engine.calls}
    assert not (measured_again & before)  # nothing stored before the kill is measured again
    assert summary["units"]["skipped"] == len(before)
    assert summary["units"]["measured"] == 69 - len(before) and summary["ok"]
    assert summary["tables"][0]["status"] == "stored"


def test_the_local_engine_measures_in_worker_processes(tmp_path, recorded):
    spec = spec_for(tables=[ALEXNET, RESNET], workspace_limits=[64 << 20])
    engine = LocalEngine(workers=2)
    try:
        summary = run_job(spec, engine, Store(tmp_path / "s.sqlite"), source=ReplaySource(spec.tables))
    finally:
        engine.close()
    assert summary["units"]["measured"] == 84 and summary["ok"]
    assert sorted(w["name"] for w in summary["workers"]) == ["local:0", "local:1"]
    assert sum(w["units"] for w in summary["workers"]) == 84


# -- the job spec and the command --------------------------------------------------------------------------
def test_a_yaml_job_file_is_read_with_sizes_and_per_network_batches(tmp_path):
    (tmp_path / "job.yaml").write_text(textwrap.dedent("""
        networks: [alexnet@256, {name: resnet50, batch_sizes: [64, 128]}]
        dtypes: [float32, float16]
        batch_policy: pow2
        workspace_limits: [8MiB, 67108864]
        total_workspaces: [1GiB]
        gpu_models: [H100, H200]
        max_retries: 1
    """))
    spec = JobSpec.load(tmp_path / "job.yaml")
    assert [(n.network, n.batch_sizes) for n in spec.networks] == [("alexnet", [256]), ("resnet50", [64, 128])]
    assert spec.batch_policy == "powerOfTwo" and spec.workspace_limits == [8 << 20, 64 << 20]
    assert spec.total_workspaces == [1 << 30] and spec.gpu_models == ["H100", "H200"] and spec.max_retries == 1
    requests = expand(spec, [H100, Target("NVIDIA H200", 91900)])
    assert len(requests) == (1 + 2) * 2 * 2  # network instances x dtypes x GPU models


def test_a_job_reads_back_what_it_writes():
    """The job a precompute summary records (``to_dict``) is a job file for the same job: defaults left out."""
    for doc in ({"networks": ["alexnet"]},
                {"networks": ["alexnet@64,128", {"name": "resnet50"}], "tables": [ALEXNET], "batch_sizes": [32],
                 "dtypes": ["float32", "float16"], "layouts": ["NHWC"], "numerics": [None, "tf32"],
                 "ops": ["forward"], "batch_policy": "all", "workspace_limits": ["8MiB"],
                 "total_workspaces": ["1GiB"], "gpu_models": ["H100"], "repeat": 0, "max_retries": 1,
                 "sources": "legacy,graph", "channel_policy": "halves"}):
        spec = JobSpec.from_dict(doc)
        written = spec.to_dict()
        assert None not in written.values() and JobSpec.from_dict(written) == spec
        assert JobSpec.from_dict(json.loads(json.dumps(written))).to_dict() == written


@pytest.mark.parametrize("doc,field", [
    ({"networks": ["alexnet"], "workspace_limits": ["8MiB", "12 parsecs"]}, "job.workspace_limits[1]"),
    ({"networks": ["alexnet"], "dtypes": ["float64"]}, "dtypes[0]"),
    ({"networks": ["alexnet"], "batch_policy": "sometimes"}, "job.batch_policy"),
    ({"networks": ["alexnet"], "colour": "blue"}, "(document)"),
    ({"dtypes": ["float32"]}, "job.networks"),
])
def test_bad_job_files_name_the_field(doc, field):
    with pytest.raises(InputError) as e:
        JobSpec.from_dict(doc)
    assert e.value.field == field


def test_the_command_plans_recorded_tables_into_a_bundle_and_prints_json(tmp_path, capsys):
    out = tmp_path / "plans.bundle"
    rc = main(["precompute", "--from-table", ALEXNET, "--from-table", RESNET, "--workspace-limits",
               "8MiB,64MiB,512MiB", "--total-workspaces", "120MiB,960MiB", "--batch-policy", "powerOfTwo",
               "--engine", "local", "--out", str(out), "--progress"])
    summary = json.loads(capsys.readouterr().out)
    assert rc == 0 and summary["ok"] and summary["plans"]["stored"] == 10 and summary["bundle"] == str(out)
    assert not Path(str(out) + "-wal").exists()  # one self-contained file
    rc = main(["bundle", "list", str(out), "--json"])
    plans = json.loads(capsys.readouterr().out)
    assert rc == 0 and len(plans) == 10


def test_the_command_with_a_separate_store_bundles_only_this_jobs_rows(tmp_path, capsys):
    store = tmp_path / "cluster.sqlite"
    main(["precompute", "--from-table", RESNET, "--workspace-limits", "64MiB", "--store", str(store)])
    capsys.readouterr()
    rc = main(["precompute", "--from-table", ALEXNET, "--workspace-limits", "64MiB", "--store", str(store),
               "--out", str(tmp_path / "a.bundle")])
    assert rc == 0
    capsys.readouterr()
    main(["bundle", "list", str(tmp_path / "a.bundle"), "--json"])
    [plan] = json.loads(capsys.readouterr().out)
    assert plan["kernels"] == 15  # the ResNet-50 plan stays in the cluster store


def test_measuring_without_a_gpu_exits_4(capsys):
    from ucudnn.binding.gpu import gpu_available

    if gpu_available():
        pytest.skip("this host has a GPU")
    assert main(["precompute", "--network", "alexnet", "--engine", "local", "--workspace-limits", "64MiB"]) == 4
    err = capsys.readouterr().err
    assert "CuPy" in err or "CUDA" in err


def test_a_bad_channel_policy_flag_is_named(capsys):
    assert main(["precompute", "--from-table", ALEXNET, "--channel-policy", "thirds"]) == 2
    assert "--channel-policy" in capsys.readouterr().err


def test_the_ray_engine_without_ray_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    assert main(["precompute", "--from-table", ALEXNET, "--engine", "ray"]) == 2
    assert "ucudnn[cluster]" in capsys.readouterr().err


def test_units_carry_the_channel_policy_they_are_measured_with(monkeypatch, recorded):
    """A network job measures channel slices where its channel_policy (--channel-policy), else
    UCUDNN_CHANNEL_POLICY, asks, and its units and tables say so; a recorded table replays units of its own policy,
    and a sliced table answers an unsliced unit with its whole-k rows only."""
    import dataclasses

    monkeypatch.setenv("UCUDNN_SOURCES", "legacy")
    spec = spec_for(networks=[NetworkRequest("alexnet", [256])], workspace_limits=[64 << 20])
    [req] = expand(spec, [H100])
    assert {u.channel_policy for _, u in req.kernels} == {"none"} and "channel_policy" not in req.extra
    monkeypatch.setenv("UCUDNN_CHANNEL_POLICY", "halves")
    [req] = expand(spec, [H100])
    assert {u.channel_policy for _, u in req.kernels} == {"halves"} and req.extra["channel_policy"] == "halves"
    spec.channel_policy = "none"                               # the job's own policy wins over the environment
    [req] = expand(spec, [H100])
    unit = req.kernels[1][1]
    assert unit.channel_policy == "none"
    with pytest.raises(UnitError, match=r"\(channel policy halves\)"):   # the recorded tables hold no slices
        ReplaySource(recorded).measure(dataclasses.replace(unit, channel_policy="halves"))
    # a sliced recording of the same kernel: whole-k and sliced rows
    table = recorded[0]
    k = next(k for k in table.kernels if (k.problem, k.op) == (unit.problem, unit.op))
    halves = BenchmarkTable(table.device, table.cudnn_version, [dataclasses.replace(
        k, measurements=k.measurements + [dataclasses.replace(m, channels=k.problem.k // 2) for m in k.measurements])],
        table.numerics, {**table.extra, "channel_policy": "halves"})
    replay = ReplaySource([halves])
    got = replay.measure(dataclasses.replace(unit, channel_policy="halves")).measurements
    assert {m.channels for m in got} == {None, k.problem.k // 2}
    assert {m.channels for m in replay.measure(unit).measurements} == {None}
    assert JobSpec.from_dict({"networks": ["alexnet"], "channel_policy": "HALVES"}).channel_policy == "halves"
    with pytest.raises(InputError) as e:
        JobSpec.from_dict({"networks": ["alexnet"], "channel_policy": "thirds"})
    assert e.value.field == "job.channel_policy"


def test_units_carry_the_sources_they_are_measured_with(monkeypatch, recorded):
    """A network job measures with the library's default sources, or --sources; a recorded table replays only units
    of the sources it was measured with, and says so when asked for others."""
    monkeypatch.setenv("UCUDNN_SOURCES", "legacy,graph")
    spec = spec_for(networks=[NetworkRequest("alexnet", [256])], workspace_limits=[64 << 20])
    [req] = expand(spec, [H100])
    assert {u.sources for _, u in req.kernels} == {("legacy", "graph")} and req.extra["sources"] == ["legacy", "graph"]
    with pytest.raises(UnitError, match="with numerics strict and sources legacy,graph"):
        ReplaySource(recorded).measure(req.kernels[0][1])
    spec.sources = ["legacy"]
    [req] = expand(spec, [H100])
    assert ReplaySource(recorded).measure(req.kernels[0][1]).measurements
    assert JobSpec.from_dict({"networks": ["alexnet"], "sources": "graph, legacy"}).sources == ["legacy", "graph"]
    with pytest.raises(InputError) as e:
        JobSpec.from_dict({"networks": ["alexnet"], "sources": "legacy,nope"})
    assert e.value.field == "job.sources"


def test_a_job_precomputes_with_the_librarys_default_policy_and_keys_plans_by_the_sizes_it_measured():
    """Jobs plan with ``powerOfTwoAndEvenSplits`` where UCUDNN_BATCH_SIZE_POLICY is unset, so a spec that names no
    policy precomputes that; a stored plan is keyed by the sizes its policy measured: ``powerOfTwo`` (the plan
    service's default request) at a power-of-two batch, the policy's own name at an odd one or across batches."""
    from ucudnn.config import DEFAULT_BATCH_POLICY
    from ucudnn.planning.table import BenchmarkTable, KernelBench
    from ucudnn.policy import key_policy_of
    from ucudnn.problem import ConvProblem

    assert JobSpec().batch_policy == DEFAULT_BATCH_POLICY == "powerOfTwoAndEvenSplits"

    def table(*batches):
        return BenchmarkTable("fake", 1, [KernelBench(f"k{n}", "forward", ConvProblem(n, 3, 8, 8, 4, 3, 3), [])
                                          for n in batches], "strict", {})

    def service_policy(t, policy):      # what run_job names and keys a table's plans by
        return key_policy_of(policy, (k.problem.n for k in t.kernels))

    assert service_policy(table(256, 256), "powerOfTwoAndEvenSplits") == "powerOfTwo"
    assert service_policy(table(127), "powerOfTwoAndEvenSplits") == "powerOfTwoAndEvenSplits"
    assert service_policy(table(256, 128), "evenSplits") == "powerOfTwoAndEvenSplits"
    assert service_policy(table(256), "pow2") == "powerOfTwo"
