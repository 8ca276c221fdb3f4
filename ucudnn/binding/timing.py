"""Device timing with CUDA events: warm-up, repeat, median (never a host clock around async work).

A micro-batched kernel runs its configuration many times back to back, so
the host's launch latency overlaps the previous call's GPU work.  Timing a
single call between two events would charge that latency to every small
micro-batch (measured: 2x on 16-sample AlexNet micro-batches).  So each
sample runs ``fn`` enough times back to back to last ``min_sample_ms`` and
reports the mean per call; the median over ``repeat`` samples is returned.
"""
from __future__ import annotations

import math
import statistics
from typing import Callable


def time_ms(fn: Callable[[], None], repeat: int = 5, warmup: int = 1, min_sample_ms: float = 0.0,
            max_inner: int = 64) -> float:
    """Median per-call time of ``fn`` in milliseconds on CuPy's current stream."""
    import cupy as cp

    stream = cp.cuda.get_current_stream()
    start, end = cp.cuda.Event(), cp.cuda.Event()

    def sample(inner: int) -> float:
        start.record(stream)
        for _ in range(inner):
            fn()
        end.record(stream)
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) / inner

    for _ in range(warmup):
        fn()
    inner = 1
    if min_sample_ms > 0:
        first = sample(1)
        inner = max(1, min(max_inner, math.ceil(min_sample_ms / max(first, 1e-3))))
    return float(statistics.median(sample(inner) for _ in range(max(1, repeat))))


def time_replay_ms(fn: Callable[[], None], repeat: int = 5, warmup: int = 2, min_sample_ms: float = 5.0) -> float:
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
        return time_ms(lambda: graph.launch(stream), repeat=repeat, warmup=warmup, min_sample_ms=min_sample_ms)
