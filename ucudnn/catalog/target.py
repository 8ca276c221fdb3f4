"""Targets: a GPU model and a cuDNN version, the pair a measurement is valid for.

Bundles filter by target and precompute measures per target, so it lives
with the catalog, below both.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# Ray's rule (ray._private.accelerators.nvidia_gpu), so a unit's label is the resource its nodes advertise
_RAY_GPU_NAME = re.compile(r"\w+\s+((?:[A-Z]+\s+)*[A-Z0-9]*\d[A-Z0-9]*)")


@dataclass(frozen=True)
class Target:
    """A GPU model and cuDNN version: measurements are only valid for the pair they were taken on."""

    device: str
    cudnn_version: int

    @property
    def accelerator_type(self) -> str:
        """Ray's accelerator-type label for this device name (``NVIDIA H100 80GB HBM3`` -> ``H100``).

        Ray derives the same label from the device name on every GPU node
        (resource ``accelerator_type:H100``), which is how units find nodes of
        their model.
        """
        m = _RAY_GPU_NAME.match(self.device)
        label = m.group(1).replace(" ", "-") if m else None
        if label and len(label) > 1:
            return label
        return re.sub(r"^NVIDIA\s+", "", self.device).strip().replace(" ", "-") or self.device

    def label(self) -> str:
        return f"{self.accelerator_type} / cuDNN {self.cudnn_version}"

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "cudnn_version": self.cudnn_version, "accelerator_type": self.accelerator_type}
