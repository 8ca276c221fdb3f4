"""Network-wide layout choice (issue 19, seed 000): the chain DP and the graph ILP against brute force, never
worse than the best single layout or seed 000's heuristic, and clear errors on bad graphs."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ucudnn.errors import InputError
from ucudnn.planning.layouts import (INPUT, Node, choose_chain, choose_layouts, evaluate, seed_heuristic,
                                     single_layout)

LAYOUTS = ("NCHW", "NHWC", "CHWN")


def brute_force(nodes, transform, input_layout, output_layout=None):
    combos = itertools.product(*(sorted(n.costs) for n in nodes))
    return min((evaluate(nodes, {n.name: lay for n, lay in zip(nodes, c)}, transform, input_layout, output_layout)
                for c in combos), key=lambda a: a.total_ms)


def _transform(table):
    return lambda t, a, b: table[(t, a, b)]


@st.composite
def graphs(draw, chain: bool):
    n = draw(st.integers(1, 6))
    nodes, names = [], [INPUT]
    for i in range(n):
        if chain or i == 0:
            inputs = (names[-1],)
        else:   # a branch (any earlier layer) or a merge of two (concat / residual add)
            k = draw(st.integers(1, 2))
            inputs = tuple(sorted(set(draw(st.lists(st.sampled_from(names), min_size=k, max_size=k)))))
        supported = draw(st.lists(st.sampled_from(LAYOUTS), min_size=1, max_size=3, unique=True))
        costs = {lay: draw(st.floats(0.0, 10.0)) for lay in supported}
        nodes.append(Node(f"l{i}", inputs, costs))
        names.append(f"l{i}")
    table = {(t, a, b): draw(st.floats(0.0, 3.0)) for t in names for a in LAYOUTS for b in LAYOUTS}
    return nodes, _transform(table)


@settings(max_examples=150, deadline=None)
@given(g=graphs(chain=True), out=st.sampled_from([None, "NCHW", "NHWC"]))
def test_the_chain_dp_is_optimal(g, out):
    nodes, transform = g
    got = choose_chain(nodes, transform, "NCHW", out)
    assert got.total_ms == pytest.approx(brute_force(nodes, transform, "NCHW", out).total_ms)
    assert got.total_ms == pytest.approx(evaluate(nodes, got.layouts, transform, "NCHW", out).total_ms)


@settings(max_examples=60, deadline=None)
@given(g=graphs(chain=False), out=st.sampled_from([None, "NHWC"]))
def test_the_graph_choice_is_optimal_with_branches_and_merges(g, out):
    nodes, transform = g
    got = choose_layouts(nodes, transform, "NCHW", out)
    assert got.total_ms == pytest.approx(brute_force(nodes, transform, "NCHW", out).total_ms, abs=1e-6)


@settings(max_examples=60, deadline=None)
@given(g=graphs(chain=False))
def test_the_choice_is_never_slower_than_one_layout_for_the_whole_network_nor_the_seeds_heuristic(g):
    nodes, transform = g
    got = choose_layouts(nodes, transform, "NCHW")
    one = single_layout(nodes, transform, "NCHW")
    assert one is None or got.total_ms <= one.total_ms + 1e-6
    channels = {n.name: 3 if i == 0 else 256 for i, n in enumerate(nodes)}
    assert got.total_ms <= seed_heuristic(nodes, channels, 32, transform, "NCHW").total_ms + 1e-6


def test_a_tensor_read_by_two_layers_in_another_layout_is_transformed_once():
    nodes = [Node("squeeze", (INPUT,), {"NCHW": 1.0}),
             Node("expand1", ("squeeze",), {"NHWC": 1.0}), Node("expand3", ("squeeze",), {"NHWC": 2.0}),
             Node("concat", ("expand1", "expand3"), {"NHWC": 0.5})]
    got = choose_layouts(nodes, lambda t, a, b: 0.25, "NCHW")
    assert got.transforms == [("squeeze", "NCHW", "NHWC")] and got.total_ms == pytest.approx(4.75)


def test_the_seeds_rule_picks_chwn_for_few_channels_or_large_batches():
    nodes = [Node("conv1", (INPUT,), {"NCHW": 1, "CHWN": 1}), Node("conv2", ("conv1",), {"NCHW": 1, "CHWN": 1}),
             Node("pool", ("conv2",), {"NCHW": 1, "CHWN": 1})]
    free = lambda t, a, b: 0.0  # noqa: E731
    small = seed_heuristic(nodes, {"conv1": 3, "conv2": 256}, 32, free, "NCHW")
    assert small.layouts == {"conv1": "CHWN", "conv2": "NCHW", "pool": "CHWN"}
    assert set(seed_heuristic(nodes, {"conv1": 3, "conv2": 256}, 128, free, "NCHW").layouts.values()) == {"CHWN"}


@pytest.mark.parametrize("nodes, field", [
    ([Node("a", (INPUT,), {"NCHW": 1}), Node("a", ("a",), {"NCHW": 1})], "nodes[1].name"),
    ([Node("a", ("b",), {"NCHW": 1})], "nodes[0].inputs"),
])
def test_bad_graphs_are_refused_naming_the_field(nodes, field):
    with pytest.raises(InputError) as e:
        choose_layouts(nodes, lambda t, a, b: 0.0, "NCHW")
    assert e.value.field == field


def test_a_layer_without_layouts_or_with_a_bad_time_is_refused():
    with pytest.raises(InputError, match="supports no layout"):
        Node("a", (INPUT,), {})
    with pytest.raises(InputError) as e:
        Node("a", (INPUT,), {"NCHW": float("nan")})
    assert e.value.field == "a.costs.NCHW"
