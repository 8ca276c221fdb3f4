"""Networks as data: a list of conv layers (``ucudnn-network/1``), instantiated at a batch size.

Shipped specs live in ``ucudnn/data/networks`` (``alexnet``, ``resnet50``, ...);
a JSON file path works too.  Each layer yields three kernels named
``<layer>/forward``, ``<layer>/backward_data``, ``<layer>/backward_filter``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

from .errors import InputError
from .problem import OPS, ConvProblem, KernelSpec
from .schemas import validate

FORMAT = "ucudnn-network/1"


@dataclass
class Network:
    name: str
    layers: list[dict[str, Any]]
    default_batch: int = 1
    description: str = ""

    def kernels(self, batch: int | None = None, dtype: str = "float32", layout: str = "NCHW",
                ops: Sequence[str] = OPS) -> list[KernelSpec]:
        n = batch or self.default_batch
        out = []
        for layer in self.layers:
            p = ConvProblem(n, layer["c"], layer["h"], layer["w"], layer["k"], layer["r"], layer["s"],
                            tuple(layer.get("pad", (0, 0))), tuple(layer.get("stride", (1, 1))),
                            tuple(layer.get("dilation", (1, 1))), layer.get("groups", 1), dtype, layout)
            out.extend(KernelSpec(f"{layer['name']}/{op}", op, p) for op in ops)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "name": self.name, "description": self.description,
                "default_batch": self.default_batch, "layers": self.layers}


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
    return Network(doc["name"], doc["layers"], doc.get("default_batch", 1), doc.get("description", ""))
