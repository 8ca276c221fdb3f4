"""One entry point for planning a benchmark table under any policy.

* ``wr`` — each kernel independently under ``workspace_limit`` (:mod:`ucudnn.wr`).
* ``undivided`` — what cuDNN alone does: the fastest algorithm at the full
  mini-batch that fits ``workspace_limit`` (WR with the ``undivided`` policy).
* ``wd`` — the whole table shares ``total_workspace`` (:mod:`ucudnn.wd`).

Kernels whose (problem, op) repeat (ResNet's blocks) are planned once.
"""
from __future__ import annotations

from .errors import InfeasibleError, InputError
from .plan import KernelPlan, MicroConfig, Plan
from .policy import normalize_policy
from .table import BenchmarkTable
from .units import format_size, parse_size
from . import wr

POLICIES = ("wr", "wd", "undivided")


def plan_wr(table: BenchmarkTable, workspace_limit: int, batch_policy: str = "powerOfTwo",
            policy_name: str = "wr") -> Plan:
    """Per-kernel plans; on an infeasible limit, the error names the smallest limit for the whole table."""
    memo: dict[tuple[str, str], list] = {}
    kernels: list[KernelPlan] = []
    failures: list[InfeasibleError] = []
    for k in table.kernels:
        key = (k.problem.key(), k.op)
        try:
            if key not in memo:
                memo[key] = wr.plan_kernel(k, workspace_limit, batch_policy)
            kernels.append(KernelPlan(k.name, k.op, k.problem, [MicroConfig.of(m) for m in memo[key]]))
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




def plan(table: BenchmarkTable, policy: str = "wr", *, workspace_limit: int | str | None = None,
         total_workspace: int | str | None = None, batch_policy: str = "powerOfTwo") -> Plan:
    """Plan ``table``.  Sizes may be bytes or strings such as ``"64MiB"``."""
    if policy not in POLICIES:
        raise InputError(f"unknown policy {policy!r}; use one of {', '.join(POLICIES)}", "policy")
    batch_policy = normalize_policy(batch_policy)
    if policy == "wd":
        if total_workspace is None:
            raise InputError("the wd policy needs a total workspace budget", "total_workspace")
        from . import wd  # imported lazily: it pulls in PuLP

        return wd.plan_wd(table, parse_size(total_workspace, "total_workspace"), batch_policy)
    if workspace_limit is None:
        raise InputError(f"the {policy} policy needs a per-kernel workspace limit", "workspace_limit")
    limit = parse_size(workspace_limit, "workspace_limit")
    if policy == "undivided":
        return plan_wr(table, limit, "undivided", policy_name="undivided")
    return plan_wr(table, limit, batch_policy)
