"""Prometheus metrics of the plan service: requests, latencies, plan cache hits, solve times.

Each app gets its own registry (several apps live in one test process, and a
global registry would refuse the second one).  The HTTP metrics come from a
pure ASGI middleware (no per-request task or body copy) labelled by the
*route template* (``/v1/plans/{plan_id}``), never the raw path, so unknown
URLs cannot blow up the label space.
"""
from __future__ import annotations

import time

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
SOLVE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("ucudnn_http_requests", "HTTP requests answered", ["method", "route", "status"],
                                registry=r)
        self.latency = Histogram("ucudnn_http_request_duration_seconds", "time from request to the last byte sent",
                                 ["method", "route"], buckets=LATENCY_BUCKETS, registry=r)
        self.plan_hits = Counter("ucudnn_plan_cache_hits", "plan requests answered without solving, by where the "
                                 "plan was found (memory, store, inflight: joined an identical running solve)",
                                 ["layer"], registry=r)
        self.plan_misses = Counter("ucudnn_plan_cache_misses", "plan requests that ran a planner", ["policy"],
                                   registry=r)
        self.solve_seconds = Histogram("ucudnn_plan_solve_seconds", "planner wall time", ["policy"],
                                       buckets=SOLVE_BUCKETS, registry=r)
        self.jobs = Counter("ucudnn_jobs", "benchmark jobs by final status", ["status"], registry=r)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class MetricsMiddleware:
    """Counts and times every HTTP request by method, route template and status."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "(unmatched)"
            method = scope.get("method", "")
            self.metrics.requests.labels(method, path, str(status)).inc()
            self.metrics.latency.labels(method, path).observe(time.perf_counter() - start)
