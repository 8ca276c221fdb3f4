"""One workspace arena for a whole network (WD): each kernel's segment is an aligned offset into it.

WD (seed 003, section 3.1) replaces per-layer workspaces by one allocation
that the planner divides.  Layout rule: segments are laid end to end in
kernel order, each starting at a multiple of :data:`ALIGNMENT`.  No two
segments overlap, so any kernels may run at the same time (an inception
block's branches on separate streams) without a second thought; and since
the WD ILP budgets the *sum* of the (aligned) segment sizes, the end-to-end
layout always fits the budget.

Why 256 bytes: it is what ``cudaMalloc`` guarantees, so a segment is as
aligned as a workspace of its own would be, and cuDNN's (16-byte) and
vectorised kernels' requirements are met.  A coarser alignment (e.g. 1 MiB,
for allocator pages) would waste up to that much per kernel: 159 MiB on
ResNet-50's 159 kernels, more than some budgets.

Which kernels *may* run concurrently follows from the network's layer graph
(the ``after`` field of ``ucudnn-network/1``): see :func:`concurrent_kernels`.
"""
from __future__ import annotations

from itertools import combinations
from typing import Iterable, Sequence

from ..problem import OPS
from .network import Network
from .plan import Plan

ALIGNMENT = 256


def align_up(nbytes: int, alignment: int = ALIGNMENT) -> int:
    """``nbytes`` rounded up to a multiple of ``alignment``."""
    return -(-nbytes // alignment) * alignment


def assign_offsets(sizes: Sequence[int], alignment: int = ALIGNMENT) -> list[int]:
    """Offsets of segments of ``sizes`` laid end to end, each aligned; the arena needs sum(align_up(size))."""
    offsets, end = [], 0
    for size in sizes:
        offsets.append(end)
        end += align_up(size, alignment)
    return offsets


def arena_bytes(sizes: Iterable[int], alignment: int = ALIGNMENT) -> int:
    """Size of the arena :func:`assign_offsets` lays out for ``sizes``."""
    return sum(align_up(s, alignment) for s in sizes)


def concurrent_kernels(network: Network, ops: Sequence[str] = OPS) -> set[frozenset[str]]:
    """Pairs of kernel names (``layer/op``) that may run at the same time in a training step.

    Forward kernels follow the layer graph; backward kernels follow it
    reversed (a layer's gradients need those of the layers that consume its
    output).  All forwards precede all backwards.  Two kernels may overlap in
    time when neither depends, directly or not, on the other: parallel
    branches, and a layer's own backward_data and backward_filter (both only
    need the incoming gradient).
    """
    preds = network.predecessors()
    names = [layer["name"] for layer in network.layers]
    succs: dict[str, list[str]] = {n: [] for n in names}
    for n, ps in preds.items():
        for p in ps:
            succs[p].append(n)
    fwd_before = _ancestors(names, preds)                  # whose forward must finish before n's forward
    bwd_before = _ancestors(list(reversed(names)), succs)  # whose backward must finish before n's backward
    kernels = [(n, op) for n in names for op in ops]
    pairs: set[frozenset[str]] = set()
    for (a, op_a), (b, op_b) in combinations(kernels, 2):
        forward = op_a == "forward"
        if forward != (op_b == "forward"):
            continue  # the loss separates the forward pass from the backward pass
        before = fwd_before if forward else bwd_before
        if b not in before[a] and a not in before[b]:
            pairs.add(frozenset((f"{a}/{op_a}", f"{b}/{op_b}")))
    return pairs


def _ancestors(order: Sequence[str], parents: dict[str, list[str]]) -> dict[str, set[str]]:
    """Transitive parents of each node; ``order`` lists every node after its parents."""
    reach: dict[str, set[str]] = {}
    for n in order:
        reach[n] = set()
        for p in parents[n]:
            reach[n] |= {p} | reach[p]
    return reach


def overlapping_segments(plan: Plan, pairs: Iterable[frozenset[str]]) -> list[tuple[str, str]]:
    """Pairs among ``pairs`` (kernel names) whose arena segments overlap: each would be a data race."""
    seg = {k.name: (k.offset or 0, (k.offset or 0) + k.workspace_bytes) for k in plan.kernels}
    out = []
    for pair in pairs:
        a, b = sorted(pair)
        if a in seg and b in seg:
            (s1, e1), (s2, e2) = seg[a], seg[b]
            if s1 < e2 and s2 < e1:
                out.append((a, b))
    return sorted(out)
