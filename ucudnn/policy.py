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
* ``powerOfTwoAndEvenSplits`` — ucudnn's addition: the powers of two and
  B's even splits, B // 2^j and ceil(B / 2^j) (127: 63 and 64, 31 and 32,
  ...), plus B: for a power-of-two B exactly ``powerOfTwo``'s sizes, else
  about twice as many.  Why: a mini-batch that is no power of two (127, 200,
  an epoch's last batch) can only be covered by ``powerOfTwo``'s sizes with a
  tail of small steps (127 = 64 + 32 + 16 + 8 + 4 + 2 + 1), each paying an
  algorithm's fixed cost; with its even splits it runs as 2^j near-equal
  micro-batches (127 = 64 + 63).  Planned from a recorded H100 table holding
  every size (AlexNet FP32, legacy, ``benchmarks/results/policy_sweep.md``),
  over mini-batches 33-256: the median plan 0.863 of the best any sizes give
  at 64 MiB per kernel with ``powerOfTwo``, 0.938 with even splits (0.910
  with midpoints), 0.898 / 0.976 at 256 MiB; 127 at 64 MiB 0.761 / 0.961.
  Executed (H200, ResNet-18 b127 FP32 training): 0.86-0.89x PyTorch's
  images/s with ``powerOfTwo``, 1.01-1.02x with even splits.  ucudnn's
  default when ``UCUDNN_BATCH_SIZE_POLICY`` is unset (``config.batch_policy``).
* ``undivided`` — B only: what plain cuDNN does (the baseline).

A table benchmarked under one policy can be planned under any policy whose
sizes it holds (``powerOfTwo`` from a ``powerOfTwoAndMidpoints`` or ``all``
table).
"""
from __future__ import annotations

from collections.abc import Iterable

from .errors import InputError

POLICIES = ("all", "powerOfTwo", "powerOfTwoAndMidpoints", "powerOfTwoAndEvenSplits", "undivided")
_ALIASES = {p.lower(): p for p in POLICIES} | {"power_of_two": "powerOfTwo", "pow2": "powerOfTwo",
                                               "midpoints": "powerOfTwoAndMidpoints",
                                               "evensplits": "powerOfTwoAndEvenSplits",
                                               "even_splits": "powerOfTwoAndEvenSplits"}


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
    if policy == "powerOfTwoAndEvenSplits":
        parts = 2
        while parts <= batch:
            sizes += [batch // parts, -(-batch // parts)]   # 2^j parts of these two sizes sum to batch
            parts *= 2
        return sorted(set(sizes))
    return sizes


def key_policy(policy: str, batch: int) -> str:
    """The policy name a cache key records for ``policy`` at mini-batch ``batch``: ``powerOfTwo`` where
    ``powerOfTwoAndEvenSplits`` measures exactly its sizes (a power-of-two batch), else ``policy`` itself.

    Why: the same sizes give the same measurements and plans, so tables, plans and bundles made at 64, 128 or 256
    serve both policies (a bundle precomputed under the default answers an even-splits job at its batch, and its
    odd last batch measures only the even splits: :func:`ucudnn.catalog.near_keys.from_larger_batch`)."""
    policy = normalize_policy(policy)
    if policy == "powerOfTwoAndEvenSplits" and batch >= 1 and batch & (batch - 1) == 0:
        return "powerOfTwo"
    return policy


def key_policy_of(policy: str, batches: Iterable[int]) -> str:
    """:func:`key_policy` for a whole table: at its mini-batch where all its kernels share one, else ``policy``
    (normalised).  What a table's plans are planned with, named by and keyed under (``ucudnn precompute``,
    ``ucudnn.torch.plan``'s WD bundles), so the default's even splits at a power-of-two batch answer the plan
    service's default request, ``powerOfTwo``: the same sizes, the same plan."""
    distinct = set(batches)
    return key_policy(policy, distinct.pop()) if len(distinct) == 1 else normalize_policy(policy)


# --- channel policies (issue 18) -------------------------------------------------------------------------------
#: Channel policies: which output-channel slice sizes a benchmark measures besides the whole k.
#:
#: * ``none`` — whole k only (the default: what every table before issue 18 holds).
#: * ``halves`` — k/2, k/4 and k/8 where integral: three slices, so the benchmark costs about 4x ``none``.
#: * ``powerOfTwo`` — every power of two below k.
#:
#: Why slices at all: FFT and Winograd-class algorithms keep workspace that scales with channels (transformed
#: filters K x C x tile, transformed outputs N x K x tile) and does not shrink by splitting the batch, so under a
#: limit they run on tiny micro-batches or not at all; a slice of K shrinks both.  Slices are multiples of
#: :data:`CHANNEL_ALIGN` so that every slice of y starts 16-byte aligned in both layouts and dtypes (the graph
#: API's tensors are declared 16-byte aligned).
CHANNEL_POLICIES = ("none", "halves", "powerOfTwo")
CHANNEL_ALIGN = 8


def normalize_channel_policy(name: str | None, field: str = "channel_policy") -> str:
    if name is None:
        return "none"
    for p in CHANNEL_POLICIES:
        if isinstance(name, str) and name.lower() == p.lower():
            return p
    raise InputError(f"unknown channel policy {name!r}; use one of {', '.join(CHANNEL_POLICIES)}", field)


def channel_policy_of(extra: dict) -> str:
    """The channel policy a benchmark table's ``extra`` records: absent means ``none`` (the benchmark writes it only
    for a policy that slices, and tables from before issue 18 have none)."""
    return normalize_channel_policy(extra.get("channel_policy"), "channel_policy")


def channel_sizes(policy: str | None, k: int, groups: int = 1) -> list[int]:
    """Channel-slice sizes (fewer than ``k``, multiples of :data:`CHANNEL_ALIGN`) ``policy`` measures, descending.

    Grouped convolutions get none: a slice of K would need the matching slice of C as well.
    """
    policy = normalize_channel_policy(policy)
    if policy == "none" or groups != 1:
        return []
    if policy == "halves":
        sizes = [k >> j for j in (1, 2, 3) if k % (1 << j) == 0]
    else:
        sizes = [1 << j for j in range(k.bit_length()) if (1 << j) < k]
    return sorted((c for c in sizes if c % CHANNEL_ALIGN == 0), reverse=True)
