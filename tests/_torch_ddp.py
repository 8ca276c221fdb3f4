"""What the DDP tests of ucudnn.torch share (``test_torch.py``: two CPU processes over gloo; ``test_gpu_torch.py``:
one GPU process over NCCL): a plain model and two converted copies -- converted before ``DistributedDataParallel``
wraps them and after -- train the same steps on each rank's own data and must end where the plain one ends, and a
converted DDP model's checkpoint loads into a plain one.

Why: issue 15 promises that DDP wrapping keeps working across a convert.  DDP holds the model's Parameter objects
(its reducer hooks their gradient accumulation and buckets their gradients), so a convert that made new parameters,
or a backward that wrote gradients around autograd, would train each rank alone.

Imported only by tests that have already checked torch is installed.
"""
from __future__ import annotations

import copy
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
        nn.Conv2d(8, 16, (3, 5), stride=2, bias=False), nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding="same", groups=16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5),
    )


def train_plain_and_converted(rank: int, world: int, init_file: str, backend: str, device: str,
                              steps: int = 4, rtol: float = 0.0, atol: float = 0.0) -> None:
    """Run on every rank of a ``world``-rank group (``init_file``: the file store's path): trains the three models
    and asserts their parameters equal the plain one's within (``rtol``, ``atol``) after ``steps`` SGD steps with
    momentum, and that each rank's plain parameters equal rank 0's (the gradients were averaged)."""
    import ucudnn.torch as ut

    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        if device == "cuda":
            torch.cuda.set_device(0)
        plain = net().to(device)
        before = ut.convert(copy.deepcopy(plain), workspace_limit="1MiB")
        models = [DDP(plain), DDP(before), DDP(copy.deepcopy(plain))]
        ut.convert(models[2], workspace_limit="1MiB")   # converted inside its DDP wrapper
        assert sum(type(m) is ut.Conv2d for m in models[2].modules()) == 3
        opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in models]
        g = torch.Generator().manual_seed(100 + rank)   # each rank its own data
        for _ in range(steps):
            x = torch.randn(6, 3, 19, 17, generator=g).to(device)
            t = torch.randint(0, 5, (6,), generator=g).to(device)
            for m, opt in zip(models, opts):
                opt.zero_grad(set_to_none=True)
                nn.functional.cross_entropy(m(x), t).backward()
                opt.step()
        ref = list(models[0].parameters())
        for m in models[1:]:
            for p, q in zip(m.parameters(), ref):
                torch.testing.assert_close(p, q, rtol=rtol, atol=atol)
        flat = torch.cat([p.detach().reshape(-1) for p in ref])
        gathered = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(gathered, flat)
        assert all(torch.equal(gathered[0], f) for f in gathered)
        # a converted DDP model's checkpoint ("module."-prefixed keys) loads into a plain DDP model
        state = models[2].state_dict()
        fresh = DDP(net().to(device))
        fresh.load_state_dict(state)
        assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), models[2].parameters()))
    finally:
        dist.destroy_process_group()


def spawned(rank: int, world: int, init_file: str) -> None:
    """``torch.multiprocessing.spawn``'s entry point for the CPU test (gloo)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    train_plain_and_converted(rank, world, init_file, "gloo", "cpu")


def _gpu_spawned(rank: int, init_file: str, compiled: bool) -> None:
    """The GPU test's process: the launch path its file specifies, then one rank over NCCL."""
    from ucudnn.torch import fastpath

    if compiled:
        assert fastpath.start(wait=True), f"the compiled launch path did not load ({fastpath.state()})"
    else:
        fastpath.ready = lambda: False   # as test_gpu_torch.py's python_path fixture
    train_plain_and_converted(rank, 1, init_file, "nccl", "cuda", rtol=1e-4, atol=1e-5)


def check_ddp_on_one_gpu(tmp_path, compiled: bool) -> None:
    """The GPU tests' form: one GPU, NCCL, a group of one (it still runs DDP's reducer: hooks, buckets, an
    all-reduce a step), in a process of its own (NCCL's state and memory stay out of the test session: a memory
    cap test after it in the same process failed); converted layers at 1 MiB run micro-batched plans, so the
    comparison is within strict FP32's tolerance over four steps, not exact."""
    import pytest
    import torch.multiprocessing as mp

    if not dist.is_available() or not dist.is_nccl_available():
        pytest.skip("this torch has no NCCL backend")
    mp.spawn(_gpu_spawned, args=(str(tmp_path / "store"), compiled), nprocs=1, join=True)
