"""ucudnn.torch on a GPU: converted layers compute nn.Conv2d's outputs and gradients, train like it, compile,
capture, and take their workspace from torch's allocator."""
from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with a CUDA GPU")]

import ucudnn.torch as ut  # noqa: E402
from ucudnn.torch import runtime  # noqa: E402
from _torch_gpu import CASES, check_biased_forward_holds_one_output, check_captured_training_step, cnn, grads  # noqa: E402,F401,E501
from _torch_gpu import check_workspace_out_of_memory_degrades_the_plan  # noqa: E402
from _torch_ddp import check_ddp_on_one_gpu  # noqa: E402
from _torch_gpu import strict_fp32, train  # noqa: E402,F401

LIMIT = "1MiB"   # small: most of these plans are micro-batched


@pytest.fixture(autouse=True)
def python_path(monkeypatch):
    """This file specifies the Python launch path (its tests watch ``runtime.launch``); the compiled one has
    ``test_gpu_torch_fastpath.py``, held to the same results."""
    from ucudnn.torch import fastpath

    monkeypatch.setattr(fastpath, "ready", lambda: False)


def _pair(case, channels_last=False, dtype=torch.float32):
    kw, shape = CASES[case]
    torch.manual_seed(0)
    plain = nn.Conv2d(**kw).cuda()
    ours = ut.convert(copy.deepcopy(plain), workspace_limit=LIMIT)
    x = torch.randn(shape, device="cuda")
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
        plain, ours = plain.to(memory_format=torch.channels_last), ours.to(memory_format=torch.channels_last)
    return plain, ours, x


@pytest.mark.parametrize("channels_last", [False, True], ids=["NCHW", "NHWC"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_outputs_and_gradients_equal_a_float64_reference(case, channels_last):
    plain, ours, x = _pair(case, channels_last)
    ref = copy.deepcopy(plain).double()
    y, dx, dws = grads(ours, x)
    ry, rdx, rdws = grads(ref, x.double())
    assert y.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    for got, want in [(y, ry), (dx, rdx), *zip(dws, rdws)]:
        torch.testing.assert_close(got.double(), want, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_runs_the_half_precision_plans_like_nn_conv2d(dtype):
    plain, ours, x = _pair("bias-odd-batch", channels_last=True)
    seen = []
    real = runtime.launch
    runtime.launch = lambda op, problem, *a, **k: seen.append(problem.dtype) or real(op, problem, *a, **k)
    try:
        with torch.autocast("cuda", dtype=dtype):
            y, dx, dws = grads(ours, x)
            ry, rdx, rdws = grads(plain, x)
    finally:
        runtime.launch = real
    assert y.dtype == ry.dtype == dtype and set(seen) == {str(dtype).split(".")[1]}
    tol = 2e-2 if dtype == torch.float16 else 6e-2
    for got, want in [(y, ry), (dx, rdx), *zip(dws, rdws)]:
        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


def test_no_input_gradient_is_computed_when_autograd_needs_none(monkeypatch):
    _, ours, x = _pair("bias-odd-batch")
    ops = []
    real = runtime.launch
    monkeypatch.setattr(runtime, "launch", lambda op, *a, **k: ops.append(op) or real(op, *a, **k))
    ours(x).sum().backward()         # x does not require grad: a first layer
    assert ops == ["forward", "backward_filter"]
    ops.clear()
    ours.weight.requires_grad_(False)
    ours.bias.requires_grad_(False)
    x.requires_grad_()
    ours(x).sum().backward()
    assert ops == ["forward", "backward_data"]


def test_twenty_training_steps_follow_nn_conv2ds_loss_curve():
    plain = train(cnn())
    ours = train(ut.convert(cnn(), workspace_limit=LIMIT))
    assert ours[-1] < ours[0]                                  # it learns
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(plain), rtol=2e-3, atol=2e-3)


def test_a_compiled_model_equals_eager():
    model = ut.convert(cnn(), workspace_limit=LIMIT)
    x = torch.randn(17, 3, 24, 24, device="cuda")
    eager = model(x)
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(compiled(x), eager, rtol=1e-5, atol=1e-5)


def test_ddp_trains_converted_models_as_it_trains_the_plain_one(tmp_path):
    check_ddp_on_one_gpu(tmp_path, compiled=False)


def test_a_cuda_graph_captured_training_step_replays_correctly():
    check_captured_training_step(ut.convert(cnn(), workspace_limit=LIMIT))


WORKSPACE_CANDIDATES = [((16, 64, 16, 16), (64, 64, 5, 5)), ((32, 128, 14, 14), (128, 128, 3, 3)),
                        ((8, 256, 28, 28), (256, 256, 3, 3))]


def test_the_workspace_comes_from_torchs_allocator_and_shows_in_its_peak():
    from ucudnn.torch import ops

    settings = runtime.Settings(256 << 20)
    for x_shape, w_shape in WORKSPACE_CANDIDATES:   # the first kernel whose plan uses workspace on this GPU
        x = torch.randn(x_shape, device="cuda")
        w = torch.randn(w_shape, device="cuda")
        problem = runtime.problem_of(x.shape, w.shape, (1, 1), (0, 0), (1, 1), 1, torch.float32, "NCHW")
        for op in ("forward", "backward_filter"):
            ex = runtime.executor(problem, op, settings, "strict", x.device.index)
            if ex.workspace_bytes > 0:
                break
        if ex.workspace_bytes > 0:
            break
    assert ex.workspace_bytes > 0, "none of the candidate kernels' plans uses workspace"
    dy = torch.randn(problem.y_shape(), device="cuda")
    args = ([1, 1], [0, 0], [1, 1], 1, "NCHW", "strict", settings.workspace_limit, "", "", False)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = ops.conv2d(x, w, *args) if op == "forward" else ops.conv2d_backward_filter(dy, x, w, *args)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - base >= ex.workspace_bytes + out.numel() * 4
    assert torch.cuda.memory_allocated() - base < out.numel() * 4 + 1024   # the workspace went back to torch's pool


@pytest.mark.parametrize("policy", ["wr", "wd"])
def test_plan_up_front_covers_every_kernel_and_runs_the_model_unchanged(policy):
    model = ut.convert(cnn(), workspace_limit=LIMIT)
    reference = copy.deepcopy(model)
    x = torch.randn(8, 3, 24, 24, device="cuda")
    p = ut.plan(model, x, policy, total_workspace="4MiB" if policy == "wd" else None)
    ops = sorted((k.name.rsplit(".", 1)[1]) for k in p.kernels)
    assert ops.count("forward") == 3 and ops.count("backward_filter") == 3 and ops.count("backward_data") == 2
    if policy == "wd":
        assert p.workspace_bytes <= 4 << 20
    runtime.installed.clear() if policy == "wr" else None
    y, dx, dws = grads(model, x)
    ry, rdx, rdws = grads(ut.revert(reference), x)
    runtime.installed.clear()
    for got, want in [(y, ry), (dx, rdx), *zip(dws, rdws)]:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_first_call_under_a_memory_cap_benchmarks_within_it_and_runs_ucudnn(monkeypatch):
    """Under set_per_process_memory_fraction a converted layer's first call benchmarks within what the cap leaves
    (its workspace sized from that, not from the device's free memory) and runs ucudnn's plan, not torch's.
    Before: the benchmark asked for a 4 GiB workspace on any large GPU, ran out of memory under the cap, and every
    convolution fell back to torch (H200, AlexNet b256 under a 1.81 GiB cap)."""
    from ucudnn import api

    for name, value in (("_store", None), ("_store_failed", True), ("_plans", {}), ("_executors", {})):
        monkeypatch.setattr(api, name, value)      # no cached plan anywhere: the first call benchmarks
    runtime.forget_prepared()
    launched, fell_back = [], []
    real_launch, real_note = runtime.launch, runtime.note_fallback
    monkeypatch.setattr(runtime, "launch", lambda op, *a, **k: (real_launch(op, *a, **k), launched.append(op))[0])
    monkeypatch.setattr(runtime, "note_fallback", lambda p, op, e: (fell_back.append((op, str(e))),
                                                                    real_note(p, op, e))[1])
    torch.manual_seed(0)
    plain = nn.Conv2d(13, 24, 3, padding=1).cuda()
    ours = ut.convert(copy.deepcopy(plain), workspace_limit="64MiB")
    x = torch.randn(6, 13, 29, 31, device="cuda", requires_grad=True)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + (512 << 20)) / total)
    try:
        y = ours(x)
        y.sum().backward()
        torch.cuda.synchronize()
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert not fell_back, fell_back
    assert sorted(launched) == ["backward_data", "backward_filter", "forward"]
    torch.testing.assert_close(y, plain(x), rtol=1e-4, atol=1e-4)


def test_a_biased_forward_adds_its_bias_in_place():
    check_biased_forward_holds_one_output()


def test_a_workspace_that_does_not_fit_a_memory_cap_runs_a_smaller_plan(monkeypatch):
    check_workspace_out_of_memory_degrades_the_plan(monkeypatch)


@pytest.mark.parametrize("shape", [(33, 64, 28, 28), (8, 64, 112, 112)], ids=["b33-28", "b8-112"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["NCHW", "NHWC"])
def test_plans_that_borrow_unwritten_outputs_compute_what_a_float64_reference_does(monkeypatch, channels_last,
                                                                                   shape):
    """``UCUDNN_UNWRITTEN=1``: forward and backward data may run a micro-batch in the unwritten part of their fresh
    output, the backward filter in the layer's dx before dx is computed into it (the eager backward runs dw
    first).  At a limit far below what the fast algorithms want, some of this layer's plans do, and every result
    still equals a float64 reference; with the switch off none does."""
    monkeypatch.setenv("UCUDNN_UNWRITTEN", "1")
    torch.manual_seed(0)
    plain = nn.Conv2d(64, 96, 3, padding=1).cuda()
    ours = ut.convert(copy.deepcopy(plain), workspace_limit="256KiB")
    x = torch.randn(shape, device="cuda")
    if channels_last:
        x, ours = x.to(memory_format=torch.channels_last), ours.to(memory_format=torch.channels_last)
    runtime.forget_prepared()
    y, dx, dws = grads(ours, x)
    borrowing = sorted(key[0] for key, call in runtime._calls.items() if call.executor.takes_unwritten)
    ry, rdx, rdws = grads(copy.deepcopy(plain).double(), x.double())
    for got, want in [(y, ry), (dx, rdx), *zip(dws, rdws)]:   # dw sums 10^5 products: tolerance by its scale
        torch.testing.assert_close(got.double(), want, rtol=2e-4, atol=2e-5 * max(1.0, want.abs().max().item()))
    print("ops on unwritten memory:", shape, borrowing)
    if not borrowing:
        pytest.skip("no plan of this layer is faster with unwritten memory on this GPU")
    monkeypatch.setenv("UCUDNN_UNWRITTEN", "0")
    runtime.forget_prepared()
    y0, dx0, _ = grads(ours, x)
    assert not any(call.executor.takes_unwritten for key, call in runtime._calls.items() if key[-1][3] == "0")
    torch.testing.assert_close(y0, y, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("channels_last", [False, True], ids=["NCHW", "NHWC"])
def test_even_splits_of_an_odd_batch_compute_what_a_float64_reference_does(channels_last):
    """``batch_policy="evenSplits"`` at an odd batch (37) and a limit far below what the fast algorithms want:
    every plan's micro-batches are the policy's sizes for 37 (powers of two, 18 / 19, 9 / 10, 4 / 5, 2 / 3) and
    sum to 37, and outputs and gradients equal a float64 reference."""
    from ucudnn.policy import micro_batch_sizes

    torch.manual_seed(0)
    plain = nn.Conv2d(64, 96, 3, padding=1).cuda()
    ours = ut.convert(copy.deepcopy(plain), workspace_limit="256KiB", batch_policy="evenSplits")
    x = torch.randn(37, 64, 28, 28, device="cuda")
    if channels_last:
        x, ours = x.to(memory_format=torch.channels_last), ours.to(memory_format=torch.channels_last)
    runtime.forget_prepared()
    y, dx, dws = grads(ours, x)
    sizes = set(micro_batch_sizes("powerOfTwoAndEvenSplits", 37))
    plans = [call.executor.plan for call in runtime._calls.values()]
    assert len(plans) == 3
    for p in plans:
        assert {c.micro_batch for c in p.configs} <= sizes and p.batch == 37
    print("plans:", [p.summary() for p in plans])
    ry, rdx, rdws = grads(copy.deepcopy(plain).double(), x.double())
    for got, want in [(y, ry), (dx, rdx), *zip(dws, rdws)]:
        torch.testing.assert_close(got.double(), want, rtol=2e-4, atol=2e-5 * max(1.0, want.abs().max().item()))
