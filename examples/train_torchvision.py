"""Train a torchvision model on synthetic data with ucudnn.torch.convert, beside plain PyTorch.

    python examples/train_torchvision.py --model resnet50 --batch 128 --workspace-limit 64MiB

Nothing is downloaded: the data are random tensors.  Prints images/s and peak GPU memory for plain PyTorch
(``cudnn.benchmark``, unbounded workspace) and for the same model converted to ucudnn's convolutions, whose
workspace stays under the per-kernel limit.  The first ucudnn step finds each convolution's plan (user cache,
plan server, bundles, else a benchmark with a progress bar); later runs start at once from the cache.
"""
from __future__ import annotations

import argparse
import time

import torch
import torchvision

import ucudnn.torch


def train(model: torch.nn.Module, batch: int, steps: int, amp: bool) -> tuple[float, float, float]:
    """(first step seconds, images/s over ``steps``, peak GiB allocated)."""
    fmt = torch.channels_last if amp else torch.contiguous_format
    model = model.cuda().to(memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, 224, 224, device="cuda").to(memory_format=fmt)
    y = torch.randint(0, 1000, (batch,), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return first, batch * steps / (time.perf_counter() - t0), torch.cuda.max_memory_allocated() / 2**30


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50", help="a torchvision.models constructor name")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--workspace-limit", default="64MiB", help="per convolution kernel")
    ap.add_argument("--amp", action="store_true", help="autocast float16 and channels_last")
    ap.add_argument("--strict", action="store_true", help="true FP32 (no TF32 in convolutions)")
    a = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = not a.strict
    for name, convert in (("PyTorch", False), (f"ucudnn {a.workspace_limit}/kernel", True)):
        torch.manual_seed(0)
        model = getattr(torchvision.models, a.model)(num_classes=1000)
        if convert:
            ucudnn.torch.convert(model, workspace_limit=a.workspace_limit)
        first, ips, peak = train(model, a.batch, a.steps, a.amp)
        print(f"{name:>24}: {ips:8.1f} images/s  peak {peak:6.2f} GiB  first step {first:6.1f} s")
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
