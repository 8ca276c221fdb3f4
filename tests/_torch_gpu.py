"""What the GPU tests of ucudnn.torch share (``test_gpu_torch.py``: the Python launch path;
``test_gpu_torch_fastpath.py``: the compiled one, held to the same results): strict FP32, layer cases, a small
CNN, its training loop, and a CUDA-graph-captured training step checked against eager steps.

Imported only by tests that have already checked torch is installed.
"""
from __future__ import annotations

import copy
import gc

import pytest
import torch
from torch import nn


@pytest.fixture(autouse=True)
def strict_fp32():
    """FP32 plans in strict numerics (TF32 off), as the float64 comparisons need; torch's switch restored after.
    Autouse in every test module that imports it."""
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = tf32

#: name -> (nn.Conv2d arguments, input shape): odd batches, C = 1, non-square filters, strides, groups
CASES = {
    "bias-odd-batch": (dict(in_channels=3, out_channels=16, kernel_size=3, padding=1), (7, 3, 20, 20)),
    "no-bias-stride2": (dict(in_channels=8, out_channels=16, kernel_size=3, stride=2, bias=False), (9, 8, 17, 17)),
    "same-non-square": (dict(in_channels=4, out_channels=8, kernel_size=(3, 5), padding="same"), (5, 4, 16, 12)),
    "dilation": (dict(in_channels=6, out_channels=6, kernel_size=3, dilation=2, padding=2), (6, 6, 15, 15)),
    "groups": (dict(in_channels=8, out_channels=16, kernel_size=3, groups=4, padding=1), (4, 8, 12, 12)),
    "depthwise": (dict(in_channels=16, out_channels=16, kernel_size=3, groups=16, padding=1), (11, 16, 14, 14)),
    "depthwise-7x7-odd-channels": (dict(in_channels=42, out_channels=42, kernel_size=7, groups=42, padding=3),
                                   (5, 42, 15, 13)),
    "c1-stride4": (dict(in_channels=1, out_channels=8, kernel_size=(11, 7), stride=4), (3, 1, 40, 36)),
    "valid-5x5": (dict(in_channels=32, out_channels=32, kernel_size=5), (13, 32, 24, 24)),
}


def grads(model, x):
    """(y, dx, parameter gradients) of ``model`` at ``x`` under one fixed upstream gradient."""
    x = x.detach().clone().requires_grad_()
    y = model(x)
    torch.manual_seed(3)                      # the same upstream gradient for every model compared
    g = torch.randn(y.shape, device=y.device).to(y.dtype)
    y.backward(g)
    return y.detach(), x.grad, [p.grad for p in model.parameters()]


def cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 5, padding=2), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1),
                         nn.BatchNorm2d(32), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1, groups=4), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).cuda()


def train(model, steps=20):
    """The losses of ``steps`` SGD steps over four fixed batches of 33."""
    torch.manual_seed(1)
    data = [(torch.randn(33, 3, 24, 24, device="cuda"), torch.randint(0, 10, (33,), device="cuda"))
            for _ in range(4)]
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for i in range(steps):
        x, t = data[i % 4]
        loss = nn.functional.cross_entropy(model(x), t)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def check_captured_training_step(model):
    """Capture one SGD step of ``model`` in a CUDA graph and check three replays (new data each) against eager
    steps of a copy: losses and final parameters."""
    reference = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    static_x = torch.randn(16, 3, 24, 24, device="cuda")
    static_t = torch.randint(0, 10, (16,), device="cuda")

    def step(m, o, x, t):
        o.zero_grad(set_to_none=False)
        loss = nn.functional.cross_entropy(m(x), t)
        loss.backward()
        o.step()
        return loss

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):        # warm-up finds the plans (benchmarking cannot be captured)
        for _ in range(3):
            step(model, opt, static_x, static_t)
            step(reference, ref_opt, static_x, static_t)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = step(model, opt, static_x, static_t)
    for _ in range(3):
        static_x.copy_(torch.randn(16, 3, 24, 24, device="cuda"))
        graph.replay()
        want = step(reference, ref_opt, static_x, static_t)
        torch.testing.assert_close(static_loss, want, rtol=1e-4, atol=1e-4)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-4)


def check_biased_forward_holds_one_output():
    """A converted biased layer's forward (training, so autograd records it) allocates y once: the bias is added
    into y in place, as torch's own convolution adds it, not as a second output-sized tensor beside y.  Its plan
    may take up to 1 MiB of workspace, transient too."""
    import ucudnn.torch as ut

    torch.manual_seed(0)
    layer = ut.convert(nn.Conv2d(32, 64, 3, padding=1).cuda(), workspace_limit="1MiB", sources="legacy")
    x = torch.randn(16, 32, 112, 112, device="cuda", requires_grad=True)
    y = layer(x)   # plans made (and benchmarked) here, outside the measured call
    expect = nn.functional.conv2d(x, layer.weight, layer.bias, padding=1)
    torch.testing.assert_close(y, expect, rtol=2e-4, atol=2e-4)
    y_bytes = y.numel() * 4
    del y, expect
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    y = layer(x)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - base <= y_bytes + (1 << 21)
    y.sum().backward()   # the in-place add left autograd a valid graph: dx and the bias' gradient exist
    assert x.grad is not None and layer.bias.grad is not None


def _fill_cached_blocks() -> list:
    """Tensors taking every free block of 1 MiB or more that torch's allocator keeps inside segments still in use
    (``empty_cache`` releases only wholly free segments): largest first, so each takes a block of its own size
    (the allocator's best fit).  Why: the first calls' benchmark buffers leave such blocks behind (86 MB in one
    run), and an allocation that fits in one succeeds under any ``set_per_process_memory_fraction`` cap."""
    stream = torch.cuda.current_stream().cuda_stream   # a block serves allocations of its own stream only,
    sizes = sorted((b["size"] for seg in torch.cuda.memory_snapshot()   # outside a graph's private pool
                    if seg["segment_type"] == "large" and seg.get("stream", stream) == stream
                    and tuple(seg.get("segment_pool_id", (0, 0))) == (0, 0)
                    for b in seg["blocks"] if b["state"] == "inactive" and b["size"] >= 1 << 20), reverse=True)
    reserved = torch.cuda.memory_reserved()
    fillers = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in sizes]
    assert torch.cuda.memory_reserved() == reserved, "a filler took new memory instead of a cached block"
    return fillers


def check_workspace_out_of_memory_degrades_the_plan(monkeypatch):
    """Under a memory cap that leaves room for a converted layer's output but not for its plan's workspace, the call
    runs a smaller plan from the same measurements (not torch's convolution), equal to nn.Conv2d's result, and the
    layer keeps it: the next call's allocations all succeed (torch's out-of-memory count does not move)."""
    import ucudnn.torch as ut
    from ucudnn.torch import ops, runtime

    torch.manual_seed(0)
    layer = ut.convert(nn.Conv2d(64, 64, 5, padding=2).cuda(), workspace_limit="256MiB", sources="legacy")
    x = torch.randn(32, 64, 56, 56, device="cuda")
    with torch.no_grad():
        y = layer(x)   # planned (benchmarked) uncapped
        y_bytes = y.numel() * 4
        del y
    settings = ops._settings(layer.workspace_limit, layer.batch_policy, layer.sources, layer.replay)
    ws = runtime.executor(layer.problem(x), "forward", settings, runtime.numerics_for(x.dtype),
                          x.device.index).workspace_bytes   # what the layer's call takes from torch's allocator
    if ws < 4 << 20:
        pytest.skip(f"this GPU's 256 MiB plan of the 5x5 layer takes {ws} bytes of workspace: nothing to cap")
    with torch.no_grad():
        expect = nn.functional.conv2d(x, layer.weight, layer.bias, padding=2)
    fallbacks: list = []
    monkeypatch.setattr(runtime, "note_fallback", lambda *args: fallbacks.append(args))
    gc.collect()
    torch.cuda.empty_cache()
    fillers = _fill_cached_blocks()   # the cap limits what torch reserves, not what it reuses from its cache
    total = torch.cuda.get_device_properties(0).total_memory
    # the cap limits what torch reserves: the output fits beside what is reserved now, the workspace does not
    cap = torch.cuda.memory_reserved() + y_bytes + ws // 4 + (4 << 20)
    try:
        torch.cuda.set_per_process_memory_fraction(cap / total, 0)
        with torch.no_grad():
            got = layer(x).cpu()   # compared after the cap is lifted (a comparison allocates too)
            limits = [s.workspace_limit for k, s in runtime._degraded.items() if k[0] == "forward"]
            ooms = torch.cuda.memory_stats()["num_ooms"]
            layer(x)
            torch.cuda.synchronize()
            assert torch.cuda.memory_stats()["num_ooms"] == ooms
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
        del fillers
        runtime._degraded.clear()
        runtime._calls.clear()
        runtime._by_id.clear()
    torch.testing.assert_close(got, expect.cpu(), rtol=2e-4, atol=2e-4)
    assert fallbacks == [], "torch's convolution ran where a smaller plan fits"
    assert limits and max(limits) < ws
