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
