"""Shared pieces of the plan-service tests: synthetic tables, stores (SQLite / PostgreSQL), a real server.

The server under test is the real thing: uvicorn serving ``create_app`` on
127.0.0.1 with a free port, in a thread of the test process (so tests can
count planner calls) or, for the restart test, as ``ucudnn serve`` in a
subprocess.  PostgreSQL tests need ``UCUDNN_TEST_POSTGRES_URL`` (``.ci/run``
starts a server and sets it) and skip without it; each test gets a fresh
database, dropped afterwards.
"""
from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from typing import Any, Iterator

import httpx
import pytest

from ucudnn.planning.table import FORMAT

POSTGRES_URL = os.environ.get("UCUDNN_TEST_POSTGRES_URL")
# One shared client: httpx.get/post build a client (and an SSL context) per call, ~50 ms each on a busy 2-core CI.
WEB = httpx.Client(timeout=60)
STORES = ["sqlite", pytest.param("postgres", marks=pytest.mark.skipif(
    not POSTGRES_URL, reason="UCUDNN_TEST_POSTGRES_URL is unset (.ci/run starts PostgreSQL and sets it)"))]


def synthetic_table(n: int = 32, kernels: int = 3, device: str = "Synthetic GPU", cudnn_version: int = 91900,
                    seed: int = 0, big_workspace: bool = False) -> dict[str, Any]:
    """A ucudnn-benchmark-table/1 document shaped like real ones (for functional tests only).

    Per kernel and power-of-two micro-batch b: a slow zero-workspace algorithm and a fast one whose
    workspace grows with b (so micro-batching pays under a limit); with ``big_workspace``, every
    algorithm needs workspace (so small limits are infeasible).
    """
    ks = []
    sizes, b = [], 1
    while b < n:
        sizes.append(b)
        b *= 2
    sizes.append(n)
    for i in range(kernels):
        ms = []
        scale = 1 + 0.1 * ((i + seed) % 5)
        for b in sizes:
            slow_ws = (1 << 20) * b if big_workspace else 0
            ms.append({"micro_batch": b, "algo": 0, "math_type": "FMA", "time_ms": round(0.1 * b * scale, 6),
                       "workspace_bytes": slow_ws})
            ms.append({"micro_batch": b, "algo": 1, "math_type": "FMA", "time_ms": round((0.03 * b + 0.01) * scale, 6),
                       "workspace_bytes": b * (1 << 20) * (i + 2)})
        ks.append({"name": f"conv{i}/forward", "op": "forward",
                   "problem": {"n": n, "c": 64 + 16 * (i % 3), "h": 28, "w": 28, "k": 64, "r": 3, "s": 3, "pad": [1, 1]},
                   "measurements": ms})
    return {"format": FORMAT, "device": device, "cudnn_version": cudnn_version, "kernels": ks}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate, timeout: float = 20.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


class ServerThread:
    """uvicorn serving ``app`` on 127.0.0.1:<free port> in a daemon thread."""

    def __init__(self, app: Any):
        import uvicorn

        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                                    access_log=False, lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True, name="uvicorn-under-test")

    def __enter__(self) -> "ServerThread":
        self.thread.start()
        if not wait_until(lambda: self.server.started or not self.thread.is_alive()):
            raise RuntimeError("uvicorn did not start in 20 s")
        if not self.server.started:
            raise RuntimeError("uvicorn exited while starting")
        sock = self.server.servers[0].sockets[0]
        self.url = "http://127.0.0.1:%d" % sock.getsockname()[1]
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


@pytest.fixture(params=STORES)
def store_url(request, tmp_path) -> Iterator[str]:
    """A fresh, empty store: a SQLite file, or a new PostgreSQL database (dropped afterwards)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'service.sqlite'}"
        return
    yield from _postgres_database()


def _postgres_database() -> Iterator[str]:
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    assert POSTGRES_URL
    admin = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    name = f"ucudnn_test_{uuid.uuid4().hex[:12]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    if not POSTGRES_URL:
        pytest.skip("UCUDNN_TEST_POSTGRES_URL is unset (.ci/run starts PostgreSQL and sets it)")
    yield from _postgres_database()


@pytest.fixture
def make_server(store_url):
    """``make_server(**create_app_kwargs)`` -> a running ServerThread over this test's store."""
    from ucudnn.server.app import create_app

    started: list[ServerThread] = []

    def make(url: str | None = None, **kwargs: Any) -> ServerThread:
        kwargs.setdefault("api_token", None)
        kwargs.setdefault("gpu_reason", lambda: "no GPU in the test process")
        srv = ServerThread(create_app(url or store_url, **kwargs)).__enter__()
        started.append(srv)
        return srv

    yield make
    for srv in reversed(started):
        srv.__exit__(None, None, None)


@pytest.fixture
def server(make_server) -> ServerThread:
    return make_server()


@pytest.fixture
def http(server):
    import httpx

    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c
