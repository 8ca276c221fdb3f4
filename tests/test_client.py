"""ucudnn.catalog.client.PlanClient against the real service on loopback: typed results, ucudnn's own errors."""
from __future__ import annotations

import pytest
from server_kit import make_server, server, store_url, synthetic_table  # noqa: F401 (fixtures)

from ucudnn.catalog.client import PlanClient, ServiceError, from_env
from ucudnn.errors import GpuUnavailable, InfeasibleError, InputError
from ucudnn.planning.plan import Plan
from ucudnn.planning.planner import plan as local_plan
from ucudnn.planning.table import BenchmarkTable, KernelBench, Measurement
from ucudnn.problem import ConvProblem


@pytest.fixture
def client(server):
    with PlanClient(server.url) as c:
        yield c


def test_put_table_returns_the_content_id_and_tables_finds_it(client):
    table = BenchmarkTable.from_dict(synthetic_table(device="GPU X", cudnn_version=90500))
    tid = client.put_table(table)
    assert tid == table.content_id() == client.put_table(table.to_dict())
    assert [t["id"] for t in client.tables(device="GPU X", cudnn_version=90500)] == [tid]
    assert client.tables(device="GPU Y") == []
    assert client.get_table(tid).content_id() == tid


def test_plan_returns_a_plan_equal_to_the_local_planners(client):
    table = BenchmarkTable.from_dict(synthetic_table())
    tid = client.put_table(table)
    plan = client.plan(tid, "wr", workspace_limit="16MiB", batch_policy="powerOfTwo")
    assert isinstance(plan, Plan)
    assert plan.to_dict() == local_plan(table, "wr", workspace_limit="16MiB").to_dict()
    pid, same = client.plan_with_id(table, "wr", workspace_limit=16 << 20)  # inline, bytes: the same plan
    assert same.to_dict() == plan.to_dict()
    assert client.get_plan(pid).to_dict() == plan.to_dict()
    wd = client.plan(tid, "wd", total_workspace="120MiB")
    assert wd.policy == "wd" and wd.workspace_bytes <= 120 << 20


def test_refusals_come_back_as_ucudnn_errors(client):
    tid = client.put_table(BenchmarkTable.from_dict(synthetic_table(big_workspace=True)))
    with pytest.raises(InputError) as e:
        client.plan(tid, "wr", workspace_limit="-1MiB")
    assert e.value.field == "workspace_limit"
    with pytest.raises(InfeasibleError) as inf:
        client.plan(tid, "wr", workspace_limit="1KiB")
    assert inf.value.min_workspace and client.plan(tid, "wr", workspace_limit=inf.value.min_workspace)
    with pytest.raises(ServiceError) as nf:
        client.get_plan("00ff")
    assert nf.value.status_code == 404
    with pytest.raises(GpuUnavailable):
        client.submit_job([ConvProblem(8, 3, 8, 8, 4, 3, 3)])


def test_a_wrong_token_is_a_service_error_401(make_server):
    srv = make_server(api_token="right")
    with PlanClient(srv.url, token="wrong") as c, pytest.raises(ServiceError) as e:
        c.put_table(synthetic_table())
    assert e.value.status_code == 401
    with PlanClient(srv.url, token="right") as c:
        assert c.put_table(synthetic_table())


def test_the_token_defaults_to_UCUDNN_API_TOKEN(make_server, monkeypatch):
    srv = make_server(api_token="from-env")
    monkeypatch.setenv("UCUDNN_API_TOKEN", "from-env")
    with PlanClient(srv.url) as c:
        assert c.put_table(synthetic_table())


def test_an_unreachable_server_is_a_service_error():
    from server_kit import free_port

    with PlanClient(f"http://127.0.0.1:{free_port()}", timeout=2) as c, pytest.raises(ServiceError):
        c.health()


def test_kernel_measurements_are_shared_under_the_librarys_cache_key(client):
    problem = ConvProblem(16, 32, 14, 14, 64, 3, 3, pad=1)
    key = {"device": "NVIDIA H100 80GB HBM3", "cudnn_version": 91900, "problem": problem.to_dict(),
           "op": "forward", "numerics": "strict", "batch_policy": "powerOfTwo"}
    assert client.get_kernel_bench(key) is None
    kb = KernelBench("forward", "forward", problem, [Measurement(b, 1, "FMA", 0.02 * b, 4096 * b) for b in (1, 2, 4, 8, 16)])
    client.put_kernel_bench(key, kb)
    got = client.get_kernel_bench(key)
    assert got is not None and got.to_dict() == kb.to_dict()
    bad = KernelBench("forward", "forward", problem, [Measurement(32, 1, "FMA", 0.1, 0)])  # micro-batch > n
    with pytest.raises(InputError) as e:
        client.put_kernel_bench(key, bad)
    assert e.value.field == "bench.measurements[0].micro_batch"


def test_from_env_reads_UCUDNN_PLAN_SERVER(monkeypatch, server):
    monkeypatch.delenv("UCUDNN_PLAN_SERVER", raising=False)
    assert from_env() is None
    monkeypatch.setenv("UCUDNN_PLAN_SERVER", server.url)
    c = from_env()
    assert c is not None and c.health()["status"] == "ok"
    c.close()
