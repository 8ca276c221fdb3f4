"""CPU-only preparation of later measurements, run while the benchmark waits in cuDNN's Find (issue 16).

Why: the graph source spends seconds of host time per benchmark before it runs anything (the frontend's
``create_execution_plans``: 2.2 s of AlexNet b256 FP32 strict's 11.8 s on an H100, 7.4 of FP16 NHWC's 33 s,
plus the numerical-note probes), while legacy's ``cudnnFind*AlgorithmEx`` keeps the host waiting for the GPU
(1.7 s FP32, 6.1 s FP16, ``benchmarks/results/find_probe.md``).  Find is one ctypes call, which releases the GIL,
so a helper thread can prepare the graph source's next configurations (heuristics, builds, note probes) meanwhile.

Timing stays alone: the helper starts a job only while the main thread is inside a :meth:`Overlap.window` (around
Find, whose own times cuDNN takes on the GPU), and a window does not close before the job under way has ended.
The frontend's calls hold the GIL for their whole length (its bindings release it nowhere), so a helper running
while the main thread times a configuration could stall the main thread between two launches of a sample: that
never happens here.  A job that the main thread needs before the helper starts it is taken back and run inline,
so the result never depends on the helper (only the wall time does).

Measured on an H100 (``benchmarks/results/bench_time-p4r1-*.md``): AlexNet b256 FP32 strict 12.3 -> 11.4 s with the
helper; the price is Find's own seconds (2.0 -> 4.1 s there), since Find returning while a frontend call of the
helper holds the GIL waits for that call to end.  Find's estimates were not shifted (median ratio 1.02 to a run
without the helper, and no more outliers than between two runs without it).

:data:`OVERLAP` is the process's one instance; :func:`ucudnn.measure.benchmark` activates it for the length of a
benchmark (``overlap_cpu``), sources submit jobs through it (:meth:`Overlap.submit`) and take their results
(:meth:`Overlap.take`).
"""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterator


@dataclass
class _Job:
    key: Hashable
    fn: Callable[[], Any]
    result: Any = None
    error: BaseException | None = None
    seconds: float = 0.0


@dataclass
class OverlapStats:
    """What the helper did: jobs it ran (``ahead``), jobs taken back and run inline (``inline``), seconds of its
    jobs, seconds the main thread waited for a job under way (at a window's end or on :meth:`Overlap.take`; not the
    wait for the GIL when a call in the window returns while a job holds it), windows opened (``windows``) with their
    total length, and jobs never taken (``dropped``)."""

    ahead: int = 0
    inline: int = 0
    job_s: float = 0.0
    wait_s: float = 0.0
    windows: int = 0
    window_s: float = 0.0
    dropped: int = 0

    def as_dict(self) -> dict[str, float]:
        return {"jobs_ahead": self.ahead, "jobs_inline": self.inline, "job_s": round(self.job_s, 3),
                "wait_s": round(self.wait_s, 3), "windows": self.windows, "window_s": round(self.window_s, 3),
                "jobs_dropped": self.dropped}


class Overlap:
    """A helper thread that runs submitted jobs in order, only inside :meth:`window` (module doc).

    ``max_ahead``: finished jobs not yet taken at which the helper waits (bounds the memory of built plans held)."""

    def __init__(self, max_ahead: int = 32):
        self.max_ahead = max_ahead
        self._cond = threading.Condition()
        self._pending: OrderedDict[Hashable, _Job] = OrderedDict()
        self._done: dict[Hashable, _Job] = {}
        self._running: _Job | None = None
        self._open = 0
        self._active = 0
        self._thread: threading.Thread | None = None
        self._switch: float | None = None
        self.stats = OverlapStats()

    # -- the benchmark's side ---------------------------------------------------------------------
    @property
    def active(self) -> bool:
        """Whether a benchmark has activated the helper (:meth:`activated`): only then are jobs accepted."""
        return self._active > 0

    @contextlib.contextmanager
    def activated(self, enabled: bool = True) -> Iterator["Overlap"]:
        """Accept jobs for the length of the block (a benchmark); on leaving, drop the jobs left (never taken).

        While active, the interpreter's switch interval is 0.5 ms (restored after): a helper between two frontend
        calls then hands the GIL back to a main thread leaving Find within that, not the default 5 ms."""
        if not enabled:
            yield self
            return
        with self._cond:
            self._active += 1
            if self._active == 1:
                self.stats = OverlapStats()
                self._switch = sys.getswitchinterval()
                sys.setswitchinterval(min(self._switch, 5e-4))
        try:
            yield self
        finally:
            with self._cond:
                self._active -= 1
                if self._active == 0:
                    self.stats.dropped += len(self._pending)
                    self._pending.clear()
                    while self._running is not None:
                        self._cond.wait()
                    self.stats.dropped += len(self._done)
                    self._done.clear()
                    if self._switch is not None:
                        sys.setswitchinterval(self._switch)
                        self._switch = None

    @contextlib.contextmanager
    def window(self) -> Iterator[None]:
        """The helper may start jobs while the block runs (a call that releases the GIL and times nothing on the
        host: cuDNN Find); on leaving, wait for the job under way (so no job runs outside a window)."""
        if not self.active:
            yield
            return
        t0 = time.perf_counter()
        with self._cond:
            self._open += 1
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._open -= 1
                tw = time.perf_counter()
                while self._running is not None and not self._open:
                    self._cond.wait()
                self.stats.wait_s += time.perf_counter() - tw
                self.stats.windows += 1
                self.stats.window_s += time.perf_counter() - t0

    # -- the sources' side ------------------------------------------------------------------------
    def submit(self, key: Hashable, fn: Callable[[], Any]) -> bool:
        """Queue ``fn`` (no arguments; run on the helper thread) under ``key``; False (nothing queued) when no
        benchmark is active or ``key`` is already queued, under way or done."""
        with self._cond:
            if not self.active or key in self._pending or key in self._done or (
                    self._running is not None and self._running.key == key):
                return False
            self._pending[key] = _Job(key, fn)
            self._start()
            self._cond.notify_all()
            return True

    def take(self, key: Hashable) -> tuple[bool, Any]:
        """(True, result) of the job under ``key`` once the helper has run it (waiting for it if under way; its
        exception is raised here), or (False, None): no such job, or not started yet (then withdrawn: the caller
        runs it inline)."""
        with self._cond:
            if key in self._pending:
                del self._pending[key]
                self.stats.inline += 1
                return False, None
            if self._running is not None and self._running.key == key:
                tw = time.perf_counter()
                while self._running is not None and self._running.key == key:
                    self._cond.wait()
                self.stats.wait_s += time.perf_counter() - tw
            job = self._done.pop(key, None)
            self._cond.notify_all()
        if job is None:
            return False, None
        if job.error is not None:
            raise job.error
        return True, job.result

    # -- the helper ---------------------------------------------------------------------------------
    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="ucudnn-overlap", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._open and self._pending and len(self._done) < self.max_ahead):
                    self._cond.wait()
                _, job = self._pending.popitem(last=False)
                self._running = job
            t0 = time.perf_counter()
            try:
                job.result = job.fn()
            except BaseException as e:  # noqa: BLE001 - handed to the taker
                job.error = e
            job.seconds = time.perf_counter() - t0
            with self._cond:
                self._running = None
                self.stats.ahead += 1
                self.stats.job_s += job.seconds
                if self.active:
                    self._done[job.key] = job
                else:
                    self.stats.dropped += 1
                self._cond.notify_all()


#: The process's helper (module doc)
OVERLAP = Overlap()
