"""Benchmark jobs: refused with 503 where there is no GPU; elsewhere queued, measured, stored as a table.

The GPU path is exercised with a stand-in for ``ucudnn.measure.benchmark``
(``create_app(benchmark=...)``): the job machinery is what is under test.
"""
from __future__ import annotations

import threading

import pytest
from server_kit import WEB, ServerThread, make_server, store_url, wait_until  # noqa: F401 (fixtures)

from ucudnn.planning.table import BenchmarkTable, KernelBench, Measurement
from ucudnn.problem import ConvProblem

CONV = {"n": 8, "c": 16, "h": 14, "w": 14, "k": 32, "r": 3, "s": 3, "pad": 1}


class FakeBenchmark:
    """Measures nothing; records calls; can be held (to watch progress) or made to fail."""

    def __init__(self, fail: bool = False):
        self.calls: list[tuple[str, str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail = fail

    def __call__(self, kernels, batch_policy="powerOfTwo", numerics=None, **kw):
        assert len(kernels) == 1
        spec = kernels[0]
        self.calls.append((spec.problem.key(), spec.op))
        assert self.gate.wait(20)
        if self.fail:
            raise RuntimeError("CUDNN_STATUS_EXECUTION_FAILED (simulated)")
        ms = [Measurement(b, 1, "FMA", 0.01 * b, 1024 * b) for b in (1, 2, 4, spec.problem.n)]
        return BenchmarkTable("Fake GPU", 91900, [KernelBench(spec.name, spec.op, spec.problem, ms)],
                              numerics or "strict")


def test_without_a_gpu_jobs_answer_503_with_the_reason(make_server):
    srv = make_server(gpu_reason=lambda: "no CUDA device is visible")
    r = WEB.post(f"{srv.url}/v1/jobs", json={"problems": [CONV]})
    assert r.status_code == 503
    assert "no CUDA device is visible" in r.json()["detail"]


def test_on_this_host_the_real_gpu_check_decides(make_server):
    from ucudnn.binding.gpu import gpu_available

    if gpu_available():
        pytest.skip("this host has a GPU")
    srv = make_server(gpu_reason=None)  # the real ucudnn.binding.gpu check
    r = WEB.post(f"{srv.url}/v1/jobs", json={"problems": [CONV]})
    assert r.status_code == 503 and r.json()["detail"]
    assert WEB.get(f"{srv.url}/healthz").json()["gpu"] is False


def test_a_job_reports_progress_and_lands_as_a_table(make_server):
    bench = FakeBenchmark()
    bench.gate.clear()
    srv = make_server(benchmark=bench, gpu_reason=lambda: None)
    problems = [dict(CONV, name="a"), dict(CONV, name="b"), dict(CONV, name="c", k=64)]  # a and b: same conv
    r = WEB.post(f"{srv.url}/v1/jobs", json={"problems": problems, "ops": ["forward", "backward_data"]})
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["status"] in ("queued", "running") and job["total"] == 4 and job["progress"] == 0
    bench.gate.set()
    assert wait_until(lambda: WEB.get(f"{srv.url}/v1/jobs/{job['id']}").json()["status"] == "done")
    done = WEB.get(f"{srv.url}/v1/jobs/{job['id']}").json()
    assert done["progress"] == 1.0 and done["done"] == 4
    assert len(bench.calls) == 4  # repeated problems are measured once
    table = BenchmarkTable.from_dict(WEB.get(f"{srv.url}/v1/tables/{done['table_id']}").json())
    assert [k.name for k in table.kernels] == ["a/forward", "a/backward_data", "b/forward", "b/backward_data",
                                               "c/forward", "c/backward_data"]
    assert table.kernels[0].problem == ConvProblem.from_dict(CONV)
    plan = WEB.post(f"{srv.url}/v1/plans", json={"table_id": done["table_id"], "workspace_limit": "1MiB"})
    assert plan.status_code == 200


def test_a_failing_benchmark_fails_the_job_with_its_message(make_server):
    srv = make_server(benchmark=FakeBenchmark(fail=True), gpu_reason=lambda: None)
    job = WEB.post(f"{srv.url}/v1/jobs", json={"problems": [CONV]}).json()
    assert wait_until(lambda: WEB.get(f"{srv.url}/v1/jobs/{job['id']}").json()["status"] == "failed")
    assert "simulated" in WEB.get(f"{srv.url}/v1/jobs/{job['id']}").json()["message"]
    assert WEB.get(f"{srv.url}/healthz").status_code == 200


def test_duplicate_problem_names_are_refused(make_server):
    srv = make_server(benchmark=FakeBenchmark(), gpu_reason=lambda: None)
    r = WEB.post(f"{srv.url}/v1/jobs", json={"problems": [dict(CONV, name="x"), dict(CONV, name="x")]})
    assert r.status_code == 422 and r.json()["field"] == "problems[1].name"


def test_a_job_interrupted_by_a_restart_is_reported_failed(tmp_path):
    from ucudnn.server.app import create_app

    url = f"sqlite:///{tmp_path / 'jobs.sqlite'}"
    bench = FakeBenchmark()
    bench.gate.clear()
    with ServerThread(create_app(url, api_token=None, benchmark=bench, gpu_reason=lambda: None)) as srv:
        job = WEB.post(f"{srv.url}/v1/jobs", json={"problems": [CONV]}).json()
    with ServerThread(create_app(url, api_token=None, gpu_reason=lambda: None)) as srv:
        status = WEB.get(f"{srv.url}/v1/jobs/{job['id']}").json()
    bench.gate.set()
    assert status["status"] == "failed" and "restarted" in status["message"]
