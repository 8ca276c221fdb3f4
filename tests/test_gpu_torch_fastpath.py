"""The compiled launch path (``ucudnn/torch/csrc/launch.cpp``) on a GPU: converted layers give the Python path's
results, outputs and gradients equal to nn.Conv2d's, with the one-step plans of the legacy and graph sources
launched from C++ and everything else handed back to Python (``ucudnn_c::py_launch``)."""
from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with a CUDA GPU")]

import ucudnn.torch as ut  # noqa: E402
from ucudnn.torch import fastpath  # noqa: E402
from _torch_gpu import CASES, check_biased_forward_holds_one_output, check_captured_training_step, cnn, grads  # noqa: E402,F401,E501
from _torch_gpu import check_workspace_out_of_memory_degrades_the_plan  # noqa: E402
from _torch_ddp import check_ddp_on_one_gpu  # noqa: E402
from _torch_gpu import strict_fp32, train  # noqa: E402,F401


@pytest.fixture(scope="module", autouse=True)
def compiled():
    if not fastpath.start(wait=True):
        pytest.skip(f"the compiled launch path did not build here (state {fastpath.state()})")


def stats():
    """(native launches, launches handed to Python) so far, per op."""
    s = list(torch.ops.ucudnn_c.stats())
    return s[:3], s[3:]


def _every_op_from_cpp_equal_to_float64(ours, plain, x):
    """One more training call of a prepared layer: its three ops launch from C++ (none handed to Python), and its
    output and gradients (the measured call's parameter gradients alone) equal ``plain``'s in float64."""
    ours.zero_grad()
    n0, p0 = stats()
    y, dx, dws = grads(ours, x)
    n1, p1 = stats()
    assert [a - b for a, b in zip(n1, n0)] == [1, 1, 1] and p1 == p0
    ry, rdx, rdws = grads(copy.deepcopy(plain).double(), x.double())
    for got, want in [(y, ry), (dx, rdx), *zip(dws, rdws)]:
        torch.testing.assert_close(got.double(), want, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("sources", ["legacy", "graph", "legacy,graph,fold"])
@pytest.mark.parametrize("limit", ["256MiB", "1MiB"], ids=["one-step", "micro-batched"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["NCHW", "NHWC"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_outputs_and_gradients_equal_a_float64_reference(case, channels_last, limit, sources):
    kw, shape = CASES[case]
    torch.manual_seed(0)
    plain = nn.Conv2d(**kw).cuda()
    ours = ut.convert(copy.deepcopy(plain), workspace_limit=limit, sources=sources)
    x = torch.randn(shape, device="cuda")
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x, plain, ours = x.to(memory_format=fmt), plain.to(memory_format=fmt), ours.to(memory_format=fmt)
    native0, python0 = stats()
    y, dx, dws = grads(ours, x)
    native1, python1 = stats()
    ry, rdx, rdws = grads(copy.deepcopy(plain).double(), x.double())
    assert y.is_contiguous(memory_format=fmt)
    for got, want in [(y, ry), (dx, rdx), *zip(dws, rdws)]:
        torch.testing.assert_close(got.double(), want, rtol=2e-4, atol=2e-4)
    # every op went through the compiled operator: launched there or handed back to Python
    assert [a - b + c - d for a, b, c, d in zip(native1, native0, python1, python0)] == [1, 1, 1]


def test_one_step_legacy_and_graph_plans_launch_from_cpp():
    """A layer whose three plans are one step each (256 MiB) launches all three natively, from both sources."""
    for sources in ("legacy", "graph"):
        torch.manual_seed(0)
        model = ut.convert(nn.Conv2d(64, 64, 3, padding=1).cuda(), workspace_limit="256MiB", sources=sources)
        x = torch.randn(32, 64, 28, 28, device="cuda", requires_grad=True)
        model(x).sum().backward()            # the first call prepares (may benchmark)
        native0, python0 = stats()
        model(x).sum().backward()
        native1, python1 = stats()
        assert [a - b for a, b in zip(native1, native0)] == [1, 1, 1], sources
        assert python1 == python0, sources


def _converted_with_plans(monkeypatch, plans, memory_format=None, conv=None, shape=(37, 16, 14, 14),
                          sources="legacy"):
    """(plain, converted, x): ``conv`` (default a 16 -> 24 3x3 layer) converted at 1 MiB with ``sources``, every
    kernel planned by ``plans(problem, op, ...)`` instead of a benchmark, on an input of ``shape``, prepared by one
    training call."""
    from ucudnn import api
    from ucudnn.torch import runtime

    fmt = memory_format or torch.contiguous_format
    monkeypatch.setattr(api, "_plan_from_store_or_bench", plans)
    monkeypatch.setattr(api, "_executors", {})
    runtime.forget_prepared()
    torch.manual_seed(0)
    plain = (conv or nn.Conv2d(16, 24, 3, padding=1)).cuda().to(memory_format=fmt)
    ours = ut.convert(copy.deepcopy(plain), workspace_limit="1MiB", sources=sources)
    x = torch.randn(shape, device="cuda").to(memory_format=fmt)
    grads(ours, x)                           # prepares
    return plain, ours, x


def test_micro_batched_legacy_plans_launch_from_cpp_step_by_step(monkeypatch):
    """A plan of two micro-batches (20 + 17 samples, legacy algorithm 0 each: backward filter's second step adds
    into dw with beta 1) launches every op from C++, step by step, and gives nn.Conv2d's results."""
    from ucudnn.planning.plan import KernelPlan, MicroConfig
    from ucudnn.torch import runtime

    def two_steps(problem, op, *args, **kwargs):
        return KernelPlan("two-steps", op, problem, [MicroConfig(20, 0, "FMA", 1.0, 0, "legacy"),
                                                     MicroConfig(17, 0, "FMA", 1.0, 0, "legacy")])

    plain, ours, x = _converted_with_plans(monkeypatch, two_steps)
    assert [len(call.executor.steps) for _, call in fastpath._keep[-3:]] == [2, 2, 2]
    _every_op_from_cpp_equal_to_float64(ours, plain, x)
    runtime.forget_prepared()


@pytest.mark.parametrize("channels_last", [False, True], ids=["NCHW", "NHWC"])
def test_micro_batched_graph_plans_launch_from_cpp_and_blend_dw(monkeypatch, channels_last):
    """Two micro-batches (20 + 17 samples) of measured graph-API engines for every op: backward filter's second
    engine (built with beta 0) writes into scratch after its own workspace and cudnnTransformTensor adds that into
    dw (``graph.blend_of``), all from C++ -- no op handed to Python -- and the results equal a float64 reference."""
    from test_gpu_graph import _frontend_or_skip, _graph_plan

    from ucudnn.torch import runtime

    _frontend_or_skip()

    def graph_steps(problem, op, *args, **kwargs):
        return _graph_plan(problem, op, [20, 17], "strict")[0]

    plain, ours, x = _converted_with_plans(monkeypatch, graph_steps,
                                           torch.channels_last if channels_last else torch.contiguous_format,
                                           sources="graph")
    steps = [call.executor.native_steps for _, call in fastpath._keep[-3:]]
    assert [[s.native.kind for s in st] for st in steps] == [["graph", "graph"]] * 3
    assert [[s.accumulate for s in st] for st in steps] == [[False, False], [False, False], [False, True]]
    _every_op_from_cpp_equal_to_float64(ours, plain, x)
    runtime.forget_prepared()


@pytest.mark.parametrize("channels_last", [False], ids=["NCHW"])
def test_steps_on_unwritten_memory_launch_from_cpp_in_the_later_samples_output(monkeypatch, channels_last):
    """Forward and backward data plans whose first micro-batch (20 of 37 samples, legacy algorithm 1) takes its
    workspace from the output of the other 17 (issue 18's unwritten memory) launch every step from C++, the
    workspace 256-byte aligned inside the output's tail; outputs start as whatever torch's allocator held, so the
    later step must overwrite what the first borrowed: results equal a float64 reference.  NCHW only: in NHWC
    cuDNN 9.19's backward-data algorithm 1 needs 641040 bytes here, more than the 213248 of dx's tail, and that
    step goes to Python, which refuses it and lets torch run the op (seen on the H200)."""
    from ucudnn.planning.plan import KernelPlan, MicroConfig
    from ucudnn.torch import runtime

    def borrowing(problem, op, *args, **kwargs):
        first = MicroConfig(20, 1 if op != "backward_filter" else 0, "FMA", 1.0, 0, "legacy")
        rest = MicroConfig(17, 0, "FMA", 1.0, 0, "legacy")
        return KernelPlan("borrowing", op, problem, [MicroConfig.of(first, op != "backward_filter"), rest])

    plain, ours, x = _converted_with_plans(monkeypatch, borrowing,
                                           torch.channels_last if channels_last else torch.contiguous_format)
    calls = fastpath._keep[-3:]
    described = [call.executor.native_steps for _, call in calls]
    assert [s[0].from_out >= 0 for s in described[:2]] == [True, True]
    print("first steps' workspace needs (bytes):", [s[0].need for s in described[:2]])
    _every_op_from_cpp_equal_to_float64(ours, plain, x)
    runtime.forget_prepared()


def test_a_backward_filter_borrowing_dx_launches_from_cpp_before_backward_data_overwrites_it(monkeypatch):
    """With ``UCUDNN_UNWRITTEN=1`` a backward filter whose plan takes its first micro-batch's workspace from the
    layer's dx (issue 18) runs from C++ first in the backward (launch.cpp's Conv::backward, as the Python path's
    EagerConv2d.backward), then backward data overwrites dx: every op launches from C++ and the results equal a
    float64 reference.  Forward and backward data keep their plain plans here."""
    from ucudnn import api
    from ucudnn.planning.plan import KernelPlan, MicroConfig
    from ucudnn.torch import runtime

    original = api._plan_from_store_or_bench

    def borrowing(problem, op, limit, bp, nm, sources=None, unwritten=False):
        if op == "backward_filter" and unwritten:
            first = MicroConfig(20, 0, "FMA", 1.0, 0, "legacy")
            rest = MicroConfig(17, 0, "FMA", 1.0, 0, "legacy")
            return KernelPlan("borrowing", op, problem, [MicroConfig.of(first, True), rest])
        return original(problem, op, limit, bp, nm, sources, False)

    monkeypatch.setenv("UCUDNN_UNWRITTEN", "1")
    plain, ours, x = _converted_with_plans(monkeypatch, borrowing)
    lent = fastpath._keep[-1][1].executor
    assert lent.plan.op == "backward_filter" and [s.from_out for s in lent.native_steps] == [0, -1]
    _every_op_from_cpp_equal_to_float64(ours, plain, x)
    runtime.forget_prepared()


DEPTHWISE = [(False, 3), (False, 7), (True, 7), (True, 5)]
DEPTHWISE_IDS = ["NCHW-3x3", "NCHW-7x7", "NHWC-7x7", "NHWC-5x5"]


@pytest.mark.parametrize("channels_last, k", DEPTHWISE, ids=DEPTHWISE_IDS)
def test_depthwise_kernels_launch_from_cpp_through_the_driver(channels_last, k):
    """A depthwise layer planned on the ``depthwise`` source alone runs ucudnn's own kernels, described as calls
    (CUDA functions, geometry, arguments) and launched by the C++ node through cuLaunchKernel: every op from C++,
    none handed to Python, results equal a float64 reference."""
    torch.manual_seed(0)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    plain = nn.Conv2d(40, 40, k, padding=k // 2, groups=40).cuda().to(memory_format=fmt)
    ours = ut.convert(copy.deepcopy(plain), workspace_limit="64MiB", sources="depthwise")
    x = torch.randn(13, 40, 15, 17, device="cuda").to(memory_format=fmt)
    grads(ours, x)                           # prepares (benchmarks the depthwise rows)
    registered = [call for _, call in fastpath._keep[-3:]]
    assert all(s.native.kind == "kernel" for c in registered for s in c.executor.native_steps)
    _every_op_from_cpp_equal_to_float64(ours, plain, x)


@pytest.mark.parametrize("channels_last, k", DEPTHWISE, ids=DEPTHWISE_IDS)
def test_micro_batched_depthwise_kernels_launch_from_cpp_and_accumulate_dw(monkeypatch, channels_last, k):
    """Two micro-batches (7 + 6 samples) of the depthwise kernels: the second backward-filter step adds into dw
    through its beta argument (1), every op from C++, results equal a float64 reference."""
    from ucudnn.measure.sources.direct import configure_dw, configure_dw_nhwc
    from ucudnn.planning.plan import KernelPlan, MicroConfig
    from ucudnn.torch import runtime

    def two_steps(problem, op, *args, **kwargs):
        def cfg(n):
            q = problem.with_batch(n)
            if problem.layout == "NHWC":
                from ucudnn.kernels.direct_dw_nhwc import tiles_of

                return MicroConfig.of(configure_dw_nhwc(op, q, tiles_of(op)[1], "depthwise"))
            return MicroConfig.of(configure_dw(op, q, 0, 1, "depthwise"))

        return KernelPlan("two-steps", op, problem, [cfg(7), cfg(6)])

    plain, ours, x = _converted_with_plans(
        monkeypatch, two_steps, torch.channels_last if channels_last else torch.contiguous_format,
        nn.Conv2d(40, 40, k, padding=k // 2, groups=40), (13, 40, 15, 17), "depthwise")
    registered = [call for _, call in fastpath._keep[-3:]]
    assert [[s.accumulate for s in c.executor.native_steps] for c in registered] == \
        [[False, False], [False, False], [False, True]]
    _every_op_from_cpp_equal_to_float64(ours, plain, x)
    runtime.forget_prepared()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_casts_in_cpp_like_nn_conv2d(dtype):
    torch.manual_seed(0)
    plain = nn.Conv2d(32, 64, 3, padding=1).cuda().to(memory_format=torch.channels_last)
    ours = ut.convert(copy.deepcopy(plain), workspace_limit="256MiB")
    x = torch.randn(9, 32, 20, 20, device="cuda").to(memory_format=torch.channels_last)
    with torch.autocast("cuda", dtype=dtype):
        y, dx, dws = grads(ours, x)
        ry, rdx, rdws = grads(plain, x)
    assert y.dtype == ry.dtype == dtype and dx.dtype == rdx.dtype == torch.float32
    tol = 2e-2 if dtype == torch.float16 else 6e-2
    for got, want in [(y, ry), (dx, rdx), *zip(dws, rdws)]:
        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


def test_only_the_gradients_autograd_needs_are_computed():
    torch.manual_seed(0)
    ours = ut.convert(nn.Conv2d(3, 16, 3, padding=1).cuda(), workspace_limit="256MiB")
    x = torch.randn(7, 3, 20, 20, device="cuda")
    ours(x).sum().backward()                 # prepares
    n0, p0 = stats()
    ours(x).sum().backward()                 # x needs no gradient: a first layer
    n1, p1 = stats()
    assert [a - b + c - d for a, b, c, d in zip(n1, n0, p1, p0)] == [1, 0, 1]
    with torch.no_grad():
        ours(x)
    n2, p2 = stats()
    assert [a - b + c - d for a, b, c, d in zip(n2, n1, p2, p1)] == [1, 0, 0]


@pytest.mark.parametrize("limit", ["256MiB", "1MiB"])
def test_twenty_training_steps_follow_nn_conv2ds_loss_curve(limit):
    plain = train(cnn())
    ours = train(ut.convert(cnn(), workspace_limit=limit))
    assert ours[-1] < ours[0]
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(plain), rtol=2e-3, atol=2e-3)


def test_ddp_trains_converted_models_as_it_trains_the_plain_one(tmp_path):
    check_ddp_on_one_gpu(tmp_path, compiled=True)


def test_a_cuda_graph_captured_training_step_replays_correctly():
    check_captured_training_step(ut.convert(cnn(), workspace_limit="256MiB"))


def test_a_replaced_plan_makes_a_new_entry():
    """A plan handed out and then replaced (``ucudnn.api.plans_changed``: heuristic mode's background benchmark,
    installed plans) is not launched again from the entry made with it."""
    from ucudnn import api

    torch.manual_seed(0)
    model = ut.convert(nn.Conv2d(16, 16, 3, padding=1).cuda(), workspace_limit="256MiB")
    x = torch.randn(4, 16, 12, 12, device="cuda")
    with torch.no_grad():
        y0 = model(x)
        entries = {k: v for k, v in model._ucudnn_layers.items() if isinstance(k, tuple) and k[:1] == (fastpath._FAST,)}
        api.plans_changed()
        y1 = model(x)
        after = {k: v for k, v in model._ucudnn_layers.items() if k in entries}
    assert entries and all(after[k][1] != entries[k][1] for k in entries)
    torch.testing.assert_close(y1, y0)


def test_a_biased_forward_adds_its_bias_in_place():
    check_biased_forward_holds_one_output()


def test_a_workspace_that_does_not_fit_a_memory_cap_runs_a_smaller_plan(monkeypatch):
    check_workspace_out_of_memory_degrades_the_plan(monkeypatch)


def test_switching_cudnn_off_after_the_first_call_runs_the_next_calls_through_torch():
    """``torch.backends.cudnn.enabled = False`` after a layer's first compiled call: the next call launches nothing
    of ucudnn's (torch runs it, as for a plain ``nn.Conv2d``) and gives torch's result; back on, ucudnn again."""
    torch.manual_seed(0)
    plain = nn.Conv2d(8, 8, 3, padding=1).cuda()
    ours = ut.convert(copy.deepcopy(plain), workspace_limit="64MiB")
    x = torch.randn(3, 8, 10, 10, device="cuda")
    with torch.no_grad():
        ours(x)
        before = stats()[0][0]
        ours(x)
        assert stats()[0][0] == before + 1                      # on: the compiled path launched it
        with torch.backends.cudnn.flags(enabled=False):
            y = ours(x)
            assert stats()[0][0] == before + 1                  # off: nothing launched by ucudnn
            torch.testing.assert_close(y, plain(x))
        ours(x)
        assert stats()[0][0] == before + 2
