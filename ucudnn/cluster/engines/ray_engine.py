"""The ``ray`` engine: units over every GPU of a Ray cluster, planning as CPU tasks (``cluster`` extra).

Workers are Ray actors holding ``num_gpus=1`` for their whole life, placed
by the accelerator-type resource Ray gives each GPU node
(``accelerator_type:H100``), one actor per GPU of each model.  Units are
actor calls, dispatched one at a time to whichever actor is free
(:func:`ucudnn.cluster.engines.dispatch`).

Why actors rather than a task per unit: Ray starts a fresh worker process
for every ``num_gpus`` task by default (``max_calls=1`` for GPU tasks), which
would re-import CuPy and re-create the CUDA context and cuDNN handle, seconds
per unit against units of a fraction of a second to a few seconds; and a
reused task worker may be handed a different GPU than the CUDA context it
already made.  An actor keeps one GPU and one context; each call is a
named Ray task (visible in the dashboard's task list as it runs), never two
at a time on one GPU.

``address`` joins an existing cluster (``ray://`` or ``host:port`` or
``auto``); with none, a Ray instance is started on this machine (its CPUs,
and its GPUs if it has any) and shut down at the end.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from concurrent.futures import Future
from typing import Any, Iterator, Sequence

from ...errors import GpuUnavailable, InputError
from .base import PlanTask, Target, Unit, UnitResult, Worker, plan_task
from .sources import UnitSource

log = logging.getLogger("ucudnn.precompute")
PROBE_TIMEOUT_S = 600.0  # an autoscaling cluster may take minutes to bring a GPU node up


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise InputError("needs Ray: pip install 'ucudnn[cluster]' (or use --engine local)", "--engine") from None
    return ray


class _UnitWorker:
    """The actor body: one source on one GPU (or CPU, for replay)."""

    def __init__(self, source: UnitSource, name: str):
        self.source = source
        self.name = name

    def probe(self) -> list[Target]:
        return self.source.probe()

    def measure(self, unit: Unit) -> UnitResult:
        t0 = time.perf_counter()
        try:
            kb = self.source.measure(unit)
            return UnitResult(unit.id, kb, None, time.perf_counter() - t0, self.name)
        except Exception as e:  # noqa: BLE001 - reported as the unit's reason, retried by the driver
            return UnitResult(unit.id, None, f"{type(e).__name__}: {e}", time.perf_counter() - t0, self.name)


def gpus_by_type(nodes: list[dict[str, Any]]) -> Counter:
    """GPUs of the live nodes per accelerator type (None: GPUs Ray could not name)."""
    counts: Counter = Counter()
    for node in nodes:
        if not node.get("Alive", True):
            continue
        res = node.get("Resources", {})
        gpus = int(res.get("GPU", 0))
        if gpus:
            types = [k.split(":", 1)[1] for k in res if k.startswith("accelerator_type:")]
            counts[types[0] if types else None] += gpus
    return counts


class RayEngine:
    name = "ray"
    plan_concurrency = 8  # tables whose plan tasks may be submitted at once: Ray queues them on its CPUs

    def __init__(self, address: str | None = None, workers: int | None = None,
                 gpu_models: Sequence[str] | None = None):
        self.address = address
        self.max_workers = workers
        self.gpu_models = {g.lower() for g in gpu_models} if gpu_models else None
        self.ray = _ray()
        self._owned = False
        self._actor_cls: Any = None
        self._source: UnitSource | None = None
        self._workers: list[Worker] = []
        self.startup_seconds = 0.0

    def _connect(self) -> None:
        ray = self.ray
        if ray.is_initialized():
            return
        kw: dict[str, Any] = dict(log_to_driver=False, logging_level=logging.WARNING)
        if self.address:
            ray.init(address=self.address, **kw)
        else:
            ray.init(include_dashboard=False, **kw)  # a local instance on this machine's CPUs (and GPUs)
        self._owned = True

    def _spawn(self, opts: dict[str, Any], name: str) -> Any:
        return self._actor_cls.options(**opts).remote(self._source, name)

    def start(self, source: UnitSource) -> list[Worker]:
        t0 = time.perf_counter()
        ray = self.ray
        self._connect()
        self._source = source
        self._actor_cls = ray.remote(_UnitWorker)
        plans: list[tuple[dict[str, Any], str]] = []
        if source.needs_gpu:
            counts = gpus_by_type(ray.nodes())
            if not counts:
                raise GpuUnavailable("the Ray cluster has no GPUs (no node advertises a GPU resource)")
            for acc, n in sorted(counts.items(), key=lambda kv: str(kv[0])):
                if self.gpu_models is not None and (acc is None or acc.lower() not in self.gpu_models):
                    continue
                opts: dict[str, Any] = {"num_gpus": 1, "max_restarts": 0}
                if acc is not None:
                    opts["accelerator_type"] = acc
                plans += [(opts, f"ray:{acc or 'gpu'}#{i}") for i in range(n)]
            if not plans:
                raise GpuUnavailable(f"the Ray cluster has no GPUs of the models asked for "
                                     f"({', '.join(sorted(self.gpu_models or []))}); it has "
                                     f"{', '.join(f'{n} x {t}' for t, n in counts.items())}")
        else:
            n = self.max_workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
            plans = [({"num_cpus": 1, "max_restarts": 0}, f"ray:cpu#{i}") for i in range(n)]
        if self.max_workers:
            plans = plans[: self.max_workers]
        actors = [(self._spawn(opts, name), opts, name) for opts, name in plans]
        probes = {a.probe.remote(): (a, opts, name) for a, opts, name in actors}
        ready, pending = ray.wait(list(probes), num_returns=len(probes), timeout=PROBE_TIMEOUT_S)
        for ref in pending:
            a, _, name = probes[ref]
            log.warning("ucudnn precompute: worker %s did not start within %.0f s; left out", name, PROBE_TIMEOUT_S)
            ray.kill(a)
        for ref in ready:
            a, opts, name = probes[ref]
            try:
                targets = ray.get(ref)
            except Exception as e:  # noqa: BLE001 - a worker that cannot probe its GPU is left out, with the reason
                log.warning("ucudnn precompute: worker %s failed to start: %s", name, e)
                ray.kill(a)
                continue
            self._workers.append(Worker(name, targets, (a, opts)))
        self._workers.sort(key=lambda w: w.name)
        self.startup_seconds = time.perf_counter() - t0
        return list(self._workers)

    def submit(self, worker: Worker, unit: Unit) -> Future:
        actor, _ = worker.handle
        call = actor.measure.options(name=f"ucudnn {unit.target.accelerator_type} {unit.op} "
                                          f"{unit.problem.describe()}")
        return call.remote(unit).future()

    def restart(self, worker: Worker) -> bool:
        ray = self.ray
        actor, opts = worker.handle
        try:
            ray.kill(actor)
        except Exception:  # noqa: BLE001 - it is already gone
            pass
        new = self._spawn(opts, worker.name)
        probe = new.probe.remote()
        ready, _ = ray.wait([probe], timeout=PROBE_TIMEOUT_S)
        if not ready:
            ray.kill(new)
            return False
        try:
            ray.get(probe)
        except Exception:  # noqa: BLE001
            return False
        worker.handle = (new, opts)
        return True

    def plan(self, tasks: Sequence[PlanTask]) -> Iterator[tuple[PlanTask, list[dict[str, Any]]]]:
        ray = self.ray
        remote = ray.remote(num_cpus=1, max_retries=2)(plan_task)
        refs = {remote.options(name=f"ucudnn plan {t.table_id[:12]} x{len(t.requests)}").remote(t): t
                for t in tasks}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                yield refs[ref], ray.get(ref)

    def release(self) -> None:
        """Kill the unit actors: planning tasks need the CPUs they hold (a replay actor holds one)."""
        ray = self.ray
        for w in self._workers:
            try:
                ray.kill(w.handle[0])
            except Exception:  # noqa: BLE001 - already gone
                pass
        self._workers.clear()

    def close(self) -> None:
        ray = self.ray
        self.release()
        if self._owned and ray.is_initialized():
            ray.shutdown()
            self._owned = False
