"""Where the library finds one kernel's plan before it benchmarks anything.

The order (MIOpen's user database over its system database, TensorRT's
timing cache, XLA's loaded autotune results, in one chain):

1. **in-process** — plans this process already made or found;
2. **user cache** — the store (``UCUDNN_DATABASE`` or the user cache directory):
   a plan for this exact limit, else this kernel's measurements, planned now;
3. **plan server** — ``UCUDNN_PLAN_SERVER``: measurements another node shared;
4. **installed bundles** — the system bundle directory, then ``UCUDNN_BUNDLE_PATH``;
5. **a larger batch** — the same kernel's measurements at a larger mini-batch in the user cache or a bundle:
   its micro-batches up to this one's, and this mini-batch's own size measured here
   (:func:`~ucudnn.catalog.near_keys.from_larger_batch`);
6. **benchmark** on this GPU, shared back with the server when there is one.

What a later layer finds is written to the user cache, so the next process
stops at layer 2.  Every key names the device model and cuDNN version, so a
result for another GPU or cuDNN is never picked up; a bundle that holds
nothing for this pair is skipped with a logged reason (once per process), as
is a server or bundle that cannot be read: a broken cache layer costs a
benchmark, never a failed convolution.  A bundle for this pair that lacks
the kernel is named when the benchmark follows, with what it holds instead
(:func:`~ucudnn.catalog.near_keys.why_missing`: the batch size it was
precomputed at, another dtype, layout, numerics, batch policy or sources),
at warning level for its first such kernel in a process and at debug level
after that.

This module is pure: callers pass the layers in (``ucudnn.api`` the real
ones, tests fakes), and a layer is anything with the store's methods.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, MutableMapping, Protocol, Sequence

from ..planning.plan import KernelPlan, Plan
from ..planning.table import KernelBench
from .near_keys import describe_key, find_larger_batch, from_larger_batch, miss_reason
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


#: bundles whose first miss this process has logged at warning level (later ones go to debug)
_warned_misses: set[str] = set()


def wr_plan(kb: KernelBench, plan_key: dict[str, Any]) -> KernelPlan:
    """The WR plan of a kernel's measurements under ``plan_key``'s limit and batch policy, taking workspace from
    output not written yet where the key says ``unwritten``, without host near-ties where it says ``host_ties:
    false`` (what every layer's answer is planned with)."""
    from ..planning import wr

    configs = wr.kernel_configs(kb, plan_key["workspace_limit"], plan_key["batch_policy"],
                                bool(plan_key.get("unwritten")), wr.UNWRITTEN_MIN_GAIN_MS,
                                host_ties=plan_key.get("host_ties", True) is not False)
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
                measure_batch: Callable[[list[int]], KernelBench] | None = None) -> Found:
    """The WR plan for ``plan_key`` (``ucudnn.api._cache_key`` with a limit) from the first layer that has it.

    ``bench_key`` is the same key without the limit (a kernel's
    measurements serve every limit).  ``benchmark`` measures the kernel on
    this GPU; it runs only when no layer answers.  ``measure_batch(sizes)``
    measures only the micro-batch sizes it is given (each as the ``undivided``
    policy's one size): given, a kernel that no layer has at its mini-batch
    but the user cache or a bundle has at a larger one is planned from that
    one's micro-batches (:func:`~.near_keys.from_larger_batch`), measuring only
    the sizes the larger batch's policy did not (the mini-batch itself, or an
    odd mini-batch's even splits).
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
                kp = wr_plan(kb, plan_key)
                _remember(store, plan_key, bench_key, None, kp)
                return done(kp, "store")
        except Exception as e:  # noqa: BLE001 - a broken cache is skipped, not fatal
            _note(reasons, f"plan cache unreadable ({e}); skipped", logging.WARNING)

    # 3. plan server
    if server is not None:
        try:
            kb = server.get_kernel_bench(bench_key)
            if kb is not None:
                kp = wr_plan(kb, plan_key)
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
                    kp = wr_plan(kb, plan_key)
                    _remember(store, plan_key, bench_key, kb, kp)
                    return done(kp, f"bundle:{path}")
                missed = miss_reason(path, reader, bench_key, target)
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
            larger = find_larger_batch(bench_key, target, store, bundles, open_bundle)
        except Exception as e:  # noqa: BLE001 - a cache layer that cannot be searched costs a benchmark
            _note(reasons, f"could not search the caches for this kernel at a larger batch ({e})", logging.WARNING)
            larger = None
        kb = None if larger is None else from_larger_batch(larger[1], bench_key, measure_batch)
        if kb is not None:
            where, big = larger[0], larger[1].problem.n
            fresh = sorted({m.micro_batch for m in kb.measurements} - {m.micro_batch for m in larger[1].measurements})
            measured = "nothing measured" if kb.benchmark_seconds is None else \
                f"micro-batch{'es' if len(fresh) > 1 else ''} {', '.join(map(str, fresh))} measured here"
            _note(reasons, f"{describe_key(bench_key)}: planned from its measurements at batch {big} ({where}), "
                           f"{measured}")
            kp = wr_plan(kb, plan_key)
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
    kp = wr_plan(kb, plan_key)
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
