"""Inference planning (issue 19) without a GPU: whole-graph network specs, fusable blocks found in the graph, the
choice of fusion and layouts from measured costs, the plan document, and the plan's steps computing the network
(run step by step in NumPy, layouts and transforms included, against the float64 reference)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ucudnn.errors import InputError
from ucudnn.execute.inference import random_weights, reference
from ucudnn.planning.inference import (FORMAT, LAYOUT_MARGIN, InferenceCosts, find_blocks, plan_inference, replan,
                                       wide_node)
from ucudnn.planning.network import Network, load_network, pool_plane
from ucudnn.problem import ConvProblem
from ucudnn.schemas import validate


# ---- specs ------------------------------------------------------------------------------------------------------------
def test_squeezenet_spec_is_a_whole_graph_ending_in_1000_probabilities():
    net = load_network("squeezenet1_1")
    assert net.is_graph and len(net.layers) == 26   # torchvision's squeezenet1_1 has 26 Conv2d
    shapes = net.shapes()
    assert shapes["features.0"] == (64, 111, 111) and shapes["features.2"] == (64, 55, 55)
    assert shapes["features.3"] == (128, 55, 55) and shapes["features.12"] == (512, 13, 13)
    assert shapes["softmax"] == (1000, 1, 1)


def test_mobilenet_v2_spec_folds_batchnorm_and_has_ten_residual_adds():
    net = load_network("mobilenet_v2")
    assert len(net.layers) == 53    # 52 Conv2d + the classifier Linear as a 1x1 conv
    adds = [n for n in net.nodes if n.get("op") == "add"]
    assert len(adds) == 10
    assert all(n.get("bn") for n in net.layers if n["name"] != "classifier.1")
    assert sum(1 for n in net.layers if n.get("act") == "relu6") == 35
    assert net.shapes()["features.18.0"] == (1280, 7, 7)


def test_training_users_see_only_the_conv_layers_of_a_graph_spec():
    net = load_network("squeezenet1_1")
    kernels = net.kernels(ops=["forward"])
    assert len(kernels) == 26
    preds = net.predecessors()
    # through the concat and the max-pool: fire 4's squeeze reads fire 3's two expands
    assert preds["features.4.squeeze"] == ["features.3.expand1x1", "features.3.expand3x3"]
    assert preds["features.6.squeeze"] == ["features.4.expand1x1", "features.4.expand3x3"]


def test_conv_only_specs_keep_their_old_predecessors():
    net = load_network("resnet18")
    assert not net.is_graph
    preds = net.predecessors()
    assert preds == {l["name"]: l.get("after", [prev["name"]] if prev else [])
                     for prev, l in zip([None] + net.layers[:-1], net.layers)}


def _graph(nodes):
    return {"format": "ucudnn-network/1", "name": "g", "layers": nodes}


def _conv(name, c, h, k, r=1, **kw):
    return {"name": name, "c": c, "h": h, "w": h, "k": k, "r": r, "s": r, **kw}


def test_a_conv_that_does_not_fit_its_input_is_named(tmp_path):
    doc = _graph([_conv("a", 3, 8, 4), {"name": "p", "op": "pool", "mode": "max", "window": [2, 2]},
                  _conv("b", 4, 8, 4)])
    f = tmp_path / "g.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(InputError) as e:
        load_network(str(f))
    assert e.value.field == "layers[2].h"


def test_concat_needs_two_inputs_by_schema(tmp_path):
    doc = _graph([_conv("a", 3, 8, 4), {"name": "cat", "op": "concat", "after": ["a"]}])
    f = tmp_path / "g.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(InputError) as e:
        load_network(str(f))
    assert "layers[1]" in e.value.field


@settings(deadline=None)
@given(st.integers(1, 40), st.integers(1, 5), st.integers(1, 4), st.integers(0, 2), st.booleans())
def test_pool_plane_matches_pytorch(size, win, stride, pad, ceil):
    torch = pytest.importorskip("torch")
    pad = min(pad, win // 2)
    if size + 2 * pad < win:
        return
    node = {"window": [win, win], "stride": [stride, stride], "pad": [pad, pad], "ceil_mode": ceil}
    y = torch.nn.functional.max_pool2d(torch.zeros(1, 1, size, size), win, stride, pad, ceil_mode=ceil)
    assert pool_plane(node, size, size) == tuple(y.shape[2:])


# ---- blocks -----------------------------------------------------------------------------------------------------------
def test_every_fire_module_is_a_split_block_and_its_expands_a_wide_block():
    blocks = find_blocks(load_network("squeezenet1_1"))
    assert [b.mode for b in blocks] == ["split"] * 8 + ["wide"] * 8
    b = blocks[0]
    assert b.convs == ("features.3.squeeze", "features.3.expand1x1", "features.3.expand3x3")
    assert b.output == "features.3" and b.inputs == ("features.2",)
    w = blocks[8]
    assert w.convs == ("features.3.expand1x1", "features.3.expand3x3")
    assert w.nodes == (*w.convs, "features.3") and w.output == "features.3" and w.inputs == ("features.3.squeeze",)


def test_a_wide_conv_stacks_the_filters_in_concat_order_centred_in_the_largest_window():
    net = load_network("squeezenet1_1")
    m = wide_node(net, ("features.3.expand1x1", "features.3.expand3x3"))
    assert (m["c"], m["h"], m["k"], m["r"], m["s"], m["pad"]) == (16, 55, 128, 3, 3, [1, 1])
    assert m["bias"] and m["act"] == "relu"


@pytest.mark.parametrize("b_kw, merged", [
    (dict(r=3, pad=[1, 1]), (3, 3, [1, 1])),                       # 1x1 + 3x3 'same'
    (dict(r=5, pad=[2, 2]), (5, 5, [2, 2])),
    (dict(r=3, pad=[0, 0]), None),                                 # 3x3 'valid' vs 1x1: planes differ
    (dict(r=3, pad=[1, 1], stride=[2, 2]), None),                  # strides differ
    (dict(r=3, pad=[1, 1], act="relu6"), None),                    # activations differ
    (dict(r=2, pad=[1, 1]), None),                                 # an even difference cannot be centred
    (dict(r=3, pad=[1, 1], groups=2), None),
])
def test_which_parallel_convs_can_be_one_conv(b_kw, merged):
    kw = {k: v for k, v in b_kw.items() if k != "r"}
    kw.setdefault("act", "relu")
    net = Network("w", [_conv("s", 4, 6, 4, after=[]), _conv("a", 4, 6, 2, act="relu", after=["s"]),
                        _conv("b", 4, 6, 6, b_kw["r"], after=["s"], **kw)])
    m = wide_node(net, ("a", "b"))
    assert (None if m is None else (m["r"], m["s"], m["pad"])) == merged


def test_one_by_three_and_three_by_one_make_a_three_by_three():
    net = Network("w", [_conv("s", 4, 6, 4, after=[]),
                        {"name": "a", "c": 4, "h": 6, "w": 6, "k": 2, "r": 1, "s": 3, "pad": [0, 1], "after": ["s"]},
                        {"name": "b", "c": 4, "h": 6, "w": 6, "k": 3, "r": 3, "s": 1, "pad": [1, 0], "after": ["s"]}])
    m = wide_node(net, ("a", "b"))
    assert (m["k"], m["r"], m["s"], m["pad"]) == (5, 3, 3, [1, 1])


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([(1, 0), (3, 1), (5, 2)]), st.sampled_from([(1, 0), (3, 1)]),
       st.integers(1, 3), st.booleans())
def test_the_wide_conv_computes_the_concatenation(seed, f1, f2, stride, bias_b):
    """wide_weights: one conv over the stacked, zero-padded filters equals the concat of the separate convs."""
    from ucudnn.execute.inference import wide_weights
    from ucudnn.kernels.reference import conv2d_nchw

    rng = np.random.default_rng(seed)
    a = {"name": "a", "c": 3, "h": 9, "w": 7, "k": 2, "r": f1[0], "s": f1[0], "pad": [f1[1]] * 2,
         "stride": [stride] * 2, "bias": True, "after": []}
    b = {"name": "b", "c": 3, "h": 9, "w": 7, "k": 4, "r": f2[0], "s": f2[0], "pad": [f2[1]] * 2,
         "stride": [stride] * 2, "bias": bias_b, "after": []}
    net = Network("w", [a, b, {"name": "cat", "op": "concat", "after": ["a", "b"]}])
    w = random_weights(net, seed)
    x = rng.standard_normal((2, 3, 9, 7))

    def conv(n, wb):
        y = conv2d_nchw(x, wb[0], tuple(n["pad"]), tuple(n["stride"]))
        return y if wb[1] is None else y + wb[1][None, :, None, None]

    m = wide_node(net, ("a", "b"))
    ww, wb = wide_weights(net, ("a", "b"), w)
    assert ww.shape == (6, 3, m["r"], m["s"]) and wb.shape == (6,)
    np.testing.assert_allclose(conv(m, (ww, wb)), np.concatenate([conv(a, w["a"]), conv(b, w["b"])], axis=1),
                               rtol=1e-12, atol=1e-12)


def test_mobilenet_blocks_are_overlapping_straight_pairs():
    blocks = find_blocks(load_network("mobilenet_v2"))
    assert {b.mode for b in blocks} == {"straight"}
    names = {b.convs for b in blocks}
    assert ("features.2.conv.0.0", "features.2.conv.1.0") in names      # expand -> depthwise
    assert ("features.2.conv.1.0", "features.2.conv.2") in names        # depthwise -> project
    # a projection read by a residual add is not fused with the next expansion
    assert not any(b.convs[0] == "features.3.conv.2" for b in blocks)


def test_a_residual_add_of_two_convs_into_a_conv_is_a_merge_block():
    net = Network("m", [_conv("a", 8, 4, 16, after=[]), _conv("b", 8, 4, 16, after=[]),
                        {"name": "sum", "op": "add", "after": ["a", "b"], "act": "relu"},
                        _conv("c", 16, 4, 8)])
    (b,) = [b for b in find_blocks(net) if b.mode == "merge"]
    assert b.convs == ("a", "b", "c") and b.merge_relu and b.nodes == ("a", "b", "sum", "c")


# ---- planning from costs ------------------------------------------------------------------------------------------------
def _kernel_plan(net, name, layout, batch, node=None):
    l = node or {n["name"]: n for n in net.nodes}[name]
    p = ConvProblem(batch, l["c"], l["h"], l["w"], l["k"], l["r"], l["s"], tuple(l.get("pad", (0, 0))),
                    tuple(l.get("stride", (1, 1))), (1, 1), l.get("groups", 1), "float32", layout)
    return {"name": name, "op": "forward", "problem": p.to_dict(), "time_ms": 0.01, "workspace_bytes": 0,
            "micro_batches": [{"micro_batch": batch, "algo": 1, "time_ms": 0.01, "workspace_bytes": 0,
                               "math_type": "DEFAULT", "source": "legacy"}]}


def fake_costs(net, rng, batch=1, fused_factor=None, layouts=("NCHW", "NHWC")):
    """Random but complete costs: every node in every layout, every block fused, every transform."""
    c = InferenceCosts(net.name, batch, "float32", "strict", 8 << 20, "test")
    for n in net.nodes:
        for lo in layouts:
            c.nodes.setdefault(n["name"], {})[lo] = float(rng.uniform(0.005, 0.05))
            if n.get("op", "conv") == "conv":
                c.conv_plans.setdefault(n["name"], {})[lo] = _kernel_plan(net, n["name"], lo, batch)
    for b in find_blocks(net):
        for lo in layouts:
            per = sum(c.nodes[x][lo] for x in b.nodes)
            f = fused_factor if fused_factor is not None else rng.uniform(0.4, 1.3)
            c.blocks.setdefault(b.name, {})[lo] = float(per * f)
            c.tilings.setdefault(b.name, {})[lo] = [4, 4, 1, 128]
            if b.mode == "wide":
                c.conv_plans.setdefault(b.name, {})[lo] = _kernel_plan(net, b.name, lo, batch,
                                                                       wide_node(net, b.convs))
    for t in ["input", *(n["name"] for n in net.nodes)]:
        c.transforms[t] = {"NCHW>NHWC": float(rng.uniform(0, 0.02)), "NHWC>NCHW": float(rng.uniform(0, 0.02))}
    return c


def _check_steps(doc):
    made = {"input"}
    for s in doc["steps"]:
        assert all(i in made for i in s["inputs"]), s
        made.add(s["name"])
        made.update(s["nodes"])
    assert doc["output"] in made


def test_fire_modules_fuse_when_fusion_is_faster_and_not_when_slower():
    net = load_network("squeezenet1_1")
    rng = np.random.default_rng(0)
    fast = plan_inference(net, fake_costs(net, rng, fused_factor=0.5))
    assert sum(s["kind"] == "fused" for s in fast["steps"]) == 8
    slow = plan_inference(net, fake_costs(net, rng, fused_factor=1.5))
    assert not any(s["kind"] == "fused" for s in slow["steps"])
    for doc in (fast, slow):
        validate(doc, FORMAT)
        _check_steps(doc)
        assert doc["predicted_ms"] == pytest.approx(sum(s["ms"] for s in doc["steps"]), abs=1e-5)


def test_a_block_measured_on_a_tensor_core_kernel_names_it_and_its_tiling_in_the_plan():
    """The costs name the kernel where it is not the FMA one; the plan's fused step carries it (schema-valid), a
    replan from the document keeps it, and blocks on the FMA kernel keep the old form (no kernel field)."""
    net = load_network("squeezenet1_1")
    costs = fake_costs(net, np.random.default_rng(3), fused_factor=0.5)
    fire = next(b for b in find_blocks(net) if b.mode == "split")
    for lo in ("NCHW", "NHWC"):
        costs.block_kernels.setdefault(fire.name, {})[lo] = "spatial"
        costs.tilings[fire.name][lo] = [4, 8, 8, 2]
    doc = plan_inference(net, costs)
    validate(doc, FORMAT)
    fused = [s for s in doc["steps"] if s["kind"] == "fused"]
    assert len(fused) == 8
    for s in fused:
        if tuple(s["convs"]) == fire.convs:
            assert s["kernel"] == "spatial" and s["tiling"] == [4, 8, 8, 2]
        else:
            assert "kernel" not in s and len(s["tiling"]) == 4
    assert replan(json.loads(json.dumps(doc)))["steps"] == doc["steps"]


def test_overlapping_candidates_never_share_a_layer():
    net = load_network("mobilenet_v2")
    doc = plan_inference(net, fake_costs(net, np.random.default_rng(1), fused_factor=0.5))
    covered = [n for s in doc["steps"] for n in s["nodes"]]
    assert len(covered) == len(set(covered)) == len(net.nodes)
    assert sum(s["kind"] == "fused" for s in doc["steps"]) > 10


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), st.sampled_from(["squeezenet1_1", "mobilenet_v2"]),
       st.sampled_from(["NCHW", "NHWC"]))
def test_the_plan_never_loses_to_one_layout_the_seed_rule_or_no_fusion(seed, name, layout):
    net = load_network(name)
    doc = plan_inference(net, fake_costs(net, np.random.default_rng(seed)), input_layout=layout)
    # the plan's prediction sums its steps' times, each rounded to 1e-6 ms, where a baseline rounds its total once
    rounding = 0.5e-6 * (len(doc["steps"]) + 1)
    for how, ms in doc["baselines"].items():    # a single layout strictly; others within the noise margin
        assert ms is not None and doc["predicted_ms"] <= ms * (1 + (how not in ("NCHW", "NHWC")) * LAYOUT_MARGIN) \
            + rounding, how
    _check_steps(doc)


def _layouts_used(doc):
    return {s["layout"] for s in doc["steps"] if s["kind"] != "transform"}


@pytest.mark.parametrize("spread, mixed", [(0.003, False), (0.3, True)])
def test_a_mixed_layout_plan_must_win_by_more_than_the_timing_noise(spread, mixed):
    """Free transforms and each part's NHWC time within +-spread of its NCHW time: the per-part choice mixes
    layouts; predicted 0.3% ahead (spread 0.003) the single best layout runs instead, 30% ahead the mix."""
    net = load_network("squeezenet1_1")
    rng = np.random.default_rng(4)
    c = fake_costs(net, rng)
    for table in (c.nodes, c.blocks):
        for per in table.values():
            per["NHWC"] = per["NCHW"] * float(rng.uniform(1 - spread, 1 + spread))
    c.transforms = {t: {k: 0.0 for k in v} for t, v in c.transforms.items()}
    doc = plan_inference(net, c)
    single = min(doc["baselines"]["NCHW"], doc["baselines"]["NHWC"])
    assert (len(_layouts_used(doc)) > 1) is mixed
    if mixed:
        assert doc["predicted_ms"] * (1 + LAYOUT_MARGIN) < single
    else:
        assert doc["predicted_ms"] == pytest.approx(single, abs=1e-5)
    assert doc["predicted_ms"] <= doc["baselines"]["seed_heuristic"] * (1 + LAYOUT_MARGIN)


def test_replan_from_a_plans_costs_needs_no_gpu_and_can_turn_fusion_off():
    net = load_network("squeezenet1_1")
    doc = plan_inference(net, fake_costs(net, np.random.default_rng(2), fused_factor=0.5))
    again = replan(json.loads(json.dumps(doc)))
    assert again["steps"] == doc["steps"]
    plain = replan(doc, fuse=False)
    assert not any(s["kind"] == "fused" for s in plain["steps"])
    assert plain["predicted_ms"] == pytest.approx(doc["baselines"]["unfused"])


def test_costs_for_another_network_are_refused():
    net = load_network("squeezenet1_1")
    c = fake_costs(net, np.random.default_rng(0))
    c.network = "alexnet"
    with pytest.raises(InputError) as e:
        plan_inference(net, c)
    assert e.value.field == "costs.network"


def test_a_node_without_any_measured_time_is_named():
    net = load_network("squeezenet1_1")
    c = fake_costs(net, np.random.default_rng(0))
    del c.nodes["features.2"]
    c.declined["features.2"] = "ceil_mode not supported"
    with pytest.raises(InputError) as e:
        plan_inference(net, c)
    assert e.value.field == "costs.nodes.features.2" and "ceil_mode" in str(e.value)


# ---- the steps compute the network --------------------------------------------------------------------------------------
def _to(a, src, dst):
    if src == dst:
        return a
    return a.transpose(0, 2, 3, 1) if dst == "NHWC" else a.transpose(0, 3, 1, 2)


def run_plan_numpy(doc, weights, x):
    """The plan's steps in NumPy, each in its layout: what the GPU session does, launch by launch (each node
    computed in float64 NCHW, every tensor stored in its step's layout and read back through that layout)."""
    net = Network(doc["network"]["name"], doc["network"]["layers"])
    node = {n["name"]: n for n in net.nodes}
    shapes = net.shapes()
    ins = net.inputs()
    vals = {"input": _to(x, "NCHW", doc["input_layout"])}
    for s in doc["steps"]:
        lo = s["layout"]
        if s["kind"] == "transform":
            vals[s["name"]] = _to(vals[s["inputs"][0]], s["from"], s["to"])
            continue
        given = {t.split("@")[0]: _to(vals[t], lo, "NCHW") for t in s["inputs"]}
        inner = {}
        for n in s["nodes"]:
            args = [inner[a] if a in inner else given[a] for a in (ins[n] or ["input"])]
            inner[n] = _node_value(node[n], args, shapes[n], weights)
        vals[s["name"]] = _to(inner[s["name"]], "NCHW", lo)
    return _to(vals[doc["output"]], doc["output_layout"], "NCHW")


def _node_value(node, args, shape, weights):
    from ucudnn.execute import inference as inf
    from ucudnn.kernels.fused import activate

    op = node.get("op", "conv")
    if op == "conv":
        return reference(Network("one", [dict(node, after=[])]), weights, args[0])
    if op == "concat":
        return np.concatenate(args, axis=1)
    if op == "add":
        return activate(args[0] + args[1], node.get("act") or "none")
    if op == "pool":
        return inf._pool64(args[0], node, shape[1:])
    if op == "global_avg_pool":
        return args[0].mean(axis=(2, 3), keepdims=True)
    e = np.exp(args[0] - args[0].max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _small_fire_net():
    """Two fire modules, a pool, a residual add of two projections read by a conv, global pool, softmax."""
    L = [_conv("stem", 3, 13, 8, 3, pad=[1, 1], stride=[2, 2], bias=True, act="relu"),
         {"name": "pool", "op": "pool", "mode": "max", "window": [3, 3], "stride": [2, 2], "ceil_mode": True}]
    c = 8
    for i in (1, 2):
        L += [_conv(f"f{i}.sq", c, 3, 4, bias=True, act="relu"),
              _conv(f"f{i}.e1", 4, 3, 6, bias=True, act="relu", after=[f"f{i}.sq"]),
              _conv(f"f{i}.e3", 4, 3, 6, 3, pad=[1, 1], bias=True, act="relu", after=[f"f{i}.sq"]),
              {"name": f"f{i}", "op": "concat", "after": [f"f{i}.e1", f"f{i}.e3"]}]
        c = 12
    L += [_conv("pa", 12, 3, 12, bias=True, after=["f2"]), _conv("pb", 12, 3, 12, bias=True, after=["f2"]),
          {"name": "res", "op": "add", "after": ["pa", "pb"], "act": "relu"},
          _conv("dw", 12, 3, 12, 3, pad=[1, 1], groups=12, bias=True, act="relu6"),
          _conv("proj", 12, 3, 10, bias=True),
          {"name": "gap", "op": "global_avg_pool"}, {"name": "prob", "op": "softmax"}]
    return Network("small", L)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(["NCHW", "NHWC"]), st.sampled_from([None, 0.5, 1.5]))
def test_the_plans_steps_compute_the_network(seed, layout, factor):
    net = _small_fire_net()
    net.shapes()
    rng = np.random.default_rng(seed)
    doc = plan_inference(net, fake_costs(net, rng, batch=2, fused_factor=factor), input_layout=layout)
    w = random_weights(net, seed)
    x = rng.standard_normal((2, 3, 13, 13))
    got = run_plan_numpy(doc, w, x)
    want = reference(net, w, x)
    assert got.shape == want.shape == (2, 10, 1, 1)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    assert math.isclose(float(want.sum()), 2.0)


def test_the_reference_equals_torch_on_the_small_graph():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    net = _small_fire_net()
    w = random_weights(net, 3)
    x = np.random.default_rng(3).standard_normal((2, 3, 13, 13))
    t = {k: (torch.tensor(a), None if b is None else torch.tensor(b)) for k, (a, b) in w.items()}
    node = {n["name"]: n for n in net.nodes}

    def conv(name, v):
        n = node[name]
        return F.conv2d(v, *t[name], stride=tuple(n.get("stride", (1, 1))), padding=tuple(n.get("pad", (0, 0))),
                        groups=n.get("groups", 1))

    v = F.relu(conv("stem", torch.tensor(x)))
    v = F.max_pool2d(v, 3, 2, ceil_mode=True)
    for i in (1, 2):
        s = F.relu(conv(f"f{i}.sq", v))
        v = torch.cat([F.relu(conv(f"f{i}.e1", s)), F.relu(conv(f"f{i}.e3", s))], 1)
    v = F.relu(conv("pa", v) + conv("pb", v))
    v = conv("proj", F.relu6(conv("dw", v)))
    v = torch.softmax(F.adaptive_avg_pool2d(v, 1), dim=1)
    np.testing.assert_allclose(reference(net, w, x), v.numpy(), rtol=1e-10, atol=1e-12)


def test_a_plan_restricted_to_one_layout_runs_every_layer_in_it_and_is_no_faster():
    net = load_network("squeezenet1_1")
    c = fake_costs(net, np.random.default_rng(4))
    free = plan_inference(net, c)
    for lo in ("NCHW", "NHWC"):
        one = plan_inference(net, c, layouts=[lo])
        assert {s["layout"] for s in one["steps"] if s["kind"] != "transform"} == {lo}
        assert one["predicted_ms"] >= free["predicted_ms"] - 1e-9
    with pytest.raises(InputError) as e:
        plan_inference(net, c, layouts=["CHWN"])
    assert e.value.field == "layouts"


# ---- ucudnn.torch.Inference: argument errors (CPU) ---------------------------------------------------------------------
def test_torch_inference_refuses_a_training_model_and_a_cpu_model():
    torch = pytest.importorskip("torch")
    import ucudnn.torch

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3))
    with pytest.raises(InputError) as e:
        ucudnn.torch.Inference(model, "squeezenet1_1")
    assert e.value.field == "model" and "eval" in str(e.value)
    with pytest.raises(InputError) as e:
        ucudnn.torch.Inference(model.eval(), "squeezenet1_1")
    assert e.value.field == "model" and "cpu" in str(e.value)


# ---- the command line ----------------------------------------------------------------------------------------------------
def test_cli_replans_an_inference_plan_without_a_gpu(tmp_path, capsys):
    from ucudnn.cli import main

    net = load_network("squeezenet1_1")
    doc = plan_inference(net, fake_costs(net, np.random.default_rng(7), fused_factor=0.5))
    f = tmp_path / "sq.json"
    f.write_text(json.dumps(doc))
    out = tmp_path / "plain.json"
    assert main(["plan", "--inference", "--from-plan", str(f), "--no-fuse", "-o", str(out)]) == 0
    assert "total (predicted)" in capsys.readouterr().out
    plain = json.loads(out.read_text())
    validate(plain, FORMAT)
    assert not any(s["kind"] == "fused" for s in plain["steps"])
    assert main(["plan", "--inference", "--from-plan", str(f), "--layout", "NHWC", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["input_layout"] == "NHWC"


def test_cli_inference_refuses_training_options(tmp_path):
    from ucudnn.cli import main

    assert main(["plan", "--network", "squeezenet1_1", "--inference", "--policy", "wd"]) == 2


# ---- cuDNN's fused conv + bias + activation as one more way to run a conv --------------------------------------------
def test_a_conv_runs_its_fused_epilogue_where_that_is_faster_and_its_wr_plan_where_not():
    net = load_network("squeezenet1_1")
    c = fake_costs(net, np.random.default_rng(5), fused_factor=1.5, layouts=("NHWC",))
    fast, slow = "features.0", "classifier.1"
    c.epilogues[fast] = {"NHWC": {"engine": "eng7_k2=1", "workspace_bytes": 0, "ms": c.nodes[fast]["NHWC"] / 2}}
    c.epilogues[slow] = {"NHWC": {"engine": "eng7_k2=1", "workspace_bytes": 0, "ms": c.nodes[slow]["NHWC"] * 2}}
    doc = plan_inference(net, c, input_layout="NHWC", layouts=["NHWC"])
    validate(doc, FORMAT)
    step = {s["name"]: s for s in doc["steps"]}
    assert step[fast]["epilogue"]["engine"] == "eng7_k2=1"
    assert step[fast]["ms"] == pytest.approx(c.nodes[fast]["NHWC"] / 2, abs=1e-6)
    assert "epilogue" not in step[slow] and step[slow]["ms"] == pytest.approx(c.nodes[slow]["NHWC"], abs=1e-6)
    without = replan(doc, epilogues=False)
    assert not any("epilogue" in s for s in without["steps"]) and without["epilogues"] is False
    assert without["predicted_ms"] > doc["predicted_ms"]


def test_a_wide_block_runs_as_one_conv_step_writing_the_concat():
    net = load_network("squeezenet1_1")
    c = fake_costs(net, np.random.default_rng(6), fused_factor=1.5)
    for b in find_blocks(net):
        if b.mode == "wide":   # the merged conv: a third of its layers' time
            for lo in ("NCHW", "NHWC"):
                c.blocks[b.name][lo] = sum(c.nodes[x][lo] for x in b.nodes) / 3
    doc = plan_inference(net, c)
    wide = [s for s in doc["steps"] if s["kind"] == "wide_conv"]
    assert len(wide) == 8
    assert wide[0]["name"] == "features.3" and wide[0]["inputs"][0].startswith("features.3.squeeze")
    assert wide[0]["kernel_plan"]["problem"]["k"] == 128
    _check_steps(doc)
    assert not any(s["kind"] == "concat" for s in doc["steps"])
    assert replan(doc, fuse=False)["predicted_ms"] == pytest.approx(doc["baselines"]["unfused"])
