"""Converted torchvision models that no issue names compute what their float64 twins compute.

Why: the layer tests (``test_gpu_torch.py``) cover one convolution at a time; a whole public model strings dozens
of shapes together -- 1x7 / 7x1 and 1x3 / 3x1 filters and stride-2 valid layers (Inception v3), grouped 3x3
(ResNeXt, RegNet), 7x7 depthwise (ConvNeXt), strided depthwise after channel shuffles (ShuffleNet V2), squeeze and
excitation (MobileNet V3, RegNet-Y), branches concatenated (GoogLeNet) -- at an odd batch and an odd input size.
Each converted model (strict FP32, at 1 MiB per kernel: micro-batched plans, and at 64 MiB) is held to the float64
model's output, input gradient and every parameter gradient by norm-wise relative error, and every convolution must
have run through ucudnn (no layer handed to torch).  Models in eval mode: dropout off, batch norm from its running
statistics, so both twins compute the same function.
"""
from __future__ import annotations

import copy
import logging

import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with a CUDA GPU")]

import ucudnn.torch as ut  # noqa: E402
from _torch_gpu import grads, strict_fp32  # noqa: E402,F401

#: torchvision name -> (constructor arguments, input shape): odd batch, small (and for Inception odd) images
MODELS = {
    "inception_v3": (dict(aux_logits=False, init_weights=True), (3, 3, 107, 107)),
    "googlenet": (dict(aux_logits=False, init_weights=True), (3, 3, 64, 64)),
    "resnext50_32x4d": ({}, (3, 3, 64, 64)),
    "regnet_y_400mf": ({}, (3, 3, 64, 64)),
    "convnext_tiny": ({}, (3, 3, 64, 64)),
    "shufflenet_v2_x0_5": ({}, (3, 3, 64, 64)),
    "mobilenet_v3_small": ({}, (3, 3, 64, 64)),
}
#: norm-wise relative error allowed against float64, or ten times PyTorch's own FP32 error where that is larger
#: (FP32 through 20-100 layers; a wrong index or a missed micro-batch shows as an error near 1)
TOLERANCE = 1e-4


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm().clamp_min(1e-30))


@pytest.mark.parametrize("limit", ["1MiB", "64MiB"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_converted_model_computes_its_float64_twins_output_and_gradients(name, limit, caplog):
    kw, shape = MODELS[name]
    torch.manual_seed(0)
    plain = getattr(torchvision.models, name)(num_classes=10, **kw).cuda().eval()
    reference = copy.deepcopy(plain).double()
    ours = ut.convert(copy.deepcopy(plain), workspace_limit=limit)
    assert sum(isinstance(m, ut.Conv2d) for m in ours.modules()) >= 10
    x = torch.randn(shape, device="cuda")
    with caplog.at_level(logging.WARNING, logger="ucudnn"):
        y, dx, dws = grads(ours, x)
    handed = [r.getMessage() for r in caplog.records if "runs through torch" in r.getMessage()]
    assert handed == [], handed
    ry, rdx, rdws = grads(reference, x.double())
    py, pdx, pdws = grads(plain, x)         # PyTorch's own FP32 error, for the message only
    errors = {"y": relative(y, ry), "dx": relative(dx, rdx)}
    errors.update({f"grad {i}": relative(g, r) for i, (g, r) in enumerate(zip(dws, rdws)) if r is not None})
    worst = max(errors, key=errors.get)
    torch_worst = max([relative(py, ry), relative(pdx, rdx)] +
                      [relative(g, r) for g, r in zip(pdws, rdws) if r is not None])
    assert errors[worst] <= max(TOLERANCE, 10 * torch_worst), \
        f"{worst}: {errors[worst]:.2e} (PyTorch's FP32 at worst {torch_worst:.2e})"
