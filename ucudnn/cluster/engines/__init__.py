"""Engines that run precompute units on workers: ``local`` (a process per local GPU) or ``ray`` (a cluster).

An engine starts workers, says which targets (GPU model, cuDNN version) each
serves, runs one unit on one worker (:meth:`Engine.submit`, a
``concurrent.futures.Future``) and runs planning on CPUs.  Everything else
(ordering, dynamic dispatch, retries, the failure report) is the shared
:func:`dispatch` loop, so both engines behave the same and tests of one cover
the logic of both.

Each GPU worker holds one whole GPU and runs one unit at a time: two
benchmarks sharing a GPU would both measure the contention.
"""
from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any, Callable, Iterator, Protocol, Sequence

from .base import PlanTask, Target, Unit, UnitError, UnitOutcome, UnitResult, Worker, plan_task
from .sources import GpuSource, ReplaySource, UnitSource

ENGINES = ("local", "ray")

__all__ = ["ENGINES", "Engine", "GpuSource", "PlanTask", "ReplaySource", "Target", "Unit", "UnitError",
           "UnitOutcome", "UnitResult", "UnitSource", "Worker", "dispatch", "make_engine", "plan_task"]


class Engine(Protocol):
    name: str
    plan_concurrency: int  # how many plan() calls may run at once (each from its own thread)

    def start(self, source: UnitSource) -> list[Worker]:
        """Start workers for ``source``; each has probed its targets."""
        ...

    def submit(self, worker: Worker, unit: Unit) -> Future:
        """Measure ``unit`` on ``worker``; the future's result is a :class:`UnitResult`."""
        ...

    def restart(self, worker: Worker) -> bool:
        """Replace a worker that died (lost node, crashed process); False if it cannot be replaced."""
        ...

    def release(self) -> None:
        """Stop the measuring workers (their GPUs and CPUs are free for planning); safe to call twice."""
        ...

    def plan(self, tasks: Sequence[PlanTask]) -> Iterator[tuple[PlanTask, list[dict[str, Any]]]]:
        """Run planning tasks on CPUs; yields each task with its answers as they finish."""
        ...

    def close(self) -> None:
        ...


def make_engine(name: str, *, address: str | None = None, workers: int | None = None,
                gpu_models: Sequence[str] | None = None) -> Engine:
    """``local`` or ``ray`` (which needs the ``cluster`` extra)."""
    from ...errors import InputError

    if name == "local":
        from .local import LocalEngine

        if address:
            raise InputError("joins a Ray cluster; it needs --engine ray", "--address")
        return LocalEngine(workers=workers, gpu_models=gpu_models)
    if name == "ray":
        from .ray_engine import RayEngine

        return RayEngine(address=address, workers=workers, gpu_models=gpu_models)
    raise InputError(f"unknown engine {name!r}; use one of {', '.join(ENGINES)}", "--engine")


def dispatch(engine: Engine, workers: list[Worker], units: Sequence[Unit], *, max_retries: int = 2,
             on_outcome: Callable[[UnitOutcome], None] | None = None) -> list[UnitOutcome]:
    """Run ``units`` on ``workers``: longest first, a worker takes the next unit when it finishes one.

    A unit whose attempt fails (an error in the worker, or the worker dying
    under it) is tried again, up to ``max_retries`` more times, preferably
    on another worker; then it is reported failed with every attempt's
    reason.  ``on_outcome`` sees each unit once, when it is final.
    """
    outcomes = {u.id: UnitOutcome(u) for u in units}
    queues: dict[Target, list[Unit]] = {}
    for u in sorted(units, key=lambda u: -u.cost()):
        queues.setdefault(u.target, []).append(u)
    inflight: dict[Future, tuple[Worker, Unit, float]] = {}

    def finish(o: UnitOutcome, status: str) -> None:
        o.status = status
        if on_outcome is not None:
            on_outcome(o)

    def serving(w: Worker) -> list[Target]:
        return [t for t in w.targets if queues.get(t)]

    def fail_unserved() -> None:
        live = [w for w in workers if w.alive]
        for target, q in queues.items():
            if q and not any(target in w.targets for w in live):
                reason = (f"no live worker measures {target.device} / cuDNN {target.cudnn_version}"
                          if any(target in w.targets for w in workers) else
                          f"no worker of this engine is a {target.device} with cuDNN {target.cudnn_version}")
                for u in q:
                    o = outcomes[u.id]
                    o.reasons.append(reason)
                    finish(o, "failed")
                q.clear()

    def feed(w: Worker) -> None:
        if not w.alive or any(iw is w for iw, _, _ in inflight.values()):
            return
        ts = serving(w)
        if not ts:
            return
        q = queues[max(ts, key=lambda t: len(queues[t]))]  # a worker of several targets helps the longest queue
        # prefer a unit this worker has not failed on before
        idx = next((i for i, u in enumerate(q) if w.name not in outcomes[u.id].worker.split(",")), 0)
        unit = q.pop(idx)
        outcomes[unit.id].attempts += 1
        inflight[engine.submit(w, unit)] = (w, unit, time.perf_counter())

    fail_unserved()
    for w in workers:
        feed(w)
    while inflight:
        done, _ = wait(list(inflight), return_when=FIRST_COMPLETED)
        for fut in done:
            w, unit, t_submit = inflight.pop(fut)
            o = outcomes[unit.id]
            elapsed = time.perf_counter() - t_submit
            try:
                res: UnitResult = fut.result()
            except Exception as e:  # noqa: BLE001 - the worker itself died: a lost node, a crashed process
                res = UnitResult(unit.id, None, f"worker {w.name} lost: {type(e).__name__}: {e}", elapsed, w.name)
                w.alive = engine.restart(w)
            o.seconds += res.seconds
            o.dispatch_seconds += max(0.0, elapsed - res.seconds)
            w.busy_seconds += res.seconds
            w.units += 1
            if res.ok:
                o.bench, o.worker = res.bench, w.name
                finish(o, "measured")
            else:
                o.reasons.append(f"attempt {o.attempts} on {w.name}: {res.error}")
                o.worker = ",".join(filter(None, [o.worker, w.name]))
                if o.attempts <= max_retries:
                    queues[unit.target].insert(0, unit)
                else:
                    finish(o, "failed")
        fail_unserved()
        for w in workers:
            feed(w)
    return [outcomes[u.id] for u in units]
