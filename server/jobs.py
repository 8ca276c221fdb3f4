"""Benchmark jobs: measure problems on this host's GPU in the background; the result lands as a table.

One job runs at a time (one worker thread): concurrent benchmarks on one GPU
would disturb each other's timings.  Progress is counted in distinct
(problem, op) pairs, the unit ``ucudnn.measure.benchmark`` measures once
(ResNet repeats layers), and written to the store after each one, so
``GET /v1/jobs/{id}`` works from any server sharing the store.

Without a GPU the service refuses jobs up front (503 with the reason) rather
than accepting work it can never do.  The benchmark function and the GPU
check are injectable so the job machinery is tested on CPU machines too.
"""
from __future__ import annotations

import logging
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from ucudnn.catalog.store import Store
from ucudnn.errors import GpuUnavailable, InputError
from ucudnn.planning.table import BenchmarkTable, KernelBench
from ucudnn.policy import normalize_policy
from ucudnn.problem import ConvProblem, KernelSpec

from .metrics import Metrics
from .models import JobRequest

log = logging.getLogger("ucudnn.server")
Benchmark = Callable[..., BenchmarkTable]


def _default_gpu_reason() -> str | None:
    """None when jobs can run here, else why not (ucudnn.binding.gpu.gpu_available(), with its cause)."""
    from ucudnn.binding import cudnn
    from ucudnn.binding.gpu import cupy, gpu_available

    if gpu_available():
        return None
    try:
        cupy()
        cudnn.load()
    except Exception as e:  # noqa: BLE001 - the reason is the message
        return str(e)
    return "ucudnn.binding.gpu.gpu_available() is False"


def _default_benchmark(*args: Any, **kwargs: Any) -> BenchmarkTable:
    from ucudnn.measure.benchmarking import benchmark

    return benchmark(*args, **kwargs)


class JobRunner:
    def __init__(self, store: Store, metrics: Metrics, benchmark: Benchmark | None = None,
                 gpu_reason: Callable[[], str | None] | None = None):
        self.store = store
        self.metrics = metrics
        self.benchmark = benchmark or _default_benchmark
        self._gpu_reason_fn = gpu_reason or _default_gpu_reason
        self._gpu_reason: tuple[str | None] | None = None  # checked once: importing CuPy is slow
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="ucudnn-job")

    def gpu_reason(self) -> str | None:
        if self._gpu_reason is None:
            self._gpu_reason = (self._gpu_reason_fn(),)
        return self._gpu_reason[0]

    @property
    def gpu_checked(self) -> bool | None:
        return None if self._gpu_reason is None else self._gpu_reason[0] is None

    @staticmethod
    def kernels(req: JobRequest) -> list[KernelSpec]:
        """The request's kernels, named ``<name or p{i}>/<op>``; InputError names the offending problem."""
        specs: list[KernelSpec] = []
        names: set[str] = set()
        for i, p in enumerate(req.problems):
            name = p.name or f"p{i}"
            if name in names:
                raise InputError(f"duplicate problem name {name!r}", f"problems[{i}].name")
            names.add(name)
            problem = ConvProblem.from_dict(p.model_dump(exclude={"name"}), f"problems[{i}]")
            specs.extend(KernelSpec(f"{name}/{op}", op, problem) for op in dict.fromkeys(req.ops))
        return specs

    def submit(self, req: JobRequest) -> str:
        specs = self.kernels(req)
        batch_policy = normalize_policy(req.batch_policy)
        if req.numerics is not None:
            from ucudnn import numerics

            numerics.normalize(req.numerics, "float32")
        reason = self.gpu_reason()
        if reason is not None:
            raise GpuUnavailable(f"benchmark jobs need a CUDA GPU and this host has none usable: {reason}")
        job_id = uuid.uuid4().hex
        distinct = len({(s.problem, s.op) for s in specs})
        self.store.put_job(job_id, req.model_dump(), distinct)
        self.pool.submit(self._run, job_id, specs, batch_policy, req.numerics)
        return job_id

    def _run(self, job_id: str, specs: list[KernelSpec], batch_policy: str, numerics: str | None) -> None:
        try:
            self.store.update_job(job_id, status="running")
            measured: dict[tuple[ConvProblem, str], KernelBench] = {}
            last: BenchmarkTable | None = None
            for spec in specs:
                key = (spec.problem, spec.op)
                if key in measured:
                    continue
                last = self.benchmark([spec], batch_policy, numerics)
                measured[key] = last.kernels[0]
                self.store.update_job(job_id, done=len(measured))
            assert last is not None
            kernels = [KernelBench(s.name, s.op, s.problem, measured[(s.problem, s.op)].measurements,
                                   measured[(s.problem, s.op)].skipped,
                                   measured[(s.problem, s.op)].benchmark_seconds) for s in specs]
            extra = {**last.extra, "batch_policy": batch_policy}
            table = BenchmarkTable(last.device, last.cudnn_version, kernels, last.numerics, extra)
            table_id = self.store.put_table(table)
            self.store.update_job(job_id, status="done", table_id=table_id)
            self.metrics.jobs.labels("done").inc()
        except Exception as e:  # noqa: BLE001 - a job's failure is its status, not the server's
            log.exception("benchmark job %s failed", job_id)
            self.store.update_job(job_id, status="failed", message=f"{type(e).__name__}: {e}")
            self.metrics.jobs.labels("failed").inc()

    def status(self, job_id: str) -> dict[str, Any]:
        job = self.store.get_job(job_id)
        if job is None:
            from .planning import UnknownId

            raise UnknownId(f"no job with id {job_id!r}", "job_id")
        job.pop("request", None)
        job["progress"] = job["done"] / job["total"] if job["total"] else 1.0
        return job
