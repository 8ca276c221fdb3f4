"""Bad input never gets a 5xx: each answer is a 4xx whose body names the offending field."""
from __future__ import annotations

import json
import re
import sys

import pytest
from server_kit import ServerThread, synthetic_table


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server for the module: input errors are the service's, not the database's (SQLite is enough)."""
    from ucudnn.server.app import create_app

    url = f"sqlite:///{tmp_path_factory.mktemp('errors') / 'service.sqlite'}"
    with ServerThread(create_app(url, api_token=None, gpu_reason=lambda: "no GPU in the test process")) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server):
    import httpx

    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def tid(http):
    return http.post("/v1/tables", json=synthetic_table()).json()["id"]


def _stored(http) -> set[str]:
    return {t["id"] for t in http.get("/v1/tables").json()}


def _table_with(path: str, value):
    doc = synthetic_table()
    target = doc
    keys = path.split(".")
    for k in keys[:-1]:
        target = target[int(k)] if k.isdigit() else target[k]
    last = keys[-1]
    target[int(last) if last.isdigit() else last] = value
    return doc


def assert_refused(r, status: int, field: str | None):
    assert r.status_code == status, r.text
    body = r.json()
    assert body["detail"]
    if field is not None:
        assert body["field"] == field, body


@pytest.mark.parametrize("body, field", [
    ({"policy": "wr", "workspace_limit": "64MiB"}, "table_id"),
    ({"policy": "bogus", "workspace_limit": "64MiB"}, "policy"),
    ({"policy": "wr"}, "workspace_limit"),
    ({"policy": "wd"}, "total_workspace"),
    ({"policy": "wr", "workspace_limit": "-64MiB"}, "workspace_limit"),
    ({"policy": "wr", "workspace_limit": -1}, "workspace_limit"),
    ({"policy": "wr", "workspace_limit": 0}, "workspace_limit"),
    ({"policy": "wd", "total_workspace": "0B"}, "total_workspace"),
    ({"policy": "wr", "workspace_limit": 10**30}, "workspace_limit"),
    ({"policy": "wd", "total_workspace": "1e30"}, "total_workspace"),
    ({"policy": "wr", "workspace_limit": "64 parsecs"}, "workspace_limit"),
    ({"policy": "wr", "workspace_limit": True}, "workspace_limit"),
    ({"policy": "wr", "workspace_limit": [64]}, "workspace_limit"),
    ({"policy": "wr", "workspace_limit": "64MiB", "total_workspace": "1GiB"}, "total_workspace"),
    ({"policy": "wd", "total_workspace": "1GiB", "workspace_limit": "64MiB"}, "workspace_limit"),
    ({"policy": "wr", "workspace_limit": "64MiB", "batch_policy": "fibonacci"}, "batch_policy"),
    ({"policy": "wr", "workspace_limit": "64MiB", "batch_policy": 7}, "batch_policy"),
    ({"policy": "wr", "workspace_limit": "64MiB", "workspace-limit": "1MiB"}, "workspace-limit"),
    ({"policy": 3, "workspace_limit": "64MiB"}, "policy"),
])
def test_bad_plan_requests_name_the_field(http, tid, body, field):
    if field != "table_id":
        body = {"table_id": tid, **body}
    assert_refused(http.post("/v1/plans", json=body), 422, field)


def test_a_request_with_both_a_table_id_and_a_table_is_refused(http, tid):
    r = http.post("/v1/plans", json={"table_id": tid, "table": synthetic_table(), "workspace_limit": "1MiB"})
    assert_refused(r, 422, "table_id")


@pytest.mark.parametrize("table_id", ["0" * 24, "ffffffffffffffffffffffff"])
def test_unknown_table_ids_are_404(http, table_id):
    r = http.post("/v1/plans", json={"table_id": table_id, "policy": "wr", "workspace_limit": "64MiB"})
    assert_refused(r, 404, "table_id")


@pytest.mark.parametrize("path, field", [("/v1/plans/0123abcd", "plan_id"), ("/v1/tables/0123abcd", "table_id"),
                                         ("/v1/jobs/0123abcd", "job_id"), ("/v1/kernel-benches/0123abcd", "bench_id")])
def test_unknown_ids_in_paths_are_404(http, path, field):
    assert_refused(http.get(path), 404, field)


@pytest.mark.parametrize("path", ["/v1/plans/not-an-id", "/v1/tables/..%2F..%2Fetc%2Fpasswd", "/v1/plans/" + "a" * 65])
def test_malformed_ids_are_422(http, path):
    assert http.get(path).status_code in (404, 422)


@pytest.mark.parametrize("raw", [b"{", b"[1, 2", b"\xff\xfe", b'{"table_id": NaN}', b'{"policy": Infinity}',
                                 b"null", b"[]", b'"wr"', b"42", b'{"policy": "\xc3\x28"}', b"[" * 100_000])
def test_malformed_json_is_422(http, raw):
    r = http.post("/v1/plans", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["detail"]


@pytest.mark.parametrize("path, value, field", [
    ("kernels.0.measurements.0.time_ms", -1.0, "kernels[0].measurements[0].time_ms"),
    ("kernels.0.measurements.0.time_ms", 0, "kernels[0].measurements[0].time_ms"),
    ("kernels.0.measurements.0.workspace_bytes", -4096, "kernels[0].measurements[0].workspace_bytes"),
    ("kernels.0.measurements.0.workspace_bytes", 1.5, "kernels[0].measurements[0].workspace_bytes"),
    ("kernels.0.measurements.0.micro_batch", 0, "kernels[0].measurements[0].micro_batch"),
    ("kernels.0.measurements.0.micro_batch", 33, "kernels[0].measurements[0].micro_batch"),
    ("kernels.0.problem.n", 0, "kernels[0].problem.n"),
    ("kernels.0.problem.c", 10**30, "kernels[0].problem.c"),
    ("kernels.0.op", "sideways", "kernels[0].op"),
    ("cudnn_version", 10**30, "cudnn_version"),
    ("cudnn_version", "9.1", "cudnn_version"),
    ("device", "", "device"),
    ("format", "ucudnn-benchmark-table/0", "format"),
    ("kernels", [], "kernels"),
])
def test_bad_tables_are_refused_naming_the_field(http, path, value, field):
    assert_refused(http.post("/v1/tables", json=_table_with(path, value)), 422, field)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_tables_with_non_finite_numbers_are_refused(http, constant):
    before = _stored(http)
    doc = json.dumps(synthetic_table(seed=7))
    for text in (re.sub(r'"time_ms": [0-9.]+', f'"time_ms": {constant}', doc, count=1),
                 doc.replace('"format"', f'"benchmark_seconds": {constant}, "format"', 1)):
        assert text != doc
        r = http.post("/v1/tables", content=text, headers={"content-type": "application/json"})
        assert r.status_code == 422, r.text
        assert constant.lstrip("-") in r.json()["detail"]
    assert _stored(http) == before  # nothing stored


def test_duplicate_kernel_names_are_refused(http):
    doc = synthetic_table()
    doc["kernels"][1]["name"] = doc["kernels"][0]["name"]
    assert_refused(http.post("/v1/tables", json=doc), 422, "kernels[1].name")


def test_inline_tables_are_validated_like_stored_ones(http):
    bad = _table_with("kernels.0.measurements.0.time_ms", -1.0)
    r = http.post("/v1/plans", json={"table": bad, "workspace_limit": "1MiB"})
    assert_refused(r, 422, "kernels[0].measurements[0].time_ms")


@pytest.mark.parametrize("params, field", [({"cudnn_version": "nine"}, "cudnn_version"),
                                           ({"cudnn_version": -1}, "cudnn_version"),
                                           ({"cudnn_version": 10**30}, "cudnn_version"),
                                           ({"device": "x" * 1000}, "device")])
def test_bad_table_queries_name_the_parameter(http, params, field):
    assert_refused(http.get("/v1/tables", params=params), 422, field)


def test_bodies_over_the_limit_are_413(tmp_path):
    from ucudnn.server.app import create_app

    with ServerThread(create_app(f"sqlite:///{tmp_path / 's.sqlite'}", api_token=None, max_body_bytes=64 << 10)) as srv:
        _assert_413(srv)


def _assert_413(srv):
    import httpx

    big = synthetic_table(kernels=200)
    r = httpx.post(f"{srv.url}/v1/tables", json=big)
    assert_refused(r, 413, "(body)")

    def chunks():  # no Content-Length: the limit must hold while reading
        data = json.dumps(big).encode()
        for i in range(0, len(data), 8192):
            yield data[i:i + 8192]

    r = httpx.post(f"{srv.url}/v1/tables", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert httpx.get(f"{srv.url}/v1/tables").json() == []


def test_a_missing_planner_is_a_clean_error_not_a_500(http, tid, monkeypatch):
    import ucudnn.planning

    monkeypatch.setitem(sys.modules, "ucudnn.planning.wd", None)  # "from . import wd" now raises ImportError
    monkeypatch.delattr(ucudnn.planning, "wd", raising=False)
    r = http.post("/v1/plans", json={"table_id": tid, "policy": "wd", "total_workspace": "64MiB"})
    assert_refused(r, 422, "policy")
    assert "not available" in r.json()["detail"]


def test_a_failing_planner_is_a_clean_error_not_a_500(http, tid, monkeypatch):
    import ucudnn.server.planning as planning

    def broken(*a, **k):
        raise ZeroDivisionError("simulated planner bug")

    monkeypatch.setattr(planning, "make_plan", broken)
    r = http.post("/v1/plans", json={"table_id": tid, "policy": "wr", "workspace_limit": "64MiB"})
    assert_refused(r, 422, "policy")
    assert "simulated planner bug" in r.json()["detail"]


@pytest.mark.parametrize("problem, field", [
    ({"n": 0, "c": 3, "h": 8, "w": 8, "k": 4, "r": 3, "s": 3}, "problems[0].n"),
    ({"n": 8, "c": 3, "h": 2, "w": 2, "k": 4, "r": 3, "s": 3}, "problems[0]"),
    ({"n": 8, "c": 3, "h": 8, "w": 8, "k": 4, "r": 3, "s": 3, "pad": -1}, "problems[0].pad"),
    ({"n": 8, "c": 3, "h": 8, "w": 8, "k": 4, "r": 3, "s": 3, "dtype": "int8"}, "problems[0].dtype"),
    ({"n": "8", "c": 3, "h": 8, "w": 8, "k": 4, "r": 3, "s": 3}, "problems[0].n"),
    ({"c": 3, "h": 8, "w": 8, "k": 4, "r": 3, "s": 3}, "problems[0].n"),
])
def test_bad_benchmark_jobs_name_the_field_before_the_gpu_check(http, problem, field):
    assert_refused(http.post("/v1/jobs", json={"problems": [problem]}), 422, field)


def test_no_endpoint_takes_a_file_path(http):
    """Tables come as bodies, networks are not loadable by name or path: nothing reads user-given paths."""
    schema = http.get("/openapi.json").json()
    for path, ops in schema["paths"].items():
        for op in ops.values():
            for param in op.get("parameters", []):
                assert "path" not in param["name"].lower() and "file" not in param["name"].lower(), (path, param)
    r = http.post("/v1/plans", json={"table": "/etc/passwd", "workspace_limit": "1MiB"})
    assert r.status_code == 422
