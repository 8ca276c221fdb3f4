"""A call's work spread over the caller's stream and side streams, joined back before it returns (the winograd and fft
sources' chunks over streams: one chunk's memory-bound transforms run beside another's GEMMs)."""
from __future__ import annotations

from typing import Any

from ...binding import cublas


class StreamSet:
    """The caller's stream and side streams 1 .. streams - 1 (:func:`ucudnn.binding.gpu.side_stream`), a cuBLAS
    handle each (:func:`ucudnn.binding.cublas.side_handle`), and the events that fork the side streams from the
    caller's work so far and join them back: between ``fork`` and ``join`` work may go to any of them, and the call
    is still one stream's work to its caller and to a CUDA graph capture."""

    def __init__(self, cp: Any, streams: int) -> None:
        from ...binding.gpu import side_stream

        self.sides = [side_stream(k) for k in range(1, streams)]
        self.handles = [cublas.side_handle(k) for k in range(streams)]
        self._fork = cp.cuda.Event(block=False, disable_timing=True)
        self._joins = [cp.cuda.Event(block=False, disable_timing=True) for _ in self.sides]

    def fork(self, main: Any) -> list[Any]:
        """Bind each handle to its stream, make the side streams wait for ``main``; the streams, ``main`` first."""
        order = [main, *self.sides]
        for h, st in zip(self.handles, order):
            cublas.bind(h, st.ptr)
        self._fork.record(main)
        for st in self.sides:
            st.wait_event(self._fork)
        return order

    def join(self, main: Any) -> None:
        """Make ``main`` wait for everything enqueued on the side streams."""
        for st, done in zip(self.sides, self._joins):
            done.record(st)
            main.wait_event(done)
