"""Measurements held under keys near the one the lookup chain asked for (:mod:`ucudnn.catalog.lookup`).

Two uses of the same comparison of measurement keys: saying why a bundle for this GPU and cuDNN did not answer
(:func:`why_missing`: the closest keys of the same convolution and what they differ in), and planning a kernel
from the same kernel's measurements at a larger mini-batch (:func:`from_larger_batch`, found by
:func:`find_larger_batch` in the user cache and the bundles).  Pure: the layers are passed in.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Sequence

from ..planning.table import KernelBench
from .store import key_id


#: the parts of a convolution a measurement key names besides its shape, in the order a reason lists them
_ASPECTS = ("n", "dtype", "layout", "numerics", "batch_policy", "sources", "channel_policy")


def _aspects(key: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """(op and shape, the other aspects) of a measurement key."""
    problem = dict(key.get("problem") or {})
    aspects = {"n": problem.pop("n", None), "dtype": problem.pop("dtype", None),
               "layout": problem.pop("layout", None), "numerics": key.get("numerics"),
               "batch_policy": key.get("batch_policy"), "sources": key.get("sources"),
               "channel_policy": key.get("channel_policy")}
    return (key.get("op"), tuple(sorted((k, str(v)) for k, v in problem.items()))), aspects


def _shown(aspect: str, value: Any) -> str:
    """One aspect's value as a reason says it (a key leaves out sources for legacy alone and the channel policy
    ``none``: ``ucudnn.api._cache_key``)."""
    if aspect == "n":
        return f"batch {value}"
    if aspect in ("dtype", "layout"):
        return str(value)
    if value is None:
        value = {"sources": "legacy", "channel_policy": "none"}.get(aspect, value)
    return f"{aspect.replace('_', ' ')} {value}"


def why_missing(wanted: dict[str, Any], held: Sequence[dict[str, Any]]) -> str:
    """Why measurements under ``held`` keys do not answer ``wanted`` (a bench key of the same GPU and cuDNN): the
    closest held keys of the same convolution (op and shape) and what they differ in -- the batch size a bundle was
    precomputed at, its dtype or layout, numerics, batch policy, sources -- else that it holds no measurement of
    this convolution.  Why: a bundle that does not answer costs a benchmark, and a user who installed one needs to
    know which flag of ``ucudnn precompute`` to change."""
    shape, want = _aspects(wanted)
    near: list[dict[str, Any]] = []
    for key in held:
        other_shape, have = _aspects(key)
        if other_shape == shape:
            near.append({a: have[a] for a in _ASPECTS if have[a] != want[a]})
    if not near:
        return "it holds no measurements of this convolution"
    fewest = min(len(d) for d in near)
    if fewest == 0:   # the same aspects under a key that differs elsewhere (a field this ucudnn does not name)
        return "it holds this convolution under a key this ucudnn does not write"
    closest = [d for d in near if len(d) == fewest]
    parts = []
    for a in (a for a in _ASPECTS if any(a in d for d in closest)):
        values = sorted({d[a] for d in closest if a in d}, key=lambda v: (v is None, v if a == "n" else str(v)))
        parts.append(f"{', '.join(_shown(a, v) for v in values)} (this call: {_shown(a, want[a])})")
    return "it holds this convolution at " + "; ".join(parts)


def describe_key(key: dict[str, Any]) -> str:
    """``forward n96 c96 27x27 -> k256 5x5 ...`` (:meth:`ConvProblem.describe`) for a key's op and problem."""
    from ..problem import ConvProblem

    try:
        return f"{key.get('op')} {ConvProblem.from_dict(key['problem']).describe()}"
    except Exception:  # noqa: BLE001 - a reason is never worth an error: a key of another version says its op
        return str(key.get("op"))


#: bundle path -> (its file's (mtime, size), its measurement keys for the target asked): read once per version
_held_keys: dict[str, tuple[tuple, tuple[str, int], list[dict[str, Any]]]] = {}


def bundle_keys(path: str | Path, reader: Any, target: tuple[str, int]) -> list[dict[str, Any]] | None:
    """The measurement keys bundle ``path`` holds for ``target`` (None where the reader cannot list them), read
    once per version of its file: a cluster's bundle may hold thousands, and every kernel a job lacks asks."""
    keys_of = getattr(reader, "kernel_bench_keys", None)
    if keys_of is None:
        return None
    try:
        st = Path(path).stat()
        version = (st.st_mtime_ns, st.st_size)
    except OSError:
        version = None
    cached = _held_keys.get(str(path))
    if cached is None or cached[0] != version or cached[1] != target or version is None:
        cached = (version, target, keys_of(*target))
        _held_keys[str(path)] = cached
    return cached[2]


#: (store URL, target) -> (when its keys were last read, key id -> key): the user cache's keys, read again only
#: from rows written since (a cache of months holds thousands: parsing them all on each kernel a cold first step
#: lacks cost 76 ms a kernel at 5000 keys)
_store_keys: dict[tuple[str, tuple[str, int]], tuple[float, dict[str, dict[str, Any]]]] = {}
#: seconds of overlap when reading rows written since the last read (another process may stamp a row just
#: before it commits)
_OVERLAP_S = 2.0


def store_keys(store: Any, target: tuple[str, int]) -> list[dict[str, Any]]:
    """The measurement keys the user cache ``store`` holds for ``target`` (none where it cannot list them)."""
    keys_of = getattr(store, "kernel_bench_keys", None)
    if keys_of is None:
        return []
    url = getattr(store, "url", None)
    if not url:
        return keys_of(*target)
    seen = _store_keys.get((str(url), target))
    now = time.time()
    fresh = keys_of(*target, since=seen[0] - _OVERLAP_S) if seen else keys_of(*target)
    held = dict(seen[1]) if seen else {}
    held.update((key_id(k), k) for k in fresh)
    _store_keys[(str(url), target)] = (now, held)
    return list(held.values())


def miss_reason(path: str | Path, reader: Any, bench_key: dict[str, Any], target: tuple[str, int]) -> str | None:
    """The reason bundle ``path`` does not answer ``bench_key`` (None where the reader cannot list its keys)."""
    held = bundle_keys(path, reader, target)
    if held is None:
        return None
    return f"bundle {path} has no measurements of {describe_key(bench_key)}: {why_missing(bench_key, held)}"


def from_larger_batch(held: KernelBench, bench_key: dict[str, Any],
                      measure_batch: Callable[[list[int]], KernelBench]) -> KernelBench | None:
    """This kernel's measurements at mini-batch n (``bench_key``) from ``held``, the same kernel's at a larger
    mini-batch N under the same batch policy: a micro-batch's rows do not depend on the mini-batch it is part of
    (each is the convolution of that many images), so the sizes the policy measured for N are taken as they are,
    and only the sizes it wants for n and did not measure for N are measured (``measure_batch(sizes)``): n itself
    under powers of two, midpoints and ``all`` (every other size of theirs for n is one of N's), nothing where the
    policy measured n for N too (n = 64 from N = 128 under ``powerOfTwo``), n's odd even splits under
    ``powerOfTwoAndEvenSplits`` (127 from 256: 3, 7, 15, 31, 63 and 127).  None where N gives none of n's sizes
    (``undivided``): the caller benchmarks the whole kernel.

    Why: a job whose batch differs from the one its plans were made at (a bundle precomputed at 128, a job at 96;
    an epoch's last, smaller batch; an evaluation batch) would otherwise benchmark every kernel again, most of it
    the same micro-batches."""
    from ..policy import micro_batch_sizes
    from ..problem import ConvProblem

    problem = ConvProblem.from_dict(bench_key["problem"])
    policy = bench_key["batch_policy"]
    n, big = problem.n, held.problem.n
    if big <= n:
        return None
    wanted, measured = micro_batch_sizes(policy, n), set(micro_batch_sizes(policy, big))
    lacking = [m for m in wanted if m not in measured]
    if len(lacking) == len(wanted):   # nothing to take (undivided): benchmark it
        return None
    keep, new_sizes = set(wanted) - set(lacking), set(lacking)
    rows = [m for m in held.measurements if m.micro_batch in keep]
    skipped = [s for s in held.skipped if s.micro_batch in keep]
    seconds = None
    if lacking:
        new = measure_batch(lacking)
        rows += [m for m in new.measurements if m.micro_batch in new_sizes]
        skipped += [s for s in new.skipped if s.micro_batch in new_sizes]
        seconds = new.benchmark_seconds
    return KernelBench(held.name, held.op, problem, rows, skipped, seconds)


def _without_n_and_policy(key: dict[str, Any]) -> dict[str, Any]:
    """A measurement key without its problem's mini-batch and its batch policy: equal for the same kernel at any
    batch (policies are compared by the sizes they measure there: :func:`find_larger_batch`)."""
    return {**{k: v for k, v in key.items() if k != "batch_policy"},
            "problem": {k: v for k, v in (key.get("problem") or {}).items() if k != "n"}}


def find_larger_batch(bench_key: dict[str, Any], target: tuple[str, int], store: Any,
                      bundles: Sequence[str | Path], open_bundle: Callable[[str | Path], Any] | None
                      ) -> tuple[str, KernelBench] | None:
    """(where, measurements) of this kernel at the smallest mini-batch larger than ``bench_key``'s that the user
    cache or a bundle holds under an otherwise equal key; None if none does."""
    from ..policy import micro_batch_sizes

    n, policy = bench_key["problem"]["n"], bench_key.get("batch_policy")
    wanted = _without_n_and_policy(bench_key)

    def larger_n(key: dict[str, Any]) -> int | None:
        m = (key.get("problem") or {}).get("n")
        if not (isinstance(m, int) and m > n and _without_n_and_policy(key) == wanted):
            return None
        theirs = key.get("batch_policy")
        if theirs != policy:   # another name measuring the same sizes there (powerOfTwo for even splits at 256)
            try:
                if micro_batch_sizes(theirs, m) != micro_batch_sizes(policy, m):
                    return None
            except Exception:  # noqa: BLE001 - a policy this version does not know
                return None
        return m

    best: tuple[int, str, Any, dict[str, Any]] | None = None
    layers: list[tuple[str, Any, bool]] = [("store", store, False)] if store is not None else []
    if bundles:
        if open_bundle is None:
            from .bundle import BundleReader as open_bundle
        for path in bundles:
            try:
                layers.append((str(path), open_bundle(path), True))
            except Exception:  # noqa: BLE001 - already reported by the bundle layer
                continue
    try:
        for where, layer, is_bundle in layers:
            held = (bundle_keys(where, layer, target) or []) if is_bundle else store_keys(layer, target)
            for key in held:
                m = larger_n(key)
                if m is not None and (best is None or m < best[0]):
                    best = (m, f"bundle:{where}" if is_bundle else where, layer, key)
        if best is None:
            return None
        kb = best[2].get_kernel_bench(best[3])
        return None if kb is None else (best[1], kb)
    finally:
        for _, layer, is_bundle in layers:
            close = getattr(layer, "close", None) if is_bundle else None
            if close is not None:
                close()
