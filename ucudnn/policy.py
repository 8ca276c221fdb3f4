"""Batch-size policies: which micro-batch sizes are benchmarked and planned with.

Names and meaning follow μ-cuDNN (seed 003, section 3.4) and its
``UCUDNN_BATCH_SIZE_POLICY`` variable:

* ``all`` — every size 1..B: always optimal, O(B) benchmarks.
* ``powerOfTwo`` — 1, 2, 4, ... up to B, plus B itself: O(log B) benchmarks.
* ``undivided`` — B only: what plain cuDNN does (the baseline).
"""
from __future__ import annotations

from .errors import InputError

POLICIES = ("all", "powerOfTwo", "undivided")
_ALIASES = {p.lower(): p for p in POLICIES} | {"poweroftwo": "powerOfTwo", "power_of_two": "powerOfTwo", "pow2": "powerOfTwo"}


def normalize_policy(name: str, field: str = "batch_policy") -> str:
    if not isinstance(name, str) or name.lower() not in _ALIASES:
        raise InputError(f"unknown batch-size policy {name!r}; use one of {', '.join(POLICIES)}", field)
    return _ALIASES[name.lower()]


def micro_batch_sizes(policy: str, batch: int) -> list[int]:
    """The micro-batch sizes ``policy`` benchmarks for a mini-batch of ``batch``, ascending."""
    policy = normalize_policy(policy)
    if batch < 1:
        raise InputError(f"mini-batch size must be positive, got {batch}", "n")
    if policy == "all":
        return list(range(1, batch + 1))
    if policy == "undivided":
        return [batch]
    sizes, b = [], 1
    while b < batch:
        sizes.append(b)
        b *= 2
    sizes.append(batch)
    return sizes
