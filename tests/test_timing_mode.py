"""Timing modes: a configuration is timed as its plan will run, eagerly or replayed from a CUDA graph."""
from __future__ import annotations

import pytest

from ucudnn.binding import timing
from ucudnn.errors import CaptureError, InputError
from ucudnn.measure.sources.base import TIMINGS, BenchSettings, time_config


@pytest.fixture
def clocks(monkeypatch):
    """Both clocks replaced by recorders: which one ran, with which sampling."""
    calls = []
    monkeypatch.setattr(timing, "time_ms", lambda fn, **kw: calls.append(("eager", kw)) or 2.0)
    monkeypatch.setattr(timing, "time_replay_ms", lambda fn, **kw: calls.append(("replay", kw)) or 1.0)
    return calls


def test_eager_is_the_default_timing_and_calls_back_to_back(clocks):
    assert BenchSettings("strict").timing == "eager" and TIMINGS == ("eager", "replay")
    assert time_config(lambda: None, BenchSettings("strict", repeat=3, warmup=2, min_sample_ms=1.5)) == 2.0
    assert clocks == [("eager", {"repeat": 3, "warmup": 2, "min_sample_ms": 1.5})]


def test_replay_timing_times_the_call_replayed_from_a_cuda_graph(clocks):
    assert time_config(lambda: None, BenchSettings("strict", repeat=3, timing="replay")) == 1.0
    assert [c for c, _ in clocks] == ["replay"]


def test_a_call_that_cannot_be_captured_raises_capture_error_with_the_reason(monkeypatch):
    def refuse(fn, **kw):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(timing, "time_replay_ms", refuse)
    with pytest.raises(CaptureError, match="cannot be captured into a CUDA graph: RuntimeError: operation not"):
        time_config(lambda: None, BenchSettings("strict", timing="replay"))


def test_an_injected_timer_replaces_both_clocks(clocks):
    assert time_config(lambda: None, BenchSettings("strict", timing="replay"), lambda fn, **kw: 7.0) == 7.0
    assert clocks == []


def test_benchmark_refuses_an_unknown_timing_before_touching_the_gpu():
    from ucudnn.measure.benchmarking import benchmark

    with pytest.raises(InputError, match="timing"):
        benchmark([], timing="graph")


class _FakeCupy:
    """Just enough of CuPy for ``time_ms``: a GPU clock that each call of the timed function advances by ``t``
    ms, and events that read it (the hold kernel cannot be built here, so samples run without it)."""

    def __init__(self, t: float):
        import types

        self.now = 0.0
        self.t = t
        fake = self

        class Event:
            def record(self, stream=None):
                self.at = fake.now

            def synchronize(self):
                pass

        class RawKernel:
            def __init__(self, *a, **kw):
                raise RuntimeError("no compiler here")

        self.cuda = types.SimpleNamespace(
            Event=Event, get_current_stream=lambda: None, get_elapsed_time=lambda a, b: b.at - a.at,
            Device=lambda: types.SimpleNamespace(id=0))
        self.RawKernel = RawKernel

    def call(self):
        self.now += self.t


@pytest.mark.parametrize("t, calls", [
    (1.0, 1 + 1 + 2),        # warm-up, calibration (a sample already: 1 ms >= 0.5), two more samples
    (0.1, 1 + 1 + 3 * 5),    # warm-up, calibration, three samples of 5 calls each
])
def test_the_calibration_call_is_the_first_sample_when_one_call_already_lasts_a_sample(monkeypatch, t, calls):
    import sys

    fake = _FakeCupy(t)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(timing, "_spin", {})
    n = []

    def fn():
        n.append(1)
        fake.call()

    assert timing.time_ms(fn, repeat=3, warmup=1, min_sample_ms=0.5) == pytest.approx(t)
    assert len(n) == calls


@pytest.mark.parametrize("host, gpu, expect", [
    (3.0, 1.0, 3.0),     # host-bound: one call a sample (1 ms >= 0.5), the hold would hide 2 of its 3 host ms
    (0.2, 0.1, 0.2),     # host-bound short calls, five a sample
    (0.05, 1.0, 1.0),    # GPU-bound: the GPU's time
])
def test_a_sample_costs_the_longer_of_the_host_and_gpu_time_per_call(monkeypatch, host, gpu, expect):
    """Back to back, a call whose enqueue takes longer than its GPU work runs at the host's pace: that is what a
    plan of such steps executes in, so that is what the sample reports."""
    fn = _timed_call(monkeypatch, host, gpu)
    assert timing.time_ms(fn, repeat=3, warmup=1, min_sample_ms=0.5) == pytest.approx(expect)


def _timed_call(monkeypatch, host: float, gpu: float):
    """A call that takes ``host`` ms of the host's clock and ``gpu`` ms of the fake GPU's."""
    import sys
    import types

    fake = _FakeCupy(gpu)
    clock = [0.0]
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(timing, "_spin", {})
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    def fn():
        clock[0] += host / 1e3
        fake.call()

    return fn


@pytest.mark.parametrize("host, gpu", [(3.0, 1.0), (0.05, 1.0), (0.2, 0.1)])
def test_a_timing_keeps_the_hosts_enqueue_time_per_call_whichever_clock_won(monkeypatch, host, gpu):
    """Tables record the host's work per call beside the time (``host_ms``): planning breaks near-ties on it."""
    fn = _timed_call(monkeypatch, host, gpu)
    with timing.HostRecorder() as rec:
        assert rec.ms is None                     # nothing timed in the block yet
        timing.time_ms(fn, repeat=3, warmup=1, min_sample_ms=0.5)
    assert rec.ms == pytest.approx(host)
    with timing.HostRecorder() as again:
        pass
    assert again.ms is None                       # a block that timed nothing records nothing


def test_a_replayed_timing_records_no_host_work(monkeypatch):
    """A replay's host work is the CUDA graph's launch, not the configuration's: no ``host_ms`` from it."""
    import sys
    import types

    fake = _FakeCupy(1.0)

    class _Ctx:
        def __enter__(self):
            return self

        def __exit__(self, *a):
            return None

        def synchronize(self):
            pass

    fake.cuda.Stream = lambda non_blocking=True: _Ctx()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(timing, "_spin", {})
    import ucudnn.binding.gpu as gpu

    monkeypatch.setattr(gpu, "capture", lambda fn: types.SimpleNamespace(launch=lambda stream: fake.call()))
    with timing.HostRecorder() as rec:
        assert timing.time_replay_ms(lambda: None, repeat=2, warmup=1, min_sample_ms=0.5) == pytest.approx(1.0)
    assert rec.ms is None
