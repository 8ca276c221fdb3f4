"""A small typed client of the plan service (httpx), shaped like the service's resources.

    with PlanClient("http://127.0.0.1:8787", token=None) as c:
        tid = c.put_table(BenchmarkTable.load("resnet50.json"))
        plan = c.plan(tid, "wr", workspace_limit="64MiB")
        c.tables(device="NVIDIA H100 80GB HBM3", cudnn_version=91900)

Errors come back as ucudnn's own exceptions so callers handle a remote refusal
exactly like a local one: 422 -> :class:`InputError` (with ``field``), 409 ->
:class:`InfeasibleError` (with ``min_workspace``), 503 -> :class:`GpuUnavailable`;
anything else, and an unreachable server, -> :class:`ServiceError`.
``token`` defaults to ``UCUDNN_API_TOKEN``: the same variable the server reads.

The library's kernel cache consults a server through :func:`from_env`
(``UCUDNN_PLAN_SERVER``): :meth:`PlanClient.get_kernel_bench` /
:meth:`PlanClient.put_kernel_bench` mirror :class:`ucudnn.catalog.store.Store`'s, keyed
by the same cache key, so measurements made on one node serve every node.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Iterable

import httpx

from .. import config
from ..errors import GpuUnavailable, InfeasibleError, InputError, UcudnnError
from ..planning.plan import Plan
from ..planning.table import BenchmarkTable, KernelBench
from ..problem import ConvProblem
from .store import key_id

log = logging.getLogger("ucudnn.client")


class ServiceError(UcudnnError):
    """The plan service answered an error other than bad input / infeasible / no GPU, or could not be reached."""

    def __init__(self, message: str, status_code: int | None = None, field: str | None = None):
        self.status_code = status_code
        self.field = field
        super().__init__(message)


class PlanClient:
    """One connection pool to one plan service; thread-safe, reuse it."""

    def __init__(self, base_url: str, token: str | None = None, *, timeout: float = 60.0,
                 transport: httpx.BaseTransport | None = None):
        token = token if token is not None else (os.environ.get("UCUDNN_API_TOKEN") or None)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout, transport=transport)

    # -- tables ----------------------------------------------------------------------
    def put_table(self, table: BenchmarkTable | dict[str, Any]) -> str:
        """Store ``table``; returns its id (a content hash: storing it again returns the same id)."""
        doc = table.to_dict() if isinstance(table, BenchmarkTable) else table
        return str(self._request("POST", "/v1/tables", json=doc)["id"])

    def get_table(self, table_id: str) -> BenchmarkTable:
        return BenchmarkTable.from_dict(self._request("GET", f"/v1/tables/{table_id}"))

    def tables(self, device: str | None = None, cudnn_version: int | None = None) -> list[dict[str, Any]]:
        """Summaries (id, device, cudnn_version, numerics, kernels, created_at) of the stored tables."""
        params = {k: v for k, v in {"device": device, "cudnn_version": cudnn_version}.items() if v is not None}
        return list(self._request("GET", "/v1/tables", params=params))

    # -- plans -----------------------------------------------------------------------
    def plan(self, table: str | BenchmarkTable | dict[str, Any], policy: str = "wr", *,
             workspace_limit: int | str | None = None, total_workspace: int | str | None = None,
             batch_policy: str = "powerOfTwo") -> Plan:
        """Plan a stored table (its id) or an inline one; see :meth:`plan_with_id` for the plan's id."""
        return self.plan_with_id(table, policy, workspace_limit=workspace_limit, total_workspace=total_workspace,
                                 batch_policy=batch_policy)[1]

    def plan_with_id(self, table: str | BenchmarkTable | dict[str, Any], policy: str = "wr", *,
                     workspace_limit: int | str | None = None, total_workspace: int | str | None = None,
                     batch_policy: str = "powerOfTwo") -> tuple[str, Plan]:
        body: dict[str, Any] = {"policy": policy, "batch_policy": batch_policy}
        if isinstance(table, str):
            body["table_id"] = table
        else:
            body["table"] = table.to_dict() if isinstance(table, BenchmarkTable) else table
        if workspace_limit is not None:
            body["workspace_limit"] = workspace_limit
        if total_workspace is not None:
            body["total_workspace"] = total_workspace
        doc = self._request("POST", "/v1/plans", json=body)
        return str(doc["id"]), Plan.from_dict(doc)

    def get_plan(self, plan_id: str) -> Plan:
        return Plan.from_dict(self._request("GET", f"/v1/plans/{plan_id}"))

    # -- benchmark jobs (servers with a GPU) -------------------------------------------
    def submit_job(self, problems: Iterable[ConvProblem | dict[str, Any]], ops: Iterable[str] | None = None,
                   batch_policy: str = "powerOfTwo", numerics: str | None = None) -> str:
        """Queue a benchmark on the server's GPU; returns the job id (GpuUnavailable where it has none)."""
        probs = [p.to_dict() if isinstance(p, ConvProblem) else dict(p) for p in problems]
        body: dict[str, Any] = {"problems": probs, "batch_policy": batch_policy, "numerics": numerics}
        if ops is not None:
            body["ops"] = list(ops)
        return str(self._request("POST", "/v1/jobs", json=body)["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        """Status: ``status`` (queued/running/done/failed), ``progress`` 0..1, ``table_id`` once done."""
        return dict(self._request("GET", f"/v1/jobs/{job_id}"))

    def wait_job(self, job_id: str, timeout: float = 3600.0, poll: float = 1.0) -> dict[str, Any]:
        """Poll until the job is done or failed, at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.job(job_id)
            if status["status"] in ("done", "failed"):
                return status
            if time.monotonic() >= deadline:
                raise ServiceError(f"job {job_id} still {status['status']} after {timeout:.0f} s")
            time.sleep(poll)

    # -- the library's kernel cache ------------------------------------------------------
    def get_kernel_bench(self, key: dict[str, Any]) -> KernelBench | None:
        """Measurements another node shared under this cache key (``ucudnn.api``'s), or None."""
        try:
            d = self._request("GET", f"/v1/kernel-benches/{key_id(key)}")
        except ServiceError as e:
            if e.status_code == 404:
                return None
            raise
        return KernelBench.from_dict(d)

    def put_kernel_bench(self, key: dict[str, Any], kb: KernelBench) -> str:
        """Share measurements under the library's cache key; returns the key's id."""
        return str(self._request("POST", "/v1/kernel-benches", json={"key": key, "bench": kb.to_dict()})["id"])

    def health(self) -> dict[str, Any]:
        return dict(self._request("GET", "/healthz"))

    # -- plumbing ----------------------------------------------------------------------
    def _request(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = self._http.request(method, path, **kw)
        except httpx.HTTPError as e:
            raise ServiceError(f"cannot reach the plan service at {self.base_url}: {e}") from None
        if r.is_success:
            return r.json()
        try:
            body = r.json()
        except ValueError:
            body = {"detail": r.text[:500]}
        detail = str(body.get("detail", r.reason_phrase)) if isinstance(body, dict) else str(body)
        field = body.get("field") if isinstance(body, dict) else None
        message = detail.removeprefix(f"{field}: ") if field else detail
        if r.status_code == 422 or r.status_code == 400:
            raise InputError(message, field)
        if r.status_code == 409:
            raise InfeasibleError(detail, body.get("min_workspace"))
        if r.status_code == 503:
            raise GpuUnavailable(detail)
        raise ServiceError(f"{method} {path}: {r.status_code} {detail}", r.status_code, field)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "PlanClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def from_env(timeout: float = 10.0) -> PlanClient | None:
    """A client of ``UCUDNN_PLAN_SERVER``, or None when it is unset."""
    url = config.plan_server()
    return PlanClient(url, timeout=timeout) if url else None
