"""The ctypes binding's contract, checkable without a GPU."""
from __future__ import annotations

import ctypes

import pytest

from ucudnn.binding import cudnn
from ucudnn.errors import CudnnError, CudnnNotFound


def test_perf_struct_matches_cudnns_layout():
    # int algo, int status, float time, size_t memory, int determinism, int mathType, int reserved[3]
    assert ctypes.sizeof(cudnn.AlgoPerf) == 48
    assert cudnn.AlgoPerf.memory.offset == 16


def test_a_missing_library_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(cudnn, "_lib", None)
    monkeypatch.setenv("UCUDNN_CUDNN_LIBRARY", str(tmp_path / "libcudnn.so.9"))
    with pytest.raises(CudnnNotFound, match="UCUDNN_CUDNN_LIBRARY"):
        cudnn.load()


def test_cudnn_errors_name_the_call_and_status():
    e = CudnnError("cudnnConvolutionForward", 3000, "CUDNN_STATUS_NOT_SUPPORTED")
    assert "cudnnConvolutionForward" in str(e) and "NOT_SUPPORTED" in str(e) and e.status == 3000


def test_algorithm_names_cover_every_op():
    assert cudnn.algo_name("forward", 6) == "WINOGRAD"
    assert cudnn.algo_name("backward_filter", 3) == "ALGO_3"
    assert cudnn.algo_name("backward_data", 42) == "ALGO_42"


def test_a_threads_handle_is_made_once_per_device_and_told_its_stream_only_when_the_stream_changes(monkeypatch):
    """binding.gpu.handle_on: cudnnSetStream costs host time on every launch of a training step, so a handle
    is re-bound only when the caller's stream differs from the one it was last bound to; each thread and
    device has its own handle (cuDNN handles are not shared between threads)."""
    import threading

    from ucudnn.binding import gpu

    made, bound = [], []
    monkeypatch.setattr(gpu.cudnn, "create", lambda: made.append(1) or 100 + len(made))
    monkeypatch.setattr(gpu.cudnn, "set_stream", lambda h, s: bound.append((h, s)))
    monkeypatch.setattr(gpu, "_tls", threading.local())
    h = gpu.handle_on(7, 0)
    assert gpu.handle_on(7, 0) == h and bound == [(h, 7)]          # same stream: not bound again
    assert gpu.handle_on(8, 0) == h and bound == [(h, 7), (h, 8)]  # another stream: bound
    assert gpu.handle_on(7, 0) == h and bound[-1] == (h, 7)
    other = gpu.handle_on(7, 1)
    assert other != h and bound[-1] == (other, 7) and len(made) == 2
    seen = []
    t = threading.Thread(target=lambda: seen.append(gpu.handle_on(7, 0)))
    t.start()
    t.join()
    assert seen[0] not in (h, other) and len(made) == 3 and bound[-1] == (seen[0], 7)


def test_a_legacy_shortcut_calls_its_ops_entry_point_with_bound_descriptors_scalars_and_the_callers_stream(
        monkeypatch):
    """legacy._direct: cudnnConvolution<op> with the prepared descriptors and algo, alpha 1 and beta 0, the
    workspace and this thread's handle for the current device on the caller's stream; nothing is loaded before
    the first call; a failing status is a CudnnError naming the call."""
    from types import SimpleNamespace

    from ucudnn.measure.sources import legacy

    calls, status, looked_up = [], [0], []

    def entry(*args):
        calls.append(args)
        return status[0]

    monkeypatch.setattr(legacy.cudnn, "entry_point",
                        lambda op: looked_up.append(op) or (entry, f"cudnnConvolution<{op}>"))
    monkeypatch.setattr(legacy, "current_device", lambda: 2)
    monkeypatch.setattr(legacy, "handle_on", lambda stream, dev: ("handle", stream, dev))
    direct = legacy._direct("backward_data", SimpleNamespace(conv=40), 10, 20, 30, 5)
    assert looked_up == []
    assert direct(1, 2, 3, 4, 512, 77) is True and direct(1, 2, 3, 4, 512, 77) is True
    assert looked_up == ["backward_data"]
    args = calls[0]
    assert args[0] == ("handle", 77, 2) and args[2:10] == (10, 1, 20, 2, 40, 5, 4, 512) and args[11:] == (30, 3)
    one, zero = (ctypes.cast(a, ctypes.POINTER(ctypes.c_float)).contents.value for a in (args[1], args[10]))
    assert (one, zero) == (1.0, 0.0)
    status[0] = 3
    with pytest.raises(CudnnError, match="cudnnConvolution<backward_data>"):
        direct(1, 2, 3, 4, 512, 77)
