"""The workspace arena: aligned end-to-end segments, and which kernels may run at the same time."""
from __future__ import annotations

import synthetic
from hypothesis import given
from hypothesis import strategies as st

from ucudnn.planning.arena import (
    ALIGNMENT,
    align_up,
    arena_bytes,
    assign_offsets,
    concurrent_kernels,
    overlapping_segments,
)
from ucudnn.planning.network import Network
from ucudnn.planning.wd import plan_wd


def layer(name: str, after: list[str] | None = None) -> dict:
    d = {"name": name, "c": 8, "h": 8, "w": 8, "k": 8, "r": 3, "s": 3, "pad": [1, 1]}
    if after is not None:
        d["after"] = after
    return d


@given(st.lists(st.integers(0, 1 << 30), max_size=50), st.sampled_from([1, 16, 256, 1 << 20]))
def test_segments_are_aligned_disjoint_and_fill_exactly_the_aligned_sum(sizes, alignment):
    offsets = assign_offsets(sizes, alignment)
    assert all(o % alignment == 0 for o in offsets)
    ends = [o + s for o, s in zip(offsets, sizes)]
    assert all(end <= nxt for end, nxt in zip(ends, offsets[1:]))
    assert max(ends, default=0) <= arena_bytes(sizes, alignment) == sum(align_up(s, alignment) for s in sizes)


def test_alignment_is_what_cuda_malloc_guarantees():
    assert ALIGNMENT == 256
    assert align_up(0) == 0 and align_up(1) == 256 and align_up(256) == 256 and align_up(257) == 512


def test_a_chain_of_layers_has_no_concurrent_forwards_but_each_layer_can_overlap_its_two_gradients():
    net = Network("chain", [layer("a"), layer("b"), layer("c")])
    pairs = concurrent_kernels(net)
    assert frozenset({"a/forward", "b/forward"}) not in pairs
    assert frozenset({"b/backward_data", "b/backward_filter"}) in pairs
    assert frozenset({"a/backward_filter", "b/backward_filter"}) not in pairs
    assert not any(all(k.endswith("/forward") for k in pair) for pair in pairs)


def test_inception_branches_may_run_concurrently_but_not_a_branch_with_its_own_reduce():
    net = Network("block", [layer("b1", []), layer("b2r", []), layer("b2", ["b2r"]), layer("b3r", []),
                            layer("b3", ["b3r"]), layer("cat", ["b1", "b2", "b3"])])
    pairs = concurrent_kernels(net, ops=["forward"])
    assert frozenset({"b1/forward", "b2/forward"}) in pairs
    assert frozenset({"b2/forward", "b3r/forward"}) in pairs
    assert frozenset({"b2r/forward", "b2/forward"}) not in pairs
    assert frozenset({"b1/forward", "cat/forward"}) not in pairs
    back = concurrent_kernels(net, ops=["backward_data"])
    assert frozenset({"b2r/backward_data", "b3/backward_data"}) in back
    assert frozenset({"b2r/backward_data", "b2/backward_data"}) not in back


def test_wd_plans_leave_no_concurrent_kernels_sharing_workspace():
    t = synthetic.table(n_kernels=4, batch=16, policy="powerOfTwo")
    plan = plan_wd(t, 64 * synthetic.MiB, "powerOfTwo")
    every_pair = {frozenset((a.name, b.name)) for a in plan.kernels for b in plan.kernels if a.name != b.name}
    assert overlapping_segments(plan, every_pair) == []


def test_overlap_is_detected_when_segments_collide():
    t = synthetic.table(n_kernels=3, batch=16, policy="powerOfTwo")
    plan = plan_wd(t, 1 << 40, "powerOfTwo")
    a, b, c = plan.kernels
    a.configs = b.configs = c.configs = [m for m in max((a.configs, b.configs, c.configs),
                                                         key=lambda cs: max(x.workspace_bytes for x in cs))]
    assert a.workspace_bytes > 0
    a.offset, b.offset, c.offset = 0, a.workspace_bytes - 1, 2 * a.workspace_bytes
    pairs = [frozenset((a.name, b.name)), frozenset((a.name, c.name))]
    assert overlapping_segments(plan, pairs) == [tuple(sorted((a.name, b.name)))]
