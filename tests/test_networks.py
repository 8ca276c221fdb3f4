"""Networks as data: shipped specs are consistent, the layer graph is checked, PyTorch modules convert."""
from __future__ import annotations

import json

import pytest

from ucudnn.errors import InputError
from ucudnn.planning.arena import concurrent_kernels
from ucudnn.planning.network import builtin_networks, from_torch, load_network

SHIPPED = ["alexnet", "resnet18", "resnet50", "vgg16", "googlenet_inception3a"]


def test_the_issue_networks_are_shipped():
    assert set(SHIPPED) <= set(builtin_networks())


@pytest.mark.parametrize("name", SHIPPED)
def test_each_layer_gives_three_kernels_with_valid_problems(name):
    net = load_network(name)
    kernels = net.kernels()
    assert len(kernels) == 3 * len(net.layers)
    assert all(k.problem.n == net.default_batch for k in kernels)
    assert len({k.name for k in kernels}) == len(kernels)


@pytest.mark.parametrize("name", ["alexnet", "resnet18", "vgg16", "googlenet_inception3a"])
def test_each_layer_consumes_what_its_predecessors_produce(name):
    """Channels match (sum for a residual add) and spatial size is the output or a pooled version of it."""
    net = load_network(name)
    by_name = {layer["name"]: layer for layer in net.layers}
    problems = {k.name.split("/")[0]: k.problem for k in net.kernels(ops=["forward"])}
    for layer, preds in ((by_name[n], ps) for n, ps in net.predecessors().items()):
        for p in preds:
            assert layer["c"] == by_name[p]["k"], (layer["name"], p)
            assert layer["h"] <= problems[p].p and layer["w"] <= problems[p].q, (layer["name"], p)


def test_vgg16_has_thirteen_conv_layers_and_resnet18_twenty():
    assert len(load_network("vgg16").layers) == 13
    assert len(load_network("resnet18").layers) == 20


def test_repeated_resnet_layers_share_problems():
    kernels = load_network("resnet18").kernels(ops=["forward"])
    assert len({k.problem for k in kernels}) < len(kernels)


def test_inception_branches_are_independent():
    pairs = concurrent_kernels(load_network("googlenet_inception3a"), ops=["forward"])
    p = "inception3a."
    assert frozenset({p + "1x1/forward", p + "3x3/forward"}) in pairs
    assert frozenset({p + "5x5/forward", p + "pool_proj/forward"}) in pairs
    assert frozenset({p + "3x3_reduce/forward", p + "3x3/forward"}) not in pairs


def test_a_downsample_may_run_beside_its_blocks_first_conv():
    pairs = concurrent_kernels(load_network("resnet18"), ops=["forward"])
    assert frozenset({"layer2.0.conv1/forward", "layer2.0.downsample.0/forward"}) in pairs
    assert frozenset({"layer2.0.conv2/forward", "layer2.1.conv1/forward"}) not in pairs


def test_after_must_name_an_earlier_layer(tmp_path):
    doc = json.loads(json.dumps(load_network("googlenet_inception3a").to_dict()))
    doc["layers"][2]["after"] = ["inception3a.5x5"]  # a later layer: not a topological order
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match=r"layers\[2\]\.after\[0\]"):
        load_network(path)


def test_from_torch_records_the_shapes_each_conv_receives():
    torch = pytest.importorskip("torch")
    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 5, stride=2, padding="valid"), nn.Conv2d(32, 32, 3, padding="same",
                                                                               groups=4, dilation=2))
    net = from_torch(model, (64, 3, 32, 32), name="tiny")
    assert net.default_batch == 64 and net.name == "tiny"
    assert [(l["name"], l["c"], l["h"], l["k"], l["r"], l["pad"], l["stride"]) for l in net.layers] == [
        ("0", 3, 32, 16, 3, [1, 1], [1, 1]), ("3", 16, 16, 32, 5, [0, 0], [2, 2]), ("4", 32, 6, 32, 3, [2, 2], [1, 1])]
    assert net.layers[2]["groups"] == 4 and net.layers[2]["dilation"] == [2, 2]
    assert len(net.kernels()) == 9


def _resnet18(nn):
    """torchvision's ResNet-18 layer for layer (same module names), without needing torchvision."""
    class Block(nn.Module):
        def __init__(self, c, k, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(c, k, 3, stride, 1, bias=False)
            self.conv2 = nn.Conv2d(k, k, 3, 1, 1, bias=False)
            self.downsample = (nn.Sequential(nn.Conv2d(c, k, 1, stride, bias=False))
                               if stride != 1 or c != k else None)

        def forward(self, x):
            y = self.conv2(self.conv1(x).relu())
            return (y + (self.downsample(x) if self.downsample is not None else x)).relu()

    class ResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            c = 64
            for i, (k, stride) in enumerate([(64, 1), (128, 2), (256, 2), (512, 2)], 1):
                setattr(self, f"layer{i}", nn.Sequential(Block(c, k, stride), Block(k, k, 1)))
                c = k

        def forward(self, x):
            x = self.maxpool(self.conv1(x))
            return self.layer4(self.layer3(self.layer2(self.layer1(x))))

    return ResNet18()


def test_from_torch_matches_the_shipped_resnet18():
    torch = pytest.importorskip("torch")
    net = from_torch(_resnet18(torch.nn), (128, 3, 224, 224))
    shipped = load_network("resnet18")
    strip = lambda layer: {k: v for k, v in layer.items() if k != "after"}  # noqa: E731
    assert sorted(map(json.dumps, map(strip, net.layers))) == sorted(map(json.dumps, map(strip, shipped.layers)))
    assert net.default_batch == shipped.default_batch


def test_from_torch_refuses_a_bad_input_shape():
    torch = pytest.importorskip("torch")
    with pytest.raises(InputError, match="input_shape"):
        from_torch(torch.nn.Conv2d(3, 8, 3), (3, 32, 32))
