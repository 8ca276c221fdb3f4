"""What the benchmarks that capture PyTorch work in CUDA graphs share."""
from __future__ import annotations

from typing import Callable


def warm_up(fn: Callable[[], object], times: int) -> None:
    """Run ``fn`` ``times`` times on a side stream and wait for it: PyTorch's documented warm-up before
    ``torch.cuda.graph`` capture, so lazy initialisation, cuDNN's autotuning and the allocator's first pools happen
    outside the stream that is captured later."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(times):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
