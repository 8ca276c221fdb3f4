"""WR: the per-kernel dynamic programme of μ-cuDNN (seed 003, section 3.2).

Each kernel gets its own workspace limit M.  T(b), the fastest way to process
b samples, is the best of running b at once with the fastest algorithm that
fits M, or splitting off a micro-batch b_u and solving b - b_u recursively:

    T(0) = 0
    T(b) = min over measured b_u <= b of  T_u(b_u) + T(b - b_u)

where T_u(b_u) is the fastest measured micro-configuration of size b_u whose
workspace fits M.  Micro-batches run one after another and share one
workspace, so a kernel's plan needs max(workspace) and costs sum(time).
O(B x |sizes|) per kernel; pure Python, no GPU.

Channel slices (issue 18): a table may also measure configurations that compute a slice of the kernel's
output channels; the DP then runs once per slice size and :mod:`ucudnn.planning.channels` covers k with the
fastest slices (:func:`solve_kernel`).
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

from ..errors import InfeasibleError
from ..legacy_engines import LEGACY_CALL_HOST_MS, runs_as_legacy_call
from ..policy import micro_batch_sizes
from ..problem import DTYPE_BYTES
from ..units import format_size
from .channels import combine
from .plan import KernelPlan, MicroConfig, Plan
from .table import BenchmarkTable, KernelBench, Measurement


#: Near-ties on host work (issue 15's host-bound steps): at one micro-batch size a configuration at most
#: HOST_TIE_FRACTION slower than the fastest replaces it where both recorded their host work (``host_ms``,
#: :mod:`ucudnn.binding.timing`) and it saves the host at least HOST_TIE_MIN_MS and HOST_TIE_RATIO times the time
#: it gives up.  Why: a step whose host is the slower party pays each call's host work, even where the call's GPU
#: work is longer; measured on an H200, cuDNN's legacy IMPLICIT_PRECOMP_GEMM calls cost 55-137 us of host where the
#: graph-API engine they run as takes 14-30 us at the same GPU time, ResNet-50 b128 AMP's 256 MiB plans held 4-12
#: of them at near-ties (their layers' backward calls 35-150 us of host over PyTorch's), and with this rule 5 of
#: 12 became graph engines at +0.07 ms of GPU work a 21.8 ms step (``benchmarks/results/host_ties_h200.md``).  A
#: GPU-bound step loses at most the fraction; tables without ``host_ms`` plan exactly as before.
HOST_TIE_FRACTION = 0.02
HOST_TIE_RATIO = 2.0
HOST_TIE_MIN_MS = 0.01
#: Where the fastest runs as a cuDNN legacy call (no twin: :func:`ucudnn.legacy_engines.runs_as_legacy_call`), its
#: host work counts as at least :data:`~ucudnn.legacy_engines.LEGACY_CALL_HOST_MS` and another configuration may
#: be up to this fraction slower (still saving the host HOST_TIE_RATIO times what it gives up).  Why: the
#: benchmark's loop records a legacy call's host work below what the call costs in a model's step (that
#: constant's note); ResNet-50 b128 AMP's 256 MiB plans kept six legacy backward filters that graph engines run
#: 4.5-10% slower (3-7 us a call), on layers whose backward cost 23-110 us of host over PyTorch's (the layers on
#: graph engines: at or under PyTorch's; ``benchmarks/results/legacy_host_h200.md``)
LEGACY_TIE_FRACTION = 0.10
#: The version of WR's choices that plan keys name (``ucudnn.api``'s ``wr_rules``, the plan service's and precompute's
#: key version): a plan cached under another version is not found, and the lookup chain plans the kernel again from
#: its cached measurements (no benchmark).  1 (keys without it): until session 19's host near-ties; 2: legacy calls
#: weighed by their in-step host work (:data:`LEGACY_TIE_FRACTION`).  Bump with any change of what WR picks.
RULES = 2


def host_ms(m: Measurement) -> float | None:
    """The host ms per call ``m``'s timing recorded (None: not recorded)."""
    h = m.extra.get("host_ms")
    return float(h) if isinstance(h, (int, float)) and not isinstance(h, bool) else None


def lighter(m: Measurement, fastest: Measurement, op: str | None = None, dtype: str | None = None) -> float:
    """Host ms a call saves by running ``m`` in place of ``fastest`` (same size, ``fastest`` no slower) when
    that is a near-tie by :data:`HOST_TIE_FRACTION` / :data:`HOST_TIE_RATIO` / :data:`HOST_TIE_MIN_MS`; else 0.
    Where one of the two runs as a legacy call and the other does not, the legacy call's host work counts as at
    least :data:`~ucudnn.legacy_engines.LEGACY_CALL_HOST_MS`, and a legacy ``fastest`` gives way within
    :data:`LEGACY_TIE_FRACTION` (``op`` / ``dtype``: the kernel's, which say whether a legacy configuration has a
    twin).  Between two legacy calls their recorded host work is compared as it is."""
    hm, hf = host_ms(m), host_ms(fastest)
    if hm is None or hf is None:
        return 0.0
    fraction = HOST_TIE_FRACTION
    legacy_m = runs_as_legacy_call(m.source, m.algo, op, dtype)
    legacy_f = runs_as_legacy_call(fastest.source, fastest.algo, op, dtype)
    if legacy_f and not legacy_m:
        hf, fraction = max(hf, LEGACY_CALL_HOST_MS), LEGACY_TIE_FRACTION
    elif legacy_m and not legacy_f:
        hm = max(hm, LEGACY_CALL_HOST_MS)
    given_up, saved = m.time_ms - fastest.time_ms, hf - hm
    if given_up > fraction * fastest.time_ms or saved < max(HOST_TIE_MIN_MS, HOST_TIE_RATIO * given_up):
        return 0.0
    return saved


def fastest_per_size(measurements: Iterable[Measurement], sizes: Iterable[int], limit: int,
                     channels: int | None = None, host_ties: bool = True, op: str | None = None,
                     dtype: str | None = None) -> dict[int, Measurement]:
    """T_u: for each allowed micro-batch size, the fastest measurement that fits ``limit`` (ties: less workspace;
    near-ties: less host work, :func:`lighter`, unless ``host_ties`` is False; ``op`` / ``dtype``: the kernel's).

    Near-ties in two steps: where the fastest runs as a legacy call, the fastest configuration that does not takes
    its place if :func:`lighter` allows (:data:`LEGACY_TIE_FRACTION`); then, against that one, the configuration
    saving the host most within :data:`HOST_TIE_FRACTION`.  (One step would let the legacy call's wider fraction
    pick among the others by their own few microseconds of host work.)

    ``channels``: only measurements of that channel slice (None: of all the kernel's channels)."""
    allowed = set(sizes)
    best: dict[int, Measurement] = {}
    fits: list[Measurement] = []
    for m in measurements:
        if m.micro_batch not in allowed or m.workspace_bytes > limit or m.channels != channels:
            continue
        fits.append(m)
        cur = best.get(m.micro_batch)
        if cur is None or (m.time_ms, m.workspace_bytes) < (cur.time_ms, cur.workspace_bytes):
            best[m.micro_batch] = m
    if not host_ties:
        return best
    ref = dict(best)
    for size, b in best.items():
        if runs_as_legacy_call(b.source, b.algo, op, dtype):
            others = [m for m in fits if m.micro_batch == size and host_ms(m) is not None
                      and not runs_as_legacy_call(m.source, m.algo, op, dtype)]
            alt = min(others, key=lambda m: (m.time_ms, m.workspace_bytes), default=None)
            if alt is not None and lighter(alt, b, op, dtype) > 0:
                ref[size] = alt
    pick = dict(ref)
    rank: dict[int, tuple[float, float, int]] = {}   # size -> (-host saved, time, workspace) of its pick
    for m in fits:
        r = ref[m.micro_batch]
        saved = lighter(m, r, op, dtype) if m is not r and m.time_ms >= r.time_ms else 0.0
        key = (-saved, m.time_ms, m.workspace_bytes)
        if saved > 0 and key < rank.get(m.micro_batch, (0.0, math.inf, 0)):
            rank[m.micro_batch], pick[m.micro_batch] = key, m
    return pick


def solve(batch: int, best: dict[int, Measurement]) -> list[Measurement] | None:
    """The DP itself: the fastest sequence of micro-configurations summing to ``batch``, or None.

    Ties in time go to fewer micro-batches (fewer launches, less to go wrong).
    """
    out = _chain(batch, [m for _, m in sorted(best.items())], lambda m, after: True)
    if out is not None:
        out.sort(key=lambda m: -m.micro_batch)  # largest first: a stable, readable order
    return out


def _chain(batch: int, options: Sequence[Measurement], fits) -> list[Measurement] | None:
    """T(r) = min over options of size b <= r that ``fits(m, r - b)`` (``r - b``: images still to run after it) of
    its time + T(r - b); the chain from ``batch`` down, in the order it runs, or None.  ``options`` sorted by
    micro-batch size; ties in time go to fewer micro-batches."""
    inf = (math.inf, 0)
    cost: list[tuple[float, int]] = [inf] * (batch + 1)
    choice: list[Measurement | None] = [None] * (batch + 1)
    cost[0] = (0.0, 0)
    for r in range(1, batch + 1):
        for m in options:
            if m.micro_batch > r:
                break
            rest = cost[r - m.micro_batch]
            if rest[0] == math.inf or not fits(m, r - m.micro_batch):
                continue
            cand = (rest[0] + m.time_ms, rest[1] + 1)
            if cand < cost[r]:
                cost[r], choice[r] = cand, m
    if cost[batch][0] == math.inf:
        return None
    out: list[Measurement] = []
    r = batch
    while r > 0:
        m = choice[r]
        assert m is not None
        out.append(m)
        r -= m.micro_batch
    return out


def solve_kernel(kernel: KernelBench, sizes: Sequence[int], limit: int,
                 host_ties: bool = True) -> list[Measurement] | None:
    """The WR optimum of one kernel under ``limit``: the batch DP (:func:`solve`) for all k channels and for each
    measured channel slice, then the best cover of k by them (:func:`ucudnn.planning.channels.combine`), laid out
    slice by slice.  A table without channel slices gives exactly :func:`solve`'s plan."""
    n, k = kernel.problem.n, kernel.problem.k
    slices = sorted({m.channels for m in kernel.measurements if m.channels is not None}, reverse=True)
    kind = {"op": kernel.op, "dtype": kernel.problem.dtype}
    whole = solve(n, fastest_per_size(kernel.measurements, sizes, limit, host_ties=host_ties, **kind))
    if not slices:
        return whole
    per: dict[int, list[Measurement]] = {}
    for c in slices:
        sol = solve(n, fastest_per_size(kernel.measurements, sizes, limit, c, host_ties, **kind))
        if sol is not None:
            per[c] = sol
    cost = lambda sol: np.array([sum(m.time_ms for m in sol) if sol is not None else math.inf])  # noqa: E731
    best, cover = combine(k, cost(whole), {c: cost(sol) for c, sol in per.items()})
    if not math.isfinite(best[0]):
        return None
    out: list[Measurement] = []
    for c in cover(0):
        out += whole if c is None else per[c]   # type: ignore[operator]
    return out


def unwritten_bytes(kernel: KernelBench) -> tuple[int, int]:
    """(bytes per image, bytes for every micro-batch) of memory a call of ``kernel`` owns and has not written yet
    (:func:`solve_with_unwritten`): forward, the output y of the images after the micro-batch; backward data, dx
    of those images; backward filter, the whole dx of the same layer when its backward data runs after it."""
    p = kernel.problem
    size = DTYPE_BYTES[p.dtype]
    if kernel.op == "forward":
        return p.k * p.p * p.q * size, 0
    if kernel.op == "backward_data":
        return p.c * p.h * p.w * size, 0
    return 0, p.n * p.c * p.h * p.w * size


#: alignment of a workspace taken from an output's unwritten tail (the executor rounds its start up to it; the
#: tail is planned as that much smaller)
UNWRITTEN_ALIGN = 256


def unwritten_room(after: int, per_image: int, fixed: int = 0) -> int:
    """Bytes of unwritten memory a micro-configuration may take as its workspace with ``after`` images still to
    run after it: the larger of a ``fixed`` buffer and the output of those images, less :data:`UNWRITTEN_ALIGN`."""
    return max(fixed, after * per_image - UNWRITTEN_ALIGN, 0)


def solve_with_unwritten(kernel: KernelBench, sizes: Sequence[int], limit: int, per_image: int = 0,
                         fixed: int = 0) -> list[Measurement] | None:
    """WR's batch DP when a micro-configuration may also take its workspace from memory the call owns and has not
    written yet, in the order the micro-batches run (the first micro-batch first), or None.

    Micro-batches run one after another, so while one runs the output of the images after it is not written yet:
    a configuration of ``b`` images with ``r - b`` images still to come may use the limit's buffer or
    :func:`unwritten_room` bytes (one workspace pointer: the limit's buffer, a ``fixed`` buffer, or the output's
    unwritten tail).  That is memory the call holds anyway, so the peak does not grow; what it buys is the larger
    micro-batches and chunks that the same sources run unbounded.  Whole-k configurations only (a channel slice
    writes every image's rows of its channels).  Why (issue 18): VGG-16 b64's backward filters lose most of the
    64 MiB plan's gap to unbounded (conv1_2 4.12 vs 3.06 ms predicted), and the dx their layer's backward data
    writes next is up to 822 MB (``benchmarks/results/output_scratch.md``).
    """
    allowed = set(sizes)
    options = sorted((m for m in kernel.measurements if m.channels is None and m.micro_batch in allowed),
                     key=lambda m: (m.micro_batch, m.time_ms, m.workspace_bytes))
    return _chain(kernel.problem.n, options,
                  lambda m, after: m.workspace_bytes <= max(limit, unwritten_room(after, per_image, fixed)))


def min_feasible_workspace(kernel: KernelBench, batch_policy: str) -> int | None:
    """The smallest per-kernel limit under which ``kernel`` has any plan (None: no limit works)."""
    sizes = micro_batch_sizes(batch_policy, kernel.problem.n)
    allowed = set(sizes)
    candidates = sorted({m.workspace_bytes for m in kernel.measurements if m.micro_batch in allowed})
    if not candidates or solve_kernel(kernel, sizes, candidates[-1]) is None:
        return None
    lo, hi = 0, len(candidates) - 1  # feasibility is monotone in the limit: binary search
    while lo < hi:
        mid = (lo + hi) // 2
        if solve_kernel(kernel, sizes, candidates[mid]) is None:
            lo = mid + 1
        else:
            hi = mid
    return candidates[lo]


def plan_kernel(kernel: KernelBench, workspace_limit: int, batch_policy: str = "powerOfTwo",
                host_ties: bool = True) -> list[Measurement]:
    """WR-optimal micro-configurations for one kernel (``host_ties``: :func:`fastest_per_size`'s near-ties on host
    work); :class:`InfeasibleError` if none fits."""
    sizes: Sequence[int] = micro_batch_sizes(batch_policy, kernel.problem.n)
    result = solve_kernel(kernel, sizes, workspace_limit, host_ties)
    if result is None:
        need = min_feasible_workspace(kernel, batch_policy)
        if need is None:
            raise InfeasibleError(
                f"kernel {kernel.name!r}: no measured configuration covers a mini-batch of {kernel.problem.n} "
                f"under batch policy {batch_policy!r} at any workspace limit", None, kernel.name)
        raise InfeasibleError(
            f"kernel {kernel.name!r}: no configuration fits a workspace limit of {format_size(workspace_limit)}; "
            f"the smallest limit that works is {format_size(need)} ({need} bytes)", need, kernel.name)
    return result


#: how much faster (ms, predicted) a kernel's plan with unwritten memory must be before the library's lookups take
#: it (``ucudnn.catalog.lookup.wr_plan``).  Why: such plans ran on ``ucudnn.torch``'s Python launch path when this
#: was set (a backward filter's still does: its dx comes from the eager backward), which costs host time on every
#: call: measured on an H200, AlexNet b256 FP32 at 64 MiB trained at 11296 images/s with 3 kernels on unwritten
#: memory and 11438 without them (``benchmarks/results/torch_train_unwritten_h200.md``)
UNWRITTEN_MIN_GAIN_MS = 0.1


def kernel_configs(kernel: KernelBench, workspace_limit: int, batch_policy: str = "powerOfTwo",
                   unwritten: bool = False, min_gain_ms: float = 0.0, host_ties: bool = True) -> list[MicroConfig]:
    """One kernel's WR plan as micro-configurations (:func:`plan_kernel`).  ``unwritten``: where the kernel is
    faster by more than ``min_gain_ms`` with memory its call has not written yet (:func:`solve_with_unwritten`; a
    backward filter counting on its layer's dx), that plan, its configurations above the limit marked
    :data:`~ucudnn.planning.plan.UNWRITTEN`.  The one place both :func:`plan_wr` and the library's per-kernel
    lookups (``ucudnn.catalog.lookup.wr_plan``, with :data:`UNWRITTEN_MIN_GAIN_MS`) plan a kernel."""
    configs = [MicroConfig.of(m) for m in plan_kernel(kernel, workspace_limit, batch_policy, host_ties)]
    if unwritten:
        alt = solve_with_unwritten(kernel, micro_batch_sizes(batch_policy, kernel.problem.n), workspace_limit,
                                   *unwritten_bytes(kernel))
        # only a plan that takes memory above the limit is an unwritten one: another at the limit is WR's plan
        # again (in another order, its sum may differ from WR's by a rounding)
        if alt is not None and any(m.workspace_bytes > workspace_limit for m in alt) and \
                sum(m.time_ms for m in alt) + min_gain_ms < sum(c.time_ms for c in configs):
            configs = [MicroConfig.of(m, m.workspace_bytes > workspace_limit) for m in alt]
    return configs


def plan_wr(table: BenchmarkTable, workspace_limit: int, batch_policy: str = "powerOfTwo",
            policy_name: str = "wr", unwritten: bool = False, host_ties: bool = True) -> Plan:
    """Per-kernel plans; on an infeasible limit, the error names the smallest limit for the whole table.

    ``unwritten``: a kernel whose plan is faster with memory its call has not written yet
    (:func:`solve_with_unwritten`; every backward filter counting on its layer's dx) takes that plan, its
    configurations above the limit marked :data:`~ucudnn.planning.plan.UNWRITTEN`; the executor then needs
    ``beta = 0`` (forward, backward data) and the layer's dx (backward filter).  ``host_ties`` False: each size's
    fastest configuration whatever its host work (:func:`fastest_per_size`)."""
    memo: dict[tuple[str, str], list] = {}
    kernels: list[KernelPlan] = []
    failures: list[InfeasibleError] = []
    for k in table.kernels:
        key = (k.problem.key(), k.op)
        try:
            if key not in memo:
                memo[key] = kernel_configs(k, workspace_limit, batch_policy, unwritten, host_ties=host_ties)
            kernels.append(KernelPlan(k.name, k.op, k.problem, list(memo[key])))
        except InfeasibleError as e:
            failures.append(e)
    if failures:
        needs = [e.min_workspace for e in failures]
        if any(n is None for n in needs):
            raise failures[[n is None for n in needs].index(True)]
        need = max(n for n in needs if n is not None)
        names = ", ".join(e.kernel or "?" for e in failures[:5]) + (" ..." if len(failures) > 5 else "")
        raise InfeasibleError(
            f"workspace limit {format_size(workspace_limit)} is too small for {len(failures)} kernel(s) ({names}); "
            f"the smallest per-kernel limit that works is {format_size(need)} ({need} bytes)", need)
    return Plan(policy_name, batch_policy, kernels, table.device, table.cudnn_version,
                workspace_limit=workspace_limit, numerics=table.numerics)
