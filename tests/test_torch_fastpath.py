"""ucudnn.torch's compiled launch path without a GPU: its C++ source compiles against the installed torch's
headers (no CUDA or cuDNN headers needed), it can be switched off, and CPU calls never reach it."""
from __future__ import annotations

import shutil

import pytest

torch = pytest.importorskip("torch")

from ucudnn.torch import fastpath  # noqa: E402


@pytest.fixture(scope="module")
def extension(tmp_path_factory):
    """The real extension, built and loaded as the first converted forward builds it (torch.utils.cpp_extension,
    its own build folder): on torch's CPU build too, since it needs no CUDA or cuDNN headers."""
    import os

    from torch.utils import cpp_extension

    if shutil.which("g++") is None or shutil.which("ninja") is None:
        pytest.skip("needs a C++ compiler and ninja")
    old = os.environ.get("TORCH_EXTENSIONS_DIR")
    os.environ["TORCH_EXTENSIONS_DIR"] = str(tmp_path_factory.mktemp("torch_extensions"))
    try:
        cpp_extension.load(name="ucudnn_torch_launch_test", sources=[str(fastpath.SOURCE)], extra_cflags=["-O2"],
                           extra_ldflags=["-ldl"], is_python_module=False, verbose=False)
    finally:
        if old is None:
            del os.environ["TORCH_EXTENSIONS_DIR"]
        else:
            os.environ["TORCH_EXTENSIONS_DIR"] = old
    return torch.ops.ucudnn_c


def test_the_extension_builds_against_torchs_headers_alone_and_declares_its_ops(extension):
    schemas = {n: str(getattr(extension, n).default._schema) for n in
               ("init", "legacy_launch", "backend_launch", "kernel_launch", "add_program", "add_layer", "stats",
                "py_launch", "conv2d")}
    assert schemas["conv2d"] == ("ucudnn_c::conv2d(Tensor x, Tensor weight, Tensor? bias, int layer, "
                                 "ScalarType? cast) -> Tensor")
    assert schemas["py_launch"] == "ucudnn_c::py_launch(int op, Tensor a, Tensor b, Tensor out, int py_layer) -> ()"
    assert list(extension.stats()) == [0] * 6          # launches made in C++ / handed to Python, per op


def test_the_registry_refuses_what_it_cannot_run_with_a_clear_error(extension):
    with pytest.raises(RuntimeError, match="not initialised"):
        extension.legacy_launch(0, 1, 2, 3, 4, 0, 0)     # no libcudnn bound yet
    with pytest.raises(RuntimeError, match="unknown program 5"):
        extension.add_layer([5, -1, -1], [1, 2, 3, 4], False, 0)
    with pytest.raises(RuntimeError, match="one program id per op"):
        extension.add_layer([-1, -1], [1, 2, 3, 4], False, 0)
    with pytest.raises(RuntimeError, match="optionally a backward filter's in dx"):
        extension.add_layer([-1, -1, -1, -1, -1], [1, 2, 3, 4], False, 0)
    with pytest.raises(RuntimeError, match="unknown program 9"):
        extension.add_layer([-1, -1, -1, 9], [1, 2, 3, 4], False, 0)
    with pytest.raises(RuntimeError, match="3 shifts, an accumulate flag and a workspace origin per step"):
        extension.add_program([0], [0, 0], [0], 0, [-1])
    with pytest.raises(RuntimeError, match="3 shifts, an accumulate flag and a workspace origin per step"):
        extension.add_program([0], [0, 0, 0], [0], 0, [])
    with pytest.raises(RuntimeError, match="cannot open /nonexistent/libcudnn.so"):
        extension.init("/nonexistent/libcudnn.so")
    with pytest.raises(RuntimeError, match="2 functions, an alignment mask and 7 dimensions per call"):
        extension.kernel_launch(0, 0, [1], [0], [1] * 7, [0], [], [], [])
    with pytest.raises(RuntimeError, match="one kind, int and float per kernel argument"):
        extension.kernel_launch(0, 0, [1, 0], [0], [1] * 7, [2], [0], [0], [0.0])
    with pytest.raises(RuntimeError, match="at most 32 arguments"):
        extension.kernel_launch(0, 0, [1, 0], [0], [1] * 7, [33], [0] * 33, [0] * 33, [0.0] * 33)


def test_own_kernels_register_through_the_cuda_driver_where_there_is_one(extension):
    """A kernel launch registers where libcuda.so.1 loads (it is never launched here); without a driver the
    registration says so, and Python keeps the op."""
    import ctypes

    args = (2, 0, [1234, 0], [3], [4, 1, 1, 256, 1, 1, 0], [3], [0, 1, 3], [0, 0, 0], [0.0, 0.0, 0.0])
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        with pytest.raises(RuntimeError, match="cannot open libcuda.so.1"):
            extension.kernel_launch(*args)
        return
    assert extension.kernel_launch(*args) >= 0
    with pytest.raises(RuntimeError, match="unknown kernel argument kind 9"):
        extension.kernel_launch(2, 0, [1234, 0], [0], [1] * 7, [1], [9], [0], [0.0])


def test_the_environment_switches_it_off(monkeypatch):
    monkeypatch.setattr(fastpath, "_state", "new")
    monkeypatch.setattr(fastpath, "_thread", None)
    monkeypatch.setenv("UCUDNN_TORCH_FASTPATH", "0")
    assert fastpath.start(wait=True) is False
    assert fastpath.state() == "off" and not fastpath.ready()


@pytest.mark.parametrize("value", ["1", "", "yes"])
def test_other_values_leave_it_on(monkeypatch, value):
    monkeypatch.setenv("UCUDNN_TORCH_FASTPATH", value)
    assert not fastpath.disabled_by_environment()


def test_cpu_calls_run_torch_without_asking_for_the_build(monkeypatch):
    import ucudnn.torch as ut

    asked = []
    monkeypatch.setattr(fastpath, "ready", lambda: asked.append(1) or False)
    conv = torch.nn.Conv2d(3, 4, 3)
    ours = ut.convert(torch.nn.Conv2d(3, 4, 3))
    ours.load_state_dict(conv.state_dict())
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(ours(x), conv(x))
    assert asked == []


# --- what Python hands the compiled path (fake extension: no build, no GPU) -----------------------------------
class _FakeC:
    """Records the registration calls ``register`` makes, as the C++ ops would receive them."""

    def __init__(self, fail: bool = False):
        self.calls, self.fail, self.next = [], fail, 7

    def _id(self):
        self.next += 1
        return self.next - 1

    def legacy_launch(self, *args):
        self.calls.append(("legacy", args))
        return self._id()

    def backend_launch(self, *args):
        if self.fail:
            raise RuntimeError("ucudnn: cudnnBackendFinalize(execution plan): CUDNN_STATUS_NOT_SUPPORTED\nmore")
        self.calls.append(("backend", args))
        return self._id()

    def add_program(self, *args):
        self.calls.append(("program", args))
        return 100

    def kernel_launch(self, *args):
        self.calls.append(("kernel", args))
        return self._id()


class _Executor:
    """What register reads of an executor: its steps as :class:`~ucudnn.execute.executor.NativeStep` s, as the real
    executor describes them (given here as tuples; None: no description)."""

    def __init__(self, steps):
        from ucudnn.execute.executor import NativeStep

        self.native_steps = None if steps is None else [NativeStep(*s) for s in steps]


class _Call:
    """A prepared call as register reads it: its executor's described steps, workspace, installed plan."""

    def __init__(self, steps, ws=4096, installed=None):
        self.executor, self.ws_bytes, self.installed = _Executor(steps), ws, installed


def _problem(layout="NHWC", dtype="float16", n=3):
    from ucudnn.problem import ConvProblem

    # 3 x 8 x 9 x 7 input, 12 filters of 8 x 3 x 5, pads (1, 2), stride (2, 1): non-square everything
    return ConvProblem(n, 8, 9, 7, 12, 3, 5, (1, 2), (2, 1), (1, 1), 1, dtype, layout)


@pytest.mark.parametrize("op", ["forward", "backward_data", "backward_filter"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_a_graph_plan_is_handed_over_as_its_engine_and_the_operands_in_the_ops_roles(monkeypatch, op, layout):
    from ucudnn.measure.sources.base import Native
    from ucudnn.measure.sources.graph import tensor_layout
    from ucudnn.problem import ROLES

    fake = _FakeC()
    monkeypatch.setattr(fastpath, "_c", fake)
    monkeypatch.setattr(fastpath, "_keep", [])
    p = _problem(layout)
    native = Native("graph", op, p, engine_id=28, knobs=((2, 3), (13, 1)), engine_bytes=8192)
    assert fastpath.register(op, _Call([(native, (0, 0, 0), False)], ws=4096), p, 0) == 100
    (kind, args), program = fake.calls
    lay = tensor_layout(p)
    a, b, o = (lay[r] for r in ROLES[op])
    assert kind == "backend"
    assert args == (fastpath.OPS.index(op), 2, a[0], a[1], b[0], b[1], o[0], o[1], [1, 2], [2, 1], [1, 1], 28,
                    [2, 13], [3, 1], 8192, 0, 0, 0, 0)   # float16 = cudnnDataType_t 2; the engine's own
    assert program == ("program", ([7], [0, 0, 0], [0], 4096, [-1]))   # workspace wins; no blend: no accumulation
    # the operand roles are cuDNN's: backward data reads w and dy into dx, backward filter x and dy into dw
    assert [r for r in ROLES[op]] == {"forward": ["x", "w", "y"], "backward_data": ["w", "y", "x"],
                                      "backward_filter": ["x", "y", "w"]}[op]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_an_accumulating_graph_step_is_handed_over_with_its_blend(monkeypatch, layout):
    """A micro-batched backward filter's later graph step adds into dw: the engine is built with beta 0, so its
    launch carries the graph source's blend (dw's descriptor, the scratch offset after the engine's own
    workspace, dw's bytes; ``graph.blend_of``) and the program's step says it accumulates; the first step has none."""
    from ucudnn.measure.sources import graph
    from ucudnn.measure.sources.base import Native

    fake = _FakeC()
    monkeypatch.setattr(fastpath, "_c", fake)
    monkeypatch.setattr(fastpath, "_keep", [])
    monkeypatch.setattr(graph, "_output_descriptor", lambda op, problem: 4242)   # no libcudnn on the CPU
    p = _problem(layout, "float32")
    first, rest = p.with_batch(2), p.with_batch(1)
    dw_bytes = 12 * 8 * 3 * 5 * 4
    steps = [(Native("graph", "backward_filter", first, engine_id=28, engine_bytes=1000), (0, 0, 0), False),
             (Native("graph", "backward_filter", rest, engine_id=28, engine_bytes=1000),
              (2 * 8 * 9 * 7 * 4, 2 * 12 * 5 * 7 * 4, 0), True)]
    assert fastpath.register("backward_filter", _Call(steps, ws=1024 + dw_bytes), p, 0) == 100
    (_, a1), (_, a2), program = fake.calls
    # (workspace, device, blend descriptor, scratch offset, output bytes)
    assert a1[-5:] == (1024 + dw_bytes, 0, 0, 0, 0) and a2[-5:] == (1024 + dw_bytes, 0, 4242, 1024, dw_bytes)
    assert program == ("program", ([7, 8], [0, 0, 0, 4032, 3360, 0], [0, 1], 1024 + dw_bytes, [-1, -1]))
    assert graph.blend_of("forward", p, 1000) is None      # a forward never accumulates


def test_a_micro_batched_legacy_plan_is_one_program_of_its_steps_and_keeps_their_descriptors(monkeypatch):
    from ucudnn.measure.sources.base import Native

    fake = _FakeC()
    keeps = [object(), object()]
    monkeypatch.setattr(fastpath, "_c", fake)
    monkeypatch.setattr(fastpath, "_keep", [])
    p = _problem("NCHW", "float32")
    big, tail = p.with_batch(2), p.with_batch(1)
    steps = [(Native("legacy", "backward_filter", big, (11, 12, 13, 14), algo=5, keep=keeps[0]), (0, 0, 0), False),
             (Native("legacy", "backward_filter", tail, (21, 22, 23, 24), algo=1, keep=keeps[1]),
              (2 * 8 * 9 * 7 * 4, 2 * 12 * 5 * 7 * 4, 0), True)]     # the second micro-batch adds into dw
    call = _Call(steps, ws=1 << 20)
    assert fastpath.register("backward_filter", call, p, 0) == 100
    assert fake.calls == [("legacy", (2, 11, 12, 13, 14, 5, 1 << 20)), ("legacy", (2, 21, 22, 23, 24, 1, 1 << 20)),
                          ("program", ([7, 8], [0, 0, 0, 4032, 3360, 0], [0, 1], 1 << 20, [-1, -1]))]
    assert fastpath._keep == [(keeps, call)]          # the descriptors' owners live as long as the launches


@pytest.mark.parametrize("refused", [False, True])
def test_a_legacy_step_with_a_graph_twin_launches_the_twin_unless_it_accumulates_or_the_twin_is_refused(
        monkeypatch, refused):
    """A legacy transform-domain configuration carries its graph-API twin (``Native.twin``, the engine cuDNN runs
    it as): a step that writes its output launches the twin (less host work a call); a step that adds into
    earlier steps' output keeps the legacy call (cuDNN's beta, no scratch); a twin the extension refuses leaves
    the legacy call, not the Python path."""
    from ucudnn.measure.sources.base import Native

    fake = _FakeC(fail=refused)
    monkeypatch.setattr(fastpath, "_c", fake)
    monkeypatch.setattr(fastpath, "_keep", [])
    p = _problem("NCHW", "float32")
    big, tail = p.with_batch(2), p.with_batch(1)
    twin = Native("graph", "backward_filter", big, engine_id=17, engine_bytes=4096)
    steps = [(Native("legacy", "backward_filter", big, (11, 12, 13, 14), algo=5, twin=twin), (0, 0, 0), False),
             (Native("legacy", "backward_filter", tail, (21, 22, 23, 24), algo=5,
                     twin=Native("graph", "backward_filter", tail, engine_id=17, engine_bytes=4096)),
              (2 * 8 * 9 * 7 * 4, 2 * 12 * 5 * 7 * 4, 0), True)]
    assert fastpath.register("backward_filter", _Call(steps, ws=4096), p, 0) == 100
    kinds = [k for k, _ in fake.calls]
    assert kinds == (["legacy", "legacy", "program"] if refused else ["backend", "legacy", "program"])
    if not refused:
        assert fake.calls[0][1][11] == 17                  # the twin's engine id


@pytest.mark.parametrize("why", ["no description", "installed plan"])
def test_what_the_compiled_path_does_not_run_stays_with_python(monkeypatch, why):
    from ucudnn.measure.sources.base import Native

    fake = _FakeC()
    monkeypatch.setattr(fastpath, "_c", fake)
    p = _problem()
    steps = None if why == "no description" else [(Native("graph", "forward", p, engine_id=1), (0, 0, 0), False)]
    call = _Call(steps, installed=object() if why == "installed plan" else None)
    assert fastpath.register("forward", call, p, 0) == -1
    assert fake.calls == []


def test_a_configuration_cudnn_refuses_to_rebuild_stays_with_python_and_says_why_once(monkeypatch, caplog):
    from ucudnn.measure.sources.base import Native
    from ucudnn.torch import runtime

    monkeypatch.setattr(fastpath, "_c", _FakeC(fail=True))
    monkeypatch.setattr(runtime, "_logged", set())
    p = _problem()
    call = _Call([(Native("graph", "forward", p, engine_id=3), (0, 0, 0), False)])
    with caplog.at_level("WARNING", logger="ucudnn.torch"):
        assert fastpath.register("forward", call, p, 0) == -1
        assert fastpath.register("forward", call, p, 0) == -1
    said = [r.getMessage() for r in caplog.records if "runs the Python path" in r.getMessage()]
    assert len(said) == 1 and "CUDNN_STATUS_NOT_SUPPORTED" in said[0] and "more" not in said[0]


def test_an_unchanged_prepared_call_reuses_its_program_and_a_new_one_gets_its_own(monkeypatch):
    """Entries are remade at every plan change anywhere (``api.generation``); calls that did not change keep their
    compiled programs, refusals included, so nothing is rebuilt for them."""
    from ucudnn.measure.sources.base import Native

    fake = _FakeC()
    monkeypatch.setattr(fastpath, "_c", fake)
    monkeypatch.setattr(fastpath, "_keep", [])
    monkeypatch.setattr(fastpath, "_programs", {})
    p = _problem()
    call = _Call([(Native("graph", "forward", p, engine_id=4), (0, 0, 0), False)])
    assert fastpath.register("forward", call, p, 0) == 100
    assert fastpath.register("forward", call, p, 0) == 100
    assert [k for k, _ in fake.calls] == ["backend", "program"]          # built once
    replaced = _Call([(Native("graph", "forward", p, engine_id=5), (0, 0, 0), False)])
    assert fastpath.register("forward", replaced, p, 0) == 100
    assert [k for k, _ in fake.calls] == ["backend", "program"] * 2      # a new plan is built
    none = _Call(None)
    assert fastpath.register("forward", none, p, 0) == -1
    assert fastpath._programs[id(none)] == (none, -1)


def test_a_step_on_unwritten_memory_is_registered_with_its_own_need_and_where_its_workspace_starts(monkeypatch):
    """A forward plan whose first micro-batch borrows the later samples' output (issue 18): its launch is built
    for what it needs (not the call's buffer, which it does not use), and the program says where in y its
    workspace starts (-1: the buffer)."""
    from ucudnn.execute.executor import NativeStep
    from ucudnn.measure.sources.base import Native

    fake = _FakeC()
    monkeypatch.setattr(fastpath, "_c", fake)
    monkeypatch.setattr(fastpath, "_keep", [])
    p = _problem("NCHW", "float32", n=3)
    big, tail = p.with_batch(2), p.with_batch(1)
    y_sample = 12 * 5 * 7 * 4
    steps = [NativeStep(Native("legacy", "forward", big, (11, 12, 13, 14), algo=5), (0, 0, 0), False,
                        2 * y_sample, 9000),
             NativeStep(Native("legacy", "forward", tail, (21, 22, 23, 24), algo=1), (2 * 8 * 9 * 7 * 4, 0,
                                                                                     2 * y_sample), False, -1, 512)]
    assert fastpath.register("forward", _Call(steps, ws=512), p, 0) == 100
    assert fake.calls == [("legacy", (0, 11, 12, 13, 14, 5, 9000)), ("legacy", (0, 21, 22, 23, 24, 1, 512)),
                          ("program", ([7, 8], [0, 0, 0, 4032, 0, 2 * y_sample], [0, 0], 512, [2 * y_sample, -1]))]



def test_a_backward_filter_that_borrows_dx_is_registered_apart_and_only_where_its_plan_borrows(monkeypatch):
    """With ``UCUDNN_UNWRITTEN`` a layer's backward filter may take workspace from its dx before backward data
    writes it (launch.cpp's Conv::backward runs it first): that plan is prepared with the layer's dw settings and
    registered as its own program, its borrowing steps saying workspace from 0 bytes into the lent buffer; a plan
    that borrows nothing is not registered again (-1: the plain backward filter runs)."""
    import contextlib
    import dataclasses
    from types import SimpleNamespace

    from ucudnn.measure.sources.base import Native
    from ucudnn.torch import runtime

    fake = _FakeC()
    monkeypatch.setattr(fastpath, "_c", fake)
    monkeypatch.setattr(fastpath, "_keep", [])
    monkeypatch.setattr(fastpath, "_programs", {})
    monkeypatch.setattr(runtime, "_shared", True)
    device = SimpleNamespace(Device=lambda d: contextlib.nullcontext())
    monkeypatch.setattr(runtime, "_cp", SimpleNamespace(cuda=device))
    monkeypatch.setattr(runtime, "cupy_stream", lambda d: contextlib.nullcontext())
    p = _problem("NCHW", "float32", n=3)
    borrows = {"yes": True}
    asked = []

    def prepared(op, problem, settings, numerics, device):
        asked.append((op, settings.dx_unwritten))
        step = (Native("legacy", op, problem, (11, 12, 13, 14), algo=3), (0, 0, 0), False,
                0 if settings.dx_unwritten else -1, 70000)
        call = _Call([step], ws=512)
        call.executor.takes_unwritten = settings.dx_unwritten and borrows["yes"]
        return call

    monkeypatch.setattr(runtime, "prepared", prepared)
    settings = runtime.Settings(512)
    layer = SimpleNamespace(problem=p, settings=settings,
                            dw_settings=dataclasses.replace(settings, dx_unwritten=True))
    assert fastpath._launch_id("backward_filter", layer, "strict", 0, borrowing=True) == 100
    assert asked == [("backward_filter", True)]
    assert fake.calls == [("legacy", (2, 11, 12, 13, 14, 3, 70000)), ("program", ([7], [0, 0, 0], [0], 512, [0]))]
    borrows["yes"] = False
    fake.calls.clear()
    assert fastpath._launch_id("backward_filter", layer, "strict", 0, borrowing=True) == -1
    assert fake.calls == []


def test_own_kernels_are_handed_over_as_their_calls_flattened(monkeypatch):
    """ucudnn's own kernels (``Native`` kind "kernel": ``kernels._compile.Call`` s) reach the C++ registry as each
    call's CUDA functions (scalar, vector or 0), the operands its vector function needs aligned (bits a 1, b 2,
    out 4), grid, block, shared memory, and its arguments: operands and alpha / beta by role, fixed values typed."""
    import numpy as np
    from ucudnn.kernels._compile import Call

    from ucudnn.measure.sources.base import Native

    class Fn:
        def __init__(self, ptr):
            self.kernel = type("F", (), {"ptr": ptr})()

    fake = _FakeC()
    monkeypatch.setattr(fastpath, "_c", fake)
    monkeypatch.setattr(fastpath, "_keep", [])
    p = _problem("NHWC", "float32")
    scale = Call(Fn(11), None, (), (3, 1, 1), (256, 1, 1), 0, ("out", np.int32(96), "beta"))
    sums = Call(Fn(21), Fn(22), ("a", "b"), (528, 3, 1), (224, 1, 1), 37376,
                ("a", "b", "out", np.int32(96), np.int64(1 << 40), np.float32(0.5), "alpha"))
    keep = object()
    steps = [(Native("kernel", "backward_filter", p, calls=(scale, sums), keep=keep), (0, 0, 0), False),
             (Native("kernel", "backward_filter", p, calls=(scale, sums), keep=keep), (64, 128, 0), True)]
    assert fastpath.register("backward_filter", _Call(steps, ws=0), p, 0) == 100
    (k1, args), (k2, _), program = fake.calls
    assert k1 == k2 == "kernel"
    assert args == (2, 0, [11, 0, 21, 22], [0, 3], [3, 1, 1, 256, 1, 1, 0, 528, 3, 1, 224, 1, 1, 37376], [3, 7],
                    [2, 5, 4, 0, 1, 2, 5, 6, 7, 3], [0, 96, 0, 0, 0, 0, 96, 1 << 40, 0, 0],
                    [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.0])
    assert program == ("program", ([7, 8], [0, 0, 0, 64, 128, 0], [0, 1], 0, [-1, -1]))
    assert fastpath._keep[-1][0] == [keep, keep]       # the launchers (and their loaded modules) stay alive


def test_a_converted_layers_weight_and_bias_are_read_as_its_attributes_would_give_them():
    """``fastpath.params`` reads the parameter dict (``nn.Module.__getattr__`` is most of the module's Python per
    call) only where that is what ``m.weight`` / ``m.bias`` are: not under a parametrization, not under an
    old-style weight norm that keeps ``weight`` outside the dict."""
    import warnings

    from torch.nn.utils import parametrize

    import ucudnn.torch as ut
    from ucudnn.torch.modules import Conv2d

    plain = ut.convert(torch.nn.Conv2d(3, 4, 3))
    w, b = fastpath.params(plain, Conv2d)
    assert w is plain.weight and b is plain.bias
    nobias = ut.convert(torch.nn.Conv2d(3, 4, 3, bias=False))
    assert fastpath.params(nobias, Conv2d) == (nobias.weight, None)

    class Double(torch.nn.Module):
        def forward(self, x):
            return 2 * x

    para = ut.convert(torch.nn.Conv2d(3, 4, 3))
    parametrize.register_parametrization(para, "weight", Double())
    w, b = fastpath.params(para, Conv2d)
    assert torch.equal(w, para.weight) and torch.equal(w, 2 * para.parametrizations.weight.original)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        normed = torch.nn.utils.weight_norm(ut.convert(torch.nn.Conv2d(3, 4, 3)))
    normed(torch.randn(1, 3, 5, 5))                       # its pre-hook sets weight from g and v
    w, _ = fastpath.params(normed, Conv2d)
    assert w is normed.weight


def test_switching_cudnn_off_after_a_call_sends_the_next_calls_to_torch(monkeypatch):
    """``torch.backends.cudnn.enabled`` is part of a compiled entry's key: with it off, the next call makes a new
    entry (which the Python path's checks refuse: torch runs it, as it would a plain ``nn.Conv2d``)."""
    import types

    import ucudnn.torch as ut
    from ucudnn.torch import ops

    made = []

    def entry(m, x, w, dt, key, grad):
        made.append(torch.backends.cudnn.enabled)
        return ops.remember(m._ucudnn_layers, key, (0, 1 if torch.backends.cudnn.enabled else None))

    monkeypatch.setattr(fastpath, "_api", types.SimpleNamespace(generation=0))
    monkeypatch.setattr(fastpath, "_conv2d", lambda x, w, b, layer, cast: "compiled")
    monkeypatch.setattr(fastpath, "_entry", entry)
    m = ut.convert(torch.nn.Conv2d(3, 4, 3))
    x = torch.randn(1, 3, 5, 5)
    with torch.backends.cudnn.flags(enabled=True):
        assert fastpath.forward(m, x, m.weight, m.bias) == "compiled"
        assert fastpath.forward(m, x, m.weight, m.bias) == "compiled" and made == [True]
    with torch.backends.cudnn.flags(enabled=False):
        assert fastpath.forward(m, x, m.weight, m.bias) is None
    assert made == [True, False]
