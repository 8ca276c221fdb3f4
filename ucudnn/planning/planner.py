"""One entry point for planning a benchmark table under any policy.

* ``wr`` — each kernel independently under ``workspace_limit`` (:mod:`ucudnn.planning.wr`).
* ``undivided`` — what cuDNN alone does: the fastest algorithm at the full
  mini-batch that fits ``workspace_limit`` (WR with the ``undivided`` policy).
* ``wd`` — the whole table shares ``total_workspace`` (:mod:`ucudnn.planning.wd`).

Kernels whose (problem, op) repeat (ResNet's blocks) are planned once.
"""
from __future__ import annotations

from ..errors import InputError
from ..policy import normalize_policy
from ..units import parse_size
from .plan import Plan
from .table import BenchmarkTable
from .wr import plan_wr

__all__ = ["POLICIES", "plan", "plan_wr"]   # plan_wr lives in .wr; kept here for its old import path

POLICIES = ("wr", "wd", "undivided")


def plan(table: BenchmarkTable, policy: str = "wr", *, workspace_limit: int | str | None = None,
         total_workspace: int | str | None = None, batch_policy: str = "powerOfTwo", unwritten: bool = False,
         host_ties: bool = True) -> Plan:
    """Plan ``table``.  Sizes may be bytes or strings such as ``"64MiB"``.  ``unwritten`` (WR only): kernels may take
    workspace from memory their call has not written yet (:func:`ucudnn.planning.wr.plan_wr`).  ``host_ties``
    (WR and undivided): near-ties go to the configuration costing the host less where the table recorded host
    work (:func:`ucudnn.planning.wr.fastest_per_size`); False: the fastest."""
    if policy not in POLICIES:
        raise InputError(f"unknown policy {policy!r}; use one of {', '.join(POLICIES)}", "policy")
    batch_policy = normalize_policy(batch_policy)
    if unwritten and policy != "wr":
        raise InputError(f"unwritten memory is planned by the wr policy only, not {policy!r}", "unwritten")
    table = table.resolved()   # a table without a numerics field: its plans record what it is taken as
    if policy == "wd":
        if total_workspace is None:
            raise InputError("the wd policy needs a total workspace budget", "total_workspace")
        from . import wd

        return wd.plan_wd(table, parse_size(total_workspace, "total_workspace"), batch_policy)
    if workspace_limit is None:
        raise InputError(f"the {policy} policy needs a per-kernel workspace limit", "workspace_limit")
    limit = parse_size(workspace_limit, "workspace_limit")
    if policy == "undivided":
        return plan_wr(table, limit, "undivided", policy_name="undivided", host_ties=host_ties)
    return plan_wr(table, limit, batch_policy, unwritten=unwritten, host_ties=host_ties)
