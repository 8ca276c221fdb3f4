"""Device timing with CUDA events: warm-up, repeat, median (never a host clock around async work).

A micro-batched kernel runs its configuration many times back to back, so
the host's launch latency overlaps the previous call's GPU work.  Timing a
single call between two events would charge that latency to every small
micro-batch (measured: 2x on 16-sample AlexNet micro-batches).  So each
sample runs ``fn`` enough times back to back to last ``min_sample_ms`` and
reports the mean per call; the median over ``repeat`` samples is returned.
The first sample, of one call, tells how many calls a sample needs; when one
call already lasts ``min_sample_ms`` it is the first of the ``repeat`` samples
(it was taken exactly as the others are), not a call more.

Each sample also starts behind a short GPU *hold* (a kernel that spins for
about 1.5x the host time one call takes to enqueue), so the first call of the
sample is already queued when the start event fires: what a sample sees is
the steady state of calls back to back, as in a plan, where a step's launch
overlaps the step before it.  Why: without it the first call's enqueue was
charged to a sample of only 2-4 calls.  A sample reports the longer of the
GPU's time per call and the host's enqueue time per call: back to back, a
host-bound configuration runs at its host's pace.  Why: the hold hides the
host time of a sample of one call (a call lasting ``min_sample_ms``), and on
the H200 (VGG-16 b64 FP32, the winograd source's backward filter on three
streams, 49 chunks a call of 16 images: about 2 ms of host work, 1.4 ms of
GPU work) such calls were timed at their GPU time and WR's 64 MiB plan ran
1.14x its planned time (conv1_2's backward filter 1.52x).  Measured on an H100
(AlexNet b256 FP32, legacy WINOGRAD_NONFUSED backward data, 16 samples):
0.135 ms per call timed, 0.078 ms per call executed in a plan of 16, so WR's
planned time was 1.7x what the plan then ran in.

Two exits save benchmarking time (:mod:`ucudnn.measure.sources.base` decides
when): ``give_up(first_sample_ms)`` returning True stops after the first
sample and returns it (a configuration already hopeless needs no median), and
``deadline`` (a :func:`time.perf_counter` value) stops sampling once passed,
returning the median of the samples taken (at least one).

Each timing also keeps the host's enqueue time per call (the median over its samples), which
:class:`HostRecorder` hands to the sources: tables record it as ``host_ms`` beside ``time_ms``, so that
planning can prefer, between configurations of nearly the same time, the one that costs the host less
(:func:`ucudnn.planning.wr.fastest_per_size`).  Why: a training step whose host is the slower party pays every
call's host work, even where each call's GPU work is longer; measured on an H200 (issue 15's bar 3), cuDNN's
legacy IMPLICIT_PRECOMP_GEMM calls took 55-137 us of host a call against 14-30 us for the graph-API engine each
runs as, at the same GPU time (``benchmarks/results/host_ties_h200.md``).
"""
from __future__ import annotations

import math
import statistics
import threading
import time
from typing import Callable

_last = threading.local()   # .host_ms: the last time_ms's median host ms per call on this thread (None: none)


class HostRecorder:
    """``with HostRecorder() as host: <time one configuration>`` then ``host.ms``: the median host enqueue ms per
    call of the last eager timing inside the block, or None where none ran (an estimate kept, a replayed timing,
    a test's timer)."""

    def __enter__(self) -> "HostRecorder":
        _last.host_ms = None
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    @property
    def ms(self) -> float | None:
        return getattr(_last, "host_ms", None)


def time_ms(fn: Callable[[], None], repeat: int = 5, warmup: int = 1, min_sample_ms: float = 0.0,
            max_inner: int = 64, give_up: Callable[[float], bool] | None = None,
            deadline: float | None = None) -> float:
    """Median per-call time of ``fn`` in milliseconds on CuPy's current stream (early exits: module doc)."""
    import cupy as cp

    _last.host_ms = None
    stream = cp.cuda.get_current_stream()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    host = [0.0]   # seconds the host last took to enqueue one call
    hosts: list[float] = []   # the host ms per call of each sample in ``samples`` (the median's, not calibration's)

    def sample(inner: int) -> float:
        _hold(stream, 1.5 * host[0])
        start.record(stream)
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        host[0] = (time.perf_counter() - t0) / inner
        end.record(stream)
        end.synchronize()
        # back to back, a call costs the longer of its GPU time and its host enqueue time (module doc)
        return max(cp.cuda.get_elapsed_time(start, end) / inner, 1e3 * host[0])

    def keep(ms: float) -> None:    # a sample of the median, with its host time (HostRecorder's, module doc)
        samples.append(ms)
        hosts.append(1e3 * host[0])
        _last.host_ms = statistics.median(hosts)

    for _ in range(warmup):
        t0 = time.perf_counter()
        fn()
        host[0] = time.perf_counter() - t0
    inner = 1
    samples: list[float] = []
    if min_sample_ms > 0 or give_up is not None:
        first = sample(1)
        if give_up is not None and give_up(first):
            keep(first)
            return first
        inner = max(1, min(max_inner, math.ceil(min_sample_ms / max(first, 1e-3)))) if min_sample_ms > 0 else 1
        if inner == 1:   # one call already lasts a sample: the calibration call is a sample like the rest
            keep(first)
    while len(samples) < max(1, repeat):
        if samples and deadline is not None and time.perf_counter() > deadline:
            break
        keep(sample(inner))
    return float(statistics.median(samples))


#: Longest GPU hold before a sample (a call whose enqueue takes longer is host-bound anyway)
MAX_HOLD_S = 2e-3
_SPIN = r"""
extern "C" __global__ void ucudnn_hold(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
"""
_spin: dict[int, object] = {}


def _hold(stream, seconds: float) -> None:
    """Keep ``stream``'s GPU busy for about ``seconds`` (at most :data:`MAX_HOLD_S`; nothing if 0 or where the
    kernel cannot run), so work enqueued meanwhile starts back to back after it (module doc)."""
    if seconds <= 0:
        return
    import cupy as cp

    dev = cp.cuda.Device().id
    kernel = _spin.get(dev)
    if kernel is None:
        try:
            kernel = cp.RawKernel(_SPIN, "ucudnn_hold")
            kernel.compile()
        except Exception:  # noqa: BLE001 - no compiler here: time without the hold
            kernel = False
        _spin[dev] = kernel
    if kernel:
        kernel((1,), (1,), (cp.uint64(int(min(seconds, MAX_HOLD_S) * 1e9)),), stream=stream)


def time_replay_ms(fn: Callable[[], None], repeat: int = 5, warmup: int = 2, min_sample_ms: float = 5.0,
                   give_up: Callable[[float], bool] | None = None, deadline: float | None = None) -> float:
    """Median ms per replay of ``fn`` captured once into a CUDA graph: its GPU time without the host's.

    Why: a plan of many small micro-batches can be bound by the host's launch work (several cuDNN and
    transform launches per step); users with fixed buffers (serving, CUDA-graph training loops) capture a
    plan once and replay it, which leaves only the GPU's time.  ``fn`` runs once uncaptured first, so lazy
    work (plan builds, pool allocations) happens before capture; a capture error propagates.
    """
    import cupy as cp

    from .gpu import capture

    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        fn()
        stream.synchronize()
        graph = capture(fn)
        ms = time_ms(lambda: graph.launch(stream), repeat=repeat, warmup=warmup, min_sample_ms=min_sample_ms,
                     give_up=give_up, deadline=deadline)
        _last.host_ms = None    # a replay's host work is the graph launch's, not the configuration's
        return ms
