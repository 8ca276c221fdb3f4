"""Networks as data (``ucudnn-network/1``), instantiated at a batch size.

Shipped specs live in ``ucudnn/data/networks`` (``alexnet``, ``resnet50``, ...);
a JSON file path works too.  Each conv layer yields three kernels named
``<layer>/forward``, ``<layer>/backward_data``, ``<layer>/backward_filter``.

Training plans need the conv layers only, and most specs list only those.  Inference (issue 19) needs the whole
graph: a spec may also list pooling, channel concatenation, residual adds and softmax as nodes (``op``), with
each conv's bias, activation and folded BatchNorm; ``after`` then names a node's data inputs.
:attr:`Network.layers` stays the conv layers, so training users see the same network either way;
:meth:`Network.shapes` follows the data through the whole graph and is what inference planning checks.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ..errors import InputError
from ..problem import OPS, ConvProblem, KernelSpec
from ..schemas import validate

if TYPE_CHECKING:
    from .table import BenchmarkTable

FORMAT = "ucudnn-network/1"


NODE_OPS = ("conv", "pool", "global_avg_pool", "concat", "add", "softmax")


def op_of(node: dict[str, Any]) -> str:
    return node.get("op", "conv")


@dataclass
class Network:
    """A network's nodes in topological order (conv layers and, for inference, the rest of the graph)."""

    name: str
    nodes: list[dict[str, Any]]
    default_batch: int = 1
    description: str = ""

    @property
    def layers(self) -> list[dict[str, Any]]:
        """The conv layers (what training plans and benchmarks see)."""
        return [n for n in self.nodes if op_of(n) == "conv"]

    @property
    def is_graph(self) -> bool:
        """Whether the spec lists more than conv layers (pooling, concat, add, softmax): a whole inference graph."""
        return any(op_of(n) != "conv" for n in self.nodes)

    def kernels(self, batch: int | None = None, dtype: str = "float32", layout: str = "NCHW",
                ops: Sequence[str] = OPS) -> list[KernelSpec]:
        n = batch or self.default_batch
        out = []
        for layer in self.layers:
            p = problem_of(layer, n, dtype, layout)
            out.extend(KernelSpec(f"{layer['name']}/{op}", op, p) for op in ops)
        return out

    def inputs(self) -> dict[str, list[str]]:
        """Each node's data inputs: its ``after`` list, else the previous node; ``[]``: the network's input."""
        out: dict[str, list[str]] = {}
        prev: list[str] = []
        for node in self.nodes:
            out[node["name"]] = list(node.get("after", prev))
            prev = [node["name"]]
        return out

    def predecessors(self) -> dict[str, list[str]]:
        """Each conv layer's inputs among the conv layers: the nearest conv layers upstream of its ``after`` list
        (else of the previous node), looking through pooling, concat and add nodes.

        Layers with no path between them (an inception block's branches) are
        independent: their kernels may run concurrently (see :mod:`ucudnn.planning.arena`).
        """
        inputs = self.inputs()
        ops = {n["name"]: op_of(n) for n in self.nodes}
        convs: dict[str, list[str]] = {}   # node -> the conv layers it reads from, nearest first
        out: dict[str, list[str]] = {}
        for node in self.nodes:
            ups: list[str] = []
            for i in inputs[node["name"]]:
                for c in ([i] if ops[i] == "conv" else convs[i]):
                    if c not in ups:
                        ups.append(c)
            if op_of(node) == "conv":
                out[node["name"]] = ups
            convs[node["name"]] = ups
        return out

    def input_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of the network's input: that of the first node reading it (a conv layer)."""
        inputs = self.inputs()
        for i, node in enumerate(self.nodes):
            if not inputs[node["name"]]:
                if op_of(node) != "conv":
                    raise InputError("the network's input must be read by a conv layer (its c, h, w give its shape)",
                                     f"layers[{i}].op")
                return node["c"], node["h"], node["w"]
        raise InputError("no node reads the network's input", "layers")

    def shapes(self) -> dict[str, tuple[int, int, int]]:
        """(C, H, W) of every node's output, following the data from the input; per sample.

        Raises :class:`InputError` naming the field when a node does not fit its inputs (a conv's ``c``, ``h``,
        ``w`` must be its input's shape, concatenated inputs share their plane, added ones their shape): the
        check a whole-graph spec must pass before it is planned for inference.
        """
        inputs = self.inputs()
        x = self.input_shape()
        out: dict[str, tuple[int, int, int]] = {}
        for i, node in enumerate(self.nodes):
            ins = [out[a] if a in out else None for a in inputs[node["name"]]] or [x]
            op = op_of(node)
            where = f"layers[{i}]"
            if op == "conv":
                c, h, w = ins[0]
                for f, v in (("c", c), ("h", h), ("w", w)):
                    if node[f] != v:
                        raise InputError(f"{node['name']}: {f} = {node[f]} but its input {inputs[node['name']] or ['input']} "
                                         f"has {f} = {v}", f"{where}.{f}")
                if len(ins) != 1:
                    raise InputError(f"a conv layer reads one input, got {len(ins)}", f"{where}.after")
                p = problem_of(node, 1)
                out[node["name"]] = (node["k"], p.p, p.q)
            elif op == "pool":
                c, h, w = ins[0]
                out[node["name"]] = (c, *pool_plane(node, h, w, where))
            elif op == "global_avg_pool":
                out[node["name"]] = (ins[0][0], 1, 1)
            elif op == "concat":
                if len({s[1:] for s in ins}) != 1:
                    raise InputError(f"concatenated inputs must share their plane, got {ins}", f"{where}.after")
                out[node["name"]] = (sum(s[0] for s in ins), *ins[0][1:])
            elif op == "add":
                if len(set(ins)) != 1:
                    raise InputError(f"added inputs must have one shape, got {ins}", f"{where}.after")
                out[node["name"]] = ins[0]
            else:  # softmax: over channels
                out[node["name"]] = ins[0]
            if min(out[node["name"]]) < 1:
                raise InputError(f"{node['name']} leaves an empty output {out[node['name']]}", where)
        return out

    def consumers(self) -> dict[str, list[str]]:
        """Which nodes read each node's output (``input``: the network's input)."""
        out: dict[str, list[str]] = {"input": [], **{n["name"]: [] for n in self.nodes}}
        for name, ins in self.inputs().items():
            for i in ins or ["input"]:
                out[i].append(name)
        return out

    def table_from(self, table: "BenchmarkTable", batch: int | None = None, dtype: str | None = None,
                   layout: str | None = None) -> "BenchmarkTable":
        """This network's kernels, each with the measurements ``table`` holds for its (problem, op).

        Recorded tables keep one entry per distinct (problem, op) (ResNet-50:
        69 of 159 kernels); whole-network planning needs every kernel, since
        each takes its own workspace segment.  Batch, dtype and layout default
        to those of the table.  A kernel the table lacks is an error naming it.
        """
        from .table import BenchmarkTable, KernelBench

        first = table.kernels[0].problem
        specs = self.kernels(batch or first.n, dtype or first.dtype, layout or first.layout)
        by_key = {(k.problem, k.op): k for k in table.kernels}
        missing = [s.name for s in specs if (s.problem, s.op) not in by_key]
        if missing:
            raise InputError(f"the table has no measurements for {len(missing)} of the network's {len(specs)} kernels "
                             f"({', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}); benchmark them with "
                             f"ucudnn bench --network {self.name}", "network")
        kernels = []
        for s in specs:
            src = by_key[(s.problem, s.op)]
            kernels.append(KernelBench(s.name, s.op, s.problem, src.measurements, src.skipped, src.benchmark_seconds))
        return BenchmarkTable(table.device, table.cudnn_version, kernels, table.numerics,
                              dict(table.extra, network=self.name))

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "name": self.name, "description": self.description,
                "default_batch": self.default_batch, "layers": self.nodes}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "Network":
        """The network of a ``ucudnn-network/1`` document already validated (:func:`load_network` validates)."""
        return cls(doc["name"], doc["layers"], doc.get("default_batch", 1), doc.get("description", ""))


def problem_of(layer: dict[str, Any], batch: int, dtype: str = "float32", layout: str = "NCHW") -> ConvProblem:
    """A conv layer's problem at ``batch``."""
    return ConvProblem(batch, layer["c"], layer["h"], layer["w"], layer["k"], layer["r"], layer["s"],
                       tuple(layer.get("pad", (0, 0))), tuple(layer.get("stride", (1, 1))),
                       tuple(layer.get("dilation", (1, 1))), layer.get("groups", 1), dtype, layout)


def pool_plane(node: dict[str, Any], h: int, w: int, where: str = "pool") -> tuple[int, int]:
    """A pooling node's output plane, as PyTorch computes it (``ceil_mode``: a last window that starts inside the
    padded input counts)."""
    win = node["window"]
    stride = node.get("stride", win)
    pad = node.get("pad", (0, 0))
    out = []
    for size, k, s, p in zip((h, w), win, stride, pad):
        if 2 * p > k:
            raise InputError(f"pad must be at most half the window, got {p} for {k}", f"{where}.pad")
        span = size + 2 * p - k
        o = (-(-span // s) if node.get("ceil_mode") else span // s) + 1
        if node.get("ceil_mode") and (o - 1) * s >= size + p:
            o -= 1
        out.append(o)
    return out[0], out[1]


def builtin_networks() -> list[str]:
    root = resources.files("ucudnn.data.networks")
    return sorted(p.name.removesuffix(".json") for p in root.iterdir() if p.name.endswith(".json"))


def load_network(name_or_path: str | Path) -> Network:
    """A shipped network by name (``alexnet``) or a ``ucudnn-network/1`` JSON file."""
    s = str(name_or_path)
    res = resources.files("ucudnn.data.networks").joinpath(s + ".json")
    if res.is_file():
        text = res.read_text()
    else:
        try:
            text = Path(s).read_text()
        except OSError:
            raise InputError(f"no shipped network {s!r} and no such file; shipped: {', '.join(builtin_networks())}",
                             "network") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"not valid JSON: {e}", "network") from None
    validate(doc, FORMAT)
    _check_layer_graph(doc["layers"])
    net = Network.from_dict(doc)
    if net.is_graph:
        net.shapes()  # a whole graph must be consistent: errors name the node's field
    return net


def _check_layer_graph(layers: list[dict[str, Any]]) -> None:
    """Names are unique and ``after`` names earlier layers only (so the list is a topological order)."""
    seen: set[str] = set()
    for i, layer in enumerate(layers):
        for j, dep in enumerate(layer.get("after", [])):
            if dep not in seen:
                raise InputError(f"{dep!r} is not the name of an earlier layer", f"layers[{i}].after[{j}]")
        if layer["name"] in seen:
            raise InputError(f"duplicate layer name {layer['name']!r}", f"layers[{i}].name")
        seen.add(layer["name"])
        if layer.get("op", "conv") not in ("concat", "add") and len(layer.get("after", [])) > 1 and \
                any(op_of(x) != "conv" for x in layers):
            raise InputError(f"a {layer.get('op', 'conv')} node reads one input", f"layers[{i}].after")


def from_torch(module: Any, input_shape: Sequence[int], name: str | None = None,
               description: str = "") -> Network:
    """The conv layers of a PyTorch ``module`` as a :class:`Network`, found by running it once.

    Forward hooks on every ``torch.nn.Conv2d`` record the shape each one
    actually receives, which a static walk of the module tree cannot know
    (pooling, strides, branches).  The module runs once on CPU zeros of batch
    1 (cheap even for big networks); ``input_shape[0]`` becomes the
    network's default batch.  Layers are listed in call order, named by their
    module path; a layer called twice (weight sharing) is listed once per call.
    No ``after`` fields are inferred, so each layer depends on the previous
    one: safe (nothing is assumed concurrent), if more serial than the graph.
    torch is optional: this imports it lazily.
    """
    import torch  # optional dependency: only this function needs it

    if len(input_shape) != 4 or any(not isinstance(d, int) or d < 1 for d in input_shape):
        raise InputError(f"expected (N, C, H, W) positive integers, got {tuple(input_shape)!r}", "input_shape")
    names = {m: n for n, m in module.named_modules()}
    layers: list[dict[str, Any]] = []
    calls: dict[str, int] = {}

    def hook(conv: Any, inputs: tuple, _output: Any) -> None:
        x = inputs[0]
        base = names.get(conv) or f"conv{len(layers)}"
        calls[base] = calls.get(base, 0) + 1
        lname = base if calls[base] == 1 else f"{base}#{calls[base]}"
        if isinstance(conv.padding, str):  # 'same' / 'valid': the padding PyTorch applies
            if conv.padding == "valid":
                pad = [0, 0]
            else:
                pad = [conv.dilation[d] * (conv.kernel_size[d] - 1) // 2 for d in range(2)]
                if any(conv.dilation[d] * (conv.kernel_size[d] - 1) % 2 for d in range(2)):
                    raise InputError(f"{lname}: asymmetric 'same' padding cannot be described", "module")
        else:
            pad = list(conv.padding)
        layer = {"name": lname, "c": int(x.shape[1]), "h": int(x.shape[2]), "w": int(x.shape[3]),
                 "k": int(conv.out_channels), "r": int(conv.kernel_size[0]), "s": int(conv.kernel_size[1]),
                 "pad": pad, "stride": list(conv.stride)}
        if tuple(conv.dilation) != (1, 1):
            layer["dilation"] = list(conv.dilation)
        if conv.groups != 1:
            layer["groups"] = int(conv.groups)
        layers.append(layer)

    handles = [m.register_forward_hook(hook) for m in module.modules() if isinstance(m, torch.nn.Conv2d)]
    if not handles:
        raise InputError("the module has no Conv2d layers", "module")
    was_training = module.training
    try:
        module.eval()
        param = next(module.parameters(), None)
        device = param.device if param is not None else "cpu"
        with torch.no_grad():
            module(torch.zeros((1, *input_shape[1:]), device=device))
    finally:
        for h in handles:
            h.remove()
        module.train(was_training)
    return Network(name or type(module).__name__.lower(), layers, int(input_shape[0]), description)


def from_factory(spec: str, input_shape: Sequence[int], batch: int = 1, name: str | None = None) -> Network:
    """A network from a Python factory of PyTorch modules, ``"torchvision.models:resnet50"``: imported, called
    with no arguments, traced by :func:`from_torch` on CPU at ``input_shape`` (C, H, W) and ``batch``.

    For ``ucudnn precompute --torch-model``: a cluster precomputes plans for the models it trains, not only
    for the shipped networks.
    """
    import importlib

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InputError(f"expected MODULE:FACTORY such as torchvision.models:resnet50, got {spec!r}", "torch_model")
    if len(input_shape) != 3:
        raise InputError(f"expected C,H,W, got {tuple(input_shape)!r}", "input_shape")
    try:
        factory = importlib.import_module(module_name)
        for part in attr.split("."):
            factory = getattr(factory, part)
    except (ImportError, AttributeError) as e:
        raise InputError(f"cannot load {spec!r}: {e}", "torch_model") from None
    if not callable(factory):
        raise InputError(f"{spec!r} is not callable", "torch_model")
    return from_torch(factory(), (int(batch), *(int(d) for d in input_shape)),
                      name or attr.rsplit(".", 1)[-1], f"traced from {spec} at {tuple(input_shape)}")
