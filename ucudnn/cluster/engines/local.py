"""The ``local`` engine: one worker process per local GPU (the seed's single-node mode), no Ray needed.

Each worker is a single-process pool started with ``spawn`` and pinned to
its GPU through ``CUDA_VISIBLE_DEVICES`` before CUDA is initialised, so it
sees exactly one device and runs one unit at a time on it.  The GPUs are
those of ``UCUDNN_BENCHMARK_DEVICES`` (``0,1`` or ``all``), else every
visible GPU, at most ``workers`` of them.  A source that needs no GPU (the
replay source) gets ``workers`` processes (default 1).

The driver never touches CUDA itself (it only counts devices), so workers
are spawned from a clean process.
"""
from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Iterator, Sequence

from ... import config
from .base import PlanTask, Target, Unit, UnitResult, Worker, plan_task
from .sources import UnitSource

INLINE_PLAN_REQUESTS = 24  # fewer plans than this are made in the driver: a process pool costs ~1 s to start

_source: UnitSource | None = None
_name = ""


def _init_worker(visible: str | None, source: UnitSource, name: str) -> None:
    global _source, _name
    if visible is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible
    _source, _name = source, name


def _probe() -> list[Target]:
    assert _source is not None
    return _source.probe()


def _measure(unit: Unit) -> UnitResult:
    assert _source is not None
    t0 = time.perf_counter()
    try:
        kb = _source.measure(unit)
        return UnitResult(unit.id, kb, None, time.perf_counter() - t0, _name)
    except Exception as e:  # noqa: BLE001 - every failure is a reportable reason, never a crash of the job
        return UnitResult(unit.id, None, f"{type(e).__name__}: {e}", time.perf_counter() - t0, _name)


def local_gpu_ids(workers: int | None = None) -> list[int]:
    """``UCUDNN_BENCHMARK_DEVICES`` or every visible GPU, at most ``workers``; GpuUnavailable without any."""
    from ...binding.gpu import cupy

    count = cupy().cuda.runtime.getDeviceCount()
    ids = config.benchmark_devices(count) or list(range(count))
    return ids[:workers] if workers else ids


class LocalEngine:
    name = "local"
    plan_concurrency = 1  # one table at a time: plan() already spreads a table's tasks over a process pool

    def __init__(self, workers: int | None = None, gpu_models: Sequence[str] | None = None):
        self.max_workers = workers
        self.gpu_models = {g.lower() for g in gpu_models} if gpu_models else None
        self._ctx = multiprocessing.get_context("spawn")
        self._source: UnitSource | None = None
        self._workers: list[Worker] = []
        self._plan_pool: ProcessPoolExecutor | None = None

    # -- workers ---------------------------------------------------------------------------
    def _pool(self, visible: str | None, name: str) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(1, mp_context=self._ctx, initializer=_init_worker,
                                   initargs=(visible, self._source, name))

    def start(self, source: UnitSource) -> list[Worker]:
        self._source = source
        if source.needs_gpu:
            parent = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
            slots = [(parent[i] if i < len(parent) else str(i), f"local:gpu{i}") for i in local_gpu_ids(self.max_workers)]
        else:
            slots = [(None, f"local:{i}") for i in range(self.max_workers or 1)]
        pools = [(self._pool(visible, name), visible, name) for visible, name in slots]
        probes = [(pool, visible, name, pool.submit(_probe)) for pool, visible, name in pools]
        for pool, visible, name, fut in probes:
            targets = fut.result()
            if self.gpu_models is not None:
                targets = [t for t in targets if t.accelerator_type.lower() in self.gpu_models
                           or t.device.lower() in self.gpu_models]
            if not targets:
                pool.shutdown(wait=False, cancel_futures=True)
                continue
            self._workers.append(Worker(name, targets, (pool, visible)))
        return list(self._workers)

    def submit(self, worker: Worker, unit: Unit) -> Future:
        pool, _ = worker.handle
        return pool.submit(_measure, unit)

    def restart(self, worker: Worker) -> bool:
        pool, visible = worker.handle
        pool.shutdown(wait=False, cancel_futures=True)
        try:
            new = self._pool(visible, worker.name)
            new.submit(_probe).result()
        except (BrokenProcessPool, OSError):
            return False
        worker.handle = (new, visible)
        return True

    # -- planning ----------------------------------------------------------------------------
    def plan(self, tasks: Sequence[PlanTask]) -> Iterator[tuple[PlanTask, list[dict[str, Any]]]]:
        if sum(len(t.requests) for t in tasks) < INLINE_PLAN_REQUESTS or (os.cpu_count() or 1) < 2:
            for t in tasks:
                yield t, plan_task(t)
            return
        if self._plan_pool is None:
            self._plan_pool = ProcessPoolExecutor(min(os.cpu_count() or 1, len(tasks)), mp_context=self._ctx)
        futures = {self._plan_pool.submit(plan_task, t): t for t in tasks}
        for fut in as_completed(futures):
            yield futures[fut], fut.result()

    def release(self) -> None:
        for w in self._workers:
            w.handle[0].shutdown(wait=True, cancel_futures=True)
        self._workers.clear()

    def close(self) -> None:
        self.release()
        if self._plan_pool is not None:
            self._plan_pool.shutdown(wait=True, cancel_futures=True)
            self._plan_pool = None
