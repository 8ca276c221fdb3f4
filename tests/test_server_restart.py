"""``ucudnn serve`` as users run it: a subprocess on loopback; plans survive stopping and starting it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
import pytest
from server_kit import WEB, free_port, store_url, synthetic_table, wait_until  # noqa: F401 (fixture)


def _serve(store: str, port: int, env: dict[str, str]) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "ucudnn", "serve", "--host", "127.0.0.1", "--port", str(port),
                             "--store", store, "--log-level", "warning"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def up() -> bool:
        if proc.poll() is not None:
            return True
        try:
            return WEB.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, timeout=30, interval=0.1)
    if proc.poll() is not None:
        pytest.fail(f"ucudnn serve exited {proc.returncode}: {proc.stdout.read().decode()}")
    return proc


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def test_plans_survive_a_server_restart(store_url, monkeypatch):
    env = {k: v for k, v in os.environ.items() if k != "UCUDNN_API_TOKEN"}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _serve(store_url, port, env)
    try:
        tid = WEB.post(f"{url}/v1/tables", json=synthetic_table()).json()["id"]
        wr = WEB.post(f"{url}/v1/plans", json={"table_id": tid, "policy": "wr", "workspace_limit": "16MiB"}).json()
        wd = WEB.post(f"{url}/v1/plans", json={"table_id": tid, "policy": "wd", "total_workspace": "64MiB"}).json()
    finally:
        _stop(proc)
    assert proc.returncode in (0, -signal.SIGTERM)  # uvicorn re-raises SIGTERM after a graceful shutdown
    proc = _serve(store_url, port, env)
    try:
        assert WEB.get(f"{url}/v1/plans/{wr['id']}").json() == wr
        assert WEB.get(f"{url}/v1/plans/{wd['id']}").json() == wd
        assert [t["id"] for t in WEB.get(f"{url}/v1/tables").json()] == [tid]
        again = WEB.post(f"{url}/v1/plans", json={"table_id": tid, "policy": "wr", "workspace_limit": "16MiB"})
        assert again.json() == wr
        metrics = WEB.get(f"{url}/metrics").text
        assert 'ucudnn_plan_cache_hits_total{layer="store"} 2.0' in metrics  # the two GETs
        assert "ucudnn_plan_cache_misses_total{" not in metrics  # nothing solved after the restart
    finally:
        _stop(proc)


def test_serve_without_store_uses_sqlite_in_the_user_data_dir(monkeypatch, tmp_path):
    from ucudnn.server.app import default_store_url

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    url = default_store_url()
    assert url.startswith("sqlite:///") and url.startswith(f"sqlite:///{tmp_path}")
    from ucudnn.catalog.store import Store

    with Store(url).engine.connect() as c:
        assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
