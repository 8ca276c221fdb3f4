"""ucudnn.torch on CPU: conversion keeps a model what it was, bad settings fail like nn.Conv2d's, the custom ops
trace under torch.compile and make_fx with fake tensors, and what ucudnn cannot run goes through torch."""
from __future__ import annotations

import copy
import logging

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import ucudnn.torch as ut  # noqa: E402
from ucudnn.errors import InputError  # noqa: E402
from ucudnn.torch import runtime  # noqa: E402


def small_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, (3, 5), stride=2, padding="valid", bias=False),
        nn.Conv2d(8, 8, 3, padding="same", groups=8),      # depthwise
        nn.Sequential(nn.Conv2d(8, 4, 1, dilation=2)),
    )


def test_convert_keeps_every_parameter_object_the_state_dict_and_the_repr():
    model = small_cnn()
    params = [id(p) for p in model.parameters()]
    state = copy.deepcopy(model.state_dict())
    text = repr(model)
    assert ut.convert(model, workspace_limit="8MiB") is model
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 4 and all(type(m) is ut.Conv2d for m in convs)
    assert [id(p) for p in model.parameters()] == params
    assert repr(model) == text
    after = model.state_dict()
    assert list(after) == list(state) and all(torch.equal(after[k], state[k]) for k in state)
    assert all(m.workspace_limit == 8 << 20 for m in convs)


def test_revert_gives_back_plain_conv2d_layers_with_the_same_parameters():
    model = small_cnn()
    params = [id(p) for p in model.parameters()]
    ut.revert(ut.convert(model))
    assert all(type(m) is nn.Conv2d for m in model.modules() if isinstance(m, nn.Conv2d))
    assert [id(p) for p in model.parameters()] == params
    assert not any(hasattr(m, "workspace_limit") for m in model.modules())


def test_optimizer_state_survives_a_convert():
    model = small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 3, 16, 16)).sum().backward()
    opt.step()
    ut.convert(model)
    assert all(p in opt.state for p in model.parameters() if p.grad is not None)
    model(torch.randn(2, 3, 16, 16)).sum().backward()
    opt.step()   # same Parameter objects: the momentum buffers keep working


def test_a_checkpoint_saved_before_convert_loads_after_it_and_back(tmp_path):
    model = small_cnn()
    torch.save(model.state_dict(), tmp_path / "ck.pt")
    converted = ut.convert(small_cnn())
    converted.load_state_dict(torch.load(tmp_path / "ck.pt"))
    torch.save(converted.state_dict(), tmp_path / "ck2.pt")
    plain = small_cnn()
    plain.load_state_dict(torch.load(tmp_path / "ck2.pt"))
    x = torch.randn(2, 3, 16, 16)
    model.eval(), plain.eval()
    assert torch.equal(model(x), plain(x))


def test_ddp_trains_converted_models_as_it_trains_the_plain_one(tmp_path):
    """Two CPU processes over gloo: converted before DDP wraps it or inside the wrapper, a model ends where the
    plain one ends, every rank alike, and its checkpoint loads into a plain DDP model (``_torch_ddp``)."""
    import torch.multiprocessing as mp

    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("this torch has no gloo backend")
    from _torch_ddp import spawned

    mp.spawn(spawned, args=(2, str(tmp_path / "store")), nprocs=2, join=True)


def test_subclasses_of_conv2d_and_other_convolutions_are_left_alone():
    class MyConv(nn.Conv2d):
        def forward(self, x):
            return super().forward(x) * 2

    model = nn.Sequential(MyConv(3, 3, 1), nn.Conv1d(3, 3, 1), nn.ConvTranspose2d(3, 3, 2), nn.Conv3d(3, 3, 1))
    ut.convert(model)
    assert [type(m) for m in model] == [MyConv, nn.Conv1d, nn.ConvTranspose2d, nn.Conv3d]


def test_the_constructor_is_nn_conv2ds_plus_ucudnns_settings():
    m = ut.Conv2d(3, 16, (3, 5), stride=(2, 1), padding=(1, 2), dilation=1, groups=1, bias=False,
                  padding_mode="zeros", workspace_limit="16MiB", batch_policy="powerOfTwo", sources="legacy",
                  replay=True)
    assert m.weight.shape == (16, 3, 3, 5) and m.bias is None
    assert (m.workspace_limit, m.batch_policy, m.sources, m.replay) == (16 << 20, "powerOfTwo", "legacy", True)
    assert repr(m) == repr(nn.Conv2d(3, 16, (3, 5), stride=(2, 1), padding=(1, 2), bias=False))


@pytest.mark.parametrize("args, kwargs", [
    ((3, 8, 3), {"groups": 2}),                       # in_channels not divisible by groups
    ((3, 8, 3), {"padding": "same", "stride": 2}),    # 'same' with stride
    ((3, 8, 3), {"padding": "full"}),
    ((3, 8, 3), {"padding_mode": "mirror"}),
])
def test_construction_errors_are_nn_conv2ds_errors(args, kwargs):
    with pytest.raises(ValueError) as plain:
        nn.Conv2d(*args, **kwargs)
    with pytest.raises(type(plain.value)) as ours:
        ut.Conv2d(*args, **kwargs)
    assert str(ours.value) == str(plain.value)


@pytest.mark.parametrize("kwargs, field", [
    ({"workspace_limit": "lots"}, "workspace_limit"), ({"workspace_limit": -1}, "workspace_limit"),
    ({"batch_policy": "fibonacci"}, "batch_policy"), ({"sources": "legacy,cudnn9"}, "sources"),
    ({"replay": "yes"}, "replay"),
])
def test_bad_ucudnn_settings_name_their_field_and_leave_the_model_unchanged(kwargs, field):
    with pytest.raises(InputError) as e:
        ut.Conv2d(3, 8, 3, **kwargs)
    assert e.value.field == field
    model = small_cnn()
    with pytest.raises(InputError):
        ut.convert(model, **kwargs)
    assert all(type(m) is nn.Conv2d for m in model.modules() if isinstance(m, nn.Conv2d))


def test_convert_refuses_what_is_not_a_module():
    with pytest.raises(InputError) as e:
        ut.convert("resnet50")
    assert e.value.field == "model"


def test_what_ucudnn_cannot_run_goes_through_torch_with_the_reason_logged_once_per_layer(caplog):
    torch.manual_seed(1)
    plain = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"), nn.Conv2d(4, 4, 4, padding="same"),
                          nn.Conv2d(4, 2, 1)).double()
    model = ut.convert(copy.deepcopy(plain))
    x = torch.randn(3, 3, 9, 9, dtype=torch.float64)
    with caplog.at_level(logging.WARNING, logger="ucudnn.torch"):
        for _ in range(3):
            assert torch.equal(model(x), plain(x))
    reasons = [r.getMessage() for r in caplog.records]
    assert len(reasons) == 3, reasons                 # one per layer, not one per call
    assert all("cpu tensors" in r for r in reasons)


def test_unsupported_reasons_name_the_cause():
    m = ut.Conv2d(3, 3, 3, padding_mode="circular")
    x = torch.randn(1, 3, 8, 8)
    assert m._unsupported(x) == "cpu tensors"
    assert ut.Conv2d(3, 3, 2, padding="same")._unsupported(x) is not None


def test_numerics_follow_torchs_switches():
    tf32, det = torch.backends.cudnn.allow_tf32, torch.are_deterministic_algorithms_enabled()
    try:
        torch.backends.cudnn.allow_tf32 = False
        assert runtime.numerics_for(torch.float32) == "strict"
        torch.backends.cudnn.allow_tf32 = True
        assert runtime.numerics_for(torch.float32) == "tf32"
        assert runtime.numerics_for(torch.float16) == "default"
        torch.use_deterministic_algorithms(True)
        assert runtime.numerics_for(torch.float32) == "tf32-deterministic"
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
        torch.use_deterministic_algorithms(det)


def test_channels_last_inputs_run_the_nhwc_plans_and_contiguous_ones_the_nchw_plans():
    x = torch.randn(2, 3, 8, 8)
    assert runtime.layout_of(x) == "NCHW"
    assert runtime.layout_of(x.to(memory_format=torch.channels_last)) == "NHWC"
    # C = 1: both layouts hold; the strides say which was asked for, as PyTorch decides
    assert runtime.layout_of(torch.randn(2, 1, 8, 8).to(memory_format=torch.channels_last)) == "NHWC"
    assert runtime.layout_of(torch.randn(2, 1, 8, 8)) == "NCHW"
    # a channels_last weight makes the convolution NHWC, as in PyTorch's cuDNN path
    assert runtime.layout_of(x, torch.randn(4, 3, 3, 3).to(memory_format=torch.channels_last)) == "NHWC"


def _op(x, w, layout):
    return torch.ops.ucudnn.conv2d(x, w, [2, 1], [1, 2], [1, 1], 1, layout, "strict", 1 << 26, "", "", False)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_the_fake_implementations_give_shapes_strides_and_gradients_under_make_fx(layout):
    from torch.fx.experimental.proxy_tensor import make_fx

    fmt = runtime.memory_format(layout)
    x = torch.randn(3, 4, 9, 10).to(memory_format=fmt).requires_grad_()
    w = torch.randn(6, 4, 3, 5).requires_grad_()
    expected = torch.nn.functional.conv2d(x, w, stride=(2, 1), padding=(1, 2))
    seen = {}

    def step(x, w):
        y = _op(x, w, layout)
        seen["y"] = (tuple(y.shape), y.is_contiguous(memory_format=fmt))
        dx, dw = torch.autograd.grad(y.sum(), (x, w))
        seen["grads"] = (tuple(dx.shape), tuple(dw.shape))
        return dx, dw

    graph = make_fx(step, tracing_mode="fake")(x, w)
    assert seen == {"y": (tuple(expected.shape), True), "grads": ((3, 4, 9, 10), (6, 4, 3, 5))}
    code = graph.code
    assert "ucudnn.conv2d.default" in code and "conv2d_backward_data" in code and "conv2d_backward_filter" in code


def test_only_the_gradients_autograd_needs_are_computed():
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(x, w):
        return torch.autograd.grad(_op(x, w, "NCHW").sum(), (w,))

    code = make_fx(step, tracing_mode="fake")(torch.randn(2, 4, 8, 8), torch.randn(3, 4, 3, 3).requires_grad_()).code
    assert "conv2d_backward_filter" in code and "conv2d_backward_data" not in code


def test_torch_compile_traces_the_op_in_one_graph_without_a_break():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return lambda *args: [torch.zeros(3, 6, 5, 10)]   # the real op needs a GPU: only the trace is checked here

    f = torch.compile(lambda x, w: _op(x, w, "NCHW"), backend=backend, fullgraph=True)
    f(torch.randn(3, 4, 9, 10), torch.randn(6, 4, 3, 5))
    assert len(graphs) == 1
    assert any("ucudnn.conv2d" in str(n.target) for n in graphs[0].graph.nodes)


def test_the_module_path_traces_the_custom_op_under_compile_and_runs_the_same_implementation_eagerly(monkeypatch):
    from ucudnn.torch import ops

    args = ([2, 1], [1, 2], [1, 1], 1, "NCHW", "strict", 1 << 26, "", "", False)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return lambda *a: [torch.zeros(3, 6, 5, 10)]

    torch.compile(lambda x, w: ops.conv2d_any(x, w, *args), backend=backend, fullgraph=True)(
        torch.randn(3, 4, 9, 10), torch.randn(6, 4, 3, 5))
    assert any("ucudnn.conv2d" in str(n.target) for n in graphs[0].graph.nodes)

    # eagerly: no custom-op dispatch; on a CPU ucudnn cannot run, so the implementation's fallback answers,
    # and the result and both gradients are nn.functional.conv2d's
    monkeypatch.setattr(ops, "conv2d", lambda *a: pytest.fail("eager calls must not dispatch the custom op"))
    x = torch.randn(3, 4, 9, 10, requires_grad=True)
    w = torch.randn(6, 4, 3, 5, requires_grad=True)
    y = ops.conv2d_any(x, w, *args)
    y.square().sum().backward()
    xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
    ref = torch.nn.functional.conv2d(xr, wr, stride=(2, 1), padding=(1, 2))
    ref.square().sum().backward()
    torch.testing.assert_close(y, ref)
    torch.testing.assert_close(x.grad, xr.grad)
    torch.testing.assert_close(w.grad, wr.grad)


def test_the_eager_path_computes_only_the_gradients_autograd_needs(monkeypatch):
    from ucudnn.torch import ops

    asked = []
    real = ops._backward
    monkeypatch.setattr(ops, "_backward", lambda which, *a: asked.append(which) or real(which, *a))
    x = torch.randn(2, 4, 8, 8)                      # a first layer: no dx wanted
    w = torch.randn(3, 4, 3, 3, requires_grad=True)
    ops.conv2d_any(x, w, [1, 1], [1, 1], [1, 1], 1, "NCHW", "strict", 1 << 26, "", "", False).sum().backward()
    assert asked == ["dw"] and w.grad is not None


def test_plan_needs_converted_layers_and_a_known_policy():
    with pytest.raises(InputError) as e:
        ut.plan(small_cnn(), torch.randn(1, 3, 8, 8))
    assert e.value.field == "model"
    with pytest.raises(InputError) as e:
        ut.plan(ut.convert(small_cnn()), torch.randn(1, 3, 8, 8), policy="fastest")
    assert e.value.field == "policy"
    with pytest.raises(InputError) as e:
        ut.plan(ut.convert(small_cnn()), torch.randn(1, 3, 8, 8), policy="wd")
    assert e.value.field == "total_workspace"


def test_the_core_never_imports_torch():
    import subprocess
    import sys

    code = ("import sys, ucudnn, ucudnn.api, ucudnn.execute, ucudnn.measure, ucudnn.catalog.lookup, ucudnn.cli\n"
            "print('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def test_a_prepared_call_is_trusted_only_while_the_lookup_chain_holds_its_executor(monkeypatch):
    """The launch path keeps one prepared call per kernel (runtime._Call); it must notice every way the executor
    the lookup chain would give changes: heuristic mode swapping in the measured plan's executor, a plan
    installed by ucudnn.torch.plan (or removed), an executor the in-process cache does not hold."""
    import ucudnn.api as api
    from ucudnn.problem import ConvProblem

    p = ConvProblem(2, 3, 8, 8, 4, 3, 3, (1, 1))
    cache: dict = {}
    monkeypatch.setattr(api, "_executors", cache)
    monkeypatch.setattr(runtime, "installed", {})
    monkeypatch.setattr(runtime, "executor", lambda problem, op, settings, numerics, device: cache[("key",)])
    monkeypatch.setattr(runtime, "_api", api)

    def call():
        return runtime._Call(p, "forward", runtime.Settings(1 << 26), "strict", 0)

    fake = type("Executor", (), {"workspace_bytes": 0})
    first, swapped = fake(), fake()
    cache[("key",)] = first
    c = call()
    assert c.mem_key == ("key",) and c.current() and (c.ws_ptr, c.ws_size, c.ws_bytes) == (0, 0, 0)
    cache[("key",)] = swapped                      # heuristic mode: the background benchmark's executor
    assert not c.current()
    c = call()
    assert c.executor is swapped and c.current()
    runtime.installed[(0, p, "forward")] = runtime.Installed("installed plan", workspace_ptr=4096, workspace_size=64)
    assert not c.current()                         # an installed plan wins over the cached executor
    monkeypatch.setattr(runtime, "executor", lambda *a: runtime.installed[(0, p, "forward")].executor)
    wd = call()
    assert wd.executor == "installed plan" and (wd.ws_ptr, wd.ws_size, wd.ws_bytes) == (4096, 64, 0) and wd.current()
    assert wd.workspace() == (None, 4096, 64)       # the arena's segment: nothing allocated per launch
    runtime.installed.clear()
    assert c.current() and not wd.current()
    c.mem_key = None                               # an executor the in-process cache does not hold
    assert not c.current()


def test_a_prepared_calls_key_follows_the_environment_its_defaulted_settings_read(monkeypatch):
    monkeypatch.delenv("UCUDNN_SOURCES", raising=False)
    monkeypatch.delenv("UCUDNN_CHANNEL_POLICY", raising=False)
    monkeypatch.delenv("UCUDNN_UNWRITTEN", raising=False)
    monkeypatch.setenv("UCUDNN_BATCH_SIZE_POLICY", "all")
    defaulted, explicit = runtime.Settings(1 << 26), runtime.Settings(1 << 26, "powerOfTwo", "legacy")
    assert runtime._defaults_env(defaulted) == ("all", None, None, None)
    assert runtime._defaults_env(explicit) == (None, None, None, None)
    monkeypatch.setenv("UCUDNN_SOURCES", "legacy,graph")
    assert runtime._defaults_env(defaulted) == ("all", "legacy,graph", None, None)
    assert runtime._defaults_env(explicit) == (None, None, None, None)
    monkeypatch.setenv("UCUDNN_CHANNEL_POLICY", "halves")    # no layer setting names it: always the environment's
    assert runtime._defaults_env(explicit) == (None, None, "halves", None)
    monkeypatch.setenv("UCUDNN_UNWRITTEN", "0")              # likewise
    assert runtime._defaults_env(explicit) == (None, None, "halves", "0")


def test_prepared_calls_are_found_by_identity_and_by_equality_and_still_follow_currency_and_environment(monkeypatch):
    """runtime.prepared's identity cache answers only for the very objects it saw; an equal problem object
    finds the same call through the equality-keyed cache; a call no longer current, or a change of an
    environment default, prepares a new one."""
    from ucudnn.problem import ConvProblem

    made = []

    class FakeCall:
        def __init__(self, problem, op, settings, numerics, device):
            made.append((problem, op))
            self.ok = True

        def current(self):
            return self.ok

    monkeypatch.setattr(runtime, "_Call", FakeCall)
    monkeypatch.setattr(runtime, "_calls", {})
    monkeypatch.setattr(runtime, "_by_id", {})
    monkeypatch.delenv("UCUDNN_SOURCES", raising=False)
    p, s = ConvProblem(2, 3, 8, 8, 4, 3, 3, (1, 1)), runtime.Settings(1 << 26)
    first = runtime.prepared("forward", p, s, "strict", 0)
    assert runtime.prepared("forward", p, s, "strict", 0) is first and len(made) == 1
    twin = ConvProblem(2, 3, 8, 8, 4, 3, 3, (1, 1))            # equal, another object
    assert runtime.prepared("forward", twin, s, "strict", 0) is first and len(made) == 1
    assert runtime.prepared("backward_data", p, s, "strict", 0) is not first and len(made) == 2
    first.ok = False                                          # e.g. heuristic mode swapped the executor
    again = runtime.prepared("forward", p, s, "strict", 0)
    assert again is not first and len(made) == 3 and runtime.prepared("forward", twin, s, "strict", 0) is again
    monkeypatch.setenv("UCUDNN_SOURCES", "legacy")             # a defaulted setting's environment changed
    assert runtime.prepared("forward", p, s, "strict", 0) is not again and len(made) == 4
    runtime.forget_prepared()
    assert not runtime._calls and not runtime._by_id


def test_a_layers_problem_and_settings_are_the_same_objects_on_every_call():
    from ucudnn.torch import ops

    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    args = ([1, 1], [1, 1], [1, 1], 1, "NCHW", 1 << 26, "", "", False)
    layer = ops._layer(x, w, *args)
    again = ops._layer(torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3), *args)
    assert again is layer and again.problem is layer.problem and again.settings is layer.settings
    assert layer.problem == runtime.problem_of(x.shape, w.shape, (1, 1), (1, 1), (1, 1), 1, torch.float32, "NCHW")
    assert layer.settings == runtime.Settings(1 << 26)
    assert layer.y_shape == (2, 4, 8, 8) and layer.fmt == torch.contiguous_format
    assert layer.args("strict") == ([1, 1], [1, 1], [1, 1], 1, "NCHW", "strict", 1 << 26, "", "", False)
    assert ops._layer(torch.randn(3, 3, 8, 8), w, *args).problem.n == 3


def test_a_prepared_one_step_call_runs_through_its_shortcut_on_torchs_stream_else_through_the_full_launch(
        monkeypatch):
    """runtime.launch: a ready call whose executor has a shortcut (sources.base.Direct) runs it on the tensors'
    pointers, the call's workspace and torch's current stream, with no CuPy context; when the shortcut declines
    (False) or torch's current device is not the tensors', the full launch runs inside CuPy's contexts."""
    import contextlib

    log = []

    class T:
        def __init__(self, ptr):
            self.ptr = ptr

        def get_device(self):
            return 0

        def data_ptr(self):
            return self.ptr

    answer = [True]

    class Call:
        def workspace(self):        # an installed plan's arena segment: nothing to keep alive
            return None, 4096, 64

        def direct(self, *args):
            log.append(("direct", *args))
            return answer[0]

        def run(self, a, b, out, unwritten=None):
            log.append(("run", a.ptr, b.ptr, out.ptr))

    call = Call()
    contexts = []
    fake_cp = type("cp", (), {"cuda": type("cuda", (), {"Device": lambda d: contexts.append(d) or
                                                        contextlib.nullcontext()})})
    monkeypatch.setattr(runtime, "_shared", True)
    monkeypatch.setattr(runtime, "_cp", fake_cp)
    monkeypatch.setattr(runtime, "cupy_stream", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(runtime, "_ready", lambda *a: call)
    monkeypatch.setattr(runtime, "_raw_stream", lambda d: 77)
    torch_device = [0]
    monkeypatch.setattr(runtime, "_torch_device", lambda: torch_device[0])
    args = ("forward", None, T(1), T(2), T(3), runtime.Settings(1 << 26), "strict")
    runtime.launch(*args)
    assert log == [("direct", 1, 2, 3, 4096, 64, 77)] and contexts == []
    answer[0] = False
    runtime.launch(*args)
    assert log[1:] == [("direct", 1, 2, 3, 4096, 64, 77), ("run", 1, 2, 3)] and contexts == [0]
    torch_device[0] = 1
    runtime.launch(*args)
    assert log[3:] == [("run", 1, 2, 3)]


def test_a_converted_module_compiles_in_one_graph_with_the_custom_op_on_its_first_call(monkeypatch):
    """torch.compile(fullgraph=True) of a converted model that never ran eagerly: the module's forward traces
    to ``torch.ops.ucudnn.conv2d`` (no graph break on the eager path's per-module state)."""
    from ucudnn.torch import modules

    monkeypatch.setattr(modules.Conv2d, "_unsupported", lambda self, x: None)   # trace as if on a GPU
    graphs = []
    model = ut.convert(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 2, 1)))
    x = torch.randn(2, 3, 8, 8)
    torch._dynamo.reset()
    try:
        torch.compile(model, backend=lambda gm, ex: graphs.append(gm) or (lambda *a: [torch.zeros(2, 2, 8, 8)]),
                      fullgraph=True)(x)
    finally:
        torch._dynamo.reset()
    assert len(graphs) == 1
    assert sum("ucudnn.conv2d" in str(n.target) for n in graphs[0].graph.nodes) == 2


def test_a_module_remembers_a_bounded_number_of_call_keys():
    """``ops.remember``: the per-module memo of both launch paths holds at most LAYERS_PER_MODULE keys (a new key in
    a full memo starts it over); a key already there is replaced in place."""
    from ucudnn.torch import ops

    layers: dict = {}
    for i in range(ops.LAYERS_PER_MODULE):
        assert ops.remember(layers, i, str(i)) == str(i)
    assert len(layers) == ops.LAYERS_PER_MODULE
    ops.remember(layers, 0, "again")                  # present: replaced, nothing dropped
    assert len(layers) == ops.LAYERS_PER_MODULE and layers[0] == "again"
    ops.remember(layers, "new", 1)                    # new key, memo full: starts over
    assert layers == {"new": 1}


def test_benchmarks_size_their_workspace_from_what_torchs_cap_leaves(monkeypatch):
    """Under set_per_process_memory_fraction the device reports memory the process may not take: what torch's
    allocator may still take is the cap less what is allocated (cached blocks count as free: the allocator
    releases them before an out-of-memory); uncapped, the device's free memory plus those cached blocks."""
    from ucudnn.binding import gpu

    GiB = 1 << 30
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "mem_get_info", lambda d: (70 * GiB, 80 * GiB))
    monkeypatch.setattr(cuda, "memory_allocated", lambda d: 1 * GiB)
    monkeypatch.setattr(cuda, "memory_reserved", lambda d: 3 * GiB // 2)
    monkeypatch.setattr(runtime, "_HAS_FRACTION", True)
    monkeypatch.setattr(cuda, "get_per_process_memory_fraction", lambda d: 1.0, raising=False)
    assert runtime.torch_free_memory(0) == 70 * GiB + GiB // 2
    monkeypatch.setattr(cuda, "get_per_process_memory_fraction", lambda d: 0.025, raising=False)   # 2 GiB of 80
    assert runtime.torch_free_memory(0) == 1 * GiB
    monkeypatch.setattr(cuda, "get_per_process_memory_fraction", lambda d: 0.01, raising=False)    # under allocated
    assert runtime.torch_free_memory(0) == 0
    # the core asks the hook the torch layer installs (no CuPy needed with a device given)
    monkeypatch.setattr(gpu, "_free_memory", None)
    gpu.set_free_memory(runtime.torch_free_memory)
    assert gpu.free_memory(0) == 0
    monkeypatch.setattr(cuda, "get_per_process_memory_fraction", lambda d: 0.025, raising=False)
    assert gpu.free_memory(0) == 1 * GiB


def test_a_workspace_that_did_not_fit_halves_the_limit_until_a_workspace_free_plan(monkeypatch):
    """runtime.degrade: after a call's workspace of ``failed`` bytes did not fit, the kernel's settings get a limit
    of at most half of it and half of what torch may still allocate, in whole MiB; each failure of the smaller
    plan halves again (the limit strictly falls, so the retries end), 0 is the last; the prepared call is dropped
    so the next launch is made with the new settings, and the compiled path is told plans changed."""
    from ucudnn import api
    from ucudnn.problem import ConvProblem

    room = {"bytes": 1 << 30}
    monkeypatch.setattr(runtime, "torch_free_memory", lambda device: room["bytes"])
    generation = api.generation
    monkeypatch.setattr(runtime, "_degraded", {})
    monkeypatch.setattr(runtime, "_calls", {})
    problem = ConvProblem(4, 8, 16, 16, 8, 3, 3, pad=1)
    settings = runtime.Settings(256 << 20)
    key = ("forward", problem, settings, "strict", 0, runtime._defaults_env(settings))
    runtime._calls[key] = object()
    assert runtime.degrade("forward", problem, settings, "strict", 0, 200 << 20)
    assert runtime._degraded[key] == runtime.Settings(100 << 20) and key not in runtime._calls
    assert api.generation > generation
    room["bytes"] = 31 << 20          # the cap leaves 31 MiB: half of it, down to whole MiB
    assert runtime.degrade("forward", problem, settings, "strict", 0, 100 << 20)
    assert runtime._degraded[key].workspace_limit == 15 << 20
    limits, failed = [], 15 << 20
    for _ in range(8):   # bounded: a limit that did not fall would show as a wrong list, not a hang
        if not runtime.degrade("forward", problem, settings, "strict", 0, failed):
            break
        failed = runtime._degraded[key].workspace_limit
        limits.append(failed)
        if failed == 0:
            break
    assert limits == [7 << 20, 3 << 20, 1 << 20, 0]
    assert not runtime.degrade("forward", problem, settings, "strict", 0, 0)   # a workspace-free plan: nothing left
    assert runtime._degraded[key].workspace_limit == 0
