"""Many clients at once: nothing lost, nothing duplicated, identical plan requests solved once."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from server_kit import WEB, make_server, server, store_url, synthetic_table  # noqa: F401 (fixtures)

from ucudnn.catalog.store import Store
from ucudnn.planning.table import BenchmarkTable

WRITERS = 16


def test_many_writers_lose_nothing_and_duplicate_nothing(server, store_url):
    docs = [synthetic_table(seed=i, device=f"GPU {i % 3}") for i in range(24)]
    # every writer sends an overlapping slice, so each table arrives several times at once
    jobs = [docs[(w * 3) % 24:] + docs[:(w * 3) % 24] for w in range(WRITERS)]

    def write(batch):
        with httpx.Client(base_url=server.url, timeout=60) as c:
            return [c.post("/v1/tables", json=d) for d in batch[:12]]

    with ThreadPoolExecutor(WRITERS) as pool:
        answers = [r for rs in pool.map(write, jobs) for r in rs]
    assert all(r.status_code == 201 for r in answers)
    sent = {BenchmarkTable.from_dict(d).content_id() for batch in jobs for d in batch[:12]}
    assert {r.json()["id"] for r in answers} == sent
    stored = [t["id"] for t in Store(store_url).list_tables()]
    assert sorted(stored) == sorted(sent)  # each exactly once


def test_concurrent_plan_requests_for_many_keys_store_each_plan_once(server, store_url):
    tid = WEB.post(f"{server.url}/v1/tables", json=synthetic_table()).json()["id"]
    limits = [f"{m}MiB" for m in (1, 2, 4, 8, 16, 32, 64, 128)]

    def ask(i):
        return WEB.post(f"{server.url}/v1/plans", json={"table_id": tid, "workspace_limit": limits[i % 8]},
                          timeout=60)

    with ThreadPoolExecutor(WRITERS) as pool:
        answers = list(pool.map(ask, range(64)))
    assert all(r.status_code == 200 for r in answers)
    assert len({r.json()["id"] for r in answers}) == len(limits)
    assert len(Store(store_url).list_plans()) == len(limits)


def test_identical_concurrent_requests_compute_once(server, monkeypatch):
    import ucudnn.server.planning as planning

    calls = []
    real = planning.make_plan

    def slow_counting_plan(*a, **k):
        calls.append(threading.get_ident())
        time.sleep(0.5)  # hold the solve open while the other requests arrive
        return real(*a, **k)

    monkeypatch.setattr(planning, "make_plan", slow_counting_plan)
    tid = WEB.post(f"{server.url}/v1/tables", json=synthetic_table()).json()["id"]
    body = {"table_id": tid, "policy": "wr", "workspace_limit": "8MiB"}
    barrier = threading.Barrier(20)

    def ask(_):
        barrier.wait(10)
        return WEB.post(f"{server.url}/v1/plans", json=body, timeout=60)

    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(ask, range(20)))
    assert all(r.status_code == 200 for r in answers)
    assert len({r.content for r in answers}) == 1
    assert len(calls) == 1
