"""The plan service's application factory: ``create_app(store_url)`` -> a FastAPI app.

``ucudnn serve`` runs it under uvicorn; tests run it the same way on
loopback.  Everything the app needs hangs off ``app.state.ucudnn``
(:class:`~ucudnn.server.deps.ServiceState`), so several apps with different
stores can live in one process.

Errors: ucudnn's own exceptions are mapped to HTTP in one handler
(:func:`ucudnn_error`): bad input 422 (404 for unknown ids), an infeasible
budget 409 with the smallest budget that works, no GPU 503.  Every error
body is ``{"detail": ..., "field": ...}`` so clients can point at the field.
"""
from __future__ import annotations

import logging
import os
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ucudnn import __version__
from ucudnn.catalog.store import Store
from ucudnn.errors import CudnnError, CudnnNotFound, GpuUnavailable, InfeasibleError, InputError, UcudnnError
from ucudnn.units import format_size

from .deps import ServiceState
from .jobs import Benchmark, JobRunner
from .limits import DEFAULT_MAX_BODY_BYTES, BodyLimitMiddleware
from .metrics import Metrics, MetricsMiddleware
from .planning import PlanService, UnknownId
from .routers import jobs, kernels, ops, plans, tables

log = logging.getLogger("ucudnn.server")
_UNSET: Any = object()


def default_store_url() -> str:
    """SQLite in the user data directory (plans are data worth keeping, unlike the library's cache)."""
    import platformdirs

    path = Path(platformdirs.user_data_dir("ucudnn")) / "plans.sqlite"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def create_app(store_url: str | None = None, *, api_token: str | None = _UNSET, open_plans: bool = False,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, plan_cache_size: int = 4096, solver_threads: int = 2,
               benchmark: Benchmark | None = None, gpu_reason: Callable[[], str | None] | None = None) -> FastAPI:
    """The plan service over the store at ``store_url`` (a SQLAlchemy URL or a SQLite path).

    ``api_token`` defaults to ``UCUDNN_API_TOKEN`` (unset or empty: no auth).
    ``benchmark``/``gpu_reason`` replace ``ucudnn.measure.benchmark`` and the GPU
    check (tests exercise jobs on CPU hosts with them).
    """
    if api_token is _UNSET:
        api_token = os.environ.get("UCUDNN_API_TOKEN") or None
    store = Store(store_url or default_store_url())
    if store.engine.dialect.name == "sqlite":
        # one server owns a SQLite store: jobs it had running died with its previous process
        store.fail_unfinished_jobs("the server restarted before the job finished")
    metrics = Metrics()
    state = ServiceState(store=store, plans=PlanService(store, metrics, plan_cache_size, solver_threads),
                         jobs=JobRunner(store, metrics, benchmark, gpu_reason), metrics=metrics,
                         api_token=api_token or None, open_plans=open_plans)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        state.plans.pool.shutdown(wait=False, cancel_futures=True)
        state.jobs.pool.shutdown(wait=False, cancel_futures=True)
        store.engine.dispose()

    app = FastAPI(title="ucudnn plan service", version=__version__, lifespan=lifespan,
                  description="Micro-batching plans for cuDNN convolutions under workspace limits, computed from "
                              "benchmark tables (ucudnn-benchmark-table/1) and kept in a shared store. Writes need "
                              "`Authorization: Bearer <token>` when the server has UCUDNN_API_TOKEN set.")
    app.state.ucudnn = state
    for r in (tables.router, plans.router, jobs.router, kernels.router, ops.router):
        app.include_router(r)
    app.add_exception_handler(UcudnnError, ucudnn_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    return app


def status_of(exc: UcudnnError) -> int:
    if isinstance(exc, UnknownId):
        return 404
    if isinstance(exc, InfeasibleError):
        return 409
    if isinstance(exc, InputError):
        return 422
    if isinstance(exc, (GpuUnavailable, CudnnNotFound, CudnnError)):
        return 503
    return 422  # any other deliberate refusal is about the request


async def ucudnn_error(_request: Request, exc: Exception) -> JSONResponse:
    """The one place ucudnn.errors become HTTP answers."""
    assert isinstance(exc, UcudnnError)
    status = status_of(exc)
    body: dict[str, Any] = {"detail": str(exc), "field": getattr(exc, "field", None)}
    if isinstance(exc, InfeasibleError):
        body["min_workspace"] = exc.min_workspace
        body["min_workspace_human"] = format_size(exc.min_workspace) if exc.min_workspace is not None else None
    return JSONResponse(body, status_code=status)


async def validation_error(_request: Request, exc: Exception) -> JSONResponse:
    """Pydantic's errors, with the first one's location as a dotted ``field`` and in ``detail``."""
    assert isinstance(exc, RequestValidationError)
    errs = [{"field": _dotted(e.get("loc", ())), "message": str(e.get("msg", "")), "type": str(e.get("type", ""))}
            for e in exc.errors()]
    first = errs[0] if errs else {"field": None, "message": "invalid request"}
    detail = f"{first['field']}: {first['message']}" if first["field"] else first["message"]
    if first.get("type") == "json_invalid":
        ctx = (exc.errors()[0].get("ctx") or {}).get("error")
        detail = f"request body is not valid JSON: {ctx}" if ctx else "request body is not valid JSON"
        first["field"] = "(body)"
    return JSONResponse({"detail": detail, "field": first["field"], "errors": errs}, status_code=422)


async def http_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    field = {401: "Authorization", 413: "(body)"}.get(exc.status_code)
    return JSONResponse({"detail": str(exc.detail), "field": field}, status_code=exc.status_code,
                        headers=getattr(exc, "headers", None))


def _dotted(loc: Any) -> str | None:
    """("body", "problems", 0, "n") -> "problems[0].n" (the top-level 'body'/'query'/'path' dropped)."""
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += f".{p}" if out else str(p)
    return out or None
