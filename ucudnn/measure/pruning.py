"""What the fast-benchmarking rules would have done to a recorded table (pure Python, no GPU).

Why: the rules (:class:`~ucudnn.measure.sources.base.BenchSettings`) save benchmarking time only if the
plans stay the same.  A recorded table holds every configuration re-timed in full, and for most rows the
first estimate the rules would have seen (``find_time_ms``: Find's own time, legacy; ``quick_ms``: the
graph source's quick sample).  :func:`simulate` replays the rules on it with the same
:class:`~ucudnn.measure.sources.base.Pruner` the sources use, in the order the benchmark meets the
configurations, and returns the table the pruned benchmark would have written; :func:`true_time_ms`
prices a plan made from it at the recorded (full) times, which is what it would really cost to run.
Split dominance uses the same :class:`~ucudnn.measure.sources.base.SplitReference` over the rows kept so
far; a graph row it leaves unsampled is dropped from the table, as the benchmark leaves it out, and the
graph source's quick samples are modelled too (:func:`quick_cost_ms`), since that is what the rule saves.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from ..planning.plan import Plan
from ..planning.table import BenchmarkTable, KernelBench, Measurement
from ..policy import micro_batch_sizes
from .sources.base import BenchSettings, Pruner, identity

#: Where the first estimate comes from: ``exact`` takes the recorded time itself (what Find's time would be
#: if it were exact); ``recorded`` takes Find's time / the quick sample where the table kept it.
ESTIMATES = ("exact", "recorded")


def first_estimate(m: Measurement, estimate: str) -> float:
    """The time a rule would have seen before re-timing ``m`` (see :data:`ESTIMATES`)."""
    if estimate == "recorded":
        for key in ("find_time_ms", "quick_ms"):
            v = m.extra.get(key)
            if isinstance(v, (int, float)) and v > 0:
                via = m.extra.get("via") or {}
                return float(v) + float(via.get("transform_ms", 0.0))   # relayout: inner estimate + transforms
    return m.time_ms


def _group(m: Measurement) -> tuple:
    """What one :class:`Pruner` sees together: a source's rows at one size (a wrapper's: per inner source and layout;
    a channel slice's apart)."""
    inner = m.extra.get("via") or m.extra.get("fold") or {}
    return (m.micro_batch, m.source, str(inner.get("source", "")), str(inner.get("layout", "")),
            getattr(m, "channels", None))


#: Sources that apply split dominance (``BenchSettings.split_margin``): legacy to its re-timing, graph to its quick
#: sample and its median.  mec and direct do not.
SPLIT_SOURCES = ("legacy", "graph")
#: Wrappers whose rows split dominance weighs against the kernel's own rows (``BenchSettings.split_wrapped``): fold,
#: whose wrapped estimate is a lower bound (``Wrapper.estimate_is_lower_bound``); relayout's is not, and it does not
#: pass its inner sources the kernel's rows either.
WRAPPER_SOURCES = ("fold",)


def retime_cost_ms(t: float, settings: BenchSettings, stopped: bool = False) -> float:
    """A model of the GPU time :func:`ucudnn.binding.timing.time_ms` spends re-timing a ``t`` ms call.

    Warm-up and one calibration call, then ``repeat`` samples of enough calls to last ``min_sample_ms``
    (at most 64; a call that long alone: the calibration call is the first sample); an early stop ends after the
    calibration call.  Host overhead is left out.
    """
    head = (settings.warmup + 1) * t
    if stopped:
        return head
    inner = max(1, min(64, math.ceil(settings.min_sample_ms / max(t, 1e-3)))) if settings.min_sample_ms > 0 else 1
    return head + (max(1, settings.repeat) - (inner == 1 and settings.min_sample_ms > 0)) * inner * t


def quick_cost_ms(t: float, estimate_ms: float, settings: BenchSettings | None) -> float:
    """A model of the graph source's quick sample of a ``t`` ms call: an untimed call and a timed one, or the
    first call alone when it already lasts ``trust_estimate_ms`` (``settings`` None: unpruned, two calls).  Left out:
    the two calls more of a trusted sample near a tie (``graph.NEAR_TIE``), which re-time and prune nothing."""
    return t if settings is not None and settings.trusts(estimate_ms) else 2 * t


@dataclass
class Simulated:
    """A pruned table and what the rules did: configurations by how they were recorded, modelled GPU time.

    ``counts["split-skipped"]``: graph configurations split dominance left unsampled (not in the table)."""

    table: BenchmarkTable
    counts: dict[str, int] = field(default_factory=dict)
    retime_ms: float = 0.0            # modelled re-timing time with the rules
    retime_ms_unpruned: float = 0.0   # modelled re-timing time without them
    quick_ms: float = 0.0             # modelled quick-sample time of the graph source's own rows, with the rules
    quick_ms_unpruned: float = 0.0    # ... and without them


def simulate(table: BenchmarkTable, settings: BenchSettings, estimate: str = "recorded",
             batch_policy: str | None = None) -> Simulated:
    """``table`` as a benchmark under ``settings``' rules would have recorded it (module doc).

    Order follows :func:`ucudnn.measure.benchmark`: per kernel, micro-batch sizes in policy order (channel
    slices after the whole kernel), sources in the table's order, configurations by first estimate.  The
    budget is spent by the modelled re-timing cost (:func:`retime_cost_ms`), not a clock.  An early stop
    records the first sample, taken to be the first estimate (one run, as Find's and the quick sample are).
    Split dominance sees the rows kept so far, as the benchmark's sources see the kernel's rows so far
    (:meth:`BenchSettings.start_kernel`); before the quick sample (graph) it drops a row from the table, as
    the graph source leaves it unsampled, in the graph source's order (rows new at that size first, then by
    their time at the largest smaller size).  With ``split_wrapped`` fold's rows meet the kernel's own reference at
    their size: a row whose inner configuration (graph) had a time at a smaller size over the margin is dropped (its
    inner sample skipped), any other over it on its first estimate keeps that estimate (the inner rows of the
    folded problem are not in the table: their own splits are not modelled).
    """
    if estimate not in ESTIMATES:
        from ..errors import InputError

        raise InputError(f"unknown estimate {estimate!r}; use one of {', '.join(ESTIMATES)}", "estimate")
    policy = batch_policy or table.extra.get("batch_policy", "powerOfTwo")
    rules = replace(settings, kernel_budget_s=None, deadline=None)   # the budget is modelled here
    budget_ms = None if settings.kernel_budget_s is None else settings.kernel_budget_s * 1e3
    out = Simulated(table)
    kernels: list[KernelBench] = []
    order = {s: i for i, s in enumerate(table.extra.get("sources", []))}
    for k in table.kernels:
        spent = 0.0
        sizes = micro_batch_sizes(policy, k.problem.n)
        rank = {b: i for i, b in enumerate(sizes)}
        groups: dict[tuple, list[Measurement]] = {}
        for m in k.measurements:
            groups.setdefault(_group(m), []).append(m)
        kept: list[Measurement] = []
        rules.start_kernel(k.problem, kept)
        for group, ms in sorted(groups.items(), key=lambda g: (g[0][4] is not None, g[0][4] or 0,
                                                               rank.get(g[0][0], len(rank) + g[0][0]),
                                                               order.get(g[0][1], len(order)), g[0][1:4])):
            top = group[1] in SPLIT_SOURCES and not group[2] and group[4] is None
            split = rules.split_reference(k.problem.with_batch(group[0])) if top else None
            if group[1] in WRAPPER_SOURCES and group[4] is None and rules.split_wrapped:
                outer = _wrapper_reference(rules, k.problem, kept, group[0], group[1])
                if outer is not None and group[2] == "graph":   # the inner graph source's skip, before its sample
                    survivors = []
                    for m in ms:
                        prev = _inner_previous(kept, m, group[0])
                        if prev is not None and prev > outer.margin * outer.reference(m.workspace_bytes)[0]:
                            out.counts["split-skipped"] = out.counts.get("split-skipped", 0) + 1
                            out.retime_ms_unpruned += retime_cost_ms(m.time_ms, settings)
                            continue
                        survivors.append(m)
                    ms = survivors
                split = outer   # the wrapped timing
            if top and group[1] == "graph":   # the quick sample, and split dominance before it
                if split is not None:
                    def lower_bound(m: Measurement) -> float:
                        prev = split.previous.get((m.source, str(m.algo), m.math_type))
                        return -1.0 if prev is None else prev.time_ms

                    ms = sorted(ms, key=lower_bound)
                sampled: list[tuple[float, int]] = []
                survivors = []
                for m in ms:
                    est = first_estimate(m, estimate)
                    out.quick_ms_unpruned += quick_cost_ms(m.time_ms, est, None)
                    if split is not None and split.unneeded(m.source, m.algo, m.math_type, m.workspace_bytes,
                                                            sampled):
                        out.counts["split-skipped"] = out.counts.get("split-skipped", 0) + 1
                        out.retime_ms_unpruned += retime_cost_ms(m.time_ms, settings)
                        continue
                    out.quick_ms += quick_cost_ms(m.time_ms, est, rules)
                    sampled.append((est, m.workspace_bytes))
                    survivors.append(m)
                ms = survivors
            pruner = Pruner(rules, trust_long=k.op != "backward_filter" or group[1] != "legacy", split=split)
            for m in sorted(ms, key=lambda m: (first_estimate(m, estimate), m.workspace_bytes)):
                est = first_estimate(m, estimate)
                out.retime_ms_unpruned += retime_cost_ms(m.time_ms, settings)
                # legacy's estimate is Find's: split dominance weighs it less Find's overhead at the smaller size
                why = pruner.decide(est, m.workspace_bytes,
                                    identity(m) if group[1] == "legacy" and estimate == "recorded" else None)
                if why is None and budget_ms is not None and spent > budget_ms:
                    why = "budget"
                if why is not None:
                    pruner.record(est, m.workspace_bytes, None, why)
                    kept.append(_retimed(m, est, "find", why))
                    continue
                if pruner.hopeless(est, m.workspace_bytes):
                    cost = retime_cost_ms(m.time_ms, settings, stopped=True)
                    pruner.record(est, m.workspace_bytes, None, "first-sample")
                    kept.append(_retimed(m, est, "first-sample", None))
                else:
                    cost = retime_cost_ms(m.time_ms, settings)
                    pruner.record(est, m.workspace_bytes, m.time_ms, "median")
                    kept.append(m)
                spent += cost
                out.retime_ms += cost
            for how, n in pruner.counts.items():
                out.counts[how] = out.counts.get(how, 0) + n
        kernels.append(KernelBench(k.name, k.op, k.problem, kept, k.skipped, k.benchmark_seconds))
    out.table = BenchmarkTable(table.device, table.cudnn_version, kernels, table.numerics, dict(table.extra))
    return out


def default_fold_rows(table: BenchmarkTable) -> BenchmarkTable:
    """``table`` without the fold rows a benchmark with fold's default layouts would not have measured
    (:func:`ucudnn.measure.sources.fold.fold_layouts`: a fold into NHWC where the math is FMA only)."""
    from ..planning.table import effective_numerics
    from .sources.fold import fold_layouts

    numerics = effective_numerics(table).numerics or "strict"

    def keep(k: KernelBench, m: Measurement) -> bool:
        if m.source != "fold":
            return True
        layout = (m.extra.get("fold") or {}).get("layout", k.problem.layout)
        which = "same" if layout == k.problem.layout else "other"
        return which in fold_layouts(k.problem.dtype, numerics, k.problem.layout)

    return table.filtered(keep)


def _wrapper_reference(rules: BenchSettings, kernel, kept: list[Measurement], size: int, source: str):
    """The kernel's own split reference at ``size`` as a wrapper (``source``) meets it: the rows kept so far but the
    wrapper's own at ``size`` (a wrapper returns all its rows at a size at once)."""
    if rules.split_margin is None:
        return None
    from .sources.base import SplitReference

    rows = [m for m in kept if not (m.micro_batch == size and m.source == source)]
    return SplitReference.of(rows, size, kernel.n, rules.split_margin)


def _inner_previous(kept: list[Measurement], m: Measurement, size: int) -> float | None:
    """A wrapper row's inner time at the largest smaller size it was kept at (the inner configuration's lower bound
    at ``size``: the inner source's rows of the transformed problem are not in the table, the wrapped rows hold their
    ``inner_time_ms``)."""
    info = m.extra.get("fold") or m.extra.get("via") or {}
    key = (m.source, str(m.algo), m.math_type, str(info.get("layout", "")), str(info.get("source", "")))
    best: tuple[int, float] | None = None
    for x in kept:
        if x.micro_batch >= size or x.source != m.source:
            continue
        xi = x.extra.get("fold") or x.extra.get("via") or {}
        if (x.source, str(x.algo), x.math_type, str(xi.get("layout", "")), str(xi.get("source", ""))) != key:
            continue
        t = xi.get("inner_time_ms")
        if isinstance(t, (int, float)) and (best is None or x.micro_batch > best[0]):
            best = (x.micro_batch, float(t))
    return None if best is None else best[1]


def _retimed(m: Measurement, t: float, how: str, why: str | None) -> Measurement:
    extra = {**m.extra, "timed": how, "recorded_ms": m.time_ms}
    if why is not None:
        extra["pruned"] = why
    return replace(m, time_ms=max(t, 1e-6), extra=extra)


def fastest_of(tables: list[BenchmarkTable]) -> BenchmarkTable:
    """The first table with each measurement's time replaced by the smallest any of ``tables`` recorded for the same
    configuration (one missing from a table keeps the others' times).

    Why: timing noise only adds time, so the fastest of several unpruned runs is the closest to each configuration's
    own time, and a plan priced there is compared free of one run's outliers.  Measured on an H100 (AlexNet b256 FP32
    strict, issue 16's fifth pass): two unpruned runs' own WR 64 MiB plans priced at each other's times differed by
    up to 31%, from one outlying median (legacy WINOGRAD_NONFUSED conv2 forward at n = 16: 0.666 ms in one run, 0.096
    in the other); priced at their fastest, by 0.4% and 6.9%."""
    first, rest = tables[0], tables[1:]
    by_kernel = [_times(t) for t in rest]
    kernels = []
    for k in first.kernels:
        ms = []
        for m in k.measurements:
            t = min([m.time_ms] + [b[k.name][_identity(m)] for b in by_kernel
                                   if k.name in b and _identity(m) in b[k.name]])
            ms.append(m if t == m.time_ms else replace(m, time_ms=t))
        kernels.append(KernelBench(k.name, k.op, k.problem, ms, k.skipped, k.benchmark_seconds))
    return BenchmarkTable(first.device, first.cudnn_version, kernels, first.numerics, dict(first.extra))


def true_time_ms(plan: Plan, reference: BenchmarkTable) -> float:
    """``plan``'s total time priced at ``reference``'s (fully re-timed) measurements of the same configurations."""
    by_kernel = _times(reference)
    by_problem = {(k.problem.key(), k.op): by_kernel[k.name] for k in reference.kernels}
    total = 0.0
    for kp in plan.kernels:
        times = by_kernel.get(kp.name) or by_problem[(kp.problem.key(), kp.op)]
        total += sum(times[_identity(c)] for c in kp.configs)
    return total


def _times(table: BenchmarkTable) -> dict[str, dict[tuple, float]]:
    """Each kernel's (by name) recorded time per configuration (:func:`_identity`)."""
    return {k.name: {_identity(m): m.time_ms for m in k.measurements} for k in table.kernels}


def _identity(m: Measurement) -> tuple:
    return (m.micro_batch, m.channels, m.source, str(m.algo), m.math_type, repr(m.engine), m.workspace_bytes)
