"""Where the library finds one kernel's plan before it benchmarks anything.

The order (MIOpen's user database over its system database, TensorRT's
timing cache, XLA's loaded autotune results, in one chain):

1. **in-process** — plans this process already made or found;
2. **user cache** — the store (``UCUDNN_DATABASE`` or the user cache directory):
   a plan for this exact limit, else this kernel's measurements, planned now;
3. **plan server** — ``UCUDNN_PLAN_SERVER``: measurements another node shared;
4. **installed bundles** — the system bundle directory, then ``UCUDNN_BUNDLE_PATH``;
5. **a larger batch** — the same kernel's measurements at a larger mini-batch in the user cache or a bundle:
   its micro-batches up to this one's, and this mini-batch's own size measured here (:func:`from_larger_batch`);
6. **benchmark** on this GPU, shared back with the server when there is one.

What a later layer finds is written to the user cache, so the next process
stops at layer 2.  Every key names the device model and cuDNN version, so a
result for another GPU or cuDNN is never picked up; a bundle that holds
nothing for this pair is skipped with a logged reason (once per process), as
is a server or bundle that cannot be read: a broken cache layer costs a
benchmark, never a failed convolution.  A bundle for this pair that lacks
the kernel is named when the benchmark follows, with what it holds instead
(:func:`why_missing`: the batch size it was precomputed at, another dtype,
layout, numerics, batch policy or sources), at warning level for its first
such kernel in a process and at debug level after that.

This module is pure: callers pass the layers in (``ucudnn.api`` the real
ones, tests fakes), and a layer is anything with the store's methods.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, MutableMapping, Protocol, Sequence

from ..planning.plan import KernelPlan, MicroConfig, Plan
from ..planning.table import KernelBench
from .store import key_id

log = logging.getLogger("ucudnn.lookup")
_logged: set[str] = set()


class BenchLayer(Protocol):
    def get_kernel_bench(self, key: dict[str, Any]) -> KernelBench | None: ...


@dataclass
class Found:
    """The plan, the layer it came from (``memory``, ``store``, ``server``, ``bundle:PATH``, ``benchmark``), and
    why earlier layers did not answer."""

    plan: KernelPlan
    layer: str
    skipped: list[str] = field(default_factory=list)


def _note(reasons: list[str], reason: str, level: int = logging.INFO) -> None:
    """Record why a layer was skipped; log each distinct reason once per process."""
    reasons.append(reason)
    if reason not in _logged:
        _logged.add(reason)
        log.log(level, "ucudnn: %s", reason)


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


def _describe(key: dict[str, Any]) -> str:
    """``forward n96 c96 27x27 -> k256 5x5 ...`` (:meth:`ConvProblem.describe`) for a key's op and problem."""
    from ..problem import ConvProblem

    try:
        return f"{key.get('op')} {ConvProblem.from_dict(key['problem']).describe()}"
    except Exception:  # noqa: BLE001 - a reason is never worth an error: a key of another version says its op
        return str(key.get("op"))


#: bundle path -> (its file's (mtime, size), its measurement keys for the target asked): read once per version
_held_keys: dict[str, tuple[tuple, tuple[str, int], list[dict[str, Any]]]] = {}
#: bundles whose first miss this process has logged at warning level (later ones go to debug)
_warned_misses: set[str] = set()


def _bundle_keys(path: str | Path, reader: Any, target: tuple[str, int]) -> list[dict[str, Any]] | None:
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


def _miss(path: str | Path, reader: Any, bench_key: dict[str, Any], target: tuple[str, int]) -> str | None:
    """The reason bundle ``path`` does not answer ``bench_key`` (None where the reader cannot list its keys)."""
    held = _bundle_keys(path, reader, target)
    if held is None:
        return None
    return f"bundle {path} has no measurements of {_describe(bench_key)}: {why_missing(bench_key, held)}"


def from_larger_batch(held: KernelBench, bench_key: dict[str, Any],
                      measure_batch: Callable[[], KernelBench]) -> KernelBench | None:
    """This kernel's measurements at mini-batch n (``bench_key``) from ``held``, the same kernel's at a larger
    mini-batch N under the same batch policy: every micro-batch size the policy measures for n except n itself is
    one it measured for N (powers of two, midpoints and ``all`` alike), and a micro-batch's rows do not depend on
    the mini-batch it is part of (each is the convolution of that many images).  So they are taken as they are,
    and only n itself is measured (``measure_batch``), unless the policy measured n for N too (n = 64 from
    N = 128 under ``powerOfTwo``: nothing is measured).  None where the policy's sizes for n are not all there
    (``undivided``): the caller benchmarks the whole kernel.

    Why: a job whose batch differs from the one its plans were made at (a bundle precomputed at 128, a job at 96;
    an epoch's last, smaller batch; an evaluation batch) would otherwise benchmark every kernel again, most of it
    the same micro-batches."""
    from ..planning.table import KernelBench as _KernelBench
    from ..policy import micro_batch_sizes
    from ..problem import ConvProblem

    problem = ConvProblem.from_dict(bench_key["problem"])
    policy = bench_key["batch_policy"]
    n, big = problem.n, held.problem.n
    if big <= n:
        return None
    wanted, measured = micro_batch_sizes(policy, n), set(micro_batch_sizes(policy, big))
    lacking = [m for m in wanted if m not in measured]
    if lacking not in ([], [n]) or len(lacking) == len(wanted):   # nothing to take (undivided): benchmark it
        return None
    keep = set(wanted)
    rows = [m for m in held.measurements if m.micro_batch in keep]
    skipped = [s for s in held.skipped if s.micro_batch in keep]
    seconds = None
    if lacking:
        new = measure_batch()
        rows += [m for m in new.measurements if m.micro_batch == n]
        skipped += [s for s in new.skipped if s.micro_batch == n]
        seconds = new.benchmark_seconds
    return _KernelBench(held.name, held.op, problem, rows, skipped, seconds)


def _larger_batch(bench_key: dict[str, Any], target: tuple[str, int], store: Any,
                  bundles: Sequence[str | Path], open_bundle: Callable[[str | Path], Any] | None
                  ) -> tuple[str, KernelBench] | None:
    """(where, measurements) of this kernel at the smallest mini-batch larger than ``bench_key``'s that the user
    cache or a bundle holds under an otherwise equal key; None if none does."""
    problem = dict(bench_key["problem"])
    n = problem.pop("n")
    rest = {k: v for k, v in bench_key.items() if k != "problem"}

    def larger_n(key: dict[str, Any]) -> int | None:
        other = dict(key.get("problem") or {})
        m = other.pop("n", None)
        same = other == problem and {k: v for k, v in key.items() if k != "problem"} == rest
        return m if same and isinstance(m, int) and m > n else None

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
            if is_bundle:
                held = _bundle_keys(where, layer, target) or []
            else:
                keys_of = getattr(layer, "kernel_bench_keys", None)
                held = keys_of(*target) if keys_of is not None else []
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


def _wr(kb: KernelBench, plan_key: dict[str, Any]) -> KernelPlan:
    from ..planning import wr

    configs = [MicroConfig.of(m) for m in wr.plan_kernel(kb, plan_key["workspace_limit"], plan_key["batch_policy"])]
    return KernelPlan(kb.name, plan_key["op"], kb.problem, configs)


def _remember(store: Any, plan_key: dict[str, Any], bench_key: dict[str, Any], kb: KernelBench | None,
              kp: KernelPlan) -> None:
    """Write what a later layer found into the user cache (best effort: a read-only cache is not an error)."""
    if store is None:
        return
    try:
        if kb is not None:
            store.put_kernel_bench(bench_key, kb)
        store.put_plan(plan_key, Plan("wr", plan_key["batch_policy"], [kp], plan_key["device"],
                                      plan_key["cudnn_version"], workspace_limit=plan_key["workspace_limit"],
                                      numerics=plan_key["numerics"]))
    except Exception as e:  # noqa: BLE001
        log.warning("ucudnn: could not write the plan cache: %s", e)


def _same_target(plan: Plan, plan_key: dict[str, Any]) -> bool:
    return (plan.device, plan.cudnn_version) == (plan_key["device"], plan_key["cudnn_version"])


def kernel_plan(plan_key: dict[str, Any], bench_key: dict[str, Any], *, benchmark: Callable[[], KernelBench],
                memory: MutableMapping[str, KernelPlan] | None = None, store: Any = None,
                server: BenchLayer | None = None, bundles: Sequence[str | Path] = (),
                open_bundle: Callable[[str | Path], Any] | None = None,
                measure_batch: Callable[[], KernelBench] | None = None) -> Found:
    """The WR plan for ``plan_key`` (``ucudnn.api._cache_key`` with a limit) from the first layer that has it.

    ``bench_key`` is the same key without the limit (a kernel's
    measurements serve every limit).  ``benchmark`` measures the kernel on
    this GPU; it runs only when no layer answers.  ``measure_batch``
    measures only the micro-batch of the whole mini-batch (the ``undivided``
    policy's one size): given, a kernel that no layer has at its mini-batch
    but the user cache or a bundle has at a larger one is planned from that
    one's micro-batches (:func:`from_larger_batch`), measuring at most this
    one size.
    """
    pid = key_id(plan_key)
    reasons: list[str] = []
    target = (plan_key["device"], plan_key["cudnn_version"])

    def done(kp: KernelPlan, layer: str) -> Found:
        if memory is not None:
            memory[pid] = kp
        return Found(kp, layer, reasons)

    # 1. in-process
    if memory is not None and pid in memory:
        return Found(memory[pid], "memory", reasons)

    # 2. user cache
    if store is not None:
        try:
            hit = store.find_plan(plan_key)
            if hit is not None and _same_target(hit[1], plan_key) and hit[1].kernels:
                return done(hit[1].kernels[0], "store")
            kb = store.get_kernel_bench(bench_key)
            if kb is not None:
                kp = _wr(kb, plan_key)
                _remember(store, plan_key, bench_key, None, kp)
                return done(kp, "store")
        except Exception as e:  # noqa: BLE001 - a broken cache is skipped, not fatal
            _note(reasons, f"plan cache unreadable ({e}); skipped", logging.WARNING)

    # 3. plan server
    if server is not None:
        try:
            kb = server.get_kernel_bench(bench_key)
            if kb is not None:
                kp = _wr(kb, plan_key)
                _remember(store, plan_key, bench_key, kb, kp)
                return done(kp, "server")
        except Exception as e:  # noqa: BLE001 - an unreachable server costs a benchmark, not the call
            _note(reasons, f"plan server unavailable ({e}); skipped", logging.WARNING)

    # 4. installed bundles
    misses: list[tuple[str, str]] = []   # (bundle, why it did not answer): said only if a benchmark follows
    if bundles:
        if open_bundle is None:
            from .bundle import BundleReader as open_bundle
        for path in bundles:
            try:
                reader = open_bundle(path)
            except Exception as e:  # noqa: BLE001 - BundleError or worse: skip this bundle
                _note(reasons, f"bundle {path} skipped: {e}", logging.WARNING)
                continue
            try:
                held = reader.targets()
                if target not in held:
                    others = ", ".join(f"{d} / cuDNN {v}" for d, v in sorted(held)) or "nothing"
                    _note(reasons, f"bundle {path} skipped: it holds plans for {others}, "
                                   f"not for this {target[0]} / cuDNN {target[1]}")
                    continue
                hit = reader.find_plan(plan_key)
                if hit is not None and hit[1].kernels:
                    if not _same_target(hit[1], plan_key):
                        _note(reasons, f"bundle {path}: plan {hit[0]} is for {hit[1].device} / cuDNN "
                                       f"{hit[1].cudnn_version}, not {target[0]} / cuDNN {target[1]}; skipped",
                              logging.WARNING)
                    else:
                        kp = hit[1].kernels[0]
                        _remember(store, plan_key, bench_key, reader.get_kernel_bench(bench_key), kp)
                        return done(kp, f"bundle:{path}")
                kb = reader.get_kernel_bench(bench_key)
                if kb is not None:
                    kp = _wr(kb, plan_key)
                    _remember(store, plan_key, bench_key, kb, kp)
                    return done(kp, f"bundle:{path}")
                missed = _miss(path, reader, bench_key, target)
                if missed is not None:
                    misses.append((str(path), missed))
            except Exception as e:  # noqa: BLE001
                _note(reasons, f"bundle {path} unreadable ({e}); skipped", logging.WARNING)
            finally:
                close = getattr(reader, "close", None)
                if close is not None:
                    close()

    # 5. the same kernel measured at a larger mini-batch (user cache, bundles): its micro-batches are this one's
    if measure_batch is not None:
        try:
            larger = _larger_batch(bench_key, target, store, bundles, open_bundle)
        except Exception as e:  # noqa: BLE001 - a cache layer that cannot be searched costs a benchmark
            _note(reasons, f"could not search the caches for this kernel at a larger batch ({e})", logging.WARNING)
            larger = None
        if larger is not None:
            where, held = larger
            kb = from_larger_batch(held, bench_key, measure_batch)
            if kb is not None:
                _note(reasons, f"{_describe(bench_key)}: planned from its measurements at batch {held.problem.n} "
                               f"({where}), batch {bench_key['problem']['n']} itself measured here"
                               if kb.benchmark_seconds is not None else
                               f"{_describe(bench_key)}: planned from its measurements at batch {held.problem.n} "
                               f"({where}), nothing measured")
                kp = _wr(kb, plan_key)
                _remember(store, plan_key, bench_key, kb, kp)
                return done(kp, f"larger-batch:{where}")

    # 6. benchmark here
    for path, reason in misses:
        first = path not in _warned_misses
        _warned_misses.add(path)
        reasons.append(reason)
        log.log(logging.WARNING if first else logging.DEBUG, "ucudnn: %s; benchmarking it here%s", reason,
                " (further kernels this bundle lacks are logged at debug level)" if first else "")
    kb = benchmark()
    kp = _wr(kb, plan_key)
    _remember(store, plan_key, bench_key, kb, kp)
    if server is not None and hasattr(server, "put_kernel_bench"):
        try:
            server.put_kernel_bench(bench_key, kb)
        except Exception as e:  # noqa: BLE001 - sharing is a courtesy (the server may want a token)
            _note(reasons, f"could not share measurements with the plan server ({e})", logging.DEBUG)
    return done(kp, "benchmark")


_server: tuple[str, Any] | None = None


def server_from_env() -> Any:
    """A cached client of ``UCUDNN_PLAN_SERVER`` (None when unset)."""
    global _server
    from .. import config

    url = config.plan_server()
    if url is None:
        return None
    if _server is None or _server[0] != url:
        from .client import PlanClient

        _server = (url, PlanClient(url, timeout=10.0))
    return _server[1]


def installed_bundles() -> list[Path]:
    from .bundle import installed_bundles as found

    return found()
