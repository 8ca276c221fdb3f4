"""Device timing with CUDA events: warm-up, repeat, median (METHOD: never a host clock around async work)."""
from __future__ import annotations

import statistics
from typing import Callable


def time_ms(fn: Callable[[], None], repeat: int = 5, warmup: int = 1) -> float:
    """Median time of ``fn`` in milliseconds on CuPy's current stream."""
    import cupy as cp

    stream = cp.cuda.get_current_stream()
    for _ in range(warmup):
        fn()
    times = []
    start, end = cp.cuda.Event(), cp.cuda.Event()
    for _ in range(max(1, repeat)):
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return float(statistics.median(times))
