"""Batch-size policies: which micro-batch sizes are benchmarked and planned with.

Names and meaning follow μ-cuDNN (seed 003, section 3.4) and its
``UCUDNN_BATCH_SIZE_POLICY`` variable:

* ``all`` — every size 1..B: always optimal, O(B) benchmarks.
* ``powerOfTwo`` — 1, 2, 4, ... up to B, plus B itself: O(log B) benchmarks.
* ``powerOfTwoAndMidpoints`` — ucudnn's addition: the powers of two and the
  midpoints between them (1, 2, 3, 4, 6, 8, 12, 16, 24, ...), plus B: about
  twice ``powerOfTwo``'s benchmarks.  Why: the fast algorithms' workspace
  grows with the micro-batch, so under a limit the best micro-batch is the
  largest that fits, and ``powerOfTwo`` can only round it down by up to 2x.
  Measured on an H100 (AlexNet b256, fp32 strict NHWC, 64 MiB per kernel),
  conv2's configurations fit 8 samples but not 16; every 8-sample step pays
  the algorithm's fixed cost again.
* ``undivided`` — B only: what plain cuDNN does (the baseline).

A table benchmarked under one policy can be planned under any policy whose
sizes it holds (``powerOfTwo`` from a ``powerOfTwoAndMidpoints`` or ``all``
table).
"""
from __future__ import annotations

from .errors import InputError

POLICIES = ("all", "powerOfTwo", "powerOfTwoAndMidpoints", "undivided")
_ALIASES = {p.lower(): p for p in POLICIES} | {"power_of_two": "powerOfTwo", "pow2": "powerOfTwo",
                                               "midpoints": "powerOfTwoAndMidpoints"}


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
        if policy == "powerOfTwoAndMidpoints" and b >= 2 and b + b // 2 < batch:
            sizes.append(b + b // 2)
        b *= 2
    sizes.append(batch)
    return sizes
