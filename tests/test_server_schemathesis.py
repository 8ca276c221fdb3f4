"""A bounded, deterministic schemathesis run against the service's own OpenAPI document.

Every operation gets a few generated requests (valid and invalid); the real
server must never answer 5xx, and its answers must match what the document
promises (status codes, content types, response schemas).  Bounded:
``max_examples`` per operation, ``derandomize`` for the same cases every run.
"""
from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from server_kit import ServerThread, synthetic_table

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def live_server(tmp_path_factory):
    from ucudnn.server.app import create_app

    url = f"sqlite:///{tmp_path_factory.mktemp('schemathesis') / 'service.sqlite'}"
    with ServerThread(create_app(url, api_token=None, gpu_reason=lambda: "no GPU in the test process")) as srv:
        tid = httpx.post(f"{srv.url}/v1/tables", json=synthetic_table()).json()["id"]
        httpx.post(f"{srv.url}/v1/plans", json={"table_id": tid, "workspace_limit": "8MiB"})
        yield srv


def _openapi_document() -> dict:
    """The document the server serves at /openapi.json (built here so cases are known at collection time)."""
    from ucudnn.server.app import create_app

    return create_app("sqlite://", api_token=None).openapi()


schema = schemathesis.openapi.from_dict(_openapi_document())


@schema.parametrize()
@settings(max_examples=12, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
def test_the_api_keeps_the_promises_of_its_openapi_document(case, live_server):
    case.call_and_validate(base_url=live_server.url, checks=CHECKS, timeout=30)


def test_the_served_document_is_the_one_tested(live_server):
    assert httpx.get(f"{live_server.url}/openapi.json").json() == _openapi_document()
