"""WD: one workspace budget for the whole network, divided by a 0-1 ILP (seed 003, section 3.3).

For kernels K and each kernel's desirable configurations C_k (:mod:`ucudnn.planning.pareto`):

    minimise    sum_k sum_{c in C_k} T_k(c) x_kc
    subject to  sum_k sum_{c in C_k} M_k(c) x_kc <= budget      (one arena, segments end to end)
                sum_{c in C_k} x_kc = 1                  for each k
                x_kc in {0, 1}

plus, for kernels with the same (problem, op), an order on their choices
that removes permuted copies of each solution (see ``_solve``).

Only desirable configurations are offered: any other one is beaten in both
time and workspace by a desirable one, so dropping it changes no optimum,
and the model stays small (the seed: 562 binaries for ResNet-50).  M_k(c)
is the workspace rounded up to the arena's alignment (:mod:`ucudnn.planning.arena`),
in units of that alignment: the constraint then is exactly "the laid-out
arena fits", with integer coefficients the solver handles without
round-off.  A kernel's configurations that could not fit even if every
other kernel took its smallest one are dropped before the model is built.

Solver: ``"auto"`` (the default) takes HiGHS (``highspy``, a dependency) and CBC where HiGHS is missing;
``"highs"`` or ``"cbc"`` name one.  PuLP up to 3.x bundles a CBC binary; PuLP 4 bundles no solver
(CBC comes with ``pulp[cbc]``), which is why HiGHS is the default.  Both solve to optimality (gap 0).
"""
from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from typing import Any

from ..errors import InfeasibleError, InputError, UcudnnError
from ..policy import normalize_policy
from ..units import format_size, parse_size
from .arena import ALIGNMENT, align_up, assign_offsets
from .pareto import Configuration, desirable_set, desirable_sets
from .plan import KernelPlan, MicroConfig, Plan
from .table import BenchmarkTable
from .wr import plan_wr

SOLVERS = ("cbc", "highs", "auto")


def plan_wd(table: BenchmarkTable, total_workspace: int | str, batch_policy: str = "powerOfTwo", *,
            solver: str = "auto", alignment: int = ALIGNMENT, time_limit: float | None = None) -> Plan:
    """The time-optimal division of ``total_workspace`` bytes among ``table``'s kernels.

    Raises :class:`InfeasibleError` naming the smallest feasible budget when
    even the smallest configurations do not fit.  ``Plan.stats`` records the
    model size, the solver, its status and the time spent.
    """
    batch_policy = normalize_policy(batch_policy)
    if solver not in SOLVERS:
        raise InputError(f"unknown ILP solver {solver!r}; use one of {', '.join(SOLVERS)}", "solver")
    if not isinstance(alignment, int) or alignment < 1:
        raise InputError(f"must be a positive integer, got {alignment!r}", "alignment")
    budget = parse_size(total_workspace, "total_workspace")
    t0 = time.perf_counter()
    sets = desirable_sets(table, batch_policy, max_workspace=budget)
    dp_seconds = time.perf_counter() - t0

    need = _smallest_segments(table, sets, batch_policy, alignment)
    min_budget = sum(need.values())
    if min_budget > budget:
        raise InfeasibleError(
            f"total workspace {format_size(budget)} is too small for {len(table.kernels)} kernels under batch policy "
            f"{batch_policy!r}; the smallest feasible total is {format_size(min_budget)} ({min_budget} bytes)",
            min_budget)
    slack = budget - min_budget
    # a configuration that does not fit even when every other kernel takes its smallest cannot be chosen
    options = {k.name: [c for c in sets[k.name] if align_up(c.workspace_bytes, alignment) <= need[k.name] + slack]
               for k in table.kernels}

    chosen, stats = _solve(table, options, budget, alignment, solver, time_limit)
    offsets = assign_offsets([c.workspace_bytes for c in chosen], alignment)
    kernels = [KernelPlan(k.name, k.op, k.problem, [MicroConfig.of(m) for m in c.micro], offset)
               for k, c, offset in zip(table.kernels, chosen, offsets)]
    stats.update(dp_seconds=round(dp_seconds, 6), min_total_workspace=min_budget, alignment=alignment,
                 unique_kernels=len({(k.problem.key(), k.op) for k in table.kernels}))
    return Plan("wd", batch_policy, kernels, table.device, table.cudnn_version, total_workspace=budget,
                numerics=table.numerics, stats=stats)


def _smallest_segments(table: BenchmarkTable, sets: dict[str, list[Configuration]], batch_policy: str,
                       alignment: int) -> dict[str, int]:
    """Each kernel's smallest aligned workspace over all its configurations (the budget's lower bound)."""
    need: dict[str, int] = {}
    memo: dict[tuple[str, str], int] = {}
    for k in table.kernels:
        configs = sets[k.name]
        if not configs:  # nothing fits the budget: look without it, to say what would
            key = (k.problem.key(), k.op)
            if key not in memo:
                full = desirable_set(k, batch_policy)
                if not full:
                    raise InfeasibleError(
                        f"kernel {k.name!r}: no measured configuration covers a mini-batch of {k.problem.n} "
                        f"under batch policy {batch_policy!r} at any workspace", None, k.name)
                memo[key] = full[0].workspace_bytes
            need[k.name] = align_up(memo[key], alignment)
        else:
            need[k.name] = align_up(configs[0].workspace_bytes, alignment)
    return need


def _solve(table: BenchmarkTable, options: dict[str, list[Configuration]], budget: int, alignment: int,
           solver: str, time_limit: float | None) -> tuple[list[Configuration], dict[str, Any]]:
    t0 = time.perf_counter()
    budget_units = budget // alignment
    prob, variables, symmetry = _model(table, options, budget_units, alignment)
    model_seconds = time.perf_counter() - t0

    backend = milp_backend(solver, time_limit)
    solve_seconds = 0.0
    for _attempt in range(3):
        t1 = time.perf_counter()
        with warnings.catch_warnings():  # PuLP 3.x announces its 4.0 solver renames on every solve
            warnings.simplefilter("ignore", DeprecationWarning)
            result = prob.solve(backend)
        solve_seconds += time.perf_counter() - t1
        found, optimal, status = _outcome(prob, result)
        if not found:
            raise UcudnnError(f"the ILP solver {backend.name} found no solution (status {status}) although one exists")
        picks = [max(range(len(xs)), key=lambda j: xs[j].value() or 0.0) for xs in variables]
        chosen = [options[k.name][j] for k, j in zip(table.kernels, picks)]
        used = sum(align_up(c.workspace_bytes, alignment) for c in chosen)
        if used <= budget:
            break
        # the solver's integrality tolerance let a rounded solution overshoot: tighten by the overshoot and
        # re-solve a fresh model (PuLP 4 does not let a constraint's constant change after it is added)
        budget_units -= -(-(used - budget) // alignment)
        t0 = time.perf_counter()
        prob, variables, symmetry = _model(table, options, budget_units, alignment)
        model_seconds += time.perf_counter() - t0
    else:
        raise UcudnnError(f"the ILP solver {backend.name} kept returning solutions over the budget")
    stats = {"solver": backend.name, "status": status, "optimal": optimal,
             "variables": sum(len(xs) for xs in variables), "constraints": prob.numConstraints(),
             "symmetry_constraints": symmetry,
             "model_seconds": round(model_seconds, 6), "solve_seconds": round(solve_seconds, 6),
             "arena_bytes": used}
    return chosen, stats


def _model(table: BenchmarkTable, options: dict[str, list[Configuration]], budget_units: int,
           alignment: int) -> tuple[Any, list[list[Any]], int]:
    """The WD ILP: one binary per (kernel, option), one option per kernel, the options' workspace within budget.

    Written with ``lpSum`` and comparison operators only: the subset of PuLP's modelling API that 2.8 to
    4.x share (4.x builds expressions in Rust and no longer takes lists of pairs or edits to a constraint).
    Returns the problem, the variables per kernel and how many symmetry-breaking rows it has.
    """
    import pulp

    prob = pulp.LpProblem("ucudnn_wd", pulp.LpMinimize)
    # PuLP >= 3.3 attaches variables to the model (the 4.0 API); older ones construct them free-standing
    new_var = getattr(prob, "add_variable", None) or (lambda name, lo, up, cat: pulp.LpVariable(name, lo, up, cat))
    variables: list[list[Any]] = []
    objective, usage = [], []
    for i, k in enumerate(table.kernels):
        xs = [new_var(f"x_{i}_{j}", 0, 1, pulp.LpBinary) for j in range(len(options[k.name]))]
        variables.append(xs)
        prob += pulp.lpSum(xs) == 1, f"one_configuration_{i}"
        for x, c in zip(xs, options[k.name]):
            objective.append(c.time_ms * x)
            units = align_up(c.workspace_bytes, alignment) // alignment
            if units:
                usage.append(units * x)
    # Identical kernels (ResNet's repeated blocks) have identical options, so any optimum can be permuted
    # among them: B&B would explore every permutation.  Ordering their choices (the option index, i.e. the
    # workspace rank, never falls along the group) keeps one representative; on ResNet-50 (`all`, b256,
    # 8 MiB x kernels) it cut CBC from 4.8 s to 0.55 s.
    groups: dict[tuple[str, str], list[int]] = {}
    for i, k in enumerate(table.kernels):
        groups.setdefault((k.problem.key(), k.op), []).append(i)
    symmetry = 0
    for members in groups.values():
        for a, b in zip(members, members[1:]):
            if len(variables[a]) > 1:
                prob += (pulp.lpSum(j * x for j, x in enumerate(variables[a]))
                         <= pulp.lpSum(j * x for j, x in enumerate(variables[b]))), f"order_{a}_{b}"
                symmetry += 1
    prob += pulp.lpSum(objective)
    prob += pulp.lpSum(usage) <= budget_units, "total_workspace"
    return prob, variables, symmetry


def _outcome(prob: Any, result: Any) -> tuple[bool, bool, str]:
    """(a solution came back, it is proven optimal, the status's name) under PuLP 2.8-3.x and 4.x alike.

    PuLP 4's ``solve`` returns an ``LpSolveStats``; earlier ones return a status code and leave
    ``sol_status`` on the problem.
    """
    import pulp

    if hasattr(result, "has_solution"):
        return bool(result.has_solution), int(result.status) == 1, getattr(result.status, "name", str(result.status))
    sol = prob.sol_status
    return (sol in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible), sol == pulp.LpSolutionOptimal,
            pulp.LpStatus[prob.status])


_banner_lock = threading.Lock()
_banner_done = False


def _silence_highs_banner() -> None:
    """Create HiGHS's first instance with file descriptor 1 on /dev/null, once per process.

    HiGHS prints a copyright banner on standard output when its first instance is made, before any
    option can turn output off; ``ucudnn plan --json`` and the plan service write documents there.
    """
    global _banner_done
    with _banner_lock:
        if _banner_done:
            return
        import highspy

        sys.stdout.flush()
        saved, devnull = os.dup(1), os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, 1)
            highspy.Highs()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            os.close(devnull)
            _banner_done = True


def milp_backend(solver: str, time_limit: float | None) -> Any:
    """The MILP solver PuLP should use: HiGHS where installed (``auto``), else CBC (a separate install, or the one
    PuLP <= 3 bundles); :class:`InputError` naming ``solver`` when none is found.  WD and the layout choice use it."""
    import pulp

    highs_ok = "HiGHS" in pulp.listSolvers(onlyAvailable=True)
    if solver == "highs" and not highs_ok:
        raise InputError("HiGHS is not installed (pip install highspy); use 'cbc'", "solver")
    if solver == "highs" or (solver == "auto" and highs_ok):
        _silence_highs_banner()
        return pulp.HiGHS(msg=False, timeLimit=time_limit, gapRel=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        coin = pulp.COIN_CMD(msg=False, timeLimit=time_limit, gapRel=0.0)
        if coin.available():  # a CBC installed separately (pulp[cbc]): PuLP 4's way
            return coin
        bundled = getattr(pulp, "PULP_CBC_CMD", None)  # the binary PuLP <= 3 bundles; gone in PuLP 4
        if bundled is not None and bundled(msg=False).available():
            return bundled(msg=False, timeLimit=time_limit, gapRel=0.0)
    raise InputError(f"no MILP solver: PuLP {pulp.__version__} finds neither HiGHS nor CBC "
                     "(pip install highspy, or pulp[cbc])", "solver")


def compare_policies(table: BenchmarkTable, batch_policy: str = "powerOfTwo", *, total_workspace: int | None = None,
                     workspace_limit: int | None = None, solver: str = "auto") -> dict[str, Any]:
    """WD against its baselines at the same memory, as in the seed's Fig. 12.

    WD gets ``total_workspace``; WR and undivided (cuDNN alone) get
    ``workspace_limit`` per kernel.  Either may be omitted: the total then is
    (number of kernels x limit), the limit the total / number of kernels, so
    all three are given the same footprint.  A policy that is infeasible
    there is reported, not raised.  Returns ``{"total_workspace",
    "workspace_limit", "plans": {policy: Plan | InfeasibleError}}``.
    """
    n = max(len(table.kernels), 1)
    if total_workspace is None and workspace_limit is None:
        raise InputError("give a total workspace or a per-kernel limit to compare at", "total_workspace")
    total = int(total_workspace) if total_workspace is not None else n * int(workspace_limit)  # type: ignore[arg-type]
    limit = int(workspace_limit) if workspace_limit is not None else total // n
    plans: dict[str, Plan | InfeasibleError] = {}
    for name, make in (("wd", lambda: plan_wd(table, total, batch_policy, solver=solver)),
                       ("wr", lambda: plan_wr(table, limit, batch_policy)),
                       ("undivided", lambda: plan_wr(table, limit, "undivided", policy_name="undivided"))):
        try:
            plans[name] = make()
        except InfeasibleError as e:
            plans[name] = e
    return {"total_workspace": total, "workspace_limit": limit, "plans": plans}


def comparison_summary(comparison: dict[str, Any]) -> dict[str, Any]:
    """JSON-ready digest of :func:`compare_policies`: each policy's time and memory, and WD's speedup over it."""
    plans = comparison["plans"]
    wd = plans.get("wd")
    out: dict[str, Any] = {"total_workspace": comparison["total_workspace"],
                           "workspace_limit": comparison["workspace_limit"], "policies": {}}
    for name, p in plans.items():
        if isinstance(p, InfeasibleError):
            out["policies"][name] = {"error": str(p), "min_workspace": p.min_workspace}
            continue
        entry = {"total_time_ms": p.total_time_ms, "workspace_bytes": p.workspace_bytes,
                 "workspace_sum_bytes": sum(k.workspace_bytes for k in p.kernels)}
        if isinstance(wd, Plan) and wd.total_time_ms > 0:
            entry["wd_speedup"] = p.total_time_ms / wd.total_time_ms
        out["policies"][name] = entry
    return out
