"""With UCUDNN_API_TOKEN set, writes need 'Authorization: Bearer <token>'; reads stay open."""
from __future__ import annotations

import pytest
from server_kit import WEB, ServerThread, synthetic_table

TOKEN = "s3cret-token"
GOOD = {"Authorization": f"Bearer {TOKEN}"}
BAD_HEADERS = [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
               {"Authorization": TOKEN}, {"Authorization": f"Bearer {TOKEN}x"}, {"Authorization": "Bearer"}]


@pytest.fixture
def serve(tmp_path, monkeypatch):
    from ucudnn.server.app import create_app

    servers = []

    def start(**kw):
        monkeypatch.setenv("UCUDNN_API_TOKEN", TOKEN)  # the app reads the variable when it is created
        srv = ServerThread(create_app(f"sqlite:///{tmp_path / 'auth.sqlite'}", gpu_reason=lambda: "no GPU", **kw))
        servers.append(srv.__enter__())
        return srv.url

    yield start
    for s in servers:
        s.__exit__(None, None, None)


@pytest.mark.parametrize("headers", BAD_HEADERS)
def test_writes_without_the_right_token_are_401_and_store_nothing(serve, headers):
    url = serve()
    r = WEB.post(f"{url}/v1/tables", json=synthetic_table(), headers=headers)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json()["field"] == "Authorization"
    assert WEB.post(f"{url}/v1/jobs", json={"problems": [{"n": 1, "c": 1, "h": 3, "w": 3, "k": 1, "r": 3, "s": 3}]},
                      headers=headers).status_code == 401
    assert WEB.post(f"{url}/v1/plans", json={"table": synthetic_table(), "workspace_limit": "1MiB"},
                      headers=headers).status_code == 401
    bench = {"name": "f", "op": "forward", "problem": {"n": 1, "c": 1, "h": 3, "w": 3, "k": 1, "r": 3, "s": 3},
             "measurements": []}
    assert WEB.post(f"{url}/v1/kernel-benches", json={"key": {"device": "d", "cudnn_version": 1}, "bench": bench},
                      headers=headers).status_code == 401
    assert WEB.get(f"{url}/v1/tables").json() == []


def test_writes_with_the_token_succeed_and_reads_need_none(serve):
    url = serve()
    tid = WEB.post(f"{url}/v1/tables", json=synthetic_table(), headers=GOOD).json()["id"]
    plan = WEB.post(f"{url}/v1/plans", json={"table_id": tid, "workspace_limit": "8MiB"}, headers=GOOD)
    assert plan.status_code == 200
    assert WEB.get(f"{url}/v1/tables").status_code == 200
    assert WEB.get(f"{url}/v1/plans/{plan.json()['id']}").status_code == 200
    assert WEB.get(f"{url}/healthz").status_code == 200


def test_plans_need_the_token_by_default(serve):
    url = serve()
    tid = WEB.post(f"{url}/v1/tables", json=synthetic_table(), headers=GOOD).json()["id"]
    assert WEB.post(f"{url}/v1/plans", json={"table_id": tid, "workspace_limit": "8MiB"}).status_code == 401


def test_open_plans_let_anyone_plan_stored_tables_but_not_store_inline_ones(serve):
    url = serve(open_plans=True)
    tid = WEB.post(f"{url}/v1/tables", json=synthetic_table(), headers=GOOD).json()["id"]
    assert WEB.post(f"{url}/v1/plans", json={"table_id": tid, "workspace_limit": "8MiB"}).status_code == 200
    inline = WEB.post(f"{url}/v1/plans", json={"table": synthetic_table(seed=1), "workspace_limit": "8MiB"})
    assert inline.status_code == 401
    assert [t["id"] for t in WEB.get(f"{url}/v1/tables").json()] == [tid]


def test_the_token_is_compared_in_constant_time():
    import inspect

    from ucudnn.server import deps

    assert "hmac.compare_digest" in inspect.getsource(deps.token_ok)


def test_the_openapi_document_declares_bearer_auth(serve):
    schema = WEB.get(f"{serve()}/openapi.json").json()
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"].lower() == "bearer"
