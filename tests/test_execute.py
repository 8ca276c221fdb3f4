"""The executor's bookkeeping without a GPU: which slice, workspace and beta each micro-batch gets.

A recording source stands in for cuDNN; numerical results against undivided
cuDNN are in test_gpu_execute.py and test_gpu_graph.py (GPU).
"""
from __future__ import annotations

import numpy as np
import pytest

from ucudnn.errors import InputError, UcudnnError
from ucudnn.execute.executor import Executor
from ucudnn.planning.plan import KernelPlan, MicroConfig
from ucudnn.problem import ConvProblem

P = ConvProblem(10, 3, 8, 8, 4, 3, 3, pad=(1, 1))          # NCHW float32: x 3*8*8, y 4*8*8 floats a sample
X_SAMPLE, Y_SAMPLE = 3 * 8 * 8 * 4, 4 * 8 * 8 * 4


class _Recorder:
    """A source that records preparations and launches instead of running anything."""

    name = "recorder"

    def __init__(self):
        self.prepared: list[tuple] = []
        self.calls: list[tuple] = []

    def prepare(self, op, problem, config):
        self.prepared.append((op, problem.n, config.algo))
        return lambda ops, ws, ws_bytes, alpha, beta: self.calls.append(
            (config.algo, ops.a, ops.b, ops.out, ws, ws_bytes, alpha, beta))


class _Array:
    """Just what the executor reads of a CuPy array: shape, dtype, contiguity, device pointer."""

    def __init__(self, shape, ptr, dtype="float32", contiguous=True):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.flags = type("F", (), {"c_contiguous": contiguous})()
        self.data = type("D", (), {"ptr": ptr})()
        self.nbytes = int(np.prod(shape)) * self.dtype.itemsize


@pytest.fixture
def recorder(monkeypatch):
    from ucudnn.measure.sources import registry

    rec = _Recorder()
    monkeypatch.setitem(registry._SOURCES, rec.name, rec)
    return rec


def _plan(op, sizes, ws=1024):
    return KernelPlan("k", op, P, [MicroConfig(n, f"c{i}", "DEFAULT", 1.0, ws, "recorder") for i, n in enumerate(sizes)])


def _operands(op):
    shapes = {"forward": (P.x_shape(), P.w_shape(), P.y_shape()),
              "backward_data": (P.w_shape(), P.y_shape(), P.x_shape()),
              "backward_filter": (P.x_shape(), P.y_shape(), P.w_shape())}[op]
    return [_Array(s, base) for s, base in zip(shapes, (1 << 20, 2 << 20, 3 << 20))]


def test_every_step_is_prepared_once_at_its_micro_batch_size(recorder):
    ex = Executor(_plan("forward", [4, 4, 2]))
    assert recorder.prepared == [("forward", 4, "c0"), ("forward", 4, "c1"), ("forward", 2, "c2")]
    for _ in range(3):
        ex(*_operands("forward"), workspace=_Array((1024,), 9 << 20, "uint8"))
    assert len(recorder.prepared) == 3 and len(recorder.calls) == 9


def test_forward_micro_batch_i_reads_and_writes_the_i_th_slice_and_shares_the_workspace(recorder):
    Executor(_plan("forward", [4, 4, 2]))(*_operands("forward"), workspace=_Array((4096,), 9 << 20, "uint8"),
                                          workspace_bytes=2048)
    assert [(a, b, out) for _, a, b, out, *_ in recorder.calls] == [
        ((1 << 20) + k * X_SAMPLE, 2 << 20, (3 << 20) + k * Y_SAMPLE) for k in (0, 4, 8)]
    assert {(ws, n) for *_, ws, n, _, _ in recorder.calls} == {(9 << 20, 2048)}


def test_backward_data_slices_dy_and_dx_but_not_the_filter(recorder):
    Executor(_plan("backward_data", [5, 5]))(*_operands("backward_data"), workspace=_Array((1024,), 9 << 20, "uint8"))
    assert [(a, b, out) for _, a, b, out, *_ in recorder.calls] == [
        (1 << 20, (2 << 20) + k * Y_SAMPLE, (3 << 20) + k * X_SAMPLE) for k in (0, 5)]


def test_backward_filter_applies_the_callers_beta_once_then_accumulates(recorder):
    Executor(_plan("backward_filter", [4, 4, 2]))(*_operands("backward_filter"), alpha=0.5, beta=2.0,
                                                  workspace=_Array((1024,), 9 << 20, "uint8"))
    assert [(out, alpha, beta) for _, _, _, out, _, _, alpha, beta in recorder.calls] == [
        (3 << 20, 0.5, 2.0), (3 << 20, 0.5, 1.0), (3 << 20, 0.5, 1.0)]


def test_forward_steps_each_apply_the_callers_alpha_and_beta_to_their_own_slice(recorder):
    Executor(_plan("forward", [5, 5]))(*_operands("forward"), alpha=0.5, beta=2.0,
                                       workspace=_Array((1024,), 9 << 20, "uint8"))
    assert [(alpha, beta) for *_, alpha, beta in recorder.calls] == [(0.5, 2.0), (0.5, 2.0)]


def test_a_plan_whose_micro_batches_do_not_sum_to_the_mini_batch_is_refused(recorder):
    with pytest.raises(InputError, match="sum to 8"):
        Executor(_plan("forward", [4, 4]))


@pytest.mark.parametrize("change, field", [
    (dict(shape=(9, 3, 8, 8)), "x"),
    (dict(dtype="float16"), "x"),
    (dict(contiguous=False), "x"),
])
def test_operands_that_do_not_match_the_plan_are_refused_before_anything_runs(recorder, change, field):
    a, b, out = _operands("forward")
    bad = _Array(change.get("shape", a.shape), a.data.ptr, change.get("dtype", "float32"), change.get("contiguous", True))
    with pytest.raises(InputError) as e:
        Executor(_plan("forward", [5, 5]))(bad, b, out, workspace=_Array((1024,), 9 << 20, "uint8"))
    assert e.value.field == field and recorder.calls == []


def test_a_workspace_smaller_than_the_plan_needs_is_refused(recorder):
    with pytest.raises(UcudnnError, match="needs 1024"):
        Executor(_plan("forward", [10]))(*_operands("forward"), workspace=_Array((512,), 9 << 20, "uint8"))
    assert recorder.calls == []


# -- replay: a call's steps captured once per set of buffers, then replayed ---------------------------------------
class _FakeCuda:
    """CuPy's stream capture as the executor uses it: launches made while capturing are recorded, not run."""

    def __init__(self, recorder, fail=None):
        self.recorder, self.fail = recorder, fail
        self.captures, self.launches = 0, []
        cuda = self

        class Stream:
            def __init__(self, non_blocking=False):
                assert non_blocking, "capture on a non-blocking stream of its own"

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def begin_capture(self):
                if cuda.fail:
                    raise RuntimeError(cuda.fail)
                cuda.captures += 1
                self.start = len(cuda.recorder.calls)

            def end_capture(self):
                steps = cuda.recorder.calls[self.start:]
                del cuda.recorder.calls[self.start:]   # captured work does not run
                return type("Graph", (), {"launch": lambda g, s: cuda.launches.append(tuple(steps))})()

        self.Stream = Stream
        self.get_current_stream = lambda: "caller's stream"
        self.cuda = self


@pytest.fixture
def capture(recorder, monkeypatch):
    import ucudnn.binding.gpu as G
    import ucudnn.execute.executor as E

    fake = _FakeCuda(recorder)
    for module in (E, G):   # the executor launches on the current stream; gpu.capture captures
        monkeypatch.setattr(module, "cupy", lambda: fake)
    return fake


def test_replay_captures_a_call_once_then_replays_it_for_the_same_buffers(recorder, capture):
    ex = Executor(_plan("backward_filter", [4, 4, 2]), replay=True)
    ws = _Array((1024,), 9 << 20, "uint8")
    for _ in range(3):
        ex(*_operands("backward_filter"), alpha=0.5, workspace=ws)
    assert capture.captures == 1 and recorder.calls == []
    assert len(capture.launches) == 3 and len(set(capture.launches)) == 1
    assert [(beta, n) for *_, n, _, beta in capture.launches[0]] == [(0.0, 1024), (1.0, 1024), (1.0, 1024)]


def test_replay_captures_again_for_other_buffers_or_scalars(recorder, capture):
    ex = Executor(_plan("forward", [5, 5]), replay=True)
    a, b, out = _operands("forward")
    ws = _Array((1024,), 9 << 20, "uint8")
    ex(a, b, out, workspace=ws)
    ex(a, b, _Array(out.shape, 7 << 20), workspace=ws)
    ex(a, b, out, workspace=ws, beta=1.0)
    ex(a, b, out, workspace=ws)
    assert capture.captures == 3 and len(capture.launches) == 4


def test_replay_keeps_a_bounded_number_of_captured_calls(recorder, capture):
    ex = Executor(_plan("forward", [5, 5]), replay=True)
    a, b, out = _operands("forward")
    for i in range(Executor.MAX_GRAPHS + 3):
        ex(a, b, out, workspace=_Array((1024,), (16 + i) << 20, "uint8"))
    assert len(ex._graphs) == Executor.MAX_GRAPHS


def test_a_plan_that_cannot_be_captured_runs_eagerly_and_says_why(recorder, capture):
    capture.fail = "operation not permitted when stream is capturing"
    ex = Executor(_plan("forward", [5, 5]), replay=True)
    for _ in range(2):
        ex(*_operands("forward"), workspace=_Array((1024,), 9 << 20, "uint8"))
    assert len(recorder.calls) == 4 and capture.launches == []
    assert ex.replay_failures == ["RuntimeError: operation not permitted when stream is capturing"]


def test_without_replay_every_call_launches_its_steps(recorder, capture):
    ex = Executor(_plan("forward", [5, 5]))
    for _ in range(2):
        ex(*_operands("forward"), workspace=_Array((1024,), 9 << 20, "uint8"))
    assert len(recorder.calls) == 4 and capture.captures == 0


# -- the one-step shortcut (sources.base.Direct) ---------------------------------------------------------------------
class _DirectRecorder(_Recorder):
    """A recording source whose launchers carry a shortcut, as the graph and legacy sources' do."""

    name = "recorder"

    def prepare(self, op, problem, config):
        launch = super().prepare(op, problem, config)
        launch.direct = lambda *args: self.calls.append(("direct", config.algo, *args)) or True
        return launch


@pytest.fixture
def direct_recorder(monkeypatch):
    from ucudnn.measure.sources import registry

    rec = _DirectRecorder()
    monkeypatch.setitem(registry._SOURCES, rec.name, rec)
    return rec


def test_a_one_step_plan_offers_its_sources_shortcut(direct_recorder):
    ex = Executor(_plan("forward", [10]))
    assert ex.direct is not None
    assert ex.direct(1, 2, 3, 4, 1024, 5) is True
    assert direct_recorder.calls == [("direct", "c0", 1, 2, 3, 4, 1024, 5)]


@pytest.mark.parametrize("why, plan, replay", [
    ("several micro-batches", _plan("forward", [5, 5]), False),
    ("replayed calls", _plan("forward", [10]), True),
    ("accumulating steps", _plan("backward_filter", [4, 6]), False),
])
def test_plans_the_shortcut_cannot_run_have_none(direct_recorder, why, plan, replay):
    assert Executor(plan, replay=replay).direct is None, why


def test_a_source_without_a_shortcut_leaves_the_executor_without_one(recorder):
    assert Executor(_plan("forward", [10])).direct is None


# -- unwritten memory (issue 18) --------------------------------------------------------------------------------------
def _unwritten_plan(op, sizes, ws, flags):
    return KernelPlan("k", op, P, [MicroConfig.of(MicroConfig(n, f"c{i}", "DEFAULT", 1.0, w, "recorder"), f)
                                   for i, (n, w, f) in enumerate(zip(sizes, ws, flags))])


def test_a_forward_step_on_unwritten_memory_takes_the_output_of_the_later_samples_aligned(recorder):
    """y's samples 4..9 are not written while samples 0..3 run: the first step's workspace starts at sample 4's
    output, rounded up to 256 bytes, and runs to y's end; the others share the workspace buffer, which is only as
    large as they need."""
    ex = Executor(_unwritten_plan("forward", [4, 6], [5000, 512], [True, False]))
    assert ex.workspace_bytes == 512 and ex.takes_unwritten and ex.direct is None and ex.native_steps is None
    ex(*_operands("forward"), workspace=_Array((512,), 9 << 20, "uint8"))
    y = 3 << 20
    start = -(-(y + 4 * Y_SAMPLE) // 256) * 256
    assert [(ws, n) for *_, ws, n, _, _ in recorder.calls] == [(start, y + 10 * Y_SAMPLE - start), (9 << 20, 512)]


def test_unwritten_memory_is_refused_before_anything_runs_where_it_is_not_there(recorder):
    """beta != 0 (the output holds data), a tail too small for the step, a backward filter without its layer's dx:
    each refused with the kernel named, and no step launched."""
    fwd = Executor(_unwritten_plan("forward", [4, 6], [5000, 512], [True, False]))
    with pytest.raises(UcudnnError, match="beta"):
        fwd(*_operands("forward"), beta=1.0, workspace=_Array((512,), 9 << 20, "uint8"))
    big = Executor(_unwritten_plan("forward", [8, 2], [3 * Y_SAMPLE, 0], [True, False]))   # 2 samples after it
    with pytest.raises(UcudnnError, match="unwritten memory"):
        big(*_operands("forward"))
    bwf = Executor(_unwritten_plan("backward_filter", [10], [1 << 20], [True]))
    assert bwf.workspace_bytes == 0
    with pytest.raises(UcudnnError, match="dx"):
        bwf(*_operands("backward_filter"))
    assert recorder.calls == []


def test_a_backward_filter_step_on_unwritten_memory_takes_the_layers_dx(recorder):
    bwf = Executor(_unwritten_plan("backward_filter", [8, 2], [1 << 20, 256], [True, False]))
    assert bwf.workspace_bytes == 256
    dx = _Array((1 << 20,), 7 << 20, "uint8")             # the layer's dx, as bytes: 1 MiB
    bwf(*_operands("backward_filter"), workspace=_Array((256,), 9 << 20, "uint8"), unwritten=dx)
    assert [(ws, n) for *_, ws, n, _, _ in recorder.calls] == [(7 << 20, 1 << 20), (9 << 20, 256)]
    small = Executor(_unwritten_plan("backward_filter", [10], [2 << 20], [True]))
    with pytest.raises(UcudnnError, match="needs 2097152 bytes of unwritten memory, 1048576 are there"):
        small(*_operands("backward_filter"), unwritten=dx)


def test_a_channel_slice_on_unwritten_output_is_refused_when_the_plan_is_made(recorder):
    cfgs = [MicroConfig.of(MicroConfig(10, "s", "DEFAULT", 1.0, 1 << 20, "recorder", channels=2), True),
            MicroConfig(10, "t", "DEFAULT", 1.0, 0, "recorder", channels=2)]
    with pytest.raises(UcudnnError, match="channel slice"):
        Executor(KernelPlan("k", "forward", P, cfgs))


def test_a_compiled_path_is_told_where_a_step_on_unwritten_memory_finds_its_workspace(monkeypatch):
    """``native_steps`` (ucudnn.torch's compiled launch path) describes a forward / backward-data step on unwritten
    memory by where its workspace starts in the output (the next micro-batch's first byte; the launch path rounds
    it up as the executor does) and what it needs; a backward filter's, as starting 0 bytes into the dx its caller
    lends."""
    from ucudnn.execute.executor import NativeStep
    from ucudnn.measure.sources import registry
    from ucudnn.measure.sources.base import Native

    class Described(_Recorder):
        def prepare(self, op, problem, config):
            launch = super().prepare(op, problem, config)

            def run(*args):
                return launch(*args)

            run.native = Native("legacy", op, problem, (1, 2, 3, 4), algo=0)
            return run

    monkeypatch.setitem(registry._SOURCES, "recorder", Described())
    fwd = Executor(_unwritten_plan("forward", [4, 6], [5000, 512], [True, False]))
    steps = fwd.native_steps
    assert [tuple(s)[1:] for s in steps] == [((0, 0, 0), False, 4 * Y_SAMPLE, 5000),
                                              ((4 * X_SAMPLE, 0, 4 * Y_SAMPLE), False, -1, 512)]
    assert all(isinstance(s, NativeStep) and s.native.kind == "legacy" for s in steps)
    bwd = Executor(_unwritten_plan("backward_data", [3, 7], [0, 0], [True, False]))
    assert bwd.native_steps[0].from_out == 3 * X_SAMPLE
    bwf = Executor(_unwritten_plan("backward_filter", [8, 2], [1 << 20, 256], [True, False])).native_steps
    assert [(s.from_out, s.need) for s in bwf] == [(0, 1 << 20), (-1, 256)]
    plain = Executor(_unwritten_plan("backward_filter", [8, 2], [0, 256], [False, False])).native_steps
    assert [s.from_out for s in plain] == [-1, -1]


@pytest.mark.parametrize("kind, described", [("kernel", True), ("legacy", True), ("graph", True)])
def test_a_compiled_path_gets_accumulating_steps_where_their_description_can_add(monkeypatch, kind, described):
    """A micro-batched backward filter's later steps add into dw (beta 1): legacy launches and ucudnn's own kernels
    take beta as an argument, and a graph engine's step adds through scratch after its workspace
    (``graph.blend_of``), so the compiled path runs all three with the step's accumulate flag."""
    from ucudnn.measure.sources import registry
    from ucudnn.measure.sources.base import Native

    class Described(_Recorder):
        def prepare(self, op, problem, config):
            launch = super().prepare(op, problem, config)

            def run(*args):
                return launch(*args)

            run.native = Native(kind, op, problem)
            return run

    monkeypatch.setitem(registry._SOURCES, "recorder", Described())
    steps = Executor(_unwritten_plan("backward_filter", [8, 2], [0, 0], [False, False])).native_steps
    assert (steps is not None) is described
    if described:
        assert [s.accumulate for s in steps] == [False, True]
